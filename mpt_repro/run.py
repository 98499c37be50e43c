"""One run's life: its directory, its record, the build, the fit, and how it ended.

The order matters (docs/reliability.md): the configuration is validated, the run directory is
locked and inspected, and the data and model are built, all before anything in an existing run
directory changes. Only then does the run claim the directory (moving an earlier run's files
aside, never deleting them) and write its record.

Whatever happens next, run.json says so: `completed`, `diverged` (a result, not a crash: a sweep
goes on), `interrupted` (a signal stopped it after a checkpoint; resume=true continues) or
`failed` with the reason (then the error propagates and the CLI exits non-zero).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from mpt_repro import distributed
from mpt_repro.checkpoint import has_checkpoint
from mpt_repro.config import to_plain, validate
from mpt_repro.errors import Diverged, Interrupted, RunDirError, UserError, describe
from mpt_repro.identity import study_name
from mpt_repro.record import RunRecord, missing_files, nonfinite_metrics
from mpt_repro.rundir import (
    Plan,
    RunLock,
    inspect_run_dir,
    plan_run,
    resume_command,
    set_aside,
    write_hydra_files,
)
from mpt_repro.runlog.hparams import write_hparams
from mpt_repro.stopping import signals_raise

log = logging.getLogger("mpt_repro")


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"trainer.device={spec} but no CUDA device is visible; use trainer.device=cpu or auto"
        )
    return device


def set_backends(t: Any, environ: MutableMapping[str, str] = os.environ) -> None:
    """cuDNN autotuning and determinism from cfg.trainer, set on every run (a multirun's jobs
    share one process)."""
    if t.deterministic:
        # cuBLAS picks its reductions per run unless its workspace is fixed (CUDA >= 10.2; see
        # torch.use_deterministic_algorithms); it reads this when it makes its first handle
        environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = t.cudnn_benchmark and not t.deterministic
    wanted = bool(t.deterministic)
    # only a change is applied: the call imports torch._inductor (3.4 s of CPU a run here)
    if torch.are_deterministic_algorithms_enabled() != wanted or (
        wanted and not torch.is_deterministic_algorithms_warn_only_enabled()
    ):
        torch.use_deterministic_algorithms(wanted, warn_only=True)


def step_compile_mode(t: Any) -> str | None:
    """trainer.compile: torch.compile's mode for the precision step's regions (None: eager).
    A mode's inductor options (reduce-overhead: CUDA graphs) are also set for the rest of the
    process, so the model the task compiles (a plain torch.compile) gets them too.
    trainer.compile=step compiles the whole step instead (the task builds it, with this mode's
    options set here): None, the regions stay eager."""
    if not t.compile:
        return None
    mode = str(t.get("compile_mode", "default"))
    if mode != "default":
        import torch._inductor
        import torch._inductor.config

        for key, value in torch._inductor.list_mode_options(mode).items():
            node, _, name = key.rpartition(".")
            setattr(
                getattr(torch._inductor.config, node) if node else torch._inductor.config,
                name,
                value,
            )
    return None if t.compile == "step" else mode


def describe_device(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return {
            "type": "cuda",
            "name": torch.cuda.get_device_name(device),
            "count": torch.cuda.device_count(),
            "capability": f"{major}.{minor}",  # tensor cores (fast FP16) from 7.0
        }
    import platform

    return {
        "type": "cpu",
        "name": platform.processor() or platform.machine(),
        "count": torch.get_num_threads(),
    }


def run(cfg: DictConfig, run_dir: Path, validated: bool = False) -> dict[str, Any]:
    """Train one configuration into run_dir; return the final run record. validated: mpt-run's
    start-up check has validated this very configuration (it is not checked twice)."""
    if not validated:
        validate(cfg)  # before any work: bad values are refused with the key's name
    set_backends(cfg.trainer)  # before CUDA starts (cuBLAS reads its workspace setting then)
    # One process per device under torchrun/SLURM: join the group first; rank 0 then decides
    # for all (the run directory, whether there is anything to do, whether this is a resume),
    # so that no rank reads a run.json or checkpoint that rank 0 is rewriting.
    device = distributed.setup(cfg.distributed, pick_device(cfg.trainer.device))
    main = distributed.is_main()
    run_dir = Path(distributed.broadcast_object(str(run_dir)))
    lock = RunLock(run_dir) if main else None
    try:
        with signals_raise():  # a SIGTERM before training starts still ends with the record
            plan = _decide(cfg, run_dir, lock)
            return _run_planned(cfg, run_dir, device, plan, main)
    finally:
        if lock is not None:
            lock.release()


def _decide(cfg: DictConfig, run_dir: Path, lock: RunLock | None) -> Plan:
    """Rank 0 locks and reads the directory; every rank gets the same plan, or the same refusal
    (a refusal raised on rank 0 alone would leave the others waiting in the broadcast)."""
    answer: tuple[Plan | None, str | None] | None = None
    error: Exception | None = None
    if lock is not None:
        try:
            lock.acquire()
            state = inspect_run_dir(run_dir)
            answer = (plan_run(state, cfg.resume, cfg.overwrite, cfg.data), None)
        except Exception as e:  # noqa: BLE001 - handed to every rank, raised below
            error, answer = e, (None, str(e))
    plan, refusal = distributed.broadcast_object(answer)
    if error is not None:
        raise error
    if refusal is not None:
        raise RunDirError(refusal)
    assert plan is not None
    if lock is not None:
        for level, note in plan.notes:
            log.log(level, note)
    return plan


def _run_planned(
    cfg: DictConfig, run_dir: Path, device: torch.device, plan: Plan, main: bool
) -> dict[str, Any]:
    previous = plan.previous  # on other data: refused by plan_run
    if plan.action == "done":
        log.info("%s already %s; nothing to do (resume=true)", run_dir, previous["status"])
        gone = missing_files(run_dir, previous)
        if gone:  # "nothing to do" alone hid a record whose curves were deleted
            log.warning(
                "%s: the record's files are incomplete: %s missing (its result stands in "
                "run.json; overwrite=true trains it again to have them)",
                run_dir,
                ", ".join(gone),
            )
        return previous
    fields = _record_fields(cfg, run_dir, device, resuming=plan.action == "resume")
    policy, task = _build(cfg, run_dir, device, plan, main, fields)
    distributed.decorrelate_rng(cfg.seed)  # after the identically seeded model build
    record = (RunRecord if main else _UnwrittenRecord)(run_dir, fields)
    if plan.action == "resume" and previous:
        # a hard-killed run left no wall_time_s: carry what earlier segments had carried
        before = previous.get("wall_time_s") or previous.get("wall_time_s_before_resume")
        record.update(started_at=previous.get("started_at"), wall_time_s_before_resume=before)
    record.update(
        data=task.describe_data(),
        model=task.describe_model(),
        primary_metric=task.primary_metric,
        higher_is_better=task.higher_is_better,
    )
    start = time.perf_counter()
    trainer = None
    try:
        if main:
            _claim(run_dir, plan, cfg)
        record.write()
        from mpt_repro.trainer import Trainer

        trainer = Trainer(cfg, task, policy, run_dir, callbacks=build_callbacks(cfg), is_main=main)
        _hparams(main, None, cfg, run_dir, record)  # in TensorBoard's table from the start
        summary = trainer.fit()
        _describe_data_again(record, task)
        _completed(record, summary, start)
    except Diverged as e:
        _describe_data_again(record, task)
        _diverged(record, e, trainer, start)
    except BaseException as e:
        _describe_data_again(record, task)
        stopped = _end_abnormally(record, e, trainer, start, run_dir)
        if stopped is not None and stopped is not e:
            raise stopped from e  # the CLI answers a stop by a signal with its own exit status
        raise
    finally:
        if trainer is not None:
            _hparams(main, trainer.writer, cfg, run_dir, record)  # the outcome replaces it
            trainer.close()
    return record.data


def _hparams(main: bool, writer: Any, cfg: DictConfig, run_dir: Path, record: RunRecord) -> None:
    """The run's HParams record for TensorBoard, as the record stands (runlog/hparams.py);
    `writer`: the run's own events, once training has opened them (None before)."""
    if not main:  # another rank than the first: it writes no events
        return
    from mpt_repro.tasks import all_metric_names

    _safely(write_hparams, run_dir, writer, cfg, record.data, all_metric_names())


def _describe_data_again(record: RunRecord, task: Any) -> None:
    """The data as training left it: `data.on_corrupt=skip` counts the files it skipped (the
    description at the start could not know them)."""
    try:
        record.update(data=task.describe_data())
    except Exception as err:  # noqa: BLE001 - the record of how the run ended comes first
        log.warning("could not describe the data again: %s", err)


def _record_fields(
    cfg: DictConfig, run_dir: Path, device: torch.device, resuming: bool
) -> dict[str, Any]:
    """What run.json says of the run from the start: what ran, where, on what, with what."""
    return {
        "experiment": cfg.experiment_name,
        "study": study_name(cfg.experiment_name, cfg.model),
        "task": cfg.task,
        "precision": cfg.precision.name,
        "precision_config": to_plain(cfg.precision),
        "seed": cfg.seed,
        "budget": cfg.budget.name,
        "device": describe_device(device),
        "run_dir": str(run_dir),
        "resumed": resuming,
        "overrides": _job_overrides(),
        "config": to_plain(cfg),
        "distributed": distributed.describe(cfg),
    }


def _build(
    cfg: DictConfig, run_dir: Path, device: torch.device, plan: Plan, main: bool, fields: dict
) -> tuple[Any, Any]:
    """The precision policy and the task (data and model): everything that reads user input,
    built before the directory changes, so a mistyped data.root never costs an earlier run its
    files.

    Bad input found here (a missing data folder, a model target that does not import) is a
    refusal: the directory stays exactly as it was, and a directory this command created is
    removed again (cli.py), so a retry finds nothing to move aside. Anything unexpected in a new
    run leaves a record with its traceback; an earlier run's record (one to resume, or one
    overwrite=true would have replaced) stays as it was."""
    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.tasks import build_task

    try:
        policy = PrecisionPolicy(
            cfg.precision,
            device,
            paper_loss_scale=cfg.paper_loss_scale,
            compile_mode=step_compile_mode(cfg.trainer),
        )
        log.info("precision %s", policy.describe())
        return policy, build_task(cfg, device, policy)
    except BaseException as e:
        refused = isinstance(e, UserError)
        if main and plan.action == "fresh" and not plan.holds_work and not refused:
            try:
                _claim(run_dir, plan, cfg)
            except OSError as err:  # the folder itself is the problem: the error says the rest
                log.warning("could not prepare %s for the run record: %s", run_dir, err)
            else:
                _fail(RunRecord(run_dir, fields), e, time.perf_counter(), _hint_for(e, run_dir))
        raise


def _completed(record: RunRecord, summary: dict[str, Any], start: float) -> None:
    bad = nonfinite_metrics(summary.get("metrics"))
    hint = None
    if bad:
        shown = ", ".join(f"{k}={v}" for k, v in bad.items())
        hint = (
            f"the final evaluation is not finite ({shown}): the run ended but learned "
            "nothing usable; look at metrics.csv for where the loss went non-finite"
        )
    record.finish("completed", hint=hint, wall_time_s=_wall(record, start), **summary)


def _diverged(record: RunRecord, e: Diverged, trainer: Any, start: float) -> None:
    step = e.step if e.step is not None else (trainer.step if trainer else None)
    extra = _summary(trainer)
    layer = e.layer or (extra.get("diagnostics") or {}).get("first_nonfinite_layer")
    record.finish(
        "diverged",
        e.reason,
        hint="divergence is a result (the report lists it); to train this configuration "
        "again, run with overwrite=true",
        diverged_at_step=step,
        diverged_layer=layer,
        wall_time_s=_wall(record, start),
        **extra,
    )
    log.warning("diverged at step %s: %s", step, e.reason)


def _job_overrides() -> list[str] | None:
    """This job's command-line overrides as Hydra parsed them (a sweep's job: its own values)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def _claim(run_dir: Path, plan: Plan, cfg: DictConfig) -> None:
    """Take the directory over: the earlier run's files to previous-<time>/, then .hydra/."""
    moved = set_aside(run_dir, plan.set_aside)
    if moved is not None:  # said once it is done, naming what moved
        log.warning(
            "%s: the earlier run's files (%s) were moved to %s (nothing was deleted)",
            run_dir,
            ", ".join(sorted(p.name for p in moved.iterdir())),
            moved,
        )
    write_hydra_files(run_dir, cfg)


def _end_abnormally(
    record: RunRecord, e: BaseException, trainer: Any, start: float, run_dir: Path
) -> Interrupted | None:
    """Record an interruption (a signal, with a checkpoint to resume from) or a failure; return
    the interruption, if it was one; never raise."""
    stopped = _as_interrupted(e, trainer)
    if stopped is not None and has_checkpoint(run_dir):
        _safely(
            record.finish,
            "interrupted",
            str(stopped),
            hint=f"continue with: {resume_command(run_dir)}",
            wall_time_s=_wall(record, start),
            **_summary(trainer),
        )
        return stopped
    _fail(record, e, start, hint=_hint_for(e, run_dir), **_summary(trainer))
    return None


def _as_interrupted(e: BaseException, trainer: Any) -> Interrupted | None:
    """A stop by a signal, as errors.Interrupted: the trainer's own, or a Ctrl-C that reached
    us outside the trainer's step boundary (then the last checkpoint is where resume starts)."""
    import signal

    if isinstance(e, Interrupted):
        return e
    if isinstance(e, KeyboardInterrupt):
        return Interrupted(signal.SIGINT, trainer.step if trainer else None, saved=False)
    return None


def _fail(record: RunRecord, e: BaseException, start: float, hint: str | None, **extra) -> None:
    if isinstance(e, (KeyboardInterrupt, Interrupted)):
        name = e.signal_name if isinstance(e, Interrupted) else "Ctrl-C"
        reason = f"stopped by {name} before a checkpoint was saved"
        hint = "run the same command again to start it afresh"
    else:
        reason = f"{type(e).__name__}: {e}" if isinstance(e, UserError) else describe(e)
        if not isinstance(e, UserError):
            record.update(traceback=traceback.format_exc(limit=30))
    _safely(record.finish, "failed", reason, hint=hint, wall_time_s=_wall(record, start), **extra)


def _hint_for(e: BaseException, run_dir: Path) -> str:
    if isinstance(e, UserError) and not has_checkpoint(run_dir):
        return "the reason says what to fix; then run the same command again"
    if isinstance(e, UserError):
        return f"the reason says what to fix; then continue with: {resume_command(run_dir)}"
    if has_checkpoint(run_dir):
        return f"after fixing the cause, continue with: {resume_command(run_dir)}"
    return "the traceback is in this record and in the run's log file; fix the cause and rerun"


def _safely(fn: Any, *args: Any, **kwargs: Any) -> None:
    """Writing the record can fail for the reason the run failed (a full disk, a read-only
    folder): say so in the log, and let the original error be the one reported."""
    try:
        fn(*args, **kwargs)
    except OSError as err:
        log.warning("could not write the run record: %s", err)


def _summary(trainer: Any) -> dict[str, Any]:
    """The trainer's summary for a run that ended early; {} if even that fails. A run that did
    not complete has no result: its `metrics` are null, and the last evaluation before it ended
    (if any) is kept apart, as `diagnostics.last_eval`, where no table or script takes it for
    one."""
    if trainer is None:
        return {}
    try:
        summary = trainer.final_summary()
    except Exception as err:  # noqa: BLE001 - the record of a failure must still be written
        log.warning("could not summarise the run: %s", err)
        return {}
    last = summary.pop("metrics", None) or None
    evaluation = summary.pop("evaluation", None)
    summary["metrics"], summary["metrics_detail"], summary["evaluation"] = None, None, None
    if last:
        summary.setdefault("diagnostics", {})["last_eval"] = {
            "step": trainer.last_eval_step,
            "metrics": last,
            "evaluation": evaluation,
        }
    return summary


class _UnwrittenRecord(RunRecord):
    """A rank other than 0 keeps the same record in memory but never writes it: run.json is rank
    0's.
    """

    def write(self) -> None:
        pass


def build_callbacks(cfg: DictConfig) -> list:
    callbacks = [distributed.DistributedCallback()] if distributed.is_distributed() else []
    if cfg.telemetry.enabled and distributed.is_main():  # rank 0's view; other ranks pay nothing
        from mpt_repro.telemetry import TelemetryCallback

        callbacks.append(TelemetryCallback(cfg.telemetry))
    return callbacks


def _wall(record: RunRecord, start: float) -> float:
    before = record.data.get("wall_time_s_before_resume") or 0.0
    return before + time.perf_counter() - start
