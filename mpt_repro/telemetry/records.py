"""The per-sample record file (telemetry.jsonl) and the run.json summary made from it.

One JSON line per sampled or probe step:
  {"step", "mode": "sample"|"probe", "stepped", "loss",
   "loss_scale": {model: s}, "scale_shown": {model: s},
   "layers": {layer: {"act": ENTRY, "weight": ENTRY, "lost": {"lost", "nonzero", "numel"},
                      "module": class name}},
   "nonfinite": LOCATION|null, "overflow": LOCATION|null, ["least_headroom": {...}]}
ENTRY = {"hist": {"lo": first exponent, "counts": [...]}, "numel", "zero", "nan", "inf",
         "underflow", "subnormal", "overflow",
         "underflow_scaled", "subnormal_scaled", "overflow_scaled"} (raw counts).
LOCATION = {"layer", "pass": "forward"|"backward",
            "where": "output"|"grad_output"|"grad_input", "value"}.
`layer` is the module's path in its model (`features.3`, `0.0` in a Sequential); "module", its
class (`Conv2d`), is absent from records written before it was added and for optimizer parameters
no module owns: layer_label falls back to the path.
A resumed run appends again the steps after its last checkpoint: the last line of a step wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mpt_repro.safeio import read_text
from mpt_repro.telemetry import numerics as nx

COUNT_KEYS = nx.FIELDS


class BadRecords(ValueError):
    """A telemetry file with a line that is not a record (strict reads): the message names the
    file and the line."""


def read_records(path: Path, strict: bool = False) -> list[dict]:
    """The records of a run, one per (step, mode), in step order. A torn last line is skipped; any
    other line that is not a record is skipped too, or (strict) raises BadRecords naming it."""
    path = Path(path)
    if not path.exists():
        return []
    by_key: dict[tuple, dict] = {}
    lines = read_text(path, errors="replace").splitlines()  # NotARegularFile for a FIFO
    for number, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            r = None
            if number == len(lines):  # torn by a kill mid-write: the rest stands
                continue
        if not (isinstance(r, dict) and isinstance(r.get("step"), int) and "mode" in r):
            if strict:
                raise BadRecords(
                    f"{path}: line {number} is not a telemetry record (a JSON object with step "
                    f"and mode): {line[:60]!r}"
                )
            continue
        by_key[(r["step"], str(r["mode"]))] = r
    return [by_key[k] for k in sorted(by_key, key=lambda k: (k[0], k[1]))]


def layer_label(layer: str, entry: dict | None) -> str:
    """A layer as its model names it, path and class (`features.3 Conv2d`, `0.0 Conv2d`): a
    Sequential's indices alone do not say which layer is meant. The path alone when the record
    has no class (older records)."""
    module = (entry or {}).get("module")
    return f"{layer} {module}" if module else layer


def layer_labels(records: Iterable[dict]) -> dict[str, str]:
    """{layer: layer_label} over every layer of the records (the last record that names a layer's
    class wins)."""
    labels: dict[str, str] = {}
    for r in records:
        for layer, entry in r.get("layers", {}).items():
            if layer not in labels or entry.get("module"):
                labels[layer] = layer_label(layer, entry)
    return labels


def add_entries(entries: Iterable[dict]) -> dict | None:
    """The sum of several count entries (histograms and 8-bit format counts included); None for
    none."""
    entries = list(entries)  # read twice
    total: dict | None = None
    full: list[int] = []
    for e in entries:
        if total is None:
            total = {k: 0 for k in COUNT_KEYS}
            full = [0] * nx.N_BINS
        for k in COUNT_KEYS:
            total[k] += e[k]
        for i, v in enumerate(nx.untrim_histogram(e["hist"])):
            full[i] += v
    if total is not None:
        total["hist"] = nx.trim_histogram(full)
        formats = nx.add_format_entries(e["formats"] for e in entries if "formats" in e)
        if formats is not None:
            total["formats"] = formats
    return total


def network_counts(record: dict) -> dict:
    """Whole-network counts of one record: {"act": ENTRY, "weight": ENTRY, "lost": {...}} (present
    kinds only).
    """
    out = {}
    for kind in ("act", "weight"):
        total = add_entries(e[kind] for e in record["layers"].values() if kind in e)
        if total is not None:
            out[kind] = total
    losts = [e["lost"] for e in record["layers"].values() if "lost" in e]
    if losts:
        out["lost"] = {k: sum(x[k] for x in losts) for k in ("lost", "nonzero", "numel")}
    return out


def _stats(values: list[float]) -> dict:
    return {"last": values[-1], "mean": sum(values) / len(values), "max": max(values)}


def summarize(records: list[dict], every: int) -> dict:
    """run.json diagnostics["telemetry"]: network fractions (last/mean/max over samples), per-layer
    means, the whole-run exponent histograms, and where gradients first went non-finite."""
    samples = [r for r in records if r["mode"] == "sample"]
    probes = [r for r in records if r["mode"] == "probe"]
    out: dict = {
        "every": every,
        "samples": len(samples),
        "probes": len(probes),
        "sampled_steps": [r["step"] for r in samples][:1000],
    }
    network: dict = {}
    series: dict[str, dict[str, list[float]]] = {"act_grad": {}, "weight_grad": {}}
    lost: list[float] = []
    totals: dict[str, list[dict]] = {"act": [], "weight": []}
    for r in samples:
        net = network_counts(r)
        for kind, name in (("act", "act_grad"), ("weight", "weight_grad")):
            if kind in net:
                totals[kind].append(net[kind])
                for k, v in nx.fractions_of(net[kind]).items():
                    series[name].setdefault(k, []).append(v)
        if "lost" in net and r["stepped"]:
            lost.append(nx.lost_fraction(net["lost"]))
    for name, per_key in series.items():
        if per_key:
            network[name] = {k: _stats(v) for k, v in per_key.items()}
    if lost:
        network["lost_update"] = _stats(lost)
    # the whole run's exponent histograms (as the paper's figures, which pool a whole training run)
    for kind, name in (("act", "act_grad"), ("weight", "weight_grad")):
        total = add_entries(totals[kind])
        if total is not None:
            network[name + "_histogram"] = total["hist"]
            if "formats" in total:  # what E5M2/E4M3 (and FP16) would do with them, whole run
                network[name + "_8bit"] = nx.format_fractions(total["formats"])
    out["network"] = network
    out["layers"] = _layer_means(samples)
    first = next((r for r in records if r.get("nonfinite")), None)
    out["first_nonfinite"] = {"step": first["step"], **first["nonfinite"]} if first else None
    out["first_nonfinite_layer"] = first["nonfinite"]["layer"] if first else None
    over = next((r for r in samples if r.get("overflow")), None)
    out["first_fp16_overflow"] = {"step": over["step"], **over["overflow"]} if over else None
    out["probe_results"] = [
        {
            "step": r["step"],
            "nonfinite": r.get("nonfinite"),
            "least_headroom": r.get("least_headroom"),
        }
        for r in probes[:20]
    ]
    return out


def _layer_means(samples: list[dict]) -> dict:
    """Per layer, the mean over samples of its key fractions (max for overflow)."""
    acc: dict[str, dict[str, list[float]]] = {}
    for r in samples:
        for layer, e in r["layers"].items():
            a = acc.setdefault(layer, {})
            for kind in ("act", "weight"):
                if kind in e:
                    f = nx.fractions_of(e[kind])
                    for k in ("underflow", "subnormal", "underflow_scaled", "overflow_scaled"):
                        a.setdefault(f"{kind}_{k}", []).append(f[k])
            if "lost" in e and r["stepped"]:
                a.setdefault("lost_update", []).append(nx.lost_fraction(e["lost"]))
    return {
        layer: {
            k: (max(v) if k.endswith("overflow_scaled") else sum(v) / len(v)) for k, v in a.items()
        }
        for layer, a in acc.items()
    }


def write_tensorboard(
    writer: Any, record: dict, net: dict, layer_scalars: bool, layer_histograms: bool
) -> None:
    """One sampled record into TensorBoard: network-wide fractions and exponent histograms, and
    per layer when asked (telemetry.layer_scalars / layer_histograms). ``net`` is
    network_counts(record)."""
    step = record["step"]
    names = {"act": "act_grad", "weight": "weight_grad"}
    for kind in ("act", "weight"):
        if kind not in net:
            continue
        for k, v in nx.fractions_of(net[kind]).items():
            writer.add_scalar(f"telemetry/{names[kind]}/{k}", v, step)
        _add_exponent_histogram(writer, f"telemetry/{names[kind]}_log2", net[kind]["hist"], step)
        for fmt, fractions in nx.format_fractions(net[kind].get("formats") or {"numel": 0}).items():
            for k, v in fractions.items():
                writer.add_scalar(f"telemetry/{names[kind]}/{fmt}_{k}", v, step)
    if "lost" in net:
        writer.add_scalar("telemetry/lost_update", nx.lost_fraction(net["lost"]), step)
    for layer, entry in record["layers"].items():
        for kind in ("act", "weight"):
            if kind not in entry:
                continue
            if layer_scalars:
                f = nx.fractions_of(entry[kind])
                for k in (
                    "underflow",
                    "subnormal",
                    "overflow",
                    "underflow_scaled",
                    "overflow_scaled",
                ):
                    writer.add_scalar(f"telemetry_layers/{names[kind]}_{k}/{layer}", f[k], step)
            if layer_histograms:
                _add_exponent_histogram(
                    writer,
                    f"telemetry_layers/{names[kind]}_log2/{layer}",
                    entry[kind]["hist"],
                    step,
                )
        if "lost" in entry and layer_scalars:
            writer.add_scalar(
                f"telemetry_layers/lost_update/{layer}", nx.lost_fraction(entry["lost"]), step
            )


def _add_exponent_histogram(writer: Any, tag: str, trimmed: dict, step: int) -> None:
    """A TensorBoard histogram of floor(log2|x|): one bucket per power of two (zeros left out:
    they are the `zero` scalar)."""
    counts = trimmed["counts"]
    if not counts or sum(counts) == 0:
        return
    lo = trimmed["lo"]
    exps = [lo + i for i in range(len(counts))]
    n = sum(counts)
    writer.add_histogram_raw(
        tag,
        min=float(lo),
        max=float(lo + len(counts)),
        num=n,
        sum=float(sum(e * c for e, c in zip(exps, counts))),
        sum_squares=float(sum(e * e * c for e, c in zip(exps, counts))),
        bucket_limits=[float(e + 1) for e in exps],
        bucket_counts=counts,
        global_step=step,
    )
