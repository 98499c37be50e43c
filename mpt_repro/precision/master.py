"""FP32 master weights for a model stored in FP16/BF16 (paper §3.1).

The optimizer runs over FP32 copies of the low-precision parameters. Each step:
  1. ``grads_to_masters``: the model's low-precision grads are copied into the masters' FP32 .grad
     (and the model's grads dropped, so they cannot leak into the next step);
  2. the scaler unscales the master grads, the optimizer updates the masters in FP32;
  3. ``masters_to_model``: the model weights are refreshed by rounding the masters, with one
     multi-tensor copy, not a per-parameter Python loop.
Parameters that are already FP32 in the model (BatchNorm with bn_fp32) are their own master: the
optimizer gets the model tensor itself, as apex's FP16_Optimizer does.

The masters' FP32 gradient buffers are made once and kept between steps: ``zero_grad`` detaches
them from the masters (``.grad`` is None between steps, as after torch's ``zero_grad``) and each
step copies into them and attaches them again, so a step allocates nothing for them (before
issue 36 every step made them again with ``empty_like``, one allocation per FP16 parameter).
"""

from __future__ import annotations

import torch
from torch import Tensor


class MasterWeights:
    def __init__(self, params: list[Tensor]):
        self.model_params = list(params)
        # An FP32 param is used as is; a low-precision one gets a detached FP32 leaf copy.
        self.opt_params: list[Tensor] = []
        self._low: list[int] = []  # indices of the params that have a separate master
        self._grads: dict[int, Tensor] = {}  # index -> its master's FP32 gradient buffer
        for i, p in enumerate(self.model_params):
            if p.dtype == torch.float32:
                self.opt_params.append(p)
            else:
                self.opt_params.append(p.detach().clone().float().requires_grad_(True))
                self._low.append(i)

    @property
    def masters(self) -> list[Tensor]:
        """The separate FP32 copies only (what a checkpoint must hold besides the model)."""
        return [self.opt_params[i] for i in self._low]

    def zero_grad(self) -> None:
        """Before a step's backward: every gradient dropped, the model's and the optimizer's (the
        masters' FP32 buffers are kept aside for the next ``grads_to_masters``)."""
        for p, m in zip(self.model_params, self.opt_params):
            p.grad = None
            m.grad = None

    def pending_grads(self) -> tuple[list[Tensor], list[Tensor]]:
        """(the masters' FP32 gradient buffers, the model's low-precision gradients) to copy this
        step, the buffers attached as the masters' ``.grad`` and the model's gradients dropped
        (they cannot leak into the next step); a master whose parameter got no gradient gets
        none. Host work only: the copy is the caller's (``grads_to_masters`` or the step's
        compiled region)."""
        src, dst = [], []
        for i in self._low:
            p, m = self.model_params[i], self.opt_params[i]
            if p.grad is None:
                m.grad = None  # an unused parameter stays unused
                continue
            if m.grad is None:
                buffer = self._grads.get(i)
                if buffer is None:  # the first step only
                    buffer = self._grads[i] = torch.empty_like(m)
                m.grad = buffer
            src.append(p.grad)
            dst.append(m.grad)
            p.grad = None
        return dst, src

    @torch.no_grad()
    def grads_to_masters(self) -> None:
        dst, src = self.pending_grads()
        if src:
            torch._foreach_copy_(dst, src)  # FP16 -> FP32 is exact

    @torch.no_grad()
    def masters_to_model(self) -> None:
        if self._low:
            torch._foreach_copy_([self.model_params[i] for i in self._low], self.masters)  # rounds

    def state_dict(self) -> list[Tensor]:
        return [m.detach().clone() for m in self.masters]

    @torch.no_grad()
    def load_state_dict(self, masters: list[Tensor]) -> None:
        if len(masters) != len(self._low):
            raise ValueError(
                f"checkpoint holds {len(masters)} master weights, the model needs {len(self._low)}"
            )
        if not masters:  # every parameter FP32 (its own master; fsdp2's shards): nothing to load
            return
        # in place: the optimizer keeps pointing at the same tensors
        torch._foreach_copy_(self.masters, [m.to(self.masters[0].device) for m in masters])
        self.masters_to_model()
