"""Ending processes: the one exit path the trainer and the preprocessing ranks share (a process that ran
collectives), and stopping a whole process group (a launcher with its ranks)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import NoReturn

STEP_DEADLINE_ENV = "GPU_CHECK_STEP_DEADLINE"
"""Set by a supervisor (devtools/gpu_check) for each process group it starts: the epoch second at which the group is
stopped, so a step that can end cleanly (``benchmarks.step --measure profile``) stops before."""


def exit_process(code: int) -> NoReturn:
    """End a process that ran gloo collectives without interpreter finalization, after flushing its output.

    Gloo's worker threads drop their last references to finished work (and so to Python-owned tensors) on their
    own schedule. One that does so after the interpreter began to finalize is terminated by Python inside C++
    (``PyEval_AcquireThread`` -> ``pthread_exit``), and the process aborts with ``terminate called without an
    active exception`` and exit code 134 after a complete run (1 run in 3 under load on 2 cores). Destroying the
    process group does not join those threads while DeepSpeed or a ZeRO-3 parameter still holds the group. Callers
    close their files, writers and loaders first; this finalizes MPI if mpi4py initialized it (its atexit hook would
    not run, and mpirun counts a rank without ``MPI_Finalize`` as failed), flushes stdio and logging and leaves with
    ``os._exit``."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class _OutputThatOutlivesItsReader:
    """``sys.stdout``/``sys.stderr`` that go on (into /dev/null) when the reader is gone: a rank under ``deepspeed
    --launcher pdsh`` writes through an ssh session that the runner's SIGTERM ends, and the rank must still save on
    that SIGTERM (--exit-signal-handler) instead of dying of BrokenPipeError at its next log line."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _lost(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())  # C++ writers (gloo, DeepSpeed ops) too
        except (OSError, ValueError):
            pass
        os.close(devnull)
        self._stream = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._lost()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._lost()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def outlive_lost_output() -> None:
    """Make this process's stdout and stderr survive their reader going away (see the class above)."""
    if not isinstance(sys.stdout, _OutputThatOutlivesItsReader):
        sys.stdout = _OutputThatOutlivesItsReader(sys.stdout)
    if not isinstance(sys.stderr, _OutputThatOutlivesItsReader):
        sys.stderr = _OutputThatOutlivesItsReader(sys.stderr)


def kill_group(pgid: int, grace_s: float) -> None:
    """SIGTERM to every process of the group, SIGKILL to what is left after ``grace_s`` (0: at once). A launcher's
    ranks are its children, not the launcher: killing only the launcher leaves them holding ports, files and CPU."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
