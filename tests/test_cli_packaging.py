"""`pip install .` works: the wheel carries the configs, and the installed mpt-run finds them from
any working directory (here: a fresh environment, a folder outside the repository)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

# what a source checkout has beside the code and a wheel build must not see
NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "results", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".venv-torch211", ".gpu-wheels", ".gpu-rehearsal",  # make compat's venv, the GPU check's
)  # fmt: skip


def _run(*args, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_wheel_runs_the_demo_from_outside_the_repository(tmp_path: Path) -> None:
    # build from a copy, so that the checkout gets no build/ folder
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=NOT_SOURCE)
    # the build backend of this environment: no registry needed
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "-w", str(tmp_path / "dist"), str(src),
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("mpt_repro-*.whl")
    packed = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("mpt_repro/conf/")}
    in_repo = {
        f"mpt_repro/conf/{p.relative_to(ROOT / 'conf')}" for p in ROOT.glob("conf/**/*.yaml")
    }
    assert packed == in_repo

    # A fresh environment that sees this one's dependencies (torch is not downloaded again) but
    # not its editable mpt_repro: a .pth line adds the folder, without running its .pth files.
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    site = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    Path(site.stdout.strip(), "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
        "--no-index", str(wheel),
    )  # fmt: skip

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = _run(str(python), "-c", "import mpt_repro; print(mpt_repro.__file__)", cwd=cwd, env=env)
    assert where.stdout.startswith(str(venv))
    mpt_run = str(venv / "bin" / "mpt-run")
    assert "mpt-repro" in _run(mpt_run, "--version", cwd=cwd, env=env).stdout
    assert "precision: adaptive, amp" in _run(mpt_run, "--help", cwd=cwd, env=env).stdout
    advise_help = _run(str(venv / "bin" / "mpt-advise"), "--help", cwd=cwd, env=env).stdout
    assert "RUN_DIR | KEY=VALUE" in advise_help
    _run(mpt_run, "experiment=demo", "budget=smoke", "trainer.progress=false", cwd=cwd, env=env)
    record = json.loads((cwd / "results/runs/demo/fp32-smoke/seed0/run.json").read_text())
    assert record["status"] == "completed" and record["git_commit"] is None
    report = _run(
        str(venv / "bin" / "mpt-report"), "results/runs", "--out", "report", cwd=cwd, env=env
    )
    assert report.returncode == 0 and (cwd / "report").is_dir()
