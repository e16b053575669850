"""The test steps: a pytest selection run on this machine's GPU, counted from its JUnit file (so a step stopped at
its time limit still reports the tests that ran)."""

from __future__ import annotations

import importlib.util
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from devtools.gpu_check.runner import Step, StepResult

SESSION_TIMEOUT = re.compile(r"session-timeout: [\d.]+ sec exceeded")
"""pytest-timeout's words when --session-timeout stopped the session (the rest of the tests did not run)."""
MAX_TEST_TIMEOUT_S = 600
"""pytest-timeout's per-test limit never exceeds this (a test hung on a GPU fails alone)."""


def junit_counts(path: Path) -> dict:
    """passed / failed / skipped counts, the failed test names and the skip reasons from a pytest --junitxml file."""
    root = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": {}}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif (sk := case.find("skipped")) is not None:
            counts["skipped"] += 1
            why = (sk.get("message") or "").strip()[:160]
            counts["skip_reasons"][why] = counts["skip_reasons"].get(why, 0) + 1
        else:
            counts["passed"] += 1
    return counts


def pytest_plugins_available() -> dict[str, bool]:
    """Which optional pytest features this python has: pytest-timeout's --session-timeout, pytest-xdist."""
    have = {"session_timeout": False, "xdist": importlib.util.find_spec("xdist") is not None}
    spec = importlib.util.find_spec("pytest_timeout")
    if spec and spec.origin:
        have["session_timeout"] = "--session-timeout" in Path(spec.origin).read_text(errors="replace")
    return have


def pytest_command(
    python: str, tests: list[str], junit: Path, cap_s: float, markers: str | None, select: str | None, workers: int
) -> list[str]:
    """``python -m pytest`` over ``tests`` (``-m markers``, ``-k select``), its JUnit file at ``junit``. With
    pytest-timeout's --session-timeout the session stops itself 15 s before the step's limit, so the counts of what
    ran are kept."""
    have = pytest_plugins_available()
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE"]
    cmd += [f"--junitxml={junit}", "--timeout", str(int(min(MAX_TEST_TIMEOUT_S, cap_s)))]
    if have["session_timeout"]:
        cmd += ["--session-timeout", str(int(max(10, cap_s - 15)))]
    if have["xdist"] and workers > 1:
        cmd += ["-n", str(workers)]
    if markers:
        cmd += ["-m", markers]
    if select:
        cmd += ["-k", select]
    return [*cmd, *tests]


def gpu_workers(device: str) -> int:
    """pytest-xdist workers on CUDA: one per two CPUs (at most 8) share the GPU. Compiling FlexAttention's kernels is
    CPU-bound: with 4 workers on a 16-CPU H200 node the contract tests did not finish in 55 s (docs/gpu_results.md)."""
    cpus = os.cpu_count() or 1
    return min(8, cpus // 2) if device == "cuda" and cpus >= 8 else 1


def pytest_step(
    name: str,
    tests: list[str],
    work: Path,
    python: str,
    device: str,
    cap_s: float,
    markers: str | None = None,
    select: str | None = None,
    parallel: bool = True,
) -> Step:
    """A step running a pytest selection; passes when no test fails (a session stopped at its limit is ``cut``).
    ``parallel``: pytest-xdist workers on CUDA (not for tests that start ranks of their own: one session, in order)."""
    junit = work / f"{name}.xml"

    def check(res: StepResult, proc) -> None:
        if not junit.is_file():
            res.status, res.summary = "error", f"pytest wrote no {junit.name} (exit code {proc.returncode})"
            return
        c = junit_counts(junit)
        res.details = c
        stopped = SESSION_TIMEOUT.search(proc.stdout or "") is not None
        res.status = "passed" if proc.returncode == 0 and c["failed"] == 0 else "failed"
        if stopped and c["failed"] == 0:
            res.status = "cut"
        res.summary = f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped" + (
            " (stopped at its time limit: the rest did not run)" if stopped else ""
        )
        if c["failures"]:
            res.summary += "; failed: " + ", ".join(f.split("::")[-1] for f in c["failures"][:8])

    cmd = pytest_command(python, tests, junit, cap_s, markers, select, gpu_workers(device) if parallel else 1)
    return Step(name, cap_s, [cmd], check, prepare=lambda: junit.unlink(missing_ok=True))
