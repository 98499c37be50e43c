"""`python3 -m mpt_repro.gpucheck`: probe, steps, summary.txt (run by scripts/gpu_check.sh)."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpt_repro.gpucheck import pack, plan, steps, summary

NO_GPU = "no CUDA device is visible: nothing was run (REHEARSAL=1 runs this plan on the CPU)"
PROBE_LIMIT_S = 120  # importing torch and starting CUDA, once
# seconds for the probe and the steps: their own limits and ~20 s for the probe (the wheels'
# install before and the summary after take seconds): 8 minutes in all on a GPU, 5 on the CPU
BUDGET_GPU, BUDGET_CPU = 470, 280


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m mpt_repro.gpucheck", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="the files to send back (at most 8)")
    p.add_argument("--work", type=Path, required=True, help="runs, bench, report and logs")
    p.add_argument("--rehearsal", action="store_true", help="the plan on the CPU, tiny sizes")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--budget", type=int, default=None, help="seconds for all the steps")
    p.add_argument("--batch", type=int, default=256, help="the bench's batch on a GPU")
    p.add_argument(
        "--steps", default=",".join(plan.STEPS), help="the steps to run, comma-separated"
    )
    p.add_argument("--note", action="append", default=[], help="a line for summary.txt")
    p.add_argument("--python", default=sys.executable, help="the Python the steps run with")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    unknown = set(args.steps.split(",")) - set(plan.STEPS)
    if unknown:
        print(f"gpu-check: unknown step(s) {sorted(unknown)}; known: {plan.STEPS}", file=sys.stderr)
        return 2
    settings = plan.Settings(
        python=args.python,
        work=args.work.resolve(),
        rehearsal=args.rehearsal,
        batch=args.batch,
        only=tuple(args.steps.split(",")),
    )
    budget = args.budget or (BUDGET_CPU if args.rehearsal else BUDGET_GPU)
    if args.dry_run:
        return dry_run(settings, budget)
    # a stop becomes an exception, so the summary still comes
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        return check(settings, args.out, budget, args.note)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopped(signum, frame):
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def dry_run(s: plan.Settings, budget: int) -> int:
    print(f"gpu-check plan ({'rehearsal, ' if s.rehearsal else ''}budget {budget} s):")
    print(f"+ {shlex.join([s.python, '-m', 'mpt_repro.gpucheck.probe'])}")
    for step in plan.plan(s, gpus=1):
        tail = f"   # skipped: {step.skip}" if step.skip else f"   # limit {step.limit_s} s"
        # the bench's own budget as a full budget would give it (at run time: from what is left)
        argv = [a.replace("{budget}", str(step.limit_s - steps.MARGIN_S)) for a in step.argv]
        print(f"+ {shlex.join(argv)}{tail}")
    return 0


def check(s: plan.Settings, out: Path, budget: int, notes: list[str]) -> int:
    """Probe, steps, then, however they ended, summary.txt and the files beside it."""
    began = time.monotonic()
    clock = steps.Clock(budget)
    logs = s.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    probe, outcomes, problem = {}, [], None
    try:
        probe = run_probe(s.python, logs / "probe.log")
        missing = summary.missing_line(probe)
        if missing:
            say(missing)
            problem = "the packages above do not import: nothing was run"
        elif not (s.rehearsal or probe.get("gpus")):
            problem = NO_GPU
            say(problem)
        else:
            outcomes = steps.run_steps(plan.plan(s, len(probe.get("gpus") or [])), clock, logs, say)
    except BaseException as e:  # a stop, or a fault of the check itself: still the summary
        problem = f"the check stopped early: {type(e).__name__}: {e}"
        say(problem)
    finally:
        text = write_summary(
            s, out, probe, outcomes, (time.monotonic() - began, budget), notes, problem
        )
        print(text, flush=True)
    failed = problem or any(o.status in ("failed", "timed out") for o in outcomes)
    return 2 if summary.missing_line(probe) or problem == NO_GPU else int(bool(failed))


def say(line: str) -> None:
    print(f"gpu-check: {line}", flush=True)


def run_probe(python: str, log: Path) -> dict:
    argv = [python, "-m", "mpt_repro.gpucheck.probe"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_LIMIT_S)
    log.write_text(f"+ {shlex.join(argv)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the probe failed (exit {done.returncode}): {last}")
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    gpus = probe.get("gpus") or []
    say(f"torch {probe.get('torch')}, CUDA {probe.get('cuda')}, GPUs: {gpus or 'none'}")
    return probe


def write_summary(s, out: Path, probe: dict, outcomes, clock, notes, problem) -> str:
    bench = summary.newest_bench(s.work)
    try:
        too_big = pack.pack(s.work, out, bench)
    except OSError as e:
        too_big = [f"(the archive failed: {e})"]
    lines = summary.header(probe, s.rehearsal, commit(), clock)
    lines += [f"note: {n}" for n in notes]
    lines += [x for x in (summary.missing_line(probe), problem) if x]
    lines += summary.steps_table(outcomes)
    lines += summary.bench_lines(bench)
    lines += summary.smoke_lines(s.work / "runs", _expected(s))
    lines += summary.files_lines(out)
    if too_big:
        lines.append(f"left out of the archive for size: {', '.join(too_big)}")
    lines.append(f"work folder (everything, checkpoints included): {s.work}")
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    return text


def _expected(s: plan.Settings) -> list[str]:
    try:
        folder, embedded = plan.experiments(s)
    except Exception:  # omegaconf missing: the summary says so already
        return []
    return folder + embedded


def commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + (" (+ local changes)" if dirty.stdout.strip() else "")
