"""checkpoints/last.pt + previous.pt: atomic saves, and a load that falls back and says so."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch

from mpt_repro.checkpoint import LAST, PREVIOUS, load_checkpoint, save_checkpoint
from mpt_repro.errors import CheckpointError, UserError


def _state(step: int) -> dict:
    return {"step": step, "models": {"model": {"w": torch.full((64,), float(step))}}}


def test_each_save_keeps_the_one_before_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(1))
    path = save_checkpoint(tmp_path, _state(2))
    assert path == tmp_path / LAST
    assert torch.load(tmp_path / LAST)["step"] == 2
    assert torch.load(tmp_path / PREVIOUS)["step"] == 1
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "last.pt",
        "previous.pt",
    ]
    save_checkpoint(tmp_path, _state(3))
    assert torch.load(tmp_path / PREVIOUS)["step"] == 2  # only one generation is kept


def test_load_reads_the_newest_and_says_which(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path) is None  # nothing saved yet: not an error
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, _state(2))
    state = load_checkpoint(tmp_path)
    assert state["step"] == 2 and state["loaded_from"] == str(tmp_path / LAST)
    assert torch.equal(state["models"]["model"]["w"], torch.full((64,), 2.0))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b"\x00garbage" * 100, id="not-a-checkpoint"),
        pytest.param(lambda b: b"", id="empty"),
    ],
)
def test_unreadable_last_falls_back_to_previous_and_logs_it(tmp_path: Path, caplog, damage) -> None:
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, _state(2))
    last = tmp_path / LAST
    last.write_bytes(damage(last.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="mpt_repro"):
        state = load_checkpoint(tmp_path)
    assert state["step"] == 1 and state["loaded_from"] == str(tmp_path / PREVIOUS)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(last) in warning and str(tmp_path / PREVIOUS) in warning and "step 1" in warning


def test_a_save_cut_between_its_renames_resumes_from_previous(tmp_path: Path, caplog) -> None:
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, _state(2))
    (tmp_path / LAST).unlink()  # what a kill between the two os.replace calls leaves
    with caplog.at_level(logging.WARNING, logger="mpt_repro"):
        assert load_checkpoint(tmp_path)["step"] == 1
    assert "missing" in caplog.text


def test_a_file_that_is_not_a_trainer_checkpoint_is_not_used(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, {"weights": torch.ones(2)})  # loads, but holds no step
    assert load_checkpoint(tmp_path)["step"] == 1


def test_no_readable_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, _state(2))
    for p in (LAST, PREVIOUS):
        (tmp_path / p).write_bytes(b"PK\x03\x04 cut")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    message = str(err.value)
    assert isinstance(err.value, UserError)  # the CLI prints it without a traceback, exit 2
    assert str(tmp_path / LAST) in message and str(tmp_path / PREVIOUS) in message
    assert "overwrite=true" in message and "resume=true" in message


def test_a_failed_write_keeps_the_earlier_checkpoints(tmp_path: Path, monkeypatch) -> None:
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, _state(2))

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(tmp_path, _state(3))
    monkeypatch.undo()
    assert "free space" in str(err.value) and "resume=true" in str(err.value)
    assert str(tmp_path / LAST) in str(err.value)
    assert torch.load(tmp_path / LAST)["step"] == 2
    assert torch.load(tmp_path / PREVIOUS)["step"] == 1
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "last.pt",
        "previous.pt",
    ]


def test_an_unwritable_checkpoint_folder_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("a file where the folder should be")
    with pytest.raises(CheckpointError, match="could not write the checkpoint"):
        save_checkpoint(tmp_path, _state(1))


# -- issue 34: weights_only=True everywhere ----------------------------------------------------
class _Planted:
    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.target}",))


def test_a_crafted_last_checkpoint_is_refused_naming_it_and_never_fallen_back_from(
    tmp_path: Path,
) -> None:
    save_checkpoint(tmp_path, _state(1))
    save_checkpoint(tmp_path, {**_state(2), "x": _Planted(tmp_path / "planted")})
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert str(err.value).startswith(
        f"{tmp_path / LAST}: refused: it names posix.system, which a checkpoint of mpt-run never "
        "holds; it was not loaded and nothing in it ran"
    )
    assert not (tmp_path / "planted").exists()


def test_a_checkpoint_with_numpy_rng_states_written_before_still_loads(tmp_path: Path) -> None:
    import numpy as np

    save_checkpoint(tmp_path, {**_state(1), "rng": {"numpy": np.random.get_state()}})
    state = load_checkpoint(tmp_path)
    assert state["step"] == 1 and state["rng"]["numpy"][0] == "MT19937"


def test_rng_states_are_tensors_and_restore_every_stream_exactly(tmp_path: Path) -> None:
    import random

    import numpy as np

    from mpt_repro.trainer import rng_state, set_rng_state

    np.random.seed(3)
    np.random.standard_normal()  # a cached gaussian is part of numpy's state
    save_checkpoint(tmp_path, {**_state(1), "rng": rng_state()})
    want = (np.random.standard_normal(4).tolist(), random.random(), torch.rand(3).tolist())
    set_rng_state(load_checkpoint(tmp_path)["rng"])  # a weights_only=True load
    got = (np.random.standard_normal(4).tolist(), random.random(), torch.rand(3).tolist())
    assert got == want
