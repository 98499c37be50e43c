"""A model where loss scaling matters: a narrow ReLU MLP with a long product of small backward
gains, in the spirit of the paper's SSD example (§4.2), where activation gradients fall below
FP16's range.

After every hidden layer a ``GradientWeight(k)`` is the identity in the forward and multiplies
the gradient by k in the backward (default k = 2^-6, like a layer whose Jacobian shrinks the
gradient 64x: a small loss weight compounded with depth). Four layers take the activation
gradients from ~2^-8 at the readout to ~2^-32 at the input: in FP16 without loss scaling the
lower layers' gradients flush to zero and they stop learning. FP32 (with Adam, whose step does
not depend on the gradient's magnitude), a global loss scale (`mixed`) and per-layer scales
(`adaptive`, each layer's scale making up for the gains above it) keep them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from mpt_repro.models import register_model


class _Weight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None  # in the gradient's own dtype: FP16 in the FP16 presets


class GradientWeight(nn.Module):
    """Identity forward; the gradient flowing back through it is multiplied by ``k``."""

    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Weight.apply(x, self.k)

    def extra_repr(self) -> str:
        return f"k=2^{math.log2(self.k):g}"


@register_model("small_grad_mlp")
def small_grad_mlp(
    cfg: Any, num_classes: int, channels: int, image_size: int, **_: Any
) -> nn.Module:
    """Flatten, model.num_layers x (Linear(width), ReLU, GradientWeight(k)), Linear readout.
    k = 2^-6 per layer; model.variant="log2k=-4" changes the exponent."""
    log2k = float(cfg.variant.split("=", 1)[1]) if cfg.variant.startswith("log2k=") else -6.0
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = channels * image_size * image_size
    for _ in range(cfg.num_layers):
        layers += [nn.Linear(fan_in, cfg.width), nn.ReLU(), GradientWeight(2.0**log2k)]
        fan_in = cfg.width
    layers.append(nn.Linear(fan_in, num_classes))
    return nn.Sequential(*layers)
