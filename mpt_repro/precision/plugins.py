"""The precision plug-ins, found by name: loss scalers and model converters.

The policy, the optimizer and the base scaler know the plug-in interfaces (scalers.LossScaler,
converters.Converter) and no particular plug-in. Each plug-in registers itself where it is
defined (`@register_scaler("adaptive")`, `@register_converter("fp8_emulated")`); this module is
the one place that lists the built-in ones, by importing their modules, and answers the policy's
look-ups. A new plug-in: subclass, register, and add its module to the imports below (or import
it before the policy is built).
"""

from __future__ import annotations

from typing import Any

from mpt_repro.errors import ConfigError
from mpt_repro.precision import adaptive, fp8_hardware, fp8_modules, mx_modules, scalers  # noqa: F401
from mpt_repro.precision.converters import CONVERTERS, Converter
from mpt_repro.precision.scalers import SCALERS, LossScaler


def scaler_kinds() -> list[str]:
    """Every registered precision.loss_scaling kind with a scaler (none and paper have none)."""
    return sorted(SCALERS)


def build_scaler(kind: str, cfg: Any, init_scale: float | None, device: Any) -> LossScaler:
    """A fresh scaler of `kind` configured from `cfg` (a PrecisionConfig)."""
    if kind not in SCALERS:
        raise ConfigError(
            f"precision.loss_scaling={kind} has no scaler implementation "
            f"(available: {scaler_kinds()})."
        )
    return SCALERS[kind](cfg, init_scale, device)


def converters_for(cfg: Any, device: Any) -> list[Converter]:
    """The converters a PrecisionConfig asks for, built for `device`, in registration order."""
    return [cls(cfg, device) for cls in CONVERTERS.values() if cls.wanted(cfg)]
