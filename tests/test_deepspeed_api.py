"""The rest of deepspeed.ops.sparse_attention 0.19.5's public API, from our package: DeepSpeed's module paths, the
layout-building steps a subclass may override, SparseSelfAttention's master_layout buffer and get_layout,
BertSparseSelfAttention in bing_bert-style model code, SparseAttentionUtils on transformers 5's BERT, and the
ds_config block read as DeepSpeed's own parser read it."""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from model import attention as A
from model.attention.sparse_attention_utils import SparseAttentionUtils as U

DS_NAMES = [
    "SparsityConfig",
    "DenseSparsityConfig",
    "FixedSparsityConfig",
    "VariableSparsityConfig",
    "BigBirdSparsityConfig",
    "BSLongformerSparsityConfig",
    "LocalSlidingWindowSparsityConfig",
    "SparseSelfAttention",
    "BertSparseSelfAttention",
    "SparseAttentionUtils",
]


def test_every_public_name_and_module_path_imports():
    for name in DS_NAMES + ["MatMul", "Softmax"]:
        assert hasattr(A, name), name
    paths = {
        "sparsity_config": DS_NAMES[:7],
        "sparse_self_attention": ["SparseSelfAttention"],
        "bert_sparse_self_attention": ["BertSparseSelfAttention"],
        "sparse_attention_utils": ["SparseAttentionUtils"],
        "matmul": ["MatMul"],
        "softmax": ["Softmax"],
    }
    for mod, names in paths.items():
        m = importlib.import_module(f"model.attention.{mod}")
        for n in names:
            assert getattr(m, n) is getattr(A, n)


class _GlobalFirstRowAndColumn(A.FixedSparsityConfig):
    """A user pattern defined the way DeepSpeed documented: override one step."""

    calls: list

    def set_global_layout(self, h, layout):
        self.calls.append(("global", h))
        layout[h, 0, :] = 1
        layout[h, :, 0] = 1
        return layout

    def set_local_layout(self, h, layout):
        self.calls.append(("local", h))
        return super().set_local_layout(h, layout)


def test_a_subclass_overriding_a_step_is_honoured_in_deepspeeds_order():
    cfg = _GlobalFirstRowAndColumn(num_heads=2, block=16)
    cfg.calls = []
    lay = cfg.make_layout(256)  # 16 blocks: 4 local windows of 4 (64 on), plus row 0 and column 0 (+24)
    assert cfg.calls == [("local", 0), ("global", 0)]  # one layout head, local then global, as DeepSpeed
    assert int(lay[0].sum()) == 64 + 24 and torch.equal(lay[0], lay[1])
    base = A.FixedSparsityConfig(num_heads=2, block=16).make_layout(256)
    assert int(base[0].sum()) != int(lay[0].sum())


def test_ds_config_block_reads_as_deepspeeds_parser():
    from model.attention.layouts import from_deepspeed_block

    assert from_deepspeed_block({})["mode"] == "fixed"
    assert isinstance(A.from_ds_config(from_deepspeed_block({"block": 32}), 4), A.FixedSparsityConfig)
    bb = A.from_ds_config(from_deepspeed_block({"mode": "bigbird"}), 4)
    assert bb.num_random_blocks == 0  # DeepSpeed's parser default (the class default is 1)
    assert A.from_ds_config(from_deepspeed_block({"mode": "bigbird", "num_random_blocks": 2}), 4).num_random_blocks == 2


def test_master_layout_is_a_buffer_that_loads_deepspeed_state_dicts_strictly():
    a = A.SparseSelfAttention(A.BigBirdSparsityConfig(4, block=16, num_random_blocks=2, seed=3), max_seq_length=256)
    assert list(a.state_dict()) == ["master_layout"]
    saved = {"master_layout": a.master_layout.clone()}  # what DeepSpeed's module saved
    b = A.SparseSelfAttention(A.BigBirdSparsityConfig(4, block=16, num_random_blocks=2, seed=9), max_seq_length=256)
    assert not torch.equal(b.master_layout, saved["master_layout"])
    b.load_state_dict(saved, strict=True)
    assert torch.equal(b.get_layout(128), saved["master_layout"][:, :8, :8])
    q, k, v = (torch.randn(1, 4, 128, 8) for _ in range(3))
    torch.testing.assert_close(a(q, k, v), b(q, k, v))  # the loaded (random) layout is the one used
    with pytest.raises(ValueError, match="dividable by Block size 16"):
        b.get_layout(100)


def test_bing_bert_style_layer_stack_trains_a_step():
    config = types.SimpleNamespace(hidden_size=64, num_attention_heads=4, max_position_embeddings=256)
    layers = torch.nn.ModuleList(
        A.BertSparseSelfAttention(config, A.FixedSparsityConfig(num_heads=4)) for _ in range(2)
    )
    opt = torch.optim.SGD(layers.parameters(), lr=0.1)
    x = torch.randn(2, 128, 64)
    ext = torch.zeros(2, 1, 1, 128)
    ext[1, ..., 100:] = -10000.0  # bing_bert's extended additive mask
    h = x
    for layer in layers:
        assert layer.transpose_for_scores(h).shape == (2, 4, 128, 16)
        h = layer(h, ext)
    loss = h.pow(2).mean()
    loss.backward()
    opt.step()
    assert h.shape == (2, 128, 64) and torch.isfinite(loss)
    assert all(p.grad is not None for p in layers.parameters())


def test_hf_bert_made_sparse_padded_longer_finetuned_and_unpadded():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    model = BertForSequenceClassification(cfg).eval()
    ids = torch.randint(5, 100, (2, 100))
    mask = torch.ones(2, 100, dtype=torch.long)
    mask[1, 70:] = 0
    ref = model.bert(ids, attention_mask=mask).last_hidden_state
    # dense layout: the sparse layers must reproduce the original attention exactly
    U.replace_model_self_attention_with_sparse_self_attention(model, 128, A.DenseSparsityConfig(4, block=16))
    pad, ids_p, mask_p, tt_p, _, _ = U.pad_to_block_size(16, ids, mask, torch.zeros_like(ids), None, None, 0, None)
    assert pad == 12 and ids_p.shape == (2, 112)
    out = U.unpad_sequence_output(pad, model.bert(ids_p, attention_mask=mask_p, token_type_ids=tt_p).last_hidden_state)
    torch.testing.assert_close(out[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=1e-5)
    # longer: 128 -> 512 positions, a sparse pattern, one fine-tuning step
    U.extend_position_embedding(model, 512)
    U.replace_model_self_attention_with_sparse_self_attention(model, 512, A.BigBirdSparsityConfig(4, block=16))
    tok = types.SimpleNamespace(model_max_length=128, init_kwargs={})
    assert U.update_tokenizer_model_max_length(tok, 512).model_max_length == 512
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    long_ids = torch.randint(5, 100, (2, 500))
    pad, ids_p, mask_p, tt_p, _, _ = U.pad_to_block_size(
        16, long_ids, torch.ones_like(long_ids), torch.zeros_like(long_ids), None, None, 0, None
    )
    loss = model(ids_p, attention_mask=mask_p, token_type_ids=tt_p, labels=torch.tensor([0, 1])).loss
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and model.config.max_position_embeddings == 512
    assert model.bert.embeddings.position_embeddings.weight.shape[0] == 512
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad is not None
