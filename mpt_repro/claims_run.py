"""Seeds until decided, on two disjoint seed sets: the loop scripts/reproduce_claims.py runs, and
the page it writes (docs/claims.md).

Each testable claim is judged on seed set A (its first look's seeds, shifted by the seed offset)
and again on set B (the same, shifted by REPLICA_SHIFT more): the sets never share a seed. After
each round of sweeps every pending (claim, set) is judged at its sequential rule's confidence
(mpt_repro.claims.Sequential); one that is decided or whose looks are spent stops there; the
others move to their next look (more seeds) and the next round runs only the runs still missing
(resume=true). A stop depends on the runs' numbers alone, never on how long they took, so the
page stops at the same looks on any machine (its runs being bit-identical in portable mode). The
page shows both sets' verdicts and says where they disagree.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd

from mpt_repro.claims import (
    SETTINGS,
    UNTESTED,
    Claim,
    Finding,
    Sequential,
    beyond_reach,
    judge,
    keys_text,
    refutation,
    runs_text,
    section_order,
)

# set B's seeds are set A's plus this: far past any claim's last look, so the sets never meet
REPLICA_SHIFT = 1000
SETS = ("A", "B")


@dataclass
class Judged:
    """One claim on one seed set: its last finding and why the seeds stopped there."""

    claim: Claim
    finding: Finding
    stopped: str


def first_seeds(claim: Claim, offset: int) -> tuple[int, ...]:
    """The first look's seeds: the file's, else 0, 1, ...; then as many more as the first look
    needs; all shifted by `offset`."""
    seeds = list(claim.runs.seeds) or list(range(claim.sequential.looks[0]))
    return tuple(s + offset for s in more_seeds(seeds, claim.sequential.looks[0]))


def more_seeds(seeds: list[int] | tuple[int, ...], n: int) -> list[int]:
    """`seeds` followed by the next integers after its largest, to n seeds in all."""
    out = list(seeds)
    while len(out) < n:
        out.append(max(out) + 1)
    return out


def with_seeds(claim: Claim, seeds: tuple[int, ...]) -> Claim:
    return replace(claim, runs=replace(claim.runs, seeds=tuple(seeds)))


def tiny(claim: Claim) -> Claim:
    """The claim at budget=smoke on one seed without its overrides, one look: every step of the
    pipeline in seconds (no verdict can come of it: the page says "structure only")."""
    if claim.runs is None:
        return claim
    runs = replace(claim.runs, budget="smoke", seeds=(0,), overrides=(), telemetry_every=2)
    return replace(claim, runs=runs, sequential=Sequential(looks=(1,)))


def decide_claims(
    claims: list[Claim],
    run_round: Callable[[list[Claim]], None],
    load: Callable[[], pd.DataFrame],
    offset: int = 0,
    replicate: bool = True,
) -> dict[tuple[str, str], Judged]:
    """{(claim name, set): Judged} for every claim on each seed set: rounds of `run_round`
    (the sweeps of the pending claims' runs) and `load` (the runs table) until each is decided
    or its rule or budget stops it. Untestable claims are judged once, the same on both sets."""
    sets = SETS if replicate else SETS[:1]
    out: dict[tuple[str, str], Judged] = {}
    pending: dict[tuple[str, str], Claim] = {}
    for claim in claims:
        for name in sets:
            if claim.runs is None or claim.setting in UNTESTED:
                out[(claim.name, name)] = Judged(claim, judge(claim, pd.DataFrame()), "")
                continue
            shift = offset + (REPLICA_SHIFT if name == "B" else 0)
            pending[(claim.name, name)] = with_seeds(claim, first_seeds(claim, shift))
    while pending:
        run_round(list(pending.values()))
        runs = load()
        for key, claim in list(pending.items()):
            finding = judge(claim, runs)
            stop = _stop(claim, finding)
            if stop:
                out[key] = Judged(claim, beyond_reach(finding), stop)
                del pending[key]
            else:
                nxt = claim.sequential.next_look(len(claim.runs.seeds))
                pending[key] = with_seeds(claim, tuple(more_seeds(claim.runs.seeds, nxt)))
    return out


def _stop(claim: Claim, finding: Finding) -> str:
    """Why the claim's seeds stop at this look ("" to go on to the next)."""
    rule, n = claim.sequential, len(claim.runs.seeds)
    if finding.decided:
        return f"decided at {n} seeds"
    if len(finding.seeds) < n:
        return f"stopped: {n - len(finding.seeds)} of its {n} seeds have no run (see the sweeps)"
    if rule.next_look(n) is None:
        return f"undecided after the last look ({n} seeds)"
    return ""


def agreement(a: Finding, b: Finding | None) -> str:
    """How set B's verdict reads against set A's."""
    if b is None:
        return "not replicated"
    if a.claim.setting in UNTESTED:
        return "—"
    if a.decided and b.decided:
        return "agree" if a.verdict == b.verdict else "DISAGREE"
    if a.decided or b.decided:
        return "only one set decided"
    return "neither set decided"


# -- the page -------------------------------------------------------------------------------
def machine_text() -> str:
    """The machine the page was made on: CPU model, cores, torch's CPU capability."""
    import torch

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"{model}, {os.cpu_count()} CPUs, torch {torch.__version__} (CPU capability "
        f"{capability}), Python {platform.python_version()}"
    )


def summary_table(judged: dict[tuple[str, str], Judged]) -> list[str]:
    """One row per claim, in the paper's order: the verdict on each seed set, the seeds used."""
    lines = [
        "| Claim | Section | Verdict (seeds A) | Replication (seeds B) | Agreement | Seeds A; B |",
        "|---|---|---|---|---|---|",
    ]
    for claim in _in_order(judged):
        a, b = judged[(claim.name, "A")], judged.get((claim.name, "B"))
        seeds = "; ".join(_seed_text(j) for j in (a, b) if j is not None)
        cells = [claim.statement, claim.section, a.finding.verdict,
                 b.finding.verdict if b else "—", agreement(a.finding, b and b.finding),
                 seeds if claim.runs else "—"]  # fmt: skip
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _in_order(judged: dict[tuple[str, str], Judged]) -> list[Claim]:
    claims = {j.claim.name: j.claim for (_, s), j in judged.items() if s == "A"}
    return sorted(claims.values(), key=lambda c: (section_order(c.section), c.name))


def _seed_text(j: Judged) -> str:
    seeds = j.finding.seeds
    if not seeds:
        return "none"
    if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}–{seeds[-1]} ({len(seeds)})"
    return ",".join(map(str, seeds))


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def claim_section(judged: dict[tuple[str, str], Judged], claim: Claim) -> list[str]:
    """A claim's details: what it states, each test (tolerance and its reason, what would
    refute it, the result and the resolution reached on each seed set), evidence, runs."""
    a, b = judged[(claim.name, "A")], judged.get((claim.name, "B"))
    lines = [f"### {claim.section}: {claim.statement}", ""]
    lines.append(f"- keys: {keys_text(claim.keys)}; file: `conf/claims/{claim.name}.yaml`")
    if claim.setting in UNTESTED:
        return [*lines, f"- **{SETTINGS[claim.setting]}**: {claim.why}", ""]
    lines.append(f"- setting: {SETTINGS[claim.setting]}: {claim.why}")
    said = agreement(a.finding, b and b.finding)
    verdicts = f"**{a.finding.verdict}** on seeds A" + (
        f", **{b.finding.verdict}** on seeds B ({said})" if b else ""
    )
    lines.append(f"- verdict: {verdicts}")
    if said == "DISAGREE":
        lines.append("- the two seed sets disagree: the claim is not replicated")
    for j, name in ((a, "A"), (b, "B")):
        if j is not None and j.finding.verdict == UNTESTED["scale"]:
            lines.append(f"- not testable at this scale on seeds {name}: {j.finding.reason}")
    lines.append(f"- seeds until decided: {claim.sequential.text()}")
    if claim.amendment:
        lines.append(f"- amended: {claim.amendment}")
    for j, name in ((a, "A"), (b, "B")):
        if j is not None:
            lines.append(f"- seeds {name}: {_seed_text(j)}, {j.stopped}; runs: "
                         f"{runs_text(j.claim.runs, j.finding.seeds)}")  # fmt: skip
    lines += ["", *_tests_table(claim, a, b), ""]
    shown = [e for e in a.finding.evidence[len(claim.tests) :] if e]
    lines += [f"- evidence (set A): {e}" for e in shown]
    return [*lines, ""] if shown else lines


def _tests_table(claim: Claim, a: Judged, b: Judged | None) -> list[str]:
    lines = [
        "| Test | Tolerance or threshold, and why | Refuted by | Seeds A | Seeds B |",
        "|---|---|---|---|---|",
    ]
    for i, test in enumerate(claim.tests):
        shown = f"{test.threshold * test.scale:.3g}{test.unit}"
        tol = f"±{test.tolerance}" if test.kind == "delta" else shown
        why = f"{tol}: {test.reason}" if test.reason else f"{tol} (no reason stated)"
        results = [_result(j, i) for j in (a, b) if j is not None] + ([] if b else ["—"])
        cells = [_test_words(test), why, refutation(test, test.tolerance), *results]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _test_words(test) -> str:
    if test.kind == "delta":
        metric = test.metric or "primary metric"
        return f"{test.preset} {test.expect} {test.reference} ({metric})"
    if test.kind == "spread":
        return f"SD of {test.figure} over {test.preset} seeds {test.expect} {test.threshold:g}"
    against = test.reference or f"{test.threshold * test.scale:.3g}{test.unit}"
    return f"{test.label or test.figure}: {test.preset} {test.expect} {against}"


def _result(j: Judged, index: int) -> str:
    if index >= len(j.finding.outcomes):
        return j.finding.verdict + (f": {j.finding.reason}" if j.finding.reason else "")
    o = j.finding.outcomes[index]
    reached = f"; resolution reached ±{o.half_width:.3g}" if o.half_width is not None else ""
    return f"{o.verdict}: {o.shown or o.reason}{reached}"


def page_text(
    judged: dict[tuple[str, str], Judged], header: list[str], sweeps: list[str], tiny: bool
) -> str:
    """docs/claims.md: the header lines (made, commits, command), the summary, each claim, the
    sweeps."""
    top = ["# What this suite reproduces on a laptop", ""]
    if tiny:
        top += ["**Structure only** (`--tiny`: budget=smoke, one seed a set, no verdict can be "
                "drawn from these numbers).", ""]  # fmt: skip
    counts = pd.Series([j.finding.verdict for (_, s), j in judged.items() if s == "A"])
    tally = ", ".join(f"{n} {verdict}" for verdict, n in counts.value_counts().items())
    lines = [
        *top,
        *header,
        "",
        "## Verdicts",
        "",
        "Seeds A and seeds B are disjoint; each claim was decided on each set by its own "
        f"sequential rule. Seeds A: {tally}.",
        "",
        *summary_table(judged),
        "",
        "## The claims, their tests, and what would have refuted them",
        "",
    ]
    for claim in _in_order(judged):
        lines += claim_section(judged, claim)
    lines += ["## The sweeps", "", *sweeps, ""]
    return "\n".join(lines)
