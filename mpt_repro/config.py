"""The typed configuration schema, registered in Hydra's ConfigStore, and the checks around it.

Every YAML file in conf/ is merged onto these dataclasses, so a misspelled key or a value of the
wrong type is refused before any work starts. Three checks go further:

- `check_command_line` refuses a key the schema does not have, with or without a leading `+`
  (Hydra would add a `+key` silently, and the run would ignore it);
- `check_overrides_are_read` refuses a command-line key that the selected experiment does not
  read (another model's field, a loss-scaling knob under a preset without scaling), from the
  table READ_ONLY_BY below;
- `validate` checks the values that types cannot (a negative learning rate, a batch size of 0,
  contradictory precision knobs) and raises ConfigError naming the key.

Nothing here imports torch: `mpt-run --help` and shell completion load this module.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from mpt_repro.catalog import CONF_DIR, options, recipes  # noqa: E402,F401  (re-exported)
from mpt_repro.errors import ConfigError
from mpt_repro.identity import is_custom_model
from mpt_repro.precision.config import PrecisionConfig
from mpt_repro.telemetry.config import TelemetryConfig


def option_name(value: Any) -> str:
    """The name of a config choice, whether OmegaConf hands over an Enum member or a string."""
    return str(getattr(value, "name", value))


def known_tasks() -> list[str]:
    """The task names the registry knows (importing the tasks registers them; needs torch)."""
    from mpt_repro.tasks import registered

    return registered()


@dataclass
class DataConfig:
    name: str = "digits"  # digits | synthetic | imagenet | imagefolder | corpus | images
    root: str | None = None  # data folder (imagenet: holds train/ and val/)
    num_classes: int = 10
    channels: int = 1
    image_size: int = 8  # training crop
    resize_size: int | None = None  # validation: resize shorter side, then center-crop image_size
    augmentation: str = "none"  # none | caffe | torchvision | inception
    batch_size: int = 64
    eval_batch_size: int | None = None  # null: same as batch_size
    num_workers: int = 0
    pin_memory: bool = True
    train_limit: int | None = None  # use only the first N training examples (budgets)
    eval_limit: int | None = None
    # synthetic data: random tensors of the configured shape, for speed measurements
    synthetic_train_size: int = 2048
    synthetic_eval_size: int = 256
    synthetic_pool: int = 256  # distinct images, made once and kept on the training device
    # ImageNet / imagefolder
    decode: str = "cpu"  # cpu: loader workers decode JPEGs | gpu: nvJPEG on the CUDA device
    on_corrupt: str = "fail"  # fail: stop, naming the file | skip: warn, use the next image
    holdout_every: int = 10  # imagefolder with no val/ folder: every N-th image is held out
    # word-level corpora (train.txt / valid.txt / test.txt)
    seq_len: int = 35  # truncated back-propagation through time
    min_freq: int = 1  # words seen fewer times become <unk>
    max_vocab: int | None = None
    # detection (data=voc): splits "<year>/<set>", the longer-side cap (Faster R-CNN's 1000) and
    # whether `difficult` boxes are training targets (evaluation always ignores them)
    train_splits: list[str] = field(default_factory=list)  # e.g. [2007/trainval, 2012/trainval]
    eval_splits: list[str] = field(default_factory=list)  # e.g. [2007/test]
    max_size: int | None = None
    train_difficult: bool = True


@dataclass
class ModelConfig:
    """One schema for every architecture; a model ignores the fields it does not use."""

    name: str = "digits_cnn"
    # alexnet, googlenet: caffe (the paper's, default) | torchvision; resnet50: preact | torchvision
    variant: str = ""
    width: int = 32
    dropout: float = 0.0
    # auxiliary classifiers (googlenet, inception_v2, inception_v3), trained only
    aux_logits: bool = False
    aux_weight: float = 0.3  # each auxiliary loss's weight (Caffe prototxts 0.3, TF-slim v3 0.4)
    aux_dropout: float = 0.7  # googlenet's auxiliary heads (BVLC prototxt: 0.7)
    # NHWC memory format for CNNs on CUDA (tensor-core convolutions without layout transposes);
    # ignored on the CPU and for models that are not CNNs
    channels_last: bool = True
    # language model (LSTM with projection, optional sampled softmax)
    embed_dim: int = 64
    hidden_size: int = 128
    proj_size: int = 0  # 0: no projection
    num_layers: int = 2
    num_sampled: int = 0  # sampled-softmax negatives; 0: full softmax
    # initial forget-gate bias (TF LSTMCell / f-lm: 1.0); null: none (all biases start at 0)
    forget_bias: float | None = None
    # f-lm's num_shards: the embedding and softmax weights are initialised per shard of
    # ceil(vocabulary / init_shards) rows, U(+-sqrt(3 / rows)) (mpt_repro/models/lstm_lm.py)
    init_shards: int = 8
    # GAN
    latent_dim: int = 100
    gen_features: int = 64
    disc_features: int = 64
    noise: str = "uniform"  # uniform U(-1, 1) (Radford et al.) | normal N(0, 1) (pytorch/examples)
    # detection: a VGG-16 weights file (torchvision state dict or a vgg16 run's checkpoint)
    backbone_weights: str | None = None
    # model=custom: factory "package.module:factory" called as factory(num_classes=..., **kwargs)
    target: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | adam | adamw | adagrad | rmsprop | rmsprop_tf
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8  # rmsprop: added to sqrt(v); rmsprop_tf: added to v inside the sqrt (TF)
    alpha: float = 0.99  # rmsprop, rmsprop_tf: decay of the mean square (TF calls it decay)
    initial_accumulator_value: float = 0.0  # adagrad
    # Per-parameter-group multipliers of lr and weight_decay (Caffe's lr_mult / decay_mult), by
    # kind (mpt_repro/optim.py param_kinds): "bias" = biases of layers with a weight matrix
    # (conv, linear, LSTM); "norm" = the other 1-d parameters (batch/layer-norm scale and shift).
    bias_lr_mult: float = 1.0
    bias_decay_mult: float = 1.0
    norm_lr_mult: float = 1.0
    norm_decay_mult: float = 1.0
    # LR schedule, in epochs (fractions allowed); stepped every iteration
    schedule: str = "constant"  # constant | step | multistep | poly | cosine | exponential
    step_size: float = 30.0
    milestones: list[float] = field(default_factory=list)
    gamma: float = 0.1
    power: float = 1.0  # poly
    warmup_epochs: float = 0.0
    # scale the LR with the global batch: lr * global_batch / base_batch_size (linear rule)
    lr_scaling: str = "none"  # none | linear
    base_batch_size: int = 256
    grad_clip: float | None = None  # max global grad norm, applied to unscaled gradients
    # which parameters the clip norm covers and clips: a regex searched in parameter names
    # (f-lm: "lstm\." clips the LSTM's gradients only); null: every parameter
    grad_clip_params: str | None = None
    # fused optimizer kernels (sgd/adam/adamw; rmsprop_tf's own device-side skip): they skip an
    # overflowing step on the device, so a step needs no host sync. auto: wherever the kernel
    # exists | true | false (foreach)
    fused: str = "auto"
    # objective (the trainer/tasks apply these)
    label_smoothing: float = 0.0  # classification: TF's softmax_cross_entropy label_smoothing
    lm_loss_times_steps: bool = False  # LM: backpropagate mean token loss x seq_len (f-lm)
    embedding_grad_scale: float = 1.0  # LM: embedding gradients x this before clipping (f-lm)
    # evaluate an exponential moving average of the parameters (FP32) with this decay; null: the
    # raw weights. Inception v3 (TF-slim) 0.9999, the big LSTM (f-lm) 0.999
    ema_decay: float | None = None
    ema_warmup: bool = False  # TF's num_updates: decay_t = min(decay, (1 + t) / (10 + t))
    # which tensors are averaged: a regex searched in parameter names (f-lm: "lstm\."); null:
    # every parameter and floating-point buffer (BN statistics), as TF's inception_train.py
    ema_params: str | None = None


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    epochs: int = 1
    max_steps: int | None = None  # stop after this many iterations (budgets)
    log_every: int = 10
    eval_every: int | None = None  # iterations; null: at the end of each epoch
    checkpoint_every: int | None = None  # iterations; null: at the end of each epoch
    diverge_patience: int = 10  # consecutive non-finite losses that end a run as diverged
    # gradient accumulation: micro-batches per optimizer step, so one GPU reproduces a larger
    # global batch (data.batch_size is each micro-batch's; the LR rule sees the whole)
    accumulate: int = 1
    # before each evaluation, re-estimate BatchNorm's running statistics on this many training
    # batches with the current weights (0: off). Smoke budgets: a few steps of running averages
    # are meaningless, and an evaluation with them looks broken (loss NaN or 1e6)
    recalibrate_bn: int = 0
    # torch.compile the training forward (classification): fewer kernels, fused elementwise ops.
    # Opt-in: compiling takes minutes, and the hooks of precision=adaptive and of telemetry
    # cannot be compiled (refused with them)
    compile: bool = False
    progress: bool = True
    deterministic: bool = False
    cudnn_benchmark: bool = True


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


@dataclass
class PathsConfig:
    runs_dir: str = "results/runs"


@dataclass
class Config:
    experiment_name: str = MISSING
    # the recipe behind the run (conf/recipe: public | nvcaffe), recorded in run.json's config
    recipe: str = "public"
    task: str = "classification"  # a name in the task registry (mpt_repro/tasks)
    seed: int = 0
    resume: bool = False  # continue the run in its directory from its last checkpoint
    overwrite: bool = False  # train again over a finished run (its files are moved aside first)
    paper_loss_scale: float | None = None
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


def register_configs() -> None:
    from mpt_repro.identity import register_resolvers

    ConfigStore.instance().store(name="schema", node=Config)
    register_resolvers()  # ${mpt_run_path:...}, the run directory's name (conf/config.yaml)


def _check(ok: bool, key: str, value: Any, must: str) -> None:
    if not ok:
        raise ConfigError(
            f"{key} {must} (got {value!r}). Fix it in the config or on the command line, e.g. "
            f"{key}=..."
        )


OPTIMIZERS = ("sgd", "adam", "adamw", "adagrad", "rmsprop", "rmsprop_tf")
SCHEDULES = ("constant", "step", "multistep", "poly", "cosine", "exponential")
AUGMENTATIONS = ("none", "caffe", "torchvision", "inception", "ssd", "flip")


def validate(cfg: DictConfig) -> None:
    """Check what the types cannot; raise ConfigError naming the key. Imports no torch: mpt-run
    refuses a bad value before torch loads (mpt_repro/preflight.py)."""
    _check_finite(cfg)
    d, o, t = cfg.data, cfg.optim, cfg.trainer
    _check(d.batch_size > 0, "data.batch_size", d.batch_size, "must be a positive integer")
    _check(
        d.eval_batch_size is None or d.eval_batch_size > 0,
        "data.eval_batch_size",
        d.eval_batch_size,
        "must be positive",
    )
    _check(d.image_size > 0, "data.image_size", d.image_size, "must be positive")
    _check(d.num_workers >= 0, "data.num_workers", d.num_workers, "must be >= 0")
    _check(d.seq_len > 0, "data.seq_len", d.seq_len, "must be positive")
    _check(
        d.train_limit is None or d.train_limit > 0,
        "data.train_limit",
        d.train_limit,
        "must be positive or null",
    )
    _check(
        d.eval_limit is None or d.eval_limit > 0,
        "data.eval_limit",
        d.eval_limit,
        "must be positive or null",
    )
    _check(
        d.augmentation in AUGMENTATIONS,
        "data.augmentation",
        d.augmentation,
        f"must be one of {AUGMENTATIONS}",
    )
    _check(d.decode in ("cpu", "gpu"), "data.decode", d.decode, "must be cpu or gpu")
    _check(
        d.on_corrupt in ("fail", "skip"), "data.on_corrupt", d.on_corrupt, "must be fail or skip"
    )
    _check(d.holdout_every >= 2, "data.holdout_every", d.holdout_every, "must be >= 2")
    _check(d.synthetic_pool > 0, "data.synthetic_pool", d.synthetic_pool, "must be positive")
    _check(o.name in OPTIMIZERS, "optim.name", o.name, f"must be one of {OPTIMIZERS}")
    _check(o.schedule in SCHEDULES, "optim.schedule", o.schedule, f"must be one of {SCHEDULES}")
    _check(o.lr > 0, "optim.lr", o.lr, "must be > 0")
    _check(0 <= o.momentum < 1, "optim.momentum", o.momentum, "must be in [0, 1)")
    _check(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "must be >= 0")
    _check(o.eps > 0, "optim.eps", o.eps, "must be > 0")
    _check(0 < o.gamma <= 1, "optim.gamma", o.gamma, "must be in (0, 1]")
    _check(o.warmup_epochs >= 0, "optim.warmup_epochs", o.warmup_epochs, "must be >= 0")
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
    validate_model_optim(cfg)
    _check(t.epochs > 0, "trainer.epochs", t.epochs, "must be positive")
    _check(
        t.max_steps is None or t.max_steps > 0,
        "trainer.max_steps",
        t.max_steps,
        "must be positive or null",
    )
    _check(t.log_every > 0, "trainer.log_every", t.log_every, "must be positive")
    _check(t.accumulate >= 1, "trainer.accumulate", t.accumulate, "must be >= 1")
    _check(t.recalibrate_bn >= 0, "trainer.recalibrate_bn", t.recalibrate_bn, "must be >= 0")
    _check(
        t.eval_every is None or t.eval_every > 0,
        "trainer.eval_every",
        t.eval_every,
        "must be positive or null",
    )
    _check(
        t.checkpoint_every is None or t.checkpoint_every > 0,
        "trainer.checkpoint_every",
        t.checkpoint_every,
        "must be positive or null",
    )
    _check(
        t.diverge_patience > 0, "trainer.diverge_patience", t.diverge_patience, "must be positive"
    )
    _check(
        t.device == "auto" or t.device == "cpu" or t.device.startswith("cuda"),
        "trainer.device",
        t.device,
        "must be auto, cpu, cuda or cuda:N",
    )
    dd = cfg.distributed
    _check(
        dd.backend in ("auto", "nccl", "gloo"),
        "distributed.backend",
        dd.backend,
        "must be auto, nccl or gloo",
    )
    _check(
        dd.batch_size_is in ("per_process", "global"),
        "distributed.batch_size_is",
        dd.batch_size_is,
        "must be per_process or global",
    )
    _check(dd.timeout_s > 0, "distributed.timeout_s", dd.timeout_s, "must be positive")
    budgets = options("budget")
    _check(cfg.budget.name in budgets, "budget.name", cfg.budget.name, f"must be one of {budgets}")
    have = recipes(cfg.experiment_name)
    _check(
        cfg.recipe in have,
        "recipe",
        cfg.recipe,
        f"must be one of experiment={cfg.experiment_name}'s recipes: {', '.join(have)} "
        "(conf/experiment_recipe/ holds them; docs/recipes.md)",
    )
    # the registry's names (tests/test_config_reads.py keeps KINDS equal to it): no torch import
    tasks = list(KINDS["task"])
    _check(cfg.task in tasks, "task", cfg.task, f"must be one of {tasks}")
    runs_dir = str(cfg.paths.runs_dir or "").strip()
    _check(
        bool(runs_dir) and Path(runs_dir).resolve() != Path(Path(runs_dir).resolve().anchor),
        "paths.runs_dir",
        cfg.paths.runs_dir,
        "must name a results folder (not empty, not the file system's root), e.g. "
        "paths.runs_dir=results/runs",
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
    from mpt_repro.precision.validate import validate_optimizer_state, validate_precision
    from mpt_repro.telemetry.config import validate_telemetry

    validate_precision(cfg.precision, cfg.paper_loss_scale)
    validate_optimizer_state(cfg.precision, cfg.optim)  # FP16 state an eps would turn into 0/0
    validate_telemetry(cfg.telemetry)


def validate_model_optim(cfg: DictConfig) -> None:
    """The recipe fields of model.* and optim.* (issue 12): multipliers, objective, EMA, regexes."""
    m, o = cfg.model, cfg.optim
    for key in ("bias_lr_mult", "bias_decay_mult", "norm_lr_mult", "norm_decay_mult"):
        _check(o[key] >= 0, f"optim.{key}", o[key], "must be >= 0")
    _check(0 <= o.alpha < 1, "optim.alpha", o.alpha, "must be in [0, 1)")
    _check(
        0 <= o.label_smoothing < 1, "optim.label_smoothing", o.label_smoothing, "must be in [0, 1)"
    )
    _check(
        o.embedding_grad_scale > 0,
        "optim.embedding_grad_scale",
        o.embedding_grad_scale,
        "must be > 0",
    )
    for key in ("grad_clip_params", "ema_params"):
        _check(_is_regex(o[key]), f"optim.{key}", o[key], "must be a valid regex or null")
    _check(m.aux_weight >= 0, "model.aux_weight", m.aux_weight, "must be >= 0")
    _check(0 <= m.aux_dropout < 1, "model.aux_dropout", m.aux_dropout, "must be in [0, 1)")
    _check(0 <= m.dropout < 1, "model.dropout", m.dropout, "must be in [0, 1)")
    _check(m.init_shards >= 1, "model.init_shards", m.init_shards, "must be >= 1")
    _check(m.noise in NOISES, "model.noise", m.noise, f"must be one of {NOISES}")
    if is_custom_model(m):
        _check(bool(m.target), "model.target", m.target, "must name a factory (package.module:fn)")
        builtin = set(options("model")) - {"custom"}
        _check(
            m.name not in builtin,
            "model.name",
            m.name,
            f"names a built-in model ({', '.join(sorted(builtin))}); a model of your own "
            "(model=custom) needs a name of its own, e.g. model.name=mynet",
        )


NOISES = ("uniform", "normal")


def _check_finite(cfg: DictConfig) -> None:
    """Every number of the resolved configuration is finite: `optim.lr=inf` or `1e400` (which
    parses as inf) would train on NaN weights and end as if it were a result."""
    import math

    from mpt_repro.identity import flatten

    values = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for key, value in flatten(values).items():
        numbers = value if isinstance(value, list) else [value]
        for x in numbers:
            if isinstance(x, float) and not math.isfinite(x):
                raise ConfigError(
                    f"{key}={value} is not a finite number. Fix it in the config or on the "
                    f"command line, e.g. {key}=..."
                )


def _is_regex(pattern: str | None) -> bool:
    try:
        return pattern is None or re.compile(pattern) is not None
    except re.error:
        return False


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain JSON-able data (enums as strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


# -- strict command lines ----------------------------------------------------------------------
# Keys under these schema nodes are free-form (a mapping handed on as is): `+node.anything=...`
# is the documented way to add one. Every node typed as a dict in the schema is one; none of
# today's fields is, so today no `+key=` addition is accepted.
def extension_points() -> list[str]:
    return [key for key, hint in _schema_fields(Config, "") if _origin(hint) is dict]


def check_command_line(argv: list[str]) -> str | None:
    """Why the command line names a key the configuration does not have, or None.

    A misspelled key and a `+key=` addition get the same answer: Hydra would add the `+` one to
    the config without complaint, and the run would ignore it (e.g. `+optim.lrr=0.1`).
    Group choices (`precision=amp`), Hydra's own settings and malformed overrides are left to
    Hydra, which reports those itself.
    """
    overrides = _parse(_override_args(argv))
    if overrides is None:
        return None
    groups = _groups()
    for o in overrides:
        key = o.key_or_group
        if o.is_delete() or o.package is not None or "/" in key or key.split(".")[0] == "hydra":
            continue
        if key in groups:
            continue
        if _schema_has(key):
            continue
        return _unknown_key_message(key)
    return None


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
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir()}


def _origin(hint: Any) -> Any:
    return typing.get_origin(hint) or hint


def _schema_fields(cls: type, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, type hint) of every field of a schema dataclass, nested ones included."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, hint = prefix + f.name, hints[f.name]
        out.append((key, hint))
        if dataclasses.is_dataclass(hint):
            out += _schema_fields(hint, key + ".")
    return out


def _schema_has(key: str) -> bool:
    fields = dict(_schema_fields(Config, ""))
    if key in fields:
        return True
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):  # under a free-form mapping, or an item of a list
        parent = fields.get(".".join(parts[:i]))
        if parent is not None and _origin(parent) in (dict, list, Any):
            return True
    return False


def _unknown_key_message(key: str) -> str:
    parent, _, name = key.rpartition(".")
    known = [
        k.rpartition(".")[2]
        for k, _ in _schema_fields(Config, "")
        if k.rpartition(".")[0] == parent
    ]
    close = [
        f"{parent}.{k}" if parent else k for k in difflib.get_close_matches(name, known, 2, 0.7)
    ]
    where = f"{parent} has no setting {name!r}" if parent else f"there is no top-level {name!r}"
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    points = extension_points()
    plus = (
        f"a leading + adds keys only under {', '.join(points)}"
        if points
        else "a leading + cannot add one: the run would not read it"
    )
    return f"unknown key {key!r}: {where}{hint}. `mpt-run --help` lists every key; {plus}."


# -- keys the selected experiment does not read ------------------------------------------------
# A command-line key listed here is refused when the run's kind (model, data set, optimizer,
# loss scaling, ...) is not among those that read it: `model.hidden_size=999` on the demo CNN or
# `precision.init_scale=1024` under fp32 would change nothing, silently, in a new directory.
# Keys not listed are read by every kind. When you add a model, a data set or a field that only
# some kinds read, add it here (tests/test_config_reads.py checks the table against conf/ and
# against the small models' parameter shapes).
#
# key -> (selector, the kinds that read it). A selector is a config key or a derived value
# (SELECTORS); KINDS lists the kinds each selector knows: a kind missing from it (a model added
# without updating this table) is never refused anything.
READ_ONLY_BY: dict[str, tuple[str, tuple[str, ...]]] = {
    # models
    "model.variant": (
        "model",
        (
            "alexnet",
            "googlenet",
            "inception_v2",
            "inception_v3",
            "resnet50",
            "small_grad_mlp",
            "vgg16",
        ),
    ),
    "model.width": ("model", ("digits_cnn", "faster_rcnn_vgg16", "small_grad_mlp", "ssd300")),
    "model.backbone_weights": ("model", ("faster_rcnn_vgg16", "ssd300")),
    "model.dropout": (
        "model",
        ("alexnet", "digits_cnn", "googlenet", "inception_v2", "inception_v3", "lstm_lm", "vgg16"),
    ),
    "model.aux_logits": ("model", ("googlenet", "inception_v2", "inception_v3")),
    "model.aux_weight": ("model", ("googlenet", "inception_v2", "inception_v3")),
    "model.aux_dropout": ("model", ("googlenet",)),
    "model.forget_bias": ("model", ("lstm_lm",)),
    "model.init_shards": ("model", ("lstm_lm",)),
    "model.noise": ("model", ("dcgan",)),
    "model.target": ("model", ("custom",)),
    "model.kwargs": ("model", ("custom",)),
    "model.channels_last": ("task", ("classification",)),
    "model.embed_dim": ("model", ("lstm_lm",)),
    "model.hidden_size": ("model", ("lstm_lm",)),
    "model.proj_size": ("model", ("lstm_lm",)),
    "model.num_sampled": ("model", ("lstm_lm",)),
    "model.num_layers": ("model", ("lstm_lm", "small_grad_mlp")),
    "model.latent_dim": ("model", ("dcgan",)),
    "model.gen_features": ("model", ("dcgan",)),
    "model.disc_features": ("model", ("dcgan",)),
    # data sets
    "data.root": ("data.name", ("corpus", "imagefolder", "imagenet", "images", "voc")),
    "data.train_splits": ("data.name", ("voc",)),
    "data.eval_splits": ("data.name", ("voc",)),
    "data.train_difficult": ("data.name", ("voc",)),
    "data.max_size": ("task", ("detection",)),
    "data.num_classes": ("data.name", ("imagenet", "synthetic")),
    "data.channels": ("data.name", ("images", "synthetic")),
    "data.image_size": ("data.name", ("imagefolder", "imagenet", "images", "synthetic", "voc")),
    "data.resize_size": ("data.name", ("imagefolder", "imagenet")),
    "data.augmentation": ("data.name", ("imagefolder", "imagenet", "synthetic", "voc")),
    "data.num_workers": (
        "data.name",
        ("digits", "imagefolder", "imagenet", "images", "synthetic", "voc"),
    ),
    "data.pin_memory": (
        "data.name",
        ("digits", "imagefolder", "imagenet", "images", "synthetic", "voc"),
    ),
    "data.synthetic_train_size": ("data.name", ("synthetic",)),
    "data.synthetic_eval_size": ("data.name", ("synthetic",)),
    "data.synthetic_pool": ("data.name", ("synthetic",)),
    "data.decode": ("data.name", ("imagefolder", "imagenet")),
    "data.on_corrupt": ("data.name", ("imagefolder", "imagenet")),
    "data.holdout_every": ("data.name", ("imagefolder",)),
    "data.seq_len": ("data.name", ("corpus",)),
    "data.min_freq": ("data.name", ("corpus",)),
    "data.max_vocab": ("data.name", ("corpus",)),
    # the loop
    "trainer.compile": ("task", ("classification",)),
    "trainer.recalibrate_bn": ("task", ("classification",)),
    # optimizers and LR schedules
    "optim.momentum": ("optim.name", ("rmsprop", "rmsprop_tf", "sgd")),
    "optim.alpha": ("optim.name", ("rmsprop", "rmsprop_tf")),
    "optim.nesterov": ("optim.name", ("sgd",)),
    "optim.betas": ("optim.name", ("adam", "adamw")),
    "optim.eps": ("optim.name", ("adagrad", "adam", "adamw", "rmsprop", "rmsprop_tf")),
    "optim.label_smoothing": ("task", ("classification",)),
    "optim.lm_loss_times_steps": ("task", ("language_model",)),
    "optim.embedding_grad_scale": ("task", ("language_model",)),
    "optim.initial_accumulator_value": ("optim.name", ("adagrad",)),
    "optim.step_size": ("optim.schedule", ("step",)),
    "optim.milestones": ("optim.schedule", ("multistep",)),
    "optim.gamma": ("optim.schedule", ("exponential", "multistep", "step")),
    "optim.power": ("optim.schedule", ("poly",)),
    "optim.base_batch_size": ("optim.lr_scaling", ("linear",)),
    # precision: by the loss scaling a run ends up with (`paper` resolved)
    "paper_loss_scale": ("precision.loss_scaling", ("paper",)),
    "precision.static_scale": ("precision.loss_scaling", ("static",)),
    "precision.init_scale": ("loss_scaling", ("dynamic",)),
    "precision.growth_factor": ("loss_scaling", ("dynamic",)),
    "precision.backoff_factor": ("loss_scaling", ("dynamic",)),
    "precision.hysteresis": ("loss_scaling", ("dynamic",)),
    "precision.min_scale": ("loss_scaling", ("dynamic",)),
    "precision.max_scale": ("loss_scaling", ("dynamic",)),
    "precision.growth_interval": ("loss_scaling", ("adaptive", "dynamic")),
    "precision.floor_patience": ("loss_scaling", ("adaptive", "dynamic", "static")),
    "precision.per_loss_scale": ("loss_scaling", ("adaptive", "dynamic", "static")),
    "precision.hold_lr_on_skip": ("loss_scaling", ("adaptive", "dynamic", "static")),
    **{
        f"precision.adaptive_{k}": ("loss_scaling", ("adaptive",))
        for k in ("underflow_threshold", "scale_upper_bound", "accum_upper_bound")
    },
    "precision.adaptive_update_interval": ("loss_scaling", ("adaptive",)),
    "precision.adaptive_method": ("loss_scaling", ("adaptive",)),
    "precision.adaptive_formula": ("loss_scaling", ("adaptive",)),
    "precision.adaptive_plan_cache": ("loss_scaling", ("adaptive",)),
    # telemetry: every knob but the switch itself
    **{
        f"telemetry.{f.name}": ("telemetry.enabled", ("true",))
        for f in dataclasses.fields(TelemetryConfig)
        if f.name != "enabled"
    },
}


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
        return f"static {value:g}" if value is not None else "static"
    if kind == "dynamic":
        return f"dynamic from {p.init_scale:g}"
    if kind == "adaptive":
        return "adaptive (per layer)"
    return kind


SELECTORS: dict[str, Any] = {
    # the model's kind: a custom model's name is its own identity, not a registry key
    "model": lambda cfg: "custom" if is_custom_model(cfg.model) else cfg.model.name,
    "loss_scaling": resolved_loss_scaling,
    "telemetry.enabled": lambda cfg: str(bool(cfg.telemetry.enabled)).lower(),
}
# what a message calls each selector, and the other way out besides dropping the override
SELECTOR_TEXT = {
    "model": ("the model", "choose a model that reads it (model=...)"),
    "data.name": ("the data set", "choose a data set that reads it (data=...)"),
    "optim.name": ("optim.name", "set optim.name to an optimizer that reads it"),
    "optim.schedule": ("optim.schedule", "set optim.schedule to a schedule that reads it"),
    "optim.lr_scaling": ("optim.lr_scaling", "set optim.lr_scaling=linear"),
    "precision.loss_scaling": (
        "precision.loss_scaling",
        "choose a precision preset that uses it (precision=...)",
    ),
    "loss_scaling": (
        "the loss scaling (precision.loss_scaling, with paper resolved)",
        "choose a precision preset that scales the loss that way (precision=...)",
    ),
    "task": ("the task", "choose an experiment of a task that reads it"),
    "telemetry.enabled": ("telemetry.enabled", "turn telemetry on (telemetry=diagnostic)"),
}
KINDS: dict[str, tuple[str, ...]] = {
    "model": (
        "alexnet",
        "custom",
        "dcgan",
        "digits_cnn",
        "googlenet",
        "inception_v2",
        "inception_v3",
        "lstm_lm",
        "resnet50",
        "small_grad_mlp",
        "ssd300",
        "faster_rcnn_vgg16",
        "vgg16",
    ),
    "data.name": ("corpus", "digits", "imagefolder", "imagenet", "images", "synthetic", "voc"),
    "optim.name": OPTIMIZERS,
    "optim.schedule": SCHEDULES,
    "optim.lr_scaling": ("linear", "none"),
    "precision.loss_scaling": ("adaptive", "dynamic", "none", "paper", "static"),
    "loss_scaling": ("adaptive", "dynamic", "none", "static"),
    "task": ("classification", "detection", "gan", "language_model"),
    "telemetry.enabled": ("false", "true"),
}


def selected_kind(cfg: DictConfig, selector: str) -> str:
    if selector in SELECTORS:
        return SELECTORS[selector](cfg)
    return option_name(OmegaConf.select(cfg, selector))


def check_overrides_are_read(cfg: DictConfig, overrides: list[str]) -> None:
    """Refuse a command-line override of a key this run does not read (READ_ONLY_BY).

    `overrides` are the job's override strings (HydraConfig's overrides.task). Raises
    ConfigError naming the key, the kind it would apply to and the run's own kind.
    """
    parsed = _parse(list(overrides)) or []
    for o in parsed:
        key = o.key_or_group
        # a factory's own arguments (+model.kwargs.width=64): read only by model=custom
        table_key = "model.kwargs" if key.startswith("model.kwargs.") else key
        if table_key not in READ_ONLY_BY or o.is_delete():
            continue
        selector, readers = READ_ONLY_BY[table_key]
        kind = selected_kind(cfg, selector)
        if kind in readers or kind not in KINDS.get(selector, ()):
            continue
        label, way_out = SELECTOR_TEXT.get(selector, (selector, f"set {selector} otherwise"))
        who = " or ".join([", ".join(readers[:-1]), readers[-1]] if len(readers) > 1 else readers)
        raise ConfigError(
            f"{key} would change nothing in this run: it is read only when {label} is {who}, "
            f"and this run (experiment={cfg.experiment_name}) has {kind}. Remove {key}=... from "
            f"the command line, or {way_out}."
        )
