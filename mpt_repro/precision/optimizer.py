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

What a step launches besides the model and the optimizer's own kernel (issue 36), for a fused
optimizer and a scaler: the unscale-and-check kernel (into the journal's zeroed flag, journal.py),
the per-layer largest gradient magnitudes of the first-non-finite diagnosis (``_foreach_norm`` and
one ``stack`` into the journal's row), the step's skip signal (``found == 0``) and the scaler's
update. The skipped-step count and where the first and last non-finite gradients were are folded
from the journal on the host when read; without a scaler and a guard a step cannot skip and
launches nothing of its own.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mpt_repro.distributed import all_reduce_
from mpt_repro.fsdp import local
from mpt_repro.precision.compiled import compile_region
from mpt_repro.precision.converters import StepHook
from mpt_repro.precision.guard import StateGuard, needs_guard
from mpt_repro.precision.journal import Journal
from mpt_repro.precision.master import MasterWeights
from mpt_repro.precision.scalers import LossScaler


class ScaleGroup:
    """Several optimizers sharing one scale (GradScaler semantics with one scaler for a GAN's two
    losses): every loss of an iteration uses the same scale; it moves once all have stepped.

    ``exclusive``: the group will never have more than one member (one scale per optimizer, the
    default): that optimizer writes its step's records into the scaler's own journal, and its
    overflow flag is the scaler's. A shared group's members keep journals of their own and the
    group combines their flags into the scaler's (one op per member)."""

    def __init__(self, scaler: LossScaler, exclusive: bool = False):
        self.scaler, self.exclusive, self.members, self._reported = scaler, exclusive, 0, 0

    def report(self, found_inf: Tensor) -> None:
        slot = self.scaler.journal.slot("found")
        if found_inf is not slot:  # a shared scale: the members' flags, combined
            if self._reported == 0:
                slot.copy_(found_inf.reshape(()))
            else:
                torch.maximum(slot, found_inf.reshape(()), out=slot)
        self._reported += 1
        if self._reported == self.members:
            self.scaler.update(slot)
            self._reported = 0


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
        compile_mode: str | None = None,
    ):
        self.name, self.optimizer, self.names = name, optimizer, names
        self.model_params, self.master, self.scale_group = model_params, master, scale_group
        self.params = master.opt_params if master else model_params  # what the optimizer updates
        # fsdp2: the parameters are this rank's shards (DTensors); each rank checks its own
        self.sharded = any(hasattr(p, "to_local") for p in self.params)
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
        self._never_skipped = torch.ones((), dtype=torch.bool, device=device)  # no scaler, guard
        # folded from the journal on the host: skipped steps, and the first/last parameter
        # (index into names) whose gradient (or, with the guard, whose update) was inf/NaN
        self._skipped = 0
        # consecutive steps skipped or undone, up to the last: without a scaler nothing changes
        # from one step to the next, so a streak that long is a run that can apply no step
        self._skip_streak = 0
        self._first_bad, self._first_bad_step = -1, -1
        self._last_bad, self._last_bad_nan, self._last_bad_state = -1, False, False
        self.journal = self._journal(device)
        if self.fused and isinstance(optimizer, torch.optim.SGD):
            _zero_momentum_buffers(optimizer)
        # the step's device regions, compiled with trainer.compile (compile_mode: torch.compile's
        # mode; fullgraph: a graph break would be an error, not a silent split)
        self._prepare, self._finish = self._prepare_eager, self._finish_eager
        if compile_mode is not None:
            self._prepare = compile_region(self._prepare_eager, compile_mode)
            self._finish = compile_region(self._finish_eager, compile_mode)

    def _journal(self, device: torch.device) -> Journal | None:
        """Where each step leaves its overflow flag, its gradients' magnitudes and the guard's
        verdict (journal.py): the scaler's own journal when this optimizer has the scale to
        itself, else one of its own; None when a step can never skip."""
        if self.scaler is None and self.guard is None:
            return None
        if self.scale_group is not None and self.scale_group.exclusive:
            journal = self.scaler.journal
        else:
            journal = Journal(device)
            journal.add_column("found")
        if self.scaler is not None:
            journal.add_column("norms", len(self.params))
        if self.guard is not None:
            journal.add_column("grads_found")  # the flag before the guard's verdict
            journal.add_column("guard")  # the parameter whose update went non-finite, or -1
        journal.readers.append(self._read)
        return journal

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
        by another loss's backward, e.g. the GAN generator's pass through the discriminator).
        The FP32 master gradients stay allocated: the next step copies into them."""
        if self.master is None:
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.master.zero_grad()

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
        gradients before clipping (f-lm scales the embedding's gradients).

        The host decides what the step works on (which gradients exist, the journal's row); the
        device work runs in two regions (``_prepare``: master gradients, unscale and check, the
        diagnosis, multipliers and clipping; ``_finish``: the weights from the masters and the
        skip signal) around the optimizer's own kernel, compiled when the policy compiles the
        step (trainer.compile)."""
        self.steps += 1
        self.host_stepped = None
        pairs = self.master.pending_grads() if self.master is not None else ([], [])
        present = [i for i, p in enumerate(self.params) if p.grad is not None]
        grads = [local(self.params[i].grad) for i in present]  # a shard's: unscaled in place
        found = self.journal.slot("found") if self.journal is not None else None
        row = None
        if self.scaler is not None and grads:
            row = self.journal.slot("norms")
            if len(present) != len(self.params):  # some parameters have no gradient this step
                row = row[: len(present)]
        multiplied = self._multiplied(present, grad_multipliers)
        clipped = self._clipped(present, clip_grad_norm, clip_only)
        self._prepare(pairs, grads, found, row, multiplied, clipped, clip_grad_norm)
        if row is not None:  # every rank must skip or step together (no-op alone)
            all_reduce_(found, "max")
            if self.sharded:  # the largest magnitude over every shard (Gloo's MAX drops NaN)
                all_reduce_(torch.nan_to_num_(row, nan=float("inf")), "max")
        found = self._update(present, found)
        for hook in self.hooks:  # e.g. emulated FP8's FP16 master copy: idempotent after a skip
            hook.after_step(self.params)
        stepped = self._finish(found)  # after a skipped step: the same weights again
        if found is None:  # no scaler, no guard: nothing can skip
            return self._never_skipped
        self.journal.note(opt_step=self.steps, present=self._present_key(present))
        if self.scale_group is not None:
            self.scale_group.report(found)  # an exclusive scaler commits the shared row
            if self.scale_group.members == 1 and self.scaler.host_overflow is not None:
                self.host_stepped = not self.scaler.host_overflow  # read by the scaler (adaptive)
        if self.scaler is None or not self.scale_group.exclusive:
            self.journal.commit()
        return stepped

    def _present_key(self, present: list[int]) -> tuple[int, ...] | None:
        """The journal's note of which gradients the step had (None: all of them)."""
        return None if len(present) == len(self.params) else tuple(present)

    def _multiplied(
        self, present: list[int], grad_multipliers: dict[str, float] | None
    ) -> list[tuple[list[Tensor], float]]:
        """(grads, factor) for each grad multiplier that applies this step (host: names)."""
        out = []
        for pattern, factor in (grad_multipliers or {}).items():
            chosen = [self.params[i].grad for i in present if re.search(pattern, self.names[i])]
            if chosen and factor != 1.0:
                out.append((chosen, factor))
        return out

    def _clipped(
        self, present: list[int], clip_grad_norm: float | None, clip_only: str | None
    ) -> list[Tensor]:
        """The parameters whose gradients' norm is clipped this step (host: names)."""
        if clip_grad_norm is None:
            return []
        return [
            self.params[i]
            for i in present
            if clip_only is None or re.search(clip_only, self.names[i])
        ]

    def _prepare_eager(
        self,
        pairs: tuple[list[Tensor], list[Tensor]],
        grads: list[Tensor],
        found: Tensor | None,
        row: Tensor | None,
        multiplied: list[tuple[list[Tensor], float]],
        clipped: list[Tensor],
        clip_grad_norm: float | None,
    ) -> None:
        """The device work before the optimizer's kernel: the model's gradients into the FP32
        masters' (exact), unscaled in place with the overflow check into ``found``, each
        gradient's largest magnitude into the journal's ``row`` (inf or NaN exactly when the
        gradient holds one: the first-non-finite diagnosis, located when the journal is read),
        then the multipliers and the clip (unscaled gradients: a clip threshold means the same
        under every preset)."""
        dst, src = pairs
        if dst:
            torch._foreach_copy_(dst, src)  # FP16 -> FP32 is exact
        if row is not None:
            self.scaler.unscale_(grads, found)
            torch.stack(torch._foreach_norm(grads, float("inf")), out=row)
        for chosen, factor in multiplied:
            torch._foreach_mul_(chosen, factor)
        if clipped:
            torch.nn.utils.clip_grad_norm_(clipped, clip_grad_norm)

    def _finish_eager(self, found: Tensor | None) -> Tensor | None:
        """The device work after the optimizer's kernel: the model's weights refreshed from the
        masters (rounded), and the skip signal."""
        if self.master is not None:
            self.master.masters_to_model()
        return None if found is None else torch.eq(found, 0)

    def _update(self, present: list[int], found_inf: Tensor | None) -> Tensor | None:
        """Step the torch optimizer or skip it; the overflow flag, with the guard's verdict."""
        guard = self.guard
        if guard is not None:
            guard.save([self.params[i] for i in present], found_inf.device)
        if self.fused and found_inf is not None:
            self.optimizer.grad_scale, self.optimizer.found_inf = None, found_inf
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
        self.journal.slot("grads_found").copy_(found_inf)
        undo, bad_param = guard.undo_if_nonfinite(found_inf)
        torch.maximum(found_inf, undo.reshape(()), out=found_inf)  # the step's verdict
        self.journal.slot("guard").copy_(bad_param)
        if not self.fused:  # the guard read its verdict on the host: the schedule may use it
            self.host_stepped = not guard.undone
        if guard.undone:  # known on the host only without a fused kernel
            self._drop_grads()
        return found_inf

    def _drop_grads(self) -> None:
        for p in self.params:  # an overflowing gradient must not reach the next step
            p.grad = None

    # -- the bookkeeping, folded on the host -----------------------------------------------------
    def _read(self, columns: dict[str, np.ndarray], notes: list[dict[str, Any]]) -> None:
        """The journal's rows since the last read, in order: skipped steps, and the first and the
        last non-finite gradient (or, with the guard, update)."""
        norms = columns.get("norms")
        for i, note in enumerate(notes):
            if "opt_step" not in note:
                continue
            skipped = bool(columns["found"][i] > 0)
            self._skipped += int(skipped)
            self._skip_streak = self._skip_streak + 1 if skipped else 0
            step, present = note["opt_step"], note["present"]
            if norms is not None:
                row = norms[i][: len(present) if present is not None else len(self.params)]
                bad = ~np.isfinite(row)
                if bad.any():
                    k = int(np.argmax(bad))
                    self._note_bad(present[k] if present is not None else k, step)
                    self._last_bad_nan = bool(np.isnan(row[k]))
            if "guard" in columns:
                self._note_guard(int(columns["guard"][i]), columns["grads_found"][i] > 0, step)

    def _note_bad(self, param: int, step: int) -> None:
        if self._first_bad < 0:
            self._first_bad, self._first_bad_step = param, step
        self._last_bad = param

    def _note_guard(self, param: int, gradients_bad: bool, step: int) -> None:
        """A step the guard undid although no gradient was found non-finite: the parameter whose
        FP16 weight or optimizer state would have become inf/NaN (without a scaler nobody looks
        at the gradients, so the cause may be one)."""
        hit = param >= 0 and not gradients_bad
        if hit:
            self._note_bad(param, step)
            self._last_bad_nan = False
        self._last_bad_state = hit or (self._last_bad_state and not gradients_bad)

    # -- host reads: log rows and the run record -----------------------------------------------
    def _folded(self) -> None:
        if self.journal is not None:
            self.journal.read()

    @property
    def skipped(self) -> int:
        self._folded()
        return self._skipped

    @property
    def skip_streak(self) -> int:
        """Steps skipped or undone in a row up to the last one (a host read)."""
        self._folded()
        return self._skip_streak

    def nonfinite(self) -> dict:
        """The first and the last parameter whose gradient held inf/NaN (host reads)."""
        self._folded()
        first, step, last = self._first_bad, self._first_bad_step, self._last_bad
        return {
            "first_nonfinite_layer": self.names[first] if first >= 0 else None,
            "first_nonfinite_step": step if step >= 0 else None,
            "last_nonfinite_layer": self.names[last] if last >= 0 else None,
            "last_nonfinite_kind": self._last_kind() if last >= 0 else None,
        }

    def _last_kind(self) -> str:
        if self._last_bad_state:
            return "update"  # the FP16 weight or optimizer state after the step (guard.py)
        return "nan" if self._last_bad_nan else "inf"

    # -- checkpoints ---------------------------------------------------------------------------
    _DEVICE_STATE = (
        "_skipped",
        "_skip_streak",
        "_first_bad",
        "_first_bad_step",
        "_last_bad",
        "_last_bad_nan",
        "_last_bad_state",
    )

    def state_dict(self) -> dict:
        self._folded()
        return {
            "optimizer": self.optimizer.state_dict(),
            "masters": self.master.state_dict() if self.master is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "steps": self.steps,
            **{hook.key: hook.state_dict() for hook in self.hooks},
            # (kept on the device before issue 36: the name stays, for older checkpoints)
            "device_state": {k: getattr(self, k) for k in self._DEVICE_STATE},
        }

    def load_state_dict(self, sd: dict) -> None:
        self._folded()  # rows of the steps before the load: folded, then replaced
        if sd["optimizer"] is not None:  # fsdp2: the sharded checkpoint holds it (trainer.py)
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
            setattr(self, k, type(getattr(self, k))(v))


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
