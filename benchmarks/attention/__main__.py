"""``python -m benchmarks.attention``: see benchmarks/attention/__init__.py."""

from benchmarks.attention.cli import main

raise SystemExit(main())
