"""The rest of deepspeed.ops.sparse_attention 0.19.5's public API, from model.attention.deepspeed (the peer API's
import changed, nothing else): DeepSpeed's module paths, the
layout-building steps a subclass may override, SparseSelfAttention's master_layout buffer and get_layout,
BertSparseSelfAttention in bing_bert-style model code, SparseAttentionUtils on transformers 5's BERT, and the
ds_config block read as DeepSpeed's own parser read it."""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from model.attention import deepspeed as A
from model.attention import layouts
from model.attention.deepspeed.sparse_attention_utils import SparseAttentionUtils as U

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
        m = importlib.import_module(f"model.attention.deepspeed.{mod}")
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
    from model.attention.deepspeed.ds_config import DS_PARSER_DEFAULTS, from_deepspeed_block

    assert set(DS_PARSER_DEFAULTS) == layouts.DEEPSPEED_MODES  # the modes that tolerate DeepSpeed's other keys
    assert from_deepspeed_block({})["mode"] == "fixed"
    assert isinstance(layouts.from_ds_config(from_deepspeed_block({"block": 32}), 4), A.FixedSparsityConfig)
    bb = layouts.from_ds_config(from_deepspeed_block({"mode": "bigbird"}), 4)
    assert bb.num_random_blocks == 0  # DeepSpeed's parser default (the class default is 1)
    assert (
        layouts.from_ds_config(from_deepspeed_block({"mode": "bigbird", "num_random_blocks": 2}), 4).num_random_blocks
        == 2
    )


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


# -- get_ops / ops, transpose_key_for_scores, transpose_mask_for_sparse (DeepSpeed 0.19.5's behaviour) ----------------
def _dense_reference(q, k, v, layout, block, kpm_add=None, am_mul=None):
    """softmax(q k^T / sqrt(D) + masks) v with everything outside the block layout excluded, written out densely."""
    D = q.shape[3]
    allowed = layout.repeat_interleave(block, 1).repeat_interleave(block, 2).bool()[None]  # [1, H, N, N]
    s = q.float() @ k.float().transpose(-1, -2) * D**-0.5
    if kpm_add is not None:
        s = s + kpm_add.float()[:, None, None, :]
    if am_mul is not None:
        allowed = allowed & (am_mul != 0)
    s = s.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def test_get_ops_returns_deepspeeds_three_ops_cached_per_length():
    A.SparseSelfAttention.ops.clear()
    m = A.SparseSelfAttention(A.FixedSparsityConfig(4, block=16, num_local_blocks=2), max_seq_length=128)
    sdd, dsd, softmax = m.get_ops(4, 64)
    assert isinstance(sdd, A.MatMul) and isinstance(dsd, A.MatMul) and isinstance(softmax, A.Softmax)
    assert (sdd.mode, sdd.trans_a, sdd.trans_b) == ("sdd", False, True)
    assert (dsd.mode, dsd.trans_a, dsd.trans_b) == ("dsd", False, False)
    assert all(a is b for a, b in zip(m.get_ops(4, 64), (sdd, dsd, softmax)))  # cached, class-wide
    other = A.SparseSelfAttention(A.FixedSparsityConfig(4, block=16, num_local_blocks=2), max_seq_length=128)
    assert other.get_ops(4, 64)[0] is sdd  # same layout and length: DeepSpeed's shared cache
    assert m.get_ops(4, 128)[0] is not sdd and len(A.SparseSelfAttention.ops) == 2
    dense = A.SparseSelfAttention(A.DenseSparsityConfig(4, block=16), max_seq_length=128)
    assert dense.get_ops(4, 64)[0] is not sdd  # another layout never reuses the cached ops (DeepSpeed's did)
    with pytest.raises(ValueError, match="dividable by Block size 16"):
        m.get_ops(4, 40)


def test_transpose_key_for_scores_and_mask_for_sparse_follow_deepspeed():
    m = A.SparseSelfAttention(A.DenseSparsityConfig(2, block=16), max_seq_length=64)
    k = torch.arange(2 * 2 * 32 * 8.0).view(2, 2, 32, 8)
    assert m.transpose_key_for_scores(k, 32) is k
    assert torch.equal(m.transpose_key_for_scores(k.transpose(2, 3).contiguous(), 32), k)
    kpm = torch.tensor([[1, 1, 0]], dtype=torch.bool).view(1, 1, 1, 3)
    out = m.transpose_mask_for_sparse(torch.float16, kpm, is_key_padding_mask=True)
    assert out.dtype == torch.float16 and out.tolist() == [[1.0, 1.0, 0.0]]  # batch dim kept even when it is 1
    am = torch.ones(1, 1, 3, 3, dtype=torch.int64)
    out = m.transpose_mask_for_sparse(torch.bfloat16, am)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_through_get_ops_equals_the_dense_reference(dtype):
    """A subclass that overrides get_ops has its ops run by forward (DeepSpeed's path); the plain module runs its
    kernel; both equal the dense reference, forward and backward, with an additive padding and a mul attn mask."""
    calls = []

    class Counting(A.SparseSelfAttention):
        def get_ops(self, H, L):
            calls.append((H, L))
            return super().get_ops(H, L)

        def transpose_mask_for_sparse(self, qtype, x, is_key_padding_mask=False):
            calls.append(("mask", is_key_padding_mask))
            return super().transpose_mask_for_sparse(qtype, x, is_key_padding_mask)

    cfg = A.FixedSparsityConfig(4, block=16, num_local_blocks=2, num_global_blocks=1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 8, generator=g).to(dtype).requires_grad_() for _ in range(3))
    kpm = torch.zeros(2, 64)
    kpm[1, 50:] = -10000.0
    am = torch.ones(64, 64)
    am[3, 5] = 0
    layout = cfg.make_layout(64)
    want = _dense_reference(q, k, v, layout, 16, kpm, am)
    (gq_want,) = torch.autograd.grad(want.float().sum(), q)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for module in (Counting(cfg, max_seq_length=64), A.SparseSelfAttention(cfg, max_seq_length=64)):
        out = module(q, k.transpose(2, 3), v, key_padding_mask=kpm.view(2, 1, 1, 64), attn_mask=am)
        torch.testing.assert_close(out.float(), want.float(), **tol)
        (gq,) = torch.autograd.grad(out.float().sum(), q)
        torch.testing.assert_close(gq.float(), gq_want.float(), **tol)
    assert calls == [("mask", True), ("mask", False), (4, 64)]


def test_the_deepspeed_path_never_asks_the_device_for_a_python_bool(monkeypatch):
    """A forward with additive masks makes no host sync: Tensor.__bool__ / .item() would make the host wait for the
    device on every layer call (a CPU step counts them)."""
    m = A.SparseSelfAttention(A.FixedSparsityConfig(4, block=16, num_local_blocks=2), max_seq_length=64, kernel="dense")
    q, k, v = (torch.randn(2, 4, 64, 8) for _ in range(3))
    kpm = torch.zeros(2, 64)
    kpm[1, 40:] = float("-inf")
    syncs = []

    def counting(real):
        def wrapper(self):
            caller = sys._getframe(1).f_code
            # model/cpu_shortcuts.py's CPU-only shortcuts read only CPU tensors (no device to wait for)
            if not (caller.co_filename.endswith("model/cpu_shortcuts.py") and self.device.type == "cpu"):
                syncs.append(f"{caller.co_filename}:{caller.co_name}")
            return real(self)

        return wrapper

    for name in ("__bool__", "item"):
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    out = m(q, k, v, key_padding_mask=kpm, attn_mask=torch.ones(64, 64))
    monkeypatch.undo()
    assert syncs == [] and torch.isfinite(out).all()


def test_the_encoder_never_loads_the_deepspeed_package():
    """The compatibility layer is for ported code only: building and running our model does not import it (so the
    Hugging Face export, which copies what the model imports, does not carry it either)."""
    import subprocess

    code = (
        "import sys, torch\n"
        "from model.bert import BertForPreTraining\n"
        "from model.config import ModelConfig\n"
        "m = BertForPreTraining(ModelConfig.preset('tiny', attention={'sparsity': {'mode': 'fixed', 'block': 16}}))\n"
        "m(torch.randint(0, 100, (1, 64)))\n"
        "print(sorted(n for n in sys.modules if n.startswith('model.attention.deepspeed')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
