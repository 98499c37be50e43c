"""The MX block quantizer (mpt_repro/precision/mx.py) checked bit for bit against an independent
reference built on ml_dtypes' element and scale types, and against torchao's MX casts where
torchao is importable (docs/mx.md, "Exactness").

    .venv/bin/python scripts/mx_exactness.py                   # 10^7 values per format (~1 min)
    .venv/bin/python scripts/mx_exactness.py --values 100000   # a quick look
    PYTHONPATH=/path/to/torchao .venv/bin/python scripts/mx_exactness.py   # also against torchao
                                                               # (10^6 values per format)

The reference, per block of 32 (numpy, float64, exact for FP32 inputs):
    s = floor(log2 max|V|) - emax (np.frexp), clamped to [-127, 127]; -127 for a zero block
    scale code: ml_dtypes.float8_e8m0fnu of 2^s (of NaN when the block holds an inf or a NaN)
    element:    ml_dtypes' cast (round to nearest even) of V / 2^s clipped to +-max normal
The samples mix blocks of mixed magnitude, values on the element grid, its midpoints and their
FP32 neighbours (ties), random FP32 bit patterns (NaN, inf, subnormals, huge and tiny values),
zero blocks, blocks of FP32 subnormals, tiny blocks whose scale clamps, and normal data.
Prints one row per format; exit 1 if any value or code differs from the reference.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK = 32
ML_DTYPES = {
    "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "e3m2": "float6_e3m2fn",
    "e2m3": "float6_e2m3fn",
    "e2m1": "float4_e2m1fn",
}
KINDS = ("mixed", "grid", "bits", "special", "normal")


def _fmt(name: str):
    from mpt_repro.precision.mx import element_format

    return element_format(name)


def _grid(name: str) -> np.ndarray:
    """Every finite non-negative value of the element format (from ml_dtypes' codes)."""
    import ml_dtypes

    dt = getattr(ml_dtypes, ML_DTYPES[name])
    bits = {"e4m3": 8, "e5m2": 8, "e3m2": 6, "e2m3": 6, "e2m1": 4}[name]
    codes = np.arange(2 ** (bits - 1), dtype=np.uint8)  # sign bit clear
    v = codes.view(dt).astype(np.float64)
    return np.unique(v[np.isfinite(v)])


def samples(name: str, n_values: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(blocks (B, 32) float32, kind index per block): about n_values values in all."""
    rng = np.random.default_rng(seed)
    fmt = _fmt(name)
    b = max(len(KINDS), n_values // BLOCK)
    kind = rng.integers(0, len(KINDS), b)
    out = np.empty((b, BLOCK), np.float32)
    sign = rng.choice([-1.0, 1.0], (b, BLOCK))
    # mixed: a block centre anywhere in FP32's range, values spread 2^+-20 around it
    centre = rng.uniform(-125, 125, (b, 1))
    mixed = sign * np.exp2(np.clip(centre + rng.uniform(-20, 20, (b, BLOCK)), -149, 127.9))
    # grid: element values, midpoints and their neighbours, times 2^s; the top binade sets s
    g = _grid(name)
    mids = (g[1:] + g[:-1]) / 2
    pool = np.concatenate([g, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    pool = pool[pool <= fmt.max_finite * 1.2]
    s = rng.integers(-126, 120, (b, 1)).astype(np.float64)
    grid = sign * rng.choice(pool, (b, BLOCK)) * np.exp2(s)
    top = g[g >= 2.0**fmt.max_exp]
    grid[:, 0] = rng.choice(np.concatenate([top, [fmt.max_finite * 1.1]]), b) * np.exp2(s[:, 0])
    bits = rng.integers(0, 2**32, (b, BLOCK), dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = rng.standard_normal((b, BLOCK)) * 10.0 ** rng.uniform(-3, 3, (b, 1))
    special = _special_blocks(rng, b, fmt)
    for i, src in enumerate((mixed, grid, bits, special, normal)):
        with np.errstate(over="ignore"):
            out[kind == i] = src[kind == i].astype(np.float32)
    return out, kind


def _special_blocks(rng, b: int, fmt) -> np.ndarray:
    """Zero blocks, one inf / -inf / NaN among normal values, FP32 subnormals, tiny blocks
    whose scale clamps at 2^-127, blocks near FP32's max, blocks that saturate."""
    x = rng.standard_normal((b, BLOCK))
    which = rng.integers(0, 7, b)
    x[which == 0] = 0.0
    pos = rng.integers(0, BLOCK, b)
    special = np.choose(rng.integers(0, 3, b), [np.inf, -np.inf, np.nan])
    x[which == 1, pos[which == 1]] = special[which == 1]
    x[which == 2] *= 2.0**-140  # FP32 subnormals
    x[which == 3] *= 2.0 ** (fmt.max_exp - 127 - rng.integers(1, 8, (b, 1)))[which == 3]
    x[which == 4] = x[which == 4] / np.abs(x[which == 4]).max(1, keepdims=True) * 3.3e38
    top = 2.0**fmt.max_exp * rng.uniform(1.0, 2.0, b)  # max normal < top < 2^(emax+1): saturates
    x[which == 5, 0] = top[which == 5] * 2.0**-20
    x[(which == 6)[:, None] & (rng.random((b, BLOCK)) < 0.5)] = 0.0  # half zeros
    return x


def reference(blocks: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale codes uint8 (B,), element codes uint8 (B, 32), values float32 (B, 32))."""
    import ml_dtypes

    fmt = _fmt(name)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns among the random bits
        x = blocks.astype(np.float64)
    bad = ~np.isfinite(x).all(1)
    amax = np.abs(np.where(np.isfinite(x), x, 0.0)).max(1)
    _, e = np.frexp(amax)  # amax = m 2^e, 0.5 <= m < 1: floor(log2 amax) = e - 1
    s = np.clip(np.where(amax > 0, e - 1 - fmt.max_exp, -127), -127, 127)
    scale = np.exp2(s.astype(np.float64))
    codes = np.where(bad, np.nan, scale).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    v = np.clip(np.where(np.isfinite(x), x, 0.0) / scale[:, None], -fmt.max_finite, fmt.max_finite)
    p = v.astype(getattr(ml_dtypes, ML_DTYPES[name]))
    values = (p.astype(np.float64) * scale[:, None]).astype(np.float32)
    values[bad] = np.nan
    return codes, p.view(np.uint8), values


def ours(blocks: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same three from mpt_repro.precision.mx (element codes: our exact element values
    cast to ml_dtypes' type, which is exact)."""
    import ml_dtypes
    import torch

    from mpt_repro.precision import mx

    t = torch.from_numpy(blocks)
    enc = mx.mx_encode(t, name)
    values = mx.mx_quantize(t, name).numpy()
    el = enc.elements.reshape(blocks.shape).numpy().astype(getattr(ml_dtypes, ML_DTYPES[name]))
    return enc.codes().reshape(-1).numpy(), el.view(np.uint8), values


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: identical FP32 bit patterns, or both NaN (any NaN payload)."""
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def check(name: str, n_values: int, seed: int = 0) -> dict:
    """Counts of one format's check: values, blocks per kind, and the mismatches."""
    blocks, kind = samples(name, n_values, seed)
    r_codes, r_el, r_val = reference(blocks, name)
    o_codes, o_el, o_val = ours(blocks, name)
    finite = np.isfinite(blocks).all(1)
    return {
        "format": name,
        "values": blocks.size,
        "blocks": len(blocks),
        **{f"blocks_{k}": int((kind == i).sum()) for i, k in enumerate(KINDS)},
        "nan_scale_blocks": int((r_codes == 0xFF).sum()),
        "clamped_blocks": int(((r_codes == 0) & finite & (np.abs(blocks).max(1) > 0)).sum()),
        "zero_values": int((r_val == 0).sum()),
        "scale_mismatches": int((r_codes != o_codes).sum()),
        "element_mismatches": int((r_el != o_el)[finite].sum()),
        "value_mismatches": int((~same_bits(r_val, o_val)).sum()),
    }


def torchao_check(name: str, n_values: int, seed: int = 0) -> dict | None:
    """Our values against torchao's to_mx/to_dtype (scaling FLOOR, the spec's rule): mismatched
    blocks, split into those with an inf (torchao: a finite scale, elements saturated), those
    with scale code 0 (torchao divides by 2^-126, not 2^-127), and the rest. None without
    torchao."""
    try:
        import torch
        from torchao.prototype.mx_formats import constants as c
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    except Exception:
        return None
    dtypes = {
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "e3m2": c.DTYPE_FP6_E3M2,
        "e2m3": c.DTYPE_FP6_E2M3,
        "e2m1": torch.float4_e2m1fn_x2,
    }
    blocks, _ = samples(name, n_values, seed)
    t = torch.from_numpy(blocks)
    scale, data = to_mx(t, dtypes[name], BLOCK)
    theirs = to_dtype(data, scale, dtypes[name], BLOCK, torch.float32).numpy()
    codes, _, mine = ours(blocks, name)
    bad_block = (~same_bits(theirs, mine)).any(1)
    has_inf = np.isinf(blocks).any(1)
    code0 = codes == 0
    return {
        "format": name,
        "blocks": len(blocks),
        "differ": int(bad_block.sum()),
        "differ_inf_blocks": int((bad_block & has_inf).sum()),
        "differ_scale_code_0": int((bad_block & ~has_inf & code0).sum()),
        "differ_other": int((bad_block & ~has_inf & ~code0).sum()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--values", type=int, default=10_000_000, help="values per format")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--torchao-values", type=int, default=1_000_000, help="values per format against torchao"
    )
    ap.add_argument("--no-torchao", action="store_true", help="skip the torchao comparison")
    args = ap.parse_args(argv)
    failed = False
    print("| format | values | blocks | NaN-scale blocks | clamped blocks | zeros out | "
          "scale codes differ | element codes differ | values differ | s |")  # fmt: skip
    print("| --- | " + "--- | " * 9)
    for name in ML_DTYPES:
        t0 = time.perf_counter()
        r = check(name, args.values, args.seed)
        failed |= bool(r["scale_mismatches"] or r["element_mismatches"] or r["value_mismatches"])
        print(
            f"| {name} | {r['values']:,} | {r['blocks']:,} | {r['nan_scale_blocks']:,} | "
            f"{r['clamped_blocks']:,} | {r['zero_values']:,} | {r['scale_mismatches']} | "
            f"{r['element_mismatches']} | {r['value_mismatches']} | "
            f"{time.perf_counter() - t0:.1f} |"
        )
    if not args.no_torchao:
        rows = [torchao_check(name, args.torchao_values, args.seed) for name in ML_DTYPES]
        if rows[0] is None:
            print("\ntorchao: not importable here; the comparison is skipped")
        else:
            print("\n| format (vs torchao to_mx FLOOR) | blocks | blocks differ | with an inf | "
                  "scale code 0 | other |")  # fmt: skip
            print("| --- | " + "--- | " * 5)
            for r in rows:
                print(
                    f"| {r['format']} | {r['blocks']:,} | {r['differ']:,} | "
                    f"{r['differ_inf_blocks']:,} | {r['differ_scale_code_0']:,} | "
                    f"{r['differ_other']:,} |"
                )
    print("\nexact: every value and code as the reference" if not failed else "\nMISMATCH")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
