"""PNG plots: training curves, differences to FP32 and loss-scale traces per comparison group,
cost ratios per budget and device.

What the plots promise: one colour (each of the presets its own), line style and marker per
preset, with a legend entry each, so that presets that overlap stay visible; the mean over seeds
as the line and the seeds' min-max as a band; a panel of the paired difference to FP32 with its
confidence band; only runs of one comparison group (equal configurations but for the preset and
seed) in one figure, its label in the title; nothing of a diverged run after the step it diverged
at; integer step ticks; percentages on axes from 0 labelled with %; bars on linear axes that start
at zero (a 1% difference looks like 1%), one panel per experiment (no axis shared by tasks with
different units); plain tick labels (no offset such as "+1e2" on a perplexity axis); a panel with
one point shows that point with a sensible axis. matplotlib runs headless (Agg): the reporter
must work over SSH and in CI.
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
import os
import pickle
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FixedLocator, MaxNLocator, ScalarFormatter  # noqa: E402

from mpt_repro import catalog  # noqa: E402
from mpt_repro.record import SLOW_FP16_NOTE  # noqa: E402
from mpt_repro.report.aggregate import preset_order  # noqa: E402
from mpt_repro.report.collect import PAIR_KEYS, Problem, load_metrics_csv  # noqa: E402
from mpt_repro.report.compare import MIN_SEEDS, tolerance_text  # noqa: E402
from mpt_repro.report.tables import slow_device, slugify  # noqa: E402

# line styles and markers cycle independently of the colours, so two presets never share both
LINESTYLES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def metric_unit(metric: str) -> str:
    """The unit the task that reports `metric` registered for it (its plugin's
    `registry.metric(...)`): "%" for a percentage, "" for a plain number or an unknown metric."""
    from mpt_repro import registry

    info = registry.metric_info(metric)
    return info.unit if info is not None else ""


def is_percent(metric: str) -> bool:
    """A percentage: its axes start at 0 and say %."""
    return metric_unit(metric) == "%"


def palette() -> list:
    """20 distinct colours: tab20's strong shades, then its light ones (14 presets today)."""
    colours = plt.get_cmap("tab20").colors
    return [*colours[0::2], *colours[1::2]]


def preset_styles(presets: list[str]) -> dict[str, dict]:
    """A colour, line style and marker per preset, the same in every figure: each preset keeps
    its place among all the presets conf/ knows (plus these), so fp32 looks alike everywhere and
    no two presets share a colour."""
    colours = palette()
    everyone = _display_order(tuple(sorted(presets)))
    return {
        p: {
            "color": colours[i % len(colours)],
            "linestyle": LINESTYLES[i % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)],
        }
        for i, p in enumerate(everyone)
        if p in presets
    }


@functools.cache
def _display_order(presets: tuple[str, ...]) -> list[str]:
    """Every preset conf/ knows, plus these, in display order: once per set of presets a report
    draws (placing a preset reads its config file, found through the plugins' entry points:
    about a quarter of a second, which every figure paid three times)."""
    return catalog.preset_order([*catalog.presets(), *presets])


def plain_axis(ax, which: str = "y") -> None:
    """Tick labels as plain numbers: no offset or scientific factor at the axis end."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    if isinstance(axis.get_major_formatter(), ScalarFormatter):
        formatter = ScalarFormatter(useOffset=False)
        formatter.set_scientific(False)
        axis.set_major_formatter(formatter)


def _save(fig, path: Path, key: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={KEY_FIELD: key} if key else None)
    plt.close(fig)
    return path


def seed_band(frames: list[pd.DataFrame], column: str) -> pd.DataFrame | None:
    """Per step: mean, min and max of `column` over the seeds that logged that step."""
    parts = [
        f.loc[f[column].notna(), ["step", column]] for f in frames if column in f and "step" in f
    ]
    parts = [p.apply(pd.to_numeric, errors="coerce").dropna() for p in parts if not p.empty]
    if not parts:
        return None
    # a step that a seed ran past without logging it (another trainer.log_every, a neutral key)
    # is left out, so that each point is the mean of the same seeds; a seed that stopped (it
    # diverged) leaves the later steps to the others
    logged = [(set(p["step"]), p["step"].max()) for p in parts]
    stacked = pd.concat(parts)
    every = [all(s in steps for steps, end in logged if s <= end) for s in stacked["step"]]
    stacked = stacked[np.isfinite(stacked[column]) & np.array(every, dtype=bool)]
    if stacked.empty:
        return None
    band = stacked.groupby("step")[column].agg(["mean", "min", "max", "count"])
    return band.reset_index()


def draw_line(ax, band: pd.DataFrame, style: dict, label: str) -> None:
    """A preset's mean against the step, in its style (markers while there are few points)."""
    ax.plot(
        band["step"],
        band["mean"],
        color=style["color"],
        linestyle=style["linestyle"],
        marker=style["marker"] if len(band) <= 20 else None,
        label=label,
        linewidth=1.6,
        alpha=0.9,
    )


def plot_presets(
    ax,
    curves: dict[str, list[pd.DataFrame]],
    column: str,
    styles: dict[str, dict],
    notes: dict[str, str] | None = None,
) -> bool:
    """The mean over seeds per preset with its min-max band; True if anything was drawn.
    notes: {preset: what its legend entry must also say} (a run that applied no step)."""
    drew = False
    steps: set[float] = set()
    for preset, frames in curves.items():
        band = seed_band(frames, column)
        if band is None:
            continue
        style = styles[preset]
        n_seeds = len(frames)
        label = preset if n_seeds == 1 else f"{preset} (mean of {n_seeds}, min-max band)"
        label += f" [{notes[preset]}]" if notes and preset in notes else ""
        draw_line(ax, band, style, label)
        if n_seeds > 1 and (band["max"] > band["min"]).any():
            ax.fill_between(band["step"], band["min"], band["max"], color=style["color"], alpha=0.2)
        steps.update(band["step"].tolist())
        drew = True
    if drew:
        if len(steps) == 1:  # one point: centre it with one tick instead of a ±0.06 axis
            (step,) = steps
            ax.set_xlim(step - 1, step + 1)
            ax.set_xticks([step])
    return drew


def legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def mark_divergence(ax, diverged: dict[str, list[int]], styles: dict[str, dict]) -> None:
    """A dotted vertical line where each preset's runs diverged."""
    for preset, steps in diverged.items():
        for i, step in enumerate(sorted(set(steps))):
            ax.axvline(
                step,
                color=styles[preset]["color"],
                linestyle=":",
                linewidth=1,
                label=f"{preset} diverged" if i == 0 else None,
            )


def integer_steps(ax) -> None:
    """Whole-number step ticks, also on an axis that spans less than two steps."""
    if isinstance(ax.xaxis.get_major_locator(), FixedLocator):  # a one-point panel's one tick
        return
    low, high = ax.get_xlim()
    if high - low < 2:
        middle = round((low + high) / 2)
        ax.set_xlim(middle - 1, middle + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def say_empty(ax, text: str) -> None:
    """A panel with nothing to draw says why, without axes that suggest a scale."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize="small")
    ax.set_xticks([])
    ax.set_yticks([])


def metric_axis(ax, metric: str) -> None:
    """A metric's axis says its unit; a percent metric's starts at 0."""
    unit = metric_unit(metric)
    if unit == "%":
        # from 0, with headroom so the highest point is not cut by the frame
        ax.set_ylim(bottom=0, top=max(min(ax.get_ylim()[1] * 1.08, 105.0), 1.0))
    ax.set_ylabel(f"{metric} ({unit})" if unit else metric)


def paired_band(
    frames: dict[int, pd.DataFrame],
    reference: dict[int, pd.DataFrame],
    column: str,
    level: float,
    eval_se: float | None = None,
    eval_items: int | None = None,
) -> pd.DataFrame | None:
    """Per step: the mean over seeds of (preset − reference) for the same seed, and the report's
    interval around it where at least MIN_SEEDS seeds logged the step: the seeds' spread with the
    evaluation set's share `eval_se` (the bootstrap standard error of the final evaluation, the
    one with per-item records; its items' main effect), as compare.interval combines them."""
    from mpt_repro.report.compare import half_width

    diffs = []
    for seed, frame in frames.items():
        ref = reference.get(seed)
        if ref is None or column not in frame or column not in ref:
            continue
        both = frame[["step", column]].merge(ref[["step", column]], on="step", suffixes=("", "_r"))
        both = both.apply(pd.to_numeric, errors="coerce").dropna()
        both["diff"] = both[column] - both[f"{column}_r"]
        found = both[["step", "diff"]][np.isfinite(both["diff"])]
        if not found.empty:  # a seed that diverged before its first evaluation pairs nothing
            diffs.append(found)
    if not diffs:
        return None
    stats = pd.concat(diffs).groupby("step")["diff"].agg(["mean", "std", "count"]).reset_index()
    eval_var = (eval_se or 0.0) ** 2
    half = []
    for sd, n in zip(stats["std"].fillna(0.0), stats["count"]):
        if n < MIN_SEEDS or sd**2 / n + eval_var <= 0:
            half.append(np.nan)  # no interval, as the table gives no verdict
            continue
        half.append(half_width(sd**2 / n, n, eval_var, eval_items, level))
    stats["low"], stats["high"] = stats["mean"] - half, stats["mean"] + half
    return stats


def show_tolerance(ax, tolerance: float) -> None:
    """The tolerance as dashed lines at ±tolerance, inside the axis: a difference far inside
    it then looks small, whatever the matplotlib autoscale would have made of it."""
    said = f"tolerance ±{tolerance_text(tolerance)}"
    for sign in (1, -1):
        ax.axhline(sign * tolerance, color="grey", linestyle="--", linewidth=0.8,
                   label=said if sign > 0 else None)  # fmt: skip
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, -1.15 * tolerance), max(high, 1.15 * tolerance))


def min_span(ax, span: float) -> None:
    """At least `span` of the y axis around the data's middle: a perplexity axis from 63.9304 to
    63.9318 makes a difference a thousandth of the tolerance look large."""
    low, high = ax.get_ylim()
    if high - low < span:
        middle = (low + high) / 2
        ax.set_ylim(middle - span / 2, middle + span / 2)


def short_verdict(text: str) -> str:
    """The verdict's first clause, for a legend: `no verdict`, `worse`, `matches FP32 (...)`."""
    return text.split(":")[0].split(";")[0]


def plot_deltas(ax, evals, reference_name, metric, styles, level, diverged=(), deltas=None) -> bool:
    """The paired difference to the reference preset of each other preset, with its band, each
    labelled with the table's verdict (`deltas`: {preset: compare.Delta} of the group).
    diverged: the presets with a diverged run, named when nothing could be paired."""
    reference = evals.get(reference_name)
    if not reference:
        say_empty(ax, f"no {reference_name} run in this group:\nnothing to compare with")
        return False
    drew = False
    for preset, frames in evals.items():
        if preset == reference_name:
            continue
        delta = (deltas or {}).get(preset)
        ev = delta.evidence if delta is not None else None
        band = paired_band(frames, reference, metric, level, ev and ev.se, ev and ev.items)
        if band is None:
            continue
        style = styles[preset]
        label = f"{preset}: {short_verdict(delta.verdict)}" if delta is not None else preset
        draw_line(ax, band, style, label)
        if band["low"].notna().any():
            ax.fill_between(
                band["step"], band["low"], band["high"], color=style["color"], alpha=0.2
            )
        drew = True
    if drew:
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.margins(y=0.12)  # a lone point off zero stays inside the frame
    else:
        others = sorted(set(diverged) - {reference_name})
        why = f"\n({', '.join(others)} diverged before an evaluation)" if others else ""
        say_empty(ax, f"no {metric} of another preset\npaired with {reference_name}'s seeds{why}")
    return drew


def curves_figure(
    train: dict[str, list[pd.DataFrame]],
    evals: dict[str, list[pd.DataFrame]],
    diverged: dict[str, list[int]],
    metric: str,
    title: str,
    by_seed: dict[str, dict[int, pd.DataFrame]] | None = None,
    reference: str = "fp32",
    level: float = 0.95,
    deltas: dict | None = None,
    notes: dict[str, str] | None = None,
):
    """Train loss, the eval metric, and the eval metric's paired difference to the reference
    preset, per preset (keys in display order; `deltas`: the group's {preset: compare.Delta};
    `notes`: {preset: what its legend entries must also say})."""
    styles = preset_styles(list(train))
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    loss = train_loss_column(train)
    drew_loss = plot_presets(left, train, loss, styles, notes)
    mark_divergence(left, diverged, styles)
    left.set(title=TRAIN_LOSS_TITLES[loss], xlabel="step", ylabel=loss)
    # the eval metric; a task that logs it only on train rows (GAN losses) is drawn from those
    drew_metric = plot_presets(middle, evals, metric, styles, notes) or plot_presets(
        middle, train, metric, styles, notes
    )
    middle.set(title=metric, xlabel="step")
    plot_deltas(right, by_seed or {}, reference, metric, styles, level, diverged, deltas)
    tolerance = next((d.tolerance for d in (deltas or {}).values() if d.tolerance), None)
    if tolerance and right.lines:
        show_tolerance(right, tolerance)
    if tolerance and drew_metric and not is_percent(metric):
        min_span(middle, 2 * tolerance)
    ended = "every run diverged before it" if diverged and len(diverged) == len(train) else "none"
    if not drew_loss:
        left.text(
            0.5,
            0.5,
            f"no finite train loss logged ({ended})",
            ha="center",
            transform=left.transAxes,
            fontsize="small",
        )
    if not drew_metric:
        say_empty(middle, f"no evaluation to draw ({ended})")
    right.set(
        title=f"Δ {metric} to {reference} (same seed)\n{level:.0%} CI over seeds and items "
        f"(from {MIN_SEEDS} seeds)",
        xlabel="step",
        ylabel=f"Δ {metric}",
    )
    for ax, drew in ((left, True), (middle, drew_metric), (right, bool(right.lines))):
        if drew:
            plain_axis(ax)
            integer_steps(ax)
            legend(ax)
    if drew_metric:
        metric_axis(middle, metric)
    fig.suptitle(textwrap.fill(title, 150), fontsize="medium")  # a group's keys can be many
    return fig


# the training loss as metrics.csv names it (Task.train_loss_name), and its panel's title
TRAIN_LOSS_TITLES = {
    "loss": "train loss",
    "sampled_loss": "train loss (sampled softmax; evaluation: full)",
}


def train_loss_column(train: dict[str, list[pd.DataFrame]]) -> str:
    """Which training loss the group's runs logged: `sampled_loss` where they trained on a
    sampled softmax (and evaluated on the full one), else `loss`."""
    frames = [f for fs in train.values() for f in fs]
    sampled = any("sampled_loss" in f and f["sampled_loss"].notna().any() for f in frames)
    return "sampled_loss" if sampled else "loss"


def train_figure(task: str) -> str | None:
    """The paper's figure that is a task's training perplexity (its plugin's TaskReport), drawn
    as exp(logged training loss): each train row's loss is the mean over trainer.log_every steps,
    so its exp is the perplexity the TF translation tutorial prints (exp of the mean loss over
    its 200-step checkpoints)."""
    from mpt_repro import registry

    report = registry.report_of(task) if task in registry.task_kinds() else None
    return report.train_figure if report is not None else None


def train_perplexity_figure(
    train: dict[str, list[pd.DataFrame]], diverged: dict[str, list[int]], title: str, figure: str
):
    """Training perplexity per preset (mean over seeds, min-max band: the paper's point is that
    FP32 runs already vary)."""
    styles = preset_styles(list(train))
    loss = train_loss_column(train)  # the tutorial prints exp of its (sampled) training loss
    perplexity = {
        preset: [f.assign(perplexity=np.exp(f[loss].clip(upper=700.0))) for f in frames]
        for preset, frames in train.items()
    }
    fig, ax = plt.subplots(figsize=(6, 4))
    if plot_presets(ax, perplexity, "perplexity", styles):
        mark_divergence(ax, diverged, styles)
        plain_axis(ax)
        legend(ax)
    else:
        say_empty(ax, "no finite train loss logged")
    integer_steps(ax)
    what = "exp(sampled training loss)" if loss == "sampled_loss" else "exp(training loss)"
    ax.set(
        title=f"training perplexity, {what} ({figure})\n{title}", xlabel="step", ylabel="perplexity"
    )
    ax.title.set_fontsize("small")
    return fig


NO_STEP_NOTE = "no optimizer step applied: untrained"


def _until(frame: pd.DataFrame, step) -> pd.DataFrame:
    """A diverged run's rows before the step it diverged at: nothing after it is a result."""
    return frame if step is None or step != step else frame[frame["step"] < int(step)]


@dataclass
class GroupCurves:
    """The curves of one comparison group, per preset in display order: train rows and eval rows
    per seed, each cut before the step its run diverged at, and those steps."""

    train: dict[str, list[pd.DataFrame]] = field(default_factory=dict)
    evals: dict[str, list[pd.DataFrame]] = field(default_factory=dict)
    by_seed: dict[str, dict[int, pd.DataFrame]] = field(default_factory=dict)
    diverged: dict[str, list[int]] = field(default_factory=dict)
    # {preset: what its curves must say}: a run that applied no optimizer step drew a curve of
    # its initial weights, not of training
    notes: dict[str, str] = field(default_factory=dict)


def group_curves(part: pd.DataFrame, problems: list[Problem]) -> GroupCurves:
    """Read the metrics.csv of each run of one comparison group (runs without one are added to
    `problems`)."""
    found = GroupCurves()
    for _, run in part.sort_values(["precision", "seed"]).iterrows():
        frame = load_metrics_csv(run["path"])
        if frame is None or "step" not in frame or "split" not in frame:
            problems.append(Problem(run["path"], "no curves", "metrics.csv missing or unreadable"))
            continue
        preset = run["precision"]
        step = run.get("diverged_at_step") if run["status"] == "diverged" else None
        frame = _until(frame, step)
        found.train.setdefault(preset, []).append(frame[frame["split"] == "train"])
        found.evals.setdefault(preset, []).append(frame[frame["split"] == "eval"])
        found.by_seed.setdefault(preset, {})[int(run["seed"])] = frame[frame["split"] == "eval"]
        if step is not None and step == step:
            found.diverged.setdefault(preset, []).append(int(step))
        if isinstance(run.get("untrained"), (bool, np.bool_)) and run["untrained"]:
            found.notes[preset] = NO_STEP_NOTE
    order = preset_order(found.train, part)
    found.train = {p: found.train[p] for p in order}
    found.evals = {p: found.evals[p] for p in order}
    return found


def experiment_plots(
    runs: pd.DataFrame,
    folder: Path,
    reference: str = "fp32",
    level: float = 0.95,
    deltas: dict | None = None,
) -> tuple[list[Path], list[Problem]]:
    """Curves and loss-scale trace per comparison group (subject, configuration) and setting,
    from each metrics.csv; the Δ panel with the report's intervals and verdicts (`deltas`:
    compare.group_deltas of the runs)."""
    figures, problems = experiment_figures(runs, folder, reference, level, deltas)
    return draw_figures(figures), problems


def experiment_figures(
    runs: pd.DataFrame,
    folder: Path,
    reference: str = "fp32",
    level: float = 0.95,
    deltas: dict | None = None,
) -> tuple[list[Figure], list[Problem]]:
    """experiment_plots' figures, to be drawn (draw_figures)."""
    problems: list[Problem] = []
    figures = list(iter_experiment_figures(runs, folder, reference, level, deltas, problems))
    return figures, problems


def iter_experiment_figures(
    runs: pd.DataFrame,
    folder: Path,
    reference: str,
    level: float,
    deltas: dict | None,
    problems: list[Problem],
) -> Iterator[Figure]:
    """experiment_figures one comparison group at a time (its metrics.csv files read as it
    comes): drawing can start while the next groups are read."""
    keys = ["subject", "comparison", "budget", "data", "device"]
    groups_per_subject = runs.groupby(["subject", "budget", "data", "device"])[
        "comparison"
    ].nunique()
    for (subject, comparison, budget, data, device), part in runs.groupby(keys, sort=True):
        curves = group_curves(part, problems)
        if not curves.train:
            continue
        styles = preset_styles(list(curves.train))
        metric = next((m for m in part["primary_metric"] if isinstance(m, str)), "loss")
        label = str(part["row_label"].iloc[0])
        setting = f"{label}: budget={budget}, data={data}, {device}"
        stem = slugify(subject, budget, data, device)
        if groups_per_subject[(subject, budget, data, device)] > 1:  # the label, then the key
            group = slugify(str(part["group_label"].iloc[0]))[:60]
            stem += f"_{group}_{comparison[:6]}" if group else f"_{comparison or 'unrecorded'}"
        args = (curves.train, curves.evals, curves.diverged, metric, setting, curves.by_seed,
                reference, level, (deltas or {}).get(tuple(part.iloc[0][k] for k in PAIR_KEYS)),
                curves.notes)  # fmt: skip
        yield Figure(folder / f"{stem}_curves.png", curves_figure, args)
        task = next((t for t in part.get("task", []) if isinstance(t, str)), None)
        figure = train_figure(task) if task else None
        if figure:
            args = (curves.train, curves.diverged, setting, figure)
            yield Figure(folder / f"{stem}_train_perplexity.png", train_perplexity_figure, args)
        args = (curves, styles, setting)
        yield Figure(folder / f"{stem}_loss_scale.png", loss_scale_figure, args)


def loss_scale_figure(curves: GroupCurves, styles: dict[str, dict], setting: str):
    """The loss-scale trace per preset (log2 axis: each halving is one step). Presets often share
    a trace (fp32 and no_scaling stay at 1, amp and mixed halve alike): a trace equal to earlier
    ones is drawn wider beneath them and says whose it equals, so no preset disappears."""
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn: list[tuple[str, pd.DataFrame]] = []
    for preset, frames in curves.train.items():
        band = seed_band(frames, "loss_scale")
        if band is None:
            continue
        same = [p for p, b in drawn if b[["step", "mean"]].equals(band[["step", "mean"]])]
        label = preset + (f" (same trace as {', '.join(same)})" if same else "")
        label += f" [{curves.notes[preset]}]" if preset in curves.notes else ""
        style = styles[preset]
        ax.plot(band["step"], band["mean"], color=style["color"], linestyle=style["linestyle"],
                marker=style["marker"] if len(band) <= 20 else None, label=label,
                linewidth=1.6 + 3.0 * len(same), alpha=0.9 if not same else 0.45,
                zorder=3 - len(same))  # fmt: skip
        drawn.append((preset, band))
    if drawn:
        ax.set_yscale("log", base=2)  # a scale is a power of two
        legend(ax)
    integer_steps(ax)
    # the setting names the group's keys: wrapped to the figure's width, not clipped
    ax.set(title=textwrap.fill(f"loss scale — {setting}", 70), xlabel="step", ylabel="loss scale")
    ax.title.set_fontsize("small")
    return fig


def memory_measure(rows: pd.DataFrame) -> tuple[str, str]:
    """The memory figure a group's cost panel compares: the CUDA peak where every run has it, else
    the bytes saved for backward per sample (the same on any device; a CPU's resident set is
    mostly the libraries)."""
    kinds = set(rows.get("peak_memory_kind", pd.Series(dtype=str)).dropna())
    if kinds == {"cuda_max_allocated"}:
        return "peak_memory_bytes_mean", "peak allocated memory"
    return "saved_bytes_per_sample_mean", "saved for backward per sample"


def cost_figure(part: pd.DataFrame, title: str, reference: str = "fp32"):
    """One row of panels per comparison group (speed and memory as ratios to the group's
    reference preset, each bar labelled with the ratio and the absolute figure): linear axes from
    zero, and no axis shared between experiments. A preset of the group without a completed run
    keeps its place, marked with how it ended, so a missing bar never reads as a cheap one."""
    groups = [
        (f"{label} ({data})", g)
        for (label, data), g in part.groupby(["row_label", "data"], sort=True)
        if ((g["precision"] == reference) & (g["n_completed"] > 0)).any()
    ]
    if not groups:
        return None
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 2.9 * len(groups) + 0.8), squeeze=False)
    for (label, g), (speed_ax, memory_ax) in zip(groups, axes):
        presets = preset_order(g["precision"], g)
        styles = preset_styles(presets)
        rows = g.set_index("precision")
        memory_col, memory_name = memory_measure(g[g["n_completed"] > 0])
        for ax, col, name, unit, scale in (
            (speed_ax, "samples_per_s_mean", "samples/s", "/s", 1.0),
            (memory_ax, memory_col, memory_name, " MiB", 2**20),
        ):
            cost_panel(ax, rows, presets, styles, (col, unit, scale), reference)
            ax.set_title(f"{name} ÷ {reference}", fontsize="small")
        # the group's label once per row, wrapped over both panels (it can name several keys)
        speed_ax.annotate(
            textwrap.fill(label, 120),
            xy=(0, 1.16),
            xycoords="axes fraction",
            fontsize="small",
            fontweight="bold",
            va="bottom",
        )
    inch = 1 / fig.get_figheight()
    fig.suptitle(title, fontsize="medium", y=1 - 0.2 * inch)
    fig.tight_layout()
    # tight_layout leaves out the row labels (annotations): room for the title and the first
    # label above the first row, and for each label and the wrapped preset names between rows
    fig.subplots_adjust(top=1 - 1.1 * inch, hspace=0.95)
    return fig


def cost_panel(ax, rows: pd.DataFrame, presets: list[str], styles, measure, reference) -> None:
    """Bars of one measure as ratios to the reference, labelled `0.54×` over the absolute figure;
    a preset without a completed run gets its outcome at the foot of its place instead."""
    col, unit, scale = measure
    base = rows.loc[reference].get(col)
    heights, texts = [], []
    for p in presets:
        row = rows.loc[p]
        value = row.get(col) if row.get("n_completed", 0) else np.nan
        ratio = value / base if _number(value) and _number(base) and base else np.nan
        heights.append(ratio)
        texts.append("" if np.isnan(ratio) else f"{ratio:.2f}×\n{_amount(value / scale)}{unit}")
    bars = ax.bar(
        range(len(presets)),
        [0.0 if np.isnan(h) else h for h in heights],
        color=[styles[p]["color"] for p in presets],
        edgecolor="black",
        linewidth=0.5,
    )
    ax.bar_label(bars, labels=texts, fontsize="x-small", padding=2)
    for i, (p, h) in enumerate(zip(presets, heights)):
        if np.isnan(h):
            ended = "diverged" if rows.loc[p].get("n_diverged", 0) else "no result"
            ax.text(i, 0.04, ended, ha="center", va="bottom", fontsize="x-small", style="italic")
    names = [tick_name(p) for p in presets]  # a preset with changed knobs has a long name
    ax.set_xticks(range(len(presets)), names, fontsize="x-small", rotation=0)
    ax.set_ylim(0, max([h for h in heights if h == h] + [1.0]) * 1.45)  # linear, from zero
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    plain_axis(ax)
    ax.set_ylabel(f"÷ {reference}")


def tick_name(preset: str) -> str:
    """`amp [precision.init_scale=1024.0]` under its bar: the preset, then its knobs wrapped."""
    name, sep, knobs = preset.partition(" [")
    return name + ("\n" + "\n".join(textwrap.wrap("[" + knobs, 18)) if sep else "")


def _amount(x: float) -> str:
    """1,234 / 12.3 / 0.0594: thousands separated, three significant digits below 100."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _number(x) -> bool:
    return isinstance(x, (int, float, np.number)) and not isinstance(x, bool) and np.isfinite(x)


def cost_plots(agg: pd.DataFrame, folder: Path, reference: str = "fp32") -> list[Path]:
    """A cost figure per budget and device, from the completed runs."""
    return draw_figures(cost_figures(agg, folder, reference))


def cost_figures(agg: pd.DataFrame, folder: Path, reference: str = "fp32") -> list[Figure]:
    """cost_plots' figures, to be drawn (draw_figures)."""
    written = []
    for (budget, device), part in agg.groupby(["budget", "device"]):
        if not (part["n_completed"] > 0).any():
            continue
        title = f"cost relative to {reference}: budget={budget}, {device}"
        slow = slow_device(part)
        if slow:  # say it on the figure itself: it travels without the report's text
            title += "\n" + textwrap.fill(SLOW_FP16_NOTE.format(why=slow), 110)
        path = folder / f"{slugify('cost', budget, device)}.png"
        written.append(Figure(path, cost_figure, (part, title, reference)))  # None: no group
    return written


# -- drawing: in processes of their own, and only what changed ----------------------------------
KEY_FIELD = "mpt-report-key"  # the PNG text field that holds what a figure was drawn from
PARALLEL_FROM = 8  # figures to draw before processes are started for them (each costs ~0.5 s)


@dataclass
class Figure:
    """One PNG of the report: ``make(*args)`` returns the matplotlib figure saved at ``path``
    (``make`` a module-level function, ``args`` picklable: a figure may be drawn in another
    process)."""

    path: Path
    make: Callable
    args: tuple


def draw_plots(runs, agg, folder: Path, settings, deltas=None, previous: Path | None = None):
    """Every figure of a report (experiment_figures, then cost_figures) drawn into ``folder``;
    returns (their paths, the problems found reading curves). ``previous``: the plots folder of
    the report this one replaces, whose figures drawn from the same data are copied, not
    redrawn."""
    problems: list[Problem] = []

    def figures() -> Iterator[Figure]:
        yield from iter_experiment_figures(
            runs, folder, settings.reference, settings.confidence, deltas, problems
        )
        yield from cost_figures(agg, folder, settings.reference)

    return draw_figures(figures(), previous), problems


def draw_figures(
    figures: Iterable[Figure], previous: Path | None = None, processes: int | None = None
) -> list[Path]:
    """Save each figure, in order: a figure whose key (a digest of what it is drawn from and of
    the code that draws it) equals that of the PNG of its name in ``previous`` is copied from
    there; the others are drawn, in ``processes`` processes (default: one per CPU this process
    may use) from the PARALLEL_FROM-th on, each handed over as soon as it comes (the next
    figures are made meanwhile). matplotlib spends about half a second on a figure, so a report
    over a thousand runs (some 170 figures) spends most of its time here."""
    from concurrent.futures import ProcessPoolExecutor

    processes = processes or _usable_cpus()
    made: list[Figure] = []
    waiting: list[tuple[Figure, str]] = []
    futures, pool = [], None
    try:
        for figure in figures:
            made.append(figure)
            key = figure_key(figure)
            if _copied(figure, key, previous):
                continue
            waiting.append((figure, key))
            if pool is None and processes >= 2 and len(waiting) >= PARALLEL_FROM:
                pool = ProcessPoolExecutor(processes, mp_context=_start_method())
            if pool is not None:
                futures += [(item[0].path, pool.submit(_draw_item, item)) for item in waiting]
                waiting = []
        drawn = {figure.path: _draw(figure, key) for figure, key in waiting}  # too few for a pool
        drawn.update((path, future.result()) for path, future in futures)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return [f.path for f in made if drawn.get(f.path, f.path) is not None]


def _copied(figure: Figure, key: str, previous: Path | None) -> bool:
    """The figure copied from ``previous``, where the PNG of its name there has its key."""
    old = previous / figure.path.name if previous is not None else None
    if old is None or key_of(old) != key:
        return False
    figure.path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(old, figure.path)
    return True


def _draw(figure: Figure, key: str) -> Path | None:
    """The figure saved, or None where its function found nothing to draw."""
    fig = figure.make(*figure.args)
    return None if fig is None else _save(fig, figure.path, key)


def _draw_item(item: tuple[Figure, str]) -> Path:
    return _draw(*item)


def figure_key(figure: Figure) -> str:
    """A digest of the drawing function, its arguments and the code that draws (this module and
    matplotlib's version): equal keys draw equal figures."""
    digest = hashlib.sha256(_code_digest().encode())
    digest.update(figure.make.__qualname__.encode())
    digest.update(pickle.dumps(figure.args, protocol=4))
    return digest.hexdigest()


@functools.cache
def _code_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + matplotlib.__version__.encode()).hexdigest()


def key_of(png: Path) -> str | None:
    """The key a PNG of a report was saved with (None: no such file, or not one of ours)."""
    try:
        from PIL import Image

        with Image.open(png) as image:
            return image.info.get(KEY_FIELD)
    except (OSError, ValueError):
        return None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _start_method():
    """fork where the process holds no torch (nothing to re-import: the workers start at once);
    else a fork server that imports this module once."""
    if "fork" in multiprocessing.get_all_start_methods() and "torch" not in sys.modules:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context(
        "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    )
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload([__name__])
    return context
