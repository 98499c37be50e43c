"""Run every claim of conf/claims/ on this machine and write the table of verdicts.

    make reproduce-claims                          # all claims: results/claims/{runs,claims.md}
    .venv/bin/python scripts/reproduce_claims.py --docs docs/claims.md   # also the committed page
    .venv/bin/python scripts/reproduce_claims.py --tiny --out /tmp/c     # every claim at
                                                   # budget=smoke, one seed: the structure only
    .venv/bin/python scripts/reproduce_claims.py --dry-run               # the sweeps, not run

The claims' runs are gathered into as few sweeps as possible (one per experiment, budget,
overrides and telemetry), each a Hydra multirun of `mpt-run` with resume=true: a second call
finds the finished runs and runs only what is missing. Each run uses one thread
(OMP_NUM_THREADS=1, faster for these small models on a CPU than two). Then every claim is judged
(mpt_repro/claims.py) from the runs' records and the table is written as claims.md and
claims.csv under --out (and with --docs, as a page that also says when, where and how it was
made). Exit 0 when the table was written, even where a claim is not reproduced (a finding);
2 when a sweep could not start at all.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpt_repro.claims import CAPTION, Claim, findings, findings_frame, load_claims  # noqa: E402
from mpt_repro.record import git_commit  # noqa: E402
from mpt_repro.report.collect import load_runs  # noqa: E402
from mpt_repro.report.render import markdown  # noqa: E402
from mpt_repro.report.tables import Table  # noqa: E402

MPT_RUN = str(Path(sys.executable).with_name("mpt-run"))


def tiny(claim: Claim) -> Claim:
    """The claim at budget=smoke on seed 0 without its overrides: every step of the pipeline in
    seconds (no verdict can come of it)."""
    if claim.runs is None:
        return claim
    runs = replace(claim.runs, budget="smoke", seeds=(0,), overrides=(), telemetry_every=2)
    return replace(claim, runs=runs)


def sweeps(claims: list[Claim]) -> dict[tuple, set[int]]:
    """{(experiment, budget, overrides, presets, extra): seeds}: the claims' runs, each once."""
    out: dict[tuple, set[int]] = {}
    for c in claims:
        if c.runs is None:
            continue
        for presets, extra in c.runs.sweeps():
            key = (c.runs.experiment, c.runs.budget, c.runs.overrides, presets, extra)
            out.setdefault(key, set()).update(c.runs.seeds)
    return out


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


def page(table: Table, done: list[tuple], total: float, trained: float, argv: list[str]) -> str:
    """docs/claims.md: the table, and when, where and how it was made."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    import torch

    lines = [
        "# What this suite reproduces on a laptop",
        "",
        "Generated by `make reproduce-claims` (scripts/reproduce_claims.py); do not edit by hand.",
        "Each claim of the paper (Micikevicius et al. 2018, its rows in "
        "`mpt_repro/paper_reference.csv`) is tested as its file in `conf/claims/` states, "
        "before the runs; the verdicts are computed from the runs' records. A claim shown on a "
        "task built so that the mechanism appears is labelled so; a claim that does not "
        "reproduce is a finding, reported with its evidence.",
        "",
        f"- made: {when}, on {machine}, torch {torch.__version__}",
        f"- commit: {git_commit() or 'unknown'}",
        f"- command: `{shlex.join(['scripts/reproduce_claims.py', *argv])}`",
        f"- training: {trained / 60:.1f} min, the sum of every run's own wall time (each run "
        "with one thread)",
        f"- this invocation: {total / 60:.1f} min (runs already in the runs folder are reused, "
        "resume=true: their time is in the line above only); per sweep below",
        "",
        markdown(table),
        "## The sweeps",
        "",
        "| command | wall time (s) | exit |",
        "|---|---|---|",
        *(f"| `{c}` | {s:.0f} | {code} |" for c, s, code in done),
        "",
        "`Wall time (s)` in the table is the sum of the training runs' own wall times "
        "(`run.json` `wall_time_s`) that a claim rests on; runs shared by claims count in each. "
        "The sweeps' times include each process's start-up.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "claims")
    parser.add_argument("--runs-dir", type=Path, help="default: OUT/runs")
    parser.add_argument("--docs", type=Path, help="also write the page (docs/claims.md)")
    parser.add_argument("--tiny", action="store_true", help="budget=smoke, seed 0: structure")
    parser.add_argument("--dry-run", action="store_true", help="print the sweeps, run nothing")
    parser.add_argument("--claims", help="only these claims (file names in conf/claims/, a,b)")
    args = parser.parse_args(argv)
    claims = load_claims()
    if args.claims:
        wanted = set(args.claims.split(","))
        unknown = wanted - {c.name for c in claims}
        if unknown:
            print(f"reproduce-claims: no claim {', '.join(sorted(unknown))} in conf/claims/",
                  file=sys.stderr)  # fmt: skip
            return 2
        claims = [c for c in claims if c.name in wanted]
    if args.tiny:
        claims = [tiny(c) for c in claims]
    runs_dir = (args.runs_dir or args.out / "runs").resolve()
    start = time.perf_counter()
    done = run_sweeps(sweeps(claims), runs_dir, args.dry_run)
    if args.dry_run:
        return 0
    if done and all(code == 2 for _, _, code in done):
        print("reproduce-claims: no sweep could start (see the lines above)", file=sys.stderr)
        return 2
    runs, _ = load_runs(runs_dir)
    frame = findings_frame(findings(runs, claims))
    table = Table("claims", "The paper's claims, tested on this machine", CAPTION, frame)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "claims.csv", index=False)
    digests = digest_section(run_digests(sweeps(claims), runs_dir))
    (args.out / "claims.md").write_text(markdown(table) + "\n" + digests)
    total = time.perf_counter() - start
    if args.docs:
        walls = runs["wall_time_s"] if "wall_time_s" in runs else pd.Series(dtype=float)
        trained = float(pd.to_numeric(walls, errors="coerce").sum())
        args.docs.write_text(page(table, done, total, trained, argv) + digests)
    counts = frame["Verdict"].value_counts().to_dict()
    print(f"reproduce-claims: {len(frame)} claims, {counts}; {args.out / 'claims.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
