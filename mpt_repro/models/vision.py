"""The ILSVRC12 classifiers of the paper's Table 1 (never pretrained: every run starts from a
fresh, seeded initialisation).

Where the paper's network differs from torchvision's, the paper's is the default and
torchvision's stays available as `model.variant=torchvision`:
- alexnet: `caffe` = BVLC AlexNet (models/caffe_alexnet.py) | `torchvision` (one-GPU variant);
- googlenet: `caffe` = BVLC GoogLeNet (models/caffe_googlenet.py) | `torchvision` (adds BN);
- inception_v2: BN-Inception as the public Caffe prototxt defines it (models/bn_inception.py);
- resnet50: `preact` (models/preact_resnet.py) | `torchvision` (v1.5);
- vgg16: torchvision's (the same network); `caffe` gives it NVIDIA's Caffe prototxt fillers;
- inception_v3: torchvision's (the TF-slim network).

Every builder takes (cfg, num_classes, channels, image_size, **_) like the rest of the registry.
The ImageNet models take RGB input only; `image_size` is checked against each architecture's
smallest valid input so a too-small smoke size fails with a ConfigError, not a shape error deep
in the forward pass.

Outputs: a logits tensor, except the networks with auxiliary heads (GoogLeNet, BN-Inception,
Inception v3 with model.aux_logits=true), which in training mode return (logits, aux logits...)
and in eval mode logits only. mpt_repro.models.losses.classification_loss weighs the auxiliary
losses by model.aux_weight.
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
    "inception_v2": 32,
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


def variant(cfg: Any, name: str, known: tuple[str, ...]) -> str:
    """cfg.variant, or the first (the paper's) of `known` when empty; a ConfigError otherwise."""
    chosen = cfg.variant or known[0]
    if chosen not in known:
        raise ConfigError(
            f"model.variant={cfg.variant!r} is not a {name} variant; use one of {list(known)}"
        )
    return chosen


@register_model("alexnet")
def alexnet(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 227, **_: Any
) -> nn.Module:
    """variant=caffe (default): BVLC AlexNet, the paper's (96-256-384-384-256, LRN, grouped
    convolutions; 60,965,224 parameters at 1000 classes). variant=torchvision: torchvision's
    one-GPU variant (64-192-384-256-256, no LRN, no groups; 61,100,840 parameters)."""
    check_input("alexnet", channels, image_size)
    if variant(cfg, "alexnet", ("caffe", "torchvision")) == "torchvision":
        return torchvision.models.AlexNet(num_classes=num_classes, dropout=cfg.dropout)
    from mpt_repro.models.caffe_alexnet import CaffeAlexNet

    return CaffeAlexNet(num_classes, dropout=cfg.dropout)


@register_model("vgg16")
def vgg16(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """VGG-D (Simonyan & Zisserman 2014, configuration D, no batch norm): 138,357,544 parameters
    at 1000 classes. variant=torchvision (default): torchvision's initialisation (Kaiming
    normal convolutions, N(0, 0.01) classifier). variant=caffe: the same network with NVIDIA's
    Caffe prototxt fillers (NVIDIA/caffe caffe-0.16 models/vgg16/train_val_fp16.prototxt):
    convolutions Caffe "xavier" U(+-sqrt(3 / fan_in)) with bias 0.1, fully connected layers
    N(0, 0.01) with bias 0 (the recipe=nvcaffe setting)."""
    chosen = variant(cfg, "vgg16", ("torchvision", "caffe"))
    check_input("vgg16", channels, image_size)
    model = torchvision.models.vgg16(weights=None, num_classes=num_classes, dropout=cfg.dropout)
    if chosen == "caffe":
        from mpt_repro.models.caffe import xavier_

        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                xavier_(m.weight)
                nn.init.constant_(m.bias, 0.1)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)
    return model


@register_model("googlenet")
def googlenet(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """variant=caffe (default): BVLC GoogLeNet, the paper's (LRN, real 5x5 convolutions, no batch
    norm; 6,998,552 parameters + 6,379,728 in the two auxiliary heads). variant=torchvision:
    torchvision's (batch norm after every convolution, a 3x3 conv in the "5x5" branch; 6.6 M +
    6.4 M)."""
    check_input("googlenet", channels, image_size)
    if variant(cfg, "googlenet", ("caffe", "torchvision")) == "torchvision":
        return torchvision.models.GoogLeNet(
            **_torchvision_inception(cfg, num_classes), dropout_aux=cfg.aux_dropout
        )
    from mpt_repro.models.caffe_googlenet import CaffeGoogLeNet

    return CaffeGoogLeNet(
        num_classes, aux_logits=cfg.aux_logits, dropout=cfg.dropout, aux_dropout=cfg.aux_dropout
    )


@register_model("inception_v2")
def inception_v2(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """BN-Inception as the public Caffe prototxt defines it (default_googlenet_v2): 11,194,984
    parameters + 4,880,848 in the two auxiliary heads. One variant (caffe)."""
    from mpt_repro.models.bn_inception import BNInception, grid_problem

    variant(cfg, "inception_v2", ("caffe",))
    check_input("inception_v2", channels, image_size)
    problem = grid_problem(image_size)
    if problem:
        raise ConfigError(
            f"model.name=inception_v2 cannot take data.image_size={image_size}: {problem}. "
            "Use 224 (the recipe), 64 or 32 px."
        )
    return BNInception(num_classes, dropout=cfg.dropout, aux_logits=cfg.aux_logits)


@register_model("inception_v3")
def inception_v3(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 299, **_: Any
) -> nn.Module:
    """torchvision's Inception v3 (Szegedy et al. 2016; the TF-slim network): 23.8 M parameters
    without the auxiliary head, 27.2 M with it. The auxiliary head needs a 17x17 grid, so it needs
    299 px inputs. Deviation from TF-slim: its batch norms have a scale (gamma), TF-slim's have
    none (`scale=False`), 0.03 M parameters more."""
    # The aux head pools 5x5/3 then convolves 5x5 on the 17x17 stage: it needs the full 299 px
    # (measured: 298 px fails inside torchvision).
    variant(cfg, "inception_v3", ("torchvision",))
    check_input("inception_v3", channels, image_size, min_size=299 if cfg.aux_logits else None)
    return torchvision.models.Inception3(**_torchvision_inception(cfg, num_classes))


@register_model("resnet50")
def resnet50(
    cfg: Any, num_classes: int, channels: int = 3, image_size: int = 224, **_: Any
) -> nn.Module:
    """ResNet-50, variant per model.variant:
    - "preact": pre-activation ResNet-50 (He et al. 2016b, "Identity Mappings"), the paper's row;
    - "torchvision": torchvision's ResNet-50 v1.5 (post-activation, stride on the 3x3 conv).
    Both are 25.6 M parameters at 1000 classes."""
    check_input("resnet50", channels, image_size)
    if variant(cfg, "resnet50", ("preact", "torchvision")) == "torchvision":
        return torchvision.models.resnet50(weights=None, num_classes=num_classes)
    from mpt_repro.models.preact_resnet import preact_resnet50

    return preact_resnet50(num_classes)


def _torchvision_inception(cfg: Any, num_classes: int) -> dict[str, Any]:
    """What torchvision's GoogLeNet and Inception3 take alike: init_weights=True, their documented
    truncated-normal init (and no FutureWarning); transform_input=False, the input is already
    normalised with ImageNet mean/std."""
    return dict(
        num_classes=num_classes,
        aux_logits=cfg.aux_logits,
        transform_input=False,
        init_weights=True,
        dropout=cfg.dropout,
    )
