"""`mpt-run --help`: what a user chooses, in a second and on one screen or two.

Hydra's own help lists every config group, internal ones included, and the whole composed
configuration, without a word on any key: `mpt-run --help-all` still shows it. This one reads
conf/ and the schema's own comments, imports no torch and composes nothing:

- the groups a user picks (experiment=, precision=, ...) with each option and the first
  sentence of its file's header comment, the default marked;
- the settings most runs touch, with their default and the comment the schema gives them;
- where the rest is.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from mpt_repro.catalog import CONF_DIR, config_file, default_options, options

# The groups a user chooses from, in the order a command line names them (conf/<group>/);
# the others (experiment_budget, experiment_recipe, schema) are composed by mpt-run itself
USER_GROUPS = ("experiment", "precision", "budget", "recipe", "data", "model", "telemetry")
# The settings most runs touch; each one's text is its field's comment in the schema
COMMON_KEYS = (
    "seed",
    "resume",
    "overwrite",
    "trainer.device",
    "trainer.max_steps",
    "trainer.epochs",
    "trainer.accumulate",
    "data.root",
    "data.batch_size",
    "optim.lr",
    "paths.runs_dir",
)
WIDTH = 100


def short_help() -> str:
    """The text of `mpt-run --help`."""
    defaults = default_options()
    lines = [
        _header().rstrip(),
        "",
        "Choose one option of each group (group=option; * the default):",
    ]
    for group in USER_GROUPS:
        lines += ["", f"{group}="]
        for name in options(group):
            mark = "*" if defaults.get(group) == name else " "
            lines.append(_entry(f" {mark}{name}", _summary(config_file(group, name))))
    lines += ["", "Common settings (key=value; the default in brackets):"]
    for key in COMMON_KEYS:
        default, text = field_help(key)
        lines.append(_entry(f"  {key} [{default}]", text))
    lines += [
        "",
        "Every group and key: mpt-run --help-all. The configuration one run would use:",
        "  mpt-run experiment=demo precision=mixed --cfg job",
        "Hydra's own options: mpt-run --hydra-help. README.md and docs/ describe each group.",
    ]
    return "\n".join(lines) + "\n"


def _entry(name: str, text: str) -> str:
    """`name` and `text` on one line, `text` cut to the width (the files say the rest)."""
    head = f"{name:<24} " if len(name) < 24 else f"{name} "
    return head + shortened(text, max(WIDTH - len(head), 20)) if text else name


ELLIPSIS = " ..."


def shortened(text: str, room: int) -> str:
    """`text` in `room` characters: whole if it fits, else cut where a clause ends (at `,` `;`
    `:` or before a parenthesis), never inside parentheses, brackets or quotes (a cut there read
    as `(Krizhevsky et al. ...` with its closing half gone). A clause that keeps half the line
    first, else the last word outside them, else the longest clause that fits; whole (a long
    line, not a broken one) when nothing outside them fits."""
    if len(text) <= room:
        return text
    fits = room - len(ELLIPSIS)
    clauses, words = _cut_points(text)
    for points, least in ((clauses, fits // 2), (words, fits // 2), (clauses + words, 1)):
        usable = [i for i in points if least <= i <= fits]
        if usable:
            return text[: max(usable)].rstrip(" ,;:") + ELLIPSIS
    return text


def _cut_points(text: str) -> tuple[list[int], list[int]]:
    """(where a clause may end, where a word ends), at the top level of `text`: outside
    parentheses, brackets and quotes."""
    depth, quote = 0, ""
    clauses, words = [], []
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in '"`':
            quote = char
        elif char in "([":
            if depth == 0 and i > 0 and text[i - 1] == " ":
                clauses.append(i - 1)  # before the parenthesis: what precedes it is whole
            depth += 1
        elif char in ")]":
            depth = max(depth - 1, 0)
        elif depth == 0 and char == " ":
            words.append(i)
            if text[i - 1] in ",;:":
                clauses.append(i - 1)
    return clauses, words


def _header() -> str:
    from omegaconf import OmegaConf

    config = OmegaConf.load(CONF_DIR / "config.yaml")
    return str(config.hydra.help.header)


def _summary(path: Any) -> str:
    """The first sentence of a config file's header comment (Hydra's `@package` line left out)."""
    from mpt_repro.safeio import NotARegularFile, read_text

    try:
        text = read_text(path)
    except NotARegularFile as e:  # a FIFO among the options: named, never waited on
        return f"(not read: {e.what}, not a config file)"
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if not text or text.startswith(("mpt-run", "make ")):
            break  # an example command: the sentence has ended
        words.append(text)
    joined = " ".join(words)
    # the first full stop or semicolon that ends a sentence (not "et al.", "Fig.", "e.g.")
    match = re.match(r"(.+?(?<!\bal)(?<!\bFig)(?<!\be\.g)(?<!\bi\.e)[.;])(\s|$)", joined)
    return (match.group(1) if match else joined).rstrip(".;")


def field_help(key: str) -> tuple[str, str]:
    """(default, comment) of a dotted key's field in the schema (mpt_repro/config.py,
    schema.py): the comment at the end of its line, else the comment lines just above it."""
    import dataclasses

    from mpt_repro.config import Config
    from mpt_repro.schema import DataSchema

    *parents, name = key.split(".")
    cls: Any = Config
    for part in parents:
        found = {f.name: f for f in dataclasses.fields(cls)}[part]
        cls = DataSchema if part == "data" else found.default_factory  # the section's class
    spec = {f.name: f for f in dataclasses.fields(cls)}[name]
    default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
    return _shown(default), _comment(cls, name)


def _shown(value: Any) -> str:
    """As YAML writes it."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _comment(cls: type, name: str) -> str:
    source = inspect.getsource(cls).splitlines()
    for i, line in enumerate(source):
        if re.match(rf"\s+{name}\s*:", line):
            if "  # " in line:
                return line.split("  # ", 1)[1].strip()
            above = []
            for prev in reversed(source[:i]):
                if not prev.strip().startswith("#"):
                    break
                above.insert(0, prev.strip().lstrip("#").strip())
            return " ".join(above)
    return ""
