"""The sparse paths keep sparse memory: what one attention call keeps for its backward stays within 1.5x its layout's
scores (``benchmarks.attention --measure memory`` measures the same at N=4096/8192 for docs/model.md)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.attention import retained_memory as am

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
    old = G.PEAK_FRACTION
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
            G.PEAK_FRACTION = 0.0  # one tile per chunk: the most chunks
        try:
            out = mod(q, k, v, key_padding_mask_BN=kpm, score_bias=DietRelBias(table))
            out.square().sum().backward()
        finally:
            G.PEAK_FRACTION = old
        grads[name] = [out.detach()] + [t.grad.clone() for t in (q, k, v, table)]
        for t in (q, k, v, table):
            t.grad = None
    for a, b in zip(grads["dense"], grads["block_gather"]):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("n", "window", "size"), [(100, 32, 100), (256, 128, 256), (90, 10, 96), (300, 0, 320)])
def test_band_mask_equals_the_dense_window(n: int, window: int, size: int) -> None:
    """A BandMask answers exactly what the dense sliding-window mask did: the mask, its block layouts, FlexAttention's
    block summaries, tiles and sparsity."""
    from model.attention.band import BandMask, tile_mask
    from model.attention.kernels.flex_mask import _grouped_any_all
    from model.attention.token_patterns import TokenMaskConfig, block_layout_from_mask, build_token_mask, sparsity

    band = BandMask(window // 2, n, 2, size)
    cfg = TokenMaskConfig.from_dict({"pattern": "sliding_window", "window": window})
    dense = torch.nn.functional.pad(build_token_mask(cfg, 2, n, 0), (0, size - n, 0, size - n))
    assert torch.equal(band.dense(), dense)
    for block in (16, 32, 128):
        assert torch.equal(band.block_layout(block), block_layout_from_mask(dense, block))
        any_b, all_b = band.grouped_any_all(block)
        any_d, all_d = _grouped_any_all(dense[:1], block, 2)
        assert torch.equal(any_b, any_d) and torch.equal(all_b, all_d)
    g = torch.Generator().manual_seed(0)
    head, qi, ki = torch.tensor([0, 1]), torch.randint(0, size, (2, 7), generator=g), torch.randint(0, size, (2, 5))
    assert torch.equal(tile_mask(band, head, qi, ki), tile_mask(dense, head, qi, ki))
    assert sparsity(band.resized(n)) == pytest.approx(sparsity(dense[:, :n, :n]), abs=1e-12)


def test_modernbert_local_layers_hold_no_n_by_n_mask_at_8192() -> None:
    """ModernBERT's local layers keep their window as a band: at max_position_embeddings 8192 (as ModernBERT ships)
    a layer's buffers and plans stay far below one [H, n, n] mask (268 MB at 4 heads; 0.8 GB at 12)."""
    from model.bert import BertForPreTraining
    from model.config import ModelConfig

    n = 8192
    model = BertForPreTraining(ModelConfig.preset("modernbert-tiny", vocab_size=97, max_position_embeddings=n))
    layers = model.bert.encoder.layers
    for i in (1, 2):  # local layers (global every 3rd)
        core = layers[i].attention.core
        core.build_plan(n, torch.device("cpu"))
        held = am.tensor_bytes([core.master_layout, core.fixed_token_mask, core._plans])
        H = core.sparsity_config.num_heads
        assert held < 0.1 * H * n * n, f"layer {i} holds {held / 2**20:.1f} MiB"
    stats = model.mask_stats()
    r = 16  # modernbert-tiny: window 32
    assert stats["token_mask/layer1_sparsity"] == pytest.approx(1 - ((2 * r + 1) * n - r * (r + 1)) / n**2, abs=1e-12)


def test_flex_folds_diet_abs_into_q_and_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """DIET-ABS under flex builds no [H, N, N] table (its score_mod's): the low-rank bias joins q and k, and the
    output equals dense's."""
    from model.attention import BlockBERTSparsityConfig, BlockSparseAttention
    from model.positions import DietAbsBias

    def no_table(self):
        raise AssertionError("DietAbsBias.score_mod (an [H, N, N] table) was called")

    monkeypatch.setattr(DietAbsBias, "score_mod", no_table)
    H, n = 4, 256
    cfg = BlockBERTSparsityConfig(H, num_blocks=2, head_assignment="3:1", block=16)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, H, n, 32, generator=g) for _ in range(3))
    bias = DietAbsBias(torch.randn(H, n, 8, generator=g), torch.randn(H, n, 8, generator=g))
    kpm = torch.ones(2, n, dtype=torch.bool)
    kpm[1, 190:] = False
    with torch.no_grad():
        ref = BlockSparseAttention(cfg, "dense", n)(q, k, v, key_padding_mask_BN=kpm, score_bias=bias)
        out = BlockSparseAttention(cfg, "flex", n)(q, k, v, key_padding_mask_BN=kpm, score_bias=bias)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
