"""The configuration: every option composes, the schema refuses typos and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CONF_DIR, compose, run_cli
from omegaconf import OmegaConf

from mpt_repro.config import to_plain, validate
from mpt_repro.errors import ConfigError

GROUPS = ["data", "model", "optim", "trainer", "precision", "budget", "experiment"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes(group: str, option: str) -> None:
    cfg = compose([f"{group}={option}"])
    assert OmegaConf.select(cfg, "experiment_name")
    if group == "precision":
        assert (
            cfg.precision.name == option
        )  # a preset names itself: run dirs and reports rely on it
    if group == "budget":
        assert cfg.budget.name == option


@pytest.mark.parametrize("experiment", options("experiment"))
@pytest.mark.parametrize("budget", options("budget"))
def test_every_experiment_and_budget_validates(experiment: str, budget: str) -> None:
    cfg = compose([f"experiment={experiment}", f"budget={budget}"])
    assert cfg.experiment_name == experiment  # the file name is the experiment's name
    validate(cfg)


def test_experiment_is_selected_without_plus() -> None:
    assert compose(["experiment=demo"]).experiment_name == "demo"


def test_misspelled_key_is_refused_before_any_work() -> None:
    with pytest.raises(Exception, match="lrr"):
        compose(["optim.lrr=0.1"])


def test_wrong_type_is_refused() -> None:
    with pytest.raises(Exception, match="batch_size"):
        compose(["data.batch_size=many"])


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.lr=-0.1", "optim.lr"),
        ("data.batch_size=0", "data.batch_size"),
        ("trainer.epochs=0", "trainer.epochs"),
        ("optim.name=adamax", "optim.name"),
        ("optim.schedule=wavy", "optim.schedule"),
        ("trainer.device=tpu", "trainer.device"),
        ("trainer.device=cuda:abc", "trainer.device"),
        ("seed=4294967296", "seed"),
        ("seed=-1", "seed"),
    ],
)
def test_invalid_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose([override]))


def test_bad_inputs_exit_nonzero_with_a_clear_message(tmp_path: Path) -> None:
    typo = run_cli("experiment=demo", "optim.lrr=0.1", run_dir=tmp_path / "a", check=False)
    assert typo.returncode != 0 and "lrr" in typo.stderr
    unknown = run_cli("experiment=demo", "precision=fp64", run_dir=tmp_path / "b", check=False)
    assert (
        unknown.returncode != 0
        and "fp64" in unknown.stderr
        and "precision is one of: adaptive, amp," in unknown.stderr
    )
    negative = run_cli("experiment=demo", "optim.lr=-1", run_dir=tmp_path / "c", check=False)
    assert negative.returncode == 2 and "optim.lr must be > 0" in negative.stderr
    assert "Traceback" not in negative.stderr


def test_run_directory_names_experiment_precision_budget_seed() -> None:
    from hydra.core.hydra_config import HydraConfig

    cfg = compose(
        ["experiment=demo", "precision=amp", "budget=smoke", "seed=3", "optim.lr=0.2"],
        return_hydra_config=True,
    )

    HydraConfig.instance().set_config(cfg)
    run_dir = OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"]
    assert run_dir == "results/runs/demo/amp-smoke/seed3/optim.lr=0.2"


def test_resolved_config_is_plain_json() -> None:
    import json

    plain = to_plain(compose(["experiment=demo", "precision=amp"]))
    assert json.loads(json.dumps(plain))["precision"]["compute_dtype"] == "float16"


def test_every_preset_file_sets_precision_knobs_only():
    """A preset reaches nothing outside `precision.*`: no other package, no defaults list."""
    for path in sorted((Path(CONF_DIR) / "precision").glob("*.yaml")):
        text = path.read_text()
        assert "@package" not in text, path.name
        assert "defaults" not in OmegaConf.load(path), path.name


def _interpolations(node, where: str = ""):
    """(key, value) of every string value holding an interpolation, below `node` unresolved."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _interpolations(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _interpolations(v, f"{where}[{i}]")
    elif isinstance(node, str) and "${" in node:
        yield where, node


@pytest.mark.parametrize("experiment", options("experiment"))
def test_no_setting_outside_precision_reads_the_preset(experiment: str) -> None:
    """With the test above, why switching presets changes nothing else in any experiment: no
    value outside `precision` interpolates a precision key (the slow test below composes every
    preset to check the result itself)."""
    for budget in ("paper", "smoke"):
        cfg = compose([f"experiment={experiment}", f"budget={budget}"])
        tree = OmegaConf.to_container(cfg, resolve=False)
        tree.pop("precision")
        readers = [(k, v) for k, v in _interpolations(tree) if "precision" in v]
        assert readers == [], (experiment, budget)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", options("experiment"))
def test_switching_precision_changes_nothing_outside_precision_in_every_experiment(
    experiment: str,
) -> None:
    """Same schedule, data and model under every preset: never per-precision hyperparameters
    (every preset composed: 420 compositions, slow)."""

    def without_precision(preset: str, budget: str) -> dict:
        plain = to_plain(
            compose([f"experiment={experiment}", f"precision={preset}", f"budget={budget}"])
        )
        plain.pop("precision")
        return plain

    for budget in ("paper", "smoke"):  # `short` trims like `paper`; both ends are checked
        reference = without_precision("fp32", budget)
        for preset in options("precision"):
            assert without_precision(preset, budget) == reference, (experiment, budget, preset)
