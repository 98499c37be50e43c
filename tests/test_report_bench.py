"""mpt-report renders every results/bench/*.json that mpt-bench writes (issue 15.1).

The files here follow the layout agreed with the mpt-bench branch (top-level device, versions,
commit, config; `results`: one entry per preset with the measured fields, any of them null, and
`meaningful: {field: bool}`); mpt-bench itself is built in parallel, so they are written here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mpt_repro.report import cli
from mpt_repro.report.bench import bench_tables

MiB = 2**20


def entry(preset: str, **fields) -> dict:
    base = {
        "preset": preset,
        "samples_per_s": None,
        "ratio_fp32": None,
        "ratio_amp": None,
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "mem_ratio_fp32": None,
        "saved_bytes_per_sample": None,
        "host_syncs_per_step": None,
        "flops_per_sample": None,
        "tflops": None,
        "mfu": None,
        "joules_per_sample": None,
        "trainer_overhead": None,
        "meaningful": {},
    }
    return {**base, **fields}


CPU_NOT_MEANINGFUL = {"mfu": False, "joules_per_sample": False, "peak_reserved_bytes": False}


def cpu_bench() -> dict:
    return {
        "device": {"type": "cpu", "name": "x86_64", "count": 2},
        "versions": {"torch": "2.14.1", "python": "3.11.7"},
        "commit": "abc1234",
        "config": {"experiment": "resnet50", "batch_size": 8, "image_size": 64, "repeats": 5},
        "results": [
            # listed out of order: the table puts them in the display order
            entry(
                "mixed",
                samples_per_s={"median": 50.0, "min": 48.0, "max": 51.0},
                ratio_fp32=0.5,
                saved_bytes_per_sample=40 * MiB,
                host_syncs_per_step=0,
                flops_per_sample=24.5e9,
                trainer_overhead=0.025,
                meaningful=CPU_NOT_MEANINGFUL,
            ),
            entry(
                "fp32",
                samples_per_s=100.0,
                ratio_fp32=1.0,
                peak_allocated_bytes=2048 * MiB,
                saved_bytes_per_sample=76.2 * MiB,
                host_syncs_per_step=0,
                flops_per_sample=24.5e9,
                tflops=0.49,
                meaningful=CPU_NOT_MEANINGFUL,
            ),
            {"preset": "amp"},  # an entry with nothing measured: every cell blank
        ],
    }


def test_bench_table_cells(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "resnet50_cpu.json").write_text(json.dumps(cpu_bench()))
    tables, problems = bench_tables(bench)
    assert problems == []
    (table,) = tables
    t = table.frame.set_index("Preset")
    assert list(t.index) == ["fp32", "amp", "mixed"]
    assert t.loc["mixed", "Samples/s"] == "50.0 (48.0–51.0)"  # median (min–max)
    assert t.loc["fp32", "Samples/s"] == "100.0"
    assert (t.loc["fp32", "÷ fp32"], t.loc["mixed", "÷ fp32"]) == ("1.00", "0.50")
    assert t.loc["fp32", "Saved for backward (MiB/sample)"] == "76.20"
    assert t.loc["mixed", "Host syncs/step"] == "0.0"
    assert t.loc["mixed", "GFLOP/sample"] == "24.50"
    assert t.loc["mixed", "Trainer overhead"] == "+2.5%"
    assert t.loc["fp32", "Peak allocated (MiB)"] == "2048.0"
    # not meaningful on a CPU: n/a; not measured: blank
    assert (t.loc["fp32", "MFU"], t.loc["fp32", "J/sample"]) == ("n/a", "n/a")
    assert t.loc["amp", "MFU"] == "" and t.loc["amp", "Samples/s"] == ""
    # a column nobody measured is left out
    assert "÷ amp" not in t.columns
    assert table.title == "Benchmark: resnet50 on cpu: x86_64 ×2"
    assert "commit abc1234" in table.caption and "batch_size=8" in table.caption
    assert "J/sample" in table.notes[-1] and "MFU" in table.notes[-1]


def test_report_renders_every_bench_file_and_lists_broken_ones(tmp_path):
    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    bench = results / "bench"
    bench.mkdir()
    (bench / "a_cpu.json").write_text(json.dumps(cpu_bench()))
    gpu = cpu_bench()
    gpu["device"] = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1}
    gpu["results"][1]["mfu"] = 0.42
    gpu["results"][1]["meaningful"] = {}
    (bench / "b_gpu.json").write_text(json.dumps(gpu))
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
