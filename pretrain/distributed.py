"""Process-group start-up for the four launch paths, and a teardown that always runs.

- `deepspeed pretrain/train.py` (single node or --hostfile/pdsh): RANK/WORLD_SIZE/MASTER_* and --local_rank set.
- `torchrun`: RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* set.
- `mpirun -np K python -m pretrain.train`: only OMPI_* set; deepspeed.init_distributed's MPI discovery (mpi4py)
  fills RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/PORT, unless MASTER_ADDR is exported to the ranks (mpirun_env:
  then mpirun's own OMPI_COMM_WORLD_* numbering and the given MASTER_ADDR/MASTER_PORT are used).
- `srun python -m pretrain.train` (one task per GPU): SLURM_PROCID/SLURM_STEP_NUM_TASKS/SLURM_LOCALID and the
  first host of the node list (slurm_env), whatever srun's --mpi plugin: PMI/PMIx variables that agree with the
  step's task ids come from srun itself, and no MPI is initialised for them (Debian's Open MPI aborts in MPI_Init
  under --mpi=pmi2).
- plain `python -m pretrain.train`: one rank; we fill the env for a world of one.
Backend: NCCL on GPUs, gloo on CPU (DeepSpeed's accelerator decides). The timeout bounds how long a rank waits for
a dead peer inside a collective: it is made the default of every group created later too (DeepSpeed's own,
pretrain/watchdog.py), and the watchdog ends a rank that still hangs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
_LAUNCHER_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
#: set by a launcher that starts the ranks itself (deepspeed/torchrun, mpirun's orted, MPICH's hydra), also when
#: it runs inside a Slurm allocation, where its ranks inherit the Slurm variables of the launcher's own step
_RANK_LAUNCHER_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALNRANKS")


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


LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
"""Ranks on this node, as torchrun, the deepspeed launcher, Open MPI and MPICH's hydra export it."""


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


def _local_size() -> int | None:
    for var in LOCAL_SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_hosts(nodelist: str) -> list[str]:
    """Host names of a Slurm node list (``node[001-004]``), expanded by ``scontrol show hostnames``."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(
            f"cannot expand SLURM_JOB_NODELIST={nodelist!r} with `scontrol show hostnames` ({e}); "
            "run under srun on a node with the Slurm client, or set MASTER_ADDR yourself"
        ) from e
    hosts = out.split()
    if not hosts:
        raise RuntimeError(f"`scontrol show hostnames {nodelist}` printed no host")
    return hosts


def slurm_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """torch.distributed's variables for a task started by ``srun`` (None outside a Slurm job step).

    Rank, world size and local rank are the step's task ids; the master is the first host of the step's node list
    (task 0 runs there with Slurm's block/cyclic distributions; with ``SLURM_HOSTFILE`` / ``--distribution=arbitrary``
    it is task 0's line of that file); the port is :func:`slurm_port` (job and step id) so jobs and concurrent
    steps sharing a node do not collide. Set MASTER_ADDR / MASTER_PORT to override (e.g. another network interface).
    Heterogeneous jobs are refused (their components have their own job ids and task numbering). Only a job *step*
    counts (``SLURM_STEP_NUM_TASKS``): a plain python inside an sbatch script is one process, whatever the allocation.
    Ranks numbered by another launcher running inside the job (RANK from deepspeed/torchrun, mpirun's
    OMPI_COMM_WORLD_RANK, hydra's MPI_LOCALNRANKS, PMI ranks that differ from the task id) are not srun's tasks:
    None then too.
    """
    env = os.environ if environ is None else environ
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return None
    if any(v in env for v in _RANK_LAUNCHER_VARS):
        return None  # another launcher inside the job numbered the ranks
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", None)):
        if rank_var in env and (
            env[rank_var] != env["SLURM_PROCID"]
            or (size_var and env.get(size_var, env["SLURM_STEP_NUM_TASKS"]) != env["SLURM_STEP_NUM_TASKS"])
        ):
            return None  # a PMI world other than this step's tasks (mpiexec's proxies started by srun)
    if "SLURM_HET_SIZE" in env:
        raise RuntimeError(
            f"this is a heterogeneous Slurm job (SLURM_HET_SIZE={env['SLURM_HET_SIZE']}): its components have their "
            "own job ids and task numbers, so the ranks cannot be derived from them; submit one homogeneous "
            "allocation (e.g. sbatch -N 4 --ntasks-per-node=8 --gpus-per-node=8)"
        )
    out = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
    }
    out["MASTER_ADDR"] = env.get("MASTER_ADDR") or _slurm_task0_host(env)
    out["MASTER_PORT"] = env.get("MASTER_PORT") or str(
        slurm_port(env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID"))
    )
    return out


def slurm_port(job_id: str | int, step_id: str | int | None = None) -> int:
    """The master port of a Slurm job step: ``10000 + (job_id * 16 + step_id) mod 20000``, i.e. within 10000-29999,
    below Linux's ephemeral range (32768-60999, where outgoing sockets could already hold it); consecutive jobs and
    up to 16 concurrent steps of one job get different ports. The batch step (no step id) counts as step 0;
    run_scripts/slurm/pretrain_deepspeed.sbatch computes the same number in shell."""
    step = int(step_id) if step_id not in (None, "", "batch", "extern") and str(step_id).isdigit() else 0
    return 10000 + (int(job_id) * 16 + step) % 20000


def _slurm_task0_host(env: dict[str, str]) -> str:
    """Host of task 0: the first line of SLURM_HOSTFILE when the step was laid out by it (--distribution=arbitrary),
    else the first host of the step's (or job's) node list."""
    hostfile = env.get("SLURM_HOSTFILE")
    if hostfile and env.get("SLURM_DISTRIBUTION", "arbitrary").startswith("arbitrary"):
        try:
            with open(hostfile) as f:
                first = next((ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")), None)
        except OSError as e:
            raise RuntimeError(
                f"SLURM_HOSTFILE={hostfile}: cannot read it ({e}); set MASTER_ADDR to task 0's host"
            ) from e
        if first:
            return first
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    return slurm_hosts(nodelist)[0] if nodelist else "127.0.0.1"


def mpirun_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """torch.distributed's variables for a rank started by Open MPI's mpirun when MASTER_ADDR is given (None
    otherwise: then DeepSpeed's MPI discovery runs, which takes rank 0's first `hostname -I` address and port 29500,
    overwriting any MASTER_ADDR/MASTER_PORT). mpirun numbers the ranks itself (OMPI_COMM_WORLD_RANK/SIZE/
    LOCAL_RANK), so with the master's address known no MPI call is needed; MASTER_PORT defaults to 29500.
    This is how ``-x MASTER_ADDR -x MASTER_PORT`` (e.g. from the Slurm templates) pick the interface and port."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "OMPI_COMM_WORLD_RANK" not in env or not env.get("MASTER_ADDR"):
        return None
    return {
        "RANK": env["OMPI_COMM_WORLD_RANK"],
        "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
        "LOCAL_RANK": env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        "MASTER_ADDR": env["MASTER_ADDR"],
        "MASTER_PORT": env.get("MASTER_PORT") or "29500",
    }


def init_distributed(timeout_minutes: float, local_rank: int | None = None) -> DistInfo:
    import deepspeed

    found = slurm_env() or mpirun_env()
    if found is not None:  # srun, or mpirun with a known master: the launcher's variables say who we are
        os.environ.update(found)
        if found["RANK"] == "0":  # a wrong master (stale MASTER_ADDR, wrong interface) shows up here, not as a hang
            print(
                f"[dist] {found['WORLD_SIZE']} rank(s); master {found['MASTER_ADDR']}:{found['MASTER_PORT']}",
                flush=True,
            )
    elif not any(v in os.environ for v in _LAUNCHER_VARS):
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )
    node_local = os.environ.get("LOCAL_RANK") or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
    if torch.cuda.is_available():
        check_ranks_fit_gpus(_local_size(), torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
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
