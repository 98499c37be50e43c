"""Distributed data-parallel training on the CPU (Gloo): launcher detection, the precision
policy's collective skip decision, metric reductions, and 2 processes against 1 end to end.

No GPU here: NCCL, SyncBatchNorm and multi-node runs are not exercised by this suite.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import ROOT, read_run

from mpt_repro import distributed

ENTRY = str(Path(__file__).with_name("ddp_entry.py"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], nproc: int, run_dir: Path, timeout: int = 300, wait: bool = True):
    """`ddp_entry.py args` (mpt-run plus a test model) in one process, or under torchrun."""
    cmd = (
        [sys.executable, ENTRY]
        if nproc == 1
        else [*TORCHRUN, f"--nproc_per_node={nproc}", f"--master_port={free_port()}", ENTRY]
    )
    cmd += [*args, "trainer.progress=false", "trainer.device=cpu", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def train_rows(run_dir: Path) -> list[tuple[int, float]]:
    """(step, training loss) of each train row (a sampled-softmax task logs `sampled_loss`)."""
    return [
        (int(r["step"]), float(r.get("sampled_loss") or r["loss"]))
        for r in csv.DictReader(open(run_dir / "metrics.csv"))
        if r["split"] == "train"
    ]


# -- which process am I -----------------------------------------------------------------------
def test_torchrun_variables_win() -> None:
    e = distributed.detect_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "1234",
            "SLURM_NTASKS": "16",
            "SLURM_PROCID": "5",
        }
    )
    assert (e.rank, e.world_size, e.local_rank, e.launcher, e.master_addr, e.master_port) == (
        3,
        8,
        1,
        "torchrun",
        "n1",
        1234,
    )


def test_slurm_tasks_without_torchrun() -> None:
    e = distributed.detect_env(
        {
            "SLURM_NTASKS": "16",
            "SLURM_PROCID": "9",
            "SLURM_LOCALID": "1",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "no-such-host[07-08]",
        }
    )
    assert (e.rank, e.world_size, e.local_rank, e.launcher) == (9, 16, 1, "slurm")
    assert e.master_port == 20000 + 4242 % 20000  # the same on every task of the job
    assert e.master_addr == "no-such-host07"  # the first node of the list (no scontrol here)
    assert (
        distributed.detect_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}).world_size == 1
    )  # one task: no DDP


def test_submitit_local_tasks_and_plain_process() -> None:
    e = distributed.detect_env(
        {
            "SUBMITIT_LOCAL_NTASKS": "2",
            "SUBMITIT_LOCAL_GLOBALID": "1",
            "SUBMITIT_LOCAL_LOCALID": "1",
            "SUBMITIT_LOCAL_JOB_ID": "777",
        }
    )
    assert (e.rank, e.world_size, e.launcher, e.master_addr) == (
        1,
        2,
        "submitit_local",
        "127.0.0.1",
    )
    assert not distributed.detect_env({}).enabled


@pytest.mark.parametrize(
    "nodelist,first",
    [("gpu012", "gpu012"), ("gpu[012-015],cpu3", "gpu012"), ("a[3,5-6]", "a3"), ("x1,x2", "x1")],
)
def test_first_slurm_host(nodelist: str, first: str) -> None:
    assert distributed.first_slurm_host(nodelist) == first


def test_each_rank_takes_its_own_gpu_and_a_shared_index_is_refused() -> None:
    from mpt_repro.errors import ConfigError

    env = distributed.detect_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    cuda = torch.device("cuda")
    assert distributed.rank_device(cuda, env, visible=4) == torch.device("cuda", 1)
    assert distributed.rank_device(cuda, env, visible=1) == torch.device("cuda", 0)
    # the launcher bound one GPU to each process: cuda:0 is this process's own
    assert distributed.rank_device(torch.device("cuda", 0), env, visible=1).index == 0
    with pytest.raises(ConfigError, match=r"every process on GPU 0; use trainer.device=cuda"):
        distributed.rank_device(torch.device("cuda", 0), env, visible=4)
    cpu = torch.device("cpu")
    assert distributed.rank_device(cpu, env, visible=0) == cpu


def test_single_process_helpers_are_no_ops() -> None:
    t = torch.tensor([1.0, 5.0])
    assert distributed.all_reduce_(t, "max") is t and t.tolist() == [1.0, 5.0]
    assert distributed.reduce_sums({"a": 2.0}) == {"a": 2.0}
    assert distributed.all_gather_object("x") == ["x"] and distributed.broadcast_object(3) == 3
    assert distributed.is_main() and distributed.world_size() == 1
    assert list(distributed.ShardSampler(5)) == [0, 1, 2, 3, 4]


# -- two Gloo processes driving the precision policy directly -------------------------------
def _policy_worker(rank: int, port: int, precision: dict, out: dict) -> None:
    from omegaconf import OmegaConf

    from mpt_repro.precision import PrecisionPolicy

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    dcfg = OmegaConf.create({"backend": "gloo", "timeout_s": 120})
    distributed.setup(dcfg, torch.device("cpu"))
    try:
        # collectives
        t = torch.tensor([float(rank + 1)])
        reduced = {
            op: float(distributed.all_reduce_(t.clone(), op))
            for op in ("sum", "mean", "max", "min")
        }
        shards = distributed.all_gather_object(list(distributed.ShardSampler(7)))
        table = distributed.all_reduce_columns_(
            torch.tensor([[1.0 + rank, 2.0 * rank, -rank, 7.0]]), ["mean", "max", "min", "none"]
        )
        # the policy: the same model on both ranks, different data, an overflow on rank 1 only at
        # step 3
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        policy = PrecisionPolicy(OmegaConf.create(precision), "cpu")
        opt = policy.build_optimizer(model, lambda ps: torch.optim.SGD(ps, lr=0.1), name="model")
        gen = torch.Generator().manual_seed(100 + rank)
        stepped, scales = [], []
        for step in range(6):
            x = torch.randn(8, 4, generator=gen)
            opt.zero_grad()
            with policy.autocast():
                loss = model(x).square().mean()
            opt.backward(loss)
            if step == 3 and rank == 1:
                model.weight.grad[0, 0] = float(
                    "inf"
                )  # no DDP here: only the policy's MAX can tell rank 0
            # average the (finite) grads by hand, as DDP would, but keep the inf local to rank 1
            for p in model.parameters():
                g = p.grad.clone()
                g[~torch.isfinite(g)] = 0
                distributed.all_reduce_(g, "mean")
                p.grad = torch.where(torch.isfinite(p.grad), g, p.grad)
            stepped.append(bool(opt.step()))
            scales.append(policy.loss_scale())
        out[rank] = {
            "reduced": reduced,
            "shards": shards,
            "table": table.tolist(),
            "stepped": stepped,
            "scales": scales,
            "weights": [p.detach().clone() for p in model.parameters()],
            "skipped": policy.summary()["skipped_steps"],
        }
    finally:
        distributed.teardown()


def test_overflow_on_one_rank_is_skipped_on_every_rank() -> None:
    from conftest import compose

    from mpt_repro.config import to_plain

    precision = to_plain(
        compose(
            [
                "precision=amp",
                "precision.loss_scaling=dynamic",
                "precision.init_scale=1024",
                "precision.growth_interval=2",
                "precision.hysteresis=1",
            ]
        ).precision
    )
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_policy_worker, args=(free_port(), precision, out), nprocs=2, join=True)
        r0, r1 = out[0], out[1]
    assert r0["reduced"] == r1["reduced"] == {"sum": 3.0, "mean": 1.5, "max": 2.0, "min": 1.0}
    assert sorted(r0["shards"][0] + r0["shards"][1]) == list(
        range(7)
    )  # every eval example exactly once
    assert (
        r0["table"] == r1["table"] == [[1.5, 2.0, -1.0, 7.0]]
    )  # per-column ops (adaptive scaler statistics)
    assert (
        r0["stepped"] == r1["stepped"] == [True, True, True, False, True, True]
    )  # rank 0's grads were finite
    assert r0["scales"] == r1["scales"]  # the dynamic scale moves identically
    assert r0["scales"][3] == r0["scales"][2] / 2  # backed off on the overflow
    assert r0["skipped"] == r1["skipped"] == 1
    for a, b in zip(r0["weights"], r1["weights"]):
        assert torch.equal(a, b)  # the replicas stayed in step


# -- end to end: the same run in 1 and in 2 processes ---------------------------------------
# The BatchNorm-free test MLP, fp32, 2 epochs of 16 global batches of 16, a mid-way evaluation.
MLP = [
    "experiment=demo",
    "model.name=test_mlp",
    "model.width=64",
    "budget=smoke",
    "trainer.max_steps=null",
    "trainer.epochs=2",
    "data.train_limit=256",
    "data.eval_limit=128",
    "data.batch_size=16",
    "distributed.batch_size_is=global",
    "trainer.log_every=4",
    "trainer.eval_every=10",
    "optim.lr=0.1",
]


@pytest.mark.slow
def test_two_processes_compute_what_one_process_computes(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    launch(MLP, 1, one)
    launch(MLP, 2, two)
    a, b = read_run(one), read_run(two)
    assert a["status"] == b["status"] == "completed"
    assert b["distributed"] == {
        **b["distributed"],
        "world_size": 2,
        "launcher": "torchrun",
        "backend": "gloo",
        "per_process_batch_size": 8,
        "global_batch_size": 16,
        "lr": 0.1,
    }
    assert a["distributed"]["world_size"] == 1 and a["distributed"]["global_batch_size"] == 16
    assert a["steps"] == b["steps"] == 32
    # Same global batches (one sharded permutation), averaged gradients, summed eval counts:
    # equal up to the order of float additions.
    assert (
        a["metrics"]["top1"] == b["metrics"]["top1"]
        and a["metrics"]["top5"] == b["metrics"]["top5"]
    )
    assert b["metrics"]["loss"] == pytest.approx(a["metrics"]["loss"], rel=1e-5)
    ra, rb = train_rows(one), train_rows(two)
    assert [s for s, _ in ra] == [s for s, _ in rb] == [4, 8, 12, 16, 20, 24, 28, 32]
    assert [loss for _, loss in rb] == pytest.approx(
        [loss for _, loss in ra], rel=1e-5
    )  # the global-batch mean loss
    assert b["diagnostics"]["distributed"] == {"world_size": 2, "replica_max_abs_diff": 0.0}
    # rank 0 alone wrote the run's files; the other rank's log never reached the log file
    (log_file,) = two.glob("*.log")  # Hydra's job log
    log = log_file.read_text()
    assert "rank 0 of 2" in log and "rank 1 of 2" not in log
