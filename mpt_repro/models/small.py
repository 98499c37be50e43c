"""Small models for the embedded data sets (CPU-sized)."""

from __future__ import annotations

from typing import Any

from torch import nn

from mpt_repro.models import register_model


def conv_bn_relu(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


@register_model("digits_cnn")
def digits_cnn(cfg: Any, num_classes: int, channels: int, **_: Any) -> nn.Module:
    """conv-BN-ReLU x3 (one 2x down-sampling), global average pool, linear: ~20k parameters at width
    32.
    """
    w = cfg.width
    return nn.Sequential(
        conv_bn_relu(channels, w),
        conv_bn_relu(w, w),
        nn.MaxPool2d(2),
        conv_bn_relu(w, 2 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(cfg.dropout),
        nn.Linear(2 * w, num_classes),
    )
