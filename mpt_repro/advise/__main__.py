"""`python -m mpt_repro.advise ...`: the same as `mpt-advise ...`."""

import sys

from mpt_repro.advise.cli import main

sys.exit(main())
