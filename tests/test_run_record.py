"""run.json, schema 2: what the writer puts in it, and how a reader takes any record it finds."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from mpt_repro.record import (
    SCHEMA_VERSION,
    RecordError,
    RunRecord,
    load_record,
    nonfinite_metrics,
    read_record,
    upgrade,
)

FIELDS = {"experiment": "demo", "task": "classification", "precision": "amp", "seed": 0}


def _written(tmp_path: Path, status: str = "completed", **extra) -> Path:
    record = RunRecord(tmp_path, dict(FIELDS))
    record.write()
    record.finish(status, **extra)
    return tmp_path / "run.json"


def test_the_writer_writes_schema_4_with_who_ran_it(tmp_path: Path) -> None:
    path = _written(tmp_path, "diverged", reason="loss non-finite", diverged_at_step=7)
    rec = json.loads(path.read_text())
    assert rec["schema_version"] == SCHEMA_VERSION == 5
    assert rec["evaluation"] is None  # schema 4: null until a run completes with a result
    # which code ran, also for a wheel install (no git checkout): the installed version
    from importlib.metadata import version

    assert rec["package_version"] == version("mpt-repro")
    assert rec["status"] == "diverged" and rec["diverged_at_step"] == 7
    assert rec["host"] == socket.gethostname() and rec["pid"] == os.getpid()
    # every v2 field is there from the start, null until known
    assert rec["hint"] is None and rec["diverged_layer"] is None
    assert rec["started_at"] and rec["finished_at"]
    assert read_record(tmp_path) == rec


def test_run_json_is_readable_by_the_team(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = _written(tmp_path)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert not list(tmp_path.glob(".run.json.*"))  # no temporary file left behind


def test_an_unknown_status_is_refused_by_the_writer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="paused"):
        RunRecord(tmp_path, dict(FIELDS)).finish("paused")


def test_interrupted_is_a_status(tmp_path: Path) -> None:
    _written(tmp_path, "interrupted", reason="stopped by SIGTERM at step 4", hint="resume=true")
    assert read_record(tmp_path)["status"] == "interrupted"


def test_no_record_reads_as_none(tmp_path: Path) -> None:
    assert read_record(tmp_path) is None


@pytest.mark.parametrize(
    "make,problem",
    [
        (lambda b: b[: len(b) // 2], "not valid JSON"),
        (lambda b: b"", "empty file"),
        (lambda b: b"\xff\xfe" + b, "not UTF-8"),
        (lambda b: b"[1, 2]", "JSON list, not an object"),
        (lambda b: b.replace(b'"schema_version": 5', b'"schema_version": 99'), "schema_version 99"),
        (lambda b: b.replace(b'"schema_version": 5', b'"schema_version": true'), "schema_version"),
        (lambda b: b.replace(b'"status": "completed"', b'"status": "paused"'), "unknown status"),
        (lambda b: b.replace(b'"experiment"', b'"experimnet"'), "missing fields: experiment"),
    ],
)
def test_a_damaged_record_is_a_record_error_that_names_the_problem(tmp_path, make, problem):
    path = _written(tmp_path)
    path.write_bytes(make(path.read_bytes()))
    with pytest.raises(RecordError) as err:
        load_record(path)
    assert problem in err.value.problem and err.value.path == path
    assert str(path) in str(err.value)


ADDED_IN_3 = ("package_version", "study", "overrides", "saved_bytes_per_sample")


def _as_version_3(rec: dict) -> dict:
    """What the schema-3 writer wrote: the same fields less `evaluation` (schema 4)."""
    v3 = {k: v for k, v in rec.items() if k != "evaluation"}
    v3["schema_version"] = 3
    return v3


def _as_version_2(rec: dict) -> dict:
    """What the schema-2 writer wrote: the same fields less those schemas 3 and 4 added; a
    diverged run had no `metrics` key."""
    v2 = {k: v for k, v in _as_version_3(rec).items() if k not in ADDED_IN_3}
    if v2["status"] == "diverged":
        v2.pop("metrics", None)
    v2["schema_version"] = 2
    return v2


def _as_version_1(rec: dict) -> dict:
    """What the schema-1 writer wrote: the same fields less those schemas 2 and 3 added."""
    v1 = {k: v for k, v in _as_version_2(rec).items()
          if k not in ("hint", "diverged_layer", "host", "pid")}  # fmt: skip
    v1["schema_version"] = 1
    return v1


def test_a_version_3_record_reads_with_no_evaluation(tmp_path: Path) -> None:
    rec = json.loads(_written(tmp_path).read_text())
    up = upgrade(_as_version_3(rec))
    assert up["schema_version"] == 5 and up["upgraded_from"] == 3 and up["evaluation"] is None


def test_a_version_1_record_reads_as_version_5(tmp_path: Path) -> None:
    rec = json.loads(_written(tmp_path).read_text())
    up = upgrade(_as_version_1(rec))
    assert up["schema_version"] == 5 and up["upgraded_from"] == 1
    assert up["status"] == "completed"
    assert up["hint"] is None and up["host"] is None and up["diverged_layer"] is None
    assert up["package_version"] is None and up["study"] is None


def test_a_version_2_diverged_record_reads_with_null_metrics(tmp_path: Path) -> None:
    rec = json.loads(_written(tmp_path, "diverged", reason="loss non-finite").read_text())
    v2 = _as_version_2(rec)
    assert "metrics" not in v2
    up = upgrade(v2)
    assert up["schema_version"] == 5 and up["upgraded_from"] == 2 and up["metrics"] is None


def test_a_version_1_sigterm_stop_reads_as_interrupted(tmp_path: Path) -> None:
    reason = "stopped by SIGTERM at step 12; resume with resume=true"
    rec = json.loads(_written(tmp_path, "failed", reason=reason).read_text())
    assert upgrade(_as_version_1(rec))["status"] == "interrupted"
    other = json.loads(_written(tmp_path, "failed", reason="DataError: no train/").read_text())
    assert upgrade(_as_version_1(other))["status"] == "failed"


def test_nonfinite_metrics_finds_nan_and_inf_only() -> None:
    metrics = {"loss": float("nan"), "top1": 9.4, "ppl": float("inf"), "ok": True}
    assert set(nonfinite_metrics(metrics)) == {"loss", "ppl"}
    assert nonfinite_metrics(None) == {}
