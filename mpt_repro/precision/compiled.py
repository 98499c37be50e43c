"""trainer.compile for the precision step: its device regions, each compiled whole.

The step's host work (which gradients exist, the journal's row, the notes) stays in Python; what
runs on the device between the backward and the next step is a few regions around the
optimizer's own kernel (precision/optimizer.py: ``_prepare``, ``_finish``; scalers.py:
``_advance``). Each is compiled with ``fullgraph=True``, so a construct torch.compile cannot trace
is an error when the step is first run, never a silent graph break. The optimizer's kernel itself
stays outside: torch marks its fused optimizers untraceable (`torch.compiler.disable`, "don't
trace into fused optimizer"), and it is one kernel already.
"""

from __future__ import annotations

from typing import Any

import torch


def compile_region(fn: Any, mode: str) -> Any:
    """torch.compile one device region of the step, whole (fullgraph: a graph break raises)."""
    return torch.compile(fn, fullgraph=True, mode=None if mode == "default" else mode)
