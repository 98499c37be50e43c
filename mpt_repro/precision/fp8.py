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

import torch
from torch import Tensor

from mpt_repro.precision.fp8_config import (  # noqa: F401  (re-exported: callers use fp8.*)
    E4M3,
    E5M2,
    FORMATS,
    FP16,
    KINDS,
    OVERFLOWS,
    ROUNDINGS,
    Format,
    _name,
    describe_fp8,
    fp8_mode,
    get_format,
    min_scale_at,
    uses_mx,
    validate_fp8,
)


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
