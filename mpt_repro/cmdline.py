"""The command line as a user types it, read before Hydra sees it (issue 34).

Hydra answers a malformed override with its parser's internals (`LexerNoViableAltException`, a
caret under the column, a link to its grammar) and an unknown `--option` with argparse's usage;
here each gets one line that says what is wrong and what to type. A `~` in a path is expanded the
way `data.root` always expanded it, so `paths.runs_dir=~/runs` never creates a folder named `~`.
Nothing here imports torch.
"""

from __future__ import annotations

import os
import re

# overrides whose value is a path: a leading `~` (or `~user`) is the home folder, as in a shell
PATH_KEYS = (
    "paths.runs_dir",
    "hydra.run.dir",
    "hydra.sweep.dir",
    "data.root",
    "model.backbone_weights",
)
# what a user coming from other tools types for the common settings
OPTION_HINTS = {
    "epochs": "trainer.epochs=3",
    "steps": "trainer.max_steps=100",
    "max-steps": "trainer.max_steps=100",
    "lr": "optim.lr=0.01",
    "batch-size": "data.batch_size=64",
    "seed": "seed=1",
    "device": "trainer.device=cpu",
    "precision": "precision=amp",
}


def expand_home(argv: list[str]) -> list[str]:
    """argv with `~` expanded at the start of a path override's value (quoted or not)."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        quote = value[:1] if value[:1] in "'\"" and value[-1:] == value[:1] else ""
        inner = value[1:-1] if quote else value
        if eq and key.lstrip("+") in PATH_KEYS and inner.startswith("~"):
            expanded = os.path.expanduser(inner)
            arg = f"{key}={quote}{expanded}{quote}" if expanded != inner else arg
        out.append(arg)
    return out


def syntax_problem(argv: list[str]) -> str | None:
    """One line for an option mpt-run does not have or an override Hydra cannot parse."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit:  # a flag without its value (--cfg): argparse's own line is one line
        return None
    if unknown:
        return _unknown_option(unknown)
    if args.shell_completion:
        return None
    for arg in args.overrides or []:
        problem = _unparsable(arg)
        if problem:
            return problem
    return None


def _unknown_option(unknown: list[str]) -> str:
    first = unknown[0]
    if not first.startswith("-"):  # overrides after an option that came between them
        return (
            f"{first!r} follows an option given among the overrides: give the options first "
            "(-m, --cfg job), then every key=value override, e.g. mpt-run -m seed=0,1 "
            "trainer.max_steps=6"
        )
    name = first.lstrip("-").split("=", 1)[0]
    hint = OPTION_HINTS.get(name, "KEY=VALUE, e.g. trainer.epochs=3")
    shown = " ".join(unknown[:2]) if "=" not in first and len(unknown) > 1 else first
    return (
        f"{shown!r} is not an option of mpt-run: settings are given as key=value overrides, "
        f"e.g. {hint} (mpt-run --help lists the keys; options such as -m go before them)"
    )


def _unparsable(arg: str) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_overrides([arg])
    except Exception:  # noqa: BLE001 - any parse error: this override, said in words
        return _parse_message(arg)
    return None


def _parse_message(arg: str) -> str:
    if not re.match(r"^[~+]{0,2}[\w.@/-]+=", arg):
        return (
            f"{arg!r} is not a key=value override; a value with a space must be quoted for Hydra "
            "inside the shell's quotes, e.g. 'data.root=\"/data/my folder\"'"
        )
    key, _, value = arg.partition("=")
    return (
        f"{arg!r}: Hydra cannot read the value {value!r} of {key.lstrip('+~')}: a value with a "
        "space, '=', '~', '$', brackets or quotes must be quoted for Hydra inside the shell's "
        f"quotes, e.g. '{key}=\"{value}\"'"
    )


SEARCH_PATH_KEY = "hydra.searchpath"


def with_plugin_configs(argv: list[str]) -> list[str]:
    """argv with every plugin's config folder on Hydra's search path (mpt_repro/registry.py
    config_dir), after the folders the user named in hydra.searchpath=[...]; those are
    registered in turn, so that the catalog (the options `mpt-run --help` lists, the checks of
    a budget's files) sees the user's experiments as Hydra does. A `pkg://` entry is Hydra's
    alone."""
    from mpt_repro import registry

    typed: list[str] = []
    rest = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.lstrip("+") == SEARCH_PATH_KEY:
            typed += [v.strip().strip("'\"") for v in value.strip().strip("[]").split(",")]
        else:
            rest.append(arg)
    for entry in typed:
        if entry.startswith("file://"):
            registry.config_dir(entry.removeprefix("file://"))
    entries = [e for e in typed if e] + [
        f"file://{d}" for d in registry.config_dirs() if f"file://{d}" not in typed
    ]
    if not entries:
        return list(argv)
    at = _end_of_overrides(rest)  # Hydra reads one block of overrides: the entry joins it
    return [*rest[:at], f"{SEARCH_PATH_KEY}=[{','.join(entries)}]", *rest[at:]]


def _end_of_overrides(argv: list[str]) -> int:
    """Where the block of overrides Hydra's parser reads ends in argv, whatever options come
    before or after it (`experiment=x --cfg job`, `experiment=x -m`); the end when there is
    none (an entry after the options is then the block)."""
    from hydra._internal.utils import get_args_parser

    try:
        overrides = get_args_parser().parse_known_args(argv)[0].overrides or []
    except SystemExit:  # a flag without its value: Hydra's own message follows
        return len(argv)
    n = len(overrides)
    for i in range(len(argv) - n + 1):
        if n and argv[i : i + n] == overrides:
            return i + n
    return len(argv)
