"""``python -m tools.gpu_check``: the GPU check (the package docstring)."""

import sys

from tools.gpu_check.cli import main

sys.exit(main())
