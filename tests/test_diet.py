"""DIET positional attention (ABS / REL, sharing none / layer / head) and per-head segment attention: the dense bias
equals the paper's formula, and every kernel (applying the bias inside its own tiling) matches dense on outputs,
q/k/v grads and the positional parameters' grads, with block layouts, SparseBERT token masks and padding."""

from __future__ import annotations

import math

import pytest
import torch

from model import attention as A
from model.attention import sparsebert as S
from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.positions import DietAbsBias, DietRelBias, PositionalAttention, PositionConfig, SegmentBias
from tests.registry_cases import ALL_KERNELS, CPU_TRAINING_KERNELS, OTHER_KERNELS, REFERENCE

H, D, B, N, L = 4, 16, 2, 48, 2
VARIANTS = {
    "abs": dict(pos=PositionConfig(type="diet_abs", rank=8), segment="input"),
    "abs_layer_perhead_seg": dict(pos=PositionConfig(type="diet_abs", rank=8, sharing="layer"), segment="per_head"),
    "abs_head": dict(pos=PositionConfig(type="diet_abs", rank=8, sharing="head"), segment="input"),
    "rel": dict(pos=PositionConfig(type="diet_rel", max_distance=5), segment="input"),
    "rel_head_seg": dict(pos=PositionConfig(type="diet_rel", max_distance=5, sharing="head"), segment="per_head"),
    "seg_only": dict(pos=PositionConfig(), segment="per_head"),
}


def _positional(variant: str) -> PositionalAttention:
    torch.manual_seed(0)
    v = VARIANTS[variant]
    pa = PositionalAttention(v["pos"], v["segment"], L, H, 64, 2, init_std=0.5)
    with torch.no_grad():  # non-zero everywhere, so every term is exercised
        for p in pa.parameters():
            if not p.abs().sum():
                p.normal_()
    return pa


def test_dense_biases_match_formulas():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(N, 8, generator=g)
    uq, uk = torch.randn(H, 8, 8, generator=g), torch.randn(H, 8, 8, generator=g)
    b = DietAbsBias(torch.einsum("nd,hde->hne", p, uq), torch.einsum("nd,hde->hne", p, uk)).dense(N)[0]
    i, j, h = 5, 17, 2
    assert b[h, i, j].item() == pytest.approx(((p[i] @ uq[h]) @ (p[j] @ uk[h])).item() / math.sqrt(8), rel=1e-4)
    r = torch.randn(H, 11, generator=g)
    br = DietRelBias(r).dense(N)[0]
    for i, j in ((3, 4), (20, 2), (0, 47), (30, 30)):
        assert br[h, i, j] == r[h, max(-5, min(5, j - i)) + 5]
    t = torch.randn(H, 2, 2, generator=g)
    seg = torch.randint(0, 2, (B, N), generator=g)
    bs = SegmentBias(t, seg).dense(N)
    assert bs.shape == (B, H, N, N) and bs[1, h, 7, 9] == t[h, seg[1, 7], seg[1, 9]]


LAYOUTS = {
    "full": lambda: (None, None),
    "bigbird_blocks": lambda: (A.BigBirdSparsityConfig(H, block=16, seed=1), None),
    "star_mask": lambda: (None, S.make_pattern(S.TokenMaskConfig.from_dict(dict(pattern="star")), H, 64)),
}


def _run(kernel, layout, variant, layer, grad=True):
    pa = _positional(variant)
    sparsity, mask = LAYOUTS[layout]()
    mod = A.BlockSparseAttention(sparsity, kernel, 64, fixed_token_mask=mask, mask_block=16)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, N, D, generator=g).requires_grad_() for _ in range(3))
    seg = torch.zeros(B, N, dtype=torch.long)
    seg[:, 20:] = 1
    seg[1, 35:] = 0
    kpm = torch.ones(B, N, dtype=torch.bool)
    kpm[1, 40:] = False
    if not grad:
        with torch.no_grad():
            return mod(q, k, v, key_padding_mask_BN=kpm, score_bias=pa.biases(pa(N, seg, B))[layer]), None
    out = mod(q, k, v, key_padding_mask_BN=kpm, score_bias=pa.biases(pa(N, seg, B))[layer])
    params = [p for p in pa.parameters()]
    grads = torch.autograd.grad(out, [q, k, v, *params], torch.randn_like(out, generator=g), allow_unused=True)
    return out, grads


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kernels_match_dense_with_diet_bias(variant, layout):
    layer = 1
    ref, ref_g = _run("dense", layout, variant, layer)
    out, g = _run("block_gather", layout, variant, layer)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    assert sum(x is not None for x in ref_g[3:]) >= 1  # some positional parameter gets a gradient
    for a, b in zip(g, ref_g):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    out_f, _ = _run("flex", layout, variant, layer, grad=False)
    torch.testing.assert_close(out_f, ref, atol=2e-5, rtol=2e-5)


def test_sharing_and_no_input_positions():
    tiny = dict(max_position_embeddings=64, num_layers=3)
    abs_layer = BertForPreTraining(
        ModelConfig.preset("tiny", **tiny, position={"type": "diet_abs", "rank": 8, "sharing": "layer"})
    )
    pa = abs_layer.bert.positional_attention
    assert pa.abs_pos.shape == (1, 64, 8) and pa.abs_uq.shape == (1, 4, 8, 8)
    assert abs_layer.bert.embeddings.position_embeddings is None
    biases = pa.biases(pa(10, None, 1))
    assert biases[0] is biases[2]  # one set for all layers
    rel_head = BertForPreTraining(
        ModelConfig.preset(
            "tiny", **tiny, position={"type": "diet_rel", "sharing": "head", "max_distance": 7}, segment="per_head"
        )
    )
    pr = rel_head.bert.positional_attention
    assert pr.rel.shape == (3, 1, 15) and pr.segment.shape == (3, 4, 2, 2)
    assert rel_head.bert.embeddings.token_type_embeddings is None
    # DIET-REL with no input positions: shifting a sequence inside padding-free context is position-free except
    # through r; zeroing r makes the model permutation-equivariant (position truly enters only via the logits)
    with torch.no_grad():
        pr.rel.zero_()
    rel_head.eval()
    ids = torch.randint(5, 100, (1, 12))
    perm = torch.randperm(12)
    out = rel_head(ids).logits
    torch.testing.assert_close(rel_head(ids[:, perm]).logits, out[:, perm], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="position.sharing"):
        ModelConfig.preset("tiny", position={"type": "diet_abs", "sharing": "heads"})
    with pytest.raises(ValueError, match="unknown key"):
        ModelConfig.preset("tiny", position={"type": "diet_abs", "d_p": 64})
    with pytest.raises(ValueError, match="segment"):
        ModelConfig.preset("tiny", segment="head")
    with pytest.raises(ValueError, match="Hugging Face"):
        from tools.hf_export.stock_bert import to_hf

        to_hf(rel_head.state_dict(), rel_head.config)


@pytest.mark.parametrize("position", ["diet_abs", "diet_rel"])
def test_model_level_parity_across_kernels(position):
    """A whole DIET model with a SparseBERT mask and a free head size: every kernel with a CPU backward == dense
    (loss and every parameter's grad), every kernel == dense (inference)."""
    models = {}
    for kernel in ALL_KERNELS:
        torch.manual_seed(0)
        cfg = ModelConfig.preset(
            "tiny",
            max_position_embeddings=64,
            head_size=24,
            segment="per_head",
            hidden_dropout=0.0,
            attention_dropout=0.0,
            position={"type": position, "rank": 16, "max_distance": 8},
            attention={"kernel": kernel, "token_mask": {"pattern": "longformer", "block": 8}},
        )
        models[kernel] = BertForPreTraining(cfg)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 100, (2, 40), generator=g)
    tt = torch.zeros_like(ids)
    tt[:, 18:] = 1
    am = torch.ones_like(ids)
    am[0, 33:] = 0
    labels = ids.masked_fill(torch.rand(ids.shape, generator=g) > 0.3, -100)
    res = {}
    for kernel in [REFERENCE, *CPU_TRAINING_KERNELS]:
        out = models[kernel](ids, am, tt, labels)
        out.loss.backward()
        res[kernel] = (out.loss, {n: p.grad for n, p in models[kernel].named_parameters()})
    assert res[REFERENCE][1]["bert.positional_attention.segment"].abs().sum() > 0
    for kernel in CPU_TRAINING_KERNELS:
        torch.testing.assert_close(res[kernel][0], res[REFERENCE][0], atol=1e-5, rtol=1e-5)
        for n, gd in res[REFERENCE][1].items():
            torch.testing.assert_close(res[kernel][1][n], gd, atol=1e-5, rtol=1e-5, msg=f"{kernel} {n}")
    with torch.no_grad():
        ref = models[REFERENCE](ids, am, tt).logits
        for kernel in OTHER_KERNELS:
            torch.testing.assert_close(models[kernel](ids, am, tt).logits, ref, atol=1e-5, rtol=1e-5, msg=kernel)
