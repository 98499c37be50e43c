"""One preset, one repeat, in a process of its own (so its peak memory is its own):

    python -m mpt_repro.bench.worker SPEC.json      (run by mpt-bench; SPEC names the output)

Order: build the suite's step, warm up (untimed), reset the memory peaks (cuDNN's autotuning is
not the step's), time `steps` steps, read the memory peaks; then, in repeat 0 only, the
instrumented steps (saved bytes, host syncs, FLOPs) and the trainer-vs-bare windows, which run
after the peaks were read so they cannot change them.
Exit status: 0 measured, 2 a configuration or data problem (message on stderr), 3 out of memory.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mpt_repro.bench.config import BenchConfig, compose
from mpt_repro.errors import UserError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    try:
        result = measure(spec)
    except UserError as e:
        print(f"mpt-bench: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if type(e).__name__ == "OutOfMemoryError":
            print(f"mpt-bench: {spec['preset']}: out of memory ({_short(e)})", file=sys.stderr)
            Path(spec["out"]).write_text(json.dumps({"error": f"out of memory: {_short(e)}"}))
            return 3
        raise
    from mpt_repro import distributed

    if distributed.is_main():  # bench.nproc > 1: rank 0 writes what every rank measured
        Path(spec["out"]).write_text(json.dumps(result, indent=1))
    return 0


# the instrumented step's meters (a TorchDispatchMode, FlopCounterMode, saved-tensor hooks) are
# not traced by torch.compile: under them a compiled step finds no frame to compile and fails
NOT_UNDER_COMPILE = (
    "saved bytes, host syncs, ATen ops and FLOPs not measured: torch.compile does not trace the "
    "meters' dispatch modes and hooks (trainer.compile); run mpt-bench without trainer.compile "
    "to count the eager step"
)


def _short(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    from mpt_repro.bench import measure as m
    from mpt_repro.bench.mx_cost import mx_storage
    from mpt_repro.bench.step import build_step

    b = BenchConfig(**spec["bench"])
    preset, repeat = spec["preset"], spec["repeat"]
    cfg, device = _bench_config(spec["overrides"], preset)
    tag = f"{preset} (repeat {repeat + 1}/{b.repeats})"

    def say(msg: str) -> None:
        print(f"[mpt-bench] {tag}: {msg}", file=sys.stderr, flush=True)

    say(f"building {cfg.experiment_name} on {device}")
    bs = build_step(cfg, device)
    out = {"preset": preset, "repeat": repeat, **_timed(cfg, bs, b, device, say)}
    say(f"{out['samples_per_s']:.4g} samples/s")
    out["state_bytes_per_rank"] = _state_bytes(bs)
    if b.nproc > 1:  # the counts and windows below are one process's: not measured over ranks
        return out
    if repeat == 0 and b.instrument and cfg.trainer.compile:
        out["not_instrumented"] = NOT_UNDER_COMPILE
        say(NOT_UNDER_COMPILE)
    elif repeat == 0 and b.instrument:
        if bs.step_on is None:  # e.g. an LM's streams: one whole step, counted as it is
            step_on, n = (lambda _: bs.step()), bs.samples
        else:
            step_on, n = bs.step_on, bs.micro_batch
        say("instrumented steps: saved-for-backward bytes, host syncs, FLOPs")
        out.update(m.instrument(step_on, n, device, slope=bs.step_on is not None))
        out["flops_per_sample"] = out["flops_per_step"] / n
    if repeat == 0 and b.overhead_steps:
        out.update(overhead(cfg, bs, b, device, say))
    if repeat == 0 and b.baseline:
        out["baseline"] = baseline(cfg, bs, b, device, say)
    if repeat == 0 and (mx := mx_storage(bs)) is not None:  # an emulated MX preset (issue 46)
        out["mx_storage"] = mx
    return out


def _state_bytes(bs: Any) -> list[int]:
    """Bytes of parameters, gradients and optimizer state each rank holds (fsdp.state_bytes)."""
    from mpt_repro import distributed, fsdp

    mine = fsdp.state_bytes(bs.task.models.values(), bs.task.optimizers.values())
    return [held["total"] for held in distributed.all_gather_object(mine)]


def _bench_config(overrides: list[str], preset: str) -> tuple[Any, Any]:
    """The run's config and device, set up as mpt-run sets them."""
    import torch

    from mpt_repro import distributed
    from mpt_repro.bench.step import enum_name
    from mpt_repro.run import pick_device, set_backends
    from mpt_repro.tasks import task_class

    cfg = compose(overrides, preset)
    # bench.nproc > 1: this process is one rank of torchrun's (a no-op in one process)
    device = distributed.setup(cfg.distributed, pick_device(cfg.trainer.device))
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    set_backends(cfg.trainer)
    if task_class(enum_name(cfg.task)).eval_limit_counts_batch_items:
        # each trainer window ends with an evaluation (outside its clock): one batch suffices
        cfg.data.eval_limit = min(cfg.data.eval_limit or cfg.data.batch_size, cfg.data.batch_size)
    return cfg, device


def _timed(cfg: Any, bs: Any, b: BenchConfig, device: Any, say: Any) -> dict[str, Any]:
    """Warm-up, then b.steps timed steps: throughput, memory, energy, and what the math runs on."""
    from mpt_repro.bench import measure as m
    from mpt_repro.bench.peaks import gpu_model, math_kind, peak_tflops
    from mpt_repro.bench.step import skipped_steps
    from mpt_repro.run import describe_device

    energy = m.EnergyMeter(device)
    # build_step ran one step already (it is the first warm-up step)
    if b.warmup > 1:
        say(f"warm-up, {b.warmup - 1} more steps")
        warm = m.time_steps(bs.step, b.warmup - 1, device) / (b.warmup - 1)
        say(f"{warm:.3g} s/step; timing {b.steps} steps (~{warm * b.steps:.0f} s)")
    warmup_peaks = m.peak_memory(device)  # autotuning included: kept in the detail only
    m.reset_peak_memory(device)
    skipped0, joules0 = skipped_steps(bs.policy), energy.read()
    seconds = m.time_steps(bs.step, b.steps, device)
    joules1 = energy.read()
    samples = bs.samples * b.steps
    fp8 = cfg.precision.get("fp8")  # absent before the FP8 presets
    kind = math_kind(
        getattr(cfg.precision.compute_dtype, "name", cfg.precision.compute_dtype),
        bool(cfg.precision.allow_tf32) and device.type == "cuda",
        getattr(fp8.mode, "name", fp8.mode) if fp8 is not None else "none",
    )
    dev = describe_device(device)
    on_gpu = device.type == "cuda"
    return {
        "device": dev,
        "versions": versions(),
        "describe": bs.policy.describe(),
        "batch": bs.samples,
        "steps": b.steps,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "skipped_in_timed": skipped_steps(bs.policy) - skipped0,
        "math_kind": kind,
        "gpu_model": gpu_model(dev["name"]) if on_gpu else None,
        "peak_tflops": peak_tflops(dev["name"], kind) if on_gpu else None,
        "joules_per_sample": (
            (joules1 - joules0) / samples if joules0 is not None and joules1 is not None else None
        ),
        "energy_note": energy.why,
        **m.peak_memory(device),
        "warmup_peak_allocated_bytes": warmup_peaks["peak_allocated_bytes"],
    }


def overhead(cfg: Any, bs: Any, b: BenchConfig, device: Any, say: Any) -> dict[str, Any]:
    """The Trainer's loop against a bare loop doing the same math, alternating windows in this
    process (so both see the same machine state): 1 - trainer/bare samples per second."""
    from mpt_repro.bench.measure import synchronize, time_steps
    from mpt_repro.bench.step import BareLoop, TrainerWindows

    bare = BareLoop(cfg, bs, device)
    if bare.why_not:
        return {"trainer_overhead": None, "overhead_note": bare.why_not}
    say(f"trainer vs bare loop, {b.overhead_windows} x {b.overhead_steps} steps each")
    windows = TrainerWindows(cfg, bs, total_steps=(b.overhead_windows + 1) * b.overhead_steps)
    try:
        windows.run(1)  # the trainer's first fit: its own one-time set-up stays out
        time_steps(bare.step, 1, device)
        trainer_sps, bare_sps = [], []
        for _ in range(b.overhead_windows):
            trainer_sps.append(windows.run(b.overhead_steps))
            synchronize(device)
            # the bare loop on the trainer's clock's terms: wall time, synchronised at the end
            t0 = time.perf_counter()
            for _ in range(b.overhead_steps):
                bare.step()
            synchronize(device)
            bare_sps.append(bare.samples * b.overhead_steps / (time.perf_counter() - t0))
    finally:
        windows.close()
    t, r = statistics.median(trainer_sps), statistics.median(bare_sps)
    return {
        "trainer_overhead": 1.0 - t / r,
        "trainer_samples_per_s": trainer_sps,
        "bare_samples_per_s": bare_sps,
    }


def baseline(cfg: Any, bs: Any, b: BenchConfig, device: Any, say: Any) -> dict[str, Any]:
    """The suite's step against the bare loop of the same math, in this process, on the same
    model and batch: ATen ops and host reads of one step of each (the median of 3 counted
    steps), the Trainer's own per step (the step with its bookkeeping: LR schedule, divergence
    watch, log window), and the time ratio suite / bare over interleaved rounds (median, min,
    max)."""
    from mpt_repro.bench.step import BareLoop, trainer_ops

    bare = BareLoop(cfg, bs, device)
    if bare.why_not:
        return {"bare": None, "note": bare.why_not}
    say(f"baseline: {bare.kind}, {b.baseline_rounds} rounds x {b.baseline_steps} steps each")
    bare.step()  # its first step: lazily made state (GradScaler's, the optimizer's)
    out: dict[str, Any] = {"bare": bare.kind}
    for who, step in (("suite", bs.step), ("bare", bare.step)):
        counted = _counted(step, device)
        out[f"{who}_ops_per_step"] = counted["ops"]
        out[f"{who}_host_reads_per_step"] = counted["reads"]
    ratios = _interleaved(bs.step, bare.step, b, device)
    out.update(
        time_ratio=statistics.median(ratios),
        time_ratio_min=min(ratios),
        time_ratio_max=max(ratios),
        time_ratios=ratios,
    )
    trainer = trainer_ops(cfg, bs, device)
    out["trainer_ops_per_step"] = trainer["ops_per_step"]
    out["trainer_host_reads_per_step"] = trainer["host_reads_per_step"]
    return out


def _counted(step: Any, device: Any) -> dict[str, float]:
    """Median ATen ops and host reads of 3 steps, each counted alone."""
    from mpt_repro.bench.measure import SyncCounter, synchronize

    ops, reads = [], []
    for _ in range(3):
        with SyncCounter(device) as counter:
            step()
        synchronize(device)
        ops.append(counter.dispatched)
        reads.append(counter.reads)
    return {"ops": statistics.median(ops), "reads": statistics.median(reads)}


def _interleaved(suite: Any, bare: Any, b: BenchConfig, device: Any) -> list[float]:
    """Per round: seconds of b.baseline_steps suite steps over those of as many bare steps,
    the two alternating (the order flips every round), so drift hits both alike."""
    from mpt_repro.bench.measure import time_steps

    ratios = []
    for r in range(b.baseline_rounds):
        first, second = (suite, bare) if r % 2 == 0 else (bare, suite)
        t1 = time_steps(first, b.baseline_steps, device)
        t2 = time_steps(second, b.baseline_steps, device)
        t_suite, t_bare = (t1, t2) if r % 2 == 0 else (t2, t1)
        ratios.append(t_suite / t_bare)
    return ratios


def versions() -> dict[str, Any]:
    import torch
    import torchvision

    cuda = torch.version.cuda
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "mpt_repro": _package_version(),
    }


def _package_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mpt-repro")
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
