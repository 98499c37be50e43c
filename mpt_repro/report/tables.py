"""The report's tables, as DataFrames of display strings with a title and a caption.

Each table holds the runs of one setting (budget, data set, device), and its caption says what
that setting can and cannot show: a smoke or synthetic run is never presented as a reproduction
of the paper's number. Cells are formatted once here, so the Markdown, CSV and LaTeX outputs
show the same strings.

Nothing here lists presets, experiments, budgets or tasks: the paper's tables take their rows from
paper_reference.csv, the presets come from the records (ordered by what they do), budgets from
conf/budget/, and every task the records name gets a table, as its plugin presents it
(mpt_repro/registry.py TaskReport: a task without one gets the generic view, every numeric final
metric per preset; the paper's Tables 1, 2 and 3 are built by the plugins that name them, and
shown, with the paper's claims, only beside the runs they are about).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from mpt_repro import catalog, registry
from mpt_repro.paper import (
    cite,
    claims_for,
    load_reference,
    paper_table,
)
from mpt_repro.record import SLOW_FP16_NOTE
from mpt_repro.report.aggregate import preset_order
from mpt_repro.report.collect import PAIR_KEYS
from mpt_repro.report.compare import (
    MIN_SEEDS,
    default_settings,
    delta_text,
    group_deltas,
    tolerance_said,
    tolerance_text,
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
    """A group's value of `column` (metric_top1, ...), with its diverged seeds, the completed
    seeds whose value is not finite (never averaged, never shown as a number) and the other
    metrics that came out non-finite, so no outcome is hidden behind a mean."""
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
    flagged = group.get("flagged") if column.startswith("metric_") else None
    metric = column.removeprefix("metric_")
    for name, count in sorted((flagged or {}).items()):
        if name != metric:
            parts.append(f"{name} non-finite in {count} of {total}")
    n_untrained = int(group.get("n_untrained", 0) or 0) if column.startswith("metric_") else 0
    if n_untrained:  # every step skipped: the number is the untrained model's
        parts.append(f"{n_untrained} of {total} applied no step")
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
    own = catalog.own_data(experiment)
    return own is not None and data == own and catalog.full_recipe(budget, experiment)


def verdict(
    budget: str, data: str, paper_experiment: str | None = None, changed: list[str] = ()
) -> str:
    """What numbers from this setting can show. `paper_experiment`: a paper row of the table,
    whose recipe and data decide whether the setting is the paper's; `changed`: the recipe
    changes of the table's groups (overrides such as trainer.max_steps=300), whose rows are never
    the full recipe."""
    known = catalog.budgets().get(budget)
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
        said = "the experiment's full recipe"
    elif comparable(budget, data, paper_experiment):
        said = "the full recipe on the paper's data set: comparable with the paper's numbers"
    else:
        said = "the full recipe on a substitute data set, not comparable with the paper's numbers"
    if changed:  # a capped run is never captioned as the full recipe
        said += (
            f", except the rows labelled with a change ({', '.join(changed)}): their command "
            "line changed the recipe, so they are neither the full recipe nor comparable with "
            "the paper"
        )
    return said


def caption(
    budget: str,
    data: str,
    device: str,
    paper_experiment: str | None = None,
    part: pd.DataFrame | None = None,
) -> str:
    """The setting and what it can show; `part`: the table's groups (their recipe changes)."""
    return (
        f"budget={budget} on {data} data, device {device}: "
        f"{verdict(budget, data, paper_experiment, changes_of(part))}."
    )


def changes_of(part: pd.DataFrame | None) -> list[str]:
    """Every recipe change of the groups in `part` (aggregate rows or runs)."""
    if part is None or "recipe_changes" not in part:
        return []
    texts = part["recipe_changes"].fillna("")
    return sorted({c for text in texts for c in str(text).split(", ")} - {""})


def by_setting(agg: pd.DataFrame, keys=("budget", "data", "device")):
    """(setting tuple, rows) per setting, in a stable order."""
    if agg.empty:
        return []
    return list(agg.groupby(list(keys), sort=True))


@dataclass
class Row:
    """One comparison group of one subject in a setting: its label and its presets' groups."""

    label: str  # the subject, with the keys in which it differs from its other groups
    presets: dict[str, pd.Series]
    key: tuple  # the group's PAIR_KEYS values (deltas are looked up by it)


def group_rows(part: pd.DataFrame, experiment: str, own_model_only: bool = False) -> list[Row]:
    """The comparison groups of an experiment in one setting, unlabelled and own-model groups
    first. `own_model_only`: leave out runs of a custom model (not the paper's network)."""
    sub = part[part["experiment"] == experiment]
    if own_model_only:
        sub = sub[sub["subject"] == experiment]
    rows = []
    for _, group in sub.groupby(["subject", "comparison"], sort=False, dropna=False):
        first = group.iloc[0]
        presets = {r["precision"]: r for _, r in group.iterrows()}
        rows.append(Row(str(first["row_label"]), presets, tuple(first[k] for k in PAIR_KEYS)))
    rows.sort(key=lambda r: (r.key[1] != experiment, natural_key(r.label)))
    return rows


def changed(group: Row) -> bool:
    """Whether the group's command line changed its recipe (a cap on steps, data, evaluation):
    never set against the paper's number."""
    return any(str(g.get("recipe_changes") or "") for g in group.presets.values())


def natural_key(text: str) -> list:
    """`optim.lr=3` before `optim.lr=30` and `optim.lr=1e+308`: the numbers in a label compared
    as numbers, the rest as text."""
    parts = re.split(r"(-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)", text)
    return [(0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)]


Deltas = dict  # {PAIR_KEYS tuple: {preset: compare.Delta}}


def _delta(deltas: Deltas, row: Row, preset: str):
    return (deltas.get(row.key) or {}).get(preset)


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
    return ["Networks, optimizers and recipes behind our numbers: " + "; ".join(shown) + "."]


# what a "Δ ... (95% CI)" cell is, said under every table that has one
DELTA_NOTE = (
    "Δ ... − fp32: the mean over seeds run under both presets of (preset − fp32), with its 95% "
    "confidence interval and what it holds: `(n=3; 360 images)` is the variation over 3 paired "
    "seeds together with the sampling error of the 360 evaluated images (a bootstrap over the "
    "images), `(n=3; seeds only)` where the records keep no per-item results (then no verdict). "
    "Only runs whose configurations are equal but for the preset and the seed are compared (a "
    "row with [keys] is its own group). Verdicts, their tolerances and the method: "
    "docs/report.md."
)


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


def _delta_cells(deltas: Deltas, group: Row, decimals: int) -> dict[str, str]:
    """mixed's paired difference to fp32 with its interval, and the verdict."""
    delta = _delta(deltas, group, "mixed")
    return {
        "Δ mixed − fp32 (ours, 95% CI)": delta_text(delta, decimals),
        "mixed vs fp32": delta.verdict if delta else "",
    }


# ---------------------------------------------------------------- every task's own table


def per_setting(
    part_all: pd.DataFrame, title: str, slug: str, rows_of: Callable, notes_for=None
) -> list[Table]:
    """One table per setting (budget, data, device) of a task's runs: `rows_of(part, group)`
    gives the rows of each comparison group of each experiment; the paper's claims about the
    experiments (`notes_for`) and what a Δ cell is go under it."""
    tables = []
    for (budget, data, device), part in by_setting(part_all):
        rows, notes = [], []
        for experiment in sorted(part["experiment"].unique()):
            for group in group_rows(part, experiment):
                rows += rows_of(part, group)
            if notes_for:
                notes += notes_for(experiment)
        tables.append(
            Table(
                slugify(slug, budget, data, device),
                title,
                caption(budget, data, device, part=part),
                pd.DataFrame(rows),
                [*notes, DELTA_NOTE],
            )
        )
    return tables


def metric_table(
    part_all: pd.DataFrame,
    title: str,
    slug: str,
    deltas: Deltas,
    decimals: int = 2,
    notes_for=None,
) -> list[Table]:
    """One row per comparison group of each subject, presets as columns, each cell the primary
    metric (or what happened instead), and mixed's paired difference to fp32 with its CI."""

    def rows_of(part: pd.DataFrame, group: Row) -> list[dict]:
        mine = group.presets
        metric = next(
            (g["primary_metric"] for g in mine.values() if isinstance(g["primary_metric"], str)),
            None,
        )
        row = {"Experiment": group.label, "Metric": metric or ""}
        for p in preset_order(part["precision"], part):
            row[p] = result_cell(mine.get(p), f"metric_{metric}", decimals)
        delta = _delta(deltas, group, "mixed")
        row["Δ mixed − fp32 (95% CI)"] = delta_text(delta, decimals)
        row["mixed vs fp32"] = delta.verdict if delta else ""
        return [row]

    return per_setting(part_all, title, slug, rows_of, notes_for)


def all_metrics_table(
    part_all: pd.DataFrame, title: str, slug: str, deltas: Deltas, notes_for=None
) -> list[Table]:
    """One row per comparison group and preset: what happened (completed / diverged at step N)
    and every numeric final metric the records hold, in the order the records list them."""

    def rows_of(part: pd.DataFrame, group: Row) -> list[dict]:
        metrics = [
            c[len("metric_") : -len("_mean")]
            for c in part.columns
            if c.startswith("metric_") and c.endswith("_mean") and part[c].notna().any()
        ]
        rows = []
        for p in preset_order(group.presets, pd.DataFrame(list(group.presets.values()))):
            g = group.presets[p]
            row = {"Experiment": group.label, "Preset": p, "Outcome": _outcome_text(g)}
            for m in metrics:
                row[m] = fmt_stat(
                    g.get(f"metric_{m}_mean"),
                    g.get(f"metric_{m}_std"),
                    g.get(f"metric_{m}_count"),
                    3,
                )
            delta = _delta(deltas, group, p)
            row["Δ to fp32 (95% CI)"] = delta_text(delta, 3)
            row["vs fp32"] = delta.verdict if delta else ""
            rows.append(row)
        return rows

    return per_setting(part_all, title, slug, rows_of, notes_for)


def _outcome_text(g: pd.Series) -> str:
    """`2 completed; 1 diverged at step N; loss non-finite in 1 of 3` for one preset's group."""
    n_done = int(g["n_completed"])
    outcome = [f"{n_done} completed"] if n_done else []
    if g["n_diverged"]:
        outcome.append(f"{int(g['n_diverged'])} {group_diverged_text(g)}")
    flagged = g.get("flagged") or {}
    outcome += [f"{name} non-finite in {count}" for name, count in sorted(flagged.items())]
    return "; ".join(outcome)


def tolerance_notes(found: list) -> list[str]:
    """One line for the tolerances the verdicts used: each value, three significant digits at
    most, with where it comes from (comparison.yaml's entry for the experiment, its default, the
    command line) and, for a relative one, the rule that made it a number."""
    said = sorted({(d.metric, tolerance_said(d)) for d in found if d.tolerance is not None})
    if not said:
        return []
    return ["Tolerances: " + "; ".join(f"{metric} {text}" for metric, text in said) + "."]


def tolerance_cell(d) -> str:
    """The Tolerance column: the value, and the rule that made a relative one a number (where it
    comes from is in the notes under the table)."""
    if d.tolerance is None:
        return ""
    return f"±{tolerance_text(d.tolerance)}" + (
        f" ({d.tolerance_rule})" if d.tolerance_rule else ""
    )


def deltas_table(agg: pd.DataFrame, deltas: Deltas, settings) -> list[Table]:
    """Every preset against fp32, per setting: the paired difference of the primary metric with
    its confidence interval and the verdict against the paper's claim that mixed precision
    matches FP32."""
    tables = []
    for (budget, data, device), part in by_setting(agg):
        rows, used = [], []
        for experiment in sorted(part["experiment"].unique()):
            for group in group_rows(part, experiment):
                found = deltas.get(group.key) or {}
                for p in preset_order(found, pd.DataFrame(list(group.presets.values()))):
                    d = found[p]
                    used.append(d)
                    rows.append(
                        {
                            "Experiment": group.label,
                            "Metric": d.metric
                            + ("" if d.higher_is_better else " (lower is better)"),
                            "Preset": p,
                            "Seeds paired": str(d.n),
                            f"Δ to {settings.reference} ({settings.confidence:.0%} CI)": delta_text(
                                d, 3
                            ),
                            "Tolerance": tolerance_cell(d),
                            "Verdict": d.verdict,
                        }
                    )
        if not rows:
            continue
        tables.append(
            Table(
                slugify("vs_fp32", budget, data, device),
                f"Each preset against {settings.reference}: paired differences and verdicts",
                caption(budget, data, device, part=part),
                pd.DataFrame(rows),
                [
                    DELTA_NOTE,
                    "The paper's claim is that mixed precision matches FP32. A verdict needs at "
                    f"least {MIN_SEEDS} seeds of both presets (mpt-run -m ... seed=0,1,2), "
                    "differences that vary between seeds, and an interval, seeds and evaluation "
                    "set together, that the tolerance can decide; otherwise it says `no verdict`, "
                    "why, and what would give one.",
                    *tolerance_notes(used),
                ],
            )
        )
    return tables


def claim_notes(experiment: str) -> list[str]:
    """The paper's qualitative claims about an experiment, labelled as the paper's."""
    return [
        f"Paper ({cite(c)}), {c['column']}: {c['outcome']} ({c['row_label']}; {c['note']})."
        for _, c in claims_for(experiment).iterrows()
    ]


# how each view lays a task's runs out (a plugin's TaskReport names one)
VIEWS: dict[str, Callable[..., list[Table]]] = {
    "primary": metric_table,
    "metrics": all_metrics_table,
}


def task_tables(agg: pd.DataFrame, paper_rows: set[str], deltas: Deltas) -> list[Table]:
    """One table (per setting) for every task the records name, as its plugin presents it
    (mpt_repro/registry.TaskReport; a task without one gets the generic view: every numeric final
    metric per preset), the paper's own rows left out (a custom model trained with a paper
    experiment's recipe is not the paper's row: it is here)."""
    tables = []
    paper_own = agg["experiment"].isin(paper_rows) & (agg["subject"] == agg["experiment"])
    for task in sorted(agg["task"].dropna().unique()):
        shown = _task_report(task)
        if shown.view == "paper":  # its runs are all in the paper's table (paper_tables)
            continue
        part = agg[(agg["task"] == task) & ~paper_own]
        if part.empty:
            continue
        view = VIEWS.get(shown.view, all_metrics_table)
        tables += view(part, shown.title, shown.slug, deltas, notes_for=claim_notes)
    return tables


def _task_report(task: str) -> registry.TaskReport:
    found = registry.report_of(task) if task in registry.task_kinds() else None
    return found or registry.TaskReport(f"{task}: every final metric per preset", slugify(task))


def paper_tables(agg: pd.DataFrame, runs: pd.DataFrame, deltas: Deltas) -> list[Table]:
    """The paper's tables that plugins build beside their runs (their TaskReport's paper_table),
    each only where its task has runs, in the order of the paper's table ids."""
    present = set(agg["task"].dropna()) if "task" in agg else set()
    registered = [
        (r.paper_reference[0] if r.paper_reference else "", r.paper_table, kind in present)
        for kind, r in ((kind, registry.report_of(kind)) for kind in registry.task_kinds())
        if r is not None and r.paper_table
    ]
    builders = [target for _, target, ran in sorted(registered) if ran]
    return [t for target in builders for t in registry.resolve(target)(agg, runs, deltas)]


# ---------------------------------------------------------------- cost


# peak-memory kinds whose figure is the run's own (a ratio between runs means something);
# host_max_rss_process is the process's lifetime peak, which a sweep's later jobs inherit
OWN_PEAK = ("cuda_max_allocated", "host_peak_rss")


def cost_table(agg: pd.DataFrame) -> list[Table]:
    """Per comparison group: throughput, peak memory and the bytes saved for backward, each
    absolute and as a ratio to the same group's fp32 (a ratio only between runs that differ in
    precision alone)."""
    tables = []
    for (budget, device), part in by_setting(agg, ("budget", "device")):
        rows = []
        for (experiment, data), exp in part.groupby(["experiment", "data"], sort=True):
            for group in group_rows(exp, experiment):
                fp32 = group.presets.get("fp32")
                order = preset_order(group.presets, pd.DataFrame(list(group.presets.values())))
                rows += [_cost_row(group.label, data, p, group.presets[p], fp32) for p in order]
        kinds = set(part["peak_memory_kind"].dropna()) if "peak_memory_kind" in part else set()
        slow = slow_device(part)
        tables.append(
            Table(
                slugify("cost", budget, device),
                "Cost: time, throughput and memory",
                f"budget={budget}, device {device}, data set per row"
                + (f"; {SLOW_FP16_NOTE.format(why=slow)}." if slow else "."),
                pd.DataFrame(rows),
                _cost_notes(budget, kinds),
            )
        )
    return tables


def _cost_row(label: str, data: str, preset: str, g: pd.Series, fp32) -> dict[str, str]:
    kind = str(g.get("peak_memory_kind") or "")
    speed, memory = _mean(g, "samples_per_s"), _mean(g, "peak_memory_bytes")
    saved = _mean(g, "saved_bytes_per_sample")
    # a memory ratio only between figures that are each run's own
    base_kind = str((fp32 if fp32 is not None else g).get("peak_memory_kind") or "")
    own = kind in OWN_PEAK and base_kind in OWN_PEAK
    memory_ratio = fmt_num(_ratio(memory, _mean(fp32, "peak_memory_bytes")), 2)
    return {
        "Experiment": label,
        "Data": data,
        "Preset": preset,
        "Runs": _runs_text(g),
        "Wall time (s)": fmt_num(_mean(g, "wall_time_s"), 1),
        "Samples/s": fmt_stat(speed, g.get("samples_per_s_std"), g.get("samples_per_s_count"), 1),
        "Samples/s ÷ fp32": fmt_num(_ratio(speed, _mean(fp32, "samples_per_s")), 2),
        "Peak memory (MiB)": fmt_num(None if _nan(memory) else memory / 2**20, 1)
        + (f" ({kind})" if kind and not _nan(memory) else ""),
        "Peak memory ÷ fp32": memory_ratio if own else ("n/a" if not _nan(memory) else ""),
        "Saved for backward (MiB/sample)": fmt_num(None if _nan(saved) else saved / 2**20, 2),
        "Saved ÷ fp32": fmt_num(_ratio(saved, _mean(fp32, "saved_bytes_per_sample")), 2),
    }


def slow_device(part: pd.DataFrame) -> str:
    """Why the device of these rows has no fast FP16/BF16 arithmetic, or "" (collect.py)."""
    if "slow_fp16" not in part:
        return ""
    return next((str(x) for x in part["slow_fp16"].fillna("") if x), "")


def _cost_notes(budget: str, kinds: set[str]) -> list[str]:
    notes = [
        "Completed runs only; means over seeds. Each ratio divides by the fp32 runs of the "
        "same comparison group (equal configuration but for the preset and seed), data and "
        "device.",
        "Saved for backward: the bytes autograd keeps for the backward pass in one training "
        "step, per sample, counted on the run's first step (activations and weight copies); "
        "the same on any device, so it shows a recipe's memory effect on a CPU as well.",
    ]
    if catalog.budgets().get(budget) is None or catalog.budgets()[budget].trims:
        notes.append(
            "Below the full recipe start-up and first steps weigh heavily: compare ratios, "
            "not absolute speed (mpt-bench measures speed properly)."
        )
    if "host_peak_rss" in kinds:
        notes.append(
            "host_peak_rss: the process's peak resident set since the run began (Python and "
            "the libraries included), reset at each run's start, so a sweep's jobs do not "
            "inherit each other's peaks."
        )
    if kinds & {"host_max_rss_process", "host_max_rss"}:
        notes.append(
            "host_max_rss(_process): the process's lifetime peak (older records, or a system "
            "without /proc/self/clear_refs); a Hydra multirun's later jobs carry the peaks of "
            "the jobs before them, so no ratio is shown (n/a)."
        )
    return notes


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


def reference_tables(agg: pd.DataFrame) -> list[Table]:
    """The paper's tables as printed (those the plugins name: Tables 2 and 3) and its
    qualitative claims, labelled; each only where the runs it speaks about are here: a printed
    table beside runs of the task whose plugin names it, a claim beside runs of its experiment
    (paper_claims)."""
    present = set(agg["task"].dropna()) if "task" in agg else set()
    printed = sorted(
        r.paper_reference
        for r in (registry.report_of(kind) for kind in sorted(present & set(registry.task_kinds())))
        if r is not None and r.paper_reference
    )
    claims = paper_claims(agg)
    rows = [
        {"Subject": c["row_label"], "Preset": c["column"], "Claim": c["outcome"], "Source": cite(c)}
        for _, c in claims.iterrows()
    ]
    tables = [paper_reference_table(name, title) for name, title in printed]
    if rows:
        tables.append(
            Table(
                "claims_paper",
                "The paper's qualitative claims",
                "The paper's statements about the experiments of these runs, labelled with where "
                "they come from and how sure the reference is.",
                pd.DataFrame(rows),
            )
        )
    return tables


def paper_claims(agg: pd.DataFrame) -> pd.DataFrame:
    """The paper's claims about the runs here: a claim about an experiment where it has runs; a
    claim about a group of the paper's networks (a row of paper_reference.csv that is no
    experiment, such as the ILSVRC CNNs) where any of the paper's experiments has runs. A report
    of other experiments only (a plugin's, the demo) shows none."""
    claims = paper_table("claim")
    ran = set(agg["experiment"].dropna()) if "experiment" in agg else set()
    papers = set(load_reference()["row"])  # every experiment the paper's tables or claims name
    about_group = ~claims["row"].isin(set(catalog.experiments()))
    return claims[claims["row"].isin(ran) | (about_group & bool(ran & papers))]


def all_tables(agg: pd.DataFrame, runs: pd.DataFrame, settings=None, deltas=None) -> list[Table]:
    """Every table of the report (`deltas`: group_deltas of the runs, when already computed)."""
    settings = settings or default_settings()
    ref = load_reference()
    # the rows of the paper's tables: its own networks' runs are in those tables, not the generic
    paper_rows = set(ref.loc[ref["table"] != "claim", "row"])
    deltas = group_deltas(runs, settings) if deltas is None else deltas
    return [
        *paper_tables(agg, runs, deltas),
        *task_tables(agg, paper_rows, deltas),
        *deltas_table(agg, deltas, settings),
        *cost_table(agg),
        *reference_tables(agg),
    ]
