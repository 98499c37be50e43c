"""trainer.compile=step: one training iteration as one compiled function (issue 47).

``trainer.compile=true`` compiles the forward and the precision step's device regions around the
optimizer's fused kernel (compiled.py). ``step`` compiles the whole iteration as one graph, with
``fullgraph=True`` (a graph break is an error at the first step, never a silent split): the
forward under the policy's autocast, the scaled backward, the precision step (the model's
gradients into the FP32 masters' buffers, unscale and overflow check, each gradient's largest
magnitude into the journal's row, clipping), the optimizer's update, the skip of an overflowing
update, the FP16/BF16 weights refreshed from the masters, the skip signal and the loss scale's
update. What stays outside is host work with no device op of its own: dropping the gradients,
the step counters, the journal's notes and commit, the LR schedule.

Three things make that one graph (torch 2.14):

- the backward is traced with ``torch._dynamo.config.trace_autograd_ops`` (set around each call,
  never globally);
- torch.optim's ``Optimizer.step`` cannot be in the graph (its ``_use_grad`` wrapper calls
  ``torch._dynamo.graph_break()``, and the fused kernels are ``torch.compiler.disable``d), so
  the update is torch's *functional* foreach optimizer (``torch.optim.sgd.sgd``,
  ``torch.optim.adam.adam``) over the torch optimizer's own state tensors (``optimizer.state``:
  checkpoints, ``state_dict`` and resume see the same entries), made before the first compiled
  call where torch's own first step would have made them;
- an overflowing step is skipped as ``t.copy_(torch.where(found > 0, old, t))`` for every
  parameter and state tensor, where the fused kernels take ``found_inf``: the same result (an
  exact copy of the old values), without reading the flag on the host. The LR is a 0-d tensor
  (a float that changed would recompile the graph at every change).

A parameter the loss does not reach is left alone, as the eager step leaves it (which ones have a
gradient is fixed when the step is traced). Where the step cannot apply it is refused in one line
when the task is built (``refusal``).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mpt_repro import distributed
from mpt_repro.precision.optimizer import PrecisionOptimizer

# the torch optimizers whose update has a functional foreach form the step can trace
# (torch.optim.AdamW is an Adam with decoupled weight decay)
STEP_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam)


def refusal(cfg: Any, policy: Any) -> str | None:
    """Why trainer.compile=step cannot apply to this config (one line), or None. Checked when
    the task is built, before any work."""
    use = "use trainer.compile=true or trainer.compile=false"
    if policy.scaling_kind == "adaptive":
        return f"trainer.compile=step cannot compile precision=adaptive's per-layer hooks; {use}"
    if cfg.telemetry.enabled:
        return f"trainer.compile=step cannot compile telemetry's hooks; {use}"
    if policy.converters or policy.fp32_arithmetic:
        return (
            f"trainer.compile=step compiles the fp32, amp, mixed, bf16 family only, not "
            f"precision={policy.name}'s number formats; {use}"
        )
    if policy.low_precision_weights and not policy.master_weights:
        return (
            f"trainer.compile=step needs FP32 master weights (precision={policy.name} updates "
            f"FP16/BF16 weights under the state guard); {use}"
        )
    if cfg.trainer.accumulate != 1:
        return f"trainer.compile=step runs one micro-batch a step, not trainer.accumulate>1; {use}"
    if distributed.world_size() > 1:
        return f"trainer.compile=step runs in one process (no DDP/FSDP); {use}"
    name = str(cfg.optim.name)
    if name not in ("sgd", "adam", "adamw"):
        return f"trainer.compile=step traces SGD, Adam and AdamW, not optim.name={name}; {use}"
    return None


class CompiledStep:
    """One iteration of a single-optimizer task as one compiled function.

    ``forward`` is the training module, ``criterion(output, labels)`` the FP32 loss (pure device
    code: no config lookups, no host checks). Call it with one micro-batch on the device; it
    returns (the loss, detached; the skip signal, a 0-d bool on the device: False when the update
    was skipped), as the eager train step does."""

    def __init__(
        self,
        opt: PrecisionOptimizer,
        policy: Any,
        forward: torch.nn.Module,
        criterion: Callable[[Any, Tensor], Tensor],
        clip_grad_norm: float | None,
        mode: str = "default",
    ):
        torch_opt = opt.optimizer
        if not isinstance(torch_opt, STEP_OPTIMIZERS):
            raise ValueError(f"the compiled step traces SGD/Adam/AdamW, not {type(torch_opt)}")
        if opt.guard is not None or opt.hooks or opt.sharded:
            raise ValueError("the compiled step needs no state guard, no step hooks, no shards")
        if opt.scaler is not None and (not opt.scaler.sync_free or opt.scaler.floor_sources):
            raise ValueError("the compiled step needs a scaler that plans on the device")
        self.opt, self.policy, self.forward, self.criterion = opt, policy, forward, criterion
        self.clip = clip_grad_norm
        self.scaler = opt.scaler
        self.floor = float(opt.scaler.floor()) if opt.scaler is not None else 0.0
        self._masters = _master_pairs(opt)
        if opt.master is not None:  # the masters' FP32 gradient buffers, kept between steps
            for i in opt.master._low:
                opt.master._grads.setdefault(i, torch.empty_like(opt.master.opt_params[i]))
        self._groups = _group_indices(opt)
        self._lr_tensors: list[Tensor] = []
        self._lr_values: list[float] = []
        if self.scaler is not None:
            # the scale moves inside the compiled step: its own update keeps the host bookkeeping
            self.scaler._advance = _moved_in_the_step
        # fullgraph: a graph break is an error at the first step, never a silent split
        self._compiled = torch.compile(
            _own_code(self._device_step), fullgraph=True, mode=None if mode == "default" else mode
        )

    # -- the host side: what each call prepares and books ---------------------------------------
    def __call__(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        opt = self.opt
        opt.zero_grad()  # host only: every .grad None, so each call enters in the same state
        opt.steps += 1
        opt.host_stepped = None
        journal = opt.journal
        found = journal.slot("found") if journal is not None else None
        row = journal.slot("norms") if self.scaler is not None else None
        scale_slot = self.scaler.journal.slot("scale") if self._scale_moves() else None
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            loss, stepped = self._compiled(
                x, y, self._lrs(), self._hyper(), self._state(), found, row, scale_slot
            )
        if found is None:  # no scaler: nothing can skip
            return loss, opt._never_skipped
        # which gradients the step had (the journal's row is theirs): the model's own keep them
        present = [i for i, p in enumerate(opt.model_params) if p.grad is not None]
        journal.note(opt_step=opt.steps, present=opt._present_key(present))
        opt.scale_group.report(found)  # the scaler's host bookkeeping; it commits its row
        if not opt.scale_group.exclusive:
            journal.commit()
        return loss, stepped

    def _scale_moves(self) -> bool:
        return self.scaler is not None and self.scaler.moves

    def _lrs(self) -> list[Tensor]:
        """Each group's LR as a 0-d FP32 tensor: the schedule's own where it keeps the LR on the
        device, else one made once per group and refilled only when the LR changed (a host
        compare; a changing float would recompile the graph)."""
        groups = self.opt.param_groups
        if not self._lr_tensors:
            device = self.opt.params[0].device
            self._lr_tensors = [torch.zeros((), device=device) for _ in groups]
            self._lr_values = [float("nan")] * len(groups)
        out = []
        for i, group in enumerate(groups):
            lr = group["lr"]
            if torch.is_tensor(lr):
                out.append(lr)
                continue
            if lr != self._lr_values[i]:
                self._lr_tensors[i].fill_(lr)
                self._lr_values[i] = lr
            out.append(self._lr_tensors[i])
        return out

    def _hyper(self) -> list[dict[str, Any]]:
        """Each group's hyperparameters but the LR, copied at each call: the graph reads these
        copies, not the param groups, whose dicts change at every LR step (dynamo would guard
        on them and recompile); a value that did change recompiles, as it must."""
        keys = _HYPER[isinstance(self.opt.optimizer, torch.optim.SGD)]
        return [{k: g[k] for k in keys if k in g} for g in self.opt.param_groups]

    def _state(self) -> list[dict[str, list[Tensor]]]:
        """Per group, the optimizer state the update works on, from ``optimizer.state`` at each
        call (a loaded checkpoint replaces its tensors), made where it is missing as torch's own
        first step makes it (zeros; Adam's step count a 0-d FP32 tensor on the device)."""
        torch_opt = self.opt.optimizer
        adam = isinstance(torch_opt, torch.optim.Adam)
        out = []
        for group in torch_opt.param_groups:
            keys = _adam_keys(group) if adam else _sgd_keys(group)
            lists: dict[str, list[Tensor]] = {k: [] for k in keys}
            for p in group["params"]:
                state = torch_opt.state[p]
                for k in keys:
                    t = state.get(k)
                    if t is None or t.device != p.device:
                        t = state[k] = _state_tensor(k, p, t)
                    lists[k].append(t)
            out.append(lists)
        return out

    # -- the device side: one graph ------------------------------------------------------------
    def _device_step(
        self,
        x: Tensor,
        y: Tensor,
        lrs: list[Tensor],
        hyper: list[dict[str, Any]],
        state: list[dict[str, list[Tensor]]],
        found: Tensor | None,
        row: Tensor | None,
        scale_slot: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """Forward, scaled backward, the precision step and the update; traced whole."""
        with self.policy.autocast():
            loss = self.criterion(self.forward(x), y)
        scaler = self.scaler
        scaled = loss.float() * scaler._scale.view(()) if scaler is not None else loss
        scaled.backward()
        with torch.no_grad():
            grads = self._gradients()  # None for a parameter the loss did not reach
            got = [g for g in grads if g is not None]  # which ones: fixed when traced
            if scaler is not None:
                scaler.unscale_(got, found)
                norms = row if len(got) == len(grads) else row[: len(got)]  # as eager's row
                torch.stack(torch._foreach_norm(got, float("inf")), out=norms)
            if self.clip is not None:
                _clip_(got, self.clip)
            self._update(grads, lrs, hyper, state, found)
            if self._masters[0]:
                torch._foreach_copy_(self._masters[0], self._masters[1])  # rounds
            if scaler is not None:
                scaler._advance_eager(found, scale_slot, self.floor)
        return loss.detach().float(), (torch.eq(found, 0) if found is not None else None)

    def _gradients(self) -> list[Tensor | None]:
        """The optimizer's gradients in its parameters' order: a low-precision parameter's copied
        into its master's FP32 buffer (exact), an FP32 parameter's (its own master) as it is;
        None where the parameter got none (it is left alone, as the eager step leaves it)."""
        model_params, master = self.opt.model_params, self.opt.master
        if master is None:
            return [p.grad for p in model_params]
        buffers = master._grads
        low = [i for i in buffers if model_params[i].grad is not None]
        if low:
            torch._foreach_copy_([buffers[i] for i in low], [model_params[i].grad for i in low])
        return [
            None if p.grad is None else buffers[i] if i in buffers else p.grad
            for i, p in enumerate(model_params)
        ]

    def _update(
        self,
        grads: list[Tensor],
        lrs: list[Tensor],
        hyper: list[dict[str, Any]],
        state: list[dict[str, list[Tensor]]],
        found: Tensor | None,
    ) -> None:
        """The functional foreach update of each param group over its parameters that have a
        gradient; with a flag, every tensor it wrote is put back where the flag is set (the
        fused kernels' found_inf skip)."""
        params = self.opt.params
        for indices, group, lr, lists in zip(self._groups, hyper, lrs, state):
            keep = [k for k, i in enumerate(indices) if grads[i] is not None]
            if not keep:
                continue
            chosen = [indices[k] for k in keep]
            group_params = [params[i] for i in chosen]
            lists = {key: [ts[k] for k in keep] for key, ts in lists.items()}
            written = group_params + [t for ts in lists.values() for t in ts]
            old = [t.clone() for t in written] if found is not None else []
            _functional_update(
                self.opt.optimizer, group, group_params, [grads[i] for i in chosen], lr, lists
            )
            if found is not None:
                skip = found > 0
                for t, before in zip(written, old):
                    t.copy_(torch.where(skip, before, t))


def _own_code(method: Callable) -> Callable:
    """``method`` with a code object of its own. Dynamo keeps its compiled graphs per code object,
    at most ``torch._dynamo.config.recompile_limit`` (8) of them, and each CompiledStep is
    another entry (its guards name its own model): in one process (a Hydra multirun, a test
    session) the ninth would fail with fullgraph=True. A copy of the code gives each step its
    own cache and its own limit."""
    fn = method.__func__
    copy = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__qualname__, copy.__doc__ = fn.__qualname__, fn.__doc__
    return types.MethodType(copy, method.__self__)


def _moved_in_the_step(found: Tensor, scale_slot: Tensor | None, floor: float) -> None:
    """The scaler's ``_advance`` under trainer.compile=step: the compiled step moved the scale
    (and journaled the one it started from) already."""


def _master_pairs(opt: PrecisionOptimizer) -> tuple[list[Tensor], list[Tensor]]:
    """(the model's low-precision parameters, their FP32 masters): what each step refreshes."""
    master = opt.master
    if master is None:
        return [], []
    return [master.model_params[i] for i in master._low], master.masters


def _group_indices(opt: PrecisionOptimizer) -> list[list[int]]:
    """Each param group's parameters as indices into the optimizer's ``params``."""
    where = {id(p): i for i, p in enumerate(opt.params)}
    groups = [[where[id(p)] for p in g["params"]] for g in opt.param_groups]
    if sorted(i for g in groups for i in g) != list(range(len(opt.params))):
        raise ValueError("the compiled step needs every parameter in exactly one param group")
    return groups


# the hyperparameters the functional update reads, by whether the optimizer is SGD
_HYPER = {
    True: ("weight_decay", "momentum", "dampening", "nesterov", "maximize"),
    False: ("betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"),
}


def _sgd_keys(group: dict) -> tuple[str, ...]:
    return ("momentum_buffer",) if group["momentum"] != 0 else ()


def _adam_keys(group: dict) -> tuple[str, ...]:
    keys = ("step", "exp_avg", "exp_avg_sq")
    return (*keys, "max_exp_avg_sq") if group["amsgrad"] else keys


def _state_tensor(key: str, p: Tensor, found: Tensor | None) -> Tensor:
    """A missing state entry as torch's first step makes it; a step count moved to the device
    (capturable: the update reads it there)."""
    if key == "step":
        value = found if found is not None else torch.zeros(())
        return value.to(device=p.device, dtype=torch.float32)
    if found is not None:
        return found.to(p.device)
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def _functional_update(
    torch_opt: torch.optim.Optimizer,
    group: dict,
    params: list[Tensor],
    grads: list[Tensor],
    lr: Tensor,
    lists: dict[str, list[Tensor]],
) -> None:
    """One param group's update with torch's functional foreach optimizer (what its ``step``
    calls, without the wrappers that stop a trace)."""
    from torch.optim.adam import adam
    from torch.optim.sgd import sgd

    if isinstance(torch_opt, torch.optim.Adam):
        beta1, beta2 = group["betas"]
        adam(
            params, grads, lists["exp_avg"], lists["exp_avg_sq"],
            lists.get("max_exp_avg_sq", []), lists["step"],
            foreach=True, capturable=True, differentiable=False,
            decoupled_weight_decay=bool(group.get("decoupled_weight_decay", False)),
            amsgrad=group["amsgrad"], beta1=beta1, beta2=beta2, lr=lr,
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
        )  # fmt: skip
        return
    sgd(
        params, grads, lists.get("momentum_buffer", [None] * len(params)),
        has_sparse_grad=False, foreach=True,
        weight_decay=group["weight_decay"], momentum=group["momentum"], lr=lr,
        dampening=group["dampening"], nesterov=group["nesterov"], maximize=group["maximize"],
    )  # fmt: skip


def _clip_(grads: list[Tensor], max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_ on the gradients themselves (the masters hold no .grad
    here): the same total norm and coefficient, as torch computes them."""
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coef)
