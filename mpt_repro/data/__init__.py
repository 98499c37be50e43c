"""Image data-set registry for classification (and GAN) tasks.

A builder takes the data config and returns an ImageData: the two splits and the facts the
model needs. Text corpora live in mpt_repro/data/corpus.py (language-model task).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset, Subset

from mpt_repro.errors import ConfigError, DataError

DATASETS: dict[str, Callable[..., ImageData]] = {}


@dataclass
class ImageData:
    train: Dataset
    eval: Dataset
    num_classes: int
    channels: int
    description: str = ""

    def check_logits(self, logits: Any) -> None:
        """Refuse a model whose output does not have one logit per class of the data: the
        classes come from the data (e.g. an ImageFolder's folders), and a model built for
        another count fails later with an unreadable index error, or trains on wrong labels."""
        width = logits.shape[-1]
        if width != self.num_classes:
            raise DataError(
                f"the model outputs {width} logits per example but the data has "
                f"{self.num_classes} classes ({self.description}); build the model for "
                f"{self.num_classes} classes (a model=custom factory gets num_classes=...) or "
                "point data.root at the data the model is for"
            )


def register_dataset(name: str) -> Callable:
    def add(fn: Callable[..., ImageData]) -> Callable[..., ImageData]:
        DATASETS[name] = fn
        return fn

    return add


def build_image_data(data_cfg: Any) -> ImageData:
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    if data_cfg.name not in DATASETS:
        raise ConfigError(
            f"data.name={data_cfg.name!r} is not a known image data set; known: {sorted(DATASETS)}"
        )
    data = DATASETS[data_cfg.name](data_cfg)
    # Budgets trim the data: the first N examples of a split (a fixed subset, the same every run).
    if data_cfg.train_limit is not None and data_cfg.train_limit < len(data.train):
        data.train = Subset(data.train, range(data_cfg.train_limit))
    if data_cfg.eval_limit is not None and data_cfg.eval_limit < len(data.eval):
        data.eval = Subset(data.eval, range(data_cfg.eval_limit))
    return data
