"""Bad data ends in one readable line: corrupt images (fail or skip), errors inside loader worker
processes, and corpus files that are not UTF-8. The tests write the bad files themselves."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import option_config
from PIL import Image

from mpt_repro.data import build_image_data
from mpt_repro.data.device import worker_error
from mpt_repro.data.sampling import build_epoch_loaders
from mpt_repro.errors import DataError

CLASSES = ["cats", "dogs"]


def tree(root: Path, n: int = 4) -> Path:
    for split in ("train", "val"):
        for k, c in enumerate(CLASSES):
            for i in range(n):
                path = root / split / c / f"{c}_{i}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (40, 30), (60 * k, 100, 20 * i)).save(path, "JPEG")
    return root


def cfg(root: Path, **kw):
    base = dict(
        name="imagenet",
        root=str(root),
        num_classes=2,
        channels=3,
        image_size=16,
        resize_size=20,
        augmentation="none",
    )
    base.update(kw)
    return option_config("data", **base)


def corrupt(path: Path) -> None:
    path.write_bytes(b"\xff\xd8\xff\xe0 not a JPEG at all")


def index_of(ds, path: Path) -> int:
    return [p for p, _ in ds.samples].index(str(path))


def test_corrupt_image_fails_by_default_naming_the_file_and_the_knob(tmp_path):
    root = tree(tmp_path / "d")
    bad = root / "train" / "dogs" / "dogs_2.jpg"
    corrupt(bad)
    data = build_image_data(cfg(root))
    with pytest.raises(DataError, match="dogs_2.jpg") as err:
        data.train[index_of(data.train, bad)]
    assert "data.on_corrupt=skip" in str(err.value)


def test_on_corrupt_skip_uses_the_next_image_and_warns_once(tmp_path, caplog):
    root = tree(tmp_path / "d")
    bad = root / "train" / "dogs" / "dogs_2.jpg"
    corrupt(bad)
    data = build_image_data(cfg(root, on_corrupt="skip"))
    i = index_of(data.train, bad)
    with caplog.at_level(logging.WARNING, logger="mpt_repro"):
        x, y = data.train[i]
        data.train[i]
    # the next sample in the (class-interleaved) order takes the bad file's place
    x_next, y_next = data.train[(i + 1) % len(data.train)]
    assert torch.equal(x, x_next) and y == y_next
    warned = [r for r in caplog.records if "dogs_2.jpg" in r.getMessage()]
    assert len(warned) == 1 and "skipping" in warned[0].getMessage()


def test_many_corrupt_images_in_a_row_still_fail(tmp_path):
    root = tree(tmp_path / "d")
    for p in (root / "train").rglob("*.jpg"):
        corrupt(p)
    data = build_image_data(cfg(root, on_corrupt="skip"))
    with pytest.raises(DataError, match="corrupt images in a row"):
        data.train[0]


def test_a_worker_error_arrives_as_one_line_naming_the_file(tmp_path):
    root = tree(tmp_path / "d")
    bad = root / "train" / "cats" / "cats_1.jpg"
    corrupt(bad)
    d = cfg(root, num_workers=1, train_limit=None)
    data = build_image_data(d)
    loaders = build_epoch_loaders(data.train, data.eval, d, 8, 0, torch.device("cpu"))
    loaders.sampler.set_epoch(0)
    with pytest.raises(DataError) as err:
        next(iter(loaders.train))
    message = str(err.value)
    assert "cats_1.jpg" in message and "worker" in message
    assert "Traceback" not in message and "\n" not in message
    # the worker's full traceback is kept as the cause (for the run's log and record)
    assert "Traceback" in str(err.value.__cause__)


class Exploding(torch.utils.data.Dataset):
    """A data set whose transform fails in a way no one planned for."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        raise ValueError(f"could not parse annotation of sample {i}")


def test_an_unexpected_worker_error_says_what_and_how_to_see_more():
    loader = torch.utils.data.DataLoader(Exploding(), batch_size=2, num_workers=1)
    with pytest.raises(ValueError) as raised:
        next(iter(loader))
    clean = worker_error(raised.value)
    assert isinstance(clean, DataError)
    text = str(clean)
    assert text.startswith("ValueError: could not parse annotation of sample 0")
    assert "data.num_workers=0" in text and "\n" not in text


def test_a_killed_worker_is_explained():
    e = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert "data.num_workers" in str(worker_error(e))
    assert worker_error(RuntimeError("something else")) is None


def test_a_file_error_inside_the_pipeline_names_the_file(tmp_path, monkeypatch):
    root = tree(tmp_path / "d")
    data = build_image_data(cfg(root))

    def broken(img):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(data.train, "geometric", broken)
    with pytest.raises(DataError, match=r"cats_0\.jpg: ZeroDivisionError"):
        data.train[0]


# -- corpora ------------------------------------------------------------------------------------
def write_corpus(root: Path, train: bytes) -> Path:
    root.mkdir(parents=True)
    (root / "train.txt").write_bytes(train)
    (root / "valid.txt").write_text("a b c\n")
    (root / "test.txt").write_text("a b\n")
    return root


def test_non_utf8_corpus_names_file_offset_line_and_fix(tmp_path):
    from mpt_repro.data.corpus import Corpus

    text = "in the beginning\nwas the w\xf6rd\n".encode("latin-1")  # ö as one latin-1 byte
    root = write_corpus(tmp_path / "c", text)
    with pytest.raises(DataError) as err:
        Corpus(str(root))
    message = str(err.value)
    offset = text.index(b"\xf6")
    assert str(root / "train.txt") in message
    assert f"byte 0xf6 at byte offset {offset} (line 2, column 10)" in message
    assert "iconv" in message


def test_non_utf8_offset_past_the_first_chunk(tmp_path):
    """The offset is the file's, not a read buffer's (the decoder reads 1 MiB at a time)."""
    from mpt_repro.data.corpus import _first_bad_utf8

    head = ("é" * 600_000).encode()  # 1.2 MB of two-byte characters, straddling the chunk edge
    path = tmp_path / "big.txt"
    path.write_bytes(head + b"\xff tail\n")
    assert _first_bad_utf8(path) == len(head)
    path.write_bytes(head + "é".encode()[:1])  # a character cut off at the very end
    assert _first_bad_utf8(path) == len(head)
    path.write_bytes(head)
    assert _first_bad_utf8(path) is None


@pytest.mark.slow
def test_mpt_run_with_a_corrupt_file_in_a_worker_exits_2_with_one_line(tmp_path):
    """Through mpt-run: the run stops with the file's path, exit status 2, no traceback."""
    from conftest import run_cli

    root = tree(tmp_path / "d", n=6)
    corrupt(root / "train" / "dogs" / "dogs_3.jpg")
    proc = run_cli(
        "experiment=demo",
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=8",
        "data.resize_size=8",
        "data.batch_size=4",
        "data.num_workers=2",
        "trainer.device=cpu",
        run_dir=tmp_path / "run",
        check=False,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mpt-run: error:")]
    assert len(errors) == 1 and "dogs_3.jpg" in errors[0] and "worker" in errors[0]
    assert "Traceback" not in proc.stderr


# -- data.on_corrupt=skip is counted in the run record -----------------------------------------
def skip_task(root: Path, *extra: str):
    from conftest import build_task

    task, _ = build_task(
        "experiment=demo",
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=8",
        "data.resize_size=8",
        "data.batch_size=4",
        "data.on_corrupt=skip",
        *extra,
    )
    return task


def test_skipped_files_are_counted_named_and_left_out_of_the_sizes(tmp_path, one_thread):
    """A real ImageFolder with a corrupt image in train/ and one in val/, read by two loader
    worker processes: the main process's data description counts both."""
    root = tree(tmp_path / "d", n=6)  # 12 train and 12 val images
    bad_train, bad_val = (
        root / "train" / "dogs" / "dogs_3.jpg",
        root / "val" / "cats" / "cats_0.jpg",
    )
    corrupt(bad_train)
    corrupt(bad_val)
    task = skip_task(root, "data.num_workers=2")
    before = task.describe_data()
    assert (before["train_size"], before["eval_size"], before["skipped_files"]) == (12, 12, 0)
    for _ in task.train_batches(0):  # one epoch: every training image is read once
        pass
    task.evaluate()
    after = task.describe_data()
    assert after["skipped_files"] == 2
    assert after["skipped_paths"] == [str(bad_train), str(bad_val)]
    assert (after["train_size"], after["eval_size"]) == (11, 11)  # the images used

    # a resumed run keeps the count of the files skipped before it stopped
    resumed = skip_task(root, "data.num_workers=0")
    resumed.load_state_dict(task.state_dict())
    assert resumed.describe_data()["skipped_paths"] == [str(bad_train), str(bad_val)]


def test_without_skip_the_description_has_no_skip_count(tmp_path, one_thread):
    root = tree(tmp_path / "d")
    task = skip_task(root, "data.on_corrupt=fail", "data.num_workers=0")
    described = task.describe_data()
    assert (described["train_size"], described["eval_size"]) == (8, 8)
    assert "skipped_files" not in described and task.state_dict() == {}


def test_the_count_covers_a_subset_s_files_only(tmp_path):
    """A budget's data.train_limit: a corrupt file outside the first N is not counted."""
    from mpt_repro.data import describe_sizes

    root = tree(tmp_path / "d")
    data = build_image_data(cfg(root, on_corrupt="skip", train_limit=4))
    inside, outside = data.train.dataset.samples[1][0], data.train.dataset.samples[6][0]
    corrupt(Path(inside))
    corrupt(Path(outside))
    for i in range(len(data.train)):
        data.train[i]
    data.train.dataset[6]  # read by someone else (the folder itself), not by this subset
    sizes = describe_sizes(data.train, data.eval, "skip")
    assert sizes["skipped_paths"] == [inside] and sizes["train_size"] == 3


@pytest.mark.slow
def test_mpt_run_records_the_skipped_files_in_run_json(tmp_path):
    from conftest import read_run, run_cli

    root = tree(tmp_path / "d", n=6)
    bad = root / "train" / "dogs" / "dogs_3.jpg"
    corrupt(bad)
    run_cli(
        "experiment=demo",
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=8",
        "data.resize_size=8",
        "data.batch_size=4",
        "data.num_workers=2",
        "data.on_corrupt=skip",
        "trainer.epochs=1",
        "trainer.max_steps=null",
        "trainer.device=cpu",
        run_dir=tmp_path / "run",
    )
    data = read_run(tmp_path / "run")["data"]
    assert data["skipped_files"] == 1 and data["skipped_paths"] == [str(bad)]
    assert data["train_size"] == 11


def test_the_digits_are_scikit_learns_split_read_without_importing_it() -> None:
    """data=digits reads scikit-learn's file with numpy and the kept split (no 2.4 s import of
    scikit-learn at each run's start); the tensors equal load_digits + train_test_split's."""
    import subprocess
    import sys

    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from mpt_repro.data.digits import digits, sklearn_split

    raw = load_digits()
    images = (raw.images.astype(np.float32) / 16.0 - 0.5) / 0.5
    x_train, x_val, y_train, y_val = train_test_split(
        images, raw.target, test_size=0.2, random_state=0, stratify=raw.target
    )
    data = digits(None)
    for ours, theirs in (
        (data.train.tensors[0], torch.from_numpy(x_train).unsqueeze(1)),
        (data.train.tensors[1], torch.from_numpy(y_train).long()),
        (data.eval.tensors[0], torch.from_numpy(x_val).unsqueeze(1)),
        (data.eval.tensors[1], torch.from_numpy(y_val).long()),
    ):
        assert torch.equal(ours, theirs)
    from mpt_repro.data.digits import SPLIT_FILE

    assert json.loads(SPLIT_FILE.read_text()) == sklearn_split()  # the file is what it says
    code = (
        "import sys; from mpt_repro.data.digits import digits; digits(None); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
