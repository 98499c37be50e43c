"""DCGAN generator and discriminator (Radford et al. 2016) at the depth of the paper's §4.6 model.

The paper trains on 128x128 CelebA faces with a generator of 7 fractionally-strided convolutions
(6 followed by leaky ReLU, the last by tanh) and a discriminator of 6 convolutions and 2 fully
connected layers (sigmoid on the last). The layer counts are all it gives; the layout below is
our reading of them, and scales with the image size:

  generator (n_up = log2(size / 4)):
    ConvTranspose 4x4 from the 1x1 latent to 4x4        BN, leaky ReLU
    n_up x ConvTranspose 4x4 stride 2 (doubles the side) BN, leaky ReLU
    ConvTranspose 3x3 stride 1 to the image channels    tanh
  -> 128 px: 1 + 5 + 1 = 7 fractionally-strided convolutions, 6 leaky ReLU, 1 tanh.

  discriminator:
    Conv 3x3 stride 1 from the image channels           leaky ReLU (no BN on the input, as DCGAN)
    n_up x Conv 4x4 stride 2 (halves the side) to 4x4   BN, leaky ReLU
    Linear to `fc_features`                             BN, leaky ReLU
    Linear to 1 logit                                   (the sigmoid is inside BCEWithLogits)
  -> 128 px: 6 convolutions and 2 fully connected layers.

The discriminator returns logits: binary_cross_entropy on probabilities is refused under
autocast (it is unsafe in FP16), and BCE-with-logits is the same loss computed stably.
Channel widths double as the side halves, capped at 8x the base width (DCGAN's 64-px widths).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from mpt_repro.models import register_model

LEAK = 0.2  # DCGAN's leaky-ReLU slope
MAX_MULT = 8


def _levels(image_size: int) -> int:
    n_up = int(round(math.log2(image_size / 4)))
    if image_size < 8 or 4 * 2**n_up != image_size:
        raise ValueError(f"DCGAN needs a power-of-two image size >= 8 (got {image_size})")
    return n_up


def _width(base: int, n_up: int, level: int) -> int:
    """Channels at `level` (0 = 4x4, n_up = full size): base at full size, doubling per halving."""
    return base * min(MAX_MULT, 2 ** (n_up - level))


def _init_weights(m: nn.Module) -> None:
    # DCGAN initialisation: N(0, 0.02) weights, BN scale N(1, 0.02).
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
        nn.init.normal_(m.weight, 0.0, 0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.modules.batchnorm._BatchNorm):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, latent_dim: int, channels: int, image_size: int, features: int):
        super().__init__()
        n_up = _levels(image_size)
        self.latent_dim = latent_dim
        w = [_width(features, n_up, level) for level in range(n_up + 1)]
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(latent_dim, w[0], 4, 1, 0, bias=False),
            nn.BatchNorm2d(w[0]),
            nn.LeakyReLU(LEAK),
        ]
        for level in range(1, n_up + 1):
            layers += [
                nn.ConvTranspose2d(w[level - 1], w[level], 4, 2, 1, bias=False),
                nn.BatchNorm2d(w[level]),
                nn.LeakyReLU(LEAK),
            ]
        layers += [nn.ConvTranspose2d(w[n_up], channels, 3, 1, 1), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        self.apply(_init_weights)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z: (N, latent_dim) -> images (N, channels, size, size) in [-1, 1]."""
        return self.net(z.view(z.size(0), self.latent_dim, 1, 1))


class Discriminator(nn.Module):
    def __init__(self, channels: int, image_size: int, features: int, fc_features: int = 0):
        super().__init__()
        n_up = _levels(image_size)
        w = [_width(features, n_up, level) for level in range(n_up + 1)]
        layers: list[nn.Module] = [nn.Conv2d(channels, w[n_up], 3, 1, 1), nn.LeakyReLU(LEAK)]
        for level in range(n_up, 0, -1):
            layers += [
                nn.Conv2d(w[level], w[level - 1], 4, 2, 1, bias=False),
                nn.BatchNorm2d(w[level - 1]),
                nn.LeakyReLU(LEAK),
            ]
        fc = fc_features or w[0]
        layers += [
            nn.Flatten(),
            nn.Linear(w[0] * 16, fc, bias=False),
            nn.BatchNorm1d(fc),
            nn.LeakyReLU(LEAK),
            nn.Linear(fc, 1),
        ]
        self.net = nn.Sequential(*layers)
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """images -> logits (N,); sigmoid(logit) is the probability that x is real."""
        return self.net(x).squeeze(1)


NOISE = ("uniform", "normal")


def sample_noise(
    n: int, cfg: Any, device: torch.device | str, generator: torch.Generator | None = None
) -> torch.Tensor:
    """n latent vectors of cfg.latent_dim, drawn per cfg.noise:
    - "uniform": U(-1, 1), Radford et al. 2016 (their Fig. 1 and code draw z uniformly);
    - "normal": N(0, 1), as pytorch/examples dcgan/main.py.
    `generator` (on `device`) makes the draws reproducible."""
    shape = (n, cfg.latent_dim)
    if cfg.noise == "uniform":
        return torch.rand(shape, generator=generator, device=device).mul_(2.0).sub_(1.0)
    if cfg.noise == "normal":
        return torch.randn(shape, generator=generator, device=device)
    raise ValueError(f"model.noise={cfg.noise!r} must be one of {NOISE}")


@register_model("dcgan")
def dcgan(cfg: Any, channels: int, image_size: int, **_: Any) -> nn.Module:
    """Both networks in one container, so the registry can build them; the GAN task uses
    .generator and .discriminator, and draws the generator's input with sample_noise."""
    pair = nn.Module()
    pair.generator = Generator(cfg.latent_dim, channels, image_size, cfg.gen_features)
    pair.discriminator = Discriminator(channels, image_size, cfg.disc_features)
    return pair
