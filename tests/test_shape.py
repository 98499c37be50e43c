"""scripts/shape.py (`make shape`) measures what it claims: a long function, a block of code
repeated under other names, an import cycle; prose repeated in two messages is not code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conftest import ROOT

spec = importlib.util.spec_from_file_location("shape", ROOT / "scripts" / "shape.py")
shape = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape)

CODE = """
def {name}(items, limit):
    total = sum(item.size for item in items if item.size > limit)
    count = len([item for item in items if item.size > limit])
    largest = max((item.size for item in items), default=limit)
    smallest = min((item.size for item in items), default=limit)
    spread = largest - smallest if largest > smallest else limit
    return total / max(count, 1) + spread * {number}
"""

PROSE = """
def {name}():
    return (
        "{word} one two three four five six seven "
        "{word} one two three four five six seven "
        "{word} one two three four five six seven "
        "{word} one two three four five six seven "
        "{word} one two three four five six seven "
        "{word} one two three four five six seven "
    )
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_code_repeated_under_other_names_is_one_pair(tmp_path):
    a = write(tmp_path, "a.py", CODE.format(name="mean_above", number=2))
    b = write(tmp_path, "b.py", CODE.format(name="other_mean", number=3))
    assert [(kind, Path(x.split(":")[0]).name) for kind, x, _ in shape.repeated_blocks([a, b])] == [
        ("same shape", "a.py")
    ]
    same = write(tmp_path, "c.py", CODE.format(name="mean_above", number=2))
    assert [kind for kind, _, _ in shape.repeated_blocks([a, same])] == ["same lines"]


def test_repeated_prose_is_not_a_pair(tmp_path):
    a = write(tmp_path, "a.py", PROSE.format(name="message", word="alpha"))
    b = write(tmp_path, "b.py", PROSE.format(name="notice", word="beta"))
    assert shape.repeated_blocks([a, b]) == []


def test_long_functions_and_cycles(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(shape.MAX_FUNCTION))
    long = write(tmp_path, "long.py", f"def long():\n{body}\n")
    assert [n for n, _ in shape.long_functions([long])] == [shape.MAX_FUNCTION + 1]
    graph = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": set()}
    assert [sorted(c) for c in shape.cycles(graph)] == [["p.a", "p.b"]]
