"""Model converters: number formats that plug into the precision policy by name.

torchtitan's model converter is the shape (`protocols/model_converter.py`): a converter changes
the model once (`convert`) and may act after each optimizer step. Here the policy builds the
converters a preset asks for (`wanted(cfg)`), runs `convert` in `prepare_model` before the
storage cast, hands each optimizer the `step_hook` of its model, gives each loss scaler the
converter's `scale_floor`, and puts `describe()` into its own description. The policy, the
optimizer and the scalers know these five calls and no format: FP8 is two converters
(fp8_modules.EmulatedFP8, fp8_hardware.TorchaoFP8), found with the other plug-ins through the
registry (plugins.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor, nn

from mpt_repro import registry

# {name: converter class} registered so far: the registry's own dict (extension point
# "converter"; precision/plugins.py imports every one a policy could want)
CONVERTERS: dict[str, type[Converter] | str] = registry.entries("converter")


def register_converter(name: str) -> Callable[[type[Converter]], type[Converter]]:
    """Class decorator: make a converter available to every policy whose config it `wanted`. A
    name another module registered is refused (ConfigError naming both modules)."""

    def add(cls: type[Converter]) -> type[Converter]:
        cls.name = name
        return registry.register("converter", name, cls, cls.__module__)

    return add


class StepHook(Protocol):
    """What an optimizer over a converted model calls: after each step (skipped or not), and
    for its checkpoint (under `key`) and its run record (run.json diagnostics[`key`])."""

    key: str

    def after_step(self, params: list[Tensor]) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, sd: dict) -> None: ...
    def summary(self) -> dict: ...


class Converter:
    name = "base"
    # the format narrows the gradients' range even where the arithmetic is FP32, so running it
    # without loss scaling is an ablation (emulated FP8)
    narrows_range = False

    @classmethod
    def wanted(cls, cfg: Any) -> bool:
        """Whether a PrecisionConfig asks for this converter."""
        raise NotImplementedError

    def __init__(self, cfg: Any, device: Any):
        """Built when the policy is: refuse here what only the device can tell (ConfigError)."""
        self.cfg, self.device = cfg, device

    def convert(self, model: nn.Module) -> nn.Module:
        """The model in the format (in place, or a new module)."""
        return model

    def step_hook(self, model: nn.Module) -> StepHook | None:
        """What an optimizer over the converted `model` does after each step, or None."""
        return None

    def scale_floor(self, step: int) -> float | None:
        """The lowest loss scale at a scaler's `step`-th update (a floor that rises during
        training), or None: precision.min_scale stays the floor. Host arithmetic, no sync."""
        return None

    def describe(self) -> str | None:
        """One clause for PrecisionPolicy.describe()."""
        return None
