"""BVLC AlexNet, the network behind the paper's AlexNet row (trained in Caffe): BVLC/caffe
`models/bvlc_alexnet/train_val.prototxt`, layer for layer.

    conv1 96 11x11/4 -> ReLU -> LRN -> max 3/2      conv2 256 5x5 pad 2, 2 groups -> ReLU -> LRN
    -> max 3/2 -> conv3 384 3x3 -> ReLU -> conv4 384 3x3, 2 groups -> ReLU -> conv5 256 3x3,
    2 groups -> ReLU -> max 3/2 -> fc6 4096 -> ReLU -> dropout 0.5 -> fc7 4096 -> ReLU ->
    dropout 0.5 -> fc8 (classes)

60,965,224 parameters at 1000 classes (the prototxt's layer shapes at its 227 px crop). It
differs from torchvision's AlexNet (the one-GPU variant of "One weird trick": 64-192-384-256-256,
no LRN, no groups), which `model.variant=torchvision` keeps.

Initialisation is the prototxt's: weights N(0, 0.01) (fc6, fc7: N(0, 0.005)); biases 0 (conv1,
conv3, fc8) or 0.1 (conv2, conv4, conv5, fc6, fc7). Module names follow the prototxt's layer
names, so parameter names (`features.conv2.bias`) point back to it.

One addition: an adaptive average pool to 6x6 before fc6, the identity at 227 px (pool5 is 6x6
there), so the smoke budgets' small inputs still reach the 9216-input fc6.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from mpt_repro.models.caffe import lrn, max_pool

# (std of the weight, constant bias) per layer, from the prototxt's fillers
FILLERS = {
    "conv1": (0.01, 0.0),
    "conv2": (0.01, 0.1),
    "conv3": (0.01, 0.0),
    "conv4": (0.01, 0.1),
    "conv5": (0.01, 0.1),
    "fc6": (0.005, 0.1),
    "fc7": (0.005, 0.1),
    "fc8": (0.01, 0.0),
}


class CaffeAlexNet(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        relu = lambda: nn.ReLU(inplace=True)  # noqa: E731
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(3, 96, 11, stride=4),
                relu1=relu(),
                norm1=lrn(),
                pool1=max_pool(),
                conv2=nn.Conv2d(96, 256, 5, padding=2, groups=2),
                relu2=relu(),
                norm2=lrn(),
                pool2=max_pool(),
                conv3=nn.Conv2d(256, 384, 3, padding=1),
                relu3=relu(),
                conv4=nn.Conv2d(384, 384, 3, padding=1, groups=2),
                relu4=relu(),
                conv5=nn.Conv2d(384, 256, 3, padding=1, groups=2),
                relu5=relu(),
                pool5=max_pool(),
            )
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))  # identity at 227 px
        self.classifier = nn.Sequential(
            OrderedDict(
                fc6=nn.Linear(256 * 6 * 6, 4096),
                relu6=relu(),
                drop6=nn.Dropout(dropout),
                fc7=nn.Linear(4096, 4096),
                relu7=relu(),
                drop7=nn.Dropout(dropout),
                fc8=nn.Linear(4096, num_classes),
            )
        )
        layers = {**dict(self.features.named_children()), **dict(self.classifier.named_children())}
        for name, (std, bias) in FILLERS.items():
            nn.init.normal_(layers[name].weight, 0.0, std)
            nn.init.constant_(layers[name].bias, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
