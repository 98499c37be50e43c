"""MX formats (issue 46): the block quantizer bit for bit against ml_dtypes, the spec's special
blocks, the emulated layers' GEMMs against the formulas of mx_modules' docstring, the knobs'
refusals, and a real run's MX telemetry."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, compose, read_run, run_cli
from torch import nn

from mpt_repro.config import validate
from mpt_repro.errors import ConfigError
from mpt_repro.precision import PrecisionPolicy, fp8, mx
from mpt_repro.precision.mx_modules import (
    MXConv2d,
    MXLinear,
    apply_mx,
    mx_runtime,
    remove_mx,
)

pytestmark = pytest.mark.usefixtures("one_thread")
FORMATS = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")


def exactness():
    spec = importlib.util.spec_from_file_location("mx_exactness", ROOT / "scripts/mx_exactness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_matches_ml_dtypes_bit_for_bit_on_a_sample(fmt):
    pytest.importorskip("ml_dtypes")
    r = exactness().check(fmt, 100_000, seed=1)
    assert r["values"] >= 100_000 and min(r[f"blocks_{k}"] for k in exactness().KINDS) > 300
    assert r["nan_scale_blocks"] > 100 and r["clamped_blocks"] > 100  # the special cases occur
    assert (r["scale_mismatches"], r["element_mismatches"], r["value_mismatches"]) == (0, 0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_matches_ml_dtypes_on_ten_million_values(fmt):
    pytest.importorskip("ml_dtypes")
    r = exactness().check(fmt, 10_000_000, seed=0)
    assert r["values"] >= 10_000_000
    assert (r["scale_mismatches"], r["element_mismatches"], r["value_mismatches"]) == (0, 0, 0)


def test_the_comparison_catches_one_flipped_bit_and_a_per_tensor_scale():
    """The check can fail: one value one FP32 ulp off is one mismatch; one scale per tensor
    (FP8's tensorwise rule) instead of one per block differs almost everywhere."""
    pytest.importorskip("ml_dtypes")
    ex = exactness()
    blocks, _ = ex.samples("e4m3", 20_000, seed=2)
    blocks = blocks[np.isfinite(blocks).all(1) & (np.abs(blocks).max(1) < 1e30)]
    _, _, values = ex.reference(blocks, "e4m3")
    ours = mx.mx_quantize(torch.from_numpy(blocks), "e4m3").numpy()
    assert ex.same_bits(values, ours).all()
    i = np.flatnonzero(ours)[7]
    flipped = ours.copy().reshape(-1)
    flipped[i] = np.nextafter(flipped[i], np.float32(np.inf))
    assert (~ex.same_bits(values, flipped.reshape(ours.shape))).sum() == 1
    tensorwise = fp8.quantize_scaled(torch.from_numpy(blocks), "e4m3").numpy()
    assert (~ex.same_bits(values, tensorwise)).mean() > 0.3


def test_special_blocks_follow_the_spec():
    inf, nan = float("inf"), float("nan")
    x = torch.zeros(6, 32)
    x[1, 0] = -0.0
    x[1, 1] = -1e-45  # an FP32 subnormal: block max below 2^-126, scale clamps
    x[2, :] = 1.0
    x[2, 5] = inf
    x[3, :] = 1.0
    x[3, 7] = nan
    x[4, 0], x[4, 1] = 500.0, 1.0  # E4M3: s = 8 - 8 = 0, 500 saturates to 448
    x[5, 0], x[5, 1], x[5, 2] = 2.0**-120, 2.0**-136, 2.0**-140  # tiny: s = -127 - 8 -> -127
    enc = mx.mx_encode(x, "e4m3")
    assert enc.codes().flatten().tolist() == [0, 0, 255, 255, 127, 0]
    y = mx.mx_quantize(x, "e4m3")
    assert torch.equal(y[0], torch.zeros(32)) and torch.signbit(y[1, :2]).all()
    assert y[2].isnan().all() and y[3].isnan().all()  # a NaN scale: the whole block is NaN
    assert y[4, 0] == 448 and y[4, 1] == 1
    assert y[5, 0] == 2.0**-120  # 2^7 x 2^-127: kept
    assert y[5, 1] == 2.0**-136 and y[5, 2] == 0  # 2^-9 x 2^-127: E4M3's smallest subnormal
    stats = mx.stats_dict(mx.block_stats(mx.blocked(x, -1), enc, mx.element_format("e4m3")))
    assert stats["blocks"] == 6 and stats["nonzero_blocks"] == 3  # 1, 4, 5 (2, 3 are NaN)
    assert stats["saturated"] == 1 and stats["scale_clamped"] == 2  # 4; 1 and 5
    assert stats["underflow"] == 2  # -1e-45 in block 1 (2^-149 x 2^127 = 2^-22), 2^-140 in 5


def test_blocks_run_along_the_asked_dimension_with_a_padded_last_block():
    torch.manual_seed(0)
    x = torch.randn(70, 5) * torch.logspace(-4, 4, 70)[:, None]
    along0 = mx.mx_quantize(x, "e2m1", dim=0)
    assert torch.equal(along0, mx.mx_quantize(x.t().contiguous(), "e2m1").t())
    first = mx.mx_quantize(x[:32], "e2m1", dim=0)  # the first block alone
    assert torch.equal(along0[:32], first)
    tail = mx.mx_quantize(x[64:], "e2m1", dim=0)  # 6 values padded with zeros
    assert torch.equal(along0[64:], tail)
    assert not torch.equal(along0, mx.mx_quantize(x, "e2m1", dim=1))


def test_stochastic_rounding_is_unbiased_and_stays_on_the_grid():
    g = torch.Generator().manual_seed(0)
    x = torch.full((4000, 32), 1.3)
    x[:, 0] = 6.0  # s = 0 for E2M1: 1.3 lies between 1 and 1.5
    y = mx.mx_quantize(x, "e2m1", rounding="stochastic", generator=g)[:, 1:]
    assert set(y.unique().tolist()) == {1.0, 1.5}
    assert abs(y.mean().item() - 1.3) < 0.01  # 126,000 draws: sd of the mean ~0.0007
    assert (mx.mx_quantize(x, "e2m1")[:, 1:] == 1.5).all()  # RNE: 1.3 -> 1.5


def pcfg(fmt="e4m3", errors=None, exempt=None, **kinds):
    overrides = ["experiment=demo", "precision=mxfp8_emulated"]
    overrides += [f"precision.fp8.{k}.format={fmt}" for k in ("weights", "activations")]
    overrides.append(f"precision.fp8.errors.format={errors or fmt}")
    if exempt is not None:
        overrides.append(f"precision.fp8.exempt={exempt}")
    overrides += [f"precision.fp8.{k}={v}" for k, v in kinds.items()]
    return compose(overrides).precision


def test_linear_computes_its_three_gemms_on_operands_blocked_along_their_reductions():
    torch.manual_seed(0)
    ref = nn.Linear(40, 36)
    model = apply_mx(nn.Sequential(nn.Linear(40, 36)), pcfg("e2m1", exempt="[]"), seed=0)
    layer = model[0]
    layer.load_state_dict(ref.state_dict())
    assert type(layer) is MXLinear and isinstance(layer, nn.Linear)
    x = (torch.randn(3, 11, 40) * 3).requires_grad_()
    y = layer(x)
    q = mx.mx_quantize
    w = ref.weight.detach()
    assert torch.equal(y, F.linear(q(x.detach(), "e2m1", -1), q(w, "e2m1", -1), ref.bias))
    e = torch.randn_like(y)
    y.backward(e)
    e2, x2 = e.reshape(-1, 36), x.detach().reshape(-1, 40)
    assert torch.equal(x.grad, q(e, "e2m1", -1).matmul(q(w, "e2m1", 0)))
    assert torch.equal(layer.weight.grad, q(e2, "e2m1", 0).t().matmul(q(x2, "e2m1", 0)))
    assert torch.equal(layer.bias.grad, e2.sum(0))  # the FP32 errors: not a GEMM


def test_conv_quantizes_channels_forward_and_output_channels_for_the_input_gradient():
    torch.manual_seed(0)
    ref = nn.Conv2d(40, 33, 3, padding=1)
    model = apply_mx(nn.Sequential(nn.Conv2d(40, 33, 3, padding=1)), pcfg(exempt="[]"), seed=0)
    conv = model[0]
    conv.load_state_dict(ref.state_dict())
    assert type(conv) is MXConv2d and isinstance(conv, nn.Conv2d)
    x = torch.randn(2, 40, 6, 6).requires_grad_()
    y = conv(x)
    q, w = mx.mx_quantize, ref.weight.detach()
    want = F.conv2d(q(x.detach(), "e4m3", 1), q(w, "e4m3", 1), ref.bias, padding=1)
    assert torch.equal(y, want)
    e = torch.randn_like(y)
    y.backward(e)
    gx = torch.nn.grad.conv2d_input(x.shape, q(w, "e4m3", 0), q(e, "e4m3", 1), padding=1)
    assert torch.allclose(x.grad, gx, rtol=1e-5, atol=1e-6)
    assert torch.allclose(conv.bias.grad, e.sum((0, 2, 3)))
    assert conv.weight.grad.shape == w.shape and conv.weight.grad.abs().sum() > 0


def test_apply_mx_keeps_first_and_last_and_remove_mx_undoes_it():
    m = nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(128, 3)
    )
    keys = set(m.state_dict())
    apply_mx(m, pcfg())
    rt = mx_runtime(m)
    assert rt.exempt == ["0", "4"] and rt.wrapped == ["2"] and set(m.state_dict()) == keys
    assert rt.summary()["block"] == 32 and rt.summary()["block_kinds"] == [
        "weights", "activations", "errors"]  # fmt: skip
    remove_mx(m)
    assert type(m[2]) is nn.Conv2d and mx_runtime(m) is None


@pytest.mark.parametrize(
    "override,key",
    [
        (["precision.fp8.errors.format=e2m1", "precision.fp8.errors.scaling=none"], "errors"),
        (
            ["precision.fp8.weight_grads.format=e4m3", "precision.fp8.weight_grads.scaling=mx"],
            "weight_grads.scaling=mx",
        ),  # fmt: skip
        (["precision.fp8.errors.overflow=nonfinite"], "overflow=saturate"),
    ],
)
def test_knobs_that_make_no_sense_for_mx_are_refused(override, key):
    cfg = compose(["experiment=demo", "precision=mxfp8_emulated", *override])
    with pytest.raises(ConfigError, match=key):
        validate(cfg)


def test_the_mx_presets_need_no_loss_scale_and_say_what_they_are():
    pol = PrecisionPolicy(pcfg("e2m1"), "cpu")
    assert pol.scaling_kind == "none" and "MX blocks of 32" in pol.describe()
    assert "errors E2M1 RNE" in pol.describe() and "exempt: first, last" in pol.describe()
    sr = PrecisionPolicy(pcfg("e2m1", **{"errors.rounding": "stochastic"}), "cpu")
    assert "errors E2M1 SR" in sr.describe()


@pytest.fixture(scope="module")
def mx_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("mx") / "run"
    run_cli(
        "experiment=demo", "budget=smoke", "precision=mxfp4_emulated", "telemetry=diagnostic",
        "telemetry.every=3", run_dir=run_dir,
    )  # fmt: skip
    return run_dir


def test_a_real_run_records_its_mx_layers_and_their_block_telemetry(mx_run):
    rec = read_run(mx_run)
    d = rec["diagnostics"]
    summary = d["mx"]  # one optimizer: its MX runtime's summary as is
    assert summary["wrapped"] and summary["block"] == 32
    tel = d["telemetry"]["mx"]
    assert set(tel["layers"]) == set(summary["wrapped"])
    for kind in ("weights", "activations", "errors"):
        shares = tel["network"][kind]
        assert all(0.0 <= v <= 1.0 for v in shares.values())
    # E2M1's 3 binades: some of the errors underflow inside their blocks
    assert tel["network"]["errors"]["underflow"] > 0
    lines = (mx_run / "telemetry.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    entry = first["layers"][summary["wrapped"][0]]["mx"]["errors"]
    assert set(entry) == set(mx.STATS) and entry["nonzero"] > 0
    assert "telemetry_mx_blocks.png" in d["telemetry"]["figures"]
    assert (mx_run / "telemetry_mx_blocks.png").stat().st_size > 10_000


def test_the_bench_computes_what_an_mx_storage_would_save_and_marks_the_emulation():
    from mpt_repro.bench.mx_cost import describe, mx_storage
    from mpt_repro.bench.results import format_table
    from mpt_repro.bench.step import build_step

    cfg = compose(["experiment=demo", "budget=smoke", "precision=mxfp4_emulated"])
    bs = build_step(cfg, torch.device("cpu"))
    s = mx_storage(bs)
    model = bs.task.models["model"]
    numel = sum(dict(model.named_modules())[n].weight.numel() for n in mx_runtime(model).wrapped)
    assert s["bits_per_value"]["weights"] == 4.25  # 4-bit elements, 8 bits per 32 of scale
    assert s["weights"]["fp32_bytes"] == 4 * numel
    assert s["weights"]["saved_bytes"] == numel * (32 - 4.25) / 8
    assert 0 < s["activations_per_sample"]["mx_bytes"] < s["activations_per_sample"]["fp32_bytes"]
    row = {"preset": "mxfp4_emulated", "repeats": 1, "samples_per_s": 1.0,
           "samples_per_s_min": 1.0, "samples_per_s_max": 1.0, "meaningful": {},
           "detail": {"mx_storage": s}}  # fmt: skip
    assert "| mxfp4_emulated (emulation) |" in format_table({"results": [row]})
    (line,) = describe({"results": [row]})
    assert "emulation" in line and "computed, not measured" in line
    cfg32 = compose(["experiment=demo", "budget=smoke", "precision=fp32"])
    assert mx_storage(build_step(cfg32, torch.device("cpu"))) is None
