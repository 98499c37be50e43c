"""End to end on a CPU: scripts/reproduce_table.sh runs real sweeps (mpt-run), then mpt-report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPRODUCE_TABLE_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
# the environment running the tests (a .venv at the root, or make compat's torch-2.11 venv)
VENV = Path(sys.executable).parents[1]


def reproduce(
    tmp_path: Path, command: list[str], timeout: int, **env
) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in REPRODUCE_TABLE_SETTINGS}
    clean.update(VENV=str(VENV), RUNS_DIR=str(tmp_path / "runs"), OUT=str(tmp_path / "report"))
    clean.update(env)
    return subprocess.run(
        command, cwd=ROOT, env=clean, capture_output=True, text=True, timeout=timeout
    )


def records(runs: Path) -> dict[str, dict]:
    return {str(p.relative_to(runs)): json.loads(p.read_text()) for p in runs.rglob("run.json")}


@pytest.mark.slow
def test_small_sweep_then_report_and_rerun_is_a_no_op(tmp_path):
    settings = dict(
        BUDGET="smoke",
        DATA="synthetic",
        EXPERIMENTS="alexnet",
        PRECISIONS="fp32",
        OTHERS="demo:fp32",
    )
    result = reproduce(tmp_path, ["bash", "scripts/reproduce_table.sh"], 600, **settings)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first = records(tmp_path / "runs")
    assert sorted(first) == [
        "alexnet/fp32-smoke/seed0/data=synthetic/run.json",
        "demo/fp32-smoke/seed0/run.json",
    ]
    assert {r["status"] for r in first.values()} == {"completed"}

    out = tmp_path / "report"
    table1 = pd.read_csv(
        next((out / "tables").glob("table1_smoke_synthetic_*.csv")),
        dtype=str,
        keep_default_na=False,
    )
    alexnet = table1[table1["Model"] == "AlexNet"].iloc[0]
    expected = first["alexnet/fp32-smoke/seed0/data=synthetic/run.json"]["metrics"]["top1"]
    assert alexnet["ours fp32"] == f"{expected:.2f} (n=1)"
    assert alexnet["Δ fp32 vs paper"] == "n/c"
    report = (out / "report.md").read_text()
    assert "budget=smoke on synthetic data" in report and "not comparable with the paper" in report
    assert list((out / "plots").glob("alexnet_smoke_synthetic_*_curves.png"))

    # idempotent: the same command again leaves every completed run as it was
    again = reproduce(tmp_path, ["bash", "scripts/reproduce_table.sh"], 600, **settings)
    assert again.returncode == 0, again.stderr[-3000:]
    assert records(tmp_path / "runs") == first


@pytest.mark.slow
def test_make_reproduce_table_smoke_synthetic(tmp_path):
    """The brief's CPU path: six ILSVRC models on synthetic data, the LM, DCGAN and demo (~20 min on
    2
    cores).
    """
    result = reproduce(
        tmp_path,
        [
            "make",
            "-s",
            "-o",
            f"{VENV}/.installed",
            "reproduce-table",
            f"VENV={VENV}",
            "BUDGET=smoke",
            "DATA=synthetic",
        ],
        3600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "report"
    table1 = pd.read_csv(
        next((out / "tables").glob("table1_smoke_synthetic_*.csv")),
        dtype=str,
        keep_default_na=False,
    )
    for preset in ("fp32", "mixed", "no_master", "no_scaling"):
        assert (table1[f"ours {preset}"] != "").all(), preset
    assert list((out / "tables").glob("lm_smoke_*.csv")) and list(
        (out / "tables").glob("gan_smoke_*.csv")
    )
    problems = pd.read_csv(out / "problems.csv")
    assert not problems["status"].isin(["failed", "running", "unreadable"]).any(), (
        problems.to_string()
    )
