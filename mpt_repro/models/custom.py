"""Your own classifier: `model=custom model.target=package.module:factory`.

The factory is any callable that returns an `nn.Module` mapping a batch of images (N, C, H, W) to
logits (N, num_classes). It is called as `factory(num_classes=..., **model.kwargs)`; the input
shape comes from the data (data.channels, data.image_size), so a factory that needs it takes it
through model.kwargs (e.g. `+model.kwargs.in_chans=1`). The target follows Hydra's `_target_`
convention, a dotted path (`package.module.factory`), or the entry-point form with a colon
(`package.module:factory`); the module must be importable (installed, or on PYTHONPATH).

    mpt-run experiment=demo model=custom model.target=torchvision.models:resnet18 \\
        data=imagefolder data.root=DIR precision=amp     # RGB images (resnet18 takes 3 channels)
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from mpt_repro.errors import ConfigError
from mpt_repro.models import register_model
from mpt_repro.schema import split_target


def resolve_target(target: str) -> Callable[..., Any]:
    """The callable `target` names, or a ConfigError that says what is wrong and what to do."""
    module_name, attr = split_target(target)
    if not module_name or not attr:
        raise ConfigError(
            f"model.target={target!r} must name a factory as package.module:factory "
            "(or package.module.factory, Hydra's _target_ form)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"model.target={target!r}: cannot import module {module_name!r} ({e}). Install the "
            "package that holds it, or put its folder on PYTHONPATH."
        ) from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model.target={target!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"model.target={target!r} is not callable (a {type(obj).__name__})")
    return obj


@register_model("custom")
def custom(cfg: Any, num_classes: int, **_: Any) -> nn.Module:
    target = cfg.target
    if not target:
        raise ConfigError(
            "model=custom needs model.target=package.module:factory, a function returning your "
            "nn.Module classifier"
        )
    factory = resolve_target(target)
    kwargs = OmegaConf.to_container(cfg.kwargs, resolve=True) or {}
    try:  # a wrong keyword is the user's config, not a bug inside the factory: say so
        inspect.signature(factory).bind(num_classes=num_classes, **kwargs)
    except TypeError as e:
        call = ", ".join(f"{k}={v!r}" for k, v in {"num_classes": num_classes, **kwargs}.items())
        raise ConfigError(
            f"model.target={target!r} cannot be called as factory({call}): {e}. Set its other "
            "arguments with +model.kwargs.<name>=<value>."
        ) from e
    except ValueError:  # no signature to inspect (some builtins): just call it
        pass
    model = factory(num_classes=num_classes, **kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.target={target!r} returned a {type(model).__name__}, not an nn.Module"
        )
    if not any(p.requires_grad for p in model.parameters()):  # the optimizer's bare ValueError
        raise ConfigError(
            f"model.target={target!r} returned a {type(model).__name__} with no trainable "
            "parameters: there is nothing to train. Register its layers as attributes of the "
            "module (nn.Module, nn.ModuleList), not in plain lists, and leave requires_grad on"
        )
    return model
