"""PASCAL VOC reading (mpt_repro/data/voc.py), the detection transforms and the synthetic
detection data, on a tiny VOC-format data set written by the tests themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from mpt_repro.data import detection_transforms as T
from mpt_repro.data.voc import VOC_CLASSES, DetectionDataset, read_split, voc_annotations
from mpt_repro.errors import DataError

XML = """<annotation>
  <filename>{id}.jpg</filename>
  <size><width>{w}</width><height>{h}</height><depth>3</depth></size>
{objects}
</annotation>"""
OBJECT = """  <object><name>{name}</name><difficult>{difficult}</difficult>
    <bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox>
  </object>"""


def write_image(path: Path, w: int, h: int, colour=(120, 30, 200)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (w, h), colour).save(path, "JPEG")


def write_voc(root: Path, year: str, split: str, images: dict[str, tuple]) -> None:
    """images: id -> (w, h, [(name, difficult, x1, y1, x2, y2), ...]) (1-based, as VOC)."""
    base = root / f"VOC{year}"
    (base / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
    (base / "Annotations").mkdir(parents=True, exist_ok=True)
    with open(base / "ImageSets" / "Main" / f"{split}.txt", "a") as f:
        for image_id, (w, h, objects) in images.items():
            f.write(f"{image_id}\n")
            objs = "\n".join(
                OBJECT.format(name=n, difficult=int(d), x1=a, y1=b, x2=c, y2=e)
                for n, d, a, b, c, e in objects
            )
            (base / "Annotations" / f"{image_id}.xml").write_text(
                XML.format(id=image_id, w=w, h=h, objects=objs)
            )
            write_image(base / "JPEGImages" / f"{image_id}.jpg", w, h)


@pytest.fixture
def voc(tmp_path: Path) -> Path:
    write_voc(
        tmp_path,
        "2007",
        "trainval",
        {
            "000005": (64, 48, [("chair", False, 1, 1, 10, 20), ("dog", True, 20, 5, 60, 40)]),
            "000007": (40, 50, [("car", False, 5, 6, 30, 45)]),
        },
    )
    write_voc(tmp_path, "2007", "test", {"000001": (50, 40, [("person", False, 2, 3, 49, 40)])})
    write_voc(tmp_path, "2012", "trainval", {"2008_000002": (30, 30, [("cat", False, 3, 3, 9, 9)])})
    return tmp_path


def test_annotations_become_continuous_boxes_with_labels_and_difficult(voc: Path) -> None:
    anns = read_split(str(voc), "2007/trainval")
    assert [a.image_id for a in anns] == ["2007/000005", "2007/000007"]
    a = anns[0]
    assert (a.width, a.height) == (64, 48)
    # 1-based inclusive (1, 1, 10, 20) -> continuous (0, 0, 10, 20): 10 pixels wide, as the devkit
    assert a.boxes.tolist() == [[0, 0, 10, 20], [19, 4, 60, 40]]
    assert a.labels.tolist() == [VOC_CLASSES.index("chair") + 1, VOC_CLASSES.index("dog") + 1]
    assert a.difficult.tolist() == [False, True]
    assert a.target(keep_difficult=False)["labels"].tolist() == [VOC_CLASSES.index("chair") + 1]


def test_splits_of_both_years_concatenate(voc: Path) -> None:
    anns = voc_annotations(str(voc), ["2007/trainval", "2012/trainval"])
    assert [a.image_id for a in anns] == ["2007/000005", "2007/000007", "2012/2008_000002"]


def test_dataset_reads_images_and_keeps_the_ground_truth_for_evaluation(voc: Path) -> None:
    ds = DetectionDataset(read_split(str(voc), "2007/trainval"), None, keep_difficult=False)
    img, target = ds[0]
    assert img.shape == (3, 48, 64) and target["boxes"].shape == (1, 4)
    assert int(target["index"]) == 0
    assert ds.ground_truth(0)["difficult"].tolist() == [False, True]  # evaluation sees all


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("no_root", "does not exist"),
        ("no_year", "no VOC2012/ folder"),
        ("no_split_file", "split file"),
        ("missing_xml", "000007.xml is missing"),
        ("corrupt_xml", "cannot parse annotation"),
        ("unknown_class", "unknown class 'unicorn'"),
        ("bad_number", "000007.xml"),
    ],
)
def test_broken_layouts_name_the_file_and_what_to_do(voc: Path, breakage: str, message: str):
    ann_dir = voc / "VOC2007" / "Annotations"
    splits = ["2007/trainval", "2012/trainval"]
    root = voc
    if breakage == "no_root":
        root = voc / "nowhere"
    elif breakage == "no_year":
        import shutil

        shutil.rmtree(voc / "VOC2012")
    elif breakage == "no_split_file":
        (voc / "VOC2007" / "ImageSets" / "Main" / "trainval.txt").unlink()
    elif breakage == "missing_xml":
        (ann_dir / "000007.xml").unlink()
    elif breakage == "corrupt_xml":
        (ann_dir / "000007.xml").write_text("<annotation><size>")
    elif breakage == "unknown_class":
        text = (ann_dir / "000007.xml").read_text().replace(">car<", ">unicorn<")
        (ann_dir / "000007.xml").write_text(text)
    elif breakage == "bad_number":
        text = (ann_dir / "000007.xml").read_text().replace("<xmin>5<", "<xmin>five<")
        (ann_dir / "000007.xml").write_text(text)
    with pytest.raises(DataError, match=message):
        voc_annotations(str(root), splits)


@pytest.mark.parametrize(
    ("box", "problem"),
    [
        ((0, 5, 30, 40), "xmin or ymin below 1"),  # the devkit's first pixel is (1, 1)
        ((20, -3, 60, 40), "xmin or ymin below 1"),
        ((20, 5, 65, 40), "xmax > 64 or ymax > 48"),  # one pixel past a 64-wide image
        ((20, 5, 60, 49), "xmax > 64 or ymax > 48"),
        ((70, 60, 90, 80), "past the image's edge"),  # wholly outside
        ((20, 5, 20, 40), "no area"),  # xmin = xmax
        ((20, 40, 60, 40), "no area"),  # ymin = ymax
        ((60, 5, 20, 40), "no area"),  # xmax < xmin
        (("nan", 5, 60, 40), "not a number"),
    ],
)
def test_a_box_outside_its_image_or_without_area_is_refused_naming_file_and_object(
    tmp_path: Path, box: tuple, problem: str
) -> None:
    objects = [("chair", False, 1, 1, 10, 20), ("dog", False, *box)]
    write_voc(tmp_path, "2007", "trainval", {"000005": (64, 48, objects)})
    with pytest.raises(DataError) as err:
        voc_annotations(str(tmp_path), ["2007/trainval"])
    message = str(err.value)
    assert "VOC2007/Annotations/000005.xml: object 2 (dog)" in message
    assert problem in message and "in a 64x48 image" in message
    assert "fix or remove this object in the XML" in message and "\n" not in message


def test_mpt_run_with_a_box_outside_its_image_exits_2_with_one_line(tmp_path: Path) -> None:
    from conftest import run_cli

    objects = [("dog", False, 20, 5, 65, 40)]  # one pixel past the 64-pixel-wide image
    for year, split in (("2007", "trainval"), ("2012", "trainval"), ("2007", "test")):
        write_voc(tmp_path / "voc", year, split, {f"{year}{split}": (64, 48, objects)})
    run_dir = tmp_path / "run"
    proc = run_cli(
        "experiment=ssd",
        "budget=smoke",
        f"data.root={tmp_path / 'voc'}",
        run_dir=run_dir,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run:")]
    assert "2007trainval.xml: object 1 (dog)" in line and "xmax > 64" in line


def test_boxes_on_the_image_edges_are_inside(tmp_path: Path) -> None:
    # the whole image, and a box two pixels wide in the last column pair
    objects = [("chair", False, 1, 1, 64, 48), ("dog", False, 63, 47, 64, 48)]
    write_voc(tmp_path, "2007", "trainval", {"000005": (64, 48, objects)})
    (ann,) = voc_annotations(str(tmp_path), ["2007/trainval"])
    assert ann.boxes.tolist() == [[0, 0, 64, 48], [62, 46, 64, 48]]


def test_a_size_without_pixels_is_refused(tmp_path: Path) -> None:
    write_voc(tmp_path, "2007", "trainval", {"000005": (64, 48, [])})
    xml = tmp_path / "VOC2007" / "Annotations" / "000005.xml"
    xml.write_text(xml.read_text().replace("<width>64<", "<width>0<"))
    with pytest.raises(DataError, match="000005.xml: <size> says 0x48 pixels"):
        voc_annotations(str(tmp_path), ["2007/trainval"])


def test_a_corrupt_or_resized_image_names_the_file(voc: Path) -> None:
    ds = DetectionDataset(read_split(str(voc), "2007/trainval"), None)
    jpg = voc / "VOC2007" / "JPEGImages" / "000007.jpg"
    jpg.write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match="cannot read image .*000007.jpg"):
        ds[1]
    write_image(jpg, 41, 50)  # one pixel wider than the XML says
    with pytest.raises(DataError, match="000007.jpg is 41x50 but its annotation says 40x50"):
        ds[1]


# -- transforms --------------------------------------------------------------------------------
def target(boxes, labels=None):
    b = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    n = len(b)
    return {
        "boxes": b,
        "labels": torch.tensor(labels or [1] * n),
        "difficult": torch.zeros(n, dtype=torch.bool),
    }


def marked_image(h: int, w: int, box: list[int]) -> torch.Tensor:
    """Black image with a white rectangle at box (continuous x1, y1, x2, y2)."""
    img = torch.zeros(3, h, w)
    x1, y1, x2, y2 = box
    img[:, y1:y2, x1:x2] = 255.0
    return img


def white_extent(img: torch.Tensor) -> list[float]:
    """(x1, y1, x2, y2) of the pixels brighter than half (continuous coordinates)."""
    ys, xs = torch.nonzero(img.mean(0) > 127.5, as_tuple=True)
    return [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]


def test_flip_and_expand_move_boxes_with_the_pixels() -> None:
    box = [4, 6, 14, 20]
    img, t = T.hflip(marked_image(30, 40, box), target([box]))
    assert t["boxes"][0].tolist() == white_extent(img) == [26, 6, 36, 20]
    torch.manual_seed(0)
    img, t = T.expand(marked_image(30, 40, box), target([box]), fill=(0, 0, 0))
    assert img.shape[1] >= 30 and img.shape[2] >= 40
    assert t["boxes"][0].tolist() == white_extent(img)


def test_iou_crop_keeps_boxes_whose_centre_is_inside_and_clips_them() -> None:
    boxes = [[2, 2, 22, 22], [60, 60, 90, 90], [30, 5, 50, 25]]
    img = torch.zeros(3, 100, 100)
    for b in boxes:
        img[:, b[1] : b[3], b[0] : b[2]] = 255.0
    seen_crop = False
    for seed in range(40):
        torch.manual_seed(seed)
        out, t = T.iou_crop(img, target(boxes, [1, 2, 3]))
        if out.shape[-2:] == (100, 100):
            assert t["labels"].tolist() == [1, 2, 3]
            continue
        seen_crop = True
        h, w = out.shape[-2:]
        b = t["boxes"]
        assert (b[:, 0] >= 0).all() and (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
        for box in b.tolist():  # each kept box still covers white pixels of its object
            x1, y1, x2, y2 = (int(round(v)) for v in box)
            assert out[:, y1:y2, x1:x2].mean() > 127
    assert seen_crop


def test_ssd_training_transform_gives_a_normalised_300px_image_with_boxes_inside() -> None:
    tf = T.build_detection_transform("ssd", "warp", 300, None, train=True)
    for seed in range(5):
        torch.manual_seed(seed)
        img, t = tf(
            torch.randint(0, 256, (3, 60, 80), dtype=torch.uint8), target([[10, 10, 50, 40]])
        )
        assert img.shape == (3, 300, 300) and img.abs().max() < 3.0  # ImageNet-normalised
        b = t["boxes"]
        assert (b >= 0).all() and (b <= 300).all() and (b[:, 2:] >= b[:, :2]).all()


def test_eval_transforms_record_the_scale_back_to_the_original() -> None:
    img = torch.zeros(3, 375, 500, dtype=torch.uint8)
    box = [[50, 75, 250, 300]]
    out, t = T.build_detection_transform("ssd", "warp", 300, None, train=False)(img, target(box))
    assert out.shape == (3, 300, 300) and t["scale"].tolist() == pytest.approx([0.6, 0.8])
    assert (t["boxes"] / t["scale"].repeat(2)).tolist() == [pytest.approx(b) for b in box]
    # Faster R-CNN: shorter side 600 unless the longer would pass 1000
    out, t = T.build_detection_transform("flip", "shorter_side", 600, 1000, train=False)(
        img, target(box)
    )
    assert out.shape == (3, 600, 800) and t["scale"].tolist() == pytest.approx([1.6, 1.6])
    wide = torch.zeros(3, 200, 500, dtype=torch.uint8)
    out, _ = T.build_detection_transform("flip", "shorter_side", 600, 1000, train=False)(
        wide, target(box)
    )
    assert out.shape == (3, 400, 1000)


def test_photometric_distortion_stays_in_range_and_changes_the_image() -> None:
    img = torch.rand(3, 20, 20) * 255
    changed = False
    for seed in range(8):
        torch.manual_seed(seed)
        out = T.photometric_distort(img)
        assert out.min() >= 0 and out.max() <= 255
        changed |= not torch.allclose(out, img)
    assert changed


def test_hsv_round_trip() -> None:
    img = torch.rand(3, 8, 8)
    assert torch.allclose(T.hsv_to_rgb(T.rgb_to_hsv(img)), img, atol=1e-5)
    red = torch.tensor([1.0, 0.0, 0.0]).view(3, 1, 1)
    hsv = T.rgb_to_hsv(red)
    hsv[0] = (hsv[0] + 1 / 3) % 1.0  # +120 degrees: red -> green
    assert torch.allclose(T.hsv_to_rgb(hsv).flatten(), torch.tensor([0.0, 1.0, 0.0]), atol=1e-6)


def test_collate_pads_variable_sizes_and_keeps_targets_apart() -> None:
    a, b = torch.ones(3, 4, 6), torch.ones(3, 5, 3)
    images, sizes, targets = T.detection_collate([(a, target([[0, 0, 1, 1]])), (b, target([]))])
    assert images.shape == (2, 3, 5, 6) and sizes.tolist() == [[4, 6], [5, 3]]
    assert images[0, :, 4:].abs().sum() == 0 and images[1, :, :, 3:].abs().sum() == 0
    assert [len(t["boxes"]) for t in targets] == [1, 0]


def test_synthetic_detection_data_is_deterministic_and_draws_its_boxes() -> None:
    from mpt_repro.data.detection import SyntheticDetection

    ds = SyntheticDetection(3, 64, 5, seed=1, transform=None)
    img, t = ds[2]
    img2, _ = SyntheticDetection(3, 64, 5, seed=1, transform=None)[2]
    assert torch.equal(img, img2)
    x1, y1, x2, y2 = t["boxes"][-1].long().tolist()  # the last-drawn box is fully visible
    colour = ds.colours[int(t["labels"][-1])]
    assert (img[:, y1:y2, x1:x2] == colour.view(3, 1, 1)).all()
