"""The files to send back, at most 8 in one folder (the device tool's limit): the bench JSON,
report.md, and one archive of the logs, run records and report tables (summary.txt is written
last, beside them). Checkpoints, TensorBoard events and sample images stay behind."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

ARCHIVE = "gpu-check-logs.tar.gz"
FILE_CAP = 4 * 2**20  # a file larger than this stays out of the archive (listed in its place)


def keep(path: Path) -> bool:
    parts = path.parts
    if any(p == "checkpoints" or p == "samples" or p.startswith("previous-") for p in parts):
        return False
    return not path.name.startswith("events.out.tfevents") and path.suffix not in (".pt", ".png")


def pack(work: Path, out: Path, bench: Path | None) -> list[str]:
    """Copy the bench JSON and report.md into `out` and archive the rest; the names of what was
    left out for its size."""
    out.mkdir(parents=True, exist_ok=True)
    if bench is not None:
        shutil.copy2(bench, out / bench.name)
    report = work / "report" / "report.md"
    if report.exists():
        shutil.copy2(report, out / "report.md")
    too_big = []
    with tarfile.open(out / ARCHIVE, "w:gz") as tar:
        for folder in ("logs", "runs", "bench", "report"):
            root = work / folder
            for path in sorted(root.rglob("*")) if root.is_dir() else []:
                rel = path.relative_to(work)
                if not path.is_file() or not keep(rel):
                    continue
                if path.stat().st_size > FILE_CAP:
                    too_big.append(str(rel))
                    continue
                tar.add(path, arcname=str(rel))
    return too_big
