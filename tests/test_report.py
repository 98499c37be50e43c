"""mpt-report on run records with known numbers: exact cells, formats, plots, references.

Every record is a copy of a real run.json (tests/test_report_records.py runs mpt-run once per
session), with its setting and numbers changed the way the writer holds them, so the reporter is
tested on the shapes the writer produces: diverged and failed records carry no `metrics`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from test_report_records import derive, finish, real_record, write_record

from mpt_repro import catalog
from mpt_repro.paper import load_reference, table1_reference
from mpt_repro.report import cli
from mpt_repro.report.render import LATEX_ESCAPES

# the device fields as describe_device writes them (run.py)
CPU = {"type": "cpu", "name": "x86_64", "count": 2}
GPU = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1}
CPU_SLUG, GPU_SLUG = "cpu-x86_64-2", "cuda-nvidia-h100-80gb-hbm3"
MiB = 2**20
# what each task's records name as their primary metric (the task classes' attributes)
TASK_METRIC = {
    "classification": ("top1", True),
    "language_model": ("perplexity", False),
    "gan": ("g_loss", False),
    "detection": ("map", True),
    "speech": ("cer", False),
    "segmentation": ("miou", True),  # a task the reporter has no presentation for
}


def rec(
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
    **fields,
):
    """A real record (completed, diverged or failed, as `status` asks) moved to this setting."""
    metric, higher = TASK_METRIC[task]
    kind = status if status in ("completed", "diverged", "failed") else "completed"
    # a detection record is a copy of the real SSD run's (its metrics_detail, its data fields)
    source = "detection" if task == "detection" and kind != "failed" else kind
    base = derive(
        real_record(source),
        experiment=experiment,
        task=task,
        precision=precision,
        seed=seed,
        budget=budget,
        data=data,
        device=device,
        primary_metric=metric,
        higher_is_better=higher,
        samples_per_s=samples_per_s,
        peak_memory_bytes=peak_memory_bytes,
        wall_time_s=wall_time_s,
        **fields,
    )
    if kind == "completed":
        base["metrics"] = metrics or {}
    if status == "diverged":
        base = finish(
            base,
            "diverged",
            reason or "loss was non-finite for 10 consecutive steps",
            diverged_at_step=diverged_at_step,
            metrics_detail=None,  # no evaluation before it diverged
        )
        base.pop("metrics", None)
    elif status == "failed":
        base = finish(base, "failed", reason)
    elif status != "completed":  # running: as written at the start, before any result
        base = finish(base, status, reason)
        base.pop("metrics")
    return base


def write_run(root: Path, record: dict, metrics_csv: bool = True) -> Path:
    """Where mpt-run puts it (<experiment>/<precision>-<budget>/seed<N>/<overrides>), with the
    real demo run's metrics.csv (for the plots)."""
    extra = f"data={record['data']['name']},device={record['device']['type']}"
    return write_record(root, record, extra, curves_from="completed" if metrics_csv else None)


# the paper's Table 2 experiments, as the detection branch configures them (conf/experiment/
# ssd.yaml, faster_rcnn.yaml: task detection on data=voc); added for the tests when this checkout's
# conf/ does not have them yet
DETECTION = {
    "ssd": catalog.Experiment("ssd", "detection", "voc", "ssd"),
    "faster_rcnn": catalog.Experiment("faster_rcnn", "detection", "voc", "faster_rcnn"),
}
VOC_CLASSES = ("aeroplane", "bicycle", "bird")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results folder with known numbers, and the report built from it."""
    known = catalog.experiments()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(catalog, "experiments", lambda: {**DETECTION, **known})
        yield _results(tmp_path_factory)


def _results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    runs = root / "runs"
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
    write_run(runs, rec("resnet50", "no_scaling", 0, status="diverged", diverged_at_step=4))
    write_run(runs, rec("resnet50", "fp16", 0, status="failed", reason="CUDA out of memory"))
    write_run(runs, rec("vgg16", "mixed", 0, status="running"))
    write_run(runs, rec("alexnet", "fp32", 0, metrics={"top1": 20.0, "loss": float("nan")}))
    # the same experiment on real data must never be averaged with the synthetic runs
    write_run(runs, rec("resnet50", "mixed", 0, data="imagenet", metrics={"top1": 50.0}))
    # the paper budget on ImageNet on a GPU: comparable with the paper
    paper_gpu = dict(budget="paper", data="imagenet", device=GPU)
    for seed, top1 in ((0, 75.5), (1, 76.5)):
        write_run(runs, rec("resnet50", "fp32", seed, metrics={"top1": top1}, **paper_gpu))
    write_run(runs, rec("resnet50", "mixed", 0, metrics={"top1": 76.0}, **paper_gpu))
    # demo (another classification experiment)
    write_run(runs, rec("demo", "fp32", 0, data="digits", metrics={"top1": 90.0}))
    write_run(runs, rec("demo", "mixed", 0, data="digits", metrics={"top1": 91.0}))
    # language model: fp32 two seeds; no_scaling diverges (two steps); mixed one completed, one
    # diverged
    lm = dict(task="language_model", data="corpus")
    write_run(runs, rec("lstm_lm", "fp32", 0, metrics={"perplexity": 100.0, "loss": 4.6}, **lm))
    write_run(runs, rec("lstm_lm", "fp32", 1, metrics={"perplexity": 110.0, "loss": 4.7}, **lm))
    for seed, step in ((0, 300), (1, 310)):
        write_run(
            runs, rec("lstm_lm", "no_scaling", seed, status="diverged", diverged_at_step=step, **lm)
        )
    write_run(runs, rec("lstm_lm", "mixed", 0, metrics={"perplexity": 104.0}, **lm))
    write_run(runs, rec("lstm_lm", "mixed", 1, status="diverged", diverged_at_step=5, **lm))
    # DCGAN
    gan = dict(task="gan", data="digits")
    write_run(runs, rec("dcgan", "fp32", 0, metrics={"d_loss": 1.0, "g_loss": 2.0}, **gan))
    write_run(runs, rec("dcgan", "mixed", 0, metrics={"d_loss": 1.25, "g_loss": 2.5}, **gan))
    # detection (Table 2): the paper budget on VOC on a GPU, and a smoke run on synthetic images
    voc = dict(task="detection", budget="paper", data="voc", device=GPU)
    for experiment, preset, seed, mean_ap, aps in (
        ("ssd", "fp32", 0, 76.5, (80.0, 84.0, 70.0)),
        ("ssd", "fp32", 1, 77.5, (82.0, 86.0, 72.0)),
        ("ssd", "mixed", 0, 77.0, (81.0, 85.0, 71.0)),
        ("ssd", "adaptive", 0, 76.8, (81.0, 85.0, 70.0)),
        ("faster_rcnn", "fp32", 0, 69.0, (70.0, 71.0, 60.0)),
        ("faster_rcnn", "no_scaling", 0, 68.0, (69.0, 70.0, 59.0)),
        ("faster_rcnn", "mixed", 0, 69.5, (70.5, 71.5, 60.5)),
    ):
        write_run(
            runs,
            rec(
                experiment,
                preset,
                seed,
                metrics={"map": mean_ap, "loss": 3.0},
                # the real record's detail, with VOC's class names as on VOC data
                metrics_detail={
                    **real_record("detection")["metrics_detail"],
                    "per_class_ap": dict(zip(VOC_CLASSES, aps)),
                },
                **voc,
            ),
        )
    write_run(
        runs,
        rec(
            "ssd",
            "no_scaling",
            0,
            status="diverged",
            diverged_at_step=120,
            diverged_layer="backbone.features.0",
            **voc,
        ),
    )
    write_run(
        runs,
        rec("ssd", "fp32", 0, task="detection", metrics={"map": 0.5, "loss": 20.0}),
    )
    # a task the reporter has never heard of: a table with every numeric metric
    seg = dict(task="segmentation", data="cityscapes")
    write_run(
        runs, rec("unet", "fp32", 0, metrics={"miou": 40.0, "pixel_acc": 80.0, "loss": 1.0}, **seg)
    )
    write_run(
        runs, rec("unet", "amp", 0, metrics={"miou": 41.0, "pixel_acc": 81.0, "loss": 0.9}, **seg)
    )
    # unreadable records: a truncated real record and one of another schema version; and a run
    # without metrics.csv
    text = json.dumps(real_record("completed"))
    broken = runs / "googlenet" / "mixed-smoke" / "seed0"
    broken.mkdir(parents=True)
    (broken / "run.json").write_text(text[: len(text) // 3])
    old = runs / "googlenet" / "fp32-smoke" / "seed0"
    old.mkdir(parents=True)
    (old / "run.json").write_text(json.dumps({**rec("googlenet", "fp32", 0), "schema_version": 0}))
    write_run(runs, rec("inception_v3", "fp32", 0, metrics={"top1": 30.0}), metrics_csv=False)

    out = root / "report"
    # plots take most of a report's time: test_plots_written draws them for a smaller folder
    assert cli.main([str(runs), "--out", str(out), "--quiet", "--no-plots"]) == 0
    return runs, out


def read_csv(out: Path, slug: str) -> pd.DataFrame:
    return pd.read_csv(out / "tables" / f"{slug}.csv", dtype=str, keep_default_na=False)


def row(frame: pd.DataFrame, column: str, value: str) -> pd.Series:
    rows = frame[frame[column] == value]
    assert len(rows) == 1, f"{value!r} in {column}: {len(rows)} rows"
    return rows.iloc[0]


def test_table1_smoke_cells(results):
    _, out = results
    t = read_csv(out, f"table1_smoke_synthetic_{CPU_SLUG}")
    assert list(t["Model"]) == list(table1_reference()["label"])  # all six rows, the paper's order
    resnet = row(t, "Model", "ResNet-50 (pre-activation)")
    assert resnet["paper fp32 [P]"] == "75.92" and resnet["paper mixed [P]"] == "76.04"
    assert resnet["ours fp32"] == "10.50 ± 0.71 (n=2)"  # mean 10.5, sample std sqrt(0.5)
    assert resnet["ours mixed"] == "12.00 ± 2.00 (n=3)"  # never mixed with the imagenet run (50)
    assert resnet["ours no_scaling"] == "diverged at step 4"
    # paired by seed: seeds 0 and 1 ran under both (mixed − fp32 = 0, +1): mean +0.5, sd 0.707;
    # 95% CI = 0.5 ± t(0.975, 1) · 0.707 / √2 = 0.5 ± 12.706 · 0.5 = [−5.85, +6.85], the seeds'
    # alone: these records keep no per-item results
    assert resnet["Δ mixed − fp32 (ours, 95% CI)"] == "+0.50 [-5.85, +6.85] (n=2; seeds only)"
    assert resnet["mixed vs fp32"] == (
        "no verdict: 2 paired seeds; a verdict needs at least 3 (mpt-run -m ... seed=0,1,2)"
    )
    # a smoke run on synthetic data is not compared with the paper
    assert resnet["Δ fp32 vs paper"] == "n/c" and resnet["Δ mixed vs paper"] == "n/c"
    alexnet = row(t, "Model", "AlexNet")
    assert alexnet["ours fp32"] == "20.00 (n=1); loss non-finite in 1 of 1"  # flagged
    assert (
        alexnet["ours mixed"] == "" and alexnet["Δ mixed − fp32 (ours, 95% CI)"] == ""
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
    t = read_csv(out, f"table1_paper_imagenet_{GPU_SLUG}")
    resnet = row(t, "Model", "ResNet-50 (pre-activation)")
    assert resnet["ours fp32"] == "76.00 ± 0.71 (n=2)"
    assert resnet["ours mixed"] == "76.00 (n=1)"
    assert resnet["Δ fp32 vs paper"] == "+0.08"  # 76.00 - 75.92
    assert resnet["Δ mixed vs paper"] == "-0.04"  # 76.00 - 76.04
    # the difference of means would be 76.00 − 76.00 = 0; paired on seed 0: 76.0 − 75.5
    assert resnet["Δ mixed − fp32 (ours, 95% CI)"] == "+0.50 (n=1)"
    assert resnet["mixed vs fp32"] == (
        "no verdict: 1 paired seed; a verdict needs at least 3 (mpt-run -m ... seed=0,1,2)"
    )
    assert row(t, "Model", "AlexNet")["Δ fp32 vs paper"] == ""  # did not run: blank


def test_real_and_synthetic_are_separate_tables(results):
    _, out = results
    t = read_csv(out, f"table1_smoke_imagenet_{CPU_SLUG}")
    assert row(t, "Model", "ResNet-50 (pre-activation)")["ours mixed"] == "50.00 (n=1)"


def test_captions_state_setting_and_comparability(results):
    _, out = results
    report = (out / "report.md").read_text()
    # which network and optimizer produced the numbers (the records' model and config)
    assert "Networks, optimizers and recipes behind our numbers: " in report
    assert (
        "*budget=smoke on synthetic data, device cpu: x86_64 ×2: random inputs check the pipeline"
        in report
    )
    assert (
        "*budget=paper on imagenet data, device cuda: NVIDIA H100 80GB HBM3: the full recipe on "
        "the paper's data set: comparable with the paper's numbers.*"
    ) in report
    # a trimmed budget is described in its own words, from conf/budget/smoke.yaml
    smoke = catalog.budgets()["smoke"].description
    assert smoke and (
        f"*budget=smoke on digits data, device cpu: x86_64 ×2: {smoke}; not comparable with the "
        "paper.*" in report
    )
    # every table has a caption line straight after its title
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("### ") and i + 2 < len(lines) and lines[i + 2].startswith("|"):
            pytest.fail(f"table without caption: {line}")


def test_other_classification_lm_and_gan(results):
    _, out = results
    demo = row(read_csv(out, f"classification_smoke_digits_{CPU_SLUG}"), "Experiment", "demo")
    assert (demo["fp32"], demo["mixed"], demo["Δ mixed − fp32 (95% CI)"]) == (
        "90.00 (n=1)",
        "91.00 (n=1)",
        "+1.00 (n=1)",
    )
    lm = row(read_csv(out, f"lm_smoke_corpus_{CPU_SLUG}"), "Experiment", "lstm_lm")
    assert lm["Metric"] == "perplexity"
    assert lm["fp32"] == "105.00 ± 7.07 (n=2)"
    assert lm["no_scaling"] == "diverged at steps 300, 310"
    assert lm["mixed"] == "104.00 (n=1); 1 of 2 diverged at step 5"
    gan = read_csv(out, f"gan_smoke_digits_{CPU_SLUG}")
    assert list(gan.columns) == [
        "Experiment",
        "Preset",
        "Outcome",
        "d_loss",
        "g_loss",
        "Δ to fp32 (95% CI)",
        "vs fp32",
    ]
    # the primary metric (g_loss, lower is better): 2.5 − 2.0 on seed 0
    assert row(gan, "Preset", "mixed")["Δ to fp32 (95% CI)"] == "+0.500 (n=1)"
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
    cost = read_csv(out, f"cost_smoke_{CPU_SLUG}")
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
    assert mixed["Peak memory (MiB)"] == "50.0 (host_peak_rss)"
    assert mixed["Peak memory ÷ fp32"] == "0.50"
    # no fp32 run of the imagenet smoke resnet50: its ratio is blank
    real = cost[(cost["Experiment"] == "resnet50") & (cost["Data"] == "imagenet")].iloc[0]
    assert real["Samples/s ÷ fp32"] == ""
    no_scaling = cost[(cost["Experiment"] == "resnet50") & (cost["Preset"] == "no_scaling")].iloc[0]
    assert (no_scaling["Runs"], no_scaling["Samples/s"]) == ("0 (1 diverged)", "")
    assert (
        "host_peak_rss: the process's peak resident set since the run began"
        in (out / "report.md").read_text()
    )


def test_left_out_runs_are_listed_with_reasons(results):
    runs, out = results
    problems = pd.read_csv(out / "problems.csv", dtype=str, keep_default_na=False)
    by_status = problems.groupby("status")["path"].apply(list).to_dict()
    cpu = "data=synthetic,device=cpu"
    assert by_status["failed"] == [str(runs / "resnet50/fp16-smoke/seed0" / cpu)]
    assert by_status["running"] == [str(runs / "vgg16/mixed-smoke/seed0" / cpu)]
    assert sorted(by_status["malformed"]) == [
        str(runs / "googlenet/fp32-smoke/seed0"),
        str(runs / "googlenet/mixed-smoke/seed0"),
    ]
    report = (out / "report.md").read_text()
    assert "(resnet50 fp16 smoke seed0): CUDA out of memory" in report
    assert "cannot parse run.json" in report
    assert "schema_version 0" in report
    assert "still running, or killed" in report
    # a NaN loss keeps the run in its table but is pointed out
    # and so is inception_v3, whose metrics.csv is missing (issue 34: the report said nothing)
    assert sorted(by_status["suspect"]) == [
        str(runs / "alexnet/fp32-smoke/seed0" / cpu),
        str(runs / "inception_v3/fp32-smoke/seed0" / cpu),
    ]
    assert "non-finite final metrics (loss=nan); kept in the tables" in report
    assert "its record's files are incomplete: metrics.csv missing" in report
    # alexnet (NaN loss) is in the tables and listed to check
    assert "33 run(s) in the tables, 4 left out" in report


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


def test_plots_written(tmp_path):
    runs = tmp_path / "runs"
    for seed, top1 in ((0, 10.0), (1, 12.0)):
        write_run(runs, rec("resnet50", "fp32", seed, metrics={"top1": top1}))
    write_run(runs, rec("resnet50", "mixed", 0, metrics={"top1": 11.0}))
    write_run(runs, rec("resnet50", "no_scaling", 0, status="diverged", diverged_at_step=4))
    write_run(runs, rec("resnet50", "mixed", 0, metrics={"top1": 1.0}, budget="paper", device=GPU))
    write_run(runs, rec("inception_v3", "fp32", 0, metrics={"top1": 30.0}), metrics_csv=False)
    out = tmp_path / "report"
    assert cli.main([str(runs), "--out", str(out), "--quiet"]) == 0
    pngs = {p.name: p for p in (out / "plots").glob("*.png")}
    expected = [
        f"resnet50_smoke_synthetic_{CPU_SLUG}_curves.png",
        f"resnet50_smoke_synthetic_{CPU_SLUG}_loss_scale.png",
        f"resnet50_paper_synthetic_{GPU_SLUG}_curves.png",
        f"cost_smoke_{CPU_SLUG}.png",
    ]
    for name in expected:
        data = pngs[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    report = (out / "report.md").read_text()
    stem = f"resnet50_smoke_synthetic_{CPU_SLUG}_curves"
    assert f"![{stem}](plots/{stem}.png)" in report
    # in the table, not in the plots, and said so
    assert "metrics.csv missing or unreadable" in report
    assert "6 run(s) in the tables, 0 left out" in report
    # the paper-budget GPU runs have no fp32 to divide by: no cost figure (the table has them)
    assert f"cost_paper_{GPU_SLUG}.png" not in pngs


def test_terminal_output_and_missing_folder(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_run(runs, rec("demo", "fp32", 0, data="digits", metrics={"top1": 80.0}))
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


# the team's research notes, beside the repository (not part of the product); a worktree sits one
# level deeper than the main checkout
NOTES = next(
    (
        p / "shared" / "reference" / "papers.md"
        for p in Path(__file__).resolve().parents
        if (p / "shared" / "reference" / "papers.md").exists()
    ),
    Path("/nonexistent"),
)


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
    # no speech run here: the paper's Table 3 is the speech plugin's, shown beside its runs only
    # (tests/test_report_own.py shows it where they are)
    assert not (out / "tables" / "table3_paper.csv").exists()
    claims = read_csv(out, "claims_paper")
    # the claims about experiments with runs here (lstm_lm, dcgan), none about one without
    assert "diverges after ~300K iterations" in set(claims["Claim"])
    assert "trained without loss scaling" in set(claims["Claim"])
    assert not any("slight degradation" in c for c in claims["Claim"])  # translation: no runs


def test_runs_differing_in_a_setting_are_separate_groups_labelled_by_the_key(tmp_path):
    """optim.lr=0.5 beside the recipe's rate: two comparison groups, each named by the key that
    differs; never averaged as seeds, never a difference across settings."""
    from mpt_repro.report.collect import load_runs

    plain = rec("demo", "fp32", 0, data="digits", metrics={"top1": 90.0})
    lr = plain["config"]["optim"]["lr"]
    write_run(tmp_path, plain)
    write_run(tmp_path, rec("demo", "mixed", 0, data="digits", metrics={"top1": 91.0}))
    changed = rec("demo", "mixed", 0, data="digits", metrics={"top1": 10.0})
    changed["config"]["optim"]["lr"] = 0.5
    write_record(tmp_path, changed, "optim.lr=0.5")
    runs, problems = load_runs(tmp_path)
    assert not problems
    labels = dict(zip(runs["metric_top1"], runs["row_label"]))
    assert labels == {
        90.0: f"demo [optim.lr={lr}]",
        91.0: f"demo [optim.lr={lr}]",
        10.0: "demo [optim.lr=0.5]",
    }
    out = tmp_path / "report"
    assert cli.main([str(tmp_path), "--out", str(out), "--quiet", "--no-plots"]) == 0
    table = read_csv(out, "classification_smoke_digits_" + CPU_SLUG).set_index("Experiment")
    assert table.loc[f"demo [optim.lr={lr}]", "Δ mixed − fp32 (95% CI)"] == "+1.00 (n=1)"
    assert table.loc["demo [optim.lr=0.5]", "fp32"] == ""  # no fp32 under lr=0.5: no difference
    assert table.loc["demo [optim.lr=0.5]", "Δ mixed − fp32 (95% CI)"] == ""


# ---------------------------------------------------------------- Table 2 (detection)


def test_table2_side_by_side_with_the_paper(results):
    _, out = results
    t2 = read_csv(out, f"table2_paper_voc_{GPU_SLUG}")
    assert list(t2.columns) == [
        "Model",
        "paper: Baseline [S]",
        "paper: MP without loss-scale [S]",
        "paper: MP with loss-scale [S]",
        "ours fp32",
        "ours mixed",
        "ours adaptive",  # any other preset that ran, in the display order
        "ours no_scaling",
        "fp32 vs paper",
        "no_scaling vs paper",
        "mixed vs paper",
        "Δ mixed − fp32 (ours, 95% CI)",
        "mixed vs fp32",
    ]
    ssd = row(t2, "Model", "Multibox SSD")
    assert (ssd["paper: Baseline [S]"], ssd["paper: MP without loss-scale [S]"]) == (
        "76.9",
        "diverges",
    )
    assert ssd["paper: MP with loss-scale [S]"] == "77.1"
    assert ssd["ours fp32"] == "77.0 ± 0.7 (n=2)"
    assert ssd["ours no_scaling"] == "diverged at step 120 (layer backbone.features.0)"
    assert ssd["no_scaling vs paper"] == "diverged, as in the paper"
    assert (ssd["fp32 vs paper"], ssd["mixed vs paper"]) == ("+0.1", "-0.1")  # 77.0-76.9, -77.1
    frcnn = row(t2, "Model", "Faster R-CNN")
    assert (frcnn["paper: Baseline [S]"], frcnn["paper: MP with loss-scale [S]"]) == (
        "69.1",
        "69.7",
    )
    assert frcnn["ours no_scaling"] == "68.0 (n=1)" and frcnn["no_scaling vs paper"] == "-0.6"
    assert frcnn["ours adaptive"] == "" and frcnn["Δ mixed − fp32 (ours, 95% CI)"] == "+0.5 (n=1)"
    report = (out / "report.md").read_text()
    assert "Baseline = our fp32, MP without loss-scale = our no_scaling" in report


def test_a_cost_row_gives_peak_memory_and_saved_bytes_in_mib():
    """One row of the cost table from one group's means (the records of `results` carry no saved
    bytes, so the unit of that column is pinned here)."""
    from mpt_repro.report.tables import _cost_row

    means = {"saved_bytes_per_sample_mean": 3 * MiB, "peak_memory_bytes_mean": 50 * MiB}
    g = pd.Series({**means, "peak_memory_kind": "host_peak_rss", "n_completed": 1, "n_diverged": 0})
    row = _cost_row("demo", "digits", "mixed", g, None)
    assert row["Peak memory (MiB)"] == "50.0 (host_peak_rss)"
    assert row["Saved for backward (MiB/sample)"] == "3.00"


def test_one_vocabulary_of_verdicts_read_against_zero_and_the_tolerance():
    """The verdict's sides are at zero, whatever the metric's scale: a CI of (0.2, 0.6) wholly
    past a tolerance of 0.1 is better in top-1 and worse in perplexity; a CI inside ±X that
    excludes 0 is a difference within tolerance, never "matches"; one that excludes 0 and
    crosses X differs by an unresolved amount (issue 41)."""
    from mpt_repro.report.compare import Delta, EvalEvidence, verdict

    def delta(low: float, high: float, higher_is_better: bool) -> Delta:
        found = Delta("mixed", "m", higher_is_better, 3, (low + high) / 2, low, high, 0.1, 0, 3, "")
        found.sd, found.evidence = 0.2, EvalEvidence(1000, "images", 0.01, None)
        return found

    past = "by more than 0.1 (CI wholly past it)"
    assert verdict(delta(0.2, 0.6, True)) == f"better: {past}"
    assert verdict(delta(0.2, 0.6, False)) == f"worse: {past}"
    assert verdict(delta(-0.6, -0.2, True)) == f"worse: {past}"
    assert verdict(delta(-0.6, -0.2, False)) == f"better: {past}"
    assert verdict(delta(-0.05, 0.05, True)) == "matches FP32 (CI within ±0.1)"
    inside = delta(-0.09, -0.01, True)
    assert verdict(inside) == "differs within tolerance: worse than FP32, by less than 0.1"
    assert inside.decision == "differs"
    crossing = delta(0.05, 0.3, True)
    assert verdict(crossing).startswith(
        "differs: better than FP32; whether by more than 0.1 is not resolved (CI crosses it); "
    )
    assert verdict(delta(-0.2, 0.6, True)).startswith("no verdict: CI wider than ±0.1; about ")


def test_the_recipe_label_names_the_network_variant_optimizer_and_recipe():
    from mpt_repro.report.collect import recipe_label

    record = {
        "model": {"name": "alexnet", "variant": "caffe"},
        "config": {"optim": {"name": "sgd"}},
    }
    assert recipe_label(record) == "alexnet (caffe), sgd"
    record["config"]["recipe"] = "public"
    assert recipe_label(record) == "alexnet (caffe), sgd, public recipe"


def test_the_paper_s_divergence_is_matched_only_when_every_seed_diverged():
    """A paper cell that "diverges" (Table 2, MP without loss-scale): ours matches it only when no
    seed completed; seeds that completed are counted, never hidden behind "as in the paper"."""
    from mpt_repro.report.tables import versus_paper

    entry = pd.Series({"outcome": "diverges", "value": math.nan})

    def seeds(diverged: int, completed: int) -> pd.Series:
        return pd.Series({"n_diverged": diverged, "n_completed": completed, "map_mean": 70.0})

    assert versus_paper(entry, seeds(2, 0), "map", True) == "diverged, as in the paper"
    assert versus_paper(entry, seeds(1, 2), "map", True) == "2 of 3 did not diverge"
    assert versus_paper(entry, seeds(0, 2), "map", True) == "2 of 2 did not diverge"


def test_table2_smoke_is_not_compared(results):
    _, out = results
    t2 = read_csv(out, f"table2_smoke_synthetic_{CPU_SLUG}")
    ssd = row(t2, "Model", "Multibox SSD")
    assert ssd["ours fp32"] == "0.5 (n=1)" and ssd["fp32 vs paper"] == "n/c"
    assert row(t2, "Model", "Faster R-CNN")["ours fp32"] == ""


def test_table2_per_class_ap(results):
    _, out = results
    t = read_csv(out, f"table2_per_class_paper_voc_{GPU_SLUG}")
    assert list(t["Class"]) == list(VOC_CLASSES)
    bird = row(t, "Class", "bird")
    assert bird["ssd fp32"] == "71.0 ± 1.4 (n=2)"  # (70 + 72) / 2, sd sqrt(2)
    assert bird["faster_rcnn no_scaling"] == "59.0 (n=1)"
    assert "ssd no_scaling" not in t.columns  # a diverged run has no AP


# ---------------------------------------------------------------- names from conf/ and records


def test_a_new_task_gets_a_table_of_every_metric(results):
    _, out = results
    t = read_csv(out, f"segmentation_smoke_cityscapes_{CPU_SLUG}")
    assert list(t.columns) == [
        "Experiment",
        "Preset",
        "Outcome",
        "loss",
        "miou",
        "pixel_acc",
        "Δ to fp32 (95% CI)",
        "vs fp32",
    ]
    amp = row(t, "Preset", "amp")
    assert (amp["Outcome"], amp["miou"], amp["pixel_acc"]) == (
        "1 completed",
        "41.000 (n=1)",
        "81.000 (n=1)",
    )


def test_every_registered_task_gets_a_table(tmp_path):
    """A completed record of each task the registry knows lands in some table."""
    from mpt_repro.report.aggregate import aggregate
    from mpt_repro.report.collect import load_runs
    from mpt_repro.report.tables import all_tables
    from mpt_repro.tasks import registered

    for task in registered():
        metric = TASK_METRIC.get(task, ("loss", False))[0]
        record = rec(f"exp_{task}", "fp32", 0, metrics={metric: 1.0})
        record.update(task=task, primary_metric=metric)
        write_run(tmp_path, record, metrics_csv=False)
    runs, _ = load_runs(tmp_path)
    tables = all_tables(aggregate(runs), runs)
    shown = " ".join(t.frame.to_csv() for t in tables)
    for task in registered():
        assert f"exp_{task}" in shown, task


def test_preset_order_comes_from_what_each_preset_does():
    assert list(catalog.presets()) == catalog.preset_order(catalog.presets())
    order = list(catalog.presets())
    assert order[:2] == ["fp32", "tf32"]  # the FP32 baselines first
    assert order.index("mixed") < order.index("no_master") < order.index("fp16")
    assert order.index("no_scaling") < order.index("fp16") < order.index("bf16")
    # an FP8 preset (an `fp8` mode over an FP32 or BF16 base) goes after the paper's formats
    fp8 = [p for p, c in catalog.presets().items() if (c.get("fp8") or {}).get("mode")]
    assert all(order.index(p) > order.index("bf16") for p in fp8)
    # a preset conf/ does not know is placed by the config its records hold
    custom = {**catalog.presets()["mixed"], "name": "my_fp8", "compute_dtype": "float8_e4m3fn"}
    assert catalog.preset_order(["my_fp8", "bf16", "fp32"], {"my_fp8": custom}) == [
        "fp32",
        "bf16",
        "my_fp8",
    ]


def test_names_cli_lists_conf(capsys):
    assert catalog.main(["presets", "--sep", ","]) == 0
    assert capsys.readouterr().out.strip() == ",".join(catalog.presets())
    assert catalog.main(["table1"]) == 0
    assert capsys.readouterr().out.split() == list(table1_reference()["experiment"])
    catalog.main(["others"])
    others = capsys.readouterr().out.split()
    assert "demo" in others and "resnet50" not in others
    assert set(others) | set(catalog.table1_experiments()) == set(catalog.experiments())


def test_budgets_come_from_conf():
    budgets = catalog.budgets()
    assert set(budgets) == {p.stem for p in (catalog.conf_dir() / "budget").glob("*.yaml")}
    assert not budgets["paper"].trims and budgets["smoke"].trims
    assert catalog.full_recipe("paper", "resnet50") and not catalog.full_recipe("short", "resnet50")


# ---------------------------------------------------------------- plots


def _band_frames(values_by_seed):
    return [
        pd.DataFrame({"step": [2, 4, 6], "split": "train", "loss": values})
        for values in values_by_seed
    ]


def test_a_step_one_seed_did_not_log_is_not_a_mean_of_the_others():
    """Seeds 0-2 logged every 2 steps, seed 3 (trainer.log_every=6, a key that changes nothing
    trained) only at 6: the band keeps step 6, the mean of all four, not steps 2 and 4 of three
    seeds beside step 6 of four; a seed that stopped at 4 (it diverged) leaves 6 to the others."""
    from mpt_repro.report.plots import seed_band

    frames = _band_frames([[3.0, 2.0, 1.0]] * 3)
    frames.append(pd.DataFrame({"step": [6], "split": "train", "loss": [5.0]}))
    band = seed_band(frames, "loss")
    assert band["step"].tolist() == [6] and band["count"].tolist() == [4]
    assert band["mean"].tolist() == [2.0]  # (1 + 1 + 1 + 5) / 4
    stopped = pd.DataFrame({"step": [2, 4], "split": "train", "loss": [9.0, 9.0]})
    band = seed_band([*_band_frames([[3.0, 2.0, 1.0]]), stopped], "loss")
    assert band["step"].tolist() == [2, 4, 6] and band["count"].tolist() == [2, 2, 1]


def test_curves_mean_with_band_one_style_per_preset():
    from mpt_repro.report.plots import curves_figure

    train = {
        "fp32": _band_frames([[3.0, 2.0, 1.0], [5.0, 4.0, 3.0]]),
        "mixed": _band_frames([[3.0, 2.0, 1.0]]),  # overlaps fp32's first seed exactly
    }
    evals = {p: [] for p in train}
    fig = curves_figure(train, evals, {"mixed": [6]}, "top1", "t")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    fp32 = lines["fp32 (mean of 2, min-max band)"]
    assert list(fp32.get_ydata()) == [4.0, 3.0, 2.0]  # the mean, one line for two seeds
    assert lines["mixed"].get_linestyle() != fp32.get_linestyle()  # overlapping stays visible
    assert lines["mixed"].get_color() != fp32.get_color()
    (band,) = ax.collections  # fp32's min-max band
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == 1.0 and ys.max() == 5.0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["fp32 (mean of 2, min-max band)", "mixed", "mixed diverged"]


def test_equal_loss_scale_traces_are_both_drawn_and_named():
    """fp32 and no_scaling both stay at 1, amp and mixed halve alike: the second of each pair is
    drawn wider beneath the first and its legend entry says whose trace it equals."""
    from mpt_repro.report.plots import GroupCurves, loss_scale_figure, preset_styles

    def frames(scales):
        return [pd.DataFrame({"step": [2, 4, 6], "split": "train", "loss_scale": scales})]

    curves = GroupCurves(train={
        "fp32": frames([1.0, 1.0, 1.0]), "amp": frames([65536.0, 32768.0, 32768.0]),
        "mixed": frames([65536.0, 32768.0, 32768.0]), "no_scaling": frames([1.0, 1.0, 1.0]),
    })  # fmt: skip
    fig = loss_scale_figure(curves, preset_styles(list(curves.train)), "t")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(lines) == {"fp32", "amp", "mixed (same trace as amp)",
                          "no_scaling (same trace as fp32)"}  # fmt: skip
    assert lines["no_scaling (same trace as fp32)"].get_linewidth() > lines["fp32"].get_linewidth()
    assert lines["mixed (same trace as amp)"].get_zorder() < lines["amp"].get_zorder()


def test_the_delta_panel_spans_the_tolerance():
    """Differences a thousandth of the tolerance: the Δ panel shows ±tolerance as dashed lines and
    spans them, and the metric panel spans at least twice the tolerance, so neither makes noise
    look large (a perplexity axis from 63.9304 to 63.9318 once did)."""
    from mpt_repro.report.compare import Delta
    from mpt_repro.report.plots import curves_figure

    def evals(values):
        return {s: pd.DataFrame({"step": [10], "split": "eval", "perplexity": [v]})
                for s, v in enumerate(values)}  # fmt: skip

    by_seed = {"fp32": evals([63.9304, 63.9310, 63.9312]),
               "mixed": evals([63.9306, 63.9318, 63.9309])}  # fmt: skip
    train = {p: _band_frames([[3.0, 2.0, 1.0]]) for p in by_seed}
    delta = Delta("mixed", "perplexity", False, 3, 0.0002, -0.001, 0.0014, 1.28, 0, 3,
                  "matches FP32 (CI within ±1.28)")  # fmt: skip
    fig = curves_figure(train, {p: list(f.values()) for p, f in by_seed.items()}, {},
                        "perplexity", "t", by_seed, deltas={"mixed": delta})  # fmt: skip
    middle, right = fig.axes[1], fig.axes[2]
    low, high = right.get_ylim()
    assert low <= -1.28 and high >= 1.28
    assert "tolerance ±1.28" in [t.get_text() for t in right.get_legend().get_texts()]
    low, high = middle.get_ylim()
    assert high - low >= 2 * 1.28


def test_plain_tick_labels_and_one_point_panels():
    from mpt_repro.report.plots import curves_figure

    perplexity = [pd.DataFrame({"step": [6], "split": "eval", "perplexity": [1000.5]})]
    fig = curves_figure(
        {"fp32": _band_frames([[1.0, 1.0, 1.0]])}, {"fp32": perplexity}, {}, "perplexity", "t"
    )
    right = fig.axes[1]
    fig.canvas.draw()
    assert right.yaxis.get_offset_text().get_text() == ""  # no "+1e3" at the axis end
    assert list(right.get_xticks()) == [6] and right.get_xlim() == (5.0, 7.0)


def test_cost_bars_linear_from_zero():
    """Ratios to fp32 on linear axes from zero, one row of panels per comparison group (no axis
    shared by experiments with other units), each bar labelled with the ratio and the figure; a
    preset whose runs all diverged keeps its place, marked, so no missing bar reads as cheap."""
    from mpt_repro.report.plots import cost_figure

    nan = float("nan")
    agg = pd.DataFrame(
        {
            "row_label": ["demo", "demo", "demo", "lstm_lm", "lstm_lm"],
            "data": ["digits", "digits", "digits", "corpus", "corpus"],
            "precision": ["fp32", "mixed", "no_scaling", "fp32", "mixed"],
            "n_completed": [1, 1, 0, 1, 1],
            "n_diverged": [0, 0, 1, 0, 0],
            # 1% apart looks 1% apart
            "samples_per_s_mean": [1000.0, 1010.0, nan, 4720.0, 2360.0],
            "saved_bytes_per_sample_mean": [100 * MiB, 50 * MiB, nan, 10 * MiB, 10 * MiB],
            "peak_memory_bytes_mean": [2000 * MiB] * 2 + [nan] + [2000 * MiB] * 2,
            "peak_memory_kind": ["host_peak_rss"] * 5,
        }
    )
    fig = cost_figure(agg, "t")
    assert len(fig.axes) == 4  # two groups x (speed, memory)
    for ax in fig.axes:
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    demo_speed, demo_memory, lm_speed, _ = fig.axes
    assert [p.get_height() for p in demo_speed.patches] == [1.0, 1.01, 0.0]
    texts = [t.get_text() for t in demo_speed.texts]
    assert texts[:3] == ["1.00×\n1,000/s", "1.01×\n1,010/s", ""]  # the bars' labels
    assert "diverged" in texts and "demo (digits)" in texts  # the outcome; the group's label
    assert [p.get_height() for p in demo_memory.patches] == [1.0, 0.5, 0.0]  # saved bytes
    assert demo_memory.get_title() == "saved for backward per sample ÷ fp32"
    assert [p.get_height() for p in lm_speed.patches] == [1.0, 0.5]
    assert "lstm_lm (corpus)" in [t.get_text() for t in lm_speed.texts]


def test_every_preset_has_its_own_colour():
    from mpt_repro.report.plots import preset_styles

    presets = list(catalog.presets())
    assert len(presets) >= 13
    colours = [tuple(s["color"]) for s in preset_styles(presets).values()]
    assert len(set(colours)) == len(presets)


def test_percent_axes_from_zero_integer_steps_and_the_difference_panel():
    from mpt_repro.report.plots import curves_figure

    def evals(values):
        return pd.DataFrame({"step": [3, 7], "split": "eval", "top1": values})

    by_seed = {
        "fp32": {0: evals([40.0, 60.0]), 1: evals([42.0, 62.0])},
        "mixed": {0: evals([41.0, 61.0]), 1: evals([45.0, 65.0])},
    }
    train = {p: _band_frames([[3.0, 2.0, 1.0]]) for p in by_seed}
    fig = curves_figure(
        train, {p: list(f.values()) for p, f in by_seed.items()}, {}, "top1", "t", by_seed
    )
    loss, metric, delta = fig.axes
    fig.canvas.draw()
    assert metric.get_ylim()[0] == 0 and metric.get_ylabel() == "top1 (%)"
    for ax in (loss, metric, delta):
        assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_title()
    # mixed − fp32 per seed: (1, 1) and (3, 3): mean 2 at both steps, band t(0.975,1)·√2/√2
    [line] = delta.get_lines()[:1]
    assert list(line.get_ydata()) == [2.0, 2.0]
    assert delta.get_title().startswith("Δ top1 to fp32")


def test_an_empty_difference_panel_says_which_preset_diverged():
    """fp32 evaluated, no_scaling diverged before its first evaluation: nothing pairs, and the
    panel says why instead of an empty axis with steps -1 to 1."""
    from mpt_repro.report.plots import curves_figure

    fp32 = pd.DataFrame({"step": [6], "split": "eval", "top1": [7.8]})
    nothing = pd.DataFrame({"step": [], "split": [], "top1": []})
    by_seed = {"fp32": {0: fp32}, "no_scaling": {0: nothing}}
    train = {p: _band_frames([[3.0, 2.0, 1.0]]) for p in by_seed}
    evals = {p: list(f.values()) for p, f in by_seed.items()}
    fig = curves_figure(train, evals, {"no_scaling": [5]}, "top1", "t", by_seed)
    delta = fig.axes[2]
    assert not delta.get_lines()
    [text] = [t.get_text() for t in delta.texts]
    assert text.endswith("(no_scaling diverged before an evaluation)"), text


def test_nothing_of_a_diverged_run_is_drawn_from_the_step_it_diverged_at(tmp_path):
    """A garbage evaluation logged between the first NaN and the divergence is not a point."""
    from mpt_repro.report.collect import load_runs
    from mpt_repro.report.plots import group_curves

    write_run(tmp_path, rec("demo", "fp32", 0, data="digits", metrics={"top1": 90.0}))
    div = write_run(
        tmp_path, rec("demo", "mixed", 0, data="digits", status="diverged", diverged_at_step=4)
    )
    rows = "step,epoch,split,loss,top1\n2,0,train,1.0,\n2,0,eval,1.0,50.0\n6,1,eval,nan,10.94\n"
    (div / "metrics.csv").write_text(rows)
    runs, _ = load_runs(tmp_path)
    curves = group_curves(runs, [])
    assert curves.diverged == {"mixed": [4]}
    assert curves.by_seed["mixed"][0]["step"].tolist() == [2]  # not step 6's 10.94
    assert curves.by_seed["fp32"][0]["step"].tolist() == [6]  # fp32's own evaluation stays


def test_groups_are_listed_in_the_numeric_order_of_their_keys():
    from mpt_repro.report.tables import natural_key

    labels = ["demo [optim.lr=30.0]", "demo [optim.lr=1e+308]", "demo [optim.lr=3.0]", "demo"]
    assert sorted(labels, key=natural_key) == [
        "demo",
        "demo [optim.lr=3.0]",
        "demo [optim.lr=30.0]",
        "demo [optim.lr=1e+308]",
    ]
