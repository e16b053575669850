"""benchmarks/step_memory.py: the replay of torch.profiler's memory timeline finds the peak and says what it holds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.step_memory import peak_breakdown
from tests import train_utils as tu

MIB = 2**20


def test_the_peak_holds_the_large_temporary_and_names_the_op_that_made_it():
    w = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)

    def step():
        big = torch.ones(1024, 1024)  # 4 MiB, freed before the smaller allocations below
        total = big.sum()
        del big
        kept = torch.zeros(256, 1024)  # 1 MiB
        w(x).relu().sum().backward()
        return total, kept

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    r = peak_breakdown(prof, torch.device("cpu"), top=3)
    before = sum(p.numel() * 4 for p in w.parameters()) + x.numel() * 4
    assert r["peak_mib"] == pytest.approx((4 * MIB + before) / MIB, abs=0.01)  # the ones, not ones + zeros (5 MiB)
    assert sum(r["by_category_mib"].values()) == pytest.approx(r["peak_mib"])
    assert r["top"][0]["op"] == "aten::ones" and r["top"][0]["mib"] == pytest.approx(4.0, abs=1e-3)
    assert r["by_category_mib"]["parameter"] == pytest.approx(sum(p.numel() * 4 for p in w.parameters()) / MIB)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_command_reports_a_training_step_by_category(tmp_path):
    out = tmp_path / "m.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.step_memory",
            "--model-preset",
            "tiny",
            "--device",
            "cpu",
            "--cases",
            "dense@64",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
        cwd=tu.REPO,
        env=tu.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=380,
    )
    assert p.returncode == 0, p.stdout[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["variant"] == "dense" and row["seq_len"] == 64
    assert {"parameter", "optimizer_state"} <= set(row["by_category_mib"])  # what else is live depends on the config
    assert sum(row["by_category_mib"].values()) == pytest.approx(row["peak_mib"], rel=1e-6)
    assert "peak MiB" in p.stdout
