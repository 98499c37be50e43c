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
  the formulas the record states, without importing the task;
- what the evaluation dropped is counted by reason (`dropped`): items of the evaluation data left
  out before scoring (a task's `eval_dropped`: pairs longer than the largest bucket, utterances
  without a reference) and items evaluated but left out of a loss or a metric (a
  `dropped_<reason>` column: a clip too short for its transcript). `dropped_share` is their share
  of the evaluation data; above DROPPED_WARN_SHARE the closing block and the report say so.

Nothing here imports torch.
"""

from __future__ import annotations

import math
import os
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpt_repro.errors import naming

ITEMS_FILE = "eval_items.npz"  # the last evaluation's per-item columns, beside run.json
# A column named DROPPED_PREFIX + reason holds 1 for each evaluated item that a loss or a metric
# left out for that reason (e.g. `dropped_ctc_infeasible`: a clip too short for its transcript,
# whose CTC loss is zeroed); its sum joins the evaluation's `dropped` counts.
DROPPED_PREFIX = "dropped_"
# Above this share of the evaluation data's items dropped (left out before scoring, or by a loss
# or a metric), the closing block and the report say so: the metric describes a subset that may
# differ from the data set it is named after. 5 %: at that share a subset chosen by length (the
# usual reason) can move a corpus metric by more than the differences the paper discusses.
DROPPED_WARN_SHARE = 0.05
# the largest log-perplexity turned into a perplexity (exp overflows a float past ~709)
MAX_LOG = 700.0
# columns that depend on the data alone, not on the model: two runs whose values differ did not
# evaluate the same items (the reporter checks them before it resamples items across runs)
KEY_COLUMNS = ("key", "index", "label", "tokens", "bleu_ref_len", "chars", "words")
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

    def undefined(self, sums: Mapping[str, Any], items: int, item_unit: str) -> str | None:
        """Why the metric has no value over these sums (None: it has one)."""
        if sums[self.denominator] <= 0:
            return f"no {self.unit} to score ({items} {item_unit} evaluated)"
        return None

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

    def undefined(self, sums: Mapping[str, Any], items: int, item_unit: str) -> str | None:
        """Why BLEU has no value: nothing evaluated, or references without a word (BLEU's
        brevity penalty and precisions compare against reference words)."""
        if sums[self.denominator] <= 0:
            return f"no {self.unit} to score ({items} {item_unit} evaluated)"
        if sums["bleu_ref_len"] <= 0:
            return f"the references hold no words ({items} {item_unit} evaluated)"
        return None

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


def bleu_statistics(hypotheses: list[str], references: list[str]) -> dict[str, list[int]]:
    """Each sentence's BLEU statistics (BLEU_COLUMNS: hypothesis and reference lengths, matching
    and total n-grams per order), as sacrebleu counts them for its corpus BLEU over the same
    tokens (tokenize="none"): summed over sentences, `Bleu` gives sacrebleu's corpus score."""
    from sacrebleu.metrics.bleu import BLEU

    # effective_order changes a sentence's score only, not its statistics (and keeps sacrebleu
    # from warning on every sentence)
    bleu = BLEU(tokenize="none", effective_order=True)
    out: dict[str, list[int]] = {c: [] for c in BLEU_COLUMNS}
    for hyp, ref in zip(hypotheses, references, strict=True):
        s = bleu.sentence_score(hyp, [ref])
        out["bleu_sys_len"].append(int(s.sys_len))
        out["bleu_ref_len"].append(int(s.ref_len))
        for n in range(1, BLEU_ORDER + 1):
            out[f"bleu_correct_{n}"].append(int(s.counts[n - 1]))
            out[f"bleu_total_{n}"].append(int(s.totals[n - 1]))
    return out


def text_key(text: str) -> int:
    """A key naming an item by its text (a reference sentence or transcript): CRC-32 below 2^31,
    the same in every process and run (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


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
    # items dropped, by reason: left out before scoring (e.g. pairs longer than the largest
    # bucket: not in `items`), or evaluated but left out of a loss or a metric (a `dropped_*`
    # column: in `items`)
    dropped: dict[str, int]
    columns: dict[str, np.ndarray] | None  # per-item statistics (None: the task keeps none)
    formulas: dict[str, Formula] | None
    # the items of the evaluation data: those evaluated and those left out before scoring
    data_items: int | None = None
    # the column that names each item (a label, a hash of the reference): two runs scored the
    # same items only where their key columns are equal (None: the task has none)
    key: str | None = None

    def record(self, step: int, items_file: str | None) -> dict[str, Any]:
        """run.json's `evaluation` block."""
        return {
            "step": step,
            "unit": self.unit,
            "items": self.items,
            "data_items": self.data_items,
            "counts": self.counts,
            "units": self.units,
            "undefined": self.undefined,
            "dropped": self.dropped,
            "items_file": items_file,
            "key": self.key,
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


def _uneven(columns: Mapping[str, np.ndarray]) -> str:
    """Which per-item columns differ in length, by name: an empty one is a column the task's
    eval_step never returned (its formulas name it)."""
    shown = ", ".join(f"{k}: {len(v)}" for k, v in columns.items())
    empty = [k for k, v in columns.items() if len(v) == 0]
    why = (
        f"the task's eval_step returned no {', '.join(empty)} column, which its metrics' "
        "formulas read"
        if empty
        else "the task's eval_step must return one value per evaluated item in each"
    )
    return f"per-item columns of different lengths ({shown} items): {why}"


def from_columns(
    columns: Mapping[str, np.ndarray],
    formulas: Mapping[str, Formula],
    unit: str,
    dropped: Mapping[str, int] | None = None,
    key: str | None = None,
) -> Evaluation:
    """An Evaluation from per-item columns (every column one value per item). `dropped`: the
    items of the evaluation data left out before scoring, by reason; the sums of the
    `dropped_<reason>` columns (items evaluated but left out of a loss or a metric) join them.
    `key`: the column naming each item, if any."""
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(_uneven(columns))
    items = lengths.pop() if lengths else 0
    sums = column_sums(columns) if items else {k: 0.0 for k in columns}
    metrics, counts, undefined = {}, {}, {}
    for name, formula in formulas.items():
        counts[name] = int(round(formula.count(sums)))
        why = formula.undefined(sums, items, unit)
        value = float(formula.value(sums)) if why is None else math.nan
        if why is not None:
            undefined[name], metrics[name] = why, None
        else:
            metrics[name] = value
    left_out = {k: int(v) for k, v in (dropped or {}).items() if v}
    in_scoring = {
        k[len(DROPPED_PREFIX) :]: int(round(v))
        for k, v in sums.items()
        if k.startswith(DROPPED_PREFIX) and v
    }
    return Evaluation(
        metrics=metrics,
        counts=counts,
        units={k: f.unit for k, f in formulas.items()},
        items=items,
        unit=unit,
        undefined=undefined,
        dropped={**left_out, **in_scoring},
        columns={k: np.asarray(v) for k, v in columns.items()},
        formulas=dict(formulas),
        data_items=items + sum(left_out.values()),
        key=key,
    )


def dropped_share(evaluation: Mapping[str, Any] | None) -> float:
    """The share of the evaluation data's items that were dropped (left out before scoring, or
    by a loss or a metric), from run.json's `evaluation` block: 0.0 when nothing was dropped or
    there is no block. Above DROPPED_WARN_SHARE the closing block and the report say so. Counts
    of different reasons add up (an item is left out for one reason before scoring, so only an
    item dropped by two metrics could count twice: the share errs on the side of a warning)."""
    if not evaluation:
        return 0.0
    dropped = sum(int(v) for v in (evaluation.get("dropped") or {}).values())
    if not dropped:
        return 0.0
    held = evaluation.get("data_items")
    if held is None:  # a block without it: the evaluated items and every drop
        held = int(evaluation.get("items") or 0) + dropped
    return dropped / held if held > 0 else 1.0


def describe_dropped(evaluation: Mapping[str, Any] | None) -> str | None:
    """One sentence for a drop share above DROPPED_WARN_SHARE (None at or below it), e.g.
    "12 of 200 sentences (6.0 %) dropped: 12 longer_than_largest_bucket"."""
    share = dropped_share(evaluation)
    if share <= DROPPED_WARN_SHARE or not evaluation:
        return None
    dropped = {k: int(v) for k, v in (evaluation.get("dropped") or {}).items() if v}
    held = evaluation.get("data_items")
    of = f" of {held} {evaluation.get('unit') or 'items'}" if held is not None else ""
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items()))
    return (
        f"{sum(dropped.values())}{of} ({100 * share:.1f} %) dropped: {reasons} (more than "
        f"{100 * DROPPED_WARN_SHARE:g} %: the metrics may not describe the whole evaluation set)"
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
    except OSError as e:  # a failed write names no file: this one
        Path(tmp).unlink(missing_ok=True)
        raise naming(e, path) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_items(path: Path) -> tuple[int | None, dict[str, np.ndarray]]:
    """(the step of the evaluation, its columns as float64 arrays) from write_items' file.
    Raises OSError (NotARegularFile for a FIFO: never waited on) or ValueError saying what the
    file is when it cannot be read; never numpy's advice to load a pickle."""
    from mpt_repro.safeio import open_regular

    try:
        with open_regular(path, "rb") as f, np.load(f, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError(
                    "a single .npy array, not the .npz archive of columns mpt-run writes"
                )
            step = int(data["_step"]) if "_step" in data.files else None
            return step, {k: data[k].astype(np.float64) for k in data.files if k != "_step"}
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:
        raise ValueError(f"not a complete .npz archive, cut short or damaged ({err})") from None
    except ValueError as err:
        if "pickle" not in str(err):
            raise
        raise ValueError(
            "it holds pickled Python objects, not the number columns mpt-run writes; it was not "
            "loaded"
        ) from None
