"""From the workers' measurements to the bench's result rows, the JSON document and the table.

JSON (schema_version 1), one file per `mpt-bench` invocation:
    schema_version, created, device {type, name, count, gpu_model}, versions, commit,
    commit_dirty, command, config {overrides, suite (the composed config of the first preset,
    without precision), presets {name: precision config}, bench}, results [row, ...]
A row: preset, samples_per_s (median over repeats), samples_per_s_min, samples_per_s_max,
repeats, ratio_fp32, ratio_amp, peak_allocated_bytes, peak_reserved_bytes, mem_ratio_fp32,
saved_bytes_per_sample, saved_ratio_fp32, host_syncs_per_step, ops_per_step, flops_per_sample,
tflops, mfu,
joules_per_sample, trainer_overhead, meaningful {field: bool}, error (null or why the preset has
no figures), detail {everything else the worker measured}. With bench.baseline=true,
detail.baseline: bare (what the bare loop is, or null), note (why there is none),
suite_ops_per_step, bare_ops_per_step, suite_host_reads_per_step, bare_host_reads_per_step,
trainer_ops_per_step, trainer_host_reads_per_step, time_ratio (suite / bare seconds, median over
the rounds), time_ratio_min, time_ratio_max, time_ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

SCHEMA_VERSION = 1

# figures that mean something on any device (counts of bytes, syncs and FLOPs do not depend on
# the device's speed); the rest are proxies on a CPU
ANY_DEVICE = (
    "saved_bytes_per_sample",
    "saved_ratio_fp32",
    "host_syncs_per_step",
    "ops_per_step",
    "flops_per_sample",
)
GPU_ONLY = (
    "samples_per_s",
    "ratio_fp32",
    "ratio_amp",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "mem_ratio_fp32",
    "tflops",
    "mfu",
    "joules_per_sample",
    "trainer_overhead",
)


def aggregate(measured: dict[str, list[dict[str, Any]]], presets: list[str]) -> list[dict]:
    """One row per preset from its repeats' measurements (repeat 0 carries the one-off figures)."""
    rows = []
    for preset in presets:
        runs = [r for r in measured.get(preset, []) if "error" not in r]
        errors = [r["error"] for r in measured.get(preset, []) if "error" in r]
        if not runs:
            rows.append(_empty(preset, errors[0] if errors else "not measured"))
            continue
        first = next((r for r in runs if r["repeat"] == 0), runs[0])
        sps = [r["samples_per_s"] for r in runs]
        joules = [r["joules_per_sample"] for r in runs if r.get("joules_per_sample") is not None]
        flops = first.get("flops_per_sample")
        median = statistics.median(sps)
        tflops = flops * median / 1e12 if flops else None
        peak = first.get("peak_tflops")
        rows.append(
            {
                "preset": preset,
                "samples_per_s": median,
                "samples_per_s_min": min(sps),
                "samples_per_s_max": max(sps),
                "repeats": len(runs),
                "ratio_fp32": None,
                "ratio_amp": None,
                "peak_allocated_bytes": first.get("peak_allocated_bytes"),
                "peak_reserved_bytes": first.get("peak_reserved_bytes"),
                "mem_ratio_fp32": None,
                "saved_bytes_per_sample": first.get("saved_bytes_per_sample"),
                "saved_ratio_fp32": None,
                "host_syncs_per_step": first.get("host_syncs_per_step"),
                "ops_per_step": first.get("ops_per_step"),
                "flops_per_sample": flops,
                "tflops": tflops,
                "mfu": tflops / peak if tflops and peak else None,
                "joules_per_sample": statistics.median(joules) if joules else None,
                "trainer_overhead": first.get("trainer_overhead"),
                "meaningful": _meaningful(first),
                "error": "; ".join(errors) if errors else None,
                "detail": _detail(first, runs),
            }
        )
    _ratios(rows)
    return rows


def _empty(preset: str, error: str) -> dict:
    row = {k: None for k in ("samples_per_s", "samples_per_s_min", "samples_per_s_max")}
    row.update({k: None for k in (*ANY_DEVICE, *GPU_ONLY)})
    row.update(preset=preset, repeats=0, meaningful={}, error=error, detail={})
    return row


def _meaningful(r: dict) -> dict[str, bool]:
    gpu = r["device"]["type"] == "cuda"
    out = {k: True for k in ANY_DEVICE}
    out.update({k: gpu for k in GPU_ONLY})
    out["mfu"] = gpu and r.get("peak_tflops") is not None
    out["joules_per_sample"] = gpu and r.get("joules_per_sample") is not None
    return out


def _detail(first: dict, runs: list[dict]) -> dict:
    # what the row does not already show (the row's own fields stay out)
    shown = {"preset", "repeat", "device", "versions", *ANY_DEVICE, *GPU_ONLY}
    keep = {k: v for k, v in first.items() if k not in shown}
    keep["samples_per_s_by_repeat"] = [r["samples_per_s"] for r in sorted(runs, key=_repeat)]
    keep["skipped_in_timed_by_repeat"] = [r["skipped_in_timed"] for r in sorted(runs, key=_repeat)]
    return keep


def _repeat(r: dict) -> int:
    return r["repeat"]


def _ratios(rows: list[dict]) -> None:
    by = {r["preset"]: r for r in rows}
    for row in rows:
        for key, base_key, anchor in (
            ("ratio_fp32", "samples_per_s", "fp32"),
            ("ratio_amp", "samples_per_s", "amp"),
            ("mem_ratio_fp32", "peak_allocated_bytes", "fp32"),
            ("saved_ratio_fp32", "saved_bytes_per_sample", "fp32"),
        ):
            base = by.get(anchor, {}).get(base_key)
            if base and row.get(base_key) is not None:
                row[key] = row[base_key] / base


# -- the table ---------------------------------------------------------------------------------
COLUMNS = [
    ("preset", "preset", None),
    ("samples/s [min-max]", "samples_per_s", None),
    ("x fp32", "ratio_fp32", "ratio"),
    ("x amp", "ratio_amp", "ratio"),
    ("peak alloc GiB", "peak_allocated_bytes", "gib"),
    ("peak reserved GiB", "peak_reserved_bytes", "gib"),
    ("mem x fp32", "mem_ratio_fp32", "ratio"),
    ("saved MiB/sample", "saved_bytes_per_sample", "mib"),
    ("saved x fp32", "saved_ratio_fp32", "ratio"),
    ("host syncs/step", "host_syncs_per_step", "int"),
    ("ATen ops/step", "ops_per_step", "int"),
    ("GFLOP/sample", "flops_per_sample", "gflop"),
    ("TFLOP/s", "tflops", "float"),
    ("MFU", "mfu", "pct"),
    ("J/sample", "joules_per_sample", "float"),
    ("trainer overhead", "trainer_overhead", "pct"),
]


# how a column of each kind is printed
_FORMATS: dict[str, Callable[[Any], str]] = {
    "ratio": lambda v: f"{v:.2f}",
    "gib": lambda v: f"{v / 2**30:.2f}",
    "mib": lambda v: f"{v / 2**20:.3g}",
    "int": lambda v: f"{v:d}",
    "gflop": lambda v: f"{v / 1e9:.2f}",
    "pct": lambda v: f"{100 * v:.1f}%",
    "float": lambda v: f"{v:.3g}",
}


def _fmt(value: Any, kind: str | None) -> str:
    if value is None:
        return "n/a"
    return _FORMATS.get(kind, str)(value)


def format_table(doc: dict) -> str:
    """A Markdown table of a bench document; figures that mean nothing on its device carry
    "(proxy)", and a failed preset shows its error."""
    lines = [
        "| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
        "|" + "|".join("---" if k == "preset" else "---:" for _, k, _ in COLUMNS) + "|",
    ]
    for row in doc["results"]:
        if row.get("repeats", 0) == 0:
            cells = [row["preset"], f"failed: {row.get('error')}"] + [""] * (len(COLUMNS) - 2)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        cells = []
        for _, key, kind in COLUMNS:
            value = row.get(key)
            if key == "preset" and (row.get("detail") or {}).get("mx_storage"):
                text = f"{value} (emulation)"  # MX: the emulation's cost (mx_cost.py)
            elif key == "samples_per_s":
                text = (
                    f"{value:.4g} [{row['samples_per_s_min']:.4g}-{row['samples_per_s_max']:.4g}]"
                )
            else:
                text = _fmt(value, kind)
            if value is not None and key != "preset" and not row["meaningful"].get(key, True):
                text += " (proxy)"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_state(doc: dict) -> str | None:
    """What each rank holds for parameters, gradients and optimizer state after the timed steps
    (bench.nproc processes; fsdp.state_bytes), one line per preset; None when not measured."""
    lines = []
    for row in doc["results"]:
        per_rank = (row.get("detail") or {}).get("state_bytes_per_rank")
        if per_rank:
            shown = ", ".join(f"{b / 2**20:.3f}" for b in per_rank)
            n = len(per_rank)
            lines.append(f"  {row['preset']}: {shown} MiB ({n} process{'es' if n > 1 else ''})")
    if not lines:
        return None
    suite = doc["config"].get("suite") or {}
    strategy = suite.get("distributed", {}).get("strategy", "ddp")
    head = f"parameters + gradients + optimizer state per rank (distributed.strategy={strategy}):"
    return "\n".join([head, *lines])


def describe_run(doc: dict) -> str:
    """The lines under the table: what was measured, where, and what the proxies mean."""
    d, c = doc["device"], doc["config"]
    b = c["bench"]
    suite = c["suite"]
    # the input size where the data has one (images; a corpus or speech has none)
    size = suite["data"].get("image_size")
    lines = [
        f"{suite['experiment_name']} ({suite['model']['name']}"
        + (f" {suite['model']['variant']}" if suite["model"].get("variant") else "")
        + f"), data={suite['data']['name']}, batch {doc.get('batch')}"
        + (f", image {size} px" if size else "")
        + f"; device {d['type']}: {d['name']}; "
        f"{b['warmup']} warm-up + {b['steps']} timed steps x {b['repeats']} repeats "
        "(fresh process per preset and repeat, interleaved)",
        f"torch {doc['versions'].get('torch')}, commit {doc.get('commit') or 'unknown'}"
        + (" (+ local changes)" if doc.get("commit_dirty") else ""),
    ]
    if d["type"] != "cuda":
        lines.append(
            "(proxy): not meaningful on a CPU (no tensor cores, no fast FP16, no device memory): "
            "speed, memory and energy are for a GPU run. Saved bytes, host syncs and FLOPs "
            "count the same on any device."
        )
    skipped = {(r.get("detail") or {}).get("not_instrumented") for r in doc["results"]} - {None}
    lines += sorted(skipped)  # trainer.compile: why the counted columns are n/a (bench/worker.py)
    from mpt_repro.bench.mx_cost import describe as describe_mx

    return "\n".join(lines + describe_mx(doc))


# -- the baseline table (bench.baseline=true) ---------------------------------------------------
def format_baseline(doc: dict) -> str | None:
    """A Markdown table of each preset's step against its bare loop (None without one): ATen
    ops and host reads per step of each and their difference, the Trainer's per step, and the
    time ratio suite / bare, median [min-max] over the interleaved rounds ("(proxy)" off a GPU)."""
    rows = [r for r in doc["results"] if (r.get("detail") or {}).get("baseline")]
    if not rows:
        return None
    gpu = doc["device"]["type"] == "cuda"
    lines = [
        "| preset | bare loop | ops/step suite | ops/step bare | + over bare | Trainer ops/step "
        "| host reads/step suite / bare | time x bare [min-max] |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        b = row["detail"]["baseline"]
        if b.get("bare") is None:
            lines.append(f"| {row['preset']} | none: {b.get('note')} |" + " |" * 6)
            continue
        ours, bare = b["suite_ops_per_step"], b["bare_ops_per_step"]
        ratio = f"{b['time_ratio']:.3f} [{b['time_ratio_min']:.3f}-{b['time_ratio_max']:.3f}]" + (
            "" if gpu else " (proxy)"
        )
        trainer = b.get("trainer_ops_per_step")
        cells = [
            row["preset"],
            b["bare"],
            f"{ours:g}",
            f"{bare:g}",
            f"{ours - bare:+g}",
            f"{trainer:g}" if trainer is not None else "n/a",
            f"{b['suite_host_reads_per_step']:g} / {b['bare_host_reads_per_step']:g}",
            ratio,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
