"""Refuse precision knob combinations that make no sense, with a message naming the keys."""
from __future__ import annotations

from typing import Optional

from mpt_repro.errors import ConfigError


def _name(v) -> str:
    return getattr(v, "name", v)  # an Enum member (OmegaConf) or its string


def validate_precision(p, paper_loss_scale: Optional[float] = None) -> None:
    dtype, scaling, weights = _name(p.compute_dtype), _name(p.loss_scaling), _name(p.weights)
    if not p.name:
        raise ConfigError("precision.name must name the preset (the run directory uses it).")
    if p.master_weights and weights == "fp32_autocast":
        raise ConfigError(
            "precision.master_weights=true needs precision.weights=low_precision: with FP32 weights "
            "(autocast) the weights already are the FP32 master copy."
        )
    if dtype == "float32" and weights == "low_precision":
        raise ConfigError(
            "precision.weights=low_precision with precision.compute_dtype=float32: there is no low precision "
            "to store the weights in. Use precision.weights=fp32_autocast or compute_dtype=float16/bfloat16."
        )
    if dtype == "float32" and scaling != "none":
        raise ConfigError(
            f"precision.loss_scaling={scaling} with precision.compute_dtype=float32: FP32 gradients have the "
            "range, there is nothing to protect. Use precision.loss_scaling=none."
        )
    if dtype == "bfloat16" and scaling != "none":
        raise ConfigError(
            f"precision.loss_scaling={scaling} with precision.compute_dtype=bfloat16: bfloat16 has FP32's "
            "exponent range, so loss scaling is meaningless. Use precision.loss_scaling=none."
        )
    if scaling == "static" and not (p.static_scale and p.static_scale > 0):
        raise ConfigError("precision.loss_scaling=static needs precision.static_scale > 0 (e.g. precision.static_scale=128).")
    if p.static_scale is not None and scaling != "static":
        raise ConfigError(
            f"precision.static_scale={p.static_scale} is only used with precision.loss_scaling=static "
            f"(got precision.loss_scaling={scaling}); for the paper's per-experiment constant set the "
            "top-level paper_loss_scale and precision.loss_scaling=paper."
        )
    if scaling == "adaptive" and dtype != "float16":
        raise ConfigError(f"precision.loss_scaling=adaptive needs precision.compute_dtype=float16 (got {dtype}).")
    if scaling not in ("none", "paper"):
        from mpt_repro.precision.scalers import SCALERS

        if scaling not in SCALERS:
            raise ConfigError(
                f"precision.loss_scaling={scaling} has no scaler implementation registered "
                f"(available: none, paper, {', '.join(sorted(SCALERS))})."
            )
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
