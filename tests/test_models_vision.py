"""The Table 1 ImageNet models and experiments: architecture sizes, tiny forward/backward passes,
config composition under every budget, and (when the trainer exists) smoke runs through mpt-run."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import ROOT, compose, option_config, read_run, run_cli
from omegaconf import OmegaConf

from mpt_repro.config import validate
from mpt_repro.errors import ConfigError, DataError
from mpt_repro.models import build_model

EXPERIMENTS = ["alexnet", "vgg16", "googlenet", "inception_v2", "inception_v3", "resnet50"]


def model_cfg(name: str, **kw):
    return option_config("model", name=name, **kw)


def n_params(model: torch.nn.Module, skip_aux: bool = True) -> int:
    return sum(
        p.numel()
        for k, p in model.named_parameters()
        if not (skip_aux and k.lower().startswith("aux"))
    )


# Published sizes at 1000 classes (torchvision's model cards), without auxiliary heads. The Caffe
# networks' exact counts are in tests/test_models_caffe.py.
PUBLISHED = [
    ("alexnet", {"variant": "torchvision"}, 61.10e6),
    ("vgg16", {}, 138.36e6),
    ("googlenet", {"variant": "torchvision", "aux_logits": True}, 6.62e6),
    ("inception_v3", {"aux_logits": True}, 23.83e6),
    ("resnet50", {"variant": "torchvision"}, 25.56e6),
    ("resnet50", {"variant": "preact"}, 25.55e6),
]


@pytest.mark.parametrize(
    "name,kw,expected", PUBLISHED, ids=[f"{n}-{k.get('variant', '')}" for n, k, _ in PUBLISHED]
)
def test_parameter_counts_match_published(name, kw, expected):
    # The meta device allocates nothing: counting 138 M parameters costs no memory or init time.
    with torch.device("meta"):
        model = build_model(model_cfg(name, **kw), num_classes=1000, channels=3, image_size=299)
    assert n_params(model) == pytest.approx(expected, rel=0.01)


def test_aux_heads_add_their_published_size():
    with torch.device("meta"):
        g = build_model(
            model_cfg("googlenet", variant="torchvision", aux_logits=True),
            num_classes=1000,
            channels=3,
            image_size=224,
        )
        v3 = build_model(
            model_cfg("inception_v3", aux_logits=True), num_classes=1000, channels=3, image_size=299
        )
    assert n_params(g, skip_aux=False) == pytest.approx(13.0e6, rel=0.01)
    assert n_params(v3, skip_aux=False) == pytest.approx(27.16e6, rel=0.01)


def test_bn_inception_follows_the_prototxt():
    """Module output widths and grid sizes of default_googlenet_v2/train_val.prototxt at 224 px
    (the BN paper's table, except 4c/4d's pool projections: 96, so 576 channels out)."""
    from mpt_repro.models.bn_inception import BNInception

    with torch.device("meta"):
        net = BNInception(1000)
        x = net.stem(torch.empty(1, 3, 224, 224))
        assert tuple(x.shape[1:]) == (192, 28, 28)
        shapes = []
        for module in net.inception:
            x = module(x)
            shapes.append(tuple(x.shape[1:]))
    widths = [s[0] for s in shapes]
    assert widths == [256, 320, 576, 576, 576, 576, 576, 1024, 1024, 1024]
    assert (
        shapes[1][1:] == (28, 28)
        and shapes[2][1:] == (14, 14)
        and shapes[7][1:] == (7, 7)
        and shapes[9][1:] == (7, 7)
    )
    # Every convolution is followed by batch norm and has no bias (BN makes it redundant).
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.bias is None for c in convs)
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules()) == len(convs)


def test_preact_resnet_is_pre_activation():
    from mpt_repro.models.preact_resnet import PreActBottleneck, preact_resnet50

    net = preact_resnet50(10)
    blocks = [m for m in net.modules() if isinstance(m, PreActBottleneck)]
    assert len(blocks) == 16  # [3, 4, 6, 3]
    # The first unit reuses the stem's BN-ReLU; every other unit normalises its own input.
    assert blocks[0].bn1 is None and all(b.bn1 is not None for b in blocks[1:])
    # Nothing after the addition: a unit's output can be negative (a post-activation ResNet's
    # cannot).
    torch.manual_seed(0)
    out = blocks[1](torch.randn(2, 256, 8, 8))
    assert (out < 0).any()
    # One BN-ReLU after the last unit, before pooling.
    assert isinstance(net.head[0], torch.nn.BatchNorm2d) and isinstance(net.head[1], torch.nn.ReLU)


TINY = [
    ("alexnet", {}, 63),
    ("alexnet", {"variant": "torchvision"}, 63),
    ("vgg16", {}, 32),
    ("googlenet", {"aux_logits": True}, 32),
    ("googlenet", {"variant": "torchvision", "aux_logits": True}, 32),
    ("inception_v2", {"aux_logits": True}, 32),
    ("inception_v3", {}, 75),
    ("resnet50", {"variant": "preact"}, 32),
    ("resnet50", {"variant": "torchvision"}, 32),
]


@pytest.mark.parametrize(
    "name,kw,size", TINY, ids=[f"{n}-{k.get('variant', '')}" for n, k, _ in TINY]
)
def test_forward_backward_at_smallest_size(name, kw, size):
    torch.manual_seed(0)
    model = build_model(model_cfg(name, **kw), num_classes=10, channels=3, image_size=size).train()
    out = model(torch.randn(2, 3, size, size))
    heads = [out] if isinstance(out, torch.Tensor) else [o for o in out if o is not None]
    assert len(heads) == (3 if kw.get("aux_logits") else 1)  # main + two auxiliary heads
    assert all(h.shape == (2, 10) for h in heads)
    sum(torch.nn.functional.cross_entropy(h, torch.tensor([1, 2])) for h in heads).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, size, size)).shape == (2, 10)  # eval: main head only


def test_too_small_or_wrong_input_is_a_config_error():
    with pytest.raises(ConfigError, match="image_size >= 75"):
        build_model(model_cfg("inception_v3"), num_classes=10, channels=3, image_size=64)
    with pytest.raises(ConfigError, match="image_size >= 299"):
        build_model(
            model_cfg("inception_v3", aux_logits=True), num_classes=10, channels=3, image_size=224
        )
    with pytest.raises(ConfigError, match="RGB"):
        build_model(model_cfg("resnet50"), num_classes=10, channels=1, image_size=224)
    with pytest.raises(ConfigError, match="model.variant"):
        build_model(
            model_cfg("resnet50", variant="resnext"), num_classes=10, channels=3, image_size=224
        )


def test_resnet50_variant_defaults_to_preact():
    from mpt_repro.models.preact_resnet import PreActResNet

    assert isinstance(
        build_model(model_cfg("resnet50"), num_classes=10, channels=3, image_size=32), PreActResNet
    )
    assert compose(["experiment=resnet50"]).model.variant == "preact"


# Experiments ---------------------------------------------------------------------------------

# experiment: (model, image size, batch, epochs, lr) under its default recipe for Table 1
# (vgg16, inception_v2, inception_v3: NVIDIA Caffe's; docs/recipes.md, test_recipes_nvcaffe.py)
PAPER = {
    "alexnet": ("alexnet", 227, 256, 90, 0.01),
    "vgg16": ("vgg16", 224, 32, 60, 0.005),
    "googlenet": ("googlenet", 224, 32, 60, 0.01),
    "inception_v2": ("inception_v2", 224, 32, 60, 0.05),
    "inception_v3": ("inception_v3", 299, 32, 60, 0.05),
    "resnet50": ("resnet50", 224, 256, 90, 0.1),
}


@pytest.mark.parametrize("exp", EXPERIMENTS)
@pytest.mark.parametrize("budget", ["paper", "short", "smoke"])
def test_experiment_composes_and_validates(exp, budget):
    cfg = compose([f"experiment={exp}", f"budget={budget}"])
    validate(cfg)
    model, size, batch, epochs, lr = PAPER[exp]
    assert cfg.experiment_name == exp and cfg.model.name == model and cfg.data.name == "imagenet"
    assert cfg.task == "classification" and cfg.budget.name == budget
    assert cfg.data.num_classes == 1000 and cfg.data.channels == 3 and cfg.data.root is None
    assert cfg.optim.lr == lr  # the recipe's LR under every budget
    if budget == "paper":
        assert (cfg.data.image_size, cfg.data.batch_size, cfg.trainer.epochs) == (
            size,
            batch,
            epochs,
        )
        assert cfg.trainer.max_steps is None and cfg.data.train_limit is None
    elif budget == "short":
        assert (cfg.data.image_size, cfg.data.batch_size) == (size, batch)
        assert cfg.trainer.epochs <= 5 and cfg.data.train_limit == 128000
    else:
        assert cfg.data.image_size <= 75 and cfg.data.batch_size <= 4
        assert (
            cfg.trainer.max_steps <= 4 and cfg.data.train_limit <= 8 and cfg.data.num_workers == 0
        )
        # The smoke size must be one the model accepts.
        with torch.device("meta"):
            build_model(cfg.model, num_classes=1000, channels=3, image_size=cfg.data.image_size)


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_synthetic_data_keeps_the_experiment_shape(exp):
    cfg = compose([f"experiment={exp}", "data=synthetic"])
    assert cfg.data.name == "synthetic"
    assert (cfg.data.image_size, cfg.data.num_classes, cfg.data.channels) == (
        PAPER[exp][1],
        1000,
        3,
    )


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_same_recipe_under_every_precision(exp):
    base = compose([f"experiment={exp}", "precision=fp32"])
    for preset in ("mixed", "amp"):
        other = compose([f"experiment={exp}", f"precision={preset}"])
        for group in ("data", "model", "optim", "trainer"):
            assert OmegaConf.to_container(other[group]) == OmegaConf.to_container(base[group]), (
                preset,
                group,
            )


def test_missing_root_is_a_data_error_that_names_the_fix():
    from mpt_repro.data import build_image_data

    cfg = compose(["experiment=resnet50", "budget=smoke"])
    with pytest.raises(DataError, match="data.root") as err:
        build_image_data(cfg.data)
    assert "data=synthetic" in str(err.value) and "train/" in str(err.value)


def test_cli_without_root_exits_with_the_message(tmp_path):
    proc = run_cli(
        "experiment=resnet50", "budget=smoke", run_dir=tmp_path / "run", check=False, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "data.root" in proc.stderr and "data=synthetic" in proc.stderr
    assert "Traceback" not in proc.stderr


# End-to-end smoke runs through mpt-run (trainer + classification task) ------------------------


def smoke_run(exp: str, precision: str, tmp_path) -> dict:
    run_dir = tmp_path / f"{exp}-{precision}"
    start = time.time()
    run_cli(
        f"experiment={exp}",
        "budget=smoke",
        "data=synthetic",
        f"precision={precision}",
        run_dir=run_dir,
        timeout=600,
    )
    record = read_run(run_dir)
    record["_wall_s"] = time.time() - start
    return record


def check_record(record: dict, exp: str, precision: str) -> None:
    assert record["status"] == "completed", record.get("reason")
    assert record["experiment"] == exp and record["precision"] == precision and record["steps"] == 2
    assert record["model"]["name"] == PAPER[exp][0]
    assert set(record["metrics"]) >= {"loss", "top1", "top5"}


def test_resnet50_smoke_fp32_runs_end_to_end(tmp_path):
    record = smoke_run("resnet50", "fp32", tmp_path)
    check_record(record, "resnet50", "fp32")
    assert record["model"]["variant"] == "preact" and record["model"][
        "parameters"
    ] == pytest.approx(25.55e6, rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_smoke_runs_end_to_end(exp, precision, tmp_path):
    if not (ROOT / "conf" / "precision" / f"{precision}.yaml").exists():
        pytest.skip(f"no precision preset {precision}")
    check_record(smoke_run(exp, precision, tmp_path), exp, precision)
