"""Loss scalers: small, plain, pluggable, and sync-free.

A scaler owns the scale and the counters that move it, all as tensors on the training device, so
that a step never waits for the GPU to say whether it overflowed (paper §3.2 skips such steps;
the optimizer's fused kernel reads the flag on the device). The precision optimizer drives it:

    loss_scaled = scaler.scale_loss(loss); loss_scaled.backward()
    found_inf = scaler.unscale_(grads)   # in place, FP16 or FP32 grads; a (1,) float tensor
    scaler.update(found_inf)             # moves the scale with torch.where: no host read

Host reads happen only when someone asks: ``scale``, ``summary()``, ``diverged_at()`` (log rows,
the run record). A scaler that needs the host every step (the layer-wise adaptive one) says so
with ``sync_free = False``.

With ``loss_scaling=none`` (FP32, BF16, the no-scaling ablations) no scaler exists at all: the
optimizer neither scales, nor inspects the grads, nor skips.

New kinds register with ``@register_scaler("name")`` and are picked by ``precision.loss_scaling``
(plugins.py lists the built-in ones). A scaler knows no number format: a converter that raises
the floor of the scale during training (precision.fp8's rising floor) is one of its
``floor_sources``, which the policy sets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

SCALERS: dict[str, type[LossScaler]] = {}


def register_scaler(kind: str) -> Callable[[type[LossScaler]], type[LossScaler]]:
    """Class decorator: make a scaler available as ``precision.loss_scaling=<kind>``."""

    def wrap(cls: type[LossScaler]) -> type[LossScaler]:
        cls.kind = kind
        SCALERS[kind] = cls
        return cls

    return wrap


def unscale_and_check_(grads: Sequence[Tensor], inv_scale: Tensor) -> Tensor:
    """Multiply every grad by ``inv_scale`` in place; return a (1,) float tensor on the device of
    ``inv_scale``, nonzero if any grad holds inf or NaN.

    Uses the fused multi-tensor kernel behind GradScaler, grouped by (device, dtype). Unlike
    GradScaler we accept FP16 grads (the no-master-copy ablation): the kernel computes in FP32
    and rounds once. It checks each value *before* the multiply, so for FP16 grads, where a scale
    below 1 makes the multiply itself overflow (1/scale > 1), a second pass checks the result:
    a non-finite value never reaches the weights unnoticed. Unscaled FP16 values below 2^-24
    flush to zero: that is the no-master ablation's own loss, which is what it measures.
    """
    found = torch.zeros(1, device=inv_scale.device)
    groups: dict[tuple, list[Tensor]] = defaultdict(list)
    for g in grads:
        groups[(g.device, g.dtype)].append(g)
    for (device, dtype), gs in groups.items():
        f = torch.zeros(1, device=device)
        inv = inv_scale.to(device)
        torch._amp_foreach_non_finite_check_and_unscale_(gs, f, inv)
        if dtype != torch.float32:
            torch._amp_foreach_non_finite_check_and_unscale_(gs, f, torch.ones_like(inv))
        found += f.to(found.device)
    return found


class LossScaler:
    """Base class: the counters, and a scale that never moves.

    Subclasses say how the scale moves (``_move``) and where its floor is (``_at_floor``).
    ``floor_count`` counts consecutive skipped steps taken at the floor (the optimizer counts
    the skipped steps themselves). When it reaches ``floor_patience`` the attempt number is
    kept in ``diverged_at`` and the trainer ends the run as diverged at its next log row.
    """

    kind = "base"
    sync_free = True  # update() needs no host read
    # a scaler that reads the overflow flag on the host (sync_free False) keeps what it read
    # at its last update here, so that nothing reads it again; None: it stayed on the device
    host_overflow: bool | None = None

    def __init__(self, cfg, init_scale: float | None, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.initial = float(init_scale if init_scale is not None else cfg.init_scale)
        self.steps = 0  # update() calls: host-side, the host knows how often it stepped

        def f32(v: float) -> Tensor:
            return torch.tensor(v, dtype=torch.float32, device=self.device)

        def i64(v: int) -> Tensor:
            return torch.tensor(v, dtype=torch.int64, device=self.device)

        # FP32 like GradScaler's, so that trajectories and unscaled grads match it bit for bit
        self._scale = f32(self.initial)
        self._min_seen, self._max_seen = f32(self.initial), f32(self.initial)
        self._floor_count = i64(0)
        self._growth_tracker = i64(0)  # consecutive clean steps since the last change
        self._hysteresis_left = i64(int(getattr(cfg, "hysteresis", 1)))
        self._diverged_at = i64(-1)  # attempt at which floor_count reached floor_patience
        # floors that rise with the step count (converters' scale_floor, set by the policy)
        self.floor_sources: list[Callable[[int], float | None]] = []

    # -- hooks for layer-wise scalers ------------------------------------------------------
    def attach(self, model: nn.Module, names: list[str], params: list[Tensor]) -> None:
        """Called once per optimizer with its model and parameters. The global scalers need
        nothing; a layer-wise scaler registers its hooks here."""

    # -- the three calls per step ----------------------------------------------------------
    def scale_loss(self, loss: Tensor) -> Tensor:
        # FP32 before the multiply: an FP16 loss times 65536 would overflow by itself.
        return loss.float() * self._scale.to(loss.device)

    def unscale_(self, grads: Sequence[Tensor]) -> Tensor:
        """Unscale ``grads`` in place; return a (1,) tensor, nonzero when inf/NaN was found."""
        # the reciprocal in FP64, then FP32: what GradScaler does
        return unscale_and_check_(grads, self._scale.double().reciprocal().float().reshape(1))

    def update(self, found_inf: Tensor) -> None:
        """Count the step and move the scale, on the device."""
        self.steps += 1
        inf = found_inf.reshape(()).to(self.device) > 0
        at_floor = self._at_floor()
        self._floor_count = torch.where(inf & at_floor, self._floor_count + 1, 0)
        newly = (self._diverged_at < 0) & (self._floor_count >= self.cfg.floor_patience)
        self._diverged_at = torch.where(newly, self.steps, self._diverged_at)
        self._move(inf)
        torch.minimum(self._min_seen, self._scale, out=self._min_seen)
        torch.maximum(self._max_seen, self._scale, out=self._max_seen)

    def _move(self, inf: Tensor) -> None:
        pass

    def _at_floor(self) -> Tensor:
        return self._scale <= self.floor()

    def floor(self) -> float:
        """The lowest scale now: precision.min_scale, or the highest floor a source raises it to
        at this step (precision.fp8's enhanced loss scaling, Mellempudi et al. 2019). Host
        arithmetic on the host's step count: no sync."""
        raised = [f for source in self.floor_sources if (f := source(self.steps)) is not None]
        return max(raised, default=self.cfg.min_scale)

    # -- host reads (log rows, the run record) ---------------------------------------------
    @property
    def scale(self) -> float:
        return float(self._scale)

    @property
    def floor_count(self) -> int:
        return int(self._floor_count)

    def diverged_at(self) -> int | None:
        """The attempt (1-based update() count) at which the scale had sat at its floor for
        ``floor_patience`` skipped steps in a row, or None."""
        at = int(self._diverged_at)
        return at if at >= 0 else None

    def describe(self, reason: str) -> str:
        """One phrase for the preset's description; ``reason`` says where the scale came from."""
        return f"{self.kind} loss scale {self.initial:g} ({reason})"

    def layer_scales(self) -> dict[str, float]:
        """{layer: its own scale} for layer-wise scalers; {} for one global scale."""
        return {}

    def diagnostics(self) -> dict:
        """Anything else the run record should keep about this scaler ({} for the global ones)."""
        return {}

    def summary(self) -> dict:
        """What the run record says about the scale (host reads)."""
        return {
            "initial": self.initial,
            "final": self.scale,
            "min": float(self._min_seen),
            "max": float(self._max_seen),
        }

    # -- checkpoints -----------------------------------------------------------------------
    _tensors = (
        "scale",
        "min_seen",
        "max_seen",
        "floor_count",
        "growth_tracker",
        "hysteresis_left",
        "diverged_at",
    )

    def state_dict(self) -> dict:
        sd = {"kind": self.kind, "initial": self.initial, "steps": self.steps}
        sd.update({k: getattr(self, "_" + k).item() for k in self._tensors})
        return sd

    def load_state_dict(self, sd: dict) -> None:
        self.initial, self.steps = float(sd["initial"]), int(sd["steps"])
        for k in self._tensors:
            if k in sd:
                getattr(self, "_" + k).fill_(sd[k])


@register_scaler("static")
class StaticScaler(LossScaler):
    """A constant scale, as in the paper's experiments. Overflowing steps are skipped (Megatron's
    ConstantGradScaler; apex's static scale does not even check). The constant is its own floor:
    ``floor_patience`` consecutive overflows end the run as diverged."""

    def __init__(self, cfg, init_scale: float | None, device: torch.device | str = "cpu"):
        super().__init__(cfg, init_scale if init_scale is not None else cfg.static_scale, device)

    def _at_floor(self) -> Tensor:
        return torch.ones((), dtype=torch.bool, device=self.device)


@register_scaler("dynamic")
class DynamicScaler(LossScaler):
    """Back off on overflow, grow after ``growth_interval`` clean steps (torch.amp.GradScaler's
    rule), plus what GradScaler lacks: a floor (``min_scale``), a ceiling (``max_scale``), and
    DeepSpeed-style hysteresis (back off only on the ``hysteresis``-th overflow since the last
    growth; every overflowing step is still skipped). With hysteresis=1 and a floor and ceiling
    that are never reached, the trajectory is exactly GradScaler's."""

    def _move(self, inf: Tensor) -> None:
        c = self.cfg
        floor = self.floor()
        tolerate = inf & (self._hysteresis_left > 1)
        backoff = inf & ~tolerate
        self._scale = torch.where(
            backoff, (self._scale * c.backoff_factor).clamp(min=floor), self._scale
        )
        self._hysteresis_left = torch.where(
            tolerate, self._hysteresis_left - 1, self._hysteresis_left
        )
        self._growth_tracker = torch.where(inf, 0, self._growth_tracker + 1)
        grow = self._growth_tracker >= c.growth_interval
        self._scale = torch.where(
            grow, (self._scale * c.growth_factor).clamp(max=c.max_scale), self._scale
        )
        self._growth_tracker = torch.where(grow, 0, self._growth_tracker)
        # DeepSpeed (consecutive_hysteresis=false): the tolerance refills when the scale grows
        self._hysteresis_left = torch.where(grow, c.hysteresis, self._hysteresis_left)
        self._scale.clamp_(min=floor)  # a floor that rose lifts the scale with it

    def describe(self, reason: str) -> str:
        c = self.cfg
        return (
            f"dynamic loss scale {self.initial:g} ({reason}; x{c.growth_factor:g} after "
            f"{c.growth_interval} clean steps, x{c.backoff_factor:g} on overflow, hysteresis "
            f"{c.hysteresis}, range [{c.min_scale:g}, {c.max_scale:g}])"
        )
