"""Running one step: its commands in order, each in its own process group (session), within the step's own time
limit and the run's budget. A step that reaches its limit is stopped as a group (SIGTERM, SIGKILL after a grace), so
no rank outlives it; when the check itself gets SIGTERM/SIGINT/SIGHUP, the running group is stopped the same way."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from common.process import STEP_DEADLINE_ENV, kill_group

REPO = Path(__file__).resolve().parents[2]
REPORT_RESERVE_S = 5.0
"""Seconds kept back at the end of the budget to stop a step and write the report."""
KILL_GRACE_S = 10.0
"""After SIGTERM to a step's process group, how long its processes get before SIGKILL."""
OUTPUT_TAIL_CHARS = 3000
"""The end of a step's output kept in report.json (all of it is in its log)."""


@dataclass
class StepResult:
    """What one step did."""

    name: str
    status: str = "pending"
    """passed | failed | timeout | cut | skipped | error | interrupted | running"""
    seconds: float = 0.0
    command: str = ""
    """The step's command lines, one per line (shell-quoted, to be pasted)."""
    summary: str = ""
    """One line for the report."""
    details: dict = field(default_factory=dict)
    """Parsed results (test counts, benchmark rows, targets)."""
    output_tail: str = ""


Check = Callable[[StepResult, subprocess.CompletedProcess | None], None]


@dataclass
class Step:
    """A step ready to run."""

    name: str
    cap_s: float
    """Its own time limit (the budget may give it less)."""
    commands: list[list[str]] = field(default_factory=list)
    """Subprocesses run in order (argv lists, no shell); the first that fails ends the step. None at all: ``check``
    does everything, with proc None."""
    check: Check | None = None
    """Fills status/summary/details from the finished commands (default: exit code 0 -> passed)."""
    env: dict[str, str] = field(default_factory=dict)
    min_s: float = 20.0
    """Skipped when less than this is left of the budget (it could not do anything useful)."""
    prepare: Callable[[], None] | None = None
    """Python run before the commands (e.g. clearing the step's scratch directory)."""


class Stopped(Exception):
    """The check itself was stopped by a signal while ``res``'s step ran."""

    def __init__(self, res: StepResult):
        super().__init__(res.summary)
        self.res = res


_ACTIVE: dict[str, object] = {"pgid": None, "stopped_by": None}


def _on_signal(signum, frame) -> None:  # noqa: ARG001
    _ACTIVE["stopped_by"] = signal.Signals(signum).name
    pgid = _ACTIVE.get("pgid")
    if isinstance(pgid, int):
        kill_group(pgid, grace_s=3.0)
    raise KeyboardInterrupt(_ACTIVE["stopped_by"])


def stop_on_signals() -> None:
    """SIGTERM, SIGINT and SIGHUP (an outer ``timeout``, a cancelled job) stop the running step's group first."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def stopped_by() -> str:
    """The name of the signal that stopped the check (SIGTERM when none was recorded)."""
    return str(_ACTIVE.get("stopped_by") or "SIGTERM")


def run_in_group(cmd: list[str], log: Path, timeout: float, env: dict[str, str]) -> tuple[int | None, bool]:
    """Run ``cmd`` in a new session (its own process group), output appended to ``log``. Returns (exit code, timed
    out). On timeout the whole group is stopped; after a normal exit, anything it left running in its group is too."""
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        _ACTIVE["pgid"] = p.pid
        try:
            try:
                rc = p.wait(timeout=max(timeout, 0.1))
                timed_out = False
            except subprocess.TimeoutExpired:
                rc, timed_out = None, True
            grace = _terminate_leader(p) if timed_out else 1.0
            kill_group(p.pid, grace_s=grace)
            p.wait()
        finally:
            _ACTIVE["pgid"] = None
    return rc, timed_out


def _terminate_leader(p: subprocess.Popen) -> float:
    """SIGTERM to the group, then reap its leader as soon as it exits (an unreaped leader stays in the group as a
    zombie, and kill_group would wait its whole grace for it); returns what is left of the grace for the rest."""
    end = time.monotonic() + KILL_GRACE_S
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=KILL_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    return max(0.0, end - time.monotonic())


def _step_env(step: Step, deadline_epoch: float) -> dict[str, str]:
    path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)  # keep the caller's
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **step.env}
    env[STEP_DEADLINE_ENV] = f"{deadline_epoch:.1f}"  # a step that can stop itself cleanly reads it
    return env


def _run_commands(step: Step, log: Path, limit: float) -> tuple[list[str], int | None, bool]:
    """The step's commands in order within ``limit`` seconds: (the last command run, its exit code, timed out)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    env = _step_env(step, time.time() + limit)
    end = time.monotonic() + limit
    for cmd in step.commands:
        rc, timed_out = run_in_group(cmd, log, end - time.monotonic(), env)
        if timed_out or rc != 0:
            break
    return cmd, rc, timed_out


def _timed_out(res: StepResult, step: Step, proc: subprocess.CompletedProcess, limit: float, by_budget: bool) -> None:
    why = (
        f"stopped at the end of the budget after {limit:.0f} s"
        if by_budget
        else f"stopped after its {limit:.0f} s limit"
    )
    if step.check is not None:  # still parse what it left (partial rows, a JUnit file)
        try:
            step.check(res, proc)
            why += f"; before that: {res.summary}"
        except Exception:  # noqa: BLE001 - a partial result is optional
            pass
    res.status, res.summary = ("cut" if by_budget else "timeout"), why


def run_step(step: Step, logs: Path, deadline: float) -> StepResult:
    """Run one step within min(its cap, the time left before ``deadline``), its output in ``logs/<name>.log``;
    never raises (but :class:`Stopped` on a stop signal)."""
    res = StepResult(step.name, command="\n".join(shlex.join(c) for c in step.commands))
    left = deadline - time.monotonic() - REPORT_RESERVE_S
    if left < step.min_s:
        res.status = "skipped"
        res.summary = f"past the budget: {max(left, 0):.0f} s left, the step needs at least {step.min_s:.0f} s"
        res.details = {"past_budget": True}
        return res
    limit = min(step.cap_s, left)
    t0 = time.monotonic()
    try:
        if step.prepare is not None:
            step.prepare()
        if not step.commands:
            if step.check is not None:
                step.check(res, None)
        else:
            log = logs / f"{step.name}.log"
            cmd, rc, timed_out = _run_commands(step, log, limit)
            text = log.read_text(errors="replace")
            res.output_tail = text[-OUTPUT_TAIL_CHARS:]
            proc = subprocess.CompletedProcess(cmd, -9 if timed_out else rc, text, "")
            if timed_out:
                _timed_out(res, step, proc, limit, by_budget=limit < step.cap_s)
            elif step.check is not None:
                step.check(res, proc)
            else:
                res.status = "passed" if rc == 0 else "failed"
                res.summary = f"exit code {rc}"
    except KeyboardInterrupt:
        res.status, res.summary = "interrupted", f"stopped by {_ACTIVE.get('stopped_by') or 'an interrupt'}"
        res.seconds = round(time.monotonic() - t0, 1)
        raise Stopped(res) from None
    except Exception as e:  # noqa: BLE001 - a broken check must not lose the report
        res.status, res.summary = "error", f"{type(e).__name__}: {e}"
    res.seconds = round(time.monotonic() - t0, 1)
    return res


def skipped_step(name: str, why: str) -> Step:
    """A step that only reports itself skipped (e.g. no training precision runs on this machine)."""

    def check(res: StepResult, proc) -> None:
        res.status, res.summary = "skipped", why

    return Step(name, 0, [], check, min_s=0)


def broken_step(name: str, why: str) -> Step:
    """A step that could not be prepared: an error in the report; the other steps still run."""

    def check(res: StepResult, proc) -> None:
        res.status, res.summary = "error", why

    return Step(name, 0, [], check, min_s=0)
