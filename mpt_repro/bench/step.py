"""The step the bench measures: the suite's own, built the way `mpt-run` builds it.

`build_step` is the one place that knows how the suite makes a training step (PrecisionPolicy,
build_task, the task's train_step with its PrecisionOptimizer); when that API changes, only this
file follows. `BareLoop` is the reference for the trainer's overhead: the same math written as a
textbook torch.amp loop, and `TrainerWindows` runs the real Trainer loop over the same batch.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class BenchStep:
    step: Callable[[], Any]  # one training step of the suite on the resident batch
    # the step on the first n samples of the first micro-batch (the instrumented steps: saved
    # bytes, syncs, FLOPs); None where a batch cannot be cut
    step_on: Callable[[int], Any] | None
    batch: Any  # one step's input (the task's micro-batches), on the device
    samples: int  # examples per step
    micro_batch: int  # examples per micro-batch (the size step_on cuts)
    task: Any
    policy: Any


def build_step(cfg: Any, device: torch.device) -> BenchStep:
    """The task's train_step on one step's input that stays on the device: the first item of
    the task's own train_batches (its micro-batches: the data's shapes and dtypes are the run's),
    moved there once."""
    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.run import step_compile_mode
    from mpt_repro.tasks import build_task

    policy = PrecisionPolicy(
        cfg.precision,
        device,
        paper_loss_scale=cfg.paper_loss_scale,
        compile_mode=step_compile_mode(cfg.trainer),
    )
    task = build_task(cfg, device, policy)
    batch = to_device(next(iter(task.train_batches(0))), device)
    # the first warm-up step: it settles lazily built state (optimizer buffers, autotuning) and
    # says how many samples a step takes
    first = _first_step(task, batch, cfg)
    samples = int(first.samples)
    micro = samples // max(len(batch), 1) if isinstance(batch, list) else samples
    step_on = None
    # the task says whether a micro-batch holds its examples on the first dimension (images,
    # labels): then one micro-batch (saved tensors live from its forward to its backward only),
    # cut to n examples, is a step on n
    if isinstance(batch, list) and task.examples_on_first_dim(batch[0], micro):

        def step_on(n: int) -> Any:
            return task.train_step([_first(batch[0], n)])

    return BenchStep(
        step=lambda: task.train_step(batch),
        step_on=step_on,
        batch=batch,
        samples=samples,
        micro_batch=micro,
        task=task,
        policy=policy,
    )


def _first_step(task: Any, batch: Any, cfg: Any) -> Any:
    """The first step, where a batch that cannot train is refused in one line (batch norm over
    one value per channel: a batch of 1, or a small batch at a 1x1 feature map)."""
    from mpt_repro.errors import UserError

    try:
        return task.train_step(batch)
    except ValueError as e:
        if "Expected more than 1 value per channel" not in str(e):
            raise
        raise UserError(
            f"data.batch_size={cfg.data.batch_size} cannot train {cfg.experiment_name}: its batch "
            "norm sees one value per channel at this batch and input size; use a larger "
            "data.batch_size (or data.image_size)"
        ) from None


def enum_name(v: Any) -> str:
    """An enum member's name or a plain string (OmegaConf gives enums for typed fields)."""
    return str(getattr(v, "name", v))


def to_device(batch: Any, device: torch.device) -> Any:
    if torch.is_tensor(batch):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    return batch


def _first(batch: Any, n: int) -> Any:
    """The first n samples, copied: a view would keep the whole batch's storage alive, and the
    saved-bytes count (per storage) would see the full input at every batch size. Past the
    batch's end the samples repeat (the saved-bytes slope's second point above a small batch)."""
    if torch.is_tensor(batch):
        if n > len(batch):
            batch = batch.repeat(-(-n // len(batch)), *([1] * (batch.dim() - 1)))
        return batch[:n].clone()
    return type(batch)(_first(b, n) for b in batch)


def skipped_steps(policy: Any) -> int:
    """Updates skipped for overflow so far (a host read)."""
    return int(policy.summary()["skipped_steps"])


# -- the trainer's own loop --------------------------------------------------------------------
class TrainerWindows:
    """The suite's Trainer.fit over the resident batch, a window of n steps at a time, on the
    Trainer's own clock (evaluation and checkpoints paused, as in a run). Nothing is written:
    the Trainer runs as a non-main process would, and evaluation is one batch at each window's
    end (outside the clock)."""

    def __init__(self, cfg: Any, bs: BenchStep, total_steps: int):
        from mpt_repro.trainer import Trainer

        t = cfg.trainer
        t.max_steps, t.epochs = total_steps, max(t.epochs, total_steps)
        t.eval_every = t.checkpoint_every = 10**9
        t.progress = False
        self._dir = tempfile.TemporaryDirectory(prefix="mpt-bench-")
        task = bs.task
        spe = task.steps_per_epoch()
        # the loader replaced by the resident batch: the data path is not the trainer's overhead
        task.train_batches = lambda epoch, skip=0: itertools.repeat(bs.batch, spe - skip)
        t.recalibrate_bn = 0  # the evaluations that end the windows: as cheap as can be
        # the bench times the loop, not whether it learns: a loss that went non-finite on the
        # resident batch (a tiny synthetic setting at a full-size LR) must not end the
        # measurement. The watch still copies each loss (its per-step cost is the loop's);
        # only its verdicts are dropped
        t.diverge_patience = 2**31 - 1
        self.trainer = Trainer(cfg, task, bs.policy, Path(self._dir.name), is_main=False)
        self.trainer.divergence.check = _no_verdict
        self.trainer.policy = _NoVerdict(bs.policy)

    def run(self, n: int) -> float:
        """Samples per second over n more steps of Trainer.fit."""
        tr = self.trainer
        clock0, samples0 = tr.clock.total, tr.samples
        tr.total_steps = tr.step + n
        tr.fit()
        return (tr.samples - samples0) / max(tr.clock.total - clock0, 1e-12)

    def count(self, n: int, device: torch.device) -> dict[str, float]:
        """The Trainer's steps counted one by one (from its on_step_start to its on_step_end:
        the step, the LR schedules, EMA, divergence watch, log window; the log rows and
        evaluations after on_step_end are not in it): the median ATen ops and host reads of n
        more steps, none of which is the window's last (that one logs)."""

        counter = _StepCounter(device)
        tr = self.trainer
        tr.callbacks.append(counter)
        try:
            tr.total_steps = tr.step + n + 1
            tr.fit()
        finally:
            tr.callbacks.remove(counter)
            counter.close()
        rows = [c for c, step in counter.done if step % tr.cfg.trainer.log_every != 0][:n]
        if not rows:
            return {"ops_per_step": None, "host_reads_per_step": None}
        return {
            "ops_per_step": statistics.median(c.dispatched for c in rows),
            "host_reads_per_step": statistics.median(c.reads for c in rows),
        }

    def close(self) -> None:
        self.trainer.close()
        self._dir.cleanup()


def trainer_ops(cfg: Any, bs: Any, device: torch.device) -> dict[str, float]:
    """Trainer.fit's ATen ops and host reads per step around the step `bs`: two warm-up steps,
    then three counted (the bench's baseline and the tests ask the same)."""
    windows = TrainerWindows(cfg, bs, total_steps=20)
    try:
        windows.run(2)
        return windows.count(3, device)
    finally:
        windows.close()


def _no_verdict(at_end: bool = False) -> None:
    """DivergenceWatch.check for the bench's windows: nothing raised (see TrainerWindows)."""


class _NoVerdict:
    """The precision policy as the bench's Trainer sees it: everything but the scale floor's
    Diverged verdict (a resident batch may overflow at the floor; the windows go on)."""

    def __init__(self, policy: Any):
        self._policy = policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def check_divergence(self) -> None:
        pass


class _StepCounter:
    """Trainer callback: a SyncCounter around each step (on_step_start to on_step_end)."""

    def __init__(self, device: torch.device):
        self.device, self.counter, self.done = device, None, []

    def on_step_start(self, trainer: Any, step: int) -> None:
        from mpt_repro.bench.measure import SyncCounter

        self.counter = SyncCounter(self.device)
        self.counter.__enter__()

    def on_step_end(self, trainer: Any, step: int, result: Any) -> None:
        self.close()
        self.done.append((self._last, step))

    def close(self) -> None:
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self._last, self.counter = self.counter, None


# -- the same math without the suite --------------------------------------------------------------
class BareLoop:
    """A textbook loop doing the suite's math for one preset, on a copy of the suite's model:
    torch.autocast, torch.amp.GradScaler (dynamic, or with a growth interval no run reaches for a
    static scale), the suite's own optimizer kind (fused where the suite's is), and for FP16
    weights with a master copy, FP32 masters kept by hand (grads copied in, weights copied out).
    For a task that trains one model by its criterion(model(inputs), targets) on micro-batches
    of examples (Task.criterion, Task.examples_on_first_dim); `why_not` says when it cannot be
    built.

    What it is for each preset (`kind`): "autocast + GradScaler" (amp, and any FP32-weight
    preset with a loss scale), "bare FP32" (fp32, tf32: no autocast, no scaler), "autocast" (bf16),
    "apex O2" (mixed: FP16 model with FP32 batch norm, FP32 master weights kept by hand, the
    scaler over the masters, as apex's O2 and FP16_Optimizer do), "FP16, no master" (no_master).
    The master gradients are allocated once and overwritten by each step's copy (no zeroing)."""

    def __init__(self, cfg: Any, bs: BenchStep, device: torch.device):
        from mpt_repro import distributed
        from mpt_repro.optim import optimizer_factory

        self.why_not: str | None = None
        task, policy = bs.task, bs.policy
        if task.criterion is None or len(task.models) != 1 or bs.step_on is None:
            self.why_not = (
                f"the bare loop needs a task that trains one model by a criterion over (inputs, "
                f"targets) micro-batches (Task.criterion); {enum_name(cfg.task)}'s loss is its own"
            )
            return
        self.model = copy.deepcopy(task.model)  # the suite's storage dtypes and memory format
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.masters = (
            [p.detach().float().clone() for p in self.params]
            if cfg.precision.master_weights
            else None
        )
        opt_params = self.masters or self.params
        if self.masters:
            for m in self.masters:
                m.grad = torch.zeros_like(m)
        _, global_batch = distributed.batch_sizes(cfg)
        self.opt = optimizer_factory(cfg.optim, global_batch)(
            [(n, p) for (n, _), p in zip(named, opt_params)]
        )
        _zero_momentum(self.opt)  # fused SGD: defined buffers even if the first step skips
        fused = bool(self.opt.defaults.get("fused"))
        self.clip = cfg.optim.grad_clip
        self.scaler = None
        scale = policy.summary()["loss_scale"]  # the preset's kind, where warm-up left it
        if scale["kind"] != "none":
            low_grads = not self.masters and policy.storage_dtype != torch.float32
            # GradScaler unscales FP16 grads only inside a fused optimizer's kernel: its
            # unscale_() (before a clip) and its non-fused step refuse them
            if low_grads and self.clip is not None:
                self.why_not = (
                    "GradScaler cannot unscale FP16 grads (no master copy) before the clip "
                    "(optim.grad_clip)"
                )
                return
            if low_grads and not fused:
                self.why_not = "GradScaler cannot unscale FP16 grads without a fused optimizer"
                return
            dynamic = scale["kind"] == "dynamic"
            self.scaler = torch.amp.GradScaler(
                device.type,
                init_scale=scale["final"],  # where the suite's scale settled in warm-up
                growth_interval=int(cfg.precision.growth_interval) if dynamic else 2**30,
            )
        self.kind = _bare_kind(policy, self.masters is not None, self.scaler is not None)
        self.autocast = policy.autocast  # torch.autocast in the compute dtype, or nothing
        self.micro = [self._input(mb, task, policy) for mb in bs.batch]  # the task's micro-batches
        self.loss_fn = task.criterion  # the task's own (label smoothing, aux heads)
        self.samples = bs.samples

    @staticmethod
    def _input(batch: Any, task: Any, policy: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch[0], batch[1]
        if getattr(task, "channels_last", False):
            x = x.contiguous(memory_format=torch.channels_last)
        return (x.to(policy.storage_dtype) if x.is_floating_point() else x), y

    def step(self) -> torch.Tensor:
        if self.masters is None:
            self.opt.zero_grad(set_to_none=True)
        else:  # the masters' gradients are overwritten below: only the model's are dropped
            for p in self.params:
                p.grad = None
        for x, y in self.micro:  # gradient accumulation: the mean over the micro-batches
            with self.autocast():
                loss = self.loss_fn(self.model(x), y) / len(self.micro)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if self.masters:
            torch._foreach_copy_([m.grad for m in self.masters], [p.grad for p in self.params])
        opt_params = self.masters or self.params
        if self.scaler is not None:
            if self.clip is not None:
                self.scaler.unscale_(self.opt)
                torch.nn.utils.clip_grad_norm_(opt_params, self.clip)
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            if self.clip is not None:
                torch.nn.utils.clip_grad_norm_(opt_params, self.clip)
            self.opt.step()
        if self.masters:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.masters)
        return loss


def _bare_kind(policy: Any, masters: bool, scaler: bool) -> str:
    """What the bare loop of a preset is, in words (the baseline table's column)."""
    if policy.storage_dtype != torch.float32:
        base = "apex O2 (FP16 model, FP32 masters)" if masters else "FP16 weights, no master"
    elif policy.compute_dtype == torch.float32:
        base = "bare FP32"
    else:
        base = "autocast " + ("FP16" if policy.compute_dtype == torch.float16 else "BF16")
    return base + (" + GradScaler" if scaler else "")


def _zero_momentum(opt: torch.optim.Optimizer) -> None:
    if not isinstance(opt, torch.optim.SGD):
        return
    for group in opt.param_groups:
        if group["momentum"]:
            for p in group["params"]:
                opt.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
