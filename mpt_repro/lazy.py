"""Package attributes imported on first use (PEP 562): `import mpt_repro.precision` loads no
torch until a name is used, so help texts and config refusals stay fast.

    __getattr__, __all__ = lazy_exports(__name__, {
        "policy": ["PrecisionPolicy"],          # module (relative to the package) -> its names
        "config": ["PrecisionConfig", "Dtype"],
    })
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, modules: dict[str, list[str]]
) -> tuple[Callable[[str], Any], list[str]]:
    """A module-level `__getattr__` that imports a name's module on first use, and `__all__`."""
    where = {name: f"{package}.{module}" for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__, list(where)
