"""Run every claim of conf/claims/ on this machine, seeds until decided, on two disjoint seed
sets, and write the page of verdicts.

    make reproduce-claims                          # all claims: results/claims/{runs,claims.md}
    .venv/bin/python scripts/reproduce_claims.py --docs docs/claims.md   # also the committed page
    .venv/bin/python scripts/reproduce_claims.py --tiny     # every claim at budget=smoke, one
                                      # seed a set: structure only (results/claims/tiny/)
    .venv/bin/python scripts/reproduce_claims.py --dry-run               # the first sweeps
    .venv/bin/python scripts/reproduce_claims.py --seed-offset 100 --claims-dir my/claims
    .venv/bin/python scripts/reproduce_claims.py --judge-only --docs docs/claims.md  # judge again
                                                   # from the runs there, running nothing

The claims files are checked first (mpt_repro.claims.load_claims: one line naming the file and
the key, exit 2, before any run). The claims' runs are gathered into as few sweeps as possible
(one per experiment, budget, overrides and telemetry), each a Hydra multirun of `mpt-run` with
resume=true: a second call finds the finished runs and runs only what is missing. Each run uses
one thread (OMP_NUM_THREADS=1, faster for these small models on a CPU than two), in portable mode
(trainer.portable=true: the same bits on any x86-64 machine with AVX2), and the page ends with
every run's digest, which `make verify-claims` checks on another machine. Every claim is
judged on seed set A and again on the disjoint set B (mpt_repro/claims_run.py), adding seeds
look by look until its tests are decided or its sequential rule stops it (on the runs' numbers
alone, never on their time, so the page stops at the same looks on any machine); the
page (claims.md under --out, and with --docs the committed page) shows both sets' verdicts,
each test's tolerance with its reason, what would have refuted it and the resolution reached.
Exit 0 when the page was written, even where a claim is not reproduced (a finding); 2 for a bad
claims file or option, or when no sweep could start at all.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpt_repro.claims import Claim, ClaimsError, findings_frame, load_claims  # noqa: E402
from mpt_repro.claims_run import (  # noqa: E402
    Judged,
    agreement,
    decide_claims,
    first_seeds,
    machine_text,
    page_text,
    tiny,
    with_seeds,
)
from mpt_repro.record import git_commit  # noqa: E402
from mpt_repro.report.collect import load_runs  # noqa: E402

MPT_RUN = str(Path(sys.executable).with_name("mpt-run"))


def sweeps(claims: list[Claim]) -> dict[tuple, set[int]]:
    """{(experiment, budget, overrides, presets, extra): seeds}: the claims' runs, each once;
    the presets that need the same seeds (of one experiment, budget, overrides and telemetry)
    share a sweep, so a round starts as few processes as it can."""
    seeds_of: dict[tuple, set[int]] = {}
    for c in claims:
        if c.runs is None:
            continue
        for presets, extra in c.runs.sweeps():
            for preset in presets:
                key = (c.runs.experiment, c.runs.budget, c.runs.overrides, preset, extra)
                seeds_of.setdefault(key, set()).update(c.runs.seeds)
    grouped: dict[tuple, list[str]] = {}
    for (experiment, budget, overrides, preset, extra), seeds in seeds_of.items():
        key = (experiment, budget, overrides, extra, tuple(sorted(seeds)))
        grouped.setdefault(key, []).append(preset)
    return {
        (experiment, budget, overrides, tuple(presets), extra): set(seeds)
        for (experiment, budget, overrides, extra, seeds), presets in grouped.items()
    }


COMMITTED_PAGE = ROOT / "docs" / "claims.md"  # the page the repository commits (--docs)


def command(key: tuple, seeds: set[int], runs_dir: Path) -> list[str]:
    experiment, budget, overrides, presets, extra = key
    return [
        MPT_RUN,
        "-m",
        f"experiment={experiment}",
        f"budget={budget}",
        f"precision={','.join(presets)}",
        f"seed={','.join(map(str, sorted(seeds)))}",
        *overrides,
        *extra,
        PORTABLE,
        "resume=true",
        "trainer.progress=false",
        f"paths.runs_dir={runs_dir}",
    ]


def run_sweeps(plan: dict[tuple, set[int]], runs_dir: Path, dry_run: bool) -> list[tuple]:
    """Each sweep in turn; [(command, seconds, exit code)]."""
    done = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for key, seeds in plan.items():
        args = command(key, seeds, runs_dir)
        # as typed from the checkout: no path of this machine in the page
        where = os.path.relpath(runs_dir, ROOT) if runs_dir.is_relative_to(ROOT) else runs_dir
        shown = shlex.join(["mpt-run", *args[1:-1], f"paths.runs_dir={where}"])
        print(f"+ {shown}", flush=True)
        if dry_run:
            continue
        start = time.perf_counter()
        code = subprocess.run(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL).returncode
        done.append((shown, time.perf_counter() - start, code))
        print(f"  {done[-1][1]:.0f} s, exit {code}", flush=True)
    return done


# -- portable mode and the digests of the runs (issue 43) -----------------------------------------
# every claim's run in portable mode: the same bits on any x86-64 machine with AVX2, so that
# `make verify-claims` can check the page's numbers elsewhere (mpt_repro/machine.py)
PORTABLE = "trainer.portable=true"
# the fenced block of the page that holds the digests (scripts/verify_claims.py reads it)
DIGESTS_FENCE = "json run-digests"
# run controls a re-run of one run does not repeat (verify-claims sets its own)
RERUN_LEFT_OUT = ("resume", "paths.runs_dir", "trainer.progress")


def canonical(overrides: list[str]) -> set[str]:
    """Overrides as `key=value` in one spelling: a record keeps them as Hydra rendered them
    (`trainer.portable=True`), a sweep as typed (`trainer.portable=true`)."""
    from mpt_repro.identity import parse_overrides, render_value

    return {f"{o.key_or_group}={render_value(o.value())}" for o in parse_overrides(overrides)}


def planned_records(plan: dict[tuple, set[int]], runs_dir: Path) -> list[tuple[Path, dict]]:
    """(run directory, record) of every run of `plan` found under runs_dir, in path order: the
    runs the page rests on (a runs folder may hold others, from other claims or budgets)."""
    from mpt_repro.record import RecordError, load_record

    found = []
    for path in sorted(runs_dir.rglob("run.json")):
        try:
            record = load_record(path)
        except RecordError:
            continue  # the table lists it; it has no numbers to digest
        typed = canonical(record.get("overrides") or [])
        for (experiment, budget, overrides, presets, extra), seeds in plan.items():
            if (
                record.get("experiment") == experiment
                and record.get("budget") == budget
                and record.get("precision") in presets
                and record.get("seed") in seeds
                and canonical([*overrides, *extra, PORTABLE]) <= typed
            ):
                found.append((path.parent, record))
                break
    return found


def run_digests(plan: dict[tuple, set[int]], runs_dir: Path) -> dict:
    """{"machines": {id: fingerprint}, "runs": [...]}: for every run of the plan, the overrides
    that re-run it, its result's digest (mpt_repro.machine.result_digest: status, final metrics,
    per-item file) and the machine it ran on."""
    import hashlib
    import json

    from mpt_repro.machine import result_digest

    machines, runs = {}, []
    for run_dir, record in planned_records(plan, runs_dir):
        fingerprint = record.get("machine")
        text = json.dumps(fingerprint, sort_keys=True)
        machine = hashlib.sha256(text.encode()).hexdigest()[:12]
        machines[machine] = fingerprint
        rerun = [o for o in record.get("overrides") or [] if o.split("=")[0] not in RERUN_LEFT_OUT]
        runs.append(
            {
                "run": run_dir.relative_to(runs_dir).as_posix(),
                "overrides": rerun,
                "wall_time_s": record.get("wall_time_s"),
                "machine": machine,
                **result_digest(run_dir, record),
            }
        )
    return {"machines": machines, "runs": runs}


def digest_section(digests: dict) -> str:
    """The page's last section: how the runs were made, and their digests as a JSON block (one
    run a line) that `make verify-claims` compares with runs made on the machine at hand."""
    import json

    from mpt_repro.machine import numerics_label

    labels = sorted({numerics_label(m) for m in digests["machines"].values()})
    runs = ",\n".join(json.dumps(r, sort_keys=True) for r in digests["runs"])
    machines = json.dumps(digests["machines"], sort_keys=True)
    return "\n".join(
        [
            "## Digests of the runs",
            "",
            f"The {len(digests['runs'])} runs above were made in portable mode "
            f"(`{PORTABLE}`; made on: {'; '.join(labels) or 'no run'}): the same seeds give the "
            "same bits on any x86-64 machine with AVX2 (docs/reliability.md). Each run's digest "
            "covers its status, every final metric and its per-item file (`eval_items.npz`). "
            "`make verify-claims` re-runs them on the machine at hand and compares "
            "(`ARGS='--sample 3'` for a quick check).",
            "",
            f"```{DIGESTS_FENCE}",
            f'{{"machines": {machines},',
            f'"runs": [\n{runs}\n]}}',
            "```",
            "",
        ]
    )


# -- seeds until decided, on two seed sets (issue 42) ---------------------------------------------
def options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: results/claims (--tiny: its tiny/)")
    parser.add_argument("--runs-dir", type=Path, help="default: OUT/runs")
    parser.add_argument("--docs", type=Path, help="also write the page (docs/claims.md)")
    parser.add_argument("--tiny", action="store_true", help="budget=smoke, one seed: structure")
    parser.add_argument("--dry-run", action="store_true", help="print the first sweeps only")
    parser.add_argument("--claims", help="only these claims (file names in the claims folder, a,b)")
    parser.add_argument("--claims-dir", type=Path, help="the claims folder (default conf/claims)")
    parser.add_argument("--seed-offset", type=int, default=0,
                        help="shift every seed by this (set B is 1000 further on)")  # fmt: skip
    parser.add_argument("--no-replicate", action="store_true", help="seed set A only")
    parser.add_argument("--judge-only", action="store_true",
                        help="run nothing: judge again from the runs folder (the same looks, "
                        "replayed), keeping the --docs page's sweeps section")  # fmt: skip
    args = parser.parse_args(argv)
    # a structure-only page and its smoke runs never land beside the real ones (make
    # reproduce-claims ARGS=--tiny wrote results/claims/claims.md, which read like the real page)
    real = ROOT / "results" / "claims"
    args.out = args.out or (real / "tiny" if args.tiny else real)
    return args


def checked_claims(args: argparse.Namespace) -> list[Claim] | str:
    """The claims asked for, every file checked; a string says why not (exit 2)."""
    if args.claims is not None and not args.claims.strip(","):
        return "--claims is empty: name claims (--claims a,b) or leave the option out for all"
    if args.seed_offset < 0:
        return f"--seed-offset must be >= 0 (got {args.seed_offset})"
    if args.tiny and args.docs and args.docs.resolve() == COMMITTED_PAGE.resolve():
        return (
            f"--tiny makes a structure-only page (budget=smoke, one seed a set): it never "
            f"replaces {_shown_path(COMMITTED_PAGE)}; leave out --tiny or --docs"
        )
    folder = args.claims_dir or ROOT / "conf" / "claims"
    if not folder.is_dir():
        return f"--claims-dir {folder}: no such folder"
    try:
        claims = load_claims(folder)
    except ClaimsError as err:
        return str(err)
    if not claims:
        return f"no claims file (*.yaml) in {folder}"
    if args.claims:
        wanted = {name for name in args.claims.split(",") if name}
        unknown = wanted - {c.name for c in claims}
        if unknown:
            return f"no claim {', '.join(sorted(unknown))} in {_shown_path(folder)}/"
        claims = [c for c in claims if c.name in wanted]
    return [tiny(c) for c in claims] if args.tiny else claims


def _shown_path(path: Path) -> str:
    path = path.resolve()
    return os.path.relpath(path, ROOT) if path.is_relative_to(ROOT) else str(path)


def dry_run(claims: list[Claim], args: argparse.Namespace, runs_dir: Path) -> int:
    """The first round's sweeps (both seed sets' first looks), printed, nothing run."""
    firsts = []
    for c in claims:
        if c.runs is not None:
            for shift in (0, *(() if args.no_replicate else (1000,))):
                firsts.append(with_seeds(c, first_seeds(c, args.seed_offset + shift)))
    run_sweeps(sweeps(firsts), runs_dir, dry_run=True)
    return 0


def page_header(judged: dict, total: float, argv: list[str], folder: Path, runs_dir: Path):
    """The page's first lines: when, where, which commits judged and trained, how it was made."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    trained_at = sorted({c for j in judged.values() for c in j.finding.commits})
    walls = load_runs(runs_dir)[0].get("wall_time_s", pd.Series(dtype=float))
    trained = float(pd.to_numeric(walls, errors="coerce").sum())
    # the claims files themselves (the README beside them documents the rules, it registers
    # nothing)
    log = ["git", "log", "-1", "--format=%h %cI", "--", f"{folder}/*.yaml"]
    registered = subprocess.run(log, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return [
        "Generated by `make reproduce-claims` (scripts/reproduce_claims.py); do not edit by hand.",
        "Each claim of the paper (Micikevicius et al. 2018, its rows in "
        "`mpt_repro/paper_reference.csv`) is tested as its file in `conf/claims/` states. The "
        "tests were pre-registered again for issue 42 (every test that could not fail replaced, "
        "tolerances derived, translation on training perplexity), committed on their own "
        f"before any of these runs (last change to the claims: {registered or 'uncommitted'}). "
        "A claim is reproduced only when all its tests are; each test compares runs that differ "
        "in what the claim is about, and says what result would have refuted it.",
        "",
        f"- made: {when}, judged on {machine_text()}",
        f"- judged at commit: {git_commit() or 'unknown'}; runs trained at: "
        f"{', '.join(trained_at) or 'none'} (their run.json)",
        f"- command: `{shlex.join(['scripts/reproduce_claims.py', *argv])}`",
        f"- training: {trained / 60:.1f} min, the sum of every run's own wall time in the runs "
        "folder (one thread a run)",
        f"- this invocation: {total / 60:.1f} min (runs already in the runs folder are reused, "
        "resume=true)",
        "- seeds until decided: each claim is judged at its looks (3, 5, 8 seeds unless its file "
        "says otherwise), every look's interval at 1 − α/K for K looks (Bonferroni alpha "
        "spending: a group-sequential design whose error rate stays at most α = 0.05 however "
        "the stopping depends on the data; Jennison & Turnbull 2000, ch. 7); the seeds stop on "
        "the runs' numbers alone (decided, or the last look), never on how long the runs took, "
        "so another machine stops at the same looks (conf/claims/README.md says what changed "
        "when)",
    ]


def trained_on(machines: dict) -> str:
    """The machines the runs ran on, from their run.json fingerprints: CPU model and the CPU
    capability torch used (portable mode pins it)."""
    shown = set()
    for m in machines.values():
        m = m or {}
        cpu = (m.get("cpu") or {}).get("model") or "unknown CPU"
        shown.add(f"{cpu}, torch CPU capability {m.get('torch_cpu_capability') or 'unknown'}, "
                  f"{m.get('threads') or '?'} thread(s) a run")  # fmt: skip
    return "; ".join(sorted(shown)) or "no run recorded its machine"


def sweep_lines(done: list[tuple]) -> list[str]:
    return [
        "| command | wall time (s) | exit |",
        "|---|---|---|",
        *(f"| `{c}` | {s:.0f} | {code} |" for c, s, code in done),
        "",
        "The sweeps' times include each process's start-up; a claim's seeds grow by rounds, "
        "and each round runs only what is missing.",
    ]


def earlier_sweeps(page: Path | None) -> tuple[str, list[str]]:
    """(how long the invocation that ran them took, the sweeps section's lines) of the page a
    --judge-only call replaces; ("not known", []) without one."""
    text = page.read_text() if page is not None and page.is_file() else ""
    took = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("- this invocation:")), "not known")  # fmt: skip
    section = text.split("## The sweeps\n", 1)[1] if "## The sweeps\n" in text else ""
    section = section.split("## Digests of the runs", 1)[0].strip("\n")
    return took, section.splitlines()


def judged_frame(judged: dict) -> pd.DataFrame:
    """claims.csv: set A's row of every claim (mpt_repro.claims.findings_frame) and set B's
    verdict beside it."""
    names = [name for name, s in judged if s == "A"]
    frame = findings_frame([judged[(n, "A")].finding for n in names])
    frame["Replication"] = [
        judged[(n, "B")].finding.verdict if (n, "B") in judged else "" for n in names
    ]
    frame["Agreement"] = [
        agreement(judged[(n, "A")].finding, judged.get((n, "B")) and judged[(n, "B")].finding)
        for n in names
    ]
    return frame


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = options(argv)
    claims = checked_claims(args)
    if isinstance(claims, str):
        print(f"reproduce-claims: {claims}", file=sys.stderr)
        return 2
    runs_dir = (args.runs_dir or args.out / "runs").resolve()
    if args.dry_run:
        return dry_run(claims, args, runs_dir)
    start, done = time.perf_counter(), []

    def run_round(pending: list[Claim]) -> None:
        if not args.judge_only:  # else: the looks replay on the runs already there
            done.extend(run_sweeps(sweeps(pending), runs_dir, dry_run=False))

    judged = decide_claims(claims, run_round, lambda: load_runs(runs_dir)[0], args.seed_offset,
                           not args.no_replicate)  # fmt: skip
    if done and all(code == 2 for _, _, code in done):
        print("reproduce-claims: no sweep could start (see the lines above)", file=sys.stderr)
        return 2
    write_pages(args, argv, judged, done, time.perf_counter() - start, runs_dir)
    return 0


def write_pages(args, argv, judged: dict[tuple[str, str], Judged], done, total, runs_dir) -> None:
    """claims.csv and claims.md under --out, and the committed page with --docs."""
    frame = judged_frame(judged)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "claims.csv", index=False)
    found = run_digests(sweeps([j.claim for j in judged.values()]), runs_dir)
    digests = digest_section(found)
    folder = args.claims_dir or ROOT / "conf" / "claims"
    header = page_header(judged, total, argv, folder, runs_dir)
    header.insert(header.index("") + 3, f"- runs trained on: {trained_on(found['machines'])}")
    lines = sweep_lines(done)
    if args.judge_only:
        before = earlier_sweeps(args.docs)
        header.append(f"- judged again (`--judge-only`) from the runs of the sweeps below, run "
                      f"before: {before[0]}")  # fmt: skip
        lines = before[1] or lines
    text = page_text(judged, header, lines, args.tiny) + "\n" + digests
    (args.out / "claims.md").write_text(text)
    if args.docs:
        args.docs.write_text(text)
    counts = frame["Verdict"].value_counts().to_dict()
    print(f"reproduce-claims: {len(frame)} claims, {counts}; {args.out / 'claims.md'}")


if __name__ == "__main__":
    sys.exit(main())
