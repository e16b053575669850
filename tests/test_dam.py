"""DAM (SparseBERT Algorithm 1): Gumbel-sigmoid statistics, mask structure, gated attention, a small training run
where the learned mask's sparsity rises with lambda, and export of the binarised mask that the block-sparse kernels
then run (parity with dense on the same mask)."""

from __future__ import annotations

import math

import pytest
import torch

from model.attention import sparsebert as S
from model.bert import BertForPreTraining
from model.config import ModelConfig

N = 16


def test_gumbel_sigmoid_statistics_and_structure():
    torch.manual_seed(0)
    cfg = S.DAMConfig(init=0.7, tau=0.5)
    dam = S.DAMMask(cfg, 1, 2, N).train()
    on = torch.stack([dam()[0] > 0.5 for _ in range(200)]).float().mean()
    p = 1 / (1 + math.exp(-0.7))  # P(alpha + G1 - G2 > 0) = sigmoid(alpha): logistic noise
    sd = math.sqrt(p * (1 - p) / (200 * N * (N + 1) / 2 * 2))
    assert abs(float(on) - p) < 5 * sd + 0.01
    m = dam()
    assert torch.equal(m, m.transpose(-1, -2))  # DAM_u: alpha (and the sample) symmetric
    st = S.DAMMask(S.DAMConfig(structured=True, init=0.0), 1, 2, N).train()
    with torch.no_grad():
        st.alpha.copy_(torch.randn(1, 2, N))
    m = st()[0]
    assert m[:, 0].eq(1).all() and m[:, -1].eq(1).all() and m[:, :, 0].eq(1).all() and m[:, :, -1].eq(1).all()
    inner = m[:, 1:-1, 1:-1]
    for d in range(-(N - 3), N - 2):  # constant along every diagonal (shared alpha and noise)
        diag = inner.diagonal(d, -2, -1)
        assert torch.allclose(diag, diag[:, :1].expand_as(diag))
    assert torch.allclose(inner.diagonal(1, -2, -1), inner.diagonal(-1, -2, -1))
    st.eval()
    assert torch.equal(st(), st())  # no noise in eval


def test_gated_attention_is_paper_eq4():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, N, 8, generator=g) for _ in range(3))
    gate = torch.rand(3, N, N, generator=g)
    kpm = torch.ones(2, N, dtype=torch.bool)
    kpm[1, 10:] = False
    out = S.gated_attention(q, k, v, gate, kpm, 0.0, None)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(~kpm[:, None, None, :], float("-inf"))
    ref = (torch.softmax(s, -1) * gate) @ v  # gated, NOT renormalised
    torch.testing.assert_close(out, ref)
    ones = S.gated_attention(q, k, v, torch.ones(3, N, N), kpm, 0.0, None)
    torch.testing.assert_close(ones, torch.softmax(s, -1) @ v)


def _dam_model(lam: float, **dam):
    cfg = ModelConfig.preset(
        "tiny",
        vocab_size=40,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_layers=1,
        max_position_embeddings=N,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention={
            "kernel": "dense",
            "token_mask": {"pattern": "dam", "seq_len": N, "block": 4, "dam": {"lam": lam, **dam}},
        },
    )
    return BertForPreTraining(cfg)


def _train(lam: float, steps: int = 40, **dam) -> BertForPreTraining:
    torch.manual_seed(0)
    m = _dam_model(lam, init=1.0, reduction="mean", **dam).train()
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(5, 40, (8, N), generator=g)
        ids[:, 1::2] = ids[:, 0::2]  # each odd position repeats its left neighbour: attention to it pays off
        labels = torch.full_like(ids, -100)
        sel = torch.rand(ids.shape, generator=g) < 0.3
        labels[sel] = ids[sel]
        inp = ids.masked_fill(sel, 4)
        out = m(inp, labels=labels)
        aux = m.auxiliary_loss()
        loss = out.loss if aux is None else out.loss + aux
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m


def test_dam_sparsity_rises_with_lambda_and_export_runs_on_sparse_kernels(tmp_path):
    models = {lam: _train(lam) for lam in (0.0, 1e-3, 1e-2, 1e-1)}
    sp = {lam: m.mask_stats()["dam/sparsity"] for lam, m in models.items()}
    # measured (seeded): 0.0, 0.006, 0.219, 0.885
    assert sp[0.0] <= sp[1e-3] <= sp[1e-2] < sp[1e-1], sp
    assert sp[0.0] < sp[1e-2] and sp[1e-1] > 0.5, sp
    assert models[0.0].auxiliary_loss() is None

    # export -> file -> stage 2 with the fixed mask; block_gather/flex match dense on it
    m = models[1e-1]
    masks = m.export_learned_masks()
    assert set(masks) == {"layer0"} and masks["layer0"].dtype == torch.bool
    assert S.sparsity(masks["layer0"]) == pytest.approx(sp[1e-1])
    path = tmp_path / "dam_masks.pt"
    S.save_masks(str(path), masks)
    stage2 = {}
    for kernel in ("dense", "block_gather", "flex"):
        c = ModelConfig.from_dict(
            {
                **m.config.to_dict(),
                "attention": {
                    "kernel": kernel,
                    "token_mask": {"pattern": "file", "path": str(path), "seq_len": N, "block": 4},
                },
            }
        )
        s2 = BertForPreTraining(c)
        sd = {k: v for k, v in m.state_dict().items() if not k.startswith("bert.dam.")}
        s2.load_state_dict(sd, strict=True)
        assert torch.equal(s2.bert.encoder.layers[0].attention.core.fixed_token_mask, masks["layer0"])
        stage2[kernel] = s2.eval()
    assert stage2["block_gather"].mask_stats()["token_mask/layer0_block_density"] < 1.0  # empty blocks skipped
    ids = torch.randint(5, 40, (2, N), generator=torch.Generator().manual_seed(5))
    am = torch.ones(2, N, dtype=torch.long)
    am[1, 12:] = 0
    outs, grads = {}, {}
    for kernel in ("dense", "block_gather"):
        o = stage2[kernel](ids, attention_mask=am).logits
        o.square().mean().backward()
        outs[kernel] = o
        grads[kernel] = {n: p.grad for n, p in stage2[kernel].named_parameters()}
    torch.testing.assert_close(outs["block_gather"], outs["dense"], atol=1e-5, rtol=1e-5)
    for n, g in grads["dense"].items():
        torch.testing.assert_close(grads["block_gather"][n], g, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(stage2["flex"](ids, attention_mask=am).logits, outs["dense"], atol=1e-5, rtol=1e-5)


def test_structured_export_gives_block_layout_and_two_stage_prune(tmp_path):
    m = _dam_model(1e-3, structured=True)
    n = N
    with torch.no_grad():  # a band of width 2 plus the forced first/last rows and columns
        m.bert.dam.alpha.copy_(torch.where(torch.arange(n) <= 2, 1.0, -1.0).expand_as(m.bert.dam.alpha))
    mask = m.export_learned_masks()["layer0"]
    i = torch.arange(n)
    want = (i[:, None] - i[None, :]).abs() <= 2
    want[[0, -1], :] = True
    want[:, [0, -1]] = True
    assert torch.equal(mask[0], want) and torch.equal(mask[1], want)
    S.save_masks(str(tmp_path / "s.pt"), {"layer0": mask})
    c = ModelConfig.from_dict(
        {
            **m.config.to_dict(),
            "attention": {
                "kernel": "block_gather",
                "token_mask": {"pattern": "file", "path": str(tmp_path / "s.pt"), "block": 2},
            },
        }
    )
    core = BertForPreTraining(c).bert.encoder.layers[0].attention.core
    assert torch.equal(core.master_layout, S.block_layout_from_mask(mask, 2))
    assert float(core.master_layout.float().mean()) < 0.75  # fully masked blocks are skipped

    # two-stage: soft P = sigmoid(alpha), prune the smallest x% per head
    soft = _dam_model(0.0, mode="soft", prune_fraction=0.8)
    with torch.no_grad():
        soft.bert.dam.alpha.normal_()
    keep = soft.export_learned_masks()["layer0"]
    assert keep.sum(dim=(-1, -2)).tolist() == [n * n - round(0.8 * n * n)] * 2
    scores = soft.bert.dam._full(soft.bert.dam.alpha.detach())[0]
    for h in range(2):  # every kept entry scores at least as high as every pruned one
        assert scores[h][keep[h]].min() >= scores[h][~keep[h]].max()


def test_dam_config_errors():
    with pytest.raises(ValueError, match="unknown key"):
        ModelConfig.preset("tiny", attention={"token_mask": {"pattern": "dam", "dam": {"lambda": 1e-3}}})
    with pytest.raises(ValueError, match="mode"):
        ModelConfig.preset("tiny", attention={"token_mask": {"pattern": "dam", "dam": {"mode": "hard"}}})
    with pytest.raises(ValueError, match="no learned mask"):
        BertForPreTraining(ModelConfig.preset("tiny")).export_learned_masks()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dam_in_half_precision_has_finite_noise_aux_loss_and_grads(dtype):
    """A module cast to fp16/bf16 (as DeepSpeed does) samples its noise and sums its L1 term in fp32: at n=128 and
    12 heads the fp16 sum used to overflow to inf, and fp16 clamp bounds rounded to 0/1 (inf noise)."""
    cfg = S.DAMConfig(init=0.5, tau=0.5, lam=1e-4)
    ref = S.DAMMask(cfg, 1, 12, 128).train()
    half = S.DAMMask(cfg, 1, 12, 128).to(dtype).train()
    for _ in range(20):
        state = torch.get_rng_state()
        m_half = half()
        torch.set_rng_state(state)
        m_ref = ref()  # the same draws: the noise no longer depends on the parameter dtype
        assert torch.isfinite(m_half).all() and m_half.dtype == torch.float32
        torch.testing.assert_close(m_half, m_ref, rtol=0, atol=0)  # init 0.5 is exact in both dtypes
        aux = half.auxiliary_loss()
        assert torch.isfinite(aux) and aux.dtype == torch.float32
        torch.testing.assert_close(aux, ref.auxiliary_loss(), rtol=1e-6, atol=0)
    assert float(m_half.sum()) > 65504  # the L1 sum (12 x 128^2 x ~0.6) is beyond fp16's range
    aux.backward()
    assert half.alpha.grad is not None and torch.isfinite(half.alpha.grad.float()).all()


def test_fp16_model_with_dam_trains_a_step_with_finite_loss():
    cfg = ModelConfig.preset(
        "tiny", vocab_size=60, attention={"kernel": "dense", "token_mask": {"pattern": "dam", "seq_len": 64}}
    )
    model = BertForPreTraining(cfg).to(torch.float16).train()
    ids = torch.randint(5, 60, (2, 64))
    labels = ids.masked_fill(torch.rand(2, 64) > 0.3, -100)
    out = model(ids, attention_mask=torch.ones(2, 64, dtype=torch.long), labels=labels)
    loss = out.loss + model.auxiliary_loss()
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad.float()).all() for p in model.parameters() if p.grad is not None)


def test_gated_attention_scales_q_before_the_half_matmul():
    """q.k of a 64-wide fp16 head passes 65504 (inf) where q.k * scale does not: q is scaled first, as SDPA does."""
    q = torch.full((1, 1, 4, 64), 40.0)
    v = torch.randn(1, 1, 4, 64)
    gate = torch.ones(1, 4, 4)
    ref = S.gated_attention(q, q, v, gate, None, 0.0, None)
    out = S.gated_attention(q.half(), q.half(), v.half(), gate, None, 0.0, None)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
