"""The 8-bit formats and the FP8 knobs of a precision preset, without torch: what validation,
the run's description and the loss scaler need before (or without) any tensor. The arithmetic is
in mpt_repro/precision/fp8.py (docs/fp8.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpt_repro.errors import ConfigError


@dataclass(frozen=True)
class Format:
    name: str
    mantissa_bits: int  # M: explicit fraction bits
    min_normal_exp: int  # emin: exponent of the smallest normal number
    max_finite: float
    has_inf: bool
    torch_dtype: str  # name of the torch dtype holding the format

    @property
    def min_subnormal_exp(self) -> int:
        return self.min_normal_exp - self.mantissa_bits

    @property
    def max_exp(self) -> int:
        return math.frexp(self.max_finite)[1] - 1

    @property
    def overflow_bound(self) -> tuple[float, bool]:
        """(b, inclusive): round-to-nearest takes |x| past the largest finite value exactly when
        |x| > b (or >= b when inclusive). b is the midpoint between max and the next power of
        the spacing; a tie goes to the even neighbour, which is the one above when max's last
        mantissa bit is 1 (E5M2: 57344 = 7 * 2^13, FP16) and max itself when it is 0 (E4M3:
        448 = 14 * 2^5)."""
        q = 2.0 ** (self.max_exp - self.mantissa_bits)
        odd = int(self.max_finite / q) % 2 == 1
        return self.max_finite + q / 2, odd


E5M2 = Format("e5m2", 2, -14, 57344.0, True, "float8_e5m2")
E4M3 = Format("e4m3", 3, -6, 448.0, False, "float8_e4m3fn")
FP16 = Format("fp16", 10, -14, 65504.0, True, "float16")
# the element formats of the OCP MX formats beside FP8 (no inf, no NaN; used only as MX elements:
# precision.fp8.<kind>.scaling=mx, mpt_repro/precision/mx.py); torch_dtype names ml_dtypes' type
E3M2 = Format("e3m2", 2, -2, 28.0, False, "float6_e3m2fn")
E2M3 = Format("e2m3", 3, 0, 7.5, False, "float6_e2m3fn")
E2M1 = Format("e2m1", 1, 0, 6.0, False, "float4_e2m1fn")
FORMATS = {f.name: f for f in (E5M2, E4M3, FP16, E3M2, E2M3, E2M1)}
MX_ONLY = ("e3m2", "e2m3", "e2m1")

ROUNDINGS = ("nearest", "stochastic")
OVERFLOWS = ("saturate", "nonfinite")


def _name(v) -> str:
    """An Enum member (OmegaConf) or its string."""
    return getattr(v, "name", v)


def get_format(fmt: Format | str) -> Format:
    if isinstance(fmt, Format):
        return fmt
    name = _name(fmt)
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name]


# -- enhanced loss scaling ------------------------------------------------------------------------
def min_scale_at(step: int, cfg) -> float:
    """The floor of the dynamic loss scale at optimizer step `step` (the scaler's own count of
    attempted steps, skipped ones included), for a PrecisionConfig `cfg`.

    Mellempudi et al. 2019 ("enhanced loss scaling") raise the minimum of the dynamic scale during
    training so that spurious overflows cannot drag the scale down to where E5M2's short
    subnormal range flushes the small gradients; the paper sets the schedule per model by watching
    the training loss and does not publish it. Assumption (docs/fp8.md): either explicit
    milestones (`fp8.min_scale_milestones`/`_values`: from step s_i on the floor is v_i), or a
    geometric rise (floor = min_scale * rise_factor^(step // rise_every), capped at rise_max).
    Without either, the floor is `precision.min_scale`, so every preset can call this."""
    f8 = cfg.fp8
    floor = float(cfg.min_scale)
    if f8.min_scale_milestones:
        for s, v in zip(f8.min_scale_milestones, f8.min_scale_milestone_values):
            if step >= s:
                floor = float(v)
    elif f8.min_scale_rise_every:
        cap = float(f8.min_scale_rise_max if f8.min_scale_rise_max is not None else cfg.max_scale)
        rises, factor = int(step) // int(f8.min_scale_rise_every), float(f8.min_scale_rise_factor)
        # compare in logs: factor ** rises overflows a float long after the cap is reached
        if rises * math.log(factor) >= math.log(cap / floor):
            floor = cap
        else:
            floor = min(floor * factor**rises, cap)
    return min(floor, float(cfg.max_scale))


# -- validation and description -------------------------------------------------------------------
KINDS = ("weights", "activations", "errors", "weight_grads")


def fp8_mode(p) -> str:
    """'none', 'emulated' or 'torchao' for a PrecisionConfig (configs without fp8: 'none')."""
    f8 = getattr(p, "fp8", None)
    return "none" if f8 is None else _name(f8.mode)


def uses_mx(p) -> bool:
    """Whether an emulated preset block-scales some tensor kind (scaling=mx): its layers are
    mx_modules' (each GEMM quantizes along its own reduction dimension), not fp8_modules'."""
    f8 = getattr(p, "fp8", None)
    return fp8_mode(p) == "emulated" and any(_name(getattr(f8, k).scaling) == "mx" for k in KINDS)


def _defaults():
    from mpt_repro.precision.config import FP8Config

    return FP8Config()


def _differs(f8, default, key: str) -> bool:
    a, b = getattr(f8, key), getattr(default, key)
    if key in KINDS:
        return any(_name(getattr(a, k)) != _name(getattr(b, k)) for k in vars(b))
    if isinstance(b, list):
        return [_name(v) for v in a] != b
    return _name(a) != _name(b)


def validate_fp8(p, paper_loss_scale: float | None = None) -> None:
    """Refuse fp8 knob combinations that make no sense (ConfigError naming the keys)."""
    mode = fp8_mode(p)
    if mode == "none":
        f8, d = p.fp8, _defaults()
        for key in vars(d):
            if key != "mode" and _differs(f8, d, key):
                raise ConfigError(
                    f"precision.fp8.{key} is set but precision.fp8.mode=none, so it would do "
                    "nothing. Set precision.fp8.mode=emulated (or torchao), or drop the key."
                )
        return
    f8 = p.fp8
    dtype, weights = _name(p.compute_dtype), _name(p.weights)
    if any(not isinstance(e, str) or not e for e in f8.exempt):
        raise ConfigError(
            f"precision.fp8.exempt entries must be non-empty strings (got {list(f8.exempt)})."
        )
    if mode == "emulated":
        _validate_emulated(p, dtype, weights)
    else:
        _validate_torchao(p, dtype, weights)
    _validate_floor(p, paper_loss_scale)


def _validate_emulated(p, dtype: str, weights: str) -> None:
    f8 = p.fp8
    if dtype != "float32" or weights != "fp32_autocast" or p.master_weights:
        raise ConfigError(
            "precision.fp8.mode=emulated needs precision.compute_dtype=float32, "
            "precision.weights=fp32_autocast and precision.master_weights=false: the layers "
            "compute in FP32 on the dequantized 8-bit values (FP32 accumulation), and the "
            "16-bit master copy is precision.fp8.master=fp16 (got compute_dtype="
            f"{dtype}, weights={weights}, master_weights={p.master_weights})."
        )
    if all(_name(getattr(f8, k).format) == "none" for k in KINDS):
        raise ConfigError(
            "precision.fp8.mode=emulated with every tensor kind at format=none quantizes "
            "nothing: set precision.fp8.<weights|activations|errors|weight_grads>.format."
        )
    if _name(f8.master_rounding) == "stochastic" and _name(f8.master) != "fp16":
        raise ConfigError(
            "precision.fp8.master_rounding=stochastic needs precision.fp8.master=fp16 "
            "(an FP32 master is not rounded)."
        )
    if f8.compile:
        raise ConfigError(
            "precision.fp8.compile applies to precision.fp8.mode=torchao only; drop it (the "
            "emulated layers run eagerly)."
        )
    for k in KINDS:
        _validate_mx_kind(k, getattr(f8, k))


def _validate_mx_kind(kind: str, t) -> None:
    """MX block scaling quantizes GEMM inputs, saturating (OCP MX v1.0); the FP6/FP4 element
    formats have too little range to stand alone."""
    fmt, scaling, key = _name(t.format), _name(t.scaling), f"precision.fp8.{kind}"
    if fmt in MX_ONLY and scaling != "mx":
        raise ConfigError(
            f"{key}.format={fmt} is an MX element format (max {FORMATS[fmt].max_finite:g}): "
            f"it needs {key}.scaling=mx, a shared scale per block of 32."
        )
    if scaling != "mx":
        return
    if kind == "weight_grads":
        raise ConfigError(
            f"{key}.scaling=mx: MX quantizes the inputs of a GEMM (weights, activations, "
            "errors); the weight gradient is a GEMM's output, accumulated in FP32. Set "
            f"{key}.format=none."
        )
    if fmt == "none" or _name(t.overflow) != "saturate":
        raise ConfigError(
            f"{key}.scaling=mx needs a format (e4m3, e5m2, e3m2, e2m3, e2m1) and "
            f"{key}.overflow=saturate (MX elements saturate to their max normal); got "
            f"format={fmt}, overflow={_name(t.overflow)}."
        )


def _validate_torchao(p, dtype: str, weights: str) -> None:
    f8 = p.fp8
    if dtype not in ("float32", "bfloat16") or _name(p.loss_scaling) != "none":
        raise ConfigError(
            "precision.fp8.mode=torchao runs torchao's float8 training, which scales every "
            "operand itself: use precision.compute_dtype=bfloat16 (or float32) and "
            f"precision.loss_scaling=none (got {dtype}, {_name(p.loss_scaling)})."
        )
    if weights != "fp32_autocast":
        raise ConfigError(
            "precision.fp8.mode=torchao needs precision.weights=fp32_autocast: torchao keeps "
            "the high-precision weights and casts them to FP8 per GEMM."
        )
    d = _defaults()
    for key in (*KINDS, "master", "master_rounding"):
        if _differs(f8, d, key):
            raise ConfigError(
                f"precision.fp8.{key} applies to precision.fp8.mode=emulated only; torchao "
                "picks its own formats (E4M3 forward, E5M2 gradients) and scales."
            )


def _validate_floor(p, paper_loss_scale: float | None) -> None:
    f8 = p.fp8
    rise, miles = f8.min_scale_rise_every, list(f8.min_scale_milestones)
    if rise is None and not miles and not f8.min_scale_milestone_values:
        if f8.min_scale_rise_max is not None:
            raise ConfigError(
                "precision.fp8.min_scale_rise_max is set without precision.fp8."
                "min_scale_rise_every."
            )
        return
    scaling = _name(p.loss_scaling)
    dynamic = scaling == "dynamic" or (scaling == "paper" and paper_loss_scale is None)
    if not dynamic:
        raise ConfigError(
            "the rising loss-scale floor (precision.fp8.min_scale_rise_every / "
            "min_scale_milestones) needs dynamic loss scaling (precision.loss_scaling=dynamic; "
            f"got {scaling}"
            + (
                f" with the paper scale {paper_loss_scale:g}"
                if paper_loss_scale and scaling == "paper"
                else ""
            )
            + ")."
        )
    if rise is not None and miles:
        raise ConfigError(
            "set either precision.fp8.min_scale_rise_every (geometric floor) or "
            "precision.fp8.min_scale_milestones (explicit floor), not both."
        )
    if rise is not None:
        if rise < 1 or not f8.min_scale_rise_factor > 1:
            raise ConfigError(
                "precision.fp8.min_scale_rise_every must be >= 1 and min_scale_rise_factor > 1 "
                f"(got {rise}, {f8.min_scale_rise_factor})."
            )
        cap = f8.min_scale_rise_max
        if cap is not None and not p.min_scale <= cap <= p.max_scale:
            raise ConfigError(
                "need precision.min_scale <= precision.fp8.min_scale_rise_max <= "
                f"precision.max_scale (got {p.min_scale}, {cap}, {p.max_scale})."
            )
        return
    values = [float(v) for v in f8.min_scale_milestone_values]
    if len(values) != len(miles):
        raise ConfigError(
            "precision.fp8.min_scale_milestones and min_scale_milestone_values must have the "
            f"same length (got {len(miles)} and {len(values)})."
        )
    if any(s < 0 for s in miles) or any(b <= a for a, b in zip(miles, miles[1:])):
        raise ConfigError(
            f"precision.fp8.min_scale_milestones must be increasing steps >= 0 (got {miles})."
        )
    if any(b < a for a, b in zip(values, values[1:])) or not (
        p.min_scale <= values[0] and values[-1] <= p.max_scale
    ):
        raise ConfigError(
            "precision.fp8.min_scale_milestone_values must rise, from at least "
            f"precision.min_scale ({p.min_scale}) to at most precision.max_scale "
            f"({p.max_scale}) (got {values})."
        )


def describe_fp8(p) -> str | None:
    """One clause for PrecisionPolicy.describe() (None when fp8 is off)."""
    mode = fp8_mode(p)
    if mode == "none":
        return None
    f8 = p.fp8
    exempt = ", ".join(f8.exempt) or "none"
    if mode == "torchao":
        emu = ""
        if f8.torchao_emulate:
            emu = " (torchao emulation: FP8 casts, high-precision matmuls)"
        compiled = ", each compiled" if f8.compile else ", eager (precision.fp8.compile=false)"
        return (
            f"FP8 linear layers via torchao float8 training, {_name(f8.recipe)} scaling{emu}"
            f"{compiled}; "
            f"convolutions and exempt layers ({exempt}) in the preset's dtype"
        )
    parts = []
    for k in KINDS:
        t = getattr(f8, k)
        if _name(t.format) == "none":
            parts.append(f"{k} FP32")
            continue
        scaled = {"tensorwise": ", tensorwise scale", "mx": ", MX blocks of 32"}.get(
            _name(t.scaling), ""
        )
        rnd = "SR" if _name(t.rounding) == "stochastic" else "RNE"
        parts.append(f"{k} {_name(t.format).upper()} {rnd} {_name(t.overflow)}{scaled}")
    master = _name(f8.master).upper()
    if _name(f8.master) == "fp16":
        master += " (SR)" if _name(f8.master_rounding) == "stochastic" else " (RNE)"
    floor = ""
    if f8.min_scale_rise_every:
        cap = f8.min_scale_rise_max
        floor = (
            f", loss-scale floor x{f8.min_scale_rise_factor:g} every {f8.min_scale_rise_every} "
            f"steps up to {cap if cap is not None else p.max_scale:g}"
        )
    elif f8.min_scale_milestones:
        floor = ", loss-scale floor " + ", ".join(
            f"{v:g} from step {s}"
            for s, v in zip(f8.min_scale_milestones, f8.min_scale_milestone_values)
        )
    mx = any(_name(getattr(f8, k).scaling) == "mx" for k in KINDS)
    return (
        f"emulated {'MX (OCP v1.0)' if mx else 'FP8'} in conv/linear layers ("
        + "; ".join(parts)
        + "; FP32 accumulation), "
        f"exempt: {exempt}, master weights {master}{floor}"
    )
