"""Run by tests/test_bench_step.py: several ``python -m benchmarks.step`` command lines in one process: one import of
torch and DeepSpeed and one process group for all of them (DeepSpeed keeps its groups registered: a second process
group in the same process is refused, so the command's own set-up is handed the first one and its teardown waits for
the last command).

    python tests/bench_step_entry.py OUT.json '[["--measure", "time", ...], ["--measure", "host", ...]]'

OUT.json gets, per command line in order, its exit code and the tail of what it printed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pretrain.distributed as distributed  # noqa: E402
from benchmarks.step import engine  # noqa: E402
from benchmarks.step.cli import main  # noqa: E402


def run_all(out: str, commands: list[list[str]]) -> None:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # every command here runs on the CPU (--device cpu)
    device = engine.init_single_rank()
    engine.init_single_rank = lambda: device  # benchmarks.step.cli imports both when it runs
    destroy, distributed.destroy_distributed = distributed.destroy_distributed, lambda: None
    results = []
    for argv in commands:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            try:
                rc = main(argv)
            except Exception as e:  # noqa: BLE001 (a crash is that command's result, the others still run)
                rc, printed = 99, io.StringIO(printed.getvalue() + f"\n{type(e).__name__}: {e}")
        results.append({"argv": argv, "rc": rc, "output": printed.getvalue()[-6000:]})
        Path(out).write_text(json.dumps(results))
    destroy()


if __name__ == "__main__":
    run_all(sys.argv[1], json.loads(sys.argv[2]))
