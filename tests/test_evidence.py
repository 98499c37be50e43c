"""What an evaluation dropped (mpt_repro/evidence.py): counted by reason, its share of the
evaluation data, the warning above DROPPED_WARN_SHARE; and no metric divides by max(n, 1)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from mpt_repro.evidence import (
    DROPPED_WARN_SHARE,
    Ratio,
    describe_dropped,
    dropped_share,
    from_columns,
    text_key,
)

ROOT = Path(__file__).resolve().parents[1]
LOSS = {"loss": Ratio("loss", "aligned", "utterances")}


def test_drops_before_and_during_scoring_are_counted_by_reason() -> None:
    """Left out before scoring (not in `items`) and left out of a loss (a dropped_ column, in
    `items`): both counted; the data held the evaluated items and those left out."""
    columns = {
        "loss": np.array([2.0, 0.0, 4.0]),
        "aligned": np.array([1, 0, 1]),
        "dropped_ctc_infeasible": np.array([0, 1, 0]),
    }
    found = from_columns(columns, LOSS, "utterances", {"empty_reference": 1, "none": 0}, "key")
    assert found.metrics == {"loss": 3.0} and found.counts == {"loss": 2}
    assert found.dropped == {"empty_reference": 1, "ctc_infeasible": 1}
    assert (found.items, found.data_items, found.key) == (3, 4, "key")
    block = found.record(step=7, items_file=None)
    assert block["dropped"] == found.dropped and block["data_items"] == 4
    assert block["key"] == "key"
    assert dropped_share(block) == 0.5


def test_the_share_and_its_warning() -> None:
    assert DROPPED_WARN_SHARE == 0.05
    assert dropped_share(None) == 0.0 and describe_dropped(None) is None
    block = {"unit": "sentence pairs", "items": 95, "data_items": 100, "dropped": {"long": 5}}
    assert dropped_share(block) == 0.05 and describe_dropped(block) is None  # at: no warning
    block = {"unit": "sentence pairs", "items": 94, "data_items": 100, "dropped": {"long": 6}}
    assert describe_dropped(block) == (
        "6 of 100 sentence pairs (6.0 %) dropped: 6 long (more than 5 %: the metrics may not "
        "describe the whole evaluation set)"
    )
    # a block without data_items: the evaluated items and every drop
    assert dropped_share({"items": 3, "dropped": {"a": 1}}) == 0.25
    # everything dropped, nothing evaluated
    assert dropped_share({"items": 0, "data_items": 0, "dropped": {"a": 2}}) == 1.0


def test_a_text_key_is_stable_and_fits_the_items_file() -> None:
    assert text_key("le chat") == text_key("le chat") != text_key("le chien")
    assert 0 <= text_key("x" * 1000) < 2**31
    assert text_key("go on") == 2119681730  # CRC-32: the same in every process and release


@pytest.mark.parametrize("folder", ["mpt_repro/tasks", "mpt_repro/data", "mpt_repro/evidence.py"])
def test_no_metric_divides_by_max_n_1(folder) -> None:
    """A metric with nothing under it is undefined, never a number: no `/ max(n, 1)`."""
    path = ROOT / folder
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    pattern = re.compile(r"/\s*max\((\s*1\s*,[^)]*|[^,()]+,\s*1\s*)\)")  # max(n, 1), max(1, n)
    found = [f"{f}:{n}" for f in files for n, line in enumerate(f.read_text().splitlines(), 1)
             if pattern.search(line)]  # fmt: skip
    assert found == []
    assert pattern.search("loss = s['loss'] / max(s['tokens'], 1)")  # what it looks for
