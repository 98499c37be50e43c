"""The advice of run directories: build it, write it, or give mpt-report a section of it.

from mpt_repro.advise import advice_section
text = advice_section(run_dirs)                      # Markdown; "" when no run has telemetry
text = advice_section(run_dirs, figures_dir=report_dir / "advice")   # with the figures
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from mpt_repro.advise.defaults import DEFAULT_KEEP
from mpt_repro.advise.evidence import AdviceError, load_evidence
from mpt_repro.advise.predict import Advice, predict_all
from mpt_repro.advise.render import markdown, to_json


def build_advice(run_dir: Path, keep: float = DEFAULT_KEEP) -> Advice:
    """The advice of one run directory; AdviceError (one line) when it has no telemetry."""
    if not 0.0 < keep < 1.0:
        raise AdviceError(f"--keep must be a fraction between 0 and 1 (got {keep})")
    return predict_all(load_evidence(run_dir), keep)


def write_advice(advice: Advice, out_dir: Path, figures: bool = True) -> list[Path]:
    """advice.md, advice.json and (figures=True) the exponent-range figure into out_dir."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        figure = None
        if figures and advice.static.advised is not None:
            from mpt_repro.advise.plots import FIGURE, draw

            written.append(draw(advice.evidence, advice.static.advised, out_dir / FIGURE))
            figure = FIGURE
        (out_dir / "advice.md").write_text(markdown(advice, figure=figure))
        (out_dir / "advice.json").write_text(json.dumps(to_json(advice), indent=1) + "\n")
    except OSError as e:
        raise AdviceError(
            f"cannot write {e.filename or out_dir} ({e.strerror}): choose a writable folder "
            "with --out DIR"
        ) from None
    return [out_dir / "advice.md", out_dir / "advice.json", *written]


def advice_section(
    run_dirs: Iterable[Path],
    keep: float = DEFAULT_KEEP,
    figures_dir: Path | None = None,
    relative_to: Path | None = None,
    level: int = 2,
) -> str:
    """Markdown advice for every run directory that has telemetry, one subsection each ("" when
    none has). Runs without telemetry, or whose records cannot be read, are left out.

    figures_dir: also draw each run's exponent-range figure there, linked from the Markdown by a
    path relative to `relative_to` (default: figures_dir's parent, where a report.md would lie).
    level: the heading level of the section's title; each run's title is one level below."""
    parts = []
    for i, run_dir in enumerate(run_dirs):
        try:
            advice = build_advice(Path(run_dir), keep)
        except AdviceError:
            continue
        link = None
        if figures_dir is not None and advice.static.advised is not None:
            from mpt_repro.advise.plots import draw

            path = draw(advice.evidence, advice.static.advised, Path(figures_dir) / f"run{i}.png")
            link = os.path.relpath(path, relative_to or Path(figures_dir).parent)
        parts.append(markdown(advice, level=level + 1, figure=link))
    if not parts:
        return ""
    title = "#" * level + " Precision advice (mpt-advise)"
    intro = (
        "What each precision recipe would do to the gradients of the runs that recorded "
        "telemetry, read from their histograms (docs/telemetry.md, mpt-advise)."
    )
    return "\n".join([title, "", intro, "", *parts])
