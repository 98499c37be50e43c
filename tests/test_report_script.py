"""scripts/reproduce_table.sh (make reproduce-table): refuses to start without data, prints the
sweep.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPRODUCE_TABLE_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "reproduce_table.sh"
# the environment running the tests (a .venv at the root, or make compat's torch-2.11 venv)
VENV = Path(sys.executable).parents[1]


def run_script(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in REPRODUCE_TABLE_SETTINGS}
    clean.update(VENV=str(VENV), RUNS_DIR=str(tmp_path / "runs"), OUT=str(tmp_path / "report"))
    clean.update(env)
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=60
    )


def test_without_imagenet_prints_download_steps_and_runs_nothing(tmp_path):
    result = run_script(tmp_path)  # the defaults: BUDGET=paper, DATA=imagenet, no DATA_ROOT
    assert result.returncode == 2
    for needed in (
        "DATA_ROOT is not set",
        "https://image-net.org/",
        "ILSVRC2012_img_train.tar",
        "ILSVRC2012_img_val.tar",
        "ILSVRC2012_devkit_t12.tar.gz",
        "class folders",
        "DATA_ROOT=/data/imagenet",
        "Nothing was run",
        "BUDGET=smoke DATA=synthetic",
    ):
        assert needed in result.stderr, needed
    assert "mpt-run" not in result.stdout
    assert not (tmp_path / "runs").exists() and not (tmp_path / "report").exists()


def test_data_root_without_train_and_val_is_refused(tmp_path):
    (tmp_path / "imagenet" / "train").mkdir(parents=True)  # val/ is missing
    result = run_script(tmp_path, DATA_ROOT=str(tmp_path / "imagenet"))
    assert result.returncode == 2
    assert "has no train/ and val/ folders" in result.stderr


def test_unknown_experiment_or_preset_is_refused_before_running(tmp_path):
    result = run_script(
        tmp_path,
        DATA="synthetic",
        EXPERIMENTS="resnet50,nosuchnet",
        PRECISIONS="fp32,nosuchpreset",
        OTHERS="",
    )
    assert result.returncode == 2
    assert "experiment nosuchnet" in result.stderr and "preset nosuchpreset" in result.stderr
    assert "+ " not in result.stdout


def test_dry_run_shows_the_sweeps(tmp_path):
    result = run_script(
        tmp_path,
        DRY_RUN="1",
        BUDGET="smoke",
        DATA="synthetic",
        SEEDS="0,1",
        EXPERIMENTS="alexnet,resnet50",
        PRECISIONS="fp32,mixed",
        OTHERS="demo:fp32,mixed",
    )
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    runs = str(tmp_path / "runs")
    assert commands[0].split()[1:] == [
        f"{VENV}/bin/mpt-run",
        "-m",
        "experiment=alexnet,resnet50",
        "precision=fp32,mixed",
        "budget=smoke",
        "seed=0,1",
        "resume=true",
        f"paths.runs_dir={runs}",
        "trainer.progress=false",
        "data=synthetic",
    ]
    assert commands[1].split()[1:5] == [
        f"{VENV}/bin/mpt-run",
        "-m",
        "experiment=demo",
        "precision=fp32,mixed",
    ]
    assert commands[2].split()[1:] == [
        f"{VENV}/bin/mpt-report",
        runs,
        "--out",
        str(tmp_path / "report"),
    ]


def test_make_passes_its_variables(tmp_path):
    """`make reproduce-table VAR=...` reaches the script (make exports command-line variables)."""
    result = subprocess.run(
        [
            "make",
            "-s",
            "-o",
            f"{VENV}/.installed",
            "reproduce-table",
            f"VENV={VENV}",
            "DRY_RUN=1",
            "BUDGET=smoke",
            "DATA=synthetic",
            "EXPERIMENTS=resnet50",
            "PRECISIONS=fp32",
            "OTHERS=",
            f"RUNS_DIR={tmp_path}/runs",
            f"OUT={tmp_path}/report",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "experiment=resnet50 precision=fp32 budget=smoke" in result.stdout


def test_default_sweep_comes_from_conf(tmp_path):
    """Without EXPERIMENTS and OTHERS: the paper's Table 1 rows conf/ has, then every other
    experiment of conf/experiment/ with OTHER_PRECISIONS; nothing is listed in the script."""
    from mpt_repro import catalog

    result = run_script(tmp_path, DRY_RUN="1", BUDGET="smoke", DATA="synthetic")
    assert result.returncode == 0, result.stderr
    commands = [line.split() for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert commands[0][3] == "experiment=" + ",".join(catalog.table1_experiments())
    others = [c[3].removeprefix("experiment=") for c in commands[1:-1]]
    assert others == [
        e for e in sorted(catalog.experiments()) if e not in catalog.table1_experiments()
    ]
    assert {c[4] for c in commands[1:-1]} == {"precision=fp32,mixed,no_scaling"}
    assert commands[-1][1] == f"{VENV}/bin/mpt-report"


def test_paper_budget_skips_an_experiment_whose_data_folder_is_not_given(tmp_path):
    result = run_script(
        tmp_path,
        DRY_RUN="1",
        BUDGET="paper",
        EXPERIMENTS="",
        OTHERS="lstm_lm:fp32 demo:fp32",
        LM_ROOT="",
    )
    assert result.returncode == 0, result.stderr
    assert "skipping lstm_lm at budget=paper: set LM_ROOT to its data set's folder" in result.stderr
    assert "experiment=lstm_lm" not in result.stdout and "experiment=demo" in result.stdout
    with_root = run_script(
        tmp_path, DRY_RUN="1", BUDGET="paper", EXPERIMENTS="", OTHERS="lstm_lm:fp32", LM_ROOT="/lm"
    )
    assert "experiment=lstm_lm precision=fp32" in with_root.stdout
    assert "data.root=/lm" in with_root.stdout


def test_smoke_without_a_folder_uses_the_stand_in_or_synthetic_data(tmp_path):
    """At smoke size: the corpus has an embedded stand-in (conf/experiment_budget), VOC has none,
    so DATA=synthetic runs the detector on random images and otherwise it is skipped."""
    others = "lstm_lm:fp32 ssd:fp32"
    result = run_script(
        tmp_path, DRY_RUN="1", BUDGET="smoke", DATA="synthetic", EXPERIMENTS="", OTHERS=others
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    lm, ssd = lines[0].split(), lines[1].split()
    assert lm[3] == "experiment=lstm_lm" and "data=synthetic" not in lm
    assert ssd[3] == "experiment=ssd" and ssd[-1] == "data=synthetic"
    real = run_script(
        tmp_path, DRY_RUN="1", BUDGET="smoke", DATA="imagenet", EXPERIMENTS="", OTHERS=others
    )
    assert "skipping ssd: set VOC_ROOT to its data set's folder, or DATA=synthetic" in real.stderr
    assert "experiment=ssd" not in real.stdout and "experiment=lstm_lm" in real.stdout


def test_translation_runs_on_the_embedded_bible_or_on_its_wmt_folder(tmp_path):
    """At smoke size translation trains on the embedded Bible (no folder, no DATA=synthetic);
    WMT15_ENFR_ROOT brings its own data set back with the folder (data=wmt15_enfr)."""
    common = dict(DRY_RUN="1", BUDGET="smoke", EXPERIMENTS="", OTHERS="translation:fp32")
    bible = run_script(tmp_path, DATA="imagenet", WMT15_ENFR_ROOT="", **common)
    assert bible.returncode == 0, bible.stderr
    line = next(x for x in bible.stdout.splitlines() if "experiment=translation" in x).split()
    assert not [w for w in line if w.startswith("data")]
    wmt = run_script(tmp_path, DATA="imagenet", WMT15_ENFR_ROOT="/wmt", **common)
    line = next(x for x in wmt.stdout.splitlines() if "experiment=translation" in x).split()
    assert line[-2:] == ["data=wmt15_enfr", "data.root=/wmt"]
    paper = run_script(tmp_path, **{**common, "BUDGET": "paper", "WMT15_ENFR_ROOT": "/wmt"})
    line = next(x for x in paper.stdout.splitlines() if "experiment=translation" in x).split()
    assert line[-1] == "data.root=/wmt" and "data=wmt15_enfr" not in line
