"""The ILSVRC12 classifiers of the paper's Table 1, built from torchvision's classes (never
pretrained: every run starts from a fresh, seeded initialisation).

Architectures torchvision lacks live beside this file: BN-Inception ("Inception v2",
models/bn_inception.py) and the pre-activation ResNet-50 (models/preact_resnet.py).

Every builder takes (cfg, num_classes, channels, image_size, **_) like the rest of the registry.
The ImageNet models take RGB input only; `image_size` is checked against each architecture's
smallest valid input so a too-small smoke size fails with a ConfigError, not a shape error deep
in the forward pass.

Outputs: a logits tensor, except GoogLeNet and Inception v3 built with model.aux_logits=true,
which in training mode return torchvision's named tuple (logits, aux logits...) and in eval mode
return logits only.
"""

from __future__ import annotations

from typing import Any

import torchvision
from torch import nn

from mpt_repro.errors import ConfigError
from mpt_repro.models import register_model

# Smallest input (pixels) each architecture accepts; below it a pooling stage has nothing left.
# AlexNet: conv 11/4 and three 3/2 max-pools; VGG and ResNet: five 2x down-samplings;
# GoogLeNet: five down-samplings; Inception v3: torchvision's documented minimum of 75 px.
MIN_IMAGE_SIZE = {
    "alexnet": 63,
    "vgg16": 32,
    "googlenet": 32,
    "inception_v3": 75,
    "resnet50": 32,
}


def check_input(name: str, channels: int, image_size: int, min_size: int | None = None) -> None:
    if channels != 3:
        raise ConfigError(
            f"model.name={name} is an ImageNet architecture and takes RGB images "
            f"(data.channels=3, got {channels})"
        )
    least = min_size if min_size is not None else MIN_IMAGE_SIZE[name]
    if image_size < least:
        raise ConfigError(f"model.name={name} needs data.image_size >= {least} (got {image_size})")


@register_model("alexnet")
def alexnet(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """torchvision's AlexNet (the one-GPU variant of Krizhevsky et al. 2012; no LRN, no grouped
    convolutions, 64 filters in conv1): 61.1 M parameters at 1000 classes."""
    check_input("alexnet", channels, image_size)
    return torchvision.models.AlexNet(num_classes=num_classes, dropout=cfg.dropout)


@register_model("vgg16")
def vgg16(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """VGG-D (Simonyan & Zisserman 2014, configuration D, no batch norm): 138.4 M parameters."""
    check_input("vgg16", channels, image_size)
    return torchvision.models.vgg16(weights=None, num_classes=num_classes, dropout=cfg.dropout)


@register_model("googlenet")
def googlenet(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """torchvision's GoogLeNet (Inception v1, Szegedy et al. 2015). Unlike the 2014 Caffe model it
    has batch norm after every convolution; 6.6 M parameters without the two auxiliary heads."""
    check_input("googlenet", channels, image_size)
    # init_weights=True: the documented truncated-normal init (and no FutureWarning);
    # transform_input=False: the input is already normalised with ImageNet mean/std.
    return torchvision.models.GoogLeNet(
        num_classes=num_classes,
        aux_logits=cfg.aux_logits,
        transform_input=False,
        init_weights=True,
        dropout=cfg.dropout,
    )


@register_model("inception_v3")
def inception_v3(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 299, **_: Any
) -> nn.Module:
    """torchvision's Inception v3 (Szegedy et al. 2016): 23.8 M parameters without the auxiliary
    head, 27.2 M with it. The auxiliary head needs a 17x17 grid, so it needs 299 px inputs."""
    # The aux head pools 5x5/3 then convolves 5x5 on the 17x17 stage: it needs the full 299 px
    # (measured: 298 px fails inside torchvision).
    check_input("inception_v3", channels, image_size, min_size=299 if cfg.aux_logits else None)
    return torchvision.models.Inception3(
        num_classes=num_classes,
        aux_logits=cfg.aux_logits,
        transform_input=False,
        init_weights=True,
        dropout=cfg.dropout,
    )


@register_model("resnet50")
def resnet50(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """ResNet-50, variant per model.variant:
    - "preact": pre-activation ResNet-50 (He et al. 2016b, "Identity Mappings"), the paper's row;
    - "torchvision": torchvision's ResNet-50 v1.5 (post-activation, stride on the 3x3 conv).
    Both are 25.6 M parameters at 1000 classes."""
    check_input("resnet50", channels, image_size)
    variant = cfg.variant or "preact"
    if variant == "torchvision":
        return torchvision.models.resnet50(weights=None, num_classes=num_classes)
    if variant == "preact":
        from mpt_repro.models.preact_resnet import preact_resnet50

        return preact_resnet50(num_classes)
    raise ConfigError(
        f"model.variant={cfg.variant!r} is not a ResNet-50 variant; use preact or torchvision"
    )
