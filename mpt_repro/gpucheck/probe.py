"""What the machine has, as JSON on stdout: every package the suite needs (imported one by one:
the name of each that fails), their versions, torch's CUDA and the GPUs. Run in a process of its
own (`python -m mpt_repro.gpucheck.probe`), so CUDA starts and ends there, not in the process
that runs the steps."""

from __future__ import annotations

import importlib
import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

# every dependency in pyproject.toml, by the module that imports it (tests/test_gpu_check.py
# keeps the two lists equal); importing each also imports what it needs (antlr4 under
# omegaconf, rapidfuzz under jiwer, cffi and libsndfile under soundfile)
NEEDED = {
    "torch": "torch",
    "torchvision": "torchvision",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "tensorboard": "tensorboard",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "tqdm": "tqdm",
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher": "hydra-submitit-launcher",
    "sacrebleu": "sacrebleu",
    "soundfile": "soundfile",
    "jiwer": "jiwer",
}


def probe() -> dict:
    missing, versions = [], {}
    for module, dist in NEEDED.items():
        try:
            importlib.import_module(module)
        except Exception as e:  # ImportError, or a library that fails to load (OSError)
            missing.append({"module": module, "dist": dist, "error": _line(e)})
            continue
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:  # imported from a folder without its metadata
            versions[dist] = "unknown"
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "missing": missing,
        "versions": versions,
        **({} if "torch" in {m["module"] for m in missing} else _cuda()),
    }


def _cuda() -> dict:
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if gpus else None,
        "gpus": gpus,
    }


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


if __name__ == "__main__":
    print(json.dumps(probe()))
