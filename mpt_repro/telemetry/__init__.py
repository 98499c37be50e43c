"""Numerics telemetry: sampled gradient histograms and FP16 range fractions (docs/telemetry.md).

from mpt_repro.telemetry import TelemetryCallback
callbacks.append(TelemetryCallback(cfg.telemetry))   # when cfg.telemetry.enabled

Imported on first use (PEP 562): the config schema (`mpt_repro.telemetry.config`) needs no torch.
"""

from __future__ import annotations

from mpt_repro.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {"callback": ["TelemetryCallback"], "config": ["TelemetryConfig", "validate_telemetry"]},
)
