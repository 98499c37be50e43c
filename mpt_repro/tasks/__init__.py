"""The tasks. Each module registers its Task class on import (`register_task`, in base.py);
this package imports them all, and is what the rest of the suite asks for a task: base.py never
imports it back (no import cycle).
"""

from __future__ import annotations

from typing import Any

from mpt_repro.tasks import (  # noqa: F401  (registers the tasks)
    classification,
    detection,
    gan,
    language_model,
    speech,
    translation,
)
from mpt_repro.tasks.base import TASKS, Task


def registered() -> list[str]:
    """Every registered task kind."""
    return sorted(TASKS)


def build_task(cfg: Any, device: Any, policy: Any) -> Task:
    return TASKS[cfg.task](cfg, device, policy)  # validate() refused names it does not know


def all_metric_names() -> list[str]:
    """The final metrics of every registered task (HParams lists the same columns for every
    run)."""
    found: list[str] = []
    for task in TASKS.values():
        found += [n for n in getattr(task, "metric_names", []) if n not in found]
    return found
