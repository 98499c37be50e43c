"""The same seeds give the same bits on any machine (issue 43): portable mode, the machine in the
record, and make verify-claims.

Two machines are played here by forcing torch's, oneDNN's and MKL's kernel choice to two levels
in two processes: this machine's own pick, and the AVX2 level an older machine would pick (or,
on an AVX2-only machine, the level below). Without portable mode the records differ; with it
every metric and every per-item file is bit-identical.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch  # loaded before any test: pin() must find it so and leave os.environ alone

from mpt_repro.machine import (
    PORTABLE_ENV,
    asked_on_command_line,
    cannot_honour,
    numerics_label,
    pin,
    result_digest,
)
from mpt_repro.record import load_record
from mpt_repro.report.collect import load_runs

ROOT = Path(__file__).resolve().parents[1]
MPT_RUN = str(Path(sys.executable).with_name("mpt-run"))
VERIFY = ROOT / "scripts" / "verify_claims.py"
REPRODUCE = ROOT / "scripts" / "reproduce_claims.py"
# README's command ("The same numbers on another machine"), at this machine's two kernel levels
RUN = ["experiment=demo", "budget=smoke", "precision=mixed"]
PORTABLE = "trainer.portable=true"
# an AVX2 machine's own picks: each library's kernels at AVX2
AVX2_MACHINE = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
# a machine below AVX2 (SSE4): the other level where this machine itself picks AVX2
SSE_MACHINE = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
}


def _native_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without any kernel pin, one thread (as make test runs), and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}


def _start(folder: Path, env: dict, *more: str) -> subprocess.Popen:
    args = [MPT_RUN, *more, *RUN, "trainer.progress=false", f"paths.runs_dir={folder}"]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _levels() -> dict[str, dict[str, str]]:
    """The two machines: this one's own kernel choice, and the level an older one would pick."""
    if _native_capability() == "DEFAULT":
        pytest.skip("torch picks no vectorised kernels here: there is no second level to force")
    return {"own": {}, "other": AVX2_MACHINE if _native_capability() != "AVX2" else SSE_MACHINE}


# a native run is a sweep over two seeds: seed 1 sits beside a portable seed 0 in one group
NATIVE = ("-m", "seed=0,1")


def _make(root: Path, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], Path]:
    """{(level, mode): seed 0's run directory} for each (level, mode) wanted, and a native
    sweep's seed 1 as (level, "native seed 1"); two processes at a time."""
    levels, made = _levels(), {}
    for pair in (wanted[i : i + 2] for i in range(0, len(wanted), 2)):
        started = {}
        for level, mode in pair:
            more = (PORTABLE,) if mode == "portable" else NATIVE
            folder = root / f"{level}-{mode}"
            started[(level, mode)] = (folder, _start(folder, _clean_env(**levels[level]), *more))
        for key, (folder, proc) in started.items():
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
            found = sorted(folder.rglob("run.json"))
            assert len(found) == (1 if key[1] == "portable" else 2), found
            made[key] = found[0].parent  # seed0 sorts first
            if len(found) == 2:
                made[(key[0], "native seed 1")] = found[1].parent
    return made


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """The demo run in portable mode at both levels, and natively at this machine's own."""
    wanted = [("own", "portable"), ("other", "portable"), ("own", "native")]
    return _make(tmp_path_factory.mktemp("machines"), wanted)


def _numbers(run_dir: Path) -> dict:
    """Everything a run computed: its result digest (status, metrics, per-item arrays) and its
    training curve (metrics.csv without the timing columns)."""
    record = load_record(run_dir / "run.json")
    curve = pd.read_csv(run_dir / "metrics.csv").drop(columns=["samples_per_s", "wall_time_s"])
    return {"result": result_digest(run_dir, record), "curve": curve.to_json()}


@pytest.fixture(scope="module")
def other_native(machines, tmp_path_factory):
    """The fourth run: natively at the other level (slow tests only)."""
    return _make(tmp_path_factory.mktemp("other"), [("other", "native")])[("other", "native")]


@pytest.mark.slow
def test_two_kernel_levels_differ_natively(machines, other_native):
    """What two machines pick natively gives other bits here: the problem portable mode fixes."""
    own, other = _numbers(machines[("own", "native")]), _numbers(other_native)
    assert own["result"]["digest"] != other["result"]["digest"]
    record = load_record(other_native / "run.json")["machine"]
    assert record["portable"] == {"requested": False, "honoured": False, "level": None,
                                  "reason": None}  # fmt: skip
    assert record["torch_cpu_capability"] != _native_capability() and record["threads"] == 1
    assert numerics_label(record).startswith(f"native {record['torch_cpu_capability']}")


def test_two_kernel_levels_agree_bit_for_bit_in_portable_mode(machines):
    """The two levels in portable mode: every metric, the per-item file and the curve equal;
    and they differ from this machine's native run (pinning changed the bits, so it acted)."""
    mine, theirs = machines[("own", "portable")], machines[("other", "portable")]
    native = _numbers(machines[("own", "native")])
    a, b = _numbers(mine), _numbers(theirs)
    assert a == b  # every metric, the per-item file's arrays, the training curve
    assert native["result"]["digest"] != a["result"]["digest"]
    with np.load(mine / "eval_items.npz") as x, np.load(theirs / "eval_items.npz") as y:
        assert x.files == y.files and all(np.array_equal(x[k], y[k]) for k in x.files)


def test_the_record_names_the_kernels_that_decided_its_bits(machines):
    native = load_record(machines[("own", "native")] / "run.json")["machine"]
    portable = load_record(machines[("other", "portable")] / "run.json")["machine"]
    assert native["portable"]["requested"] is False and native["threads"] == 1
    assert native["torch_cpu_capability"] == _native_capability()
    assert portable["portable"]["honoured"] is True and portable["portable"]["reason"] is None
    assert portable["torch_cpu_capability"] == "AVX2" and portable["threads"] == 1
    assert {k: portable["env"][k] for k in PORTABLE_ENV} == PORTABLE_ENV
    assert portable["cpu"]["arch"] and portable["blas"]["name"] and portable["gpu"] is None
    assert numerics_label(portable).startswith("portable AVX2, ")
    assert numerics_label(native).startswith(f"native {native['torch_cpu_capability']}")


def test_the_reporter_tells_a_native_record_from_a_portable_one(machines, tmp_path):
    """One identity made natively and in portable mode: the conflict names the machines."""
    for mode in ("native", "portable"):
        run_dir = machines[("own", mode)]
        start = len(run_dir.parts) - 1 - run_dir.parts[::-1].index("mixed-smoke") - 1
        relative = Path(*run_dir.parts[start:])  # demo/mixed-smoke/seed0[/variant]
        shutil.copytree(run_dir, tmp_path / relative)
    _, problems = load_runs(tmp_path)
    conflicts = [p for p in problems if p.status == "conflict"]
    assert len(conflicts) == 2
    for p in conflicts:
        assert "; machine differs: native " in p.reason and " / portable AVX2, " in p.reason


def test_the_reporter_labels_a_group_whose_machines_differ(machines, tmp_path):
    """A native seed 1 and a portable seed 0 of one preset: one group, labelled by its machines
    (the Δ and interval would otherwise mix kernels silently)."""
    for key in (("own", "native seed 1"), ("own", "portable")):
        run_dir = machines[key]
        start = len(run_dir.parts) - 1 - run_dir.parts[::-1].index("mixed-smoke") - 1
        shutil.copytree(run_dir, tmp_path / Path(*run_dir.parts[start:]))
    runs, problems = load_runs(tmp_path)
    assert len(runs) == 2 and not [p for p in problems if p.status == "conflict"]
    (label,) = set(runs["group_label"])
    # (a commit made by someone else between the runs adds "code differs: ..." before it)
    assert "machine differs: native " in label and label.endswith(
        " / portable AVX2, x86_64, 1 thread"
    )


def test_a_record_before_schema_5_reads_with_no_machine_and_is_labelled_by_none(machines, tmp_path):
    """A real record as schema 4 wrote it (no `machine`): read as null, and a group holding it
    and a portable run says nothing of machines (nothing is known of the older one's)."""
    from mpt_repro.record import upgrade

    for key in (("own", "native seed 1"), ("own", "portable")):
        run_dir = machines[key]
        start = len(run_dir.parts) - 1 - run_dir.parts[::-1].index("mixed-smoke") - 1
        shutil.copytree(run_dir, tmp_path / Path(*run_dir.parts[start:]))
    (old,) = [p for p in tmp_path.rglob("run.json") if "portable" not in str(p)]
    record = json.loads(old.read_text())
    del record["machine"]
    old.write_text(json.dumps({**record, "schema_version": 4}))
    up = upgrade(json.loads(old.read_text()))
    assert up["machine"] is None and up["upgraded_from"] == 4 and up["schema_version"] == 5
    runs, _ = load_runs(tmp_path)
    assert len(runs) == 2 and not any("machine" in label for label in runs["group_label"])


def test_verify_claims_names_the_first_metric_that_differs_and_both_machines(machines):
    """The comparison verify-claims makes, on a portable record (the page's) and a native one
    (a machine that did not pin)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import verify_claims

    own, other = machines[("own", "portable")], machines[("own", "native")]
    page = result_digest(own, load_record(own / "run.json"))
    here = result_digest(other, load_record(other / "run.json"))
    found = verify_claims.first_difference(page, here)
    assert found is not None and found.split(":")[0] in (
        "metric loss", "metric top1", "metric top5", "per-item file (eval_items.npz)",
    )  # fmt: skip
    shown = verify_claims.fingerprint_text(load_record(other / "run.json")["machine"])
    assert shown.startswith("native ") and '"torch_cpu_capability"' in shown


def test_a_machine_that_cannot_pin_says_why():
    assert "this machine is aarch64" in cannot_honour({"arch": "aarch64"})
    assert "no AVX2" in cannot_honour({"arch": "x86_64", "flags": ["sse4_2", "avx"]})
    assert "Intel CPUs only" in cannot_honour(
        {"arch": "x86_64", "flags": ["avx2", "fma"], "vendor": "AuthenticAMD"}
    )
    intel = {"arch": "x86_64", "flags": ["avx2", "fma"], "vendor": "GenuineIntel"}
    assert cannot_honour(intel) is None
    environ: dict[str, str] = {}
    assert "torch was loaded in this process" in pin(environ)  # this test process has torch
    assert environ == {}  # nothing pinned that could not take effect
    assert asked_on_command_line(["experiment=demo", "trainer.portable=true"])
    assert asked_on_command_line(["-m", "trainer.portable=false,true"])
    assert not asked_on_command_line(["trainer.portable=false", "trainer.device=cpu"])


def test_the_readme_shows_the_portable_run_and_make_verify_claims():
    """README's commands: the portable run is the one the fixture makes at two levels; make
    verify-claims runs the script (its end-to-end test is slow: it re-runs a page's runs)."""
    readme = (ROOT / "README.md").read_text()
    assert f"mpt-run {' '.join(RUN)} {PORTABLE}" in readme
    assert "make verify-claims ARGS='--sample 3'" in readme
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    made = subprocess.run(["make", "--no-print-directory", "-n", "verify-claims",
                           "ARGS=--sample 3"], cwd=ROOT, capture_output=True, text=True,
                          check=True, env=env)  # fmt: skip
    last = made.stdout.splitlines()[-1].rstrip()
    assert last == ".venv/bin/python scripts/verify_claims.py --sample 3"


def test_a_portable_run_that_cannot_be_pinned_says_so_in_one_line(capsys):
    """mpt-run's job asks before it imports torch: here torch is loaded (this test process), and
    a GPU run is named as such."""
    from omegaconf import OmegaConf

    from mpt_repro.machine import pin_for

    pin_for(OmegaConf.create({"trainer": {"portable": False, "device": "cpu"}}))
    assert capsys.readouterr().err == ""
    pin_for(OmegaConf.create({"trainer": {"portable": True, "device": "cpu"}}))
    err = capsys.readouterr().err
    assert err.startswith("mpt-run: warning: trainer.portable=true cannot be honoured here: ")
    assert "torch was loaded" in err and err.count("\n") == 1
    pin_for(OmegaConf.create({"trainer": {"portable": True, "device": "cuda"}}))
    assert "pins CPU kernels only, and this run is on a GPU" in capsys.readouterr().err


def test_a_gpu_run_records_what_its_bits_depend_on_and_is_never_portable():
    """The fields a GPU run's record carries (read from this torch build; the driver from
    /proc where there is one), and its label."""
    from mpt_repro.machine import fingerprint

    device = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "count": 1}
    found = fingerprint(device, portable=True)
    gpu = found["gpu"]
    assert gpu["name"] == device["name"] and gpu["cuda"] == torch.version.cuda
    assert {"driver", "cudnn", "tf32_matmul", "tf32_cudnn", "float32_matmul_precision",
            "fp16_reduced_precision_reduction", "bf16_reduced_precision_reduction",
            "cudnn_deterministic", "cudnn_benchmark"} <= set(gpu)  # fmt: skip
    assert (
        found["portable"]["honoured"] is False
        and "CPU kernels only" in (found["portable"]["reason"])
    )
    label = numerics_label(found)
    on = {True: "on", False: "off"}
    assert label.startswith("NVIDIA H100 80GB HBM3, driver ") and label.endswith(
        f"TF32 matmul {on[gpu['tf32_matmul']]} cuDNN {on[gpu['tf32_cudnn']]}"
    )


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(VERIFY), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


def test_verify_claims_refuses_a_page_without_digests_and_bad_options(tmp_path):
    page = tmp_path / "claims.md"
    page.write_text("# What this suite reproduces on a laptop\n\nno digests\n")
    done = _verify(str(page))
    assert done.returncode == 2 and "carries no run digests" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert _verify(str(page), "--sample", "0").returncode == 2
    (tmp_path / "kept" / "x").mkdir(parents=True)
    done = _verify(str(page), "--runs-dir", str(tmp_path / "kept"))
    assert done.returncode == 2 and "is not empty" in done.stderr


@pytest.mark.slow
def test_verify_claims_end_to_end_on_a_tiny_page(tmp_path):
    """reproduce-claims --tiny on one claim (portable, with digests), then verify-claims: the
    sample is bit-identical; a page whose digest was changed fails naming the run, the metric and
    both machines."""
    out = tmp_path / "claims"
    args = [sys.executable, str(REPRODUCE), "--tiny", "--claims", "table1_mixed_matches_digits",
            "--out", str(out), "--docs", str(out / "page.md")]  # fmt: skip
    made = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=_clean_env())  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    text = (out / "page.md").read_text()
    assert "## Digests of the runs" in text and "trainer.portable=true" in text
    done = _verify(str(out / "page.md"), "--sample", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 runs bit-identical to" in done.stdout
    block = text.split("```json run-digests\n")[1].split("```")[0]
    entry = json.loads(block)["runs"][0]
    wrong = json.dumps(entry["metrics"]["loss"] + 1e-12)
    bad = text.replace(json.dumps(entry["digest"]), json.dumps("0" * 64), 1)
    bad = bad.replace(f'"loss": {json.dumps(entry["metrics"]["loss"])}', f'"loss": {wrong}', 1)
    (out / "bad.md").write_text(bad)
    done = _verify(str(out / "bad.md"))  # every run: the changed one differs, the others not
    assert done.returncode == 1
    assert f"{entry['run']}: differs, metric loss: " in done.stderr
    assert f"1 of {len(json.loads(block)['runs'])} runs differ" in done.stderr
    assert "the page's machine: portable AVX2" in done.stderr
    assert "this machine:       portable AVX2" in done.stderr
