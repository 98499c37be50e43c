"""A run's log, by concern: `metrics` (metrics.csv and TensorBoard scalars, the comparison
charts), `hparams` (the HParams entry and outcome), `console` (progress bar and plain lines),
`closing` (the closing block)."""
