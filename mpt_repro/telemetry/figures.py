"""Paper-style figures from a run's telemetry record (Micikevicius et al. 2018, Fig. 2b and 3).

    python -m mpt_repro.telemetry.figures RUN_DIR [--out DIR]
    from mpt_repro.telemetry.figures import draw_figures; draw_figures(run_dir)

Writes into the run directory (or --out):
  telemetry_act_grad_hist.png     activation-gradient exponent histogram over the network, all
                                  sampled steps pooled, FP16 ranges shaded, fractions annotated
  telemetry_weight_grad_hist.png  the same for weight gradients
  telemetry_underflow_heatmap.png per-layer fractions over training (layers x sampled steps):
                                  activation- and weight-gradient underflow, lost updates
  telemetry_mx_blocks.png         MX runs only (mx_counts.py): per layer and tensor kind, the
                                  shares of values underflowed in their block, of clamped and
                                  of saturated block scales
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

from mpt_repro.telemetry import numerics as nx
from mpt_repro.telemetry.records import add_entries, layer_labels, network_counts, read_records

FIGURES = (
    "telemetry_act_grad_hist.png",
    "telemetry_weight_grad_hist.png",
    "telemetry_underflow_heatmap.png",
)


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def _typical_scale(samples: list[dict]) -> float:
    """The scale the *_scaled fractions used most often (for the dashed line)."""
    scales = Counter(s for r in samples for s in r["scale_shown"].values())
    return scales.most_common(1)[0][0] if scales else 1.0


def draw_histogram(path: Path, total: dict, title: str, scale: float) -> None:
    """One exponent histogram: bars are % of all values (zeros included) per power of two."""
    plt = _plt()
    n = max(total["numel"], 1)
    counts, lo = total["hist"]["counts"], total["hist"]["lo"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    # FP16's floor for the true value, loss-scaled
    floor = nx.FP16_MIN_SUBNORMAL_EXP - math.log2(scale)
    left = math.floor(min(lo if counts else -30, -30, floor - 2)) - 1
    right = max(lo + len(counts) if counts else 0, 17) + 1
    _fp16_ranges(ax, left, right)
    if counts:
        xs = [lo + i for i in range(len(counts))]
        heights = [100.0 * c / n for c in counts]
        ax.bar(xs, heights, width=1.0, align="edge", color="tab:blue", edgecolor="white", lw=0.3)
    if scale != 1.0:
        # with loss scale s, a true value x is held as s*x: FP16's floor moves down by log2(s)
        ax.axvline(floor, color="black", ls="--", lw=1, label=f"2^-24 / loss scale {scale:g}")
    ax.set_xlim(left, right)
    ax.set_xlabel("log2 |value| (bin e holds [2^e, 2^(e+1)))")
    ax.set_ylabel("% of all values")
    ax.set_title(title)
    ax.text(
        0.99,
        0.97,
        _histogram_text(total, scale),
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=8,
        bbox=dict(boxstyle="round", facecolor="white", alpha=0.85),
    )
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fp16_ranges(ax, left: float, right: float) -> None:
    """FP16's ranges of the true value: what it loses, holds imprecisely, holds, overflows."""
    top = math.log2(nx.FP16_MAX)
    for lo, hi, colour, alpha, label in (
        (left, nx.FP16_MIN_SUBNORMAL_EXP, "tab:red", 0.12, "lost in FP16 (< 2^-24)"),
        (
            nx.FP16_MIN_SUBNORMAL_EXP,
            nx.FP16_MIN_NORMAL_EXP,
            "tab:orange",
            0.15,
            "FP16 subnormal [2^-24, 2^-14)",
        ),
        (nx.FP16_MIN_NORMAL_EXP, top, "tab:green", 0.08, "FP16 normal"),
        (top, right, "tab:red", 0.25, "overflow (> 65504)"),
    ):
        ax.axvspan(lo, hi, color=colour, alpha=alpha, label=label)


def _histogram_text(total: dict, scale: float) -> str:
    """The box beside a histogram. Its shares are of the nonzero finite values, the denominator
    mpt-advise uses (a tensor's zeros are no value FP16 could lose), and it says so."""
    numel = int(total["numel"])
    finite = numel - int(total["zero"]) - int(total["nan"]) - int(total["inf"])

    def share(key: str) -> float:
        count = total[key] - (total["inf"] if key.startswith("overflow") else 0)  # inf: below
        return 100 * count / finite if finite else 0.0

    text = (
        f"values: {numel:,}, zero: {100 * total['zero'] / max(numel, 1):.1f}%\n"
        f"of the {finite:,} nonzero finite:\n"
        f"lost in FP16 (< 2^-24): {share('underflow'):.2f}%\n"
        f"subnormal: {share('subnormal'):.2f}%\noverflow: {share('overflow'):.3f}%"
    )
    if scale != 1.0:
        text += (
            f"\nwith loss scale {scale:g}: lost {share('underflow_scaled'):.2f}%, "
            f"overflow {share('overflow_scaled'):.3f}%"
        )
    if total["nan"] or total["inf"]:
        text += f"\nnon-finite: {100 * (total['nan'] + total['inf']) / max(numel, 1):.3f}% of all"
    return text


def draw_heatmap(path: Path, samples: list[dict], heading: str = "") -> None:
    """Layers x sampled steps: the fraction of values FP16 would lose, per panel."""
    plt = _plt()
    layers: list[str] = []
    for r in samples:  # model order, as recorded
        layers += [name for name in r["layers"] if name not in layers]
    steps = [r["step"] for r in samples]
    scaled = any(s != 1.0 for r in samples for s in r["scale_shown"].values())

    def grid(kind: str, key: str) -> list[list[float]]:
        rows = []
        for layer in layers:
            row = []
            for r in samples:
                e = r["layers"].get(layer, {}).get(kind)
                if e is None:
                    row.append(float("nan"))
                elif kind == "lost":
                    row.append(100 * nx.lost_fraction(e) if r["stepped"] else float("nan"))
                else:  # of the nonzero finite values, as the histograms' box and mpt-advise
                    finite = e["numel"] - e["zero"] - e["nan"] - e["inf"]
                    row.append(100 * e[key] / finite if finite else float("nan"))
            rows.append(row)
        return rows

    panels = [("act", "underflow", "activation grads < 2^-24 (% of nonzero)")]
    if scaled:
        panels.append(
            ("act", "underflow_scaled", "activation grads, loss-scaled, < 2^-24 (% of nonzero)")
        )
    panels += [
        ("weight", "underflow", "weight grads < 2^-24 (% of nonzero)"),
        ("lost", "", "updates lost in FP16 weights (%)"),
    ]
    labels = layer_labels(samples)
    names = [labels[layer] for layer in layers]  # path and class: `0.0 Conv2d`
    height = max(3.0, 0.16 * len(layers) + 1.5)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), height), squeeze=False)
    for ax, (kind, key, title) in zip(axes[0], panels):
        data = grid(kind, key)
        finite = [v for row in data for v in row if not math.isnan(v)]
        top = max(finite + [1e-3])
        im = ax.imshow(
            data, aspect="auto", interpolation="nearest", cmap="magma", vmin=0.0, vmax=top
        )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        tick = max(1, len(steps) // 8)
        ax.set_xticks(range(0, len(steps), tick))
        ax.set_xticklabels([str(s) for s in steps[::tick]], fontsize=7, rotation=45)
        ltick = max(1, len(layers) // 60)
        ax.set_yticks(range(0, len(layers), ltick))
        ax.set_yticklabels(names[::ltick] if ax is axes[0][0] else [], fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(heading or "What FP16 would lose, per layer and sampled step", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_figures(
    run_dir: Path, records: list[dict] | None = None, out_dir: Path | None = None
) -> list[Path]:
    """Draw the telemetry figures of one run; returns the files written (none without samples)."""
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir
    if records is None:
        records = read_records(run_dir / "telemetry.jsonl")
    samples = [r for r in records if r["mode"] == "sample"]
    if not samples:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    scale = _typical_scale(samples)
    for kind, fname, what in (
        ("act", FIGURES[0], "Activation gradients"),
        ("weight", FIGURES[1], "Weight gradients"),
    ):
        total = add_entries(
            net[kind] for net in (network_counts(r) for r in samples) if kind in net
        )
        if total is None:
            continue
        title = f"{what}, all layers, {len(samples)} sampled steps ({run_dir.name})"
        draw_histogram(out_dir / fname, total, title, scale)
        written.append(out_dir / fname)
    heading = f"What FP16 would lose, per layer and sampled step ({run_dir.name})"
    draw_heatmap(out_dir / FIGURES[2], samples, heading)
    written.append(out_dir / FIGURES[2])
    from mpt_repro.telemetry import mx_counts  # MX runs: what the blocks did (issue 46)

    mx_heading = f"What the MX blocks did, per layer, {len(samples)} sampled steps ({run_dir.name})"
    labels = layer_labels(samples)
    if mx_counts.draw(out_dir / mx_counts.FIGURE, samples, labels, mx_heading, _plt()):
        written.append(out_dir / mx_counts.FIGURE)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpt_repro.telemetry.figures",
        description="Draw the gradient-histogram and underflow figures of a run with telemetry.",
    )
    ap.add_argument("run_dir", type=Path, help="run directory holding telemetry.jsonl")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the PNGs (default: the run directory)",
    )
    ap.add_argument(
        "--record", default="telemetry.jsonl", help="record file name inside the run directory"
    )
    args = ap.parse_args(argv)
    path = args.run_dir / args.record
    records = read_records(path)
    if not records:
        print(
            f"no telemetry samples in {path}: run with telemetry.enabled=true (or "
            "telemetry=diagnostic)",
            file=sys.stderr,
        )
        return 2
    for p in draw_figures(args.run_dir, records, args.out):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
