"""Process-group start-up for the four launch paths, and a teardown that always runs.

- `deepspeed pretrain/train.py` (single node or --hostfile/pdsh): RANK/WORLD_SIZE/MASTER_* and --local_rank set.
- `torchrun`: RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* set.
- `mpirun -np K python -m pretrain.train`: only OMPI_* set; deepspeed.init_distributed's MPI discovery (mpi4py)
  fills RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/PORT.
- plain `python -m pretrain.train`: one rank; we fill the env for a world of one.
Backend: NCCL on GPUs, gloo on CPU (DeepSpeed's accelerator decides). The timeout bounds how long a rank waits for
a dead peer inside a collective.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
_LAUNCHER_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


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
    """cuda:<local_rank> when CUDA is available, else cpu."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_minutes: float, local_rank: int | None = None) -> DistInfo:
    import deepspeed

    if not any(v in os.environ for v in _LAUNCHER_VARS):
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    deepspeed.init_distributed(dist_backend=None, auto_mpi_discovery=True,
                               timeout=timedelta(minutes=timeout_minutes))
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=device)


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
