"""An exponential moving average of the parameters, evaluated instead of the raw weights.

Inception v3 (Szegedy et al. 2016, TF-slim's train_image_classifier: moving_average_decay) and
the big LSTM language model (f-lm: 0.999) report the average, not the last weights. The average
is kept in FP32 under every preset: with an FP16 average, (1 - decay) * change would round away
for most updates, the same loss the paper's FP32 master copy exists to avoid (§3.1). It follows
the optimizer's own parameters (the FP32 masters when there are masters), skips the steps the
optimizer skipped (on the device: no sync), and is part of the checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from mpt_repro.precision.optimizer import PrecisionOptimizer


class ParameterEMA:
    def __init__(self, model: nn.Module, optimizer: PrecisionOptimizer, decay: float):
        self.decay = decay
        self.sources = optimizer.params  # what the optimizer updates (FP32 masters if any)
        by_name = dict(model.named_parameters())
        self.targets = [by_name[n] for n in optimizer.names]  # the model's own tensors
        self.shadow = [p.detach().float().clone() for p in self.sources]

    @torch.no_grad()
    def update(self, stepped: Tensor) -> None:
        """shadow += (1 - decay) * (param - shadow), only when the optimizer stepped."""
        weight = (1.0 - self.decay) * stepped.to(self.shadow[0].device, torch.float32)
        sources = [p if p.dtype == torch.float32 else p.float() for p in self.sources]
        torch._foreach_lerp_(self.shadow, sources, weight)

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block (rounded to its storage dtype),
        its own weights again after it."""
        saved = [p.detach().clone() for p in self.targets]
        torch._foreach_copy_(self.targets, self.shadow)
        try:
            yield
        finally:
            torch._foreach_copy_(self.targets, saved)

    def state_dict(self) -> list[Tensor]:
        return [s.clone() for s in self.shadow]

    @torch.no_grad()
    def load_state_dict(self, shadow: list[Tensor]) -> None:
        torch._foreach_copy_(self.shadow, [s.to(self.shadow[0].device) for s in shadow])
