"""Speech recognition (the paper's Table 3): DeepSpeech 2 and LibriSpeech."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from mpt_repro.registry import TaskReport, metric, option_schema, task
from mpt_repro.schema import LOADER, DataSchema, ModelSchema, require

task(
    "speech",
    "mpt_repro.tasks.speech:Speech",
    # its runs are Table 3's, beside the paper's rows
    TaskReport(
        "Speech recognition",
        "speech",
        view="paper",
        paper_table="mpt_repro.experiments._speech_tables:table3",
        paper_reference=(
            "table3",
            "Paper Table 3: speech recognition CER as printed (the paper's own data)",
        ),
    ),
)
# what its metrics are (mpt_repro/tasks/speech.py): error rates in percent of the reference's
# characters and words, as the paper's Table 3 prints CER
metric("loss", higher_is_better=False)  # CTC loss
metric("cer", "%", higher_is_better=False)
metric("wer", "%", higher_is_better=False)


@option_schema("model", "deepspeech2")
@dataclass
class DeepSpeech2(ModelSchema):
    """DeepSpeech 2 (models/deepspeech2.py) and its log-spectrogram front end: the window fixes
    the number of frequency bins, hence the first recurrent layer's input size."""

    sample_rate: int = 16000  # Hz; the audio must be at this rate
    window_ms: float = 20.0  # STFT window (= FFT length)
    hop_ms: float = 10.0  # STFT hop
    conv_channels: int = 32
    hidden_size: int = 2560  # GRU cells per layer (per direction)
    num_layers: int = 3
    bidirectional: bool = False
    lookahead: int = 80  # future frames of the row convolution; 0: none
    fc_size: int = 2560  # the hidden fully connected layer; 0: none
    # where the GRUs' batch norm acts: projected (DS2 §3.2, B(W h)), input (deepspeech.pytorch:
    # B(h), the first GRU without), input_all (B(h) on every GRU); models/deepspeech2.py
    rnn_norm: str = "projected"

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        for key in ("sample_rate", "window_ms", "hop_ms", "conv_channels", "hidden_size"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")
        require(m.num_layers > 0, "model.num_layers", m.num_layers, "must be positive")
        for key in ("lookahead", "fc_size"):
            require(m[key] >= 0, f"model.{key}", m[key], "must be >= 0")
        norms = ("projected", "input", "input_all")  # models/deepspeech2.py's RNN_NORMS
        require(m.rnn_norm in norms, "model.rnn_norm", m.rnn_norm, f"must be one of {norms}")


@option_schema("data", "librispeech")
@dataclass
class LibriSpeech(DataSchema):
    """LibriSpeech as its tarballs unpack (mpt_repro/data/speech.py); sizes count utterances."""

    reads: ClassVar = ("root", *LOADER)
    needs_root: ClassVar = True

    train_splits: list[str] = field(default_factory=lambda: ["train-clean-100"])
    eval_split: str = "dev-clean"
    max_seconds: float | None = None  # training utterances longer than this are left out
    sorta_grad: bool = True  # first epoch shortest first (DS2 §3.3)

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(bool(d.train_splits), "data.train_splits", d.train_splits, "must name a split")
        require(
            d.max_seconds is None or d.max_seconds > 0,
            "data.max_seconds",
            d.max_seconds,
            "must be positive or null",
        )
