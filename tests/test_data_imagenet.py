"""The ImageNet ImageFolder pipeline on a tiny tree of real image files written with PIL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import option_config
from PIL import Image
from torch.utils.data import DataLoader

from mpt_repro.data import build_image_data
from mpt_repro.errors import DataError

CLASSES = ["n01440764", "n01443537", "n01484850"]
GREEN, RED = (0, 200, 0), (200, 0, 0)


def write_image(path: Path, size=(120, 40), fmt="JPEG") -> None:
    """A wide image: outer thirds green, middle third red (tells the recipes' crops apart)."""
    w, h = size
    img = Image.new("RGB", size, GREEN)
    img.paste(Image.new("RGB", (w // 3, h), RED), (w // 3, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, fmt)


def make_tree(root: Path, n_train=4, n_val=2, classes=CLASSES) -> Path:
    for split, n in (("train", n_train), ("val", n_val)):
        for c in classes:
            for i in range(n):
                # Mixed formats and sizes, as in the real data set.
                if i % 2:
                    write_image(root / split / c / f"{c}_{i}.PNG", size=(50, 70), fmt="PNG")
                else:
                    write_image(root / split / c / f"{c}_{i}.JPEG")
    return root


def data_cfg(root, **kw):
    base = dict(
        name="imagenet",
        root=str(root) if root is not None else None,
        num_classes=3,
        channels=3,
        image_size=32,
        resize_size=36,
        augmentation="caffe",
    )
    base.update(kw)
    return option_config("data", **base)


@pytest.fixture
def tree(tmp_path) -> Path:
    return make_tree(tmp_path / "imagenet")


@pytest.mark.parametrize("augmentation", ["caffe", "torchvision", "inception", "none"])
def test_shapes_labels_and_normalisation(tree, augmentation):
    data = build_image_data(data_cfg(tree, augmentation=augmentation))
    assert (len(data.train), len(data.eval), data.num_classes, data.channels) == (12, 6, 3, 3)
    for ds in (data.train, data.eval):
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.shape == (3, 32, 32) and x.dtype == torch.float32
            # The label is the class folder the file sits in.
            assert CLASSES[y] in ds.samples[i][0]
            # what the task's loaders read: the same crop as uint8 (normalised on the device)
            if augmentation in ("caffe", "none"):  # deterministic crops
                raw, _ = ds.load_uint8(i)
                assert raw.dtype == torch.uint8 and raw.shape == (3, 32, 32)
    x, _ = data.eval[0]
    assert x.min() < 0  # mean/std normalised, not [0, 1]
    batch_x, batch_y = next(iter(DataLoader(data.train, batch_size=4)))
    assert batch_x.shape == (4, 3, 32, 32) and batch_y.dtype == torch.int64


def test_task_loaders_hand_out_normalised_device_batches(tree):
    """Through build_epoch_loaders (what the tasks use) the uint8 batches arrive normalised with
    ImageNet's mean and std, in the dtype and memory format asked for."""
    from mpt_repro.data.imagenet import IMAGENET_MEAN, IMAGENET_STD
    from mpt_repro.data.sampling import build_epoch_loaders

    d = data_cfg(tree, augmentation="none")
    data = build_image_data(d)
    loaders = build_epoch_loaders(data.train, data.eval, d, 4, 0, torch.device("cpu"))
    loaders.sampler.set_epoch(0)
    x, y = next(iter(loaders.train))
    assert x.dtype == torch.float32 and x.shape == (4, 3, 32, 32) and y.dtype == torch.int64
    raw = torch.stack([data.train.load_uint8(i)[0] for i in list(loaders.sampler)[:4]])
    mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
    expect = (raw.float() / 255 - mean[:, None, None]) / std[:, None, None]
    torch.testing.assert_close(x, expect, rtol=0, atol=1e-5)
    # and what indexing the data set gives (ToTensor + Normalize) is the same
    first = list(loaders.sampler)[0]
    torch.testing.assert_close(data.train[first][0], expect[0], rtol=0, atol=1e-5)
    half = build_epoch_loaders(
        data.train,
        data.eval,
        d,
        4,
        0,
        torch.device("cpu"),
        input_dtype=torch.float16,
        memory_format=torch.channels_last,
    )
    xe, _ = next(iter(half.eval))
    assert xe.dtype == torch.float16 and xe.is_contiguous(memory_format=torch.channels_last)


def test_classes_are_interleaved_so_limits_cover_every_class(tree):
    data = build_image_data(data_cfg(tree, train_limit=6, eval_limit=3))
    assert [data.train[i][1] for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert sorted(data.eval[i][1] for i in range(3)) == [0, 1, 2]


def test_validation_crop_follows_the_recipe(tmp_path):
    """Caffe squashes to resize x resize (the crop sees the green sides); torchvision resizes the
    shorter side (a centre crop of the wide image is all red)."""
    root = make_tree(tmp_path / "wide", n_train=1, n_val=1)  # index 0 of each class: the wide JPEG

    def red_fraction(aug: str) -> float:
        x, _ = build_image_data(data_cfg(root, augmentation=aug)).eval[0]
        std, mean = torch.tensor([0.229, 0.224, 0.225]), torch.tensor([0.485, 0.456, 0.406])
        rgb = x * std[:, None, None] + mean[:, None, None]
        return float((rgb[0] > rgb[1]).float().mean())

    assert red_fraction("torchvision") > 0.95
    assert red_fraction("caffe") < 0.6


def test_training_augmentation_is_random(tree):
    data = build_image_data(data_cfg(tree, augmentation="torchvision"))
    torch.manual_seed(0)
    crops = [data.train[0][0] for _ in range(4)]
    assert any(not torch.equal(crops[0], c) for c in crops[1:])
    assert torch.equal(data.eval[0][0], data.eval[0][0])  # validation is deterministic


def test_corrupt_image_names_the_file(tree):
    bad = tree / "train" / CLASSES[1] / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    data = build_image_data(data_cfg(tree))
    index = [p for p, _ in data.train.samples].index(str(bad))
    with pytest.raises(DataError, match="broken.JPEG"):
        data.train[index]
    # Through a worker process the DataLoader re-raises it with the same type and the file name.
    loader = DataLoader(torch.utils.data.Subset(data.train, [index]), batch_size=1, num_workers=1)
    with pytest.raises(DataError, match="broken.JPEG"):
        next(iter(loader))


def test_truncated_jpeg_names_the_file(tree):
    path = tree / "val" / CLASSES[0] / f"{CLASSES[0]}_0.JPEG"
    path.write_bytes(path.read_bytes()[:200])
    data = build_image_data(data_cfg(tree))
    index = [p for p, _ in data.eval.samples].index(str(path))
    with pytest.raises(DataError, match=f"{CLASSES[0]}_0.JPEG"):
        data.eval[index]


def test_missing_root(tmp_path):
    with pytest.raises(DataError, match="data.root is not set.*data=synthetic"):
        build_image_data(data_cfg(None))
    with pytest.raises(DataError, match="does not exist"):
        build_image_data(data_cfg(tmp_path / "nowhere"))


def test_missing_split(tree):
    import shutil

    shutil.rmtree(tree / "val")
    with pytest.raises(DataError, match="no val/ folder"):
        build_image_data(data_cfg(tree))


def test_empty_split(tree):
    import shutil

    shutil.rmtree(tree / "train")
    (tree / "train").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        build_image_data(data_cfg(tree))


def test_flat_val_folder_is_explained(tree):
    import shutil

    shutil.rmtree(tree / "val")
    write_image(tree / "val" / "ILSVRC2012_val_00000001.JPEG")  # the official flat layout
    with pytest.raises(DataError, match="flat"):
        build_image_data(data_cfg(tree))


def test_empty_class_folder(tree):
    (tree / "train" / "n99999999").mkdir()
    with pytest.raises(DataError, match="n99999999"):
        build_image_data(data_cfg(tree))


def test_mismatched_classes(tree):
    write_image(tree / "train" / "n02000000" / "x.JPEG")
    with pytest.raises(DataError, match="different class folders.*n02000000"):
        build_image_data(data_cfg(tree))


def test_resize_smaller_than_crop_is_refused(tree):
    with pytest.raises(DataError, match="resize_size"):
        build_image_data(data_cfg(tree, image_size=64, resize_size=48))


def test_default_resize_ratio():
    from mpt_repro.data.imagenet import default_resize

    assert default_resize(224) == 256 and default_resize(299) == 342
