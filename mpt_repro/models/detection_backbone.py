"""The VGG-16 trunk shared by the two detectors, and its weights from a file.

`vgg16_trunk(width)` is torchvision's VGG-16 `features` (configuration D, no batch norm) with
every channel count scaled by width/64 (model.width; 64 is the real network) and the module
indices of torchvision's `features`, so a torchvision state dict loads by name.

Weights come only from a file the user names (model.backbone_weights), never from a download:
- a torchvision VGG-16 state dict (`torchvision.models.vgg16(weights=...).state_dict()` saved
  with torch.save; keys features.N.* and classifier.{0,3,6}.*), or
- a checkpoint of this suite's own `experiment=vgg16` run (<run dir>/checkpoints/last.pt: the
  model under "models"/"model"; the FP32 master copies are used when the run kept them).
The ImageNet fc6/fc7 (classifier.0/.3) go to Faster R-CNN's box head as they are, and to SSD's
convolutional fc6/fc7 subsampled as Liu et al. did ("VGG_ILSVRC_16_layers_fc_reduced").
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

from mpt_repro.checkpoint import UnsafeFile, refusal, safe_load
from mpt_repro.errors import ConfigError, DataError

log = logging.getLogger("mpt_repro")

# torchvision's cfgs["D"]: channels of each 3x3 conv, "M" a 2x2 max-pool
VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)  # fmt: skip
CONV4_3_RELU = 22  # index in `features` of conv4_3's ReLU (SSD's first source layer)
POOL3, POOL4, CONV5_3_RELU = 16, 23, 29
CONV2_2_END = 10  # features[:10]: conv1_1 .. pool2, frozen by py-faster-rcnn (lr_mult 0)
NO_WEIGHTS_WARNING = (
    "model.backbone_weights is not set: the VGG-16 backbone starts from random weights. The "
    "paper's Table 2 numbers assume an ImageNet pre-trained VGG-16 (expect a much lower mAP); "
    "give model.backbone_weights=/path/vgg16.pth (a torchvision VGG-16 state dict or the "
    "checkpoint of an experiment=vgg16 run)"
)


def scaled(channels: int, width: int) -> int:
    return max(1, channels * width // 64)


def vgg16_trunk(width: int = 64) -> nn.Sequential:
    """VGG-16 `features` (31 modules, indices as torchvision's) at model.width."""
    layers: list[nn.Module] = []
    c_in = 3
    for v in VGG16_CFG:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            c_out = scaled(int(v), width)
            layers += [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            c_in = c_out
    trunk = nn.Sequential(*layers)
    for m in trunk.modules():  # torchvision VGG's initialisation, for runs from scratch
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return trunk


def _load(path: str) -> Any:
    # weights_only=True always (this suite's checkpoints hold tensors and plain values): a file
    # someone shared must not run code when it is named as a backbone
    try:
        return safe_load(path)
    except UnsafeFile as e:
        raise DataError(
            refusal(
                f"model.backbone_weights={path}",
                e,
                "Give a state dict (torch.save(model.state_dict(), ...)) or the "
                "checkpoints/last.pt of an experiment=vgg16 run.",
            )
        ) from None


def _masters_into(sd: dict[str, torch.Tensor], ckpt: dict) -> dict[str, torch.Tensor]:
    """Replace the rounded low-precision weights of a mixed-precision checkpoint by its FP32
    master copies, when the checkpoint has them in the model's parameter order."""
    try:
        masters = ckpt["policy"]["optimizers"]["model"]["masters"]
    except (KeyError, TypeError):
        return sd
    if not masters:
        return sd
    ref = masters[0].dtype
    low = [k for k, v in sd.items() if v.is_floating_point() and v.dtype != ref]
    if len(low) != len(masters) or any(sd[k].shape != m.shape for k, m in zip(low, masters)):
        log.warning("backbone weights: master copies do not line up; using the stored weights")
        return sd
    return {**sd, **dict(zip(low, masters))}


def read_vgg16_state(path: str) -> dict[str, torch.Tensor]:
    """A VGG-16 state dict (features.*, classifier.*) from either kind of file, as float."""
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise DataError(
            f"model.backbone_weights={path} is not a file. Give a torchvision VGG-16 state dict "
            "(torch.save(torchvision.models.vgg16(weights='IMAGENET1K_V1').state_dict(), ...)) "
            "or the checkpoints/last.pt of an experiment=vgg16 run"
        )
    try:
        obj = _load(path)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file: say which and what to do
        raise DataError(f"cannot read model.backbone_weights={path}: {e}") from None
    if isinstance(obj, dict) and "models" in obj:  # this suite's checkpoint
        sd = _masters_into(dict(obj["models"]["model"]), obj)
    elif isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        sd = obj["state_dict"]
    else:
        sd = obj
    if not isinstance(sd, dict):
        raise DataError(f"model.backbone_weights={path} holds no state dict ({type(obj).__name__})")
    sd = {k.removeprefix("module."): v for k, v in sd.items() if torch.is_tensor(v)}
    if "features.0.weight" not in sd:
        raise DataError(
            f"model.backbone_weights={path} is not a VGG-16 state dict (no features.0.weight; "
            f"keys start {sorted(sd)[:4]})"
        )
    return {k: v.float() for k, v in sd.items()}


def load_trunk(trunk: nn.Sequential, sd: dict[str, torch.Tensor], upto: int) -> None:
    """Copy features.N.* for N < upto into the trunk; a clear error on a width mismatch."""
    own = trunk.state_dict()
    for name, tensor in own.items():
        idx = int(name.split(".")[0])
        if idx >= upto:
            continue
        key = f"features.{name}"
        if key not in sd:
            raise DataError(f"backbone weights lack {key}")
        if sd[key].shape != tensor.shape:
            raise ConfigError(
                f"backbone weights: {key} has shape {tuple(sd[key].shape)} but the model's is "
                f"{tuple(tensor.shape)}: the file is the full VGG-16, use model.width=64"
            )
        with torch.no_grad():
            tensor.copy_(sd[key])


def fc_weights(sd: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
    """(fc6 W, fc6 b, fc7 W, fc7 b) of the ImageNet classifier, or None if the file has none."""
    keys = ("classifier.0.weight", "classifier.0.bias", "classifier.3.weight", "classifier.3.bias")
    if not all(k in sd for k in keys):
        return None
    return tuple(sd[k] for k in keys)


def reduce_fc(
    fc6_w: torch.Tensor, fc6_b: torch.Tensor, fc7_w: torch.Tensor, fc7_b: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """SSD's fc6/fc7 as convolutions from VGG's fully connected ones (Liu et al. 2016 §3: "we
    subsample parameters from fc6 and fc7"): fc6 [4096, 512*7*7] -> a 3x3 conv [1024, 512, 3, 3]
    taking every 4th filter and every 3rd of the 7x7 positions (which the atrous conv's
    dilation then spaces out again); fc7 [4096, 4096] -> a 1x1 conv [1024, 1024, 1, 1] taking
    every 4th filter and every 4th input."""
    out6 = fc6_w.shape[0]
    w6 = fc6_w.reshape(out6, -1, 7, 7)[::4, :, ::3, ::3].contiguous()
    w7 = fc7_w[::4, ::4].reshape(out6 // 4, out6 // 4, 1, 1).contiguous()
    return w6, fc6_b[::4].clone(), w7, fc7_b[::4].clone()
