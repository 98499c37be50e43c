"""model=custom: a user's factory found by model.target, called as factory(num_classes=...,
**model.kwargs), with errors that say what to fix (issue 14.7)."""

from __future__ import annotations

import pytest
import torch
from conftest import compose, option_config, read_run, run_cli

from mpt_repro.config import validate
from mpt_repro.errors import ConfigError
from mpt_repro.models import build_model

TARGET = "helpers_custom_model:tiny_classifier"


def custom(target: str, **kwargs):
    cfg = option_config("model", name=target, target=target, kwargs=kwargs)
    return build_model(cfg, num_classes=5, channels=1, image_size=8)


@pytest.mark.parametrize("target", [TARGET, "helpers_custom_model.tiny_classifier"])
def test_factory_builds_the_users_model_with_the_data_classes_and_kwargs(target):
    model = custom(target, in_channels=1, width=4)
    assert model[0].in_channels == 1 and model[0].out_channels == 4
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 5)  # num_classes from the data


@pytest.mark.parametrize(
    "target,message",
    [
        ("no_such_package.nets:make", r"cannot import module 'no_such_package.nets'.*PYTHONPATH"),
        ("helpers_custom_model:missing", r"has no 'missing'"),
        ("helpers_custom_model:NOT_CALLABLE", r"is not callable"),
        ("helpers_custom_model:not_a_module", r"returned a str, not an nn.Module"),
        ("justaname", r"package.module:factory"),
    ],
)
def test_bad_targets_say_what_is_wrong(target, message):
    with pytest.raises(ConfigError, match=message):
        custom(target)


def test_a_wrong_keyword_names_the_call_and_the_fix():
    with pytest.raises(ConfigError, match=r"factory\(num_classes=5, depth=3\).*\+model.kwargs"):
        custom(TARGET, depth=3)


def test_model_custom_without_a_target_is_refused_by_validation():
    cfg = compose(["experiment=demo", "model=custom"])
    with pytest.raises(ConfigError, match="model.target"):
        validate(cfg)
    with pytest.raises(ConfigError, match="model.target=package.module:factory"):
        build_model(cfg.model, num_classes=10, channels=1, image_size=8)


def test_a_module_python_cannot_find_is_refused_by_validation_before_the_build():
    """Found with importlib's search, not an import: mpt-run refuses it before torch loads. A
    module that exists with a misspelt factory is left to the build (only importing tells)."""
    for target, missing in [
        ("no_such_package.nets:make", "no_such_package"),
        ("helpers_custom_model_typo:tiny_classifier", "helpers_custom_model_typo"),
        ("mpt_repro.no_such_module.make", "mpt_repro.no_such_module"),
    ]:
        cfg = compose(["experiment=demo", "model=custom", f"model.target={target}"])
        with pytest.raises(ConfigError, match=rf"cannot find \(no module named '{missing}'\)"):
            validate(cfg)
    validate(compose(["experiment=demo", "model=custom", "model.target=helpers_custom_model:nope"]))


@pytest.mark.slow  # ~7 s, most of it the subprocess's start-up
def test_custom_model_trains_through_mpt_run(tmp_path):
    """The whole path (trainer, precision policy, run record) with a factory from outside the
    package, found through PYTHONPATH."""
    import os

    from conftest import ROOT

    run_dir = tmp_path / "run"
    path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    run_cli(
        "experiment=demo",
        "budget=smoke",
        "precision=mixed",  # FP16 weights, FP32 masters and BN, loss scaling: the full machinery
        "model=custom",
        f"model.target={TARGET}",
        "+model.kwargs.in_channels=1",
        run_dir=run_dir,
        env={"PYTHONPATH": path},
    )
    record = read_run(run_dir)
    assert record["status"] == "completed" and record["steps"] == 6
    # your model under its own name (the factory's import path), not the demo's
    assert record["model"]["name"] == record["model"]["target"] == TARGET
    assert record["study"] == f"demo-{TARGET}"
