"""Loss scalers: small, plain, and pluggable.

A scaler owns one number (the scale) and the counters that move it. The policy drives it:

    scaled = scaler.scale_loss(loss); scaled.backward()
    # in place, FP16 or FP32 grads; returns a 1-element tensor
    found_inf = scaler.unscale_(grads)
    scaler.update(bool(found_inf))           # the policy's skip decision: one host sync per step

The scale is a Python float. The skip decision already costs one host sync per step, so keeping
the scale on the host costs nothing extra and lets min/max tracking and logging happen for free.

With ``loss_scaling=none`` (FP32, BF16, the no-scaling ablations) no scaler exists at all: the
policy neither scales, nor inspects the grads, nor skips.

New kinds (e.g. the layer-wise adaptive scaler) register with ``@register_scaler("name")``
and are picked by ``precision.loss_scaling``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

SCALERS: dict[str, type[LossScaler]] = {}


def register_scaler(kind: str) -> Callable[[type[LossScaler]], type[LossScaler]]:
    """Class decorator: make a scaler available as ``precision.loss_scaling=<kind>``."""

    def wrap(cls: type[LossScaler]) -> type[LossScaler]:
        cls.kind = kind
        SCALERS[kind] = cls
        return cls

    return wrap


def build_scaler(kind: str, cfg, init_scale: float | None = None) -> LossScaler:
    """A fresh scaler of ``kind`` configured from ``cfg`` (a PrecisionConfig)."""
    if kind not in SCALERS:
        from mpt_repro.errors import ConfigError

        raise ConfigError(
            f"precision.loss_scaling={kind} has no scaler implementation yet "
            f"(available: {sorted(SCALERS)})."
        )
    return SCALERS[kind](cfg, init_scale)


def unscale_and_check_(grads: Sequence[Tensor], scale: float) -> Tensor:
    """Multiply every grad by 1/scale in place and return a 1-element float tensor, 1.0 if any
    grad holds inf or NaN (checked before the multiply, so an overflow is never hidden).

    Uses the fused multi-tensor kernel behind GradScaler, grouped by (device, dtype), with no
    per-parameter host sync. Unlike GradScaler we accept FP16 grads: the kernel computes in FP32
    and rounds once, and 1/scale is passed as an FP32 tensor, so it cannot underflow in FP16.
    Unscaled FP16 values below 2^-24 do flush to zero: that is the no-master-copy ablation's
    own loss of precision, which is what it measures.
    """
    groups: dict[tuple, list[Tensor]] = defaultdict(list)
    for g in grads:
        groups[(g.device, g.dtype)].append(g)
    found = None
    for (device, _), gs in groups.items():
        f = torch.zeros(1, device=device)
        inv = torch.full((1,), 1.0 / scale, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(gs, f, inv)
        found = f if found is None else found + f.to(found.device)
    return found if found is not None else torch.zeros(1)


class LossScaler:
    """Base class: the counters, and a scale that never moves.

    Subclasses set how the scale moves (``_move``) and where its floor is (``_floor``).
    ``skipped`` counts skipped steps; ``floor_count`` counts consecutive skipped steps taken at
    the floor scale (the policy ends the run as diverged when it reaches ``floor_patience``).
    """

    kind = "base"

    def __init__(self, cfg, init_scale: float | None = None):
        self.cfg = cfg
        self.scale = float(init_scale if init_scale is not None else cfg.init_scale)
        self.initial = self.scale
        self.min_seen = self.scale
        self.max_seen = self.scale
        self.steps = 0  # optimizer steps attempted (stepped + skipped)
        self.skipped = 0
        self.floor_count = 0
        self.growth_tracker = 0  # consecutive clean steps since the last change
        self.hysteresis_left = int(getattr(cfg, "hysteresis", 1))

    # -- hooks for layer-wise scalers ------------------------------------------------------
    def attach(self, model: torch.nn.Module, names: list[str], params: list[Tensor]) -> None:
        """Called once by build_optimizer with the model and the optimizer's parameters.
        The global scalers need nothing; a layer-wise scaler registers its hooks here."""

    # -- the three calls per step ----------------------------------------------------------
    def scale_loss(self, loss: Tensor) -> Tensor:
        # FP32 before the multiply: an FP16 loss times 65536 would overflow by itself.
        return loss.float() * self.scale

    def unscale_(self, grads: Sequence[Tensor]) -> Tensor:
        """Unscale ``grads`` in place; return a 1-element tensor (nonzero: inf/NaN found)."""
        return unscale_and_check_(grads, self.scale)

    def update(self, found_inf: bool) -> None:
        """Count the step and move the scale. Subclasses override ``_move``."""
        self.steps += 1
        at_floor = self.scale <= self._floor()
        if found_inf:
            self.skipped += 1
            self.floor_count = self.floor_count + 1 if at_floor else 0
        else:
            self.floor_count = 0
        self._move(found_inf)
        self.min_seen = min(self.min_seen, self.scale)
        self.max_seen = max(self.max_seen, self.scale)

    def _move(self, found_inf: bool) -> None:
        pass

    def _floor(self) -> float:
        return self.cfg.min_scale

    @property
    def at_floor_too_long(self) -> bool:
        return self.floor_count >= self.cfg.floor_patience

    # -- checkpoints -----------------------------------------------------------------------
    _state_keys = (
        "scale",
        "initial",
        "min_seen",
        "max_seen",
        "steps",
        "skipped",
        "floor_count",
        "growth_tracker",
        "hysteresis_left",
    )

    def state_dict(self) -> dict:
        return {"kind": self.kind, **{k: getattr(self, k) for k in self._state_keys}}

    def load_state_dict(self, sd: dict) -> None:
        for k in self._state_keys:
            if k in sd:
                setattr(self, k, type(getattr(self, k))(sd[k]))


@register_scaler("static")
class StaticScaler(LossScaler):
    """A constant scale, as in the paper's experiments. Overflowing steps are skipped (Megatron's
    ConstantGradScaler; apex's static scale does not even check). The constant is its own floor:
    ``floor_patience`` consecutive overflows end the run as diverged."""

    def __init__(self, cfg, init_scale: float | None = None):
        super().__init__(cfg, init_scale if init_scale is not None else cfg.static_scale)

    def _floor(self) -> float:
        return self.scale


@register_scaler("dynamic")
class DynamicScaler(LossScaler):
    """Back off on overflow, grow after ``growth_interval`` clean steps (torch.amp.GradScaler's
    rule), plus what GradScaler lacks: a floor (``min_scale``), a ceiling (``max_scale``), and
    DeepSpeed-style hysteresis (back off only on the ``hysteresis``-th overflow since the last
    growth; every overflowing step is still skipped). With hysteresis=1 and a floor and ceiling
    that are never reached, the trajectory is exactly GradScaler's."""

    def _move(self, found_inf: bool) -> None:
        c = self.cfg
        if found_inf:
            self.growth_tracker = 0
            if self.hysteresis_left > 1:
                self.hysteresis_left -= 1  # tolerate this one: keep the scale
            else:
                self.scale = max(self.scale * c.backoff_factor, c.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker >= c.growth_interval:
                self.growth_tracker = 0
                self.scale = min(self.scale * c.growth_factor, c.max_scale)
                # DeepSpeed (consecutive_hysteresis=false): the tolerance refills when the scale
                # grows
                self.hysteresis_left = c.hysteresis
