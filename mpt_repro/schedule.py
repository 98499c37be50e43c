"""The LR schedule of one PrecisionOptimizer: each param group's LR is its base LR times
``multiplier(i)``, where ``i`` counts the optimizer's updates.

With ``precision.hold_lr_on_skip`` a skipped step (overflow) does not advance ``i``: the schedule
follows the updates actually applied, as apex's and fairseq's loops do. Whether a step was
skipped is known only on the device; when the optimizer steps without a host sync (a fused
kernel), the count stays on the device too and each group's LR is a device tensor filled from a
table of the multipliers, so holding the LR costs no sync. Otherwise (nothing that skips, no
hold, or an optimizer that already syncs) the count is an ordinary Python int.

A plateau decay (optim.plateau_decay, the TensorFlow translate tutorial's) multiplies the LR on
top of the schedule: at each train log row the trainer hands over the row's mean loss, already
on the host, and a loss above every one of the previous `rows` rows' losses decays the LR.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from mpt_repro.precision.optimizer import PrecisionOptimizer


class LRSchedule:
    def __init__(
        self,
        optimizer: PrecisionOptimizer,
        multiplier: Callable[[int], float],
        total_steps: int,
        hold_on_skip: bool,
        plateau: tuple[float, int] | None = None,
    ):
        self.optimizer, self.multiplier = optimizer, multiplier
        # (factor, rows): optim.plateau_decay and optim.plateau_rows; None: no plateau decay
        self.plateau, self.decay, self.losses = plateau, 1.0, []
        # steps are skipped by a loss scaler, or, without a master copy, by the guard of the
        # FP16 optimizer state (PrecisionOptimizer.skips)
        self.hold = hold_on_skip and optimizer.skips != "never"
        groups = optimizer.param_groups
        self.base = [float(g.setdefault("initial_lr", float(g["lr"]))) for g in groups]
        self.on_device = self.hold and optimizer.skips == "on_device"
        self._count = 0
        self._steps = 0  # step() calls (host), for the length of the device table
        self.total_steps = total_steps
        if self.on_device:
            device = groups[0]["params"][0].device
            self._count_t = torch.zeros(1, dtype=torch.int64, device=device)
            self._lrs = torch.tensor(self.base, dtype=torch.float32, device=device)
            self._lr_views = list(self._lrs.unbind(0))  # each group's "lr", made once
            self._lr_row = self._lrs.view(1, -1)  # index_select's output, made once
            self._table = self._lr_table(total_steps)
        self._apply()

    def _lr_table(self, steps: int) -> Tensor:
        """(steps + 1, groups) FP32 on the device: row i holds each group's LR after i applied
        updates (base x decay x multiplier(i) in FP64, rounded once). Made at construction and
        when a plateau decays (log rows): never per step."""
        rows = [
            [self.multiplier(i) * (base * self.decay) for base in self.base]
            for i in range(steps + 1)
        ]
        table = torch.tensor(rows, dtype=torch.float64).float()
        return table.to(self._lrs.device)

    def step(self, stepped: Tensor | bool) -> None:
        """After each optimizer step; ``stepped`` is what PrecisionOptimizer.step returned."""
        self._steps += 1
        if self.on_device:
            if self._steps >= len(self._table):  # more steps than planned (never in a run)
                self._table = self._lr_table(2 * self._steps)
            self._count_t.add_(stepped)
        elif not self.hold or self._applied_on_host(stepped):
            self._count += 1
        self._apply()

    def observe(self, loss: float) -> None:
        """A train log row's mean loss (the same on every rank). As the tutorial's
        `if len(previous_losses) > 2 and loss > max(previous_losses[-3:])`: a plateau decays."""
        if self.plateau is None or not math.isfinite(loss):
            return  # a non-finite loss is the divergence check's business
        factor, rows = self.plateau
        if len(self.losses) >= rows and loss > max(self.losses[-rows:]):
            self.decay *= factor
            if self.on_device:
                self._table = self._lr_table(max(self.total_steps, self._steps))
            self._apply()
        self.losses = [*self.losses, loss][-rows:]

    def _applied_on_host(self, stepped: Tensor | bool) -> bool:
        # an optimizer without a fused kernel read its overflow flag already: reading `stepped`
        # again would wait a second time, for the whole update queued since
        known = self.optimizer.host_stepped
        return known if known is not None else bool(stepped)

    def _apply(self) -> None:
        groups = self.optimizer.param_groups
        if self.on_device:
            # index_select: indexing with a device tensor would read it on the host
            torch.index_select(self._table, 0, self._count_t, out=self._lr_row)
            for g, lr in zip(groups, self._lr_views):
                if g["lr"] is not lr:  # first call, or the optimizer's state was loaded
                    g["lr"] = lr
        else:
            factor = self.multiplier(self._count)
            for g, base in zip(groups, self.base):
                g["lr"] = base * self.decay * factor

    @property
    def applied(self) -> int:
        """Updates the schedule has counted (a host read)."""
        return int(self._count_t) if self.on_device else self._count

    def state_dict(self) -> dict:
        return {"applied": self.applied, "decay": self.decay, "losses": list(self.losses)}

    def load_state_dict(self, sd: dict) -> None:
        # checkpoints written before the plateau decay hold the count alone
        self.decay, self.losses = float(sd.get("decay", 1.0)), list(sd.get("losses", []))
        if self.on_device:
            self._table = self._lr_table(max(self.total_steps, int(sd["applied"])))
            self._count_t.fill_(int(sd["applied"]))
        else:
            self._count = int(sd["applied"])
        self._apply()
