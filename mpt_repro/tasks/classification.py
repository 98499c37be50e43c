"""Image classification (the paper's ILSVRC experiments and the digits demo): top-1 and top-5."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

from mpt_repro import distributed
from mpt_repro.data import build_image_data
from mpt_repro.data.sampling import build_epoch_loaders
from mpt_repro.errors import ConfigError, DataError
from mpt_repro.evidence import Ratio
from mpt_repro.identity import is_custom_model
from mpt_repro.models.losses import classification_loss
from mpt_repro.optim import optimizer_factory
from mpt_repro.precision.config import enum_name
from mpt_repro.tasks.base import Loss, SampledTask, StepResult


def compiled(model: torch.nn.Module, cfg: Any) -> torch.nn.Module:
    """trainer.compile=true: torch.compile the training forward (evaluation stays eager)."""
    if enum_name(cfg.precision.loss_scaling) == "adaptive":
        raise ConfigError(
            "trainer.compile=true cannot compile precision=adaptive's per-layer hooks; "
            "use trainer.compile=false"
        )
    if cfg.telemetry.enabled:
        raise ConfigError(
            "trainer.compile=true cannot compile telemetry's hooks; use trainer.compile=false or "
            "telemetry.enabled=false"
        )
    return torch.compile(model)


def _logits(out: Any) -> torch.Tensor:
    """The main head's logits (a model with auxiliary heads returns a tuple in training)."""
    return out if torch.is_tensor(out) else out[0]


class Classification(SampledTask):
    primary_metric = "top1"
    loss_is_cross_entropy_over_classes = True  # mpt-advise predicts from the class count
    metric_names = ["loss", "top1", "top5"]
    item_unit = "images"
    item_key = "label"
    formulas = {
        "loss": Ratio("loss", "items", "images"),
        "top1": Ratio("top1", "items", "images", scale=100.0),
        "top5": Ratio("top5", "items", "images", scale=100.0),
    }

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d = cfg.data
        batch, global_batch = distributed.batch_sizes(cfg)  # this process's and the step's
        self.data = build_image_data(d)
        self.micro_batch = batch
        model = self.new_model(
            num_classes=self.data.num_classes, channels=self.data.channels, image_size=d.image_size
        )
        model = distributed.maybe_sync_bn(model, cfg.distributed, device)
        self.channels_last = cfg.model.channels_last and device.type == "cuda"
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model, self.optimizer, self.train_model = self.add_model(
            "model", model, optimizer_factory(cfg.optim, global_batch)
        )
        self._compiled_step = None  # trainer.compile=step: the iteration as one graph
        if cfg.trainer.compile == "step":
            self._compiled_step = self._build_compiled_step(cfg, policy)
        elif cfg.trainer.compile:
            self.train_model = self.train_models["model"] = compiled(self.train_model, cfg)
        # batches arrive normalised on the device in the model's dtype and memory format: one
        # pass over the input (uint8 in the loader, one fused normalise-and-cast on the device)
        loaders = build_epoch_loaders(
            self.data.train,
            self.data.eval,
            d,
            batch,
            cfg.seed,
            device,
            input_dtype=policy.storage_dtype,
            memory_format=torch.channels_last if self.channels_last else None,
        )
        self.use_loaders(loaders)
        self._classes_checked = False

    def _build_compiled_step(self, cfg: Any, policy: Any) -> Any:
        """trainer.compile=step (precision/compiled_step.py), or its one-line refusal."""
        from mpt_repro.precision.compiled_step import CompiledStep, refusal

        if (why := refusal(cfg, policy)) is not None:
            raise ConfigError(why)
        smoothing = float(cfg.model.get("label_smoothing", 0.0))
        aux = cfg.model.get("aux_weight", 0.0)  # plain numbers: nothing to look up in the graph
        aux = float(aux) if isinstance(aux, (int, float)) else [float(a) for a in aux]

        def criterion(out: Any, y: torch.Tensor) -> torch.Tensor:
            return classification_loss(out, y, label_smoothing=smoothing, aux_weights=aux)

        clip = cfg.optim.grad_clip
        return CompiledStep(
            self.optimizer,
            policy,
            self.train_model,
            criterion,
            None if clip is None else float(clip),
            mode=str(cfg.trainer.compile_mode),
        )

    def train_step(self, batch: Any) -> StepResult:
        """One iteration: the shared eager step (tasks/loops.py), or with trainer.compile=step
        the compiled one, which returns the same StepResult."""
        if self._compiled_step is None:
            return super().train_step(batch)
        (micro,) = self.split(batch)
        self.train_model.train()
        x, y = self._to_device(*micro)
        if not self._classes_checked:
            self._check_classes(x)
        loss, stepped = self._compiled_step(x, y)
        return StepResult(loss, stepped, samples=y.shape[0])

    def _check_classes(self, x: torch.Tensor) -> None:
        """The first batch's class check before the first compiled step (a model built for
        other inputs or classes is refused in one line, not from inside a trace): one forward
        in eval mode, which moves no BatchNorm statistics and draws no random numbers (the
        shared evaluation forward, tasks/loops.py: no task enters autocast itself)."""
        try:
            out = self._first_forward(x, lambda x: self.predict(self.train_model, x))
            self.data.check_logits(_logits(out))
        finally:
            self.train_model.train()
        self._classes_checked = True

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.policy.cast_inputs(x), y.to(self.device, non_blocking=True)

    def loss(self, batch: Any) -> Loss:
        x, y = self._to_device(*batch)
        out = self.train_model(x) if self._classes_checked else self._first_forward(x)
        return Loss(self.criterion(out, y), samples=y.shape[0])

    def _first_forward(self, x: torch.Tensor, forward: Any = None) -> Any:
        """The first forward (the training model's, or ``forward``'s). A model=custom factory
        built for other inputs (3 channels, where the digits have 1) fails deep inside torch;
        say what the data gives and how to fit it."""
        try:
            return (forward or self.train_model)(x)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:
            if not is_custom_model(self.cfg.model):
                raise  # our own networks: a bug, with its traceback
            c, *size = x.shape[1:]
            raise DataError(
                f"model.target={self.cfg.model.target} cannot take this data's images "
                f"({c} channel{'s' if c != 1 else ''}, {'x'.join(map(str, size))}, from "
                f"{self.data.description}): {str(e).strip().splitlines()[0]}. Build the model "
                f"for these images through model.kwargs (e.g. +model.kwargs.in_channels={c} if "
                "your factory takes it), or choose data the model is made for"
            ) from e

    def criterion(self, out: Any, y: torch.Tensor) -> torch.Tensor:
        """The training loss of the model's output (FP32 under autocast)."""
        if not self._classes_checked:  # a model built for another class count: say so at once
            self.data.check_logits(out if torch.is_tensor(out) else out[0])
            self._classes_checked = True
        # the auxiliary heads in training mode (GoogLeNet, BN-Inception, Inception v3) weighted by
        # model.aux_weight; label smoothing per model.label_smoothing (Inception v3: 0.1)
        return classification_loss(
            out,
            y,
            label_smoothing=self.cfg.model.get("label_smoothing", 0.0),  # a Classifier schema's
            aux_weights=self.cfg.model.get("aux_weight", 0.0),  # only models with aux heads
        )

    def recalibration_inputs(self, batches: int) -> Iterator[torch.Tensor]:
        # the first training examples in a fixed order (each rank its own shard), so the
        # statistics do not depend on where in an epoch the evaluation falls
        d, rank, world = self.cfg.data, distributed.rank(), distributed.world_size()
        shard = Subset(self.data.train, range(rank, len(self.data.train), world))
        loader = DataLoader(shard, batch_size=self.micro_batch, num_workers=d.num_workers)
        return (self._to_device(*batch)[0] for batch in itertools.islice(loader, batches))

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Per image: its loss, whether the first guess (top1) and any of the first five (top5)
        were right, and its label (which tells two runs' evaluation sets apart)."""
        x, y = self._to_device(*batch)
        logits = self.model(x).float()
        hits = logits.topk(min(5, self.data.num_classes), dim=1).indices.eq(y[:, None])
        return {
            "loss": F.cross_entropy(logits, y, reduction="none"),
            "top1": hits[:, 0],
            "top5": hits.any(dim=1),
            "items": torch.ones_like(y),
            "label": y,
        }
