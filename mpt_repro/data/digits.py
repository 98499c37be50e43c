"""scikit-learn's handwritten digits: the embedded default data set (real, offline, 1797 images).

The images are scikit-learn's own file (sklearn/datasets/data/digits.csv.gz: the UCI optdigits
test set, 8x8, pixel values 0..16), read with numpy; the 80/20 split is scikit-learn's
`train_test_split(test_size=0.2, random_state=0, stratify=target)`, kept as its two index lists
in embedded/digits_split.json. Importing scikit-learn took 2.4 s of CPU at every run's start;
tests/test_data_errors.py checks the file against scikit-learn's own split.

    python -m mpt_repro.data.digits     # writes embedded/digits_split.json (needs scikit-learn)
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from mpt_repro.data import ImageData, register_dataset
from mpt_repro.errors import DataError

SPLIT_FILE = Path(__file__).parent / "embedded" / "digits_split.json"


def digits_file() -> Path:
    """scikit-learn's digits.csv.gz, found without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "data=digits reads scikit-learn's embedded digits, and scikit-learn is not installed: "
            "pip install scikit-learn (make install does), or choose another data set"
        )
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def load_images() -> tuple[np.ndarray, np.ndarray]:
    """(images 1797x8x8 float64 0..16, targets), as sklearn.datasets.load_digits reads them."""
    with gzip.open(digits_file(), "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


@register_dataset("digits")
def digits(cfg: Any) -> ImageData:
    raw_images, target = load_images()
    images = (raw_images.astype(np.float32) / 16.0 - 0.5) / 0.5  # pixel values 0..16 -> [-1, 1]
    split = json.loads(SPLIT_FILE.read_text())

    def as_dataset(indices: list[int]) -> TensorDataset:
        x, y = images[indices], target[indices]
        return TensorDataset(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y).long())

    return ImageData(
        train=as_dataset(split["train"]),
        eval=as_dataset(split["eval"]),
        num_classes=10,
        channels=1,
        description="scikit-learn digits (8x8, 1437 train / 360 validation)",
    )


def sklearn_split() -> dict[str, list[int]]:
    """scikit-learn's stratified 80/20 split of the digits, as index lists in its order."""
    from sklearn.model_selection import train_test_split

    _, target = load_images()
    train, held_out = train_test_split(
        np.arange(len(target)), test_size=0.2, random_state=0, stratify=target
    )
    return {"train": train.tolist(), "eval": held_out.tolist()}


if __name__ == "__main__":
    SPLIT_FILE.write_text(json.dumps(sklearn_split()) + "\n")
    print(f"wrote {SPLIT_FILE}")
