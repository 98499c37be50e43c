"""GPU hazards a CPU can catch (issue 28): one training step of every preset and of every
experiment's smoke config, run by the real Trainer, counted by mpt-bench's SyncCounter.

After the first batch (which settles lazy state), a step and the data path that feeds it must
not read a device value on the host (`.item()`, `bool(t)`, `.tolist()`...) nor build a tensor
from host data (`torch.tensor([...])`, `torch.as_tensor(tuple)`): on a GPU each waits for
everything queued on the device. The exceptions are by design and listed below with why.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp
from conftest import compose
from torch import nn

from mpt_repro import catalog
from mpt_repro.bench.measure import READ_OPS, SyncCounter
from mpt_repro.config import options

pytestmark = pytest.mark.usefixtures("one_thread")

# small enough for the default test run; the others are in the slow set
QUICK = ("dcgan", "demo", "faster_rcnn", "inception_v3", "lstm_lm", "scaling_matters", "ssd")
BAR = ("fp32", "amp", "mixed")

# Host reads per step by design, and why (docs/performance.md, "GPU hazards a CPU can catch"):
READS = {
    # Adagrad has no fused kernel: the skip decision reads the overflow flag (sync_free False)
    ("lstm_lm", "amp"): {"_local_scalar_dense": 1},
    ("lstm_lm", "mixed"): {"_local_scalar_dense": 1},
    # (speech's pad_packed_sequence reads the packed batch sizes, a host tensor on every device:
    # a CPU run of an older torch counted them, 2 `_local_scalar_dense` per GRU layer; torch
    # 2.14 reads them through no ATen op)
}
# Tensors built from host data per step by design: torchvision's RPN non-maximum suppression
# (torchvision/ops/boxes.py, _batched_nms_coordinate_trick) makes torch.tensor(1) for each image
HOST_TENSORS = {
    "faster_rcnn": {"lift_fresh": 2},
    # speech's collate: frame counts, targets and target lengths of the padded batch (in the
    # loader's workers whenever data.num_workers > 0, as on a GPU)
    "speech": {"lift_fresh": 3},
    # translation's batch as the tutorial's get_batch lays it out: the bucket's padded encoder
    # input, decoder input and targets, made from the pairs' token lists (data/parallel.py
    # pad_batch), then moved to the device
    "translation": {"lift_fresh": 3},
}
# The detectors size tensors from the data (anchor and RoI sampling, matching, NMS, the SSD
# loss's masks): syncs by construction, not host reads; not pinned here
DATA_DEPENDENT = ("faster_rcnn", "ssd")


class _Counted(Exception):
    """Raised by CountSecondStep once step 2 is counted: nothing after it needs to run."""


class CountSecondStep:
    """Trainer callback: a SyncCounter from the end of step 1 to the end of step 2, i.e. over the
    data path's second batch, the step and the trainer's own bookkeeping (LR schedule, EMA,
    divergence watch, log window)."""

    def __init__(self) -> None:
        self.counter: SyncCounter | None = None
        self.counting = False

    def on_step_end(self, trainer, step, result) -> None:
        if step == 1:
            self.counter = SyncCounter(trainer.task.device)
            self.counter.__enter__()
            self.counting = True
        elif step == 2:
            self.close()
            raise _Counted

    def close(self) -> None:
        if self.counting:
            self.counter.__exit__(None, None, None)
            self.counting = False


def second_step(experiment: str, preset: str) -> SyncCounter:
    """The counts of step 2 of `mpt-run experiment=<experiment> precision=<preset> budget=smoke`
    on the CPU (no log row, evaluation or checkpoint falls inside it)."""
    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.tasks import build_task
    from mpt_repro.trainer import Trainer

    overrides = [
        f"experiment={experiment}",
        "budget=smoke",
        f"precision={preset}",
        "trainer.device=cpu",
        "trainer.log_every=1000",  # no log row (a host read by design) at step 1
    ]
    root = catalog.data_root(experiment, "smoke")
    if root is not None and not root[1]:  # an ImageNet or VOC folder: random data of its shape
        overrides.append("data=synthetic")
    cfg = compose(overrides)
    cpu = torch.device("cpu")
    policy = PrecisionPolicy(cfg.precision, cpu, paper_loss_scale=cfg.paper_loss_scale)
    task = build_task(cfg, cpu, policy)
    assert task.steps_per_epoch() >= 2  # no epoch boundary between the two steps
    count = CountSecondStep()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, task, policy, run_dir, callbacks=[count], is_main=False)
        try:
            trainer.fit()
        except _Counted:
            pass
        finally:
            count.close()
    assert count.counter is not None
    return count.counter


def check(counter: SyncCounter, experiment: str, preset: str) -> None:
    sites = dict(counter.sites)  # every counted op and where it was made, for the message
    reads = {op: n for op, n in counter.ops.items() if op in READ_OPS}
    assert reads == READS.get((experiment, preset), {}), sites
    assert dict(counter.tensors) == HOST_TENSORS.get(experiment, {}), sites
    if experiment not in DATA_DEPENDENT:  # no other sync of any kind (nonzero, masks...)
        assert sum(counter.ops.values()) == counter.reads, sites


# hardware FP8 (torchao) runs on an FP8 GPU only, and refuses the demo (no linear layer it would
# convert: tests/test_fp8_hardware.py); every other preset is counted
CPU_PRESETS = [
    name for name, p in catalog.presets().items() if (p.get("fp8") or {}).get("mode") != "torchao"
]


@pytest.mark.parametrize("preset", CPU_PRESETS)
def test_no_preset_reads_the_device_or_builds_host_tensors_after_the_first_batch(preset):
    check(second_step("demo", preset), "demo", preset)


def _experiment_cases():
    for experiment in options("experiment"):
        for preset in BAR:
            slow = experiment not in QUICK or (experiment == "inception_v3" and preset != "mixed")
            marks = [pytest.mark.slow] if slow else []
            yield pytest.param(experiment, preset, marks=marks, id=f"{experiment}-{preset}")


@pytest.mark.parametrize(("experiment", "preset"), list(_experiment_cases()))
def test_no_smoke_config_reads_the_device_or_builds_host_tensors_after_the_first_batch(
    experiment, preset
):
    """The bar of issue 28: fp32, amp and mixed on every experiment's smoke config (inception_v3
    mixed is RMSpropTF with the LR schedule's device LR, and an EMA)."""
    check(second_step(experiment, preset), experiment, preset)


# -- the box coders: torchvision's arithmetic, the constants kept on the device --------------------
@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)])
def test_the_device_box_coder_is_torchvisions_bit_for_bit_without_host_tensors(weights):
    from torchvision.models.detection._utils import BoxCoder

    from mpt_repro.models.box_coder import DeviceBoxCoder

    g = torch.Generator().manual_seed(0)

    def boxes(n):
        corner = torch.rand(n, 2, generator=g) * 300
        return torch.cat([corner, corner + 1 + torch.rand(n, 2, generator=g) * 200], 1)

    anchors, truth = boxes(300), boxes(300)
    codes = torch.randn(300, 4 * 21, generator=g) * 3
    codes[0, 2] = 50.0  # a wild log-size: clamped before exp()
    ours, theirs = DeviceBoxCoder(weights), BoxCoder(weights)
    assert torch.equal(ours.decode_single(codes, anchors), theirs.decode_single(codes, anchors))
    assert torch.equal(ours.encode_single(truth, anchors), theirs.encode_single(truth, anchors))
    ours.encode_single(truth, anchors)  # the weights are on the device from the first call on
    with SyncCounter() as counter:
        ours.encode_single(truth, anchors)
        ours.decode_single(codes, anchors)
    assert counter.tensors == {}
    with SyncCounter() as counter:
        theirs.encode_single(truth, anchors)
        theirs.decode_single(codes, anchors)
    assert counter.tensors == {"lift_fresh": 3}  # what the coder replaces: weights, 0.5, 0.5


# -- DDP's no_sync through a compiled wrapper (gloo, 2 processes) ---------------------------------
def _no_sync_worker(rank: int, port: int, compile_how: str, out: dict) -> None:
    from omegaconf import OmegaConf

    from mpt_repro import distributed
    from mpt_repro.tasks.base import micro_batches
    from mpt_repro.tasks.classification import compiled

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    distributed.setup(OmegaConf.create({"backend": "gloo", "timeout_s": 120}), torch.device("cpu"))
    try:
        torch.manual_seed(0)
        ddp = distributed.wrap_model(
            nn.Linear(8, 4), OmegaConf.create({"find_unused_parameters": 0})
        )
        reduced = []

        def counting_hook(state, bucket):  # DDP's default all-reduce, counted
            reduced.append(bucket.index())
            fut = torch.distributed.all_reduce(bucket.buffer().div_(2), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        ddp.register_comm_hook(None, counting_hook)
        if compile_how == "eager":  # the wrapper torch.compile puts around the model
            model = torch.compile(ddp, backend="eager")
        else:  # the task's own: trainer.compile=true (inductor)
            model = compiled(ddp, compose(["experiment=demo", "trainer.compile=true"]))
        g = torch.Generator().manual_seed(rank)
        items = [torch.randn(4, 8, generator=g) for _ in range(3)]
        for x in micro_batches(items, model):  # trainer.accumulate=3
            model(x).square().mean().backward()
        weight, bias = ddp.module.weight.grad, ddp.module.bias.grad
        out[rank] = {
            "all_reduces": len(reduced),
            "grad": weight.clone(),
            "wrapped": type(model).__name__,
            # gradient_as_bucket_view: both grads are views into one all-reduce bucket
            "one_bucket": weight.untyped_storage().data_ptr() == bias.untyped_storage().data_ptr(),
        }
    finally:
        distributed.teardown()


def _run_no_sync(compile_how: str) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_no_sync_worker, args=(port, compile_how, out), nprocs=2, join=True)
        return dict(out)


def _expect_one_all_reduce(out: dict) -> None:
    assert out[0]["wrapped"] == "OptimizedModule"  # the compiled wrapper, not DDP itself
    # the two accumulating micro-batches ran inside no_sync: one all-reduce (one bucket) in all
    assert out[0]["all_reduces"] == out[1]["all_reduces"] == 1
    torch.testing.assert_close(out[0]["grad"], out[1]["grad"])  # the averaged sum, on both
    assert out[0]["one_bucket"] and out[1]["one_bucket"]


def test_no_sync_reaches_ddp_inside_a_compiled_wrapper():
    _expect_one_all_reduce(_run_no_sync("eager"))


@pytest.mark.slow
def test_no_sync_reaches_ddp_inside_the_tasks_compiled_model():
    """The same through classification.compiled (trainer.compile=true): inductor compiles."""
    _expect_one_all_reduce(_run_no_sync("inductor"))
