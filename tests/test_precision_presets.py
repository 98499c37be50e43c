"""The presets in conf/precision/: they compose, validate, say what they are, change nothing
outside precision.*, and each trains a tiny BN CNN on real data (sklearn digits) with a falling
loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import CONF_DIR, compose
from omegaconf import OmegaConf
from test_precision import PRESETS
from torch import nn

from mpt_repro.config import validate
from mpt_repro.errors import ConfigError
from mpt_repro.precision import PrecisionPolicy

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (conftest)


PRESET_NAMES = sorted(p.stem for p in (Path(CONF_DIR) / "precision").glob("*.yaml"))
ALL = {"fp32", "tf32", "amp", "mixed", "no_master", "no_scaling", "fp16", "bf16", "adaptive"}
ALL |= {"fp8_e5m2_emulated", "fp8_hybrid_emulated", "fp8", "fp8_rowwise"}  # issue 16
ALL |= {"pseudo_fp16"}  # issue 25: the paper §4.3 speech runs
ALL |= {"mxfp8_emulated", "mxfp8_hybrid_emulated", "mxfp6_emulated", "mxfp4_emulated"}  # issue 46
HARDWARE_FP8 = {"fp8", "fp8_rowwise"}  # torchao float8: FP8 tensor cores, or its emulation


def torchao_missing() -> bool:
    try:
        import torchao.float8  # noqa: F401
    except Exception:
        return True
    return False


def preset_cfg(preset: str):
    """The preset's PrecisionConfig on a CPU: torchao's FP8 presets in torchao's emulation."""
    extra = ["precision.fp8.torchao_emulate=true"] if preset in HARDWARE_FP8 else []
    return compose(["experiment=demo", f"precision={preset}", *extra])


def test_the_preset_set():
    assert set(PRESET_NAMES) == ALL


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_preset_composes_validates_and_names_itself(preset):
    cfg = compose(["experiment=demo", f"precision={preset}"])
    validate(cfg)
    p = cfg.precision
    assert p.name == preset
    header = (Path(CONF_DIR) / "precision" / f"{preset}.yaml").read_text().split("\nname:")[0]
    assert header.startswith("#") and "§" in header  # what it switches, and the paper section
    if preset in PRESETS:  # the unit tests' knob table is the preset files' content
        for k, v in PRESETS[preset].items():
            assert getattr(p, k) == v, f"{preset}: precision.{k}"
    if preset in HARDWARE_FP8 and torchao_missing():
        with pytest.raises(ConfigError, match="pip install torchao"):
            PrecisionPolicy(p, "cpu", paper_loss_scale=cfg.paper_loss_scale)
        return
    pol = PrecisionPolicy(p, "cpu", paper_loss_scale=cfg.paper_loss_scale)
    assert pol.describe().startswith(f"{preset}: ")


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_switching_preset_changes_nothing_outside_precision(preset):
    def rest(name):
        c = OmegaConf.to_container(compose(["experiment=demo", f"precision={name}"]), resolve=True)
        c.pop("precision")
        return c

    assert rest(preset) == rest("fp32")


def test_paper_loss_scale_resolution():
    cfg = compose(["experiment=demo", "precision=mixed"])
    assert (
        "dynamic loss scale 65536 (experiment states no paper scale"
        in PrecisionPolicy(cfg.precision, "cpu").describe()
    )
    cfg = compose(["experiment=demo", "precision=mixed", "paper_loss_scale=512"])
    pol = PrecisionPolicy(cfg.precision, "cpu", paper_loss_scale=cfg.paper_loss_scale)
    assert "static loss scale 512 (the experiment's paper scale)" in pol.describe()
    assert pol.scaling_kind == "static"
    # the presets without a scaler ignore it
    cfg = compose(["experiment=demo", "precision=no_scaling", "paper_loss_scale=512"])
    assert PrecisionPolicy(cfg.precision, "cpu", paper_loss_scale=512).scaling_kind == "none"


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["precision=bf16", "precision.loss_scaling=dynamic"], "precision.loss_scaling"),
        (["precision=amp", "precision.master_weights=true"], "precision.master_weights"),
        (["precision=fp32", "precision.weights=low_precision"], "precision.weights"),
        (["precision=mixed", "precision.static_scale=8"], "precision.static_scale"),
        (["precision=mixed", "precision.loss_scaling=static"], "precision.static_scale"),
    ],
)
def test_contradictory_overrides_are_refused_by_validate(overrides, key):
    cfg = compose(["experiment=demo", *overrides])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


# -- every preset trains -------------------------------------------------------------------------
def digits(n=64):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:n], dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(d.target[:n])


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_every_preset_trains_a_tiny_bn_cnn(preset):
    if preset in HARDWARE_FP8 and torchao_missing():
        pytest.skip("torchao is not installed: its FP8 presets are refused (tested above)")
    cfg = preset_cfg(preset).precision
    pol = PrecisionPolicy(cfg, "cpu")
    torch.manual_seed(0)
    # FP16 convolutions are ~100x slower than FP32 on a CPU: keep it tiny
    model = nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, 10),
    )
    model = pol.prepare_model(model)
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9))
    x, y = digits()
    losses, stepped = [], 0
    n, b = 20, 16
    for i in range(n):
        xb, yb = x[(i % 4) * b : (i % 4 + 1) * b], y[(i % 4) * b : (i % 4 + 1) * b]
        opt.zero_grad()
        with pol.autocast():
            loss = nn.functional.cross_entropy(model(pol.cast_inputs(xb)), yb)
        opt.backward(loss)
        stepped += opt.step(clip_grad_norm=5.0)
        losses.append(loss.item())
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.85 * first, (preset, losses)
    assert stepped >= n - 4  # at most a few overflow skips while the dynamic scale settles
    s = pol.summary()
    assert s["steps"] == n and s["skipped_steps"] == n - stepped
