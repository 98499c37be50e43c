"""Fully sharded data parallel (FSDP2, `torch.distributed.fsdp.fully_shard`): the paper's recipes
on a model whose weights, gradients and optimizer state are split over the processes.

`distributed.strategy=fsdp2` (docs/distributed.md). Under the same launch as DDP, each process
keeps 1/N of every parameter (a DTensor shard, in FP32 under the master-copy presets: the sharded
FP32 parameters *are* the master copy), all-gathers a block's parameters in the compute dtype just
before its forward (and again before its backward, with reshard_after_forward), and
reduce-scatters its gradients, so each rank receives the averaged gradient of its own shard only.
The optimizer (built after sharding, over the DTensor parameters) steps the shards.

What each preset becomes (`mapping`): FSDP2's MixedPrecisionPolicy is itself a precision recipe,
`param_dtype` (the dtype a block computes with) and `reduce_dtype` (the dtype gradients are
reduced in). With distributed.reduce_dtype=preset both are what the DDP run of the preset uses,
so that the two strategies compute the same numbers up to the order of the reductions:

    weights=fp32_autocast (fp32, tf32, amp, bf16)  FP32 shards; param_dtype FP32 (autocast casts
                                                   per op, as under DDP); reduced in FP32
    weights=low_precision with master (mixed, no_scaling, a scaler)  FP32 shards (the master
                                                   copy); param_dtype = the compute dtype; reduced
                                                   in it (DDP reduces the FP16 gradients)
    weights=low_precision, no master (no_master, fp16)  FP16 shards; the optimizer updates them
    BatchNorm with bn_fp32                         its own group: FP32 parameters and gradients

The overflow check of loss scaling runs on each rank's shard and the flag is MAX-reduced over the
ranks before the step (precision/optimizer.py), so every rank skips the same steps, on the device.

Nothing here imports torch at import time: `check` runs in mpt-run's start-up check.
"""

from __future__ import annotations

import contextlib
import fnmatch
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from mpt_repro.errors import ConfigError

# the dtype DDP reduces gradients in, by the preset's weight storage (the gradients' own dtype)
_REDUCE_DTYPES = ("float32", "float16", "bfloat16")


def _name(v: Any) -> str:
    return getattr(v, "name", v)


def enabled(dcfg: Any) -> bool:
    """distributed.strategy=fsdp2 (whether or not the run has several processes)."""
    return str(getattr(dcfg, "strategy", "ddp")) == "fsdp2"


# -- what a preset becomes, and what cannot run sharded -----------------------------------------
def refusal(cfg: Any) -> str | None:
    """Why this configuration cannot train under fsdp2 (one line), or None."""
    p = cfg.precision
    fp8 = _name(p.fp8.mode) if "fp8" in p else "none"
    if fp8 != "none":
        return (
            f"precision={p.name} (precision.fp8.mode={fp8}) cannot run under "
            "distributed.strategy=fsdp2: its 8-bit converters and their per-layer step hooks are "
            "not mapped onto sharded parameters; use distributed.strategy=ddp, or precision=bf16 "
            "or mixed under fsdp2"
        )
    if _name(p.get("arithmetic", "native")) == "float32":
        return (
            f"precision={p.name} (pseudo FP16: FP32 arithmetic on FP16 storage, paper §4.3) "
            "cannot run under distributed.strategy=fsdp2: it emulates a number format on one "
            "process and has no sharded mapping; use distributed.strategy=ddp"
        )
    if _name(p.loss_scaling) == "adaptive":
        return (
            f"precision={p.name} (adaptive, layer-wise loss scaling) cannot run under "
            "distributed.strategy=fsdp2: its per-layer statistics need each layer's whole "
            "gradient, and each rank holds a shard of it; use distributed.strategy=ddp, or a "
            "dynamic scale (precision=mixed precision.loss_scaling=dynamic) under fsdp2"
        )
    if bool(cfg.trainer.get("compile", False)):
        return (
            "trainer.compile=true cannot run under distributed.strategy=fsdp2 here: the compiled "
            "precision step was not built for sharded (DTensor) gradients; use "
            "trainer.compile=false"
        )
    if str(cfg.task) == "gan":
        return (
            "experiment=dcgan cannot run under distributed.strategy=fsdp2: the generator's loss "
            "runs through the discriminator with its parameters frozen, and rank 0 alone draws "
            "the sample grid, both forwards that a sharded model would have every rank join; use "
            "distributed.strategy=ddp"
        )
    if cfg.telemetry.get("enabled", False):
        return (
            "telemetry cannot run under distributed.strategy=fsdp2: it observes rank 0's whole "
            "gradients and layers, and each rank holds a shard of them; use "
            "distributed.strategy=ddp for a diagnostic run"
        )
    if cfg.distributed.sync_bn:
        return (
            "distributed.sync_bn=true is a DDP setting (SyncBatchNorm); under "
            "distributed.strategy=fsdp2 use distributed.sync_bn=false"
        )
    return None


def check(cfg: Any) -> None:
    """Refuse, before any work, a configuration that cannot train sharded (ConfigError)."""
    if enabled(cfg.distributed) and (why := refusal(cfg)) is not None:
        raise ConfigError(why)


def mapping(precision: Any, dcfg: Any) -> dict[str, str]:
    """The preset on FSDP2: the shards' dtype, param_dtype and reduce_dtype (names), and those
    of a BatchNorm kept in FP32. run.json "distributed.fsdp2" and the docs' table."""
    compute = _name(precision.compute_dtype)
    low = _name(precision.weights) == "low_precision"
    master = bool(precision.master_weights)
    shards = compute if low and not master else "float32"
    param = compute if low else "float32"
    knob = str(dcfg.reduce_dtype)
    reduce = knob if knob != "preset" else param
    out = {"shards": shards, "param_dtype": param, "reduce_dtype": reduce}
    if low and precision.bn_fp32:
        out["batchnorm"] = "float32 (own group)"
    return out


# -- sharding a model ---------------------------------------------------------------------------
def blocks(model: Any) -> list[Any]:
    """The model's repeated blocks, each sharded (all-gathered, freed) on its own.

    A model says where its blocks are with a `shard_blocks` attribute: fnmatch patterns over its
    module names (the LM: ("lstm",), since its softmax weights are read by the loss outside any
    forward and must stay in the root's group). Without one, the modules directly inside its
    nn.Sequential / nn.ModuleList containers (the model itself if it is one, else its children
    that are) that hold parameters: ResNet's stages, a transformer's layers, the digits CNN's
    conv-BN-ReLU blocks; without such containers, its direct children that hold parameters.
    """
    from torch import nn

    patterns = getattr(model, "shard_blocks", None)
    if patterns is not None:
        named = dict(model.named_modules())
        chosen = [m for n, m in named.items() if n and any(fnmatch.fnmatch(n, p) for p in patterns)]
        if not chosen:
            raise ConfigError(
                f"{type(model).__name__}.shard_blocks={tuple(patterns)!r} names none of its "
                f"modules (they are: {', '.join(n for n in named if n)[:300]})"
            )
        return chosen
    containers = (nn.Sequential, nn.ModuleList)
    outer = (
        [model]
        if isinstance(model, containers)
        else [c for c in model.children() if isinstance(c, containers)]
    )
    found = [b for c in outer for b in c.children() if _holds_parameters(b)]
    return found or [c for c in model.children() if _holds_parameters(c)]


def _holds_parameters(module: Any) -> bool:
    return any(p.requires_grad for p in module.parameters())


def shard(model: Any, policy: Any, dcfg: Any) -> Any:
    """fully_shard the blocks, the FP32 BatchNorm layers and the root of a prepared model (after
    policy.prepare_model, before policy.build_optimizer: the optimizer must see the sharded
    parameters). Returns the model (the same object, now an FSDPModule)."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    register_dtensor_ops()
    m = mapping(policy.cfg, dcfg)
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if m["shards"] == "float32":
        # the master copy starts from the rounded weights, as MasterWeights copies them
        model.float()
    reshard = bool(dcfg.reshard_after_forward)
    if "batchnorm" in m:  # FP32 statistics and affine parameters (§3.3), FP16 activations kept
        bn_policy = MixedPrecisionPolicy(
            param_dtype=torch.float32,
            reduce_dtype=torch.float32
            if dcfg.reduce_dtype == "preset"
            else dtype[m["reduce_dtype"]],
            cast_forward_inputs=False,
        )
        for bn in model.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm) and _holds_parameters(bn):
                fully_shard(bn, mp_policy=bn_policy, reshard_after_forward=reshard)
                bn.mpt_reshard_after_forward = reshard
    param = None if m["param_dtype"] == m["shards"] else dtype[m["param_dtype"]]
    # FSDP2 reads reduce_dtype=None as "the gathered dtype", not the shards' own
    reduce = None if m["reduce_dtype"] == m["param_dtype"] else dtype[m["reduce_dtype"]]
    mp = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)
    for block in blocks(model):
        if isinstance(block, FSDPModule):  # a BatchNorm layer the loop above sharded already
            continue
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
        block.mpt_reshard_after_forward = reshard  # what evaluation restores (gathered)
    # the root's parameters stay gathered from its forward to its backward (FSDP2's own choice
    # for a root): a loss may read them outside the forward (the LM's softmax weights)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    return model


_REGISTERED = False


def register_dtensor_ops() -> None:
    """Sharding rules for the element-wise list ops the precision step uses on DTensor
    parameters and torch has no rule for: fused SGD (torch has them for fused Adam and AdamW;
    fused is what skips an overflowing step on the device, found_inf, with no host read) and
    `_foreach_copy_` (the parameter averages, ema.py). Both are element-wise over matching
    shards, which is the rule torch applies to its other fused and foreach ops. A torch without
    the internal registration keeps its own behaviour (the step then fails naming the op)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import torch

    try:
        from torch.distributed.tensor._ops._pointwise_ops import _register_single_dim_pointwise
    except ImportError:
        return
    aten = torch.ops.aten
    for op in (aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, aten._foreach_copy_.default):
        _register_single_dim_pointwise(op)
    _REGISTERED = True


# -- the sharded modules of a run ---------------------------------------------------------------
def sharded_modules(models: Iterable[Any]) -> list[Any]:
    """Every FSDPModule inside `models`, outermost first ([] under DDP or in one process)."""
    if "torch.distributed.fsdp" not in sys.modules:
        # nothing can be an FSDPModule before its module is imported, and importing it to ask
        # costs ~0.6 s of CPU (torch.distributed.tensor, sympy) in every run that never shards
        return []
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    return [m for model in models for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: Any) -> bool:
    return bool(sharded_modules([model]))


@contextlib.contextmanager
def gathered(models: Iterable[Any]) -> Iterator[None]:
    """Every sharded module's full parameters gathered once, for the whole block (evaluation):
    ranks evaluate shards of different sizes (ShardSampler), and a forward that all-gathers would
    wait forever for a rank that has run out of batches. Costs the unsharded model's memory in
    the compute dtype while it lasts."""
    found = sharded_modules(models)
    if not found:
        yield
        return
    for m in found:
        m.set_reshard_after_forward(False, recurse=False)
    for m in found:
        m.unshard()
    try:
        yield
    finally:
        for m in found:
            m.reshard()
        for m in found:  # the roots (the models themselves) never reshard after their forward
            root = any(m is model for model in models)
            again = False if root else bool(getattr(m, "mpt_reshard_after_forward", True))
            m.set_reshard_after_forward(again, recurse=False)


def no_sync(model: Any) -> Any:
    """An accumulating micro-batch under FSDP2: gradients are kept (unsharded) and reduced with
    the last micro-batch's (set_requires_gradient_sync), or None when `model` holds no sharded
    module."""
    found = sharded_modules([model])
    if not found:
        return None
    return _without_gradient_sync(found[0])


@contextlib.contextmanager
def _without_gradient_sync(root: Any) -> Iterator[None]:
    root.set_requires_gradient_sync(False, recurse=True)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True, recurse=True)


# -- what a rank holds --------------------------------------------------------------------------
def local(t: Any) -> Any:
    """A DTensor's shard on this rank (the tensor it wraps: the same object from step to step,
    and in-place work on it is work on the DTensor), or the tensor itself."""
    return getattr(t, "_local_tensor", t)


def state_bytes(models: Iterable[Any], optimizers: Iterable[Any]) -> dict[str, int]:
    """Bytes this rank holds for the parameters, their gradients and the optimizer state
    (FP32 master copies with their gradients count as optimizer state), each storage once."""
    seen: set[int] = set()

    def size(tensors: Iterable[Any]) -> int:
        total = 0
        for t in tensors:
            if t is None or not hasattr(t, "untyped_storage"):
                continue
            t = local(t)
            key = t.untyped_storage().data_ptr()
            if key in seen or t.numel() == 0:
                continue
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return total

    models, optimizers = list(models), list(optimizers)
    params = [p for m in models for p in m.parameters()]
    out = {"parameters": size(params), "gradients": size(p.grad for p in params)}
    state = []
    for o in optimizers:
        opt = getattr(o, "optimizer", o)
        masters = [p for g in opt.param_groups for p in g["params"]]
        state += masters + [p.grad for p in masters]
        state += [v for s in opt.state.values() for v in s.values()]
    out["optimizer"] = size(state)
    out["total"] = sum(out.values())
    return out


# -- sharded checkpoints ------------------------------------------------------------------------
# checkpoints/sharded-step<N>/: torch.distributed.checkpoint's folder (a file per rank and the
# .metadata that maps each tensor's pieces), named by the rank-0 file (last.pt, previous.pt)
SHARDED_PREFIX = "sharded-step"


def _sharded_state(task: Any, emas: dict[str, Any]) -> dict[str, Any]:
    """What each rank saves of its own: the models' sharded weights and buffers, the optimizers'
    state by parameter name (get_optimizer_state_dict: loadable on another world size) and the
    averages' sharded shadows."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    models, optimizers = task.models, task.optimizers
    return {
        "models": {k: get_model_state_dict(m) for k, m in models.items()},
        "optimizers": {
            k: get_optimizer_state_dict(models[k], o.optimizer) for k, o in optimizers.items()
        },
        "emas": {k: {str(i): s for i, s in enumerate(e.shadow)} for k, e in emas.items()},
    }


def save_sharded(run_dir: Any, step: int, task: Any, emas: dict[str, Any]) -> str | None:
    """Every rank: its shards into checkpoints/sharded-step<N>/ (torch.distributed.checkpoint);
    the folder's name, which the rank-0 file records. None when no model is sharded."""
    from pathlib import Path

    if not sharded_modules(task.models.values()):
        return None
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from mpt_repro.errors import CheckpointError

    folder = Path(run_dir) / "checkpoints" / f"{SHARDED_PREFIX}{step:09d}"
    if dist.get_rank() == 0 and folder.exists():  # a save at this step that was cut short
        shutil.rmtree(folder)
    dist.barrier()
    try:
        dcp.save(_sharded_state(task, emas), checkpoint_id=folder)
    except (OSError, RuntimeError) as e:
        raise CheckpointError(
            f"could not write the sharded checkpoint {folder}: {e}. The checkpoint before it is "
            "kept: free space there (or check that it is writable), then run the same command "
            "with resume=true"
        ) from e
    return folder.name


def without_sharded(state: dict[str, Any], name: str) -> dict[str, Any]:
    """The rank-0 file's state with what the sharded folder `name` holds taken out (rank 0's
    shards are not the model): the models, the torch optimizers' state, the averages' shadows."""
    state["sharded"] = name
    state["models"] = None
    for sd in state["optimizers"].values():
        sd["optimizer"] = None
    for sd in state["emas"].values():
        sd["shadow"] = None
    return state


def load_sharded(run_dir: Any, state: dict[str, Any], task: Any, emas: dict[str, Any]) -> None:
    """Every rank: the models, the torch optimizers' state and the averages from the sharded
    folder the rank-0 file names, resharded for this world size; the averages' shadows are put
    back into `state` so that their load_state_dict takes them as they are."""
    from pathlib import Path

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from mpt_repro.errors import CheckpointError

    if not state.get("sharded"):
        raise CheckpointError(
            f"{state.get('loaded_from')} was written by a run whose model was not sharded "
            "(distributed.strategy=ddp, or one process); resume it as it ran, with "
            "distributed.strategy=ddp"
        )
    folder = Path(run_dir) / "checkpoints" / state["sharded"]
    if not (folder / ".metadata").is_file():
        raise CheckpointError(
            f"{folder}: the sharded part of the checkpoint {state.get('loaded_from')} is missing "
            "or incomplete; start afresh with overwrite=true (the old files are moved aside)"
        )
    if not sharded_modules(task.models.values()):  # one process, or DDP: the whole of it
        _load_whole(folder, state, task, emas)
        return
    into = _sharded_state(task, emas)
    dcp.load(into, checkpoint_id=folder)
    for k, m in task.models.items():
        set_model_state_dict(m, into["models"][k])
    for k, o in task.optimizers.items():
        set_optimizer_state_dict(task.models[k], o.optimizer, into["optimizers"][k])
    for k, e in emas.items():
        state["emas"][k]["shadow"] = [into["emas"][k][str(i)] for i in range(len(e.shadow))]


def _load_whole(folder: Any, state: dict[str, Any], task: Any, emas: dict[str, Any]) -> None:
    """A sharded checkpoint into models that are not sharded (resumed on one process, or under
    DDP): every tensor whole (torch's dcp_to_torch_save), the FP32 values into the master
    copies where the model keeps FP16 weights, the optimizer state by parameter name."""
    import tempfile
    from pathlib import Path

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(folder, Path(tmp) / "whole.pt")
        whole = torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=True)
    for k, model in task.models.items():
        weights = whole["models"][k]
        model.load_state_dict(weights)  # rounded to the model's dtype
        o = task.optimizers[k]
        if o.master is not None:  # the FP32 shards were the master copy
            low = [n for n, p in zip(o.names, o.model_params) if p.dtype != torch.float32]
            if low:
                o.master.load_state_dict([weights[n] for n in low])
            state["optimizers"][k]["masters"] = None  # loaded here, not by its load_state_dict
        saved = whole["optimizers"][k]["state"]
        for name, param in zip(o.names, o.params):
            if name in saved:
                o.optimizer.state[param] = {
                    key: v.to(param.device) if torch.is_tensor(v) else v
                    for key, v in saved[name].items()
                }
    for k, e in emas.items():
        state["emas"][k]["shadow"] = [whole["emas"][k][str(i)] for i in range(len(e.shadow))]


def prune_sharded(run_dir: Any, keep: int = 2) -> None:
    """Rank 0, after last.pt is written: the sharded folders of last.pt and previous.pt (the
    newest two) are kept, older ones removed (they belong to checkpoints no file names)."""
    import shutil
    from pathlib import Path

    folders = sorted(Path(run_dir, "checkpoints").glob(f"{SHARDED_PREFIX}*"))
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
