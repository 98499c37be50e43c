"""mpt-run's front door: fast help and version without torch, and one message per way to end."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from mpt_repro.cli import explain
from mpt_repro.errors import CheckpointError, ConfigError, Interrupted

# The worktree's own code, whatever an installed mpt-run would run.
ENTRY = "import sys; from mpt_repro.cli import main; sys.argv = ['mpt-run', *sys.argv[1:]]; main()"
TORCH_CHECK = (
    "import atexit; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = "import sys; " + TORCH_CHECK + ENTRY.replace("import sys; ", "")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_version_is_mpt_repros() -> None:
    from importlib.metadata import version

    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"mpt-run (mpt-repro) {version('mpt-repro')}"
    assert "torch imported: False" in proc.stdout


def test_help_is_short_names_what_a_user_picks_and_needs_no_torch() -> None:
    """The groups a user chooses, each option with its file's first sentence and the default
    marked; the common keys with their defaults and their schema comments; no internal group."""
    proc = _cli("--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("mpt-run (mpt-repro):") and "overwrite=true" in text
    lines = text.splitlines()
    assert len(lines) < 120 and max(len(line) for line in lines) <= 100
    assert "experiment_budget" not in text and "schema/" not in text and "_base" not in text
    # an option: its name, then the first sentence of conf/precision/mixed.yaml's comment
    assert "\n  mixed                  The paper's recipe, literally (paper §3, apex O2)" in text
    assert " *fp32 " in text and " *demo " in text and " *paper " in text  # config.yaml defaults
    assert "  optim.lr [0.1]         the base learning rate" in text  # config.py's comment
    assert "  data.root [null]       the data set's folder" in text  # schema.py's comment
    assert "mpt-run --help-all" in text and "powered by Hydra" not in text
    assert "torch imported: False" in proc.stdout


def test_help_all_is_hydras_whole_list() -> None:
    proc = _cli("--help-all")
    assert proc.returncode == 0, proc.stderr
    assert "precision: adaptive, amp" in proc.stdout and "experiment_budget:" in proc.stdout
    assert "torch imported: False" in proc.stdout


def test_shell_completion_needs_no_torch() -> None:
    proc = _cli("-sc", "query=bash", env={"COMP_LINE": "mpt-run precision=n", "COMP_POINT": "20"})
    assert proc.returncode == 0, proc.stderr
    assert "precision=no_master" in proc.stdout and "precision=no_scaling" in proc.stdout
    assert "torch imported: False" in proc.stdout


def test_an_unknown_key_is_refused_before_hydra_starts() -> None:
    proc = _cli("experiment=demo", "+optim.lrr=0.1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("mpt-run: error: unknown key 'optim.lrr'")
    assert "torch imported: False" in proc.stdout


def test_a_hydra_composition_error_is_one_message() -> None:
    proc = _cli("experiment=demo", "precision=fp64")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()  # Hydra's options and search path: one line
    assert line.startswith("mpt-run: error: precision=fp64: there is no such precision ")
    assert "(did you mean precision=fp16?); precision is one of: adaptive, amp, " in line
    assert "HYDRA_FULL_ERROR" not in proc.stderr


# -- explain(): the message and the exit status of each ending -----------------------------------
RUN = Path("/results/runs/demo/fp32-smoke/seed0")


@pytest.mark.parametrize(
    "error,code,words",
    [
        (Interrupted(signal.SIGTERM, 12), 143, ["SIGTERM", "step 12", "resume=true"]),
        (Interrupted(signal.SIGINT, 3), 130, ["SIGINT", "step 3", "resume=true"]),
        (KeyboardInterrupt(), 130, ["Ctrl-C"]),
        (ConfigError("optim.lr must be > 0"), 2, ["optim.lr must be > 0"]),
        (CheckpointError("no checkpoint of this run can be read"), 2, ["no checkpoint"]),
        (OSError(errno.ENOSPC, "No space left", "/r/run.json"), 2, ["no space", "/r/run.json"]),
        (OSError(errno.EROFS, "Read-only file system", "/r"), 2, ["paths.runs_dir=DIR"]),
        (PermissionError(errno.EACCES, "Permission denied", "/r"), 2, ["writable"]),
        (OSError(errno.EFBIG, "File too large", "/r/m.csv"), 2, ["/r/m.csv", "ulimit -f"]),
        (RuntimeError("Caught ValueError in DataLoader worker 0.\nOriginal Traceback ..."), 1, []),
    ],
)
def test_each_ending_has_one_line_and_its_status(error, code, words) -> None:
    message, status = explain(error, RUN)
    assert status == code
    assert "\n" not in message and "Traceback" not in message
    for word in words:
        assert word in message, (word, message)


def test_an_unexpected_error_points_at_its_traceback() -> None:
    message, status = explain(ValueError("bad value\nline two"), RUN)
    assert status == 1 and message.startswith("error: ValueError: bad value (traceback: ")


# counts, in a real mpt-run process, how often the configuration is composed and validated
COUNTING = """
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
import mpt_repro.config as config
counts = {"composed": 0, "validated": 0}
load, validate = ConfigLoaderImpl.load_configuration, config.validate
def counted_load(self, *a, **k):
    counts["composed"] += 1
    return load(self, *a, **k)
def counted_validate(cfg):
    counts["validated"] += 1
    return validate(cfg)
ConfigLoaderImpl.load_configuration = counted_load
config.validate = counted_validate
sys.argv = ["mpt-run", *sys.argv[1:]]
from mpt_repro.cli import main
try:
    main()
finally:
    print("COUNTS", counts["composed"], counts["validated"], file=sys.stderr)
"""


@pytest.mark.parametrize("multirun", [False, True])
def test_a_run_composes_and_validates_its_configuration_once(tmp_path, multirun) -> None:
    """A single run: composed and validated once, by the start-up check, whose configuration
    the job receives (Hydra's main would compose it twice more). A sweep's job is composed by
    the check and by Hydra's sweeper: the check must see every job before the first starts."""
    args = ["experiment=demo", "budget=smoke", "trainer.max_steps=1", f"paths.runs_dir={tmp_path}"]
    args = ["-m", *args, "seed=0"] if multirun else args
    done = subprocess.run(
        [sys.executable, "-c", COUNTING, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = tmp_path.rglob("run.json")
    assert '"status": "completed"' in record.read_text()
    composed, validated = map(int, done.stderr.split("COUNTS")[1].split())
    # a sweep (the path left to Hydra): the check composes each job, Hydra's main composes for
    # the mode and for the sweep, its launcher composes each job twice (the sweep's config, then
    # the job's); the job validates what the launcher composed
    assert (composed, validated) == ((1, 1) if not multirun else (5, 2))
