"""Recipe settings inside the LM and the DCGAN: f-lm's initialisation and forget-gate bias (TF
LSTMCell), the noise distribution (Radford et al.: uniform)."""

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
        assert torch.all(b[:h] == 0.0) and torch.all(b[2 * h :] == 0.0)  # TF: zeros


def test_forget_bias_null_leaves_every_bias_at_zero():
    cfg = compose(["experiment=lstm_lm", "budget=smoke", "model.forget_bias=null"])
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab_size=50)
    assert model.lstm.bias_ih_l0.abs().max() == 0 == model.lstm.bias_hh_l0.abs().max()


def spans(t: torch.Tensor, bound: float) -> bool:
    """Inside U(-bound, bound) and filling it (so a narrower or wider init fails)."""
    top = float(t.detach().abs().max())
    return 0.95 * bound < top <= bound * (1 + 1e-6)  # float32 rounding of the bound


@pytest.mark.parametrize("budget", ["paper", "smoke"])
def test_lstm_lm_initialises_as_f_lm(budget):
    """f-lm: embedding and softmax weights U(+-sqrt(3 / rows per shard)) over 8 shards, softmax
    bias Glorot of a vector, U(+-sqrt(3 / V)), LSTM kernels Glorot over [input + output, 4H],
    projections Glorot over [H, P]. Sizes from the composed config (the paper's at paper)."""
    cfg = compose(["experiment=lstm_lm", f"budget={budget}"])
    m = cfg.model
    vocab = 4000 if budget == "smoke" else 20000  # a vocabulary (the real one needs the data)
    if budget == "paper":  # the BIGLSTM is 3.3 G parameters at 793K words: shrink the widths only
        m = compose(["experiment=lstm_lm", "model.hidden_size=64", "model.proj_size=16"]).model
    assert m.init_shards == 8
    torch.manual_seed(0)
    model = build_model(m, vocab_size=vocab)
    rows = -(-vocab // 8)  # ceil: f-lm's shard_size
    assert spans(model.embedding.weight, (3 / rows) ** 0.5)
    assert spans(model.decoder.weight, (3 / rows) ** 0.5)
    assert spans(model.decoder.bias, (3 / vocab) ** 0.5)
    h, p = m.hidden_size, m.proj_size
    for layer in range(m.num_layers):
        inp = m.embed_dim if layer == 0 else p
        glorot = (6 / (inp + p + 4 * h)) ** 0.5
        assert spans(getattr(model.lstm, f"weight_ih_l{layer}"), glorot)
        assert spans(getattr(model.lstm, f"weight_hh_l{layer}"), glorot)
        assert spans(getattr(model.lstm, f"weight_hr_l{layer}"), (6 / (h + p)) ** 0.5)


def test_the_bigLSTM_embedding_bound_is_f_lms_0_0055():
    """The figure the issue quotes: 793,471 words over 8 shards: sqrt(3 / 99,184) = 0.0055, 18x
    narrower than the U(+-0.1) this model used before."""
    rows = -(-793471 // compose(["experiment=lstm_lm"]).model.init_shards)
    assert rows == 99184 and round((3 / rows) ** 0.5, 4) == 0.0055


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
