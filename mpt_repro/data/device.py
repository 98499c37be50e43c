"""Batches on the training device, ready for the model, and loader errors a user can read.

Image pipelines hand uint8 batches from the loader workers to the main process (4x less than
float32 to copy, pin and move); `normalize_on_device` turns them into model input on the device
in one pass, in the dtype and memory format the model wants. `DeviceBatches` wraps a DataLoader
so that every batch comes out that way, and so that an error in a loader worker arrives as one
line naming the file instead of torch's re-raised worker traceback.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from mpt_repro.errors import DataError


def normalize_on_device(
    x: Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: torch.dtype = torch.float32,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> Tensor:
    """(x / 255 - mean) / std for a uint8 batch (N, C, H, W), per channel, on x's device.

    Computed in FP32 (as the worker-side ToTensor + Normalize did), then written once in `dtype`
    and `memory_format` (e.g. float16 and torch.channels_last for an FP16 CNN), so the model
    needs no further cast or copy."""
    if x.dtype != torch.uint8:
        raise TypeError(f"normalize_on_device expects a uint8 batch, got {x.dtype}")
    m, inv = _normalize_constants(tuple(mean), tuple(std), x.device)
    out = (x.float() - m).mul_(inv)
    return out.to(dtype=dtype, memory_format=memory_format)


@functools.cache  # once per device: torch.tensor(list, device=cuda) waits for the device's queue
def _normalize_constants(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[Tensor, Tensor]:
    """255 * mean and 1 / (255 * std) as (1, C, 1, 1) FP32 tensors on `device` (pytorch issue
    120996: a tensor built from host data on every batch is a blocking copy on every batch)."""
    m = torch.tensor([255.0 * v for v in mean], device=device).view(1, -1, 1, 1)
    inv = torch.tensor([1.0 / (255.0 * v) for v in std], device=device).view(1, -1, 1, 1)
    return m, inv


class DeviceNormalize:
    """normalize_on_device with a data set's mean and std (in [0, 1] units)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(
        self,
        x: Tensor,
        dtype: torch.dtype = torch.float32,
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> Tensor:
        return normalize_on_device(x, self.mean, self.std, dtype, memory_format)


class DeviceBatches:
    """Iterate a DataLoader; hand out each batch prepared on the device (``prepare(batch)``), and
    turn a loader worker's error into a DataError of one line (the full worker traceback stays
    attached as the cause, for the run's log and record)."""

    def __init__(self, loader: Any, prepare: Callable[[Any], Any] | None = None):
        self.loader, self.prepare = loader, prepare

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        while True:
            try:
                # "host:": the loader's work (reading, decoding, collating) is on the host by
                # design, in worker processes when data.num_workers > 0 (mpt-bench counts no
                # sync in it); what prepare() does with the batch is the device's
                with torch.profiler.record_function("host:data_loader"):
                    batch = next(it)
            except StopIteration:
                return
            except Exception as e:
                clean = worker_error(e)
                if clean is None:
                    raise
                raise clean from e
            yield self.prepare(batch) if self.prepare is not None else batch


# torch's DataLoader re-raises a worker's exception as the same type with this message:
#   "Caught ValueError in DataLoader worker process 3.\nOriginal Traceback (most recent call
#   last):\n  File ...\n    ...\nValueError: <the message>"
_WORKER = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)")


def worker_error(e: BaseException) -> DataError | None:
    """A one-line DataError for an exception that came out of a loader worker, or None."""
    text = str(e)
    found = _WORKER.search(text)
    if found is None:
        if "DataLoader worker" in text and "killed by signal" in text:
            return DataError(
                f"{text.strip()}. A loader worker died, often because the machine ran out of "
                "memory: lower data.num_workers or data.batch_size"
            )
        return None
    kind, worker = found.group(1), found.group(2)
    message = _exception_lines(text, kind)
    where = f"(in data-loader worker {worker})"
    if isinstance(e, DataError):  # ours: the message already names the file and the fix
        return DataError(f"{message} {where}")
    return DataError(
        f"{kind}: {message} {where}. Run with data.num_workers=0 to see the full traceback"
    )


def _exception_lines(text: str, kind: str) -> str:
    """The original exception's message: the unindented lines after the last traceback frame,
    without the leading "module.Kind: "."""
    lines = text.splitlines()
    tail: list[str] = []
    for line in reversed(lines):
        if line.startswith(" ") or line.startswith("Original Traceback"):
            break
        tail.insert(0, line)
    message = " ".join(tail).strip()
    return re.sub(rf"^[\w.]*{kind}:\s*", "", message) or kind
