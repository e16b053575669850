"""Leaving a process that ran collectives: the one exit path the trainer and the preprocessing ranks share."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


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
