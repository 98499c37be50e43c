"""DeepSpeech 2 (Amodei et al. 2016, arXiv 1512.02595), the network of the paper's §4.3 speech runs.

The English model of DS2 as Table 3 of the mixed-precision paper trained it (about 115 M
parameters): a log spectrogram, 2 two-dimensional convolutions over frequency and time (32
channels, 41x11 with stride 2x2, then 21x11 with stride 2x1; DS2 Table 4), 3 recurrent layers of
2560 unidirectional GRU cells with sequence-wise batch normalisation of their inputs (DS2 §3.2),
a row ("lookahead") convolution over the next 80 frames (DS2 §3.7), a fully connected layer and a
softmax over characters for CTC. Activations are DS2's clipped ReLU, min(max(x, 0), 20).

The sizes come from conf/model/deepspeech2.yaml; docs/experiments_speech.md says which of them
DS2 prints and which are assumed (the hidden fully connected layer's width is the one that
brings the count to DS2's "about 115 M").

Padding: utterances of a batch differ in length. Frames past an utterance's end are zeroed after
each convolution, the GRUs run on packed sequences (padding never enters the recurrence or the
recurrent batch norm), and the row convolution sees zeros past the end, as if the utterance were
followed by silence features of zero.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from mpt_repro.models import register_model

CLIP = 20.0  # DS2's clipped ReLU ceiling

# (kernel, stride, padding) of the two convolutions, each as (frequency, time): DS2 Table 4's
# "2-layer 2D" row; the padding keeps the time axis at ceil(T / 2)
CONVS = (((41, 11), (2, 2), (20, 5)), ((21, 11), (2, 1), (10, 5)))


def spectrogram_bins(sample_rate: int, window_ms: float) -> int:
    """Frequency bins of a one-sided STFT whose FFT is one window long."""
    return window_samples(sample_rate, window_ms) // 2 + 1


def window_samples(sample_rate: int, ms: float) -> int:
    return int(round(sample_rate * ms / 1000))


def conv_out(size: torch.Tensor | int, kernel: int, stride: int, padding: int) -> Any:
    """Output length of a convolution along one axis (tensor or int)."""
    return (size + 2 * padding - kernel) // stride + 1


def _clipped_relu(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(0.0, CLIP)


class SequenceBatchNorm(nn.Module):
    """DS2's sequence-wise batch norm: statistics over every valid frame of every utterance in the
    mini-batch (the packed sequence's data holds exactly those frames)."""

    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.BatchNorm1d(features)

    def forward(self, packed: Any) -> Any:
        return packed._replace(data=self.norm(packed.data))


class Lookahead(nn.Module):
    """DS2's row convolution: each feature at frame t is a learned per-feature weighting of frames
    t .. t + future (depthwise, no bias), so a unidirectional model sees a little of the future."""

    def __init__(self, features: int, future: int):
        super().__init__()
        self.future = future
        self.weight = nn.Parameter(torch.empty(features, 1, future + 1))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # nn.Conv1d's default

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, B, H)
        h = F.pad(x.permute(1, 2, 0), (0, self.future))  # zeros past the end: (B, H, T + future)
        return F.conv1d(h, self.weight, groups=h.shape[1]).permute(2, 0, 1)


class DeepSpeech2(nn.Module):
    """Spectrogram batch (B, 1, bins, T) and frame counts (host) -> logits (T', B, vocab) and T'
    per utterance (host: what CTC and decoding take)."""

    def __init__(
        self,
        bins: int,
        vocab_size: int,
        conv_channels: int,
        hidden_size: int,
        num_layers: int,
        bidirectional: bool,
        lookahead: int,
        fc_size: int,
    ):
        super().__init__()
        convs, norms, channels, height = [], [], 1, bins
        for kernel, stride, padding in CONVS:
            # no bias: the batch norm right after it has its own shift
            convs.append(nn.Conv2d(channels, conv_channels, kernel, stride, padding, bias=False))
            norms.append(nn.BatchNorm2d(conv_channels))
            channels, height = conv_channels, conv_out(height, kernel[0], stride[0], padding[0])
        self.convs, self.conv_norms = nn.ModuleList(convs), nn.ModuleList(norms)
        directions = 2 if bidirectional else 1
        sizes = [channels * height] + [hidden_size * directions] * (num_layers - 1)
        self.rnn_norms = nn.ModuleList(SequenceBatchNorm(n) for n in sizes)
        self.rnns = nn.ModuleList(
            nn.GRU(n, hidden_size, bidirectional=bidirectional) for n in sizes
        )
        out = hidden_size * directions
        # a bidirectional model already sees the future: DS2 uses the row convolution only
        # with unidirectional layers
        self.lookahead = Lookahead(out, lookahead) if lookahead > 0 and not bidirectional else None
        self.fc = nn.Linear(out, fc_size) if fc_size > 0 else None
        self.classifier = nn.Linear(fc_size or out, vocab_size)

    def output_lengths(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames per utterance after the convolutions (their time strides)."""
        for kernel, stride, padding in CONVS:
            frames = conv_out(frames, kernel[1], stride[1], padding[1])
        return frames

    def forward(self, x: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`frames`: each utterance's spectrogram frames, on the host (packing reads them there;
        the masks use a copy on x's device, sent once without waiting)."""
        lengths = frames.to(x.device, non_blocking=True)
        for conv, norm, (kernel, stride, padding) in zip(self.convs, self.conv_norms, CONVS):
            x = _clipped_relu(norm(conv(x)))
            lengths = conv_out(lengths, kernel[1], stride[1], padding[1])
            # zero past each utterance's end, so the next layer sees the same input whatever
            # the longest utterance of the batch
            valid = torch.arange(x.shape[-1], device=x.device) < lengths[:, None]
            x = x * valid[:, None, None, :].to(x.dtype)
        b, c, f, t = x.shape
        h = x.reshape(b, c * f, t).permute(2, 0, 1)  # (T, B, features)
        host_lengths = self.output_lengths(frames)  # the same numbers, computed on the host
        for norm, rnn in zip(self.rnn_norms, self.rnns):
            packed = pack_padded_sequence(h, host_lengths, enforce_sorted=False)
            h, _ = pad_packed_sequence(rnn(norm(packed))[0], total_length=t)
        if self.lookahead is not None:
            h = _clipped_relu(self.lookahead(h))
        if self.fc is not None:
            h = _clipped_relu(self.fc(h))
        return self.classifier(h), host_lengths


SHAPE_KEYS = ("conv_channels", "hidden_size", "num_layers", "bidirectional", "lookahead", "fc_size")


@register_model("deepspeech2")
def deepspeech2(cfg: Any, vocab_size: int, **_: Any) -> DeepSpeech2:
    shape = {key: cfg[key] for key in SHAPE_KEYS}  # model.* as the constructor names them
    bins = spectrogram_bins(cfg.sample_rate, cfg.window_ms)
    return DeepSpeech2(bins=bins, vocab_size=vocab_size, **shape)
