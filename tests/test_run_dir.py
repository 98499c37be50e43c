"""The run directory: one owner at a time, and a decision table that never deletes anything."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mpt_repro import rundir
from mpt_repro.checkpoint import save_checkpoint
from mpt_repro.errors import RunDirError
from mpt_repro.record import RunRecord
from mpt_repro.rundir import (
    LOCK_NAME,
    RunLock,
    inspect_run_dir,
    is_set_aside,
    lock_holder,
    plan_run,
    resume_command,
    set_aside,
)

ROOT = Path(__file__).resolve().parents[1]


# -- the lock ------------------------------------------------------------------------------------
def _holder(run_dir: Path) -> subprocess.Popen:
    """Another process that holds run_dir's lock until it is killed."""
    code = (
        "import sys, time; from mpt_repro.rundir import RunLock; "
        f"RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_owner_is_refused_with_the_holders_name(tmp_path: Path) -> None:
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RunDirError) as err:
            RunLock(tmp_path).acquire()
        message = str(err.value)
        assert f"pid {proc.pid} on {socket.gethostname()}" in message
        assert "started 20" in message and str(tmp_path) in message
        assert lock_holder(tmp_path)["pid"] == proc.pid  # what the reporter can ask
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_of_a_killed_process_is_taken_over_and_that_is_said(tmp_path, caplog) -> None:
    proc = _holder(tmp_path)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up: the lock file stays behind
    proc.wait()
    assert (tmp_path / LOCK_NAME).exists()
    assert lock_holder(tmp_path) is None  # the kernel released it with the process
    with caplog.at_level(logging.INFO, logger="mpt_repro"):
        with RunLock(tmp_path):
            assert lock_holder(tmp_path)["pid"] == os.getpid()
    assert f"pid {proc.pid}" in caplog.text and "has ended" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()  # released on exit, file and all


def test_the_lock_is_released_when_the_run_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the run failed"):
        with RunLock(tmp_path):
            raise RuntimeError("the run failed")
    assert lock_holder(tmp_path) is None and not (tmp_path / LOCK_NAME).exists()
    with RunLock(tmp_path):  # free again
        pass


def test_without_flock_a_pid_file_guards_the_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rundir, "fcntl", None)  # a file system without flock
    lock = tmp_path / LOCK_NAME

    def claim(pid: int, host: str) -> None:
        lock.write_text(json.dumps({"pid": pid, "host": host, "started_at": "then"}))

    claim(os.getpid() + 10**6, socket.gethostname())  # a dead process on this host: stale
    with RunLock(tmp_path):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(RunDirError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert not lock.exists()
    claim(1, "another-host")  # cannot be judged from here: refused, with the way out
    with pytest.raises(RunDirError, match=f"delete {lock}"):
        RunLock(tmp_path).acquire()


def test_a_lock_file_unlinked_between_open_and_flock_is_opened_again(tmp_path, monkeypatch):
    """The holder released (and unlinked the file) after our open: the flock we got is on a file
    nobody else will open, so the lock starts again on a new file."""
    real_stat, gone = os.stat, []

    def stat(path, *args, **kwargs):
        if Path(path).name == LOCK_NAME and not gone:
            gone.append(path)
            raise FileNotFoundError(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(rundir.os, "stat", stat)
    with RunLock(tmp_path):
        assert gone and json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


# -- the decision table --------------------------------------------------------------------------
def _run(tmp_path: Path, status: str | None, checkpoint: bool = False, **extra) -> Path:
    """A run directory as a real run leaves it (the real writer, a real checkpoint)."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "mpt-run.log").write_text("earlier attempts\n")
    if status is not None:
        record = RunRecord(d, {"experiment": "demo", "precision": "fp32"})
        record.write()
        if status != "running":
            record.finish(status, **extra)
        (d / "metrics.csv").write_text("step,split\n2,train\n")
        (d / "tb").mkdir()
    if checkpoint:
        save_checkpoint(d, {"step": 4})
    return d


def _plan(d: Path, resume: bool = False, overwrite: bool = False) -> rundir.Plan:
    return plan_run(inspect_run_dir(d), resume, overwrite)


def test_an_empty_directory_starts(tmp_path: Path) -> None:
    d = _run(tmp_path, None)
    plan = _plan(d)
    assert plan.action == "fresh" and plan.set_aside == [] and plan.notes == []
    resumed = _plan(d, resume=True)  # a sweep re-run with resume=true: its new jobs start
    assert resumed.action == "fresh"
    assert resumed.notes == [(logging.INFO, f"resume=true: no earlier run in {d}; starting it")]


@pytest.mark.parametrize("status", ["completed", "diverged"])
def test_a_finished_run_is_refused_unless_kept_or_overwritten(tmp_path, status) -> None:
    d = _run(tmp_path, status, checkpoint=True)
    with pytest.raises(RunDirError) as err:
        _plan(d)
    message = str(err.value)
    assert f"already holds a {status} run" in message and str(d / "run.json") in message
    assert "resume=true" in message and "overwrite=true" in message
    assert "previous-" in message and "not deleted" in message
    done = _plan(d, resume=True)
    assert done.action == "done" and done.previous["status"] == status
    again = _plan(d, overwrite=True)
    assert again.action == "fresh" and again.holds_work
    assert sorted(again.set_aside) == ["checkpoints", "metrics.csv", "run.json", "tb"]


@pytest.mark.parametrize("status", ["interrupted", "running", "failed"])
def test_an_unfinished_run_with_a_checkpoint_asks_resume_or_overwrite(tmp_path, status) -> None:
    d = _run(tmp_path, status, checkpoint=True)
    with pytest.raises(RunDirError, match="resume=true.*overwrite=true") as err:
        _plan(d)
    said = "was killed while running" if status == "running" else f"is {status}"
    assert f"holds an unfinished run (it {said}) with a checkpoint" in str(err.value)
    plan = _plan(d, resume=True)
    assert plan.action == "resume" and plan.set_aside == [] and plan.holds_work


def test_resume_without_a_checkpoint_is_refused_with_the_reason(tmp_path: Path) -> None:
    d = _run(tmp_path, "failed", reason="DataError: no train/ under /data")
    with pytest.raises(RunDirError) as err:
        _plan(d, resume=True)
    assert "no checkpoint to continue from" in str(err.value)
    assert "its run is failed (DataError: no train/ under /data)" in str(err.value)
    assert "without resume=true" in str(err.value)


def test_a_failed_run_without_checkpoint_is_moved_aside_for_a_fresh_start(tmp_path) -> None:
    d = _run(tmp_path, "failed", reason="RuntimeError: boom")
    plan = _plan(d)
    assert plan.action == "fresh" and not plan.holds_work
    assert sorted(plan.set_aside) == ["metrics.csv", "run.json", "tb"]
    # the plan says what it found; what is moved is said once it has been (run.py _claim), so a
    # run that then fails to start never logs a move that did not happen
    ((level, note),) = plan.notes
    assert level == logging.INFO and "earlier failed run" in note and "previous-" not in note


@pytest.mark.parametrize("content", [b'{"schema_version": 2, "stat', b"[]", b"\x00\x01"])
def test_an_unreadable_record_never_blocks_a_fresh_run(tmp_path, content) -> None:
    d = _run(tmp_path, "completed")
    (d / "run.json").write_bytes(content)
    plan = _plan(d)
    assert plan.action == "fresh" and "run.json" in plan.set_aside
    assert any("cannot be read" in note for _, note in plan.notes)


def test_an_unreadable_record_beside_a_checkpoint_resumes_on_request(tmp_path) -> None:
    d = _run(tmp_path, "interrupted", checkpoint=True)
    (d / "run.json").write_text('{"cut sh')
    with pytest.raises(RunDirError, match="unreadable run.json"):
        _plan(d)
    plan = _plan(d, resume=True)
    assert plan.action == "resume" and plan.set_aside == ["run.json"]


# -- moving aside --------------------------------------------------------------------------------
def test_set_aside_moves_only_this_runs_files(tmp_path: Path) -> None:
    d = _run(tmp_path, "completed", checkpoint=True)
    nested = d / "optim.lr=0.1"  # a sweep's other run, named by its overrides
    nested.mkdir()
    (nested / "run.json").write_text("{}")
    before = (d / "run.json").read_bytes()
    names = [p.name for p in inspect_run_dir(d).artefacts]
    assert "mpt-run.log" not in names and "optim.lr=0.1" not in names
    moved = set_aside(d, names)
    assert moved.parent == d and moved.name.startswith("previous-") and is_set_aside(moved)
    assert (moved / "run.json").read_bytes() == before  # kept byte for byte
    assert (moved / "checkpoints" / "last.pt").exists()
    assert {p.name for p in d.iterdir()} == {"mpt-run.log", moved.name, "optim.lr=0.1"}
    again = set_aside(d, ["mpt-run.log"])  # a second set-aside in the same second
    assert again != moved and again.name.startswith(moved.name)
    assert set_aside(d, ["nothing-here"]) is None


def test_resume_command_repeats_the_command_with_resume(monkeypatch) -> None:
    argv = ["mpt-run", "experiment=demo", "overwrite=true", "hydra.run.dir=/r", "resume=false"]
    monkeypatch.setattr(sys, "argv", argv)
    assert resume_command(Path("/r")) == "mpt-run experiment=demo hydra.run.dir=/r resume=true"


def test_lock_holder_is_none_for_a_directory_never_locked(tmp_path: Path) -> None:
    assert lock_holder(tmp_path) is None
    assert lock_holder(tmp_path / "not-there") is None
