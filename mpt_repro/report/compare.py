"""Differences to FP32 with their uncertainty, and a verdict against the paper's claim.

Within one comparison group (the same subject, configuration but for precision and seed, budget,
data set and device: mpt_repro.report.collect), each preset's primary metric is paired with the
reference preset's (FP32) seed by seed. For n paired seeds the difference d_i = preset − FP32 has
mean d̄ and sample standard deviation s; the interval is d̄ ± t(1 − α/2, n − 1) · s / √n (Student
t, α = 1 − confidence). The verdict reads the interval against a tolerance X
(comparison.yaml):

- "matches FP32 (CI within ±X)": the whole interval lies in [−X, +X] (an equivalence test);
- "better" / "worse": the interval lies entirely on one side of zero and not within ±X, in the
  metric's direction (lower perplexity is better);
- "worse: k of n seeds diverged": the preset diverged where FP32 did not;
- "too few seeds (n=k)": fewer than two paired seeds, so there is no interval;
- "too few seeds to tell (CI wider than ±X)": the interval straddles zero and leaves ±X.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import pandas as pd

from mpt_repro.report.collect import PAIR_KEYS


@dataclass(frozen=True)
class Settings:
    reference: str
    confidence: float
    tolerance: dict[str, str]  # metric -> "0.5" (absolute) or "2%" (relative to the reference)


@lru_cache(maxsize=1)
def default_settings() -> Settings:
    from omegaconf import OmegaConf

    with resources.files("mpt_repro.report").joinpath("comparison.yaml").open() as f:
        raw = OmegaConf.to_container(OmegaConf.load(f))
    tolerance = {str(k): str(v) for k, v in raw["tolerance"].items()}
    return Settings(str(raw["reference"]), float(raw["confidence"]), tolerance)


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
    return Settings(settings.reference, settings.confidence, tolerance)


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


def t_quantile(p: float, dof: int) -> float:
    from scipy.stats import t

    return float(t.ppf(p, dof))


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


def paired_delta(
    preset_runs: pd.DataFrame, reference_runs: pd.DataFrame, settings: Settings
) -> Delta | None:
    """The paired difference of the primary metric (preset − reference) over common seeds."""
    metric = _first(preset_runs["primary_metric"]) or _first(reference_runs["primary_metric"])
    if metric is None:
        return None
    higher = bool(_first(preset_runs["higher_is_better"], True))
    column = f"metric_{metric}"

    def values(runs: pd.DataFrame) -> dict[int, float]:
        if column not in runs:
            return {}
        ok = runs[(runs["status"] == "completed") & runs["primary_finite"].astype(bool)]
        return {int(s): float(v) for s, v in zip(ok["seed"], ok[column])}

    mine, ref = values(preset_runs), values(reference_runs)
    seeds = sorted(set(mine) & set(ref))
    diffs = [mine[s] - ref[s] for s in seeds]
    ref_diverged = set(reference_runs.loc[reference_runs["status"] == "diverged", "seed"])
    n_diverged = int(
        ((preset_runs["status"] == "diverged") & ~preset_runs["seed"].isin(ref_diverged)).sum()
    )
    ref_mean = sum(ref.values()) / len(ref) if ref else None
    tol = tolerance_for(settings, metric, ref_mean)
    n = len(diffs)
    mean = sum(diffs) / n if n else None
    low = high = None
    if n >= 2:
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = t_quantile(1 - (1 - settings.confidence) / 2, n - 1) * sd / math.sqrt(n)
        low, high = mean - half, mean + half
    delta = Delta(
        str(_first(preset_runs["precision"])),
        metric,
        higher,
        n,
        mean,
        low,
        high,
        tol,
        n_diverged,
        len(preset_runs),
        "",
    )
    delta.n_untrained = len(set(seeds) & (_untrained(preset_runs) | _untrained(reference_runs)))
    ref_bad = ref_diverged | _nonfinite(reference_runs)
    delta.n_nonfinite = len(_nonfinite(preset_runs) - ref_bad)
    delta.verdict = verdict(delta)
    return delta


def _nonfinite(runs: pd.DataFrame) -> set[int]:
    """The seeds of completed runs whose primary metric is NaN or infinite."""
    bad = (runs["status"] == "completed") & ~runs["primary_finite"].astype(bool)
    return {int(s) for s in runs.loc[bad, "seed"]}


def _untrained(runs: pd.DataFrame) -> set[int]:
    """The seeds of completed runs that applied no optimizer step (every step skipped)."""
    if "untrained" not in runs:
        return set()
    return {int(s) for s in runs.loc[runs["untrained"].fillna(False).astype(bool), "seed"]}


def verdict(d: Delta) -> str:
    if d.n_diverged or d.n_nonfinite:  # an outcome the interval of the finite pairs would hide
        bad = [f"{d.n_diverged} of {d.n_seeds} seeds diverged"] if d.n_diverged else []
        if d.n_nonfinite:
            bad.append(f"{d.n_nonfinite} of {d.n_seeds} seeds ended with a non-finite {d.metric}")
        return "worse: " + ", ".join(bad)
    if d.n == 0:
        return "no paired seeds: none completed with a finite metric under both presets"
    if d.n_untrained:  # a comparison with a model that never stepped says nothing of precision
        return f"no verdict: {d.n_untrained} of {d.n} paired seeds applied no step"
    if d.low is None or d.high is None:
        return f"too few seeds (n={d.n})"
    tol = d.tolerance
    shown = "?" if tol is None else f"{tol:g}"
    if tol is not None and -tol <= d.low and d.high <= tol:
        return f"matches FP32 (CI within ±{shown})"
    better_side = d.low > 0 if d.higher_is_better else d.high < 0
    worse_side = d.high < 0 if d.higher_is_better else d.low > 0
    if better_side:
        return "better"
    if worse_side:
        return "worse"
    return f"too few seeds to tell (CI wider than ±{shown})"


def delta_text(d: Delta | None, decimals: int = 2) -> str:
    """`+0.12 [−0.30, +0.54] (n=3)`, `+0.12 (n=1)`, or the outcome when nothing pairs."""
    if d is None:
        return ""
    if d.mean is None:
        return "diverged" if d.n_diverged else "no paired seeds"
    text = f"{d.mean:+.{decimals}f}"
    if d.low is not None and d.high is not None:
        text += f" [{d.low:+.{decimals}f}, {d.high:+.{decimals}f}]"
    return f"{text} (n={d.n})"


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


def deltas_frame(runs: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """deltas.csv: one row per comparison group and preset, numbers unformatted."""
    columns = [
        *PAIR_KEYS,
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
        "verdict",
    ]
    labels = {}  # {comparison group: (group_label, row_label)}
    if not runs.empty:
        for _, r in runs.iterrows():
            key = tuple(r[k] for k in PAIR_KEYS)
            labels.setdefault(key, (r.get("group_label", ""), r.get("row_label", "")))
    rows = []
    for key, found in group_deltas(runs, settings).items():
        for preset, d in found.items():
            rows.append(
                {
                    **dict(zip(PAIR_KEYS, key)),
                    "group_label": labels.get(key, ("", ""))[0],
                    "row_label": labels.get(key, ("", ""))[1],
                    "preset": preset,
                    "reference": settings.reference,
                    "metric": d.metric,
                    "higher_is_better": d.higher_is_better,
                    "seeds_paired": d.n,
                    "delta_mean": d.mean,
                    "ci_low": d.low,
                    "ci_high": d.high,
                    "confidence": settings.confidence,
                    "tolerance": d.tolerance,
                    "seeds_diverged": d.n_diverged,
                    "seeds_nonfinite": d.n_nonfinite,
                    "seeds_untrained": d.n_untrained,
                    "verdict": d.verdict,
                }
            )
    return pd.DataFrame(rows, columns=columns)
