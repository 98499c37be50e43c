"""The paper's Table 3 (speech recognition) beside our speech runs: mpt-report calls table3 for
the speech task (its TaskReport in mpt_repro/experiments/speech.py).
"""

from __future__ import annotations

import pandas as pd

from mpt_repro.paper import paper_table
from mpt_repro.report.aggregate import preset_order
from mpt_repro.report.tables import (
    DELTA_NOTE,
    Deltas,
    Row,
    Table,
    _confidence,
    _delta_cells,
    by_setting,
    caption,
    group_rows,
    result_cell,
    slugify,
)

# the task whose runs Table 3 shows (the paper's DeepSpeech 2 rows are not experiments of ours:
# they are reference values beside our runs, labelled as such)
SPEECH_TASK = "speech"
SPEECH_METRICS = ("cer", "wer")  # run.json metrics of the speech task, in percent
OUR_DATA_DIFFERS = "paper; our data differs"


def table3(agg: pd.DataFrame, runs: pd.DataFrame, deltas: Deltas) -> list[Table]:
    """Paper Table 3 (speech recognition, CER %) rebuilt: the paper's rows labelled as the paper's
    (its data are Baidu's own, so never comparable with ours), then one row per comparison group
    of our speech runs: CER and WER per preset, and mixed's paired difference to fp32 (lower is
    better)."""
    ref = paper_table("table3")
    conf = _confidence(ref)
    tables = []
    for (budget, data, device), part in by_setting(agg[agg["task"] == SPEECH_TASK]):
        presets = preset_order(["fp32", "mixed", *part["precision"]], part)
        # the paper's rows in its order (groupby without sorting keeps the file's)
        rows = [
            _table3_paper_row(entries, presets, conf)
            for _, entries in ref.groupby("row", sort=False)
        ]
        for experiment in sorted(part["experiment"].unique()):
            for group in group_rows(part, experiment):
                rows.append(_table3_row(group, data, presets, deltas))
        tables.append(
            Table(
                slugify("table3", budget, data, device),
                "Table 3: speech recognition, character error rate (%, lower is better)",
                caption(budget, data, device, part=part),
                pd.DataFrame(rows).fillna(""),
                [
                    f"Paper values ({ref['source'].iloc[0]} of Micikevicius et al. 2018, "
                    f"[{conf}]): DeepSpeech 2 trained on Baidu's internal data (English "
                    "evaluated on WSJ eval '92, Mandarin on an internal test set), the mixed "
                    "column in pseudo FP16. Those data are not public: our runs use other data, "
                    "so only our mixed against our fp32 can be judged, never our CER against "
                    "the paper's.",
                    DELTA_NOTE,
                ],
            )
        )
    return tables


def _table3_paper_row(entries: pd.DataFrame, presets: list[str], conf: str) -> dict[str, str]:
    row = {"Model": f"paper: {entries['row_label'].iloc[0]}", "Data": OUR_DATA_DIFFERS}
    values = dict(zip(entries["column"], entries["value_text"]))
    for p in presets:
        row[f"CER {p}"] = f"{values[p]} [{conf}]" if p in values else ""
    return row


def _table3_row(group: Row, data: str, presets: list[str], deltas: Deltas) -> dict[str, str]:
    row = {"Model": f"ours: {group.label}", "Data": data}
    for metric in SPEECH_METRICS:
        for p in presets:
            row[f"{metric.upper()} {p}"] = result_cell(group.presets.get(p), f"metric_{metric}", 2)
    return row | _delta_cells(deltas, group, 2)
