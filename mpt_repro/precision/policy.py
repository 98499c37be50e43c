"""PrecisionPolicy: the only dtype-aware code in the suite (interface in docs/design.md).

One policy per run, built from ``cfg.precision``. Every preset runs the same calls; a preset
that does not use a technique gets a no-op (a null context instead of autocast, the identity
scaler, no master copy), so the FP32 baseline exercises the same training loop as mixed.

Per step, for each optimizer ``opt`` (the trainer/task owns zero_grad, forward and the loss):

    opt.zero_grad(set_to_none=True)
    with policy.autocast():
        loss = loss_fn(model(policy.cast_inputs(x)), y)
    policy.backward(loss, opt)                  # loss * scale, backward
    stepped = policy.step(opt, clip_grad_norm)  # grads -> masters, unscale, check, clip, step,
                                                # refresh FP16 weights, update the scale
    if stepped or not policy.hold_lr_on_skip: scheduler.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mpt_repro.distributed import all_reduce_
from mpt_repro.errors import Diverged
from mpt_repro.precision import adaptive  # noqa: F401  (registers loss_scaling=adaptive)
from mpt_repro.precision.master import MasterWeights
from mpt_repro.precision.scalers import LossScaler, build_scaler

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SHORT = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}


def _enum_name(v) -> str:
    """Enum member or plain string (OmegaConf gives enums, hand-built configs may give strings)."""
    return getattr(v, "name", v)


@dataclass
class _OptState:
    """What the policy keeps for one optimizer."""

    name: str
    optimizer: torch.optim.Optimizer
    names: list[str]  # parameter names, aligned with params
    params: list[Tensor]  # what the optimizer updates (FP32 masters or the model's params)
    scaler: LossScaler | None  # None: no loss scaling
    master: MasterWeights | None
    steps: int = 0  # step() calls
    skipped: int = 0  # of which skipped (overflow)
    last_grad_norm: Tensor | None = None


class PrecisionPolicy:
    def __init__(
        self,
        cfg,
        device: str | torch.device = "cpu",
        paper_loss_scale: float | None = None,
    ):
        from mpt_repro.precision.validate import validate_precision

        validate_precision(cfg, paper_loss_scale)
        self.cfg = cfg
        self.device = torch.device(device)
        self.paper_loss_scale = paper_loss_scale
        self.name = cfg.name
        self.dtype_name = _enum_name(cfg.compute_dtype)
        self.compute_dtype = DTYPES[self.dtype_name]
        self.low_precision_weights = _enum_name(cfg.weights) == "low_precision"
        self.storage_dtype = self.compute_dtype if self.low_precision_weights else torch.float32
        self.master_weights = bool(cfg.master_weights)
        self.bn_fp32 = bool(cfg.bn_fp32)
        self.hold_lr_on_skip = bool(cfg.hold_lr_on_skip)
        self.per_loss_scale = bool(cfg.per_loss_scale)
        self.scaling_kind, self.scaling_reason, self._init_scale = self._resolve_scaling()
        self._opts: dict[str, _OptState] = {}
        self._by_id: dict[int, str] = {}
        self._shared: LossScaler | None = None
        self._shared_pending: dict[
            str, bool
        ] = {}  # shared scaler: found_inf per optimizer this round
        self._diag: dict = {
            "first_nonfinite_layer": None,
            "first_nonfinite_step": None,
            "last_nonfinite_layer": None,
            "last_nonfinite_kind": None,
        }
        self._apply_tf32()

    # -- construction -----------------------------------------------------------------------
    def _resolve_scaling(self):
        kind = _enum_name(self.cfg.loss_scaling)
        if kind == "paper":
            if self.paper_loss_scale is not None:
                return "static", "the experiment's paper scale", float(self.paper_loss_scale)
            return "dynamic", "experiment states no paper scale", float(self.cfg.init_scale)
        if kind == "static":
            return "static", "precision.static_scale", float(self.cfg.static_scale)
        if kind == "dynamic":
            return "dynamic", "precision.loss_scaling=dynamic", float(self.cfg.init_scale)
        if kind == "none":
            reason = {
                "float32": "FP32 has the range",
                "bfloat16": "BF16 has FP32's exponent range",
            }.get(self.dtype_name, "the no-scaling ablation")
            return "none", reason, 1.0
        return kind, f"precision.loss_scaling={kind}", float(self.cfg.init_scale)

    def _apply_tf32(self) -> None:
        # Set explicitly on every construction: a Hydra multirun runs its jobs in one process,
        # so a tf32 job must not leave TF32 on for the fp32 job after it.
        allow = bool(self.cfg.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow

    def _new_scaler(self) -> LossScaler | None:
        if self.scaling_kind == "none":
            return None  # no scaler at all (BF16 must never get one)
        return build_scaler(self.scaling_kind, self.cfg, self._init_scale)

    # -- describe ---------------------------------------------------------------------------
    def describe(self) -> str:
        d = SHORT[self.dtype_name]
        parts = []
        if self.dtype_name == "float32":
            parts.append("FP32 weights/activations/grads")
        elif self.low_precision_weights:
            parts.append(f"{d} weights/activations/grads (weights=low_precision)")
        else:
            parts.append(
                f"FP32 weights, {d} autocast per op (weights=fp32_autocast; the weights are the "
                "master copy)"
            )
        if self.low_precision_weights:
            parts.append(
                "FP32 master weights"
                if self.master_weights
                else f"no master copy (optimizer updates {d} weights)"
            )
            parts.append("BN in FP32" if self.bn_fp32 else f"BN in {d}")
        if self.scaling_kind == "none":
            parts.append(f"no loss scaling ({self.scaling_reason})")
        elif self.scaling_kind == "static":
            parts.append(f"static loss scale {self._init_scale:g} ({self.scaling_reason})")
        elif self.scaling_kind == "dynamic":
            c = self.cfg
            parts.append(
                f"dynamic loss scale {self._init_scale:g} ({self.scaling_reason}; "
                f"x{c.growth_factor:g} after "
                f"{c.growth_interval} clean steps, x{c.backoff_factor:g} on overflow, hysteresis "
                f"{c.hysteresis}, "
                f"range [{c.min_scale:g}, {c.max_scale:g}])"
            )
        elif self.scaling_kind == "adaptive":
            from mpt_repro.precision.adaptive import describe as describe_adaptive

            parts.append(describe_adaptive(self.cfg))
        else:
            parts.append(f"{self.scaling_kind} loss scaling ({self.scaling_reason})")
        if self.scaling_kind != "none":
            parts.append(
                ("one scale per optimizer" if self.per_loss_scale else "one shared scale")
                + (
                    ", LR held on skipped steps"
                    if self.hold_lr_on_skip
                    else ", LR advances on skipped steps"
                )
            )
        parts.append("TF32 on" if self.cfg.allow_tf32 else "TF32 off")
        return f"{self.name}: " + ", ".join(parts)

    # -- model and inputs -------------------------------------------------------------------
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Cast storage to the low dtype (low_precision), keeping BatchNorm FP32 when bn_fp32."""
        model = model.to(self.device)
        if not self.low_precision_weights:
            return model
        model.to(self.compute_dtype)
        if self.bn_fp32:
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    # affine params and running stats (apex skips non-affine BN: we do not)
                    m.float()
                    m.register_forward_pre_hook(_bn_input_to_fp32)
                    m.register_forward_hook(_bn_output_to_input_dtype)
        return model

    def cast_inputs(self, x):
        """Float inputs to the model's storage dtype (integers, e.g. labels/tokens, unchanged)."""
        if self.low_precision_weights and torch.is_tensor(x) and x.is_floating_point():
            return x.to(self.compute_dtype)
        return x

    def autocast(self):
        """Autocast with the compute dtype: per-op casts for FP32 weights, and for low-precision
        weights the FP32 reductions (losses, softmax, norms) the paper keeps in FP32 (§3.3)."""
        if self.dtype_name == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    # -- optimizers -------------------------------------------------------------------------
    def build_optimizer(
        self, model: nn.Module, factory: Callable, name: str = "model"
    ) -> torch.optim.Optimizer:
        """``factory(params) -> Optimizer``; over FP32 masters when master weights are on."""
        if name in self._opts:
            raise ValueError(
                f"an optimizer named {name!r} is already registered with the precision policy"
            )
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        names = [n for n, _ in named]
        params = [p for _, p in named]
        master = MasterWeights(params) if self.master_weights else None
        opt_params = master.opt_params if master else params
        opt = factory(opt_params)
        if self.per_loss_scale or self.scaling_kind == "none":
            scaler = self._new_scaler()
        else:
            self._shared = self._shared or self._new_scaler()
            scaler = self._shared
        if scaler is not None:
            scaler.attach(model, names, opt_params)
        self._opts[name] = _OptState(name, opt, names, opt_params, scaler, master)
        self._by_id[id(opt)] = name
        return opt

    def _state(self, opt=None) -> _OptState:
        if opt is None:
            if not self._opts:
                raise ValueError(
                    "no optimizer registered with the precision policy (call build_optimizer)"
                )
            return next(iter(self._opts.values()))
        if isinstance(opt, str):
            return self._opts[opt]
        try:
            return self._opts[self._by_id[id(opt)]]
        except KeyError:
            raise ValueError(
                "this optimizer was not built by PrecisionPolicy.build_optimizer"
            ) from None

    # -- the step ---------------------------------------------------------------------------
    def zero_grad(self, opt=None) -> None:
        """Drop the grads of ``opt``'s model parameters and of its FP32 masters. (opt.zero_grad()
        alone reaches only the masters; step() already drops the model's FP16 grads, so this is
        for grads left by another loss's backward, e.g. the GAN generator's pass through D.)"""
        st = self._state(opt)
        st.optimizer.zero_grad(set_to_none=True)
        if st.master is not None:
            for p in st.master.model_params:
                p.grad = None

    def backward(self, loss: Tensor, opt=None, **kwargs) -> None:
        """Scale the loss with ``opt``'s scaler and back-propagate."""
        scaler = self._state(opt).scaler
        (scaler.scale_loss(loss) if scaler is not None else loss).backward(**kwargs)

    def step(self, opt=None, clip_grad_norm: float | None = None) -> bool:
        """Unscale, check for inf/NaN, then skip, or clip and step; refresh low-precision weights
        from the masters and move the scale. Returns True when the optimizer stepped."""
        st = self._state(opt)
        if st.master is not None:
            st.master.grads_to_masters()
        grads = [p.grad for p in st.params if p.grad is not None]
        scaler = st.scaler
        st.steps += 1
        found_inf = False
        if scaler is not None and grads:
            # unscale BEFORE clipping, so a clip threshold means the same in every preset (§3.2)
            flag = scaler.unscale_(grads)
            # Distributed: every rank must skip or step together, or the replicas (and their
            # scales) drift apart. DDP's averaged grads usually carry an inf to every rank anyway;
            # the MAX makes it certain (no-op in one process).
            all_reduce_(flag, "max")
            found_inf = bool(flag.item())  # the one host sync of the step
        if found_inf:
            st.skipped += 1
            self._record_overflow(st)
            for p in st.params:  # an overflowing gradient must not reach the next step
                p.grad = None
        else:
            if clip_grad_norm is not None and grads:
                st.last_grad_norm = torch.nn.utils.clip_grad_norm_(st.params, clip_grad_norm)
            st.optimizer.step()
            if st.master is not None:
                st.master.masters_to_model()
        self._update_scaler(st, found_inf)
        return not found_inf

    def _update_scaler(self, st: _OptState, found_inf: bool) -> None:
        scaler = st.scaler
        if scaler is None:
            return
        if scaler is self._shared:
            # GradScaler semantics for one scale shared by several optimizers: every loss of an
            # iteration uses the same scale; it moves once all optimizers have stepped.
            self._shared_pending[st.name] = self._shared_pending.get(st.name, False) or found_inf
            sharing = [s for s in self._opts.values() if s.scaler is scaler]
            if len(self._shared_pending) < len(sharing):
                return
            found_inf = any(self._shared_pending.values())
            self._shared_pending = {}
        scaler.update(found_inf)
        if scaler.at_floor_too_long:
            layer = self._diag["last_nonfinite_layer"]
            raise Diverged(
                f"loss scale stuck at its floor {scaler.scale:g} for {scaler.floor_count} "
                "consecutive skipped steps "
                f"(precision.floor_patience={self.cfg.floor_patience}); first non-finite gradient "
                "in layer "
                f"{layer!r} ({self._diag['last_nonfinite_kind']}). Lower the LR, clip gradients, "
                "or use more precision.",
                st.steps,
            )

    def _record_overflow(self, st: _OptState) -> None:
        """Name the first parameter (model order) with a non-finite grad. Overflow steps only,
        so clean steps pay nothing for the diagnosis."""
        with torch.no_grad():
            bad = [(n, p.grad) for n, p in zip(st.names, st.params) if p.grad is not None]
            flags = (
                torch.stack([~torch.isfinite(g).all() for _, g in bad]).cpu().tolist()
                if bad
                else []
            )
            first = next((i for i, f in enumerate(flags) if f), None)
            if first is None:  # a scaler that reports overflow by its own rule (all grads finite)
                return
            name, g = bad[first]
            kind = "nan" if bool(torch.isnan(g).any()) else "inf"
        layer = f"{st.name}.{name}" if len(self._opts) > 1 else name
        self._diag["last_nonfinite_layer"] = layer
        self._diag["last_nonfinite_kind"] = kind
        if self._diag["first_nonfinite_layer"] is None:
            self._diag["first_nonfinite_layer"] = layer
            self._diag["first_nonfinite_step"] = st.steps

    # -- reporting --------------------------------------------------------------------------
    def loss_scale(self, opt=None) -> float:
        """The current scale of ``opt`` (an optimizer or its name; default: the first one)."""
        if not self._opts:
            return self._init_scale
        return _scale(self._state(opt).scaler)

    def loss_scales(self) -> dict[str, float]:
        """{optimizer name: current scale}, for per-optimizer logging (no host sync)."""
        return {n: _scale(s.scaler) for n, s in self._opts.items()}

    def layer_scales(self) -> dict[str, float]:
        """{layer: its own loss scale in the last step} for layer-wise scalers (adaptive), else {}.
        With several optimizers the names are prefixed "<optimizer>/". No host sync."""
        out: dict[str, float] = {}
        for n, s in self._opts.items():
            fn = getattr(s.scaler, "layer_scales", None)
            if fn is not None:
                prefix = f"{n}/" if len(self._opts) > 1 else ""
                out.update({prefix + k: v for k, v in fn().items()})
        return out

    def scaler(self, opt=None) -> LossScaler | None:
        """The scaler of ``opt`` (None when loss scaling is off)."""
        return self._state(opt).scaler

    def last_grad_norm(self, opt=None) -> Tensor | None:
        """The unscaled total grad norm from the last clipped step (a tensor: no host sync)."""
        return self._state(opt).last_grad_norm

    def summary(self) -> dict:
        """run.json "loss_scale", "skipped_steps", "steps", "diagnostics". The loss_scale block is
        the first optimizer's; diagnostics.per_optimizer has every optimizer's."""
        first = next(iter(self._opts.values())).scaler if self._opts else None
        if first is None:  # no scaling (1.0), or no step yet (the initial scale)
            v = self._init_scale
            ls = {"initial": v, "final": v, "min": v, "max": v}
        else:
            ls = {
                "initial": first.initial,
                "final": first.scale,
                "min": first.min_seen,
                "max": first.max_seen,
            }
        ls["kind"] = self.scaling_kind
        diagnostics = dict(self._diag)
        diagnostics["scaling"] = self.scaling_kind
        diagnostics["describe"] = self.describe()
        diagnostics["per_optimizer"] = {
            n: {
                "steps": s.steps,
                "skipped_steps": s.skipped,
                "loss_scale_final": _scale(s.scaler),
                "loss_scale_min": s.scaler.min_seen if s.scaler else 1.0,
                "loss_scale_max": s.scaler.max_seen if s.scaler else 1.0,
            }
            for n, s in self._opts.items()
        }
        layerwise = [
            (n, s.scaler.adaptive_summary())
            for n, s in self._opts.items()
            if hasattr(s.scaler, "adaptive_summary")
        ]
        if (
            layerwise
        ):  # per-layer final/min/max scales; layer names prefixed by optimizer if several
            many = len(self._opts) > 1
            diagnostics["adaptive"] = {
                "updates": sum(a["updates"] for _, a in layerwise),
                "fallback_steps": sum(a["fallback_steps"] for _, a in layerwise),
                "accum_cap": {n: a["accum_cap"] for n, a in layerwise}
                if many
                else layerwise[0][1]["accum_cap"],
                "layers": {
                    (f"{n}/{k}" if many else k): v
                    for n, a in layerwise
                    for k, v in a["layers"].items()
                },
            }
        # optimizer steps, summed over optimizers (a GAN iteration counts two)
        return {
            "loss_scale": ls,
            "skipped_steps": sum(s.skipped for s in self._opts.values()),
            "steps": sum(s.steps for s in self._opts.values()),
            "diagnostics": diagnostics,
        }

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "name": self.name,
            "optimizers": {
                n: {
                    "steps": s.steps,
                    "skipped": s.skipped,
                    "scaler": s.scaler.state_dict() if s.scaler is not None else None,
                    "masters": s.master.state_dict() if s.master is not None else None,
                }
                for n, s in self._opts.items()
            },
            "shared_pending": dict(self._shared_pending),
            "diagnostics": dict(self._diag),
        }

    def load_state_dict(self, sd: dict) -> None:
        for n, o in sd["optimizers"].items():
            if n not in self._opts:
                raise ValueError(
                    f"checkpoint has precision state for optimizer {n!r}, which this run did not "
                    "build"
                )
            st = self._opts[n]
            st.steps, st.skipped = int(o["steps"]), int(o["skipped"])
            if st.scaler is not None and o.get("scaler") is not None:
                st.scaler.load_state_dict(o["scaler"])
            if st.master is not None and o.get("masters") is not None:
                st.master.load_state_dict(o["masters"])
        self._shared_pending = dict(sd.get("shared_pending", {}))
        self._diag.update(sd.get("diagnostics", {}))


def _scale(scaler: LossScaler | None) -> float:
    return 1.0 if scaler is None else float(scaler.scale)


def _bn_input_to_fp32(module: nn.Module, args):
    # An FP16 activation entering an FP32 BatchNorm: do the statistics in FP32 (paper §3.3).
    x = args[0]
    if torch.is_tensor(x) and x.is_floating_point() and x.dtype != torch.float32:
        module._mpt_in_dtype = x.dtype
        return (x.float(),) + tuple(args[1:])
    module._mpt_in_dtype = None
    return None


def _bn_output_to_input_dtype(module: nn.Module, args, out):
    # ...and hand the next layer an activation in the storage dtype again (FP16 activations).
    dtype = getattr(module, "_mpt_in_dtype", None)
    return out.to(dtype) if dtype is not None else None
