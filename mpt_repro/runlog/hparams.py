"""The HParams entry of a run, written at its end however it ended: an explicit experiment config
(the hyperparameters, the five TensorBoard shows by default marked as differing: the loss scaling
that ran, the model, the precision, the run's status as text and its variant) and the run's
outcome as metrics (its task's final metrics first, the primary one leading; samples/s, peak
memory, final and minimum loss scale, skipped steps). docs/report.md, "TensorBoard".

How TensorBoard's HParams dashboard (2.x) picks what it shows: its backend sorts the experiment's
hyperparameters by `differs` (true first), then by name (backend_context.py,
_sort_and_reduce_to_hparams_limit); its table then displays the first five of them and the first
five metrics in the experiment's order, the others are one checkbox away (tf-hparams-query-pane,
_computeHParams: `Math.min(5, ...)`; `hparamsLimit` only caps what is loaded, at 1000). So five
hyperparameters can be shown by default, no more: the ones the run name does not already say.
The run name (the table's Trial ID) is `study/precision-budget/seedN[/variant]`, so the
experiment, budget and seed are in every row.

A run is in the table from its start (`write_hparams`, status `running`), not only once it ends.
TensorBoard keeps the first HParams record of a run folder and ignores later ones (its event
accumulators store a tag's metadata once, plugin_event_accumulator.py; so does the fast loader):
a record written at the start and another at the end of the same folder would show `running`
for ever. So while a run can still change, its record is a TensorBoard run of its own, in a
folder named by its status: `<run dir>/running/` from the start, `interrupted/` (a checkpoint to
resume from) or `failed/` when it stops; its Trial ID reads `.../seedN/running`. When the run
ends for good (completed or diverged), the record goes into the run directory's own events
beside its curves and the status folder is removed (TensorBoard drops a run whose folder is
gone, both loaders); a run killed outright keeps `running/`, as its run.json keeps `running`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from mpt_repro.record import no_step_applied, normalised_status
from mpt_repro.runlog.metrics import TB_EVENTS_GLOB, job_variant, tb_dir

# the hyperparameters TensorBoard shows by default (marked `differs`; it orders them by name):
# what the run name does not say, and the comparison's subject
KEY_HPARAMS = ("precision", "status", "loss_scaling", "model", "variant")
# the status hyperparameter's values, its domain (a checkbox filter in the dashboard); "completed,
# no step applied": every optimizer step was skipped, the metrics are the untrained model's. There
# is no numeric status metric any more (it showed as `0.0000` among the first metrics): the text
# filters and sorts as well, and the session status says success or failure.
STATUSES = (
    "completed",
    "completed, no step applied",
    "diverged",
    "failed",
    "interrupted",
    "running",
    "unknown",
)
# the statuses a run can still leave (resume=true continues an interrupted or failed one): each
# one's HParams record is a TensorBoard run of its own, `<run dir>/<status>/` (module docstring)
UNSETTLED = ("running", "interrupted", "failed")
SUMMARY_METRICS = {
    # tag: (display name, description)
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
        "status": status_text(record),
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


def status_text(record: Mapping[str, Any]) -> str:
    """The run's outcome as the HParams table shows it (one of STATUSES)."""
    status = normalised_status(record)
    if no_step_applied(record):
        return "completed, no step applied"
    return status if status in STATUSES else "unknown"


def _plain(value: Any) -> str:
    """A config value as its name: enums (TaskKind.classification) by their member name."""
    return value.name if isinstance(value, Enum) else str(value)


def _known_names() -> dict[str, list[str]]:
    """Every preset, experiment and budget conf/ defines: the HParams domains, the same for every
    run so that whichever run's experiment config TensorBoard reads, it lists them all."""
    try:
        from mpt_repro import catalog

        return {
            "precision": list(catalog.presets()),
            "experiment": sorted(catalog.experiments()),
            "budget": sorted(catalog.budgets()),
        }
    except Exception:  # noqa: BLE001 - a summary must never fail a run; domains are optional
        return {}


def hparams_summaries(cfg: Any, record: Mapping[str, Any], metric_names: list[str]) -> list:
    """The HParams plugin's three summaries: the experiment config (hyperparameter list, domains,
    metric list), this run's session start (its values) and end (its status). The five key
    hyperparameters are flagged `differs`: TensorBoard sorts those first and its HParams table
    shows the first five by default (see the module docstring; torch's add_hparams flags none, so
    they sorted by name and the readable columns fell out of view)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    values = run_hparams(cfg, record)

    def summary(tag: str, **data) -> Summary:
        smd = metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(**data))
        return Summary(value=[Summary.Value(tag=tag, metadata=smd, tensor=metadata.NULL_TENSOR)])

    out = [
        summary(
            metadata.EXPERIMENT_TAG, experiment=_experiment(values, own_first(record, metric_names))
        ),
        summary(metadata.SESSION_START_INFO_TAG, session_start_info=_session_start(values)),
    ]
    status = _session_status(normalised_status(record))
    if status is not None:  # an interrupted run goes on after resume=true: no end yet
        end = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=time.time())
        out.append(summary(metadata.SESSION_END_INFO_TAG, session_end_info=end))
    return out


def own_first(record: Mapping[str, Any], metric_names: list[str]) -> tuple[list[str], list[str]]:
    """(this run's task's metrics, its primary one first; every other task's metrics)."""
    own = [str(record.get("primary_metric") or ""), *(record.get("metrics") or {})]
    own = [n for n in dict.fromkeys(own) if n in metric_names]
    return own, [n for n in metric_names if n not in own]


def _experiment(values: dict[str, Any], metrics: tuple[list[str], list[str]]) -> Any:
    """The experiment config: every hyperparameter with its type (and the domain conf/ defines
    for precision, experiment and budget), and every metric the runs report."""
    from tensorboard.plugins.hparams import api_pb2

    domains = {**_known_names(), "status": list(STATUSES)}
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
    # the run's own final metrics first, its primary one leading, then the cost figures (the
    # table shows the first five), then the other tasks' metrics: every run lists the same ones
    own, others = metrics

    def final(names: list[str]) -> dict[str, tuple[str, str]]:
        return {f"final/{n}": (f"final {n}", "the last evaluation") for n in names}

    metric_tags = {**final(own), **SUMMARY_METRICS, **final(others)}
    metrics = [
        api_pb2.MetricInfo(
            name=api_pb2.MetricName(tag=tag), display_name=shown, description=description
        )
        for tag, (shown, description) in metric_tags.items()
    ]
    return api_pb2.Experiment(
        name="mpt-repro",
        description="Mixed precision training: runs compared by preset",
        hparam_infos=infos,
        metric_infos=metrics,
    )


def _session_start(values: dict[str, Any]) -> Any:
    """This run's hyperparameter values."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2

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
    return start


def _session_status(status: str | None):
    from tensorboard.plugins.hparams import api_pb2

    return {
        "completed": api_pb2.STATUS_SUCCESS,
        "diverged": api_pb2.STATUS_FAILURE,
        "failed": api_pb2.STATUS_FAILURE,
    }.get(status)


def summary_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The outcome of a run as the HParams metrics (tags of SUMMARY_METRICS and final/<metric>);
    a value the record lacks (a diverged run has no final metrics) is left out, not zero."""
    scale = record.get("loss_scale") or {}
    memory = record.get("peak_memory_bytes")
    values = {
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


def write_run_summary(
    writer: Any, cfg: Any, record: Mapping[str, Any], metric_names: list[str]
) -> None:
    """At the end of a run, however it ended: its HParams entry and outcome metrics, into the
    run's own event file. The metrics are written at the run's last step, so after a resume the
    final outcome is the one TensorBoard shows (it reads the last value)."""
    step = int(record.get("steps") or 0)
    file_writer = writer._get_file_writer()
    for proto in hparams_summaries(cfg, record, metric_names):
        file_writer.add_summary(proto, step)
    for tag, value in summary_scalars(record).items():
        writer.add_scalar(tag, value, step)
    writer.flush()


def write_hparams(
    run_dir: Path, writer: Any, cfg: Any, record: Mapping[str, Any], metric_names: list[str]
) -> Path:
    """The run's HParams record as it stands (at its start, status running; at its end, however
    it ended), where TensorBoard will show it: a status folder of its own while the run can still
    change, else the run's own events (`writer`, or a writer of its own when training never
    opened them). Removes the status folders it no longer needs; returns the folder written."""
    status = normalised_status(record)
    folder = tb_dir(run_dir)
    if status in UNSETTLED:
        folder = folder / str(status)
        remove_status_folder(folder)  # an earlier segment's record would be the one shown
    if writer is None or status in UNSETTLED:
        from torch.utils.tensorboard import SummaryWriter

        own = SummaryWriter(log_dir=str(folder))
        try:
            write_run_summary(own, cfg, record, metric_names)
        finally:
            own.close()
    else:
        write_run_summary(writer, cfg, record, metric_names)
    for other in UNSETTLED:
        if other != status:
            remove_status_folder(tb_dir(run_dir) / other)
    return folder


def remove_status_folder(folder: Path) -> None:
    """Remove a status folder of HParams events (write_hparams); a folder holding anything else
    (not written by mpt-run) is left alone."""
    if not folder.is_dir():
        return
    entries = list(folder.iterdir())
    if any(not (p.is_file() and p.match(TB_EVENTS_GLOB)) for p in entries):
        return
    for path in entries:
        path.unlink(missing_ok=True)
    folder.rmdir()
