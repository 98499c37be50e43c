"""mpt-report on handwritten run records with known numbers: exact cells, formats, plots,
references.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from mpt_repro.report import cli
from mpt_repro.report.reference import load_reference, table1_reference
from mpt_repro.report.render import LATEX_ESCAPES

CPU = {"type": "cpu", "name": "cpu", "count": 1}
GPU = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1}
MiB = 2**20
TASK_METRIC = {
    "classification": ("top1", True),
    "language_model": ("perplexity", False),
    "gan": ("g_loss", False),
}


def make_record(
    experiment,
    precision,
    seed,
    *,
    task="classification",
    budget="smoke",
    data="synthetic",
    device=CPU,
    status="completed",
    metrics=None,
    diverged_at_step=None,
    reason=None,
    samples_per_s=100.0,
    peak_memory_bytes=100 * MiB,
    wall_time_s=10.0,
):
    metric, higher = TASK_METRIC[task]
    return {
        "schema_version": 1,
        "experiment": experiment,
        "task": task,
        "precision": precision,
        "precision_config": {"name": precision},
        "seed": seed,
        "budget": budget,
        "data": {
            "name": data,
            "root": None,
            "train_size": 64,
            "eval_size": 64,
            "description": data,
        },
        "model": {"name": experiment, "variant": "", "parameters": 1000},
        "status": status,
        "reason": reason,
        "diverged_at_step": diverged_at_step,
        "metrics": metrics or {},
        "primary_metric": metric,
        "higher_is_better": higher,
        "steps": 6,
        "epochs": 1.0,
        "skipped_steps": 0,
        "loss_scale": {"initial": 65536.0, "final": 32768.0, "min": 32768.0, "max": 65536.0},
        "samples_per_s": samples_per_s,
        "peak_memory_bytes": peak_memory_bytes,
        "peak_memory_kind": "host_max_rss" if device["type"] == "cpu" else "cuda_max_allocated",
        "wall_time_s": wall_time_s,
        "device": device,
        "versions": {},
        "git_commit": "abc",
        "started_at": "2025-01-01T00:00:00",
        "finished_at": None if status == "running" else "2025-01-01T00:01:00",
        "config": {},
        "diagnostics": {},
    }


def write_run(root: Path, record: dict, metrics_csv: bool = True) -> Path:
    """Where the trainer puts it: <experiment>/<precision>-<budget>/seed<N>/<overrides>/run.json."""
    run_dir = (
        root
        / record["experiment"]
        / f"{record['precision']}-{record['budget']}"
        / f"seed{record['seed']}"
        / f"data={record['data']['name']},device={record['device']['type']}"
    )
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(record))
    if metrics_csv:
        metric = record["primary_metric"]
        rows = []
        for step in (2, 4, 6):
            rows.append(
                {
                    "step": step,
                    "epoch": step / 6,
                    "split": "train",
                    "loss": 3.0 / step,
                    "lr": 0.1,
                    "loss_scale": 65536.0 / step,
                    "skipped_steps": 0,
                    "samples_per_s": 100.0,
                    "wall_time_s": step,
                    metric: 1.0 * step,
                }
            )
        rows.append(
            {
                "step": 6,
                "epoch": 1.0,
                "split": "eval",
                "loss": 0.5,
                "lr": 0.1,
                "loss_scale": None,
                "skipped_steps": 0,
                "samples_per_s": None,
                "wall_time_s": 6,
                metric: record["metrics"].get(metric, 0.0),
            }
        )
        pd.DataFrame(rows).to_csv(run_dir / "metrics.csv", index=False)
    return run_dir


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results folder with known numbers, and the report built from it."""
    root = tmp_path_factory.mktemp("results")
    runs = root / "runs"
    rec = make_record
    # resnet50, smoke on synthetic data: fp32 two seeds, mixed three, no_scaling diverged, fp16
    # failed
    for seed, top1, speed, wall in ((0, 10.0, 100.0, 10.0), (1, 11.0, 120.0, 20.0)):
        write_run(
            runs,
            rec(
                "resnet50",
                "fp32",
                seed,
                metrics={"top1": top1, "top5": 50.0, "loss": 2.0},
                samples_per_s=speed,
                wall_time_s=wall,
            ),
        )
    for seed, top1, speed in ((0, 10.0, 200.0), (1, 12.0, 220.0), (2, 14.0, 240.0)):
        write_run(
            runs,
            rec(
                "resnet50",
                "mixed",
                seed,
                metrics={"top1": top1, "top5": 55.0, "loss": 2.0},
                samples_per_s=speed,
                peak_memory_bytes=50 * MiB,
            ),
        )
    write_run(
        runs,
        rec(
            "resnet50",
            "no_scaling",
            0,
            status="diverged",
            diverged_at_step=4,
            reason="loss scale at floor",
            metrics={"top1": 0.1},
        ),
    )
    write_run(runs, rec("resnet50", "fp16", 0, status="failed", reason="CUDA out of memory"))
    write_run(runs, rec("vgg16", "mixed", 0, status="running"))
    write_run(runs, rec("alexnet", "fp32", 0, metrics={"top1": 20.0, "loss": float("nan")}))
    # the same experiment on real data must never be averaged with the synthetic runs
    write_run(runs, rec("resnet50", "mixed", 0, data="imagenet", metrics={"top1": 50.0}))
    # the paper budget on ImageNet on a GPU: comparable with the paper
    for seed, top1 in ((0, 75.5), (1, 76.5)):
        write_run(
            runs,
            rec(
                "resnet50",
                "fp32",
                seed,
                budget="paper",
                data="imagenet",
                device=GPU,
                metrics={"top1": top1},
            ),
        )
    write_run(
        runs,
        rec(
            "resnet50",
            "mixed",
            0,
            budget="paper",
            data="imagenet",
            device=GPU,
            metrics={"top1": 76.0},
        ),
    )
    # demo (another classification experiment)
    write_run(runs, rec("demo", "fp32", 0, data="digits", metrics={"top1": 90.0}))
    write_run(runs, rec("demo", "mixed", 0, data="digits", metrics={"top1": 91.0}))
    # language model: fp32 two seeds; no_scaling diverges (two steps); mixed one completed, one
    # diverged
    lm = dict(task="language_model", data="corpus")
    write_run(runs, rec("lstm_lm", "fp32", 0, metrics={"perplexity": 100.0, "loss": 4.6}, **lm))
    write_run(runs, rec("lstm_lm", "fp32", 1, metrics={"perplexity": 110.0, "loss": 4.7}, **lm))
    write_run(runs, rec("lstm_lm", "no_scaling", 0, status="diverged", diverged_at_step=300, **lm))
    write_run(runs, rec("lstm_lm", "no_scaling", 1, status="diverged", diverged_at_step=310, **lm))
    write_run(runs, rec("lstm_lm", "mixed", 0, metrics={"perplexity": 104.0}, **lm))
    write_run(runs, rec("lstm_lm", "mixed", 1, status="diverged", diverged_at_step=5, **lm))
    # DCGAN
    gan = dict(task="gan", data="digits")
    write_run(runs, rec("dcgan", "fp32", 0, metrics={"d_loss": 1.0, "g_loss": 2.0}, **gan))
    write_run(runs, rec("dcgan", "mixed", 0, metrics={"d_loss": 1.25, "g_loss": 2.5}, **gan))
    # unreadable records: broken JSON, another schema version; and a run without metrics.csv
    broken = runs / "googlenet" / "mixed-smoke" / "seed0"
    broken.mkdir(parents=True)
    (broken / "run.json").write_text("{not json")
    old = runs / "googlenet" / "fp32-smoke" / "seed0"
    old.mkdir(parents=True)
    (old / "run.json").write_text(
        json.dumps({**make_record("googlenet", "fp32", 0), "schema_version": 0})
    )
    write_run(runs, rec("inception_v3", "fp32", 0, metrics={"top1": 30.0}), metrics_csv=False)

    out = root / "report"
    assert cli.main([str(runs), "--out", str(out), "--quiet"]) == 0
    return runs, out


def read_csv(out: Path, slug: str) -> pd.DataFrame:
    return pd.read_csv(out / "tables" / f"{slug}.csv", dtype=str, keep_default_na=False)


def row(frame: pd.DataFrame, column: str, value: str) -> pd.Series:
    rows = frame[frame[column] == value]
    assert len(rows) == 1, f"{value!r} in {column}: {len(rows)} rows"
    return rows.iloc[0]


def test_table1_smoke_cells(results):
    _, out = results
    t = read_csv(out, "table1_smoke_synthetic_cpu")
    assert list(t["Model"]) == list(table1_reference()["label"])  # all six rows, the paper's order
    resnet = row(t, "Model", "ResNet-50 (pre-activation)")
    assert resnet["paper fp32 [P]"] == "75.92" and resnet["paper mixed [P]"] == "76.04"
    assert resnet["ours fp32"] == "10.50 ± 0.71 (n=2)"  # mean 10.5, sample std sqrt(0.5)
    assert resnet["ours mixed"] == "12.00 ± 2.00 (n=3)"  # never mixed with the imagenet run (50)
    assert resnet["ours no_scaling"] == "diverged at step 4"
    assert resnet["Δ mixed − fp32 (ours)"] == "+1.50"
    # a smoke run on synthetic data is not compared with the paper
    assert resnet["Δ fp32 vs paper"] == "n/c" and resnet["Δ mixed vs paper"] == "n/c"
    alexnet = row(t, "Model", "AlexNet")
    assert alexnet["ours fp32"] == "20.00 (n=1)"
    assert (
        alexnet["ours mixed"] == "" and alexnet["Δ mixed − fp32 (ours)"] == ""
    )  # missing, not zero
    # presets that ran somewhere in this setting are the columns, in the canonical order
    assert [c for c in t.columns if c.startswith("ours ")] == [
        "ours fp32",
        "ours mixed",
        "ours no_scaling",
    ]
    # the failed fp16 run and the running vgg16 run are not in the table
    assert row(t, "Model", "VGG-D")["ours mixed"] == ""


def test_table1_paper_budget_differences(results):
    _, out = results
    t = read_csv(out, "table1_paper_imagenet_cuda-nvidia-h100-80gb-hbm3")
    resnet = row(t, "Model", "ResNet-50 (pre-activation)")
    assert resnet["ours fp32"] == "76.00 ± 0.71 (n=2)"
    assert resnet["ours mixed"] == "76.00 (n=1)"
    assert resnet["Δ fp32 vs paper"] == "+0.08"  # 76.00 - 75.92
    assert resnet["Δ mixed vs paper"] == "-0.04"  # 76.00 - 76.04
    assert resnet["Δ mixed − fp32 (ours)"] == "+0.00"
    assert row(t, "Model", "AlexNet")["Δ fp32 vs paper"] == ""  # did not run: blank


def test_real_and_synthetic_are_separate_tables(results):
    _, out = results
    t = read_csv(out, "table1_smoke_imagenet_cpu")
    assert row(t, "Model", "ResNet-50 (pre-activation)")["ours mixed"] == "50.00 (n=1)"


def test_captions_state_setting_and_comparability(results):
    _, out = results
    report = (out / "report.md").read_text()
    assert "*budget=smoke on synthetic data, device cpu: random inputs check the pipeline" in report
    assert "not comparable with the paper" in report
    assert (
        "*budget=paper on imagenet data, device cuda: NVIDIA H100 80GB HBM3: the full recipe on "
        "the "
        "paper's data set: comparable with the paper's numbers.*"
    ) in report
    assert (
        "*budget=smoke on digits data, device cpu: checks the pipeline, not comparable with the "
        "paper.*" in report
    )
    # every table has a caption line straight after its title
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("### ") and i + 2 < len(lines) and lines[i + 2].startswith("|"):
            pytest.fail(f"table without caption: {line}")


def test_other_classification_lm_and_gan(results):
    _, out = results
    demo = row(read_csv(out, "classification_smoke_digits_cpu"), "Experiment", "demo")
    assert (demo["fp32"], demo["mixed"], demo["Δ mixed − fp32"]) == (
        "90.00 (n=1)",
        "91.00 (n=1)",
        "+1.00",
    )
    lm = row(read_csv(out, "lm_smoke_corpus_cpu"), "Experiment", "lstm_lm")
    assert lm["Metric"] == "perplexity"
    assert lm["fp32"] == "105.00 ± 7.07 (n=2)"
    assert lm["no_scaling"] == "diverged at steps 300, 310"
    assert lm["mixed"] == "104.00 (n=1); 1 of 2 diverged at step 5"
    gan = read_csv(out, "gan_smoke_digits_cpu")
    mixed = row(gan, "Preset", "mixed")
    assert (mixed["Outcome"], mixed["d_loss"], mixed["g_loss"]) == (
        "1 completed",
        "1.250 (n=1)",
        "2.500 (n=1)",
    )
    report = (out / "report.md").read_text()
    assert "Paper (§4.5, Figure 5 [S]), no_scaling: diverges after ~300K iterations" in report
    assert "Paper (§4.6, Figure 6 [S]), mixed: trained without loss scaling" in report


def test_cost_ratios(results):
    _, out = results
    cost = read_csv(out, "cost_smoke_cpu")
    fp32 = cost[
        (cost["Experiment"] == "resnet50")
        & (cost["Data"] == "synthetic")
        & (cost["Preset"] == "fp32")
    ].iloc[0]
    mixed = cost[
        (cost["Experiment"] == "resnet50")
        & (cost["Data"] == "synthetic")
        & (cost["Preset"] == "mixed")
    ].iloc[0]
    assert fp32["Wall time (s)"] == "15.0"
    assert fp32["Samples/s"] == "110.0 ± 14.1 (n=2)"
    assert fp32["Samples/s ÷ fp32"] == "1.00"
    assert mixed["Samples/s"] == "220.0 ± 20.0 (n=3)"
    assert mixed["Samples/s ÷ fp32"] == "2.00"
    assert mixed["Peak memory (MiB)"] == "50.0" and mixed["Memory ÷ fp32"] == "0.50"
    # no fp32 run of the imagenet smoke resnet50: its ratio is blank
    real = cost[(cost["Experiment"] == "resnet50") & (cost["Data"] == "imagenet")].iloc[0]
    assert real["Samples/s ÷ fp32"] == ""
    no_scaling = cost[(cost["Experiment"] == "resnet50") & (cost["Preset"] == "no_scaling")].iloc[0]
    assert (no_scaling["Runs"], no_scaling["Samples/s"]) == ("0 (1 diverged)", "")
    assert "host_max_rss" in (out / "report.md").read_text()


def test_left_out_runs_are_listed_with_reasons(results):
    runs, out = results
    problems = pd.read_csv(out / "problems.csv")
    by_status = problems.groupby("status")["path"].apply(list).to_dict()
    assert by_status["failed"] == [
        str(runs / "resnet50/fp16-smoke/seed0/data=synthetic,device=cpu")
    ]
    assert by_status["running"] == [str(runs / "vgg16/mixed-smoke/seed0/data=synthetic,device=cpu")]
    assert sorted(by_status["unreadable"]) == [
        str(runs / "googlenet/fp32-smoke/seed0"),
        str(runs / "googlenet/mixed-smoke/seed0"),
    ]
    report = (out / "report.md").read_text()
    assert "CUDA out of memory" in report
    assert "cannot parse run.json" in report
    assert "schema_version 0" in report
    assert "still running or interrupted" in report
    assert "metrics.csv missing or unreadable" in report
    # a NaN loss keeps the run in its table but is pointed out
    assert by_status["suspect"] == [
        str(runs / "alexnet/fp32-smoke/seed0/data=synthetic,device=cpu")
    ]
    assert "non-finite final metrics (loss=nan)" in report
    assert (
        "22 run(s) in the tables, 4 left out" in report
    )  # inception_v3: in the table, not in the plots


def parse_markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """Each table of a .md file as rows of cells (header first)."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    cells = [
        [c.strip().replace(r"\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in rows
    ]
    return [r for r in cells if set(r) != {"---"}]


def parse_latex(text: str) -> list[list[str]]:
    body = text.split(r"\toprule")[1].split(r"\bottomrule")[0].replace(r"\midrule", "")
    unescape = {v: k for k, v in LATEX_ESCAPES.items()}
    rows = []
    for line in filter(None, map(str.strip, body.splitlines())):
        cells = [c.strip() for c in line.removesuffix(r" \\").split(" & ")]
        for latex, plain in sorted(unescape.items(), key=lambda kv: -len(kv[0])):
            cells = [c.replace(latex, plain) for c in cells]
        rows.append(cells)
    return rows


def test_markdown_csv_latex_agree(results):
    _, out = results
    csvs = sorted((out / "tables").glob("*.csv"))
    assert len(csvs) >= 8
    report = (out / "report.md").read_text()
    for path in csvs:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        expected = [list(frame.columns)] + frame.values.tolist()
        md = path.with_suffix(".md").read_text()
        assert parse_markdown_tables(md) == expected, path.name
        assert parse_latex(path.with_suffix(".tex").read_text()) == expected, path.name
        assert md.strip() in report  # the report holds the same tables
        tex = path.with_suffix(".tex").read_text()
        assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex


def test_plots_written(results):
    _, out = results
    pngs = {p.name: p for p in (out / "plots").glob("*.png")}
    expected = [
        "resnet50_smoke_synthetic_cpu_curves.png",
        "resnet50_smoke_synthetic_cpu_loss_scale.png",
        "lstm_lm_smoke_corpus_cpu_curves.png",
        "dcgan_smoke_digits_cpu_curves.png",
        "cost_smoke_cpu.png",
        "cost_paper_cuda-nvidia-h100-80gb-hbm3.png",
    ]
    for name in expected:
        data = pngs[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    assert (
        "![resnet50_smoke_synthetic_cpu_curves](plots/resnet50_smoke_synthetic_cpu_curves.png)"
        in (out / "report.md").read_text()
    )


def test_terminal_output_and_missing_folder(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_run(runs, make_record("demo", "fp32", 0, data="digits", metrics={"top1": 80.0}))
    assert cli.main([str(runs), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "80.00 (n=1)" in printed and "# Mixed Precision Training reproduction" in printed
    assert not (tmp_path / "r" / "plots").exists()
    assert cli.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "r2")]) == 2


# The paper's Table 1 (§4.1, read in the paper's own text; papers.md §1(b)), typed here to check the
# package's reference file against an independent copy.
PAPER_TABLE1 = {
    "alexnet": (56.77, 56.93),
    "vgg16": (65.40, 65.43),
    "googlenet": (68.33, 68.43),
    "inception_v2": (70.03, 70.02),
    "inception_v3": (73.85, 74.13),
    "resnet50": (75.92, 76.04),
}


def test_reference_has_every_table1_value():
    t1 = table1_reference().set_index("experiment")
    assert set(t1.index) == set(PAPER_TABLE1)
    for model, (fp32, mixed) in PAPER_TABLE1.items():
        assert math.isclose(t1.loc[model, "fp32"], fp32) and math.isclose(
            t1.loc[model, "mixed"], mixed
        )
    assert set(t1["confidence"]) == {"P"}


# the team's research notes, beside the repository (not part of the product)
NOTES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "papers.md"


@pytest.mark.skipif(not NOTES.exists(), reason="reference notes not on this machine")
def test_reference_matches_papers_md():
    """Every number cell of papers.md's Table 1, 2 and 3 is in the reference file."""
    text = NOTES.read_text()
    ref = load_reference()
    for table, heading in (
        ("table1", "**Table 1:"),
        ("table2", "**Table 2:"),
        ("table3", "**Table 3:"),
    ):
        block = text.split(heading)[1].split("\n\n", 2)[1]
        numbers = [
            float(n)
            for line in block.splitlines()[2:]
            for n in re.findall(r"\|\s*([0-9]+\.[0-9]+)%?\s*(?=\|)", line)
        ]
        assert numbers, table
        assert sorted(numbers) == sorted(
            ref.loc[(ref["table"] == table) & ref["value"].notna(), "value"]
        ), table
    assert (ref.loc[ref["key"] == "table2.ssd.no_scaling", "outcome"] == "diverges").all()


def test_every_reference_row_is_labelled():
    ref = load_reference()
    assert ref["key"].is_unique
    assert set(ref["confidence"]) <= {"P", "S", "U"}
    assert (ref["source"].str.len() > 0).all()
    assert ((ref["value"].notna()) | (ref["outcome"].str.len() > 0)).all()


def test_paper_tables_show_the_papers_digits(results):
    _, out = results
    t2 = read_csv(out, "table2_paper")
    ssd = row(t2, "Model", "Multibox SSD")
    assert (ssd["fp32"], ssd["no_scaling"], ssd["mixed"]) == ("76.9", "diverges", "77.1")
    assert ssd["Source"] == "§4.2, Table 2 [S]"
    english = row(read_csv(out, "table3_paper"), "Model", "English (WSJ '92)")
    assert (english["fp32"], english["mixed"]) == ("2.20", "1.99")
    claims = read_csv(out, "claims_paper")
    assert "diverges after ~300K iterations" in set(claims["Claim"])


def test_runs_differing_only_in_overrides_are_not_averaged_as_seeds(tmp_path):
    from mpt_repro.report.collect import load_runs

    plain = write_run(
        tmp_path, make_record("demo", "fp32", 0, data="digits", metrics={"top1": 90.0})
    )
    other = plain / "optim.lr=0.5"  # the same settings and seed, plus an extra override
    other.mkdir()
    (other / "run.json").write_text(
        json.dumps(make_record("demo", "fp32", 0, data="digits", metrics={"top1": 10.0}))
    )
    runs, problems = load_runs(tmp_path)
    assert runs["metric_top1"].tolist() == [90.0]  # not 50 = the mean of two "seeds"
    assert [(p.path, p.status) for p in problems] == [(str(other), "variant")]
