"""The shape of the code, measured: `make shape` prints each target of the house rules and whether
the package meets it (exit 1 when one is missed).

- no function or method in mpt_repro/ longer than 60 lines;
- at most 10 pairs of places in mpt_repro/ that repeat each other over 6 or more lines (the same
  lines, whitespace aside, or the same shape: every string and number replaced by a placeholder;
  windows of short lines such as the entries of a mapping, and prose, are not counted);
- no import cycle between mpt_repro's modules, imports inside functions included;
- Trainer.fit on one screen (at most 50 lines).

    python scripts/shape.py [--root mpt_repro] [--list]
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

MAX_FUNCTION = 60
MAX_PAIRS = 10
WINDOW = 6
MAX_FIT = 50


# -- long functions --------------------------------------------------------------------------------
def long_functions(files: list[Path]) -> list[tuple[int, str]]:
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION:
                    found.append((length, f"{path}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def fit_length(root: Path) -> int:
    tree = ast.parse((root / "trainer.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "fit":
                    return item.end_lineno - item.lineno + 1
    raise SystemExit("Trainer.fit not found")


# -- repeated blocks -------------------------------------------------------------------------------
def code_lines(path: Path, shape: bool) -> list[tuple[int, str]]:
    """(line number, normalised text) of each line holding code: comments, docstrings and blank
    lines left out; with `shape`, strings and numbers become placeholders."""
    text = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(value.lineno, value.end_lineno + 1))
    lines: dict[int, list[str]] = defaultdict(list)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT):
            continue
        if tok.type in (tokenize.DEDENT, tokenize.ENDMARKER) or tok.start[0] in docstrings:
            continue
        word = tok.string
        if shape and tok.type == tokenize.STRING:
            word = "S"
        elif shape and tok.type == tokenize.NUMBER:
            word = "0"
        lines[tok.start[0]].append(word)
    return [(n, " ".join(words)) for n, words in sorted(lines.items())]


# what a line of prose is made of, in shape: its strings and the punctuation that joins them
PROSE = {"S", ",", "(", ")", "[", "]", "+"}


def trivial(window: list[str], shape: list[str]) -> bool:
    """Windows that say nothing on their own: imports, brackets, short entries of a list or a
    mapping, and prose (lines holding only strings: a message, a table's notes), which the house
    duplicates scan leaves out as well (a window needs four lines of code of five tokens or
    more)."""
    meaningful = [
        w
        for w, s in zip(window, shape)
        if not w.startswith(("import ", "from "))
        and len(w.split()) >= 5
        and not set(s.split()) <= PROSE
    ]
    return len(meaningful) < 4


def repeated_blocks(files: list[Path]) -> list[tuple[str, str, str]]:
    """Pairs of places sharing WINDOW or more consecutive code lines in shape (identical lines
    are the same shape too), as (kind, place a, place b): the overlapping windows of one run of
    shared lines count once, and a run is "same lines" when its text matches as well."""
    texts = {p: code_lines(p, shape=False) for p in files}
    shapes = {p: code_lines(p, shape=True) for p in files}
    seen: dict[str, list[tuple[Path, int]]] = defaultdict(list)
    for path in files:
        lines = [text for _, text in shapes[path]]
        for i in range(len(lines) - WINDOW + 1):
            window = [text for _, text in texts[path][i : i + WINDOW]]
            if not trivial(window, lines[i : i + WINDOW]):
                seen["\n".join(lines[i : i + WINDOW])].append((path, i))
    matches: dict[tuple, list[tuple[int, int]]] = defaultdict(list)  # (a, b) -> window starts
    for places in seen.values():
        for x in range(len(places)):
            for y in range(x + 1, len(places)):
                (pa, ia), (pb, ib) = sorted((places[x], places[y]))
                if pa == pb and ib - ia < WINDOW:
                    continue  # a run overlapping itself
                matches[(pa, pb)].append((ia, ib))
    found = []
    for (pa, pb), starts in matches.items():
        end = -1
        for ia, ib in sorted(starts):
            if ia <= end:  # a window of a place already counted (one run, or one table)
                end = max(end, ia + WINDOW)
                continue
            end = ia + WINDOW
            a_lines = [t for _, t in texts[pa][ia : ia + WINDOW]]
            kind = (
                "same lines"
                if a_lines == [t for _, t in texts[pb][ib : ib + WINDOW]]
                else "same shape"
            )
            found.append((kind, f"{pa}:{texts[pa][ia][0]}", f"{pb}:{texts[pb][ib][0]}"))
    return sorted(found, key=lambda f: f[1:])


# -- import cycles ---------------------------------------------------------------------------------
def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files: list[Path], root: Path) -> dict[str, set[str]]:
    modules = {module_name(p, root): p for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parents[1] / "mpt_repro"
    )
    parser.add_argument("--list", action="store_true", help="list every finding, not the first few")
    args = parser.parse_args(argv)
    files = sorted(p for p in args.root.rglob("*.py") if "embedded" not in p.parts)
    shown = None if args.list else 8
    long = long_functions(files)
    blocks = repeated_blocks(files)
    loops = cycles(import_graph(files, args.root))
    fit = fit_length(args.root)
    rows = [
        (f"functions over {MAX_FUNCTION} lines", len(long), 0, [f"{n} {w}" for n, w in long]),
        (
            f"pairs repeating {WINDOW}+ lines",
            len(blocks),
            MAX_PAIRS,
            [f"{k}: {a} ~ {b}" for k, a, b in blocks],
        ),
        ("import cycles", len(loops), 0, [" -> ".join(c) for c in loops]),
        ("Trainer.fit lines", fit, MAX_FIT, []),
    ]
    missed = 0
    print(f"{'target':34} {'found':>6} {'at most':>8}  result")
    for name, found, limit, details in rows:
        ok = found <= limit
        missed += not ok
        print(f"{name:34} {found:>6} {limit:>8}  {'ok' if ok else 'MISSED'}")
        for line in details[:shown]:
            print(f"    {line}")
        if shown is not None and len(details) > shown:
            print(f"    ... {len(details) - shown} more (--list)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
