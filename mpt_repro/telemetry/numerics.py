"""What FP16 would do to a tensor: power-of-two exponent histograms and range fractions; and
at the end, the same question in 8-bit terms (E5M2, E4M3 beside FP16: `format_counts`).

Pure functions on tensors, no hooks and no state, so each number can be tested exactly.

Definitions (|x| is the magnitude of a value as it would be in FP32; docs/telemetry.md):
  exponent   floor(log2|x|) of a nonzero finite value, from torch.frexp (exact, also for FP32
             subnormals). Bins cover every FP32 exponent, -149..127, so nothing is clipped.
  zero       x == 0 exactly (already zero in FP32: nothing for FP16 to lose).
  underflow  0 < |x| < 2^-24: exponent below -24, the values of the paper's Fig. 2b/3 that FP16
             cannot hold (round-to-nearest flushes (0, 2^-25] to zero and rounds (2^-25, 2^-24)
             up to 2^-24, so all of them lose their value).
  subnormal  2^-24 <= |x| < 2^-14: representable, with fewer than 11 significant bits.
  overflow   |x| > 65504 (the largest finite FP16), inf included; NaN is counted apart.
Every fraction is over all elements (zeros included), as the paper's "67% of values are zero".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

EXP_MIN, EXP_MAX = (
    -149,
    127,
)  # every FP32 exponent: smallest subnormal 2^-149 .. largest finite < 2^128
N_BINS = EXP_MAX - EXP_MIN + 1
FP16_MAX = 65504.0
FP16_MIN_SUBNORMAL_EXP = -24  # 2^-24, the smallest positive FP16 value
FP16_MIN_NORMAL_EXP = -14  # 2^-14, the smallest normal FP16 value
FP16_MANTISSA_BITS = 10

# Layout of the count vector that tensor_counts returns: the histogram, then these counts.
FIELDS = (
    "numel",
    "zero",
    "nan",
    "inf",
    "underflow",
    "subnormal",
    "overflow",  # of the true (unscaled) values
    "underflow_scaled",
    "subnormal_scaled",
    "overflow_scaled",
)  # of the values times the scale
_FIELD = {name: N_BINS + i for i, name in enumerate(FIELDS)}
VECTOR_LEN = N_BINS + len(FIELDS)


def field(counts: Tensor, name: str) -> Tensor:
    """One named count from a tensor_counts vector (or a stack of them: last dimension)."""
    return counts[..., _FIELD[name]]


def histogram(counts: Tensor) -> Tensor:
    """The exponent histogram part of a tensor_counts vector; bin i holds exponent EXP_MIN + i."""
    return counts[..., :N_BINS]


def range_counts(a: Tensor) -> list[Tensor]:
    """[underflow, subnormal, overflow] counts of magnitudes `a` (0-d int64 tensors, no sync)."""
    nonzero = a > 0
    return [
        (nonzero & (a < 2.0**FP16_MIN_SUBNORMAL_EXP)).sum(),
        ((a >= 2.0**FP16_MIN_SUBNORMAL_EXP) & (a < 2.0**FP16_MIN_NORMAL_EXP)).sum(),
        (a > FP16_MAX).sum(),  # inf > 65504 is True, NaN compares False
    ]


def _ranges_from_histogram(hist: Tensor, shift: int) -> list[Tensor]:
    """[underflow, subnormal] counts of the values times 2^shift, from their exponent histogram."""
    sub = FP16_MIN_SUBNORMAL_EXP - shift - EXP_MIN  # first bin that lands at or above 2^-24
    normal = FP16_MIN_NORMAL_EXP - shift - EXP_MIN
    clip = lambda i: min(max(i, 0), N_BINS)  # noqa: E731
    return [hist[: clip(sub)].sum(), hist[clip(sub) : clip(normal)].sum()]


@torch.no_grad()
def tensor_counts(x: Tensor, divide_by: float = 1.0, scale: float = 1.0) -> Tensor:
    """All counts of one tensor as one int64 vector on x's device (no host sync).

    x / divide_by is the true value (divide_by: the loss scale the captured gradient carries);
    `scale` is the loss scale whose effect the *_scaled counts show (true value times scale).
    """
    a = x.detach().float().abs()
    if divide_by != 1.0:
        a = a / divide_by
    finite = torch.isfinite(a)
    nonzero = a > 0
    _, exp = torch.frexp(a)  # a = m * 2^exp with 0.5 <= m < 1, so floor(log2 a) = exp - 1
    # zeros and non-finite values go to an extra last bin, dropped below (no boolean indexing:
    # that would need the host to know the selection's size)
    idx = torch.where(finite & nonzero, (exp.long() - 1).clamp(EXP_MIN, EXP_MAX) - EXP_MIN, N_BINS)
    hist = torch.bincount(idx.flatten(), minlength=N_BINS + 1)[:N_BINS]
    unscaled = _ranges_from_histogram(hist, 0) + [(a > FP16_MAX).sum()]
    mant, k = math.frexp(scale)
    if mant == 0.5 and EXP_MIN < k - 1 < EXP_MAX:
        # a power-of-two scale only shifts exponents: read the scaled ranges off the histogram too
        # (exact), and compare once for overflow (65504 / 2^k is exact)
        scaled = _ranges_from_histogram(hist, k - 1) + [(a > FP16_MAX / scale).sum()]
    else:
        scaled = range_counts(a * scale)
    extra = [
        torch.tensor(a.numel(), device=a.device),
        (a == 0).sum(),
        torch.isnan(a).sum(),
        torch.isinf(a).sum(),
        *unscaled,
        *scaled,
    ]
    return torch.cat([hist, torch.stack(extra)])


def all_counts(x: Tensor, divide_by: float = 1.0, scale: float = 1.0) -> Tensor:
    """tensor_counts (FP16 terms) followed by format_counts (E5M2/E4M3 terms): one vector, so a
    sampled step still makes one host copy. Split it with split_counts."""
    return torch.cat([tensor_counts(x, divide_by, scale), format_counts(x, divide_by, scale)])


def split_counts(counts: list) -> tuple[list, dict]:
    """(the tensor_counts part, the format_count_dict entry) of a host copy of all_counts."""
    base = N_BINS + len(FIELDS)
    return counts[:base], format_count_dict(counts[base:])


def fp16_half_ulp(w: Tensor) -> Tensor:
    """Half the spacing of FP16 numbers at w (rounded to FP16 first): the smallest update that
    FP16 addition to w can register. Normal w: 2^(e-11); subnormal or zero w: 2^-25."""
    w16 = w.detach().to(torch.float16).float().abs()
    _, exp = torch.frexp(w16)
    e = torch.where(w16 > 0, exp - 1, torch.full_like(exp, FP16_MIN_NORMAL_EXP))
    e = e.clamp(min=FP16_MIN_NORMAL_EXP)  # below 2^-14 the spacing stays 2^-24
    half = torch.ldexp(torch.ones_like(w16), (e - FP16_MANTISSA_BITS - 1).float())
    return torch.where(torch.isinf(w16), torch.full_like(w16, float("inf")), half)  # inf + u = inf


@torch.no_grad()
def lost_update_counts(weight_before: Tensor, update: Tensor) -> Tensor:
    """[lost, nonzero updates, numel] as an int64 vector (no host sync).

    An update is lost when it is nonzero in FP32 and |update| < half an FP16 ulp of the weight:
    added to the FP16 weight it rounds back to the same weight (the master-copy argument, §3.1;
    a ratio |w|/|u| above 2^11 = 2048). Exactly half an ulp is counted as kept (round-to-even
    would keep it for half the weights).
    """
    u = update.detach().float().abs()
    nonzero = u > 0
    lost = nonzero & (u < fp16_half_ulp(weight_before))
    return torch.stack([lost.sum(), nonzero.sum(), torch.tensor(u.numel(), device=u.device)])


@torch.no_grad()
def backward_flush_counts(module: torch.nn.Module, x: Tensor, grad_out: Tensor) -> Tensor:
    """[flushed, numel] of the input gradient, then of the weight gradient, that an FP16 backward
    of a Linear or Conv2d layer computes from `grad_out` (int64 vector, no host sync).

    Both are recomputed in FP32 from the FP16 operands the run's backward uses (its `grad_out`,
    the layer's weight and input): a value is flushed when it is nonzero there and at most
    2^-25, which FP16's round to nearest makes 0. Counted in the run's own units (a scaled run's
    gradients carry its loss scale), so this is what the run itself lost at this layer, not a
    what-if. The input gradient counts only when the input needs one (not the network's input).
    """
    g, w, xi = grad_out.float(), module.weight.float(), x.float()
    if isinstance(module, torch.nn.Linear):
        g2, x2 = g.reshape(-1, g.shape[-1]), xi.reshape(-1, xi.shape[-1])
        gi, gw = g @ w, g2.T @ x2
    else:  # Conv2d (numeric padding: the callback hooks no other)
        conv = (module.stride, module.padding, module.dilation, module.groups)
        gi = torch.nn.grad.conv2d_input(xi.shape, w, g, *conv)
        gw = torch.nn.grad.conv2d_weight(xi, w.shape, g, *conv)

    def flushed(v: Tensor) -> list[Tensor]:
        a = v.abs()
        return [((a > 0) & (a <= 2.0 ** (FP16_MIN_SUBNORMAL_EXP - 1))).sum(),
                torch.tensor(a.numel(), device=a.device)]  # fmt: skip

    act = (
        flushed(gi) if x.requires_grad else [torch.zeros((), dtype=torch.long, device=g.device)] * 2
    )
    return torch.stack([*act, *flushed(gw)])


def flush_hookable(module: torch.nn.Module) -> bool:
    """Layers whose FP16 backward backward_flush_counts can recompute."""
    if isinstance(module, torch.nn.Conv2d):
        return not isinstance(module.padding, str) and module.padding_mode == "zeros"
    return isinstance(module, torch.nn.Linear)


# -- on the host, from count vectors ------------------------------------------------------------
def trim_histogram(hist) -> dict:
    """{"lo": first populated exponent, "counts": [...]} (compact for the record file)."""
    h = [int(v) for v in hist]
    nz = [i for i, v in enumerate(h) if v]
    if not nz:
        return {"lo": 0, "counts": []}
    return {"lo": EXP_MIN + nz[0], "counts": h[nz[0] : nz[-1] + 1]}


def untrim_histogram(trimmed: dict) -> list[int]:
    """The full N_BINS histogram from trim_histogram's form."""
    full = [0] * N_BINS
    for i, v in enumerate(trimmed["counts"]):
        full[trimmed["lo"] - EXP_MIN + i] = v
    return full


def histogram_list(counts) -> list[int]:
    """The histogram part of a host count vector (a list)."""
    return [int(v) for v in counts[:N_BINS]]


def count_dict(counts) -> dict[str, int]:
    """The named counts of a host count vector: {"numel": ..., "zero": ..., ...}."""
    return {k: int(v) for k, v in zip(FIELDS, counts[N_BINS:])}


def fractions_of(entry: dict) -> dict[str, float]:
    """Fractions (over numel) from a record entry {"numel": ..., "zero": ..., "underflow": ...,
    ...}.
    """
    n = max(int(entry["numel"]), 1)
    return {k: entry[k] / n for k in FIELDS if k != "numel"}


def lost_fraction(entry: dict) -> float:
    """Lost updates over the updates that are nonzero in FP32 (0.0 when nothing moved)."""
    return entry["lost"] / entry["nonzero"] if entry["nonzero"] else 0.0


# -- 8-bit terms: what E5M2 / E4M3 (and FP16, for comparison) would do to a tensor ---------------
# Per format: (exponent of the smallest subnormal, exponent of the smallest normal, largest
# finite value). E5M2 and E4M3 are the OCP formats (E4M3 "fn": no inf), as in
# mpt_repro/precision/fp8.py, which holds the quantizer; FP16 repeats the fields above.
FORMAT_RANGES = {
    "fp16": (FP16_MIN_SUBNORMAL_EXP, FP16_MIN_NORMAL_EXP, FP16_MAX),
    "e5m2": (-16, -14, 57344.0),
    "e4m3": (-9, -6, 448.0),
}
FORMAT_NAMES = tuple(FORMAT_RANGES)
# For a value x (as in FP32) and a format with smallest subnormal 2^s, smallest normal 2^n and
# largest finite value M:
#   flush      0 < |x| <= 2^(s-1): round to nearest (ties to even) makes it 0
#   underflow  0 < |x| < 2^s: the value is lost (flushed, or rounded up to 2^s); as FP16 above
#   subnormal  2^s <= |x| < 2^n: kept with fewer significant bits
#   overflow   |x| > M, inf included: saturated to M, or inf/NaN (precision.fp8.*.overflow)
FORMAT_FIELDS = ("flush", "underflow", "subnormal", "overflow")
_FMT_BLOCK = 2 * len(FORMAT_FIELDS)  # unscaled, then *_scaled


def _format_range_counts(a: Tensor, fmt: str) -> list[Tensor]:
    s, n, top = FORMAT_RANGES[fmt]
    nonzero = a > 0
    return [
        (nonzero & (a <= 2.0 ** (s - 1))).sum(),
        (nonzero & (a < 2.0**s)).sum(),
        ((a >= 2.0**s) & (a < 2.0**n)).sum(),
        (a > top).sum(),  # inf > M is True, NaN compares False
    ]


@torch.no_grad()
def format_counts(
    x: Tensor, divide_by: float = 1.0, scale: float = 1.0, formats: tuple = FORMAT_NAMES
) -> Tensor:
    """Counts of one tensor in 8-bit terms as one int64 vector on x's device (no host sync):
    [numel, then per format in `formats`: flush, underflow, subnormal, overflow, and the same four
    of the values times `scale` (the loss scale's effect)]. `divide_by` and `scale` mean what they
    mean in tensor_counts: x / divide_by is the true value. Read it with format_count_dict."""
    a = x.detach().float().abs()
    if divide_by != 1.0:
        a = a / divide_by
    scaled = a * scale if scale != 1.0 else a
    out = [torch.tensor(a.numel(), device=a.device)]
    for fmt in formats:
        out += _format_range_counts(a, fmt) + _format_range_counts(scaled, fmt)
    return torch.stack(out)


def format_count_dict(counts, formats: tuple = FORMAT_NAMES) -> dict:
    """{"numel": n, "e5m2": {"flush": ..., ..., "overflow_scaled": ...}, ...} from a host copy
    (a list) of a format_counts vector: the record-file entry."""
    counts = [int(v) for v in counts]
    keys = list(FORMAT_FIELDS) + [f + "_scaled" for f in FORMAT_FIELDS]
    out: dict = {"numel": counts[0]}
    for i, fmt in enumerate(formats):
        block = counts[1 + i * _FMT_BLOCK : 1 + (i + 1) * _FMT_BLOCK]
        out[fmt] = dict(zip(keys, block))
    return out


def add_format_entries(entries) -> dict | None:
    """The sum of several format_count_dict entries (layers of a network, samples of a run)."""
    total: dict | None = None
    for e in entries:
        if total is None:
            total = {"numel": 0, **{f: dict.fromkeys(v, 0) for f, v in e.items() if f != "numel"}}
        total["numel"] += e["numel"]
        for fmt, block in e.items():
            if fmt != "numel":
                for k, v in block.items():
                    total[fmt][k] += v
    return total


def format_fractions(entry: dict) -> dict[str, dict[str, float]]:
    """{"e5m2": {"flush": 0.12, ...}, ...}: fractions over all elements, zeros included."""
    n = max(int(entry["numel"]), 1)
    return {f: {k: v / n for k, v in block.items()} for f, block in entry.items() if f != "numel"}


def format_ranges_from_histogram(hist, fmt: str, shift: int = 0) -> dict[str, int]:
    """{"underflow", "subnormal"} counts in `fmt` of values whose exponent histogram (the full
    N_BINS list, or untrim_histogram of a record's "hist") is `hist`, times 2^shift. Exact, since
    both bounds are powers of two, so it answers the 8-bit question for records already written.
    (flush and overflow are not powers of two away from a bin edge: they need format_counts.)"""
    s, n, _ = FORMAT_RANGES[fmt]
    h = [int(v) for v in hist]

    def below(e: int) -> int:  # count of values under 2^e after the shift
        i = min(max(e - shift - EXP_MIN, 0), N_BINS)
        return sum(h[:i])

    return {"underflow": below(s), "subnormal": below(n) - below(s)}
