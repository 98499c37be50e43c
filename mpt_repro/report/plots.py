"""PNG plots: training curves and loss-scale traces per experiment, cost bars per budget/device.

What the plots promise (issue 14.2): one colour and one line style per preset, with a legend
entry each, so that presets that overlap stay visible; the mean over seeds as the line and the
seeds' min-max as a band; bars on linear axes that start at zero (a 1% difference looks like 1%);
plain tick labels (no offset such as "+1e2" on a perplexity axis); a panel with one point shows
that point with a sensible axis instead of an empty-looking one. matplotlib runs headless (Agg):
the reporter must work over SSH and in CI.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

from mpt_repro.report import names  # noqa: E402
from mpt_repro.report.aggregate import preset_order  # noqa: E402
from mpt_repro.report.collect import Problem, load_metrics_csv  # noqa: E402
from mpt_repro.report.tables import slugify  # noqa: E402

# line styles and markers cycle independently of the colours, so two presets never share both
LINESTYLES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def preset_styles(presets: list[str]) -> dict[str, dict]:
    """A colour, line style and marker per preset, the same in every figure: each preset keeps
    its place among all the presets conf/ knows (plus these), so fp32 looks alike everywhere."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    everyone = names.preset_order([*names.presets(), *presets])
    return {
        p: {
            "color": cycle[i % len(cycle)],
            "linestyle": LINESTYLES[i % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)],
        }
        for i, p in enumerate(everyone)
        if p in presets
    }


def plain_axis(ax, which: str = "y") -> None:
    """Tick labels as plain numbers: no offset or scientific factor at the axis end."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    if isinstance(axis.get_major_formatter(), ScalarFormatter):
        formatter = ScalarFormatter(useOffset=False)
        formatter.set_scientific(False)
        axis.set_major_formatter(formatter)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
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
    stacked = pd.concat(parts)
    stacked = stacked[np.isfinite(stacked[column])]
    if stacked.empty:
        return None
    band = stacked.groupby("step")[column].agg(["mean", "min", "max", "count"])
    return band.reset_index()


def plot_presets(
    ax, curves: dict[str, list[pd.DataFrame]], column: str, styles: dict[str, dict]
) -> bool:
    """The mean over seeds per preset with its min-max band; True if anything was drawn."""
    drew = False
    steps: set[float] = set()
    for preset, frames in curves.items():
        band = seed_band(frames, column)
        if band is None:
            continue
        style = styles[preset]
        n_seeds = len(frames)
        label = preset if n_seeds == 1 else f"{preset} (mean of {n_seeds}, min-max band)"
        ax.plot(
            band["step"],
            band["mean"],
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"] if len(band) <= 20 else None,
            markevery=None,
            label=label,
            linewidth=1.6,
            alpha=0.9,
        )
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


def curves_figure(
    train: dict[str, list[pd.DataFrame]],
    evals: dict[str, list[pd.DataFrame]],
    diverged: dict[str, list[int]],
    metric: str,
    title: str,
):
    """Train loss (left) and the eval metric (right) per preset (keys in display order)."""
    styles = preset_styles(list(train))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    plot_presets(left, train, "loss", styles)
    mark_divergence(left, diverged, styles)
    left.set(title="train loss", xlabel="step", ylabel="loss")
    # the eval metric; a task that logs it only on train rows (GAN losses) is drawn from those
    if not plot_presets(right, evals, metric, styles):
        plot_presets(right, train, metric, styles)
    right.set(title=metric, xlabel="step", ylabel=metric)
    for ax in (left, right):
        plain_axis(ax)
        legend(ax)
    fig.suptitle(title, fontsize="medium")
    return fig


def experiment_plots(runs: pd.DataFrame, folder: Path) -> tuple[list[Path], list[Problem]]:
    """Curves and loss-scale trace per (experiment, budget, data, device) from each metrics.csv."""
    written, problems = [], []
    for (experiment, budget, data, device), part in runs.groupby(
        ["experiment", "budget", "data", "device"]
    ):
        train: dict[str, list[pd.DataFrame]] = {}
        evals: dict[str, list[pd.DataFrame]] = {}
        diverged: dict[str, list[int]] = {}
        for _, run in part.sort_values(["precision", "seed"]).iterrows():
            frame = load_metrics_csv(run["path"])
            if frame is None or "step" not in frame or "split" not in frame:
                problems.append(
                    Problem(run["path"], "no curves", "metrics.csv missing or unreadable")
                )
                continue
            preset = run["precision"]
            train.setdefault(preset, []).append(frame[frame["split"] == "train"])
            evals.setdefault(preset, []).append(frame[frame["split"] == "eval"])
            step = run.get("diverged_at_step")
            if run["status"] == "diverged" and step is not None and step == step:
                diverged.setdefault(preset, []).append(int(step))
        if not train:
            continue
        order = preset_order(train, part)
        train = {p: train[p] for p in order}
        evals = {p: evals[p] for p in order}
        styles = preset_styles(order)
        metric = next((m for m in part["primary_metric"] if isinstance(m, str)), "loss")
        setting = f"{experiment}: budget={budget}, data={data}, {device}"
        stem = slugify(experiment, budget, data, device)
        fig = curves_figure(train, evals, diverged, metric, setting)
        written.append(_save(fig, folder / f"{stem}_curves.png"))

        fig, ax = plt.subplots(figsize=(6, 4))
        if plot_presets(ax, train, "loss_scale", styles):
            # a scale is a power of two: a log2 axis shows each halving as one step
            ax.set_yscale("log", base=2)
            legend(ax)
        ax.set(title=f"loss scale — {setting}", xlabel="step", ylabel="loss scale")
        ax.title.set_fontsize("small")
        written.append(_save(fig, folder / f"{stem}_loss_scale.png"))
    return written, problems


def cost_figure(part: pd.DataFrame, title: str):
    """Grouped bars (experiment x preset) of samples/s and peak memory from aggregated groups:
    linear axes from zero, each bar labelled with its value."""
    presets = preset_order(part["precision"], part)
    styles = preset_styles(presets)
    groups = sorted(set(zip(part["experiment"], part["data"])))
    x = np.arange(len(groups))
    width = 0.8 / len(presets)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(groups) + 4), 4.5))
    for ax, column, label, scale in (
        (axes[0], "samples_per_s_mean", "samples/s", 1.0),
        (axes[1], "peak_memory_bytes_mean", "peak memory (MiB)", 2**20),
    ):
        for i, preset in enumerate(presets):
            rows = part[part["precision"] == preset].set_index(["experiment", "data"])
            heights = [
                rows[column].get(g, np.nan) / scale if column in rows else np.nan for g in groups
            ]
            bars = ax.bar(
                x + i * width,
                heights,
                width,
                label=preset,
                color=styles[preset]["color"],
                hatch=["", "//", "..", "xx"][i % 4],  # tells presets apart in grey print
                edgecolor="black",
                linewidth=0.5,
            )
            ax.bar_label(
                bars,
                labels=["" if np.isnan(h) else f"{h:.0f}" for h in heights],
                fontsize="x-small",
            )
        ax.set_xticks(
            x + width * (len(presets) - 1) / 2,
            [f"{e}\n({d})" for e, d in groups],
            fontsize="small",
            rotation=30 if len(groups) > 3 else 0,
        )
        ax.set_ylim(bottom=0)  # linear, from zero
        plain_axis(ax)
        ax.set(ylabel=label, title=label)
    axes[0].legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    return fig


def cost_plots(agg: pd.DataFrame, folder: Path) -> list[Path]:
    """A cost figure per budget and device, from the completed runs."""
    written = []
    for (budget, device), part in agg.groupby(["budget", "device"]):
        part = part[part["n_completed"] > 0]
        if part.empty:
            continue
        fig = cost_figure(part, f"cost: budget={budget}, {device}")
        written.append(_save(fig, folder / f"{slugify('cost', budget, device)}.png"))
    return written
