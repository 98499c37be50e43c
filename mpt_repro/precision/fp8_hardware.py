"""Hardware FP8 for linear layers: torchao's float8 training (presets fp8, fp8_rowwise).

torchao's `convert_to_float8_training` swaps nn.Linear for Float8Linear, whose three GEMMs
(output, input gradient, weight gradient) run on FP8 tensor cores with E4M3 operands forward and
E5M2 gradients, each operand scaled on the fly (tensorwise: one scale per tensor; rowwise: one
per row, finer but needs a newer GPU kernel). Convolutions are not converted: they stay in the
preset's dtype (BF16 autocast). Needs an NVIDIA GPU with FP8 tensor cores (compute capability
8.9: Ada; 9.0: Hopper, and later) unless `precision.fp8.torchao_emulate=true`, torchao's
emulation mode (FP8 casts, high-precision matmuls), which runs anywhere and is how the CPU tests
exercise this path. Speed needs torch.compile (torchao's own guidance): eager Float8Linear
spends its gain on the casts, so each converted layer is compiled (precision.fp8.compile). A model
with no layer to convert (ResNet-50: its only linear layer is the exempt 1000-class head) is
refused rather than trained in BF16 under an FP8 name.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from mpt_repro.errors import ConfigError
from mpt_repro.precision import fp8
from mpt_repro.precision.converters import Converter, register_converter

# FP8 tensor cores: Ada (8.9), Hopper (9.0) and later, for both recipes: torchao's float8
# training has no capability check of its own and calls torch._scaled_mm, whose rowwise CUTLASS
# kernel has an SM89 build since pytorch/pytorch#144348 (torchao's inference-side PerRow API
# asserts 9.0, pytorch/ao#2566, which is another code path)
MIN_CAPABILITY = (8, 9)


def torchao_float8():
    """The torchao.float8 module, or a ConfigError that says how to get it."""
    try:
        import torchao.float8 as f8
    except Exception as e:  # not installed, or built for another torch (import-time errors)
        raise ConfigError(
            "precision.fp8.mode=torchao (presets fp8, fp8_rowwise) needs torchao's float8 "
            f"training, which could not be imported ({type(e).__name__}: {e}). Install it with "
            "`pip install torchao` (a release matching your torch), or use "
            "precision=fp8_hybrid_emulated, which emulates FP8 on any device."
        ) from None
    return f8


def check_fp8_device(device: torch.device | str, emulate: bool) -> None:
    """Refuse a device without FP8 tensor cores (unless torchao's emulation is asked for)."""
    if emulate:
        return
    device = torch.device(device)
    hint = (
        "Run on an Ada/Hopper-class GPU, or set precision.fp8.torchao_emulate=true (torchao's "
        "emulation: checks the numerics, not the speed), or use precision=fp8_hybrid_emulated."
    )
    if device.type != "cuda":
        raise ConfigError(
            f"precision.fp8.mode=torchao needs a CUDA GPU with FP8 tensor cores; this run is on "
            f"{device}. {hint}"
        )
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        raise ConfigError(
            f"precision.fp8.mode=torchao needs FP8 tensor cores (compute capability >= "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}); {torch.cuda.get_device_name(device)} "
            f"has {cap[0]}.{cap[1]}. {hint}"
        )


def validate_hardware(precision_cfg, device: torch.device | str) -> None:
    """Everything torchao mode needs that the config alone cannot tell: torchao importable and
    a capable device. For PrecisionPolicy.__init__, so a run refuses before any work."""
    if fp8.fp8_mode(precision_cfg) != "torchao":
        return
    torchao_float8()
    check_fp8_device(device, bool(precision_cfg.fp8.torchao_emulate))


def float8_config(precision_cfg):
    """torchao's Float8LinearConfig for the preset's recipe (and emulation flag)."""
    f8 = torchao_float8()
    cfg = f8.Float8LinearConfig.from_recipe_name(fp8._name(precision_cfg.fp8.recipe))
    if precision_cfg.fp8.torchao_emulate:
        cfg = dataclasses.replace(cfg, emulate=True)
    return cfg


def torchao_plan(model: nn.Module, precision_cfg) -> dict[str, list[str]]:
    """What apply_torchao_float8 does to each nn.Linear of `model`, by module name: "converted",
    "exempt" (precision.fp8.exempt; "first"/"last" count conv and linear layers in registration
    order, as in the emulated mode) or "skipped_dims" (in or out features not a multiple of 16:
    torchao's FP8 GEMM needs that, and a 1000-class head is one). Needs no torchao."""
    from mpt_repro.precision.fp8_modules import SWAP, select_exempt

    eligible = [n for n, m in model.named_modules() if type(m) in SWAP]
    exempt = select_exempt(eligible, precision_cfg.fp8.exempt)
    plan: dict[str, list[str]] = {"converted": [], "exempt": [], "skipped_dims": []}
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear):
            continue
        if name in exempt:
            plan["exempt"].append(name)
        elif m.in_features % 16 or m.out_features % 16:
            plan["skipped_dims"].append(name)
        else:
            plan["converted"].append(name)
    return plan


def apply_torchao_float8(model: nn.Module, precision_cfg) -> nn.Module:
    """Convert the model's eligible nn.Linear layers to torchao Float8Linear (in place), as
    `torchao_plan` says, and compile each (precision.fp8.compile: torchao's casts and scales
    fuse only under torch.compile). A model of which no layer would be converted is refused: it
    would train in the preset's BF16 under an FP8 name. What was converted is in
    `model._fp8_hardware` (for the run record)."""
    plan = torchao_plan(model, precision_cfg)
    if not plan["converted"]:
        raise ConfigError(nothing_to_convert(model, precision_cfg, plan))
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    validate_hardware(precision_cfg, device)
    chosen = set(plan["converted"])

    def keep(module: nn.Module, fqn: str) -> bool:
        # torchao walks containers through this filter too: only the planned linears convert
        return not isinstance(module, nn.Linear) or fqn in chosen

    f8 = torchao_float8()
    model = f8.convert_to_float8_training(
        model, module_filter_fn=keep, config=float8_config(precision_cfg)
    )
    compiled = bool(precision_cfg.fp8.compile)
    if compiled:
        for name in plan["converted"]:
            model.get_submodule(name).compile()  # in place: names and state_dict stay the same
    model._fp8_hardware = {**plan, "compiled": compiled}
    return model


def nothing_to_convert(model: nn.Module, precision_cfg, plan: dict[str, list[str]]) -> str:
    """Why precision.fp8.mode=torchao would change no layer of `model`, and what to do."""
    why = []
    if plan["exempt"]:
        why.append(f"exempt by precision.fp8.exempt: {', '.join(plan['exempt'])}")
    if plan["skipped_dims"]:
        why.append(f"sizes not multiples of 16: {', '.join(plan['skipped_dims'])}")
    linears = "; ".join(why) if why else "it has none"
    dtype = {"bfloat16": "BF16", "float32": "FP32"}[fp8._name(precision_cfg.compute_dtype)]
    return (
        f"precision={precision_cfg.name} converts no layer of {type(model).__name__} to FP8: "
        f"torchao converts nn.Linear layers only ({linears}), so the run would train in {dtype} "
        "under an FP8 name. Use precision=bf16 for this model, or an experiment with large "
        "linear layers (alexnet, vgg16, faster_rcnn); precision.fp8.exempt=[first] converts "
        "the last layer where its sizes allow"
    )


@register_converter("fp8_torchao")
class TorchaoFP8(Converter):
    """precision.fp8.mode=torchao: torchao's float8 training for the linear layers. Refuses at
    construction (the policy's) a missing torchao or a device without FP8 tensor cores."""

    @classmethod
    def wanted(cls, cfg) -> bool:
        return fp8.fp8_mode(cfg) == "torchao"

    def __init__(self, cfg, device) -> None:
        super().__init__(cfg, device)
        validate_hardware(cfg, device)

    def convert(self, model: nn.Module) -> nn.Module:
        return apply_torchao_float8(model, self.cfg)

    def describe(self) -> str | None:
        return fp8.describe_fp8(self.cfg)
