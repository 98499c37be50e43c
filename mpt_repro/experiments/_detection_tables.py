"""The paper's Table 2 (PASCAL VOC 2007 detection) beside our detection runs: mpt-report calls
table2 for the detection task (its TaskReport in mpt_repro/experiments/detection.py).
"""

from __future__ import annotations

import math

import pandas as pd

from mpt_repro.paper import paper_table
from mpt_repro.report.aggregate import preset_order
from mpt_repro.report.tables import (
    DELTA_NOTE,
    NOT_COMPARABLE,
    Deltas,
    Row,
    Table,
    _confidence,
    _delta_cells,
    by_setting,
    caption,
    changed,
    claim_notes,
    comparable,
    fmt_stat,
    group_rows,
    result_cell,
    slugify,
    versus_paper,
)

# the metric Table 2 compares, as the detection task writes it: VOC2007 11-point mAP@0.5, in %
DETECTION_METRIC = "map"
PER_CLASS_AP = "per_class_ap"  # metrics_detail.per_class_ap: {class name: AP in %}


# The paper's own headings of Table 2's columns (papers.md §1, Table 2), and the preset of ours that
# each one is: text, not numbers; the numbers are in paper_reference.csv
TABLE2_HEADINGS = {
    "fp32": "Baseline",
    "no_scaling": "MP without loss-scale",
    "mixed": "MP with loss-scale",
}


def table2(agg: pd.DataFrame, runs: pd.DataFrame, deltas: Deltas) -> list[Table]:
    """Paper Table 2 (PASCAL VOC 2007 test mAP): the paper's three columns (FP32 baseline, mixed
    without loss scaling, mixed with loss scaling) beside ours, every preset that ran, with
    "diverged at step N" where a run diverged; per-class AP in a second table."""
    ref = paper_table("table2")
    paper_rows = list(dict.fromkeys(ref["row"]))
    columns = list(dict.fromkeys(ref["column"]))
    own = agg["experiment"].isin(paper_rows) & (agg["subject"] == agg["experiment"])
    conf = _confidence(ref)
    tables = []
    for (budget, data, device), part in by_setting(agg[own]):
        presets = preset_order(part["precision"], part)
        ok = {r: comparable(budget, data, r) for r in paper_rows}
        rows = [
            _table2_row(
                ref[ref["row"] == r].set_index("column"),
                group,
                presets,
                ok[r] and not changed(group),
                conf,
            )
            | _delta_cells(deltas, group, 1)
            for r in paper_rows
            for group in group_rows(part, r, own_model_only=True) or [Row("", {}, ())]
        ]
        meaning = ", ".join(f"{TABLE2_HEADINGS.get(c, c)} = our {c}" for c in columns)
        notes = [
            f"Paper values: {ref['source'].iloc[0]} of Micikevicius et al. 2018, mAP (%) on "
            "PASCAL VOC 2007 test, VGG-16 backbones; ours: VOC2007 11-point mAP@0.5 (%), the "
            "metric of the paper's era. Paper columns: "
            f"{meaning}. `vs paper`: our mean minus the paper's value.",
            DELTA_NOTE,
        ]
        notes += [n for r in paper_rows for n in claim_notes(r)]
        if not any(ok.values()):
            notes.append(
                f"{NOT_COMPARABLE}: this setting cannot be compared with the paper, so no "
                "difference with the paper is shown."
            )
        tables.append(
            Table(
                slugify("table2", budget, data, device),
                "Table 2: PASCAL VOC 2007 detection, mAP (%)",
                caption(budget, data, device, paper_rows[0], part),
                pd.DataFrame(rows),
                notes,
            )
        )
        detail = per_class_table(runs, paper_rows, budget, data, device)
        if detail is not None:
            tables.append(detail)
    return tables


def _table2_row(
    entries: pd.DataFrame, group: Row, presets: list[str], ok: bool, conf: str
) -> dict[str, str]:
    """One model's row: the paper's columns, ours per preset, ours against each paper column."""
    col = f"metric_{DETECTION_METRIC}"
    paper_label = entries["row_label"].iloc[0]
    row = {"Model": group.label.replace(entries["row"].iloc[0], paper_label, 1) or paper_label}
    for column, e in entries.iterrows():
        row[f"paper: {TABLE2_HEADINGS.get(column, column)} [{conf}]"] = (
            e["outcome"] or e["value_text"]
        )
    for p in presets:
        row[f"ours {p}"] = result_cell(group.presets.get(p), col, 1)
    for column, e in entries.iterrows():
        row[f"{column} vs paper"] = versus_paper(e, group.presets.get(column), col, ok)
    return row


def per_class_table(
    runs: pd.DataFrame, experiments: list[str], budget: str, data: str, device: str
) -> Table | None:
    """Per-class AP (mean over completed seeds) from metrics_detail.per_class_ap: one row per
    class, one column per experiment and preset."""
    if "metrics_detail" not in runs:
        return None
    part = runs[
        runs["experiment"].isin(experiments)
        & (runs["subject"] == runs["experiment"])
        & (runs["budget"] == budget)
        & (runs["data"] == data)
        & (runs["device"] == device)
        & (runs["status"] == "completed")
    ]
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _, run in part.iterrows():
        detail = run["metrics_detail"]
        per_class = detail.get(PER_CLASS_AP) if isinstance(detail, dict) else None
        if not isinstance(per_class, dict):
            continue
        cell = values.setdefault((run["row_label"], run["precision"]), {})
        for name, ap in per_class.items():
            if isinstance(ap, (int, float)) and not isinstance(ap, bool) and math.isfinite(ap):
                cell.setdefault(str(name), []).append(float(ap))
    if not values:
        return None
    presets = preset_order({p for _, p in values}, part)
    labels = sorted({label for label, _ in values})
    columns = [(e, p) for e in labels for p in presets if (e, p) in values]
    classes = list(dict.fromkeys(c for key in columns for c in values[key]))
    rows = []
    for name in classes:
        row = {"Class": name}
        for e, p in columns:
            aps = values[(e, p)].get(name, [])
            row[f"{e} {p}"] = fmt_stat(
                sum(aps) / len(aps) if aps else None,
                pd.Series(aps).std() if len(aps) > 1 else None,
                len(aps),
                1,
            )
        rows.append(row)
    return Table(
        slugify("table2_per_class", budget, data, device),
        "Table 2 detail: per-class AP (%)",
        caption(budget, data, device, experiments[0], part),
        pd.DataFrame(rows),
        ["Means over completed seeds; a diverged run has no AP."],
    )
