"""A plugin's report is its own (issue 48): the documented toy regression, written out of tree
and run through the real mpt-run (2 presets x 2 seeds in one multirun, budget=smoke), reported
by the real mpt-report without the paper's tables or claims, its tolerance printed with three
significant digits at most and where it comes from; a report of the paper's experiments still
has Table 1 (now the classification plugin's) and their claims; the advice check judges the
toy's runs by comparison.yaml's tolerance, in the metric's own direction."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from test_plugins import doc_files, run_in
from test_report import rec, write_run

from mpt_repro.report import cli

PLUGIN = "PYTHONPATH=$PWD MPT_PLUGINS=toyreg"
TABLE1 = "mpt_repro.experiments._classification_tables:table1"  # the classification plugin's
PAPER_TITLES = ("Table 1:", "Table 2", "Table 3", "qualitative claims", "Values marked `paper`")


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """The doc's toy plugin in a folder of its own, and its runs: one multirun of fp32 and
    mixed over two seeds at the smoke budget."""
    folder = tmp_path_factory.mktemp("own_report")
    for name, text in doc_files().items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    sweep = "mpt-run -m experiment=toyreg precision=fp32,mixed seed=0,1 budget=smoke"
    done = run_in(folder, f"{PLUGIN} {sweep}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(folder.glob("results/runs/toyreg/*/seed*/run.json"))) == 4
    return folder


def report_of(folder: Path, out: str, *options: str) -> str:
    """mpt-report on the toy's runs, as a user runs it, without plots; report.md's text."""
    command = f"{PLUGIN} mpt-report results/runs --out {out} --no-plots --quiet {' '.join(options)}"
    done = run_in(folder, command)
    assert done.returncode == 0, done.stderr[-3000:]
    return (folder / out / "report.md").read_text()


def significant_digits(number: str) -> int:
    """'0.00951' -> 3, '1.5' -> 2: the digits after any leading zeros."""
    mantissa = number.split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa)


def test_a_plugins_report_shows_no_paper_table_and_no_claims(toy: Path) -> None:
    report = report_of(toy, "report")
    assert "Toy regression: mean squared error per preset" in report  # the plugin's own table
    for title in PAPER_TITLES:
        assert title not in report, title
    written = {p.stem for p in (toy / "report" / "tables").glob("*.csv")}
    assert written and not {s for s in written if s.startswith(("table", "claims"))}, written


def test_its_tolerance_prints_with_its_source_and_three_digits(toy: Path) -> None:
    report = report_of(toy, "report_tol")
    fp32 = [
        json.loads(p.read_text())["metrics"]["mse"]
        for p in toy.glob("results/runs/toyreg/fp32-smoke/seed*/run.json")
    ]
    line = re.search(r"^- Tolerances: (.*)$", report, re.M).group(1)
    said = re.fullmatch(
        r"mse ±([0-9.e+-]+) \(2% of the fp32 mean ([0-9.e+-]+); "
        r"comparison\.yaml's default for any metric\)\.",
        line,
    )
    assert said, line
    tolerance, mean = said.groups()
    assert significant_digits(tolerance) <= 3 and significant_digits(mean) <= 3
    # comparison.yaml's default (2%) of the fp32 runs' mean, rounded to what is printed
    assert float(tolerance) == pytest.approx(0.02 * sum(fp32) / len(fp32), rel=5e-3)
    assert f"| ±{tolerance} (2% of the fp32 mean {mean}) |" in report  # the verdicts' table

    # a tolerance given on the command line says so, with the digits it is shown to
    report = report_of(toy, "report_given", "--tolerance", "mse=0.0123456")
    assert "- Tolerances: mse ±0.0123 (--tolerance mse=0.0123456)." in report


def test_a_report_of_the_papers_experiments_keeps_table_1_and_their_claims(tmp_path) -> None:
    """Real records moved to resnet50 (a Table 1 network) and to the speech task: Table 1 (the
    classification plugin's) and Table 3 beside them, the claims about the ILSVRC networks, none
    about an experiment without runs here."""
    runs = tmp_path / "runs"
    for seed, (fp32, mixed) in enumerate(((75.0, 75.5), (76.0, 75.8))):
        write_run(runs, rec("resnet50", "fp32", seed, metrics={"top1": fp32, "loss": 1.0}))
        write_run(runs, rec("resnet50", "mixed", seed, metrics={"top1": mixed, "loss": 1.0}))
    speech = dict(task="speech", data="librispeech")
    write_run(runs, rec("speech", "fp32", 0, metrics={"cer": 10.0, "wer": 30.0}, **speech))
    out = tmp_path / "report"
    assert cli.main([str(runs), "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = (out / "report.md").read_text()
    assert "Table 1: ILSVRC12 classification, top-1 accuracy (%)" in report
    table1 = (out / "tables" / "table1_smoke_synthetic_cpu-x86_64-2.md").read_text()
    # the paper's values beside ours (means over the two seeds)
    ours = "| 75.92 | 76.04 | 75.50 ± 0.71 (n=2) | 75.65 ± 0.21 (n=2) |"
    assert f"| ResNet-50 (pre-activation) {ours}" in table1, table1
    assert "Paper Table 3: speech recognition" in report  # the speech plugin's, beside its run
    assert "Table 2" not in report  # no detection run
    claims = (out / "tables" / "claims_paper.md").read_text()
    assert "no loss scaling needed" in claims  # about the ILSVRC networks
    assert "diverges after ~300K iterations" not in claims  # lstm_lm: no run here
    assert "Values marked `paper`" in report


def test_table_1_is_shown_once_whether_or_not_the_plugin_names_it(tmp_path, monkeypatch) -> None:
    """Table 1 is built by mpt_repro/experiments/_classification_tables.py: the report calls it
    as the classification plugin's paper_table, or by itself until the plugin names it; never
    twice (the toy's report above has none)."""
    from mpt_repro import registry
    from mpt_repro.report.aggregate import aggregate
    from mpt_repro.report.collect import load_runs
    from mpt_repro.report.tables import all_tables

    runs_dir = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs_dir, rec("resnet50", "fp32", seed, metrics={"top1": 75.0 + seed}))
    runs, _ = load_runs(runs_dir)
    agg = aggregate(runs)
    unnamed = [t.title for t in all_tables(agg, runs)]
    named = replace(registry.report_of("classification"), paper_table=TABLE1)
    monkeypatch.setitem(registry.REPORTS, "classification", named)
    for titles in (unnamed, [t.title for t in all_tables(agg, runs)]):
        assert sum(title.startswith("Table 1:") for title in titles) == 1, titles


def test_the_advice_check_judges_a_plugins_runs_by_comparison_yaml(toy: Path) -> None:
    """mse is lower-is-better: a run close to FP32 may be better by any amount, worse by at most
    comparison.yaml's tolerance (2% of the FP32 value here, the default for any metric)."""
    from mpt_repro.advise.check import outcome

    runs = toy / "results" / "runs" / "toyreg"
    fp32_dir, mixed_dir = runs / "fp32-smoke" / "seed0", runs / "mixed-smoke" / "seed0"
    fp32 = json.loads((fp32_dir / "run.json").read_text())
    found = outcome("dynamic", mixed_dir, fp32, fp32_dir)
    assert (found.metric, found.higher_is_better) == ("mse", False)
    assert found.tolerance == pytest.approx(0.02 * fp32["metrics"]["mse"])
    ref, tol = found.reference, found.tolerance
    assert replace(found, value=ref + 0.9 * tol).close_to_fp32
    assert not replace(found, value=ref + 1.1 * tol).close_to_fp32
    assert replace(found, value=ref / 10).close_to_fp32  # better: lower
