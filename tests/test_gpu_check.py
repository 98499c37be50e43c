"""scripts/gpu_check.sh (make gpu-check): the commands of docs/performance.md's GPU checklist,
printed (DRY_RUN=1) on this CPU machine, and a clear refusal without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from mpt_repro import catalog

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
VENV = Path(sys.executable).parents[1]  # the environment running the tests


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    settings = {"VENV": str(VENV), "OUT": str(tmp_path / "out"), **env}
    return subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=tmp_path,
        env={**os.environ, **settings},
        capture_output=True,
        text=True,
        timeout=120,
    )


def commands(stdout: str) -> list[list[str]]:
    return [line[2:].split() for line in stdout.splitlines() if line.startswith("+ ")]


def test_the_checklist_benches_smokes_every_experiment_and_runs_ddp(tmp_path):
    result = run_script(tmp_path, DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    out = str(tmp_path / "out")
    bench, folder, embedded, ddp, report = commands(result.stdout)
    assert bench == [
        f"{VENV}/bin/mpt-bench",
        "experiment=resnet50",
        "data=synthetic",
        "data.batch_size=256",
        "bench.presets=[fp32,amp,mixed]",
        f"bench.out_dir={out}/bench",
    ]
    smoke = ["budget=smoke", "precision=fp32,amp,mixed", "trainer.device=cuda"]
    for sweep in (folder, embedded):
        assert sweep[1] == "-m" and set(smoke) <= set(sweep)
        assert f"paths.runs_dir={out}/runs" in sweep
    assert "data=synthetic" in folder and "data=synthetic" not in embedded
    # every experiment, once: random data of its shape where its data set is a folder
    swept = [e for sweep in (folder, embedded) for e in sweep[2].split("=")[1].split(",")]
    assert sorted(swept) == sorted(catalog.experiments())
    assert {"resnet50", "ssd", "faster_rcnn"} <= set(folder[2].split("=")[1].split(","))
    assert {"lstm_lm", "dcgan", "demo"} <= set(embedded[2].split("=")[1].split(","))
    assert ddp[:3] == ["scripts/torchrun.sh", "2", "experiment=resnet50"]
    assert "distributed.backend=nccl" in ddp and "trainer.device=cuda" in ddp
    assert report == [f"{VENV}/bin/mpt-report", f"{out}/runs", "--out", f"{out}/report"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    result = run_script(tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "gpu-check: no CUDA device is visible: this checklist is for a GPU machine "
        "(DRY_RUN=1 prints its commands)\n"
    )
    assert not (tmp_path / "out").exists()


def test_make_gpu_check_runs_the_script(tmp_path):
    """`make gpu-check VAR=...` reaches the script (make exports command-line variables)."""
    result = subprocess.run(
        [
            "make",
            "-s",
            "-o",
            f"{VENV}/.installed",
            "gpu-check",
            f"VENV={VENV}",
            "DRY_RUN=1",
            "BATCH=128",
            f"OUT={tmp_path}/out",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "data.batch_size=128" in commands(result.stdout)[0]
