"""The closing block: the lines that end a run on the console (status, final metrics, cost,
where the record, metrics, events and figures are, and how to compare)."""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpt_repro.evidence import describe_dropped
from mpt_repro.record import (
    NO_STEP_ADVICE,
    SLOW_FP16_NOTE,
    no_step_applied,
    normalised_status,
    slow_low_precision,
)
from mpt_repro.runlog.console import _short
from mpt_repro.runlog.metrics import TB_EVENTS_GLOB, tb_dir

log = logging.getLogger("mpt_repro")


def counted(n: int, noun: str) -> str:
    """`1 skipped step`, `0 skipped steps`, `6 skipped steps`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _all(n: int) -> str:
    """`all 6 optimizer steps were`, or `the only optimizer step was`."""
    return "the only optimizer step was" if n == 1 else f"all {n} optimizer steps were"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def closing_block(
    record: Mapping[str, Any], run_dir: Path, runs_root: Path | None = None
) -> tuple[str, bool]:
    """The lines that end a run on the console, and whether they deserve a WARNING (a diverged,
    failed or interrupted run, or final metrics that are not finite)."""
    run_dir = Path(run_dir)
    status = normalised_status(record) or "unknown"
    model = record.get("model") or {}
    subject = record.get("experiment")
    if model.get("target"):  # your own model: named, never taken for the experiment's own
        subject = f"{subject} · {model.get('name')}"
    parts = (subject, record.get("precision"), record.get("budget"), f"seed {record.get('seed')}")
    name = " / ".join(str(x) for x in parts)
    lines = [f"── {name}: {status} " + "─" * max(0, 60 - len(name) - len(status))]
    shown, bad = _metrics_lines(record)
    lines += shown
    untrained = no_step_applied(record)
    if untrained:
        lines.append(
            f"  NO STEP        {_all(int(record['steps']))} skipped for an overflow: "
            f"the metrics are the untrained model's ({NO_STEP_ADVICE})"
        )
    lines += _ending_lines(record, status, run_dir) + _cost_lines(record)
    lines += _where_lines(record, run_dir, runs_root)
    return "\n".join(lines), status != "completed" or bad or untrained


def _metrics_lines(record: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The final metrics (the primary one first) and what they rest on, and whether any is not
    finite or is undefined (nothing to score)."""
    metrics = record.get("metrics") or {}
    if not metrics:
        return [], False
    primary = record.get("primary_metric")
    evaluation = record.get("evaluation") or {}
    undefined = evaluation.get("undefined") or {}
    order = sorted(metrics, key=lambda k: k != primary)
    shown = ", ".join(
        f"{k}={_short(float(metrics[k])) if _finite(metrics[k]) else _value(metrics[k])}"
        + (" (primary)" if k == primary else "")
        for k in order
    )
    lines = [f"  final metrics  {shown}"]
    if evaluation.get("items") is not None:
        lines.append(f"  evaluated on   {_evidence(evaluation)}")
    dropped = describe_dropped(evaluation)
    if dropped:
        lines.append(f"  DROPPED        {dropped}")
    bad = [k for k in order if metrics[k] is not None and not _finite(metrics[k])]
    if bad:
        lines.append(f"  NOT FINITE     {', '.join(bad)}: check the curves before using them")
    for name, why in undefined.items():
        lines.append(f"  UNDEFINED      {name}: {why}")
    return lines, bool(bad or undefined or dropped)


def _value(x: Any) -> str:
    return "undefined" if x is None else str(x)


def _evidence(evaluation: Mapping[str, Any]) -> str:
    """`360 images` and each other count a metric rests on: `360 images; 9,120 tokens
    (perplexity, loss)`."""
    unit, items = evaluation.get("unit"), evaluation.get("items")
    by_unit: dict[str, list[str]] = {}
    counts = evaluation.get("counts") or {}
    for metric, other in (evaluation.get("units") or {}).items():
        if other != unit:
            by_unit.setdefault(f"{counts.get(metric, 0):,} {other}", []).append(metric)
    extra = "".join(f"; {count} ({', '.join(names)})" for count, names in by_unit.items())
    return f"{items:,} {unit}{extra}"


def _ending_lines(record: Mapping[str, Any], status: str, run_dir: Path) -> list[str]:
    """How a run that did not complete ended, and what to do next."""
    lines = []
    if status == "diverged":
        where = f"at step {record.get('diverged_at_step')}"
        layer = record.get("diverged_layer") or (record.get("diagnostics") or {}).get(
            "first_nonfinite_layer"
        )
        if layer:
            where += f", first non-finite gradient in {layer}"
        lines.append(f"  diverged       {where}: {record.get('reason')}")
    elif status in ("failed", "interrupted"):
        lines.append(f"  reason         {record.get('reason')}")
    if record.get("hint"):
        lines.append(f"  next           {record['hint']}")
    elif status == "interrupted":
        lines.append("  next           the same command with resume=true continues it")
    elif status == "failed" and record.get("traceback"):
        lines.append(f"  traceback      in {run_dir / 'run.json'} (and the run's log file)")
    return lines


def _cost_lines(record: Mapping[str, Any]) -> list[str]:
    cost = []
    if _finite(record.get("steps")):
        cost.append(counted(int(record["steps"]), "step"))
    if _finite(record.get("wall_time_s")):
        cost.append(f"{record['wall_time_s']:.1f} s")
    if _finite(record.get("samples_per_s")):
        cost.append(f"{record['samples_per_s']:.0f} samples/s")
    if _finite(record.get("peak_memory_bytes")):
        kind = record.get("peak_memory_kind")
        cost.append(
            f"peak memory {record['peak_memory_bytes'] / 2**20:.0f} MiB"
            + (f" ({kind})" if kind else "")
        )
    lines = [f"  cost           {', '.join(cost)}"] if cost else []
    why = slow_low_precision(record.get("device"))
    if cost and why and record.get("precision") != "fp32":
        lines.append(f"  speed          {SLOW_FP16_NOTE.format(why=why)}")
    scale = record.get("loss_scale") or {}
    if _finite(scale.get("final")):
        lines.append(
            f"  loss scale     final {scale['final']:g}, min {scale.get('min', scale['final']):g}; "
            f"{counted(int(record.get('skipped_steps') or 0), 'skipped step')}"
        )
    return lines


def _where_lines(record: Mapping[str, Any], run_dir: Path, runs_root: Path | None) -> list[str]:
    """Where the record, curves, events and figures are, and the commands that compare."""
    lines = [f"  run record     {run_dir / 'run.json'}"]
    if (run_dir / "metrics.csv").exists():
        lines.append(f"  metrics        {run_dir / 'metrics.csv'}")
    if any(tb_dir(run_dir).glob(TB_EVENTS_GLOB)):
        lines.append(f"  TensorBoard    {tb_dir(run_dir)}")
    # the telemetry callback's summary sits in diagnostics (trainer.final_summary)
    telemetry = record.get("telemetry") or (record.get("diagnostics") or {}).get("telemetry")
    figures = (telemetry or {}).get("figures") or []
    if figures:
        lines.append(f"  figures        {', '.join(str(run_dir / f) for f in figures)}")
    root = Path(runs_root) if runs_root is not None else None
    if root is None or not _inside(run_dir, root):
        root = run_dir
    lines.append(f"  compare        mpt-report {shlex.quote(str(root))}")
    lines.append(f"                 tensorboard --logdir {shlex.quote(str(root))}")
    return lines


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def log_closing_block(
    record: Mapping[str, Any],
    run_dir: Path,
    runs_root: Path | None = None,
    logger: logging.Logger | None = None,
) -> str:
    """Log the closing block (WARNING when the run did not complete cleanly); returns its text."""
    text, warn = closing_block(record, run_dir, runs_root)
    (logger or log).log(logging.WARNING if warn else logging.INFO, "\n%s", text)
    return text
