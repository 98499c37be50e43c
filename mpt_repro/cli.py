"""`mpt-run`: the Hydra application. All settings come from conf/ and the command line.

mpt-run experiment=resnet50 precision=mixed budget=smoke
mpt-run -m experiment=demo precision=fp32,amp seed=0,1,2

Every way a run can end is one short message on the console and an exit status
(docs/reliability.md): 0 completed or diverged (a result); 2 a fault the message explains (bad
input, a busy or finished run directory, an unreadable checkpoint, a full disk or a read-only
folder: it names the key, file or directory and what to do); 130/143 interrupted by
Ctrl-C/SIGTERM after a checkpoint (the message gives the command that resumes); 1 anything else
(the traceback goes to the run's log file and run.json, not to the console). HYDRA_FULL_ERROR=1
shows the tracebacks on the console as well.

This module imports no torch at import time: `--help`, `--version` and shell completion stay fast.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mpt_repro.cmdline import expand_home, syntax_problem, with_plugin_configs
from mpt_repro.config import CONF_DIR, check_command_line, register_configs
from mpt_repro.errors import ConfigError, FinishedRun, Interrupted, UserError, describe

try:
    register_configs()  # the schemas of every plugin's options, before Hydra composes
except ConfigError:
    pass  # a plugin that cannot be imported: main() says so, with exit status 2
log = logging.getLogger("mpt_repro")
PROG = "mpt-run"
# HYDRA_FULL_ERROR=1 as the user set it: unexpected errors then raise with their traceback
_show_tracebacks = False


class _JobFailed(Exception):
    """A job of a sweep failed and said why: the sweep goes on to its other jobs, then exits with
    this status (the first failure's)."""

    def __init__(self, code: int):
        super().__init__(f"exit status {code}")
        self.code = code


# A sweep's jobs as they end: a failed job has printed its own line and returned to Hydra as if
# it completed (Hydra's own report of a failed job is a list of overrides after the last job's
# output); the sweep's last line is then ours, naming the jobs that did not complete.
_sweep_jobs: list[tuple[str, int, bool]] = []  # (overrides, exit status, finished-run refusal)
_sweep_dir: list[Path] = []  # the sweep's folder, as its jobs saw it


# the configuration of a single run was composed, checked and validated by preflight (cli.main
# hands it on through run_checked): the job does not check it again
_checked: list[bool] = [False]


def _job(cfg: DictConfig) -> None:
    """One job: a single run, or one of a sweep's (Hydra calls it in the job's directory, with
    its log file open)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    try:
        from mpt_repro.config import check_overrides_are_read

        if not _checked[0]:  # a sweep's job: composed by Hydra's sweeper, checked here
            check_overrides_are_read(cfg, list(hc.overrides.task))  # before torch loads
        from mpt_repro.machine import pin_for

        pin_for(cfg)  # trainer.portable: the kernels are pinned before torch loads
        from mpt_repro.run import run

        record = run(cfg, run_dir, validated=_checked[0])
    except BaseException as e:  # noqa: BLE001 - every ending gets its message and status
        if isinstance(e, SystemExit):
            raise
        message, code = explain(e, run_dir)
        print(f"{PROG}: {message}", file=sys.stderr)
        _to_log_file(e, message, with_traceback=code == 1 or isinstance(e, OSError))
        if code == 2:  # a refusal: a directory this command created is removed again
            from mpt_repro.preflight import remove_if_new

            remove_if_new(run_dir)
        if _show_tracebacks and code == 1:
            raise
        # A stop by a signal ends a sweep; any other failure ends only its own job.
        if hc.mode == RunMode.MULTIRUN and code not in (130, 143):
            _sweep_dir[:] = [Path(hc.sweep.dir)]
            _sweep_jobs.append((_typed(hc.overrides.task), code, isinstance(e, FinishedRun)))
            return
        sys.exit(code)
    if hc.mode == RunMode.MULTIRUN:
        _sweep_jobs.append((_typed(hc.overrides.task), 0, False))
    _report_end(record, run_dir, Path(cfg.paths.runs_dir))


_main = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(_job)


def run_checked(composed: DictConfig) -> None:
    """A single run on the configuration preflight composed and checked: Hydra's own single-run
    path (hydra.run: run_job makes the run directory, opens the log file and calls the job),
    without composing twice more (Hydra's main composes once to learn the mode, once to run)."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict, read_write

    with read_write(composed), open_dict(composed):
        composed.hydra.mode = RunMode.RUN
    _checked[0] = True
    try:
        done = run_job(
            hydra_context=HydraContext(config_loader=None, callbacks=Callbacks(composed)),
            task_function=_job,
            config=composed,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
            configure_logging=True,
        )
    finally:
        _checked[0] = False
    _ = done.return_value  # raises what the job raised, as Hydra's run does


def _typed(overrides: list[str]) -> str:
    """A job's overrides as the user typed them: Hydra's sweeper escapes `:` `,` `=` and the
    like with a backslash (`mypkg.nets\\:make_net`)."""
    return " ".join(re.sub(r"\\(.)", r"\1", o) for o in overrides)


def _sweep_failure() -> _JobFailed | None:
    """After a sweep: one line naming the jobs that did not complete, and the failure (the first
    one's status), or None when every job completed."""
    failed = [(o, code, finished) for o, code, finished in _sweep_jobs if code]
    if not failed:
        return None
    if len(failed) == len(_sweep_jobs) and all(code == 2 for _, code, _ in failed) and _sweep_dir:
        from mpt_repro.preflight import remove_sweep_if_new

        remove_sweep_if_new(_sweep_dir[0])  # every job refused: Hydra's multirun.yaml goes too
    others = ", and the others ran" if len(failed) < len(_sweep_jobs) else ""
    names = "; ".join(o for o, _, _ in failed[:3]) + ("; ..." if len(failed) > 3 else "")
    hint = ""
    if any(finished for _, _, finished in failed):
        from mpt_repro.rundir import resume_command  # launched here: the whole sweep's command

        hint = f". To keep the finished runs and run the rest: {resume_command(_sweep_dir[0])}"
    print(
        f"{PROG}: error: {len(failed)} of the sweep's {len(_sweep_jobs)} jobs did not complete "
        f"({names}); each said why above{others}{hint}",
        file=sys.stderr,
    )
    return _JobFailed(failed[0][1])


def _report_end(record: dict, run_dir: Path, runs_root: Path) -> None:
    """The closing block: status, final metrics, cost, where the record, figures and TensorBoard
    events are, and how to compare (WARNING for anything but a clean, finite completion)."""
    from mpt_repro.runlog.closing import log_closing_block

    log_closing_block(record, run_dir, runs_root, logger=log)


def explain(e: BaseException, run_dir: Path | None = None) -> tuple[str, int]:
    """The console message and exit status for an exception that ended a run."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(e, Interrupted):
        return _stopped(e, run_dir), e.exit_code
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)", 130
    if isinstance(e, _JobFailed):
        return "a job of the sweep failed (its message is above)", e.code
    if isinstance(e, UserError):
        return f"error: {e}", 2
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        return f"error: {_first_lines(str(e), 12)}", 2
    disk = _disk_problem(e, run_dir) if isinstance(e, OSError) else None
    if disk:
        return disk, 2
    if isinstance(e, ValueError) and "Unable to configure handler" in str(e):
        # Hydra could not open the run's log file: the folder went read-only after the checks
        return (
            f"error: cannot write the log file in {run_dir or 'the run directory'}: choose a "
            "writable results folder with paths.runs_dir=DIR",
            2,
        )
    if isinstance(e, UnicodeDecodeError):
        return (
            f"error: a file is not valid {e.encoding} text ({e.reason} at byte {e.start}); the "
            f"traceback in {_log_hint(run_dir)} names it",
            1,
        )
    return f"error: {describe(e)} (traceback: {_log_hint(run_dir)})", 1


def _disk_problem(e: OSError, run_dir: Path | None) -> str | None:
    """The message for a write the disk, a limit or the folder's permissions refused, or None."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"error: no space left on the device holding {e.filename or run_dir}: free space, "
            "then run the same command again (with resume=true if the run had a checkpoint)"
        )
    if e.errno == errno.EFBIG:
        from mpt_repro.errors import file_size_limit

        limit = file_size_limit()
        shown = f"ulimit -f: {limit} bytes" if limit is not None else "the file system's limit"
        return (
            f"error: could not write {e.filename or 'a file in ' + str(run_dir)}: it would be "
            f"larger than the largest file this process may write ({shown}); raise the limit "
            "(ulimit -f unlimited), then run the same command again (with resume=true if the "
            "run had a checkpoint)"
        )
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"error: cannot write {e.filename or run_dir} ({e.strerror}): choose a writable "
            "results folder with paths.runs_dir=DIR (or hydra.run.dir=DIR)"
        )
    return None


def _stopped(e: Interrupted, run_dir: Path | None) -> str:
    from mpt_repro.checkpoint import has_checkpoint

    if run_dir is not None and run_dir.is_dir() and not has_checkpoint(run_dir):
        return (
            f"interrupted: stopped by {e.signal_name} before the run saved a checkpoint (its "
            "record says failed); run the same command again to start it afresh"
        )
    return f"interrupted: {e}. Continue with: {_resume(run_dir)}"


def _first_lines(text: str, n: int) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    shown = "\n".join(lines[:n])
    return shown[:2000]


def _resume(run_dir: Path | None) -> str:
    from mpt_repro.rundir import resume_command

    return resume_command(run_dir) if run_dir is not None else f"{PROG} ... resume=true"


def _log_files() -> list[logging.FileHandler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


def _log_hint(run_dir: Path | None) -> str:
    files = [h.baseFilename for h in _log_files()]
    if files:
        return files[0]
    return str(run_dir / "run.json") if run_dir is not None else "HYDRA_FULL_ERROR=1"


def _to_log_file(e: BaseException, message: str, with_traceback: bool) -> None:
    """The message, and for an unexpected error its traceback, go to the run's log file only:
    the console keeps its one line."""
    exc_info = (type(e), e, e.__traceback__) if with_traceback else None
    record = logging.LogRecord(
        "mpt_repro", logging.ERROR, __file__, 0, "%s: %s", (PROG, message), exc_info
    )
    for handler in _log_files():
        handler.handle(record)


def _plain_run(argv: list[str]) -> bool:
    """A command line of overrides alone (no -m, no Hydra flag such as --cfg or -cp): the run
    preflight composed is the one Hydra would compose."""
    return all(not a.startswith("-") for a in argv)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mpt-repro")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _checked_command_line(argv: list[str]) -> list[str]:
    """The command line Hydra gets (`~` expanded, the plugins' config folders on its search
    path), after every refusal of the configuration or of the run directory: before torch loads
    and before Hydra creates the run directory and its log file (mpt_repro/preflight.py)."""
    # `~` in a path is the home folder everywhere (Hydra would create a folder named `~`)
    argv = expand_home(argv)
    problem = syntax_problem(argv)
    if problem is None:
        try:  # the plugins (mpt_repro/registry.py) and their config folders
            register_configs()
            argv = with_plugin_configs(argv)
        except ConfigError as e:
            problem = str(e)
    sys.argv[1:] = argv
    problem = problem or check_command_line(argv)
    if problem is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    from mpt_repro.preflight import preflight

    problem = preflight(argv)
    if problem is not None:
        print(f"{PROG}: {problem}", file=sys.stderr)
        sys.exit(2)
    return argv


def main() -> None:
    global _show_tracebacks
    # A full disk or a vanished log folder must not turn every later log line into a traceback
    # on the console ("--- Logging error ---"): the failure itself is reported once, below.
    logging.raiseExceptions = False
    argv = sys.argv[1:]
    if "--version" in argv:  # Hydra's own --version would print Hydra's version
        print(f"{PROG} (mpt-repro) {version()}")
        return
    if "--help" in argv or "-h" in argv:  # ours: the groups a user picks, in a second
        from mpt_repro.registry import load_available
        from mpt_repro.usage import short_help

        failed = load_available()  # the help lists what the plugins that import bring
        print(short_help(), end="")
        for problem in failed:
            print(f"Not listed: {problem}")
        return
    if "--help-all" in argv:  # Hydra's: every group and the whole composed configuration
        argv = ["--help" if a == "--help-all" else a for a in argv]
    from mpt_repro.machine import asked_on_command_line, pin

    if asked_on_command_line(argv):  # trainer.portable=true: before anything loads torch
        pin()
    argv = _checked_command_line(argv)  # exits 2 with one line where the run cannot happen
    # Hydra prints its own errors with a stripped traceback and exits 1; with HYDRA_FULL_ERROR
    # it raises them instead, and the lines below turn them into one message and a status.
    user_full_error = os.environ.get("HYDRA_FULL_ERROR")
    _show_tracebacks = user_full_error == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        from mpt_repro.preflight import CHECKED

        single = CHECKED[0] if len(CHECKED) == 1 and _plain_run(argv) else None
        run_checked(single) if single is not None else _main()
        failure = _sweep_failure()
        if failure is not None:
            raise failure
    except BrokenPipeError:  # `mpt-run --help | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except Exception as e:
        if user_full_error == "1" and not isinstance(e, _JobFailed):
            raise
        message, code = explain(e, None)
        if not isinstance(e, _JobFailed):
            print(f"{PROG}: {message}", file=sys.stderr)
        sys.exit(code)
    except KeyboardInterrupt:  # outside a run (while composing the config)
        print(f"{PROG}: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
    finally:
        if user_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_full_error


if __name__ == "__main__":
    main()
