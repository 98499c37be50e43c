"""Strict command lines: unknown keys and `+` additions are refused alike, and so is a key the run
does not read: a field of another option's schema (mpt_repro/schema.py), or a field whose
`read_when` metadata names other kinds. Checked here against conf/, the registries and what the
small models build."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import CONF_DIR, compose
from omegaconf import OmegaConf

from mpt_repro import catalog, config, registry
from mpt_repro.config import check_command_line, check_overrides_are_read
from mpt_repro.errors import ConfigError
from mpt_repro.precision.config import LossScaling, PrecisionConfig
from mpt_repro.preflight import preflight
from mpt_repro.registry import option_schemas
from mpt_repro.telemetry.config import TelemetryConfig


def refusal(*overrides: str) -> str | None:
    """What mpt-run says of this command line before any work (None: it would run)."""
    return preflight(["experiment=demo", *overrides])


# -- the schemas against conf/ and the registries --------------------------------------------------
@pytest.mark.parametrize("group", sorted(option_schemas()))
def test_every_option_names_a_schema_that_exists(group: str) -> None:
    named = catalog.option_schemas(group)
    assert sorted(named) == catalog.options(group)  # every option file names one
    assert set(named.values()) <= set(option_schemas()[group])


def test_the_options_are_those_of_the_registries() -> None:
    from mpt_repro.data import DATASETS
    from mpt_repro.models import MODELS, _load_all

    _load_all()
    assert set(catalog.options("model")) == set(MODELS)
    import mpt_repro.data.cifar  # noqa: F401  (image data sets register on import)
    import mpt_repro.data.digits  # noqa: F401
    import mpt_repro.data.imagenet  # noqa: F401
    import mpt_repro.data.images  # noqa: F401
    import mpt_repro.data.synthetic  # noqa: F401

    names = {compose([f"data={d}"]).data.name for d in catalog.options("data")}
    # the corpora, VOC and LibriSpeech have loaders of their own tasks, outside the image registry
    text = {"corpus", "voc", "librispeech", "wmt15_enfr", "bible_enes"}
    assert names == set(DATASETS) | text
    from mpt_repro.tasks import task_class

    assert [task_class(k).name for k in registry.task_kinds()] == registry.task_kinds()


KINDS = {
    "optim.name": set(config.OPTIMIZERS),
    "optim.schedule": set(config.SCHEDULES),
    "optim.lr_scaling": {"none", "linear"},
    "task": set(registry.task_kinds()),
    "data.name": {compose([f"data={d}"]).data.name for d in catalog.options("data")},
    "precision.loss_scaling": set(LossScaling.__members__),
    "loss_scaling": {"adaptive", "dynamic", "none", "static"},
    "telemetry.enabled": {"true", "false"},
    "skip_ending": {"a loss scaler", "an FP16 state guard", "neither"},
}


def _read_when_rules():
    classes = [config.OptimConfig, config.TrainerConfig, config.Config, PrecisionConfig]
    classes += [TelemetryConfig, *(c for g in option_schemas().values() for c in g.values())]
    for cls in classes:
        for f in dataclasses.fields(cls):
            if "read_when" in f.metadata:
                yield cls.__name__, f.name, f.metadata["read_when"]


def test_every_read_when_names_a_known_selector_and_kinds() -> None:
    rules = list(_read_when_rules())
    assert len(rules) > 40  # the conditional fields of every group
    for owner, name, (selector, kinds) in rules:
        assert selector in KINDS, (owner, name, selector)
        assert kinds and set(kinds) <= KINDS[selector], (owner, name, kinds)


SHAPE_KEYS = ["width", "embed_dim", "hidden_size", "proj_size", "num_layers"]
SHAPE_KEYS += ["latent_dim", "gen_features", "disc_features"]
SMALL_MODELS = {
    "digits_cnn": {"num_classes": 10, "channels": 1, "image_size": 8},
    "small_grad_mlp": {"num_classes": 10, "channels": 1, "image_size": 8},
    "lstm_lm": {"vocab_size": 50},
    "dcgan": {"channels": 1, "image_size": 16},
}


@pytest.mark.parametrize("model", sorted(SMALL_MODELS))
def test_a_models_schema_holds_exactly_the_shape_keys_it_builds_from(model, one_thread) -> None:
    """A shape key in a model's schema changes its parameters; one it lacks cannot be set."""
    import torch

    from mpt_repro.models import build_model

    cfg = compose([f"model={model}"]).model
    fields = {f.name for f in dataclasses.fields(OmegaConf.get_type(cfg))}

    def shapes(key: str | None = None) -> list:
        c = cfg.copy()
        if key is not None:
            c[key] = c[key] + 2 if key != "proj_size" else 8  # proj_size 0 means no projection
        torch.manual_seed(0)
        return [tuple(p.shape) for p in build_model(c, **SMALL_MODELS[model]).parameters()]

    base = shapes()
    for key in SHAPE_KEYS:
        if key in fields:
            assert shapes(key) != base, (model, key)
        else:
            assert refusal(f"model={model}", f"model.{key}=3") is not None, (model, key)


# -- strict command lines --------------------------------------------------------------------------
def test_a_plus_addition_gets_the_same_answer_as_a_typo() -> None:
    typo = check_command_line(["experiment=demo", "optim.lrr=0.1"])
    added = check_command_line(["experiment=demo", "+optim.lrr=0.1"])
    assert typo == added
    assert "unknown key 'optim.lrr'" in typo and "did you mean optim.lr?" in typo
    # the one documented extension point is model.kwargs (model=custom's factory arguments)
    assert "a leading + adds keys only under model.kwargs." in typo
    assert "did you mean seed?" in check_command_line(["seeed=1"])
    # a typo of a field of some model is suggested from every model's schema
    assert "did you mean model.hidden_size?" in check_command_line(["model.hiden_size=1"])
    # a misspelt section: named as one, and the suggestion keeps the setting that was typed
    section = check_command_line(["optimm.lr=0.1"])
    assert "there is no top-level section 'optimm' (did you mean optim.lr?)" in section
    assert "optim has no section 'foo'" in check_command_line(["optim.foo.bar=1"])


@pytest.mark.parametrize(
    "old,new,has",
    [
        ("optim.label_smoothing", "model.label_smoothing", "inception_v3"),
        ("optim.lm_loss_times_steps", "model.loss_times_steps", "lstm_lm has it"),
        ("optim.embedding_grad_scale", "model.embedding_grad_scale", "lstm_lm has it"),
    ],
)
def test_a_key_that_moved_into_its_options_schema_is_refused_with_its_new_name(old, new, has):
    """A setting one task reads lives in the schema of the options that read it; the old key
    (a command line from before the move) is refused in one line naming the new one, with or
    without a leading +."""
    for typed in (f"{old}=0.1", f"+{old}=0.1"):
        line = check_command_line(["experiment=demo", typed])
        assert line is not None and line.startswith(f"{old} is now {new}"), line
        assert has in line and f"Set {new} instead ({new}=... on the" in line and "\n" not in line


def test_an_experiment_file_of_ones_own_that_sets_a_moved_key_is_told_the_new_one(tmp_path):
    """An experiment file written before the move (optim: label_smoothing:) is refused, before
    torch loads, with the key's new place rather than as a key no schema has."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - demo\n  - _self_\nexperiment_name: mine\n"
        "optim:\n  label_smoothing: 0.1\n"
    )
    line = preflight(["experiment=mine", f"hydra.searchpath=[file://{tmp_path}]"])
    assert line is not None and "optim.label_smoothing is now model.label_smoothing" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["experiment=demo", "precision=amp", "budget=smoke", "optim.lr=0.05"],
        ["-m", "precision=fp32,amp", "seed=0,1", "optim.lr=0.1,0.2"],  # a sweep
        ["hydra/launcher=local", "hydra.run.dir=/tmp/x", "hydra.launcher.timeout_min=5"],
        ["+experiment_budget=demo_smoke"],  # a group, not a key
        ["optim.milestones=[1,2]", "optim.betas.0=0.8"],  # a list and one of its items
        ["optim.lr=(("],  # malformed: Hydra reports it with its own message
        ["--cfg", "job", "telemetry=diagnostic", "telemetry.every=5"],
        ["model.hidden_size=3"],  # some model has it: judged once the config is composed
    ],
)
def test_valid_command_lines_pass(argv: list[str]) -> None:
    assert check_command_line(argv) is None


# -- keys the run does not read --------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,words",
    [
        (
            ["model.hidden_size=999"],
            "model=digits_cnn has no setting 'hidden_size'; deepspeech2, lstm_lm have it",
        ),
        (["+model.hidden_size=999"], "model=digits_cnn has no setting 'hidden_size'"),
        (["+model.kwargs.width=8"], "model=digits_cnn has no setting 'kwargs'; custom has it"),
        (["data.seq_len=10"], "data=digits has no setting 'seq_len'; corpus has it"),
        (["precision.init_scale=1024"], "is dynamic, and this run (experiment=demo) has none."),
        (
            ["precision=mixed", "precision.adaptive_method=x"],
            "read only when the loss scaling (precision.loss_scaling, with paper resolved) is "
            "adaptive, and this run (experiment=demo) has dynamic.",
        ),
        (["optim.betas=[0.5,0.9]"], "optim.betas would change nothing"),
        (["optim.milestones=[5]"], "when optim.schedule is multistep"),
        (["telemetry.every=5"], "when telemetry.enabled is true, and this run"),
        (["data.decode=gpu"], "data=digits has no setting 'decode'; imagefolder, imagenet have"),
        (["data=synthetic", "data.resize_size=32"], "(read by data=imagefolder, imagenet;"),
        # trainer settings the task's plugin does not say it acts on (schema.honours)
        (
            ["trainer.compile=true", "experiment=lstm_lm"],
            "its task (language_model) does not act on it (the tasks that do: classification;",
        ),
        (["experiment=dcgan", "trainer.recalibrate_bn=2"], "its task (gan) does not act on it"),
        # the detection data's longer-side cap: made-up images carry it, classification ignores it
        (["data=synthetic", "data.max_size=64"], "read only when the task is detection"),
        # lstm_lm states a paper scale: `mixed` scales statically there, so init_scale is idle
        (["experiment=lstm_lm", "precision=mixed", "precision.init_scale=8"], "has static."),
    ],
)
def test_an_override_the_run_does_not_read_is_refused(overrides, words) -> None:
    message = refusal(*overrides)
    assert message is not None and words in message, message


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment=lstm_lm", "model.hidden_size=256", "data.seq_len=10"],
        ["precision=amp", "precision.init_scale=1024"],  # dynamic scaling reads it
        ["precision=mixed", "precision.init_scale=1024"],  # demo states no paper scale: dynamic
        ["optim.name=adam", "optim.betas=[0.5,0.9]"],  # the override that makes it read, too
        ["telemetry=diagnostic", "telemetry.every=5"],
        ["optim.lr=0.01", "precision=fp16"],  # keys every run reads
        ["model=custom", "model.target=a.b:c", "+model.kwargs.width=8"],  # the factory's own
        ["model.label_smoothing=0.1"],  # every classifier's
        ["trainer.recalibrate_bn=2", "trainer.compile=true"],  # the classification task's
    ],
)
def test_an_override_the_run_reads_passes(overrides: list[str]) -> None:
    overrides = ["experiment=demo", *overrides]
    check_overrides_are_read(compose(overrides), overrides)


def test_a_trimmed_budget_without_the_experiments_file_is_refused(monkeypatch) -> None:
    """An ImageNet experiment added without conf/experiment_budget/<name>_short.yaml would train
    its whole recipe on all of ImageNet at budget=short."""
    real = catalog.experiments()
    renamed = {**real, "resnet50": dataclasses.replace(real["resnet50"], file="resnet51")}
    monkeypatch.setattr(catalog, "experiments", lambda: renamed)
    with pytest.raises(ConfigError, match=r"conf/experiment_budget/resnet51_short.yaml"):
        config.validate(compose(["experiment=resnet50", "budget=short"]))
    config.validate(compose(["experiment=resnet50", "budget=paper"]))
    config.validate(compose(["experiment=demo", "budget=short"]))  # no folder to read: trims


def test_resume_and_overwrite_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="resume=true and overwrite=true"):
        config.validate(compose(["experiment=demo", "resume=true", "overwrite=true"]))


def test_task_is_a_registry_name() -> None:
    cfg = compose(["experiment=demo"])
    assert cfg.task == "classification"
    with pytest.raises(ConfigError, match="task must be a task a plugin registers"):
        config.validate(compose(["experiment=demo", "task=regression"]))
    # the core has no task of its own to fall back on: an experiment file that names none
    with pytest.raises(ConfigError, match=r"set by the experiment file \(task: <kind>\)"):
        config.validate(compose(["experiment=demo", "task=???"]))


def test_budget_names_come_from_conf() -> None:
    assert config.options("budget") == sorted(
        p.stem for p in Path(CONF_DIR, "budget").glob("*.yaml")
    )
    with pytest.raises(ConfigError, match="budget.name"):
        config.validate(compose(["experiment=demo", "budget.name=huge"]))


@pytest.mark.parametrize(
    "overrides, data",
    [
        (["experiment=cifar10", "budget=smoke"], "cifar10"),
        (["experiment=resnet50", "budget=smoke"], "imagenet"),
        (["experiment=ssd", "budget=smoke"], "voc"),
        (["experiment=speech", "budget=smoke"], "librispeech"),
        (["experiment=translation", "budget=paper"], "wmt15_enfr"),
        (["experiment=demo", "data=imagefolder"], "imagefolder"),
    ],
)
def test_a_folder_data_set_without_its_folder_is_refused_with_both_ways_to_run(
    overrides, data
) -> None:
    message = refusal(*overrides)
    assert message is not None, overrides
    assert f"data {data} is read from a folder and data.root is not set" in message
    assert "data.root=DIR" in message and "data=synthetic" in message


def test_a_stand_in_or_made_up_data_needs_no_folder() -> None:
    # the DCGAN's smoke budget reads the embedded digits through its image-folder option;
    # translation's smoke budget the embedded Bible; the LM's the embedded corpus
    for experiment in ("dcgan", "translation", "lstm_lm"):
        assert refusal(f"experiment={experiment}", "budget=smoke") is None, experiment
    assert refusal("experiment=cifar10", "budget=smoke", "data=synthetic") is None


def test_the_folder_refusal_comes_before_torch_loads() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from mpt_repro.preflight import preflight; "
        "m = preflight(['experiment=cifar10', 'budget=smoke']); "
        "print('torch' in sys.modules, 'data=synthetic' in m)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_the_schemas_are_stored_again_when_the_store_no_longer_holds_them() -> None:
    """register_configs skips storing what the ConfigStore already holds (it runs at every
    compose), but a schema node replaced since is put back, so a compose never reads a stale
    or foreign schema."""
    from hydra.core.config_store import ConfigStore

    from mpt_repro.config import Config, register_configs

    register_configs()
    store = ConfigStore.instance()
    kept = store.repo["schema.yaml"]
    register_configs()
    assert store.repo["schema.yaml"] is kept  # nothing changed: nothing stored again
    store.store(name="schema", node={"not": "the schema"})
    register_configs()
    assert store.repo["schema.yaml"] is not kept
    assert OmegaConf.get_type(store.repo["schema.yaml"].node) is Config
    assert compose(["experiment=demo"]).experiment_name == "demo"
