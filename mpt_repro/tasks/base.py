"""What a task is: everything that differs between experiments (models, batches, loss, metrics).

The one training loop (mpt_repro/trainer.py) drives any Task; precision enters only through the
PrecisionPolicy that the task uses for its forward and its optimizer steps.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mpt_repro import distributed
from mpt_repro.identity import is_custom_model

TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type], type]:
    def add(cls: type) -> type:
        TASKS[name] = cls
        cls.name = name
        return cls

    return add


@dataclass
class StepResult:
    loss: torch.Tensor  # the (unscaled) training loss of this iteration, detached
    stepped: torch.Tensor  # 0-d bool on the device: False when the update was skipped (overflow)
    samples: int  # examples processed (for samples/s)
    logs: dict[str, torch.Tensor] = field(default_factory=dict)  # extra scalars (e.g. GAN losses)
    # with several optimizers: which of them stepped (keys as in Task.optimizers); each LR schedule
    # is held only when its own optimizer skipped
    stepped_by: dict[str, torch.Tensor] = field(default_factory=dict)


class Task:
    name: str = ""
    primary_metric: str = "loss"  # the metric tables and sweeps compare
    higher_is_better: bool = False
    metric_names: list[str] = ["loss"]  # what evaluate() returns
    # what the last evaluate() found besides its scalar metrics (e.g. per-class AP), for run.json
    metrics_detail: dict | None = None

    models: dict[str, nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        self.cfg, self.device, self.policy = cfg, device, policy

    def steps_per_epoch(self) -> int:
        raise NotImplementedError

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        """Batches of one epoch, in an order fixed by (seed, epoch); the first `skip` left out
        (resume).
        """
        raise NotImplementedError

    def train_step(self, batch: Any) -> StepResult:
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    # Optional parts -------------------------------------------------------------------------
    def recalibrate_bn(self, batches: int) -> None:
        """Re-estimate BatchNorm running statistics on `batches` training batches (tasks with
        BN override it; trainer.recalibrate_bn)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def log_media(self, writer: Any, step: int) -> None:
        """Write images or other media to TensorBoard at evaluation time."""

    def describe_data(self) -> dict:
        return {"name": self.cfg.data.name, "root": self.cfg.data.root}

    def describe_model(self) -> dict:
        params = sum(p.numel() for m in self.models.values() for p in m.parameters())
        described = {
            "name": self.cfg.model.name,  # a custom model's own name (model.name)
            "variant": self.cfg.model.get("variant") or None,  # only models that have several
            "parameters": params,
        }
        if is_custom_model(self.cfg.model):
            described["target"] = self.cfg.model.target
        return described


def chunked(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    """Groups of ``n`` consecutive items (an iteration's micro-batches); a short tail is dropped,
    as a loader drops its last partial batch."""
    it = iter(items)
    while len(group := list(itertools.islice(it, n))) == n:
        yield group


def micro_batches(items: list[Any], ddp_model: nn.Module) -> Iterator[Any]:
    """Each micro-batch of an iteration; the caller's forward and backward of every one but the
    last run inside DDP's no_sync, so gradients are all-reduced once per optimizer step. Scale
    each micro-batch's loss by 1/len(items): the sum is the mean over the whole batch."""
    for i, item in enumerate(items):
        last = i == len(items) - 1
        with contextlib.nullcontext() if last else distributed.no_sync(ddp_model):
            yield item


@torch.no_grad()
def recalibrate_bn(model: nn.Module, inputs: Iterable[Any]) -> int:
    """Reset every BatchNorm's running statistics and re-estimate them as the plain average over
    ``inputs`` (momentum None), with the current weights; returns how many inputs were used.
    Each module keeps its own momentum after. A model without BatchNorm is left alone."""
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
            model(x)
            used += 1
    finally:
        for m, momentum in zip(bns, momenta):
            m.momentum = momentum
        model.train(was_training)
    return used


class SampledTask(Task):
    """A task that trains on a loader ordered by an EpochSampler (`self.sampler`,
    `self.train_loader`), `self.accumulate` micro-batches per iteration: the image tasks."""

    sampler: Any
    train_loader: Any

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        self.accumulate = cfg.trainer.accumulate

    def steps_per_epoch(self) -> int:
        return self.sampler.batches_per_epoch() // self.accumulate

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[list[Any]]:
        """Each iteration's micro-batches (trainer.accumulate of them), in the (seed, epoch)
        order; a resumed run skips the iterations it has done."""
        self.sampler.set_epoch(epoch, skip_batches=skip * self.accumulate)
        return chunked(self.train_loader, self.accumulate)
