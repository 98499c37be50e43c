"""The command line as typed (issue 34): malformed overrides, unknown options and unknown choices
are one line and exit 2; `~` is the home folder in every path; names that become folders or files
are plain names."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import MPT_RUN, ROOT

from mpt_repro.cmdline import expand_home, syntax_problem
from mpt_repro.preflight import preflight


def _refused(*args: str, cwd=ROOT) -> str:
    proc = subprocess.run(
        [MPT_RUN, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("mpt-run: error: ")
    return line.removeprefix("mpt-run: error: ")


def test_home_is_expanded_in_every_path_override_quoted_or_not() -> None:
    home = os.path.expanduser("~")
    argv = ["paths.runs_dir=~/runs", "data.root='~/data'", "+hydra.run.dir=~", "seed=~x"]
    assert expand_home(argv) == [
        f"paths.runs_dir={home}/runs",
        f"data.root='{home}/data'",
        f"+hydra.run.dir={home}",
        "seed=~x",  # not a path: left to Hydra (and refused there)
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--epochs", "3"], "'--epochs' is not an option of mpt-run: settings are given as "
         "key=value overrides, e.g. trainer.epochs=3"),
        (["data.root=/a", "b"], "'b' is not a key=value override; a value with a space must be "
         "quoted"),
        (["optim.lr=a=b"], "'optim.lr=a=b': Hydra cannot read the value 'a=b' of optim.lr: a "
         "value with a space, '=', '~'"),
        (["seed=~1"], "'seed=~1': Hydra cannot read the value '~1' of seed"),
        (["seed=0,1", "-m", "budget=smoke"], "'budget=smoke' follows an option given among the "
         "overrides: give the options first"),
    ],
)  # fmt: skip
def test_what_hydra_cannot_parse_is_said_in_words(argv, expected) -> None:
    assert syntax_problem(argv).startswith(expected)


def test_a_well_formed_command_line_passes() -> None:
    assert syntax_problem(["-m", "seed=0,1", "data.root='/a b'", "--cfg", "job"]) is None


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("hydra.job.name=../../X", "hydra.job.name='../../X' names the run's log file"),
        ("experiment_name=a/b", "experiment_name='a/b' names the run's first folder"),
        ("precision.name=..", "precision.name='..' names a folder of the run"),
    ],
)
def test_names_that_become_folders_are_plain_names(override, expected) -> None:
    problem = preflight(["experiment=demo", override])
    assert problem.startswith(f"error: {expected}") and "must be a plain name" in problem


def test_an_unknown_choice_lists_the_choices_in_one_line() -> None:
    assert preflight(["experiment=demo", "budget=quick"]) == (
        "error: budget=quick: there is no such budget; budget is one of: paper, short, smoke "
        "(e.g. budget=smoke)"
    )


def test_the_real_command_refuses_each_in_one_line(tmp_path) -> None:
    assert _refused("--epochs", "3").startswith("'--epochs' is not an option")
    assert _refused("experiment=demo", "paths.runs_dir=~/a", "b").startswith("'b' is not a")
    assert _refused("budget=quick").startswith("budget=quick: there is no such budget")
    line = _refused("experiment=demo", "hydra.job.name=../../X", cwd=tmp_path)
    assert line.startswith("hydra.job.name='../../X' names the run's log file")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_runs_dir_under_home_lands_in_home_not_in_a_folder_named_tilde(tmp_path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    proc = subprocess.run(
        [MPT_RUN, "experiment=demo", "budget=smoke", "trainer.max_steps=1", "trainer.device=cpu",
         "paths.runs_dir=~/runs", "trainer.progress=false"],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(cwd.iterdir()) == []
    (record,) = (home / "runs").rglob("run.json")
    assert record.parent.is_relative_to(home / "runs" / "demo")


def test_a_sweep_that_lists_one_run_twice_is_refused_as_a_duplicate(tmp_path) -> None:
    """seed=0,0 said one job "did not complete" (it found the other's directory busy)."""
    line = _refused("-m", "experiment=demo", "seed=0,0", f"paths.runs_dir={tmp_path}")
    assert line == (
        f"the sweep lists the same run twice (experiment=demo seed=0 paths.runs_dir={tmp_path}): "
        f"both jobs would write {tmp_path}/demo/fp32-paper/seed0. Give each value once (e.g. "
        "seed=0,1, not seed=0,0)"
    )
    assert list(tmp_path.iterdir()) == []


def test_one_value_spelled_twice_is_a_duplicate_other_data_is_not(tmp_path) -> None:
    runs = f"paths.runs_dir={tmp_path}"
    twice = preflight(["-m", "experiment=demo", "optim.lr=0.1,1e-1", runs])
    assert twice.startswith("error: the sweep lists the same run twice (experiment=demo ")
    # data.root is not part of a folder's name: the run itself names the other data (two
    # folders that are there and not empty: a missing one is refused by the start-up check)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "LibriSpeech").mkdir()
    roots = f"data.root={tmp_path / 'a'},{tmp_path / 'b'}"
    assert preflight(["-m", "experiment=speech", roots, f"{runs}/runs"]) is None
