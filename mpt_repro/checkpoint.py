"""Checkpoint files of a run: written atomically, with the one before kept as a fallback.

    <run>/checkpoints/last.pt       the newest checkpoint
    <run>/checkpoints/previous.pt   the one before it

A save writes a temporary file, then renames: a kill mid-save leaves the earlier files whole. A
file can still go bad afterwards (a copy cut short, a full disk on another tool's write, bit rot),
so the load falls back to previous.pt when last.pt cannot be read, and says so; when neither can be
read it raises CheckpointError naming both files and the way out, never a bare UnpicklingError.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from mpt_repro.errors import CheckpointError, file_size_limit, too_large

LAST = Path("checkpoints/last.pt")
PREVIOUS = Path("checkpoints/previous.pt")
# The field every checkpoint of the trainer holds: a file without it is not one of ours.
REQUIRED_KEY = "step"

log = logging.getLogger("mpt_repro")


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The checkpoint files present in run_dir, newest first."""
    return [Path(run_dir) / p for p in (LAST, PREVIOUS) if (Path(run_dir) / p).is_file()]


def has_checkpoint(run_dir: Path) -> bool:
    return bool(checkpoint_files(run_dir))


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write `state` to checkpoints/last.pt; the last.pt before it becomes previous.pt.

    Raises CheckpointError (with the free space on the device when the write failed for want of
    it) and leaves the earlier files as they were.
    """
    import torch

    last = Path(run_dir) / LAST
    tmp = last.with_name(f".{last.name}.{os.getpid()}.tmp")
    try:
        last.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as e:  # torch reports a failed write as RuntimeError
        written = _size(tmp)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise CheckpointError(_write_failure(last, e, written)) from e
    except BaseException:  # a signal that stops the run mid-save: no half file is left behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    # Two renames, each atomic: between them previous.pt holds the older checkpoint and last.pt
    # is missing, which the load handles (it falls back to previous.pt).
    if last.exists():
        os.replace(last, last.parent / PREVIOUS.name)
    os.replace(tmp, last)
    _fsync_dir(last.parent)
    return last


def load_checkpoint(run_dir: Path, map_location: Any = "cpu") -> dict[str, Any] | None:
    """The newest readable checkpoint of run_dir, or None when it has none.

    Falls back from last.pt to previous.pt (logging a warning that names the unreadable file and
    its error). The returned dict carries `loaded_from` (the path read). Raises CheckpointError
    when checkpoint files exist but none can be read.
    """
    import torch

    files = checkpoint_files(run_dir)
    if not files:
        return None
    problems: list[str] = []
    for path in files:
        try:
            state = torch.load(path, map_location=map_location, weights_only=False)
        except Exception as e:  # noqa: BLE001 - any failure to read is the same answer: not usable
            problems.append(f"{path}: {_short(e)}")
            continue
        if not isinstance(state, dict) or REQUIRED_KEY not in state:
            problems.append(f"{path}: not a checkpoint of mpt-run (no {REQUIRED_KEY!r} field)")
            continue
        if not problems and path.name == PREVIOUS.name:
            log.warning(
                "%s is missing (a save was cut short between its two renames); resuming from %s "
                "(step %s)",
                Path(run_dir) / LAST,
                path,
                state[REQUIRED_KEY],
            )
        if problems:
            log.warning(
                "checkpoint %s cannot be read (%s); resuming from the one before it, %s (step %s)",
                files[0],
                problems[0].split(": ", 1)[1],
                path,
                state[REQUIRED_KEY],
            )
        state["loaded_from"] = str(path)
        return state
    raise CheckpointError(
        "no checkpoint of this run can be read: "
        + "; ".join(problems)
        + ". Start the run afresh with overwrite=true (the old files are moved aside, not "
        "deleted), or put a good copy back at "
        + str(Path(run_dir) / LAST)
        + " and resume=true again."
    )


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _write_failure(path: Path, e: BaseException, written: int | None = None) -> str:
    limit = file_size_limit()
    if too_large(e) or (limit is not None and written is not None and written >= limit - 4096):
        return (
            f"could not write the checkpoint {path}: it would be larger than the largest file "
            f"this process may write (ulimit -f: {limit} bytes). Raise the limit (ulimit -f "
            "unlimited), then run the same command"
            + (
                " with resume=true (the checkpoint before it is kept)."
                if path.exists()
                else " again."
            )
        )
    free = _free_bytes(path.parent)
    full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
        free is not None and free < 64 * 2**20
    )
    where = f" ({free / 2**20:.0f} MiB free there)" if free is not None else ""
    fix = (
        "free space on that device"
        if full
        else "check that the folder is writable (or choose another with paths.runs_dir=DIR)"
    )
    then = (
        "The checkpoint before it is kept: " + fix + ", then run the same command with resume=true"
        if path.exists()
        else fix[0].upper() + fix[1:] + ", then run the same command again"
    )
    return f"could not write the checkpoint {path}{where}: {_short(e)}. {then}."


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _fsync_dir(folder: Path) -> None:
    """Make the renames durable (a power cut after a save keeps the new names)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
