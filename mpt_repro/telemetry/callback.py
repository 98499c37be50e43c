"""TelemetryCallback: sampled gradient histograms, FP16 range fractions, lost updates, and the
first layer with a non-finite gradient (docs/telemetry.md).

Cost model: on a sampled step (one in `every`) hooks are registered in on_step_start and removed
in on_step_end; every statistic stays on the device until one host copy at the end of the step.
On every other step the callback does an integer test and reads `result.stepped` (a 0-d device
bool: with telemetry on, this is the step's one host sync, which the probe-after-overflow rule
needs); no hook, no kernel.

Order of one trainer iteration: on_step_start(step) -> task.train_step (forward, opt.backward,
opt.step) -> on_step_end(step', result). The trainer passes the iterations done before the step
to on_step_start and after it to on_step_end; a sample is recorded under the latter (the step
metrics.csv uses). Gradients are therefore captured while backward accumulates them, because
opt.step unscales, steps and may drop them before on_step_end.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mpt_repro.telemetry import mx_counts
from mpt_repro.telemetry import numerics as nx
from mpt_repro.telemetry.config import validate_telemetry


def _tensors(obj: Any) -> list[Tensor]:
    """The tensors in a module's inputs or outputs (tuples, lists, dicts, e.g. an LSTM's (out, (h,
    c))).
    """
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _grad_tensors(obj: Any) -> list[Tensor]:
    return [t for t in _tensors(obj) if t.is_floating_point() and t.requires_grad]


@dataclass
class Layer:
    """A module the callback hooks: which model it is in and its name in the records."""

    model: str
    name: str
    module: nn.Module
    weighted: bool  # own parameters: activation-gradient histograms (else only located)


@dataclass
class ParamRef:
    model: str
    param: str  # its name in the model
    layer: str  # the record's layer name


@dataclass
class LayerTable:
    layers: list[Layer] = field(default_factory=list)
    params: dict[int, ParamRef] = field(default_factory=dict)  # by id(parameter)

    def model_of(self, layer: str) -> str:
        return next(lay.model for lay in self.layers if lay.name == layer)


class _Capture:
    """Everything hooked and gathered during one sampled (or probe) step."""

    def __init__(self, mode: str):
        self.mode = mode  # "sample": full statistics; "probe": only where a gradient went bad
        self.handles: list = []
        self.forward: list[tuple[str, Tensor]] = []  # (layer, max |output|), forward order
        # backward: groups of hooks that saw the same gradient tensor, in firing order;
        # each group is (max |grad|, [(layer, "grad_output" | "grad_input"), ...])
        self.groups: list[tuple[Tensor, list[tuple[str, str]]]] = []
        self.last_grad: Tensor | None = None  # held so the `is` test below cannot see a reused id
        self.act: dict[str, Tensor] = {}  # layer -> summed count vector of its output gradients
        self.weight: dict[str, tuple[str, Tensor]] = {}  # param name -> (layer, count vector)
        self.snapshot: list[tuple[str, Tensor, Tensor]] = []  # (layer, FP32 param, copy before)
        self.divide_by: dict[str, float] = {}  # model -> loss scale the captured gradients carry
        self.scale: dict[str, float] = {}  # model -> scale the *_scaled fractions apply
        # layer -> [flushed, numel] of its FP16 backward's input and weight gradients
        self.flushed: dict[str, Tensor] = {}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.last_grad = None


FLUSHED_KEYS = ("act", "act_numel", "weight", "weight_numel")


def flushed_summary(records: list[dict]) -> dict:
    """{"act_grad_flushed": {"last", "mean", "max"}, "weight_grad_flushed": ...}: per sampled
    step, the share of the FP16 backward's input (weight) gradient values of the Linear and
    Conv2d layers that it flushed to zero (numerics.backward_flush_counts); absent when no such
    layer computed in FP16."""
    series: dict[str, list[float]] = {"act": [], "weight": []}
    for r in records:
        entries = [e["flushed"] for e in r.get("layers", {}).values() if "flushed" in e]
        for kind in series:
            numel = sum(e[f"{kind}_numel"] for e in entries)
            if r["mode"] == "sample" and numel:
                series[kind].append(sum(e[kind] for e in entries) / numel)
    return {
        f"{kind}_grad_flushed": {"last": v[-1], "mean": sum(v) / len(v), "max": max(v)}
        for kind, v in series.items()
        if v
    }


class TelemetryCallback:
    """Trainer callback, added when cfg.telemetry.enabled: ``TelemetryCallback(cfg.telemetry)``."""

    def __init__(self, cfg: Any):
        validate_telemetry(cfg)
        self.cfg = cfg
        self.every = int(cfg.every)
        self.what_if = None if cfg.what_if_scale is None else float(cfg.what_if_scale)
        self._cap: _Capture | None = None
        self.records: list[dict] = []  # kept only when there is no run directory to write to
        self.record_path: Path | None = None
        self._reset()

    def _reset(self) -> None:
        self.samples = 0
        self.probes = 0
        self.skips_seen = 0
        self._probe_next = False
        self.first_nonfinite: dict | None = None
        self.figure_paths: list[str] = []

    # -- trainer hooks
    # ------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any) -> None:
        self._reset()
        run_dir = getattr(trainer, "run_dir", None)
        self.record_path = Path(run_dir) / self.cfg.record_file if run_dir is not None else None
        self._layers = self._layer_table(trainer)

    def on_step_start(self, trainer: Any, step: int) -> None:
        if self._cap is not None:  # a step that raised before on_step_end: never leave hooks behind
            self._cap.remove()
            self._cap = None
        if step % self.every == 0:
            self._arm(trainer, "sample")
        elif self._probe_next:
            self._probe_next = False
            self._arm(trainer, "probe")

    def on_step_end(self, trainer: Any, step: int, result: Any) -> None:
        cap, self._cap = self._cap, None
        stepped = bool(result.stepped)  # the one host read per step (see the module docstring)
        if not stepped:
            self.skips_seen += 1
        if cap is None:
            # A skipped step (overflow) that was not hooked: hook the next one to see where the
            # gradient goes bad, fairseq-NanDetector style.
            if not stepped and self.probes < int(self.cfg.probe_limit):
                self._probe_next = True
            return
        cap.remove()
        record = self._gather(trainer, cap, step, result)
        self._emit(trainer, record)

    def on_fit_end(self, trainer: Any, summary: dict) -> None:
        if self._cap is not None:
            self._cap.remove()
            self._cap = None
        from mpt_repro.telemetry.records import read_records, summarize

        records = read_records(self.record_path) if self.record_path is not None else self.records
        if self.cfg.figures and self.record_path is not None and records:
            try:
                from mpt_repro.telemetry.figures import draw_figures

                self.figure_paths = [p.name for p in draw_figures(self.record_path.parent, records)]
            except Exception as e:  # a figure must never fail a finished run
                trainer.log.warning("telemetry: figures not drawn: %s", e)
        tel = summarize(records, every=self.every)
        tel["record_file"] = self.cfg.record_file if self.record_path is not None else None
        tel["figures"] = self.figure_paths
        tel["skipped_steps_seen"] = self.skips_seen
        if (mx := mx_counts.summarize(records)) is not None:
            tel["mx"] = mx
        tel["network"].update(flushed_summary(records))
        summary["telemetry"] = tel

    # -- arming the hooks
    # ---------------------------------------------------------------------------
    def _layer_table(self, trainer: Any) -> LayerTable:
        """Which modules to hook, their layer names, and which model each belongs to."""
        models: dict[str, nn.Module] = trainer.task.models
        prefix = len(models) > 1  # one model: plain module names; several: "<model>.<module>"
        table = LayerTable()

        def layer_name(mname: str, name: str) -> str:
            return ".".join(x for x in (mname if prefix else "", name) if x) or mname

        for mname, model in models.items():
            for name, m in model.named_modules():
                direct = any(True for _ in m.parameters(recurse=False))
                leaf = not any(True for _ in m.children())
                if not (leaf or direct):
                    continue  # containers: their leaves are hooked
                table.layers.append(Layer(mname, layer_name(mname, name), m, weighted=direct))
            for pname, p in model.named_parameters():
                mod = pname.rsplit(".", 1)[0] if "." in pname else ""
                table.params[id(p)] = ParamRef(mname, pname, layer_name(mname, mod))
        return table

    def _arm(self, trainer: Any, mode: str) -> None:
        cap = _Capture(mode)
        task = trainer.task
        for mname in task.models:
            opt = task.optimizers.get(mname) if mname in task.optimizers else None
            if opt is None and len(task.optimizers) == 1:
                opt = next(iter(task.optimizers.values()))
            s = float(opt.loss_scale) if opt is not None else 1.0
            cap.divide_by[mname] = s
            cap.scale[mname] = self.what_if if self.what_if is not None else s
        full = mode == "sample"
        if full:
            mx_counts.arm(task.models)  # MX layers count their blocks (issue 46)
        for lay in self._layers.layers:
            hist = full and lay.weighted and self.cfg.activations
            cap.handles.append(
                lay.module.register_forward_hook(
                    partial(self._forward_hook, cap, lay.model, lay.name, hist)
                )
            )
        if full and self.cfg.weights:
            for model in task.models.values():
                for p in model.parameters():
                    if p.requires_grad:
                        cap.handles.append(
                            p.register_post_accumulate_grad_hook(partial(self._weight_hook, cap))
                        )
        if full and self.cfg.lost_updates:
            cap.snapshot = self._snapshot(task)
        self._cap = cap

    def _snapshot(self, task: Any) -> list[tuple[str, Tensor, Tensor]]:
        """FP32 copies of the weights the optimizers update (the masters when there are masters).

        Optimizer params are named through the model: the same tensor, or else (FP32 masters,
        built by PrecisionPolicy in model.named_parameters() order) by position when the count
        and the shapes match.
        """
        out = []
        params = self._layers.params
        for oname, opt in task.optimizers.items():
            ops = [p for g in opt.param_groups for p in g["params"]]
            model = task.models.get(oname) or (
                next(iter(task.models.values())) if len(task.models) == 1 else None
            )
            mps = [p for p in model.parameters() if p.requires_grad] if model is not None else []
            by_position = len(mps) == len(ops) and all(a.shape == b.shape for a, b in zip(mps, ops))
            for i, p in enumerate(ops):
                ref = params.get(id(p)) or (params.get(id(mps[i])) if by_position else None)
                layer = ref.layer if ref else f"{oname}.param{i}"
                out.append((layer, p, p.detach().float().clone()))
        return out

    # -- the hooks (sampled and probe steps only)
    # ---------------------------------------------------
    def _forward_hook(
        self,
        cap: _Capture,
        mname: str,
        layer: str,
        hist: bool,
        module: nn.Module,
        args: Any,
        output: Any,
    ) -> None:
        if not torch.is_grad_enabled():
            return
        outs = _grad_tensors(output)
        if hist and len(outs) == 1 and outs[0].dtype == torch.float16 and args:
            if nx.flush_hookable(module) and torch.is_tensor(args[0]):
                outs[0].register_hook(partial(self._flush_hook, cap, layer, module, args[0]))
        for t in outs:
            cap.forward.append((layer, t.detach().abs().amax().float()))
            t.register_hook(partial(self._grad_hook, cap, mname, layer, "grad_output", hist))
        for t in _grad_tensors(args):
            # an in-place module's input IS its output (already hooked): that gradient is not the
            # one this module's backward produced
            if not any(t is o for o in outs):
                t.register_hook(partial(self._grad_hook, cap, mname, layer, "grad_input", False))

    def _grad_hook(
        self, cap: _Capture, mname: str, layer: str, where: str, hist: bool, grad: Tensor
    ) -> None:
        # Hooks on one tensor fire one after the other with the same gradient object: they form a
        # group, whose max is computed once.
        if grad is cap.last_grad and cap.groups:
            cap.groups[-1][1].append((layer, where))
        else:
            cap.last_grad = grad
            cap.groups.append((grad.detach().abs().amax().float(), [(layer, where)]))
        if hist:
            c = nx.all_counts(grad, cap.divide_by[mname], cap.scale[mname])
            cap.act[layer] = (
                cap.act[layer] + c if layer in cap.act else c
            )  # a layer used twice: summed

    def _flush_hook(
        self, cap: _Capture, layer: str, module: nn.Module, x: Tensor, grad: Tensor
    ) -> None:
        # what this layer's FP16 backward flushes to zero, where it happens (counted on the
        # run's own gradients, so a no_scaling run and a scaled one can be compared)
        c = nx.backward_flush_counts(module, x, grad)
        cap.flushed[layer] = cap.flushed[layer] + c if layer in cap.flushed else c

    def _weight_hook(self, cap: _Capture, p: Tensor) -> None:
        ref = self._layers.params[id(p)]
        mname, pname, layer = ref.model, ref.param, ref.layer
        # fires at every accumulation into .grad: the last call holds the total of the step
        cap.weight[pname] = (
            layer,
            nx.all_counts(p.grad, cap.divide_by[mname], cap.scale[mname]),
        )

    # -- after the step: one host copy, then plain Python
    # -------------------------------------------
    def _gather(self, trainer: Any, cap: _Capture, step: int, result: Any) -> dict:
        stepped = bool(result.stepped)
        lost: dict[str, Tensor] = {}
        if stepped:  # a skipped step changed nothing: no update to lose
            with torch.no_grad():
                for layer, p, before in cap.snapshot:
                    c = nx.lost_update_counts(before, p.detach().float() - before)
                    lost[layer] = lost[layer] + c if layer in lost else c
        weight: dict[str, Tensor] = {}
        for layer, c in cap.weight.values():
            weight[layer] = weight[layer] + c if layer in weight else c
        # one transfer for everything
        keys = [("act", k) for k in cap.act] + [("weight", k) for k in weight]
        counts = (
            torch.stack([cap.act[k] if kind == "act" else weight[k] for kind, k in keys])
            .cpu()
            .tolist()
            if keys
            else []
        )
        lost_host = torch.stack(list(lost.values())).cpu().tolist() if lost else []
        fwd = torch.stack([a for _, a in cap.forward]).cpu().tolist() if cap.forward else []
        bwd = torch.stack([a for a, _ in cap.groups]).cpu().tolist() if cap.groups else []
        loss = float(result.loss)

        found: dict[str, dict] = {}
        for (kind, layer), c in zip(keys, counts):
            c, formats = nx.split_counts(c)  # FP16's counts, and E5M2/E4M3's (issue 16)
            entry = {"hist": nx.trim_histogram(nx.histogram_list(c)), **nx.count_dict(c)}
            entry["formats"] = formats
            found.setdefault(layer, {})[kind] = entry
        self._add_flushed(cap, found)
        for layer, c in zip(lost.keys(), lost_host):
            found.setdefault(layer, {})["lost"] = {"lost": c[0], "nonzero": c[1], "numel": c[2]}
        for layer, kinds in mx_counts.gather(trainer.task.models).items():
            found.setdefault(layer, {})["mx"] = kinds  # what MX blocks did (mx_counts)
        layers = self._in_model_order(found)
        record = {
            "step": step,
            "mode": cap.mode,
            "stepped": stepped,
            "loss": loss if math.isfinite(loss) else str(loss),
            "loss_scale": cap.divide_by,
            "scale_shown": cap.scale,
            "layers": layers,
            "nonfinite": self._locate(cap, fwd, bwd, lambda v: not math.isfinite(v)),
            "overflow": self._locate(cap, [], bwd, lambda v: v > nx.FP16_MAX, scaled=True),
        }
        if cap.mode == "probe" and record["nonfinite"] is None and bwd:
            # the overflow did not come back (the scale was lowered): name the layer with the least
            # headroom below 65504 instead, an estimate of where it happened
            i = max(range(len(bwd)), key=lambda j: bwd[j] if math.isfinite(bwd[j]) else -1.0)
            layer, where = self._blame(cap.groups[i][1])
            record["least_headroom"] = {
                "layer": layer,
                "where": where,
                "max_abs_grad": bwd[i],
                "headroom_log2": math.log2(nx.FP16_MAX / bwd[i]) if bwd[i] > 0 else None,
            }
        return record

    @staticmethod
    def _add_flushed(cap: _Capture, found: dict[str, dict]) -> None:
        """Each layer's counts of what its FP16 backward flushed to zero, into its entry."""
        if cap.flushed:
            host = torch.stack(list(cap.flushed.values())).cpu().tolist()
            for layer, c in zip(cap.flushed.keys(), host):
                found.setdefault(layer, {})["flushed"] = dict(zip(FLUSHED_KEYS, c))

    def _in_model_order(self, found: dict[str, dict]) -> dict[str, dict]:
        """The layers' entries in model (forward) order, so figures read input to output, unnamed
        optimizer params last; each hooked module's entry names its class ("module": "Conv2d"),
        so a reader can show `features.3 Conv2d` where the path alone is `0.0` in a Sequential."""
        order = [lay for lay in self._layers.layers if lay.name in found]
        for lay in order:
            found[lay.name]["module"] = type(lay.module).__name__
        names = [lay.name for lay in order]
        return {layer: found[layer] for layer in names + [k for k in found if k not in names]}

    @staticmethod
    def _blame(labels: list[tuple[str, str]]) -> tuple[str, str]:
        """The layer a bad gradient group points at: the module whose backward produced it (a
        grad_input label) if one is hooked, else the layer it arrived at (from the loss or
        unhooked functional ops after that layer)."""
        for layer, where in labels:
            if where == "grad_input":
                return layer, where
        return labels[0]

    def _locate(
        self, cap: _Capture, fwd: list[float], bwd: list[float], bad, scaled: bool = False
    ) -> dict | None:
        """First forward output, else first backward gradient (in backward order) that is bad."""
        for (layer, _), v in zip(cap.forward, fwd):
            if bad(v):
                return {"layer": layer, "pass": "forward", "where": "output", "value": str(v)}
        for (_amax, labels), v in zip(cap.groups, bwd):
            if scaled:
                # the captured gradient carries the run's loss scale; show the what-if scale instead
                mname = self._layers.model_of(labels[0][0])
                v = v / cap.divide_by[mname] * cap.scale[mname]
            if bad(v):
                layer, where = self._blame(labels)
                out = {
                    "layer": layer,
                    "pass": "backward",
                    "where": where,
                    "value": str(v) if not math.isfinite(v) else v,
                }
                others = [name for name, w in labels if w == "grad_input" and name != layer]
                if others:
                    out["or"] = others  # the gradient was the sum over several consumers
                return out
        return None

    # -- output
    # --------------------------------------------------------------------------------------
    def _emit(self, trainer: Any, record: dict) -> None:
        if record["mode"] == "sample":
            self.samples += 1
        else:
            self.probes += 1
        if record["nonfinite"] is not None and self.first_nonfinite is None:
            self.first_nonfinite = {"step": record["step"], **record["nonfinite"]}
            nf = record["nonfinite"]
            trainer.log.warning(
                "telemetry: first non-finite value at step %d: %s pass, %s of layer %r (%s)",
                record["step"],
                nf["pass"],
                nf["where"],
                nf["layer"],
                nf["value"],
            )
        elif record.get("least_headroom"):
            lh = record["least_headroom"]
            trainer.log.info(
                "telemetry: probe after a skipped step (step %d): no overflow this time; least "
                "headroom in %s of %r (2^%.1f below 65504)",
                record["step"],
                lh["where"],
                lh["layer"],
                lh["headroom_log2"] if lh["headroom_log2"] is not None else float("nan"),
            )
        if self.record_path is not None:
            self.record_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.record_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        else:
            self.records.append(record)
        if record["mode"] == "sample":
            self._log_sample(trainer, record)

    def _log_sample(self, trainer: Any, record: dict) -> None:
        from mpt_repro.telemetry.records import network_counts, write_tensorboard

        step, writer = record["step"], getattr(trainer, "writer", None)
        net = network_counts(record)
        parts = []
        for kind in ("act", "weight"):
            if kind in net:
                f = nx.fractions_of(net[kind])
                parts.append(
                    f"{kind}-grad underflow {f['underflow']:.2%} (scaled "
                    f"{f['underflow_scaled']:.2%}), "
                    f"overflow scaled {f['overflow_scaled']:.2%}"
                )
        if "lost" in net:
            parts.append(f"lost updates {nx.lost_fraction(net['lost']):.2%}")
        if (mx := mx_counts.log_text(record)) is not None:
            parts.append(mx)
        trainer.log.info("telemetry step %d: %s", step, "; ".join(parts) or "no gradients seen")
        if writer is not None:
            write_tensorboard(
                writer, record, net, self.cfg.layer_scalars, self.cfg.layer_histograms
            )
