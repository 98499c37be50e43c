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
    # experiment -> {metric: (tolerance, why)}: where an experiment's evaluation set or the
    # paper's claim about it asks for its own (comparison.yaml `experiments`)
    per_experiment: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    given: tuple[str, ...] = ()  # the metrics whose tolerance --tolerance set (not comparison.yaml)


@lru_cache(maxsize=1)
def default_settings() -> Settings:
    from omegaconf import OmegaConf

    with resources.files("mpt_repro.report").joinpath("comparison.yaml").open() as f:
        raw = OmegaConf.to_container(OmegaConf.load(f))
    tolerance = {str(k): str(v) for k, v in raw["tolerance"].items()}
    boot = raw.get("bootstrap") or {}
    per_experiment = {
        str(name): {str(m): (str(v["tolerance"]), str(v["why"])) for m, v in metrics.items()}
        for name, metrics in (raw.get("experiments") or {}).items()
    }
    return Settings(
        str(raw["reference"]),
        float(raw["confidence"]),
        tolerance,
        int(boot.get("resamples", 2000)),
        int(boot.get("seed", 0)),
        per_experiment,
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
    # the user's value holds for every experiment: an experiment's own gives way to it
    given = {item.partition("=")[0] for item in items}
    per_experiment = {
        name: {m: v for m, v in metrics.items() if m not in given}
        for name, metrics in settings.per_experiment.items()
    }
    return replace(
        settings,
        tolerance=tolerance,
        per_experiment=per_experiment,
        given=tuple(sorted(set(settings.given) | given)),
    )


def parse_tolerance(text: str) -> tuple[float, bool] | None:
    """(value, relative) from "0.5" or "2%"; None unless a finite number >= 0."""
    relative = text.strip().endswith("%")
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        return None
    return (value, relative) if math.isfinite(value) and value >= 0 else None


def tolerance_for(
    settings: Settings, metric: str, reference_mean: float | None, experiment: str | None = None
) -> float | None:
    """The tolerance in the metric's unit (a relative one scaled by |reference mean|): the
    experiment's own where comparison.yaml sets one, else the metric's."""
    value, relative = parse_tolerance(tolerance_setting(settings, metric, experiment)[0]) or (
        0.0,
        False,
    )
    if not relative:
        return value
    if reference_mean is None or not math.isfinite(reference_mean):
        return None
    return value / 100 * abs(reference_mean)


def tolerance_setting(
    settings: Settings, metric: str, experiment: str | None = None
) -> tuple[str, str]:
    """(the tolerance as written, where it comes from) for a metric of an experiment: the
    command line's --tolerance, comparison.yaml's entry for the experiment, its default for the
    metric, or its default for any metric."""
    own = settings.per_experiment.get(str(experiment), {}).get(metric)
    if own is not None:
        return own[0], f"comparison.yaml's entry for {experiment}: {own[1]}"
    if metric in settings.given:
        return settings.tolerance[metric], f"--tolerance {metric}={settings.tolerance[metric]}"
    if metric in settings.tolerance:
        return settings.tolerance[metric], f"comparison.yaml's {metric} default"
    return settings.tolerance.get("default", "0"), "comparison.yaml's default for any metric"


def tolerance_rule(
    settings: Settings, metric: str, reference_mean: float | None, experiment: str | None = None
) -> str:
    """How a relative tolerance became a number ("2% of the fp32 mean 47.5"), or "" for one
    written in the metric's unit."""
    text = tolerance_setting(settings, metric, experiment)[0]
    value, relative = parse_tolerance(text) or (0.0, False)
    if not relative or reference_mean is None or not math.isfinite(reference_mean):
        return ""
    return f"{value:g}% of the {settings.reference} mean {reference_mean:.3g}"


def t_quantile(p: float, dof: float) -> float:
    # scipy.stats.t.ppf's own function, without its ~1 ms of argument checks per call (a
    # report over many groups asks for thousands); dof = inf gives the normal quantile
    from scipy.special import stdtrit

    return float(stdtrit(dof, p))


def z_quantile(confidence: float) -> float:
    from scipy.special import ndtri

    return float(ndtri(1 - (1 - confidence) / 2))


# -- the evaluation set's share -------------------------------------------------------------
def evaluation_evidence(
    pairs: list[tuple[pd.Series, pd.Series]], metric: str, settings: Settings
) -> EvalEvidence:
    """The evaluation set's share of the uncertainty of the mean paired difference of `metric`
    over `pairs` (a preset's run and the reference's, per seed), from resampling the evaluated
    items. Unknown, with the reason, when a record keeps no per-item file or the files do not
    fit together."""
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
    data_items = _first(
        [(row.get("evaluation") or {}).get("data_items") for pair in pairs for row in pair]
    )
    runs = [(loaded[i].columns, loaded[i + 1].columns) for i in range(0, len(loaded), 2)]
    first = loaded[0]
    return crossed_evidence(runs, first.formula, first.unit, settings, data_items)


def crossed_evidence(
    runs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    formula: Any,
    unit: str,
    settings: Settings,
    data_items: int | None = None,
) -> EvalEvidence:
    """The evaluation set's share of Var(d̄) in a crossed design (seeds × items, both sampled),
    from per-item columns: `runs` holds, per seed, (the preset's columns, the reference's).

    One bootstrap of the items (the same draw for every run) gives two variances: SE_sh², that
    of the mean difference d̄, and each seed's own SE_i², that of its d_i. In a two-way random
    effects model d_ij = μ + a_i + b_j + (ab)_ij, SE_sh² ≈ σ_b²/N + σ_ab²/(nN) and
    mean_i SE_i² ≈ σ_b²/N + σ_ab²/N, so the items' main effect, the part of Var(d̄) that no
    number of seeds removes, is (n·SE_sh² − mean_i SE_i²)/(n − 1) (method of moments; Owen 2007,
    "The pigeonhole bootstrap"). The seed × item part σ_ab²/(nN) is already in the seeds' s²/n:
    counting the shared SE² as well would count it twice (docs/report.md)."""
    items = len(next(iter(runs[0][0].values())))
    identical = all(
        all(np.array_equal(mine[c], ref[c]) for c in formula.columns()) for mine, ref in runs
    )
    if items < 2:
        return EvalEvidence(items, unit, problem=f"{items} {unit} evaluated")
    diffs = _resampled_differences(runs, formula, items, settings)  # (resamples, seeds)
    if not np.isfinite(diffs).all():
        return EvalEvidence(items, unit, problem="the resampled metric was undefined")
    n = diffs.shape[1]
    shared = float(np.var(diffs.mean(axis=1), ddof=1))
    each = float(np.mean(np.var(diffs, axis=0, ddof=1)))
    item_var = shared if n < 2 else max(0.0, (n * shared - each) / (n - 1))
    return EvalEvidence(
        items,
        unit,
        math.sqrt(item_var),
        None,
        shared_var=shared,
        each_var=each,
        data_items=int(data_items) if data_items else None,
        identical=identical,
    )


def _resampled_differences(
    runs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    formula: Any,
    items: int,
    settings: Settings,
) -> np.ndarray:
    """Each seed's metric difference (preset − reference) on each bootstrap resample of the
    items, one draw of item indices serving every run: an array (resamples, seeds)."""
    columns = formula.columns()
    # every run's every column side by side: one resample's sums are then one row of
    # counts @ table, for all runs at once
    table = np.stack([run[c] for pair in runs for run in pair for c in columns], axis=1).astype(
        float
    )
    width, rng = len(columns), np.random.default_rng(settings.bootstrap_seed)
    batch = max(1, 2_000_000 // items)  # at most ~2M drawn indices in memory at once
    out = []
    for start in range(0, settings.resamples, batch):
        drawn = rng.integers(0, items, size=(min(batch, settings.resamples - start), items))
        sums = _item_counts(drawn, items) @ table
        values = [
            formula.value({c: sums[:, r * width + j] for j, c in enumerate(columns)})
            for r in range(2 * len(runs))
        ]
        out.append(np.stack([values[2 * i] - values[2 * i + 1] for i in range(len(runs))], 1))
    return np.concatenate(out)


def _item_counts(drawn: np.ndarray, items: int) -> np.ndarray:
    """Resamples of item indices (one per row) as how often each drew each item: a resample's
    column sums are then one matrix product, whatever the number of runs and columns."""
    offsets = np.arange(len(drawn))[:, None] * items
    counts = np.bincount((drawn + offsets).ravel(), minlength=drawn.size)
    return counts.reshape(drawn.shape).astype(np.float64)  # float: the product runs in BLAS


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
    items = len(next(iter(columns.values())))
    problem = _items_disagree(block, metric, step, items, recomputed, recorded)
    if problem:
        return f"{path} does not hold the evaluation run.json records: {problem}"
    return _Items(formula, items, str(block.get("unit")), columns, str(path))


def _items_disagree(
    block: dict, metric: str, step: Any, items: int, recomputed: float, recorded: float
) -> str | None:
    """What differs between an items file and the evaluation its run.json records: the step,
    the number of items (a file tiled or cut keeps its ratios), or the metric its sums give."""
    if step != block.get("step"):
        return f"its step is {step}, the record's {block.get('step')}"
    if block.get("items") is not None and items != block["items"]:
        return f"it holds {items:,} items, the record {block['items']:,}"
    if not math.isclose(recomputed, recorded, rel_tol=1e-9, abs_tol=1e-9):
        return f"its sums give {metric} {recomputed:.6g}, the record {recorded:.6g}"
    return None


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
    reference: str = "fp32"
    # the verdict's kind, one of DECISIONS
    decision: str = "no verdict"
    tolerance_source: str = ""  # where the tolerance comes from (compare.tolerance_setting)
    tolerance_rule: str = ""  # how a relative one became a number (compare.tolerance_rule)

    @property
    def seed_part(self) -> float | None:
        """The seeds' share of the variance of the mean difference, s²/n."""
        return None if self.sd is None or self.n < 2 else self.sd**2 / self.n


# The kinds of verdict, each at the level docs/report.md states (an interval at `confidence`):
# matches: the interval lies within ±X and holds 0 (an equivalence test, TOST, at
#   (1 − confidence)/2 per side);
# differs: the interval excludes 0 but is not wholly past X (within tolerance, or crossing it);
# worse / better: the interval lies wholly past X on that side;
# identical: every run scored every item exactly as its reference (the preset changes nothing);
# no verdict: the evidence cannot decide (the reason, and what would decide).
DECISIONS = ("matches", "differs", "worse", "better", "identical", "no verdict")
# the power a plan is made for: the chance that a preset whose true difference is 0 would
# read "matches" (docs/report.md, "Planning")
POWER = 0.8
# below this chance, seeds whose differences agree more closely than the evaluation set alone
# lets each vary (the interaction floor) are taken for runs the seed does not change
SPREAD_FLOOR_P = 0.001


@dataclass(frozen=True)
class EvalEvidence:
    """The evaluation set under a difference: its size, and its share of the uncertainty of the
    mean difference (None with the reason when unknown).

    `se` is the items' main effect, √((n·SE_sh² − mean SE_i²)/(n − 1)): the part of the mean's
    standard error that more seeds do not remove. `each_var − se²` is the seed × item part each
    seed's difference carries (σ_ab²/N), already inside the seeds' spread: the smallest spread
    seeds can show if they change the run at all."""

    items: int | None = None
    unit: str = "items"
    se: float | None = None
    problem: str | None = "no per-item record"
    shared_var: float | None = None  # SE_sh²: bootstrap variance of d̄, one draw for all seeds
    each_var: float | None = None  # mean_i SE_i²: each seed's own bootstrap variance of d_i
    data_items: int | None = None  # the items the evaluation data hold (the most a plan asks)
    identical: bool = False  # every run's per-item columns equal its reference's

    def half_width(self, confidence: float) -> float | None:
        """The interval the evaluation set alone would allow (normal quantile)."""
        return None if self.se is None else z_quantile(confidence) * self.se

    @property
    def interaction(self) -> float:
        """σ_ab²/N: the variance each seed's difference has from its items alone."""
        if self.each_var is None or self.se is None:
            return 0.0
        return max(0.0, self.each_var - self.se**2)


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
        tolerance_for(settings, metric, ref_mean, _first(preset_runs["experiment"])),
        n_diverged,
        len(preset_runs),
        "",
        confidence=settings.confidence,
        reference=settings.reference,
        tolerance_source=tolerance_setting(settings, metric, _first(preset_runs["experiment"]))[1],
        tolerance_rule=tolerance_rule(
            settings, metric, ref_mean, _first(preset_runs["experiment"])
        ),
    )
    if n >= 2:
        with np.errstate(over="ignore", invalid="ignore"):  # a metric near 1e308 gives inf
            delta.sd = float(np.std(np.asarray(diffs, dtype=float), ddof=1))
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
    """d̄ ± t(ν) · √(s²/n + V_items), V_items the items' main effect (EvalEvidence.se²) and ν by
    Welch–Satterthwaite on the two parts (n − 1 and N − 1 degrees of freedom); with the
    evaluation set's share unknown, the seeds' alone (t with n − 1); none from fewer than two
    seeds."""
    if d.mean is None or d.seed_part is None:
        return None, None
    items = d.evidence.items if d.evidence.se is not None else None
    half = half_width(d.seed_part, d.n, (d.evidence.se or 0.0) ** 2, items, d.confidence)
    return d.mean - half, d.mean + half


def half_width(
    seed_part: float, n: int, item_part: float, items: int | None, confidence: float
) -> float:
    """t(1 − α/2, ν) · √(seed_part + item_part), ν = (A + B)² / (A²/(n − 1) + B²/(N − 1))."""
    total = seed_part + item_part
    if total <= 0:
        return 0.0
    spread = seed_part**2 / (n - 1) if n > 1 else math.inf
    spread += item_part**2 / (items - 1) if items and items > 1 else 0.0
    dof = total**2 / spread if spread > 0 else math.inf
    return t_quantile(1 - (1 - confidence) / 2, dof) * math.sqrt(total)


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
    """The verdict's text; sets d.decision (one of DECISIONS)."""
    d.decision, text = _decide(d)
    return text


def _decide(d: Delta) -> tuple[str, str]:
    if d.n_diverged or d.n_nonfinite:  # an outcome the interval of the finite pairs would hide
        bad = [f"{d.n_diverged} of {d.n_seeds} seeds diverged"] if d.n_diverged else []
        if d.n_nonfinite:
            bad.append(f"{d.n_nonfinite} of {d.n_seeds} seeds ended with a non-finite {d.metric}")
        return "worse", "worse: " + ", ".join(bad)
    if d.n == 0:
        return (
            "no verdict",
            "no paired seeds: none completed with a finite metric under both presets",
        )
    ref = reference_name(d.reference)
    if d.evidence.identical and d.n >= MIN_SEEDS and not _untrained_or_conflicting(d):
        return "identical", (
            f"identical to {ref} on every item on this device (the preset changes nothing here)"
        )
    why = no_verdict_reason(d)
    if why:
        return "no verdict", f"no verdict: {why}"
    tol = d.tolerance
    shown = "?" if tol is None else tolerance_text(tol)
    low, high = d.low, d.high
    side = "better" if (low > 0) == d.higher_is_better else "worse"  # when 0 is outside
    if tol is not None and -tol <= low and high <= tol:
        if low <= 0 <= high:
            return "matches", f"matches {ref} (CI within ±{shown})"
        return "differs", f"differs within tolerance: {side} than {ref}, by less than {shown}"
    if tol is not None and (low > tol or high < -tol):
        return side, f"{side}: by more than {shown} (CI wholly past it)"
    if low > 0 or high < 0:
        return "differs", (
            f"differs: {side} than {ref}; whether by more than {shown} is not resolved "
            f"(CI crosses it); {resolution(d)}"
        )
    return "no verdict", f"no verdict: CI wider than ±{shown}; {resolution(d)}"


def reference_name(reference: str) -> str:
    return "FP32" if reference == "fp32" else reference


def tolerance_text(tol: float) -> str:
    """0.5, 1000, 5.89, 0.00951: three significant digits at most (a relative tolerance is a
    product of a percentage and a mean; more digits would claim a precision it does not have)."""
    return f"{float(f'{tol:.3g}'):g}"


def tolerance_said(d: Delta) -> str:
    """A tolerance with where it comes from: `±0.00951 (2% of the fp32 mean 0.475;
    comparison.yaml's default for any metric)`, `±1.5 (comparison.yaml's entry for demo: ...)`."""
    if d.tolerance is None:
        return ""
    origin = "; ".join(p for p in (d.tolerance_rule, d.tolerance_source) if p)
    return f"±{tolerance_text(d.tolerance)}" + (f" ({origin})" if origin else "")


def _untrained_or_conflicting(d: Delta) -> bool:
    return bool(d.n_untrained or d.n_conflicting)


def no_verdict_reason(d: Delta) -> str | None:
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
    if not (math.isfinite(d.mean or 0.0) and math.isfinite(d.sd or 0.0)):
        return "the paired differences overflow (a metric near the float range's end)"
    flat = _too_little_spread(d)
    if flat:
        return flat
    if d.evidence.se is None:
        return f"the evaluation set's own sampling error is unknown ({d.evidence.problem})"
    if d.low is None or d.high is None:
        return "no interval"
    return None


def _too_little_spread(d: Delta) -> str | None:
    """Seeds whose differences vary less than chance allows, judged against a floor (never by
    an exact comparison): with per-item records, the seed × item variance each seed's
    difference has from its items alone (a χ² test of s² against it at SPREAD_FLOOR_P); without
    them, rounding (a spread below 1e-9 of the difference's size)."""
    from scipy.special import chdtr

    sd, floor = d.sd or 0.0, d.evidence.interaction
    if floor > 0:
        chance = float(chdtr(d.n - 1, (d.n - 1) * sd**2 / floor))
        if chance >= SPREAD_FLOOR_P:
            return None
        said = (
            f"the {d.n} paired differences (sd {sd:.3g}) vary less than their evaluation set "
            f"alone makes each seed's vary (sd {math.sqrt(floor):.3g}; a chance of {chance:.1g})"
        )
    elif sd > 1e-9 * max(1.0, abs(d.mean or 0.0)):
        return None
    else:
        said = f"the {d.n} paired differences have no spread (all {d.mean:+.4g})"
    return f"{said}: check that the seed changes the runs (data order, initialisation)"


# -- planning --------------------------------------------------------------------------------
def resolution(d: Delta) -> str:
    """What would resolve the tolerance, planned for POWER: the seeds and items with which a
    preset whose true difference is 0 would read "matches" with that chance (the interval's
    half-width plus the mean's own error within X: SE · (t + z_POWER) ≤ X, the power of a TOST
    at a true difference of 0). Seeds are planned against the part seeds remove (the seed
    variance, and the seed × item part at the items evaluated), items against the part only
    items remove (the items' main effect). Never more items than the evaluation data hold:
    beyond them, the tolerance that can be resolved."""
    tol, ev = d.tolerance, d.evidence
    if not tol or tol <= 0:
        return "a tolerance of 0 cannot be resolved"
    plan = Plan.of(d)
    seeds = plan.seeds_for(tol, 1.0)
    if seeds is not None:
        return f"about {seeds} seeds would resolve ±{tolerance_text(tol)} ({plan.said})"
    held = f"the evaluation set's {ev.items:,} {ev.unit} alone leave ±{plan.item_half(1.0):.3g}"
    most = (ev.data_items or ev.items) / ev.items
    for scale in (1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128):
        if scale > most:
            break
        seeds = plan.seeds_for(tol, scale)
        if seeds is not None:
            return (
                f"{held}, more than seeds remove: about {seeds} seeds and "
                f"{math.ceil(scale * ev.items):,} {ev.unit} would ({plan.said})"
            )
    n = max(d.n, MIN_SEEDS)
    reach = plan.needed(n, min(most, 128.0))
    return (
        f"{held}: ±{tolerance_text(tol)} cannot be resolved on this data (its evaluation data "
        f"hold {ev.data_items or ev.items:,} {ev.unit}); with {n} seeds a tolerance of "
        f"±{reach:.2g} can be, with {4 * n} ±{plan.needed(4 * n, min(most, 128.0)):.2g}"
    )


@dataclass(frozen=True)
class Plan:
    """The variance parts of a difference, as more seeds (n) and items (×scale) would change
    them: seed variance σ_a², seed × item σ_ab²/N, items' main effect σ_b²/N."""

    seed_var: float
    interaction: float
    item_var: float
    items: int
    confidence: float

    @classmethod
    def of(cls, d: Delta) -> Plan:
        ev = d.evidence
        interaction = ev.interaction
        seed_var = max(0.0, (d.sd or 0.0) ** 2 - interaction)
        return cls(seed_var, interaction, (ev.se or 0.0) ** 2, ev.items or 0, d.confidence)

    @property
    def said(self) -> str:
        return (
            f"{POWER:.0%} power if the true difference is 0, at the spread observed: seeds "
            f"sd {math.sqrt(self.seed_var + self.interaction):.3g}, items ±"
            f"{self.item_half(1.0):.3g}"
        )

    def se(self, n: int, scale: float) -> tuple[float, float]:
        seed_part = (self.seed_var + self.interaction / scale) / n
        return seed_part, self.item_var / scale

    def needed(self, n: int, scale: float) -> float:
        """The tolerance resolved with POWER at n seeds and scale × the items."""
        seed_part, item_part = self.se(n, scale)
        items = math.ceil(scale * self.items) if self.items else None
        half = half_width(seed_part, n, item_part, items, self.confidence)
        return half + z_quantile(POWER) * math.sqrt(seed_part + item_part)

    def seeds_for(self, tol: float, scale: float) -> int | None:
        return _plan(lambda n: self.needed(n, scale) <= tol)

    def item_half(self, scale: float) -> float:
        return z_quantile(self.confidence) * math.sqrt(self.item_var / scale)


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
