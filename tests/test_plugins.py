"""Experiments as plugins (mpt_repro/registry.py): an experiment of one's own, built outside the
package from docs/adding-an-experiment.md's own files, runs under every preset through the real
commands and is reported; the suite's core names no experiment, model or data set; a plugin that
cannot be imported is refused in one line."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpt_repro import catalog, registry

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding-an-experiment.md"
BIN = Path(sys.executable).parent
# the suite's core: it must hold no list or map of experiments, models or data sets
CORE = [
    ROOT / "mpt_repro" / "schema.py",
    ROOT / "mpt_repro" / "config.py",
    ROOT / "mpt_repro" / "tasks" / "__init__.py",
    ROOT / "mpt_repro" / "tasks" / "base.py",
    *sorted((ROOT / "mpt_repro" / "report").glob("*.py")),  # report/tables.py among them
    # mpt-bench and mpt-advise ask the task (Task attributes), never its name
    *sorted((ROOT / "mpt_repro" / "bench").glob("*.py")),
    *sorted((ROOT / "mpt_repro" / "advise").glob("*.py")),
]
# text a command shows a user as its examples (argparse's epilog, a USAGE screen): like a
# docstring, it may cite an experiment as an example
HELP_KEYWORDS = {"epilog", "description", "usage", "help"}
HELP_NAMES = {"USAGE", "EPILOG"}


def doc_files() -> dict[str, str]:
    """The files docs/adding-an-experiment.md shows: a line `path`: then a fenced block."""
    found = re.findall(r"^`([\w/.]+)`:\n\n```\w+\n(.*?)^```", DOC.read_text(), re.S | re.M)
    return dict(found)


def doc_commands() -> list[str]:
    """The commands of the doc's "Running it" block (the first bash block)."""
    block = re.search(r"^```bash\n(.*?)^```", DOC.read_text(), re.S | re.M).group(1)
    return [line for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """The doc's toy experiment written out in a folder of its own, outside the package."""
    folder = tmp_path_factory.mktemp("my_experiments")
    files = doc_files()
    assert set(files) >= {"toyreg/__init__.py", "toyreg/task.py"}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def run_in(folder: Path, command: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """A line of the doc's commands, as a shell runs it in `folder`, with this venv's tools."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")
    env.pop("MPT_PLUGINS", None)
    return subprocess.run(
        ["bash", "-c", command],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def swept(toy: Path) -> Path:
    """The doc's commands, run as written: a sweep of fp32 and mixed over three seeds at the
    smoke budget, then mpt-report."""
    commands = doc_commands()
    assert any(c.startswith("mpt-run -m experiment=toyreg") for c in commands), commands
    done = run_in(toy, " && ".join(commands))
    assert done.returncode == 0, done.stderr[-3000:]
    return toy


def test_an_experiment_of_ones_own_runs_under_every_preset_and_is_reported(swept: Path) -> None:
    records = [json.loads(p.read_text()) for p in swept.glob("results/runs/toyreg/*/*/run.json")]
    assert len(records) == 6
    assert {r["status"] for r in records} == {"completed"}
    assert {r["config"]["precision"]["name"] for r in records} == {"fp32", "mixed"}
    assert {r["config"]["task"] for r in records} == {"toyreg"}
    # every metric carries the count of the examples it rests on
    assert all(r["evaluation"]["items"] == 256 for r in records)
    assert all(r["evaluation"]["unit"] == "examples" for r in records)
    report = (swept / "results" / "report" / "report.md").read_text()
    assert "Toy regression: mean squared error per preset" in report  # the plugin's TaskReport
    assert re.search(r"\| toyreg \| mse \|.*\(n=3; 256 examples\)", report), report[:3000]


def test_the_own_experiment_is_listed_and_checked_like_a_builtin(toy: Path) -> None:
    env = "PYTHONPATH=$PWD MPT_PLUGINS=toyreg"
    listed = run_in(toy, f"{env} mpt-run --help")
    assert re.search(r"^\s+toyreg\s+A toy regression", listed.stdout, re.M), listed.stdout
    # a key the toy's data does not read: refused before torch, as for a built-in experiment
    refused = run_in(toy, f"{env} mpt-run experiment=toyreg data.root=/data")
    assert refused.returncode == 2
    assert "data.root would change nothing in this run" in refused.stderr
    # the model's own check (its schema, registered by the plugin)
    refused = run_in(toy, f"{env} mpt-run experiment=toyreg model.width=0")
    assert refused.returncode == 2 and "model.width must be positive" in refused.stderr


def test_a_plugin_that_cannot_be_imported_is_refused_in_one_line(tmp_path: Path) -> None:
    done = run_in(tmp_path, "MPT_PLUGINS=no_such_plugin mpt-run experiment=demo")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "the experiment plugin 'no_such_plugin' cannot be imported" in lines[0]
    assert "PYTHONPATH" in lines[0] and "MPT_PLUGINS" in lines[0]


def test_the_builtin_experiments_are_plugins_named_by_entry_points() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split('[project.entry-points."mpt_repro.experiments"]')[1].split("\n[")[0]
    named = set(re.findall(r'= "(mpt_repro\.experiments\.\w+)"', section))
    modules = {p.stem for p in (ROOT / "mpt_repro" / "experiments").glob("*.py")}
    registering = {f"mpt_repro.experiments.{m}" for m in modules if "registry import" in _source(m)}
    assert named == registering  # every plugin module is named, and nothing else
    assert set(registry.plugin_modules()) >= named
    # the tasks the experiment files use are exactly the ones the plugins register
    assert {e.task for e in catalog.experiments().values()} == set(registry.task_kinds())


def _source(module: str) -> str:
    return (ROOT / "mpt_repro" / "experiments" / f"{module}.py").read_text()


def _code_words(path: Path) -> set[str]:
    """The identifiers and the words of the string constants of a module, docstrings and
    comments left out (they may cite an experiment as an example)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    docstrings |= {id(c) for c in _help_constants(tree)}
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                words |= set(re.findall(r"\w+", node.value))
        elif isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.arg):
            words.add(node.arg)
    return words


def _help_constants(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module's help text: argparse keywords (epilog=...) and
    module-level USAGE or EPILOG screens."""
    roots: list[ast.AST] = [
        k.value for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords
        if k.arg in HELP_KEYWORDS
    ]  # fmt: skip
    roots += [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id in HELP_NAMES for t in n.targets)
    ]  # fmt: skip
    return [c for r in roots for c in ast.walk(r) if isinstance(c, ast.Constant)]


def test_the_core_names_no_experiment_model_or_data_set() -> None:
    names = set(catalog.experiments()) | set(catalog.options("model"))
    names |= set(catalog.options("data"))
    for schemas in registry.option_schemas().values():
        names |= set(schemas)
    # the generic options every experiment may take (your own model; made-up images) are the
    # core's to know; "images" (the unlabelled image folder's schema) is also the word for them
    names -= {"custom", "synthetic", "images"}
    assert len(names) > 25
    for path in CORE:
        found = _code_words(path) & names
        assert not found, f"{path.relative_to(ROOT)} names {sorted(found)}"


def test_bench_advise_and_the_report_ask_the_task_not_its_name() -> None:
    """mpt-bench, mpt-advise and mpt-report branch on what a task says (Task attributes, its
    TaskReport), never on its kind: no task kind appears in their code."""
    kinds = set(registry.task_kinds())
    assert {"classification", "gan"} <= kinds
    asking = [p for p in CORE if p.parent.name in ("bench", "advise", "report")]
    assert len(asking) > 20
    for path in [*asking, ROOT / "mpt_repro" / "tasks" / "base.py"]:
        found = _code_words(path) & kinds
        assert not found, f"{path.relative_to(ROOT)} names the task kinds {sorted(found)}"


def test_the_cores_settings_name_no_task() -> None:
    """A setting only some tasks read lives in their plugins: in an option's schema (the
    classifiers' model.label_smoothing, the detection data's max_size), or, for a trainer
    setting, in the plugin's word that its task acts on it (schema.honours). No read_when of
    config.py names a task kind, and no other word of config.py or schema.py does."""
    kinds = set(registry.task_kinds())
    assert {"classification", "detection", "language_model"} <= kinds
    config_py, schema_py = ROOT / "mpt_repro" / "config.py", ROOT / "mpt_repro" / "schema.py"
    calls = [
        node
        for node in ast.walk(ast.parse(config_py.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "read_when"
    ]
    assert len(calls) > 10  # the optimizer's, the schedule's, the loss scaling's...
    for call in calls:
        selector, *targets = [a.value for a in call.args if isinstance(a, ast.Constant)]
        assert selector != "task" and not set(targets) & kinds, ast.unparse(call)
    for path in (config_py, schema_py):
        found = _code_words(path) & kinds
        assert not found, f"{path.relative_to(ROOT)} names the task kinds {sorted(found)}"


def test_the_readme_shows_the_commands_this_module_runs() -> None:
    """README's own-experiment commands are the doc's, which the sweep above runs as written."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Your own experiment, not only your own model")[1]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M).group(1)
    assert [line for line in block.splitlines() if line.strip()] == doc_commands()
    assert "docs/adding-an-experiment.md" in section.split("\n## ")[0]


def test_mpt_bench_measures_the_own_experiment(toy: Path, tmp_path: Path) -> None:
    """The doc's mpt-bench command, with fewer steps: the table has both presets, and the
    device-free proxies (bytes saved for backward) show mixed's FP16 activations."""
    block = DOC.read_text().split("The benchmark takes it the same way")[1]
    command = re.search(r"^```bash\n(mpt-bench .*?)\n```", block, re.S | re.M).group(1)
    quick = (
        f"{command} bench.warmup=1 bench.steps=2 bench.overhead_steps=0 bench.out_dir={tmp_path}"
    )
    done = run_in(toy, f"PYTHONPATH=$PWD MPT_PLUGINS=toyreg {quick}")
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = tmp_path.glob("toyreg-*.json")
    rows = {r["preset"]: r for r in json.loads(written.read_text())["results"]}
    assert set(rows) == {"fp32", "mixed"}
    assert rows["mixed"]["saved_bytes_per_sample"] < rows["fp32"]["saved_bytes_per_sample"]
    # its micro-batches hold their examples on the first dimension (Task.examples_on_first_dim):
    # the bytes per example are a slope between two cuts, as for the paper's image tasks
    assert rows["fp32"]["detail"]["saved_method"].startswith("slope between batch")


def test_a_checkout_used_without_installing_finds_its_own_plugins(monkeypatch) -> None:
    """The GPU check runs the checkout from PYTHONPATH, with no package metadata (so no entry
    points): the built-in plugins are then the modules of mpt_repro.experiments."""
    import importlib.metadata

    installed = registry.plugin_modules()
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    monkeypatch.setenv("MPT_PLUGINS", "toyreg")
    found = registry.plugin_modules()
    assert found[-1] == "toyreg"  # MPT_PLUGINS after the built-in ones
    assert set(found[:-1]) == set(installed)


def test_a_plugin_that_registers_a_name_already_taken_is_refused(tmp_path: Path) -> None:
    """A second registration of a task kind (or of an option's schema) would silently replace
    the first: refused in one line naming both modules."""
    (tmp_path / "twice.py").write_text(
        "from mpt_repro.registry import task\ntask('classification', 'twice:Mine')\n"
    )
    done = run_in(tmp_path, "PYTHONPATH=$PWD MPT_PLUGINS=twice mpt-run experiment=demo")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "the task 'classification' is registered twice" in line
    assert "mpt_repro.experiments.classification and by twice" in line
