"""What a diagnostic run recorded, gathered for the advice.

From the run's telemetry record file (telemetry.jsonl, written by mpt_repro/telemetry): per
layer and per kind ("act": gradients with respect to the layer's outputs, "weight": its
parameters' gradients), the exponent histogram of every sampled step, and the lost-update counts.
The advice pools them over the sampled steps, as the paper's Fig. 3 pools a whole FP32 run.
Nothing is re-measured: every figure of the advice is a sum of these counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mpt_repro.errors import UserError

Hist = dict[int, int]
KINDS = ("act", "weight")
KIND_NAMES = {"act": "activation gradients", "weight": "weight gradients"}


class AdviceError(UserError):
    """A folder the advice cannot read: the message names it and what to do."""


def hist_of(trimmed: dict) -> Hist:
    """{exponent: count} from the record file's {"lo", "counts"}."""
    return {trimmed["lo"] + i: int(c) for i, c in enumerate(trimmed["counts"]) if c}


def pooled(hists: Iterable[Hist]) -> Hist:
    total: Hist = {}
    for h in hists:
        for e, c in h.items():
            total[e] = total.get(e, 0) + c
    return total


@dataclass
class LayerEvidence:
    """One layer's record: a histogram per sampled step and kind, and its lost-update counts."""

    name: str
    samples: dict[str, list[Hist]] = field(default_factory=lambda: {k: [] for k in KINDS})
    zeros: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    numel: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    nonfinite: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    updates_lost: int = 0
    updates_nonzero: int = 0
    module: str | None = None  # its class (`Conv2d`); None in records older than the field

    def hist(self, kind: str) -> Hist:
        return pooled(self.samples[kind])

    @property
    def label(self) -> str:
        """The layer as its model names it: path and class (`features.3 Conv2d`, `0.0 Conv2d`),
        the path alone from an older record."""
        return f"{self.name} {self.module}" if self.module else self.name


@dataclass
class RunEvidence:
    """A run's telemetry, by layer in model order."""

    run_dir: Path
    record: dict
    steps: list[int]
    layers: dict[str, LayerEvidence]
    loss_scales: list[float]  # the loss scale the captured gradients carried, per sample
    tops: list[int | None]  # per sampled step, the top bin of all its gradients (None: none)

    def layer_label(self, layer: str) -> str:
        """A layer's readable name (LayerEvidence.label); the name itself when unknown."""
        found = self.layers.get(layer)
        return found.label if found is not None else layer

    def network(self, kind: str) -> Hist:
        """The whole network's histogram of one kind (run.json's `<kind>_grad_histogram`)."""
        return pooled(lay.hist(kind) for lay in self.layers.values())

    @property
    def precision(self) -> str:
        return str(self.record.get("precision") or "?")

    @property
    def label(self) -> str:
        r = self.record
        study = r.get("study") or r.get("experiment") or "?"
        return f"{study} / {self.precision} / {r.get('budget', '?')} / seed {r.get('seed', '?')}"


def load_evidence(run_dir: Path) -> RunEvidence:
    """The telemetry of one run directory; AdviceError (one line) when there is none to read."""
    from mpt_repro.telemetry.records import (
        BadRecords,
        read_records,
    )  # torch: only once there is a run to read

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise AdviceError(f"no such run directory: {run_dir}")
    record = _read_run_json(run_dir)
    tel = (record.get("diagnostics") or {}).get("telemetry")
    cfg_tel = (record.get("config") or {}).get("telemetry") or {}
    name = (tel or {}).get("record_file") or cfg_tel.get("record_file") or "telemetry.jsonl"
    try:
        records = read_records(run_dir / name, strict=True)
    except BadRecords as e:  # was a KeyError
        raise AdviceError(f"{e}; remove that line, or run the diagnostic again") from None
    except OSError as e:  # a FIFO is refused unopened, never waited on
        raise AdviceError(
            f"{e}: mpt-advise never opens it; remove it, or run the diagnostic again"
        ) from None
    samples = [r for r in records if r.get("mode") == "sample"]
    if not samples:
        raise AdviceError(
            f"{run_dir} has no telemetry samples ({name}): run it with telemetry=diagnostic, or "
            "let mpt-advise run one (mpt-advise experiment=... [model=custom model.target=...])"
        )
    layers: dict[str, LayerEvidence] = {}
    try:
        for r in samples:
            for layer, entry in r["layers"].items():
                evidence = layers.setdefault(layer, LayerEvidence(layer))
                _add_sample(evidence, entry, bool(r["stepped"]))
        scales = [float(s) for r in samples for s in r.get("loss_scale", {}).values()]
        tops = [_top(r) for r in samples]
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a record cut or edited
        raise AdviceError(
            f"{run_dir / name}: a sample record is incomplete ({type(e).__name__}: {e}); "
            "run the diagnostic again"
        ) from None
    return RunEvidence(run_dir, record, [r["step"] for r in samples], layers, scales, tops)


def _top(record: dict) -> int | None:
    """The top bin of every gradient of one sampled step."""
    tops = [
        e[kind]["hist"]["lo"] + len(e[kind]["hist"]["counts"]) - 1
        for e in record["layers"].values()
        for kind in KINDS
        if kind in e and e[kind]["hist"]["counts"]
    ]
    return max(tops, default=None)


def _read_run_json(run_dir: Path) -> dict:
    from mpt_repro.safeio import NotARegularFile, read_text

    path = run_dir / "run.json"
    if not (path.exists() or path.is_symlink()):
        raise AdviceError(
            f"{run_dir} is not a run directory (no run.json): give a folder mpt-run wrote"
        )
    try:
        record = json.loads(read_text(path))
    except NotARegularFile as e:
        raise AdviceError(
            f"{e.path} is {e.what}, not a run record: mpt-advise never opens it"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdviceError(f"{path} cannot be read ({e})") from None
    if not isinstance(record, dict):
        raise AdviceError(f"{path} holds a JSON {type(record).__name__}, not a run record")
    return record


def _add_sample(layer: LayerEvidence, entry: dict, stepped: bool) -> None:
    layer.module = entry.get("module") or layer.module
    for kind in KINDS:
        if kind in entry:
            e = entry[kind]
            layer.samples[kind].append(hist_of(e["hist"]))
            layer.zeros[kind] += int(e["zero"])
            layer.numel[kind] += int(e["numel"])
            layer.nonfinite[kind] += int(e["nan"]) + int(e["inf"])
    if "lost" in entry and stepped:  # a skipped step moved nothing (records.py leaves it out too)
        layer.updates_lost += int(entry["lost"]["lost"])
        layer.updates_nonzero += int(entry["lost"]["nonzero"])
