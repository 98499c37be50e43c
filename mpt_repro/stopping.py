"""How a signal ends a run, within a bounded time (docs/reliability.md, "How a run ends").

SIGTERM (a scheduler) and SIGINT (Ctrl-C) ask the trainer to stop at the end of the step it is
in, after saving a checkpoint. Whatever the step is doing, the run ends within
`stop_timeout_s()` seconds of the first signal (20 s unless MPT_STOP_TIMEOUT_S says otherwise;
SLURM's default grace before SIGKILL is 30 s): past that, or at a second signal, it stops where
it is, and resume=true continues from the last checkpoint. A signal during the final evaluation
stops the evaluation at once: the checkpoint of the last step is saved, and resume=true runs the
evaluation again. Each way ends with the run's record (`interrupted`, or `failed` when there is
no checkpoint yet).

The timer is a thread that, when the time is up, sends the same signal to the main thread: a
blocking call (a loader that waits, a sleep) is interrupted by it, where a flag would wait for
the call to return. A step stuck inside one native call (a GPU kernel, a collective) ends when
that call returns (collectives time out after distributed.timeout_s).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from mpt_repro.errors import Interrupted

DEFAULT_STOP_TIMEOUT_S = 20.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)
log = logging.getLogger("mpt_repro")


def stop_timeout_s() -> float:
    """Seconds from the first signal to the end of the run at the latest (MPT_STOP_TIMEOUT_S)."""
    try:
        value = float(os.environ.get("MPT_STOP_TIMEOUT_S", DEFAULT_STOP_TIMEOUT_S))
    except ValueError:
        return DEFAULT_STOP_TIMEOUT_S
    return value if value > 0 else DEFAULT_STOP_TIMEOUT_S


@contextlib.contextmanager
def stop_on_signals(trainer: Any) -> Iterator[None]:
    """While training: the first signal sets `trainer._stop_signal` (the loop stops at the step's
    end), a second one, the timer, or any signal while `trainer._finishing` (the final
    evaluation) raises Interrupted at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    timeout = stop_timeout_s()
    guard = threading.Lock()
    state: dict[str, Any] = {"timer": None, "overdue": False, "done": False}

    def overdue(signum: int) -> None:
        with guard:
            if state["done"]:
                return
            state["overdue"] = True
            signal.pthread_kill(threading.main_thread().ident, signum)

    def request(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if trainer._finishing:
            log.warning(
                "%s during the final evaluation: stopping it now; the checkpoint of step %d is "
                "saved, and resume=true evaluates again",
                name,
                trainer.step,
            )
            raise Interrupted(signum, trainer.step, during="the final evaluation")
        if trainer._stop_signal is not None:
            why = (
                f"it did not reach the end of its step within {timeout:g} s"
                if state["overdue"]
                else f"a second {name}"
            )
            log.warning("%s: stopping now, mid-step (the last checkpoint is where it resumes)", why)
            raise Interrupted(trainer._stop_signal, trainer.step, saved=False, during=why)
        trainer._stop_signal = signum
        log.warning(
            "%s: saving a checkpoint at the end of this step, then stopping (within %g s at "
            "most; a second signal stops at once)",
            name,
            timeout,
        )
        timer = threading.Timer(timeout, overdue, args=(signum,))
        timer.daemon = True
        state["timer"] = timer
        timer.start()

    previous = {s: signal.signal(s, request) for s in SIGNALS}
    try:
        yield
    finally:
        with guard:
            state["done"] = True
            if state["timer"] is not None:
                state["timer"].cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Outside the training loop (building, loading the checkpoint): SIGTERM raises Interrupted
    where it arrives, as Ctrl-C raises KeyboardInterrupt, so the run still writes its record."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(signum, None, saved=False)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
