"""scripts/mutants.py (make mutants) on small files of its own: which mutants it makes, --list,
and real runs of a tiny package's tests: a kill, a timeout reported as one, a failing baseline."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
mutants = importlib.util.module_from_spec(spec)
sys.modules["mutants"] = mutants  # dataclasses look their module up by name
spec.loader.exec_module(mutants)

SAMPLE = """\
import logging

LIMIT = 1


class Box:
    size: int = 0

    def fill(self, items):
        total = 0
        for x in items:
            total += x
        self.total = total
        total = min(total, LIMIT)
        logging.info("filled")
        return total
"""


def test_deletion_mutants_drop_calls_and_assignments_that_leave_running_code() -> None:
    tree = ast.parse(SAMPLE)
    deleted = [(s.kind, s.what) for s in mutants.sites(tree) if s.kind.startswith("delete")]
    # not `total = 0` (its deletion is an unbound local at once), nor module or class lines
    assert sorted(deleted) == [
        ("delete-assign", "deleted: self.total = total"),
        ("delete-assign", "deleted: total += x"),
        ("delete-assign", "deleted: total = min(total, LIMIT)"),
        ("delete-call", "deleted: logging.info('filled')"),
    ]
    for i, site in enumerate(mutants.sites(tree)):
        text, _ = mutants.mutate(SAMPLE, i)
        compile(text, "sample.py", "exec")  # every mutant is valid Python
        if site.what == "deleted: logging.info('filled')":
            assert "logging.info" not in text and "pass" in text


def test_list_prints_the_mutants_by_kind_and_runs_nothing(tmp_path: Path, capsys) -> None:
    (tmp_path / "sample.py").write_text(SAMPLE)
    argv = ["--list", "--files", "sample.py", "--kinds", "delete-call", "delete-assign"]
    assert mutants.main([*argv, "--json", str(tmp_path / "m.json")], root=tmp_path) == 0
    out = capsys.readouterr().out
    assert "sample.py:15 delete-call: deleted: logging.info('filled')" in out
    assert "4 mutants (1 delete-call, 3 delete-assign)" in out
    record = json.loads((tmp_path / "m.json").read_text())
    assert {m["verdict"] for m in record["mutants"]} == {""}  # listed, not run


FAKE = """\
def add(a, b):
    return a + b


def delay():
    return 0
"""
FAKE_TESTS = """\
import time

import fake


def test_add():
    assert fake.add(2, 3) == 5


def test_delay():
    time.sleep(fake.delay() * 600)
"""


def fake_package(tmp_path: Path, tests: str = FAKE_TESTS) -> list[str]:
    (tmp_path / "fake.py").write_text(FAKE)
    (tmp_path / "test_fake.py").write_text(tests)
    return ["--files", "fake.py", "--tests", "test_fake.py"]


def test_a_killed_mutant_and_a_timeout_are_told_apart(tmp_path: Path) -> None:
    """Two real runs after the baseline: + for - fails test_add; delay 0 -> 1 sleeps ten minutes
    and is stopped at the limit. The limit is this machine's own: 3 x the unmutated run measured
    here, plus 5 s (a fixed 10 s failed under load, issue 34: a loaded machine took longer than
    that to start pytest for the killed mutant)."""
    fake_package(tmp_path)
    verdict, seconds, out = mutants.run_tests(tmp_path, ["test_fake.py"], timeout=600)
    assert verdict == "passed", out
    limit = f"{3 * seconds + 5:.1f}"
    argv = [*fake_package(tmp_path), "--timeout", limit, "--json", str(tmp_path / "m.json")]
    assert mutants.main(argv, root=tmp_path, parts=("fake.py", "test_fake.py")) == 0
    record = json.loads((tmp_path / "m.json").read_text())
    found = {(m["line"], m["what"]): m["verdict"] for m in record["mutants"]}
    assert found == {(2, "Add -> Sub"): "killed", (6, "constant 0 -> 1"): "timeout"}
    assert record["verdicts"] == {"killed": 1, "timeout": 1}


def test_a_failing_baseline_stops_before_any_mutant(tmp_path: Path) -> None:
    argv = fake_package(tmp_path, tests="def test_broken():\n    assert False\n")
    with pytest.raises(SystemExit, match="the baseline run failed on the unmutated code"):
        mutants.main(argv, root=tmp_path, parts=("fake.py", "test_fake.py"))


def test_the_readme_s_make_mutants_runs_the_script_and_its_sample_lists(tmp_path: Path) -> None:
    """README's `make mutants MAX=40`, as make expands it; its sample listed (a full run of 40
    mutants takes an hour or more)."""
    # as a user's shell runs it: not as a sub-make of `make test` (which prints its directory)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    made = (
        subprocess.run(
            ["make", "--no-print-directory", "-n", "mutants", "MAX=40"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        .stdout.splitlines()[-1]
        .rstrip()
    )
    assert made == ".venv/bin/python scripts/mutants.py --max 40"
    out = subprocess.run(
        [sys.executable, "scripts/mutants.py", "--max", "40", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "\n40 mutants (" in out and len(out.strip().splitlines()) == 42
