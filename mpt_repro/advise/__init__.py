"""mpt-advise: which precision recipe, loss scale and layers a model needs, read from the gradient
histograms of one diagnostic run (telemetry=diagnostic), by the paper's own §3.1/§3.2 method.

    mpt-advise RUN_DIR...                     (or: python -m mpt_repro.advise RUN_DIR...)
    mpt-advise experiment=demo model=custom model.target=mypkg.nets:make_net

    from mpt_repro.advise import advice_section, build_advice
    advice_section(run_dirs) -> str          Markdown for mpt-report ("" without telemetry)

Modules: evidence (read the run), formats (FP16/BF16/E4M3/E5M2 windows on a histogram), scale
(the §3.2 static scale and the layers it does not serve), predict (each recipe and its verdict),
render (Markdown, JSON), plots (exponent ranges per layer), launch (the diagnostic run), cli.
Imported on first use (PEP 562): `mpt-advise --help` loads no torch.
"""

from __future__ import annotations

from mpt_repro.lazy import lazy_exports

_EXPORTS = {
    "advice_section": "mpt_repro.advise.advice",
    "build_advice": "mpt_repro.advise.advice",
    "write_advice": "mpt_repro.advise.advice",
    "DEFAULT_KEEP": "mpt_repro.advise.defaults",
    "main": "mpt_repro.advise.cli",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
