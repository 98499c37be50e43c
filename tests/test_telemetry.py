"""Numerics telemetry: exact counts, exact lost updates, hooks only on sampled steps, the
first non-finite layer, and the records, summary and figures of a short hand-driven fit."""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mpt_repro.errors import ConfigError
from mpt_repro.telemetry import TelemetryCallback, TelemetryConfig
from mpt_repro.telemetry import numerics as nx
from mpt_repro.telemetry.figures import FIGURES
from mpt_repro.telemetry.figures import main as figures_main
from mpt_repro.telemetry.records import layer_labels, read_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- numerics: exact on hand-built tensors ---------------------------------------------------------
def _known_tensor() -> torch.Tensor:
    """Values with known exponents (signs mixed: only magnitudes count)."""
    vals = (
        [0.0] * 3  # zero
        + [2.0**-30, -(2.0**-30)]  # exponent -30: underflow
        + [1.5 * 2.0**-25]  # exponent -25: underflow (rounds up in FP16, still lost)
        + [2.0**-24]  # exponent -24: the smallest subnormal, kept
        + [-(2.0**-20)] * 4  # exponent -20: subnormal
        + [1.0] * 5  # exponent 0: normal
        + [65504.0]  # exponent 15: the largest FP16, no overflow
        + [70000.0, -70000.0]  # exponent 16: overflow
        + [float("inf"), float("nan")]
        + [2.0**-140]
    )  # an FP32 subnormal: exponent -140, underflow
    return torch.tensor(vals, dtype=torch.float32)


def test_histogram_bins_and_fractions_are_exact():
    c = nx.tensor_counts(_known_tensor())
    hist = nx.histogram_list(c.tolist())
    expected = {-140: 1, -30: 2, -25: 1, -24: 1, -20: 4, 0: 5, 15: 1, 16: 2}
    assert {nx.EXP_MIN + i: v for i, v in enumerate(hist) if v} == expected
    d = nx.count_dict(c.tolist())
    assert d == {
        "numel": 22,
        "zero": 3,
        "nan": 1,
        "inf": 1,
        "underflow": 4,
        "subnormal": 5,
        "overflow": 3,  # overflow: 70000 x2 and inf
        "underflow_scaled": 4,
        "subnormal_scaled": 5,
        "overflow_scaled": 3,
    }
    f = nx.fractions_of(d)
    assert f["underflow"] == 4 / 22 and f["zero"] == 3 / 22 and f["overflow"] == 3 / 22


def test_the_histogram_box_gives_shares_of_the_nonzero_finite_values_and_says_so():
    """mpt-advise's denominator (the nonzero finite values), named in the box: of the 22 values
    above, 3 are zero and 2 non-finite, so 4 underflows are 4/17 (4/22 of all once read as the
    share FP16 loses, beside the advice's larger figure of the same gradients)."""
    from mpt_repro.telemetry.figures import _histogram_text

    text = _histogram_text(nx.count_dict(nx.tensor_counts(_known_tensor()).tolist()), 1.0)
    assert "of the 17 nonzero finite:" in text
    assert f"lost in FP16 (< 2^-24): {100 * 4 / 17:.2f}%" in text
    assert f"overflow: {100 * 2 / 17:.3f}%" in text  # 70000 twice; the inf is non-finite
    assert f"non-finite: {100 * 2 / 22:.3f}% of all" in text


def test_scaled_fractions_apply_the_scale_and_divide_by_recovers_true_values():
    x = _known_tensor()
    c = nx.count_dict(nx.tensor_counts(x, scale=2.0**10).tolist())
    # times 2^10: 2^-30 -> 2^-20 and 1.5*2^-25 -> 1.5*2^-15 become subnormal, 2^-24 and 2^-20 become
    # normal, 2^-140 stays lost; 1.0 -> 1024 fine; 65504 -> overflow
    assert c["underflow_scaled"] == 1 and c["subnormal_scaled"] == 3 and c["overflow_scaled"] == 4
    assert c["underflow"] == 4  # the unscaled counts do not move
    # a gradient captured with loss scale 2^8 and divided back gives the same histogram
    scaled = nx.tensor_counts(x * 2.0**8, divide_by=2.0**8)
    assert torch.equal(nx.histogram(scaled), nx.histogram(nx.tensor_counts(x)))


def test_fp16_tensor_is_counted_as_its_fp32_value():
    x = torch.tensor([2.0**-24, 2.0**-15, 3.0, 0.0], dtype=torch.float16)
    d = nx.count_dict(nx.tensor_counts(x).tolist())
    assert d["subnormal"] == 2 and d["zero"] == 1 and d["underflow"] == 0


def test_trim_roundtrip():
    hist = nx.histogram_list(nx.tensor_counts(_known_tensor()).tolist())
    assert nx.untrim_histogram(nx.trim_histogram(hist)) == hist
    assert nx.trim_histogram([0] * nx.N_BINS) == {"lo": 0, "counts": []}


def test_lost_updates_are_exact_on_hand_built_weights():
    w = torch.tensor([1.0, 1.0, 1.0, 2048.0, 2048.0, 0.0, 0.0, 2.0**-20, 5.0])
    u = torch.tensor(
        [
            2.0**-12,  # below half an ulp of 1.0 (2^-11): lost
            2.0**-11,  # exactly half an ulp: counted as kept
            2.0**-10,  # one ulp: kept
            0.5,  # 2048 / 0.5 = 4096 > 2048: lost (half ulp of 2048 is 1)
            1.0,  # exactly half an ulp: kept
            2.0**-26,  # on a zero weight: below 2^-25, lost
            2.0**-25,  # exactly half the smallest subnormal: kept
            2.0**-26,  # subnormal weight: spacing 2^-24, lost
            0.0,
        ]
    )  # no update: not an update at all
    lost, nonzero, numel = nx.lost_update_counts(w, u).tolist()
    assert (lost, nonzero, numel) == (4, 8, 9)
    assert nx.lost_fraction({"lost": lost, "nonzero": nonzero}) == 0.5


def test_lost_update_matches_fp16_addition_away_from_ties():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(20000, generator=g) * 4
    u = torch.randn(20000, generator=g) * torch.exp2(
        torch.randint(-30, -2, (20000,), generator=g).float()
    )
    half = nx.fp16_half_ulp(w)
    away = (u.abs() / half - 1).abs() > 0.01  # ties round to even: leave them out
    w16 = w.half()
    unchanged = (w16.float() + u).half() == w16  # what an FP16 weight update would do
    lost = (u != 0) & (u.abs() < half)
    assert torch.equal(lost[away], unchanged[away])
    assert 0 < int(lost.sum()) < len(u)  # both cases occur


def test_config_is_validated():
    with pytest.raises(ConfigError, match="telemetry.every"):
        TelemetryCallback(TelemetryConfig(enabled=True, every=0))
    with pytest.raises(ConfigError, match="what_if_scale"):
        TelemetryCallback(TelemetryConfig(enabled=True, what_if_scale=-1.0))


# -- the callback, driven in the trainer's order by a minimal fake trainer
# --------------------------
class Blowup(nn.Module):
    """Identity forward; backward multiplies the gradient by `factor` (an injected overflow)."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return _Mul.apply(x, self.factor)


class _Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


class NaNForward(nn.Module):
    def forward(self, x):
        return x * float("nan")


def tiny_model(middle: nn.Module | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [
        ("fc1", nn.Linear(4, 8)),
        ("bn", nn.BatchNorm1d(8)),
        ("relu", nn.ReLU(inplace=True)),
        ("fc2", nn.Linear(8, 8)),
    ]
    if middle is not None:
        layers.append(("boom", middle))
    layers += [("fc3", nn.Linear(8, 3))]
    return nn.Sequential(OrderedDict(layers))


class FakeTrainer:
    """The attributes the callback uses, and a train step in the trainer's call order."""

    def __init__(self, model, run_dir: Path | None, scale: float = 1.0, writer=None):
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.model, self.scale = model, scale
        self.task = SimpleNamespace(models={"model": model}, optimizers={"model": self.opt})
        self.opt.loss_scale = scale  # what the callback reads from a PrecisionOptimizer
        self.writer, self.run_dir, self.log = writer, run_dir, logging.getLogger("test_telemetry")
        self.step = 0

    def train_step(self, skip: bool = False):
        g = torch.Generator().manual_seed(self.step)
        x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
        self.opt.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        (loss * self.scale).backward()  # as the policy: scaled backward, then unscale and step
        finite = all(torch.isfinite(p.grad).all() for p in self.model.parameters())
        stepped = finite and not skip
        if stepped:
            for p in self.model.parameters():
                p.grad /= self.scale
            self.opt.step()
        return SimpleNamespace(loss=loss.detach(), stepped=stepped, samples=16, logs={})

    def fit(self, cb, steps: int, skip_at: tuple = ()) -> dict:
        cb.on_fit_start(self)
        for _ in range(steps):
            cb.on_step_start(self, self.step)
            result = self.train_step(skip=self.step in skip_at)
            self.step += 1
            cb.on_step_end(self, self.step, result)
        summary: dict = {}
        cb.on_fit_end(self, summary)
        return summary


class CountingWriter:
    def __init__(self):
        self.scalars: dict[str, list] = {}
        self.histograms: list[str] = []

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, []).append((step, value))

    def add_histogram_raw(self, tag, **kw):
        assert len(kw["bucket_limits"]) == len(kw["bucket_counts"]) and kw["num"] == sum(
            kw["bucket_counts"]
        )
        self.histograms.append(tag)


def _count_hooks(cb: TelemetryCallback) -> dict:
    """Wrap the callback's hook functions to count their calls."""
    calls = {"forward": 0, "grad": 0, "weight": 0}
    for key, attr in (
        ("forward", "_forward_hook"),
        ("grad", "_grad_hook"),
        ("weight", "_weight_hook"),
    ):
        fn = getattr(cb, attr)

        def counted(*a, _fn=fn, _key=key, **k):
            calls[_key] += 1
            return _fn(*a, **k)

        setattr(cb, attr, counted)
    return calls


def _no_hooks_left(model: nn.Module) -> bool:
    return all(not m._forward_hooks for m in model.modules()) and all(
        not getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters()
    )


def test_hooks_run_only_on_sampled_steps(tmp_path):
    model = tiny_model()
    tr = FakeTrainer(model, tmp_path)
    cb = TelemetryCallback(TelemetryConfig(enabled=True, every=4, figures=False))
    calls = _count_hooks(cb)
    cb.on_fit_start(tr)
    per_step = []
    for _ in range(8):
        before = dict(calls)
        cb.on_step_start(tr, tr.step)
        result = tr.train_step()
        tr.step += 1
        cb.on_step_end(tr, tr.step, result)
        per_step.append({k: calls[k] - before[k] for k in calls})
        assert _no_hooks_left(model)  # removed after every step, sampled or not
    sampled = [i for i, c in enumerate(per_step) if any(c.values())]
    assert sampled == [0, 4]
    # a sampled step hooks every layer: 5 leaf modules forward, 8 parameters' grads
    assert per_step[0]["forward"] == 5 and per_step[0]["weight"] == 8 and per_step[0]["grad"] > 5
    assert [r["step"] for r in read_records(tmp_path / "telemetry.jsonl")] == [1, 5]


def test_fit_writes_records_summary_scalars_and_figures(tmp_path):
    writer = CountingWriter()
    tr = FakeTrainer(tiny_model(), tmp_path, scale=8.0, writer=writer)
    cb = TelemetryCallback(TelemetryConfig(enabled=True, every=2))
    summary = tr.fit(cb, steps=5)
    tel = summary["telemetry"]
    assert tel["samples"] == 3 and tel["sampled_steps"] == [1, 3, 5] and tel["every"] == 2
    assert tel["first_nonfinite_layer"] is None and tel["first_fp16_overflow"] is None
    assert set(tel["layers"]) == {"fc1", "bn", "fc2", "fc3"}  # layers with weights
    net = tel["network"]
    for key in ("act_grad", "weight_grad"):
        assert set(net[key]["underflow"]) == {"last", "mean", "max"}
        assert 0.0 <= net[key]["underflow_scaled"]["mean"] <= net[key]["underflow"]["mean"] <= 1.0
    assert 0.0 <= net["lost_update"]["mean"] <= 1.0
    json.dumps(summary)  # run.json material

    records = read_records(tmp_path / "telemetry.jsonl")
    assert len(records) == 3 and records[0]["loss_scale"] == {"model": 8.0}
    first = records[0]["layers"]
    assert list(first) == ["fc1", "bn", "fc2", "fc3"]  # model order
    # the activation gradient of fc3 is (softmax - onehot)/batch, times the scale: 16x3 values,
    # all recorded at their true (unscaled) size
    fc3 = first["fc3"]["act"]
    assert fc3["numel"] == 48 and sum(fc3["hist"]["counts"]) + fc3["zero"] == 48
    assert (
        fc3["hist"]["lo"] + len(fc3["hist"]["counts"]) <= -2
    )  # |g| < 1/16 * 1: no loss scale left in
    # weight grads: fc1 has 8x4 + 8 values; every one of the 6 parameters is counted once
    assert first["fc1"]["weight"]["numel"] == 40 and first["fc1"]["lost"]["numel"] == 40
    assert sum(e["weight"]["numel"] for e in first.values()) == sum(
        p.numel() for p in tr.model.parameters()
    )

    assert (
        "telemetry/act_grad/underflow" in writer.scalars
        and "telemetry/lost_update" in writer.scalars
    )
    assert [s for s, _ in writer.scalars["telemetry/weight_grad/underflow_scaled"]] == [1, 3, 5]
    assert "telemetry_layers/act_grad_underflow/fc2" in writer.scalars
    assert (
        "telemetry/act_grad_log2" in writer.histograms
        and "telemetry_layers/weight_grad_log2/fc1" in writer.histograms
    )

    assert tel["figures"] == list(FIGURES)
    for name in FIGURES:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_lost_updates_match_a_direct_computation(tmp_path):
    tr = FakeTrainer(tiny_model(), tmp_path)
    before = [p.detach().clone() for p in tr.model.parameters()]
    cb = TelemetryCallback(TelemetryConfig(enabled=True, every=1, figures=False))
    tr.fit(cb, steps=1)
    rec = read_records(tmp_path / "telemetry.jsonl")[0]
    expected_lost = sum(
        int(nx.lost_update_counts(b, p.detach() - b)[0])
        for p, b in zip(tr.model.parameters(), before)
    )
    assert sum(e["lost"]["lost"] for e in rec["layers"].values()) == expected_lost
    assert sum(e["lost"]["nonzero"] for e in rec["layers"].values()) == sum(
        int(((p.detach() - b) != 0).sum()) for p, b in zip(tr.model.parameters(), before)
    )


def test_fp16_overflow_is_attributed_to_the_layer_whose_backward_made_it(tmp_path):
    # 1e30 times a gradient is finite in FP32 but far beyond 65504: FP16 would overflow there
    tr = FakeTrainer(tiny_model(Blowup(1e30)), tmp_path)
    tel = tr.fit(TelemetryCallback(TelemetryConfig(enabled=True, every=1, figures=False)), steps=1)[
        "telemetry"
    ]
    assert tel["first_fp16_overflow"]["layer"] == "boom"
    assert tel["first_fp16_overflow"]["where"] == "grad_input"
    assert tel["first_nonfinite_layer"] is None


def test_nonfinite_gradient_is_attributed_to_the_right_layer(tmp_path, caplog):
    # 1e40 overflows FP32 itself: inf appears in the gradient boom's backward returns
    tr = FakeTrainer(tiny_model(Blowup(1e40)), tmp_path)
    with caplog.at_level(logging.WARNING, logger="test_telemetry"):
        tel = tr.fit(
            TelemetryCallback(TelemetryConfig(enabled=True, every=1, figures=False)), steps=2
        )["telemetry"]
    assert tel["first_nonfinite_layer"] == "boom"
    assert tel["first_nonfinite"]["pass"] == "backward" and tel["first_nonfinite"]["step"] == 1
    assert "boom" in caplog.text


def test_nonfinite_forward_output_is_attributed(tmp_path):
    tr = FakeTrainer(tiny_model(NaNForward()), tmp_path)
    tel = tr.fit(TelemetryCallback(TelemetryConfig(enabled=True, every=1, figures=False)), steps=1)[
        "telemetry"
    ]
    assert tel["first_nonfinite"]["layer"] == "boom" and tel["first_nonfinite"]["pass"] == "forward"


def test_a_skipped_unsampled_step_arms_one_probe(tmp_path):
    tr = FakeTrainer(tiny_model(Blowup(1e40)), tmp_path)
    cb = TelemetryCallback(TelemetryConfig(enabled=True, every=100, probe_limit=1, figures=False))
    calls = _count_hooks(cb)
    # step 0 is sampled (found directly); steps 1.. are not: each overflows and is skipped,
    # but only one probe is allowed
    tel = tr.fit(cb, steps=5)["telemetry"]
    assert tel["samples"] == 1 and tel["probes"] == 1 and tel["skipped_steps_seen"] == 5
    probe = tel["probe_results"][0]
    assert (
        probe["step"] == 3 and probe["nonfinite"]["layer"] == "boom"
    )  # step 2 skipped -> step 3 probed
    assert calls["weight"] == 8  # a probe hooks no weights: only the sampled step did


def test_probe_without_recurrence_names_least_headroom(tmp_path):
    tr = FakeTrainer(tiny_model(Blowup(1e4)), tmp_path)
    cb = TelemetryCallback(TelemetryConfig(enabled=True, every=100, figures=False))
    tel = tr.fit(cb, steps=3, skip_at=(1,))["telemetry"]  # a skip with finite gradients
    probe = tel["probe_results"][0]
    assert probe["step"] == 3 and probe["nonfinite"] is None
    lh = probe["least_headroom"]
    # the largest gradient is one the x1e4 produced: at boom or upstream of it, never fc3's
    assert lh["layer"] in {"boom", "fc2", "relu", "bn", "fc1"} and lh["max_abs_grad"] > 100
    assert lh["headroom_log2"] == pytest.approx(math.log2(65504 / lh["max_abs_grad"]))


def test_what_if_scale_on_an_fp32_run(tmp_path):
    tr = FakeTrainer(tiny_model(), tmp_path)
    cb = TelemetryCallback(
        TelemetryConfig(enabled=True, every=1, what_if_scale=2.0**40, figures=False)
    )
    tel = tr.fit(cb, steps=1)["telemetry"]
    # 2^40 pushes ordinary gradients past 65504: the what-if overflow shows, the run had none
    assert tel["network"]["act_grad"]["overflow_scaled"]["last"] > 0
    assert tel["network"]["act_grad"]["overflow"]["last"] == 0
    assert tel["first_fp16_overflow"] is not None


def test_two_models_get_prefixed_layer_names_and_their_own_scale(tmp_path):
    g, d = tiny_model(), tiny_model()
    tr = FakeTrainer(g, tmp_path)
    opt_d = torch.optim.SGD(d.parameters(), lr=0.1)
    opt_d.loss_scale = 1.0
    tr.task = SimpleNamespace(
        models={"generator": g, "discriminator": d},
        optimizers={"generator": tr.opt, "discriminator": opt_d},
    )
    cb = TelemetryCallback(TelemetryConfig(enabled=True, every=1, figures=False))
    tr.fit(cb, steps=1)
    rec = read_records(tmp_path / "telemetry.jsonl")[0]
    assert "generator.fc1" in rec["layers"] and set(rec["loss_scale"]) == {
        "generator",
        "discriminator",
    }
    # each layer's class beside its prefixed path (issue 37: `generator.bn BatchNorm1d`)
    assert rec["layers"]["generator.bn"]["module"] == "BatchNorm1d"
    assert layer_labels([rec])["discriminator.fc3"] == "discriminator.fc3 Linear"


def test_a_resumed_run_keeps_the_last_line_of_a_step(tmp_path):
    p = tmp_path / "telemetry.jsonl"
    base = {
        "mode": "sample",
        "stepped": True,
        "layers": {},
        "nonfinite": None,
        "overflow": None,
        "scale_shown": {},
    }
    lines = [
        dict(base, step=1, loss=1.0),
        dict(base, step=3, loss=2.0),
        dict(base, step=3, loss=3.0),
    ]
    p.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"torn')
    recs = read_records(p)
    assert [(r["step"], r["loss"]) for r in recs] == [(1, 1.0), (3, 3.0)]


def test_figures_entry_point(tmp_path, capsys):
    tr = FakeTrainer(tiny_model(), tmp_path)
    tr.fit(TelemetryCallback(TelemetryConfig(enabled=True, every=1, figures=False)), steps=2)
    out = tmp_path / "figs"
    assert figures_main([str(tmp_path), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(FIGURES)
    assert figures_main([str(tmp_path / "nothing")]) == 2


@pytest.mark.parametrize("scale", [1.0, 2.0**10, 2.0**-3, 1000.0, 3.0])
def test_histogram_shortcut_equals_direct_comparison(scale):
    """Power-of-two scales read the ranges off the histogram; check against plain comparisons."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5000, generator=g) * torch.exp2(
        torch.randint(-40, 20, (5000,), generator=g).float()
    )
    x[:50] = 0
    d = nx.count_dict(nx.tensor_counts(x, scale=scale).tolist())
    a, s = x.abs(), x.abs() * scale
    for name, v in (("", a), ("_scaled", s)):
        assert d["underflow" + name] == int(((v > 0) & (v < 2.0**-24)).sum())
        assert d["subnormal" + name] == int(((v >= 2.0**-24) & (v < 2.0**-14)).sum())
        assert d["overflow" + name] == int((v > 65504).sum())
