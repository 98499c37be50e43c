"""CIFAR-10 in the python-pickle layout its official tarball unpacks to (cifar-10-python.tar.gz
from https://www.cs.toronto.edu/~kriz/cifar.html):

    cifar-10-batches-py/data_batch_1 ... data_batch_5   50,000 training images
    cifar-10-batches-py/test_batch                      10,000 test images
    cifar-10-batches-py/batches.meta                    the class names

Each batch is a pickled dict with b"data" (N x 3072 uint8: the red, green and blue planes of a
32x32 image, row-major) and b"labels" (N ints in 0..9). data.root may name the
cifar-10-batches-py folder itself or the folder holding it.

The images are held in memory as uint8 (150 MB for the training set); the loaders hand uint8
batches to the device, which normalises them (as ImageNet's), so nothing is converted per image on
the host. data.augmentation=cifar adds the usual training augmentation (4-pixel zero padding, a
random 32x32 crop, a random horizontal flip); none keeps the images as they are.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from mpt_repro.data import ImageData, data_root, register_dataset
from mpt_repro.data.device import normalize_on_device
from mpt_repro.errors import DataError

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILE = "test_batch"
LAYOUT = (
    f"{FOLDER}/ with data_batch_1 ... data_batch_5, test_batch and batches.meta, as "
    "cifar-10-python.tar.gz unpacks (https://www.cs.toronto.edu/~kriz/cifar.html)"
)
# the per-channel mean and standard deviation of the CIFAR-10 training set (in [0, 1] units),
# as torchvision's and most CIFAR recipes normalise
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class CIFARSplit(Dataset):
    """One split as uint8 images (N, 3, 32, 32) and labels. `load_uint8(i)` is what the loaders
    read (augmented when `augment`); `ds[i]` is the normalised float image."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, augment: bool = False):
        self.images, self.labels, self.augment = images, labels, augment

    def __len__(self) -> int:
        return len(self.labels)

    def load_uint8(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.images[index]
        if self.augment:  # drawn from the loader's generator-seeded RNG: the same per seed
            padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
            top, left = (int(v) for v in torch.randint(0, 9, (2,)))
            x = padded[:, top : top + 32, left : left + 32]
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
        return x, int(self.labels[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x, y = self.load_uint8(index)
        return normalize_on_device(x[None], MEAN, STD)[0], y

    def device_prepare(
        self, device: torch.device, dtype: torch.dtype, memory_format: torch.memory_format
    ) -> Callable[[Any], tuple[torch.Tensor, torch.Tensor]]:
        """A loader batch of load_uint8 samples -> model input on the device."""

        def prepare(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = batch
            x = normalize_on_device(
                x.to(device, non_blocking=True), MEAN, STD, dtype, memory_format
            )
            return x, y.to(device, non_blocking=True)

        return prepare


def find_folder(root: str | None) -> Path:
    """The cifar-10-batches-py folder: data.root itself, or the folder under it."""
    path = data_root(root, "cifar10", f"the folder of {LAYOUT}")
    for candidate in (path, path / FOLDER):
        if all((candidate / name).is_file() for name in [*TRAIN_FILES, TEST_FILE]):
            return candidate
    missing = [n for n in [*TRAIN_FILES, TEST_FILE] if not (path / FOLDER / n).is_file()]
    raise DataError(
        f"data.root={str(path)!r} holds no complete CIFAR-10 (missing under it: "
        f"{', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}); expected {LAYOUT}"
    )


def read_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One pickled batch as uint8 images (N, 3, 32, 32) and int64 labels."""
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        data, labels = batch[b"data"], batch[b"labels"]
        images = torch.as_tensor(data, dtype=torch.uint8).reshape(-1, 3, 32, 32)
        labels = torch.as_tensor(labels, dtype=torch.int64)
    except Exception as e:  # cut short, not a pickle, another layout: name the file
        raise DataError(
            f"{path}: not a CIFAR-10 python batch ({type(e).__name__}: {e}); expected {LAYOUT}"
        ) from None
    if len(images) != len(labels):
        raise DataError(f"{path}: {len(images)} images but {len(labels)} labels")
    return images, labels


@register_dataset("cifar10")
def cifar10(cfg: Any) -> ImageData:
    folder = find_folder(cfg.root)
    parts = [read_batch(folder / name) for name in TRAIN_FILES]
    train_images = torch.cat([p[0] for p in parts])
    train_labels = torch.cat([p[1] for p in parts])
    test_images, test_labels = read_batch(folder / TEST_FILE)
    # an empty split would train or evaluate nothing (an empty test_batch gave top-1 0.0 and a
    # `completed` run): refused while the data loads
    for where, labels, to in (
        (f"{folder}/data_batch_1 ... data_batch_5 hold", train_labels, "train on"),
        (f"{folder / TEST_FILE} holds", test_labels, "evaluate"),
    ):
        if len(labels) == 0:
            raise DataError(
                f"{where} no image (0 rows of b'data'), so there is nothing to {to}; unpack "
                f"cifar-10-python.tar.gz again. Expected {LAYOUT}"
            )
    augment = cfg.augmentation == "cifar"
    return ImageData(
        train=CIFARSplit(train_images, train_labels, augment=augment),
        eval=CIFARSplit(test_images, test_labels),
        num_classes=10,
        channels=3,
        description=(
            f"CIFAR-10 at {folder} ({len(train_labels)} train / {len(test_labels)} test, 32x32, "
            f"augmentation {'pad-4 crop + flip' if augment else 'none'})"
        ),
    )
