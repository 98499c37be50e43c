"""The fields of a data set of images with boxes: the detection plugin's data shape, which the
made-up images (data=synthetic, mpt_repro/experiments/classification.py) carry too, so that a
detection experiment keeps its settings when it runs on them. A private module (no option of its
own): the plugin modules import it, the registry does not."""

from __future__ import annotations

from dataclasses import dataclass, field

from mpt_repro.schema import ImageData, read_if_listed, read_when


@dataclass
class DetectionData(ImageData):
    """The fields of a data set of images with boxes (an experiment's splits stay in the
    composed config when it runs on made-up data: its random boxes ignore them)."""

    # splits "<year>/<set>", e.g. [2007/trainval, 2012/trainval] and [2007/test]
    train_splits: list[str] = field(default_factory=list, metadata=read_if_listed())
    eval_splits: list[str] = field(default_factory=list, metadata=read_if_listed())
    # `difficult` boxes as training targets (evaluation always ignores them)
    train_difficult: bool = field(default=True, metadata=read_if_listed())
    # the longer side's cap (Faster R-CNN's 1000); the detection task reads it, for VOC and for
    # made-up images alike, so a classification run on made-up images refuses it
    max_size: int | None = field(default=None, metadata=read_when("task", "detection"))
