"""The report's tables, as DataFrames of display strings with a title and a caption.

Each table holds the runs of one setting (budget, data set, device), and its caption says what
that setting can and cannot show: a smoke or synthetic run is never presented as a reproduction
of the paper's number. Cells are formatted once here, so the Markdown, CSV and LaTeX outputs
show the same strings.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

from mpt_repro.report.aggregate import preset_order
from mpt_repro.report.reference import cite, claims_for, load_reference, table1_reference

# the data set the paper's Table 1 used; only runs on it, at the paper budget, compare with it
PAPER_DATA = {"table1": "imagenet"}
NOT_COMPARABLE = "n/c"  # a difference with the paper that the setting cannot support


@dataclass
class Table:
    slug: str  # file stem of its CSV/LaTeX files
    title: str
    caption: str  # the setting behind the numbers, and what they can show
    frame: pd.DataFrame  # every cell a string; "" is a missing value
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- formatting


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_num(x, decimals: int) -> str:
    return "" if _nan(x) else f"{x:.{decimals}f}"


def fmt_signed(x, decimals: int) -> str:
    return "" if _nan(x) else f"{x:+.{decimals}f}"


def fmt_stat(mean, std, n, decimals: int) -> str:
    """`mean ± std (n=k)`; one seed has no spread, so it shows `mean (n=1)`."""
    if _nan(mean) or _nan(n) or n == 0:
        return ""
    if n == 1 or _nan(std):
        return f"{mean:.{decimals}f} (n={int(n)})"
    return f"{mean:.{decimals}f} ± {std:.{decimals}f} (n={int(n)})"


def diverged_text(steps: list[int], n_diverged: int) -> str:
    """The paper marks diverging runs; so do we, with the step the trainer stopped at."""
    if not steps:
        return "diverged" if n_diverged else ""
    distinct = sorted(set(steps))
    word = "step" if len(distinct) == 1 else "steps"
    return f"diverged at {word} {', '.join(str(s) for s in distinct)}"


def result_cell(group: pd.Series | None, column: str, decimals: int) -> str:
    """A group's value of `column` (metric_top1, ...), with its diverged seeds if any."""
    if group is None:
        return ""
    stat = fmt_stat(
        group.get(f"{column}_mean"),
        group.get(f"{column}_std"),
        group.get(f"{column}_count"),
        decimals,
    )
    n_div = int(group.get("n_diverged", 0))
    if not n_div:
        return stat
    div = diverged_text(group["diverged_steps"], n_div)
    if not stat:
        return div
    total = n_div + int(group["n_completed"])
    return f"{stat}; {n_div} of {total} {div}"


def slugify(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9_]+", "-", str(p)).strip("-").lower() for p in parts)


# ---------------------------------------------------------------- captions


def verdict(budget: str, data: str, paper_data: str | None) -> str:
    """What numbers from this setting can show; only the paper budget on the paper's data do."""
    if data == "synthetic":
        return (
            "random inputs check the pipeline and the speed; accuracy means nothing, "
            "not comparable with the paper"
        )
    if budget == "smoke":
        return "checks the pipeline, not comparable with the paper"
    if budget == "short":
        return "a few epochs on a subset show a trend, not comparable with the paper"
    if budget == "paper" and paper_data is not None and data == paper_data:
        return "the full recipe on the paper's data set: comparable with the paper's numbers"
    if budget == "paper":
        return "the full recipe on a substitute data set, not comparable with the paper's numbers"
    return f"budget {budget!r} is not one the reporter knows, not comparable with the paper"


def caption(budget: str, data: str, device: str, paper_data: str | None = None) -> str:
    return f"budget={budget} on {data} data, device {device}: {verdict(budget, data, paper_data)}."


def comparable(budget: str, data: str, paper_data: str | None) -> bool:
    return budget == "paper" and paper_data is not None and data == paper_data


def by_setting(agg: pd.DataFrame, keys=("budget", "data", "device")):
    """(setting tuple, rows) per setting, in a stable order."""
    if agg.empty:
        return []
    return list(agg.groupby(list(keys), sort=True))


def _lookup(part: pd.DataFrame, experiment: str) -> dict[str, pd.Series]:
    rows = part[part["experiment"] == experiment]
    return {r["precision"]: r for _, r in rows.iterrows()}


def _mean(group: pd.Series | None, column: str):
    return None if group is None else group.get(f"{column}_mean")


def _diff(a, b):
    return None if _nan(a) or _nan(b) else a - b


# ---------------------------------------------------------------- the tables


def table1(agg: pd.DataFrame) -> list[Table]:
    """Paper Table 1 (ILSVRC12 top-1): paper FP32 and mixed next to ours, one table per setting."""
    ref = table1_reference()
    mine_all = agg[agg["experiment"].isin(ref["experiment"])]
    conf = "/".join(sorted(ref["confidence"].unique()))
    tables = []
    for (budget, data, device), part in by_setting(mine_all):
        presets = preset_order(part["precision"])
        ok = comparable(budget, data, PAPER_DATA["table1"])
        rows = []
        for _, paper in ref.iterrows():
            mine = _lookup(part, paper["experiment"])
            row = {
                "Model": paper["label"],
                f"paper fp32 [{conf}]": paper["fp32_text"],
                f"paper mixed [{conf}]": paper["mixed_text"],
            }
            for p in presets:
                row[f"ours {p}"] = result_cell(mine.get(p), "metric_top1", 2)
            fp32, mixed = (
                _mean(mine.get("fp32"), "metric_top1"),
                _mean(mine.get("mixed"), "metric_top1"),
            )
            for name, ours, theirs in (
                ("fp32", fp32, paper["fp32"]),
                ("mixed", mixed, paper["mixed"]),
            ):
                row[f"Δ {name} vs paper"] = (
                    fmt_signed(_diff(ours, theirs), 2)
                    if ok
                    else (NOT_COMPARABLE if not _nan(ours) else "")
                )
            row["Δ mixed − fp32 (ours)"] = fmt_signed(_diff(mixed, fp32), 2)
            rows.append(row)
        notes = [
            f"Paper values: {ref['source'].iloc[0]} of Micikevicius et al. 2018, single-crop "
            "top-1 on "
            "ILSVRC12 val (Caffe on V100; ResNet-50 in PyTorch); no loss scaling was needed."
        ]
        if not ok:
            notes.append(
                f"{NOT_COMPARABLE}: this setting cannot be compared with the paper, so no "
                "difference is shown."
            )
        tables.append(
            Table(
                slugify("table1", budget, data, device),
                "Table 1: ILSVRC12 classification, top-1 accuracy (%)",
                caption(budget, data, device, PAPER_DATA["table1"]),
                pd.DataFrame(rows),
                notes,
            )
        )
    return tables


def metric_table(
    agg: pd.DataFrame,
    task: str,
    exclude: set[str],
    title: str,
    slug: str,
    decimals: int = 2,
    notes_for=None,
) -> list[Table]:
    """Experiments as rows, presets as columns, each cell the primary metric (or 'diverged')."""
    part_all = agg[(agg["task"] == task) & ~agg["experiment"].isin(exclude)]
    tables = []
    for (budget, data, device), part in by_setting(part_all):
        presets = preset_order(part["precision"])
        rows, notes = [], []
        for experiment in sorted(part["experiment"].unique()):
            mine = _lookup(part, experiment)
            metric = next(iter(mine.values()))["primary_metric"]
            col = f"metric_{metric}"
            row = {"Experiment": experiment, "Metric": metric}
            for p in presets:
                row[p] = result_cell(mine.get(p), col, decimals)
            row["Δ mixed − fp32"] = fmt_signed(
                _diff(_mean(mine.get("mixed"), col), _mean(mine.get("fp32"), col)), decimals
            )
            rows.append(row)
            if notes_for:
                notes += notes_for(experiment)
        tables.append(
            Table(
                slugify(slug, budget, data, device),
                title,
                caption(budget, data, device),
                pd.DataFrame(rows),
                notes,
            )
        )
    return tables


def claim_notes(experiment: str) -> list[str]:
    """The paper's qualitative claims about an experiment, labelled as the paper's."""
    return [
        f"Paper ({cite(c)}), {c['column']}: {c['outcome']} ({c['row_label']}; {c['note']})."
        for _, c in claims_for(experiment).iterrows()
    ]


def gan_table(agg: pd.DataFrame) -> list[Table]:
    """What ran and its final losses: the paper's DCGAN result is qualitative (samples)."""
    gans = agg[agg["task"] == "gan"]
    tables = []
    for (budget, data, device), part in by_setting(gans):
        # in the order the records list them (the trainer puts the main losses first)
        metrics = [
            c[len("metric_") : -len("_mean")]
            for c in part.columns
            if c.startswith("metric_") and c.endswith("_mean") and part[c].notna().any()
        ]
        rows, notes = [], []
        for experiment in sorted(part["experiment"].unique()):
            mine = _lookup(part, experiment)
            for p in preset_order(mine):
                g = mine[p]
                n_done = int(g["n_completed"])
                outcome = [f"{n_done} completed"] if n_done else []
                if g["n_diverged"]:
                    outcome.append(
                        f"{int(g['n_diverged'])} "
                        f"{diverged_text(g['diverged_steps'], g['n_diverged'])}"
                    )
                row = {"Experiment": experiment, "Preset": p, "Outcome": "; ".join(outcome)}
                for m in metrics:
                    row[m] = fmt_stat(
                        g.get(f"metric_{m}_mean"),
                        g.get(f"metric_{m}_std"),
                        g.get(f"metric_{m}_count"),
                        3,
                    )
                rows.append(row)
            notes += claim_notes(experiment)
        tables.append(
            Table(
                slugify("gan", budget, data, device),
                "DCGAN: what ran, final losses",
                caption(budget, data, device),
                pd.DataFrame(rows),
                notes,
            )
        )
    return tables


def cost_table(agg: pd.DataFrame) -> list[Table]:
    """Wall time, throughput and peak memory, and their ratio to the same experiment's FP32."""
    tables = []
    for (budget, device), part in by_setting(agg, ("budget", "device")):
        rows = []
        for (experiment, data), exp in part.groupby(["experiment", "data"], sort=True):
            mine = {r["precision"]: r for _, r in exp.iterrows()}
            fp32 = mine.get("fp32")
            for p in preset_order(mine):
                g = mine[p]
                speed, memory = _mean(g, "samples_per_s"), _mean(g, "peak_memory_bytes")
                rows.append(
                    {
                        "Experiment": experiment,
                        "Data": data,
                        "Preset": p,
                        "Runs": _runs_text(g),
                        "Wall time (s)": fmt_num(_mean(g, "wall_time_s"), 1),
                        "Samples/s": fmt_stat(
                            speed, g.get("samples_per_s_std"), g.get("samples_per_s_count"), 1
                        ),
                        "Samples/s ÷ fp32": fmt_num(_ratio(speed, _mean(fp32, "samples_per_s")), 2),
                        "Peak memory (MiB)": fmt_num(None if _nan(memory) else memory / 2**20, 1),
                        "Memory ÷ fp32": fmt_num(
                            _ratio(memory, _mean(fp32, "peak_memory_bytes")), 2
                        ),
                    }
                )
        kinds = sorted(set(part.get("peak_memory_kind", pd.Series(dtype=str)).dropna()) - {""})
        notes = [
            "Completed runs only; means over seeds. Ratios divide by the fp32 run of the same "
            "experiment, data and device."
        ]
        if budget != "paper":
            notes.append(
                "Below the paper budget start-up and first steps weigh heavily: compare ratios, "
                "not absolute speed."
            )
        if device.startswith("cpu"):
            notes.append(
                "On a CPU, peak memory is the process's maximum resident set size (Python and "
                "libraries "
                "included); a Hydra multirun runs its jobs in one process, so a later job carries "
                "the "
                "peak of the jobs before it."
            )
        memory = f"; memory measured as {', '.join(kinds)}" if kinds else ""
        tables.append(
            Table(
                slugify("cost", budget, device),
                "Cost: time, throughput and memory",
                f"budget={budget}, device {device}, data set per row{memory}.",
                pd.DataFrame(rows),
                notes,
            )
        )
    return tables


def _runs_text(group: pd.Series) -> str:
    """Completed runs, and the diverged ones that have no cost numbers here."""
    n_div = int(group["n_diverged"])
    return f"{int(group['n_completed'])}" + (f" ({n_div} diverged)" if n_div else "")


def _ratio(a, b):
    return None if _nan(a) or _nan(b) or b == 0 else a / b


def reference_tables() -> list[Table]:
    """The paper's other numbers (Tables 2 and 3, and its claims), labelled as the paper's."""
    ref = load_reference()
    tables = []
    for name, title in (
        ("table2", "Paper Table 2: detection mAP, PASCAL VOC 2007 test (not run by this suite)"),
        ("table3", "Paper Table 3: speech recognition CER (not run by this suite)"),
    ):
        part = ref[ref["table"] == name]
        rows = []
        for _row, entries in part.groupby("row", sort=False):
            cells = {"Model": entries["row_label"].iloc[0]}
            for _, e in entries.iterrows():
                cells[e["column"]] = e["outcome"] or e["value_text"]
            cells["Unit"] = entries["unit"].iloc[0]
            cells["Source"] = ", ".join(sorted({cite(e) for _, e in entries.iterrows()}))
            rows.append(cells)
        tables.append(
            Table(
                name + "_paper",
                title,
                "The paper's reference values, for completeness; "
                "[P] primary text, [S] secondary notes, [U] unconfirmed.",
                pd.DataFrame(rows).fillna(""),
            )
        )
    claims = ref[ref["table"] == "claim"]
    rows = [
        {"Subject": c["row_label"], "Preset": c["column"], "Claim": c["outcome"], "Source": cite(c)}
        for _, c in claims.iterrows()
    ]
    tables.append(
        Table(
            "claims_paper",
            "The paper's qualitative claims",
            "The paper's statements, labelled with where they come from and how sure the "
            "reference is.",
            pd.DataFrame(rows),
        )
    )
    return tables


def all_tables(agg: pd.DataFrame) -> list[Table]:
    ilsvrc = set(table1_reference()["experiment"])
    return [
        *table1(agg),
        *metric_table(
            agg,
            "classification",
            ilsvrc,
            "Other classification experiments (primary metric)",
            "classification",
        ),
        *metric_table(
            agg,
            "language_model",
            set(),
            "Language model: perplexity per preset",
            "lm",
            notes_for=claim_notes,
        ),
        *gan_table(agg),
        *cost_table(agg),
        *reference_tables(),
    ]
