"""summary.txt: what ran, how long, and each figure against its target (docs/performance.md,
"Reading summary.txt"). Reads the bench JSON and the run records as files (standard library
only), so it is written whatever the steps left behind."""

from __future__ import annotations

import json
from pathlib import Path

from mpt_repro.gpucheck.steps import Outcome

# The targets of ResNet-50 at batch 256 on an H100 (docs/performance.md): (label, preset, field,
# test, shown as); "info" lines are reported without a verdict of the check
TARGETS = [
    ("mixed >= 3.5x strict fp32", "mixed", "ratio_fp32", lambda v: v >= 3.5, "{:.2f}x"),
    ("mixed >= 4,500 img/s", "mixed", "samples_per_s", lambda v: v >= 4500, "{:,.0f} img/s"),
    ("mixed peak memory <= 0.55 x fp32", "mixed", "mem_ratio_fp32", lambda v: v <= 0.55, "{:.2f}"),
]
INFO = [
    ("mixed >= 0.95x amp", "mixed", "ratio_amp", lambda v: v >= 0.95, "{:.2f}x"),
    ("trainer overhead <= 3% (mixed)", "mixed", "trainer_overhead", lambda v: v <= 0.03, "{:.1%}"),
]


def newest_bench(work: Path) -> Path | None:
    found = sorted((work / "bench").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def header(probe: dict, rehearsal: bool, commit: str, clock: tuple[float, int]) -> list[str]:
    gpus = probe.get("gpus") or []
    kind = "REHEARSAL on the CPU (trainer.device=cpu, tiny sizes): speed and memory mean nothing"
    return [
        f"mpt-repro gpu-check{' ' + kind if rehearsal else ''}",
        f"commit {commit} | python {probe.get('python', '?')} | torch {probe.get('torch', '?')}"
        f" | CUDA {probe.get('cuda')} | cuDNN {probe.get('cudnn')}",
        "GPU: " + (f"{gpus[0]} x{len(gpus)}" if gpus else "none visible"),
        f"total {clock[0]:.0f} s of a {clock[1]} s budget for the steps",
    ]


def missing_line(probe: dict) -> str | None:
    """One line naming every package that does not import (None: all do)."""
    missing = probe.get("missing") or []
    if not missing:
        return None
    names = ", ".join(f"{m['dist']} ({m['error']})" for m in missing)
    return f"MISSING: {names}; carry the wheels of `make gpu-wheels` (docs/performance.md)"


def steps_table(outcomes: list[Outcome]) -> list[str]:
    lines = ["", f"{'step':<16}{'outcome':<44}{'seconds':>8}{'limit':>7}"]
    for o in outcomes:
        timing = f"{o.seconds:>8.0f}{o.limit_s:>7}" if o.status != "skipped" else ""
        lines.append(f"{o.name:<16}{o.describe():<44}{timing}")
    return lines


def bench_lines(path: Path | None) -> list[str]:
    if path is None:
        return ["", "bench: no JSON was written (its log is logs/bench.log in the archive)"]
    doc = json.loads(path.read_text())
    rows = {r["preset"]: r for r in doc["results"]}
    lines = ["", f"bench: {path.name} ({doc.get('command', '')})", _bench_head()]
    lines += [_bench_row(r) for r in doc["results"]]
    lines += ["", "targets (ResNet-50, batch 256, an H100):"]
    lines += [_verdict(rows, *t) for t in TARGETS]
    lines.append(_syncs_verdict(doc["results"]))
    lines += [_verdict(rows, *t, info=True) for t in INFO]
    return lines


def _bench_head() -> str:
    return (
        f"{'preset':<8}{'img/s':>10}{'min-max':>18}{'x fp32':>8}{'peak GiB':>10}{'mem x fp32':>11}"
        f"{'saved MiB/img':>14}{'syncs/step':>11}{'sync warns':>11}{'overhead':>9}{'repeats':>8}"
    )


def _bench_row(r: dict) -> str:
    if not r.get("repeats"):
        return f"{r['preset']:<8}  no figures: {r.get('error')}"
    d = r.get("detail") or {}
    return (
        f"{r['preset']:<8}{_f(r['samples_per_s'], '{:.4g}'):>10}"
        f"{_f(r['samples_per_s_min'], '{:.4g}') + '-' + _f(r['samples_per_s_max'], '{:.4g}'):>18}"
        f"{_f(r.get('ratio_fp32'), '{:.2f}'):>8}{_f(r.get('peak_allocated_bytes'), 'GiB'):>10}"
        f"{_f(r.get('mem_ratio_fp32'), '{:.2f}'):>11}"
        f"{_f(r.get('saved_bytes_per_sample'), 'MiB'):>14}"
        f"{_f(r.get('host_syncs_per_step'), '{}'):>11}"
        f"{_f(d.get('cuda_sync_debug_warnings'), '{}'):>11}"
        f"{_f(r.get('trainer_overhead'), '{:.1%}'):>9}{r['repeats']:>8}"
    )


def _f(value, fmt: str) -> str:
    if value is None:
        return "n/a"
    if fmt in ("GiB", "MiB"):
        return f"{value / 2 ** (30 if fmt == 'GiB' else 20):.3g}"
    return fmt.format(value)


def _verdict(rows: dict, label: str, preset: str, field: str, test, fmt: str, info=False) -> str:
    row = rows.get(preset) or {}
    value = row.get(field)
    if value is None:
        return f"  [n/a ] {label}: not measured ({row.get('error') or 'no ' + field})"
    if not (row.get("meaningful") or {}).get(field, True):
        return f"  [n/a ] {label}: {fmt.format(value)} on a CPU means nothing"
    tag = ("info " if info else "") + ("PASS" if test(value) else "FAIL")
    return f"  [{tag}] {label}: {fmt.format(value)}"


def _syncs_verdict(results: list[dict]) -> str:
    measured = [r for r in results if r.get("host_syncs_per_step") is not None]
    if not measured:
        return "  [n/a ] 0 host syncs per step: not measured"
    counts = {r["preset"]: r["host_syncs_per_step"] for r in measured}
    warns = {r["preset"]: (r.get("detail") or {}).get("cuda_sync_debug_warnings") for r in measured}
    bad = {p: n for p, n in counts.items() if n or warns[p]}
    text = ", ".join(
        f"{p} {n}" + (f" ({warns[p]} warned)" if warns[p] else "") for p, n in counts.items()
    )
    lines = [f"  [{'FAIL' if bad else 'PASS'}] 0 host syncs per step (every preset): {text}"]
    for r in measured:  # where torch's sync-debug mode saw each sync (bench/measure.py)
        where = (r.get("detail") or {}).get("cuda_sync_debug_where") or {}
        lines += [f"         {r['preset']} warned at {at} ({n}x)" for at, n in where.items()]
    return "\n".join(lines)


def smoke_lines(runs: Path, expected: list[str]) -> list[str]:
    """One line per run record under runs/ (the smoke sweeps, DDP), and the experiments that
    left none."""
    records = []
    for path in sorted(runs.rglob("run.json")) if runs.is_dir() else []:
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            records.append({"experiment": str(path.parent), "status": f"unreadable: {e}"})
    done = sum(r.get("status") == "completed" for r in records)
    lines = ["", f"runs ({runs.name}/): {done} of {len(records)} completed"]
    lines.append(
        f"{'experiment':<16}{'preset':<8}{'world':>6}  {'status':<12}{'steps':>6}{'skipped':>8}"
        f"{'samples/s':>11}{'peak MiB':>10}  reason"
    )
    for r in records:
        world = ((r.get("distributed") or {}).get("world_size")) or 1
        lines.append(
            f"{str(r.get('experiment')):<16}{str(r.get('precision')):<8}{world:>6}  "
            f"{str(r.get('status')):<12}{_f(r.get('steps'), '{}'):>6}"
            f"{_f(r.get('skipped_steps'), '{}'):>8}{_f(r.get('samples_per_s'), '{:.4g}'):>11}"
            f"{_f(r.get('peak_memory_bytes'), 'MiB'):>10}  {_first_line(r.get('reason'))}"
        )
    seen = {r.get("experiment") for r in records}
    absent = [e for e in expected if e not in seen]
    if absent:
        lines.append(f"no run record: {', '.join(absent)} (see the smoke logs in the archive)")
    return lines


def _first_line(text) -> str:
    return str(text).strip().splitlines()[0][:120] if text else ""


def files_lines(out: Path) -> list[str]:
    names = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "summary.txt")
    return ["", "files: summary.txt, " + ", ".join(names)]
