"""Packed sequences: attention kept inside each document (``doc_ids_BN``) in every kernel, against the dense
reference (outputs and q/k/v grads), against a hand-written reference, in the flex BlockMask, and end to end in
the encoder: a packed row equals each of its documents run on its own (no leakage across documents)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from model import attention as A
from model.attention.kernels.block_gather import GatherPlan, PermutationPlan, SplitPlan
from model.attention.kernels.flex import mask_mod_for
from model.attention.kernels.flex_mask import layout_block_mask
from tests.registry_cases import (
    ALL_KERNELS,
    CPU_TRAINING_KERNELS,
    CUDA_KERNELS,
    LAYOUT_EXAMPLES,
    OTHER_KERNELS,
    cpu_trains,
    upstream_grad,
)

H, D = 4, 16
LAYOUTS = {"full": lambda: None, **{name: (lambda make=make: make(H)) for name, make in LAYOUT_EXAMPLES.items()}}


def doc_ids(lengths_per_row: list[list[int]], n: int) -> torch.Tensor:
    """int64 ``[B, n]``: documents of the given lengths back to back, then padding (id -1)."""
    out = torch.full((len(lengths_per_row), n), -1, dtype=torch.int64)
    for b, lengths in enumerate(lengths_per_row):
        p = 0
        for d, length in enumerate(lengths):
            out[b, p : p + length] = d
            p += length
    return out


ROWS = [[37, 1, 50, 40], [128], [20, 60, 11]]  # ragged, a 1-token document, a whole row, a padded tail


def _inputs(B: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g).requires_grad_() for _ in range(3)]


def _run(kernel, cfg, q, k, v, kpm, doc, grad=True):
    mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=256)
    if not grad:
        with torch.no_grad():
            return mod(q, k, v, key_padding_mask_BN=kpm, doc_ids_BN=doc), None
    out = mod(q, k, v, key_padding_mask_BN=kpm, doc_ids_BN=doc)
    go = upstream_grad(out)
    return out, torch.autograd.grad(out, (q, k, v), go)


def _case(name: str):
    n = 100 if name == "blockbert_n3" else 128
    rows = [[min(x, n) for x in r] for r in ROWS]
    rows = [r if sum(r) <= n else r[:-1] for r in rows]
    doc = doc_ids(rows, n)
    return n, doc, doc >= 0


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_dense_doc_mask_matches_naive(name):
    cfg = LAYOUTS[name]()
    n, doc, kpm = _case(name)
    q, k, v = (t.detach() for t in _inputs(len(doc), n))
    out, _ = _run("dense", cfg, q, k, v, kpm, doc, grad=False)
    allow = (doc[:, None, :, None] == doc[:, None, None, :]) & kpm[:, None, None, :]
    if cfg is not None:
        lay = cfg.layout_for_length(cfg.make_layout(cfg.padded_length(256)), cfg.padded_length(n)).bool()
        allow = allow & lay.repeat_interleave(cfg.block, 1).repeat_interleave(cfg.block, 2)[None, :, :n, :n]
    s = (q @ k.transpose(-1, -2) * D**-0.5).masked_fill(~allow, float("-inf"))
    ref = torch.softmax(s, -1).nan_to_num(0.0) @ v
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kernel", CPU_TRAINING_KERNELS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_kernel_doc_mask_matches_dense_fp32_with_grads(name, kernel):
    cfg = LAYOUTS[name]()
    n, doc, kpm = _case(name)
    q, k, v = _inputs(len(doc), n)
    ref, ref_g = _run("dense", cfg, q, k, v, kpm, doc)
    out, g = _run(kernel, cfg, q, k, v, kpm, doc)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # the mask is really applied: without it the outputs differ
    plain, _ = _run(kernel, cfg, q, k, v, kpm, None, grad=False)
    assert not torch.allclose(plain, ref, atol=1e-3)


@pytest.mark.parametrize("kernel", [k for k in OTHER_KERNELS if not cpu_trains(k)])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_inference_only_kernels_doc_mask_match_dense(name, kernel):
    cfg = LAYOUTS[name]()
    n, doc, kpm = _case(name)
    q, k, v = (t.detach() for t in _inputs(len(doc), n))
    ref, _ = _run("dense", cfg, q, k, v, kpm, doc, grad=False)
    out, _ = _run(kernel, cfg, q, k, v, kpm, doc, grad=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (flex training, half-precision kernels)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", CUDA_KERNELS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_kernel_doc_mask_matches_dense_on_cuda(name, kernel, dtype):
    cfg = LAYOUTS[name]()
    n, doc, kpm = _case(name)
    q, k, v = (t.detach().to("cuda", dtype).requires_grad_() for t in _inputs(len(doc), n))
    ref, ref_g = _run("dense", cfg, q, k, v, kpm.cuda(), doc.cuda())
    out, g = _run(kernel, cfg, q, k, v, kpm.cuda(), doc.cuda())
    tol = dict(atol=1e-4, rtol=1e-3) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize("name", ["blockbert_n2", "fixed", "bigbird"])
def test_block_gather_plans_all_take_the_doc_mask(name):
    """The permutation fast path, the general gather path and the split plan (which hands document-masked calls
    to its gather fallback) each agree with dense."""
    cfg = LAYOUTS[name]()
    n, doc, kpm = _case(name)
    mod = A.BlockSparseAttention(cfg, kernel="block_gather", max_seq_length=256)
    plan = mod._plan(cfg.padded_length(n), torch.device("cpu"))
    assert isinstance(plan, (GatherPlan, PermutationPlan, SplitPlan))
    q, k, v = _inputs(len(doc), n)
    ref, ref_g = _run("dense", cfg, q, k, v, kpm, doc)
    out, g = _run("block_gather", cfg, q, k, v, kpm, doc)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("with_padding", [False, True])
@pytest.mark.parametrize("name", ["full", "fixed", "blockbert_n2", "bslongformer"])
def test_flex_doc_block_mask_equals_create_block_mask(name, with_padding):
    """Block-level document ranges give the same visited and full blocks as torch's element-wise pass."""
    cfg = LAYOUTS[name]()
    N = 512
    block = 128 if cfg is None else cfg.block
    lay = torch.ones(1, N // block, N // block, dtype=torch.bool) if cfg is None else cfg.make_layout(N).bool()
    lay = lay.expand(H, -1, -1)
    doc = doc_ids([[300, 100, 112], [128, 128, 256], [5, 500]], N)
    kpm = None
    if with_padding:
        kpm = torch.ones(3, N, dtype=torch.bool)
        kpm[2, 400:] = False
    mask_mod = mask_mod_for(lay, block, kpm, None, doc)
    ours = layout_block_mask(lay, block, N, mask_mod, kpm, None, doc)
    ref = create_block_mask(mask_mod, 3, H, N, N, device="cpu")

    def blocks(bm, full_only=False):
        num = bm.full_kv_num_blocks if full_only else bm.kv_num_blocks
        idx = bm.full_kv_indices if full_only else bm.kv_indices
        on = torch.arange(idx.shape[-1]) < num[..., None]
        m = torch.zeros(*idx.shape, dtype=torch.bool).scatter_(-1, idx.long(), on)
        return m.expand(3, *m.shape[1:])

    assert torch.equal(blocks(ours, True), blocks(ref, True))
    visited_ours, visited_ref = blocks(ours) | blocks(ours, True), blocks(ref) | blocks(ref, True)
    assert not (visited_ref & ~visited_ours).any(), "a block with attended elements was dropped"
    if cfg is None:  # without a sub-block layout the document ranges are exact (ids grow along each row)
        assert torch.equal(visited_ours, visited_ref)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, H, N, D, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(
            flex_attention(q, k, v, block_mask=ours), flex_attention(q, k, v, block_mask=ref), atol=1e-6, rtol=1e-5
        )


def test_flex_doc_block_mask_is_rebuilt_for_new_doc_ids():
    """The per-forward BlockMask cache keys on the document ids too: a new batch's ids never reuse the old mask."""
    cfg = LAYOUTS["fixed"]()
    n = 256
    mod = A.BlockSparseAttention(cfg, kernel="flex", max_seq_length=256)
    ref_mod = A.BlockSparseAttention(cfg, kernel="dense", max_seq_length=256)
    q, k, v = (t.detach() for t in _inputs(2, n))
    kpm = torch.ones(2, n, dtype=torch.bool)
    with torch.no_grad():
        for rows in ([[100, 156], [256]], [[10, 246], [128, 128]]):
            doc = doc_ids(rows, n)
            torch.testing.assert_close(
                mod(q, k, v, kpm, doc_ids_BN=doc), ref_mod(q, k, v, kpm, doc_ids_BN=doc), atol=1e-5, rtol=1e-4
            )


@pytest.mark.parametrize("kernel", ALL_KERNELS)
def test_doc_mask_with_module_padding(kernel):
    """BlockBERT n=3 pads N=100 to 144: the document ids are padded with the rest (padded keys masked)."""
    cfg = LAYOUTS["blockbert_n3"]()
    n, doc, _ = _case("blockbert_n3")
    q, k, v = (t.detach() for t in _inputs(len(doc), n))
    ref, _ = _run("dense", cfg, q, k, v, None, doc, grad=False)
    out, _ = _run(kernel, cfg, q, k, v, None, doc, grad=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# the encoder: a packed row computes what each of its documents computes alone


def _model(preset: str, kernel: str):
    from model.bert import BertForPreTraining
    from model.config import ModelConfig
    from model.presets import PRESETS

    attention = {**PRESETS[preset].get("attention", {}), "kernel": kernel}
    torch.manual_seed(0)
    return BertForPreTraining(
        ModelConfig.preset(preset, vocab_size=97, attention=attention, attention_dropout=0.0, hidden_dropout=0.0)
    ).eval()


@pytest.mark.parametrize("kernel", ALL_KERNELS)
@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])  # absolute positions; rotary + sliding windows
def test_packed_row_equals_documents_run_alone(preset, kernel):
    lengths = [[30, 1, 52, 17], [64, 36]]  # row 0: 100 tokens, row 1: 100 tokens
    N = 110  # a padded tail on every row
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 97, (2, N), generator=g)
    doc = doc_ids(lengths, N)
    am = (doc >= 0).long()
    ids = ids.masked_fill(am == 0, 0)
    model = _model(preset, kernel)
    ref_model = _model(preset, "dense")
    with torch.no_grad():
        packed = model.bert(ids, am, doc_ids=doc)
        unpacked = model.bert(ids, am)
        for b, row in enumerate(lengths):
            p = 0
            for length in row:
                alone = ref_model.bert(ids[b : b + 1, p : p + length])
                torch.testing.assert_close(packed[b, p : p + length], alone[0], atol=2e-5, rtol=1e-4)
                p += length
    # without the document ids the documents see each other (and positions run on): the check has teeth
    assert not torch.allclose(packed[0, 31:83], unpacked[0, 31:83], atol=1e-3)


def test_positions_restart_per_document():
    from model.bert import Documents

    d = Documents.from_ids(doc_ids([[3, 2, 4], [9]], 10))
    assert d.positions_BN.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7, 8, 0]]


def test_packed_training_gradients_match_dense():
    """block_gather trains a packed batch to the same loss and parameter gradients as the dense reference."""
    lengths = [[40, 24], [10, 50, 4]]
    N = 64
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 97, (2, N), generator=g)
    labels = torch.where(torch.rand(2, N, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    doc = doc_ids(lengths, N)
    grads = {}
    for kernel in ("dense", "block_gather"):
        m = _model("modernbert-tiny", kernel).train()
        out = m(ids, torch.ones_like(ids), labels=labels, doc_ids=doc)
        out.loss.backward()
        grads[kernel] = (out.loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    torch.testing.assert_close(grads["dense"][0], grads["block_gather"][0])
    for n, gr in grads["dense"][1].items():
        torch.testing.assert_close(grads["block_gather"][1][n], gr, atol=1e-5, rtol=1e-4)


def test_diet_positions_refuse_doc_ids():
    from model.bert import BertForPreTraining
    from model.config import ModelConfig

    m = BertForPreTraining(ModelConfig.preset("tiny", vocab_size=97, position={"type": "diet_rel"}))
    ids = torch.randint(5, 97, (1, 16))
    with pytest.raises(ValueError, match="doc_ids"):
        m(ids, doc_ids=torch.zeros(1, 16, dtype=torch.int64))
