"""Errors that end a run with a clear message instead of a traceback.

The CLI turns each of them into one short message and an exit status (docs/reliability.md):
UserError and its kinds exit 2, an Interrupted run 128 + the signal's number (130 for Ctrl-C,
143 for SIGTERM), anything else 1 with its traceback in the run's log file and run.json.
"""

from __future__ import annotations

import errno
import signal
from pathlib import Path


class UserError(Exception):
    """Bad input the user can fix: the message says what to do. The CLI prints it and exits 2."""


class ConfigError(UserError):
    """An invalid or contradictory configuration value; the message names the key."""


class DataError(UserError):
    """A missing, empty or malformed data set; the message names the expected layout."""


class CheckpointError(UserError):
    """No checkpoint of the run directory can be read (or written): the message names the files
    and the way out (overwrite=true, or restoring a copy)."""


class RunDirError(UserError):
    """The run directory cannot be used as asked: another process holds it, it holds a finished
    run, or there is nothing to resume. The message names the directory and the choices."""


class FinishedRun(RunDirError):
    """The run directory holds a completed run and neither resume=true nor overwrite=true was
    given: nothing was changed. In a sweep, the others run and the sweep's last line gives the
    command that keeps the finished runs and runs the rest."""


class Diverged(Exception):
    """Training diverged (non-finite loss, or the loss scale stuck at its floor).

    Divergence is a result, not a crash: the run ends with status ``diverged``. ``layer`` is the
    first layer whose gradient went non-finite, when the precision engine knows it.
    """

    def __init__(self, reason: str, step: int | None = None, layer: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.step = step
        self.layer = layer


class Interrupted(Exception):
    """A signal (SIGTERM from a scheduler, SIGINT from Ctrl-C) stopped the run at a step boundary
    after its checkpoint was saved: the run ends ``interrupted`` and ``resume=true`` continues it.

    The exit status follows the shell's convention for a process ended by a signal, 128 + its
    number, so that a scheduler or a script sees the stop for what it is.
    """

    def __init__(
        self,
        signum: int,
        step: int | None = None,
        saved: bool = True,
        during: str | None = None,
    ):
        self.signum = int(signum)
        self.step = step
        at = f" at step {step}" if step is not None else ""
        # saved=False: the run stopped outside the trainer's step boundary (Ctrl-C while
        # evaluating, a second signal, a step that outlasted the stop timeout), so the run
        # continues from its last periodic checkpoint instead. `during`: what it stopped (the
        # final evaluation) or why it stopped mid-step
        if saved and during:
            how = f"during {during} (the checkpoint of that step is saved)"
            super().__init__(f"stopped by {self.signal_name}{at} {how}; resume=true runs it again")
            return
        how = (
            "after saving a checkpoint; resume with resume=true"
            if saved
            else "; resume=true continues from its last checkpoint"
        )
        why = f" ({during})" if during else ""
        super().__init__(f"stopped by {self.signal_name}{at}{why} {how}".replace(" ;", ";"))

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def describe(e: BaseException) -> str:
    """One line for the console or a record's `reason`: the error's type and first line. An
    error raised in a DataLoader worker arrives wrapped ("Caught X in DataLoader worker process
    0." and the worker's traceback); its last line is the original error, which names the file."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if len(lines) > 1 and " in DataLoader worker process " in lines[0]:
        return f"{lines[-1]} (in a data-loading worker)"
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def naming(e: OSError, path: Path | str) -> OSError:
    """`e` with the file it was writing as its filename: a failed write() (a full disk, a file
    past `ulimit -f`) names none, and the message must say which file."""
    if e.filename is not None or e.errno is None:
        return e
    named = OSError(e.errno, e.strerror, str(path))
    named.__cause__ = e
    return named


def file_size_limit() -> int | None:
    """The largest file this process may write, in bytes (`ulimit -f`), or None when unlimited."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def too_large(e: BaseException) -> bool:
    """Whether a write failed for the file-size limit (EFBIG, "File too large")."""
    return getattr(e, "errno", None) == errno.EFBIG or "File too large" in str(e)
