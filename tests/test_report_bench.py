"""mpt-report renders every results/bench/*.json that mpt-bench writes (issue 15.1).

The documents here follow mpt-bench's layout (mpt_repro/bench/results.py on the bench branch,
schema_version 1): device, versions, commit, commit_dirty, batch, config {overrides, suite,
presets, bench}, results [one row per preset; any figure may be null; `meaningful: {field:
bool}`; `error` for a preset whose workers failed]. mpt-bench is built in parallel, so the
documents are written here, with the numbers of a real CPU run of it on the demo.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mpt_repro import catalog
from mpt_repro.report import cli
from mpt_repro.report.bench import bench_tables

MiB = 2**20
# what mpt-bench's rows hold, all null: a field a row lacks must read like a null one
FIELDS = (
    "samples_per_s samples_per_s_min samples_per_s_max ratio_fp32 ratio_amp peak_allocated_bytes "
    "peak_reserved_bytes mem_ratio_fp32 saved_bytes_per_sample saved_ratio_fp32 "
    "host_syncs_per_step ops_per_step flops_per_sample tflops mfu joules_per_sample "
    "trainer_overhead"
).split()
# mpt-bench on a CPU: only the counts (saved bytes, syncs, FLOPs) mean something there
CPU_MEANINGFUL = {
    **{k: False for k in FIELDS},
    **{
        k: True
        for k in (
            "saved_bytes_per_sample",
            "saved_ratio_fp32",
            "host_syncs_per_step",
            "ops_per_step",
        )
    },
    "flops_per_sample": True,
}


def row(preset: str, **fields) -> dict:
    return {
        "preset": preset,
        **{k: None for k in FIELDS},
        "repeats": 2,
        "meaningful": {},
        "error": None,
        "detail": {},
        **fields,
    }


def document(device: dict, results: list[dict]) -> dict:
    return {
        "schema_version": 1,
        "created": "2026-11-22T19:43:39+00:00",
        "device": {**device, "gpu_model": None},
        "versions": {"torch": "2.14.1+cu130", "python": "3.11.7"},
        "commit": "e320045ba3540dbabac9aaab0ec66b8ee0fe6461",
        "commit_dirty": True,
        "command": "mpt-bench experiment=resnet50 data=synthetic",
        "batch": 8,
        "config": {
            "overrides": ["experiment=resnet50", "data=synthetic"],
            "suite": {
                "experiment_name": "resnet50",
                "model": {"name": "resnet50"},
                "data": {"name": "synthetic"},
            },
            "presets": {p: catalog.presets()[p] for p in ("fp32", "amp", "mixed")},
            "bench": {"warmup": 1, "steps": 3, "repeats": 2},
        },
        "results": results,
    }


def cpu_bench() -> dict:
    saved = 79_285_248  # bytes saved for backward per sample, fp32
    return document(
        {"type": "cpu", "name": "x86_64", "count": 2},
        [
            # listed out of order: the table puts them in the display order
            row(
                "mixed",
                samples_per_s=6.94,
                samples_per_s_min=6.48,
                samples_per_s_max=7.40,
                ratio_fp32=0.04,
                saved_bytes_per_sample=saved * 0.55,
                saved_ratio_fp32=0.55,
                host_syncs_per_step=0,
                flops_per_sample=24.3e9,
                trainer_overhead=0.05,
                meaningful=CPU_MEANINGFUL,
            ),
            row(
                "fp32",
                samples_per_s=182.8,
                samples_per_s_min=7.9,
                samples_per_s_max=357.7,
                ratio_fp32=1.0,
                saved_bytes_per_sample=saved,
                saved_ratio_fp32=1.0,
                host_syncs_per_step=0,
                flops_per_sample=24.3e9,
                meaningful=CPU_MEANINGFUL,
            ),
            # a preset whose workers all failed: no figures, its error
            row("amp", repeats=0, error="worker exited with status 1: CUDA out of memory"),
        ],
    )


def gpu_bench() -> dict:
    return document(
        {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1},
        [
            row(
                "fp32",
                samples_per_s=1350.0,
                samples_per_s_min=1340.0,
                samples_per_s_max=1361.0,
                ratio_fp32=1.0,
                peak_allocated_bytes=40 * 1024 * MiB,
                mem_ratio_fp32=1.0,
                tflops=98.4,
                mfu=0.42,
                trainer_overhead=0.025,
                meaningful={k: True for k in FIELDS},
            ),
            row("mixed", samples_per_s=4700.0, ratio_fp32=3.48, mfu=None),
        ],
    )


def test_bench_table_cells(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "resnet50-cpu.json").write_text(json.dumps(cpu_bench()))
    (bench / "resnet50-cuda.json").write_text(json.dumps(gpu_bench()))
    tables, problems = bench_tables(bench)
    assert problems == []
    cpu, gpu = tables
    t = cpu.frame.set_index("Preset")
    assert list(t.index) == ["fp32", "amp", "mixed"]
    # on a CPU speed is not meaningful: n/a; the counts are
    assert t.loc["fp32", "Samples/s"] == "n/a" and t.loc["mixed", "÷ fp32"] == "n/a"
    assert t.loc["fp32", "Saved for backward (MiB/sample)"] == "75.6"
    assert t.loc["mixed", "Saved ÷ fp32"] == "0.55"
    assert t.loc["mixed", "Host syncs/step"] == "0"
    assert t.loc["mixed", "GFLOP/sample"] == "24.3"
    assert t.loc["amp", "Samples/s"] == "failed: worker exited with status 1: CUDA out of memory"
    assert cpu.title == "Benchmark: resnet50 on cpu: x86_64 ×2"
    assert "model resnet50, data synthetic; batch 8" in cpu.caption
    assert "1 warm-up + 3 timed steps × 2 repeats" in cpu.caption
    assert "commit e320045ba354 (+ local changes)" in cpu.caption
    assert "Samples/s, ÷ fp32" in cpu.notes[1] and "MFU" in cpu.notes[1]
    g = gpu.frame.set_index("Preset")
    assert g.loc["fp32", "Samples/s"] == "1350.0 (1340.0–1361.0)"  # median (min–max)
    assert g.loc["mixed", "Samples/s"] == "4700.0" and g.loc["mixed", "÷ fp32"] == "3.48"
    assert (g.loc["fp32", "MFU"], g.loc["mixed", "MFU"]) == ("42.0%", "")  # not measured: blank
    assert g.loc["fp32", "Trainer overhead"] == "+2.5%"
    assert g.loc["fp32", "Peak allocated (MiB)"] == "40960.0"
    assert "Peak reserved (MiB)" not in g.columns  # nobody measured it


def test_report_renders_every_bench_file_and_lists_broken_ones(tmp_path):
    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    bench = results / "bench"
    bench.mkdir()
    (bench / "a_cpu.json").write_text(json.dumps(cpu_bench()))
    (bench / "b_gpu.json").write_text(json.dumps(gpu_bench()))
    (bench / "c_truncated.json").write_text(json.dumps(cpu_bench())[:50])
    (bench / "d_no_results.json").write_text(json.dumps({"device": "cpu"}))
    out = tmp_path / "report"
    # the default bench folder is bench/ beside the runs folder
    assert cli.main([str(results / "runs"), "--out", str(out), "--quiet"]) == 0
    report = (out / "report.md").read_text()
    assert "### Benchmark: resnet50 on cpu: x86_64 ×2" in report
    assert "### Benchmark: resnet50 on cuda: NVIDIA H100 80GB HBM3" in report
    gpu_table = pd.read_csv(out / "tables" / "bench_b_gpu.csv", dtype=str, keep_default_na=False)
    assert gpu_table.set_index("Preset").loc["fp32", "MFU"] == "42.0%"
    problems = pd.read_csv(out / "problems.csv", dtype=str).set_index("path")
    assert problems.loc[str(bench / "c_truncated.json"), "reason"].startswith(
        "cannot parse benchmark file"
    )
    assert problems.loc[str(bench / "d_no_results.json"), "reason"] == (
        "benchmark file without a `results` list"
    )
    assert "2 benchmark file(s)" in report


def test_bench_folder_alone_is_enough(tmp_path: Path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "x.json").write_text(json.dumps(cpu_bench()))
    out = tmp_path / "report"
    assert cli.main([str(tmp_path / "runs"), "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert (out / "tables" / "bench_x.csv").exists()
    assert cli.main([str(tmp_path / "none"), "--bench", str(tmp_path / "nb"), "--quiet"]) == 2
