"""One registry for every extension point (mpt_repro/registry.py): a plugin of one's own, written
out of tree, adds a task, a model and a loss scaler and trains through the real `mpt-run`; a name
registered twice is refused naming both modules, the suite's own lazily imported ones included;
a failed plugin import leaves nothing behind and is tried again at the next load(); the report
reads a metric's unit and direction from what its plugin registered."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from mpt_repro import registry
from mpt_repro.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding-an-experiment.md"
# the doc's command that trains its toy under the toy's own loss scaler, from a scale of the
# user's (a knob the toy's registration declares it reads)
SCALER_COMMAND = (
    "mpt-run experiment=toyreg precision=mixed precision.loss_scaling=backoff "
    "precision.init_scale=1024"
)


def doc_files() -> dict[str, str]:
    """The files docs/adding-an-experiment.md shows: a line `path`: then a fenced block."""
    found = re.findall(r"^`([\w/.]+)`:\n\n```\w+\n(.*?)^```", DOC.read_text(), re.S | re.M)
    return dict(found)


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """The doc's plugin (a task, a model and a loss scaler, each registered by import path from
    its torch-free module: the task never imports the model's module, nothing names the
    scaler's), written out of tree and trained once through the real mpt-run with its own
    scaler: the run's run.json."""
    files = doc_files()
    assert {"toyreg/__init__.py", "toyreg/nets.py", "toyreg/scaling.py"} <= set(files)
    assert "import nets" not in files["toyreg/task.py"]
    folder = write(tmp_path_factory.mktemp("plugin"), files)
    run_dir = folder / "run"
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    assert f"{SCALER_COMMAND} budget=smoke" in DOC.read_text()
    run_cli(
        *SCALER_COMMAND.split()[1:],
        "budget=smoke",
        "trainer.device=cpu",
        "precision.min_scale=2",  # the other knob it declares
        run_dir=run_dir,
        env={"PYTHONPATH": path, "MPT_PLUGINS": "toyreg", "OMP_NUM_THREADS": "1"},
    )
    return json.loads((run_dir / "run.json").read_text())


def test_a_plugin_task_model_and_scaler_train_through_mpt_run(trained: dict) -> None:
    assert trained["status"] == "completed"
    assert trained["task"] == "toyreg" and trained["primary_metric"] == "mse"
    assert trained["model"]["name"] == "toyreg_mlp"  # built through the registry
    assert trained["model"]["parameters"] == (1 + 1) * 32 + (32 + 1) * 32 + (32 + 1) * 1
    assert trained["loss_scale"]["kind"] == "backoff"  # the plugin's scaler, by its name
    # the declared knobs were taken, and the scaler started from the user's scale
    assert trained["loss_scale"]["initial"] == 1024.0
    assert trained["config"]["precision"]["min_scale"] == 2.0
    assert (
        "backoff-only loss scale 1024 (precision.loss_scaling=backoff"
        in (trained["diagnostics"]["describe"])
    )
    assert trained["loss_scale"]["final"] <= trained["loss_scale"]["initial"]  # never grown
    assert "mse" in trained["metrics"]


@pytest.fixture
def plugins_named(monkeypatch, tmp_path):
    """Name plugin modules written into tmp_path (MPT_PLUGINS, sys.path), in this process;
    what they registered is forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a rewritten module is read afresh
    named: list[str] = []

    def name(*modules: str) -> None:
        named.extend(modules)
        monkeypatch.setenv("MPT_PLUGINS", ",".join(modules))

    yield name
    for module in named:
        registry.unload(module)


@pytest.mark.parametrize(
    "registration, refusal",
    [
        (
            'model("resnet50", "twin:build")',
            "the model 'resnet50' is registered twice, by mpt_repro.models.vision and by twin",
        ),
        (
            'loss_scaler("dynamic", "twin:Mine")',
            "the loss scaler 'dynamic' is registered twice, by mpt_repro.precision.scalers and "
            "by twin",
        ),
        (
            'metric("top1", higher_is_better=False)',
            "the metric 'top1' is registered twice, by mpt_repro.experiments.classification "
            "and by twin",
        ),
        (
            'task("gan", "twin:Mine")',
            "the task 'gan' is registered twice, by mpt_repro.experiments.gan and by twin",
        ),
    ],
)
def test_a_name_registered_twice_is_refused_naming_both_modules(
    tmp_path: Path, plugins_named, registration: str, refusal: str
) -> None:
    """The suite's own models and scalers are refused before their modules (torch) are even
    imported; the plugin's other registrations are forgotten with it."""
    lines = ["from mpt_repro.registry import *", "metric('twin_only')", registration]
    write(tmp_path, {"twin.py": "\n".join(lines) + "\n"})
    plugins_named("twin")
    with pytest.raises(ConfigError) as refused:
        registry.load()
    assert refusal in str(refused.value) and "\n" not in str(refused.value)
    assert registry.owner("metric", "twin_only") is None  # forgotten with the failed import
    from mpt_repro.precision.scalers import SCALERS, DynamicScaler

    assert SCALERS["dynamic"] is DynamicScaler  # not replaced


def test_the_same_name_registered_by_its_defining_module_is_no_duplicate() -> None:
    """@register_model where a plugin's import path points completes the registration."""
    registry.register("model", "one_twin_net", "tests_twin_module:build", "one_twin_plugin")
    try:

        def build(cfg, **_):
            return None

        registry.register("model", "one_twin_net", build, "tests_twin_module")
        assert registry.entries("model")["one_twin_net"] is build
        assert registry.owner("model", "one_twin_net") == "one_twin_plugin"
        with pytest.raises(ConfigError, match="by one_twin_plugin and by elsewhere"):
            registry.register("model", "one_twin_net", build.__call__, "elsewhere")
    finally:
        registry.entries("model").pop("one_twin_net")
        registry._OWNERS.pop("the model 'one_twin_net'")


def test_a_failed_import_leaves_nothing_and_is_retried(tmp_path: Path, plugins_named) -> None:
    """In one process: a misspelt MPT_PLUGINS refused at every load(), then fixed; a plugin
    that raises after registering is forgotten, then, once fixed, imported at the next load()."""
    plugin = "from mpt_repro.registry import metric\nmetric('retry_share', '%', True)\n"
    write(tmp_path, {"retry_plug.py": plugin + "raise RuntimeError('not yet')\n"})
    plugins_named("retry_plugg")
    for _ in range(2):  # refused again: nothing remembered the first failure
        with pytest.raises(ConfigError) as refused:
            registry.load()
        assert str(refused.value).startswith(
            "the experiment plugin 'retry_plugg' cannot be imported (No module named"
        )
    plugins_named("retry_plug")
    with pytest.raises(ConfigError, match="raised RuntimeError while being imported"):
        registry.load()
    assert registry.owner("metric", "retry_share") is None  # what it registered is forgotten
    write(tmp_path, {"retry_plug.py": plugin})
    registry.load()
    assert registry.metric_info("retry_share") == registry.Metric("%", True)
    from mpt_repro.report.plots import is_percent

    assert is_percent("retry_share")  # the report reads what the plugin registered


def test_plugin_modules_are_read_once_per_value_of_mpt_plugins(monkeypatch) -> None:
    monkeypatch.setenv("MPT_PLUGINS", "a_plugin, another")
    first = registry.plugin_modules()
    assert first[-2:] == ["a_plugin", "another"]
    assert registry._plugin_modules.cache_info().currsize >= 1
    hits = registry._plugin_modules.cache_info().hits
    assert registry.plugin_modules() == first
    assert registry._plugin_modules.cache_info().hits == hits + 1
    monkeypatch.setenv("MPT_PLUGINS", "")
    assert "a_plugin" not in registry.plugin_modules()


def test_the_metric_metadata_comes_from_the_plugins_that_report_them() -> None:
    from mpt_repro.report.plots import is_percent
    from mpt_repro.tasks import task_class
    from mpt_repro.tasks.base import Task

    assert registry.metric_info("top1") == registry.Metric("%", higher_is_better=True)
    assert registry.owner("metric", "top1") == "mpt_repro.experiments.classification"
    assert registry.metric_info("perplexity") == registry.Metric("", higher_is_better=False)
    assert registry.metric_info("cer").percent and not registry.metric_info("bleu").percent
    assert registry.metric_info("no_such_metric") is None
    assert is_percent("map") and not is_percent("perplexity") and not is_percent("mse")
    # every built-in task's metrics are described, and its direction is said there alone: no
    # task class says it again (the base class reads it from the primary metric's registration)
    for kind in registry.task_kinds():
        task = task_class(kind)
        described = [registry.metric_info(m) for m in [task.primary_metric, *task.metric_names]]
        assert None not in described and described[0].higher_is_better is not None, kind
        assert not any("higher_is_better" in vars(c) for c in task.__mro__ if c is not Task), kind


def test_models_scalers_and_converters_are_found_without_importing_torch() -> None:
    """Listing what the suite has (the config check) reads the decorators in the source, and
    so does asking which scaler reads a knob (reads=)."""
    import subprocess

    probe = (
        "import sys\nfrom mpt_repro import registry\n"
        "print(registry.names('loss scaler'), 'resnet50' in registry.names('model'),"
        " 'fp8_emulated' in registry.names('converter'),"
        " registry.declaring('loss scaler', 'init_scale'), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        "['adaptive',",
        "'dynamic',",
        "'static']",
        "True",
        "True",
        "['dynamic']",
        "False",
    ]


def test_a_plugin_scalers_undeclared_knob_is_refused_saying_how_to_declare_it(
    tmp_path: Path,
) -> None:
    """Through the real mpt-run (refused before torch loads, about a second): the toy's scaler
    declares init_scale and min_scale, not backoff_factor."""
    folder = write(tmp_path, doc_files())
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    refused = run_cli(
        *SCALER_COMMAND.split()[1:],
        "precision.backoff_factor=0.25",
        check=False,
        env={"PYTHONPATH": path, "MPT_PLUGINS": "toyreg"},
    )
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert (
        "precision.backoff_factor would change nothing in this run: the loss scaler 'backoff' "
        "(registered by toyreg) does not declare that it reads backoff_factor. If it does, "
        "declare it where it is registered: reads=('init_scale', 'min_scale', 'backoff_factor') "
        "in its loss_scaler('backoff', ...) or @register_scaler('backoff', ...)" in line
    )


@pytest.fixture
def toy_in_this_process(monkeypatch, tmp_path):
    """The doc's toy plugin named in MPT_PLUGINS in this process (its scaler's module is never
    imported by a check); forgotten afterwards."""
    write(tmp_path, doc_files())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MPT_PLUGINS", "toyreg")
    yield
    registry.unload("toyreg")


@pytest.mark.parametrize(
    "knob",
    [
        "precision.init_scale=1024",  # declared by the toy's registration
        "precision.min_scale=2",
        "precision.per_loss_scale=false",  # read for any loss scaler
        "precision.hold_lr_on_skip=false",
        "precision.floor_patience=10",  # ends a run at the scaler's floor (config.skip_ending)
    ],
)
def test_a_plugin_scaler_takes_the_knobs_it_reads(toy_in_this_process, knob: str) -> None:
    from mpt_repro.preflight import preflight

    toy = ["experiment=toyreg", "precision=mixed"]
    assert preflight([*toy, "precision.loss_scaling=backoff", knob]) is None
    unscaled = preflight([*toy, "precision.loss_scaling=none", knob])  # no scaler reads it
    assert f"{knob.split('=')[0]} would change nothing in this run" in unscaled


def test_the_suites_scalers_declare_in_their_source_what_they_register() -> None:
    """The config check reads the built-in scalers' reads= from their source, without importing
    them: what the decorators register once imported is the same. The dynamic scaler declares
    the knobs PrecisionConfig marks as scaler knobs, each under its own field's name."""
    import dataclasses

    from mpt_repro.precision import adaptive, scalers  # noqa: F401  (registers on import)
    from mpt_repro.precision.config import PrecisionConfig
    from mpt_repro.schema import Declaring

    from_source = registry._package_reads("loss scaler")
    assert from_source == {k: v for k, v in registry.entries("loss scaler reads").items()}
    knobs = []
    for f in dataclasses.fields(PrecisionConfig):
        kinds = f.metadata.get("read_when", (None, ()))[1]
        if isinstance(kinds, Declaring):
            assert kinds.setting == f.name
            knobs.append(f.name)
    declared = set(from_source["dynamic"]) | set(from_source["adaptive"])
    assert sorted(knobs) == sorted(declared) and len(knobs) == 14
    assert from_source["static"] == ()  # its constant is precision.static_scale


def test_a_declaration_names_settings_by_their_field_name() -> None:
    with pytest.raises(ConfigError) as refused:
        registry.declare_reads("loss scaler", "mine", ("precision.init_scale",), "my_plugin")
    assert 'reads=("init_scale",) for precision.init_scale' in str(refused.value)
    assert registry.declared_reads("loss scaler", "mine") is None  # nothing registered
