"""How the ranks of one ``preprocess`` run find each other: MPI (mpirun), a Slurm job step (srun), or alone.

The preprocessing flow needs only two collectives, both rooted at rank 0: ``bcast`` (rank 0's decision to every
rank) and ``gather`` (every rank's outcome to rank 0). Two implementations:

- :class:`MpiWorld`: mpi4py's ``COMM_WORLD`` (mpirun / mpiexec, which set OMPI_COMM_WORLD_SIZE or
  MPI_LOCALNRANKS; or a PMI/PMIx world outside Slurm).
- :class:`FileWorld`: a task of a Slurm job step (``srun -n K``: SLURM_PROCID / SLURM_STEP_NUM_TASKS). The ranks
  exchange small JSON files in a rendezvous directory next to the output (which every rank must see anyway: rank 0
  merges the part shards the others wrote). No MPI is initialised, so this works whatever ``--mpi`` plugin srun
  uses (none, pmix, pmi2), with or without an MPI that matches the cluster's PMI.

:func:`detect` picks one: an mpirun launch wins (it may itself run inside a Slurm allocation, where its ranks
inherit the variables of the launcher's own step), then a Slurm step of more than one task, then PMI variables.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

#: set by mpirun / mpiexec themselves (Open MPI's orted, MPICH's hydra), never by srun
MPIRUN_VARS = ("OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
#: set by any PMI/PMIx server (also srun --mpi=pmi2/pmix)
PMI_VARS = ("PMI_SIZE", "PMIX_RANK")


class MpiWorld:
    """mpi4py's COMM_WORLD."""

    kind = "mpi"

    def __init__(self, comm) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def bcast(self, obj: Any) -> Any:
        return self.comm.bcast(obj, root=0)

    def gather(self, obj: Any) -> list | None:
        return self.comm.gather(obj, root=0)

    def close(self, ok: bool = True) -> None:
        pass  # a rank that fails outside the collectives exits non-zero; mpirun then ends the others


def slurm_step(environ: dict[str, str] | None = None) -> tuple[int, int, str] | None:
    """(rank, size, step id) of a task of a Slurm job step with more than one task, else None.

    The step id is ``JOB.STEP[.rRESTART]`` (a requeued job keeps its id and step numbers)."""
    env = os.environ if environ is None else environ
    try:
        rank, size = int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"])
    except (KeyError, ValueError):
        return None
    if size <= 1:
        return None
    step = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', env.get('SLURM_STEPID', '0'))}"
    if env.get("SLURM_RESTART_COUNT", "0") not in ("", "0"):
        step += f".r{env['SLURM_RESTART_COUNT']}"
    return rank, size, step


class FileWorld:
    """Ranks of a Slurm job step meeting in a directory of the shared file system.

    Each collective is numbered; ``bcast`` is one file written by rank 0, ``gather`` one file per rank. Files are
    written to a temporary name and renamed, so a reader never sees half of one. Rank 0 removes the directory
    after every rank has said goodbye (``close``). A rank that dies leaves the others waiting: run srun with
    ``--kill-on-bad-exit=1`` (the templates do) so the step ends with it; every ``report_every`` seconds a waiting
    rank says what it waits for.
    """

    kind = "slurm"

    def __init__(self, directory: str, rank: int, size: int, poll: float = 0.05, report_every: float = 60.0) -> None:
        self.dir, self.rank, self.size = directory, rank, size
        self.poll, self.report_every = poll, report_every
        self._n = 0
        if rank == 0:
            if os.path.isdir(directory):  # left by a killed step with the same id: never trusted
                shutil.rmtree(directory)
            os.makedirs(directory + ".tmp", exist_ok=True)
            self._write(os.path.join(directory + ".tmp", "size"), {"size": size})
            os.replace(directory + ".tmp", directory)  # the directory appears complete, with its size file
        else:
            meta = self._read(os.path.join(directory, "size"))
            if meta["size"] != size:
                raise RuntimeError(f"rank {rank}: rendezvous {directory} is for {meta['size']} ranks, this step has "
                                   f"{size}")
        # claim our rank: two tasks with one SLURM_PROCID (e.g. a mis-set environment) would corrupt the output
        try:
            fd = os.open(os.path.join(directory, f"rank-{rank}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
        except FileExistsError:
            raise RuntimeError(f"two tasks claim rank {rank} in {directory}") from None

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    @staticmethod
    def _write(path: str, obj: Any) -> None:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(obj, f)
        os.replace(tmp, path)

    def _read(self, path: str) -> Any:
        t0 = last = time.time()
        while True:
            try:
                with open(path) as f:
                    return json.load(f)
            except FileNotFoundError:
                pass
            if os.path.exists(self._path("abort.json")):
                with open(self._path("abort.json")) as f:
                    raise RuntimeError(f"rank {self.rank}: stopping, another rank failed: {json.load(f)['why']}")
            now = time.time()
            if now - last >= self.report_every:
                last = now
                print(f"[preprocess rank {self.rank}/{self.size}] still waiting for {path} after {now - t0:.0f} s "
                      "(is every rank alive and on the same shared file system?)", file=sys.stderr, flush=True)
            time.sleep(self.poll)

    def bcast(self, obj: Any) -> Any:
        self._n += 1
        path = self._path(f"bcast-{self._n}.json")
        if self.rank == 0:
            self._write(path, {"v": obj})
            return obj
        return self._read(path)["v"]

    def gather(self, obj: Any) -> list | None:
        self._n += 1
        self._write(self._path(f"gather-{self._n}-{self.rank}.json"), {"v": obj})
        if self.rank != 0:
            return None
        return [self._read(self._path(f"gather-{self._n}-{r}.json"))["v"] for r in range(self.size)]

    def close(self, ok: bool = True) -> None:
        """Rank 0 waits for everyone's goodbye, then removes the directory. After a failure outside the collectives
        (``ok=False``) a rank writes ``abort.json`` instead, which makes every waiting rank raise; the directory is
        then left for inspection."""
        if not ok:
            self._write(self._path("abort.json"), {"why": f"rank {self.rank} failed (see its output)"})
            return
        self._write(self._path(f"bye-{self.rank}"), None)
        if self.rank == 0:
            for r in range(1, self.size):
                self._read(self._path(f"bye-{r}"))
            shutil.rmtree(self.dir, ignore_errors=True)


def detect(output_prefix: str, environ: dict[str, str] | None = None) -> MpiWorld | FileWorld | None:
    """The world this process belongs to (None: a single process)."""
    env = os.environ if environ is None else environ
    step = None if any(v in env for v in MPIRUN_VARS) else slurm_step(env)
    if step is not None:
        rank, size, step_id = step
        return FileWorld(f"{output_prefix}.rendezvous-{step_id}", rank, size)
    if not any(v in env for v in MPIRUN_VARS + PMI_VARS):
        return None
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return MpiWorld(comm) if comm.Get_size() > 1 else None
