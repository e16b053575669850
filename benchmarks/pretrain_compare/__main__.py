"""``python -m benchmarks.pretrain_compare``: see the package docstring."""

import sys

from benchmarks.pretrain_compare.cli import main

sys.exit(main())
