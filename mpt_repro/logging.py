"""Where numbers go during a run, and what the console shows.

TensorBoard: the event files go straight into the run directory, so that
`tensorboard --logdir results/runs` names each run by its folder, `experiment/precision-budget/
seedN` (a `<overrides>` sub-folder when there are extra overrides), the way the runs are compared.
Each run also writes (`write_run_summary`, at its end) what the HParams dashboard needs to compare
runs: an explicit experiment config with the hyperparameters precision, experiment, seed, budget
and device marked to show first, and the run's outcome as metrics (samples/s, peak memory, final
and minimum loss scale, skipped steps, a status code, the final evaluation). A custom-scalars
layout puts the presets of one experiment and budget on one chart (train loss, loss scale,
samples/s, each evaluation metric): TensorBoard's charts select by tag, not by run, so these few
values are also written under `compare/<experiment>-<budget>/...`.

metrics.csv: one row per log row and evaluation (README "The run record").

Console: one progress bar per run on a terminal, with logging routed through the bar (`tqdm.write`)
so log lines never glue onto it and no stale bar stays behind; without a terminal (a log file, a
cluster job) no bar at all, and a plain log line at most every `PLAIN_LOG_INTERVAL_S` seconds.
`closing_block` says at the end how the run went, where everything is and how to compare.
"""

from __future__ import annotations

import csv
import logging
import math
import re
import shlex
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

BASE_COLUMNS = [
    "step",
    "epoch",
    "split",
    "loss",
    "lr",
    "loss_scale",
    "skipped_steps",
    "samples_per_s",
    "wall_time_s",
]
# TensorBoard's event files, in the run directory itself (see the module docstring)
TB_EVENTS_GLOB = "events.out.tfevents.*"
# the train-row values that go onto the per-experiment comparison charts
COMPARED_TRAIN = {"loss": "train loss", "loss_scale": "loss scale", "samples_per_s": "samples/s"}
# without a terminal: at most one progress line per this many seconds (and the last step)
PLAIN_LOG_INTERVAL_S = 30.0

log = logging.getLogger("mpt_repro")


def tb_dir(run_dir: Path) -> Path:
    """Where a run's TensorBoard events go: the run directory itself."""
    return Path(run_dir)


def comparison_group(cfg: Any) -> str:
    """The runs drawn on one custom-scalars chart: one study (the experiment, or the experiment
    with your own model), budget and data set, and the same other overrides (the run directory's
    variant folder), so only runs that differ in precision and seed share a chart."""
    from mpt_repro.identity import study_name

    group = f"{study_name(cfg.experiment_name, cfg.model)}-{cfg.budget.name}-{cfg.data.name}"
    variant = job_variant(cfg)
    return f"{group} [{variant}]" if variant else group


def job_variant(cfg: Any) -> str:
    """The variant folder of this run (its other overrides), or "" outside an mpt-run job."""
    from hydra.core.hydra_config import HydraConfig

    from mpt_repro.identity import is_custom_model, variant_name

    if not HydraConfig.initialized():
        return ""
    return variant_name(HydraConfig.get().overrides.task, is_custom_model(cfg.model))


@dataclass
class Resume:
    """Where a resumed run's log continues: the checkpoint's step, whether the evaluation at that
    step ran before the checkpoint was saved (the final one runs after it), and the rows the
    checkpoint holds (None for a checkpoint written before it held them)."""

    step: int
    eval_done: bool
    rows: list[dict[str, Any]] | None = None


class MetricsLogger:
    """Scalars to TensorBoard (events in the run directory) and rows to metrics.csv.

    On resume the file holds exactly the rows of an uninterrupted run up to the checkpoint: the
    checkpoint's own copy of them (so a metrics.csv deleted or cut short is rebuilt, and the log
    says so), or for an older checkpoint the file's rows up to its step. With `compare_group`
    (`comparison_group(cfg)`), the train loss, loss scale, samples/s and evaluation metrics are
    also written where the custom-scalars layout looks.
    """

    def __init__(
        self,
        run_dir: Path,
        metric_names: list[str],
        resume: Resume | None = None,
        compare_group: str | None = None,
    ):
        from torch.utils.tensorboard import SummaryWriter

        self.columns = BASE_COLUMNS + [m for m in metric_names if m not in BASE_COLUMNS]
        self.csv_path = Path(run_dir) / "metrics.csv"
        self.rows: list[dict[str, Any]] = self._resumed_rows(resume) if resume else []
        self._file = open(self.csv_path, "w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._csv.writeheader()
        self._csv.writerows(self.rows)
        self._file.flush()
        # purge_step: TensorBoard hides the events the killed run wrote after its checkpoint (the
        # rows at the checkpoint's own step were written before it and stay)
        self.writer = SummaryWriter(
            log_dir=str(tb_dir(run_dir)),
            purge_step=None if resume is None else resume.step + 1,
        )
        self.compare_group = compare_group
        if compare_group:
            self.writer.add_custom_scalars(comparison_layout(compare_group, metric_names))

    def _resumed_rows(self, resume: Resume) -> list[dict[str, Any]]:
        on_disk = self._rows_up_to(resume.step, resume.eval_done)
        if resume.rows is None:
            return on_disk
        if len(on_disk) < len(resume.rows):
            found = f"held {len(on_disk)} rows" if self.csv_path.exists() else "was missing"
            log.warning(
                "%s %s: rebuilt its %d rows up to step %d from the checkpoint",
                self.csv_path,
                found,
                len(resume.rows),
                resume.step,
            )
        return [dict(row) for row in resume.rows]

    def _rows_up_to(self, step: int, eval_done: bool) -> list[dict[str, str]]:
        """The file's rows up to `step` (an evaluation at `step` only if it ran before the
        checkpoint: the final one is run again, and must not appear twice)."""
        if not self.csv_path.exists():
            return []
        with open(self.csv_path, newline="") as f:
            return [
                r
                for r in csv.DictReader(f)
                if int(r["step"]) < step
                or (int(r["step"]) == step and (r["split"] != "eval" or eval_done))
            ]

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if value is not None and key not in ("epoch",):
                self.writer.add_scalar(f"{split}/{key}", value, step)
        if self.compare_group:
            for key, value in values.items():
                if value is None or key == "epoch":
                    continue
                if split == "train" and key in COMPARED_TRAIN:
                    self.writer.add_scalar(compare_tag(self.compare_group, key), value, step)
                elif split == "eval":
                    self.writer.add_scalar(
                        compare_tag(self.compare_group, f"eval_{key}"), value, step
                    )
        row = {"step": step, "split": split, **values}
        self.rows.append(row)  # the checkpoint keeps them (Resume.rows)
        self._csv.writerow(row)
        self._file.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
        self._file.close()


# ---------------------------------------------------------------- custom scalars


def compare_tag(group: str, key: str) -> str:
    return f"compare/{group}/{key}"


def comparison_layout(group: str, metric_names: list[str]) -> dict:
    """add_custom_scalars layout: one category per experiment and budget, one chart per compared
    value; every run of the group is a line on it (TensorBoard merges the runs' layouts by
    category title)."""

    def chart(key: str) -> list:
        return ["Multiline", [f"^{re.escape(compare_tag(group, key))}$"]]

    charts = {title: chart(key) for key, title in COMPARED_TRAIN.items()}
    for name in metric_names:
        charts[f"eval {name}"] = chart(f"eval_{name}")
    return {f"{group}: presets compared": charts}


# ---------------------------------------------------------------- HParams


# the hyperparameters runs are compared by, shown first (in this order where TensorBoard keeps it)
KEY_HPARAMS = ("precision", "experiment", "seed", "budget", "device")
# status code metric: what each outcome is, as a number TensorBoard can sort and filter by
STATUS_CODES = {"completed": 0, "diverged": 1, "failed": 2, "interrupted": 3}
SUMMARY_METRICS = {
    # tag: (display name, description)
    "run/status_code": (
        "status",
        "0 completed, 1 diverged, 2 failed, 3 interrupted (resume=true continues it)",
    ),
    "run/samples_per_s": ("samples/s", "training throughput, evaluation time excluded"),
    "run/peak_memory_mib": ("peak memory (MiB)", "CUDA allocator peak; host max RSS on a CPU"),
    "run/loss_scale_final": ("final loss scale", "1 for presets without loss scaling"),
    "run/loss_scale_min": ("min loss scale", "the lowest the scaler went"),
    "run/skipped_steps": ("skipped steps", "optimizer steps skipped for an overflow"),
    "run/steps": ("steps", "iterations done, skipped ones included"),
    "run/diverged_at_step": ("diverged at step", "where the loss went non-finite"),
}


def run_hparams(cfg: Any, record: Mapping[str, Any]) -> dict[str, Any]:
    """The run's hyperparameters, the five comparison keys first."""
    device = record.get("device") or {}
    label = device.get("type") or "unknown"
    if device.get("name") and device.get("name") != label:
        label = f"{label}: {device['name']}"
    if isinstance(device.get("count"), int) and device["count"] > 1 and label != "cpu":
        label += f" x{device['count']}"
    from mpt_repro.config import loss_scaling_text

    precision = cfg.precision
    return {
        "precision": cfg.precision.name,
        "experiment": cfg.experiment_name,
        # text, so the table shows "0", not "0.0000" (numbers are floats in HParams)
        "seed": str(int(cfg.seed)),
        "budget": cfg.budget.name,
        "device": label,
        "status": str(normalised_status(record) or "unknown"),
        "model": cfg.model.name,  # a custom model's own name
        "variant": job_variant(cfg) or "(none)",  # the other overrides: the run's folder
        "task": _plain(cfg.task),
        "data": cfg.data.name,
        "optimizer": cfg.optim.name,
        "lr": float(cfg.optim.lr),
        "batch_size": int(cfg.data.batch_size),
        "compute_dtype": _plain(precision.get("compute_dtype")),
        "loss_scaling": loss_scaling_text(cfg),  # what ran: `paper` resolved, with its value
        "master_weights": bool(precision.get("master_weights")),
        "world_size": int((record.get("distributed") or {}).get("world_size") or 1),
    }


def _plain(value: Any) -> str:
    """A config value as its name: enums (TaskKind.classification) by their member name."""
    return value.name if isinstance(value, Enum) else str(value)


def _known_names() -> dict[str, list[str]]:
    """Every preset, experiment and budget conf/ defines: the HParams domains, the same for every
    run so that whichever run's experiment config TensorBoard reads, it lists them all."""
    try:
        from mpt_repro.report import names

        return {
            "precision": list(names.presets()),
            "experiment": sorted(names.experiments()),
            "budget": sorted(names.budgets()),
        }
    except Exception:  # noqa: BLE001 - a summary must never fail a run; domains are optional
        return {}


def _task_metric_names() -> list[str]:
    """The final metrics of every registered task, so that every run lists the same columns."""
    from mpt_repro.tasks.base import TASKS

    found = []
    for task in TASKS.values():
        for name in getattr(task, "metric_names", []):
            if name not in found:
                found.append(name)
    return found


def hparams_summaries(cfg: Any, record: Mapping[str, Any]) -> list:
    """The HParams plugin's three summaries: the experiment config (hyperparameter list, domains,
    metric list), this run's session start (its values) and end (its status). The five key
    hyperparameters are flagged `differs`: TensorBoard sorts those first and its HParams table
    shows the first five by default (torch's add_hparams flags none, so they sorted by name and
    `precision`/`seed` fell out of view)."""
    from google.protobuf import struct_pb2
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    values = run_hparams(cfg, record)
    domains = _known_names()
    infos = []
    for name, value in values.items():
        if isinstance(value, bool):
            kind = api_pb2.DATA_TYPE_BOOL
        elif isinstance(value, (int, float)):
            kind = api_pb2.DATA_TYPE_FLOAT64
        else:
            kind = api_pb2.DATA_TYPE_STRING
        info = api_pb2.HParamInfo(name=name, type=kind, differs=name in KEY_HPARAMS)
        if name in domains and value in domains[name]:
            info.domain_discrete.extend(domains[name])
        infos.append(info)
    metric_tags = {**SUMMARY_METRICS}
    for name in _task_metric_names():
        metric_tags[f"final/{name}"] = (f"final {name}", "the last evaluation")
    metrics = [
        api_pb2.MetricInfo(
            name=api_pb2.MetricName(tag=tag), display_name=shown, description=description
        )
        for tag, (shown, description) in metric_tags.items()
    ]
    experiment = api_pb2.Experiment(
        name="mpt-repro",
        description="Mixed precision training: runs compared by preset",
        hparam_infos=infos,
        metric_infos=metrics,
    )
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in values.items():
        item = struct_pb2.Value()
        if isinstance(value, bool):
            item.bool_value = value
        elif isinstance(value, (int, float)):
            item.number_value = value
        else:
            item.string_value = str(value)
        start.hparams[name].CopyFrom(item)

    def summary(tag: str, data) -> Summary:
        smd = metadata.create_summary_metadata(data)
        return Summary(value=[Summary.Value(tag=tag, metadata=smd, tensor=metadata.NULL_TENSOR)])

    out = [
        summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
        summary(
            metadata.SESSION_START_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_start_info=start),
        ),
    ]
    status = _session_status(normalised_status(record))
    if status is not None:  # an interrupted run goes on after resume=true: no end yet
        end = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=time.time())
        out.append(
            summary(
                metadata.SESSION_END_INFO_TAG,
                plugin_data_pb2.HParamsPluginData(session_end_info=end),
            )
        )
    return out


def _session_status(status: str | None):
    from tensorboard.plugins.hparams import api_pb2

    return {
        "completed": api_pb2.STATUS_SUCCESS,
        "diverged": api_pb2.STATUS_FAILURE,
        "failed": api_pb2.STATUS_FAILURE,
    }.get(status)


def normalised_status(record: Mapping[str, Any]) -> str | None:
    """Schema 2's status; a schema 1 `failed` record stopped by SIGTERM is `interrupted`."""
    status = record.get("status")
    if status == "failed" and "SIGTERM" in str(record.get("reason") or ""):
        return "interrupted"
    return status


def summary_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The outcome of a run as the HParams metrics (tags of SUMMARY_METRICS and final/<metric>);
    a value the record lacks (a diverged run has no final metrics) is left out, not zero."""
    status = normalised_status(record)
    scale = record.get("loss_scale") or {}
    memory = record.get("peak_memory_bytes")
    values = {
        "run/status_code": STATUS_CODES.get(status),
        "run/samples_per_s": record.get("samples_per_s"),
        "run/peak_memory_mib": memory / 2**20 if _finite(memory) else None,
        "run/loss_scale_final": scale.get("final"),
        "run/loss_scale_min": scale.get("min"),
        "run/skipped_steps": record.get("skipped_steps"),
        "run/steps": record.get("steps"),
        "run/diverged_at_step": record.get("diverged_at_step"),
    }
    for name, value in (record.get("metrics") or {}).items():
        values[f"final/{name}"] = value
    return {k: float(v) for k, v in values.items() if _finite(v)}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def write_run_summary(writer: Any, cfg: Any, record: Mapping[str, Any]) -> None:
    """At the end of a run, however it ended: its HParams entry and outcome metrics, into the
    run's own event file. The metrics are written at the run's last step, so after a resume the
    final outcome is the one TensorBoard shows (it reads the last value)."""
    step = int(record.get("steps") or 0)
    file_writer = writer._get_file_writer()
    for proto in hparams_summaries(cfg, record):
        file_writer.add_summary(proto, step)
    for tag, value in summary_scalars(record).items():
        writer.add_scalar(tag, value, step)
    writer.flush()


# ---------------------------------------------------------------- console


@contextmanager
def logging_through(write) -> Iterator[None]:
    """Route the console handlers (stdout/stderr stream handlers of the root logger) through
    `write(text, file)`, keeping their level, format and filters; file handlers are untouched."""
    root = logging.getLogger()
    original = list(root.handlers)
    swapped = []
    for handler in original:
        stream = getattr(handler, "stream", None)
        if type(handler) is logging.StreamHandler and stream in (sys.stdout, sys.stderr):
            swapped.append(_WriteHandler(handler, write))
        else:
            swapped.append(handler)
    root.handlers = swapped
    try:
        yield
    finally:
        root.handlers = original


class _WriteHandler(logging.Handler):
    def __init__(self, inner: logging.StreamHandler, write):
        super().__init__(inner.level)
        self.setFormatter(inner.formatter)
        self.filters = list(inner.filters)
        self.stream, self._write = inner.stream, write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - as logging.StreamHandler does
            self.handleError(record)


class RunProgress:
    """One run's progress: a bar on a terminal, periodic log lines elsewhere.

    with RunProgress(total_steps, initial=step, desc="demo/fp32",
                     enabled=cfg.trainer.progress, silent=not is_main) as progress:
        ...
        progress.update(step, loss=0.31, samples_s=812.0, scale=65536.0)

    On a terminal (and `enabled`), console logging goes through the bar while it lives, and the bar
    is removed when the run ends (`leave=False`): the closing block reports the end state. Without
    a terminal, or with `enabled=False`, there is no bar; a line goes to the log at the first
    update, then at most every `interval_s` seconds, and at the last step. `silent` (the other
    ranks of a distributed run): nothing at all.
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        desc: str = "",
        enabled: bool = True,
        stream=None,
        interval_s: float = PLAIN_LOG_INTERVAL_S,
        logger: logging.Logger | None = None,
        silent: bool = False,
    ):
        self.total, self.desc, self.interval_s = total, desc, interval_s
        self.silent = silent
        self.stream = sys.stderr if stream is None else stream
        self.log = logger or log
        self.bar = None
        self._redirect = None
        self._last_line = -math.inf
        if enabled and not silent and _isatty(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit="step",
                dynamic_ncols=True,
                mininterval=1.0,
                leave=False,
                file=self.stream,
            )
            self._redirect = logging_through(tqdm.write)
            self._redirect.__enter__()

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, step: int, **fields: Any) -> None:
        if self.silent:
            return
        shown = {k: _short(v) for k, v in fields.items() if v is not None}
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(shown, refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if step >= self.total or now - self._last_line >= self.interval_s:
            self._last_line = now
            pct = 100.0 * step / max(self.total, 1)
            values = " ".join(f"{k}={v}" for k, v in shown.items())
            self.log.info("%s step %d/%d (%.0f%%) %s", self.desc, step, self.total, pct, values)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


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
    name = " / ".join(
        str(x)
        for x in (
            subject,
            record.get("precision"),
            record.get("budget"),
            f"seed {record.get('seed')}",
        )
    )
    lines = [f"── {name}: {status} " + "─" * max(0, 60 - len(name) - len(status))]
    warn = status != "completed"
    metrics = record.get("metrics") or {}
    primary = record.get("primary_metric")
    if metrics:
        order = sorted(metrics, key=lambda k: k != primary)
        shown = ", ".join(
            f"{k}={_short(float(metrics[k])) if _finite(metrics[k]) else metrics[k]}"
            + (" (primary)" if k == primary else "")
            for k in order
        )
        lines.append(f"  final metrics  {shown}")
        bad = [k for k in order if not _finite(metrics[k])]
        if bad:
            warn = True
            lines.append(f"  NOT FINITE     {', '.join(bad)}: check the curves before using them")
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
    cost = []
    if _finite(record.get("steps")):
        cost.append(f"{int(record['steps'])} steps")
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
    if cost:
        lines.append(f"  cost           {', '.join(cost)}")
    scale = record.get("loss_scale") or {}
    if _finite(scale.get("final")):
        lines.append(
            f"  loss scale     final {scale['final']:g}, min {scale.get('min', scale['final']):g}; "
            f"{int(record.get('skipped_steps') or 0)} skipped steps"
        )
    lines.append(f"  run record     {run_dir / 'run.json'}")
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
    return "\n".join(lines), warn


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
