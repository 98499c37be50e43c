"""How long mpt-report takes over many runs, every one with its per-item evaluation file.

    .venv/bin/python scripts/bench_report.py                 # 1,000 runs, the demo's 360 images
    .venv/bin/python scripts/bench_report.py --runs 200 --items 50000

Trains one real demo run (budget=smoke, fp32), then copies it into `--runs` run folders of one
results folder: groups of 3 seeds x 4 presets (fp32, amp, mixed, no_scaling), each group a
learning rate of its own (`optim.lr` in the config and the overrides, as a sweep over it writes
them), and gives every copy an evaluation of `--items` images whose per-image results differ by
run (a fixed seed), written as the trainer writes them (evidence.from_columns and write_items).
Then times, over the folder, `mpt-report --no-plots`; `mpt-report` (plots too) into a new
folder; the same again into that folder (every figure's data unchanged: copied from the report it
replaces); and again after one run's training curve changed (its group's figures redrawn). Prints
a table with each one's wall and CPU time (the CPU time of its figure-drawing processes included)
and the machine's load. The bootstrap of every paired difference is included (that is what grows
with the items).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mpt_repro.evidence import ITEMS_FILE, Ratio, from_columns, write_items
from mpt_repro.record import RunRecord

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PRESETS = ("fp32", "amp", "mixed", "no_scaling")
FORMULAS = {
    "loss": Ratio("loss", "items", "images"),
    "top1": Ratio("top1", "items", "images", scale=100.0),
    "top5": Ratio("top5", "items", "images", scale=100.0),
}


def real_run(folder: Path) -> Path:
    args = [str(BIN / "mpt-run"), "experiment=demo", "budget=smoke", "trainer.progress=false",
            f"paths.runs_dir={folder}"]  # fmt: skip
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    return next(folder.rglob("run.json")).parent


def copies(template: Path, root: Path, runs: int, items: int) -> None:
    record = json.loads((template / "run.json").read_text())
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, items).astype(float)
    for i in range(runs):
        group, rest = divmod(i, 3 * len(PRESETS))
        preset, seed = PRESETS[rest // 3], rest % 3
        lr = 0.01 * (group + 1)
        out = copy.deepcopy(record)
        out.update(precision=preset, seed=seed, overrides=[f"optim.lr={lr}"])
        out["config"].update(seed=seed)
        out["config"]["optim"]["lr"] = lr
        correct = (rng.random(items) < 0.9).astype(float)
        columns = {"loss": 1 - correct / 2, "top1": correct, "top5": np.ones(items),
                   "items": np.ones(items), "label": labels}  # fmt: skip
        evaluation = from_columns(columns, FORMULAS, "images")
        out.update(metrics=evaluation.metrics, evaluation=evaluation.record(1, ITEMS_FILE))
        run_dir = root / "demo" / f"{preset}-smoke" / f"seed{seed}" / f"optim.lr={lr:g}"
        writer = RunRecord(run_dir, {})
        writer.data = out
        writer.write()
        write_items(run_dir / ITEMS_FILE, evaluation.columns, 1)
        shutil.copy(template / "metrics.csv", run_dir / "metrics.csv")


def timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child): the CPU time holds on a loaded machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--items", type=int, default=360)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        copies(real_run(Path(tmp) / "template"), root, args.runs, args.items)
        report = [str(BIN / "mpt-report"), str(root), "--quiet", "--out", str(Path(tmp) / "r")]
        load = os.getloadavg()[0]
        rows = [("mpt-report --no-plots", timed([*report, "--no-plots"]))]
        subprocess.run(["rm", "-rf", str(Path(tmp) / "r")], check=True)
        rows.append(("mpt-report (plots, new folder)", timed(report)))
        rows.append(("the same again (unchanged)", timed(report)))
        one_run_changed(root)
        rows.append(("again, one run's curve changed", timed(report)))
        load = max(load, os.getloadavg()[0])
    groups = f"groups of 3 seeds x {len(PRESETS)} presets"
    print(f"{args.runs} runs, {args.items} images each ({groups}); {len(os.sched_getaffinity(0))}"
          f" CPUs, load average up to {load:.1f} while it ran")  # fmt: skip
    print(f"| {'command':<32} | wall time (s) | CPU time (s) |")
    print(f"|{'-' * 34}|---------------|--------------|")
    for name, (wall, cpu) in rows:
        print(f"| {name:<32} | {wall:13.1f} | {cpu:12.1f} |")


def one_run_changed(root: Path) -> None:
    """One run's training losses 1% higher: its comparison group's figures change, no other."""
    import pandas as pd

    path = next(root.rglob("metrics.csv"))
    frame = pd.read_csv(path)
    frame["loss"] = frame["loss"] * 1.01
    frame.to_csv(path, index=False)


if __name__ == "__main__":
    main()
