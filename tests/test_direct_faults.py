"""Direct, fast tests of three behaviours only a slow or indirect test reached (issue 34): the
FP16-state guard undoing a step whose gradients overflowed although the weights stayed finite,
and the gradient all-reduce skipped on every micro-batch but the last."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from mpt_repro.precision.guard import StateGuard
from mpt_repro.tasks.loops import micro_batches


def _guarded(fused: bool) -> tuple[nn.Parameter, torch.optim.SGD, StateGuard]:
    w = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float16))
    opt = torch.optim.SGD([w], lr=0.5, momentum=0.9, fused=fused)
    return w, opt, StateGuard(opt, [w], on_device=fused)


@pytest.mark.parametrize("overflow", [True, False])
def test_an_overflow_undoes_the_step_even_when_the_weights_stay_finite(overflow) -> None:
    """The guard's `undo = max(undo, found_inf > 0)` line: without it a step on overflowing
    gradients (finite weights after it) was kept. Host variant: the state the first step created
    is removed again."""
    w, opt, guard = _guarded(fused=False)
    w.grad = torch.tensor([0.5, 0.25], dtype=torch.float16)
    found_inf = torch.tensor([1.0 if overflow else 0.0])
    guard.save([w], found_inf.device)
    opt.step()  # finite weights either way
    undo, first_bad = guard.undo_if_nonfinite(found_inf)
    assert guard.undone is overflow and float(undo) == float(overflow)
    assert int(first_bad) == -1  # nothing in the weights or state was non-finite
    if overflow:
        assert w.tolist() == [1.0, 2.0] and not opt.state.get(w)
    else:
        assert w.tolist() == [0.75, 1.875] and "momentum_buffer" in opt.state[w]


def test_an_overflow_undoes_the_step_on_the_device_variant() -> None:
    """The same with a fused kernel (the verdict stays a tensor, the copies are put back with
    torch.where): the kernel itself skips on found_inf, the guard must keep it skipped."""
    w, opt, guard = _guarded(fused=True)
    w.grad = torch.tensor([0.5, 0.25], dtype=torch.float16)
    found_inf = torch.tensor([1.0])
    guard.save([w], found_inf.device)
    with torch.no_grad():
        w.add_(1.0)  # what a step that ignored the flag would have written: finite
    undo, _ = guard.undo_if_nonfinite(found_inf)
    assert float(undo) == 1.0 and w.tolist() == [1.0, 2.0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_process_group():
    """A real (gloo, one process) group: DDP and its all-reduce hook run, in a second."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_gradients_are_all_reduced_on_the_last_micro_batch_only(one_process_group) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))
    reduced, current = [], [0]

    def count(state, bucket):  # DDP's all-reduce of a gradient bucket
        reduced.append(current[0])
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, count)
    items = [torch.ones(2, 3) * k for k in (1, 2, 3)]
    for current[0], x in enumerate(micro_batches(items, model)):
        model(x).sum().backward()
    assert reduced == [2]  # once per optimizer step, after the last micro-batch's backward
    # the gradients of all three accumulated locally: sum over items of x summed over rows
    assert model.module.weight.grad.tolist() == [[12.0, 12.0, 12.0]]
