"""The short diagnostic run mpt-advise starts itself: `mpt-advise experiment=... [overrides]`.

It is an ordinary `mpt-run` with telemetry on, a few hundred steps, in FP32 unless the command
names a precision (the paper's §3.2 collects the statistics in FP32), run as a child process on
the same terminal, so its progress bar and its messages are mpt-run's own. A finished diagnostic
run of the same command is reused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from mpt_repro.advise.defaults import SAMPLES
from mpt_repro.advise.evidence import AdviceError


def _given(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in overrides)


def diagnostic_overrides(overrides: list[str], steps: int, every: int | None) -> list[str]:
    """The user's overrides plus what a diagnostic run needs, where the user set none of it."""
    out = list(overrides)
    added = {
        "precision": "fp32",
        "telemetry": "diagnostic",
        "telemetry.every": str(every or max(1, steps // SAMPLES)),
        "trainer.max_steps": str(steps),
    }
    for key, value in added.items():
        if not _given(overrides, key):
            out.append(f"{key}={value}")
    return out


def planned_run_dir(overrides: list[str]) -> Path:
    """The directory mpt-run will give these overrides (composed as mpt-run composes them)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from mpt_repro.cmdline import with_plugin_configs
    from mpt_repro.config import CONF_DIR, register_configs
    from mpt_repro.preflight import composition_message

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(
            config_dir=str(CONF_DIR), version_base="1.3", job_name="mpt-run"
        ):
            try:
                cfg = compose(
                    "config", overrides=with_plugin_configs(overrides), return_hydra_config=True
                )
            except Exception as e:  # noqa: BLE001 - every composition error gets its one line
                raise AdviceError(composition_message(e).removeprefix("error: ")) from None
            return Path(str(OmegaConf.select(cfg, "hydra.run.dir")))
    finally:
        GlobalHydra.instance().clear()


def finished_with_telemetry(run_dir: Path) -> bool:
    from mpt_repro.safeio import read_text

    try:
        record = json.loads(read_text(run_dir / "run.json"))
    except (OSError, ValueError):  # a FIFO too: refused unopened
        return False
    if not isinstance(record, dict):
        return False
    tel = (record.get("diagnostics") or {}).get("telemetry") or {}
    # a diverged run is a result too: the advice says so, and what to change first
    return record.get("status") in ("completed", "diverged") and bool(tel.get("samples"))


def refusal(args: list[str]) -> str | None:
    """What mpt-run would refuse in these overrides (an unknown key, a bad value, a busy run
    directory), as one line, before anything starts."""
    from mpt_repro.config import check_command_line
    from mpt_repro.preflight import preflight

    problem = check_command_line(args) or preflight(args)
    return problem.removeprefix("error: ") if problem else None


@contextlib.contextmanager
def child_path(env: dict | None):
    """sys.path with the child's PYTHONPATH in front, for the checks made here on its behalf."""
    extra = [p for p in ((env or {}).get("PYTHONPATH") or "").split(os.pathsep) if p]
    saved = list(sys.path)
    sys.path[:0] = extra
    try:
        yield
    finally:
        sys.path[:] = saved


def run_diagnostic(
    overrides: list[str],
    steps: int,
    every: int | None,
    env: dict | None = None,
    capture: bool = False,
) -> Path:
    """Start (or reuse) the diagnostic run; its directory. `env`: the child's environment;
    `capture`: keep its output (else its log goes to stderr, beside its progress bar, so that
    stdout carries only the advice)."""
    args = diagnostic_overrides(overrides, steps, every)
    run_dir = planned_run_dir(args)
    if finished_with_telemetry(run_dir) and not _given(overrides, "overwrite"):
        print(f"mpt-advise: reusing the finished diagnostic run {run_dir} (overwrite=true trains "
              "it again)", file=sys.stderr)  # fmt: skip
        return run_dir
    with child_path(env):  # the checks find the modules the child will (model.target's)
        problem = refusal(args)
    if problem:
        raise AdviceError(problem)
    # where it lands: beside the run it repeats, in the folder its telemetry overrides name
    print(f"mpt-advise: diagnostic run into {run_dir}: mpt-run {shlex.join(args)}",
          file=sys.stderr)  # fmt: skip
    cmd = [sys.executable, "-m", "mpt_repro.cli", *args]
    if capture:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        code, said = done.returncode, f": {done.stderr.strip()[-1000:]}"
    else:
        code, said = subprocess.call(cmd, env=env, stdout=sys.stderr), " (its message is above)"
    if code != 0:
        raise AdviceError(f"the diagnostic run did not finish (mpt-run exit status {code}){said}")
    if not finished_with_telemetry(run_dir):
        raise AdviceError(_no_samples(run_dir))
    return run_dir


def _no_samples(run_dir: Path) -> str:
    """Why a diagnostic run that ended left no telemetry sample, and what to change first."""
    from mpt_repro.safeio import read_text

    try:
        record = json.loads(read_text(run_dir / "run.json"))
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or record.get("status") != "diverged":
        return f"the diagnostic run in {run_dir} ended without telemetry samples; see its run.json"
    lr = ((record.get("config") or {}).get("optim") or {}).get("lr")
    retry = (
        f"optim.lr={lr / 10:g}" if isinstance(lr, (int, float)) and lr > 0 else "a lower optim.lr"
    )
    return (
        f"the diagnostic run in {run_dir} diverged at step {record.get('diverged_at_step')} "
        f"({record.get('reason') or 'no reason recorded'}) before its first telemetry sample: "
        f"its gradients say nothing of a training that works; run mpt-advise again with {retry}"
    )
