"""The encoder: configs, presets, attention chosen from the config (per layer too), heads, layout state."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import AttentionConfig, ModelConfig

TINY = dict(
    vocab_size=101,
    hidden_size=32,
    num_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=128,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
BIGBIRD = {"mode": "bigbird", "block": 16, "num_random_blocks": 1, "different_layout_per_head": True, "seed": 3}
BLOCKBERT3 = {"mode": "blockbert", "num_blocks": 3, "head_assignment": "2:1:1", "block": 16}


def _batch(B=2, N=70, vocab=101, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.long)
    mask[1, 50:] = 0
    labels = torch.full((B, N), -100)
    labels[:, ::7] = ids[:, ::7]
    labels[mask == 0] = -100
    return ids, mask, labels


def test_presets_and_strict_dicts():
    base = ModelConfig.preset("bert-base")
    assert (base.hidden_size, base.num_layers, base.num_attention_heads) == (768, 12, 12)
    large = ModelConfig.preset("bert-large")
    sizes = (large.hidden_size, large.num_layers, large.num_attention_heads, large.intermediate_size)
    assert sizes == (1024, 24, 16, 4096)
    bb = ModelConfig.preset("blockbert-base-n3")
    assert bb.attention.sparsity["head_assignment"] == "8:2:2"
    assert ModelConfig.from_dict(bb.to_dict()) == bb
    with pytest.raises(ValueError, match=r"\['hiden_size'\]"):
        ModelConfig.from_dict({"hiden_size": 3})
    with pytest.raises(ValueError, match=r"\['kernal'\]"):
        ModelConfig.from_dict({"attention": {"kernal": "dense"}})
    with pytest.raises(ValueError, match="unknown attention kernel"):
        AttentionConfig(kernel="triton")
    with pytest.raises(ValueError, match="per_layer has 1 entries"):
        ModelConfig(**TINY, attention=AttentionConfig(per_layer=[{}]))
    with pytest.raises(ValueError, match=r"attention.sparsity: head_assignment"):
        ModelConfig(**TINY, attention={"sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "10:2"}})
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig(**dict(TINY, hidden_size=30))
    # layout modes and keys are checked when the AttentionConfig is parsed, before any model or head count
    with pytest.raises(ValueError, match=r"attention.sparsity: sparse_attention mode 'bogus'"):
        AttentionConfig(sparsity={"mode": "bogus"})
    with pytest.raises(ValueError, match=r"attention.per_layer\[1\].sparsity: unknown key\(s\) \['num_lcoal_blocks'\]"):
        AttentionConfig(per_layer=[{}, {"sparsity": {"mode": "fixed", "num_lcoal_blocks": 2}}])
    # frozen: a setting changed after parsing would be ignored, so changing one is an error (use dataclasses.replace)
    with pytest.raises(dataclasses.FrozenInstanceError):
        AttentionConfig().kernel = "dense"


def test_attention_from_config_per_layer():
    cfg = ModelConfig(
        **TINY,
        attention=AttentionConfig(
            kernel="block_gather", sparsity=BIGBIRD, per_layer=[{}, {"kernel": "dense", "sparsity": None}]
        ),
    )
    m = BertForPreTraining(cfg)
    c0, c1 = (layer.attention.core for layer in m.bert.encoder.layers)
    assert c0.kernel_name == "block_gather" and type(c0.sparsity_config).__name__ == "BigBirdSparsityConfig"
    assert c1.kernel_name == "dense" and c1.sparsity_config is None


@pytest.mark.parametrize("sparsity", [BIGBIRD, BLOCKBERT3], ids=["bigbird", "blockbert_n3_padded"])
def test_sparse_model_same_on_every_kernel_and_trains(sparsity):
    torch.manual_seed(0)
    ref = BertForPreTraining(ModelConfig(**TINY, attention={"kernel": "dense", "sparsity": sparsity}))
    fast = BertForPreTraining(ModelConfig(**TINY, attention={"kernel": "block_gather", "sparsity": sparsity}))
    fast.load_state_dict(ref.state_dict())
    ids, mask, labels = _batch()  # N=70: not a block multiple; n=3 pads to 96
    a = ref(ids, mask, labels=labels)
    b = fast(ids, mask, labels=labels)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-4)
    a.loss.backward()
    b.loss.backward()
    for (n, p), q in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=n)
    with torch.no_grad():
        c = BertForPreTraining(ModelConfig(**TINY, attention={"kernel": "flex", "sparsity": sparsity}))
        c.load_state_dict(ref.state_dict())
        torch.testing.assert_close(c(ids, mask).logits, ref(ids, mask).logits, atol=1e-5, rtol=1e-4)


def test_sparsity_changes_the_function():
    torch.manual_seed(0)
    dense = BertForPreTraining(ModelConfig(**TINY))
    sparse = BertForPreTraining(ModelConfig(**TINY, attention={"sparsity": BLOCKBERT3}))
    sparse.load_state_dict(dense.state_dict())
    ids, mask, _ = _batch()
    with torch.no_grad():
        assert (dense(ids, mask).logits - sparse(ids, mask).logits).abs().max() > 1e-3


def test_mlm_gather_equals_full_logits_and_nsp_head():
    torch.manual_seed(0)
    m = BertForPreTraining(ModelConfig(**TINY, nsp_head=True)).eval()
    ids, mask, labels = _batch()
    nsl = torch.tensor([0, 1])
    with torch.no_grad():
        full = m(ids, mask)
        out = m(ids, mask, labels=labels, next_sentence_label=nsl, return_logits=True)
    assert full.logits.shape == (2, 70, 101) and full.loss is None
    torch.testing.assert_close(out.logits, full.logits[labels != -100])
    want = torch.nn.functional.cross_entropy(full.logits[labels != -100], labels[labels != -100])
    torch.testing.assert_close(out.mlm_loss, want)
    torch.testing.assert_close(out.nsp_loss, torch.nn.functional.cross_entropy(full.nsp_logits, nsl))
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)
    assert out.mlm_count == (labels != -100).sum()
    assert m.auxiliary_loss() is None
    with pytest.raises(ValueError, match="nsp_head"):
        BertForPreTraining(ModelConfig(**TINY))(ids, mask, next_sentence_label=nsl)


def test_no_labels_in_batch_gives_zero_loss_with_graph():
    m = BertForPreTraining(ModelConfig(**TINY))
    ids, mask, labels = _batch()
    out = m(ids, mask, labels=torch.full_like(labels, -100))
    assert out.loss.item() == 0.0 and out.mlm_count.item() == 0
    out.loss.backward()


def test_head_size_and_pre_ln():
    cfg = ModelConfig(
        **TINY, head_size=12, pre_layer_norm=True, attention={"kernel": "block_gather", "sparsity": BIGBIRD}
    )
    m = BertForPreTraining(cfg)
    assert m.bert.encoder.layers[0].attention.qkv.weight.shape == (3 * 4 * 12, 32)
    assert m.bert.encoder.layers[0].attention.out_proj.weight.shape == (32, 48)
    assert m.bert.encoder.final_layer_norm is not None
    ids, mask, labels = _batch()
    out = m(ids, mask, labels=labels)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_layout_state_roundtrip_restores_random_layouts():
    cfg_a = ModelConfig(**TINY, attention={"kernel": "block_gather", "sparsity": dict(BIGBIRD, seed=1)})
    cfg_b = ModelConfig(**TINY, attention={"kernel": "block_gather", "sparsity": dict(BIGBIRD, seed=2)})
    torch.manual_seed(0)
    a = BertForPreTraining(cfg_a).eval()
    b = BertForPreTraining(cfg_b).eval()
    b.load_state_dict(a.state_dict())
    ids, mask, _ = _batch()
    with torch.no_grad():
        assert not torch.allclose(a(ids, mask).logits, b(ids, mask).logits)
        state = a.layout_state()
        assert set(state) == {"layer0", "layer1"} and state["layer0"].dtype == torch.int64
        b.load_layout_state(state)
        torch.testing.assert_close(a(ids, mask).logits, b(ids, mask).logits)
    with pytest.raises(ValueError, match="expected"):
        b.load_layout_state({"layer0": state["layer0"]})


def test_too_long_input_is_a_clear_error():
    m = BertForPreTraining(ModelConfig(**TINY))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        m(torch.ones(1, 129, dtype=torch.long))


def test_static_mlm_gather_equals_the_boolean_mask_path():
    """max_predictions gathers B x k positions with fixed shapes: same loss, counts and gradients as the dynamic
    boolean-mask selection, including a row without labels and a row that uses all k slots."""
    from model.bert import BertForPreTraining
    from model.config import ModelConfig

    torch.manual_seed(0)
    model = BertForPreTraining(ModelConfig.preset("tiny", vocab_size=60, hidden_dropout=0.0, attention_dropout=0.0))
    ids = torch.randint(5, 60, (3, 16))
    labels = torch.full((3, 16), -100)
    labels[0, [1, 4, 9]] = ids[0, [1, 4, 9]]
    labels[2, [0, 2, 3, 5, 15]] = ids[2, [0, 2, 3, 5, 15]]  # row 1 has none; row 2 fills k = 5
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 12:] = 0
    outs, grads = [], []
    for k in (None, 5):
        model.zero_grad()
        out = model(ids, attention_mask=mask, labels=labels, max_predictions=k)
        out.loss.backward()
        outs.append(out)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    dyn, static = outs
    torch.testing.assert_close(static.loss, dyn.loss, rtol=1e-6, atol=1e-6)
    assert int(static.mlm_count) == int(dyn.mlm_count) == 8 and int(static.mlm_correct) == int(dyn.mlm_correct)
    assert static.logits is None  # the chunked loss keeps none
    assert model(ids, attention_mask=mask, labels=labels, max_predictions=5, return_logits=True).logits.shape == (
        3,
        5,
        60,
    )
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError, match="more labelled positions than max_predictions"):
        model(ids, attention_mask=mask, labels=labels, max_predictions=4)


def test_qkv_split_backward_writes_one_gradient_buffer():
    """The q/k/v split's backward stacks three gradients into one [3, B, H, N, D] buffer: no select_backward, so
    no zero-filled full-size tensor per q, k and v, no adds of them (bf3efde's eager GPU profile: ~19 ms of a 140 ms
    step). Counted in one attention layer's backward; the gradient equals the one through plain indexing."""
    from torch.profiler import ProfilerActivity, profile

    model = BertForPreTraining(ModelConfig(**TINY)).eval()
    attn = next(m for m in model.modules() if type(m).__name__ == "BertSelfAttention")
    x_BND = torch.randn(2, 32, TINY["hidden_size"], requires_grad=True)
    out = attn(x_BND, None)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out.sum().backward()
    names = [e.name for e in prof.events()]
    assert names.count("aten::select_backward") == 0, sorted(set(names))
    assert names.count("aten::stack") >= 1 or names.count("aten::cat") >= 1, sorted(set(names))

    # the same gradient as indexing q, k, v out of the projection one by one
    grad = x_BND.grad.clone()
    x_BND.grad = None
    B, N, _ = x_BND.shape
    qkv = attn.qkv(x_BND).view(B, N, 3, attn.num_heads, attn.head_size).permute(2, 0, 3, 1, 4)
    ctx = attn.core(qkv[0], qkv[1], qkv[2], key_padding_mask_BN=None, score_bias=None)
    attn.out_proj(ctx.transpose(1, 2).reshape(B, N, -1)).sum().backward()
    torch.testing.assert_close(x_BND.grad, grad, rtol=0, atol=0)
