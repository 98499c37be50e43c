"""Each experiment's recipe settings reach the optimizer and the model that the config builds (not
only the config), and the recipe fields are validated with messages that name the key."""

from __future__ import annotations

import pytest
import torch
from conftest import compose

from mpt_repro.config import validate
from mpt_repro.errors import ConfigError
from mpt_repro.models import build_model
from mpt_repro.optim import RMSpropTF, names_matching, optimizer_factory


def built(experiment: str, *overrides: str):
    """(cfg, model on the meta device, optimizer over its named parameters)."""
    cfg = compose([f"experiment={experiment}", *overrides])
    info = (
        {"vocab_size": 100}
        if experiment == "lstm_lm"
        else {"num_classes": 1000, "channels": 3, "image_size": cfg.data.image_size}
    )
    with torch.device("meta"):
        model = build_model(cfg.model, **info)
    opt = optimizer_factory(cfg.optim)(model.named_parameters())
    return cfg, model, opt


def settings(opt) -> dict[str, tuple[float, float]]:
    return {n: (g["lr"], g["weight_decay"]) for g in opt.param_groups for n in g["names"]}


@pytest.mark.parametrize("experiment,wd", [("alexnet", 5e-4), ("googlenet", 2e-4)])
def test_caffe_biases_train_at_twice_the_lr_without_decay(experiment, wd):
    cfg, model, opt = built(experiment)
    seen = settings(opt)
    biases = [n for n in seen if n.endswith("bias")]
    weights = [n for n in seen if n.endswith("weight")]
    assert biases and weights and len(seen) == len(biases) + len(weights)  # no BN in these nets
    assert {seen[n] for n in biases} == {(2 * cfg.optim.lr, 0.0)}
    assert {seen[n] for n in weights} == {(cfg.optim.lr, wd)}


def test_bn_inception_classifier_biases_x2_and_bn_decayed_as_caffes_scale_layers():
    cfg, model, opt = built("inception_v2", "recipe=public")  # Intel's prototxt
    seen = settings(opt)
    lr, wd = cfg.optim.lr, cfg.optim.weight_decay
    classifier_biases = sorted(n for n in seen if seen[n] == (2 * lr, 0.0))
    assert classifier_biases == ["aux1.classifier.bias", "aux2.classifier.bias", "fc.bias"]
    bn = [n for n, p in model.named_parameters() if p.dim() == 1 and "classifier" not in n]
    assert bn and all(seen[n] == (lr, wd) for n in bn if n != "fc.bias")


def test_inception_v3_public_recipe_trains_with_tf_rmsprop_smoothing_and_an_ema():
    cfg, model, opt = built("inception_v3", "recipe=public")
    assert isinstance(opt, RMSpropTF)
    d = opt.defaults
    assert (d["lr"], d["decay"], d["momentum"], d["eps"]) == (0.045, 0.9, 0.9, 1.0)
    seen = settings(opt)
    assert seen["fc.bias"] == (0.045, 0.0) and seen["Conv2d_1a_3x3.bn.weight"] == (0.045, 0.0)
    assert seen["Conv2d_1a_3x3.conv.weight"] == (0.045, 4e-5)
    o = cfg.optim
    assert (o.grad_clip, o.ema_decay, o.ema_warmup) == (2.0, 0.9999, True)
    assert cfg.model.label_smoothing == 0.1
    assert cfg.model.aux_weight == 0.4 and cfg.model.dropout == 0.2


def test_resnet50_decays_every_parameter_in_one_group():
    cfg, model, opt = built("resnet50")
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 1e-4


@pytest.mark.parametrize("budget", ["paper", "short", "smoke"])
def test_lstm_lm_gradient_recipe_is_f_lms(budget):
    cfg, model, opt = built("lstm_lm", f"budget={budget}")
    o = cfg.optim
    m = cfg.model
    assert m.loss_times_steps and m.embedding_grad_scale == cfg.data.batch_size  # per GPU
    names = [n for n, _ in model.named_parameters()]
    lstm = [n for n in names if n.startswith("lstm.")]
    assert names_matching(o.grad_clip_params, names) == lstm  # only the LSTM is clipped
    assert names_matching(o.ema_params, names) == lstm  # and averaged
    assert (o.grad_clip, o.ema_decay, o.ema_warmup) == (1.0, 0.999, False)


def test_scopes_default_to_every_parameter():
    assert names_matching(None, ["a.weight", "b.bias"]) == ["a.weight", "b.bias"]


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.bias_lr_mult=-1", "optim.bias_lr_mult"),
        ("optim.norm_decay_mult=-0.5", "optim.norm_decay_mult"),
        ("model.label_smoothing=1.0", "model.label_smoothing"),
        ("optim.ema_decay=1.0", "optim.ema_decay"),
        ("optim.alpha=1.0", "optim.alpha"),
        ("model.embedding_grad_scale=0", "model.embedding_grad_scale"),
        ("optim.grad_clip_params='lstm('", "optim.grad_clip_params"),
        ("optim.name=rmsprop_pt", "optim.name"),
        ("model.aux_weight=-0.3", "model.aux_weight"),
        ("model.noise=gaussian", "model.noise"),
    ],
)
def test_bad_recipe_values_name_the_key(override, key):
    # a model key is set on an experiment whose model has it (another model's schema lacks it)
    owners = {"model.aux_weight": "googlenet", "model.noise": "dcgan"}
    experiment = {**owners, "model.embedding_grad_scale": "lstm_lm"}.get(key, "demo")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose([f"experiment={experiment}", override]))


def test_every_paper_experiment_validates_with_its_recipe():
    for experiment in ("alexnet", "googlenet", "inception_v2", "inception_v3", "lstm_lm", "dcgan"):
        validate(compose([f"experiment={experiment}"]))
