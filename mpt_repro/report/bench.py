"""Benchmark tables from the JSON files `mpt-bench` writes (results/bench/*.json).

One table per file: a row per preset with throughput, memory, FLOPs, energy and the trainer's
overhead. A figure the benchmark marks as not meaningful on its device (`meaningful[field]` is
false, e.g. speed and memory on a CPU, where only saved bytes, host syncs and FLOPs count) shows
`n/a`; a figure it did not measure (null or absent) is a blank cell; a preset whose workers
failed shows `failed: <error>`. A file that cannot be read is listed with its problem and never
stops the report.

The layout read (mpt_repro/bench/results.py): top-level device, versions, commit, commit_dirty,
batch, config {overrides, suite (the composed config), presets {name: precision config}, bench},
results [{preset, samples_per_s (median), samples_per_s_min, samples_per_s_max, repeats,
ratio_fp32, ratio_amp, peak_allocated_bytes, peak_reserved_bytes, mem_ratio_fp32,
saved_bytes_per_sample, saved_ratio_fp32, host_syncs_per_step, flops_per_sample, tflops, mfu,
joules_per_sample, trainer_overhead (a fraction), meaningful {field: bool}, error}]; any field
may be missing or null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from mpt_repro import catalog
from mpt_repro.report.collect import Problem, device_label
from mpt_repro.report.tables import Table, slugify
from mpt_repro.safeio import NotARegularFile, read_text

NOT_MEANINGFUL = "n/a"
MiB = 2**20


def _number(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _significant(figures: int, scale: float = 1.0) -> Callable[[Any], str]:
    def fmt(x) -> str:
        value = _number(x)
        return "" if value is None else f"{value / scale:.{figures}g}"

    return fmt


def _fixed(decimals: int, scale: float = 1.0) -> Callable[[Any], str]:
    def fmt(x) -> str:
        # a timing may come as {median, min, max} over the interleaved repeats
        if isinstance(x, dict):
            mid = _number(x.get("median"))
            lo, hi = _number(x.get("min")), _number(x.get("max"))
            if mid is None:
                return ""
            text = f"{mid / scale:.{decimals}f}"
            if lo is not None and hi is not None:
                text += f" ({lo / scale:.{decimals}f}–{hi / scale:.{decimals}f})"
            return text
        value = _number(x)
        return "" if value is None else f"{value / scale:.{decimals}f}"

    return fmt


def _percent(decimals: int, signed: bool = False) -> Callable[[Any], str]:
    def fmt(x) -> str:
        value = _number(x)
        if value is None:
            return ""
        return f"{100 * value:+.{decimals}f}%" if signed else f"{100 * value:.{decimals}f}%"

    return fmt


# (field in the JSON, column heading, formatter); the fields of mpt-bench's results entries
COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("samples_per_s", "Samples/s", _fixed(1)),
    ("ratio_fp32", "÷ fp32", _fixed(2)),
    ("ratio_amp", "÷ amp", _fixed(2)),
    ("peak_allocated_bytes", "Peak allocated (MiB)", _fixed(1, MiB)),
    ("peak_reserved_bytes", "Peak reserved (MiB)", _fixed(1, MiB)),
    ("mem_ratio_fp32", "Memory ÷ fp32", _fixed(2)),
    ("saved_bytes_per_sample", "Saved for backward (MiB/sample)", _significant(3, MiB)),
    ("saved_ratio_fp32", "Saved ÷ fp32", _fixed(2)),
    ("host_syncs_per_step", "Host syncs/step", _significant(3)),
    ("ops_per_step", "ATen ops/step", _fixed(0)),
    ("flops_per_sample", "GFLOP/sample", _significant(3, 1e9)),
    ("tflops", "TFLOP/s", _significant(3)),
    ("mfu", "MFU", _percent(1)),
    ("joules_per_sample", "J/sample", _fixed(3)),
    ("trainer_overhead", "Trainer overhead", _percent(1, signed=True)),
]


def _device_text(device) -> str:
    if isinstance(device, dict):
        return device_label(device)
    return str(device) if device else "unknown device"


def _setting(path: Path, bench: dict) -> tuple[str, str]:
    """(experiment, the caption's setting) from the file's top-level fields."""
    config = bench.get("config") if isinstance(bench.get("config"), dict) else {}
    suite = config.get("suite") if isinstance(config.get("suite"), dict) else {}
    runs = config.get("bench") if isinstance(config.get("bench"), dict) else {}
    versions = bench.get("versions") if isinstance(bench.get("versions"), dict) else {}
    experiment = suite.get("experiment_name") or config.get("experiment") or path.stem
    parts = [f"`{path.name}`", f"device {_device_text(bench.get('device'))}"]
    model = (suite.get("model") or {}).get("name") if isinstance(suite.get("model"), dict) else None
    data = (suite.get("data") or {}).get("name") if isinstance(suite.get("data"), dict) else None
    if model or data:
        parts.append(
            ", ".join(
                x for x in (f"model {model}" if model else "", f"data {data}" if data else "") if x
            )
        )
    if bench.get("batch"):
        parts.append(f"batch {bench['batch']}")
    if all(isinstance(runs.get(k), int) for k in ("warmup", "steps", "repeats")):
        parts.append(
            f"{runs['warmup']} warm-up + {runs['steps']} timed steps × {runs['repeats']} repeats"
        )
    overrides = config.get("overrides")
    if isinstance(overrides, list) and overrides:
        parts.append("overrides " + " ".join(str(o) for o in overrides))
    if bench.get("commit"):
        parts.append(
            f"commit {str(bench['commit'])[:12]}"
            + (" (+ local changes)" if bench.get("commit_dirty") else "")
        )
    if versions.get("torch"):
        parts.append(f"torch {versions['torch']}")
    return str(experiment), "; ".join(parts) + "."


def _samples_cell(entry: dict) -> str:
    """median (min–max) over the repeats when the file gives them."""
    median = _number(entry.get("samples_per_s"))
    if isinstance(entry.get("samples_per_s"), dict):
        return _fixed(1)(entry["samples_per_s"])
    if median is None:
        return ""
    low, high = _number(entry.get("samples_per_s_min")), _number(entry.get("samples_per_s_max"))
    text = f"{median:.1f}"
    return text + (f" ({low:.1f}–{high:.1f})" if low is not None and high is not None else "")


def bench_table(path: Path, bench: dict) -> Table:
    """The table of one benchmark file (already known to hold a `results` list)."""
    entries = [e for e in bench["results"] if isinstance(e, dict) and e.get("preset")]
    config = bench.get("config") if isinstance(bench.get("config"), dict) else {}
    configs = config.get("presets") if isinstance(config.get("presets"), dict) else {}
    order = catalog.preset_order([str(e["preset"]) for e in entries], configs)
    entries.sort(key=lambda e: order.index(str(e["preset"])))
    rows, not_meaningful, failed = [], set(), []
    for entry in entries:
        meaningful = entry.get("meaningful") if isinstance(entry.get("meaningful"), dict) else {}
        row = {"Preset": str(entry["preset"])}
        if entry.get("error") and not entry.get("repeats"):
            # no figures at all: the workers of this preset failed
            row.update({h: "" for _, h, _ in COLUMNS})
            row["Samples/s"] = f"failed: {entry['error']}"
            rows.append(row)
            continue
        if entry.get("error"):
            failed.append(f"{entry['preset']}: {entry['error']}")
        for key, heading, fmt in COLUMNS:
            if meaningful.get(key) is False:
                row[heading] = NOT_MEANINGFUL
                not_meaningful.add(heading)
            elif key == "samples_per_s":
                row[heading] = _samples_cell(entry)
            else:
                row[heading] = fmt(entry.get(key))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=["Preset", *[h for _, h, _ in COLUMNS]])
    # a column nobody measured only takes room
    frame = frame.loc[:, [c for c in frame.columns if c == "Preset" or (frame[c] != "").any()]]
    experiment, setting = _setting(path, bench)
    device = _device_text(bench.get("device"))
    notes = [
        "Measured by mpt-bench on data resident on the device, warm-up excluded, one fresh "
        "process per preset and repeat; ratios divide by the fp32 (or amp) row of the same file; "
        "Samples/s: median (min–max) over the repeats."
    ]
    if not_meaningful:
        notes.append(
            f"{NOT_MEANINGFUL}: not meaningful on this device "
            f"({', '.join(h for _, h, _ in COLUMNS if h in not_meaningful)}); the file keeps the "
            "measured value as a proxy."
        )
    notes += [f"Some repeats failed: {f}." for f in failed]
    return Table(
        slugify("bench", path.stem),
        f"Benchmark: {experiment} on {device}",
        setting,
        frame,
        notes,
    )


def bench_tables(folder: Path) -> tuple[list[Table], list[Problem]]:
    """A table per results/bench/*.json (sorted by name), and the files that could not be read."""
    tables, problems = [], []
    if not Path(folder).is_dir():
        return tables, problems
    for path in sorted(Path(folder).glob("*.json")):
        try:
            bench = json.loads(read_text(path))
        except NotARegularFile as err:  # a FIFO is never opened: it would wait for a writer
            problems.append(Problem(str(path), "malformed", f"{err.what}, not a benchmark file"))
            continue
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            problems.append(Problem(str(path), "malformed", f"cannot parse benchmark file: {err}"))
            continue
        if not isinstance(bench, dict) or not isinstance(bench.get("results"), list):
            problems.append(
                Problem(str(path), "malformed", "benchmark file without a `results` list")
            )
            continue
        try:
            tables.append(bench_table(path, bench))
        except Exception as err:  # noqa: BLE001 - one odd file must not stop the report
            problems.append(
                Problem(str(path), "malformed", f"cannot read: {type(err).__name__}: {err}")
            )
    return tables, problems
