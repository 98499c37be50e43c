"""One run's life: its directory, its record, the build, the fit, and how it ended.

Whatever happens, run.json says so: `completed`, `diverged` (a result, not a crash: a sweep goes
on), or `failed` with the reason (then the error propagates and the exit status is non-zero).
"""

from __future__ import annotations

import logging
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from mpt_repro import distributed
from mpt_repro.config import to_plain, validate
from mpt_repro.errors import Diverged, UserError
from mpt_repro.record import RunRecord, read_record
from mpt_repro.trainer import CHECKPOINT, Stopped, Trainer

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


def describe_device(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        return {
            "type": "cuda",
            "name": torch.cuda.get_device_name(device),
            "count": torch.cuda.device_count(),
        }
    import platform

    return {
        "type": "cpu",
        "name": platform.processor() or platform.machine(),
        "count": torch.get_num_threads(),
    }


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Train one configuration into run_dir; return the final run record."""
    validate(cfg)  # before any work: bad values are refused with the key's name
    # One process per device under torchrun/SLURM: join the group first; rank 0 then decides
    # for all (the run directory, whether there is anything to do, whether this is a resume),
    # so that no rank reads a run.json or checkpoint that rank 0 is rewriting.
    device = distributed.setup(cfg.distributed, pick_device(cfg.trainer.device))
    main = distributed.is_main()
    run_dir = Path(distributed.broadcast_object(str(run_dir)))
    previous = read_record(run_dir) if main else None
    # diverged is a result too: re-running a sweep must not train it again
    done = bool(cfg.resume and previous and previous.get("status") in ("completed", "diverged"))
    if main and not done and not cfg.resume:
        _clear_previous_run(run_dir)
    previous, done, resuming = distributed.broadcast_object(
        (previous, done, bool(cfg.resume and (run_dir / CHECKPOINT).exists())) if main else None
    )
    if cfg.resume and previous:
        _refuse_other_data(previous, cfg, run_dir)
    if done:
        log.info("%s already %s; nothing to do (resume=true)", run_dir, previous["status"])
        return previous

    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.tasks.base import build_task

    torch.backends.cudnn.benchmark = cfg.trainer.cudnn_benchmark and not cfg.trainer.deterministic
    torch.use_deterministic_algorithms(cfg.trainer.deterministic, warn_only=True)
    if device.type == "cuda":
        # A multirun runs its jobs in one process: each run's peak must be its own.
        torch.cuda.reset_peak_memory_stats(device)
    record = (RunRecord if main else _UnwrittenRecord)(
        run_dir,
        {
            "experiment": cfg.experiment_name,
            "task": cfg.task.name,
            "precision": cfg.precision.name,
            "precision_config": to_plain(cfg.precision),
            "seed": cfg.seed,
            "budget": cfg.budget.name,
            "device": describe_device(device),
            "run_dir": str(run_dir),
            "resumed": resuming,
            "config": to_plain(cfg),
            "distributed": distributed.describe(cfg),
        },
    )
    if resuming and previous:
        # a hard-killed run left no wall_time_s: carry what earlier segments had carried
        before = previous.get("wall_time_s") or previous.get("wall_time_s_before_resume")
        record.update(started_at=previous.get("started_at"), wall_time_s_before_resume=before)
    record.write()
    start = time.perf_counter()
    trainer = None
    try:
        policy = PrecisionPolicy(cfg.precision, device, paper_loss_scale=cfg.paper_loss_scale)
        log.info("precision %s", policy.describe())
        task = build_task(cfg, device, policy)
        distributed.decorrelate_rng(cfg.seed)  # after the identically seeded model build
        record.update(
            data=task.describe_data(),
            model=task.describe_model(),
            primary_metric=task.primary_metric,
            higher_is_better=task.higher_is_better,
        )
        record.write()
        trainer = Trainer(cfg, task, policy, run_dir, callbacks=build_callbacks(cfg), is_main=main)
        summary = trainer.fit()
        record.finish("completed", wall_time_s=_wall(record, start), **summary)
    except Diverged as e:
        step = e.step if e.step is not None else (trainer.step if trainer else None)
        extra = trainer.final_summary() if trainer else {}
        extra.pop("metrics", None)
        record.finish(
            "diverged", e.reason, diverged_at_step=step, wall_time_s=_wall(record, start), **extra
        )
        log.warning("diverged at step %s: %s", step, e.reason)
    except Stopped as e:
        record.finish(
            "failed",
            str(e),
            wall_time_s=_wall(record, start),
            **(trainer.final_summary() if trainer else {}),
        )
        raise
    except BaseException as e:  # noqa: BLE001 - the record must say how the run ended, then re-raise
        reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        record.update(traceback=traceback.format_exc(limit=20))
        record.finish("failed", reason, wall_time_s=_wall(record, start))
        raise
    finally:
        if trainer is not None:
            trainer.close()
    return record.data


class _UnwrittenRecord(RunRecord):
    """A rank other than 0 keeps the same record in memory but never writes it: run.json is rank
    0's.
    """

    def write(self) -> None:
        pass


def _refuse_other_data(previous: dict, cfg: DictConfig, run_dir: Path) -> None:
    """data.root is not part of the run directory's name: a resume must not continue (or accept as
    done) a run that trained on other data."""
    old = (previous.get("config") or {}).get("data") or {}
    for key in ("name", "root", "num_classes"):
        if key in old and old[key] != cfg.data[key]:
            raise UserError(
                f"{run_dir} holds a run with data.{key}={old[key]!r}, not {cfg.data[key]!r}; "
                "resume=true would "
                "mix the two. Use another paths.runs_dir, or resume=false to start this run "
                "afresh there."
            )


def build_callbacks(cfg: DictConfig) -> list:
    callbacks = [distributed.DistributedCallback()] if distributed.is_distributed() else []
    if cfg.telemetry.enabled and distributed.is_main():  # rank 0's view; other ranks pay nothing
        from mpt_repro.telemetry import TelemetryCallback

        callbacks.append(TelemetryCallback(cfg.telemetry))
    return callbacks


def _wall(record: RunRecord, start: float) -> float:
    before = record.data.get("wall_time_s_before_resume") or 0.0
    return before + time.perf_counter() - start


def _clear_previous_run(run_dir: Path) -> None:
    """A fresh (non-resumed) run in a used directory starts clean: old results would mix in."""
    stale = [
        run_dir / n
        for n in ("checkpoints", "tb", "metrics.csv", "run.json")
        if (run_dir / n).exists()
    ]
    if stale:
        log.warning(
            "starting afresh in %s: removing the previous run's %s (use resume=true to continue "
            "it)",
            run_dir,
            ", ".join(p.name for p in stale),
        )
    for path in stale:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
