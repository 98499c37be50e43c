"""Detection transforms: an image (uint8 or float tensor [3, H, W], RGB) and its target (boxes in
continuous pixel coordinates, labels, difficult flags) transformed together.

The SSD training recipe of Liu et al. 2016 as weiliu89/caffe (branch ssd, examples/ssd/
ssd_pascal.py) runs it, in its order:
1. photometric distortion (DataTransformer::DistortImage, random_order_prob 0): brightness
   +-32 (p 0.5); then, in one of two orders chosen with p 0.5, contrast x[0.5, 1.5] (p 0.5),
   saturation x[0.5, 1.5] (p 0.5) and hue +-18 OpenCV units (of 180, i.e. +-0.1 of the hue
   circle, p 0.5); pixel values clamped to [0, 255] after each step, as on Caffe's 8-bit images;
2. expansion (p 0.5): the image placed at a random offset on a canvas up to 4x its size filled
   with the mean pixel (zoom out: small objects);
3. one of 7 IoU-constrained crops chosen uniformly among those found: the whole image, or a crop
   of scale [0.3, 1] and aspect ratio [0.5, 2] (in normalised coordinates) whose IoU with at
   least one box is >= 0.1, 0.3, 0.5, 0.7 or 0.9, or any crop (50 tries each); boxes whose
   centre falls outside the crop are dropped, the others clipped to it;
4. warp to image_size x image_size (bilinear, aspect ratio not kept) and a horizontal flip
   (p 0.5).
The random draws use torch's generator, which the DataLoader seeds per worker from the epoch
sampler, so an epoch's augmentation is the same in every run with the same seed.

Faster R-CNN (py-faster-rcnn): the shorter side scaled to image_size (600), the longer side
capped at max_size (1000), and a horizontal flip. py-faster-rcnn appends a flipped copy of every
training image (each epoch sees both); here each image is flipped with p 0.5 instead.

Both end with ImageNet mean/std normalisation of [0, 1] RGB: the statistics of the backbone files
this suite loads (torchvision's VGG-16, and our own vgg16 run); the Caffe originals subtracted a
BGR mean pixel (104, 117, 123) from [0, 255] values instead, for their Caffe VGG-16.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MEAN_PIXEL = tuple(255.0 * m for m in IMAGENET_MEAN)  # the expansion canvas: 0 after normalising

Target = dict[str, torch.Tensor]

# ssd_pascal.py's batch_sampler: (min IoU, max IoU) with at least one box; None: no constraint
SSD_CROP_CONSTRAINTS: tuple[tuple[float | None, float | None], ...] = (
    (0.1, None),
    (0.3, None),
    (0.5, None),
    (0.7, None),
    (0.9, None),
    (None, 1.0),
)
CROP_SCALE = (0.3, 1.0)
CROP_ASPECT = (0.5, 2.0)
CROP_TRIES = 50


def _uniform(lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand(()))


def _coin(p: float) -> bool:
    return float(torch.rand(())) < p


# -- photometric ---------------------------------------------------------------------------------
def rgb_to_hsv(img: torch.Tensor) -> torch.Tensor:
    """[3, H, W] RGB in [0, 1] -> HSV, hue as a fraction of the circle in [0, 1)."""
    r, g, b = img.unbind(0)
    maxc, minc = img.max(0).values, img.min(0).values
    delta = maxc - minc
    s = torch.where(maxc > 0, delta / maxc.clamp_min(1e-12), torch.zeros_like(maxc))
    d = delta.clamp_min(1e-12)
    h = torch.where(
        maxc == r, (g - b) / d, torch.where(maxc == g, 2.0 + (b - r) / d, 4.0 + (r - g) / d)
    )
    h = torch.where(delta > 0, (h / 6.0) % 1.0, torch.zeros_like(h))
    return torch.stack([h, s, maxc])


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    h, s, v = hsv.unbind(0)
    h6 = (h % 1.0) * 6.0
    i = torch.floor(h6)
    f = h6 - i
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    i = i.long() % 6
    choices = torch.stack(
        [
            torch.stack([v, q, p, p, t, v]),
            torch.stack([t, v, v, q, p, p]),
            torch.stack([p, p, t, v, v, q]),
        ]
    )  # [3 channels, 6 sectors, H, W]
    return choices.gather(1, i[None, None].expand(3, 1, *i.shape)).squeeze(1)


def photometric_distort(img: torch.Tensor) -> torch.Tensor:
    """Caffe SSD's RandomDistort on a float image in [0, 255] (see the module docstring)."""
    img = img.float()
    if _coin(0.5):
        img = (img + _uniform(-32.0, 32.0)).clamp(0, 255)

    def contrast(x: torch.Tensor) -> torch.Tensor:
        return (x * _uniform(0.5, 1.5)).clamp(0, 255) if _coin(0.5) else x

    def saturation_hue(x: torch.Tensor) -> torch.Tensor:
        do_sat, sat = _coin(0.5), _uniform(0.5, 1.5)
        do_hue, hue = _coin(0.5), _uniform(-0.1, 0.1)
        if not (do_sat or do_hue):
            return x
        hsv = rgb_to_hsv(x / 255.0)
        if do_sat:
            hsv[1] = (hsv[1] * sat).clamp(0, 1)
        if do_hue:
            hsv[0] = (hsv[0] + hue) % 1.0
        return (hsv_to_rgb(hsv) * 255.0).clamp(0, 255)

    if _coin(0.5):
        return saturation_hue(contrast(img))
    return contrast(saturation_hue(img))


# -- geometric -----------------------------------------------------------------------------------
def expand(
    img: torch.Tensor, target: Target, max_ratio: float = 4.0, fill: Sequence[float] = MEAN_PIXEL
) -> tuple[torch.Tensor, Target]:
    """Place the image at a random offset on a canvas ratio x its size (ratio in [1, max_ratio])
    filled with `fill` (Caffe's ExpandImage)."""
    ratio = _uniform(1.0, max_ratio)
    _, h, w = img.shape
    eh, ew = int(h * ratio), int(w * ratio)
    top, left = math.floor(_uniform(0, eh - h)), math.floor(_uniform(0, ew - w))
    canvas = torch.tensor(fill, dtype=img.dtype).view(3, 1, 1).expand(3, eh, ew).clone()
    canvas[:, top : top + h, left : left + w] = img
    target = dict(target)
    target["boxes"] = target["boxes"] + torch.tensor([left, top, left, top], dtype=torch.float32)
    return canvas, target


def _sample_crop(w: int, h: int, boxes: torch.Tensor, lo: float | None, hi: float | None):
    """One crop (x1, y1, x2, y2 pixels) meeting the IoU constraint, or None after CROP_TRIES."""
    for _ in range(CROP_TRIES):
        scale = _uniform(*CROP_SCALE)
        ar = _uniform(max(CROP_ASPECT[0], scale**2), min(CROP_ASPECT[1], 1.0 / scale**2))
        cw, ch = scale * math.sqrt(ar), scale / math.sqrt(ar)  # normalised
        x0, y0 = _uniform(0, 1 - cw), _uniform(0, 1 - ch)
        crop = torch.tensor([[x0 * w, y0 * h, (x0 + cw) * w, (y0 + ch) * h]])
        if len(boxes) == 0:
            return crop[0]  # nothing to constrain (Caffe: no box satisfies; image kept whole)
        from torchvision.ops import box_iou  # torchvision.ops loads torch._dynamo: 2 s a run

        iou = box_iou(crop, boxes)[0]
        ok = torch.ones_like(iou, dtype=torch.bool)
        if lo is not None:
            ok &= iou >= lo
        if hi is not None:
            ok &= iou <= hi
        if bool(ok.any()):
            return crop[0]
    return None


def iou_crop(img: torch.Tensor, target: Target) -> tuple[torch.Tensor, Target]:
    """SSD's batch sampler: the whole image or one of the constrained crops, chosen uniformly
    among those found; boxes kept when their centre lies in the crop, then clipped."""
    _, h, w = img.shape
    boxes = target["boxes"]
    if len(boxes) == 0:
        return img, target
    found = [
        c for lo, hi in SSD_CROP_CONSTRAINTS if (c := _sample_crop(w, h, boxes, lo, hi)) is not None
    ]
    pick = int(torch.randint(len(found) + 1, ()))  # 0: the whole image (always a candidate)
    if pick == 0:
        return img, target
    x1, y1, x2, y2 = found[pick - 1].tolist()
    x1, y1 = int(x1), int(y1)  # Caffe's CropImage: integer offset and size
    cw, ch = max(1, int(x2 - x1)), max(1, int(y2 - y1))
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    keep = (
        (centres[:, 0] > x1)
        & (centres[:, 0] < x1 + cw)
        & (centres[:, 1] > y1)
        & (centres[:, 1] < y1 + ch)
    )
    out = {k: v[keep] for k, v in target.items()}
    shifted = out["boxes"] - torch.tensor([x1, y1, x1, y1], dtype=torch.float32)
    limit = torch.tensor([cw, ch, cw, ch], dtype=torch.float32)
    out["boxes"] = torch.minimum(shifted.clamp_min(0), limit)
    return img[:, y1 : y1 + ch, x1 : x1 + cw], out


def resize(img: torch.Tensor, target: Target, size: tuple[int, int]) -> tuple[torch.Tensor, Target]:
    """Bilinear resize to size=(h, w) (no anti-aliasing, as OpenCV's INTER_LINEAR in the
    originals); boxes scaled with the image; target["scale"] = (sx, sy) accumulated."""
    _, h, w = img.shape
    nh, nw = size
    if (nh, nw) != (h, w):
        img = F.interpolate(img[None].float(), size=(nh, nw), mode="bilinear", align_corners=False)[
            0
        ]
    sx, sy = nw / w, nh / h
    target = dict(target)
    target["boxes"] = target["boxes"] * torch.tensor([sx, sy, sx, sy], dtype=torch.float32)
    prev = target.get("scale", torch.ones(2))
    target["scale"] = prev * torch.tensor([sx, sy])
    return img, target


def hflip(img: torch.Tensor, target: Target) -> tuple[torch.Tensor, Target]:
    w = img.shape[-1]
    target = dict(target)
    b = target["boxes"]
    target["boxes"] = torch.stack([w - b[:, 2], b[:, 1], w - b[:, 0], b[:, 3]], dim=1)
    return img.flip(-1), target


def normalize(img: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (img.float() / 255.0 - mean) / std


def shorter_side_size(h: int, w: int, shorter: int, max_size: int | None) -> tuple[int, int]:
    """py-faster-rcnn's prep_im_for_blob: scale the shorter side to `shorter` unless the longer
    side would exceed `max_size`, then scale the longer side to max_size."""
    scale = shorter / min(h, w)
    if max_size is not None and round(scale * max(h, w)) > max_size:
        scale = max_size / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale))


# -- recipes -------------------------------------------------------------------------------------
Transform = Callable[[torch.Tensor, Target], tuple[torch.Tensor, Target]]


def build_detection_transform(
    recipe: str, geometry: str, image_size: int, max_size: int | None, train: bool
) -> Transform:
    """The transform of one split. recipe (data.augmentation): "ssd" (the SSD recipe above),
    "flip" (py-faster-rcnn: flip only) or "none". geometry (from the model): "warp" (a square
    image_size input, SSD) or "shorter_side" (shorter side image_size, longer <= max_size)."""
    if geometry not in ("warp", "shorter_side"):
        raise ValueError(f"unknown detection input geometry {geometry!r}")
    augment = recipe if train else "none"

    def size_of(img: torch.Tensor) -> tuple[int, int]:
        if geometry == "warp":
            return image_size, image_size
        return shorter_side_size(img.shape[-2], img.shape[-1], image_size, max_size)

    def apply(img: torch.Tensor, target: Target) -> tuple[torch.Tensor, Target]:
        img = img.float()
        if augment == "ssd":
            img = photometric_distort(img)
            if _coin(0.5):
                img, target = expand(img, target)
            img, target = iou_crop(img, target)
        # the scale maps original pixels to input pixels; expansion/crops are train-only and
        # their boxes are already in the crop's pixels, so the scale starts here
        target = {k: v for k, v in target.items() if k != "scale"}
        img, target = resize(img, target, size_of(img))
        if augment in ("ssd", "flip") and _coin(0.5):
            img, target = hflip(img, target)
        return normalize(img), target

    return apply


def detection_collate(batch: list[tuple[torch.Tensor, Target]]):
    """(images [B, 3, H, W] zero-padded at the bottom/right to the largest in the batch,
    sizes [B, 2] of the unpadded images (h, w), targets: list of dicts)."""
    images, targets = zip(*batch)
    hmax = max(i.shape[-2] for i in images)
    wmax = max(i.shape[-1] for i in images)
    out = images[0].new_zeros((len(images), 3, hmax, wmax))
    for k, img in enumerate(images):
        out[k, :, : img.shape[-2], : img.shape[-1]] = img
    sizes = torch.tensor([[i.shape[-2], i.shape[-1]] for i in images], dtype=torch.int64)
    return out, sizes, list(targets)
