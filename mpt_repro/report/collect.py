"""Read every run record under a results folder into one table, and list what cannot be used.

Every outcome is shown somewhere. Completed and diverged runs go into the tables (a diverged run
is a result: the paper reports them as "diverges"). Failed, interrupted and still-running runs
are listed with their reason; a malformed record (truncated JSON, a field of the wrong type, a
missing field, an unknown schema) is listed with its problem. One bad record never stops the
report: everything about a record is checked before it is used, and whatever still goes wrong
while reading one record is caught and listed for that record alone.

Records of schemas 1 to 3 are read (README "The run record"). Schema 2 adds the status
`interrupted`, `diverged_layer`, `hint`, `metrics_detail`, `host` and `pid`; in a schema 1 record
a `failed` run stopped by SIGTERM is an interrupted one, and the first non-finite layer is in
`diagnostics.first_nonfinite_layer`. Schema 3 adds `study`, `saved_bytes_per_sample` and
`package_version`, and a diverged run's `metrics` is null. Schema 5 adds `machine` (what decided
the bits: mpt_repro/machine.py): a group whose runs' machines differ says so in its label
(`machine differs: native AVX512, ... / portable AVX2, ...`), as it does for code versions, and
so does a conflict between two records of one identity.

**Like against like.** Each run is placed in a comparison group: the runs of one subject (an
experiment, or an experiment with your own model) whose resolved configurations are equal but
for the precision preset, the seed and the keys that cannot change a result
(mpt_repro.identity). Groups of one subject and setting are labelled by the keys in which they
differ (`optim.lr=0.0001`); every table, plot and CSV compares runs within a group only.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mpt_repro.evidence import describe_dropped, dropped_share
from mpt_repro.identity import (
    comparison_config,
    difference_labels,
    digest,
    flatten,
    recipe_changes,
)
from mpt_repro.machine import numerics_label
from mpt_repro.record import (
    NO_STEP_ADVICE,
    missing_files,
    no_step_applied,
    normalised_status,
    not_a_regular_file,
    slow_low_precision,
)
from mpt_repro.safeio import open_regular, read_text

SCHEMA_VERSIONS = (1, 2, 3, 4, 5)
# statuses whose runs enter the tables, and those that are listed instead
TABULATED = ("completed", "diverged")
LISTED = ("failed", "interrupted", "running")
# the grouping key: runs are averaged over seeds only when all of these agree: the same subject and
# comparison group (equal configurations but for precision and seed), preset, budget, data set and
# device, so a synthetic-data run is never averaged with a real-data run, a CPU run with a GPU run,
# nor a run with optim.lr=0.0001 with one at the recipe's rate
SETTING_KEYS = ["budget", "data", "device"]
GROUP_KEYS = ["experiment", "subject", "comparison", "task", "precision", *SETTING_KEYS]
# a comparison group without its preset: what a preset is compared within
PAIR_KEYS = [k for k in GROUP_KEYS if k != "precision"]
# mpt-run moves an earlier run's files to <run dir>/previous-<time>/ when overwrite=true redoes it
SET_ASIDE = "previous-"
# the numbers of the cost table, as run.json names them
COST_FIELDS = [
    "wall_time_s",
    "samples_per_s",
    "peak_memory_bytes",
    "saved_bytes_per_sample",
    "steps",
    "skipped_steps",
]

_NUMBER = (int, float)
# what each field must be when present: (types, readable name). bool is not a number here.
FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "experiment": ((str,), "a string"),
    "task": ((str,), "a string"),
    "precision": ((str,), "a string"),
    "seed": ((int,), "an integer"),
    "budget": ((str,), "a string"),
    "status": ((str,), "a string"),
    "primary_metric": ((str,), "a string"),
    "higher_is_better": ((bool,), "true or false"),
    "metrics": ((dict,), "an object"),
    "metrics_detail": ((dict,), "an object"),
    "data": ((dict,), "an object"),
    "model": ((dict,), "an object"),
    "device": ((dict,), "an object"),
    "loss_scale": ((dict,), "an object"),
    "precision_config": ((dict,), "an object"),
    "diagnostics": ((dict,), "an object"),
    "config": ((dict,), "an object"),
    "evaluation": ((dict,), "an object"),
    "study": ((str,), "a string"),
    "reason": ((str,), "a string"),
    "hint": ((str,), "a string"),
    "diverged_at_step": ((int,), "an integer"),
    "diverged_layer": ((str,), "a string"),
    "epochs": (_NUMBER, "a number"),
    **{name: (_NUMBER, "a number") for name in COST_FIELDS},
}
# needed before a record can be placed in any table (or named in the list of left-out runs)
IDENTITY = ("experiment", "task", "precision", "seed", "budget", "status")


@dataclass(frozen=True)
class Problem:
    """A record left out of the tables (or kept, but to be checked), and why."""

    path: str
    # failed | interrupted | running | malformed | suspect | duplicate | replaced | no curves
    status: str
    reason: str
    run: str = ""  # "demo fp32 smoke seed0" when the record says so
    hint: str = ""  # what to do next, when the record or the reporter knows


def device_label(device: dict | None) -> str:
    """A short, stable name for the hardware: `cpu`, `cuda: NVIDIA H100 80GB HBM3`, `... ×8`."""
    if not isinstance(device, dict):
        return "unknown"
    kind = str(device.get("type") or "unknown")
    name = device.get("name")
    label = kind if not name or name == kind else f"{kind}: {name}"
    count = device.get("count")
    if isinstance(count, int) and count > 1:
        label += f" ×{count}"
    return label


def finite(x) -> bool:
    return isinstance(x, _NUMBER) and not isinstance(x, bool) and math.isfinite(x)


def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, _NUMBER) else type(value).__name__
    )


def type_errors(record: dict) -> list[str]:
    """Each field present with the wrong type: `data is a string ("digits"), expected an object`.
    null is accepted for every field (the writer uses it for "not known")."""
    errors = []
    for key, (types, expected) in FIELD_TYPES.items():
        if key not in record or record[key] is None:
            continue
        value = record[key]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            shown = json.dumps(value)[:40]
            errors.append(f"{key} is {_type_name(value)} ({shown}), expected {expected}")
    if isinstance(record.get("metrics"), dict):
        bad = [
            k
            for k, v in record["metrics"].items()
            if v is not None and (isinstance(v, bool) or not isinstance(v, _NUMBER))
        ]
        if bad:
            errors.append(f"metrics {', '.join(bad)} not numbers")
        # finite, yet past what any metric is: its square overflows a float in every comparison
        huge = [f"{k}={v:g}" for k, v in record["metrics"].items() if finite(v) and abs(v) > 1e150]
        if huge:
            errors.append(f"metrics {', '.join(huge)} beyond any value a run records (edited?)")
    return errors


def diverged_layer(record: dict) -> str | None:
    """The first layer whose gradient went non-finite: schema 2's field, else the precision
    policy's diagnostics of schema 1."""
    layer = record.get("diverged_layer")
    if isinstance(layer, str) and layer:
        return layer
    diag = record.get("diagnostics")
    layer = diag.get("first_nonfinite_layer") if isinstance(diag, dict) else None
    return layer if isinstance(layer, str) and layer else None


def subject(record: dict) -> str:
    """What a row is about: the experiment, or `experiment · model` for your own model (schema 3
    writes `model.target` for it; older records say `model.name: custom` and keep the target in
    the config)."""
    experiment = str(record.get("experiment"))
    model = record.get("model") if isinstance(record.get("model"), dict) else {}
    if model.get("target"):
        return f"{experiment} · {model.get('name') or model['target']}"
    if model.get("name") == "custom":
        config = record.get("config") if isinstance(record.get("config"), dict) else {}
        target = (config.get("model") or {}).get("target")
        return f"{experiment} · {target or 'custom'}"
    return experiment


def run_name(record: dict) -> str:
    parts = [subject(record), record.get("precision"), record.get("budget")]
    seed = record.get("seed")
    parts.append(f"seed{seed}" if seed is not None else None)
    return " ".join(str(p) for p in parts if p is not None)


def outcome(record: dict) -> str:
    """How a tabulated run ended, in words: what a cell or a CSV row shows instead of a number
    that is not a result."""
    status = normalised_status(record)
    if status == "diverged":
        text = "diverged"
        if record.get("diverged_at_step") is not None:
            text += f" at step {record['diverged_at_step']}"
        layer = diverged_layer(record)
        return text + (f" (layer {layer})" if layer else "")
    bad = nonfinite_names(record)
    if bad:
        return f"completed, non-finite {', '.join(bad)}"
    if no_step_applied(record):
        return f"completed, no step applied (all {record['steps']} skipped)"
    return str(status)


def nonfinite_names(record: dict) -> list[str]:
    """The final metrics of a record that are NaN or infinite."""
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    return sorted(k for k, v in metrics.items() if not finite(v))


def _check(record, path: Path) -> Problem | None:
    """Why this record cannot be tabulated, or None when it can."""
    where = str(path.parent)
    if not isinstance(record, dict):
        return Problem(where, "malformed", "run.json does not hold a JSON object")
    version = record.get("schema_version")
    if version not in SCHEMA_VERSIONS:
        return Problem(
            where,
            "malformed",
            f"schema_version {version!r}; this reporter reads "
            f"{', '.join(map(str, SCHEMA_VERSIONS[:-1]))} and {SCHEMA_VERSIONS[-1]}",
            run_name(record),
            "update mpt-repro, or re-run with this version",
        )
    name = run_name(record)
    status = normalised_status(record)
    hint = record.get("hint") if isinstance(record.get("hint"), str) else ""
    reason = record.get("reason") if isinstance(record.get("reason"), str) else ""
    # not in the tables whatever else the record holds: list it by its outcome
    if status == "failed":
        return Problem(where, "failed", reason or "no reason recorded", name, hint)
    if status == "interrupted":
        return Problem(
            where,
            "interrupted",
            reason or "stopped before the end",
            name,
            hint or "continue it: the same command with resume=true",
        )
    if status == "running":
        # the trainer rewrites the record at the end, so `running` means in progress or killed
        started = record.get("started_at") or "an unknown time"
        return Problem(
            where,
            "running",
            f"still running, or killed without a chance to record it (started {started})",
            name,
            hint or "if no process runs it any more, the same command with resume=true",
        )
    problems = []
    missing = [k for k in IDENTITY if k not in record or record[k] is None]
    if missing:
        problems.append(f"missing fields: {', '.join(missing)}")
    problems += type_errors(record)
    if status not in (*TABULATED, *LISTED) and "status" not in missing:
        problems.append(f"unknown status {status!r}")
    problems += _unplaceable(record)
    if not problems and status == "completed":
        metric = record.get("primary_metric")
        if not isinstance(record.get("metrics"), dict) or metric is None:
            problems.append("completed but without metrics or primary_metric")
        elif metric not in record["metrics"]:
            problems.append(f"completed but its primary metric {metric!r} is not in metrics")
    if problems:
        return Problem(where, "malformed", "; ".join(problems), name)
    return None


def _unplaceable(record: dict) -> list[str]:
    """What keeps a record out of every comparison group: a preset name no precision/*.yaml has
    (it would become a column of its own), no resolved `config` (every other run would be
    labelled with all its keys as the difference)."""
    from mpt_repro.catalog import presets

    found = []
    preset = record.get("precision")
    if isinstance(preset, str) and preset not in presets():
        known = ", ".join(presets())
        found.append(f"precision {preset!r} is no preset of this suite ({known}): edited?")
    if normalised_status(record) in TABULATED and not isinstance(record.get("config"), dict):
        found.append("no `config` (the resolved configuration): no comparison group to place it in")
    return found


def recipe_label(record: dict) -> str:
    """The network, optimizer and recipe behind a number, as the caption states them: "alexnet
    (caffe), sgd, public recipe" (the variant only when the model has several)."""
    model = record.get("model") or {}
    config = record.get("config") or {}
    optim = config.get("optim") if isinstance(config, dict) else None
    name = str(model.get("name") or "")
    variant = model.get("variant")
    label = f"{name} ({variant})" if variant else name
    if isinstance(optim, dict) and optim.get("name"):
        label += f", {optim['name']}"
    recipe = config.get("recipe") if isinstance(config, dict) else None
    if recipe:  # public (the experiment file's settings) or nvcaffe (docs/recipes.md)
        label += f", {recipe} recipe"
    return label


def _flatten(record: dict, path: Path) -> dict[str, Any]:
    """One row of the runs table: the grouping key, status, metrics (metric_<name>) and costs. A
    diverged run's metrics are never read (schema 3 writes null; older writers left them out)."""
    data = record.get("data") or {}
    model = record.get("model") or {}
    scale = record.get("loss_scale") or {}
    status = normalised_status(record)
    metrics = (record.get("metrics") or {}) if status == "completed" else {}
    config = record.get("config")
    # what else decides the training besides the configuration: the number of processes (the
    # global batch, the LR scaling)
    world = (record.get("distributed") or {}).get("world_size") or 1
    compared = {**comparison_config(config), "world_size": world} if config else {}
    row = {
        "path": str(path.parent),
        "experiment": record["experiment"],
        "subject": subject(record),
        "comparison": digest(compared),
        "comparison_config": compared,
        "preset_config": preset_config(record),
        "preset_tweaked": preset_tweaked(record),
        "task": record["task"],
        "precision": record["precision"],
        "seed": record["seed"],
        "budget": record["budget"],
        "data": str(data.get("name") or "unknown"),
        "data_description": str(data.get("description") or ""),
        "device": device_label(record.get("device")),
        "model": str(model.get("name") or ""),
        "recipe": recipe_label(record),
        "status": status,
        "outcome": outcome(record),
        "reason": record.get("reason"),
        "diverged_at_step": record.get("diverged_at_step"),
        "diverged_layer": diverged_layer(record),
        "primary_metric": record.get("primary_metric"),
        "higher_is_better": record.get("higher_is_better"),
        "epochs": record.get("epochs"),
        "peak_memory_kind": str(record.get("peak_memory_kind") or ""),
        "loss_scale_final": scale.get("final") if finite(scale.get("final")) else None,
        "loss_scale_min": scale.get("min") if finite(scale.get("min")) else None,
        "precision_config": record.get("precision_config"),
        "metrics_detail": record.get("metrics_detail") if status == "completed" else None,
        "schema_version": record["schema_version"],
        "nonfinite": ",".join(nonfinite_names(record)) if status == "completed" else "",
        "untrained": no_step_applied(record),
        **_provenance(record, status),
    }
    for name in COST_FIELDS:
        row[name] = record.get(name) if finite(record.get(name)) else None
    for name, value in metrics.items():
        row[f"metric_{name}"] = value if finite(value) else None
    metric = record.get("primary_metric")
    row["primary_finite"] = metric is not None and finite(metrics.get(metric))
    return row


def _provenance(record: dict, status: str) -> dict[str, Any]:
    """What a run's numbers rest on: its evaluation (schema 4; the compare module resamples its
    items), the overrides that changed its recipe, whether its device computes FP16 fast, and the
    code that ran."""
    evaluation = record.get("evaluation") if isinstance(record.get("evaluation"), dict) else {}
    done = status == "completed"
    return {
        "evaluation": (evaluation or None) if done else None,
        "eval_items": evaluation.get("items") if done else None,
        "eval_unit": evaluation.get("unit") if done else None,
        "eval_dropped_share": dropped_share(evaluation) if done else None,
        # overrides that changed the recipe (a cap on steps, data or evaluation): named in the
        # group's label, and never captioned as the full recipe; "" also where not recorded
        "recipe_changes": ", ".join(recipe_changes(record.get("overrides") or [])),
        # why the device's speed ratios say nothing about a GPU's ("" where they do)
        "slow_fp16": slow_low_precision(record.get("device")) or "",
        # the code that ran: a group whose runs differ in it says so in its label
        **{name: _code(record, name) for name in CODE_FIELDS},
        # what decided the bits on the device (schema 5; "" before): named like the code
        "machine": numerics_label(record.get("machine")),
    }


def read_record(path: Path) -> tuple[dict | None, Problem | None]:
    """(record, None) for a tabulable run.json, else (None, the problem)."""
    what = not_a_regular_file(path)
    if what:  # never opened: a FIFO would wait for a writer forever
        return None, Problem(str(path.parent), "malformed", f"run.json is {what}, not a file")
    try:
        record = json.loads(read_text(path))
    except UnicodeDecodeError as err:
        return None, Problem(str(path.parent), "malformed", f"run.json is not UTF-8 text: {err}")
    except json.JSONDecodeError as err:
        return None, Problem(
            str(path.parent), "malformed", f"cannot parse run.json (truncated or edited?): {err}"
        )
    except OSError as err:
        return None, Problem(str(path.parent), "malformed", f"cannot read run.json: {err}")
    problem = _check(record, path)
    return (None, problem) if problem else (record, None)


def load_runs(root: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """All run.json under `root`: the tabulable runs as a DataFrame, and the problems."""
    rows, problems = [], []
    for path in sorted(Path(root).rglob("run.json")):
        replaced = next((p for p in path.relative_to(root).parts if p.startswith(SET_ASIDE)), None)
        if replaced:
            problems.append(
                Problem(
                    str(path.parent),
                    "replaced",
                    f"an earlier run of {path.parent.parent}, kept in {replaced}/ when "
                    "overwrite=true started it again: not in the tables",
                )
            )
            continue
        record, problem = read_record(path)
        if problem:
            problems.append(problem)
            continue
        try:
            row = _flatten(record, path)
        except Exception as err:  # noqa: BLE001 - one odd record must not stop the report
            problems.append(
                Problem(str(path.parent), "malformed", f"cannot read: {type(err).__name__}: {err}")
            )
            continue
        rows.append(row)
        problems += _to_check(record, row, path)
    columns = [
        "path",
        *GROUP_KEYS,
        "group_label",
        "seed",
        "status",
        "outcome",
        "primary_metric",
        "primary_finite",
    ]
    runs = pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)
    runs = _without_direction_conflicts(runs, problems)
    runs = with_preset_variants(runs)
    runs = _without_duplicates(runs, problems)
    return with_group_labels(runs), problems


def _without_direction_conflicts(runs: pd.DataFrame, problems: list[Problem]) -> pd.DataFrame:
    """Runs of one subject and primary metric must agree on higher_is_better (the verdicts read
    it): the runs that say otherwise than most are listed as malformed and left out (all of them
    where no side has more)."""
    if runs.empty or "higher_is_better" not in runs:
        return runs
    drop = []
    for (subject_, metric), part in runs.groupby(["subject", "primary_metric"], dropna=True):
        counts = part["higher_is_better"].dropna().astype(bool).value_counts()
        if len(counts) < 2:
            continue
        most = counts.index[0] if counts.iloc[0] > counts.iloc[1] else None
        for index, row in part.iterrows():
            if pd.isna(row["higher_is_better"]) or row["higher_is_better"] == most:
                continue
            others = "the others" if most is None else f"{counts.iloc[0]} other runs"
            reason = (
                f"higher_is_better is {str(row['higher_is_better']).lower()} for {metric}, where "
                f"{others} of {subject_} say {str(not row['higher_is_better']).lower()}: edited? "
                "No verdict can tell better from worse with both"
            )
            problems.append(Problem(row["path"], "malformed", reason, run_name_of(row)))
            drop.append(index)
    return runs.drop(index=drop)


def _to_check(record: dict, row: dict, path: Path) -> list[Problem]:
    """A tabulated run the reader is told to check: it completed with a NaN (e.g. an evaluation
    loss that overflowed; it stays in the tables as recorded), or without one applied step."""
    found = []
    bad = nonfinite_names(record)
    if row["status"] == "completed" and bad:
        values = ", ".join(f"{k}={record['metrics'][k]}" for k in bad)
        kept = (
            "kept in the tables, flagged in its cell"
            if row["primary_finite"]
            else f"its {row['primary_metric']} is not averaged (the cell says so)"
        )
        reason = f"completed with non-finite final metrics ({values}); {kept}"
        found.append(Problem(str(path.parent), "suspect", reason, run_name(record)))
    dropped = describe_dropped(record.get("evaluation")) if row["status"] == "completed" else None
    if dropped:
        found.append(Problem(str(path.parent), "suspect", dropped, run_name(record)))
    gone = [
        n for n in missing_files(path.parent, record) if not not_a_regular_file(path.parent / n)
    ]
    found += [
        Problem(str(path.parent), "suspect", r, run_name(record)) for r in _damaged(path, record)
    ]
    if gone:  # the report was silent about a record whose metrics.csv was deleted
        reason = (
            f"its record's files are incomplete: {', '.join(gone)} missing (its result stands "
            "in run.json; overwrite=true trains it again to have them)"
        )
        found.append(Problem(str(path.parent), "suspect", reason, run_name(record)))
    if row["untrained"]:
        reason = (
            f"completed, but all {record['steps']} optimizer steps were skipped for an overflow: "
            f"its metrics are the untrained model's (flagged in its cell; no verdict); "
            f"{NO_STEP_ADVICE}"
        )
        found.append(Problem(str(path.parent), "suspect", reason, run_name(record)))
    return found


def _damaged(path: Path, record: dict) -> list[str]:
    """The files beside a run.json that are there but cannot be used: a FIFO or a device (never
    opened: it would wait for a writer), an items file cut short or holding pickled objects."""
    from mpt_repro.evidence import read_items

    evaluation = record.get("evaluation") if isinstance(record.get("evaluation"), dict) else {}
    items = evaluation.get("items_file")
    found = []
    for name in ["metrics.csv", *([items] if isinstance(items, str) and items else [])]:
        file = path.parent / name
        what = not_a_regular_file(file)
        if what:
            found.append(f"its {name} is {what}, not a file mpt-run wrote: never opened")
        elif name.endswith(".npz") and file.is_file():
            try:
                step, _ = read_items(file)
            except (OSError, ValueError) as err:  # it says what the file is instead
                found.append(f"its {name} cannot be used ({err}): no interval rests on it")
                continue
            if step != evaluation.get("step"):  # what differs, not the metric it recomputes
                found.append(
                    f"its {name} holds the evaluation of step {step}, the record's "
                    f"{evaluation.get('step')}: no interval rests on it"
                )
    return found


def preset_config(record: dict) -> dict[str, Any]:
    """The precision recipe a run used, flattened: the preset's knobs and the experiment's static
    scale (read by the scaling presets), which the comparison key leaves out."""
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    precision = config.get("precision") or record.get("precision_config") or {}
    # a knob added later reads as its default in records written before it existed
    precision = {"arithmetic": "native", **precision}
    return {
        **{f"precision.{k}": v for k, v in flatten(precision).items()},
        "paper_loss_scale": config.get("paper_loss_scale"),
    }


def preset_tweaked(record: dict) -> bool | None:
    """Whether the run's command line changed its preset's knobs (or the experiment's static
    scale); None for a record that does not list its overrides (schema 1 and 2)."""
    overrides = record.get("overrides")
    if not isinstance(overrides, list):
        return None
    keys = [str(o).lstrip("+~").split("=", 1)[0] for o in overrides]
    return any(k.startswith("precision.") or k == "paper_loss_scale" for k in keys)


def with_preset_variants(runs: pd.DataFrame) -> pd.DataFrame:
    """A preset run with changed knobs (`precision=mixed precision.init_scale=1024`) is another
    recipe than the preset itself: within a comparison group, the runs of a preset name that hold
    different recipes are split. The preset as conf/ defines it keeps its name; the others are
    named by the knobs in which they differ from it (`mixed [precision.init_scale=1024.0]`), so
    seeds of two recipes are never averaged and `Δ mixed − fp32` stays the preset's."""
    if runs.empty or "preset_config" not in runs:
        return runs
    runs = runs.copy()
    for _, part in runs.groupby([*PAIR_KEYS, "precision"], sort=False, dropna=False):
        keys = [digest(c) for c in part["preset_config"]]
        if len(set(keys)) < 2:
            continue
        configs = dict(zip(keys, part["preset_config"]))
        # the preset as defined: the one recipe none of whose runs changed a knob (a record that
        # does not list its overrides counts as unchanged)
        tweaked = {k for k, t in zip(keys, part["preset_tweaked"]) if t is True}
        plain = set(keys) - tweaked
        base = next(iter(plain)) if len(plain) == 1 else None
        name = part["precision"].iloc[0]
        names = []
        for k in keys:
            if k == base:
                names.append(name)
                continue
            pair = {base: configs[base], k: configs[k]} if base else configs
            names.append(f"{name} [{difference_labels(pair)[k]}]")
        runs.loc[part.index, "precision"] = names
    return runs


def problems_frame(problems: list[Problem]) -> pd.DataFrame:
    return pd.DataFrame(
        [asdict(p) for p in problems], columns=["path", "status", "reason", "run", "hint"]
    )


def with_group_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """`group_label`: within one subject and setting, each comparison group named by the keys in
    which its configuration differs from the others' ("" where the subject has one group), and
    `row_label`: the subject with that label, as tables and plots name a row."""
    runs = runs.copy()
    runs["group_label"] = ""
    if runs.empty:
        runs["row_label"] = []
        return runs
    for _, part in runs.groupby(["subject", *SETTING_KEYS], sort=False, dropna=False):
        configs = {
            key: next(c for k, c in zip(part["comparison"], part["comparison_config"]) if k == key)
            for key in part["comparison"].unique()
        }
        labels = difference_labels(configs)
        if "" in configs and len(configs) > 1:
            labels[""] = "configuration not recorded"
        if "recipe_changes" in part:
            for key, group in part.groupby("comparison"):
                labels[key] = _with_changes(labels.get(key, ""), group["recipe_changes"])
                code = _code_difference(group)  # a Δ across code versions names them
                machine = machine_difference(group["machine"]) if "machine" in group else ""
                labels[key] = ", ".join(
                    x
                    for x in (
                        labels[key],
                        code and f"code differs: {code}",
                        machine and f"machine differs: {machine}",
                    )
                    if x
                )
        runs.loc[part.index, "group_label"] = part["comparison"].map(labels)
    runs["row_label"] = [
        f"{s} [{label}]" if label else s for s, label in zip(runs["subject"], runs["group_label"])
    ]
    return runs


# what names the code behind a run: a difference within a group is named in its label
CODE_FIELDS = ("torch", "mpt-repro", "commit")


def _code(record: dict, name: str) -> str:
    versions = record.get("versions") if isinstance(record.get("versions"), dict) else {}
    value = {
        "torch": versions.get("torch"),
        "mpt-repro": record.get("package_version"),
        "commit": str(record.get("git_commit") or "")[:12] or None,
    }[name]
    return str(value) if value else ""


def _code_difference(part: pd.DataFrame) -> str:
    """`torch 2.11.0/2.14.1` (each code field whose values differ within the runs of `part`),
    or ""."""
    shown = []
    for name in CODE_FIELDS:
        values = sorted({v for v in part.get(name, pd.Series(dtype=str)).fillna("") if v})
        if len(values) > 1:
            shown.append(f"{name} {'/'.join(values)}")
    return ", ".join(shown)


def machine_difference(labels: pd.Series) -> str:
    """`native AVX512, ... / portable AVX2, ...` where the runs' machines decided their numbers
    differently (mpt_repro.machine.numerics_label), or "" (records before schema 5 say nothing)."""
    values = sorted({v for v in labels.fillna("") if v})
    return " / ".join(values) if len(values) > 1 else ""


def _with_changes(label: str, changes: pd.Series) -> str:
    """A group's label with every recipe change of its runs that it does not already name: a
    capped run is labelled by its cap even where no other group differs from it."""
    shown = [label] if label else []
    for change in sorted({c for text in changes.fillna("") for c in str(text).split(", ") if c}):
        if change.split("=")[0] + "=" not in label:
            shown.append(change)
    return ", ".join(shown)


def _without_duplicates(runs: pd.DataFrame, problems: list[Problem]) -> pd.DataFrame:
    """Two records of one configuration, preset and seed (a copy of a results folder, a run
    repeated under another runs_dir) are one run: keep the first path, list the others, so no
    run is averaged in twice as if it were two seeds. Where their outcomes or metrics differ,
    neither can be taken for the result: both are listed as conflicting, and the kept one is
    flagged (`conflict`), so no verdict rests on it."""
    runs = runs.copy()
    runs["conflict"] = False
    if runs.empty:
        return runs
    identity = [*GROUP_KEYS, "seed"]
    dup = runs.duplicated(subset=identity, keep="first")
    results = [c for c in runs.columns if c.startswith("metric_")] + ["status"]
    for _, same in runs[runs.duplicated(subset=identity, keep=False)].groupby(identity):
        kept, others = same.iloc[0], same.iloc[1:]
        for _, other in others.iterrows():
            if _same_result(kept, other, results):
                problems.append(
                    Problem(
                        other["path"],
                        "duplicate",
                        "the same configuration, preset and seed as another run in the "
                        "tables: counted once",
                        hint=f"report it on its own: mpt-report {shlex.quote(other['path'])}",
                    )
                )
                continue
            runs.loc[same.index[0], "conflict"] = True
            problems += [
                Problem(
                    row["path"],
                    "conflict",
                    f"{_result_text(row, results)}; the same configuration, preset and seed as "
                    f"{(other if row is kept else kept)['path']}, which gives "
                    f"{_result_text(other if row is kept else kept, results)}"
                    + (": this one is in the tables" if row is kept else "")
                    + _machines_named(kept, other),
                    run_name_of(row),
                    "keep the record you trust, move the other out of the results folder",
                )
                for row in (kept, other)
            ]
    return runs[~dup]


def _machines_named(a: pd.Series, b: pd.Series) -> str:
    """ "; machine differs: X / Y" when two conflicting records' machines decided their numbers
    differently (the likely cause: other CPU kernels), else ""."""
    found = machine_difference(pd.Series([a.get("machine"), b.get("machine")], dtype=object))
    return f"; machine differs: {found}" if found else ""


def _same_result(a: pd.Series, b: pd.Series, columns: list[str]) -> bool:
    for c in columns:
        x, y = a.get(c), b.get(c)
        if not ((pd.isna(x) and pd.isna(y)) or x == y):
            return False
    return True


def _result_text(row: pd.Series, columns: list[str]) -> str:
    shown = [
        f"{c.removeprefix('metric_')}={row[c]:.6g}"
        for c in columns
        if c.startswith("metric_") and not pd.isna(row.get(c))
    ]
    return f"{row['status']}" + (f" ({', '.join(shown)})" if shown else "")


def run_name_of(row: pd.Series) -> str:
    return f"{row['subject']} {row['precision']} {row['budget']} seed{row['seed']}"


def load_metrics_csv(run_dir: str) -> pd.DataFrame | None:
    """A run's metrics.csv, or None when it is missing or unreadable (the caller reports it)."""
    path = Path(run_dir) / "metrics.csv"
    try:
        with open_regular(path, "r") as f:  # a FIFO is refused, never waited on
            return pd.read_csv(f)
    except (OSError, ValueError, pd.errors.ParserError):
        return None
