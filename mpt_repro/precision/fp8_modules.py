"""Emulated FP8 training: conv and linear layers whose operands are quantized to 8-bit floats.

`apply_fp8(model, precision_cfg)` gives every nn.Linear, nn.Conv{1,2,3}d and
nn.ConvTranspose{1,2,3}d of the model (exactly those types; subclasses and functional calls are
left alone), except the exempt ones, an FP8 forward and backward:

    forward    y   = conv(Q_act(x), Q_w(W)) + b          (FP32 arithmetic on 8-bit values)
    backward   e   = Q_err(dL/dy)                        (the error, as it enters the GEMMs)
               dx  = conv_input_grad(e, Q_w(W))          (FP32 accumulation, passed on as is)
               dW  = Q_wgrad(conv_weight_grad(e, Q_act(x)))
               db  = Q_wgrad(sum e)

Q_kind is `fp8.quantize` with that kind's format, rounding, overflow and scaling
(`precision.fp8.<weights|activations|errors|weight_grads>`). This is the "direct" method of the
FP8 emulation toolkits (IntelLabs/FP8-Emulation-Toolkit): dot products take 8-bit inputs and
accumulate in FP32. Two simplifications, both documented in docs/fp8.md: the bias is added in
FP32 (as an epilogue), and a layer's output stays FP32 until the next layer quantizes it as its
input, so BatchNorm, ReLU and residual additions between layers see FP32 values (quantizing at
every GEMM input is what changes the GEMMs; quantizing the same value twice with round to nearest
would change nothing).

The layers are changed in place by swapping their class (`FP8Conv2d` is an `nn.Conv2d`): the
parameters, their names, the state_dict and any references to the modules stay the same.
Stochastic rounding draws from generators owned by an `FP8Runtime` shared by a model's layers;
their states are in `fp8_state_dict(model)` so a resumed run continues the same random stream.
"""

from __future__ import annotations

import fnmatch
import logging
import zlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mpt_repro.errors import ConfigError
from mpt_repro.precision import fp8
from mpt_repro.precision.converters import Converter, register_converter

log = logging.getLogger(__name__)


class _Spec:
    """How one tensor kind is quantized (None format: left in FP32)."""

    def __init__(self, cfg):
        name = fp8._name(cfg.format)
        self.fmt = None if name == "none" else fp8.get_format(name)
        self.rounding = fp8._name(cfg.rounding)
        self.overflow = fp8._name(cfg.overflow)
        self.scaled = fp8._name(cfg.scaling) == "tensorwise"

    def __repr__(self) -> str:
        if self.fmt is None:
            return "fp32"
        scaled = "/scaled" if self.scaled else ""
        return f"{self.fmt.name}/{self.rounding}/{self.overflow}{scaled}"


class FP8Runtime:
    """What the FP8 layers of one model share: the per-kind specs and the random streams. The
    optimizer over the model calls it after each step (a converters.StepHook: the FP16 master
    rounding), and keeps its state in checkpoints and its summary in run.json under "fp8"."""

    key = "fp8"

    def __init__(self, f8cfg, seed: int):
        self.specs = {k: _Spec(getattr(f8cfg, k)) for k in fp8.KINDS}
        self.seed = int(seed)
        self.master_fp16 = fp8._name(f8cfg.master) == "fp16"
        self.master_stochastic = fp8._name(f8cfg.master_rounding) == "stochastic"
        self._gens: dict[str, torch.Generator] = {}  # "layers@cpu", "master@cuda:0", ...
        self.wrapped: list[str] = []
        self.exempt: list[str] = []
        self.not_emulated: list[str] = []  # modules with GEMMs this emulation does not reach

    def generator(self, stream: str, device: torch.device) -> torch.Generator:
        """One generator per stream and device, seeded from the run seed: the layers' stream and
        the master-rounding stream are independent, and a run is reproducible from its seed."""
        key = f"{stream}@{device}"
        if key not in self._gens:
            salt = 0 if stream == "layers" else 0x5DEECE66D
            self._gens[key] = torch.Generator(device=device).manual_seed(
                (self.seed * 1_000_003 + salt) % 2**63
            )
        return self._gens[key]

    def quantize(self, kind: str, x: Tensor) -> Tensor:
        spec = self.specs[kind]
        if spec.fmt is None:
            return x
        gen = self.generator("layers", x.device) if spec.rounding == "stochastic" else None
        fn = fp8.quantize_scaled if spec.scaled else fp8.quantize
        return fn(x, spec.fmt, spec.rounding, spec.overflow, gen)

    @torch.no_grad()
    def round_master_(self, params) -> None:
        """After an optimizer step: the updated FP32 weights rounded in place to FP16 values
        (no-op with precision.fp8.master=fp32)."""
        if not self.master_fp16:
            return
        params = [p for p in params if p.is_floating_point()]
        if params:
            gen = self.generator("master", params[0].device) if self.master_stochastic else None
            fp8.round_params_to_fp16_(params, self.master_stochastic, gen)

    def after_step(self, params: list[Tensor]) -> None:
        self.round_master_(params)  # idempotent after a skipped step

    def state_dict(self) -> dict:
        return {"seed": self.seed, "generators": {k: g.get_state() for k, g in self._gens.items()}}

    def load_state_dict(self, sd: dict) -> None:
        self.seed = int(sd["seed"])
        for key, state in sd["generators"].items():
            stream, device = key.split("@", 1)
            self.generator(stream, torch.device(device)).set_state(state.cpu())

    def summary(self) -> dict:
        return {
            "specs": {k: repr(s) for k, s in self.specs.items()},
            "master": ("fp16 " + ("SR" if self.master_stochastic else "RNE"))
            if self.master_fp16
            else "fp32",
            "wrapped": list(self.wrapped),
            "exempt": list(self.exempt),
            "not_emulated": list(self.not_emulated),
        }


# -- the autograd functions ----------------------------------------------------------------------
def _backward_inputs(ctx, grad: Tensor) -> tuple[Tensor, Tensor, FP8Runtime, Tensor]:
    """What a layer's backward starts from: its saved 8-bit operands, the runtime, and the error
    quantized as it enters the GEMMs."""
    xq, wq = ctx.saved_tensors
    return xq, wq, ctx.rt, ctx.rt.quantize("errors", grad)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, rt: FP8Runtime):
        xq, wq = rt.quantize("activations", x), rt.quantize("weights", weight)
        ctx.rt, ctx.has_bias = rt, bias is not None
        ctx.save_for_backward(xq, wq)
        return F.linear(xq, wq, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        xq, wq, rt, e = _backward_inputs(ctx, grad)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = e.matmul(wq)
        e2 = e.reshape(-1, e.shape[-1])
        if ctx.needs_input_grad[1]:
            gw = rt.quantize("weight_grads", e2.t().matmul(xq.reshape(-1, xq.shape[-1])))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = rt.quantize("weight_grads", e2.sum(0))
        return gx, gw, gb, None


class _ConvFn(torch.autograd.Function):
    """aten.convolution forward and aten.convolution_backward on the quantized operands: the
    same kernels an nn.Conv uses, so the emulation costs the quantization and nothing more."""

    @staticmethod
    def forward(ctx, x, weight, bias, rt: FP8Runtime, geometry: tuple):
        xq, wq = rt.quantize("activations", x), rt.quantize("weights", weight)
        ctx.rt, ctx.geometry = rt, geometry
        ctx.bias_sizes = list(bias.shape) if bias is not None else None
        ctx.save_for_backward(xq, wq)
        return torch.ops.aten.convolution(xq, wq, bias, *geometry)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        xq, wq, rt, e = _backward_inputs(ctx, grad)
        need = ctx.needs_input_grad
        mask = [need[0], need[1], ctx.bias_sizes is not None and need[2]]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            e, xq, wq, ctx.bias_sizes, *ctx.geometry, mask
        )
        if gw is not None:
            gw = rt.quantize("weight_grads", gw)
        if gb is not None:
            gb = rt.quantize("weight_grads", gb)
        return (gx if need[0] else None), gw, gb, None, None


# -- the layers (each a subclass of the torch layer it replaces) --------------------------------
class FP8Linear(nn.Linear):
    _fp8: FP8Runtime

    def forward(self, x: Tensor) -> Tensor:
        return _LinearFn.apply(x, self.weight, self.bias, self._fp8)


class _FP8ConvMixin:
    _fp8: FP8Runtime
    _n_spatial: int
    _conv_fn: type[torch.autograd.Function] = _ConvFn  # mx_modules' layers bring their own

    def _fp8_conv(self, x: Tensor, transposed: bool, output_padding) -> Tensor:
        n = self._n_spatial
        unbatched = x.dim() == n + 1
        if unbatched:
            x = x.unsqueeze(0)
        padding = self.padding
        if getattr(self, "padding_mode", "zeros") != "zeros" or isinstance(padding, str):
            # as nn.Conv's _conv_forward: pad outside the convolution (reflect/replicate/circular
            # modes, and the possibly uneven zero padding of padding="same"), convolve unpadded
            mode = getattr(self, "padding_mode", "zeros")
            mode = "constant" if mode == "zeros" else mode
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=mode)
            padding = (0,) * n
        geometry = (
            list(self.stride),
            list(padding),
            list(self.dilation),
            transposed,
            list(output_padding),
            self.groups,
        )
        y = self._conv_fn.apply(x, self.weight, self.bias, self._fp8, geometry)
        return y.squeeze(0) if unbatched else y


def _conv_class(base: type[nn.Module], n: int) -> type:
    def forward(self, x: Tensor) -> Tensor:
        return self._fp8_conv(x, False, (0,) * n)

    return type(f"FP8{base.__name__}", (_FP8ConvMixin, base), {"forward": forward, "_n_spatial": n})


def _conv_transpose_class(base: type[nn.Module], n: int) -> type:
    def forward(self, x: Tensor, output_size: list[int] | None = None) -> Tensor:
        batched = x if x.dim() == n + 2 else x.unsqueeze(0)
        out_pad = self._output_padding(
            batched, output_size, self.stride, self.padding, self.kernel_size, n, self.dilation
        )
        return self._fp8_conv(x, True, out_pad)

    return type(f"FP8{base.__name__}", (_FP8ConvMixin, base), {"forward": forward, "_n_spatial": n})


FP8Conv1d = _conv_class(nn.Conv1d, 1)
FP8Conv2d = _conv_class(nn.Conv2d, 2)
FP8Conv3d = _conv_class(nn.Conv3d, 3)
FP8ConvTranspose1d = _conv_transpose_class(nn.ConvTranspose1d, 1)
FP8ConvTranspose2d = _conv_transpose_class(nn.ConvTranspose2d, 2)
FP8ConvTranspose3d = _conv_transpose_class(nn.ConvTranspose3d, 3)
for _cls in (FP8Conv1d, FP8Conv2d, FP8Conv3d):
    _cls.__module__ = __name__  # picklable by name
for _cls in (FP8ConvTranspose1d, FP8ConvTranspose2d, FP8ConvTranspose3d):
    _cls.__module__ = __name__

SWAP: dict[type, type] = {
    nn.Linear: FP8Linear,
    nn.Conv1d: FP8Conv1d,
    nn.Conv2d: FP8Conv2d,
    nn.Conv3d: FP8Conv3d,
    nn.ConvTranspose1d: FP8ConvTranspose1d,
    nn.ConvTranspose2d: FP8ConvTranspose2d,
    nn.ConvTranspose3d: FP8ConvTranspose3d,
}
UNSWAP = {v: k for k, v in SWAP.items()}
# modules whose matrix products the emulation does not reach (reported, not changed)
NOT_EMULATED = (nn.RNNBase, nn.MultiheadAttention, nn.Bilinear, nn.Embedding)


# -- applying it ---------------------------------------------------------------------------------
def select_exempt(names: list[str], exempt) -> set[str]:
    """The module names (among `names`, in registration order) that `exempt` picks: "first" and
    "last" by position, anything else as an fnmatch pattern on the module name. A pattern that
    matches nothing is refused: it is almost always a misspelt layer name."""
    chosen: set[str] = set()
    for entry in exempt:
        if entry in ("first", "last"):
            if names:
                chosen.add(names[0] if entry == "first" else names[-1])
            continue
        hits = [n for n in names if fnmatch.fnmatchcase(n, entry)]
        if not hits:
            raise ConfigError(
                f"precision.fp8.exempt entry {entry!r} matches none of the model's conv/linear "
                f"layers ({', '.join(names[:12])}{', ...' if len(names) > 12 else ''}). Use a "
                "module name from model.named_modules(), a pattern such as 'features.*', or "
                "'first'/'last'."
            )
        chosen.update(hits)
    return chosen


def apply_fp8(model: nn.Module, precision_cfg, seed: int | None = None) -> nn.Module:
    """Give the model's conv/linear layers 8-bit operands per `precision_cfg.fp8` (a
    PrecisionConfig); returns the model (changed in place). No-op unless precision.fp8.mode is
    emulated (torchao's layers: fp8_hardware.apply_torchao_float8).

    Call it after the model is on its device. `seed` seeds the stochastic-rounding streams
    (default: torch.initial_seed(), i.e. the run seed the task set with torch.manual_seed)."""
    if fp8.fp8_mode(precision_cfg) != "emulated":  # none; torchao: PrecisionPolicy's own call
        return model
    if fp8.uses_mx(precision_cfg):
        raise ValueError("apply_fp8: precision.fp8.*.scaling=mx is mx_modules.apply_mx's")
    f8 = precision_cfg.fp8
    if fp8_runtime(model) is not None:
        raise ValueError("apply_fp8: this model already has FP8 layers")
    base_seed = torch.initial_seed() if seed is None else int(seed)
    # two models of one run (the GAN's G and D) get different streams from the same seed
    salt = zlib.crc32(type(model).__name__.encode())
    rt = FP8Runtime(f8, (base_seed * 7919 + salt) % 2**62)
    eligible = [(n, m) for n, m in model.named_modules() if type(m) in SWAP]
    exempt = select_exempt([n for n, _ in eligible], f8.exempt)
    for name, m in eligible:
        if name in exempt:
            rt.exempt.append(name)
            continue
        m.__class__ = SWAP[type(m)]
        m._fp8 = rt
        rt.wrapped.append(name)
    rt.not_emulated = [n for n, m in model.named_modules() if isinstance(m, NOT_EMULATED)]
    model._fp8_runtime = rt  # also reachable when every layer is exempt
    if not rt.wrapped:
        log.warning(
            "precision.fp8: no conv/linear layer of %s is quantized (eligible: %s, exempt: %s); "
            "the run computes in FP32",
            type(model).__name__,
            [n for n, _ in eligible],
            rt.exempt,
        )
    if rt.master_fp16:
        # the master copy is 16-bit from the start (round to nearest; later steps per the knob)
        fp8.round_params_to_fp16_(
            [p for p in model.parameters() if p.is_floating_point()], stochastic=False
        )
    return model


@register_converter("fp8_emulated")
class EmulatedFP8(Converter):
    """precision.fp8.mode=emulated: 8-bit operands in the conv/linear layers (apply_fp8), the
    FP16 master rounding after each step, and the rising loss-scale floor (fp8.min_scale_at)."""

    narrows_range = True  # FP32 arithmetic on 8-bit values: the gradients need the loss scale

    @classmethod
    def wanted(cls, cfg) -> bool:
        return fp8.fp8_mode(cfg) == "emulated" and not fp8.uses_mx(cfg)  # MX: mx_modules

    def convert(self, model: nn.Module) -> nn.Module:
        return apply_fp8(model, self.cfg)

    def step_hook(self, model: nn.Module) -> FP8Runtime | None:
        return fp8_runtime(model)

    def scale_floor(self, step: int) -> float:
        return fp8.min_scale_at(step, self.cfg)

    def describe(self) -> str | None:
        return fp8.describe_fp8(self.cfg)


def remove_fp8(model: nn.Module) -> nn.Module:
    """Undo apply_fp8 (emulated): the layers get their torch classes back."""
    for m in model.modules():
        if type(m) in UNSWAP:
            m.__class__ = UNSWAP[type(m)]
            del m._fp8
    if hasattr(model, "_fp8_runtime"):
        del model._fp8_runtime
    return model


def fp8_runtime(model: nn.Module) -> FP8Runtime | None:
    """The FP8Runtime apply_fp8 gave `model` (a DDP wrapper is looked through), else None."""
    inner = getattr(model, "module", model)
    return getattr(inner, "_fp8_runtime", None) or getattr(model, "_fp8_runtime", None)


def fp8_state_dict(model: nn.Module) -> dict | None:
    """What a checkpoint must hold for emulated FP8 (the random streams), None without it."""
    rt = fp8_runtime(model)
    return rt.state_dict() if rt is not None else None


def load_fp8_state_dict(model: nn.Module, sd: dict | None) -> None:
    rt = fp8_runtime(model)
    if rt is not None and sd is not None:
        rt.load_state_dict(sd)
