"""Overhead of adaptive layer-wise loss scaling against `mixed`, in one run.

    .venv/bin/python scripts/bench_adaptive.py [--steps 40] [--rounds 3] [--plan-models resnet50]

Part 1, steps/s: trains the demo model (digits_cnn) and the scaling_matters model
(small_grad_mlp) on the digits under `mixed` (dynamic scaling), `adaptive`, and `adaptive` with
the plan cache off (a walk of the autograd graph every step). The presets alternate in rounds so
that a load change on a shared machine hits all alike.

Part 2, the plan's Python per step on the ImageNet networks (their smoke-budget input size: the
graph is the same at any size): the time of the plan with the cache on and off, excluding the
statistics recomputation (the same in both), and the size of the graph against the tape's.

Part 3 (``--networks``), the suite's own training step (mpt-bench's ``build_step``) of ResNet-18
(64 px, batch 32) and ResNet-50 (224 px, batch 64) on synthetic data under mixed and adaptive:
ATen ops and host reads of one step (mpt-bench's SyncCounter, two steps after three warm-up) and
samples/s over 3 interleaved rounds of 20 steps. Meant for a GPU (docs/adaptive.md "Overhead":
``--device cuda --skip-steps-per-second --plan-models --networks``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

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
# label -> (loss scaling, adaptive_plan_cache)
PRESETS = {
    "mixed": (LossScaling.dynamic, True),
    "adaptive": (LossScaling.adaptive, True),
    "adaptive, walk every step": (LossScaling.adaptive, False),
}


def policy(scaling: LossScaling, plan_cache: bool, device: str, interval: int = 1):
    cfg = PrecisionConfig(
        name=scaling.name,
        compute_dtype=Dtype.float16,
        weights=WeightStorage.low_precision,
        master_weights=True,
        loss_scaling=scaling,
        adaptive_plan_cache=plan_cache,
        adaptive_update_interval=interval,
    )
    return PrecisionPolicy(cfg, device)


def setup(model: nn.Module, pol: PrecisionPolicy):
    model = pol.prepare_model(model)
    opt = pol.build_optimizer(model, lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))
    return pol, model, opt


def train(pol, model, opt, x, y, steps: int) -> float:
    tic = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        with pol.autocast():
            out = model(pol.cast_inputs(x))
            out = out[0] if isinstance(out, tuple) else out
            loss = nn.functional.cross_entropy(out.float(), y)
        opt.backward(loss)
        opt.step()
    if x.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - tic


def steps_per_second(a, device: str) -> None:
    d = load_digits()
    x = (torch.tensor(d.images[: a.batch], dtype=torch.float32).unsqueeze(1) / 16.0).to(device)
    y = torch.tensor(d.target[: a.batch]).to(device)
    print(f"\nsteps/s: batch {a.batch}, {a.steps} steps x {a.rounds} rounds per preset")
    print("| model | " + " | ".join(f"{k} steps/s" for k in PRESETS) + " | adaptive / mixed |")
    print("| --- " * (len(PRESETS) + 2) + "|")
    for label, cfg in MODELS.items():
        runs = {}
        for k, (scaling, cache) in PRESETS.items():
            torch.manual_seed(0)
            net = build_model(OmegaConf.create(cfg), num_classes=10, channels=1, image_size=8)
            runs[k] = setup(net, policy(scaling, cache, device))
            train(*runs[k], x, y, 3)  # warm-up (and adaptive's first statistics)
        total = dict.fromkeys(runs, 0.0)
        for _ in range(a.rounds):
            for k, r in runs.items():
                total[k] += train(*r, x, y, a.steps)
        rate = {k: a.steps * a.rounds / t for k, t in total.items()}
        cells = " | ".join(f"{r:.1f}" for r in rate.values())
        print(f"| {label} | {cells} | {rate['adaptive'] / rate['mixed']:.2f} |")


def graph_size(root) -> int:
    stack, seen = [root], {id(root)}
    while stack:
        for child, _ in stack.pop().next_functions:
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
    return len(seen)


def plan_times(a, device: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import compose  # the experiments' own configs

    print(f"\nthe plan's Python per step (ms; median of {a.plan_steps} steps after 2 warm-up)")
    print("| network | graph nodes | tape entries | walk every step | from the tape | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in a.plan_models:
        cfg = compose([f"experiment={name}", "budget=smoke"])
        size = cfg.data.image_size
        x = torch.randn(2, 3, size, size, device=device)
        y = torch.tensor([1, 2], device=device)
        ms, info = {}, {}
        for cache in (False, True):
            torch.manual_seed(0)
            net = build_model(cfg.model, num_classes=10, channels=3, image_size=size)
            # statistics recomputed once (plan 2) only: the timed plans are the plan alone
            pol, model, opt = setup(net, policy(LossScaling.adaptive, cache, device, 10**6))
            scaler = opt.scaler
            spent: list[float] = []
            plan, recompute = scaler._plan, scaler._recompute

            def timed_plan(root, plan=plan, spent=spent, scaler=scaler, info=info):
                info["nodes"] = graph_size(root)
                t0 = time.perf_counter()
                plan(root)
                spent.append(time.perf_counter() - t0 - scaler.recompute_time)

            def timed_recompute(recompute=recompute, scaler=scaler):
                t0 = time.perf_counter()
                recompute()
                scaler.recompute_time = time.perf_counter() - t0

            scaler._plan, scaler._recompute = timed_plan, timed_recompute
            for _ in range(2 + a.plan_steps):
                scaler.recompute_time = 0.0
                train(pol, model, opt, x, y, 1)
            ms[cache] = 1e3 * statistics.median(spent[2:])
            info["tape"] = len(next(iter(scaler._tapes.values())).entries) if cache else "-"
        print(
            f"| {name} | {info['nodes']} | {info['tape']} | {ms[False]:.2f} | {ms[True]:.2f} | "
            f"{ms[True] / ms[False]:.2f} |"
        )


NETWORKS = {
    "ResNet-18, 64 px, batch 32": [
        "experiment=resnet50", "model=custom", "model.target=torchvision.models:resnet18",
        "data=synthetic", "data.image_size=64", "data.batch_size=32", "optim.lr=0.0001",
    ],
    "ResNet-50, 224 px, batch 64": [
        "experiment=resnet50", "data=synthetic", "data.image_size=224", "data.batch_size=64",
        "optim.lr=0.0001",
    ],
}  # fmt: skip


def network_steps(device: str, rounds: int = 3, steps: int = 20) -> None:
    """Part 3: ops, host reads and samples/s of the suite's step, mixed beside adaptive, and
    how many of adaptive's timed steps planned only after waiting for the last update's copy
    (its ``plan_waits``: on a CPU always 0)."""
    from mpt_repro.bench.config import compose
    from mpt_repro.bench.measure import SyncCounter
    from mpt_repro.bench.step import build_step

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(
        "\n| network | preset | ATen ops/step | host reads/step | samples/s (rounds) | x mixed "
        "| plans that waited |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | --- |")
    for name, over in NETWORKS.items():
        built = {
            p: build_step(compose([*over, f"trainer.device={device}"], p), dev) for p in BESIDE
        }
        counts = {}
        for p, bs in built.items():
            for _ in range(3):
                bs.step()
            with SyncCounter(dev) as c:
                bs.step()
            counts[p] = (c.dispatched, c.reads)
        rates: dict[str, list[float]] = {p: [] for p in built}
        waits_before = {p: _plan_waits(bs) for p, bs in built.items()}
        for r in range(rounds):
            for p in BESIDE if r % 2 == 0 else BESIDE[::-1]:
                sync()
                t0 = time.perf_counter()
                for _ in range(steps):
                    built[p].step()
                sync()
                rates[p].append(steps * built[p].samples / (time.perf_counter() - t0))
        base = statistics.median(rates["mixed"])
        for p in BESIDE:
            cells = ", ".join(f"{x:.0f}" for x in rates[p])
            ratio = statistics.median(rates[p]) / base
            waits = _plan_waits(built[p])
            waited = "n/a" if waits is None else f"{waits - waits_before[p]} of {rounds * steps}"
            print(
                f"| {name} | {p} | {counts[p][0]} | {counts[p][1]} | {cells} | {ratio:.2f} "
                f"| {waited} |"
            )
        del built


BESIDE = ("mixed", "adaptive")


def _plan_waits(bs) -> int | None:
    """The adaptive scaler's plans that waited for the last update's copy (None: no such
    scaler)."""
    (opt,) = bs.task.optimizers.values()
    return getattr(opt.scaler, "plan_waits", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plan-steps", type=int, default=5)
    ap.add_argument("--plan-models", nargs="*", default=["resnet50", "googlenet", "inception_v3"])
    ap.add_argument("--skip-steps-per-second", action="store_true")
    ap.add_argument("--networks", action="store_true", help="part 3: ResNet-18/50 beside mixed")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"device {a.device}, {a.threads} thread(s), torch {torch.__version__}")
    if not a.skip_steps_per_second:
        steps_per_second(a, a.device)
    if a.plan_models:
        plan_times(a, a.device)
    if a.networks:
        network_steps(a.device)


if __name__ == "__main__":
    main()
