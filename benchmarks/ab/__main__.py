"""``python -m benchmarks.ab --base COMMIT``: the hot CPU paths on the working tree and on COMMIT (a temporary git
worktree), interleaved round by round, each as new/base with its spread; paths > 10% slower than the base beyond that
spread are flagged and the exit status is 1. docs/performance.md, "Speed A/B before landing"."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from benchmarks.ab.harness import THRESHOLD, base_worktree, report, run_ab, run_case
from common.error_exit import run_entry
from common.errors import UserError

REPO = Path(__file__).resolve().parents[2]
FIXED_CASES = [
    "attention/blockbert_n2",
    "attention/blockbert_n3",
    "train_step/dense",
    "train_step/blockbert_n2",
    "dataloader",
    "preprocess/document",
    "preprocess/sentence",
    "wiki_reader",
]


def all_cases() -> list[str]:
    """The fixed cases plus one attention case per registered layout family (the working tree's registry)."""
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("cases.py")), "--root", str(REPO), "--case", "list-layouts"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(
            f"listing the layout cases with {sys.executable} failed ({last}): run the A/B with the project's Python "
            "(.venv/bin/python -m benchmarks.ab), or name the cases with --cases"
        )
    modes = json.loads(r.stdout)["layouts"]
    return FIXED_CASES[:2] + [f"attention/{m}" for m in modes] + FIXED_CASES[2:]


def main(argv: list[str] | None = None) -> int:
    """The command line: exit 1 when a path is flagged, 2 on bad input."""
    return run_entry("benchmarks.ab", _main, argv)


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__)
    p.add_argument("--base", required=True, help="Commit (or ref) to compare the working tree with.")
    p.add_argument("--rounds", type=int, default=3, help="Interleaved rounds (the spread needs at least 2).")
    p.add_argument("--reps", type=int, default=3, help="Timed repetitions per process (their median is the value).")
    p.add_argument("--cases", nargs="*", help="Only these cases (names as printed; default all).")
    p.add_argument("--threshold", type=float, default=THRESHOLD, help="Flag new/base above this beyond the spread.")
    a = p.parse_args(argv)
    cases = a.cases or all_cases()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    tree = f"{head.stdout.strip()}{' + changes' if dirty else ''}"
    print(
        f"A/B: working tree ({tree}) vs {a.base}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {a.rounds} rounds x {a.reps} reps",
        flush=True,
    )
    done: dict = {}
    try:
        with base_worktree(REPO, a.base) as base:
            run_ab(
                cases,
                a.rounds,
                {"new": REPO, "base": base},
                lambda c: a.reps,
                run_case,
                log=lambda s: print(s, file=sys.stderr, flush=True),
                into=done,
            )
    except KeyboardInterrupt:  # Ctrl-C (or timeout -s INT): the worktree is gone; report the rounds that finished
        print("interrupted: the rounds that finished", flush=True)
    results = list(done.values())
    table, flagged = report(results, a.threshold)
    print(table)
    print(f"load after: {os.getloadavg()[0]:.1f}; {flagged} path(s) flagged (> {a.threshold:.2f}x beyond the spread)")
    return 1 if flagged else 0


if __name__ == "__main__":
    raise SystemExit(main())
