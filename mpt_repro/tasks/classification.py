"""Image classification (the paper's ILSVRC experiments and the digits demo): top-1 and top-5."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

from mpt_repro import distributed
from mpt_repro.data import build_image_data, describe_sizes, load_skip_state, skip_state
from mpt_repro.data.sampling import build_epoch_loaders
from mpt_repro.errors import ConfigError
from mpt_repro.models import build_model
from mpt_repro.models.losses import classification_loss
from mpt_repro.optim import optimizer_factory
from mpt_repro.precision.config import enum_name
from mpt_repro.tasks.base import (
    SampledTask,
    StepResult,
    micro_batches,
    recalibrate_bn,
    register_task,
)


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


@register_task("classification")
class Classification(SampledTask):
    primary_metric = "top1"
    higher_is_better = True
    metric_names = ["loss", "top1", "top5"]

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d = cfg.data
        batch, global_batch = distributed.batch_sizes(
            cfg
        )  # this process's and all processes' batch
        self.data = build_image_data(d)
        self.micro_batch = batch
        # Seed right before building the model: every precision preset starts from the same weights.
        torch.manual_seed(cfg.seed)
        model = build_model(
            cfg.model,
            num_classes=self.data.num_classes,
            channels=self.data.channels,
            image_size=d.image_size,
        )
        model = distributed.maybe_sync_bn(model, cfg.distributed, device)
        self.channels_last = cfg.model.channels_last and device.type == "cuda"
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = policy.prepare_model(model.to(device))
        self.optimizer = policy.build_optimizer(
            self.model, optimizer_factory(cfg.optim, global_batch), name="model"
        )
        # Under DDP the forward/backward goes through the wrapper (gradient averaging); the bare
        # model is what the optimizer, the checkpoints and evaluation see.
        self.train_model = distributed.wrap_model(self.model, cfg.distributed)
        if cfg.trainer.compile:
            self.train_model = compiled(self.train_model, cfg)
        self.models, self.optimizers = {"model": self.model}, {"model": self.optimizer}
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
        self._classes_checked = False
        self.sampler, self.train_loader, self.eval_loader = (
            loaders.sampler,
            loaders.train,
            loaders.eval,
        )

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.policy.cast_inputs(x), y.to(self.device, non_blocking=True)

    def train_step(self, batches: list[Any]) -> StepResult:
        self.train_model.train()
        self.optimizer.zero_grad()
        total, samples = 0.0, 0
        for batch in micro_batches(batches, self.train_model):
            x, y = self._to_device(*batch)
            with self.policy.autocast():
                loss = self._loss(self.train_model(x), y) / len(batches)
            self.optimizer.backward(loss)
            total, samples = total + loss.detach().float(), samples + y.shape[0]
        stepped = self.optimizer.step(clip_grad_norm=self.cfg.optim.grad_clip)
        return StepResult(loss=total, stepped=stepped, samples=samples)

    def _loss(self, out: Any, y: torch.Tensor) -> torch.Tensor:
        if not self._classes_checked:  # a model built for another class count: say so at once
            self.data.check_logits(out if torch.is_tensor(out) else out[0])
            self._classes_checked = True
        # the auxiliary heads in training mode (GoogLeNet, BN-Inception, Inception v3) weighted by
        # model.aux_weight; label smoothing per optim.label_smoothing (Inception v3: 0.1)
        return classification_loss(
            out,
            y,
            label_smoothing=self.cfg.optim.label_smoothing,
            aux_weights=self.cfg.model.get("aux_weight", 0.0),  # only models with aux heads
        )

    def recalibrate_bn(self, batches: int) -> None:
        # the first training examples in a fixed order (each rank its own shard), so the
        # statistics do not depend on where in an epoch the evaluation falls
        d, rank, world = self.cfg.data, distributed.rank(), distributed.world_size()
        shard = Subset(self.data.train, range(rank, len(self.data.train), world))
        loader = DataLoader(shard, batch_size=self.micro_batch, num_workers=d.num_workers)

        def inputs() -> Iterator[torch.Tensor]:
            for batch in itertools.islice(loader, batches):
                x, _ = self._to_device(*batch)
                with self.policy.autocast():
                    yield x

        recalibrate_bn(self.model, inputs())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        distributed.sync_buffers(self.model)  # every rank evaluates rank 0's BN statistics
        self.model.eval()
        total, loss_sum = 0, torch.zeros((), device=self.device)
        correct = torch.zeros(2, device=self.device)  # top-1, top-5
        k = min(5, self.data.num_classes)
        for batch in self.eval_loader:
            x, y = self._to_device(*batch)
            with self.policy.autocast():
                logits = self.model(x)
            logits = logits.float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum")
            hits = logits.topk(k, dim=1).indices.eq(y[:, None])
            correct += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()]).float()
            total += y.shape[0]
        s = distributed.reduce_sums(
            {
                "loss": float(loss_sum),
                "top1": float(correct[0]),
                "top5": float(correct[1]),
                "total": total,
            },
            self.device,
        )
        n = max(s["total"], 1)
        return {"loss": s["loss"] / n, "top1": 100.0 * s["top1"] / n, "top5": 100.0 * s["top5"] / n}

    def state_dict(self) -> dict:
        return skip_state({"train": self.data.train, "eval": self.data.eval})

    def load_state_dict(self, state: dict) -> None:
        load_skip_state({"train": self.data.train, "eval": self.data.eval}, state)

    def describe_data(self) -> dict:
        return {
            "name": self.cfg.data.name,
            "root": self.cfg.data.root,
            # the images used: with data.on_corrupt=skip, less the skipped files, counted
            **describe_sizes(
                self.data.train, self.data.eval, self.cfg.data.get("on_corrupt", "fail")
            ),
            "description": self.data.description,
        }
