"""The run record: run.json, written atomically at the start and however the run ends.

The reporter, the tests and users' own scripts read it; its schema is documented in README.md
("The run record"). Bump SCHEMA_VERSION when a field changes meaning, and teach `upgrade` to read
the older versions.

Schema 2 over 1: status `interrupted` (stopped by a signal after a checkpoint; version 1 wrote
`failed` with "SIGTERM" in the reason), and the fields `hint` (what to do next), `diverged_layer`,
`metrics_detail` (optional, task-specific), `host` and `pid`.

Schema 3 (this writer) over 2: `package_version` (mpt-repro's own version, also for a wheel
install, where `git_commit` is null), `study` (the run directory's first folder: the experiment,
or `<experiment>-<model.name>` for your own model), `overrides` (the job's command-line
overrides), `saved_bytes_per_sample`, `peak_memory_kind` `host_peak_rss` (a CPU run's own peak;
`host_max_rss_process` where it could not be reset), and every record has `metrics`: null for a
diverged run (its last evaluation before it diverged is `diagnostics.last_eval`).

Schema 4 (this writer) over 3: `evaluation`, what the metrics rest on (mpt_repro/evidence.py):
the items evaluated and their unit, the count under each metric, the metrics left undefined
(null in `metrics`, with the reason), the items dropped before scoring, and the file beside
run.json that keeps what each item scored (`eval_items.npz`). Null until a run completes with a
result; older records read as null (the reporter then gives no verdict: it cannot tell how much
evidence is under their numbers).

Schema 5 (this writer) over 4: `machine`, what decides the numbers on the device that ran
(mpt_repro/machine.py: the CPU, torch's CPU capability, oneDNN and the BLAS with their limits,
the threads, the pinning variables, a GPU's driver and TF32 switches) and whether the run asked
for portable mode and got it (`machine.portable`). Older records read as null: the reporter
cannot say whether their machines differ.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mpt_repro.errors import naming
from mpt_repro.safeio import kind_of

SCHEMA_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
STATUSES = ("running", "completed", "diverged", "failed", "interrupted")
# what every readable record holds, whatever its status (a diverged or failed run has no metrics)
REQUIRED = ("schema_version", "status", "experiment", "precision")
# fields a record of an older schema lacks: read as None
ADDED_IN_2 = ("reason", "hint", "diverged_at_step", "diverged_layer", "host", "pid")
ADDED_IN_3 = ("package_version", "study", "overrides", "saved_bytes_per_sample", "metrics")
ADDED_IN_4 = ("evaluation",)
ADDED_IN_5 = ("machine",)


class RecordError(ValueError):
    """A run.json that cannot be used: not JSON, cut short, or not a run record of a schema this
    code reads. `path` is the file, `problem` says what is wrong with it. `special`: the path is
    not a regular file (a FIFO, a device), which nothing opens: reading a FIFO would wait for a
    writer forever, and it cannot be moved aside as a record."""

    def __init__(self, path: Path, problem: str, special: bool = False):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem, self.special = Path(path), problem, special


def not_a_regular_file(path: Path) -> str | None:
    """What `path` is when it exists but is not a regular file ("a FIFO (named pipe)", ...), or
    None. Asked of the file system without opening the path: opening a FIFO for reading waits for
    a writer, and a device may never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return kind_of(mode)


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file.

    The file gets the mode an ordinary file would (0644 under the usual umask), not mkstemp's
    0600: run records are shared with the rest of a team's results.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a failed write names no file: this one
        Path(tmp).unlink(missing_ok=True)
        raise naming(e, path) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _torchvision_version() -> str | None:
    """torchvision.__version__, read from its version.py: importing torchvision loads
    torch._dynamo (2 s of CPU), which a run of a model without torchvision never needs."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torchvision")
        folder = Path(next(iter(spec.submodule_search_locations or [])))
        found = re.search(
            r"^__version__ = ['\"]([^'\"]+)", (folder / "version.py").read_text(), re.M
        )
        if found:
            return found.group(1)
        import torchvision

        return torchvision.__version__
    except Exception:  # noqa: BLE001 - torchvision is optional at run time for non-vision tasks
        return None


def versions() -> dict[str, str | None]:
    import hydra
    import torch

    tv = _torchvision_version()
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


def _machine(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The record's `machine` (schema 5): the fingerprint of the device in `fields`, with
    whether the run's configuration asked for portable mode (trainer.portable)."""
    from mpt_repro.machine import fingerprint

    config = fields.get("config") if isinstance(fields.get("config"), Mapping) else {}
    trainer = config.get("trainer") if isinstance(config.get("trainer"), Mapping) else {}
    return fingerprint(fields.get("device"), portable=bool(trainer.get("portable", False)))


def package_version() -> str | None:
    """mpt-repro's installed version (a wheel install has no git commit to name the code)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mpt-repro")
    except PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The commit of the code that ran, with '+dirty' when the work tree had changes."""
    repo = Path(__file__).resolve().parents[1]
    if not (repo / ".git").exists() or not (repo / "pyproject.toml").exists():
        return None  # installed from a wheel: whatever repository site-packages sits in is not ours
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
            "hint": None,
            "diverged_at_step": None,
            "diverged_layer": None,
            "metrics": None,  # every record has it: null until a run completes with a result
            "metrics_detail": None,
            "evaluation": None,  # what the metrics rest on (schema 4)
            "started_at": now_iso(),
            "finished_at": None,
            "command": " ".join(sys.argv),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "versions": versions(),
            "machine": _machine(fields),
            "package_version": package_version(),
            "git_commit": git_commit(),
            "diagnostics": {},
            **fields,
        }

    def update(self, **fields: Any) -> None:
        self.data.update(fields)

    def finish(
        self, status: str, reason: str | None = None, hint: str | None = None, **fields: Any
    ) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; one of {STATUSES}")
        self.data.update(status=status, reason=reason, hint=hint, finished_at=now_iso(), **fields)
        self.write()

    def write(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # tensors and numpy scalars
        return obj.item()
    return str(obj)  # paths, enums


def missing_files(run_dir: Path, record: Mapping[str, Any]) -> list[str]:
    """The files a finished run's record goes with that are not in run_dir (a metrics.csv
    deleted after the run): its result stands in run.json, its curves or items do not."""
    if record.get("status") not in ("completed", "diverged"):
        return []
    # eval_items.npz is not listed: the report already says when a run's items cannot be read
    names = ["metrics.csv"]
    return [n for n in names if not (Path(run_dir) / n).is_file()]


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The run record in run_dir (upgraded to this schema), or None when there is none.

    Raises RecordError when a run.json is there but cannot be used.
    """
    path = Path(run_dir) / "run.json"
    if not path.exists():
        return None
    return load_record(path)


def load_record(path: Path) -> dict[str, Any]:
    """Read one run.json of any readable schema version, as this version's fields.

    Raises RecordError naming the problem: unreadable bytes, JSON cut short, not an object, an
    unknown schema_version, missing fields, an unknown status.
    """
    path = Path(path)
    special = not_a_regular_file(path)
    if special:
        raise RecordError(path, f"is {special}, not a file mpt-run wrote", special=True)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise RecordError(path, f"cannot be read ({e.strerror or e})") from None
    if not text.strip():
        raise RecordError(path, "empty file")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        problem = f"not valid JSON ({e.msg} at line {e.lineno}); cut short?"
        raise RecordError(path, problem) from None
    return upgrade(record, path)


def upgrade(record: Any, path: Path | str = "run.json") -> dict[str, Any]:
    """Check a parsed record and bring it to this schema (see the module docstring)."""
    if not isinstance(record, dict):
        raise RecordError(Path(path), f"holds a JSON {type(record).__name__}, not an object")
    version = record.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise RecordError(
            Path(path),
            f"schema_version {version!r}; this version of mpt-repro reads {READABLE_VERSIONS}",
        )
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise RecordError(Path(path), f"missing fields: {', '.join(missing)}")
    if record["status"] not in STATUSES:
        raise RecordError(Path(path), f"unknown status {record['status']!r}")
    if version == SCHEMA_VERSION:
        return record
    added = (*ADDED_IN_2, *ADDED_IN_3, *ADDED_IN_4, *ADDED_IN_5)
    record = {**{k: None for k in added}, **record}
    reason = str(record.get("reason") or "")
    if record["status"] == "failed" and "SIGTERM" in reason:
        # version 1 recorded a stop by SIGTERM (checkpoint saved, resumable) as failed
        record["status"] = "interrupted"
    if record["status"] == "diverged":
        record["metrics"] = None  # schema 3: a diverged run has no result
    record["upgraded_from"] = version
    record["schema_version"] = SCHEMA_VERSION
    return record


def normalised_status(record: Mapping[str, Any]) -> str | None:
    """The status as schema 2 and later name it: a schema 1 `failed` record stopped by SIGTERM
    is `interrupted` (it saved a checkpoint; resume=true continues it)."""
    status = record.get("status")
    if status == "failed" and "SIGTERM" in str(record.get("reason") or ""):
        return "interrupted"
    return status


# what to do about a run that applied no step, as the closing block and the reporter say it
NO_STEP_ADVICE = "a dynamic loss scale halves per skipped step: train longer; lower a static one"


def no_step_applied(record: Mapping[str, Any]) -> bool:
    """Whether a completed run skipped every optimizer step for an overflow: its metrics are
    those of the model as initialised (a short run whose dynamic loss scale, starting at 2^16,
    never came down far enough), a result about nothing trained."""
    steps, skipped = record.get("steps"), record.get("skipped_steps")
    numbers = all(isinstance(x, int) and not isinstance(x, bool) for x in (steps, skipped))
    return numbers and record.get("status") == "completed" and 0 < steps <= skipped


# what every speed figure of a device without fast low-precision arithmetic carries
SLOW_FP16_NOTE = (
    "this device has no fast FP16/BF16 arithmetic ({why}): its speed ratios between presets say "
    "nothing about a GPU's (mpt-bench on a GPU measures them)"
)


def slow_low_precision(device: Mapping[str, Any] | None) -> str | None:
    """Why a run's device has no fast FP16/BF16 arithmetic (a CPU emulates it, a GPU before
    compute capability 7.0 has no tensor cores), or None when it has, or is not known."""
    if not isinstance(device, Mapping):
        return None
    kind = device.get("type")
    if kind == "cuda":
        try:
            major = int(str(device.get("capability")).split(".")[0])
        except ValueError:
            return None  # older records do not say
        return f"compute capability {device['capability']}, no tensor cores" if major < 7 else None
    return f"a {str(kind).upper()}" if kind else None


def nonfinite_metrics(metrics: dict[str, Any] | None) -> dict[str, Any]:
    """The metrics whose value is NaN or infinite (a completed run that learned nothing useful)."""
    return {
        k: v
        for k, v in (metrics or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)
    }
