"""Image data-set registry for classification (and GAN) tasks.

A builder takes the data config and returns an ImageData: the two splits and the facts the
model needs. Text corpora live in mpt_repro/data/corpus.py (language-model task).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
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


SKIPPED_LISTED = 10  # run.json names this many skipped files; the count is complete


def data_root(root: str | None, name: str, layout: str) -> Path:
    """data.root as a folder that exists, or a DataError saying what data.name=`name` expects
    there (`layout`)."""
    if root is None:
        raise DataError(f"data.name={name} needs data.root: {layout}")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DataError(
            f"data.root={str(path)!r} does not exist or is not a folder; point it at {layout}"
        )
    return path


def _base(dataset: Dataset) -> tuple[Dataset, list[int] | None]:
    """The data set under any Subsets, and the indices into it that ``dataset`` uses (None:
    all of them)."""
    used = None
    while isinstance(dataset, Subset):
        indices = list(dataset.indices)
        used = indices if used is None else [indices[i] for i in used]
        dataset = dataset.dataset
    return dataset, used


def skipped_files(dataset: Dataset) -> list[str]:
    """The files of ``dataset`` (an image folder, or Subsets of one) that data.on_corrupt=skip
    has skipped so far, in this process or its loader workers, in sample order. [] for data
    sets that never skip (those without a ``corrupt`` flag tensor)."""
    base, used = _base(dataset)
    flags = getattr(base, "corrupt", None)
    if flags is None:
        return []
    bad = flags.nonzero().flatten().tolist()
    if used is not None:
        kept = set(used)
        bad = [i for i in bad if i in kept]
    return [base.samples[i][0] for i in bad]


def skip_state(splits: dict[str, Dataset]) -> dict:
    """For a checkpoint: the indices of the samples each split's folder has skipped, so that a
    resumed run still counts the files skipped before it stopped ({} when none was skipped)."""
    state = {}
    for name, dataset in splits.items():
        flags = getattr(_base(dataset)[0], "corrupt", None)
        skipped = flags.nonzero().flatten().tolist() if flags is not None else []
        if skipped:
            state[name] = skipped
    return {"skipped_samples": state} if state else {}


def load_skip_state(splits: dict[str, Dataset], state: dict) -> None:
    for name, indices in (state.get("skipped_samples") or {}).items():
        flags = getattr(_base(splits[name])[0], "corrupt", None)
        if flags is not None and indices:
            flags[torch.tensor(indices, dtype=torch.int64)] = True


def describe_sizes(train: Dataset, eval: Dataset, on_corrupt: str = "fail") -> dict:
    """run.json "data" sizes: the images each split used. With data.on_corrupt=skip the files
    skipped so far are left out of the sizes, counted (train and eval together) and the first
    SKIPPED_LISTED named; called again at the end of a run, it covers the whole run."""
    sizes = {"train_size": len(train), "eval_size": len(eval)}
    if on_corrupt != "skip":
        return sizes
    train_bad, eval_bad = skipped_files(train), skipped_files(eval)
    return {
        "train_size": len(train) - len(train_bad),
        "eval_size": len(eval) - len(eval_bad),
        "skipped_files": len(train_bad) + len(eval_bad),
        "skipped_paths": (train_bad + eval_bad)[:SKIPPED_LISTED],
    }


def register_dataset(name: str) -> Callable:
    def add(fn: Callable[..., ImageData]) -> Callable[..., ImageData]:
        DATASETS[name] = fn
        return fn

    return add


def build_image_data(data_cfg: Any) -> ImageData:
    import importlib
    import importlib.util
    import pkgutil

    # the module named like the data set first (digits, synthetic, imagenet): importing every
    # module of the package loads torchvision, and with it torch._dynamo (2 s of CPU a run)
    own = f"{__name__}.{data_cfg.name}"
    if data_cfg.name not in DATASETS and importlib.util.find_spec(own) is not None:
        importlib.import_module(own)
    if data_cfg.name not in DATASETS:  # a module that registers another name (cifar: cifar10)
        for mod in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{mod.name}")
    if data_cfg.name not in DATASETS:
        raise ConfigError(
            f"data.name={data_cfg.name!r} is not a known image data set; known: {sorted(DATASETS)}"
        )
    data = DATASETS[data_cfg.name](data_cfg)
    for split in ("train", "eval"):  # each data set names its own files; this catches the rest
        if len(getattr(data, split)) == 0:
            raise DataError(
                f"data.name={data_cfg.name} (data.root={data_cfg.get('root')}) has no "
                f"{'training' if split == 'train' else 'evaluation'} example: {data.description}"
            )
    # Budgets trim the data: the first N examples of a split (a fixed subset, the same every run).
    if data_cfg.train_limit is not None and data_cfg.train_limit < len(data.train):
        data.train = Subset(data.train, range(data_cfg.train_limit))
    if data_cfg.eval_limit is not None and data_cfg.eval_limit < len(data.eval):
        data.eval = Subset(data.eval, range(data_cfg.eval_limit))
    return data
