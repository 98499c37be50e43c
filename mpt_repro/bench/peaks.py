"""Dense peak arithmetic rates of the GPUs the bench knows, for model-FLOPs utilisation (MFU).

TFLOP/s, dense (NVIDIA's datasheets print tensor-core rates "with sparsity": those are halved
here). Sources:
- H100 SXM5 80GB: NVIDIA H100 datasheet / product page (https://www.nvidia.com/en-us/data-center/
  h100/); dense values as in the H100 architecture whitepaper, tabulated at
  https://glennklockwood.com/garden/processors/h100 (FP32 66.9, FP16/BF16 989.4, FP8 1978.9).
- H100 PCIe 80GB: the same datasheet, PCIe column (FP32 51, TF32 756*, FP16/BF16 1,513*,
  FP8 3,026*; * with sparsity), also https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html.
- H200 SXM 141GB: NVIDIA H200 datasheet (https://www.nvidia.com/en-us/data-center/h200/): the
  H100 SXM5's compute (FP32 67, TF32 989*, FP16/BF16 1,979*, FP8 3,958*) with more memory.
- A100 SXM4 / PCIe (40 and 80 GB): NVIDIA A100 datasheet (https://www.nvidia.com/en-us/
  data-center/a100/): FP32 19.5, TF32 156 (312*), FP16/BF16 312 (624*); no FP8.
- V100 SXM2 / PCIe / V100S: NVIDIA V100 datasheet (https://www.nvidia.com/en-us/data-center/
  v100/): FP32 15.7 / 14 / 16.4, FP16 tensor 125 / 112 / 130; no TF32, BF16 or FP8.
The achievable rate is lower (a bf16 GEMM of 8192^3 reached ~81 % of the H100 SXM's 989.4 in our
own measurement): MFU is against the datasheet, as MLPerf and the literature report it.
"""

from __future__ import annotations

# math kind -> dense TFLOP/s; None: the GPU has no such math
PEAKS: dict[str, dict[str, float | None]] = {
    "H100 SXM": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.5, "bf16": 756.5, "fp8": 1513.0},
    "H200 SXM": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "fp8": None},
    "V100 SXM2": {"fp32": 15.7, "tf32": None, "fp16": 125.0, "bf16": None, "fp8": None},
    "V100 PCIe": {"fp32": 14.0, "tf32": None, "fp16": 112.0, "bf16": None, "fp8": None},
    "V100S PCIe": {"fp32": 16.4, "tf32": None, "fp16": 130.0, "bf16": None, "fp8": None},
}


def gpu_model(device_name: str) -> str | None:
    """The PEAKS row of a CUDA device name (torch.cuda.get_device_name), or None when unknown
    (an NVL part, a consumer card...): then no MFU is reported rather than a wrong one."""
    n = device_name.upper()
    if "NVL" in n:
        return None  # NVL parts run at other clocks and power limits than the rows above
    if "H200" in n:
        return "H200 SXM"
    if "H100" in n:
        return "H100 PCIe" if "PCIE" in n else "H100 SXM"
    if "A100" in n:
        return "A100"
    if "V100S" in n:
        return "V100S PCIe"
    if "V100" in n:
        return "V100 PCIe" if "PCIE" in n else "V100 SXM2"
    return None


def math_kind(compute_dtype: str, allow_tf32: bool, fp8_mode: str = "none") -> str:
    """Which peak a preset's convolutions and matmuls can reach: its compute dtype, with FP32
    reaching the TF32 tensor-core rate only when TF32 is allowed. precision.fp8.mode=torchao
    runs its linear layers' GEMMs in FP8: held to the FP8 peak (an upper bound when some layers,
    e.g. convolutions, stay in the compute dtype); emulated FP8 computes in the compute dtype."""
    if str(fp8_mode).lower() == "torchao":
        return "fp8"
    d = str(compute_dtype).lower()
    if "float8" in d or "fp8" in d:
        return "fp8"
    if d in ("float16", "fp16", "half"):
        return "fp16"
    if d in ("bfloat16", "bf16"):
        return "bf16"
    return "tf32" if allow_tf32 else "fp32"


def peak_tflops(device_name: str, kind: str) -> float | None:
    model = gpu_model(device_name)
    return PEAKS[model].get(kind) if model else None
