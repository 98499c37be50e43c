"""data=imagefolder: any ImageFolder data set, loaded with the ImageNet code; class count from the
folders. Tiny trees of real image files written with PIL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import build_task, compose, run_cli
from PIL import Image

from mpt_repro.data import build_image_data
from mpt_repro.errors import DataError

FLOWERS = ["daisy", "rose", "tulip"]


def write(path: Path, colour: tuple[int, int, int], size=(24, 18)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, "JPEG" if path.suffix == ".jpg" else "PNG")


def flat_tree(root: Path, per_class: int = 10) -> Path:
    """root/<class>/*: no split folders (every holdout_every-th image is held out)."""
    for k, c in enumerate(FLOWERS):
        for i in range(per_class):
            ext = ".png" if i % 3 == 0 else ".jpg"
            write(root / c / f"{c}{i:02d}{ext}", (80 * k, 10 * i, 50))
    return root


def split_tree(root: Path, eval_name: str = "valid") -> Path:
    for split, n in (("train", 4), (eval_name, 2)):
        for k, c in enumerate(FLOWERS):
            for i in range(n):
                write(root / split / c / f"{i}.jpg", (80 * k, 30, 30))
    return root


def cfg(root: Path, *extra: str):
    return compose(
        [
            "experiment=demo",
            "data=imagefolder",
            f"data.root={root}",
            "data.image_size=8",
            "data.resize_size=8",
            "data.num_workers=0",
            *extra,
        ]
    ).data


def test_flat_folder_holds_out_every_nth_image_of_each_class(tmp_path):
    root = flat_tree(tmp_path / "flowers")
    data = build_image_data(cfg(root, "data.holdout_every=5"))
    # the class count is the folders' (the demo experiment says 10): 3 flowers
    assert (data.num_classes, data.channels) == (3, 3)
    assert (len(data.train), len(data.eval)) == (24, 6)  # 2 of 10 per class held out
    held = {data.eval.dataset.samples[i][0] for i in data.eval.indices}
    used = {data.train.dataset.samples[i][0] for i in data.train.indices}
    assert not held & used and len(held | used) == 30
    for c in FLOWERS:  # every class is evaluated
        assert sum(f"/{c}/" in p for p in held) == 2
    x, y = data.train[0]
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and FLOWERS[y] == "daisy"
    assert "every 5th image of each class held out" in data.description


def test_train_and_valid_folders_are_the_splits(tmp_path):
    root = split_tree(tmp_path / "flowers", "valid")
    data = build_image_data(cfg(root))
    assert (len(data.train), len(data.eval), data.num_classes) == (12, 6, 3)
    assert "train/ and valid/" in data.description


def test_model_and_folder_class_counts_must_agree(tmp_path):
    root = split_tree(tmp_path / "flowers", "val")
    data = build_image_data(cfg(root))
    data.check_logits(torch.zeros(2, 3))
    with pytest.raises(DataError, match="outputs 1000 logits.*3 classes"):
        data.check_logits(torch.zeros(2, 1000))


def test_a_classification_task_trains_on_an_imagefolder(tmp_path, one_thread):
    """The demo CNN is built for the folder's 3 classes and steps on device-normalised batches."""
    root = flat_tree(tmp_path / "flowers")
    task, _ = build_task(
        "experiment=demo",
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=8",
        "data.resize_size=8",
        "data.num_workers=0",
        "data.batch_size=9",
    )
    assert task.data.num_classes == 3
    (batch,) = next(iter(task.train_batches(0)))  # one micro-batch per step
    assert batch[0].dtype == torch.float32 and batch[0].shape == (9, 3, 8, 8)
    result = task.train_step([batch])
    assert torch.isfinite(result.loss) and bool(result.stepped)
    task.data.check_logits(task.model(batch[0]))
    assert set(task.evaluate().metrics) == {"loss", "top1", "top5"}
    # code that indexes the data set itself (BN recalibration) gets normalised float samples
    task.recalibrate_bn(1)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda r: None, "data.root is not set"),
        (lambda r: r / "missing", "does not exist"),
        (lambda r: r.mkdir() or r, "no class folders"),
        (lambda r: flat_tree(r, per_class=3), "nothing is held out"),
    ],
)
def test_clear_errors(tmp_path, make, match):
    root = make(tmp_path / "data")
    extra = [] if root is not None else ["data.root=null"]
    c = cfg(root if root is not None else tmp_path, *extra, "data.holdout_every=5")
    with pytest.raises(DataError, match=match) as err:
        build_image_data(c)
    assert "imagefolder" in str(err.value) or "holdout_every" in str(err.value)


def test_one_class_is_not_a_classification_data_set(tmp_path):
    root = tmp_path / "one"
    for i in range(12):
        write(root / "only" / f"{i}.jpg", (10, 20, 30))
    with pytest.raises(DataError, match="at least 2"):
        build_image_data(cfg(root))


def test_mpt_run_refuses_an_empty_val_folder(tmp_path):
    """val/ empty, and val/ holding empty class folders: nothing to evaluate, refused while the
    data loads with one line naming the folder, exit 2, nothing written (one sweep)."""
    empty = split_tree(tmp_path / "empty", "val")
    hollow = split_tree(tmp_path / "hollow", "val")
    for root in (empty, hollow):
        for image in (root / "val").rglob("*.jpg"):
            image.unlink()
    for c in FLOWERS:
        (empty / "val" / c).rmdir()
    proc = run_cli("-m", "experiment=demo", "budget=smoke", "data=imagefolder",
                   f"data.root={empty},{hollow}", "data.image_size=8", "data.resize_size=8",
                   "trainer.device=cpu", f"paths.runs_dir={tmp_path / 'runs'}", check=False,
                   env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run: error:")]
    assert errors[0].startswith(
        f"mpt-run: error: {empty / 'val'} holds no class folders (it is empty or flat); "
        "data=imagefolder takes root/train/<class>/* with root/val/<class>/*"
    )
    assert errors[1].startswith(f"mpt-run: error: {hollow / 'val'}: Found no valid file")
    assert "Every class folder needs at least one image" in errors[1]
    assert not (tmp_path / "runs").exists()
