"""mpt-advise's defaults, apart so that `mpt-advise --help` reads them without loading torch."""

DEFAULT_KEEP = 0.99  # the fraction of nonzero gradients the §3.2 underflow bound keeps
DEFAULT_STEPS = 300  # steps of the diagnostic run mpt-advise starts itself
SAMPLES = 20  # sampled steps in that run, unless telemetry.every is given
