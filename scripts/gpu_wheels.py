"""`make gpu-wheels`: fetch, here, the wheels of what mpt-repro needs that the GPU machine's image
lacks (scripts/gpu-wheels.txt) for its Python (CPython 3.12, manylinux x86_64) into .gpu-wheels/
(git-ignored), exactly those; then check that every requirement of every wheel, and every
dependency of pyproject.toml, is met by the image (scripts/gpu-image.txt) or by a wheel.

    python scripts/gpu_wheels.py [--dest .gpu-wheels] [--python-version 3.12] [--check-only]

scripts/gpu_check.sh installs them there with `pip install --no-index --no-deps --target`;
docs/performance.md says how to carry the folder. --python-version 3.11 fetches the same for
another Python (the CPU rehearsal's, make gpu-check-rehearsal).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "gpu-wheels.txt"
IMAGE = ROOT / "scripts" / "gpu-image.txt"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64"]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64", "any"]
LIMIT = 48 * 2**20  # the device tool carries 64 MiB with the working tree (about 3 MiB)


def pins() -> list[tuple[str, str, bool]]:
    """(name, version, build from source) of each line of scripts/gpu-wheels.txt."""
    out = []
    for line in PINS.read_text().splitlines():
        spec, _, comment = line.partition("#")
        if spec.strip():
            name, version = spec.strip().split("==")
            out.append((canonicalize_name(name), version, comment.strip() == "build"))
    return out


def image() -> set[str]:
    words = [w for line in IMAGE.read_text().splitlines() if not line.startswith("#")
             for w in line.split()]  # fmt: skip
    return {canonicalize_name(w) for w in words}


def wheel_name(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return canonicalize_name(name), version


def fetch(dest: Path, py: str) -> None:
    """Download (or build) each pinned wheel not yet in dest; remove any other wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {(n, v) for n, v, _ in pins()}
    for stale in [p for p in dest.glob("*.whl") if wheel_name(p) not in wanted]:
        print(f"gpu-wheels: removing {stale.name} (not in {PINS.name})")
        stale.unlink()
    have = {wheel_name(p) for p in dest.glob("*.whl")}
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    for name, version, build in pins():
        if (name, version) in have:
            continue
        if build:  # pure Python from its source archive: the wheel fits any CPython 3
            cmd = [*pip, "wheel", "--no-deps", "-w", str(dest), f"{name}=={version}"]
        else:
            cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
            cmd += ["--python-version", py, "--implementation", "cp"]
            cmd += [a for p in PLATFORMS for a in ("--platform", p)] + [f"{name}=={version}"]
        print(f"gpu-wheels: {name}=={version}")
        subprocess.run(cmd, check=True)


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:")]  # fmt: skip


def unmet(dest: Path, py: str) -> list[str]:
    """What a wheel, or pyproject.toml, needs that neither the image nor a wheel gives."""
    env = {"python_version": py, "python_full_version": f"{py}.0", "sys_platform": "linux"}
    env.update(platform_system="Linux", platform_machine="x86_64", extra="")
    env.update(implementation_name="cpython", platform_python_implementation="CPython")
    given = image() | {wheel_name(p)[0] for p in dest.glob("*.whl")}
    needs = [(p.name, r) for p in sorted(dest.glob("*.whl")) for r in requirements(p)]
    needs += [("pyproject.toml", r) for r in pyproject_dependencies()]
    problems = []
    for who, text in needs:
        req = Requirement(text)
        if req.marker is not None and not Marker(str(req.marker)).evaluate(env):
            continue
        if canonicalize_name(req.name) not in given:
            problems.append(f"{who} needs {req.name}, which neither the image nor a wheel has")
    return problems


def pyproject_dependencies() -> list[str]:
    """pyproject.toml's [project] dependencies (read without tomllib: Python 3.10 has none)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    return re.findall(r'^\s*"([^"]+)"', block, re.M)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", type=Path, default=ROOT / ".gpu-wheels")
    p.add_argument("--python-version", default="3.12", help="the Python the wheels are for")
    p.add_argument("--check-only", action="store_true", help="fetch nothing: check the folder")
    args = p.parse_args(argv)
    if not args.check_only:
        fetch(args.dest, args.python_version)
    problems = unmet(args.dest, args.python_version)
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    missing = {(n, v) for n, v, _ in pins()} - {wheel_name(w) for w in wheels}
    problems += [f"{n}=={v} is not in {args.dest}" for n, v in sorted(missing)]
    if size > LIMIT:
        problems.append(f"{size / 2**20:.1f} MiB is more than the {LIMIT / 2**20:.0f} MiB allowed")
    for line in problems:
        print(f"gpu-wheels: {line}", file=sys.stderr)
    print(f"gpu-wheels: {len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
