"""Synthetic images: random tensors of the experiment's input shape, for speed measurements."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from mpt_repro.data import ImageData, register_dataset


class RandomImages(Dataset):
    """Deterministic random images and labels (index-seeded), made on the fly: no memory cost."""

    def __init__(self, size: int, channels: int, image_size: int, num_classes: int, seed: int):
        self.size, self.shape, self.num_classes, self.seed = (
            size,
            (channels, image_size, image_size),
            num_classes,
            seed,
        )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randn(self.shape, generator=g), int(
            torch.randint(self.num_classes, (1,), generator=g)
        )


@register_dataset("synthetic")
def synthetic(cfg: Any) -> ImageData:
    make = lambda n, seed: RandomImages(n, cfg.channels, cfg.image_size, cfg.num_classes, seed)  # noqa: E731
    return ImageData(
        train=make(cfg.synthetic_train_size, 1),
        eval=make(cfg.synthetic_eval_size, 2),
        num_classes=cfg.num_classes,
        channels=cfg.channels,
        description=(
            f"synthetic {cfg.channels}x{cfg.image_size}x{cfg.image_size}, {cfg.num_classes} classes"
        ),
    )
