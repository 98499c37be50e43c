"""The report's verdicts have the power they claim (issue 41): an interval whose coverage is
measured on data with a known truth, spread judged against the evaluation set's floor, runs
identical on every item said so, and an items file that does not match its record refused.

Records are the real completed demo run's (tests/test_report_records.py) with the per-image
results chosen here (tests/test_report_intervals.py's write_run: the calls trainer.py makes).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_report_intervals import flips, mixed_delta, write_run

from mpt_repro.evidence import ITEMS_FILE, read_items, write_items
from mpt_repro.report import cli
from mpt_repro.report.simulate import SCENARIOS, run_cell


@pytest.fixture(scope="module")
def per_item_cells():
    """The simulation's hardest scenario (the preset changes particular images), 5 seeds, at a
    true difference of 0 and of 1.5 x the tolerance: 300 replications each (the full table,
    2,000 a cell over every scenario: scripts/verdict_coverage.py and docs/report.md)."""
    scenario = SCENARIOS[1]
    return {
        delta: run_cell(scenario, 5, delta, 1.0, reps=300, resamples=300) for delta in (0.0, 1.5)
    }


def test_the_interval_covers_what_it_states_on_data_with_a_known_truth(per_item_cells):
    """Coverage of the 95 % interval within the binomial band of 300 replications (±3 SE), and
    the interval's variance estimate about the true variance of d̄; the estimator it replaced
    (the shared-draw bootstrap added to the seeds' s²/n) counts the seed × item part twice and
    fails the same check."""
    cell = per_item_cells[0.0]
    assert 91.0 <= 100 * cell.covered / cell.reps <= 98.8, cell.row()
    assert 0.75 <= cell.variance_ratio <= 1.3, cell.row()
    assert cell.double_counted_ratio >= 1.3 * cell.variance_ratio, cell.double_counted_ratio


def test_false_verdicts_stay_within_their_levels(per_item_cells):
    """At Δ = 0 "worse"/"better" (the interval wholly past ±X) stays under 5 %; at Δ = 1.5 X,
    "matches" (a TOST at 2.5 % per side) stays under 2.5 % (+ the binomial slack of 300)."""
    null, far = per_item_cells[0.0], per_item_cells[1.5]
    assert null.worse_or_better / null.reps <= 0.05, null.row()
    assert far.matches / far.reps <= 0.045, far.row()
    assert far.delta == pytest.approx(1.5, abs=1e-6)
    assert null.matches > 0  # "matches" is reachable when it is true


def test_a_spread_of_rounding_error_is_judged_against_the_items_floor(tmp_path):
    """mixed wins exactly 2 images on every seed (other images each time) while fp32 differs
    between seeds: the differences agree to rounding (a spread of ~1e-15, which an exact
    `sd == 0` once let through to "matches"). Each seed's difference alone varies with its
    images by far more, so the seeds cannot be changing the run: no verdict, saying so."""
    rng = np.random.default_rng(11)
    for seed in range(3):
        fp32 = (rng.random(2000) < 0.9).astype(float)
        wrong = np.flatnonzero(fp32 == 0)[:2]
        write_run(tmp_path, "fp32", seed, fp32)
        write_run(tmp_path, "mixed", seed, flips(2000, list(wrong), fp32))
    d = mixed_delta(tmp_path)
    assert d.decision == "no verdict", d.verdict
    assert "vary less than their evaluation set alone makes each seed's vary" in d.verdict
    assert "check that the seed changes the runs" in d.verdict


def test_runs_identical_on_every_item_say_the_preset_changes_nothing(tmp_path):
    rng = np.random.default_rng(12)
    for seed in range(3):
        fp32 = (rng.random(360) < 0.97).astype(float)
        write_run(tmp_path, "fp32", seed, fp32)
        write_run(tmp_path, "mixed", seed, fp32)
    d = mixed_delta(tmp_path)
    assert d.decision == "identical"
    assert d.verdict == (
        "identical to FP32 on every item on this device (the preset changes nothing here)"
    )


def test_an_items_file_of_another_size_than_its_record_gives_no_verdict(tmp_path):
    """eval_items.npz tiled 100 times keeps every ratio (so the recomputed top-1 agrees), but
    not the count run.json records: no verdict, naming the file and both counts, and the report
    never prints the tiled count."""
    rng = np.random.default_rng(13)
    for seed in range(3):
        fp32 = (rng.random(64) < 0.9).astype(float)
        write_run(tmp_path / "runs", "fp32", seed, fp32)
        run_dir = write_run(tmp_path / "runs", "mixed", seed, flips(64, [seed, 9], fp32))
    step, columns = read_items(run_dir / ITEMS_FILE)
    write_items(run_dir / ITEMS_FILE, {k: np.tile(v, 100) for k, v in columns.items()}, step)
    d = mixed_delta(tmp_path / "runs")
    assert d.decision == "no verdict"
    assert f"{run_dir / ITEMS_FILE} does not hold the evaluation run.json records" in d.verdict
    assert "it holds 6,400 items, the record 64" in d.verdict
    out = tmp_path / "r"
    assert cli.main([str(tmp_path / "runs"), "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert "6,400 images" not in (out / "report.md").read_text()


def test_differences_that_overflow_give_no_verdict_not_a_traceback():
    """A metric near 1e308 (the report keeps such records out first: test_bad_input_round5.py);
    compare itself says so rather than raising OverflowError."""
    import math

    from mpt_repro.report.compare import Delta, interval, verdict

    d = Delta("mixed", "top1", True, 3, 1e308, None, None, 1.5, 0, 3, "", sd=math.inf)
    d.low, d.high = interval(d)
    assert verdict(d) == (
        "no verdict: the paired differences overflow (a metric near the float range's end)"
    )
