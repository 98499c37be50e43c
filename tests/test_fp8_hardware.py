"""Hardware FP8 through torchao (mpt_repro/precision/fp8_hardware.py, presets fp8 and
fp8_rowwise): clear refusals without torchao or without FP8 tensor cores, and, where torchao is
installed, the conversion and a short training run in torchao's emulation mode on the CPU."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import compose
from torch import nn

from mpt_repro.errors import ConfigError
from mpt_repro.precision import fp8
from mpt_repro.precision.fp8_hardware import (
    apply_torchao_float8,
    check_fp8_device,
    torchao_plan,
    validate_hardware,
)
from mpt_repro.precision.fp8_modules import apply_fp8

pytestmark = pytest.mark.usefixtures("one_thread")


def _torchao_usable() -> bool:
    """Importable and built for this torch (a mismatched wheel fails at import: skip, not fail)."""
    if importlib.util.find_spec("torchao") is None:
        return False
    try:
        import torchao.float8  # noqa: F401
    except Exception:
        return False
    return True


needs_torchao = pytest.mark.skipif(
    not _torchao_usable(), reason="torchao is not installed (or not built for this torch)"
)


def preset(name, *overrides):
    return compose(["experiment=demo", f"precision={name}", *overrides]).precision


@pytest.mark.parametrize("name", ["fp8", "fp8_rowwise"])
def test_presets_validate_and_describe(name):
    p = preset(name)
    fp8.validate_fp8(p)
    assert fp8.fp8_mode(p) == "torchao" and p.compute_dtype.name == "bfloat16"
    assert "torchao float8" in fp8.describe_fp8(p) and p.fp8.recipe.name in fp8.describe_fp8(p)


def test_without_torchao_the_refusal_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails, installed or not
    with pytest.raises(ConfigError, match="pip install torchao"):
        validate_hardware(preset("fp8", "precision.fp8.torchao_emulate=true"), "cpu")


def test_devices_without_fp8_tensor_cores_are_refused(monkeypatch):
    with pytest.raises(
        ConfigError, match="needs a CUDA GPU with FP8 tensor cores; this run is on cpu"
    ):
        check_fp8_device("cpu", emulate=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    with pytest.raises(ConfigError, match=r"compute capability >= 8\.9.*A100 has 8\.0"):
        check_fp8_device("cuda:0", emulate=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    check_fp8_device("cuda:0", emulate=False)  # Hopper passes
    check_fp8_device("cpu", emulate=True)  # torchao's emulation runs anywhere


def test_other_modes_need_nothing_from_the_hardware():
    validate_hardware(preset("fp32"), "cpu")
    validate_hardware(preset("fp8_hybrid_emulated"), "cpu")


def mlp():
    # first and last are exempt by default; the middle layer is converted
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )


def test_the_plan_respects_exemptions_and_the_multiple_of_16_rule():
    p = preset("fp8", "precision.fp8.exempt=[first]")
    # 10 outputs: not a multiple of 16
    assert torchao_plan(mlp(), p) == {"converted": ["2"], "exempt": ["0"], "skipped_dims": ["4"]}


def _paper_models(experiment: str, name: str) -> tuple[list[nn.Module], object]:
    """The experiment's models at the paper budget, on the meta device (no memory), built as its
    task builds them; and the preset's precision config."""
    from mpt_repro.models import build_model

    cfg = compose([f"experiment={experiment}", f"precision={name}"])
    m, d = cfg.model, cfg.data
    with torch.device("meta"):
        if cfg.task == "classification":
            built = build_model(
                m, num_classes=d.num_classes, channels=d.channels, image_size=d.image_size
            )
            models = [built]
        elif cfg.task == "detection":  # the background is a class
            models = [build_model(m, num_classes=d.num_classes + 1, image_size=d.image_size)]
        elif cfg.task == "gan":
            pair = build_model(m, channels=d.channels, image_size=d.image_size)
            models = [pair.generator, pair.discriminator]
        elif cfg.task == "speech":  # characters
            from mpt_repro.data.speech import ALPHABET

            models = [build_model(m, vocab_size=len(ALPHABET))]
        elif cfg.task == "translation":
            models = [
                build_model(m, source_vocab=m.source_vocab_size, target_vocab=m.target_vocab_size)
            ]
        else:  # the 1B-word benchmark's vocabulary (words seen >= 3 times)
            models = [build_model(m, vocab_size=793_471)]
    return models, cfg.precision


# experiments whose every model has an nn.Linear torchao converts under the default exemptions
# (first and last layer): the classifiers' FC layers, the detectors' fc6/fc7, the aux heads' FC,
# DeepSpeech 2's fully connected layer, the seq2seq model's attention and output projections
ACCEPTED = ["alexnet", "faster_rcnn", "googlenet", "inception_v2", "scaling_matters", "speech"]
ACCEPTED += ["translation", "vgg16"]


@pytest.mark.parametrize("name", ["fp8", "fp8_rowwise"])
def test_the_fp8_presets_convert_a_layer_of_every_experiment_they_accept(name):
    """ResNet-50's only linear layer is the exempt 1000-class head: precision=fp8 would train it
    in BF16 under an FP8 name, so it is refused, before torchao or a GPU is needed."""
    from mpt_repro.config import options

    accepted = []
    for experiment in options("experiment"):
        models, p = _paper_models(experiment, name)
        plans = [torchao_plan(model, p) for model in models]
        if all(plan["converted"] for plan in plans):
            accepted.append(experiment)
            continue
        refused = next(model for model, plan in zip(models, plans) if not plan["converted"])
        with pytest.raises(ConfigError, match=f"precision={name} converts no layer of"):
            apply_torchao_float8(refused, p)
    assert accepted == ACCEPTED
    models, p = _paper_models("resnet50", name)
    with pytest.raises(ConfigError) as refusal:
        apply_torchao_float8(models[0], p)
    assert str(refusal.value) == (
        f"precision={name} converts no layer of PreActResNet to FP8: torchao converts nn.Linear "
        "layers only (exempt by precision.fp8.exempt: fc), so the run would train in BF16 under "
        "an FP8 name. Use precision=bf16 for this model, or an experiment with large linear "
        "layers (alexnet, vgg16, faster_rcnn); precision.fp8.exempt=[first] converts the last "
        "layer where its sizes allow"
    )


@needs_torchao
def test_conversion_follows_the_plan_and_compiles_each_converted_layer():
    from torchao.float8.float8_linear import Float8Linear

    p = preset("fp8", "precision.fp8.torchao_emulate=true", "precision.fp8.exempt=[first]")
    m = apply_fp8(mlp(), p)
    assert type(m[0]) is nn.Linear and isinstance(m[2], Float8Linear)
    assert type(m[4]) is nn.Linear  # 10 outputs: not a multiple of 16
    assert m._fp8_hardware == {
        "converted": ["2"],
        "exempt": ["0"],
        "skipped_dims": ["4"],
        "compiled": True,
    }
    assert m[2]._compiled_call_impl is not None  # nn.Module.compile(): compiled in place


@needs_torchao
def test_refused_on_cpu_without_emulation():
    with pytest.raises(ConfigError, match="FP8 tensor cores"):
        apply_torchao_float8(mlp(), preset("fp8"))


@needs_torchao
@pytest.mark.parametrize("name", ["fp8", "fp8_rowwise"])
def test_torchao_emulation_trains_on_digits(name):
    from sklearn.datasets import load_digits

    # eager: the numerics are the point here, and inductor would compile for a minute on a CPU
    p = preset(name, "precision.fp8.torchao_emulate=true", "precision.fp8.compile=false")
    torch.manual_seed(0)
    m = apply_fp8(mlp(), p)
    d = load_digits()
    x = torch.tensor(d.data[:256], dtype=torch.float32) / 16.0
    y = torch.tensor(d.target[:256])
    # the converted layer computes on FP8 values: close to, but not, its FP32 result
    h = torch.relu(m[0](x[:32]))
    ref = F.linear(h, m[2].weight, m[2].bias)
    out = m[2](h)
    assert not torch.equal(out, ref)
    assert ((out - ref).norm() / ref.norm()).item() < 0.1
    opt = torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for step in range(30):
        i = (step % 8) * 32
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the preset's compute dtype
            loss = F.cross_entropy(m(x[i : i + 32]).float(), y[i : i + 32])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
