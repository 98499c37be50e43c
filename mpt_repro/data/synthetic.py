"""Synthetic images for speed measurements: generated once, kept on the training device.

A pool of `data.synthetic_pool` random uint8 images lives on the device (drawn on the CPU, so
the pixels are the same on every device); sample i is pool image i mod pool with its own random
label. A training batch is one gather from the pool and one normalisation kernel, both on the
device: no per-step host work, no host-to-device copy, so a benchmark on data=synthetic
measures the model's step and nothing of an input pipeline. Pixels are uniform over 0..255 and
normalised to [-1, 1] (the range a tanh generator produces too). Labels are uniform over the
classes. Accuracy on it means nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from mpt_repro.data import ImageData, register_dataset
from mpt_repro.data.device import normalize_on_device

MEAN = STD = 0.5  # every channel: uint8 noise maps to [-1, 1]


class SyntheticImages(Dataset):
    """`size` samples over a pool of `pool` images. place(device) makes the pool there, once;
    until then (or for a CPU DataLoader) it lives on the CPU."""

    def __init__(
        self, size: int, channels: int, image_size: int, num_classes: int, pool: int, seed: int
    ):
        self.size, self.seed = size, seed
        self.shape = (min(pool, size), channels, image_size, image_size)
        # one mean and std per channel: three would broadcast a 1-channel image to RGB
        self.mean, self.std = (MEAN,) * channels, (STD,) * channels
        self.labels = self._cpu_labels = torch.randint(
            num_classes, (size,), generator=torch.Generator().manual_seed(seed)
        )
        self.pool: torch.Tensor | None = None
        self._cpu_pool: torch.Tensor | None = None
        self.device: torch.device | None = None

    def place(self, device: torch.device) -> None:
        """Put the pool on `device` (the same pixels on every device, for a seed). It is drawn on
        the CPU and kept there too: loader workers (BN recalibration with data.num_workers > 0)
        read that copy, since a forked worker must not touch CUDA."""
        device = torch.device(device)
        if self.pool is not None and self.pool.device == device:
            return
        if self._cpu_pool is None:
            g = torch.Generator().manual_seed(self.seed)
            self._cpu_pool = torch.randint(0, 256, self.shape, dtype=torch.uint8, generator=g)
        self.pool = self._cpu_pool.to(device)
        self.labels = self._cpu_labels.to(device)
        self.device = device

    def __len__(self) -> int:
        return self.size

    def batch(
        self,
        indices: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples `indices` (a tensor on the pool's device) as a model-ready batch."""
        if self.pool is None:
            self.place(indices.device)
        images = self.pool.index_select(0, indices.remainder(self.shape[0]))
        x = normalize_on_device(images, self.mean, self.std, dtype, memory_format)
        return x, self.labels[indices]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        """One sample on the CPU (for code that indexes the data set, e.g. a DataLoader with
        workers): the same pixels as on the device, read from the CPU copy only."""
        if self._cpu_pool is None:
            self.place(torch.device("cpu"))
        image = self._cpu_pool[i % self.shape[0]][None]
        return normalize_on_device(image, self.mean, self.std)[0], int(self._cpu_labels[i])

    def __getstate__(self) -> dict:
        """Pickled for spawned loader workers without the device copies: a worker that unpickled
        a CUDA tensor would start CUDA in its process."""
        state = dict(self.__dict__)
        state.update(pool=self._cpu_pool, labels=self._cpu_labels, device=None)
        return state


@register_dataset("synthetic")
def synthetic(cfg: Any) -> ImageData:
    def make(n: int, seed: int) -> SyntheticImages:
        return SyntheticImages(
            n, cfg.channels, cfg.image_size, cfg.num_classes, cfg.synthetic_pool, seed
        )

    # a budget's data.train_limit and data.eval_limit cut these splits as they cut every data
    # set's (build_image_data), so a budget file never needs a key of this data set alone
    return ImageData(
        train=make(cfg.synthetic_train_size, 1),
        eval=make(cfg.synthetic_eval_size, 2),
        num_classes=cfg.num_classes,
        channels=cfg.channels,
        description=(
            f"synthetic {cfg.channels}x{cfg.image_size}x{cfg.image_size}, {cfg.num_classes} "
            f"classes, a pool of {min(cfg.synthetic_pool, cfg.synthetic_train_size)} images on "
            "the training device"
        ),
    )
