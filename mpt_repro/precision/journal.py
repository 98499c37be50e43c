"""A journal of per-step device records, read on the host only when someone asks.

The precision step keeps its bookkeeping (skipped steps, the loss scale's floor streak and the
step it diverged at, the scale's lowest and highest value, which layer's gradient was the first
and the last non-finite one) off the step: each step writes its raw facts into the next row of a
preallocated block on the device, and the bookkeeping is folded from those rows on the host when
it is read (a log row, the run record, a checkpoint). A step then pays nothing for it beyond the
writes it already makes:

- the overflow flag: the row's ``found`` slot is the very tensor the unscale kernel writes, the
  fused optimizer reads and the scaler's update reads (the block is zeroed when it is taken);
- the per-layer gradient magnitudes (the first-non-finite diagnosis): one ``stack`` into the row;
- the scale before its update (dynamic scalers): one ``copy_``.

Every slot is a view made once per block (``unbind``: one op for a whole column), so a step makes
no view, allocates nothing and builds no tensor from host numbers. A block holds ``ROWS`` steps;
when it is full the next one is a block that was read already (zeroed, one op) or a new one. A run
that never reads keeps its blocks until it does (``MAX_PENDING`` blocks at most; then the oldest
are read, one host read per block).

Readers (``readers``) get each row once, in order, with the host-side notes of its step
(``note``): the attempt number, the set of gradients present...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

ROWS = 64  # steps per block
MAX_PENDING = 256  # full blocks kept unread before the oldest are read (a host read each)

Reader = Callable[[dict[str, np.ndarray], list[dict[str, Any]]], None]


class Journal:
    def __init__(self, device: torch.device | str, rows: int = ROWS):
        self.device, self.rows = torch.device(device), rows
        self._offsets: dict[str, tuple[int, int]] = {}  # column -> (first index, width; 0: scalar)
        self._width = 0
        self.readers: list[Reader] = []
        self._block: Tensor | None = None
        self._slots: dict[str, list[Tensor]] = {}
        self._row = 0  # the row the step being taken writes
        self._notes: list[dict[str, Any]] = []  # host notes of the rows of the current block
        self._read_upto = 0  # rows of the current block already handed to the readers
        # full blocks, with their notes and slots and the first row not yet read
        self._pending: list[tuple[Tensor, dict, list[dict[str, Any]], int]] = []
        # read blocks with their slots, reused (zeroed) before allocating
        self._spare: list[tuple[Tensor, dict[str, list[Tensor]]]] = []
        self._note: dict[str, Any] = {}

    # -- set-up ------------------------------------------------------------------------------
    def add_column(self, name: str, width: int = 0) -> None:
        """A float32 column: one value per step (width 0) or a vector of `width` values. Added
        before the first step writes (a block made earlier is dropped unwritten)."""
        if name in self._offsets:
            raise ValueError(f"journal column {name!r} exists already")
        if self._row or self._pending:
            raise RuntimeError("journal columns are added before the first step")
        self._offsets[name] = (self._width, width)
        self._width += max(width, 1)
        self._block, self._slots, self._spare = None, {}, []

    def has(self, name: str) -> bool:
        return name in self._offsets

    # -- the step ----------------------------------------------------------------------------
    def slot(self, name: str) -> Tensor:
        """The current step's view of column `name`: a 0-d tensor, or a vector."""
        if self._block is None:
            self._take_block()
        return self._slots[name][self._row]

    def note(self, **values: Any) -> None:
        """Host-side facts about the current step, handed to the readers with its row."""
        self._note.update(values)

    def commit(self) -> None:
        """The current step's row is written: the next step writes the next row."""
        if self._block is None:
            self._take_block()
        self._notes.append(self._note)
        self._note = {}
        self._row += 1
        if self._row == self.rows:
            self._pending.append((self._block, self._slots, self._notes, self._read_upto))
            self._block, self._row, self._notes, self._read_upto = None, 0, [], 0
            if len(self._pending) > MAX_PENDING:  # nobody reads: read the oldest now
                self.read()

    def _take_block(self) -> None:
        if self._spare:
            self._block, self._slots = self._spare.pop()
            self._block.zero_()
            return
        block = torch.zeros(self.rows, max(self._width, 1), device=self.device)
        self._block, self._slots = block, {}
        for name, (first, width) in self._offsets.items():
            column = block[:, first] if width == 0 else block[:, first : first + width]
            self._slots[name] = list(column.unbind(0))

    # -- reading (host) -----------------------------------------------------------------------
    def read(self) -> None:
        """Hand every committed row not yet read to the readers (one host read per block)."""
        pending, self._pending = self._pending, []
        for block, slots, notes, start in pending:
            self._hand(block, notes, start, len(notes))
            self._spare.append((block, slots))
        if self._block is not None and self._read_upto < self._row:
            self._hand(self._block, self._notes, self._read_upto, self._row)
            self._read_upto = self._row

    def _hand(self, block: Tensor, notes: list, start: int, stop: int) -> None:
        if start >= stop or not self.readers:
            return
        rows = block[start:stop].cpu().numpy().copy()  # copied: a CPU block is reused
        columns = {
            name: rows[:, first] if width == 0 else rows[:, first : first + width]
            for name, (first, width) in self._offsets.items()
        }
        for reader in self.readers:
            reader(columns, notes[start:stop])
