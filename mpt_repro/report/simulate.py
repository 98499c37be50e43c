"""The report's verdicts on data with a known truth: the coverage of its interval and the error
rates of its verdicts, measured (docs/report.md, "How well the verdicts work").

Each replication draws an evaluation set of N items from a population and n seeds, trains
nothing, and scores each run on each item by a probit model of an image classifier's top-1:

    correct(run, item) = [μ + σ_b·b_item + e_item·preset + a_seed + a'_run + ε_run,item > 0]

b_item (the item's difficulty, shared by every run), a_seed (the seed's effect, shared by the two
presets of one seed), a'_run (what the preset changes in one seed's run), ε (run × item noise,
correlated ρ between the two presets of one seed), e_item (a preset's effect on particular
items) and a shift m of the preset, all normal. The truth, Δ = 100·(P(correct | preset) −
P(correct | fp32)) over the population of items and seeds, has a closed form (probit of a sum of
normals), so the interval's coverage and the verdicts' errors are counted against it. The
report's own functions judge every replication: crossed_evidence (the bootstrap of the items),
interval and verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

from mpt_repro.evidence import Ratio
from mpt_repro.report.compare import Delta, Settings, crossed_evidence, interval, verdict

TOP1 = Ratio("top1", "items", "images", scale=100.0)


@dataclass(frozen=True)
class Scenario:
    """How two presets' runs relate (the standard deviations of the model above)."""

    name: str
    rho: float  # correlation of the two presets' run × item noise within one seed
    seed_sd: float  # a_seed: shared by both presets of a seed
    run_sd: float  # a'_run: each run's own
    item_effect_sd: float = 0.0  # e_item: the preset affects particular items
    item_sd: float = 1.5  # b_item: items' difficulty
    accuracy: float = 97.0  # fp32's top-1 over the population (%)

    def fp32_scale(self) -> float:
        return math.sqrt(1 + self.item_sd**2 + self.seed_sd**2 + self.run_sd**2)

    def preset_scale(self) -> float:
        return math.sqrt(self.fp32_scale() ** 2 + self.item_effect_sd**2)

    @property
    def mu(self) -> float:
        return float(ndtri(self.accuracy / 100)) * self.fp32_scale()

    def truth(self, shift: float) -> float:
        """Δ in points for a preset shifted by `shift` on the probit scale."""
        preset = ndtr((self.mu + shift) / self.preset_scale())
        return 100 * float(preset - ndtr(self.mu / self.fp32_scale()))

    def shift_for(self, delta: float) -> float:
        return brentq(lambda m: self.truth(m) - delta, -5, 5)


SCENARIOS = (
    Scenario("paired runs", rho=0.6, seed_sd=0.15, run_sd=0.05),
    Scenario("per-item effect", rho=0.6, seed_sd=0.15, run_sd=0.05, item_effect_sd=0.5),
    Scenario("independent runs", rho=0.0, seed_sd=0.0, run_sd=0.15),
)


def replicate(
    scenario: Scenario, n: int, items: int, shift: float, rng: np.random.Generator
) -> list[tuple[dict, dict]]:
    """One replication's per-item columns: [(preset's, fp32's)] per seed."""
    difficulty = scenario.item_sd * rng.standard_normal(items)
    effect = scenario.item_effect_sd * rng.standard_normal(items)
    runs = []
    for _ in range(n):
        seed = scenario.seed_sd * rng.standard_normal()
        noise = rng.standard_normal(items)
        own = math.sqrt(1 - scenario.rho**2) * rng.standard_normal(items)
        fp32 = scenario.mu + difficulty + seed + scenario.run_sd * rng.standard_normal() + noise
        preset = scenario.mu + shift + difficulty + effect + seed
        preset = preset + scenario.run_sd * rng.standard_normal() + scenario.rho * noise + own
        runs.append((_columns(preset > 0), _columns(fp32 > 0)))
    return runs


def _columns(correct: np.ndarray) -> dict[str, np.ndarray]:
    return {"top1": correct.astype(float), "items": np.ones(len(correct))}


def judged(runs: list[tuple[dict, dict]], tolerance: float, settings: Settings) -> Delta:
    """The report's verdict on one replication (as compare.paired_delta builds it)."""
    diffs = [TOP1.value(_sums(mine)) - TOP1.value(_sums(ref)) for mine, ref in runs]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1))
    evidence = crossed_evidence(runs, TOP1, "images", settings)
    d = Delta("preset", "top1", True, n, mean, None, None, tolerance, 0, n, "", sd=sd)
    d.evidence, d.confidence = evidence, settings.confidence
    d.low, d.high = interval(d)
    d.verdict = verdict(d)
    return d


def _sums(columns: dict[str, np.ndarray]) -> dict[str, float]:
    return {k: float(v.sum()) for k, v in columns.items()}


@dataclass
class Cell:
    scenario: str
    n: int
    delta: float  # the true difference, points
    reps: int = 0
    covered: int = 0
    matches: int = 0
    worse_or_better: int = 0
    differs: int = 0
    no_verdict: int = 0
    estimated_var: float = 0.0  # mean of the interval's variance estimate
    # the same with the shared-draw bootstrap variance in place of the items' main effect (the
    # estimator before issue 41, which counted the seed x item part twice)
    double_counted_var: float = 0.0
    means: list = field(default_factory=list)  # the replications' d̄, for their variance

    def add(self, d: Delta) -> None:
        self.reps += 1
        self.covered += d.low is not None and d.low <= self.delta <= d.high
        self.matches += d.decision == "matches"
        self.worse_or_better += d.decision in ("worse", "better")
        self.differs += d.decision == "differs"
        self.no_verdict += d.decision == "no verdict"
        seed_part = (d.sd or 0.0) ** 2 / d.n
        self.estimated_var += seed_part + (d.evidence.se or 0.0) ** 2
        self.double_counted_var += seed_part + (d.evidence.shared_var or 0.0)
        self.means.append(d.mean)

    def row(self) -> dict:
        share = 100 / max(self.reps, 1)
        return {
            "scenario": self.scenario,
            "seeds": self.n,
            "true Δ": round(self.delta, 3),
            "replications": self.reps,
            "coverage %": round(self.covered * share, 1),
            "matches %": round(self.matches * share, 1),
            "worse/better %": round(self.worse_or_better * share, 1),
            "differs %": round(self.differs * share, 1),
            "no verdict %": round(self.no_verdict * share, 1),
            "variance ratio": round(self.variance_ratio, 2),
        }

    @property
    def variance_ratio(self) -> float:
        """The interval's mean variance estimate over the replications' actual variance of d̄."""
        return (self.estimated_var / self.reps) / float(np.var(self.means, ddof=1))

    @property
    def double_counted_ratio(self) -> float:
        return (self.double_counted_var / self.reps) / float(np.var(self.means, ddof=1))


def run_cell(
    scenario: Scenario,
    n: int,
    delta: float,
    tolerance: float,
    reps: int,
    items: int = 360,
    resamples: int = 500,
    seed: int = 0,
) -> Cell:
    """`reps` replications of one cell, each judged by the report (bootstrap of `resamples`)."""
    settings = Settings("fp32", 0.95, {}, resamples, 0)
    rng = np.random.default_rng([seed, n, int(delta * 1000), len(scenario.name)])
    shift = scenario.shift_for(delta)
    cell = Cell(scenario.name, n, scenario.truth(shift))
    for r in range(reps):
        runs = replicate(scenario, n, items, shift, rng)
        cell.add(judged(runs, tolerance, replace(settings, bootstrap_seed=r)))
    return cell
