"""The one way the suite opens a file it reads: regular files only, refused before any read.

Every reader (run records, items files, metrics.csv, telemetry, checkpoints, mpt-bench JSON,
claims, a report's manifest, data batches) opens through `open_regular`. A FIFO opened for
reading waits for a writer forever, a character device may never end and a directory is not a
file: each is refused in one line naming the path and what it is, and nothing is read from it.

The path is opened with O_NONBLOCK (opening a FIFO then returns at once instead of waiting), the
open descriptor is asked what it is (fstat: no race between a look and an open), and only a
regular file is handed on, in blocking mode again. No torch, numpy or pandas here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from mpt_repro.errors import UserError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


class NotARegularFile(OSError, UserError):
    """`path` exists but is not a regular file; `what` says what it is ("a FIFO (named pipe)").

    An OSError, so a reader that already turns "cannot be read" into its one line does so here
    too; and a UserError, so one that does not still ends mpt-run in one line, exit 2. str() is
    that line's substance: `<path> is a FIFO (named pipe), not a regular file`."""

    def __init__(self, path: Path | str, what: str):
        super().__init__(f"{path} is {what}, not a regular file")
        self.path, self.what = Path(path), what
        self.filename = str(path)

    def __str__(self) -> str:
        return self.args[0]


def kind_of(mode: int) -> str | None:
    """None for a regular file, else what the file system says it is."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path | str, mode: str = "rb", **kwargs) -> IO:
    """open(path, mode, **kwargs) for reading, refusing anything but a regular file
    (NotARegularFile) before a byte is read; a symlink to a regular file is followed."""
    if any(c in mode for c in "wax+"):
        raise ValueError(f"open_regular reads; mode {mode!r} writes")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        what = kind_of(os.fstat(fd).st_mode)
        if what:
            raise NotARegularFile(path, what)
        os.set_blocking(fd, True)
        return open(fd, mode, closefd=True, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path | str) -> bytes:
    with open_regular(path, "rb") as f:
        return f.read()


def read_text(path: Path | str, encoding: str = "utf-8", errors: str = "strict") -> str:
    with open_regular(path, "r", encoding=encoding, errors=errors) as f:
        return f.read()


def check_regular(path: Path | str) -> None:
    """Raise NotARegularFile when `path` exists and is not a regular file (asked without opening:
    for a reader that hands the path itself to a library); a missing path passes."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    what = kind_of(mode)
    if what:
        raise NotARegularFile(path, what)
