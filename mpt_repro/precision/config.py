"""The precision knobs: every technique of the paper as an independent, typed setting.

Presets in conf/precision/ are combinations of these knobs; `validate_precision` refuses the
combinations that make no sense.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mpt_repro.schema import read_by_every, read_if_declared, read_when


def enum_name(v: Enum | str) -> str:
    """An Enum member's name, or the string itself: OmegaConf gives members, hand-built configs
    may give plain strings."""
    return getattr(v, "name", v)


class Dtype(Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class WeightStorage(Enum):
    # FP32 weights; autocast casts per op (torch.amp style; the FP32 weights are the master copy)
    fp32_autocast = "fp32_autocast"
    # weights held in the compute dtype, as in the paper (apex O2/O3 style)
    low_precision = "low_precision"


class Arithmetic(Enum):
    # the compute dtype's own: FP16 products accumulated in FP32 (Tensor Cores), with autocast's
    # FP32 reductions (paper §3.3)
    native = "native"
    # "pseudo FP16" (paper §4.3): FP16 storage between operations, every arithmetic-heavy
    # operation computed in FP32 on upcast operands (precision/pseudo.py)
    float32 = "float32"


class LossScaling(str, Enum):  # a str: precision.loss_scaling also takes a plugin scaler's name
    none = "none"
    static = "static"
    dynamic = "dynamic"
    # the experiment's paper scale (paper_loss_scale) when it states one, else dynamic
    paper = "paper"
    adaptive = "adaptive"  # layer-wise, Zhao et al. 2019


class FP8Mode(Enum):
    none = "none"  # no 8-bit anything (not "off": YAML reads an unquoted off as false)
    # quantize-dequantize emulation of 8-bit floats on any device (precision/fp8_modules.py)
    emulated = "emulated"
    # torchao float8 training: real FP8 GEMMs on Hopper-class GPUs (precision/fp8_hardware.py)
    torchao = "torchao"


class FP8Format(Enum):
    e5m2 = "e5m2"  # 1 sign, 5 exponent, 2 mantissa bits; IEEE-like with inf; max 57344
    e4m3 = "e4m3"  # OCP E4M3 "fn": no inf, one NaN; max 448
    # the OCP MX element formats below 8 bits (scaling=mx only; docs/mx.md): FP6 and FP4
    e3m2 = "e3m2"  # 1-3-2, max 28
    e2m3 = "e2m3"  # 1-2-3, max 7.5
    e2m1 = "e2m1"  # 1-2-1, max 6
    none = "none"  # leave this tensor kind in FP32


class FP8Rounding(Enum):
    nearest = "nearest"  # round to nearest, ties to even
    stochastic = "stochastic"  # up with probability equal to the discarded fraction


class FP8Overflow(Enum):
    saturate = "saturate"  # beyond the largest finite value: +-max (inf inputs too, as SATFINITE)
    # IEEE-like: +-inf for E5M2, NaN for E4M3 (which has no inf). Not named "inf": Hydra reads an
    # override value inf as the float infinity
    nonfinite = "nonfinite"


class FP8Scaling(Enum):
    none = "none"  # quantize the values as they are (the 2019 paper's direct method)
    tensorwise = "tensorwise"  # multiply by a power of two mapping the tensor's amax near max
    # OCP MX v1.0: blocks of 32 along the GEMM's reduction dimension share an E8M0 power-of-two
    # scale (precision/mx.py, mx_modules.py); weights, activations and errors only
    mx = "mx"


class FP8Master(Enum):
    fp32 = "fp32"
    fp16 = "fp16"  # the weights are rounded to FP16 after every optimizer step (Mellempudi 2019)


class FP8Recipe(Enum):
    tensorwise = "tensorwise"
    rowwise = "rowwise"
    rowwise_with_gw_hp = "rowwise_with_gw_hp"


@dataclass
class FP8TensorConfig:
    """How one tensor kind (weights, activations, errors, weight gradients) is quantized."""

    format: FP8Format = FP8Format.e5m2
    rounding: FP8Rounding = FP8Rounding.nearest
    overflow: FP8Overflow = FP8Overflow.saturate
    scaling: FP8Scaling = FP8Scaling.none


def _grad_kind() -> FP8TensorConfig:
    # gradients: stochastic rounding, and IEEE overflow so the loss scaler sees it
    return FP8TensorConfig(rounding=FP8Rounding.stochastic, overflow=FP8Overflow.nonfinite)


@dataclass
class FP8Config:
    """8-bit floating point (docs/fp8.md). Off unless `mode` is emulated or torchao; the
    defaults of the other keys are the 2019 paper's recipe (E5M2 everywhere, stochastic rounding
    of gradients)."""

    mode: FP8Mode = FP8Mode.none
    # -- emulated: what happens to each operand of a conv/linear layer
    weights: FP8TensorConfig = field(default_factory=FP8TensorConfig)
    activations: FP8TensorConfig = field(default_factory=FP8TensorConfig)
    errors: FP8TensorConfig = field(default_factory=_grad_kind)  # gradient w.r.t. layer outputs
    weight_grads: FP8TensorConfig = field(default_factory=_grad_kind)
    # layers left in FP32 (emulated) or in the preset's dtype (torchao): "first" / "last" (the
    # first and last conv/linear layer in registration order) or fnmatch patterns on module names
    exempt: list[str] = field(default_factory=lambda: ["first", "last"])
    master: FP8Master = FP8Master.fp32
    master_rounding: FP8Rounding = FP8Rounding.nearest
    # "enhanced" loss scaling (Mellempudi 2019): the dynamic scale's floor rises during training.
    # Geometric: floor = min_scale * rise_factor^(step // rise_every), capped at rise_max ...
    min_scale_rise_every: int | None = None
    min_scale_rise_factor: float = 2.0
    min_scale_rise_max: float | None = None
    # ... or explicit: from optimizer step min_scale_milestones[i] on, floor = ..._values[i]
    min_scale_milestones: list[int] = field(default_factory=list)
    min_scale_milestone_values: list[float] = field(default_factory=list)
    # -- torchao (hardware FP8, linear layers only)
    recipe: FP8Recipe = FP8Recipe.tensorwise
    # torchao's emulation (FP8 casts, high-precision matmul): CPU tests, not speed
    torchao_emulate: bool = False
    # torch.compile each converted layer: torchao's casts and scales fuse only when compiled, and
    # eager Float8Linear spends the FP8 GEMM's gain on them (presets fp8, fp8_rowwise: true)
    compile: bool = False


# read by whatever applies a loss scale: every registered loss scaler, a plugin's included
SCALED = read_by_every("loss_scaling", "loss scaler")


def scaler_knob(name: str) -> dict[str, Any]:
    """Field metadata of a scaler knob: read when the run's loss scaler (precision.loss_scaling,
    `paper` resolved) declares `name` in its registration's `reads=` (register_scaler,
    registry.loss_scaler): the dynamic scaler declares its own, a plugin's scaler what it reads."""
    return read_if_declared("loss_scaling", "loss scaler", name)


@dataclass
class PrecisionConfig:
    name: str = "fp32"
    compute_dtype: Dtype = Dtype.float32
    weights: WeightStorage = WeightStorage.fp32_autocast
    master_weights: bool = False
    bn_fp32: bool = True
    arithmetic: Arithmetic = Arithmetic.native
    allow_tf32: bool = False
    loss_scaling: str = (
        "none"  # none, static, dynamic, paper, adaptive (LossScaling), or a registered loss scaler
    )
    static_scale: float | None = field(
        default=None, metadata=read_when("precision.loss_scaling", "static")
    )
    # dynamic scaling (defaults as torch.amp.GradScaler, plus hysteresis, floor and ceiling)
    init_scale: float = field(default=65536.0, metadata=scaler_knob("init_scale"))
    growth_factor: float = field(default=2.0, metadata=scaler_knob("growth_factor"))
    backoff_factor: float = field(default=0.5, metadata=scaler_knob("backoff_factor"))
    growth_interval: int = field(default=2000, metadata=scaler_knob("growth_interval"))
    hysteresis: int = field(default=1, metadata=scaler_knob("hysteresis"))
    min_scale: float = field(default=1.0, metadata=scaler_knob("min_scale"))
    max_scale: float = field(default=16777216.0, metadata=scaler_knob("max_scale"))
    # one scaler per optimizer (per loss) instead of one shared scale
    per_loss_scale: bool = field(default=True, metadata=SCALED)
    # a skipped step does not advance the LR schedule (paper/fairseq/Megatron); false: iteration-
    # faithful
    hold_lr_on_skip: bool = field(default=True, metadata=SCALED)
    # end the run as diverged when the scale sits at min_scale for this many consecutive skipped
    # steps; without a scaler, when the FP16-state guard undoes this many steps in a row
    floor_patience: int = field(
        default=50, metadata=read_when("skip_ending", "a loss scaler", "an FP16 state guard")
    )
    # adaptive (layer-wise) loss scaling, Zhao et al. 2019 (used when loss_scaling=adaptive)
    adaptive_underflow_threshold: float = field(
        default=1e-3, metadata=scaler_knob("adaptive_underflow_threshold")
    )
    adaptive_scale_upper_bound: float = field(
        default=16.0, metadata=scaler_knob("adaptive_scale_upper_bound")
    )
    adaptive_accum_upper_bound: float = field(
        default=1024.0, metadata=scaler_knob("adaptive_accum_upper_bound")
    )
    adaptive_update_interval: int = field(
        default=1, metadata=scaler_knob("adaptive_update_interval")
    )
    adaptive_method: str = field(default="approx_range", metadata=scaler_knob("adaptive_method"))
    # which per-layer formula (docs/adaptive.md "Which formula"): paper (the paper's, default) |
    # code (the authors' final code as it runs: std(g) and max|g|, W dropped) | code_weights
    # (that code's weight branch: sigma x sqrt(0.5 fan_in), u_max / fan_in)
    adaptive_formula: str = field(default="paper", metadata=scaler_knob("adaptive_formula"))
    # reuse the plan's walk of the autograd graph for a forward seen before (audited now and
    # then); false: walk every step, for networks whose graph between layers changes per step
    adaptive_plan_cache: bool = field(default=True, metadata=scaler_knob("adaptive_plan_cache"))
    # 8-bit floating point (docs/fp8.md): emulated E5M2/E4M3, or torchao float8 on Hopper
    fp8: FP8Config = field(default_factory=FP8Config)
