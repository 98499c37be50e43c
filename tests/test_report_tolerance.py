"""mpt-report --tolerance for a metric no run recorded (issue 34): refused, naming the metrics."""

from __future__ import annotations

import json

from mpt_repro.report import cli


def test_a_tolerance_for_a_metric_no_run_has_is_refused(tmp_path, capsys) -> None:
    run = tmp_path / "runs" / "demo" / "fp32-smoke" / "seed0"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"metrics": {"top1": 50.0, "loss": 1.0}}))
    out = tmp_path / "report"
    assert cli.main([str(tmp_path / "runs"), "--out", str(out), "--tolerance", "foo=1"]) == 2
    assert capsys.readouterr().err == (
        "mpt-report: error: --tolerance foo=...: no run here recorded a metric 'foo' (they "
        "recorded: loss, top1); give one of those, or default=VALUE for all\n"
    )
    assert not out.exists()  # refused before anything is written
