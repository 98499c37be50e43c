"""FP16 optimizer state without a master copy: a step that would write inf or NaN is undone.

Under ``no_master`` and ``fp16`` the optimizer updates the FP16 weights themselves, and torch keeps
its state in the parameters' dtype: SGD's momentum, Adam's two moments, RMSprop's mean square,
Adagrad's sum of squares are FP16 too. They can overflow (SGD's buffer reaches g / (1 - momentum),
so a steady gradient of 6,600 passes 65,504 at momentum 0.9) or underflow (Adam's second moment
(1 - beta2) g^2 is 0 in FP16 below |g| ~ 0.0055, and the update then divides by eps alone) while
every gradient is finite. The loss scaler looks only at the gradients, so such a step wrote
-inf or NaN into the weights and reported itself applied.

``StateGuard`` makes such a step an overflow like any other: it copies the weights and the state
before the step, checks both after it, and when any value is inf or NaN it puts the copies back.
The step then counts as skipped and the loss scale backs off (PrecisionOptimizer.step), so a run
that keeps producing them ends as ``Diverged`` at the scale's floor instead of training on NaN.

Two ways to put the copies back:

- on the device, for the fused optimizers (SGD, Adam, AdamW, rmsprop_tf), whose state all lives
  on the parameters' device: ``torch.where`` per tensor, no host read, so the step stays sync-free.
  Their state must exist before the first step, or a bad first step could not be undone without
  deleting it: ``prime`` runs the fused step once with the skip flag set, which creates the state
  exactly as a fresh optimizer does and changes nothing (torch's fused Adam takes the step count
  back; SGD's momentum buffers are created as zeros beforehand, see optimizer.py).
- on the host, for the others (Adagrad, RMSprop, ``optim.fused=false``), which keep their step
  counts on the CPU: one read of the flag (the one these optimizers already cost), then the
  saved state replaces the new one, the first step's lazily created state included.

Cost: a copy of the FP16 weights and state per step (two bytes a value: for SGD with momentum
four bytes a parameter, the size of the FP32 master copy that ``no_master`` leaves out), a check
of both, and on the device one ``where`` per tensor. Presets with a master copy (the FP32 state
of ``mixed``, ``amp``, ``fp32``) have no guard and are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mpt_repro.distributed import all_reduce_
from mpt_repro.fsdp import local


def needs_guard(params: Sequence[Tensor]) -> bool:
    """True when the optimizer would update FP16 tensors directly (no FP32 master copy)."""
    return any(p.dtype == torch.float16 for p in params)


class StateGuard:
    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[Tensor], on_device: bool):
        self.optimizer, self.on_device = optimizer, on_device
        self.index = {id(p): i for i, p in enumerate(params)}  # parameter -> its name's index
        self._primed: set[int] = set()
        self._params: list[Tensor] = []  # this step's (those with a gradient)
        self._flag_device = torch.device("cpu")
        self._tracked: list[Tensor] = []  # the params and their state before the step ...
        self._copies: list[Tensor] = []  # ... and their copies
        self._copy_key: tuple[int, ...] = ()
        self._owner = torch.zeros(0, dtype=torch.int64)
        self._owner_key: tuple[int, ...] = ()
        self._saved_state: dict[int, dict | None] = {}
        self.undone: bool = False  # the last step was undone (host variant only; on the device
        # the verdict stays a tensor)

    # -- before the step -------------------------------------------------------------------
    @torch.no_grad()
    def save(self, params: list[Tensor], flag_device: torch.device) -> None:
        """Copy ``params`` (those with a gradient this step) and their optimizer state."""
        if self.on_device:
            self._prime(params, flag_device)
        self._params, self._flag_device = params, flag_device
        tracked, _ = self._with_state(params)
        key = tuple(id(t) for t in tracked)
        if key != self._copy_key:  # the first step, or another set of gradients: new buffers
            self._copy_key, self._copies = key, [torch.empty_like(t) for t in tracked]
        self._tracked = tracked
        if tracked:
            torch._foreach_copy_(self._copies, tracked)
        if not self.on_device:  # the first step creates the state: remember which had none
            state = self.optimizer.state
            self._saved_state = {id(p): (dict(state[p]) if state.get(p) else None) for p in params}

    def _with_state(self, params: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The parameters and their floating-point state tensors, and which parameter (index
        into the optimizer's names) each belongs to, as a tensor on the flag's device."""
        state = self.optimizer.state
        tensors, owner = [], []
        for p in params:
            # fsdp2: this rank's shards (the undo is MAX-reduced over the ranks below)
            mine = [local(t) for t in [p, *(v for v in state.get(p, {}).values() if _is_float(v))]]
            tensors += mine
            owner += [self.index[id(p)]] * len(mine)
        key = tuple(id(t) for t in tensors)
        if key != self._owner_key:  # built once per set: no host-to-device copy per step
            self._owner_key = key
            self._owner = torch.tensor(owner, dtype=torch.int64, device=self._flag_device)
        return tensors, self._owner

    def _prime(self, params: list[Tensor], device: torch.device) -> None:
        """Let a fused optimizer create its state for parameters that have none yet, with the
        skip flag set: the state is what its first real step would have created, and nothing
        else changes."""
        fresh = [p for p in params if id(p) not in self._primed and not self.optimizer.state.get(p)]
        if not fresh:
            return
        opt = self.optimizer
        opt.grad_scale, opt.found_inf = None, torch.ones((), device=device)
        try:
            opt.step()
        finally:
            del opt.grad_scale, opt.found_inf
        self._primed.update(id(p) for p in fresh)

    # -- after the step --------------------------------------------------------------------
    @torch.no_grad()
    def undo_if_nonfinite(self, found_inf: Tensor) -> tuple[Tensor, Tensor]:
        """Check the weights and state written by the step; where any is inf/NaN, put the
        copies back. Returns (found_inf, or 1 where the step was undone; the parameter index
        of the first non-finite value, -1 if none), both on ``found_inf``'s device."""
        none = torch.full((), -1, dtype=torch.int64, device=found_inf.device)
        self.undone = False
        if not self._params:
            return found_inf, none
        # what the step wrote: the weights and the state, including state the step created
        written, owner = self._with_state(self._params)
        # the largest magnitude: inf or NaN exactly when the tensor holds one (an L2 norm in
        # FP16 would overflow on finite values)
        norms = torch._foreach_norm(written, float("inf"))
        bad = ~torch.isfinite(torch.stack([n.to(found_inf.device) for n in norms]))
        first = owner.index_select(0, torch.argmax(bad.to(torch.uint8)).reshape(1))
        undo = bad.any().reshape(1).float()
        all_reduce_(undo, "max")  # every rank keeps or undoes the step together
        undo = torch.maximum(undo, (found_inf > 0).float())
        if self.on_device:
            keep_copy = undo.reshape(()) > 0
            for t, copy in zip(self._tracked, self._copies):
                torch.where(keep_copy.to(t.device), copy, t, out=t)
            return undo, torch.where(bad.any(), first.reshape(()), none)
        self.undone = bool(undo)  # the one host read of a step without a fused kernel
        if self.undone:
            torch._foreach_copy_(self._tracked, self._copies)
            for p in self._params:
                saved = self._saved_state[id(p)]
                if saved is None:
                    self.optimizer.state.pop(p, None)  # as before its first step
                else:
                    self.optimizer.state[p] = saved
        first_bad = torch.where(bad.any(), first.reshape(()), none)
        return undo, first_bad


def _is_float(value: object) -> bool:
    return isinstance(value, Tensor) and value.is_floating_point()
