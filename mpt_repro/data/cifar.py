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

import numpy as np
import torch
from torch.utils.data import Dataset

from mpt_repro.data import ImageData, data_root, register_dataset
from mpt_repro.data.device import normalize_on_device
from mpt_repro.errors import DataError
from mpt_repro.safeio import open_regular

FOLDER = "cifar-10-batches-py"
NUM_CLASSES = 10
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


# What a CIFAR-10 python batch may name: numpy's array and dtype reconstruction (the arrays of
# b"data"), and the encoder Python 3's protocol 2 uses for bytes. Anything else a pickle names (a
# function that runs a command, a class that writes a file) is refused before it is called.
SAFE_GLOBALS = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }
)


class UnsafePickle(Exception):
    """A pickle names something a CIFAR-10 batch never holds."""


class BatchUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, str/bytes, ints and numpy arrays, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in SAFE_GLOBALS:
            raise UnsafePickle(
                f"it names {module}.{name}, which a CIFAR-10 batch never holds (only dicts, "
                "lists, bytes, ints and numpy arrays); it was not loaded, nothing in it ran"
            )
        return super().find_class(module, name)


def read_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One pickled batch as uint8 images (N, 3, 32, 32) and int64 labels, checked: uint8 pixels,
    labels in 0..9 (refused naming the file, before anything trains on them)."""
    try:
        with open_regular(path, "rb") as f:  # a FIFO is refused, never waited on
            batch = BatchUnpickler(f, encoding="bytes").load()
    except UnsafePickle as e:
        raise DataError(f"{path}: refused: {e}. Unpack cifar-10-python.tar.gz again") from None
    except Exception as e:  # cut short, not a pickle: name the file
        raise DataError(
            f"{path}: not a CIFAR-10 python batch ({type(e).__name__}: {e}); expected {LAYOUT}"
        ) from None
    data, labels = _fields(path, batch)
    images = torch.from_numpy(np.ascontiguousarray(data)).reshape(-1, 3, 32, 32)
    if isinstance(labels, np.ndarray) and labels.dtype.kind not in "iub":
        raise DataError(
            f"{path}: b'labels' holds {labels.dtype} values, not integers 0..{NUM_CLASSES - 1}. "
            "Unpack cifar-10-python.tar.gz again"
        )
    try:
        labels = torch.as_tensor(labels, dtype=torch.int64)
    except TypeError:  # a list of strings, None, objects: not labels
        raise DataError(
            f"{path}: b'labels' holds values that are not integers 0..{NUM_CLASSES - 1}. "
            "Unpack cifar-10-python.tar.gz again"
        ) from None
    except (
        OverflowError,
        RuntimeError,
        ValueError,
    ):  # an int past int64 (or a uint64 array): out of range
        raise DataError(
            f"{path}: a label is too large for an integer; CIFAR-10 has {NUM_CLASSES} classes "
            "(0..9). Unpack cifar-10-python.tar.gz again"
        ) from None
    if len(images) != len(labels):
        raise DataError(f"{path}: {len(images)} images but {len(labels)} labels")
    bad = ((labels < 0) | (labels >= NUM_CLASSES)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{path}: label {int(labels[i])} of image {i} is outside 0..{NUM_CLASSES - 1} "
            f"({len(bad)} such labels); CIFAR-10 has {NUM_CLASSES} classes. Unpack "
            "cifar-10-python.tar.gz again"
        )
    return images, labels


def _fields(path: Path, batch: Any) -> tuple[np.ndarray, Any]:
    """b"data" and b"labels" of an unpickled batch, as the official files hold them."""
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(
            f"{path}: not a CIFAR-10 python batch (it holds {keys}, not a dict with b'data' and "
            f"b'labels'); expected {LAYOUT}"
        )
    data, labels = batch[b"data"], batch[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        what = f"{data.dtype} values" if isinstance(data, np.ndarray) else type(data).__name__
        numeric = isinstance(data, np.ndarray) and data.size and data.dtype.kind in "iuf"
        top = f", up to {np.max(data):g}" if numeric else ""  # an object array has no max
        raise DataError(
            f"{path}: b'data' holds {what}{top}, not uint8 pixels (0..255): it would be cast "
            "to uint8, wrapping every value past 255. Unpack cifar-10-python.tar.gz again"
        )
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(
            f"{path}: b'data' has shape {data.shape}, not N x 3072 (32x32 RGB); expected {LAYOUT}"
        )
    ints = isinstance(labels, list) and all(type(v) is int for v in labels)
    if not ints and not (isinstance(labels, np.ndarray) and labels.dtype.kind in "iu"):
        raise DataError(f"{path}: b'labels' is not a list of integers; expected {LAYOUT}")
    return data, labels


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
        num_classes=NUM_CLASSES,
        channels=3,
        description=(
            f"CIFAR-10 at {folder} ({len(train_labels)} train / {len(test_labels)} test, 32x32, "
            f"augmentation {'pad-4 crop + flip' if augment else 'none'})"
        ),
    )
