"""The 8-bit formats (mpt_repro/precision/fp8.py): round to nearest equals torch's float8 casts on
every boundary, stochastic rounding is unbiased and reproducible, overflow and subnormals follow
the spec, the FP16 master rounding, the rising loss-scale floor and the fp8 knob validation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from mpt_repro.errors import ConfigError
from mpt_repro.precision import fp8
from mpt_repro.precision.config import (
    FP8Config,
    FP8Format,
    FP8Master,
    FP8Mode,
    FP8Rounding,
    FP8TensorConfig,
    LossScaling,
    PrecisionConfig,
)

pytestmark = pytest.mark.usefixtures("one_thread")

EIGHT_BIT = [fp8.E5M2, fp8.E4M3]


def torch_dtype(fmt):
    return getattr(torch, fmt.torch_dtype)


def all_codes(fmt) -> torch.Tensor:
    """The 256 values of an 8-bit format, decoded by torch (NaN and inf codes included)."""
    return torch.arange(256, dtype=torch.uint8).view(torch_dtype(fmt)).float()


def finite_grid(fmt) -> torch.Tensor:
    """The format's finite non-negative values, sorted (the grid rounding must land on)."""
    c = all_codes(fmt)
    return torch.unique(c[torch.isfinite(c)].abs())


def nextafter(x, direction):
    return torch.nextafter(x, torch.full_like(x, direction))


def boundary_inputs(fmt) -> torch.Tensor:
    """Every finite value, every midpoint between neighbours (ties), the FP32 numbers either side
    of each, and the same negated: where a rounding bug would show."""
    g = finite_grid(fmt)
    mid = (g[1:] + g[:-1]) / 2  # exact: one bit more than the format's values
    pts = torch.cat([g, mid])
    pts = torch.cat([pts, nextafter(pts, math.inf), nextafter(pts, -math.inf)])
    pts = torch.cat([pts, torch.tensor([1e-45, 2.0**-140, 2.0**-30])])  # FP32 subnormal, tiny
    pts = pts[pts >= 0]
    return torch.cat([pts, -pts])


def in_range(fmt, x):
    bound, inclusive = fmt.overflow_bound
    return (x.abs() < bound) if inclusive else (x.abs() <= bound)


def nearest_by_cast(x, fmt, overflow):
    """The reference: torch's cast, with the overflow behaviour made explicit (torch's
    float8_e4m3fn cast saturates in recent releases and gave NaN in older ones)."""
    y = x.clamp(-fmt.max_finite, fmt.max_finite).to(torch_dtype(fmt)).float()
    if overflow == "saturate":
        return y  # clamp took +-inf to +-max too; NaN stays NaN
    special = math.inf if fmt.has_inf else math.nan
    over = ~in_range(fmt, x) & ~x.isnan()
    return torch.where(over, torch.copysign(torch.full_like(y, special), x), y)


def same_bits(a, b) -> bool:
    """Equal including the sign of zero, NaN equal to NaN."""
    a, b = a.float(), b.float()
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)  # +-NaN -> 0 on both sides
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


# -- the formats ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", EIGHT_BIT + [fp8.FP16])
def test_format_constants_match_torch(fmt):
    fi = torch.finfo(torch_dtype(fmt))
    assert fmt.max_finite == fi.max
    assert 2.0**fmt.min_normal_exp == fi.smallest_normal
    assert 2.0**-fmt.mantissa_bits == fi.eps
    if fmt is not fp8.FP16:
        g = finite_grid(fmt)
        assert g[1].item() == 2.0**fmt.min_subnormal_exp and g[-1].item() == fmt.max_finite
        # 128 non-negative codes, less E5M2's inf and 3 NaNs, less E4M3's single NaN
        assert len(g) == (124 if fmt is fp8.E5M2 else 127)


def test_the_overflow_bounds():
    # the midpoint above max, and which way its tie goes (max's last mantissa bit)
    assert fp8.E5M2.overflow_bound == (61440.0, True)  # 57344 = 0b111 * 2^13: odd, tie goes up
    assert fp8.E4M3.overflow_bound == (464.0, False)  # 448 = 0b1110 * 2^5: even, tie stays
    assert fp8.FP16.overflow_bound == (65520.0, True)


# -- round to nearest equals torch's casts -------------------------------------------------------
@pytest.mark.parametrize("fmt", EIGHT_BIT, ids=lambda f: f.name)
def test_every_code_is_a_fixed_point(fmt):
    c = all_codes(fmt)
    for overflow in fp8.OVERFLOWS:
        for rounding in fp8.ROUNDINGS:
            y = fp8.quantize(c, fmt, rounding, overflow, torch.Generator().manual_seed(0))
            finite = torch.isfinite(c)
            assert same_bits(y[finite], c[finite]), (overflow, rounding)
            assert y[c.isnan()].isnan().all()


@pytest.mark.parametrize("fmt", EIGHT_BIT, ids=lambda f: f.name)
@pytest.mark.parametrize("overflow", fp8.OVERFLOWS)
def test_nearest_equals_torch_cast_on_every_boundary(fmt, overflow):
    x = boundary_inputs(fmt)
    ok = in_range(fmt, x)
    y = fp8.quantize(x, fmt, "nearest", overflow)
    # below the overflow bound, torch's cast itself is the reference, bit for bit
    assert same_bits(y[ok], x[ok].to(torch_dtype(fmt)).float())
    assert same_bits(y, nearest_by_cast(x, fmt, overflow))


@pytest.mark.parametrize("fmt", EIGHT_BIT + [fp8.FP16], ids=lambda f: f.name)
def test_nearest_equals_torch_cast_on_random_values_of_every_exponent(fmt):
    g = torch.Generator().manual_seed(0)
    n = 200_000
    exps = torch.randint(-40, 20, (n,), generator=g).float()
    x = (
        (torch.rand(n, generator=g) + 1)
        * torch.exp2(exps)
        * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    )
    y = fp8.quantize(x, fmt, "nearest", "nonfinite")
    assert same_bits(y, nearest_by_cast(x, fmt, "nonfinite"))
    if fmt is fp8.FP16:  # and for FP16 torch's cast is IEEE, overflow included
        assert same_bits(y, x.half().float())


def test_subnormals_and_the_smallest_ties():
    tiny = 2.0**-16  # the smallest E5M2 subnormal
    x = torch.tensor([tiny, 2 * tiny, 3 * tiny, tiny / 2, 1.5 * tiny, 2.5 * tiny, tiny / 4])
    # ties go to even: tiny/2 -> 0, 1.5 tiny -> 2 tiny, 2.5 tiny -> 2 tiny; a quarter -> 0
    want = torch.tensor([tiny, 2 * tiny, 3 * tiny, 0.0, 2 * tiny, 2 * tiny, 0.0])
    assert torch.equal(fp8.quantize(x, "e5m2"), want)
    up = nextafter(torch.tensor([tiny / 2]), 1.0)
    assert fp8.quantize(up, "e5m2").item() == tiny  # just above the tie: rounds up
    assert fp8.quantize(torch.tensor([2.0**-10 * 1.0001]), "e4m3").item() == 2.0**-9
    # the sign of a flushed value survives, as in IEEE
    assert same_bits(fp8.quantize(torch.tensor([-(2.0**-20)]), "e5m2"), torch.tensor([-0.0]))


def test_overflow_saturate_and_nonfinite():
    inf, nan = math.inf, math.nan
    x = torch.tensor([57344.0, 61439.99, 61440.0, 1e9, inf, -inf, nan, -1e9])
    sat = fp8.quantize(x, "e5m2", "nearest", "saturate")
    assert same_bits(sat, torch.tensor([57344.0, 57344, 57344, 57344, 57344, -57344, nan, -57344]))
    ieee = fp8.quantize(x, "e5m2", "nearest", "nonfinite")
    assert same_bits(ieee, torch.tensor([57344.0, 57344, inf, inf, inf, -inf, nan, -inf]))
    x4 = torch.tensor([448.0, 464.0, 464.01, 1e9, inf, -inf, nan])
    sat4 = fp8.quantize(x4, "e4m3", "nearest", "saturate")
    assert same_bits(sat4, torch.tensor([448.0, 448, 448, 448, 448, -448, nan]))
    nf4 = fp8.quantize(x4, "e4m3", "nearest", "nonfinite")  # E4M3 has no inf: NaN
    assert same_bits(nf4[:2], torch.tensor([448.0, 448])) and nf4[2:].isnan().all()


def test_quantize_keeps_the_input_dtype_and_does_not_touch_the_input():
    x = torch.tensor([0.3, -5.0, 1e-3])
    before = x.clone()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        y = fp8.quantize(x.to(dtype), "e4m3", "stochastic", generator=torch.Generator())
        assert y.dtype == dtype
    assert torch.equal(x, before)


# -- stochastic rounding -------------------------------------------------------------------------
def neighbours(fmt, x):
    """(down, up): the grid values either side of |x| (equal when |x| is on the grid)."""
    g = finite_grid(fmt)
    a = x.abs()
    i = torch.searchsorted(g, a, right=True) - 1
    down = g[i]
    up = torch.where(down == a, down, g[(i + 1).clamp(max=len(g) - 1)])
    return down, up


@pytest.mark.parametrize("fmt", EIGHT_BIT, ids=lambda f: f.name)
def test_stochastic_lands_on_a_neighbour(fmt):
    g = torch.Generator().manual_seed(1)
    n = 100_000
    x = (torch.rand(n, generator=g) * 2 - 1) * torch.exp2(
        torch.randint(fmt.min_subnormal_exp - 3, fmt.max_exp, (n,), generator=g).float()
    )
    y = fp8.quantize(x, fmt, "stochastic", "saturate", g)
    down, up = neighbours(fmt, x)
    hit_down, hit_up = y.abs() == down, y.abs() == up
    assert (hit_down | hit_up).all()
    assert (torch.sign(y) == torch.sign(x))[y != 0].all()
    # both neighbours do occur where they differ
    differ = down != up
    assert hit_down[differ].any() and hit_up[differ].any()


def test_stochastic_rounds_up_exactly_when_the_draw_is_below_the_fraction():
    tiny = 2.0**-24  # one step of the 24-bit uniform draws
    v = torch.tensor([2.25, 2.25, 2.25, 2.25, 3.0, 3.0, 0.0, math.inf, math.nan])
    u = torch.tensor([0.25, 0.25 - tiny, 0.25 + tiny, 0.0, 0.0, 1 - tiny, 0.0, 0.5, 0.5])
    want = torch.tensor([2.0, 3.0, 2.0, 3.0, 3.0, 3.0, 0.0, math.inf, math.nan])
    assert same_bits(fp8.stochastic_round_(v, u), want)


def test_uniform24_draws_lie_on_the_24_bit_grid():
    u = fp8.uniform24((100_000,), torch.Generator().manual_seed(0), "cpu")
    assert u.min() >= 0 and u.max() < 1
    assert torch.equal(u * 2**24, (u * 2**24).floor())
    assert abs(u.double().mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / 100_000)


# values with known rounding probability p (frac of the way from `down` to `up`), in E5M2
SR_CASES = [
    (1.0 + 1 / 3 * 0.25, 1.0, 1.25),  # p = 1/3, binade [1, 2): spacing 0.25
    (1.0 + 0.25 * 2.0**-20, 1.0, 1.25),  # p = 2^-20: a tiny update must survive on average
    (1.75 + 0.2 * 0.25, 1.75, 2.0),  # rounding up crosses into the next binade
    (2.0**-16 * 0.3, 0.0, 2.0**-16),  # below the smallest subnormal
    (2.0**-16 * 2.7, 2.0**-16 * 2, 2.0**-16 * 3),  # among the subnormals
    (2.0**-14 * 1.9, 2.0**-14 * 1.75, 2.0**-13),  # top of the smallest normal binade
    (40000.0, 40960.0 - 8192, 40960.0),  # large: spacing 8192
    (-3.3, -3.5, -3.0),  # negative: rounds in magnitude
]


def test_stochastic_is_unbiased_within_its_sampling_error():
    n = 2**16
    g = torch.Generator().manual_seed(2)
    x = torch.tensor([c[0] for c in SR_CASES]).repeat_interleave(n)
    y = fp8.quantize(x, "e5m2", "stochastic", "saturate", g).view(len(SR_CASES), n)
    for row, (v, lo, hi) in zip(y, SR_CASES):
        lo_, hi_ = sorted((abs(lo), abs(hi)))
        p = (abs(v) - lo_) / (hi_ - lo_)
        assert set(row.abs().unique().tolist()) <= {lo_, hi_}
        p_hat = (row.abs() == hi_).double().mean().item()
        sigma = math.sqrt(p * (1 - p) / n)
        # 5 standard errors of the Bernoulli mean (plus one draw's worth for p near 0)
        tol = 5 * sigma + 1 / n
        assert abs(p_hat - p) <= tol, (v, p, p_hat)
        mean_err = row.double().mean().item() - v
        assert abs(mean_err) <= tol * (hi_ - lo_), (v, mean_err)


def test_nearest_is_biased_where_stochastic_is_not():
    # the reason for SR (Mellempudi 2019): a sum of small updates vanishes under RNE
    w = torch.full((4096,), 1.0)
    step = torch.full_like(w, 0.25 * 2.0**-6)  # 1/64 of the spacing at 1.0
    g = torch.Generator().manual_seed(3)
    rne, sr = w.clone(), w.clone()
    for _ in range(64):
        rne = fp8.quantize(rne + step, "e5m2", "nearest")
        sr = fp8.quantize(sr + step, "e5m2", "stochastic", generator=g)
    assert torch.equal(rne, w)  # every update lost
    assert abs(sr.mean().item() - 1.25) < 0.02  # 64 * 2^-8 = 0.25 gained on average


def test_stochastic_is_reproducible_from_the_seed_and_the_generator_state():
    x = torch.randn(10_000)
    a = fp8.quantize(x, "e5m2", "stochastic", generator=torch.Generator().manual_seed(7))
    b = fp8.quantize(x, "e5m2", "stochastic", generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    g = torch.Generator().manual_seed(7)
    fp8.quantize(x, "e5m2", "stochastic", generator=g)
    state = g.get_state()
    c = fp8.quantize(x, "e5m2", "stochastic", generator=g)
    assert not torch.equal(a, c)  # the stream moved on
    g2 = torch.Generator()
    g2.set_state(state)  # a resumed run restores the state and draws the same numbers
    assert torch.equal(fp8.quantize(x, "e5m2", "stochastic", generator=g2), c)


@pytest.mark.parametrize("overflow", fp8.OVERFLOWS)
def test_stochastic_overflow_and_specials(overflow):
    inf, nan = math.inf, math.nan
    x = torch.tensor([60000.0, 1e6, inf, -inf, nan, 0.0, -0.0])
    g = torch.Generator().manual_seed(0)
    y5 = fp8.quantize(x, "e5m2", "stochastic", overflow, g)
    y4 = fp8.quantize(x, "e4m3", "stochastic", overflow, g)
    assert y5[0].item() in (57344.0, inf if overflow == "nonfinite" else 57344.0)
    if overflow == "saturate":
        assert same_bits(y5[1:], torch.tensor([57344.0, 57344, -57344, nan, 0.0, -0.0]))
        assert same_bits(y4[1:], torch.tensor([448.0, 448, -448, nan, 0.0, -0.0]))
    else:
        assert same_bits(y5[1:], torch.tensor([inf, inf, -inf, nan, 0.0, -0.0]))
        assert y4[:5].isnan().all() and same_bits(y4[5:], torch.tensor([0.0, -0.0]))


# -- per-tensor scaling --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", EIGHT_BIT, ids=lambda f: f.name)
def test_tensorwise_scale_is_the_largest_safe_power_of_two(fmt):
    g = torch.Generator().manual_seed(4)
    for e in (-30, -5, 0, 3, 9, 20):
        x = torch.randn(1000, generator=g) * 2.0**e
        s = fp8.tensorwise_scale(x, fmt).item()
        amax = x.abs().max().item()
        assert math.frexp(s)[0] == 0.5  # a power of two
        assert amax * s <= fmt.max_finite < amax * 2 * s
    exact = torch.tensor([fmt.max_finite / 4])
    assert fp8.tensorwise_scale(exact, fmt).item() == 4.0  # amax * s == max is allowed
    assert fp8.tensorwise_scale(torch.zeros(5), fmt).item() == 1.0
    assert fp8.quantize_scaled(torch.zeros(0, 3), fmt).shape == (0, 3)
    assert fp8.tensorwise_scale(torch.tensor([1.0, math.inf]), fmt).item() == 1.0


def test_quantize_scaled_keeps_small_tensors_in_range():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(5)) * 2.0**-12
    # unscaled, E4M3 (smallest subnormal 2^-9) flushes all of it; scaled, it keeps 3 bits
    assert (fp8.quantize(x, "e4m3") == 0).all()
    y = fp8.quantize_scaled(x, "e4m3")
    rel = ((y - x).abs() / x.abs()).max().item()
    assert rel <= 2.0**-4 + 1e-7 or (x.abs() < x.abs().max() * 2.0**-6).any()
    s = fp8.tensorwise_scale(x, "e4m3")
    assert same_bits(y * s, fp8.quantize(y * s, "e4m3"))  # y * s is on the E4M3 grid


# -- FP16 master weights -------------------------------------------------------------------------
def test_round_master_to_fp16():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(50_000, generator=g) * torch.exp2(
        torch.randint(-30, 10, (50_000,), generator=g).float()
    )
    assert torch.equal(fp8.round_master_to_fp16(w, stochastic=False), w.half())
    sr = fp8.round_master_to_fp16(w, stochastic=True, generator=g)
    assert sr.dtype == torch.float16
    down, up = neighbours_fp16(w)
    assert ((sr.float().abs() == down) | (sr.float().abs() == up)).all()
    # a weight update below half an FP16 ulp: lost by RNE, kept on average by SR
    m = torch.full((2**16,), 1.0 + 2.0**-13)  # ulp at 1.0 is 2^-10
    assert (fp8.round_master_to_fp16(m, False) == 1.0).all()
    mean = fp8.round_master_to_fp16(m, True, g).double().mean().item()
    p, n = 2.0**-3, 2**16
    assert abs(mean - (1 + 2.0**-13)) <= 5 * math.sqrt(p * (1 - p) / n) * 2.0**-10


def neighbours_fp16(w):
    a = w.abs()
    down = a.half().float()
    down = torch.where(
        down > a, torch.nextafter(down.half(), torch.zeros_like(down.half())).float(), down
    )
    up = torch.where(
        down == a,
        down,
        torch.nextafter(down.half(), torch.full_like(down.half(), math.inf)).float(),
    )
    return down, up


def test_round_params_to_fp16_in_place():
    p = torch.nn.Parameter(torch.randn(100) * 1e-3)
    fp8.round_params_to_fp16_([p], stochastic=True, generator=torch.Generator().manual_seed(0))
    assert p.dtype == torch.float32 and torch.equal(p.data, p.data.half().float())


# -- the rising loss-scale floor -----------------------------------------------------------------
def cfg_with(**fp8_kw) -> PrecisionConfig:
    base = PrecisionConfig(
        compute_dtype="float32", loss_scaling=LossScaling.dynamic, min_scale=2.0, max_scale=2.0**24
    )
    return replace(base, fp8=replace(FP8Config(mode=FP8Mode.emulated), **fp8_kw))


def test_min_scale_at_geometric_and_milestones():
    c = cfg_with(min_scale_rise_every=100, min_scale_rise_factor=2.0, min_scale_rise_max=64.0)
    assert [fp8.min_scale_at(s, c) for s in (0, 99, 100, 250, 400, 10**6)] == [2, 2, 4, 8, 32, 64]
    c = cfg_with(min_scale_milestones=[10, 50], min_scale_milestone_values=[16.0, 256.0])
    assert [fp8.min_scale_at(s, c) for s in (0, 9, 10, 49, 50, 999)] == [2, 2, 16, 16, 256, 256]
    assert fp8.min_scale_at(10**9, cfg_with()) == 2.0  # no schedule: precision.min_scale
    # without a cap the floor stops at max_scale
    assert fp8.min_scale_at(10**6, cfg_with(min_scale_rise_every=1)) == 2.0**24


# -- validation ----------------------------------------------------------------------------------
def emulated(**kw) -> PrecisionConfig:
    return replace(
        PrecisionConfig(compute_dtype="float32", loss_scaling=LossScaling.dynamic),
        fp8=replace(FP8Config(mode=FP8Mode.emulated), **kw),
    )


@pytest.mark.parametrize(
    "make,key",
    [
        (lambda: replace(PrecisionConfig(), fp8=FP8Config(master=FP8Master.fp16)), "fp8.master"),
        (lambda: replace(emulated(), compute_dtype="float16"), "compute_dtype"),
        (lambda: replace(emulated(), weights="low_precision"), "weights"),
        (
            lambda: emulated(**{k: FP8TensorConfig(format=FP8Format.none) for k in fp8.KINDS}),
            "quantizes nothing",
        ),
        (lambda: emulated(master_rounding=FP8Rounding.stochastic), "master_rounding"),
        (lambda: emulated(exempt=[""]), "exempt"),
        (lambda: emulated(min_scale_rise_every=0), "min_scale_rise_every"),
        (lambda: emulated(min_scale_rise_every=10, min_scale_rise_factor=1.0), "rise_factor"),
        (lambda: emulated(min_scale_rise_max=8.0), "min_scale_rise_max"),
        (
            lambda: emulated(min_scale_rise_every=10, min_scale_milestones=[5]),
            "not both",
        ),
        (
            lambda: emulated(min_scale_milestones=[5, 3], min_scale_milestone_values=[2.0, 4.0]),
            "increasing",
        ),
        (lambda: emulated(min_scale_milestones=[5], min_scale_milestone_values=[]), "same length"),
        (
            lambda: emulated(min_scale_milestones=[1, 2], min_scale_milestone_values=[8.0, 4.0]),
            "must rise",
        ),
        (
            lambda: replace(
                emulated(min_scale_rise_every=10), loss_scaling=LossScaling.static, static_scale=8.0
            ),
            "dynamic loss scaling",
        ),
        (
            lambda: replace(
                PrecisionConfig(compute_dtype="float16"), fp8=FP8Config(mode=FP8Mode.torchao)
            ),
            "bfloat16",
        ),
        (
            lambda: replace(
                PrecisionConfig(compute_dtype="bfloat16"),
                fp8=FP8Config(mode=FP8Mode.torchao, master=FP8Master.fp16),
            ),
            "emulated only",
        ),
    ],
)
def test_contradictory_fp8_knobs_are_refused(make, key):
    with pytest.raises(ConfigError, match=key):
        fp8.validate_fp8(make())


def test_paper_scaling_counts_as_dynamic_only_without_a_paper_scale():
    c = replace(emulated(min_scale_rise_every=10), loss_scaling=LossScaling.paper)
    fp8.validate_fp8(c, paper_loss_scale=None)
    with pytest.raises(ConfigError, match="paper scale 512"):
        fp8.validate_fp8(c, paper_loss_scale=512.0)


def test_off_and_default_configs_validate_and_describe_nothing():
    fp8.validate_fp8(PrecisionConfig())
    assert fp8.describe_fp8(PrecisionConfig()) is None
    assert fp8.fp8_mode(PrecisionConfig()) == "none"


def test_the_description_names_each_tensor_s_format_rounding_overflow_and_scaling():
    from conftest import compose

    text = fp8.describe_fp8(compose(["experiment=demo", "precision=fp8_hybrid_emulated"]).precision)
    assert text.startswith(
        "emulated FP8 in conv/linear layers (weights E4M3 RNE saturate, tensorwise scale; "
        "activations E4M3 RNE saturate, tensorwise scale; errors E5M2 RNE nonfinite; "
        "weight_grads E5M2 RNE nonfinite; FP32 accumulation)"
    )


def test_knobs_compose_from_the_command_line_and_typos_are_refused():
    from conftest import compose

    c = compose(
        [
            "experiment=demo",
            "precision=fp8_hybrid_emulated",
            "precision.fp8.errors.rounding=stochastic",
            "precision.fp8.exempt=[first,'features.*']",
        ]
    )
    assert c.precision.fp8.errors.rounding == FP8Rounding.stochastic
    assert list(c.precision.fp8.exempt) == ["first", "features.*"]
    fp8.validate_fp8(c.precision)
    with pytest.raises(Exception, match="e3m4"):  # not a format: Hydra refuses the enum value
        compose(
            ["experiment=demo", "precision=fp8_e5m2_emulated", "precision.fp8.weights.format=e3m4"]
        )
    off = compose(["experiment=demo", "precision=mixed", "precision.fp8.master=fp16"])
    with pytest.raises(
        ConfigError, match=r"precision\.fp8\.master is set but precision\.fp8\.mode=none"
    ):
        fp8.validate_fp8(off.precision)
