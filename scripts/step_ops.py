"""ATen ops per training step of precision=adaptive against mixed, for several
precision.adaptive_update_interval values (F), counted by mpt-bench's SyncCounter over one cycle of
F steps after three warm-up steps. Counts, not times: the same on any device (a GPU launches a
kernel per op, views aside). Prints a Markdown table (docs/adaptive.md "Statistics every F
iterations").

    .venv/bin/python scripts/step_ops.py --adaptive 1,4,10,20 -- experiment=resnet50 \\
        model=custom model.target=torchvision.models:resnet18 data=synthetic \\
        data.image_size=32 data.batch_size=2 optim.lr=0.0001

The overrides are mpt-run's (trainer.device=cpu is added); a small LR keeps a resident synthetic
batch from overflowing, which would force a recomputation at every step.
"""

from __future__ import annotations

import argparse
import statistics

import torch


def counted(overrides: list[str], preset: str, n: int) -> tuple[list[int], list[int]]:
    """ATen ops and host reads of n steps of `preset`, each counted alone, after 3 warm-up."""
    from mpt_repro.bench.config import compose
    from mpt_repro.bench.measure import SyncCounter
    from mpt_repro.bench.step import build_step

    cpu = torch.device("cpu")
    bs = build_step(compose([*overrides, "trainer.device=cpu"], preset), cpu)
    for _ in range(3):
        bs.step()
    ops, reads = [], []
    for _ in range(n):
        with SyncCounter(cpu) as c:
            bs.step()
        ops.append(c.dispatched)
        reads.append(c.reads)
    return ops, reads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adaptive", default="1,4,10", help="the F values, comma-separated")
    ap.add_argument("overrides", nargs="*", help="mpt-run overrides (after --)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny per-op work: threads would only add hand-offs
    mixed = statistics.median(counted(args.overrides, "mixed", 2)[0])
    print(f"mixed: {mixed:g} ATen ops/step")
    print("| F | ops per step over the cycle | host reads | mean | x mixed |")
    print("|---|---|---|---:|---:|")
    for f in (int(x) for x in args.adaptive.split(",")):
        extra = [*args.overrides, f"precision.adaptive_update_interval={f}"]
        ops, reads = counted(extra, "adaptive", max(f, 2))
        mean = statistics.mean(ops)
        cells = [str(f), ", ".join(map(str, ops)), ", ".join(map(str, reads))]
        print("| " + " | ".join(cells) + f" | {mean:.1f} | {mean / mixed:.3f} |")


if __name__ == "__main__":
    main()
