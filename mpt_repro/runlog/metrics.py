"""Where a run's numbers go while it trains: metrics.csv (one row per log row and evaluation,
README "The run record") and TensorBoard scalars, with the events straight in the run directory
so that `tensorboard --logdir results/runs` names each run by its folder
(`study/precision-budget/seedN[/<overrides>]`).

A custom-scalars layout puts the runs of one comparison group (study, budget, data set, other
overrides) on one chart per compared value (train loss, loss scale, samples/s, each evaluation
metric): TensorBoard's charts select by tag, not by run, so these few values are also written
under `compare/<group>/...`.
"""

from __future__ import annotations

import csv
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpt_repro.errors import RunDirError, naming
from mpt_repro.safeio import NotARegularFile, check_regular, open_regular

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
# TensorBoard's event files, in the run directory itself (see the module docstring)
TB_EVENTS_GLOB = "events.out.tfevents.*"
# the train-row values that go onto the per-experiment comparison charts
COMPARED_TRAIN = {
    "loss": "train loss",
    "sampled_loss": "train loss (sampled softmax)",  # Task.train_loss_name
    "loss_scale": "loss scale",
    "samples_per_s": "samples/s",
}

log = logging.getLogger("mpt_repro")


def tb_dir(run_dir: Path) -> Path:
    """Where a run's TensorBoard events go: the run directory itself."""
    return Path(run_dir)


def comparison_group(cfg: Any) -> str:
    """The runs drawn on one custom-scalars chart: one study (the experiment, or the experiment
    with your own model), budget and data set, and the same other overrides (the run directory's
    variant folder), so only runs that differ in precision and seed share a chart."""
    from mpt_repro.identity import study_name

    group = f"{study_name(cfg.experiment_name, cfg.model)}-{cfg.budget.name}-{cfg.data.name}"
    variant = job_variant(cfg)
    return f"{group} [{variant}]" if variant else group


def job_variant(cfg: Any) -> str:
    """The variant folder of this run (its other overrides), or "" outside an mpt-run job."""
    from hydra.core.hydra_config import HydraConfig

    from mpt_repro.identity import is_custom_model, variant_name

    if not HydraConfig.initialized():
        return ""
    return variant_name(HydraConfig.get().overrides.task, is_custom_model(cfg.model))


@dataclass
class Resume:
    """Where a resumed run's log continues: the checkpoint's step, whether the evaluation at that
    step ran before the checkpoint was saved (the final one runs after it), and the rows the
    checkpoint holds (None for a checkpoint written before it held them)."""

    step: int
    eval_done: bool
    rows: list[dict[str, Any]] | None = None


class MetricsLogger:
    """Scalars to TensorBoard (events in the run directory) and rows to metrics.csv.

    On resume the file holds exactly the rows of an uninterrupted run up to the checkpoint: the
    checkpoint's own copy of them (so a metrics.csv deleted or cut short is rebuilt, and the log
    says so), or for an older checkpoint the file's rows up to its step. With `compare_group`
    (`comparison_group(cfg)`), the train loss, loss scale, samples/s and evaluation metrics are
    also written where the custom-scalars layout looks.
    """

    def __init__(
        self,
        run_dir: Path,
        metric_names: list[str],
        resume: Resume | None = None,
        compare_group: str | None = None,
        train_loss: str = "loss",
    ):
        from torch.utils.tensorboard import SummaryWriter

        extra = [train_loss, *metric_names]  # train_loss: the task's name for it (sampled_loss)
        self.columns = BASE_COLUMNS + [m for m in dict.fromkeys(extra) if m not in BASE_COLUMNS]
        self.csv_path = Path(run_dir) / "metrics.csv"
        _refuse_special(self.csv_path)  # opening a FIFO, to read or to write, waits forever
        self.rows: list[dict[str, Any]] = self._resumed_rows(resume) if resume else []
        self._file = open(self.csv_path, "w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._csv.writeheader()
        self._csv.writerows(self.rows)
        self._file.flush()
        # purge_step: TensorBoard hides the events the killed run wrote after its checkpoint (the
        # rows at the checkpoint's own step were written before it and stay)
        self.writer = SummaryWriter(
            log_dir=str(tb_dir(run_dir)),
            purge_step=None if resume is None else resume.step + 1,
        )
        self.compare_group = compare_group
        if compare_group:
            self.writer.add_custom_scalars(
                comparison_layout(compare_group, metric_names, train_loss)
            )

    def _resumed_rows(self, resume: Resume) -> list[dict[str, Any]]:
        on_disk = self._rows_up_to(resume.step, resume.eval_done)
        if resume.rows is None:
            return on_disk
        if len(on_disk) < len(resume.rows):
            found = f"held {len(on_disk)} rows" if self.csv_path.exists() else "was missing"
            log.warning(
                "%s %s: rebuilt its %d rows up to step %d from the checkpoint",
                self.csv_path,
                found,
                len(resume.rows),
                resume.step,
            )
        return [dict(row) for row in resume.rows]

    def _rows_up_to(self, step: int, eval_done: bool) -> list[dict[str, str]]:
        """The file's rows up to `step` (an evaluation at `step` only if it ran before the
        checkpoint: the final one is run again, and must not appear twice)."""
        if not self.csv_path.exists():
            return []
        with open_regular(self.csv_path, "r", newline="") as f:
            return [
                r
                for r in csv.DictReader(f)
                if int(r["step"]) < step
                or (int(r["step"]) == step and (r["split"] != "eval" or eval_done))
            ]

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if value is not None and key not in ("epoch",):
                self.writer.add_scalar(f"{split}/{key}", value, step)
        if self.compare_group:
            for key, value in values.items():
                if value is None or key == "epoch":
                    continue
                if split == "train" and key in COMPARED_TRAIN:
                    self.writer.add_scalar(compare_tag(self.compare_group, key), value, step)
                elif split == "eval":
                    self.writer.add_scalar(
                        compare_tag(self.compare_group, f"eval_{key}"), value, step
                    )
        row = {"step": step, "split": split, **values}
        self.rows.append(row)  # the checkpoint keeps them (Resume.rows)
        try:
            self._csv.writerow(row)
            self._file.flush()
        except OSError as e:  # a full disk, a file past `ulimit -f`: say which file
            raise naming(e, self.csv_path) from e

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
        self._file.close()


def _refuse_special(path: Path) -> None:
    """A metrics.csv that is not a regular file (a FIFO, a device) ends the run in one line."""
    try:
        check_regular(path)
    except NotARegularFile as e:
        raise RunDirError(
            f"{e}: mpt-run neither reads nor writes it. Remove it (the rows are rebuilt from the "
            "checkpoint), then run the same command again"
        ) from None


# ---------------------------------------------------------------- custom scalars


def compare_tag(group: str, key: str) -> str:
    return f"compare/{group}/{key}"


def comparison_layout(group: str, metric_names: list[str], train_loss: str = "loss") -> dict:
    """add_custom_scalars layout: one category per experiment and budget, one chart per compared
    value; every run of the group is a line on it (TensorBoard merges the runs' layouts by
    category title)."""

    def chart(key: str) -> list:
        return ["Multiline", [f"^{re.escape(compare_tag(group, key))}$"]]

    other_loss = "sampled_loss" if train_loss == "loss" else "loss"
    charts = {title: chart(key) for key, title in COMPARED_TRAIN.items() if key != other_loss}
    for name in metric_names:
        charts[f"eval {name}"] = chart(f"eval_{name}")
    return {f"{group}: presets compared": charts}
