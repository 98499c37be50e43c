"""Overhead of adaptive layer-wise loss scaling against `mixed`, in one run.

    .venv/bin/python scripts/bench_adaptive.py [--steps 40] [--device cpu]

Trains the demo model (digits_cnn) and the scaling_matters model (small_grad_mlp) on the digits
for --steps steps under each preset, after a few warm-up steps, and prints steps/s and the ratio.
The presets alternate in rounds so that a load change on a shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import time

import torch
from omegaconf import OmegaConf
from sklearn.datasets import load_digits
from torch import nn

from mpt_repro.models import build_model
from mpt_repro.precision import PrecisionConfig, PrecisionPolicy
from mpt_repro.precision.config import Dtype, LossScaling, WeightStorage

MODELS = {
    "demo (digits_cnn, width 32)": dict(name="digits_cnn", width=32, dropout=0.0),
    "scaling_matters (small_grad_mlp)": dict(
        name="small_grad_mlp", width=16, num_layers=4, variant="log2k=-6"
    ),
}


def setup(model_cfg: dict, scaling: LossScaling, device: str):
    pol = PrecisionPolicy(
        PrecisionConfig(
            name=scaling.name,
            compute_dtype=Dtype.float16,
            weights=WeightStorage.low_precision,
            master_weights=True,
            loss_scaling=scaling,
        ),
        device,
    )
    torch.manual_seed(0)
    model = pol.prepare_model(
        build_model(OmegaConf.create(model_cfg), num_classes=10, channels=1, image_size=8)
    )
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))
    return pol, model, opt


def run(pol, model, opt, x, y, steps: int) -> float:
    tic = time.perf_counter()
    for _i in range(steps):
        opt.zero_grad(set_to_none=True)
        with pol.autocast():
            loss = nn.functional.cross_entropy(model(pol.cast_inputs(x)), y)
        pol.backward(loss, opt)
        pol.step(opt)
    if x.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - tic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = load_digits()
    x = (torch.tensor(d.images[: a.batch], dtype=torch.float32).unsqueeze(1) / 16.0).to(a.device)
    y = torch.tensor(d.target[: a.batch]).to(a.device)
    print(
        f"device {a.device}, batch {a.batch}, {a.steps} steps x {a.rounds} rounds per preset, "
        f"{a.threads} thread(s)"
    )
    print("| model | mixed steps/s | adaptive steps/s | adaptive / mixed |")
    print("| --- | --- | --- | --- |")
    for label, cfg in MODELS.items():
        runs = {k: setup(cfg, k, a.device) for k in (LossScaling.dynamic, LossScaling.adaptive)}
        for r in runs.values():
            run(*r, x, y, 3)  # warm-up (and adaptive's first statistics)
        total = {k: 0.0 for k in runs}
        for _ in range(a.rounds):
            for k, r in runs.items():
                total[k] += run(*r, x, y, a.steps)
        rate = {k: a.steps * a.rounds / t for k, t in total.items()}
        m, ad = rate[LossScaling.dynamic], rate[LossScaling.adaptive]
        print(f"| {label} | {m:.1f} | {ad:.1f} | {ad / m:.2f} |")


if __name__ == "__main__":
    main()
