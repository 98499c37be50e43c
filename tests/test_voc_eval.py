"""VOC mAP (mpt_repro/metrics/voc_eval.py): hand-computed cases, and agreement with a literal
transcription of the official devkit's VOCevaldet.m loop on random data."""

from __future__ import annotations

import numpy as np
import pytest

from mpt_repro.metrics.voc_eval import evaluate_detections, voc_ap

ONE = ["thing"]


def gt(boxes, labels=None, difficult=None):
    n = len(boxes)
    return {
        "boxes": np.array(boxes, dtype=float).reshape(-1, 4),
        "labels": np.array(labels if labels is not None else [1] * n),
        "difficult": np.array(difficult if difficult is not None else [False] * n),
    }


def det(boxes, scores, labels=None):
    return {
        "boxes": np.array(boxes, dtype=float).reshape(-1, 4),
        "scores": np.array(scores, dtype=float),
        "labels": np.array(labels if labels is not None else [1] * len(scores)),
    }


A, B = [0, 0, 10, 10], [20, 20, 30, 30]
FAR = [50, 50, 60, 60]


def test_tp_fp_tp_gives_the_hand_computed_aps() -> None:
    # recall 1/2, 1/2, 1; precision 1, 1/2, 2/3. 11-point: t = 0..0.5 -> 1 (6 points),
    # t = 0.6..1 -> 2/3 (5 points): (6 + 10/3) / 11. Area: 0.5 * 1 + 0.5 * 2/3.
    r = evaluate_detections([det([A, FAR, B], [0.9, 0.8, 0.7])], [gt([A, B])], ONE)
    assert r.per_class_ap["thing"] == pytest.approx(100 * (6 + 10 / 3) / 11)
    assert r.per_class_ap_area["thing"] == pytest.approx(100 * (0.5 + 1 / 3))
    assert r.map == pytest.approx(r.per_class_ap["thing"])


def test_a_duplicate_detection_is_a_false_positive() -> None:
    # the second detection of A ranks above B's: TP, FP (duplicate), TP, the same curve as above;
    # were duplicates ignored, the AP would be 100
    dup = [0, 0, 10, 9]  # IoU 0.9 with A
    r = evaluate_detections([det([A, dup, B], [0.9, 0.8, 0.7])], [gt([A, B])], ONE)
    assert r.per_class_ap["thing"] == pytest.approx(100 * (6 + 10 / 3) / 11)


def test_difficult_boxes_are_neither_positives_nor_detections() -> None:
    # D is difficult: its detection is dropped, it is not counted in the recall (npos = 1);
    # A is found, then one false positive: AP = 100. Counting D as a positive would give 100 at
    # recall 1/2 only, and its detection as a false positive would put precision 0 first.
    D = [20, 20, 30, 30]
    truth = gt([A, D], difficult=[False, True])
    r = evaluate_detections([det([D, A, FAR], [0.95, 0.9, 0.8])], [truth], ONE)
    assert r.num_positives["thing"] == 1
    assert r.per_class_ap["thing"] == pytest.approx(100.0)
    assert r.per_class_ap_area["thing"] == pytest.approx(100.0)


def test_iou_of_exactly_one_half_matches_as_in_the_devkit() -> None:
    half = [0, 0, 10, 5]  # IoU with A = 50 / 100
    assert evaluate_detections([det([half], [1.0])], [gt([A])], ONE).map == pytest.approx(100)
    below = [0, 0, 10, 4.99]
    assert evaluate_detections([det([below], [1.0])], [gt([A])], ONE).map == pytest.approx(0)


def test_detection_of_another_class_does_not_match() -> None:
    truth = gt([A], labels=[2])
    r = evaluate_detections([det([A], [0.9], labels=[1])], [truth], ["one", "two"])
    assert r.per_class_ap == {"two": 0.0}  # "one" has no ground truth: no AP, not in the mean
    assert r.map == 0.0


def test_classes_without_ground_truth_are_left_out_of_the_mean() -> None:
    truth = gt([A, B], labels=[1, 1])
    dets = det([A, B, FAR], [0.9, 0.8, 0.7], labels=[1, 1, 2])
    r = evaluate_detections([dets], [truth], ["one", "two"])
    assert set(r.per_class_ap) == {"one"} and r.map == pytest.approx(100)
    assert r.num_positives == {"one": 2, "two": 0}


def test_eleven_point_thresholds_are_exact_tenths() -> None:
    # 3 of 10 found at precision 1: recall exactly 0.3 counts at t = 0.3 (4 points of 11);
    # np.arange(0, 1.1, 0.1)'s 0.30000000000000004 would count 3
    rec, prec = np.array([0.1, 0.2, 0.3]), np.ones(3)
    assert voc_ap(rec, prec, eleven_point=True) == pytest.approx(4 / 11)
    assert voc_ap(rec, prec, eleven_point=False) == pytest.approx(0.3)


def test_equal_scores_keep_image_order() -> None:
    # two images, equal scores: image 0's false positive first, then image 1's hit
    # -> precision 0 then 1/2 at recall 1 (stable order); the other order would give AP 100
    dets = [det([FAR], [0.5]), det([A], [0.5])]
    r = evaluate_detections(dets, [gt([]), gt([A])], ONE)
    assert r.per_class_ap_area["thing"] == pytest.approx(50.0)


def test_no_detections_gives_zero() -> None:
    r = evaluate_detections([det([], [])], [gt([A])], ONE)
    assert r.map == 0.0 and r.map_area == 0.0


# -- the devkit, transcribed ------------------------------------------------------------------
def devkit_ap(dets, truths, cls: int, eleven_point: bool) -> float:
    """VOCevaldet.m, loop for loop, on the devkit's own 1-based inclusive coordinates: the boxes
    given here are continuous (x1, y1, x2, y2) and become (x1 + 1, y1 + 1, x2, y2)."""
    gts = []
    npos = 0
    for t in truths:
        keep = t["labels"] == cls
        bb = t["boxes"][keep] + np.array([1, 1, 0, 0])
        diff = t["difficult"][keep]
        gts.append({"BB": bb, "diff": diff, "det": np.zeros(len(bb), dtype=bool)})
        npos += int((~diff).sum())
    ids, conf, bbs = [], [], []
    for i, d in enumerate(dets):
        for b, s, lab in zip(d["boxes"], d["scores"], d["labels"]):
            if lab == cls:
                ids.append(i)
                conf.append(s)
                bbs.append(b + np.array([1, 1, 0, 0]))
    order = sorted(range(len(conf)), key=lambda k: -conf[k])  # Python's sort is stable
    tp, fp = np.zeros(len(order)), np.zeros(len(order))
    for d, k in enumerate(order):
        g, bb = gts[ids[k]], bbs[k]
        ovmax, jmax = -np.inf, -1
        for j, bbgt in enumerate(g["BB"]):
            bi = [
                max(bb[0], bbgt[0]),
                max(bb[1], bbgt[1]),
                min(bb[2], bbgt[2]),
                min(bb[3], bbgt[3]),
            ]
            iw, ih = bi[2] - bi[0] + 1, bi[3] - bi[1] + 1
            if iw > 0 and ih > 0:
                ua = (
                    (bb[2] - bb[0] + 1) * (bb[3] - bb[1] + 1)
                    + (bbgt[2] - bbgt[0] + 1) * (bbgt[3] - bbgt[1] + 1)
                    - iw * ih
                )
                ov = iw * ih / ua
                if ov > ovmax:
                    ovmax, jmax = ov, j
        if ovmax >= 0.5:
            if not g["diff"][jmax]:
                if not g["det"][jmax]:
                    tp[d] = 1
                    g["det"][jmax] = True
                else:
                    fp[d] = 1
        else:
            fp[d] = 1
    fp, tp = np.cumsum(fp), np.cumsum(tp)
    rec = tp / npos
    with np.errstate(invalid="ignore"):
        prec = tp / (fp + tp)  # 0/0 = NaN where only difficult detections came first, as in MATLAB
    if eleven_point:
        ap = 0.0
        for t in [k / 10 for k in range(11)]:  # 0:0.1:1 (exact tenths, see voc_ap)
            p = prec[rec >= t]
            p = p[~np.isnan(p)]
            ap += (p.max() if p.size else 0.0) / 11
        return ap
    mrec = np.concatenate(([0], rec, [1]))
    mpre = np.concatenate(([0], np.nan_to_num(prec), [0]))
    for i in range(len(mpre) - 2, -1, -1):
        mpre[i] = max(mpre[i], mpre[i + 1])
    idx = np.nonzero(mrec[1:] != mrec[:-1])[0] + 1
    return float(np.sum((mrec[idx] - mrec[idx - 1]) * mpre[idx]))


def random_scene(rng: np.random.Generator, n_images: int, n_classes: int):
    truths, dets = [], []
    for _ in range(n_images):
        n = rng.integers(0, 5)
        xy = rng.integers(0, 80, (n, 2)).astype(float)
        wh = rng.integers(4, 40, (n, 2)).astype(float)
        boxes = np.concatenate([xy, xy + wh], 1)
        labels = rng.integers(1, n_classes + 1, n)
        truths.append({"boxes": boxes, "labels": labels, "difficult": rng.random(n) < 0.2})
        # detections: jittered copies (some duplicates), plus random boxes; scores on a coarse
        # grid so that ties happen
        m = rng.integers(0, 8)
        src = rng.integers(0, max(n, 1), m)
        jit = rng.integers(-4, 5, (m, 4)).astype(float)
        dboxes = (boxes[src] if n else np.zeros((m, 4))) + jit
        rand = rng.random(m) < 0.3
        dboxes[rand] = np.concatenate([xy2 := rng.integers(0, 80, (rand.sum(), 2)), xy2 + 20], 1)
        dboxes[:, 2:] = np.maximum(dboxes[:, 2:], dboxes[:, :2] + 1)
        dlabels = np.where(
            rng.random(m) < 0.8, labels[src] if n else 1, rng.integers(1, n_classes + 1, m)
        )
        dets.append({"boxes": dboxes, "scores": rng.integers(0, 20, m) / 20, "labels": dlabels})
    return dets, truths


@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_the_devkit_loop_on_random_scenes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c"]
    dets, truths = random_scene(rng, 30, len(names))
    r = evaluate_detections(dets, truths, names)
    for c, name in enumerate(names, start=1):
        if r.num_positives[name] == 0:
            assert name not in r.per_class_ap
            continue
        assert r.per_class_ap[name] == pytest.approx(100 * devkit_ap(dets, truths, c, True))
        assert r.per_class_ap_area[name] == pytest.approx(100 * devkit_ap(dets, truths, c, False))
