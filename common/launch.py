"""The one home of launching: which launcher started this process, and how to start N ranks under each launcher.

:data:`LAUNCHERS` is a table with one :class:`Launcher` entry per launcher. An entry says how a process started by
it knows where it sits (``detect``: from the environment variables the launcher sets, returning a
:class:`LaunchEnv`), which variables those are (``rank_env``, what the tests fake), and how to start ranks of a
Python program under it (``command``: the command line). Everything else asks this module:

- the trainer (pretrain/distributed.py): :func:`detect` fills torch.distributed's variables where the launcher did
  not (srun, mpirun with a given master, a plain ``python``), and picks the GPU;
- preprocessing (data_pipeline/coordination.py): :func:`detect` says whether the ranks meet through MPI or as the
  tasks of a Slurm step;
- the run scripts (run_scripts/common.sh ``launch``) through the CLI,
  ``python -m common.launch --launcher deepspeed --nproc 2 -- -m pretrain.train ARGS`` (runs the command, or prints
  it with ``--print``);
- the benchmarks (benchmarks/pretrain_compare) through :func:`command`.

Adding a launcher is one entry here, its case in tests/test_launch_module.py, and its line in docs/training.md.
Standard library only: the run scripts call the CLI before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from common.cli import HelpFormatter, add_flags, build, cli
from common.errors import USER_ERROR_EXIT, UserError, error_line, take_debug_flag
from common.keepalive import OMPI_VAR, PDSH_VAR, keepalive_env, keepalive_mpi_args

REPO = Path(__file__).resolve().parents[1]
"""The repository root: the ranks' PYTHONPATH under launchers that start ``python`` itself (mpirun, srun)."""

PYTHON = "python"
"""The launcher name of a process nobody launched: a world of one."""


def free_port() -> int:
    """A TCP port free on this host now (the kernel picks it): each single-node launch gets its own rendezvous port,
    so concurrent runs on one machine never meet on 29500 and hang."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------- detection
@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits, as its launcher told it through the environment."""

    launcher: str
    """The :data:`LAUNCHERS` entry that recognised the environment."""
    rank: int
    """Global rank."""
    world_size: int | None
    """Number of ranks (None: only MPI can tell, e.g. a PMIx world)."""
    local_rank: int | None
    """Rank on this node (None: the launcher does not say; DeepSpeed's MPI discovery finds it)."""
    local_world_size: int | None
    """Ranks on this node (None: the launcher does not say, e.g. srun, which may give each task its own GPU)."""
    master_addr: str | None
    """Host of rank 0's rendezvous (None: DeepSpeed's MPI discovery finds it, or it was not asked for)."""
    master_port: int | None
    """Port of the rendezvous (None as master_addr)."""
    fills_env: bool
    """True when the launcher did not export torch.distributed's variables (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT): the trainer sets them from this record (:meth:`torch_env`)."""
    mpi: bool = False
    """The ranks share an MPI COMM_WORLD (mpi4py can gather among them)."""
    launch_id: str | None = None
    """An id all ranks of this launch share and no other launch has (Slurm's ``JOB.STEP[.rRESTART]``): ranks may
    meet through a file named by it (preprocessing does)."""

    def torch_env(self) -> dict[str, str] | None:
        """torch.distributed's variables for this process (None while any of them is unknown: then DeepSpeed's MPI
        discovery must run)."""
        if None in (self.world_size, self.local_rank, self.master_addr, self.master_port):
            return None
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": str(self.master_addr),
            "MASTER_PORT": str(self.master_port),
        }


def _int(env: Mapping[str, str], var: str, default: int | None = None) -> int | None:
    value = env.get(var)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{var}={value!r} in the environment is not a number; unset it or fix the launcher") from None


def _master_kw(env: Mapping[str, str], default_port: int | None = None) -> dict[str, str | int | None]:
    """MASTER_ADDR / MASTER_PORT as exported to the ranks (``mpirun -x``, ``srun --export``), or None."""
    if not env.get("MASTER_ADDR"):
        return {"master_addr": None, "master_port": None}
    return {"master_addr": env["MASTER_ADDR"], "master_port": _int(env, "MASTER_PORT", default_port)}


def _master_env(place: LaunchEnv) -> dict[str, str]:
    return {"MASTER_ADDR": str(place.master_addr), "MASTER_PORT": str(place.master_port)}


@dataclass(frozen=True)
class RankVars:
    """The environment variables in which a launcher numbers its ranks (None: it does not say)."""

    rank: str
    world_size: str | None = None
    local_rank: str | None = None
    local_world_size: str | None = None

    def read(self, env: Mapping[str, str]) -> dict[str, int | None]:
        """The :class:`LaunchEnv` numbers found in ``env``."""
        return {f: _int(env, var) if var else None for f, var in vars(self).items()}

    def write(self, place: LaunchEnv) -> dict[str, str]:
        """The variables that put a rank at ``place``."""
        return {var: str(getattr(place, f)) for f, var in vars(self).items() if var}


TORCH_VARS = RankVars("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
"""torch.distributed's env:// variables, as torchrun exports them."""
DEEPSPEED_VARS = RankVars("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE")
OMPI_VARS = RankVars(
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"
)
SLURM_VARS = RankVars("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID")
"""A Slurm step's task ids (no ranks-per-node count: --gpus-per-task gives each task its own GPU, nothing to check)."""
HYDRA_VARS = RankVars("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _detect_torchrun(env: Mapping[str, str], master: bool) -> LaunchEnv | None:
    if "RANK" not in env or "TORCHELASTIC_RUN_ID" not in env:
        return None
    return LaunchEnv("torchrun", **TORCH_VARS.read(env), **_master_kw(env), fills_env=False)


def _detect_deepspeed(env: Mapping[str, str], master: bool) -> LaunchEnv | None:
    if "RANK" not in env or "CROSS_RANK" not in env:
        return None
    return LaunchEnv("deepspeed", **DEEPSPEED_VARS.read(env), **_master_kw(env), fills_env=False)


def _detect_env(env: Mapping[str, str], master: bool) -> LaunchEnv | None:
    """RANK set by something else (a hand-written ``env://`` world, a launcher we do not know)."""
    if "RANK" not in env:
        return None
    return LaunchEnv("env", **TORCH_VARS.read(env), **_master_kw(env), fills_env=False)


def _detect_mpirun(env: Mapping[str, str], master: bool) -> LaunchEnv | None:
    """Open MPI's mpirun numbers the ranks itself (OMPI_COMM_WORLD_*). With MASTER_ADDR exported to the ranks
    (``-x MASTER_ADDR -x MASTER_PORT``, e.g. by the Slurm templates) no MPI call is needed and MASTER_PORT defaults
    to 29500; without it DeepSpeed's MPI discovery takes rank 0's first ``hostname -I`` address and port 29500,
    overwriting any MASTER_PORT."""
    if "OMPI_COMM_WORLD_RANK" not in env:
        return None
    given = _master_kw(env, 29500)
    numbers = {**OMPI_VARS.read(env), "local_rank": _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0)}
    return LaunchEnv("mpirun", **numbers, **given, fills_env=given["master_addr"] is not None, mpi=True)


def _mpirun_rank_env(place: LaunchEnv) -> dict[str, str]:
    given = _master_env(place) if place.master_addr is not None else {}  # mpirun -x MASTER_ADDR=... -x MASTER_PORT=...
    return {**OMPI_VARS.write(place), **given}


#: set by a launcher that starts the ranks itself (deepspeed/torchrun, mpirun's orted, MPICH's hydra), also when
#: it runs inside a Slurm allocation, where its ranks inherit the Slurm variables of the launcher's own step
_RANK_LAUNCHER_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALNRANKS")


def _detect_srun(env: Mapping[str, str], master: bool) -> LaunchEnv | None:
    """A task of a Slurm job step (``srun python -m ...``, one task per GPU), whatever srun's ``--mpi`` plugin.

    Rank, world size and local rank are the step's task ids; the master is task 0's host (:func:`slurm_task0_host`)
    and the port :func:`slurm_port` (job and step id), so jobs and concurrent steps sharing a node do not collide;
    MASTER_ADDR / MASTER_PORT exported to the tasks override them (e.g. another network interface). Only a job
    *step* counts (``SLURM_STEP_NUM_TASKS``): a plain python inside an sbatch script is one process. Ranks numbered
    by another launcher running inside the job (deepspeed/torchrun's RANK, mpirun's OMPI_COMM_WORLD_RANK, hydra's
    MPI_LOCALNRANKS, PMI ranks that differ from the task id: mpiexec's proxies started by srun) are not srun's
    tasks. PMI/PMIx variables that agree with the task ids come from srun itself (--mpi=pmi2/pmix): no MPI is
    initialised for them (Debian's Open MPI aborts in MPI_Init under --mpi=pmi2). Heterogeneous jobs are refused."""
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return None
    if any(v in env for v in _RANK_LAUNCHER_VARS):
        return None
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", None)):
        if rank_var in env and (
            env[rank_var] != env["SLURM_PROCID"]
            or (size_var and env.get(size_var, env["SLURM_STEP_NUM_TASKS"]) != env["SLURM_STEP_NUM_TASKS"])
        ):
            return None
    if "SLURM_HET_SIZE" in env:
        raise UserError(
            f"this is a heterogeneous Slurm job (SLURM_HET_SIZE={env['SLURM_HET_SIZE']}): its components have their "
            "own job ids and task numbers, so the ranks cannot be derived from them; submit one homogeneous "
            "allocation (e.g. sbatch -N 4 --ntasks-per-node=8 --gpus-per-node=8)"
        )
    addr, port = _master_kw(env).values()
    if master:
        addr = addr or slurm_task0_host(env)
        port = port or slurm_port(env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID"))
    numbers = {**SLURM_VARS.read(env), "local_rank": _int(env, "SLURM_LOCALID", 0)}
    return LaunchEnv(
        "srun", **numbers, master_addr=addr, master_port=port, fills_env=True, launch_id=slurm_step_id(env)
    )


def _srun_rank_env(place: LaunchEnv) -> dict[str, str]:
    # srun --export=ALL,MASTER_ADDR=...,MASTER_PORT=...
    return {**SLURM_VARS.write(place), "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", **_master_env(place)}


def slurm_step_id(environ: Mapping[str, str] | None = None) -> str:
    """``JOB.STEP[.rRESTART]`` of this Slurm job step (a requeued job keeps its id and step numbers)."""
    env = os.environ if environ is None else environ
    step = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', env.get('SLURM_STEPID', '0'))}"
    if env.get("SLURM_RESTART_COUNT", "0") not in ("", "0"):
        step += f".r{env['SLURM_RESTART_COUNT']}"
    return step


def slurm_port(job_id: str | int, step_id: str | int | None = None) -> int:
    """The master port of a Slurm job step: ``10000 + (job_id * 16 + step_id) mod 20000``, i.e. within 10000-29999,
    below Linux's ephemeral range (32768-60999, where outgoing sockets could already hold it); consecutive jobs and
    up to 16 concurrent steps of one job get different ports. The batch step (no step id) counts as step 0;
    run_scripts/slurm/pretrain_deepspeed.sbatch computes the same number in shell."""
    step = int(step_id) if step_id not in (None, "", "batch", "extern") and str(step_id).isdigit() else 0
    return 10000 + (int(job_id) * 16 + step) % 20000


def slurm_hosts(nodelist: str) -> list[str]:
    """Host names of a Slurm node list (``node[001-004]``), expanded by ``scontrol show hostnames``."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise UserError(
            f"cannot expand SLURM_JOB_NODELIST={nodelist!r} with `scontrol show hostnames` ({e}); "
            "run under srun on a node with the Slurm client, or set MASTER_ADDR yourself"
        ) from e
    hosts = out.split()
    if not hosts:
        raise UserError(f"`scontrol show hostnames {nodelist}` printed no host; set MASTER_ADDR yourself")
    return hosts


def slurm_task0_host(env: Mapping[str, str]) -> str:
    """Host of task 0: the first line of SLURM_HOSTFILE when the step was laid out by it (--distribution=arbitrary),
    else the first host of the step's (or job's) node list (task 0 runs there with the block/cyclic layouts)."""
    hostfile = env.get("SLURM_HOSTFILE")
    if hostfile and env.get("SLURM_DISTRIBUTION", "arbitrary").startswith("arbitrary"):
        try:
            with open(hostfile) as f:
                first = next((ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")), None)
        except OSError as e:
            raise UserError(f"SLURM_HOSTFILE={hostfile}: cannot read it ({e}); set MASTER_ADDR to task 0's host") from e
        if first:
            return first
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    return slurm_hosts(nodelist)[0] if nodelist else "127.0.0.1"


#: what MPICH's hydra (mpiexec) and any PMI/PMIx server export to the ranks
_PMI_VARS = ("MPI_LOCALNRANKS", "PMI_RANK", "PMI_SIZE", "PMIX_RANK")


def _detect_mpiexec(env: Mapping[str, str], master: bool) -> LaunchEnv | None:
    """MPICH's hydra (``mpiexec``) or another PMI/PMIx world outside an srun step: MPI (mpi4py) tells the rest;
    DeepSpeed's MPI discovery finds the master."""
    if not any(v in env for v in _PMI_VARS):
        return None
    numbers = {**HYDRA_VARS.read(env), "rank": _int(env, "PMI_RANK", _int(env, "PMIX_RANK", 0))}
    return LaunchEnv("mpiexec", **numbers, master_addr=None, master_port=None, fills_env=False, mpi=True)


def _detect_python(env: Mapping[str, str], master: bool) -> LaunchEnv:
    """Nobody launched us: a world of one, on a free port of this host."""
    return LaunchEnv(PYTHON, 0, 1, 0, 1, "127.0.0.1" if master else None, free_port() if master else None, True)


# ----------------------------------------------------------------------------------------------- command lines
@dataclass
class LaunchRequest:
    """How to start the ranks: the flags of ``python -m common.launch`` (the program follows ``--``)."""

    launcher: str = field(default="deepspeed", metadata=cli(choices=lambda: command_launchers()))
    """Launcher to start the ranks with (see docs/training.md, The launch paths)."""
    nproc: int | None = None
    """Ranks per node (GPUs, or CPU ranks on gloo); srun (the allocation's tasks decide) and python (one process)
    ignore it."""
    master_port: int | None = None
    """Rendezvous port. Default: for single-node deepspeed $MASTER_PORT, else a free one; the launcher's own
    default elsewhere."""
    hostfile: str | None = None
    """DeepSpeed hostfile of the hostfile launchers (format: run_scripts/hostfile.example)."""
    launcher_args: str | None = None
    """Extra launcher flags, one shell-quoted string (--launcher-args='--mca btl tcp,self'). Default: the
    launcher's environment knob (DS_ARGS, MPI_ARGS, TORCHRUN_ARGS, SRUN_ARGS; see docs/training.md)."""
    python: str = field(default=sys.executable)
    """Interpreter of the ranks; deepspeed and torchrun are taken from its directory."""
    print: bool = False
    """Print the command line (shell-quoted) instead of running it."""


def _script(program: Sequence[str], module_flag: str, cwd: Path) -> list[str]:
    """``program`` (python's argv: ``-m MODULE ARGS`` or ``SCRIPT ARGS``) for a launcher that starts a script
    itself (deepspeed, torchrun). A module becomes its file when it has one under ``cwd``, so a rank's command line
    reads ``pretrain/train.py --local_rank=N`` as before (the Slurm template's signal forwarding matches it);
    otherwise the launcher's module flag."""
    if program and program[0] == "-m":
        if len(program) < 2:
            raise UserError("-m needs a module name after it (e.g. -- -m pretrain.train ARGS)")
        path = Path(*program[1].split(".")).with_suffix(".py")
        if (cwd / path).is_file():
            return [str(path), *program[2:]]
        return [module_flag, *program[1:]]
    return list(program)


def _knob(req: LaunchRequest, env: Mapping[str, str], var: str, default: str = "") -> list[str]:
    """Extra launcher flags: --launcher-args, else the environment knob ``var`` (when set and not empty), else
    ``default``; split as a shell would."""
    text = req.launcher_args if req.launcher_args is not None else (env.get(var) or default)
    return shlex.split(text)


def _nproc(req: LaunchRequest) -> str:
    if req.nproc is None or req.nproc < 1:
        raise UserError(f"--launcher {req.launcher} needs --nproc N (ranks per node), got {req.nproc}")
    return str(req.nproc)


def _hostfile(req: LaunchRequest) -> str:
    if not req.hostfile:
        raise UserError(f"--launcher {req.launcher} needs --hostfile FILE (format: run_scripts/hostfile.example)")
    return req.hostfile


def _bin(req: LaunchRequest, name: str) -> str:
    return str(Path(req.python).parent / name)


def _port(req: LaunchRequest) -> list[str]:
    return [] if req.master_port is None else ["--master_port", str(req.master_port)]


def _deepspeed_cmd(req: LaunchRequest, program: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    # one node: MASTER_PORT, else a free port (two runs on one machine never share DeepSpeed's default 29500)
    port = req.master_port if req.master_port is not None else _int(env, "MASTER_PORT") or free_port()
    return [_bin(req, "deepspeed"), "--num_gpus", _nproc(req), "--master_port", str(port)] + (
        shlex.split(req.launcher_args or "") + _script(program, "--module", cwd)
    )


def _hostfile_cmd(req: LaunchRequest, program: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    return [_bin(req, "deepspeed"), "--hostfile", _hostfile(req), *_port(req), *_knob(req, env, "DS_ARGS")] + (
        _script(program, "--module", cwd)
    )


def _hostfile_openmpi_cmd(req: LaunchRequest, program: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    mpi = shlex.join(keepalive_mpi_args(shlex.split(env.get("MPI_ARGS") or "--allow-run-as-root")))
    return (
        _hostfile_cmd(req, [], env, cwd)
        + ["--launcher", "openmpi", "--launcher_args", mpi]
        + (_script(program, "--module", cwd))
    )


def _mpirun_cmd(req: LaunchRequest, program: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    mpi = keepalive_mpi_args(_knob(req, env, "MPI_ARGS", "--allow-run-as-root --oversubscribe"))
    return ["mpirun", *mpi, "-np", _nproc(req)] + (["-x", f"PYTHONPATH={REPO}", req.python, *program])


def _torchrun_cmd(req: LaunchRequest, program: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    return [_bin(req, "torchrun"), "--nproc_per_node", _nproc(req), *_port(req)] + (
        _knob(req, env, "TORCHRUN_ARGS") + _script(program, "-m", cwd)
    )


def _srun_cmd(req: LaunchRequest, program: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    return ["srun", *_knob(req, env, "SRUN_ARGS", "--kill-on-bad-exit=0"), f"--export=ALL,PYTHONPATH={REPO}"] + (
        [req.python, *program]
    )


def _python_cmd(req: LaunchRequest, program: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    return [req.python, *program]  # one process, whatever --nproc says (as srun, where the tasks decide)


# --------------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Launcher:
    """One launcher: how its ranks are recognised and how it is started."""

    name: str
    """LAUNCHER / --launcher name."""
    doc: str
    """One line for the docs and --help."""
    detect: Callable[[Mapping[str, str], bool], LaunchEnv | None] | None = None
    """The rank's view: its :class:`LaunchEnv` from the environment (second argument: resolve the master), or None
    when this launcher did not start the process. None for entries whose ranks another entry recognises."""
    rank_env: Callable[[LaunchEnv], dict[str, str]] | None = None
    """The variables this launcher exports to the rank at a given place (the tests fake a launch with it)."""
    command: Callable[[LaunchRequest, Sequence[str], Mapping[str, str], Path], list[str]] | None = None
    """The command line that starts the program's ranks (request, python argv of the program, environment knobs,
    working directory). None for launchers we only recognise."""
    ssh_args_var: str | None = None
    """For a launcher that reaches other hosts over ssh (pdsh, mpirun's rsh agent): the environment variable whose
    arguments it adds to every ssh. The command gets ssh keep-alives there (common/keepalive.py), so a host that
    stops answering ends the command instead of leaving it waiting forever."""


LAUNCHERS: dict[str, Launcher] = {
    e.name: e
    for e in (  # detection tries the entries in this order: a launcher inside another's job wins (see srun)
        Launcher(
            "torchrun",
            "torchrun --nproc_per_node N [TORCHRUN_ARGS] SCRIPT: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
            "MASTER_* and TORCHELASTIC_RUN_ID exported",
            _detect_torchrun,
            lambda p: {**TORCH_VARS.write(p), **_master_env(p), "TORCHELASTIC_RUN_ID": "1"},
            _torchrun_cmd,
        ),
        Launcher(
            "deepspeed",
            "deepspeed --num_gpus N --master_port FREE SCRIPT on one node: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, "
            "CROSS_RANK and MASTER_* exported (also the ranks of deepspeed --hostfile with pdsh)",
            _detect_deepspeed,
            lambda p: {**DEEPSPEED_VARS.write(p), **_master_env(p), "CROSS_RANK": "0"},
            _deepspeed_cmd,
        ),
        Launcher(
            "hostfile",
            "deepspeed --hostfile HOSTFILE [DS_ARGS] SCRIPT: pdsh over ssh to every host of the hostfile",
            command=_hostfile_cmd,
            ssh_args_var=PDSH_VAR,
        ),
        Launcher(
            "hostfile-openmpi",
            "deepspeed --hostfile HOSTFILE [DS_ARGS] --launcher openmpi --launcher_args MPI_ARGS SCRIPT: mpirun "
            "starts the ranks (recognised as mpirun's)",
            command=_hostfile_openmpi_cmd,
            ssh_args_var=OMPI_VAR,
        ),
        Launcher(
            "env",
            "RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* set by hand or by a launcher not listed here (torch's env://)",
            _detect_env,
            lambda p: {**TORCH_VARS.write(p), **_master_env(p)},
        ),
        Launcher(
            "mpirun",
            "mpirun [MPI_ARGS] -np N -x PYTHONPATH python -m MODULE: OMPI_COMM_WORLD_* exported; the master from "
            "-x MASTER_ADDR/MASTER_PORT, else DeepSpeed's MPI discovery",
            _detect_mpirun,
            _mpirun_rank_env,
            _mpirun_cmd,
            ssh_args_var=OMPI_VAR,
        ),
        Launcher(
            "srun",
            "srun [SRUN_ARGS] --export=ALL,PYTHONPATH python -m MODULE inside a Slurm allocation, one task per rank: "
            "SLURM_PROCID/SLURM_STEP_NUM_TASKS/SLURM_LOCALID; master = task 0's host, port from job and step id",
            _detect_srun,
            _srun_rank_env,
            _srun_cmd,
        ),
        Launcher(
            "mpiexec",
            "MPICH's hydra or another PMI/PMIx world (PMI_RANK, PMI_SIZE, MPI_LOCALNRANKS): MPI tells the rest",
            _detect_mpiexec,
            HYDRA_VARS.write,
        ),
        Launcher(
            PYTHON, "python -m MODULE: one process, a world of one on a free port", _detect_python, None, _python_cmd
        ),
    )
}
"""Every launcher we recognise or start, by name (run_scripts/common.sh's LAUNCHER, --launcher)."""


def command_launchers() -> list[str]:
    """The launchers :func:`command` can start."""
    return [name for name, e in LAUNCHERS.items() if e.command is not None]


def detect(environ: Mapping[str, str] | None = None, *, master: bool = True) -> LaunchEnv:
    """Where this process sits: the first :data:`LAUNCHERS` entry that recognises the environment (default
    ``os.environ``), else a world of one. ``master=False`` skips finding the rendezvous host and port (no
    ``scontrol`` call, no port taken) for callers that meet another way (preprocessing)."""
    env = os.environ if environ is None else environ
    for entry in LAUNCHERS.values():
        if entry.detect is not None:
            found = entry.detect(env, master)
            if found is not None:
                return found
    raise AssertionError("the python entry recognises every environment")


def command(
    req: LaunchRequest,
    program: Sequence[str],
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> list[str]:
    """The command line that starts ``program`` (python's argv: ``-m MODULE ARGS`` or ``SCRIPT ARGS``) under
    ``req.launcher``, to be run from ``cwd`` (default: the current directory); ``environ`` (default
    ``os.environ``) holds the launcher knobs (DS_ARGS, MPI_ARGS, TORCHRUN_ARGS, SRUN_ARGS)."""
    entry = LAUNCHERS.get(req.launcher)
    if entry is None or entry.command is None:
        raise UserError(f"launcher {req.launcher!r}: use {', '.join(command_launchers())}")
    if not program:
        raise UserError("no program to launch: put it after --, e.g. -- -m pretrain.train ARGS")
    env = os.environ if environ is None else environ
    return entry.command(req, list(program), env, Path.cwd() if cwd is None else Path(cwd))


def command_env(launcher: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to the environment of ``launcher``'s command (from ``environ``, default
    ``os.environ``): ssh keep-alives for launchers that reach hosts over ssh (:func:`common.keepalive.keepalive_env`:
    what the user set there is kept, only missing options are appended), nothing for the others. Only the CLI
    applies them; a caller of :func:`command` adds them to the environment it runs the command with."""
    entry = LAUNCHERS.get(launcher)
    return keepalive_env(environ, [entry.ssh_args_var]) if entry is not None and entry.ssh_args_var else {}


# ------------------------------------------------------------------------------------------------------- the CLI
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m common.launch",
        description="Start the ranks of a Python program under a launcher: "
        "python -m common.launch --launcher deepspeed --nproc 2 -- -m pretrain.train ARGS.\n"
        "The launcher's exit code is ours. Launchers:\n"
        + "\n".join(f"  {e.name}: {e.doc}" for e in LAUNCHERS.values() if e.command is not None),
        formatter_class=HelpFormatter,
    )
    add_flags(p, LaunchRequest)
    return p


def _main(args: list[str], program: list[str]) -> int:
    req = build(LaunchRequest, parser().parse_args(args))
    cmd = command(req, program)
    env = command_env(req.launcher)
    if req.print:  # the variables too, as a shell takes them: the printed line behaves as this command does
        print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(cmd)]), flush=True)
        return 0
    os.environ.update(env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(cmd[0], cmd)  # the launcher takes our place: its signals and exit code are the caller's
    except OSError as e:  # as the shell says it, with its code
        why = "command not found" if isinstance(e, FileNotFoundError) else e.strerror
        print(f"common.launch: {cmd[0]}: {why} (--launcher {req.launcher})", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126


def main(argv: Sequence[str] | None = None) -> int:
    """Flags, then ``--``, then the program as python would take it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, program = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    try:  # common/errors.py's rule (one line, exit 2) by hand: common/error_exit.py imports this module
        return _main(take_debug_flag(own), program)
    except UserError as e:
        print(error_line("common.launch", str(e)), file=sys.stderr, flush=True)
        return USER_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
