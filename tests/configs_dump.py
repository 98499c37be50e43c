"""Compose every experiment x budget (and the ImageNet experiments with data=synthetic, and a
budget that trains on another data set with its recipe's: translation's smoke and short) and write
the resolved configs as flat {dotted key: value} maps: a golden file that shows, in review, every
value a config change moved.

    PYTHONPATH=$PWD .venv/bin/python tests/configs_dump.py            # compare with the golden file
    PYTHONPATH=$PWD .venv/bin/python tests/configs_dump.py --write    # after an intended change

`precision` and `telemetry` are left out: experiments and budgets never set them (the config test
checks that switching presets changes nothing else). Each experiment's other recipes (those not
its default: `recipe=nvcaffe` for AlexNet, `recipe=public` for VGG-16, ...) are composed too, and
one preset, `precision=adaptive`, is kept whole in PRESET_CASES so its knobs show as well.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
GOLDEN = Path(__file__).resolve().parent / "golden" / "composed_configs.json"
LEFT_OUT = ("precision", "telemetry")
# cases whose precision node is kept (the preset's knobs, e.g. precision.adaptive_formula)
PRESET_CASES = [["experiment=scaling_matters", "budget=short", "precision=adaptive"]]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def flatten(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out: dict = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def cases() -> list[list[str]]:
    out = []
    for experiment in options("experiment"):
        for budget in options("budget"):
            out.append([f"experiment={experiment}", f"budget={budget}"])
    return out


def compose_all() -> dict[str, dict]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from mpt_repro import catalog
    from mpt_repro.config import recipes, register_configs

    register_configs()
    if not GlobalHydra.instance().is_initialized():
        initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3").__enter__()
    result = {}
    for overrides in cases():
        cfg = compose(config_name="config", overrides=overrides)
        variants = [overrides]
        if cfg.data.name == "imagenet":  # the shape keys must survive data=synthetic
            variants.append([*overrides, "data=synthetic"])
        own = catalog.experiments().get(cfg.experiment_name)
        if own and catalog.budget_data(own.name, cfg.budget.name) != own.data:
            variants.append([*overrides, f"data={own.data}"])  # translation: WMT when asked
        others = [r for r in recipes(cfg.experiment_name) if r != cfg.recipe]
        variants += [[*overrides, f"recipe={r}"] for r in others]
        for ov in variants:  # the case itself is composed already
            c = cfg if ov is overrides else compose(config_name="config", overrides=ov)
            plain = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
            for key in LEFT_OUT:
                plain.pop(key, None)
            result[" ".join(ov)] = flatten(plain)
    for ov in PRESET_CASES:
        c = compose(config_name="config", overrides=ov)
        plain = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
        plain.pop("telemetry", None)
        result[" ".join(ov)] = flatten(plain)
    return result


def differences(golden: dict, now: dict) -> list[str]:
    """What moved: every case and value in the golden file must be unchanged; keys added since
    (new schema fields) are not differences."""
    out = []
    for case, values in golden.items():
        if case not in now:
            out.append(f"{case}: no longer composed")
            continue
        for key, value in values.items():
            if key not in now[case]:
                out.append(f"{case}: {key} removed (was {value!r})")
            elif now[case][key] != value:
                out.append(f"{case}: {key} = {now[case][key]!r} (was {value!r})")
    out += [f"{case}: new case" for case in now if case not in golden]
    return out


def main(argv: list[str]) -> int:
    now = compose_all()
    if "--write" in argv:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(now, indent=0, sort_keys=True) + "\n")
        print(f"wrote {len(now)} composed configs to {GOLDEN}")
        return 0
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    if out:
        out.write_text(json.dumps(now, indent=0, sort_keys=True) + "\n")
    diff = differences(json.loads(GOLDEN.read_text()), now)
    print("\n".join(diff) or f"all {len(now)} composed configs unchanged")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
