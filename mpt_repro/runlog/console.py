"""What the console shows while a run trains: one progress bar per run on a terminal, with
logging routed through the bar (`tqdm.write`) so log lines never glue onto it and no stale bar
stays behind; without a terminal (a log file, a cluster job) no bar at all, and a plain log line
at most every `PLAIN_LOG_INTERVAL_S` seconds.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# without a terminal: at most one progress line per this many seconds (and the last step)
PLAIN_LOG_INTERVAL_S = 30.0

log = logging.getLogger("mpt_repro")


@contextmanager
def logging_through(write) -> Iterator[None]:
    """Route the console handlers (stdout/stderr stream handlers of the root logger) through
    `write(text, file)`, keeping their level, format and filters; file handlers are untouched."""
    root = logging.getLogger()
    original = list(root.handlers)
    swapped = []
    for handler in original:
        stream = getattr(handler, "stream", None)
        if type(handler) is logging.StreamHandler and stream in (sys.stdout, sys.stderr):
            swapped.append(_WriteHandler(handler, write))
        else:
            swapped.append(handler)
    root.handlers = swapped
    try:
        yield
    finally:
        root.handlers = original


class _WriteHandler(logging.Handler):
    def __init__(self, inner: logging.StreamHandler, write):
        super().__init__(inner.level)
        self.setFormatter(inner.formatter)
        self.filters = list(inner.filters)
        self.stream, self._write = inner.stream, write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - as logging.StreamHandler does
            self.handleError(record)


class RunProgress:
    """One run's progress: a bar on a terminal, periodic log lines elsewhere.

    with RunProgress(total_steps, initial=step, desc="demo/fp32",
                     enabled=cfg.trainer.progress, silent=not is_main) as progress:
        ...
        progress.update(step, loss=0.31, samples_s=812.0, scale=65536.0)

    On a terminal (and `enabled`), console logging goes through the bar while it lives, and the bar
    is removed when the run ends (`leave=False`): the closing block reports the end state. Without
    a terminal, or with `enabled=False`, there is no bar; a line goes to the log at the first
    update, then at most every `interval_s` seconds, and at the last step. `silent` (the other
    ranks of a distributed run): nothing at all.
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        desc: str = "",
        enabled: bool = True,
        stream=None,
        interval_s: float = PLAIN_LOG_INTERVAL_S,
        logger: logging.Logger | None = None,
        silent: bool = False,
    ):
        self.total, self.desc, self.interval_s = total, desc, interval_s
        self.silent = silent
        self.stream = sys.stderr if stream is None else stream
        self.log = logger or log
        self.bar = None
        self._redirect = None
        self._last_line = -math.inf
        if enabled and not silent and _isatty(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit="step",
                dynamic_ncols=True,
                mininterval=1.0,
                leave=False,
                file=self.stream,
            )
            self._redirect = logging_through(tqdm.write)
            self._redirect.__enter__()

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, step: int, **fields: Any) -> None:
        if self.silent:
            return
        shown = {k: _short(v) for k, v in fields.items() if v is not None}
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(shown, refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if step >= self.total or now - self._last_line >= self.interval_s:
            self._last_line = now
            pct = 100.0 * step / max(self.total, 1)
            values = " ".join(f"{k}={v}" for k, v in shown.items())
            self.log.info("%s step %d/%d (%.0f%%) %s", self.desc, step, self.total, pct, values)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
