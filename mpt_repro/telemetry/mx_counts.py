"""MX telemetry: per layer and tensor kind, what the MX blocks did on a sampled step.

The MX layers count as they quantize (mpt_repro/precision/mx_modules.py, mx.block_stats) while
their runtime's `counting` is on: the telemetry callback turns it on for a sampled step (`arm`),
takes the counts after it (`gather`, one host copy) into each layer's record entry as
"mx": {"weights" | "activations" | "errors": {"blocks", "nonzero_blocks", "scale_clamped",
"saturated", "nonzero", "underflow"}}, and `summarize` gives run.json diagnostics.telemetry.mx:

  scale_clamped  share of nonzero blocks whose E8M0 scale hit its floor 2^-127 (too small a block)
  saturated      share of nonzero blocks whose largest value was cut to the element's max normal
  underflow      share of nonzero values that became zero inside their block (the block's
                 largest value sets the scale; a value 2^(emax - emin + M + 1) below it is lost)

per layer and kind, and for the whole network, over all sampled steps. A layer with a high
underflow share needs a wider element format (E5M2, or FP8 over FP4) or stays exempt.
"""

from __future__ import annotations

from typing import Any

from mpt_repro.precision import mx

KINDS = ("weights", "activations", "errors")


def _runtimes(models: dict[str, Any]) -> list[tuple[str, Any]]:
    from mpt_repro.precision.mx_modules import mx_runtime

    return [(m, rt) for m, model in models.items() if (rt := mx_runtime(model)) is not None]


def arm(models: dict[str, Any]) -> None:
    """Count from now on (a sampled step begins)."""
    for _, rt in _runtimes(models):
        rt.take_counts()  # anything left from an unsampled step is dropped
        rt.counting = True


def gather(models: dict[str, Any]) -> dict[str, dict]:
    """{layer (as the callback names it): {kind: counts}} of the step, counting off again."""
    prefix = len(models) > 1
    out: dict[str, dict] = {}
    for mname, rt in _runtimes(models):
        rt.counting = False
        for name, kinds in rt.take_counts().items():
            layer = ".".join(x for x in (mname if prefix else "", name) if x) or mname
            out[layer] = kinds
    return out


def _add(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


def summarize(records: list[dict]) -> dict | None:
    """{"network": {kind: shares}, "layers": {layer: {kind: shares}}} over the sampled steps'
    "mx" entries (mx.stats_shares), or None when no record has any."""
    layers: dict[str, dict[str, dict]] = {}
    network: dict[str, dict] = {}
    for r in records:
        if r.get("mode") != "sample":
            continue
        for layer, e in r.get("layers", {}).items():
            for kind, counts in (e.get("mx") or {}).items():
                _add(layers.setdefault(layer, {}).setdefault(kind, {}), counts)
                _add(network.setdefault(kind, {}), counts)
    if not network:
        return None
    return {
        "network": {k: mx.stats_shares(v) for k, v in network.items()},
        "layers": {
            layer: {k: mx.stats_shares(v) for k, v in kinds.items()}
            for layer, kinds in layers.items()
        },
    }


def log_text(record: dict) -> str | None:
    """One clause for the sampled step's log line: the network's MX shares, or None."""
    s = summarize([record])
    if s is None:
        return None
    parts = [
        f"{k} underflow {v['underflow']:.2%}, clamped {v['scale_clamped']:.2%}, "
        f"saturated {v['saturated']:.2%}"
        for k, v in s["network"].items()
    ]
    return "MX blocks: " + "; ".join(parts)


FIGURE = "telemetry_mx_blocks.png"
_MEASURES = (
    ("underflow", "values underflowed to 0 in their block (% of nonzero)"),
    ("scale_clamped", "blocks whose scale clamped at 2^-127 (% of nonzero blocks)"),
    ("saturated", "blocks whose largest value saturated (% of nonzero blocks)"),
)


def draw(path: Any, records: list[dict], labels: dict[str, str], heading: str, plt: Any) -> bool:
    """Layers x tensor kinds, one panel per measure, shares over the run's sampled steps (the
    figure beside the FP16 heatmap, for MX runs; `plt`: figures' pyplot); False (nothing
    drawn) without MX counts."""
    s = summarize(records)
    if s is None:
        return False
    layers = list(s["layers"])
    kinds = [k for k in KINDS if k in s["network"]]
    height = max(3.0, 0.16 * len(layers) + 1.5)
    fig, axes = plt.subplots(1, len(_MEASURES), figsize=(4.2 * len(_MEASURES), height))
    for i, (ax, (key, title)) in enumerate(zip(axes, _MEASURES)):
        data = [
            [100 * s["layers"][layer].get(k, {}).get(key, float("nan")) for k in kinds]
            for layer in layers
        ]
        top = max([v for row in data for v in row if v == v] + [1e-3])
        im = ax.imshow(data, aspect="auto", interpolation="nearest", cmap="magma", vmin=0, vmax=top)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(kinds)))
        ax.set_xticklabels(kinds, fontsize=7)
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels([labels.get(n, n) for n in layers] if i == 0 else [], fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(heading, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
