"""The launch paths other than `deepspeed --num_gpus` (covered by the resume and fault tests): torchrun, mpirun
(mpi4py discovery) and `deepspeed --hostfile` with the OpenMPI launcher, each training 2 CPU ranks (on CUDA: one
per GPU, up to 2) for 2 steps."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests import train_utils as tu

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tu.prepare(tmp_path_factory.mktemp("launch"))


def check(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, p.stdout[-4000:]
    backend = "nccl" if tu.CUDA else "gloo"
    assert f"[pretrain] {tu.NPROCS} rank(s), backend {backend}" in p.stdout
    assert "iteration 2/2" in p.stdout


def _shm_buffers() -> set[str]:
    return (
        {p.name for p in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")} if Path("/dev/shm").is_dir() else set()
    )


def test_torchrun(data):
    before = _shm_buffers()
    check(tu.launch("torchrun", tu.train_args(data, "zero1_fp32.json", 2)))
    # DeepSpeed's CPU all-reduce buffers (66 MB of RAM each) are unlinked once mapped: none stays behind
    left = sorted(_shm_buffers() - before)
    assert not [n for n in left if n.endswith(("_0", "_1"))], left


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (run_scripts/setup_env.sh)")
def test_mpirun(data):
    check(tu.launch("mpirun", tu.train_args(data, "zero3_fp32.json", 2)))


@pytest.mark.extended  # ~25 s; deepspeed launches in every multi-rank test, openmpi in tests/test_multinode.py
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (run_scripts/setup_env.sh)")
def test_deepspeed_hostfile_openmpi(data, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"localhost slots={tu.NPROCS}\n")
    cmd = [
        str(tu.VENV_BIN / "deepspeed"),
        "--hostfile",
        str(hostfile),
        "--force_multi",
        "--no_ssh_check",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(tu.free_port()),
        "--launcher",
        "openmpi",
        "--launcher_args",
        "--allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo",
        str(tu.REPO / "pretrain" / "train.py"),
    ] + tu.train_args(data, "zero2_fp32.json", 2)
    check(
        subprocess.run(
            cmd, cwd=tu.REPO, env=tu.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
        )
    )
