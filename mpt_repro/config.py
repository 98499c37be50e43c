"""The typed configuration schema, registered in Hydra's ConfigStore.

Every YAML file in conf/ is merged onto these dataclasses, so a misspelled key or a value of the
wrong type is refused by Hydra before any work starts. `validate` then checks the values that
types cannot (a negative learning rate, a batch size of 0, contradictory precision knobs) and
raises ConfigError naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from mpt_repro.errors import ConfigError
from mpt_repro.precision.config import PrecisionConfig
from mpt_repro.telemetry.config import TelemetryConfig


class TaskKind(Enum):
    classification = "classification"
    language_model = "language_model"
    gan = "gan"
    detection = "detection"


@dataclass
class DataConfig:
    name: str = "digits"  # digits | synthetic | imagenet | corpus | images
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
    variant: str = ""  # e.g. resnet50: torchvision | preact
    width: int = 32
    dropout: float = 0.0
    aux_logits: bool = False
    channels_last: bool = (
        False  # NHWC memory format on CUDA (faster convolutions with tensor cores)
    )
    # language model (LSTM with projection, optional sampled softmax)
    embed_dim: int = 64
    hidden_size: int = 128
    proj_size: int = 0  # 0: no projection
    num_layers: int = 2
    num_sampled: int = 0  # sampled-softmax negatives; 0: full softmax
    # GAN
    latent_dim: int = 100
    gen_features: int = 64
    disc_features: int = 64
    # detection: a VGG-16 weights file (torchvision state dict or a vgg16 run's checkpoint)
    backbone_weights: str | None = None


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | adam | adamw | adagrad | rmsprop
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    initial_accumulator_value: float = 0.0  # adagrad
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
    # fused optimizer kernels (sgd/adam/adamw): they skip an overflowing step on the device, so a
    # step needs no host sync. auto: wherever torch has the kernel | true | false (foreach)
    fused: str = "auto"
    # evaluate an exponential moving average of the parameters (FP32) with this decay; null: the
    # raw weights. Inception v3 (TF-slim) 0.9999, the big LSTM (f-lm) 0.999
    ema_decay: float | None = None


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
    task: TaskKind = TaskKind.classification
    seed: int = 0
    resume: bool = False
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
    ConfigStore.instance().store(name="schema", node=Config)


def _check(ok: bool, key: str, value: Any, must: str) -> None:
    if not ok:
        raise ConfigError(
            f"{key} {must} (got {value!r}). Fix it in the config or on the command line, e.g. "
            f"{key}=..."
        )


OPTIMIZERS = ("sgd", "adam", "adamw", "adagrad", "rmsprop")
SCHEDULES = ("constant", "step", "multistep", "poly", "cosine", "exponential")
AUGMENTATIONS = ("none", "caffe", "torchvision", "inception", "ssd", "flip")


def validate(cfg: DictConfig) -> None:
    """Check what the types cannot; raise ConfigError naming the key."""
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
    _check(o.name in OPTIMIZERS, "optim.name", o.name, f"must be one of {OPTIMIZERS}")
    _check(o.schedule in SCHEDULES, "optim.schedule", o.schedule, f"must be one of {SCHEDULES}")
    _check(o.lr > 0, "optim.lr", o.lr, "must be > 0")
    _check(o.momentum >= 0, "optim.momentum", o.momentum, "must be >= 0")
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
    _check(
        cfg.budget.name in ("paper", "short", "smoke"),
        "budget.name",
        cfg.budget.name,
        "must be paper, short or smoke",
    )
    _check(
        cfg.paper_loss_scale is None or cfg.paper_loss_scale > 0,
        "paper_loss_scale",
        cfg.paper_loss_scale,
        "must be > 0 or null",
    )
    from mpt_repro.precision.validate import validate_precision
    from mpt_repro.telemetry.config import validate_telemetry

    validate_precision(cfg.precision, cfg.paper_loss_scale)
    validate_telemetry(cfg.telemetry)


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain JSON-able data (enums as strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]
