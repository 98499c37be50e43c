"""The one training loop. Every experiment and every precision preset runs through `Trainer.fit`.

What differs between experiments lives in the Task; what differs between precisions lives in the
PrecisionPolicy. The loop itself only counts steps, schedules the LR, logs, evaluates,
checkpoints, and notices divergence.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpt_repro import distributed
from mpt_repro.errors import DataError, Diverged
from mpt_repro.logging import MetricsLogger
from mpt_repro.optim import build_scheduler

CHECKPOINT = "checkpoints/last.pt"


class Stopped(Exception):
    """A stop was requested (SIGTERM, e.g. a cluster pre-emption): the checkpoint is saved."""


class Trainer:
    def __init__(
        self,
        cfg: Any,
        task: Any,
        policy: Any,
        run_dir: Path,
        callbacks: list | None = None,
        is_main: bool = True,
    ):
        self.cfg, self.task, self.policy, self.run_dir = cfg, task, policy, Path(run_dir)
        self.callbacks = callbacks or []
        self.is_main = is_main  # only the main process writes files (distributed runs)
        self.log = logging.getLogger("mpt_repro")
        self.step = 0  # optimizer iterations done (skipped ones included)
        self.epoch = 0
        self.batch_in_epoch = 0
        self.samples = 0
        self.train_time = 0.0
        self.last_eval: dict[str, float] = {}
        self.window = LogWindow()  # what the next train row of the log averages over
        self._stop_requested = False
        spe = task.steps_per_epoch()
        if spe < 1:
            raise DataError(
                f"the training split yields no full batch (data.batch_size={cfg.data.batch_size}); "
                "use a smaller batch or more data (data.train_limit)"
            )
        t = cfg.trainer
        self.steps_per_epoch = spe
        self.total_steps = (
            spe * t.epochs if t.max_steps is None else min(spe * t.epochs, t.max_steps)
        )
        self.schedulers = {
            name: build_scheduler(opt, cfg.optim, spe, self.total_steps)
            for name, opt in task.optimizers.items()
        }
        self.metrics: MetricsLogger | None = None
        self.writer = None

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        t = self.cfg.trainer
        resumed = self._maybe_resume()
        if self.is_main:
            self.metrics = MetricsLogger(
                self.run_dir, self.task.metric_names, resume_step=self.step if resumed else None
            )
            self.writer = self.metrics.writer
        self._call("on_fit_start")
        bad_streak = torch.zeros(
            (), dtype=torch.long, device=self.task.device
        )  # consecutive non-finite losses
        streak_start = torch.zeros_like(bad_streak)
        # the longest streak since the last log row: one that ended between two rows still counts
        worst, worst_start = torch.zeros_like(bad_streak), torch.zeros_like(bad_streak)
        progress = self._progress_bar()
        previous_handler = (
            signal.signal(signal.SIGTERM, self._request_stop) if _in_main_thread() else None
        )
        try:
            while self.step < self.total_steps:
                tic = time.perf_counter()
                for batch in self.task.train_batches(self.epoch, skip=self.batch_in_epoch):
                    self._call("on_step_start", self.step)
                    result = self.task.train_step(batch)
                    self.step += 1
                    self.batch_in_epoch += 1
                    self.samples += result.samples
                    for name, scheduler in self.schedulers.items():
                        if (
                            result.stepped_by.get(name, result.stepped)
                            or not self.policy.hold_lr_on_skip
                        ):
                            scheduler.step()
                    # Divergence bookkeeping stays on the device: no host sync on ordinary steps.
                    bad = ~torch.isfinite(result.loss)
                    streak_start = torch.where(bad & (bad_streak == 0), self.step, streak_start)
                    bad_streak = (bad_streak + 1) * bad
                    worst_start = torch.where(bad_streak > worst, streak_start, worst_start)
                    worst = torch.maximum(worst, bad_streak)
                    self.window.add(result)
                    self._call("on_step_end", self.step, result)
                    last = self.step >= self.total_steps
                    if self.step % t.log_every == 0 or last:
                        self._close_segment(tic)
                        self._log_train(*self._window_over_ranks(), progress)
                        self._check_divergence(*self._streak_over_ranks(worst, worst_start))
                        worst, worst_start = torch.zeros_like(worst), torch.zeros_like(worst)
                        self.window = LogWindow()
                        tic = time.perf_counter()
                    epoch_end = self.batch_in_epoch >= self.steps_per_epoch
                    if self._due(t.eval_every, epoch_end) and not last:
                        self._close_segment(tic)  # evaluation time is not training time
                        self._evaluate()
                        tic = time.perf_counter()
                    stop = self._stop_agreed()
                    if self._due(t.checkpoint_every, epoch_end) or last or stop:
                        self._close_segment(tic)
                        self.save_checkpoint(epoch_done=epoch_end)
                        tic = time.perf_counter()
                        if stop:
                            raise Stopped(
                                f"stopped by SIGTERM at step {self.step}; resume with resume=true"
                            )
                    if last:
                        break
                self._close_segment(tic)  # the loader's epoch tail counts as training time
                if self.batch_in_epoch >= self.steps_per_epoch:
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._evaluate()
        finally:
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)
            if progress is not None:
                progress.close()
        if self.metrics is not None:
            self.metrics.hparams(self._hparams(), self.last_eval)
        return self.final_summary()

    def final_summary(self) -> dict[str, Any]:
        """The run.json fields of this fit, with the callbacks' diagnostics; also for a run that
        diverged or stopped, so that its record says what the telemetry saw."""
        summary = self.summary()
        self._call("on_fit_end", summary.setdefault("diagnostics", {}))
        return summary

    def _close_segment(self, tic: float) -> None:
        """End a stretch of pure training time (synchronising the GPU first)."""
        self._sync()
        elapsed = time.perf_counter() - tic
        self.train_time += elapsed
        self.window.time += elapsed

    def _due(self, every: int | None, epoch_end: bool) -> bool:
        """Periodic events: every N iterations, or at the end of each epoch when N is null."""
        return epoch_end if every is None else self.step % every == 0

    def _window_over_ranks(self) -> tuple[float, float]:
        """The log row's mean train loss and samples/s over all ranks: each rank's loss is the
        mean over its equal share of the global batch, so the global mean is their mean."""
        w, world = self.window, distributed.world_size()
        t = torch.tensor([float(w.loss_sum), float(w.samples)], dtype=torch.float64)
        distributed.all_reduce_(t, "sum")
        return float(t[0]) / (world * max(w.count, 1)), float(t[1]) / max(w.time, 1e-9)

    def _streak_over_ranks(self, worst: torch.Tensor, worst_start: torch.Tensor) -> tuple[int, int]:
        """The longest run of non-finite losses on any rank since the last log row, and where it
        began (under DDP: the latest start among ranks): all ranks must end the run together."""
        if not distributed.is_distributed():
            return int(worst), int(worst_start)
        both = distributed.all_reduce_(torch.stack([worst, worst_start]), "max")
        return int(both[0]), int(both[1])

    def _stop_agreed(self) -> bool:
        """A stop (SIGTERM) on any rank stops every rank at the same step: torchrun and SLURM
        signal the processes at slightly different moments, and a rank that ran one step further
        would wait forever in DDP's gradient all-reduce. One tiny all-reduce per step, only
        when distributed."""
        if not distributed.is_distributed():
            return self._stop_requested
        flag = torch.tensor([1.0 if self._stop_requested else 0.0])
        self._stop_requested = bool(distributed.all_reduce_(flag, "max")[0])
        return self._stop_requested

    def _check_divergence(self, bad_streak: int, streak_start: int) -> None:
        if bad_streak >= self.cfg.trainer.diverge_patience:
            raise Diverged(
                f"loss was non-finite for {bad_streak} consecutive steps from step {streak_start}",
                streak_start,
            )

    def _evaluate(self) -> None:
        metrics = self.task.evaluate()
        self.last_eval = metrics
        if self.metrics is not None:
            self.metrics.log(self.step, "eval", {"epoch": self._epoch_float(), **metrics})
            self.task.log_media(self.writer, self.step)
        shown = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        self.log.info("eval at step %d: %s", self.step, shown)
        self._call("on_eval_end", self.step, metrics)

    def _log_train(self, loss: float, samples_per_s: float, progress: Any) -> None:
        lr = next(iter(self.task.optimizers.values())).param_groups[0]["lr"]
        skipped = self.policy.summary()["skipped_steps"]
        row = {
            "epoch": self._epoch_float(),
            "loss": loss,
            "lr": lr,
            "loss_scale": self.policy.loss_scale(),
            "skipped_steps": skipped,
            "samples_per_s": samples_per_s,
            "wall_time_s": self.train_time,
            **self.window.mean_logs(),
        }
        if self.metrics is not None:
            self.metrics.log(self.step, "train", row)
            scales = self.policy.loss_scales()
            if len(scales) > 1:  # several optimizers (the GAN): each loss has its own scale
                for name, scale in scales.items():
                    self.writer.add_scalar(f"train/loss_scale/{name}", scale, self.step)
            for (
                layer,
                scale,
            ) in self.policy.layer_scales().items():  # precision=adaptive: one per layer
                self.writer.add_scalar(f"loss_scale_layer/{layer}", scale, self.step)
        if progress is not None:
            progress.n = self.step
            progress.set_postfix(
                loss=f"{loss:.4g}", samples_s=f"{samples_per_s:.0f}", scale=f"{row['loss_scale']:g}"
            )
            progress.refresh()

    def _epoch_float(self) -> float:
        return self.step / self.steps_per_epoch

    # -- record ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        policy = self.policy.summary()
        # self.samples counts this rank's; every rank takes an equal share of each global batch
        samples = self.samples * distributed.world_size()
        return {
            "metrics": self.last_eval,
            "steps": self.step,
            "epochs": round(self._epoch_float(), 4),
            "skipped_steps": policy["skipped_steps"],
            "loss_scale": policy["loss_scale"],
            "samples_per_s": samples / self.train_time if self.train_time > 0 else None,
            "train_time_s": self.train_time,
            **peak_memory(self.task.device),
            "diagnostics": dict(policy.get("diagnostics", {})),
        }

    def _hparams(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "experiment": c.experiment_name,
            "precision": c.precision.name,
            "budget": c.budget.name,
            "seed": c.seed,
            "model": c.model.name,
            "optimizer": c.optim.name,
            "lr": c.optim.lr,
            "batch_size": c.data.batch_size,
        }

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, epoch_done: bool = False) -> None:
        # Every rank's own random streams and task state (e.g. an LM's hidden state) go into the
        # one checkpoint that rank 0 writes; the model, optimizer and scale are the same on all.
        per_rank = distributed.all_gather_object(
            {"rng": rng_state(), "task": self.task.state_dict()}
        )
        if self.is_main:
            self._write_checkpoint(epoch_done, per_rank)
        distributed.barrier()  # no rank runs (or exits) ahead of a checkpoint that is half written

    def _write_checkpoint(self, epoch_done: bool, per_rank: list[dict]) -> None:
        epoch, batch = (self.epoch + 1, 0) if epoch_done else (self.epoch, self.batch_in_epoch)
        state = {
            "step": self.step,
            "epoch": epoch,
            "batch_in_epoch": batch,
            "samples": self.samples,
            "train_time": self.train_time,
            "last_eval": self.last_eval,
            "window": self.window.state(),
            "models": {k: m.state_dict() for k, m in self.task.models.items()},
            "optimizers": {k: o.state_dict() for k, o in self.task.optimizers.items()},
            "schedulers": {k: s.state_dict() for k, s in self.schedulers.items()},
            "policy": self.policy.state_dict(),
            "task": self.task.state_dict(),
            "rng": rng_state(),
            "per_rank": per_rank if len(per_rank) > 1 else None,
        }
        path = self.run_dir / CHECKPOINT
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: a kill mid-save leaves the previous checkpoint intact

    def _maybe_resume(self) -> bool:
        path = self.run_dir / CHECKPOINT
        if not (self.cfg.resume and path.exists()):
            return False
        state = torch.load(path, map_location=self.task.device, weights_only=False)
        for k, m in self.task.models.items():
            m.load_state_dict(state["models"][k])
        for k, o in self.task.optimizers.items():
            o.load_state_dict(state["optimizers"][k])
        for k, s in self.schedulers.items():
            s.load_state_dict(state["schedulers"][k])
        self.policy.load_state_dict(state["policy"])
        mine = state.get("per_rank") or []
        mine = (
            mine[distributed.rank()] if len(mine) == distributed.world_size() else state
        )  # else: rank 0's
        self.task.load_state_dict(mine["task"])
        set_rng_state(mine["rng"])
        self.step, self.epoch, self.batch_in_epoch = (
            state["step"],
            state["epoch"],
            state["batch_in_epoch"],
        )
        self.samples, self.train_time, self.last_eval = (
            state["samples"],
            state["train_time"],
            state["last_eval"],
        )
        self.window = LogWindow(**state["window"])
        self.log.info(
            "resumed from %s at step %d (epoch %d, batch %d)",
            path,
            self.step,
            self.epoch,
            self.batch_in_epoch,
        )
        return True

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    # -- plumbing --------------------------------------------------------------------------------
    def _call(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, hook, None)
            if fn is not None:
                fn(self, *args)

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.log.warning("SIGTERM: saving a checkpoint at the end of this step, then stopping")
        self._stop_requested = True

    def _sync(self) -> None:
        if self.task.device.type == "cuda":
            torch.cuda.synchronize(self.task.device)

    def _progress_bar(self) -> Any:
        if not (self.cfg.trainer.progress and self.is_main):
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=self.total_steps,
            initial=self.step,
            desc=f"{self.cfg.experiment_name}/{self.cfg.precision.name}",
            unit="step",
            dynamic_ncols=True,
            mininterval=1.0,
        )


class LogWindow:
    """The steps since the last train row of the log: their summed loss, extra logs, samples, time.

    Part of the checkpoint, so that a resumed run logs exactly the rows of an uninterrupted one.
    """

    def __init__(
        self,
        loss_sum: float = 0.0,
        count: int = 0,
        samples: int = 0,
        time: float = 0.0,
        log_sums: dict[str, float] | None = None,
    ):
        self.loss_sum, self.count, self.samples, self.time = loss_sum, count, samples, time
        self.log_sums: dict[str, Any] = dict(
            log_sums or {}
        )  # a task's extra scalars (GAN: d_loss, g_loss)

    def add(self, result: Any) -> None:
        self.loss_sum = (
            self.loss_sum + result.loss.float()
        )  # stays on the device; a NaN shows as NaN
        for key, value in result.logs.items():
            value = value.detach().float() if torch.is_tensor(value) else float(value)
            self.log_sums[key] = self.log_sums.get(key, 0.0) + value
        self.count += 1
        self.samples += result.samples

    def mean_loss(self) -> float:
        return float(self.loss_sum) / max(self.count, 1)

    def mean_logs(self) -> dict[str, float]:
        return {key: float(total) / max(self.count, 1) for key, total in self.log_sums.items()}

    def samples_per_s(self) -> float:
        return self.samples / max(self.time, 1e-9)

    def state(self) -> dict[str, Any]:
        return {
            "loss_sum": float(self.loss_sum),
            "count": self.count,
            "samples": self.samples,
            "time": self.time,
            "log_sums": {k: float(v) for k, v in self.log_sums.items()},
        }


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory of the run: CUDA allocator peak on a GPU; the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_kind": "cuda_max_allocated",
        }
    return {
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_memory_kind": "host_max_rss",
    }


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
