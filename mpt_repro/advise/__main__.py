"""`python -m mpt_repro.advise ...`: the same as `mpt-advise ...`."""

from mpt_repro.advise.cli import console_main

console_main()
