"""The precision step never reads the device on a clean or a skipped step (issue: sync-free
step), and what that design had to get right: fused SGD skipping its first step, unscaling with
scales below 1."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mpt_repro.bench.measure import SyncCounter
from mpt_repro.optim import optimizer_factory
from mpt_repro.precision import PrecisionConfig, PrecisionPolicy
from mpt_repro.precision.config import Dtype, LossScaling, WeightStorage


def mixed(**knobs) -> PrecisionConfig:
    base = dict(
        name="mixed",
        compute_dtype=Dtype.float16,
        weights=WeightStorage.low_precision,
        master_weights=True,
        loss_scaling=LossScaling.dynamic,
        init_scale=2.0**10,
    )
    return PrecisionConfig(**{**base, **knobs})


def optim_cfg(name="sgd", fused="auto"):
    from mpt_repro.config import OptimConfig

    return OptimConfig(name=name, lr=0.1, momentum=0.9, fused=fused)


def net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4)
    )


def train_step(pol, model, opt, x, y):
    opt.zero_grad()
    with pol.autocast():
        loss = nn.functional.cross_entropy(model(pol.cast_inputs(x)), y)
    opt.backward(loss)
    return opt.step(clip_grad_norm=1.0)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_mixed_step_reads_nothing_from_the_device_clean_or_skipped(optimizer):
    pol = PrecisionPolicy(mixed(), "cpu")
    model = net()
    model(torch.randn(2, 3, 6, 6))  # materialise the lazy layer
    model = pol.prepare_model(model)
    opt = pol.build_optimizer(model, optimizer_factory(optim_cfg(optimizer)))
    assert opt.fused and opt.sync_free
    x, y = torch.randn(4, 3, 6, 6), torch.tensor([0, 1, 2, 3])
    with SyncCounter() as reads:
        clean = train_step(pol, model, opt, x, y)
        skipped = train_step(pol, model, opt, x * float("inf"), y)
    assert reads.reads == 0
    assert bool(clean) and not bool(skipped)  # (reading them here, after the count)
    assert opt.skipped == 1 and opt.loss_scale == 2.0**9


def test_without_a_fused_kernel_the_step_reads_the_flag_once():
    pol = PrecisionPolicy(mixed(), "cpu")
    model = pol.prepare_model(nn.Linear(4, 2))
    opt = pol.build_optimizer(model, optimizer_factory(optim_cfg("sgd", fused="false")))
    assert not opt.sync_free
    with SyncCounter() as reads:
        opt.zero_grad()
        opt.backward(model(pol.cast_inputs(torch.randn(3, 4))).float().sum())
        opt.step()
    assert reads.reads == 1


def test_fused_sgd_skipping_its_first_step_leaves_no_garbage_momentum():
    """torch's fused SGD allocates momentum buffers uninitialised on its first step and keeps
    them when found_inf skips it; ours start at zero, so the next update is the foreach one."""
    runs = {}
    for fused in ("true", "false"):
        pol = PrecisionPolicy(mixed(init_scale=2.0**20), "cpu")
        torch.manual_seed(0)
        model = pol.prepare_model(nn.Linear(16, 4))
        opt = pol.build_optimizer(model, optimizer_factory(optim_cfg("sgd", fused=fused)))
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        assert not bool(train_step(pol, model, opt, x * 1e4, y))  # overflows at 2^20: skipped
        for _ in range(3):
            train_step(pol, model, opt, x, y)
        runs[fused] = [p.detach().clone() for p in opt.params]
    for a, b in zip(runs["true"], runs["false"]):
        assert torch.equal(a, b)


def test_unscaling_fp16_grads_with_a_scale_below_one_never_writes_inf_into_weights():
    # no master copy: the optimizer updates FP16 weights with FP16 grads. A scale of 1/4 makes
    # the unscale multiply (x4) overflow a gradient of 60000 (finite in FP16) after the
    # kernel's finite check.
    cfg = mixed(
        name="no_master",
        master_weights=False,
        loss_scaling=LossScaling.static,
        static_scale=0.25,
        init_scale=0.25,
        min_scale=0.25,
    )
    pol = PrecisionPolicy(cfg, "cpu")
    model = pol.prepare_model(nn.Linear(1, 1, bias=False))
    before = copy.deepcopy(model.weight.detach())
    opt = pol.build_optimizer(model, optimizer_factory(optim_cfg("sgd")))
    opt.zero_grad()
    x = torch.tensor([[30000.0]])
    opt.backward(model(pol.cast_inputs(x)).float().sum() * 8)  # grad = 30000 * 8 * 0.25
    assert model.weight.grad.dtype == torch.float16
    assert not bool(opt.step())  # found after the multiply: skipped
    assert torch.equal(model.weight.detach(), before)
    assert opt.nonfinite()["last_nonfinite_kind"] == "inf"
