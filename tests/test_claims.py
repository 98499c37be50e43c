"""The paper's claims as tests stated in conf/claims/ (issue 32): every row of
paper_reference.csv has one, each gets a verdict computed from real run records, the runner
makes the runs a claim names, and mpt-report shows the claims whose runs it finds."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT
from test_report_intervals import flips, write_run

from mpt_repro import catalog
from mpt_repro.claims import findings, findings_frame, judge, load_claims
from mpt_repro.paper import load_reference
from mpt_repro.report import cli
from mpt_repro.report.collect import load_runs

SCRIPT = ROOT / "scripts" / "reproduce_claims.py"


def test_every_row_of_the_paper_reference_is_claimed_and_every_claim_names_real_things():
    claims = load_claims()
    covered = {k for c in claims for k in c.keys}
    assert set(load_reference()["key"]) == covered  # no row without a test, no unknown key
    experiments = set(catalog.experiments())
    for c in claims:
        assert c.statement and c.section.startswith("§"), c.name
        if c.setting == "untestable":
            assert c.why and c.runs is None and not c.tests, c.name
            continue
        assert c.runs.experiment in experiments, c.name
        assert set(c.runs.presets) <= set(catalog.presets()), c.name
        assert len(c.runs.seeds) >= 3, c.name  # as many seeds as a verdict needs
        for t in c.tests:
            assert t.preset in c.runs.presets, c.name


def test_with_no_runs_every_claim_gets_a_row_a_verdict_and_a_reason():
    empty, _ = load_runs(ROOT / "conf" / "claims")  # a folder without run records
    frame = findings_frame(findings(empty))
    assert len(frame) == len(load_claims())
    assert set(frame["Verdict"]) == {"inconclusive", "not testable here"}
    assert frame["Why"].str.len().min() > 10
    # in the paper's order: §3 before §4
    sections = list(frame["Section"])
    assert sections.index("§3.1, Figure 2a") < sections.index("§4.1")


def demo_claims(folder):
    """Three claims about the real demo record's runs (budget=smoke): one expected to match, one
    expected to be worse, one figure above a threshold."""
    runs = {"experiment": "demo", "budget": "smoke", "presets": ["fp32", "mixed"],
            "seeds": [0, 1, 2]}  # fmt: skip
    tests = {
        "matches": {"kind": "delta", "preset": "mixed", "expect": "matches", "tolerance": "1000"},
        "worse": {"kind": "delta", "preset": "mixed", "expect": "worse", "tolerance": "1000"},
        "steps": {
            "kind": "figure",
            "preset": "mixed",
            "figure": "steps",
            "expect": "above",
            "threshold": 1.5,
        },  # fmt: skip
    }
    for name, test in tests.items():
        claim = {"keys": ["claim.ilsvrc.no_scaling_needed"], "statement": name,
                 "section": "§4.1", "setting": "real", "runs": runs, "tests": [test]}  # fmt: skip
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(claim))


def test_verdicts_follow_the_stated_tests(tmp_path):
    """Real demo records (3 seeds, per-image results): a wide tolerance makes mixed match fp32,
    so `matches` is reproduced and `worse` is not; `steps` (recorded by every run) above 1.5."""
    rng = np.random.default_rng(4)
    for seed in range(3):
        fp32 = (rng.random(200) < 0.8).astype(float)
        write_run(tmp_path / "runs", "fp32", seed, fp32)
        write_run(tmp_path / "runs", "mixed", seed, flips(200, list(range(seed + 1)), fp32))
    (tmp_path / "claims").mkdir()
    demo_claims(tmp_path / "claims")
    runs, _ = load_runs(tmp_path / "runs")
    found = {c.name: judge(c, runs) for c in load_claims(tmp_path / "claims")}
    assert found["matches"].verdict == "reproduced", found["matches"].reason
    assert found["worse"].verdict == "not reproduced"
    assert "matches FP32 (CI within ±1000)" in found["worse"].reason
    assert found["steps"].verdict == "reproduced" and found["matches"].seeds == [0, 1, 2]
    assert "(n=3 seeds)" in found["steps"].evidence[0]


def test_mpt_report_shows_the_claims_whose_runs_it_finds(tmp_path):
    """Records of the claims' own demo runs (budget=short, no overrides): the report's section."""
    rng = np.random.default_rng(5)
    for seed in range(5):
        fp32 = (rng.random(200) < 0.9).astype(float)
        for preset, flip in (("fp32", []), ("mixed", [seed]), ("no_scaling", [seed, 7])):
            write_run(tmp_path / "runs", preset, seed, flips(200, flip, fp32), budget="short")
    out = tmp_path / "report"
    assert cli.main([str(tmp_path / "runs"), "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = (out / "report.md").read_text()
    assert "The paper's claims, tested on these runs" in report
    claims = pd.read_csv(next((out / "tables").glob("claims.csv")))
    row = claims[claims["Keys"] == "claim.ilsvrc.no_scaling_needed"].iloc[0]
    assert row["Verdict"] in ("reproduced", "not reproduced", "inconclusive")
    assert "no_scaling − fp32 top1" in row["Evidence"]


@pytest.mark.slow
def test_the_runner_makes_the_runs_of_the_claims_it_is_given(tmp_path):
    """`--tiny` (budget=smoke, seed 0) for two claims: the demo's two sweeps (telemetry for fp32
    and mixed only), then the table with a row and a reason each."""
    out = tmp_path / "claims"
    args = [sys.executable, str(SCRIPT), "--tiny", "--out", str(out),
            "--claims", "master_copy_ablation,dcgan"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("+ mpt-run -m experiment=demo budget=smoke") == 2
    table = pd.read_csv(out / "claims.csv")
    assert len(table) == 2 and set(table["Verdict"]) == {"inconclusive", "not testable here"}
    master = table[table["Keys"] == "claim.master_weights.ablation"].iloc[0]
    assert "1 seed(s); a verdict needs at least 3" in master["Why"]
    assert "share of weight updates FP16 weights would lose (mixed)" in master["Evidence"]
    made = {part for p in (out / "runs").rglob("run.json") for part in p.parts}
    assert {"fp32-smoke", "mixed-smoke", "no_scaling-smoke", "no_master-smoke"} <= made


def test_an_unknown_claim_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--claims", "nope", "--out", str(tmp_path)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "no claim nope in conf/claims/" in done.stderr


@pytest.mark.slow
def test_every_claim_runs_at_a_tiny_budget(tmp_path):
    out = tmp_path / "claims"
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    table = pd.read_csv(out / "claims.csv")
    assert len(table) == len(load_claims()) and table["Why"].notna().all()


def test_the_readme_s_make_reproduce_claims_runs_the_script(tmp_path):
    """README's `make reproduce-claims`, as make expands it, and its sweeps (a full run is about
    an hour: docs/claims.md is one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    made = subprocess.run(["make", "--no-print-directory", "-n", "reproduce-claims"], cwd=ROOT,
                          capture_output=True, text=True, check=True, env=env)  # fmt: skip
    assert made.stdout.splitlines()[-1].rstrip() == ".venv/bin/python scripts/reproduce_claims.py"
    assert "`make reproduce-claims`" in (ROOT / "README.md").read_text()
    plan = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    sweeps = [line for line in plan.splitlines() if line.startswith("+ mpt-run -m")]
    experiments = {c.runs.experiment for c in load_claims() if c.runs is not None}
    assert {s.split()[3].removeprefix("experiment=") for s in sweeps} == experiments
    assert not (tmp_path / "runs").exists()  # a dry run runs nothing
    plan = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    assert "paths.runs_dir=results/claims/runs\n" in plan  # as typed in the checkout (the page)
