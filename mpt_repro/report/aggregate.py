"""Seeds -> one row per setting: mean, sample standard deviation and count of every number.

Only completed runs enter the means; diverged runs are counted and their steps kept, because the
tables show them as the paper does ("diverged at step N").
"""

from __future__ import annotations

import pandas as pd

from mpt_repro.report.collect import COST_FIELDS, GROUP_KEYS

# presets in the order the tables show them; a preset not listed here goes after, by name
PRESET_ORDER = [
    "fp32",
    "tf32",
    "amp",
    "mixed",
    "no_master",
    "no_scaling",
    "fp16",
    "bf16",
    "adaptive",
]


def preset_order(names) -> list[str]:
    names = set(names)
    return [p for p in PRESET_ORDER if p in names] + sorted(names - set(PRESET_ORDER))


def value_columns(runs: pd.DataFrame) -> list[str]:
    return [c for c in runs.columns if c.startswith("metric_")] + [
        c for c in COST_FIELDS if c in runs.columns
    ]


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per GROUP_KEYS: n_completed, n_diverged, diverged_steps, <col>_mean/_std/_count."""
    if runs.empty:
        return pd.DataFrame(columns=[*GROUP_KEYS, "n_completed", "n_diverged", "diverged_steps"])
    values = value_columns(runs)
    # groupby(dropna=False): a key never vanishes because a field was empty
    done = runs[runs["status"] == "completed"]
    numbers = done[GROUP_KEYS + values].copy()
    numbers[values] = numbers[values].apply(pd.to_numeric, errors="coerce")
    stats = numbers.groupby(GROUP_KEYS, dropna=False)[values].agg(["mean", "std", "count"])
    stats.columns = [f"{col}_{stat}" for col, stat in stats.columns]
    completed = done.groupby(GROUP_KEYS, dropna=False).size().rename("n_completed")

    diverged = runs[runs["status"] == "diverged"]
    div = diverged.groupby(GROUP_KEYS, dropna=False).agg(
        n_diverged=("seed", "size"),
        diverged_steps=("diverged_at_step", lambda s: sorted(int(x) for x in s.dropna())),
    )
    # the metric's name and direction, for captions and "better" arrows
    meta_cols = [
        c for c in ("primary_metric", "higher_is_better", "peak_memory_kind") if c in runs.columns
    ]
    meta = runs.groupby(GROUP_KEYS, dropna=False)[meta_cols].first()

    out = pd.concat([meta, completed, div, stats], axis=1)
    out["n_completed"] = out["n_completed"].fillna(0).astype(int)
    out["n_diverged"] = out["n_diverged"].fillna(0).astype(int)
    out["diverged_steps"] = out["diverged_steps"].apply(lambda s: s if isinstance(s, list) else [])
    return out.reset_index()
