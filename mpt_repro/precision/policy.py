"""PrecisionPolicy: the model side of a precision recipe, and the factory of its optimizers.

The only dtype-aware code in the suite with PrecisionOptimizer (precision/optimizer.py). One
policy per run, built from ``cfg.precision``. Every preset runs the same calls; a preset that
does not use a technique gets a no-op (a null context instead of autocast, no scaler, no master
copy), so the FP32 baseline exercises the same training loop as mixed:

    model = policy.prepare_model(model)                   # storage dtype, BN in FP32
    opt = policy.build_optimizer(model, factory, "model")  # a PrecisionOptimizer
    opt.zero_grad()
    with policy.autocast():
        loss = loss_fn(model(policy.cast_inputs(x)), y)
    opt.backward(loss)
    stepped = opt.step(clip_grad_norm)                     # device bool, no host sync

The policy never names a scaler kind's internals or a number format: scalers describe and
summarise themselves, and formats (FP8) are converters (converters.py) that the policy applies by
name (plugins.py). Code outside this package uses the surface listed in docs/precision.md
("The surface"): prepare_model, build_optimizer, cast_inputs (and storage_dtype), autocast for
the model side; scalars, check_divergence, summary, describe for the host side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from mpt_repro.errors import Diverged
from mpt_repro.precision.config import enum_name as _enum_name
from mpt_repro.precision.master import MasterWeights
from mpt_repro.precision.optimizer import PrecisionOptimizer, ScaleGroup
from mpt_repro.precision.plugins import build_scaler, converters_for
from mpt_repro.precision.pseudo import PseudoFP16

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SHORT = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}


class PrecisionPolicy:
    def __init__(
        self,
        cfg,
        device: str | torch.device = "cpu",
        paper_loss_scale: float | None = None,
        compile_mode: str | None = None,
    ):
        from mpt_repro.precision.validate import validate_precision

        validate_precision(cfg, paper_loss_scale)
        self.cfg = cfg
        self.device = torch.device(device)
        self.paper_loss_scale = paper_loss_scale
        # trainer.compile: torch.compile's mode for the step's device regions (None: eager)
        self.compile_mode = compile_mode
        self.name = cfg.name
        self.dtype_name = _enum_name(cfg.compute_dtype)
        self.compute_dtype = DTYPES[self.dtype_name]
        self.low_precision_weights = _enum_name(cfg.weights) == "low_precision"
        self.storage_dtype = self.compute_dtype if self.low_precision_weights else torch.float32
        self.master_weights = bool(cfg.master_weights)
        self.bn_fp32 = bool(cfg.bn_fp32)
        # pseudo FP16 (paper §4.3): FP16 storage, FP32 arithmetic
        self.fp32_arithmetic = _enum_name(getattr(cfg, "arithmetic", "native")) == "float32"
        self.hold_lr_on_skip = bool(cfg.hold_lr_on_skip)
        self.per_loss_scale = bool(cfg.per_loss_scale)
        # the number formats the preset asks for (precision.fp8); built now, so that what only
        # the device can tell (torchao's FP8 tensor cores) is refused before any work
        self.converters = converters_for(cfg, self.device)
        self.scaling_kind, self.scaling_reason, self._init_scale = self._resolve_scaling()
        self.optimizers: dict[str, PrecisionOptimizer] = {}
        self._shared: ScaleGroup | None = None
        self._apply_tf32()

    # -- construction -----------------------------------------------------------------------
    def _resolve_scaling(self) -> tuple[str, str, float]:
        kind = _enum_name(self.cfg.loss_scaling)
        if kind == "paper":
            if self.paper_loss_scale is not None:
                return "static", "the experiment's paper scale", float(self.paper_loss_scale)
            return "dynamic", "experiment states no paper scale", float(self.cfg.init_scale)
        if kind == "static":
            return "static", "precision.static_scale", float(self.cfg.static_scale)
        if kind == "none" and any(c.narrows_range for c in self.converters):
            return "none", "the no-scaling ablation", 1.0
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

    # -- describe ---------------------------------------------------------------------------
    def describe(self) -> str:
        d = SHORT[self.dtype_name]
        parts = []
        if self.dtype_name == "float32":
            parts.append("FP32 weights/activations/grads")
        elif self.fp32_arithmetic:
            parts.append(f"{d} weights/activations/grads stored, FP32 arithmetic (pseudo {d})")
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
        else:
            scaler = build_scaler(self.scaling_kind, self.cfg, self._init_scale, "cpu")
            parts.append(scaler.describe(self.scaling_reason))
            parts.append(
                ("one scale per optimizer" if self.per_loss_scale else "one shared scale")
                + (
                    ", LR held on skipped steps"
                    if self.hold_lr_on_skip
                    else ", LR advances on skipped steps"
                )
            )
        parts.append("TF32 on" if self.cfg.allow_tf32 else "TF32 off")
        for clause in filter(None, (c.describe() for c in self.converters)):
            if self.dtype_name == "float32":
                parts[0] = clause + ", other ops FP32"  # the format's operands are the story
            else:
                parts.insert(0, clause)
        return f"{self.name}: " + ", ".join(parts)

    # -- model and inputs -------------------------------------------------------------------
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Cast storage to the low dtype (low_precision), keeping BatchNorm FP32 when bn_fp32.

        No casts around BatchNorm: PyTorch's batch norm takes an FP16 input with FP32 weights
        and statistics (CUDA and CPU), computes the statistics in FP32 and returns FP16. That is
        the paper's "BN in FP32" (§3.3) without an FP32 copy of every BN input saved for backward.
        """
        model = model.to(self.device)
        for converter in self.converters:  # precision.fp8: 8-bit operands in conv/linear layers
            model = converter.convert(model)
        if not self.low_precision_weights:
            return model
        model.to(self.compute_dtype)
        if self.bn_fp32:
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.float()  # affine params and running stats (apex skips non-affine BN: not us)
        return model

    def cast_inputs(self, x):
        """Float inputs to the model's storage dtype (integers, e.g. labels/tokens, unchanged)."""
        if self.low_precision_weights and torch.is_tensor(x) and x.is_floating_point():
            return x.to(self.compute_dtype)
        return x

    def autocast(self):
        """Autocast with the compute dtype: per-op casts for FP32 weights, and for low-precision
        weights the FP32 reductions (losses, softmax, norms) the paper keeps in FP32 (§3.3).
        Pseudo FP16 (arithmetic=float32) instead computes every arithmetic-heavy operation in FP32
        and rounds its result to FP16 (precision/pseudo.py)."""
        if self.dtype_name == "float32":
            return contextlib.nullcontext()
        if self.fp32_arithmetic:
            return PseudoFP16()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    # -- optimizers -------------------------------------------------------------------------
    def build_optimizer(
        self, model: nn.Module, factory: Callable, name: str = "model"
    ) -> PrecisionOptimizer:
        """A PrecisionOptimizer over ``model``'s trainable parameters (their FP32 masters when
        master weights are on). ``factory`` makes the torch optimizer: it gets
        ``[(name, param), ...]`` when it has ``takes_named_params`` set (mpt_repro.optim's, for
        per-group rules by name), else the plain list of params (e.g. a lambda)."""
        if name in self.optimizers:
            raise ValueError(f"an optimizer named {name!r} is already built by this policy")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        names = [n for n, _ in named]
        params = [p for _, p in named]
        master = MasterWeights(params) if self.master_weights else None
        opt_params = master.opt_params if master else params
        if getattr(factory, "takes_named_params", False):
            torch_opt = factory(list(zip(names, opt_params)))
        else:
            torch_opt = factory(opt_params)
        group = self._scale_group()
        if group is not None:
            group.members += 1
            group.scaler.attach(model, names, opt_params)
        hooks = [h for c in self.converters if (h := c.step_hook(model)) is not None]
        popt = PrecisionOptimizer(
            name, torch_opt, names, params, master, group, hooks, self.compile_mode
        )
        self.optimizers[name] = popt
        return popt

    def _scale_group(self) -> ScaleGroup | None:
        if self.scaling_kind == "none":
            return None  # no scaler at all (BF16 must never get one)
        if self.per_loss_scale or self._shared is None:
            scaler = build_scaler(self.scaling_kind, self.cfg, self._init_scale, self.device)
            scaler.floor_sources = [c.scale_floor for c in self.converters]
            if self.compile_mode is not None:
                scaler.compile(self.compile_mode)
            group = ScaleGroup(scaler, exclusive=self.per_loss_scale)
            if not self.per_loss_scale:
                self._shared = group
            return group
        return self._shared

    # -- host reads: log rows and the run record --------------------------------------------
    def scalars(self) -> dict:
        """What a train row of the log reads (host reads): "loss_scale" (the first optimizer's),
        "skipped_steps" (summed over optimizers), and per optimizer "loss_scales" (several
        optimizers only) and per layer "layer_scales" (layer-wise scalers only)."""
        found: dict = {
            "loss_scale": self.loss_scale(),
            "skipped_steps": sum(o.skipped for o in self.optimizers.values()),
        }
        if len(self.optimizers) > 1:  # the GAN: each loss has its own scale
            found["loss_scales"] = self.loss_scales()
        if layers := self.layer_scales():  # adaptive: one per layer
            found["layer_scales"] = layers
        return found

    def loss_scale(self) -> float:
        """The first optimizer's current scale (the initial one before any optimizer exists)."""
        first = next(iter(self.optimizers.values()), None)
        return first.loss_scale if first is not None else self._init_scale

    def loss_scales(self) -> dict[str, float]:
        """{optimizer name: current scale}, for per-optimizer logging."""
        return {n: o.loss_scale for n, o in self.optimizers.items()}

    def layer_scales(self) -> dict[str, float]:
        """{layer: its own loss scale in the last step} for layer-wise scalers (adaptive), else {}.
        With several optimizers the names are prefixed "<optimizer>/"."""
        many = len(self.optimizers) > 1
        return {
            (f"{n}/{k}" if many else k): v
            for n, o in self.optimizers.items()
            if o.scaler is not None
            for k, v in o.scaler.layer_scales().items()
        }

    def check_divergence(self) -> None:
        """Raise Diverged when a scale has sat at its floor for ``floor_patience`` skipped steps
        in a row (the trainer asks at its log rows: the count itself is kept on the device)."""
        for n, o in self.optimizers.items():
            if o.scaler is None:
                if o.guard is not None:  # only the guard undoes a step without a scaler
                    self._check_undone(n, o)
                continue
            at = o.scaler.diverged_at()
            if at is None:
                continue
            layer, where = self._where(n, o)
            raise Diverged(
                f"loss scale stuck at its floor {o.loss_scale:g} for "
                f"{self.cfg.floor_patience} consecutive skipped steps "
                f"(precision.floor_patience); {where}. Lower the LR, clip gradients, or use more "
                "precision.",
                at,
                layer=layer,
            )

    def _check_undone(self, n: str, o: PrecisionOptimizer) -> None:
        """Without a scaler (preset fp16) a step the FP16-state guard undoes is undone again the
        next time: the divergence check read only the scaler, and such a run trained on, with no
        step applied, to its end. floor_patience steps in a row end it as diverged."""
        patience = self.cfg.floor_patience
        streak = o.skip_streak if patience > 0 else 0
        if streak < patience:
            return
        layer, where = self._where(n, o)
        raise Diverged(
            f"no optimizer step could be applied for {streak} consecutive steps: each was undone "
            f"and, without a loss scaler, nothing changes from one to the next; {where}. Use loss "
            "scaling or an FP32 master copy (e.g. precision=mixed), or lower the LR.",
            o.steps - streak + patience,
            layer=layer,
        )

    def _where(self, n: str, o: PrecisionOptimizer) -> tuple[str | None, str]:
        bad = o.nonfinite()
        layer = self._qualified(n, bad["last_nonfinite_layer"])
        kind = bad["last_nonfinite_kind"]
        where = (
            f"last non-finite update in layer {layer!r} (its FP16 weight or optimizer state "
            "would have become inf/NaN: the state has no FP32 master copy)"
            if kind == "update"
            else f"last non-finite gradient in layer {layer!r} ({kind})"
        )
        return layer, where

    def _qualified(self, opt_name: str, layer: str | None) -> str | None:
        return f"{opt_name}.{layer}" if layer and len(self.optimizers) > 1 else layer

    def summary(self) -> dict:
        """run.json "loss_scale", "skipped_steps", "steps", "diagnostics". The loss_scale block is
        the first optimizer's; diagnostics.per_optimizer has every optimizer's."""
        first = next(iter(self.optimizers.values()), None)
        if first is None or first.scaler is None:  # no scaling (1.0), or no optimizer yet
            v = self._init_scale
            ls = {"initial": v, "final": v, "min": v, "max": v}
        else:
            ls = first.scaler.summary()
        ls["kind"] = self.scaling_kind
        diagnostics = self._nonfinite()
        diagnostics["scaling"] = self.scaling_kind
        diagnostics["describe"] = self.describe()
        per_opt = {}
        for n, o in self.optimizers.items():
            s = (
                o.scaler.summary()
                if o.scaler is not None
                else {"final": 1.0, "min": 1.0, "max": 1.0}
            )
            per_opt[n] = {
                "steps": o.steps,
                "skipped_steps": o.skipped,
                "loss_scale_final": s["final"],
                "loss_scale_min": s["min"],
                "loss_scale_max": s["max"],
            }
        diagnostics["per_optimizer"] = per_opt
        hooks: dict[str, dict] = {}  # converters' (emulated FP8's "fp8"), by key and optimizer
        for n, o in self.optimizers.items():
            for hook in o.hooks:
                hooks.setdefault(hook.key, {})[n] = hook.summary()
        diagnostics.update({key: _merge_diagnostics(found) for key, found in hooks.items()})
        extra = {n: o.scaler.diagnostics() for n, o in self.optimizers.items() if o.scaler}
        extra = {n: d for n, d in extra.items() if d}
        if extra:  # layer-wise scalers: layer names prefixed by optimizer when there are several
            diagnostics[self.scaling_kind] = _merge_diagnostics(extra)
        return {
            "loss_scale": ls,
            "skipped_steps": sum(o.skipped for o in self.optimizers.values()),
            # optimizer steps, summed over optimizers (a GAN iteration counts two)
            "steps": sum(o.steps for o in self.optimizers.values()),
            "diagnostics": diagnostics,
        }

    def _nonfinite(self) -> dict:
        """The first non-finite gradient over all optimizers, and the latest one."""
        out = {
            "first_nonfinite_layer": None,
            "first_nonfinite_step": None,
            "last_nonfinite_layer": None,
            "last_nonfinite_kind": None,
        }
        for n, o in self.optimizers.items():
            d = o.nonfinite()
            if d["first_nonfinite_layer"] and (
                out["first_nonfinite_step"] is None
                or d["first_nonfinite_step"] < out["first_nonfinite_step"]
            ):
                out["first_nonfinite_layer"] = self._qualified(n, d["first_nonfinite_layer"])
                out["first_nonfinite_step"] = d["first_nonfinite_step"]
            if d["last_nonfinite_layer"]:
                out["last_nonfinite_layer"] = self._qualified(n, d["last_nonfinite_layer"])
                out["last_nonfinite_kind"] = d["last_nonfinite_kind"]
        return out


def _merge_diagnostics(per_opt: dict[str, dict]) -> dict:
    """One optimizer: its scaler's diagnostics. Several: counts summed, per-layer tables merged
    with "<optimizer>/" prefixes, other values kept per optimizer."""
    if len(per_opt) == 1:
        return next(iter(per_opt.values()))
    merged: dict = {}
    for n, d in per_opt.items():
        for k, v in d.items():
            if isinstance(v, dict):
                merged.setdefault(k, {}).update({f"{n}/{layer}": x for layer, x in v.items()})
            elif isinstance(v, int):
                merged[k] = merged.get(k, 0) + v
            else:
                merged.setdefault(k, {})[n] = v
    return merged
