"""Refuse precision knob combinations that make no sense, with a message naming the keys."""

from __future__ import annotations

import math
import struct

from mpt_repro.errors import ConfigError
from mpt_repro.precision.config import enum_name as _name


def validate_precision(p, paper_loss_scale: float | None = None) -> None:
    if not p.name:
        raise ConfigError("precision.name must name the preset (the run directory uses it).")
    from mpt_repro.precision import fp8_config as fp8  # no torch: refusals stay fast

    fp8.validate_fp8(p, paper_loss_scale)
    _validate_storage(p)
    _validate_arithmetic(p, fp8_on=fp8.fp8_mode(p) != "none")
    # emulated FP8 computes in FP32 on 8-bit values: its gradients need the loss scale
    _validate_scaling(p, emulated_fp8=fp8.fp8_mode(p) == "emulated")
    _validate_scale_moves(p)


def _validate_storage(p) -> None:
    dtype, weights = _name(p.compute_dtype), _name(p.weights)
    if p.master_weights and weights == "fp32_autocast":
        raise ConfigError(
            "precision.master_weights=true needs precision.weights=low_precision: with FP32 "
            "weights "
            "(autocast) the weights already are the FP32 master copy."
        )
    if dtype == "float32" and weights == "low_precision":
        raise ConfigError(
            "precision.weights=low_precision with precision.compute_dtype=float32: there is no "
            "low precision "
            "to store the weights in. Use precision.weights=fp32_autocast or "
            "compute_dtype=float16/bfloat16."
        )


def _validate_arithmetic(p, fp8_on: bool) -> None:
    if _name(getattr(p, "arithmetic", "native")) != "float32":
        return
    if _name(p.compute_dtype) != "float16" or _name(p.weights) != "low_precision":
        raise ConfigError(
            "precision.arithmetic=float32 (pseudo FP16: FP16 storage, FP32 arithmetic) needs "
            "precision.compute_dtype=float16 and precision.weights=low_precision; use "
            "precision=pseudo_fp16."
        )
    if fp8_on:
        raise ConfigError(
            "precision.arithmetic=float32 with precision.fp8.mode: 8-bit layers choose their own "
            "arithmetic. Use one or the other."
        )


def _validate_scaling(p, emulated_fp8: bool) -> None:
    dtype, scaling, weights = _name(p.compute_dtype), _name(p.loss_scaling), _name(p.weights)
    if dtype == "float32" and scaling != "none" and not emulated_fp8:
        raise ConfigError(
            f"precision.loss_scaling={scaling} with precision.compute_dtype=float32: FP32 "
            "gradients have the "
            "range, there is nothing to protect. Use precision.loss_scaling=none."
        )
    if dtype == "bfloat16" and scaling != "none":
        raise ConfigError(
            f"precision.loss_scaling={scaling} with precision.compute_dtype=bfloat16: bfloat16 "
            "has FP32's "
            "exponent range, so loss scaling is meaningless. Use precision.loss_scaling=none."
        )
    if scaling == "static" and not (p.static_scale and p.static_scale > 0):
        raise ConfigError(
            "precision.loss_scaling=static needs precision.static_scale > 0 (e.g. "
            "precision.static_scale=128)."
        )
    if p.static_scale is not None and scaling != "static":
        raise ConfigError(
            f"precision.static_scale={p.static_scale} is only used with "
            "precision.loss_scaling=static "
            f"(got precision.loss_scaling={scaling}); for the paper's per-experiment constant set "
            "the "
            "top-level paper_loss_scale and precision.loss_scaling=paper."
        )
    if scaling == "adaptive" and dtype != "float16":
        raise ConfigError(
            f"precision.loss_scaling=adaptive needs precision.compute_dtype=float16 (got {dtype})."
        )
    if scaling == "adaptive":
        _validate_adaptive(p, weights)
    if scaling not in ("none", "paper"):
        from mpt_repro.precision.plugins import scaler_kinds  # torch only for a scaler's name

        if scaling not in scaler_kinds():
            raise ConfigError(
                f"precision.loss_scaling={scaling} has no scaler implementation registered "
                f"(available: none, paper, {', '.join(scaler_kinds())})."
            )


def _validate_scale_moves(p) -> None:
    if p.growth_factor <= 1:
        raise ConfigError(f"precision.growth_factor must be > 1 (got {p.growth_factor}).")
    if not 0 < p.backoff_factor < 1:
        raise ConfigError(f"precision.backoff_factor must be in (0, 1) (got {p.backoff_factor}).")
    if p.growth_interval < 1 or p.hysteresis < 1 or p.floor_patience < 1:
        raise ConfigError(
            "precision.growth_interval, precision.hysteresis and precision.floor_patience must be "
            ">= 1."
        )
    if not 0 < p.min_scale <= p.init_scale <= p.max_scale:
        raise ConfigError(
            f"need 0 < precision.min_scale <= precision.init_scale <= precision.max_scale "
            f"(got {p.min_scale}, {p.init_scale}, {p.max_scale})."
        )


def as_fp16(x: float) -> float:
    """x rounded to float16 (IEEE half, round to nearest even), without torch."""
    try:
        return struct.unpack("<e", struct.pack("<e", x))[0]
    except OverflowError:  # beyond float16's largest finite value
        return math.copysign(math.inf, x)


def fp16_optimizer_state(p) -> bool:
    """True when the optimizer updates FP16 weights directly, so that torch keeps its state
    (momentum, moments, sums of squares) in FP16 too: no_master and fp16, or any such combination
    of precision.compute_dtype=float16, weights=low_precision and master_weights=false."""
    return (
        _name(p.compute_dtype) == "float16"
        and _name(p.weights) == "low_precision"
        and not p.master_weights
    )


def validate_optimizer_state(p, o) -> None:
    """Refuse an optimizer whose FP16 state would divide by zero (p: precision, o: optim).

    Without a master copy the optimizers below add optim.eps to an FP16 denominator that can be
    0 (a second moment or a mean square that underflowed, an accumulator that starts at 0): an
    eps that rounds to 0 in FP16 (at most 2^-25, e.g. the usual 1e-8) makes that 0 / 0 or g / 0,
    and the weight NaN or inf (pytorch issue 26218). Per optimizer (docs/precision.md, "FP16
    optimizer state"):
    - adam, adamw with optim.fused=false: the foreach path computes in FP16 (refused); the fused
      kernel (fused=auto or true) computes in FP32 and only stores FP16 (accepted);
    - rmsprop (always foreach): sqrt(v) + eps in FP16, v starts at 0 (refused);
    - rmsprop_tf: sqrt(ms + eps) with ms starting at 1; decaying, it stops at FP16's smallest
      value (0.9 x 2^-24 rounds back up to 2^-24), so the denominator is never 0 (accepted);
    - adagrad: sqrt(sum) + eps, refused only when the sum starts at 0 in FP16 too
      (optim.initial_accumulator_value; f-lm's 1.0 keeps every denominator >= 1);
    - sgd: no eps. A momentum buffer that overflows depends on the data, not on the config: the
      guard in precision/guard.py skips such steps at run time, for every optimizer.
    Needs no torch: config validation calls it before torch is imported.
    """
    if not fp16_optimizer_state(p) or as_fp16(o.eps) != 0:
        return
    name, fused = o.name, str(o.fused).lower()
    why = (
        f"optim.eps={o.eps:g} rounds to 0 in float16, the dtype of the {name} state under "
        f"precision={p.name} (no FP32 master copy)"
    )
    fix = "Set optim.eps=1e-4 (any value >= 6e-8 is held by float16)"
    if name in ("adam", "adamw") and fused == "false":
        raise ConfigError(
            f"{why}: a step whose second moment underflows divides by zero and writes inf/NaN "
            f"into the weights (pytorch issue 26218). {fix}, or optim.fused=auto (the fused "
            "kernel computes in FP32), or precision=mixed."
        )
    if name == "rmsprop":
        raise ConfigError(
            f"{why}: a step whose mean square underflows divides by zero and writes inf/NaN "
            f"into the weights (pytorch issue 26218). {fix}, or precision=mixed."
        )
    if name == "adagrad" and as_fp16(o.initial_accumulator_value) == 0:
        raise ConfigError(
            f"{why}, and so does optim.initial_accumulator_value={o.initial_accumulator_value:g}:"
            " the first step divides a gradient by sqrt(0) + 0 and writes inf/NaN into the "
            f"weights (pytorch issue 26218). {fix}, or optim.initial_accumulator_value=1.0 (as "
            "f-lm), or precision=mixed."
        )


def _validate_adaptive(p, weights: str) -> None:
    from mpt_repro.precision.adaptive import FORMULAS, METHODS

    if weights != "low_precision" or not p.master_weights:
        raise ConfigError(
            "precision.loss_scaling=adaptive needs precision.weights=low_precision and "
            "precision.master_weights=true: "
            "each gradient is unscaled by its own layer's scale on the FP32 master copy."
        )
    if p.adaptive_method not in METHODS:
        raise ConfigError(
            f"precision.adaptive_method={p.adaptive_method!r} is not implemented (available: "
            f"{', '.join(METHODS)})."
        )
    if p.adaptive_formula not in FORMULAS:
        raise ConfigError(
            f"precision.adaptive_formula must be one of {', '.join(FORMULAS)} (got "
            f"{p.adaptive_formula!r}); docs/adaptive.md says what each computes."
        )
    if not 0 < p.adaptive_underflow_threshold < 1:
        raise ConfigError(
            "precision.adaptive_underflow_threshold must be in (0, 1) (got "
            f"{p.adaptive_underflow_threshold})."
        )
    for key in ("adaptive_scale_upper_bound", "adaptive_accum_upper_bound"):
        v = getattr(p, key)
        if not (v >= 1 and math.log2(v).is_integer()):
            raise ConfigError(f"precision.{key} must be a power of two >= 1 (got {v}).")
    if p.adaptive_update_interval < 1:
        raise ConfigError(
            f"precision.adaptive_update_interval must be >= 1 (got {p.adaptive_update_interval})."
        )
