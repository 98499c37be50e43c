"""Model registry: conf/model/<name>.yaml sets `name`, and build_model finds the builder here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from mpt_repro.errors import ConfigError

MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable:
    def add(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        MODELS[name] = fn
        return fn

    return add


def he_init_(model: nn.Module) -> nn.Module:
    """He et al. 2015 initialisation for convolutions (fan-out, ReLU gain) and unit/zero batch-norm
    affine parameters: what the BVLC/fb.resnet.torch recipes and torchvision use."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def build_model(model_cfg: Any, **data_info: Any) -> nn.Module:
    """Build `model_cfg.name` (or a custom model's factory); data_info carries shapes from the
    data (num_classes, channels, vocab_size...).
    """
    from mpt_repro.identity import is_custom_model

    custom = is_custom_model(model_cfg)
    _load("custom" if custom else str(model_cfg.name))
    if custom:  # your own model: its name is yours, its factory the target
        return MODELS["custom"](model_cfg, **data_info)
    if model_cfg.name not in MODELS:
        raise ConfigError(
            f"model.name={model_cfg.name!r} is not a known model; known: {sorted(MODELS)}"
        )
    return MODELS[model_cfg.name](model_cfg, **data_info)


def _load(name: str) -> None:
    """Register the builder of model `name`: the module whose source registers it is imported
    alone (importing every module loads torchvision, and with it torch._dynamo: 2 s of CPU a
    run of a model that needs neither); every module when no source names it."""
    import importlib
    import re
    from pathlib import Path

    if name in MODELS:
        return
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if re.search(rf"@register_model\(\"{re.escape(name)}\"\)", path.read_text()):
            importlib.import_module(f"{__name__}.{path.stem}")
            if name in MODELS:
                return
    _load_all()


def _load_all() -> None:
    # Importing the modules registers their builders.
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
