"""PASCAL VOC detection mAP at IoU 0.5, as the official devkit computes it (VOCevaldet.m).

Two ways of turning a precision/recall curve into an AP:

* ``11-point`` (VOC2007 devkit, what the paper-era numbers use, Table 2 of Micikevicius et al.):
  the mean over recall levels t = 0, 0.1, ..., 1 of the highest precision at recall >= t;
* ``area`` (VOC2010+ devkit, VOCap.m): the area under the precision envelope (the curve made
  monotonically decreasing from the right), summed where the recall changes.

Matching, per class, over all test images together (VOCevaldet.m):

* detections are visited in decreasing score order (a stable sort: equal scores keep the order of
  images, then the order within an image, as MATLAB's stable ``sort`` does);
* each takes the ground-truth box of its class in its image with the highest IoU (``jmax``),
  whether or not that box was already detected;
* IoU >= 0.5 (the devkit's ``ovmax >= minoverlap``; py-faster-rcnn's voc_eval.py writes ``>``):
  a ``difficult`` box makes it neither a true nor a false positive (ignored); the first
  detection of a non-difficult box is a true positive, every later one a false positive
  (duplicates); below 0.5: a false positive;
* recall = TP / (non-difficult boxes of the class), precision = TP / (TP + FP).

Box convention: continuous pixel coordinates (x1, y1, x2, y2), the width being x2 - x1. VOC's
XML gives 1-based inclusive pixel indices; mpt_repro/data/voc.py converts them to
(xmin - 1, ymin - 1, xmax, ymax), for which this continuous IoU equals the devkit's "+1" IoU on the
original indices exactly.

Classes with no non-difficult ground truth in the evaluated images have no AP (the devkit would
divide by zero); they are left out of the mean and of per_class_ap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IOU_THRESHOLD = 0.5  # PASCAL VOC's minoverlap


@dataclass
class VOCResult:
    map: float  # mean 11-point AP over classes with ground truth, percent
    map_area: float  # mean area-based AP, percent
    per_class_ap: dict[str, float] = field(default_factory=dict)  # 11-point, percent
    per_class_ap_area: dict[str, float] = field(default_factory=dict)  # percent
    num_positives: dict[str, int] = field(default_factory=dict)  # non-difficult boxes per class
    num_detections: int = 0


def voc_ap(recall: np.ndarray, precision: np.ndarray, eleven_point: bool) -> float:
    """AP of one class (a fraction in [0, 1]) from its cumulative recall and precision, in the
    order the detections were visited."""
    recall = np.asarray(recall, dtype=np.float64)
    precision = np.asarray(precision, dtype=np.float64)
    if eleven_point:
        ap = 0.0
        # t = k/10 exactly (not 0.1 accumulated): a recall of 3/10 counts at t = 0.3
        for k in range(11):
            above = precision[recall >= k / 10]
            ap += (above.max() if above.size else 0.0) / 11
        return float(ap)
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([0.0], precision, [0.0]))
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]  # the precision envelope
    changes = np.nonzero(mrec[1:] != mrec[:-1])[0] + 1
    return float(np.sum((mrec[changes] - mrec[changes - 1]) * mpre[changes]))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix [len(a), len(b)] of continuous (x1, y1, x2, y2) boxes."""
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(inter > 0, inter / np.maximum(union, 1e-12), 0.0)


def _as_numpy(x: Any, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype).reshape(shape)


def evaluate_detections(
    detections: Sequence[dict[str, Any]],
    ground_truths: Sequence[dict[str, Any]],
    class_names: Sequence[str],
    iou_threshold: float = IOU_THRESHOLD,
) -> VOCResult:
    """VOC mAP of ``detections`` against ``ground_truths`` (one dict per image, same order).

    detections[i]: ``boxes`` [n, 4], ``scores`` [n], ``labels`` [n] (1..C; 0 is background);
    ground_truths[i]: ``boxes`` [m, 4], ``labels`` [m], ``difficult`` [m] (bool).
    ``class_names[c - 1]`` names label c. Tensors or arrays; boxes in continuous coordinates.
    """
    if len(detections) != len(ground_truths):
        raise ValueError(
            f"{len(detections)} images with detections but {len(ground_truths)} with ground truth"
        )
    matched = _match(detections, ground_truths)
    result = VOCResult(map=0.0, map_area=0.0, num_detections=len(matched.label))
    aps, aps_area = [], []
    for c, name in enumerate(class_names, start=1):
        npos = int(np.sum((matched.gt_label == c) & ~matched.gt_difficult))
        result.num_positives[name] = npos
        if npos == 0:
            continue
        recall, precision = _curve(matched, c, npos, iou_threshold)
        ap, ap_area = voc_ap(recall, precision, True), voc_ap(recall, precision, False)
        result.per_class_ap[name] = 100.0 * ap
        result.per_class_ap_area[name] = 100.0 * ap_area
        aps.append(ap)
        aps_area.append(ap_area)
    result.map = 100.0 * float(np.mean(aps)) if aps else 0.0
    result.map_area = 100.0 * float(np.mean(aps_area)) if aps_area else 0.0
    return result


@dataclass
class _Matched:
    """Per detection (all images, in image order): label, score, IoU with the best box of its
    class in its image and that box's global index; per ground-truth box: label, difficult."""

    label: np.ndarray
    score: np.ndarray
    iou: np.ndarray
    gt: np.ndarray
    gt_label: np.ndarray
    gt_difficult: np.ndarray


def _match(
    detections: Sequence[dict[str, Any]], ground_truths: Sequence[dict[str, Any]]
) -> _Matched:
    rows_label, rows_score, rows_iou, rows_gt = [], [], [], []
    gt_label, gt_difficult = [], []
    offset = 0
    for det, gt in zip(detections, ground_truths):
        g_boxes = _as_numpy(gt["boxes"], np.float64, (-1, 4))
        g_labels = _as_numpy(gt["labels"], np.int64, (-1,))
        g_diff = _as_numpy(gt.get("difficult", np.zeros(len(g_labels))), bool, (-1,))
        d_boxes = _as_numpy(det["boxes"], np.float64, (-1, 4))
        d_labels = _as_numpy(det["labels"], np.int64, (-1,))
        d_scores = _as_numpy(det["scores"], np.float64, (-1,))
        gt_label.append(g_labels)
        gt_difficult.append(g_diff)
        n = len(d_labels)
        if n:
            iou = box_iou(d_boxes, g_boxes) if len(g_labels) else np.zeros((n, 0))
            iou = np.where(d_labels[:, None] == g_labels[None, :], iou, -1.0)  # own class only
            if iou.shape[1]:
                jmax = iou.argmax(axis=1)
                ovmax = iou[np.arange(n), jmax]
            else:
                jmax, ovmax = np.zeros(n, dtype=np.int64), np.full(n, -1.0)
            rows_label.append(d_labels)
            rows_score.append(d_scores)
            rows_iou.append(ovmax)
            rows_gt.append(jmax + offset)
        offset += len(g_labels)

    def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    return _Matched(
        cat(rows_label, np.int64),
        cat(rows_score, np.float64),
        cat(rows_iou, np.float64),
        cat(rows_gt, np.int64),
        cat(gt_label, np.int64),
        cat(gt_difficult, bool),
    )


def _curve(m: _Matched, c: int, npos: int, iou_threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Class c's recall and precision at each detection, in score order (the devkit's rules:
    one true positive per box, later hits are duplicates, hits on difficult boxes dropped)."""
    mine = np.nonzero(m.label == c)[0]
    order = mine[np.argsort(-m.score[mine], kind="stable")]
    hit = m.iou[order] >= iou_threshold
    gt_idx = m.gt[order]
    difficult = np.zeros_like(hit)
    difficult[hit] = m.gt_difficult[gt_idx[hit]]  # gt_idx means nothing where nothing was hit
    candidate = hit & ~difficult
    # the first detection (in score order) of a box is the true positive; later ones are
    # duplicates, hence false positives
    first = np.zeros(len(order), dtype=bool)
    if candidate.any():
        cand_pos = np.nonzero(candidate)[0]
        _, first_of_box = np.unique(gt_idx[cand_pos], return_index=True)
        first[cand_pos[first_of_box]] = True
    fp = ~hit | (candidate & ~first)
    keep = ~difficult  # detections of difficult boxes are dropped from the curve
    tp_cum = np.cumsum(first[keep])
    fp_cum = np.cumsum(fp[keep])
    recall = tp_cum / npos
    precision = tp_cum / np.maximum(tp_cum + fp_cum, np.finfo(np.float64).eps)
    return recall, precision
