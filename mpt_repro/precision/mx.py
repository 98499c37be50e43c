"""Block-scaled MX formats (OCP Microscaling Formats v1.0): a block quantizer, exact (docs/mx.md).

An MX block is k = 32 values that share one scale X = 2^s stored as E8M0 (8 exponent bits, bias
127, no sign, no mantissa: X in 2^-127 .. 2^127, code 0xFF = NaN), each value stored as an element
P_i of an FP8 (E4M3, E5M2), FP6 (E3M2, E2M3) or FP4 (E2M1) format; the block's values are X * P_i.
The conversion of a block V (spec §6.3, "minimally supported" rule):

    s   = floor(log2(max_i |V_i|)) - emax_elem, clamped to E8M0's range [-127, 127]
    P_i = V_i / 2^s rounded to nearest, ties to even, saturated to +-(the element's max normal)

emax_elem is the exponent of the element format's largest normal number (E4M3 8, E5M2 15,
E3M2 4, E2M3 2, E2M1 2). The block's largest magnitude lands in [2^emax, 2^(emax+1)): where the
element's max normal is below 2^(emax+1) (E4M3's 448 < 512, E2M1's 6 < 8, ...) the largest values
saturate; that is the spec's rule, kept (torchao's FLOOR mode does the same).

Special blocks, as implemented (docs/mx.md gives the sources and torchao's differences):
  * all zeros: floor(log2 0) = -inf clamps to s = -127 (code 0x00); every element is 0 (signs kept);
  * a NaN or an infinity in the block: floor(log2 max) is not a number / exceeds 127, so the scale
    is NaN (code 0xFF) and every value of the block decodes to NaN (spec §5.3: a NaN scale makes
    the whole block NaN), as the spec authors' reference code (microsoft/microxcaling) does;
  * a block whose largest magnitude is below 2^(emax-127) (tiny): s clamps to -127 and the values
    under the element's range there flush to zero ("scale saturated", counted by telemetry).

`mx_quantize(x, fmt, dim)` returns the values the MX encoding of x along `dim` decodes to, in x's
dtype (the emulation: layers compute in FP32 on exact MX values); `mx_encode` gives the parts (the
E8M0 codes and the element values) for the exactness check (scripts/mx_exactness.py, bit for bit
against ml_dtypes on 10^7 values per format).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mpt_repro.precision import fp8
from mpt_repro.precision.fp8_config import E2M1, E2M3, E3M2, E4M3, E5M2, Format

BLOCK = 32  # elements per block (OCP MX v1.0: k = 32 for every concrete MX format)
SCALE_BIAS = 127
SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127
SCALE_NAN = 0xFF
ELEMENTS: dict[str, Format] = {f.name: f for f in (E4M3, E5M2, E3M2, E2M3, E2M1)}
# element bits: what an MX tensor stores per value is these plus 8 bits of scale per block
ELEMENT_BITS = {"e4m3": 8, "e5m2": 8, "e3m2": 6, "e2m3": 6, "e2m1": 4}
# telemetry counters of one quantization, in this order (mx_quantize's `stats`)
STATS = ("blocks", "nonzero_blocks", "scale_clamped", "saturated", "nonzero", "underflow")


def element_format(fmt: Format | str) -> Format:
    name = fp8._name(fmt.name if isinstance(fmt, Format) else fmt)
    if name not in ELEMENTS:
        raise ValueError(f"unknown MX element format {name!r} (known: {', '.join(ELEMENTS)})")
    return ELEMENTS[name]


def bits_per_value(fmt: Format | str, block: int = BLOCK) -> float:
    """Storage of an MX tensor per value: the element's bits and a share of the 8-bit scale."""
    return ELEMENT_BITS[element_format(fmt).name] + 8 / block


@dataclass
class MXBlocks:
    """One tensor in MX form, blocked along its last dimension: shape (..., n_blocks, block)."""

    scale_exp: Tensor  # int32 (..., n_blocks): s of X = 2^s (meaningless where nan)
    nan: Tensor  # bool (..., n_blocks): the scale is NaN (code 0xFF)
    elements: Tensor  # float32 (..., n_blocks, block): P_i, exact values of the element format
    unclamped: Tensor  # int32 (..., n_blocks): floor(log2 amax) - emax before the clamp

    def codes(self) -> Tensor:
        """The E8M0 scale codes (uint8): s + 127, 0xFF for NaN."""
        code = (self.scale_exp + SCALE_BIAS).masked_fill(self.nan, SCALE_NAN)
        return code.to(torch.uint8)

    def scales(self) -> Tensor:
        """X = 2^s as FP32 (exact: 2^-127 is an FP32 subnormal), NaN where the code is 0xFF."""
        return pow2(self.scale_exp).masked_fill_(self.nan, float("nan"))

    def values(self) -> Tensor:
        """X * P_i (FP32, exact), blocked; NaN throughout a NaN-scale block."""
        return (self.elements * self.scales().unsqueeze(-1)).masked_fill_(
            self.nan.unsqueeze(-1), float("nan")
        )


def pow2(e: Tensor) -> Tensor:
    """2^e as FP32 for integer e in [-127, 127], built from its bit pattern (exact; 2^-127 is
    the subnormal 0x00400000)."""
    e = e.to(torch.int32)
    normal = torch.bitwise_left_shift((e + 127).clamp(min=1), 23)
    return torch.where(e >= -126, normal, torch.full_like(e, 0x00400000)).view(torch.float32)


def shared_exponent(amax: Tensor, fmt: Format) -> tuple[Tensor, Tensor, Tensor]:
    """(s clamped to [-127, 127], NaN-scale mask, s before the clamp) for block maxima `amax`
    (FP32, >= 0 or NaN). floor(log2 amax) is read off the FP32 exponent field: exact for normal
    amax; zeros and FP32 subnormals read -127, which lies below every element's clamp point
    (-127 - emax < -127), so they clamp to -127 as floor(log2 amax) - emax would; field 255
    (inf, NaN) marks the NaN scale."""
    field = torch.bitwise_right_shift(amax.view(torch.int32), 23) & 0xFF
    unclamped = field - SCALE_BIAS - fmt.max_exp
    return unclamped.clamp(SCALE_EXP_MIN, SCALE_EXP_MAX), field == 255, unclamped


def blocked(x: Tensor, dim: int, block: int = BLOCK) -> Tensor:
    """x (FP32) with `dim` moved last, zero-padded to a multiple of `block`, viewed as
    (..., n_blocks, block). Zeros change no block maximum."""
    t = x.float().movedim(dim, -1)
    pad = (-t.shape[-1]) % block
    if pad:
        t = torch.nn.functional.pad(t, (0, pad))
    return t.reshape(*t.shape[:-1], t.shape[-1] // block, block)


def unblocked(b: Tensor, like: Tensor, dim: int) -> Tensor:
    """The inverse of `blocked`: b (..., n_blocks, block) back to the shape of `like`."""
    moved = like.movedim(dim, -1).shape
    flat = b.reshape(*b.shape[:-2], -1)[..., : moved[-1]]
    return flat.movedim(-1, dim)


def mx_encode(
    x: Tensor,
    fmt: Format | str,
    dim: int = -1,
    block: int = BLOCK,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
) -> MXBlocks:
    """The MX encoding of x with blocks of `block` consecutive values along `dim` (the module
    docstring's rule). `rounding="stochastic"` rounds the elements stochastically instead of to
    nearest even (unbiased; still saturating), for gradients (fp8.stochastic_round_)."""
    fmt = element_format(fmt)
    b = blocked(x.detach(), dim, block)
    amax = b.abs().amax(-1)  # NaN when the block holds a NaN
    s, nan, unclamped = shared_exponent(amax, fmt)
    # V / 2^s as V * 2^-s: 2^-s is a normal FP32 number for every s a finite block can get
    # (s <= 127 - 2), so the product is exact wherever it can matter (an FP32-subnormal result
    # is far below every element's smallest subnormal, and rounds to zero either way)
    scaled = b * pow2((-s).clamp(max=SCALE_EXP_MAX)).unsqueeze(-1)
    elements = fp8.quantize(scaled, fmt, rounding, "saturate", generator)
    return MXBlocks(s.to(torch.int32), nan, elements, unclamped.to(torch.int32))


def mx_quantize(
    x: Tensor,
    fmt: Format | str,
    dim: int = -1,
    block: int = BLOCK,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
    stats: Tensor | None = None,
) -> Tensor:
    """The values the MX encoding of x (blocks along `dim`) decodes to, in x's dtype and shape.
    `stats`, an int64 tensor of len(STATS) on x's device, gets this call's telemetry counts
    added in place (block_stats)."""
    mxb = mx_encode(x, fmt, dim, block, rounding, generator)
    values = mxb.values()
    if stats is not None:
        stats.add_(block_stats(blocked(x.detach(), dim, block), mxb, element_format(fmt)))
    return unblocked(values, x, dim).to(x.dtype)


@torch.no_grad()
def block_stats(b: Tensor, mxb: MXBlocks, fmt: Format) -> Tensor:
    """[blocks, nonzero blocks, scale clamped, saturated, nonzero values, underflowed values]
    of one encoding (int64, on the device, no host sync):
      scale clamped  a finite nonzero block whose s fell below -127 and was clamped: its small
                     values lose the range the scale could not give them;
      saturated      a finite block whose largest magnitude was cut to the element's max normal
                     (the floor rule's top binade reaches past it in E4M3, E3M2, E2M3, E2M1);
      underflow      a nonzero finite value that decodes to zero: too small for its block's scale
                     (the block's largest value sets the scale; the others get what is left).
    Padding zeros count as zeros (not nonzero), so they change no share."""
    a = b.abs()
    amax = a.amax(-1)
    finite_block = ~mxb.nan
    nonzero_block = finite_block & (amax > 0)
    bound, inclusive = fmt.overflow_bound
    top = amax * pow2((-mxb.scale_exp).clamp(max=SCALE_EXP_MAX))
    over = (top >= bound) if inclusive else (top > bound)
    nonzero = (a > 0) & finite_block.unsqueeze(-1)
    return torch.stack(
        [
            torch.tensor(mxb.nan.numel(), device=b.device),
            nonzero_block.sum(),
            (nonzero_block & (mxb.unclamped < SCALE_EXP_MIN)).sum(),
            (finite_block & over).sum(),
            nonzero.sum(),
            (nonzero & (mxb.elements == 0)).sum(),
        ]
    )


def stats_dict(counts) -> dict[str, int]:
    """block_stats counts (a host list) by name."""
    return {k: int(v) for k, v in zip(STATS, counts)}


def stats_shares(entry: dict) -> dict[str, float]:
    """{"scale_clamped", "saturated": shares of nonzero blocks; "underflow": share of nonzero
    values} from a stats_dict (0.0 where nothing was counted)."""
    blocks, values = entry.get("nonzero_blocks", 0), entry.get("nonzero", 0)
    return {
        "scale_clamped": entry.get("scale_clamped", 0) / blocks if blocks else 0.0,
        "saturated": entry.get("saturated", 0) / blocks if blocks else 0.0,
        "underflow": entry.get("underflow", 0) / values if values else 0.0,
    }
