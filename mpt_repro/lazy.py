"""Package attributes imported on first use (PEP 562): `import mpt_repro.precision` loads no
torch until a name is used, so help texts and config refusals stay fast.

    _EXPORTS = {"PrecisionPolicy": "mpt_repro.precision.policy", ...}
    __all__ = list(_EXPORTS)
    __getattr__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` that imports `exports[name]` and returns its `name`."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
