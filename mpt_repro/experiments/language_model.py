"""The LSTM language model (the paper's §4.5) and word-level corpora."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from mpt_repro.registry import TaskReport, metric, option_schema, task
from mpt_repro.schema import DataSchema, ModelSchema, formerly, in_unit, require

task(
    "language_model",
    "mpt_repro.tasks.language_model:LanguageModel",
    TaskReport("Language model: perplexity per preset", "lm", "primary"),
)
# what its metrics are (mpt_repro/tasks/language_model.py): per-token cross-entropy and its exp
metric("loss", higher_is_better=False)
metric("perplexity", higher_is_better=False)


@option_schema("model", "lstm_lm")
@dataclass
class LSTMLM(ModelSchema):
    """An LSTM language model with projection and optional sampled softmax."""

    embed_dim: int = 64
    hidden_size: int = 128
    proj_size: int = 0  # 0: no projection
    num_layers: int = 2
    num_sampled: int = 0  # sampled-softmax negatives; 0: full softmax
    dropout: float = 0.0
    # initial forget-gate bias (TF LSTMCell / f-lm: 1.0); null: none (all biases start at 0)
    forget_bias: float | None = None
    # f-lm's num_shards: the embedding and softmax weights are initialised per shard of
    # ceil(vocabulary / init_shards) rows, U(+-sqrt(3 / rows)) (mpt_repro/models/lstm_lm.py)
    init_shards: int = 8
    # f-lm's gradient handling, which the paper's "loss scale 128" rests on: backpropagate the
    # token-mean loss times the BPTT length (data.seq_len), and the embedding's gradients times
    # this factor (f-lm: the per-GPU batch)
    loss_times_steps: bool = field(default=False, metadata=formerly("optim.lm_loss_times_steps"))
    embedding_grad_scale: float = field(
        default=1.0, metadata=formerly("optim.embedding_grad_scale")
    )

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        for key in ("embed_dim", "hidden_size", "num_layers"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")
        for key in ("proj_size", "num_sampled"):
            require(m[key] >= 0, f"model.{key}", m[key], "must be >= 0")
        in_unit(m.dropout, "model.dropout")
        require(m.init_shards >= 1, "model.init_shards", m.init_shards, "must be >= 1")
        require(
            m.embedding_grad_scale > 0,
            "model.embedding_grad_scale",
            m.embedding_grad_scale,
            "must be > 0",
        )
        require(
            m.proj_size < m.hidden_size,
            "model.proj_size",
            m.proj_size,
            f"must be smaller than model.hidden_size={m.hidden_size} (0: no projection)",
        )


@option_schema("data", "corpus")
@dataclass
class Corpus(DataSchema):
    """A word-level corpus: train.txt, valid.txt, test.txt (root: null, the embedded one)."""

    reads: ClassVar = ("root",)

    seq_len: int = 35  # truncated back-propagation through time
    min_freq: int = 1  # words seen fewer times become <unk>
    max_vocab: int | None = None

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.seq_len > 0, "data.seq_len", d.seq_len, "must be positive")
