"""Differences to FP32 with their uncertainty, and a verdict against the paper's claim.

Within one comparison group (the same subject, configuration but for precision and seed, budget,
data set and device: mpt_repro.report.collect), each preset's primary metric is paired with the
reference preset's (FP32) seed by seed: d_i = preset − FP32 on seed i, mean d̄ over n seeds.

Two things vary under d̄, and the interval holds both (docs/report.md has the method and its
sources):

- the seed (initialisation, data order): the sample variance s² of the d_i, s²/n for the mean;
- the evaluation set, one sample of the items a metric could be computed on: its share is the
  bootstrap standard error SE of d̄ when the items are resampled with replacement, the same draw
  for every seed and both presets (the evaluation set is common to all of them), each metric
  recomputed from the resampled sums of its per-item columns (scipy.stats.bootstrap over the
  records' eval_items.npz, a fixed random seed, so a report is reproducible).

The interval is d̄ ± t(1 − α/2, ν) · √(s²/n + SE²), ν from Welch–Satterthwaite with the
bootstrap part taken as exact (ν = (n − 1) · (1 + SE²·n/s²)²). Its verdict reads it against a
tolerance X (comparison.yaml): "matches FP32 (CI within ±X)", "better", "worse"; and, from the
outcomes, "worse: k of n seeds diverged". Where the evidence cannot carry a verdict (fewer than
MIN_SEEDS paired seeds, differences with no spread, no per-item record, an interval wider than
the question) the verdict is "no verdict: <why>; <what would give one>".
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mpt_repro.report.collect import PAIR_KEYS

# a verdict needs at least this many paired seeds: with two, s has one degree of freedom and a
# t interval is twelve standard errors wide; with one there is no estimate of seed variation
MIN_SEEDS = 3


@dataclass(frozen=True)
class Settings:
    reference: str
    confidence: float
    tolerance: dict[str, str]  # metric -> "0.5" (absolute) or "2%" (relative to the reference)
    resamples: int = 2000  # bootstrap resamples of the evaluation set
    bootstrap_seed: int = 0  # fixed: the same records give the same report


@lru_cache(maxsize=1)
def default_settings() -> Settings:
    from omegaconf import OmegaConf

    with resources.files("mpt_repro.report").joinpath("comparison.yaml").open() as f:
        raw = OmegaConf.to_container(OmegaConf.load(f))
    tolerance = {str(k): str(v) for k, v in raw["tolerance"].items()}
    boot = raw.get("bootstrap") or {}
    return Settings(
        str(raw["reference"]),
        float(raw["confidence"]),
        tolerance,
        int(boot.get("resamples", 2000)),
        int(boot.get("seed", 0)),
    )


def with_tolerances(settings: Settings, items: list[str]) -> Settings:
    """Settings with `metric=value` overrides (the --tolerance option); ValueError when one is
    not of that form."""
    tolerance = dict(settings.tolerance)
    for item in items:
        metric, sep, value = item.partition("=")
        if not sep or not metric or parse_tolerance(value) is None:
            raise ValueError(
                f"--tolerance {item!r}: expected METRIC=VALUE, e.g. top1=0.3 or perplexity=2%"
            )
        tolerance[metric] = value
    return replace(settings, tolerance=tolerance)


def parse_tolerance(text: str) -> tuple[float, bool] | None:
    """(value, relative) from "0.5" or "2%"; None unless a finite number >= 0."""
    relative = text.strip().endswith("%")
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        return None
    return (value, relative) if math.isfinite(value) and value >= 0 else None


def tolerance_for(settings: Settings, metric: str, reference_mean: float | None) -> float | None:
    """The tolerance in the metric's unit (a relative one scaled by |reference mean|)."""
    text = settings.tolerance.get(metric, settings.tolerance.get("default", "0"))
    value, relative = parse_tolerance(text) or (0.0, False)
    if not relative:
        return value
    if reference_mean is None or not math.isfinite(reference_mean):
        return None
    return value / 100 * abs(reference_mean)


def t_quantile(p: float, dof: float) -> float:
    from scipy.stats import t

    return float(t.ppf(p, dof))  # dof = inf gives the normal quantile


def z_quantile(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - confidence) / 2))


# -- the evaluation set's share -------------------------------------------------------------
def evaluation_evidence(
    pairs: list[tuple[pd.Series, pd.Series]], metric: str, settings: Settings
) -> EvalEvidence:
    """The bootstrap standard error of the mean paired difference of `metric` over `pairs`
    (a preset's run and the reference's, per seed), resampling the evaluation's items: one
    draw of item indices serves every run (all evaluated the same items). Unknown, with the
    reason, when a record keeps no per-item file or the files do not fit together."""
    loaded = []
    for mine, ref in pairs:
        for row in (mine, ref):
            found = _run_items(row, metric)
            if isinstance(found, str):
                return EvalEvidence(problem=found)
            loaded.append(found)
    problem = _misaligned(loaded)
    if problem:
        return EvalEvidence(problem=problem)
    formula, items, unit = loaded[0].formula, loaded[0].items, loaded[0].unit
    if items < 2:
        return EvalEvidence(items, unit, problem=f"{items} {unit} evaluated")
    columns = formula.columns()
    runs = [run.columns for run in loaded]

    def statistic(index: np.ndarray, axis: int = -1) -> np.ndarray:
        values = [formula.value({c: run[c][index].sum(axis=-1) for c in columns}) for run in runs]
        diffs = [values[i] - values[i + 1] for i in range(0, len(values), 2)]
        return np.mean(diffs, axis=0)

    se = bootstrap_se(np.arange(items), statistic, settings)
    if not math.isfinite(se):
        return EvalEvidence(items, unit, problem="the resampled metric was undefined")
    return EvalEvidence(items, unit, se, None)


def bootstrap_se(index: np.ndarray, statistic: Any, settings: Settings) -> float:
    """The standard error of statistic(resampled index) over settings.resamples resamples
    (scipy.stats.bootstrap; percentile method, whose standard error is that of the bootstrap
    distribution), from a fixed seed."""
    from scipy.stats import bootstrap

    seeded = np.random.default_rng(settings.bootstrap_seed)
    # scipy 1.15 renamed random_state to rng
    rng = {"rng": seeded} if "rng" in inspect.signature(bootstrap).parameters else {}
    found = bootstrap(
        (index,),
        statistic,
        n_resamples=settings.resamples,
        vectorized=True,
        method="percentile",
        batch=max(1, 2_000_000 // max(len(index), 1)),  # at most ~2M indices in memory at once
        **(rng or {"random_state": seeded}),
    )
    return float(found.standard_error)


@dataclass(frozen=True)
class _Items:
    formula: Any
    items: int
    unit: str
    columns: dict[str, np.ndarray]
    path: str


# per-item files read once per report (a run is paired with several presets), by file and version
_ITEMS_CACHE: dict[tuple, _Items | str] = {}


def _run_items(row: pd.Series, metric: str) -> _Items | str:
    """A run's per-item columns for `metric`, checked against its record; a str says why not."""
    block = row.get("evaluation")
    if not isinstance(block, dict):
        return f"run.json schema {row.get('schema_version')} keeps no evaluation record"
    spec, name = (block.get("formulas") or {}).get(metric), block.get("items_file")
    if not spec or not name:
        return f"the task keeps no per-item record of {metric}"
    path = Path(str(row["path"])) / str(name)
    try:
        stat = path.stat()
    except OSError as err:
        return f"{path} cannot be read ({err.strerror or err})"
    key = (str(path), stat.st_mtime_ns, stat.st_size, metric, float(row[f"metric_{metric}"]))
    if key not in _ITEMS_CACHE:
        _ITEMS_CACHE[key] = _read_run_items(path, block, metric, float(row[f"metric_{metric}"]))
    return _ITEMS_CACHE[key]


def _read_run_items(path: Path, block: dict, metric: str, recorded: float) -> _Items | str:
    """The columns of one items file, checked: the formula's columns are there, and its sums
    give the metric run.json records at the step it records."""
    from mpt_repro.evidence import formula_from_dict, read_items

    unit = (block.get("units") or {}).get(metric, "")
    try:
        step, columns = read_items(path)
        formula = formula_from_dict({**block["formulas"][metric], "unit": unit})
        missing = [c for c in formula.columns() if c not in columns]
        if missing:
            return f"{path} lacks the columns {', '.join(missing)}"
        recomputed = float(formula.value({c: columns[c].sum() for c in formula.columns()}))
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{path} cannot be read ({type(err).__name__}: {err})"
    same = math.isclose(recomputed, recorded, rel_tol=1e-9, abs_tol=1e-9)
    if step != block.get("step") or not same:
        return f"{path} does not hold the evaluation run.json records ({metric} {recomputed:.6g})"
    items = len(next(iter(columns.values())))
    return _Items(formula, items, str(block.get("unit")), columns, str(path))


def _misaligned(runs: list[_Items]) -> str | None:
    """Why these runs' items cannot be resampled together: different counts, or a column that
    depends only on the data (the label, a reference's length) that differs."""
    from mpt_repro.evidence import KEY_COLUMNS

    first = runs[0]
    for run in runs[1:]:
        if run.items != first.items or run.unit != first.unit:
            return f"the paired runs evaluated different sets ({first.items} and {run.items} items)"
        for key in KEY_COLUMNS:
            if key in first.columns and key in run.columns:
                if not np.array_equal(first.columns[key], run.columns[key]):
                    return f"the paired runs evaluated different items ({key} differs)"
    return None


@dataclass
class Delta:
    """One preset against the reference within one comparison group."""

    preset: str
    metric: str
    higher_is_better: bool
    n: int  # paired seeds (both completed with a finite metric)
    mean: float | None
    low: float | None
    high: float | None
    tolerance: float | None
    n_diverged: int  # seeds where this preset diverged and the reference did not
    n_seeds: int  # seeds of this preset in the group
    verdict: str
    n_untrained: int = 0  # paired seeds where either run skipped every optimizer step
    n_nonfinite: int = 0  # seeds where this preset's metric is NaN/inf and the reference's is not
    sd: float | None = None  # sample standard deviation of the paired differences
    evidence: EvalEvidence = field(default_factory=lambda: EvalEvidence())
    n_conflicting: int = 0  # paired seeds with two records that disagree (collect.py)
    confidence: float = 0.95

    @property
    def seed_part(self) -> float | None:
        """The seeds' share of the variance of the mean difference, s²/n."""
        return None if self.sd is None or self.n < 2 else self.sd**2 / self.n


@dataclass(frozen=True)
class EvalEvidence:
    """The evaluation set under a difference: its size, and the standard error of the mean
    difference that resampling its items gives (None with the reason when unknown)."""

    items: int | None = None
    unit: str = "items"
    se: float | None = None
    problem: str | None = "no per-item record"

    def half_width(self, confidence: float) -> float | None:
        """The interval the evaluation set alone would allow (normal quantile)."""
        return None if self.se is None else z_quantile(confidence) * self.se


def paired_delta(
    preset_runs: pd.DataFrame, reference_runs: pd.DataFrame, settings: Settings
) -> Delta | None:
    """The paired difference of the primary metric (preset − reference) over common seeds."""
    metric = _first(preset_runs["primary_metric"]) or _first(reference_runs["primary_metric"])
    if metric is None:
        return None
    higher = bool(_first(preset_runs["higher_is_better"], True))
    mine, ref = _finite_runs(preset_runs, metric), _finite_runs(reference_runs, metric)
    seeds = sorted(set(mine) & set(ref))
    diffs = [mine[s][1] - ref[s][1] for s in seeds]
    ref_diverged = set(reference_runs.loc[reference_runs["status"] == "diverged", "seed"])
    n_diverged = int(
        ((preset_runs["status"] == "diverged") & ~preset_runs["seed"].isin(ref_diverged)).sum()
    )
    ref_values = [v for _, v in ref.values()]
    ref_mean = sum(ref_values) / len(ref_values) if ref_values else None
    n = len(diffs)
    delta = Delta(
        str(_first(preset_runs["precision"])),
        metric,
        higher,
        n,
        sum(diffs) / n if n else None,
        None,
        None,
        tolerance_for(settings, metric, ref_mean),
        n_diverged,
        len(preset_runs),
        "",
        confidence=settings.confidence,
    )
    if n >= 2:
        delta.sd = math.sqrt(sum((d - delta.mean) ** 2 for d in diffs) / (n - 1))
    if n:
        pairs = [(mine[s][0], ref[s][0]) for s in seeds]
        delta.evidence = evaluation_evidence(pairs, metric, settings)
    delta.low, delta.high = interval(delta)
    delta.n_untrained = len(set(seeds) & (_untrained(preset_runs) | _untrained(reference_runs)))
    ref_bad = ref_diverged | _nonfinite(reference_runs)
    delta.n_nonfinite = len(_nonfinite(preset_runs) - ref_bad)
    delta.n_conflicting = len(
        set(seeds) & (_conflicting(preset_runs) | _conflicting(reference_runs))
    )
    delta.verdict = verdict(delta)
    return delta


def _finite_runs(runs: pd.DataFrame, metric: str) -> dict[int, tuple[pd.Series, float]]:
    """{seed: (its run's row, its primary metric)} for the runs that completed with a finite one."""
    column = f"metric_{metric}"
    if column not in runs:
        return {}
    ok = runs[(runs["status"] == "completed") & runs["primary_finite"].astype(bool)]
    return {int(r["seed"]): (r, float(r[column])) for _, r in ok.iterrows()}


def interval(d: Delta) -> tuple[float | None, float | None]:
    """d̄ ± t(ν) · √(s²/n + SE²); with the evaluation set's share unknown, the seeds' alone
    (t with n − 1 degrees of freedom, as before schema 4); none from fewer than two seeds."""
    if d.mean is None or d.seed_part is None:
        return None, None
    seed_var, se = d.seed_part, d.evidence.se
    eval_var = se**2 if se is not None else 0.0
    total = seed_var + eval_var
    if total == 0:
        return d.mean, d.mean
    dof = (d.n - 1) * (total / seed_var) ** 2 if seed_var > 0 else math.inf
    half = t_quantile(1 - (1 - d.confidence) / 2, dof) * math.sqrt(total)
    return d.mean - half, d.mean + half


def _nonfinite(runs: pd.DataFrame) -> set[int]:
    """The seeds of completed runs whose primary metric is NaN or infinite."""
    bad = (runs["status"] == "completed") & ~runs["primary_finite"].astype(bool)
    return {int(s) for s in runs.loc[bad, "seed"]}


def _untrained(runs: pd.DataFrame) -> set[int]:
    """The seeds of completed runs that applied no optimizer step (every step skipped)."""
    if "untrained" not in runs:
        return set()
    return {int(s) for s in runs.loc[runs["untrained"].fillna(False).astype(bool), "seed"]}


def _conflicting(runs: pd.DataFrame) -> set[int]:
    """The seeds whose run has a second record of the same identity with other metrics."""
    if "conflict" not in runs:
        return set()
    return {int(s) for s in runs.loc[runs["conflict"].fillna(False).astype(bool), "seed"]}


def verdict(d: Delta) -> str:
    if d.n_diverged or d.n_nonfinite:  # an outcome the interval of the finite pairs would hide
        bad = [f"{d.n_diverged} of {d.n_seeds} seeds diverged"] if d.n_diverged else []
        if d.n_nonfinite:
            bad.append(f"{d.n_nonfinite} of {d.n_seeds} seeds ended with a non-finite {d.metric}")
        return "worse: " + ", ".join(bad)
    if d.n == 0:
        return "no paired seeds: none completed with a finite metric under both presets"
    why = _no_verdict(d)
    if why:
        return f"no verdict: {why}"
    tol = d.tolerance
    shown = "?" if tol is None else tolerance_text(tol)
    if tol is not None and -tol <= d.low and d.high <= tol:
        return f"matches FP32 (CI within ±{shown})"
    better_side = d.low > 0 if d.higher_is_better else d.high < 0
    worse_side = d.high < 0 if d.higher_is_better else d.low > 0
    if better_side:
        return "better"
    if worse_side:
        return "worse"
    return f"no verdict: CI wider than ±{shown}; {resolution(d)}"


def tolerance_text(tol: float) -> str:
    """0.5, 1000, 5.886: four significant digits at most (a relative tolerance is a product)."""
    return f"{float(f'{tol:.4g}'):g}"


def _no_verdict(d: Delta) -> str | None:
    """Why the evidence under a difference cannot carry a verdict, or None when it can."""
    if d.n_untrained:  # a comparison with a model that never stepped says nothing of precision
        return f"{d.n_untrained} of {d.n} paired seeds applied no step"
    if d.n_conflicting:
        return (
            f"{d.n_conflicting} of {d.n} paired seeds have two records that disagree "
            "(listed under the runs to check)"
        )
    if d.n < MIN_SEEDS:
        return (
            f"{d.n} paired seed{'s' if d.n != 1 else ''}; a verdict needs at least {MIN_SEEDS} "
            f"(mpt-run -m ... seed={','.join(map(str, range(MIN_SEEDS)))})"
        )
    if d.sd == 0:
        return (
            f"the {d.n} paired differences have no spread (all {d.mean:+.4g}): seed-to-seed "
            "variation cannot be estimated from them: run more seeds (and check that the seed "
            "changes the run)"
        )
    if d.evidence.se is None:
        return f"the evaluation set's own sampling error is unknown ({d.evidence.problem})"
    if d.low is None or d.high is None:
        return "no interval"
    return None


def resolution(d: Delta) -> str:
    """What would resolve an interval too wide for a verdict, at the variation observed: more
    seeds, more items, or both. The target half-width is the larger of the distances that would
    show a match (X − |d̄|) or a difference (|d̄|); each plan is the smallest that brings the
    interval (the same t quantile and degrees of freedom as `interval`) within it."""
    tol, mean, ev = d.tolerance or 0.0, abs(d.mean or 0.0), d.evidence
    target = max(tol - mean, mean)
    if target <= 0:
        return "a difference of exactly 0 against a tolerance of 0 cannot be resolved"
    seed_var, eval_var = (d.sd or 0.0) ** 2, (ev.se or 0.0) ** 2
    seeds = _plan(lambda n: _half(d, seed_var / n, eval_var, n) <= target)
    if seeds is not None:
        return f"about {seeds} seeds would resolve ±{target:.3g} at the spread observed"
    shown = ev.half_width(d.confidence) or 0.0
    said = (
        f"the evaluation set ({ev.items:,} {ev.unit}) alone leaves ±{shown:.3g}, more than "
        f"seeds can remove (±{target:.3g} needed)"
    )
    if not ev.items:
        return said

    def fits(n: int, scale: float) -> bool:  # n seeds, and `scale` times the items
        return _half(d, seed_var / n, eval_var / scale, n) <= target

    n = max(d.n, MIN_SEEDS)
    scale = _plan(lambda k: fits(n, k), limit=10_000, start=2)
    if scale is not None:
        return f"{said}: about {scale * ev.items:,} {ev.unit} would, with {n} seeds"
    both = _plan(lambda k: fits(k * n, k), limit=10_000, start=2)
    if both is None:
        return said
    return f"{said}: about {both * n} seeds and {both * ev.items:,} {ev.unit} together would"


def _half(d: Delta, seed_part: float, eval_var: float, n: int) -> float:
    """The interval's half-width for these variance parts (compare `interval`)."""
    total = seed_part + eval_var
    dof = (n - 1) * (total / seed_part) ** 2 if seed_part > 0 else math.inf
    return t_quantile(1 - (1 - d.confidence) / 2, dof) * math.sqrt(total)


def _plan(ok: Any, limit: int = 1000, start: int = MIN_SEEDS) -> int | None:
    """The smallest k in start..limit (doubling, then bisecting) with ok(k), or None."""
    k = start
    while not ok(k):
        if k >= limit:
            return None
        k = min(2 * k, limit)
    low = max(start, k // 2)
    while low < k:
        mid = (low + k) // 2
        low, k = (low, mid) if ok(mid) else (mid + 1, k)
    return k


def delta_text(d: Delta | None, decimals: int = 2) -> str:
    """`+0.12 [−0.30, +0.54] (n=3; 360 images)` (the seeds, and the evaluation set the interval
    holds), `... (n=3; seeds only)` when the evaluation set's share is unknown, `+0.12 (n=1)`,
    or the outcome when nothing pairs."""
    if d is None:
        return ""
    if d.mean is None:
        return "diverged" if d.n_diverged else "no paired seeds"
    text = f"{d.mean:+.{decimals}f}"
    if d.low is None or d.high is None:
        return f"{text} (n={d.n})"
    text += f" [{d.low:+.{decimals}f}, {d.high:+.{decimals}f}]"
    ev = d.evidence
    held = f"{ev.items:,} {ev.unit}" if ev.se is not None else "seeds only"
    return f"{text} (n={d.n}; {held})"


def group_deltas(runs: pd.DataFrame, settings: Settings) -> dict[tuple, dict[str, Delta]]:
    """{comparison group (PAIR_KEYS values): {preset: Delta}} for every group that has the
    reference preset and another."""
    out: dict[tuple, dict[str, Delta]] = {}
    if runs.empty:
        return out
    for key, part in runs.groupby(PAIR_KEYS, sort=False, dropna=False):
        reference = part[part["precision"] == settings.reference]
        if reference.empty:
            continue
        for preset, mine in part.groupby("precision", sort=False):
            if preset == settings.reference:
                continue
            delta = paired_delta(mine, reference, settings)
            if delta is not None:
                out.setdefault(tuple(key), {})[preset] = delta
    return out


def _first(values: Any, default: Any = None) -> Any:
    for v in values:
        if v is not None and v == v:
            return v
    return default


# deltas.csv's columns (after the comparison group's PAIR_KEYS)
DELTA_COLUMNS = (
    "group_label",
    "row_label",
    "preset",
    "reference",
    "metric",
    "higher_is_better",
    "seeds_paired",
    "delta_mean",
    "ci_low",
    "ci_high",
    "confidence",
    "tolerance",
    "seeds_diverged",
    "seeds_nonfinite",
    "seeds_untrained",
    "seeds_conflicting",
    "seed_sd",
    "eval_items",
    "eval_unit",
    "eval_se",
    "eval_problem",
    "verdict",
)


def deltas_frame(
    runs: pd.DataFrame, settings: Settings, deltas: dict[tuple, dict[str, Delta]] | None = None
) -> pd.DataFrame:
    """deltas.csv: one row per comparison group and preset, numbers unformatted (`deltas`: the
    report's group_deltas, computed once)."""
    labels = {}  # {comparison group: (group_label, row_label)}
    if not runs.empty:
        for _, r in runs.iterrows():
            key = tuple(r[k] for k in PAIR_KEYS)
            labels.setdefault(key, (r.get("group_label", ""), r.get("row_label", "")))
    deltas = group_deltas(runs, settings) if deltas is None else deltas
    rows = [
        {
            **dict(zip(PAIR_KEYS, key)),
            "group_label": labels.get(key, ("", ""))[0],
            "row_label": labels.get(key, ("", ""))[1],
            "reference": settings.reference,
            "confidence": settings.confidence,
            **_delta_fields(preset, d),
        }
        for key, found in deltas.items()
        for preset, d in found.items()
    ]
    return pd.DataFrame(rows, columns=[*PAIR_KEYS, *DELTA_COLUMNS])


def _delta_fields(preset: str, d: Delta) -> dict[str, Any]:
    ev = d.evidence
    return {
        "preset": preset,
        "metric": d.metric,
        "higher_is_better": d.higher_is_better,
        "seeds_paired": d.n,
        "delta_mean": d.mean,
        "ci_low": d.low,
        "ci_high": d.high,
        "tolerance": d.tolerance,
        "seeds_diverged": d.n_diverged,
        "seeds_nonfinite": d.n_nonfinite,
        "seeds_untrained": d.n_untrained,
        "seeds_conflicting": d.n_conflicting,
        "seed_sd": d.sd,
        "eval_items": ev.items,
        "eval_unit": ev.unit if ev.items else None,
        "eval_se": ev.se,
        "eval_problem": ev.problem,
        "verdict": d.verdict,
    }
