"""The trainer's own rules, on a minimal two-optimizer task (no data set needed)."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import compose

from mpt_repro.precision import PrecisionPolicy
from mpt_repro.tasks.base import StepResult, Task
from mpt_repro.trainer import Trainer


class TwoOptimizers(Task):
    """Optimizer `a` always steps; `b` reports a skipped step every iteration (an overflow)."""

    metric_names = ["loss"]

    def __init__(self, cfg, device, policy):
        super().__init__(cfg, device, policy)
        self.models = {"a": torch.nn.Linear(1, 1), "b": torch.nn.Linear(1, 1)}
        self.optimizers = {
            k: torch.optim.SGD(m.parameters(), lr=1.0) for k, m in self.models.items()
        }

    def steps_per_epoch(self) -> int:
        return 4

    def train_batches(self, epoch, skip=0):
        return iter(range(skip, 4))

    def train_step(self, batch) -> StepResult:
        return StepResult(
            loss=torch.tensor(1.0), stepped=False, samples=1, stepped_by={"a": True, "b": False}
        )

    def evaluate(self):
        return {"loss": 1.0}


def test_each_lr_schedule_is_held_only_when_its_own_optimizer_skipped(tmp_path: Path) -> None:
    # linear warm-up over the 4 steps: a schedule that advanced shows a larger LR
    cfg = compose(
        [
            "experiment=demo",
            "budget=smoke",
            "trainer.max_steps=4",
            "optim.warmup_epochs=1",
            "trainer.progress=false",
        ]
    )
    policy = PrecisionPolicy(cfg.precision, torch.device("cpu"))
    task = TwoOptimizers(cfg, torch.device("cpu"), policy)
    trainer = Trainer(cfg, task, policy, tmp_path)
    trainer.fit()
    trainer.close()
    assert trainer.schedulers["a"].last_epoch == 4  # stepped every iteration
    assert trainer.schedulers["b"].last_epoch == 0  # held: its optimizer never stepped
