"""A mutation check of the precision engine, the training step and the run's files: `make mutants`.

Each mutant makes one small change to one file, in a scratch copy of the package, and runs the
fast tests that should notice it. A mutant the tests do not kill (a "survivor") is a behaviour no
test pins down: read it, and either write the test or explain why the change is harmless
(docs/mutants.md). The kinds of change:

    operator       a comparison flipped (< to <=, == to !=), + for -, * for /, and for or, & for |
    constant       a 0 for a 1 or a 1 for a 0
    condition      an `if` condition negated
    delete-call    a statement that is only a call, replaced by `pass` ("forgot the call")
    delete-assign  an assignment inside a function, replaced by `pass` ("forgot to set it")

Before any mutant the selected tests run once on the unmutated copy: a failure there would kill
every mutant and prove nothing, so the check stops. A mutant whose tests run past the time limit
is reported as a timeout, apart from the kills: a hang is noticed, but not by an assertion.

    python scripts/mutants.py --list                  # the mutants of the default files, no runs
    python scripts/mutants.py --max 40                # a seeded sample of 40 (every mutant: hours)
    python scripts/mutants.py --files mpt_repro/schedule.py --kinds delete-call delete-assign
    python scripts/mutants.py --max 40 --json mutants.json
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the tests need in the scratch copy; pytest runs there, so `python -m pytest`'s own sys.path
# entry (the working directory) is the copy too
COPIED = ("mpt_repro", "tests", "conf", "pyproject.toml")
PYTEST = ("-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu")

# Fast, in-process tests only. A test that runs the `mpt-run` console script would see the
# mutated copy too (PYTHONPATH is inherited and comes before the editable install), but it costs
# seconds to minutes per mutant, so those tests are never listed, and the two inside listed files
# are deselected.
CONSOLE_SCRIPT_TESTS = (
    "tests/test_adaptive.py::test_mpt_run_demo_adaptive_smoke",
    "tests/test_fp16_state.py::test_mpt_run_refuses_the_issue_s_adam_at_once_with_one_line",
)
PRECISION = (
    "tests/test_precision.py",
    "tests/test_sync_free.py",
    "tests/test_loops.py",
    "tests/test_accumulate.py",
    "tests/test_fp16_state.py",
    "tests/test_precision_presets.py",
    "tests/test_trainer.py",  # the LR schedule held on a real overflow (the skip signal's reader)
)
FP8 = (
    "tests/test_fp8.py",
    "tests/test_fp8_modules.py",
    "tests/test_fp8_numerics.py",
    "tests/test_fp8_hardware.py",
    "tests/test_loops.py",
)
STEP = ("tests/test_loops.py", "tests/test_trainer.py", "tests/test_accumulate.py")
REPORT = ("tests/test_report.py", "tests/test_report_records.py", "tests/test_report_bench.py")
# the default files, each glob with the tests that should notice a change there; a file takes
# the tests of the first glob it matches
TARGETS: list[tuple[str, tuple[str, ...]]] = [
    ("mpt_repro/precision/fp8*.py", FP8),
    ("mpt_repro/precision/pseudo.py", ("tests/test_pseudo_fp16.py",)),
    ("mpt_repro/precision/adaptive.py", ("tests/test_adaptive.py", *PRECISION)),
    ("mpt_repro/precision/*.py", PRECISION),
    ("mpt_repro/tasks/loops.py", STEP),
    ("mpt_repro/trainer.py", (*STEP, "tests/test_sync_free.py")),
    ("mpt_repro/rundir.py", ("tests/test_run_dir.py", "tests/test_report_records.py")),
    ("mpt_repro/checkpoint.py", ("tests/test_run_checkpoint.py", "tests/test_trainer.py")),
    ("mpt_repro/report/*.py", REPORT),
    (
        "mpt_repro/schedule.py",
        ("tests/test_trainer.py", "tests/test_fp16_state.py", "tests/test_schedule_plateau.py"),
    ),
    ("mpt_repro/ema.py", ("tests/test_trainer.py", "tests/test_recipe_wiring.py")),
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
KINDS = ("operator", "constant", "condition", "delete-call", "delete-assign")
ASSIGNMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign)


@dataclass
class Mutant:
    file: str
    index: int  # the index-th mutation site of the file
    kind: str
    line: int
    what: str
    verdict: str = ""  # killed, survived or timeout, once run
    seconds: float = 0.0


@dataclass
class Site:
    node: ast.AST
    kind: str
    what: str
    op: int | None = None  # the operator's index in a comparison


# -- where a mutation applies ------------------------------------------------------------------
def _ids_within(tree: ast.AST, field_of: Callable[[ast.AST], list[ast.AST]]) -> set[int]:
    return {id(n) for node in ast.walk(tree) for part in field_of(node) for n in ast.walk(part)}


def _annotations(node: ast.AST) -> list[ast.AST]:
    found = (getattr(node, "annotation", None), getattr(node, "returns", None))
    return [a for a in found if a is not None]


def _enclosing_functions(tree: ast.AST) -> dict[int, ast.AST]:
    """The innermost function around each node inside one (the walk is breadth-first: an inner
    function's entries overwrite its outer function's)."""
    found: dict[int, ast.AST] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in func.body:
                found.update((id(n), func) for n in ast.walk(stmt))
    return found


def _bound_before(func: ast.AST, line: int) -> set[str]:
    """The names `func` binds before `line`: its arguments and its earlier assignments."""
    args = func.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    stores = (n for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return names | {n.id for n in stores if n.lineno < line}


def _rebinds(target: ast.AST, bound: set[str]) -> bool:
    """Whether deleting an assignment to `target` leaves code that runs on with a stale value
    (an attribute, an item, a name bound earlier) rather than failing at once on an unbound
    local, which any test that reaches the line notices and which tells nothing."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_rebinds(t, bound) for t in target.elts)
    if isinstance(target, ast.Starred):
        return _rebinds(target.value, bound)
    return not isinstance(target, ast.Name) or target.id in bound


def _deletion(node: ast.AST, func: ast.AST | None) -> Site | None:
    """A statement inside a function whose deletion leaves code that forgot something: a bare
    call, an augmented assignment, or an assignment that re-binds (see _rebinds)."""
    if func is None:
        return None
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return Site(node, "delete-call", f"deleted: {_short(node)}")
    targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
    if isinstance(node, ast.AugAssign) or (
        isinstance(node, ASSIGNMENTS)
        and node.value is not None
        and all(_rebinds(t, _bound_before(func, node.lineno)) for t in targets)
    ):
        return Site(node, "delete-assign", f"deleted: {_short(node)}")
    return None


def _change(node: ast.AST) -> list[Site]:
    """The operator, constant and condition mutations of one node."""
    if isinstance(node, ast.Compare):
        pairs = [(i, type(op)) for i, op in enumerate(node.ops) if type(op) in SWAP]
        return [Site(node, "operator", f"{o.__name__} -> {SWAP[o].__name__}", i) for i, o in pairs]
    if isinstance(node, (ast.BinOp, ast.AugAssign, ast.BoolOp)) and type(node.op) in SWAP:
        op = type(node.op)
        return [Site(node, "operator", f"{op.__name__} -> {SWAP[op].__name__}")]
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if node.value in (0, 1):
            return [Site(node, "constant", f"constant {node.value} -> {1 - node.value}")]
    if isinstance(node, ast.If):
        return [Site(node, "condition", "if condition negated")]
    return []


def sites(tree: ast.AST) -> list[Site]:
    """Every place a mutation applies to, in a fixed order (the walk's). Type annotations are left
    out (`int | None` is not behaviour), and statements are deleted only inside functions: a
    module or class line deleted fails at import, which any test notices."""
    annotations = _ids_within(tree, _annotations)
    enclosing = _enclosing_functions(tree)
    out: list[Site] = []
    for node in ast.walk(tree):
        if id(node) in annotations:
            continue
        out += _change(node)
        deleted = _deletion(node, enclosing.get(id(node)))
        if deleted is not None:
            out.append(deleted)
    return out


def _short(node: ast.AST, width: int = 70) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= width else text[: width - 3] + "..."


# -- applying one ----------------------------------------------------------------------------------
def _replace_statement(tree: ast.AST, old: ast.stmt, new: ast.stmt) -> None:
    for parent in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and any(s is old for s in block):
                block[[id(s) for s in block].index(id(old))] = ast.copy_location(new, old)
                return
    raise ValueError(f"statement at line {old.lineno} not found in any block")


def mutate(source: str, index: int) -> tuple[str, Site]:
    """The source with the index-th site mutated, and the site. Operators are shared singletons
    in Python's AST, so a mutation replaces the operator in its node, never the operator object."""
    tree = ast.parse(source)
    site = sites(tree)[index]
    node = site.node
    if site.kind.startswith("delete"):
        _replace_statement(tree, node, ast.Pass())
    elif site.kind == "condition":
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif site.kind == "constant":
        node.value = 1 - node.value
    elif isinstance(node, ast.Compare):
        node.ops[site.op] = SWAP[type(node.ops[site.op])]()
    else:
        node.op = SWAP[type(node.op)]()
    return ast.unparse(tree), site


def mutants_of(root: Path, file: str) -> list[Mutant]:
    found = sites(ast.parse((root / file).read_text()))
    return [Mutant(file, i, s.kind, s.node.lineno, s.what) for i, s in enumerate(found)]


# -- the default files and their tests -----------------------------------------------------------
def default_files(root: Path) -> list[str]:
    files: list[str] = []
    for pattern, _ in TARGETS:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if path.name != "__init__.py" and rel not in files:
                files.append(rel)
    return files


def tests_for(file: str) -> tuple[str, ...]:
    for pattern, tests in TARGETS:
        if fnmatch.fnmatch(file, pattern):
            return tests
    raise SystemExit(f"{file}: no tests are mapped to it in TARGETS; name them with --tests")


# -- running -------------------------------------------------------------------------------------
def run_tests(scratch: Path, tests: Sequence[str], timeout: float) -> tuple[str, float, str]:
    """("passed" | "failed" | "timeout", seconds, output tail) of the tests in the scratch copy.
    The tests run in their own process group, so a timeout ends whatever they started too."""
    deselect = [
        a for t in CONSOLE_SCRIPT_TESTS if t.split("::")[0] in tests for a in ("--deselect", t)
    ]
    cmd = [sys.executable, "-m", "pytest", *PYTEST, *deselect, *tests]
    env = {**os.environ, "PYTHONPATH": str(scratch)}
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=scratch,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", time.monotonic() - start, out[-3000:]
    verdict = "passed" if proc.returncode == 0 else "failed"
    return verdict, time.monotonic() - start, out[-3000:]


def baseline(scratch: Path, test_sets: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
    """Run each set of tests on the unmutated copy; the seconds each took. Stops the check
    (SystemExit) when one fails or hangs for an hour: every mutant would then look killed."""
    took = {}
    for tests in test_sets:
        verdict, took[tests], out = run_tests(scratch, tests, 3600)
        print(f"baseline: {verdict} in {took[tests]:.1f} s: {' '.join(tests)}", flush=True)
        if verdict != "passed":
            print(out, file=sys.stderr)
            raise SystemExit(
                f"the baseline run {verdict} on the unmutated code ({' '.join(tests)}): "
                "fix those tests first; no mutant was run"
            )
    return took


def run_one(scratch: Path, m: Mutant, tests: Sequence[str], timeout: float) -> None:
    original = (scratch / m.file).read_text()
    text, _ = mutate(original, m.index)
    (scratch / m.file).write_text(text)
    try:
        verdict, m.seconds, _ = run_tests(scratch, tests, timeout)
    finally:
        (scratch / m.file).write_text(original)
    m.verdict = {"passed": "survived", "failed": "killed"}.get(verdict, verdict)


def run_all(
    mutants: list[Mutant],
    root: Path,
    tests_of: Callable[[str], Sequence[str]],
    parts: Sequence[str] = COPIED,
    timeout: float | None = None,
) -> dict[str, float]:
    """Run every mutant after a clean baseline; returns the time limit of each set of tests (by
    default three times its baseline run plus 30 s: a loaded machine varies)."""
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        scratch = Path(tmp)
        for part in parts:
            copy = shutil.copytree if (root / part).is_dir() else shutil.copy
            copy(root / part, scratch / part)
        test_sets = list(dict.fromkeys(tuple(tests_of(m.file)) for m in mutants))
        limits = {t: timeout or 3 * s + 30 for t, s in baseline(scratch, test_sets).items()}
        for i, m in enumerate(mutants, 1):
            tests = tuple(tests_of(m.file))
            run_one(scratch, m, tests, limits[tests])
            print(
                f"[{i}/{len(mutants)}] {m.verdict:8} {describe(m)} ({m.seconds:.1f} s)", flush=True
            )
    return {" ".join(t): round(limit, 1) for t, limit in limits.items()}


def describe(m: Mutant) -> str:
    return f"{m.file}:{m.line} {m.kind}: {m.what}"


# -- the command ---------------------------------------------------------------------------------
def select(root: Path, files: Sequence[str], kinds: Sequence[str], n: int | None, seed: int):
    mutants = [m for f in files for m in mutants_of(root, f) if m.kind in kinds]
    if n is not None and n < len(mutants):
        mutants = sorted(
            random.Random(seed).sample(mutants, n), key=lambda m: (files.index(m.file), m.index)
        )
    return mutants


def summary(mutants: list[Mutant]) -> dict:
    kinds, verdicts = Counter(m.kind for m in mutants), Counter(m.verdict for m in mutants)
    return {
        "by_kind": {k: kinds[k] for k in KINDS if kinds[k]},
        "verdicts": {v: verdicts[v] for v in ("killed", "survived", "timeout") if verdicts[v]},
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--files", nargs="*", help="default: every file of TARGETS (globs)")
    ap.add_argument("--tests", nargs="*", help="default: the tests TARGETS maps each file to")
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    ap.add_argument("--max", type=int, default=None, help="a seeded random sample of this many")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant's test run (default: 3 x the baseline's + 30)",
    )
    ap.add_argument("--list", action="store_true", help="print the mutants; run nothing")
    ap.add_argument("--json", type=Path, help="write every mutant and its verdict here")
    return ap.parse_args(argv)


def report(mutants: list[Mutant], args: argparse.Namespace, limits: dict[str, float]) -> None:
    counts = summary(mutants)
    kinds = ", ".join(f"{n} {k}" for k, n in counts["by_kind"].items())
    print(f"\n{len(mutants)} mutants ({kinds})")
    if counts["verdicts"]:
        print(", ".join(f"{n} {v}" for v, n in counts["verdicts"].items()))
    for m in mutants:
        if m.verdict in ("survived", "timeout"):
            print(f"  {m.verdict}: {describe(m)}")
    if args.json is not None:
        record = {"seed": args.seed, "max": args.max, "timeout_s": limits, **counts}
        record["mutants"] = [asdict(m) for m in mutants]
        args.json.write_text(json.dumps(record, indent=2) + "\n")


def main(
    argv: Sequence[str] | None = None, root: Path = ROOT, parts: Sequence[str] = COPIED
) -> int:
    args = parse_args(argv)
    files = args.files or default_files(root)
    mutants = select(root, files, args.kinds, args.max, args.seed)

    def tests_of(file: str) -> Sequence[str]:
        return args.tests or tests_for(file)

    if args.list:
        for m in mutants:
            print(describe(m))
        report(mutants, args, {})
        return 0
    print(f"{len(mutants)} mutants of {len(files)} files", flush=True)
    limits = run_all(mutants, root, tests_of, parts, args.timeout)
    report(mutants, args, limits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
