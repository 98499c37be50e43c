"""The order of training examples: fixed by (seed, epoch), resumable mid-epoch, shardable across
ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


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
    train: DataLoader
    eval: DataLoader
    eval_shard: Sampler[int]  # the eval examples this rank evaluates (evaluate() sums over ranks)


def build_epoch_loaders(
    train: Dataset, eval: Dataset, d: Any, batch: int, seed: int, device: torch.device
) -> EpochLoaders:
    """The loaders of an image task: training in the (seed, epoch) order of an EpochSampler,
    sharded over ranks; evaluation on this rank's slice. Neither draws from the global RNG."""
    from mpt_repro import distributed

    sampler = EpochSampler(
        len(train),
        seed=seed,
        batch_size=batch,
        rank=distributed.rank(),
        world_size=distributed.world_size(),
    )
    args = dict(
        num_workers=d.num_workers,
        pin_memory=d.pin_memory and device.type == "cuda",
        persistent_workers=d.num_workers > 0,
    )
    shard = distributed.ShardSampler(len(eval))
    return EpochLoaders(
        sampler=sampler,
        train=DataLoader(
            train,
            batch_size=batch,
            sampler=sampler,
            drop_last=True,
            generator=sampler.loader_generator,
            **args,
        ),
        eval=DataLoader(
            eval,
            batch_size=d.eval_batch_size or batch,
            sampler=shard,
            generator=torch.Generator().manual_seed(0),
            **args,
        ),
        eval_shard=shard,
    )
