"""Optimizer and LR schedule from cfg.optim: the same recipe under every precision preset."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch


def optimizer_factory(
    o: Any, world_batch: int | None = None
) -> Callable[[Iterable], torch.optim.Optimizer]:
    """A function [(name, param), ...] -> optimizer, so the precision policy can hand it FP32
    master copies under the model's parameter names."""
    lr = scaled_lr(o, world_batch)

    def make(named_params: Iterable[tuple[str, torch.Tensor]]) -> torch.optim.Optimizer:
        params = [p for _, p in named_params]
        # fused kernels take the overflow flag on the device: the step needs no host sync
        fused = {"fused": True} if use_fused(o, params) else {"foreach": True}
        if o.name == "sgd":
            return torch.optim.SGD(
                params,
                lr=lr,
                momentum=o.momentum,
                nesterov=o.nesterov,
                weight_decay=o.weight_decay,
                **fused,
            )
        if o.name == "adam":
            return torch.optim.Adam(
                params, lr=lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, **fused
            )
        if o.name == "adamw":
            return torch.optim.AdamW(
                params, lr=lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, **fused
            )
        if o.name == "adagrad":
            return torch.optim.Adagrad(
                params,
                lr=lr,
                eps=o.eps,
                weight_decay=o.weight_decay,
                initial_accumulator_value=o.initial_accumulator_value,
            )
        if o.name == "rmsprop":
            return torch.optim.RMSprop(
                params, lr=lr, momentum=o.momentum, eps=o.eps, weight_decay=o.weight_decay
            )
        raise ValueError(f"unknown optimizer {o.name}")  # validate() refuses it first

    make.takes_named_params = True
    return make


FUSED = ("sgd", "adam", "adamw")  # torch optimizers with a fused kernel that can skip a step


def use_fused(o: Any, params: list[torch.Tensor]) -> bool:
    """optim.fused: true, false, or auto (fused where torch has the kernel for these params)."""
    choice = str(getattr(o, "fused", "auto")).lower()
    if choice == "false" or o.name not in FUSED or not params:
        return False
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    supported = all(
        p.device.type in _get_fused_kernels_supported_devices() and p.is_floating_point()
        for p in params
    )
    if choice == "true" and not supported:
        raise ValueError(f"optim.fused=true: no fused {o.name} kernel for these parameters")
    return supported


def scaled_lr(o: Any, global_batch: int | None) -> float:
    """The linear scaling rule (Goyal et al. 2017) if lr_scaling=linear: lr * batch / base."""
    if o.lr_scaling == "linear" and global_batch:
        return o.lr * global_batch / o.base_batch_size
    return o.lr


def lr_multiplier(o: Any, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    """The LR factor at iteration i (schedules in epochs, applied per iteration, with a linear
    warm-up)."""
    warmup = o.warmup_epochs * steps_per_epoch

    def factor(i: int) -> float:
        if warmup and i < warmup:
            return (i + 1) / warmup
        epoch = i / steps_per_epoch
        if o.schedule == "constant":
            return 1.0
        if o.schedule == "step":
            return o.gamma ** math.floor(epoch / o.step_size)
        if o.schedule == "multistep":
            return o.gamma ** sum(epoch >= m for m in o.milestones)
        if o.schedule == "exponential":
            return o.gamma**epoch
        progress = min(1.0, (i - warmup) / max(1, total_steps - warmup))
        if o.schedule == "poly":
            return (1.0 - progress) ** o.power
        if o.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        raise ValueError(f"unknown schedule {o.schedule}")

    return factor


def build_scheduler(
    optimizer: torch.optim.Optimizer, o: Any, steps_per_epoch: int, total_steps: int
):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_multiplier(o, steps_per_epoch, total_steps)
    )
