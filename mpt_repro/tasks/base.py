"""What a task is: everything that differs between experiments (models, batches, loss, metrics).

The one training loop (mpt_repro/trainer.py) drives any Task; the one training step and the
one evaluation loop (mpt_repro/tasks/loops.py) run its code. A task writes what to compute:

    class Speech(SampledTask):
        def __init__(self, cfg, device, policy):
            super().__init__(cfg, device, policy)
            batch, global_batch = distributed.batch_sizes(cfg)
            self.data = ...
            self.model, self.optimizer, self.train_model = self.add_model(
                "model", self.new_model(vocab_size=...), optimizer_factory(cfg.optim, global_batch)
            )
            self.use_loaders(build_epoch_loaders(self.data.train, self.data.eval, ...))

        def loss(self, batch) -> Loss:                # one micro-batch, under autocast
            ...
            return Loss(ctc, samples=len(batch))

        item_unit = "utterances"
        item_key = "key"  # a column naming each utterance (a hash of its reference)
        formulas = {"cer": Ratio("char_errors", "chars", "characters", scale=100.0)}
        def eval_step(self, batch) -> dict: ...  # per utterance: char_errors, chars, key
        def eval_dropped(self) -> dict: ...      # utterances left out before scoring, by reason

Precision enters only through the PrecisionPolicy: `add_model` prepares the model and builds its
optimizer, `self.policy.cast_inputs` casts inputs; autocast, backward and the optimizer step
belong to loops.py. docs/design.md ("Task") has the whole interface.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from mpt_repro import distributed
from mpt_repro.data import describe_sizes, load_skip_state, skip_state
from mpt_repro.evidence import Evaluation, Formula
from mpt_repro.identity import is_custom_model
from mpt_repro.models import build_model
from mpt_repro.tasks.loops import (  # noqa: F401  (micro_batches: part of the task interface)
    Loss,
    Phase,
    StepResult,
    evaluate,
    micro_batches,
    predict,
    recalibrate_bn,
    train_step,
)


class Trained(NamedTuple):
    """What add_model gives a task for one model."""

    model: nn.Module  # prepared for the precision: what evaluation and checkpoints see
    optimizer: Any  # its PrecisionOptimizer
    forward: nn.Module  # what training calls: the DDP wrapper in a distributed run


class Task:
    name: str = ""
    primary_metric: str = "loss"  # the metric tables and sweeps compare
    metric_names: list[str] = ["loss"]  # what evaluate() returns
    # the column of the training loss in metrics.csv and TensorBoard (train/<name>): "loss", or
    # "sampled_loss" where training optimises a sampled softmax while evaluation scores the full
    # one, so that the two are never drawn or read as one quantity
    train_loss_name: str = "loss"
    # what the last evaluate() found besides its scalar metrics (e.g. per-class AP), for run.json
    metrics_detail: dict | None = None
    # Evaluation by items (mpt_repro/evidence.py): eval_step gives one value per item for each
    # column the formulas read (and may give more, e.g. the label, kept in the items file); every
    # metric is its formula over the columns' sums, and rests on the sum of its denominator.
    # None: the task sums its own totals (eval_totals, evaluation_of).
    item_unit: str = "items"  # what one item is: images, utterances, sentences, text blocks
    formulas: dict[str, Formula] | None = None
    # the column of eval_step that names each item (classification's label, a hash of a
    # reference): paired runs evaluated the same items only where their keys agree
    item_key: str | None = None
    # What mpt-bench asks a task (it names none): the loss of a micro-batch (inputs, targets) as
    # criterion(model(inputs), targets), where the task trains one model by exactly that (its
    # bare loop rewrites the step from it); None: the task's loss is its own
    criterion: Callable[[Any, Any], Any] | None = None
    # data.eval_limit counts what data.batch_size counts, so eval_limit = batch_size evaluates
    # one batch (mpt-bench's timed windows each end with one); False where it counts another
    # unit (a corpus's tokens against its streams)
    eval_limit_counts_batch_items: bool = False
    # What mpt-advise asks: the `loss` metric is a cross-entropy over num_classes classes (the
    # config's data.num_classes or model.num_classes), so an untrained model's is about
    # ln(num_classes) and a run that ends far above it did not train
    loss_is_cross_entropy_over_classes: bool = False

    models: dict[str, nn.Module]
    optimizers: dict[str, Any]  # PrecisionOptimizers, by the names add_model gave them

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        self.cfg, self.device, self.policy = cfg, device, policy
        self.models, self.optimizers = {}, {}
        self.train_models: dict[str, nn.Module] = {}  # the training forwards, by model name

    @property
    def higher_is_better(self) -> bool:
        """Which way the primary metric is better, as its registration says (`metric(...)` in
        the plugin module that reports it): said once, there. A metric registered without a
        direction, or not at all, counts as lower-better (a loss)."""
        from mpt_repro import registry

        info = registry.metric_info(self.primary_metric)
        return bool(info is not None and info.higher_is_better)

    # -- models -----------------------------------------------------------------------------
    def new_model(self, **kwargs: Any) -> Any:
        """build_model(cfg.model, **kwargs) right after torch.manual_seed(cfg.seed), before
        anything else draws random numbers: every precision preset starts from the same
        weights."""
        torch.manual_seed(self.cfg.seed)
        return build_model(self.cfg.model, **kwargs)

    def add_model(
        self,
        name: str,
        model: nn.Module,
        make_optimizer: Callable,
        forward: Callable[[nn.Module], nn.Module] | None = None,
        broadcast_buffers: bool = True,
    ) -> Trained:
        """Prepare `model` for the precision policy on the task's device, build its optimizer
        (`make_optimizer`, e.g. mpt_repro.optim.optimizer_factory) and its training forward:
        `forward(model)` when given (a module around the model, e.g. one that also computes
        the loss), wrapped in DDP in a distributed run (broadcast_buffers: see
        distributed.wrap_model). Registered as models[name], optimizers[name] and
        train_models[name]; optimizers are reported in the order added."""
        model = self.policy.prepare_model(model.to(self.device))
        # fsdp2: sharded before its optimizer is built, which then steps the shards
        model = distributed.shard_model(model, self.policy, self.cfg.distributed)
        optimizer = self.policy.build_optimizer(model, make_optimizer, name=name)
        wrapped = distributed.wrap_model(
            forward(model) if forward else model, self.cfg.distributed, broadcast_buffers
        )
        self.models[name], self.optimizers[name] = model, optimizer
        self.train_models[name] = wrapped
        return Trained(model, optimizer, wrapped)

    # -- training -----------------------------------------------------------------------------
    def steps_per_epoch(self) -> int:
        raise NotImplementedError

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        """One item per iteration, in an order fixed by (seed, epoch); the first `skip` left out
        (resume)."""
        raise NotImplementedError

    def split(self, batch: Any) -> list[Any]:
        """An iteration's micro-batches (default: the item is one micro-batch)."""
        return [batch]

    def loss(self, batch: Any) -> Loss:
        """The loss of one micro-batch, computed under autocast (single-optimizer tasks)."""
        raise NotImplementedError

    def phases(self) -> list[Phase]:
        """The optimizer steps of one iteration, in order. Default: the one optimizer, with
        `loss` on each micro-batch through its training forward."""
        (name,) = self.optimizers
        return [Phase(name, self.loss, (self.train_models[name],))]

    def step_options(self, optimizer: str) -> dict[str, Any]:
        """Keyword arguments of that optimizer's step (PrecisionOptimizer.step)."""
        return {"clip_grad_norm": self.cfg.optim.grad_clip}

    def train_step(self, batch: Any) -> StepResult:
        """One iteration: the shared step (tasks/loops.py)."""
        return train_step(self, batch)

    def examples_on_first_dim(self, micro_batch: Any, examples: int) -> bool:
        """Whether a micro-batch of `examples` examples (as its Loss counted them) holds them
        along the first dimension of every part, so that the first n rows of each part are a
        micro-batch of n examples (mpt-bench steps on two such cuts to measure the bytes saved
        for backward per example). Default: a list or tuple of tensors that each have
        `examples` rows (inputs, labels); not one holding anything else (lengths, a hidden
        state, lists of targets, a token count). A task whose parts have `examples` rows that
        are not its examples (time steps) says False."""
        if not isinstance(micro_batch, (list, tuple)) or not micro_batch:
            return False
        return all(
            isinstance(part, torch.Tensor) and part.dim() > 0 and part.shape[0] == examples
            for part in micro_batch
        )

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self) -> Evaluation:
        """The shared evaluation loop (tasks/loops.py) over eval_batches."""
        return evaluate(self)

    def predict(self, model: nn.Module, *inputs: Any) -> Any:
        """`model(*inputs)` as evaluation runs it (eval mode, no_grad, autocast): for outputs
        beyond the metrics, such as the GAN's sample grid."""
        return predict(self, model, *inputs)

    def eval_batches(self) -> Iterable[Any]:
        raise NotImplementedError

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Computed under autocast and no_grad: with `formulas`, each column's values for the
        batch's items (a 1-D tensor or list each, one value per item; a `dropped_<reason>`
        column marks items a loss or a metric left out); without, what the batch adds to
        eval_totals (same keys)."""
        raise NotImplementedError

    def item_columns(self) -> list[str]:
        """The columns eval_step gives, so a rank with nothing to evaluate still has them."""
        columns = {c for f in (self.formulas or {}).values() for c in f.columns()}
        return sorted(columns | ({self.item_key} if self.item_key else set()))

    def eval_dropped(self) -> dict[str, int]:
        """Items of the evaluation data left out before scoring, by reason (e.g. pairs longer
        than the largest bucket): run.json and the closing block state them."""
        return {}

    def eval_totals(self) -> dict[str, Any]:
        """Without `formulas`: the running totals before the first batch, a zero per sum and []
        per collected list. Every rank reduces these keys, also one with nothing to evaluate."""
        raise NotImplementedError

    def evaluation_of(self, totals: dict[str, Any]) -> Evaluation:
        """Without `formulas`: the Evaluation from the totals of every rank (numbers summed,
        lists joined), with the count each metric rests on and null for a metric with nothing
        under it (detection: mAP over the ground-truth objects)."""
        raise NotImplementedError

    def recalibrate_bn(self, batches: int) -> None:
        """Re-estimate BatchNorm running statistics on `batches` training inputs
        (trainer.recalibrate_bn), for tasks that give recalibration_inputs."""
        inputs = self.recalibration_inputs(batches)
        if inputs is not None:
            (model,) = self.models.values()
            recalibrate_bn(model, inputs, self.policy.autocast)

    def recalibration_inputs(self, batches: int) -> Iterable[Any] | None:
        """The model inputs BN recalibration runs, or None (no recalibration)."""
        return None

    # -- the rest -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def log_media(self, writer: Any, step: int) -> None:
        """Write images or other media to TensorBoard at evaluation time."""

    def describe_data(self) -> dict:
        return {"name": self.cfg.data.name, "root": self.cfg.data.root}

    def describe_model(self) -> dict:
        params = sum(p.numel() for m in self.models.values() for p in m.parameters())
        described = {
            "name": self.cfg.model.name,  # a custom model's own name (model.name)
            "variant": self.cfg.model.get("variant") or None,  # only models that have several
            "parameters": params,
        }
        if is_custom_model(self.cfg.model):
            described["target"] = self.cfg.model.target
        return described


def chunked(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    """Groups of ``n`` consecutive items (an iteration's micro-batches); a short tail is dropped,
    as a loader drops its last partial batch."""
    it = iter(items)
    while len(group := list(itertools.islice(it, n))) == n:
        yield group


class SampledTask(Task):
    """A task that trains on a loader ordered by an EpochSampler, `self.accumulate`
    micro-batches per iteration, and evaluates on a loader of its own (use_loaders): the image
    tasks. `self.data` has `train` and `eval` data sets and a `description`."""

    data: Any
    sampler: Any
    train_loader: Any
    eval_loader: Any

    # its data sets are sequences of examples, batched and cut (data.eval_limit) by the example
    eval_limit_counts_batch_items = True

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        self.accumulate = cfg.trainer.accumulate

    def use_loaders(self, loaders: Any) -> None:
        """Train and evaluate on these (data.sampling.EpochLoaders)."""
        self.sampler, self.train_loader = loaders.sampler, loaders.train
        self.eval_loader = loaders.eval

    def steps_per_epoch(self) -> int:
        return self.sampler.batches_per_epoch() // self.accumulate

    def train_batches(self, epoch: int, skip: int = 0) -> Iterator[list[Any]]:
        """Each iteration's micro-batches (trainer.accumulate of them), in the (seed, epoch)
        order; a resumed run skips the iterations it has done."""
        self.sampler.set_epoch(epoch, skip_batches=skip * self.accumulate)
        return chunked(self.train_loader, self.accumulate)

    def split(self, batch: list[Any]) -> list[Any]:
        return batch  # train_batches gives each iteration's micro-batches already

    def eval_batches(self) -> Iterable[Any]:
        return self.eval_loader

    def _splits(self) -> dict[str, Any]:
        return {"train": self.data.train, "eval": self.data.eval}

    def state_dict(self) -> dict:
        # the files data.on_corrupt=skip has skipped (nothing for data sets that never skip)
        return skip_state(self._splits())

    def load_state_dict(self, state: dict) -> None:
        load_skip_state(self._splits(), state)

    def describe_data(self, **details: Any) -> dict:
        """run.json "data": name, root, the sizes used (less skipped files), `details`, and the
        data set's description."""
        return {
            **super().describe_data(),
            # data.on_corrupt: the image folders' (the other data sets never skip a file)
            **describe_sizes(self.data.train, self.data.eval, self.cfg.data.get("on_corrupt")),
            **details,
            "description": self.data.description,
        }
