"""Telemetry end to end through the installed `mpt-run`: figures, record file, run.json summary."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import read_run, run_cli

from mpt_repro.telemetry.figures import FIGURES
from mpt_repro.telemetry.numerics import FORMAT_NAMES


def test_smoke_run_with_telemetry_writes_figures_and_summary(tmp_path: Path) -> None:
    run_cli(
        "experiment=demo",
        "budget=smoke",
        "precision=fp32",
        "telemetry.enabled=true",
        "telemetry.every=2",
        run_dir=tmp_path,
    )
    rec = read_run(tmp_path)
    assert rec["status"] == "completed"
    tel = rec["diagnostics"]["telemetry"]
    # budget=smoke runs 6 iterations; iterations 0, 2, 4 are sampled and recorded as steps 1, 3, 5
    assert tel["samples"] == 3 and tel["sampled_steps"] == [1, 3, 5] and tel["every"] == 2
    assert tel["first_nonfinite_layer"] is None
    assert {"act_grad", "weight_grad", "lost_update", "act_grad_histogram"} <= set(tel["network"])
    assert "7" in tel["layers"]  # the digits CNN's final Linear
    lines = (tmp_path / "telemetry.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 3, 5]
    assert tel["figures"] == list(FIGURES)
    for name in FIGURES:
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    # TensorBoard got the histograms and scalars
    assert any(p.stat().st_size > 0 for p in tmp_path.glob("events.*"))


def test_telemetry_is_off_by_default_and_the_diagnostic_preset_turns_it_on() -> None:
    from conftest import compose

    assert compose(["experiment=demo"]).telemetry.enabled is False
    # `telemetry=diagnostic` once conf/config.yaml lists the group in its defaults, `+telemetry=...`
    # before
    try:
        cfg = compose(["experiment=demo", "telemetry=diagnostic"])
    except Exception:
        cfg = compose(["experiment=demo", "+telemetry=diagnostic"])
    assert cfg.telemetry.enabled is True and cfg.telemetry.every == 100


def test_telemetry_under_fp16_master_weights_and_a_moving_loss_scale(tmp_path: Path) -> None:
    """The real trainer under `mixed`: FP16 model, FP32 masters, a dynamic scale that starts too
    high and backs off. Every record must show the scale that step really used."""
    run_cli(
        "experiment=demo",
        "budget=smoke",
        "precision=mixed",
        "precision.init_scale=1048576",  # 2^20: the FP16 backward overflows until it backs off
        "telemetry.enabled=true",
        "telemetry.every=1",
        "telemetry.figures=false",
        "trainer.max_steps=8",
        "data.train_limit=512",
        run_dir=tmp_path,
    )
    rec = read_run(tmp_path)
    assert rec["status"] == "completed"
    lines = [json.loads(x) for x in (tmp_path / "telemetry.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 9))
    stepped = [r["stepped"] for r in lines]
    assert not all(stepped) and any(stepped)  # the scale moved through overflow to clean steps
    # the dynamic rule: halve after each skipped step (no growth within 2000 clean steps)
    scale = 2.0**20
    for r in lines:
        assert r["loss_scale"] == {"model": scale}, r["step"]
        scale = scale / 2 if not r["stepped"] else scale
    assert rec["loss_scale"]["final"] == scale
    assert rec["diagnostics"]["telemetry"]["skipped_steps_seen"] == rec["skipped_steps"]
    assert rec["skipped_steps"] == stepped.count(False)
    # on clean steps, the unscaled statistics are finite numbers
    for r in lines:
        if r["stepped"]:
            assert r["nonfinite"] is None and r["layers"]


def test_telemetry_reports_what_fp8_formats_would_do_with_the_gradients(tmp_path: Path) -> None:
    run_cli(
        "experiment=demo",
        "budget=smoke",
        "precision=fp32",
        "telemetry.enabled=true",
        "telemetry.every=3",
        "telemetry.figures=false",
        run_dir=tmp_path,
    )
    net = read_run(tmp_path)["diagnostics"]["telemetry"]["network"]
    for kind in ("act_grad_8bit", "weight_grad_8bit"):
        e5m2, e4m3 = net[kind]["e5m2"], net[kind]["e4m3"]
        assert 0 <= e5m2["flush"] <= 1 and 0 <= e4m3["flush"] <= 1
        # E4M3's smallest subnormal is 2^-9, E5M2's 2^-16: E4M3 flushes at least as much
        assert e4m3["flush"] >= e5m2["flush"]
        assert e4m3["flush"] > 0  # small FP32 gradients do fall below 2^-9
    lines = [json.loads(x) for x in (tmp_path / "telemetry.jsonl").read_text().splitlines()]
    layer = next(iter(lines[0]["layers"].values()))
    assert set(layer["act"]["formats"]) == {"numel", *FORMAT_NAMES}
