"""The catalog: what exists, read from conf/ (and the task registry): presets, experiments,
budgets, recipes, data sets (the task registry is mpt_repro.tasks.registered()).

The lowest layer beside the configuration: mpt-run (config.py), the run-time logger, the reporter,
the tests and scripts/reproduce_table.sh ask here instead of keeping their own lists, so a new
preset, experiment, budget or task needs a config file (or a registered task) and nothing else.
Reading conf/ needs only omegaconf (no torch); `tasks()` imports the registry.

    python -m mpt_repro.catalog presets|experiments|budgets|table1|others [--sep ,]
    python -m mpt_repro.catalog data EXPERIMENT      # the conf/data/ file its recipe uses
    python -m mpt_repro.catalog data-root EXPERIMENT BUDGET   # e.g. "LM_ROOT embedded"
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

# The configs ship inside the package (mpt_repro/conf is a link to the repository's conf/, which a
# wheel carries as files), so Hydra finds them from any working directory, editable or not.
CONF_DIR = Path(__file__).resolve().parent / "conf"


def conf_dir() -> Path:
    """The suite's own config folder."""
    return CONF_DIR


def conf_dirs() -> list[Path]:
    """The config folders mpt-run composes from, in Hydra's search order: the suite's, then each
    plugin's (mpt_repro.registry.config_dir, or hydra.searchpath on the command line)."""
    from mpt_repro import registry

    return [CONF_DIR, *registry.config_dirs()]


def group_files(group: str) -> dict[str, Path]:
    """{option: its file} of a config group over every config folder (the first one wins)."""
    return _group_files(tuple(conf_dirs()), group)


@lru_cache(maxsize=256)
def _group_files(folders: tuple[Path, ...], group: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted((folder / group).glob("*.yaml")):
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def config_file(group: str, name: str) -> Path:
    """Where option `name` of `group` is (a path in conf/ that does not exist if nowhere)."""
    return group_files(group).get(name) or CONF_DIR / group / f"{name}.yaml"


def options(group: str) -> list[str]:
    """The options of a config group, from its folders (e.g. the budgets or presets)."""
    return [name for name in group_files(group) if not name.startswith("_")]


# -- a name that is not there: the one "did you mean" of every refusal ----------------------------
# how close a misspelt name must be to a known one for mpt-run to suggest it (difflib's ratio)
CLOSE_ENOUGH = 0.7
# the example a group's refusal gives when nothing typed is close: the default of conf/config.yaml,
# except where the default is costly (budget=paper trains the full recipe: GPU-days)
CHEAP_EXAMPLES = {"budget": "smoke"}
PLUGIN_HINT = (
    "an experiment of a plugin is listed once its module is named in MPT_PLUGINS or by an entry "
    "point (docs/adding-an-experiment.md)"
)


def nearest(name: str, known: Iterable[str], n: int = 2) -> list[str]:
    """The known names closest to a misspelt one, best first (none when nothing is close): the
    rule every "did you mean" of mpt-run follows, for keys and for a group's options alike."""
    return difflib.get_close_matches(name, list(known), n, CLOSE_ENOUGH)


def default_options() -> dict[str, str]:
    """{group: option} of conf/config.yaml's defaults list."""
    found = {}
    for entry in _load(CONF_DIR / "config.yaml").get("defaults") or []:
        if isinstance(entry, dict):
            found.update({str(k): str(v) for k, v in entry.items()})
    return found


def unknown_option(group: str, option: str, known: list[str] | None = None) -> str:
    """One line for `group=option` where the group has no such option: the nearest option, the
    group's options and a cheap example; for an experiment, how a plugin's is named."""
    known = known or options(group)
    close = nearest(option, known)
    hint = f" (did you mean {' or '.join(f'{group}={c}' for c in close)}?)" if close else ""
    example = CHEAP_EXAMPLES.get(group) or default_options().get(group)
    example = example if example in known else (known[0] if known else "...")
    listed = ", ".join(known) if known else "see mpt-run --help"
    text = f"{group}={option}: there is no such {group}{hint}; {group} is one of: {listed}"
    text += "" if close else f" (e.g. {group}={example})"
    return f"{text}; {PLUGIN_HINT}" if group == "experiment" else text


def model_options() -> list[str]:
    return options("model")


def option_schemas(group: str) -> dict[str, str]:
    """{option: the name of its schema} for a group with a schema per option (model, data), as
    each option's file names it (`- /schema/<group>@_here_: <name>` in its defaults)."""
    found = {}
    for name in options(group):
        for entry in _load(config_file(group, name)).get("defaults") or []:
            if isinstance(entry, dict):
                for key, value in entry.items():
                    if key.startswith(f"/schema/{group}"):
                        found[name] = str(value)
    return found


def recipes(experiment: str) -> list[str]:
    """The recipes an experiment has: public (the experiment file's own settings) and every
    recipe R with a conf/experiment_recipe/<experiment>_<R>.yaml (e.g. nvcaffe)."""
    known = options("recipe")
    files = [s for s in group_files("experiment_recipe") if s.startswith(f"{experiment}_")]
    return sorted({"public"} | {r for stem in files if (r := stem[len(experiment) + 1 :]) in known})


def _load(path: Path) -> dict[str, Any]:
    """A config file as plain containers, as ``OmegaConf.to_container(OmegaConf.create(text))``
    gives it (interpolations left as written), parsed by libyaml where PyYAML has it."""
    import yaml

    from mpt_repro.safeio import read_text  # a FIFO among the configs: refused, not waited on

    text, loader = read_text(path), _yaml_loader()
    if loader is None:  # an omegaconf without the loader this reads its rules from
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    else:
        data = yaml.load(text, Loader=loader)
    return data if isinstance(data, dict) else {}


@lru_cache(maxsize=1)
def _yaml_loader() -> type | None:
    """OmegaConf's YAML loader (YAML 1.2 floats such as 1e-3, no timestamps, duplicate keys
    refused) on libyaml's C parser: mpt-run reads every experiment file and its data file
    before a run (~80 files), which took ~0.7 s of CPU of each run's start through the
    pure-Python parser and OmegaConf's containers. Without libyaml, OmegaConf's own loader;
    None where omegaconf no longer has it where 2.3 keeps it (a private module): then the
    catalog reads through OmegaConf itself, as before."""
    import yaml

    try:
        from omegaconf._utils import get_yaml_loader
    except ImportError:
        return None
    rules = get_yaml_loader()
    if not getattr(yaml, "__with_libyaml__", False):
        return rules

    class CLoader(yaml.cyaml.CParser, rules):  # the C parser, OmegaConf's constructor/resolver
        def __init__(self, stream: Any) -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    return CLoader


def _group(name: str) -> dict[str, Path]:
    return group_files(name)


# ---------------------------------------------------------------- presets


@lru_cache(maxsize=1)
def presets() -> dict[str, dict[str, Any]]:
    """Preset name -> its conf/precision/<name>.yaml fields, in the display order."""
    found = {name: _load(path) for name, path in _group("precision").items()}
    return {name: found[name] for name in preset_order(found, found)}


# compute dtypes in the order the tables show them: the FP32 baselines, then FP16 (the paper's
# subject), then BF16 (after the paper), then 8-bit floats (a preset with an `fp8` mode)
_DTYPE_RANK = {"float32": 0, "float16": 1, "bfloat16": 2, "fp8": 3}


def _fp8_mode(config: Mapping[str, Any]) -> str | None:
    """The preset's 8-bit mode (emulated, torchao), or None when it does not use FP8."""
    fp8 = config.get("fp8")
    mode = fp8.get("mode") if isinstance(fp8, Mapping) else None
    mode = getattr(mode, "name", mode)  # an enum from a composed config
    return None if mode in (None, "none", "off", False) else str(mode)


def preset_sort_key(name: str, config: Mapping[str, Any] | None) -> tuple:
    """Where a preset goes among the columns, from what it does (its config), not from a list.

    Baselines first (FP32 compute; strict before TF32), then FP16 presets with more of the paper's
    two techniques on first (an FP32 master copy, §3.1, counting FP32 weights under autocast as
    one, and loss scaling, §3.2), within those FP32-weight autocast before FP16 storage and a
    global scale before other scalers, then BF16, then FP8 presets (whatever their base dtype);
    a preset whose config is unknown goes last. Name breaks ties. Gives today: fp32 tf32 amp
    mixed pseudo_fp16 adaptive no_master no_scaling fp16 bf16, then the FP8 presets.
    """
    if not isinstance(config, Mapping) or "compute_dtype" not in config:
        return (9, name)
    dtype_name = "fp8" if _fp8_mode(config) else str(config.get("compute_dtype"))
    dtype = _DTYPE_RANK.get(dtype_name, len(_DTYPE_RANK))
    autocast = config.get("weights") == "fp32_autocast"
    master = bool(config.get("master_weights")) or autocast
    scaling = str(config.get("loss_scaling") or "none")
    techniques = int(master) + int(scaling != "none")
    global_scale = scaling in ("none", "static", "dynamic", "paper")
    return (
        dtype,
        bool(config.get("allow_tf32")),
        -techniques,
        not autocast,
        not global_scale,
        name,
    )


def preset_order(
    names: Iterable[str], configs: Mapping[str, Mapping[str, Any]] | None = None
) -> list[str]:
    """`names` in the display order. `configs` (name -> precision config, e.g. from the run
    records' precision_config) wins over conf/ for a preset it holds, so a record from a preset
    that conf/ no longer has (or a user's own) is still placed by what it did."""
    names = list(dict.fromkeys(n for n in names if isinstance(n, str)))
    configs = dict(configs or {})

    def config_of(name: str):
        if name in configs:
            return configs[name]
        path = config_file("precision", name)
        return _cached_preset(str(path)) if path.exists() else None

    return sorted(names, key=lambda n: preset_sort_key(n, config_of(n)))


@lru_cache(maxsize=64)
def _cached_preset(path: str) -> dict[str, Any]:
    return _load(Path(path))


# ---------------------------------------------------------------- experiments


@dataclass(frozen=True)
class Experiment:
    name: str  # experiment_name (the folder name of its runs)
    task: str
    data: str  # the data config its recipe trains on (conf/data/<data>.yaml)
    file: str  # conf/experiment/<file>.yaml: what `experiment=` selects
    data_name: str = ""  # that config's `name`, as run.json records it (data.name)
    data_choice: str = ""  # the experiment file's choice as written: may depend on ${budget}


@lru_cache(maxsize=1)
def experiments() -> dict[str, Experiment]:
    """experiment_name -> Experiment, for every conf/experiment/*.yaml."""
    out = {}
    for stem, path in _group("experiment").items():
        body = _load(path)
        choice = _data_override(path)
        data = data_option(choice, "paper")
        name = str(body.get("experiment_name") or stem)
        data_file = config_file("data", data)
        data_name = str(_load(data_file).get("name") or data) if data_file.exists() else data
        task = str(body.get("task") or "classification")
        out[name] = Experiment(name, task, data, stem, data_name, choice)
    return out


def data_option(choice: str, budget: str) -> str:
    """The conf/data/ option a data choice trains on at a budget: `${budget}` filled in, then a
    hidden alias (conf/data/_<name>.yaml, whose defaults list names one option) followed. An
    experiment picks its data by budget so (translation: `_translation_${budget}`) because Hydra
    refuses a group override in a file chosen by interpolation, such as experiment_budget/."""
    name = choice.replace("${budget}", budget)
    path = config_file("data", name)
    if name.startswith("_") and path.exists():
        for entry in _load(path).get("defaults") or []:
            if isinstance(entry, str) and entry != "_self_":
                return entry
    return name


def budget_data(experiment: str, budget: str) -> str | None:
    """The data option an experiment trains on at a budget: its recipe's, unless the budget
    switches (translation at smoke and short: the embedded bible_enes); None if unknown."""
    found = experiments().get(experiment)
    if found is None or not found.data:
        return None
    option = data_option(found.data_choice, budget)
    # a budget without an alias file (one Hydra would refuse): the recipe's, not a missing name
    return option if (config_file("data", option)).exists() else found.data


def _data_override(path: Path) -> str:
    """The data config an experiment file selects ("override /data: imagenet"), also through
    the parents it lists in its defaults (e.g. `_base/imagenet`, in the experiment group)."""
    data = ""
    for entry in _load(path).get("defaults") or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if key.split()[-1].strip("/") == "data":
                    data = str(value)
        elif isinstance(entry, str) and entry != "_self_":
            parent = config_file("experiment", entry.removeprefix("/experiment/"))
            if parent.exists():
                data = _data_override(parent) or data
    return data


def own_data(experiment: str) -> str | None:
    """The data set an experiment's recipe uses (its paper's) as run.json names it (data.name),
    or None for an unknown experiment."""
    found = experiments().get(experiment)
    return (found.data_name or found.data) if found and found.data else None


# ---------------------------------------------------------------- budgets


@dataclass(frozen=True)
class Budget:
    name: str
    description: str
    trims: bool  # the budget changes the recipe (steps, data, sizes); False: the full recipe


@lru_cache(maxsize=1)
def budgets() -> dict[str, Budget]:
    """Budget name -> Budget, for every conf/budget/*.yaml. A budget trims the recipe when its
    file sets anything besides `budget:` or an experiment has a delta file for it
    (conf/experiment_budget/<experiment>_<budget>.yaml)."""
    deltas = set(group_files("experiment_budget"))
    out = {}
    for stem, path in _group("budget").items():
        body = _load(path)
        meta = body.get("budget") or {}
        name = str(meta.get("name") or stem)
        trims = bool(set(body) - {"budget", "defaults"}) or any(
            d.endswith(f"_{name}") for d in deltas
        )
        out[name] = Budget(name, str(meta.get("description") or ""), trims)
    return out


def full_recipe(budget: str, experiment: str | None = None) -> bool:
    """True when runs at this budget train the experiment's whole recipe (nothing trimmed)."""
    found = budgets().get(budget)
    if found is None:
        return False
    if experiment is not None:
        stem = experiments()[experiment].file if experiment in experiments() else experiment
        if (config_file("experiment_budget", f"{stem}_{budget}")).exists():
            return False
    return not found.trims


def data_root(experiment: str, budget: str) -> tuple[str, bool] | None:
    """Where the folder of an experiment's data set comes from in scripts/reproduce_table.sh:
    (the environment variable, whether the budget has an embedded stand-in), or None when the
    data set takes no folder (conf/data/<data>.yaml has no `root`). The variable is <DATA>_ROOT
    (LM_ROOT for the corpus, the name the docs have always used). A budget has a stand-in when
    its delta file (conf/experiment_budget/<experiment>_<budget>.yaml) sets the data's root or
    switches the data set (the embedded corpus, the digits), or when the experiment trains on
    another data set at that budget (budget_data: translation's embedded bible_enes)."""
    found = experiments().get(experiment)
    if found is None or not found.data:
        return None
    data_file = config_file("data", found.data)
    if not data_file.exists() or "root" not in _load(data_file):
        return None
    var = "LM_ROOT" if found.data == "corpus" else f"{found.data.upper()}_ROOT"
    delta = config_file("experiment_budget", f"{found.file}_{budget}")
    data = _load(delta).get("data") if delta.exists() else None
    embedded = isinstance(data, dict) and ("root" in data or "name" in data)
    return var, embedded or budget_data(experiment, budget) != found.data


# ---------------------------------------------------------------- command line


def table1_experiments() -> list[str]:
    """The experiments of the paper's Table 1 that conf/ has, in the paper's row order."""
    from mpt_repro.paper import table1_reference  # the paper's rows

    known = experiments()
    return [e for e in table1_reference()["experiment"] if e in known]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mpt_repro.catalog", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "what",
        choices=["presets", "experiments", "budgets", "table1", "others", "data", "data-root"],
        help="others: the experiments that are not rows of the paper's Table 1; data: the data "
        "set an experiment's recipe uses; data-root: the variable naming its folder, whether "
        "the budget has an embedded stand-in (`LM_ROOT embedded`; nothing: no folder needed) "
        "and, when the budget trains on another data set, the option that reads the folder "
        "(`WMT15_ENFR_ROOT embedded wmt15_enfr`: data=wmt15_enfr data.root=$WMT15_ENFR_ROOT)",
    )
    parser.add_argument("experiment", nargs="?", help="for data, data-root: the experiment")
    parser.add_argument("budget", nargs="?", help="for data-root: the budget")
    parser.add_argument("--sep", default=" ", help="separator between names (default: space)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.what == "presets":
        names = list(presets())
    elif args.what == "experiments":
        names = sorted(experiments())
    elif args.what == "budgets":
        names = sorted(budgets())
    elif args.what == "table1":
        names = table1_experiments()
    elif args.what in ("data", "data-root"):
        found = experiments().get(args.experiment or "")
        if found is None:
            parser.error(f"no experiment {args.experiment!r} in conf/experiment/")
        if args.what == "data":
            names = [found.data]
        else:
            root = data_root(found.name, args.budget or "")
            names = [] if root is None else [root[0], "embedded" if root[1] else "folder"]
            if root is not None and budget_data(found.name, args.budget or "") != found.data:
                names.append(found.data)
    else:
        table1 = set(table1_experiments())
        names = [e for e in sorted(experiments()) if e not in table1]
    print(args.sep.join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
