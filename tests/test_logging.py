"""TensorBoard as users compare runs in it (issue 14.1), and the console (14.3).

The TensorBoard test writes two runs the way the trainer does (MetricsLogger rows from a real
run's metrics.csv, then write_run_summary with the real run.json), starts a real TensorBoard
server on them and asks it what its dashboards show: the run names, the HParams columns and
values, the custom-scalars layout and its data.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from conftest import compose
from test_report_records import derive, finish, interrupted_v1, real_record, real_runs

from mpt_repro import catalog
from mpt_repro.runlog.closing import closing_block
from mpt_repro.runlog.console import RunProgress
from mpt_repro.runlog.hparams import (
    KEY_HPARAMS,
    STATUSES,
    hparams_summaries,
    run_hparams,
    summary_scalars,
    write_run_summary,
)
from mpt_repro.runlog.metrics import MetricsLogger, comparison_group
from mpt_repro.tasks import all_metric_names

# ---------------------------------------------------------------- TensorBoard


def write_like_the_trainer(root: Path, record: dict, source: Path) -> Path:
    """What trainer.fit and run.py do with a run's numbers: rows to MetricsLogger as they come,
    write_run_summary at the end."""
    cfg = compose(
        [f"experiment={record['experiment']}", "budget=smoke", f"precision={record['precision']}"]
    )
    run_dir = root / record["experiment"] / f"{record['precision']}-{record['budget']}"
    run_dir = run_dir / f"seed{record['seed']}"
    run_dir.mkdir(parents=True)
    logger = MetricsLogger(run_dir, ["loss", "top1", "top5"], compare_group=comparison_group(cfg))
    # the rows as logged: an empty cell was not logged; "nan" was (a diverged run's loss)
    rows = pd.read_csv(source / "metrics.csv", dtype=str, keep_default_na=False)
    for row in rows.to_dict("records"):
        values = {k: float(v) for k, v in row.items() if k not in ("step", "split") and v != ""}
        logger.log(int(row["step"]), row["split"], values)
    write_run_summary(logger.writer, cfg, record, all_metric_names())
    logger.close()
    return run_dir


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    """A real TensorBoard server over a completed and a diverged run; yields (url, runs root)."""
    from tensorboard import program

    root = tmp_path_factory.mktemp("tb")
    write_like_the_trainer(root, real_record("completed"), real_runs()["completed"])
    write_like_the_trainer(root, real_record("diverged"), real_runs()["diverged"])
    board = program.TensorBoard()
    board.configure(
        argv=[None, "--logdir", str(root), "--port", "0", "--load_fast", "false"]
        + ["--reload_interval", "0"]
    )
    # what board.launch() does, keeping the server so that it can be stopped afterwards
    server = board._make_server()
    threading.Thread(target=server.serve_forever, name="TensorBoard", daemon=True).start()
    yield server.get_url(), root
    server.shutdown()


def get(url: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path,
        data=data,
        headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"},
    )
    return json.load(urllib.request.urlopen(request, timeout=30))


def wait_for_runs(url: str, n: int) -> list[str]:
    import time

    for _ in range(100):
        runs = get(url, "data/runs")
        if len(runs) >= n:
            return runs
        time.sleep(0.1)
    raise AssertionError(f"TensorBoard loaded {runs}")


def test_run_names_read_experiment_preset_budget_seed(tensorboard):
    url, _ = tensorboard
    assert sorted(wait_for_runs(url, 2)) == ["demo/fp32-smoke/seed0", "demo/no_scaling-smoke/seed0"]


def test_hparams_show_the_readable_columns_first(tensorboard):
    """The HParams table displays the first five hyperparameters the backend sends (it sorts them
    by `differs`, then by name) and the first five metrics: the readable columns (issue 37), not
    what the run name (its Trial ID) already says, and no status as a number."""
    url, _ = tensorboard
    wait_for_runs(url, 2)
    experiment = get(url, "data/plugin/hparams/experiment", {"experimentName": ""})
    hparams = experiment["hparamInfos"]
    assert [h["name"] for h in hparams[:5]] == [
        "loss_scaling", "model", "precision", "status", "variant",
    ]  # fmt: skip
    assert set(KEY_HPARAMS) == {h["name"] for h in hparams[:5]}
    assert all(h.get("differs") for h in hparams[:5]) and not hparams[5].get("differs")
    precision = next(h for h in hparams if h["name"] == "precision")
    assert precision["domainDiscrete"] == list(catalog.presets())  # every preset, in display order
    status = next(h for h in hparams if h["name"] == "status")
    assert status["type"] == "DATA_TYPE_STRING" and status["domainDiscrete"] == list(STATUSES)
    tags = [m["name"]["tag"] for m in experiment["metricInfos"]]
    assert "run/status_code" not in tags  # it showed as `0.0000` among the first five metrics
    # the demo's own metrics first, its primary one leading, then the cost figures
    assert tags[:5] == [
        "final/top1", "final/loss", "final/top5", "run/samples_per_s", "run/peak_memory_mib",
    ]  # fmt: skip
    assert {"run/loss_scale_final", "run/loss_scale_min", "run/skipped_steps"} <= set(tags)
    assert "final/top1" in tags and "final/perplexity" in tags  # every task's metrics


def test_hparams_values_and_outcomes(tensorboard):
    url, _ = tensorboard
    wait_for_runs(url, 2)
    groups = get(
        url,
        "data/plugin/hparams/session_groups",
        {
            "experimentName": "",
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE"],
            "colParams": [],
            "startIndex": 0,
            "sliceSize": 10,
        },
    )["sessionGroups"]
    by_name = {g["name"]: g for g in groups}
    done, div = real_record("completed"), real_record("diverged")
    fp32 = by_name["demo/fp32-smoke/seed0"]
    # the seed as text ("0", not the 0.0000 of a number), the status as words
    assert (fp32["hparams"]["precision"], fp32["hparams"]["seed"]) == ("fp32", "0")
    assert fp32["hparams"]["status"] == "completed" and fp32["hparams"]["variant"] == "(none)"
    assert fp32["hparams"]["experiment"] == "demo" and fp32["hparams"]["budget"] == "smoke"
    assert fp32["hparams"]["device"].startswith("cpu")
    assert fp32["hparams"]["loss_scaling"] == "none"  # the enum's name, not "LossScaling.none"
    values = {m["name"]["tag"]: m["value"] for m in fp32["metricValues"]}
    assert values["final/top1"] == pytest.approx(done["metrics"]["top1"])
    assert values["run/samples_per_s"] == pytest.approx(done["samples_per_s"], rel=1e-6)
    assert values["run/peak_memory_mib"] == pytest.approx(done["peak_memory_bytes"] / 2**20)
    assert values["run/loss_scale_final"] == done["loss_scale"]["final"]
    assert fp32["sessions"][0]["status"] == "STATUS_SUCCESS"
    diverged = by_name["demo/no_scaling-smoke/seed0"]
    assert diverged["hparams"]["status"] == "diverged"
    values = {m["name"]["tag"]: m["value"] for m in diverged["metricValues"]}
    assert values["run/diverged_at_step"] == div["diverged_at_step"]
    assert "final/top1" not in values  # a diverged run has no final metrics: blank, not zero
    assert diverged["sessions"][0]["status"] == "STATUS_FAILURE"


def test_custom_scalars_put_the_presets_on_one_chart(tensorboard):
    url, _ = tensorboard
    wait_for_runs(url, 2)
    layout = get(url, "data/plugin/custom_scalars/layout")
    (category,) = layout["category"]
    # one study, budget and data set (and no other overrides): the runs that may be compared
    assert category["title"] == "demo-smoke-digits: presets compared"
    charts = {c["title"]: c["multiline"]["tag"] for c in category["chart"]}
    assert list(charts)[:3] == ["train loss", "loss scale", "samples/s"]
    assert "eval top1" in charts
    # the one loss chart draws both presets: each run has its values under the chart's tag
    tag = charts["train loss"][0]
    for run, kind in (
        ("demo/fp32-smoke/seed0", "completed"),
        ("demo/no_scaling-smoke/seed0", "diverged"),
    ):
        query = urllib.parse.urlencode({"run": run, "tag": tag})
        data = get(url, f"data/plugin/custom_scalars/scalars?{query}")
        steps = [point[1] for series in data["tag_to_events"].values() for point in series]
        frame = pd.read_csv(real_runs()[kind] / "metrics.csv")
        assert steps == frame.loc[frame["split"] == "train", "step"].tolist(), run


def test_interrupted_run_has_no_session_end_and_a_later_outcome_wins():
    from tensorboard.plugins.hparams import metadata

    cfg = compose(["experiment=demo", "budget=smoke"])
    stopped = interrupted_v1(real_record("completed"), 4)
    tags = [p.value[0].tag for p in hparams_summaries(cfg, stopped, all_metric_names())]
    assert metadata.SESSION_END_INFO_TAG not in tags  # it goes on after resume=true
    assert run_hparams(cfg, stopped)["status"] == "interrupted"
    # written at the run's last step: the resumed run's outcome (step 6) is the last value
    assert summary_scalars(real_record("completed"))["run/steps"] == 6 > stopped["steps"]


def test_a_run_that_applied_no_step_says_so_in_its_status():
    """cifar10 mixed at the smoke budget skips every step: its metrics are the untrained
    model's, and HParams showed it as a plain completed run (issue 37)."""
    cfg = compose(["experiment=demo", "budget=smoke"])
    record = real_record("completed")
    assert run_hparams(cfg, record)["status"] == "completed"
    untrained = finish(record, "completed", skipped_steps=record["steps"])
    assert run_hparams(cfg, untrained)["status"] == "completed, no step applied" in STATUSES


# ---------------------------------------------------------------- console


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def console():
    """A root console handler writing to a fake terminal (what Hydra's console handler is)."""
    stream = FakeTerminal()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    root = logging.getLogger()
    saved, level = root.handlers, root.level
    root.handlers, root.level = [handler], logging.INFO
    yield stream, handler
    root.handlers, root.level = saved, level


def test_bar_on_a_terminal_logs_through_it_and_leaves_nothing_behind(console, monkeypatch):
    stream, handler = console
    # the terminal is stderr: only console handlers (stdout/stderr) are routed through the bar
    monkeypatch.setattr("sys.stderr", stream)
    with RunProgress(6, desc="demo/fp32", stream=stream) as progress:
        for step in range(1, 7):
            progress.update(step, loss=2.5 - 0.1 * step, samples_s=700.0)
            if step == 3:
                logging.getLogger("mpt_repro").info("eval at step 3: top1=50")
    out = stream.getvalue()
    # the log line is a line of its own, not glued to the bar
    assert "\n[INFO] eval at step 3: top1=50\n" in out.replace("\r", "\n")
    assert "demo/fp32" in out and "loss=1.9" in out  # the bar showed the row
    # leave=False: the bar's line is cleared at the end, and the 100% state is not printed twice
    assert out.endswith("\r") or out.rstrip(" ").endswith("\r")
    assert out.count("6/6") <= 1
    handlers = logging.getLogger().handlers
    assert handler in handlers and not any(type(h).__name__ == "_WriteHandler" for h in handlers)


def test_without_a_terminal_no_bar_and_few_plain_lines(caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="mpt_repro"):
        with RunProgress(100, desc="demo/fp32", stream=stream, interval_s=3600) as progress:
            for step in range(1, 101):
                progress.update(step, loss=1.0)
    assert stream.getvalue() == ""  # no bar, no carriage returns in a log file
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["demo/fp32 step 1/100 (1%) loss=1", "demo/fp32 step 100/100 (100%) loss=1"]
    caplog.clear()
    terminal = FakeTerminal()
    with RunProgress(100, stream=terminal, silent=True) as progress:  # another rank
        for step in range(1, 101):
            progress.update(step, loss=1.0)
    assert terminal.getvalue() == "" and caplog.records == []


def test_file_handlers_are_not_redirected(console, monkeypatch, tmp_path):
    stream, _ = console
    monkeypatch.setattr("sys.stderr", stream)
    file_handler = logging.FileHandler(tmp_path / "run.log")
    logging.getLogger().addHandler(file_handler)
    with RunProgress(2, stream=stream):
        assert file_handler in logging.getLogger().handlers
        logging.getLogger("mpt_repro").warning("to the file too")
    file_handler.close()
    assert "to the file too" in (tmp_path / "run.log").read_text()


# ---------------------------------------------------------------- the closing block


def test_closing_block_completed():
    record, run_dir = real_record("completed"), real_runs()["completed"]
    text, warn = closing_block(record, run_dir, run_dir.parent)
    assert not warn
    lines = text.splitlines()
    assert lines[0].startswith("── demo / fp32 / smoke / seed 0: completed")
    top1 = record["metrics"]["top1"]
    assert lines[1].startswith(f"  final metrics  top1={top1:.4g} (primary), ")
    assert f"  run record     {run_dir / 'run.json'}" in lines
    assert f"  metrics        {run_dir / 'metrics.csv'}" in lines
    assert f"  TensorBoard    {run_dir}" in lines  # the events are in the run directory
    assert f"  compare        mpt-report {run_dir.parent}" in lines
    assert f"                 tensorboard --logdir {run_dir.parent}" in lines
    assert any(
        line.startswith("  loss scale     final 1, min 1; 0 skipped steps") for line in lines
    )


def test_closing_block_diverged_failed_interrupted_and_nan():
    div = derive(real_record("diverged"), diverged_layer="conv1.weight")
    text, warn = closing_block(div, real_runs()["diverged"])
    assert warn and "diverged       at step 2, first non-finite gradient in conv1.weight" in text
    failed = real_record("failed")
    text, warn = closing_block(failed, real_runs()["failed"])
    assert warn and "reason         " in text and ".png" in text
    # bad input (a UserError) carries a hint, not a traceback; an unexpected error the opposite
    assert ("next           " in text) == bool(failed.get("hint"))
    assert ("traceback      in " in text) == (not failed.get("hint") and "traceback" in failed)
    assert failed.get("hint") or "traceback" in failed
    text, warn = closing_block(interrupted_v1(real_record("completed"), 4), Path("/x"))
    assert warn and ": interrupted" in text.splitlines()[0]
    assert "next           the same command with resume=true continues it" in text
    done = real_record("completed")
    nan = finish(done, "completed", metrics={**done["metrics"], "loss": float("nan")})
    text, warn = closing_block(nan, Path("/x"))
    assert warn and "NOT FINITE     loss" in text
