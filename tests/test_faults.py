"""Fault injection through the real `mpt-run` (CPU, the demo at budget=smoke): every way a user, a
scheduler or the machine can break a run ends with one short message naming the file or key and
the next step, a non-zero exit status, no traceback on the console, and no result lost.

The battery and its results are described in docs/reliability.md. One finished run is shared by
the module (copied before a test changes it); the signal tests are slower and marked slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MPT_RUN, ROOT, read_run, run_cli

SMOKE = ("experiment=demo", "budget=smoke")


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file of a run directory but its log (which every attempt appends to), by content."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.suffix != ".log"
    }


def one_line_error(proc: subprocess.CompletedProcess, code: int | None = 2) -> str:
    """The console of a run that failed cleanly: the status (None: any failure), no traceback,
    one mpt-run line."""
    ok = proc.returncode == code if code is not None else proc.returncode not in (0, None)
    assert ok, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mpt-run:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def log_text(run_dir: Path) -> str:
    return (run_dir / "mpt-run.log").read_text()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed smoke run, started with resume=true in an empty directory that a killed run's
    lock file was left in (both must simply work)."""
    run_dir = tmp_path_factory.mktemp("faults") / "finished"
    run_dir.mkdir()
    dead = {"pid": 2**22 + 12345, "host": "this", "started_at": "yesterday", "command": "x"}
    (run_dir / ".lock").write_text(json.dumps(dead))
    run_cli(*SMOKE, "resume=true", run_dir=run_dir)
    return run_dir


@pytest.fixture
def copy_of(finished, tmp_path) -> Path:
    """A copy of the finished run, for a test that changes it."""
    target = tmp_path / "run"
    shutil.copytree(finished, target)
    return target


def rewrite_record(run_dir: Path, **fields) -> None:
    """The finished record as another ending would have left it (same writer, other fields)."""
    record = read_run(run_dir)
    record.update(fields)
    (run_dir / "run.json").write_text(json.dumps(record, indent=2))


# -- a finished run is never lost ----------------------------------------------------------------
def test_the_first_run_takes_over_a_stale_lock_and_says_it_found_nothing(finished) -> None:
    rec = read_run(finished)
    assert rec["status"] == "completed" and rec["schema_version"] == 5
    assert rec["pid"] != 2**22 + 12345 and rec["host"]
    log = log_text(finished)
    assert f"taking over the lock left by pid {2**22 + 12345}" in log
    assert "resume=true: no earlier run" in log
    assert not (finished / ".lock").exists()  # released at the end of the run
    assert (finished / "run.json").stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert (finished / ".hydra" / "config.yaml").exists()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    "extra,words",
    [
        ((), ["already holds a completed run", "resume=true", "overwrite=true"]),
        # the case: a mistyped data.root used to delete the finished run before the data
        # was even opened; it is now refused before torch loads (issue 48)
        (
            ("data=imagenet", "data.root=/no/such/imagenet"),
            ["data.root=/no/such/imagenet does not exist", "data=synthetic"],
        ),
        # other data (in a folder that exists) in a folder that holds a run: another folder
        # (issue 34)
        (
            ("data=imagenet", f"data.root={ROOT / 'docs'}"),
            ["holds a run with data.name='digits', not 'imagenet'", "paths.runs_dir=DIR"],
        ),
        (("optim.lr=-1",), ["optim.lr must be > 0"]),
        (("model.hidden_size=999",), ["model.hidden_size", "digits_cnn"]),
        (("+optim.lrr=0.1",), ["unknown key 'optim.lrr'", "did you mean optim.lr?"]),
    ],
)
def test_a_command_that_cannot_run_leaves_the_finished_run_untouched(finished, extra, words):
    before = snapshot(finished)
    line = one_line_error(run_cli(*SMOKE, *extra, run_dir=finished, check=False))
    for word in words:
        assert word in line, line
    if "already holds" in line:
        assert str(finished / "run.json") in line
    assert snapshot(finished) == before  # .hydra/ included: Hydra no longer writes it first


def test_overwrite_with_data_that_cannot_be_opened_keeps_the_finished_run(copy_of, tmp_path):
    before = snapshot(copy_of)
    stray = tmp_path / "not-imagenet"  # a folder, not empty (a missing one is refused earlier)
    stray.mkdir()
    (stray / "notes.txt").write_text("no train/ here")
    proc = run_cli(
        *SMOKE,
        "overwrite=true",
        "data=imagenet",
        f"data.root={stray}",
        run_dir=copy_of,
        check=False,
    )
    assert "train/" in one_line_error(proc)  # the data error, naming the expected layout
    assert snapshot(copy_of) == before
    assert not list(copy_of.glob("previous-*"))


@pytest.mark.slow
def test_overwrite_moves_the_finished_run_aside(copy_of) -> None:
    old = (copy_of / "run.json").read_bytes()
    proc = run_cli(*SMOKE, "overwrite=true", run_dir=copy_of)
    (kept,) = copy_of.glob("previous-*")
    assert (kept / "run.json").read_bytes() == old
    assert (kept / "checkpoints" / "last.pt").exists() and (kept / ".hydra").is_dir()
    rec = read_run(copy_of)
    assert rec["status"] == "completed" and rec["started_at"] >= json.loads(old)["started_at"]
    assert str(kept) in proc.stdout + proc.stderr + log_text(copy_of)


@pytest.mark.slow
def test_an_unreadable_record_is_moved_aside_and_the_run_starts(copy_of) -> None:
    cut = (copy_of / "run.json").read_bytes()[:300]
    (copy_of / "run.json").write_bytes(cut)
    shutil.rmtree(copy_of / "checkpoints")
    run_cli(*SMOKE, run_dir=copy_of)
    (kept,) = copy_of.glob("previous-*")
    assert (kept / "run.json").read_bytes() == cut
    assert read_run(copy_of)["status"] == "completed"
    assert "cannot be read (not valid JSON" in log_text(copy_of)


@pytest.mark.slow
def test_an_unreadable_record_beside_a_checkpoint_offers_resume(copy_of) -> None:
    (copy_of / "run.json").write_text('["not", "a", "record"]')
    line = one_line_error(run_cli(*SMOKE, run_dir=copy_of, check=False))
    assert "unreadable run.json" in line and "resume=true" in line and "overwrite=true" in line
    run_cli(*SMOKE, "resume=true", run_dir=copy_of)
    rec = read_run(copy_of)
    assert rec["status"] == "completed" and rec["resumed"] is True


def test_resume_without_a_checkpoint_says_so(copy_of) -> None:
    rewrite_record(copy_of, status="failed", reason="RuntimeError: out of memory", metrics=None)
    shutil.rmtree(copy_of / "checkpoints")
    before = snapshot(copy_of)
    line = one_line_error(run_cli(*SMOKE, "resume=true", run_dir=copy_of, check=False))
    assert "no checkpoint to continue from" in line and "RuntimeError: out of memory" in line
    assert snapshot(copy_of) == before


def _holder(run_dir: Path) -> subprocess.Popen:
    code = (
        "import time; from mpt_repro.rundir import RunLock; "
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


def test_a_directory_in_use_is_refused_with_its_holder(copy_of) -> None:
    rewrite_record(copy_of, status="running", finished_at=None)
    holder = _holder(copy_of)
    try:
        before = snapshot(copy_of)
        line = one_line_error(run_cli(*SMOKE, "resume=true", run_dir=copy_of, check=False))
        assert f"is in use by another run: pid {holder.pid} on " in line and "started " in line
        assert snapshot(copy_of) == before
    finally:
        holder.kill()
        holder.wait()


# -- checkpoints ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_corrupt_last_checkpoint_resumes_from_the_one_before(copy_of) -> None:
    ckpt = copy_of / "checkpoints"
    shutil.copy(ckpt / "last.pt", ckpt / "previous.pt")
    (ckpt / "last.pt").write_bytes((ckpt / "last.pt").read_bytes()[:1000])  # cut short
    rewrite_record(copy_of, status="interrupted", reason="stopped by SIGTERM", metrics=None)
    run_cli(*SMOKE, "resume=true", run_dir=copy_of)
    assert read_run(copy_of)["status"] == "completed"
    log = log_text(copy_of)
    assert f"checkpoint {ckpt / 'last.pt'} cannot be read" in log
    assert f"resuming from the one before it, {ckpt / 'previous.pt'}" in log


@pytest.mark.slow
def test_no_readable_checkpoint_is_one_message_with_the_way_out(copy_of) -> None:
    (copy_of / "checkpoints" / "last.pt").write_bytes(b"\x80\x04 not a checkpoint")
    rewrite_record(copy_of, status="interrupted", reason="stopped by SIGTERM", metrics=None)
    line = one_line_error(run_cli(*SMOKE, "resume=true", run_dir=copy_of, check=False))
    assert str(copy_of / "checkpoints" / "last.pt") in line and "overwrite=true" in line
    rec = read_run(copy_of)
    assert rec["status"] == "failed" and "CheckpointError" in rec["reason"]


def test_a_completed_run_without_its_metrics_csv_says_which_files_are_missing(
    copy_of, tmp_path, capsys
) -> None:
    """resume=true said only "nothing to do" and the report was silent (issue 34)."""
    from mpt_repro.report import cli as report

    (copy_of / "metrics.csv").unlink()
    before = read_run(copy_of)
    proc = run_cli(*SMOKE, "resume=true", run_dir=copy_of)
    assert (
        f"{copy_of}: the record's files are incomplete: metrics.csv missing (its result stands "
        "in run.json; overwrite=true trains it again to have them)"
    ) in proc.stdout + proc.stderr
    assert read_run(copy_of) == before
    out = tmp_path / "report"
    assert report.main([str(copy_of), "--out", str(out), "--no-plots"]) == 0
    text = (out / "report.md").read_text()
    assert "its record's files are incomplete: metrics.csv missing" in text


class _Planted:
    """What a crafted checkpoint holds: a full unpickle calls os.system (issue 34)."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_a_crafted_checkpoint_runs_no_code_on_resume(copy_of, tmp_path) -> None:
    import torch

    last = copy_of / "checkpoints" / "last.pt"
    planted = tmp_path / "planted"
    state = torch.load(last, weights_only=True)  # the run's own checkpoint reads safely
    torch.save({**state, "extra": _Planted(planted)}, last)
    rewrite_record(copy_of, status="interrupted", reason="stopped by SIGTERM", metrics=None)
    line = one_line_error(run_cli(*SMOKE, "resume=true", run_dir=copy_of, check=False))
    assert f"{last}: refused: it names posix.system, which a checkpoint of mpt-run" in line
    assert "nothing in it ran" in line and "overwrite=true" in line
    assert not planted.exists()
    rec = read_run(copy_of)
    assert rec["status"] == "failed" and "CheckpointError" in rec["reason"]


# -- the machine: read-only folders, a full disk -------------------------------------------------
def _in_mount(
    mount: Path, options: str, *args: str, after: str = ""
) -> subprocess.CompletedProcess:
    """mpt-run with a fresh tmpfs at `mount` (in a user namespace: no root needed); `after` is a
    shell command run in the namespace once mpt-run has ended (to copy files out)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    command = shlex.join([MPT_RUN, *args, "trainer.progress=false"])
    script = (
        f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(mount))} || exit 99; "
        f"{command}; code=$?; {after or 'true'}; exit $code"
    )
    mount.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if proc.returncode == 99 or "unshare:" in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()[:200]}")
    return proc


def test_a_read_only_results_folder_is_one_message(tmp_path: Path) -> None:
    proc = _in_mount(tmp_path / "ro", "size=1m,ro", *SMOKE, f"paths.runs_dir={tmp_path}/ro/runs")
    line = one_line_error(proc)
    assert "Read-only file system" in line and "paths.runs_dir=DIR" in line


@pytest.mark.slow
def test_a_full_disk_is_one_message_and_a_failed_record(tmp_path: Path) -> None:
    # 128 KiB: room for the record, the log and .hydra/, not for the 250 KB checkpoint
    run_dir = tmp_path / "full" / "run"
    out = tmp_path / "run.json"
    proc = _in_mount(
        tmp_path / "full",
        "size=128k",
        *SMOKE,
        f"hydra.run.dir={run_dir}",
        after=f"cp {shlex.quote(str(run_dir / 'run.json'))} {shlex.quote(str(out))}",
    )
    line = one_line_error(proc)
    assert str(run_dir / "checkpoints" / "last.pt") in line and "free space" in line.lower()
    rec = json.loads(out.read_text())
    assert rec["status"] == "failed" and "could not write the checkpoint" in rec["reason"]


# -- data faults ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_corrupt_image_read_by_a_loader_worker_is_named(tmp_path: Path) -> None:
    from PIL import Image

    for cls in ("a", "b"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for i in range(60):
            Image.new("RGB", (8, 8), (i, 2 * i, 3 * i)).save(tmp_path / "images" / cls / f"{i}.png")
    for i in range(12):  # the held-out image 0 among them: evaluation reads it for certain
        (tmp_path / "images" / "a" / f"{i}.png").write_bytes(b"not a png")
    proc = run_cli(
        *SMOKE,
        "data=celeba",
        f"data.root={tmp_path / 'images'}",
        "data.image_size=8",
        "data.num_workers=1",
        run_dir=tmp_path / "run",
        check=False,
    )
    line = one_line_error(proc, code=None)
    assert str(tmp_path / "images" / "a") in line  # the file, not "worker process 0"
    rec = read_run(tmp_path / "run")
    assert rec["status"] == "failed" and str(tmp_path / "images" / "a") in rec["reason"]
    # bad input, not a bug: the reason is the message (the way to the worker's traceback in it)
    assert "data.num_workers=0" in rec["reason"] and rec["hint"]


@pytest.mark.slow
def test_a_corpus_that_is_not_utf8_is_one_message(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "the cat and the dog run fast and slow".split()
    for name in ("train", "valid", "test"):
        text = "\n".join(" ".join(words[(i + j) % 9] for j in range(12)) for i in range(300))
        (corpus / f"{name}.txt").write_text(text + "\n")
    with open(corpus / "train.txt", "ab") as f:
        f.write(b"caf\xe9 au lait\n")  # Latin-1, not UTF-8
    proc = run_cli(
        "experiment=lstm_lm",
        "budget=smoke",
        f"data.root={corpus}",
        run_dir=tmp_path / "run",
        check=False,
    )
    line = one_line_error(proc, code=None)
    assert "train.txt" in line or "utf-8" in line.lower()
    # found while the data is built, before the run owns a directory: nothing is left behind
    assert not (tmp_path / "run").exists()


# -- how a run ends ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_nan_final_evaluation_is_not_reported_as_a_plain_success(tmp_path: Path) -> None:
    proc = run_cli(
        *SMOKE, "optim.lr=1e30", "trainer.diverge_patience=100", run_dir=tmp_path, check=True
    )
    console = proc.stdout + proc.stderr
    rec = read_run(tmp_path)
    # the loss is still non-finite at the last step, with fewer steps left than the patience
    assert rec["status"] == "diverged" and rec["metrics"] is None
    assert "at the end of the run" in rec["reason"]
    lines = console.splitlines()
    [at] = [i for i, line in enumerate(lines) if "demo / fp32 / smoke / seed 0: diverged" in line]
    assert "[WARNING]" in lines[at - 1], console[-2000:]  # the closing block is a warning


def test_a_refused_value_refuses_the_sweep_before_it_starts(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            MPT_RUN,
            "-m",
            *SMOKE,
            "optim.lr=-1,0.05",
            "trainer.progress=false",
            f"paths.runs_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # a value refused for any job refuses the sweep before it starts: nothing runs, nothing is
    # created, one line names the key (a job that fails while running ends only itself)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "optim.lr must be > 0" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


def test_a_sweep_that_finds_a_finished_run_ends_with_the_command_that_runs_the_rest(
    finished, tmp_path: Path
) -> None:
    """The finished job says so, the sweep's last line names it and gives the one command that
    keeps the finished runs and runs the rest (resume=true for the whole sweep); nothing of the
    finished run changes."""
    runs = tmp_path / "runs"
    shutil.copytree(finished, runs / "demo" / "fp32-smoke" / "seed0")
    before = snapshot(runs / "demo")  # beside it, Hydra writes the sweep's multirun.yaml
    argv = ["-m", *SMOKE, "precision=fp32", "trainer.progress=false", f"paths.runs_dir={runs}"]
    proc = subprocess.run(
        [MPT_RUN, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mpt-run: error: 1 of the sweep's 1 jobs did not complete"), last
    assert last.endswith(f"run the rest: {shlex.join(['mpt-run', *argv, 'resume=true'])}"), last
    assert "already holds a completed run" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(runs / "demo") == before


def test_a_sweep_whose_every_job_is_refused_at_build_leaves_nothing(tmp_path: Path) -> None:
    """A data folder without the data set's layout (here a stray file, no class folders) is
    found only when each job builds its data: every job says so, the last line counts them, and
    the runs folder this command created is gone again, Hydra's multirun.yaml included."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no class folders")  # empty: refused earlier
    runs = tmp_path / "runs" / "sweep"
    proc = subprocess.run(
        [MPT_RUN, "-m", *SMOKE, "precision=fp32,mixed", "data=imagefolder",
         f"data.root={tmp_path / 'empty'}", f"paths.runs_dir={runs}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("mpt-run: error: 2 of the sweep's 2 jobs did not complete"), last
    assert last.endswith("each said why above") and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


@pytest.mark.slow
def test_a_job_refused_while_it_builds_does_not_stop_the_sweep(tmp_path: Path) -> None:
    """A factory that does not import is found only when the job builds its model: that job
    ends with its line (and leaves no folder), the next one runs, the sweep exits 2."""
    proc = subprocess.run(
        [
            MPT_RUN,
            "-m",
            *SMOKE,
            "model=custom",
            "model.target=helpers_custom_model:missing,helpers_custom_model:tiny_classifier",
            "+model.kwargs.in_channels=1",
            "trainer.progress=false",
            f"paths.runs_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "module 'helpers_custom_model' has no 'missing'" in proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # ours, not Hydra's list of overrides
    assert last.startswith("mpt-run: error: 1 of the sweep's 2 jobs did not complete"), last
    assert "model.target=helpers_custom_model:missing" in last
    made = sorted(p.name for p in tmp_path.iterdir() if p.name != "multirun.yaml")  # Hydra's
    assert made == ["demo-helpers_custom_model:tiny_classifier"]
    [record] = tmp_path.rglob("run.json")
    assert read_run(record.parent)["status"] == "completed"


# -- signals -------------------------------------------------------------------------------------
# Long enough (20 epochs of 16 steps) that the run is still training when the test acts on it.
LONG = (
    "experiment=demo",
    "budget=paper",
    "data.train_limit=512",
    "data.batch_size=32",
    "trainer.checkpoint_every=4",
    "trainer.log_every=4",
    "trainer.eval_every=100",
)


def _start(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [MPT_RUN, *LONG, "trainer.progress=false", f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path) -> None:
    deadline = time.time() + 180
    while not (run_dir / "checkpoints" / "last.pt").exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


def _stop(run_dir: Path, proc: subprocess.Popen, signum: int) -> str:
    """Send the signal; check the ending; return the command the message says resumes it."""
    proc.send_signal(signum)
    stderr = proc.stderr.read()
    code = proc.wait(timeout=120)
    line = one_line_error(subprocess.CompletedProcess([], code, "", stderr), code=128 + signum)
    assert f"stopped by {signal.Signals(signum).name}" in line
    rec = read_run(run_dir)
    assert rec["status"] == "interrupted" and "resume=true" in rec["hint"]
    return line.split("Continue with: ", 1)[1]


def test_a_second_run_of_a_busy_directory_is_refused_and_sigterm_interrupts(tmp_path) -> None:
    """The issue's case: two identical runs at once. The second is refused at once (it used to
    delete the first one's files and kill it); the first goes on, then stops on SIGTERM."""
    first = _start(tmp_path)
    try:
        _wait_for_checkpoint(first, tmp_path)
        second = run_cli(*LONG, run_dir=tmp_path, check=False)
        line = one_line_error(second)
        assert f"in use by another run: pid {first.pid}" in line
        assert first.poll() is None  # undisturbed
        command = _stop(tmp_path, first, signal.SIGTERM)
        assert command.endswith("resume=true") and f"hydra.run.dir={tmp_path}" in command
    finally:
        if first.poll() is None:
            first.kill()


@pytest.mark.slow
def test_ctrl_c_interrupts_and_the_printed_command_resumes(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        _wait_for_checkpoint(proc, tmp_path)
        command = _stop(tmp_path, proc, signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
    resumed = subprocess.run(
        [MPT_RUN, *shlex.split(command)[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rec = read_run(tmp_path)
    assert rec["status"] == "completed" and rec["resumed"] is True and rec["steps"] == 320


# -- issue 23: every bad value refused before any work, nothing left behind ---------------------
BAD_VALUES = [
    ("optim.lrr=0.1", "unknown key 'optim.lrr'"),
    ("optim.lr=inf", "optim.lr=inf is not a finite number"),
    ("optim.lr=1e400", "reads as inf"),  # Python reads it as inf: the message says why
    ("optimm.lr=0.1", "there is no top-level section 'optimm' (did you mean optim.lr?)"),
    ("optim.momentum=5", "optim.momentum must be in [0, 1)"),
    ("model.dropout=1.5", "model.dropout must be in [0, 1)"),
    ("paths.runs_dir=", "paths.runs_dir must name a results folder"),
    ("paths.runs_dir=/", "paths.runs_dir must name a results folder"),
    ("+model.kwargs.foo=1", "model.kwargs.foo would change nothing in this run"),
    ("data.batch_size=abc", "data.batch_size needs an integer, got 'abc'"),
    ("seed=abc", "seed needs an integer, got 'abc'"),
    ("optim.lr=", "optim.lr needs a number, got an empty value"),
    ("precision.hysteresis=1.5", "precision.hysteresis needs an integer"),
]


@pytest.mark.parametrize("override,words", BAD_VALUES)
def test_a_bad_value_is_one_line_and_creates_nothing(tmp_path: Path, override, words) -> None:
    runs = tmp_path / "runs"
    args = [*SMOKE, f"paths.runs_dir={runs}", override, "precision=mixed"]
    proc = subprocess.run(
        [MPT_RUN, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    line = one_line_error(proc)
    assert words in line, line
    assert not runs.exists() and not any(tmp_path.iterdir())  # no folder, no log, no record


def test_refusals_happen_before_torch_is_imported(copy_of: Path) -> None:
    """A value refusal and a finished-run refusal (the slow ones were 8.8 s and 14.5 s because
    torch was imported first): the process never loads torch."""
    probe = (
        "import sys\n"
        "from mpt_repro import cli\n"
        "sys.argv = ['mpt-run', *sys.argv[1:]]\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    misspelt_module = ["model=custom", "model.target=no_such_package.nets:make_net"]
    for extra in (["optim.lr=-1"], [f"hydra.run.dir={copy_of}"], misspelt_module):
        proc = subprocess.run(
            [sys.executable, "-c", probe, *SMOKE, *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.stdout.strip() == "exit 2 False", proc.stdout + proc.stderr[-2000:]


def test_a_folder_that_cannot_be_written_is_refused_naming_it(tmp_path: Path) -> None:
    # /proc is a file system nobody may create files in, root included
    proc = run_cli(*SMOKE, "paths.runs_dir=/proc/mpt-results", check=False)
    line = one_line_error(proc)
    assert "cannot write /proc/mpt-results" in line and "paths.runs_dir=DIR" in line


@pytest.mark.slow
def test_a_bad_data_root_changes_nothing_and_says_nothing_was_moved(finished, tmp_path) -> None:
    """overwrite=true over a finished run with a mistyped data folder: the run stays as it was,
    no previous-<time>/ appears, and no log line claims its files were moved."""
    target = tmp_path / "run"
    shutil.copytree(finished, target)
    before = snapshot(target)
    proc = run_cli(
        *SMOKE, "data=imagefolder", "data.root=/no/such/folder", "overwrite=true",
        run_dir=target, check=False,
    )  # fmt: skip
    line = one_line_error(proc)
    assert "/no/such/folder" in line
    assert snapshot(target) == before and not list(target.glob("previous-*"))
    assert "moved" not in proc.stdout + proc.stderr
    # a new directory with the same mistake is not even created
    fresh = tmp_path / "fresh"
    proc = run_cli(
        *SMOKE, "data=imagefolder", "data.root=/no/such/folder", run_dir=fresh, check=False
    )
    one_line_error(proc)
    assert not fresh.exists()


def test_metrics_csv_deleted_is_rebuilt_from_the_checkpoint(finished, tmp_path) -> None:
    """A completed run with a garbled run.json resumes at its last step: its metrics.csv (here
    deleted) comes back from the checkpoint, with one final evaluation row, as before."""
    from conftest import compose

    from mpt_repro.run import run

    target = tmp_path / "run"
    shutil.copytree(finished, target)
    original = (target / "metrics.csv").read_text()
    (target / "run.json").write_text('{"cut sh')
    (target / "metrics.csv").unlink()
    run(compose([*SMOKE, "resume=true", "trainer.progress=false", "trainer.device=cpu"]), target)
    rebuilt = (target / "metrics.csv").read_text()
    assert rebuilt == original
    assert sum(",eval," in line for line in rebuilt.splitlines()) == 1
    assert read_run(target)["status"] == "completed"


def test_divergence_patience_counts_exactly(tmp_path: Path) -> None:
    """Patience 2, rows every 10 steps: the run stops at the second non-finite step, not at the
    next log row."""
    from conftest import compose

    from mpt_repro.run import run

    cfg = compose(
        [*SMOKE, "precision=no_scaling", "optim.lr=1e12", "trainer.diverge_patience=2",
         "trainer.log_every=10", "trainer.progress=false", "trainer.device=cpu"]
    )  # fmt: skip
    record = run(cfg, tmp_path)
    assert record["status"] == "diverged" and record["metrics"] is None
    start = record["diverged_at_step"]
    assert record["steps"] == start + 1  # steps start and start + 1: two non-finite losses
    assert "for 2 consecutive steps" in record["reason"]


def test_a_stopped_sweep_is_resumed_by_one_command(monkeypatch) -> None:
    from mpt_repro.rundir import resume_command

    argv = ["mpt-run", "-m", *SMOKE, "precision=fp32,amp", "seed=0,1", "overwrite=true"]
    monkeypatch.setattr(sys, "argv", argv)
    assert resume_command(Path("/r/demo/amp-smoke/seed1")) == (
        "mpt-run -m experiment=demo budget=smoke precision=fp32,amp seed=0,1 resume=true"
    )


def test_a_custom_model_built_for_other_images_is_refused_at_its_first_step(tmp_path) -> None:
    """A factory built for RGB images run on the 1-channel digits: one line that names the
    data's images and the model.kwargs way to fit them, not torch's shape error with a
    traceback; the record says how the run ended."""
    path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    run_dir = tmp_path / "run"
    target = "helpers_custom_model:tiny_classifier"  # in_channels=3 unless told
    proc = run_cli(
        *SMOKE,
        "model=custom",
        f"model.target={target}",
        run_dir=run_dir,
        check=False,
        env={"PYTHONPATH": path},
    )
    line = one_line_error(proc)
    assert f"model.target={target} cannot take this data's images (1 channel, 8x8" in line, line
    assert "+model.kwargs.in_channels=1" in line
    record = read_run(run_dir)
    assert record["status"] == "failed" and "cannot take this data's images" in record["reason"]
