"""The paper's claims as tests stated before they run, and the verdict the runs give each.

Each file of conf/claims/ states one test of one or more claims of paper_reference.csv (its
`keys`): the runs it needs (experiment, budget, overrides, presets, seeds), and what is compared
and expected, with the tolerance or threshold. The verdict is computed from that, never chosen
after looking:

- reproduced: every test came out as stated;
- not reproduced: a test came out the other way (a finding, reported with its evidence);
- inconclusive: the evidence cannot decide (the report's own "no verdict" rules: fewer than 3
  seeds, no spread, an interval wider than the question), with the reason;
- not testable here: the claim needs what this machine does not have (the reason is stated in the
  file).

A test is either
- `delta`: a preset's primary metric against the reference preset's, paired by seed, with the
  interval and verdict of mpt-report (mpt_repro/report/compare.py) at the stated tolerance, or
- `figure`: a number each run records (a telemetry fraction under `diagnostics`, or the spread
  of a metric over seeds), its mean over seeds with a Student t interval, against a threshold (a
  number, or another figure of the same runs).

A claim shown on a task built so that the mechanism appears (`setting: constructed`) is labelled
"mechanism shown on a constructed task", apart from results on real data. docs/claims.md is the
table of one full run (`make reproduce-claims`); mpt-report adds the same table when the runs
are present.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mpt_repro.catalog import conf_dir
from mpt_repro.identity import recipe_changes

VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable here")
SETTINGS = {
    "real": "real data",
    "constructed": "mechanism shown on a constructed task",
    "untestable": "not testable here",
}


@dataclass(frozen=True)
class Runs:
    """The runs a claim needs: one sweep of presets x seeds."""

    experiment: str
    budget: str
    presets: tuple[str, ...]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    # the presets that record telemetry (telemetry=diagnostic changes nothing trained), sampled
    # every `telemetry_every` steps
    telemetry: tuple[str, ...] = ()
    telemetry_every: int = 100

    def sweeps(self) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """(presets, extra overrides) of each sweep: the presets with telemetry in one, the
        others in another (a preset's seeds all the same way)."""
        plain = tuple(p for p in self.presets if p not in self.telemetry)
        seen = tuple(p for p in self.presets if p in self.telemetry)
        watch = ("telemetry=diagnostic", f"telemetry.every={self.telemetry_every}")
        return [(ps, extra) for ps, extra in ((plain, ()), (seen, watch)) if ps]

    @property
    def changes(self) -> str:
        """The overrides as the reporter's `recipe_changes` column holds them."""
        return ", ".join(recipe_changes(self.overrides))


@dataclass(frozen=True)
class Test:
    kind: str  # delta | figure
    preset: str
    expect: str  # delta: matches | worse | better; figure: above | below
    reference: str = "fp32"
    tolerance: str = ""  # delta: in the metric's unit ("2", or "2%" of the reference's mean)
    figure: str = ""  # figure: a path under the record ("diagnostics.telemetry.network...")
    threshold: float | str = 0.0  # figure: a number, or another figure's path
    scale: float = 1.0  # figure: shown multiplied by this (100: a percentage)
    unit: str = ""  # figure: shown after the number
    label: str = ""  # figure: what it is, in words


@dataclass(frozen=True)
class Claim:
    name: str  # the file's stem
    keys: tuple[str, ...]  # rows of paper_reference.csv
    statement: str
    section: str
    setting: str  # real | constructed | untestable
    why: str = ""  # untestable: the reason; otherwise what the stand-in is
    runs: Runs | None = None
    tests: tuple[Test, ...] = ()


@dataclass
class Finding:
    claim: Claim
    verdict: str
    reason: str
    evidence: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    wall_time_s: float | None = None


def load_claims(folder: Path | None = None) -> list[Claim]:
    """Every claim file, in file-name order. ValueError names a file that does not parse."""
    from omegaconf import OmegaConf

    found = []
    for path in sorted((folder or conf_dir() / "claims").glob("*.yaml")):
        raw = OmegaConf.to_container(OmegaConf.load(path))
        try:
            found.append(_claim(path.stem, raw))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: {type(err).__name__}: {err}") from None
    return found


def _claim(name: str, raw: dict) -> Claim:
    runs = raw.get("runs")
    setting = str(raw["setting"])
    if setting not in SETTINGS:
        raise ValueError(f"setting {setting!r}: one of {', '.join(SETTINGS)}")
    tests = tuple(Test(**t) for t in raw.get("tests") or [])
    for t in tests:
        if (t.kind, t.expect) not in {
            *(("delta", e) for e in ("matches", "worse", "better")),
            *(("figure", e) for e in ("above", "below")),
        }:
            raise ValueError(f"test {t.kind!r} cannot expect {t.expect!r}")
    claim = Claim(
        name=name,
        keys=tuple(raw["keys"]),
        statement=str(raw["statement"]),
        section=str(raw["section"]),
        setting=setting,
        why=str(raw.get("why") or ""),
        runs=None if runs is None else _runs(runs),
        tests=tests,
    )
    if setting != "untestable" and (claim.runs is None or not tests):
        raise ValueError("a testable claim needs `runs` and `tests`")
    return claim


def _runs(raw: dict) -> Runs:
    return Runs(
        experiment=str(raw["experiment"]),
        budget=str(raw["budget"]),
        presets=tuple(raw["presets"]),
        seeds=tuple(int(s) for s in raw["seeds"]),
        overrides=tuple(str(o) for o in raw.get("overrides") or ()),
        telemetry=tuple(raw.get("telemetry") or ()),
        telemetry_every=int(raw.get("telemetry_every", 100)),
    )


# -- judging -------------------------------------------------------------------------------
def judge(claim: Claim, runs: pd.DataFrame) -> Finding:
    """The claim's verdict from the runs (mpt_repro.report.collect.load_runs's table), by its
    stated tests."""
    if claim.setting == "untestable":
        return Finding(claim, "not testable here", claim.why)
    mine = matching_runs(claim.runs, runs)
    if mine.empty:
        return Finding(claim, "inconclusive", "none of its runs are in this results folder")
    outcomes = [_judge_test(t, mine) for t in claim.tests]
    verdicts = [v for v, _, _ in outcomes]
    verdict = (
        "reproduced"
        if all(v == "reproduced" for v in verdicts)
        else "not reproduced"
        if "not reproduced" in verdicts
        else "inconclusive"
    )
    wall = pd.to_numeric(mine.get("wall_time_s"), errors="coerce").sum(min_count=1)
    return Finding(
        claim,
        verdict,
        "; ".join(reason for _, reason, _ in outcomes),
        [text for _, _, text in outcomes],
        sorted({int(s) for s in mine["seed"]}),
        None if pd.isna(wall) else float(wall),
    )


def matching_runs(spec: Runs, runs: pd.DataFrame) -> pd.DataFrame:
    """The tabulated runs of `spec`: its experiment, budget, recipe changes, presets and seeds."""
    if runs.empty:
        return runs
    changes = runs["recipe_changes"] if "recipe_changes" in runs else ""
    keep = (
        (runs["experiment"] == spec.experiment)
        & (runs["budget"] == spec.budget)
        & (changes == spec.changes)
        & runs["precision"].isin(spec.presets)
        & runs["seed"].isin(spec.seeds)
        & (runs["subject"] == runs["experiment"])  # the experiment's own model
    )
    return runs[keep]


def _judge_test(test: Test, runs: pd.DataFrame) -> tuple[str, str, str]:
    """(verdict, reason, evidence text) of one test."""
    return _judge_delta(test, runs) if test.kind == "delta" else _judge_figure(test, runs)


def _judge_delta(test: Test, runs: pd.DataFrame) -> tuple[str, str, str]:
    from dataclasses import replace

    from mpt_repro.report.compare import default_settings, delta_text, paired_delta

    mine, ref = runs[runs["precision"] == test.preset], runs[runs["precision"] == test.reference]
    if mine.empty or ref.empty:
        missing = test.preset if mine.empty else test.reference
        return "inconclusive", f"no {missing} run", ""
    metric = str(mine["primary_metric"].dropna().iloc[0])
    settings = replace(default_settings(), reference=test.reference)
    settings = replace(settings, tolerance={**settings.tolerance, metric: test.tolerance})
    d = paired_delta(mine, ref, settings)
    said = f"{test.preset} − {test.reference} {metric}: {delta_text(d, 3)} → {d.verdict}"
    expected = {"matches": "matches", "worse": "worse", "better": "better"}[test.expect]
    tol = test.tolerance + ("" if test.tolerance.endswith("%") else " " + metric)
    if d.tolerance is not None and test.tolerance.endswith("%"):
        tol += f", ±{d.tolerance:.3g}"
    stated = f"expected {test.preset} to {_expect_words(test.expect)} {test.reference} (±{tol})"
    if d.verdict.startswith(expected):
        return "reproduced", f"{stated}: it does", said
    if d.verdict.startswith(("matches", "better", "worse")):
        return "not reproduced", f"{stated}: {d.verdict}", said
    return "inconclusive", f"{stated}: {d.verdict}", said


def _expect_words(expect: str) -> str:
    return {"matches": "match", "worse": "be worse than", "better": "be better than"}[expect]


def _judge_figure(test: Test, runs: pd.DataFrame) -> tuple[str, str, str]:
    """A recorded figure over seeds (mean, Student t interval) against its threshold; a figure
    threshold is compared seed by seed (the difference's interval against 0)."""
    from mpt_repro.report.compare import MIN_SEEDS, t_quantile

    mine = runs[runs["precision"] == test.preset].sort_values("seed")
    values, against = [], []
    for _, row in mine.iterrows():
        record = _record(row["path"])
        values.append(_figure(record, row, test.figure, runs))
        if isinstance(test.threshold, str):
            against.append(_figure(record, row, test.threshold, runs))
    pairs = [
        (v, a if isinstance(test.threshold, str) else float(test.threshold))
        for v, a in zip(values, against or [None] * len(values))
        if v is not None and (a is not None or not isinstance(test.threshold, str))
    ]
    name = test.label or test.figure
    if not pairs:
        return "inconclusive", f"no {test.preset} run records {name}", ""
    diffs = [v - a for v, a in pairs]
    n, mean = len(diffs), sum(diffs) / len(diffs)
    shown = _figure_text(test, [v for v, _ in pairs], [a for _, a in pairs])
    if n < MIN_SEEDS:
        return "inconclusive", f"{name}: {n} seed(s); a verdict needs at least {MIN_SEEDS}", shown
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    above = test.expect == "above"
    stated = f"{name}: expected {test.expect} {_threshold_words(test)}"
    if (low > 0) if above else (high < 0):
        return "reproduced", f"{stated}: it is", shown
    if (high < 0) if above else (low > 0):
        return "not reproduced", f"{stated}: it is not", shown
    return "inconclusive", f"{stated}: the interval over seeds straddles it", shown


def _threshold_words(test: Test) -> str:
    if isinstance(test.threshold, str):
        return test.threshold.rsplit(".", 2)[-2] if "." in test.threshold else test.threshold
    return f"{test.threshold * test.scale:g}{test.unit}"


def _figure_text(test: Test, values: list[float], against: list[float]) -> str:
    """`weight-gradient underflow (mixed): 1.23 % [0.91, 1.55] (n=3 seeds)`."""
    from mpt_repro.report.compare import t_quantile

    def stat(xs: list[float]) -> str:
        mean = sum(xs) / len(xs)
        text = f"{mean * test.scale:.3g}{test.unit}"
        if len(xs) >= 2:
            sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
            half = t_quantile(0.975, len(xs) - 1) * sd / math.sqrt(len(xs))
            text += f" [{(mean - half) * test.scale:.3g}, {(mean + half) * test.scale:.3g}]"
        return text

    if test.figure.startswith("spread:"):  # one number for the seeds together
        value = f"{values[0] * test.scale:.3g}{test.unit}"
        return f"{test.label} ({test.preset}): {value} over {len(values)} seeds"
    text = f"{test.label or test.figure} ({test.preset}): {stat(values)} (n={len(values)} seeds)"
    if isinstance(test.threshold, str):
        text += f"; against {stat(against)}"
    return text


def _record(path: str) -> dict:
    try:
        return json.loads((Path(path) / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def _figure(record: dict, row: pd.Series, path: str, runs: pd.DataFrame) -> float | None:
    """A number from a run: a dotted path into its record, or `spread:<metric>` (the sample
    standard deviation of the preset's final metric over the seeds)."""
    if path.startswith("spread:"):
        metric = f"metric_{path.removeprefix('spread:')}"
        same = runs[runs["precision"] == row["precision"]]
        values = pd.to_numeric(same.get(metric), errors="coerce").dropna()
        return float(values.std()) if len(values) >= 2 else None
    node: Any = record
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) and math.isfinite(node) else None


# -- the table -------------------------------------------------------------------------------
def findings(runs: pd.DataFrame, claims: list[Claim] | None = None) -> list[Finding]:
    """Every claim's finding, in the paper's order (by section)."""
    claims = claims if claims is not None else load_claims()
    return [judge(c, runs) for c in sorted(claims, key=lambda c: _section_order(c.section))]


def _section_order(section: str) -> tuple:
    """ "§3.1, Figure 2b" -> (3, 1, ...): claims in the order the paper makes them."""
    import re

    numbers = re.findall(r"\d+", section)
    return tuple(int(n) for n in numbers) or (99,)


def findings_frame(found: list[Finding]) -> pd.DataFrame:
    """One row per claim test: the claim and its section, the keys it tests, our verdict and its
    reason, the evidence, and the runs it rests on."""
    rows = []
    for f in found:
        c = f.claim
        runs = c.runs
        rows.append(
            {
                "Claim": c.statement,
                "Section": c.section,
                "Keys": _keys_text(c.keys),
                "Setting": SETTINGS[c.setting]
                + (f": {c.why}" if c.setting != "untestable" else ""),
                "Verdict": f.verdict,
                "Why": f.reason,
                "Evidence": "; ".join(e for e in f.evidence if e),
                "Runs": _runs_text(runs, f.seeds) if runs else "",
                "Wall time (s)": "" if f.wall_time_s is None else f"{f.wall_time_s:.0f}",
            }
        )
    return pd.DataFrame(rows)


def _keys_text(keys: tuple[str, ...]) -> str:
    return ", ".join(keys) if len(keys) <= 2 else f"{keys[0]} and {len(keys) - 1} more"


def _runs_text(runs: Runs, seeds: list[int]) -> str:
    extra = f" {' '.join(runs.overrides)}" if runs.overrides else ""
    shown = ",".join(map(str, seeds)) if seeds else "none found"
    return (
        f"experiment={runs.experiment} budget={runs.budget}{extra} "
        f"precision={','.join(runs.presets)}; seeds {shown}"
    )


CAPTION = (
    "Each test was stated in conf/claims/ before it ran; the verdict (reproduced, not "
    "reproduced, inconclusive, not testable here) is computed from the runs, with why."
)


def claims_table(runs: pd.DataFrame):
    """mpt-report's section: the claims whose runs are in the results folder (None when none
    are)."""
    from mpt_repro.report.tables import Table

    claims = [
        c for c in load_claims() if c.runs is not None and not matching_runs(c.runs, runs).empty
    ]
    if not claims:
        return None
    return Table(
        "claims",
        "The paper's claims, tested on these runs (conf/claims/)",
        CAPTION,
        findings_frame(findings(runs, claims)),
        [
            "A claim shown on a constructed task shows the mechanism, not the paper's result. "
            "`make reproduce-claims` runs every claim; docs/claims.md has one full run."
        ],
    )
