"""``python -m benchmarks.step --measure {time,profile,memory,host} ...`` (the flags: benchmarks/step/cli.py)."""

from benchmarks.step.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
