"""What one worker measures around a training step: time, saved-for-backward bytes, host syncs,
FLOPs, memory and energy. Each function takes the step as a callable, so the bench never knows
how the suite's step is written.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mpt_repro.memory import SavedBytes  # the trainer counts the same bytes (run.json)

Step = Callable[[], Any]


# -- time ------------------------------------------------------------------------------------------
def time_steps(step: Step, n: int, device: torch.device) -> float:
    """Seconds for n steps back to back. On a GPU: CUDA events around the n launches, so the
    figure is the device's time for the work, host stalls between launches included (they
    starve the GPU just the same); on a CPU: perf_counter."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(n):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - t0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- saved for backward, host syncs, FLOPs: one instrumented step ---------------------------------
# ATen ops that make the host wait for the device: reading a value (item(), float(), bool(),
# `if tensor:`), and ops whose output size depends on the data.
SYNC_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "unique_dim",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "equal",
    "repeat_interleave",
}
# Of the counted ops, those that read a value on the host: `_local_scalar_dense` (item(),
# float(), bool(), `if tensor:`), `tolist` and `numpy` (on a CPU run they pass no ATen op; on a
# GPU they are a device-to-host copy), and the device-to-host copies themselves.
READ_OPS = {"_local_scalar_dense", "tolist", "numpy", "_to_copy", "copy_"}
# Indexing with a boolean mask sizes its output from the data (an internal nonzero)
MASK_INDEX = "index (boolean mask)"
MASK_INDEX_PUT = "index_put_ (boolean mask)"


# record_function names that mark work done on the host by design (e.g. the LM's candidate
# sampler, on CPU tensors on every device): their ops are not syncs, even on a CPU run
HOST_MARK = "host:"


class SyncCounter(TorchDispatchMode):
    """Counts what stops the host until the device has caught up, and what builds device tensors
    from host data. On a CPU nothing waits, but the same ops would on a GPU: the counts are the
    GPU's, measured anywhere (ops inside a ``record_function("host:...")`` block excepted).

    - ``ops``: the SYNC_OPS, copies from a GPU to the host, `.tolist()` / `.numpy()` (which on a
      CPU run pass no ATen op) and indexing with a boolean mask; ``reads`` is the part of them
      that reads values (READ_OPS);
    - ``tensors``: tensors made from host data that a GPU run would copy to the device before
      using (`torch.tensor` / `torch.as_tensor` of Python numbers or lists, `torch.from_numpy`):
      on a CPU run every `lift_fresh`, on a GPU run every copy from pageable host memory to the
      device, which waits for the device's queue (pytorch issue 120996). A Python scalar assigned
      through `t[i] = v` does not count: the kernel takes it by value.
    For each op it keeps where in mpt_repro it was first made."""

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__()
        self.on_gpu = device is not None and device.type != "cpu"
        self.ops: Counter[str] = Counter()
        self.where: dict[str, str] = {}
        self.tensors: Counter[str] = Counter()
        self.tensor_where: dict[str, str] = {}
        self.sites: Counter[str] = Counter()  # "op at file:line code", every one counted
        self.dispatched = 0  # every ATen op: on a GPU, a kernel launch each (views aside)
        # open record_function blocks, innermost last: True where marked HOST_MARK (blocks nest
        # as the context managers they are; each exit gets a new Python wrapper of its handle)
        self._blocks: list[bool] = []
        self._setitem = 0  # inside Tensor.__setitem__ (its scalar value is no host tensor)
        self._methods = _TensorMethods(self)

    def __enter__(self) -> SyncCounter:
        self._methods.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._methods.__exit__(*exc)

    @property
    def reads(self) -> int:
        """Host reads of device values (READ_OPS among the counted ops)."""
        return sum(n for op, n in self.ops.items() if op in READ_OPS)

    @property
    def host_side(self) -> bool:
        """Inside a record_function("host:...") block: work on the host by design."""
        return any(self._blocks)

    def count(self, counter: Counter[str], where: dict[str, str], name: str) -> None:
        site = _caller()
        counter[name] += 1
        where.setdefault(name, site)
        self.sites[f"{name} at {site}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        if name == "_record_function_enter_new":  # profiler bookkeeping, no kernel
            self._blocks.append(str(args[0]).startswith(HOST_MARK))
            return out
        if name == "_record_function_exit":
            if self._blocks:
                self._blocks.pop()
            return out
        self.dispatched += 1
        if self.host_side:
            return out
        if (name in SYNC_OPS and not self._host_side(name, args)) or _device_to_host(
            name, args, out
        ):
            self.count(self.ops, self.where, name)
        elif (mask := _mask_indexing(name, args)) and not self._host_side(name, args):
            self.count(self.ops, self.where, mask)
        elif self._from_host_data(name, args, out):
            self.count(self.tensors, self.tensor_where, name)
        return out

    def _host_side(self, name: str, args: tuple) -> bool:
        """A sync op on tensors that stay on the host on every device: no wait for a GPU. On a
        GPU run: all its tensors on the CPU. On a CPU run everything is, so only what is known
        to stay there: torch.optim's step counts (non-capturable optimizers keep them on the
        CPU on purpose, and read them with .item())."""
        tensors = [a for a in args if torch.is_tensor(a)]
        if self.on_gpu:
            return all(t.device.type == "cpu" for t in tensors)
        return name == "_local_scalar_dense" and _called_from_torch_optim()

    def _from_host_data(self, name: str, args: tuple, out: Any) -> bool:
        if self.on_gpu:  # what reaches the device: a copy from pageable host memory
            ends = _copy_ends(name, args, out)
            if ends is None:
                return False
            src, dst = ends
            return (
                src.device.type == "cpu"
                and dst.device.type != "cpu"
                and not src.is_pinned()
                and not (self._setitem and src.dim() == 0)
            )
        if name != "lift_fresh":
            return False
        # torch.optim's CPU step counts are host tensors on every device (Adagrad adds 1.0)
        return not (self._setitem and out.dim() == 0) and not _called_from_torch_optim()


class _TensorMethods(TorchFunctionMode):
    """SyncCounter's view of Tensor methods: on a CPU run `.tolist()` and `.numpy()` read without
    an ATen op (on a GPU they copy to the host, which the dispatcher sees), and
    `Tensor.__setitem__` wraps a Python scalar value in a tensor that a GPU run keeps on the host
    and hands the kernel by value."""

    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        c, name = self.counter, getattr(func, "__name__", "")
        if name == "__setitem__":
            c._setitem += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                c._setitem -= 1
        if name in ("tolist", "numpy") and not (c.on_gpu or c.host_side):
            if not _called_from_torch_optim():
                c.count(c.ops, c.where, name)
        return func(*args, **(kwargs or {}))


def _mask_indexing(name: str, args: tuple) -> str | None:
    """MASK_INDEX for t[mask], MASK_INDEX_PUT for t[mask] = values; None otherwise. A Python
    scalar assigned through a mask (a 0-d CPU value) takes torch's masked_fill path: no sync."""
    if name not in ("index", "index_put_", "index_put", "_index_put_impl_"):
        return None
    indices = args[1] if len(args) > 1 else ()
    masked = any(torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if not masked:
        return None
    if name == "index":
        return MASK_INDEX
    value = args[2] if len(args) > 2 else None
    scalar = torch.is_tensor(value) and value.dim() == 0 and value.device.type == "cpu"
    return None if scalar else MASK_INDEX_PUT


_HERE = str(Path(__file__).resolve())
_TORCH = str(Path(torch.__file__).resolve().parent)
_TORCH_OPTIM = str(Path(torch.optim.__file__).resolve().parent)


def _called_from_torch_optim() -> bool:
    """The op was made by torch.optim's own code (its CPU step counts), not merely inside an
    optimizer's step: an optimizer of ours (RMSpropTF) runs under torch.optim's step wrapper
    too, and its reads count. The innermost caller outside torch decides; torch's own frames
    in between (dispatch modes, wrappers, Tensor methods written in Python) are looked through."""
    for frame in reversed(traceback.extract_stack(limit=24)):
        path = str(Path(frame.filename).resolve())
        if path.startswith(_TORCH_OPTIM):
            return True
        if path != _HERE and not path.startswith(_TORCH):
            return False
    return False


def _copy_ends(name: str, args: tuple, out: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(source, destination) of a copy op (`_to_copy`, `copy_`), None for any other op."""
    if name not in ("_to_copy", "copy_"):
        return None
    src = args[1] if name == "copy_" else args[0]
    dst = args[0] if name == "copy_" else out
    return (src, dst) if torch.is_tensor(src) and torch.is_tensor(dst) else None


def _device_to_host(name: str, args: tuple, out: Any) -> bool:
    """A copy from the device to the host that makes the host wait: every one but a
    `copy_(..., non_blocking=True)` into pinned memory (the trainer's loss copies), which the
    host reads later, once an event says it has landed."""
    ends = _copy_ends(name, args, out)
    if ends is None or ends[0].device.type == "cpu" or ends[1].device.type != "cpu":
        return False
    non_blocking = name == "copy_" and len(args) > 2 and bool(args[2])
    return not (non_blocking and ends[1].is_pinned())


def _caller() -> str:
    """The innermost frame in mpt_repro outside the bench: where a sync comes from."""
    bench = Path(__file__).resolve().parent
    package = bench.parent
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if package in path.parents and bench not in path.parents:
            where = f"{path.relative_to(package.parent)}:{frame.lineno}"
            return f"{where} {frame.line or ''}".strip()
    return "outside mpt_repro"


@contextlib.contextmanager
def _cuda_sync_warnings(device: torch.device) -> Iterator[list[dict[str, str]]]:
    """torch.cuda.set_sync_debug_mode("warn") for the block: it also sees syncs made in kernels'
    host code, which no dispatch-level count can. Each warning is kept with where it was raised:
    the Python line that called the op (`at`) and the innermost mpt_repro line above it
    (`where`), taken while the warning is raised, since a recorded warning keeps only the
    first (the H200's sync warning came from a line inside torch)."""
    caught: list[dict[str, str]] = []

    def keep(message, category, filename, lineno, file=None, line=None) -> None:
        caught.append({"message": str(message), "at": f"{filename}:{lineno}", "where": _caller()})

    with warnings.catch_warnings():  # restores showwarning on the way out
        warnings.simplefilter("always")
        warnings.showwarning = keep
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")


def _sync_warnings_detail(caught: list[dict[str, str]], device: torch.device) -> dict[str, Any]:
    """The JSON's sync-debug fields (None off CUDA): how many warnings, where each came from
    ({"<mpt_repro line> | <the op's caller>": count}) and one message."""
    if device.type != "cuda":
        return dict.fromkeys(("cuda_sync_debug_warnings", "cuda_sync_debug_where"))
    warned = [w for w in caught if "synchroniz" in w["message"].lower()]
    return {
        "cuda_sync_debug_warnings": len(warned),
        "cuda_sync_debug_where": dict(Counter(f"{w['where']} | {w['at']}" for w in warned)),
        "cuda_sync_debug_message": warned[0]["message"] if warned else None,
    }


def instrument(
    step_on: Callable[[int], Any], batch: int, device: torch.device, slope: bool = True
) -> dict[str, Any]:
    """One step under all three meters at the batch given, plus one on half the batch (twice
    the batch under 4):

    - bytes saved for backward per sample, as the slope between the full and the half batch:
      whatever does not grow with the batch (weights a convolution saves, autocast's FP16 copies
      of FP32 weights) cancels, so the figure is the activations' own;
    - host syncs of the full step (SyncCounter; on CUDA also the sync-debug warnings), the host
      reads among them, the tensors it builds from host data, and the ATen ops it dispatches:
      the host's launch work, which a GPU step must hide;
    - model FLOPs of the full step, forward and backward (torch.utils.flop_counter: matmuls and
      convolutions, 2 per multiply-accumulate; the optimizer and elementwise ops not counted,
      the usual MFU convention)."""
    from torch.utils.flop_counter import FlopCounterMode

    saved, syncs, flops = SavedBytes(), SyncCounter(device), FlopCounterMode(display=False)
    with _cuda_sync_warnings(device) as caught, flops, syncs, saved.hooks():
        step_on(batch)
    synchronize(device)
    full = saved.total
    out: dict[str, Any] = {
        "host_syncs_per_step": sum(syncs.ops.values()),
        "host_sync_ops": dict(syncs.ops),
        "host_sync_where": syncs.where,
        **_sync_warnings_detail(caught, device),
        "host_reads_per_step": syncs.reads,
        "host_tensors_per_step": sum(syncs.tensors.values()),
        "host_tensor_ops": dict(syncs.tensors),
        "host_tensor_where": syncs.tensor_where,
        "flops_per_step": int(flops.get_total_flops()),
        "ops_per_step": syncs.dispatched,
        "saved_bytes_batch": full,
    }
    if not slope:  # a batch that cannot be cut (an LM's streams): the total, weights included
        out.update(
            saved_bytes_per_sample=full / batch,
            saved_method="total / samples (the batch cannot be cut: weight-sized tensors included)",
        )
        return out
    # the slope's second point: half the batch, or twice it (its samples repeated) where half
    # would be under 2, which batch norm over a 1x1 feature map cannot train on
    other = batch // 2 if batch >= 4 else 2 * batch
    with saved.hooks():
        step_on(other)
    per_sample = (full - saved.total) / (batch - other)
    out.update(
        saved_bytes_per_sample=per_sample,
        saved_bytes_half_batch=saved.total,
        saved_bytes_fixed=full - per_sample * batch,  # weights and weight-sized copies
        saved_method=f"slope between batch {batch} and {other}",
    )
    return out


# -- memory ----------------------------------------------------------------------------------------
def peak_memory(device: torch.device) -> dict[str, int | None]:
    """The allocator's peaks since the process started (each preset has its own process)."""
    if device.type != "cuda":
        import resource

        return {
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
            "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
    return {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
    }


def reset_peak_memory(device: torch.device) -> None:
    """Start the allocator's peaks afresh, after the warm-up: cuDNN's autotuning (benchmark mode
    tries the algorithms of each new shape once, with their workspaces) is not the step's memory,
    and would make the presets' peaks differ by what their autotuning tried."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# -- energy ----------------------------------------------------------------------------------------
class EnergyMeter:
    """The GPU's total-energy counter (NVML, millijoules since the driver loaded; Volta and
    later), through nvidia-ml-py when it is installed. `read()` is None where it cannot be read."""

    def __init__(self, device: torch.device):
        self.handle, self.nvml, self.why = None, None, None
        if device.type != "cuda":
            self.why = "no GPU"
            return
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = self._handle(pynvml, device)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception as e:  # not installed, no driver access, a GPU without the counter
            self.handle = None
            self.why = f"NVML energy counter unavailable ({type(e).__name__})"

    @staticmethod
    def _handle(pynvml: Any, device: torch.device) -> Any:
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:  # CUDA_VISIBLE_DEVICES may renumber: the UUID names the card
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:  # an older driver's UUID form: fall back to the index
                pass
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> float | None:
        """Joules so far (None when unavailable)."""
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
