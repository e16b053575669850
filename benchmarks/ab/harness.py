"""The A/B's logic, apart from any timing: the base commit's worktree, the interleaved schedule, and the ratio,
spread and flag rule (tests/test_ab.py checks them on fake timings)."""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

THRESHOLD = 1.10
"""A path is flagged when it is more than 10% slower than the base beyond the noise measured (:func:`compare`)."""
CASES_SCRIPT = Path(__file__).with_name("cases.py")


@contextlib.contextmanager
def base_worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A detached ``git worktree`` of ``commit`` in a temp dir, removed (and pruned) afterwards, also on error."""
    tmp = Path(tempfile.mkdtemp(prefix="ab-base-"))
    path = tmp / "base"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(path), commit], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Result:
    """One case: per-round values of each side (seconds, or a ratio to dense for attention cases)."""

    case: str
    new: list[float]
    base: list[float]
    skip: str = ""

    def ratios(self) -> list[float]:
        """new / base per round (rounds are interleaved, so each pair ran under the same load)."""
        return [n / b for n, b in zip(self.new, self.base)]


@dataclass
class Verdict:
    ratio: float  # median of the per-round new/base ratios
    spread: float  # half the range of the per-round ratios: the noise this run measured
    flagged: bool


def compare(r: Result, threshold: float = THRESHOLD) -> Verdict:
    """Median ratio new/base with its spread; flagged when even the median minus the spread exceeds ``threshold``
    (a path > 10% slower than the base beyond the noise measured). One round: no spread, the median alone."""
    ratios = r.ratios()
    med = statistics.median(ratios)
    spread = (max(ratios) - min(ratios)) / 2
    return Verdict(med, spread, med - spread > threshold)


def schedule(cases: list[str], rounds: int) -> list[tuple[int, str, str]]:
    """(round, case, side) in run order: every round runs every case on both sides back to back, the side that goes
    first alternating by round, so slow drifts in the machine's load hit both sides alike."""
    out = []
    for i in range(rounds):
        for c in cases:
            sides = ("new", "base") if i % 2 == 0 else ("base", "new")
            out.extend((i, c, s) for s in sides)
    return out


def run_case(root: Path, case: str, reps: int) -> dict:
    """One case on one side, in a fresh process with ``root`` first on sys.path (benchmarks/ab/cases.py)."""
    cmd = [sys.executable, str(CASES_SCRIPT), "--root", str(root), "--case", case, "--reps", str(reps)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    if p.returncode != 0:
        return {"skip": f"failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_ab(
    cases: list[str],
    rounds: int,
    roots: dict[str, Path],
    reps: Callable[[str], int],
    runner: Callable[[Path, str, int], dict] = run_case,
    log: Callable[[str], None] = lambda s: None,
    into: dict[str, Result] | None = None,
) -> list[Result]:
    """Runs :func:`schedule`; a case skipped on either side is reported as skipped with the reason. ``into`` is
    filled as the rounds go (what an interrupted run still reports)."""
    res = {} if into is None else into
    res.update({c: Result(c, [], []) for c in cases})
    for i, c, side in schedule(cases, rounds):
        r = res[c]
        if r.skip:
            continue
        got = runner(roots[side], c, reps(c))
        if "skip" in got:
            r.skip = f"{side}: {got['skip']}"
            continue
        (r.new if side == "new" else r.base).append(float(got["value"]))
        log(f"round {i + 1} {c} {side}: {got['value']:.4g}")
    return list(res.values())


def report(results: list[Result], threshold: float = THRESHOLD) -> tuple[str, int]:
    """The table (one line per case) and the number of flagged paths."""
    results = [Result(r.case, r.new[: len(r.base)], r.base[: len(r.new)], r.skip) for r in results]  # whole rounds
    lines = [f"{'case':34s} {'new/base':>9s} {'spread':>7s}  {'new':>9s} {'base':>9s}  flag"]
    flagged = 0
    for r in results:
        if r.skip or not r.new or len(r.new) != len(r.base):
            lines.append(f"{r.case:34s} skipped ({r.skip or 'no complete round'})")
            continue
        v = compare(r, threshold)
        flagged += v.flagged
        unit = "x dense" if r.case.startswith("attention/") else "s"
        lines.append(
            f"{r.case:34s} {v.ratio:9.3f} {v.spread:7.3f}  {statistics.median(r.new):9.4g} "
            f"{statistics.median(r.base):9.4g}  {'SLOWER' if v.flagged else ''}  ({unit})"
        )
    return "\n".join(lines), flagged
