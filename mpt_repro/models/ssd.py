"""SSD300 with a VGG-16 backbone (Liu et al. 2016), as weiliu89/caffe's ssd_pascal.py builds it
for PASCAL VOC: the network of the paper's Table 2 "Multibox SSD" row.

Network: VGG-16 conv1_1..conv5_3 with pool3 in ceil mode (38x38 conv4_3 at 300 px), pool5 as
3x3 stride 1, fc6 as a 3x3 convolution with dilation 6 and fc7 as a 1x1 convolution (1024
channels each); conv4_3 L2-normalised per position with a learned per-channel scale initialised
to 20; extra layers conv8_2 (stride 2), conv9_2 (stride 2), conv10_2, conv11_2 (3x3 valid). Six
source maps 38, 19, 10, 5, 3, 1 with 4, 6, 6, 6, 4, 4 default boxes per position = 8,732
boxes. Default-box scales for VOC (ssd_pascal.py: min_ratio 20, max_ratio 90; conv4_3 at 0.1):
0.1, 0.2, 0.37, 0.54, 0.71, 0.88 plus the extra sqrt(s_k s_k+1) box (s_7 = 1.05), steps 8, 16,
32, 64, 100, 300, not clipped. 3x3 convolutional heads per source map.

Initialisation of the layers ssd_pascal.py adds to VGG-16 (fc6 and fc7 when no weights file
supplies them, the extra layers, the heads): Caffe's "xavier" filler, U(+-sqrt(3 / fan_in)),
biases 0, as weiliu89/caffe's python/caffe/model_libs.py gives every convolution it builds
(ConvBNLayer without batch norm, VGGNetBody; branch ssd @4817bf8b4200 L84-90, L310-313), not
PyTorch's xavier_uniform_ (fan_in + fan_out) that torchvision's SSDHead uses.

Training loss (MultiBoxLoss): matching first gives each ground-truth box its best default box,
then every default box with IoU >= 0.5 to a box is matched to it (torchvision's SSDMatcher);
offsets encoded with variances 0.1/0.2 (BoxCoder weights 10, 10, 5, 5); smooth L1 on matched
boxes + softmax cross-entropy on matched boxes and on the hardest negatives (3 per positive,
per image, ranked by their background loss); both summed and divided by the number of matches.
Test: softmax, per class score > 0.01, top 400, NMS at IoU 0.45, at most 200 per image.

Mixed precision: the heads' outputs are cast to FP32 before decoding and the loss, and the
loss runs with autocast off, so the matching, box decoding and loss reductions are FP32 in every
preset; the L2 normalisation computes its norm in FP32.

From torchvision (torchvision.models.detection): DefaultBoxGenerator, SSDHead, SSDMatcher,
BoxCoder (its arithmetic, as models/box_coder.py's DeviceBoxCoder), box_iou, batched_nms.
Differences from torchvision's ssd300_vgg16, which follows the later COCO configuration: VOC
scales (torchvision: 0.07, 0.15, 0.33, ...), unclipped default boxes, fc6/fc7 initialised from
the subsampled ImageNet fc layers when a weights file has them (torchvision: random), every
layer trained (torchvision freezes conv1), the image normalised in the data pipeline, and
model.width to scale every channel count for smoke runs (64 = the paper).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.detection._utils import SSDMatcher
from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.ssd import SSDHead
from torchvision.ops import batched_nms, box_iou, clip_boxes_to_image

from mpt_repro.errors import ConfigError
from mpt_repro.models import register_model
from mpt_repro.models.box_coder import DeviceBoxCoder
from mpt_repro.models.caffe import xavier_
from mpt_repro.models.detection_backbone import (
    CONV4_3_RELU,
    NO_WEIGHTS_WARNING,
    POOL3,
    fc_weights,
    load_trunk,
    read_vgg16_state,
    reduce_fc,
    scaled,
    vgg16_trunk,
)

log = logging.getLogger("mpt_repro")

ASPECT_RATIOS = [[2], [2, 3], [2, 3], [2, 3], [2], [2]]
VOC_SCALES = [0.1, 0.2, 0.37, 0.54, 0.71, 0.88, 1.05]
STEPS_300 = [8, 16, 32, 64, 100, 300]
MATCH_IOU = 0.5
NEG_POS_RATIO = 3
L2NORM_SCALE = 20.0
# DetectionOutput of ssd_pascal.py
SCORE_THRESH, NMS_IOU, TOP_K, KEEP_TOP_K = 0.01, 0.45, 400, 200
MIN_IMAGE_SIZE = 268  # below it conv11_2 (3x3, no padding) has nothing left


def no_autocast(device: torch.device):
    """A region in which autocast is off: the tensors keep the dtype they come with."""
    return torch.autocast(device_type=device.type, enabled=False)


class L2Norm(nn.Module):
    """Caffe's Normalize layer (across_spatial false, channel_shared false): x / sqrt(sum_c x^2
    + eps) times a learned per-channel scale. The norm is taken in FP32: FP16 squares of conv4_3
    activations overflow above 256 and underflow below 2^-12."""

    def __init__(self, channels: int, scale: float = L2NORM_SCALE, eps: float = 1e-10):
        super().__init__()
        self.weight = nn.Parameter(torch.full((channels,), scale))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        norm = (xf.pow(2).sum(1, keepdim=True) + self.eps).sqrt()
        return (xf / norm * self.weight.float().view(1, -1, 1, 1)).to(x.dtype)


def _extra(c_in: int, c_mid: int, c_out: int, stride: int, padding: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_mid, kernel_size=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_mid, c_out, kernel_size=3, stride=stride, padding=padding),
        nn.ReLU(inplace=True),
    )


class SSD300(nn.Module):
    input_geometry = "warp"  # a square image_size x image_size input (the data pipeline warps)

    def __init__(self, num_classes: int, width: int = 64, image_size: int = 300):
        super().__init__()
        if image_size < MIN_IMAGE_SIZE:
            raise ConfigError(
                f"SSD300 needs data.image_size >= {MIN_IMAGE_SIZE} (got {image_size}): its last "
                "source maps are 3x3 and 1x1 at 300 px. Shrink model.width for a cheaper run"
            )
        self.num_classes = num_classes
        c = lambda n: scaled(n, width)  # noqa: E731
        self.vgg = vgg16_trunk(width)[:30]  # conv1_1 .. relu5_3 (pool5 replaced below)
        self.vgg[POOL3].ceil_mode = True  # 75 -> 38, as Caffe's pooling rounds up
        self.l2norm = L2Norm(c(512))
        self.pool5 = nn.MaxPool2d(kernel_size=3, stride=1, padding=1)
        self.fc6 = nn.Conv2d(c(512), c(1024), kernel_size=3, padding=6, dilation=6)
        self.fc7 = nn.Conv2d(c(1024), c(1024), kernel_size=1)
        self.extras = nn.ModuleList(
            [
                _extra(c(1024), c(256), c(512), stride=2, padding=1),  # conv8_2: 10x10
                _extra(c(512), c(128), c(256), stride=2, padding=1),  # conv9_2: 5x5
                _extra(c(256), c(128), c(256), stride=1, padding=0),  # conv10_2: 3x3
                _extra(c(256), c(128), c(256), stride=1, padding=0),  # conv11_2: 1x1
            ]
        )
        sources = [c(512), c(1024), c(512), c(256), c(256), c(256)]
        self.box_generator = DefaultBoxGenerator(
            ASPECT_RATIOS,
            scales=VOC_SCALES,
            steps=STEPS_300 if image_size == 300 else None,
            clip=False,
        )
        self.head = SSDHead(sources, self.box_generator.num_anchors_per_location(), num_classes)
        for m in [self.fc6, self.fc7, *self.extras.modules(), *self.head.modules()]:
            if isinstance(m, nn.Conv2d):  # Caffe's "xavier" filler, zero bias (model_libs.py)
                xavier_(m.weight)
                nn.init.zeros_(m.bias)
        self.box_coder = DeviceBoxCoder(weights=(10.0, 10.0, 5.0, 5.0))
        self.matcher = SSDMatcher(MATCH_IOU)
        self._default_boxes: dict[tuple, torch.Tensor] = {}

    # -- weights --------------------------------------------------------------------------------
    def load_backbone(self, path: str | None) -> str:
        """VGG-16 conv layers (and subsampled fc6/fc7) from a file; returns what was loaded."""
        if not path:
            log.warning(NO_WEIGHTS_WARNING)
            return "none (random initialisation)"
        sd = read_vgg16_state(path)
        load_trunk(self.vgg, sd, upto=30)
        fc = fc_weights(sd)
        if fc is None:
            log.warning("%s has no classifier.0/3 (fc6/fc7): SSD's fc6/fc7 start random", path)
            return f"{path} (conv1_1..conv5_3)"
        w6, b6, w7, b7 = reduce_fc(*fc)
        if w6.shape != self.fc6.weight.shape or w7.shape != self.fc7.weight.shape:
            raise ConfigError(
                f"{path}: subsampled fc6 {tuple(w6.shape)} does not fit the model's "
                f"{tuple(self.fc6.weight.shape)}; use model.width=64 with the full VGG-16"
            )
        with torch.no_grad():
            self.fc6.weight.copy_(w6)
            self.fc6.bias.copy_(b6)
            self.fc7.weight.copy_(w7)
            self.fc7.bias.copy_(b7)
        return f"{path} (conv1_1..conv5_3, fc6/fc7 subsampled)"

    # -- forward --------------------------------------------------------------------------------
    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = []
        for i, layer in enumerate(self.vgg):
            x = layer(x)
            if i == CONV4_3_RELU:
                maps.append(self.l2norm(x))
        x = F.relu(self.fc7(F.relu(self.fc6(self.pool5(x)))))
        maps.append(x)
        for block in self.extras:
            x = block(x)
            maps.append(x)
        return maps

    def default_boxes(self, maps: list[torch.Tensor], h: int, w: int) -> torch.Tensor:
        """The 8,732 default boxes (x1, y1, x2, y2 input pixels), FP32, computed once per size."""
        key = (h, w, maps[0].device, tuple(m.shape[-2:] for m in maps))
        if key not in self._default_boxes:
            # only the shapes matter to the generator; FP32 stand-ins keep the boxes in FP32
            stand_in = [torch.empty(1, 1, *m.shape[-2:]) for m in maps]
            boxes = self.box_generator(ImageList(torch.empty(1, 3, h, w), [(h, w)]), stand_in)
            self._default_boxes[key] = boxes[0].to(maps[0].device)
        return self._default_boxes[key]

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: torch.Tensor | None = None,
        targets: list[dict[str, torch.Tensor]] | None = None,
    ) -> Any:
        """Training: {"loss_loc", "loss_conf"} (FP32 scalars). Eval: per image a dict of boxes
        (input pixels), scores and labels."""
        maps = self.features(images)
        out = self.head(maps)
        # FP32 from here on: box decoding and the loss are not done in FP16
        cls_logits, bbox_reg = out["cls_logits"].float(), out["bbox_regression"].float()
        anchors = self.default_boxes(maps, images.shape[-2], images.shape[-1])
        with no_autocast(images.device):
            if self.training:
                if targets is None:
                    raise ValueError("SSD300 in training mode needs targets")
                return self.loss(cls_logits, bbox_reg, anchors, targets)
            return self.detect(cls_logits, bbox_reg, anchors, images.shape[-2:])

    def loss(
        self,
        cls_logits: torch.Tensor,
        bbox_reg: torch.Tensor,
        anchors: torch.Tensor,
        targets: list[dict[str, torch.Tensor]],
    ) -> dict[str, torch.Tensor]:
        labels, reg_targets = [], []
        for t in targets:
            gt = t["boxes"].to(anchors.device, anchors.dtype)
            if len(gt):
                matched = self.matcher(box_iou(gt, anchors))
            else:
                matched = torch.full((len(anchors),), -1, dtype=torch.long, device=anchors.device)
            fg = matched >= 0
            lab = torch.zeros(len(anchors), dtype=torch.long, device=anchors.device)
            lab[fg] = t["labels"].to(anchors.device)[matched[fg]]
            labels.append(lab)
            if len(gt):
                reg_targets.append(self.box_coder.encode_single(gt[matched.clamp(min=0)], anchors))
            else:  # no box in this image (e.g. cropped away): nothing to regress
                reg_targets.append(torch.zeros_like(anchors))
        labels_t = torch.stack(labels)  # [B, P]
        reg_t = torch.stack(reg_targets)
        fg = labels_t > 0
        num_pos = fg.sum(1)  # [B]
        loc = F.smooth_l1_loss(bbox_reg[fg], reg_t[fg], beta=1.0, reduction="sum")
        ce = F.cross_entropy(
            cls_logits.reshape(-1, self.num_classes), labels_t.reshape(-1), reduction="none"
        ).view_as(labels_t)
        # hard negative mining, per image: the 3 x num_pos negatives with the largest loss
        neg_loss = ce.detach().masked_fill(fg, float("-inf"))
        rank = neg_loss.argsort(1, descending=True).argsort(1)
        hard = rank < (NEG_POS_RATIO * num_pos).unsqueeze(1)
        matches = num_pos.sum().clamp(min=1)  # Caffe's normalization VALID
        conf = ce[fg | hard].sum()
        return {"loss_loc": loc / matches, "loss_conf": conf / matches}

    @torch.no_grad()
    def detect(
        self,
        cls_logits: torch.Tensor,
        bbox_reg: torch.Tensor,
        anchors: torch.Tensor,
        image_shape: tuple[int, int],
    ) -> list[dict[str, torch.Tensor]]:
        scores_all = F.softmax(cls_logits, dim=-1)
        results = []
        for reg, scores in zip(bbox_reg, scores_all):
            boxes = clip_boxes_to_image(self.box_coder.decode_single(reg, anchors), image_shape)
            keep_boxes, keep_scores, keep_labels = [], [], []
            for c in range(1, self.num_classes):
                s = scores[:, c]
                idx = torch.nonzero(s > SCORE_THRESH).squeeze(1)
                idx = idx[s[idx].argsort(descending=True)[:TOP_K]]
                keep_boxes.append(boxes[idx])
                keep_scores.append(s[idx])
                keep_labels.append(torch.full_like(idx, c))
            b, s, lab = torch.cat(keep_boxes), torch.cat(keep_scores), torch.cat(keep_labels)
            keep = batched_nms(b, s, lab, NMS_IOU)[:KEEP_TOP_K]  # sorted by score
            results.append({"boxes": b[keep], "scores": s[keep], "labels": lab[keep]})
        return results


@register_model("ssd300")
def ssd300(cfg: Any, num_classes: int, image_size: int = 300, **_: Any) -> nn.Module:
    """SSD300-VGG16; num_classes counts the background (21 for VOC)."""
    model = SSD300(num_classes, width=cfg.width, image_size=image_size)
    model.backbone_source = model.load_backbone(cfg.backbone_weights)
    return model
