"""Re-run the runs docs/claims.md rests on and check that they give the page's bits here.

    make verify-claims                                     # every run of docs/claims.md
    make verify-claims ARGS='--sample 3'                   # three of them, picked at random
    .venv/bin/python scripts/verify_claims.py results/claims/claims.md --sample 1

The page (written by scripts/reproduce_claims.py, in portable mode) ends with a JSON block of
digests: for each run, the overrides that re-run it, its status, final metrics and the digest of
its per-item file, and the fingerprint of the machine it ran on. Each chosen run is made again in
its own mpt-run (portable mode pins the process's kernels) under a fresh folder and compared:

- every run equal: "bit-identical to <page>", exit 0;
- a run that differs: its name, the first metric that differs (or the per-item file, or the
  status) with both values, and both machines' fingerprints; exit 1 after checking the others;
- a page without digests, or a bad option: one line, exit 2.

The re-runs go to a temporary folder, removed at the end, unless --runs-dir names one to keep.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpt_repro.machine import numerics_label, result_digest  # noqa: E402
from mpt_repro.record import RecordError, load_record  # noqa: E402

PROG = "verify-claims"
MPT_RUN = str(Path(sys.executable).with_name("mpt-run"))
FENCE = re.compile(r"^```json run-digests\n(.*?)^```", re.S | re.M)


class PageError(ValueError):
    """A page whose digests cannot be read: says what to do."""


def read_digests(page: Path) -> dict:
    """The page's {"machines": {...}, "runs": [...]} (scripts/reproduce_claims.py writes it)."""
    try:
        text = page.read_text(encoding="utf-8")
    except OSError as e:
        raise PageError(f"cannot read {page}: {e.strerror or e}") from None
    found = FENCE.search(text)
    if not found:
        raise PageError(
            f"{page} carries no run digests (made before portable mode): make it again with "
            "make reproduce-claims ARGS='--docs docs/claims.md', or name a page that has them"
        )
    try:
        digests = json.loads(found.group(1))
        runs, machines = digests["runs"], digests["machines"]
    except (ValueError, KeyError, TypeError) as e:
        raise PageError(f"{page}: its run digests are not readable JSON ({e})") from None
    if not isinstance(runs, list) or not isinstance(machines, dict):
        raise PageError(f"{page}: its run digests lack their 'runs' list or 'machines'")
    return digests


def chosen(runs: list[dict], sample: int | None, seed: int) -> list[dict]:
    """Every run, or `sample` of them picked at random (reproducibly, by `seed`)."""
    if sample is None or sample >= len(runs):
        return list(runs)
    return sorted(random.Random(seed).sample(runs, sample), key=lambda r: r["run"])


def rerun(entry: dict, folder: Path) -> tuple[Path | None, str]:
    """Make the run again under `folder` in its own mpt-run; (run directory, "") or (None,
    why it could not be made)."""
    args = [MPT_RUN, *entry["overrides"], "trainer.progress=false", f"paths.runs_dir={folder}"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    found = sorted(folder.rglob("run.json"))
    if not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"mpt-run exited {done.returncode} without a record: {last}"
    return found[0].parent, ""


def first_difference(expected: dict, got: dict) -> str | None:
    """The first thing that differs, as "what: <page's> on the page, <this one's> here", or
    None: the status, then each metric in the page's order, then the per-item file."""
    if expected.get("status") != got.get("status"):
        return f"status: {expected.get('status')} on the page, {got.get('status')} here"
    mine = got.get("metrics") or {}
    for name, value in (expected.get("metrics") or {}).items():
        if name not in mine or json.dumps(mine[name]) != json.dumps(value):
            return f"metric {name}: {value!r} on the page, {mine.get(name, 'absent')!r} here"
    extra = sorted(set(mine) - set(expected.get("metrics") or {}))
    if extra:
        return f"metric {extra[0]}: absent on the page, {mine[extra[0]]!r} here"
    if expected.get("items") != got.get("items"):
        return (
            f"per-item file (eval_items.npz): digest {str(expected.get('items'))[:16]} on the "
            f"page, {str(got.get('items'))[:16]} here"
        )
    return None


def fingerprint_text(machine: dict | None) -> str:
    """A fingerprint as one line: its label, then the whole of it as JSON."""
    return f"{numerics_label(machine) or 'not recorded'} {json.dumps(machine, sort_keys=True)}"


def check(entry: dict, machines: dict, folder: Path) -> str | None:
    """None when the run is bit-identical to the page's, else the lines that say how not."""
    run_dir, problem = rerun(entry, folder)
    if run_dir is None:
        return f"{entry['run']}: could not be made again: {problem}"
    try:
        record = load_record(run_dir / "run.json")
    except RecordError as e:
        return f"{entry['run']}: its record cannot be read: {e.problem}"
    got = result_digest(run_dir, record)
    if got["digest"] == entry.get("digest"):
        return None
    difference = first_difference(entry, got) or "the digest (its parts are equal: an old page?)"
    return "\n".join(
        [
            f"{entry['run']}: differs, {difference}",
            f"  the page's machine: {fingerprint_text(machines.get(entry.get('machine')))}",
            f"  this machine:       {fingerprint_text(record.get('machine'))}",
        ]
    )


def verify(page: Path, runs: list[dict], machines: dict, keep: Path | None) -> int:
    """Re-run `runs` and compare; the exit status (0 all identical, 1 one differs)."""
    folder = keep or Path(tempfile.mkdtemp(prefix="verify-claims-"))
    failures = []
    try:
        for number, entry in enumerate(runs, 1):
            start = time.perf_counter()
            found = check(entry, machines, folder / f"run{number}")
            status = "ok" if found is None else "DIFFERS"
            took = time.perf_counter() - start
            print(f"[{number}/{len(runs)}] {entry['run']}: {status} ({took:.0f} s)", flush=True)
            if found is not None:
                failures.append(found)
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)  # made by this command, for this command
    for found in failures:
        print(f"{PROG}: {found}", file=sys.stderr)
    if failures:
        print(f"{PROG}: {len(failures)} of {len(runs)} runs differ from {page}", file=sys.stderr)
        return 1
    print(f"{PROG}: {len(runs)} runs bit-identical to {page}")
    return 0


def _portable(machine: dict | None) -> bool:
    return isinstance(machine, dict) and bool((machine.get("portable") or {}).get("honoured"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("page", nargs="?", type=Path, default=ROOT / "docs" / "claims.md")
    parser.add_argument("--sample", type=int, help="check N runs picked at random, not all")
    parser.add_argument("--seed", type=int, default=0, help="which runs --sample picks")
    parser.add_argument("--runs-dir", type=Path, help="keep the re-runs here (default: removed)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.sample is not None and args.sample < 1:
        print(f"{PROG}: --sample {args.sample}: give a number of runs, 1 or more", file=sys.stderr)
        return 2
    if args.runs_dir is not None and args.runs_dir.exists() and any(args.runs_dir.iterdir()):
        print(
            f"{PROG}: --runs-dir {args.runs_dir} is not empty: name a new or empty folder (the "
            "runs in it would be compared, not made again)",
            file=sys.stderr,
        )
        return 2
    try:
        digests = read_digests(args.page)
    except PageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    unpinned = [m for m in digests["machines"].values() if not _portable(m)]
    if unpinned:
        print(
            f"{PROG}: note: some of the page's runs were not made in portable mode "
            f"({numerics_label(unpinned[0])}): another machine may differ from them",
            flush=True,
        )
    runs = chosen(digests["runs"], args.sample, args.seed)
    if not runs:
        print(f"{PROG}: {args.page} lists no runs to verify", file=sys.stderr)
        return 2
    seconds = sum(float(r.get("wall_time_s") or 0) for r in runs)
    print(
        f"{PROG}: {len(runs)} of {len(digests['runs'])} runs of {args.page}, about "
        f"{seconds / 60:.1f} min of training",
        flush=True,
    )
    return verify(args.page, runs, digests["machines"], args.runs_dir)


if __name__ == "__main__":
    sys.exit(main())
