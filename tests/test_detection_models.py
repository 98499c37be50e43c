"""The detectors (mpt_repro/models/ssd.py, faster_rcnn.py) and their VGG-16 weights
(mpt_repro/models/detection_backbone.py), at reduced width so that each test takes a moment."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpt_repro.errors import ConfigError, DataError
from mpt_repro.models import build_model
from mpt_repro.models.detection_backbone import reduce_fc, vgg16_trunk
from mpt_repro.models.faster_rcnn import fast_rcnn_loss
from mpt_repro.models.ssd import L2Norm

pytestmark = pytest.mark.usefixtures("one_thread")


def model_cfg(name: str, width: int = 4, weights: str | None = None):
    return SimpleNamespace(name=name, width=width, backbone_weights=weights, dropout=0.5)


def ssd(width: int = 4, weights: str | None = None, image_size: int = 300):
    torch.manual_seed(0)
    return build_model(model_cfg("ssd300", width, weights), num_classes=21, image_size=image_size)


def frcnn(width: int = 4, weights: str | None = None):
    torch.manual_seed(0)
    return build_model(
        model_cfg("faster_rcnn_vgg16", width, weights), num_classes=21, image_size=96
    )


def one_box(box, label=3):
    return {"boxes": torch.tensor([box], dtype=torch.float32), "labels": torch.tensor([label])}


NO_BOX = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)}


# -- SSD -----------------------------------------------------------------------------------------
def test_ssd_added_layers_use_caffes_xavier_as_model_libs() -> None:
    """fc6, fc7, the extra layers and the heads: U(+-sqrt(3 / fan_in)), zero bias (Caffe's xavier
    in weiliu89/caffe model_libs.py), which PyTorch's xavier_uniform_ (sqrt(6 / (fan_in +
    fan_out))) would not fill: e.g. conv8_1 (1x1, 1024 -> 256) 0.0541 against 0.0685."""
    m = ssd(width=64)
    convs = [c for part in (m.fc6, m.fc7, m.extras, m.head) for c in part.modules()]
    convs = [c for c in convs if isinstance(c, torch.nn.Conv2d)]
    assert len(convs) == 2 + 8 + 12  # fc6, fc7, 4 x 2 extras, 6 x 2 heads
    for c in convs:
        bound = (3 / c.weight[0].numel()) ** 0.5
        top = float(c.weight.detach().abs().max())
        assert 0.95 * bound < top <= bound * (1 + 1e-6), c
        assert float(c.bias.detach().abs().max()) == 0.0


def test_ssd300_has_the_papers_six_maps_and_8732_default_boxes() -> None:
    m = ssd()
    maps = m.features(torch.zeros(1, 3, 300, 300))
    assert [tuple(f.shape[-2:]) for f in maps] == [
        (38, 38),
        (19, 19),
        (10, 10),
        (5, 5),
        (3, 3),
        (1, 1),
    ]
    boxes = m.default_boxes(maps, 300, 300)
    assert boxes.shape == (8732, 4)
    # conv4_3's first two boxes at (4, 4) (step 8): side 0.1 * 300 and sqrt(0.1 * 0.2) * 300
    wh = boxes[:2, 2:] - boxes[:2, :2]
    assert wh[:, 0].tolist() == pytest.approx([30.0, 300 * math.sqrt(0.02)], rel=1e-5)
    assert ((boxes[:2, :2] + boxes[:2, 2:]) / 2).flatten().tolist() == pytest.approx([4.0] * 4)
    # the last map's ar=1 extra box: sqrt(0.88 * 1.05) * 300 > 300: not clipped (Caffe's clip false)
    assert (boxes[-4:, 2] - boxes[-4:, 0]).max() > 300


def test_ssd_refuses_an_input_too_small_for_conv11_2() -> None:
    with pytest.raises(ConfigError, match="image_size >= 268"):
        ssd(image_size=256)


def test_multibox_loss_mines_three_negatives_per_match() -> None:
    m = ssd()
    anchors = m.default_boxes(m.features(torch.zeros(1, 3, 300, 300)), 300, 300)
    # uniform logits: every default box's cross-entropy is ln(21); a box equal to one default box
    logits = torch.zeros(2, len(anchors), 21)
    reg = torch.zeros(2, len(anchors), 4)
    gt = anchors[100].tolist()
    losses = m.loss(logits, reg, anchors, [one_box(gt), NO_BOX])
    from torchvision.ops import box_iou

    matched = int((box_iou(torch.tensor([gt]), anchors) >= 0.5).sum())
    assert matched >= 1
    # (matched positives + 3 x matched negatives) x ln 21 / matched; image 2 adds nothing
    assert float(losses["loss_conf"]) == pytest.approx(4 * math.log(21), rel=1e-5)
    assert float(losses["loss_loc"]) >= 0
    empty = m.loss(logits, reg, anchors, [NO_BOX, NO_BOX])
    assert float(empty["loss_conf"]) == 0.0 and float(empty["loss_loc"]) == 0.0


def test_ssd_losses_and_detections_are_fp32_under_autocast() -> None:
    m = ssd()
    x = torch.randn(2, 3, 300, 300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = m(x, None, [one_box([10.0, 20.0, 120.0, 200.0]), NO_BOX])
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert (
        m.l2norm.weight.grad is not None
        and m.head.classification_head.module_list[5].weight.grad is not None
    )
    m.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        dets = m(x)
    assert len(dets) == 2 and dets[0]["boxes"].dtype == torch.float32
    assert len(dets[0]["boxes"]) <= 200 and (dets[0]["labels"] >= 1).all()
    assert (dets[0]["boxes"] >= 0).all() and (dets[0]["boxes"] <= 300).all()


def test_l2norm_scales_each_position_to_its_learned_norm() -> None:
    norm = L2Norm(4)
    x = torch.randn(2, 4, 3, 3) * 100
    y = norm(x)
    assert y.pow(2).sum(1).sqrt().flatten().tolist() == pytest.approx([20.0] * 18, rel=1e-5)
    # FP16 input: squares of 300 overflow FP16 (65504), the FP32 norm does not
    big = torch.full((1, 4, 1, 1), 300.0).half()
    out = norm.half()(big)
    assert out.dtype == torch.float16 and out.float().flatten().tolist() == pytest.approx(
        [10.0] * 4
    )


# -- VGG-16 weights --------------------------------------------------------------------------------
def fake_vgg16_state(width: int) -> dict[str, torch.Tensor]:
    """A torchvision-layout VGG-16 state dict at `width` (the real one is width 64, 528 MB)."""
    torch.manual_seed(1)
    sd = {f"features.{k}": v.clone() for k, v in vgg16_trunk(width).state_dict().items()}
    c5, fc = 512 * width // 64, 4096 * width // 64
    sd["classifier.0.weight"] = torch.randn(fc, c5 * 49)
    sd["classifier.0.bias"] = torch.randn(fc)
    sd["classifier.3.weight"] = torch.randn(fc, fc)
    sd["classifier.3.bias"] = torch.randn(fc)
    sd["classifier.6.weight"] = torch.randn(10, fc)
    sd["classifier.6.bias"] = torch.randn(10)
    return sd


def test_fc_reduction_subsamples_filters_and_positions() -> None:
    w6 = torch.randn(8, 2 * 49)
    w7 = torch.randn(8, 8)
    r6, b6, r7, b7 = reduce_fc(w6, torch.arange(8.0), w7, torch.arange(8.0))
    assert r6.shape == (2, 2, 3, 3) and r7.shape == (2, 2, 1, 1)
    full = w6.view(8, 2, 7, 7)
    assert r6[1, 0, 2, 1] == full[4, 0, 6, 3]  # filter 4, position (6, 3) of 7x7
    assert r7[1, 1, 0, 0] == w7[4, 4] and b6.tolist() == [0.0, 4.0] == b7.tolist()


def test_ssd_loads_a_torchvision_vgg16_file(tmp_path: Path) -> None:
    sd = fake_vgg16_state(4)
    path = tmp_path / "vgg16.pth"
    torch.save(sd, path)
    m = ssd(weights=str(path))
    assert torch.equal(m.vgg[28].weight, sd["features.28.weight"])  # conv5_3
    w6, b6, _, _ = reduce_fc(
        *(sd[f"classifier.{i}.{p}"] for i in (0, 3) for p in ("weight", "bias"))
    )
    assert torch.equal(m.fc6.weight, w6) and torch.equal(m.fc6.bias, b6)
    assert "fc6/fc7 subsampled" in m.backbone_source


def test_faster_rcnn_loads_our_own_vgg16_checkpoint_and_freezes_conv1_conv2(tmp_path: Path) -> None:
    sd = fake_vgg16_state(4)
    # a mixed-precision run's checkpoint: rounded FP16 weights, FP32 masters, RNG state (numpy)
    ckpt = {
        "models": {"model": {k: v.half() for k, v in sd.items()}},
        "policy": {"optimizers": {"model": {"masters": list(sd.values())}}},
        "rng": {"numpy": np.random.get_state()},
    }
    path = tmp_path / "last.pt"
    torch.save(ckpt, path)
    m = frcnn(weights=str(path))
    assert torch.equal(m.vgg[0].weight, sd["features.0.weight"])  # the FP32 master, not rounded
    assert torch.equal(m.fc6.weight, sd["classifier.0.weight"])
    frozen = {n for n, p in m.named_parameters() if not p.requires_grad}
    assert frozen == {f"vgg.{i}.{p}" for i in (0, 2, 5, 7) for p in ("weight", "bias")}


def test_backbone_weights_errors_say_what_to_do(tmp_path: Path, caplog) -> None:
    with pytest.raises(DataError, match="is not a file"):
        ssd(weights=str(tmp_path / "missing.pth"))
    path = tmp_path / "vgg16.pth"
    torch.save(fake_vgg16_state(8), path)
    with pytest.raises(ConfigError, match="use model.width=64"):
        ssd(width=4, weights=str(path))
    torch.save({"conv.weight": torch.zeros(1)}, path)
    with pytest.raises(DataError, match="not a VGG-16 state dict"):
        ssd(weights=str(path))
    with caplog.at_level("WARNING", logger="mpt_repro"):
        ssd()
    assert "assume an ImageNet pre-trained VGG-16" in caplog.text


def test_a_crafted_backbone_file_runs_no_code_and_is_refused_naming_it(tmp_path: Path) -> None:
    """It fell back to a full unpickle when the safe load failed (issue 34)."""
    import os

    planted = tmp_path / "planted"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {planted}",))

    path = tmp_path / "vgg16.pth"
    torch.save({**fake_vgg16_state(4), "x": Planted()}, path)
    with pytest.raises(DataError) as err:
        ssd(weights=str(path))
    assert str(err.value).startswith(
        f"model.backbone_weights={path}: refused: it names posix.system, which"
    )
    assert "nothing in it ran" in str(err.value) and not planted.exists()


# -- Faster R-CNN ----------------------------------------------------------------------------------
def test_rpn_ignores_anchors_that_cross_the_image_border() -> None:
    m = frcnn()
    m.rpn._image_sizes = [(100, 100)]
    anchors = torch.tensor(
        [
            [10.0, 10.0, 50.0, 50.0],
            [-5.0, 10.0, 40.0, 50.0],
            [60.0, 60.0, 100.0, 100.0],
            [70, 70, 101, 90],
        ]
    )
    labels, _ = m.rpn.assign_targets_to_anchors([anchors], [one_box([10.0, 10.0, 50.0, 50.0])])
    # inside and matched: 1; crossing the border: -1 (ignored) even when it overlaps; far: 0
    assert labels[0].tolist() == [1.0, -1.0, 0.0, -1.0]


def test_fast_rcnn_loss_is_smooth_l1_with_sigma_one() -> None:
    logits = torch.zeros(2, 3)
    reg = torch.zeros(2, 12)
    labels = [torch.tensor([2, 0])]
    targets = [torch.tensor([[0.5, 2.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])]
    loss = fast_rcnn_loss(logits, reg, labels, targets)
    # |0.5| < 1: 0.5 * 0.5^2; |2| >= 1: 2 - 0.5; divided by 2 RoIs; the background RoI adds none
    assert float(loss["loss_bbox"]) == pytest.approx((0.125 + 1.5) / 2)
    assert float(loss["loss_cls"]) == pytest.approx(math.log(3))


def test_faster_rcnn_trains_and_detects_on_padded_variable_size_images() -> None:
    m = frcnn()
    x = torch.randn(2, 3, 160, 208)
    sizes = torch.tensor([[160, 208], [160, 180]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = m(x, sizes, [one_box([10.0, 10.0, 150.0, 150.0]), NO_BOX])
    assert set(losses) == {"loss_objectness", "loss_rpn_box_reg", "loss_cls", "loss_bbox"}
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values())
    assert losses["loss_rpn_box_reg"].item() > 0  # some 128 px anchors fit and match
    sum(losses.values()).backward()
    assert m.rpn.head.conv[0][0].weight.grad is not None and m.fc6.weight.grad is not None
    m.eval()
    with torch.no_grad():
        m.roi_heads.score_thresh = 0.0  # an untrained head scores about 1/21 everywhere
        dets = m(x, sizes)
    assert len(dets) == 2 and len(dets[1]["boxes"]) > 0
    assert (dets[1]["boxes"][:, 2] <= 180).all()  # clipped to the unpadded image


def test_rpn_loss_is_zero_not_nan_when_no_anchor_fits() -> None:
    m = frcnn()  # 96 px: every anchor (128 px and up) crosses the border
    losses = m(
        torch.randn(1, 3, 96, 96), torch.tensor([[96, 96]]), [one_box([5.0, 5.0, 50.0, 50.0])]
    )
    assert losses["loss_objectness"].item() == 0.0 == losses["loss_rpn_box_reg"].item()
    assert torch.isfinite(losses["loss_cls"])
