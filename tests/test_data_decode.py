"""data.decode=gpu: files read by the workers, decoded and cropped on the device. The pipeline is
exercised here with the CPU as its device (the same code; nvJPEG itself needs a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from mpt_repro.data.imagenet import (
    DeviceDecode,
    collate_raw,
    geometric_transforms,
    open_split,
)
from mpt_repro.errors import ConfigError, DataError

CPU = torch.device("cpu")


def tree(root: Path) -> Path:
    for k, c in enumerate(("a", "b")):
        for i in range(3):
            img = Image.new("RGB", (30 + 10 * i, 24), (90 * k, 40 * i, 60))
            img.paste(Image.new("RGB", (8, 24), (250, 250, 250)), (10, 0))
            (root / c).mkdir(parents=True, exist_ok=True)
            img.save(root / c / f"{i}.JPEG", "JPEG")
    # ImageNet's oddity: a PNG file named .JPEG (nvJPEG refuses it, PIL reads it)
    Image.new("RGB", (20, 20), (1, 2, 3)).save(root / "b" / "png_in_disguise.JPEG", "PNG")
    return root


def decoded(root: Path, on_corrupt: str = "fail"):
    _, val = geometric_transforms("none", 16, 20)
    folder = open_split(str(root), None, val, on_corrupt=on_corrupt)
    batch = collate_raw([folder.load_raw(i) for i in range(len(folder))])
    decode = folder.device_decode(CPU, torch.float32, torch.contiguous_format)
    assert isinstance(decode, DeviceDecode)
    return folder, decode(batch)


def test_device_decode_matches_the_worker_path(tmp_path):
    root = tree(tmp_path / "d")
    folder, (x, y) = decoded(root)
    assert x.shape == (len(folder), 3, 16, 16) and x.dtype == torch.float32
    assert y.tolist() == [t for _, t in folder.samples]
    # the worker path: PIL decode and crop, normalised (ds[i])
    for i in range(len(folder)):
        ref = folder[i][0]
        # the same JPEG decoder; tensor and PIL resizing differ by a few grey levels at most
        assert (x[i] - ref).abs().mean() < 0.05, folder.samples[i][0]


def test_a_file_nvjpeg_cannot_read_falls_back_to_pil_and_a_corrupt_one_fails(tmp_path):
    root = tree(tmp_path / "d")
    folder, (x, _) = decoded(root)
    k = [p for p, _ in folder.samples].index(str(root / "b" / "png_in_disguise.JPEG"))
    assert torch.isfinite(x[k]).all()
    (root / "a" / "1.JPEG").write_bytes(b"\xff\xd8\xff broken")
    with pytest.raises(DataError, match="1.JPEG.*on_corrupt=skip"):
        decoded(root)
    folder, (x, _) = decoded(root, on_corrupt="skip")
    assert x.shape[0] == len(folder)  # the bad file's place goes to another image


def test_decode_gpu_without_a_gpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")

    from conftest import option_config

    from mpt_repro.data import build_image_data

    cfg = option_config("data", name="imagenet", root="/", decode="gpu")
    with pytest.raises(ConfigError, match="data.decode=cpu"):
        build_image_data(cfg)
