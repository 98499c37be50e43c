"""Step time of the eager step, `trainer.compile=true` and `trainer.compile=step`, in one run.

    .venv/bin/python scripts/bench_compile.py                        # the demo, batch 64
    .venv/bin/python scripts/bench_compile.py --batch 8 --presets amp mixed

For each preset, the three steps are built as `mpt-run` builds them (mpt_repro.bench.step:
the demo's digits CNN, `budget=smoke`, on the CPU), each on one resident batch; the first
steps (compilation) are timed apart. Then `--rounds` rounds, each timing `--steps` steps of every
variant in turn (interleaved, so that a change in the machine's load falls on all three), and
the median round per variant is the figure. Prints a table in milliseconds per step with each
compiled variant's ratio to eager (below 1: faster), and the machine's load average. One thread
by default: a shared 2-core machine gives steadier figures with one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

VARIANTS = ("false", "true", "step")


def build(preset: str, compile_: str, batch: int) -> tuple[object, float]:
    """(one step of the suite's own, the seconds its build and first steps took: compilation)."""
    from mpt_repro.bench.config import compose
    from mpt_repro.bench.step import build_step

    cfg = compose(
        [
            "experiment=demo",
            "budget=smoke",
            "trainer.device=cpu",
            f"data.batch_size={batch}",
            f"trainer.compile={compile_}",
        ],
        preset,
    )
    start = time.perf_counter()
    bench = build_step(cfg, torch.device("cpu"))  # runs the first step (compiles)
    for _ in range(2):  # the guards' second look, lazily built state
        bench.step()
    return bench.step, time.perf_counter() - start


def timed(step, steps: int) -> float:
    """Milliseconds per step over `steps` steps (the last one waited for: the CPU's ops are
    synchronous, and the loss is read once)."""
    start = time.perf_counter()
    for _ in range(steps):
        result = step()
    float(result.loss)
    return 1000 * (time.perf_counter() - start) / steps


def measure(preset: str, batch: int, steps: int, rounds: int) -> dict[str, tuple[float, float]]:
    """{variant: (median ms per step, seconds to build and compile)} for one preset."""
    torch._dynamo.reset()  # every preset compiles from scratch (no cache entry of another)
    built = {v: build(preset, v, batch) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v in VARIANTS:
            times[v].append(timed(built[v][0], steps))
    return {v: (statistics.median(times[v]), built[v][1]) for v in VARIANTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["fp32", "amp", "mixed", "bf16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="steps per round and variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"demo (digits CNN), batch {args.batch}, {args.threads} thread(s), median of "
        f"{args.rounds} rounds x {args.steps} steps; torch {torch.__version__}"
    )
    print(
        "| preset | eager ms/step | compile=true ms/step (x eager) | "
        "compile=step ms/step (x eager) | build+compile s (true / step) |"
    )
    print("|---|---|---|---|---|")
    for preset in args.presets:
        r = measure(preset, args.batch, args.steps, args.rounds)
        eager = r["false"][0]
        print(
            f"| {preset} | {eager:.2f} | {r['true'][0]:.2f} ({r['true'][0] / eager:.2f}) | "
            f"{r['step'][0]:.2f} ({r['step'][0] / eager:.2f}) | "
            f"{r['true'][1]:.0f} / {r['step'][1]:.0f} |",
            flush=True,
        )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
