"""mpt-advise: which precision recipe, loss scale and layers a model needs, read from the gradient
histograms of one diagnostic run (telemetry=diagnostic), by the paper's own §3.1/§3.2 method.

    mpt-advise RUN_DIR...                     (or: python -m mpt_repro.advise RUN_DIR...)
    mpt-advise experiment=demo model=custom model.target=mypkg.nets:make_net

    from mpt_repro.advise import advice_section, build_advice
    advice_section(run_dirs) -> str          Markdown for mpt-report ("" without telemetry)

Modules: evidence (read the run), formats (FP16/BF16/E4M3/E5M2 windows on a histogram), scale
(the §3.2 static scale and the layers it does not serve), predict (each recipe and its verdict),
recommend (which recipe to run, and whether plain precision=mixed is enough), render (Markdown,
JSON), plots (exponent ranges per layer), launch (the diagnostic run), cli.
Imported on first use (PEP 562): `mpt-advise --help` loads no torch.
"""

from __future__ import annotations

from mpt_repro.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "advice": ["advice_section", "build_advice", "write_advice"],
        "defaults": ["DEFAULT_KEEP"],
        "cli": ["main"],
    },
)
