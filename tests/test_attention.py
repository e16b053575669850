"""Every kernel agrees with the dense reference for every layout (outputs and q/k/v grads), and the dense
reference agrees with a naive softmax(QK^T) implementation of DeepSpeed's semantics."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from model import attention as A
from model.attention.deepspeed import SparseSelfAttention
from model.attention.kernels.block_gather import (
    GatherPlan,
    PermutationPlan,
    SplitPlan,
    make_gather_plan,
    query_tile_factor,
)
from tests.registry_cases import (
    ALL_KERNELS,
    CPU_TRAINING_KERNELS,
    CUDA_KERNELS,
    LAYOUT_EXAMPLES,
    OTHER_KERNELS,
    cpu_trains,
    upstream_grad,
)


@pytest.fixture(autouse=True)
def _fail_on_recompile_limit(fail_on_recompile_limit):
    """Every test of this module runs with ``fail_on_recompile_limit`` (tests/conftest.py)."""


H, D, B = 4, 16, 2

LAYOUTS = {name: (lambda make=make: make(H)) for name, make in LAYOUT_EXAMPLES.items()}


def _inputs(n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def _padding(n, kind):
    if kind == "none":
        return None
    kpm = torch.ones(B, n, dtype=torch.bool)
    if kind == "tail":
        kpm[0, n - 37 :] = False  # ragged, not block aligned
        kpm[1, :20] = False  # leading keys: local/uni layouts get rows with no key left -> zeros
    elif kind == "all":
        kpm[1] = False  # one sequence fully padded: every row masked
    return kpm


def _run(kernel, cfg, q, k, v, kpm, grad=True):
    mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=256)
    if not grad:
        with torch.no_grad():
            return mod(q, k, v, key_padding_mask_BN=kpm), None
    out = mod(q, k, v, key_padding_mask_BN=kpm)
    go = upstream_grad(out)
    grads = torch.autograd.grad(out, (q, k, v), go)
    return out, grads


def _naive(q, k, v, layout, block, kpm=None, rpe=None, kpm_add=None, attn_add=None, token_mask=None):
    """softmax over allowed keys, written out by hand (rows with no allowed key -> 0)."""
    n = q.shape[2]
    s = q.float() @ k.float().transpose(-1, -2) * q.shape[-1] ** -0.5
    if rpe is not None:
        s = s + rpe
    if kpm_add is not None:
        s = s + kpm_add[:, None, None, :]
    if attn_add is not None:
        s = s + attn_add
    allow = torch.ones(1, 1, n, n, dtype=torch.bool)
    if layout is not None:
        allow = allow & layout.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)[None, :, :n, :n]
    if kpm is not None:
        allow = allow & kpm[:, None, None, :]
    if token_mask is not None:
        allow = allow & token_mask
    s = s.masked_fill(~allow, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v.float()


@pytest.mark.parametrize("pad", ["none", "tail", "all"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_dense_reference_matches_naive(name, pad):
    cfg = LAYOUTS[name]()
    n = 100 if name == "blockbert_n3" else 128
    q, k, v = _inputs(n)
    kpm = _padding(n, pad)
    out, _ = _run("dense", cfg, q, k, v, kpm, grad=False)
    layout = cfg.layout_for_length(cfg.make_layout(cfg.padded_length(256)), cfg.padded_length(n))
    ref = _naive(q, k, v, layout, cfg.block, kpm)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_every_registered_layout_mode_has_an_example():
    from tests.registry_cases import missing_layout_examples

    assert not missing_layout_examples(H), "add an entry to tests/registry_cases.py LAYOUT_EXAMPLES"


@pytest.mark.parametrize("pad", ["none", "tail", "all"])
@pytest.mark.parametrize("kernel", CPU_TRAINING_KERNELS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_kernel_matches_dense_fp32_with_grads(name, kernel, pad):
    cfg = LAYOUTS[name]()
    n = 100 if name == "blockbert_n3" else 128  # n3: 100 is padded to 144 (never truncated)
    q, k, v = _inputs(n)
    kpm = _padding(n, pad)
    ref, ref_g = _run("dense", cfg, q, k, v, kpm)
    out, g = _run(kernel, cfg, q, k, v, kpm)
    assert out.shape == (B, H, n, D)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for a, b in zip(g, ref_g):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    if pad == "all":
        assert out[1].abs().max() == 0 and g[0][1].abs().max() == 0  # fully masked rows: zeros, zero grads


@pytest.mark.parametrize("pad", ["none", "tail"])
@pytest.mark.parametrize("kernel", [k for k in OTHER_KERNELS if not cpu_trains(k)])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_inference_only_kernels_match_dense_cpu(name, kernel, pad):
    cfg = LAYOUTS[name]()
    n = 100 if name == "blockbert_n3" else 128
    q, k, v = (t.detach() for t in _inputs(n))
    kpm = _padding(n, pad)
    with torch.no_grad():
        ref, _ = _run("dense", cfg, q, k, v, kpm, grad=False)
        out, _ = _run(kernel, cfg, q, k, v, kpm, grad=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_flex_training_on_cpu_is_a_clear_error():
    cfg = LAYOUTS["fixed"]()
    q, k, v = _inputs(128)
    with pytest.raises(RuntimeError, match="no backward on CPU"):
        _run("flex", cfg, q, k, v, None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", CPU_TRAINING_KERNELS)
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_half_precision_loose(name, kernel, dtype):
    cfg = LAYOUTS[name]()
    q, k, v = _inputs(128, dtype)
    kpm = _padding(128, "tail")
    try:
        ref, ref_g = _run("dense", cfg, q, k, v, kpm)
    except RuntimeError as e:  # pragma: no cover - depends on the CPU build
        pytest.skip(f"SDPA in {dtype} not supported on this CPU: {e}")
    out, g = _run(kernel, cfg, q, k, v, kpm)
    tol = dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (flex training, fp16/bf16 kernels)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", CUDA_KERNELS)
@pytest.mark.parametrize("n", [128, 250])  # 250: not a multiple of any example's block, the last block is cut
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_kernels_match_dense_on_cuda(name, kernel, dtype, n):
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 needs compute capability 8.0+")
    if kernel == "flex" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("explicit flex is refused below sm80 (tests/test_cuda_contracts.py)")
    cfg = LAYOUTS[name]()
    q, k, v = (t.detach().cuda().requires_grad_() for t in _inputs(n, dtype))
    kpm = _padding(n, "tail").cuda()
    ref, ref_g = _run("dense", cfg, q, k, v, kpm)
    out, g = _run(kernel, cfg, q, k, v, kpm)
    tol = dict(atol=1e-4, rtol=1e-3) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize("kernel", ALL_KERNELS)
def test_token_mask_and_score_bias_inside_kernels(kernel):
    """Element masks within blocks (SparseBERT) and additive per-head biases (DIET) inside every kernel."""
    cfg = LAYOUTS["bigbird"]()
    n = 128
    q, k, v = _inputs(n)
    g = torch.Generator().manual_seed(3)
    token_mask = torch.rand(H, n, n, generator=g) > 0.3
    token_mask[0, 5] = False  # a row with nothing left
    rpe = torch.randn(1, H, n, n, generator=g)
    kpm = _padding(n, "tail")
    mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=n)
    ctx = torch.enable_grad() if cpu_trains(kernel) else torch.no_grad()
    with ctx:
        out = mod(q, k, v, key_padding_mask_BN=kpm, token_mask=token_mask, score_bias=A.DenseScoreBias(rpe))
    ref = _naive(q, k, v, cfg.make_layout(n), 16, kpm, rpe=rpe, token_mask=token_mask)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    assert out[:, 0, 5].abs().max() == 0


@pytest.mark.parametrize("kernel", [k for k in ALL_KERNELS if cpu_trains(k)])
@pytest.mark.parametrize("kp_mode,am_mode", [("add", "mul"), ("mul", "add")])
def test_sparse_self_attention_deepspeed_semantics(kernel, kp_mode, am_mode):
    cfg = A.FixedSparsityConfig(H, block=16, num_local_blocks=2)
    n = 64
    q, k, v = _inputs(n)
    g = torch.Generator().manual_seed(4)
    keep = torch.ones(B, n)
    keep[0, 50:] = 0
    kp = torch.where(keep > 0, 0.0, -10000.0) if kp_mode == "add" else keep
    am01 = (torch.rand(n, n, generator=g) > 0.2).float()
    am = am01 if am_mode == "mul" else torch.randn(n, n, generator=g)
    rpe = torch.randn(B, H, n, n, generator=g)
    ssa = SparseSelfAttention(
        cfg, key_padding_mask_mode=kp_mode, attn_mask_mode=am_mode, max_seq_length=128, kernel=kernel
    )
    # DeepSpeed accepted [B, 1, 1, N] padding masks and a transposed key
    out = ssa(q, k.transpose(2, 3), v, rpe=rpe, key_padding_mask=kp[:, None, None, :], attn_mask=am)
    ref = _naive(
        q,
        k,
        v,
        cfg.make_layout(128)[:, :4, :4],
        16,
        kpm=None if kp_mode == "add" else keep.bool(),
        kpm_add=kp if kp_mode == "add" else None,
        rpe=rpe,
        attn_add=am if am_mode == "add" else None,
        token_mask=am01.bool() if am_mode == "mul" else None,
    )
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_attention_dropout_trains_and_is_off_in_eval():
    cfg = LAYOUTS["bigbird"]()
    q, k, v = _inputs(128)
    mod = A.BlockSparseAttention(cfg, kernel="block_gather", max_seq_length=128, dropout_p=0.2)
    ref = A.BlockSparseAttention(cfg, kernel="dense", max_seq_length=128)(q, k, v)
    mod.eval()
    torch.testing.assert_close(mod(q, k, v), ref, atol=1e-5, rtol=1e-4)
    mod.train()
    torch.manual_seed(0)
    with torch.no_grad():
        outs = torch.stack([mod(q, k, v) for _ in range(40)])
    assert not torch.allclose(outs[0], ref)
    # inverted dropout is unbiased: the mean over draws approaches the dropout-free output
    err = (outs.mean(0) - ref).abs().mean() / ref.abs().mean()
    one = (outs[0] - ref).abs().mean() / ref.abs().mean()
    assert err < 0.35 * one  # averaging 40 draws shrinks the error ~1/sqrt(40) = 0.16


def test_query_tiles_and_groups():
    cfg = A.BlockBERTSparsityConfig(12, num_blocks=2, head_assignment="10:2", block=64)
    assert query_tile_factor(cfg.make_layout(4096)) == 32  # 2 tiles of 2048 query rows per head
    assert query_tile_factor(A.FixedSparsityConfig(12, block=16).make_layout(1024)) == 4  # one tile per window
    plan = make_gather_plan(cfg.make_layout(512), 64, 512, "cpu")
    assert len(plan.groups) == 1 and plan.inverse is None and plan.groups[0].k_index_GK.shape == (24, 256)
    fast = A.get_kernel("block_gather").make_plan(cfg.make_layout(512), 64, 512, "cpu")
    assert isinstance(fast, PermutationPlan) and fast.tile == 256 and fast.chunks == 2
    assert fast.tile_map.tolist() == list(range(20)) + [21, 20, 23, 22]  # heads 10, 11: shift 1
    assert (
        A.get_kernel("block_gather")
        .make_plan(
            A.BlockBERTSparsityConfig(12, num_blocks=2, head_assignment="12", block=64).make_layout(512), 64, 512, "cpu"
        )
        .tile_map
        is None
    )  # no shifted head: k/v tiles are views
    # layouts where a query tile sees more than one key tile: on CPU the split plan (shared blocks, windows, rest)
    split = A.get_kernel("block_gather").make_plan(A.FixedSparsityConfig(12, block=16).make_layout(256), 16, 256, "cpu")
    assert isinstance(split, SplitPlan) and isinstance(split.fallback, GatherPlan)
    assert isinstance(
        make_gather_plan(A.FixedSparsityConfig(12, block=16).make_layout(256), 16, 256, "cpu"), GatherPlan
    )
    mod = A.BlockSparseAttention(cfg, kernel="block_gather", max_seq_length=512)
    q, k, v = _inputs(128)
    with pytest.raises(ValueError, match="heads"):
        mod(q, k, v)


def test_layout_state_roundtrip_changes_output():
    a = A.BlockSparseAttention(A.BigBirdSparsityConfig(H, block=16, seed=1), kernel="block_gather", max_seq_length=128)
    b = A.BlockSparseAttention(A.BigBirdSparsityConfig(H, block=16, seed=2), kernel="block_gather", max_seq_length=128)
    q, k, v = (t.detach() for t in _inputs(128))
    assert not torch.allclose(a(q, k, v), b(q, k, v))
    b(q, k, v)  # plan cached for the old layout must be dropped on load
    b.load_layout_state(a.layout_state())
    torch.testing.assert_close(a(q, k, v), b(q, k, v))


def test_choose_kernel_rule():
    assert A.choose_kernel("cpu", torch.float32, 1024, 1.0, dropout=False) == "dense"
    assert A.choose_kernel("cpu", torch.float32, 1024, 0.3, dropout=False) == "block_gather"
    assert A.choose_kernel("cpu", torch.float32, 1024, 0.8, dropout=False) == "dense"
    assert A.choose_kernel("cuda", torch.bfloat16, 1024, 0.3, dropout=False) == "flex"
    assert A.choose_kernel("cuda", torch.bfloat16, 1024, 0.3, dropout=True) == "block_gather"
    for cap in [(7, 0), (7, 5)]:  # flex is far slower than SDPA/block_gather below Ampere (attention-gym #21)
        for dtype in (torch.float16, torch.float32, torch.bfloat16):
            assert A.choose_kernel("cuda", dtype, 4096, 0.1, dropout=False, capability=cap) == "block_gather"
    assert A.choose_kernel("cuda", torch.float16, 4096, 0.1, dropout=False, capability=(8, 0)) == "flex"
    assert A.choose_kernel("cuda", torch.float16, 4096, 0.1, dropout=False, capability=(9, 0)) == "flex"


class _HoleyLayout(A.SparsityConfig):
    """A custom layout with empty rows (a layout may leave a query block with nothing to attend to)."""

    def make_layout(self, seq_len):
        lay = A.DenseSparsityConfig(self.num_heads, self.block).make_layout(seq_len)
        lay[0, 1] = 0  # head 0, query block 1: no key block
        lay[2, :, 0] = 0
        return lay


@pytest.mark.parametrize("kernel", OTHER_KERNELS)
def test_empty_layout_rows_give_zeros(kernel):
    cfg = _HoleyLayout(H, block=16)
    q, k, v = _inputs(64)
    kpm = _padding(64, "tail")
    ref, ref_g = _run("dense", cfg, q, k, v, kpm)
    out, g = _run(kernel, cfg, q, k, v, kpm, grad=cpu_trains(kernel))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert out[:, 0, 16:32].abs().max() == 0
    if g is not None:
        for a, b in zip(g, ref_g):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


class _ShuffledChunks(A.SparsityConfig):
    """A permutation layout that is not a cyclic shift and where two heads share one map."""

    def make_layout(self, seq_len):
        m = seq_len // self.block
        c = m // 4  # 4 chunks
        maps = [[2, 0, 3, 1], [0, 1, 2, 3], [2, 0, 3, 1], [3, 3, 0, 0]]  # the last one is not even a permutation
        lay = torch.zeros(self.num_heads, m, m, dtype=torch.int64)
        for h in range(self.num_heads):
            for i, j in enumerate(maps[h % 4]):
                lay[h, i * c : (i + 1) * c, j * c : (j + 1) * c] = 1
        return lay


@pytest.mark.parametrize("pad", ["none", "tail", "all"])
@pytest.mark.parametrize("name", ["blockbert_n2", "blockbert_n3", "shuffled"])
def test_permutation_fast_path_matches_dense_and_general_path(name, pad):
    """The one-key-tile-per-query-tile fast path vs dense and vs the general gather plan, with key padding, a
    per-call token mask (with an emptied row), a plan token mask and a learnable score bias (its grad too)."""
    cfg = _ShuffledChunks(H, block=16) if name == "shuffled" else LAYOUTS[name]()
    n = 100 if name == "blockbert_n3" else 128
    q, k, v = _inputs(n)
    kpm = _padding(n, pad)
    mod = A.BlockSparseAttention(cfg, kernel="block_gather", max_seq_length=n)
    n_pad = cfg.padded_length(n)
    assert isinstance(mod._plan(n_pad, torch.device("cpu")), PermutationPlan)
    g = torch.Generator().manual_seed(7)
    token_mask = torch.rand(H, n, n, generator=g) > 0.2
    token_mask[1, 3] = False
    rpe = torch.randn(1, H, n, n, generator=g).requires_grad_()
    for tm, bias in ((None, None), (token_mask, rpe)):
        kw = dict(key_padding_mask_BN=kpm, token_mask=tm, score_bias=None if bias is None else A.DenseScoreBias(bias))
        inputs = (q, k, v) if bias is None else (q, k, v, rpe)
        outs = []
        for kern in ("dense", "block_gather", "general"):
            m = A.BlockSparseAttention(cfg, kernel="dense" if kern == "dense" else "block_gather", max_seq_length=n)
            if kern == "general":  # force the general gather plan into the cache
                m._plans[(n_pad, "cpu", 0)] = make_gather_plan(m.layout_for(n_pad), cfg.block, n_pad, "cpu")
            out = m(q, k, v, **kw)
            go = upstream_grad(out)
            outs.append((out, torch.autograd.grad(out, inputs, go)))
        (ref, ref_g), (fast, fast_g), (gen, gen_g) = outs
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(fast, gen, atol=1e-5, rtol=1e-4)
        for a, b, c in zip(fast_g, ref_g, gen_g):
            assert not torch.isnan(a).any()
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-4)
        if pad == "all":
            assert fast[1].abs().max() == 0 and fast_g[0][1].abs().max() == 0


def test_permutation_fast_path_with_fixed_token_mask_and_dropout():
    cfg = LAYOUTS["blockbert_n2"]()
    n = 64
    g = torch.Generator().manual_seed(11)
    fixed = torch.rand(H, n, n, generator=g) > 0.3
    q, k, v = _inputs(n)
    ref = A.BlockSparseAttention(cfg, kernel="dense", fixed_token_mask=fixed)(q, k, v)
    mod = A.BlockSparseAttention(cfg, kernel="block_gather", fixed_token_mask=fixed, dropout_p=0.5)
    assert isinstance(mod._plan(n, torch.device("cpu")), PermutationPlan)
    mod.eval()
    torch.testing.assert_close(mod(q, k, v), ref, atol=1e-5, rtol=1e-4)
    mod.train()
    assert not torch.allclose(mod(q, k, v), ref)  # dropout reaches the fast path in training


@pytest.mark.parametrize("name", ["blockbert_n2", "bigbird"])
def test_block_gather_batch_of_one_matches_dense(name):
    """B == 1 takes the tiles-as-batch fold (free views); masks, biases and grads must still match dense."""
    cfg = LAYOUTS[name]()
    n = 128
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, H, n, D, generator=g).requires_grad_() for _ in range(3))
    kpm = torch.ones(1, n, dtype=torch.bool)
    kpm[0, 90:] = False
    rpe = torch.randn(1, H, n, n, generator=g).requires_grad_()
    token_mask = torch.rand(H, n, n, generator=g) > 0.2
    for kw in (dict(), dict(key_padding_mask_BN=kpm, token_mask=token_mask, score_bias=A.DenseScoreBias(rpe))):
        res = []
        for kern in ("dense", "block_gather"):
            out = A.BlockSparseAttention(cfg, kernel=kern, max_seq_length=n)(q, k, v, **kw)
            res.append((out, torch.autograd.grad(out, (q, k, v, rpe), torch.ones_like(out), allow_unused=True)))
        (ref, ref_g), (out, g_) = res
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        for a, b in zip(g_, ref_g):
            if b is not None:
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# the split path (model/attention/split_global.py): which pieces each layout's plan must use at n=256, block 16
# (A = shared key blocks, W = (query blocks per tile, key blocks per window, element mask), R = gathered rest)
SPLIT_PIECES = {
    "fixed": (True, None, True),
    "fixed_uni_horizontal": (False, (8, 8, True), True),
    "variable_default": (True, (8, 8, True), True),
    "bigbird": (True, (2, 4, True), True),
    "bslongformer": (True, (1, 3, False), True),
    "local_uni": (False, (1, 2, False), True),
    "local_bi": (False, (1, 3, False), True),
}
SPLIT_LAYOUTS = {
    **LAYOUTS,
    "variable_default": lambda: A.VariableSparsityConfig(
        H, block=16, different_layout_per_head=True, num_random_blocks=1, seed=3
    ),
}


def _split_plan(mod, n):
    plan = mod._plan(n, torch.device("cpu"))
    assert isinstance(plan, SplitPlan), type(plan)
    w = plan.window
    return plan, (
        plan.shared_index_HS is not None,
        None if w is None else (w.r, w.nblocks, w.mask is not None),
        plan.rest is not None,
    )


@pytest.mark.parametrize("name", list(SPLIT_PIECES))
def test_split_plan_pieces(name):
    """The split path is really taken for these layouts (so the parity tests below test it)."""
    mod = A.BlockSparseAttention(SPLIT_LAYOUTS[name](), kernel="block_gather", max_seq_length=256)
    plan, pieces = _split_plan(mod, 256)
    assert pieces == SPLIT_PIECES[name]
    assert isinstance(plan.fallback, GatherPlan)
    # every allowed block is computed by exactly one piece: the pieces' score counts add up to the layout's
    lay = mod.layout_for(256).bool()
    Hh, M, _ = lay.shape
    blocks = 0 if plan.shared_index_HS is None else Hh * M * plan.shared_index_HS.shape[1] // 16
    if plan.window is not None:
        w = plan.window
        on = w.mask.float().mean().item() if w.mask is not None else 1.0
        blocks += round(Hh * w.nt * w.r * w.nblocks * on)
    if plan.rest is not None:
        blocks += sum(g.k_index_GK.numel() for g in plan.rest.groups) * plan.rest.plan.tile // 16 // 16
    assert blocks == int(lay.sum())


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("case", ["padding", "token_masks"])
@pytest.mark.parametrize("name", list(SPLIT_PIECES))
def test_split_path_matches_dense_fp32_with_grads(name, case, batch):
    """Outputs and q/k/v grads of the split path vs dense: key padding (ragged, leading, a fully padded
    sequence), a fixed token mask in the plan plus a per-call token mask with empty rows; B=1 (tiles folded
    onto SDPA's batch axis) and B=2 with q/k/v strided as the encoder makes them."""
    n = 256
    g = torch.Generator().manual_seed(11)
    if batch == 1:
        q, k, v = (torch.randn(1, H, n, D, generator=g).requires_grad_() for _ in range(3))
    else:  # [B, N, H, D] permuted: not a [B*H] view, the window piece copies
        q, k, v = (torch.randn(batch, n, H, D, generator=g).requires_grad_() for _ in range(3))
    qv, kv, vv = (t if batch == 1 else t.permute(0, 2, 1, 3) for t in (q, k, v))
    kpm = torch.ones(batch, n, dtype=torch.bool)
    kpm[0, n - 37 :] = False
    kpm[0, :20] = False  # leading keys: windows near the start lose their keys
    if batch == 2:
        kpm[1] = False  # every row masked: zeros, zero grads
    fixed = tm = None
    if case == "token_masks":
        fixed = torch.rand(H, n, n, generator=g) > 0.2
        fixed[1, 70] = False  # a row the fixed mask empties
        tm = torch.rand(n, n, generator=g) > 0.25
        tm[100] = False  # a row the call's mask empties
    outs, grads = {}, {}
    for kernel in ("dense", "block_gather"):
        mod = A.BlockSparseAttention(SPLIT_LAYOUTS[name](), kernel=kernel, max_seq_length=n, fixed_token_mask=fixed)
        if kernel == "block_gather":
            _split_plan(mod, n)
        out = mod(qv, kv, vv, key_padding_mask_BN=kpm, token_mask=tm)
        go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
        outs[kernel] = out
        grads[kernel] = torch.autograd.grad(out, (q, k, v), go)
    torch.testing.assert_close(outs["block_gather"], outs["dense"], atol=1e-5, rtol=1e-4)
    for a, b in zip(grads["block_gather"], grads["dense"]):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    if batch == 2:
        assert outs["block_gather"][1].abs().max() == 0 and grads["block_gather"][0][1].abs().max() == 0
    if case == "token_masks":
        assert outs["block_gather"][0, :, 100].abs().max() == 0 and outs["block_gather"][0, 1, 70].abs().max() == 0


def test_choose_kernel_per_device_generation():
    ck = A.choose_kernel
    for cap in [(8, 0), (9, 0)]:
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            assert ck("cuda", dt, 1024, 0.3, dropout=False, capability=cap) == "flex"
    assert ck("cuda", torch.float16, 1024, 0.3, dropout=False, capability=(7, 0)) == "block_gather"  # Volta
    assert ck("cuda", torch.float16, 1024, 0.8, dropout=False, capability=(7, 0)) == "dense"
    assert ck("cuda", torch.float16, 1024, 0.3, dropout=False, capability=(7, 5)) == "block_gather"  # below sm80
    assert ck("cuda", torch.bfloat16, 1024, 0.3, dropout=False, capability=(7, 5)) == "block_gather"  # emulated
    assert ck("cuda", torch.bfloat16, 256, 0.3, dropout=False, capability=(9, 0)) == "block_gather"  # short N
    assert ck("cuda", torch.bfloat16, 1024, 0.3, dropout=True, capability=(9, 0)) == "block_gather"
    assert ck("cuda", torch.bfloat16, 4096, 1.0, dropout=False, capability=(9, 0)) == "dense"


def test_auto_keeps_one_kernel_for_training_and_evaluation():
    """With attention dropout configured, `auto` used to pick block_gather in training and flex in evaluation (a
    compile mid-run on CUDA); now the configured dropout decides, once, for both."""
    cfg = LAYOUTS["bigbird"]()
    mod = A.BlockSparseAttention(cfg, kernel="auto", max_seq_length=128, dropout_p=0.1)
    q, k, v = _inputs(128)
    mod.train()
    mod(q, k, v)
    plan = next(iter(mod._plans.values()))
    assert plan.chosen == {torch.float32: "block_gather"}
    mod.eval()
    with torch.no_grad():
        mod(q, k, v)
    assert plan.chosen == {torch.float32: "block_gather"} and set(plan.plans) == {"block_gather"}


def test_flex_padding_block_mask_is_built_once_per_forward(monkeypatch):
    """An L-layer model: the key-padding BlockMask is built once per forward (the layers share the padding), again
    for a new batch, and the outputs still equal the dense kernel's."""
    from model.attention.kernels.flex import FlexPlan
    from model.bert import BertModel
    from model.config import ModelConfig

    builds = []
    real = FlexPlan.build_block_mask
    monkeypatch.setattr(FlexPlan, "build_block_mask", lambda self, *a: builds.append(1) or real(self, *a))
    sparsity = {"mode": "bigbird", "block": 16, "num_random_blocks": 1}
    models = {}
    for kernel in ("flex", "dense"):
        torch.manual_seed(0)
        cfg = ModelConfig.preset(
            "tiny",
            vocab_size=50,
            num_layers=3,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            max_position_embeddings=256,
            attention={"kernel": kernel, "sparsity": sparsity},
        )
        models[kernel] = BertModel(cfg).eval()
    ids = torch.randint(5, 50, (2, 256))
    mask = torch.ones(2, 256, dtype=torch.long)
    mask[1, 200:] = 0
    with torch.no_grad():
        models["flex"](ids, mask)  # plans (one per layer) built here
        builds.clear()
        out = models["flex"](ids, mask)
        assert len(builds) == 1
        models["flex"](ids, mask.clone())
        assert len(builds) == 2  # a new batch's mask: rebuilt once
        ref = models["dense"](ids, mask)
        builds.clear()
        for _ in range(4):  # training-like steps of unpadded batches of one shape: the plans' masks are reused
            models["flex"](torch.randint(5, 50, (2, 256)), torch.ones(2, 256, dtype=torch.long))
        assert builds == []
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", ALL_KERNELS)
@pytest.mark.parametrize("case", ["padding", "all_padded", "token_mask_and_bias"])
def test_half_precision_kernels_against_an_fp32_reference(kernel, dtype, case):
    """Each kernel in fp16/bf16 (forward, and backward where it trains on CPU) against the fp32 dense kernel on the
    same values: masks are -inf (exact in both formats), rows with nothing to attend to give exact zeros, and
    additive biases (DIET) stay finite."""
    cfg = LAYOUTS["bigbird"]()
    n = 128
    q32, k32, v32 = _inputs(n)
    kpm = _padding(n, "all" if case == "all_padded" else "tail")
    extra = {}
    if case == "token_mask_and_bias":
        g = torch.Generator().manual_seed(3)
        tm = torch.rand(H, n, n, generator=g) > 0.3
        tm[0, 5] = False  # a row with nothing left
        extra = {"token_mask": tm, "score_bias": A.DenseScoreBias(torch.randn(1, H, n, n, generator=g) * 4)}
    ref_mod = A.BlockSparseAttention(cfg, kernel="dense", max_seq_length=n)
    ref = ref_mod(q32, k32, v32, key_padding_mask_BN=kpm, **extra)
    go = upstream_grad(ref)
    ref_g = torch.autograd.grad(ref, (q32, k32, v32), go)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q32, k32, v32))
    half_extra = dict(extra)
    if "score_bias" in extra:
        half_extra["score_bias"] = A.DenseScoreBias(extra["score_bias"].bias.to(dtype))
    mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=n)
    trains = cpu_trains(kernel)  # FlexAttention has no CPU backward
    try:
        with torch.enable_grad() if trains else torch.no_grad():
            out = mod(q, k, v, key_padding_mask_BN=kpm, **half_extra)
    except RuntimeError as e:  # pragma: no cover - depends on the CPU build
        pytest.skip(f"{kernel} in {dtype} not supported by this CPU build of torch: {e}")
    assert out.dtype == dtype and torch.isfinite(out).all()
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.float16 else dict(atol=6e-2, rtol=6e-2)
    torch.testing.assert_close(out.float(), ref.detach(), **tol)
    empty = ~(kpm.any(-1)) if case == "all_padded" else None
    if empty is not None:
        assert out[empty].abs().max() == 0  # fully padded sequence: exact zeros, not NaN
    if case == "token_mask_and_bias":
        assert out[:, 0, 5].abs().max() == 0
    if trains:
        g = torch.autograd.grad(out, (q, k, v), go.to(dtype))
        for a, b in zip(g, ref_g):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a.float(), b, **tol)


def test_cpu_split_plan_switch(monkeypatch):
    """``SPARSEBERT_CPU_SPLIT=0`` turns the CPU split plan off (the general gather plan runs, same results); a value
    that is neither on nor off is refused naming the variable."""
    lay = A.FixedSparsityConfig(H, block=16).make_layout(256)
    kernel = A.get_kernel("block_gather")
    assert isinstance(kernel.make_plan(lay, 16, 256, "cpu"), SplitPlan)
    monkeypatch.setenv("SPARSEBERT_CPU_SPLIT", "0")
    plan = kernel.make_plan(lay, 16, 256, "cpu")
    assert isinstance(plan, GatherPlan)
    q, k, v = (t.detach() for t in _inputs(256))
    ref = A.get_kernel("dense")(q, k, v, plan=A.get_kernel("dense").make_plan(lay, 16, 256, "cpu"))
    torch.testing.assert_close(kernel(q, k, v, plan=plan), ref, atol=1e-5, rtol=1e-4)
    monkeypatch.setenv("SPARSEBERT_CPU_SPLIT", "maybe")
    with pytest.raises(ValueError, match="SPARSEBERT_CPU_SPLIT"):
        kernel.make_plan(lay, 16, 256, "cpu")


def test_deterministic_mode_picks_deterministic_kernels(monkeypatch):
    """--deterministic on CUDA: auto never picks flex, and SDPA runs its math backend (flash and memory-efficient
    backward passes use atomics). Checked on CPU with the CUDA branch's inputs faked."""
    from model.attention.kernels import sdpa

    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert A.choose_kernel("cuda", torch.float16, 4096, 0.1, dropout=False, capability=(9, 0)) == "block_gather"
    assert A.choose_kernel("cuda", torch.float16, 4096, 0.9, dropout=False, capability=(9, 0)) == "dense"
    monkeypatch.undo()
    with monkeypatch.context() as m:
        m.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
        assert sdpa._deterministic_cuda(torch.empty(0, device="meta"))  # any non-CPU tensor (model.cpu_shortcuts)
        assert not sdpa._deterministic_cuda(torch.empty(0))
    used = []
    real = sdpa.F.scaled_dot_product_attention

    def recording(*args, **kwargs):  # which backends SDPA may use during the call
        used.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", recording)
    q = torch.randn(1, 2, 8, 4)
    sdpa.sdpa_with_allow(q, q, q, None, None, 0.0, None)
    monkeypatch.setattr(sdpa, "_deterministic_cuda", lambda q: True)  # the CUDA branch, run on CPU tensors
    sdpa.sdpa_with_allow(q, q, q, None, None, 0.0, None)
    assert used == [(True, True), (False, True)]  # flash off, math only, in deterministic mode
