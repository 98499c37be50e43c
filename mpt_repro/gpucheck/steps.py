"""Running the steps: each in a process group of its own, its output in logs/<step>.log, under
the smaller of its own limit and what the budget leaves once the later steps' limits are kept."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from mpt_repro.gpucheck.plan import Step

GRACE_S = 10  # after SIGTERM: an mpt-run saves its checkpoint and records `interrupted`
MARGIN_S = 10  # of a step's limit, left to the bench for writing its JSON (bench.budget_s)
MIN_STEP_S = 10  # a step offered less than this is not started


@dataclasses.dataclass
class Outcome:
    name: str
    status: str  # ok | failed | timed out | skipped
    seconds: float = 0.0
    limit_s: int = 0
    code: int | None = None
    note: str = ""  # why it was skipped, or its command line

    def describe(self) -> str:
        if self.status == "failed":
            return f"FAILED (exit {self.code})"
        if self.status == "timed out":
            return f"TIMED OUT at its {self.limit_s} s limit"
        if self.status == "skipped":
            return f"skipped: {self.note}"
        return "ok"


class Clock:
    """The budget of all steps, in seconds from the start."""

    def __init__(self, budget_s: int):
        self.budget_s, self.start = budget_s, time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def limit(self, step: Step, later: list[Step]) -> int:
        """Its own limit plus whatever earlier steps left, less the limits the later steps keep."""
        kept = sum(s.limit_s for s in later if s.skip is None)
        return int(self.budget_s - self.elapsed() - kept)


def run_steps(steps: list[Step], clock: Clock, logs: Path, say) -> list[Outcome]:
    outcomes = []
    for i, step in enumerate(steps):
        if step.skip is not None:
            outcomes.append(Outcome(step.name, "skipped", note=step.skip))
            say(f"{step.name}: skipped ({step.skip})")
            continue
        limit = clock.limit(step, steps[i + 1 :])
        if limit < MIN_STEP_S:
            note = f"the budget left {max(limit, 0)} s"
            outcomes.append(Outcome(step.name, "skipped", note=note))
            say(f"{step.name}: skipped ({note})")
            continue
        argv = [a.replace("{budget}", str(max(limit - MARGIN_S, 1))) for a in step.argv]
        say(f"{step.name}: started, limit {limit} s")
        outcome = run_one(step.name, argv, limit, logs / f"{step.name}.log")
        outcomes.append(outcome)
        say(f"{step.name}: {outcome.describe()} after {outcome.seconds:.0f} s")
    return outcomes


def run_one(name: str, argv: list[str], limit: int, log: Path) -> Outcome:
    """One step, in its own session (so the limit ends its workers too), output to `log`."""
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        out.write(f"+ {shlex.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:  # the limit includes the grace a stopped step gets
            code = proc.wait(timeout=max(limit - GRACE_S - 5, 1))
        except subprocess.TimeoutExpired:
            stop(proc)
            out.write(f"\ngpu-check: {name} stopped at its {limit} s limit\n")
            return Outcome(name, "timed out", time.monotonic() - started, limit, None)
        except BaseException:  # the check itself was stopped: take the step down with it
            stop(proc)
            raise
    status = "ok" if code == 0 else "failed"
    return Outcome(name, status, time.monotonic() - started, limit, code, shlex.join(argv))


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's process group, SIGKILL after GRACE_S."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass  # gone already, or SIGKILL next (which also ends what its leader left behind)
