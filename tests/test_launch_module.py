"""common/launch.py, the one home of launching: every launcher of its table is recognised from the environment it
gives its ranks (also inside another launcher's Slurm job), its command line is the one the run scripts and the
benchmarks used before, the CLI runs it with the launcher's exit code, and run_scripts/common.sh goes through it.
Plus the rank-discovery rules the trainer and preprocessing rely on (srun's master and port, mpirun's master, the
visible GPU under srun --gpus-per-task). Adding a launcher: its entry in common/launch.py, its case in COMMANDS
below (test_every_command_launcher_has_its_case fails until then), and its line in docs/training.md."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from common import launch as L
from common.errors import UserError
from common.keepalive import OMPI_VAR, SSH_ARG_VARS, given_options, keepalive_mpi_args, with_keepalive
from data_pipeline import coordination

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

# ----------------------------------------------------------------------------------------------------- detection
#: rank 3 of 4, second rank of its node, as a launcher tells it
PLACE = dict(rank=3, world_size=4, local_rank=1, local_world_size=2, master_addr="n1", master_port=12345)
#: what a launcher running inside a Slurm step (one task per node: the launcher's own) leaves to its ranks
LAUNCHER_STEP = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "9"}
DETECTED = [name for name, e in L.LAUNCHERS.items() if e.detect is not None]


def _place(name: str) -> L.LaunchEnv:
    if name == L.PYTHON:
        return L.LaunchEnv(name, 0, 1, 0, 1, "127.0.0.1", 0, fills_env=True)
    return L.LaunchEnv(name, **PLACE, fills_env=False)


def _rank_env(name: str) -> dict[str, str]:
    entry = L.LAUNCHERS[name]
    return entry.rank_env(_place(name)) if entry.rank_env else {}


@pytest.mark.parametrize("name", DETECTED)
def test_each_launcher_is_recognised_from_the_variables_it_sets(name):
    got = L.detect(_rank_env(name))
    want = _place(name)
    assert got.launcher == name
    assert (got.rank, got.world_size) == (want.rank, want.world_size)
    for f in ("local_rank", "local_world_size", "master_addr"):  # None: this launcher does not say
        assert getattr(got, f) in (getattr(want, f), None), f
    if name == L.PYTHON:  # nobody launched it: a world of one on a port free now
        assert got.torch_env() == {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(got.master_port),
        }
        assert 0 < got.master_port < 65536
    elif got.torch_env() is not None:  # what torch.distributed gets: the launcher's numbers
        assert got.torch_env() == {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "12345",
        }
    if got.fills_env:  # the trainer sets torch.distributed's variables from it: all must be known
        assert got.torch_env() is not None


@pytest.mark.parametrize("name", [n for n in DETECTED if n not in ("srun", L.PYTHON)])
def test_a_launcher_inside_a_slurm_job_is_recognised_not_the_step(name):
    """deepspeed/torchrun/mpirun/hydra started by sbatch or srun: their ranks inherit the Slurm variables of the
    launcher's own step, but the launcher numbered them."""
    got = L.detect({**LAUNCHER_STEP, **_rank_env(name)})
    assert (got.launcher, got.rank, got.world_size) == (name, 3, 4)


def test_srun_with_pmi_plugins_and_other_launchers():
    step = {**LAUNCHER_STEP, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1"}
    step.update(SLURM_JOB_ID="77", SLURM_STEP_ID="0", MASTER_ADDR="n1")
    assert L.detect(step).torch_env()["RANK"] == "1"
    assert L.detect({**step, "PMI_RANK": "1", "PMI_SIZE": "2"}).launcher == "srun"  # srun --mpi=pmi2
    assert L.detect({**step, "PMIX_RANK": "1"}).launcher == "srun"  # srun --mpi=pmix
    assert L.detect({**step, "PMI_RANK": "5", "PMI_SIZE": "8"}).launcher == "mpiexec"  # hydra's proxy step
    for var, by in (("RANK", "env"), ("OMPI_COMM_WORLD_RANK", "mpirun"), ("MPI_LOCALNRANKS", "mpiexec")):
        assert L.detect({**step, var: "3"}).launcher == by
    assert L.detect(step).launch_id == "77.0"
    assert L.detect({**step, "SLURM_RESTART_COUNT": "2"}).launch_id == "77.0.r2"  # a requeued job's step
    batch_shell = {k: v for k, v in step.items() if k != "SLURM_STEP_NUM_TASKS"}  # sbatch script, not srun
    assert L.detect(batch_shell).launcher == L.PYTHON


def test_srun_master_is_task0s_host_and_the_port_comes_from_job_and_step(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\n[ \"$1 $2 $3\" = 'show hostnames gpu[007-008]' ] && printf 'gpu007\\ngpu008\\n'\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    step = {
        "SLURM_PROCID": "5",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NODELIST": "gpu[007-008]",
        "SLURM_STEP_NODELIST": "gpu[007-008]",
    }
    assert L.detect(step).torch_env() == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu007",
        "MASTER_PORT": str(10000 + (123456 * 16) % 20000),
    }
    # preprocessing meets through a file: no scontrol call, no port
    assert (L.detect(step, master=False).master_addr, L.detect(step, master=False).master_port) == (None, None)
    # concurrent steps of one job get different ports, all below Linux's ephemeral range
    assert L.detect({**step, "SLURM_STEP_ID": "1"}).master_port == 10000 + (123456 * 16 + 1) % 20000
    ports = {L.slurm_port(job, st) for job in range(1000, 1100) for st in range(16)}
    assert len(ports) == 1600 and max(ports) < 32768 and min(ports) >= 10000
    assert L.slurm_port(123456, "batch") == L.slurm_port(123456, None) == L.slurm_port(123456, 0)
    # --distribution=arbitrary: task 0 runs on the first line of SLURM_HOSTFILE, not on the first node of the list
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu008\ngpu008\ngpu007\n")
    arbitrary = {**step, "SLURM_HOSTFILE": str(hostfile), "SLURM_DISTRIBUTION": "arbitrary"}
    assert L.detect(arbitrary).master_addr == "gpu008"
    with pytest.raises(UserError, match="heterogeneous Slurm job"):
        L.detect({**step, "SLURM_HET_SIZE": "2"})
    assert L.detect({**step, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"}).torch_env()["MASTER_ADDR"] == (
        "10.0.0.7"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "none"))  # no Slurm client: one line saying what to do
    with pytest.raises(UserError, match="set MASTER_ADDR yourself"):
        L.detect(step)


def test_mpirun_uses_a_given_master_else_mpi_discovery():
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    alone = L.detect(ompi)
    assert (alone.launcher, alone.fills_env, alone.torch_env()) == ("mpirun", False, None)  # DeepSpeed's discovery
    given = L.detect({**ompi, "MASTER_ADDR": "n1", "MASTER_PORT": "10077"})
    assert given.fills_env and given.torch_env() == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "10077",
    }
    assert L.detect({**ompi, "MASTER_ADDR": "n1"}).master_port == 29500


def test_a_malformed_launcher_variable_is_one_clear_error():
    with pytest.raises(UserError, match="OMPI_COMM_WORLD_SIZE='four'"):
        L.detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "four"})


def test_preprocessing_worlds_follow_the_detection(tmp_path, monkeypatch):
    prefix = str(tmp_path / "out")
    step = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
    assert coordination.detect(prefix, {}) is None
    assert coordination.detect(prefix, {**step, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is None
    monkeypatch.setattr(coordination, "TorchWorld", lambda *a: ("torch", *a))  # records, joins no group
    # srun --mpi=pmi2 sets PMI variables: still the step's own group, no MPI_Init
    assert coordination.detect(prefix, {**step, "SLURM_PROCID": "0", "PMI_SIZE": "2"}) == (
        "torch",
        f"{prefix}.rendezvous-77.0",
        0,
        2,
    )
    # ranks numbered by torchrun/deepspeed would each write the whole output: refused, naming the launcher
    with pytest.raises(UserError, match="started by torchrun"):
        coordination.detect(prefix, _rank_env("torchrun"))
    assert coordination.detect(prefix, {**_rank_env("torchrun"), "WORLD_SIZE": "1"}) is None


@pytest.mark.parametrize(
    "env, visible, want",
    [
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "3"}, 1, "0"),  # srun --gpus-per-task=1
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "3"}, 4, "3"),  # srun --gpus-per-node=4
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, 1, "0"),  # two ranks, one visible GPU each
    ],
)
def test_local_rank_is_a_visible_gpu_before_deepspeed_initialises(monkeypatch, env, visible, want):
    """DeepSpeed passes device_id=cuda:LOCAL_RANK to init_process_group: LOCAL_RANK must already index a GPU the
    task can see (faked CUDA on CPU; DeepSpeed's init is replaced by a recorder)."""
    import deepspeed
    import torch

    from pretrain import distributed as D

    for var in list(os.environ):  # the launch variables of whatever runs pytest do not count
        if var.startswith(("SLURM_", "OMPI_", "PMI", "MPI_", "TORCHELASTIC_")) or var in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "CROSS_RANK",
        ):
            monkeypatch.delenv(var)
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12345", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "7"}
    if "SLURM_PROCID" in env:
        base.update(SLURM_STEP_NUM_TASKS=env["SLURM_NTASKS"], SLURM_STEP_NODELIST="n1", SLURM_NODEID="0")
    for k, v in {**base, **env}.items():
        monkeypatch.setenv(k, v)
    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: seen.setdefault("set_device", i))

    class Stop(Exception):
        pass

    def fake_init(**kwargs):
        seen["LOCAL_RANK"] = os.environ["LOCAL_RANK"]
        seen["RANK"] = os.environ["RANK"]
        raise Stop

    monkeypatch.setattr(deepspeed, "init_distributed", fake_init)
    saved = dict(os.environ)  # init_distributed writes RANK/WORLD_SIZE/... itself: none may leak to later tests
    try:
        with pytest.raises(Stop):
            D.init_distributed(1.0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert seen == {"set_device": int(want), "LOCAL_RANK": want, "RANK": env.get("RANK", env.get("SLURM_PROCID"))}


# ------------------------------------------------------------------------------------------------ command lines
BIN = "/venv/bin"
#: what run_scripts/common.sh's launch() and benchmarks/pretrain_compare/launch.py ran before the table: the
#: request is (nproc 2, hostfile hf, master port as given, no knob set); 'PORT' is a free port
COMMANDS = {
    "deepspeed": [f"{BIN}/deepspeed", "--num_gpus", "2", "--master_port", "PORT", "pretrain/train.py"],
    "hostfile": [f"{BIN}/deepspeed", "--hostfile", "hf", "pretrain/train.py"],
    "hostfile-openmpi": [
        f"{BIN}/deepspeed",
        "--hostfile",
        "hf",
        "--launcher",
        "openmpi",
        "--launcher_args",
        "--allow-run-as-root",
        "pretrain/train.py",
    ],
    "mpirun": ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", f"PYTHONPATH={REPO}"]
    + [f"{BIN}/python", "-m", "pretrain.train"],
    "torchrun": [f"{BIN}/torchrun", "--nproc_per_node", "2", "pretrain/train.py"],
    "srun": ["srun", "--kill-on-bad-exit=0", f"--export=ALL,PYTHONPATH={REPO}"]
    + [f"{BIN}/python", "-m", "pretrain.train"],
    L.PYTHON: [f"{BIN}/python", "-m", "pretrain.train"],
}
PROGRAM = ["-m", "pretrain.train"]


def _req(launcher: str, **kw) -> L.LaunchRequest:
    nproc = None if launcher == L.PYTHON else 2
    return L.LaunchRequest(**{"launcher": launcher, "nproc": nproc, "hostfile": "hf", "python": f"{BIN}/python", **kw})


def test_every_command_launcher_has_its_case():
    assert sorted(COMMANDS) == sorted(L.command_launchers())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_line_per_launcher(name):
    got = L.command(_req(name), [*PROGRAM, "--x", "a b"], {}, cwd=REPO)
    want = COMMANDS[name] + ["--x", "a b"]
    if "PORT" in want:  # deepspeed on one node: its own free port each launch
        port = got[want.index("PORT")]
        assert port.isdigit() and 0 < int(port) < 65536
        want = [port if w == "PORT" else w for w in want]
    assert got == want
    if "--master_port" in got:  # a given port is used
        fixed = L.command(_req(name, master_port=23456), PROGRAM, {}, cwd=REPO)
        assert fixed[fixed.index("--master_port") + 1] == "23456"


def test_knobs_and_overrides():
    env = {
        "DS_ARGS": "--force_multi --master_addr 'n 1'",
        "MPI_ARGS": "-x A --mca btl tcp",
        "SRUN_ARGS": "--kill-on-bad-exit=1 -c 4",
        "TORCHRUN_ARGS": "--nnodes 2",
        "MASTER_PORT": "23456",
    }
    cmd = {n: L.command(_req(n), PROGRAM, env, cwd=REPO) for n in COMMANDS}
    assert cmd["hostfile"] == [f"{BIN}/deepspeed", "--hostfile", "hf", "--force_multi", "--master_addr", "n 1"] + [
        "pretrain/train.py"
    ]
    assert cmd["hostfile-openmpi"][-4:] == ["openmpi", "--launcher_args", "-x A --mca btl tcp", "pretrain/train.py"]
    assert cmd["mpirun"][:7] == ["mpirun", "-x", "A", "--mca", "btl", "tcp", "-np"]
    assert cmd["srun"][:5] == ["srun", "--kill-on-bad-exit=1", "-c", "4", f"--export=ALL,PYTHONPATH={REPO}"]
    assert cmd["torchrun"] == [f"{BIN}/torchrun", "--nproc_per_node", "2", "--nnodes", "2", "pretrain/train.py"]
    assert cmd["deepspeed"][3:5] == ["--master_port", "23456"]  # LAUNCHER=deepspeed's MASTER_PORT
    # --launcher-args replaces the knob; an empty one means none
    srun = L.command(_req("srun", launcher_args="--mpi=pmix"), PROGRAM, env, cwd=REPO)
    assert srun[:2] == ["srun", "--mpi=pmix"] and srun[2].startswith("--export=")
    assert L.command(_req("torchrun", launcher_args=""), PROGRAM, env, cwd=REPO)[3] == "pretrain/train.py"


def test_scripts_and_modules_without_a_file(tmp_path):
    """A module with a file under the working directory starts as that file (its rank's argv reads
    pretrain/train.py --local_rank=N, which the Slurm template matches); one without, through the module flag."""
    assert L.command(_req("deepspeed", master_port=1), ["-m", "json.tool"], {}, cwd=tmp_path)[-2:] == [
        "--module",
        "json.tool",
    ]
    assert L.command(_req("torchrun"), ["-m", "json.tool", "-h"], {}, cwd=tmp_path)[-3:] == ["-m", "json.tool", "-h"]
    assert L.command(_req("torchrun"), ["x.py", "-h"], {}, cwd=tmp_path)[-2:] == ["x.py", "-h"]


@pytest.mark.parametrize(
    "req, program, match",
    [
        (dict(launcher="mpirun", nproc=None), PROGRAM, "needs --nproc N"),
        (dict(launcher="hostfile", hostfile=None), PROGRAM, "needs --hostfile FILE"),
        (dict(launcher="mpiexec"), PROGRAM, "launcher 'mpiexec': use"),  # recognised, not started by us
        (dict(launcher="deepspeed"), [], "put it after --"),
    ],
)
def test_bad_requests_are_one_clear_error(req, program, match):
    with pytest.raises(UserError, match=match):
        L.command(_req(req.pop("launcher"), **req), program, {}, cwd=REPO)


# ------------------------------------------------------------------------------------------------------- the CLI
def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "common.launch", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_the_table_command():
    p = _cli("--launcher", "torchrun", "--nproc", "2", "--master-port", "23456", "--print", "--", *PROGRAM, "--debug")
    assert p.returncode == 0, p.stderr
    want = L.command(L.LaunchRequest("torchrun", 2, 23456), [*PROGRAM, "--debug"], {}, cwd=REPO)
    assert shlex.split(p.stdout) == want  # --debug after -- is the program's


def test_cli_runs_the_command_with_its_exit_code_and_arguments():
    code = "import sys; print(sys.argv[1:]); sys.exit(3)"
    p = _cli("--launcher", L.PYTHON, "--", "-c", code, "--debug", "a b")
    assert (p.returncode, p.stdout.strip()) == (3, "['--debug', 'a b']"), p.stderr


def test_cli_errors():
    p = _cli("--launcher", "nope", "--", *PROGRAM)
    assert p.returncode == 2 and "invalid choice: 'nope'" in p.stderr
    p = _cli("--launcher", "hostfile", "--", *PROGRAM)
    assert p.returncode == 2 and "common.launch: error: --launcher hostfile needs --hostfile FILE" in p.stderr
    p = _cli("--launcher", "srun", "--", *PROGRAM, env={"PATH": "/nonexistent"})  # as the shell: 127
    assert p.returncode == 127 and "srun: command not found" in p.stderr


# ------------------------------------------------------------------------------------------- run_scripts/common.sh
FAKE = """#!/bin/sh
# records how it was started; the python wrapper runs the real one except for the trainer
if [ "$(basename "$0")" = python ] && [ "$2" != pretrain.train ]; then exec {py} "$@"; fi
printf '%s\\n' "$0" "$@" > "$RECORD"
printf '%s\\n' "${{PDSH_SSH_ARGS_APPEND-unset}}" "${{OMPI_MCA_plm_rsh_args-unset}}" > "$RECORD.env"
exit "${{FAKE_RC:-0}}"
"""


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_common_sh_launches_through_the_table(tmp_path, name):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("python", "deepspeed", "torchrun", "mpirun", "srun"):
        (bindir / tool).write_text(FAKE.format(py=shlex.quote(PY)))
        (bindir / tool).chmod(0o755)
    out, record = tmp_path / "run", tmp_path / "argv"
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "PY": str(bindir / "python"),
        "LAUNCHER": name,
        "NPROC": "2",
        "HOSTFILE": "hf",
        "OUT": str(out),
        "RECORD": str(record),
        "FAKE_RC": "4",
        "MASTER_PORT": "23456",
    }
    for knob in ("SRUN_ARGS", "TORCHRUN_ARGS", "DS_ARGS", "MPI_ARGS", "NPROC_GIVEN", *SSH_ARG_VARS):
        env.pop(knob, None)
    p = subprocess.run(
        ["bash", str(REPO / "run_scripts" / "common.sh"), "--x", "a b"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 4, p.stderr  # the launcher's exit code (4: the exit signal's) is the script's
    trainer = ["--x", "a b", "--save", f"{out}/ckpt", "--load", f"{out}/ckpt", "--tensorboard-dir", f"{out}/tb"]
    trainer += ["--log-json", f"{out}/log.jsonl"]
    req = dataclasses.replace(_req(name), python=str(bindir / "python"))
    want = L.command(req, [*PROGRAM, *trainer], {"MASTER_PORT": "23456"}, cwd=REPO)
    got = record.read_text().splitlines()
    assert (Path(got[0]).name, got[1:]) == (Path(want[0]).name, want[1:])  # mpirun/srun: found on PATH
    assert got[0] == want[0] or "/" not in want[0]
    if name in ("deepspeed", "torchrun"):  # MASTER_PORT is LAUNCHER=deepspeed's: torchrun keeps its own default
        assert ("23456" in want) == (name == "deepspeed")
    # the launchers that reach hosts over ssh get keep-alives: a lost host ends the command (common/keepalive.py)
    keep = "-o ServerAliveInterval=5 -o ServerAliveCountMax=3"
    ssh_var = {"hostfile": "PDSH_SSH_ARGS_APPEND", "hostfile-openmpi": OMPI_VAR, "mpirun": OMPI_VAR}.get(name)
    assert (tmp_path / "argv.env").read_text().splitlines() == [
        keep if var == ssh_var else "unset" for var in SSH_ARG_VARS
    ]


# ------------------------------------------------------------------------------------------------ ssh keep-alives
@pytest.mark.parametrize(
    "given, want",
    [
        ("", "-o ServerAliveInterval=5 -o ServerAliveCountMax=3"),
        (
            "-i key -o StrictHostKeyChecking=no",
            "-i key -o StrictHostKeyChecking=no -o ServerAliveInterval=5 -o ServerAliveCountMax=3",
        ),
        ("-o ServerAliveInterval=30", "-o ServerAliveInterval=30 -o ServerAliveCountMax=3"),  # the user's value wins
        ("-oserveraliveinterval=30 -o 'ServerAliveCountMax 9'", "-oserveraliveinterval=30 -o 'ServerAliveCountMax 9'"),
        ("-o ServerAliveInterval=5 -o ServerAliveCountMax=3", "-o ServerAliveInterval=5 -o ServerAliveCountMax=3"),
    ],
)
def test_keepalives_are_appended_only_where_missing(given, want):
    """ssh takes option names in any case, as ``-oKEY=V``, ``-o KEY=V`` or ``-o "KEY V"``: each form counts as set."""
    assert with_keepalive(given) == want
    assert with_keepalive(want) == want  # idempotent: a nested launch adds nothing


def test_given_options_reads_every_form_of_dash_o():
    assert given_options("-i k -oA=1 -o B=2 -o 'C 3' -p 22 -o") == {"a", "b", "c"}


def test_an_mpirun_rsh_args_flag_gets_the_keepalives_too():
    """``--mca plm_rsh_args`` on mpirun's command line overrides OMPI_MCA_plm_rsh_args: its value is completed."""
    args = ["--allow-run-as-root", "--mca", "plm_rsh_args", "-o ServerAliveCountMax=9", "-x", "A"]
    want = [*args[:3], "-o ServerAliveCountMax=9 -o ServerAliveInterval=5", "-x", "A"]
    assert keepalive_mpi_args(args) == want
    got = L.command(_req("hostfile-openmpi"), PROGRAM, {"MPI_ARGS": shlex.join(args)})
    assert shlex.split(got[got.index("--launcher_args") + 1]) == want
    got = L.command(_req("mpirun"), PROGRAM, {"MPI_ARGS": shlex.join(args)})
    assert got[1 : 1 + len(want)] == want


def test_the_cli_keeps_the_users_own_ssh_settings_and_prints_what_it_adds(tmp_path):
    """``python -m common.launch --launcher hostfile``: the user's PDSH_SSH_ARGS_APPEND stays, the missing
    keep-alive is appended, and ``--print`` shows the variable (the printed line does what the CLI does)."""
    env = {"PDSH_SSH_ARGS_APPEND": "-i key -o ServerAliveInterval=30"}
    p = _cli("--launcher", "hostfile", "--hostfile", "hf", "--print", "--", *PROGRAM, env=env)
    assert p.returncode == 0, p.stderr
    words = shlex.split(p.stdout)
    assert words[0] == "PDSH_SSH_ARGS_APPEND=-i key -o ServerAliveInterval=30 -o ServerAliveCountMax=3"
    assert words[1:] == L.command(_req("hostfile", python=PY), PROGRAM, {}, cwd=REPO)


def test_the_shell_lines_export_the_keepalives_keeping_the_users_own():
    """``eval "$(python -m common.keepalive)"`` (pretrain_deepspeed.sbatch): the variables as a shell then has them."""
    script = f'eval "$({shlex.quote(PY)} -m common.keepalive)"; printf "%s\\n" "$PDSH_SSH_ARGS_APPEND" "${OMPI_VAR}"'
    env = {**os.environ, "PYTHONPATH": str(REPO), "PDSH_SSH_ARGS_APPEND": "-p 2222 -o 'ServerAliveCountMax 9'"}
    env.pop(OMPI_VAR, None)
    p = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "-p 2222 -o 'ServerAliveCountMax 9' -o ServerAliveInterval=5",
        "-o ServerAliveInterval=5 -o ServerAliveCountMax=3",
    ]
