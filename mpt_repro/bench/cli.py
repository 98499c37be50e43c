"""`mpt-bench`: compose once per preset (refusing bad overrides before anything runs), run every
(repeat, preset) in a fresh worker process, interleaved, then print the table and write the JSON.

    mpt-bench experiment=resnet50 data=synthetic bench.presets=[fp32,amp,mixed]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mpt_repro.bench.config import BenchConfig, compose, help_text, parse_bench, split_args
from mpt_repro.errors import UserError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(help_text())
        return 0
    try:
        overrides, bench_args = split_args(argv)
        bench = parse_bench(bench_args)
        # every preset composes and validates here, before any process starts
        configs = {p: compose(overrides, p) for p in bench.presets}
    except UserError as e:
        print(f"mpt-bench: error: {e}", file=sys.stderr)
        return 2
    measured, failed = run_workers(overrides, bench)
    if measured is None:
        return 2
    doc = document(argv, overrides, bench, configs, measured)
    from mpt_repro.bench.results import describe_run, format_baseline, format_table

    print()
    print(format_table(doc))
    if (against := format_baseline(doc)) is not None:
        print()
        print("against the bare loop (bench.baseline=true):")
        print(against)
    from mpt_repro.bench.results import format_state

    if (held := format_state(doc)) is not None:
        print()
        print(held)
    print()
    print(describe_run(doc))
    if bench.write and doc["results"]:
        path = write(doc, bench.out_dir)
        print(f"written: {path}")
    return 1 if failed else 0


def run_workers(overrides: list[str], bench: BenchConfig) -> tuple[dict | None, bool]:
    """{preset: [measurement per repeat]}; repeats interleave the presets, each round starting
    one preset later, so neither order nor drift favours one. None when a worker refused the
    configuration (the same refusal would hit every preset). With bench.budget_s, the workers
    that would end past it are not started (round 0, which measures every preset once, first)."""
    measured: dict[str, list[dict]] = {p: [] for p in bench.presets}
    failed = False
    clock = _Budget(bench.budget_s)
    with tempfile.TemporaryDirectory(prefix="mpt-bench-") as tmp:
        for repeat, preset in _rounds(bench):
            limit = clock.limit(preset, bench.timeout_s)
            if limit is None:
                _say_budget_reached(bench, measured)
                break
            out = Path(tmp) / f"{preset}-{repeat}.json"
            spec = Path(tmp) / f"{preset}-{repeat}.spec.json"
            spec.write_text(
                json.dumps(
                    {
                        "overrides": overrides,
                        "preset": preset,
                        "repeat": repeat,
                        "bench": asdict(bench),
                        "out": str(out),
                    }
                )
            )
            code, error = _run_one(spec, limit)
            clock.took(preset)
            if code == 2:
                return None, True
            if code == 0 and out.exists():
                measured[preset].append(json.loads(out.read_text()))
                continue
            failed = True
            if out.exists():  # the worker said why (out of memory)
                error = json.loads(out.read_text()).get("error", error)
            measured[preset].append({"repeat": repeat, "error": error})
            print(f"mpt-bench: {preset} (repeat {repeat + 1}): {error}", file=sys.stderr)
    return measured, failed


def _rounds(bench: BenchConfig) -> list[tuple[int, str]]:
    """(repeat, preset) in running order: round r runs every preset, starting one later."""
    n = len(bench.presets)
    return [(r, bench.presets[(k + r) % n]) for r in range(bench.repeats) for k in range(n)]


class _Budget:
    """The bench's clock against bench.budget_s (0: none): how long the next worker may run."""

    def __init__(self, budget_s: int):
        self.budget_s, self.start = budget_s, time.monotonic()
        self.took_s: dict[str, float] = {}  # the longest worker of each preset so far
        self._began = self.start

    def limit(self, preset: str, timeout_s: int) -> int | None:
        """Seconds for the next worker of `preset`, or None when it would likely end past the
        budget (estimated by the longest worker of that preset, else of any, so far)."""
        self._began = time.monotonic()
        if not self.budget_s:
            return timeout_s
        left = self.budget_s - (self._began - self.start)
        estimate = self.took_s.get(preset, max(self.took_s.values(), default=0.0))
        if left < 1 or estimate > left:
            return None
        return max(1, min(timeout_s, int(left)))

    def took(self, preset: str) -> None:
        seconds = time.monotonic() - self._began
        self.took_s[preset] = max(seconds, self.took_s.get(preset, 0.0))


def _say_budget_reached(bench: BenchConfig, measured: dict[str, list[dict]]) -> None:
    done = sum(len(runs) for runs in measured.values())
    print(
        f"mpt-bench: bench.budget_s={bench.budget_s} reached: {done} of "
        f"{bench.repeats * len(bench.presets)} workers run; the figures are those measured",
        file=sys.stderr,
    )
    for runs in measured.values():
        if not runs:  # its row says why it has no figures
            runs.append({"repeat": 0, "error": f"not measured: bench.budget_s={bench.budget_s}"})


def _run_one(spec: Path, timeout_s: int) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "mpt_repro.bench.worker", str(spec)]
    nproc = json.loads(spec.read_text())["bench"]["nproc"]
    if nproc > 1:  # bench.nproc: the worker's processes under torchrun, one step over all
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd = [sys.executable, *launch, "-m", "mpt_repro.bench.worker", str(spec)]
    try:
        # stderr passes through: the worker's progress lines and, on a crash, its traceback
        code = subprocess.run(cmd, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return 124, f"took longer than {timeout_s} s (bench.timeout_s, or what bench.budget_s left)"
    return code, f"the worker process failed (exit status {code}; its messages are above)"


def document(
    argv: list[str],
    overrides: list[str],
    bench: BenchConfig,
    configs: dict[str, Any],
    measured: dict[str, list[dict]],
) -> dict[str, Any]:
    from mpt_repro.bench.results import SCHEMA_VERSION, aggregate
    from mpt_repro.config import to_plain

    first = next((r for runs in measured.values() for r in runs if "error" not in r), None)
    suite = to_plain(configs[bench.presets[0]])
    suite.pop("precision", None)
    device = dict(first["device"]) if first else {"type": "unknown", "name": "unknown"}
    device["gpu_model"] = first.get("gpu_model") if first else None
    commit, dirty = git_commit()
    return {
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "versions": first["versions"] if first else {},
        "commit": commit,
        "commit_dirty": dirty,
        "command": "mpt-bench " + " ".join(argv),
        "batch": first["batch"] if first else None,
        "config": {
            "overrides": overrides,
            "suite": suite,
            "presets": {p: to_plain(c.precision) for p, c in configs.items()},
            "bench": asdict(bench),
        },
        "results": aggregate(measured, bench.presets),
    }


def git_commit() -> tuple[str | None, bool | None]:
    """The checkout's commit and whether it had local changes (None outside a git checkout)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        if head.returncode != 0:
            return None, None
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        )
        return head.stdout.strip(), bool(status.stdout.strip())
    except OSError:
        return None, None


def write(doc: dict, out_dir: str) -> Path:
    d = doc["device"]
    device = "cpu" if d["type"] == "cpu" else _slug(d["name"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    experiment = doc["config"]["suite"]["experiment_name"]
    path = Path(out_dir) / f"{experiment}-{device}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


if __name__ == "__main__":
    sys.exit(main())
