"""What mpt-run checks before Hydra starts a job: every refusal of a command happens here, before
torch is imported and before anything is created on disk.

Hydra creates a job's run directory and its log file before the job's code runs, so a command
refused inside the job would leave an empty `<run dir>/mpt-run.log` behind, and a refusal that
waited for torch to load took seconds. Here each job's configuration is composed with Hydra's
compose API (a sweep is expanded the way Hydra's basic sweeper does it), then:

1. keys the run would not read are refused (`config.check_overrides_are_read`);
2. values are validated (`config.validate`: ranges, finiteness, paths);
3. for a single run, its directory is judged as the run itself will judge it (`rundir.plan_run`):
   a finished run without resume=true or overwrite=true, a busy directory, a folder that cannot be
   written. A sweep's job that finds its run finished says so itself and the sweep goes on.

A type error gets a message with the key and the type it needs (`data.batch_size=abc: needs an
integer`), not Hydra's "Error merging override".
"""

from __future__ import annotations

import tempfile
import typing
from pathlib import Path
from typing import Any

# the flags with which Hydra starts no job: nothing to check
NO_JOB_FLAGS = ("help", "hydra_help", "cfg", "info", "shell_completion", "resolve")
LOG_FILE = "mpt-run.log"  # Hydra's job log (conf/config.yaml hydra.job.name)
# the run directories this command will create: {run dir: the first of its folders that did not
# exist}; a job refused after Hydra created its directory removes it again (remove_if_new)
NEW_DIRECTORIES: dict[str, Path] = {}
# a single run's configuration as composed and checked here, Hydra's node included: mpt-run
# hands it to the job (cli.run_checked) instead of composing it twice more
CHECKED: list[Any] = []


def preflight(argv: list[str]) -> str | None:
    """Why the command line cannot run (one message), or None."""
    from hydra._internal.utils import get_args_parser

    from mpt_repro.cmdline import with_plugin_configs

    try:
        args, _ = get_args_parser().parse_known_args(with_plugin_configs(argv))
    except SystemExit:  # a malformed flag: Hydra says so itself
        return None
    if any(getattr(args, flag, None) for flag in NO_JOB_FLAGS):
        return None
    problem = special_config_file()
    if problem:
        return f"error: {problem}"
    try:
        jobs = expand(list(args.overrides or []), multirun=bool(args.multirun))
    except Exception:  # noqa: BLE001 - a syntax error: Hydra reports it with its own message
        return None
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mpt_repro.config import CONF_DIR, register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(
            config_dir=str(CONF_DIR), version_base="1.3", job_name="mpt-run"
        ):
            seen: dict[tuple, list[str]] = {}
            CHECKED.clear()
            for job in jobs:
                try:
                    cfg = compose("config", overrides=job, return_hydra_config=True)
                except Exception as e:  # noqa: BLE001 - every composition error gets its line
                    return composition_message(e, job)
                composed = cfg.copy()  # check_job takes the Hydra node away
                problem = duplicate(seen, job_dir(cfg, not args.multirun), job)
                problem = problem or check_job(cfg, job, single=not args.multirun)
                if problem:
                    return problem
                if not args.multirun:
                    CHECKED.append(composed)
    finally:
        GlobalHydra.instance().clear()
    return None


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The jobs of a command line, each as its override strings (one job without -m)."""
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return BasicSweeper.split_arguments(parsed, None)[0]


def check_job(cfg: Any, job: list[str], single: bool) -> str | None:
    """The refusal of one composed job, or None."""
    from omegaconf import open_dict

    from mpt_repro.config import check_data_folder, check_overrides_are_read, validate
    from mpt_repro.errors import UserError

    problem = name_problem(cfg)
    if problem:
        return f"error: {problem}"
    task_overrides = list(cfg.hydra.overrides.task)
    run_dir = job_dir(cfg, single)
    with open_dict(cfg):
        del cfg["hydra"]  # what the job sees: the run's own configuration
    try:
        check_overrides_are_read(cfg, task_overrides)
        validate(cfg)
        check_data_folder(cfg)  # the run needs its data set's folder
    except UserError as e:
        return f"error: {e}"
    problem = task_target_problem(str(cfg.get("task")))
    if problem:
        return f"error: {problem}"
    problem = unwritable(run_dir)
    if problem:
        return f"error: {problem}"
    note_if_new(run_dir)
    if single:
        return directory_refusal(run_dir, bool(cfg.resume), bool(cfg.overwrite), cfg.data)
    return None


def special_config_file() -> str | None:
    """A config file (conf/, a plugin's config folder) that is not a regular file: Hydra would
    wait on a FIFO for ever while composing. Asked of the file system, nothing opened."""
    from mpt_repro.catalog import conf_dirs
    from mpt_repro.record import not_a_regular_file

    for folder in conf_dirs():
        for path in sorted(Path(folder).rglob("*.yaml")):
            what = not_a_regular_file(path)
            if what:
                return (
                    f"{path} is {what}, not a config file: mpt-run never opens it. Remove it, "
                    "then run the same command again"
                )
    return None


def task_target_problem(kind: str) -> str | None:
    """A task whose class a plugin names in a module Python cannot find: refused here, before
    torch loads and a run directory is made (the class itself is imported only by the run)."""
    from mpt_repro import registry

    target = registry.TASKS.get(kind)
    problem = _module_missing(target.partition(":")[0]) if target else None
    if problem is None:
        return None
    owner = registry._OWNERS.get(f"the task {kind!r}", "its plugin")
    return (
        f"task={kind}: its class {target}, registered by {owner}, is in a module Python cannot "
        f"find ({problem}): fix the plugin's task(...) call, or put that module's folder on "
        "PYTHONPATH"
    )


def _module_missing(module: str) -> str | None:
    """Why Python cannot find `module`, searched as files without importing any package on the
    way (a package's __init__ may import torch: mpt_repro.tasks does); None when it is there."""
    import importlib.util
    from importlib.machinery import PathFinder

    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        spec = None
    for i in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            break
        spec = PathFinder.find_spec(parts[i], list(spec.submodule_search_locations))
    else:
        return None if spec is not None else f"no module named {module!r}"
    return f"no module named {module!r}"


def job_dir(cfg: Any, single: bool) -> Path:
    from omegaconf import OmegaConf

    if single:
        return Path(str(OmegaConf.select(cfg, "hydra.run.dir")))
    return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)


def duplicate(seen: dict[tuple, list[str]], run_dir: Path, job: list[str]) -> str | None:
    """A sweep that lists one run twice (seed=0,0, or optim.lr=0.1,1e-1): one line, instead of
    the second job's "did not complete" (it found the first one's directory busy or finished).
    Jobs that differ but share a folder (data.root is not part of its name) are left to the
    run's own refusal, which names the differing data."""
    from mpt_repro.identity import parse_overrides, render_value

    same = tuple(
        sorted(f"{o.key_or_group}={render_value(o.value())}" for o in parse_overrides(job))
    )
    first = seen.setdefault((run_dir.resolve(), same), job)
    if first is job:
        return None
    shown = " ".join(job) or "(no overrides)"
    return (
        f"error: the sweep lists the same run twice ({shown}): both jobs would write "
        f"{run_dir}. Give each value once (e.g. seed=0,1, not seed=0,0)"
    )


# values that become a folder or file name as they are (the variant folder is escaped instead):
# the key, what it names, an example
PLAIN_NAMES = (
    ("hydra.job.name", "the run's log file (<run dir>/<name>.log)", "mpt-run"),
    ("experiment_name", "the run's first folder under paths.runs_dir", "demo"),
    ("precision.name", "a folder of the run (<precision>-<budget>)", "amp"),
)


def name_problem(cfg: Any) -> str | None:
    """A name that would put a folder or file elsewhere than the run's own folder
    (`hydra.job.name=../../X` wrote the log outside the runs folder)."""
    from omegaconf import OmegaConf

    for key, role, example in PLAIN_NAMES:
        text = str(OmegaConf.select(cfg, key, default=""))
        if text in ("", ".", "..") or any(c in text for c in "/\\\0"):
            return (
                f"{key}={text!r} names {role}, so it must be a plain name: not empty, no '/' or "
                f"'\\', not '.' or '..' (it would write outside the run's folder). Use e.g. "
                f"{key}={example}"
            )
    return None


def note_if_new(run_dir: Path) -> None:
    first, folder = None, run_dir.resolve()
    while not folder.exists() and folder != folder.parent:
        first, folder = folder, folder.parent
    if first is not None:
        NEW_DIRECTORIES[str(run_dir.resolve())] = first


def remove_if_new(run_dir: Path) -> None:
    """A job refused in a directory this command created leaves nothing behind: its log file
    (Hydra opened it before the job's code ran) and the folders, emptied, up to the first that
    did not exist. A folder that holds anything else stays."""
    import logging

    first = NEW_DIRECTORIES.get(str(Path(run_dir).resolve()))
    folder = Path(run_dir).resolve()
    if first is None or any(p.name not in (LOG_FILE, ".lock") for p in folder.iterdir()):
        return  # not ours, or the run got as far as writing its record: it stays
    root = logging.getLogger()
    for handler in list(root.handlers):
        name = getattr(handler, "baseFilename", None)
        if name and Path(name).parent == folder:
            root.removeHandler(handler)
            handler.close()
    (folder / LOG_FILE).unlink(missing_ok=True)
    while True:
        try:
            folder.rmdir()  # only an empty folder
        except OSError:
            return
        if folder == first:
            return
        folder = folder.parent


def remove_sweep_if_new(sweep_dir: Path) -> None:
    """A sweep whose every job was refused, in a folder this command created: Hydra's
    multirun.yaml goes too, then the emptied folders up to the first that did not exist."""
    folder = Path(sweep_dir).resolve()
    mine = [f for f in NEW_DIRECTORIES.values() if f == folder or f in folder.parents]
    if not mine or any(p.name != "multirun.yaml" for p in folder.iterdir()):
        return
    first = min(mine, key=lambda f: len(f.parts))
    (folder / "multirun.yaml").unlink(missing_ok=True)
    while True:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == first:
            return
        folder = folder.parent


def unwritable(run_dir: Path) -> str | None:
    """Why the run directory cannot be written (its nearest existing folder is read-only), or
    None. Probed by creating and removing a temporary file: permission bits lie to root and say
    nothing of a read-only mount."""
    folder = run_dir
    try:
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
    except OSError as e:  # a folder name past the file system's 255 bytes
        return (
            f"cannot use {run_dir} ({e.strerror or e}: a folder name of "
            f"{max(len(p.encode()) for p in run_dir.parts)} bytes): choose a shorter "
            "paths.runs_dir=DIR"
        )
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        return (
            f"cannot write {run_dir} ({folder} is not writable: {reason}): choose a writable "
            "results folder with paths.runs_dir=DIR"
        )
    return None


def directory_refusal(run_dir: Path, resume: bool, overwrite: bool, data: Any = None) -> str | None:
    """The refusal the run would give for its directory (rundir.plan_run, the lock), or None."""
    from mpt_repro.errors import RunDirError
    from mpt_repro.rundir import busy_message, inspect_run_dir, lock_holder, plan_run

    if not run_dir.is_dir():
        return None
    holder = lock_holder(run_dir)
    if holder is not None:
        return f"error: {busy_message(run_dir, holder)}"
    try:
        plan_run(inspect_run_dir(run_dir), resume, overwrite, data)
    except RunDirError as e:
        return f"error: {e}"
    return None


# -- a composition error, in the user's terms ------------------------------------------------------
def composition_message(e: BaseException, overrides: list[str] | None = None) -> str:
    """One message for a failed composition: the key and the type it needs for a value of the
    wrong type, Hydra's own first lines otherwise (an unknown option lists the known ones).
    `overrides`: the command line's, to tell a key the user set from one a config file set."""
    cause = e.__cause__ or e.__context__
    key = getattr(cause, "full_key", None)
    if key and "not in" in str(cause):  # a key the option's schema does not have
        from mpt_repro.config import not_a_setting

        typed = overrides is None or any(
            o.lstrip("+~").split("=", 1)[0] == key for o in overrides
        )  # fmt: skip
        schema = getattr(cause, "object_type", None)
        return "error: " + not_a_setting(key, schema=schema, typed=typed)
    if key:
        value = _offending_value(str(e), key)
        needs = type_needed(key)
        if needs:
            shown = f"{key}={value}" if value is not None else key
            got = "an empty value" if value == "" else f"{value!r}"
            return (
                f"error: {shown}: {key} needs {needs}, got {got}. Fix it on the command line, "
                f"e.g. {key}={_example(needs)}"
            )
    missing = _missing_option(str(e))
    if missing:
        return "error: " + missing
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return "error: " + "\n".join(lines[:12])[:2000]


def _missing_option(message: str) -> str | None:
    """Hydra's "Could not find 'budget/quick'" with its options and its search path, as one line
    naming the nearest option and the group's options (an option of no group: the groups)."""
    import re

    from mpt_repro.catalog import options, unknown_option

    found = re.search(r"Could not find '([^']+)'", message)
    if not found:
        return None
    group, _, option = found.group(1).rpartition("/")
    if not group:
        return f"there is no config {option!r}; see mpt-run --help"
    return unknown_option(group, option, options(group) or _hydra_options(message))


def _hydra_options(message: str) -> list[str]:
    """The options Hydra's message lists (a group of Hydra's own, which conf/ does not have)."""
    listed = message.split("Available options in", 1)
    known = []
    if len(listed) == 2:
        for line in listed[1].splitlines()[1:]:
            if not line.startswith(("\t", "  ")) or "=" in line:
                break
            known.append(line.strip())
    return known


def _offending_value(message: str, key: str) -> str | None:
    """The value of `key=value` in Hydra's "Error merging override key=value"."""
    marker = f"{key}="
    for word in message.replace("'", " ").split():
        if word.startswith(marker) or word.startswith(f"+{marker}"):
            return word.split("=", 1)[1]
    return None


def type_needed(key: str) -> str | None:
    """What the schema says `key` takes, in words ("an integer", "a number or null", ...)."""
    from mpt_repro.config import Config, _schema_fields

    hint = dict(_schema_fields(Config, "")).get(key)
    if hint is None:
        return None
    optional = type(None) in typing.get_args(hint)
    base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = typing.get_origin(base[0]) or base[0]
    words = {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "text",
        list: "a list, e.g. [a,b]",
        dict: "a mapping",
    }
    if isinstance(base, type) and hasattr(base, "__members__"):  # an Enum: its member names
        return "one of " + ", ".join(base.__members__)
    text = words.get(base)
    if text is None:
        return None
    return f"{text} or null" if optional else text


def _example(needs: str) -> str:
    if needs.startswith("one of "):
        return needs.removeprefix("one of ").split(",")[0]
    return {"an integer": "8", "a number": "0.1", "true or false": "true"}.get(
        needs.removesuffix(" or null"), "..."
    )
