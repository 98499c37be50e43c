"""Advice against outcome: an experiment's advice beside real runs of the recipes it predicts
about (docs/telemetry.md, "Advice against outcome"; tests/test_advise_outcome.py).

    python -m mpt_repro.advise.check [--runs-dir DIR] [--only NAME...]

For each experiment (check.yaml's, as measured in docs/telemetry.md, or any experiment the
registry knows): mpt-advise's own diagnostic run (FP32, telemetry), an FP32 run of the whole
budget (the reference), then one real run per checked recipe with the overrides the advice gives.
A recipe's run is close to FP32 within comparison.yaml's tolerance for the experiment's primary
metric (the report's). The no-scaling and static-scale runs record telemetry too, so what FP16
really flushed can be counted: a value FP16 loses is an exact zero there, so the lost fraction
observed is the rise of the zero fraction over the FP32 run's, per nonzero FP32 value. Runs
already finished in the runs folder are reused. The custom model is small_cnn of
tests/helpers_custom_model.py: run it from a checkout.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from mpt_repro.advise.advice import DEFAULT_KEEP, build_advice
from mpt_repro.advise.evidence import KINDS, AdviceError, load_evidence
from mpt_repro.advise.launch import planned_run_dir, run_diagnostic
from mpt_repro.advise.predict import Advice, Prediction, pct
from mpt_repro.safeio import open_regular, read_text

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ("no_scaling", "static", "dynamic", "no_master", "bf16", "e5m2", "e4m3")
OBSERVED = ("no_scaling", "static")  # the runs that record telemetry, to count what FP16 lost
COMMON = ["trainer.log_every=10", "trainer.progress=false"]
FIRST_FEW = 10  # steps: skips before this are dynamic scaling finding its scale


@dataclass(frozen=True)
class Checked:
    """One experiment as the check runs it."""

    name: str
    overrides: list[str]  # of its diagnostic, FP32 and recipe runs
    recipes_left_out: tuple[str, ...] = ()


def measured() -> dict[str, Checked]:
    """The experiments of docs/telemetry.md's table, as check.yaml lists them."""
    import yaml

    with resources.files("mpt_repro.advise").joinpath("check.yaml").open() as f:
        raw = yaml.safe_load(f) or {}
    return {
        str(name): Checked(
            str(name),
            [str(o) for o in entry["overrides"]],
            tuple(str(r) for r in entry.get("recipes_left_out") or ()),
        )
        for name, entry in raw.items()
    }


def checked(name: str) -> Checked:
    """check.yaml's entry, or any experiment the registry knows at the short budget; AdviceError
    naming the choices otherwise."""
    from mpt_repro import catalog

    found = measured()
    if name in found:
        return found[name]
    if name in catalog.experiments():
        return Checked(name, [f"experiment={name}", "budget=short"])
    choices = sorted(set(found) | set(catalog.experiments()))
    raise AdviceError(f"no experiment {name!r} to check; choose from {', '.join(choices)}")


@dataclass
class Outcome:
    recipe: str
    run_dir: Path
    status: str
    metric: str
    value: float | None
    reference: float | None  # the FP32 run's
    skipped: int
    skipped_late: int  # after the first FIRST_FEW steps
    first_skip: int | None  # the metrics.csv row (a step) by which the first skip had happened
    final_scale: float | None
    observed_lost: float | None = None
    higher_is_better: bool = True  # the record's, for its primary metric
    # how far from FP32 still counts as close, in the metric's unit (comparison.yaml's, for the
    # experiment and metric; None: a relative one without a finite reference)
    tolerance: float | None = None

    @property
    def close_to_fp32(self) -> bool:
        """Ended no worse than FP32's value by more than the tolerance (better is close too)."""
        if self.status != "completed" or self.value is None or self.reference is None:
            return False
        if self.tolerance is None:
            return False
        worse = (
            self.reference - self.value if self.higher_is_better else self.value - self.reference
        )
        return worse <= self.tolerance

    def good(self, p: Prediction) -> bool:
        """Close to FP32, and no skipped step after the first few unless the recipe scales
        dynamically (whose skips are predicted apart)."""
        return self.close_to_fp32 and (p.recipe.scaling == "dynamic" or self.skipped_late == 0)


def _env() -> dict:
    """The environment of the runs: the custom model's module on the path."""
    paths = [str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def mpt_run(overrides: list[str]) -> Path:
    """Run mpt-run (or reuse its finished run); the run directory."""
    run_dir = planned_run_dir(overrides)
    record = run_dir / "run.json"
    if record.is_file() and json.loads(read_text(record)).get("status") != "running":
        return run_dir
    cmd = [sys.executable, "-m", "mpt_repro.cli", *overrides]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    if not record.is_file():
        raise AdviceError(f"mpt-run {' '.join(overrides)} wrote no record: {done.stderr[-500:]}")
    return run_dir


def _skips_by_step(run_dir: Path) -> list[tuple[int, int]]:
    """(step, skipped steps so far) of metrics.csv's training rows."""
    with open_regular(run_dir / "metrics.csv", "r", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train" and r["skipped_steps"]]
    return [(int(r["step"]), int(float(r["skipped_steps"]))) for r in rows]


def observed_lost(run_dir: Path, reference: Path) -> float | None:
    """The fraction of the FP32 run's nonzero gradients that came out zero in this run: the rise
    of the zero fraction (activation and weight gradients, all sampled steps) over the FP32's."""
    try:
        run, ref = load_evidence(run_dir), load_evidence(reference)
    except AdviceError:
        return None

    def zero_fraction(ev) -> float:
        zeros = sum(lay.zeros[k] for lay in ev.layers.values() for k in KINDS)
        return zeros / sum(lay.numel[k] for lay in ev.layers.values() for k in KINDS)

    z_run, z_ref = zero_fraction(run), zero_fraction(ref)
    return max(0.0, (z_run - z_ref) / (1.0 - z_ref))


def outcome(recipe: str, run_dir: Path, fp32: dict, diagnostic: Path) -> Outcome:
    from mpt_repro.report.compare import default_settings, tolerance_for

    record = json.loads(read_text(run_dir / "run.json"))
    metric = record.get("primary_metric") or "loss"
    reference = (fp32.get("metrics") or {}).get(metric)
    skips = _skips_by_step(run_dir)
    early = max((n for step, n in skips if step <= FIRST_FEW), default=0)
    total = int(record.get("skipped_steps") or 0)
    value = (record.get("metrics") or {}).get(metric)
    return Outcome(
        recipe=recipe,
        run_dir=run_dir,
        status=record.get("status", "?"),
        metric=metric,
        value=value,
        reference=reference,
        skipped=total,
        skipped_late=total - early,
        first_skip=next((step for step, n in skips if n), None),
        final_scale=(record.get("loss_scale") or {}).get("final"),
        observed_lost=observed_lost(run_dir, diagnostic) if recipe in OBSERVED else None,
        higher_is_better=record.get("higher_is_better") is not False,
        tolerance=tolerance_for(default_settings(), metric, reference, record.get("experiment")),
    )


def check_experiment(name: str, runs_dir: Path, recipes=RECIPES, keep: float = DEFAULT_KEEP):
    """(the advice, the FP32 record, one Outcome per recipe) of one experiment (`checked`)."""
    entry = checked(name)
    base = [*entry.overrides, f"paths.runs_dir={runs_dir}", *COMMON]
    recipes = [r for r in recipes if r not in entry.recipes_left_out]
    diagnostic = run_diagnostic(base, steps=300, every=None, env=_env(), capture=True)
    advice = build_advice(diagnostic, keep)
    fp32_dir = mpt_run([*base, "precision=fp32"])
    fp32 = json.loads(read_text(fp32_dir / "run.json"))
    every = advice.evidence.record["config"]["telemetry"]["every"]
    outcomes = []
    for key in recipes:
        p = advice.prediction(key)
        if p is None:
            continue
        extra = ["telemetry=diagnostic", f"telemetry.every={every}"] if key in OBSERVED else []
        run_dir = mpt_run([*base, *p.overrides(), *extra])
        outcomes.append(outcome(key, run_dir, fp32, diagnostic))
    return advice, fp32, outcomes


def agreement(p: Prediction, o: Outcome) -> str:
    """ "yes" when the verdict ("safe" or not) matches the outcome (within the tolerance of FP32
    and, for a scaled recipe, no skipped step after the first few), else what differs."""
    said_safe = p.verdict.startswith("safe")
    if said_safe == o.good(p):
        answer = "yes"
    elif said_safe:
        answer = f"no: said safe, {_result(o)}"
    else:
        answer = "no: warned, yet within tolerance of FP32"
    if p.recipe.scaling == "dynamic" and o.status == "completed":
        if o.final_scale != 2.0**p.shift or o.skipped != p.skips:
            answer += f"; dynamic scaling: {o.skipped} skips to {o.final_scale:g}, not {p.skips}"
    return answer


def _result(o: Outcome) -> str:
    if o.status != "completed" or o.value is None:
        return o.status
    delta = o.value - o.reference if o.reference is not None else float("nan")
    text = f"{o.metric} {o.value:.2f} ({delta:+.2f})"
    return text + (f", {o.skipped_late} late skips" if o.skipped_late else "")


def _skipped(o: Outcome) -> str:
    if not o.skipped:
        return "0"
    return f"{o.skipped} (by step {o.first_skip}; {o.skipped_late} after step {FIRST_FEW})"


def _scale(p: Prediction, o: Outcome) -> str:
    predicted = "per tensor" if p.shift is None else f"2^{p.shift}"
    if p.recipe.window.name != "FP16":
        return predicted
    ran = f"{o.final_scale:g}" if o.final_scale is not None else "?"
    return f"{predicted} / {ran}"


def table_rows(name: str, advice: Advice, outcomes: list[Outcome]) -> list[str]:
    rows = []
    for o in outcomes:
        p = advice.prediction(o.recipe)
        lost = " / ".join(pct(c.fraction("lost")) for c in (*p.kinds.values(), p.total))
        seen = pct(o.observed_lost) if o.observed_lost is not None else ""
        skips = "" if p.skips is None else f"{p.skips} (by step {p.first_skip})" if p.skips else "0"
        cells = [
            name, p.recipe.title, _scale(p, o), lost, seen,
            pct(p.updates_lost) if not p.recipe.master else "0", p.verdict,
            _result(o), _skipped(o), skips, agreement(p, o),
        ]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    return rows


HEADER = [
    "| experiment | recipe | loss scale (advised / final) "
    "| gradients lost, predicted (act. / weight / all) | observed (all) "
    "| updates lost (predicted) | verdict | outcome (vs FP32) "
    "| skipped steps | skips predicted | agree |",
    "|" + "---|" * 11,
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpt_repro.advise.check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--runs-dir", type=Path, default=Path("results/advise_check"))
    # check.yaml's experiments, or any the registry knows (a plugin's, named by MPT_PLUGINS)
    ap.add_argument("--only", nargs="+", metavar="NAME", default=list(measured()))
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    args = ap.parse_args(argv)
    for name in args.only:
        try:
            checked(name)
        except AdviceError as e:
            ap.error(str(e))
    lines = list(HEADER)
    for name in args.only:
        advice, fp32, outcomes = check_experiment(name, args.runs_dir.resolve(), args.recipes)
        metric = fp32.get("primary_metric")
        print(f"{name}: fp32 {metric} {(fp32.get('metrics') or {}).get(metric)}", file=sys.stderr)
        lines += table_rows(name, advice, outcomes)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
