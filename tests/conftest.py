"""Shared helpers: compose the real config, and run the installed `mpt-run` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = str(ROOT / "conf")
MPT_RUN = str(Path(sys.executable).with_name("mpt-run"))


def compose(overrides: list[str] | None = None, return_hydra_config: bool = False):
    """The config `mpt-run <overrides>` would run, composed through Hydra (no run).

    Hydra is initialised once per test session (re-initialising costs more than composing).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mpt_repro.config import register_configs

    register_configs()
    if not GlobalHydra.instance().is_initialized():
        initialize_config_dir(config_dir=CONF_DIR, version_base="1.3").__enter__()
    return hydra_compose(
        config_name="config", overrides=overrides or [], return_hydra_config=return_hydra_config
    )


def run_cli(
    *overrides: str,
    run_dir: Path | None = None,
    timeout: int = 300,
    check: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run the installed mpt-run; with run_dir, pin the run directory (hydra.run.dir)."""
    args = [MPT_RUN, *overrides, "trainer.progress=false"]
    if run_dir is not None:
        args.append(f"hydra.run.dir={run_dir}")
    proc = subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"mpt-run {' '.join(overrides)} failed "
            f"({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


# the variables of scripts/reproduce_table.sh: the tests that run it clear them from the
# environment, so a developer's own settings cannot change what a test checks
REPRODUCE_TABLE_SETTINGS = (
    "BUDGET",
    "DATA",
    "DATA_ROOT",
    "SEEDS",
    "EXPERIMENTS",
    "PRECISIONS",
    "OTHERS",
    "DRY_RUN",
    "LAUNCHER",
    "OTHER_PRECISIONS",
    "LM_ROOT",
    "CELEBA_ROOT",
    "VOC_ROOT",
    "LIBRISPEECH_ROOT",
    "WMT15_ENFR_ROOT",
)


def read_run(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


@pytest.fixture(autouse=True)
def no_hydra_job_left_behind():
    """A test that sets Hydra's job config in this process (HydraConfig.set_config, as a job
    does) leaves no job behind: a later in-process run would take that job's overrides for its
    own (its record's variant), whichever order the tests run in (pytest -n: by file)."""
    yield
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().cfg = None


@pytest.fixture(autouse=True)
def no_config_folder_left_behind():
    """A test that checks a command line with hydra.searchpath=[file://...] in this process
    registers that folder with the registry (mpt_repro/cmdline.py with_plugin_configs, so that
    the catalog sees the user's experiments as Hydra does); it is forgotten after the test, or
    its experiments would join every later test's catalog in the same worker (pytest -n)."""
    from mpt_repro import registry

    folders = dict(registry.entries("config folder"))
    yield
    for name in set(registry.entries("config folder")) - set(folders):
        del registry.entries("config folder")[name]
        registry._OWNERS.pop(f"the config folder {name!r}", None)  # its owner record too


@pytest.fixture
def one_thread():
    """Tiny tensors: with several threads a loaded 2-core machine spends ~30x longer in thread
    hand-offs than in arithmetic. One thread for the test, restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def build_task(*overrides: str):
    """(task, policy) on the CPU from the real config of `mpt-run <overrides>`, without a run."""
    import torch

    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.tasks import build_task as build

    cfg = compose([*overrides, "trainer.device=cpu"])
    cpu = torch.device("cpu")
    policy = PrecisionPolicy(cfg.precision, cpu, paper_loss_scale=cfg.paper_loss_scale)
    return build(cfg, cpu, policy), policy


@pytest.fixture
def smoke_overrides() -> list[str]:
    return ["experiment=demo", "budget=smoke"]


def option_config(group: str, option: str | None = None, **fields):
    """A model or data config as the option's own schema holds it (mpt_repro/schema.py), with
    `fields` set: the option is `option`, else the `name` field (a model with a `target` is
    model=custom)."""
    from omegaconf import OmegaConf

    from mpt_repro import catalog
    from mpt_repro.registry import option_schemas

    if option is None:
        option = "custom" if fields.get("target") else fields["name"]
    schema = option_schemas()[group][catalog.option_schemas(group)[option]]
    return OmegaConf.structured(schema(**fields))
