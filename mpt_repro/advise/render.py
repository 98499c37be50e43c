"""The advice as Markdown (for the console, advice.md and mpt-report) and as JSON (advice.json:
every count behind every figure)."""

from __future__ import annotations

import shlex

from mpt_repro.advise import formats as fm
from mpt_repro.advise.evidence import KIND_NAMES, KINDS, RunEvidence
from mpt_repro.advise.predict import (
    AWAY_FROM_FP32,
    Advice,
    Prediction,
    default_recipe,
    lower_lr,
    pct,
    retry_words,
    scale_text,
    unusable,
)
from mpt_repro.advise.recommend import (
    MARGIN,
    Recommendation,
    loss,
    recommend,
    what,
    worst_kind,
)
from mpt_repro.advise.scale import gradients

# Overrides of the diagnostic run that a run of a recipe does not repeat: the recipe sets its own
# precision, telemetry observes only, a diagnostic run is cut short, and overwrite/resume were
# said of the diagnostic run's folder, not of the new run's.
_NOT_REPEATED = ("precision", "telemetry", "trainer.max_steps", "overwrite", "resume")


def run_command(evidence: RunEvidence, prediction: Prediction, plain: bool = False) -> str:
    """The mpt-run command of a recipe: the diagnostic run's own overrides, less _NOT_REPEATED,
    plus the recipe's (plain: `precision=mixed` alone, for the
    recipe it runs by default)."""
    lr = lower_lr(evidence)  # a run that diverged: not its learning rate again
    dropped = _NOT_REPEATED + (("optim.lr",) if lr is not None else ())
    keep = [
        o
        for o in evidence.record.get("overrides") or []
        if not any(o.lstrip("+~").split("=")[0].startswith(k) for k in dropped)
    ]
    if lr is not None:
        keep.append(f"optim.lr={lr:g}")
    recipe = ["precision=mixed"] if plain else prediction.overrides()
    return shlex.join(["mpt-run", *keep, *recipe])


def _scale_cell(p: Prediction) -> str:
    if p.shift is None:
        return "per tensor"
    if p.recipe.window is not fm.FP16:
        return "none"
    text = f"2^{p.shift} = {scale_text(p.shift)}" if p.shift else "1"
    if p.skips:
        text += (
            f", after {p.skips} skipped step{'s' if p.skips > 1 else ''} (by step {p.first_skip})"
        )
    return text


def _kind_cells(c: fm.RangeCounts) -> list[str]:
    over = pct(c.fraction("overflow"))
    if c.at_risk:
        over += f" (+{pct(c.fraction('at_risk'))} at risk)"
    return [pct(c.fraction("lost")), pct(c.fraction("subnormal")), over]


def _layer_cell(c: fm.RangeCounts) -> str:
    text = pct(c.fraction("lost"))
    if c.overflow or c.at_risk:
        text += f"; {c.overflow + c.at_risk} values overflow or may"
    return text


def recipe_table(advice: Advice) -> list[str]:
    head = (
        "| recipe | loss scale | act. grads lost | subnormal | overflow | weight grads lost "
        "| subnormal | overflow | updates lost | worst layers (lost) | verdict |"
    )
    lines = [head, "|" + "---|" * 11]
    default = default_recipe(advice.evidence)
    for p in advice.predictions:
        worst = ", ".join(f"{p.shown(n)} ({_layer_cell(c)})" for n, c in p.worst_layers())
        upd = "0 (master copy)" if p.recipe.master else pct(p.updates_lost)
        # the preset it runs as, so that `no_scaling` is found by the name mpt-run knows
        plain = ", its default here" if p.recipe.key == default else ""
        cells = [f"{p.recipe.title} (`{p.recipe.overrides[0]}`{plain})", _scale_cell(p)]
        cells += _kind_cells(p.kinds["act"]) + _kind_cells(p.kinds["weight"])
        cells += [upd, worst or "none", p.verdict]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def static_lines(advice: Advice) -> list[str]:
    """The §3.2 scale both ways, with the histogram bins each bound comes from."""
    s, grads = advice.static, gradients(advice.evidence)
    if s.advised is None:
        return ["No nonzero gradient was recorded: there is no scale to choose."]
    e_max = fm.top_exponent(grads)
    keep_pct = f"{100 * s.keep:g}%"
    kept = fm.range_counts(grads, fm.FP16, s.advised)
    lines = [
        f"- **Overflow bound**: the largest gradient is in bin {e_max} ([2^{e_max}, "
        f"2^{e_max + 1})), so max|g| · 2^{s.k_over} < 2^{e_max + 1 + s.k_over} <= 65504: "
        f"**s <= 2^{s.k_over} = {scale_text(s.k_over)}**.",
        f"- **Underflow bound**: keeping {keep_pct} of the nonzero gradients at or above 2^-24 "
        f"needs bins e >= {-24 - s.k_under} kept: "
        f"**s >= 2^{s.k_under} = {scale_text(s.k_under)}**.",
    ]
    if s.margin >= 0:
        why = f"margin {s.margin} binades; the advised scale is its middle"
    else:
        why = (
            f"margin {s.margin} binades: no single scale does both; the advised scale is the "
            "overflow bound, and the layers below need their own"
        )
    lines.append(
        f"- {why}: **2^{s.advised} = {scale_text(s.advised)}**, which keeps "
        f"{_kept(kept)} of the nonzero gradients (bins e >= {-24 - s.advised})."
    )
    static = advice.prediction("static")
    if static is not None:  # the recommendation above says whether to prefer it
        lines.append(f"- This scale as a run: `{run_command(advice.evidence, static)}`")
    return lines


def recommendation_lines(advice: Advice) -> list[str]:
    """Which recipe to run and whether plain `precision=mixed` is enough (recommend.py's rule),
    with the command to run it."""
    r = recommend(advice)
    if r is None:
        found = unusable(advice.evidence)
        if found is not None:
            return [f"None: the diagnostic run {found[0]} (above); run it again first."]
        return ["None: no nonzero gradient was recorded."]
    chosen, default = r.chosen, r.default
    shares = {k: pct(v) for k, v in r.losses.items()}
    lost = (
        f"{shares[chosen.recipe.key]} of its {KIND_NAMES[worst_kind(chosen)]} (the kind that "
        "loses more)"
        if r.losses[chosen.recipe.key]
        else "no gradient"
    )
    if r.default_enough and chosen is r.best:
        head = (
            f"**Plain `precision=mixed` ({what(default)}) is enough**: no FP16 recipe with a "
            f"master copy measured here loses fewer gradients. It loses {lost}"
        )
    elif r.default_enough:
        head = (
            f"**Plain `precision=mixed` ({what(default)}) is enough**: it loses {lost}, within "
            f"{pct(r.margin)} ({MARGIN:g} x the {pct(r.tolerance)} tolerance) of the best "
            f"measured, {what(r.best)} ({shares[r.best.recipe.key]})"
        )
    else:
        was = shares.get(default.recipe.key)
        head = (
            f"**Use {what(chosen)}**: it loses {lost}, where plain `precision=mixed` "
            f"({what(default)}) "
            + (f"loses {was}, more than {pct(r.margin)} above it" if was else "overflows")
        )
    others = [
        f"{what(p)} loses {shares[p.recipe.key]}" for p in _candidates(advice, r) if p is not chosen
    ]
    lines = [head + (f"; the others measured: {', '.join(others)}." if others else ".")]
    if loss(chosen) > r.tolerance:
        lines.append(_beyond(advice, r))
    lines.append(f"- Run it: `{run_command(advice.evidence, chosen, plain=chosen is default)}`")
    return lines


def _candidates(advice: Advice, r: Recommendation) -> list[Prediction]:
    return [p for p in advice.predictions if p.recipe.key in r.losses]


def _beyond(advice: Advice, r: Recommendation) -> str:
    """What to do when even the recommended recipe loses more than the tolerance."""
    needs = ", ".join(n.shown for n in r.chosen.needs[:3])
    text = f"That is more than the {pct(r.tolerance)} tolerance: " + (
        f"layers {needs} would need a scale of their own (`precision=adaptive`, docs/adaptive.md)"
        if needs
        else "no single layer is to blame"
    )
    bf16 = advice.prediction("bf16")
    if bf16 is not None and loss(bf16) < loss(r.chosen):
        text += f"; BF16 (`precision=bf16`, on hardware that has it) loses {pct(loss(bf16))}"
    return text + "."


def _kept(c: fm.RangeCounts) -> str:
    """The share kept, never rounded up to 100% when something is lost."""
    if c.lost and c.fraction("lost") < 1e-3:
        return ">99.9%"
    return pct(1 - c.fraction("lost"))


def needs_lines(advice: Advice) -> list[str]:
    p = advice.prediction("static")
    if p is None:
        return ["No nonzero gradient was recorded."]
    if not p.needs:
        return [f"None: at 2^{advice.static.advised} every layer keeps its gradients."]
    lines = [
        f"At 2^{p.shift} (the advised static scale); `precision=adaptive` gives every layer its "
        "own scale (docs/adaptive.md).",
        "",
        "| layer | lost at 2^" + str(p.shift) + " | its own bounds | it needs |",
        "|---|---|---|---|",
    ]
    for n in p.needs:
        bounds = f"2^{n.own.k_under} <= s <= 2^{n.own.k_over}"
        lost = pct(n.lost) + (f", {n.at_risk} values may overflow" if n.at_risk else "")
        lines.append(f"| {n.shown} | {lost} | {bounds} | {n.need} |")
    return lines


def _bins(p: Prediction) -> list[str]:
    """The bins each count of a recipe sums (exponents of the values as recorded)."""
    w = p.recipe.window
    if p.shift is not None:
        b = fm.bins_text(w, p.shift)
        return [b["lost"], b["subnormal"], f"{b['overflow']} ({b['at_risk']} at risk)"]
    # per tensor: each sampled tensor is shifted so its top bin t lands in the format's top bin
    lo, normal = w.subnormal_exp - w.top_exp, w.normal_exp - w.top_exp
    return [f"e - t < {lo}", f"{lo} <= e - t < {normal}", "none (the scale follows t)"]


def _counts(c: fm.RangeCounts) -> str:
    return f"{c.lost:,} / {c.subnormal:,} / {c.overflow + c.at_risk:,} of {c.nonzero:,}"


def trace_lines(advice: Advice) -> list[str]:
    ev = advice.evidence
    lines = [
        "Each fraction is a count of histogram bins over the nonzero values of that histogram. "
        "The histograms are telemetry's: per layer, the sum over the sampled steps of "
        "`telemetry.jsonl` `layers.<layer>.act.hist` (activation gradients) and `.weight.hist`; "
        "the network's are their sums, the same counts as run.json's "
        "`diagnostics.telemetry.network.act_grad_histogram` and `weight_grad_histogram`. "
        "e is a bin (values in [2^e, 2^(e+1)), as recorded, unscaled); t is the top bin of one "
        "sampled tensor. advice.json holds every count, per layer too.",
        "",
        "| recipe | lost | subnormal | overflow | act. counts (lost / subn. / over. of nonzero) "
        "| weight counts |",
        "|---|---|---|---|---|---|",
    ]
    for p in advice.predictions:
        cells = [p.recipe.title, *_bins(p), _counts(p.kinds["act"]), _counts(p.kinds["weight"])]
        lines.append("| " + " | ".join(cells) + " |")
    nonfinite = sum(sum(lay.nonfinite.values()) for lay in ev.layers.values())
    if nonfinite:
        lines += ["", f"{nonfinite:,} recorded values were inf or NaN: they are in no bin."]
    return lines


def header_lines(advice: Advice) -> list[str]:
    ev = advice.evidence
    n = {k: sum(lay.numel[k] for lay in ev.layers.values()) for k in KINDS}
    nz = {k: sum(ev.network(k).values()) for k in KINDS}
    steps = ev.steps
    lines = [
        f"Read from `{ev.run_dir}`: {len(steps)} sampled steps ({steps[0]} to {steps[-1]}), "
        f"{len(ev.layers)} layers. Fractions are of the nonzero gradients: "
        + "; ".join(
            f"{KIND_NAMES[k]} {nz[k]:,} of {n[k]:,} values ({pct(1 - nz[k] / n[k])} zero)"
            for k in KINDS
            if n[k]
        )
        + f". Tolerance: {pct(1 - advice.static.keep)} of them (keep = {advice.static.keep:g})."
    ]
    found = unusable(ev)
    if found is not None:
        lr = lower_lr(ev)
        change = (
            "Change the learning rate first: the commands below use "
            + (f"a tenth of its learning rate (optim.lr={lr:g})." if lr else "its settings.")
            + " Run the diagnostic again with them."
            if found[0] != AWAY_FROM_FP32
            else f"Run the diagnostic again with {retry_words(ev)} first."
        )
        lines.insert(
            0,
            f"**The diagnostic run {found[0]}** ({found[1]}): its gradients describe no "
            f"training that works, so no recipe is called safe on them. {change}",
        )
    scales = sorted(set(ev.loss_scales))
    if ev.precision != "fp32" or scales not in ([], [1.0]):
        lines.append(
            f"Recorded under `{ev.precision}` (loss scales {', '.join(f'{s:g}' for s in scales)}): "
            "values that format already lost are zeros in these histograms, so the predictions "
            "are lower bounds. An FP32 run (the paper's §3.2 method) sees every gradient."
        )
    return lines


def markdown(advice: Advice, level: int = 2, figure: str | None = None) -> str:
    """The whole advice of one run; `level` is the heading level of its title."""
    h = "#" * level
    parts = [f"{h} Precision advice: {advice.evidence.label}", "", *header_lines(advice), ""]
    parts += [f"{h}# Recommendation", "", *recommendation_lines(advice), ""]
    parts += [f"{h}# Recipes", "", *recipe_table(advice), ""]
    parts += [f"{h}# Loss scale (paper §3.2)", "", *static_lines(advice), ""]
    parts += [f"{h}# Layers that need FP32 or their own scale", "", *needs_lines(advice), ""]
    if figure:
        parts += [f"{h}# Exponent ranges per layer", "", f"![exponent ranges]({figure})", ""]
    parts += [f"{h}# Where each figure comes from", "", *trace_lines(advice), ""]
    return "\n".join(parts)


def _counts_json(c: fm.RangeCounts) -> dict:
    return {
        "nonzero": c.nonzero,
        **{f: {"count": getattr(c, f), "fraction": c.fraction(f)} for f in fm.FIELDS},
    }


def _prediction_json(advice: Advice, p: Prediction) -> dict:
    return {
        "recipe": p.recipe.key,
        "title": p.recipe.title,
        "format": p.recipe.window.name,
        "loss_scale_log2": p.shift,
        "bins": dict(zip(("lost", "subnormal", "overflow"), _bins(p))),
        "network": {k: _counts_json(c) for k, c in p.kinds.items()},
        "layers": {n: _counts_json(c) for n, c in p.layers.items()},
        "updates": {"lost": p.updates[0], "nonzero": p.updates[1], "fraction": p.updates_lost},
        "skips": p.skips,
        "first_skip_by_step": p.first_skip,
        "needs": [
            {"layer": n.layer, "label": n.shown, "lost": n.lost, "need": n.need} for n in p.needs
        ],
        "verdict": p.verdict,
        "command": run_command(advice.evidence, p),
    }


def to_json(advice: Advice) -> dict:
    """advice.json: the inputs (the pooled histograms) and every count behind every figure."""
    ev, s = advice.evidence, advice.static
    return {
        "run_dir": str(ev.run_dir),
        "label": ev.label,
        "sampled_steps": ev.steps,
        # the keys of every "layers" below are module paths; these are how the advice names them
        "layer_labels": {name: lay.label for name, lay in ev.layers.items()},
        "histograms": {k: {str(e): c for e, c in sorted(ev.network(k).items())} for k in KINDS},
        "static_scale": {
            "keep": s.keep,
            "k_over": s.k_over,
            "k_under": s.k_under,
            "margin": s.margin,
            "advised": s.advised,
            "advised_scale": 2.0**s.advised if s.advised is not None else None,
        },
        "predictions": [_prediction_json(advice, p) for p in advice.predictions],
        "recommendation": _recommendation_json(advice),
    }


def _recommendation_json(advice: Advice) -> dict | None:
    r = recommend(advice)
    if r is None:
        return None
    return {
        "recipe": r.chosen.recipe.key,
        "best": r.best.recipe.key,
        "default": r.default.recipe.key,
        "default_enough": r.default_enough,
        "losses": r.losses,
        "margin": r.margin,
        "tolerance": r.tolerance,
        "command": run_command(advice.evidence, r.chosen, plain=r.chosen is r.default),
    }
