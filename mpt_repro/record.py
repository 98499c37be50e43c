"""The run record: run.json, written atomically at the start and however the run ends.

The reporter, the tests and users' own scripts read it; its schema is documented in README.md
("The run record"). Bump SCHEMA_VERSION when a field changes meaning.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("running", "completed", "diverged", "failed")


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str | None]:
    import hydra
    import torch

    try:
        import torchvision

        tv = torchvision.__version__
    except Exception:  # torchvision is optional at run time for non-vision tasks
        tv = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": tv,
        "hydra": hydra.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version())
        if torch.backends.cudnn.is_available()
        else None,
    }


def git_commit() -> str | None:
    """The commit of the code that ran, with '+dirty' when the work tree had changes."""
    repo = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


class RunRecord:
    """Holds the fields of run.json and writes them; `write()` after every change of status."""

    def __init__(self, run_dir: Path, fields: dict[str, Any]):
        self.path = Path(run_dir) / "run.json"
        self.data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "status": "running",
            "reason": None,
            "diverged_at_step": None,
            "started_at": now_iso(),
            "finished_at": None,
            "command": " ".join(sys.argv),
            "versions": versions(),
            "git_commit": git_commit(),
            "diagnostics": {},
            **fields,
        }

    def update(self, **fields: Any) -> None:
        self.data.update(fields)

    def finish(self, status: str, reason: str | None = None, **fields: Any) -> None:
        assert status in STATUSES, status
        self.data.update(status=status, reason=reason, finished_at=now_iso(), **fields)
        self.write()

    def write(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # tensors and numpy scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "run.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())
