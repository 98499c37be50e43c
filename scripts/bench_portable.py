"""What portable mode costs: training samples/s natively and with trainer.portable=true.

    .venv/bin/python scripts/bench_portable.py            # the demo (fp32, mixed) and the LM
    .venv/bin/python scripts/bench_portable.py --repeats 3

Each case runs natively and in portable mode in turn (alternating, `--repeats` times, each run
its own mpt-run under a temporary folder), both with one thread (OMP_NUM_THREADS=1, as
make reproduce-claims runs), so the ratio is the cost of pinning the kernels to AVX2 alone. The
table gives each mode's median samples/s (run.json `samples_per_s`, training only) and the ratio
portable / native measured in this one invocation (docs/reliability.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MPT_RUN = str(Path(sys.executable).with_name("mpt-run"))
sys.path.insert(0, str(ROOT))

from mpt_repro.machine import PORTABLE_ENV  # noqa: E402

# (name, overrides): the demo as make demo runs it, and the LM as the claims run it
CASES = (
    ("demo fp32, budget=short", ["experiment=demo", "budget=short", "precision=fp32"]),
    ("demo mixed, budget=short", ["experiment=demo", "budget=short", "precision=mixed"]),
    (
        "lstm_lm fp32, claims' size (100 steps)",
        [
            "experiment=lstm_lm",
            "budget=short",
            "precision=fp32",
            "trainer.max_steps=100",
            "model.hidden_size=128",
            "model.embed_dim=64",
            "model.proj_size=64",
        ],
    ),  # fmt: skip
)


def samples_per_s(overrides: list[str], portable: bool, folder: Path) -> float:
    """One run's training samples/s."""
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    args = [MPT_RUN, *overrides, "trainer.progress=false", "seed=0", f"paths.runs_dir={folder}"]
    if portable:
        args.append("trainer.portable=true")
    subprocess.run(args, cwd=ROOT, env=env, check=True, capture_output=True)
    (record,) = folder.rglob("run.json")
    return float(json.loads(record.read_text())["samples_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs per case and mode")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-portable-") as tmp:
        for name, overrides in CASES:
            found: dict[bool, list[float]] = {False: [], True: []}
            for repeat in range(args.repeats):
                for portable in (False, True):
                    folder = Path(tmp) / f"{len(rows)}-{repeat}-{portable}"
                    found[portable].append(samples_per_s(overrides, portable, folder))
            native, pinned = statistics.median(found[False]), statistics.median(found[True])
            rows.append((name, native, pinned, pinned / native))
            print(f"{name}: native {found[False]}, portable {found[True]}", flush=True)
    print("\n| run | native samples/s | portable samples/s | portable / native |")
    print("|---|---|---|---|")
    for name, native, pinned, ratio in rows:
        print(f"| {name} | {native:,.0f} | {pinned:,.0f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
