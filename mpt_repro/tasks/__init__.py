"""Tasks register themselves on import (see mpt_repro/tasks/base.py)."""
from mpt_repro.tasks import classification  # noqa: F401
from mpt_repro.tasks import gan, language_model  # noqa: F401
