"""Checkpoint files of a run: written atomically, with the one before kept as a fallback.

    <run>/checkpoints/last.pt       the newest checkpoint
    <run>/checkpoints/previous.pt   the one before it

A save writes a temporary file, then renames: a kill mid-save leaves the earlier files whole. A
file can still go bad afterwards (a copy cut short, a full disk on another tool's write, bit rot),
so the load falls back to previous.pt when last.pt cannot be read, and says so; when neither can be
read it raises CheckpointError naming both files and the way out, never a bare UnpicklingError.

Every read is `torch.load(weights_only=True)`: a runs folder can come from someone else, and a full
unpickle of a crafted file runs its code. A checkpoint holds tensors, numbers, strings and
containers (the RNG states are kept as tensors); numpy arrays are admitted too, for checkpoints
written before that. A file naming anything else is refused, naming the file, and never falls
back: it is not damaged, it is not ours.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

from mpt_repro.errors import CheckpointError, file_size_limit, too_large
from mpt_repro.safeio import NotARegularFile, open_regular

LAST = Path("checkpoints/last.pt")
PREVIOUS = Path("checkpoints/previous.pt")
# The field every checkpoint of the trainer holds: a file without it is not one of ours.
REQUIRED_KEY = "step"

log = logging.getLogger("mpt_repro")


class UnsafeFile(Exception):
    """A file torch.load(weights_only=True) refused: it names code, not data."""


def safe_load(path: Path | str, map_location: Any = "cpu") -> Any:
    """torch.load(path, weights_only=True), numpy arrays admitted; UnsafeFile for anything else a
    pickle names (what it names is in the message: nothing of it was called)."""
    import torch

    with open_regular(path, "rb") as f, torch.serialization.safe_globals(_numpy_globals()):
        try:
            return torch.load(f, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            raise _what_it_is(e) from None


def _what_it_is(e: pickle.UnpicklingError) -> Exception:
    """What a file torch.load(weights_only=True) refused is, in our words: torch's own message
    advises loading it with weights_only=False, which this suite never passes on."""
    text = str(e)
    named = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"but got <class '([\w.]+)'>", text)
    if named:
        return UnsafeFile(f"it names {named.group(1)}, which a checkpoint of mpt-run never holds")
    if "Unsupported operand" in text:  # a bare pickle stream, not torch.save's zip archive
        return ValueError("a pickle stream, not a checkpoint torch.save wrote (mpt-run's are)")
    # cut short or garbage: damage, which the caller reports (and falls back from)
    return ValueError("not a checkpoint torch.save wrote (cut short or damaged?)")


def _numpy_globals() -> list:
    """numpy's array reconstruction, under the module names numpy 1 and 2 write (RNG states of
    older checkpoints are numpy arrays); it builds arrays and calls nothing else."""
    import numpy as np

    core = np._core if hasattr(np, "_core") else np.core  # numpy 2 renamed it
    reconstruct = core.multiarray._reconstruct
    return [
        (reconstruct, "numpy.core.multiarray._reconstruct"),
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        *(getattr(np.dtypes, n) for n in ("UInt32DType", "Int64DType", "Float64DType")),
    ]


def refusal(path: Path | str, e: UnsafeFile, what: str) -> str:
    """The one line for a refused file: what it names, that nothing ran, what to do."""
    return (
        f"{path}: refused: {e}; it was not loaded and nothing in it ran (checkpoints are read "
        f"with weights_only=True). {what}"
    )


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The checkpoint files present in run_dir, newest first."""
    # anything at the name counts (a FIFO too): the load then says what it is, where "no
    # checkpoint" would call the run one that stopped before its first
    paths = [Path(run_dir) / p for p in (LAST, PREVIOUS)]
    return [p for p in paths if p.exists() or p.is_symlink()]


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
    files = checkpoint_files(run_dir)
    if not files:
        return None
    problems: list[str] = []
    for path in files:
        try:
            state = safe_load(path, map_location)
        except UnsafeFile as e:  # not damage: refused outright, never a fall-back past it
            raise CheckpointError(
                refusal(
                    path,
                    e,
                    "If this runs folder came from someone else, start afresh with overwrite=true "
                    "(the old files are moved aside), or remove the file and resume=true again.",
                )
            ) from None
        except NotARegularFile as e:  # a FIFO: never opened, never waited on
            problems.append(f"{path}: {e.what}, not a checkpoint file (never opened)")
            continue
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
