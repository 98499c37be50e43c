"""trainer.compile for the precision step: its device regions, each compiled whole.

The step's host work (which gradients exist, the journal's row, the notes) stays in Python; what
runs on the device between the backward and the next step is a few regions around the
optimizer's own kernel (precision/optimizer.py: ``_prepare``, ``_finish``; scalers.py:
``_advance``). Each is compiled with ``fullgraph=True``, so a construct torch.compile cannot trace
is an error when the step is first run, never a silent graph break. The optimizer's kernel itself
stays outside: torch marks its fused optimizers untraceable (`torch.compiler.disable`, "don't
trace into fused optimizer"), and it is one kernel already.

It also keeps torch.compile's machinery from loading in a run that never compiles
(``defer_dynamo``): torch.optim.Optimizer's ``add_param_group``, ``zero_grad``, ``state_dict``
and ``load_state_dict`` are wrapped by ``torch._disable_dynamo``, whose first call imports
torch._dynamo only to mark them untraceable, and every optimizer's ``step`` imports it to call
``torch._dynamo.graph_break()``, a no-op outside a trace: about 2 s of CPU, a quarter of an
`mpt-run`'s start, spent by runs that never compile. Once anything imports torch._dynamo
(trainer.compile, a test), both behave exactly as torch's own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch


def compile_region(fn: Any, mode: str) -> Any:
    """torch.compile one device region of the step, whole (fullgraph: a graph break raises)."""
    return torch.compile(fn, fullgraph=True, mode=None if mode == "default" else mode)


def _until_dynamo_loads(fn: Callable, recursive: bool) -> Callable:
    """``fn`` called as it is while torch._dynamo was never imported (nothing can be tracing
    it then); from the first call after that on, the untraceable wrapper torch would have made."""

    def call(*args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or not hasattr(dynamo, "disable"):
            return fn(*args, **kwargs)
        disabled = dynamo.disable(fn, recursive, wrapping=False)
        fn.__dynamo_disable = disabled  # what torch._disable_dynamo caches there itself
        return disabled(*args, **kwargs)

    return call


def defer_dynamo(cls: type = torch.optim.Optimizer) -> int:
    """Give each ``torch._disable_dynamo``-wrapped method of ``cls`` the lazy wrapper above in
    the cache slot torch fills on its first call (``fn.__dynamo_disable``); returns how many.
    Idempotent, and a no-op for a torch whose wrapper looks different."""
    probe = torch._disable_dynamo(lambda: None)
    code = getattr(probe, "__code__", None)
    done = 0
    for attr in vars(cls).values():
        fn = getattr(attr, "__wrapped__", None)
        if fn is None or getattr(attr, "__code__", None) is not code:
            continue
        cells = dict(zip(attr.__code__.co_freevars, attr.__closure__ or ()))
        recursive = cells["recursive"].cell_contents if "recursive" in cells else True
        if getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = _until_dynamo_loads(fn, recursive)
        done += 1
    return done


def _grad_mode_step(use_grad: Callable) -> Callable:
    """An optimizer's ``step`` under its ``differentiable`` grad mode, as torch's
    ``_use_grad_for_differentiable`` runs it, without its graph breaks (and their import of
    torch._dynamo) while torch._dynamo was never imported; torch's own wrapper after that."""
    step = use_grad.__wrapped__

    def run_step(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" in sys.modules:
            return use_grad(*args, **kwargs)
        before = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(args[0].defaults["differentiable"])
            return step(*args, **kwargs)
        finally:
            torch.set_grad_enabled(before)

    run_step.__dict__.update(use_grad.__dict__)  # __wrapped__, __name__, __doc__, ...
    run_step.__name__, run_step.__qualname__ = use_grad.__name__, use_grad.__qualname__
    run_step.__doc__ = use_grad.__doc__
    return run_step


def defer_optimizer_steps() -> int:
    """Each torch.optim optimizer class whose ``step`` is torch's grad-mode wrapper (classes
    already hooked by a constructed instance are left alone) gets ``_grad_mode_step``."""
    from torch.optim import optimizer as torch_optimizer

    probe = torch_optimizer._use_grad_for_differentiable(lambda self: None)
    done = 0
    for cls in vars(torch.optim).values():
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        step = vars(cls).get("step")
        if getattr(step, "__code__", None) is probe.__code__:
            cls.step = _grad_mode_step(step)
            done += 1
    return done


defer_dynamo()
defer_optimizer_steps()
