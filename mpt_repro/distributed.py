"""Data-parallel training across processes (DistributedDataParallel, or fully sharded with
FSDP2: distributed.strategy=fsdp2, mpt_repro/fsdp.py), and the helpers every part of the suite
calls to stay correct under it.

One process per device. The launcher decides how many and tells each process who it is:

    torchrun --nproc_per_node=N -m mpt_repro.cli ...   RANK, WORLD_SIZE, LOCAL_RANK (+ MASTER_*)
    SLURM (hydra/launcher=slurm, srun)                  SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
    submitit's local executor, tasks_per_node > 1       SUBMITIT_LOCAL_GLOBALID, _NTASKS, _LOCALID

`setup` reads that once per process, initialises the process group (NCCL on CUDA, Gloo on the
CPU) and pins the process to its device. Every helper below is a no-op in a single process, so
tasks, the trainer and the precision policy call them unconditionally and a one-process run takes
exactly the code path it took before distributed training existed.

What stays identical on every rank, and why:
  * the weights: DDP broadcasts rank 0's at wrap time and all-reduces (averages) the gradients, so
    every rank applies the same update (the FP32 master copies too: the policy copies the
    already-averaged model gradients into them);
  * the skip decision and the loss scale: the policy takes the MAX of found_inf over ranks;
  * BatchNorm running statistics at evaluation: broadcast from rank 0 (`sync_buffers`).
What differs per rank: the data shard, the random streams (`decorrelate_rng`), and BatchNorm's
batch statistics in training unless distributed.sync_bn=true (CUDA only).
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Sampler

from mpt_repro import fsdp
from mpt_repro.errors import ConfigError

log = logging.getLogger("mpt_repro")


@dataclass(frozen=True)
class DistEnv:
    """Who this process is. world_size 1: not distributed."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "none"  # torchrun | slurm | submitit_local | none
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


_ENV = DistEnv()  # this process's identity, set by setup()
_BACKEND: str | None = None


def _int(environ: Any, key: str, default: int = 0) -> int:
    value = environ.get(key)
    return int(value) if value not in (None, "") else default


def detect_env(environ: Any = os.environ) -> DistEnv:
    """Read rank and world size from whichever launcher started this process.

    torchrun's variables win (a torchrun inside a SLURM allocation is a torchrun job); then
    submitit's local executor; then SLURM tasks. A single task of any launcher is not distributed.
    """
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return DistEnv(
            _int(environ, "RANK"),
            _int(environ, "WORLD_SIZE", 1),
            _int(environ, "LOCAL_RANK"),
            "torchrun",
            environ.get("MASTER_ADDR"),
            _int(environ, "MASTER_PORT") or None,
        )
    if _int(environ, "SUBMITIT_LOCAL_NTASKS", 1) > 1:
        # one machine: the controller's pid makes a port that concurrent local jobs do not share
        port = (
            _int(environ, "MASTER_PORT") or 20000 + _int(environ, "SUBMITIT_LOCAL_JOB_ID") % 20000
        )
        return DistEnv(
            _int(environ, "SUBMITIT_LOCAL_GLOBALID"),
            _int(environ, "SUBMITIT_LOCAL_NTASKS"),
            _int(environ, "SUBMITIT_LOCAL_LOCALID"),
            "submitit_local",
            environ.get("MASTER_ADDR", "127.0.0.1"),
            port,
        )
    if _int(environ, "SLURM_NTASKS", 1) > 1 and "SLURM_PROCID" in environ:
        # the same port on every task of the job, and different jobs on one node rarely collide
        port = _int(environ, "MASTER_PORT") or 20000 + _int(environ, "SLURM_JOB_ID") % 20000
        addr = environ.get("MASTER_ADDR") or first_slurm_host(environ.get("SLURM_JOB_NODELIST", ""))
        return DistEnv(
            _int(environ, "SLURM_PROCID"),
            _int(environ, "SLURM_NTASKS"),
            _int(environ, "SLURM_LOCALID"),
            "slurm",
            addr,
            port,
        )
    return DistEnv()


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list ("gpu[012-015],cpu3" -> "gpu012"): the rendezvous."""
    if not nodelist:
        return "127.0.0.1"
    try:  # scontrol knows every form of the syntax
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        )
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    first = nodelist.split(",")[0]  # without scontrol: the common "prefix[a-b,...]" form
    if "[" in first:
        prefix, rest = first.split("[", 1)
        return prefix + rest.split(",")[0].split("-")[0].rstrip("]")
    return first


# -- setup ----------------------------------------------------------------------------------
def setup(cfg: Any, device: torch.device) -> torch.device:
    """Initialise the process group once per process (a multirun's later jobs reuse it) and
    return this rank's device: cuda:LOCAL_RANK when the run is on CUDA. `cfg` is cfg.distributed."""
    global _ENV, _BACKEND
    env = detect_env()
    if not env.enabled:
        _ENV, _BACKEND = env, None
        return device
    device = rank_device(device, env, torch.cuda.device_count() if device.type == "cuda" else 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and every later .cuda() use this rank's GPU
    backend = (
        cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    )
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError(
            "distributed.backend=nccl needs CUDA devices; use distributed.backend=gloo (or auto) "
            "on the CPU"
        )
    if not dist.is_initialized():
        # env:// rendezvous; torchrun exports MASTER_* itself, SLURM and submitit do not
        os.environ.setdefault("MASTER_ADDR", env.master_addr or "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(env.master_port or 29500))
        os.environ.setdefault("RANK", str(env.rank))
        os.environ.setdefault("WORLD_SIZE", str(env.world_size))
        os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
        dist.init_process_group(
            backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=cfg.timeout_s),
        )
        atexit.register(teardown)
    _ENV, _BACKEND = env, dist.get_backend()
    if not is_main():
        _quiet_logging()
    log.info(
        "distributed: rank %d of %d (local rank %d, %s, %s backend) on %s",
        env.rank,
        env.world_size,
        env.local_rank,
        env.launcher,
        _BACKEND,
        device,
    )
    return device


def rank_device(device: torch.device, env: DistEnv, visible: int) -> torch.device:
    """This process's device in a distributed run: trainer.device=cuda (or auto) becomes
    cuda:LOCAL_RANK (modulo the GPUs it can see). An explicit cuda:N is kept only where each
    process sees one GPU (the launcher bound it); with several visible it is refused on every
    rank alike: every process would train on GPU N."""
    if device.type != "cuda":
        return device
    if device.index is None:
        return torch.device("cuda", env.local_rank % max(visible, 1))
    if visible > 1:
        raise ConfigError(
            f"trainer.device={device} under {env.launcher} with {env.world_size} processes would "
            f"put every process on GPU {device.index}; use trainer.device=cuda (or auto): each "
            "process then takes its own GPU, cuda:LOCAL_RANK"
        )
    return device


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _quiet_logging() -> None:
    """Rank 0 writes the log; the others print only warnings, and never to the run's log file."""
    logging.getLogger("mpt_repro").setLevel(logging.WARNING)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
            handler.close()


# -- who am I -------------------------------------------------------------------------------
def is_distributed() -> bool:
    return _ENV.enabled and dist.is_available() and dist.is_initialized()


def rank() -> int:
    return _ENV.rank if is_distributed() else 0


def world_size() -> int:
    return _ENV.world_size if is_distributed() else 1


def is_main() -> bool:
    """Rank 0 (or the only process): the one that writes run.json, logs, TensorBoard, checkpoint."""
    return rank() == 0


# -- collectives (no-ops in one process) ----------------------------------------------------
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def all_reduce_(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce `tensor` in place over all ranks (op: sum | mean | max | min) and return it.

    Any device: a tensor the backend cannot take (a CPU tensor under NCCL) travels through a
    temporary copy. `mean` is sum / world_size (Gloo has no AVG). Every rank must call it, in the
    same order: use it at points all ranks reach (each step, each log row, each evaluation).
    """
    if not is_distributed():
        return tensor
    if op not in _OPS and op != "mean":
        raise ValueError(f"all_reduce_: op must be sum, mean, max or min, not {op!r}")
    comm = (
        torch.device("cuda", torch.cuda.current_device())
        if _BACKEND == "nccl"
        else torch.device("cpu")
    )
    buf = tensor if tensor.device == comm else tensor.to(comm)
    dist.all_reduce(buf, op=_OPS.get(op, dist.ReduceOp.SUM))
    if op == "mean":
        buf.div_(world_size())
    if buf is not tensor:
        tensor.copy_(buf)
    return tensor


def all_reduce_columns_(table: torch.Tensor, ops: list[str]) -> torch.Tensor:
    """Reduce each column of a 2-D table with its own op ("sum", "mean", "max", "min", or "none":
    already identical on every rank), in place, one collective per distinct op. For per-layer
    statistics, e.g. rows = layers, columns = (mean square, max, min): ops ["mean", "max", "min"].
    """
    if not is_distributed():
        return table
    if table.dim() != 2 or table.shape[1] != len(ops):
        raise ValueError(
            f"all_reduce_columns_: {len(ops)} ops for a table of shape {tuple(table.shape)}"
        )
    for op in sorted(set(ops) - {"none"}):
        cols = [i for i, o in enumerate(ops) if o == op]
        part = table[:, cols].contiguous()  # collectives need contiguous memory
        table[:, cols] = all_reduce_(part, op)
    return table


def reduce_sums(values: dict[str, float], device: torch.device | None = None) -> dict[str, float]:
    """{name: sum over ranks} for plain numbers (e.g. evaluation loss sums, correct counts), in
    float64 so that large counts stay exact."""
    if not is_distributed():
        return dict(values)
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    all_reduce_(t, "sum")
    return dict(zip(values, t.tolist()))


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s value of a picklable object, on every rank (e.g. a decision rank 0 made)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list:
    """Every rank's value of a picklable object, in rank order ([obj] in one process)."""
    if not is_distributed():
        return [obj]
    out: list = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if is_distributed():
        dist.barrier()


# -- models ---------------------------------------------------------------------------------
def maybe_sync_bn(model: nn.Module, cfg: Any, device: torch.device) -> nn.Module:
    """distributed.sync_bn=true: BatchNorm over the global batch (SyncBatchNorm). Call before
    policy.prepare_model, which hooks the BN modules this replaces. PyTorch's SyncBatchNorm runs
    on CUDA only; in one process plain BN already sees the whole batch."""
    if not (cfg.sync_bn and is_distributed()):
        return model
    if device.type != "cuda":
        raise ConfigError(
            "distributed.sync_bn=true needs CUDA (PyTorch's SyncBatchNorm has no CPU kernel); "
            "use distributed.sync_bn=false (per-process BatchNorm statistics) on the CPU"
        )
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def shard_model(model: nn.Module, policy: Any, cfg: Any) -> nn.Module:
    """distributed.strategy=fsdp2 in a distributed run: `model` fully sharded (fsdp.shard: its
    blocks and its root), before its optimizer is built; otherwise the model itself."""
    if not (is_distributed() and fsdp.enabled(cfg)):
        return model
    return fsdp.shard(model, policy, cfg)


def full_weights(models: Any) -> Any:
    """A block in which every sharded model holds its full parameters (evaluation: the ranks'
    shards of the evaluation data differ in size); a null context under DDP."""
    return fsdp.gathered(list(models))


def wrap_model(model: nn.Module, cfg: Any, broadcast_buffers: bool = True) -> nn.Module:
    """DDP around a prepared model (after policy.build_optimizer, so the optimizer, the FP32
    master copies and the parameter names all refer to the bare model). Keep the bare model for
    checkpoints and evaluation; train through the wrapper. In one process: the model itself.

    DDP averages the gradients of the model's own parameters (FP16 ones under the low-precision
    presets, with the loss scale still in them); the policy then copies them into the FP32
    masters, unscales, checks and steps exactly as in one process. broadcast_buffers (default)
    hands every rank rank 0's BatchNorm running statistics at each forward; a model that runs
    twice through its wrapper before one backward needs broadcast_buffers=False and its own
    sync_buffers (up to torch 2.11 the second broadcast bumps the version of the statistics the
    first forward saved, and the backward fails: "modified by an inplace operation").
    """
    if not is_distributed() or fsdp.is_sharded(model):  # FSDP2 reduces inside the model itself
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = next(model.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    return DDP(
        model,
        device_ids=ids,
        output_device=ids[0] if ids else None,
        find_unused_parameters=bool(cfg.find_unused_parameters),
        # the grads are views into the all-reduce buckets: no second copy of every gradient in
        # memory, no copy between the two each step (the optimizer sets grads to None, which
        # DDP supports; nothing here detaches them in place)
        gradient_as_bucket_view=True,
        broadcast_buffers=broadcast_buffers,
    )


def unwrap(model: nn.Module) -> nn.Module:
    return (
        model.module
        if hasattr(model, "module") and isinstance(model, nn.parallel.DistributedDataParallel)
        else model
    )


@torch.no_grad()
def sync_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics). Before evaluating: each
    rank's last training forward moved its own statistics after DDP's broadcast."""
    if not is_distributed():
        return
    for buf in unwrap(model).buffers():
        dist.broadcast(buf, src=0)


def params_checksum(params: list[torch.Tensor]) -> torch.Tensor:
    """One float64 sum per parameter: cheap fingerprint to compare replicas across ranks. A
    sharded (DTensor) parameter is gathered first (a collective: every rank calls this alike)."""
    if not params:
        return torch.zeros(0, dtype=torch.float64)
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in params]
    return torch.stack([p.detach().double().sum() for p in full]).cpu()


# -- data -----------------------------------------------------------------------------------
def batch_sizes(cfg: Any) -> tuple[int, int]:
    """(per-process micro-batch, global batch per optimizer step) from data.batch_size,
    distributed.batch_size_is and trainer.accumulate.

    per_process (default): data.batch_size is each process's micro-batch; the global batch grows
    with the number of processes and accumulated micro-batches (as in Goyal et al.: 32 per GPU).
    global: data.batch_size is the global batch, split across processes and micro-batches, so a
    paper recipe keeps its batch on any number of GPUs.
    """
    b, w, n = cfg.data.batch_size, world_size(), cfg.trainer.accumulate
    if cfg.distributed.batch_size_is == "global":
        if b % (w * n):
            raise ConfigError(
                f"data.batch_size={b} is the global batch (distributed.batch_size_is=global) and "
                f"must divide evenly over {w} processes x trainer.accumulate={n} micro-batches"
            )
        return b // (w * n), b
    return b, b * w * n


def no_sync(model: nn.Module) -> Any:
    """DDP's no_sync (no gradient all-reduce in this backward: an accumulating micro-batch), or
    nothing for a model that is not DDP-wrapped. Looks through torch.compile's wrapper
    (trainer.compile=true), which holds the DDP module as `_orig_mod`."""
    import contextlib

    inner = getattr(model, "_orig_mod", model)  # the compiled wrapper is no DDP instance itself
    if isinstance(inner, nn.parallel.DistributedDataParallel):
        return inner.no_sync()
    return fsdp.no_sync(inner) or contextlib.nullcontext()


class ShardSampler(Sampler[int]):
    """Evaluation order for this rank: indices rank, rank + W, rank + 2W, ... Every example is
    evaluated exactly once over all ranks (sums reduced after), with no padding duplicates."""

    def __init__(self, size: int):
        self.size, self.rank, self.world = size, rank(), world_size()

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.size, self.world))

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.world))


def decorrelate_rng(seed: int) -> None:
    """After the (identically seeded) model build: a different random stream on each rank, so
    dropout masks, augmentations and GAN noise are not copies of each other across the global
    batch. A single process keeps its stream untouched."""
    if not is_distributed():
        return
    s = seed * 1_000_003 + rank()
    torch.manual_seed(s)  # CPU and every CUDA device
    np.random.seed(s % 2**32)
    random.seed(s)


# -- the record -----------------------------------------------------------------------------
def describe(cfg: Any) -> dict[str, Any]:
    """run.json "distributed": how many processes, the batch each and all together took, and
    the learning rate the optimizer actually used (after optim.lr_scaling)."""
    from mpt_repro.optim import scaled_lr

    per_process, global_batch = batch_sizes(cfg)
    e = _ENV if is_distributed() else DistEnv()
    return {
        "world_size": world_size(),
        "launcher": e.launcher,
        "backend": _BACKEND if is_distributed() else None,
        "batch_size_is": cfg.distributed.batch_size_is,
        "per_process_batch_size": per_process,
        "global_batch_size": global_batch,
        "lr": scaled_lr(cfg.optim, global_batch),
        "base_lr": cfg.optim.lr,
        "lr_scaling": cfg.optim.lr_scaling,
        "base_batch_size": cfg.optim.base_batch_size,
        "sync_bn": bool(cfg.distributed.sync_bn) and is_distributed(),
        "strategy": cfg.distributed.strategy,
        # the preset on FSDP2 (fsdp.mapping): shards' dtype, param_dtype, reduce_dtype
        "fsdp2": fsdp.mapping(cfg.precision, cfg.distributed)
        if fsdp.enabled(cfg.distributed) and is_distributed()  # one process shards nothing
        else None,
    }


class DistributedCallback:
    """Trainer callback: at the end of the fit, check that every rank holds the same model and
    optimizer parameters (the FP32 masters included) and record the largest difference, and what
    each rank holds for parameters, gradients and optimizer state (bytes, fsdp.state_bytes)."""

    def on_fit_end(self, trainer: Any, summary: dict) -> None:
        models, optimizers = trainer.task.models.values(), trainer.task.optimizers.values()
        params = [p for m in models for p in m.parameters()]
        if not fsdp.sharded_modules(models):  # sharded: the optimizer steps these same shards
            params += [p for o in optimizers for g in o.param_groups for p in g["params"]]
        mine = params_checksum(params)
        every = all_gather_object(mine)
        diff = max(float((t - every[0]).abs().max()) if t.numel() else 0.0 for t in every)
        held = all_gather_object(fsdp.state_bytes(models, optimizers))
        summary["distributed"] = {"world_size": world_size(), "replica_max_abs_diff": diff}
        # parameters + gradients + optimizer state, in bytes: every rank's total, rank 0's parts
        summary["state_bytes"] = {"per_rank": [h["total"] for h in held], "rank0": held[0]}
        if diff != 0.0:
            log.warning("distributed: parameters differ across ranks by up to %g", diff)
