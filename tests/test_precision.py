"""The precision engine, numerically: exact values where FP16 arithmetic allows it.

The tiny models here make every gradient a hand-computable number, so each test states the
value the paper's argument predicts (underflow below 2^-24, lost updates below half an ulp,
skipped overflowing steps) and checks it exactly.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from mpt_repro.errors import ConfigError, Diverged
from mpt_repro.precision import PrecisionConfig, PrecisionPolicy
from mpt_repro.precision.config import Dtype, LossScaling, WeightStorage

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest)


F16, F32 = Dtype.float16, Dtype.float32
LOW, AUTO = WeightStorage.low_precision, WeightStorage.fp32_autocast

# the knobs of conf/precision/*.yaml (tests/test_precision_presets.py checks they agree)
PRESETS = {
    "fp32": dict(
        compute_dtype=F32, weights=AUTO, master_weights=False, loss_scaling=LossScaling.none
    ),
    "amp": dict(
        compute_dtype=F16, weights=AUTO, master_weights=False, loss_scaling=LossScaling.dynamic
    ),
    "mixed": dict(
        compute_dtype=F16, weights=LOW, master_weights=True, loss_scaling=LossScaling.paper
    ),
    "no_master": dict(
        compute_dtype=F16, weights=LOW, master_weights=False, loss_scaling=LossScaling.paper
    ),
    "no_scaling": dict(
        compute_dtype=F16, weights=LOW, master_weights=True, loss_scaling=LossScaling.none
    ),
    "fp16": dict(
        compute_dtype=F16, weights=LOW, master_weights=False, loss_scaling=LossScaling.none
    ),
    "bf16": dict(
        compute_dtype=Dtype.bfloat16,
        weights=AUTO,
        master_weights=False,
        loss_scaling=LossScaling.none,
    ),
}


def policy(preset: str = "mixed", paper_loss_scale=None, **knobs) -> PrecisionPolicy:
    return PrecisionPolicy(
        PrecisionConfig(name=preset, **{**PRESETS[preset], **knobs}), "cpu", paper_loss_scale
    )


class Two(nn.Module):
    """loss = a*x0 + b*x1: dloss/da = x0 and dloss/db = x1, exactly."""

    def __init__(self, a: float = 1.0, b: float = 1.0):
        super().__init__()
        self.a = nn.Parameter(torch.tensor([a]))
        self.b = nn.Parameter(torch.tensor([b]))

    def forward(self, x):
        return (self.a * x[0] + self.b * x[1]).sum()


class Chain(nn.Module):
    """loss = (a*x0)*x1: the gradient reaching a is x1*x0, through an FP16 activation gradient."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return ((self.a * x[0]) * x[1]).sum()


def setup(pol: PrecisionPolicy, lr: float = 1.0, model=None, momentum: float = 0.0):
    model = pol.prepare_model(model if model is not None else Two())
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=lr, momentum=momentum))
    return model, opt


def step(pol, model, opt, x0: float, x1: float = 0.0, clip=None) -> bool:
    opt.zero_grad()
    with pol.autocast():
        loss = model(pol.cast_inputs(torch.tensor([x0, x1])))
    opt.backward(loss)
    return bool(opt.step(clip_grad_norm=clip))


def master_of(opt, i: int = 0) -> torch.Tensor:
    return opt.param_groups[0]["params"][i]


# -- §3.2: loss scaling rescues small gradients ------------------------------------------------
def test_gradient_2_pow_minus_26_is_lost_without_scaling_and_kept_with_2_pow_10():
    g = 2.0**-26
    assert torch.tensor(g).half().item() == 0.0  # below FP16's smallest subnormal (2^-24)

    x0 = x1 = 2.0**-13  # both normal FP16 numbers; their product, the gradient of a, is 2^-26
    pol = policy("no_scaling")
    model, opt = setup(pol, lr=0.0, model=Chain())
    step(pol, model, opt, x0, x1)
    assert master_of(opt).grad.item() == 0.0  # flushed to zero in the FP16 backward

    pol = policy("mixed", paper_loss_scale=2.0**10)
    model, opt = setup(pol, lr=0.0, model=Chain())
    assert step(pol, model, opt, x0, x1)
    # scaled: 2^-16 in FP16 (representable), copied to the FP32 master grad, unscaled there: 2^-26
    assert master_of(opt).grad.dtype == torch.float32
    assert master_of(opt).grad.item() == g


def test_fp16_grads_without_master_are_unscaled_by_our_scaler():
    # GradScaler refuses FP16 grads; ours unscales them in place (FP32 math, one rounding)
    pol = policy("no_master", paper_loss_scale=2.0**10)
    model, opt = setup(pol, lr=0.0)
    assert step(pol, model, opt, 2.0**-4, 3.0)
    assert model.a.grad.dtype == torch.float16
    assert model.a.grad.item() == 2.0**-4 and model.b.grad.item() == 3.0


# -- §3.1: the master copy keeps updates smaller than half an FP16 ulp --------------------------
def test_small_updates_vanish_without_master_and_accumulate_with_it():
    lr, n = 2.0**-12, 10  # update 2^-12 < half the ulp of 1.0 in FP16 (2^-11)
    pol = policy("no_master", paper_loss_scale=1.0)
    model, opt = setup(pol, lr=lr)
    for _ in range(n):
        assert step(pol, model, opt, 1.0)
        assert model.a.item() == 1.0  # 1 - 2^-12 rounds back to 1 every time

    pol = policy("mixed", paper_loss_scale=1.0)
    model, opt = setup(pol, lr=lr)
    for _ in range(n):
        step(pol, model, opt, 1.0)
    assert master_of(opt).item() == 1.0 - n * lr  # exact in FP32
    assert model.a.dtype == torch.float16
    assert model.a.item() == torch.tensor(1.0 - n * lr).half().item() != 1.0


# -- skipping, backoff, growth, hysteresis, floor ------------------------------------------------
def test_overflow_skips_step_keeps_weights_and_halves_scale():
    pol = policy("mixed", init_scale=2.0**4)
    model, opt = setup(pol, lr=0.5)
    before_model = [p.detach().clone() for p in model.parameters()]
    before_master = [p.detach().clone() for p in opt.param_groups[0]["params"]]
    assert step(pol, model, opt, 1.0, 60000.0) is False  # 60000 * 16 overflows FP16
    assert pol.hold_lr_on_skip is True  # the trainer does not advance the LR schedule
    assert all(torch.equal(a, b) for a, b in zip(before_model, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before_master, opt.param_groups[0]["params"]))
    assert opt.loss_scale == 2.0**3
    s = pol.summary()
    assert s["skipped_steps"] == 1 and s["steps"] == 1
    assert s["diagnostics"]["first_nonfinite_layer"] == "b"  # a's gradient was finite
    assert step(pol, model, opt, 1.0, 1.0) is True  # the next clean step updates normally
    assert model.a.item() == 0.5
    assert policy("mixed", hold_lr_on_skip=False).hold_lr_on_skip is False


def test_growth_after_growth_interval_clean_steps_capped_at_max():
    pol = policy("mixed", init_scale=4.0, growth_interval=3, max_scale=16.0)
    model, opt = setup(pol, lr=0.0)
    scales = []
    for _ in range(9):
        step(pol, model, opt, 1.0)
        scales.append(pol.loss_scale())
    assert scales == [4, 4, 8, 8, 8, 16, 16, 16, 16]
    assert pol.summary()["loss_scale"] == {
        "initial": 4.0,
        "final": 16.0,
        "min": 4.0,
        "max": 16.0,
        "kind": "dynamic",
    }


def test_hysteresis_tolerates_overflows_before_backing_off():
    pol = policy("mixed", init_scale=64.0, hysteresis=2, growth_interval=2)
    model, opt = setup(pol, lr=0.0)
    trace = []
    for x1 in [60000, 60000, 60000, 1, 1, 60000, 1]:
        stepped = step(pol, model, opt, 1.0, float(x1))
        trace.append((stepped, pol.loss_scale()))
    assert trace == [
        (False, 64),  # 1st overflow tolerated (hysteresis 2 -> 1): skipped, scale kept
        (False, 32),  # 2nd: back off
        (False, 16),  # tolerance not refilled by backing off
        (True, 16),
        (True, 32),  # growth refills the tolerance (DeepSpeed default)
        (False, 32),  # tolerated again
        (True, 32),
    ]


def test_scale_stuck_at_floor_raises_diverged_naming_the_layer():
    pol = policy("mixed", init_scale=8.0, min_scale=2.0, floor_patience=3)
    model, opt = setup(pol, lr=0.1)
    outcome = []
    for _ in range(5):
        pol.check_divergence()  # what the trainer asks at each log row: nothing yet
        outcome.append((step(pol, model, opt, 1.0, 60000.0), pol.loss_scale()))
    with pytest.raises(Diverged) as exc:
        pol.check_divergence()
    # 8 -> 4 -> 2 (floor), then three skipped steps at the floor: diverged at the 5th attempt
    assert outcome[:4] == [(False, 4.0), (False, 2.0), (False, 2.0), (False, 2.0)]
    assert exc.value.step == 5 and exc.value.layer == "b"
    assert "'b'" in exc.value.reason and "floor" in exc.value.reason
    assert pol.summary()["diagnostics"]["last_nonfinite_kind"] == "inf"


def test_static_scale_stays_constant_and_skips_overflow():
    pol = policy("mixed", paper_loss_scale=128.0)
    model, opt = setup(pol, lr=0.0)
    for x1 in [1, 60000, 1, 1, 60000, 1]:
        step(pol, model, opt, 1.0, float(x1))
        assert pol.loss_scale() == 128.0
    assert pol.summary()["skipped_steps"] == 2
    assert "static loss scale 128 (the experiment's paper scale)" in pol.describe()


def test_dynamic_trajectory_matches_torch_gradscaler():
    """Same overflow script, same scale after every step as torch.amp.GradScaler('cpu')."""
    knobs = dict(init_scale=2.0**10, growth_interval=3, min_scale=2.0**-10)
    pol = policy("amp", **knobs)
    model, opt = setup(pol, lr=0.01)
    ref = Two()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    gs = torch.amp.GradScaler(
        "cpu", init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3
    )
    script = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    for overflow in script:
        x = torch.tensor([1.0, float("inf") if overflow else 0.5])
        ours = step(pol, model, opt, *x.tolist())
        ref_opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = ref(x)
        gs.scale(loss).backward()
        gs.step(ref_opt)
        gs.update()
        assert ours == (not overflow)
        assert pol.loss_scale() == gs.get_scale()
        assert torch.equal(model.a, ref.a) and torch.equal(model.b, ref.b)


# -- BN in FP32 inside an FP16 model -------------------------------------------------------------
def small_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )


@pytest.mark.parametrize("preset", ["mixed", "no_master", "fp16"])
def test_bn_params_and_running_stats_stay_fp32_in_fp16_model(preset):
    torch.manual_seed(0)
    pol = policy(preset, paper_loss_scale=8.0) if "scaling" not in preset else policy(preset)
    model = pol.prepare_model(small_cnn())
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.1))
    x, y = torch.randn(8, 1, 5, 5), torch.randint(0, 3, (8,))
    bn = model[1]
    for _ in range(3):
        opt.zero_grad()
        with pol.autocast():
            h = model[0](pol.cast_inputs(x))
            assert h.dtype == torch.float16  # an FP16 activation enters the FP32 BN
            out = model(pol.cast_inputs(x))
            loss = nn.functional.cross_entropy(out, y)
        opt.backward(loss)
        assert opt.step()
    assert model[0].weight.dtype == torch.float16 and model[5].weight.dtype == torch.float16
    for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
        assert t.dtype == torch.float32
    assert bn.num_batches_tracked.item() == 3 and bn.running_mean.abs().sum() > 0
    assert out.dtype == torch.float16  # activations stay FP16 after the BN


def test_bn_fp32_off_casts_bn_to_fp16():
    pol = policy("mixed", bn_fp32=False)
    model = pol.prepare_model(small_cnn())
    assert model[1].weight.dtype == torch.float16 and model[1].running_var.dtype == torch.float16
    assert "BN in FP16" in pol.describe()


# -- TF32 and bf16 -------------------------------------------------------------------------------
def test_tf32_flags_are_set_explicitly_by_every_policy():
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = (
            True  # leaked state
        )
        policy("fp32")
        assert (
            torch.backends.cuda.matmul.allow_tf32 is False
            and torch.backends.cudnn.allow_tf32 is False
        )
        policy("fp32", allow_tf32=True)
        assert (
            torch.backends.cuda.matmul.allow_tf32 is True
            and torch.backends.cudnn.allow_tf32 is True
        )
        policy("amp")
        assert (
            torch.backends.cuda.matmul.allow_tf32 is False
            and torch.backends.cudnn.allow_tf32 is False
        )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def test_bf16_creates_no_scaler():
    pol = policy("bf16")
    model, opt = setup(pol, lr=0.1)
    assert opt.scaler is None
    assert step(pol, model, opt, 1.0, 2.0)
    assert opt.loss_scale == 1.0 and pol.loss_scales() == {"model": 1.0}
    s = pol.summary()
    assert s["loss_scale"] == {"initial": 1.0, "final": 1.0, "min": 1.0, "max": 1.0, "kind": "none"}
    assert s["diagnostics"]["scaling"] == "none" and s["steps"] == 1 and s["skipped_steps"] == 0
    assert "no loss scaling (BF16 has FP32's exponent range)" in pol.describe()
    with pytest.raises(ConfigError, match="precision.loss_scaling=dynamic"):
        policy("bf16", loss_scaling=LossScaling.dynamic)


# -- clipping acts on unscaled gradients ---------------------------------------------------------
@pytest.mark.parametrize("preset", ["amp", "mixed"])
def test_clip_threshold_means_the_same_in_every_preset(preset):
    torch.manual_seed(0)
    base = nn.Linear(4, 3)
    x, y = torch.randn(16, 4), torch.randn(16, 3)

    def update(pol):
        model = pol.prepare_model(copy.deepcopy(base))
        opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=1.0))
        opt.zero_grad()
        with pol.autocast():
            loss = nn.functional.mse_loss(model(pol.cast_inputs(x)), pol.cast_inputs(y)) * 10
        opt.backward(loss)
        assert opt.step(clip_grad_norm=0.05)
        return [
            (p.float() - q).detach()
            for p, q in zip(opt.param_groups[0]["params"], base.parameters())
        ]

    ref = update(policy("fp32"))
    got = update(
        policy(preset, paper_loss_scale=1024.0)
        if preset == "mixed"
        else policy(preset, init_scale=1024.0)
    )
    # the clipped update has norm 0.05 in both; without unscale-before-clip it would be 1024x off
    assert torch.cat([d.flatten() for d in ref]).norm().item() == pytest.approx(0.05, rel=1e-4)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-4)


# -- several optimizers (the GAN) ----------------------------------------------------------------
def two_opt_step(pol, models, opts, x1_d: float):
    for name, x1 in (("D", x1_d), ("G", 1.0)):
        opts[name].zero_grad()
        with pol.autocast():
            loss = models[name](pol.cast_inputs(torch.tensor([1.0, x1])))
        opts[name].backward(loss)
        opts[name].step()


@pytest.mark.parametrize("per_loss", [True, False])
def test_per_loss_scales_or_one_shared_scale(per_loss):
    pol = policy("mixed", init_scale=16.0, per_loss_scale=per_loss)
    models = {n: pol.prepare_model(Two()) for n in ("D", "G")}
    opts = {
        n: pol.build_optimizer(m, lambda p: torch.optim.SGD(p, lr=0.1), name=n)
        for n, m in models.items()
    }
    two_opt_step(pol, models, opts, 60000.0)  # only D's loss overflows
    if per_loss:
        assert pol.loss_scales() == {"D": 8.0, "G": 16.0}
    else:  # one scale, moved once per round, after both optimizers stepped
        assert pol.loss_scales() == {"D": 8.0, "G": 8.0}
    s = pol.summary()
    assert s["skipped_steps"] == 1 and s["steps"] == 2
    assert s["diagnostics"]["per_optimizer"]["D"]["skipped_steps"] == 1
    assert s["diagnostics"]["first_nonfinite_layer"] == "D.b"


# -- checkpoints ---------------------------------------------------------------------------------
def test_state_dict_round_trip_continues_bit_identically():
    script = [1, 60000, 1, 1, 1, 60000, 1, 1, 1, 1]  # overflows on both sides of the checkpoint
    torch.manual_seed(0)
    knobs = dict(init_scale=32.0, growth_interval=2, hysteresis=2)

    def make():
        pol = policy("mixed", **knobs)
        model, opt = setup(pol, lr=2.0**-12, model=Two(1.0, 0.5), momentum=0.9)
        return pol, model, opt

    pol, model, opt = make()
    for x1 in script[:4]:
        step(pol, model, opt, 0.3, float(x1))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    # the masters carry what the FP16 model cannot: 1 - k*2^-12 is not an FP16 number
    masters = opt.state_dict()["masters"]
    assert not torch.equal(masters[0].half().float(), masters[0])
    for x1 in script[4:]:
        step(pol, model, opt, 0.3, float(x1))

    pol2, model2, opt2 = make()
    buf.seek(0)
    ck = torch.load(buf)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    for x1 in script[4:]:
        step(pol2, model2, opt2, 0.3, float(x1))

    for p, q in zip(opt.param_groups[0]["params"], opt2.param_groups[0]["params"]):
        assert torch.equal(p, q)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert pol.summary() == pol2.summary()
    assert opt.state_dict()["scaler"] == opt2.state_dict()["scaler"]


# -- contradictory knobs -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "knobs,key",
    [
        (
            dict(compute_dtype=Dtype.bfloat16, loss_scaling=LossScaling.static, static_scale=8.0),
            "precision.loss_scaling",
        ),
        (dict(compute_dtype=F16, weights=AUTO, master_weights=True), "precision.master_weights"),
        (dict(compute_dtype=F32, weights=LOW), "precision.weights"),
        (dict(compute_dtype=F32, loss_scaling=LossScaling.dynamic), "precision.loss_scaling"),
        (dict(compute_dtype=F16, loss_scaling=LossScaling.static), "precision.static_scale"),
        (
            dict(compute_dtype=F16, loss_scaling=LossScaling.dynamic, static_scale=8.0),
            "precision.static_scale",
        ),
        (
            dict(
                compute_dtype=F16, loss_scaling=LossScaling.dynamic, min_scale=4.0, init_scale=2.0
            ),
            "precision.min_scale",
        ),
        (
            dict(compute_dtype=F16, loss_scaling=LossScaling.dynamic, backoff_factor=1.0),
            "precision.backoff_factor",
        ),
        (
            dict(compute_dtype=F16, loss_scaling=LossScaling.dynamic, hysteresis=0),
            "precision.hysteresis",
        ),
    ],
)
def test_contradictory_knobs_are_refused_naming_the_key(knobs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        PrecisionPolicy(PrecisionConfig(name="x", **knobs), "cpu")


def test_zero_grad_clears_model_and_master_grads():
    pol = policy("mixed", paper_loss_scale=4.0)
    model, opt = setup(pol, lr=0.0)
    step(pol, model, opt, 1.0, 1.0)
    with pol.autocast():
        model(
            pol.cast_inputs(torch.tensor([1.0, 1.0]))
        ).backward()  # a stray backward (another loss)
    assert model.a.grad is not None and master_of(opt).grad is not None
    opt.zero_grad()
    assert model.a.grad is None and master_of(opt).grad is None
