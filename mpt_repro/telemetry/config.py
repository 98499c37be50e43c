"""Numerics telemetry settings (sampled gradient histograms and FP16 range fractions)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TelemetryConfig:
    enabled: bool = False
    every: int = 100  # sample one step in this many; nothing is added to the other steps
