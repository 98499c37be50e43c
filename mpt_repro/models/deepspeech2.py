"""DeepSpeech 2 (Amodei et al. 2016, arXiv 1512.02595), the network of the paper's §4.3 speech runs.

The English model of DS2 as Table 3 of the mixed-precision paper trained it (about 115 M
parameters): a log spectrogram, 2 two-dimensional convolutions over frequency and time (32
channels, 41x11 with stride 2x2, then 21x11 with stride 2x1; DS2 Table 4), 3 recurrent layers of
2560 unidirectional GRU cells with DS2's sequence-wise batch normalisation (§3.2), a row
("lookahead") convolution over the next 80 frames (DS2 §3.7), a fully connected layer and a
softmax over characters for CTC. Activations are DS2's clipped ReLU, min(max(x, 0), 20).

The sizes come from conf/model/deepspeech2.yaml; docs/experiments_speech.md says which of them
DS2 prints and which are assumed (the hidden fully connected layer's width is the one that
brings the count to DS2's "about 115 M").

Recurrent batch norm (model.rnn_norm; docs/experiments_speech.md measures the three):

- `projected` (the default): DS2 §3.2's sequence-wise normalisation, h_t = f(B(W h^{l-1}_t) +
  U h_{t-1}): the batch norm acts on the input projection W h of every GRU layer (its three gates),
  not on h itself, so W carries no bias (B's shift is one). DS2 is where the paper's speech numbers
  came from (Baidu's DS2 code, not deepspeech.pytorch). cuDNN's GRU cannot take a pre-projected
  input, so this layer runs its recurrence as a loop over frames: slower than `input` on a GPU.
- `input`: deepspeech.pytorch's layout (SeanNaren/deepspeech.pytorch model.py, BatchRNN): the
  batch norm acts on h before the GRU's own input projection, and the first GRU has none.
- `input_all`: as `input`, on the first GRU too (the suite's layout before issue 49).

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

# model.rnn_norm: where the recurrent layers' batch norm acts (the module docstring)
RNN_NORMS = ("projected", "input", "input_all")
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


class InputNormGRU(nn.Module):
    """A cuDNN GRU, with the sequence-wise batch norm of its input h before the GRU's own input
    projection when `norm` (deepspeech.pytorch's BatchRNN)."""

    def __init__(self, input_size: int, hidden_size: int, bidirectional: bool, norm: bool):
        super().__init__()
        self.norm = SequenceBatchNorm(input_size) if norm else None
        self.gru = nn.GRU(input_size, hidden_size, bidirectional=bidirectional)
        self.input_size, self.hidden_size, self.bidirectional = (
            input_size,
            hidden_size,
            bidirectional,
        )

    def forward(self, packed: Any) -> Any:
        return self.gru(self.norm(packed) if self.norm is not None else packed)[0]


class ProjectedNormGRU(nn.Module):
    """A GRU layer with DS2 §3.2's normalisation: the input projection W h of all three gates (and
    both directions) is computed for every valid frame at once, batch-normalised over them, and
    the recurrence adds U h_{t-1} + b frame by frame (PyTorch's gate order r, z, n; reset applied
    to U h + b, as cuDNN and DS2's GRU do)."""

    def __init__(self, input_size: int, hidden_size: int, bidirectional: bool):
        super().__init__()
        directions = 2 if bidirectional else 1
        gates = 3 * hidden_size
        self.projection = nn.Linear(input_size, gates * directions, bias=False)  # B shifts
        self.norm = nn.BatchNorm1d(gates * directions)
        bound = hidden_size**-0.5  # nn.GRU's initialisation
        self.weight_hh = nn.Parameter(torch.empty(directions, gates, hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(directions, gates))
        nn.init.uniform_(self.weight_hh, -bound, bound)
        nn.init.uniform_(self.bias_hh, -bound, bound)
        self.input_size, self.hidden_size, self.bidirectional = (
            input_size,
            hidden_size,
            bidirectional,
        )

    def forward(self, packed: Any) -> Any:
        gates = packed._replace(data=self.norm(self.projection(packed.data)))
        x, lengths = pad_packed_sequence(gates)  # (T, B, 3H x directions), zeros past the end
        valid = torch.arange(x.shape[0], device=x.device)[:, None] < lengths.to(x.device)[None]
        outputs = [self._direction(x[..., : x.shape[-1] // len(self.weight_hh)], valid, 0)]
        if self.bidirectional:
            backward = _reversed_within(x[..., x.shape[-1] // 2 :], lengths)
            outputs.append(_reversed_within(self._direction(backward, valid, 1), lengths))
        h = torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]
        return pack_padded_sequence(h, lengths, enforce_sorted=False)

    def _direction(self, gates: torch.Tensor, valid: torch.Tensor, d: int) -> torch.Tensor:
        """The recurrence over (T, B, 3H) normalised input gates; a state stops at its end."""
        h = gates.new_zeros(gates.shape[1], self.hidden_size)
        out = []
        for t in range(gates.shape[0]):
            x_r, x_z, x_n = gates[t].chunk(3, dim=-1)
            h_r, h_z, h_n = F.linear(h, self.weight_hh[d], self.bias_hh[d]).chunk(3, dim=-1)
            r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
            new = (1 - z) * torch.tanh(x_n + r * h_n) + z * h
            h = torch.where(valid[t, :, None], new, h)
            out.append(h * valid[t, :, None].to(h.dtype))
        return torch.stack(out)


def _reversed_within(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(T, B, ...) with each utterance's valid frames in reverse order (padding stays put)."""
    t = torch.arange(x.shape[0])[:, None]
    index = torch.where(t < lengths[None], lengths[None] - 1 - t, t).to(x.device)
    return x.gather(0, index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x))


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
        rnn_norm: str = "projected",
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
        self.rnns = nn.ModuleList(
            ProjectedNormGRU(n, hidden_size, bidirectional)
            if rnn_norm == "projected"
            else InputNormGRU(n, hidden_size, bidirectional, i > 0 or rnn_norm == "input_all")
            for i, n in enumerate(sizes)
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
        for rnn in self.rnns:
            packed = pack_padded_sequence(h, host_lengths, enforce_sorted=False)
            h, _ = pad_packed_sequence(rnn(packed), total_length=t)
        if self.lookahead is not None:
            h = _clipped_relu(self.lookahead(h))
        if self.fc is not None:
            h = _clipped_relu(self.fc(h))
        return self.classifier(h), host_lengths


SHAPE_KEYS = (
    "conv_channels",
    "hidden_size",
    "num_layers",
    "bidirectional",
    "lookahead",
    "fc_size",
    "rnn_norm",
)


@register_model("deepspeech2")
def deepspeech2(cfg: Any, vocab_size: int, **_: Any) -> DeepSpeech2:
    shape = {key: cfg[key] for key in SHAPE_KEYS}  # model.* as the constructor names them
    bins = spectrogram_bins(cfg.sample_rate, cfg.window_ms)
    return DeepSpeech2(bins=bins, vocab_size=vocab_size, **shape)
