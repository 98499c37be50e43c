"""The report's tables, as DataFrames of display strings with a title and a caption.

Each table holds the runs of one setting (budget, data set, device), and its caption says what
that setting can and cannot show: a smoke or synthetic run is never presented as a reproduction
of the paper's number. Cells are formatted once here, so the Markdown, CSV and LaTeX outputs
show the same strings.

Nothing here lists presets, experiments, budgets or tasks: the paper's tables take their rows from
paper_reference.csv, the presets come from the records (ordered by what they do), budgets from
conf/budget/, and every task the records name gets a table (a task without a presentation of its
own gets the generic one: every numeric final metric per preset).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from mpt_repro.report import names
from mpt_repro.report.aggregate import preset_order
from mpt_repro.report.reference import (
    cite,
    claims_for,
    load_reference,
    paper_table,
    table1_reference,
)

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


def diverged_text(steps: list[int], n_diverged: int, layers: list[str] | None = None) -> str:
    """The paper marks diverging runs; so do we, with the step the trainer stopped at and, when
    the record knows it, the first layer whose gradient went non-finite."""
    if not n_diverged:
        return ""
    text = "diverged"
    if steps:
        distinct = sorted(set(steps))
        word = "step" if len(distinct) == 1 else "steps"
        text += f" at {word} {', '.join(str(s) for s in distinct)}"
    if layers:
        word = "layer" if len(layers) == 1 else "layers"
        text += f" ({word} {', '.join(layers)})"
    return text


def group_diverged_text(group: pd.Series) -> str:
    return diverged_text(
        list(group.get("diverged_steps") or []),
        int(group.get("n_diverged", 0) or 0),
        list(group.get("diverged_layers") or []),
    )


def result_cell(group: pd.Series | None, column: str, decimals: int) -> str:
    """A group's value of `column` (metric_top1, ...), with its diverged seeds and the completed
    seeds whose value is not finite, so no outcome is hidden behind a mean."""
    if group is None:
        return ""
    stat = fmt_stat(
        group.get(f"{column}_mean"),
        group.get(f"{column}_std"),
        group.get(f"{column}_count"),
        decimals,
    )
    n_done = int(group.get("n_completed", 0) or 0)
    n_div = int(group.get("n_diverged", 0) or 0)
    n_nan = int(group.get("n_nonfinite", 0) or 0) if column.startswith("metric_") else 0
    total = n_done + n_div
    parts = [stat] if stat else []
    if n_nan:
        parts.append(f"{n_nan} of {total} non-finite" if stat or n_div else "non-finite")
    if n_div:
        div = group_diverged_text(group)
        parts.append(f"{n_div} of {total} {div}" if parts else div)
    return "; ".join(parts)


def slugify(*parts: str) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9_]+", "-", str(p)).strip("-").lower() for p in parts)


# ---------------------------------------------------------------- captions


def comparable(budget: str, data: str, experiment: str) -> bool:
    """Only the experiment's full recipe (a budget that trims nothing, conf/budget/) on the data
    set its recipe names (the paper's) can be set against the paper's number."""
    own = names.own_data(experiment)
    return own is not None and data == own and names.full_recipe(budget, experiment)


def verdict(budget: str, data: str, paper_experiment: str | None = None) -> str:
    """What numbers from this setting can show. `paper_experiment`: a paper row of the table,
    whose recipe and data decide whether the setting is the paper's."""
    known = names.budgets().get(budget)
    if data == "synthetic":
        return (
            "random inputs check the pipeline and the speed; accuracy means nothing, "
            "not comparable with the paper"
        )
    if known is None:
        return f"budget {budget!r} is not in conf/budget/, not comparable with the paper"
    if known.trims:
        return f"{known.description or 'a trimmed recipe'}; not comparable with the paper"
    if paper_experiment is None:
        return "the experiment's full recipe"
    if comparable(budget, data, paper_experiment):
        return "the full recipe on the paper's data set: comparable with the paper's numbers"
    return "the full recipe on a substitute data set, not comparable with the paper's numbers"


def caption(budget: str, data: str, device: str, paper_experiment: str | None = None) -> str:
    return (
        f"budget={budget} on {data} data, device {device}: "
        f"{verdict(budget, data, paper_experiment)}."
    )


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


def _confidence(ref: pd.DataFrame) -> str:
    return "/".join(sorted(ref["confidence"].unique()))


# ---------------------------------------------------------------- the paper's tables


def recipe_notes(part: pd.DataFrame, ref: pd.DataFrame) -> list[str]:
    """Which network and optimizer produced our numbers (docs/recipes.md has every setting)."""
    if "recipe" not in part.columns:
        return []
    shown = []
    for _, paper in ref.iterrows():
        recipes = sorted(
            {str(r) for r in part.loc[part["experiment"] == paper["experiment"], "recipe"] if r}
        )
        if recipes:
            shown.append(f"{paper['label']}: {' / '.join(recipes)}")
    if not shown:
        return []
    return ["Networks and optimizers behind our numbers: " + "; ".join(shown) + "."]


def table1(agg: pd.DataFrame) -> list[Table]:
    """Paper Table 1 (ILSVRC12 top-1): paper FP32 and mixed next to ours, one table per setting."""
    ref = table1_reference()
    mine_all = agg[agg["experiment"].isin(ref["experiment"])]
    conf = _confidence(ref)
    tables = []
    for (budget, data, device), part in by_setting(mine_all):
        presets = preset_order(part["precision"], part)
        any_comparable = False
        rows = []
        for _, paper in ref.iterrows():
            mine = _lookup(part, paper["experiment"])
            ok = comparable(budget, data, paper["experiment"])
            any_comparable |= ok
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
            "top-1 on ILSVRC12 val (Caffe on V100; ResNet-50 in PyTorch); no loss scaling was "
            "needed."
        ]
        if not any_comparable:
            notes.append(
                f"{NOT_COMPARABLE}: this setting cannot be compared with the paper, so no "
                "difference is shown."
            )
        notes += recipe_notes(part, ref)
        tables.append(
            Table(
                slugify("table1", budget, data, device),
                "Table 1: ILSVRC12 classification, top-1 accuracy (%)",
                caption(budget, data, device, ref["experiment"].iloc[0]),
                pd.DataFrame(rows),
                notes,
            )
        )
    return tables


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


def versus_paper(entry: pd.Series, group: pd.Series | None, column: str, ok: bool) -> str:
    """Our result against one paper cell: a signed difference of means, or, where the paper
    reports an outcome ("diverges"), whether ours did the same; n/c where not comparable."""
    if group is None:
        return ""
    ours = _mean(group, column)
    n_div, n_done = int(group.get("n_diverged", 0) or 0), int(group.get("n_completed", 0) or 0)
    if not ok:
        return NOT_COMPARABLE if (not _nan(ours) or n_div) else ""
    if entry["outcome"] == "diverges":
        if n_div and not n_done:
            return "diverged, as in the paper"
        return f"{n_done} of {n_done + n_div} did not diverge" if n_done else ""
    if not _nan(entry["value"]):
        return fmt_signed(_diff(ours, entry["value"]), 1)
    return ""


def table2(agg: pd.DataFrame, runs: pd.DataFrame) -> list[Table]:
    """Paper Table 2 (PASCAL VOC 2007 test mAP): the paper's three columns (FP32 baseline, mixed
    without loss scaling, mixed with loss scaling) beside ours, every preset that ran, with
    "diverged at step N" where a run diverged; per-class AP in a second table."""
    ref = paper_table("table2")
    paper_rows = list(dict.fromkeys(ref["row"]))
    paper_columns = list(dict.fromkeys(ref["column"]))
    mine_all = agg[agg["experiment"].isin(paper_rows)]
    conf = _confidence(ref)
    col = f"metric_{DETECTION_METRIC}"
    tables = []
    for (budget, data, device), part in by_setting(mine_all):
        presets = preset_order(part["precision"], part)
        any_comparable = False
        rows = []
        for row_key in paper_rows:
            entries = ref[ref["row"] == row_key].set_index("column")
            mine = _lookup(part, row_key)
            ok = comparable(budget, data, row_key)
            any_comparable |= ok
            row = {"Model": entries["row_label"].iloc[0]}
            for column in paper_columns:
                e = entries.loc[column]
                heading = TABLE2_HEADINGS.get(column, column)
                row[f"paper: {heading} [{conf}]"] = e["outcome"] or e["value_text"]
            for p in presets:
                row[f"ours {p}"] = result_cell(mine.get(p), col, 1)
            for column in paper_columns:
                row[f"{column} vs paper"] = versus_paper(
                    entries.loc[column], mine.get(column), col, ok
                )
            fp32, mixed = _mean(mine.get("fp32"), col), _mean(mine.get("mixed"), col)
            row["Δ mixed − fp32 (ours)"] = fmt_signed(_diff(mixed, fp32), 1)
            rows.append(row)
        meaning = ", ".join(f"{TABLE2_HEADINGS.get(c, c)} = our {c}" for c in paper_columns)
        notes = [
            f"Paper values: {ref['source'].iloc[0]} of Micikevicius et al. 2018, mAP (%) on "
            "PASCAL VOC 2007 test, VGG-16 backbones; ours: VOC2007 11-point mAP@0.5 (%), the "
            "metric of the paper's era. Paper columns: "
            f"{meaning}. `vs paper`: our mean minus the paper's value.",
        ]
        notes += [n for r in paper_rows for n in claim_notes(r)]
        if not any_comparable:
            notes.append(
                f"{NOT_COMPARABLE}: this setting cannot be compared with the paper, so no "
                "difference is shown."
            )
        tables.append(
            Table(
                slugify("table2", budget, data, device),
                "Table 2: PASCAL VOC 2007 detection, mAP (%)",
                caption(budget, data, device, paper_rows[0]),
                pd.DataFrame(rows),
                notes,
            )
        )
        detail = per_class_table(runs, paper_rows, budget, data, device)
        if detail is not None:
            tables.append(detail)
    return tables


def per_class_table(
    runs: pd.DataFrame, experiments: list[str], budget: str, data: str, device: str
) -> Table | None:
    """Per-class AP (mean over completed seeds) from metrics_detail.per_class_ap: one row per
    class, one column per experiment and preset."""
    if "metrics_detail" not in runs:
        return None
    part = runs[
        runs["experiment"].isin(experiments)
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
        cell = values.setdefault((run["experiment"], run["precision"]), {})
        for name, ap in per_class.items():
            if isinstance(ap, (int, float)) and not isinstance(ap, bool) and math.isfinite(ap):
                cell.setdefault(str(name), []).append(float(ap))
    if not values:
        return None
    presets = preset_order({p for _, p in values}, part)
    columns = [(e, p) for e in experiments for p in presets if (e, p) in values]
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
        caption(budget, data, device, experiments[0]),
        pd.DataFrame(rows),
        ["Means over completed seeds; a diverged run has no AP."],
    )


# ---------------------------------------------------------------- every task's own table


def metric_table(
    part_all: pd.DataFrame, title: str, slug: str, decimals: int = 2, notes_for=None
) -> list[Table]:
    """Experiments as rows, presets as columns, each cell the primary metric (or 'diverged')."""
    tables = []
    for (budget, data, device), part in by_setting(part_all):
        presets = preset_order(part["precision"], part)
        rows, notes = [], []
        for experiment in sorted(part["experiment"].unique()):
            mine = _lookup(part, experiment)
            metric = next(
                (
                    g["primary_metric"]
                    for g in mine.values()
                    if isinstance(g["primary_metric"], str)
                ),
                None,
            )
            col = f"metric_{metric}"
            row = {"Experiment": experiment, "Metric": metric or ""}
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


def all_metrics_table(part_all: pd.DataFrame, title: str, slug: str, notes_for=None) -> list[Table]:
    """One row per experiment and preset: what happened (completed / diverged at step N) and
    every numeric final metric the records hold, in the order the records list them."""
    tables = []
    for (budget, data, device), part in by_setting(part_all):
        metrics = [
            c[len("metric_") : -len("_mean")]
            for c in part.columns
            if c.startswith("metric_") and c.endswith("_mean") and part[c].notna().any()
        ]
        rows, notes = [], []
        for experiment in sorted(part["experiment"].unique()):
            exp = part[part["experiment"] == experiment]
            mine = _lookup(part, experiment)
            for p in preset_order(mine, exp):
                g = mine[p]
                n_done = int(g["n_completed"])
                outcome = [f"{n_done} completed"] if n_done else []
                if g["n_diverged"]:
                    outcome.append(f"{int(g['n_diverged'])} {group_diverged_text(g)}")
                row = {"Experiment": experiment, "Preset": p, "Outcome": "; ".join(outcome)}
                for m in metrics:
                    row[m] = fmt_stat(
                        g.get(f"metric_{m}_mean"),
                        g.get(f"metric_{m}_std"),
                        g.get(f"metric_{m}_count"),
                        3,
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


@dataclass(frozen=True)
class Presentation:
    """How a task's table looks: a title, a file slug and a view (one primary-metric column per
    preset, or every final metric per preset)."""

    title: str
    slug: str
    view: Callable[..., list[Table]] = all_metrics_table


# Presentation only: a task missing here still gets a table (the generic view, PRESENTATION
# default). The paper rows of classification and detection are Tables 1 and 2, above.
PRESENTATION = {
    "classification": Presentation(
        "Other classification experiments (primary metric)", "classification", metric_table
    ),
    "language_model": Presentation("Language model: perplexity per preset", "lm", metric_table),
    "gan": Presentation("GAN: what ran, final losses", "gan"),
    "detection": Presentation("Other detection experiments (every final metric)", "detection"),
}


def task_tables(agg: pd.DataFrame, paper_rows: set[str]) -> list[Table]:
    """One table (per setting) for every task the records name, the paper's rows left out."""
    tables = []
    for task in sorted(agg["task"].dropna().unique()):
        part = agg[(agg["task"] == task) & ~agg["experiment"].isin(paper_rows)]
        if part.empty:
            continue
        shown = PRESENTATION.get(
            task, Presentation(f"{task}: every final metric per preset", slugify(task))
        )
        tables += shown.view(part, shown.title, shown.slug, notes_for=claim_notes)
    return tables


# ---------------------------------------------------------------- cost


def cost_table(agg: pd.DataFrame) -> list[Table]:
    """Wall time, throughput and peak memory, and their ratio to the same experiment's FP32."""
    tables = []
    for (budget, device), part in by_setting(agg, ("budget", "device")):
        rows = []
        for (experiment, data), exp in part.groupby(["experiment", "data"], sort=True):
            mine = {r["precision"]: r for _, r in exp.iterrows()}
            fp32 = mine.get("fp32")
            for p in preset_order(mine, exp):
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
        if names.budgets().get(budget) is None or names.budgets()[budget].trims:
            notes.append(
                "Below the full recipe start-up and first steps weigh heavily: compare ratios, "
                "not absolute speed (mpt-bench measures speed properly)."
            )
        if device.startswith("cpu"):
            notes.append(
                "On a CPU, peak memory is the process's maximum resident set size (Python and "
                "libraries included); a Hydra multirun runs its jobs in one process, so a later "
                "job carries the peak of the jobs before it."
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


# ---------------------------------------------------------------- the paper's other numbers


def paper_reference_table(name: str, title: str) -> Table:
    """One of the paper's tables as the paper prints it, labelled with its sources."""
    ref = paper_table(name)
    rows = []
    for _row, entries in ref.groupby("row", sort=False):
        cells = {"Model": entries["row_label"].iloc[0]}
        for _, e in entries.iterrows():
            cells[e["column"]] = e["outcome"] or e["value_text"]
        cells["Unit"] = entries["unit"].iloc[0]
        cells["Source"] = ", ".join(sorted({cite(e) for _, e in entries.iterrows()}))
        rows.append(cells)
    return Table(
        f"{name}_paper",
        title,
        "The paper's reference values; [P] primary text, [S] secondary notes, [U] unconfirmed.",
        pd.DataFrame(rows).fillna(""),
    )


def reference_tables() -> list[Table]:
    """The paper's Tables 2 and 3 as printed, and its qualitative claims, labelled."""
    claims = paper_table("claim")
    rows = [
        {"Subject": c["row_label"], "Preset": c["column"], "Claim": c["outcome"], "Source": cite(c)}
        for _, c in claims.iterrows()
    ]
    return [
        paper_reference_table("table2", "Paper Table 2: detection mAP, PASCAL VOC 2007 test"),
        paper_reference_table(
            "table3", "Paper Table 3: speech recognition CER (not run by this suite)"
        ),
        Table(
            "claims_paper",
            "The paper's qualitative claims",
            "The paper's statements, labelled with where they come from and how sure the "
            "reference is.",
            pd.DataFrame(rows),
        ),
    ]


def all_tables(agg: pd.DataFrame, runs: pd.DataFrame) -> list[Table]:
    ref = load_reference()
    paper_rows = set(ref.loc[ref["table"].isin(["table1", "table2"]), "row"])
    return [
        *table1(agg),
        *table2(agg, runs),
        *task_tables(agg, paper_rows),
        *cost_table(agg),
        *reference_tables(),
    ]
