"""The models: conf/model/<name>.yaml sets `name`, and build_model finds its builder through the
registry (mpt_repro/registry.py, extension point "model"): the suite's own here, registered
where each is defined (`@register_model("resnet50")`), and a plugin's, by import path
(`registry.model("my_net", "my_package.nets:build")`) or by the same decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from mpt_repro import registry
from mpt_repro.errors import ConfigError

# {name: builder} of the models registered so far (the registry's own dict; a plugin's model
# registered by import path holds its path until the first build imports it)
MODELS: dict[str, Callable[..., nn.Module] | str] = registry.entries("model")


def register_model(name: str) -> Callable:
    """Function decorator: the builder of model `name`, called as fn(model_cfg, **data shapes).
    A name another module registered is refused (ConfigError naming both modules)."""

    def add(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        return registry.register("model", name, fn, fn.__module__)

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
    name = "custom" if custom else str(model_cfg.name)  # your own model: its factory the target
    builder = _load(name)
    if builder is None:
        raise ConfigError(
            f"model.name={model_cfg.name!r} is not a known model; known: {registry.names('model')}"
        )
    return builder(model_cfg, **data_info)


def _load(name: str) -> Callable[..., nn.Module] | None:
    """The builder of model `name`: a plugin's (imported from the path it registered), or the
    suite's own, whose module is imported alone (the registry finds the module whose source
    registers the name: importing every module loads torchvision, and with it torch._dynamo, 2 s
    of CPU a run of a model that needs neither); every module when no source names it."""
    builder = registry.lookup("model", name)
    if builder is None:
        _load_all()
        builder = registry.lookup("model", name)
    return builder


def _load_all() -> None:
    # Importing the modules registers their builders.
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
