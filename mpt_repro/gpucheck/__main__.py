import sys

from mpt_repro.gpucheck.cli import main

sys.exit(main())
