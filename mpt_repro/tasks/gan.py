"""DCGAN (the paper's §4.6 experiment): a generator and a discriminator trained against each other.

One iteration is a discriminator step (real images labelled 1, generated ones 0) followed by a
generator step (generated images labelled 1: the non-saturating loss of Goodfellow et al.).
Both optimizers go through the one precision policy, each with its own loss scaler when the
preset scales (precision.per_loss_scale): the two losses have different gradient ranges.

The paper judges the result by eye only (uncurated samples, its Figure 6). So does this task:
a fixed-noise sample grid is written at every evaluation. The numbers evaluate() returns describe
the state of the game, not sample quality; see docs/experiments_lm_gan.md.

Data-parallel (DDP): both networks train through DDP wrappers (gradient averaging) and each rank
takes its shard of every global batch and draws its own noise; evaluation joins the per-image
values of the ranks' shards of the held-out images. The replicas stay identical; the run is not
the one-process run with the global batch (other noise, per-process BatchNorm batch statistics).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mpt_repro import distributed
from mpt_repro.data import build_image_data
from mpt_repro.data.sampling import build_epoch_loaders
from mpt_repro.evidence import Ratio
from mpt_repro.models.dcgan import sample_noise
from mpt_repro.optim import optimizer_factory
from mpt_repro.tasks.base import Loss, Phase, SampledTask

GRID_SAMPLES = 64  # fixed-noise samples in the grid (8 x 8)
# rank r's noise seed is seed + 1 + r x this: rank 0 keeps the one-process stream
NOISE_SEED_PER_RANK = 1_000_003


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


class GAN(SampledTask):
    # The generator's loss on fixed noise against the current discriminator. Lower means G fools
    # this D more; it is NOT a measure of image quality (see the module docstring).
    primary_metric = "g_loss"
    metric_names = ["d_loss", "g_loss", "d_real", "d_fake"]
    # evaluation by items (mpt_repro/evidence.py): each held-out image with its own noise; every
    # metric is a mean over the images
    item_unit = "images"
    item_key = "index"
    formulas = {
        "d_loss": Ratio("d_loss", "items", "images"),
        "g_loss": Ratio("g_loss", "items", "images"),
        "d_real": Ratio("d_real", "items", "images"),
        "d_fake": Ratio("d_fake", "items", "images"),
    }

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d = cfg.data
        batch, global_batch = distributed.batch_sizes(cfg)  # this process's and the step's
        self.data = build_image_data(d)
        self.image_size = d.image_size
        pair = self.new_model(channels=self.data.channels, image_size=self.image_size)
        make = optimizer_factory(cfg.optim, global_batch)
        # Discriminator first: policy.loss_scale() and the first-optimizer summaries report it.
        # Under DDP the training forwards/backwards go through the wrappers (gradient averaging);
        # the bare networks are what the optimizers, checkpoints, evaluation and samples see.
        # D runs twice through its wrapper before one backward (real, then fake): its buffers are
        # broadcast by _d_loss, not by DDP at each forward (distributed.wrap_model says why)
        self.discriminator, self.opt_d, self.train_d = self.add_model(
            "discriminator", pair.discriminator, make, broadcast_buffers=False
        )
        self.generator, self.opt_g, self.train_g = self.add_model("generator", pair.generator, make)
        # the generator first, as telemetry's layer tables and checkpoints have always listed them
        self.models = {"generator": self.generator, "discriminator": self.discriminator}
        self.latent_dim = cfg.model.latent_dim
        # Noise has its own generator (saved with the task state), so a resumed run draws the same
        # z. One stream per rank: the ranks' shares of the global batch must not get the same noise.
        self.noise_rng = torch.Generator(device=device).manual_seed(
            cfg.seed + 1 + NOISE_SEED_PER_RANK * distributed.rank()
        )
        # Fixed and evaluation noise are the same on every rank (evaluation noise is per example).
        fixed = torch.Generator(device=device).manual_seed(cfg.seed + 2)
        self.fixed_noise = sample_noise(GRID_SAMPLES, cfg.model, device, generator=fixed)
        self.eval_noise = sample_noise(len(self.data.eval), cfg.model, device, generator=fixed)
        loaders = build_epoch_loaders(self.data.train, self.data.eval, d, batch, cfg.seed, device)
        self.use_loaders(loaders)
        # which evaluation noise goes with which image of this rank's slice
        self.eval_indices = torch.tensor(list(loaders.eval_shard), dtype=torch.long, device=device)
        self._fakes: list[torch.Tensor] = []  # this iteration's generated images (the D step's)

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

    def phases(self) -> list[Phase]:
        """One iteration: a D step accumulated over the micro-batches, then a G step.

        With one shared loss scale (precision.per_loss_scale=false) both losses use the scale
        the iteration began with; it moves once, after the G step (the policy's ScaleGroup)."""
        return [
            # G's forward of an accumulating micro-batch must not arm its DDP all-reduce either
            Phase("discriminator", self._d_loss, (self.train_d, self.train_g), name="d"),
            Phase("generator", self._g_loss, accumulate=False, name="g"),
        ]

    def _d_loss(self, batch: Any) -> Loss:
        """Discriminator: maximise log D(x) + log(1 - D(G(z))) on one micro-batch."""
        distributed.sync_buffers(self.discriminator)  # rank 0's statistics, as DDP would give
        real = self._real(batch)
        fake = self.train_g(self._noise(real.shape[0]))
        self._fakes.append(fake)
        d_real_logits = self.train_d(real)
        d_fake_logits = self.train_d(fake.detach())
        return Loss(
            self._bce(d_real_logits, True) + self._bce(d_fake_logits, False),
            samples=real.shape[0],
            logs={
                "d_real": torch.sigmoid(d_real_logits.detach().float()).mean(),
                "d_fake": torch.sigmoid(d_fake_logits.detach().float()).mean(),
            },
        )

    def _g_loss(self, batches: list[Any]) -> Loss:
        """Generator: maximise log D(G(z)) on the same fakes, against the updated discriminator.

        Through the bare D with its parameters frozen: only G needs gradients here. D's DDP
        wrapper would expect (and all-reduce) D gradients nobody uses, and any D gradient left
        over could leak into D's next step. One backward over all micro-batches' fakes: G's
        wrapper, armed by the last forward, averages G's whole gradient once."""
        fakes, self._fakes = self._fakes, []
        with frozen(self.discriminator):
            value = sum(self._bce(self.discriminator(f), True) for f in fakes) / len(fakes)
        return Loss(value)

    def eval_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """This rank's held-out images in loader order, each with its own noise vector and its
        index in the held-out set."""
        seen = 0
        for batch in self.eval_loader:
            real = self._real(batch)
            index = self.eval_indices[seen : seen + real.shape[0]]
            yield real, self.policy.cast_inputs(self.eval_noise[index]), index
            seen += real.shape[0]

    def eval_step(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, Any]:
        """Per held-out image, against its own noise (eval-mode BN): both losses, D's outputs on
        it and on the fake, and its index in the held-out set (the key)."""
        real, z, index = batch
        d_real_logits = self.discriminator(real).float().reshape(len(real), -1)
        d_fake_logits = self.discriminator(self.generator(z)).float().reshape(len(real), -1)
        bce = F.binary_cross_entropy_with_logits
        # each image's BCE, its mean over D's outputs (one per image for the DCGAN's D)
        real_term = bce(d_real_logits, torch.ones_like(d_real_logits), reduction="none")
        fake_term = bce(d_fake_logits, torch.zeros_like(d_fake_logits), reduction="none")
        fooled = bce(d_fake_logits, torch.ones_like(d_fake_logits), reduction="none")
        return {
            "d_loss": real_term.mean(1) + fake_term.mean(1),
            "g_loss": fooled.mean(1),
            "d_real": torch.sigmoid(d_real_logits).mean(1),
            "d_fake": torch.sigmoid(d_fake_logits).mean(1),
            "items": torch.ones(len(real), device=real.device),
            "index": index,
        }

    def sample_grid(self) -> torch.Tensor:
        """The fixed-noise samples as one image grid in [0, 1] (C, H, W), FP32 on the CPU."""
        from torchvision.utils import make_grid

        images = self.predict(self.generator, self.policy.cast_inputs(self.fixed_noise))
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
        return {"noise_rng": self.noise_rng.get_state(), **super().state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("noise_rng") is not None:
            self.noise_rng.set_state(state["noise_rng"])
        super().load_state_dict(state)

    def describe_data(self) -> dict:
        return super().describe_data(image_size=self.image_size)

    def describe_model(self) -> dict:
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        return {
            **super().describe_model(),
            "generator_parameters": count(self.generator),
            "discriminator_parameters": count(self.discriminator),
            "latent_dim": self.latent_dim,
        }
