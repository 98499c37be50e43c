"""Seeds -> one row per setting: mean, sample standard deviation and count of every number.

Only completed runs enter the means; diverged runs are counted and their steps (and first
non-finite layers) kept, because the tables show them as the paper does ("diverged at step N").
"""

from __future__ import annotations

import pandas as pd

from mpt_repro import catalog
from mpt_repro.report.collect import COST_FIELDS, GROUP_KEYS


def preset_configs(frame: pd.DataFrame) -> dict[str, dict]:
    """Preset name -> the precision config its records hold (what the preset did)."""
    if "precision_config" not in frame:
        return {}
    out = {}
    for preset, config in zip(frame["precision"], frame["precision_config"]):
        if isinstance(config, dict) and preset not in out:
            out[preset] = config
    return out


def preset_order(presets, frame: pd.DataFrame | None = None) -> list[str]:
    """Presets in the display order (mpt_repro.catalog.preset_sort_key), placed by the
    configs in `frame`'s records where it has them, else by conf/precision/."""
    return catalog.preset_order(presets, preset_configs(frame) if frame is not None else None)


def value_columns(runs: pd.DataFrame) -> list[str]:
    return [c for c in runs.columns if c.startswith("metric_")] + [
        c for c in COST_FIELDS if c in runs.columns
    ]


def _sorted_unique(values) -> list:
    return sorted({v for v in values if v is not None and v == v})


# the columns of a group beside its keys and its statistics
COUNT_COLUMNS = (
    "group_label",
    "row_label",
    "n_completed",
    "n_nonfinite",
    "n_untrained",
    "flagged",
    "n_diverged",
    "diverged_steps",
    "diverged_layers",
)


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per GROUP_KEYS: n_completed, n_nonfinite (completed with a non-finite primary
    metric: not averaged), n_untrained (completed with every step skipped), flagged ({metric:
    completed runs where it is not finite}), n_diverged, diverged_steps, diverged_layers,
    <col>_mean/_std/_count, and the group's labels."""
    if runs.empty:
        return pd.DataFrame(columns=[*GROUP_KEYS, *COUNT_COLUMNS])
    values = value_columns(runs)
    # groupby(dropna=False): a key never vanishes because a field was empty
    done = runs[runs["status"] == "completed"]
    numbers = done[GROUP_KEYS + values].copy()
    numbers[values] = numbers[values].apply(pd.to_numeric, errors="coerce")
    stats = numbers.groupby(GROUP_KEYS, dropna=False)[values].agg(["mean", "std", "count"])
    stats.columns = [f"{col}_{stat}" for col, stat in stats.columns]
    completed = done.groupby(GROUP_KEYS, dropna=False).agg(
        n_completed=("seed", "size"),
        n_nonfinite=("primary_finite", lambda s: int((~s.astype(bool)).sum())),
        flagged=("nonfinite", _count_names),
        n_untrained=("untrained", lambda s: int(s.fillna(False).astype(bool).sum())),
    )

    diverged = runs[runs["status"] == "diverged"]
    div = diverged.groupby(GROUP_KEYS, dropna=False).agg(
        n_diverged=("seed", "size"),
        diverged_steps=("diverged_at_step", lambda s: sorted(int(x) for x in s.dropna())),
        diverged_layers=("diverged_layer", _sorted_unique),
    )
    # the metric's name and direction (from any run that has them: a run that diverged before its
    # task was built may not), for captions; the preset's config, for the column order
    meta_cols = [
        c
        for c in (
            "primary_metric",
            "higher_is_better",
            "peak_memory_kind",
            "precision_config",
            "recipe",
            "group_label",
            "row_label",
            "recipe_changes",
            "slow_fp16",
        )
        if c in runs.columns
    ]
    meta = runs.groupby(GROUP_KEYS, dropna=False)[meta_cols].first()

    out = pd.concat([meta, completed, div, stats], axis=1)
    for col in ("n_completed", "n_nonfinite", "n_untrained", "n_diverged"):
        out[col] = out[col].fillna(0).astype(int)
    for col in ("diverged_steps", "diverged_layers"):
        out[col] = out[col].apply(lambda s: s if isinstance(s, list) else [])
    out["flagged"] = out["flagged"].apply(lambda d: d if isinstance(d, dict) else {})
    return out.reset_index()


def _count_names(values) -> dict[str, int]:
    """{metric: how many runs list it} from comma-joined names ("loss,top5")."""
    counts: dict[str, int] = {}
    for text in values:
        for name in str(text or "").split(","):
            if name:
                counts[name] = counts.get(name, 0) + 1
    return counts
