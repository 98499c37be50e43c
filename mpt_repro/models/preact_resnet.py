"""Pre-activation ResNet-50 (He, Zhang, Ren, Sun 2016b, "Identity Mappings in Deep Residual
Networks"): the "Resnet50 (pre-activation)" row of the paper's Table 1.

Differences from the original (post-activation) ResNet:
- each residual unit computes BN -> ReLU -> conv three times, and adds its input unchanged
  (nothing follows the addition), so the identity path is clean from the first to the last block;
- a projection shortcut (1x1 conv, where the shape changes) reads the *pre-activated* input;
- the very first unit skips its BN-ReLU: the stem (conv-BN-ReLU-maxpool) has just applied one;
- one BN -> ReLU after the last unit, before global average pooling.
The layout follows fb.resnet.torch's preresnet.lua (the authors' code for the ImageNet runs):
stem conv 7x7/2 -> BN -> ReLU -> max-pool 3x3/2; bottleneck units [3, 4, 6, 3] with widths
64/128/256/512 (x4 expansion); stride on the 3x3 convolution.
Parameters at 1000 classes: 25.55 M (the BNs move, they do not multiply).
"""

from __future__ import annotations

import torch
from torch import nn

from mpt_repro.models import he_init_


class PreActBottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, preact: bool = True):
        super().__init__()
        out_ch = width * self.expansion
        # preact=False for the network's first unit: its input left the stem's BN-ReLU already.
        self.bn1 = nn.BatchNorm2d(in_ch) if preact else None
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        # Projection only where the shape changes (the first unit of each stage).
        self.shortcut = None
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Not in-place: x itself is the identity shortcut.
        pre = torch.relu(self.bn1(x)) if self.bn1 is not None else x
        shortcut = self.shortcut(pre) if self.shortcut is not None else x
        out = self.conv1(pre)
        out = self.conv2(self.relu(self.bn2(out)))
        out = self.conv3(self.relu(self.bn3(out)))
        return out + shortcut


class PreActResNet(nn.Module):
    def __init__(self, blocks: list[int], num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        layers, in_ch = [], 64
        for stage, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512))):
            for i in range(n):
                stride = 2 if (i == 0 and stage > 0) else 1
                layers.append(PreActBottleneck(in_ch, width, stride, preact=bool(layers)))
                in_ch = width * PreActBottleneck.expansion
        self.layers = nn.Sequential(*layers)
        # The last unit's output has not been normalised: one BN-ReLU before pooling.
        self.head = nn.Sequential(
            nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.fc = nn.Linear(in_ch, num_classes)
        he_init_(self)  # He et al. 2015, as fb.resnet.torch and torchvision

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.head(self.layers(self.stem(x))))


def preact_resnet50(num_classes: int = 1000) -> PreActResNet:
    return PreActResNet([3, 4, 6, 3], num_classes)
