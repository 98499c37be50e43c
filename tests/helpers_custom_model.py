"""A user's own model, as `model=custom model.target=helpers_custom_model:tiny_classifier` finds
it (tests/ is on the path of the tests; a run puts it on PYTHONPATH)."""

from __future__ import annotations

from torch import nn


def tiny_classifier(num_classes: int, in_channels: int = 3, width: int = 8) -> nn.Module:
    """conv-BN-ReLU, global average pool, linear: any image size, `in_channels` channels."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, num_classes),
    )


def not_a_module(num_classes: int) -> str:
    return f"{num_classes} classes"


NOT_CALLABLE = 3


def small_cnn(num_classes: int, in_channels: int = 3, width: int = 16) -> nn.Module:
    """Two conv-ReLU layers, pooled to 4x4, and a linear head: learns the 8x8 digits in a few
    epochs, where tiny_classifier's global pool does not (mpt_repro/advise/check.py)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(width * 16, num_classes),
    )
