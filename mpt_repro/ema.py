"""An exponential moving average of the parameters, evaluated instead of the raw weights.

Inception v3 (Szegedy et al. 2016; TF's inception_train.py: decay 0.9999 with num_updates, over
the trainable variables and the batch-norm moving statistics) and the big LSTM language model
(f-lm: 0.999 over the LSTM's variables) report the average, not the last weights. The average
is kept in FP32 under every preset: with an FP16 average, (1 - decay) * change would round away
for most updates, the same loss the paper's FP32 master copy exists to avoid (§3.1). It follows
the optimizer's own parameters (the FP32 masters when there are masters), skips the steps the
optimizer skipped (on the device: no sync), and is part of the checkpoint.

    optim.ema_decay    the decay (null: no average)
    optim.ema_warmup   TF's num_updates: decay_t = min(decay, (1 + t) / (10 + t)), t = updates
    optim.ema_params   a regex over parameter names (f-lm: "lstm\\."); null: every parameter and
                       every floating-point buffer (BN statistics), as TF's Inception v3
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from mpt_repro.precision.optimizer import PrecisionOptimizer


class ParameterEMA:
    def __init__(
        self,
        model: nn.Module,
        optimizer: PrecisionOptimizer,
        decay: float,
        warmup: bool = False,
        params: str | None = None,
    ):
        self.decay, self.warmup = decay, warmup
        by_name = dict(model.named_parameters())
        chosen = [
            (n, p)
            for n, p in optimizer.named_parameters()
            if params is None or re.search(params, n)
        ]
        # averaged from what the optimizer updates (FP32 masters if any), into the model's own
        self.sources = [p for _, p in chosen]
        self.targets = [by_name[n] for n, _ in chosen]
        if params is None:  # and the running statistics, from the model itself
            buffers = [b for b in model.buffers() if b.is_floating_point()]
            self.sources += buffers
            self.targets += buffers
        self.shadow = [p.detach().float().clone() for p in self.sources]
        device = self.shadow[0].device if self.shadow else torch.device("cpu")
        self.updates = torch.zeros((), dtype=torch.int64, device=device)
        # made once: a host-to-device copy each step could wait on the GPU
        self._decay = torch.tensor(decay, device=device)

    @torch.no_grad()
    def update(self, stepped: Tensor) -> None:
        """shadow += (1 - decay_t) * (value - shadow), only when the optimizer stepped."""
        if not self.shadow:
            return
        stepped = stepped.to(self.updates.device)
        decay = self._decay
        if self.warmup:
            t = self.updates.float()
            decay = torch.minimum(decay, (1 + t) / (10 + t))
        weight = (1.0 - decay) * stepped.float()
        sources = [p if p.dtype == torch.float32 else p.float() for p in self.sources]
        # one device weight per tensor: a tensor passed as the one weight (a Scalar) is read on
        # the host, a sync per step; per tensor it is the same lerp, launched once per tensor
        torch._foreach_lerp_(self.shadow, sources, [weight] * len(sources))
        self.updates += stepped.to(torch.int64)

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """The model holds the averages inside the block (rounded to its storage dtype), its
        own values again after it."""
        saved = [p.detach().clone() for p in self.targets]
        if self.targets:
            torch._foreach_copy_(self.targets, self.shadow)
        try:
            yield
        finally:
            if self.targets:
                torch._foreach_copy_(self.targets, saved)

    def state_dict(self) -> dict:
        return {"shadow": [s.clone() for s in self.shadow], "updates": int(self.updates)}

    @torch.no_grad()
    def load_state_dict(self, sd: dict) -> None:
        if self.shadow:
            torch._foreach_copy_(self.shadow, [s.to(self.shadow[0].device) for s in sd["shadow"]])
        self.updates.fill_(int(sd["updates"]))
