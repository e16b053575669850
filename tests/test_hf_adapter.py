"""Hugging Face parity: a BertForMaskedLM's weights through from_hf give the same logits (fp32, <= 1e-4)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM
from transformers import BertForPreTraining as HFBertForPreTraining

from model.attention.module import BlockSparseAttention
from model.bert import BertForPreTraining
from model.config import ModelConfig
from tests.registry_cases import ALL_KERNELS
from tools.hf_export.stock_bert import from_hf, to_hf


def _hf_config(**kw):
    base = dict(
        vocab_size=211,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    base.update(kw)
    return BertConfig(**base)


def _batch(vocab, B=3, N=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.long)
    mask[1, 25:] = 0
    mask[2, 7:] = 0
    ids[mask == 0] = 0
    tt = torch.zeros(B, N, dtype=torch.long)
    tt[:, 20:] = 1
    return ids, mask, tt


def _randomize(module, seed=1):
    """Non-trivial LayerNorm/bias values so that a wrong mapping cannot hide behind init constants."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.mark.parametrize("kernel", ALL_KERNELS)
def test_from_hf_logits_match_bert_for_masked_lm(kernel):
    torch.manual_seed(0)
    hf = BertForMaskedLM(_hf_config()).eval()
    _randomize(hf)
    sd, config = from_hf(hf.state_dict(), hf.config)
    # a full layout on every kernel must still be exact
    config = dataclasses.replace(config, attention=dataclasses.replace(config.attention, kernel=kernel))
    ours = BertForPreTraining(config).eval()
    used = {m.kernel_name for m in ours.modules() if isinstance(m, BlockSparseAttention)}
    assert used == {kernel}
    ours.load_state_dict(sd, strict=True)
    ids, mask, tt = _batch(hf.config.vocab_size)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt).logits
        got = ours(ids, attention_mask=mask, token_type_ids=tt).logits
    valid = mask.bool()
    assert (got[valid] - ref[valid]).abs().max() <= 1e-4
    assert (got - ref).abs().max() <= 1e-4  # padded query rows too (they still attend to the real keys)


def test_labels_path_gathers_the_same_logits_and_loss():
    hf = BertForMaskedLM(_hf_config()).eval()
    _randomize(hf)
    sd, config = from_hf(hf.state_dict(), hf.config)
    ours = BertForPreTraining(config).eval()
    ours.load_state_dict(sd)
    ids, mask, tt = _batch(hf.config.vocab_size)
    labels = torch.full_like(ids, -100)
    labels[0, 3] = 5
    labels[1, 10] = 17
    labels[2, 2] = 100
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt, labels=labels)
        out = ours(ids, mask, tt, labels=labels, return_logits=True)
    assert out.logits.shape == (3, hf.config.vocab_size)
    assert torch.allclose(out.logits, ref.logits[labels != -100], atol=1e-4)
    assert abs(out.mlm_loss.item() - ref.loss.item()) < 1e-5
    assert out.mlm_count.item() == 3
    assert out.mlm_correct.item() == int((ref.logits[labels != -100].argmax(-1) == labels[labels != -100]).sum())


def test_to_hf_roundtrip_loads_into_transformers_with_nsp():
    config = ModelConfig(
        vocab_size=97,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        nsp_head=True,
    )
    ours = BertForPreTraining(config).eval()
    _randomize(ours)
    hf_sd, hf_cfg = to_hf(ours.state_dict(), config)
    hf = HFBertForPreTraining(BertConfig(**{k: v for k, v in hf_cfg.items() if k != "sparse_bert"})).eval()
    missing, unexpected = hf.load_state_dict(hf_sd, strict=False)
    assert not unexpected and not [m for m in missing if not m.endswith("position_ids")]
    ids, mask, tt = _batch(97, N=30)
    with torch.no_grad():
        a = ours(ids, mask, tt)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt)
    assert (a.logits - b.prediction_logits).abs().max() <= 1e-4
    assert (a.nsp_logits - b.seq_relationship_logits).abs().max() <= 1e-4
    back, cfg2 = from_hf(hf_sd, hf_cfg)
    assert cfg2 == config and all(torch.equal(back[k], v) for k, v in ours.state_dict().items())


def test_sparse_config_survives_export_and_bad_models_are_refused():
    config = ModelConfig.preset(
        "tiny",
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
        },
    )
    sd, hf_cfg = to_hf(BertForPreTraining(config).state_dict(), config)
    assert from_hf(sd, hf_cfg)[1] == config
    pre = ModelConfig.preset("tiny", pre_layer_norm=True)
    with pytest.raises(ValueError, match="post-LN"):
        to_hf(BertForPreTraining(pre).state_dict(), pre)
    hs = ModelConfig.preset("tiny", head_size=8)
    with pytest.raises(ValueError, match="head_size"):
        to_hf(BertForPreTraining(hs).state_dict(), hs)
    hf = BertForMaskedLM(_hf_config())
    bad = dict(hf.state_dict())
    bad["cls.predictions.decoder.weight"] = bad["cls.predictions.decoder.weight"] + 1
    with pytest.raises(ValueError, match="tied"):
        from_hf(bad, hf.config)


def test_bert_base_preset_matches_google_config(corpus):
    cfg = json.loads((corpus / "vocab" / "bert-base-uncased" / "config.json").read_text())
    p = ModelConfig.preset("bert-base")
    assert (
        p.vocab_size,
        p.hidden_size,
        p.num_layers,
        p.num_attention_heads,
        p.intermediate_size,
        p.max_position_embeddings,
        p.type_vocab_size,
        p.layer_norm_eps,
        p.hidden_act,
        p.initializer_range,
    ) == (
        cfg["vocab_size"],
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["intermediate_size"],
        cfg["max_position_embeddings"],
        cfg["type_vocab_size"],
        cfg["layer_norm_eps"],
        cfg["hidden_act"],
        cfg["initializer_range"],
    )
    assert (p.hidden_dropout, p.attention_dropout) == (cfg["hidden_dropout_prob"], cfg["attention_probs_dropout_prob"])
