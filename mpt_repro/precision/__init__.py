"""Precision engine: PrecisionPolicy (the only dtype-aware code), loss scalers, master weights,
and the plug-ins (scalers and number-format converters, plugins.py).

See docs/precision.md for the knobs, the presets and the scaler semantics.

The names below are imported on first use (PEP 562), so that reading the config schema
(`mpt_repro.precision.config`, e.g. for `mpt-run --help`) does not import torch.
"""

from __future__ import annotations

from mpt_repro.lazy import lazy_exports

_EXPORTS = {
    "PrecisionPolicy": "mpt_repro.precision.policy",
    "PrecisionOptimizer": "mpt_repro.precision.optimizer",
    "PrecisionConfig": "mpt_repro.precision.config",
    "Dtype": "mpt_repro.precision.config",
    "WeightStorage": "mpt_repro.precision.config",
    "LossScaling": "mpt_repro.precision.config",
    "LossScaler": "mpt_repro.precision.scalers",
    "StaticScaler": "mpt_repro.precision.scalers",
    "DynamicScaler": "mpt_repro.precision.scalers",
    "SCALERS": "mpt_repro.precision.scalers",
    "register_scaler": "mpt_repro.precision.scalers",
    "build_scaler": "mpt_repro.precision.plugins",
    "Converter": "mpt_repro.precision.converters",
    "register_converter": "mpt_repro.precision.converters",
    "MasterWeights": "mpt_repro.precision.master",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
