"""PrecisionOptimizer: one optimizer step under a precision recipe, with no host sync.

fairseq's shape (FP16Optimizer / MemoryEfficientFP16Optimizer): the task talks to one object
that owns the torch optimizer, the FP32 master weights and the loss scaler:

    opt.zero_grad()
    with policy.autocast():
        loss = loss_fn(model(policy.cast_inputs(x)), y)
    opt.backward(loss)                        # loss * scale, backward
    stepped = opt.step(clip_grad_norm=1.0)    # a 0-d bool tensor, still on the device

``step`` copies the grads to the masters, unscales them (before clipping, so a clip threshold
means the same under every preset), checks for inf/NaN, clips, updates, refreshes the FP16 weights
and moves the scale. The overflow flag never leaves the device: fused optimizers (SGD, Adam,
AdamW with ``fused=True``) take it as ``found_inf`` and skip the update inside their kernel, the
way torch.amp.GradScaler drives them; the scale moves with ``torch.where``. An optimizer without a
fused kernel, or a scaler that plans on the host (adaptive), costs one host read per step: that
is ``sync_free`` False, and the LR schedule then counts steps on the host.

Without a master copy (``no_master``, ``fp16``) the optimizer's own state is FP16 and can turn
finite gradients into inf/NaN weights; a StateGuard (guard.py) undoes such a step and it counts
as an overflow.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from mpt_repro.distributed import all_reduce_
from mpt_repro.precision.converters import StepHook
from mpt_repro.precision.guard import StateGuard, needs_guard
from mpt_repro.precision.master import MasterWeights
from mpt_repro.precision.scalers import LossScaler


class ScaleGroup:
    """Several optimizers sharing one scale (GradScaler semantics with one scaler for a GAN's two
    losses): every loss of an iteration uses the same scale; it moves once all have stepped."""

    def __init__(self, scaler: LossScaler):
        self.scaler, self.members, self._reported, self._found = scaler, 0, 0, None

    def report(self, found_inf: Tensor) -> None:
        self._found = found_inf if self._found is None else self._found + found_inf
        self._reported += 1
        if self._reported == self.members:
            self.scaler.update(self._found)
            self._reported, self._found = 0, None


class PrecisionOptimizer:
    def __init__(
        self,
        name: str,
        optimizer: torch.optim.Optimizer,
        names: list[str],
        model_params: list[Tensor],
        master: MasterWeights | None,
        scale_group: ScaleGroup | None,
        hooks: list[StepHook] | None = None,
    ):
        self.name, self.optimizer, self.names = name, optimizer, names
        self.model_params, self.master, self.scale_group = model_params, master, scale_group
        self.params = master.opt_params if master else model_params  # what the optimizer updates
        self.scaler = scale_group.scaler if scale_group else None
        # the model's converters' (e.g. emulated FP8's FP16 master rounding), run after each step
        self.hooks = list(hooks or [])
        # the fused kernels read found_inf on the device (torch.amp.GradScaler's protocol)
        self.fused = bool(optimizer.defaults.get("fused")) and getattr(
            optimizer, "_step_supports_amp_scaling", False
        )
        # FP16 weights updated directly: the optimizer's FP16 state needs the guard (guard.py)
        self.guard = (
            StateGuard(optimizer, self.params, on_device=self.fused)
            if needs_guard(self.params)
            else None
        )
        if self.guard is not None and not self.fused:
            self.sync_free = False  # the guard's verdict is read on the host
        else:
            self.sync_free = self.scaler is None or (self.fused and self.scaler.sync_free)
        self.steps = 0  # step() calls (host count: the host knows it called)
        # whether the last step was applied, where the host read it anyway (no fused kernel, or
        # a scaler that plans on the host), so that the LR schedule need not read it a second
        # time; None where it stayed on the device
        self.host_stepped: bool | None = None
        device = self.params[0].device if self.params else torch.device("cpu")
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)
        # consecutive steps skipped or undone, up to the last: without a scaler nothing changes
        # from one step to the next, so a streak that long is a run that can apply no step
        self._skip_streak = torch.zeros((), dtype=torch.int64, device=device)
        # first/last parameter (index into names) whose grad was inf/NaN, on the device
        self._first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self._first_bad_step = torch.full((), -1, dtype=torch.int64, device=device)
        self._last_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self._last_bad_nan = torch.zeros((), dtype=torch.bool, device=device)
        # the last one was in the update (an FP16 weight or optimizer state), caught by the guard
        self._last_bad_state = torch.zeros((), dtype=torch.bool, device=device)
        self._index_cache: dict[tuple[int, ...], Tensor] = {}
        if self.fused and isinstance(optimizer, torch.optim.SGD):
            _zero_momentum_buffers(optimizer)

    # -- what a torch optimizer offers ---------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(the model's parameter name, the tensor this optimizer updates: its FP32 master when
        there are masters), in model order."""
        return list(zip(self.names, self.params))

    @property
    def skips(self) -> str:
        """Whether and where a step may be skipped, for what counts applied updates (the LR
        schedule): "never" (no scaler, no guard), "on_device" (the skip signal stays on the
        device), or "on_host" (the step reads it on the host; `host_stepped` keeps what it read,
        None where that read did not happen)."""
        if self.scaler is None and self.guard is None:
            return "never"
        return "on_device" if self.sync_free else "on_host"

    @property
    def loss_scale(self) -> float:
        """The current scale (a host read: for log rows)."""
        return self.scaler.scale if self.scaler is not None else 1.0

    def zero_grad(self) -> None:
        """Drop the grads of the optimizer's params and, with masters, of the model's own (left
        by another loss's backward, e.g. the GAN generator's pass through the discriminator)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            for p in self.model_params:
                p.grad = None

    def backward(self, loss: Tensor, **kwargs) -> None:
        """Scale the loss (in FP32) and back-propagate."""
        (self.scaler.scale_loss(loss) if self.scaler is not None else loss).backward(**kwargs)

    # -- the step ------------------------------------------------------------------------------
    def step(
        self,
        clip_grad_norm: float | None = None,
        clip_only: str | None = None,
        grad_multipliers: dict[str, float] | None = None,
    ) -> Tensor:
        """Returns a 0-d bool tensor on the device: False when the update was skipped.

        clip_only: a regex; the norm is clipped over the parameters whose names match it (f-lm
        clips only the LSTM). grad_multipliers: {regex: factor}, applied to the unscaled
        gradients before clipping (f-lm scales the embedding's gradients)."""
        self.steps += 1
        self.host_stepped = None
        if self.master is not None:
            self.master.grads_to_masters()
        present = [i for i, p in enumerate(self.params) if p.grad is not None]
        found_inf = self._unscale(present)
        self._prepare_grads(present, clip_grad_norm, clip_only, grad_multipliers)
        found_inf = self._update(present, found_inf)
        for hook in self.hooks:  # e.g. emulated FP8's FP16 master copy: idempotent after a skip
            hook.after_step(self.params)
        if self.master is not None:
            self.master.masters_to_model()  # after a skipped step: the same values again
        self._skipped += (found_inf > 0).reshape(())
        self._skip_streak = (self._skip_streak + 1) * (found_inf > 0).reshape(())
        if self.scale_group is not None:
            self.scale_group.report(found_inf)
            if self.scale_group.members == 1 and self.scaler.host_overflow is not None:
                self.host_stepped = not self.scaler.host_overflow  # read by the scaler (adaptive)
        return (found_inf == 0).reshape(())

    def _unscale(self, present: list[int]) -> Tensor:
        """Unscale the present grads in place; the (1,) overflow flag, agreed by every rank."""
        grads = [self.params[i].grad for i in present]
        if self.scaler is None or not grads:
            return torch.zeros(1, device=self._skipped.device)
        found_inf = self.scaler.unscale_(grads)
        # every rank must skip or step together, or the replicas drift apart (no-op alone)
        all_reduce_(found_inf, "max")
        self._diagnose(present, grads)
        return found_inf

    def _prepare_grads(
        self,
        present: list[int],
        clip_grad_norm: float | None,
        clip_only: str | None,
        grad_multipliers: dict[str, float] | None,
    ) -> None:
        """The unscaled grads multiplied, then clipped (step's arguments)."""
        for pattern, factor in (grad_multipliers or {}).items():
            chosen = [self.params[i].grad for i in present if re.search(pattern, self.names[i])]
            if chosen and factor != 1.0:
                torch._foreach_mul_(chosen, factor)
        if clip_grad_norm is not None and present:
            chosen = [
                i for i in present if clip_only is None or re.search(clip_only, self.names[i])
            ]
            torch.nn.utils.clip_grad_norm_([self.params[i] for i in chosen], clip_grad_norm)

    def _update(self, present: list[int], found_inf: Tensor) -> Tensor:
        """Step the torch optimizer or skip it; the overflow flag, with the guard's verdict."""
        guard = self.guard
        if guard is not None:
            guard.save([self.params[i] for i in present], found_inf.device)
        if self.fused and (self.scaler is not None or guard is not None):
            self.optimizer.grad_scale, self.optimizer.found_inf = None, found_inf.reshape(())
            self.optimizer.step()  # the kernel leaves params and state alone when found_inf
            del self.optimizer.grad_scale, self.optimizer.found_inf
        elif self.scaler is None or guard is not None:
            self.optimizer.step()  # with the guard, tried even on an overflow: it undoes it
            self.host_stepped = True if guard is None else None  # the guard's verdict: below
        elif not bool(found_inf):  # no fused kernel: one host read decides
            self.host_stepped = True
            self.optimizer.step()
        else:
            self.host_stepped = False
            self._drop_grads()
        if guard is None:
            return found_inf
        gradients_bad = (found_inf > 0).reshape(())
        found_inf, bad_param = guard.undo_if_nonfinite(found_inf)
        self._note_state_overflow(bad_param, gradients_bad)
        if not self.fused:  # the guard read its verdict on the host: the schedule may use it
            self.host_stepped = not guard.undone
        if guard.undone:  # known on the host only without a fused kernel
            self._drop_grads()
        return found_inf

    def _drop_grads(self) -> None:
        for p in self.params:  # an overflowing gradient must not reach the next step
            p.grad = None

    def _note_state_overflow(self, param: Tensor, gradients_bad: Tensor) -> None:
        """Remember a step the guard undid although no gradient was found non-finite: the
        parameter whose FP16 weight or optimizer state would have become inf/NaN (on the
        device; without a scaler nobody looks at the gradients, so the cause may be one)."""
        hit = (param >= 0) & ~gradients_bad
        fresh = hit & (self._first_bad < 0)
        self._first_bad_step = torch.where(fresh, self.steps, self._first_bad_step)
        self._first_bad = torch.where(fresh, param, self._first_bad)
        self._last_bad = torch.where(hit, param, self._last_bad)
        self._last_bad_nan = torch.where(hit, False, self._last_bad_nan)
        self._last_bad_state = torch.where(hit, True, self._last_bad_state & ~gradients_bad)

    @torch.no_grad()
    def _diagnose(self, present: list[int], grads: list[Tensor]) -> None:
        """Remember which parameter (model order) held the first non-finite grad of this step,
        on the device: the inf-norm of each grad is inf or NaN exactly when it holds one."""
        key = tuple(present)
        index = self._index_cache.get(key)
        if index is None:  # built once per set of present grads: no per-step host-to-device copy
            index = self._index_cache[key] = torch.tensor(present, device=self._first_bad.device)
        norms = torch.stack([n.to(index.device) for n in torch._foreach_norm(grads, float("inf"))])
        bad = ~torch.isfinite(norms)
        # the first True (0 when none); index_select, since t[0-d tensor] reads it on the host
        first = torch.argmax(bad.to(torch.uint8)).reshape(1)
        hit = bad.any()
        param = index.index_select(0, first).reshape(())
        fresh = hit & (self._first_bad < 0)
        self._first_bad_step = torch.where(fresh, self.steps, self._first_bad_step)
        self._first_bad = torch.where(fresh, param, self._first_bad)
        self._last_bad = torch.where(hit, param, self._last_bad)
        self._last_bad_nan = torch.where(
            hit, torch.isnan(norms.index_select(0, first)).reshape(()), self._last_bad_nan
        )

    # -- host reads: log rows and the run record -----------------------------------------------
    @property
    def skipped(self) -> int:
        return int(self._skipped)

    @property
    def skip_streak(self) -> int:
        """Steps skipped or undone in a row up to the last one (a host read)."""
        return int(self._skip_streak)

    def nonfinite(self) -> dict:
        """The first and the last parameter whose gradient held inf/NaN (host reads)."""
        first, step, last = int(self._first_bad), int(self._first_bad_step), int(self._last_bad)
        return {
            "first_nonfinite_layer": self.names[first] if first >= 0 else None,
            "first_nonfinite_step": step if step >= 0 else None,
            "last_nonfinite_layer": self.names[last] if last >= 0 else None,
            "last_nonfinite_kind": self._last_kind() if last >= 0 else None,
        }

    def _last_kind(self) -> str:
        if bool(self._last_bad_state):
            return "update"  # the FP16 weight or optimizer state after the step (guard.py)
        return "nan" if bool(self._last_bad_nan) else "inf"

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "masters": self.master.state_dict() if self.master is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "steps": self.steps,
            **{hook.key: hook.state_dict() for hook in self.hooks},
            "device_state": {
                k: getattr(self, k).item()
                for k in (
                    "_skipped",
                    "_skip_streak",
                    "_first_bad",
                    "_first_bad_step",
                    "_last_bad",
                    "_last_bad_nan",
                    "_last_bad_state",
                )
            },
        }

    def load_state_dict(self, sd: dict) -> None:
        self.optimizer.load_state_dict(sd["optimizer"])
        if self.master is not None and sd.get("masters") is not None:
            self.master.load_state_dict(sd["masters"])
        if self.scaler is not None and sd.get("scaler") is not None:
            self.scaler.load_state_dict(sd["scaler"])
        self.steps = int(sd["steps"])
        for hook in self.hooks:
            if sd.get(hook.key) is not None:
                hook.load_state_dict(sd[hook.key])
        for k, v in sd["device_state"].items():  # _skip_streak is absent from older ones: 0
            getattr(self, k).fill_(v)


def _zero_momentum_buffers(optimizer: torch.optim.SGD) -> None:
    """Work around fused SGD's first step: it allocates its momentum buffers uninitialised and,
    when found_inf skips that step, keeps the garbage for the next one (torch 2.x; an overflow at
    step 1 is the usual start of dynamic scaling). Zero buffers give the same first update
    (0.9 * 0 + g = g) and survive a skip."""
    for group in optimizer.param_groups:
        if group["momentum"] == 0:
            continue
        if group.get("dampening", 0) != 0:
            raise ValueError(
                "fused SGD with dampening: no exact zero-buffer start; use fused=false"
            )
        for p in group["params"]:
            optimizer.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
