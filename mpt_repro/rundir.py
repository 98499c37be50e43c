"""Who owns a run directory, and what a new command may do with what is already in it.

- `RunLock`: one process at a time per run directory (an exclusive flock on `<run>/.lock`, which
  the kernel releases however the process ends, kill -9 included). A second run of the same
  directory is refused at once, with the holder's pid, host, start time and command.
- `inspect_run_dir` + `plan_run`: read what the directory holds (record, checkpoints, other
  files) and decide, without changing anything, whether to start, resume, leave a finished run
  alone, or refuse. Nothing is deleted: files a new run replaces are moved to
  `<run>/previous-<time>/` (`set_aside`), after the configuration was validated and the data
  opened.

The decision table is in docs/reliability.md ("What a command does with an existing run").
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shlex
import socket
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: the pid-file lock below
    fcntl = None  # type: ignore[assignment]

from mpt_repro.checkpoint import has_checkpoint
from mpt_repro.errors import FinishedRun, RunDirError, naming
from mpt_repro.record import RecordError, now_iso, read_record

LOCK_NAME = ".lock"
SET_ASIDE_PREFIX = "previous-"
# Sub-folders that belong to the run itself. Any other folder is left where it is: a run directory
# can hold other runs' directories (a sweep names a sub-folder by its extra overrides).
# what a run writes into its folder: moved aside whole into previous-<time>/ by overwrite=true
# (running/, interrupted/, failed/: the HParams status record while a run has not finished)
RUN_SUBDIRS = (
    "checkpoints", "tb", ".hydra", "figures", "samples", "running", "interrupted", "failed",
)  # fmt: skip
FINISHED = ("completed", "diverged")

log = logging.getLogger("mpt_repro")


# -- the lock ------------------------------------------------------------------------------------
class RunLock:
    """An exclusive, non-blocking lock on a run directory for the life of this process's run.

    flock(2) is released by the kernel when the process ends, so a lock left by a killed run is
    never in the way: its file (with the dead holder's details) is simply taken over, and that is
    logged. On file systems without flock the lock falls back to an exclusive-create pid file,
    judged stale when its holder is on this host and no longer alive.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._pidfile = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(20):  # a holder that releases while we open: try again on the new file
            if fcntl is None:
                self._acquire_pidfile()
                return
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunDirError(busy_message(self.run_dir, holder)) from None
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    self._acquire_pidfile()
                    return
                raise
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder unlinked it between our open and our flock
                os.close(fd)
                continue
            previous = _read_holder(fd)
            if previous and previous.get("pid") not in (None, os.getpid()):
                log.info(
                    "%s: taking over the lock left by pid %s on %s (that process has ended)",
                    self.run_dir,
                    previous.get("pid"),
                    previous.get("host"),
                )
            _write_holder(fd)
            self._fd = fd
            return
        raise RunDirError(f"could not lock {self.path}: it keeps being replaced; try again")

    def _acquire_pidfile(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read_holder_path(self.path)
                if holder and _is_dead(holder):
                    log.info("%s: removing a stale lock of pid %s", self.run_dir, holder["pid"])
                    self.path.unlink(missing_ok=True)
                    continue
                raise RunDirError(
                    busy_message(self.run_dir, holder)
                    + f" (If no run uses it, delete {self.path}.)"
                ) from None
            _write_holder(fd)
            os.close(fd)
            self._pidfile = True
            return
        raise RunDirError(f"could not lock {self.path}; try again")

    def release(self) -> None:
        """Remove the lock file while still holding the lock, then let go (an opener that lost
        the race notices that the file it locked is no longer the one at the path)."""
        if self._fd is None and not self._pidfile:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._pidfile = None, False


def lock_holder(run_dir: Path) -> dict[str, Any] | None:
    """The live holder of a run directory's lock ({pid, host, started_at, command}), or None.

    For readers such as the reporter: a `running` record whose directory nobody holds was
    killed.
    """
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if fcntl is None:
            holder = _read_holder(fd)
            return holder if holder and not _is_dead(holder) else None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or {}
        except OSError:  # no flock here: judge by the pid
            holder = _read_holder(fd)
            return holder if holder and not _is_dead(holder) else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _write_holder(fd: int) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": now_iso(),
        "command": shlex.join(["mpt-run", *sys.argv[1:]]),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        raw = os.pread(fd, 65536, 0)
        info = json.loads(raw.decode()) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _read_holder_path(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


def _is_dead(holder: dict[str, Any]) -> bool:
    """Only a holder on this host can be judged; one elsewhere is assumed alive."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def busy_message(run_dir: Path, holder: dict[str, Any] | None) -> str:
    who = (
        f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started_at')} "
        f"({holder.get('command')})"
        if holder
        else "a process that is still starting"
    )
    return (
        f"{run_dir} is in use by another run: {who}. Two runs in one directory would mix their "
        "files. Wait for it to finish or stop it, or give this run its own directory (another "
        "seed, or paths.runs_dir=DIR)."
    )


# -- what the directory holds, and what to do with it --------------------------------------------
@dataclass
class RunDirState:
    run_dir: Path
    record: dict[str, Any] | None  # the readable run record, upgraded to the current schema
    record_problem: str | None  # why run.json cannot be used, when it is there but unusable
    checkpoint: bool
    artefacts: list[Path]  # the files and run folders a new run would replace

    @property
    def status(self) -> str | None:
        return self.record["status"] if self.record else None


def inspect_run_dir(run_dir: Path) -> RunDirState:
    run_dir = Path(run_dir)
    record, problem = None, None
    try:
        record = read_record(run_dir)
    except RecordError as e:
        if e.special:  # nothing reads it, and moving it aside would hide what put it there
            raise RunDirError(
                f"{e.path} {e.problem}: mpt-run never opens it. Remove it (or give this run "
                "another directory with paths.runs_dir=DIR), then run the same command again."
            ) from None
        problem = e.problem
    return RunDirState(run_dir, record, problem, has_checkpoint(run_dir), run_artefacts(run_dir))


def run_artefacts(run_dir: Path) -> list[Path]:
    """What a run wrote into its directory: every file but the log (Hydra appends to it, and it
    keeps the history of every attempt) and the lock, and the run's own folders."""
    if not Path(run_dir).is_dir():
        return []
    out = []
    for p in sorted(Path(run_dir).iterdir()):
        if p.name == LOCK_NAME or p.name.startswith(SET_ASIDE_PREFIX):
            continue
        if (p.is_file() and p.suffix != ".log") or (p.is_dir() and p.name in RUN_SUBDIRS):
            out.append(p)
    return out


@dataclass
class Plan:
    """What run() does: `fresh` (start), `resume` (continue from the checkpoint) or `done` (the
    run is finished; nothing to do). `set_aside` lists what to move to previous-<time>/ before
    starting; `notes` are (level, message) lines to log. `holds_work`: the directory holds a
    finished run or a checkpoint, which a run that fails before it starts must leave in place."""

    action: str
    previous: dict[str, Any] | None = None
    set_aside: list[str] = field(default_factory=list)
    notes: list[tuple[int, str]] = field(default_factory=list)
    holds_work: bool = False


def plan_run(state: RunDirState, resume: bool, overwrite: bool, data: Any = None) -> Plan:
    """Decide from what the directory holds; raise RunDirError (with the choices) to refuse.
    `data`: the run's data config, refused when the directory's run trained on other data."""
    d, status = state.run_dir, state.status
    names = [p.name for p in state.artefacts]
    notes: list[tuple[int, str]] = []
    work = status in FINISHED or state.checkpoint
    other = other_data(state.record, data, d) if work and not overwrite else None
    if other:  # before the choices below: resume=true would refuse it too
        raise RunDirError(other)
    # what is moved aside is said when it has been (run.py _claim): a run that fails to start
    # moves nothing, and its log must not say otherwise
    if state.record_problem:
        notes.append((logging.WARNING, f"{d / 'run.json'} cannot be read ({state.record_problem})"))
    if overwrite:
        return Plan("fresh", state.record, names, notes, work)
    if status in FINISHED:
        if resume:
            return Plan("done", state.record, [], notes, work)
        raise FinishedRun(_finished_message(state))
    if state.checkpoint:
        if resume:
            aside = ["run.json"] if state.record_problem else []
            return Plan("resume", state.record, aside, notes, work)
        raise RunDirError(_unfinished_message(state))
    if resume and status is not None:
        raise RunDirError(
            f"resume=true, but {d} has no checkpoint to continue from: its run {_ended(status)} "
            f"({state.record.get('reason') or 'it stopped before its first checkpoint'}). Run the "
            "same command without resume=true to start it afresh (its files are moved to "
            f"{d}/{SET_ASIDE_PREFIX}<time>/)."
        )
    if resume:
        notes.append((logging.INFO, f"resume=true: no earlier run in {d}; starting it"))
    elif names:
        what = f"{status} run" if status else "run's leftovers"
        notes.append((logging.INFO, f"starting afresh in {d}, over an earlier {what}"))
    return Plan("fresh", state.record, names, notes)


def other_data(record: dict | None, data: Any, run_dir: Path) -> str | None:
    """data.root is not part of the run directory's name: a directory whose run trained on other
    data can be neither continued nor accepted as done, so the way out is another folder."""
    old = ((record or {}).get("config") or {}).get("data") or {}
    for key in ("name", "root", "num_classes"):
        if data is not None and key in old and old[key] != data.get(key):
            return (
                f"{run_dir} holds a run with data.{key}={old[key]!r}, not {data.get(key)!r}; "
                "continuing it (resume=true) would mix the two. Give this run its own folder with "
                "paths.runs_dir=DIR, or overwrite=true to start it afresh there (the earlier "
                "files are moved aside)."
            )
    return None


def _finished_message(state: RunDirState) -> str:
    d, rec = state.run_dir, state.record or {}
    when = f", finished {rec['finished_at']}" if rec.get("finished_at") else ""
    return (
        f"{d} already holds a {rec['status']} run (record: {d / 'run.json'}{when}). To keep it, "
        "run with resume=true (nothing is retrained); to train it again, run with overwrite=true "
        f"(the old files are moved to {d}/{SET_ASIDE_PREFIX}<time>/, not deleted)."
    )


def _unfinished_message(state: RunDirState) -> str:
    d = state.run_dir
    what = (
        f"an unfinished run (it {_ended(state.status)})"
        if state.status
        else "a run with an unreadable run.json"
    )
    return (
        f"{d} holds {what} with a checkpoint. To continue it, run with resume=true; to start "
        f"it afresh, run with overwrite=true (its files are moved to {d}/{SET_ASIDE_PREFIX}<time>/,"
        " not deleted)."
    )


def _ended(status: str) -> str:
    """How a run with this record status ended, in words (`running` with nobody holding the
    directory means the process was killed)."""
    return "was killed while running" if status == "running" else f"is {status}"


def set_aside(run_dir: Path, names: list[str]) -> Path | None:
    """Move the named entries of run_dir into a new `previous-<time>/` folder; return it."""
    present = [Path(run_dir) / n for n in names if (Path(run_dir) / n).exists()]
    if not present:
        return None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = Path(run_dir) / f"{SET_ASIDE_PREFIX}{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = Path(run_dir) / f"{SET_ASIDE_PREFIX}{stamp}-{n}"
    target.mkdir()
    for p in present:
        os.replace(p, target / p.name)
    return target


def is_set_aside(path: Path) -> bool:
    """Whether a path lies in a `previous-<time>/` folder (readers of results skip those)."""
    return any(part.startswith(SET_ASIDE_PREFIX) for part in Path(path).parts)


def write_hydra_files(run_dir: Path, cfg: Any) -> None:
    """`.hydra/` (the composed config, Hydra's config, the overrides), written once the run owns
    its directory. Hydra would write them before the run starts (conf/config.yaml turns that
    off): a refused command would then overwrite the config files of the run it refused to
    touch."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    out = Path(run_dir) / ".hydra"
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "config.yaml": cfg,
        "hydra.yaml": OmegaConf.create({"hydra": hc}),
        "overrides.yaml": hc.overrides.task,
    }
    for name, content in files.items():
        try:
            OmegaConf.save(content, out / name)
        except OSError as e:  # a full disk, a file past `ulimit -f`: say which file
            raise naming(e, out / name) from e


def resume_command(run_dir: Path) -> str:
    """The command that continues: this command line with resume=true. In a sweep launched here
    that is the whole sweep (its completed jobs are left alone, the stopped one continues, the
    ones that never ran start); a job that runs in a process of its own (a cluster launcher) gets
    its own overrides and its directory, so that it resumes alone."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    drop = ("resume=", "overwrite=", "+resume=", "+overwrite=")
    args = sys.argv[1:]
    sweep_here = any(a in ("-m", "--multirun") for a in args)
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN and not sweep_here:
        args = [*HydraConfig.get().overrides.task, f"hydra.run.dir={run_dir}"]
    kept = [a for a in args if not a.startswith(drop)]
    return shlex.join(["mpt-run", *kept, "resume=true"])
