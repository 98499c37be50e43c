"""Loss scalers: small, plain, pluggable, and sync-free.

A scaler owns the scale and the counters that move it, all as tensors on the training device, so
that a step never waits for the GPU to say whether it overflowed (paper §3.2 skips such steps;
the optimizer's fused kernel reads the flag on the device). The precision optimizer drives it:

    found = scaler.journal.slot("found")   # this step's overflow flag (a 0-d float, zeroed)
    loss_scaled = scaler.scale_loss(loss); loss_scaled.backward()
    scaler.unscale_(grads, found)          # in place, FP16 or FP32 grads; found set on inf/NaN
    scaler.update(found)                   # moves the scale on the device: no host read

A step launches what torch.amp.GradScaler's would and little more: the reciprocal of the scale
(`reciprocal` in FP32, which rounds exactly as GradScaler's FP64 reciprocal rounded to FP32:
double rounding is innocuous for division when 53 >= 2 x 24 + 2, Figueroa 1995), the fused
unscale-and-check kernel, and for the dynamic scale GradScaler's own fused
`torch._amp_update_scale_` followed by one `clamp_` for the floor and the ceiling. What the scaler
keeps besides (the floor streak, the step it diverged at, the lowest and highest scale) is not
computed on the device at all: each step leaves its overflow flag and the scale it used in a row
of the scaler's `journal` (journal.py), and the bookkeeping is folded from those rows on the host
when someone reads it.

Host reads happen only when someone asks: ``scale``, ``summary()``, ``diverged_at()`` (log rows,
the run record). A scaler that needs the host every step (the layer-wise adaptive one) says so
with ``sync_free = False``.

With ``loss_scaling=none`` (FP32, BF16, the no-scaling ablations) no scaler exists at all: the
optimizer neither scales, nor inspects the grads, nor skips.

New kinds register with ``@register_scaler("name", reads=(...))`` and are picked by
``precision.loss_scaling`` (plugins.py lists the built-in ones); ``reads`` names the scaler knobs
of PrecisionConfig the kind reads (the base class reads ``init_scale`` through the policy, and
``min_scale`` as its floor): the command line may set those, and no other knob, for that kind.
A scaler knows no number format: a converter that raises the floor of the scale during training
(precision.fp8's rising floor) is one of its ``floor_sources``, which the policy sets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from mpt_repro import registry
from mpt_repro.precision.compiled import compile_region
from mpt_repro.precision.journal import Journal

# {kind: scaler class} registered so far: the registry's own dict (extension point "loss
# scaler"; precision/plugins.py looks a kind up, importing the module that registers it)
SCALERS: dict[str, type[LossScaler] | str] = registry.entries("loss scaler")


def register_scaler(
    kind: str, reads: Sequence[str] | None = None
) -> Callable[[type[LossScaler]], type[LossScaler]]:
    """Class decorator: make a scaler available as ``precision.loss_scaling=<kind>``. A kind
    another module registered is refused (ConfigError naming both modules).

    ``reads``: the scaler knobs of PrecisionConfig it reads (``init_scale``, ``min_scale``, ...,
    the fields marked ``scaler_knob``). A command line may set those for a run with this scaler;
    one it does not declare is refused as changing nothing, before torch loads. The suite's own
    write it as a literal tuple: the config check reads it from this source without importing
    the module (registry._package_reads)."""

    def wrap(cls: type[LossScaler]) -> type[LossScaler]:
        cls.kind = kind
        registry.register("loss scaler", kind, cls, cls.__module__)
        if reads is not None:
            registry.declare_reads("loss scaler", kind, reads, cls.__module__)
        return cls

    return wrap


def unscale_and_check_(
    grads: Sequence[Tensor], inv_scale: Tensor, found: Tensor, one: Tensor | None = None
) -> None:
    """Multiply every grad by ``inv_scale`` in place; set ``found`` (a one-element float tensor,
    zero on entry) to 1 if any grad holds inf or NaN.

    Uses the fused multi-tensor kernel behind GradScaler, grouped by (device, dtype); every group
    writes the same flag. Unlike GradScaler we accept FP16 grads (the no-master-copy ablation):
    the kernel computes in FP32 and rounds once. It checks each value *before* the multiply, so
    for FP16 grads, where a scale below 1 makes the multiply itself overflow (1/scale > 1), a
    second pass (by ``one``) checks the result: a non-finite value never reaches the weights
    unnoticed. Unscaled FP16 values below 2^-24 flush to zero: that is the no-master ablation's
    own loss, which is what it measures.
    """
    groups: dict[tuple, list[Tensor]] = defaultdict(list)
    for g in grads:
        groups[(g.device, g.dtype)].append(g)
    for (device, dtype), gs in groups.items():
        f = found if device == found.device else torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(gs, f, inv_scale.to(device))
        if dtype != torch.float32:
            ones = one if one is not None else torch.ones_like(inv_scale)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, f, ones.to(device))
        if f is not found:
            torch.maximum(found, f.to(found.device).reshape(found.shape), out=found)


class LossScaler:
    """Base class: the counters, and a scale that never moves.

    Subclasses say whether and how the scale moves (``moves``, ``_move``) and where its floor is
    (``_host_at_floor``). ``floor_count`` counts consecutive skipped steps taken at the floor (the
    optimizer counts the skipped steps themselves). When it reaches ``floor_patience`` the attempt
    number is kept in ``diverged_at`` and the trainer ends the run as diverged at its next log row.
    Both are folded on the host from the journal's rows (each update's overflow flag and the
    scale it started from), when read.
    """

    kind = "base"
    sync_free = True  # update() needs no host read
    moves = False  # the scale changes during training: each update journals the scale it used
    # a scaler that reads the overflow flag on the host (sync_free False) keeps what it read
    # at its last update here, so that nothing reads it again; None: it stayed on the device
    host_overflow: bool | None = None

    def __init__(self, cfg, init_scale: float | None, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.initial = float(init_scale if init_scale is not None else cfg.init_scale)
        self.steps = 0  # update() calls: host-side, the host knows how often it stepped
        dev = self.device
        # FP32 and of shape (1,) like GradScaler's, so that trajectories and unscaled grads match
        # it bit for bit and its fused update kernel takes them
        self._scale = torch.full((1,), self.initial, dtype=torch.float32, device=dev)
        self._scale0 = self._scale.view(())  # the same value, 0-d: what the loss is multiplied by
        self._inv = torch.reciprocal(self._scale)  # of a constant scale: once
        self._one = torch.ones(1, device=dev)
        self._growth_tracker = torch.zeros(1, dtype=torch.int32, device=dev)  # the kernel's
        self._hysteresis_left = torch.full((1,), float(getattr(cfg, "hysteresis", 1)), device=dev)
        # folded from the journal on the host (``_read``)
        self._floor_count = 0
        self._diverged_at: int | None = None  # attempt at which floor_count reached the patience
        self._min_seen = self._max_seen = self.initial
        # floors that rise with the step count (converters' scale_floor, set by the policy)
        self.floor_sources: list[Callable[[int], float | None]] = []
        self.journal = Journal(dev)
        self.journal.add_column("found")
        if self.moves:
            self.journal.add_column("scale")
        self.journal.readers.append(self._read)

    # -- hooks for layer-wise scalers ------------------------------------------------------
    def attach(self, model: nn.Module, names: list[str], params: list[Tensor]) -> None:
        """Called once per optimizer with its model and parameters. The global scalers need
        nothing; a layer-wise scaler registers its hooks here."""

    # -- the three calls per step ----------------------------------------------------------
    def scale_loss(self, loss: Tensor) -> Tensor:
        # FP32 before the multiply: an FP16 loss times 65536 would overflow by itself.
        return loss.float() * self._scale0.to(loss.device)

    def unscale_(self, grads: Sequence[Tensor], found: Tensor) -> None:
        """Unscale ``grads`` in place; set ``found`` (zero on entry) when inf/NaN was found."""
        if self.moves:  # GradScaler's FP64 reciprocal rounded to FP32, in one FP32 op (above)
            torch.reciprocal(self._scale, out=self._inv)
        unscale_and_check_(grads, self._inv, found, self._one)

    def update(self, found: Tensor) -> None:
        """Count the step and move the scale, on the device. ``found`` is normally this step's
        journal slot already (the optimizer unscaled into it); another tensor is copied there."""
        self.steps += 1
        slot = self.journal.slot("found")
        if found is not slot:
            slot.copy_(found.reshape(()))
        floor = self.floor()
        self.journal.note(attempt=self.steps, floor=floor, at_floor=self._host_at_floor())
        if (known := self._host_scale_now()) is not None:
            self.journal.note(scale=known)
        self._advance(slot, self.journal.slot("scale") if self.moves else None, floor)
        self.journal.commit()

    def compile(self, mode: str) -> None:
        """trainer.compile: the update's device work as one compiled region."""
        self._advance = compile_region(self._advance_eager, mode)

    def _advance(self, found: Tensor, scale_slot: Tensor | None, floor: float) -> None:
        self._advance_eager(found, scale_slot, floor)

    def _advance_eager(self, found: Tensor, scale_slot: Tensor | None, floor: float) -> None:
        """The update's device work: the scale it started from into the journal, then the
        move."""
        if scale_slot is not None:
            # compiled, a view made inside the region (a second tensor aliasing the scale would
            # hide the update's write from the compiler); eager, the view made once
            now = self._scale.view(()) if torch.compiler.is_compiling() else self._scale0
            scale_slot.copy_(now)
        self._move(found, floor, scale_slot)

    def _move(self, found: Tensor, floor: float, before: Tensor | None) -> None:
        pass

    def _host_scale_now(self) -> float | None:
        """The scale this update starts from, where the host set it (a layer-wise scaler's
        plan); None: the journal keeps it (``moves``) or it never changes."""
        return None

    def _host_at_floor(self) -> bool | None:
        """Whether this update starts at the floor, where the host knows it; None: decided from
        the journaled scale when read (scale <= floor)."""
        return None

    def floor(self) -> float:
        """The lowest scale now: precision.min_scale, or the highest floor a source raises it to
        at this step (precision.fp8's enhanced loss scaling, Mellempudi et al. 2019). Host
        arithmetic on the host's step count: no sync."""
        raised = [f for source in self.floor_sources if (f := source(self.steps)) is not None]
        return max(raised, default=self.cfg.min_scale)

    # -- the bookkeeping, folded on the host -----------------------------------------------
    def _read(self, columns: dict[str, np.ndarray], notes: list[dict[str, Any]]) -> None:
        """The journal's rows since the last read, in order: the floor streak, the step it
        diverged at, the lowest and highest scale."""
        found, scales = columns["found"], columns.get("scale")
        patience = self.cfg.floor_patience
        for i, note in enumerate(notes):
            if "attempt" not in note:
                continue  # not an update's row (none in practice)
            scale = float(scales[i]) if scales is not None else note.get("scale", self.initial)
            self._min_seen, self._max_seen = min(self._min_seen, scale), max(self._max_seen, scale)
            at_floor = note["at_floor"]
            if at_floor is None:
                at_floor = scale <= note["floor"]
            self._floor_count = self._floor_count + 1 if found[i] > 0 and at_floor else 0
            if self._diverged_at is None and self._floor_count >= patience:
                self._diverged_at = note["attempt"]

    # -- host reads (log rows, the run record) ---------------------------------------------
    @property
    def scale(self) -> float:
        return float(self._scale0)

    @property
    def floor_count(self) -> int:
        self.journal.read()
        return self._floor_count

    def diverged_at(self) -> int | None:
        """The attempt (1-based update() count) at which the scale had sat at its floor for
        ``floor_patience`` skipped steps in a row, or None."""
        self.journal.read()
        return self._diverged_at

    def describe(self, reason: str) -> str:
        """One phrase for the preset's description; ``reason`` says where the scale came from."""
        return f"{self.kind} loss scale {self.initial:g} ({reason})"

    def layer_scales(self) -> dict[str, float]:
        """{layer: its own scale} for layer-wise scalers; {} for one global scale."""
        return {}

    def diagnostics(self) -> dict:
        """Anything else the run record should keep about this scaler ({} for the global ones)."""
        return {}

    def _seen(self) -> tuple[float, float]:
        """The lowest and highest scale so far, the current one included (host reads)."""
        self.journal.read()
        now = self.scale
        return min(self._min_seen, now), max(self._max_seen, now)

    def summary(self) -> dict:
        """What the run record says about the scale (host reads)."""
        low, high = self._seen()
        return {"initial": self.initial, "final": self.scale, "min": low, "max": high}

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        low, high = self._seen()
        return {
            "kind": self.kind,
            "initial": self.initial,
            "steps": self.steps,
            "scale": self.scale,
            "min_seen": low,
            "max_seen": high,
            "floor_count": self._floor_count,
            "growth_tracker": int(self._growth_tracker),
            "hysteresis_left": int(self._hysteresis_left),
            "diverged_at": self._diverged_at if self._diverged_at is not None else -1,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.journal.read()  # rows of the steps before the load: folded, then replaced
        self.initial, self.steps = float(sd["initial"]), int(sd["steps"])
        if "scale" in sd:
            self._scale.fill_(sd["scale"])
        for key in ("growth_tracker", "hysteresis_left"):
            if key in sd:
                getattr(self, "_" + key).fill_(sd[key])
        self._min_seen = float(sd.get("min_seen", self.scale))
        self._max_seen = float(sd.get("max_seen", self.scale))
        self._floor_count = int(sd.get("floor_count", 0))
        at = int(sd.get("diverged_at", -1))
        self._diverged_at = at if at >= 0 else None
        torch.reciprocal(self._scale, out=self._inv)


@register_scaler("static", reads=())  # its constant is precision.static_scale (its own rule)
class StaticScaler(LossScaler):
    """A constant scale, as in the paper's experiments. Overflowing steps are skipped (Megatron's
    ConstantGradScaler; apex's static scale does not even check). The constant is its own floor:
    ``floor_patience`` consecutive overflows end the run as diverged. Its update launches
    nothing: the flag is in the journal already."""

    def __init__(self, cfg, init_scale: float | None, device: torch.device | str = "cpu"):
        super().__init__(cfg, init_scale if init_scale is not None else cfg.static_scale, device)

    def _host_at_floor(self) -> bool | None:
        return True


@register_scaler(
    "dynamic",
    reads=(
        "init_scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "hysteresis",
        "min_scale",
        "max_scale",
    ),
)
class DynamicScaler(LossScaler):
    """Back off on overflow, grow after ``growth_interval`` clean steps (torch.amp.GradScaler's
    rule), plus what GradScaler lacks: a floor (``min_scale``), a ceiling (``max_scale``), and
    DeepSpeed-style hysteresis (back off only on the ``hysteresis``-th overflow since the last
    growth; every overflowing step is still skipped). With hysteresis=1 and a floor and ceiling
    that are never reached, the trajectory is exactly GradScaler's.

    The update is GradScaler's own fused kernel (``torch._amp_update_scale_``: growth interval,
    backoff, growth) and one ``clamp_`` that applies the floor and the ceiling together. With
    hysteresis above 1 a tolerated overflow is taken back after the kernel (the scale it started
    from is in the journal) and the tolerance is counted down, refilled at growth: six more small
    ops, on the device."""

    moves = True

    def __init__(self, cfg, init_scale: float | None, device: torch.device | str = "cpu"):
        super().__init__(cfg, init_scale, device)
        # plain numbers, read once (the update may be compiled: no config lookups inside)
        self._growth, self._backoff = float(cfg.growth_factor), float(cfg.backoff_factor)
        self._interval, self._hysteresis = int(cfg.growth_interval), int(cfg.hysteresis)
        self._ceiling = float(cfg.max_scale)

    def _move(self, found: Tensor, floor: float, before: Tensor | None) -> None:
        hysteresis = self._hysteresis
        if hysteresis > 1:
            # an overflow with tolerance left: skipped, the scale kept (1.0 or 0.0)
            tolerated = (self._hysteresis_left > 1) * found
        torch._amp_update_scale_(
            self._scale, self._growth_tracker, found, self._growth, self._backoff, self._interval
        )
        if hysteresis > 1:
            # weight 0 or 1: exactly the kernel's scale or the one it started from
            self._scale.lerp_(before, tolerated)
            # the kernel zeroes its tracker on an overflow and when it grows: growth refills
            # the tolerance (DeepSpeed, consecutive_hysteresis=false), a tolerated one spends it
            grown = (self._growth_tracker == 0) & (found == 0)
            self._hysteresis_left.sub_(tolerated)
            self._hysteresis_left.masked_fill_(grown, float(hysteresis))
        self._scale.clamp_(min=floor, max=self._ceiling)  # a floor that rose lifts the scale too

    def describe(self, reason: str) -> str:
        c = self.cfg
        return (
            f"dynamic loss scale {self.initial:g} ({reason}; x{c.growth_factor:g} after "
            f"{c.growth_interval} clean steps, x{c.backoff_factor:g} on overflow, hysteresis "
            f"{c.hysteresis}, range [{c.min_scale:g}, {c.max_scale:g}])"
        )
