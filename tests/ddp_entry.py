"""`mpt-run` with one extra, test-only model: a BatchNorm-free MLP for the digits.

Launched by tests/test_distributed*.py as `python ddp_entry.py ...` or
`torchrun --nproc_per_node=2 ddp_entry.py ...`. Without BatchNorm (whose training statistics are
per process under DDP unless SyncBatchNorm, which PyTorch runs on CUDA only), N processes with
batch B/N must compute what one process with batch B computes, up to float rounding.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mpt_repro.cli import main
from mpt_repro.models import register_model


@register_model("test_mlp")
def mlp(cfg: Any, num_classes: int, channels: int, image_size: int, **_: Any) -> nn.Module:
    inputs = channels * image_size * image_size
    return nn.Sequential(
        nn.Flatten(), nn.Linear(inputs, cfg.width), nn.ReLU(), nn.Linear(cfg.width, num_classes)
    )


if __name__ == "__main__":
    main()
