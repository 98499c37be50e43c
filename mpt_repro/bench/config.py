"""The bench's own options (`bench.*` on the command line) and the composition of the suite's
configuration, exactly as `mpt-run` composes it. Imports neither torch nor the models: `mpt-bench
--help` and a refused option answer at once.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mpt_repro.errors import ConfigError


@dataclass
class BenchConfig:
    # presets to measure, in this order (the table's rows); ratios need fp32 and amp among them
    presets: list[str] = field(default_factory=lambda: ["fp32", "tf32", "amp", "mixed", "bf16"])
    # untimed steps first (at least one is always run): cuDNN autotuning, allocator, the loss
    # scale settling
    warmup: int = 10
    steps: int = 50  # timed steps per repeat
    repeats: int = 3  # fresh processes per preset, interleaved over the presets; median/min/max
    # steps per window of the trainer-overhead comparison (the Trainer's loop vs a bare loop doing
    # the same math, alternating windows in one process); 0: not measured
    overhead_steps: int = 20
    overhead_windows: int = 2  # windows of each kind
    instrument: bool = True  # saved-for-backward bytes, host syncs and FLOPs (two extra steps)
    # the suite's step against the bare loop of the same math, in the same process (BareLoop:
    # autocast + GradScaler for amp, bare FP32 for fp32, an apex-O2-style loop for mixed): ATen
    # ops and host reads per step of each, the Trainer's own per step, and the time ratio over
    # interleaved rounds
    baseline: bool = False
    baseline_rounds: int = 5  # interleaved rounds (suite, bare) of the time ratio
    baseline_steps: int = 10  # steps of each per round
    out_dir: str = "results/bench"  # where the JSON goes
    write: bool = True  # false: print the table only
    timeout_s: int = 3600  # one worker process (one preset, one repeat) at most this long
    # the whole bench: no worker starts that would likely end past this many seconds from the
    # start (its estimate: the longest of that preset so far, else of any), and what was
    # measured is written; for a machine lent for minutes (scripts/gpu_check.sh). 0: no limit
    budget_s: int = 0
    # processes per worker (torchrun; Gloo on the CPU): the preset's step under
    # distributed.strategy (ddp | fsdp2), and the bytes each rank holds
    nproc: int = 1


HELP = {
    "presets": "precision presets to measure (conf/precision/*.yaml); fp32 and amp anchor ratios",
    "warmup": "untimed steps before timing, at least 1 (autotuning, allocator, loss scale)",
    "steps": "timed steps per repeat",
    "repeats": "fresh processes per preset, interleaved; the table shows median [min-max]",
    "overhead_steps": "steps per window of the trainer-vs-bare-loop comparison (0: skip)",
    "overhead_windows": "alternating windows of each (trainer, bare loop)",
    "instrument": "also measure saved-for-backward bytes, host syncs and FLOPs (2 extra steps)",
    "baseline": "also run the bare loop of the same math (autocast+GradScaler, bare FP32, apex "
    "O2): ops/step, host reads/step, time ratio",
    "baseline_rounds": "interleaved rounds (suite, bare loop) of the baseline's time ratio",
    "baseline_steps": "steps of each per baseline round",
    "out_dir": "folder of the JSON result (<experiment>-<device>-<timestamp>.json)",
    "write": "false: print the table, write no file",
    "timeout_s": "limit for one worker process (one preset, one repeat), seconds",
    "budget_s": "seconds for the whole bench: start no worker that would end past it (0: none)",
    "nproc": "processes per worker under torchrun (with distributed.strategy=fsdp2: the bytes of "
    "parameters, gradients and optimizer state each rank holds)",
}

USAGE = """\
mpt-bench: training-step speed, memory and numerics cost of precision presets (mpt-repro)

usage: mpt-bench [OVERRIDE ...]

  Takes the same overrides as mpt-run (experiment=, data=, model=, optim=, data.batch_size=,
  trainer.device=, ...) plus the bench's own options below. Each preset runs in fresh processes
  on one batch resident on the device; warm-up is excluded. The table says which figures mean
  nothing on the device used (on a CPU, speed and memory are proxies only).

examples:
  mpt-bench experiment=resnet50 data=synthetic
  mpt-bench experiment=resnet50 data=synthetic data.batch_size=256 bench.presets=[fp32,amp,mixed]
  mpt-bench experiment=resnet50 data=synthetic data.batch_size=2 trainer.device=cpu \\
      bench.presets=[fp32,amp,mixed] bench.warmup=1 bench.steps=2 bench.repeats=1

bench options (bench.<name>=<value>):
{options}

the suite's config groups (pick with group=option; see also mpt-run --help):
{groups}

Columns and how to run on a GPU: docs/performance.md. Results: {out_dir}/*.json, rendered by
mpt-report.
"""


def help_text(conf_dir: str | None = None) -> str:
    defaults = BenchConfig()
    options = "\n".join(
        f"  bench.{f.name}={_show(getattr(defaults, f.name))}\n      {HELP[f.name]}"
        for f in fields(BenchConfig)
    )
    return USAGE.format(
        options=options, groups=_groups(conf_dir or config_dir()), out_dir=defaults.out_dir
    )


def _show(value: Any) -> str:
    return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def _groups(conf_dir: str) -> str:
    """The options of the groups a bench varies: the suite's and every plugin's (conf_dir: a
    folder of the caller's instead)."""
    from pathlib import Path

    from mpt_repro import catalog

    lines = []
    for group in ("experiment", "data", "model", "precision"):
        folder = Path(conf_dir) / group
        names = (
            catalog.options(group)
            if Path(conf_dir) == catalog.CONF_DIR
            else sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_"))
        )
        lines.append(
            textwrap.fill(
                ", ".join(names),
                96,
                initial_indent=f"  {group}: ",
                subsequent_indent=" " * (len(group) + 4),
            )
        )
    return "\n".join(lines)


def config_dir() -> str:
    """The folder mpt-run composes from (one place to change if the configs move)."""
    from mpt_repro import config

    return str(config.CONF_DIR)


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(suite overrides, bench.* overrides without the prefix). Refuses what the bench cannot do
    (a precision= of its own, multirun), naming the bench's way of doing it."""
    suite, bench = [], []
    for arg in argv:
        if arg in ("-m", "--multirun"):
            raise ConfigError(
                "mpt-bench runs every preset itself: no -m/--multirun; list the presets in "
                "bench.presets=[fp32,amp,mixed]"
            )
        if arg.startswith("-"):
            raise ConfigError(f"unknown option {arg!r}; mpt-bench --help lists what it takes")
        key = arg.split("=", 1)[0].lstrip("+~")
        if key.startswith("bench."):
            bench.append(arg.split("bench.", 1)[1])
        elif key == "precision" or key.startswith("precision."):
            raise ConfigError(
                f"{arg!r}: mpt-bench sets the precision per preset; list presets in "
                "bench.presets=[...] (knobs of one preset: make a preset file in conf/precision/)"
            )
        else:
            suite.append(arg)
    return suite, bench


def parse_bench(dotlist: list[str]) -> BenchConfig:
    """bench.* overrides onto the typed defaults: a typo or a wrong type is refused by name."""
    base = OmegaConf.structured(BenchConfig)
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(dotlist))
    except Exception as e:  # omegaconf's ConfigKeyError / ValidationError
        known = ", ".join(f"bench.{f.name}" for f in fields(BenchConfig))
        raise ConfigError(f"bench option refused: {_first_line(e)} (known: {known})") from None
    cfg: BenchConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    _check_bench(cfg)
    return cfg


def _check_bench(b: BenchConfig) -> None:
    if not b.presets:
        raise ConfigError("bench.presets is empty; e.g. bench.presets=[fp32,amp,mixed]")
    if len(set(b.presets)) != len(b.presets):
        raise ConfigError(f"bench.presets lists a preset twice: {b.presets}")
    for name, low in (
        ("warmup", 1),
        ("steps", 1),
        ("repeats", 1),
        ("overhead_steps", 0),
        ("baseline_rounds", 1),
        ("baseline_steps", 1),
        ("nproc", 1),
    ):
        if getattr(b, name) < low:
            raise ConfigError(f"bench.{name} must be >= {low} (got {getattr(b, name)})")
    if b.overhead_windows < 1:
        raise ConfigError(f"bench.overhead_windows must be >= 1 (got {b.overhead_windows})")
    if b.timeout_s < 1:
        raise ConfigError(f"bench.timeout_s must be >= 1 (got {b.timeout_s})")
    if b.budget_s < 0:
        raise ConfigError(f"bench.budget_s must be >= 0, 0 for no limit (got {b.budget_s})")


def compose(overrides: list[str], preset: str) -> DictConfig:
    """The configuration `mpt-run <overrides> precision=<preset>` would run, validated."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mpt_repro.cmdline import with_plugin_configs
    from mpt_repro.config import check_command_line, register_configs, validate

    register_configs()
    overrides = with_plugin_configs(list(overrides))  # an experiment plugin's config folder
    problem = check_command_line(list(overrides))  # mpt-run's refusals: typos, stray `+key=`
    if problem:
        raise ConfigError(problem)
    # a composition of its own: whatever Hydra state the caller holds (a test session's) is reset
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            cfg = hydra_compose("config", overrides=[*overrides, f"precision={preset}"])
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_hydra_message(e)) from None
    validate(cfg)
    return cfg


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _hydra_message(e: BaseException) -> str:
    """Hydra's refusal on one line, with its cause (the key and type), without its advice to
    append with `+` (which would make a typo a silently ignored key) or its search path."""
    kept = []
    for line in str(e).strip().splitlines():
        if line.startswith("Config search path"):
            break
        if line.strip() and not line.startswith("To append"):
            kept.append(line.strip())
    text = " ".join(kept).replace("Available options in", "; options in") or type(e).__name__
    if e.__cause__ is not None:
        text = f"{text.rstrip('.')}: {_first_line(e.__cause__)}"
    return text
