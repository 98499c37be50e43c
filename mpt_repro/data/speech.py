"""Speech data for the DeepSpeech 2 task: characters, log spectrograms, LibriSpeech, random audio,
and SortaGrad batching.

LibriSpeech (Panayotov et al. 2015, https://www.openslr.org/12) as its tarballs unpack:

    LibriSpeech/<split>/<speaker>/<chapter>/<speaker>-<chapter>-<utterance>.flac
    LibriSpeech/<split>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt

each line of a .trans.txt being `<speaker>-<chapter>-<utterance> TRANSCRIPT` in capitals.
data.root may name the LibriSpeech folder or the folder holding it. The audio is read with
soundfile (libsndfile) and must be at the model's sample rate (16 kHz for LibriSpeech).

Features (DS2 §3 and deepspeech.pytorch's loader): a Hamming-windowed STFT with a 20 ms window
and a 10 ms hop computed with torch.stft (FFT length = window, so 161 bins at 16 kHz), log(1 +
magnitude), normalised per utterance to zero mean and unit variance. They are computed in the
loader (workers when data.num_workers > 0), one utterance at a time.

SortaGrad (DS2 §3.3): batches hold utterances of similar length (consecutive in the order of
increasing duration, which also keeps padding small); the first epoch goes through them shortest
first, later epochs in a random order fixed by (seed, epoch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from mpt_repro.data import data_root
from mpt_repro.data.sampling import EpochSampler
from mpt_repro.errors import DataError
from mpt_repro.models.deepspeech2 import window_samples
from mpt_repro.safeio import read_bytes

# CTC's blank first, then what English transcripts are written in (DS2's English alphabet)
BLANK = "_"
ALPHABET = BLANK + " '" + "abcdefghijklmnopqrstuvwxyz"
FOLDER = "LibriSpeech"
LAYOUT = (
    f"{FOLDER}/<split>/<speaker>/<chapter>/ holding <speaker>-<chapter>-<utterance>.flac files and "
    "<speaker>-<chapter>.trans.txt, as the LibriSpeech tarballs (https://www.openslr.org/12) unpack"
)


# -- characters ------------------------------------------------------------------------------------
def encode(text: str) -> list[int]:
    """A transcript as character indices (lower-cased; characters outside the alphabet, such as
    digits, are dropped: LibriSpeech transcripts have none)."""
    return [ALPHABET.index(c) for c in text.lower() if c in ALPHABET and c != BLANK]


def decode(indices: list[int]) -> str:
    return "".join(ALPHABET[i] for i in indices)


def has_reference(text: str) -> bool:
    """Whether a transcript keeps a letter once encoded: CER and WER compare a decode against
    that reference, and one of spaces alone (or nothing) has no character or word to score."""
    return bool(decode(encode(text)).strip())


def frames_needed(indices: list[int]) -> int:
    """The fewest output frames CTC can align a transcript to: one per character, plus one blank
    between each pair of equal neighbours ("ll" needs l, blank, l)."""
    return len(indices) + sum(a == b for a, b in zip(indices, indices[1:]))


def ctc_infeasible(
    output_lengths: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """Per utterance of a batch (CTC's 1-D targets, host tensors): True where its output frames
    are fewer than frames_needed, so that ctc_loss is infinite (zero_infinity makes it 0: the
    utterance teaches, or scores, nothing)."""
    owner = torch.repeat_interleave(torch.arange(len(target_lengths)), target_lengths)
    doubled = (targets[1:] == targets[:-1]) & (owner[1:] == owner[:-1])
    repeats = torch.zeros(len(target_lengths), dtype=torch.long)
    repeats.index_add_(0, owner[1:], doubled.long())
    return output_lengths.cpu() < target_lengths + repeats


def greedy_decode(logits: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    """Best-path CTC decoding of (T, B, vocab) logits: the most likely symbol per frame, repeats
    merged, blanks removed."""
    best = logits.argmax(-1).T.cpu()  # (B, T)
    texts = []
    for row, n in zip(best.tolist(), lengths.tolist()):
        kept, previous = [], None
        for symbol in row[:n]:
            if symbol != previous and symbol != 0:
                kept.append(symbol)
            previous = symbol
        texts.append(decode(kept))
    return texts


# -- features --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Features:
    sample_rate: int = 16000
    window_ms: float = 20.0
    hop_ms: float = 10.0

    @property
    def window(self) -> int:
        return window_samples(self.sample_rate, self.window_ms)

    @property
    def hop(self) -> int:
        return window_samples(self.sample_rate, self.hop_ms)

    def frames(self, samples: int) -> int:
        """Spectrogram frames of an utterance of `samples` samples (torch.stft, center=True)."""
        return 1 + samples // self.hop

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        """(samples,) float audio -> (bins, frames) normalised log spectrogram."""
        spec = torch.stft(
            audio.float(),
            n_fft=self.window,
            hop_length=self.hop,
            win_length=self.window,
            window=torch.hamming_window(self.window),
            center=True,
            return_complex=True,
        ).abs()
        spec = torch.log1p(spec)
        return (spec - spec.mean()) / (spec.std() + 1e-5)


def features_of(model_cfg: Any) -> Features:
    return Features(model_cfg.sample_rate, model_cfg.window_ms, model_cfg.hop_ms)


# -- data sets -------------------------------------------------------------------------------------
@dataclass
class Utterance:
    audio: Path | None  # None: synthetic
    text: str
    samples: int  # duration in samples (sorting, SortaGrad)


class SpeechSet(Dataset):
    """Utterances -> (spectrogram (bins, frames), character indices)."""

    def __init__(self, utterances: list[Utterance], features: Features, seed: int = 0):
        self.utterances, self.features, self.seed = utterances, features, seed

    def __len__(self) -> int:
        return len(self.utterances)

    def lengths(self) -> list[int]:
        return [u.samples for u in self.utterances]

    def audio(self, index: int) -> torch.Tensor:
        u = self.utterances[index]
        if u.audio is None:  # random noise, the same for an index in every run
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            return torch.randn(u.samples, generator=g) * 0.1
        return read_audio(u.audio, self.features.sample_rate)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, list[int]]:
        return self.features(self.audio(index)), encode(self.utterances[index].text)


def read_audio(path: Path, sample_rate: int) -> torch.Tensor:
    import soundfile

    try:
        audio, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # not audio, cut short: name the file
        raise DataError(f"{path}: cannot read it as audio ({type(e).__name__}: {e})") from None
    check_rate(path, rate, sample_rate)
    bad = ~np.isfinite(audio).all(axis=1)
    if bad.any():  # a data fault, not a numerics divergence of the run (float WAV can hold NaN)
        raise DataError(
            f"{path}: {int(bad.sum())} of its {len(audio)} samples are NaN or infinite (the first "
            f"at sample {int(bad.argmax())}); replace the file (a run would record it as a "
            "numerics divergence)"
        )
    return torch.from_numpy(audio.mean(axis=1))  # mono


def check_rate(path: Path, rate: int, sample_rate: int) -> None:
    if rate != sample_rate:
        raise DataError(
            f"{path}: sampled at {rate} Hz, the model's features expect {sample_rate} Hz "
            "(model.sample_rate); resample the data set or set model.sample_rate"
        )


def collate(batch: list[tuple[torch.Tensor, list[int]]]) -> dict[str, torch.Tensor]:
    """Spectrograms zero-padded to the longest: x (B, 1, bins, T), frames (B,), the targets
    concatenated (CTC's 1-D form) and their lengths."""
    specs, texts = zip(*batch)
    lengths = [s.shape[1] for s in specs]
    frames = torch.tensor(lengths)
    x = torch.zeros(len(specs), 1, specs[0].shape[0], max(lengths))
    for i, s in enumerate(specs):
        x[i, 0, :, : s.shape[1]] = s
    targets = torch.tensor([c for t in texts for c in t], dtype=torch.long)
    return {
        "x": x,
        "frames": frames,
        "targets": targets,
        "target_lengths": torch.tensor([len(t) for t in texts]),
    }


def _transcript_lines(listing: Path) -> list[str]:
    """The lines of a .trans.txt, read as UTF-8 whatever the locale; a byte that is not UTF-8 is
    refused naming the file and the line (LibriSpeech's transcripts are ASCII capitals)."""
    raw = read_bytes(listing)  # a FIFO is refused, never waited on
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(
            f"{listing}: line {line} is not UTF-8 text (byte 0x{raw[e.start]:02x}); LibriSpeech "
            "transcripts are `<id> TRANSCRIPT` in ASCII capitals: fix that line or unpack the "
            "tarball again"
        ) from None


# -- LibriSpeech -----------------------------------------------------------------------------------
def find_folder(root: str | None) -> Path:
    """The LibriSpeech folder: data.root itself or the LibriSpeech folder under it."""
    path = data_root(root, "librispeech", f"the folder of {LAYOUT}")
    return path / FOLDER if (path / FOLDER).is_dir() else path


def read_split(folder: Path, split: str, sample_rate: int) -> list[Utterance]:
    """Every utterance of one split (e.g. train-clean-100), in file order."""
    import soundfile

    base = folder / split
    if not base.is_dir():
        found = sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise DataError(
            f"{folder}: no split {split!r} (found: {', '.join(found) or 'nothing'}); expected "
            f"{LAYOUT}"
        )
    utterances = []
    for listing in sorted(base.glob("*/*/*.trans.txt")):
        for line in _transcript_lines(listing):
            if not line.strip():
                continue
            key, _, text = line.partition(" ")
            audio = listing.parent / f"{key}.flac"
            if not audio.is_file():
                raise DataError(f"{listing}: lists {key} but {audio.name} is missing; {LAYOUT}")
            try:
                info = soundfile.info(str(audio))
            except Exception as e:
                raise DataError(f"{audio}: not a readable FLAC file ({e})") from None
            check_rate(audio, info.samplerate, sample_rate)
            utterances.append(Utterance(audio, text.strip(), info.frames))
    if not utterances:
        raise DataError(
            f"{base}: no <speaker>/<chapter>/*.trans.txt transcripts; expected {LAYOUT}"
        )
    return utterances


@dataclass
class SpeechData:
    train: SpeechSet
    eval: SpeechSet
    description: str
    # where each split comes from and the settings that choose it, for messages
    sources: dict[str, str] = field(default_factory=dict)
    # evaluation utterances left out before scoring, by reason (run.json evaluation.dropped)
    eval_dropped: dict[str, int] = field(default_factory=dict)


def build_speech_data(d: Any, features: Features, seed: int) -> SpeechData:
    """data.name librispeech (the folder) or synthetic (random audio and transcripts).
    Evaluation utterances whose transcript has no letter once encoded are left out and counted;
    an evaluation (or a training set) with none that has one is refused here."""
    if d.name == "synthetic":
        train = synthetic_utterances(d.synthetic_train_size, features, seed=1)
        evaluated = synthetic_utterances(d.synthetic_eval_size, features, seed=2)
        description = "synthetic: random noise audio (1-2 s) with random transcripts"
        sources = {"train": "the synthetic training utterances", "eval": "the synthetic ones"}
    elif d.name == "librispeech":
        folder = find_folder(d.root)
        train = [u for s in d.train_splits for u in read_split(folder, s, features.sample_rate)]
        evaluated = read_split(folder, d.eval_split, features.sample_rate)
        if d.max_seconds is not None:  # DS2 and deepspeech.pytorch leave out the longest
            read = len(train)
            train = [u for u in train if u.samples <= d.max_seconds * features.sample_rate]
            if not train:
                raise DataError(
                    f"{folder}: all {read} utterances of data.train_splits are longer than "
                    f"data.max_seconds={d.max_seconds}; raise it (or set it to null)"
                )
        description = f"LibriSpeech at {folder}: {'+'.join(d.train_splits)} / {d.eval_split}"
        sources = {
            "train": f"{folder}/{'+'.join(d.train_splits)} (data.train_splits)",
            "eval": f"{folder / d.eval_split} (data.eval_split)",
        }
    else:
        raise DataError(f"the speech task reads data=librispeech or data=synthetic, not {d.name!r}")
    train, evaluated = train[: d.train_limit], evaluated[: d.eval_limit]
    _refuse_without_references(train, sources["train"], d.train_limit, "data.train_limit", "learn")
    _refuse_without_references(evaluated, sources["eval"], d.eval_limit, "data.eval_limit", "score")
    scored = [u for u in evaluated if has_reference(u.text)]
    # evaluation in order of length: batches of similar lengths, little padding
    scored = sorted(scored, key=lambda u: u.samples)
    return SpeechData(
        SpeechSet(train, features, seed=1),
        SpeechSet(scored, features, seed=2),
        description,
        sources,
        {"empty_reference": len(evaluated) - len(scored)},
    )


def _refuse_without_references(
    utterances: list[Utterance], source: str, limit: int | None, key: str, to: str
) -> None:
    """No transcript with a letter once encoded: nothing to learn from, or nothing for CER and
    WER to score (they gave 0.00, a perfect score, on such a set)."""
    if any(has_reference(u.text) for u in utterances):
        return
    cut = f" (its first, {key}={limit})" if limit is not None and len(utterances) >= limit else ""
    raise DataError(
        f"{source}: none of its {len(utterances)} utterances{cut} has a transcript with a "
        f"letter once encoded (characters outside {ALPHABET[1:]!r}, such as digits, are "
        f"dropped), so there is nothing to {to}; check its *.trans.txt files (lines `<id> "
        "TRANSCRIPT`), or choose another split"
    )


def synthetic_utterances(n: int, features: Features, seed: int) -> list[Utterance]:
    """`n` utterances of 1 to 2 seconds, each with a random transcript of about 8 characters a
    second (fewer than the model's output frames, so CTC can align them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seconds = 1.0 + float(torch.rand((), generator=g))
        letters = torch.randint(2, len(ALPHABET), (max(1, math.floor(8 * seconds)),), generator=g)
        text = decode(letters.tolist()).strip() or "a"
        out.append(Utterance(None, text, int(seconds * features.sample_rate)))
    return out


# -- SortaGrad -------------------------------------------------------------------------------------
class SortaGradSampler(EpochSampler):
    """Batches of utterances of similar length (consecutive in the order of increasing length);
    the first epoch takes them shortest first when `sorted_first_epoch`, every other epoch in a
    random order fixed by (seed, epoch). Resume and rank sharding as EpochSampler: each rank takes
    its slice of every global batch."""

    def __init__(
        self, lengths: list[int], seed: int, batch_size: int, sorted_first_epoch: bool, **kw: Any
    ):
        super().__init__(len(lengths), seed, batch_size, **kw)
        self.by_length = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        self.sorted_first_epoch = sorted_first_epoch

    def batch_order(self) -> list[int]:
        n = self.batches_per_epoch()
        if self.epoch == 0 and self.sorted_first_epoch:
            return list(range(n))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def _order(self) -> list[int]:
        global_batch = self.batch_size * self.world_size
        mine = []
        for b in self.batch_order()[self.skip :]:
            start = b * global_batch + self.rank * self.batch_size
            mine.extend(self.by_length[start : start + self.batch_size])
        return mine

    def __iter__(self) -> Iterator[int]:
        return iter(self._order())
