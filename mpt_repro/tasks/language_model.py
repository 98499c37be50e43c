"""Word-level language modelling (the paper's §4.5 bigLSTM experiment): perplexity.

Training is truncated back-propagation through time over `data.seq_len` steps, with
`data.batch_size` contiguous streams of the training text side by side. The LSTM state is carried
from one window to the next (detached, so gradients stop at the window edge) and reset at the
start of each epoch. The batch order is the text order, so an epoch is the same in every run;
the carried state is saved with the task state, so a resumed run continues exactly.

Data-parallel (DDP): the text is cut into the global batch's streams and each rank trains on its
own block of them (`shard_streams`), carrying its own hidden state; evaluation does the same with
the validation streams and sums token losses and counts over the ranks. N processes thus compute
what one process with the global batch computes (up to the order of float additions; dropout
masks differ).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from mpt_repro import distributed
from mpt_repro.data.corpus import Corpus, batchify, bptt_batches, num_bptt_batches, shard_streams
from mpt_repro.errors import ConfigError
from mpt_repro.evidence import Ratio
from mpt_repro.models.lstm_lm import Hidden, LogUniformSampler
from mpt_repro.optim import optimizer_factory
from mpt_repro.tasks.base import Loss, StepResult, Task

# Full-softmax evaluation computes the logits this many rows at a time, so a 793K-word
# vocabulary does not need (seq_len x batch) x 793K logits at once.
EVAL_LOGIT_ELEMENTS = 1 << 26
KEY_PRIME = 2_147_483_647  # 2^31 - 1: a block's key fits the items file's int32


class _LossForward(nn.Module):
    """The training forward and its loss as one module, for DDP to wrap.

    The softmax weights are used by the loss (full or sampled), not by the model's forward. DDP
    must see the whole computation in the forward it wraps: with find_unused_parameters it walks
    the graph from that forward's outputs and would count the decoder as unused (then fail when
    its gradient arrives). Holds no parameters of its own, so the bare model stays what is saved.
    """

    def __init__(self, model: nn.Module, sampler: LogUniformSampler | None):
        super().__init__()
        self.model, self.sampler = model, sampler

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, hidden: Hidden, generator: torch.Generator
    ) -> tuple[torch.Tensor, Hidden]:
        features, hidden = self.model(x, hidden)
        if self.sampler is None:
            return self.model.full_loss(features, y), hidden
        return self.model.sampled_loss(features, y, self.sampler, generator), hidden


def key_weights(length: int, device: torch.device) -> torch.Tensor:
    """Fixed pseudo-random weights per window position for block_key (the same in every run)."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(1, KEY_PRIME, (length,), generator=g).to(device)


def block_key(targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A hash of each column's target ids ((seq, streams) -> (streams,), below 2^31): their
    weighted sum modulo a prime. Names a block by its words, on the device (int64: ids < 2^24
    times weights < 2^31, summed over fewer than 2^8 positions, stay below 2^63)."""
    return ((targets + 1) * weights[: targets.shape[0], None]).sum(0) % KEY_PRIME


class LanguageModel(Task):
    primary_metric = "perplexity"
    metric_names = ["loss", "perplexity"]
    # evaluation by items (mpt_repro/evidence.py): a block is one BPTT window of one validation
    # stream; the perplexity is exp(summed token loss / tokens) over the blocks
    item_unit = "text blocks"
    item_key = "key"
    formulas = {
        "loss": Ratio("loss", "tokens", "tokens"),
        "perplexity": Ratio("loss", "tokens", "tokens", exp=True),
    }

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d, m = cfg.data, cfg.model
        if cfg.budget.name == "paper" and d.root is None:
            # The paper-sized model on the small embedded text would run for days and mean nothing.
            raise ConfigError(
                "budget=paper is the paper's model and data: set data.root to a word-level corpus "
                "(the One Billion Word benchmark as train.txt/valid.txt/test.txt; see "
                "docs/experiments_lm_gan.md)"
            )
        self.corpus = Corpus(d.root, d.min_freq, d.max_vocab)
        # Budgets trim the text: train_limit / eval_limit count tokens for a corpus.
        train, valid = self.corpus.train[: d.train_limit], self.corpus.valid[: d.eval_limit]
        self.seq_len = d.seq_len
        # The global batch is the number of streams the text is cut into (and the batch the
        # optimizer's LR rule sees); each rank's batch is its block of those streams.
        global_batch = distributed.batch_sizes(cfg)[1]
        rank, world = distributed.rank(), distributed.world_size()
        # The validation text is cut into as many streams as a one-process run with the global
        # batch would cut it into (how the text is cut changes the perplexity); eval_batch_size
        # counts like data.batch_size (per process or global, distributed.batch_size_is).
        eval_global = d.eval_batch_size or d.batch_size
        if cfg.distributed.batch_size_is == "per_process":
            eval_global *= world
        self.global_streams = global_batch
        train_streams = batchify(train, global_batch, *self._cut("train", global_batch))
        valid_streams = batchify(valid, eval_global, *self._cut("valid", eval_global))
        self.train_streams = shard_streams(train_streams, rank, world).to(device)
        self.eval_streams = shard_streams(valid_streams, rank, world).to(device)
        self.train_tokens, self.valid_tokens = (
            self.train_streams.size(0) * global_batch,
            self.eval_streams.size(0) * eval_global,
        )
        vocab_size = len(self.corpus.vocab)
        self.sampler = LogUniformSampler(vocab_size, m.num_sampled) if m.num_sampled > 0 else None
        if self.sampler is not None:  # trains on the sampled candidates, evaluates on every word
            self.train_loss_name = "sampled_loss"
        # Trained through DDP (gradient averaging); the bare model is what is saved and evaluated.
        self.model, self.optimizer, self.train_model = self.add_model(
            "model",
            self.new_model(vocab_size=vocab_size),
            optimizer_factory(cfg.optim, global_batch),
            forward=lambda model: _LossForward(model, self.sampler),
        )
        # The candidate draws have their own generator (saved with the task state): resume is exact.
        # Deliberately the same seed on every rank: one candidate set serves the whole global
        # batch, as it serves all streams in one process, so N processes train what one does.
        # On the host on every device: the sampler runs there (models/lstm_lm.py says why).
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.hidden: Hidden | None = None  # this rank's streams' carried state
        self._carried: list[Hidden] = []  # each micro-batch's new state, this iteration

    def _cut(self, split: str, streams: int) -> tuple[str, str]:
        """For a text too short for its streams: the file and the settings that cut it, and what
        to do (a validation text cut to nothing would leave the perplexity without a token)."""
        d = self.cfg.data
        limit = d.train_limit if split == "train" else d.eval_limit
        key = "data.train_limit" if split == "train" else "data.eval_limit"
        batch = "data.batch_size" if split == "train" else "data.eval_batch_size"
        cut = limit is not None and len(getattr(self.corpus, split)) > limit
        advice = (
            f"{streams} streams come from {batch} (and the number of processes): lower it"
            f"{f', raise {key}' if cut else ''}, or use a longer {split}.txt"
        )
        return f"{self.corpus.paths[split]}{f' (its first, {key}={limit})' if cut else ''}", advice

    def steps_per_epoch(self) -> int:
        return num_bptt_batches(self.train_streams, self.seq_len)

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        # A fresh state at the start of an epoch; a resumed run (skip > 0) keeps the restored one.
        if skip == 0 or self.hidden is None:
            self.hidden = self.model.init_hidden(self.train_streams.size(1), self.device)
        return bptt_batches(self.train_streams, self.seq_len, skip)

    def split(self, batch: Any) -> list[Any]:
        """With trainer.accumulate=N the window's streams are N micro-batches of columns, each
        carrying its own slice of the hidden state: N x data.batch_size streams per step."""
        x, y = batch
        n = self.cfg.trainer.accumulate
        columns = zip(x.tensor_split(n, dim=1), y.tensor_split(n, dim=1))
        hidden_parts = zip(*(h.tensor_split(n, dim=1) for h in self.hidden))
        return [(xi, yi, hi) for (xi, yi), hi in zip(columns, hidden_parts)]

    def loss(self, batch: Any) -> Loss:
        """Each rank's loss is the mean over its equal share of the window's tokens, so DDP's
        gradient average is the gradient of the global mean."""
        x, y, hidden = batch
        loss, hidden = self.train_model(x, y, hidden, self.generator)
        self._carried.append(tuple(h.detach() for h in hidden))
        # f-lm backpropagates the token-mean loss times the BPTT length (model.loss_times_steps):
        # the gradient magnitudes that the paper's "loss scale 128" rests on
        grad_factor = x.shape[0] if self.cfg.model.loss_times_steps else 1
        # samples = tokens, so samples/s is words per second, the usual LM throughput figure
        return Loss(loss, samples=y.numel(), grad_factor=grad_factor)

    def step_options(self, optimizer: str) -> dict[str, Any]:
        o = self.cfg.optim
        return {
            "clip_grad_norm": o.grad_clip,
            "clip_only": o.grad_clip_params,  # f-lm clips the LSTM's gradients only
            # f-lm: x the per-GPU batch size
            "grad_multipliers": {r"^embedding\.": self.cfg.model.embedding_grad_scale},
        }

    def train_step(self, batch: Any) -> StepResult:
        """The shared step; the micro-batches' new states, joined, carry into the next window."""
        self._carried = []
        result = super().train_step(batch)
        self.hidden = tuple(torch.cat(parts, dim=1) for parts in zip(*self._carried))
        return result

    def eval_batches(self) -> Iterator[Any]:
        """The validation windows in text order (none when there are more processes than
        validation streams); the state carries from one to the next."""
        if self.eval_streams.size(1) == 0:
            return iter(())
        self._eval_hidden = self.model.init_hidden(self.eval_streams.size(1), self.device)
        self._key_weights = key_weights(self.seq_len, self.device)
        return bptt_batches(self.eval_streams, self.seq_len)

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Per block (this window of one validation stream): the full-softmax cross-entropy
        summed over its tokens, computed this many rows at a time (a 793K-word vocabulary needs
        no (seq_len x batch) x 793K logits at once), its tokens, and a key hashing its target
        words (two runs scored the same text only where the keys agree). The ranks' blocks of
        streams joined are the one-process blocks."""
        x, y = batch
        features, self._eval_hidden = self.model(x, self._eval_hidden)
        chunk_rows = max(1, EVAL_LOGIT_ELEMENTS // len(self.corpus.vocab))
        losses = self.model.full_loss(features, y, reduction="none", chunk_rows=chunk_rows)
        return {
            "loss": losses.sum(0),  # (streams,): each block's summed token loss
            "tokens": [y.shape[0]] * y.shape[1],
            "key": block_key(y, self._key_weights),
        }

    def state_dict(self) -> dict:
        hidden = None if self.hidden is None else [h.cpu() for h in self.hidden]
        return {"hidden": hidden, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("hidden") is not None:
            self.hidden = tuple(h.to(self.device) for h in state["hidden"])
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])

    def describe_data(self) -> dict:
        c, d = self.corpus, self.cfg.data
        return {
            "name": d.name,
            "root": None if c.embedded else str(c.root),
            "description": (
                "embedded: King James Bible, Genesis + Exodus (mpt_repro/data/embedded/README.md)"
            )
            if c.embedded
            else f"word-level corpus at {c.root}",
            "vocab_size": len(c.vocab),
            "train_tokens": int(self.train_tokens),  # all ranks' streams together
            "valid_tokens": int(self.valid_tokens),
            "valid_unk_rate": round(c.unk_rate("valid"), 4),
            "seq_len": self.seq_len,
            "streams": self.global_streams,
            "streams_per_process": self.train_streams.size(1),
        }

    def describe_model(self) -> dict:
        m = self.cfg.model
        return {
            **super().describe_model(),
            "embed_dim": m.embed_dim,
            "hidden_size": m.hidden_size,
            "proj_size": m.proj_size,
            "num_layers": m.num_layers,
            "softmax": f"sampled ({m.num_sampled} candidates)" if m.num_sampled > 0 else "full",
        }
