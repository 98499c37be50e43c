"""BVLC GoogLeNet (Inception v1, Szegedy et al. 2015), the network behind the paper's GoogLeNet
row (trained in Caffe): BVLC/caffe `models/bvlc_googlenet/train_val.prototxt`, layer for layer.

- no batch norm; every convolution has a bias and is followed by ReLU;
- LRN (size 5, alpha 1e-4, beta 0.75) after pool1 and after conv2/3x3;
- inception modules with a real 5x5 branch (torchvision's "5x5" is a 3x3, pytorch/vision#906)
  and a 3x3/1 max-pool branch with a 1x1 projection;
- max pools 3/2 with Caffe's ceil rounding between stages (pool1, pool2, pool3, pool4);
- two auxiliary classifiers, on 4a and 4d: AVE 5/3 -> 1x1 conv 128 -> ReLU -> fc 1024 -> ReLU
  -> dropout 0.7 -> fc (classes); their losses weigh 0.3 each (`model.aux_weight`);
- AVE 7/1 pool -> dropout 0.4 -> fc (classes).

Parameters at 1000 classes, counted from the prototxt's layer shapes: 6,998,552 without the
auxiliary heads, 6,379,728 in the two heads, 13,378,280 in all.

Initialisation is the prototxt's: Caffe's "xavier" (U(+-sqrt(3 / fan_in))) for every weight,
biases 0.2, except the three classifiers' biases (0).

Outputs: logits; in training mode with `aux_logits`, the tuple (main, aux1 (4a), aux2 (4d)).
"""

from __future__ import annotations

import torch
from torch import nn

from mpt_repro.models.caffe import AuxPool, lrn, max_pool, xavier_

# name: (input channels, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection)
MODULES = {
    "3a": (192, 64, 96, 128, 16, 32, 32),
    "3b": (256, 128, 128, 192, 32, 96, 64),
    "4a": (480, 192, 96, 208, 16, 48, 64),
    "4b": (512, 160, 112, 224, 24, 64, 64),
    "4c": (512, 128, 128, 256, 24, 64, 64),
    "4d": (512, 112, 144, 288, 32, 64, 64),
    "4e": (528, 256, 160, 320, 32, 128, 128),
    "5a": (832, 256, 160, 320, 32, 128, 128),
    "5b": (832, 384, 192, 384, 48, 128, 128),
}


def conv_relu(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding=k // 2), nn.ReLU(inplace=True))


class Inception(nn.Module):
    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool_proj: int):
        super().__init__()
        self.b1x1 = conv_relu(cin, c1, 1)
        self.b3x3 = nn.Sequential(conv_relu(cin, c3r, 1), conv_relu(c3r, c3, 3))
        self.b5x5 = nn.Sequential(conv_relu(cin, c5r, 1), conv_relu(c5r, c5, 5))
        self.bpool = nn.Sequential(nn.MaxPool2d(3, 1, padding=1), conv_relu(cin, pool_proj, 1))
        self.out_channels = c1 + c3 + c5 + pool_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1x1(x), self.b3x3(x), self.b5x5(x), self.bpool(x)], 1)


class AuxHead(nn.Module):
    """loss1 / loss2 of the prototxt, up to the logits (the softmax loss is the task's)."""

    def __init__(self, cin: int, num_classes: int, dropout: float):
        super().__init__()
        self.pool = AuxPool(4)  # 14x14 -> 4x4 at 224 px
        self.conv = conv_relu(cin, 128, 1)
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(128 * 4 * 4, 1024), nn.ReLU(inplace=True))
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.fc(self.conv(self.pool(x)))))


class CaffeGoogLeNet(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        aux_logits: bool = False,
        dropout: float = 0.4,
        aux_dropout: float = 0.7,
    ):
        super().__init__()
        self.stem = nn.Sequential(
            conv_relu(3, 64, 7, stride=2),  # conv1/7x7_s2
            max_pool(),  # pool1/3x3_s2
            lrn(),  # pool1/norm1
            conv_relu(64, 64, 1),  # conv2/3x3_reduce
            conv_relu(64, 192, 3),  # conv2/3x3
            lrn(),  # conv2/norm2
            max_pool(),  # pool2/3x3_s2
        )
        m = {name: Inception(*spec) for name, spec in MODULES.items()}
        self.stage3 = nn.Sequential(m["3a"], m["3b"], max_pool())  # ends with pool3/3x3_s2
        self.inception_4a = m["4a"]
        self.stage4bcd = nn.Sequential(m["4b"], m["4c"], m["4d"])
        self.stage4e5 = nn.Sequential(m["4e"], max_pool(), m["5a"], m["5b"])
        self.aux1 = AuxHead(m["4a"].out_channels, num_classes, aux_dropout) if aux_logits else None
        self.aux2 = AuxHead(m["4d"].out_channels, num_classes, aux_dropout) if aux_logits else None
        # pool5/7x7_s1 averages the 7x7 grid of a 224 px input: a global average pool.
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout))
        self.classifier = nn.Linear(m["5b"].out_channels, num_classes)
        self._init()

    def _init(self) -> None:
        classifiers = {self.classifier}
        classifiers |= {h.classifier for h in (self.aux1, self.aux2) if h is not None}
        for mod in self.modules():
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                xavier_(mod.weight)
                nn.init.constant_(mod.bias, 0.0 if mod in classifiers else 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x = self.inception_4a(self.stage3(self.stem(x)))
        aux1 = self.aux1(x) if self.aux1 is not None and self.training else None
        x = self.stage4bcd(x)
        aux2 = self.aux2(x) if self.aux2 is not None and self.training else None
        logits = self.classifier(self.head(self.stage4e5(x)))
        if aux1 is None:
            return logits
        return logits, aux1, aux2
