"""Recipe settings inside the LM and the DCGAN: the forget-gate bias (f-lm / TF LSTMCell) and the
noise distribution (Radford et al.: uniform)."""

from __future__ import annotations

import pytest
import torch
from conftest import compose

from mpt_repro.models import build_model
from mpt_repro.models.dcgan import sample_noise


def test_lstm_lm_experiment_starts_the_forget_gate_at_one():
    cfg = compose(["experiment=lstm_lm", "budget=smoke"])
    assert cfg.model.forget_bias == 1.0
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab_size=50)
    h = cfg.model.hidden_size
    for layer in range(cfg.model.num_layers):
        b = getattr(model.lstm, f"bias_ih_l{layer}") + getattr(model.lstm, f"bias_hh_l{layer}")
        assert torch.all(b[h : 2 * h] == 1.0)  # forget slice (gates i, f, g, o)
        assert not torch.all(b[:h] == 0.0)  # the other gates keep PyTorch's initialisation


def test_forget_bias_null_keeps_pytorchs_initialisation():
    cfg = compose(["experiment=lstm_lm", "budget=smoke", "model.forget_bias=null"])
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab_size=50)
    bound = cfg.model.hidden_size**-0.5
    assert model.lstm.bias_ih_l0.abs().max() <= bound


def test_dcgan_draws_uniform_noise_by_default():
    cfg = compose(["experiment=dcgan", "budget=smoke"])
    assert cfg.model.noise == "uniform"
    g = torch.Generator().manual_seed(0)
    z = sample_noise(20000, cfg.model, "cpu", generator=g)
    assert z.shape == (20000, cfg.model.latent_dim)
    assert z.min() >= -1 and z.max() <= 1
    assert z.var().item() == pytest.approx(1 / 3, rel=0.02)  # U(-1, 1)
    again = sample_noise(20000, cfg.model, "cpu", generator=torch.Generator().manual_seed(0))
    assert torch.equal(z, again)


def test_dcgan_normal_noise_is_pytorch_examples():
    cfg = compose(["experiment=dcgan", "budget=smoke", "model.noise=normal"])
    z = sample_noise(20000, cfg.model, "cpu", generator=torch.Generator().manual_seed(0))
    assert z.abs().max() > 1 and z.var().item() == pytest.approx(1.0, rel=0.03)
