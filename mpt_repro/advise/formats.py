"""The number formats the advice weighs, and what each does to values whose exponent histogram
is known.

A histogram here is ``{exponent: count}``: the count of nonzero finite values x with
floor(log2|x|) = exponent, i.e. in [2^e, 2^(e+1)), as telemetry records it (docs/telemetry.md).
Multiplying the values by 2^k moves every count k bins up, exactly, so the ranges below are
exact for any power-of-two scale, with one exception: the top bin of a format holds values on
both sides of its largest finite value (FP16's bin 15 is [32768, 65536), its largest value
65504), so a count there is reported as *at risk*, not as overflowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpt_repro.telemetry import numerics as nx

Hist = dict[int, int]


@dataclass(frozen=True)
class Window:
    """A floating-point format's range: smallest subnormal 2^subnormal_exp, smallest normal
    2^normal_exp, largest finite value max_finite."""

    name: str
    subnormal_exp: int
    normal_exp: int
    max_finite: float

    @property
    def top_exp(self) -> int:
        """The bin that holds max_finite: values there may or may not exceed it."""
        return math.floor(math.log2(self.max_finite))

    @property
    def binades(self) -> int:
        """Powers of two from the smallest subnormal to the top bin, both included."""
        return self.top_exp - self.subnormal_exp + 1


def _window(name: str, key: str) -> Window:
    s, n, top = nx.FORMAT_RANGES[key]  # the telemetry's own table: one definition of each format
    return Window(name, s, n, top)


# BF16: FP32's 8 exponent bits, 7 mantissa bits: smallest subnormal 2^-133, smallest normal
# 2^-126, largest finite (2 - 2^-7) * 2^127.
BF16 = Window("BF16", -133, -126, (2 - 2**-7) * 2.0**127)
FP16 = _window("FP16", "fp16")
E4M3 = _window("E4M3", "e4m3")
E5M2 = _window("E5M2", "e5m2")
WINDOWS = {"fp16": FP16, "bf16": BF16, "e4m3": E4M3, "e5m2": E5M2}


FIELDS = ("lost", "subnormal", "overflow", "at_risk")


@dataclass
class RangeCounts:
    """What a format does to the values of a histogram times 2^shift (counts of values)."""

    nonzero: int = 0  # every value of the histogram (nonzero and finite in FP32)
    lost: int = 0  # below the smallest subnormal: flushed to zero, or rounded up to it
    subnormal: int = 0  # kept with fewer significant bits
    overflow: int = 0  # certainly above the largest finite value (a bin above the top bin)
    at_risk: int = 0  # in the top bin: above the largest finite value only near the bin's end

    def add(self, other: RangeCounts) -> None:
        self.nonzero += other.nonzero
        self.lost += other.lost
        self.subnormal += other.subnormal
        self.overflow += other.overflow
        self.at_risk += other.at_risk

    def fraction(self, field: str) -> float:
        """A count as a fraction of the nonzero values (0.0 when there are none)."""
        return getattr(self, field) / self.nonzero if self.nonzero else 0.0


def range_counts(hist: Hist, window: Window, shift: int = 0) -> RangeCounts:
    """Counts of the values of `hist` times 2^shift that `window` loses, keeps as subnormals,
    overflows, or may overflow."""
    out = RangeCounts()
    for e, c in hist.items():
        moved = e + shift
        out.nonzero += c
        if moved < window.subnormal_exp:
            out.lost += c
        elif moved < window.normal_exp:
            out.subnormal += c
        elif moved > window.top_exp:
            out.overflow += c
        elif moved == window.top_exp and 2.0 ** (moved + 1) > window.max_finite:
            out.at_risk += c
    return out


def bins_text(window: Window, shift: int) -> dict[str, str]:
    """The bins (exponents of the unscaled values) each count of range_counts sums: the trace
    from a figure back to its histogram."""
    lo, normal, top = (
        window.subnormal_exp - shift,
        window.normal_exp - shift,
        window.top_exp - shift,
    )
    return {
        "lost": f"e < {lo}",
        "subnormal": f"{lo} <= e < {normal}",
        "overflow": f"e > {top}",
        "at_risk": f"e = {top}",
    }


def top_exponent(hist: Hist) -> int | None:
    return max(hist) if hist else None


def largest_safe_shift(hist: Hist, window: Window) -> int | None:
    """The largest k with every value of `hist` times 2^k below the format's largest finite
    value, as far as the histogram can prove it: its top bin's values are < 2^(e_max+1), so
    2^(e_max+1+k) <= max_finite (None for an empty histogram)."""
    e_max = top_exponent(hist)
    if e_max is None:
        return None
    k = window.top_exp - e_max
    while 2.0 ** (e_max + 1 + k) > window.max_finite:
        k -= 1
    return k


def smallest_keeping_shift(hist: Hist, window: Window, keep: float) -> int | None:
    """The smallest k with at least a fraction `keep` of the values of `hist` times 2^k at or
    above the format's smallest subnormal (None for an empty histogram)."""
    total = sum(hist.values())
    if not total:
        return None
    allowed = (1.0 - keep) * total  # values that may stay below
    below = 0
    for e in sorted(hist):
        below += hist[e]
        if below > allowed:  # bin e must be kept: it is the lowest one that has to land above
            return window.subnormal_exp - e
    return window.subnormal_exp - max(hist)  # keep == 0: nothing needs to be kept


def per_tensor_shift(hist: Hist, window: Window) -> int | None:
    """The per-tensor scale 2^k an FP8 kernel gives a tensor whose histogram is `hist`: the
    largest power of two with amax * 2^k <= max_finite (mpt_repro/precision/fp8.py,
    tensorwise_scale), which puts amax in the format's top bin. The histogram knows amax only to
    its bin [2^e, 2^(e+1)): this is the kernel's k unless amax lies in the top eighth of that bin
    (above 1.75 * 2^e, the mantissa of E4M3's 448 and E5M2's 57344), where the kernel takes one
    binade less."""
    e_max = top_exponent(hist)
    return None if e_max is None else window.top_exp - e_max
