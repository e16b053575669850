"""Test-only fault injection. The trainer calls one hook, a ``Faults``, at the points a fault can be injected; the
default hook does nothing. ``from_environment`` gives the hook the tests inject through, driven by environment
variables (read once, at start) so no production flag exists for it:

SPARSEBERT_FAULT_NONFINITE_LOSS="ITER[,ITER...]"  rank 0 multiplies its loss by inf at those iterations
SPARSEBERT_FAULT_KILL_IN_SAVE="ITER"              rank 0 SIGKILLs itself after DeepSpeed wrote the checkpoint
                                                   files of ITER but before the commit marker and `latest`
                                                   (pretrain/checkpoint.py calls the hook's ``in_save``)
SPARSEBERT_FAULT_KILL_RANK="RANK:ITER"             that rank SIGKILLs itself at the start of ITER
SPARSEBERT_FAULT_SIGNAL="RANK:ITER:SIGNAME"          that rank sends itself SIGNAME at the start of ITER
SPARSEBERT_FAULT_STALL="RANK:ITER"                 that rank's main thread sleeps forever at the start of ITER
                                                   (a hang outside any collective: only the watchdog ends it)
SPARSEBERT_FAULT_ONCE_DIR=DIR                     the RANK:ITER faults fire once (a marker file in DIR): a
                                                   requeued job, same environment, does not meet them again
SPARSEBERT_FAULT_SLOW_DATA="RANK:SECONDS"           that rank sleeps SECONDS before reading each micro-batch (a
                                                   straggler: a slow data path)
"""

from __future__ import annotations

import os
import signal
import time
from typing import Mapping

import torch

PREFIX = "SPARSEBERT_FAULT_"


class Faults:
    """The fault hook: does nothing (a run without SPARSEBERT_FAULT_* variables pays one empty call per point)."""

    def before_step(self, iteration: int, rank: int) -> None:
        """At the start of step ``iteration`` (counted from 1)."""

    def before_micro_batch(self, rank: int) -> None:
        """Before this rank reads a micro-batch (inside the data-loading time the straggler check measures)."""

    def on_loss(self, loss: torch.Tensor, iteration: int, rank: int) -> torch.Tensor:
        """A micro-batch's loss before backward; returns the loss to use."""
        return loss

    def in_save(self, iteration: int, rank: int) -> None:
        """Inside the save of ``iteration``: every rank's files written and checksummed, the commit marker and
        `latest` not yet (pretrain/checkpoint.py)."""


def _iters(raw: str) -> frozenset[int]:
    return frozenset(int(x) for x in raw.split(",") if x.strip())


def _rank_iter(raw: str) -> tuple[int, int] | None:
    return tuple(int(x) for x in raw.split(":")) if raw else None


class EnvFaults(Faults):
    """The faults the SPARSEBERT_FAULT_* variables of ``environ`` name (module docstring)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.nonfinite = _iters(environ.get(PREFIX + "NONFINITE_LOSS", ""))
        self.kill_in_save = _iters(environ.get(PREFIX + "KILL_IN_SAVE", ""))
        self.kill_rank = _rank_iter(environ.get(PREFIX + "KILL_RANK", ""))
        self.stall = _rank_iter(environ.get(PREFIX + "STALL", ""))
        self.once_dir = environ.get(PREFIX + "ONCE_DIR") or None
        signal_at = environ.get(PREFIX + "SIGNAL", "")
        self.signal: tuple[int, int, str] | None = None
        if signal_at:
            rank, iteration, name = signal_at.split(":")
            self.signal = (int(rank), int(iteration), name)
        slow = environ.get(PREFIX + "SLOW_DATA", "")
        self.slow_data: tuple[int, float] | None = None
        if slow:
            rank, seconds = slow.split(":")
            self.slow_data = (int(rank), float(seconds))

    def _fires(self, name: str, at: tuple[int, int] | None, iteration: int, rank: int) -> bool:
        """Whether the fault ``name`` set to ``at`` (RANK, ITER) names this rank and iteration and, with
        SPARSEBERT_FAULT_ONCE_DIR, has not fired yet (a requeued job reruns the same command, same environment)."""
        if at != (rank, iteration):
            return False
        if self.once_dir:
            marker = os.path.join(self.once_dir, f"{PREFIX}{name}.{rank}.{iteration}")
            if os.path.exists(marker):
                return False
            os.makedirs(self.once_dir, exist_ok=True)
            open(marker, "w").close()
        return True

    def before_step(self, iteration: int, rank: int) -> None:
        if self._fires("KILL_RANK", self.kill_rank, iteration, rank):
            print(f"[fault] rank {rank}: dying at iteration {iteration}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.signal is not None and self.signal[:2] == (rank, iteration):
            name = self.signal[2]
            print(f"[fault] rank {rank}: sending itself {name} at iteration {iteration}", flush=True)
            os.kill(os.getpid(), getattr(signal, name))
        if self._fires("STALL", self.stall, iteration, rank):
            print(f"[fault] rank {rank}: stalling at iteration {iteration}", flush=True)
            while True:
                time.sleep(3600)

    def before_micro_batch(self, rank: int) -> None:
        if self.slow_data is not None and self.slow_data[0] == rank:
            time.sleep(self.slow_data[1])

    def on_loss(self, loss: torch.Tensor, iteration: int, rank: int) -> torch.Tensor:
        return loss * float("inf") if rank == 0 and iteration in self.nonfinite else loss

    def in_save(self, iteration: int, rank: int) -> None:
        if rank == 0 and iteration in self.kill_in_save:
            print(f"[fault] rank {rank}: killed during the save of iteration {iteration}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def from_environment(environ: Mapping[str, str] = os.environ) -> Faults:
    """The hook the trainer calls: the do-nothing ``Faults`` unless a SPARSEBERT_FAULT_* variable is set."""
    return EnvFaults(environ) if any(k.startswith(PREFIX) for k in environ) else Faults()
