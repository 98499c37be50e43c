"""FP16 optimizer state without a master copy (issue 23): under no_master and fp16 no step may
write inf/NaN into the weights while it reports itself applied.

The issue's cases, exactly: gradients [2^-14, 2^-16, 1e-3, 0] at a loss scale of 2^10 with Adam
(optim.fused=false), RMSprop and Adagrad (initial_accumulator_value=0), where the FP16 second
moment underflows to 0 and eps=1e-8 rounds to 0; SGD with momentum 0.9 and a finite gradient of
40000, whose FP16 momentum buffer overflows on the second step. Configs are composed through
Hydra as `mpt-run` composes them; the optimizers come from mpt_repro.optim as a run builds them.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from conftest import compose
from torch import nn

from mpt_repro.bench.measure import SyncCounter
from mpt_repro.errors import ConfigError, Diverged
from mpt_repro.optim import optimizer_factory
from mpt_repro.precision import PrecisionPolicy
from mpt_repro.precision.validate import validate_optimizer_state

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = [2.0**-14, 2.0**-16, 1e-3, 0.0]  # the issue's gradients


class HostReads:
    """The host reads of device values in the block, as `count`: test_sync_free's HostReads,
    which this file imported, became mpt-bench's SyncCounter (its `reads`) in 94bb171."""

    def __enter__(self) -> HostReads:
        self.counter = SyncCounter().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.counter.__exit__(*exc)

    @property
    def count(self) -> int:
        return self.counter.reads


# each case: optimizer overrides, the gradient of every step
CASES = {
    "adam_foreach": (["optim.name=adam", "optim.fused=false", "optim.lr=0.001"], [SMALL] * 2),
    "rmsprop": (["optim.name=rmsprop", "optim.lr=0.001"], [SMALL] * 2),
    "adagrad_from_0": (
        ["optim.name=adagrad", "optim.initial_accumulator_value=0", "optim.lr=0.1"],
        [SMALL] * 2,
    ),
    "sgd_fused": (["optim=sgd", "optim.fused=true"], [[40000.0]] * 3),
    "sgd_foreach": (["optim=sgd", "optim.fused=false"], [[40000.0]] * 3),
    # fused Adam computes in FP32, but stores (1 - beta2) g^2 = 1.6e6 in FP16: inf
    "adam_fused_big_gradient": (["optim.name=adam", "optim.fused=true"], [[40000.0, 1.0]] * 2),
}


class Vector(nn.Module):
    """loss = sum(w * x): the gradient of w is x, exactly."""

    def __init__(self, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return (self.w * x).sum()


def config(preset: str, optim: list[str], init_scale: float):
    # no_master scales dynamically here (the demo states no paper scale): 2^10 as in the issue,
    # 1 for the SGD case (40000 x 2 would overflow the gradient itself), floor 1/4 below it
    return compose(
        [
            "experiment=demo",
            f"precision={preset}",
            *optim,
            f"precision.init_scale={init_scale}",
            "precision.min_scale=0.25",
        ]
    )


def build(preset: str, optim: list[str], n: int, init_scale: float = 2.0**10, **knobs):
    cfg = config(preset, optim, init_scale)
    for k, v in knobs.items():
        cfg.precision[k] = v
    pol = PrecisionPolicy(cfg.precision, "cpu", paper_loss_scale=cfg.paper_loss_scale)
    model = pol.prepare_model(Vector(n))
    return pol, model, pol.build_optimizer(model, optimizer_factory(cfg.optim))


def step(pol, model, opt, grad: list[float]) -> bool:
    opt.zero_grad()
    with pol.autocast():
        loss = model(pol.cast_inputs(torch.tensor(grad)))
    opt.backward(loss)
    return bool(opt.step())


def state_is_finite(opt) -> bool:
    values = [v for s in opt.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(v).all()) for v in values)


@pytest.mark.parametrize("preset", ["no_master", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_no_step_writes_inf_or_nan_into_fp16_weights(preset: str, case: str) -> None:
    optim, grads = CASES[case]
    init = 1.0 if "sgd" in case or "big" in case else 2.0**10
    pol, model, opt = build(preset, optim, len(grads[0]), init_scale=init)
    assert model.w.dtype == torch.float16 and opt.guard is not None
    stepped = []
    for g in grads:
        weights_before = model.w.detach().clone()
        stepped.append(step(pol, model, opt, g))
        assert torch.isfinite(model.w).all(), (case, stepped, model.w)
        assert state_is_finite(opt), case
        if not stepped[-1]:  # undone: the weights are those of before the step, bit for bit
            assert torch.equal(model.w.detach(), weights_before)
    skipped = stepped.count(False)
    assert skipped >= 1  # without the guard each of these wrote inf/NaN and said it stepped
    assert opt.skipped == skipped
    if preset == "no_master":  # treated as an overflow: the dynamic scale backs off each time
        assert opt.loss_scale == init * 0.5**skipped
    else:  # fp16 has no loss scale; the skipped steps are counted all the same
        assert opt.loss_scale == 1.0
    assert pol.summary()["skipped_steps"] == skipped
    assert opt.nonfinite()["last_nonfinite_kind"] == "update"
    assert opt.nonfinite()["last_nonfinite_layer"] == "w"


@pytest.mark.parametrize("fused", ["true", "false"])
def test_sgd_momentum_overflow_is_undone_exactly(fused: str) -> None:
    """Step 1 applies (buffer 40000), step 2 would make the FP16 buffer 76000 = inf and is
    undone, step 3 (gradient -40000) continues from step 1's buffer: the weights equal those of
    a run that never saw step 2."""
    optim = ["optim=sgd", f"optim.fused={fused}"]
    pol, model, opt = build("no_master", optim, 1, init_scale=1.0)
    assert [step(pol, model, opt, g) for g in ([4e4], [4e4], [-4e4])] == [True, False, True]
    ref_pol, ref, ref_opt = build("no_master", optim, 1, init_scale=1.0)
    assert [step(ref_pol, ref, ref_opt, g) for g in ([4e4], [-4e4])] == [True, True]
    assert torch.equal(model.w.detach(), ref.w.detach())
    buffer = opt.optimizer.state[opt.params[0]]["momentum_buffer"]
    assert torch.equal(buffer, ref_opt.optimizer.state[ref_opt.params[0]]["momentum_buffer"])
    assert model.w.item() == 1 - 0.05 * 4e4 + 0.05 * 4e3  # 0.9 * 40000 - 40000 = -4000


@pytest.mark.parametrize("fused", ["true", "false"])
def test_an_undone_first_step_leaves_the_optimizer_as_new(fused: str) -> None:
    """Adam's state is created by its first step. Undone, the next step is a first step again
    (bias correction and all): fused (state made beforehand, put back on the device) and foreach
    (state created by the step, removed on the host) alike."""
    optim = ["optim.name=adam", f"optim.fused={fused}", "optim.eps=1e-4", "optim.lr=0.01"]
    pol, model, opt = build("fp16", optim, 2)
    assert not step(pol, model, opt, [40000.0, 1.0])  # (1 - beta2) g^2 overflows FP16
    assert step(pol, model, opt, [0.5, -1.0])
    ref_pol, ref, ref_opt = build("fp16", optim, 2)
    assert step(ref_pol, ref, ref_opt, [0.5, -1.0])
    assert torch.equal(model.w.detach(), ref.w.detach())
    mine, theirs = opt.optimizer.state_dict()["state"], ref_opt.optimizer.state_dict()["state"]
    for k in theirs[0]:
        assert torch.equal(mine[0][k], theirs[0][k]), k
    assert model.w.tolist() == [0.990234375, 1.009765625]  # lr x sign: a first Adam step


def test_clean_steps_are_applied_and_the_fused_path_reads_nothing_from_the_device() -> None:
    pol, model, opt = build("no_master", ["optim=sgd"], 1, init_scale=1.0)
    assert opt.fused and opt.sync_free
    with SyncCounter() as reads:
        outcome = [_step(pol, model, opt, g) for g in ([4e4], [4e4], [1.0])]
    assert reads.reads == 0  # the guard's check and restore stay on the device
    assert [bool(s) for s in outcome] == [True, False, True]


def _step(pol, model, opt, grad):
    opt.zero_grad()
    with pol.autocast():
        loss = model(pol.cast_inputs(torch.tensor(grad)))
    opt.backward(loss)
    return opt.step()


@pytest.mark.parametrize("preset", ["no_master", "fp16"])
def test_without_a_fused_kernel_the_guard_reads_the_flag_once(preset: str) -> None:
    # one read per step, as a scaled step without a fused kernel already cost (SGD: torch's own
    # optimizers read their CPU step counts too, e.g. Adagrad's, which are not device syncs)
    pol, model, opt = build(preset, ["optim=sgd", "optim.fused=false"], 1, init_scale=1.0)
    assert not opt.sync_free
    for g in ([4e4], [4e4]):  # applied, then undone
        with SyncCounter() as reads:
            _step(pol, model, opt, g)
        assert reads.reads == 1
    assert opt.skipped == 1


def test_a_state_that_keeps_overflowing_ends_the_run_as_diverged_naming_the_layer() -> None:
    pol, model, opt = build("no_master", ["optim=sgd"], 1, init_scale=1.0, floor_patience=2)
    for _ in range(5):  # 1 -> 0.5 -> 0.25 (the floor), then two skipped steps there
        step(pol, model, opt, [4e4])
    with pytest.raises(Diverged) as exc:
        pol.check_divergence()
    assert exc.value.layer == "w" and "optimizer state" in exc.value.reason
    assert torch.isfinite(model.w).all()


# -- refused at start-up: an eps that rounds to 0 in the FP16 state ---------------------------
@pytest.mark.parametrize("preset", ["no_master", "fp16"])
@pytest.mark.parametrize(
    "optim",
    [
        ["optim.name=adam", "optim.fused=false"],
        ["optim.name=adamw", "optim.fused=false"],
        ["optim.name=rmsprop"],
        ["optim.name=adagrad", "optim.initial_accumulator_value=0"],
    ],
)
def test_an_eps_that_fp16_state_rounds_to_0_is_refused_naming_the_key(preset, optim) -> None:
    cfg = compose(["experiment=demo", f"precision={preset}", *optim])
    with pytest.raises(ConfigError) as err:
        validate_optimizer_state(cfg.precision, cfg.optim)
    message = str(err.value)
    assert "optim.eps=" in message and "rounds to 0 in float16" in message
    assert "Set optim.eps=1e-4" in message and "\n" not in message
    if "adagrad" in optim[0]:
        assert "optim.initial_accumulator_value=0" in message


@pytest.mark.parametrize(
    "overrides",
    [
        ["precision=no_master", "optim.name=adam"],  # fused (auto): computes in FP32
        ["precision=no_master", "optim.name=adam", "optim.fused=false", "optim.eps=1e-4"],
        ["precision=fp16", "optim.name=rmsprop", "optim.eps=6e-8"],  # FP16's smallest value
        ["precision=no_master", "optim=adagrad_lm"],  # f-lm: eps 1e-10, sums start at 1.0
        ["precision=no_master", "optim=rmsprop_tf_inception_v3"],  # eps 1.0
        # eps inside the root, with a mean square that FP16 rounding keeps above 0
        ["precision=no_master", "optim=rmsprop_tf_inception_v3", "optim.eps=1e-10"],
        ["precision=fp16", "optim=sgd"],  # no eps
        ["precision=mixed", "optim.name=rmsprop"],  # FP32 state (master copy)
        ["precision=amp", "optim.name=adam", "optim.fused=false"],
    ],
)
def test_eps_that_the_state_holds_is_accepted(overrides) -> None:
    cfg = compose(["experiment=demo", *overrides])
    validate_optimizer_state(cfg.precision, cfg.optim)


def test_the_refusal_needs_no_torch() -> None:
    code = (
        "import sys; from mpt_repro.precision.validate import validate_optimizer_state; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rmsprop_tf_mean_square_never_reaches_0_in_fp16() -> None:
    """Why rmsprop_tf's tiny eps is accepted: its mean square starts at 1 and, decaying, stops
    at FP16's smallest values (0.9 x 2^-24 rounds back up), so sqrt(ms + eps) is never 0."""
    optim = ["optim=rmsprop_tf_inception_v3", "optim.eps=1e-10", "optim.weight_decay=0"]
    pol, model, opt = build("fp16", optim, 2)
    for _ in range(200):  # 0.9^200 ~ 7e-10: far below 2^-24 without the rounding
        assert step(pol, model, opt, [0.0, 0.0])
    ms = opt.optimizer.state[opt.params[0]]["ms"]
    assert (ms > 0).all() and ms.max() <= 2.0**-21
    assert step(pol, model, opt, [2.0**-24, 0.0])  # a gradient where the mean square is tiny
    assert torch.isfinite(model.w).all() and opt.skipped == 0


def test_mpt_run_refuses_the_issue_s_adam_at_once_with_one_line(tmp_path) -> None:
    from conftest import run_cli

    proc = run_cli(
        "experiment=demo",
        "budget=smoke",
        "precision=no_master",
        "optim.name=adam",
        "optim.fused=false",
        run_dir=tmp_path / "run",
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run:")]
    assert "optim.eps=1e-08 rounds to 0 in float16" in line and "optim.eps=1e-4" in line
    assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.parametrize("fused", ["true", "false"])
def test_fp16_holds_the_lr_schedule_on_a_step_the_guard_skipped(fused: str) -> None:
    """precision.hold_lr_on_skip: fp16 has no scaler, but the guard skips steps, so the
    schedule counts the updates applied, as under a scaler."""
    from mpt_repro.schedule import LRSchedule

    pol, model, opt = build("fp16", ["optim=sgd", f"optim.fused={fused}"], 1)
    schedule = LRSchedule(opt, lambda i: 0.5**i, total_steps=10, hold_on_skip=True)
    for g in ([4e4], [4e4], [1.0]):  # applied, undone (momentum overflow), applied
        schedule.step(_step(pol, model, opt, g))
    assert schedule.applied == 2 and opt.skipped == 1
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.05 * 0.25)


@pytest.mark.parametrize("fused", ["true", "false"])
def test_a_checkpoint_between_undone_steps_resumes_bit_identically(fused: str) -> None:
    optim = ["optim=sgd", f"optim.fused={fused}"]
    grads = ([4e4], [4e4], [-4e4], [4e4], [4e4], [1.0])  # steps 2 and 5 are undone
    pol, straight, opt = build("no_master", optim, 1, init_scale=1.0)
    outcome = [step(pol, straight, opt, g) for g in grads]
    assert outcome == [True, False, True, True, False, True]

    pol, first, opt1 = build("no_master", optim, 1, init_scale=1.0)
    for g in grads[:3]:
        step(pol, first, opt1, g)
    saved = {"model": copy.deepcopy(first.state_dict()), "opt": copy.deepcopy(opt1.state_dict())}
    pol, resumed, opt2 = build("no_master", optim, 1, init_scale=1.0)
    resumed.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    assert [step(pol, resumed, opt2, g) for g in grads[3:]] == outcome[3:]
    assert torch.equal(resumed.w.detach(), straight.w.detach())
    assert opt2.skipped == opt.skipped == 2 and opt2.loss_scale == opt.loss_scale == 0.25


def test_preset_fp16_that_can_apply_no_step_ends_as_diverged_with_the_reason(tmp_path) -> None:
    """Every step undone by the guard, and no loss scaler whose floor would end the run: it used
    to train on to its end with no step applied (issue 34). precision.floor_patience (50) steps
    in a row end it at that step."""
    from conftest import read_run, run_cli

    run_cli("experiment=demo", "budget=smoke", "precision=fp16", "trainer.device=cpu",
            "optim.lr=1e8", "trainer.epochs=10", "trainer.max_steps=60", "trainer.log_every=10",
            run_dir=tmp_path, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    record = read_run(tmp_path)
    assert record["status"] == "diverged" and record["steps"] == 50
    assert record["skipped_steps"] == 50 and record["diverged_at_step"] == 50
    assert record["reason"].startswith(
        "no optimizer step could be applied for 50 consecutive steps: each was undone and, "
        "without a loss scaler, nothing changes from one to the next; last non-finite update in "
        "layer '0.0.weight'"
    )


def test_floor_patience_is_read_by_the_guard_of_preset_fp16_and_refused_without_one() -> None:
    from mpt_repro.preflight import preflight

    assert preflight(["experiment=demo", "precision=fp16", "precision.floor_patience=5"]) is None
    refused = preflight(["experiment=demo", "precision=bf16", "precision.floor_patience=5"])
    assert refused.startswith("error: precision.floor_patience would change nothing in this run")
    assert "a loss scaler or an FP16 state guard, and this run (experiment=demo) has neither" in (
        refused
    )
