"""ILSVRC12 (ImageNet-1k), and any ImageFolder data set, with the augmentation of the paper's
Table 1.

Layout (data=imagenet, data.root):
    root/train/<wnid>/*.JPEG      1,281,167 images in 1000 class folders
    root/val/<wnid>/*.JPEG        50,000 images, sorted into the same 1000 class folders
(the official validation tarball is flat: sort it first, e.g. with the widely used valprep.sh).
data=imagefolder takes the same layout (val/ may also be valid/, validation/ or test/), or a
single folder of class folders, root/<class>/*.jpg, from which every data.holdout_every-th image
of each class is held out for evaluation. The class count is the folder's.

Augmentation (data.augmentation), paper §4.1:
- "caffe": the Caffe models' recipe: the image resized to resize_size x resize_size (Caffe's
  ImageNet LMDBs hold 256x256 images, aspect ratio not kept), a random image_size crop and a
  random horizontal flip. Validation: the same 256x256 image, centre crop (Caffe's TEST phase).
- "torchvision": the PyTorch ImageNet example / torchvision reference script, which the paper
  used for ResNet-50: RandomResizedCrop(image_size) (scale 0.08-1, aspect 3/4-4/3) and flip.
  Validation: shorter side resized to resize_size, one centre crop.
- "inception": the same transforms, at Inception v3's 299 px (validation resize 342).
- "none": the validation transform for training too.
All: ImageNet mean/std normalisation, done on the training device (mpt_repro/data/device.py):
loader workers decode and crop, and batches travel to the device as uint8, 4x less than float32.
With data.decode=gpu the workers only read the files; JPEGs are decoded on the GPU (nvJPEG via
torchvision.io.decode_jpeg) and cropped there, for machines whose CPU cores cannot decode as
fast as the GPU trains (crop parameters then come from the main process's random stream). The
crops run one image at a time on the training thread, so this path is slower than it could be
(docs/performance.md, "The input side").

Order: samples are interleaved across classes (class 0 image 0, class 1 image 0, ..., class 0
image 1, ...) so that the budgets' "first N examples" subsets (data.train_limit / eval_limit)
cover every class evenly instead of the first few classes of a sorted folder listing.

Bad files: problems raise DataError naming the file and the fix. A corrupt or unreadable image
stops the run (data.on_corrupt=fail, the default: the official ImageNet release has no corrupt
file, so one means a broken copy, and silently skipping would change the training set between
runs without anyone noticing). data.on_corrupt=skip logs a warning per bad file and uses the
next image in its place (for data sets scraped from the web); every skipped file is marked in a
flag tensor in shared memory, so the skips of loader workers reach the main process, and the run
record's data description counts them (mpt_repro.data.describe_sizes). Any other error while
loading a sample is reported with the file's path; from a loader worker it arrives as one line
(mpt_repro/data/device.py), not as the worker's traceback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Subset
from torchvision import transforms as T
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from mpt_repro.data import ImageData, register_dataset
from mpt_repro.data.device import normalize_on_device
from mpt_repro.errors import ConfigError, DataError
from mpt_repro.safeio import open_regular

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EVAL_SPLITS = ("val", "valid", "validation", "test")  # imagefolder: the first one present
MAX_SKIPPED_IN_A_ROW = 16  # on_corrupt=skip: more bad files in a row than this is not a few

log = logging.getLogger("mpt_repro")

LAYOUT = (
    "point data.root at a folder with train/ and val/ in ImageFolder layout: "
    "root/train/<wnid>/*.JPEG and root/val/<wnid>/*.JPEG with the same class folders "
    "(the official val tarball is flat: sort it into class folders first), see README and "
    "docs/experiments_vision.md; e.g. mpt-run experiment=resnet50 data.root=/data/imagenet. "
    "Without ImageNet, data=synthetic runs the same model on random images of the same shape"
)
FOLDER_LAYOUT = (
    "data=imagefolder takes root/train/<class>/* with root/val/<class>/* (or valid/, "
    "validation/, test/), or root/<class>/* alone (every data.holdout_every-th image of each "
    "class is then held out for evaluation)"
)


def default_resize(image_size: int) -> int:
    """The validation resize for an image_size crop: 256 for 224, 342 for 299 (ratio 256/224)."""
    return int(round(image_size * 256 / 224))


def geometric_transforms(
    augmentation: str, image_size: int, resize_size: int | None
) -> tuple[Callable, Callable]:
    """(train, validation) resize/crop/flip of one recipe. They work on PIL images (in loader
    workers) and on uint8 tensors (on the GPU after GPU decoding) alike."""
    resize = resize_size or default_resize(image_size)
    if resize < image_size:
        raise DataError(
            f"data.resize_size={resize} is smaller than the crop data.image_size={image_size}"
        )
    if augmentation == "caffe":
        square = T.Resize((resize, resize))  # Caffe's 256x256 LMDB images: aspect ratio not kept
        train = T.Compose([square, T.RandomCrop(image_size), T.RandomHorizontalFlip()])
        return train, T.Compose([square, T.CenterCrop(image_size)])
    val = T.Compose([T.Resize(resize), T.CenterCrop(image_size)])
    if augmentation in ("torchvision", "inception"):
        return T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip()]), val
    if augmentation == "none":
        return val, val
    raise DataError(
        f"data.augmentation={augmentation!r} is not one of none, caffe, torchvision, inception"
    )


class CorruptImage(DataError):
    """An image file that cannot be decoded (data.on_corrupt decides what happens)."""


def load_rgb(path: str) -> Image.Image:
    """PIL loader that names the file when it cannot be decoded (truncated, not an image...)."""
    try:
        with open_regular(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")  # convert() forces the full decode inside the try
    except (OSError, SyntaxError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        # PIL's own text for an unknown format names a file object, not the path
        why = "not an image format PIL can decode" if isinstance(e, UnidentifiedImageError) else e
        raise CorruptImage(
            f"cannot read image {path}: {why}. Replace or delete this file and run again (or "
            "data.on_corrupt=skip to skip bad files with a warning)"
        ) from None


def read_bytes(path: str) -> torch.Tensor:
    """A file's bytes as a uint8 tensor (the input of GPU decoding)."""
    try:
        with open_regular(path, "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e}") from None


def collate_raw(samples: list) -> tuple[list[torch.Tensor], torch.Tensor, list[int]]:
    """A batch of undecoded files: (bytes per image, labels, sample indices)."""
    data, labels, index = zip(*samples)
    return list(data), torch.tensor(labels), list(index)


class ImageNetFolder(ImageFolder):
    """An ImageFolder split: class-interleaved order, errors that name the file, the corrupt-file
    policy. Three ways to read sample i:
    - ``load_uint8(i)``: the crop as uint8 (C, H, W), what the task's loaders use (the batch is
      normalised on the device, see device_prepare);
    - ``load_raw(i)``: the file's bytes, for data.decode=gpu (device_decode decodes and crops);
    - ``ds[i]``: the crop as normalised float32, as ToTensor + Normalize give it, for code that
      indexes the data set directly (BN recalibration, tests, notebooks)."""

    def __init__(self, root: str, geometric: Callable, on_corrupt: str = "fail"):
        super().__init__(root, loader=load_rgb)
        by_class: list[list[tuple[str, int]]] = [[] for _ in self.classes]
        for path, target in self.samples:
            by_class[target].append((path, target))
        longest = max(len(c) for c in by_class)
        self.samples = [c[i] for i in range(longest) for c in by_class if i < len(c)]
        self.imgs = self.samples
        self.targets = [t for _, t in self.samples]
        self.geometric, self.on_corrupt = geometric, on_corrupt
        self._warned: set[str] = set()
        # corrupt[i]: sample i was skipped (on_corrupt=skip). In shared memory: loader workers
        # (forked or spawned) write the same flags that the main process reads for the record.
        self.corrupt = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x, target = self.load_uint8(index)
        return normalize_on_device(x[None], IMAGENET_MEAN, IMAGENET_STD)[0], target

    def load_uint8(self, index: int) -> tuple[torch.Tensor, int]:
        for k in range(MAX_SKIPPED_IN_A_ROW + 1):
            i = (index + k) % len(self.samples)
            path, target = self.samples[i]
            try:
                return T.functional.pil_to_tensor(self.geometric(self.loader(path))), target
            except CorruptImage as e:
                if self.on_corrupt != "skip":
                    raise
                self.skipped(i, e)
            except DataError:
                raise
            except Exception as e:  # a transform's error, a PIL bug...: which file, and what
                raise DataError(f"{path}: {type(e).__name__}: {e}") from e
        raise DataError(
            f"{MAX_SKIPPED_IN_A_ROW + 1} corrupt images in a row from "
            f"{self.samples[index][0]}: more than a few bad files; check the copy of the data set"
        )

    def load_raw(self, index: int) -> tuple[torch.Tensor, int, int]:
        path, target = self.samples[index]
        return read_bytes(path), target, index

    def skipped(self, index: int, e: BaseException) -> None:
        """Mark sample ``index`` as skipped and warn (once per file and loader worker)."""
        self.corrupt[index] = True
        path = self.samples[index][0]
        if path not in self._warned:
            self._warned.add(path)
            log.warning("data.on_corrupt=skip: skipping %s (%s)", path, e)

    def device_prepare(
        self, device: torch.device, dtype: torch.dtype, memory_format: torch.memory_format
    ) -> Callable[[Any], tuple[torch.Tensor, torch.Tensor]]:
        """A loader batch of load_uint8 samples -> model input on the device."""

        def prepare(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = batch
            x = x.to(device, non_blocking=True)
            x = normalize_on_device(x, IMAGENET_MEAN, IMAGENET_STD, dtype, memory_format)
            return x, y.to(device, non_blocking=True)

        return prepare

    def device_decode(
        self, device: torch.device, dtype: torch.dtype, memory_format: torch.memory_format
    ) -> DeviceDecode:
        """A loader batch of load_raw samples (collate_raw) -> model input on the device."""
        return DeviceDecode(self, device, dtype, memory_format)


class DeviceDecode:
    """data.decode=gpu: decode a batch of JPEG files on the device (batched nvJPEG), crop each
    image there, stack, normalise. A file nvJPEG cannot decode (a CMYK JPEG, a PNG named .JPEG;
    ImageNet's train set has a few dozen) is decoded by PIL on the host instead."""

    def __init__(
        self,
        folder: ImageNetFolder,
        device: torch.device,
        dtype: torch.dtype,
        memory_format: torch.memory_format,
    ):
        self.folder, self.device, self.dtype, self.memory_format = (
            folder,
            device,
            dtype,
            memory_format,
        )
        self.crop = folder.geometric

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # deprecated since torchvision 0.29 for TorchCodec's, kept until that is checked on a GPU
        from torchvision.io import ImageReadMode, decode_jpeg

        data, labels, index = batch
        try:
            images = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:  # one bad file fails the batched call: decode one by one
            images = [self._one(d, i) for d, i in zip(data, index)]
        kept = [img for img in images if img is not None]
        if not kept:
            raise DataError(f"no image of this batch could be decoded (first: {self._path(0)})")
        # on_corrupt=skip: a bad file's place goes to another image of the same batch
        images = [img if img is not None else kept[0] for img in images]
        # one image at a time on the training stream: 6-8 small kernels each, not overlapped
        # with the step (why decode=gpu is slower than it could be: docs/performance.md)
        x = torch.stack([self.crop(img) for img in images])
        x = normalize_on_device(x, IMAGENET_MEAN, IMAGENET_STD, self.dtype, self.memory_format)
        return x, labels.to(self.device, non_blocking=True)

    def _path(self, index: int) -> str:
        return self.folder.samples[index][0]

    def _one(self, data: torch.Tensor, index: int) -> torch.Tensor | None:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            pass
        path = self._path(index)
        try:
            return T.functional.pil_to_tensor(load_rgb(path)).to(self.device)
        except CorruptImage as e:
            if self.folder.on_corrupt != "skip":
                raise
            self.folder.skipped(index, e)
            return None


def class_folders(split_dir: str) -> list[str]:
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir())


def open_split(
    root: str,
    split: str | None,
    geometric: Callable,
    on_corrupt: str = "fail",
    layout: str = LAYOUT,
) -> ImageNetFolder:
    """root/split (or root itself when split is None) as an ImageNetFolder."""
    split_dir = os.path.join(root, split) if split else root
    if not os.path.isdir(split_dir):
        raise DataError(f"data.root={root} has no {split}/ folder; {layout}")
    if not class_folders(split_dir):
        raise DataError(f"{split_dir} holds no class folders (it is empty or flat); {layout}")
    try:
        return ImageNetFolder(split_dir, geometric, on_corrupt=on_corrupt)
    except FileNotFoundError as e:  # torchvision: a class folder without any image file
        raise DataError(
            f"{split_dir}: {e}. Every class folder needs at least one image "
            f"({', '.join(IMG_EXTENSIONS)}); {layout}"
        ) from None


def _check_root(cfg: Any, layout: str) -> str:
    if not cfg.root:
        raise DataError(f"data.root is not set; {layout}")
    root = os.path.expanduser(str(cfg.root))
    if not os.path.isdir(root):
        raise DataError(f"data.root={root} does not exist; {layout}")
    return root


def _pipelines(cfg: Any) -> tuple[Callable, Callable]:
    """(train, validation) crops of data.augmentation; data.decode=gpu needs a GPU."""
    if cfg.decode == "gpu" and not torch.cuda.is_available():
        raise ConfigError(
            "data.decode=gpu decodes JPEGs on the CUDA device, and none is visible; use "
            "data.decode=cpu"
        )
    return geometric_transforms(cfg.augmentation, cfg.image_size, cfg.resize_size)


def _same_classes(train: ImageNetFolder, val: ImageNetFolder, root: str, layout: str) -> None:
    if train.classes != val.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise DataError(
            f"the training and evaluation folders under {root} have different class folders "
            f"(only in train: {only_train[:5]}{'...' if len(only_train) > 5 else ''}, "
            f"only in val: {only_val[:5]}{'...' if len(only_val) > 5 else ''}); labels would not "
            f"match. {layout}"
        )


def _describe(cfg: Any) -> str:
    return (
        f"augmentation {cfg.augmentation}, crop {cfg.image_size}, "
        f"val resize {cfg.resize_size or default_resize(cfg.image_size)} + single centre crop, "
        f"decode on {cfg.decode}"
    )


@register_dataset("imagenet")
def imagenet(cfg: Any) -> ImageData:
    root = _check_root(cfg, LAYOUT)
    train_tf, val_tf = _pipelines(cfg)
    train = open_split(root, "train", train_tf, cfg.on_corrupt)
    val = open_split(root, "val", val_tf, cfg.on_corrupt)
    _same_classes(train, val, root, LAYOUT)
    num_classes = len(train.classes)
    if num_classes != cfg.num_classes:
        # A subset of ImageNet (e.g. 100 classes) is fine; the model follows the folders.
        log.warning(
            "data.num_classes=%d but %s has %d class folders; using %d",
            cfg.num_classes,
            root,
            num_classes,
            num_classes,
        )
    return ImageData(
        train=train,
        eval=val,
        num_classes=num_classes,
        channels=3,
        description=(
            f"ImageNet ImageFolder at {root}: {len(train)} train / {len(val)} val images, "
            f"{num_classes} classes; {_describe(cfg)}"
        ),
    )


@register_dataset("imagefolder")
def imagefolder(cfg: Any) -> ImageData:
    """Any ImageFolder data set, loaded as ImageNet is (the same recipes, checks and speed)."""
    root = _check_root(cfg, FOLDER_LAYOUT)
    train_tf, val_tf = _pipelines(cfg)
    has_train = os.path.isdir(os.path.join(root, "train"))
    eval_split = next(
        (s for s in EVAL_SPLITS if has_train and os.path.isdir(os.path.join(root, s))), None
    )
    if has_train and eval_split:
        train = open_split(root, "train", train_tf, cfg.on_corrupt, FOLDER_LAYOUT)
        val = open_split(root, eval_split, val_tf, cfg.on_corrupt, FOLDER_LAYOUT)
        _same_classes(train, val, root, FOLDER_LAYOUT)
        train_set, eval_set, split = train, val, f"train/ and {eval_split}/"
    else:
        # one folder of classes (or train/ alone): every N-th image of each class held out
        split_dir = "train" if has_train else None
        train = open_split(root, split_dir, train_tf, cfg.on_corrupt, FOLDER_LAYOUT)
        val = open_split(root, split_dir, val_tf, cfg.on_corrupt, FOLDER_LAYOUT)
        held = _held_out(train.targets, cfg.holdout_every)
        if not held:
            raise DataError(
                f"{root}: no class has {cfg.holdout_every} images, so nothing is held out for "
                f"evaluation; add a val/ folder or lower data.holdout_every. {FOLDER_LAYOUT}"
            )
        held_set = set(held)
        train_set = Subset(train, [i for i in range(len(train)) if i not in held_set])
        eval_set = Subset(val, held)
        split = f"every {cfg.holdout_every}th image of each class held out"
    num_classes = len(train.classes)
    if num_classes < 2:
        raise DataError(f"{root} has {num_classes} class folder: a classifier needs at least 2")
    if num_classes != cfg.num_classes:
        log.info(
            "data=imagefolder: %d classes from the folders of %s (data.num_classes=%d is not used)",
            num_classes,
            root,
            cfg.num_classes,
        )
    return ImageData(
        train=train_set,
        eval=eval_set,
        num_classes=num_classes,
        channels=3,
        description=(
            f"ImageFolder at {root} ({split}): {len(train_set)} train / {len(eval_set)} eval "
            f"images, {num_classes} classes; {_describe(cfg)}"
        ),
    )


def _held_out(targets: list[int], every: int) -> list[int]:
    """Indices of every `every`-th image of each class (the last of each group of `every`)."""
    seen: dict[int, int] = {}
    held = []
    for i, t in enumerate(targets):
        seen[t] = seen.get(t, 0) + 1
        if seen[t] % every == 0:
            held.append(i)
    return held
