"""Packed rows without an N x N mask (issue #47 item 3): the collator's ``cu_seqlens``, dense attention's varlen
route (model/attention/kernels/varlen.py) against the same-document mask (the reference), packed rows without a
padding mask, and the route's start-up line.

No GPU here: the route's CUDA call is replaced by a stand-in that checks what torch's FlashAttention varlen kernel
would be given (int32 offsets over the flattened batch, ``[T, H, D]`` views, max length N) and computes it one
document at a time (:func:`per_segment_attention`); the route is refused on CPU and dense applies the mask. The
``gpu`` tests run the real kernel against the mask on a GPU.
"""

from __future__ import annotations

import pytest
import torch

import model.attention.kernels.dense as dense_module
import model.attention.kernels.varlen as varlen
from data_pipeline.collate import segment_offsets
from model.attention.kernels import get_kernel
from model.attention.kernels.varlen import per_segment_attention, refusal, route_line
from model.bert import BertForPreTraining
from model.config import ModelConfig
from pretrain.trainer import device_batch

B, H, N, D = 3, 4, 24, 8


def _doc_ids() -> torch.Tensor:
    """Three packed rows: documents of 7 + 9 tokens and 8 of padding; one document filling the row; 5 documents and
    2 tokens of padding."""
    rows = [[0] * 7 + [1] * 9 + [-1] * 8, [0] * N, [0] * 3 + [1] * 6 + [2] * 4 + [3] * 5 + [4] * 4 + [-1] * 2]
    return torch.tensor(rows)


def test_segment_offsets_are_the_runs_of_each_row():
    cu = segment_offsets(_doc_ids())
    assert cu.dtype == torch.int64  # as every batch tensor; the model hands FlashAttention int32
    assert cu.tolist() == [0, 7, 16, 24, 48, 51, 57, 61, 66, 70, 72]


class _FlashStandIn:
    """Replaces varlen._flash_varlen: checks its inputs as torch's varlen kernel needs them, computes per document."""

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, q, k, v, cu, n, dropout_p, scale):
        assert q.dim() == 3 and q.shape == k.shape == v.shape and q.stride(-1) == 1
        assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == q.shape[0]
        assert n == N and int((cu[1:] - cu[:-1]).max()) <= n
        self.calls.append(dropout_p)
        out = per_segment_attention(*(t.unflatten(0, (-1, n)).transpose(1, 2) for t in (q, k, v)), cu, dropout_p, scale)
        return out.transpose(1, 2).flatten(0, 1)


@pytest.fixture
def emulated_cuda(monkeypatch):
    """The varlen route taken on CPU tensors, through the stand-in."""
    stand_in = _FlashStandIn()
    monkeypatch.setattr(varlen, "_flash_varlen", stand_in)
    monkeypatch.setattr(dense_module, "varlen_refusal", lambda q, p: None)
    return stand_in


def _qkv(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g, requires_grad=True) for _ in range(3)]


def _dense(q, k, v, **kw):
    kernel = get_kernel("dense")
    return kernel(q, k, v, plan=kernel.make_plan(None, 16, N, torch.device("cpu")), training=True, **kw)


@pytest.mark.parametrize("kernel", ["dense", "auto"])
def test_the_varlen_route_equals_the_document_mask(emulated_cuda, kernel):
    """Outputs and q/k/v gradients of the varlen route (no mask) equal the same-document mask's at every real token;
    the padding run attends to itself instead of returning zeros (its outputs carry no label)."""
    docs = _doc_ids()
    real = (docs >= 0)[:, None, :, None]
    grads = []
    outs = []
    for kw in ({"key_padding_mask_BN": docs >= 0}, {"cu_seqlens": segment_offsets(docs)}):
        q, k, v = _qkv()
        kern = get_kernel(kernel)
        plan = kern.make_plan(None, 16, N, torch.device("cpu"))
        out = kern(q, k, v, plan=plan, training=True, doc_ids_BN=docs, **kw)
        (out * real).square().sum().backward()
        outs.append(out * real)
        grads.append([t.grad for t in (q, k, v)])
    assert emulated_cuda.calls == [0.0]  # the second call took the route, once
    torch.testing.assert_close(outs[1], outs[0])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want)


def test_the_route_is_refused_where_something_else_masks(emulated_cuda):
    """A key mask, a token mask or a layout keeps the same-document mask (the route knows only the documents)."""
    q, k, v = _qkv()
    docs = _doc_ids()
    _dense(q, k, v, doc_ids_BN=docs, cu_seqlens=segment_offsets(docs), key_padding_mask_BN=docs >= 0)
    _dense(q, k, v, doc_ids_BN=docs, cu_seqlens=segment_offsets(docs), token_mask=torch.ones(N, N, dtype=torch.bool))
    assert emulated_cuda.calls == []


def test_attention_dropout_reaches_the_varlen_kernel(emulated_cuda):
    """With attention dropout the route hands the probability to the kernel (torch's flash op applies it); outside
    training it hands 0."""
    q, k, v = _qkv()
    docs = _doc_ids()
    kernel = get_kernel("dense")
    plan = kernel.make_plan(None, 16, N, torch.device("cpu"))
    for training in (True, False):
        kernel(q, k, v, plan=plan, dropout_p=0.1, training=training, doc_ids_BN=docs, cu_seqlens=segment_offsets(docs))
    assert emulated_cuda.calls == [0.1, 0.0]


def test_per_segment_attention_is_the_document_mask():
    """The route's reference (one SDPA call per run) against dense's mask at the real tokens, fp32."""
    q, k, v = _qkv(1)
    docs = _doc_ids()
    real = (docs >= 0)[:, None, :, None]
    want = _dense(q, k, v, doc_ids_BN=docs, key_padding_mask_BN=docs >= 0)
    got = per_segment_attention(q, k, v, segment_offsets(docs))
    torch.testing.assert_close(got * real, want * real)


def _packed_batch() -> dict[str, torch.Tensor]:
    docs = _doc_ids()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 100, (B, N), generator=g).masked_fill(docs < 0, 0)
    labels = torch.full((B, N), -100)
    chosen = (torch.rand(B, N, generator=g) < 0.3) & (docs >= 0)
    labels[chosen] = ids[chosen]
    return {
        "input_ids": ids,
        "attention_mask": (docs >= 0).long(),
        "token_type_ids": torch.zeros(B, N, dtype=torch.long),
        "labels": labels,
        "doc_ids": docs,
        "cu_seqlens": segment_offsets(docs),
    }


@pytest.mark.parametrize("route", ["mask", "varlen"])
def test_packed_rows_train_without_a_padding_mask(route, request):
    """The trainer drops a packed batch's attention mask (pretrain.trainer.device_batch: padding is document -1, so
    no real token attends to it): the MLM loss and every gradient equal the masked batch's, through the same-document
    mask (CPU) and through the varlen route (emulated CUDA)."""
    stand_in = request.getfixturevalue("emulated_cuda") if route == "varlen" else None
    config = ModelConfig.preset(
        "tiny", vocab_size=100, max_position_embeddings=N, hidden_dropout=0.0, attention_dropout=0.0
    )
    torch.manual_seed(0)
    model = BertForPreTraining(config).train()
    host = _packed_batch()
    fed = device_batch(host, torch.device("cpu"), 8)
    assert "attention_mask" not in fed and "cu_seqlens" in fed
    results = []
    for inputs in ({k: v for k, v in host.items() if k != "cu_seqlens"} | {"max_predictions": 8}, fed):
        model.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (want, want_g), (got, got_g) = results
    torch.testing.assert_close(got, want)
    assert got_g.keys() == want_g.keys()
    for name in want_g:
        torch.testing.assert_close(got_g[name], want_g[name], msg=name)
    assert stand_in is None or len(stand_in.calls) == config.num_layers  # every layer took the route


def test_the_route_line_says_which_path_packed_rows_take():
    """Explicit, never silent: varlen_attn without dropout; torch's flash op with dropout; the mask where refused."""
    h100 = (9, 0)
    assert "varlen_attn over cu_seqlens" in route_line("cuda", torch.bfloat16, 64, 0.0, h100)
    with_dropout = route_line("cuda", torch.bfloat16, 64, 0.1, h100)
    assert "attention dropout 0.1 in the kernel" in with_dropout and "_flash_attention_forward" in with_dropout
    assert "same-document mask" in route_line("cpu", torch.float32, 64, 0.0)
    assert "fp16/bf16" in route_line("cuda", torch.float32, 64, 0.0, h100)
    assert "multiple of 8" in route_line("cuda", torch.bfloat16, 36, 0.0, h100)
    assert refusal("cuda", torch.float16, 128, 0.1, (8, 0)) is None


@pytest.mark.parametrize("gpu, capability", [("T4", (7, 5)), ("V100", (7, 0))])
def test_varlen_is_refused_below_sm80_with_the_fallback_named(emulated_cuda, monkeypatch, gpu, capability):
    """FlashAttention's varlen kernel needs sm80+: on a T4 or a V100 (compute capability emulated) the start-up line
    names the same-document mask and why, as the trainer prints it (it passes no capability: the GPU's is read), and
    the packed forward takes that mask instead of the kernel (which would raise there); on an A100 the route runs."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    line = route_line("cuda", torch.float16, 64, 0.1)
    assert "same-document mask" in line and f"sm{capability[0]}{capability[1]}" in line and "sm80" in line
    assert "varlen_attn" not in line and "_flash_attention_forward" not in line
    monkeypatch.setattr(dense_module, "varlen_refusal", varlen.varlen_refusal)  # the real rule, on emulated CUDA
    monkeypatch.setattr(varlen, "_device_of", lambda q: ("cuda", torch.cuda.get_device_capability()))
    q, k, v = (t.detach().half() for t in _qkv())
    docs = _doc_ids()
    real = (docs >= 0)[:, None, :, None]
    out = _dense(q, k, v, doc_ids_BN=docs, cu_seqlens=segment_offsets(docs))
    assert emulated_cuda.calls == []  # the kernel was not called
    want = _dense(q, k, v, doc_ids_BN=docs, key_padding_mask_BN=docs >= 0)
    torch.testing.assert_close(out * real, want * real)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "varlen_attn over cu_seqlens" in route_line("cuda", torch.float16, 64, 0.0)
    _dense(q, k, v, doc_ids_BN=docs, cu_seqlens=segment_offsets(docs))
    assert emulated_cuda.calls == [0.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gpu_varlen_kernel_against_the_mask(dtype, dropout):
    """On a GPU: torch's varlen kernel (dropout 0) against SDPA with the same-document mask at the real tokens,
    outputs and gradients (bf16/fp16 tolerance); with dropout 0.1 (torch's flash op), the mean over 64 draws of
    the output is the undropped output within a statistical bound, and the kernel was called with it."""
    dev = torch.device("cuda")
    BH, NH, NN, DD = 4, 12, 512, 64
    g = torch.Generator().manual_seed(0)
    lengths = [[300, 150, 62], [512], [100, 100, 100, 100, 80, 32], [400, 112]]
    docs = torch.cat([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r))[None] for r in lengths])
    cu = segment_offsets(docs).to(dev)
    docs = docs.to(dev)
    qkv = [torch.randn(BH, NH, NN, DD, generator=g).to(dev, dtype).requires_grad_() for _ in range(3)]
    kernel = get_kernel("dense")
    plan = kernel.make_plan(None, 16, NN, dev)
    want = kernel(*qkv, plan=plan, training=True, doc_ids_BN=docs)
    if dropout == 0.0:
        got = kernel(*qkv, plan=plan, training=True, doc_ids_BN=docs, cu_seqlens=cu)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        gw = torch.autograd.grad(want.float().square().sum(), qkv)
        gg = torch.autograd.grad(got.float().square().sum(), qkv)
        for a, b in zip(gg, gw):
            torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
        return
    draws = torch.stack(
        [
            kernel(*qkv, plan=plan, dropout_p=dropout, training=True, doc_ids_BN=docs, cu_seqlens=cu).float()
            for _ in range(64)
        ]
    )
    assert not torch.equal(draws[0], draws[1])  # dropped differently per call
    err = (draws.mean(0) - want.float()).abs().mean() / want.float().abs().mean()
    assert err < 0.1, err
    draws.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in qkv)
