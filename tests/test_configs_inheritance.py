"""Config inheritance (issue 17.3): the ImageNet budget files share parents and hold only their
deltas, the ImageNet shape is stated once, and the composed configs are what they were."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from configs_dump import CONF_DIR, GOLDEN, compose_all, differences, flatten, options

BUDGETS = CONF_DIR / "experiment_budget"


def _body(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def test_every_composed_config_matches_the_golden_file() -> None:
    """Every experiment x budget (and data=synthetic for the ImageNet ones) composes to the values
    recorded in tests/golden/composed_configs.json. An intended change regenerates that file
    (`python tests/configs_dump.py --write`), and its diff shows what moved."""
    golden = json.loads(GOLDEN.read_text())
    diff = differences(golden, compose_all())
    assert not diff, "composed configs changed:\n" + "\n".join(diff[:40])


def test_budget_children_hold_only_their_delta() -> None:
    """A child that lists a parent sets no key to the value the parent already gives it."""
    for child in sorted(BUDGETS.glob("[!_]*.yaml")):
        body = _body(child)
        parents = [d for d in body.get("defaults", []) if isinstance(d, str) and d != "_self_"]
        for parent in parents:
            inherited = flatten(_body(BUDGETS / f"{parent}.yaml"))
            own = flatten({k: v for k, v in body.items() if k != "defaults"})
            repeated = {k for k, v in own.items() if k in inherited and inherited[k] == v}
            assert not repeated, f"{child.name} repeats {sorted(repeated)} from {parent}.yaml"


def test_imagenet_budgets_inherit_one_parent_each() -> None:
    imagenet = [e for e in options("experiment") if _lists_imagenet_parent(e)]
    assert len(imagenet) == 6  # the six Table 1 rows
    for experiment in imagenet:
        for budget in ("short", "smoke"):
            defaults = _body(BUDGETS / f"{experiment}_{budget}.yaml").get("defaults", [])
            assert defaults[0] == f"_imagenet_{budget}", (experiment, budget)


def _lists_imagenet_parent(experiment: str) -> bool:
    defaults = _body(CONF_DIR / "experiment" / f"{experiment}.yaml").get("defaults", [])
    return "_base/imagenet" in defaults


def test_imagenet_shape_is_stated_once() -> None:
    """num_classes and channels of ImageNet appear in one experiment-side file (the parent), not
    in each experiment; they still reach every ImageNet experiment under data=synthetic."""
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        data = _body(path).get("data") or {}
        if _lists_imagenet_parent(path.stem):
            assert "num_classes" not in data and "channels" not in data, path.name
    golden = json.loads(GOLDEN.read_text())
    synthetic = [case for case in golden if case.endswith("data=synthetic")]
    assert len(synthetic) == 6 * len(options("budget"))
    for case in synthetic:
        assert golden[case]["data.num_classes"] == 1000 and golden[case]["data.channels"] == 3
