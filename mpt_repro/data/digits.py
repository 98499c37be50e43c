"""scikit-learn's handwritten digits: the embedded default data set (real, offline, 1797 images)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from mpt_repro.data import ImageData, register_dataset


@register_dataset("digits")
def digits(cfg: Any) -> ImageData:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    raw = load_digits()
    images = (raw.images.astype(np.float32) / 16.0 - 0.5) / 0.5  # pixel values 0..16 -> [-1, 1]
    x_train, x_val, y_train, y_val = train_test_split(
        images, raw.target, test_size=0.2, random_state=0, stratify=raw.target
    )

    def as_dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y).long())

    return ImageData(
        train=as_dataset(x_train, y_train),
        eval=as_dataset(x_val, y_val),
        num_classes=10,
        channels=1,
        description="scikit-learn digits (8x8, 1437 train / 360 validation)",
    )
