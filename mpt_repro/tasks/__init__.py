"""Tasks register themselves on import (see mpt_repro/tasks/base.py)."""

from mpt_repro.tasks import (  # noqa: F401
    classification,  # noqa: F401
    detection,
    gan,
    language_model,
)
