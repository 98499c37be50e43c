"""The shared training step and evaluation loop (mpt_repro/tasks/loops.py), and the precision
plug-ins they rely on (converters and the scaler's floor), on toy tasks with exact gradients."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import compose
from omegaconf import OmegaConf
from torch import nn

from mpt_repro.evidence import Ratio
from mpt_repro.precision import PrecisionConfig, PrecisionPolicy
from mpt_repro.precision.config import Dtype, LossScaling, WeightStorage
from mpt_repro.precision.converters import CONVERTERS, Converter
from mpt_repro.tasks.base import Loss, Phase, Task

pytestmark = pytest.mark.usefixtures("one_thread")

TASKS_DIR = Path(__file__).resolve().parents[1] / "mpt_repro" / "tasks"


def amp(**knobs) -> PrecisionConfig:
    """FP32 weights, FP16 autocast, dynamic scaling (the amp preset's knobs)."""
    base = dict(
        name="amp",
        compute_dtype=Dtype.float16,
        weights=WeightStorage.fp32_autocast,
        master_weights=False,
        loss_scaling=LossScaling.dynamic,
    )
    return PrecisionConfig(**{**base, **knobs})


class Scalar(nn.Module):
    """One parameter w: the loss w * sum(x) has the gradient sum(x), exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum()


class Toy(Task):
    """A task written against the interface only: models from add_model, a loss per micro-batch,
    evaluation by items: eval_step's per-item columns, metrics from their sums."""

    item_unit = "values"
    formulas = {"loss": Ratio("loss", "items", "values")}

    def __init__(self, policy: PrecisionPolicy, names=("model",)):
        cfg = OmegaConf.create({"seed": 0, "optim": {"grad_clip": None}, "distributed": {}})
        super().__init__(cfg, torch.device("cpu"), policy)
        for name in names:
            self.add_model(name, Scalar(), lambda params: torch.optim.SGD(params, lr=1.0))
        self.grad_factor = 1.0
        self.seen_in_eval: list[tuple[bool, bool]] = []

    def split(self, batch: list[torch.Tensor]) -> list[torch.Tensor]:
        return batch  # each iteration's item is its list of micro-batches

    def loss(self, x: torch.Tensor) -> Loss:
        value = self.train_models["model"](x)
        return Loss(value, samples=len(x), logs={"x_max": x.max()}, grad_factor=self.grad_factor)

    def eval_batches(self):
        return [torch.tensor([1.0, 2.0]), torch.tensor([4.0])]

    def eval_step(self, x: torch.Tensor) -> dict:
        self.seen_in_eval.append((self.models["model"].training, torch.is_grad_enabled()))
        w = self.models["model"].w
        return {"loss": w * x, "items": torch.ones_like(x), "batch": [len(x)] * len(x)}


def test_micro_batches_step_once_on_the_mean_gradient_times_the_grad_factor() -> None:
    task = Toy(PrecisionPolicy(amp(loss_scaling=LossScaling.none, compute_dtype=Dtype.float32)))
    task.grad_factor = 2.0
    result = task.train_step([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0])])
    # the mean over both micro-batches: (3 + 8) / 2; backward differentiates it twice over
    assert task.models["model"].w.item() == 1.0 - 2.0 * 5.5
    assert result.loss.item() == 5.5  # the reported loss leaves grad_factor out
    assert result.samples == 4 and result.logs["x_max"].item() == (2.0 + 5.0) / 2
    assert bool(result.stepped) and result.stepped_by == {}
    assert task.models["model"].training  # the step put the training forward in train mode


class TwoPhases(Toy):
    """A GAN's shape: phase d steps `model` on a loss that also reaches `other`'s parameter;
    phase g steps `other` once on the whole iteration."""

    def __init__(self, policy: PrecisionPolicy):
        super().__init__(policy, names=("model", "other"))
        self.other_grads: list[float] = []
        self.models["other"].w.register_hook(lambda g: self.other_grads.append(g.item()))

    def phases(self) -> list[Phase]:
        return [
            Phase("model", self.loss_d, (self.train_models["model"],), name="d"),
            Phase("other", self.loss_g, accumulate=False, name="g"),
        ]

    def loss_d(self, x: torch.Tensor) -> Loss:
        both = self.train_models["model"](x) + self.train_models["other"](x)
        return Loss(both, samples=len(x))

    def loss_g(self, items: list[torch.Tensor]) -> Loss:
        return Loss(self.train_models["other"](torch.ones(1)))


def test_a_shared_loss_scale_serves_both_phases_and_moves_once_per_iteration() -> None:
    policy = PrecisionPolicy(amp(init_scale=16.0, growth_interval=1, per_loss_scale=False))
    task = TwoPhases(policy)
    result = task.train_step([torch.tensor([3.0])])
    # phase g back-propagates at the scale the iteration began with, not one moved after d
    assert task.other_grads == [3.0 * 16, 1.0 * 16]
    # one clean iteration with growth_interval=1: one growth (x2), not one per optimizer
    assert policy.loss_scales() == {"model": 32.0, "other": 32.0}
    # phase g saw only its own loss's gradient: d's gradient on `other` (3) was dropped
    assert task.models["other"].w.item() == 1.0 - 1.0
    assert list(result.logs) == ["d_loss", "g_loss", "d_stepped", "g_stepped"]
    assert set(result.stepped_by) == {"model", "other"} and bool(result.stepped)
    assert result.loss.item() == 3.0 + 3.0 + 1.0  # both phases' losses (weights before steps)


def test_the_evaluation_loop_joins_item_columns_in_eval_mode_without_grad() -> None:
    task = Toy(PrecisionPolicy(amp(loss_scaling=LossScaling.none, compute_dtype=Dtype.float32)))
    found = task.evaluate()
    assert found.metrics == {"loss": (1.0 + 2.0 + 4.0) / 3}
    # the count under the metric, and every column of every item (extra ones kept too)
    assert found.counts == {"loss": 3} and found.items == 3 and found.unit == "values"
    assert found.columns["loss"].tolist() == [1.0, 2.0, 4.0]
    assert found.columns["batch"].tolist() == [2, 2, 1] and found.undefined == {}
    assert task.seen_in_eval == [(False, False), (False, False)]


def test_an_evaluation_with_no_item_has_undefined_metrics_never_a_number() -> None:
    task = Toy(PrecisionPolicy(amp(loss_scaling=LossScaling.none, compute_dtype=Dtype.float32)))
    task.eval_batches = lambda: []
    found = task.evaluate()
    assert found.metrics == {"loss": None} and found.counts == {"loss": 0}
    assert found.undefined == {"loss": "no values to score (0 values evaluated)"}


class Totals(Toy):
    """A task that sums its own totals (as detection does): evaluation_of reads them."""

    formulas = None

    def eval_totals(self) -> dict:
        return {"loss": 0.0, "n": 0, "sizes": []}

    def eval_step(self, x: torch.Tensor) -> dict:
        return {"loss": self.models["model"](x), "n": len(x), "sizes": [len(x)]}


def test_the_totals_path_sums_numbers_and_joins_lists() -> None:
    task = Totals(PrecisionPolicy(amp(loss_scaling=LossScaling.none, compute_dtype=Dtype.float32)))
    seen = {}
    task.evaluation_of = lambda totals: seen.update(totals) or "done"
    assert task.evaluate() == "done"
    assert seen == {"loss": 1.0 + 2.0 + 4.0, "n": 3.0, "sizes": [2, 1]}


def test_no_task_module_calls_backward_autocast_or_an_optimizer_step() -> None:
    """Only the shared loops do (precision handled once for every task)."""
    calls = re.compile(r"\.backward\(|autocast\(|\.step\(")
    for path in TASKS_DIR.glob("*.py"):
        if path.name != "loops.py":
            assert not calls.findall(path.read_text()), path.name


class Tagging(Converter):
    """A number format that only marks the model: each call of the interface is observable."""

    @classmethod
    def wanted(cls, cfg) -> bool:
        return cfg.name == "tagged"

    def convert(self, model: nn.Module) -> nn.Module:
        model.tagged = True
        return model

    def step_hook(self, model: nn.Module):
        return StepCounter()

    def scale_floor(self, step: int) -> float:
        return 2.0**step  # a floor that doubles at every update

    def describe(self) -> str:
        return "tagged format"


class StepCounter:
    key = "tag"

    def __init__(self) -> None:
        self.calls = 0

    def after_step(self, params) -> None:
        self.calls += 1

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, sd: dict) -> None:
        self.calls = sd["calls"]

    def summary(self) -> dict:
        return {"calls": self.calls}


def test_a_registered_converter_plugs_into_the_policy_the_optimizer_and_the_scaler(
    monkeypatch,
) -> None:
    monkeypatch.setitem(CONVERTERS, "tagging", Tagging)
    policy = PrecisionPolicy(amp(name="tagged", init_scale=1.0))
    task = Toy(policy)
    assert task.models["model"].tagged and "tagged format" in policy.describe()
    for _ in range(3):
        task.train_step([torch.tensor([1.0])])
    opt = task.optimizers["model"]
    assert opt.hooks[0].calls == 3 and opt.state_dict()["tag"] == {"calls": 3}
    assert policy.summary()["diagnostics"]["tag"] == {"calls": 3}
    assert opt.scaler.floor() == 8.0 and opt.loss_scale == 8.0  # lifted by the rising floor
    untagged = PrecisionPolicy(amp(init_scale=1.0))
    assert untagged.converters == [] and "tagged" not in untagged.describe()


def test_the_fp8_rising_floor_lifts_the_scale() -> None:
    """precision.fp8's enhanced loss scaling reaches the scaler through the FP8 converter: at
    the scaler's update k the floor is min_scale x 2^k (min_scale_rise_every=1, factor 2)."""
    cfg = compose(
        [
            "precision=fp8_e5m2_emulated",
            "precision.init_scale=1",
            "precision.fp8.min_scale_rise_every=1",
        ]
    ).precision
    policy = PrecisionPolicy(cfg, "cpu")
    task = Toy(policy)
    for _ in range(3):
        task.train_step([torch.tensor([1.0])])
    scaler = task.optimizers["model"].scaler
    assert scaler.floor() == 8.0 and scaler.scale == 8.0  # at 1.0 were the floor ignored
    assert [type(c).__name__ for c in policy.converters] == ["EmulatedFP8"]
