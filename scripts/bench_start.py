"""What a spawned `mpt-run` costs before and around its training: CPU seconds of a one-step run,
this tree against another commit, alternating, in one invocation (docs/performance.md, "The start
of every mpt-run").

    .venv/bin/python scripts/bench_start.py --before HEAD~3 [--reps 5]

The other commit is checked out in a temporary git worktree and put first on PYTHONPATH, so both
sides run with this venv's packages and differ only in the suite's own code. Each run is
`mpt-run experiment=demo budget=smoke precision=fp32 trainer.max_steps=1` on one thread into a
fresh runs folder; the figure is the child's user + system CPU time (resource.getrusage), which
a loaded machine inflates less than wall time. Prints a Markdown table with the medians.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = [
    "experiment=demo",
    "budget=smoke",
    "precision=fp32",
    "trainer.device=cpu",
    "trainer.max_steps=1",
    "trainer.progress=false",
]


def one_run(pythonpath: str | None, runs_dir: Path) -> float:
    """CPU seconds (user + system) of one mpt-run child process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = "from mpt_repro.cli import main; main()"
    subprocess.run(
        [sys.executable, "-c", code, *RUN, f"paths.runs_dir={runs_dir}"],
        env=env,
        cwd=runs_dir,
        check=True,
        capture_output=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the commit to compare with (e.g. HEAD~3)")
    ap.add_argument("--reps", type=int, default=5, help="runs of each side, alternating")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(tree), args.before],
            cwd=ROOT,
            check=True,
        )
        try:
            times: dict[str, list[float]] = {"before": [], "after": []}
            for i in range(args.reps):
                for side, path in (("before", str(tree)), ("after", str(ROOT))):
                    runs = Path(tmp) / f"{side}-{i}"
                    runs.mkdir()
                    times[side].append(one_run(path, runs))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"| one-step `mpt-run {' '.join(RUN)}` | CPU s per run | median |")
    print("|---|---|---:|")
    for side, label in (("before", f"before ({rev})"), ("after", "this tree")):
        cells = ", ".join(f"{t:.2f}" for t in times[side])
        print(f"| {label} | {cells} | {statistics.median(times[side]):.2f} |")
    ratio = statistics.median(times["after"]) / statistics.median(times["before"])
    print(f"\nmedian ratio this tree / before: {ratio:.2f}x ({args.reps} runs each, alternating)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
