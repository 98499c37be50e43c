"""8-bit floating point: the formats, an exact quantize-dequantize, stochastic rounding, FP16
master rounding, and the rising loss-scale floor of Mellempudi et al. 2019 (docs/fp8.md).

Formats (value = (-1)^s * 2^e * 1.m for normals, 2^emin * 0.m for subnormals):

  name  bits   smallest subnormal  smallest normal  largest finite  inf   torch dtype
  e5m2  1/5/2  2^-16               2^-14            57344           yes   float8_e5m2
  e4m3  1/4/3  2^-9                2^-6             448             no    float8_e4m3fn (OCP "fn")
  fp16  1/5/10 2^-24               2^-14            65504           yes   float16 (for the master)

`quantize(x, fmt, rounding, overflow)` returns the value x takes in the format, as a tensor of
x's dtype (the dequantized value: the layer then computes in FP32 on exact 8-bit values).

* Round to nearest, ties to even: round(|x| / q) * q with q the spacing of the format at |x|.
  The tests hold it to torch's float8_e5m2 / float8_e4m3fn casts on all 256 codes, the
  midpoints between them and their FP32 neighbours (it is also 2-10x faster than those casts
  on a CPU).
* Stochastic rounding rounds |x| up to the next value of the format with probability equal to
  the discarded fraction, down otherwise, so E[quantize(x)] = x. It works on the exact FP32
  value: with q the spacing of the format at |x| (2^(e-M) for exponent e >= emin, 2^(emin-M)
  below), v = |x| / q is exact (a power-of-two scaling), and floor(v) + (u < v - floor(v)) with u
  a 24-bit uniform draw is the rounded multiple of q. v - floor(v) has at most 24 fractional bits
  whenever |x| >= half the smallest subnormal, so the probability is exact there; below, it is
  rounded up to a multiple of 2^-24 (a bias below 2^-24 of the smallest subnormal).
* Overflow (|x| beyond what rounds to the largest finite value): `saturate` gives +-max (an
  inf input too, as NVIDIA's SATFINITE conversion; NaN stays NaN); `nonfinite` gives +-inf in
  E5M2 and FP16, and NaN in E4M3, which has no inf (torch's non-saturating float8 casts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

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
FORMATS = {f.name: f for f in (E5M2, E4M3, FP16)}

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
        raise ValueError(f"unknown 8-bit format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name]


# -- quantize ------------------------------------------------------------------------------------
def quantize(
    x: Tensor,
    fmt: Format | str,
    rounding: str = "nearest",
    overflow: str = "saturate",
    generator: torch.Generator | None = None,
) -> Tensor:
    """The value of x in format `fmt` (dequantized, in x's dtype). See the module docstring.

    Every step is an elementwise arithmetic or integer op on the FP32 bit pattern, with no
    comparison and no torch.where: on CPUs, bool-producing kernels and torch's float8_e4m3fn cast
    cost 10-100 times an arithmetic pass, and this keeps the emulation near FP32 speed."""
    fmt = get_format(fmt)
    rounding, overflow = _name(rounding), _name(overflow)
    if rounding not in ROUNDINGS or overflow not in OVERFLOWS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, overflow one of {OVERFLOWS}")
    xf = x.detach().float()
    a = xf.abs()
    q = spacing(a, fmt)
    v = a.div_(q)  # exact: division by a power of two
    if rounding == "nearest":
        r = v.round_()  # half to even
    else:
        r = stochastic_round_(v, uniform24(xf.shape, generator, xf.device))
    y = r.mul_(q)  # a carry into the next binade is that binade's first value: still exact
    return torch.copysign(_overflow(y, fmt, overflow), xf).to(x.dtype)


def stochastic_round_(v: Tensor, u: Tensor) -> Tensor:
    """floor(v) + 1 where u < v - floor(v), else floor(v): v >= 0 rounded up with probability
    equal to its fraction for u uniform in [0, 1). Consumes v (and u) in place."""
    r = torch.floor(v)
    # the discarded fraction, exact (v and floor(v) share a binade); inf - inf = NaN for an inf
    # input, which must stay inf: count it as no fraction (a NaN v keeps its NaN floor)
    frac = torch.nan_to_num_(v.sub_(r), nan=0.0)
    # ceil(frac - u) is 1 exactly when u < frac, else 0 (frac - u is exact when both are
    # multiples of 2^-24, and a difference of two unequal floats is never 0)
    return r.add_(frac.sub_(u).ceil_())


def spacing(a: Tensor, fmt: Format) -> Tensor:
    """The spacing q of the format's values at each magnitude a (FP32, a >= 0): 2^(e-M) for a
    in the binade [2^e, 2^(e+1)) with e >= emin, 2^(emin-M) below (subnormals share the smallest
    normal binade's spacing). Masking a's exponent bits gives 2^e exactly; zeros and FP32
    subnormals (exponent field 0) fall under the lower clamp, inf/NaN (field 255, read as inf)
    under the upper one, so inf / q stays inf and NaN stays NaN."""
    binade = (a.view(torch.int32) & 0x7F800000).view(torch.float32)
    return binade.clamp_(2.0**fmt.min_normal_exp, 2.0**127).mul_(2.0**-fmt.mantissa_bits)


def _overflow(y: Tensor, fmt: Format, overflow: str) -> Tensor:
    """Magnitudes y (rounded onto the format's grid, which beyond max continues at the top
    spacing) past the largest finite value become max (saturate) or inf / NaN (nonfinite)."""
    if overflow == "saturate":
        return y.clamp_(max=fmt.max_finite)  # inf -> max; clamp keeps NaN
    # Past max, y - max >= the top spacing (>= 2^5 in every format), and 2^5 * 2^127 overflows
    # FP32: the excess term is inf exactly for the overflowed values and 0 for the others.
    excess = (y - fmt.max_finite).clamp_(min=0.0).mul_(2.0**127)
    if not fmt.has_inf:
        excess.mul_(0.0)  # E4M3: inf * 0 = NaN, 0 * 0 = 0
    return y.add_(excess)  # NaN stays NaN (NaN - max is NaN)


def uniform24(shape, generator: torch.Generator | None, device) -> Tensor:
    """Uniform draws k * 2^-24, k in [0, 2^24), as exact FP32 (the low 24 bits of 31-bit
    integer draws; 2^24 divides 2^31, so every k is equally likely)."""
    r = torch.empty(shape, dtype=torch.int32, device=device).random_(generator=generator)
    return r.bitwise_and_(0xFFFFFF).float().mul_(2.0**-24)


# -- per-tensor scaling (hybrid forward) ---------------------------------------------------------
def tensorwise_scale(x: Tensor, fmt: Format | str) -> Tensor:
    """A 0-d FP32 power of two s, the largest with amax(|x|) * s <= max of the format (1 when x
    is all zeros or holds inf/NaN, so those still reach the overflow handling). Powers of two
    keep the scaling itself exact, as torchao's round_scales_to_power_of_2."""
    fmt = get_format(fmt)
    if x.numel() == 0:
        return torch.ones((), device=x.device)
    amax = x.detach().abs().amax().float()
    m_a, e_a = torch.frexp(amax)
    m_max, e_max = math.frexp(fmt.max_finite)
    k = (e_max - e_a) - (m_a > m_max).to(e_a.dtype)
    s = torch.ldexp(torch.ones_like(amax), k.clamp(-100, 100).float())
    ok = torch.isfinite(amax) & (amax > 0)
    return torch.where(ok, s, torch.ones_like(s))


def quantize_scaled(
    x: Tensor,
    fmt: Format | str,
    rounding: str = "nearest",
    overflow: str = "saturate",
    generator: torch.Generator | None = None,
) -> Tensor:
    """quantize(x * s) / s with s = tensorwise_scale(x): the tensor's largest magnitude lands in
    the format's top binade (what an FP8 kernel does with a per-tensor scale)."""
    s = tensorwise_scale(x, fmt)
    return quantize(x * s.to(x.dtype), fmt, rounding, overflow, generator) / s.to(x.dtype)


# -- FP16 master weights -------------------------------------------------------------------------
def round_master_to_fp16(
    master_fp32: Tensor, stochastic: bool, generator: torch.Generator | None = None
) -> Tensor:
    """The FP16 copy of an FP32 master tensor: round to nearest even (torch's cast), or
    stochastically (unbiased: tiny updates survive on average instead of being lost)."""
    if not stochastic:
        return master_fp32.detach().to(torch.float16)
    return quantize(master_fp32.float(), FP16, "stochastic", "nonfinite", generator).to(
        torch.float16
    )


@torch.no_grad()
def round_params_to_fp16_(
    params, stochastic: bool, generator: torch.Generator | None = None
) -> None:
    """Round FP32 parameters in place to FP16 values (they stay FP32 tensors holding FP16
    numbers): the master weights of Mellempudi et al. 2019 are 16-bit. All parameters of a
    device are rounded as one flat tensor: one pass of a dozen kernels instead of a dozen per
    parameter, which is what this costs for models of many small tensors."""
    groups: dict = {}
    for p in params:
        if p.dtype == torch.float32:
            groups.setdefault(p.device, []).append(p)
    for ps in groups.values():
        flat = torch.cat([p.reshape(-1) for p in ps])
        rounded = round_master_to_fp16(flat, stochastic, generator).float()
        torch._foreach_copy_(
            ps, [c.view_as(p) for c, p in zip(rounded.split([p.numel() for p in ps]), ps)]
        )


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
    else:  # torchao
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
    _validate_floor(p, paper_loss_scale)


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
        scaled = ", tensorwise scale" if _name(t.scaling) == "tensorwise" else ""
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
    return (
        "emulated FP8 in conv/linear layers (" + "; ".join(parts) + "; FP32 accumulation), "
        f"exempt: {exempt}, master weights {master}{floor}"
    )
