"""Adaptive layer-wise loss scaling (Zhao, Vogel, Ahmed, Luk 2019, arXiv 1910.12385).

Each weighted layer L (Linear, Conv, ConvTranspose, LSTM/GRU/RNN) multiplies the gradient that
arrives at its output by its own power of two s_L, chosen from the statistics of that gradient
and of L's weights so that the expected fraction of underflowing products g_i * w_ij in L's
backward stays below a threshold. The gradient below L therefore carries the *accumulated*
scale S_prev * s_L; each parameter's gradient is unscaled by the accumulated scale it carries
(on the FP32 master copy), and where a tensor is consumed by several layers the contributions
are brought to one scale before autograd sums them. docs/adaptive.md has the full design.

How it hooks into PyTorch autograd (nothing here edits a model):

* a forward pre-hook on L wraps its input in ``_Rescale`` (an identity whose backward multiplies
  by a factor): that is L's private edge into the input tensor, the one place where L's
  contribution can be rescaled *before* autograd adds it to the other consumers' contributions;
* a forward hook on L registers a pre-hook on the autograd node that produced L's output: it
  multiplies L's incoming gradient by s_L (and, when due, keeps that gradient: the statistics of
  all the layers' are taken together at the end of the backward, ``_reduce_retained``);
* ``scale_loss`` (called right before backward) solves for one consistent scale per node of the
  autograd graph below the loss (``_plan``): the factors of the ``_Rescale`` edges, the s_L to
  apply, and the scale every parameter's gradient will carry. All scales are powers of two,
  kept as integer exponents, so every rescaling is exact. The graph is walked once per forward
  key and kept as a ``_Tape`` (``_tape_for``): later steps replay it without a walk.

The statistics a layer's scale is computed from are those of the previous iteration's gradient
(recorded in the backward, sent to the host with the update's overflow flag without a wait,
``_send_ahead``, and read by the next plan once landed, ``_settle``): the plan must be fixed
before the backward starts, because a join needs the scales of all its branches. The reference
computes s_L from the current gradient; with update_interval > 1 both reuse old values anyway.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from mpt_repro.precision.scalers import LossScaler, register_scaler, unscale_and_check_

U_MIN = 2.0**-24  # FP16's smallest subnormal (the reference writes 6e-8)
U_MAX = 65504.0  # FP16's largest finite number
# The range constants of the authors' final code (kumasento/gradient-scaling @911ef2d,
# ada_loss/ada_loss.py get_u_min / get_u_max), used by the formulas that follow that code
CODE_U_MIN, CODE_U_MAX = 6.0e-8, 65504.0
WEIGHTED = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.RNNBase,
)
METHODS = ("approx_range",)
# precision.adaptive_formula (docs/adaptive.md "Which formula"):
#   paper        the paper's approx_range formula (what the ada-loss Init commit computes)
#   code         what the authors' final code computes: its get_loss_scale drops W, so the
#                scale comes from std(g) and max|g| alone; sigma 0 gives scale 1
#   code_weights the final code's weight branch as written: sigma_o x sqrt(0.5 fan_in),
#                u_max / fan_in, sigma 0 gives scale 1
FORMULAS = ("paper", "code", "code_weights")


# -- the per-layer scale formula ---------------------------------------------------------------
@functools.cache  # one threshold per run: computed once, not per layer per step
def erfinv_sqrt2(threshold: float) -> float:
    """sqrt(2) * erfinv(T): P(|X| < a) = T for X ~ N(0, sigma^2) at a = sigma * this."""
    return (
        math.sqrt(2.0) * torch.special.erfinv(torch.tensor(threshold, dtype=torch.float64)).item()
    )


def layer_scale_exponent(
    ms_g: float,
    g_max: float,
    g_min: float,
    ms_w: float,
    w_max: float,
    w_min: float,
    fan_in: int,
    prev_scale: float,
    threshold: float,
    scale_upper_bound: float,
    accum_upper_bound: float,
    formula: str = "paper",
    mean_g: float = 0.0,
    var_g: float | None = None,
) -> int:
    """log2 of the layer's scale s (approx_range) by ``formula`` (FORMULAS).

    The statistics are those of the gradient *as it arrives* at the layer (already carrying the
    accumulated scale ``prev_scale``) and of the weights: ``ms_*`` is the mean square
    (sigma^2 + mu^2), ``*_max``/``*_min`` the extreme elements, ``mean_g`` the gradient's mean
    and ``var_g`` its variance computed from the deviations themselves (read only by ``code``;
    without it the variance is ms_g - mean_g^2, which cancels on near-constant gradients).
    """
    if formula != "paper":
        if var_g is None:
            var_g = max(ms_g - mean_g * mean_g, 0.0)
        s = _code_scale(var_g, g_max, g_min, ms_g, ms_w, w_max, w_min, fan_in, threshold, formula)
        s = min(s, scale_upper_bound, accum_upper_bound / prev_scale)  # their bound_by_heuristics
        return math.floor(math.log2(s))
    # A gradient that underflowed entirely has zero statistics: both bounds are then infinite
    # and the caps decide, as in the reference (its divisions by zero give inf).
    sigma_o = math.sqrt(ms_g * ms_w)  # std of one product term g_i*w_ij, modelled as zero-mean
    # the scale at which a fraction T of the product terms would fall below u_min
    s_uf = U_MIN / (sigma_o * erfinv_sqrt2(threshold)) if sigma_o > 0 else math.inf
    s = max(s_uf, 1.0)  # never below 1 for underflow reasons
    o_max = max(abs(g_max * w_max), abs(g_min * w_min), abs(g_max * w_min), abs(g_min * w_max))
    if o_max > 0:
        # worst case: fan_in terms of the largest product summed must stay below u_max (may be < 1)
        s = min(s, (U_MAX / fan_in) / o_max)
    s = min(s, scale_upper_bound, accum_upper_bound / prev_scale)  # the heuristic caps
    return math.floor(math.log2(s))  # a power of two, rounded down: scaling is exact


def _code_scale(
    var_g: float,
    g_max: float,
    g_min: float,
    ms_g: float,
    ms_w: float,
    w_max: float,
    w_min: float,
    fan_in: int,
    threshold: float,
    formula: str,
) -> float:
    """The unbounded scale of the authors' final code (gradient-scaling @911ef2d,
    ada_loss/chainer_impl/ada_loss.py get_loss_scale_by_approx_range), before its caps."""
    if formula == "code":  # W=None: the gradient's own spread and extreme
        sigma = math.sqrt(var_g)  # numpy's std (population), from the deviations
        o_max, u_max = max(abs(g_max), abs(g_min)), CODE_U_MAX
    else:  # code_weights: the product model, widened by the fan-in ("assuming ReLU")
        sigma = math.sqrt(ms_g * ms_w) * math.sqrt(0.5 * fan_in)
        o_max = max(abs(g_max * w_max), abs(g_min * w_min), abs(g_max * w_min), abs(g_min * w_max))
        u_max = CODE_U_MAX / fan_in
    if sigma == 0:  # their early return: an all-zero (or constant) gradient keeps scale 1
        return 1.0
    s = max(CODE_U_MIN / (sigma * erfinv_sqrt2(threshold)), 1.0)
    return min(s, u_max / o_max) if o_max > 0 else s


def fan_in(module: nn.Module) -> int:
    """Number of terms summed per element of the *backward* (input-gradient) dot product."""
    if isinstance(module, nn.Linear):
        return module.weight.shape[0]
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        return module.weight.shape[1] * math.prod(module.weight.shape[2:])
    if isinstance(module, nn.modules.conv._ConvNd):
        return module.weight.shape[0] // module.groups * math.prod(module.weight.shape[2:])
    if isinstance(module, nn.RNNBase):
        return module.weight_ih_l0.shape[0]  # the gate rows (4H for an LSTM)
    raise TypeError(type(module).__name__)


# -- autograd plumbing -------------------------------------------------------------------------
class _InCell:
    """The factor of one layer's private edge into its input (set by the plan). ``seq``: its
    place among its scaler's input edges since that scaler's last plan."""

    __slots__ = ("factor", "owner", "seq")

    def __init__(self, owner: AdaptiveScaler, seq: int):
        self.factor = 1.0
        self.owner, self.seq = owner, seq


class _OutCell:
    """One call of a layer: the factor for its incoming gradient, and whether to record stats.
    ``index``: which output of the autograd node is the layer's; ``seq``: the call's place among
    its scaler's layer calls since the last plan."""

    __slots__ = ("layer", "index", "seq", "factor", "record_scale")

    def __init__(self, layer: _Layer, index: int, seq: int):
        self.layer, self.index, self.seq = layer, index, seq
        self.factor = 1.0
        self.record_scale: float | None = None  # the planned scale of the gradient, when recording


class _Rescale(torch.autograd.Function):
    """Identity forward; backward multiplies this one consumer's gradient contribution."""

    @staticmethod
    def forward(ctx, x, cell):
        ctx.mpt_in_cell = cell  # the plan finds the cell on the graph node (ctx is the node)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        f = ctx.mpt_in_cell.factor
        return (grad if f == 1.0 else grad * f), None


def _scale_edge(slot: int, cell: _InCell, grad_inputs, grad_outputs):
    """Post-hook on the node that takes a layer's input (its convolution or matrix product, or
    autocast's cast of the input inside the layer): multiply the gradient it passes to the
    input, as ``_Rescale``'s backward does, before autograd adds it to the input's other
    consumers'. No view in the forward and no node of its own: what ``_Rescale`` costs every
    step, saved."""
    f = cell.factor
    if f == 1.0 or grad_inputs[slot] is None:
        return None
    return tuple(g * f if i == slot else g for i, g in enumerate(grad_inputs))


class _EdgeNode:
    """What the walk sees in place of a direct edge (``_scale_edge``): a node between the
    layer's node and the input's producer, as a ``_Rescale`` node would be, so that the tape is
    the one ``_Rescale`` gives."""

    __slots__ = ("mpt_in_cell", "next_functions")

    def __init__(self, cell: _InCell, producer: tuple):
        self.mpt_in_cell, self.next_functions = cell, (producer,)


# the layers whose autograd node takes their input itself (a convolution that pads with zeros
# inside its own kernel, not through an F.pad node before it; a linear layer on a matrix): their
# input edge needs no node of its own
DIRECT = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
# {id(node): (node, slot, cell)}: the direct edges of the forwards not yet planned, of every
# scaler (a GAN's generator loss runs through the discriminator's layers); each scaler drops its
# own at its plan, as it drops its layer outputs
_DIRECT_EDGES: dict[int, tuple[object, int, _InCell]] = {}


def _children(node) -> list:
    """A node's producers as the walk reads them: a direct edge's slot through its
    ``_EdgeNode``."""
    nexts = list(node.next_functions)
    direct = _DIRECT_EDGES.get(id(node))
    if direct is not None:
        _, slot, cell = direct
        nexts[slot] = (_EdgeNode(cell, nexts[slot]), 0)
    return [c for c, _ in nexts if c is not None]


def _scale_incoming(cell: _OutCell, grads):
    """Pre-hook on the node that produced a layer's output: record statistics, multiply by s_L."""
    if cell.record_scale is not None:
        g = grads[cell.index] if cell.index < len(grads) else None
        if g is not None:
            cell.layer.g_scale = (cell.record_scale, g.numel())
            owner = cell.layer.owner
            if owner.formula != "code":  # kept to the end of the backward: _reduce_retained
                owner._retained[cell.layer] = g
            else:
                cell.layer.g_stats = _code_statistics(g)
    if cell.factor == 1.0:
        return None
    return tuple(None if g is None else g * cell.factor for g in grads)


def _code_statistics(g: Tensor) -> Tensor:
    """Raw [|g|_2, max g, min g, sum g, sum (g - mean)^2] of one gradient, for the ``code``
    formula, which reads std(g) from the deviations, as numpy's std does (E[g^2] - mean^2 cancels
    on near-constant gradients): an FP32 copy of g for this formula alone. No host sync (read at
    the next plan); the plan squares the norm, and divides by the scale g carries and its size."""
    with torch.no_grad():
        lo, hi = torch.aminmax(g)
        norm = torch.linalg.vector_norm(g, dtype=torch.float32)
        total = g.sum(dtype=torch.float32)
        deviations = g.float() - total / g.numel()
        m2 = torch.linalg.vector_norm(deviations).square()
        return torch.stack([norm, hi, lo, total, m2])  # promoted to FP32


class _Layer:
    """One weighted layer: its current exponent, last gradient statistics and history."""

    def __init__(self, name: str, module: nn.Module, owner: AdaptiveScaler, index: int = 0):
        self.name, self.module, self.owner = name, module, owner
        self.index = index  # its place among the owner's layers
        self.weights = [
            p for n, p in module.named_parameters(recurse=False) if n.startswith("weight")
        ]
        self.fan_in = fan_in(module)
        self.weight_numel = sum(w.numel() for w in self.weights)
        # [E g^2, max g, min g, E W^2, max W, min W] of the true (unscaled) gradient and the
        # weights at the last recomputation; s is re-derived from them at every plan
        self.stats: list[float] | None = None
        self.applied: int | None = None  # log2 s applied in the last plan (after the caps)
        self.accum: int | None = None  # log2 of the accumulated scale below the layer, last plan
        self.min_exp: int | None = None
        self.max_exp: int | None = None
        # the last recorded gradient's raw statistics on the device, not yet read: (|g|_2,
        # max|g|) as two FP32 scalars (a tuple), or a row [|g|_2, max g, min g, ...] (the code
        # formula's five; a checkpoint's three)
        self.g_stats: tuple[Tensor, Tensor] | Tensor | None = None
        self.g_scale: tuple[float, int] = (1.0, 1)  # (the scale g carried, g's size)
        # a plain convolution or linear layer: its own node takes its input, so its input edge
        # is a post-hook there (_scale_edge) instead of a _Rescale node; ``edge``: the call in
        # progress's input cell, from the forward pre-hook to the forward hook
        self.direct = type(module) in DIRECT and getattr(module, "padding_mode", "zeros") == "zeros"
        self.edge: _InCell | None = None


class _Conflict(Exception):
    pass


class _Groups:
    """Union-find over integer log2 scales. A group is a set of graph nodes whose scales are
    fixed relative to each other; its base is free until pinned (a weighted layer needs its
    incoming scale to be final before it computes s_L, the loss's group starts pinned)."""

    def __init__(self):
        self.parent: list[int] = []
        self.delta: list[int] = []  # base(g) = base(parent) + delta
        self.base: list[int] = []  # meaningful at roots
        self.pinned: list[bool] = []

    def new(self, base: int, pinned: bool = False) -> int:
        self.parent.append(len(self.parent))
        self.delta.append(0)
        self.base.append(base)
        self.pinned.append(pinned)
        return len(self.parent) - 1

    def find(self, g: int) -> tuple[int, int]:
        d = 0
        while self.parent[g] != g:
            d += self.delta[g]
            g = self.parent[g]
        return g, d

    def value(self, g: int, off: int) -> int:
        r, d = self.find(g)
        return self.base[r] + d + off

    def resolve(self, contribs: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """All contributions to one node must arrive at one scale: shift the free groups to the
        pinned value (or, if none is pinned, to the smallest: rescaling down cannot overflow),
        merge them, and return (group, offset) of the node."""
        by_root: dict[int, set] = defaultdict(set)
        for g, off in contribs:
            r, d = self.find(g)
            by_root[r].add(d + off)
        pinned = {self.base[r] + o for r, offs in by_root.items() if self.pinned[r] for o in offs}
        if len(pinned) > 1:
            raise _Conflict(f"fixed scales {sorted(pinned)} meet")
        target = (
            pinned.pop()
            if pinned
            else min(self.base[r] + o for r, offs in by_root.items() for o in offs)
        )
        roots = list(by_root)
        for r in roots:
            if not self.pinned[r]:
                if len(by_root[r]) > 1:
                    raise _Conflict(f"one group arrives at offsets {sorted(by_root[r])}")
                self.base[r] = target - next(iter(by_root[r]))
        keep = next((r for r in roots if self.pinned[r]), roots[0])
        for r in roots:
            if r != keep:
                self.parent[r] = keep
                self.delta[r] = self.base[r] - self.base[keep]
        return keep, target - self.base[keep]


# -- the plan's walk of one graph structure, kept for reuse -------------------------------------
# The roles of the graph nodes the solve acts on; every other node has one incoming gradient and
# passes its scale on unchanged, so the tape leaves it out.
_JOIN, _LAYER, _EDGE, _LEAF = range(4)
_LOSS = -1  # a source: the loss itself, whose gradient starts at scale 2^0 (pinned)
AUDIT_EVERY = 100  # a reused tape is compared with a fresh walk on its 1st, 101st, ... reuse


@dataclasses.dataclass(eq=False)
class _Tape:
    """The autograd graph below one loss, reduced to what the solve needs, in solve order.

    ``entries[i] = (role, ref, sources)``: ``sources`` are the tape positions (or ``_LOSS``)
    whose scales arrive at node i; ``ref`` is, for a layer's output, the call's ``seq``; for an
    input edge, an index into ``edges`` (owner scaler, the edge's place in its owner's list of
    edges counted from the end); for a leaf, an index
    into ``params``. The graph is the same from step to step for a fixed network, but its
    nodes and cells are new objects every forward: the tape names them by forward order.
    """

    entries: list[tuple[int, int, tuple[int, ...]]]
    edges: list[tuple[AdaptiveScaler, int]]
    params: list[Tensor]
    reuses: int = 0

    def same_as(self, other: _Tape) -> bool:
        return (
            self.entries == other.entries
            and [(id(o), s) for o, s in self.edges] == [(id(o), s) for o, s in other.edges]
            and [id(p) for p in self.params] == [id(p) for p in other.params]
        )


def _walk(root, out_cells: dict[int, _OutCell]) -> _Tape:
    """Record the solve order of the graph below ``root``: every node after all its consumers
    (a count of consumers first, then Kahn's order with a stack).

    Nodes are named by ``id()``, which is only stable while the Python object lives: up to torch
    2.12 the object of a C++ node is freed with its last reference and made anew (with a new id)
    at the next ``next_functions``, so the walk holds every node it meets (``children``) until it
    ends, and reads each node's children once."""
    children: dict[int, list] = {}
    consumers: dict[int, int] = defaultdict(int)
    stack = [root]
    while stack:
        n = stack.pop()
        kids = children[id(n)] = _children(n)
        for child in kids:
            consumers[id(child)] += 1
            if id(child) not in children:
                children[id(child)] = []  # a placeholder: seen, to be read when popped
                stack.append(child)
    tape = _Tape([], [], [])
    arriving: dict[int, list[int]] = defaultdict(list)
    arriving[id(root)].append(_LOSS)
    ready = [root]
    while ready:
        node = ready.pop()
        sources = arriving.pop(id(node))
        cell = out_cells.get(id(node))
        in_cell = getattr(node, "mpt_in_cell", None)
        if cell is not None:
            role, ref = _LAYER, cell.seq
        elif isinstance(in_cell, _InCell):  # this scaler's edge or another's (a GAN's D)
            role, ref = _EDGE, len(tape.edges)
            # counted from the end of its owner's list: the owner's latest forward is this one's
            # (another scaler's list is emptied at that scaler's own plans, not at this one's)
            tape.edges.append((in_cell.owner, in_cell.seq - len(in_cell.owner._in_cells)))
        elif hasattr(node, "variable"):  # AccumulateGrad: a parameter's gradient lands here
            role, ref = _LEAF, len(tape.params)
            tape.params.append(node.variable)
        elif len(sources) > 1:
            role, ref = _JOIN, 0
        else:
            role = None
        if role is None:
            here = sources[0]  # a pass-through node: its consumers see its producer's scale
        else:
            here = len(tape.entries)
            tape.entries.append((role, ref, tuple(sources)))
        for child in children[id(node)]:
            arriving[id(child)].append(here)
            consumers[id(child)] -= 1
            if consumers[id(child)] == 0:
                ready.append(child)
    return tape


# -- the scaler --------------------------------------------------------------------------------
@register_scaler(
    "adaptive",
    reads=(
        "growth_interval",
        "adaptive_underflow_threshold",
        "adaptive_scale_upper_bound",
        "adaptive_accum_upper_bound",
        "adaptive_update_interval",
        "adaptive_method",
        "adaptive_formula",
        "adaptive_plan_cache",
    ),
)
class AdaptiveScaler(LossScaler):
    """Layer-wise scales from gradient and weight statistics (Zhao et al. 2019).

    ``scale`` (what the trainer logs as loss_scale) is the largest accumulated scale any layer's
    gradient carried in the last step. On a non-finite gradient the step is skipped (the policy's
    skip path), the accumulation cap is halved and the scales are recomputed at the next step;
    after ``growth_interval`` clean steps the cap doubles back towards
    ``adaptive_accum_upper_bound``. A cap of 1 that still overflows ``floor_patience`` times in a
    row ends the run as Diverged.
    """

    # the plan is made on the host from values that leave the device at each update without a
    # wait (the overflow flag, with the statistics where the step recorded them) and are read at
    # the next plan, once landed (_settle): update() itself reads nothing
    sync_free = True
    # the largest accumulated scale moves with each plan, but the host sets it: the journal's
    # rows get it as a host note, not as a device copy
    moves = False

    def __init__(self, cfg, init_scale: float | None, device: torch.device | str = "cpu"):
        super().__init__(cfg, 1.0, device)
        self.growth_tracker = 0  # host-side: the cap moves on the host
        a = cfg
        self.threshold = float(a.adaptive_underflow_threshold)
        self.formula = str(a.adaptive_formula)
        erfinv_sqrt2(self.threshold)  # now: its torch.tensor(...).item() stays out of the steps
        self.scale_upper_bound = float(a.adaptive_scale_upper_bound)
        self.max_cap_exp = math.floor(math.log2(a.adaptive_accum_upper_bound))
        self.cap_exp = self.max_cap_exp  # log2 of the current accumulation cap
        self.interval = int(a.adaptive_update_interval)
        self.layers: dict[str, _Layer] = {}
        self._pairs: list[tuple[Tensor, Tensor]] = []  # (model parameter, optimizer parameter)
        # what the forward did since the last plan: layer-output nodes by id (strong references,
        # so an id cannot be reused), the layer calls and input edges in order, and the key
        self._nodes: dict[int, tuple[object, _OutCell]] = {}
        self._out_cells: list[_OutCell] = []
        self._direct_ids: list[int] = []  # this scaler's entries in _DIRECT_EDGES
        self._in_cells: list[_InCell] = []
        self._forward: list[tuple] = []
        self._param_exp: dict[int, int] = {}  # id(model parameter) -> log2 scale of its gradient
        self.iteration = 0  # plans made
        self.updates = 0  # recomputations of the layer scales
        self.fallback_steps = 0
        self.force = False  # recompute at the next plan (after an overflow)
        self._warned = False
        # plans reuse the walk of a graph they have seen (see _tape_for); False: walk every step
        self.plan_cache = bool(a.adaptive_plan_cache)
        self._tapes: dict[tuple, _Tape] = {}
        self.plan_walks = 0  # full walks of the autograd graph (first sight, audits)
        self.plan_reuses = 0  # plans made from a kept tape, without a walk
        self.plan_waits = 0  # plans that waited for the last update's copy to land (a GPU's)
        self._host_scale = 1.0  # what self._scale holds (set on the host by each plan)
        # the output gradients a recording backward has passed, kept until its end (_retain)
        self._retained: dict[_Layer, Tensor] = {}
        # (what it was read from, the values, their columns): statistics read with the overflow
        # flag at the last update, for the next plan (_send_ahead, _settle)
        self._ahead: tuple[tuple, list[float], int] | None = None
        # the last update's copy on its way to the host: (its _ahead_key or None, the copy, cols)
        self._pending: tuple[tuple | None, _InFlight, int] | None = None

    # -- setup -------------------------------------------------------------------------------
    def attach(self, model: nn.Module, names: list[str], params: list[Tensor]) -> None:
        by_name = dict(model.named_parameters())
        self._pairs += [(by_name[n], p) for n, p in zip(names, params)]
        for mname, m in model.named_modules():
            if not isinstance(m, WEIGHTED) or not any(
                p.requires_grad for p in m.parameters(recurse=False)
            ):
                continue
            name = mname or type(m).__name__
            while name in self.layers:  # a second model attached to a shared scaler
                name = "+" + name
            layer = _Layer(name, m, self, index=len(self.layers))
            self.layers[name] = layer
            m.register_forward_pre_hook(functools.partial(self._wrap_input, layer))
            m.register_forward_hook(functools.partial(self._hook_output, layer))

    def _reduce_retained(self) -> None:
        """The statistics of the output gradients the last recording backward passed, taken by
        two multi-tensor reductions over all of them: |g|_2 accumulated in FP32 and max|g|. The
        formulas read the gradient's extremes only through max(|g_max|, |g_min|) (the largest
        product |g w| is max|g| max|W|), so max|g| gives their scale bit for bit; two ops for
        all the layers, where a norm and an ``aminmax`` per layer took two each.

        Why the gradients are kept: a layer's output gradient lives only while the backward
        passes the layer; kept, they are reduced together here, at the end of the backward
        (``unscale_``; the next forward's first layer where no unscale follows, as in gradient
        accumulation). Each one replaces, in memory, the saved activation its batch norm or
        activation frees as the backward passes (of its size or larger), so the backward's peak
        is about that of its start."""
        if not self._retained:
            return
        layers, grads = list(self._retained), list(self._retained.values())
        self._retained = {}
        with torch.no_grad():
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
            largest = torch._foreach_norm(grads, math.inf, dtype=torch.float32)
        for layer, norm, amax in zip(layers, norms, largest):
            layer.g_stats = (norm, amax)

    def _wrap_input(self, layer: _Layer, module, args):
        layer.edge = None
        if (
            not torch.is_grad_enabled()
            or not args
            or not torch.is_tensor(args[0])
            or not args[0].requires_grad
        ):
            return None  # evaluation, or the network's input: no gradient to rescale
        x = args[0]
        made_by = self._nodes.get(id(x.grad_fn))
        # for the cache key: where the input comes from (a layer call of this forward, or an op)
        self._forward.append((layer.name, made_by[1].seq if made_by else type(x.grad_fn)))
        cell = _InCell(self, len(self._in_cells))
        self._in_cells.append(cell)
        # a linear layer's own node takes its input only on a matrix (on more dimensions, a
        # reshape comes between)
        matrix_or_conv = x.dim() == 2 or not isinstance(module, nn.Linear)
        if layer.direct and x.grad_fn is not None and matrix_or_conv:
            layer.edge = cell  # hooked on the layer's node once it exists (_hook_edge)
            return None
        return (_Rescale.apply(x, cell),) + tuple(args[1:])

    def _hook_edge(self, layer: _Layer, node, x: Tensor, cell: _InCell) -> None:
        """The layer's input edge as a post-hook (``_scale_edge``) on the node that takes the
        layer's input: the layer's own, or, where autocast cast the input inside the layer, that
        cast's (made for this call alone: autocast caches the casts of parameters only), so the
        factor multiplies the gradient in the input's dtype, where ``_Rescale`` multiplied it."""
        producer = x.grad_fn  # held: its Python object stays the one next_functions gives

        def slot_in(n) -> int | None:
            edges = enumerate(n.next_functions)
            return next((i for i, (f, nr) in edges if f is producer and nr == x.output_nr), None)

        host, slot = node, slot_in(node)
        if slot is None:
            casts = [f for f, _ in node.next_functions if type(f).__name__ == "ToCopyBackward0"]
            host, slot = next(((f, i) for f in casts if (i := slot_in(f)) is not None), (None, 0))
        if host is None:
            raise RuntimeError(
                f"adaptive loss scaling: the autograd node of layer {layer.name!r} "
                f"({type(node).__name__}) does not take the layer's input (torch "
                f"{torch.__version__}); this is a bug of mpt-repro: please report it"
            )
        host.register_hook(functools.partial(_scale_edge, slot, cell))
        _DIRECT_EDGES[id(host)] = (host, slot, cell)
        self._direct_ids.append(id(host))

    def _hook_output(self, layer: _Layer, module, args, out):
        if self._retained:  # a backward with no unscale_ after it (gradient accumulation)
            self._reduce_retained()
        y = out[0] if isinstance(out, (tuple, list)) else out
        if not torch.is_tensor(y) or y.grad_fn is None:
            return None
        node = y.grad_fn
        cell = _OutCell(layer, y.output_nr, len(self._out_cells))
        node.register_prehook(functools.partial(_scale_incoming, cell))
        edge, layer.edge = layer.edge, None
        if edge is not None:
            self._hook_edge(layer, node, args[0], edge)
        self._nodes[id(node)] = (node, cell)
        self._out_cells.append(cell)
        self._forward.append((layer.name, y.output_nr, type(node)))
        return None

    # -- one step: plan, backward, unscale, update -------------------------------------------
    def scale_loss(self, loss: Tensor) -> Tensor:
        loss = loss.float()
        self._settle()  # the last update's flag and statistics, before the plan needs them
        if loss.grad_fn is not None:
            self._plan(loss.grad_fn)
        self._nodes, self._out_cells, self._in_cells, self._forward = {}, [], [], []
        for i in self._direct_ids:
            _DIRECT_EDGES.pop(i, None)
        self._direct_ids = []
        self.iteration += 1
        return loss  # the gradient reaching the loss has scale 2^0; the layers scale from there

    def _due_recompute(self) -> bool:
        # the first statistics arrive with the first backward: recompute at plan 2 in any case
        return self.force or self.iteration == 1 or self.iteration % self.interval == 0

    def _due_record(self) -> bool:
        return self.iteration == 0 or self.force or (self.iteration + 1) % self.interval == 0

    def _plan(self, root) -> None:
        """Give every node of the graph below the loss one incoming scale; fill in the layers'
        factors, the input edges' factors and the parameters' scales."""
        if self._due_recompute():
            self._recompute()
        tape = self._tape_for(root)
        try:
            self._solve(tape, self._due_record())
        except _Conflict as e:
            # Should not happen on the supported networks; never sum mixed scales: fall back to
            # one uniform scale (2^0, i.e. no scaling) for this step and say so once.
            self.fallback_steps += 1
            if not self._warned:
                warnings.warn(
                    f"adaptive loss scaling: inconsistent scales at a join ({e}); this step runs "
                    "unscaled",
                    stacklevel=2,
                )
                self._warned = True
            for cell in self._out_cells:
                cell.factor, cell.record_scale = 1.0, None
            for role, ref, _ in tape.entries:
                if role == _EDGE:
                    self._edge_cell(tape, ref).factor = 1.0
            self._param_exp = {}

    def _tape_for(self, root) -> _Tape:
        """This step's graph as a tape. Walking the autograd graph in Python costs about as much
        as the rest of a step's Python, so a tape is kept per forward key: the layer calls in
        order, each with the node type of its output and where its input came from. A network
        whose graph changes between layers while its layer calls stay the same would defeat the
        key, so a kept tape is compared with a fresh walk on its 1st and every AUDIT_EVERY-th
        reuse; a mismatch turns the cache off for the run (with a warning)."""
        key = (type(root), *self._forward)
        kept = self._tapes.get(key) if self.plan_cache else None
        if kept is not None:
            kept.reuses += 1
            if kept.reuses % AUDIT_EVERY != 1:
                self.plan_reuses += 1
                return kept
        tape = _walk(root, {i: cell for i, (_, cell) in self._nodes.items()})
        self.plan_walks += 1
        if self._out_cells and not any(role == _LAYER for role, _, _ in tape.entries):
            # every scale would stay 1 and the run would look like a working adaptive run
            raise RuntimeError(
                f"adaptive loss scaling: the walk of the autograd graph below the loss found none "
                f"of the {len(self._out_cells)} layer outputs this forward made, so no layer "
                f"could be scaled (torch {torch.__version__}); this is a bug of mpt-repro: "
                "please report it with the run's mpt-run.log"
            )
        if kept is not None and not kept.same_as(tape):
            self.plan_cache = False
            self._tapes.clear()
            warnings.warn(
                "adaptive loss scaling: the autograd graph changed while the layer calls stayed "
                "the same; the plan is now made from a walk of the graph every step (slower)",
                stacklevel=3,
            )
        elif kept is None and self.plan_cache:
            if len(self._tapes) >= 32:  # a network whose calls vary (e.g. stochastic depth)
                self._tapes.pop(next(iter(self._tapes)))
            self._tapes[key] = tape
        return tape

    def _edge_cell(self, tape: _Tape, ref: int) -> _InCell:
        owner, seq = tape.edges[ref]
        return owner._in_cells[seq]

    def _solve(self, tape: _Tape, record: bool) -> None:
        """Replay the tape with this step's exponents: one union-find over power-of-two scales."""
        groups = _Groups()
        loss = (groups.new(0, pinned=True), 0)
        at: list[tuple[int, int]] = []  # (group, offset) each tape entry passes on
        edges, cap = [], self.cap_exp
        param_exp: dict[int, tuple[int, int]] = {}
        for role, ref, sources in tape.entries:
            arriving = [loss if s == _LOSS else at[s] for s in sources]
            g, off = groups.resolve(arriving) if len(arriving) > 1 else arriving[0]
            out = (g, off)
            if role == _LAYER:
                cell = self._out_cells[ref]
                r, d = groups.find(g)
                groups.pinned[r] = True  # s_L depends on the incoming scale: it is final now
                prev = groups.base[r] + d + off
                layer = cell.layer
                e = self._exponent(layer, prev, cap)
                cell.factor = 2.0**e
                cell.record_scale = 2.0**prev if record else None
                layer.applied, layer.accum = e, prev + e
                layer.min_exp = e if layer.min_exp is None else min(layer.min_exp, e)
                layer.max_exp = e if layer.max_exp is None else max(layer.max_exp, e)
                out = (g, off + e)
            elif role == _EDGE:
                # this consumer's edge: its output starts a free group, agreed at the join below
                out = (groups.new(groups.value(g, off)), 0)
                edges.append((self._edge_cell(tape, ref), g, off, out[0]))
            elif role == _LEAF:
                param_exp[id(tape.params[ref])] = (g, off)
            at.append(out)
        for cell, g, off, g_out in edges:
            cell.factor = 2.0 ** (groups.value(g_out, 0) - groups.value(g, off))
        self._param_exp = {p: groups.value(g, off) for p, (g, off) in param_exp.items()}
        largest = 2.0 ** max(
            [lay.accum for lay in self.layers.values() if lay.accum is not None], default=0
        )
        if largest != self._host_scale:  # a launch only when it changes (the host knows it)
            self._scale.fill_(largest)
            self._host_scale = largest

    def _recompute(self) -> None:
        """The layers' statistics from the recorded gradients' and the current weights': read
        ahead with the last update's overflow flag (``_send_ahead``), or read now (one sync)."""
        self._reduce_retained()
        have = [lay for lay in self.layers.values() if lay.g_stats is not None]
        if not have:
            return
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == self._ahead_key(have):
            values, cols = ahead[1], ahead[2]
        else:
            with torch.no_grad():
                table, cols = self._statistics_table(have, None)
                values = table.tolist()
        self.force = False
        self.updates += 1
        self._set_stats(have, values, cols)

    def _ahead_key(self, have: list[_Layer]) -> tuple:
        """What a read-ahead was read from: the statistics' objects (a later backward makes new
        ones) and the weights' in-place versions (a step or a load after it changes them)."""
        return (
            tuple(id(lay.g_stats) for lay in have),
            tuple(w._version for lay in have for w in lay.weights),
        )

    def _statistics_table(self, have: list[_Layer], lead: Tensor | None) -> tuple[Tensor, int]:
        """One FP32 vector for the one copy to the host: ``lead`` (the overflow flag) if given,
        the gradients' statistics (``_gradient_parts``), then each weight's |W|_2 and max|W|:
        multi-tensor kernels over all the weights (the formulas read the weights' extremes only
        through max|W|, as the gradient's)."""
        weights = [w for lay in have for w in lay.weights]
        w_parts = [
            *torch._foreach_norm(weights, 2, dtype=torch.float32),
            *torch._foreach_norm(weights, math.inf, dtype=torch.float32),
        ]
        g_parts, cols = self._gradient_parts(have)
        head = [] if lead is None else [lead if lead.dim() == 0 else lead.reshape(())]
        if cols:  # one row per layer, flattened
            return torch.cat([torch.stack([*head, *w_parts]), g_parts[0]]), cols
        return torch.stack([*head, *w_parts, *g_parts]), cols  # sums of squares, maxima

    def _set_stats(self, have: list[_Layer], values: list[float], cols: int) -> None:
        """Each layer's [E g^2, max g, min g, E W^2, max W, min W, (mean, variance)] of the true
        gradient from the host copy; an overflowing step's (non-finite) keep the old ones."""
        w = sum(len(lay.weights) for lay in have)
        w_norms, w_amax, g_values = values[:w], values[w : 2 * w], values[2 * w :]
        n = len(have)
        if cols:
            g_rows = [g_values[cols * k : cols * (k + 1)] for k in range(n)]
        else:  # [E g^2 sum, max|g|, -max|g|]: max g and min g as far as the formulas see them
            g_rows = [[g_values[k], g_values[n + k], -g_values[n + k]] for k in range(n)]
        first = 0  # the layer's first weight tensor in the w_* lists
        for layer, (sumsq, g_max, g_min, *g_sum) in zip(have, g_rows):
            g_sum, g_m2 = g_sum[:1], g_sum[1:]
            sc, numel = layer.g_scale
            last = first + len(layer.weights)
            ms_w = sum(x * x for x in w_norms[first:last]) / layer.weight_numel
            w_max = max(w_amax[first:last])
            first = last
            st = [sumsq / numel / (sc * sc), g_max / sc, g_min / sc, ms_w, w_max, -w_max]
            st += [x / numel / sc for x in g_sum]  # the mean, when the formula reads it
            st += [x / numel / (sc * sc) for x in g_m2]  # and the variance
            layer.g_stats = None
            if all(math.isfinite(v) for v in st):  # an overflowing step's: keep the old ones
                layer.stats = st

    def _gradient_parts(self, have: list[_Layer]) -> tuple[list[Tensor], int]:
        """The layers' gradient statistics, ready for the one copy to the host: their sums of
        squares and maxima as FP32 scalars (cols 0), or, where a layer holds a row (the code
        formula, a checkpoint) or the ranks must agree, one flattened table of ``cols`` columns.

        Under DDP every rank must plan the same scales: DDP averages gradients that must all
        carry one scale. Gradient statistics differ per rank (its own batch shard): mean of the
        sums of squares, max of the maxima, min of the minima (and mean of the sums; the last
        column, the sum of squared deviations from each rank's own mean, its within-rank spread,
        mean too). Weights are identical."""
        from mpt_repro import distributed

        if not distributed.is_distributed() and all(isinstance(x.g_stats, tuple) for x in have):
            norms = [lay.g_stats[0] for lay in have]
            # squared in FP32, as the table's column is below: the same numbers
            return [*torch._foreach_mul(norms, norms), *(lay.g_stats[1] for lay in have)], 0
        device = have[0].weights[0].device
        rows = [
            torch.stack([x.g_stats[0], x.g_stats[1], -x.g_stats[1]])
            if isinstance(x.g_stats, tuple)
            else x.g_stats.to(device)
            for x in have
        ]
        grads = torch.stack(rows)
        grads[:, 0] = grads[:, 0].square()  # sums of squares (one kernel for all layers)
        cols = grads.shape[1]
        distributed.all_reduce_columns_(grads, ["mean", "max", "min", "mean", "mean"][:cols])
        return [grads.flatten()], cols

    def _exponent(self, layer: _Layer, prev: int, cap: int) -> int:
        """log2 s_L for a gradient arriving with scale 2^prev, under the accumulation cap 2^cap."""
        if layer.stats is None:  # no statistics yet: pass through (s = 1), still under the cap
            return min(0, cap - prev)
        ms_g, g_max, g_min, ms_w, w_max, w_min, *mean = layer.stats  # mean, variance (code)
        p = 2.0**prev  # the formula wants the gradient as it arrives, i.e. carrying its scale
        return layer_scale_exponent(
            ms_g * p * p,
            g_max * p,
            g_min * p,
            ms_w,
            w_max,
            w_min,
            layer.fan_in,
            p,
            self.threshold,
            self.scale_upper_bound,
            2.0**cap,
            formula=self.formula,
            mean_g=mean[0] * p if mean else 0.0,
            var_g=mean[1] * p * p if len(mean) > 1 else None,  # none in older checkpoints
        )

    def unscale_(self, grads: Sequence[Tensor], found: Tensor) -> None:
        """Each gradient by its own accumulated scale (grouped by scale for the fused kernel)."""
        self._reduce_retained()  # the backward is over: its gradients' statistics, together
        mine = [
            (p.grad, self._param_exp.get(id(m), 0)) for m, p in self._pairs if p.grad is not None
        ]
        if len(mine) != len(grads):
            raise RuntimeError(
                "adaptive scaler: the gradients to unscale are not those of its optimizer"
            )
        # each gradient times 2^-e in one multi-tensor multiply (exact: powers of two), then one
        # check of them all: two launches whatever the number of distinct scales
        scaled = [(g, 2.0**-e) for g, e in mine if e != 0]
        if scaled:
            torch._foreach_mul_([g for g, _ in scaled], [f for _, f in scaled])
        unscale_and_check_(grads, self._one, found, self._one)

    def _host_scale_now(self) -> float | None:
        return self._host_scale

    def compile(self, mode: str) -> None:
        """Nothing to compile: the plan and the cap live on the host (trainer.compile refuses
        this scaler)."""

    def _move(self, found: Tensor, floor: float, before: Tensor | None) -> None:
        self._send_ahead(found)  # the cap moves at the next plan, once the flag has landed

    def _send_ahead(self, found: Tensor) -> None:
        """The overflow flag on its way to the host (the cap moves there), without a wait. Where
        this step's backward recorded statistics, the next plan will recompute the scales from
        them and from the weights as this step left them: both are final now, so they travel in
        the same copy as the flag, and the plan uses them without a read of its own (if neither
        changed in between: ``_ahead_key``)."""
        self._reduce_retained()
        have = [lay for lay in self.layers.values() if lay.g_stats is not None]
        with torch.no_grad():
            if have:
                table, cols = self._statistics_table(have, found.float())
            else:
                table, cols = found.float().reshape(1), 0
        self._pending = (self._ahead_key(have) if have else None, _InFlight(table), cols)

    def _settle(self) -> None:
        """What the last update sent (``_send_ahead``), once it has landed: the accumulation
        cap moves on its overflow flag, and its statistics wait for the next recomputation. On
        a GPU the host waits here only for that copy; the device has the next forward queued
        behind it by then."""
        if self._pending is None:
            return
        key, copy, cols = self._pending
        self._pending = None
        values, waited = copy.values()
        self.plan_waits += waited
        self._ahead = None if key is None else (key, values[1:], cols)
        if values[0]:  # this update's step overflowed: halve the cap, recompute at the next plan
            self.growth_tracker = 0
            self.cap_exp = max(self.cap_exp - 1, 0)
            self.force = True
        else:
            self.growth_tracker += 1
            if self.growth_tracker >= self.cfg.growth_interval and self.cap_exp < self.max_cap_exp:
                self.growth_tracker = 0
                self.cap_exp += 1

    def _host_at_floor(self) -> bool | None:
        self._settle()  # landed at the plan already, unless no plan came since the last update
        return self.cap_exp == 0  # at the floor: a cap of 1 (the cap lives on the host)

    # -- reporting and checkpoints -----------------------------------------------------------
    def layer_scales(self) -> dict[str, float]:
        """{layer: its own scale s applied in the last step} (layers not yet run: 1.0)."""
        return {n: 2.0 ** (lay.applied or 0) for n, lay in self.layers.items()}

    def describe(self, reason: str) -> str:
        return describe(self.cfg)

    def diagnostics(self) -> dict:
        """Per-layer scales for the run record (under diagnostics.adaptive)."""
        self._settle()  # the cap as the last update left it
        return {
            "updates": self.updates,
            "fallback_steps": self.fallback_steps,
            "accum_cap": 2.0**self.cap_exp,
            "plan_walks": self.plan_walks,
            "plan_reuses": self.plan_reuses,
            "plan_waits": self.plan_waits,
            "plan_cache": "on" if self.plan_cache else "off (the graph changed under one key)",
            "layers": {
                n: {
                    "final": 2.0 ** (lay.applied or 0),
                    "min": 2.0 ** (lay.min_exp if lay.min_exp is not None else 0),
                    "max": 2.0 ** (lay.max_exp if lay.max_exp is not None else 0),
                    "accumulated_final": 2.0 ** (lay.accum or 0),
                }
                for n, lay in self.layers.items()
            },
        }

    def state_dict(self) -> dict:
        self._reduce_retained()
        self._settle()  # the cap as the last update left it
        sd = super().state_dict()
        sd.update(
            cap_exp=self.cap_exp,
            host_growth_tracker=self.growth_tracker,
            iteration=self.iteration,
            updates=self.updates,
            fallback_steps=self.fallback_steps,
            plan_waits=self.plan_waits,
            force=self.force,
            layers={
                n: {
                    "stats": lay.stats,
                    "applied": lay.applied,
                    "accum": lay.accum,
                    "min_exp": lay.min_exp,
                    "max_exp": lay.max_exp,
                    "g_stats": _saved_row(lay.g_stats),
                    "g_scale": list(lay.g_scale),
                }
                for n, lay in self.layers.items()
            },
        )
        return sd

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        self._ahead = self._pending = None  # the loaded statistics are read at the next plan
        self._host_scale = self.scale
        self.cap_exp, self.iteration = int(sd["cap_exp"]), int(sd["iteration"])
        self.growth_tracker = int(sd.get("host_growth_tracker", 0))
        self.plan_waits = int(sd.get("plan_waits", 0))  # not in checkpoints before issue 47
        self.updates, self.fallback_steps, self.force = (
            int(sd["updates"]),
            int(sd["fallback_steps"]),
            bool(sd["force"]),
        )
        for n, s in sd["layers"].items():
            if n not in self.layers:
                raise ValueError(
                    f"checkpoint has adaptive loss-scale state for layer {n!r}, which this model "
                    "lacks"
                )
            lay = self.layers[n]
            lay.stats, lay.applied, lay.accum, lay.min_exp, lay.max_exp = (
                s["stats"],
                s["applied"],
                s["accum"],
                s["min_exp"],
                s["max_exp"],
            )
            lay.g_stats = None if s["g_stats"] is None else s["g_stats"].to(lay.weights[0].device)
            lay.g_scale = (1.0, 1)
            if "g_scale" in s:
                lay.g_scale = (float(s["g_scale"][0]), int(s["g_scale"][1]))
            elif lay.g_stats is not None:  # written before g_scale: the finished [E g^2, max, min]
                lay.g_stats[0] = lay.g_stats[0].sqrt()


class _InFlight:
    """A device vector on its way to the host: copied without a wait (into pinned memory on a
    GPU, the trainer's loss copies' way), read once it has landed. On the CPU it is host memory
    already."""

    def __init__(self, table: Tensor):
        self._event = None
        self._host = table
        if table.device.type == "cuda":
            self._host = torch.empty(table.shape, dtype=table.dtype, pin_memory=True)
            self._host.copy_(table, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def values(self) -> tuple[list[float], bool]:
        """The values, and whether the host had to wait for them: on a GPU, for this copy alone
        (not for what the device queued after it)."""
        waited = self._event is not None and not self._event.query()
        if waited:
            self._event.synchronize()
        if self._host.device.type != "cpu":  # a device without the pinned path: a plain read
            return self._host.tolist(), True
        with torch.autograd.profiler.record_function("host:adaptive statistics, landed"):
            return self._host.tolist(), waited


def _saved_row(stats: tuple[Tensor, Tensor] | Tensor | None) -> Tensor | None:
    """A layer's pending gradient statistics as a checkpoint keeps them: the row [|g|_2, max g,
    min g, ...], with max|g| for the extremes where the backward took max|g| alone."""
    if stats is None:
        return None
    if isinstance(stats, tuple):
        stats = torch.stack([stats[0], stats[1], -stats[1]])
    return stats.detach().cpu().clone()


def describe(cfg) -> str:
    return (
        f"adaptive layer-wise loss scaling (Zhao et al. 2019: {cfg.adaptive_method}, "
        f"{cfg.adaptive_formula} formula, underflow threshold "
        f"{cfg.adaptive_underflow_threshold:g}, per-layer cap {cfg.adaptive_scale_upper_bound:g}, "
        "accumulated "
        f"cap {cfg.adaptive_accum_upper_bound:g}, recomputed every {cfg.adaptive_update_interval} "
        "iteration(s))"
    )
