"""Precision engine: PrecisionPolicy (the only dtype-aware code), loss scalers, master weights.

See docs/precision.md for the knobs, the presets and the scaler semantics.
"""

from mpt_repro.precision import adaptive  # noqa: F401  (registers loss_scaling=adaptive)
from mpt_repro.precision.config import Dtype, LossScaling, PrecisionConfig, WeightStorage
from mpt_repro.precision.master import MasterWeights
from mpt_repro.precision.policy import PrecisionPolicy
from mpt_repro.precision.scalers import (
    SCALERS,
    DynamicScaler,
    LossScaler,
    StaticScaler,
    build_scaler,
    register_scaler,
)

__all__ = [
    "PrecisionPolicy",
    "PrecisionConfig",
    "Dtype",
    "WeightStorage",
    "LossScaling",
    "LossScaler",
    "StaticScaler",
    "DynamicScaler",
    "SCALERS",
    "register_scaler",
    "build_scaler",
    "MasterWeights",
]
