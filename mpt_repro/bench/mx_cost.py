"""What mpt-bench says about an emulated MX preset beyond its speed: the bytes an MX storage of
its quantized layers' operands would take, computed (not measured: the emulation keeps FP32
tensors), and the label that its speed and memory are the emulation's (docs/mx.md, "Cost").

An MX tensor stores per value its element's bits plus one 8-bit E8M0 scale per block of 32:
8.25 bits for MXFP8, 6.25 for MXFP6, 4.25 for MXFP4, against 32 for FP32. Counted: the weights
of the quantized layers (once) and the inputs those layers keep for their backward (per sample,
from one step's forward).
"""

from __future__ import annotations

from typing import Any

EMULATION = (
    "emulation: FP32 arithmetic on MX values; its samples/s and memory are the emulation's cost "
    "on this device, not MX hardware's"
)


def mx_storage(bs: Any) -> dict[str, Any] | None:
    """{"note", "bits_per_value": {kind: bits}, "weights": {...}, "activations_per_sample":
    {...}} (each {"fp32_bytes", "mx_bytes", "saved_bytes"}), or None for a preset without MX
    layers. Runs one more (untimed) step of `bs` to see the layers' inputs."""
    from mpt_repro.precision import mx
    from mpt_repro.precision.mx_modules import mx_runtime

    found = [(model, rt) for model in bs.task.models.values() if (rt := mx_runtime(model))]
    if not found:
        return None
    bits = {
        kind: mx.bits_per_value(spec.fmt)
        for kind, spec in found[0][1].specs.items()
        if kind in found[0][1].block_kinds
    }
    weights = 0
    handles = []
    seen: dict[str, int] = {}
    for model, rt in found:
        modules = dict(model.named_modules())
        for name in rt.wrapped:
            m = modules[name]
            weights += m.weight.numel()

            def count(mod: Any, args: Any, key: str = f"{id(model)}.{name}") -> None:
                seen[key] = seen.get(key, 0) + args[0].numel()

            handles.append(m.register_forward_pre_hook(count))
    try:
        bs.step()
    finally:
        for h in handles:
            h.remove()
    inputs = sum(seen.values())
    return {
        "note": EMULATION,
        "bits_per_value": bits,
        "weights": _bytes(weights, bits.get("weights", 32.0)),
        "activations_per_sample": _bytes(inputs / bs.samples, bits.get("activations", 32.0)),
    }


def _bytes(values: float, bits: float) -> dict[str, float]:
    fp32, mx_bytes = values * 4.0, values * bits / 8.0
    return {"fp32_bytes": fp32, "mx_bytes": mx_bytes, "saved_bytes": fp32 - mx_bytes}


def describe(doc: dict) -> list[str]:
    """Lines under mpt-bench's table for the rows that carry an mx_storage detail."""
    lines = []
    for row in doc.get("results", []):
        s = (row.get("detail") or {}).get("mx_storage")
        if not s:
            continue
        w, a = s["weights"], s["activations_per_sample"]
        bits = ", ".join(f"{k} {v:g}" for k, v in s["bits_per_value"].items())
        lines.append(
            f"{row['preset']}: {s['note']}. An MX storage (bits per value: {bits}) of its "
            f"quantized layers would save {w['saved_bytes'] / 2**20:.3g} MiB of weights "
            f"({w['fp32_bytes'] / 2**20:.3g} -> {w['mx_bytes'] / 2**20:.3g}) and "
            f"{a['saved_bytes'] / 2**20:.3g} MiB per sample of saved layer inputs "
            f"({a['fp32_bytes'] / 2**20:.3g} -> {a['mx_bytes'] / 2**20:.3g}): computed, not "
            "measured"
        )
    return lines
