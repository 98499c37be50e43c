"""The trainer's own rules, on a minimal two-optimizer task (no data set needed)."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose

from mpt_repro.errors import Interrupted
from mpt_repro.evidence import Evaluation, Ratio, from_columns
from mpt_repro.optim import lr_multiplier, optimizer_factory
from mpt_repro.precision import PrecisionPolicy
from mpt_repro.schedule import LRSchedule
from mpt_repro.tasks.base import StepResult, Task
from mpt_repro.trainer import Clock, LogWindow, Trainer


def loss_of_one() -> Evaluation:
    """An evaluation of one item whose loss is 1 (what a task's evaluate returns)."""
    columns = {"loss": np.array([1.0]), "items": np.array([1.0])}
    return from_columns(columns, {"loss": Ratio("loss", "items", "items")}, "items")


STEPS = 4


class TwoOptimizers(Task):
    """Optimizer `a` always steps; `b` reports a skipped step every iteration (an overflow)."""

    metric_names = ["loss"]

    def __init__(self, cfg, device, policy):
        super().__init__(cfg, device, policy)
        self.models = {"a": torch.nn.Linear(1, 1), "b": torch.nn.Linear(1, 1)}
        make = optimizer_factory(cfg.optim)
        self.optimizers = {
            k: policy.build_optimizer(m, make, name=k) for k, m in self.models.items()
        }

    def steps_per_epoch(self) -> int:
        return STEPS

    def train_batches(self, epoch, skip=0):
        return iter(range(skip, STEPS))

    def train_step(self, batch) -> StepResult:
        yes, no = torch.tensor(True), torch.tensor(False)
        return StepResult(
            loss=torch.tensor(1.0), stepped=no, samples=1, stepped_by={"a": yes, "b": no}
        )

    def evaluate(self):
        return loss_of_one()


@pytest.mark.parametrize("fused", ["true", "false"])  # LR count on the device, or on the host
@pytest.mark.parametrize("hold", [True, False])
def test_each_lr_schedule_is_held_only_when_its_own_optimizer_skipped(
    tmp_path: Path, hold: bool, fused: str
) -> None:
    # linear warm-up over the 4 steps: a schedule that advanced shows a larger LR
    cfg = compose(
        [
            "experiment=demo",
            "budget=smoke",
            "precision=amp",
            f"precision.hold_lr_on_skip={str(hold).lower()}",
            f"optim.fused={fused}",
            f"trainer.max_steps={STEPS}",
            "optim.warmup_epochs=1",
            "trainer.progress=false",
        ]
    )
    policy = PrecisionPolicy(cfg.precision, torch.device("cpu"))
    task = TwoOptimizers(cfg, torch.device("cpu"), policy)
    trainer = Trainer(cfg, task, policy, tmp_path)
    assert trainer.schedules["a"].on_device == (hold and fused == "true")
    trainer.fit()
    trainer.close()
    factor = lr_multiplier(cfg.optim, STEPS, STEPS)
    held = 0 if hold else STEPS  # b never stepped: held at 0, or advanced like a
    assert trainer.schedules["a"].applied == STEPS
    assert trainer.schedules["b"].applied == held
    for name, applied in (("a", STEPS), ("b", held)):
        lr = float(task.optimizers[name].param_groups[0]["lr"])
        assert lr == pytest.approx(cfg.optim.lr * factor(applied), rel=1e-7)


class FakeTime:
    """perf_counter for mpt_repro.trainer: each reading advances it by one tick (1 ms), and
    advance() stands for time spent elsewhere, so timing assertions count readings, not the
    machine's speed (issue 34: they failed under load)."""

    current: FakeTime
    TICK = 1e-3

    def __init__(self):
        self.now = 0.0
        FakeTime.current = self

    def perf_counter(self) -> float:
        self.now += self.TICK
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch) -> FakeTime:
    from types import SimpleNamespace

    import mpt_repro.trainer

    fake = FakeTime()
    monkeypatch.setattr(mpt_repro.trainer, "time", SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


class Scripted(Task):
    """One optimizer; the loss of iteration i (1-based) is NaN from `nan_from` on; evaluation
    takes `eval_s` seconds of wall time."""

    metric_names = ["loss"]

    def __init__(self, cfg, device, policy, nan_from: int | None = None, eval_s: float = 0.0):
        super().__init__(cfg, device, policy)
        self.models = {"model": torch.nn.Linear(1, 1)}
        make = optimizer_factory(cfg.optim)
        self.optimizers = {"model": policy.build_optimizer(self.models["model"], make)}
        self.nan_from, self.eval_s, self.calls = nan_from, eval_s, 0

    def steps_per_epoch(self) -> int:
        return 100

    def train_batches(self, epoch, skip=0):
        return iter(range(skip, 100))

    def train_step(self, batch) -> StepResult:
        self.calls += 1
        bad = self.nan_from is not None and self.calls >= self.nan_from
        loss = torch.tensor(float("nan") if bad else 1.0)
        return StepResult(loss=loss, stepped=torch.tensor(True), samples=1)

    def evaluate(self):
        if self.eval_s:
            FakeTime.current.advance(self.eval_s)  # evaluation time, on the test's own clock
        return loss_of_one()


def trainer_for(tmp_path, *overrides, **task_kw):
    cfg = compose(["experiment=demo", "budget=smoke", "trainer.progress=false", *overrides])
    policy = PrecisionPolicy(cfg.precision, torch.device("cpu"))
    task = Scripted(cfg, torch.device("cpu"), policy, **task_kw)
    return Trainer(cfg, task, policy, tmp_path)


@pytest.mark.parametrize("log_every", [1, 4])
def test_divergence_names_the_first_non_finite_iteration(tmp_path: Path, log_every: int) -> None:
    from mpt_repro.errors import Diverged

    trainer = trainer_for(
        tmp_path,
        "trainer.max_steps=20",
        "trainer.diverge_patience=3",
        f"trainer.log_every={log_every}",
        nan_from=6,
    )
    with pytest.raises(Diverged) as e:
        trainer.fit()
    trainer.close()
    assert e.value.step == 6  # iterations 6, 7, 8 were non-finite: it began at 6, not 5 or 7
    assert trainer.step == 8  # noticed at the first log row with a streak of 3 (8 for both)


def test_evaluation_and_checkpoint_time_is_not_training_time(tmp_path: Path, fake_time) -> None:
    trainer = trainer_for(
        tmp_path, "trainer.max_steps=4", "trainer.eval_every=1", "trainer.log_every=1", eval_s=100
    )
    summary = trainer.fit()
    trainer.close()
    # 3 evaluations inside the loop plus the final one: 400 s on the fake clock, none of it
    # training; training is the clock's own readings (a tick each), whatever the machine's speed
    assert summary["train_time_s"] < 0.1
    assert summary["samples_per_s"] > 4 / 0.1


def test_parameter_ema_is_fp32_follows_only_applied_steps_and_is_what_evaluation_sees():
    from mpt_repro.ema import ParameterEMA

    cfg = compose(["experiment=demo", "precision=mixed", "optim.fused=true"])
    policy = PrecisionPolicy(cfg.precision, torch.device("cpu"))
    model = policy.prepare_model(torch.nn.Linear(2, 1, bias=False))
    opt = policy.build_optimizer(model, optimizer_factory(cfg.optim))
    with torch.no_grad():
        opt.params[0].fill_(1.0)  # the FP32 master
        model.weight.fill_(1.0)
    ema = ParameterEMA(model, opt, decay=0.9)
    assert ema.shadow[0].dtype == torch.float32
    with torch.no_grad():
        opt.params[0].fill_(1.0 + 2.0**-12)  # a change FP16 cannot hold next to 1.0 ...
    ema.update(torch.tensor(True))
    ema.update(torch.tensor(False))  # a skipped step moves nothing
    # ... but the FP32 average keeps 0.1 * 2^-12
    assert ema.shadow[0][0, 0].item() == pytest.approx(1.0 + 0.1 * 2.0**-12, abs=2e-7)  # FP32 ulp
    with torch.no_grad():
        model.weight.fill_(3.0)
    with ema.applied():
        assert model.weight.dtype == torch.float16 and model.weight[0, 0].item() == 1.0
    assert model.weight[0, 0].item() == 3.0  # the model's own weights back after evaluation


def test_bn_recalibration_gives_the_plain_average_of_the_batches_statistics():
    from mpt_repro.tasks.base import recalibrate_bn

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, momentum=0.1))
    model.eval()
    with torch.no_grad():
        model[1].running_mean.fill_(1e6)  # what a few steps of a diverging start can leave
    xs = [torch.randn(8, 3) for _ in range(3)]
    assert recalibrate_bn(model, iter(xs)) == 3
    with torch.no_grad():
        feats = [model[0](x) for x in xs]
    want = torch.stack([f.mean(0) for f in feats]).mean(0)
    torch.testing.assert_close(model[1].running_mean, want)
    assert model[1].momentum == 0.1 and not model.training  # left as it was found


# -- stopped at an epoch's end, then resumed ---------------------------------------------------
class Draws(Task):
    """Three batches an epoch; each step records its (epoch, batch) and one draw from each random
    stream that a task's training uses (torch, numpy, Python's), and updates a Linear (the test
    module calls the optimizer itself: only mpt_repro's tasks must leave that to the loops)."""

    metric_names = ["loss"]

    def __init__(self, cfg, device, policy):
        super().__init__(cfg, device, policy)
        self.models = {"model": torch.nn.Linear(1, 1)}
        make = optimizer_factory(cfg.optim)
        self.optimizers = {"model": policy.build_optimizer(self.models["model"], make)}
        self.seen: list[tuple[int, int]] = []
        self.draws: list[tuple[float, float, float]] = []

    def steps_per_epoch(self) -> int:
        return 3

    def train_batches(self, epoch, skip=0):
        return iter([(epoch, i) for i in range(skip, 3)])

    def train_step(self, batch) -> StepResult:
        self.seen.append(batch)
        self.draws.append((torch.rand(1).item(), np.random.rand(), random.random()))
        # a real update, so that the weights and the LR schedule have something to restore
        opt = self.optimizers["model"]
        opt.zero_grad()
        loss = self.models["model"](torch.full((1, 1), batch[1] + 1.0)).pow(2).mean()
        opt.backward(loss)
        return StepResult(loss=loss.detach(), stepped=opt.step(), samples=1)

    def evaluate(self):
        return loss_of_one()


class StopAfter:
    """A callback that asks for a stop (as SIGTERM does) at the end of iteration `step` (the
    trainer passes on_step_end the iterations done, this one included)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer: Trainer, step: int, result: StepResult) -> None:
        if step == self.step:
            trainer._stop_signal = signal.SIGTERM


def fit_draws(run_dir: Path, *overrides: str, stop_after: int | None = None) -> Draws:
    """Two epochs of Draws from seed 0 (what run.py seeds a process with, a resumed one too)."""
    cfg = compose(
        ["experiment=demo", "budget=smoke", "trainer.progress=false", "trainer.epochs=2"]
        + ["trainer.max_steps=null", "trainer.eval_every=null", "optim.warmup_epochs=2"]
        + list(overrides)
    )
    run_dir.mkdir(exist_ok=True)
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    policy = PrecisionPolicy(cfg.precision, torch.device("cpu"))
    task = Draws(cfg, torch.device("cpu"), policy)
    callbacks = [StopAfter(stop_after)] if stop_after else []
    trainer = Trainer(cfg, task, policy, run_dir, callbacks=callbacks)
    try:
        trainer.fit()
    except Interrupted:
        pass
    finally:
        trainer.close()
    return task


@pytest.fixture(scope="module")
def stopped_twice(tmp_path_factory) -> tuple[Draws, list[Draws]]:
    """An uninterrupted run, and the same run stopped after the last batch of epoch 0, resumed,
    stopped in the middle of epoch 1, and resumed to its end."""
    tmp = tmp_path_factory.mktemp("stopped")
    straight = fit_draws(tmp / "straight")
    parts = [
        fit_draws(tmp / "stopped", stop_after=3),
        fit_draws(tmp / "stopped", "resume=true", stop_after=4),
        fit_draws(tmp / "stopped", "resume=true"),
    ]
    return straight, parts


def test_a_checkpoint_resumes_at_the_next_batch_at_an_epoch_end_or_inside_one(
    stopped_twice,
) -> None:
    straight, parts = stopped_twice
    assert straight.seen == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    # not epoch 0 again, no batch skipped or repeated
    assert [p.seen for p in parts] == [straight.seen[:3], [(1, 0)], [(1, 1), (1, 2)]]


def test_a_resumed_run_continues_every_random_stream_where_it_stopped(stopped_twice) -> None:
    """Each resumed process was seeded like the first one; the checkpoint's streams replace that
    seed's, so the draws go on as in an uninterrupted run instead of repeating the first ones."""
    straight, parts = stopped_twice
    assert [d for p in parts for d in p.draws] == straight.draws


def test_a_resumed_run_ends_with_the_weights_and_learning_rate_of_an_uninterrupted_one(
    stopped_twice,
) -> None:
    straight, parts = stopped_twice
    for got, want in zip(
        parts[-1].models["model"].parameters(), straight.models["model"].parameters()
    ):
        assert torch.equal(got, want)
    lr = [t.optimizers["model"].param_groups[0]["lr"] for t in (parts[-1], straight)]
    assert lr[0] == lr[1] != parts[0].optimizers["model"].param_groups[0]["lr"]  # it moved


def test_each_lap_of_the_clock_counts_from_the_one_before(fake_time) -> None:
    clock = Clock(torch.device("cpu"))
    for _ in range(2):
        clock.start()
        fake_time.advance(2.0)
        clock.stop()
        # the lap since start(): 2 s and the tick of stop()'s own reading, twice, not cumulative
        assert clock.take_lap() == pytest.approx(2.0 + FakeTime.TICK)
    assert clock.total == pytest.approx(2 * (2.0 + FakeTime.TICK))
    with clock.paused():  # not running: pausing leaves it stopped
        fake_time.advance(5.0)
    assert clock.take_lap() == 0.0


def test_the_log_window_sums_losses_samples_and_the_task_s_extra_scalars() -> None:
    window = LogWindow()
    for value in (1.0, 3.0):
        scalar = torch.tensor(value)
        window.add(StepResult(scalar, torch.tensor(True), samples=2, logs={"part": scalar}))
    assert (float(window.loss_sum), window.count, window.samples) == (4.0, 2, 4)
    assert window.mean_logs() == {"part": 2.0}


def test_train_rows_are_logged_every_log_every_iterations_and_at_the_last(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, "trainer.max_steps=7", "trainer.log_every=3")
    trainer.fit()
    rows = [(row["step"], row["split"]) for row in trainer.metrics.rows]
    trainer.close()
    assert [step for step, split in rows if split == "train"] == [3, 6, 7]


@pytest.mark.parametrize("fused", ["true", "false"])  # the skip read on the device, or the host
def test_a_real_overflow_holds_the_lr_schedule_and_a_clean_step_advances_it(fused: str) -> None:
    cfg = compose(
        ["experiment=demo", "precision=amp", "precision.hold_lr_on_skip=true"]
        + [f"optim.fused={fused}", "optim.warmup_epochs=2"]
    )
    policy = PrecisionPolicy(cfg.precision, torch.device("cpu"))
    model = torch.nn.Linear(1, 1)
    opt = policy.build_optimizer(model, optimizer_factory(cfg.optim))
    schedule = LRSchedule(opt, lr_multiplier(cfg.optim, STEPS, STEPS), STEPS, True)
    applied = []
    for grad in (float("inf"), 1.0):
        model.weight.grad = torch.full_like(model.weight, grad)
        model.bias.grad = torch.zeros_like(model.bias)
        schedule.step(opt.step())
        applied.append(schedule.applied)
    assert applied == [0, 1]  # the overflowing step was skipped and did not count


def test_the_summary_holds_the_last_evaluation_and_its_step(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, "trainer.max_steps=7", "trainer.eval_every=3")
    summary = trainer.fit()
    trainer.close()
    assert summary["metrics"] == {"loss": 1.0} and trainer.last_eval_step == 7


def test_a_streak_of_non_finite_losses_carries_across_a_resume(tmp_path: Path) -> None:
    """Iterations 3 and 4 non-finite, a stop after 4, then a resumed run whose first iteration (5)
    is non-finite too: three in a row from iteration 3 (patience 3), not a new streak from 5."""
    from mpt_repro.errors import Diverged

    settings = ("trainer.max_steps=20", "trainer.diverge_patience=3")
    first = trainer_for(tmp_path, *settings, nan_from=3)
    first.callbacks.append(StopAfter(4))
    with pytest.raises(Interrupted):
        first.fit()
    first.close()
    resumed = trainer_for(tmp_path, *settings, "resume=true", nan_from=1)
    with pytest.raises(Diverged) as e:
        resumed.fit()
    resumed.close()
    assert (e.value.step, resumed.step) == (3, 5)
