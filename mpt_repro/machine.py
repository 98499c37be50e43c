"""The machine behind a run's numbers, and the portable mode that makes them the same on any.

On a CPU the bits of a result depend on more than the code and the seeds: torch picks its
vectorised kernels for the processor (ATen's CPU capability: AVX-512 on one machine, AVX2 on
another), oneDNN (convolutions, FP16/BF16 matmuls) picks its own by instruction set, MKL (FP32
matmuls, the LSTM's GEMMs) picks a code branch per processor, and a reduction split over threads
sums in another order with another thread count. Measured here (docs/reliability.md "The same
numbers on another machine"): each of the three kernel choices alone changes a smoke run's bits.

**The fingerprint** (`fingerprint`, run.json `machine`): what decides the numbers on this device,
so that two records that differ can say why: the CPU (vendor, model, the instruction sets that
matter), torch's CPU capability, oneDNN and the BLAS with their instruction-set limits where set,
the thread count, the environment variables that pin them, and on a GPU its name, driver, CUDA and
cuDNN versions and the TF32 / reduced-precision switches.

**Portable mode** (`trainer.portable=true`): one thread and every kernel choice pinned to AVX2,
which almost every x86-64 machine made since 2015 has (`PORTABLE_ENV`). The variables must be set
before torch loads (ATen, oneDNN, MKL and OpenMP read them once): mpt-run sets them when its
command line asks (`asked_on_command_line`, before the configuration is composed: composing a
job imports its task's module, and torch with it); a job whose configuration file asks finds
torch loaded, and says so (`pin_for`). A machine that cannot honour the mode (another
architecture, no AVX2, torch already loaded with other kernels, a GPU run) says so in one line
and its record is marked not portable (`portable.honoured: false` with the reason).

Nothing here imports torch at import time: the reporter reads records through `numerics_label`.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

PORTABLE_LEVEL = "AVX2"
# What pins every kernel choice that decides the bits to AVX2 and one thread (each one measured
# to matter: docs/reliability.md). ONEDNN_ and DNNL_ are the new and old names of one setting.
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own vectorised kernels (default|avx2|avx512)
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN: convolutions, FP16/BF16 matmuls
    "DNNL_MAX_CPU_ISA": "AVX2",
    "ONEDNN_DEFAULT_FPMATH_MODE": "STRICT",  # no implicit down-conversion of FP32 math
    "MKL_CBWR": "AVX2,STRICT",  # MKL's conditional numerical reproducibility, AVX2 branch
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OMP_NUM_THREADS": "1",  # reductions split over threads sum in another order
    "MKL_NUM_THREADS": "1",
}
# recorded when set, whoever set them: they change which kernels run
RECORDED_ENV = (*PORTABLE_ENV, "MKL_DEBUG_CPU_TYPE", "KMP_AFFINITY", "OMP_DYNAMIC")
# the CPU flags that decide which kernels the libraries can pick (from /proc/cpuinfo)
DECIDING_FLAGS = (
    "sse4_2",
    "avx",
    "fma",
    "f16c",
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_fp16",
    "amx_int8",
)
X86_64 = ("x86_64", "amd64")


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The processor: architecture, vendor, model name and its DECIDING_FLAGS (what the Linux
    kernel reports; elsewhere the model from platform and no flags)."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if not sep:
                if fields:  # the first processor's block is enough
                    break
                continue
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {
        "arch": platform.machine(),
        "vendor": fields.get("vendor_id") or None,
        "model": fields.get("model name") or platform.processor() or None,
        "flags": [f for f in DECIDING_FLAGS if f in flags] if flags else None,
        "logical_cpus": os.cpu_count(),
    }


def cannot_honour(cpu: Mapping[str, Any]) -> str | None:
    """Why this processor cannot give portable mode's bits, or None. On a non-Intel x86-64 CPU
    MKL's reproducible AVX2 branch is not guaranteed (Intel's documentation: it falls back to its
    AUTO branch there), so FP32 matmuls may differ."""
    arch = str(cpu.get("arch") or "").lower()
    if arch not in X86_64:
        return f"portable mode pins x86-64 AVX2 kernels and this machine is {arch or 'unknown'}"
    flags = cpu.get("flags")
    if flags is not None and not {"avx2", "fma"} <= set(flags):
        return "portable mode pins AVX2 kernels and this CPU has no AVX2/FMA"
    vendor = cpu.get("vendor")
    if vendor and vendor != "GenuineIntel":
        return (
            f"MKL's reproducible AVX2 branch is documented for Intel CPUs only (this one is "
            f"{vendor}): FP32 matmuls may differ"
        )
    return None


def pin(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set PORTABLE_ENV in `environ` for the torch this process is about to load; why the pin
    cannot take effect, or None. Torch already loaded keeps the kernels it picked, unless it was
    started pinned (the variables already hold these values)."""
    already = all(environ.get(k) == v for k, v in PORTABLE_ENV.items())
    if "torch" in sys.modules and not already:
        return (
            "torch was loaded in this process before the kernels could be pinned (run "
            "portable runs in an mpt-run of their own, not after native ones)"
        )
    environ.update(PORTABLE_ENV)
    return cannot_honour(cpu_info())


def asked_on_command_line(argv: list[str]) -> bool:
    """Whether the command line sets trainer.portable to true (`trainer.portable=true`, or a
    sweep over it: `trainer.portable=false,true` pins the whole process, whose jobs share one
    torch): read before anything composes the configuration, since composing a job's may load
    torch (its task's module)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if sep and key == "trainer.portable" and "true" in value.lower():
            return True
    return False


def pin_for(cfg: Any, log: Any = None) -> None:
    """mpt-run's job, before it imports torch: pin the kernels when the run asks for portable
    mode; a pin that cannot take effect is said in one line (the record says it too)."""
    trainer = cfg.get("trainer") or {}
    if not trainer.get("portable", False):
        return
    problem = pin()
    if str(trainer.get("device", "")).startswith("cuda"):
        problem = "portable mode pins CPU kernels only, and this run is on a GPU"
    if problem:
        line = f"trainer.portable=true cannot be honoured here: {problem}; the record says so"
        if log is not None:
            log.warning(line)
        else:
            print(f"mpt-run: warning: {line}", file=sys.stderr)


def _library_versions() -> dict[str, str | None]:
    """oneDNN's and MKL's versions as torch was built with them (torch.__config__.show())."""
    import torch

    try:
        shown = torch.__config__.show()
    except Exception:  # noqa: BLE001 - a build that cannot describe itself: versions unknown
        shown = ""
    onednn = re.search(r"(?:MKL-DNN|oneDNN)\s+v?([\w.]+)", shown)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", shown)
    blas = re.search(r"BLAS_INFO=(\w+)", shown)
    return {
        "onednn": onednn.group(1) if onednn else None,
        "blas": blas.group(1) if blas else None,
        "mkl": mkl.group(1) if mkl else None,
    }


def _gpu(device: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What decides a GPU run's bits besides the code: the device, its driver, the CUDA and
    cuDNN versions, and the switches that let matmuls and convolutions round more."""
    if not isinstance(device, Mapping) or device.get("type") != "cuda":
        return None
    import torch

    try:
        driver = Path("/proc/driver/nvidia/version").read_text().split("Kernel Module")[1]
        driver = driver.split()[0]
    except (OSError, IndexError):
        driver = None
    matmul = torch.backends.cuda.matmul
    return {
        "name": device.get("name"),
        "capability": device.get("capability"),
        "driver": driver,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": bool(matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
        "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def fingerprint(device: Mapping[str, Any] | None = None, portable: bool = False) -> dict[str, Any]:
    """run.json's `machine`: what decides the numbers on this device (module docstring).
    `device`: the record's device ({"type": "cuda", ...} adds the GPU's fields); `portable`:
    whether the run asked for portable mode."""
    import torch

    cpu = cpu_info()
    env = {k: os.environ[k] for k in RECORDED_ENV if k in os.environ}
    libraries = _library_versions()
    gpu = _gpu(device)
    found = {
        "cpu": cpu,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn": {
            "version": libraries["onednn"],
            "enabled": bool(torch.backends.mkldnn.enabled),
            "max_isa": env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA"),
        },
        "blas": {
            "name": libraries["blas"],
            "mkl": libraries["mkl"],
            "cbwr": env.get("MKL_CBWR"),
            "instructions": env.get("MKL_ENABLE_INSTRUCTIONS"),
        },
        "threads": torch.get_num_threads(),
        "env": env,
        "gpu": gpu,
    }
    found["portable"] = portable_state(found, portable)
    return found


def portable_state(found: Mapping[str, Any], requested: bool) -> dict[str, Any]:
    """{requested, honoured, level, reason}: a portable run is honoured when every pin is in
    force in this very process (torch picked AVX2, one thread, the variables set) on a CPU that
    can give its bits; the reason names what is missing."""
    if not requested:
        return {"requested": False, "honoured": False, "level": None, "reason": None}
    env = found.get("env") or {}
    unpinned = [k for k, v in PORTABLE_ENV.items() if env.get(k) != v]
    reason = cannot_honour(found.get("cpu") or {})
    if found.get("gpu"):
        reason = "portable mode covers CPU kernels only; a GPU run's bits depend on its fields"
    elif str(found.get("torch_cpu_capability")).upper() != PORTABLE_LEVEL:
        reason = reason or (
            f"torch uses {found.get('torch_cpu_capability')} kernels, not {PORTABLE_LEVEL} "
            "(torch was loaded before the pin, or this CPU lacks AVX2)"
        )
    elif found.get("threads") != 1:
        reason = reason or f"{found.get('threads')} threads, not 1"
    elif unpinned:
        reason = reason or f"not set as portable mode sets them: {', '.join(unpinned)}"
    return {
        "requested": True,
        "honoured": reason is None,
        "level": PORTABLE_LEVEL,
        "reason": reason,
    }


def numerics_label(machine: Mapping[str, Any] | None) -> str:
    """What decides a record's numbers, in one short line ("" for a record without `machine`):
    two records whose labels differ may differ in their bits for that reason alone.

    `portable AVX2, x86_64, 1 thread`; `native AVX512 (oneDNN ≤AVX2), Intel(R) Xeon(R)
    Processor, 2 threads`; on a GPU its name, driver, CUDA, cuDNN and TF32 switches."""
    if not isinstance(machine, Mapping):
        return ""
    gpu = machine.get("gpu")
    if isinstance(gpu, Mapping):

        def switch(name: str) -> str:
            return "on" if gpu.get(name) else "off"

        return (
            f"{gpu.get('name')}, driver {gpu.get('driver')}, CUDA {gpu.get('cuda')}, "
            f"cuDNN {gpu.get('cudnn')}, TF32 matmul {switch('tf32_matmul')} "
            f"cuDNN {switch('tf32_cudnn')}"
        )
    cpu = machine.get("cpu") if isinstance(machine.get("cpu"), Mapping) else {}
    threads = machine.get("threads")
    plural = "thread" if threads == 1 else "threads"
    portable = machine.get("portable") if isinstance(machine.get("portable"), Mapping) else {}
    if portable.get("honoured"):
        return f"portable {portable.get('level')}, {cpu.get('arch')}, {threads} {plural}"
    pins = [
        f"oneDNN ≤{(machine.get('onednn') or {}).get('max_isa')}"
        if (machine.get("onednn") or {}).get("max_isa")
        else "",
        f"MKL_CBWR={(machine.get('blas') or {}).get('cbwr')}"
        if (machine.get("blas") or {}).get("cbwr")
        else "",
    ]
    pinned = ", ".join(p for p in pins if p)
    capability = machine.get("torch_cpu_capability")
    return (
        f"native {capability}{f' ({pinned})' if pinned else ''}, {cpu.get('model')}, "
        f"{threads} {plural}"
    )


# -- digests of a run's numbers ------------------------------------------------------------------
def items_digest(run_dir: Path) -> str | None:
    """sha256 of the per-item file's arrays (eval_items.npz: every name, dtype, shape and byte),
    not of the file: a zip's own bytes carry dates. None when the run has no such file."""
    import hashlib

    import numpy as np

    path = Path(run_dir) / "eval_items.npz"
    if not path.is_file():
        return None
    found = hashlib.sha256()
    with np.load(path, allow_pickle=False) as items:
        for name in sorted(items.files):
            array = np.ascontiguousarray(items[name])
            found.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
            found.update(array.tobytes())
    return found.hexdigest()


def result_digest(run_dir: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    """What two runs of one identity must share to be bit-identical: the status, every final
    metric (floats as JSON writes them: exact) and the per-item file's digest, and one sha256
    over the three."""
    import hashlib
    import json

    metrics = record.get("metrics") if isinstance(record.get("metrics"), Mapping) else {}
    found = {
        "status": record.get("status"),
        "metrics": dict(metrics),
        "items": items_digest(run_dir),
    }
    text = json.dumps(found, sort_keys=True)
    found["digest"] = hashlib.sha256(text.encode()).hexdigest()
    return found
