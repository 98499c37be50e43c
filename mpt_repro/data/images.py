"""Unlabelled images from a folder (CelebA's img_align_celeba, or any ImageFolder) for the GAN task.

Layout: data.root holds one or more sub-folders of images (torchvision ImageFolder), e.g.
  celeba/img_align_celeba/000001.jpg ...   -> data.root=celeba
Labels (the sub-folder) are ignored. Every 100th image is held out for evaluation, the rest
train. Images are resized on their shorter side, centre-cropped to data.image_size (DCGAN's
CelebA preprocessing) and mapped to [-1, 1], the range of the generator's tanh.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Subset

from mpt_repro.data import ImageData, data_root, register_dataset
from mpt_repro.errors import DataError

HOLD_OUT_EVERY = 100
LAYOUT = "a folder holding one or more sub-folders of images (e.g. celeba/img_align_celeba/*.jpg)"


def _to_rgb(image: Any) -> Any:
    return image.convert("RGB")  # a named function: picklable for DataLoader workers


@register_dataset("images")
def images(cfg: Any) -> ImageData:
    from torchvision import datasets, transforms

    root = data_root(cfg.root, "images", LAYOUT)
    size = cfg.image_size
    transform = transforms.Compose(
        [
            transforms.Resize(size),
            transforms.CenterCrop(size),
            transforms.Grayscale(1) if cfg.channels == 1 else transforms.Lambda(_to_rgb),
            transforms.ToTensor(),
            transforms.Normalize([0.5] * cfg.channels, [0.5] * cfg.channels),
        ]
    )
    try:
        folder = datasets.ImageFolder(str(root), transform=transform)
    except (FileNotFoundError, RuntimeError) as e:  # no sub-folders, or no image files in them
        raise DataError(f"no images found under {root}: {e}; expected {LAYOUT}") from None
    held_out = list(range(0, len(folder), HOLD_OUT_EVERY))
    train = [i for i in range(len(folder)) if i % HOLD_OUT_EVERY]
    if not train:
        raise DataError(
            f"{root} has {len(folder)} images: too few to hold out 1 in {HOLD_OUT_EVERY} for "
            "evaluation"
        )
    return ImageData(
        train=Subset(folder, train),
        eval=Subset(folder, held_out),
        num_classes=len(folder.classes),
        channels=cfg.channels,
        description=(
            f"images from {root} ({len(train)} train / {len(held_out)} held out, {size}x{size})"
        ),
    )
