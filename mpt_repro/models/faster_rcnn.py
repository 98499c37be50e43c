"""Faster R-CNN with a VGG-16 backbone (Ren et al. 2015), as rbgirshick/py-faster-rcnn trains it
end to end (models/pascal_voc/VGG16/faster_rcnn_end2end, experiments/cfgs/
faster_rcnn_end2end.yml): the network of the paper's Table 2 "Faster R-CNN" row.

Network: VGG-16 conv1_1..conv5_3 (stride 16, no pool5). RPN: 3x3 conv (512) + ReLU, then per
position 9 anchors (areas 128^2, 256^2, 512^2 x ratios 0.5, 1, 2), an objectness score and 4
offsets each. Training: anchors crossing the image border ignored; positive at IoU >= 0.7 (and
each box's best anchor), negative below 0.3; 256 sampled per image, at most half positive;
smooth L1 with sigma 3 (beta 1/9) + logistic loss. Proposals: the top 12,000 (test 6,000)
by score, NMS at 0.7, the top 2,000 (test 300) kept, the ground-truth boxes added in training.
RoI head: RoI max pooling 7x7 at 1/16 on conv5_3, fc6 and fc7 (4096, ReLU, dropout 0.5, both
initialised from VGG-16's ImageNet fc6/fc7), a 21-way classifier (init N(0, 0.01)) and
class-specific box offsets (N(0, 0.001)) with targets normalised by (0.1, 0.1, 0.2, 0.2); 128
RoIs per image, a quarter positive (IoU >= 0.5), the rest in [0, 0.5); softmax cross-entropy +
smooth L1 (sigma 1). conv1 and conv2 frozen (lr_mult 0) when the backbone is pre-trained.
Test: per class, score > 0.05, NMS at 0.3, at most 100 detections per image.

Mixed precision: the RPN's and the box predictor's outputs are cast to FP32, and the anchors
are generated in FP32, so proposal decoding, NMS, matching and the losses are FP32 in every
preset; RoI pooling reads FP32 features (exact) with FP32 box coordinates.

From torchvision: RegionProposalNetwork, RPNHead, AnchorGenerator, RoIHeads (sampling, box
coding, post-processing), RoIPool, the Matcher and samplers. Differences from py-faster-rcnn
(documented in docs/experiments_detection.md): anchors centred on (16x, 16y) rather than
(16x + 7.5, 16y + 7.5); the objectness is one logit per anchor (sigmoid) instead of a two-way
softmax (the same model family); the proposal minimum size is 16 input pixels instead of 16
original pixels; model.width scales every channel count for smoke runs (64 = the paper).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork, RPNHead
from torchvision.ops import RoIPool, box_iou

from mpt_repro.errors import ConfigError
from mpt_repro.models import register_model
from mpt_repro.models.box_coder import DeviceBoxCoder
from mpt_repro.models.detection_backbone import (
    CONV2_2_END,
    NO_WEIGHTS_WARNING,
    fc_weights,
    load_trunk,
    read_vgg16_state,
    scaled,
    vgg16_trunk,
)
from mpt_repro.models.ssd import no_autocast

log = logging.getLogger("mpt_repro")

ANCHOR_SIZES = ((128, 256, 512),)
ANCHOR_RATIOS = ((0.5, 1.0, 2.0),)
RPN_MIN_SIZE = 16.0
ROI_SIZE, FEATURE_STRIDE = 7, 16
MIN_IMAGE_SIZE = 32  # conv5_3 at stride 16 needs a 2x2 map at least


class _FP32AnchorGenerator(AnchorGenerator):
    """Anchors in FP32 whatever the feature maps' precision (pixel coordinates of up to ~1000
    would be rounded to 0.5 px in FP16). The generator reads only the maps' shapes and device."""

    def forward(self, image_list: ImageList, feature_maps: list[torch.Tensor]):
        stand_in = [torch.empty((), device=f.device).expand(f.shape) for f in feature_maps]
        return super().forward(image_list, stand_in)


class _RPNHead(RPNHead):
    def forward(self, x: list[torch.Tensor]):
        logits, deltas = super().forward(x)
        return [t.float() for t in logits], [t.float() for t in deltas]


class _RPN(RegionProposalNetwork):
    """torchvision's RPN with py-faster-rcnn's anchor targets: anchors that cross the image
    border are neither positive nor negative (anchor_target_layer.py, allowed_border 0)."""

    def forward(self, images: ImageList, features: dict, targets: Any = None):
        self._image_sizes = images.image_sizes  # for the border test in the anchor targets
        return super().forward(images, features, targets)

    def assign_targets_to_anchors(self, anchors: list[torch.Tensor], targets: list[dict]):
        labels, matched_boxes = [], []
        for a, t, (h, w) in zip(anchors, targets, self._image_sizes):
            inside = (a[:, 0] >= 0) & (a[:, 1] >= 0) & (a[:, 2] <= w) & (a[:, 3] <= h)
            lab = torch.full((len(a),), -1.0, device=a.device)
            boxes = torch.zeros_like(a)
            gt = t["boxes"].to(a.dtype)
            idx = torch.nonzero(inside).squeeze(1)
            if len(gt) == 0:
                lab[idx] = 0.0
            elif len(idx):
                m = self.proposal_matcher(box_iou(gt, a[idx]))
                sub = (m >= 0).float()
                sub[m == self.proposal_matcher.BELOW_LOW_THRESHOLD] = 0.0
                sub[m == self.proposal_matcher.BETWEEN_THRESHOLDS] = -1.0
                lab[idx] = sub
                boxes[idx] = gt[m.clamp(min=0)]
            labels.append(lab)
            matched_boxes.append(boxes)
        return labels, matched_boxes

    def compute_loss(self, objectness, pred_bbox_deltas, labels, regression_targets):
        """torchvision's RPN loss (logistic + smooth L1 with beta 1/9, both over the sampled
        anchors), in FP32, and 0 rather than NaN when no anchor lies inside any image (images
        smaller than the smallest anchor, e.g. smoke sizes)."""
        with no_autocast(objectness.device):
            pos, neg = self.fg_bg_sampler(labels)
            pos = torch.nonzero(torch.cat(pos)).squeeze(1)
            neg = torch.nonzero(torch.cat(neg)).squeeze(1)
            sampled = torch.cat([pos, neg])
            n = max(1, sampled.numel())
            logits = objectness.float().flatten()
            box_loss = F.smooth_l1_loss(
                pred_bbox_deltas.float()[pos],
                torch.cat(regression_targets)[pos],
                beta=1 / 9,
                reduction="sum",
            )
            obj_loss = F.binary_cross_entropy_with_logits(
                logits[sampled], torch.cat(labels)[sampled], reduction="sum"
            )
            return obj_loss / n, box_loss / n


class _RoIPool(nn.Module):
    """RoIHeads' box_roi_pool interface (features dict, proposals, image sizes) over one map."""

    def __init__(self):
        super().__init__()
        self.pool = RoIPool((ROI_SIZE, ROI_SIZE), 1.0 / FEATURE_STRIDE)

    def forward(self, features: dict, proposals: list[torch.Tensor], image_shapes: Any):
        x = features["0"]
        # the max is exact in any precision; FP32 keeps the RoI coordinates unrounded
        return self.pool(x.float(), [p.float() for p in proposals]).to(x.dtype)


class _BoxPredictor(nn.Module):
    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.cls_score = nn.Linear(in_features, num_classes)
        self.bbox_pred = nn.Linear(in_features, num_classes * 4)
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        nn.init.zeros_(self.cls_score.bias)
        nn.init.zeros_(self.bbox_pred.bias)

    def forward(self, x: torch.Tensor):
        return self.cls_score(x).float(), self.bbox_pred(x).float()


class _RoIHeads(RoIHeads):
    """torchvision's RoIHeads, box branch only, with py-faster-rcnn's box loss (smooth L1 with
    sigma 1, i.e. beta 1; torchvision uses 1/9) computed in FP32."""

    def forward(self, features, proposals, image_shapes, targets=None):
        if self.training:
            proposals, _, labels, reg_targets = self.select_training_samples(proposals, targets)
        x = self.box_head(self.box_roi_pool(features, proposals, image_shapes))
        class_logits, box_regression = self.box_predictor(x)
        if self.training:
            return [], fast_rcnn_loss(class_logits, box_regression, labels, reg_targets)
        boxes, scores, labels = self.postprocess_detections(
            class_logits, box_regression, proposals, image_shapes
        )
        return [
            {"boxes": b, "scores": s, "labels": c} for b, s, c in zip(boxes, scores, labels)
        ], {}


def fast_rcnn_loss(
    class_logits: torch.Tensor,
    box_regression: torch.Tensor,
    labels: list[torch.Tensor],
    regression_targets: list[torch.Tensor],
) -> dict[str, torch.Tensor]:
    """py-faster-rcnn's loss_cls (softmax over the sampled RoIs) and loss_bbox (smooth L1, sigma 1,
    on the ground-truth class's offsets of foreground RoIs, divided by the number of RoIs)."""
    with no_autocast(class_logits.device):
        labels_t = torch.cat(labels)
        targets_t = torch.cat(regression_targets)
        loss_cls = F.cross_entropy(class_logits.float(), labels_t)
        pos = torch.nonzero(labels_t > 0).squeeze(1)
        reg = box_regression.float().reshape(len(labels_t), -1, 4)[pos, labels_t[pos]]
        loss_bbox = F.smooth_l1_loss(reg, targets_t[pos], beta=1.0, reduction="sum")
        return {"loss_cls": loss_cls, "loss_bbox": loss_bbox / max(1, labels_t.numel())}


class FasterRCNNVGG16(nn.Module):
    input_geometry = "shorter_side"  # shorter side image_size, longer <= max_size

    def __init__(self, num_classes: int, width: int = 64, dropout: float = 0.5):
        super().__init__()
        c5 = scaled(512, width)
        fc = scaled(4096, width)
        self.vgg = vgg16_trunk(width)[:30]  # conv1_1 .. relu5_3: stride 16
        anchors = _FP32AnchorGenerator(ANCHOR_SIZES, ANCHOR_RATIOS)
        self.rpn = _RPN(
            anchors,
            _RPNHead(c5, anchors.num_anchors_per_location()[0]),
            fg_iou_thresh=0.7,
            bg_iou_thresh=0.3,
            batch_size_per_image=256,
            positive_fraction=0.5,
            pre_nms_top_n={"training": 12000, "testing": 6000},
            post_nms_top_n={"training": 2000, "testing": 300},
            nms_thresh=0.7,
        )
        self.rpn.min_size = RPN_MIN_SIZE
        self.fc6 = nn.Linear(c5 * ROI_SIZE * ROI_SIZE, fc)
        self.fc7 = nn.Linear(fc, fc)
        for layer in (self.fc6, self.fc7):  # torchvision VGG's classifier init (from scratch)
            nn.init.normal_(layer.weight, 0, 0.01)
            nn.init.zeros_(layer.bias)
        box_head = nn.Sequential(
            nn.Flatten(),
            self.fc6,
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            self.fc7,
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
        )
        self.roi_heads = _RoIHeads(
            _RoIPool(),
            box_head,
            _BoxPredictor(fc, num_classes),
            fg_iou_thresh=0.5,
            bg_iou_thresh=0.5,
            batch_size_per_image=128,
            positive_fraction=0.25,
            bbox_reg_weights=(10.0, 10.0, 5.0, 5.0),
            score_thresh=0.05,
            nms_thresh=0.3,
            detections_per_img=100,
        )
        # torchvision's coders build host tensors on every call (mpt_repro/models/box_coder.py)
        self.rpn.box_coder = DeviceBoxCoder(self.rpn.box_coder.weights)
        self.roi_heads.box_coder = DeviceBoxCoder(self.roi_heads.box_coder.weights)

    def load_backbone(self, path: str | None) -> str:
        """conv1_1..conv5_3 and fc6/fc7 from a VGG-16 file; conv1/conv2 then frozen."""
        if not path:
            log.warning(NO_WEIGHTS_WARNING)
            return "none (random initialisation; conv1/conv2 trained)"
        sd = read_vgg16_state(path)
        load_trunk(self.vgg, sd, upto=30)
        loaded = f"{path} (conv1_1..conv5_3"
        fc = fc_weights(sd)
        if fc is None:
            log.warning("%s has no classifier.0/3 (fc6/fc7): the box head starts random", path)
        else:
            w6, b6, w7, b7 = fc
            if w6.shape != self.fc6.weight.shape or w7.shape != self.fc7.weight.shape:
                raise ConfigError(
                    f"{path}: fc6 {tuple(w6.shape)} does not fit the box head's "
                    f"{tuple(self.fc6.weight.shape)}; use model.width=64 with the full VGG-16"
                )
            with torch.no_grad():
                for layer, w, b in ((self.fc6, w6, b6), (self.fc7, w7, b7)):
                    layer.weight.copy_(w)
                    layer.bias.copy_(b)
            loaded += ", fc6, fc7"
        # py-faster-rcnn: conv1_x and conv2_x have lr_mult 0 (ImageNet's low-level filters kept)
        for p in self.vgg[:CONV2_2_END].parameters():
            p.requires_grad_(False)
        return loaded + "; conv1/conv2 frozen)"

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: torch.Tensor,
        targets: list[dict[str, torch.Tensor]] | None = None,
    ) -> Any:
        """Training: {"loss_objectness", "loss_rpn_box_reg", "loss_cls", "loss_bbox"} (FP32).
        Eval: per image a dict of boxes (input pixels), scores and labels."""
        if self.training and targets is None:
            raise ValueError("Faster R-CNN in training mode needs targets")
        # "host:": the sizes stay on the host (the collate made them there), so reading them
        # does not wait for the device
        with torch.profiler.record_function("host:image_sizes"):
            sizes = [(int(h), int(w)) for h, w in image_sizes.tolist()]
        feats = {"0": self.vgg(images)}
        proposals, rpn_losses = self.rpn(ImageList(images, sizes), feats, targets)
        detections, roi_losses = self.roi_heads(feats, proposals, sizes, targets)
        if self.training:
            return {**rpn_losses, **roi_losses}
        return detections


@register_model("faster_rcnn_vgg16")
def faster_rcnn_vgg16(cfg: Any, num_classes: int, image_size: int = 600, **_: Any) -> nn.Module:
    """Faster R-CNN VGG-16; num_classes counts the background (21 for VOC)."""
    if image_size < MIN_IMAGE_SIZE:
        raise ConfigError(
            f"Faster R-CNN needs data.image_size >= {MIN_IMAGE_SIZE} (got {image_size})"
        )
    model = FasterRCNNVGG16(num_classes, width=cfg.width, dropout=cfg.dropout)
    model.backbone_source = model.load_backbone(cfg.backbone_weights)
    return model
