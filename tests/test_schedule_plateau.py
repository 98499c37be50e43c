"""optim.plateau_decay: the TensorFlow translate tutorial's learning-rate decay on a plateau, on top
of the LR schedule. The rule as the tutorial writes it (`len(previous_losses) > 2 and loss >
max(previous_losses[-3:])`), its product with the schedule, its checkpoint, and the trainer
feeding it each log row's loss.
"""

from __future__ import annotations

import csv

import pytest
import torch
from conftest import compose, run_cli
from torch import nn

from mpt_repro.precision import PrecisionPolicy
from mpt_repro.schedule import LRSchedule


def schedule(multiplier=lambda i: 1.0, plateau=(0.99, 3)) -> LRSchedule:
    pol = PrecisionPolicy(compose(["experiment=demo"]).precision, "cpu")
    model = nn.Linear(2, 1)
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.5))
    return LRSchedule(opt, multiplier, total_steps=10, hold_on_skip=True, plateau=plateau)


def lr(s: LRSchedule) -> float:
    return float(s.optimizer.param_groups[0]["lr"])


def test_a_loss_above_each_of_the_last_three_rows_decays_the_lr():
    s = schedule()
    for loss in (1.0, 2.0, 3.0):  # rising, but fewer than three earlier rows: no decay
        s.observe(loss)
    assert lr(s) == 0.5
    s.observe(2.5)  # below max(1, 2, 3)
    assert lr(s) == 0.5
    s.observe(3.5)  # above max(2, 3, 2.5)
    assert lr(s) == pytest.approx(0.5 * 0.99)
    s.observe(3.4)  # below max(3, 2.5, 3.5)
    s.observe(float("nan"))  # a non-finite row is not a plateau (divergence is checked apart)
    s.observe(3.6)  # above max(2.5, 3.5, 3.4)
    assert lr(s) == pytest.approx(0.5 * 0.99**2)


def test_the_decay_multiplies_the_schedule_and_survives_a_checkpoint():
    s = schedule(multiplier=lambda i: 0.1**i)
    for loss in (1.0, 1.0, 1.0, 2.0):
        s.observe(loss)
    s.step(True)
    assert lr(s) == pytest.approx(0.5 * 0.99 * 0.1)
    resumed = schedule(multiplier=lambda i: 0.1**i)
    resumed.load_state_dict(s.state_dict())
    assert lr(resumed) == lr(s) and resumed.losses == s.losses
    old = schedule(multiplier=lambda i: 0.1**i)
    old.load_state_dict({"applied": 1})  # a checkpoint from before the plateau decay
    assert lr(old) == pytest.approx(0.5 * 0.1)


def test_without_plateau_decay_the_losses_change_nothing():
    s = schedule(plateau=None)
    for loss in (1.0, 2.0, 3.0, 4.0):
        s.observe(loss)
    assert lr(s) == 0.5


def test_the_trainer_feeds_each_log_rows_loss(tmp_path):
    """With one row of patience and factor 0.5, the LR logged at row i is the base LR halved once
    for each earlier row whose loss rose above the row before it (a row logs its LR before its
    loss is observed)."""
    run_cli(
        "experiment=demo",
        "budget=smoke",
        "trainer.log_every=1",
        "optim.plateau_decay=0.5",
        "optim.plateau_rows=1",
        run_dir=tmp_path,
    )
    with open(tmp_path / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
    losses, lrs = [float(r["loss"]) for r in rows], [float(r["lr"]) for r in rows]
    assert len(rows) == 6
    rises = [0] + [int(b > a) for a, b in zip(losses, losses[1:])]
    assert sum(rises) >= 1  # the smoke run's noisy loss rises: the rule has something to do
    expected = [0.05 * 0.5 ** sum(rises[:i]) for i in range(len(rows))]
    assert lrs == pytest.approx(expected)
