"""A step no heavier than the best hand-written loop (issue 36): what a training step launches,
counted by mpt-bench's own SyncCounter against the bare loop of the same math (BareLoop:
torch.autocast + torch.amp.GradScaler, bare FP32, apex O2), what the Trainer adds to it, the
journal that replaced the step's device bookkeeping, and the compiled step. Counts, not times:
no test here depends on the machine's speed."""

from __future__ import annotations

import functools
import statistics

import pytest
import torch
from torch import nn

from mpt_repro.bench.measure import SyncCounter
from mpt_repro.precision import PrecisionConfig, PrecisionPolicy
from mpt_repro.precision.config import Dtype, LossScaling, WeightStorage
from mpt_repro.precision.journal import Journal

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
LIMIT = 5  # ATen ops a step may launch over its bare loop, and the Trainer over the step


def demo(preset: str, *extra: str):
    from mpt_repro.bench.config import compose

    return compose(["experiment=demo", "budget=smoke", "trainer.device=cpu", *extra], preset)


def counted(step, n: int = 3) -> tuple[float, float, float]:
    """Median ATen ops, host reads and host-made tensors of n steps, each counted alone."""
    rows = []
    for _ in range(n):
        with SyncCounter(CPU) as c:
            step()
        rows.append((c.dispatched, c.reads, sum(c.tensors.values())))
    return tuple(statistics.median(r[k] for r in rows) for k in range(3))


# -- the step against its bare loop --------------------------------------------------------------
@pytest.mark.parametrize("preset", ["fp32", "amp", "mixed", "bf16"])
def test_a_step_launches_at_most_5_ops_more_than_its_bare_loop(preset):
    """amp against autocast + GradScaler, mixed against the apex-O2 loop (FP16 model, FP32
    masters, GradScaler over them), fp32 and bf16 against plain loops; none reads the device or
    builds a tensor from host numbers."""
    from mpt_repro.bench.step import BareLoop, build_step

    cfg = demo(preset)
    bs = build_step(cfg, CPU)
    bare = BareLoop(cfg, bs, CPU)
    assert bare.why_not is None
    for _ in range(2):
        bs.step()
        bare.step()
    ours, reads, tensors = counted(bs.step)
    theirs, _, _ = counted(bare.step)
    assert ours <= theirs + LIMIT, (preset, ours, theirs)
    assert reads == 0 and tensors == 0


def test_amp_launches_what_gradscaler_launches_and_little_more():
    """The precision part of an amp step, op by op: where GradScaler makes two tensors, copies
    them per device, sums a list and multiplies its scale by 1 (full, full, _to_copy x2, add,
    mul, its check kernel and its fused update), ours runs the reciprocal, the same check, the
    diagnosis (one norm kernel, one stack into the journal), the skip signal, and the scale's
    journal copy, the same fused update and one clamp for floor and ceiling."""
    from mpt_repro.bench.step import build_step

    bs = build_step(demo("amp"), CPU)
    bs.step()
    seen = []

    class Named(SyncCounter):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.split("::")[-1]
            if not name.startswith("_record_function"):  # the profiler's marks, no kernel
                seen.append(name)
            return super().__torch_dispatch__(func, types, args, kwargs)

    with Named(CPU):
        bs.step()
    tail = seen[seen.index("reciprocal") :]
    assert tail == [
        "reciprocal",
        "_amp_foreach_non_finite_check_and_unscale_",
        "_foreach_norm",
        "stack",
        "_fused_sgd_",
        "eq",
        "copy_",
        "_amp_update_scale_",
        "clamp_",
    ]


@pytest.mark.parametrize("preset", ["fp32", "amp", "mixed"])
def test_the_trainer_adds_at_most_5_ops_a_step_and_reads_only_at_log_rows(preset):
    """Trainer.fit around the same step: LR schedule (2 ops on the device when skips hold it),
    divergence watch (one copy of the loss), log window (one add)."""
    from mpt_repro.bench.step import build_step, trainer_ops

    cfg = demo(preset)
    bs = build_step(cfg, CPU)
    bs.step()
    step_ops = counted(bs.step)[0]
    trainer = trainer_ops(cfg, bs, CPU)
    assert trainer["ops_per_step"] <= step_ops + LIMIT, (trainer, step_ops)
    assert trainer["host_reads_per_step"] == 0


def test_master_gradients_are_allocated_once():
    from mpt_repro.bench.step import build_step

    bs = build_step(demo("mixed"), CPU)
    opt = bs.task.optimizers["model"]
    bs.step()
    before = {id(p): p.grad.data_ptr() for p in opt.master.masters}
    for _ in range(3):
        bs.step()
    assert {id(p): p.grad.data_ptr() for p in opt.master.masters} == before
    opt.zero_grad()  # between steps, as after torch's zero_grad: no gradient to see
    assert all(p.grad is None for p in opt.params)


# -- the journal -----------------------------------------------------------------------------
def two_policy(**knobs) -> PrecisionPolicy:
    cfg = PrecisionConfig(
        name="mixed",
        compute_dtype=Dtype.float16,
        weights=WeightStorage.low_precision,
        master_weights=True,
        loss_scaling=LossScaling.dynamic,
        **knobs,
    )
    return PrecisionPolicy(cfg, "cpu")


def test_the_journal_hands_every_row_once_across_blocks_read_or_not():
    j = Journal(CPU, rows=4)
    j.add_column("x")
    j.add_column("v", 2)
    got = []
    j.readers.append(lambda cols, notes: got.extend(zip(cols["x"].tolist(), notes)))
    for i in range(11):
        assert float(j.slot("x")) == 0.0  # a fresh (zeroed) row, reused blocks included
        j.slot("x").fill_(i + 1)
        j.slot("v").fill_(-1)
        j.note(step=i)
        j.commit()
        if i in (2, 9):
            j.read()
    j.read()
    assert [x for x, _ in got] == [i + 1.0 for i in range(11)]
    assert [n["step"] for _, n in got] == list(range(11))


def test_skips_floor_streak_and_divergence_are_folded_exactly_across_many_blocks():
    """200 steps (four journal blocks) with overflows scattered and a streak at the floor at the
    end: the counts are those of the old per-step device bookkeeping, read once at the end or at
    every step alike."""
    from mpt_repro.errors import Diverged

    def run(read_every: int):
        pol = two_policy(init_scale=8.0, min_scale=2.0, floor_patience=5, growth_interval=1000)
        model = pol.prepare_model(nn.Linear(2, 1, bias=False))
        opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.0))
        for i in range(200):
            opt.zero_grad()
            bad = i % 37 == 3 or i >= 190
            x = torch.tensor([[1.0, float("inf") if bad else 1.0]])
            opt.backward(model(pol.cast_inputs(x)).float().sum())
            opt.step()
            if i % read_every == 0:
                _ = opt.skipped
        with pytest.raises(Diverged) as e:
            pol.check_divergence()
        return opt.skipped, opt.scaler.floor_count, e.value.step, opt.nonfinite()

    once, often = run(10**6), run(1)
    overflows = sum(1 for i in range(200) if i % 37 == 3 or i >= 190)
    # 8 -> 4 -> 2 (the floor) on the first two overflows; the streak at the floor: steps 191-200,
    # the 5th of them (step 195, 1-based) reaching the patience
    assert once == often == (overflows, 10, 195, once[3])
    assert once[3]["first_nonfinite_layer"] == "weight" and once[3]["first_nonfinite_step"] == 4


# -- the compiled step -----------------------------------------------------------------------
@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with the `eager` backend: the same graph capture (and the same graph
    breaks) without inductor's code generation, so the test takes seconds."""
    real = torch.compile

    def compile_eagerly(model=None, **kwargs):
        kwargs.pop("mode", None)
        kwargs["backend"] = "eager"
        return real(model, **kwargs) if model is not None else functools.partial(real, **kwargs)

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("preset", ["fp32", "amp", "mixed", "bf16"])
def test_the_compiled_step_has_no_graph_break(preset, eager_compile):
    """trainer.compile=true: the model (the task) and the precision step's regions (fullgraph:
    a break would raise) compile whole; torch._dynamo's counters see no graph break."""
    from torch._dynamo.utils import counters

    from mpt_repro.bench.step import build_step

    counters.clear()
    bs = build_step(demo(preset, "trainer.compile=true"), CPU)
    for _ in range(3):
        bs.step()
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] >= 1  # something was compiled


def test_the_compiled_precision_regions_are_bit_exact():
    """The precision step's regions compiled by inductor (the model left eager): the same
    weights, bit for bit, as the eager step (its ops are exact: copies, the check, maxima,
    comparisons, the scale's update)."""
    from mpt_repro.bench.step import to_device
    from mpt_repro.tasks import build_task

    weights = {}
    for mode in (None, "default"):
        torch.manual_seed(0)
        cfg = demo("amp")
        pol = PrecisionPolicy(cfg.precision, CPU, compile_mode=mode)
        task = build_task(cfg, CPU, pol)
        batches = iter(task.train_batches(0))
        for _ in range(3):
            task.train_step(to_device(next(batches), CPU))
        weights[mode] = [p.detach().clone() for p in task.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(weights[None], weights["default"]))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["fp32", "amp", "mixed", "bf16"])
def test_the_compiled_step_is_within_rounding_of_the_eager_one(preset):
    """trainer.compile=true with inductor (the model too): one step from the same weights and
    batch. The loss agrees to FP16's rounding; the update of what the optimizer holds (FP32
    weights or masters) to FP16's rounding (FP32 compute) or a few roundings of the compute dtype,
    as the compiled forward and backward round their fused ops and reductions differently."""
    from mpt_repro.bench.step import to_device
    from mpt_repro.run import step_compile_mode
    from mpt_repro.tasks import build_task

    out = {}
    for comp in ("false", "true"):
        torch.manual_seed(0)
        cfg = demo(preset, f"trainer.compile={comp}")
        pol = PrecisionPolicy(cfg.precision, CPU, compile_mode=step_compile_mode(cfg.trainer))
        task = build_task(cfg, CPU, pol)
        opt = task.optimizers["model"]
        before = [p.detach().clone() for p in opt.params]
        loss = task.train_step(to_device(next(iter(task.train_batches(0))), CPU)).loss
        after = [p.detach().clone() for p in opt.params]
        out[comp] = (float(loss), [a - b for a, b in zip(after, before)], after)
    (le, de, we), (lc, dc, _) = out["false"], out["true"]
    assert abs(lc - le) <= 2.0**-11 * abs(le)
    # FP32 compute: one FP16 rounding of the largest update (the compiled backward orders its
    # FP32 reductions differently: ~40 FP32 roundings seen on a bias); FP16/BF16: a few of its own
    low = pol.compute_dtype != torch.float32
    tol = 16 * torch.finfo(pol.compute_dtype).eps if low else torch.finfo(torch.float16).eps
    ulp = torch.finfo(torch.float32).eps  # the FP32 weight the update is added to rounds too
    for a, b, w in zip(dc, de, we):
        bound = tol * float(b.abs().max()) + 2 * ulp * w.abs() + 1e-12
        assert bool(((a - b).abs() <= bound).all()), float((a - b).abs().max())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_reduce_overhead_captures_the_step_as_a_cuda_graph():
    """trainer.compile_mode=reduce-overhead on a GPU: the step, which never reads the device,
    runs from CUDA graphs and trains as the eager one does (within rounding)."""
    from mpt_repro.bench.config import compose
    from mpt_repro.bench.step import build_step

    cuda = torch.device("cuda")
    losses = {}
    for comp in ("false", "true"):
        torch.manual_seed(0)
        cfg = compose(
            ["experiment=demo", "budget=smoke", "trainer.device=cuda", f"trainer.compile={comp}"]
            + (["trainer.compile_mode=reduce-overhead"] if comp == "true" else []),
            "amp",
        )
        bs = build_step(cfg, cuda)
        losses[comp] = [float(bs.step().loss) for _ in range(5)]
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-2)


# -- mpt-bench bench.baseline=true ---------------------------------------------------------------
def test_the_baseline_goes_into_the_json_and_its_table():
    """The worker's baseline on the demo (one round of one step: counts, not times): the JSON's
    fields, and the printed row (ops of each, the difference, the Trainer's, reads, the ratio)."""
    from mpt_repro.bench.config import BenchConfig
    from mpt_repro.bench.results import format_baseline
    from mpt_repro.bench.step import build_step
    from mpt_repro.bench.worker import baseline

    cfg = demo("amp")
    bs = build_step(cfg, CPU)
    b = BenchConfig(baseline=True, baseline_rounds=2, baseline_steps=1)
    out = baseline(cfg, bs, b, CPU, lambda *_: None)
    assert out["bare"] == "autocast FP16 + GradScaler"
    assert out["suite_ops_per_step"] <= out["bare_ops_per_step"] + LIMIT
    assert out["suite_host_reads_per_step"] == out["trainer_host_reads_per_step"] == 0
    assert out["trainer_ops_per_step"] <= out["suite_ops_per_step"] + LIMIT
    assert len(out["time_ratios"]) == 2
    assert out["time_ratio_min"] <= out["time_ratio"] <= out["time_ratio_max"]
    doc = {"device": {"type": "cpu"}, "results": [{"preset": "amp", "detail": {"baseline": out}}]}
    row = format_baseline(doc).splitlines()[-1]
    assert row.startswith("| amp | autocast FP16 + GradScaler | ") and row.endswith("(proxy) |")
    assert format_baseline({"device": {"type": "cpu"}, "results": []}) is None


# -- adaptive: the layer statistics every F iterations ----------------------------------------
def test_adaptive_records_statistics_every_F_steps_and_stays_within_1_10x_mixed():
    """precision.adaptive_update_interval=F (Zhao et al.'s update_per_n_iteration): the layer
    statistics (multi-tensor reductions over all layers) are taken in one backward of every F
    and the scales recomputed from them once (one host read more); the other steps launch
    about what mixed's do. Over one cycle of F=4 steps on the demo: at most 1.10x mixed's ops."""
    from mpt_repro.bench.step import build_step

    def names(bs) -> list[str]:
        seen = []

        class Named(SyncCounter):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(func._schema.name.split("::")[-1])
                return super().__torch_dispatch__(func, types, args, kwargs)

        with Named(CPU):
            bs.step()
        return seen

    mixed = build_step(demo("mixed"), CPU)
    mixed.step()
    base = len(names(mixed))
    F = 4
    bs = build_step(demo("adaptive", f"precision.adaptive_update_interval={F}"), CPU)
    for _ in range(3):
        bs.step()
    cycle = [names(bs) for _ in range(F)]
    fewest = min(step.count("_foreach_norm") for step in cycle)
    # statistics (multi-tensor reductions) in one step of F
    assert sum(1 for step in cycle if step.count("_foreach_norm") > fewest) == 1
    assert sum(len(step) for step in cycle) / F <= 1.10 * base, ([len(s) for s in cycle], base)


# -- a run that never compiles never loads torch.compile ----------------------------------------
def test_an_eager_run_never_imports_torch_dynamo():
    """precision/compiled.py defers torch.optim's imports of torch._dynamo (about 2 s of CPU at
    every mpt-run's start): a process that builds the suite's mixed step, steps, zeroes and saves
    it never loads torch._dynamo; one that does load it gets torch's own wrappers back (the
    optimizer's methods marked untraceable, its step under its graph breaks)."""
    import subprocess
    import sys

    from conftest import ROOT

    code = """
import sys, torch
from mpt_repro.bench.config import compose
from mpt_repro.bench.step import build_step
bs = build_step(compose(["experiment=demo", "budget=smoke", "trainer.device=cpu"], "mixed"),
                torch.device("cpu"))
bs.step()
opt = bs.task.optimizers["model"]
opt.zero_grad(); opt.state_dict()
print("eager", "torch._dynamo" in sys.modules)
import torch._dynamo
bs.step(); opt.zero_grad(); opt.state_dict()
wrapped = torch.optim.Optimizer.state_dict.__wrapped__.__dynamo_disable
print("compiling", wrapped.__qualname__, type(opt.optimizer).step.__qualname__)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "eager False"
    assert out[1].startswith("compiling") and "_until_dynamo_loads" not in out[1]
