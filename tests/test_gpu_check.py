"""The GPU check (scripts/gpu_check.sh, python3 -m mpt_repro.gpucheck): its plan printed on this
CPU machine (DRY_RUN=1), the CPU rehearsal's plan, the time limits, the summary's verdicts on
hand-made results, what goes back, the wheels list against pyproject.toml, and the README's
commands. The rehearsal itself (make gpu-check-rehearsal) is the slow test at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from mpt_repro import catalog
from mpt_repro.gpucheck import cli, pack, plan, probe, steps, summary

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
VENV = Path(sys.executable).parents[1]  # the environment running the tests


def dry_run(tmp_path: Path, **env: str) -> list[list[str]]:
    settings = {"OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "DRY_RUN": "1"}
    settings.update(PYTHON=sys.executable, WHEELS=str(tmp_path / "no-wheels"))
    settings.update(env)
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=tmp_path,
        env={**os.environ, **settings},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return commands(done.stdout)


def commands(stdout: str) -> list[list[str]]:
    return [line[2:].split("   #")[0].split() for line in stdout.splitlines() if line[:2] == "+ "]


def test_the_plan_benches_five_presets_then_smokes_every_experiment_under_mixed(tmp_path):
    run, probing, bench, folder, embedded, ddp, report = dry_run(tmp_path)
    work = str(tmp_path / "work")
    assert run[0].startswith(f"PYTHONPATH={ROOT}")
    assert run[1:4] == [sys.executable, "-m", "mpt_repro.gpucheck"]
    assert "--note" in run  # no wheels: said in summary.txt, and the check goes on
    assert probing == [sys.executable, "-m", "mpt_repro.gpucheck.probe"]
    assert bench[:3] == [sys.executable, "-m", "mpt_repro.bench.cli"]
    assert {
        "experiment=resnet50",
        "data=synthetic",
        "data.batch_size=256",
        "'bench.presets=[fp32,tf32,amp,mixed,bf16]'",
        "bench.repeats=3",
        "trainer.device=cuda",
        f"bench.out_dir={work}/bench",
    } <= set(bench)
    assert any(re.fullmatch(r"bench\.budget_s=\d+", a) for a in bench)
    for sweep in (folder, embedded):
        assert sweep[2:4] == ["mpt_repro.cli", "-m"]
        assert {"budget=smoke", "precision=mixed", "trainer.device=cuda"} <= set(sweep)
        assert f"paths.runs_dir={work}/runs" in sweep
    assert "data=synthetic" in folder and "data=synthetic" not in embedded
    swept = [e for sweep in (folder, embedded) for e in sweep[4].split("=")[1].split(",")]
    assert sorted(swept) == sorted(catalog.experiments())  # every experiment, once
    assert {"resnet50", "ssd", "faster_rcnn", "speech"} <= set(folder[4].split("=")[1].split(","))
    assert ddp[2:4] == ["torch.distributed.run", "--standalone"]  # printed, skipped on one GPU
    assert "distributed.backend=nccl" in ddp and "seed=1" in ddp
    assert report[2:] == ["mpt_repro.report.cli", f"{work}/runs", "--out", f"{work}/report"] + [
        "--no-plots",
        "--quiet",
    ]


def test_the_wheels_are_installed_with_pip_no_index_target_into_the_work_folder(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "hydra_core-1.3.8-py3-none-any.whl").write_text("")
    install, run = dry_run(tmp_path, WHEELS=str(wheels), STEPS="bench", BATCH="128")[:2]
    site = str(tmp_path / "work" / "site")
    assert install[:4] == [sys.executable, "-m", "pip", "install"]
    assert {"--no-index", "--no-deps"} <= set(install) and install[-1].endswith(".whl")
    assert install[install.index("--target") + 1] == site
    assert run[0].startswith(f"PYTHONPATH={ROOT}:{site}") and "--note" not in run


def test_make_gpu_check_runs_the_plan_with_the_venv_and_no_wheels(tmp_path):
    """`make gpu-check` on a GPU workstation with make install: .venv's python, nothing to
    install, nothing to say about wheels."""
    done = subprocess.run(
        ["make", "-s", "-o", f"{VENV}/.installed", "gpu-check", f"VENV={VENV}", "DRY_RUN=1"]
        + ["BATCH=128", f"OUT={tmp_path}/out", f"WORK={tmp_path}/w"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run, _, bench = commands(done.stdout)[:3]
    assert run[1] == f"{VENV}/bin/python" and "--note" not in run
    assert bench[0] == f"{VENV}/bin/python" and "data.batch_size=128" in bench


def test_make_gpu_check_rehearsal_dry_run_is_the_same_plan_on_the_cpu(tmp_path):
    """`make gpu-check-rehearsal DRY_RUN=1`: the rehearsal venv's python3 runs every step, with
    trainer.device=cpu at tiny sizes, into the same files."""
    rehearsal = tmp_path / "rehearsal"
    (rehearsal / "wheels").mkdir(parents=True)
    (rehearsal / "wheels" / "jiwer-4.0.0-py3-none-any.whl").write_text("")
    done = subprocess.run(
        ["make", "-s", "-o", f"{VENV}/.installed", "gpu-check-rehearsal", f"VENV={VENV}"]
        + [f"REHEARSAL_DIR={rehearsal}", "DRY_RUN=1", f"OUT={tmp_path}/out", f"WORK={tmp_path}/w"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    install, run, probing, bench, folder, embedded, ddp, report = commands(done.stdout)
    python = f"{rehearsal}/venv/bin/python3"
    assert install[0] == python and "--no-index" in install
    assert run[1] == python and "--rehearsal" in run
    assert {s[0] for s in (probing, bench, folder, embedded, report)} == {python}
    for step in (bench, folder, embedded):
        assert "trainer.device=cpu" in step
    assert "data.image_size=32" in bench and "budget=smoke" in bench
    assert folder[4] == "experiment=" + ",".join(plan.REHEARSAL_FOLDER)
    assert not (tmp_path / "out").exists() and not (tmp_path / "w").exists()  # a dry run


# -- the steps under their limits ----------------------------------------------------------------
def test_a_step_past_its_limit_is_stopped_and_the_next_still_runs(tmp_path):
    slow = plan.Step("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 16)
    quick = plan.Step("quick", [sys.executable, "-c", "print('{budget}')"], 20)
    skipped = plan.Step("skipped", ["false"], 10, skip="not asked for")
    said = []
    began = time.monotonic()
    outcomes = steps.run_steps([slow, skipped, quick], steps.Clock(40), tmp_path, said.append)
    assert time.monotonic() - began < 30
    assert [o.status for o in outcomes] == ["timed out", "skipped", "ok"]
    # its limit: the budget less what the later steps keep (20 s, less the time already gone)
    assert re.fullmatch(r"TIMED OUT at its (19|20) s limit", outcomes[0].describe())
    assert re.search(r"stopped at its (19|20) s limit", (tmp_path / "slow.log").read_text())
    budget = int((tmp_path / "quick.log").read_text().splitlines()[-1])
    assert 0 < budget <= 40 - steps.MARGIN_S  # "{budget}": its limit less the margin
    assert "skipped: skipped (not asked for)" in said


def test_a_step_the_budget_cannot_fit_is_skipped_and_said(tmp_path):
    clock = steps.Clock(5)
    outcomes = steps.run_steps([plan.Step("late", ["true"], 30)], clock, tmp_path, print)
    assert outcomes[0].status == "skipped" and outcomes[0].note.startswith("the budget left")


# -- summary.txt -------------------------------------------------------------------------------
def bench_doc(device: str, mixed: dict) -> dict:
    def row(preset, sps, mem, syncs=0, **more):
        return {
            "preset": preset,
            "samples_per_s": sps,
            "samples_per_s_min": sps * 0.99,
            "samples_per_s_max": sps * 1.01,
            "repeats": 3,
            "ratio_fp32": sps / 1200,
            "ratio_amp": sps / 4400,
            "peak_allocated_bytes": mem * 2**30,
            "mem_ratio_fp32": mem / 40,
            "saved_bytes_per_sample": 2**20,
            "host_syncs_per_step": syncs,
            "trainer_overhead": 0.02,
            "meaningful": {"samples_per_s": device == "cuda", "ratio_fp32": device == "cuda"},
            "detail": {"cuda_sync_debug_warnings": 0 if device == "cuda" else None},
            **more,
        }

    rows = [row("fp32", 1200, 40), row("amp", 4400, 22), row("mixed", **mixed)]
    return {"command": "mpt-bench ...", "device": {"type": device}, "results": rows}


def test_the_summary_reads_each_target_from_the_bench_json(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bench_doc("cuda", {"sps": 4300, "mem": 20.8})))
    text = "\n".join(summary.bench_lines(path))
    assert "[PASS] mixed >= 3.5x strict fp32: 3.58x" in text
    assert "[FAIL] mixed >= 4,500 img/s: 4,300 img/s" in text
    assert "[PASS] mixed peak memory <= 0.55 x fp32: 0.52" in text
    assert "[PASS] 0 host syncs per step (every preset): fp32 0, amp 0, mixed 0" in text
    assert "[info FAIL] mixed >= 0.95x amp: 0.98x" not in text and "[info PASS]" in text
    path.write_text(json.dumps(bench_doc("cuda", {"sps": 4600, "mem": 20, "syncs": 2})))
    assert "[FAIL] 0 host syncs per step (every preset): fp32 0, amp 0, mixed 2" in "\n".join(
        summary.bench_lines(path)
    )
    path.write_text(json.dumps(bench_doc("cpu", {"sps": 1, "mem": 1})))
    text = "\n".join(summary.bench_lines(path))
    assert "[n/a ] mixed >= 3.5x strict fp32: 0.00x on a CPU means nothing" in text


def test_missing_packages_are_named_in_one_line_and_the_summary_still_comes(
    tmp_path, monkeypatch, capsys
):
    missing = {"dist": "hydra-core", "module": "hydra", "error": "ModuleNotFoundError: hydra"}
    monkeypatch.setattr(cli, "run_probe", lambda python, log: {"missing": [missing]})
    out = tmp_path / "out"
    code = cli.main(["--out", str(out), "--work", str(tmp_path / "work"), "--note", "no wheels"])
    assert code == 2
    text = (out / "summary.txt").read_text()
    line = "MISSING: hydra-core (ModuleNotFoundError: hydra); carry the wheels of `make gpu-wheels`"
    assert line in text and "note: no wheels" in text
    assert line in capsys.readouterr().out  # the device tool's output tail has it too
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check-logs.tar.gz", "summary.txt"]


def test_without_a_gpu_nothing_runs_and_the_summary_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "run_probe", lambda python, log: {"missing": [], "gpus": []})
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--work", str(tmp_path / "work")]) == 2
    assert cli.NO_GPU in (out / "summary.txt").read_text()
    assert not (tmp_path / "work" / "runs").exists()


def test_what_goes_back_is_at_most_8_files_without_checkpoints(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    run = work / "runs" / "demo" / "mixed-smoke" / "seed0"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("run.json", "metrics.csv", "checkpoints/last.pt", "events.out.tfevents.1"):
        (run / name).write_text("{}")
    (work / "bench").mkdir()
    (work / "bench" / "resnet50-nvidia-h100-1.json").write_text("{}")
    (work / "report").mkdir()
    (work / "report" / "report.md").write_text("# report")
    too_big = pack.pack(work, out, summary.newest_bench(work))
    assert not too_big
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu-check-logs.tar.gz",
        "report.md",
        "resnet50-nvidia-h100-1.json",
    ]
    import tarfile

    with tarfile.open(out / pack.ARCHIVE) as tar:
        names = tar.getnames()
    assert "runs/demo/mixed-smoke/seed0/run.json" in names
    assert not any("checkpoints" in n or "tfevents" in n for n in names)


def test_a_smoke_run_without_a_record_is_named(tmp_path):
    run = tmp_path / "runs" / "demo" / "mixed-smoke" / "seed0"
    run.mkdir(parents=True)
    record = {"experiment": "demo", "precision": "mixed", "status": "completed", "steps": 6}
    (run / "run.json").write_text(json.dumps(record))
    text = "\n".join(summary.smoke_lines(tmp_path / "runs", ["demo", "ssd"]))
    assert "1 of 1 completed" in text and "no run record: ssd" in text


# -- the packages -------------------------------------------------------------------------------
def pyproject_names() -> tuple:
    """scripts/gpu_wheels.py (scripts/ is no package) and pyproject.toml's dependency names."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_wheels
    finally:
        sys.path.pop(0)
    deps = gpu_wheels.pyproject_dependencies()
    return gpu_wheels, {re.split(r"[<>=\[ ]", d)[0].lower() for d in deps}


def test_the_probe_imports_every_dependency_of_pyproject():
    _, names = pyproject_names()
    assert set(probe.NEEDED.values()) == names


def test_every_dependency_is_in_the_gpu_image_or_in_the_carried_wheels():
    """What the GPU image lacks is exactly what `make gpu-wheels` carries (its wheels' own
    requirements are checked when they are fetched)."""
    gpu_wheels, names = pyproject_names()
    carried = {n for n, _, _ in gpu_wheels.pins()}
    lacking = {n for n in names if n not in gpu_wheels.image()}
    assert lacking == {"hydra-core", "omegaconf", "hydra-submitit-launcher", "soundfile", "jiwer"}
    assert lacking <= carried and not carried & gpu_wheels.image()


# -- the README --------------------------------------------------------------------------------
def test_the_readme_s_gpu_commands_are_the_ones_tested_here():
    text = (ROOT / "README.md").read_text()
    block = text.split("## On a GPU, and on a cluster", 1)[1].split("```bash", 1)[1]
    shown = [line.split("#")[0].strip() for line in block.split("```", 1)[0].splitlines()]
    assert [c for c in shown if c] == [
        "make gpu-wheels",  # test_make_gpu_wheels_runs_the_fetch_script (its fetch: the slow test)
        "make gpu-check-rehearsal",  # the dry run above; the rehearsal: the slow test
        "bash scripts/gpu_check.sh",  # the plan above (DRY_RUN=1)
    ]


def test_make_gpu_wheels_and_compat_run_what_they_say():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}

    def made(target: str) -> list[str]:
        return subprocess.run(
            ["make", "--no-print-directory", "-n", "-B", "-o", ".venv/.installed", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.splitlines()

    assert made("gpu-wheels")[-1] == ".venv/bin/python scripts/gpu_wheels.py --dest .gpu-wheels"
    compat = made("compat")
    assert any("torch==2.11.0 torchvision==0.26.0 -e '.[test]'" in line for line in compat)
    assert compat[-1] == '.venv-torch211/bin/python -m pytest -m "not slow and not gpu" -q'


@pytest.mark.slow
def test_the_rehearsal_runs_the_plan_on_the_cpu_in_under_5_minutes(tmp_path):
    """make gpu-check-rehearsal as README shows it: a venv without mpt-repro, the wheels fetched
    for this Python and installed with pip --target, every step ok, the same files back."""
    began = time.monotonic()
    done = subprocess.run(
        ["make", "-s", "-o", f"{VENV}/.installed", "gpu-check-rehearsal", f"VENV={VENV}"]
        + [f"OUT={tmp_path}/out", f"WORK={tmp_path}/work"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert "REHEARSAL on the CPU" in text and "MISSING" not in text
    assert "FAILED" not in text and "TIMED OUT" not in text
    assert "[PASS] 0 host syncs per step (every preset)" in text
    embedded = plan.split_experiments()[1]
    assert f"runs (runs/): {len(plan.REHEARSAL_FOLDER) + len(embedded)} of " in text
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(names) == 4 and {"summary.txt", "report.md", pack.ARCHIVE} < set(names)
    assert wall < 300, f"{wall:.0f} s"


def test_the_summary_says_where_each_sync_warning_came_from(tmp_path):
    """The H200 check warned once a preset with no place to look (issue 47): the bench JSON now
    keeps where torch's sync-debug mode raised each warning, and summary.txt prints it."""
    doc = bench_doc("cuda", {"sps": 4600, "mem": 20})
    doc["results"][2]["detail"] = {
        "cuda_sync_debug_warnings": 1,
        "cuda_sync_debug_where": {"mpt_repro/trainer.py:1 x | torch/optim/sgd.py:2": 1},
    }
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    text = "\n".join(summary.bench_lines(path))
    assert "[FAIL] 0 host syncs per step (every preset): fp32 0, amp 0, mixed 0 (1 warned)" in text
    assert "mixed warned at mpt_repro/trainer.py:1 x | torch/optim/sgd.py:2 (1x)" in text
