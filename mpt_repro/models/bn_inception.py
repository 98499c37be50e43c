"""BN-Inception, the paper's "Inception v2" row (Ioffe & Szegedy 2015, "Batch Normalization"),
as the public Caffe model defines it: BVLC/caffe branch `intel`,
`models/default_googlenet_v2/train_val.prototxt` (with its `solver.prototxt`, the recipe we
follow). torchvision has no such model.

What distinguishes it from GoogLeNet (Inception v1):
- every convolution and hidden fully connected layer is followed by batch norm (no bias), then
  ReLU;
- the 5x5 branch is replaced by two stacked 3x3 convolutions ("double 3x3");
- grids shrink inside modules 3c and 4e (stride-2 3x3 branches beside a 3x3/2 max-pool that
  passes its input through unprojected), not by separate pooling layers between stages;
- pooling branches average (3x3/1, padding counted, as Caffe's AVE), except module 5b's, which
  takes the maximum;
- two auxiliary classifiers, after 3c and after 4e: AVE 5/3 -> 1x1 conv 128 -> BN -> ReLU ->
  fc 1024 -> BN -> ReLU -> fc (classes), loss weight 0.3 each (`model.aux_weight`); no dropout
  anywhere (the BN paper removed it).

Widths are the prototxt's; they match the BN paper's appendix table except the pool
projections of 4c and 4d, 96 in the prototxt. Stem and grid-reducing max-pools have no padding
and round up, as Caffe's; with 224 px: 112 -> 56 -> 28 -> 14 (3c) -> 7 (4e).

Parameters at 1000 classes, counted from the prototxt's layer shapes (BN scale and shift
counted, running statistics not): 11,194,984 without the auxiliary heads, 4,880,848 in the two
heads, 16,075,832 in all.

Initialisation is the prototxt's: Caffe's "xavier" (U(+-sqrt(3 / fan_in))) for every weight,
classifier biases 0, BN scale 1 and shift 0.

Outputs: logits; in training mode with `aux_logits`, the tuple (main, aux1 (3c), aux2 (4e)).
"""

from __future__ import annotations

import torch
from torch import nn

from mpt_repro.models.caffe import AuxPool, conv_out, max_pool, pool_out, xavier_


def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class InceptionBN(nn.Module):
    """One module: [1x1] [1x1 -> 3x3] [1x1 -> 3x3 -> 3x3] [pool -> 1x1 projection], concatenated.

    stride=2 (modules 3c, 4e): no 1x1 branch, the last 3x3 of both conv branches has stride 2, and
    the pool branch is a 3x3/2 max-pool without projection (pool_proj=0).
    """

    def __init__(
        self,
        cin: int,
        c1: int,
        c3r: int,
        c3: int,
        d3r: int,
        d3: int,
        pool: str,
        pool_proj: int,
        stride: int = 1,
    ):
        super().__init__()
        self.branch1 = conv_bn(cin, c1, 1) if c1 else None
        self.branch3 = nn.Sequential(conv_bn(cin, c3r, 1), conv_bn(c3r, c3, 3, stride))
        self.branch_d3 = nn.Sequential(
            conv_bn(cin, d3r, 1), conv_bn(d3r, d3, 3), conv_bn(d3, d3, 3, stride)
        )
        if stride == 2:
            pooling: nn.Module = max_pool(3, 2)
        elif pool == "avg":
            pooling = nn.AvgPool2d(3, 1, padding=1, count_include_pad=True)
        else:
            pooling = nn.MaxPool2d(3, 1, padding=1)
        self.branch_pool = (
            nn.Sequential(pooling, conv_bn(cin, pool_proj, 1)) if pool_proj else pooling
        )
        self.out_channels = c1 + c3 + d3 + (pool_proj or cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [self.branch3(x), self.branch_d3(x), self.branch_pool(x)]
        if self.branch1 is not None:
            outs.insert(0, self.branch1(x))
        return torch.cat(outs, 1)


# name: (1x1, 3x3 reduce, 3x3, double-3x3 reduce, double 3x3, pool type, pool projection, stride)
MODULES = [
    ("3a", 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 0, 128, 160, 64, 96, "max", 0, 2),
    ("4a", 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 160, 128, 160, 128, 160, "avg", 96, 1),
    ("4d", 96, 128, 192, 160, 192, "avg", 96, 1),
    ("4e", 0, 128, 192, 192, 256, "max", 0, 2),
    ("5a", 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 352, 192, 320, 192, 224, "max", 128, 1),
]


class AuxHeadBN(nn.Module):
    """loss1 / loss2 of the prototxt, up to the logits."""

    def __init__(self, cin: int, grid: int, num_classes: int):
        super().__init__()
        self.pool = AuxPool(grid)
        self.conv = conv_bn(cin, 128, 1)
        self.fc = nn.Sequential(
            nn.Flatten(),
            nn.Linear(128 * grid * grid, 1024, bias=False),
            nn.BatchNorm1d(1024),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.fc(self.conv(self.pool(x))))


class BNInception(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.0, aux_logits: bool = False):
        super().__init__()
        self.stem = nn.Sequential(
            conv_bn(3, 64, 7, stride=2),  # 224 -> 112
            max_pool(3, 2),  # -> 56
            conv_bn(64, 64, 1),
            conv_bn(64, 192, 3),
            max_pool(3, 2),  # -> 28
        )
        modules, cin = {}, 192
        for name, *spec in MODULES:
            modules[name] = InceptionBN(cin, *spec)
            cin = modules[name].out_channels
        names = list(modules)
        # Three stages split where the auxiliary heads read: after 3c (14x14) and 4e (7x7).
        self.stage3 = nn.Sequential(*(modules[n] for n in names[:3]))
        self.stage4 = nn.Sequential(*(modules[n] for n in names[3:8]))
        self.stage5 = nn.Sequential(*(modules[n] for n in names[8:]))
        self.aux1 = AuxHeadBN(modules["3c"].out_channels, 4, num_classes) if aux_logits else None
        self.aux2 = AuxHeadBN(modules["4e"].out_channels, 2, num_classes) if aux_logits else None
        # pool5/7x7_s1 averages the 7x7 grid of a 224 px input: a global average pool.
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout))
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                xavier_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    @property
    def inception(self) -> list[nn.Module]:
        """The ten modules in order (3a ... 5b)."""
        return [*self.stage3, *self.stage4, *self.stage5]

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x = self.stage3(self.stem(x))
        aux1 = self.aux1(x) if self.aux1 is not None and self.training else None
        x = self.stage4(x)
        aux2 = self.aux2(x) if self.aux2 is not None and self.training else None
        logits = self.fc(self.pool(self.stage5(x)))
        if aux1 is None:
            return logits
        return logits, aux1, aux2


def grid_problem(image_size: int) -> str | None:
    """Why `image_size` cannot pass through the network, or None. Modules 3c and 4e concatenate a
    3x3/2 convolution (floor rounding) with a 3x3/2 max-pool (Caffe's ceil rounding): their
    outputs agree only on an even grid, as at 224 px (28 and 14)."""
    grid = pool_out(conv_out(image_size, 7, 2, 3))  # conv1 + pool1
    grid = pool_out(grid)  # pool2
    for name in ("3c", "4e"):
        if grid < 2 or conv_out(grid, 3, 2, 1) != pool_out(grid):
            return f"its {name} module sees a {grid}x{grid} grid (needs an even side >= 2)"
        grid = conv_out(grid, 3, 2, 1)
    return None
