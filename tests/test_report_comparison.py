"""Comparisons a researcher can trust (issue 22), shown with real runs of the real writer.

- like against like: a learning-rate change is its own group, labelled, never a Δ to fp32;
- every ending visible: a loss still non-finite at the last step ends `diverged`, and no table,
  CSV or plot shows its metrics as a number;
- one name for one run: a sweep's job and the same single run share a directory, also with a
  value that Hydra escapes in sweeps; your own model runs under its own name;
- deltas with their uncertainty: the paired Δ to fp32 and its Student-t interval, checked against
  the records' own numbers;
- the cost view: memory that is each run's own, ratios within a group;
- the reporter's defaults (its own report folder, bench files of the folder only, an empty folder
  refused) and the README's custom-model commands, run as written.

The demo at budget=smoke takes a second or two per run in this process (`mpt_repro.run.run` with
the config mpt-run composes); the sweeps go through the real `mpt-run -m`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import MPT_RUN, ROOT, compose, read_run, run_cli

from mpt_repro.identity import variant_name
from mpt_repro.report import cli

SMOKE = ["experiment=demo", "budget=smoke", "trainer.progress=false", "trainer.device=cpu"]
MPT_REPORT = str(Path(sys.executable).with_name("mpt-report"))


def train(run_dir: Path, *overrides: str) -> dict:
    """One real run in this process, as mpt-run runs it; its run.json."""
    from mpt_repro.run import run

    run(compose([*SMOKE, *overrides]), run_dir)
    return read_run(run_dir)


def runs_dir(root: Path, precision: str, seed: int, variant: str = "") -> Path:
    path = root / "demo" / f"{precision}-smoke" / f"seed{seed}"
    return path / variant if variant else path


def table(out: Path, prefix: str) -> pd.DataFrame:
    [path] = (out / "tables").glob(f"{prefix}*.csv")
    return pd.read_csv(path, dtype=str, keep_default_na=False)


# ---------------------------------------------------------------- one results folder, real runs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """fp32 and mixed over three seeds, mixed at another learning rate, and a run whose loss goes
    non-finite after the patience could still be reached."""
    root = tmp_path_factory.mktemp("comparison") / "runs"
    records = {}
    for seed in (0, 1, 2):
        for preset in ("fp32", "mixed"):
            records[preset, seed] = train(runs_dir(root, preset, seed), f"precision={preset}",
                                          f"seed={seed}")  # fmt: skip
    records["lr"] = train(
        runs_dir(root, "mixed", 0, "optim.lr=0.0001"), "precision=mixed", "optim.lr=0.0001"
    )
    # FP16 without scaling at lr 1e12: NaN from the first update on; patience 100 > 6 steps, so
    # only the end-of-run rule can catch it
    records["nan"] = train(
        runs_dir(root, "no_scaling", 0, "optim.lr=1e12,trainer.diverge_patience=100"),
        "precision=no_scaling",
        "optim.lr=1e12",
        "trainer.diverge_patience=100",
    )
    out = root.parent / "report"
    assert cli.main([str(root), "--out", str(out), "--quiet"]) == 0
    return root, out, records


def test_a_learning_rate_change_is_its_own_group_labelled_by_the_key(results):
    _, out, records = results
    lr = records["fp32", 0]["config"]["optim"]["lr"]
    demo = table(out, "classification_smoke_digits").set_index("Experiment")
    assert set(demo.index) == {
        f"demo [optim.lr={lr}, trainer.diverge_patience=10]",
        "demo [optim.lr=0.0001, trainer.diverge_patience=10]",
        "demo [optim.lr=1000000000000.0, trainer.diverge_patience=100]",
    }
    slow = demo.loc["demo [optim.lr=0.0001, trainer.diverge_patience=10]"]
    # mixed at lr 1e-4 has no fp32 beside it: no difference, no verdict
    assert (
        slow["fp32"] == "" and slow["Δ mixed − fp32 (95% CI)"] == "" and slow["mixed vs fp32"] == ""
    )
    assert slow["mixed"] == f"{records['lr']['metrics']['top1']:.2f} (n=1)"
    # the label travels to the CSVs and the plots
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["group_label"]) == {g.split("[")[1][:-1] for g in demo.index}
    plots = {p.name for p in (out / "plots").glob("*_curves.png")}
    assert any("optim-lr-0-0001" in name for name in plots), plots


def test_a_loss_non_finite_at_the_end_is_diverged_and_never_a_number(results):
    _, out, records = results
    nan = records["nan"]
    assert nan["status"] == "diverged" and nan["metrics"] is None
    assert "at the end of the run" in nan["reason"] and nan["diverged_at_step"] <= 3
    cell = table(out, "classification_smoke_digits").set_index("Experiment")
    row = cell.loc["demo [optim.lr=1000000000000.0, trainer.diverge_patience=100]"]
    assert row["no_scaling"].startswith("diverged at step") and row["fp32"] == ""
    runs = pd.read_csv(out / "runs.csv")
    diverged = runs[runs["status"] == "diverged"].iloc[0]
    assert diverged["outcome"].startswith("diverged at step")
    assert all(pd.isna(diverged[c]) for c in runs.columns if c.startswith("metric_"))
    assert not any(re.search(r"\b0\.00\b", v) for v in cell.loc[row.name].tolist())


def test_paired_delta_and_its_evidence_match_the_records(results):
    """The mean and the seeds' spread, recomputed here from the six run.json files; the interval
    holds the evaluation set's share too (its count from the records: the smoke budget's 64
    images), as compare.interval combines them (tests/test_report_intervals.py checks that part
    against scipy)."""
    from scipy import stats

    _, out, records = results
    diffs = [
        records["mixed", s]["metrics"]["top1"] - records["fp32", s]["metrics"]["top1"]
        for s in (0, 1, 2)
    ]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    deltas = pd.read_csv(out / "deltas.csv")
    [mixed] = deltas[(deltas["preset"] == "mixed") & (deltas["seeds_paired"] == 3)].itertuples()
    assert records["fp32", 0]["evaluation"]["items"] == mixed.eval_items == 64
    assert math.isclose(mixed.delta_mean, mean, abs_tol=1e-9)
    assert math.isclose(mixed.seed_sd, sd, abs_tol=1e-9)
    seed_var, eval_var = sd**2 / 3, mixed.eval_se**2
    if seed_var + eval_var > 0:  # ν by Welch–Satterthwaite on the seeds' and the items' parts
        spread = seed_var**2 / 2 + eval_var**2 / 63
        dof = (seed_var + eval_var) ** 2 / spread
        half = stats.t.ppf(0.975, dof) * math.sqrt(seed_var + eval_var)
        assert math.isclose(mixed.ci_low, mean - half, abs_tol=1e-9)
        assert math.isclose(mixed.ci_high, mean + half, abs_tol=1e-9)
    if sd == 0:  # six steps rarely move a prediction: then no spread, and no verdict
        assert mixed.verdict.startswith(
            ("no verdict: the 3 paired differences", "identical to FP32 on every item")
        ), mixed.verdict
    shown = table(out, "vs_fp32").set_index("Preset").loc["mixed"]
    assert shown["Seeds paired"] == "3" and shown["Verdict"] == mixed.verdict
    assert shown["Δ to fp32 (95% CI)"].endswith("(n=3; 64 images)")


def test_a_malformed_tolerance_is_refused(results, tmp_path):
    root, _, _ = results
    assert cli.main([str(root), "--out", str(tmp_path / "r"), "--tolerance", "top1"]) == 2


def test_memory_is_each_runs_own_and_saved_bytes_halve_under_mixed(results):
    _, out, records = results
    fp32, mixed = records["fp32", 0], records["mixed", 0]
    assert fp32["peak_memory_kind"] == "host_peak_rss"  # reset at the run's start (Linux)
    # the demo CNN's activations in FP16: about half the bytes autograd keeps
    ratio = mixed["saved_bytes_per_sample"] / fp32["saved_bytes_per_sample"]
    assert 0.4 < ratio < 0.7, ratio
    cost = table(out, "cost_smoke").set_index(["Experiment", "Preset"])
    lr = records["fp32", 0]["config"]["optim"]["lr"]
    assert cost.loc[(f"demo [optim.lr={lr}, trainer.diverge_patience=10]", "mixed"),
                    "Saved ÷ fp32"] == f"{ratio:.2f}"  # fmt: skip


def test_the_peak_is_reset_when_a_run_starts():
    """A multirun's later job must not carry an earlier job's peak."""
    import torch

    from mpt_repro.memory import RunMemory

    big = torch.ones(400 * 2**20 // 4)  # 400 MiB resident
    before = RunMemory(torch.device("cpu")).summary()["peak_memory_bytes"]
    del big
    after = RunMemory(torch.device("cpu")).summary()
    assert after["peak_memory_kind"] == "host_peak_rss"
    assert after["peak_memory_bytes"] < before - 300 * 2**20


def test_telemetry_changes_nothing_trained(tmp_path):
    """Why telemetry is left out of the comparison (mpt_repro/identity.py NOT_COMPARED)."""
    plain = train(tmp_path / "plain", "precision=mixed")
    seen = train(tmp_path / "seen", "precision=mixed", "telemetry=diagnostic",
                 "telemetry.every=2")  # fmt: skip
    assert seen["metrics"] == plain["metrics"]
    assert seen["loss_scale"] == plain["loss_scale"]


# ---------------------------------------------------------------- run identity


def test_variant_names_are_canonical_and_paste_into_a_shell():
    sweep = variant_name(["model.target=a.b\\:c", "optim.lr=1e-4", "optim.betas=[0.9,0.99]"])
    single = variant_name(["optim.betas=[0.9, 0.99]", "optim.lr=0.0001", "model.target=a.b:c"])
    assert sweep == single == "model.target=a.b:c,optim.betas=%5B0.9,0.99%5D,optim.lr=0.0001"
    assert shlex.split(sweep) == [sweep]  # one shell word, nothing expanded
    assert variant_name(["+x.y=a b/c"]) == "x.y=a%20b%2Fc"  # never a nested folder
    # the group choice and the seed are in the path already; a precision knob is not
    assert variant_name(["precision=mixed", "seed=3", "precision.init_scale=1024"]) == (
        "precision.init_scale=1024"
    )


@pytest.mark.slow
def test_a_sweep_job_lands_where_the_single_run_did(tmp_path):
    """`a:b` is escaped by Hydra in a sweep (`a\\:b`) and not in a single run: one folder."""
    common = ["experiment=demo", "budget=smoke", "optim.grad_clip_params=conv:x",
              f"paths.runs_dir={tmp_path}", "trainer.device=cpu"]  # fmt: skip
    run_cli(*common)
    [single] = list(tmp_path.rglob("run.json"))
    assert single.parent.name == "optim.grad_clip_params=conv:x"
    sweep = run_cli("-m", *common, "precision=fp32,mixed", "resume=true")
    assert "already completed; nothing to do" in sweep.stdout + sweep.stderr  # the same folder
    dirs = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("run.json"))
    assert dirs == [
        "demo/fp32-smoke/seed0/optim.grad_clip_params=conv:x",
        "demo/mixed-smoke/seed0/optim.grad_clip_params=conv:x",
    ]
    assert not list(tmp_path.rglob("*\\*"))  # no backslash in any name
    # the report's suggestion pastes into a shell as it is
    done = subprocess.run(
        f"{shlex.quote(MPT_REPORT)} {dirs[0]} --no-plots --quiet",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / dirs[0] / "report" / "report.md").exists()


@pytest.mark.slow
def test_your_own_model_runs_under_its_own_name(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    args = ["experiment=demo", "budget=smoke", "model=custom", f"paths.runs_dir={tmp_path}",
            "model.target=helpers_custom_model:tiny_classifier", "+model.kwargs.in_channels=1",
            "trainer.device=cpu"]  # fmt: skip
    proc = run_cli(*args, env=env)
    run_dir = tmp_path / "demo-helpers_custom_model:tiny_classifier" / "fp32-smoke" / "seed0"
    record = read_run(run_dir / "model.kwargs.in_channels=1")
    assert record["study"] == "demo-helpers_custom_model:tiny_classifier"
    assert (
        record["model"]["name"]
        == record["model"]["target"]
        == ("helpers_custom_model:tiny_classifier")
    )
    assert "demo · helpers_custom_model:tiny_classifier / fp32 / smoke" in proc.stdout + proc.stderr
    named = run_cli(*args, "model.name=tiny", "precision=mixed", env=env)
    assert (tmp_path / "demo-tiny" / "mixed-smoke" / "seed0").is_dir(), named.stderr
    refused = run_cli(*args, "model.name=resnet50", env=env, check=False)
    assert refused.returncode == 2 and "model.name" in refused.stderr
    out = tmp_path / "report"
    assert cli.main([str(tmp_path), "--out", str(out), "--quiet", "--no-plots"]) == 0
    rows = set(table(out, "classification_smoke_digits")["Experiment"])
    assert rows == {"demo · helpers_custom_model:tiny_classifier", "demo · tiny"}


# ---------------------------------------------------------------- the reporter's own defaults


def test_report_of_a_subfolder_writes_its_own_report_and_reads_its_own_bench(results, tmp_path):
    root, _, _ = results
    copy = tmp_path / "results" / "runs"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("report"))
    bench = tmp_path / "results" / "bench"
    bench.mkdir()
    (bench / "x.json").write_text("{not json")
    whole = cli.main([str(copy), "--quiet", "--no-plots"])
    part = cli.main([str(copy / "demo"), "--quiet", "--no-plots"])
    assert whole == part == 0
    assert (tmp_path / "results" / "report" / "report.md").exists()
    assert (copy / "demo" / "report" / "report.md").exists()
    # the runs folder's bench/ is read for results/runs; demo/ has none of its own
    assert "x.json" in (tmp_path / "results" / "report" / "report.md").read_text()
    assert "x.json" not in (copy / "demo" / "report" / "report.md").read_text()


def test_an_empty_folder_and_an_unwritable_out_are_refused(results, tmp_path, capsys):
    root, _, _ = results
    (tmp_path / "empty" / "golden").mkdir(parents=True)  # folders, but no run.json
    assert cli.main([str(tmp_path / "empty")]) == 2
    assert "no run.json in it" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "report").exists()
    (tmp_path / "afile").write_text("")
    assert cli.main([str(root), "--out", str(tmp_path / "afile"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "choose a writable folder with --out DIR" in err


def test_repository_bench_records_stay_out_of_users_reports():
    assert not list((ROOT / "results").glob("bench/*.json"))
    assert list((ROOT / "docs" / "bench").glob("*.json"))


# ---------------------------------------------------------------- the README, run as written


def readme_block(heading: str) -> list[str]:
    """The commands of the first bash block under a README heading, continuation lines joined,
    comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        line = line.split("  #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        current += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def _console_script_shims(tmp_path: Path) -> str:
    """A folder with the console scripts pyproject.toml declares but this environment may not
    have installed yet (an editable install made before they were added), run as modules."""
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, module in (("mpt-advise", "mpt_repro.advise"),):
        script = shims / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        script.chmod(0o755)
    return str(shims)


@pytest.mark.slow
def test_readme_custom_model_commands_run_as_written(tmp_path):
    """Every command of "What does mixed precision do to my model?", with a mypkg.nets:make_net
    of the shape the README describes, at budget=smoke (not short) and seeds 0,1 (not 0,1,2) to
    stay fast."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(
        "from torch import nn\n\n"
        "def make_net(num_classes, in_channels=3):\n"
        "    return nn.Sequential(\n"
        "        nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),\n"
        "        nn.Flatten(), nn.Linear(4, num_classes))\n"
    )
    commands = readme_block("What does mixed precision do to my model?")
    assert [c.split()[0] for c in commands] == ["mpt-advise", "mpt-run", "mpt-run", "mpt-report"]
    # mypkg on the path, before whatever the caller's path has (a checkout under test)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}
    bindir = str(Path(MPT_RUN).parent)
    env["PATH"] = os.pathsep.join([bindir, _console_script_shims(tmp_path), env["PATH"]])
    for command in commands:
        if command.startswith(("mpt-run", "mpt-advise")):
            command = command.replace("seed=0,1,2", "seed=0,1").replace("budget=short", "")
            command += " budget=smoke trainer.progress=false trainer.device=cpu"
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    study = tmp_path / "results" / "runs" / "demo-mypkg.nets:make_net"
    records = [json.loads(p.read_text()) for p in study.rglob("run.json")]
    assert len(records) == 12 and {r["status"] for r in records} == {"completed"}
    (advised,) = study.glob("fp32-smoke/seed0/*trainer.max_steps=300/advice/advice.json")
    assert json.loads(advised.read_text())["static_scale"]["advised"] is not None
    assert any(r["config"]["telemetry"]["enabled"] for r in records)
    verdicts = pd.read_csv(study / "report" / "deltas.csv")
    assert set(verdicts["preset"]) == {"amp", "mixed", "bf16", "fp8_hybrid_emulated"}
    assert (verdicts["seeds_paired"] == 2).all()
    report = (study / "report" / "report.md").read_text()
    assert "demo · mypkg.nets:make_net" in report and "duplicate" in report.lower()


def test_a_preset_with_changed_knobs_is_its_own_column(results, tmp_path):
    """`precision=mixed precision.init_scale=1024` is another recipe than mixed: never averaged
    with mixed's seeds, named by the knob that differs, and mixed's Δ stays mixed's."""
    root, _, records = results
    copy = tmp_path / "runs"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("report"))
    run_cli(*SMOKE, "precision=mixed", "precision.init_scale=1024", f"paths.runs_dir={copy}")
    out = tmp_path / "report"
    assert cli.main([str(copy), "--out", str(out), "--quiet", "--no-plots"]) == 0
    lr = records["fp32", 0]["config"]["optim"]["lr"]
    demo = table(out, "classification_smoke_digits").set_index("Experiment")
    row = demo.loc[f"demo [optim.lr={lr}, trainer.diverge_patience=10]"]
    assert row["mixed"].endswith("(n=3)")  # the three seeds of the preset as defined
    assert row["mixed [precision.init_scale=1024.0]"].endswith("(n=1)")
    deltas = pd.read_csv(out / "deltas.csv")
    assert set(deltas["preset"]) >= {"mixed", "mixed [precision.init_scale=1024.0]"}


def test_a_run_that_skipped_every_step_is_flagged_and_gets_no_verdict(results, tmp_path):
    """A static scale of 2^20 overflows FP16 at every step: the runs complete with the untrained
    model's accuracy. Every view says so (cell, runs.csv, problems, closing block) and the Δ to
    fp32 carries no verdict, since it compares a model that never stepped."""
    from mpt_repro.runlog.closing import closing_block

    root, _, _ = results
    copy = tmp_path / "runs"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("report"))
    knobs = ["precision=mixed", "precision.loss_scaling=static", "precision.static_scale=1048576"]
    # through mpt-run, which records the overrides that tell this recipe from the preset's own
    sweep = run_cli("-m", *SMOKE, *knobs, "seed=0,1", f"paths.runs_dir={copy}")
    assert sweep.stdout.count("NO STEP        all 6 optimizer steps were skipped") == 2
    found = [p.parent for p in copy.rglob("run.json") if "static_scale" in str(p)]
    assert len(found) == 2
    for run_dir in found:
        record = read_run(run_dir)
        assert record["status"] == "completed" and record["skipped_steps"] == record["steps"] == 6
        text, warn = closing_block(record, run_dir)
        assert warn and "NO STEP        all 6 optimizer steps were skipped" in text
    out = tmp_path / "report"
    assert cli.main([str(copy), "--out", str(out), "--quiet", "--no-plots"]) == 0
    column = "mixed [precision.loss_scaling=static, precision.static_scale=1048576.0]"
    deltas = pd.read_csv(out / "deltas.csv").set_index("preset")
    assert deltas.loc[column, "verdict"] == "no verdict: 2 of 2 paired seeds applied no step"
    # mixed's own comparison is untouched by the variant's runs
    assert deltas.loc["mixed", "seeds_paired"] == 3 and "applied no step" not in str(
        deltas.loc["mixed", "verdict"]
    )
    demo = table(out, "classification_smoke_digits").set_index("Experiment")
    assert [c for c in demo.iloc[:, :].stack() if "2 of 2 applied no step" in c]
    runs = pd.read_csv(out / "runs.csv")
    static = runs[runs["outcome"].str.contains("no step applied", na=False)]
    assert len(static) == 2 and set(static["outcome"]) == {
        "completed, no step applied (all 6 skipped)"
    }
    problems = pd.read_csv(out / "problems.csv")
    assert (problems["reason"].str.contains("all 6 optimizer steps were skipped")).sum() == 2
    # and the plots say it where the variant's curves are drawn (its group, from the records)
    from mpt_repro.report.collect import load_runs
    from mpt_repro.report.plots import (
        NO_STEP_NOTE,
        curves_figure,
        group_curves,
        loss_scale_figure,
        preset_styles,
    )

    frame, _ = load_runs(copy)
    group = frame[frame["comparison"] == frame[frame["untrained"] == True]["comparison"].iloc[0]]  # noqa: E712
    curves = group_curves(group, [])
    assert list(curves.notes.values()) == [NO_STEP_NOTE]
    fig = curves_figure(curves.train, curves.evals, {}, "top1", "t", notes=curves.notes)
    for ax in fig.axes[:2]:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert sum(NO_STEP_NOTE in label for label in labels) == 1, labels
    fig = loss_scale_figure(curves, preset_styles(list(curves.train)), "t")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sum(NO_STEP_NOTE in label for label in labels) == 1, labels


def test_a_seed_that_ended_with_a_non_finite_metric_makes_the_verdict_worse(results, tmp_path):
    """mixed seed 1's record rewritten with top1 NaN (what a completed run whose evaluation
    overflowed records): the finite pairs alone would read "no verdict"; the verdict names the
    NaN seed instead, and deltas.csv counts it."""
    root, _, _ = results
    copy = tmp_path / "runs"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("report"))
    record_path = runs_dir(copy, "mixed", 1) / "run.json"
    record = json.loads(record_path.read_text())
    record["metrics"]["top1"] = float("nan")
    record_path.write_text(json.dumps(record))
    out = tmp_path / "report"
    assert cli.main([str(copy), "--out", str(out), "--quiet", "--no-plots"]) == 0
    deltas = pd.read_csv(out / "deltas.csv")
    [mixed] = deltas[(deltas["preset"] == "mixed") & (deltas["reference"] == "fp32")].itertuples()
    assert mixed.seeds_paired == 2 and mixed.seeds_nonfinite == 1
    assert mixed.verdict == "worse: 1 of 3 seeds ended with a non-finite top1"
    assert "group_label" in deltas.columns
