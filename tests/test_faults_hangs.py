"""Issue 34, hangs and signals, through the real `mpt-run` and `mpt-report`: nothing waits forever.

A custom model's factory runs in the run's own process (tests/helpers_faults.py), so it can
break the data loader the way a buggy sampler or a stuck data source would. Each case checks the
exit status, the one `mpt-run:` line, the record, and how long the run took to end.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import MPT_RUN, ROOT, read_run
from test_faults import one_line_error

MPT_REPORT = str(Path(MPT_RUN).with_name("mpt-report"))
SMOKE = ("experiment=demo", "budget=smoke", "trainer.progress=false")


def custom(target: str, *extra: str) -> list[str]:
    return [MPT_RUN, *SMOKE, "model=custom", f"model.target=helpers_faults:{target}", *extra]


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore", **extra}


def start(args: list[str], **extra_env: str) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env(**extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(proc: subprocess.Popen, words: str, limit: float = 180) -> None:
    """Read the run's stdout until a line holds `words` (the helper prints it when it hangs)."""
    deadline = time.time() + limit
    for line in proc.stdout:
        if words in line:
            return
        assert time.time() < deadline, f"no {words!r} in time"
    raise AssertionError(f"the run ended before {words!r}: {proc.stderr.read()[-3000:]}")


def ended(proc: subprocess.Popen, limit: float) -> subprocess.CompletedProcess:
    try:
        _, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the run did not end within {limit} s of the signal") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)


def only_run(runs: Path) -> Path:
    (record,) = runs.rglob("run.json")
    return record.parent


def test_an_epoch_that_runs_dry_ends_the_run_with_one_line(tmp_path: Path) -> None:
    """The loader yields one batch fewer than steps_per_epoch: the loop used to ask for the same
    epoch forever (and SIGTERM could not stop it)."""
    args = custom(
        "short_epoch", "trainer.max_steps=null", "trainer.epochs=2", f"paths.runs_dir={tmp_path}"
    )
    proc = subprocess.run(args, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=240)
    line = one_line_error(proc)
    assert "the training data ran dry: epoch 0 of data.name=digits ended after its batch 7" in line
    assert "counted 8 per epoch" in line and "data.batch_size=8" in line
    rec = read_run(only_run(tmp_path))
    assert rec["status"] == "failed" and "ran dry" in rec["reason"]


def test_sigterm_ends_a_step_that_never_ends_within_the_stop_timeout(tmp_path: Path) -> None:
    """The loader hangs in the second step: SIGTERM cannot wait for the step's end; after
    MPT_STOP_TIMEOUT_S the run stops mid-step, `interrupted` at its last checkpoint."""
    args = custom("stuck_loader", "trainer.checkpoint_every=1", f"paths.runs_dir={tmp_path}")
    proc = start(args, MPT_STOP_TIMEOUT_S="2")
    try:
        wait_for(proc, "stuck in the loader")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        done = ended(proc, 60)
    finally:
        proc.kill()
    took = time.monotonic() - sent
    line = one_line_error(done, code=143)
    assert "stopped by SIGTERM at step 1 (it did not reach the end of its step within 2 s)" in line
    assert "Continue with: " in line and line.endswith("resume=true")
    assert took >= 2  # it waited for the step first
    rec = read_run(only_run(tmp_path))
    assert rec["status"] == "interrupted" and rec["steps"] == 1
    log = (only_run(tmp_path) / "mpt-run.log").read_text()
    assert "(within 2 s at most; a second signal stops at once)" in log
    assert not list(only_run(tmp_path).rglob("*.tmp"))


def test_a_second_ctrl_c_stops_a_stuck_step_at_once(tmp_path: Path) -> None:
    """Before its first checkpoint: the record says failed, and the line says to start afresh."""
    args = custom("stuck_loader", f"paths.runs_dir={tmp_path}")
    proc = start(args, MPT_STOP_TIMEOUT_S="600")
    try:
        wait_for(proc, "stuck in the loader")
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        done = ended(proc, 60)
    finally:
        proc.kill()
    line = one_line_error(done, code=130)
    assert "before the run saved a checkpoint" in line and "run the same command again" in line
    rec = read_run(only_run(tmp_path))
    assert rec["status"] == "failed"
    assert rec["reason"] == "stopped by SIGINT before a checkpoint was saved"
    assert rec["hint"] == "run the same command again to start it afresh"


@pytest.mark.slow
def test_sigterm_during_the_final_evaluation_interrupts_and_resume_evaluates_again(
    tmp_path: Path,
) -> None:
    """It used to log "then stopping" and finish as completed (exit 0): now what is logged is
    what happens. The final step's checkpoint is saved; resume=true runs the evaluation again."""
    marker = tmp_path / "evaluated-once"
    extra = (f"+model.kwargs.marker={marker}", f"paths.runs_dir={tmp_path / 'runs'}")
    proc = start(custom("slow_eval", *extra))
    try:
        wait_for(proc, "evaluating slowly")
        proc.send_signal(signal.SIGTERM)
        done = ended(proc, 60)
    finally:
        proc.kill()
    line = one_line_error(done, code=143)
    assert "stopped by SIGTERM at step 6 during the final evaluation" in line
    run_dir = only_run(tmp_path / "runs")
    rec = read_run(run_dir)
    assert rec["status"] == "interrupted" and rec["metrics"] is None
    assert (
        "SIGTERM during the final evaluation: stopping it now"
        in (run_dir / "mpt-run.log").read_text()
    )
    again = subprocess.run(
        [*custom("slow_eval", *extra), "resume=true"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    rec = read_run(run_dir)
    assert rec["status"] == "completed" and rec["steps"] == 6 and rec["metrics"]
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert sum(",eval," in row for row in rows) == 1


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_run_json_that_is_not_a_file_is_never_opened(tmp_path: Path, kind: str) -> None:
    """A FIFO kept mpt-run's start-up check and mpt-report waiting for a writer forever."""
    runs = tmp_path / "runs"
    run_dir = runs / "demo" / "fp32-smoke" / "seed0"
    run_dir.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(run_dir / "run.json")
        what = "a FIFO (named pipe)"
    else:
        (run_dir / "run.json").symlink_to("/dev/zero")
        what = "a character device"
    args = [MPT_RUN, *SMOKE, f"paths.runs_dir={runs}"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    line = one_line_error(proc)
    assert f"{run_dir / 'run.json'} is {what}, not a file mpt-run wrote" in line
    assert "mpt-run never opens it. Remove it" in line
    report = subprocess.run(
        [MPT_REPORT, str(runs), "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 2, report.stderr[-2000:]
    (line,) = [x for x in report.stderr.splitlines() if x.startswith("mpt-report:")]
    assert f"{run_dir / 'run.json'} is {what}, not a run record" in line
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    "kib,file",
    [(4, ".hydra/hydra.yaml"), (64, "checkpoints/last.pt")],
)
def test_a_file_past_ulimit_f_is_one_line_naming_it(tmp_path: Path, kib: int, file: str) -> None:
    """`ulimit -f`: "OSError: File too large", exit 1, used to name no file."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, resource.RLIM_INFINITY))

    args = [MPT_RUN, *SMOKE, f"paths.runs_dir={tmp_path}"]
    proc = subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=240, preexec_fn=limit
    )
    line = one_line_error(proc)
    run_dir = tmp_path / "demo" / "fp32-smoke" / "seed0"
    assert str(run_dir / file) in line
    assert (
        f"larger than the largest file this process may write (ulimit -f: {kib * 1024} bytes)"
        in line
    )
    assert "ulimit -f unlimited" in line
