"""The attention encoder-decoder of the TensorFlow seq2seq tutorial (the paper's §4.4 model), in
PyTorch: tensorflow/models tutorials/rnn/translate/seq2seq_model.py @042f746 with
tf.contrib.legacy_seq2seq.embedding_attention_seq2seq (tensorflow/tensorflow
tensorflow/contrib/legacy_seq2seq/python/ops/seq2seq.py, attention_decoder).

What is matched:
- an encoder and a decoder of `num_layers` LSTM layers of `size` cells each, own weights each
  (embedding_attention_seq2seq deep-copies the cell for the encoder), embeddings of `size`
  (embedding_size=size), the decoder starting from the encoder's final state;
- attention with one head over the encoder's top-layer outputs (Bahdanau-style additive):
  scores v . tanh(W1 h_enc + W2 q + b), where the query q is the decoder's whole new state,
  (c, h) of every layer concatenated (TF flattens the MultiRNNCell state tuple);
- input feeding: the cell input is linear([embedded input, previous attention read]) to `size`,
  the first attention read is zeros (initial_state_attention=False);
- the output is linear([top cell output, new attention read]) to `size` (AttnOutputProjection),
  then the output projection to the target vocabulary (proj_w, proj_b);
- training with a sampled softmax of `num_sampled` log-uniform candidates (TF's
  sampled_softmax_loss: unique candidates, accidental hits removed, log expected counts
  subtracted), computed in FP32 as the tutorial casts it; the full softmax when num_sampled is 0
  or covers the vocabulary; evaluation always with the full softmax;
- LSTM forget-gate bias 1.0 (BasicLSTMCell's forget_bias).

What is approximated: PyTorch's LSTM has two bias vectors per layer (TF one: +4 x size
parameters per layer, summed at the start); its input and recurrent matrices are initialised
Glorot-uniform separately (TF: one [input + hidden, 4 x hidden] kernel); embeddings start
U(-sqrt 3, sqrt 3) (TF's EmbeddingWrapper; the decoder's embedding is Glorot there); attention
ignores nothing the tutorial ignores either (encoder padding is attended to, as there).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mpt_repro.models import register_model
from mpt_repro.models.lstm_lm import LogUniformSampler

State = list[tuple[torch.Tensor, torch.Tensor]]  # (h, c) per decoder layer


class AttentionSeq2Seq(nn.Module):
    def __init__(
        self,
        source_vocab: int,
        target_vocab: int,
        size: int,
        num_layers: int,
        forget_bias: float = 1.0,
    ):
        super().__init__()
        self.size, self.num_layers = size, num_layers
        self.encoder_embedding = nn.Embedding(source_vocab, size)
        self.encoder = nn.LSTM(size, size, num_layers, batch_first=True)
        self.decoder_embedding = nn.Embedding(target_vocab, size)
        self.input_merge = nn.Linear(2 * size, size)  # [input, attention read] -> cell input
        self.decoder = nn.ModuleList(nn.LSTMCell(size, size) for _ in range(num_layers))
        self.attn_keys = nn.Linear(size, size, bias=False)  # TF's AttnW_0 (a 1x1 convolution)
        self.attn_query = nn.Linear(2 * num_layers * size, size)  # the whole state -> query
        self.attn_v = nn.Parameter(torch.empty(size))  # TF's AttnV_0
        self.attn_output = nn.Linear(2 * size, size)  # AttnOutputProjection
        self.output = nn.Linear(size, target_vocab)  # proj_w, proj_b
        self.reset_parameters(forget_bias)

    def reset_parameters(self, forget_bias: float) -> None:
        sqrt3 = math.sqrt(3.0)
        for name, p in self.named_parameters():
            if "embedding" in name:
                nn.init.uniform_(p, -sqrt3, sqrt3)
            elif p.dim() >= 2:
                nn.init.xavier_uniform_(p)  # TF get_variable's default initializer
            else:
                nn.init.zeros_(p)
        nn.init.uniform_(self.attn_v, -math.sqrt(3.0 / self.size), math.sqrt(3.0 / self.size))
        h = self.size
        with torch.no_grad():  # PyTorch's gate order is i, f, g, o
            for lstm in [self.encoder, *self.decoder]:
                for name, p in lstm.named_parameters():
                    if name.startswith("bias_ih"):
                        p[h : 2 * h].fill_(forget_bias)

    # -- encoder and one decoder step ------------------------------------------------------------
    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, State]:
        """Encoder outputs (B, S, size), their attention keys, the decoder's initial state."""
        embedded = self.encoder_embedding(source)
        kind = embedded.device.type
        if torch.is_autocast_enabled(kind):
            # CPU autocast (bf16) sends nn.LSTM to oneDNN, which refuses an FP32 input with
            # low-precision weights; CUDA autocast casts the input itself, so this changes nothing
            embedded = embedded.to(torch.get_autocast_dtype(kind))
        outputs, (h, c) = self.encoder(embedded)
        return outputs, self.attn_keys(outputs), [(h[i], c[i]) for i in range(self.num_layers)]

    def step(
        self,
        embedded: torch.Tensor,
        attn: torch.Tensor,
        state: State,
        memory: torch.Tensor,
        keys: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One decoder step: (output features, new attention read, new state)."""
        x = self.input_merge(torch.cat([embedded, attn], dim=-1))
        new_state = []
        for cell, (h, c) in zip(self.decoder, state):
            h, c = cell(x, (h, c))
            new_state.append((h, c))
            x = h
        # TF's query: the flattened LSTMStateTuple(c, h) of every layer
        query = torch.cat([t for h, c in new_state for t in (c, h)], dim=-1)
        scores = (self.attn_v * torch.tanh(keys + self.attn_query(query).unsqueeze(1))).sum(-1)
        weights = torch.softmax(scores.float(), dim=-1).to(memory.dtype)
        attn = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)
        out = self.attn_output(torch.cat([x, attn], dim=-1))
        return out, attn, new_state

    def forward(self, source: torch.Tensor, decoder_input: torch.Tensor) -> torch.Tensor:
        """Teacher-forced decoder features (B, T, size), before the output projection."""
        memory, keys, state = self.encode(source)
        attn = memory.new_zeros(source.shape[0], self.size)
        embedded = self.decoder_embedding(decoder_input)
        outputs = []
        for t in range(decoder_input.shape[1]):
            out, attn, state = self.step(embedded[:, t], attn, state, memory, keys)
            outputs.append(out)
        return torch.stack(outputs, dim=1)

    @torch.no_grad()
    def greedy_decode(self, source: torch.Tensor, go_id: int, steps: int) -> torch.Tensor:
        """The tutorial's decoder with feed_previous: each next input is the argmax of the
        previous output. (B, steps) ids."""
        memory, keys, state = self.encode(source)
        attn = memory.new_zeros(source.shape[0], self.size)
        token = torch.full((source.shape[0],), go_id, dtype=torch.long, device=source.device)
        found = []
        for _ in range(steps):
            out, attn, state = self.step(self.decoder_embedding(token), attn, state, memory, keys)
            token = self.output(out).argmax(-1)
            found.append(token)
        return torch.stack(found, dim=1)

    # -- losses ---------------------------------------------------------------------------------
    def token_losses(
        self,
        features: torch.Tensor,
        targets: torch.Tensor,
        sampler: LogUniformSampler | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Cross-entropy per target token (same shape as targets), in FP32: the full softmax, or
        the sampled one when a sampler is given."""
        h, t = features.reshape(-1, self.size), targets.reshape(-1)
        if sampler is None:
            logits = self.output(h).float()
            return F.cross_entropy(logits, t, reduction="none").view_as(targets)
        return sampled_softmax_loss(
            h, t, self.output.weight, self.output.bias, sampler, generator
        ).view_as(targets)


def sampled_softmax_loss(
    h: torch.Tensor,
    t: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    sampler: LogUniformSampler,
    generator: torch.Generator,
) -> torch.Tensor:
    """TF's sampled_softmax_loss per row (Jean et al. 2015), in FP32 as the tutorial computes it
    ("to avoid numerical instabilities"): the softmax over {target} + candidates, each logit
    less the log of its expected count, a candidate equal to the target masked out."""
    ids, expected, tries = sampler.sample(generator, h.device)
    with torch.autocast(h.device.type, enabled=False):
        h, w, b = h.float(), weight.float(), bias.float()
        true_logit = (h * w[t]).sum(-1) + b[t] - torch.log(sampler.expected_count(t, tries)).float()
        cand_logits = h @ w[ids].t() + b[ids] - torch.log(expected).float()
        cand_logits = cand_logits.masked_fill(ids.unsqueeze(0) == t.unsqueeze(1), float("-inf"))
        logits = torch.cat([true_logit.unsqueeze(1), cand_logits], dim=1)
        return F.cross_entropy(logits, torch.zeros_like(t), reduction="none")


def tf_parameter_count(source_vocab: int, target_vocab: int, size: int, num_layers: int) -> int:
    """The tutorial's variables with LSTM cells, counted as TensorFlow holds them (one bias per
    LSTM layer): what AttentionSeq2Seq has less 4 x size per LSTM layer (PyTorch's second bias)."""
    lstm = num_layers * ((2 * size) * 4 * size + 4 * size)
    return (
        source_vocab * size  # encoder embedding
        + lstm  # encoder
        + target_vocab * size  # decoder embedding
        + (2 * size) * size
        + size  # input merge
        + lstm  # decoder
        + size * size
        + size  # AttnW_0, AttnV_0
        + (2 * num_layers * size) * size
        + size  # attention query
        + (2 * size) * size
        + size  # AttnOutputProjection
        + size * target_vocab
        + target_vocab  # proj_w, proj_b
    )


@register_model("seq2seq_attention")
def seq2seq_attention(cfg: Any, source_vocab: int, target_vocab: int, **_: Any) -> nn.Module:
    return AttentionSeq2Seq(
        source_vocab, target_vocab, cfg.size, cfg.num_layers, forget_bias=cfg.forget_bias
    )
