"""The static loss scale by the paper's §3.2 method, from a run's gradient histograms.

Micikevicius et al. 2018, §3.2: collect gradient statistics in an FP32 run and choose a factor
that moves the histogram's mass above FP16's smallest subnormal (2^-24) while the largest
gradient times the factor stays below 65,504. Both bounds are powers of two 2^k:

* overflow bound k_over: the largest k with max|g| * 2^k < 65504, max|g| < 2^(e_max+1) being all
  the histogram says of the largest gradient (its top bin e_max): k_over = 14 - e_max;
* underflow bound k_under: the smallest k keeping a fraction `keep` of the nonzero gradients at
  or above 2^-24 (formats.smallest_keeping_shift).

The margin is k_over - k_under binades. When it is >= 0 the advised scale is its middle (rounded
down): gradients that grow during training and gradients that shrink get the same room. When it
is negative no single scale does both; the advised scale is then the overflow bound (an overflow
costs a step or the run, an underflow a fraction of the smallest gradients), and the layers that
lose more than 1 - keep of their gradients there are the ones that need their own scale.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpt_repro.advise import formats as fm
from mpt_repro.advise.evidence import KINDS, RunEvidence, pooled

Hist = dict[int, int]


@dataclass
class StaticScale:
    """The §3.2 bounds of one set of gradients, as powers of two (None: no gradients)."""

    k_over: int | None
    k_under: int | None
    keep: float

    @property
    def margin(self) -> int | None:
        if self.k_over is None or self.k_under is None:
            return None
        return self.k_over - self.k_under

    @property
    def advised(self) -> int | None:
        if self.margin is None:
            return None
        if self.margin < 0:
            return self.k_over
        return self.k_under + self.margin // 2


def static_scale(hist: Hist, keep: float) -> StaticScale:
    return StaticScale(
        fm.largest_safe_shift(hist, fm.FP16), fm.smallest_keeping_shift(hist, fm.FP16, keep), keep
    )


def gradients(evidence: RunEvidence, layer: str | None = None) -> Hist:
    """Activation and weight gradients together (both go through FP16 in the FP16 recipes), of
    the network or of one layer."""
    layers = evidence.layers.values() if layer is None else [evidence.layers[layer]]
    return pooled(lay.hist(kind) for lay in layers for kind in KINDS)


@dataclass
class LayerNeed:
    """A layer that the network-wide scale does not serve: what it would need instead."""

    layer: str
    lost: float  # fraction of its nonzero gradients below 2^-24 at the network's scale
    at_risk: int  # its values that may exceed 65504 there (or do)
    own: StaticScale  # its own §3.2 bounds
    need: str  # "a per-layer scale 2^k" or "FP32 (or BF16)"
    label: str = ""  # the layer as its model names it (`3.1 Linear`); "" : its path

    @property
    def shown(self) -> str:
        return self.label or self.layer


def layer_needs(evidence: RunEvidence, k: int, keep: float) -> list[LayerNeed]:
    """The layers that at the network's scale 2^k lose more than 1 - keep of their gradients or
    may overflow, with what they would need (Zhao et al.'s per-layer view, as precision=adaptive
    applies it): their own scale when their own bounds leave a margin, else a wider format."""
    needs = []
    for name in evidence.layers:
        hist = gradients(evidence, name)
        counts = fm.range_counts(hist, fm.FP16, k)
        risky = counts.overflow + counts.at_risk
        if not counts.nonzero or (counts.fraction("lost") <= 1.0 - keep and not risky):
            continue
        own = static_scale(hist, keep)
        if own.margin is not None and own.margin >= 0:
            need = f"a per-layer scale 2^{own.advised}"
        else:
            need = "FP32 (or BF16): its gradients span more than FP16's range"
        label = evidence.layer_label(name)
        needs.append(LayerNeed(name, counts.fraction("lost"), risky, own, need, label))
    return needs
