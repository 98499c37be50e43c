"""mpt-report [RESULTS_DIR] [--out DIR]: tables (Markdown, CSV, LaTeX) and plots from run records.

mpt-report                          # results/runs -> results/report (+ results/bench/*.json)
mpt-report results/runs/demo        # -> results/runs/demo/report (never over results/report)
mpt-report /data/sweep --out /tmp/r --no-plots --tolerance top1=0.3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from mpt_repro.evidence import DROPPED_WARN_SHARE

if TYPE_CHECKING:
    from mpt_repro.report.collect import Problem
    from mpt_repro.report.compare import Settings
    from mpt_repro.report.tables import Table


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
        "Completed with non-finite metrics, without one applied step, with more than "
        f"{100 * DROPPED_WARN_SHARE:g} % of the evaluation data dropped, or with files of its "
        "record missing or unreadable (in the tables: check them)",
        True,
    ),
    "no curves": ("Without training curves (in the tables, not in the plots)", True),
    "plugin": (
        "Experiment plugins that could not be imported (their runs are reported without the "
        "tables they bring)",
        True,
    ),
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
            where = f"`{p.path}`{who}: " if p.path else ""
            out.append(f"- {where}{p.reason}{stop}{hint}")
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
    previous: Path | None = None,
) -> tuple[str, list[Table], list[Problem]]:
    """Read, aggregate, write every output; return the Markdown text, the tables, the problems.
    ``previous``: the plots folder of the report this one replaces."""
    # pandas, scipy and matplotlib load here, not with the module: `mpt-report --help` is quick
    from mpt_repro.report.aggregate import aggregate
    from mpt_repro.report.bench import bench_tables
    from mpt_repro.report.collect import load_runs, problems_frame
    from mpt_repro.report.compare import default_settings, group_deltas
    from mpt_repro.report.plots import draw_plots
    from mpt_repro.report.render import markdown, write_table
    from mpt_repro.report.tables import all_tables

    settings = settings or default_settings()
    problems = _plugin_problems()  # the report goes on without a plugin that cannot be imported
    runs, record_problems = load_runs(results_dir)
    problems += record_problems
    agg = aggregate(runs)
    deltas = group_deltas(runs, settings)  # the bootstrap runs once per report
    tables = all_tables(agg, runs, settings, deltas)
    claims, claims_problems = _claims(runs)  # the paper's claims whose runs are in this folder
    tables += [claims] if claims is not None else []
    problems = problems + claims_problems
    bench_dir = beside(results_dir, "bench") if bench_dir is None else bench_dir
    benches, bench_problems = bench_tables(bench_dir)
    tables += benches
    problems = problems + bench_problems
    for table in tables:
        write_table(table, out / "tables")
    write_raw(out, runs, agg, settings, deltas)
    images = []
    if plots and not runs.empty:
        # figures drawn in parallel; those of `previous` drawn from the same data are copied
        images, curve_problems = draw_plots(runs, agg, out / "plots", settings, deltas, previous)
        problems = problems + curve_problems
    problems_frame(problems).to_csv(out / "problems.csv", index=False)

    text = header(results_dir, len(runs), left_out(problems), len(benches), quotes_paper(tables))
    if runs.empty:
        text += ["**No usable run records were found.**", ""]
    text += ["## Tables", ""] + [markdown(t) for t in tables]
    text.append(problems_section(problems))
    if not runs.empty:
        text += _advice(runs, problems, out, plots)
    if images:
        text += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in images] + [""]
    report = "\n".join(text)
    (out / "report.md").write_text(report)
    return report, tables, problems


def _plugin_problems() -> list[Problem]:
    """Each experiment plugin that cannot be imported, listed: its runs are reported without
    the tables and views it brings."""
    from mpt_repro.registry import load_available
    from mpt_repro.report.collect import Problem

    return [Problem("", "plugin", reason) for reason in load_available()]


def _claims(runs) -> tuple[Table | None, list[Problem]]:
    """The claims section, or the claims folder listed as unreadable: a claims file edited by
    hand (a tolerance given as a number) must not stop the report of every folder of its runs."""
    from mpt_repro.catalog import conf_dir
    from mpt_repro.claims import claims_table
    from mpt_repro.record import not_a_regular_file
    from mpt_repro.report.collect import Problem

    for path in sorted((conf_dir() / "claims").glob("*.yaml")):  # a FIFO would never end
        what = not_a_regular_file(path)
        if what:
            reason = f"{what}, not a claims file: never opened, and no claim judged"
            return None, [Problem(str(path), "malformed", reason, hint="remove it")]
    try:
        return claims_table(runs), []
    except Exception as err:  # noqa: BLE001 - any damage in a claims file: listed, report goes on
        where = _failing_claim(runs) or conf_dir() / "claims"
        reason = f"the paper's claims could not be judged: {type(err).__name__}: {err}"
        hint = "fix that file (conf/claims/README.md lists the fields and their types)"
        return None, [Problem(str(where), "malformed", reason, hint=hint)]


def _failing_claim(runs) -> Path | None:
    """The claims file whose judging fails (a tolerance written as a number), when one does."""
    from mpt_repro.catalog import conf_dir
    from mpt_repro.claims import findings, load_claims

    try:
        claims = load_claims()
    except Exception:  # noqa: BLE001 - a file that does not load: its error names it
        return None
    for claim in claims:
        try:
            findings(runs, [claim])
        except Exception:  # noqa: BLE001 - the one that fails is the answer
            return conf_dir() / "claims" / f"{claim.name}.yaml"
    return None


def _advice(runs, problems: list[Problem], out: Path, plots: bool) -> list[str]:
    """mpt-advise's reading of every run that recorded gradient histograms (telemetry),
    duplicates included: a telemetry run of a sweep's configuration is counted once in the
    tables (telemetry changes nothing trained), but it is the one that holds histograms."""
    duplicates = [p.path for p in problems if p.status == "duplicate"]
    figures = out / "advice" if plots else None
    paths = [p for p in (*runs["path"], *duplicates) if any(Path(p).glob("*.jsonl"))]
    if not paths:  # mpt-advise imports torch: only once a run has telemetry records to read
        return []
    from mpt_repro.advise import advice_section

    return [advice_section(paths, figures_dir=figures, relative_to=out)]


def write_raw(out: Path, runs, agg, settings: Settings, deltas=None) -> None:
    """The raw material, for anyone who wants other tables: one row per run (a diverged run's
    metric columns are empty: its `outcome` says what happened), one per group and preset, one
    per paired difference."""
    from mpt_repro.report.compare import deltas_frame

    hidden = ["precision_config", "metrics_detail", "comparison_config", "preset_config"]
    hidden.append("evaluation")  # its count and unit are columns of their own
    runs.drop(columns=hidden, errors="ignore").to_csv(out / "runs.csv", index=False)
    agg.drop(columns=["precision_config"], errors="ignore").to_csv(out / "groups.csv", index=False)
    deltas_frame(runs, settings, deltas).to_csv(out / "deltas.csv", index=False)


CSV_FILES = ("runs", "groups", "deltas", "problems")  # the raw tables beside report.md


def header(
    results_dir: Path, n_used: int, n_left_out: int, n_benches: int, papers: bool = True
) -> list[str]:
    """The report's first lines; `papers`: whether a table quotes the paper's values (a report
    of a plugin's runs alone quotes none, so it does not speak of them)."""
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    benches = f", {n_benches} benchmark file(s)" if n_benches else ""
    cells = (
        "Cells are `mean ± sample standard deviation (n=seeds)` over completed runs of one "
        "comparison group (runs that differ in precision and seed alone); a blank cell is a "
        "preset that did not run."
    )
    if papers:
        cells += (
            " Values marked `paper` are Micikevicius et al. 2018's, with the evidence tag of our "
            "reference notes ([P] primary text, [S] secondary, [U] unconfirmed)."
        )
    return [
        "# Mixed Precision Training reproduction: report",
        "",
        f"Generated {made} from `{results_dir}`: {n_used} run(s) in the tables, {n_left_out} "
        f"left out (listed at the end){benches}.",
        cells,
        "",
    ]


def quotes_paper(tables: list) -> bool:
    """Whether a table shows the paper's values: a paper table as printed (`*_paper`), a column
    of the paper's values (`paper fp32 [P]`) or a row of them (`paper: English (WSJ '92)`)."""
    for table in tables:
        first = table.frame.iloc[:, 0].astype(str) if len(table.frame.columns) else []
        if (
            table.slug.endswith("_paper")
            or any(str(c).startswith("paper") for c in table.frame.columns)
            or any(cell.startswith("paper") for cell in first)
        ):
            return True
    return False


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    bench_dir = beside(args.results_dir, "bench") if args.bench is None else args.bench
    out = beside(args.results_dir, "report") if args.out is None else args.out
    from mpt_repro.report.compare import default_settings, with_tolerances

    try:
        settings = with_tolerances(default_settings(), args.tolerance)
    except ValueError as e:
        return _refuse(str(e))
    try:
        records = list(args.results_dir.rglob("run.json")) if args.results_dir.is_dir() else []
        benches = list(bench_dir.glob("*.json")) if bench_dir.is_dir() else []
    except OSError as e:  # a path component past the file system's 255 bytes, a loop of links
        return _refuse(
            f"{e.filename or args.results_dir} cannot be read ({e.strerror or e}): give the "
            "folder that holds the runs"
        )
    special = _special_files(records) or _unknown_tolerances(args.tolerance, records)
    if special:
        return _refuse(special)
    if not records and not benches:
        where = "no such folder" if not args.results_dir.is_dir() else "no run.json in it"
        return _refuse(
            f"nothing to report in {args.results_dir} ({where}) and no mpt-bench files in "
            f"{bench_dir}: run mpt-run or mpt-bench first, or pass the folder that holds the runs"
        )
    refused = out_refusal(out, args.results_dir, bench_dir)
    if refused:
        return _refuse(refused)
    return _write(args, out, bench_dir, settings)


def _write(args, out: Path, bench_dir: Path, settings: Settings) -> int:
    """Build the report into `out` (checked by out_refusal) and say where it went."""
    given, out = out, out.resolve()  # a symlinked --out: the folder it names is replaced
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".mpt-report-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        return _refuse(
            f"cannot write the report to {given} ({reason}): choose a writable folder with "
            "--out DIR"
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
                previous=out / "plots",
            )[0],
        )
    except KeyboardInterrupt:
        print(f"mpt-report: interrupted; {given} is as it was", file=sys.stderr)
        return 130
    if not args.quiet:
        print(report)
    written = "tables/ (csv, tex, md)" + ("" if args.no_plots else " and plots/")
    print(f"mpt-report: wrote {given / 'report.md'}, {written}", file=sys.stderr)
    return 0


# written with every report: each file and folder the report wrote, by name. A report replaces
# only a folder whose every entry is listed there; anything else in --out means refuse.
MANIFEST = ".mpt-report-manifest.json"
# in a report's folder while it is being built: a `.<name>.new-*` folder without it is not ours
BUILDING = ".mpt-report-building"


def write_atomically(out: Path, build) -> str:
    """build(folder) into a new folder beside `out`, then put it in `out`'s place: a report killed
    while it is built leaves the previous one as it was (and a hidden `.<name>.new-*` folder that
    the next report removes), never new tables beside an old report.md. The swap is two renames
    in one folder; the previous report is then deleted (every entry of it is in its manifest:
    checked by out_refusal before anything was written)."""
    from mpt_repro.record import current_umask

    parent, name = out.parent, out.name
    for stale in parent.glob(f".{name}.new-*"):  # a report killed before its swap
        if stale.is_dir() and not stale.is_symlink() and (stale / BUILDING).is_file():
            shutil.rmtree(stale, ignore_errors=True)
    new = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.new-"))
    try:
        (new / BUILDING).write_text("")
        result = build(new)
        (new / BUILDING).unlink()
        (new / MANIFEST).write_text(json.dumps({"written_by": "mpt-report", **_entries(new)}))
        os.chmod(new, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide the report
        old = parent / f".{name}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(new, out)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return result


def _entries(folder: Path) -> dict[str, list[str]]:
    """Every entry under `folder` by its path relative to it: files, folders and anything else
    (a link, a FIFO), each kind apart; the manifest itself left out."""
    found: dict[str, list[str]] = {"files": [], "folders": [], "other": []}
    for root, dirs, files in os.walk(folder):
        for entry in (*dirs, *files):
            path = Path(root, entry)
            rel = path.relative_to(folder).as_posix()
            if rel == MANIFEST:
                continue
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                found["other"].append(rel)
            else:
                found["folders" if path.is_dir() else "files"].append(rel)
    return {k: sorted(v) for k, v in found.items()}


def _unowned(out: Path) -> tuple[list[str], bool]:
    """(the entries of an existing --out that no earlier report's manifest lists, whether it
    has a readable manifest). Nothing is changed."""
    from mpt_repro.safeio import read_text

    present = _entries(out)
    try:
        listed = json.loads(read_text(out / MANIFEST))
        ok = isinstance(listed, dict) and listed.get("written_by") == "mpt-report"
    except (OSError, ValueError):
        listed, ok = {}, False
    own = {k: set(listed.get(k) or []) if ok else set() for k in ("files", "folders")}
    foreign = [*present["other"]]  # a report writes no links, FIFOs or devices
    foreign += [f for f in present["files"] if f not in own["files"]]
    foreign += [f"{d}/" for d in present["folders"] if d not in own["folders"]]
    return sorted(foreign), ok


def out_refusal(out: Path, results_dir: Path, bench_dir: Path) -> str | None:
    """Why the report may not go to `out` (one line), or None. A report replaces its folder
    whole: never `/`, the current folder, a home folder, the runs or bench folder or one that
    holds them, nor a folder with anything its own manifest does not list."""
    try:
        target = out.resolve()
        if target.exists() and not target.is_dir():
            return None  # the write check below names it
        protected = _protected()
        if target in protected:
            return (
                f"--out {out} is {protected[target]}: a report replaces its folder whole; give "
                f"a folder of its own, e.g. --out {beside(results_dir, 'report')}"
            )
        for what, folder in (("runs", results_dir), ("mpt-bench", bench_dir)):
            held = folder.resolve()
            if target == held or target in held.parents:
                how = "is" if target == held else "holds"
                return (
                    f"--out {out} {how} the {what} folder {folder}: a report replaces its folder "
                    f"whole; give another, e.g. --out {beside(results_dir, 'report')}"
                )
        if not target.is_dir():
            return None
        foreign, has_manifest = _unowned(target)
    except (OSError, RuntimeError) as e:  # a name too long, a loop of links
        return f"--out {out} cannot be used ({getattr(e, 'strerror', None) or e}): choose another"
    if not foreign:
        return None
    shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
    if not has_manifest and "report.md" in foreign:
        return (
            f"--out {out} holds a report without the manifest ({MANIFEST}) this version writes, "
            f"so it cannot tell its files from others ({shown}): delete that folder yourself, or "
            "give another --out"
        )
    return (
        f"--out {out} holds files a report does not write ({shown}): a report replaces its "
        "folder whole and removes only what its own manifest lists; give an empty or new folder, "
        "or an earlier report's, or move those files away. Nothing was changed"
    )


def _protected() -> dict[Path, str]:
    """Folders a report never replaces, whatever they hold."""
    import pwd

    found = {Path(p.pw_dir): f"the home folder of {p.pw_name}" for p in pwd.getpwall()}
    found[Path.home().resolve()] = "your home folder"
    found[Path.cwd().resolve()] = "the current folder"
    found[Path("/")] = "the root folder"
    return found


def _special_files(records: list[Path]) -> str | None:
    """A run.json that is not a regular file (a FIFO would keep the report waiting for a writer
    forever; a device may never end): the refusal naming it, or None. Nothing is opened."""
    from mpt_repro.record import not_a_regular_file

    for path in sorted(records):
        what = not_a_regular_file(path)
        if what:
            return (
                f"{path} is {what}, not a run record mpt-run wrote: the report never opens it. "
                "Remove it (or report on a folder without it), then run mpt-report again"
            )
    return None


def _unknown_tolerances(items: list[str], records: list[Path]) -> str | None:
    """A --tolerance for a metric no run recorded would be ignored in silence (a misspelt
    `--tolerance top_1=0.3` left top1 at its default)."""
    asked = [i.partition("=")[0] for i in items if i.partition("=")[0] != "default"]
    if not asked or not records:
        return None
    known: set[str] = set()
    for path in records:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            known.update(record.get("metrics") or {})
            known.update(record.get("metrics_detail") or {})
        except (OSError, ValueError, AttributeError, TypeError):
            continue  # an unreadable record is reported as such by the report itself
    unknown = [m for m in asked if m not in known]
    if not unknown or not known:
        return None
    return (
        f"--tolerance {unknown[0]}=...: no run here recorded a metric {unknown[0]!r} (they "
        f"recorded: {', '.join(sorted(known))}); give one of those, or default=VALUE for all"
    )


def _refuse(message: str) -> int:
    print(f"mpt-report: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
