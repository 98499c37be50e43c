"""The report's interval and verdicts on data with a known truth: the table of docs/report.md
("How well the verdicts work").

    .venv/bin/python scripts/verdict_coverage.py                 # 2,000 replications a cell
    .venv/bin/python scripts/verdict_coverage.py --reps 200      # a quick look

Every cell (scenario x seeds x true difference) draws `--reps` evaluation sets of 360 images at
97 % top-1 with their seeds' runs (mpt_repro/report/simulate.py says how) and lets the report's
own functions judge each: coverage of the 95 % interval, and how often each verdict came out.
The tolerance is ±1 point; the true differences are 0 and 1.5 x the tolerance.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpt_repro.report.simulate import SCENARIOS, run_cell  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000, help="replications per cell")
    parser.add_argument("--resamples", type=int, default=500, help="bootstrap resamples")
    parser.add_argument("--tolerance", type=float, default=1.0)
    parser.add_argument("--seeds", default="3,5,10", help="seed counts")
    parser.add_argument("--csv", help="also write the table here")
    args = parser.parse_args()
    started, rows = time.time(), []
    for scenario in SCENARIOS:
        for n in (int(s) for s in args.seeds.split(",")):
            for delta in (0.0, 1.5 * args.tolerance):
                cell = run_cell(scenario, n, delta, args.tolerance, args.reps, 360, args.resamples)
                rows.append(cell.row())
                print(rows[-1], file=sys.stderr, flush=True)
    table = pd.DataFrame(rows)
    if args.csv:
        table.to_csv(args.csv, index=False)
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(str(v) for v in row) + " |")
    print(
        f"\n{args.reps} replications a cell, {args.resamples} bootstrap resamples each, tolerance "
        f"±{args.tolerance:g}; {time.time() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
