"""Speech recognition (the paper's §4.3, Table 3): DeepSpeech 2 trained with CTC over characters;
character and word error rates from greedy decoding.

The CTC loss is computed in FP32 from float logits whatever the preset (autocast lists ctc_loss
as an FP32 op anyway; the explicit cast also covers presets that store activations in FP16), as
the mean over the batch's utterances of each utterance's summed negative log-likelihood (what
deepspeech.pytorch backpropagates per utterance). Utterances whose transcript cannot be aligned
to the output frames contribute zero (zero_infinity) instead of an infinite loss.

CER and WER are jiwer's edit distances (characters; words split at spaces) summed over the
evaluation set and divided by the reference's characters or words, in percent (the paper's
Table 3 prints CER in percent: 2.20 = 2.2 % of characters wrong). The sums are reduced over
ranks, so N processes report what one does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from mpt_repro import distributed
from mpt_repro.data.sampling import EpochLoaders
from mpt_repro.data.speech import (
    ALPHABET,
    SortaGradSampler,
    build_speech_data,
    collate,
    decode,
    features_of,
    greedy_decode,
)
from mpt_repro.optim import optimizer_factory
from mpt_repro.tasks.base import Loss, SampledTask, register_task


def edit_counts(references: list[str], hypotheses: list[str]) -> dict[str, int]:
    """Character and word edit distances (substitutions + deletions + insertions) with jiwer, and
    the reference lengths they are divided by."""
    import jiwer

    # jiwer refuses an empty reference; an utterance without characters adds nothing
    pairs = [(r, h) for r, h in zip(references, hypotheses) if r.strip()]
    if not pairs:
        return {"char_errors": 0, "chars": 0, "word_errors": 0, "words": 0}
    refs, hyps = [r for r, _ in pairs], [h for _, h in pairs]
    chars = jiwer.process_characters(refs, hyps)
    words = jiwer.process_words(refs, hyps)
    return {
        "char_errors": chars.substitutions + chars.deletions + chars.insertions,
        "chars": chars.substitutions + chars.deletions + chars.hits,
        "word_errors": words.substitutions + words.deletions + words.insertions,
        "words": words.substitutions + words.deletions + words.hits,
    }


def error_rates(totals: dict[str, float]) -> dict[str, float]:
    """CER and WER in percent from summed edit counts."""
    return {
        "cer": 100.0 * totals["char_errors"] / max(totals["chars"], 1),
        "wer": 100.0 * totals["word_errors"] / max(totals["words"], 1),
    }


def speech_loaders(data: Any, d: Any, batch: int, seed: int, device: torch.device) -> EpochLoaders:
    """Training in SortaGrad batches (each rank its slice of every global batch), evaluation on
    this rank's share of the utterances; padded batches from `collate`."""
    sampler = SortaGradSampler(
        data.train.lengths(),
        seed,
        batch,
        # data=synthetic has no sorta_grad key: SortaGrad is part of the recipe there too
        sorted_first_epoch=bool(d.get("sorta_grad", True)),
        rank=distributed.rank(),
        world_size=distributed.world_size(),
    )
    workers = dict(
        num_workers=d.num_workers,
        persistent_workers=d.num_workers > 0,
        collate_fn=collate,
        # pinned batches: the copies to the GPU (non_blocking) do not wait for it
        pin_memory=d.pin_memory and device.type == "cuda",
    )
    train = DataLoader(
        data.train,
        batch_size=batch,
        sampler=sampler,
        drop_last=True,
        generator=sampler.loader_generator,
        **workers,
    )
    shard = distributed.ShardSampler(len(data.eval))
    evaluated = DataLoader(
        data.eval, batch_size=d.eval_batch_size or batch, sampler=shard, **workers
    )
    return EpochLoaders(sampler, train, evaluated, shard)


@register_task("speech")
class Speech(SampledTask):
    primary_metric = "cer"
    higher_is_better = False
    metric_names = ["loss", "cer", "wer"]

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d = cfg.data
        batch, global_batch = distributed.batch_sizes(cfg)
        self.data = build_speech_data(d, features_of(cfg.model), cfg.seed)
        self.model, self.optimizer, self.train_model = self.add_model(
            "model",
            self.new_model(vocab_size=len(ALPHABET)),
            optimizer_factory(cfg.optim, global_batch),
        )
        self.use_loaders(speech_loaders(self.data, d, batch, cfg.seed, device))

    def _forward(self, model: Any, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (T', B, vocab) and output frames (on the host: packing needs them there)."""
        x = self.policy.cast_inputs(batch["x"].to(self.device, non_blocking=True))
        return model(x, batch["frames"])

    def _ctc(self, logits: torch.Tensor, lengths: torch.Tensor, batch: dict) -> torch.Tensor:
        """Summed CTC loss of the batch's utterances, in FP32."""
        log_probs = F.log_softmax(logits.float(), dim=-1)
        return F.ctc_loss(
            log_probs,
            batch["targets"].to(self.device, non_blocking=True),
            lengths,
            batch["target_lengths"],
            blank=0,
            reduction="sum",
            zero_infinity=True,
        )

    def loss(self, batch: dict) -> Loss:
        logits, lengths = self._forward(self.train_model, batch)
        utterances = len(batch["frames"])
        return Loss(self._ctc(logits, lengths, batch) / utterances, samples=utterances)

    def eval_totals(self) -> dict[str, Any]:
        return {"loss": 0.0, "utterances": 0, "char_errors": 0, "chars": 0, "word_errors": 0,
                "words": 0}  # fmt: skip

    def eval_step(self, batch: dict) -> dict[str, Any]:
        logits, lengths = self._forward(self.model, batch)
        hypotheses = greedy_decode(logits, lengths)
        references, start = [], 0
        for n in batch["target_lengths"].tolist():
            references.append(decode(batch["targets"][start : start + n].tolist()))
            start += n
        return {
            "loss": self._ctc(logits, lengths, batch),
            "utterances": len(references),
            **edit_counts(references, hypotheses),
        }

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        return {"loss": totals["loss"] / max(totals["utterances"], 1), **error_rates(totals)}

    def describe_data(self) -> dict:
        return {
            "name": self.cfg.data.name,
            "root": self.cfg.data.get("root"),
            "train_size": len(self.data.train),
            "eval_size": len(self.data.eval),
            "train_hours": round(sum(self.data.train.lengths()) / self.sample_rate / 3600, 3),
            "description": self.data.description,
        }

    @property
    def sample_rate(self) -> int:
        return self.cfg.model.sample_rate

    def describe_model(self) -> dict:
        m = self.cfg.model
        keys = ("conv_channels", "hidden_size", "num_layers", "bidirectional", "lookahead")
        return {**super().describe_model(), **{k: m[k] for k in (*keys, "fc_size")}}
