"""CIFAR-10 in the python-pickle layout its tarball unpacks to, read from small batches the test
writes (the real layout, a few images per batch), and experiment=cifar10 through mpt-run."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import option_config, read_run, run_cli

from mpt_repro.data import build_image_data
from mpt_repro.data.cifar import LAYOUT, MEAN, STD, TRAIN_FILES
from mpt_repro.errors import DataError

PER_BATCH = 6


def write_cifar(root: Path) -> Path:
    """cifar-10-batches-py/ with data_batch_1..5 and test_batch of PER_BATCH images each, as
    the official pickles hold them: b"data" N x 3072 uint8 (R, G, B planes), b"labels"."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k, name in enumerate([*TRAIN_FILES, "test_batch"]):
        data = rng.integers(0, 256, (PER_BATCH, 3072), dtype=np.uint8)
        data[:, 0] = k  # the first red pixel names the batch
        labels = [(k + i) % 10 for i in range(PER_BATCH)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": name.encode()}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"class{i}".encode() for i in range(10)]}, f)
    return folder


def cifar_cfg(root: Path, **fields):
    return option_config("data", name="cifar10", root=str(root), channels=3, image_size=32,
                         num_classes=10, **fields)  # fmt: skip


@pytest.mark.parametrize("point_at", ["parent", "folder"])
def test_the_pickled_batches_read_as_the_tarball_lays_them_out(tmp_path, point_at) -> None:
    folder = write_cifar(tmp_path)
    data = build_image_data(cifar_cfg(tmp_path if point_at == "parent" else folder))
    assert (len(data.train), len(data.eval)) == (5 * PER_BATCH, PER_BATCH)
    assert (data.num_classes, data.channels) == (10, 3)
    x, y = data.train.load_uint8(PER_BATCH)  # the first image of data_batch_2
    assert x.shape == (3, 32, 32) and x.dtype == torch.uint8 and int(x[0, 0, 0]) == 1
    assert y == 1
    with open(folder / "data_batch_2", "rb") as f:
        raw = pickle.load(f, encoding="bytes")[b"data"][0]
    assert torch.equal(x.flatten(), torch.as_tensor(raw))  # planes R, G, B, each row-major
    image, label = data.eval[0]  # the normalised float image
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    expected = (data.eval.load_uint8(0)[0].float() / 255 - mean) / std
    assert torch.allclose(image, expected, atol=1e-6) and label == 5


def test_the_cifar_augmentation_pads_crops_and_flips(tmp_path) -> None:
    data = build_image_data(cifar_cfg(write_cifar(tmp_path), augmentation="cifar"))
    torch.manual_seed(0)
    views = {data.train.load_uint8(0)[0].sum().item() for _ in range(20)}
    assert len(views) > 1  # random crops and flips of one image
    assert data.eval.load_uint8(0)[0].equal(data.eval.images[0])  # evaluation: as it is


def test_a_missing_or_broken_folder_names_the_layout(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        build_image_data(cifar_cfg(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="missing under it: data_batch_1"):
        build_image_data(cifar_cfg(tmp_path))
    folder = write_cifar(tmp_path / "d")
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="data_batch_3: not a CIFAR-10 python batch"):
        build_image_data(cifar_cfg(folder))


@pytest.mark.parametrize(
    "data,precision",
    [
        pytest.param("real", "fp32", marks=pytest.mark.slow),  # ResNet-50: a minute
        # FP16 arithmetic is 10-100x slower on a CPU: a ResNet-50 smoke run takes a minute or two
        pytest.param("real", "mixed", marks=pytest.mark.slow),
        pytest.param("synthetic", "mixed", marks=pytest.mark.slow),
    ],
)
def test_experiment_cifar10_smoke_runs_under_mpt_run(tmp_path, data, precision) -> None:
    args = ["experiment=cifar10", "budget=smoke", f"precision={precision}", "trainer.device=cpu"]
    if data == "real":
        args.append(f"data.root={write_cifar(tmp_path / 'cifar')}")
    else:
        args.append("data=synthetic")
    run_cli(*args, run_dir=tmp_path / "run")
    record = read_run(tmp_path / "run")
    assert record["status"] == "completed" and "top1" in record["metrics"]
    assert (
        record["model"]["variant"] == "torchvision" and record["config"]["optim"]["name"] == "adam"
    )


def test_mpt_run_refuses_an_empty_test_batch(tmp_path) -> None:
    """An empty test_batch (it gave loss 0.0, top-1 0.0 and a `completed` run): refused while
    the data loads, one line naming the file, exit 2, the run directory not created."""
    folder = write_cifar(tmp_path / "cifar")
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((0, 3072), np.uint8), b"labels": []}, f)
    proc = run_cli("experiment=cifar10", "budget=smoke", "trainer.device=cpu",
                   f"data.root={folder}", run_dir=tmp_path / "run", check=False,
                   env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run: error:")]
    assert errors == [
        f"mpt-run: error: {folder / 'test_batch'} holds no image (0 rows of b'data'), so there "
        f"is nothing to evaluate; unpack cifar-10-python.tar.gz again. Expected {LAYOUT}"
    ]
    assert not (tmp_path / "run").exists()


# -- issue 34: a batch is checked while it loads, and runs no code -------------------------------
class _Planted:
    """What a crafted batch holds: unpickling it calls os.system (a full unpickle ran it)."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.target}",))


def _refused(tmp_path: Path, folder: Path, name: str) -> str:
    proc = run_cli("experiment=cifar10", "budget=smoke", "trainer.device=cpu",
                   f"data.root={folder}", run_dir=tmp_path / "run", check=False,
                   env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run:")]
    assert line.startswith(f"mpt-run: error: {folder / name}: "), line
    assert not (tmp_path / "run").exists()
    return line


def test_a_crafted_batch_runs_no_code_and_is_refused_naming_the_file(tmp_path) -> None:
    folder = write_cifar(tmp_path / "cifar")
    planted = tmp_path / "planted"
    data = np.zeros((PER_BATCH, 3072), np.uint8)
    with open(folder / "data_batch_4", "wb") as f:
        pickle.dump({b"data": data, b"labels": [0] * PER_BATCH, b"x": _Planted(planted)}, f)
    line = _refused(tmp_path, folder, "data_batch_4")
    assert "refused: it names posix.system, which a CIFAR-10 batch never holds" in line
    assert "nothing in it ran" in line
    assert not planted.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_every_pickle_protocol_of_a_real_batch_still_reads(tmp_path, protocol) -> None:
    folder = write_cifar(tmp_path)
    data = np.arange(PER_BATCH * 3072).reshape(PER_BATCH, 3072).astype(np.uint8)
    with open(folder / "test_batch", "wb") as f:
        batch = {b"data": data, b"labels": list(range(PER_BATCH)), b"filenames": [b"a.png"]}
        pickle.dump(batch, f, protocol=protocol)
    loaded = build_image_data(cifar_cfg(folder))
    assert torch.equal(loaded.eval.images.flatten(1), torch.from_numpy(data))


@pytest.mark.parametrize("name", ["data_batch_2", "test_batch"])
def test_a_label_out_of_range_is_refused_while_the_data_loads(tmp_path, name) -> None:
    """It failed mid-run with a bare IndexError, or after the whole training (test_batch)."""
    folder = write_cifar(tmp_path / "cifar")
    labels = [0, 1, 10, 3, -1, 5]
    with open(folder / name, "wb") as f:
        pickle.dump({b"data": np.zeros((PER_BATCH, 3072), np.uint8), b"labels": labels}, f)
    line = _refused(tmp_path, folder, name)
    assert "label 10 of image 2 is outside 0..9 (2 such labels); CIFAR-10 has 10 classes" in line


def test_float_pixels_are_refused_not_cast(tmp_path) -> None:
    """Floats up to 1e6 were cast to uint8 silently (wrapping)."""
    folder = write_cifar(tmp_path / "cifar")
    data = np.full((PER_BATCH, 3072), 1e6)
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump({b"data": data, b"labels": [0] * PER_BATCH}, f)
    line = _refused(tmp_path, folder, "data_batch_1")
    assert "b'data' holds float64 values, up to 1e+06, not uint8 pixels (0..255)" in line


def test_a_label_past_int64_is_refused_naming_the_file(tmp_path) -> None:
    from mpt_repro.data.cifar import read_batch
    from mpt_repro.errors import DataError

    path = tmp_path / "data_batch_1"
    with open(path, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [2**70, 1]}, f)
    with pytest.raises(DataError, match=rf"^{path}: a label is too large for an integer"):
        read_batch(path)
