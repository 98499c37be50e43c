"""Detection data sets for the detection task: `data=voc` (mpt_repro/data/voc.py) and
`data=synthetic` (random images with random boxes, for smoke runs without VOC).

Not part of the image registry of mpt_repro/data/__init__.py: a detection item is an image with
a variable number of boxes, not an (image, label) pair. The detection task calls
build_detection_data; the transform follows the model's input geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mpt_repro.data.detection_transforms import build_detection_transform
from mpt_repro.data.voc import VOC_CLASSES, Annotation, DetectionDataset, voc_annotations
from mpt_repro.errors import ConfigError, DataError


@dataclass
class DetectionData:
    train: DetectionDataset
    eval: DetectionDataset
    class_names: tuple[str, ...]  # label c is class_names[c - 1]; 0 is background
    description: str = ""

    @property
    def num_classes(self) -> int:
        """Classes the detector predicts, background included (21 for VOC)."""
        return len(self.class_names) + 1


class SyntheticDetection(DetectionDataset):
    """Random images, each with 1-3 filled rectangles whose colour depends on the class, on a
    noise background; about one box in ten is marked difficult. Deterministic per index; image
    sizes vary around image_size (0.75x to 1.25x per side) to exercise variable-size batches.
    A detector can learn it, so mAP rises in a short run; it measures nothing about VOC."""

    def __init__(self, size: int, image_size: int, num_classes: int, seed: int, transform: Any):
        g = torch.Generator().manual_seed(seed)
        self.colours = torch.randint(0, 256, (num_classes + 1, 3), generator=g)
        self.seed = seed
        anns = [self._annotation(i, image_size, num_classes) for i in range(size)]
        super().__init__(anns, transform, keep_difficult=True, loader=self._draw_by_id)

    def _annotation(self, i: int, image_size: int, num_classes: int) -> Annotation:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        h, w = (int(image_size * (0.75 + 0.5 * float(torch.rand((), generator=g)))) for _ in "hw")
        n = int(torch.randint(1, 4, (), generator=g))
        wh = torch.rand(n, 2, generator=g) * 0.5 + 0.2  # 20% to 70% of the side
        xy = torch.rand(n, 2, generator=g) * (1 - wh)
        boxes = torch.cat([xy, xy + wh], 1) * torch.tensor([w, h, w, h])
        return Annotation(
            image_id=f"synthetic/{self.seed}/{i}",
            image_path=f"{self.seed}/{i}",
            width=w,
            height=h,
            boxes=boxes.round(),
            labels=torch.randint(1, num_classes + 1, (n,), generator=g),
            difficult=torch.rand(n, generator=g) < 0.1,
        )

    def _draw_by_id(self, path: str) -> torch.Tensor:
        i = int(path.rsplit("/", 1)[1])
        ann = self.annotations[i]
        g = torch.Generator().manual_seed(self.seed * 7_000_003 + i)
        img = torch.randint(0, 256, (3, ann.height, ann.width), generator=g, dtype=torch.uint8)
        for box, label in zip(ann.boxes.long().tolist(), ann.labels.tolist()):
            x1, y1, x2, y2 = box
            img[:, y1:y2, x1:x2] = self.colours[label].to(torch.uint8).view(3, 1, 1)
        return img


def build_detection_data(cfg: Any, geometry: str, seed: int = 0) -> DetectionData:
    """The train and eval splits of data.name, through the transforms of data.augmentation at the
    model's input geometry ("warp" or "shorter_side")."""
    if cfg.max_size is not None and cfg.max_size < cfg.image_size:
        raise ConfigError(
            f"data.max_size={cfg.max_size} is smaller than the shorter side data.image_size="
            f"{cfg.image_size}; Faster R-CNN's recipe is 600 and 1000"
        )
    train_tf = build_detection_transform(
        cfg.augmentation, geometry, cfg.image_size, cfg.max_size, train=True
    )
    eval_tf = build_detection_transform(
        cfg.augmentation, geometry, cfg.image_size, cfg.max_size, train=False
    )
    if cfg.name == "voc":
        # Without difficult boxes (train_difficult false) a few images have no box left; they
        # stay, as background-only images (py-faster-rcnn's filter_roidb drops them), so that an
        # epoch is exactly the split and the recipes' iteration counts map to fixed epochs.
        train_anns = voc_annotations(cfg.root, list(cfg.train_splits))
        eval_anns = voc_annotations(cfg.root, list(cfg.eval_splits))
        if cfg.train_limit is not None:
            train_anns = train_anns[: cfg.train_limit]
        if cfg.eval_limit is not None:
            eval_anns = eval_anns[: cfg.eval_limit]
        names = VOC_CLASSES
        train = DetectionDataset(train_anns, train_tf, keep_difficult=cfg.train_difficult)
        evaluation = DetectionDataset(eval_anns, eval_tf)
        description = (
            f"PASCAL VOC at {cfg.root}: {'+'.join(cfg.train_splits)} ({len(train)} images) / "
            f"{'+'.join(cfg.eval_splits)} ({len(evaluation)} images), "
            f"difficult boxes {'kept' if cfg.train_difficult else 'dropped'} for training"
        )
    elif cfg.name == "synthetic":
        if cfg.num_classes < 1:
            raise ConfigError(f"data.num_classes must be >= 1 (got {cfg.num_classes})")
        names = tuple(f"class{c}" for c in range(1, cfg.num_classes + 1))
        n_train = min(cfg.synthetic_train_size, cfg.train_limit or cfg.synthetic_train_size)
        n_eval = min(cfg.synthetic_eval_size, cfg.eval_limit or cfg.synthetic_eval_size)
        train = SyntheticDetection(n_train, cfg.image_size, cfg.num_classes, 1, train_tf)
        evaluation = SyntheticDetection(n_eval, cfg.image_size, cfg.num_classes, 2, eval_tf)
        description = (
            f"synthetic detection: {n_train} train / {n_eval} eval random images "
            f"(~{cfg.image_size} px) with 1-3 boxes of {cfg.num_classes} classes"
        )
    else:
        raise ConfigError(
            f"data.name={cfg.name!r} is not a detection data set; use data=voc or data=synthetic"
        )
    if len(train) == 0:
        raise DataError(f"the detection training split is empty ({description})")
    return DetectionData(train, evaluation, tuple(names), description)
