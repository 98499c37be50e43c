"""How much memory a run uses, measured so that each run's figure is its own.

Two figures go into run.json:

- `peak_memory_bytes` with `peak_memory_kind`: on a GPU the CUDA allocator's peak after the run's
  first step (`cuda_max_allocated`: cuDNN's autotuning scratch on that step left out); on a CPU
  the process's peak resident set since the run began (`host_peak_rss`: Linux resets the
  high-water mark when "5" is written to /proc/self/clear_refs, proc(5)). A Hydra multirun runs
  its jobs in one process, so without that reset a later job would carry the peaks of the jobs
  before it; where the reset is not available the figure is the process's lifetime peak, named
  `host_max_rss_process` so that no reader takes it for the run's own.
- `saved_bytes_per_sample`: the bytes autograd keeps for backward in one training step, divided by
  the samples of that step, counted on the run's first step (`SavedBytes`). It is the part of
  memory that precision changes (FP16 activations are half the bytes of FP32 ones) and it is the
  same on any device, so a CPU run shows the memory effect of a recipe too.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


class SavedBytes:
    """Bytes autograd keeps for backward: every tensor handed to a saved_tensors_hooks pack hook,
    counted once per storage (views and repeated saves of one tensor share it), by the storage's
    full size."""

    def __init__(self) -> None:
        self.storages: dict[tuple[str, int], int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        self.storages[(str(t.device), s.data_ptr())] = s.nbytes()
        return t

    def hooks(self) -> Any:
        self.storages.clear()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _reset_host_peak() -> bool:
    """Reset this process's peak RSS (VmHWM); False where the kernel does not offer it."""
    try:
        CLEAR_REFS.write_text("5")
        return _host_peak() is not None
    except OSError:
        return False


def _host_peak() -> int | None:
    """VmHWM of /proc/self/status in bytes, or None."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None


class RunMemory:
    """The memory figures of one run (module docstring). Create it when the run starts."""

    def __init__(self, device: torch.device, measure_saved: bool = True):
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.host_reset = False
        else:
            self.host_reset = _reset_host_peak()
        # the first step is measured unless told not to (torch.compile cannot trace the hooks)
        self.saved_per_sample: float | None = None
        self._to_measure = measure_saved

    def step(self, train_step: Callable[[Any], Any], batch: Any) -> Any:
        """Run one training step; the first one is counted for saved_bytes_per_sample."""
        if not self._to_measure:
            return train_step(batch)
        self._to_measure = False
        saved = SavedBytes()
        with saved.hooks():
            result = train_step(batch)
        samples = getattr(result, "samples", 0)
        self.saved_per_sample = saved.total / samples if samples else None
        if self.device.type == "cuda":
            # cuDNN's autotuning tries algorithms with large scratch buffers on the first step:
            # the peak that compares presets is the training's, from here on (optimizer state,
            # now allocated, stays counted)
            torch.cuda.reset_peak_memory_stats(self.device)
        return result

    def summary(self) -> dict[str, Any]:
        if self.device.type == "cuda":
            peak, kind = torch.cuda.max_memory_allocated(self.device), "cuda_max_allocated"
        elif self.host_reset and (peak := _host_peak()) is not None:
            kind = "host_peak_rss"
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            kind = "host_max_rss_process"
        return {
            "peak_memory_bytes": peak,
            "peak_memory_kind": kind,
            "saved_bytes_per_sample": self.saved_per_sample,
        }
