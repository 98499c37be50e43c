"""The language-model and DCGAN tasks under DistributedDataParallel (2 Gloo processes on the CPU,
through the installed mpt-run under torchrun, as documented in docs/distributed.md).

LM: the text's streams are split over the ranks, so 2 processes compute what 1 process with the
same global batch computes; a resumed 2-process run continues exactly. DCGAN: both networks'
replicas stay identical, each rank draws its own noise, evaluation covers every held-out image once.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import MPT_RUN, ROOT, compose, read_run
from test_distributed import free_port, train_rows

from mpt_repro.data.corpus import batchify, bptt_batches, shard_streams

CPU = torch.device("cpu")


def mpt_run(args: list[str], nproc: int, run_dir: Path, timeout: int = 300) -> None:
    """`mpt-run args`, or `torchrun --nproc_per_node=N $(which mpt-run) args`."""
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
    ]
    cmd = [
        *(torchrun if nproc > 1 else []),
        MPT_RUN,
        *args,
        "trainer.progress=false",
        "trainer.device=cpu",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


def csv_rows(run_dir: Path) -> list[dict]:
    return list(csv.DictReader(open(run_dir / "metrics.csv")))


def checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)


# -- the LM's stream sharding (no processes) ----------------------------------------------------
def test_rank_shards_of_the_streams_make_up_the_global_windows():
    ids = torch.arange(103)
    streams = batchify(ids, 6)  # the global batch: 6 streams of 17 steps
    shards = [shard_streams(streams, r, 3) for r in range(3)]
    assert [s.shape for s in shards] == [(17, 2)] * 3  # every rank has every time step, 2 streams
    assert torch.equal(torch.cat(shards, dim=1), streams)  # disjoint, and together all of them
    # every window of a rank (resume skip included) is its columns of the global window
    for skip in (0, 1):
        whole = list(bptt_batches(streams, 5, skip))
        for r, shard in enumerate(shards):
            mine = list(bptt_batches(shard, 5, skip))
            assert len(mine) == len(whole)
            for (x, y), (gx, gy) in zip(mine, whole):
                assert torch.equal(x, gx[:, 2 * r : 2 * r + 2]) and torch.equal(
                    y, gy[:, 2 * r : 2 * r + 2]
                )
    # more processes than (validation) streams: the extra ranks get none, nothing is repeated
    few = [shard_streams(batchify(ids, 2), r, 3) for r in range(3)]
    assert [s.size(1) for s in few] == [1, 1, 0]


# -- the LM: 2 processes against 1 -------------------------------------------------------------
# Global batch 4 (2 streams per process), 6 BPTT windows, a mid-way evaluation, sampled softmax.
# Dropout off: its masks are per-rank random streams, which 1 process cannot reproduce.
LM = [
    "experiment=lstm_lm",
    "budget=smoke",
    "precision=fp32",
    "model.dropout=0.0",
    "distributed.batch_size_is=global",
    "data.batch_size=4",
    "data.eval_batch_size=4",
    "trainer.log_every=2",
    "trainer.eval_every=3",
]


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lm")
    runs = {"one": root / "one", "two": root / "two"}
    mpt_run(LM, 1, runs["one"])
    mpt_run(LM, 2, runs["two"])
    return runs


@pytest.mark.slow
def test_lm_two_processes_compute_what_one_process_computes(lm_runs):
    a, b = read_run(lm_runs["one"]), read_run(lm_runs["two"])
    assert a["status"] == b["status"] == "completed" and a["steps"] == b["steps"] == 6
    assert b["distributed"] == {
        **b["distributed"],
        "world_size": 2,
        "per_process_batch_size": 2,
        "global_batch_size": 4,
    }
    assert (
        a["data"]["streams"] == b["data"]["streams"] == 4 and b["data"]["streams_per_process"] == 2
    )
    assert a["data"]["train_tokens"] == b["data"]["train_tokens"]
    # The same windows, the same candidates, averaged gradients, summed token losses: equal up to
    # the order of float additions (measured: ~1e-7 relative).
    assert b["metrics"]["perplexity"] == pytest.approx(a["metrics"]["perplexity"], rel=1e-5)
    assert b["metrics"]["loss"] == pytest.approx(a["metrics"]["loss"], rel=1e-5)
    ra, rb = train_rows(lm_runs["one"]), train_rows(lm_runs["two"])
    assert [s for s, _ in ra] == [s for s, _ in rb] == [2, 4, 6]
    assert [loss for _, loss in rb] == pytest.approx([loss for _, loss in ra], rel=1e-5)
    assert b["diagnostics"]["distributed"] == {"world_size": 2, "replica_max_abs_diff": 0.0}
    # the mid-way evaluation too (at step 3)
    evals = [
        [r["perplexity"] for r in csv_rows(d) if r["split"] == "eval"]
        for d in (lm_runs["one"], lm_runs["two"])
    ]
    assert len(evals[0]) == len(evals[1]) == 2
    assert [float(v) for v in evals[1]] == pytest.approx([float(v) for v in evals[0]], rel=1e-5)
    # each rank carried the hidden state of its own 2 streams
    h0, h1 = (r["task"]["hidden"][0] for r in checkpoint(lm_runs["two"])["per_rank"])
    assert h0.shape[1] == h1.shape[1] == 2 and not torch.equal(h0, h1)


@pytest.mark.slow
def test_lm_two_process_run_resumes_exactly(lm_runs, tmp_path):
    """A 2-process run stopped after 3 windows (its checkpoint as a killed run leaves it) and
    resumed: every rank takes back its hidden state and the same skip, so it ends exactly as the
    uninterrupted run."""
    broken = tmp_path / "broken"
    mpt_run([*LM, "trainer.max_steps=3"], 2, broken)
    record = read_run(broken)
    assert checkpoint(broken)["step"] == 3
    record["status"] = "running"  # what a killed run's record says: resume=true continues it
    (broken / "run.json").write_text(json.dumps(record))
    mpt_run([*LM, "resume=true"], 2, broken)
    a, b = read_run(lm_runs["two"]), read_run(broken)
    assert b["status"] == "completed" and b["resumed"] is True and b["steps"] == 6
    assert b["metrics"] == a["metrics"]  # exactly
    assert dict(train_rows(broken))[6] == dict(train_rows(lm_runs["two"]))[6]
    assert b["diagnostics"]["distributed"]["replica_max_abs_diff"] == 0.0


# -- DCGAN ---------------------------------------------------------------------------------------
# Mixed precision: DDP averages the FP16 gradients of both networks, the policy steps FP32 masters.
# Global batch 16 (8 per process) over 64 images: 4 steps an epoch, 6 steps cross an epoch end
# (with an evaluation there).
GAN = [
    "experiment=dcgan",
    "budget=smoke",
    "precision=mixed",
    "distributed.batch_size_is=global",
    "data.batch_size=16",
    "trainer.epochs=2",
]


def test_dcgan_two_processes_keep_identical_replicas(tmp_path):
    run_dir = tmp_path / "two"
    mpt_run(GAN, 2, run_dir)
    record = read_run(run_dir)
    assert record["status"] == "completed" and record["steps"] == 6
    assert (
        record["distributed"]["world_size"] == 2
        and record["distributed"]["per_process_batch_size"] == 8
    )
    # G's and D's weights and FP32 masters are the same on both ranks, bit for bit
    assert record["diagnostics"]["distributed"] == {"world_size": 2, "replica_max_abs_diff": 0.0}
    per_opt = record["diagnostics"]["per_optimizer"]
    assert per_opt["discriminator"]["steps"] == per_opt["generator"]["steps"] == 6
    # each rank drew its own noise (the generators' states differ), saved for an exact resume
    noise = [r["task"]["noise_rng"] for r in checkpoint(run_dir)["per_rank"]]
    assert not torch.equal(noise[0], noise[1])
    assert sorted(p.name for p in (run_dir / "samples").glob("step_*.png"))  # rank 0 wrote the grid


def sensitive_gan(overrides: list[str]):
    """A GAN task with both networks re-initialised at a large scale: at smoke size the DCGAN
    init makes D(G(z)) almost the same for every z, which would hide a wrong pairing of images
    and noise in evaluation."""
    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.tasks import build_task

    cfg = compose(overrides)
    task = build_task(
        cfg, CPU, PrecisionPolicy(cfg.precision, CPU, paper_loss_scale=cfg.paper_loss_scale)
    )
    gen = torch.Generator().manual_seed(7)  # the same weights on every rank
    with torch.no_grad():
        for p in [*task.generator.parameters(), *task.discriminator.parameters()]:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return task


def _gan_eval_worker(rank: int, port: int, overrides: list[str], out: dict) -> None:
    from mpt_repro import distributed

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    cfg = compose(overrides)
    distributed.setup(cfg.distributed, CPU)
    try:
        out[rank] = sensitive_gan(overrides).evaluate().metrics
    finally:
        distributed.teardown()


def test_dcgan_evaluation_over_two_ranks_is_the_one_process_evaluation():
    """Each rank evaluates its shard of the held-out images, each image with its own fixed noise
    vector; the sums over ranks give what one process computes."""
    import torch.multiprocessing as mp

    overrides = [
        "experiment=dcgan",
        "budget=smoke",
        "precision=fp32",
        "trainer.device=cpu",
        "data.eval_batch_size=8",
    ]
    expected = sensitive_gan(overrides).evaluate().metrics
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gan_eval_worker, args=(free_port(), overrides, out), nprocs=2, join=True)
        got = dict(out)
    assert got[0] == got[1]
    assert got[0] == pytest.approx(expected, rel=1e-5)
