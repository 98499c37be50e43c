"""PASCAL VOC detection data from the standard VOCdevkit layout.

Layout (data.root, the folder that holds VOC2007/ and VOC2012/, as the tarballs unpack):
    VOCdevkit/VOC2007/ImageSets/Main/{trainval,test}.txt   one image id per line
    VOCdevkit/VOC2007/Annotations/<id>.xml                 one <object> per box
    VOCdevkit/VOC2007/JPEGImages/<id>.jpg
    VOCdevkit/VOC2012/...                                  the same (trainval only is public)
Splits are written "<year>/<set>" (data.train_splits, data.eval_splits): the paper's SSD
trains on 2007/trainval + 2012/trainval (16,551 images) and tests on 2007/test (4,952).

Boxes: the XML gives 1-based inclusive pixel indices; they become continuous coordinates
(xmin - 1, ymin - 1, xmax, ymax), so that box widths are x2 - x1 and the plain IoU equals the
devkit's "+1" IoU (mpt_repro/metrics/voc_eval.py). Labels are 1..20 in VOC_CLASSES order; 0 is
the detectors' background class.

`difficult` objects stay in every annotation with a flag: the evaluation ignores detections of
them and does not count them as positives (the official devkit); training keeps them or drops
them per data.train_difficult (SSD's original trains on them, py-faster-rcnn does not).

All annotations are parsed when the data set is built, so a missing or corrupt XML, or a box
outside its image or without area (check_box), stops the run before training with DataError
naming the file and the object. A corrupt image stops it when it is read (in a loader worker,
re-raised by the DataLoader) with DataError naming the file: as for ImageNet, silently skipping
files would change the training set without anyone noticing.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from mpt_repro.errors import DataError
from mpt_repro.safeio import open_regular

VOC_CLASSES = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)
CLASS_INDEX = {name: i + 1 for i, name in enumerate(VOC_CLASSES)}  # 0 = background

LAYOUT = (
    "point data.root at the VOCdevkit folder holding VOC2007/ (and VOC2012/), each with "
    "ImageSets/Main/<set>.txt, Annotations/<id>.xml and JPEGImages/<id>.jpg, as the official "
    "VOCtrainval/VOCtest tarballs unpack (docs/experiments_detection.md); e.g. mpt-run "
    "experiment=ssd data.root=/data/VOCdevkit. Without VOC, data=synthetic runs the same model "
    "on random images with random boxes"
)


@dataclass
class Annotation:
    """One image's ground truth (continuous pixel boxes, labels 1..20, difficult flags)."""

    image_id: str  # "<year>/<id>", e.g. "2007/000005"
    image_path: str
    width: int
    height: int
    boxes: torch.Tensor  # [n, 4] float
    labels: torch.Tensor  # [n] int64
    difficult: torch.Tensor  # [n] bool

    def target(self, keep_difficult: bool = True) -> dict[str, torch.Tensor]:
        keep = torch.ones_like(self.difficult) if keep_difficult else ~self.difficult
        return {
            "boxes": self.boxes[keep].clone(),
            "labels": self.labels[keep].clone(),
            "difficult": self.difficult[keep].clone(),
        }


def _text(node: ET.Element, tag: str, path: str) -> str:
    child = node.find(tag)
    if child is None or child.text is None:
        raise DataError(
            f"{path}: <{node.tag}> has no <{tag}>; the file is not a VOC annotation or is "
            "truncated. Restore it from the VOC tarball"
        )
    return child.text.strip()


def check_box(
    xml_path: str, k: int, name: str, box: tuple[float, ...], width: int, height: int
) -> None:
    """Refuse a box that is not inside its image with a positive area (DataError naming the file
    and the object). VOC boxes are 1-based pixel indices: the devkit's top-left pixel is (1, 1),
    a box over the whole image is (1, 1, width, height). Required: 1 <= xmin < xmax <= width
    and 1 <= ymin < ymax <= height (xmin = xmax is a line of pixels, no object), the rule
    GluonCV's VOC reader raised on (gluoncv/data/pascal_voc/detection.py, _validate_label) while
    reading VOC2007+2012. A box that breaks it is an annotation error; clipping it (as torchvision's
    and PaddleDetection's readers do) would train on a box nobody drew."""
    x1, y1, x2, y2 = box
    problems = []
    if not all(math.isfinite(v) for v in box):
        problems.append("a coordinate that is not a number")
    else:
        if x1 < 1 or y1 < 1:
            problems.append("xmin or ymin below 1, left of or above the image")
        if x2 > width or y2 > height:
            problems.append(f"xmax > {width} or ymax > {height}, past the image's edge")
        if x2 <= x1 or y2 <= y1:
            problems.append("no area (xmax <= xmin or ymax <= ymin)")
    if problems:
        corners = ", ".join(f"{v:g}" for v in box)
        raise DataError(
            f"{xml_path}: object {k} ({name}) has the box (xmin, ymin, xmax, ymax) = ({corners}) "
            f"in a {width}x{height} image: {'; '.join(problems)}. VOC boxes need "
            "1 <= xmin < xmax <= width and 1 <= ymin < ymax <= height (1-based pixels); fix or "
            "remove this object in the XML (docs/experiments_detection.md, Data)"
        )


def parse_annotation(xml_path: str, image_id: str, image_path: str) -> Annotation:
    """Read one Annotations/<id>.xml; DataError naming the file if it is missing or malformed."""
    try:
        root = ET.parse(xml_path).getroot()
    except FileNotFoundError:
        raise DataError(
            f"annotation {xml_path} is missing (listed in the split file); {LAYOUT}"
        ) from None
    except (ET.ParseError, OSError) as e:
        raise DataError(
            f"cannot parse annotation {xml_path}: {e}. Restore this file from the VOC tarball"
        ) from None
    size = root.find("size")
    if size is None:
        raise DataError(f"{xml_path}: no <size>; restore this file from the VOC tarball")
    try:
        width, height = int(_text(size, "width", xml_path)), int(_text(size, "height", xml_path))
        if width < 1 or height < 1:
            raise DataError(
                f"{xml_path}: <size> says {width}x{height} pixels; restore this file from the VOC "
                "tarball"
            )
        boxes, labels, difficult = [], [], []
        for obj in root.iter("object"):
            name = _text(obj, "name", xml_path).lower()
            if name not in CLASS_INDEX:
                raise DataError(
                    f"{xml_path}: unknown class {name!r}; VOC detection has the 20 classes "
                    f"{', '.join(VOC_CLASSES)}"
                )
            bb = obj.find("bndbox")
            if bb is None:
                raise DataError(f"{xml_path}: an <object> without <bndbox>")
            x1, y1, x2, y2 = (
                float(_text(bb, k, xml_path)) for k in ("xmin", "ymin", "xmax", "ymax")
            )
            check_box(xml_path, len(boxes) + 1, name, (x1, y1, x2, y2), width, height)
            diff = obj.find("difficult")
            boxes.append((x1 - 1.0, y1 - 1.0, x2, y2))  # 1-based inclusive -> continuous
            labels.append(CLASS_INDEX[name])
            difficult.append(diff is not None and (diff.text or "0").strip() == "1")
    except ValueError as e:  # int()/float() of a non-number
        raise DataError(f"{xml_path}: {e}; restore this file from the VOC tarball") from None
    return Annotation(
        image_id=image_id,
        image_path=image_path,
        width=width,
        height=height,
        boxes=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        labels=torch.tensor(labels, dtype=torch.int64),
        difficult=torch.tensor(difficult, dtype=torch.bool),
    )


def read_split(root: str, split: str) -> list[Annotation]:
    """All annotations of one split "<year>/<set>" (e.g. "2007/test"), in split-file order."""
    year, _, image_set = split.partition("/")
    if not (year and image_set):
        raise DataError(f"VOC split {split!r} is not '<year>/<set>', e.g. '2007/trainval'")
    base = os.path.join(root, f"VOC{year}")
    if not os.path.isdir(base):
        raise DataError(f"{root} has no VOC{year}/ folder (needed by split {split!r}); {LAYOUT}")
    list_file = os.path.join(base, "ImageSets", "Main", f"{image_set}.txt")
    try:
        with open_regular(list_file, "r") as f:
            ids = [line.split()[0] for line in f if line.strip()]
    except FileNotFoundError:
        raise DataError(f"split file {list_file} is missing; {LAYOUT}") from None
    if not ids:
        raise DataError(f"split file {list_file} lists no images; {LAYOUT}")
    return [
        parse_annotation(
            os.path.join(base, "Annotations", f"{i}.xml"),
            f"{year}/{i}",
            os.path.join(base, "JPEGImages", f"{i}.jpg"),
        )
        for i in ids
    ]


def load_image(path: str) -> torch.Tensor:
    """The image as a uint8 RGB tensor [3, H, W]; DataError naming the file if unreadable."""
    from PIL import Image
    from torchvision.transforms.functional import pil_to_tensor

    try:
        with open_regular(path, "rb") as f:
            img = Image.open(f)
            img = img.convert("RGB")  # convert() forces the full decode inside the try
    except FileNotFoundError:
        raise DataError(f"image {path} is missing (listed in the split file); {LAYOUT}") from None
    except (OSError, SyntaxError, ValueError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise DataError(
            f"cannot read image {path}: {e}. Replace it from the VOC tarball and run again"
        ) from None
    return pil_to_tensor(img)


class DetectionDataset(Dataset):
    """Images with their ground truth, through a detection transform.

    Item: (image [3, h, w] float, target) with target = boxes, labels, difficult (after the
    transform, in the transformed image's pixels), plus ``index`` (into ``annotations``: the
    evaluation reads the original ground truth from there) and ``scale`` (sx, sy: transformed
    pixels per original pixel, to map detections back).
    """

    def __init__(
        self,
        annotations: Sequence[Annotation],
        transform: Callable | None,
        keep_difficult: bool = True,
        loader: Callable[[str], torch.Tensor] = load_image,
    ):
        self.annotations = list(annotations)
        self.transform = transform
        self.keep_difficult = keep_difficult
        self.loader = loader

    def __len__(self) -> int:
        return len(self.annotations)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ann = self.annotations[i]
        image = self.loader(ann.image_path)
        if image.shape[-2:] != (ann.height, ann.width):
            # the boxes are in the XML's pixel grid: a mismatched image would shift them silently
            raise DataError(
                f"image {ann.image_path} is {image.shape[-1]}x{image.shape[-2]} but its "
                f"annotation says {ann.width}x{ann.height}; replace the image or the XML from "
                "the VOC tarball"
            )
        target = ann.target(self.keep_difficult)
        if self.transform is not None:
            image, target = self.transform(image, target)
        target["index"] = torch.tensor(i)
        return image, target

    def ground_truth(self, i: int) -> dict[str, torch.Tensor]:
        """Image i's original ground truth (all objects, difficult included) for evaluation."""
        return self.annotations[i].target(keep_difficult=True)


def voc_annotations(root: str | None, splits: Sequence[str]) -> list[Annotation]:
    if not root:
        raise DataError(f"data.root is not set; {LAYOUT}")
    root = os.path.expanduser(str(root))
    if not os.path.isdir(root):
        raise DataError(f"data.root={root} does not exist; {LAYOUT}")
    if not splits:
        raise DataError("no VOC splits given (data.train_splits / data.eval_splits are empty)")
    return [ann for split in splits for ann in read_split(root, split)]
