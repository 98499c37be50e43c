"""ILSVRC12 (ImageNet-1k) from an ImageFolder tree, with the augmentation of the paper's Table 1.

Layout (data.root):
    root/train/<wnid>/*.JPEG      1,281,167 images in 1000 class folders
    root/val/<wnid>/*.JPEG        50,000 images, sorted into the same 1000 class folders
(the official validation tarball is flat: sort it first, e.g. with the widely used valprep.sh).

Augmentation (data.augmentation), paper §4.1:
- "caffe": the Caffe models' recipe: the image resized to resize_size x resize_size (Caffe's
  ImageNet LMDBs hold 256x256 images, aspect ratio not kept), a random image_size crop and a
  random horizontal flip. Validation: the same 256x256 image, centre crop (Caffe's TEST phase).
- "torchvision": the PyTorch ImageNet example / torchvision reference script, which the paper
  used for ResNet-50: RandomResizedCrop(image_size) (scale 0.08-1, aspect 3/4-4/3) and flip.
  Validation: shorter side resized to resize_size, one centre crop.
- "inception": the same transforms, at Inception v3's 299 px (validation resize 342).
- "none": the validation transform for training too.
All: ImageNet mean/std normalisation. Validation is always a single centre crop.

Order: samples are interleaved across classes (class 0 image 0, class 1 image 0, ..., class 0
image 1, ...) so that the budgets' "first N examples" subsets (data.train_limit / eval_limit)
cover every class evenly instead of the first few classes of a sorted folder listing.

Problems with the data raise DataError naming what to fix. A corrupt or unreadable image stops
the run with DataError naming the file (policy: fail loudly; silently skipping files would change
the training set between runs without anyone noticing). The error is raised in the loader
worker and re-raised by the DataLoader in the main process with the same type and message.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from PIL import Image
from torchvision import transforms as T
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from mpt_repro.data import ImageData, register_dataset
from mpt_repro.errors import DataError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

LAYOUT = (
    "point data.root at a folder with train/ and val/ in ImageFolder layout: "
    "root/train/<wnid>/*.JPEG and root/val/<wnid>/*.JPEG with the same class folders "
    "(the official val tarball is flat: sort it into class folders first), see README and "
    "docs/experiments_vision.md; e.g. mpt-run experiment=resnet50 data.root=/data/imagenet. "
    "Without ImageNet, data=synthetic runs the same model on random images of the same shape"
)


def default_resize(image_size: int) -> int:
    """The validation resize for an image_size crop: 256 for 224, 342 for 299 (ratio 256/224)."""
    return int(round(image_size * 256 / 224))


def build_transforms(
    augmentation: str, image_size: int, resize_size: int | None
) -> tuple[Callable, Callable]:
    """(train transform, validation transform) for one augmentation recipe."""
    resize = resize_size or default_resize(image_size)
    if resize < image_size:
        raise DataError(
            f"data.resize_size={resize} is smaller than the crop data.image_size={image_size}"
        )
    finish = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    if augmentation == "caffe":
        square = T.Resize((resize, resize))  # Caffe's 256x256 LMDB images: aspect ratio not kept
        train = T.Compose([square, T.RandomCrop(image_size), T.RandomHorizontalFlip(), *finish])
        val = T.Compose([square, T.CenterCrop(image_size), *finish])
        return train, val
    val = T.Compose([T.Resize(resize), T.CenterCrop(image_size), *finish])
    if augmentation in ("torchvision", "inception"):
        train = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), *finish])
        return train, val
    if augmentation == "none":
        return val, val
    raise DataError(
        f"data.augmentation={augmentation!r} is not one of none, caffe, torchvision, inception"
    )


def load_rgb(path: str) -> Image.Image:
    """PIL loader that names the file when it cannot be decoded (truncated, not an image...)."""
    try:
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")  # convert() forces the full decode inside the try
    except (OSError, SyntaxError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise DataError(
            f"cannot read image {path}: {e}. Replace or delete this file and run again"
        ) from None


class ImageNetFolder(ImageFolder):
    """ImageFolder with a class-interleaved sample order and a loader that reports bad files."""

    def __init__(self, root: str, transform: Callable):
        super().__init__(root, transform=transform, loader=load_rgb)
        by_class: list[list[tuple[str, int]]] = [[] for _ in self.classes]
        for path, target in self.samples:
            by_class[target].append((path, target))
        longest = max(len(c) for c in by_class)
        self.samples = [c[i] for i in range(longest) for c in by_class if i < len(c)]
        self.imgs = self.samples
        self.targets = [t for _, t in self.samples]


def class_folders(split_dir: str) -> list[str]:
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir())


def open_split(root: str, split: str, transform: Callable) -> ImageNetFolder:
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
        raise DataError(f"data.root={root} has no {split}/ folder; {LAYOUT}")
    if not class_folders(split_dir):
        raise DataError(f"{split_dir} holds no class folders (it is empty or flat); {LAYOUT}")
    try:
        return ImageNetFolder(split_dir, transform)
    except FileNotFoundError as e:  # torchvision: a class folder without any image file
        raise DataError(
            f"{split_dir}: {e}. Every class folder needs at least one image "
            f"({', '.join(IMG_EXTENSIONS)}); {LAYOUT}"
        ) from None


@register_dataset("imagenet")
def imagenet(cfg: Any) -> ImageData:
    if not cfg.root:
        raise DataError(f"data.root is not set; {LAYOUT}")
    root = os.path.expanduser(str(cfg.root))
    if not os.path.isdir(root):
        raise DataError(f"data.root={root} does not exist; {LAYOUT}")
    train_tf, val_tf = build_transforms(cfg.augmentation, cfg.image_size, cfg.resize_size)
    train = open_split(root, "train", train_tf)
    val = open_split(root, "val", val_tf)
    if train.classes != val.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise DataError(
            f"train/ and val/ under {root} have different class folders "
            f"(only in train: {only_train[:5]}{'...' if len(only_train) > 5 else ''}, "
            f"only in val: {only_val[:5]}{'...' if len(only_val) > 5 else ''}); labels would not "
            f"match. {LAYOUT}"
        )
    num_classes = len(train.classes)
    if num_classes != cfg.num_classes:
        # A subset of ImageNet (e.g. 100 classes) is fine; the model follows the folders.
        warnings.warn(
            f"data.num_classes={cfg.num_classes} but {root} has {num_classes} class folders; "
            f"using {num_classes}",
            stacklevel=2,
        )
    return ImageData(
        train=train,
        eval=val,
        num_classes=num_classes,
        channels=3,
        description=(
            f"ImageNet ImageFolder at {root}: {len(train)} train / {len(val)} val images, "
            f"{num_classes} classes; "
            f"augmentation {cfg.augmentation}, crop {cfg.image_size}, "
            f"val resize {cfg.resize_size or default_resize(cfg.image_size)} + single centre crop"
        ),
    )
