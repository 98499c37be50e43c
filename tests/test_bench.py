"""mpt-bench: its options, its meters (each checked on a step whose answer is known by hand), the
bare loop's "same math", the result rows and the table, and one worker run of the suite's step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from mpt_repro.bench import measure
from mpt_repro.bench.config import BenchConfig, parse_bench, split_args
from mpt_repro.bench.peaks import gpu_model, math_kind, peak_tflops
from mpt_repro.bench.results import aggregate, format_table
from mpt_repro.errors import ConfigError

CPU = torch.device("cpu")
MiB, GiB = 2**20, 2**30


# -- options ------------------------------------------------------------------------------------
def test_bench_options_are_typed_and_typos_refused():
    suite, bench = split_args(
        ["experiment=resnet50", "data=synthetic", "bench.presets=[fp32,amp]", "bench.steps=7"]
    )
    assert suite == ["experiment=resnet50", "data=synthetic"]
    b = parse_bench(bench)
    assert (b.presets, b.steps, b.repeats) == (["fp32", "amp"], 7, BenchConfig().repeats)
    with pytest.raises(ConfigError, match="stepz.*known: bench.presets"):
        parse_bench(["stepz=3"])
    with pytest.raises(ConfigError, match="steps"):
        parse_bench(["steps=many"])
    with pytest.raises(ConfigError, match="bench.repeats must be >= 1"):
        parse_bench(["repeats=0"])
    with pytest.raises(ConfigError, match="twice"):
        parse_bench(["presets=[amp,amp]"])


def test_a_budget_starts_no_worker_that_would_end_past_it(monkeypatch, capsys):
    """bench.budget_s on a clock where every worker takes 10 s: round 0 (every preset once)
    first; a worker whose estimate (the longest of its preset, else of any) passes the budget is
    not started, and a preset never reached says why in its row."""
    from mpt_repro.bench import cli

    now = [0.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: now[0])
    limits = []

    def worker(spec, timeout_s):
        limits.append(timeout_s)
        now[0] += 10
        job = json.loads(spec.read_text())
        out = {"repeat": job["repeat"], "samples_per_s": 1.0}
        spec.with_name(f"{job['preset']}-{job['repeat']}.json").write_text(json.dumps(out))
        return 0, ""

    monkeypatch.setattr(cli, "_run_one", worker)
    bench = parse_bench(["presets=[a,b,c]", "repeats=3", "budget_s=25"])
    measured, failed = cli.run_workers([], bench)
    assert limits == [25, 15]  # what was left of the budget, under bench.timeout_s
    assert [len(measured[p]) for p in "abc"] == [1, 1, 1] and not failed
    assert measured["c"] == [{"repeat": 0, "error": "not measured: bench.budget_s=25"}]
    assert "bench.budget_s=25 reached: 2 of 9 workers run" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="bench.budget_s must be >= 0"):
        parse_bench(["budget_s=-1"])


@pytest.mark.parametrize("arg", ["precision=amp", "precision.init_scale=8", "-m", "--cfg"])
def test_what_the_bench_does_itself_is_refused_with_the_way(arg):
    with pytest.raises(ConfigError, match="bench.presets|--help"):
        split_args(["experiment=demo", arg])


def test_help_is_fast_and_needs_no_torch():
    code = (
        "import sys; from mpt_repro.bench.cli import main; rc = main(['--help']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "usage: mpt-bench" in out and "bench.presets=[fp32,tf32,amp,mixed,bf16]" in out
    assert "experiment: " in out and "resnet50" in out and "docs/performance.md" in out


def test_a_bad_suite_override_exits_2_before_any_worker(capsys):
    from mpt_repro.bench.cli import main

    assert main(["experiment=demo", "data.batchsize=3", "bench.presets=[fp32]"]) == 2
    err = capsys.readouterr().err
    # mpt-run's own refusal, with its suggestion
    assert "data.batchsize" in err and "data.batch_size" in err and "+data" not in err


# -- peaks --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_names_map_to_their_datasheet_rows(name, model):
    assert gpu_model(name) == model


def test_each_preset_is_held_to_the_peak_of_its_math():
    assert math_kind("float16", False) == "fp16" and math_kind("bfloat16", True) == "bf16"
    assert math_kind("float32", False) == "fp32" and math_kind("float32", True) == "tf32"
    assert math_kind("bfloat16", False, "torchao") == "fp8"
    assert math_kind("float32", False, "emulated") == "fp32"  # emulation computes in FP32
    # H100 SXM5 dense peaks (NVIDIA datasheet, sparsity halved)
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp16") == 989.4
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 66.9
    assert peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no BF16 on Volta
    assert peak_tflops("some CPU", "fp32") is None


# -- meters, on steps whose answers are known by hand ---------------------------------------------
def linear_step(x: torch.Tensor, lin: torch.nn.Linear):
    def step_on(n: int):
        torch.relu(lin(x[:n].clone())).sum().backward()

    return step_on


def test_saved_bytes_per_sample_is_the_activations_slope():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(8, 4, requires_grad=True)
    out = measure.instrument(linear_step(x, lin), 8, CPU)
    # addmm keeps its input (4 floats a sample, for the weight's gradient) and its weight (12
    # floats, for the input's), relu its output (3 floats a sample): 28 bytes a sample; the
    # weight does not grow with the batch and falls out of the slope
    assert out["saved_bytes_per_sample"] == 28
    assert out["saved_bytes_batch"] == 8 * 28 + 48 and out["saved_bytes_fixed"] == 48
    # FLOPs a sample: forward 2*4*3, and as many for each of the two gradients
    assert out["flops_per_step"] == 8 * 3 * 24
    assert out["host_syncs_per_step"] == 0 and out["host_sync_ops"] == {}


def test_host_syncs_are_counted_by_op():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(8, 4)

    def step_on(n: int):
        loss = torch.relu(lin(x[:n])).sum()
        loss.backward()
        if loss > 0:  # a host read (bool of a tensor)
            float(loss)  # and another
        torch.nonzero(x)  # a data-dependent output size

    out = measure.instrument(step_on, 8, CPU)
    assert out["host_sync_ops"] == {"_local_scalar_dense": 2, "nonzero": 1}
    assert out["host_syncs_per_step"] == 3
    assert out["host_sync_where"]["nonzero"] == "outside mpt_repro"

    def marked(n: int):  # the same reads in a block marked as host work by design
        with torch.profiler.record_function(measure.HOST_MARK + "test"):
            step_on(n)
        torch.nonzero(x)  # after the block: counted again

    out = measure.instrument(marked, 8, CPU)
    assert out["host_sync_ops"] == {"nonzero": 1}


def test_host_reads_and_host_tensors_are_counted_as_a_gpu_would_see_them():
    x = torch.randn(6)
    with measure.SyncCounter() as c:
        x.tolist()  # no ATen op on a CPU run: a device-to-host copy on a GPU
        x[:2].numpy()
        x[x > 0]  # a boolean mask: the output's size is the data's (an internal nonzero)
        torch.tensor([1.0, 2.0])  # host data: a blocking copy to a GPU
        torch.as_tensor((3, 4))
        x[1] = 2.0  # a Python scalar assigned: the kernel takes it by value
        x[x < 0] = 0.0  # through a mask too (torch's masked_fill path)
        x[[0, 1]] = 1.0  # but a Python list of indices is host data
        with torch.profiler.record_function(measure.HOST_MARK + "test"):
            x.tolist()  # on the host by design
    assert c.ops == {"tolist": 1, "numpy": 1, measure.MASK_INDEX: 1}
    assert c.reads == 2
    assert c.tensors == {"lift_fresh": 3}
    assert c.sites["lift_fresh at outside mpt_repro"] == 3


def test_torch_optim_own_step_counts_are_host_side_but_an_optimizers_reads_are_not():
    """Adagrad keeps its step counts on the CPU on every device and reads them there; a custom
    optimizer (RMSpropTF is one) runs under torch.optim's step wrapper too, and its reads count."""

    class ReadsItsLR(torch.optim.Optimizer):
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.add_(p.grad, alpha=-group["lr"])  # a tensor LR: read on the host

    params = [torch.nn.Parameter(torch.randn(3)) for _ in range(4)]
    for p in params:
        p.grad = torch.randn(3)
    adagrad = torch.optim.Adagrad(params, lr=0.1, foreach=True)
    adagrad.step()  # its state is made on the first step
    ours = ReadsItsLR(params, {"lr": torch.tensor(0.1)})
    with measure.SyncCounter() as c:
        adagrad.step()
        ours.step()
    assert c.ops == {"_local_scalar_dense": 4} and c.tensors == {}


def test_every_dispatched_op_is_counted_once():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(8, 4)

    def step(extra: int):
        def step_on(n: int):
            y = lin(x[:n])
            for _ in range(extra):
                y = torch.neg(y)  # one ATen op, and one more (neg) in the backward
            y.sum().backward()

        return measure.instrument(step_on, 8, CPU, slope=False)["ops_per_step"]

    assert step(0) > 5  # the linear layer's forward and backward ops
    assert step(3) - step(0) == 6


def test_the_suites_step_shows_where_its_syncs_are(one_thread):
    """SyncCounter names the mpt_repro line a sync comes from (here: a host read of the step's
    'stepped' flag, which the suite itself leaves on the device)."""
    from conftest import build_task

    task, _ = build_task("experiment=demo", "budget=smoke", "precision=amp")
    batch = next(iter(task.train_batches(0)))
    counter = measure.SyncCounter()
    with counter:
        bool(task.train_step(batch).stepped)
    assert counter.ops == {"_local_scalar_dense": 1}  # the bool() above, nothing in the step
    assert counter.where["_local_scalar_dense"] == "outside mpt_repro"


def test_time_steps_on_the_cpu_times_the_calls():
    calls = []
    seconds = measure.time_steps(lambda: calls.append(1), 5, CPU)
    assert len(calls) == 5 and seconds >= 0


def test_memory_and_energy_say_when_they_cannot_be_read():
    mem = measure.peak_memory(CPU)
    assert mem["peak_allocated_bytes"] is None and mem["peak_host_rss_bytes"] > 0
    energy = measure.EnergyMeter(CPU)
    assert energy.read() is None and energy.why == "no GPU"


# -- the suite's step, the bare loop, the trainer ------------------------------------------------
def compose_cpu(preset: str, *extra: str):
    from mpt_repro.bench.config import compose

    base = ["experiment=demo", "budget=smoke", "trainer.device=cpu", "optim.momentum=0"]
    return compose([*base, *extra], preset)


@pytest.mark.parametrize("preset", ["fp32", "mixed"])
def test_the_bare_loop_does_the_suites_math(preset, one_thread):
    """From the same weights and batch, the bare loop and the suite's step end at the same
    weights: exactly in FP32, to FP16 rounding with FP16 weights and FP32 masters."""
    from mpt_repro.bench.step import BareLoop, build_step

    cfg = compose_cpu(preset, "data.batch_size=16")
    bs = build_step(cfg, CPU)
    bare = BareLoop(cfg, bs, CPU)
    assert bare.why_not is None
    for _ in range(3):
        bs.step()
        bare.step()
    for (name, a), b in zip(bs.task.model.named_parameters(), bare.model.parameters()):
        assert a.dtype == b.dtype, name
        if preset == "fp32":
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3)


def test_the_bare_loop_declines_fp16_grads_it_cannot_clip(one_thread):
    """no_master keeps FP16 grads: GradScaler's unscale_ (needed before a clip) refuses them, so
    the bare loop says why there is no overhead figure instead of crashing the worker."""
    from mpt_repro.bench.step import BareLoop, build_step

    cfg = compose_cpu("no_master", "data.batch_size=16", "optim.grad_clip=1.0")
    bs = build_step(cfg, CPU)
    assert BareLoop(cfg, bs, CPU).why_not == (
        "GradScaler cannot unscale FP16 grads (no master copy) before the clip (optim.grad_clip)"
    )
    cfg = compose_cpu("no_master", "data.batch_size=16")  # no clip: the fused kernel unscales
    bare = BareLoop(cfg, build_step(cfg, CPU), CPU)
    assert bare.why_not is None
    assert torch.isfinite(bare.step())


def test_trainer_windows_run_the_real_fit_on_the_resident_batch(one_thread):
    from mpt_repro.bench.step import TrainerWindows, build_step

    cfg = compose_cpu("amp", "data.batch_size=16")
    bs = build_step(cfg, CPU)
    windows = TrainerWindows(cfg, bs, total_steps=10)
    try:
        sps = [windows.run(3), windows.run(4)]
        assert windows.trainer.step == 7 and all(s > 0 for s in sps)
        assert windows.trainer.samples == 7 * 16
    finally:
        windows.close()


def test_a_worker_measures_the_suites_step(tmp_path, one_thread):
    from mpt_repro.bench.worker import measure as run_worker

    spec = {
        "overrides": ["experiment=demo", "budget=smoke", "trainer.device=cpu"],
        "preset": "mixed",
        "repeat": 0,
        "bench": {**BenchConfig().__dict__, "warmup": 2, "steps": 3, "overhead_steps": 2},
        "out": str(tmp_path / "r.json"),
    }
    r = run_worker(spec)
    assert r["preset"] == "mixed" and r["device"]["type"] == "cpu" and r["batch"] == 8
    assert r["samples_per_s"] > 0 and r["steps"] == 3 and r["math_kind"] == "fp16"
    assert r["host_syncs_per_step"] == 0  # the suite's mixed step never waits for the device
    assert r["saved_bytes_per_sample"] > 0 and r["flops_per_sample"] > 0
    assert r["saved_method"] == "slope between batch 8 and 4"
    assert len(r["trainer_samples_per_s"]) == 2 and r["trainer_overhead"] is not None
    assert "FP32 master weights" in r["describe"]
    json.dumps(r)  # what the parent reads back


# -- rows and table ------------------------------------------------------------------------------
def record(preset, repeat, sps, device="cuda", **kw):
    base = {
        "preset": preset,
        "repeat": repeat,
        "device": {"type": device, "name": "NVIDIA H100 80GB HBM3", "count": 1},
        "versions": {"torch": "x"},
        "samples_per_s": sps,
        "skipped_in_timed": 0,
        "peak_tflops": 989.4,
        "joules_per_sample": 0.5,
        "peak_allocated_bytes": 10 * 2**30,
        "peak_reserved_bytes": 11 * 2**30,
        "saved_bytes_per_sample": 80 * MiB,
        "host_syncs_per_step": 0,
        "flops_per_sample": 24.3e9,
        "trainer_overhead": 0.02,
    }
    base.update(kw)
    return base


def test_rows_take_medians_ratios_and_say_what_is_meaningful():
    amp = record("amp", 0, 3000.0, peak_allocated_bytes=5 * GiB, saved_bytes_per_sample=40 * MiB)
    measured = {
        "fp32": [record("fp32", 0, 1000.0), record("fp32", 1, 1200.0), record("fp32", 2, 1100.0)],
        "amp": [amp],
        "mixed": [{"repeat": 0, "error": "out of memory: tried to allocate"}],
    }
    rows = {r["preset"]: r for r in aggregate(measured, ["fp32", "amp", "mixed"])}
    fp32, amp, mixed = rows["fp32"], rows["amp"], rows["mixed"]
    assert (fp32["samples_per_s"], fp32["samples_per_s_min"], fp32["samples_per_s_max"]) == (
        1100.0,
        1000.0,
        1200.0,
    )
    assert amp["ratio_fp32"] == pytest.approx(3000 / 1100) and amp["ratio_amp"] == 1.0
    assert amp["mem_ratio_fp32"] == 0.5 and amp["saved_ratio_fp32"] == 0.5
    assert amp["tflops"] == pytest.approx(24.3e9 * 3000 / 1e12)
    assert amp["mfu"] == pytest.approx(amp["tflops"] / 989.4)
    assert all(amp["meaningful"].values())
    assert mixed["repeats"] == 0 and "out of memory" in mixed["error"]
    table = format_table({"results": list(rows.values())})
    assert "| mixed | failed: out of memory" in table and "(proxy)" not in table


def test_cpu_rows_mark_speed_and_memory_as_proxies():
    measured = {"fp32": [record("fp32", 0, 2.0, device="cpu", peak_tflops=None)]}
    (row,) = aggregate(measured, ["fp32"])
    assert row["meaningful"]["samples_per_s"] is False and row["mfu"] is None
    assert row["meaningful"]["saved_bytes_per_sample"] is True
    assert row["meaningful"]["host_syncs_per_step"] is True
    line = format_table({"results": [row]}).splitlines()[2]
    assert "2 [2-2] (proxy)" in line and "| 80 |" in line and "| 0 |" in line


@pytest.mark.slow
def test_mpt_bench_end_to_end_writes_the_json(tmp_path):
    """The console entry: fresh worker processes, interleaved repeats, table and JSON."""
    cmd = [
        sys.executable,
        "-m",
        "mpt_repro.bench.cli",
        "experiment=demo",
        "budget=smoke",
        "trainer.device=cpu",
        "bench.presets=[fp32,amp]",
        "bench.warmup=1",
        "bench.steps=2",
        "bench.repeats=2",
        "bench.overhead_steps=1",
        "bench.overhead_windows=1",
        f"bench.out_dir={tmp_path}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    starts = [line for line in proc.stderr.splitlines() if "building" in line]
    # interleaved: round 1 fp32, amp; round 2 starts one preset later: amp, fp32
    assert [s.split("]")[1].split("(")[0].strip() for s in starts] == ["fp32", "amp", "amp", "fp32"]
    (path,) = tmp_path.glob("demo-cpu-*.json")
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 1 and doc["device"]["type"] == "cpu"
    assert doc["config"]["bench"]["presets"] == ["fp32", "amp"] and doc["commit"]
    assert [r["preset"] for r in doc["results"]] == ["fp32", "amp"]
    assert all(r["repeats"] == 2 for r in doc["results"])
    assert "| fp32 |" in proc.stdout and "(proxy)" in proc.stdout


def test_a_worker_measures_an_lm_step_whose_batch_cannot_be_cut(tmp_path, one_thread):
    """The LM's batch is parallel streams with carried state: saved bytes are the whole step's
    per sample, and the bare loop (a task with one criterion only) says why there is no overhead
    figure."""
    from mpt_repro.bench.worker import measure as run_worker

    spec = {
        "overrides": ["experiment=lstm_lm", "budget=smoke", "trainer.device=cpu"],
        "preset": "fp32",
        "repeat": 0,
        "bench": {**BenchConfig().__dict__, "warmup": 1, "steps": 2, "overhead_steps": 1},
        "out": str(tmp_path / "r.json"),
    }
    r = run_worker(spec)
    assert r["saved_method"].startswith("total / samples") and r["saved_bytes_per_sample"] > 0
    # the bare loop asks the task (Task.criterion), and says why it declines this one
    assert r["trainer_overhead"] is None and "Task.criterion" in r["overhead_note"]
    assert "language_model's loss is its own" in r["overhead_note"]
    # the sampled softmax's sampler runs on the host by design (a record_function "host:" block):
    # its data-dependent draws are no device syncs; before, they made 16 a step
    assert r["host_syncs_per_step"] == 0, r["host_sync_where"]


SMALL_RESNET = [
    "experiment=resnet50",
    "model=custom",
    "model.target=torchvision.models:resnet18",
    "data=synthetic",
    "data.image_size=32",
    "trainer.device=cpu",
]


def test_a_small_batch_is_measured_as_given_and_one_that_cannot_train_is_refused(
    tmp_path, one_thread
):
    """ResNet-18 at 32 px ends on a 1x1 feature map: batch 2 is measured at 2 (the saved-bytes
    slope taken towards 4, since half of it could not train), and batch 1, which batch norm
    cannot train on at all, is refused in one line naming the key."""
    from mpt_repro.bench.worker import measure as run_worker
    from mpt_repro.errors import UserError

    def spec(batch: int) -> dict:
        bench = {**BenchConfig().__dict__, "warmup": 1, "steps": 1, "overhead_steps": 0}
        return {"overrides": [*SMALL_RESNET, f"data.batch_size={batch}"], "preset": "fp32",
                "repeat": 0, "bench": bench, "out": str(tmp_path / "r.json")}  # fmt: skip

    r = run_worker(spec(2))
    assert r["batch"] == 2 and r["saved_method"] == "slope between batch 2 and 4"
    assert r["saved_bytes_per_sample"] > 0 and r["flops_per_sample"] > 0
    with pytest.raises(UserError, match=r"^data.batch_size=1 cannot train resnet50: .*larger"):
        run_worker(spec(1))


def test_a_warning_inside_the_measured_step_is_kept_with_where_it_was_raised():
    """What the sync-debug block keeps of each warning: its message, the line that raised it,
    and the innermost mpt_repro line above it (none here: the test calls it)."""
    import warnings

    with measure._cuda_sync_warnings(torch.device("cpu")) as caught:
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        line = sys._getframe().f_lineno - 1
    (kept,) = caught
    assert kept["message"] == "called a synchronizing CUDA operation"
    assert kept["at"] == f"{__file__}:{line}"
    assert kept["where"] == "outside mpt_repro"
    assert warnings.showwarning is not None and warnings.showwarning.__name__ != "keep"


def test_the_json_counts_only_sync_warnings_and_says_where_each_came_from():
    caught = [
        {"message": "called a synchronizing CUDA operation", "at": "torch/x.py:3", "where": "a"},
        {"message": "called a synchronizing CUDA operation", "at": "torch/x.py:3", "where": "a"},
        {"message": "LSTM with projections is not supported", "at": "torch/y.py:1", "where": "b"},
    ]
    detail = measure._sync_warnings_detail(caught, torch.device("cuda"))
    assert detail["cuda_sync_debug_warnings"] == 2
    assert detail["cuda_sync_debug_where"] == {"a | torch/x.py:3": 2}
    assert detail["cuda_sync_debug_message"] == "called a synchronizing CUDA operation"
    off = measure._sync_warnings_detail(caught, torch.device("cpu"))
    assert off == {"cuda_sync_debug_warnings": None, "cuda_sync_debug_where": None}


@pytest.mark.slow  # inductor compiles the step: ~15-35 s on this CPU with a cold cache
def test_under_trainer_compile_the_worker_times_the_step_and_says_why_nothing_is_counted(
    tmp_path, one_thread
):
    """The meters cannot run under torch.compile (a compiled step finds no frame to compile
    under their dispatch modes): the worker times the compiled step and records why the
    counted columns are empty, instead of failing the repeat."""
    from mpt_repro.bench.results import aggregate
    from mpt_repro.bench.worker import NOT_UNDER_COMPILE
    from mpt_repro.bench.worker import measure as run_worker

    spec = {
        "overrides": [
            "experiment=demo",
            "budget=smoke",
            "trainer.device=cpu",
            "trainer.compile=step",
        ],
        "preset": "fp32",
        "repeat": 0,
        "bench": {**BenchConfig().__dict__, "warmup": 1, "steps": 2, "overhead_steps": 0},
        "out": str(tmp_path / "r.json"),
    }
    r = run_worker(spec)
    assert r["samples_per_s"] > 0 and r["not_instrumented"] == NOT_UNDER_COMPILE
    assert "saved_bytes_per_sample" not in r and "error" not in r
    (row,) = aggregate({"fp32": [r]}, ["fp32"])
    assert row["error"] is None and row["detail"]["not_instrumented"] == NOT_UNDER_COMPILE
