"""mpt-repro: mixed precision training, reproduced."""
