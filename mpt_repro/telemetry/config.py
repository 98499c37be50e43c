"""Numerics telemetry settings (sampled gradient histograms and FP16 range fractions).

Off by default; `telemetry=diagnostic` (conf/telemetry/diagnostic.yaml) or
`telemetry.enabled=true` turns it on. See docs/telemetry.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpt_repro.schema import read_when

ON = read_when("telemetry.enabled", "true")  # every knob but the switch: read only when it is on


@dataclass
class TelemetryConfig:
    enabled: bool = False
    every: int = field(
        default=100, metadata=ON
    )  # sample one step in this many; nothing is added to the other steps
    activations: bool = field(
        default=True, metadata=ON
    )  # activation-gradient histograms (hooks on the layers' outputs)
    weights: bool = field(
        default=True, metadata=ON
    )  # weight-gradient histograms (hooks on the parameters' .grad)
    lost_updates: bool = field(
        default=True, metadata=ON
    )  # FP32 snapshot of the weights, to count updates FP16 would lose
    # the loss scale whose effect the *_scaled fractions show; null: the run's current scale.
    # Set it on an FP32 run to ask "what would a scale of 8 have kept?" (paper Fig. 3, SSD).
    what_if_scale: float | None = field(default=None, metadata=ON)
    # after a skipped (overflowing) step that was not sampled, hook the next step to name the
    # layer; at most this many such probe steps in a run (0: never)
    probe_limit: int = field(default=10, metadata=ON)
    layer_scalars: bool = field(
        default=True, metadata=ON
    )  # per-layer TensorBoard scalars (network totals are always written)
    layer_histograms: bool = field(
        default=True, metadata=ON
    )  # per-layer TensorBoard histograms (network ones always)
    record_file: str = field(
        default="telemetry.jsonl", metadata=ON
    )  # per-sample record in the run directory
    figures: bool = field(
        default=True, metadata=ON
    )  # draw the PNG figures into the run directory at the end of the fit


def validate_telemetry(cfg: Any) -> None:
    """Refuse values the types cannot; ConfigError names the key."""
    from mpt_repro.errors import ConfigError

    if int(cfg.every) < 1:
        raise ConfigError(
            f"telemetry.every must be a positive integer (got {cfg.every!r}), e.g. "
            "telemetry.every=100"
        )
    if cfg.what_if_scale is not None and not float(cfg.what_if_scale) > 0:
        raise ConfigError(
            f"telemetry.what_if_scale must be > 0 or null (got {cfg.what_if_scale!r})"
        )
    if int(cfg.probe_limit) < 0:
        raise ConfigError(f"telemetry.probe_limit must be >= 0 (got {cfg.probe_limit!r})")
    if not str(cfg.record_file) or "/" in str(cfg.record_file):
        raise ConfigError(
            f"telemetry.record_file must be a plain file name (got {cfg.record_file!r})"
        )
