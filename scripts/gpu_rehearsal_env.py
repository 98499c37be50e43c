"""The CPU rehearsal's stand-in for the GPU machine (make gpu-check-rehearsal): a venv whose
python3 sees this environment's packages except mpt-repro itself and those the GPU image lacks
(scripts/gpu-wheels.txt), and those wheels fetched for this Python, so the rehearsal installs
and imports them the way scripts/gpu_check.sh does there.

    python scripts/gpu_rehearsal_env.py DIR      # DIR/venv/bin/python3 and DIR/wheels/

The venv does not copy the packages: a .pth file puts DIR/image/ on its path, a folder of links
to every top-level entry of this environment's site-packages but the left-out distributions'.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_wheels  # noqa: E402  (scripts/ is no package)

PROJECT = "mpt-repro"


def left_out() -> set[str]:
    """Top-level names in site-packages that belong to mpt-repro or to a carried distribution
    (their modules, their .dist-info, their .pth files and editable finders)."""
    names = {n for n, _, _ in gpu_wheels.pins()} | {canonicalize_name(PROJECT)}
    out = set()
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in names:
            continue
        for f in dist.files or []:
            out.add(Path(str(f)).parts[0])
    return out | {"hydra_plugins", "mpt_repro"}


def site_dirs() -> list[Path]:
    """This environment's site-packages folders, .pth-added ones included, in path order."""
    found = [Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return [p for p in dict.fromkeys(found) if p.is_dir()]


def build(root: Path) -> Path:
    """DIR/venv (made once) with DIR/image/ on its path; returns its python3."""
    python = root / "venv" / "bin" / "python3"
    if not python.exists():
        venv.EnvBuilder(with_pip=True, symlinks=True).create(root / "venv")
    image = root / "image"
    image.mkdir(parents=True, exist_ok=True)
    for link in image.iterdir():
        link.unlink()
    skip = left_out()
    for site in site_dirs():
        for entry in site.iterdir():
            name = entry.name
            if name in skip or name.endswith(".pth") or name.startswith(("__", "_distutils")):
                continue
            if not (image / name).exists():
                (image / name).symlink_to(entry)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "gpu_image.pth").write_text(f"{image.resolve()}\n")
    return python


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve()
    python = build(root)
    version = sysconfig.get_python_version()
    code = gpu_wheels.main(["--dest", str(root / "wheels"), "--python-version", version])
    print(f"gpu-rehearsal: {python} (no {PROJECT}; {len(left_out())} entries left out)")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
