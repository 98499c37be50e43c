"""Settings that moved into a task's option schema (issue 48): a record written before the move
names them by their old place (optim.*) and must still pair with a run of today."""

from __future__ import annotations

import copy

import pytest
from conftest import compose
from omegaconf import OmegaConf

from mpt_repro.identity import MOVED, comparison_config


def _as_written_before(config: dict) -> dict:
    """The config as a record written before issue 48 holds it: the moved keys under optim, at
    the value the run used (or the old default where the task had no such option)."""
    old = copy.deepcopy(config)
    model, optim = old["model"], old["optim"]
    optim["label_smoothing"] = model.pop("label_smoothing", 0.0)
    optim["lm_loss_times_steps"] = model.pop("loss_times_steps", False)
    optim["embedding_grad_scale"] = model.pop("embedding_grad_scale", 1.0)
    return old


@pytest.mark.parametrize("experiment", ["demo", "lstm_lm", "inception_v3"])
def test_a_record_with_the_old_keys_pairs_with_todays_run(experiment):
    today = OmegaConf.to_container(compose([f"experiment={experiment}"]), resolve=True)
    before = _as_written_before(today)
    assert comparison_config(before) == comparison_config(today)
    # ... and a changed value under the old name still keeps them apart
    before["optim"]["label_smoothing"] = 0.3
    assert comparison_config(before) != comparison_config(today)
    moved = ("label_smoothing", "lm_loss_times_steps", "embedding_grad_scale")
    assert set(MOVED) == {f"optim.{k}" for k in moved}
