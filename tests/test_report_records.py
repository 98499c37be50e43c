"""Every outcome reaches the report (issue 11.5), from records the real writer produced.

Three real runs (mpt-run, budget=smoke) give the records: a completed demo run, a demo run that
really diverges (no_scaling with a huge learning rate), and a run that really fails (ResNet-50 on a
missing ImageNet folder). Every other record in the reporter's tests is a copy of one of these,
changed the way the writer changes it (`RunRecord.update`/`finish`, atomic write), so the tests
never rely on fields the writer does not produce. This module also holds those helpers, for
tests/test_report*.py and tests/test_logging*.py.
"""

from __future__ import annotations

import atexit
import copy
import json
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import pandas as pd
import pytest
from conftest import compose, read_run

from mpt_repro.catalog import presets
from mpt_repro.record import RunRecord
from mpt_repro.report import cli
from mpt_repro.report.collect import load_runs

# what the trainer's Stopped exception says (trainer.py): a schema-1 writer records it as failed
SIGTERM_REASON = "stopped by SIGTERM at step {step}; resume with resume=true"

REAL_RUNS = {
    "completed": ["experiment=demo", "budget=smoke"],
    # a learning rate of 1e12 makes the loss non-finite at once; patience 2 ends the run
    "diverged": [
        "experiment=demo",
        "budget=smoke",
        "precision=no_scaling",
        "optim.lr=1e12",
        "trainer.diverge_patience=2",
    ],
    # a corrupt image met in the first training batch: the run has started, so it fails with a
    # record and its reason (a data folder missing from the start is a refusal: no record)
    "failed": [
        "experiment=demo",
        "budget=smoke",
        "data=imagefolder",
        "data.image_size=8",
        "data.resize_size=8",
        "data.batch_size=4",
    ],
    # the detection task's record (Table 2): metrics.map, metrics_detail.per_class_ap
    "detection": ["experiment=ssd", "budget=smoke", "data=synthetic"],
}


@lru_cache(maxsize=1)
def real_runs() -> dict[str, Path]:
    """The three real runs, made once per test session, in a temporary folder. They run in this
    process through `mpt_repro.run.run` (what mpt-run calls, with the config it composes): three
    subprocesses would spend most of their time importing torch."""
    from mpt_repro.run import run

    root = Path(tempfile.mkdtemp(prefix="mpt-report-real-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    dirs = {}
    for kind, overrides in REAL_RUNS.items():
        dirs[kind] = root / kind
        if kind == "failed":
            overrides = [*overrides, f"data.root={corrupt_image_folder(root / 'images')}"]
        cfg = compose([*overrides, "trainer.progress=false", "trainer.device=cpu"])
        try:
            run(cfg, dirs[kind])
        except Exception:  # noqa: BLE001 - the failed run raises after recording the failure
            assert kind == "failed", kind
    return dirs


def corrupt_image_folder(root: Path) -> Path:
    """An ImageFolder (train/ and val/, two classes) whose training images are all corrupt: the
    first training batch stops the run with the file's name."""
    from PIL import Image

    for split in ("train", "val"):
        for c in ("cats", "dogs"):
            (root / split / c).mkdir(parents=True)
            for i in range(4):
                path = root / split / c / f"{c}_{i}.png"
                if split == "train":
                    path.write_bytes(b"not a png")
                else:
                    Image.new("RGB", (8, 8), (60 * i, 90, 30)).save(path)
    return root


def real_record(kind: str) -> dict:
    """A fresh copy of a real run.json ("completed", "diverged", "failed" or "detection")."""
    return copy.deepcopy(read_run(real_runs()[kind]))


def derive(record: dict, **changes) -> dict:
    """A copy of a real record for another setting: changes top-level fields as the writer
    would hold them. `precision=` also brings that preset's real config (conf/precision/), and
    `data=`/`device=` take a name or a type like the writer's `data.name`/`device.type`. Unless
    `config=` is given, the record's `config` becomes `same_recipe`'s: records derived for one
    setting then differ in precision and seed alone, as runs of one sweep do."""
    out = copy.deepcopy(record)
    if "precision" in changes:
        out["precision_config"] = {**out["precision_config"], **presets()[changes["precision"]]}
    if "data" in changes:
        out["data"] = {**(out.get("data") or {}), "name": changes.pop("data")}
    if "device" in changes:
        device = changes.pop("device")
        out["device"] = device if isinstance(device, dict) else {**out["device"], "type": device}
    out.update(changes)
    if "config" not in changes:
        out["config"] = same_recipe(out)
    return out


def same_recipe(record: dict) -> dict:
    """The resolved configuration of the real completed run (the real detection run's for a
    detection record), moved to the record's experiment, task, seed, budget, data set and preset:
    what the writer records for a run of that setting under one recipe."""
    kind = "detection" if record.get("task") == "detection" else "completed"
    config = copy.deepcopy(read_run(real_runs()[kind])["config"])
    config.update(experiment_name=record["experiment"], task=record["task"], seed=record["seed"])
    config["budget"]["name"] = record["budget"]
    config["data"]["name"] = (record.get("data") or {}).get("name", config["data"]["name"])
    config["precision"] = record.get("precision_config") or config["precision"]
    return config


def finish(record: dict, status: str, reason: str | None = None, **fields) -> dict:
    """The record as `RunRecord.finish(status, reason, **fields)` leaves it."""
    writer = RunRecord(Path(tempfile.gettempdir()), {})
    writer.data = copy.deepcopy(record)
    writer.data.update(status=status, reason=reason, **fields)
    return writer.data


def interrupted_v1(record: dict, step: int) -> dict:
    """A schema-1 run stopped by SIGTERM: the writer records `failed` with the trainer's message
    (its metrics are those of the last evaluation, here none)."""
    out = finish(record, "failed", SIGTERM_REASON.format(step=step), steps=step)
    out.pop("metrics", None)
    return out


def as_schema_v2(record: dict, **fields) -> dict:
    """Schema 2 as the shared brief specifies it, applied to a real schema-1 record (the schema-2
    writer is being built on another branch): schema_version 2, status may be `interrupted`, and
    the keys `reason`, `diverged_at_step`, `diverged_layer`, `metrics_detail` (optional), `hint`,
    `host`, `pid`. A schema-1 `failed` record stopped by SIGTERM becomes `interrupted`."""
    out = copy.deepcopy(record)
    if out.get("status") == "failed" and "SIGTERM" in str(out.get("reason")):
        out["status"] = "interrupted"
    layer = (out.get("diagnostics") or {}).get("first_nonfinite_layer")
    out.update(
        schema_version=2,
        diverged_layer=layer if out.get("status") == "diverged" else None,
        hint=None,
        host="testhost",
        pid=12345,
    )
    out.setdefault("reason", None)
    out.setdefault("diverged_at_step", None)
    out.update(fields)
    return out


def run_dir_of(root: Path, record: dict, extra: str | None = None) -> Path:
    """Where mpt-run puts a record: <experiment>/<precision>-<budget>/seed<N>[/<overrides>]."""
    path = Path(root) / str(record["experiment"]) / f"{record['precision']}-{record['budget']}"
    path = path / f"seed{record['seed']}"
    return path / extra if extra else path


def write_record(
    root: Path,
    record: dict,
    extra: str | None = None,
    curves_from: str | None = "completed",
) -> Path:
    """Write `record` with the real writer into its run directory under `root`, with the real
    metrics.csv of `curves_from` (a real run's kind) beside it."""
    run_dir = run_dir_of(root, record, extra)
    writer = RunRecord(run_dir, {})
    writer.data = copy.deepcopy(record)
    writer.data["run_dir"] = str(run_dir)
    writer.write()
    if curves_from:
        shutil.copy(real_runs()[curves_from] / "metrics.csv", run_dir / "metrics.csv")
    return run_dir


# ---------------------------------------------------------------- the real records themselves


def test_real_records_have_the_shapes_the_reporter_must_read():
    """What the writer really produces (not what a hand-made record would hold)."""
    done, div, fail = (real_record(k) for k in ("completed", "diverged", "failed"))
    assert done["status"] == "completed" and set(done["metrics"]) == {"loss", "top1", "top5"}
    assert div["status"] == "diverged" and div["metrics"] is None  # schema 3: no result
    assert div["schema_version"] == 5 and done["package_version"]
    assert div["diverged_at_step"] == 2 and div["reason"].startswith("loss was non-finite")
    assert fail["status"] == "failed" and fail["metrics"] is None  # no result
    assert ".png" in fail["reason"] and fail["hint"]  # the file, and what to do
    det = real_record("detection")
    assert (det["task"], det["primary_metric"], det["status"]) == ("detection", "map", "completed")
    assert "map" in det["metrics"]
    # which way is better: the primary metric's registration, as the run wrote it
    assert done["higher_is_better"] is True and det["higher_is_better"] is True
    assert isinstance(det["metrics_detail"]["per_class_ap"], dict)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """One results folder with every outcome, and the report built from it."""
    root = tmp_path_factory.mktemp("outcomes")
    runs = root / "runs"
    done, div, fail = (real_record(k) for k in ("completed", "diverged", "failed"))
    dirs = {
        "completed": write_record(runs, done),
        # the no_scaling run diverged under the completed run's recipe (derive's config)
        "diverged": write_record(runs, derive(div), curves_from="diverged"),
        "failed": write_record(runs, fail, "data=imagefolder", curves_from=None),
        "interrupted": write_record(runs, derive(interrupted_v1(done, 4), precision="amp")),
        "running": write_record(runs, derive(finish(done, "running"), precision="bf16")),
        "v2 diverged": write_record(
            runs,
            as_schema_v2(
                derive(div, seed=1),
                diverged_layer="conv2.weight",
                hint="try precision=mixed (loss scaling)",
            ),
            curves_from="diverged",
        ),
        "v2 interrupted": write_record(
            runs,
            as_schema_v2(derive(interrupted_v1(done, 4), precision="tf32")),
        ),
    }
    # overwrite=true moved an earlier run's files aside (mpt_repro/rundir.py): not a seed
    aside = write_record(root / "earlier", derive(done, metrics={**done["metrics"], "top1": 1.0}))
    aside.rename(dirs["completed"] / "previous-20261122-120000")
    # malformed records: each is a real record broken one way
    broken = runs / "broken"
    text = json.dumps(done)
    for name, content in {
        "truncated": text[: len(text) // 2],
        "not_utf8": b"\xff\xfe" + text.encode(),
        "data_is_a_string": json.dumps({**done, "data": "digits"}),
        "seed_is_a_string": json.dumps({**done, "seed": "0"}),
        "no_experiment": json.dumps({k: v for k, v in done.items() if k != "experiment"}),
        "schema_6": json.dumps({**done, "schema_version": 6}),
        "metrics_a_list": json.dumps({**done, "metrics": [1, 2]}),
        "a_list": json.dumps([done]),
    }.items():
        (broken / name).mkdir(parents=True)
        target = broken / name / "run.json"
        target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    out = root / "report"
    assert cli.main([str(runs), "--out", str(out), "--quiet"]) == 0
    return runs, out, dirs


def _problems(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "problems.csv", dtype=str, keep_default_na=False)


def test_diverged_runs_are_in_their_table_with_step_and_layer(outcomes):
    _, out, dirs = outcomes
    table = pd.read_csv(
        next((out / "tables").glob("classification_smoke_digits_*.csv")),
        dtype=str,
        keep_default_na=False,
    )
    demo = table[table["Experiment"] == "demo"].iloc[0]
    # seed 0 (schema 1, layer unknown) and seed 1 (schema 2, layer known) both diverged at step 2
    assert demo["no_scaling"] == "diverged at step 2 (layer conv2.weight)"
    assert demo["fp32"] == f"{real_record('completed')['metrics']['top1']:.2f} (n=1)"
    assert str(dirs["diverged"]) not in set(_problems(out)["path"])


def test_failed_interrupted_and_running_runs_are_listed_with_reasons(outcomes):
    _, out, dirs = outcomes
    problems = _problems(out).set_index("path")
    failed = problems.loc[str(dirs["failed"])]
    assert failed["status"] == "failed" and failed["run"] == "demo fp32 smoke seed0"
    assert ".png" in failed["reason"]
    for kind in ("interrupted", "v2 interrupted"):
        row = problems.loc[str(dirs[kind])]
        assert row["status"] == "interrupted", kind
        assert row["reason"] == "stopped by SIGTERM at step 4; resume with resume=true"
        assert "resume=true" in row["hint"]
    assert problems.loc[str(dirs["running"]), "status"] == "running"
    report = (out / "report.md").read_text()
    assert "### Failed" in report and "### Interrupted" in report
    assert "Next: try precision=mixed (loss scaling)" not in report  # a diverged run is in a table


def test_malformed_records_are_listed_and_never_stop_the_report(outcomes):
    runs, out, _ = outcomes
    problems = _problems(out).set_index("path")
    reason = {p: problems.loc[str(runs / "broken" / p), "reason"] for p in (
        "truncated", "not_utf8", "data_is_a_string", "seed_is_a_string", "no_experiment",
        "schema_6", "metrics_a_list", "a_list",
    )}  # fmt: skip
    assert (problems.loc[[str(runs / "broken" / p) for p in reason], "status"] == "malformed").all()
    assert reason["truncated"].startswith("cannot parse run.json (truncated or edited?)")
    assert reason["not_utf8"].startswith("run.json is not UTF-8 text")
    assert reason["data_is_a_string"] == 'data is a string ("digits"), expected an object'
    assert reason["seed_is_a_string"] == 'seed is a string ("0"), expected an integer'
    assert reason["no_experiment"] == "missing fields: experiment"
    assert reason["schema_6"] == "schema_version 6; this reporter reads 1, 2, 3, 4 and 5"
    assert reason["metrics_a_list"] == "metrics is a list ([1, 2]), expected an object"
    assert reason["a_list"] == "run.json does not hold a JSON object"
    report = (out / "report.md").read_text()
    assert "### Malformed or unreadable records" in report
    # 3 runs in the tables (fp32, two diverged seeds); everything else is listed
    assert "3 run(s) in the tables, 13 left out" in report


def test_a_run_moved_aside_by_overwrite_is_listed_not_averaged(outcomes):
    _, out, dirs = outcomes
    problems = _problems(out).set_index("path")
    aside = str(dirs["completed"] / "previous-20261122-120000")
    assert problems.loc[aside, "status"] == "replaced"
    assert "kept in previous-20261122-120000/ when overwrite=true" in problems.loc[aside, "reason"]


def test_completed_run_with_a_non_finite_primary_metric_is_shown_not_hidden(tmp_path):
    done = real_record("completed")
    write_record(tmp_path, done)
    nan = derive(done, seed=1, metrics={**done["metrics"], "top1": float("nan")})
    write_record(tmp_path, nan)
    runs, problems = load_runs(tmp_path)
    assert sorted(runs["seed"]) == [0, 1]
    [suspect] = [p for p in problems if p.status == "suspect"]
    assert "top1=nan" in suspect.reason and "not averaged" in suspect.reason
    out = tmp_path / "report"
    cli.main([str(tmp_path), "--out", str(out), "--quiet", "--no-plots"])
    table = pd.read_csv(next((out / "tables").glob("classification_*.csv")), dtype=str)
    top1 = done["metrics"]["top1"]
    assert table.loc[0, "fp32"] == f"{top1:.2f} (n=1); 1 of 2 non-finite"
