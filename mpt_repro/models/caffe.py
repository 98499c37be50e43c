"""Layers and initialisers that reproduce Caffe's semantics in PyTorch, for the networks the
paper trained in Caffe (BVLC AlexNet, BVLC GoogLeNet, BN-Inception).

- Caffe's pooling rounds the output size up (`ceil_mode=True`, no padding in the stem pools);
- Caffe's LRN (across channels) is `x / (k + alpha/n * sum_{n neighbours} x^2)^beta` with k = 1,
  exactly `nn.LocalResponseNorm(n, alpha, beta, k=1)`;
- Caffe's "xavier" filler is uniform in +-sqrt(3 / fan_in) (its default variance_norm FAN_IN),
  not PyTorch's xavier_uniform_ (which uses fan_in + fan_out);
- the auxiliary heads pool 5x5 with stride 3; `AuxPool` does exactly that at the full input size
  and pools adaptively to the same grid when a small (smoke) input leaves less than 5x5.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def max_pool(kernel: int = 3, stride: int = 2, padding: int = 0) -> nn.MaxPool2d:
    """Caffe's MAX pooling: output size rounded up."""
    return nn.MaxPool2d(kernel, stride, padding=padding, ceil_mode=True)


def lrn() -> nn.LocalResponseNorm:
    """The BVLC models' LRN: local_size 5, alpha 1e-4, beta 0.75 (k = 1, Caffe's default)."""
    return nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)


@torch.no_grad()
def xavier_(weight: torch.Tensor) -> torch.Tensor:
    """Caffe's "xavier" filler: U(-a, a) with a = sqrt(3 / fan_in), fan_in = weight.numel() /
    out_channels (for a grouped convolution, the inputs of one group times the kernel area)."""
    fan_in = weight[0].numel()
    bound = math.sqrt(3.0 / fan_in)
    return weight.uniform_(-bound, bound)


class AuxPool(nn.Module):
    """The auxiliary heads' AVE pooling, kernel 5, stride 3, output rounded up: 14x14 -> 4x4 and
    7x7 -> 2x2 at 224 px, as in the prototxts. At the small sizes of the smoke budgets the grid
    can be under 5x5; the input is then pooled adaptively to `grid`, the size the head's fully
    connected layer expects (an identity when the grid already has that size)."""

    def __init__(self, grid: int):
        super().__init__()
        self.grid = grid
        self.pool = nn.AvgPool2d(5, 3, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) >= 5:
            x = self.pool(x)
        if tuple(x.shape[-2:]) != (self.grid, self.grid):
            x = F.adaptive_avg_pool2d(x, self.grid)
        return x

    def extra_repr(self) -> str:
        return f"kernel 5, stride 3, ceil; adaptive to {self.grid}x{self.grid} below that"


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """A convolution's output side (floor rounding)."""
    return (size + 2 * padding - kernel) // stride + 1


def pool_out(size: int, kernel: int = 3, stride: int = 2, padding: int = 0) -> int:
    """A Caffe (ceil-mode) pooling's output side, with PyTorch's rule that the last window must
    start inside the input."""
    out = -(-(size + 2 * padding - kernel) // stride) + 1
    if (out - 1) * stride >= size + padding:
        out -= 1
    return out
