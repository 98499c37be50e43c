"""`mpt-bench`: training-step throughput, memory and numerics cost of each precision preset.

    mpt-bench experiment=resnet50 data=synthetic bench.presets=[fp32,amp,mixed]

The parent process (cli.py) composes the same configuration as `mpt-run`, then runs every
(repeat, preset) in a fresh worker process (worker.py), interleaved, so that each preset's peak
memory is its own and a slow phase of the machine hits every preset alike. A worker builds the
suite's own training step (step.py: `build_step`), times it on a batch resident on the device
(measure.py), and writes one JSON result; the parent aggregates them (results.py), prints the
table and writes results/bench/<experiment>-<device>-<timestamp>.json. docs/performance.md
explains every column.
"""
