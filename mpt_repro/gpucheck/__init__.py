"""The first run on a GPU machine, in one call (`scripts/gpu_check.sh`, docs/performance.md "GPU
check"): the packages checked first, then mpt-bench on ResNet-50, one smoke run of every
experiment under mixed, mpt-report; each step under its own time limit inside one budget, and,
whatever happens, `summary.txt`. The files to send back (at most 8) land in the output folder.

Standard library only (the steps run the suite in processes of their own): it must run, and
say what is missing, on a machine where the suite's own dependencies do not import.

    python3 -m mpt_repro.gpucheck --out OUT [--work DIR] [--rehearsal] [--dry-run] [--budget S]
"""
