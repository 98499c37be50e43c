"""Optimizer and LR schedule from cfg.optim: the same recipe under every precision preset.

The optimizer factory builds parameter groups from the parameters' names and shapes, so a
recipe's per-group rules (Caffe's bias lr_mult 2 / decay_mult 0, no weight decay on batch norm)
are config, not code:

    make = optimizer_factory(cfg.optim, world_batch)
    opt = make(model.named_parameters())            # or FP32 master copies under the same names
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

NamedParams = Iterable[tuple[str, Tensor]]

KINDS = ("weight", "bias", "norm")


def param_kinds(named: NamedParams) -> dict[str, str]:
    """Each parameter's kind, from names and shapes only (FP32 master copies carry the model's
    names, so the rule sees what the model sees):

    - "weight": a tensor of 2 or more dimensions (convolution, linear, embedding, LSTM matrices);
    - "bias": a 1-d tensor whose name's last part starts with "bias" (`bias`, and nn.LSTM's
      `bias_ih_l0` / `bias_hh_l0`) in a module that also holds a weight of 2 or more dimensions;
    - "norm": every other 1-d or 0-d tensor: the scale and shift of batch, layer and group norm
      (their `weight` is 1-d, so their `bias` is no layer bias), PReLU slopes, learned scalars.

    A module is the name up to its last dot; "norm" therefore needs no list of layer types, and a
    bias of a layer whose weight is frozen (not passed in) counts as "norm": pass every parameter
    of a module together.
    """
    named = list(named)
    with_matrix = {name.rpartition(".")[0] for name, p in named if p.dim() >= 2}
    kinds = {}
    for name, p in named:
        module, _, leaf = name.rpartition(".")
        if p.dim() >= 2:
            kinds[name] = "weight"
        elif leaf.startswith("bias") and module in with_matrix:
            kinds[name] = "bias"
        else:
            kinds[name] = "norm"
    return kinds


def param_groups(o: Any, named: NamedParams, lr: float) -> list[dict]:
    """torch parameter groups: one per (lr multiplier, weight-decay multiplier) pair in use, the
    unmultiplied group first (group 0's LR is the one the trainer logs), the others in the order
    their parameters come; each group lists its parameters' names under "names" (kept in the
    optimizer's state_dict). Not torch's own "param_names": torch then refuses groups added
    later without names (add_param_group), which callers may add."""
    named = list(named)
    kinds = param_kinds(named)
    mults = {
        "weight": (1.0, 1.0),
        "bias": (o.bias_lr_mult, o.bias_decay_mult),
        "norm": (o.norm_lr_mult, o.norm_decay_mult),
    }
    groups: dict[tuple[float, float], dict] = {}
    for name, p in named:
        lr_mult, decay_mult = mults[kinds[name]]
        group = groups.setdefault(
            (lr_mult, decay_mult),
            {
                "params": [],
                "names": [],
                "lr": lr * lr_mult,
                "weight_decay": o.weight_decay * decay_mult,
            },
        )
        group["params"].append(p)
        group["names"].append(name)
    order = sorted(groups, key=lambda mults: mults != (1.0, 1.0))  # stable: first come first
    return [groups[mults] for mults in order]


def names_matching(pattern: str | None, names: Iterable[str]) -> list[str]:
    """The names a scope regex selects (re.search), e.g. optim.grad_clip_params / ema_params;
    None selects every name."""
    if pattern is None:
        return list(names)
    rx = re.compile(pattern)
    return [n for n in names if rx.search(n)]


def optimizer_factory(
    o: Any, world_batch: int | None = None
) -> Callable[..., torch.optim.Optimizer]:
    """A function named_params -> optimizer, so the precision policy can hand it FP32 master
    copies under the model's parameter names (`make.takes_named_params` tells it to).

    make(named_params, *, fused=None): named_params are (name, parameter) pairs (the model's
    names); the groups follow optim.{bias,norm}_{lr,decay}_mult. fused: None follows
    optim.fused (auto: wherever the optimizer can skip an overflowing step on the device);
    True/False force it. Fused means torch's fused kernels for SGD, Adam and AdamW, and the
    device-side skip of RMSpropTF; the others (Adagrad, RMSprop) take the foreach path.
    Bare parameters (no names) are accepted while every multiplier is 1: there are no groups to
    form then.
    """
    lr = scaled_lr(o, world_batch)

    def make(named_params: Iterable, *, fused: bool | None = None) -> torch.optim.Optimizer:
        items = list(named_params)
        if items and isinstance(items[0], Tensor):
            if any(getattr(o, k) != 1 for k in MULTIPLIERS):
                raise ValueError(
                    "per-group optimizer rules (optim.*_mult) need parameter names: pass "
                    "model.named_parameters() (or (name, master) pairs), not bare parameters"
                )
            items = [(f"param{i}", p) for i, p in enumerate(items)]
        groups = param_groups(o, items, lr)
        params = [p for _, p in items]
        if fused is None:
            fused = use_fused(o, params)
        if o.name not in BUILDERS:
            raise ValueError(f"unknown optimizer {o.name}")  # validate() refuses it first
        return BUILDERS[o.name](o, groups, lr, fused)

    make.takes_named_params = True
    return make


def _sgd(o: Any, groups: list, lr: float, fused: bool) -> torch.optim.Optimizer:
    # fused kernels take the overflow flag on the device: the step needs no host sync
    return torch.optim.SGD(
        groups, lr=lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay,
        **_fast(fused),
    )  # fmt: skip


def _adam(o: Any, groups: list, lr: float, fused: bool) -> torch.optim.Optimizer:
    cls = torch.optim.Adam if o.name == "adam" else torch.optim.AdamW
    return cls(
        groups, lr=lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay,
        **_fast(fused),
    )  # fmt: skip


def _adagrad(o: Any, groups: list, lr: float, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.Adagrad(
        groups, lr=lr, eps=o.eps, weight_decay=o.weight_decay,
        initial_accumulator_value=o.initial_accumulator_value, foreach=True,
    )  # fmt: skip


def _rmsprop(o: Any, groups: list, lr: float, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.RMSprop(
        groups, lr=lr, alpha=o.alpha, momentum=o.momentum, eps=o.eps,
        weight_decay=o.weight_decay, foreach=True,
    )  # fmt: skip


def _rmsprop_tf(o: Any, groups: list, lr: float, fused: bool) -> torch.optim.Optimizer:
    return RMSpropTF(
        groups, lr=lr, decay=o.alpha, momentum=o.momentum, eps=o.eps,
        weight_decay=o.weight_decay, fused=fused,
    )  # fmt: skip


def _fast(fused: bool) -> dict[str, bool]:
    return {"fused": True} if fused else {"foreach": True}


# optim.name -> the torch optimizer it builds (Adagrad and RMSprop have no fused kernel: foreach)
BUILDERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "adam": _adam,
    "adamw": _adam,
    "adagrad": _adagrad,
    "rmsprop": _rmsprop,
    "rmsprop_tf": _rmsprop_tf,
}
MULTIPLIERS = ("bias_lr_mult", "bias_decay_mult", "norm_lr_mult", "norm_decay_mult")
FUSED = ("sgd", "adam", "adamw")  # torch optimizers with a fused kernel that can skip a step
SKIPS_ON_DEVICE = ("rmsprop_tf",)  # ours: reads found_inf on the device, any device


def use_fused(o: Any, params: list[torch.Tensor]) -> bool:
    """optim.fused: true, false, or auto (fused where torch has the kernel for these params;
    RMSpropTF's device-side skip works everywhere)."""
    choice = str(getattr(o, "fused", "auto")).lower()
    if choice == "false" or not params:
        return False
    if o.name in SKIPS_ON_DEVICE:
        return True
    if o.name not in FUSED:
        return False
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    supported = all(
        p.device.type in _get_fused_kernels_supported_devices() and p.is_floating_point()
        for p in params
    )
    if choice == "true" and not supported:
        raise ValueError(f"optim.fused=true: no fused {o.name} kernel for these parameters")
    return supported


class RMSpropTF(torch.optim.Optimizer):
    """RMSProp as TensorFlow 1's tf.train.RMSPropOptimizer computes it (the optimizer of
    Inception v3's recipe: decay 0.9, momentum 0.9, epsilon 1.0), per parameter:

        g   = grad + weight_decay * p               (TF-slim's L2 regulariser, in the gradient)
        ms  = decay * ms + (1 - decay) * g^2        ms starts at 1 (TF's "rms" slot: ones)
        mom = momentum * mom + lr * g / sqrt(ms + eps)
        p  -= mom

    torch.optim.RMSprop differs in three places: it adds eps outside the square root
    (g / (sqrt(v) + eps)), starts the mean square at 0, and applies lr after the momentum
    buffer (p -= lr * buf), which differs from TF's whenever the LR changes. With eps = 1.0 the
    first matters: sqrt(ms + 1) vs sqrt(ms) + 1.

    fused=True: like torch's fused optimizers under torch.amp.GradScaler's protocol, a step reads
    `self.found_inf` (a device tensor, set by the caller for the step) and leaves parameters and
    state unchanged when it is non-zero, without a host sync; `self.grad_scale`, if set, divides
    the gradients first. The LR may be a 0-d device tensor (the LR schedule's under
    precision.hold_lr_on_skip): it is applied on the device, never read on the host.
    """

    _step_supports_amp_scaling = True

    def __init__(
        self,
        params: Iterable,
        lr: float,
        decay: float = 0.9,
        momentum: float = 0.0,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        fused: bool = False,
    ):
        if lr < 0 or not 0 <= decay < 1 or momentum < 0 or eps <= 0 or weight_decay < 0:
            raise ValueError(
                f"invalid RMSpropTF settings: lr={lr}, decay={decay}, momentum={momentum}, "
                f"eps={eps}, weight_decay={weight_decay}"
            )
        defaults = {
            "lr": lr,
            "decay": decay,
            "momentum": momentum,
            "eps": eps,
            "weight_decay": weight_decay,
            "fused": fused,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            lr, decay, momentum = group["lr"], group["decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if grad_scale is None else p.grad / grad_scale
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["ms"] = torch.ones_like(p, memory_format=torch.preserve_format)
                    state["mom"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                ms, mom = state["ms"], state["mom"]
                if found_inf is None:
                    ms.mul_(decay).addcmul_(g, g, value=1.0 - decay)
                    mom.mul_(momentum).add_(g / (ms + group["eps"]).sqrt_(), alpha=lr)
                    p.sub_(mom)
                    continue
                # Skip on the device: a zero gradient and unit factors leave ms, mom and p as
                # they are (the gradient is zeroed first: inf * 0 would be NaN). When the step is
                # kept, these are the plain path's operations on the same values: same rounding.
                keep = (found_inf == 0).reshape(()).to(p.device)
                one = torch.ones((), dtype=p.dtype, device=p.device)
                g = torch.where(keep, g, torch.zeros_like(one))
                ms.mul_(torch.where(keep, one * decay, one)).addcmul_(g, g, value=1.0 - decay)
                mom.mul_(torch.where(keep, one * momentum, one))
                add_scaled_(mom, g / (ms + group["eps"]).sqrt(), lr)
                p.sub_(mom * keep)
        return loss


def add_scaled_(acc: Tensor, x: Tensor, factor: float | Tensor) -> Tensor:
    """acc += factor * x for a number or a 0-d device tensor `factor` (the LR schedule's LR under
    precision.hold_lr_on_skip). add_'s alpha= takes a number: a tensor there is read on the
    host, one sync per call; addcmul_ takes it on the device and rounds acc + factor * x once,
    as add_(alpha=) does (bit for bit in FP32 on the CPU; FP16 state, without a master copy,
    differs in the last place for about 1 element in 100,000)."""
    if torch.is_tensor(factor):
        return acc.addcmul_(x, factor)
    return acc.add_(x, alpha=factor)


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
