"""Distributed runs that outlive a process: a 2-process run killed mid-way and resumed, and
sweeps through submitit (the SLURM launcher's configuration, and its local executor for real)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import conftest
import pytest
from conftest import MPT_RUN, ROOT, read_run
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from test_distributed import free_port

# demo (digits CNN with BatchNorm), 2 processes x batch 16: 3 epochs of 32 steps, a checkpoint
# every 10 steps, so the kill lands mid-epoch and far from the end.
RESUME = [
    "experiment=demo",
    "budget=paper",
    "trainer.epochs=3",
    "data.train_limit=1024",
    "data.batch_size=16",
    "trainer.checkpoint_every=10",
    "trainer.log_every=5",
    "trainer.eval_every=40",
    "trainer.progress=false",
    "trainer.device=cpu",
]


def torchrun_mpt_run(run_dir: Path, *extra: str, wait: bool = True):
    """`torchrun --nproc_per_node=2 $(which mpt-run) ...`, the documented command line."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        MPT_RUN,
        *RESUME,
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}"


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (torchrun starts its workers in sessions of their own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def rows(run_dir: Path) -> list[tuple[str, str, str]]:
    return [
        (r["step"], r["split"], r["loss"]) for r in csv.DictReader(open(run_dir / "metrics.csv"))
    ]


@pytest.mark.slow
def test_killed_two_process_run_resumes_to_identical_metrics(tmp_path: Path) -> None:
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    torchrun_mpt_run(whole)
    proc = torchrun_mpt_run(broken, wait=False)
    deadline = time.time() + 240
    while not (broken / "checkpoints" / "last.pt").exists():
        assert proc.poll() is None, (
            f"run ended before its first checkpoint: {proc.stderr.read()[-3000:]}"
        )
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    for pid in children(proc.pid):  # SIGKILL every rank, then torchrun: nobody cleans up
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    assert read_run(broken)["status"] == "running"  # killed mid-way
    torchrun_mpt_run(broken, "resume=true")
    a, b = read_run(whole), read_run(broken)
    assert (
        b["status"] == "completed" and b["resumed"] is True and b["distributed"]["world_size"] == 2
    )
    assert a["steps"] == b["steps"] == 96
    assert (
        a["metrics"] == b["metrics"]
    )  # exactly: every rank reloaded weights, scale, data position, RNG
    assert rows(whole) == rows(broken)
    assert b["diagnostics"]["distributed"]["replica_max_abs_diff"] == 0.0


def test_slurm_launcher_config_composes() -> None:
    cfg = conftest.compose(
        [
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=4",
            "hydra.launcher.account=proj42",
            "experiment=demo",
        ],
        return_hydra_config=True,
    )
    HydraConfig.instance().set_config(cfg)  # the launcher's fields interpolate hydra.* values
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["partition"] == "gpu" and launcher["account"] == "proj42"
    assert launcher["tasks_per_node"] == launcher["gpus_per_node"] == 4  # one process per GPU
    assert {"nodes", "timeout_min", "mem_gb", "cpus_per_task"} <= launcher.keys()
    assert launcher["submitit_folder"] == "results/runs/.submitit/%j"  # under the sweep dir


@pytest.mark.slow
def test_sweep_through_submitit_local_executor(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            MPT_RUN,
            "-m",
            "hydra/launcher=local",
            "experiment=demo",
            "budget=smoke",
            "precision=fp32,amp",
            "trainer.progress=false",
            f"paths.runs_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = {
        p.parent.parent.name: read_run(p.parent) for p in tmp_path.glob("demo/*/seed0/run.json")
    }
    assert set(records) == {"fp32-smoke", "amp-smoke"}
    assert all(r["status"] == "completed" and r["steps"] == 6 for r in records.values())
    assert list(tmp_path.glob(".submitit/*/*_result.pkl"))  # it really went through submitit
