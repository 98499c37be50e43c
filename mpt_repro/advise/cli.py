"""`mpt-advise`: which precision recipe, loss scale and layers a model needs, from one short
diagnostic run (docs/telemetry.md, "Advice before you train").

    mpt-advise RUN_DIR [RUN_DIR ...]        advice from runs that recorded telemetry=diagnostic
    mpt-advise experiment=demo model=custom model.target=mypkg.nets:make_net \\
        +model.kwargs.in_channels=1         start the diagnostic run (300 steps, FP32), then advise

Prints the advice (Markdown) and writes advice.md, advice.json (every count behind every figure)
and advice_exponent_ranges.png into RUN_DIR/advice/ (or --out DIR). Exit 2 with one line for a
folder without telemetry, a missing folder, or a command line mpt-run would refuse.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PROG = "mpt-advise"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from mpt_repro.advise.defaults import DEFAULT_KEEP, DEFAULT_STEPS

    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Advice on precision recipes, loss scale and layers from a run's gradient "
        "histograms (paper §3.2), or from a diagnostic run it starts itself.",
        epilog="examples:\n  mpt-advise results/runs/demo/fp32-paper/seed0/telemetry=diagnostic\n"
        "  mpt-advise experiment=scaling_matters budget=short\n"
        "  mpt-advise experiment=demo model=custom model.target=mypkg.nets:make_net "
        "+model.kwargs.in_channels=1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "targets",
        nargs="+",
        metavar="RUN_DIR | KEY=VALUE",
        help="run directories, or mpt-run overrides for a diagnostic run",
    )
    ap.add_argument(
        "--keep",
        type=float,
        default=DEFAULT_KEEP,
        help="fraction of nonzero gradients the underflow bound keeps above 2^-24 "
        f"(default {DEFAULT_KEEP})",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"steps of the diagnostic run (default {DEFAULT_STEPS})",
    )
    ap.add_argument(
        "--every",
        type=int,
        default=None,
        help="sample every N steps of the diagnostic run (default: steps / 20)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for advice.md, advice.json and the figure (default RUN_DIR/advice)",
    )
    ap.add_argument("--no-figures", action="store_true", help="write no figure")
    # options may come between the overrides (K=V --steps 6 K2=V), as in mpt-run's own lines
    return ap.parse_intermixed_args(argv)


def check_options(args: argparse.Namespace) -> None:
    """The options' own ranges, named as options (--steps 0 was refused as trainer.max_steps)."""
    from mpt_repro.advise.evidence import AdviceError

    for flag, value in (("--steps", args.steps), ("--every", args.every)):
        if value is not None and value < 1:
            raise AdviceError(f"{flag} must be at least 1 (got {value}), e.g. {flag} 300")


def split_targets(targets: list[str]) -> tuple[list[Path], list[str]]:
    """(run directories, overrides): an existing folder is a run directory; KEY=VALUE with a
    key that is not a path is an override; anything else is a missing folder."""
    from mpt_repro.advise.evidence import AdviceError

    dirs, overrides = [], []
    for t in targets:
        key = t.split("=", 1)[0]
        if _is_dir(Path(t)):
            dirs.append(Path(t))
        elif "=" in t and ("/" not in key or key.startswith("hydra/")):
            overrides.append(t)
        else:
            raise AdviceError(f"no such run directory: {t}")
    if dirs and overrides:
        raise AdviceError("give run directories or mpt-run overrides, not both")
    return dirs, overrides


def _is_dir(path: Path) -> bool:
    """Whether `path` is a folder; a name too long for the file system is refused naming it."""
    from mpt_repro.advise.evidence import AdviceError

    try:
        return path.is_dir()
    except OSError as e:
        raise AdviceError(
            f"{path} cannot be read ({e.strerror or e}): give a run directory"
        ) from None


def out_dir(args: argparse.Namespace, run_dir: Path, i: int, n: int) -> Path:
    if args.out is None:
        return run_dir / "advice"
    return args.out if n == 1 else args.out / f"{i + 1}"


def run(args: argparse.Namespace) -> None:
    from mpt_repro.advise.advice import build_advice, write_advice
    from mpt_repro.advise.launch import run_diagnostic

    check_options(args)
    run_dirs, overrides = split_targets(args.targets)
    if overrides:
        run_dirs = [run_diagnostic(overrides, args.steps, args.every)]
    advices = [build_advice(d, args.keep) for d in run_dirs]  # every refusal before any output
    for i, advice in enumerate(advices):
        out = out_dir(args, advice.evidence.run_dir, i, len(advices))
        files = write_advice(advice, out, figures=not args.no_figures)
        print(files[0].read_text())  # advice.md: what the console shows is what was written
        print(f"written: {', '.join(str(f) for f in files)}\n")


def main(argv: list[str] | None = None) -> int:
    from mpt_repro.advise.evidence import AdviceError

    args = parse_args(argv)
    try:
        run(args)
    except AdviceError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mpt-advise RUN_DIR | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0
