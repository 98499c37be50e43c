"""The paper's claims as tests stated before they run, and the verdict the runs give each.

Each file of conf/claims/ states one test of one or more claims of paper_reference.csv (its
`keys`): the runs it needs (experiment, budget, overrides, presets, first seeds), the tests that
decide it, each with what would refute it and its tolerance with the reason for it, and the
sequential rule that adds seeds until the tests are decided (conf/claims/README.md). A file is
checked like a configuration (`load_claims`: an unknown key, a wrong type, a tolerance that is
not above 0, an unknown experiment, budget or preset is one ClaimsError naming the file and the
key). The verdict is computed from the runs, never chosen after looking:

- reproduced: every test came out as stated (all of them, not any);
- not reproduced: a test came out the other way (a finding, reported with its evidence);
- inconclusive: the evidence cannot decide yet (the interval still straddles the tolerance, or a
  problem with the runs), with the reason and the resolution reached;
- not testable at this scale: what the paper claims happens where this machine's runs cannot go
  (`setting: scale`, the reason stated), or a claim whose seeds stopped while a test's interval
  was still wider than its whole tolerance (`beyond_reach`); not testable here: the data or
  hardware are missing.

A test compares runs that differ in what the claim is about:

- `delta`: a preset's metric against the reference preset's, paired by seed: the primary or
  another evaluation metric with mpt-report's interval (mpt_repro/report/compare.py: the seeds'
  and the evaluation set's variation), or a training column (`train:<column>`, its mean over the
  second half of training, metrics.csv) with a paired Student t interval over the seeds. The
  difference is read against the claim's tolerance X: matches (interval inside ±X), worse or
  better (interval wholly past X on that side);
- `figure`: a number each run records (a telemetry share under `diagnostics`), the preset's
  runs against the `reference` preset's runs of the same seeds (paired differences), or
  against a number, with a Student t interval (n − 1 degrees of freedom);
- `spread`: the standard deviation of a metric over the preset's seeds, with its chi-square
  interval, against a threshold.

Seeds until decided (`Sequential`): the runner judges a claim after each look (3, then 5, then
8 seeds, by default) and adds seeds while a test is undecided and the claim's budget allows. Every
look's interval is at confidence 1 − α/K for K planned looks (Bonferroni alpha spending, a
conservative group-sequential design: Jennison & Turnbull 2000, "Group Sequential Methods with
Applications to Clinical Trials", §2.5 and ch. 7), so the chance that any look's interval misses
the truth, and so of a wrong decision at whatever look the runner stops, is at most α however
the stopping depends on the data.

A claim shown on a task built so that the mechanism appears (`setting: constructed`) is
labelled "mechanism shown on a constructed task", apart from results on real data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from mpt_repro.catalog import conf_dir
from mpt_repro.identity import recipe_changes

VERDICTS = (
    "reproduced",
    "not reproduced",
    "inconclusive",
    "not testable at this scale",
    "not testable here",
)
SETTINGS = {
    "real": "real data",
    "constructed": "mechanism shown on a constructed task",
    "scale": "not testable at this scale",
    "untestable": "not testable here",
}
UNTESTED = {"scale": "not testable at this scale", "untestable": "not testable here"}
KINDS = {"delta": ("matches", "worse", "better"), "figure": ("above", "below"),
         "spread": ("above", "below")}  # fmt: skip
TRAIN_PREFIX = "train:"  # a delta metric read from metrics.csv's training rows
TRAIN_TAIL = 0.5  # ... its mean over the logged windows of the second half of training


class ClaimsError(ValueError):
    """A claims file that is not as conf/claims/README.md states: the message names the file
    and the key, in one line."""


@dataclass(frozen=True)
class Sequential:
    """Seeds until decided: the looks (seed counts) at which the claim is judged, the error rate
    α, and the CPU minutes its runs are expected to take per seed set (shown on the page; it
    stops nothing: a stop that depended on time would stop at other looks on another machine).
    Every look's interval is at 1 − α/K (K = the planned looks)."""

    looks: tuple[int, ...] = (3, 5, 8)
    alpha: float = 0.05
    cpu_minutes: float = 30.0

    @property
    def confidence(self) -> float:
        return 1 - self.alpha / len(self.looks)

    def next_look(self, n_seeds: int) -> int | None:
        """The seed count of the next look after `n_seeds`, None when the looks are spent."""
        return next((k for k in self.looks if k > n_seeds), None)

    def text(self) -> str:
        looks = ", ".join(map(str, self.looks))
        return (
            f"judged at {looks} seeds, stopping at the first look that decides; each look's "
            f"interval at {100 * self.confidence:.4g} % (α = {self.alpha:g} spent evenly over "
            f"{len(self.looks)} looks); planned at about {self.cpu_minutes:g} CPU minutes a seed "
            "set, which stops nothing"
        )


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
    kind: str  # delta | figure | spread
    preset: str
    expect: str  # delta: matches | worse | better; figure, spread: above | below
    reference: str = ""  # delta: the preset compared with (fp32); figure: the other runs
    metric: str = ""  # delta: "" (the primary), an evaluation metric, or "train:<column>"
    tolerance: str = ""  # delta: in the metric's unit ("0.01", or "2%" of the reference's mean)
    reason: str = ""  # why this tolerance or threshold (the paper's differences, what matters)
    refuted_by: str = ""  # what result would refute it (default: said from the test)
    figure: str = ""  # figure: a dotted path in run.json; spread: a metric
    threshold: float = 0.0  # figure: the margin or value to pass; spread: the SD's
    scale: float = 1.0  # shown multiplied by this (100: a percentage)
    unit: str = ""  # shown after the number
    label: str = ""  # what it is, in words


@dataclass(frozen=True)
class Evidence:
    """A number shown beside the tests, not tested (a mechanism behind an outcome test)."""

    preset: str
    figure: str
    label: str = ""
    scale: float = 1.0
    unit: str = ""


@dataclass(frozen=True)
class Claim:
    name: str  # the file's stem
    keys: tuple[str, ...]  # rows of paper_reference.csv
    statement: str
    section: str
    setting: str  # real | constructed | scale | untestable
    why: str = ""  # scale, untestable: the reason; otherwise what the stand-in is
    runs: Runs | None = None
    tests: tuple[Test, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    sequential: Sequential = Sequential()
    amendment: str = ""  # a change to the rule after an earlier page, and its cost in error


@dataclass
class Outcome:
    """One test's result on one set of seeds."""

    verdict: str  # reproduced | not reproduced | inconclusive
    reason: str
    shown: str = ""  # the numbers: estimate, interval, seeds
    half_width: float | None = None  # the resolution reached (interval's half-width)
    n: int = 0
    tolerance: float | None = None  # a delta test's ±X, in the metric's unit


@dataclass
class Finding:
    claim: Claim
    verdict: str
    reason: str
    evidence: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    wall_time_s: float | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)  # the commits its runs were trained at

    @property
    def decided(self) -> bool:
        return self.verdict in ("reproduced", "not reproduced")


# -- reading and checking the files ---------------------------------------------------------
TOP_KEYS = {"keys": list, "statement": str, "section": str, "setting": str, "why": str,
            "runs": dict, "tests": list, "evidence": list, "sequential": dict,
            "amendment": str}  # fmt: skip
RUNS_KEYS = {"experiment": str, "budget": str, "presets": list, "seeds": list,
             "overrides": list, "telemetry": list, "telemetry_every": int}  # fmt: skip
TEST_KEYS = {"kind": str, "preset": str, "expect": str, "reference": str, "metric": str,
             "tolerance": (str, float), "reason": str, "refuted_by": str, "figure": str,
             "threshold": float, "scale": float, "unit": str, "label": str}  # fmt: skip
EVIDENCE_KEYS = {"preset": str, "figure": str, "label": str, "scale": float, "unit": str}
SEQUENTIAL_KEYS = {"looks": list, "alpha": float, "cpu_minutes": float}


def load_claims(folder: Path | None = None) -> list[Claim]:
    """Every claim file, in file-name order. ClaimsError names the file and key of the first
    that is not as conf/claims/README.md states."""
    from omegaconf import OmegaConf

    found = []
    for path in sorted((folder or conf_dir() / "claims").glob("*.yaml")):
        try:
            raw = OmegaConf.to_container(OmegaConf.load(path))
        except Exception as err:  # noqa: BLE001 - YAML's own errors, one line
            raise ClaimsError(f"{path}: not YAML: {str(err).splitlines()[0]}") from None
        try:
            found.append(_claim(path.stem, raw))
        except ClaimsError as err:
            raise ClaimsError(f"{path}: {err}") from None
    return found


def _fields(raw: Any, allowed: dict, where: str) -> dict:
    """`raw` checked against {key: type}: an unknown key or a wrong type is a ClaimsError naming
    `where.key`; ints pass as floats, and a number passes where a string-or-float is allowed."""
    if not isinstance(raw, dict):
        raise ClaimsError(f"{where or 'the file'}: expected a mapping, got {_kind(raw)}")
    out = {}
    for key, value in raw.items():
        name = f"{where}.{key}" if where else str(key)
        if key not in allowed:
            raise ClaimsError(f"{name}: unknown key (known: {', '.join(allowed)})")
        want = allowed[key] if isinstance(allowed[key], tuple) else (allowed[key],)
        ok = any(_is(value, t) for t in want)
        if not ok:
            words = " or ".join(_type_word(t) for t in want)
            raise ClaimsError(f"{name}: expected {words}, got {_kind(value)} {value!r}")
        out[key] = float(value) if float in want and not isinstance(value, str) else value
    return out


def _is(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _type_word(kind: type) -> str:
    return {str: "a string", float: "a number", int: "an integer", list: "a list",
            dict: "a mapping", bool: "true or false"}[kind]  # fmt: skip


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _claim(name: str, raw: Any) -> Claim:
    top = _fields(raw, TOP_KEYS, "")
    for key in ("keys", "statement", "section", "setting"):
        if key not in top:
            raise ClaimsError(f"{key}: missing")
    setting = top["setting"]
    if setting not in SETTINGS:
        raise ClaimsError(f"setting: {setting!r} is not one of {', '.join(SETTINGS)}")
    if not top["keys"] or not all(isinstance(k, str) for k in top["keys"]):
        raise ClaimsError("keys: expected a list of paper_reference.csv keys")
    runs = _runs(top["runs"]) if "runs" in top else None
    tests = tuple(_test(t, i, runs) for i, t in enumerate(top.get("tests") or []))
    evidence = tuple(_evidence(e, i, runs) for i, e in enumerate(top.get("evidence") or []))
    claim = Claim(name, tuple(top["keys"]), top["statement"], top["section"], setting,
                  top.get("why", ""), runs, tests, evidence,
                  _sequential(top.get("sequential") or {}),
                  top.get("amendment", ""))  # fmt: skip
    if setting in UNTESTED:
        if not claim.why or runs is not None or tests:
            raise ClaimsError(f"why: a claim {SETTINGS[setting]!r} states why, and no runs/tests")
    elif runs is None or not tests:
        raise ClaimsError(f"{'runs' if runs is None else 'tests'}: a testable claim needs both")
    return claim


def _runs(raw: Any) -> Runs:
    from mpt_repro import catalog

    got = _fields(raw, RUNS_KEYS, "runs")
    for key in ("experiment", "budget", "presets"):
        if key not in got:
            raise ClaimsError(f"runs.{key}: missing")
    _known("runs.experiment", got["experiment"], catalog.experiments())
    _known("runs.budget", got["budget"], catalog.budgets())
    presets = _strings("runs.presets", got["presets"])
    for p in presets:
        _known("runs.presets", p, catalog.presets())
    seeds = got.get("seeds", [])
    if not all(_is(s, int) and s >= 0 for s in seeds):
        raise ClaimsError(f"runs.seeds: expected a list of seeds (integers >= 0), got {seeds!r}")
    telemetry = _strings("runs.telemetry", got.get("telemetry", []))
    for p in telemetry:
        _known("runs.telemetry", p, presets)
    every = got.get("telemetry_every", 100)
    if every < 1:
        raise ClaimsError(f"runs.telemetry_every: expected an integer >= 1, got {every}")
    overrides = tuple(_strings("runs.overrides", got.get("overrides", [])))
    return Runs(got["experiment"], got["budget"], tuple(presets), tuple(seeds), overrides,
                tuple(telemetry), every)  # fmt: skip


def _strings(where: str, values: list) -> list[str]:
    if not all(isinstance(v, str) and v for v in values):
        raise ClaimsError(f"{where}: expected a list of names, got {values!r}")
    return list(values)


def _known(where: str, value: str, known: Any) -> None:
    if value not in known:
        shown = ", ".join(sorted(known))
        raise ClaimsError(f"{where}: unknown {value!r} (known: {shown})")


def _test(raw: Any, index: int, runs: Runs | None) -> Test:
    where = f"tests[{index}]"
    got = _fields(raw, TEST_KEYS, where)
    for key in ("kind", "preset", "expect"):
        if key not in got:
            raise ClaimsError(f"{where}.{key}: missing")
    kind, expect = got["kind"], got["expect"]
    if kind not in KINDS:
        raise ClaimsError(f"{where}.kind: {kind!r} is not one of {', '.join(KINDS)}")
    if expect not in KINDS[kind]:
        raise ClaimsError(f"{where}.expect: a {kind} test expects {' or '.join(KINDS[kind])}")
    if kind == "delta":
        got.setdefault("reference", "fp32")
        got["tolerance"] = _tolerance(f"{where}.tolerance", got.get("tolerance"))
    elif "tolerance" in got:
        raise ClaimsError(f"{where}.tolerance: a {kind} test has a threshold, not a tolerance")
    if kind != "delta" and not got.get("figure"):
        raise ClaimsError(f"{where}.figure: missing (what each run records)")
    if kind == "spread" and got.get("threshold", 0.0) <= 0:
        raise ClaimsError(f"{where}.threshold: a spread is tested against an SD above 0")
    for key in ("preset", "reference"):
        if runs is not None and got.get(key) and got[key] not in runs.presets:
            raise ClaimsError(f"{where}.{key}: {got[key]!r} is not among runs.presets")
    return Test(**got)


def _tolerance(where: str, value: Any) -> str:
    """A tolerance as mpt-report writes one ("0.01", "2%"); a number is taken as written. It
    must be above 0: a tolerance of 0 can never be met by an interval."""
    from mpt_repro.report.compare import parse_tolerance

    if value is None:
        raise ClaimsError(f"{where}: missing (in the metric's unit, or a percentage: '2%')")
    text = f"{value:g}" if isinstance(value, float) else str(value).strip()
    parsed = parse_tolerance(text)
    if parsed is None or parsed[0] <= 0:
        raise ClaimsError(f"{where}: expected a number above 0 or a percentage, got {value!r}")
    return text


def _evidence(raw: Any, index: int, runs: Runs | None) -> Evidence:
    where = f"evidence[{index}]"
    got = _fields(raw, EVIDENCE_KEYS, where)
    for key in ("preset", "figure"):
        if key not in got:
            raise ClaimsError(f"{where}.{key}: missing")
    if runs is not None and got["preset"] not in runs.presets:
        raise ClaimsError(f"{where}.preset: {got['preset']!r} is not among runs.presets")
    return Evidence(**got)


def _sequential(raw: Any) -> Sequential:
    got = _fields(raw, SEQUENTIAL_KEYS, "sequential")
    looks = got.get("looks", list(Sequential.looks))
    if not looks or not all(_is(k, int) and k >= 3 for k in looks) or looks != sorted(set(looks)):
        raise ClaimsError(f"sequential.looks: expected increasing seed counts >= 3, got {looks}")
    alpha = got.get("alpha", Sequential.alpha)
    if not 0 < alpha < 1:
        raise ClaimsError(f"sequential.alpha: expected a number in (0, 1), got {alpha}")
    minutes = got.get("cpu_minutes", Sequential.cpu_minutes)
    if minutes <= 0:
        raise ClaimsError(f"sequential.cpu_minutes: expected a number above 0, got {minutes}")
    return Sequential(tuple(looks), alpha, minutes)


# -- judging -------------------------------------------------------------------------------
def judge(claim: Claim, runs: pd.DataFrame, confidence: float | None = None) -> Finding:
    """The claim's verdict from the runs (mpt_repro.report.collect.load_runs's table), by its
    stated tests, each interval at `confidence` (default: the claim's sequential rule's)."""
    if claim.setting in UNTESTED:
        return Finding(claim, UNTESTED[claim.setting], claim.why)
    mine = matching_runs(claim.runs, runs)
    if mine.empty:
        return Finding(claim, "inconclusive", "none of its runs are in this results folder")
    level = confidence if confidence is not None else claim.sequential.confidence
    outcomes = [_judge_test(t, mine, level) for t in claim.tests]
    wall = pd.to_numeric(mine.get("wall_time_s"), errors="coerce").sum(min_count=1)
    commits = {str(_record(p).get("git_commit") or "")[:12] for p in mine["path"]}
    return Finding(
        claim,
        combined([o.verdict for o in outcomes]),
        "; ".join(o.reason for o in outcomes),
        [o.shown for o in outcomes] + [_evidence_text(e, mine) for e in claim.evidence],
        sorted({int(s) for s in mine["seed"]}),
        None if pd.isna(wall) else float(wall),
        outcomes,
        sorted(c for c in commits if c) or ["unknown"],
    )


def combined(verdicts: list[str]) -> str:
    """A claim's verdict from its tests': reproduced only when every test is; not reproduced
    when any test came out the other way; otherwise inconclusive."""
    if verdicts and all(v == "reproduced" for v in verdicts):
        return "reproduced"
    return "not reproduced" if "not reproduced" in verdicts else "inconclusive"


def beyond_reach(finding: Finding) -> Finding:
    """An undecided finding whose seeds have stopped, relabelled "not testable at this scale"
    where no test left undecided could have been decided: each is a delta test whose interval
    is still wider than its whole tolerance (half-width > X), so not even a true difference of
    0 could have read as a match. The reason says about how many seeds the tolerance would need
    (`seeds_for`); any other undecided finding stays inconclusive."""
    open_ = [o for o in finding.outcomes if o.verdict == "inconclusive"]
    if finding.decided or not open_:
        return finding
    if any(o.tolerance is None or o.half_width is None or o.half_width <= o.tolerance
           for o in open_):  # fmt: skip
        return finding
    worst = max(open_, key=lambda o: o.half_width / o.tolerance)
    needed = seeds_for(worst, finding.claim.sequential.confidence)
    reason = (
        f"at the end of its budget ({worst.n} seeds) its interval is ±{worst.half_width:.3g}, "
        f"wider than the tolerance ±{worst.tolerance:.3g} it is judged against: these runs "
        f"cannot tell a difference inside the tolerance from one past it; about {needed} "
        f"seeds would bring the interval to ±{worst.tolerance:.3g} (more for a fair chance of "
        "a decision)"
    )
    return replace(finding, verdict="not testable at this scale", reason=reason)


def seeds_for(outcome: Outcome, confidence: float, most: int = 100_000) -> int:
    """About how many seeds bring `outcome`'s interval down to its tolerance: the spread the
    interval implies (sd = h·sqrt(n)/t(n − 1)) held fixed, the fewest m with
    t(m − 1)·sd/sqrt(m) <= X (the t quantile falls as the seeds grow, which n·(h/X)² misses:
    at 3 seeds it overstates about eightfold). The evaluation set's share of the interval is
    taken as the seeds' (a floor it holds is not reached by seeds at all: then more)."""
    from mpt_repro.report.compare import t_quantile

    q = 1 - (1 - confidence) / 2
    n, h, x = outcome.n, outcome.half_width, outcome.tolerance
    sd = h * math.sqrt(n) / t_quantile(q, n - 1)
    m = n
    while m < most and t_quantile(q, m - 1) * sd / math.sqrt(m) > x:
        m = max(m + 1, int(m * 1.05))  # coarse steps: "about" is all the page says
    return m


def matching_runs(spec: Runs, runs: pd.DataFrame) -> pd.DataFrame:
    """The tabulated runs of `spec`: its experiment, budget, recipe changes, presets and seeds
    (any seed when `spec.seeds` is empty)."""
    if runs.empty:
        return runs
    changes = runs["recipe_changes"] if "recipe_changes" in runs else ""
    keep = (
        (runs["experiment"] == spec.experiment)
        & (runs["budget"] == spec.budget)
        & (changes == spec.changes)
        & runs["precision"].isin(spec.presets)
        & (runs["seed"].isin(spec.seeds) if spec.seeds else True)
        & (runs["subject"] == runs["experiment"])  # the experiment's own model
    )
    return runs[keep]


def _judge_test(test: Test, runs: pd.DataFrame, confidence: float) -> Outcome:
    if test.kind == "delta":
        return _judge_delta(test, runs, confidence)
    if test.kind == "spread":
        return _judge_spread(test, runs, confidence)
    return _judge_figure(test, runs, confidence)


def decide(expect: str, low: float, high: float, margin: float) -> str:
    """A test's verdict from an interval [low, high] on the signed quantity the test is about
    (delta: how much worse the preset is than its reference, in the metric's unit; figure and
    spread: the value minus the threshold or margin) against `margin` (delta: the tolerance X;
    otherwise 0): reproduced, not reproduced, or inconclusive while the interval straddles."""
    if expect == "matches":
        inside, outside = -margin <= low and high <= margin, low > margin or high < -margin
    elif expect == "worse":
        inside, outside = low > margin, high < margin
    elif expect == "better":
        inside, outside = high < -margin, low > -margin
    elif expect == "above":
        inside, outside = low > margin, high < margin
    else:  # below
        inside, outside = high < margin, low > margin
    return "reproduced" if inside else "not reproduced" if outside else "inconclusive"


def refutation(test: Test, tolerance: str = "") -> str:
    """What result would have refuted the test, in words."""
    if test.refuted_by:
        return test.refuted_by
    versus = f"{test.preset} − {test.reference}"
    if test.kind == "delta":
        return {
            "matches": f"the interval of {versus} wholly outside ±{tolerance}",
            "worse": f"the interval of {versus} wholly short of {tolerance} worse (or better)",
            "better": f"the interval of {versus} wholly short of {tolerance} better (or worse)",
        }[test.expect]
    side = "below" if test.expect == "above" else "above"
    what = f"{versus} of {test.label or test.figure}" if test.reference else test.label
    bound = _number(test.threshold, test)
    if test.kind == "spread":
        return f"the interval of the SD of {test.figure} over seeds wholly {side} {bound}"
    return f"the interval of {what or test.figure} wholly {side} {bound}"


def _number(value: float, test: Test | Evidence) -> str:
    return f"{value * test.scale:.3g}{test.unit}"


def _t_interval(values: list[float], confidence: float) -> tuple[float, float, float] | None:
    """(mean, low, high): the Student t interval with n − 1 degrees of freedom; None under 2."""
    from mpt_repro.report.compare import t_quantile

    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def _too_few(values: list, what: str) -> str | None:
    from mpt_repro.report.compare import MIN_SEEDS

    if len(values) < MIN_SEEDS:
        return f"{what}: {len(values)} seed(s); a verdict needs at least {MIN_SEEDS}"
    if len(set(values)) == 1:
        return f"{what}: the {len(values)} seeds give the same value: no spread to judge it by"
    return None


def _judge_delta(test: Test, runs: pd.DataFrame, confidence: float) -> Outcome:
    """A preset against its reference, paired by seed; the interval read against ±X."""
    mine, ref = runs[runs["precision"] == test.preset], runs[runs["precision"] == test.reference]
    if mine.empty or ref.empty:
        return Outcome("inconclusive", f"no {test.preset if mine.empty else test.reference} run")
    metric = test.metric or str(mine["primary_metric"].dropna().iloc[0])
    found = (_train_delta if metric.startswith(TRAIN_PREFIX) else _eval_delta)(
        mine, ref, metric, test, confidence
    )
    if isinstance(found, str):
        return Outcome("inconclusive", found)
    (mean, low, high, n, held), tol, lower_better = found, *_tolerance_of(test, ref, metric)
    bad = (low, high) if lower_better else (-high, -low)  # how much worse the preset is
    verdict = decide(test.expect, bad[0], bad[1], tol)
    stated = (
        f"expected {test.preset} to {_EXPECT_WORDS[test.expect]} {test.reference} on "
        f"{_metric_words(metric)} (±{tol:.3g})"
    )
    said = {"reproduced": "it does", "not reproduced": "it does not"}.get(
        verdict, "the interval straddles the tolerance"
    )
    shown = (
        f"{test.preset} − {test.reference} {_metric_words(metric)}: {mean:+.4g} "
        f"[{low:+.4g}, {high:+.4g}] (n={n} seeds; {held}; {100 * confidence:.4g} %)"
    )
    shown += _table_verdict(mine, ref, metric, test, tol, confidence)
    return Outcome(verdict, f"{stated}: {said}", shown, (high - low) / 2, n, tol)


def _table_verdict(mine, ref, metric, test, tol: float, confidence: float) -> str:
    """The verdict mpt-report's comparison table gives the same difference, said beside the
    claim's own where they could differ (one difference, one verdict per page, or the reason
    for two): the claim's test reads a stricter interval (the sequential rule's) against its
    own tolerance, the table a 95 % interval against comparison.yaml's."""
    from mpt_repro.report.compare import default_settings, paired_delta, tolerance_text

    if metric != str(mine["primary_metric"].dropna().iloc[0]):
        return ""  # the table compares the primary metric only
    settings = replace(default_settings(), reference=test.reference)
    d = paired_delta(mine, ref, settings)
    if d is None:
        return ""
    why = []
    if d.tolerance is None or not math.isclose(d.tolerance, tol, rel_tol=1e-6):
        shown = "?" if d.tolerance is None else tolerance_text(d.tolerance)
        why.append(f"its tolerance is ±{shown} ({d.tolerance_source}), this test's ±{tol:.3g}")
    if not math.isclose(confidence, settings.confidence):
        why.append(
            f"it reads a {100 * settings.confidence:.4g} % interval, this test a "
            f"{100 * confidence:.4g} % one (the sequential rule's)"
        )
    said = f"; mpt-report's comparison table: {d.verdict}"
    return said + (f" ({'; '.join(why)})" if why else "")


_EXPECT_WORDS = {"matches": "match", "worse": "be worse than", "better": "be better than"}


def _metric_words(metric: str) -> str:
    if metric.startswith(TRAIN_PREFIX):
        return f"training {metric.removeprefix(TRAIN_PREFIX)} (mean over the second half)"
    return metric


def _lower_is_better(metric: str, runs: pd.DataFrame) -> bool:
    if metric == str(runs["primary_metric"].dropna().iloc[0]):
        return not bool(runs["higher_is_better"].dropna().iloc[0])
    from mpt_repro import registry

    info = registry.metric_info(metric)  # as the task that reports it registered it
    return not (info is not None and info.higher_is_better)  # losses, errors, unknown


def _tolerance_of(test: Test, ref: pd.DataFrame, metric: str) -> tuple[float, bool]:
    """(X in the metric's unit, lower is better): a relative tolerance is of the reference's
    mean over its seeds."""
    from mpt_repro.report.compare import parse_tolerance

    value, relative = parse_tolerance(test.tolerance) or (0.0, False)
    if relative:
        values = list(_metric_values(ref, metric).values())
        value = value / 100 * abs(sum(values) / len(values)) if values else math.nan
    return value, _lower_is_better(metric, ref)


def _eval_delta(mine, ref, metric, test, confidence) -> tuple | str:
    """mpt-report's paired interval (the seeds' and the evaluation set's variation) of an
    evaluation metric, at `confidence`; a string says why there is none."""
    from mpt_repro.report.compare import default_settings, paired_delta

    lower = _lower_is_better(metric, ref)
    retarget = {"primary_metric": metric, "higher_is_better": not lower}
    settings = replace(default_settings(), reference=test.reference, confidence=confidence)
    d = paired_delta(mine.assign(**retarget), ref.assign(**retarget), settings)
    if d is None:
        return f"no {metric} recorded"
    if d.n_diverged or d.n_nonfinite:  # an outcome no interval holds: worse by any margin
        worst = math.inf if lower else -math.inf
        return worst, worst, worst, d.n, d.verdict
    problem = _delta_problem(d)
    if problem:
        return f"{test.preset} − {test.reference} {metric}: {problem}"
    ev = d.evidence
    held = f"{ev.items:,} {ev.unit}" if ev.se is not None else "seeds only"
    return d.mean, d.low, d.high, d.n, held


def _delta_problem(d) -> str | None:
    """Why a paired difference carries no verdict whatever the tolerance (mpt-report's own
    rules: compare.no_verdict_reason), or None when its interval can be read."""
    from mpt_repro.report.compare import no_verdict_reason

    if d.evidence.identical and not (d.n_untrained or d.n_conflicting):
        return f"{d.verdict}: the claim cannot be tested on this device"
    return no_verdict_reason(d)


def _train_delta(mine, ref, metric, test, confidence) -> tuple | str:
    """A training column's paired differences over seeds, Student t (the seeds change the data
    order, so their variation holds the training batches')."""
    a, b = _metric_values(mine, metric), _metric_values(ref, metric)
    diffs = [a[s] - b[s] for s in sorted(set(a) & set(b))]
    problem = _too_few(diffs, f"{test.preset} − {test.reference} {_metric_words(metric)}")
    if problem:
        return problem
    mean, low, high = _t_interval(diffs, confidence)
    return mean, low, high, len(diffs), "seeds only"


def _metric_values(runs: pd.DataFrame, metric: str) -> dict[int, float]:
    """{seed: value} of the completed runs: an evaluation metric from the table, or a training
    column's mean over the logged windows of the second half of training (metrics.csv)."""
    done = runs[runs["status"] == "completed"]
    out = {}
    for _, row in done.iterrows():
        if metric.startswith(TRAIN_PREFIX):
            value = _train_mean(Path(row["path"]), metric.removeprefix(TRAIN_PREFIX))
        else:
            value = pd.to_numeric(pd.Series([row.get(f"metric_{metric}")]), errors="coerce")[0]
        if value is not None and math.isfinite(value):
            out[int(row["seed"])] = float(value)
    return out


def _train_mean(run_dir: Path, column: str) -> float | None:
    try:
        table = pd.read_csv(run_dir / "metrics.csv")
    except (OSError, ValueError):
        return None
    if column not in table or "split" not in table:
        return None
    rows = table[(table["split"] == "train") & table[column].notna()]
    if rows.empty:
        return None
    tail = rows[rows["step"] > TRAIN_TAIL * rows["step"].max()]
    return float(pd.to_numeric(tail[column], errors="coerce").mean())


def _judge_figure(test: Test, runs: pd.DataFrame, confidence: float) -> Outcome:
    """A recorded figure over seeds: the preset's runs against the reference preset's runs of
    the same seeds (paired differences, expected above or below the threshold as a margin), or
    against the threshold itself; Student t with n − 1 degrees of freedom."""
    mine = _figures(runs, test.preset, test.figure)
    name = test.label or test.figure
    if test.reference:
        other = _figures(runs, test.reference, test.figure)
        seeds = sorted(set(mine) & set(other))
        diffs = [mine[s] - other[s] for s in seeds]
        name = f"{test.preset} − {test.reference}: {name}"
    else:
        diffs = [v - test.threshold for v in mine.values()]
    problem = _too_few(diffs, name)
    shown = _figure_text(test, mine, _figures(runs, test.reference, test.figure), confidence)
    if problem:
        return Outcome("inconclusive", problem, shown, None, len(diffs))
    mean, low, high = _t_interval(diffs, confidence)
    verdict = decide(test.expect, low, high, 0.0)
    said = {"reproduced": "it is", "not reproduced": "it is not"}.get(
        verdict, "the interval straddles it"
    )
    stated = f"{name}: expected {test.expect} {_number(test.threshold, test)}"
    return Outcome(verdict, f"{stated}: {said}", shown, (high - low) / 2 * test.scale, len(diffs))


def _figures(runs: pd.DataFrame, preset: str, path: str) -> dict[int, float]:
    """{seed: the number at `path` in its run.json} for the preset's runs that record it."""
    out = {}
    for _, row in runs[runs["precision"] == preset].iterrows():
        value = _figure(_record(row["path"]), path)
        if value is not None:
            out[int(row["seed"])] = value
    return out


def _figure_text(test, mine: dict, other: dict, confidence: float) -> str:
    """`share flushed (no_scaling): 0.05 % [0.04, 0.06]; mixed: 0 % [0, 0] (n=5 seeds)`."""

    def stat(values: list[float]) -> str:
        if not values:
            return "not recorded"
        found = _t_interval(values, confidence)
        mean = sum(values) / len(values)
        text = _number(mean, test)
        if found is not None:
            text += f" [{found[1] * test.scale:.3g}, {found[2] * test.scale:.3g}]"
        return text

    text = f"{test.label or test.figure} ({test.preset}): {stat(list(mine.values()))}"
    if test.reference:
        text += f"; {test.reference}: {stat(list(other.values()))}"
    return f"{text} (n={len(mine)} seeds)"


def _judge_spread(test: Test, runs: pd.DataFrame, confidence: float) -> Outcome:
    """The standard deviation of a metric over the preset's seeds, its chi-square interval
    ((n − 1) s² / σ² is chi-square with n − 1 degrees of freedom for normal seeds) against the
    threshold."""
    from scipy.stats import chi2

    values = list(_metric_values(runs[runs["precision"] == test.preset], test.figure).values())
    name = test.label or f"SD of {test.figure} over seeds"
    problem = _too_few(values, name)
    if problem:
        return Outcome("inconclusive", problem, "", None, len(values))
    n, mean = len(values), sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    alpha = 1 - confidence
    low = sd * math.sqrt((n - 1) / chi2.ppf(1 - alpha / 2, n - 1))
    high = sd * math.sqrt((n - 1) / chi2.ppf(alpha / 2, n - 1))
    verdict = decide(test.expect, low - test.threshold, high - test.threshold, 0.0)
    shown = (
        f"{name} ({test.preset}): {_number(sd, test)} [{_number(low, test)}, "
        f"{_number(high, test)}] (n={n} seeds; {100 * confidence:.4g} %)"
    )
    said = {"reproduced": "it is", "not reproduced": "it is not"}.get(
        verdict, "the interval straddles it"
    )
    stated = f"{name}: expected {test.expect} {_number(test.threshold, test)}"
    return Outcome(verdict, f"{stated}: {said}", shown, (high - low) / 2 * test.scale, n)


def _evidence_text(item: Evidence, runs: pd.DataFrame) -> str:
    values = list(_figures(runs, item.preset, item.figure).values())
    if not values:
        return f"{item.label or item.figure} ({item.preset}): not recorded"
    mean = sum(values) / len(values)
    shown = f"{_number(mean, item)} (mean of {len(values)} seeds; evidence, not tested)"
    return f"{item.label or item.figure} ({item.preset}): {shown}"


def _record(path: str) -> dict:
    try:
        return json.loads((Path(path) / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def _figure(record: dict, path: str) -> float | None:
    """A number from a run's record: a dotted path into it."""
    node: Any = record
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node) if math.isfinite(node) else None


# -- the table -------------------------------------------------------------------------------
def findings(
    runs: pd.DataFrame, claims: list[Claim] | None = None, confidence: float | None = None
) -> list[Finding]:
    """Every claim's finding, in the paper's order (by section)."""
    claims = claims if claims is not None else load_claims()
    ordered = sorted(claims, key=lambda c: section_order(c.section))
    return [judge(c, runs, confidence) for c in ordered]


def section_order(section: str) -> tuple:
    """ "§3.1, Figure 2b" -> (3, 1, ...): claims in the order the paper makes them."""
    import re

    numbers = re.findall(r"\d+", section)
    return tuple(int(n) for n in numbers) or (99,)


def findings_frame(found: list[Finding]) -> pd.DataFrame:
    """One row per claim: the claim and its section, the keys it tests, our verdict and its
    reason, the evidence, and the runs it rests on."""
    rows = []
    for f in found:
        c = f.claim
        rows.append(
            {
                "Claim": c.statement,
                "Section": c.section,
                "Keys": keys_text(c.keys),
                "Setting": SETTINGS[c.setting]
                + (f": {c.why}" if c.setting not in UNTESTED else ""),
                "Verdict": f.verdict,
                "Why": f.reason,
                "Evidence": "; ".join(e for e in f.evidence if e),
                "Runs": runs_text(c.runs, f.seeds) if c.runs else "",
                "Wall time (s)": "" if f.wall_time_s is None else f"{f.wall_time_s:.0f}",
            }
        )
    return pd.DataFrame(rows)


def keys_text(keys: tuple[str, ...]) -> str:
    return ", ".join(keys) if len(keys) <= 2 else f"{keys[0]} and {len(keys) - 1} more"


def runs_text(runs: Runs, seeds: list[int]) -> str:
    extra = f" {' '.join(runs.overrides)}" if runs.overrides else ""
    shown = ",".join(map(str, seeds)) if seeds else "none found"
    return (
        f"experiment={runs.experiment} budget={runs.budget}{extra} "
        f"precision={','.join(runs.presets)}; seeds {shown}"
    )


CAPTION = (
    "Each test was stated in conf/claims/ before it ran; the verdict (reproduced, not "
    "reproduced, inconclusive, not testable) is computed from the runs, with why."
)


def claims_table(runs: pd.DataFrame):
    """mpt-report's section: the claims whose runs are in the results folder, on every seed
    found there, each interval at 95 % (None when no claim's runs are present)."""
    from mpt_repro.report.tables import Table

    claims = [
        replace(c, runs=replace(c.runs, seeds=())) for c in load_claims() if c.runs is not None
    ]
    claims = [c for c in claims if not matching_runs(c.runs, runs).empty]
    if not claims:
        return None
    return Table(
        "claims",
        "The paper's claims, tested on these runs (conf/claims/)",
        CAPTION,
        findings_frame(findings(runs, claims, confidence=0.95)),
        [
            "A claim shown on a constructed task shows the mechanism, not the paper's result. "
            "`make reproduce-claims` runs every claim, adding seeds until each is decided and "
            "deciding it again on other seeds; docs/claims.md has one full run."
        ],
    )
