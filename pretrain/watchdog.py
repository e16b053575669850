"""Bounded exit: a host-side watchdog per rank, and the watch on the process that launched it.

A rank stuck in a collective whose peer stopped answering (host link down, a SIGSTOPped or frozen process, a
switch failure) raises after the process group's timeout only if every group has it: DeepSpeed creates its own
groups with ``dist.new_group(ranks)`` and no timeout, so torch gives them its module default (30 minutes for gloo,
10 for NCCL). :func:`set_default_group_timeout` sets that default to the run's ``--distributed-timeout-minutes``
before any group exists (the one place we change torch's state for it).

Where even that does not end the process (a hang outside a collective, in a teardown, a library that ignores the
timeout), the :class:`Watchdog` does: a daemon thread that ends the process with exit code :data:`EXIT_STALLED`
when the training loop made no progress for the timeout plus a grace period, after printing which peer ranks
stopped answering. It learns that from heartbeats every rank writes into the rendezvous store (torch's TCPStore on
MASTER_ADDR) from a thread of its own: a peer whose heartbeat went stale (stopped, cut off, dead) is the one this
rank waited for; a store that cannot be reached means rank 0's host is the lost one.

The same thread watches the launcher: the deepspeed runner on one node forwards no signal to its ranks (only its
multi-node pdsh mode does), so a SIGTERM to ``deepspeed`` used to leave the ranks training. Each rank notes its
launcher processes at start (its ancestors up to the first one that is not a known launcher); when one of them is
gone, the rank sends itself SIGTERM: with ``--exit-signal-handler`` every rank then saves and stops (exit code 4),
without it the rank ends at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

EXIT_STALLED = 5
"""Exit code of a rank the watchdog ended: a peer stopped answering; the same command with --load resumes."""
GRACE_S = 30.0
"""How long past the collective timeout the watchdog waits before ending the process (gloo's own timeout error and
the teardown after it come first when they work)."""
_LAUNCHERS = (
    "deepspeed.launcher",
    "/deepspeed ",
    "bin/deepspeed",
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "mpirun",
    "mpiexec",
    "orted",
    "prted",
    "prterun",
    "hydra_pmi_proxy",
    "run_scripts/",
)
"""Command-line fragments of the processes a rank counts as its launcher (their death ends the rank)."""
_RUN_SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
"""Our scripts' directory: a shell running a script from it is a launcher however the script was named."""


_PEER_LOST = (
    "Timed out waiting",  # gloo: a peer that stopped answering (link down, frozen process), after the timeout
    "Connection reset by peer",  # gloo: a peer process died
    "Connection closed by peer",
    "Connection refused",
    "Broken pipe",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",  # NCCL's own watchdog
)


def peer_lost(exc: BaseException) -> str | None:
    """The first line of ``exc`` when it is a collective that failed because a peer stopped answering or died
    (raised inside torch.distributed with one of gloo's or NCCL's peer-loss messages), else None. Such a failure
    ends the rank with :data:`EXIT_STALLED`, as the watchdog does: Slurm's requeue (run_scripts/slurm/job.sh) acts
    on that code, not on a traceback's 1."""
    import torch.distributed as dist

    text = str(exc)
    in_dist = isinstance(exc, getattr(dist, "DistError", ())) or any(
        "torch/distributed/" in frame.filename for frame in traceback.extract_tb(exc.__traceback__)
    )
    if in_dist and any(marker in text for marker in _PEER_LOST):
        return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return None


def set_default_group_timeout(timeout: timedelta) -> None:
    """Make ``timeout`` the default of every process group created without one (DeepSpeed's ``new_group`` calls in
    deepspeed/utils/groups.py and ZeRO): torch's ``new_group(timeout=None)`` reads these module globals of
    ``torch.distributed.distributed_c10d`` at call time."""
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timeout
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        c10d.default_pg_nccl_timeout = timeout


def group_timeouts() -> list[float]:
    """The timeout in seconds of every process group this process created (the world first)."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    out = []
    for pg in list(c10d._world.pg_map):
        for device in ("cpu", "cuda"):
            try:
                backend = pg._get_backend(torch.device(device))
            except (RuntimeError, ValueError):
                continue
            opts = getattr(backend, "options", None)
            if opts is not None and hasattr(opts, "_timeout"):
                out.append(opts._timeout.total_seconds())
                break
    return out


def _runs_our_script(pid: int) -> bool:
    """The process is a shell running a script of our run_scripts/: bash keeps the script it reads open on fd 255
    (an absolute path however it was started: ``bash ./pretrain_blockbert.sh`` from inside the directory, a link)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/fd/255")).resolve().parent == _RUN_SCRIPTS
    except OSError:
        return False


def _proc(pid: int) -> tuple[int, str] | None:
    """(parent pid, command line) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    ppid = int(stat.rsplit(")", 1)[1].split()[1])
    return ppid, cmd


def launcher_pids(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, start time) of this process's launcher ancestors, nearest first: the parent chain while each is a known
    launcher (deepspeed's runner and per-node launch.py, torchrun, mpirun/orted, hydra, our run_scripts/). Any
    other shell, sshd, srun's slurmstepd or init ends the chain (srun and slurmstepd forward signals themselves)."""
    out = []
    pid = os.getppid() if pid is None else pid
    while pid > 1:
        info = _proc(pid)
        if info is None:
            break
        ppid, cmd = info
        if not any(f in cmd + " " for f in _LAUNCHERS) and not _runs_our_script(pid):
            break
        out.append((pid, _start_time(pid)))
        pid = ppid
    return out


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int, start: str) -> bool:
    """The process still exists and is the same one (pid not reused)."""
    return _start_time(pid) == start


class Watchdog:
    """One per rank: ``progress()`` from the training loop; ``arm()`` once training starts, ``stop()`` at the end."""

    def __init__(self, timeout_s: float, rank: int, world_size: int, grace_s: float = GRACE_S) -> None:
        self.timeout_s = timeout_s
        self.limit_s = timeout_s + grace_s
        self.rank, self.world_size = rank, world_size
        self.host = socket.gethostname()
        self.beat_s = max(1.0, min(10.0, timeout_s / 6))
        self._last = time.monotonic()
        self._iteration = 0
        self._armed = False
        self._stop = threading.Event()
        self._launchers = launcher_pids()
        self._store = None
        if world_size > 1:
            import torch.distributed as dist
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
            self._store = dist.PrefixStore("sparsebert_watchdog/", store)
            threading.Thread(target=self._publish, name="watchdog-heartbeat", daemon=True).start()
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    # ---------------------------------------------------------------------------------------------- main thread
    def progress(self, iteration: int | None = None) -> None:
        self._last = time.monotonic()
        if iteration is not None:
            self._iteration = iteration

    def arm(self) -> None:
        self.progress()
        self._armed = True

    def stop(self) -> None:
        self._armed = False
        self._stop.set()

    # ---------------------------------------------------------------------------------------------- threads
    def _publish(self) -> None:
        """Heartbeats into the store; blocks (harmlessly, in this thread) when the store cannot be reached."""
        while not self._stop.is_set():
            try:
                payload = json.dumps({"it": self._iteration, "t": time.time(), "host": self.host})
                self._store.set(f"hb/{self.rank}", payload)
            except Exception:  # store gone or unreachable: the stalled check names it
                pass
            self._stop.wait(self.beat_s)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            gone = [pid for pid, start in self._launchers if not _alive(pid, start)]
            if gone:
                self._launchers = []
                print(
                    f"[watchdog] rank {self.rank} on {self.host}: its launcher (pid {gone[0]}) is gone; stopping "
                    "this rank as if it had received SIGTERM",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGTERM)
            if self._armed and time.monotonic() - self._last > self.limit_s:
                self._abort()

    def peers_status(self, wait_s: float = 10.0) -> str:
        """Which peers stopped answering, from their heartbeats (asked in a thread, given ``wait_s``)."""
        if self._store is None:
            return "no peers"
        result: list[str] = []

        def ask() -> None:
            now = time.time()
            stale = []
            for r in range(self.world_size):
                if r == self.rank:
                    continue
                try:
                    hb = json.loads(self._store.get(f"hb/{r}"))
                except Exception as e:
                    stale.append(f"rank {r} (no heartbeat: {type(e).__name__})")
                    continue
                age = now - hb["t"]
                if age > 3 * self.beat_s + 2:
                    stale.append(f"rank {r} on {hb['host']} (last heartbeat {age:.0f} s ago, iteration {hb['it']})")
            result.append(
                "waited for " + ", ".join(stale) if stale else "every peer's heartbeat is fresh (a slow collective?)"
            )

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        t.join(wait_s)
        if not result:
            addr = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
            return f"waited for rank 0 (its rendezvous store at {addr} does not answer: rank 0's host is lost)"
        return result[0]

    def _abort(self) -> None:
        stalled = time.monotonic() - self._last
        print(
            f"[watchdog] rank {self.rank} on {self.host}: no progress for {stalled:.0f} s after iteration "
            f"{self._iteration} (collective timeout {self.timeout_s:.0f} s + {self.limit_s - self.timeout_s:.0f} s "
            f"grace); {self.peers_status()}. Ending this rank with exit code {EXIT_STALLED}; run the same command "
            "with --load on the hosts left to resume from the last committed checkpoint",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_STALLED)
