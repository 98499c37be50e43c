"""Machine translation (the paper's §4.4): the TensorFlow tutorial's attention seq2seq model and
parallel corpora (WMT15 English-French, and the embedded English-Spanish Bible, read by the same
loader).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from mpt_repro.registry import TaskReport, metric, option_schema, task
from mpt_repro.schema import DataSchema, ModelSchema, require

task(
    "translation",
    "mpt_repro.tasks.translation:Translation",
    # every final metric: perplexity and BLEU; the training perplexity is the paper's Figure 4
    TaskReport(
        "Machine translation: perplexity and BLEU per preset",
        "mt",
        train_figure="the paper's Figure 4",
    ),
)
# what its metrics are (mpt_repro/tasks/translation.py): per-token cross-entropy, its exp, and
# sacrebleu's corpus BLEU (0-100, not a percentage of anything)
metric("loss", higher_is_better=False)
metric("perplexity", higher_is_better=False)
metric("bleu", higher_is_better=True)


@option_schema("model", "seq2seq_attention")
@dataclass
class Seq2SeqAttention(ModelSchema):
    """The TensorFlow seq2seq tutorial's attention encoder-decoder (models/seq2seq.py). The
    vocabulary sizes and buckets are the tutorial model's constructor arguments, so they live
    here and data=synthetic draws token pairs of the same shape."""

    size: int = 1024
    num_layers: int = 3
    source_vocab_size: int = 40000
    target_vocab_size: int = 40000
    buckets: list[list[int]] = field(
        default_factory=lambda: [[5, 10], [10, 15], [20, 25], [40, 50]]
    )
    num_sampled: int = 512  # sampled-softmax candidates; 0 (or >= the vocabulary): full softmax
    forget_bias: float = 1.0  # BasicLSTMCell's

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        for key in ("size", "num_layers"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")
        for key in ("source_vocab_size", "target_vocab_size"):
            require(m[key] > 4, f"model.{key}", m[key], "must be > 4 (_PAD, _GO, _EOS, _UNK)")
        require(m.num_sampled >= 0, "model.num_sampled", m.num_sampled, "must be >= 0")
        pairs = [list(b) for b in m.buckets]
        require(
            bool(pairs)
            and all(len(b) == 2 and b[0] >= 2 and b[1] >= 3 for b in pairs)
            and pairs == sorted(pairs),
            "model.buckets",
            pairs,
            "must be increasing [source, target] length pairs, e.g. [[5, 10], [10, 15]]",
        )


@option_schema("data", "bible_enes")  # root: null is the embedded corpus
@dataclass
class ParallelCorpus(DataSchema):
    """A parallel corpus as WMT releases it: <prefix>.<lang> plain-text files (or .gz)."""

    train_prefix: str = "giga-fren.release2.fixed"
    dev_prefix: str = "newstest2013"
    source_lang: str = "en"
    target_lang: str = "fr"
    normalize_digits: bool = True  # the tutorial's: every digit becomes 0
    # bytes: the tutorial's regular expressions on bytes (ASCII whitespace and digits); text:
    # Python's Unicode ones (also U+00A0, non-ASCII digits); mpt_repro/data/parallel.py
    tokenizer: str = "bytes"

    reads: ClassVar = ("root",)

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        kinds = ("bytes", "text")  # data/parallel.py's TOKENIZERS
        require(d.tokenizer in kinds, "data.tokenizer", d.tokenizer, f"must be one of {kinds}")


@option_schema("data", "wmt15_enfr")
@dataclass
class ParallelCorpusFolder(ParallelCorpus):
    """The same files, from a folder only (nothing embedded)."""

    needs_root: ClassVar = True
