"""A small mutation check of the precision engine and the training loop: `make mutants`.

Each mutant changes one operator or constant in one file (a comparison flipped, + for -, and for
or, a 0 for a 1, a condition negated), in a scratch copy of the package, and runs the fast tests
that should notice. A mutant the tests do not kill (a "survivor") is a behaviour no test pins
down: read it, and either write the test or explain why the change is harmless.

    python scripts/mutants.py                # every mutant of the default files (slow)
    python scripts/mutants.py --max 40       # a seeded sample of 40
    python scripts/mutants.py --files mpt_repro/schedule.py --max 10
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [
    "mpt_repro/precision/scalers.py",
    "mpt_repro/precision/optimizer.py",
    "mpt_repro/precision/master.py",
    "mpt_repro/schedule.py",
    "mpt_repro/ema.py",
    "mpt_repro/trainer.py",
]
# task-level tests: they import the package from PYTHONPATH (the mutated copy); tests that run
# the `mpt-run` console script would import the unmutated installed one, so they are not listed
TESTS = [
    "tests/test_precision.py",
    "tests/test_sync_free.py",
    "tests/test_trainer.py",
    "tests/test_accumulate.py",
]

SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.And: ast.Or,
    ast.Or: ast.And,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}


@dataclass
class Mutant:
    file: str
    line: int
    what: str
    index: int  # the index-th mutation site of the file


def sites(tree: ast.AST) -> list[tuple[ast.AST, int | None, str]]:
    """Every place a mutation applies to, in a fixed order: (node, index of the operator in a
    comparison or None, description). Operators are shared singletons in Python's AST, so a
    mutation replaces the operator in its node, never the operator object. Type annotations
    are excluded: `int | None` is not behaviour."""
    annotations = set()
    for node in ast.walk(tree):
        for ann in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if ann is not None:
                annotations.update(id(n) for n in ast.walk(ann))
    out: list[tuple[ast.AST, int | None, str]] = []
    for node in ast.walk(tree):
        if id(node) in annotations:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in SWAP:
                    out.append((node, i, f"{type(op).__name__} -> {SWAP[type(op)].__name__}"))
        elif isinstance(node, (ast.BinOp, ast.AugAssign, ast.BoolOp)) and type(node.op) in SWAP:
            op = type(node.op)
            out.append((node, None, f"{op.__name__} -> {SWAP[op].__name__}"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if node.value in (0, 1):
                out.append((node, None, f"constant {node.value} -> {1 - node.value}"))
        elif isinstance(node, ast.If):
            out.append((node, None, "if condition negated"))
    return out


def mutate(source: str, index: int) -> tuple[str, int, str]:
    """The source with the index-th site mutated, the site's line, and what changed."""
    tree = ast.parse(source)
    node, i, what = sites(tree)[index]
    if isinstance(node, ast.If):
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif isinstance(node, ast.Constant):
        node.value = 1 - node.value
    elif isinstance(node, ast.Compare):
        node.ops[i] = SWAP[type(node.ops[i])]()
    else:
        node.op = SWAP[type(node.op)]()
    return ast.unparse(tree), node.lineno, what


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--files", nargs="*", default=FILES)
    ap.add_argument("--max", type=int, default=None, help="a seeded random sample of this many")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per mutant's test run")
    args = ap.parse_args()

    mutants = []
    for f in args.files:
        n = len(sites(ast.parse((ROOT / f).read_text())))
        mutants += [Mutant(f, 0, "", i) for i in range(n)]
    if args.max is not None and args.max < len(mutants):
        mutants = random.Random(args.seed).sample(mutants, args.max)
    print(f"{len(mutants)} mutants of {len(args.files)} files; tests: {' '.join(TESTS)}")

    survivors, killed = [], 0
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        # a scratch copy of what the tests need; pytest runs there, so `python -m pytest`'s
        # own sys.path entry (the working directory) is the copy too
        scratch = Path(tmp)
        for part in ("mpt_repro", "tests", "conf"):
            shutil.copytree(ROOT / part, scratch / part)
        shutil.copy(ROOT / "pyproject.toml", scratch)
        for i, m in enumerate(mutants, 1):
            original = (ROOT / m.file).read_text()
            text, m.line, m.what = mutate(original, m.index)
            (scratch / m.file).write_text(text)
            env = {**os.environ, "PYTHONPATH": str(scratch)}
            cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS]
            try:
                r = subprocess.run(
                    cmd, cwd=scratch, env=env, capture_output=True, timeout=args.timeout
                )
                dead = r.returncode != 0
            except subprocess.TimeoutExpired:
                dead = True  # a mutant that hangs the tests is noticed
            finally:
                (scratch / m.file).write_text(original)
            killed += dead
            if not dead:
                survivors.append(m)
            verdict = "killed  " if dead else "SURVIVED"
            print(f"[{i}/{len(mutants)}] {verdict} {m.file}:{m.line} {m.what}", flush=True)
    print(f"\n{killed} killed, {len(survivors)} survived")
    for m in survivors:
        print(f"  survivor: {m.file}:{m.line}: {m.what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
