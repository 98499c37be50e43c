"""Fully sharded data parallel (distributed.strategy=fsdp2) on the CPU: 2 Gloo processes.

Not slow: what a preset becomes and which cannot run sharded (no processes), each model's blocks,
and one shared 2-process run that drives the precision policy under DDP and under FSDP2 on the
same data (the same losses step by step, an overflow on one rank's shard skipped on both, the
bytes each rank holds). Slow: `mpt-run` under torchrun for the demo and the LM under fp32, mixed
and bf16 against DDP, a sharded checkpoint resumed (on 2 processes and on 1), and the bytes per
rank at 1, 2 and 4 processes.

No GPU here: NCCL and several nodes are not exercised (docs/distributed.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import compose, read_run
from omegaconf import OmegaConf
from test_distributed import free_port, launch, train_rows
from torch import nn

from mpt_repro import distributed, fsdp
from mpt_repro.config import to_plain, validate
from mpt_repro.errors import ConfigError


# -- what a preset becomes, what is refused (no processes) --------------------------------------
def _mapping(*overrides: str) -> dict:
    cfg = compose(["experiment=demo", "distributed.strategy=fsdp2", *overrides])
    return fsdp.mapping(cfg.precision, cfg.distributed)


def test_each_preset_maps_onto_fsdp2_as_ddp_computes_it() -> None:
    f32 = {"shards": "float32", "param_dtype": "float32", "reduce_dtype": "float32"}
    for preset in ("fp32", "tf32", "amp", "bf16"):  # FP32 weights, autocast per op
        assert _mapping(f"precision={preset}") == f32, preset
    master = {"shards": "float32", "param_dtype": "float16", "reduce_dtype": "float16"}
    for preset in ("mixed", "no_scaling"):  # the FP32 shards are the master copy
        assert _mapping(f"precision={preset}") == {**master, "batchnorm": "float32 (own group)"}
    for preset in ("no_master", "fp16"):  # the optimizer updates FP16 shards
        assert _mapping(f"precision={preset}")["shards"] == "float16"
    assert _mapping("precision=mixed", "distributed.reduce_dtype=float32")["reduce_dtype"] == (
        "float32"
    )
    bf16_master = _mapping(
        "precision=mixed", "precision.compute_dtype=bfloat16", "precision.loss_scaling=none"
    )
    assert bf16_master["param_dtype"] == bf16_master["reduce_dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["precision=fp8_e5m2_emulated"], "precision.fp8.mode=emulated"),
        (["precision=pseudo_fp16"], "pseudo FP16"),
        (["precision=adaptive"], "adaptive, layer-wise"),
        (["trainer.compile=true"], "trainer.compile=true"),
        (["experiment=dcgan"], "experiment=dcgan"),
        (["telemetry=diagnostic"], "telemetry"),
    ],
)
def test_what_cannot_run_sharded_is_refused_in_one_line(overrides: list, named: str) -> None:
    cfg = compose(["experiment=demo", "distributed.strategy=fsdp2", *overrides])
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert named in str(e.value) and "\n" not in str(e.value)
    assert "strategy=ddp" in str(e.value) or "compile=false" in str(e.value)
    validate(compose(["experiment=demo", *overrides]))  # the same under DDP is fine


def test_fsdp2_settings_are_refused_under_ddp() -> None:
    from mpt_repro.config import check_overrides_are_read

    cfg = compose(["experiment=demo", "distributed.reduce_dtype=float32"])
    with pytest.raises(ConfigError, match="distributed.reduce_dtype"):
        check_overrides_are_read(cfg, ["distributed.reduce_dtype=float32"])
    with pytest.raises(ConfigError, match="distributed.strategy"):
        validate(compose(["experiment=demo", "distributed.strategy=zero3"]))


def test_models_say_where_their_blocks_are() -> None:
    from mpt_repro.models.lstm_lm import LSTMLanguageModel

    cfg = compose(["experiment=demo"])
    from mpt_repro.models import build_model

    cnn = build_model(cfg.model, num_classes=10, channels=1, image_size=8)
    # default: the parameter-holding modules of the Sequential (3 conv-BN-ReLU blocks, the head)
    assert [type(b).__name__ for b in fsdp.blocks(cnn)] == ["Sequential"] * 3 + ["Linear"]
    lm = LSTMLanguageModel(50, 8, 16, 2)
    assert fsdp.blocks(lm) == [lm.lstm]  # declared: the softmax stays in the root's group

    class Custom(nn.Module):  # a user's model: its ModuleList's layers
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(4, 8)
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    custom = Custom()
    assert fsdp.blocks(custom) == list(custom.layers)
    custom.shard_blocks = ("nothing*",)
    with pytest.raises(ConfigError, match="names none of its modules"):
        fsdp.blocks(custom)


# -- one shared 2-process run: the policy under DDP and under FSDP2 -----------------------------
STEPS = 4
PRESETS = ("fp32", "mixed", "bf16")


def _dcfg(strategy: str, reduce_dtype: str = "preset") -> dict:
    return {
        "backend": "gloo",
        "timeout_s": 120,
        "strategy": strategy,
        "reshard_after_forward": True,
        "reduce_dtype": reduce_dtype,
        "find_unused_parameters": False,
    }


def _train(
    precision: dict,
    strategy: str,
    rank: int,
    overflow_at: int | None = None,
    reduce: str = "preset",
) -> dict:
    """STEPS SGD steps of a small MLP on this rank's data; the global mean loss of each step."""
    from mpt_repro.precision import PrecisionPolicy

    dcfg = OmegaConf.create(_dcfg(strategy, reduce))
    policy = PrecisionPolicy(OmegaConf.create(precision), "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
    model.append(nn.Linear(32, 5))
    model = distributed.shard_model(policy.prepare_model(model), policy, dcfg)
    opt = policy.build_optimizer(
        # fused, as optim.fused=auto makes it: the skip stays on the device (found_inf)
        model,
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
        name="model",
    )
    forward = distributed.wrap_model(model, dcfg)
    gen = torch.Generator().manual_seed(100 + rank)
    losses, stepped = [], []
    for step in range(STEPS):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 5, (8,), generator=gen)
        opt.zero_grad()
        with policy.autocast():
            loss = nn.functional.cross_entropy(forward(policy.cast_inputs(x)).float(), y)
        opt.backward(loss)
        if step == overflow_at and rank == 1:  # this rank's shard of the first weight's gradient
            fsdp.local(model[0].weight.grad)[0, 0] = float("inf")
        stepped.append(bool(opt.step()))
        losses.append(float(distributed.all_reduce_(loss.detach().clone(), "mean")))
    # what the optimizer steps: the FP32 masters under DDP's mixed, the FP32 shards under FSDP2
    weights = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in opt.params]
    return {
        "losses": losses,
        "stepped": stepped,
        "scale": policy.loss_scale(),
        "weights": [w.detach().float().clone() for w in weights],
        "bytes": fsdp.state_bytes([model], [opt]),
        "sharded": opt.sharded,
        "skips": opt.skips,
    }


def _worker(rank: int, port: int, presets: dict, out: dict) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    distributed.setup(OmegaConf.create(_dcfg("ddp")), torch.device("cpu"))
    try:
        found = {}
        for name, precision in presets.items():
            for strategy in ("ddp", "fsdp2"):
                found[name, strategy] = _train(precision, strategy, rank)
        found["overflow"] = _train(presets["mixed"], "fsdp2", rank, overflow_at=2)
        found["reduce32"] = _train(presets["mixed"], "fsdp2", rank, reduce="float32")
        out[rank] = found
    finally:
        distributed.teardown()


@pytest.fixture(scope="module")
def policy_runs() -> dict:
    presets = {p: to_plain(compose([f"precision={p}"]).precision) for p in PRESETS}
    presets["mixed"]["loss_scaling"] = "dynamic"  # the demo has no paper scale: dynamic
    presets["mixed"]["init_scale"] = 1024.0
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), presets, out), nprocs=2, join=True)
        return {0: dict(out[0]), 1: dict(out[1])}


@pytest.mark.parametrize("preset", PRESETS)
def test_fsdp2_gives_ddp_losses_step_by_step(policy_runs: dict, preset: str) -> None:
    """The same weights in the compute dtype, the same gradients reduced in the same dtype: the
    losses agree to the order of the reductions (a reduce-scatter instead of an all-reduce sums
    the two ranks' values in another order; in FP32 that moves the last bits)."""
    ddp, sharded = policy_runs[0][preset, "ddp"], policy_runs[0][preset, "fsdp2"]
    assert sharded["sharded"] and not ddp["sharded"]
    assert sharded["losses"] == pytest.approx(ddp["losses"], rel=1e-6)
    for a, b in zip(ddp["weights"], sharded["weights"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert policy_runs[1][preset, "fsdp2"]["losses"] == sharded["losses"]  # one global loss


def test_the_reduce_dtype_knob_reduces_fp16_gradients_in_fp32(policy_runs: dict) -> None:
    """mixed with distributed.reduce_dtype=float32: the same first loss (the same weights), then
    other updates than the FP16 reduction's (the sums keep what FP16 rounds away)."""
    fp16, fp32 = policy_runs[0]["mixed", "fsdp2"], policy_runs[0]["reduce32"]
    assert fp32["losses"][0] == fp16["losses"][0]
    assert fp32["losses"][1:] != fp16["losses"][1:]
    assert fp32["losses"] == pytest.approx(fp16["losses"], rel=1e-2)


def test_overflow_on_one_ranks_shard_skips_the_step_on_both(policy_runs: dict) -> None:
    r0, r1 = policy_runs[0]["overflow"], policy_runs[1]["overflow"]
    assert r0["skips"] == "on_device"  # fused SGD on the shards: no host read per clean step
    assert r0["stepped"] == r1["stepped"] == [True, True, False, True]
    assert r0["scale"] == r1["scale"] == 512.0  # backed off once from 1024, on both ranks
    for a, b in zip(r0["weights"], r1["weights"]):
        assert torch.equal(a, b)


def test_each_rank_holds_half_the_state(policy_runs: dict) -> None:
    """Parameters, gradients and optimizer state (momentum): each rank holds its shard of each
    (FSDP2 pads a dimension that does not divide to an equal shard per rank: the 5-row head).
    Mixed: DDP holds FP16 weights besides FP32 masters, their gradients and the momentum (14
    bytes a parameter; the FP16 gradients were handed to the masters); FSDP2's FP32 shards are
    the masters (12 bytes over 2)."""
    for preset in ("fp32", "bf16"):
        ddp = policy_runs[0][preset, "ddp"]["bytes"]
        for rank in (0, 1):
            held = policy_runs[rank][preset, "fsdp2"]["bytes"]
            for part in ("parameters", "gradients", "optimizer"):
                assert held[part] == pytest.approx(ddp[part] / 2, rel=0.05), (preset, part)
    ddp, held = policy_runs[0]["mixed", "ddp"]["bytes"], policy_runs[0]["mixed", "fsdp2"]["bytes"]
    n = ddp["parameters"] / 2  # FP16 weights: 2 bytes each
    assert ddp["total"] == pytest.approx(14 * n, rel=0.01)
    assert held["total"] == pytest.approx(6 * n, rel=0.05)


# -- mpt-run under torchrun, DDP against FSDP2 (slow) -------------------------------------------
# The demo's CNN (BatchNorm: per-process statistics under both strategies) and the LM (its
# softmax in the root's group), 8 and 6 steps, a train row at every step.
CLI = {
    "demo": [
        "experiment=demo",
        "budget=smoke",
        "distributed.batch_size_is=global",
        "data.batch_size=16",
        "data.train_limit=256",
        "data.eval_limit=100",
        "trainer.max_steps=8",
        "trainer.log_every=1",
    ],
    "lm": [
        "experiment=lstm_lm",
        "budget=smoke",
        "model.dropout=0.0",
        "distributed.batch_size_is=global",
        "data.batch_size=4",
        "data.eval_batch_size=4",
        "trainer.log_every=1",
        "trainer.eval_every=3",
    ],
}
CASES = [(task, preset) for task in CLI for preset in PRESETS]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fsdp_cli")
    runs = {}
    for task, preset in CASES:
        for strategy in ("ddp", "fsdp2"):
            run_dir = root / f"{task}-{preset}-{strategy}"
            launch(
                [*CLI[task], f"precision={preset}", f"distributed.strategy={strategy}"], 2, run_dir
            )
            runs[task, preset, strategy] = run_dir
    return runs


@pytest.mark.slow
@pytest.mark.parametrize(("task", "preset"), CASES)
def test_mpt_run_under_fsdp2_gives_ddp_losses(cli_runs: dict, task: str, preset: str) -> None:
    """Step by step within 1e-6 relative: the order of the reductions is all that differs (the
    reduce-scatter adds the two ranks' gradients in another order than DDP's all-reduce: FP32
    runs move in the last bits, measured 6e-8; FP16 and BF16 gradients, whose sum of two values
    rounds once either way, came out equal)."""
    ddp, sharded = cli_runs[task, preset, "ddp"], cli_runs[task, preset, "fsdp2"]
    a, b = read_run(ddp), read_run(sharded)
    assert a["status"] == b["status"] == "completed"
    ra, rb = train_rows(ddp), train_rows(sharded)
    assert [s for s, _ in ra] == [s for s, _ in rb] and len(ra) >= 6
    assert [x for _, x in rb] == pytest.approx([x for _, x in ra], rel=1e-6)
    for metric, value in a["metrics"].items():
        assert b["metrics"][metric] == pytest.approx(value, rel=1e-6), metric
    assert (a["distributed"]["strategy"], b["distributed"]["strategy"]) == ("ddp", "fsdp2")
    assert (
        b["distributed"]["fsdp2"]["param_dtype"]
        == {
            "fp32": "float32",
            "mixed": "float16",
            "bf16": "float32",
        }[preset]
    )
    assert b["diagnostics"]["distributed"]["replica_max_abs_diff"] == 0.0  # the gathered weights
    held, replica = b["diagnostics"]["state_bytes"], a["diagnostics"]["state_bytes"]
    assert held["per_rank"][0] == held["per_rank"][1] < replica["per_rank"][0] / 2 + 4096


@pytest.mark.slow
def test_sharded_checkpoint_resumes_exactly(cli_runs: dict, tmp_path: Path) -> None:
    """The LM under mixed and fsdp2, stopped at step 3 (its checkpoint as a killed run leaves
    it) and resumed on 2 processes: every rank loads its shards, the same final metrics."""
    args = [*CLI["lm"], "precision=mixed", "distributed.strategy=fsdp2"]
    broken = tmp_path / "broken"
    launch([*args, "trainer.max_steps=3"], 2, broken)
    last = torch.load(broken / "checkpoints" / "last.pt", weights_only=False)
    assert last["sharded"] == "sharded-step000000003" and last["models"] is None
    assert (broken / "checkpoints" / last["sharded"] / ".metadata").is_file()
    _as_killed(broken)
    launch([*args, "resume=true"], 2, broken)
    a, b = read_run(cli_runs["lm", "mixed", "fsdp2"]), read_run(broken)
    assert b["status"] == "completed" and b["resumed"] is True and b["steps"] == 6
    assert b["metrics"] == a["metrics"]  # exactly
    assert dict(train_rows(broken))[6] == dict(train_rows(cli_runs["lm", "mixed", "fsdp2"]))[6]


def _as_killed(run_dir: Path) -> None:
    record = read_run(run_dir)
    record["status"] = "running"  # what a killed run's record says: resume=true continues it
    (run_dir / "run.json").write_text(json.dumps(record))


# the BatchNorm-free MLP of tests/ddp_entry.py: 1 process with the global batch computes what 2 do
MLP = [
    "experiment=demo",
    "model.name=test_mlp",
    "model.width=64",
    "budget=smoke",
    "trainer.max_steps=null",
    "trainer.epochs=1",
    "data.train_limit=128",
    "data.eval_limit=64",
    "data.batch_size=16",
    "distributed.batch_size_is=global",
    "trainer.log_every=2",
    "trainer.checkpoint_every=4",
    "optim.lr=0.1",
    "precision=mixed",
    "distributed.strategy=fsdp2",
]


@pytest.mark.slow
def test_sharded_checkpoint_resumes_on_another_world_size(tmp_path: Path) -> None:
    """Saved by 2 processes at step 4, resumed by 1 (the FP32 shards become its master copy):
    the run ends where the uninterrupted 2-process run ends, up to the FP16 gradients' sums
    (one batch of 16 instead of two of 8 reduced: measured 1.5e-5 relative on the loss)."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    launch(MLP, 2, whole)
    launch([*MLP, "trainer.max_steps=4"], 2, broken)
    _as_killed(broken)
    launch([*MLP, "resume=true"], 1, broken)
    a, b = read_run(whole), read_run(broken)
    assert b["status"] == "completed" and b["resumed"] is True and b["steps"] == a["steps"] == 8
    assert b["distributed"]["world_size"] == 1
    assert b["metrics"]["top1"] == a["metrics"]["top1"]
    assert b["metrics"]["loss"] == pytest.approx(a["metrics"]["loss"], rel=1e-4)
    assert [x for _, x in train_rows(broken)] == pytest.approx(
        [x for _, x in train_rows(whole)], rel=1e-4
    )


@pytest.mark.slow
def test_bytes_per_rank_fall_with_the_world_size(tmp_path: Path) -> None:
    """Parameters + gradients + optimizer state per rank (run.json diagnostics.state_bytes):
    DDP's rank holds a whole replica (what one process holds), FSDP2's 1/N of it, up to the
    padding of a dimension that does not divide by N."""
    args = [*CLI["demo"], "precision=fp32", "trainer.max_steps=2"]
    held = {}
    for strategy, n in (("ddp", 2), ("fsdp2", 2), ("fsdp2", 4)):
        run_dir = tmp_path / f"{strategy}{n}"
        launch([*args, f"distributed.strategy={strategy}"], n, run_dir)
        per_rank = read_run(run_dir)["diagnostics"]["state_bytes"]["per_rank"]
        assert len(per_rank) == n
        held[strategy, n] = max(per_rank)
    replica = held["ddp", 2]
    assert held["fsdp2", 2] == pytest.approx(replica / 2, rel=0.02)
    assert held["fsdp2", 4] == pytest.approx(replica / 4, rel=0.05)


def test_a_ddp_run_and_an_fsdp2_run_are_two_identities_labelled_by_strategy() -> None:
    from mpt_repro.identity import comparison_config, comparison_key, difference_labels

    def flat(*overrides: str) -> dict:
        return to_plain(compose(["experiment=demo", "precision=mixed", *overrides]))

    ddp, sharded = flat(), flat("distributed.strategy=fsdp2")
    lazy = flat("distributed.strategy=fsdp2", "distributed.reshard_after_forward=false")
    assert comparison_key(ddp) != comparison_key(sharded) == comparison_key(lazy)
    older = {**ddp, "distributed": dict(ddp["distributed"])}  # a record written before fsdp2
    for key in ("strategy", "reduce_dtype", "reshard_after_forward"):
        del older["distributed"][key]
    assert comparison_key(older) == comparison_key(ddp)
    labels = difference_labels({"a": comparison_config(ddp), "b": comparison_config(sharded)})
    assert labels == {"a": "distributed.strategy=ddp", "b": "distributed.strategy=fsdp2"}


@pytest.mark.slow
def test_mpt_bench_runs_a_preset_sharded_and_reports_bytes_per_rank() -> None:
    """mpt-bench bench.nproc=2 distributed.strategy=fsdp2: each worker under torchrun, the bytes
    each rank holds under the table, half of what one process holds (bench.nproc=1)."""
    import subprocess
    import sys

    from conftest import ROOT

    def bench(*args: str) -> list[float]:
        cmd = [str(Path(sys.executable).with_name("mpt-bench")), "experiment=demo"]
        cmd += ["trainer.device=cpu", "bench.presets=[mixed]", "bench.warmup=1", "bench.steps=2"]
        cmd += ["bench.repeats=1", "bench.write=false", "bench.overhead_steps=0", *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = [x for x in proc.stdout.splitlines() if x.startswith("  mixed: ")]
        return [float(v) for v in line.split(":", 1)[1].split(" MiB")[0].split(",")]

    (one,) = bench("bench.nproc=1")
    two = bench("bench.nproc=2", "distributed.strategy=fsdp2")
    assert len(two) == 2
    # one process under mixed: FP16 weights + FP32 masters, their gradients, momentum (14 bytes
    # a parameter); each of 2 sharded ranks: FP32 shards, gradients, momentum (12 / 2)
    assert two[0] == two[1] == pytest.approx(one * 6 / 14, rel=0.02)


@pytest.mark.slow
def test_accumulation_and_uneven_evaluation_shards_under_fsdp2(tmp_path: Path) -> None:
    """trainer.accumulate=2 (the first micro-batch's gradients kept unreduced, FSDP2's
    set_requires_gradient_sync) and 33 evaluation images over 2 ranks (17 and 16: two batches on
    one rank, one on the other, on the gathered weights): the DDP run's numbers, no hang."""
    args = [
        *CLI["demo"],
        "data.eval_limit=33",
        "data.eval_batch_size=16",
        "trainer.max_steps=4",
        "trainer.accumulate=2",
        "precision=mixed",
    ]
    runs = {}
    for strategy in ("ddp", "fsdp2"):
        runs[strategy] = tmp_path / strategy
        launch([*args, f"distributed.strategy={strategy}"], 2, runs[strategy])
    a, b = read_run(runs["ddp"]), read_run(runs["fsdp2"])
    assert a["evaluation"]["items"] == b["evaluation"]["items"] == 33
    assert b["metrics"] == pytest.approx(a["metrics"], rel=1e-6)
    assert [x for _, x in train_rows(runs["fsdp2"])] == pytest.approx(
        [x for _, x in train_rows(runs["ddp"])], rel=1e-6
    )


def test_a_run_that_never_shards_never_imports_fsdp(tmp_path) -> None:
    """Asking whether a model holds FSDP2 modules (checkpoints, the memory record) must not
    import torch.distributed.fsdp, which pulls in torch.distributed.tensor and sympy: ~0.6 s
    of CPU at every mpt-run that never shards. A real mpt-run (a checkpoint saved, the run
    record written) ends without the module; once it is imported, a sharded model is found."""
    import subprocess
    import sys

    from conftest import ROOT

    code = f"""
import sys
sys.argv = ["mpt-run", "experiment=demo", "budget=smoke", "precision=fp32", "trainer.device=cpu",
            "trainer.max_steps=2", "trainer.progress=false", "paths.runs_dir={tmp_path}"]
from mpt_repro.cli import main
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
print("imported", "torch.distributed.fsdp" in sys.modules)
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "imported False"
    assert list((tmp_path).rglob("run.json")), "the run left no record"
    from torch.distributed.fsdp import FSDPModule  # imported: the check asks it again

    # the class fully_shard makes for a module, built without a process group (FSDPModule's
    # own __new__ would hand back the plain module outside fully_shard)
    sharded = type(
        "FSDPLinear", (FSDPModule, nn.Linear), {"__new__": lambda c, *a: object.__new__(c)}
    )
    inner = sharded(2, 2)
    assert fsdp.sharded_modules([nn.Sequential(nn.Linear(2, 2), inner)]) == [inner]
    assert fsdp.sharded_modules([nn.Linear(2, 2)]) == []
