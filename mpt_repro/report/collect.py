"""Read every run record under a results folder into one table, and list what cannot be used.

A run takes part in the tables when it completed or diverged (a diverged run is a result: the
paper reports them). Everything else (failed, still running or interrupted, unreadable, from
another schema) goes into the problems list with its path and reason, so nothing is dropped
without the reader seeing it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
# the fields a record needs before it can be placed in any table
REQUIRED = (
    "experiment",
    "task",
    "precision",
    "seed",
    "budget",
    "status",
    "metrics",
    "primary_metric",
)
# the grouping key: runs are averaged over seeds only when all of these agree, so a synthetic-data
# run is never averaged with a real-data run, nor a CPU run with a GPU run
GROUP_KEYS = ["experiment", "task", "precision", "budget", "data", "device"]
# the numbers of the cost table, as run.json names them
COST_FIELDS = ["wall_time_s", "samples_per_s", "peak_memory_bytes", "steps", "skipped_steps"]


@dataclass(frozen=True)
class Problem:
    """A record left out of the tables, and why."""

    path: str
    status: str
    reason: str


def device_label(device: dict | None) -> str:
    """A short, stable name for the hardware: `cpu`, `cuda: NVIDIA H100 80GB HBM3`, `... ×8`."""
    if not isinstance(device, dict):
        return "unknown"
    kind = str(device.get("type") or "unknown")
    name = device.get("name")
    label = kind if not name or name == kind else f"{kind}: {name}"
    count = device.get("count")
    if isinstance(count, int) and count > 1:
        label += f" ×{count}"
    return label


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _flatten(record: dict, path: Path) -> dict:
    """One row of the runs table: the grouping key, status, metrics (metric_<name>) and costs."""
    data = record.get("data") or {}
    model = record.get("model") or {}
    scale = record.get("loss_scale") or {}
    row = {
        "path": str(path.parent),
        "experiment": record["experiment"],
        "task": record["task"],
        "precision": record["precision"],
        "seed": record["seed"],
        "budget": record["budget"],
        "data": data.get("name") or "unknown",
        "data_description": data.get("description") or "",
        "device": device_label(record.get("device")),
        "model": model.get("name") or "",
        "status": record["status"],
        "reason": record.get("reason"),
        "diverged_at_step": record.get("diverged_at_step"),
        "primary_metric": record["primary_metric"],
        "higher_is_better": bool(record.get("higher_is_better", True)),
        "epochs": record.get("epochs"),
        "peak_memory_kind": record.get("peak_memory_kind") or "",
        "loss_scale_final": scale.get("final"),
    }
    for name in COST_FIELDS:
        row[name] = record.get(name) if _finite(record.get(name)) else None
    for name, value in record["metrics"].items():
        row[f"metric_{name}"] = value if _finite(value) else None
    return row


def _check(record, path: Path) -> Problem | None:
    """Why this record cannot be tabulated, or None when it can."""
    where = str(path.parent)
    if not isinstance(record, dict):
        return Problem(where, "unreadable", "run.json does not hold a JSON object")
    if record.get("schema_version") != SCHEMA_VERSION:
        return Problem(
            where,
            "unreadable",
            f"schema_version {record.get('schema_version')!r}, this reporter reads "
            f"{SCHEMA_VERSION}",
        )
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        return Problem(where, "unreadable", f"missing fields: {', '.join(missing)}")
    status = record["status"]
    if status == "failed":
        return Problem(where, "failed", record.get("reason") or "no reason recorded")
    if status == "running":
        # the trainer rewrites the record at the end, so `running` means in progress or killed
        started = record.get("started_at") or "an unknown time"
        return Problem(
            where, "running", f"still running or interrupted (started {started}, never finished)"
        )
    if status not in ("completed", "diverged"):
        return Problem(where, "unreadable", f"unknown status {status!r}")
    if not isinstance(record["metrics"], dict):
        return Problem(where, "unreadable", "metrics is not an object")
    if status == "completed" and not _finite(record["metrics"].get(record["primary_metric"])):
        return Problem(
            where,
            "unreadable",
            f"completed but its primary metric {record['primary_metric']!r} is missing or not "
            "finite",
        )
    return None


def load_runs(root: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """All run.json under `root`: the usable runs as a DataFrame, and the problems."""
    rows, problems = [], []
    for path in sorted(Path(root).rglob("run.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            problems.append(
                Problem(str(path.parent), "unreadable", f"cannot parse run.json: {err}")
            )
            continue
        problem = _check(record, path)
        if problem:
            problems.append(problem)
            continue
        rows.append(_flatten(record, path))
        # a run can complete with a NaN loss (e.g. an overflow in evaluation); it stays in the
        # tables as recorded, but the reader is told
        bad = sorted(k for k, v in record["metrics"].items() if not _finite(v))
        if record["status"] == "completed" and bad:
            values = ", ".join(f"{k}={record['metrics'][k]}" for k in bad)
            problems.append(
                Problem(
                    str(path.parent),
                    "suspect",
                    f"completed with non-finite final metrics ({values}); kept in the tables",
                )
            )
    columns = ["path", *GROUP_KEYS, "seed", "status"]
    runs = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)
    return _without_override_variants(runs, problems), problems


def _without_override_variants(runs: pd.DataFrame, problems: list[Problem]) -> pd.DataFrame:
    """Runs that differ only in extra overrides (e.g. optim.lr=0.5, a sub-folder of seed<N>/)
    share a grouping key and a seed: averaging them as if they were seeds would be wrong. Keep the
    run with the fewest overrides (the shortest path) and list the others."""
    if runs.empty:
        return runs
    order = runs["path"].str.len().sort_values(kind="stable").index
    dup = runs.loc[order].duplicated(subset=[*GROUP_KEYS, "seed"], keep="first")
    for path in runs.loc[order][dup]["path"]:
        problems.append(
            Problem(
                path,
                "variant",
                "same experiment, preset, budget, data, device and seed as "
                "another run, with other overrides: not averaged as a seed (report its folder on "
                "its own)",
            )
        )
    return runs.drop(index=dup[dup].index).sort_index()


def load_metrics_csv(run_dir: str) -> pd.DataFrame | None:
    """A run's metrics.csv, or None when it is missing or unreadable (the caller reports it)."""
    path = Path(run_dir) / "metrics.csv"
    try:
        return pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError):
        return None
