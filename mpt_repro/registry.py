"""The plugin registry: what an experiment brings to the suite, registered by its own module.

An experiment is its config files plus a plugin module that registers, without importing torch:

- the schema of each model and data option it adds (`@option_schema("model", "my_net")`), which
  its conf/model/*.yaml and conf/data/*.yaml name (`- /schema/model@_here_: my_net`);
- its task kind and the class that trains it, by import path (`task("my_task", "pkg.mod:Cls")`):
  the class is imported only when a run builds it, so a refusal stays fast;
- how the report presents the task (`TaskReport`), and its config folder (`config_dir`).

The built-in experiments are plugins like any other (mpt_repro/experiments/), named by the
entry points of mpt-repro's own pyproject.toml. A plugin is found by one of

    [project.entry-points."mpt_repro.experiments"]   # in an installed package's pyproject.toml
    my_task = "my_package.my_task"
    MPT_PLUGINS=my_task,other_task mpt-run ...          # modules on the Python path

docs/adding-an-experiment.md walks through one. Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mpt_repro.errors import ConfigError

ENTRY_POINT_GROUP = "mpt_repro.experiments"
ENV_VAR = "MPT_PLUGINS"  # comma-separated modules, imported as entry points are

# what the plugins registered (filled as they are imported, by load())
OPTION_SCHEMAS: dict[str, dict[str, type]] = {"model": {}, "data": {}}
TASKS: dict[str, str] = {}  # task kind -> "package.module:Class"
CONFIG_DIRS: list[Path] = []  # a plugin's own conf/ folders, searched after the suite's


@dataclass(frozen=True)
class TaskReport:
    """How mpt-report shows a task's runs.

    view: the generic table of the task's runs: "metrics" (every final metric per preset),
    "primary" (the primary metric per preset), or "paper" (none: the paper table shows every run
    of the task); paper_table: "package.module:function" building the paper's table beside our
    runs, called as function(agg, runs, deltas); train_figure: the paper's figure that is the
    training perplexity, exp(logged training loss), if any; paper_reference: (the table's id in
    paper_reference.csv, its title) for the paper's table as printed."""

    title: str
    slug: str
    view: str = "metrics"
    paper_table: str | None = None
    train_figure: str | None = None
    paper_reference: tuple[str, str] | None = None


REPORTS: dict[str, TaskReport] = {}
_loaded: list[str] = []  # the plugin modules imported, in order
_failure: list[ConfigError] = []
_failed: list[str] = []  # the plugin modules whose import failed
_tolerant = [False]  # load_available() was called: go on without the plugins that fail


def option_schema(group: str, name: str) -> Callable[[type], type]:
    """Class decorator: the schema of option `name` of `group` (model or data)."""

    def add(cls: type) -> type:
        _claim(f"the {group} schema {name!r}", cls.__module__)
        OPTION_SCHEMAS.setdefault(group, {})[name] = cls
        return cls

    return add


_OWNERS: dict[str, str] = {}  # what each plugin module registered: {what: module}


def _claim(what: str, module: str) -> None:
    """Two plugins may not register one name: the second would silently replace the first's
    (an experiment would train another task, or check another schema). The same module
    imported again may."""
    first = _OWNERS.setdefault(what, module)
    if first != module:
        raise ConfigError(
            f"{what} is registered twice, by {first} and by {module}: rename one of them "
            "(docs/adding-an-experiment.md, 'What to check')"
        )


def task(kind: str, target: str, report: TaskReport | None = None) -> None:
    """Register task `kind` (the experiment files' `task:`), trained by the Task class at
    `target` ("package.module:Class")."""
    if ":" not in target:
        raise ConfigError(f"task {kind!r}: the target {target!r} must read package.module:Class")
    _claim(f"the task {kind!r}", sys._getframe(1).f_globals.get("__name__", "?"))  # the caller
    TASKS[kind] = target
    if report is not None:
        REPORTS[kind] = report


def config_dir(path: str | Path) -> None:
    """A folder of config groups (experiment/, model/, data/, ...) that mpt-run searches after
    its own, as Hydra's searchpath (`hydra.searchpath=[file://...]` on the command line does the
    same)."""
    folder = Path(path).expanduser().resolve()
    if folder not in CONFIG_DIRS:
        CONFIG_DIRS.append(folder)


# ---------------------------------------------------------------- discovery


def plugin_modules() -> list[str]:
    """The plugin modules to import: entry points, then MPT_PLUGINS. A checkout used without
    installing (PYTHONPATH to it: the GPU check) has no entry points of its own; its built-in
    plugins are then the modules of mpt_repro.experiments (not a plugin's private modules, such
    as _detection_tables, which only mpt-report imports)."""
    from importlib.metadata import entry_points

    names = [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    if not any(n.startswith("mpt_repro.experiments.") for n in names):
        import mpt_repro.experiments as builtin

        found = pkgutil.iter_modules(builtin.__path__, "mpt_repro.experiments.")
        own = sorted(m.name for m in found if not m.name.rsplit(".", 1)[1].startswith("_"))
        names = own + names
    names += [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    return list(dict.fromkeys(names))


def load() -> None:
    """Import every plugin once. A plugin whose import fails in any way (ImportError, a syntax
    error, an exception it raises, sys.exit) is refused with one line naming it and how it was
    named (ConfigError), now and at every later call; after load_available(), it is left out."""
    if _failure and not _tolerant[0]:
        raise _failure[0]
    for name in plugin_modules():
        if name in _loaded or name in _failed:
            continue
        try:
            importlib.import_module(name)
        except ConfigError as e:  # a name another plugin registered (_claim)
            problem = ConfigError(f"the experiment plugin {name!r} cannot be loaded: {e}")
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure is the plugin's
            problem = ConfigError(_import_failure(name, e))
        else:
            _loaded.append(name)
            continue
        _failure.append(problem)
        _failed.append(name)
        if not _tolerant[0]:
            raise problem from None


def load_available() -> list[str]:
    """Import every plugin that can be imported, and go on without the others: the one-line
    reason of each that cannot (`mpt-run --help`, mpt-report: they say which, and go on)."""
    _tolerant[0] = True
    load()
    return [str(e) for e in _failure]


def _import_failure(name: str, e: BaseException) -> str:
    """The one line for a plugin whose import failed: what happened, how it was named, the fix."""
    how = _named_by(name)
    if isinstance(e, ImportError):
        return (
            f"the experiment plugin {name!r} cannot be imported ({e}); it is {how}: put its "
            "folder on PYTHONPATH (or install its package), or remove the name"
        )
    if isinstance(e, SyntaxError):
        what = f"has a syntax error ({e.msg}, {e.filename} line {e.lineno})"
    elif isinstance(e, SystemExit):
        what = f"called sys.exit({e.code!r}) while being imported"
    else:
        what = f"raised {type(e).__name__} while being imported ({e})"
    return f"the experiment plugin {name!r} {what}; it is {how}: fix it, or remove the name"


def _named_by(name: str) -> str:
    """How a plugin module was named: MPT_PLUGINS, an installed package's entry point, or the
    suite's own experiments."""
    from importlib.metadata import entry_points

    if name in [n.strip() for n in os.environ.get(ENV_VAR, "").split(",")]:
        return f"named by {ENV_VAR}"
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value.split(":")[0] == name:
            dist = getattr(ep, "dist", None)
            package = f" of the installed package {dist.name}" if dist is not None else ""
            return f"named by the {ENTRY_POINT_GROUP!r} entry point {ep.name!r}{package}"
    return "one of mpt_repro.experiments"


def option_schemas() -> dict[str, dict[str, type]]:
    """{group: {schema name: dataclass}} of every plugin."""
    load()
    return OPTION_SCHEMAS


def task_kinds() -> list[str]:
    load()
    return sorted(TASKS)


def task_target(kind: str) -> str:
    load()
    if kind not in TASKS:
        raise ConfigError(f"task={kind!r} is not a registered task; known: {sorted(TASKS)}")
    return TASKS[kind]


def report_of(kind: str) -> TaskReport | None:
    load()
    return REPORTS.get(kind)


def config_dirs() -> list[Path]:
    load()
    return list(CONFIG_DIRS)


def resolve(target: str):
    """The object at "package.module:attribute"."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
