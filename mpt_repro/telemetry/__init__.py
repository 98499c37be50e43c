"""Numerics telemetry: sampled gradient histograms and FP16 range fractions (docs/telemetry.md).

from mpt_repro.telemetry import TelemetryCallback
callbacks.append(TelemetryCallback(cfg.telemetry))   # when cfg.telemetry.enabled
"""

from mpt_repro.telemetry.callback import TelemetryCallback
from mpt_repro.telemetry.config import TelemetryConfig, validate_telemetry

__all__ = ["TelemetryCallback", "TelemetryConfig", "validate_telemetry"]
