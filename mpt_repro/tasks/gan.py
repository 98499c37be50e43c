"""DCGAN (the paper's §4.6 experiment): a generator and a discriminator trained against each other.

One iteration is a discriminator step (real images labelled 1, generated ones 0) followed by a
generator step (generated images labelled 1: the non-saturating loss of Goodfellow et al.).
Both optimizers go through the one precision policy, each with its own loss scaler when the
preset scales (precision.per_loss_scale): the two losses have different gradient ranges.

The paper judges the result by eye only (uncurated samples, its Figure 6). So does this task:
a fixed-noise sample grid is written at every evaluation. The numbers evaluate() returns describe
the state of the game, not sample quality; see docs/experiments_lm_gan.md.

Data-parallel (DDP): both networks train through DDP wrappers (gradient averaging) and each rank
takes its shard of every global batch and draws its own noise; evaluation sums over the ranks'
shards of the held-out images. The replicas stay identical; the run is not the one-process run
with the global batch (other noise, per-process BatchNorm batch statistics).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mpt_repro import distributed
from mpt_repro.data import build_image_data, describe_sizes, load_skip_state, skip_state
from mpt_repro.data.sampling import build_epoch_loaders
from mpt_repro.models import build_model
from mpt_repro.models.dcgan import sample_noise
from mpt_repro.optim import optimizer_factory
from mpt_repro.tasks.base import (
    SampledTask,
    StepResult,
    micro_batches,
    register_task,
)

GRID_SAMPLES = 64  # fixed-noise samples in the grid (8 x 8)
NOISE_SEED_PER_RANK = (
    1_000_003  # rank r's noise seed is seed + 1 + r x this: rank 0 keeps the one-process stream
)


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """No gradients for `module`'s parameters inside the block (gradients still flow through it
    to its inputs); their requires_grad flags are restored after."""
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(module.parameters(), flags):
            p.requires_grad_(flag)


@register_task("gan")
class GAN(SampledTask):
    # The generator's loss on fixed noise against the current discriminator. Lower means G fools
    # this D more; it is NOT a measure of image quality (see the module docstring).
    primary_metric = "g_loss"
    higher_is_better = False
    metric_names = ["d_loss", "g_loss", "d_real", "d_fake"]

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d = cfg.data
        batch, global_batch = distributed.batch_sizes(
            cfg
        )  # this process's and all processes' batch
        self.data = build_image_data(d)
        self.image_size = d.image_size
        # Seed right before building the models: every precision preset starts from the same
        # weights.
        torch.manual_seed(cfg.seed)
        pair = build_model(cfg.model, channels=self.data.channels, image_size=self.image_size)
        self.generator = policy.prepare_model(pair.generator.to(device))
        self.discriminator = policy.prepare_model(pair.discriminator.to(device))
        make = optimizer_factory(cfg.optim, global_batch)
        # Discriminator first: policy.loss_scale() and the first-optimizer summaries report it.
        self.opt_d = policy.build_optimizer(self.discriminator, make, name="discriminator")
        self.opt_g = policy.build_optimizer(self.generator, make, name="generator")
        self.models = {"generator": self.generator, "discriminator": self.discriminator}
        self.optimizers = {"discriminator": self.opt_d, "generator": self.opt_g}
        # Under DDP the training forwards/backwards go through the wrappers (gradient averaging);
        # the bare networks are what the optimizers, checkpoints, evaluation and samples see.
        self.train_g = distributed.wrap_model(self.generator, cfg.distributed)
        self.train_d = distributed.wrap_model(self.discriminator, cfg.distributed)
        self.latent_dim = cfg.model.latent_dim
        # Noise has its own generator (saved with the task state), so a resumed run draws the same
        # z.
        # One stream per rank: the ranks' shares of the global batch must not get the same noise.
        self.noise_rng = torch.Generator(device=device).manual_seed(
            cfg.seed + 1 + NOISE_SEED_PER_RANK * distributed.rank()
        )
        # Fixed and evaluation noise are the same on every rank (evaluation noise is per example).
        fixed = torch.Generator(device=device).manual_seed(cfg.seed + 2)
        self.fixed_noise = sample_noise(GRID_SAMPLES, cfg.model, device, generator=fixed)
        self.eval_noise = sample_noise(len(self.data.eval), cfg.model, device, generator=fixed)
        loaders = build_epoch_loaders(self.data.train, self.data.eval, d, batch, cfg.seed, device)
        self.sampler, self.train_loader, self.eval_loader = (
            loaders.sampler,
            loaders.train,
            loaders.eval,
        )
        # which evaluation noise goes with which image of this rank's slice
        self.eval_indices = torch.tensor(list(loaders.eval_shard), dtype=torch.long, device=device)

    def _real(self, batch: Any) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch  # labels, if any, are ignored
        x = x.to(self.device, non_blocking=True)
        if x.shape[-1] != self.image_size:
            # The embedded 8x8 digits, up-sampled when a budget asks for a deeper stack.
            x = F.interpolate(
                x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
            )
        return self.policy.cast_inputs(x)

    def _noise(self, n: int) -> torch.Tensor:
        return self.policy.cast_inputs(
            # model.noise: uniform U(-1, 1) as Radford et al., or normal
            sample_noise(n, self.cfg.model, self.device, generator=self.noise_rng)
        )

    @staticmethod
    def _bce(logits: torch.Tensor, real: bool) -> torch.Tensor:
        # BCE on logits: the sigmoid of the paper's last layer and the log fused, stable in FP16.
        target = torch.ones_like(logits) if real else torch.zeros_like(logits)
        return F.binary_cross_entropy_with_logits(logits.float(), target.float())

    def _zero_grads(self) -> None:
        # Both networks' grads (and their FP32 masters'), so that each step sees only its own
        # loss's gradients.
        self.opt_g.zero_grad()
        self.opt_d.zero_grad()

    def train_step(self, batches: list[Any]) -> StepResult:
        """One iteration over trainer.accumulate micro-batches: a D step, then a G step."""
        G, D = self.train_g, self.train_d  # the DDP wrappers (the networks themselves alone)
        G.train()
        D.train()
        n = len(batches)

        # Discriminator: maximise log D(x) + log(1 - D(G(z))), accumulated over micro-batches.
        self._zero_grads()
        fakes, d_loss, d_real, d_fake, samples = [], 0.0, 0.0, 0.0, 0
        for i, batch in enumerate(micro_batches(batches, D)):
            real = self._real(batch)
            # G's forward of an accumulating micro-batch must not arm its DDP all-reduce either
            last = i == n - 1
            with contextlib.nullcontext() if last else distributed.no_sync(G):
                with self.policy.autocast():
                    fake = G(self._noise(real.shape[0]))
            with self.policy.autocast():
                d_real_logits = D(real)
                d_fake_logits = D(fake.detach())
                loss = (self._bce(d_real_logits, True) + self._bce(d_fake_logits, False)) / n
            self.opt_d.backward(loss)
            fakes.append(fake)
            d_loss = d_loss + loss.detach()
            d_real = d_real + torch.sigmoid(d_real_logits.detach().float()).mean() / n
            d_fake = d_fake + torch.sigmoid(d_fake_logits.detach().float()).mean() / n
            samples += real.shape[0]
        d_stepped = self.opt_d.step(clip_grad_norm=self.cfg.optim.grad_clip)

        # Generator: maximise log D(G(z)) on the same fakes, against the updated discriminator.
        # Through the bare D with its parameters frozen: only G needs gradients here. D's DDP
        # wrapper would expect (and all-reduce) D gradients nobody uses, and any D gradient
        # left over could leak into D's next step. One backward over all micro-batches' fakes:
        # G's wrapper, armed by the last forward, averages G's whole gradient once.
        self._zero_grads()
        with frozen(self.discriminator), self.policy.autocast():
            g_loss = sum(self._bce(self.discriminator(f), True) for f in fakes) / n
        self.opt_g.backward(g_loss)
        g_stepped = self.opt_g.step(clip_grad_norm=self.cfg.optim.grad_clip)

        logs = {
            "d_loss": d_loss,
            "g_loss": g_loss.detach(),
            "d_real": d_real,
            "d_fake": d_fake,
            "d_stepped": d_stepped.float(),
            "g_stepped": g_stepped.float(),
        }
        # loss: the sum of both, so a non-finite value in either one ends the run as diverged.
        return StepResult(
            loss=(d_loss + g_loss).detach(),
            stepped=d_stepped & g_stepped,
            samples=samples,
            logs=logs,
            stepped_by={"discriminator": d_stepped, "generator": g_stepped},
        )

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Both losses and the mean D outputs on the held-out images against fixed noise (eval-mode
        BN).
        """
        G, D = self.generator, self.discriminator
        for model in (G, D):
            distributed.sync_buffers(model)  # every rank evaluates rank 0's BN statistics
        G.eval()
        D.eval()
        sums = torch.zeros(4, device=self.device)
        seen = 0
        for batch in self.eval_loader:
            real = self._real(batch)
            n = real.shape[0]
            # this rank's images in loader order, each with its own noise vector
            z = self.policy.cast_inputs(self.eval_noise[self.eval_indices[seen : seen + n]])
            with self.policy.autocast():
                d_real_logits = D(real)
                d_fake_logits = D(G(z))
                d_loss = self._bce(d_real_logits, True) + self._bce(d_fake_logits, False)
                g_loss = self._bce(d_fake_logits, True)
            sums += n * torch.stack(
                [
                    d_loss,
                    g_loss,
                    torch.sigmoid(d_real_logits.float()).mean(),
                    torch.sigmoid(d_fake_logits.float()).mean(),
                ]
            )
            seen += n
        names = ("d_loss", "g_loss", "d_real", "d_fake")
        s = distributed.reduce_sums({**dict(zip(names, sums.tolist())), "n": seen}, self.device)
        d_loss, g_loss, d_real, d_fake = (s[k] / max(s["n"], 1) for k in names)
        return {"d_loss": d_loss, "g_loss": g_loss, "d_real": d_real, "d_fake": d_fake}

    @torch.no_grad()
    def sample_grid(self) -> torch.Tensor:
        """The fixed-noise samples as one image grid in [0, 1] (C, H, W), FP32 on the CPU."""
        from torchvision.utils import make_grid

        self.generator.eval()
        with self.policy.autocast():
            images = self.generator(self.policy.cast_inputs(self.fixed_noise))
        return make_grid(images.float().cpu(), nrow=8, normalize=True, value_range=(-1, 1))

    def log_media(self, writer: Any, step: int) -> None:
        """The fixed-noise grid to TensorBoard and to <run dir>/samples/step_XXXXXX.png."""
        if writer is None:
            return
        from torchvision.utils import save_image

        grid = self.sample_grid()
        writer.add_image("samples/fixed_noise", grid, step)
        # The trainer's SummaryWriter writes into the run directory itself.
        out = Path(writer.log_dir) / "samples"
        out.mkdir(parents=True, exist_ok=True)
        save_image(grid, out / f"step_{step:06d}.png")

    def state_dict(self) -> dict:
        splits = {"train": self.data.train, "eval": self.data.eval}
        return {"noise_rng": self.noise_rng.get_state(), **skip_state(splits)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("noise_rng") is not None:
            self.noise_rng.set_state(state["noise_rng"])
        load_skip_state({"train": self.data.train, "eval": self.data.eval}, state)

    def describe_data(self) -> dict:
        return {
            "name": self.cfg.data.name,
            "root": self.cfg.data.root,
            **describe_sizes(
                self.data.train, self.data.eval, self.cfg.data.get("on_corrupt", "fail")
            ),
            "image_size": self.image_size,
            "description": self.data.description,
        }

    def describe_model(self) -> dict:
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        return {
            **super().describe_model(),
            "generator_parameters": count(self.generator),
            "discriminator_parameters": count(self.discriminator),
            "latent_dim": self.latent_dim,
        }
