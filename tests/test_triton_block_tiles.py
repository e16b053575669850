"""``benchmarks.attention --measure tiles`` (benchmarks/attention/triton_tiles.py): each swept configuration reaches
the plans it times, a refused launch is a row with its error, bad specs are one line, and the kernel's settings are
restored afterwards."""

from __future__ import annotations

import argparse

import pytest
import torch

import model.attention.kernels.triton_block as tb
from benchmarks.attention.triton_tiles import Launch, best, sweep
from model.attention.kernels import KERNELS


def test_specs_parse_and_bad_ones_say_how_to_write_them():
    assert Launch.parse("128x64:8:3") == Launch(128, 64, 8, 3)
    assert str(Launch.parse("64X32:4:1")) == "64x32:4:1"
    for bad in ("128x64:8", "128-64:8:3", "96x64:4:2", "8x8:4:1"):
        with pytest.raises(ValueError, match="--configs"):
            Launch.parse(bad)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "configs",
    [
        pytest.param(["32x16:2:1"], id="one"),  # the default tier's canary (Triton's interpreter: ~20 s)
        pytest.param(["32x32:4:1", "32x16:2:1"], id="two", marks=pytest.mark.extended),
    ],
)
def test_each_configuration_reaches_the_plans_it_times(monkeypatch, configs):
    if not torch.cuda.is_available() and not tb.interpreting():
        pytest.skip("Triton was imported without TRITON_INTERPRET=1 in this process (tests/conftest.py sets it)")
    seen = []
    real_build = tb.build_tables

    def recording(lay, block, n, tile_m, tile_n, **kw):
        seen.append((tile_m, tile_n))
        return real_build(lay, block, n, tile_m, tile_n, **kw)

    monkeypatch.setattr(tb, "build_tables", recording)
    real_config = tb.TritonBlockPlan.config
    launches = []
    monkeypatch.setattr(
        tb.TritonBlockPlan, "config", lambda self, d, t: launches.append(self.launch) or real_config(self, d, t)
    )
    kernel = KERNELS["triton_block"]
    before = (kernel.tile, kernel.tile_n, kernel.launch)
    args = argparse.Namespace(
        device="cuda" if torch.cuda.is_available() else "cpu", dtype="fp32", batch=1, cases=[("fixed_b16", 64)],
        configs=configs, repeats=1, json=None,
    )  # fmt: skip
    rows = sweep(args)
    assert [r["config"] for r in rows] == configs
    assert all("ratio" in r and r["ratio"] > 0 for r in rows), rows
    wanted = [Launch.parse(c) for c in configs]
    assert seen == [(w.tile_m, w.tile_n) for w in wanted]
    assert set(launches) == {(w.num_warps, w.num_stages) for w in wanted}
    assert (kernel.tile, kernel.tile_n, kernel.launch) == before
    assert list(best(rows)) == ["fixed_b16@64"]
