"""The recipe switch (conf/recipe, conf/experiment_recipe): NVIDIA Caffe's caffe-0.16 FP16 solvers
and nets for the five Caffe networks, each experiment's default recipe for Table 1, the refusal of
a recipe an experiment does not have, what reaches the optimizer and the model, and the recipe in
run.json. The expected values are the prototxts' (NVIDIA/caffe @b2622fae264d, cited in each
conf/experiment_recipe/<experiment>_nvcaffe.yaml and docs/recipes.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import compose, read_run, run_cli

from mpt_repro.config import options, recipes, validate
from mpt_repro.errors import ConfigError
from mpt_repro.models import build_model
from mpt_repro.optim import optimizer_factory

CAFFE_NETS = ("alexnet", "vgg16", "googlenet", "inception_v2", "inception_v3")

# experiment: (batch, base_lr, weight_decay, epochs = max_iter x batch / 1,281,167 rounded)
SOLVERS = {
    "alexnet": (256, 0.01, 5e-4, 60),  # 300,000 x 256
    "vgg16": (32, 0.005, 5e-4, 60),  # 2,400,000 x 32
    "googlenet": (64, 0.01, 2e-4, 60),  # 1,200,000 x 64
    "inception_v2": (32, 0.05, 2e-4, 60),  # 2,400,000 x 32
    "inception_v3": (32, 0.05, 1e-4, 60),  # 2,400,000 x 32
}


@pytest.mark.parametrize("experiment", CAFFE_NETS)
def test_nvcaffe_solver_values_reach_the_composed_config(experiment):
    cfg = compose([f"experiment={experiment}", "recipe=nvcaffe"])
    validate(cfg)
    batch, lr, wd, epochs = SOLVERS[experiment]
    o = cfg.optim
    assert cfg.recipe == "nvcaffe"
    assert (o.name, o.momentum, o.lr, o.weight_decay) == ("sgd", 0.9, lr, wd)
    assert (o.schedule, o.power) == ("poly", 2.0)  # lr_policy "poly", power 2
    assert (o.bias_lr_mult, o.bias_decay_mult) == (1.0, 1.0)  # no `param` blocks
    assert (o.norm_lr_mult, o.norm_decay_mult) == (1.0, 1.0)  # BN scale_bias: lr 1, decay 1
    assert o.grad_clip is None and cfg.model.label_smoothing == 0.0 and o.ema_decay is None
    assert (cfg.data.batch_size, cfg.trainer.epochs) == (batch, epochs)
    assert abs(epochs * 1281167 / batch - {256: 3e5, 32: 2.4e6, 64: 1.2e6}[batch]) < 0.002 * 2.4e6
    assert cfg.data.augmentation == "caffe"  # random crop + mirror of a square image


def test_nvcaffe_net_settings_per_network():
    g = compose(["experiment=googlenet", "recipe=nvcaffe"]).model
    assert (g.dropout, g.aux_dropout, g.aux_weight) == (0.5, 0.5, 0.3)  # BVLC: 0.4, 0.7, 0.3
    v3 = compose(["experiment=inception_v3", "recipe=nvcaffe"])
    assert (v3.model.dropout, v3.model.aux_weight, v3.model.aux_logits) == (0.0, 0.3, True)
    assert (v3.data.image_size, v3.data.resize_size) == (299, 320)  # 299 crops of 320x320
    assert compose(["experiment=vgg16", "recipe=nvcaffe"]).model.variant == "caffe"
    v2 = compose(["experiment=inception_v2", "recipe=nvcaffe"]).model
    assert (v2.aux_weight, v2.dropout) == (0.3, 0.0)


def test_each_experiment_has_its_table_1_default_and_the_other_recipe_on_request():
    defaults = {e: compose([f"experiment={e}"]).recipe for e in options("experiment")}
    assert {e for e, r in defaults.items() if r == "nvcaffe"} == {
        "vgg16",
        "inception_v2",
        "inception_v3",
    }
    for experiment in CAFFE_NETS:
        assert recipes(experiment) == ["nvcaffe", "public"]
        other = "public" if defaults[experiment] == "nvcaffe" else "nvcaffe"
        assert compose([f"experiment={experiment}", f"recipe={other}"]).recipe == other
    # the public recipes are what they were: e.g. Inception v3's TensorFlow RMSProp
    public = compose(["experiment=inception_v3", "recipe=public"]).optim
    assert (public.name, public.lr, public.ema_decay) == ("rmsprop_tf", 0.045, 0.9999)


@pytest.mark.parametrize("experiment", ["resnet50", "ssd", "faster_rcnn", "lstm_lm", "dcgan"])
def test_a_recipe_the_experiment_lacks_is_refused_naming_the_key(experiment):
    assert recipes(experiment) == ["public"]
    validate(compose([f"experiment={experiment}"]))
    with pytest.raises(ConfigError, match=r"recipe must be one of .*public"):
        validate(compose([f"experiment={experiment}", "recipe=nvcaffe"]))


def settings(experiment: str, *overrides: str):
    cfg = compose([f"experiment={experiment}", *overrides])
    with torch.device("meta"):
        model = build_model(cfg.model, num_classes=1000, channels=3, image_size=224)
    opt = optimizer_factory(cfg.optim)(model.named_parameters())
    return {n: (g["lr"], g["weight_decay"]) for g in opt.param_groups for n in g["names"]}


def test_nvcaffe_biases_train_like_weights_where_bvlc_doubled_them():
    nv = settings("alexnet", "recipe=nvcaffe")
    assert set(nv.values()) == {(0.01, 5e-4)}  # every parameter: lr x1, decayed
    bvlc = settings("alexnet", "recipe=public")
    biases = {v for n, v in bvlc.items() if n.endswith("bias")}
    weights = {v for n, v in bvlc.items() if n.endswith("weight")}
    assert (biases, weights) == ({(0.02, 0.0)}, {(0.01, 5e-4)})  # lr_mult 2, decay_mult 0


def test_vgg16_caffe_variant_has_the_prototxt_fillers():
    cfg = compose(["experiment=vgg16", "recipe=nvcaffe"])
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=1000, channels=3, image_size=32)
    assert sum(p.numel() for p in model.parameters()) == 138357544
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    fcs = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(convs) == 13 and len(fcs) == 3
    for c in convs:  # "xavier": U(+-sqrt(3 / fan_in)), bias 0.1
        bound = (3 / c.weight[0].numel()) ** 0.5
        assert 0.95 * bound < float(c.weight.detach().abs().max()) <= bound * (1 + 1e-6)
        assert torch.all(c.bias == 0.1)
    for f in fcs:  # gaussian std 0.01, bias 0
        assert float(f.weight.detach().std()) == pytest.approx(0.01, rel=0.01)
        assert torch.all(f.bias == 0.0)
    # torchvision's own initialisation under recipe=public: biases 0, not 0.1
    public = compose(["experiment=vgg16", "recipe=public"])
    assert public.model.variant == "torchvision"
    tv = build_model(public.model, num_classes=1000, channels=3, image_size=32)
    assert torch.all(next(m for m in tv.modules() if isinstance(m, torch.nn.Conv2d)).bias == 0)


@pytest.mark.slow
def test_the_recipe_is_in_run_json_and_a_non_default_one_in_the_run_directory(tmp_path: Path):
    run_cli(
        "experiment=alexnet",
        "recipe=nvcaffe",
        "budget=smoke",
        "data=synthetic",
        "precision=fp32",
        f"paths.runs_dir={tmp_path}",
    )
    (run_json,) = tmp_path.rglob("run.json")
    assert "recipe=nvcaffe" in run_json.parent.name
    rec = read_run(run_json.parent)
    assert rec["status"] == "completed" and rec["config"]["recipe"] == "nvcaffe"
    assert rec["config"]["optim"]["schedule"] == "poly"
