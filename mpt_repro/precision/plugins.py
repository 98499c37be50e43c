"""The precision plug-ins, found by name: loss scalers and model converters.

The policy, the optimizer and the base scaler know the plug-in interfaces (scalers.LossScaler,
converters.Converter) and no particular plug-in. Each plug-in registers itself where it is
defined (`@register_scaler("adaptive")`, `@register_converter("fp8_emulated")`), or a plugin
module registers one by import path (`registry.loss_scaler("halving", "pkg.mod:Halving")`); the
registry (mpt_repro/registry.py) finds both, the suite's own by the decorator in their source,
and this module answers the policy's look-ups. Listing the kinds imports nothing (no torch): the
config check names them before a run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpt_repro import registry
from mpt_repro.errors import ConfigError

if TYPE_CHECKING:
    from mpt_repro.precision.converters import Converter
    from mpt_repro.precision.scalers import LossScaler


def scaler_kinds() -> list[str]:
    """Every registered precision.loss_scaling kind with a scaler (none and paper have none)."""
    return registry.names("loss scaler")


def build_scaler(kind: str, cfg: Any, init_scale: float | None, device: Any) -> LossScaler:
    """A fresh scaler of `kind` configured from `cfg` (a PrecisionConfig)."""
    cls = registry.lookup("loss scaler", kind)
    if cls is None:
        raise ConfigError(
            f"precision.loss_scaling={kind} has no scaler implementation "
            f"(available: {scaler_kinds()})."
        )
    scaler = cls(cfg, init_scale, device)
    scaler.kind = kind  # the name it was registered by (a class registered by import path)
    return scaler


def converters_for(cfg: Any, device: Any) -> list[Converter]:
    """The converters a PrecisionConfig asks for, built for `device`, in registration order."""
    wanted = [(n, cls) for n, cls in registry.every("converter").items() if cls.wanted(cfg)]
    built = []
    for name, cls in wanted:
        converter = cls(cfg, device)
        converter.name = name  # the name it was registered by (a class registered by path)
        built.append(converter)
    return built
