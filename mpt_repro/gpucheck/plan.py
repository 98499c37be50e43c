"""The steps of the GPU check, as command lines: the same plan on a GPU and, at tiny sizes with
trainer.device=cpu, in the CPU rehearsal (make gpu-check-rehearsal)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

PRESETS = "[fp32,tf32,amp,mixed,bf16]"
# The bench on an H100 within its share of the budget: 5 presets x 3 repeats in fresh processes
# (a median of 3), fewer steps than mpt-bench's defaults (each worker's start-up, CUDA and cuDNN
# autotuning cost more than its timed steps); bench.budget_s drops the last round if it runs late
BENCH_GPU = [
    "experiment=resnet50",
    "data=synthetic",
    "data.batch_size={batch}",
    f"bench.presets={PRESETS}",
    "bench.repeats=3",
    "bench.warmup=5",
    "bench.steps=20",
    "bench.overhead_steps=10",
    "bench.overhead_windows=1",
]
# The rehearsal's bench: the same steps at 32 px, 4 images (the half-batch step's batch norm
# needs 2), one timed step, over the two presets the targets compare, mixed first (on a loaded
# CPU the budget may leave no time for the second), without the trainer windows (a worker still
# takes 20 to 40 s here)
BENCH_CPU = [
    "experiment=resnet50",
    "data=synthetic",
    "budget=smoke",
    "data.image_size=32",
    "data.batch_size=4",
    "bench.presets=[mixed,fp32]",
    "bench.repeats=1",
    "bench.warmup=1",
    "bench.steps=1",
    "bench.overhead_steps=0",
]
# The rehearsal's folder sweep: detection on random data, instead of all ten (7 minutes on a
# 2-core CPU); the bench runs classification on random data, the embedded sweep the digits, the
# text corpus, the Bible translation corpus and the GAN
REHEARSAL_FOLDER = ("ssd",)
# Each step's own limit, seconds: with the probe's ~20 s they make the default budget (cli.py);
# a step that ends early leaves its time to the next; a slow probe's time comes out of the bench's
LIMITS_GPU = {"bench": 270, "smoke-folder": 110, "smoke-embedded": 40, "ddp-nccl": 60, "report": 30}
LIMITS_CPU = {"bench": 110, "smoke-folder": 60, "smoke-embedded": 70, "ddp-nccl": 0, "report": 20}
STEPS = tuple(LIMITS_GPU)


@dataclasses.dataclass(frozen=True)
class Settings:
    python: str
    work: Path
    rehearsal: bool = False
    batch: int = 256
    only: tuple[str, ...] = STEPS  # the steps to run (the others are listed as not asked for)

    @property
    def device(self) -> str:
        return "cpu" if self.rehearsal else "cuda"


@dataclasses.dataclass
class Step:
    name: str
    argv: list[str]  # "{budget}" in it: the step's own limit less a margin (mpt-bench's budget)
    limit_s: int
    skip: str | None = None  # why it does not run


def plan(s: Settings, gpus: int) -> list[Step]:
    """bench, the two smoke sweeps (experiments whose data set is a folder run on random data of
    its shape; the others on their embedded stand-ins), DDP over NCCL with 2 GPUs, the report."""
    limits = LIMITS_CPU if s.rehearsal else LIMITS_GPU
    runs = s.work / "runs"
    mod = [s.python, "-m"]
    sized = [a.replace("{batch}", str(s.batch)) for a in BENCH_GPU]
    bench = (BENCH_CPU if s.rehearsal else sized) + [
        f"trainer.device={s.device}",
        f"bench.out_dir={s.work / 'bench'}",
        "bench.budget_s={budget}",
    ]
    folder, embedded = experiments(s)
    smoke = ["budget=smoke", "precision=mixed", f"trainer.device={s.device}"]
    smoke += ["trainer.progress=false", f"paths.runs_dir={runs}"]
    steps = [
        Step("bench", [*mod, "mpt_repro.bench.cli", *bench], limits["bench"]),
        Step(
            "smoke-folder",
            [
                *mod,
                "mpt_repro.cli",
                "-m",
                "experiment=" + ",".join(folder),
                "data=synthetic",
                *smoke,
            ],
            limits["smoke-folder"],
        ),
        Step(
            "smoke-embedded",
            [*mod, "mpt_repro.cli", "-m", "experiment=" + ",".join(embedded), *smoke],
            limits["smoke-embedded"],
        ),
        Step("ddp-nccl", [*mod, *_ddp(s, runs)], limits["ddp-nccl"], _why_no_ddp(s, gpus)),
        Step(
            "report",
            [*mod, "mpt_repro.report.cli", str(runs), "--out", str(s.work / "report")]
            + ["--no-plots", "--quiet"],
            limits["report"],
        ),
    ]
    for step in steps:
        if step.name not in s.only and step.skip is None:
            step.skip = "not asked for (STEPS)"
    return steps


def _ddp(s: Settings, runs: Path) -> list[str]:
    # seed=1: its own run folder (the smoke sweep's resnet50 mixed run is seed 0)
    return [
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "mpt_repro.cli",
        "experiment=resnet50",
        "budget=smoke",
        "data=synthetic",
        "precision=mixed",
        "seed=1",
        "distributed.backend=nccl",
        "trainer.device=cuda",
        "trainer.progress=false",
        f"paths.runs_dir={runs}",
    ]


def _why_no_ddp(s: Settings, gpus: int) -> str | None:
    if s.rehearsal:
        return "the rehearsal has no GPU (NCCL puts one process on each GPU)"
    if gpus < 2:
        return f"{gpus} GPU (NCCL puts one process on each; it needs 2)"
    return None


def split_experiments() -> tuple[list[str], list[str]]:
    """(experiments whose data set is a folder, the others), from conf/ (mpt_repro.catalog)."""
    from mpt_repro import catalog

    folder, embedded = [], []
    for e in catalog.experiments():
        root = catalog.data_root(e, "smoke")  # (variable, has an embedded stand-in) or None
        (folder if root is not None and not root[1] else embedded).append(e)
    return folder, embedded


def experiments(s: Settings) -> tuple[list[str], list[str]]:
    """The experiments of the two smoke sweeps (folder data set, embedded data)."""
    folder, embedded = split_experiments()
    if s.rehearsal:
        folder = [e for e in folder if e in REHEARSAL_FOLDER]
    return folder, embedded
