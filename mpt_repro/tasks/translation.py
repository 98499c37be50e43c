"""Machine translation (the paper's §4.4, Figure 4): the TensorFlow seq2seq tutorial's attention
model on English->French, perplexity as the metric, BLEU of greedy decodes as an extra column.

Training follows the tutorial (tensorflow/models tutorials/rnn/translate): batches of one bucket
each, the loss of a batch the mean over its sentences of each sentence's mean token loss
(legacy_seq2seq.sequence_loss), a sampled softmax, SGD with the global gradient norm clipped.
An epoch visits every training pair once, the batches of all buckets shuffled together in an
order fixed by (seed, epoch), so a resumed run continues exactly.

Evaluation runs the whole dev set (data.eval_limit lines of it) once per evaluation: the
perplexity is exp(summed token cross-entropy / target tokens) with the full softmax (the
tutorial prints the exp of one random batch's sampled loss per bucket), and BLEU is sacrebleu's
corpus BLEU of the greedy decodes (the tutorial's decoder: argmax fed back, cut at _EOS) against
the dev targets, both as basic_tokenizer tokens (tokenize="none": tokenised BLEU, not comparable
with published detokenised scores). The decoded _UNK never matches a reference word. Both are
formulas over per-pair statistics (mpt_repro/evidence.py): each dev pair's summed token loss,
tokens and BLEU n-gram counts, kept in the items file; dev pairs too long for every bucket are
left out and counted (run.json `evaluation.dropped`); a dev set with none that fits, or only
blank targets, is refused while the data loads (mpt_repro/data/parallel.py).

Data-parallel (DDP): each rank trains on every world_size-th batch of the epoch's order and
evaluates every world_size-th dev batch; the pairs' statistics are joined over ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from mpt_repro import distributed
from mpt_repro.data.parallel import (
    EOS_ID,
    GO_ID,
    PAD_ID,
    ParallelData,
    epoch_batches,
    eval_batches,
    load_parallel,
    pad_batch,
    synthetic_parallel,
)
from mpt_repro.errors import DataError
from mpt_repro.evidence import Bleu, Ratio, bleu_statistics, text_key
from mpt_repro.models.lstm_lm import LogUniformSampler
from mpt_repro.optim import optimizer_factory
from mpt_repro.tasks.base import Loss, Task, chunked


class _LossForward(nn.Module):
    """The training forward and its loss as one module for DDP: the output projection is used
    by the (sampled) loss, not by the model's forward (tasks/language_model.py says why)."""

    def __init__(self, model: nn.Module, sampler: LogUniformSampler | None):
        super().__init__()
        self.model, self.sampler = model, sampler

    def forward(self, source, decoder_input, targets, generator) -> torch.Tensor:
        features = self.model(source, decoder_input)
        losses = self.model.token_losses(features, targets, self.sampler, generator)
        weights = (targets != PAD_ID).to(losses.dtype)
        # sequence_loss: each sentence's mean over its target tokens, then the batch mean
        per_sentence = (losses * weights).sum(1) / (weights.sum(1) + 1e-12)
        return per_sentence.mean()


def load_data(cfg: Any) -> ParallelData:
    d, m = cfg.data, cfg.model
    buckets = [tuple(b) for b in m.buckets]
    if d.name == "synthetic":
        return synthetic_parallel(
            d.train_limit or d.synthetic_train_size,
            d.eval_limit or d.synthetic_eval_size,
            m.source_vocab_size,
            m.target_vocab_size,
            buckets,
            cfg.seed,
        )
    return load_parallel(d, m.source_vocab_size, m.target_vocab_size, buckets)


class Translation(Task):
    primary_metric = "perplexity"
    metric_names = ["loss", "perplexity", "bleu"]
    # evaluation by items (mpt_repro/evidence.py): the dev pairs; the perplexity over their
    # target tokens, BLEU from their summed n-gram statistics (sacrebleu's corpus BLEU)
    item_unit = "sentence pairs"
    item_key = "key"
    formulas = {
        "loss": Ratio("loss", "tokens", "tokens"),
        "perplexity": Ratio("loss", "tokens", "tokens", exp=True),
        "bleu": Bleu(unit="sentence pairs"),
    }

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        self.data = load_data(cfg)
        if len(self.data.train) < cfg.data.batch_size:
            raise DataError(
                f"{self.data.description}: fewer training pairs in the buckets than one batch "
                f"(data.batch_size={cfg.data.batch_size})"
            )
        self.batch = distributed.batch_sizes(cfg)[0]
        self.eval_batch = cfg.data.eval_batch_size or cfg.data.batch_size
        target_vocab = len(self.data.target_vocab)
        n = cfg.model.num_sampled
        self.sampler = LogUniformSampler(target_vocab, n) if 0 < n < target_vocab else None
        if self.sampler is not None:  # trains on n candidates, evaluates on every word
            self.train_loss_name = "sampled_loss"
        self.model, self.optimizer, self.train_model = self.add_model(
            "model",
            self.new_model(source_vocab=len(self.data.source_vocab), target_vocab=target_vocab),
            optimizer_factory(cfg.optim, distributed.batch_sizes(cfg)[1]),
            forward=lambda model: _LossForward(model, self.sampler),
        )
        # candidate draws: a generator of their own, saved with the task (resume is exact); the
        # same seed on every rank, as in the language model
        self.generator = torch.Generator().manual_seed(cfg.seed)

    # -- training -----------------------------------------------------------------------------
    def _rank_batches(self, epoch: int) -> list[tuple[int, list[int]]]:
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
        batches = epoch_batches(self.data.train, self.batch, g)
        rank, world = distributed.rank(), distributed.world_size()
        per_rank = len(batches) // world  # every rank steps as often
        return batches[rank::world][:per_rank]

    def steps_per_epoch(self) -> int:
        total = sum(len(p) // self.batch for p in self.data.train.pairs)
        return total // distributed.world_size() // self.cfg.trainer.accumulate

    def _tensors(self, data, bucket: int, indices: list[int]) -> tuple:
        pairs = [data.pairs[bucket][i] for i in indices]
        source, decoder_input, targets = pad_batch(pairs, data.buckets[bucket])
        # counted on the host, before the copy ("host:": mpt-bench counts no device read in it)
        with torch.profiler.record_function("host:target_tokens"):
            tokens = int((targets != PAD_ID).sum())
        move = lambda x: x.to(self.device, non_blocking=True)  # noqa: E731
        return move(source), move(decoder_input), move(targets), tokens

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[list[tuple]]:
        """Each iteration's micro-batches (trainer.accumulate of them)."""
        batches = self._rank_batches(epoch)[skip * self.cfg.trainer.accumulate :]
        micro = (self._tensors(self.data.train, b, idx) for b, idx in batches)
        return chunked(micro, self.cfg.trainer.accumulate)

    def split(self, batch: list[tuple]) -> list[tuple]:
        return batch

    def loss(self, batch: tuple) -> Loss:
        source, decoder_input, targets, tokens = batch
        loss = self.train_model(source, decoder_input, targets, self.generator)
        return Loss(loss, samples=tokens)  # samples/s counts target tokens (words/s)

    # -- evaluation ---------------------------------------------------------------------------
    def eval_batches(self) -> Iterator[tuple]:
        """Every world_size-th dev batch, with the references of its pairs."""
        rank, world = distributed.rank(), distributed.world_size()
        starts, seen = [], 0
        for part in self.data.eval.pairs:
            starts.append(seen)
            seen += len(part)
        for k, (b, idx) in enumerate(eval_batches(self.data.eval, self.eval_batch)):
            if k % world == rank:
                refs = [" ".join(self.data.references[starts[b] + i]) for i in idx]
                yield (*self._tensors(self.data.eval, b, idx), refs)

    def eval_step(self, batch: tuple) -> dict[str, Any]:
        """Per dev pair: the full-softmax cross-entropy summed over its target tokens, the
        tokens, the BLEU statistics of its greedy decode against its reference, and a key
        hashing the reference."""
        source, decoder_input, targets, _, refs = batch
        features = self.model(source, decoder_input)
        mask = targets != PAD_ID
        losses = self.model.token_losses(features, targets)
        decoded = self.model.greedy_decode(source, GO_ID, targets.shape[1]).tolist()
        return {
            "loss": (losses * mask).sum(1),
            "tokens": mask.sum(1),
            "items": [1] * len(refs),
            **bleu_statistics([self._detok(ids) for ids in decoded], refs),
            "key": [text_key(r) for r in refs],
        }

    def eval_dropped(self) -> dict[str, int]:
        """Dev pairs that fit no bucket (left out of the evaluation, as the tutorial does)."""
        return {"longer_than_largest_bucket": self.data.eval.dropped}

    def _detok(self, ids: list[int]) -> str:
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return " ".join(self.data.target_vocab.decode(ids))

    # -- the rest -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])

    def describe_data(self) -> dict:
        d, data = self.cfg.data, self.data
        return {
            "name": d.name,
            "root": d.get("root"),
            "description": data.description,
            "train_pairs": len(data.train),
            "eval_pairs": len(data.eval),
            "eval_dropped_too_long": data.eval.dropped,
            "train_dropped_too_long": data.train.dropped,
            "pairs_per_bucket": [len(p) for p in data.train.pairs],
            "source_vocab_size": len(data.source_vocab),
            "target_vocab_size": len(data.target_vocab),
        }

    def describe_model(self) -> dict:
        m = self.cfg.model
        return {
            **super().describe_model(),
            "size": m.size,
            "num_layers": m.num_layers,
            "buckets": [list(b) for b in m.buckets],
            "softmax": f"sampled ({m.num_sampled} candidates)" if self.sampler else "full",
        }
