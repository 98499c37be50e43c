"""The paper's Table 1 (ILSVRC12 classification, top-1) beside our classification runs: mpt-report
calls table1 for the classification task (the paper_table of its TaskReport in
mpt_repro/experiments/classification.py), as it calls Tables 2 and 3 for detection and speech.
"""

from __future__ import annotations

import pandas as pd

from mpt_repro.paper import table1_reference
from mpt_repro.report.aggregate import preset_order
from mpt_repro.report.tables import (
    DELTA_NOTE,
    NOT_COMPARABLE,
    Deltas,
    Row,
    Table,
    _confidence,
    _delta_cells,
    _diff,
    _mean,
    _nan,
    by_setting,
    caption,
    changed,
    comparable,
    fmt_signed,
    group_rows,
    recipe_notes,
    result_cell,
    slugify,
)


def table1(agg: pd.DataFrame, runs: pd.DataFrame, deltas: Deltas) -> list[Table]:
    """Paper Table 1 (ILSVRC12 top-1): paper FP32 and mixed next to ours, one table per setting;
    one row per comparison group of each paper model (its own network only)."""
    ref = table1_reference()
    own = agg["experiment"].isin(ref["experiment"]) & (agg["subject"] == agg["experiment"])
    tables = []
    for (budget, data, device), part in by_setting(agg[own]):
        presets = preset_order(part["precision"], part)
        ok = {e: comparable(budget, data, e) for e in ref["experiment"]}
        rows = [
            _table1_row(
                paper,
                group,
                presets,
                ok[paper["experiment"]] and not changed(group),
                _confidence(ref),
                deltas,
            )
            for _, paper in ref.iterrows()
            for group in group_rows(part, paper["experiment"], own_model_only=True)
            or [Row("", {}, ())]
        ]
        notes = [
            f"Paper values: {ref['source'].iloc[0]} of Micikevicius et al. 2018, single-crop "
            "top-1 on ILSVRC12 val (Caffe on V100; ResNet-50 in PyTorch); no loss scaling was "
            "needed.",
            DELTA_NOTE,
        ]
        if not any(ok.values()):
            notes.append(
                f"{NOT_COMPARABLE}: this setting cannot be compared with the paper, so no "
                "difference with the paper is shown."
            )
        notes += recipe_notes(part, ref)
        tables.append(
            Table(
                slugify("table1", budget, data, device),
                "Table 1: ILSVRC12 classification, top-1 accuracy (%)",
                caption(budget, data, device, ref["experiment"].iloc[0], part),
                pd.DataFrame(rows),
                notes,
            )
        )
    return tables


def _table1_row(
    paper: pd.Series, group: Row, presets: list[str], ok: bool, conf: str, deltas: Deltas
) -> dict[str, str]:
    mine = group.presets
    row = {
        "Model": group.label.replace(paper["experiment"], paper["label"], 1) or paper["label"],
        f"paper fp32 [{conf}]": paper["fp32_text"],
        f"paper mixed [{conf}]": paper["mixed_text"],
    }
    for p in presets:
        row[f"ours {p}"] = result_cell(mine.get(p), "metric_top1", 2)
    for name in ("fp32", "mixed"):
        ours = _mean(mine.get(name), "metric_top1")
        row[f"Δ {name} vs paper"] = (
            fmt_signed(_diff(ours, paper[name]), 2)
            if ok
            else (NOT_COMPARABLE if not _nan(ours) else "")
        )
    return row | _delta_cells(deltas, group, 2)
