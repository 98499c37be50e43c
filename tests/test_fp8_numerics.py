"""Telemetry in 8-bit terms (mpt_repro/telemetry/numerics.py, format_counts and friends): the
fractions E5M2 / E4M3 / FP16 would flush, lose, hold as subnormals or overflow, with and without
the loss scale, checked by hand and against the formats' real casts."""

from __future__ import annotations

import math

import pytest
import torch

from mpt_repro.precision import fp8
from mpt_repro.telemetry import numerics as nx

pytestmark = pytest.mark.usefixtures("one_thread")


def test_known_values_in_every_format():
    t = 2.0**-16  # E5M2's smallest subnormal
    x = torch.tensor(
        [0.0, t / 4, t / 2, 0.75 * t, t, 2.0**-15, 2.0**-14, 2.0**-9, 2.0**-7, 1.0, 500.0]
        + [60000.0, 70000.0, math.inf, math.nan]
    )
    d = nx.format_count_dict(nx.format_counts(x).tolist())
    assert d["numel"] == 15
    # E5M2: t/4, t/2 flush (t/2 is the tie, to even: 0); 0.75t rounds up to t: lost, not flushed
    assert d["e5m2"] == {
        "flush": 2, "underflow": 3, "subnormal": 2, "overflow": 3,  # 60000, 70000, inf
        "flush_scaled": 2, "underflow_scaled": 3, "subnormal_scaled": 2, "overflow_scaled": 3,
    }  # fmt: skip
    # E4M3 (smallest subnormal 2^-9, normal 2^-6, max 448): everything up to 2^-15 is flushed
    e4 = d["e4m3"]
    assert (e4["flush"], e4["underflow"], e4["subnormal"], e4["overflow"]) == (6, 6, 2, 4)
    # FP16 (2^-24 .. 65504): nothing underflows; t/4 .. 2^-15 are subnormal; 70000, inf overflow
    f16 = d["fp16"]
    assert (f16["flush"], f16["underflow"], f16["subnormal"], f16["overflow"]) == (0, 0, 5, 2)


@pytest.mark.parametrize("fmt", ["e5m2", "e4m3"])
def test_flush_and_overflow_agree_with_the_real_cast(fmt):
    g = torch.Generator().manual_seed(0)
    n = 50_000
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 20, (n,), generator=g).float())
    d = nx.format_count_dict(nx.format_counts(x, formats=(fmt,)).tolist(), (fmt,))[fmt]
    q = fp8.quantize(x, fmt, "nearest", "nonfinite")
    s, norm, top = nx.FORMAT_RANGES[fmt]
    assert d["flush"] == int(((x != 0) & (q == 0)).sum())
    assert d["underflow"] == int(((x != 0) & (x.abs() < 2.0**s)).sum())
    assert d["subnormal"] == int(((x.abs() >= 2.0**s) & (x.abs() < 2.0**norm)).sum())
    assert d["overflow"] == int((x.abs() > top).sum())
    # values past max but below the rounding bound are kept as max (not inf): overflow counts
    # them, as "not held": |q| <= max there
    assert d["overflow"] >= int((~torch.isfinite(q)).sum())


def test_the_loss_scale_moves_the_scaled_counts_and_divide_by_recovers_the_true_values():
    x = torch.tensor([2.0**-20, 2.0**-17, 2.0**-10, 1.0, 300.0])
    d = nx.format_count_dict(nx.format_counts(x, scale=2.0**8).tolist())
    # x 2^8: 2^-20 -> 2^-12 (normal in E5M2), 2^-17 -> 2^-9, 300 -> 76800 (overflow)
    assert d["e5m2"]["underflow"] == 2 and d["e5m2"]["underflow_scaled"] == 0
    assert d["e5m2"]["overflow"] == 0 and d["e5m2"]["overflow_scaled"] == 1
    captured = nx.format_counts(x * 2.0**8, divide_by=2.0**8)  # a gradient carrying scale 2^8
    assert torch.equal(captured, nx.format_counts(x))


def test_the_fp16_block_matches_the_fp16_counts():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20_000, generator=g) * torch.exp2(
        torch.randint(-40, 20, (20_000,), generator=g).float()
    )
    for scale in (1.0, 2.0**10, 3.0):
        f16 = nx.format_count_dict(nx.format_counts(x, scale=scale).tolist())["fp16"]
        c = nx.count_dict(nx.tensor_counts(x, scale=scale).tolist())
        for k in ("underflow", "subnormal", "overflow", "underflow_scaled", "subnormal_scaled"):
            assert f16[k] == c[k], k


@pytest.mark.parametrize("shift", [0, 8, -3])
def test_histogram_shortcut_gives_the_same_8bit_underflow(shift):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20_000, generator=g) * torch.exp2(
        torch.randint(-40, 5, (20_000,), generator=g).float()
    )
    hist = nx.histogram_list(nx.tensor_counts(x).tolist())
    d = nx.format_count_dict(nx.format_counts(x, scale=2.0**shift).tolist())
    for fmt in nx.FORMAT_NAMES:
        got = nx.format_ranges_from_histogram(hist, fmt, shift)
        key = "" if shift == 0 else "_scaled"
        assert got == {
            "underflow": d[fmt]["underflow" + key],
            "subnormal": d[fmt]["subnormal" + key],
        }


def test_entries_add_and_give_fractions():
    a = nx.format_count_dict(nx.format_counts(torch.tensor([2.0**-20, 1.0])).tolist())
    b = nx.format_count_dict(nx.format_counts(torch.tensor([0.0, 1e6, 1.0, 2.0])).tolist())
    total = nx.add_format_entries([a, b])
    assert (
        total["numel"] == 6 and total["e5m2"]["underflow"] == 1 and total["e5m2"]["overflow"] == 1
    )
    f = nx.format_fractions(total)
    assert f["e5m2"]["underflow"] == 1 / 6 and f["e4m3"]["overflow"] == 1 / 6
    assert nx.add_format_entries([]) is None
