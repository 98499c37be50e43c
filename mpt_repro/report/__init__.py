"""mpt-report: paper-style tables, CSV/LaTeX and plots from the run records under results/runs.

The reporter reads only run.json and metrics.csv (never TensorBoard files), so it works on any
copy of the results folder. See docs/report.md.
"""
