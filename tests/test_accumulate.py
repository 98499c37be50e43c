"""Gradient accumulation (trainer.accumulate=N): N micro-batches per optimizer step."""

from __future__ import annotations

import copy

import conftest
import pytest
import torch


def build(*overrides: str):
    # an MLP without batch norm: N micro-batches of b are one batch of N*b up to rounding
    return conftest.build_task(
        "experiment=scaling_matters",
        "budget=smoke",
        "data.train_limit=512",
        "optim.lr=0.01",
        *overrides,
    )


def train(task, iterations: int, skip: int = 0) -> list:
    results = []
    for i, batches in enumerate(task.train_batches(0, skip=skip)):
        if i == iterations:
            break
        results.append(task.train_step(batches))
    return results


def params(task) -> list[torch.Tensor]:
    return [p.detach().float().clone() for p in task.model.parameters()]


def test_two_micro_batches_equal_one_batch_twice_the_size_in_fp32():
    one, _ = build("precision=fp32", "data.batch_size=32")
    two, _ = build("precision=fp32", "data.batch_size=16", "trainer.accumulate=2")
    assert two.steps_per_epoch() == one.steps_per_epoch()
    a, b = train(one, 3), train(two, 3)
    assert [r.samples for r in b] == [32, 32, 32]
    for ra, rb in zip(a, b):
        assert float(rb.loss) == pytest.approx(float(ra.loss), rel=1e-5)
    for p, q in zip(params(one), params(two)):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)


def test_the_loss_scale_sees_one_step_per_iteration_and_resume_is_exact():
    overrides = ("precision=mixed", "data.batch_size=16", "trainer.accumulate=3")
    straight, policy = build(*overrides)
    train(straight, 4)
    # one unscale and one scaler update per iteration, not per micro-batch
    assert policy.summary()["steps"] == 4

    first, _ = build(*overrides)
    train(first, 2)
    saved = copy.deepcopy(
        {
            "model": first.model.state_dict(),
            "opt": first.optimizer.state_dict(),
            "rng": torch.get_rng_state(),
        }
    )
    resumed, _ = build(*overrides)
    resumed.model.load_state_dict(saved["model"])
    resumed.optimizer.load_state_dict(saved["opt"])
    train(resumed, 2, skip=2)
    for p, q in zip(params(straight), params(resumed)):
        assert torch.equal(p, q)


def test_compile_is_refused_with_hooks_it_cannot_compile():
    from mpt_repro.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.compile"):
        build("precision=adaptive", "trainer.compile=true")


@pytest.mark.slow
def test_a_compiled_forward_trains_like_the_eager_one():
    eager, _ = build("precision=fp32")
    fast, _ = build("precision=fp32", "trainer.compile=true")
    a, b = train(eager, 2), train(fast, 2)
    for ra, rb in zip(a, b):
        assert float(rb.loss) == pytest.approx(float(ra.loss), rel=1e-4)
