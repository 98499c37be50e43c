"""A run's identity: the one name of its directory, and which runs it may be compared with.

Two questions, one answer each, shared by mpt-run (single runs and sweeps alike), the logger and
the reporter. Nothing here imports torch or reads conf/.

**The run directory** (`run_path`):
`<study>/<precision>-<budget>/seed<N>[/<variant>]` under `paths.runs_dir`, where

- `study` is the experiment's name, or `<experiment>-<model.name>` for your own model
  (`model=custom`; `model.name` defaults to the factory's import path), so a custom model never
  lands in the folder of the experiment whose recipe it borrows;
- `variant` names the other command-line overrides, sorted by key, `key=value` joined by `,`.
  Each value is written as the configuration reads it (Hydra's escapes undone, so a sweep's
  `a\\:b` and a single run's `a:b` give one folder; `1e-4` and `0.0001` give one folder), then every
  character outside ``A-Z a-z 0-9 . _ - + = , : @`` is percent-encoded (RFC 3986 style: `/` is
  `%2F`, a space `%20`, `[` `%5B`), so a path pasted into a shell is one word that globs to itself.
  Keys that are already in the path, or that do not change what is trained (`VARIANT_LEFT_OUT`),
  are left out.

**Comparison** (`comparison_config`): two runs may be set side by side (a row, a difference, a
pair of curves) only when their resolved configurations are equal once the precision recipe, the
seed and the keys that cannot change a result (`NOT_COMPARED`) are taken out. The reporter groups
runs by `comparison_key` and labels groups of one experiment by the keys in which they differ
(`difference_labels`). docs/report.md states the rule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

# -- keys ------------------------------------------------------------------------------------------
# Left out of the variant folder (an entry ending in "." covers every key under it; the others
# are exact, so `precision=mixed` is left out and `precision.init_scale=1024` is not): already in
# the path (experiment, precision, budget, seed, the custom model's identity), run controls, where
# things are, and switches that do not change what is trained. Telemetry does not change what is
# trained either, but a diagnostic run gets a folder of its own, so that it can sit beside the
# same run without telemetry (the reporter counts the two once). data.root and
# model.backbone_weights are long paths: they are not in the name, and a resume refuses a
# directory whose run used other data (run.py); the reporter still compares them.
VARIANT_LEFT_OUT = (
    "experiment",
    "precision",
    "budget",
    "seed",
    "resume",
    "overwrite",
    "trainer.device",
    "trainer.progress",
    "paths.runs_dir",
    "data.root",
    "data.num_workers",
    "hydra.",
    "model.backbone_weights",
)
# ... and for a custom model, the keys that name it (they are in the study folder)
CUSTOM_MODEL_KEYS = ("model", "model.name", "model.target")

# Left out of a comparison: the recipe under study and the replicate, then keys that cannot
# change a result. Everything else in the resolved configuration must be equal.
NOT_COMPARED = (
    "precision",  # what is compared
    "seed",  # the replicate: differences over seeds are the noise the CI measures
    "paper_loss_scale",  # the experiment's static scale, read only by the scaling presets
    "resume",
    "overwrite",
    "paths",
    "trainer.device",  # the hardware is compared through the record's device (its own key)
    # how the CPU's kernels were picked is the machine's part: the reporter labels a group whose
    # records differ in it ("machine differs: ..."), as it does for code versions
    "trainer.portable",
    "trainer.progress",
    "trainer.log_every",  # when rows are written, not what is trained
    "trainer.checkpoint_every",  # a resumed run equals an uninterrupted one (tests/test_run.py)
    "data.num_workers",  # the order of samples is fixed by the seed and epoch (EpochSampler)
    "data.pin_memory",
    "telemetry",  # observes gradients, changes none (tests/test_report_comparison.py)
    "distributed.timeout_s",
    # fsdp2: when a block's gathered weights are freed (memory and time, the same numbers)
    "distributed.reshard_after_forward",
)
# Keys added after records were written, at the value that runs what those records ran: left
# out of a comparison at that value, so that a run of today pairs with one written before them.
# A DDP run and an FSDP2 run are never one identity (distributed.strategy is compared, and the
# report labels a group by it), although with distributed.reduce_dtype=preset their numbers are
# meant to match up to the order of the reductions (docs/distributed.md says which were measured).
ADDED_AT = {
    "distributed.strategy": "ddp",
    "distributed.reduce_dtype": "preset",
    # moved into the option schemas of the tasks that read them (issue 48; MOVED): at the value
    # every other task ran, left out, so a task without the option pairs with its old records
    "model.label_smoothing": 0.0,
    "model.loss_times_steps": False,
    "model.embedding_grad_scale": 1.0,
}
# Keys a record written before issue 48 names by their old place: compared under the new name
MOVED = {
    "optim.label_smoothing": "model.label_smoothing",
    "optim.lm_loss_times_steps": "model.loss_times_steps",
    "optim.embedding_grad_scale": "model.embedding_grad_scale",
}


def _under(key: str, prefixes: Iterable[str]) -> bool:
    """`key` is one of `prefixes` or lies under one of them."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _listed(key: str, entries: Iterable[str]) -> bool:
    """`key` is an entry, or lies under an entry that ends in "."."""
    return any(key == e or (e.endswith(".") and key.startswith(e)) for e in entries)


# -- the run directory -----------------------------------------------------------------------------
# characters a folder name keeps as they are: unreserved URI characters plus the override syntax
SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-+=,:@")


def escape(text: str) -> str:
    """Percent-encode every character outside SAFE (UTF-8 bytes, upper-case hex)."""
    return "".join(
        ch if ch in SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in text
    )


def render_value(value: Any) -> str:
    """A parsed override value as the configuration holds it, in one canonical spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)  # 0.0001 for 1e-4 and 0.0001 alike; inf, nan
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{render_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def parse_overrides(overrides: Iterable[str]) -> list:
    """Hydra's own parse of override strings (escapes undone, quotes removed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([str(o) for o in overrides])


def variant_name(overrides: Iterable[str], custom_model: bool = False) -> str:
    """The folder that names a run's other overrides ("" when there are none); see the module
    docstring for the spelling."""
    left_out = VARIANT_LEFT_OUT + (CUSTOM_MODEL_KEYS if custom_model else ())
    items = []
    for o in parse_overrides(overrides):
        key = o.key_or_group
        if _listed(key, left_out) or o.package is not None:
            continue
        if o.is_delete():
            items.append((key, f"~{key}"))
            continue
        items.append((key, f"{key}={render_value(o.value())}"))
    return escape(",".join(text for _, text in sorted(items)))


def is_custom_model(model: Mapping[str, Any] | Any) -> bool:
    """Whether a model config is the user's own (model=custom): it names a factory, or its name
    is its (empty) target, as conf/model/custom.yaml's `name: ${.target}` makes it when no target
    was given (validation then says what to set)."""
    if isinstance(model, Mapping) or hasattr(model, "get"):
        target, name = model.get("target"), model.get("name")
    else:
        target, name = getattr(model, "target", None), getattr(model, "name", None)
    return bool(target) or (target is not None and name == target)


def study_name(experiment: str, model: Mapping[str, Any] | Any) -> str:
    """The first folder of a run: the experiment, or `<experiment>-<model.name>` for a custom
    model (escaped like a variant)."""
    if not is_custom_model(model):
        return str(experiment)
    name = model.get("name") or model.get("target") or "custom"  # "": refused by validation
    return f"{experiment}-{escape(str(name))}"


def run_path(
    experiment: str, model: Any, precision: str, budget: str, seed: int, overrides: Iterable[str]
) -> str:
    """`<study>/<precision>-<budget>/seed<N>[/<variant>]`, relative to paths.runs_dir."""
    path = f"{study_name(experiment, model)}/{precision}-{budget}/seed{seed}"
    variant = variant_name(overrides, custom_model=is_custom_model(model))
    return f"{path}/{variant}" if variant else path


def register_resolvers() -> None:
    """`${mpt_run_path:...}` for conf/config.yaml's hydra.run.dir and hydra.sweep.subdir."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("mpt_run_path"):
        OmegaConf.register_new_resolver("mpt_run_path", run_path, use_cache=False)


# -- comparison ------------------------------------------------------------------------------------
# besides NOT_COMPARED: what a run's path and setting already say (the experiment, preset, budget,
# seed, data set and model, and a custom model's identity), and the preset's knobs (a preset
# variant is a column of its own, mpt_repro.report.collect)
NOT_A_RECIPE_CHANGE = (
    "experiment",
    "budget",
    "data",
    "data.root",
    "model",
    *CUSTOM_MODEL_KEYS,
    "model.kwargs",
    "hydra",
)


def recipe_changes(overrides: Iterable[str]) -> list[str]:
    """The command-line overrides that changed what a run trained or evaluated from the recipe
    conf/ defines for its experiment and budget (`trainer.max_steps=300`, `data.eval_limit=100`,
    `optim.lr=0.01`): a run with one is not the full recipe, and the reporter names them in its
    label. Sorted; the text as typed (a leading + or ~ dropped)."""
    found = []
    for text in overrides:
        key, sep, _ = str(text).lstrip("+~").partition("=")
        if not sep or _under(key, NOT_COMPARED) or _under(key, NOT_A_RECIPE_CHANGE):
            continue
        found.append(str(text).lstrip("+~"))
    return sorted(found)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value} of a nested mapping (lists are leaves)."""
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        if not node and prefix:
            out[prefix[:-1]] = {}
        return out
    return {prefix[:-1]: node}


def comparison_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flattened resolved configuration with NOT_COMPARED taken out."""
    if not isinstance(config, Mapping):
        return {}
    flat = {MOVED.get(k, k): v for k, v in flatten(config).items()}
    return {
        k: v
        for k, v in flat.items()
        if not _under(k, NOT_COMPARED) and not (k in ADDED_AT and v == ADDED_AT[k])
    }


def comparison_key(config: Mapping[str, Any] | None) -> str:
    """A short digest of comparison_config: equal keys, comparable runs ("" when the record has no
    configuration: such a run is compared with nothing)."""
    return digest(comparison_config(config))


def digest(flat: Mapping[str, Any]) -> str:
    """A short, stable digest of a flat mapping ("" for an empty one)."""
    if not flat:
        return ""
    text = json.dumps(dict(flat), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def difference_labels(configs: Mapping[str, Mapping[str, Any]], most: int = 4) -> dict[str, str]:
    """For comparison groups of one experiment ({key: comparison_config}), a label each: the keys
    whose values differ between the groups, as `key=value` ("" when there is one group). Beyond
    `most` keys the rest are counted ("... +3 more")."""
    if len(configs) < 2:
        return {k: "" for k in configs}
    keys = sorted({k for flat in configs.values() for k in flat})
    missing = object()
    varying = [
        k
        for k in keys
        if len({json.dumps(c.get(k, missing), default=str) for c in configs.values()}) > 1
    ]
    labels = {}
    for group, flat in configs.items():
        # a key left out at the value older records ran (ADDED_AT) is shown at it: strategy=ddp
        parts = [f"{k}={_shown(flat.get(k, ADDED_AT.get(k, missing)), missing)}" for k in varying]
        extra = len(parts) - most
        labels[group] = ", ".join(parts[:most]) + (f", … +{extra} more" if extra > 0 else "")
    return labels


def _shown(value: Any, missing: object) -> str:
    if value is missing:
        return "(unset)"
    return render_value(value)
