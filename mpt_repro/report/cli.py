"""mpt-report [RESULTS_DIR] [--out DIR]: tables (Markdown, CSV, LaTeX) and plots from run records.

mpt-report                          # results/runs -> results/report
mpt-report /data/sweep --out /tmp/r --no-plots
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from mpt_repro.report.aggregate import aggregate
from mpt_repro.report.collect import Problem, load_runs
from mpt_repro.report.plots import cost_plots, experiment_plots
from mpt_repro.report.render import markdown, write_table
from mpt_repro.report.tables import Table, all_tables


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="mpt-report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "results_dir",
        nargs="?",
        default="results/runs",
        type=Path,
        help="folder searched for run.json files (default: results/runs)",
    )
    parser.add_argument(
        "--out",
        default=Path("results/report"),
        type=Path,
        help="where report.md, tables/ and plots/ go (default: results/report)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    parser.add_argument(
        "--quiet", action="store_true", help="do not print the report to the terminal"
    )
    return parser.parse_args(argv)


def problems_section(problems: list[Problem]) -> str:
    """Everything left out of the tables, grouped by why, with the run directory."""
    if not problems:
        return "## Runs not in the tables\n\nNone: every run record was read and used.\n"
    out = [
        "## Runs not in the tables, and runs to check",
        "",
        "These records were found but not averaged into any table (failed, still running or "
        "interrupted, unreadable). Runs that are in the tables but need a second look (non-finite "
        "metrics, no curves) are listed too.",
        "",
    ]
    headings = {
        "failed": "Failed",
        "running": "Still running or interrupted",
        "unreadable": "Unreadable or corrupt",
        "suspect": "Completed with non-finite metrics (in the tables: check them)",
        "no curves": "Without training curves (in the tables, not in the plots)",
    }
    for status in sorted(
        {p.status for p in problems}, key=lambda s: list(headings).index(s) if s in headings else 99
    ):
        out += [f"### {headings.get(status, status)}", ""]
        out += [f"- `{p.path}`: {p.reason}" for p in problems if p.status == status]
        out.append("")
    return "\n".join(out)


def build_report(
    results_dir: Path, out: Path, plots: bool = True
) -> tuple[str, list[Table], list[Problem]]:
    """Read, aggregate, write every output; return the Markdown text, the tables, the problems."""
    runs, problems = load_runs(results_dir)
    agg = aggregate(runs)
    tables = all_tables(agg)

    tables_dir, plots_dir = out / "tables", out / "plots"
    for table in tables:
        write_table(table, tables_dir)
    # the raw material, for anyone who wants other tables: one row per run, one per group
    runs.to_csv(out / "runs.csv", index=False)
    agg.to_csv(out / "groups.csv", index=False)
    pd.DataFrame([p.__dict__ for p in problems], columns=["path", "status", "reason"]).to_csv(
        out / "problems.csv", index=False
    )

    images = []
    if plots and not runs.empty:
        curves, curve_problems = experiment_plots(runs, plots_dir)
        problems = problems + curve_problems
        images = curves + cost_plots(agg, plots_dir)

    n_used = len(runs)
    text = [
        "# Mixed Precision Training reproduction: report",
        "",
        f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from "
        f"`{results_dir}`: "
        f"{n_used} run(s) in the tables, "
        f"{sum(p.status not in ('no curves', 'suspect') for p in problems)} left out "
        "(listed at the end).",
        "Cells are `mean ± sample standard deviation (n=seeds)` over completed runs; a blank cell "
        "is a preset "
        "that did not run. Values marked `paper` are Micikevicius et al. 2018's, with the "
        "evidence tag of "
        "our reference notes ([P] primary text, [S] secondary, [U] unconfirmed).",
        "",
    ]
    if runs.empty:
        text += ["**No usable run records were found.**", ""]
    text += ["## Tables", ""] + [markdown(t) for t in tables]
    text.append(problems_section(problems))
    if images:
        text += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in images] + [""]
    report = "\n".join(text)
    (out / "report.md").write_text(report)
    return report, tables, problems


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.results_dir.is_dir():
        print(
            f"mpt-report: no results folder {args.results_dir} (run mpt-run first, or pass "
            "RESULTS_DIR)",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report, _, _ = build_report(args.results_dir, args.out, plots=not args.no_plots)
    if not args.quiet:
        print(report)
    print(
        f"mpt-report: wrote {args.out / 'report.md'}, tables/ (csv, tex, md) and plots/",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
