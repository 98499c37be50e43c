"""The built-in experiments, as plugins (mpt_repro/registry.py): each module registers, without
importing torch, the schemas of the model and data options it brings, its task (the class that
trains it, imported only when a run builds it) and how the report presents it. They are named by
entry points in pyproject.toml, the same route an experiment of your own takes
(docs/adding-an-experiment.md).
"""
