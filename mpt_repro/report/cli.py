"""mpt-report [RESULTS_DIR] [--out DIR]: tables (Markdown, CSV, LaTeX) and plots from run records.

mpt-report                          # results/runs -> results/report (+ results/bench/*.json)
mpt-report results/runs/demo        # -> results/runs/demo/report (never over results/report)
mpt-report /data/sweep --out /tmp/r --no-plots --tolerance top1=0.3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from mpt_repro.advise import advice_section
from mpt_repro.claims import claims_table
from mpt_repro.evidence import DROPPED_WARN_SHARE
from mpt_repro.record import current_umask
from mpt_repro.report.aggregate import aggregate
from mpt_repro.report.bench import bench_tables
from mpt_repro.report.collect import Problem, load_runs, problems_frame
from mpt_repro.report.compare import (
    Settings,
    default_settings,
    deltas_frame,
    group_deltas,
    with_tolerances,
)
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
        default=None,
        type=Path,
        help="where report.md, tables/ and plots/ go (default: report/ beside a folder named "
        "runs, as results/runs -> results/report; inside any other folder, as DIR/report)",
    )
    parser.add_argument(
        "--bench",
        type=Path,
        default=None,
        help="folder of mpt-bench JSON files rendered as benchmark tables (default: bench/ "
        "beside a folder named runs, as results/bench; inside any other folder, DIR/bench)",
    )
    parser.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="METRIC=VALUE",
        help="the largest difference to fp32 that still reads as a match, e.g. top1=0.3 or "
        "perplexity=2%% (repeatable; defaults in mpt_repro/report/comparison.yaml)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    parser.add_argument(
        "--quiet", action="store_true", help="do not print the report to the terminal"
    )
    return parser.parse_args(argv)


def beside(results_dir: Path, name: str) -> Path:
    """Where a report (name "report") or the benchmark files (name "bench") of a results folder
    are: beside it when the folder is a `runs` folder (results/runs -> results/report), else
    inside it, so a report of one experiment's folder never replaces the whole results' report."""
    results_dir = Path(results_dir)
    return results_dir.parent / name if results_dir.name == "runs" else results_dir / name


# how the list of left-out runs is grouped, in this order; "in the tables" says whether the runs
# of a group are also in the tables
HEADINGS = {
    "failed": ("Failed", False),
    "interrupted": ("Interrupted (a checkpoint was saved: resume=true continues them)", False),
    "running": ("Still running, or killed before they could record it", False),
    "malformed": ("Malformed or unreadable records", False),
    "duplicate": (
        "Duplicates (the same configuration, preset and seed as a run in the tables)",
        False,
    ),
    "conflict": (
        "Conflicting records (one configuration, preset and seed, other results: both listed, "
        "the first in the tables without a verdict)",
        True,
    ),
    "replaced": ("Replaced by overwrite=true (kept aside)", False),
    "suspect": (
        "Completed with non-finite metrics, without one applied step, or with more than "
        f"{100 * DROPPED_WARN_SHARE:g} % of the evaluation data dropped (in the tables: check "
        "them)",
        True,
    ),
    "no curves": ("Without training curves (in the tables, not in the plots)", True),
}


def problems_section(problems: list[Problem]) -> str:
    """Everything left out of the tables, grouped by why, with the run directory and hint."""
    if not problems:
        return "## Runs not in the tables\n\nNone: every run record was read and used.\n"
    out = [
        "## Runs not in the tables, and runs to check",
        "",
        "These records were found but are not in any table (failed, interrupted, still running, "
        "malformed), or are in the tables but need a second look.",
        "",
    ]
    order = list(HEADINGS)
    for status in sorted(
        {p.status for p in problems}, key=lambda s: order.index(s) if s in order else 99
    ):
        out += [f"### {HEADINGS.get(status, (status, False))[0]}", ""]
        for p in problems:
            if p.status != status:
                continue
            who = f" ({p.run})" if p.run else ""
            stop = "" if p.reason.endswith((".", "!", "?")) else "."
            hint = f" Next: {p.hint.rstrip('.')}." if p.hint else ""
            out.append(f"- `{p.path}`{who}: {p.reason}{stop}{hint}")
        out.append("")
    return "\n".join(out)


def left_out(problems: list[Problem]) -> int:
    return sum(not HEADINGS.get(p.status, ("", False))[1] for p in problems)


def build_report(
    results_dir: Path,
    out: Path,
    plots: bool = True,
    bench_dir: Path | None = None,
    settings: Settings | None = None,
) -> tuple[str, list[Table], list[Problem]]:
    """Read, aggregate, write every output; return the Markdown text, the tables, the problems."""
    settings = settings or default_settings()
    runs, problems = load_runs(results_dir)
    agg = aggregate(runs)
    deltas = group_deltas(runs, settings)  # the bootstrap runs once per report
    tables = all_tables(agg, runs, settings, deltas)
    claims = claims_table(runs)  # the paper's claims whose runs are in this folder
    tables += [claims] if claims is not None else []
    bench_dir = beside(results_dir, "bench") if bench_dir is None else bench_dir
    benches, bench_problems = bench_tables(bench_dir)
    tables += benches
    problems = problems + bench_problems
    for table in tables:
        write_table(table, out / "tables")
    write_raw(out, runs, agg, settings, deltas)
    images = []
    if plots and not runs.empty:
        curves, curve_problems = experiment_plots(
            runs, out / "plots", settings.reference, settings.confidence, deltas
        )
        problems = problems + curve_problems
        images = curves + cost_plots(agg, out / "plots")
    problems_frame(problems).to_csv(out / "problems.csv", index=False)

    text = header(results_dir, len(runs), left_out(problems), len(benches))
    if runs.empty:
        text += ["**No usable run records were found.**", ""]
    text += ["## Tables", ""] + [markdown(t) for t in tables]
    text.append(problems_section(problems))
    if not runs.empty:
        # mpt-advise's reading of every run that recorded gradient histograms (telemetry),
        # duplicates included: a telemetry run of a sweep's configuration is counted once in the
        # tables (telemetry changes nothing trained), but it is the one that holds histograms
        duplicates = [p.path for p in problems if p.status == "duplicate"]
        figures = out / "advice" if plots else None
        paths = [*runs["path"], *duplicates]
        text.append(advice_section(paths, figures_dir=figures, relative_to=out))
    if images:
        text += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in images] + [""]
    report = "\n".join(text)
    (out / "report.md").write_text(report)
    return report, tables, problems


def write_raw(out: Path, runs, agg, settings: Settings, deltas=None) -> None:
    """The raw material, for anyone who wants other tables: one row per run (a diverged run's
    metric columns are empty: its `outcome` says what happened), one per group and preset, one
    per paired difference."""
    hidden = ["precision_config", "metrics_detail", "comparison_config", "preset_config"]
    hidden.append("evaluation")  # its count and unit are columns of their own
    runs.drop(columns=hidden, errors="ignore").to_csv(out / "runs.csv", index=False)
    agg.drop(columns=["precision_config"], errors="ignore").to_csv(out / "groups.csv", index=False)
    deltas_frame(runs, settings, deltas).to_csv(out / "deltas.csv", index=False)


CSV_FILES = ("runs", "groups", "deltas", "problems")  # the raw tables beside report.md


def header(results_dir: Path, n_used: int, n_left_out: int, n_benches: int) -> list[str]:
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    benches = f", {n_benches} benchmark file(s)" if n_benches else ""
    return [
        "# Mixed Precision Training reproduction: report",
        "",
        f"Generated {made} from `{results_dir}`: {n_used} run(s) in the tables, {n_left_out} "
        f"left out (listed at the end){benches}.",
        "Cells are `mean ± sample standard deviation (n=seeds)` over completed runs of one "
        "comparison group (runs that differ in precision and seed alone); a blank cell is a "
        "preset that did not run. Values marked `paper` are Micikevicius et al. 2018's, with the "
        "evidence tag of our reference notes ([P] primary text, [S] secondary, [U] "
        "unconfirmed).",
        "",
    ]


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    bench_dir = beside(args.results_dir, "bench") if args.bench is None else args.bench
    out = beside(args.results_dir, "report") if args.out is None else args.out
    try:
        settings = with_tolerances(default_settings(), args.tolerance)
    except ValueError as e:
        return _refuse(str(e))
    records = list(args.results_dir.rglob("run.json")) if args.results_dir.is_dir() else []
    benches = list(bench_dir.glob("*.json")) if bench_dir.is_dir() else []
    if not records and not benches:
        where = "no such folder" if not args.results_dir.is_dir() else "no run.json in it"
        return _refuse(
            f"nothing to report in {args.results_dir} ({where}) and no mpt-bench files in "
            f"{bench_dir}: run mpt-run or mpt-bench first, or pass the folder that holds the runs"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".mpt-report-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        return _refuse(
            f"cannot write the report to {out} ({reason}): choose a writable folder with --out DIR"
        )
    foreign = sorted(p.name for p in out.iterdir() if not _written_by_report(p))
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        return _refuse(
            f"--out {out} holds files a report does not write ({shown}): a report replaces its "
            "folder whole, so give an empty folder or an earlier report's"
        )
    try:
        report = write_atomically(
            out,
            lambda folder: build_report(
                args.results_dir,
                folder,
                plots=not args.no_plots,
                bench_dir=bench_dir,
                settings=settings,
            )[0],
        )
    except KeyboardInterrupt:
        print(f"mpt-report: interrupted; {out} is as it was", file=sys.stderr)
        return 130
    if not args.quiet:
        print(report)
    written = "tables/ (csv, tex, md)" + ("" if args.no_plots else " and plots/")
    print(f"mpt-report: wrote {out / 'report.md'}, {written}", file=sys.stderr)
    return 0


# what a report folder holds (build_report writes these and nothing else)
REPORT_ENTRIES = {"report.md", "tables", "plots", "advice", *(f"{n}.csv" for n in CSV_FILES)}


def _written_by_report(path: Path) -> bool:
    return path.name in REPORT_ENTRIES or path.name.startswith(".")


def write_atomically(out: Path, build) -> str:
    """build(folder) into a new folder beside `out`, then put it in `out`'s place: a report killed
    while it is built leaves the previous one as it was (and a hidden `.<name>.new-*` folder that
    the next report removes), never new tables beside an old report.md. The swap is two renames
    in one folder; the previous report is then deleted (it is this command's own output)."""
    parent, name = out.parent, out.name
    for stale in parent.glob(f".{name}.new-*"):  # a report killed before its swap
        shutil.rmtree(stale, ignore_errors=True)
    new = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.new-"))
    try:
        result = build(new)
        os.chmod(
            new, 0o777 & ~current_umask()
        )  # mkdtemp's 0700 would hide the report from the team
        old = parent / f".{name}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(new, out)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return result


def _refuse(message: str) -> int:
    print(f"mpt-report: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
