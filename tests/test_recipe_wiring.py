"""Recipe settings reach the step, not just the config (issue 12): clipping scope, gradient
multipliers, the LM's loss normalisation, the parameter average's warm-up and scope."""

from __future__ import annotations

import conftest
import pytest
import torch
from torch import nn

from mpt_repro.ema import ParameterEMA
from mpt_repro.precision import PrecisionPolicy


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Linear(1, 1, bias=False)
        self.lstm = nn.Linear(1, 1, bias=False)

    def forward(self, x):
        return (self.embedding(x) + self.lstm(x)).sum()


def fp32_step(**step_kw) -> dict[str, float]:
    cfg = conftest.compose(["experiment=demo", "precision=fp32"])
    pol = PrecisionPolicy(cfg.precision, "cpu")
    model = Two()
    with torch.no_grad():
        model.embedding.weight.fill_(0.0)
        model.lstm.weight.fill_(0.0)
    opt = pol.build_optimizer(model, lambda ps: torch.optim.SGD(ps, lr=1.0))
    opt.zero_grad()
    opt.backward(model(torch.tensor([[3.0], [1.0]])))  # each weight's gradient: 4
    opt.step(**step_kw)
    return {n: -p.item() for n, p in model.named_parameters()}  # the update, lr 1


def test_clip_only_clips_the_norm_of_the_matching_parameters():
    assert fp32_step(clip_grad_norm=1.0) == pytest.approx(
        {"embedding.weight": 4 / 32**0.5, "lstm.weight": 4 / 32**0.5}
    )
    # f-lm: only the LSTM's gradients are clipped
    assert fp32_step(clip_grad_norm=1.0, clip_only=r"^lstm\.") == pytest.approx(
        {"embedding.weight": 4.0, "lstm.weight": 1.0}
    )


def test_grad_multipliers_act_before_clipping():
    got = fp32_step(grad_multipliers={r"^embedding\.": 8.0})
    assert got == pytest.approx({"embedding.weight": 32.0, "lstm.weight": 4.0})


def test_the_lm_backpropagates_the_loss_times_the_bptt_length():
    grads = {}
    for flag in ("false", "true"):
        task, _ = conftest.build_task(
            "experiment=lstm_lm",
            "budget=smoke",
            "precision=fp32",
            f"model.loss_times_steps={flag}",
            "model.embedding_grad_scale=1.0",
            "optim.grad_clip=null",
        )
        batch = next(iter(task.train_batches(0)))
        result = task.train_step(batch)  # fp32, no clipping: the gradients stay as computed
        grads[flag] = task.model.decoder.weight.grad.clone()
        seq_len = batch[0].shape[0]
        assert torch.isfinite(result.loss)
    torch.testing.assert_close(grads["true"], grads["false"] * seq_len, rtol=1e-5, atol=1e-8)


def test_ema_warmup_follows_tf_num_updates_and_ema_params_picks_the_scope():
    cfg = conftest.compose(["experiment=demo", "precision=fp32"])
    pol = PrecisionPolicy(cfg.precision, "cpu")
    model = nn.Sequential(nn.Linear(1, 1, bias=False), nn.BatchNorm1d(1))
    opt = pol.build_optimizer(model, lambda ps: torch.optim.SGD(ps, lr=1.0))
    ema = ParameterEMA(model, opt, decay=0.999, warmup=True, params=None)
    assert len(ema.shadow) == 3 + 2  # weight, BN gamma and beta, BN running mean and variance
    with torch.no_grad():
        model[0].weight.fill_(0.0)
    ema.shadow[0].fill_(1.0)
    ema.update(torch.tensor(True))  # t = 0: decay_t = min(0.999, 1/10) = 0.1
    assert ema.shadow[0].item() == pytest.approx(0.1)
    only = ParameterEMA(model, opt, decay=0.9, params=r"^0\.")
    assert len(only.shadow) == 1  # the Linear's weight alone, no buffers
