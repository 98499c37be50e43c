"""Adaptive layer-wise loss scaling (precision=adaptive, Zhao et al. 2019): the per-layer scale
formula on hand-built statistics, exact gradients through residual and concat joins, the
no-scaling limit, less underflow than no_scaling, checkpoints, and the CLI."""

from __future__ import annotations

import copy
import math
import weakref
from collections import Counter

import pytest
import torch
from conftest import run_cli
from omegaconf import OmegaConf
from torch import nn

from mpt_repro.errors import ConfigError
from mpt_repro.models import build_model
from mpt_repro.precision import PrecisionConfig, PrecisionPolicy
from mpt_repro.precision.adaptive import U_MAX, U_MIN, erfinv_sqrt2, layer_scale_exponent
from mpt_repro.precision.config import Dtype, LossScaling, WeightStorage

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest)


def fp16_policy(kind: str, **knobs) -> PrecisionPolicy:
    return PrecisionPolicy(
        PrecisionConfig(
            name=kind,
            compute_dtype=Dtype.float16,
            weights=WeightStorage.low_precision,
            master_weights=True,
            loss_scaling=LossScaling[kind],
            **knobs,
        ),
        "cpu",
    )


# -- the formula -------------------------------------------------------------------------------
def exp_of(
    ms_g=1e-20,
    g=(1e-10, -1e-10),
    ms_w=1e-2,
    w=(0.5, -0.5),
    fan_in=16,
    prev=1.0,
    T=1e-3,
    up=2.0**40,
    acc=2.0**40,
    formula="paper",
    mean_g=0.0,
):
    return layer_scale_exponent(
        ms_g, g[0], g[1], ms_w, w[0], w[1], fan_in, prev, T, up, acc, formula=formula, mean_g=mean_g
    )


def test_underflow_bound_is_u_min_over_sigma_o_sqrt2_erfinv_t():
    assert erfinv_sqrt2(1e-3) == pytest.approx(0.0012533, rel=1e-4)
    # sigma_o = sqrt(1e-20 * 1e-2) = 1e-11: s_uf = 2^-24 / (1e-11 * 0.0012533) ~ 4.76e6 -> 2^22
    s_uf = U_MIN / (1e-11 * erfinv_sqrt2(1e-3))
    assert exp_of() == math.floor(math.log2(s_uf)) == 22


def test_never_below_one_for_underflow_reasons():
    assert exp_of(ms_g=1.0, g=(1e-3, -1e-3)) == 0  # s_uf << 1: s = 1


def test_overflow_cap_uses_fan_in_and_extreme_products():
    # o_max = 1e-10 * 0.5; s_of = (65504 / 16) / 5e-11 ~ 8.2e13 -> not binding; make it bind:
    e = exp_of(g=(1e-3, -2e-3), fan_in=64)  # o_max = 2e-3*0.5 = 1e-3: s_of = 65504/64/1e-3 ~ 1.02e6
    assert e == math.floor(math.log2(U_MAX / 64 / 1e-3)) == 19
    # a large gradient: the overflow bound is below 1 (allowed, as in the reference)
    assert (
        exp_of(ms_g=1.0, g=(100.0, -100.0), fan_in=4096)
        == math.floor(math.log2(U_MAX / 4096 / 50))
        == -2
    )


def test_per_layer_and_accumulation_caps_then_power_of_two():
    assert exp_of(up=16.0) == 4
    assert exp_of(up=24.0) == 4  # rounded down to a power of two
    assert exp_of(prev=64.0, acc=1024.0) == 4  # accumulated: 1024 / 64 = 16
    assert exp_of(prev=2048.0, acc=1024.0) == -1  # the gradient already carries more than the cap


def test_zero_statistics_take_the_caps():
    # a gradient that underflowed entirely: both bounds infinite, the caps decide (reference)
    assert exp_of(ms_g=0.0, g=(0.0, 0.0), up=16.0) == 4


def test_fan_in_counts_the_terms_of_each_layer_s_input_gradient():
    from mpt_repro.precision.adaptive import fan_in

    assert fan_in(nn.Linear(3, 5)) == 5  # dX = dY W: a sum over the 5 outputs
    assert fan_in(nn.Conv2d(4, 6, 3)) == 6 * 9
    assert fan_in(nn.Conv2d(4, 6, 3, groups=2)) == 3 * 9  # each group's own outputs
    assert fan_in(nn.ConvTranspose2d(4, 6, 3)) == 6 * 9
    assert fan_in(nn.LSTM(3, 5)) == 4 * 5  # the four gates' rows, not the input size


# -- the authors' code (precision.adaptive_formula=code | code_weights) --------------------------
# Hand-computed from kumasento/gradient-scaling @911ef2d ada_loss/chainer_impl/ada_loss.py
# get_loss_scale_by_approx_range and bound_loss_scale_by_heuristics, with its u_min = 6.0e-8,
# u_max = 65504 and n_uf_threshold = sqrt(2) erfinv(1e-3) = 0.00125331.
def test_code_weights_widens_sigma_by_sqrt_half_fan_in():
    # sigma_o = sqrt(1e-20 * 1e-2) * sqrt(0.5 * 16) = 2.8284e-11;
    # s = 6e-8 / (2.8284e-11 * 0.00125331) = 1.6926e6 = 2^20.69 -> 2^20 (the paper formula: 2^22)
    assert exp_of(formula="code_weights") == 20
    assert exp_of() == 22
    # overflow: u_max / fan_in / o_max = 65504 / 64 / (2e-3 * 0.5) = 1.0235e6 = 2^19.97 -> 2^19
    assert exp_of(g=(1e-3, -2e-3), fan_in=64, formula="code_weights") == 19


def test_code_reads_the_gradient_alone():
    # W dropped: sigma = std(g) = sqrt(1e-20 - 0) = 1e-10;
    # s = 6e-8 / (1e-10 * 0.00125331) = 478,731 = 2^18.87 -> 2^18, whatever the weights
    assert exp_of(formula="code") == 18
    assert exp_of(formula="code", ms_w=1.0, w=(3.0, -3.0), fan_in=4096) == 18
    # std, not the root mean square: mean 0.6e-10 leaves sigma = sqrt(1e-20 - 0.36e-20) = 8e-11,
    # s = 6e-8 / (8e-11 * 0.00125331) = 598,413 = 2^19.19 -> 2^19
    assert exp_of(formula="code", mean_g=0.6e-10) == 19
    # overflow from max|g| and the whole u_max: 65504 / 1.0 = 2^15.999 -> 2^15 (the paper
    # formula divides by fan_in and multiplies by max|W|: 65504 / 16 / 0.5 = 2^12.999 -> 2^12)
    assert exp_of(g=(1.0, -1e-10), formula="code") == 15
    assert exp_of(g=(1.0, -1e-10)) == 12


@pytest.mark.parametrize("formula", ["code", "code_weights"])
def test_code_gives_scale_one_for_sigma_zero_then_the_caps(formula):
    # their early return: s = 1 (the paper formula takes the caps: 16 -> 2^4) ...
    assert exp_of(ms_g=0.0, g=(0.0, 0.0), up=16.0, formula=formula) == 0
    assert exp_of(ms_g=0.0, g=(0.0, 0.0), up=16.0) == 4
    # ... and bound_loss_scale_by_heuristics still applies: min(1, 1024 / 2048) = 2^-1
    assert exp_of(ms_g=0.0, g=(0.0, 0.0), prev=2048.0, acc=1024.0, formula=formula) == -1


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 32)  # head fan-in 32

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


@pytest.mark.parametrize("formula", ["paper", "code", "code_weights"])
def test_a_layer_scale_equals_the_formula_on_the_gradient_it_saw(formula):
    """The head's scale at step 2 comes from the gradient that reached it at step 1 (the loss
    is at scale 1, so that gradient carries none), recomputed here from the authors' formulas
    in float64 with numpy-style statistics."""
    torch.manual_seed(0)
    base, x, y = TwoLinear(), torch.randn(32, 8), torch.randint(0, 32, (32,))
    pol = fp16_policy(
        "adaptive",
        adaptive_formula=formula,
        adaptive_scale_upper_bound=2.0**30,
        adaptive_accum_upper_bound=2.0**30,
    )
    model = pol.prepare_model(copy.deepcopy(base))
    seen = []
    model.head.register_full_backward_hook(lambda m, gi, go: seen.append(go[0].double()))
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.0))
    for _ in range(2):
        opt.zero_grad()
        with pol.autocast():
            loss = nn.functional.cross_entropy(model(pol.cast_inputs(x)), y) * 2.0**-14
        opt.backward(loss)
        opt.step()
    g, w = seen[0], model.head.weight.detach().double()
    t = math.sqrt(2.0) * torch.special.erfinv(torch.tensor(1e-3, dtype=torch.float64)).item()
    extremes = [a * b for a in (g.max(), g.min()) for b in (w.max(), w.min())]
    if formula == "paper":
        sigma = math.sqrt(g.pow(2).mean() * w.pow(2).mean())
        s = min(max(U_MIN / (sigma * t), 1.0), U_MAX / 32 / max(abs(float(e)) for e in extremes))
    elif formula == "code":
        sigma = float(g.std(unbiased=False))  # numpy's std
        s = min(max(6.0e-8 / (sigma * t), 1.0), 65504 / float(g.abs().max()))
    else:
        sigma = math.sqrt(g.pow(2).mean() * w.pow(2).mean()) * math.sqrt(0.5 * 32)
        s = min(max(6.0e-8 / (sigma * t), 1.0), 65504 / 32 / max(abs(float(e)) for e in extremes))
    want = 2.0 ** math.floor(math.log2(s))
    assert pol.layer_scales()["head"] == want
    assert 2.0**4 < want < 2.0**30  # the formula decided, not a cap


def test_the_formulas_disagree_on_that_layer():
    """The switch changes the scale a real gradient gets (else the test above proves little):
    each code formula differs from the paper's here (2^7 against 2^9)."""
    scales = {}
    for formula in ("paper", "code", "code_weights"):
        torch.manual_seed(0)
        base, x, y = TwoLinear(), torch.randn(32, 8), torch.randint(0, 32, (32,))
        pol = fp16_policy(
            "adaptive",
            adaptive_formula=formula,
            adaptive_scale_upper_bound=2.0**30,
            adaptive_accum_upper_bound=2.0**30,
        )
        grads_after(pol, base, x, y, steps=2, loss_weight=2.0**-14)
        scales[formula] = pol.layer_scales()["head"]
    assert scales["code"] != scales["paper"] != scales["code_weights"], scales


def test_validation_of_the_knobs():
    for bad in (
        dict(adaptive_underflow_threshold=0.0),
        dict(adaptive_scale_upper_bound=12.0),
        dict(adaptive_update_interval=0),
        dict(adaptive_method="element_wise_range"),
        dict(adaptive_formula="authors"),
    ):
        with pytest.raises(ConfigError, match="precision.adaptive_"):
            fp16_policy("adaptive", **bad)
    with pytest.raises(ConfigError, match="master_weights"):
        PrecisionPolicy(
            PrecisionConfig(
                name="x",
                compute_dtype=Dtype.float16,
                weights=WeightStorage.low_precision,
                master_weights=False,
                loss_scaling=LossScaling.adaptive,
            ),
            "cpu",
        )


# -- gradients through joins -------------------------------------------------------------------
class Joins(nn.Module):
    """A residual add (x consumed by a layer and by the add) and a concat of two branches
    (a tensor consumed by two layers, one behind a parameter-free op) and BatchNorm."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8, bias=False)  # followed by BN: a bias would get a ~0 gradient
        self.bn = nn.BatchNorm1d(8)
        self.b1, self.b2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.c1, self.c2 = nn.Linear(8, 4), nn.Linear(8, 4)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = torch.relu(self.bn(self.a(x)))
        x = x + self.b2(torch.relu(self.b1(x)))  # residual
        x = torch.cat([self.c1(x), self.c2(torch.tanh(x))], 1)  # concat
        return self.head(x)


def grads_after(pol, base, x, y, steps=3, loss_weight=2.0**-6):
    """Run `steps` backward passes with lr 0 (weights fixed) and return the last master grads."""
    model = pol.prepare_model(copy.deepcopy(base))
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.0))
    for _ in range(steps):
        opt.zero_grad()
        with pol.autocast():
            loss = nn.functional.cross_entropy(model(pol.cast_inputs(x)), y) * loss_weight
        opt.backward(loss)
        assert opt.step()
    return [p.grad.clone() for p in opt.param_groups[0]["params"]], pol


def joins_data():
    torch.manual_seed(0)
    base = Joins()
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    return base, x, y


def rel_err(got, ref):
    return [float((g - r).abs().max() / r.abs().max()) for g, r in zip(got, ref)]


def test_unscaled_gradients_equal_fp32_within_fp16_rounding_through_residual_and_concat():
    base, x, y = joins_data()
    ref = copy.deepcopy(base)
    (nn.functional.cross_entropy(ref(x), y) * 2.0**-6).backward()
    ref_grads = [p.grad for p in ref.parameters()]
    got, pol = grads_after(fp16_policy("adaptive"), base, x, y)
    # FP16 rounding alone, measured: a global static scale large enough that nothing underflows
    mixed, _ = grads_after(fp16_policy("static", static_scale=2.0**14), base, x, y)
    scales = pol.layer_scales()
    assert max(scales.values()) > 1  # the layers really scaled (else this test proves nothing)
    s = next(iter(pol.optimizers.values())).scaler
    assert (
        len({s._param_exp[id(p)] for p in s._param_exp and [m for m, _ in s._pairs]}) > 2
    )  # several scales met
    # a wrong power of two anywhere would be an error of 50% or more
    for name, e, e_mixed in zip(
        [n for n, _ in ref.named_parameters()],
        rel_err(got, ref_grads),
        rel_err(mixed, ref_grads),
        strict=False,
    ):
        assert e < 0.5 and e <= 1.5 * e_mixed + 2e-3, (name, e, e_mixed)


def test_with_every_scale_one_gradients_equal_no_scaling_exactly():
    base, x, y = joins_data()
    forced, _ = grads_after(fp16_policy("adaptive", adaptive_scale_upper_bound=1.0), base, x, y)
    plain, _ = grads_after(fp16_policy("none"), base, x, y)
    assert all(torch.equal(a, b) for a, b in zip(forced, plain))


def test_lstm_and_embedding_gradients_unscale_correctly():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lstm, self.out = nn.Embedding(20, 8), nn.LSTM(8, 8), nn.Linear(8, 20)

        def forward(self, t):
            return self.out(self.lstm(self.emb(t))[0])

    torch.manual_seed(0)
    base, t = LM(), torch.randint(0, 20, (5, 4))
    ref = copy.deepcopy(base)
    (nn.functional.cross_entropy(ref(t).flatten(0, 1), t.flatten()) * 2.0**-8).backward()
    ref_grads = [p.grad for p in ref.parameters()]

    def run(pol):
        model = pol.prepare_model(copy.deepcopy(base))
        opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.0))
        for _ in range(3):
            opt.zero_grad()
            with pol.autocast():
                loss = (
                    nn.functional.cross_entropy(model(t).flatten(0, 1).float(), t.flatten())
                    * 2.0**-8
                )
            opt.backward(loss)
            assert opt.step()
        return [p.grad for p in opt.param_groups[0]["params"]]

    pol = fp16_policy("adaptive")
    got = run(pol)
    assert pol.summary()["diagnostics"]["adaptive"]["layers"]["lstm"]["accumulated_final"] > 1
    mixed = run(fp16_policy("static", static_scale=2.0**16))
    for name, e, e_mixed in zip(
        [n for n, _ in ref.named_parameters()],
        rel_err(got, ref_grads),
        rel_err(mixed, ref_grads),
        strict=False,
    ):
        assert e < 0.5 and e <= 1.5 * e_mixed + 2e-3, (name, e, e_mixed)


# -- the walk of the autograd graph -------------------------------------------------------------
class _Core:
    """A C++ autograd node: its children, and nothing a Python object could be named by."""

    def __init__(self, *children: _Core):
        self.children = children


class _PyNode:
    """The Python object of a _Core as torch up to 2.12 hands it out: made on demand, the same
    object while one lives, freed with its last reference (and made anew, with a new id, by the
    next `next_functions`)."""

    live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    made: Counter = Counter()

    def __init__(self, core: _Core):
        self.core = core

    @classmethod
    def of(cls, core: _Core) -> _PyNode:
        node = cls.live.get(id(core))
        if node is None:
            node = cls.live[id(core)] = cls(core)
            cls.made[id(core)] += 1
        return node

    @property
    def next_functions(self):
        return tuple((_PyNode.of(c), 0) for c in self.core.children)


def test_the_walk_holds_every_node_so_no_id_changes_under_it():
    """Up to torch 2.12, a walk that named nodes by id() without holding them met new objects for
    the same nodes and found no layer: every scale stayed 1 (0 scale updates, no warning)."""
    from mpt_repro.precision.adaptive import _LAYER, _LOSS, _OutCell, _walk

    layer = _Core()
    a, b = _Core(layer), _Core(layer)  # two paths from the loss join at the layer's output
    root = _PyNode.of(_Core(a, b))
    held = _PyNode.of(layer)  # the scaler holds its layers' output nodes (AdaptiveScaler._nodes)
    cell = _OutCell(None, 0, 7)
    tape = _walk(root, {id(held): cell})
    assert tape.entries == [(_LAYER, 7, (_LOSS, _LOSS))]
    assert {_PyNode.made[id(c)] for c in (a, b, layer)} == {1}  # each node's object made once


def test_a_loss_that_reaches_no_layer_fails_loudly():
    """The layers ran, but the loss is not theirs: no scale can be planned, and a run that went
    on would look like a working adaptive run with every scale 1."""
    pol = fp16_policy("adaptive")
    model = pol.prepare_model(Joins())
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.0))
    with pol.autocast():
        model(pol.cast_inputs(torch.randn(4, 8)))
        loss = sum(p.float().sum() for p in model.parameters())
    with pytest.raises(RuntimeError, match="found none of the 6 layer outputs this forward made"):
        opt.backward(loss)


# -- the point-4 model: less underflow than no_scaling ------------------------------------------
def activation_grad_underflow(pol_kind: str, steps: int = 3) -> float:
    """Fraction of activation-gradient elements nonzero in FP32 but zero in the FP16 run (measured
    with hooks on every Linear's input, unscaled by comparing zero patterns only)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:64], dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target[:64])
    cfg = OmegaConf.create(dict(name="small_grad_mlp", width=16, num_layers=4, variant="log2k=-6"))
    torch.manual_seed(0)
    base = build_model(cfg, num_classes=10, channels=1, image_size=8)

    def grads(model, pol=None):
        seen = []

        def keep(mod, args, out):
            out.register_hook(lambda g: seen.append(g.detach().float()))

        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.register_forward_hook(keep)
        if pol is None:
            nn.functional.cross_entropy(model(x), y).backward()
            return seen
        opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.0))
        for _ in range(steps):  # adaptive needs one step of statistics before it scales
            seen.clear()
            opt.zero_grad()
            with pol.autocast():
                loss = nn.functional.cross_entropy(model(pol.cast_inputs(x)), y)
            opt.backward(loss)
            opt.step()
        return seen

    ref = grads(copy.deepcopy(base))
    pol = fp16_policy(pol_kind)
    low = grads(pol.prepare_model(copy.deepcopy(base)), pol)
    nonzero = sum(int((r != 0).sum()) for r in ref)
    lost = sum(int(((r != 0) & (g == 0)).sum()) for r, g in zip(ref, low))
    return lost / nonzero


def test_adaptive_underflows_less_than_no_scaling_on_the_scaling_matters_model():
    none, adaptive = activation_grad_underflow("none"), activation_grad_underflow("adaptive")
    assert none > 0.3  # the experiment's premise: much of the gradient flushes to zero
    assert adaptive < none - 0.1, (adaptive, none)


# -- checkpoints -------------------------------------------------------------------------------
def finished_statistics(scaler_state: dict) -> dict:
    """A scaler state as the suite wrote it before g_scale: pending gradient statistics already
    divided by their scale and size, [E g^2, max g, min g]."""
    old = copy.deepcopy(scaler_state)
    for layer in old["layers"].values():
        sc, numel = layer.pop("g_scale")
        if layer["g_stats"] is not None:
            norm, hi, lo = layer["g_stats"].tolist()
            layer["g_stats"] = torch.tensor([norm * norm / numel / sc / sc, hi / sc, lo / sc])
    return old


@pytest.mark.parametrize("written_by", ["this version", "a version without g_scale"])
def test_scales_round_trip_through_a_checkpoint_and_the_continuation_is_identical(written_by):
    base, x, y = joins_data()

    def run(pol, model, opt, n):
        for i in range(n):
            opt.zero_grad()
            with pol.autocast():
                loss = nn.functional.cross_entropy(
                    model(pol.cast_inputs(x[i % 4 * 8 : (i % 4 + 1) * 8])),
                    y[i % 4 * 8 : (i % 4 + 1) * 8],
                )
            opt.backward(loss * 2.0**-12)
            opt.step()

    def fresh():
        pol = fp16_policy("adaptive", adaptive_update_interval=2)
        model = pol.prepare_model(copy.deepcopy(base))
        opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9))
        return pol, model, opt

    pol, model, opt = fresh()
    run(pol, model, opt, 4)
    state = copy.deepcopy((model.state_dict(), opt.state_dict()))
    assert state[1]["scaler"]["layers"]["head"]["stats"] is not None
    assert state[1]["scaler"]["layers"]["head"]["g_stats"] is not None  # pending: saved too
    if written_by != "this version":
        state[1]["scaler"] = finished_statistics(state[1]["scaler"])
    run(pol, model, opt, 4)
    pol2, model2, opt2 = fresh()
    model2.load_state_dict(state[0])
    opt2.load_state_dict(state[1])
    run(pol2, model2, opt2, 4)
    assert pol2.layer_scales() == pol.layer_scales()

    def results(p):  # the plan counts are the process's work, not state: a resumed run walks anew
        return {k: v for k, v in p.summary()["diagnostics"]["adaptive"].items() if "plan" not in k}

    assert results(pol2) == results(pol)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


def test_summary_reports_per_layer_scales():
    base, x, y = joins_data()
    _, pol = grads_after(fp16_policy("adaptive"), base, x, y)
    ad = pol.summary()["diagnostics"]["adaptive"]
    assert set(ad["layers"]) == {"a", "b1", "b2", "c1", "c2", "head"}
    assert ad["updates"] == 2  # plans 2 and 3 recompute (plan 1 has no statistics yet)
    for v in ad["layers"].values():
        assert v["min"] <= v["final"] <= v["max"]


# -- the architecture families ------------------------------------------------------------------
def test_two_models_two_optimizers_each_with_its_own_scaler():
    """DCGAN-style: the generator's loss runs through the discriminator; each model's scaler
    scales its own layers and passes the other's through."""
    torch.manual_seed(0)
    G, D = (
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6)),
        nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)),
    )
    refG, refD = copy.deepcopy(G), copy.deepcopy(D)
    z = torch.randn(16, 4)
    (refD(refG(z)).mean() * 2.0**-6).backward()
    pol = fp16_policy("adaptive")
    g, d = pol.prepare_model(copy.deepcopy(G)), pol.prepare_model(copy.deepcopy(D))
    og = pol.build_optimizer(g, lambda p: torch.optim.SGD(p, lr=0.0), name="generator")
    od = pol.build_optimizer(d, lambda p: torch.optim.SGD(p, lr=0.0), name="discriminator")
    for _ in range(3):
        og.zero_grad()
        od.zero_grad()
        with pol.autocast():
            loss = d(g(pol.cast_inputs(z))).float().mean() * 2.0**-6
        og.backward(loss)
        assert og.step()
    assert pol.layer_scales()["generator/2"] > 1 and pol.layer_scales()["discriminator/0"] == 1.0
    for (name, r), p in zip(refG.named_parameters(), og.param_groups[0]["params"]):
        assert (p.grad - r.grad).abs().max() / r.grad.abs().max() < 3e-2, name


# -- the plan cache: a replayed tape plans exactly what a walk of the graph plans ----------------
class Switching(Joins):
    """Joins whose residual branch runs on even steps only: two forward keys, two tapes."""

    step = 0

    def forward(self, x):
        x = torch.relu(self.bn(self.a(x)))
        if self.step % 2 == 0:
            x = x + self.b2(torch.relu(self.b1(x)))
        x = torch.cat([self.c1(x), self.c2(torch.tanh(x))], 1)
        return self.head(x)


def planned(plan_cache: bool, steps: int = 8, model_cls=Switching, change_at: int | None = None):
    """Train with lr > 0 (the exponents move) on a new batch each step; per step: the master
    grads, every layer's scale, and each parameter's gradient exponent by name."""
    torch.manual_seed(0)
    base, xs, ys = model_cls(), torch.randn(steps, 16, 8), torch.randint(0, 3, (steps, 16))
    pol = fp16_policy("adaptive", adaptive_plan_cache=plan_cache)
    model = pol.prepare_model(base)
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9))
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for i in range(steps):
        model.step = i
        if change_at is not None:
            model.extra_path = i >= change_at
        opt.zero_grad()
        with pol.autocast():
            loss = nn.functional.cross_entropy(model(pol.cast_inputs(xs[i])), ys[i]) * 2.0**-10
        opt.backward(loss)
        opt.step()
        exps = {names[k]: e for k, e in opt.scaler._param_exp.items()}
        grads = [None if p.grad is None else p.grad.clone() for p in opt.params]
        out.append((grads, pol.layer_scales(), exps))
    return out, opt.scaler


def same_plans(a, b) -> bool:
    return all(
        sa == sb
        and ea == eb
        and all(x is y is None or torch.equal(x, y) for x, y in zip(ga, gb, strict=True))
        for (ga, sa, ea), (gb, sb, eb) in zip(a, b, strict=True)
    )


def test_plans_from_kept_tapes_equal_a_walk_every_step_bit_for_bit():
    cached, s = planned(True)
    walked, w = planned(False)
    assert same_plans(cached, walked)
    assert len({e for _, _, exps in cached for e in exps.values()}) > 2  # the scales really vary
    # two forward keys (with and without the residual branch): each walked on first sight and
    # audited on its first reuse, then replayed
    assert (s.plan_walks, s.plan_reuses) == (4, 4) and len(s._tapes) == 2
    assert (w.plan_walks, w.plan_reuses) == (8, 0) and not w._tapes
    assert s.diagnostics()["plan_cache"] == "on"


class Rewired(Joins):
    """The same layer calls, each fed by the same kind of op, but from step `change_at` on a
    parameter-free path joins c1's output: a graph change only a walk can see."""

    extra_path = False

    def forward(self, x):
        x = torch.relu(self.bn(self.a(x)))
        x = x + self.b2(torch.relu(self.b1(x)))
        c1 = self.c1(x)
        if self.extra_path:  # a skip from x around c1: x gains a consumer, the head's input
            c1 = c1 + x[:, :4]  # is still a concat and c1's still the residual add
        return self.head(torch.cat([c1, self.c2(torch.tanh(x))], 1))


def test_a_graph_change_the_key_cannot_see_is_caught_by_the_audit_and_the_cache_turns_off():
    # the change comes at step 1, the tape's first reuse: audited, so no step ran on a stale tape
    with pytest.warns(UserWarning, match="graph changed while the layer calls stayed the same"):
        cached, s = planned(True, steps=4, model_cls=Rewired, change_at=1)
    walked, _ = planned(False, steps=4, model_cls=Rewired, change_at=1)
    assert same_plans(cached, walked)
    assert not s.plan_cache and s.plan_walks == 4 and s.plan_reuses == 0
    assert s.diagnostics()["plan_cache"].startswith("off")


def test_a_gan_with_one_scaler_per_model_reuses_both_tapes():
    """D's step, then G's through D (the DCGAN task's order): G's plan replays input edges that
    belong to D's scaler, counted from the end of D's list."""

    def run(plan_cache: bool):
        torch.manual_seed(0)
        G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
        D = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
        pol = fp16_policy("adaptive", per_loss_scale=True, adaptive_plan_cache=plan_cache)
        g, d = pol.prepare_model(G), pol.prepare_model(D)
        og = pol.build_optimizer(g, lambda p: torch.optim.SGD(p, lr=0.1), name="generator")
        od = pol.build_optimizer(d, lambda p: torch.optim.SGD(p, lr=0.1), name="discriminator")
        real, out = torch.randn(6, 16, 6), []
        for i in range(6):
            z = torch.randn(16, 4)
            od.zero_grad()
            with pol.autocast():
                fake = g(pol.cast_inputs(z))
                d_loss = (d(pol.cast_inputs(real[i])) - d(fake.detach())).float().mean()
            od.backward(d_loss * 2.0**-8)
            od.step()
            og.zero_grad()
            with pol.autocast():
                g_loss = -d(fake).float().mean() * 2.0**-8
            og.backward(g_loss)
            og.step()
            grads = [p.grad.clone() for o in (og, od) for p in o.params if p.grad is not None]
            out.append((grads, pol.layer_scales(), {}))
        return out, og.scaler, od.scaler

    cached, sg, sd = run(True)
    walked, _, _ = run(False)
    assert same_plans(cached, walked)
    assert max(cached[-1][1].values()) > 1
    assert sg.plan_cache and sd.plan_cache
    # G: one key, walked on sight and audited on the first reuse. D: its key from step 2 on also
    # holds the previous G step's calls through D (one more key to walk and audit)
    assert (sg.plan_walks, sg.plan_reuses) == (2, 4) and (sd.plan_walks, sd.plan_reuses) == (3, 3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["alexnet", "vgg16", "googlenet", "inception_v2", "inception_v3", "resnet50"]
)
def test_paper_networks_train_a_step_with_consistent_scales(name):
    from conftest import compose

    cfg = compose([f"experiment={name}", "budget=smoke"])
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=10, channels=3, image_size=cfg.data.image_size)
    pol = fp16_policy("adaptive")
    model = pol.prepare_model(model)
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.0))
    x = torch.randn(2, 3, cfg.data.image_size, cfg.data.image_size)
    y = torch.tensor([1, 2])
    model.train()
    for _ in range(2):
        opt.zero_grad()
        with pol.autocast():
            out = model(pol.cast_inputs(x))
            out = out[0] if isinstance(out, tuple) else out
            loss = (
                nn.functional.cross_entropy(out.float(), y) * 2.0**-14
            )  # small: the scales must act
        opt.backward(loss)
        opt.step()
    s = next(iter(pol.optimizers.values())).scaler
    assert s.fallback_steps == 0  # every join got one consistent scale
    assert max(pol.layer_scales().values()) > 1


# -- the CLI -----------------------------------------------------------------------------------
def test_mpt_run_demo_adaptive_smoke(tmp_path):
    import json

    run_cli("experiment=demo", "precision=adaptive", "budget=smoke", run_dir=tmp_path)
    rec = json.loads((tmp_path / "run.json").read_text())
    assert rec["status"] == "completed"
    ad = rec["diagnostics"]["adaptive"]
    assert ad["updates"] >= 1 and ad["layers"]
