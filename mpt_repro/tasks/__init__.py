"""The tasks, as the plugins register them (mpt_repro/registry.py): a task kind names the class
that trains it by import path, and only the run's own task module is imported (a detection task
loads torchvision; a language model needs none of it). base.py never imports this package back
(no import cycle).
"""

from __future__ import annotations

from typing import Any

from mpt_repro import registry
from mpt_repro.tasks.base import Task


def registered() -> list[str]:
    """Every registered task kind."""
    return registry.task_kinds()


def task_class(kind: str) -> type[Task]:
    """The Task class of a kind, imported on first use."""
    cls = registry.resolve(registry.task_target(kind))
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"task {kind!r}: {registry.task_target(kind)} is not a Task subclass")
    cls.name = kind
    return cls


def build_task(cfg: Any, device: Any, policy: Any) -> Task:
    return task_class(cfg.task)(cfg, device, policy)  # validate() refused kinds it does not know


def all_metric_names() -> list[str]:
    """The final metrics of every registered task (HParams lists the same columns for every
    run)."""
    found: list[str] = []
    for kind in registered():
        task = task_class(kind)
        found += [n for n in getattr(task, "metric_names", []) if n not in found]
    return found
