"""Test-only fault injection, driven by environment variables so no production flag exists for it.

SPARSEBERT_FAULT_NONFINITE_LOSS="ITER[,ITER...]"  rank 0 multiplies its loss by inf at those iterations
SPARSEBERT_FAULT_KILL_IN_SAVE="ITER"              rank 0 SIGKILLs itself after DeepSpeed wrote the checkpoint
                                                   files of ITER but before the commit marker and `latest`
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


def _iters(name: str) -> set[int]:
    raw = os.environ.get(name, "")
    return {int(x) for x in raw.split(",") if x.strip()}


def nonfinite_loss_at(iteration: int, rank: int) -> bool:
    return rank == 0 and iteration in _iters("SPARSEBERT_FAULT_NONFINITE_LOSS")


def maybe_kill_in_save(iteration: int, rank: int) -> None:
    if rank == 0 and iteration in _iters("SPARSEBERT_FAULT_KILL_IN_SAVE"):
        print(f"[fault] rank {rank}: killed during the save of iteration {iteration}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def _at(var: str, iteration: int, rank: int) -> bool:
    """Whether ``$var`` (``RANK:ITER``) names this rank and iteration, and, with SPARSEBERT_FAULT_ONCE_DIR, the fault
    has not fired yet (a requeued job reruns the same command with the same environment)."""
    raw = os.environ.get(var, "")
    if not raw or tuple(int(x) for x in raw.split(":")) != (rank, iteration):
        return False
    once = os.environ.get("SPARSEBERT_FAULT_ONCE_DIR")
    if once:
        marker = os.path.join(once, f"{var}.{rank}.{iteration}")
        if os.path.exists(marker):
            return False
        os.makedirs(once, exist_ok=True)
        open(marker, "w").close()
    return True


def maybe_kill_rank(iteration: int, rank: int) -> None:
    if _at("SPARSEBERT_FAULT_KILL_RANK", iteration, rank):
        print(f"[fault] rank {rank}: dying at iteration {iteration}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_signal_self(iteration: int, rank: int) -> None:
    raw = os.environ.get("SPARSEBERT_FAULT_SIGNAL", "")
    if raw:
        want_rank, want_iter, name = raw.split(":")
        if rank == int(want_rank) and iteration == int(want_iter):
            print(f"[fault] rank {rank}: sending itself {name} at iteration {iteration}", flush=True)
            os.kill(os.getpid(), getattr(signal, name))


def maybe_stall(iteration: int, rank: int) -> None:
    if _at("SPARSEBERT_FAULT_STALL", iteration, rank):
        print(f"[fault] rank {rank}: stalling at iteration {iteration}", flush=True)
        import time

        while True:
            time.sleep(3600)


def maybe_slow_data(rank: int) -> None:
    raw = os.environ.get("SPARSEBERT_FAULT_SLOW_DATA", "")
    if raw:
        want_rank, seconds = raw.split(":")
        if rank == int(want_rank):
            import time

            time.sleep(float(seconds))
