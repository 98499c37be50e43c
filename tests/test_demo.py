"""`make demo` (scripts/demo.py) at the smoke budget, then the seeds command its closing lines
print, run exactly as printed: it must run beside the demo's own seed-0 runs, not collide with
them, and the report over the folder then has five seeds a preset."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_the_demo_and_its_seeds_hint_run_as_printed(tmp_path):
    runs = tmp_path / "runs"
    demo = [sys.executable, "scripts/demo.py", "--budget", "smoke", "--runs-dir", str(runs)]
    done = subprocess.run(demo, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| fp32 | completed |" in done.stdout and "| mixed | completed |" in done.stdout
    hint = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("mpt-")]
    sweep, report = (shlex.split(line) for line in hint[:2])
    assert sweep[:2] == ["mpt-run", "-m"] and report[0] == "mpt-report"
    done = subprocess.run([str(BIN / "mpt-run"), *sweep[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list(runs.rglob("run.json"))) == 15  # 3 presets x seeds 0-4; seed 0 kept
    done = subprocess.run([str(BIN / "mpt-report"), *report[1:], "--no-plots", "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    deltas = (tmp_path / "report" / "deltas.csv").read_text()
    assert "mixed" in deltas and ",5," in deltas  # five paired seeds
