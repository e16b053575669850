"""The speed A/B's logic (benchmarks/ab/harness.py) on fake timings: ratio, spread and the flag rule, the
interleaved schedule, skips, and the base commit's worktree set up and removed. No timing is asserted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.ab.harness import Result, base_worktree, compare, report, run_ab, schedule


def test_ratio_is_the_median_of_per_round_ratios_with_half_range_spread() -> None:
    v = compare(Result("x", new=[2.0, 3.3, 1.0], base=[2.0, 3.0, 1.0]))
    assert v.ratio == pytest.approx(1.0)  # ratios 1.0, 1.1, 1.0: median 1.0
    assert v.spread == pytest.approx(0.05)
    assert not v.flagged


@pytest.mark.parametrize(
    "new,base,flagged",
    [
        ([1.30, 1.32, 1.28], [1.0, 1.0, 1.0], True),  # 30% slower, spread 0.02: beyond the noise
        ([1.30, 2.0, 0.9], [1.0, 1.0, 1.0], False),  # median 1.3 but the rounds disagree (spread 0.55)
        ([1.08, 1.09, 1.08], [1.0, 1.0, 1.0], False),  # slower, but within 10%
        ([0.5, 0.5, 0.5], [1.0, 1.0, 1.0], False),  # faster
        ([1.2], [1.0], True),  # one round: no spread measured, the median alone
    ],
)
def test_flag_rule(new: list[float], base: list[float], flagged: bool) -> None:
    assert compare(Result("x", new, base)).flagged is flagged


def test_schedule_interleaves_sides_and_alternates_who_goes_first() -> None:
    s = schedule(["a", "b"], 2)
    assert s == [
        (0, "a", "new"), (0, "a", "base"), (0, "b", "new"), (0, "b", "base"),
        (1, "a", "base"), (1, "a", "new"), (1, "b", "base"), (1, "b", "new"),
    ]  # fmt: skip


def test_run_ab_collects_both_sides_and_reports_skips(tmp_path: Path) -> None:
    roots = {"new": tmp_path / "new", "base": tmp_path / "base"}
    times = {"new": 2.0, "base": 1.0}
    calls = []

    def runner(root: Path, case: str, reps: int) -> dict:
        side = "new" if root == roots["new"] else "base"
        calls.append((case, side, reps))
        if case == "missing" and side == "base":
            return {"skip": "layout mode 'x' is not registered on this side"}
        return {"value": times[side]}

    res = run_ab(["slow", "missing"], 3, roots, lambda c: 2, runner)
    slow, missing = res
    assert slow.new == [2.0] * 3 and slow.base == [1.0] * 3 and all(r == 2 for _, _, r in calls)
    assert missing.skip.startswith("base: layout mode")
    assert [c for c in calls if c[0] == "missing"] == [("missing", "new", 2), ("missing", "base", 2)]  # not retried
    table, flagged = report(res)
    assert flagged == 1
    assert "SLOWER" in table.splitlines()[1] and "skipped (base: layout mode" in table.splitlines()[2]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_base_worktree_checks_out_the_commit_and_is_removed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for i, text in enumerate(("old\n", "new\n")):
        (repo / "f.txt").write_text(text)
        _git(repo, "add", "f.txt")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}")
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD").strip()
    with base_worktree(repo, first) as base:
        assert (base / "f.txt").read_text() == "old\n" and (repo / "f.txt").read_text() == "new\n"
        assert len(_git(repo, "worktree", "list").splitlines()) == 2
    assert not base.exists() and not base.parent.exists()
    assert len(_git(repo, "worktree", "list").splitlines()) == 1
    with pytest.raises(RuntimeError), base_worktree(repo, first) as base:
        raise RuntimeError("a case crashed")
    assert not base.exists() and len(_git(repo, "worktree", "list").splitlines()) == 1


def test_a_python_that_cannot_list_the_cases_is_one_clear_line(tmp_path: Path, capsys, monkeypatch) -> None:
    """Run with a Python that lacks the project's packages (the system one, not .venv's): exit 2 and one line
    that names the interpreter and what to run instead, not a traceback."""
    import sys

    from benchmarks.ab import __main__ as ab

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    assert ab.main(["--base", "HEAD"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(fake) in err[0] and "No module named 'torch'" in err[0]
    assert ".venv/bin/python -m benchmarks.ab" in err[0]
