"""What an evaluation's metrics were computed from: per-item statistics, their sums and counts.

A task's evaluation yields, for every item it evaluated (an image, an utterance, a sentence, a
block of text), a few numbers: columns such as `top1` (1 when the first guess was right), `loss`
and `items` (1 per item), or a CER's `char_errors` and `chars`. Every metric is a function of the
column sums (`Ratio`: top-1 is 100 · Σtop1 / Σitems; CER is 100 · Σchar_errors / Σchars;
perplexity is exp(Σloss / Σtokens); `Bleu`: sacrebleu's BLEU from summed n-gram counts). So:

- the count a metric rests on is the sum of its denominator (images, tokens, characters,
  references): run.json states it beside the metric, and a metric with nothing under it is
  undefined (null, with the reason), never a number (no division by max(n, 1));
- the reporter recomputes a metric on resampled items (docs/report.md, "Differences and their
  uncertainty") from the items file the trainer writes beside run.json (`ITEMS_FILE`), using
  the formulas the record states, without importing the task.

Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ITEMS_FILE = "eval_items.npz"  # the last evaluation's per-item columns, beside run.json
# the largest log-perplexity turned into a perplexity (exp overflows a float past ~709)
MAX_LOG = 700.0
# columns that depend on the data alone, not on the model: two runs whose values differ did not
# evaluate the same items (the reporter checks them before it resamples items across runs)
KEY_COLUMNS = ("label", "tokens", "bleu_ref_len", "chars", "words")
BLEU_ORDER = 4
# the columns a Bleu metric sums: hypothesis and reference lengths, then matching and total
# n-grams per order (sacrebleu's sufficient statistics)
BLEU_COLUMNS = (
    "bleu_sys_len",
    "bleu_ref_len",
    *(f"bleu_correct_{n}" for n in range(1, BLEU_ORDER + 1)),
    *(f"bleu_total_{n}" for n in range(1, BLEU_ORDER + 1)),
)


@dataclass(frozen=True)
class Ratio:
    """scale · Σnumerator / Σdenominator over the items (exp of it with `exp`: a perplexity).
    `unit` names what the denominator counts (images, tokens, characters, words)."""

    numerator: str
    denominator: str
    unit: str
    scale: float = 1.0
    exp: bool = False
    kind: str = "ratio"

    def columns(self) -> tuple[str, ...]:
        return (self.numerator, self.denominator)

    def count(self, sums: Mapping[str, Any]) -> Any:
        return sums[self.denominator]

    def value(self, sums: Mapping[str, Any]) -> Any:
        """The metric from column sums (numbers, or arrays of resampled sums); NaN where the
        denominator is 0 (the caller reports that as undefined)."""
        num = np.asarray(sums[self.numerator], dtype=np.float64)
        den = np.asarray(sums[self.denominator], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(den > 0, self.scale * num / np.where(den > 0, den, 1.0), np.nan)
        if self.exp:
            out = np.exp(np.minimum(out, MAX_LOG))
        return out


@dataclass(frozen=True)
class Bleu:
    """Corpus BLEU (sacrebleu's, its default exponential smoothing) from the summed n-gram
    statistics of the sentences; counted in reference sentences (`denominator`)."""

    denominator: str = "items"
    unit: str = "sentences"
    kind: str = "bleu"

    def columns(self) -> tuple[str, ...]:
        return (*BLEU_COLUMNS, self.denominator)

    def count(self, sums: Mapping[str, Any]) -> Any:
        return sums[self.denominator]

    def value(self, sums: Mapping[str, Any]) -> Any:
        from sacrebleu.metrics.bleu import BLEU

        n = BLEU_ORDER
        sys_len = np.atleast_1d(np.asarray(sums["bleu_sys_len"], dtype=np.float64))
        ref_len = np.atleast_1d(np.asarray(sums["bleu_ref_len"], dtype=np.float64))
        correct = [np.atleast_1d(sums[f"bleu_correct_{k}"]) for k in range(1, n + 1)]
        total = [np.atleast_1d(sums[f"bleu_total_{k}"]) for k in range(1, n + 1)]
        out = np.full(sys_len.shape, np.nan)
        for i in range(len(sys_len)):
            if ref_len[i] <= 0:
                continue  # no reference words: nothing to score against
            score = BLEU.compute_bleu(
                [int(c[i]) for c in correct],
                [int(t[i]) for t in total],
                int(sys_len[i]),
                int(ref_len[i]),
                smooth_method="exp",
                max_ngram_order=n,
            )
            out[i] = score.score
        return out if np.ndim(sums["bleu_sys_len"]) else out[0]


Formula = Ratio | Bleu


def formula_from_dict(spec: Mapping[str, Any]) -> Formula:
    """A formula as run.json's `evaluation.formulas` states it."""
    spec = dict(spec)
    kind = spec.pop("kind", "ratio")
    spec.setdefault("unit", "items")
    if kind == "ratio":
        return Ratio(**spec)
    if kind == "bleu":
        return Bleu(**spec)
    raise ValueError(f"unknown metric formula {kind!r}")


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: its metrics and what they rest on."""

    metrics: dict[str, float | None]  # None: undefined (see `undefined`)
    counts: dict[str, int]  # metric -> the sum of its denominator
    units: dict[str, str]  # metric -> what that count counts
    items: int | None  # the items evaluated (images, utterances, sentences, text blocks)
    unit: str  # what an item is
    undefined: dict[str, str]  # metric -> why it has no value
    dropped: dict[str, int]  # items left out before scoring, by reason
    columns: dict[str, np.ndarray] | None  # per-item statistics (None: the task keeps none)
    formulas: dict[str, Formula] | None

    def record(self, step: int, items_file: str | None) -> dict[str, Any]:
        """run.json's `evaluation` block."""
        return {
            "step": step,
            "unit": self.unit,
            "items": self.items,
            "counts": self.counts,
            "units": self.units,
            "undefined": self.undefined,
            "dropped": self.dropped,
            "items_file": items_file,
            "formulas": {k: _spec(f) for k, f in (self.formulas or {}).items()},
        }


def _spec(formula: Formula) -> dict[str, Any]:
    """A formula as run.json states it: its kind and the fields that differ from their defaults
    (the unit is in `units`)."""
    defaults = type(formula).__dataclass_fields__
    spec = {
        k: v
        for k, v in asdict(formula).items()
        if k != "unit" and (k == "kind" or v != defaults[k].default)
    }
    return spec


def column_sums(columns: Mapping[str, np.ndarray]) -> dict[str, float]:
    return {k: float(np.sum(v, dtype=np.float64)) for k, v in columns.items()}


def from_columns(
    columns: Mapping[str, np.ndarray],
    formulas: Mapping[str, Formula],
    unit: str,
    dropped: Mapping[str, int] | None = None,
) -> Evaluation:
    """An Evaluation from per-item columns (every column one value per item)."""
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"per-item columns of different lengths: {sorted(lengths)}")
    items = lengths.pop() if lengths else 0
    sums = column_sums(columns) if items else {k: 0.0 for k in columns}
    metrics, counts, undefined = {}, {}, {}
    for name, formula in formulas.items():
        count = sums[formula.denominator]
        counts[name] = int(round(count))
        value = float(formula.value(sums)) if count > 0 else math.nan
        if count <= 0:
            undefined[name] = f"no {formula.unit} to score ({items} {unit} evaluated)"
            metrics[name] = None
        else:
            metrics[name] = value
    return Evaluation(
        metrics=metrics,
        counts=counts,
        units={k: f.unit for k, f in formulas.items()},
        items=items,
        unit=unit,
        undefined=undefined,
        dropped={k: int(v) for k, v in (dropped or {}).items() if v},
        columns={k: np.asarray(v) for k, v in columns.items()},
        formulas=dict(formulas),
    )


def write_items(path: Path, columns: Mapping[str, np.ndarray], step: int) -> None:
    """The per-item columns as a compressed .npz, written atomically (a reader sees the old file or
    the new one). Integral columns are stored as integers (they compress to little)."""
    path = Path(path)
    stored = {"_step": np.asarray(step)}
    for name, values in columns.items():
        values = np.asarray(values, dtype=np.float64)
        integral = values.size == 0 or (
            np.all(np.isfinite(values)) and np.all(values == np.round(values))
        )
        small = integral and (values.size == 0 or np.abs(values).max() < 2**31)
        stored[name] = values.astype(np.int32) if small else values
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **stored)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_items(path: Path) -> tuple[int | None, dict[str, np.ndarray]]:
    """(the step of the evaluation, its columns as float64 arrays) from write_items' file.
    Raises OSError or ValueError when it cannot be read."""
    with np.load(Path(path), allow_pickle=False) as data:
        step = int(data["_step"]) if "_step" in data.files else None
        return step, {k: data[k].astype(np.float64) for k in data.files if k != "_step"}
