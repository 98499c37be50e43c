"""Benchmark tables from the JSON files `mpt-bench` writes (results/bench/*.json).

One table per file: a row per preset with throughput, memory, FLOPs, energy and the trainer's
overhead. A figure the benchmark marks as not meaningful on its device (`meaningful[field]` is
false, e.g. MFU or energy on a CPU) shows `n/a`; a figure it did not measure (null or absent) is a
blank cell. A file that cannot be read is listed with its problem and never stops the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from mpt_repro.report.aggregate import preset_order
from mpt_repro.report.collect import Problem, device_label
from mpt_repro.report.tables import Table, slugify

NOT_MEANINGFUL = "n/a"
MiB = 2**20


def _number(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


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
    ("saved_bytes_per_sample", "Saved for backward (MiB/sample)", _fixed(2, MiB)),
    ("host_syncs_per_step", "Host syncs/step", _fixed(1)),
    ("flops_per_sample", "GFLOP/sample", _fixed(2, 1e9)),
    ("tflops", "TFLOP/s", _fixed(2)),
    ("mfu", "MFU", _percent(1)),
    ("joules_per_sample", "J/sample", _fixed(3)),
    ("trainer_overhead", "Trainer overhead", _percent(1, signed=True)),
]


def _device_text(device) -> str:
    if isinstance(device, dict):
        return device_label(device)
    return str(device) if device else "unknown device"


def _config_text(config) -> str:
    if not isinstance(config, dict):
        return ""
    shown = [
        f"{k}={v}"
        for k, v in config.items()
        if isinstance(v, (str, int, float, bool)) and v is not None and k != "presets"
    ]
    return ", ".join(shown)


def bench_table(path: Path, bench: dict) -> Table:
    """The table of one benchmark file (already known to hold a `results` list)."""
    entries = [e for e in bench["results"] if isinstance(e, dict) and e.get("preset")]
    order = preset_order([str(e["preset"]) for e in entries])
    entries.sort(key=lambda e: order.index(str(e["preset"])))
    rows, not_meaningful = [], set()
    for entry in entries:
        meaningful = entry.get("meaningful") if isinstance(entry.get("meaningful"), dict) else {}
        row = {"Preset": str(entry["preset"])}
        for key, heading, fmt in COLUMNS:
            if meaningful.get(key) is False:
                row[heading] = NOT_MEANINGFUL
                not_meaningful.add(heading)
            else:
                row[heading] = fmt(entry.get(key))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=["Preset", *[h for _, h, _ in COLUMNS]])
    # a column nobody measured only takes room
    frame = frame.loc[:, [c for c in frame.columns if c == "Preset" or (frame[c] != "").any()]]
    config = bench.get("config") if isinstance(bench.get("config"), dict) else {}
    versions = bench.get("versions") if isinstance(bench.get("versions"), dict) else {}
    experiment = config.get("experiment") or config.get("experiment_name") or path.stem
    device = _device_text(bench.get("device"))
    setting = [f"`{path.name}`", f"device {device}"]
    if bench.get("commit"):
        setting.append(f"commit {bench['commit']}")
    if versions.get("torch"):
        setting.append(f"torch {versions['torch']}")
    config_text = _config_text(config)
    if config_text:
        setting.append(config_text)
    notes = [
        "Measured by mpt-bench on data resident on the device, warm-up excluded; ratios divide "
        "by the fp32 (or amp) row of the same file. Timings with a range: median (min–max) over "
        "the interleaved repeats."
    ]
    if not_meaningful:
        notes.append(
            f"{NOT_MEANINGFUL}: not meaningful on this device "
            f"({', '.join(sorted(not_meaningful))})."
        )
    return Table(
        slugify("bench", path.stem),
        f"Benchmark: {experiment} on {device}",
        "; ".join(setting) + ".",
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
            bench = json.loads(path.read_text())
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
