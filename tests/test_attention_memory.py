"""The sparse paths keep sparse memory: what one attention call keeps for its backward stays within 1.5x its layout's
scores (benchmarks/attention_memory.py measures the same at N=4096/8192 for docs/model.md)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import attention_memory as am

N = 1024
KERNELS = ["block_gather", am.GATHER_ONLY]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("family", sorted(am.families()))
def test_retained_memory_within_bound(family: str, kernel: str) -> None:
    row = am.measure(family, am.families()[family], kernel, N, torch.float32)
    assert row["ratio"] <= am.TARGET, (
        f"{family} on {kernel} keeps {row['retained_mib']:.2f} MiB for the backward, {row['ratio']:.2f}x its layout's "
        f"scores ({row['bound_mib']:.2f} MiB); target {am.TARGET}x"
    )


def test_gather_plan_keeps_no_gathered_copies() -> None:
    """Fixed, block 16: every 64-row query tile gathers ~1/4 of the keys, so the copies alone are 2x the scores (head
    size 64); the gather plan keeps none of them (q, k, v are inputs and not counted)."""
    spec = am.families()["fixed"]
    row = am.measure("fixed", spec, am.GATHER_ONLY, N, torch.float32)
    copies = 2 * row["density"] * N * am.BATCH * am.HEADS * N // 64 * am.HEAD_DIM * 4  # K and V rows per tile
    assert row["retained_mib"] * 2**20 < 0.05 * copies


def test_recomputed_chunks_match_dense_gradients() -> None:
    """Chunked, recomputed gather tiles (several chunks at this size) give dense's output and gradients, with padding
    and dropout off, and a DIET bias."""
    from model.attention import BlockSparseAttention, FixedSparsityConfig
    from model.attention.kernels.block_gather import gather as G
    from model.positions import DietRelBias

    H, n = 2, 256
    cfg = FixedSparsityConfig(H, block=16)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, H, n, 32, generator=g, requires_grad=True) for _ in range(3))
    table = torch.randn(H, 9, generator=g, requires_grad=True)
    kpm = torch.ones(2, n, dtype=torch.bool)
    kpm[1, 200:] = False
    grads = {}
    old = G.CHUNK_ROWS_PER_TOKEN
    for name in ("dense", "block_gather"):
        mod = BlockSparseAttention(cfg, name, n)
        mod.build_plan(n, torch.device("cpu"))
        if name == "block_gather":
            mod._plans.clear()
            import os

            os.environ["SPARSEBERT_CPU_SPLIT"] = "0"
            try:
                plan = mod._plan(n, torch.device("cpu"))
            finally:
                del os.environ["SPARSEBERT_CPU_SPLIT"]
            assert isinstance(plan, G.GatherPlan)
            G.CHUNK_ROWS_PER_TOKEN = 0  # one tile per chunk: the most chunks
        try:
            out = mod(q, k, v, key_padding_mask_BN=kpm, score_bias=DietRelBias(table))
            out.square().sum().backward()
        finally:
            G.CHUNK_ROWS_PER_TOKEN = old
        grads[name] = [out.detach()] + [t.grad.clone() for t in (q, k, v, table)]
        for t in (q, k, v, table):
            t.grad = None
    for a, b in zip(grads["dense"], grads["block_gather"]):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)
