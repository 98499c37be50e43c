"""bigLSTM-style word language model: embedding, LSTM layers with projection, softmax output.

The paper's §4.5 model (Jozefowicz et al. 2016, "BIGLSTM"; NVIDIA's f-lm recipe) is two layers of
8192 LSTM cells, each projected to 1024, with 1024-dim embeddings and a 793K-word vocabulary,
trained with a sampled softmax of 8192 negatives. The budgets pick the sizes; the structure is
the same at every size.

Training with `num_sampled > 0` uses the sampled softmax with a log-uniform candidate sampler
(unique candidates, accidental hits removed, logits corrected by log expected count, as
TensorFlow's sampled_softmax_loss that the bigLSTM code used). Evaluation always uses the full
softmax, so perplexities are comparable across settings.

The sampler runs on the host, as TensorFlow's candidate samplers do: drawing until enough ids
are distinct is data-dependent, and on a GPU each of its decisions would stop the host until
the device caught up (16 waits a step, measured by mpt-bench). The ids travel to the device in
one asynchronous copy from pinned memory.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mpt_repro.models import register_model

Hidden = tuple[torch.Tensor, torch.Tensor]


class LogUniformSampler:
    """Draws `num_sampled` distinct word ids from P(k) = log((k+2)/(k+1)) / log(V+1).

    The vocabulary is numbered by descending frequency, so this Zipfian law approximates the
    unigram distribution without storing it. Draws are made with replacement until
    `num_sampled` distinct ids are seen; with `tries` draws in total, the chance that word k is
    among the candidates ("expected count") is 1 - (1 - P(k))^tries. When num_sampled covers
    the whole vocabulary, every word is a candidate with certainty (expected count 1).
    """

    def __init__(self, vocab_size: int, num_sampled: int):
        self.vocab_size, self.num_sampled = vocab_size, num_sampled
        self.log_range = math.log(vocab_size + 1)

    def prob(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.double()
        return (torch.log(ids + 2) - torch.log(ids + 1)) / self.log_range

    def draw(self, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        # Inverse CDF: CDF(k) = log(k+2)/log(V+1) - ... so k = floor(exp(u * log(V+1))) - 1.
        u = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
        return (torch.exp(u * self.log_range).floor().long() - 1).clamp_(0, self.vocab_size - 1)

    def sample(
        self, generator: torch.Generator, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(candidate ids, their expected counts, tries) on ``device``, drawn on the host with
        ``generator`` (a CPU generator)."""
        # "host:" marks work that is on the host by design: mpt-bench counts no sync in it
        with torch.profiler.record_function("host:log_uniform_candidate_sampler"):
            ids, expected, tries = self._sample(generator, torch.device("cpu"))
        if device.type == "cpu":
            return ids, expected, tries
        # pinned: a copy from pageable memory would wait for the device's queue first
        return (
            ids.pin_memory().to(device, non_blocking=True),
            expected.pin_memory().to(device, non_blocking=True),
            tries,
        )

    def _sample(
        self, generator: torch.Generator, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        if self.num_sampled >= self.vocab_size:
            ids = torch.arange(self.vocab_size, device=device)
            return ids, torch.ones(self.vocab_size, device=device, dtype=torch.float64), math.inf
        draws = torch.empty(0, dtype=torch.long, device=device)
        while True:
            # Draw in chunks; keep the prefix that first reaches num_sampled distinct ids.
            draws = torch.cat([draws, self.draw(2 * self.num_sampled, generator, device)])
            uniq, inverse = torch.unique(draws, return_inverse=True)
            if uniq.numel() >= self.num_sampled:
                break
        positions = torch.arange(draws.numel(), device=device)
        first_seen = torch.full((uniq.numel(),), draws.numel(), device=device, dtype=torch.long)
        first_seen.scatter_reduce_(0, inverse, positions, reduce="amin")
        is_first = torch.zeros(draws.numel(), dtype=torch.bool, device=device)
        is_first[first_seen] = True
        tries = int(torch.searchsorted(is_first.cumsum(0), self.num_sampled)) + 1
        ids = draws[:tries][is_first[:tries]]
        return ids, self.expected_count(ids, tries), float(tries)

    def expected_count(self, ids: torch.Tensor, tries: float) -> torch.Tensor:
        if math.isinf(tries):
            return torch.ones(ids.shape, device=ids.device, dtype=torch.float64)
        return -torch.expm1(tries * torch.log1p(-self.prob(ids)))


class LSTMLanguageModel(nn.Module):
    # distributed.strategy=fsdp2 shards the LSTM on its own (mpt_repro/fsdp.py, blocks); the
    # embedding and the softmax weights stay in the root's group, since the loss (full or sampled
    # softmax) reads the softmax weights outside any forward
    shard_blocks = ("lstm",)

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden_size: int,
        num_layers: int,
        proj_size: int = 0,
        dropout: float = 0.0,
        forget_bias: float | None = None,
        init_shards: int = 8,
    ):
        super().__init__()
        self.vocab_size, self.num_layers, self.hidden_size = vocab_size, num_layers, hidden_size
        self.out_dim = proj_size or hidden_size
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.drop = nn.Dropout(dropout)
        # nn.LSTM applies dropout between layers; self.drop adds it before the first and after the
        # last.
        self.lstm = nn.LSTM(
            embed_dim,
            hidden_size,
            num_layers,
            dropout=dropout if num_layers > 1 else 0.0,
            proj_size=proj_size,
        )
        self.decoder = nn.Linear(self.out_dim, vocab_size)
        self.init_f_lm(init_shards)
        if forget_bias is not None:
            self.set_forget_bias(forget_bias)

    @torch.no_grad()
    def init_f_lm(self, shards: int) -> None:
        """f-lm's initialisation (okuchaiev/f-lm @be03b50; TensorFlow's initialisers):

        - embedding and softmax weights: `sharded_variable` (model_utils.py L33-42) splits each
          into `shards` shards of ceil(V / shards) rows, every shard initialised by
          `uniform_unit_scaling_initializer`: U(+-sqrt(3 / rows of the shard));
        - softmax bias: `tf.get_variable` without an initialiser (language_model.py L134), i.e.
          Glorot uniform, which for a vector of V takes fan_in = fan_out = V: U(+-sqrt(3 / V));
        - each LSTM layer (`tf.nn.rnn_cell.LSTMCell`, language_model.py L109-111): its kernel is
          one [input + output, 4H] matrix under Glorot uniform, U(+-sqrt(6 / (input + output +
          4H))), which nn.LSTM keeps as weight_ih and weight_hh; the projection [H, P] Glorot,
          U(+-sqrt(6 / (H + P))); the biases zero (the forget-gate offset: set_forget_bias).
        """
        rows = math.ceil(self.vocab_size / shards)
        a = math.sqrt(3.0 / rows)
        self.embedding.weight.uniform_(-a, a)
        self.decoder.weight.uniform_(-a, a)
        b = math.sqrt(3.0 / self.vocab_size)
        self.decoder.bias.uniform_(-b, b)
        for layer in range(self.num_layers):
            w_ih = getattr(self.lstm, f"weight_ih_l{layer}")
            w_hh = getattr(self.lstm, f"weight_hh_l{layer}")
            fan = w_ih.shape[1] + w_hh.shape[1] + w_ih.shape[0]  # input + output + 4H
            c = math.sqrt(6.0 / fan)
            w_ih.uniform_(-c, c)
            w_hh.uniform_(-c, c)
            getattr(self.lstm, f"bias_ih_l{layer}").zero_()
            getattr(self.lstm, f"bias_hh_l{layer}").zero_()
            if self.lstm.proj_size:
                w_hr = getattr(self.lstm, f"weight_hr_l{layer}")
                d = math.sqrt(6.0 / (w_hr.shape[0] + w_hr.shape[1]))
                w_hr.uniform_(-d, d)

    @torch.no_grad()
    def set_forget_bias(self, value: float) -> None:
        """Start every layer's forget gate at bias `value`. TensorFlow's LSTMCell (f-lm's BIGLSTM)
        adds a constant forget_bias=1.0 to the forget gate's pre-activation, with a trainable bias
        that starts at 0; a trainable bias that starts at 1.0 is the same function and receives
        the same gradient (the LM trains without weight decay). nn.LSTM has two biases per layer
        (gates i, f, g, o): the forget slice of bias_ih is set to `value`, that of bias_hh to 0,
        so their sum is `value`; the other gates keep their zero initialisation."""
        h = self.hidden_size
        for layer in range(self.num_layers):
            getattr(self.lstm, f"bias_ih_l{layer}")[h : 2 * h].fill_(value)
            getattr(self.lstm, f"bias_hh_l{layer}")[h : 2 * h].zero_()

    def init_hidden(self, batch_size: int, device: torch.device) -> Hidden:
        h = torch.zeros(self.num_layers, batch_size, self.out_dim, device=device)
        c = torch.zeros(self.num_layers, batch_size, self.hidden_size, device=device)
        return h, c

    def forward(self, x: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden]:
        """x: (steps, batch) ids -> features (steps, batch, out_dim) for the softmax, new hidden."""
        emb = self.drop(self.embedding(x))
        # The carried state takes the storage dtype of the model (FP16 when the policy casts
        # weights).
        hidden = tuple(t.to(emb.dtype) for t in hidden)
        out, hidden = self.lstm(emb, hidden)
        return self.drop(out), hidden

    def full_loss(
        self,
        features: torch.Tensor,
        targets: torch.Tensor,
        reduction: str = "mean",
        chunk_rows: int | None = None,
    ) -> torch.Tensor:
        """Cross-entropy over the whole vocabulary: the mean or the sum over the tokens, or with
        reduction="none" each token's (in the shape of `targets`: evaluation sums them per
        block). chunk_rows bounds the logits held at once (793K-word vocabularies).
        """
        h, t = features.reshape(-1, self.out_dim), targets.reshape(-1)
        rows = chunk_rows or h.size(0)
        each = "none" if reduction == "none" else "sum"
        parts = [
            F.cross_entropy(self.decoder(h[i : i + rows]).float(), t[i : i + rows], reduction=each)
            for i in range(0, h.size(0), rows)
        ]
        if reduction == "none":
            return torch.cat(parts).view(targets.shape)
        total = sum(parts)
        return total / t.numel() if reduction == "mean" else total

    def sampled_loss(
        self,
        features: torch.Tensor,
        targets: torch.Tensor,
        sampler: LogUniformSampler,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Sampled-softmax estimate of the cross-entropy (Jean et al. 2015), mean over tokens."""
        h, t = features.reshape(-1, self.out_dim), targets.reshape(-1)
        ids, expected, tries = sampler.sample(generator, h.device)
        w, b = self.decoder.weight, self.decoder.bias
        # Subtracting log(expected count) from every logit, the target's included, makes the
        # softmax over {target} + candidates an estimate of the full softmax.
        true_logit = (
            (h * w[t]).sum(-1) + b[t] - torch.log(sampler.expected_count(t, tries)).to(h.dtype)
        )
        cand_logits = h @ w[ids].t() + b[ids] - torch.log(expected).to(h.dtype)
        # A candidate equal to the target ("accidental hit") would count the target twice.
        cand_logits = cand_logits.masked_fill(ids.unsqueeze(0) == t.unsqueeze(1), float("-inf"))
        logits = torch.cat([true_logit.unsqueeze(1), cand_logits], dim=1)
        return F.cross_entropy(logits.float(), torch.zeros_like(t))


@register_model("lstm_lm")
def lstm_lm(cfg: Any, vocab_size: int, **_: Any) -> nn.Module:
    return LSTMLanguageModel(
        vocab_size,
        cfg.embed_dim,
        cfg.hidden_size,
        cfg.num_layers,
        cfg.proj_size,
        cfg.dropout,
        forget_bias=cfg.forget_bias,
        init_shards=cfg.init_shards,
    )
