"""Per layer, where the gradients' exponents fall against the FP16, BF16, E4M3 and E5M2 windows:
as recorded, times the advised static loss scale, and per-tensor scaled (FP8).

One row per layer and kind: a thin line over every nonzero bin, a thick bar over the bins that
hold the middle 98% of the values (1% cut at each end), from the same histograms as the advice.
"""

from __future__ import annotations

from pathlib import Path

from mpt_repro.advise import formats as fm
from mpt_repro.advise.evidence import KINDS, RunEvidence, pooled

FIGURE = "advice_exponent_ranges.png"
_COLORS = {"act": "tab:blue", "weight": "tab:orange"}
_STYLE = {  # how each format's window is drawn
    "fp16": dict(color="tab:green", alpha=0.12),
    "bf16": dict(color="tab:gray", alpha=0.06),
    "e5m2": dict(color="tab:purple", linestyle="--"),
    "e4m3": dict(color="tab:red", linestyle=":"),
}


def spread(hist: dict[int, int], cut: float = 0.01) -> tuple[int, int, int, int]:
    """(lowest bin, bin at the `cut` quantile, bin at 1 - cut, top bin) of a histogram."""
    bins = sorted(hist)
    total = sum(hist.values())
    below, lo_q, hi_q = 0, bins[0], bins[-1]
    for e in bins:
        if below <= cut * total:
            lo_q = e
        below += hist[e]
        if below >= (1 - cut) * total:
            hi_q = e
            break
    return bins[0], lo_q, hi_q, bins[-1]


def relative_to_top(evidence: RunEvidence, layer: str, kind: str) -> dict[int, int]:
    """A layer's histogram with every sampled tensor's bins counted from its own top bin (0):
    what per-tensor scaling does, whatever the format."""
    moved = []
    for hist in evidence.layers[layer].samples[kind]:
        if hist:
            t = max(hist)
            moved.append({e - t: c for e, c in hist.items()})
    return pooled(moved)


def _windows(ax, relative: bool) -> None:
    for key, style in _STYLE.items():
        w = fm.WINDOWS[key]
        # relative: the tensor's top bin (0, drawn as [0, 1)) sits in the format's top bin
        lo, hi = (w.subnormal_exp - w.top_exp, 1) if relative else (w.subnormal_exp, w.top_exp + 1)
        label = f"{w.name} [2^{lo}, 2^{hi})" if not relative else f"{w.name}: {hi - lo} binades"
        if "alpha" in style:
            ax.axvspan(lo, hi, label=label, **style)
        else:
            ax.axvline(lo, label=label, **style)
            ax.axvline(hi, **style)


def _panel(ax, rows: list[tuple[str, str, dict]], title: str, relative: bool) -> None:
    _windows(ax, relative)
    lows, highs = [], []
    for y, (_layer, kind, hist) in enumerate(rows):
        if not hist:
            continue
        e0, q0, q1, e1 = spread(hist)
        ax.plot([e0, e1 + 1], [y, y], color=_COLORS[kind], linewidth=1)
        ax.plot([q0, q1 + 1], [y, y], color=_COLORS[kind], linewidth=5, solid_capstyle="butt")
        lows.append(e0)
        highs.append(e1 + 1)
    left = min(lows + [-40 if relative else -30]) - 2
    right = max(highs + [2 if relative else 18]) + 2
    ax.set_xlim(left, right)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{label} {kind}" for label, kind, _ in rows], fontsize=7)
    ax.invert_yaxis()  # input layers at the top
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("binades below the tensor's largest value" if relative else "log2 |gradient|")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=7)


def draw(evidence: RunEvidence, scale_log2: int, path: Path) -> Path:
    """Three panels: as recorded, times 2^scale_log2, and per-tensor scaled."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    rows = [(lay.label, n, k) for n, lay in evidence.layers.items() for k in KINDS]
    recorded = [(label, k, evidence.layers[n].hist(k)) for label, n, k in rows]
    scaled = [(label, k, {e + scale_log2: c for e, c in h.items()}) for label, k, h in recorded]
    per_tensor = [(label, k, relative_to_top(evidence, n, k)) for label, n, k in rows]
    height = min(3.5 + 0.22 * len(recorded), 60)
    fig, axes = plt.subplots(1, 3, figsize=(18, height), sharey=True)
    _panel(axes[0], recorded, "as recorded (FP32 values)", relative=False)
    _panel(axes[1], scaled, f"times the advised loss scale 2^{scale_log2} (FP16)", relative=False)
    _panel(axes[2], per_tensor, "per-tensor scaled (FP8): from each tensor's top", relative=True)
    title = f"Gradient exponent ranges per layer: {evidence.label}"
    key = "blue: activation gradients, orange: weight gradients; thick: the middle 98%"
    fig.suptitle(f"{title} ({key})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
