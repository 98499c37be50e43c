"""BN-Inception, the paper's "Inception v2" row (Ioffe & Szegedy 2015, "Batch Normalization",
appendix Table: the Inception network with batch norm). torchvision has no such model.

What distinguishes it from GoogLeNet (Inception v1):
- every convolution is followed by batch norm (conv has no bias), then ReLU;
- the 5x5 branch is replaced by two stacked 3x3 convolutions ("double 3x3");
- grids shrink inside modules 3c and 4e (stride-2 3x3 branches beside a max-pool that passes its
  input through unprojected), not by separate pooling layers between stages;
- pooling branches use average pooling, except the last module (5b), which uses max pooling;
- no auxiliary heads in the model, no dropout before the classifier (the BN paper removed it).

Widths below are the appendix table's (the same numbers appear in the public Caffe
`default_googlenet_v2/train_val.prototxt`). About 11.3 M parameters at 1000 classes.

Max-pools use padding 1 instead of Caffe's ceil rounding: the output size is the same for even
inputs (224 px: 112 -> 56 -> 28 -> 14 -> 7), and at odd sizes it stays equal to the stride-2
convolutions' output, which lets the small smoke sizes concatenate branches.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpt_repro.models import he_init_, register_model


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
        pooling = (
            nn.AvgPool2d(3, stride, padding=1, count_include_pad=True)
            if pool == "avg"
            else nn.MaxPool2d(3, stride, padding=1)
        )
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
    ("4c", 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 0, 128, 192, 192, 256, "max", 0, 2),
    ("5a", 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 352, 192, 320, 192, 224, "max", 128, 1),
]


class BNInception(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.0):
        super().__init__()
        self.stem = nn.Sequential(
            conv_bn(3, 64, 7, stride=2),  # 224 -> 112
            nn.MaxPool2d(3, 2, padding=1),  # -> 56
            conv_bn(64, 64, 1),
            conv_bn(64, 192, 3),
            nn.MaxPool2d(3, 2, padding=1),  # -> 28
        )
        modules, cin = [], 192
        for _name, *spec in MODULES:
            m = InceptionBN(cin, *spec)
            modules.append(m)
            cin = m.out_channels
        self.inception = nn.Sequential(*modules)  # 28 -> 14 (3c) -> 7 (4e), 1024 channels
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout))
        self.fc = nn.Linear(cin, num_classes)
        he_init_(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.inception(self.stem(x))))


@register_model("inception_v2")
def inception_v2(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    from mpt_repro.models.vision import check_input

    # Five 2x reductions (stem conv, two stem pools, 3c, 4e): 32 px leaves a 1x1 grid.
    check_input("inception_v2", channels, image_size, min_size=32)
    return BNInception(num_classes, dropout=cfg.dropout)
