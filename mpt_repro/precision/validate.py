"""Refuse precision knob combinations that make no sense, with a message naming the keys."""
from __future__ import annotations

from typing import Optional

from mpt_repro.errors import ConfigError


def validate_precision(p, paper_loss_scale: Optional[float] = None) -> None:
    dtype, scaling = p.compute_dtype.name, p.loss_scaling.name
    if p.master_weights and p.weights.name == "fp32_autocast":
        raise ConfigError(
            "precision.master_weights=true needs precision.weights=low_precision: with FP32 weights "
            "(autocast) the weights already are the FP32 master copy."
        )
    if dtype == "float32" and (p.weights.name == "low_precision" or scaling != "none"):
        raise ConfigError(
            f"precision.compute_dtype=float32 cannot go with precision.weights={p.weights.name} or "
            f"precision.loss_scaling={scaling}: FP32 has nothing to store in low precision and no range to protect."
        )
    if dtype == "bfloat16" and scaling != "none":
        raise ConfigError(
            f"precision.loss_scaling={scaling} with precision.compute_dtype=bfloat16: bfloat16 has FP32's "
            "exponent range, so loss scaling is meaningless. Use precision.loss_scaling=none."
        )
    if scaling == "static" and not (p.static_scale and p.static_scale > 0):
        raise ConfigError("precision.loss_scaling=static needs precision.static_scale > 0 (e.g. precision.static_scale=128).")
    if p.growth_factor <= 1:
        raise ConfigError(f"precision.growth_factor must be > 1 (got {p.growth_factor}).")
    if not 0 < p.backoff_factor < 1:
        raise ConfigError(f"precision.backoff_factor must be in (0, 1) (got {p.backoff_factor}).")
    if p.growth_interval < 1 or p.hysteresis < 1 or p.floor_patience < 1:
        raise ConfigError("precision.growth_interval, precision.hysteresis and precision.floor_patience must be >= 1.")
    if not 0 < p.min_scale <= p.init_scale <= p.max_scale:
        raise ConfigError(
            f"need 0 < precision.min_scale <= precision.init_scale <= precision.max_scale "
            f"(got {p.min_scale}, {p.init_scale}, {p.max_scale})."
        )
