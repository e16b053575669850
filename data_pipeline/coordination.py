"""How the ranks of one ``preprocess`` run find each other: MPI (mpirun), a Slurm job step (srun), or alone.

The preprocessing flow needs only two collectives, both rooted at rank 0: ``bcast`` (rank 0's decision to every
rank) and ``gather`` (every rank's outcome to rank 0). Two implementations:

- :class:`MpiWorld`: mpi4py's ``COMM_WORLD`` (Open MPI's mpirun, MPICH's mpiexec or another PMI/PMIx world outside
  an srun step).
- :class:`TorchWorld`: a task of a Slurm job step (``srun -n K``: SLURM_PROCID / SLURM_STEP_NUM_TASKS). The ranks
  form a torch.distributed gloo group that meets through a file next to the output (which every rank must see
  anyway: rank 0 merges the part shards the others wrote). No MPI is initialised, so this works whatever ``--mpi``
  plugin srun uses (none, pmix, pmi2), with or without an MPI that matches the cluster's PMI.

:func:`detect` picks one from what :func:`common.launch.detect` says: ranks that share an MPI world (mpirun wins
inside a Slurm allocation, where its ranks inherit the variables of the launcher's own step) use MPI; ranks with a
shared launch id (a Slurm step of more than one task) a TorchWorld.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from common import launch
from common.errors import UserError


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


class TorchWorld:
    """The tasks of a Slurm job step as a torch.distributed gloo group.

    They meet through torch's ``FileStore`` in a file next to the output, which every rank must see anyway (rank 0
    merges the part shards the others wrote): no MPI, so any ``--mpi`` plugin works, and no port, so jobs sharing a
    node cannot collide. Rank 0 removes the file as soon as every rank has joined (see :meth:`_remove_rendezvous`);
    torch's own clean-up, by the last store destructor, does not run when a process skips interpreter finalization
    (:func:`common.process.exit_process`) and left the file behind under load. A rank that dies closes its gloo sockets,
    so the others fail in their next collective; ``srun --kill-on-bad-exit=1`` (the template's) ends the step at
    once. Ranks may wait long for the slowest one (its share of the corpus), hence the long default timeout.
    """

    kind = "slurm"

    def __init__(self, path: str, rank: int, size: int, timeout: timedelta = timedelta(days=2)) -> None:
        import torch.distributed as dist

        self.rank, self.size, self.path = rank, size, Path(os.path.abspath(path))
        dist.init_process_group("gloo", init_method=f"file://{self.path}", rank=rank, world_size=size, timeout=timeout)
        self._remove_rendezvous()

    def _remove_rendezvous(self) -> None:
        """Delete the rendezvous file once no rank needs it, race-free.

        Gloo reads the store only while the group forms. After the first barrier every rank has formed it, so rank 0
        deletes the file; the second barrier keeps every rank from leaving (and running the store's destructor, which
        returns early when the file is gone but would re-create it if the deletion came in between) until then."""
        import torch.distributed as dist

        dist.barrier()
        if self.rank == 0:
            self.path.unlink(missing_ok=True)
        dist.barrier()

    def bcast(self, obj: Any) -> Any:
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list | None:
        import torch.distributed as dist

        out = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def close(self, ok: bool = True) -> None:
        """Leave the group. After a failure outside the collectives (``ok=False``) the process just exits: its
        closed sockets stop the ranks waiting for it."""
        import torch.distributed as dist

        if ok and dist.is_initialized():
            dist.destroy_process_group()


def detect(output_prefix: str, environ: dict[str, str] | None = None) -> MpiWorld | TorchWorld | None:
    """The world this process belongs to (None: a single process)."""
    where = launch.detect(environ, master=False)
    if where.mpi:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        return MpiWorld(comm) if comm.Get_size() > 1 else None
    if (where.world_size or 1) <= 1:
        return None
    if where.launch_id is not None:  # srun: the step's tasks meet through a file named by the step
        return TorchWorld(f"{output_prefix}.rendezvous-{where.launch_id}", where.rank, where.world_size)
    raise UserError(
        f"preprocessing was started by {where.launcher} ({where.world_size} ranks): its ranks would each write the "
        "whole output; start it with mpirun -np K, srun -n K, or one plain python process"
    )
