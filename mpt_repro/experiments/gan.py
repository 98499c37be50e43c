"""The DCGAN (the paper's §4.6) and folders of unlabelled images (CelebA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mpt_repro.registry import TaskReport, metric, option_schema, task
from mpt_repro.schema import LOADER, ImageData, ModelSchema, require

task("gan", "mpt_repro.tasks.gan:GAN", TaskReport("GAN: what ran, final losses", "gan"))
# what its metrics are (mpt_repro/tasks/gan.py): the two losses, and the discriminator's mean
# probability that a real / a generated image is real (neither way is better)
metric("g_loss", higher_is_better=False)
metric("d_loss", higher_is_better=False)
metric("d_real")
metric("d_fake")

NOISES = ("uniform", "normal")


@option_schema("model", "dcgan")
@dataclass
class DCGAN(ModelSchema):
    latent_dim: int = 100
    gen_features: int = 64
    disc_features: int = 64
    noise: str = "uniform"  # uniform U(-1, 1) (Radford et al.) | normal N(0, 1) (pytorch/examples)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        require(m.noise in NOISES, "model.noise", m.noise, f"must be one of {NOISES}")
        for key in ("latent_dim", "gen_features", "disc_features"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")


@option_schema("data", "images")
@dataclass
class Images(ImageData):
    """A folder of images without labels worth reading (CelebA for the DCGAN)."""

    reads: ClassVar = ("root", *LOADER, "channels", "image_size")
    needs_root: ClassVar = True
