"""Faults injected through the real `mpt-run`: a custom model's factory runs in the run's own
process (`model=custom model.target=helpers_faults:<name>`, tests/ on PYTHONPATH), so it can break
what the run reads next, as a buggy sampler or a stuck data source would."""

from __future__ import annotations

import time

from helpers_custom_model import tiny_classifier
from torch import nn


def _patch_train_batches(make):
    from mpt_repro.tasks.base import SampledTask as ClassificationTask

    original = ClassificationTask.train_batches

    def train_batches(self, epoch, skip=0):
        return make(original(self, epoch, skip), self, epoch, skip)

    ClassificationTask.train_batches = train_batches


def short_epoch(num_classes: int, in_channels: int = 1) -> nn.Module:
    """Every epoch yields one batch fewer than steps_per_epoch (an off-by-one in a sampler)."""

    def make(batches, task, epoch, skip):
        n = task.steps_per_epoch() - skip - 1
        for i, b in enumerate(batches):
            if i >= n:
                return
            yield b

    _patch_train_batches(make)
    return tiny_classifier(num_classes, in_channels)


def stuck_loader(num_classes: int, in_channels: int = 1) -> nn.Module:
    """The second batch of every epoch never comes (a data source that hangs)."""

    def make(batches, task, epoch, skip):
        for i, b in enumerate(batches):
            if i >= 1:
                print("stuck in the loader", flush=True)
                time.sleep(3600)
            yield b

    _patch_train_batches(make)
    return tiny_classifier(num_classes, in_channels)


class _NoParameters(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :10]


def no_parameters(num_classes: int, in_channels: int = 1) -> nn.Module:
    return _NoParameters()


class _SlowEval(nn.Module):
    """The first evaluation's first batch waits for an hour (unless the marker file exists)."""

    def __init__(self, inner: nn.Module, marker: str):
        super().__init__()
        self.inner, self.marker = inner, marker

    def forward(self, x):
        import os

        if not self.training and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            print("evaluating slowly", flush=True)
            time.sleep(3600)
        return self.inner(x)


def slow_eval(num_classes: int, in_channels: int = 1, marker: str = "/nonexistent") -> nn.Module:
    return _SlowEval(tiny_classifier(num_classes, in_channels), marker)
