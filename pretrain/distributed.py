"""Process-group start-up for every launch path, and a teardown that always runs.

Who started this process and where it sits is :func:`common.launch.detect`'s answer (deepspeed, torchrun, mpirun,
srun, MPICH's mpiexec, or a plain ``python``: a world of one); this module keeps what is torch.distributed's: where
the launcher did not export RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* (srun, mpirun with a given MASTER_ADDR, plain
python) they are set from that answer, and where it cannot tell (mpirun without a master, mpiexec)
``deepspeed.init_distributed``'s MPI discovery (mpi4py) fills them. The GPU a rank uses is picked before DeepSpeed
initialises (:func:`cuda_device_index`: under ``srun --gpus-per-task=1`` local rank 3 is cuda:0).
Backend: NCCL on GPUs, gloo on CPU (DeepSpeed's accelerator decides). The timeout bounds how long a rank waits for
a dead peer inside a collective: it is made the default of every group created later too (DeepSpeed's own,
pretrain/watchdog.py), and the watchdog ends a rank that still hangs.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from common.launch import PYTHON, detect

T = TypeVar("T")


@dataclass
class DistInfo:
    """Where this process sits."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks (all data-parallel)."""
    local_rank: int
    """Rank on this node (picks the GPU)."""
    device: torch.device
    """cuda:<cuda_device_index(local_rank, visible GPUs)> when CUDA is available, else cpu."""


def cuda_device_index(local_rank: int, device_count: int) -> int:
    """The GPU a rank uses among those it sees: ``local_rank mod device_count``.

    With every GPU of the node visible (deepspeed, torchrun, ``srun --gpus-per-node=G``) that is the local rank;
    with ``srun --gpus-per-task=1`` (or one CUDA_VISIBLE_DEVICES entry per rank) each task sees only its own GPU,
    as cuda:0, while its local rank goes up to G - 1."""
    if device_count < 1:
        raise RuntimeError("no CUDA device visible to this rank")
    return local_rank % device_count


def check_ranks_fit_gpus(local_size: int | None, device_count: int, visible_devices: str | None) -> None:
    """Refuse more ranks on a node than the GPUs they see: :func:`cuda_device_index` would put two ranks on one GPU
    (``local_rank % device_count``) and NCCL fails much later, or the ranks silently share it. One visible GPU per
    rank (``srun --gpus-per-task=1``, one CUDA_VISIBLE_DEVICES entry per rank) is the exception: each rank sees its
    own GPU as cuda:0. ``local_size`` None (the launcher did not say) is not checked."""
    if local_size is None or local_size <= device_count:
        return
    own_gpu = device_count == 1 and visible_devices is not None and len(visible_devices.split(",")) == 1
    if own_gpu:
        return
    raise RuntimeError(
        f"{local_size} ranks on this node but {device_count} visible GPU(s): ranks would share GPUs "
        f"(local_rank % {device_count}) and NCCL fails later; start at most {device_count} rank(s) per node "
        "(NPROC, deepspeed --num_gpus, torchrun --nproc-per-node, mpirun -npernode)"
    )


def init_distributed(timeout_minutes: float, local_rank: int | None = None) -> DistInfo:
    import deepspeed

    where = detect()
    found = where.torch_env() if where.fills_env else None
    if found is not None:  # srun, mpirun with a known master, plain python: the launcher did not set them
        os.environ.update(found)
        if where.launcher != PYTHON and found["RANK"] == "0":  # a wrong master (stale MASTER_ADDR, wrong
            print(  # interface) shows up here, not as a hang
                f"[dist] {found['WORLD_SIZE']} rank(s); master {found['MASTER_ADDR']}:{found['MASTER_PORT']}",
                flush=True,
            )
    node_local = where.local_rank
    if torch.cuda.is_available():
        check_ranks_fit_gpus(where.local_world_size, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if torch.cuda.is_available() and node_local is not None:
        # before DeepSpeed: it passes device_id=cuda:LOCAL_RANK to init_process_group, which fails where a task sees
        # only its own GPU (srun --gpus-per-task=1: SLURM_LOCALID 3 must become cuda:0)
        index = cuda_device_index(int(node_local), torch.cuda.device_count())
        os.environ["LOCAL_RANK"] = str(index)
        torch.cuda.set_device(index)
        if local_rank is None:
            local_rank = int(node_local)
    from pretrain.watchdog import set_default_group_timeout

    set_default_group_timeout(timedelta(minutes=timeout_minutes))  # before DeepSpeed creates its groups
    deepspeed.init_distributed(
        dist_backend=None,
        auto_mpi_discovery=True,
        distributed_port=int(os.environ.get("MASTER_PORT") or 29500),
        timeout=timedelta(minutes=timeout_minutes),
    )
    unlink_shm_buffers()
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        index = cuda_device_index(local_rank, torch.cuda.device_count())
        if index != local_rank:  # (MPI discovery set LOCAL_RANK only now) the engine and ZeRO index GPUs by it
            os.environ["LOCAL_RANK"] = str(index)
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device)


SHM_BUFFER = "/dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"
"""The shared-memory file DeepSpeed's CPU all-reduce op creates per rank (deepspeed/ops/csrc/cpu/comm/shm.cpp)."""


def unlink_shm_buffers() -> None:
    """Remove this rank's DeepSpeed CPU all-reduce buffer name once every rank has mapped every buffer.

    DeepSpeed never unlinks them: each CPU run left 2 x 66 MB in /dev/shm (RAM) behind, and a day of test runs
    filled the machine's memory. ``shm_initialize`` maps all peers' buffers before init returns, so after a barrier
    the names are no longer needed; the mappings live on until the processes exit, whatever ends them."""
    path = Path(
        SHM_BUFFER.format(
            uid=os.getuid(),
            addr=os.environ.get("MASTER_ADDR", ""),
            port=os.environ.get("MASTER_PORT", ""),
            rank=dist.get_rank(),
        )
    )
    if not path.parent.is_dir():
        return
    dist.barrier()
    path.unlink(missing_ok=True)


def destroy_distributed() -> None:
    """Destroy the process group (gloo ranks can abort at interpreter exit otherwise). Safe to call twice."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_ranks_true(flag: bool | torch.Tensor, device: torch.device) -> bool:
    """True on every rank iff flag is True on every rank (one tiny all-reduce; a tensor flag stays on the device
    until the result is read)."""
    if isinstance(flag, torch.Tensor):
        t = (~flag.to(device=device, dtype=torch.bool)).to(torch.float32).reshape(1)
    else:
        t = torch.tensor([0.0 if flag else 1.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() == 0.0)


def rank0_result(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and give its result, or its exception, to every rank: one decision for all.

    Raising on every rank together (rather than on rank 0 alone) keeps the others from waiting in the next
    collective until the timeout.
    """
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            payload = [(True, fn())]
        except Exception as e:  # handed to every rank and raised there
            payload = [(False, e)]
    dist.broadcast_object_list(payload, src=0)
    ok, value = payload[0]
    if not ok:
        raise value
    return value


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_module_state(module: torch.nn.Module, device: torch.device) -> None:
    """Copy rank 0's parameters and buffers into every rank's module (same architecture), one tensor at a time
    through ``device`` (NCCL moves only CUDA tensors), so no rank but 0 reads a checkpoint file."""
    for t in module.state_dict().values():
        staged = t.detach().to(device)
        wire = staged.view(torch.uint8) if staged.dtype == torch.bool else staged
        dist.broadcast(wire, src=0)
        if dist.get_rank() != 0:
            t.copy_(staged)


class ExitSignal:
    """Catches the configured signal (e.g. Slurm's warning before the time limit), SIGTERM (what Slurm sends at the
    limit, on preemption, ``scancel`` and node drain; what the watchdog sends when the launcher is gone) and SIGINT
    (Ctrl-C) and lets every rank agree, at the end of an iteration, that one
    of them received one (Megatron's DistributedSignalHandler). The trainer asks every --exit-signal-interval
    iterations (default: the log interval) and at saves, since each question is an all-reduce the host waits for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.signums = sorted({getattr(signal, name), signal.SIGTERM, signal.SIGINT})
        self.received = False
        self.received_name: str | None = None
        """The signal this rank received (None: none, or another rank's signal stopped the run)."""
        self._previous = {s: signal.signal(s, self._handle) for s in self.signums}

    def _handle(self, signum, frame) -> None:
        self.received = True
        self.received_name = signal.Signals(signum).name

    def received_anywhere(self, device: torch.device) -> bool:
        return not all_ranks_true(not self.received, device)

    def restore(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
