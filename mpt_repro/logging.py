"""Where numbers go during a run: TensorBoard event files and metrics.csv in the run directory."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

BASE_COLUMNS = [
    "step",
    "epoch",
    "split",
    "loss",
    "lr",
    "loss_scale",
    "skipped_steps",
    "samples_per_s",
    "wall_time_s",
]


class MetricsLogger:
    """Scalars to TensorBoard (`tb/`) and rows to metrics.csv, both in the run directory.

    On resume, rows after the checkpoint's step are dropped so that the file matches an
    uninterrupted run.
    """

    def __init__(self, run_dir: Path, metric_names: list[str], resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.columns = BASE_COLUMNS + [m for m in metric_names if m not in BASE_COLUMNS]
        self.csv_path = Path(run_dir) / "metrics.csv"
        rows = self._rows_up_to(resume_step) if resume_step is not None else []
        self._file = open(self.csv_path, "w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._csv.writeheader()
        self._csv.writerows(rows)
        self._file.flush()
        # purge_step: TensorBoard hides the events the killed run wrote after its checkpoint (the
        # rows at the checkpoint's own step were written before it and stay)
        self.writer = SummaryWriter(
            log_dir=str(Path(run_dir) / "tb"),
            purge_step=None if resume_step is None else resume_step + 1,
        )

    def _rows_up_to(self, step: int) -> list[dict[str, str]]:
        if not self.csv_path.exists():
            return []
        with open(self.csv_path, newline="") as f:
            return [r for r in csv.DictReader(f) if int(r["step"]) <= step]

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if value is not None and key not in ("epoch",):
                self.writer.add_scalar(f"{split}/{key}", value, step)
        self._csv.writerow({"step": step, "split": split, **values})
        self._file.flush()

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        """HParams in the run's own event file: TensorBoard compares runs by precision, seed..."""
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        clean = {
            k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()
        }
        metric_tags = {
            f"hparam/{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))
        }
        exp, ssi, sei = hparams_summary(clean, metric_tags)
        fw = self.writer._get_file_writer()
        for summary in (exp, ssi, sei):
            fw.add_summary(summary)
        for tag, value in metric_tags.items():
            self.writer.add_scalar(tag, value, 0)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
        self._file.close()
