"""The FlexAttention BlockMask built from the layout (model.attention.kernels.flex_mask) against torch's own
``create_block_mask`` on the same mask_mod: same full blocks, never a missing block, same attention output.

CPU, eager FlexAttention (inference): the block mask is device-independent data, so what holds here holds for the
CUDA kernels that consume it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from model import attention as A
from model.attention.kernels.flex import mask_mod_for
from model.attention.kernels.flex_mask import layout_block_mask, sparse_block_size
from tests.registry_cases import LAYOUT_EXAMPLES

H = 4
LAYOUTS = {
    **{name: (lambda make=make: make(H)) for name, make in LAYOUT_EXAMPLES.items()},
    # block sizes that are a multiple / a divisor of FlexAttention's 128-token sparse block
    "bslongformer_b64": lambda: A.BSLongformerSparsityConfig(H, block=64, global_block_indices=[1]),
    "variable_b32": lambda: A.VariableSparsityConfig(H, block=32, local_window_blocks=[2, 4]),
    # not aligned with 128: sparse blocks straddle layout blocks (was create_block_mask's B x H x N^2 pass)
    "fixed_b48": lambda: A.FixedSparsityConfig(H, block=48, num_local_blocks=2),
    "bigbird_b80": lambda: A.BigBirdSparsityConfig(H, block=80, num_random_blocks=1, seed=3),
}


def _padding(B: int, N: int, kind: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    kpm = torch.ones(B, N, dtype=torch.bool)
    kpm[1, N - 70 :] = False  # ragged tail inside a sparse block
    kpm[2, 200:] = False  # whole sparse blocks of keys padded
    return kpm


@pytest.mark.parametrize("token_mask", [False, True])
@pytest.mark.parametrize("pad", ["none", "ragged"])
@pytest.mark.parametrize("n_tokens", [512, 400])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_block_mask_equals_create_block_mask(name, n_tokens, pad, token_mask):
    cfg = LAYOUTS[name]()
    N = cfg.padded_length(n_tokens)
    lay = cfg.make_layout(N).bool()
    B = 3
    kpm = _padding(B, N, pad)
    g = torch.Generator().manual_seed(0)
    tm = torch.rand(H, N, N, generator=g) > 0.05 if token_mask else None
    mask_mod = mask_mod_for(lay, cfg.block, kpm, tm)
    ours = layout_block_mask(lay, cfg.block, N, mask_mod, kpm, tm)
    ref = create_block_mask(mask_mod, None if kpm is None else B, H, N, N, device="cpu")
    assert ours.BLOCK_SIZE == ref.BLOCK_SIZE == (128, 128)

    def blocks(bm, full_only=False):
        n = bm.full_kv_num_blocks if full_only else bm.kv_num_blocks
        i = bm.full_kv_indices if full_only else bm.kv_indices
        on = torch.arange(i.shape[-1]) < n[..., None]
        m = torch.zeros(*i.shape[:-1], i.shape[-1], dtype=torch.bool)
        m.scatter_(-1, i.long(), on)
        return m.expand(max(m.shape[0], B if kpm is not None else 1), *m.shape[1:])

    visited_ours = blocks(ours) | blocks(ours, True)
    visited_ref = blocks(ref) | blocks(ref, True)
    assert not (visited_ref & ~visited_ours).any(), "a block with attended elements was dropped"
    full_ours, full_ref = blocks(ours, True), blocks(ref, True)
    if token_mask:  # the token mask only ever demotes full blocks to partial ones
        assert not (full_ours & ~full_ref).any()
    else:
        assert torch.equal(full_ours, full_ref)
        if name.startswith("blockbert"):  # 128-aligned chunks: full blocks, the mask_mod-free fast path
            assert full_ours.any()
    q, k, v = (torch.randn(B, H, N, 16, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention(q, k, v, block_mask=ours)
        out_ref = flex_attention(q, k, v, block_mask=ref)
    torch.testing.assert_close(out, out_ref, atol=1e-6, rtol=1e-5)


def test_sparse_block_size():
    assert sparse_block_size(16) == 128 and sparse_block_size(64) == 128 and sparse_block_size(256) == 256
    assert sparse_block_size(48) is None  # not aligned: layout_block_mask maps tokens to layout blocks


@pytest.mark.parametrize("name", [None, *LAYOUTS])
def test_flex_kernel_matches_dense_on_multi_block_lengths(name):
    """The kernel path (plan mask + per-call key padding + token mask) over several 128-token sparse blocks."""
    cfg = None if name is None else LAYOUTS[name]()
    n = 300  # not a multiple of 128, nor of most layouts' units: padded by the module where needed
    B = 3
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, n, 16, generator=g) for _ in range(3))
    kpm = torch.ones(B, n, dtype=torch.bool)
    kpm[1, n - 70 :] = False
    kpm[2, 140:] = False
    tm = torch.rand(1, n, n, generator=g) > 0.1
    for kp, t in ((None, None), (kpm, None), (kpm, tm)):
        with torch.no_grad():
            ref = A.BlockSparseAttention(cfg, kernel="dense", max_seq_length=512)(q, k, v, kp, t)
            out = A.BlockSparseAttention(cfg, kernel="flex", max_seq_length=512)(q, k, v, kp, t)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_flex_plan_for_blockbert_has_only_full_blocks():
    """BlockBERT's 256-token chunks at N=512 are whole 128-token sparse blocks: no mask_mod runs at all."""
    cfg = LAYOUTS["blockbert_n2"]()
    mod = A.BlockSparseAttention(cfg, kernel="flex", max_seq_length=512)
    bm = mod._plan(512, torch.device("cpu")).block_mask
    assert bm.BLOCK_SIZE == (128, 128)
    assert int(bm.kv_num_blocks.sum()) == 0  # no partial block
    assert bm.full_kv_num_blocks.flatten().tolist() == [2] * (H * 4)  # 2 of the 4 key blocks per query block
