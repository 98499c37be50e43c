"""mpt-report's figures at scale (issue 47): drawn in processes of their own once there are
several, each PNG carrying the key of what it was drawn from, and a report that replaces another
copies the figures whose key is unchanged instead of drawing them again."""

from __future__ import annotations

import pandas as pd
import pytest

from mpt_repro.report import plots


def trace_figures(folder, n: int, scale: float = 2.0) -> list[plots.Figure]:
    """n loss-scale figures, the first with a trace that starts at `scale`."""
    figures = []
    for i in range(n):
        start = scale if i == 0 else 2.0 + i
        frames = [pd.DataFrame({"step": [1, 2], "split": "train", "loss_scale": [start, 1.0]})]
        curves = plots.GroupCurves(train={"mixed": frames})
        args = (curves, plots.preset_styles(["mixed"]), f"group {i}")
        figures.append(plots.Figure(folder / f"g{i}_loss_scale.png", plots.loss_scale_figure, args))
    return figures


N = 3  # figures: processes start from this many on (plots.PARALLEL_FROM, lowered here)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """N figures drawn in two processes."""
    folder = tmp_path_factory.mktemp("first")
    figures = trace_figures(folder, N)
    parallel_from, plots.PARALLEL_FROM = plots.PARALLEL_FROM, N
    try:
        return folder, figures, plots.draw_figures(figures, processes=2)
    finally:
        plots.PARALLEL_FROM = parallel_from


def test_figures_drawn_in_processes_carry_the_key_of_what_they_were_drawn_from(drawn):
    folder, figures, paths = drawn
    assert paths == [f.path for f in figures] and all(p.stat().st_size > 0 for p in paths)
    keys = [plots.key_of(p) for p in paths]
    assert keys == [plots.figure_key(f) for f in figures] and len(set(keys)) == len(keys)
    assert plots.key_of(folder / "none.png") is None


def test_a_report_that_replaces_another_redraws_only_the_figures_whose_data_changed(
    drawn, tmp_path, monkeypatch
):
    folder, _, _ = drawn
    redrawn = []
    real = plots._draw
    monkeypatch.setattr(plots, "_draw", lambda f, key: redrawn.append(f.path.name) or real(f, key))
    figures = trace_figures(tmp_path, N, scale=4.0)  # the first one changed
    paths = plots.draw_figures(figures, previous=folder, processes=1)
    assert redrawn == ["g0_loss_scale.png"]
    assert all(p.exists() for p in paths)
    assert (tmp_path / "g1_loss_scale.png").read_bytes() == (
        folder / "g1_loss_scale.png"
    ).read_bytes()
    assert plots.key_of(paths[0]) != plots.key_of(folder / "g0_loss_scale.png")
