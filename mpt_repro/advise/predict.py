"""What each precision recipe would do to a run's gradients and updates, and a verdict.

Every prediction is a sum of histogram counts (formats.range_counts): the values a recipe's
format loses (below its smallest subnormal), keeps as subnormals, or overflows, at the scale the
recipe applies. Fractions are over the nonzero gradients recorded in the run (zeros are nothing
to lose). A recipe without an FP32 master copy also loses the weight updates below half an FP16
ulp of their weight: telemetry counts those on every sampled step (docs/telemetry.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from mpt_repro.advise import formats as fm
from mpt_repro.advise.evidence import KINDS, RunEvidence
from mpt_repro.advise.scale import LayerNeed, StaticScale, gradients, layer_needs, static_scale


@dataclass(frozen=True)
class Recipe:
    key: str
    title: str
    window: fm.Window
    scaling: str  # "dynamic", "static", "none" or "per_tensor" (FP8: one scale per tensor)
    master: bool  # FP32 master weights (updates are never lost to FP16 rounding)
    overrides: tuple[str, ...]  # the mpt-run overrides that run it ("{scale}": the static scale)


# FP8 recipes are judged on their gradients (errors and weight gradients), where the loss scale
# question is; the emulated hybrid preset with per-tensor scaling of its backward operands runs it,
# in every layer (the presets exempt the first and last ones: the worst layers say which matter).
_FP8 = ("precision=fp8_hybrid_emulated", "precision.fp8.exempt=[]")
_TENSORWISE = (
    "precision.fp8.errors.scaling=tensorwise",
    "precision.fp8.weight_grads.scaling=tensorwise",
)
_E4M3 = ("precision.fp8.errors.format=e4m3", "precision.fp8.weight_grads.format=e4m3")
_STATIC = ("precision=mixed", "precision.loss_scaling=static", "precision.static_scale={scale}")

# plain `precision=mixed` where the experiment states the paper's constant (paper_loss_scale: SSD's
# 8, the LM's 128): a static scale; elsewhere it scales dynamically and is the "dynamic" recipe
PAPER = Recipe("paper", "FP16, master copy, the experiment's static scale", fm.FP16, "static",
               True, ("precision=mixed",))  # fmt: skip

RECIPES = (
    Recipe("dynamic", "FP16, master copy, dynamic scaling", fm.FP16, "dynamic", True,
           ("precision=mixed", "precision.loss_scaling=dynamic")),
    Recipe("static", "FP16, master copy, static scale", fm.FP16, "static", True, _STATIC),
    Recipe("no_master", "FP16, no master copy (dynamic scaling)", fm.FP16, "dynamic", False,
           ("precision=no_master", "precision.loss_scaling=dynamic")),
    Recipe("no_scaling", "FP16, master copy, no loss scaling", fm.FP16, "none", True,
           ("precision=no_scaling",)),
    Recipe("bf16", "BF16 autocast", fm.BF16, "none", True, ("precision=bf16",)),
    Recipe("e4m3", "FP8 E4M3 gradients, per-tensor scaled", fm.E4M3, "per_tensor", True,
           _FP8 + _E4M3 + _TENSORWISE),
    Recipe("e5m2", "FP8 E5M2 gradients, per-tensor scaled", fm.E5M2, "per_tensor", True,
           _FP8 + _TENSORWISE),
)  # fmt: skip


@dataclass
class Prediction:
    recipe: Recipe
    shift: int | None  # the loss scale 2^shift it applies (None: one scale per tensor)
    kinds: dict[str, fm.RangeCounts]  # network-wide, per kind
    layers: dict[str, fm.RangeCounts]  # per layer, both kinds
    updates: tuple[int, int] = (0, 0)  # (lost, nonzero) weight updates; (0, 0) with a master copy
    skips: int | None = None  # dynamic scaling: overflowing steps before it settles
    first_skip: int | None = None  # the sampled step by which the first of them happened
    needs: list[LayerNeed] = field(default_factory=list)
    verdict: str = ""
    labels: dict[str, str] = field(default_factory=dict)  # layer -> `0.0 Conv2d` (path + class)

    def shown(self, layer: str) -> str:
        """A layer as the advice prints it: path and class where the record has the class."""
        return self.labels.get(layer, layer)

    @property
    def total(self) -> fm.RangeCounts:
        out = fm.RangeCounts()
        for c in self.kinds.values():
            out.add(c)
        return out

    @property
    def updates_lost(self) -> float:
        lost, nonzero = self.updates
        return lost / nonzero if nonzero else 0.0

    def overrides(self) -> list[str]:
        """The mpt-run overrides of this recipe, at its scale."""
        return [o.format(scale=scale_text(self.shift)) for o in self.recipe.overrides]

    def worst_layers(self, n: int = 3) -> list[tuple[str, fm.RangeCounts]]:
        """The layers losing or overflowing the largest fraction of their gradients."""

        def badness(item):
            c = item[1]
            return c.fraction("lost") + c.fraction("overflow") + c.fraction("at_risk")

        ranked = sorted(self.layers.items(), key=badness, reverse=True)
        return [(name, c) for name, c in ranked[:n] if badness((name, c)) > 0]


@dataclass
class Advice:
    """A run's advice: its evidence, the §3.2 scale and every recipe's prediction."""

    evidence: RunEvidence
    static: StaticScale
    predictions: list[Prediction]

    def prediction(self, key: str) -> Prediction | None:
        return next((p for p in self.predictions if p.recipe.key == key), None)


def scale_text(k: int | None) -> str:
    """2^k as the number a command line takes (exact: 16384, 0.25)."""
    if k is None:
        return ""
    return str(2**k) if k >= 0 else repr(2.0**k)


def count(evidence: RunEvidence, window: fm.Window, shift: int | None):
    """{layer: {kind: counts}}: what `window` does to every sampled step's gradients at scale
    2^shift (shift None: each sampled tensor at its own per-tensor scale)."""
    out: dict[str, dict[str, fm.RangeCounts]] = {}
    for name, layer in evidence.layers.items():
        per_kind = out.setdefault(name, {})
        for kind in KINDS:
            total = fm.RangeCounts()
            for hist in layer.samples[kind]:
                k = fm.per_tensor_shift(hist, window) if shift is None else shift
                if k is None:
                    continue
                c = fm.range_counts(hist, window, k)
                if shift is None:
                    c.at_risk = 0  # the kernel lowers a per-tensor scale that would overflow
                total.add(c)
            per_kind[kind] = total
    return out


def _assemble(recipe: Recipe, shift: int | None, counts: dict) -> Prediction:
    kinds = {kind: fm.RangeCounts() for kind in KINDS}
    layers = {}
    for name, per_kind in counts.items():
        layers[name] = fm.RangeCounts()
        for kind, c in per_kind.items():
            kinds[kind].add(c)
            layers[name].add(c)
    return Prediction(recipe, shift, kinds, layers)


def dynamic_scale(evidence: RunEvidence) -> tuple[int | None, int, int | None]:
    """(the scale exponent dynamic scaling settles at, the steps it skips to get there, the
    sampled step by which it skipped the first): it starts at precision.init_scale and halves on
    every overflow, i.e. whenever a step's top bin, moved by the scale, lies above FP16's top bin
    (the sampled steps in order stand for the run; growth every growth_interval steps, one more
    skip each time it overshoots, is left out)."""
    p = evidence.record.get("precision_config") or {}
    k = round(math.log2(float(p.get("init_scale") or 65536.0)))
    skips, first = 0, None
    for step, top in zip(evidence.steps, evidence.tops):
        while top is not None and top + k > fm.FP16.top_exp:
            k, skips = k - 1, skips + 1
            first = step if first is None else first
    return (k if any(t is not None for t in evidence.tops) else None), skips, first


def paper_scale(evidence: RunEvidence) -> float | None:
    """The static scale plain `precision=mixed` applies in the run's experiment (its
    paper_loss_scale); None where it scales dynamically."""
    value = (evidence.record.get("config") or {}).get("paper_loss_scale")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def default_recipe(evidence: RunEvidence) -> str:
    """The key of the recipe plain `precision=mixed` runs in the run's experiment."""
    return "dynamic" if paper_scale(evidence) is None else "paper"


def predict_all(evidence: RunEvidence, keep: float) -> Advice:
    """The §3.2 static scale of the run's gradients, and each recipe's prediction (plain
    `precision=mixed` first where it is a static scale of its own)."""
    grads = gradients(evidence)
    static = static_scale(grads, keep)
    dyn, skips, first_skip = dynamic_scale(evidence)
    shifts = {"dynamic": dyn, "static": static.advised, "none": 0, "per_tensor": None}
    paper = paper_scale(evidence)
    known = paper is not None and static.advised is not None  # and there are gradients
    out = []
    for recipe in ((PAPER,) if known else ()) + RECIPES:
        # the paper's scales are powers of two (1, 8, 128): counted exactly; another would be
        # counted at the nearest power of two
        shift = round(math.log2(paper)) if recipe is PAPER else shifts[recipe.scaling]
        if recipe.window is fm.FP16 and shift is None:
            continue  # no gradients at all: nothing to scale
        p = _assemble(recipe, shift, count(evidence, recipe.window, shift))
        p.labels = {name: lay.label for name, lay in evidence.layers.items()}
        if recipe.scaling == "dynamic":
            p.skips, p.first_skip = skips, first_skip
        if not recipe.master:
            p.updates = _updates(evidence)
        if recipe.window is fm.FP16:
            p.needs = layer_needs(evidence, shift, keep)
        p.verdict = diverged_verdict(evidence) or verdict(p, static, keep)
        out.append(p)
    return Advice(evidence, static, out)


def _updates(evidence: RunEvidence) -> tuple[int, int]:
    lost = sum(lay.updates_lost for lay in evidence.layers.values())
    return lost, sum(lay.updates_nonzero for lay in evidence.layers.values())


def pct(x: float) -> str:
    """A fraction as a percentage that never reads 0 when it is not (0.004% shows as such)."""
    if x == 0:
        return "0%"
    if x < 1e-4:
        return "<0.01%"
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


AWAY_FROM_FP32 = "did not train as FP32 does"


def unusable(evidence: RunEvidence) -> tuple[str, str] | None:
    """(in short, why) the diagnostic run's gradients describe no training that works, or None
    when they may be judged: it diverged; it ended with a non-finite metric; or, for a
    classifier, its loss ended more than ten times above the ln(classes) an untrained model
    starts from (lr=1e12: loss 9e11, top-1 below chance, yet every recipe was called safe); or,
    recorded under another preset, it ended far from the FP32 run of the same settings."""
    record = evidence.record
    if record.get("status") == "diverged":
        return "diverged", str(record.get("reason") or "no reason recorded")
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    bad = sorted(k for k, v in numbers.items() if not math.isfinite(v))
    if bad:
        return "did not train", f"it ended with a non-finite {', '.join(bad)}"
    classes, loss = _classes(record), numbers.get("loss")
    if classes is None or loss is None or loss <= 10 * math.log(classes):
        far = _far_from_fp32(evidence, numbers)
        return (AWAY_FROM_FP32, far) if far else None
    why = (
        f"its final loss {loss:.3g} is far above the {math.log(classes):.2f} (ln {classes}) an "
        f"untrained {classes}-class model starts from"
    )
    top1, chance = numbers.get("top1"), 100 / classes
    if top1 is not None and top1 <= 1.1 * chance:
        why += f", and its top-1 {top1:.3g}% is at chance ({chance:.3g}%)"
    return "did not train", why


def _far_from_fp32(evidence: RunEvidence, numbers: dict[str, float]) -> str | None:
    """A diagnostic run recorded under another preset, against the completed FP32 run of the
    same settings beside it (the same folder but for the preset's): its final loss more than
    twice FP32's, or its primary metric worse by more than a tenth of FP32's."""
    record = evidence.record
    reference = _fp32_record(Path(evidence.run_dir), record)
    if reference is None:
        return None
    ref = reference[1].get("metrics") if isinstance(reference[1].get("metrics"), dict) else {}
    where = f"the same run in FP32 ({reference[0]})"
    loss, ref_loss = numbers.get("loss"), ref.get("loss")
    if _finite(ref_loss) and ref_loss > 0 and loss is not None and loss > 2 * ref_loss:
        return f"its final loss {loss:.3g} is more than twice the {ref_loss:.3g} of {where}"
    metric = record.get("primary_metric")
    value, ref_value = numbers.get(metric), ref.get(metric)
    if value is None or not _finite(ref_value):
        return None
    higher = record.get("higher_is_better") is not False
    worse = (ref_value - value) if higher else (value - ref_value)
    if worse <= 0.1 * abs(ref_value):
        return None
    side = "below" if higher else "above"
    return f"its {metric} {value:.3g} is far {side} the {ref_value:.3g} of {where}"


def _fp32_record(run_dir: Path, record: dict) -> tuple[Path, dict] | None:
    """(folder, record) of the completed FP32 run beside a run of another preset: the folder
    `<preset>-<budget>` named `fp32-<budget>`, with the same overrides' folder or without its
    telemetry ones (the plain run); None when there is none."""
    import json

    from mpt_repro.safeio import read_text

    preset, budget = record.get("precision"), record.get("budget")
    parts = list(run_dir.parts)
    if preset in (None, "fp32") or f"{preset}-{budget}" not in parts:
        return None
    at = len(parts) - 1 - parts[::-1].index(f"{preset}-{budget}")
    sibling = Path(*parts[:at], f"fp32-{budget}", *parts[at + 1 :])
    rest = [o for o in sibling.name.split(",") if not o.startswith("telemetry")]
    plain = sibling.with_name(",".join(rest)) if rest else sibling.parent
    for folder in (sibling, plain):
        try:
            found = json.loads(read_text(folder / "run.json"))
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and found.get("status") == "completed":
            return folder, found
    return None


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _classes(record: dict) -> int | None:
    """The number of classes of a run whose task's loss is a cross-entropy over them (its Task
    says so: loss_is_cross_entropy_over_classes), or None."""
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    if not _loss_over_classes(config.get("task")):
        return None
    for group in ("data", "model"):
        n = (config.get(group) or {}).get("num_classes")
        if isinstance(n, int) and n >= 2:
            return n
    return None


def _loss_over_classes(kind) -> bool:
    """Whether the registered task `kind` says its loss is a cross-entropy over classes (False
    for a task no plugin here registers)."""
    from mpt_repro.errors import ConfigError
    from mpt_repro.tasks import task_class

    if not isinstance(kind, str):
        return False
    try:
        return bool(task_class(kind).loss_is_cross_entropy_over_classes)
    except (ConfigError, ImportError, TypeError):  # not registered here, or its plugin failed
        return False


def lower_lr(evidence: RunEvidence) -> float | None:
    """A tenth of the learning rate of a diagnostic run whose evidence cannot be used (None: it
    can, or its record names no learning rate)."""
    found = unusable(evidence)
    if found is None or found[0] == AWAY_FROM_FP32:  # there the preset, not the rate, is to change
        return None
    lr = ((evidence.record.get("config") or {}).get("optim") or {}).get("lr")
    return float(lr) / 10 if isinstance(lr, (int, float)) and lr > 0 else None


def diverged_verdict(evidence: RunEvidence) -> str | None:
    """A diagnostic run that diverged or did not train describes no training that works: no
    recipe is called safe on it (every one was, and its learning rate was suggested again)."""
    found = unusable(evidence)
    if found is None:
        return None
    return f"unknown: the diagnostic run {found[0]}; run it again with {retry_words(evidence)}"


def retry_words(evidence: RunEvidence) -> str:
    """What a new diagnostic run changes first: precision=fp32 where this one's preset lost what
    FP32 keeps, else a tenth of its learning rate."""
    found = unusable(evidence)
    if found is not None and found[0] == AWAY_FROM_FP32:
        return "precision=fp32 (an FP32 diagnostic run sees every gradient)"
    lr = lower_lr(evidence)
    return f"optim.lr={lr:g}" if lr is not None else "a lower optim.lr"


def verdict(p: Prediction, static: StaticScale, keep: float) -> str:
    """One line: "safe", "needs scaling >= 2^k", "loses x% of updates without a master copy",
    "not advised: overflow in layer L", or how many gradients it loses and where."""
    tol, total, fmt = 1.0 - keep, p.total, p.recipe.window
    # the kind that loses most decides: activation and weight gradients differ in number
    lost = max(c.fraction("lost") for c in p.kinds.values())
    if total.overflow:
        layer = max(p.layers, key=lambda n: p.layers[n].overflow)
        return (
            f"not advised: overflow in layer {p.shown(layer)} (gradients above {fmt.max_finite:g})"
        )
    if not p.recipe.master and p.updates_lost > tol:
        return f"loses {pct(p.updates_lost)} of updates without a master copy"
    if lost > tol and fmt is fm.FP16 and p.recipe.scaling == "none":
        return f"needs scaling >= 2^{static.k_under}: loses {pct(lost)} of gradients without"
    if lost > tol and fmt is fm.FP16:
        names = ", ".join(n.shown for n in p.needs[:3]) or "no single layer"
        return f"loses {pct(lost)} of gradients at 2^{p.shift}; own scale needed: {names}"
    if lost > tol:
        worst = p.worst_layers(1)[0][0]
        return f"not advised: loses {pct(lost)} of gradients (worst: layer {p.shown(worst)})"
    if total.at_risk and p.recipe.scaling in ("static", "none"):
        return f"safe while the largest gradient stays below {fmt.max_finite:g} / 2^{p.shift}"
    return "safe"
