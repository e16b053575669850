"""``python -m devtools.gpu_check``: the GPU check (the package docstring)."""

import sys

from devtools.gpu_check.cli import main

sys.exit(main())
