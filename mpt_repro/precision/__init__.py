"""Precision engine: PrecisionPolicy (the only dtype-aware code), loss scalers, master weights,
and the plug-ins (scalers and number-format converters, plugins.py).

See docs/precision.md for the knobs, the presets and the scaler semantics.

The names below are imported on first use (PEP 562), so that reading the config schema
(`mpt_repro.precision.config`, e.g. for `mpt-run --help`) does not import torch.
"""

from __future__ import annotations

from mpt_repro.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "policy": ["PrecisionPolicy"],
        "optimizer": ["PrecisionOptimizer"],
        "config": ["PrecisionConfig", "Dtype", "WeightStorage", "LossScaling"],
        "scalers": ["LossScaler", "StaticScaler", "DynamicScaler", "SCALERS", "register_scaler"],
        "plugins": ["build_scaler"],
        "converters": ["Converter", "register_converter"],
        "master": ["MasterWeights"],
    },
)
