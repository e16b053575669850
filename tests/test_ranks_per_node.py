"""run_scripts/ranks.sh: one rank per GPU on GPU nodes (the quickstart's NPROC=2 on a one-GPU machine), any count
on CPU-only nodes; tested with a fake nvidia-smi."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ranks(tmp_path: Path, gpus: int | None, want: str, given: bool) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpus is not None:
        lines = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(gpus))
        smi.write_text("#!/bin/sh\n" + lines)
        smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    if given:
        env["NPROC_GIVEN"] = "1"
    script = f"source {REPO}/run_scripts/ranks.sh; ranks_for_node {want} 2"
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    "gpus, want, given, code, out",
    [
        (None, "2", False, 0, "2"),  # no GPU: CPU ranks
        (None, "4", True, 0, "4"),
        (1, "2", False, 0, "1"),  # the quickstart's default on a one-GPU machine
        (1, "2", True, 2, ""),  # asked for explicitly: refused, not silently changed
        (8, "2", False, 0, "2"),
        (2, "2", True, 0, "2"),
    ],
)
def test_ranks_for_node(tmp_path, gpus, want, given, code, out):
    res = _ranks(tmp_path, gpus, want, given)
    assert res.returncode == code, res.stderr
    assert res.stdout.strip() == out
    if gpus is not None and int(want) > gpus:
        assert f"{gpus} GPU(s)" in res.stderr


def test_more_ranks_than_gpus_refused_at_start():
    """NPROC > visible GPUs: refused before NCCL starts, not hidden by local_rank % device_count; one GPU per task
    (srun --gpus-per-task=1, a CUDA_VISIBLE_DEVICES entry per rank) is fine."""
    from pretrain.distributed import check_ranks_fit_gpus

    with pytest.raises(RuntimeError, match=r"8 ranks on this node but 4 visible GPU\(s\)"):
        check_ranks_fit_gpus(8, 4, None)
    with pytest.raises(RuntimeError, match="ranks would share GPUs"):
        check_ranks_fit_gpus(2, 1, None)
    check_ranks_fit_gpus(4, 1, "3")  # each task sees only its own GPU
    check_ranks_fit_gpus(4, 4, "0,1,2,3")
    check_ranks_fit_gpus(None, 2, None)  # the launcher did not say: not checked
