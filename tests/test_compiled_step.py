"""trainer.compile=step (issue 47): the classification iteration as one compiled graph.

What is checked, and how fast:

- one graph, no graph break, no recompile after the first two steps, overflowing (skipped)
  steps included, for fp32, amp, mixed and bf16: torch.compile with the `eager` backend (the same
  capture, guards and graph breaks as inductor, without its code generation: seconds);
- numbers against the eager step over the same steps: the same skip pattern, and weights within
  the stated tolerance (``TOLERANCE_ULPS``, below). The `eager`/`aot_eager` backends run the
  traced math (functional foreach optimizer, torch.where skip) with eager kernels; inductor's
  code generation, which rounds low-precision chains differently, is the slow test;
- Adam's skipped steps leave its state (step count, moments) as the fused kernel leaves it;
- a resumed compiled run continues bit for bit;
- the refusals, through the real config and task build;
- `mpt-run ... trainer.compile=step` end to end, beside the eager run (slow: ~45 s of CPU with a
  cold inductor cache).

The tolerance. The compiled step does the eager step's arithmetic, but not necessarily in the
same order or with the same intermediate roundings: inductor keeps a fused chain of FP16/BF16
ops in FP32 and rounds once where eager rounds each op; the foreach optimizer rounds
``p - lr * buf`` where the fused kernel may not; the master weights' rounding to FP16 can then
flip by one ulp. Each applied step's update of a tensor may so differ by some ulps of the
compute dtype times that update, and the differences add up over the applied steps. The bound:
after n applied steps, max |w_step - w_eager| <= n * TOLERANCE_ULPS * eps(compute dtype) * U,
U the largest single-step change of that tensor in the eager run. Measured on the demo, 8 steps
(4 applied for amp/mixed: 4 overflow skips), in units of n * eps * U: inductor fp32 35
(eps = FP32's), amp 33, mixed 0.55, bf16 22; eager/aot_eager backends fp32 35, the others
< 0.001. TOLERANCE_ULPS = 64 leaves a factor of ~2. Adam divides by the root of its second
moment, which turns a one-ulp difference in a near-zero gradient into one of order the LR
(measured: 47-250 of those units over 8 steps), so Adam is compared over its first applied
step, where the gradients are the same and only the kernels' rounding differs.
"""

from __future__ import annotations

import math

import conftest
import pytest
import torch
from torch._dynamo.utils import counters

from mpt_repro.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")
PRESETS = ["fp32", "amp", "mixed", "bf16"]
TOLERANCE_ULPS = 64
# a scale so large that the first steps overflow (2^20 x the demo's gradients > FP16's range),
# growing back after 2 clean steps: overflows also after clean steps
OVERFLOWS = ("precision.init_scale=1048576", "precision.growth_interval=2")


@pytest.fixture
def backend(request, monkeypatch):
    """torch.compile with the backend the test names (`eager` unless parametrized), so a
    test about tracing takes seconds; dynamo's caches and counters reset around it."""
    name = getattr(request, "param", "eager")
    real = torch.compile

    def compile_with(fn=None, **kwargs):
        if name != "inductor":
            kwargs.pop("mode", None)
            kwargs["backend"] = name
        return real(fn, **kwargs)

    monkeypatch.setattr(torch, "compile", compile_with)
    torch._dynamo.reset()
    counters.clear()
    yield name
    torch._dynamo.reset()


def build(preset: str, compile_: str, *extra: str, overflows: bool = True):
    return conftest.build_task(
        "experiment=demo",
        "budget=smoke",
        f"precision={preset}",
        f"trainer.compile={compile_}",
        *(OVERFLOWS if overflows else ()),
        *extra,
    )


def train(task, steps: int, skip: int = 0) -> list[bool]:
    """`steps` iterations; whether each one's update was applied."""
    applied = []
    for i, batch in enumerate(task.train_batches(0, skip=skip)):
        if i == steps:
            break
        applied.append(bool(task.train_step(batch).stepped))
    return applied


def trajectory(
    task, steps: int, start: int = 0
) -> tuple[list[bool], list[torch.Tensor], list[float]]:
    """(applied per step, the optimizer's tensors after, each tensor's largest single-step
    change) over iterations start .. start + steps - 1."""
    params = task.optimizers["model"].params
    before = [p.detach().clone() for p in params]
    largest = [0.0] * len(params)
    applied = []
    for _ in range(steps):
        applied += train(task, 1, skip=start + len(applied))
        now = [p.detach().clone() for p in params]
        largest = [max(u, float((a - b).abs().max())) for u, a, b in zip(largest, now, before)]
        before = now
    return applied, before, largest


def assert_within_tolerance(eager, compiled, dtype: torch.dtype) -> None:
    (applied, weights, largest), (applied_c, weights_c, _) = eager, compiled
    assert applied_c == applied  # the same steps skipped
    n, eps = sum(applied), torch.finfo(dtype).eps
    for w, wc, u in zip(weights, weights_c, largest):
        bound = n * TOLERANCE_ULPS * eps * u
        assert float((wc - w).abs().max()) <= bound, (float((wc - w).abs().max()), bound)


# -- one graph, no recompile ---------------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_the_step_is_one_graph_that_overflows_without_recompiling(preset, backend):
    """Two steps to settle, then four more with recompiling an error; overflowing steps among
    them for the scaled presets. The same steps as the eager step, to the tolerance."""
    task, policy = build(preset, "step")
    eager = trajectory(build(preset, "false")[0], 6)
    first = trajectory(task, 2)
    with torch._dynamo.config.patch(error_on_recompile=True):
        rest = trajectory(task, 4, start=2)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    applied = first[0] + rest[0]
    if policy.scaling_kind != "none":  # overflows after the first two steps, then clean ones
        assert False in rest[0] and True in rest[0], applied
        assert policy.scalars()["skipped_steps"] == applied.count(False)
    assert_within_tolerance(eager, (applied, rest[1], None), policy.compute_dtype)


def test_clipping_is_traced_and_clips_as_the_eager_step(backend):
    """optim.grad_clip: the norm of the unscaled gradients, clipped inside the graph."""
    task, policy = build("mixed", "step", "optim.grad_clip=0.05")
    eager = trajectory(build("mixed", "false", "optim.grad_clip=0.05")[0], 5)
    compiled = trajectory(task, 5)
    assert dict(counters["graph_break"]) == {}
    assert_within_tolerance(eager, compiled, policy.compute_dtype)


@pytest.mark.parametrize("hold", [True, False])
def test_a_changing_lr_recompiles_nothing(hold, backend):
    """An LR halved at every applied update: held on skips, a device tensor the schedule moves
    (no host read); not held, a float the step copies into a tensor of its own. Neither
    recompiles; the schedule counts the same updates and the weights are the eager ones to the
    tolerance."""
    from mpt_repro.schedule import LRSchedule

    runs = {}
    for compile_ in ("step", "false"):
        task, policy = build("mixed", compile_)
        schedule = LRSchedule(task.optimizers["model"], lambda i: 0.5**i, 8, hold_on_skip=hold)
        assert schedule.on_device == hold
        runs[compile_] = (*scheduled(task, schedule, 5), schedule.applied)
    assert counters["stats"]["unique_graphs"] == 1
    assert runs["step"][3] == runs["false"][3]
    assert False in runs["step"][0][2:] and True in runs["step"][0][2:]
    assert_within_tolerance(runs["false"][:3], runs["step"][:3], policy.compute_dtype)


def scheduled(task, schedule, steps: int) -> tuple[list[bool], list[torch.Tensor], list[float]]:
    """As `trajectory`, with the LR schedule stepped after each step as the trainer steps it;
    recompiling is an error from the third step on."""
    params = task.optimizers["model"].params
    before = [p.detach().clone() for p in params]
    largest, applied = [0.0] * len(params), []
    for i, batch in enumerate(task.train_batches(0)):
        if i == steps:
            break
        with torch._dynamo.config.patch(error_on_recompile=i >= 2):
            result = task.train_step(batch)
        schedule.step(result.stepped)
        applied.append(bool(result.stepped))
        now = [p.detach().clone() for p in params]
        largest = [max(u, float((a - b).abs().max())) for u, a, b in zip(largest, now, before)]
        before = now
    return applied, before, largest


@pytest.mark.parametrize("backend", ["aot_eager"], indirect=True)
def test_aot_autograd_takes_the_step_and_its_journal_writes(backend):
    """aot_eager: AOTAutograd's functionalisation of the step's in-place writes (the journal's
    row, the scale, the masters, BatchNorm's statistics) without inductor's code generation."""
    task, policy = build("mixed", "step")
    eager = trajectory(build("mixed", "false")[0], 4)
    compiled = trajectory(task, 4)
    assert_within_tolerance(eager, compiled, policy.compute_dtype)
    assert policy.scalars() == build_and_read_scalars("mixed", 4)
    assert task.optimizers["model"].nonfinite()["first_nonfinite_step"] == 1


def build_and_read_scalars(preset: str, steps: int) -> dict:
    task, policy = build(preset, "false")
    train(task, steps)
    return policy.scalars()


class UnusedFirst(torch.nn.Module):
    """A layer the loss never reaches, registered before the one it does."""

    def __init__(self):
        super().__init__()
        self.unused, self.used = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.used(x)


def test_a_parameter_without_gradient_is_left_alone_as_the_eager_step_leaves_it(backend):
    """The traced step updates, unscales and journals only the parameters that got a gradient
    (which ones is fixed when it is traced): the unused layer keeps its weights, and the
    journal's row maps back to the right names (the first non-finite gradient's layer)."""
    import torch.nn.functional as F

    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.precision.compiled_step import CompiledStep

    cfg = conftest.compose(["experiment=demo", "precision=mixed", *OVERFLOWS])
    x, y = torch.randn(16, 4), torch.arange(16) % 3

    def criterion(out, labels):
        return F.cross_entropy(out.float(), labels)

    runs = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        policy = PrecisionPolicy(cfg.precision, "cpu")
        model = policy.prepare_model(UnusedFirst())
        opt = policy.build_optimizer(
            model, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True)
        )
        start = [p.detach().clone() for p in opt.params]
        step = CompiledStep(opt, policy, model, criterion, None) if compiled else None
        applied = []
        for _ in range(5):
            if step is not None:
                stepped = step(policy.cast_inputs(x), y)[1]
            else:
                opt.zero_grad()
                with policy.autocast():
                    loss = criterion(model(policy.cast_inputs(x)), y)
                opt.backward(loss)
                stepped = opt.step()
            applied.append(bool(stepped))
        runs[compiled] = (applied, [p.detach() for p in opt.params], start, opt.nonfinite())
    (applied, eager, start, where), (applied_c, weights, _, where_c) = runs[False], runs[True]
    assert applied_c == applied and False in applied and True in applied
    assert where_c == where and where["first_nonfinite_layer"].startswith("used.")
    for w, wc, w0, name in zip(eager, weights, start, opt.names):
        if name.startswith("unused."):
            assert torch.equal(wc, w0) and torch.equal(w, w0)
        else:
            ulp = torch.finfo(torch.float32).eps * float(w.abs().max())
            assert float((wc - w).abs().max()) <= 2 * sum(applied) * ulp


# -- Adam, resume --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["adam", pytest.param("adamw", marks=pytest.mark.slow)])
def test_adam_skips_leave_its_state_as_the_fused_kernel_does(name, backend):
    """Three overflowing steps, then one applied: the step count is 1 (skips do not count), the
    moments are the fused kernel's to FP32 rounding (the same gradients). The update differs by
    what capturable Adam's FP32 bias correction loses: 1 - beta2 for beta2 = 0.999 rounded to
    FP32 (half an ulp: eps32 / 4) cancels to a relative error up to eps32 / 4 / (1 - beta2), halved
    by the square root (the fused kernel uses FP64); allowed: twice that, plus two roundings of
    the weight."""
    extra = ("optim=adam_cifar", f"optim.name={name}", "optim.weight_decay=0.01")
    tasks = {c: build("mixed", c, *extra)[0] for c in ("false", "step")}
    start = [p.detach().clone() for p in tasks["false"].optimizers["model"].params]
    applied = {c: train(t, 4) for c, t in tasks.items()}
    assert applied["step"] == applied["false"] == [False, False, False, True]
    states = {c: t.optimizers["model"].optimizer.state for c, t in tasks.items()}
    params = {c: t.optimizers["model"].params for c, t in tasks.items()}
    eps = torch.finfo(torch.float32).eps
    for pe, pc, p0 in zip(params["false"], params["step"], start):
        se, sc = states["false"][pe], states["step"][pc]
        pe, pc = pe.detach(), pc.detach()
        assert float(sc["step"]) == float(se["step"]) == 1.0
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sc[key], se[key], rtol=4e-7, atol=0)
        update = float((pe - p0).abs().max())
        bound = eps / 4 / (1 - 0.999) * update + 2 * eps * float(pe.abs().max())
        assert float((pc - pe).abs().max()) <= bound


def test_a_resumed_compiled_run_continues_bit_for_bit(backend):
    """The state lives in the torch optimizer's own dict (and the masters, the scale): a
    checkpoint taken between compiled steps (momentum built up) resumes to the same weights."""

    def fresh():  # the preset's own scale: no overflow, every step moves the state
        return build("mixed", "step", overflows=False)[0]

    straight = fresh()
    assert train(straight, 3) == [True] * 3
    first = fresh()
    train(first, 2)
    saved = {
        "model": first.model.state_dict(),
        "opt": first.optimizers["model"].state_dict(),
        "rng": torch.get_rng_state(),
    }
    resumed = fresh()
    resumed.model.load_state_dict(saved["model"])
    resumed.optimizers["model"].load_state_dict(saved["opt"])
    torch.set_rng_state(saved["rng"])
    train(resumed, 1, skip=2)
    pairs = zip(straight.optimizers["model"].params, resumed.optimizers["model"].params)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert straight.optimizers["model"].loss_scale == resumed.optimizers["model"].loss_scale


def test_each_compiled_step_has_a_recompile_limit_of_its_own(backend):
    """Dynamo keeps at most recompile_limit graphs per code object, and a Hydra multirun builds
    a step per job in one process: with the limit at 1, a second step still compiles (the
    ninth would fail with fullgraph=True at the default 8)."""
    with torch._dynamo.config.patch(recompile_limit=1):
        for _ in range(2):
            task, _ = build("fp32", "step", overflows=False)
            assert train(task, 1) == [True]
    assert counters["stats"]["unique_graphs"] == 2


# -- refusals ------------------------------------------------------------------------------------
def test_a_compile_value_other_than_true_false_step_is_refused():
    from mpt_repro.config import validate

    cfg = conftest.compose(["experiment=demo", "budget=smoke", "trainer.compile=whole"])
    with pytest.raises(ConfigError, match="trainer.compile must be true, false or step"):
        validate(cfg)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (("precision=adaptive",), "precision=adaptive"),
        (("precision=no_master",), "FP32 master weights"),
        (("precision=fp8_e5m2_emulated",), "number formats"),
        (("precision=mixed", "trainer.accumulate=2"), "trainer.accumulate"),
        (("precision=mixed", "optim.name=rmsprop"), "optim.name=rmsprop"),
        (("precision=mixed", "telemetry.enabled=true"), "telemetry"),
    ],
)
def test_what_the_step_cannot_compile_is_refused_in_one_line(overrides, says):
    with pytest.raises(ConfigError) as refused:
        conftest.build_task("experiment=demo", "budget=smoke", "trainer.compile=step", *overrides)
    message = str(refused.value)
    assert "\n" not in message and says in message
    assert "use trainer.compile=true or trainer.compile=false" in message


# -- inductor: numbers and a real run (slow) ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor"], indirect=True)
@pytest.mark.parametrize("preset", PRESETS)
def test_inductor_compiled_step_is_the_eager_step_to_the_tolerance(preset, backend):
    """Inductor (about 30 s of compilation a preset on this CPU): 8 steps, the same skips, the
    weights within the tolerance derived above."""
    import torch._inductor.config

    with torch._inductor.config.patch(fallback_random=True):
        task, policy = build(preset, "step")
        compiled = trajectory(task, 8)
        eager = trajectory(build(preset, "false")[0], 8)
    assert dict(counters["graph_break"]) == {}
    assert_within_tolerance(eager, compiled, policy.compute_dtype)


@pytest.mark.slow
def test_mpt_run_trains_the_demo_with_the_compiled_step(tmp_path):
    """The real command end to end: ~45 s of CPU with a cold inductor cache; its evaluation
    beside the eager run's (measured: loss 2.2121 against 2.2116, the same top-1)."""
    import json

    records = {}
    for compile_ in ("step", "false"):
        conftest.run_cli(
            "experiment=demo",
            "precision=mixed",
            f"trainer.compile={compile_}",
            "budget=smoke",
            run_dir=tmp_path / compile_,
            timeout=600,
        )
        records[compile_] = json.loads((tmp_path / compile_ / "run.json").read_text())
    step, eager = records["step"], records["false"]
    assert step["status"] == "completed" and step["config"]["trainer"]["compile"] == "step"
    assert step["skipped_steps"] == eager["skipped_steps"]
    assert math.isfinite(step["metrics"]["loss"])
    assert step["metrics"]["loss"] == pytest.approx(eager["metrics"]["loss"], rel=1e-2)
