"""The one training step and the one evaluation loop, shared by every task.

A task says what to compute (its models, its batches, `loss(micro_batch)`, `eval_step(batch)`);
this module says how: autocast around the task's code, backward through the PrecisionOptimizer,
micro-batch accumulation with DDP's no_sync, the optimizer step and its skip signal, and for
evaluation eval mode, no_grad and the sums over ranks. No task calls `backward`, `autocast` or
an optimizer's `step` itself, so every task gets the same precision handling, and a bug in it
is fixed in one place (pytorch/vision PR #4874 is the bug a per-task loop invites).

One iteration runs the task's phases in order (`Task.phases`): one phase per optimizer step (one
for most tasks; the GAN's discriminator step, then its generator step). A phase

1. drops every optimizer's gradients, so that its step sees only its own loss's;
2. runs its loss on each micro-batch under autocast, divided by the number of micro-batches
   (their sum is the mean over the whole batch), and back-propagates each through the
   PrecisionOptimizer (which scales it); all but the last micro-batch inside no_sync of the
   phase's DDP-wrapped modules, so gradients are all-reduced once per step. A phase with
   `accumulate=False` runs its loss once on the iteration's micro-batches together;
3. steps its optimizer, which returns the skip signal: a 0-d bool on the device.

Nothing here reads a device value on the host. `task` is a Task (tasks/base.py, which imports
this module: typed Any here so that no import runs back).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from mpt_repro import distributed
from mpt_repro.evidence import Evaluation, from_columns


@dataclass
class Loss:
    """What a task's loss returns for one micro-batch (computed under autocast)."""

    value: torch.Tensor  # the FP32 training loss, a mean over the micro-batch's examples
    samples: int = 0  # examples (or tokens) it covered, for samples/s
    # extra scalars for the log (e.g. the parts of a detector's loss), each a micro-batch mean
    logs: dict[str, torch.Tensor] = field(default_factory=dict)
    # backward differentiates value x grad_factor (f-lm's loss times the BPTT length); the
    # loss reported stays `value`
    grad_factor: float = 1.0


@dataclass
class Phase:
    """One optimizer step of an iteration."""

    optimizer: str  # its key in Task.optimizers
    loss: Callable[[Any], Loss]  # of one micro-batch (of the list of them without accumulate)
    # the training forwards (DDP wrappers) the loss runs: put in train mode, and held in
    # no_sync while micro-batches accumulate
    modules: tuple[nn.Module, ...] = ()
    # False: the loss runs once on the iteration's micro-batches together, one backward
    accumulate: bool = True
    # with several phases each one's loss and skip flag are logged as <name>_loss, <name>_stepped
    # (default: the optimizer's name)
    name: str = ""


@dataclass
class StepResult:
    loss: torch.Tensor  # the (unscaled) training loss of this iteration, detached
    stepped: torch.Tensor  # 0-d bool on the device: False when the update was skipped (overflow)
    samples: int  # examples processed (for samples/s)
    logs: dict[str, torch.Tensor] = field(default_factory=dict)  # extra scalars (e.g. GAN losses)
    # with several optimizers: which of them stepped (keys as in Task.optimizers); each LR schedule
    # is held only when its own optimizer skipped
    stepped_by: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Done:
    """What one phase did: its summed loss, examples, logs and skip signal."""

    loss: torch.Tensor
    samples: int
    logs: dict[str, torch.Tensor]
    stepped: torch.Tensor


def micro_batches(items: list[Any], *ddp_models: nn.Module) -> Iterator[Any]:
    """Each micro-batch of an iteration; the caller's forward and backward of every one but the
    last run inside DDP's no_sync of each of `ddp_models`, so gradients are all-reduced once per
    optimizer step. Scale each micro-batch's loss by 1/len(items): the sum is the mean over the
    whole batch."""
    for i, item in enumerate(items):
        with contextlib.ExitStack() as accumulating:
            if i < len(items) - 1:
                for model in ddp_models:
                    accumulating.enter_context(distributed.no_sync(model))
            yield item


def train_step(task: Any, batch: Any) -> StepResult:
    """One iteration of `task` on `batch` (one item of its train_batches)."""
    items, phases = task.split(batch), task.phases()
    for phase in phases:
        for module in phase.modules:
            module.train()
    done = [_run_phase(task, phase, items) for phase in phases]
    return _result(phases, done)


def _run_phase(task: Any, phase: Phase, items: list[Any]) -> _Done:
    for opt in task.optimizers.values():
        opt.zero_grad()  # the other optimizers' too: nothing of another loss leaks into this step
    opt = task.optimizers[phase.optimizer]
    if phase.accumulate:
        loss, samples, logs = _accumulate(task, phase, opt, items)
    else:
        with task.policy.autocast():
            out = phase.loss(items)
        opt.backward(_for_backward(out, out.value))
        loss, samples = out.value.detach().float(), out.samples
        logs = {k: v.detach() for k, v in out.logs.items()}
    stepped = opt.step(**task.step_options(phase.optimizer))
    return _Done(loss, samples, logs, stepped)


def _accumulate(task: Any, phase: Phase, opt: Any, items: list[Any]) -> tuple[Any, int, dict]:
    """Forward and backward of each micro-batch; the summed (mean) loss, examples and logs."""
    n = len(items)
    total, samples, logs = None, 0, {}
    for item in micro_batches(items, *phase.modules):
        with task.policy.autocast():
            out = phase.loss(item)
            value = out.value / n
        opt.backward(_for_backward(out, value))
        total = _add(total, value.detach().float())
        samples += out.samples
        for key, v in out.logs.items():
            logs[key] = _add(logs.get(key), v.detach() / n)
    return total, samples, logs


def _for_backward(out: Loss, value: torch.Tensor) -> torch.Tensor:
    return value * out.grad_factor if out.grad_factor != 1 else value


def _add(total: Any, value: Any) -> Any:
    return value if total is None else total + value


def _result(phases: list[Phase], done: list[_Done]) -> StepResult:
    if len(done) == 1:
        (d,) = done
        return StepResult(d.loss, d.stepped, d.samples, d.logs)
    # several phases: the loss is their sum, so a non-finite value in any one ends the run as
    # diverged; each phase's loss and skip flag are logged under its name
    loss, stepped = done[0].loss, done[0].stepped
    for d in done[1:]:
        loss, stepped = loss + d.loss, stepped & d.stepped
    names = [p.name or p.optimizer for p in phases]
    logs = {f"{name}_loss": d.loss for name, d in zip(names, done)}
    for d in done:
        logs.update(d.logs)
    logs.update({f"{name}_stepped": d.stepped.float() for name, d in zip(names, done)})
    stepped_by = {p.optimizer: d.stepped for p, d in zip(phases, done)}
    return StepResult(loss, stepped, sum(d.samples for d in done), logs, stepped_by)


# -- evaluation ---------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(task: Any) -> Evaluation:
    """Every model in eval mode with rank 0's buffers; the task's eval_step on each of its
    eval_batches under autocast. A task with `formulas` gives one value per item for each column
    (mpt_repro/evidence.py): the columns of every rank are joined and every metric computed from
    their sums, with the count under it. A task without (detection: its AP needs every detection
    together) adds its eval_step's results into its eval_totals and reads them in
    `evaluation_of(totals)`."""
    for model in task.models.values():
        distributed.sync_buffers(model)  # every rank evaluates rank 0's BN statistics
        model.eval()
    if task.formulas is None:
        totals = task.eval_totals()
        for batch in task.eval_batches():
            with task.policy.autocast():
                found = task.eval_step(batch)
            for key, value in found.items():
                totals[key] = totals[key] + value
        return task.evaluation_of(_over_ranks(totals, task.device))
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in task.item_columns()}
    for batch in task.eval_batches():
        with task.policy.autocast():
            found = task.eval_step(batch)
        for key, value in found.items():
            value = value.detach() if torch.is_tensor(value) else torch.as_tensor(value)
            parts.setdefault(key, []).append(value.reshape(-1))
    # one host read per column and evaluation, in float64 so that sums of many items stay exact
    columns = {
        key: (torch.cat(p).cpu().double().numpy() if p else np.zeros(0)) for key, p in parts.items()
    }
    joined = _join_over_ranks(columns)
    dropped = task.eval_dropped()
    return from_columns(joined, task.formulas, task.item_unit, dropped, key=task.item_key)


def _join_over_ranks(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each column of every rank, joined in rank order (one process: the columns as they are)."""
    if distributed.world_size() == 1:
        return columns
    gathered = distributed.all_gather_object(columns)
    keys = sorted({k for part in gathered for k in part})
    return {k: np.concatenate([part.get(k, np.zeros(0)) for part in gathered]) for k in keys}


@torch.no_grad()
def predict(task: Any, model: nn.Module, *inputs: Any) -> Any:
    """`model(*inputs)` as evaluation runs it: eval mode, no_grad, autocast."""
    model.eval()
    with task.policy.autocast():
        return model(*inputs)


def _over_ranks(totals: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Numbers summed over the ranks (host reads: once per evaluation); lists joined in rank
    order."""
    numbers = {k: float(v) for k, v in totals.items() if not isinstance(v, list)}
    summed = distributed.reduce_sums(numbers, device) if numbers else {}
    joined = {
        k: [x for part in distributed.all_gather_object(v) for x in part]
        for k, v in totals.items()
        if isinstance(v, list)
    }
    return {**summed, **joined}


@torch.no_grad()
def recalibrate_bn(
    model: nn.Module,
    inputs: Iterable[Any],
    autocast: Callable[[], Any] = contextlib.nullcontext,
) -> int:
    """Reset every BatchNorm's running statistics and re-estimate them as the plain average over
    ``inputs`` (momentum None), with the current weights, each forward under ``autocast``;
    returns how many inputs were used. Each module keeps its own momentum after. A model
    without BatchNorm is left alone."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return 0
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the recalibration batches
    was_training = model.training
    model.train()
    used = 0
    try:
        for x in inputs:
            with autocast():
                model(x)
            used += 1
    finally:
        for m, momentum in zip(bns, momenta):
            m.momentum = momentum
        model.train(was_training)
    return used
