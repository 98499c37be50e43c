"""The typed configuration: the schema registered in Hydra's ConfigStore, and the checks around it.

Every YAML file in conf/ is merged onto these dataclasses, so a misspelled key or a value of the
wrong type is refused before any work starts. The model and data groups have one schema per
option (registered by its plugin, mpt_repro/registry.py): a key another option reads does not
exist in this run's. Then:

- `check_command_line` refuses a key no schema has, with or without a leading `+` (Hydra would
  add a `+key` silently, and the run would ignore it), suggesting the nearest one;
- `check_overrides_are_read` refuses a command-line key the run does not read: not a field of
  the option the run uses (the `+` case), or a field whose `read_when` metadata (beside the field,
  schema.read_when) names kinds other than the run's (`optim.momentum` with Adam, a loss-scaling
  knob under a preset without scaling);
- `validate` checks the values that types cannot (a negative learning rate, a batch size of 0,
  contradictory precision knobs; each option's schema checks its own fields) and raises
  ConfigError naming the key.

Nothing here imports torch: `mpt-run --help`, shell completion and every refusal load this
module before torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from mpt_repro import registry
from mpt_repro.catalog import CONF_DIR, nearest, options, recipes  # noqa: F401  (re-exported)
from mpt_repro.errors import ConfigError
from mpt_repro.precision.config import PrecisionConfig
from mpt_repro.schema import (
    HONOURED,
    read_if_honoured,
    read_when,
    register_option_schemas,
    require,
    schema_of,
)
from mpt_repro.telemetry.config import TelemetryConfig

_check = require  # the checks below read as sentences: _check(ok, key, value, "must be ...")


def option_name(value: Any) -> str:
    """The name of a config choice, whether OmegaConf hands over an Enum member or a string."""
    return str(getattr(value, "name", value))


OPTIMIZERS = ("sgd", "adam", "adamw", "adagrad", "rmsprop", "rmsprop_tf")
SCHEDULES = ("constant", "step", "multistep", "poly", "cosine", "exponential")
_MOMENTUM = ("rmsprop", "rmsprop_tf", "sgd")
_EPS = ("adagrad", "adam", "adamw", "rmsprop", "rmsprop_tf")
# the largest seed= (below 2**31: numpy takes seeds below 2**32, and seed * 1_000_003 + epoch
# must stay a 64-bit integer for torch)
MAX_SEED = 2**31 - 1


@dataclass
class OptimConfig:
    """An optimizer and its LR schedule. One schema for every optimizer: the fields only some
    optimizers or schedules read say which (read_when), and a command line that sets one for
    another is refused."""

    name: str = "sgd"  # sgd | adam | adamw | adagrad | rmsprop | rmsprop_tf
    lr: float = 0.1  # the base learning rate, before lr_scaling, warm-up and the schedule
    momentum: float = field(default=0.9, metadata=read_when("optim.name", *_MOMENTUM))
    nesterov: bool = field(default=False, metadata=read_when("optim.name", "sgd"))
    weight_decay: float = 0.0
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999], metadata=read_when("optim.name", "adam", "adamw")
    )
    # rmsprop: added to sqrt(v); rmsprop_tf: added to v inside the sqrt (TF)
    eps: float = field(default=1e-8, metadata=read_when("optim.name", *_EPS))
    # rmsprop, rmsprop_tf: decay of the mean square (TF calls it decay)
    alpha: float = field(default=0.99, metadata=read_when("optim.name", "rmsprop", "rmsprop_tf"))
    initial_accumulator_value: float = field(
        default=0.0, metadata=read_when("optim.name", "adagrad")
    )
    # Per-parameter-group multipliers of lr and weight_decay (Caffe's lr_mult / decay_mult), by
    # kind (mpt_repro/optim.py param_kinds): "bias" = biases of layers with a weight matrix
    # (conv, linear, LSTM); "norm" = the other 1-d parameters (batch/layer-norm scale and shift).
    bias_lr_mult: float = 1.0
    bias_decay_mult: float = 1.0
    norm_lr_mult: float = 1.0
    norm_decay_mult: float = 1.0
    # LR schedule, in epochs (fractions allowed); stepped every iteration
    schedule: str = "constant"  # constant | step | multistep | poly | cosine | exponential
    step_size: float = field(default=30.0, metadata=read_when("optim.schedule", "step"))
    milestones: list[float] = field(
        default_factory=list, metadata=read_when("optim.schedule", "multistep")
    )
    gamma: float = field(
        default=0.1, metadata=read_when("optim.schedule", "exponential", "multistep", "step")
    )
    power: float = field(default=1.0, metadata=read_when("optim.schedule", "poly"))
    warmup_epochs: float = 0.0
    # on top of the schedule, a plateau decay (the TF translate tutorial's
    # learning_rate_decay_factor): at each train log row (trainer.log_every), a mean loss above
    # every one of the previous plateau_rows rows' multiplies the LR by plateau_decay; null: off
    plateau_decay: float | None = None
    plateau_rows: int = 3
    # scale the LR with the global batch: lr * global_batch / base_batch_size (linear rule)
    lr_scaling: str = "none"  # none | linear
    base_batch_size: int = field(default=256, metadata=read_when("optim.lr_scaling", "linear"))
    grad_clip: float | None = None  # max global grad norm, applied to unscaled gradients
    # which parameters the clip norm covers and clips: a regex searched in parameter names
    # (f-lm: "lstm\." clips the LSTM's gradients only); null: every parameter
    grad_clip_params: str | None = None
    # fused optimizer kernels (sgd/adam/adamw; rmsprop_tf's own device-side skip): they skip an
    # overflowing step on the device, so a step needs no host sync. auto: wherever the kernel
    # exists | true | false (foreach)
    fused: str = "auto"
    # evaluate an exponential moving average of the parameters (FP32) with this decay; null: the
    # raw weights. Inception v3 (TF-slim) 0.9999, the big LSTM (f-lm) 0.999
    ema_decay: float | None = None
    ema_warmup: bool = False  # TF's num_updates: decay_t = min(decay, (1 + t) / (10 + t))
    # which tensors are averaged: a regex searched in parameter names (f-lm: "lstm\."); null:
    # every parameter and floating-point buffer (BN statistics), as TF's inception_train.py
    ema_params: str | None = None


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    epochs: int = 1  # passes over the training data (the experiment and budget set it)
    max_steps: int | None = None  # stop after this many iterations (budgets)
    log_every: int = 10
    eval_every: int | None = None  # iterations; null: at the end of each epoch
    checkpoint_every: int | None = None  # iterations; null: at the end of each epoch
    diverge_patience: int = 10  # consecutive non-finite losses that end a run as diverged
    # gradient accumulation: micro-batches per optimizer step, so one GPU reproduces a larger
    # global batch (data.batch_size is each micro-batch's; the LR rule sees the whole)
    accumulate: int = 1
    # before each evaluation, re-estimate BatchNorm's running statistics on this many training
    # batches with the current weights (0: off), for a task that gives the inputs (its plugin
    # says it honours the key; a command-line value for another task is refused). Smoke
    # budgets: a few steps of running averages are meaningless, and an evaluation with them
    # looks broken (loss NaN or 1e6)
    recalibrate_bn: int = field(default=0, metadata=read_if_honoured())
    # torch.compile the training step: the task's forward (the backward follows it) and the
    # precision step's device regions around the optimizer's kernel (unscale and check, the
    # non-finite diagnosis, clipping; the masters' copy-back, the skip signal, the loss scale's
    # update): fewer kernels, fused elementwise ops. For a task whose plugin says it honours it
    # (it compiles its forward). Opt-in: compiling takes minutes, and the hooks of
    # precision=adaptive and of telemetry cannot be compiled (refused with them). step: the
    # whole iteration as one compiled graph (forward, backward, the precision step, the
    # optimizer's update; precision/compiled_step.py), for what it can trace (refused otherwise)
    compile: Any = field(default=False, metadata=read_if_honoured())  # true | false | step
    # torch.compile's mode: default | reduce-overhead (CUDA graphs: the step never reads the
    # device, so it can be captured and replayed as one launch; GPU only) | max-autotune |
    # max-autotune-no-cudagraphs
    compile_mode: str = field(default="default", metadata=read_if_honoured())
    progress: bool = True
    deterministic: bool = False
    cudnn_benchmark: bool = True
    # the same bits on every x86-64 machine with AVX2: one thread, torch's, oneDNN's and MKL's
    # kernels pinned to AVX2 before torch loads (mpt_repro/machine.py; docs/reliability.md)
    portable: bool = False


@dataclass
class BudgetConfig:
    name: str = "smoke"  # paper | short | smoke
    description: str = ""


@dataclass
class DistributedConfig:
    """Data-parallel training (mpt_repro/distributed.py, docs/distributed.md). The number of
    processes comes from the launcher (torchrun, SLURM), not from here."""

    backend: str = "auto"  # auto: nccl on CUDA, gloo on the CPU | nccl | gloo
    # per_process: data.batch_size is each process's batch (global = batch_size x processes);
    # global: data.batch_size is the global batch, split evenly across the processes
    batch_size_is: str = "per_process"
    sync_bn: bool = False  # SyncBatchNorm (CUDA only): BN statistics over the global batch
    find_unused_parameters: bool = False  # DDP: models with parameters a forward may not use
    timeout_s: int = 1800  # collectives waiting longer than this fail the run instead of hanging
    # ddp: every process holds the whole model (DistributedDataParallel); fsdp2: parameters,
    # gradients and optimizer state sharded over the processes (fully_shard; mpt_repro/fsdp.py)
    strategy: str = "ddp"
    # fsdp2: free each block's gathered parameters after its forward (gathered again for the
    # backward): less memory, one more all-gather per block
    reshard_after_forward: bool = field(
        default=True, metadata=read_when("distributed.strategy", "fsdp2")
    )
    # fsdp2: the dtype gradients are reduced in; preset: the one DDP reduces in under the preset
    # (the gradients' own: FP16 for mixed, FP32 for amp and bf16) | float32 | float16 | bfloat16
    reduce_dtype: str = field(default="preset", metadata=read_when("distributed.strategy", "fsdp2"))


@dataclass
class PathsConfig:
    runs_dir: str = "results/runs"  # runs land in <runs_dir>/<experiment>/<precision>-<budget>/...


@dataclass
class Config:
    experiment_name: str = MISSING
    task: str = MISSING  # a name in the task registry: each experiment file sets it
    # the recipe behind the run (conf/recipe: public | nvcaffe), recorded in run.json's config
    recipe: str = "public"
    seed: int = 0  # the replicate: initial weights, data order, augmentation (runs pair by it)
    resume: bool = False  # continue the run in its directory from its last checkpoint
    overwrite: bool = False  # train again over a finished run (its files are moved aside first)
    # the paper's static loss scale for this experiment (null: none stated); read only by the
    # presets whose loss_scaling is `paper`
    paper_loss_scale: float | None = field(
        default=None, metadata=read_when("precision.loss_scaling", "paper")
    )
    data: Any = MISSING  # an option of conf/data/ with its own schema (its plugin's)
    model: Any = MISSING  # an option of conf/model/ with its own schema
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (Config as `schema`, every plugin's option schemas
    as schema/<group>/<name>) and register the run-path resolver. Stores again only when the
    store does not hold exactly what the last call stored (a plugin's schemas added, a new or
    changed store): converting the dataclasses costs ~0.075 s of CPU, paid twice by every
    mpt-run and once by each of the tests' ~1,500 in-process composes."""
    from mpt_repro import registry
    from mpt_repro.identity import register_resolvers

    global _STORED
    store = ConfigStore.instance()
    wanted = [(group, name) for group, s in registry.option_schemas().items() for name in s]
    if _STORED is None or not _same(_STORED, _stored_now(store, wanted)):
        store.store(name="schema", node=Config)
        register_option_schemas(store)  # schema/model/<name>, schema/data/<name>
        _STORED = _stored_now(store, wanted)
    register_resolvers()  # ${mpt_run_path:...}, the run directory's name (conf/config.yaml)


_STORED: tuple | None = None  # what register_configs last stored, as _stored_now saw it


def _stored_now(store: ConfigStore, options: list[tuple[str, str]]) -> tuple:
    """The store, its `schema` node and, for each (group, name) option schema, the node it
    holds (the objects themselves: compared by identity). A Hydra whose store keeps them
    elsewhere than Hydra 1.3's `repo` gives a fresh object each time: stored at every call."""
    repo = getattr(store, "repo", None)
    if not isinstance(repo, dict):
        return (object(),), tuple(options)
    schema = repo.get("schema")
    groups = schema if isinstance(schema, dict) else {}
    held = [groups.get(group, {}).get(f"{name}.yaml") for group, name in options]
    return (store, repo.get("schema.yaml"), *held), tuple(options)


def _same(before: tuple, now: tuple) -> bool:
    (objects, names), (objects_now, names_now) = before, now
    return names == names_now and all(a is b for a, b in zip(objects, objects_now, strict=True))


# -- values ----------------------------------------------------------------------------------------
def validate(cfg: DictConfig) -> None:
    """Check what the types cannot; raise ConfigError naming the key. Imports no torch: mpt-run
    refuses a bad value before torch loads (mpt_repro/preflight.py)."""
    _check_finite(cfg)
    for group in ("model", "data"):  # each option's schema checks its own fields
        schema = schema_of(cfg[group])
        if schema is not None:
            schema.check(cfg[group], cfg)
    validate_optim(cfg.optim)
    validate_trainer(cfg.trainer, cfg.distributed)
    from mpt_repro.fsdp import check as check_sharding  # a preset fsdp2 cannot run: one line

    check_sharding(cfg)
    validate_run(cfg)
    from mpt_repro.precision.validate import validate_optimizer_state, validate_precision
    from mpt_repro.telemetry.config import validate_telemetry

    validate_precision(cfg.precision, cfg.paper_loss_scale)
    validate_optimizer_state(cfg.precision, cfg.optim)  # FP16 state an eps would turn into 0/0
    validate_telemetry(cfg.telemetry)


def check_data_folder(cfg: DictConfig) -> None:
    """A data set read from a folder (its schema's needs_root) without data.root is refused
    before torch loads (mpt-run's start-up check; a configuration is valid without its folder,
    a run is not), with the two ways to run: its folder, or made-up data. So is a data.root that
    is not there, not a folder or empty: the loader would say so only after torch had loaded
    (tens of seconds on a busy machine). The loader is data.name's, so its own schema decides (a
    budget may switch an option's data.name to an embedded stand-in: the DCGAN's smoke runs read
    the digits); whether the folder holds the right files stays the loader's to say."""
    name = option_name(cfg.data.name)
    schema = registry.option_schemas()["data"].get(name) or schema_of(cfg.data)
    needs_root = getattr(schema, "needs_root", False)
    root = cfg.data.get("root")
    # the other way to run: made-up images of the same shape, or the data set's embedded copy
    other = (
        f"or run experiment={cfg.experiment_name} on made-up inputs of the same shape with "
        "data=synthetic (it measures speed and memory, not accuracy)"
        if needs_root
        else f"or leave data.root unset (null) to read the copy of data {name} mpt-repro ships"
    )
    if root and (needs_root or "root" in getattr(schema, "reads", ())):
        problem = folder_problem(Path(str(root)).expanduser())
        if problem:
            raise ConfigError(
                f"data.root={root} {problem}: point it at the folder of data {name} "
                f'(README.md, "Data", gives each layout), {other}'
            )
    if needs_root and not root:
        raise ConfigError(
            f"data {name} is read from a folder and data.root is not set: download it and pass "
            f'data.root=DIR (README.md, "Data", gives each layout), {other}'
        )


def folder_problem(path: Path) -> str | None:
    """What keeps `path` from being a data folder (missing, a file, empty, unreadable), or None;
    asked of the file system alone (one directory entry read, no file opened)."""
    try:
        if not path.exists():
            return "does not exist"
        if not path.is_dir():
            return "is a file, not a folder"
        with os.scandir(path) as entries:
            empty = next(entries, None) is None
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return "is an empty folder" if empty else None


def validate_optim(o: DictConfig) -> None:
    _check(o.name in OPTIMIZERS, "optim.name", o.name, f"must be one of {OPTIMIZERS}")
    _check(o.schedule in SCHEDULES, "optim.schedule", o.schedule, f"must be one of {SCHEDULES}")
    _check(o.lr > 0, "optim.lr", o.lr, "must be > 0")
    _check(0 <= o.momentum < 1, "optim.momentum", o.momentum, "must be in [0, 1)")
    _check(o.eps > 0, "optim.eps", o.eps, "must be > 0")
    _check(0 <= o.alpha < 1, "optim.alpha", o.alpha, "must be in [0, 1)")
    _check(0 < o.gamma <= 1, "optim.gamma", o.gamma, "must be in (0, 1]")
    for key in ("weight_decay", "warmup_epochs", "bias_lr_mult", "bias_decay_mult"):
        _check(o[key] >= 0, f"optim.{key}", o[key], "must be >= 0")
    for key in ("norm_lr_mult", "norm_decay_mult"):
        _check(o[key] >= 0, f"optim.{key}", o[key], "must be >= 0")
    _check(
        o.lr_scaling in ("none", "linear"),
        "optim.lr_scaling",
        o.lr_scaling,
        "must be none or linear",
    )
    _check(
        o.grad_clip is None or o.grad_clip > 0,
        "optim.grad_clip",
        o.grad_clip,
        "must be > 0 or null",
    )
    _check(
        o.plateau_decay is None or 0 < o.plateau_decay < 1,
        "optim.plateau_decay",
        o.plateau_decay,
        "must be in (0, 1) or null",
    )
    _check(o.plateau_rows >= 1, "optim.plateau_rows", o.plateau_rows, "must be >= 1")
    _check(
        o.ema_decay is None or 0 < o.ema_decay < 1,
        "optim.ema_decay",
        o.ema_decay,
        "must be in (0, 1) or null",
    )
    _check(
        str(o.fused).lower() in ("auto", "true", "false"),
        "optim.fused",
        o.fused,
        "must be auto, true or false",
    )
    _check(
        len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
        "optim.betas",
        list(o.betas),
        "must be two numbers in [0, 1)",
    )
    for key in ("grad_clip_params", "ema_params"):
        _check(_is_regex(o[key]), f"optim.{key}", o[key], "must be a valid regex or null")


def validate_trainer(t: DictConfig, dd: DictConfig) -> None:
    _check(t.epochs > 0, "trainer.epochs", t.epochs, "must be positive")
    for key in ("max_steps", "eval_every", "checkpoint_every"):
        _check(t[key] is None or t[key] > 0, f"trainer.{key}", t[key], "must be positive or null")
    for key in ("log_every", "diverge_patience"):
        _check(t[key] > 0, f"trainer.{key}", t[key], "must be positive")
    _check(t.accumulate >= 1, "trainer.accumulate", t.accumulate, "must be >= 1")
    _check(t.recalibrate_bn >= 0, "trainer.recalibrate_bn", t.recalibrate_bn, "must be >= 0")
    _check(
        isinstance(t.compile, bool) or t.compile == "step",
        "trainer.compile",
        t.compile,
        "must be true, false or step",
    )
    _check(
        t.compile_mode in COMPILE_MODES,
        "trainer.compile_mode",
        t.compile_mode,
        f"must be one of {COMPILE_MODES}",
    )
    # cuda:abc passed this check and failed in torch with a traceback
    _check(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(t.device)) is not None,
        "trainer.device",
        t.device,
        "must be auto, cpu, cuda or cuda:N",
    )
    backends = ("auto", "nccl", "gloo")
    _check(dd.backend in backends, "distributed.backend", dd.backend, f"must be one of {backends}")
    _check(
        dd.batch_size_is in ("per_process", "global"),
        "distributed.batch_size_is",
        dd.batch_size_is,
        "must be per_process or global",
    )
    _check(dd.timeout_s > 0, "distributed.timeout_s", dd.timeout_s, "must be positive")
    strategies = ("ddp", "fsdp2")
    _check(
        dd.strategy in strategies,
        "distributed.strategy",
        dd.strategy,
        f"must be one of {strategies}",
    )
    reduce = ("preset", "float32", "float16", "bfloat16")
    _check(
        dd.reduce_dtype in reduce,
        "distributed.reduce_dtype",
        dd.reduce_dtype,
        f"must be one of {reduce}",
    )


def validate_run(cfg: DictConfig) -> None:
    """The top-level keys: budget, recipe, task, where results go, resume/overwrite."""
    budgets = options("budget")
    _check(cfg.budget.name in budgets, "budget.name", cfg.budget.name, f"must be one of {budgets}")
    check_budget_file(cfg)
    have = recipes(cfg.experiment_name)
    _check(
        cfg.recipe in have,
        "recipe",
        cfg.recipe,
        f"must be one of experiment={cfg.experiment_name}'s recipes: {', '.join(have)} "
        "(conf/experiment_recipe/ holds them; docs/recipes.md)",
    )
    kinds = registry.task_kinds()  # the plugins' (mpt_repro/registry.py), imported without torch
    task = (
        None if OmegaConf.is_missing(cfg, "task") else cfg.task
    )  # no default: no task is the core's
    _check(
        task in kinds,
        "task",
        task,
        f"must be a task a plugin registers, set by the experiment file (task: <kind>): one of "
        f"{kinds} (docs/adding-an-experiment.md)",
    )
    runs_dir = str(cfg.paths.runs_dir or "").strip()
    _check(
        bool(runs_dir) and Path(runs_dir).resolve() != Path(Path(runs_dir).resolve().anchor),
        "paths.runs_dir",
        cfg.paths.runs_dir,
        "must name a results folder (not empty, not the file system's root), e.g. "
        "paths.runs_dir=results/runs",
    )
    _check(
        0 <= cfg.seed <= MAX_SEED,
        "seed",
        cfg.seed,
        f"must be in 0..{MAX_SEED} (numpy's generator takes seeds below 2**32, and the runs derive "
        "per-epoch seeds from it)",
    )
    if cfg.resume and cfg.overwrite:
        raise ConfigError(
            "resume=true and overwrite=true ask for opposite things: resume=true continues the run "
            "in its directory, overwrite=true starts it again (moving the old files aside). "
            "Keep one."
        )
    _check(
        cfg.paper_loss_scale is None or cfg.paper_loss_scale > 0,
        "paper_loss_scale",
        cfg.paper_loss_scale,
        "must be > 0 or null",
    )


def check_budget_file(cfg: DictConfig) -> None:
    """A budget that trims the recipe, on an experiment whose data set is a real folder, needs
    the experiment's own budget file: without it, budget=short would silently train the full
    recipe on the full data set (the file is optional in the defaults list)."""
    from mpt_repro import catalog

    budget, experiment = cfg.budget.name, cfg.experiment_name
    if catalog.full_recipe(budget) or experiment not in catalog.experiments():
        return
    stem = catalog.experiments()[experiment].file
    if catalog.config_file("experiment_budget", f"{stem}_{budget}").exists():
        return
    if catalog.data_root(experiment, budget) is None:  # no folder to read: the budget's trim holds
        return
    raise ConfigError(
        f"budget={budget} has no conf/experiment_budget/{stem}_{budget}.yaml: it would train "
        f"experiment={experiment}'s whole recipe on its whole data set. Add the file (a paper "
        f"experiment lists a shared trim, `defaults: [_<shared>_{budget}, _self_]`, as its "
        "neighbours' files in conf/experiment_budget/ do), or run budget=paper."
    )


def _check_finite(cfg: DictConfig) -> None:
    """Every number of the resolved configuration is finite: `optim.lr=inf` or `1e400` (which
    parses as inf) would train on NaN weights and end as if it were a result."""
    from mpt_repro.identity import flatten

    values = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for key, value in flatten(values).items():
        numbers = value if isinstance(value, list) else [value]
        for x in numbers:
            if isinstance(x, float) and not math.isfinite(x):
                # a number typed beyond FP64's range (1e400) has already been read as inf
                beyond = " (a number beyond 1.8e308, such as 1e400, reads as inf)"
                raise ConfigError(
                    f"{key}={value} is not a finite number{beyond if math.isinf(x) else ''}. "
                    f"Fix it in the config or on the command line, e.g. {key}=..."
                )


def _is_regex(pattern: str | None) -> bool:
    try:
        return pattern is None or re.compile(pattern) is not None
    except re.error:
        return False


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain JSON-able data (enums as strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


# -- strict command lines --------------------------------------------------------------------------
# Keys under these schema nodes are free-form (a mapping handed on as is): `+node.anything=...`
# is the documented way to add one. Every node typed as a dict in a schema is one: today
# model.kwargs (model=custom's factory arguments).
def extension_points() -> list[str]:
    fields = _schema_fields(Config, "")
    groups = registry.option_schemas()
    return sorted({k for k, hint in fields if _origin(hint) is dict and k not in groups})


def check_command_line(argv: list[str]) -> str | None:
    """Why the command line names a key no schema has, or None.

    A misspelled key and a `+key=` addition get the same answer: Hydra would add the `+` one to
    the config without complaint, and the run would ignore it (e.g. `+optim.lrr=0.1`). A key that
    some option has but not the run's is left to `check_overrides_are_read`, once the config is
    composed. Group choices (`precision=amp`), Hydra's own settings and malformed overrides are
    left to Hydra, which reports those itself.
    """
    overrides = _parse(_override_args(argv))
    if overrides is None:
        return None
    groups = _groups()
    for o in overrides:
        key = o.key_or_group
        if o.is_delete() or o.package is not None or "/" in key or key.split(".")[0] == "hydra":
            continue
        if key in groups or _schema_has(key):
            continue
        return _moved_key_message(key) or _unknown_key_message(key)
    return None


def moved_keys() -> dict[str, tuple[str, list[str]]]:
    """{old key: (its new key, the options that have it)} of the settings that moved into the
    schema of the options that read them (schema.formerly: `optim.label_smoothing` is now the
    classifiers' `model.label_smoothing`)."""
    moved: dict[str, tuple[str, list[str]]] = {}
    for group, schemas in registry.option_schemas().items():
        for schema in schemas.values():
            for f in dataclasses.fields(schema):
                old = f.metadata.get("formerly")
                if old and old not in moved:
                    new = f"{group}.{f.name}"
                    moved[old] = (new, options_with_field(group, f.name))
    return moved


def _moved_key_message(key: str) -> str | None:
    """The one line for a key that moved (`optim.label_smoothing=0.1`), or None."""
    if key not in moved_keys():
        return None
    new, readers = moved_keys()[key]
    group = new.split(".")[0]
    who = f" ({group}={', '.join(readers)} {'has' if len(readers) == 1 else 'have'} it)"
    return (
        f"{key} is now {new}: the setting moved to the options that read it"
        f"{who if readers else ''}. Set {new} instead ({new}=... on the command line)."
    )


def _override_args(argv: list[str]) -> list[str]:
    """The overrides of an mpt-run command line, as Hydra's own argument parser sees them."""
    from hydra._internal.utils import get_args_parser

    try:
        args, _ = get_args_parser().parse_known_args(argv)
    except SystemExit:  # a malformed flag: Hydra will say so
        return []
    if args.shell_completion:  # `-sc install=bash`, `-sc query=bash`: not overrides
        return []
    return list(args.overrides or [])


def _parse(args: list[str]) -> list | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra reports it with its own message
        return None


def _groups() -> set[str]:
    from mpt_repro.catalog import conf_dirs

    return {
        p.name for folder in conf_dirs() if folder.is_dir() for p in folder.iterdir() if p.is_dir()
    }


def _origin(hint: Any) -> Any:
    return typing.get_origin(hint) or hint


def _schema_fields(cls: type, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, type hint) of every field of a schema dataclass, nested ones included; a
    group with a schema per option (model, data) contributes the fields of all its options."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, hint = prefix + f.name, hints[f.name]
        if hint is Any and f.name in registry.option_schemas():
            seen: dict[str, Any] = {}
            for schema in registry.option_schemas()[f.name].values():
                seen.update(_schema_fields(schema, key + "."))
            out.append((key, dict))
            out += list(seen.items())
            continue
        out.append((key, hint))
        if dataclasses.is_dataclass(hint):
            out += _schema_fields(hint, key + ".")
    return out


def _schema_has(key: str) -> bool:
    fields = dict(_schema_fields(Config, ""))
    if key in fields:
        return True
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in registry.option_schemas():
            return False  # a group with a schema per option: every key of it is listed
        if prefix in fields and _origin(fields[prefix]) in (dict, list, Any):
            return True  # under a free-form mapping, or an item of a list
    return False


def _unknown_key_message(key: str) -> str:
    fields = [k for k, _ in _schema_fields(Config, "")]
    parts = key.split(".")
    # the first part of the key that names nothing: a section (`optimm.lr`) or a setting
    # (`optim.lrr`); the suggestion keeps the rest of what was typed (`optim.lr`)
    depth = len(parts) - 1
    for i in range(len(parts)):
        prefix = ".".join(parts[: i + 1])
        if not any(k == prefix or k.startswith(prefix + ".") for k in fields):
            depth = i
            break
    parent, name, rest = ".".join(parts[:depth]), parts[depth], parts[depth + 1 :]
    below = [
        k[len(parent) + 1 :] if parent else k
        for k in fields
        if not parent or k.startswith(parent + ".")
    ]
    known = sorted({k.split(".")[0] for k in below})
    close = [".".join([*([parent] if parent else []), k, *rest]) for k in nearest(name, known)]
    kind = "section" if rest else "setting"
    where = (
        f"{parent} has no {kind} {name!r}" if parent else f"there is no top-level {kind} {name!r}"
    )
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    points = extension_points()
    plus = (
        f"a leading + adds keys only under {', '.join(points)}"
        if points
        else "a leading + cannot add one: the run would not read it"
    )
    return f"unknown key {key!r}: {where}{hint}. `mpt-run --help` lists every key; {plus}."


# -- keys the run does not read --------------------------------------------------------------------
def resolved_loss_scaling(cfg: DictConfig) -> str:
    """The loss scaling a run ends up with: `paper` is the experiment's constant when it states
    one, else dynamic (as PrecisionPolicy resolves it)."""
    kind = option_name(cfg.precision.loss_scaling)
    if kind == "paper":
        return "static" if cfg.paper_loss_scale is not None else "dynamic"
    return kind


def loss_scaling_text(cfg: DictConfig) -> str:
    """The loss scaling a run ends up with, in words: `none`, `static 128`, `dynamic from 65536`,
    `adaptive (per layer)` (HParams, the report)."""
    kind = resolved_loss_scaling(cfg)
    p = cfg.precision
    if kind == "static":
        value = cfg.paper_loss_scale if option_name(p.loss_scaling) == "paper" else p.static_scale
        return f"static {scale_text(value)}" if value is not None else "static"
    if kind == "dynamic":
        return f"dynamic from {scale_text(p.init_scale)}"
    if kind == "adaptive":
        return "adaptive (per layer)"
    return kind


def scale_text(value: float) -> str:
    """A loss scale as a reader checks it against 2^k: 1048576, not 1.04858e+06 (HParams, the
    report); 0.5 and 1e+20 as they are."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"


def skip_ending(cfg: DictConfig) -> str:
    """What ends a run whose steps are all skipped (precision.floor_patience): a loss scaler at
    its floor, or, without one, the FP16-state guard (FP16 weights updated without a master)."""
    if resolved_loss_scaling(cfg) in registry.names("loss scaler"):  # a plugin's scaler too
        return "a loss scaler"
    p = cfg.precision
    guarded = (
        option_name(p.weights) == "low_precision"
        and not p.master_weights
        and option_name(p.compute_dtype) == "float16"
    )
    return "an FP16 state guard" if guarded else "neither"


# kinds that are not a config key of their own (schema.read_when selectors)
SELECTORS: dict[str, Any] = {
    "loss_scaling": resolved_loss_scaling,
    "skip_ending": skip_ending,
    "telemetry.enabled": lambda cfg: str(bool(cfg.telemetry.enabled)).lower(),
}
# what a message calls a selector, when its key alone would not say it
SELECTOR_WORDS = {
    "loss_scaling": "the loss scaling (precision.loss_scaling, with paper resolved)",
    "skip_ending": "what ends a run whose every step is skipped",
    "task": "the task",
    "data.name": "the data set",
}


def selected_kind(cfg: DictConfig, selector: str) -> str:
    if selector in SELECTORS:
        return SELECTORS[selector](cfg)
    return option_name(OmegaConf.select(cfg, selector))


def check_overrides_are_read(cfg: DictConfig, overrides: list[str]) -> None:
    """Refuse a command-line override of a key this run does not read.

    `overrides` are the job's override strings (HydraConfig's overrides.task), `cfg` the
    configuration they composed. A key must be a field of the schema of the option the run uses
    (a `+key` Hydra would have added to it is refused), and a field with `read_when` metadata
    must name this run's kind. Raises ConfigError naming the key, what reads it and what this run
    has.
    """
    groups = _groups()
    for o in _parse(list(overrides)) or []:
        key = o.key_or_group
        if o.is_delete() or key in groups or "/" in key or key.split(".")[0] == "hydra":
            continue
        field_, owner = _schema_field(cfg, key)
        rule = field_.metadata.get("read_when") if field_ is not None else None
        if rule and selected_kind(cfg, rule[0]) not in rule[1]:
            raise ConfigError(_unread_message(key, rule, cfg))
        listed = field_ is not None and field_.metadata.get("read_if_listed")
        if listed and field_.name not in getattr(owner, "reads", ()):
            raise ConfigError(_unlisted_message(key, field_.name, cfg))
        honoured = field_ is not None and field_.metadata.get("read_if_honoured")
        task = OmegaConf.select(cfg, "task")  # None when the experiment names none
        if honoured and key not in (task and registry.lookup(HONOURED, task) or ()):
            raise ConfigError(_unhonoured_message(key, cfg))


def _unhonoured_message(key: str, cfg: DictConfig) -> str:
    """A trainer setting the run's task does not act on (schema.read_if_honoured)."""
    registry.load()
    tasks = [kind for kind, keys in registry.entries(HONOURED).items() if key in keys]
    return (
        f"{key} would change nothing in this run: its task ({cfg.task}) does not act on it "
        f"(the tasks that do: {', '.join(sorted(tasks)) or 'none'}; this run is "
        f"experiment={cfg.experiment_name}). Remove {key}=... from the command line, or choose "
        "settings that read it."
    )


def _schema_field(cfg: DictConfig, key: str) -> tuple[dataclasses.Field | None, type | None]:
    """The schema field `key` names and the schema that holds it, walking down from the root:
    every part must be a field of its parent's schema (a `+key` Hydra added to a schema that
    lacks it is refused); below a free-form mapping (model.kwargs) anything goes (None)."""
    node, found, owner = cfg, None, None
    for part in key.split("."):
        schema = schema_of(node) if isinstance(node, DictConfig) else None
        if schema is None:
            return None, None  # a free-form mapping: its keys are the user's
        fields = {f.name: f for f in dataclasses.fields(schema)}
        if part not in fields:
            raise ConfigError(not_a_setting(key, cfg))
        found, owner, node = fields[part], schema, node.get(part)
    return found, owner


def _unlisted_message(key: str, name: str, cfg: DictConfig) -> str:
    """A base schema's field that the run's option does not read (schema.read_if_listed)."""
    from mpt_repro import catalog

    group = key.split(".")[0]
    schemas = registry.option_schemas().get(group, {})
    readers = [
        option
        for option, schema in catalog.option_schemas(group).items()
        if name in getattr(schemas.get(schema), "reads", ())
    ]
    return (
        f"{key} would change nothing in this run: its {group} ({option_name(cfg[group].name)}) "
        f"does not read it (read by {group}={', '.join(readers) or 'none'}; this run is "
        f"experiment={cfg.experiment_name}). Remove {key}=... from the command line, or choose "
        "settings that read it."
    )


def _unread_message(key: str, rule: tuple[str, tuple[str, ...]], cfg: DictConfig) -> str:
    selector, readers = rule
    kind = selected_kind(cfg, selector)
    # a plugin's scaler that does not declare a knob it is given: how to declare it
    # (schema.read_if_declared)
    plugins_word = getattr(readers, "refusal", None)
    if plugins_word is not None and (said := plugins_word(key, kind)) is not None:
        return said
    label = SELECTOR_WORDS.get(selector, selector)
    who = " or ".join([", ".join(readers[:-1]), readers[-1]] if len(readers) > 1 else readers)
    return (
        f"{key} would change nothing in this run: it is read only when {label} is {who}, and "
        f"this run (experiment={cfg.experiment_name}) has {kind}. Remove {key}=... from the "
        "command line, or choose settings that read it."
    )


def options_with_field(group: str, field_name: str) -> list[str]:
    """The options of `group` whose schema has `field_name`."""
    from mpt_repro import catalog

    schemas = registry.option_schemas().get(group, {})
    return [
        option
        for option, name in catalog.option_schemas(group).items()
        if name in schemas and field_name in {f.name for f in dataclasses.fields(schemas[name])}
    ]


def not_a_setting(
    key: str, cfg: DictConfig | None = None, schema: type | None = None, typed: bool = True
) -> str:
    """Why `model.hidden_size` (a field of another option's schema) cannot be set in this run:
    the options that have it, and the one this run uses (from the composed config, or from the
    schema Hydra refused the key in). typed=False: a config file set the key (an experiment
    made for another option of the group), not the command line."""
    from mpt_repro import catalog

    group, _, rest = key.partition(".")
    leaf = rest.split(".")[0]
    moved = _moved_key_message(key)  # a config file of one's own from before the move
    if moved is not None:
        return moved
    if group not in registry.option_schemas():
        return f"{key} is not a setting of this run"
    have = options_with_field(group, leaf)
    if cfg is not None and group in cfg:
        mine = [option_name(cfg[group].name)]
    else:  # the options whose schema is the one that refused the key
        names = {n for n, c in registry.option_schemas()[group].items() if c is schema}
        mine = [o for o, n in catalog.option_schemas(group).items() if n in names]
    used = f"{group}={' or '.join(mine)}" if mine else f"this run's {group}"
    if not have:
        return f"{key}: no {group} option has a setting {leaf!r} ({used} neither)"
    if not typed:
        return (
            f"{used} does not fit this experiment: the experiment sets {key}, which only "
            f"{', '.join(have)} {'has' if len(have) == 1 else 'have'}. Drop {group}=... from the "
            f"command line to use the experiment's own {group}, or choose an experiment made for "
            f"{used}."
        )
    return (
        f"{key} would change nothing in this run: {used} has no setting {leaf!r}; "
        f"{', '.join(have)} {'has' if len(have) == 1 else 'have'} it. Remove {key}=... from the "
        f"command line, or choose that {group} ({group}={have[0]})."
    )
