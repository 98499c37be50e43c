"""How long mpt-report takes over many runs, every one with its per-item evaluation file.

    .venv/bin/python scripts/bench_report.py                 # 1,000 runs, the demo's 360 images
    .venv/bin/python scripts/bench_report.py --runs 200 --items 50000

Trains one real demo run (budget=smoke, fp32), then copies it into `--runs` run folders of one
results folder: groups of 3 seeds x 4 presets (fp32, amp, mixed, no_scaling), each group a
learning rate of its own (`optim.lr` in the config and the overrides, as a sweep over it writes
them), and gives every copy an evaluation of `--items` images whose per-image results differ by
run (a fixed seed), written as the trainer writes them (evidence.from_columns and write_items).
Then times `mpt-report --no-plots` and `mpt-report` (plots too) over the folder, and prints a
table. The bootstrap of every paired difference is included (that is what grows with the items).
"""

from __future__ import annotations

import argparse
import copy
import json
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


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--items", type=int, default=360)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        copies(real_run(Path(tmp) / "template"), root, args.runs, args.items)
        report = [str(BIN / "mpt-report"), str(root), "--quiet"]
        rows = [
            ("mpt-report --no-plots", timed([*report, "--no-plots"])),
            ("mpt-report (with plots)", timed(report)),
        ]
    groups = f"groups of 3 seeds x {len(PRESETS)} presets"
    print(f"{args.runs} runs, {args.items} images each ({groups})")
    print(f"| {'command':<26} | wall time (s) |")
    print(f"|{'-' * 28}|---------------|")
    for name, seconds in rows:
        print(f"| {name:<26} | {seconds:13.1f} |")


if __name__ == "__main__":
    main()
