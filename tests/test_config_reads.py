"""Strict command lines: unknown keys and `+` additions are refused alike, and so is a key that
the selected experiment does not read (config.READ_ONLY_BY, checked here against conf/ and the
code)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import CONF_DIR, compose

from mpt_repro import config
from mpt_repro.config import (
    KINDS,
    READ_ONLY_BY,
    SELECTOR_TEXT,
    check_command_line,
    check_overrides_are_read,
)
from mpt_repro.errors import ConfigError

SCHEMA_KEYS = {key for key, _ in config._schema_fields(config.Config, "")}


def _names(group: str) -> set[str]:
    """The `name:` each option of a config group gives itself."""
    return {yaml.safe_load(p.read_text())["name"] for p in (Path(CONF_DIR) / group).glob("*.yaml")}


# -- the table itself ----------------------------------------------------------------------------
def test_every_row_names_a_schema_key_and_known_kinds() -> None:
    for key, (selector, readers) in READ_ONLY_BY.items():
        assert key in SCHEMA_KEYS, key
        assert selector in KINDS and selector in SELECTOR_TEXT, (key, selector)
        assert readers and set(readers) <= set(KINDS[selector]), (key, readers)


def test_the_kinds_are_those_of_conf_and_the_registries() -> None:
    from mpt_repro.data import DATASETS, build_image_data  # noqa: F401
    from mpt_repro.models import MODELS, _load_all

    _load_all()
    # a custom model's name is its own (conf/model/custom.yaml: name: ${.target}): its kind is
    # the option's file name
    assert set(KINDS["model"]) == (_names("model") - {"${.target}"}) | {"custom"} == set(MODELS)
    # image data sets register on first build; the corpus is the language model's own
    import mpt_repro.data.digits  # noqa: F401
    import mpt_repro.data.imagenet  # noqa: F401
    import mpt_repro.data.images  # noqa: F401
    import mpt_repro.data.synthetic  # noqa: F401

    assert set(KINDS["data.name"]) == _names("data") | set(DATASETS) | {"corpus"}
    assert list(KINDS["task"]) == config.known_tasks()
    assert KINDS["optim.name"] == config.OPTIMIZERS
    assert KINDS["optim.schedule"] == config.SCHEDULES


SHAPE_KEYS = ["width", "embed_dim", "hidden_size", "proj_size", "num_layers"]
SHAPE_KEYS += ["latent_dim", "gen_features", "disc_features"]
SMALL_MODELS = {
    "digits_cnn": {"num_classes": 10, "channels": 1, "image_size": 8},
    "small_grad_mlp": {"num_classes": 10, "channels": 1, "image_size": 8},
    "lstm_lm": {"vocab_size": 50},
    "dcgan": {"channels": 1, "image_size": 16},
}


@pytest.mark.parametrize("model", sorted(SMALL_MODELS))
def test_the_model_rows_agree_with_what_the_small_models_build(model: str, one_thread) -> None:
    """A shape key that the table says a model reads changes its parameters, and one it says
    the model ignores changes nothing."""
    import torch

    from mpt_repro.models import build_model

    cfg = compose([f"model={model}"]).model

    def shapes(key: str | None = None) -> list:
        c = cfg.copy()
        if key is not None:
            c[key] = c[key] + 2 if key != "proj_size" else 8  # proj_size 0 means no projection
        torch.manual_seed(0)
        return [tuple(p.shape) for p in build_model(c, **SMALL_MODELS[model]).parameters()]

    base = shapes()
    for key in SHAPE_KEYS:
        readers = READ_ONLY_BY[f"model.{key}"][1]
        assert (shapes(key) != base) == (model in readers), (model, key)


# -- strict command lines ------------------------------------------------------------------------
def test_a_plus_addition_gets_the_same_answer_as_a_typo() -> None:
    typo = check_command_line(["experiment=demo", "optim.lrr=0.1"])
    added = check_command_line(["experiment=demo", "+optim.lrr=0.1"])
    assert typo == added
    assert "unknown key 'optim.lrr'" in typo and "did you mean optim.lr?" in typo
    # the one documented extension point is model.kwargs (model=custom's factory arguments)
    assert "a leading + adds keys only under model.kwargs" in typo
    assert "did you mean seed?" in check_command_line(["seeed=1"])


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
    ],
)
def test_valid_command_lines_pass(argv: list[str]) -> None:
    assert check_command_line(argv) is None


# -- keys the run does not read ------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,key,kind",
    [
        (["model.hidden_size=999"], "model.hidden_size", "digits_cnn"),
        (["precision.init_scale=1024"], "precision.init_scale", "none"),  # fp32: no scaling
        (
            ["precision=mixed", "precision.adaptive_method=x"],
            "precision.adaptive_method",
            "dynamic",
        ),
        (["optim.betas=[0.5,0.9]"], "optim.betas", "sgd"),
        (["optim.milestones=[5]"], "optim.milestones", "constant"),
        (["telemetry.every=5"], "telemetry.every", "false"),
        (["data.seq_len=10"], "data.seq_len", "digits"),
        # lstm_lm states a paper scale: `mixed` scales statically there, so init_scale is idle
        (
            ["experiment=lstm_lm", "precision=mixed", "precision.init_scale=8"],
            "init_scale",
            "static",
        ),
    ],
)
def test_an_override_the_run_does_not_read_is_refused(overrides, key, kind) -> None:
    overrides = ["experiment=demo", *overrides]
    with pytest.raises(ConfigError) as err:
        check_overrides_are_read(compose(overrides), overrides)
    message = str(err.value)
    assert key in message and f"has {kind}." in message and "would change nothing" in message


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment=lstm_lm", "model.hidden_size=32", "data.seq_len=10"],
        ["precision=amp", "precision.init_scale=1024"],  # dynamic scaling reads it
        ["precision=mixed", "precision.init_scale=1024"],  # demo states no paper scale: dynamic
        ["optim.name=adam", "optim.betas=[0.5,0.9]"],  # the override that makes it read, too
        ["telemetry=diagnostic", "telemetry.every=5"],
        ["optim.lr=0.01", "precision=fp16"],  # keys every run reads
    ],
)
def test_an_override_the_run_reads_passes(overrides: list[str]) -> None:
    overrides = ["experiment=demo", *overrides]
    check_overrides_are_read(compose(overrides), overrides)


def test_a_kind_the_table_does_not_know_is_never_refused(monkeypatch) -> None:
    """A model added without a row here keeps working (tests above ask for the row)."""
    monkeypatch.setitem(KINDS, "model", ("lstm_lm",))
    overrides = ["experiment=demo", "model.hidden_size=999"]
    check_overrides_are_read(compose(overrides), overrides)


def test_resume_and_overwrite_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="resume=true and overwrite=true"):
        config.validate(compose(["experiment=demo", "resume=true", "overwrite=true"]))


def test_task_is_a_registry_name() -> None:
    cfg = compose(["experiment=demo"])
    assert cfg.task == "classification"
    with pytest.raises(ConfigError, match="task must be one of"):
        config.validate(compose(["experiment=demo", "task=regression"]))


def test_budget_names_come_from_conf() -> None:
    assert config.options("budget") == sorted(
        p.stem for p in Path(CONF_DIR, "budget").glob("*.yaml")
    )
    with pytest.raises(ConfigError, match="budget.name"):
        config.validate(compose(["experiment=demo", "budget.name=huge"]))
