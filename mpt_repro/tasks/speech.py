"""Speech recognition (the paper's §4.3, Table 3): DeepSpeech 2 trained with CTC over characters;
character and word error rates from greedy decoding.

The CTC loss is computed in FP32 from float logits whatever the preset (autocast lists ctc_loss
as an FP32 op anyway; the explicit cast also covers presets that store activations in FP16), as
the mean over the batch's utterances of each utterance's summed negative log-likelihood (what
deepspeech.pytorch backpropagates per utterance). Utterances whose transcript cannot be aligned
to the output frames (a clip too short for its transcript) contribute zero (zero_infinity)
instead of an infinite loss: they are counted, in each split before training and over the run's
steps (run.json data.ctc_infeasible), left out of the evaluation loss and counted as dropped
(evaluation.dropped); a split, a training step or an evaluation with no utterance CTC can align
is refused (DataError).

CER and WER are jiwer's edit distances (characters; words split at spaces) per utterance, summed
over the evaluation set and divided by the reference's characters or words, in percent (the
paper's Table 3 prints CER in percent: 2.20 = 2.2 % of characters wrong): formulas over
per-utterance columns (mpt_repro/evidence.py), joined over ranks, so N processes report what
one does. Evaluation utterances whose transcript has no letter once encoded are left out while
the data loads and counted (mpt_repro/data/speech.py).
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
    SpeechSet,
    build_speech_data,
    collate,
    ctc_infeasible,
    decode,
    encode,
    features_of,
    frames_needed,
    greedy_decode,
)
from mpt_repro.errors import DataError
from mpt_repro.evidence import DROPPED_PREFIX, Evaluation, Ratio, text_key
from mpt_repro.optim import optimizer_factory
from mpt_repro.tasks.base import Loss, SampledTask, StepResult


def edit_counts(references: list[str], hypotheses: list[str]) -> dict[str, list[int]]:
    """Per utterance, jiwer's character and word edit distances (substitutions + deletions +
    insertions) and the reference lengths CER and WER divide their sums by. An utterance
    without a reference (none reaches evaluation: build_speech_data leaves them out) counts 0
    of each: jiwer refuses an empty reference."""
    import jiwer

    out: dict[str, list[int]] = {"char_errors": [], "chars": [], "word_errors": [], "words": []}
    for ref, hyp in zip(references, hypotheses, strict=True):
        if not ref.strip():
            for values in out.values():
                values.append(0)
            continue
        chars, words = jiwer.process_characters(ref, hyp), jiwer.process_words(ref, hyp)
        out["char_errors"].append(chars.substitutions + chars.deletions + chars.insertions)
        out["chars"].append(chars.substitutions + chars.deletions + chars.hits)
        out["word_errors"].append(words.substitutions + words.deletions + words.insertions)
        out["words"].append(words.substitutions + words.deletions + words.hits)
    return out


def unalignable(model: Any, data: SpeechSet, source: str) -> int | None:
    """How many utterances of `data` are too short for their transcripts: the model's output
    frames (model.output_lengths of the spectrogram's frames) fewer than frames_needed. All of
    them (of a non-empty set) is a DataError naming `source`. None for a model that does not
    say its output frames (a custom one): training and evaluation still count them."""
    if not hasattr(model, "output_lengths") or not len(data):
        return None
    frames = torch.tensor([data.features.frames(u.samples) for u in data.utterances])
    have = model.output_lengths(frames).tolist()
    short = sum(n < frames_needed(encode(u.text)) for n, u in zip(have, data.utterances))
    if short == len(data):
        raise DataError(
            f"{source}: every one of its {short} utterances is too short for its transcript "
            "(CTC needs an output frame per character, and one between doubled letters): "
            "every loss would be 0 and nothing learned or scored; check that the transcripts "
            "belong to the audio files and that the audio is at model.sample_rate"
        )
    return short


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


class Speech(SampledTask):
    primary_metric = "cer"
    metric_names = ["loss", "cer", "wer"]
    # evaluation by items (mpt_repro/evidence.py): the utterances; CER and WER are summed edits
    # over summed reference characters and words, the loss a mean over the utterances CTC can
    # align (a clip too short for its transcript has no loss: counted as dropped)
    item_unit = "utterances"
    item_key = "key"
    formulas = {
        "loss": Ratio("loss", "aligned", "utterances"),
        "cer": Ratio("char_errors", "chars", "characters", scale=100.0),
        "wer": Ratio("word_errors", "words", "words", scale=100.0),
    }

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d = cfg.data
        batch, global_batch = distributed.batch_sizes(cfg)
        self.data = build_speech_data(d, features_of(cfg.model), cfg.seed)
        model = self.new_model(vocab_size=len(ALPHABET))
        # clips too short for their transcripts, found before any step: all of a split is a
        # refusal, some are counted (run.json data.ctc_infeasible)
        self.infeasible = {
            split: unalignable(model, getattr(self.data, split), self.data.sources[split])
            for split in ("train", "eval")
        }
        self.model, self.optimizer, self.train_model = self.add_model(
            "model", model, optimizer_factory(cfg.optim, global_batch)
        )
        self.use_loaders(speech_loaders(self.data, d, batch, cfg.seed, device))
        # training utterances whose CTC loss was zeroed: this rank's since the last evaluation
        # (counted on the host from host tensors: no device read), and all ranks' before it
        self._infeasible_here, self.infeasible_trained = 0, 0
        self._step = [0, 0]  # this iteration's utterances, and how many of them were zeroed

    def _forward(self, model: Any, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (T', B, vocab) and output frames (on the host: packing needs them there)."""
        x = self.policy.cast_inputs(batch["x"].to(self.device, non_blocking=True))
        return model(x, batch["frames"])

    def _ctc(self, logits: torch.Tensor, lengths: torch.Tensor, batch: dict) -> torch.Tensor:
        """Each utterance's CTC loss (summed over its frames), in FP32; 0 for one that cannot
        be aligned (zero_infinity)."""
        log_probs = F.log_softmax(logits.float(), dim=-1)
        return F.ctc_loss(
            log_probs,
            batch["targets"].to(self.device, non_blocking=True),
            lengths,
            batch["target_lengths"],
            blank=0,
            reduction="none",
            zero_infinity=True,
        )

    def loss(self, batch: dict) -> Loss:
        logits, lengths = self._forward(self.train_model, batch)
        utterances = len(batch["frames"])
        with torch.profiler.record_function("host:ctc_feasibility"):  # host tensors only
            zeroed = int(ctc_infeasible(lengths, batch["targets"], batch["target_lengths"]).sum())
        self._step[0] += utterances
        self._step[1] += zeroed
        return Loss(self._ctc(logits, lengths, batch).sum() / utterances, samples=utterances)

    def train_step(self, batch: Any) -> StepResult:
        """The shared step; a step none of whose utterances CTC could align is refused (its
        loss was 0 by zero_infinity: it learned nothing, and every step of such data would)."""
        self._step = [0, 0]
        result = super().train_step(batch)
        seen, zeroed = self._step
        self._infeasible_here += zeroed
        if seen and zeroed == seen:
            known = self.infeasible["train"]  # None: the model does not say its output frames
            share = f"{known} of the {len(self.data.train)} training utterances are such clips"
            raise DataError(
                f"every utterance of a training step ({seen}, from {self.data.sources['train']}) "
                f"is too short for its transcript: CTC needs an output frame per character "
                f"(and one between doubled letters), so their loss was 0 and the step learned "
                f"nothing; {share if known is not None else 'such clips'}: leave them out (or "
                "shorten their transcripts), and check that the audio is at "
                f"model.sample_rate={self.sample_rate} Hz"
            )
        return result

    def eval_step(self, batch: dict) -> dict[str, Any]:
        """Per utterance: its CTC loss (0 where it cannot be aligned: `aligned` 0 and counted as
        dropped), the edit counts of its greedy decode, and a key hashing its reference."""
        logits, lengths = self._forward(self.model, batch)
        hypotheses = greedy_decode(logits, lengths)
        references, start = [], 0
        for n in batch["target_lengths"].tolist():
            references.append(decode(batch["targets"][start : start + n].tolist()))
            start += n
        unaligned = ctc_infeasible(lengths, batch["targets"], batch["target_lengths"])
        return {
            "loss": self._ctc(logits, lengths, batch),
            "aligned": ~unaligned,
            f"{DROPPED_PREFIX}ctc_infeasible": unaligned,
            "items": [1] * len(references),
            **edit_counts(references, hypotheses),
            "key": [text_key(r) for r in references],
        }

    def item_columns(self) -> list[str]:
        return sorted({*super().item_columns(), f"{DROPPED_PREFIX}ctc_infeasible", "items"})

    def eval_dropped(self) -> dict[str, int]:
        return dict(self.data.eval_dropped)

    def evaluate(self) -> Evaluation:
        """The shared evaluation; then the training utterances zeroed since the last one are
        summed over the ranks (every rank evaluates: a point where all of them meet). An
        evaluation none of whose utterances CTC could align fails the run."""
        found = super().evaluate()
        zeroed = distributed.reduce_sums({"zeroed": self._infeasible_here}, self.device)
        self.infeasible_trained += int(zeroed["zeroed"])
        self._infeasible_here = 0
        if found.items and found.dropped.get("ctc_infeasible") == found.items:
            raise DataError(
                f"every one of the {found.items} evaluation utterances of "
                f"{self.data.sources['eval']} is too short for its transcript: CTC cannot "
                "align any, so the loss has nothing to score; check that the transcripts "
                "belong to the audio, or choose another data.eval_split"
            )
        return found

    def state_dict(self) -> dict:
        # each rank's own (the trainer saves every rank's): this rank's count since the last
        # evaluation is summed over the ranks at the next one, also after a resume
        counts = {"all_ranks": self.infeasible_trained, "this_rank": self._infeasible_here}
        return {**super().state_dict(), "ctc_infeasible_trained": counts}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        counts = state.get("ctc_infeasible_trained") or {}
        self.infeasible_trained = int(counts.get("all_ranks", 0))
        self._infeasible_here = int(counts.get("this_rank", 0))

    def describe_data(self) -> dict:
        return {
            "name": self.cfg.data.name,
            "root": self.cfg.data.get("root"),
            "train_size": len(self.data.train),
            "eval_size": len(self.data.eval),
            "train_hours": round(sum(self.data.train.lengths()) / self.sample_rate / 3600, 3),
            # clips too short for their transcripts (CTC cannot align them; their loss is 0):
            # in each split, and the training utterances so zeroed over the run's steps
            "ctc_infeasible": {
                **self.infeasible,
                "trained": self.infeasible_trained + self._infeasible_here,
            },
            "eval_dropped": dict(self.data.eval_dropped),
            "description": self.data.description,
        }

    @property
    def sample_rate(self) -> int:
        return self.cfg.model.sample_rate

    def describe_model(self) -> dict:
        m = self.cfg.model
        keys = ("conv_channels", "hidden_size", "num_layers", "bidirectional", "lookahead")
        return {**super().describe_model(), **{k: m[k] for k in (*keys, "fc_size")}}
