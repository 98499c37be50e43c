"""mpt-advise (issue 27) on real diagnostic runs of the real writer: the advice's histograms are the
telemetry's, every figure is its bins over the nonzero values, the no-scaling and static-scale
figures equal what telemetry counted on the tensors themselves, the per-tensor FP8 scale is the
quantizer's, and the command line (run directories, a diagnostic run it starts itself, bad input).

The runs are demo at budget=smoke (6 steps, seconds on a CPU), shared by the module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, read_run, run_cli

from mpt_repro.advise import formats as fm
from mpt_repro.advise.advice import advice_section, build_advice
from mpt_repro.advise.evidence import KINDS, hist_of
from mpt_repro.advise.predict import pct
from mpt_repro.advise.render import to_json

SMOKE = ("experiment=demo", "budget=smoke", "precision=fp32", "trainer.device=cpu")


@pytest.fixture(scope="module")
def diagnostic(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("advise") / "diag"
    run_cli(*SMOKE, "telemetry=diagnostic", "telemetry.every=2", run_dir=run_dir)
    return run_dir


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The same run without telemetry."""
    run_dir = tmp_path_factory.mktemp("advise") / "plain"
    run_cli(*SMOKE, run_dir=run_dir)
    return run_dir


@pytest.fixture(scope="module")
def advice(diagnostic):
    return build_advice(diagnostic)


def advise(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mpt-advise ARGS` as the console script runs it (python -m: the script is not installed
    in the development environment)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    cmd = [sys.executable, "-m", "mpt_repro.advise", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# ------------------------------------------------------------------ traceable to the histograms


def test_the_network_histograms_are_the_ones_run_json_summarizes(diagnostic, advice):
    network = read_run(diagnostic)["diagnostics"]["telemetry"]["network"]
    assert advice.evidence.steps == [1, 3, 5]
    for kind in KINDS:
        assert advice.evidence.network(kind) == hist_of(network[f"{kind}_grad_histogram"])
        assert sum(advice.evidence.network(kind).values()) > 1000


def _bins_sum(hist: dict, condition: str) -> int:
    """Sum the bins a trace condition names: "e < -24", "-24 <= e < -14", "e > 15", "e = 15"."""
    numbers = [int(x) for x in re.findall(r"-?\d+", condition)]
    if "<=" in condition:
        lo, hi = numbers
        return sum(c for e, c in hist.items() if lo <= e < hi)
    test = {"<": lambda e, b: e < b, ">": lambda e, b: e > b, "=": lambda e, b: e == b}
    op = re.search(r"e ([<>=])", condition).group(1)
    return sum(c for e, c in hist.items() if test[op](e, numbers[0]))


def test_every_figure_is_its_bins_over_the_nonzero_values(advice):
    data = to_json(advice)
    hists = {k: {int(e): c for e, c in h.items()} for k, h in data["histograms"].items()}
    checked = 0
    for p in data["predictions"]:
        if p["loss_scale_log2"] is None:
            continue  # per tensor: one shift per sampled tensor (next tests)
        overflow, at_risk = re.match(r"(.*) \((.*) at risk\)", p["bins"]["overflow"]).groups()
        for kind in KINDS:
            got, hist = p["network"][kind], hists[kind]
            assert got["nonzero"] == sum(hist.values())
            assert got["lost"]["count"] == _bins_sum(hist, p["bins"]["lost"])
            assert got["subnormal"]["count"] == _bins_sum(hist, p["bins"]["subnormal"])
            assert got["overflow"]["count"] == _bins_sum(hist, overflow)
            assert got["at_risk"]["count"] == _bins_sum(hist, at_risk)
            assert got["lost"]["fraction"] == got["lost"]["count"] / got["nonzero"]
            checked += 1
    assert checked == 10  # five recipes with one scale, two kinds


def test_the_markdown_shows_the_json_figures(advice):
    from mpt_repro.advise.render import markdown

    text = markdown(advice)
    data = to_json(advice)
    for p in data["predictions"]:
        row = next(line for line in text.splitlines() if line.startswith(f"| {p['title']} (`"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        preset = next(w for w in p["command"].split() if w.startswith("precision="))
        assert f"(`{preset}`" in cells[0]  # the preset it runs as, by its mpt-run name
        assert cells[2] == pct(p["network"]["act"]["lost"]["fraction"])
        assert cells[5] == pct(p["network"]["weight"]["lost"]["fraction"])
        assert cells[-1] == p["verdict"]


def test_no_scaling_figures_equal_what_telemetry_counted_on_the_tensors(diagnostic, advice):
    """telemetry counts underflow and subnormal values on the gradients themselves (not from the
    histogram); on an FP32 run at scale 1 they must be exactly the no-scaling prediction."""
    counted = {k: {"underflow": 0, "subnormal": 0, "overflow": 0} for k in KINDS}
    for line in (diagnostic / "telemetry.jsonl").read_text().splitlines():
        for entry in json.loads(line)["layers"].values():
            for kind in KINDS:
                for field in counted[kind]:
                    counted[kind][field] += entry[kind][field]
    p = advice.prediction("no_scaling")
    for kind in KINDS:
        assert p.kinds[kind].lost == counted[kind]["underflow"]
        assert p.kinds[kind].subnormal == counted[kind]["subnormal"]
        c = p.kinds[kind]
        assert c.overflow <= counted[kind]["overflow"] <= c.overflow + c.at_risk


@pytest.mark.slow
def test_the_advised_static_scale_counted_by_telemetry_on_the_same_run(tmp_path, advice):
    """The same seeded FP32 run again, with telemetry told to show the advised scale: telemetry's
    own scaled counts (taken on the tensors) must equal the static-scale prediction, and nothing
    may overflow."""
    s = 2.0**advice.static.advised
    run_cli(*SMOKE, "telemetry=diagnostic", "telemetry.every=2", f"telemetry.what_if_scale={s}",
            run_dir=tmp_path)  # fmt: skip
    counted = {k: [0, 0] for k in KINDS}
    for line in (tmp_path / "telemetry.jsonl").read_text().splitlines():
        for entry in json.loads(line)["layers"].values():
            for kind in KINDS:
                counted[kind][0] += entry[kind]["underflow_scaled"]
                counted[kind][1] += entry[kind]["overflow_scaled"]
    p = advice.prediction("static")
    assert p.shift == advice.static.advised
    for kind in KINDS:
        assert counted[kind] == [p.kinds[kind].lost, 0]


# ------------------------------------------------------------------ the §3.2 bounds and FP8 scales


def test_static_bounds_are_the_extreme_powers_of_two(advice):
    s, grads = advice.static, {}
    for kind in KINDS:
        for e, c in advice.evidence.network(kind).items():
            grads[e] = grads.get(e, 0) + c
    top = max(grads) + 1  # every gradient is below 2^top
    assert 2.0 ** (top + s.k_over) <= 65504 < 2.0 ** (top + s.k_over + 1)

    def kept(k: int) -> float:
        return 1 - fm.range_counts(grads, fm.FP16, k).fraction("lost")

    assert kept(s.k_under) >= s.keep > kept(s.k_under - 1)
    assert s.margin == s.k_over - s.k_under
    assert s.advised == (s.k_under + s.margin // 2 if s.margin >= 0 else s.k_over)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_per_tensor_shift_is_the_quantizers_scale(fmt):
    """per_tensor_shift reads only the top bin: it is the scale fp8.tensorwise_scale picks, or
    one binade more when amax lies in the top eighth of its bin (then the kernel takes less)."""
    import torch

    from mpt_repro.precision.fp8 import tensorwise_scale
    from mpt_repro.telemetry import numerics as nx

    g = torch.Generator().manual_seed(0)
    for amax in (3.0e-7, 1.0, 1.5, 1.74, 1.76, 1.99, 700.0):
        x = torch.randn(1000, generator=g)
        x = x / x.abs().max() * amax
        hist = nx.histogram_list(nx.tensor_counts(x).tolist())
        trimmed = hist_of(nx.trim_histogram(hist))
        kernel = round(float(torch.log2(tensorwise_scale(x, fmt))))
        mantissa = amax / 2.0 ** max(trimmed)
        expected = kernel + (1 if mantissa > 1.75 else 0)
        assert fm.per_tensor_shift(trimmed, fm.WINDOWS[fmt]) == expected


# ------------------------------------------------------------------ the command line


def test_cli_on_a_run_directory_prints_and_writes_the_advice(tmp_path, diagnostic):
    done = advise(str(diagnostic), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "## Precision advice: demo / fp32 / smoke / seed 0" in done.stdout
    assert "### Loss scale (paper §3.2)" in done.stdout
    written = json.loads((tmp_path / "out" / "advice.json").read_text())
    assert [p["recipe"] for p in written["predictions"]] == [
        "dynamic", "static", "no_master", "no_scaling", "bf16", "e4m3", "e5m2",
    ]  # fmt: skip
    assert (tmp_path / "out" / "advice.md").read_text().strip() in done.stdout
    assert (tmp_path / "out" / "advice_exponent_ranges.png").read_bytes().startswith(b"\x89PNG")
    static = next(p for p in written["predictions"] if p["recipe"] == "static")
    scale = written["static_scale"]["advised_scale"]
    assert f"precision.static_scale={scale:g}" in static["command"]


@pytest.mark.parametrize("case", ["missing", "no run.json", "no telemetry"])
def test_bad_input_gets_one_line_and_exit_2(tmp_path, plain, case):
    target = {"missing": tmp_path / "nope", "no run.json": tmp_path, "no telemetry": plain}[case]
    done = advise(str(target))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("mpt-advise: error: ")
    expected = {"missing": "no such run directory", "no run.json": "no run.json",
                "no telemetry": "telemetry=diagnostic"}[case]  # fmt: skip
    assert expected in done.stderr


def test_a_bad_override_gets_one_line_and_exit_2(tmp_path):
    done = advise("experiment=demo", "precision=fp64", f"paths.runs_dir={tmp_path}")
    assert done.returncode == 2 and "fp64" in done.stderr and "Traceback" not in done.stderr
    assert not any(tmp_path.iterdir())


def test_the_report_section_covers_only_runs_with_telemetry(tmp_path, diagnostic, plain):
    text = advice_section([plain, diagnostic], figures_dir=tmp_path / "advice")
    assert text.startswith("## Precision advice (mpt-advise)")
    assert text.count("### Precision advice:") == 1 and "#### Recipes" in text
    assert "![exponent ranges](advice/run1.png)" in text
    assert (tmp_path / "advice" / "run1.png").is_file()
    assert advice_section([plain]) == ""


def test_mpt_report_carries_the_section_for_its_runs_with_telemetry(tmp_path, diagnostic, plain):
    import shutil

    from mpt_repro.report.cli import build_report

    for run in (diagnostic, plain):
        shutil.copytree(run, tmp_path / "runs" / run.name)
    report, _, _ = build_report(tmp_path / "runs", tmp_path / "report", plots=False)
    assert report.count("## Precision advice (mpt-advise)") == 1
    assert report.count("### Precision advice:") == 1
    assert str(tmp_path / "runs" / "diag") in report


def test_a_telemetry_run_counted_as_a_duplicate_still_gets_its_advice(tmp_path, diagnostic, plain):
    """The README's workflow: a sweep, then the same configuration with telemetry. The tables
    count the two once (the plain run is read first here), the advice reads the telemetry one."""
    import shutil

    from mpt_repro.report.cli import build_report

    shutil.copytree(plain, tmp_path / "runs" / "a_sweep_run")
    shutil.copytree(diagnostic, tmp_path / "runs" / "b_telemetry_run")
    report, _, problems = build_report(tmp_path / "runs", tmp_path / "report", plots=False)
    [duplicate] = [p for p in problems if p.status == "duplicate"]
    assert duplicate.path.endswith("b_telemetry_run")
    assert report.count("### Precision advice:") == 1
    assert str(tmp_path / "runs" / "b_telemetry_run") in report


@pytest.mark.slow
def test_advice_starts_its_own_diagnostic_run_on_a_custom_model(tmp_path):
    """`mpt-advise experiment=... model=custom ...` trains the diagnostic run, then advises; the
    same command again reuses the finished run."""
    args = ["experiment=demo", "budget=smoke", "trainer.device=cpu", "model=custom",
            "model.target=helpers_custom_model:tiny_classifier", "+model.kwargs.in_channels=1",
            f"paths.runs_dir={tmp_path}", "--steps", "8", "--every", "2"]  # fmt: skip
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    first = advise(*args, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir,) = tmp_path.glob("demo-helpers_custom_model:tiny_classifier/fp32-smoke/seed0/*")
    assert run_dir.name.endswith("telemetry=diagnostic,telemetry.every=2,trainer.max_steps=8")
    assert read_run(run_dir)["diagnostics"]["telemetry"]["sampled_steps"] == [1, 3, 5, 7]
    assert "demo-helpers_custom_model:tiny_classifier / fp32" in first.stdout
    assert "step 8/8" in first.stderr  # mpt-run's own progress (lines when not on a terminal)
    again = advise(*args, env=env)
    assert again.returncode == 0 and "reusing the finished diagnostic run" in again.stderr
    assert "step 8/8" not in again.stderr


def test_help_loads_no_torch():
    probe = (
        "import sys\n"
        "from mpt_repro.advise.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert "RUN_DIR | KEY=VALUE" in done.stdout and done.stderr.strip() == "False"


def test_the_checks_made_for_the_diagnostic_run_find_the_modules_it_will(tmp_path):
    """mpt-advise checks the diagnostic run's command in its own process, the run gets `env`:
    a model.target module on the child's PYTHONPATH only is found by the checks too."""
    from mpt_repro.advise.launch import child_path, refusal

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "nets_for_the_child.py").write_text("def make(num_classes):\n    return None\n")
    args = ["experiment=demo", "model=custom", "model.target=nets_for_the_child:make",
            f"paths.runs_dir={tmp_path / 'runs'}"]  # fmt: skip
    assert "no module named 'nets_for_the_child'" in refusal(args)
    with child_path({"PYTHONPATH": str(lib)}):
        assert refusal(args) is None
    assert str(lib) not in sys.path


# ------------------------------------------------------------------ issue 34
def _copy(diagnostic: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(diagnostic, tmp_path / "copy"))


def test_a_garbage_line_in_telemetry_is_one_line_naming_it(tmp_path, diagnostic):
    """It was a KeyError."""
    run_dir = _copy(diagnostic, tmp_path)
    path = run_dir / "telemetry.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "42", *lines[1:]]) + "\n")
    done = advise(str(run_dir))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == (
        f"mpt-advise: error: {path}: line 2 is not a telemetry record (a JSON object with step "
        "and mode): '42'; remove that line, or run the diagnostic again\n"
    )


def test_a_diverged_diagnostic_calls_no_recipe_safe_nor_its_learning_rate_again(
    tmp_path, diagnostic
):
    run_dir = _copy(diagnostic, tmp_path)
    record = read_run(run_dir)
    lr = record["config"]["optim"]["lr"]
    record.update(status="diverged", reason="loss is NaN at step 5")
    record["overrides"] = [*record.get("overrides", []), f"optim.lr={lr}"]
    (run_dir / "run.json").write_text(json.dumps(record))
    advice = build_advice(run_dir)
    retry = f"optim.lr={lr / 10:g}"
    assert {p.verdict for p in advice.predictions} == {
        f"unknown: the diagnostic run diverged; run it again with {retry}"
    }
    commands = [p["command"] for p in to_json(advice)["predictions"]]
    assert all(retry in c and f"optim.lr={lr} " not in c + " " for c in commands), commands
    from mpt_repro.advise.render import markdown

    assert "**The diagnostic run diverged** (loss is NaN at step 5)" in markdown(advice)


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_steps_below_one_is_named_as_the_option(steps):
    """--steps 0 was refused as trainer.max_steps."""
    done = advise("experiment=demo", "--steps", steps, "budget=smoke")  # options among overrides
    assert done.returncode == 2
    assert (
        done.stderr
        == f"mpt-advise: error: --steps must be at least 1 (got {steps}), e.g. --steps 300\n"
    )


def test_options_may_come_between_the_overrides():
    from mpt_repro.advise.cli import parse_args

    args = parse_args(["experiment=demo", "--steps", "6", "budget=smoke", "--every", "2"])
    assert args.targets == ["experiment=demo", "budget=smoke"]
    assert (args.steps, args.every) == (6, 2)


def test_a_negative_margin_advises_the_overflow_bound_and_says_why(monkeypatch):
    """Gradients up to 2^10 and most of them at 2^-40: no single scale keeps both (issue 34: no
    fast test reached this branch)."""
    from types import SimpleNamespace

    from mpt_repro.advise import render
    from mpt_repro.advise.scale import static_scale

    hist = {10: 1, -40: 999}
    s = static_scale(hist, 0.99)
    assert (s.k_over, s.k_under, s.margin, s.advised) == (4, 16, -12, 4)
    monkeypatch.setattr(render, "gradients", lambda evidence: hist)
    advice = SimpleNamespace(static=s, evidence=None, prediction=lambda recipe: None)
    lines = render.static_lines(advice)
    assert lines[-1].startswith(
        "- margin -12 binades: no single scale does both; the advised scale is the overflow "
        "bound, and the layers below need their own: **2^4 = 16**"
    )


# ------------------------------------------------------------------ issue 37
def test_layers_are_named_by_path_and_class_as_the_model_names_them(diagnostic, advice, tmp_path):
    """The demo CNN is a Sequential: `0.0` alone says nothing; the advice says `0.0 Conv2d`, the
    class of the module at that path in the model the run built."""
    from omegaconf import OmegaConf

    from mpt_repro.models import build_model
    from mpt_repro.telemetry.records import layer_labels, read_records

    model_cfg = OmegaConf.create(read_run(diagnostic)["config"]["model"])
    modules = dict(build_model(model_cfg, num_classes=10, channels=1).named_modules())
    expected = {name: f"{name} {type(modules[name]).__name__}" for name in advice.evidence.layers}
    assert expected["0.0"] == "0.0 Conv2d" and expected["0.1"] == "0.1 BatchNorm2d"
    assert {n: lay.label for n, lay in advice.evidence.layers.items()} == expected
    assert layer_labels(read_records(diagnostic / "telemetry.jsonl")) == expected
    data = to_json(advice)
    assert data["layer_labels"] == expected
    # the table's worst layers and the verdicts name them so; the JSON keys stay the paths
    from mpt_repro.advise.render import markdown

    text = markdown(advice)
    worst = advice.prediction("no_scaling").worst_layers(1)[0][0]
    assert f"| {expected[worst]} (" in text or f", {expected[worst]} (" in text
    assert set(data["predictions"][0]["layers"]) == set(expected)


def test_a_record_written_before_the_class_was_recorded_reads_with_paths(tmp_path, diagnostic):
    """Older telemetry.jsonl files have no "module" per layer: the advice and the heatmap fall
    back to the path."""
    from mpt_repro.telemetry.figures import draw_figures
    from mpt_repro.telemetry.records import layer_labels, read_records

    run_dir = _copy(diagnostic, tmp_path)
    path = run_dir / "telemetry.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        for entry in r["layers"].values():
            assert entry.pop("module")  # the real writer recorded it
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    advice = build_advice(run_dir)
    assert {lay.label for lay in advice.evidence.layers.values()} == set(advice.evidence.layers)
    assert layer_labels(read_records(path)) == {n: n for n in advice.evidence.layers}
    assert len(draw_figures(run_dir, out_dir=tmp_path / "figures")) == 3


def _with_paper_scale(diagnostic: Path, tmp_path: Path, scale: float | None) -> Path:
    """The diagnostic run as if its experiment stated the paper's loss scale (as SSD's 8 or the
    LM's 128 do): plain precision=mixed is then that static scale, not dynamic scaling."""
    run_dir = _copy(diagnostic, tmp_path)
    record = read_run(run_dir)
    record["config"]["paper_loss_scale"] = scale
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def test_plain_mixed_is_recommended_when_nothing_measured_does_better(advice):
    """demo: dynamic scaling and the §3.2 static scale both lose nothing: the tie goes to the
    default, and "Run it" is plain precision=mixed."""
    from mpt_repro.advise.recommend import recommend
    from mpt_repro.advise.render import markdown

    r = recommend(advice)
    assert r.losses["dynamic"] == r.losses["static"] == 0.0 < r.losses["no_scaling"]
    assert r.default.recipe.key == "dynamic" and r.chosen is r.default and r.default_enough
    text = markdown(advice)
    assert (
        "**Plain `precision=mixed` (dynamic loss scaling) is enough**: no FP16 recipe with" in text
    )
    (command,) = [line for line in text.splitlines() if line.startswith("- Run it:")]
    assert command.endswith(" precision=mixed`") and "loss_scaling" not in command
    assert to_json(advice)["recommendation"]["default_enough"] is True


@pytest.mark.parametrize("keep", [0.99, 0.9999])
def test_a_paper_scale_default_is_enough_only_within_the_margin_of_the_best(
    tmp_path, diagnostic, keep
):
    """An experiment whose plain mixed is a static scale of 1 (AlexNet's paper_loss_scale): it
    loses what no_scaling loses (0.07% here), the best loses nothing. Within half the tolerance
    (0.5% at keep 0.99) the default is enough; at keep 0.9999 (margin 0.005%) dynamic scaling is
    recommended, ahead of the static scale it ties with."""
    from mpt_repro.advise.recommend import recommend
    from mpt_repro.advise.render import markdown

    advice = build_advice(_with_paper_scale(diagnostic, tmp_path, 1.0), keep)
    paper = advice.predictions[0]
    assert paper.recipe.key == "paper" and paper.shift == 0
    assert paper.overrides() == ["precision=mixed"]
    r = recommend(advice)
    assert r.default is paper and r.best.recipe.key == "dynamic"
    assert 0 < r.losses["paper"] == r.losses["no_scaling"] < 0.005
    text = markdown(advice)
    if keep == 0.99:
        assert r.default_enough and r.chosen is paper
        assert (
            "is enough**: it loses" in text and "within 0.50% (0.5 x the 1.00% tolerance)" in text
        )
    else:
        assert not r.default_enough and r.chosen is r.best
        assert "**Use dynamic loss scaling**" in text
        assert "precision=mixed precision.loss_scaling=dynamic`" in text


def test_a_default_scale_that_overflows_is_no_candidate(tmp_path, diagnostic):
    """A static scale that overflows skips those steps for ever: never recommended, even as the
    default."""
    from mpt_repro.advise.recommend import recommend
    from mpt_repro.advise.render import markdown

    advice = build_advice(_with_paper_scale(diagnostic, tmp_path, 2.0**30))
    r = recommend(advice)
    assert r.default.total.overflow > 0 and "paper" not in r.losses
    assert not r.default_enough and r.chosen.recipe.key == "dynamic"
    assert "(the experiment's static scale 1.07374e+09) overflows" in markdown(advice)


def test_the_diagnostic_run_lands_beside_the_run_it_repeats(tmp_path):
    """README: telemetry overrides name a folder of their own, beside the run without them (so
    the diagnostic run never finds that run finished), in the same seed folder."""
    from mpt_repro.advise.launch import diagnostic_overrides, planned_run_dir

    user = ["experiment=demo", "budget=smoke", f"paths.runs_dir={tmp_path}"]
    diagnostic = planned_run_dir(diagnostic_overrides(user, 300, None))
    plain = planned_run_dir([*user, "precision=fp32", "trainer.max_steps=300"])
    assert diagnostic.parent == plain.parent == tmp_path / "demo" / "fp32-smoke" / "seed0"
    assert plain.name == "trainer.max_steps=300"
    assert diagnostic.name == "telemetry=diagnostic,telemetry.every=15,trainer.max_steps=300"


def test_a_diagnostic_run_that_did_not_train_calls_no_recipe_safe(tmp_path, diagnostic):
    """Issue 44: lr=1e12 ended with loss 9.4e11 and top-1 below chance, without a non-finite
    loss; every recipe was called safe and "plain precision=mixed is enough" (the real run:
    test_bad_input_round5.py, slow)."""
    run_dir = _copy(diagnostic, tmp_path)
    record = read_run(run_dir)
    lr = record["config"]["optim"]["lr"]
    record["metrics"].update(loss=9.4e11, top1=6.25)
    (run_dir / "run.json").write_text(json.dumps(record))
    advice = build_advice(run_dir)
    retry = f"optim.lr={lr / 10:g}"
    assert {p.verdict for p in advice.predictions} == {
        f"unknown: the diagnostic run did not train; run it again with {retry}"
    }
    from mpt_repro.advise.render import markdown

    text = markdown(advice)
    assert "**The diagnostic run did not train** (its final loss 9.4e+11 is far above" in text
    assert "and its top-1 6.25% is at chance (10%)" in text
    assert "None: the diagnostic run did not train (above); run it again first." in text
    assert "is enough" not in text and "| safe |" not in text


def test_a_diagnostic_run_far_from_its_fp32_run_says_so_and_asks_for_fp32(tmp_path, diagnostic):
    """Issue 44: a diagnostic run recorded under another preset whose metric is far from the
    FP32 run of the same settings beside it describes no training that works either."""
    import shutil

    record = read_run(diagnostic)
    fp32_dir = tmp_path / "runs" / "demo" / f"fp32-{record['budget']}" / "seed0"
    fp32_dir.mkdir(parents=True)
    (fp32_dir / "run.json").write_text(json.dumps(record))
    run_dir = Path(
        shutil.copytree(
            diagnostic, fp32_dir.parent.with_name(f"mixed-{record['budget']}") / "seed0"
        )
    )
    top1 = record["metrics"]["top1"]
    mixed = {**record, "precision": "mixed", "metrics": {**record["metrics"], "top1": top1 / 2}}
    (run_dir / "run.json").write_text(json.dumps(mixed))
    advice = build_advice(run_dir)
    assert {p.verdict for p in advice.predictions} == {
        "unknown: the diagnostic run did not train as FP32 does; run it again with "
        "precision=fp32 (an FP32 diagnostic run sees every gradient)"
    }
    from mpt_repro.advise.render import markdown

    text = markdown(advice)
    assert (
        f"**The diagnostic run did not train as FP32 does** (its top1 {top1 / 2:.3g} is far "
        f"below the {top1:.3g} of the same run in FP32 ({fp32_dir}))"
    ) in text
    assert "| safe |" not in text
