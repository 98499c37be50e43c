"""The order of training examples: fixed by (seed, epoch), resumable mid-epoch, shardable across
ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from mpt_repro.data.device import DeviceBatches
from mpt_repro.data.synthetic import SyntheticImages


class EpochSampler(Sampler[int]):
    """A fresh permutation each epoch, the same in every run with the same seed.

    `set_epoch(epoch, skip_batches)` leaves out the batches a resumed run has already trained on.
    With several ranks, each takes every world_size-th batch-sized slice of the one permutation, so
    the global batch sequence equals a single-process run with world_size x batch_size.
    """

    def __init__(self, size: int, seed: int, batch_size: int, rank: int = 0, world_size: int = 1):
        self.size, self.seed, self.batch_size, self.rank, self.world_size = (
            size,
            seed,
            batch_size,
            rank,
            world_size,
        )
        self.epoch, self.skip = 0, 0
        # Give this to the DataLoader (generator=...): it draws its workers' base seed from it
        # instead of the global RNG, so the extra iter() of a resumed run cannot shift dropout,
        # and worker augmentation seeds are fixed per (seed, epoch, rank).
        self.loader_generator = torch.Generator()

    def batches_per_epoch(self) -> int:
        return self.size // (self.batch_size * self.world_size)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.epoch, self.skip = epoch, skip_batches
        self.loader_generator.manual_seed((self.seed * 100_003 + epoch) * 1_009 + self.rank)

    def _order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        perm = torch.randperm(self.size, generator=g).tolist()
        global_batch = self.batch_size * self.world_size
        mine = []
        for b in range(self.skip, self.batches_per_epoch()):
            start = b * global_batch + self.rank * self.batch_size
            mine.extend(perm[start : start + self.batch_size])
        return mine

    def __iter__(self) -> Iterator[int]:
        return iter(self._order())

    def __len__(self) -> int:
        return (self.batches_per_epoch() - self.skip) * self.batch_size


@dataclass
class EpochLoaders:
    sampler: EpochSampler  # set_epoch(epoch, skip) before iterating `train`
    train: Any  # iterable of batches (on the device for synthetic and uint8 image data)
    eval: Any
    eval_shard: Sampler[int]  # the eval examples this rank evaluates (evaluate() sums over ranks)


def build_epoch_loaders(
    train: Dataset,
    eval: Dataset,
    d: Any,
    batch: int,
    seed: int,
    device: torch.device,
    input_dtype: torch.dtype | None = None,
    memory_format: torch.memory_format | None = None,
    collate_fn: Any = None,
) -> EpochLoaders:
    """The loaders of an image task: training in the (seed, epoch) order of an EpochSampler,
    sharded over ranks; evaluation on this rank's slice. Neither draws from the global RNG.

    What comes out depends on the data set:
    - synthetic data: batches gathered from its pool on the device (no loader, no workers);
    - uint8 image data (ImageNet, imagefolder): worker batches moved to the device and normalised
      there, in `input_dtype` (default float32) and `memory_format` (default contiguous): pass
      the model's storage dtype and torch.channels_last to get the input in one pass;
    - anything else: the DataLoader's batches as they are (collated by `collate_fn` if given,
      e.g. detection's variable numbers of boxes).
    Errors from loader workers arrive as one-line DataErrors naming the file."""
    from mpt_repro import distributed

    sampler = EpochSampler(
        len(train),
        seed=seed,
        batch_size=batch,
        rank=distributed.rank(),
        world_size=distributed.world_size(),
    )
    shard = distributed.ShardSampler(len(eval))
    eval_batch = d.eval_batch_size or batch
    fmt = dict(
        dtype=input_dtype or torch.float32,
        memory_format=memory_format or torch.contiguous_format,
    )
    if isinstance(_base(train)[0], SyntheticImages):
        return EpochLoaders(
            sampler=sampler,
            train=PoolBatches(train, sampler, batch, device, drop_last=True, **fmt),
            eval=PoolBatches(eval, shard, eval_batch, device, drop_last=False, **fmt),
            eval_shard=shard,
        )
    return _worker_loaders(train, eval, d, batch, device, sampler, shard, fmt, collate_fn)


def _worker_loaders(
    train: Dataset,
    eval: Dataset,
    d: Any,
    batch: int,
    device: torch.device,
    sampler: EpochSampler,
    shard: Sampler[int],
    fmt: dict[str, Any],
    collate_fn: Any,
) -> EpochLoaders:
    """Data read by DataLoader workers (everything but the synthetic pool); uint8 images are
    finished on the device."""
    args = dict(
        num_workers=d.num_workers,
        pin_memory=d.pin_memory and device.type == "cuda",
        persistent_workers=d.num_workers > 0,
    )
    if collate_fn is not None:
        args["collate_fn"] = collate_fn
    prepare_train = prepare_eval = None
    if hasattr(_base(train)[0], "load_uint8"):  # ImageNet, imagefolder
        train, eval, prepare_train, prepare_eval = _read_on_device(train, eval, d, device, fmt)
        if getattr(d, "decode", "cpu") == "gpu":  # undecoded files: lists of bytes
            from mpt_repro.data.imagenet import collate_raw

            args["collate_fn"] = collate_raw
    train_loader = DataLoader(
        train,
        batch_size=batch,
        sampler=sampler,
        drop_last=True,
        generator=sampler.loader_generator,
        **args,
    )
    eval_loader = DataLoader(
        eval,
        batch_size=d.eval_batch_size or batch,
        sampler=shard,
        generator=torch.Generator().manual_seed(0),
        **args,
    )
    return EpochLoaders(
        sampler=sampler,
        train=DeviceBatches(train_loader, prepare_train),
        eval=DeviceBatches(eval_loader, prepare_eval),
        eval_shard=shard,
    )


def _read_on_device(
    train: Dataset, eval: Dataset, d: Any, device: torch.device, fmt: dict[str, Any]
) -> tuple[Dataset, Dataset, Any, Any]:
    """uint8 image data: the loaders read uint8 images (or undecoded files with data.decode=gpu)
    and the device finishes them (normalisation, or nvJPEG decoding and the crops)."""
    gpu = getattr(d, "decode", "cpu") == "gpu"
    how = "device_decode" if gpu else "device_prepare"
    prepare_train = getattr(_base(train)[0], how)(device, **fmt)
    prepare_eval = getattr(_base(eval)[0], how)(device, **fmt)
    method = "load_raw" if gpu else "load_uint8"
    return Read(train, method), Read(eval, method), prepare_train, prepare_eval


class Read(Dataset):
    """A data set (through any Subsets) read with another of its methods: what the loaders of
    uint8 or undecoded images fetch, while ds[i] stays the model-ready sample."""

    def __init__(self, ds: Dataset, method: str):
        self.base, self.index = _base(ds)
        self.method, self.size = method, len(ds)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        j = self.index[i] if self.index is not None else i
        return getattr(self.base, self.method)(j)


def _base(ds: Dataset) -> tuple[Dataset, list[int] | None]:
    """The data set under any Subsets (budgets' train_limit), and the indices into it."""
    index: list[int] | None = None
    while isinstance(ds, Subset):
        index = list(ds.indices) if index is None else [ds.indices[i] for i in index]
        ds = ds.dataset
    return ds, index


class PoolBatches:
    """Batches of a SyntheticImages data set in a sampler's order, gathered on the device: the
    order goes to the device once per epoch, then each batch is one index_select from the pool."""

    def __init__(
        self,
        ds: Dataset,
        sampler: Sampler[int],
        batch: int,
        device: torch.device,
        drop_last: bool,
        dtype: torch.dtype = torch.float32,
        memory_format: Any = None,
    ):
        base, index = _base(ds)
        base.place(device)
        self.base, self.sampler, self.batch, self.drop_last = base, sampler, batch, drop_last
        self.device, self.dtype = device, dtype
        self.memory_format = memory_format or torch.contiguous_format
        self.index = None if index is None else torch.tensor(index, device=device)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch if self.drop_last else -(-n // self.batch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.tensor(list(self.sampler), dtype=torch.long).to(self.device)
        if self.index is not None:
            order = self.index[order]
        stop = len(order) - len(order) % self.batch if self.drop_last else len(order)
        for start in range(0, stop, self.batch):
            yield self.base.batch(order[start : start + self.batch], self.dtype, self.memory_format)
