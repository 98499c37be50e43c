"""Which recipe to run, from the advice's own table, and whether plain `precision=mixed` is enough.

The candidates are the FP16 recipes with an FP32 master copy the table measured: plain
`precision=mixed` as the experiment sets it (dynamic scaling, or the paper's static scale where
the experiment states one), dynamic scaling, no loss scaling, and the §3.2 static scale. Each is
judged as its verdict is, by the kind of gradients (activation or weight) that loses the larger
share, overflowed values counted as lost; a recipe whose values certainly overflow is not a
candidate (a static scale would skip those steps for ever). The best is the lowest share; a tie
goes to the simpler recipe, in the order above, so the default wins every tie.

Plain `precision=mixed` is recommended ("enough") when its share exceeds the best's by at most
MARGIN x the tolerance (0.5% of the gradients at keep 0.99): a gain smaller than that is not worth
a setting of its own. BF16, FP8 and the
recipes without a master copy are other hardware or ablations, not candidates; when even the best
candidate loses more than the tolerance, the text names the layers that need their own scale and
what BF16 would lose.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpt_repro.advise import formats as fm
from mpt_repro.advise.predict import Advice, Prediction, default_recipe, unusable

# tie order: the default first, then the recipe with fewer settings (no number to choose last)
ORDER = ("paper", "dynamic", "no_scaling", "static")
# a candidate must beat plain precision=mixed by more than this share of the tolerance
MARGIN = 0.5


@dataclass
class Recommendation:
    best: Prediction  # the candidate with the lowest loss (ties: ORDER)
    default: Prediction  # plain precision=mixed in this experiment
    losses: dict[str, float]  # candidate's recipe key -> share of the kind that loses most
    margin: float  # as a share of the gradients: MARGIN x the tolerance
    tolerance: float

    @property
    def default_enough(self) -> bool:
        """Plain precision=mixed is a candidate and loses at most `margin` more than the best."""
        own = self.losses.get(self.default.recipe.key)
        return own is not None and own <= self.losses[self.best.recipe.key] + self.margin

    @property
    def chosen(self) -> Prediction:
        return self.default if self.default_enough else self.best


def _share(c: fm.RangeCounts) -> float:
    return c.fraction("lost") + c.fraction("overflow")


def loss(p: Prediction) -> float:
    """The share of the kind that loses most (as the verdicts weigh it), overflow included."""
    return max(_share(c) for c in p.kinds.values())


def recommend(advice: Advice) -> Recommendation | None:
    """None when nothing can be recommended: no gradient was recorded, the diagnostic run
    diverged or did not train (its verdicts are "unknown"), or the default itself is not
    measured."""
    if advice.static.advised is None or unusable(advice.evidence) is not None:
        return None
    default = advice.prediction(default_recipe(advice.evidence))
    candidates = [
        p
        for key in ORDER
        if (p := advice.prediction(key)) is not None
        and (p.recipe.scaling == "dynamic" or not p.total.overflow)
    ]
    if default is None or not candidates:
        return None
    losses = {p.recipe.key: loss(p) for p in candidates}  # the default: only as a candidate
    best = min(candidates, key=lambda p: losses[p.recipe.key])  # min keeps the first of a tie
    tolerance = 1.0 - advice.static.keep
    return Recommendation(best, default, losses, MARGIN * tolerance, tolerance)


def worst_kind(p: Prediction) -> str:
    """The kind ("act" or "weight") whose share `loss` is."""
    return max(p.kinds, key=lambda k: _share(p.kinds[k]))


def what(p: Prediction) -> str:
    """A candidate in words."""
    if p.recipe.key == "paper":
        return f"the experiment's static scale {2.0**p.shift:g}"
    if p.recipe.key == "static":
        return f"the §3.2 static scale 2^{p.shift}"
    return {"dynamic": "dynamic loss scaling", "no_scaling": "no loss scaling"}[p.recipe.key]
