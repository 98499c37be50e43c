"""Emulated MX training: conv and linear layers whose GEMM inputs are MX block-quantized.

The sibling of fp8_modules.py for `precision.fp8.<kind>.scaling=mx` (docs/mx.md): the same
knobs (precision.fp8.weights / activations / errors: format and rounding; exempt; master), the
same converter interface, the same class swap (`MXConv2d` is an `nn.Conv2d`, parameters and
state_dict unchanged). What differs is where an operand is quantized: an MX block runs along the
reduction dimension of the GEMM that consumes it, and each of a layer's three GEMMs reduces over
another dimension, so an operand is quantized once per GEMM that reads it, as torchao's MXLinear
and MX hardware do (Q_d: MX quantize-dequantize with blocks of 32 along dimension d):

  linear y = x W^T + b, x (T, in), W (out, in), e = dL/dy (T, out)
    forward  y  = Q_in(x) Q_in(W)^T + b          blocks along in
    dgrad    dx = Q_out(e) Q_out(W)              blocks along out
    wgrad    dW = Q_T(e)^T Q_T(x)                blocks along the tokens T
  conv (N, C, *spatial), W (Co, Ci/groups, *kernel)
    forward  blocks along Ci: x's channels, W's dim 1 (each block lies inside one output's sum)
    dgrad    blocks along Co: e's channels, W's dim 0
    wgrad    blocks of 32 consecutive (n, *spatial) positions per channel, of e and of x
  (ConvTranspose: forward and dgrad swap W's dimensions.)

The conv wgrad is an approximation where the kernel is wider than 1: the GEMM's reduction reads x
at positions shifted by the kernel offset, so its exact MX blocks would hold shifted windows of x
(an im2col copy per offset); here x is blocked once, by position (exact for 1x1 convolutions).
The bias gradient is a sum of the FP32 errors (an epilogue, not a GEMM). Accumulation is FP32;
the weight gradient (a GEMM output) is then quantized per precision.fp8.weight_grads (the presets:
none). Tensor kinds whose scaling is not mx are quantized once as fp8_modules does.

Telemetry: while `counting` is on (the telemetry callback's sampled steps), every MX quantization
adds its block counts (mx.block_stats: blocks whose scale clamped at E8M0's bottom, blocks whose
largest value saturated, values that underflowed to zero in their block) to a per layer, per
tensor kind counter on the device; `take_counts` copies them to the host once.
"""

from __future__ import annotations

import logging
import zlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mpt_repro.precision import fp8, mx
from mpt_repro.precision.converters import Converter, register_converter
from mpt_repro.precision.fp8_modules import (
    NOT_EMULATED,
    SWAP,
    FP8Conv1d,
    FP8Conv2d,
    FP8Conv3d,
    FP8ConvTranspose1d,
    FP8ConvTranspose2d,
    FP8ConvTranspose3d,
    FP8Runtime,
    select_exempt,
)

log = logging.getLogger(__name__)


class MXRuntime(FP8Runtime):
    """FP8Runtime's streams, specs and master rounding, plus the MX quantization along a
    dimension and its counters. Kept in checkpoints and run.json under "mx"."""

    key = "mx"

    def __init__(self, f8cfg, seed: int):
        super().__init__(f8cfg, seed)
        self.block_kinds = [k for k in fp8.KINDS if fp8._name(getattr(f8cfg, k).scaling) == "mx"]
        self.counting = False
        self._counts: dict[tuple[str, str], Tensor] = {}  # (layer, kind) -> block_stats sums

    def along(self, kind: str, x: Tensor, dim: int, layer: str) -> Tensor:
        """x quantized as tensor kind `kind` for a GEMM that reduces over `dim`."""
        spec = self.specs[kind]
        if spec.fmt is None:
            return x
        if kind not in self.block_kinds:
            return self.quantize(kind, x)  # fp8_modules' way: once, whatever the GEMM
        gen = self.generator("layers", x.device) if spec.rounding == "stochastic" else None
        stats = None
        if self.counting:
            key = (layer, kind)
            if key not in self._counts:
                self._counts[key] = torch.zeros(len(mx.STATS), dtype=torch.int64, device=x.device)
            stats = self._counts[key]
        return mx.mx_quantize(x, spec.fmt, dim, mx.BLOCK, spec.rounding, gen, stats)

    def take_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """{layer: {kind: mx.stats_dict}} counted since the last call (one host copy), reset."""
        if not self._counts:
            return {}
        keys = list(self._counts)
        host = torch.stack([self._counts[k] for k in keys]).cpu().tolist()
        self._counts = {}
        out: dict[str, dict[str, dict[str, int]]] = {}
        for (layer, kind), c in zip(keys, host):
            out.setdefault(layer, {})[kind] = mx.stats_dict(c)
        return out

    def summary(self) -> dict:
        return {**super().summary(), "block": mx.BLOCK, "block_kinds": list(self.block_kinds)}


class _Layer:
    """What one MX layer hands its autograd function: the shared runtime and its own name."""

    def __init__(self, rt: MXRuntime, name: str):
        self.rt, self.name = rt, name

    def q(self, kind: str, x: Tensor, dim: int) -> Tensor:
        return self.rt.along(kind, x, dim, self.name)


def _wgrad_q(lay: _Layer, kind: str, t: Tensor) -> Tensor:
    """t (N, C, *spatial) quantized with blocks of consecutive (n, *spatial) positions per
    channel: the reduction dimension of a convolution's weight-gradient GEMM."""
    per_channel = t.transpose(0, 1).reshape(t.shape[1], -1)
    q = lay.q(kind, per_channel, -1)
    return q.reshape(t.shape[1], t.shape[0], *t.shape[2:]).transpose(0, 1)


class _MXLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, lay: _Layer):
        ctx.lay, ctx.has_bias = lay, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(lay.q("activations", x, -1), lay.q("weights", weight, -1), bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        lay, need = ctx.lay, ctx.needs_input_grad
        gx = gw = gb = None
        if need[0]:
            gx = lay.q("errors", grad, -1).matmul(lay.q("weights", w, 0))
        e2 = grad.reshape(-1, grad.shape[-1])
        if need[1]:
            x2 = x.reshape(-1, x.shape[-1])
            gw = lay.q("errors", e2, 0).t().matmul(lay.q("activations", x2, 0))
            gw = lay.rt.quantize("weight_grads", gw)
        if ctx.has_bias and need[2]:
            gb = lay.rt.quantize("weight_grads", e2.sum(0))
        return gx, gw, gb, None


class _MXConvFn(torch.autograd.Function):
    """aten.convolution and aten.convolution_backward (the kernels nn.Conv uses) on operands
    quantized per GEMM: the forward's, the input gradient's, the weight gradient's."""

    @staticmethod
    def forward(ctx, x, weight, bias, lay: _Layer, geometry: tuple):
        transposed = geometry[3]
        ctx.lay, ctx.geometry = lay, geometry
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        xq = lay.q("activations", x, 1)
        wq = lay.q("weights", weight, 0 if transposed else 1)  # W's input-channel dimension
        return torch.ops.aten.convolution(xq, wq, bias, *geometry)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        lay, need, geometry = ctx.lay, ctx.needs_input_grad, ctx.geometry
        gx = gw = gb = None
        if need[0]:
            e, wq = lay.q("errors", grad, 1), lay.q("weights", w, 1 if geometry[3] else 0)
            gx = torch.ops.aten.convolution_backward(
                e, x, wq, None, *geometry, [True, False, False]
            )[0]
        if need[1]:
            e, xq = _wgrad_q(lay, "errors", grad), _wgrad_q(lay, "activations", x)
            gw = torch.ops.aten.convolution_backward(
                e, xq, w, None, *geometry, [False, True, False]
            )[1]
            gw = lay.rt.quantize("weight_grads", gw)
        if ctx.has_bias and need[2]:
            dims = [d for d in range(grad.dim()) if d != 1]
            gb = lay.rt.quantize("weight_grads", grad.sum(dims))
        return gx, gw, gb, None, None


# -- the layers: torch's classes (through fp8_modules' conv plumbing), MX autograd functions ----
class MXLinear(nn.Linear):
    _fp8: _Layer

    def forward(self, x: Tensor) -> Tensor:
        return _MXLinearFn.apply(x, self.weight, self.bias, self._fp8)


def _mx_class(fp8_cls: type) -> type:
    torch_base = next(b for b in fp8_cls.__mro__ if b.__module__.startswith("torch.nn"))
    cls = type(f"MX{torch_base.__name__}", (fp8_cls,), {"_conv_fn": _MXConvFn})
    cls.__module__ = __name__  # picklable by name
    return cls


MXConv1d = _mx_class(FP8Conv1d)
MXConv2d = _mx_class(FP8Conv2d)
MXConv3d = _mx_class(FP8Conv3d)
MXConvTranspose1d = _mx_class(FP8ConvTranspose1d)
MXConvTranspose2d = _mx_class(FP8ConvTranspose2d)
MXConvTranspose3d = _mx_class(FP8ConvTranspose3d)
MX_SWAP: dict[type, type] = {
    nn.Linear: MXLinear,
    nn.Conv1d: MXConv1d,
    nn.Conv2d: MXConv2d,
    nn.Conv3d: MXConv3d,
    nn.ConvTranspose1d: MXConvTranspose1d,
    nn.ConvTranspose2d: MXConvTranspose2d,
    nn.ConvTranspose3d: MXConvTranspose3d,
}
assert set(MX_SWAP) == set(SWAP)  # the same layers as emulated FP8
MX_UNSWAP = {v: k for k, v in MX_SWAP.items()}


def apply_mx(model: nn.Module, precision_cfg, seed: int | None = None) -> nn.Module:
    """Give the model's conv/linear layers (all but precision.fp8.exempt) MX-quantized GEMM
    inputs; returns the model (changed in place). No-op unless the preset block-scales a tensor
    kind (fp8_config.uses_mx). Call it after the model is on its device; `seed` as apply_fp8."""
    if not fp8.uses_mx(precision_cfg):
        return model
    if mx_runtime(model) is not None:
        raise ValueError("apply_mx: this model already has MX layers")
    f8 = precision_cfg.fp8
    base_seed = torch.initial_seed() if seed is None else int(seed)
    salt = zlib.crc32(type(model).__name__.encode())  # the GAN's two models: two streams
    rt = MXRuntime(f8, (base_seed * 7919 + salt) % 2**62)
    eligible = [(n, m) for n, m in model.named_modules() if type(m) in MX_SWAP]
    exempt = select_exempt([n for n, _ in eligible], f8.exempt)
    for name, m in eligible:
        if name in exempt:
            rt.exempt.append(name)
            continue
        m.__class__ = MX_SWAP[type(m)]
        m._fp8 = _Layer(rt, name)
        rt.wrapped.append(name)
    rt.not_emulated = [n for n, m in model.named_modules() if isinstance(m, NOT_EMULATED)]
    model._mx_runtime = rt
    if not rt.wrapped:
        log.warning(
            "precision.fp8 (MX): no conv/linear layer of %s is quantized (exempt: %s); the run "
            "computes in FP32",
            type(model).__name__,
            rt.exempt,
        )
    if rt.master_fp16:
        fp8.round_params_to_fp16_(
            [p for p in model.parameters() if p.is_floating_point()], stochastic=False
        )
    return model


def remove_mx(model: nn.Module) -> nn.Module:
    """Undo apply_mx: the layers get their torch classes back."""
    for m in model.modules():
        if type(m) in MX_UNSWAP:
            m.__class__ = MX_UNSWAP[type(m)]
            del m._fp8
    if hasattr(model, "_mx_runtime"):
        del model._mx_runtime
    return model


def mx_runtime(model: nn.Module) -> MXRuntime | None:
    """The MXRuntime apply_mx gave `model` (a DDP wrapper is looked through), else None."""
    inner = getattr(model, "module", model)
    return getattr(inner, "_mx_runtime", None) or getattr(model, "_mx_runtime", None)


@register_converter("mx_emulated")
class EmulatedMX(Converter):
    """precision.fp8.mode=emulated with some tensor kind at scaling=mx: MX-quantized GEMM inputs
    in the conv/linear layers (apply_mx), the FP16 master rounding when asked, the loss-scale
    floor (fp8.min_scale_at)."""

    @classmethod
    def wanted(cls, cfg) -> bool:
        return fp8.uses_mx(cfg)

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        # a block scale gives each block its own range: only kinds quantized without one (an
        # FP8 kind beside MX ones) narrow the gradients' range so that a loss scale matters
        self.narrows_range = any(
            fp8._name(getattr(cfg.fp8, k).format) != "none"
            and fp8._name(getattr(cfg.fp8, k).scaling) != "mx"
            for k in ("errors", "weight_grads")
        )

    def convert(self, model: nn.Module) -> nn.Module:
        return apply_mx(model, self.cfg)

    def step_hook(self, model: nn.Module) -> MXRuntime | None:
        return mx_runtime(model)

    def scale_floor(self, step: int) -> float:
        return fp8.min_scale_at(step, self.cfg)

    def describe(self) -> str | None:
        return fp8.describe_fp8(self.cfg)
