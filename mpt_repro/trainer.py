"""The one training loop. Every experiment and every precision preset runs through `Trainer.fit`.

What differs between experiments lives in the Task; what differs between precisions lives in the
PrecisionPolicy and its optimizers. The loop itself counts steps, schedules the LR, logs,
evaluates, checkpoints and notices divergence, and never waits for the GPU between log rows.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from mpt_repro import distributed, fsdp
from mpt_repro.checkpoint import load_checkpoint, save_checkpoint
from mpt_repro.ema import ParameterEMA
from mpt_repro.errors import ConfigError, DataError, Diverged, Interrupted
from mpt_repro.evidence import ITEMS_FILE, Evaluation, write_items
from mpt_repro.memory import RunMemory
from mpt_repro.optim import lr_multiplier
from mpt_repro.runlog.console import RunProgress
from mpt_repro.runlog.metrics import MetricsLogger, Resume, comparison_group
from mpt_repro.schedule import LRSchedule
from mpt_repro.stopping import stop_on_signals

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from mpt_repro.precision.policy import PrecisionPolicy
    from mpt_repro.tasks.base import StepResult, Task

CHECKPOINT = "checkpoints/last.pt"


class Callback(Protocol):
    """What the trainer calls; a callback implements the hooks it needs (all optional)."""

    def on_fit_start(self, trainer: Trainer) -> None: ...
    def on_step_start(self, trainer: Trainer, step: int) -> None: ...
    def on_step_end(self, trainer: Trainer, step: int, result: StepResult) -> None: ...
    def on_eval_end(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None: ...
    def on_fit_end(self, trainer: Trainer, diagnostics: dict) -> None: ...


class Trainer:
    def __init__(
        self,
        cfg: DictConfig,
        task: Task,
        policy: PrecisionPolicy,
        run_dir: Path,
        callbacks: list[Callback] | None = None,
        is_main: bool = True,
    ):
        self.cfg, self.task, self.policy, self.run_dir = cfg, task, policy, Path(run_dir)
        self.callbacks = callbacks or []
        self.is_main = is_main  # only the main process writes files (distributed runs)
        self.log = logging.getLogger("mpt_repro")
        self.step = 0  # iterations done (skipped ones included)
        self.epoch = 0
        self.batch_in_epoch = 0
        self.samples = 0
        self.clock = Clock(task.device)
        self.last_eval: dict[str, float | None] = {}
        self.last_eval_step: int | None = None
        self.last_evaluation: dict[str, Any] | None = None  # run.json's `evaluation` block
        self.window = LogWindow()  # what the next train row of the log averages over
        self.divergence = DivergenceWatch(cfg.trainer.diverge_patience, task.device)
        self._stop_signal: int | None = None  # the signal that asked for a stop
        self._finishing = False  # in the final evaluation: a signal stops it at once
        spe = task.steps_per_epoch()
        if spe < 1:
            raise DataError(no_full_step(cfg, task))
        t = cfg.trainer
        self.steps_per_epoch = spe
        self.total_steps = (
            spe * t.epochs if t.max_steps is None else min(spe * t.epochs, t.max_steps)
        )
        multiplier = lr_multiplier(cfg.optim, spe, self.total_steps)
        o = cfg.optim
        plateau = (o.plateau_decay, o.plateau_rows) if o.get("plateau_decay") else None
        self.schedules = {
            name: LRSchedule(
                opt, multiplier, self.total_steps, cfg.precision.hold_lr_on_skip, plateau
            )
            for name, opt in task.optimizers.items()
        }
        self.emas = self._build_emas()
        self.metrics: MetricsLogger | None = None
        self.writer = None
        # peaks since this run began, and the bytes saved for backward on its first step
        # (torch.compile cannot trace the saved-tensor hooks that count them)
        self.memory = RunMemory(task.device, measure_saved=not cfg.trainer.compile)

    def _build_emas(self) -> dict[str, ParameterEMA]:
        decay = self.cfg.optim.ema_decay
        if decay is None:
            return {}
        models, opts = self.task.models, self.task.optimizers
        if set(models) != set(opts):
            raise ConfigError(
                f"optim.ema_decay: this task's models {sorted(models)} do not each have one "
                f"optimizer ({sorted(opts)}); use optim.ema_decay=null"
            )
        o = self.cfg.optim
        return {
            name: ParameterEMA(models[name], opts[name], decay, o.ema_warmup, o.ema_params)
            for name in models
        }

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        resumed = self._maybe_resume()
        if self.is_main:
            self.metrics = MetricsLogger(
                self.run_dir,
                self.task.metric_names,
                resume=resumed,
                compare_group=comparison_group(self.cfg),
                train_loss=self.task.train_loss_name,
            )
            self.writer = self.metrics.writer
        self._call("on_fit_start")
        with self._stop_on_signals(), self._progress_bar() as progress:
            while self.step < self.total_steps:
                self.clock.start()
                for batch in self.task.train_batches(self.epoch, skip=self.batch_in_epoch):
                    # one training step
                    self._call("on_step_start", self.step)
                    result = self.memory.step(self.task.train_step, batch)
                    self._count(result)
                    self._call("on_step_end", self.step, result)
                    last = self.step >= self.total_steps
                    epoch_end = self.batch_in_epoch >= self.steps_per_epoch
                    # the periodic events, each with the clock paused but the log row
                    if self.step % self.cfg.trainer.log_every == 0 or last:
                        self._log_row(progress, last)
                    if self._due(self.cfg.trainer.eval_every, epoch_end) and not last:
                        with self.clock.paused():
                            self._evaluate()
                    stop = self._stop_agreed(last)
                    if self._due(self.cfg.trainer.checkpoint_every, epoch_end) or last or stop:
                        with self.clock.paused():
                            self.save_checkpoint(epoch_done=epoch_end)
                    if stop:  # the checkpoint is saved: the run can resume from here
                        raise Interrupted(self._stop_signal or signal.SIGTERM, self.step)
                    if last:
                        break
                self.clock.stop()  # the loader's epoch tail counts as training time
                if self.batch_in_epoch >= self.steps_per_epoch:
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                elif self.step < self.total_steps:  # asked again, it would yield nothing
                    raise DataError(self._ran_dry())
            self._finishing = True  # a signal now stops the evaluation (mpt_repro/stopping.py)
            self._evaluate()
        return self.final_summary()

    def _ran_dry(self) -> str:
        d = self.cfg.data
        root = f" ({d.root})" if d.get("root") else ""
        return (
            f"the training data ran dry: epoch {self.epoch} of data.name={d.name}{root} ended "
            f"after its batch {self.batch_in_epoch}, but the run counted {self.steps_per_epoch} "
            f"per epoch (steps_per_epoch, from the data's size at the start, data.batch_size="
            f"{d.batch_size} and trainer.accumulate={self.cfg.trainer.accumulate}); the loader "
            "and its sampler disagree on the epoch's length (files removed while the run read "
            "them, or a sampler or data set whose __len__ is wrong); fix that, then run again"
        )

    def _count(self, result: StepResult) -> None:
        """Book one iteration: counters, LR schedules, divergence streak, the log window."""
        self.step += 1
        self.batch_in_epoch += 1
        self.samples += result.samples
        for name, schedule in self.schedules.items():
            schedule.step(result.stepped_by.get(name, result.stepped))
        for name, ema in self.emas.items():
            ema.update(result.stepped_by.get(name, result.stepped))
        self.divergence.add(result.loss, self.step)
        self.window.add(result)

    def _log_row(self, progress: Any, last: bool = False) -> None:
        """A train row of the log: the one place where the host reads the device's counters."""
        self.clock.stop()
        self.window.time += self.clock.take_lap()
        loss, samples_per_s = self._window_over_ranks()
        self._log_train(loss, samples_per_s, progress)
        for schedule in self.schedules.values():
            schedule.observe(loss)  # optim.plateau_decay reads the row's loss
        self.divergence.check(at_end=last)
        self.policy.check_divergence()
        self.window = LogWindow()
        self.clock.start()

    def final_summary(self) -> dict[str, Any]:
        """The run.json fields of this fit, with the callbacks' diagnostics; also for a run that
        diverged or stopped, so that its record says what the telemetry saw."""
        summary = self.summary()
        self._call("on_fit_end", summary.setdefault("diagnostics", {}))
        return summary

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

    def _stop_agreed(self, last: bool) -> bool:
        """A stop (SIGTERM, Ctrl-C) on any rank stops every rank at the same step: torchrun and
        SLURM signal the processes at slightly different moments, and a rank that ran one step
        further would wait forever in DDP's gradient all-reduce. Under DDP the ranks agree at log
        rows only (one tiny all-reduce there, none on ordinary steps)."""
        if not distributed.is_distributed():
            return self._stop_signal is not None
        if not (self.step % self.cfg.trainer.log_every == 0 or last):
            return False
        flag = torch.tensor([1.0 if self._stop_signal else 0.0])
        if bool(distributed.all_reduce_(flag, "max")[0]):
            self._stop_signal = self._stop_signal or signal.SIGTERM
            return True
        return False

    def _evaluate(self) -> None:
        with contextlib.ExitStack() as averaged:  # optim.ema_decay: evaluate the averages
            for ema in self.emas.values():
                averaged.enter_context(ema.applied())
            # fsdp2: the full weights (the averages, when applied) gathered for the evaluation
            averaged.enter_context(distributed.full_weights(self.task.models.values()))
            if self.cfg.trainer.recalibrate_bn:  # statistics of the weights evaluated
                self.task.recalibrate_bn(self.cfg.trainer.recalibrate_bn)
            evaluation = self.task.evaluate()
        metrics = evaluation.metrics
        self.last_eval, self.last_eval_step = metrics, self.step
        items_file = None
        if self.is_main and evaluation.columns is not None:  # what each item scored, beside
            items_file = ITEMS_FILE  # run.json: the report's interval resamples the items
            write_items(self.run_dir / ITEMS_FILE, evaluation.columns, self.step)
        self.last_evaluation = evaluation.record(self.step, items_file)
        if self.metrics is not None:
            self.metrics.log(self.step, "eval", {"epoch": self._epoch_float(), **metrics})
            self.task.log_media(self.writer, self.step)
        shown = ", ".join(
            f"{k}={v:.4g}" if v is not None else f"{k}=undefined" for k, v in metrics.items()
        )
        counts = ", ".join(f"{n} {u}" for u, n in _counted(evaluation).items())
        self.log.info("eval at step %d: %s (%s)", self.step, shown, counts)
        self._call("on_eval_end", self.step, metrics)

    def _log_train(self, loss: float, samples_per_s: float, progress: Any) -> None:
        lr = float(next(iter(self.task.optimizers.values())).param_groups[0]["lr"])
        precision = self.policy.scalars()
        row = {
            "epoch": self._epoch_float(),
            self.task.train_loss_name: loss,
            "lr": lr,
            "loss_scale": precision["loss_scale"],
            "skipped_steps": precision["skipped_steps"],
            "samples_per_s": samples_per_s,
            "wall_time_s": self.clock.total,
            **self.window.mean_logs(),
        }
        if self.metrics is not None:
            self.metrics.log(self.step, "train", row)
            # several optimizers (the GAN): each loss has its own scale; adaptive: one per layer
            for name, scale in precision.get("loss_scales", {}).items():
                self.writer.add_scalar(f"train/loss_scale/{name}", scale, self.step)
            for layer, scale in precision.get("layer_scales", {}).items():
                self.writer.add_scalar(f"loss_scale_layer/{layer}", scale, self.step)
        progress.update(
            self.step,
            **{self.task.train_loss_name: loss},
            samples_s=round(samples_per_s),
            scale=row["loss_scale"],
        )

    def _epoch_float(self) -> float:
        return self.step / self.steps_per_epoch

    # -- record ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        policy = self.policy.summary()
        # self.samples counts this rank's; every rank takes an equal share of each global batch
        samples = self.samples * distributed.world_size()
        train_time = self.clock.total
        return {
            "metrics": self.last_eval,
            "metrics_detail": self.task.metrics_detail or None,
            "evaluation": self.last_evaluation,
            "steps": self.step,
            "epochs": round(self._epoch_float(), 4),
            "skipped_steps": policy["skipped_steps"],
            "loss_scale": policy["loss_scale"],
            "samples_per_s": samples / train_time if train_time > 0 else None,
            "train_time_s": train_time,
            **self.memory.summary(),
            "diagnostics": dict(policy.get("diagnostics", {})),
        }

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, epoch_done: bool = False) -> None:
        # Every rank's own random streams and task state (e.g. an LM's hidden state) go into the
        # one checkpoint that rank 0 writes; the model, optimizer and scale are the same on all.
        per_rank = distributed.all_gather_object(
            {"rng": rng_state(), "task": self.task.state_dict()}
        )
        # fsdp2: every rank writes its shards first (torch.distributed.checkpoint)
        sharded = fsdp.save_sharded(self.run_dir, self.step, self.task, self.emas)
        if self.is_main:
            self._write_checkpoint(epoch_done, per_rank, sharded)
        distributed.barrier()  # no rank runs (or exits) ahead of a checkpoint that is half written

    def _write_checkpoint(
        self, epoch_done: bool, per_rank: list[dict], sharded: str | None = None
    ) -> None:
        epoch, batch = (self.epoch + 1, 0) if epoch_done else (self.epoch, self.batch_in_epoch)
        state = {
            "step": self.step,
            "epoch": epoch,
            "batch_in_epoch": batch,
            "samples": self.samples,
            "train_time": self.clock.total,
            "last_eval": self.last_eval,
            "last_eval_step": self.last_eval_step,
            "last_evaluation": self.last_evaluation,
            "metrics_rows": list(self.metrics.rows) if self.metrics is not None else None,
            # the window's time so far includes the clock's running lap
            "window": {**self.window.state(), "time": self.window.time + self.clock.lap},
            "divergence": self.divergence.state(),
            "models": {k: m.state_dict() for k, m in self.task.models.items()}
            if sharded is None
            else None,
            "optimizers": {k: o.state_dict() for k, o in self.task.optimizers.items()},
            "schedules": {k: s.state_dict() for k, s in self.schedules.items()},
            "emas": {k: e.state_dict() for k, e in self.emas.items()},
            "task": self.task.state_dict(),
            "rng": rng_state(),
            "per_rank": per_rank if len(per_rank) > 1 else None,
        }
        if sharded is not None:
            state = fsdp.without_sharded(state, sharded)
        # atomic, and the one before is kept: a corrupt last.pt resumes from previous.pt
        save_checkpoint(self.run_dir, state)
        if sharded is not None:
            fsdp.prune_sharded(self.run_dir)  # the folders of last.pt and previous.pt kept

    def _maybe_resume(self) -> Resume | None:
        """Load the checkpoint when resuming; where the log continues (None: a fresh start)."""
        state = load_checkpoint(self.run_dir, self.task.device) if self.cfg.resume else None
        if state is None:
            return None
        path = state["loaded_from"]
        sharded = state.get("sharded") or fsdp.sharded_modules(self.task.models.values())
        if sharded:  # fsdp2: on every rank, resharded for this world size
            fsdp.load_sharded(self.run_dir, state, self.task, self.emas)
        for k, m in self.task.models.items():
            if not sharded:
                m.load_state_dict(state["models"][k])
        for k, o in self.task.optimizers.items():
            o.load_state_dict(state["optimizers"][k])
        for k, s in self.schedules.items():
            s.load_state_dict(state["schedules"][k])
        for k, e in self.emas.items():
            e.load_state_dict(state["emas"][k])
        mine = state.get("per_rank") or []
        # each rank its own streams; a different world size: rank 0's
        mine = mine[distributed.rank()] if len(mine) == distributed.world_size() else state
        self.task.load_state_dict(mine["task"])
        set_rng_state(mine["rng"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.batch_in_epoch, self.samples = state["batch_in_epoch"], state["samples"]
        self.clock.total, self.last_eval = state["train_time"], state["last_eval"]
        self.last_eval_step = state.get("last_eval_step")  # absent from older checkpoints
        self.last_evaluation = state.get("last_evaluation")
        self.window = LogWindow(**state["window"])
        self.divergence.load_state(state["divergence"])
        self.log.info(
            "resumed from %s at step %d (epoch %d, batch %d)",
            path,
            self.step,
            self.epoch,
            self.batch_in_epoch,
        )
        # an evaluation due at a checkpoint's step runs before the save, except the final one
        eval_done = self.step < self.total_steps
        return Resume(self.step, eval_done, state.get("metrics_rows"))

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

    def _stop_on_signals(self) -> contextlib.AbstractContextManager[None]:
        """SIGTERM (a cluster pre-emption) and Ctrl-C both end the run at the next step boundary
        with a checkpoint, within a bounded time (mpt_repro/stopping.py)."""
        return stop_on_signals(self)

    def _progress_bar(self) -> RunProgress:
        """A bar on a terminal with the log going through it; plain periodic lines elsewhere."""
        return RunProgress(
            self.total_steps,
            initial=self.step,
            desc=f"{self.cfg.experiment_name}/{self.cfg.precision.name}",
            enabled=self.cfg.trainer.progress,
            silent=not self.is_main,
        )


class Clock:
    """Training time: running between start() and stop(), paused for evaluation and checkpoints
    (which are not training). Stopping synchronises the GPU, so the time is the work's."""

    def __init__(self, device: torch.device):
        self.device, self.total, self._since = device, 0.0, None
        self.lap = 0.0  # training time since the last take_lap()

    def start(self) -> None:
        self._since = time.perf_counter()

    def stop(self) -> None:
        if self._since is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - self._since
        self.total += elapsed
        self.lap += elapsed
        self._since = None

    def take_lap(self) -> float:
        lap, self.lap = self.lap, 0.0
        return lap

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        running = self._since is not None
        self.stop()
        try:
            yield
        finally:
            if running:
                self.start()


class DivergenceWatch:
    """Consecutive non-finite losses, counted on the host from a copy of each step's loss.

    Each step copies its loss into host memory without waiting (a slot of a pinned buffer on a
    GPU, with an event that says when it has landed; on a CPU the copy is done at once): one
    launch a step, nothing computed on the device. The host looks at the values that have landed
    (reading host memory: no wait for the device) and counts the streak there. A run diverges
    when a streak reaches `patience`, at the step it does (on a GPU when that step's copy has
    landed, a step or so later). Under DDP every rank must stop at the same step, so there the
    streak is checked at log rows, where the ranks already exchange numbers (the run may go on up
    to trainer.log_every steps past the patience; the longest streak since the last row counts,
    even one that ended between rows).
    """

    SLOTS = 64  # loss copies in flight before another buffer is added (a GPU running ahead)

    def __init__(self, patience: int, device: torch.device):
        self.patience = patience
        self.streak = self.start = 0  # the current streak and its first step
        self.worst = self.worst_start = 0  # the longest since the last log row, and its start
        self._gpu = device.type == "cuda"
        self._per_step = not distributed.is_distributed()  # raise at the step, not at rows
        self._slots: list[tuple[torch.Tensor, np.ndarray, int, Any]] = []  # view, array, index
        self._free: list[int] = []
        self._in_flight: collections.deque[tuple[int, int]] = collections.deque()  # slot, step

    def _add_slots(self) -> None:
        buffer = torch.zeros(self.SLOTS, pin_memory=self._gpu)
        values = buffer.numpy()  # host memory: reading it waits for nothing
        first = len(self._slots)
        for i, view in enumerate(buffer.unbind(0)):
            event = torch.cuda.Event() if self._gpu else None
            self._slots.append((view, values, i, event))
        self._free += range(first, len(self._slots))

    def add(self, loss: torch.Tensor, step: int) -> None:
        if not self._free:
            self._add_slots()
        k = self._free.pop()
        view, _, _, event = self._slots[k]
        view.copy_(loss if loss.dim() == 0 else loss.reshape(()), non_blocking=True)
        if event is not None:
            event.record()
        self._in_flight.append((k, step))
        self._count_landed(wait=False)

    def _count_landed(self, wait: bool) -> None:
        """Count the losses whose copies have landed, in step order; `wait`: all of them."""
        while self._in_flight:
            k, step = self._in_flight[0]
            _, values, i, event = self._slots[k]
            if event is not None and not event.query():
                if not wait:
                    return
                event.synchronize()
            self._in_flight.popleft()
            self._free.append(k)
            with torch.autograd.profiler.record_function("host:divergence"):  # host memory
                bad = not math.isfinite(float(values[i]))
            self._count(bad, step)

    def _count(self, bad: bool, step: int) -> None:
        if bad and self.streak == 0:
            self.start = step
        self.streak = self.streak + 1 if bad else 0
        if self.streak > self.worst:
            self.worst, self.worst_start = self.streak, self.start
        if self._per_step and self.streak >= self.patience:
            raise Diverged(
                f"loss was non-finite for {self.streak} consecutive steps from step {self.start}",
                self.start,
            )

    def check(self, at_end: bool = False) -> None:
        """Raise Diverged when a streak reached the patience, or, `at_end` (the run's last step),
        when the loss is non-finite at the end: a streak that began with fewer than `patience`
        steps left can never reach it, and the run would end `completed` having learned nothing.
        All ranks agree under DDP."""
        self._count_landed(wait=True)
        worst, start, streak, streak_start = self.worst, self.worst_start, self.streak, self.start
        if distributed.is_distributed():  # the longest streak on any rank, the latest start
            both = torch.tensor([worst, start, streak, streak_start], dtype=torch.long)
            worst, start, streak, streak_start = distributed.all_reduce_(both, "max").tolist()
        self.worst = self.worst_start = 0
        if worst >= self.patience:
            raise Diverged(
                f"loss was non-finite for {worst} consecutive steps from step {start}", start
            )
        if at_end and streak > 0:
            raise Diverged(
                f"loss was non-finite at the end of the run (the last {streak} steps, from step "
                f"{streak_start}; fewer than trainer.diverge_patience={self.patience} were left)",
                streak_start,
            )

    def state(self) -> dict[str, int]:
        self._count_landed(wait=True)
        return {k: int(getattr(self, k)) for k in ("streak", "start", "worst", "worst_start")}

    def load_state(self, state: dict[str, int]) -> None:
        for k, v in state.items():
            setattr(self, k, int(v))


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
        # a task's extra scalars (GAN: d_loss, g_loss), summed on the device
        self.log_sums: dict[str, Any] = dict(log_sums or {})

    def add(self, result: StepResult) -> None:
        # stays on the device; a NaN shows as NaN
        self.loss_sum = self.loss_sum + result.loss.float()
        for key, value in result.logs.items():
            value = value.detach().float() if torch.is_tensor(value) else float(value)
            self.log_sums[key] = self.log_sums.get(key, 0.0) + value
        self.count += 1
        self.samples += result.samples

    def mean_logs(self) -> dict[str, float]:
        return {key: float(total) / max(self.count, 1) for key, total in self.log_sums.items()}

    def state(self) -> dict[str, Any]:
        return {
            "loss_sum": float(self.loss_sum),
            "count": self.count,
            "samples": self.samples,
            "time": self.time,
            "log_sums": {k: float(v) for k, v in self.log_sums.items()},
        }


def no_full_step(cfg: Any, task: Any) -> str:
    """Why an epoch holds no optimizer step, naming the setting that decides it: trainer.accumulate
    and data.max_seconds were blamed on data.batch_size."""
    d, accumulate = cfg.data, cfg.trainer.accumulate
    step = distributed.batch_sizes(cfg)[1]
    try:
        n: int | None = len(task.data.train)
    except (AttributeError, TypeError):
        n = None
    kept = f" (those data.max_seconds={d.max_seconds} keeps)" if d.get("max_seconds") else ""
    have = f"the training split's {n} items{kept}" if n is not None else "the training split"
    made_of = f"data.batch_size={d.batch_size}"
    if accumulate > 1:
        made_of += f" x trainer.accumulate={accumulate} micro-batches"
    if distributed.world_size() > 1:
        made_of += f" over {distributed.world_size()} processes"
    if accumulate > 1 and n is not None and n >= step // accumulate:
        fix = f"lower trainer.accumulate (at most {n // (step // accumulate)} here)"
    elif kept:
        fix = "raise data.max_seconds (or set it to null), or lower data.batch_size"
    else:
        fix = "lower data.batch_size, or use more data (data.train_limit)"
    return f"one optimizer step takes {step} training items ({made_of}), more than {have}: {fix}"


def rng_state() -> dict[str, Any]:
    # numpy's state as a tensor and plain values, not its array: checkpoints are read with
    # weights_only=True (mpt_repro/checkpoint.py), which admits tensors and plain values
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    saved = state["numpy"]
    if isinstance(saved, dict):
        keys = saved["keys"].cpu().numpy().astype(np.uint32)
        saved = (saved["name"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
    np.random.set_state(saved)  # a tuple: a checkpoint written before (numpy's own form)
    random.setstate(state["python"])


def _counted(evaluation: Evaluation) -> dict[str, int]:
    """{unit: count}: the items evaluated and each other unit a metric rests on (tokens, ...)."""
    counted = {evaluation.unit: evaluation.items}
    for metric, unit in evaluation.units.items():
        counted.setdefault(unit, evaluation.counts[metric])
    return counted
