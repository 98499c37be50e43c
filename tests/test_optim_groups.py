"""The optimizer factory: parameter kinds from names and shapes, per-group LR and weight-decay
multipliers, the fused/foreach switch, and RMSProp with TensorFlow's semantics checked against a
hand computation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from mpt_repro.config import OptimConfig
from mpt_repro.optim import RMSpropTF, optimizer_factory, param_kinds


def optim_cfg(**kw):
    return OmegaConf.structured(OptimConfig(**kw))


class Zoo(nn.Module):
    """One of each layer kind the recipes meet."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)
        self.ln = nn.LayerNorm(2)
        self.lstm = nn.LSTM(2, 3, num_layers=1)
        self.embedding = nn.Embedding(5, 2)
        self.prelu = nn.PReLU(4)


def test_param_kinds_from_names_and_shapes():
    kinds = param_kinds(Zoo().named_parameters())
    assert kinds == {
        "conv.weight": "weight",
        "conv.bias": "bias",
        "bn.weight": "norm",  # 1-d weight: a normalisation layer's scale ...
        "bn.bias": "norm",  # ... so its bias is its shift, not a layer bias
        "fc.weight": "weight",
        "fc.bias": "bias",
        "ln.weight": "norm",
        "ln.bias": "norm",
        "lstm.weight_ih_l0": "weight",
        "lstm.weight_hh_l0": "weight",
        "lstm.bias_ih_l0": "bias",  # nn.LSTM's biases: bias_ih_l<k>, bias_hh_l<k>
        "lstm.bias_hh_l0": "bias",
        "embedding.weight": "weight",
        "prelu.weight": "norm",
    }


def test_fp32_master_copies_under_the_models_names_get_the_same_kinds():
    model = Zoo().half()
    masters = [(n, p.detach().float()) for n, p in model.named_parameters()]
    assert param_kinds(masters) == param_kinds(model.named_parameters())


def groups_by_name(opt: torch.optim.Optimizer) -> dict[str, tuple[float, float]]:
    return {n: (g["lr"], g["weight_decay"]) for g in opt.param_groups for n in g["names"]}


def test_caffe_bias_rule_and_no_decay_on_norm_reach_the_groups():
    o = optim_cfg(
        lr=0.01,
        weight_decay=5e-4,
        bias_lr_mult=2.0,
        bias_decay_mult=0.0,
        norm_lr_mult=1.0,
        norm_decay_mult=0.0,
    )
    opt = optimizer_factory(o)(Zoo().named_parameters())
    seen = groups_by_name(opt)
    assert seen["conv.weight"] == (0.01, 5e-4) and seen["lstm.weight_hh_l0"] == (0.01, 5e-4)
    assert seen["conv.bias"] == (0.02, 0.0) and seen["lstm.bias_ih_l0"] == (0.02, 0.0)
    assert seen["bn.weight"] == (0.01, 0.0) and seen["ln.bias"] == (0.01, 0.0)
    assert len(opt.param_groups) == 3


def test_weight_decay_multiplier_changes_the_update():
    """Not only the groups' numbers: one SGD step decays a weight and leaves a bias undecayed."""
    fc = nn.Linear(1, 1)
    with torch.no_grad():
        fc.weight.fill_(1.0), fc.bias.fill_(1.0)
    o = optim_cfg(lr=0.5, momentum=0.0, weight_decay=0.1, bias_lr_mult=2.0, bias_decay_mult=0.0)
    opt = optimizer_factory(o)(fc.named_parameters())
    fc.weight.grad, fc.bias.grad = torch.zeros(1, 1), torch.zeros(1)
    opt.step()
    assert fc.weight.item() == pytest.approx(1.0 - 0.5 * 0.1 * 1.0)  # decayed at lr 0.5
    assert fc.bias.item() == 1.0  # decay_mult 0: no decay (at lr 1.0)


def test_one_group_when_every_multiplier_is_one():
    opt = optimizer_factory(optim_cfg(lr=0.1, weight_decay=1e-4))(Zoo().named_parameters())
    assert len(opt.param_groups) == 1
    assert len(opt.param_groups[0]["params"]) == len(list(Zoo().parameters()))


def test_bare_parameters_work_without_rules_and_are_refused_with_them():
    params = list(Zoo().parameters())
    assert optimizer_factory(optim_cfg())(params).param_groups[0]["params"] == params
    with pytest.raises(ValueError, match="named_parameters"):
        optimizer_factory(optim_cfg(bias_lr_mult=2.0))(params)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_fused_reaches_sgd_and_adam(name):
    opt = optimizer_factory(optim_cfg(name=name, lr=0.01))(Zoo().named_parameters(), fused=True)
    assert opt.defaults["fused"] is True


@pytest.mark.parametrize("name", ["adagrad", "rmsprop"])
def test_fused_asks_the_others_for_foreach(name):
    opt = optimizer_factory(optim_cfg(name=name, lr=0.01))(Zoo().named_parameters(), fused=True)
    assert opt.defaults["foreach"] is True


def test_rmsprop_alpha_reaches_torch_rmsprop():
    opt = optimizer_factory(optim_cfg(name="rmsprop", alpha=0.9))(Zoo().named_parameters())
    assert opt.defaults["alpha"] == 0.9


# RMSProp with TensorFlow's semantics --------------------------------------------------------


def tf_steps(grads, lr, decay, momentum, eps, p0=1.0, ms0=1.0):
    """tf.train.RMSPropOptimizer by hand (ApplyRMSProp): ms starts at 1, eps inside the sqrt,
    lr inside the momentum accumulator."""
    p, ms, mom = p0, ms0, 0.0
    out = []
    for g in grads:
        ms = decay * ms + (1 - decay) * g * g
        mom = momentum * mom + lr * g / math.sqrt(ms + eps)
        p -= mom
        out.append(p)
    return out


def test_rmsprop_tf_matches_a_hand_computation():
    """Inception v3's settings (decay 0.9, momentum 0.9, eps 1.0) on p = 1, loss = 2p."""
    p = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = RMSpropTF([p], lr=0.1, decay=0.9, momentum=0.9, eps=1.0)
    got = []
    for _ in range(2):
        opt.zero_grad()
        (2 * p).sum().backward()
        opt.step()
        got.append(p.item())
    # step 1: ms = 0.9 + 0.1*4 = 1.3; mom = 0.1 * 2/sqrt(2.3) = 0.1318761; p = 0.8681239
    # step 2: ms = 1.57; mom = 0.9*0.1318761 + 0.1 * 2/sqrt(2.57) = 0.2434451; p = 0.6246788
    assert got == pytest.approx([0.8681239, 0.6246788], abs=1e-7)
    assert got == pytest.approx(tf_steps([2.0, 2.0], 0.1, 0.9, 0.9, 1.0), abs=1e-12)
    # torch's RMSprop (eps outside the sqrt, mean square from 0) moves differently
    q = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    ref = torch.optim.RMSprop([q], lr=0.1, alpha=0.9, momentum=0.9, eps=1.0)
    (2 * q).sum().backward()
    ref.step()
    assert q.item() == pytest.approx(1 - 0.1 * 2 / (math.sqrt(0.4) + 1.0))
    assert abs(q.item() - got[0]) > 5e-3


def test_rmsprop_tf_keeps_the_lr_inside_the_momentum():
    """After the LR drops to 0, TF's parameter still moves by momentum * accumulator (torch's
    p -= lr * buf would stop)."""
    p = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = RMSpropTF([p], lr=0.1, decay=0.9, momentum=0.9, eps=1.0)
    (2 * p).sum().backward()
    opt.step()
    moved = 1.0 - p.item()
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    assert 1.0 - p.item() == pytest.approx(moved + 0.9 * moved)


def test_rmsprop_tf_weight_decay_enters_the_gradient():
    p = nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    opt = RMSpropTF([p], lr=0.1, decay=0.9, momentum=0.0, eps=1.0, weight_decay=0.5)
    p.grad = torch.zeros_like(p)
    opt.step()  # g = 0 + 0.5 * 2 = 1
    assert p.item() == pytest.approx(tf_steps([1.0], 0.1, 0.9, 0.0, 1.0, p0=2.0)[0])


def test_rmsprop_tf_state_survives_a_state_dict_round_trip():
    p = nn.Parameter(torch.tensor([1.0, -1.0]))
    opt = RMSpropTF([p], lr=0.1, decay=0.9, momentum=0.9, eps=1.0)
    (p * torch.tensor([2.0, 3.0])).sum().backward()
    opt.step()
    q = nn.Parameter(p.detach().clone())
    opt2 = RMSpropTF([q], lr=0.1, decay=0.9, momentum=0.9, eps=1.0)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from a checkpoint file
    q.grad = p.grad.clone()
    opt.step(), opt2.step()
    assert torch.equal(p, q)


def test_factory_builds_rmsprop_tf_from_the_config():
    o = optim_cfg(name="rmsprop_tf", lr=0.045, alpha=0.9, momentum=0.9, eps=1.0)
    opt = optimizer_factory(o)(Zoo().named_parameters())
    assert isinstance(opt, RMSpropTF)
    assert (opt.defaults["decay"], opt.defaults["eps"], opt.defaults["momentum"]) == (0.9, 1.0, 0.9)


def test_fused_none_follows_optim_fused():
    named = list(Zoo().named_parameters())
    assert optimizer_factory(optim_cfg(fused="false"))(named).defaults["fused"] in (None, False)
    assert optimizer_factory(optim_cfg(fused="auto"))(named).defaults["fused"] is True  # CPU SGD
    assert optimizer_factory(optim_cfg(name="rmsprop_tf", fused="auto"))(named).defaults["fused"]
    assert optimizer_factory(optim_cfg()).takes_named_params is True


def test_rmsprop_tf_skips_on_the_device_when_found_inf():
    """The amp protocol of fused optimizers: found_inf != 0 leaves parameters and state alone
    (even with non-finite gradients); found_inf == 0 is the ordinary step."""
    p = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = RMSpropTF([p], lr=0.1, decay=0.9, momentum=0.9, eps=1.0, weight_decay=0.1, fused=True)
    ref_p = nn.Parameter(p.detach().clone())
    ref = RMSpropTF([ref_p], lr=0.1, decay=0.9, momentum=0.9, eps=1.0, weight_decay=0.1)
    for grad in ([2.0, 3.0], [float("inf"), float("nan")], [1.0, -1.0]):
        g = torch.tensor(grad, dtype=torch.float64)
        overflow = not torch.isfinite(g).all()
        p.grad = g.clone()
        opt.found_inf = torch.tensor([1.0 if overflow else 0.0])
        opt.step()
        if not overflow:
            ref_p.grad = g.clone()
            ref.step()
        assert torch.equal(p, ref_p)
        assert torch.equal(opt.state[p]["ms"], ref.state[ref_p]["ms"])
        assert torch.equal(opt.state[p]["mom"], ref.state[ref_p]["mom"])


def test_rmsprop_tf_under_mixed_precision_steps_without_reading_the_device():
    """Through the precision policy (FP16 weights, FP32 masters, dynamic scale): a clean and an
    overflowing step read nothing on the host, and the overflow leaves the masters alone."""
    from mpt_repro.bench.measure import SyncCounter
    from mpt_repro.precision import PrecisionConfig, PrecisionPolicy
    from mpt_repro.precision.config import Dtype, LossScaling, WeightStorage

    mixed = PrecisionConfig(
        name="mixed",
        compute_dtype=Dtype.float16,
        weights=WeightStorage.low_precision,
        master_weights=True,
        loss_scaling=LossScaling.dynamic,
        init_scale=2.0**10,
    )
    pol = PrecisionPolicy(mixed, "cpu")
    torch.manual_seed(0)
    model = pol.prepare_model(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    o = optim_cfg(name="rmsprop_tf", lr=0.01, alpha=0.9, momentum=0.9, eps=1.0)
    opt = pol.build_optimizer(model, optimizer_factory(o))
    assert opt.fused and opt.sync_free
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])

    def step(inputs):
        opt.zero_grad()
        with pol.autocast():
            loss = nn.functional.cross_entropy(model(pol.cast_inputs(inputs)), y)
        opt.backward(loss)
        return opt.step()

    with SyncCounter() as reads:
        step(x)
        after_clean = [p.detach().clone() for p in opt.params]
        step(x * float("inf"))
    assert reads.reads == 0
    assert all(torch.equal(a, p) for a, p in zip(after_clean, opt.params))
    assert opt.skipped == 1


def test_rmsprop_tf_takes_the_schedules_device_lr_without_reading_it():
    """Under precision.hold_lr_on_skip with a device-side skip, the LR schedule keeps each group's
    LR as a 0-d device tensor. add_(alpha=lr) would read it on the host once per parameter per
    step (hundreds of syncs a step for Inception v3); the step reads nothing, and FP32
    parameters move exactly as with the same LR given as a number."""
    from mpt_repro.bench.measure import SyncCounter

    runs = {}
    for device_lr in (False, True):
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(7)) for _ in range(5)]
        lr = torch.tensor(0.045)  # FP32, as the schedule keeps it
        opt = RMSpropTF(
            params, lr=float(lr), decay=0.9, momentum=0.9, eps=1.0, weight_decay=4e-5, fused=True
        )
        if device_lr:
            opt.param_groups[0]["lr"] = lr
        with SyncCounter() as counter:
            for _ in range(3):
                for p in params:
                    p.grad = torch.randn(7)
                opt.found_inf = torch.zeros(1)
                opt.step()
        runs[device_lr] = [p.detach().clone() for p in params], counter.reads
    assert runs[True][1] == 0
    assert all(torch.equal(a, b) for a, b in zip(runs[False][0], runs[True][0]))


def test_the_unmultiplied_group_comes_first_for_the_logged_lr():
    """A model whose first parameter is a bias (a norm layer first) still logs the base LR."""
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2))
    o = optim_cfg(lr=0.1, norm_lr_mult=3.0, bias_lr_mult=2.0)
    lrs = [g["lr"] for g in optimizer_factory(o)(model.named_parameters()).param_groups]
    assert lrs == pytest.approx([0.1, 0.3, 0.2])


def test_groups_added_later_without_names_are_accepted():
    opt = optimizer_factory(optim_cfg(bias_lr_mult=2.0))(Zoo().named_parameters())
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))], "lr": 0.5})
    assert opt.param_groups[-1]["lr"] == 0.5
