"""PNG plots: training curves and loss-scale traces per experiment, cost bars per budget/device.

matplotlib runs headless (Agg): the reporter must work over SSH and in CI.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mpt_repro.report.aggregate import preset_order  # noqa: E402
from mpt_repro.report.collect import Problem, load_metrics_csv  # noqa: E402
from mpt_repro.report.tables import slugify  # noqa: E402


def _colours(presets) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {p: cycle[i % len(cycle)] for i, p in enumerate(presets)}


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_runs(ax, curves: list[tuple[str, pd.DataFrame]], column: str, colours) -> bool:
    """One line per run (seed), one colour and one legend entry per preset. True if any line."""
    labelled, drew = set(), False
    for preset, frame in curves:
        if column not in frame or frame[column].notna().sum() == 0:
            continue
        rows = frame[frame[column].notna()]
        ax.plot(
            rows["step"],
            rows[column],
            color=colours[preset],
            label=None if preset in labelled else preset,
            alpha=0.8,
            marker="." if len(rows) < 20 else None,
        )
        labelled.add(preset)
        drew = True
    if drew:
        ax.legend(fontsize="small")
    return drew


def experiment_plots(runs: pd.DataFrame, folder: Path) -> tuple[list[Path], list[Problem]]:
    """Curves and loss-scale trace per (experiment, budget, data, device) from each metrics.csv."""
    written, problems = [], []
    for (experiment, budget, data, device), part in runs.groupby(
        ["experiment", "budget", "data", "device"]
    ):
        curves = []
        for _, run in part.sort_values(["precision", "seed"]).iterrows():
            frame = load_metrics_csv(run["path"])
            if frame is None or "step" not in frame or "split" not in frame:
                problems.append(
                    Problem(run["path"], "no curves", "metrics.csv missing or unreadable")
                )
                continue
            curves.append((run["precision"], frame))
        if not curves:
            continue
        colours = _colours(preset_order(p for p, _ in curves))
        metric = part["primary_metric"].iloc[0]
        setting = f"{experiment}: budget={budget}, data={data}, {device}"
        stem = slugify(experiment, budget, data, device)

        train = [(p, f[f["split"] == "train"]) for p, f in curves]
        evals = [(p, f[f["split"] == "eval"]) for p, f in curves]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        _plot_runs(left, train, "loss", colours)
        left.set(title="train loss", xlabel="step", ylabel="loss")
        # the eval metric; a task that logs it only on train rows (GAN losses) is drawn from those
        if not _plot_runs(right, evals, metric, colours):
            _plot_runs(right, train, metric, colours)
        right.set(title=f"{metric}", xlabel="step", ylabel=metric)
        fig.suptitle(setting, fontsize="medium")
        written.append(_save(fig, folder / f"{stem}_curves.png"))

        fig, ax = plt.subplots(figsize=(6, 4))
        if _plot_runs(ax, train, "loss_scale", colours):
            ax.set_yscale("log", base=2)
        ax.set(title=f"loss scale — {setting}", xlabel="step", ylabel="loss scale")
        ax.title.set_fontsize("small")
        written.append(_save(fig, folder / f"{stem}_loss_scale.png"))
    return written, problems


def cost_plots(agg: pd.DataFrame, folder: Path) -> list[Path]:
    """Grouped bars (experiment x preset) of samples/s and peak memory, per budget and device."""
    written = []
    for (budget, device), part in agg.groupby(["budget", "device"]):
        part = part[part["n_completed"] > 0]
        if part.empty:
            continue
        presets = preset_order(part["precision"])
        colours = _colours(presets)
        groups = sorted(set(zip(part["experiment"], part["data"])))
        x = np.arange(len(groups))
        width = 0.8 / len(presets)
        fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(groups) + 4), 4.5))
        for ax, column, label in (
            (axes[0], "samples_per_s_mean", "samples/s"),
            (axes[1], "peak_memory_bytes_mean", "peak memory (MiB)"),
        ):
            for i, preset in enumerate(presets):
                rows = part[part["precision"] == preset].set_index(["experiment", "data"])
                heights = [
                    rows[column].get(g, np.nan) if column in rows else np.nan for g in groups
                ]
                if label.endswith("(MiB)"):
                    heights = [h / 2**20 for h in heights]
                ax.bar(x + i * width, heights, width, label=preset, color=colours[preset])
            ax.set_xticks(
                x + width * (len(presets) - 1) / 2,
                [f"{e}\n({d})" for e, d in groups],
                fontsize="small",
                rotation=30,
            )
            ax.set_yscale("log")
            ax.set(ylabel=label, title=label)
        axes[0].legend(fontsize="small")
        fig.suptitle(f"cost: budget={budget}, {device}", fontsize="medium")
        written.append(_save(fig, folder / f"{slugify('cost', budget, device)}.png"))
    return written
