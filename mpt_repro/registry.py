"""The registry: every way to extend the suite, registered one way, found one way.

What can be registered (the extension points), each by the module that brings it:

- an experiment's task kind and the class that trains it, by import path
  (`task("my_task", "pkg.mod:Cls", TaskReport(...))`): the class is imported only when a run
  builds it, so a refusal stays fast; the report view (`TaskReport`) comes with it;
- the schema of each model and data option (`@option_schema("model", "my_net")`), which
  conf/model/*.yaml and conf/data/*.yaml name (`- /schema/model@_here_: my_net`);
- a model builder (`model("my_net", "pkg.nets:build")`, or `@register_model("my_net")` where it
  is defined), a loss scaler (`loss_scaler("halving", "pkg.scaling:Halving")`, or
  `@register_scaler`), a number-format converter (`converter(...)`, or `@register_converter`):
  by import path from a plugin module, so that the module that defines them (torch) is imported
  only when a run looks the name up; a loss scaler's registration also says which scaler knobs
  it reads (`loss_scaler("halving", "pkg.scaling:Halving", reads=("init_scale",))`, or
  `@register_scaler("halving", reads=...)`): the command line may set those for a run with it,
  and not the others (`schema.read_if_declared`), for the suite's scalers as for a plugin's;
- a metric's unit, whether it is a percentage and which way is better (`metric("top1", "%",
  higher_is_better=True)`), for the report's tables and plots;
- which of the trainer's settings a task acts on (`schema.honours("my_task",
  "trainer.recalibrate_bn")`, the extension point "honoured setting"): a value given for a task
  that does not act on it is refused as changing nothing;
- a folder of config groups (`config_dir`), searched after the suite's.

One discovery rule for all of them. A plugin module is found by one of

    [project.entry-points."mpt_repro.experiments"]   # in an installed package's pyproject.toml
    my_task = "my_package.my_task"
    MPT_PLUGINS=my_task,other_task mpt-run ...          # modules on the Python path

and the suite's own are plugins like any other: mpt_repro/experiments/ (named by mpt-repro's own
entry points), and its built-in models, scalers and converters, found by the decorator that
registers each in the source of mpt_repro/models/ and mpt_repro/precision/ (so a look-up imports
the one module that defines the name: importing every model module loads torchvision).

One refusal: a name registered twice, by two modules, is refused in one line naming both (an
experiment would otherwise train another task, or a built-in model be silently replaced), unless
the second registration is the same thing (two plugins that both report a perplexity, lower is
better). And no state outlives a failed import: what a plugin registered before its import
failed is forgotten, and the import is tried again at the next load(), so fixing MPT_PLUGINS
(or the plugin) in a running process takes effect without reloading anything.

docs/adding-an-experiment.md walks through one plugin. Nothing here imports torch.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpt_repro.errors import ConfigError

ENTRY_POINT_GROUP = "mpt_repro.experiments"
ENV_VAR = "MPT_PLUGINS"  # comma-separated modules, imported as entry points are

# the points registered by import path ("package.module:attribute", imported at the first
# look-up), and where the suite's own are: (package, the decorator that registers each)
BY_IMPORT_PATH = {
    "model": ("mpt_repro.models", "register_model"),
    "loss scaler": ("mpt_repro.precision", "register_scaler"),
    "converter": ("mpt_repro.precision", "register_converter"),
}


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


@dataclass(frozen=True)
class Metric:
    """What a metric is, as the task that reports it says: its unit ("%" for a percentage,
    "" for a plain number) and which way is better (None: neither, such as the probability a
    GAN's discriminator gives a real image)."""

    unit: str = ""
    higher_is_better: bool | None = None

    @property
    def percent(self) -> bool:
        """A percentage: its axes start at 0 and say %."""
        return self.unit == "%"


# what is registered: {point: {name: value}}; a point by import path holds the path until the
# first look-up imports it. The dicts are the ones the public names below and
# models.MODELS, precision.scalers.SCALERS, precision.converters.CONVERTERS are.
_REGISTERED: dict[str, dict[str, Any]] = {
    point: {}
    for point in ("task", "report view", "model schema", "data schema", "metric", "config folder")
    + tuple(BY_IMPORT_PATH)
}
TASKS: dict[str, str] = _REGISTERED["task"]  # task kind -> "package.module:Class"
REPORTS: dict[str, TaskReport] = _REGISTERED["report view"]
OPTION_SCHEMAS: dict[str, dict[str, type]] = {
    "model": _REGISTERED["model schema"],
    "data": _REGISTERED["data schema"],
}
_OWNERS: dict[str, str] = {}  # who registered what: {"the task 'x'": module}
_loaded: set[str] = set()  # the plugin modules imported
_tolerant = [False]  # load_available() was called: look-ups go on without the plugins that fail


def entries(point: str) -> dict[str, Any]:
    """{name: what is registered} of an extension point ("model", "loss scaler", ...): the live
    dict, filled as modules register (look names up with lookup(), which imports them)."""
    return _REGISTERED.setdefault(point, {})


def owner(point: str, name: str) -> str | None:
    """The module that registered `name` at `point`, if any."""
    return _OWNERS.get(f"the {point} {name!r}")


# ---------------------------------------------------------------- registering


def register(point: str, name: str, value: Any, module: str) -> Any:
    """Register `value` as `name` of `point`, by `module`; refused (ConfigError, one line naming
    both modules) when another module registered something else under that name, the suite's
    own models, scalers and converters included, whether imported yet or not."""
    what = f"the {point} {name!r}"
    registered = entries(point)
    first = _OWNERS.get(what) or _package_own(point).get(name)
    same = name in registered and (
        registered[name] == value or _fulfils(registered[name], value, module)
    )
    if first is not None and first != module and not same:
        raise ConfigError(
            f"{what} is registered twice, by {first} and by {module}: rename one of them "
            "(docs/adding-an-experiment.md, 'What to check')"
        )
    _OWNERS[what] = first or module
    registered[name] = value
    return value


def _fulfils(registered: Any, value: Any, module: str) -> bool:
    """Whether `value` is the object an import path registered earlier names: the module the
    path names registers it where it is defined (`@register_model` in the module that
    `model(...)` pointed to)."""
    if not isinstance(registered, str) or isinstance(value, str):
        return False
    return registered.partition(":")[0] == module


def _caller() -> str:
    """The module that called the registering function that calls this."""
    return sys._getframe(2).f_globals.get("__name__", "?")


def task(kind: str, target: str, report: TaskReport | None = None) -> None:
    """Register task `kind` (the experiment files' `task:`), trained by the Task class at
    `target` ("package.module:Class"), and how mpt-report shows its runs."""
    if ":" not in target:
        raise ConfigError(f"task {kind!r}: the target {target!r} must read package.module:Class")
    module = _caller()
    register("task", kind, target, module)
    if report is not None:
        register("report view", kind, report, module)


def option_schema(group: str, name: str) -> Callable[[type], type]:
    """Class decorator: the schema of option `name` of `group` (model or data)."""

    def add(cls: type) -> type:
        OPTION_SCHEMAS.setdefault(group, entries(f"{group} schema"))
        return register(f"{group} schema", name, cls, cls.__module__)

    return add


def _by_import_path(point: str, name: str, target: str, module: str) -> None:
    if ":" not in target:
        raise ConfigError(
            f"{point} {name!r}: the target {target!r} must read package.module:attribute"
        )
    register(point, name, target, module)


def model(name: str, target: str) -> None:
    """Register the builder of model `name` (conf/model/*.yaml's `name:`) at `target`
    ("package.module:function", called as function(model_cfg, **data shapes)), imported when a
    run builds that model."""
    _by_import_path("model", name, target, _caller())


def loss_scaler(kind: str, target: str, reads: Sequence[str] | None = None) -> None:
    """Register the LossScaler subclass at `target` as `precision.loss_scaling=<kind>`, and the
    scaler knobs it reads (`reads`: field names of PrecisionConfig such as "init_scale"): a
    command line may set those for a run with this scaler, and a knob it does not declare is
    refused as changing nothing (schema.read_if_declared)."""
    module = _caller()
    _by_import_path("loss scaler", kind, target, module)
    if reads is not None:
        declare_reads("loss scaler", kind, reads, module)


def declare_reads(point: str, name: str, reads: Sequence[str], module: str) -> None:
    """Register, for `module`, which settings `name` of `point` reads (a registration's
    `reads=`), as the field names of its config group, in no particular order."""
    keys = (reads,) if isinstance(reads, str) else tuple(reads)
    for key in keys:
        if not (isinstance(key, str) and key.isidentifier()):
            raise ConfigError(
                f"the {point} {name!r} declares reads={keys!r}: name each setting by its field "
                f'name alone, e.g. reads=("init_scale",) for precision.init_scale'
            )
    register(_reads_point(point), name, tuple(sorted(set(keys))), module)


def _reads_point(point: str) -> str:
    """The extension point that holds what each registration of `point` declares it reads."""
    return f"{point} reads"


def converter(name: str, target: str) -> None:
    """Register the Converter subclass at `target` (precision/converters.py), built by every
    policy whose config it `wanted`."""
    _by_import_path("converter", name, target, _caller())


def metric(name: str, unit: str = "", higher_is_better: bool | None = None) -> None:
    """Register what metric `name` is: its unit ("%": a percentage) and which way is better."""
    register("metric", name, Metric(unit, higher_is_better), _caller())


def config_dir(path: str | Path) -> None:
    """A folder of config groups (experiment/, model/, data/, ...) that mpt-run searches after
    its own, as Hydra's searchpath (`hydra.searchpath=[file://...]` on the command line does the
    same)."""
    folder = Path(path).expanduser().resolve()
    register("config folder", str(folder), folder, _caller())


@functools.cache
def _package_own(point: str) -> dict[str, str]:
    """{name: module} of the suite's own models, scalers or converters: the modules whose source
    registers each with its decorator, read as text (no import, no torch). The source does not
    change while a process runs."""
    if point not in BY_IMPORT_PATH:
        return {}
    package, decorator = BY_IMPORT_PATH[point]
    folder = Path(__file__).parent.joinpath(*package.split(".")[1:])
    pattern = re.compile(rf"^\s*@{decorator}\(\s*[\"'](\w+)[\"']", re.M)
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        for name in pattern.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, f"{package}.{path.stem}")
    return found


@functools.cache
def _package_reads(point: str) -> dict[str, tuple[str, ...]]:
    """{name: the settings it reads} of the suite's own registrations of `point` whose decorator
    declares them (`@register_scaler("dynamic", reads=(...))`, a literal): read from the source of
    the modules _package_own found, as their names are (no import, no torch)."""
    if point not in BY_IMPORT_PATH:
        return {}
    decorator = BY_IMPORT_PATH[point][1]
    found: dict[str, tuple[str, ...]] = {}
    for module in sorted(set(_package_own(point).values())):
        path = Path(__file__).parent.joinpath(*module.split(".")[1:]).with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == decorator):
                continue
            for keyword in (k for k in node.keywords if k.arg == "reads" and node.args):
                reads = ast.literal_eval(keyword.value)
                found[ast.literal_eval(node.args[0])] = tuple(sorted(set(reads)))
    return found


# ---------------------------------------------------------------- looking up


def names(point: str) -> list[str]:
    """Every name of `point`, registered or (the suite's own) to be imported at its look-up."""
    _load_for_lookup()
    return sorted(set(entries(point)) | set(_package_own(point)))


def lookup(point: str, name: str) -> Any | None:
    """What is registered as `name` of `point`, imported where it was registered by import path
    or is the suite's own; None when nothing is. An import path whose module cannot be
    imported is refused in one line (ConfigError) naming the plugin that registered it."""
    _load_for_lookup()
    registered = entries(point)
    if name not in registered and name in _package_own(point):
        importlib.import_module(_package_own(point)[name])
    value = registered.get(name)
    if isinstance(value, str) and point in BY_IMPORT_PATH:
        value = _import_target(point, name, value)
    return value


def declared_reads(point: str, name: str) -> tuple[str, ...] | None:
    """The settings `name` of `point` declares it reads, without importing it: its
    registration's `reads=`, or for the suite's own, that of the decorator in its source; None
    when it declares none (not even an empty tuple) or is not registered."""
    _load_for_lookup()
    declared = entries(_reads_point(point))
    if name in declared:
        return declared[name]
    return _package_reads(point).get(name)


def declaring(point: str, setting: str) -> list[str]:
    """The names of `point` that declare they read `setting`, sorted."""
    return [name for name in names(point) if setting in (declared_reads(point, name) or ())]


def is_the_suites(point: str, name: str) -> bool:
    """Whether `name` of `point` is one of the suite's own models, scalers or converters."""
    return name in _package_own(point)


def every(point: str) -> dict[str, Any]:
    """{name: object} of every registration of `point`, each imported (a policy asks every
    converter whether its config wants it): the live dict, in the order they registered, the
    suite's own modules imported in the order of their names."""
    _load_for_lookup()
    for module in dict.fromkeys(sorted(_package_own(point).values())):
        importlib.import_module(module)
    for name in list(entries(point)):
        lookup(point, name)
    return entries(point)


def _import_target(point: str, name: str, target: str) -> Any:
    """The object at a registered import path, kept in its place once imported."""
    module, _, attribute = target.partition(":")
    try:
        value = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"the {point} {name!r}, registered by {owner(point, name)} as {target}, cannot be "
            f"imported ({e}): fix the plugin's registration, or put that module's folder on "
            "PYTHONPATH"
        ) from None
    entries(point)[name] = value
    return value


def metric_info(name: str) -> Metric | None:
    """What the task that reports metric `name` registered about it; None: nothing."""
    return lookup("metric", name)


def option_schemas() -> dict[str, dict[str, type]]:
    """{group: {schema name: dataclass}} of every plugin."""
    _load_for_lookup()
    return OPTION_SCHEMAS


def task_kinds() -> list[str]:
    _load_for_lookup()
    return sorted(TASKS)


def task_target(kind: str) -> str:
    _load_for_lookup()
    if kind not in TASKS:
        raise ConfigError(f"task={kind!r} is not a registered task; known: {sorted(TASKS)}")
    return TASKS[kind]


def report_of(kind: str) -> TaskReport | None:
    _load_for_lookup()
    return REPORTS.get(kind)


def config_dirs() -> list[Path]:
    _load_for_lookup()
    return list(entries("config folder").values())


def resolve(target: str):
    """The object at "package.module:attribute"."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


# ---------------------------------------------------------------- discovery


def plugin_modules() -> list[str]:
    """The plugin modules to import: entry points, then MPT_PLUGINS (read at each call; the
    entry points once per value of MPT_PLUGINS, as every config look-up asks)."""
    return list(_plugin_modules(os.environ.get(ENV_VAR, "")))


@functools.lru_cache(maxsize=16)
def _plugin_modules(named: str) -> tuple[str, ...]:
    """plugin_modules() for MPT_PLUGINS=`named`. A checkout used without installing
    (PYTHONPATH to it: the GPU check) has no entry points of its own; its built-in plugins are
    then the modules of mpt_repro.experiments (not a plugin's private modules, such as
    _detection_tables, which only mpt-report imports)."""
    from importlib.metadata import entry_points

    found = [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    if not any(n.startswith("mpt_repro.experiments.") for n in found):
        import mpt_repro.experiments as builtin

        modules = pkgutil.iter_modules(builtin.__path__, "mpt_repro.experiments.")
        own = sorted(m.name for m in modules if not m.name.rsplit(".", 1)[1].startswith("_"))
        found = own + found
    found += [n.strip() for n in named.split(",") if n.strip()]
    return tuple(dict.fromkeys(found))


def load() -> None:
    """Import every plugin not imported yet. A plugin whose import fails in any way (ImportError,
    a syntax error, an exception it raises, sys.exit) is refused with one line naming it and how
    it was named (ConfigError); what it registered before failing is forgotten, and the next
    load() tries it again."""
    problems = _import_plugins()
    if problems:
        raise problems[0]


def load_available() -> list[str]:
    """Import every plugin that can be imported, and go on without the others, in this call and
    in every look-up after it: the one-line reason of each that cannot (`mpt-run --help`,
    mpt-report: they say which, and go on)."""
    _tolerant[0] = True
    return [str(e) for e in _import_plugins()]


def _load_for_lookup() -> None:
    """load(), or after load_available() the plugins that import."""
    if _tolerant[0]:
        _import_plugins()
    else:
        load()


def _import_plugins() -> list[ConfigError]:
    """Import the plugins not imported yet; the one-line refusal of each that fails."""
    problems = []
    for name in plugin_modules():
        if name in _loaded:
            continue
        before = set(_OWNERS)
        try:
            importlib.import_module(name)
        except ConfigError as e:  # a name another module registered (register)
            problems.append(ConfigError(f"the experiment plugin {name!r} cannot be loaded: {e}"))
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure is the plugin's
            problems.append(ConfigError(_import_failure(name, e)))
        else:
            _loaded.add(name)
            continue
        _forget(set(_OWNERS) - before)
        if not _tolerant[0]:
            break
    return problems


def _forget(registrations: set[str]) -> None:
    """Forget what these registrations (keys of _OWNERS) registered, where the module that made
    them is no longer imported (its import failed): a module of the plugin that did import
    keeps its own, as it will not register them again."""
    gone = {what for what in registrations if _OWNERS[what] not in sys.modules}
    for point, found in _REGISTERED.items():
        for name in [n for n in found if f"the {point} {n!r}" in gone]:
            del found[name]
    for what in gone:
        del _OWNERS[what]


def unload(module: str) -> None:
    """Forget a plugin module and what it (and its submodules) registered: the next load()
    imports it afresh (a notebook that edited its plugin)."""
    gone = [m for m in sys.modules if m == module or m.startswith(f"{module}.")]
    for m in gone:
        del sys.modules[m]
    _loaded.difference_update(gone + [module])
    _forget({what for what, by in _OWNERS.items() if by in gone or by == module})


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
