"""Object detection: the paper's Table 2 networks (Faster R-CNN and SSD on VGG-16), PASCAL VOC."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mpt_repro.experiments._detection_data import DetectionData
from mpt_repro.registry import TaskReport, metric, option_schema, task
from mpt_repro.schema import LOADER, ModelSchema, in_unit

task(
    "detection",
    "mpt_repro.tasks.detection:Detection",
    TaskReport(
        "Other detection experiments (every final metric)",
        "detection",
        paper_table="mpt_repro.experiments._detection_tables:table2",
        paper_reference=("table2", "Paper Table 2: detection mAP, PASCAL VOC 2007 test"),
    ),
)
# what its metrics are (mpt_repro/tasks/detection.py): mAP in percent, the paper's numbers; the
# detectors' training loss parts (logged on train rows) lower is better
metric("map", "%", higher_is_better=True)  # VOC2007 11-point interpolated AP at IoU 0.5
metric("map_area", "%", higher_is_better=True)  # VOC2010+ area under the curve
for part in (
    "loss_loc",
    "loss_conf",
    "loss_objectness",
    "loss_rpn_box_reg",
    "loss_cls",
    "loss_bbox",
):
    metric(part, higher_is_better=False)


@option_schema("model", "detector")
@dataclass
class Detector(ModelSchema):
    width: int = 64
    # a VGG-16 weights file (a torchvision state dict or a vgg16 run's checkpoint)
    backbone_weights: str | None = None


@option_schema("model", "faster_rcnn")
@dataclass
class FasterRCNN(Detector):
    dropout: float = 0.5

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        in_unit(m.dropout, "model.dropout")


@option_schema("data", "voc")
@dataclass
class VOC(DetectionData):
    """PASCAL VOC as the official tarballs unpack."""

    reads: ClassVar = ("root", *LOADER, "image_size", "augmentation")
    reads += ("train_splits", "eval_splits", "train_difficult")
    # ssd: the SSD recipe; flip: py-faster-rcnn's (data/detection_transforms.py)
    augmentations: ClassVar = ("none", "ssd", "flip")
    needs_root: ClassVar = True
