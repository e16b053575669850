"""MatMul (sdd/dsd/dds, transposed inputs) and Softmax (scale, rpe, key padding / attention masks in add and mul
modes) on DeepSpeed's block-sparse format, against dense torch references with the layout applied, the way
DeepSpeed's own tests/unit/ops/sparse_attention/test_sparse_attention.py checks its Triton ops: forward and
gradients, random layouts, fp32 tight, fp16/bf16 loose."""

from __future__ import annotations

import pytest
import torch

from model.attention.deepspeed import MatMul, Softmax
from model.attention.deepspeed.block_sparse_ops import dense_to_sparse, sparse_to_dense

Z, H, BLOCK = 2, 3, 16


def _layout(nb_m, nb_n, seed=0, density=0.4):
    g = torch.Generator().manual_seed(seed)
    lay = (torch.rand(H, nb_m, nb_n, generator=g) < density).long()
    lay[:, :, 0] = 1  # every row has a block (DeepSpeed's layouts do)
    return lay


def _mask(lay, block):
    return lay.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)[None]


def _grads(out, inputs, seed=5):
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return torch.autograd.grad(out, inputs, go)


TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=3e-2, rtol=3e-2),
    torch.bfloat16: dict(atol=2.5e-1, rtol=5e-2),
}  # bf16 keeps 8 bits: sums of ~50 products


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("mode", ["sdd", "dsd", "dds"])
def test_matmul_against_dense(mode, trans_a, trans_b, dtype):
    M, K, N = 64, 48, 80
    g = torch.Generator().manual_seed(1)
    if mode == "sdd":
        lay = _layout(M // BLOCK, N // BLOCK)
        a32 = torch.randn(Z, H, *((K, M) if trans_a else (M, K)), generator=g)
        b32 = torch.randn(Z, H, *((N, K) if trans_b else (K, N)), generator=g)
    elif mode == "dsd":  # the layout describes the stored A
        lay = _layout(*((K // BLOCK, M // BLOCK) if trans_a else (M // BLOCK, K // BLOCK)))
        a32 = dense_to_sparse(torch.randn(Z, H, lay.shape[1] * BLOCK, lay.shape[2] * BLOCK, generator=g), lay, BLOCK)
        b32 = torch.randn(Z, H, *((N, K) if trans_b else (K, N)), generator=g)
    else:
        lay = _layout(*((N // BLOCK, K // BLOCK) if trans_b else (K // BLOCK, N // BLOCK)))
        a32 = torch.randn(Z, H, *((K, M) if trans_a else (M, K)), generator=g)
        b32 = dense_to_sparse(torch.randn(Z, H, lay.shape[1] * BLOCK, lay.shape[2] * BLOCK, generator=g), lay, BLOCK)
    a, b = (t.to(dtype).requires_grad_() for t in (a32, b32))
    ra, rb = (t.clone().requires_grad_() for t in (a32, b32))

    def dense(x, sparse_here):
        return sparse_to_dense(x, lay, BLOCK) if sparse_here else x

    da = dense(ra, mode == "dsd")
    db = dense(rb, mode == "dds")
    da = da.transpose(-1, -2) if trans_a else da
    db = db.transpose(-1, -2) if trans_b else db
    ref = da @ db
    if mode == "sdd":
        ref = dense_to_sparse(ref, lay, BLOCK)
    out = MatMul(lay, BLOCK, mode, trans_a=trans_a, trans_b=trans_b)(a, b)
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    for got, want in zip(_grads(out, (a, b)), _grads(ref, (ra, rb))):
        torch.testing.assert_close(got.float(), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kp_mode, am_mode", [("add", "add"), ("mul", "mul"), ("add", "mul")])
def test_softmax_against_dense(kp_mode, am_mode, dtype):
    n = 64
    lay = _layout(n // BLOCK, n // BLOCK, seed=2)
    g = torch.Generator().manual_seed(3)
    dense_x = torch.randn(Z, H, n, n, generator=g)
    rpe = torch.randn(1, H, n, n, generator=g)
    kpm_bool = torch.ones(Z, n, dtype=torch.bool)
    kpm_bool[1, 40:] = False
    am_bool = torch.rand(n, n, generator=g) > 0.2
    kpm = kpm_bool.float() if kp_mode == "mul" else torch.where(kpm_bool, 0.0, float("-inf"))
    am = am_bool.float() if am_mode == "mul" else torch.where(am_bool, 0.0, -1e4)
    x = dense_to_sparse(dense_x, lay, BLOCK).to(dtype).requires_grad_()
    out = Softmax(lay, BLOCK)(
        x,
        scale=0.125,
        rpe=rpe,
        key_padding_mask=kpm,
        attn_mask=am,
        key_padding_mask_mode=kp_mode,
        attn_mask_mode=am_mode,
    )
    rx = dense_x.clone().requires_grad_()
    s = rx * 0.125 + rpe + torch.where(kpm_bool, 0.0, float("-inf"))[:, None, None, :]  # both modes: -inf
    s = s + (torch.where(am_bool, 0.0, float("-inf")) if am_mode == "mul" else am)
    s = s.masked_fill(~_mask(lay, BLOCK), float("-inf"))
    ref = dense_to_sparse(torch.softmax(s, -1).nan_to_num(0.0), lay, BLOCK)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    (gx,) = _grads(out, (x,))
    (rg,) = _grads(ref, (rx,))
    torch.testing.assert_close(gx.float(), dense_to_sparse(rg, lay, BLOCK), **TOL[dtype])


def test_softmax_row_with_nothing_left_is_zero_and_attention_pipeline_matches_dense():
    """sdd -> softmax -> dsd (DeepSpeed's SparseSelfAttention recipe) equals masked dense attention."""
    n, d = 64, 16
    lay = _layout(n // BLOCK, n // BLOCK, seed=4)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(Z, H, n, d, generator=g) for _ in range(3))
    kpm = torch.zeros(Z, n)
    kpm[1] = float("-inf")  # a fully padded sequence
    scores = MatMul(lay, BLOCK, "sdd", trans_b=True)(q, k)
    probs = Softmax(lay, BLOCK)(scores, scale=d**-0.5, key_padding_mask=kpm)
    out = MatMul(lay, BLOCK, "dsd")(probs, v)
    s = (q @ k.transpose(-1, -2)) * d**-0.5 + kpm[:, None, None, :]
    s = s.masked_fill(~_mask(lay, BLOCK), float("-inf"))
    ref = torch.softmax(s, -1).nan_to_num(0.0) @ v
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert out[1].abs().max() == 0
