"""Start-up refusals through the real mpt-run (issue 34): what torch would have answered with a
traceback and exit 1 is one line naming the key, exit 2."""

from __future__ import annotations

import pytest
from conftest import ROOT, run_cli


def _one_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run:")]
    return line


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("seed=1099511627776", "seed must be in 0..2147483647 (numpy's generator"),
        ("trainer.device=cuda:abc", "trainer.device must be auto, cpu, cuda or cuda:N"),
    ],
)
def test_a_seed_too_large_and_a_malformed_device_are_refused_before_anything(
    tmp_path, override, expected
) -> None:
    proc = run_cli("experiment=demo", override, run_dir=tmp_path / "run", check=False)
    assert expected in _one_line(proc)
    assert not (tmp_path / "run").exists()


def test_a_custom_model_without_parameters_is_one_line_before_anything_is_written(tmp_path) -> None:
    env = {"PYTHONPATH": str(ROOT / "tests"), "OMP_NUM_THREADS": "1"}
    proc = run_cli("experiment=demo", "budget=smoke", "trainer.device=cpu", "model=custom",
                   "model.target=helpers_faults:no_parameters", run_dir=tmp_path / "run",
                   check=False, env=env)  # fmt: skip
    line = _one_line(proc)
    assert line.startswith(
        "mpt-run: error: model.target='helpers_faults:no_parameters' returned a _NoParameters "
        "with no trainable parameters: there is nothing to train."
    ), line
    # refused while the run is built, like any other model.target refusal: nothing half made
    assert not (tmp_path / "run").exists()


def _cfg(**data):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "data": {"batch_size": 8, "max_seconds": None, **data},
            "trainer": {"accumulate": 1},
            "distributed": {"batch_size_is": "per_process"},
        }
    )


def test_no_full_step_names_the_setting_that_decides_it() -> None:
    from types import SimpleNamespace

    from mpt_repro.trainer import no_full_step

    task = SimpleNamespace(data=SimpleNamespace(train=[0] * 5))
    assert no_full_step(_cfg(), task) == (
        "one optimizer step takes 8 training items (data.batch_size=8), more than the training "
        "split's 5 items: lower data.batch_size, or use more data (data.train_limit)"
    )
    assert no_full_step(_cfg(max_seconds=2.5), task).endswith(
        "more than the training split's 5 items (those data.max_seconds=2.5 keeps): raise "
        "data.max_seconds (or set it to null), or lower data.batch_size"
    )


def test_an_accumulation_larger_than_the_data_names_trainer_accumulate(tmp_path) -> None:
    """trainer.accumulate=100000 was blamed on data.batch_size."""
    proc = run_cli("experiment=demo", "budget=smoke", "trainer.device=cpu",
                   "trainer.accumulate=100000", run_dir=tmp_path / "run", check=False,
                   env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert _one_line(proc) == (
        "mpt-run: error: one optimizer step takes 800000 training items (data.batch_size=8 x "
        "trainer.accumulate=100000 micro-batches), more than the training split's 64 items: "
        "lower trainer.accumulate (at most 8 here)"
    )
