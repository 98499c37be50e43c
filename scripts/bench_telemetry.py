"""Overhead of numerics telemetry: the same run with and without it, through `mpt-run`.

    .venv/bin/python scripts/bench_telemetry.py                # demo, fp32, 400 steps, CPU
    .venv/bin/python scripts/bench_telemetry.py --steps 300 --every 100 20 1 --repeats 3

Prints a table of training steps/s (the trainer's own train_time_s, which leaves out evaluation,
checkpoints and the figures drawn at the end) with telemetry off and at each sampling interval,
and the ratio to the run without telemetry. Runs go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MPT_RUN = str(Path(sys.executable).with_name("mpt-run"))


def one_run(run_dir: Path, steps: int, every: int | None, extra: list[str]) -> dict:
    args = [
        MPT_RUN,
        "experiment=demo",
        "budget=paper",
        f"trainer.max_steps={steps}",
        "trainer.progress=false",
        "trainer.eval_every=100000",
        "trainer.checkpoint_every=100000",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    if every is not None:
        args += ["telemetry.enabled=true", f"telemetry.every={every}"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"mpt-run failed:\n{proc.stderr[-3000:]}")
    rec = json.loads((run_dir / "run.json").read_text())
    return {"steps_per_s": rec["steps"] / rec["train_time_s"], "wall_s": rec["wall_time_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument(
        "--every", type=int, nargs="+", default=[100, 10, 1], help="sampling intervals to measure"
    )
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting (the median is shown)")
    ap.add_argument("--precision", default="fp32")
    args = ap.parse_args()
    extra = [f"precision={args.precision}"]
    settings: list[int | None] = [None, *args.every]
    results: dict = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(
            args.repeats
        ):  # interleaved, so a slow phase of the machine hits every setting
            for s in settings:
                results[s].append(one_run(Path(tmp) / f"{s}-{r}", args.steps, s, extra))
    base = statistics.median(x["steps_per_s"] for x in results[None])
    print(
        f"demo (digits CNN), precision={args.precision}, {args.steps} steps, median of "
        f"{args.repeats}"
    )
    print("| telemetry | samples | steps/s | ratio to off | wall s |")
    print("|---|---:|---:|---:|---:|")
    for s in settings:
        sps = statistics.median(x["steps_per_s"] for x in results[s])
        wall = statistics.median(x["wall_s"] for x in results[s])
        label = "off" if s is None else f"every={s}"
        samples = 0 if s is None else len(range(0, args.steps, s))
        print(f"| {label} | {samples} | {sps:.1f} | {sps / base:.3f} | {wall:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
