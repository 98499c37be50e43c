"""The precision knobs: every technique of the paper as an independent, typed setting.

Presets in conf/precision/ are combinations of these knobs; `validate_precision` refuses the
combinations that make no sense.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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


class LossScaling(Enum):
    none = "none"
    static = "static"
    dynamic = "dynamic"
    # the experiment's paper scale (paper_loss_scale) when it states one, else dynamic
    paper = "paper"
    adaptive = "adaptive"  # layer-wise, Zhao et al. 2019


@dataclass
class PrecisionConfig:
    name: str = "fp32"
    compute_dtype: Dtype = Dtype.float32
    weights: WeightStorage = WeightStorage.fp32_autocast
    master_weights: bool = False
    bn_fp32: bool = True
    allow_tf32: bool = False
    loss_scaling: LossScaling = LossScaling.none
    static_scale: float | None = None
    # dynamic scaling (defaults as torch.amp.GradScaler, plus hysteresis, floor and ceiling)
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    min_scale: float = 1.0
    max_scale: float = 16777216.0
    # one scaler per optimizer (per loss) instead of one shared scale
    per_loss_scale: bool = True
    # a skipped step does not advance the LR schedule (paper/fairseq/Megatron); false: iteration-
    # faithful
    hold_lr_on_skip: bool = True
    # end the run as diverged when the scale sits at min_scale for this many consecutive skipped
    # steps
    floor_patience: int = 50
    # adaptive (layer-wise) loss scaling, Zhao et al. 2019 (used when loss_scaling=adaptive)
    adaptive_underflow_threshold: float = 1e-3
    adaptive_scale_upper_bound: float = 16.0
    adaptive_accum_upper_bound: float = 1024.0
    adaptive_update_interval: int = 1
    adaptive_method: str = "approx_range"
