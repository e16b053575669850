"""``triton_block`` (our Triton block-sparse FlashAttention) against ``dense``: outputs and q/k/v gradients for every
registered layout family, key padding, packed documents, fully masked rows; attention dropout reproducible and the
same mask in forward and backward; the CSR tile tables against the layout expanded by hand.

On CPU the Triton programs run in Triton's interpreter: tests/conftest.py sets ``TRITON_INTERPRET=1`` on a machine
without a GPU before anything imports Triton (``triton.jit`` reads it when a function is decorated, Triton's own
``tl.rand`` included). The interpreter is slow, so the
shapes are tiny (N <= 128, head size 16, B * H <= 4). On a CUDA machine the same tests run compiled on the GPU."""

from __future__ import annotations

import os

import pytest
import torch

from model import attention as A
from model.attention.kernels import KERNELS
from model.attention.kernels.triton_block.tables import build_tables
from tests.registry_cases import LAYOUT_EXAMPLES, upstream_grad

pytest.importorskip("triton", reason="triton is not installed (requirements.txt installs it for CPU torch)")
import triton  # noqa: E402  (after tests/conftest.py set TRITON_INTERPRET on a machine without a GPU)
import triton.language as tl  # noqa: E402

from model.attention.kernels.triton_block import tl_kernels  # noqa: E402

ON_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
H, D = 4, 16
TILE = 32
"""Tile of the tests' plans: at N = 96..128 several query and key tiles, 2 x 2 blocks of 16 per tile (partial tiles)."""


@pytest.fixture(scope="module", autouse=True)
def _triton_programs():
    """On CPU the programs run interpreted (tests/conftest.py sets ``TRITON_INTERPRET=1`` before anything imports
    Triton); the tests use a small tile."""
    from model.attention.kernels.triton_block import interpreting

    if not ON_CUDA and not interpreting():
        pytest.skip("Triton was imported without TRITON_INTERPRET=1 in this process (tests/conftest.py sets it)")
    kernel = KERNELS["triton_block"]
    old, kernel.tile = kernel.tile, TILE
    yield
    kernel.tile = old


def _inputs(B: int, n: int, heads: int = H, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, heads, n, D, generator=g).to(DEVICE).requires_grad_() for _ in range(3)]


def _run(kernel, cfg, q, k, v, dropout_p=0.0, **kw):
    mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=256, dropout_p=dropout_p).to(DEVICE)
    mod.train(dropout_p > 0)
    out = mod(q, k, v, **kw)
    return out, torch.autograd.grad(out, (q, k, v), upstream_grad(out))


def _assert_parity(cfg, q, k, v, **kw):
    ref, ref_g = _run("dense", cfg, q, k, v, **kw)
    out, g = _run("triton_block", cfg, q, k, v, **kw)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4, msg=lambda m: f"output: {m}")
    for i, (a, b) in enumerate(zip(g, ref_g)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, i=i: f"grad {'qkv'[i]}: {m}")
    return out, g


def _n(name: str) -> int:
    return 96 if name == "blockbert_n3" else 128  # n3 pads to a multiple of 48


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(LAYOUT_EXAMPLES))
def test_matches_dense_for_every_layout_family(name):
    cfg = LAYOUT_EXAMPLES[name](H)
    q, k, v = _inputs(1, _n(name))
    _assert_parity(cfg, q, k, v)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["local_uni", "fixed", "blockbert_n3"])
def test_key_padding_and_fully_masked_rows(name):
    """Ragged padding, leading keys masked (causal/local rows with no key left) and a fully padded sequence: zeros
    and zero gradients there, never NaN. N = 100 is not a multiple of the tile (or of n3's 48: padded to 144)."""
    cfg = LAYOUT_EXAMPLES[name](2) if name != "blockbert_n3" else A.BlockBERTSparsityConfig(2, 3, "1:1", block=16)
    n = 100
    q, k, v = _inputs(2, n, heads=2)
    kpm = torch.ones(2, n, dtype=torch.bool)
    kpm[0, :20] = False
    kpm[1] = False
    out, g = _assert_parity(cfg, q, k, v, key_padding_mask_BN=kpm.to(DEVICE))
    assert out[1].abs().max() == 0 and g[0][1].abs().max() == 0 and g[1][1].abs().max() == 0


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["bigbird", "blockbert_n2"])
def test_packed_documents(name):
    cfg = LAYOUT_EXAMPLES[name](H)
    n = 128
    doc = torch.zeros(1, n, dtype=torch.long)
    doc[0, 37:38] = 1  # a one-token document
    doc[0, 38:90] = 2
    doc[0, 90:] = -1  # padding: its own id, masked by the key padding too
    kpm = doc >= 0
    q, k, v = _inputs(1, n)
    _assert_parity(cfg, q, k, v, key_padding_mask_BN=kpm.to(DEVICE), doc_ids_BN=doc.to(DEVICE))


def _dropout_run(seed: int, v=None, n: int = 32, heads: int = 2):
    cfg = A.BigBirdSparsityConfig(heads, block=16, num_random_blocks=0, num_sliding_window_blocks=1,
                                  num_global_blocks=1)  # fmt: skip
    q, k, v0 = _inputs(1, n, heads=heads, seed=1)
    v = v0 if v is None else v
    torch.manual_seed(seed)
    return _run("triton_block", cfg, q, k, v, dropout_p=0.25), (cfg, q, k, v)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_dropout_reproducible_and_same_mask_forward_and_backward():
    """With v = identity (N = head size 32... here v is N x N) the output is the dropped, rescaled probabilities:
    that exposes the kernel's mask. Same ``torch.manual_seed`` -> the same output and grads; another seed -> another
    mask; the kept fraction within 5 sigma of 1 - p; and the kernel's gradients equal autograd through dense
    attention under that very mask (a backward with another mask would not)."""
    global D
    old_d, D = D, 32
    try:
        n, p = 32, 0.25
        eye = torch.eye(n).expand(1, 2, n, n).to(DEVICE).requires_grad_()
        (probs, _), (cfg, q, k, _) = _dropout_run(5, eye)
        (again, _), _ = _dropout_run(5, eye)
        (other, _), _ = _dropout_run(6, eye)
        torch.testing.assert_close(probs, again, atol=0, rtol=0)
        assert not torch.equal(probs != 0, other != 0)
        ref_p = torch.softmax(
            (q @ k.transpose(-1, -2) / n**0.5).masked_fill(
                ~cfg.make_layout(n).bool().repeat_interleave(16, 1).repeat_interleave(16, 2).to(DEVICE), -torch.inf
            ),
            -1,
        ).detach()
        keep = probs.detach() != 0
        allowed = ref_p > 0
        frac = (keep & allowed).sum() / allowed.sum()
        sigma = (p * (1 - p) / allowed.sum()) ** 0.5
        assert abs(frac - (1 - p)) < 5 * sigma, frac
        torch.testing.assert_close(probs.detach(), ref_p * keep / (1 - p), atol=1e-5, rtol=1e-4)
        # the gradients with a random v under seed 5 against autograd through softmax * mask
        (out, grads), (_, q, k, v) = _dropout_run(5)
        (out2, grads2), _ = _dropout_run(5)
        torch.testing.assert_close(out, out2, atol=0, rtol=0)
        for a, b in zip(grads, grads2):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
        lay = cfg.make_layout(n).bool().repeat_interleave(16, 1).repeat_interleave(16, 2).to(DEVICE)
        s = (q @ k.transpose(-1, -2) / n**0.5).masked_fill(~lay, -torch.inf)
        ref = (torch.softmax(s, -1) * keep / (1 - p)) @ v
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        ref_g = torch.autograd.grad(ref, (q, k, v), upstream_grad(ref))
        for i, (a, b) in enumerate(zip(grads, ref_g)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, i=i: f"grad {'qkv'[i]}: {m}")
    finally:
        D = old_d


@pytest.mark.parametrize("tile", [16, 32, 64])
@pytest.mark.parametrize("name", sorted(LAYOUT_EXAMPLES))
def test_tile_tables_match_the_expanded_layout(name, tile):
    """Visited tiles = tiles with any allowed token pair; partial = visited but not all pairs allowed; the
    transposed lists hold the same pairs."""
    cfg = LAYOUT_EXAMPLES[name](H)
    n = 100  # not a multiple of any tile: the last tiles are cut
    n_pad = cfg.padded_length(n)
    lay = cfg.make_layout(n_pad).bool()
    t = build_tables(lay, cfg.block, n_pad, tile, tile)
    allow = lay.repeat_interleave(cfg.block, 1).repeat_interleave(cfg.block, 2)[:, :n_pad, :n_pad]
    nt = -(-n_pad // tile)
    padded = torch.zeros(lay.shape[0], nt * tile, nt * tile, dtype=torch.bool)
    padded[:, :n_pad, :n_pad] = allow
    tiles = padded.view(lay.shape[0], nt, tile, nt, tile)
    inside = torch.zeros(nt * tile, dtype=torch.bool)
    inside[:n_pad] = True
    inside_pairs = (inside[:, None] & inside[None, :]).view(nt, tile, nt, tile)
    any_on = tiles.any(4).any(2)
    full = (tiles | ~inside_pairs).all(4).all(2)
    for h in range(lay.shape[0]):
        for qt in range(nt):
            lo, hi = t.fwd_offsets_HT[h, qt], t.fwd_offsets_HT[h, qt + 1]
            assert t.fwd_index[lo:hi].tolist() == any_on[h, qt].nonzero().flatten().tolist()
            assert t.fwd_partial[lo:hi].tolist() == (~full[h, qt][any_on[h, qt]]).int().tolist()
        for kt in range(nt):
            lo, hi = t.bwd_offsets_HT[h, kt], t.bwd_offsets_HT[h, kt + 1]
            assert t.bwd_index[lo:hi].tolist() == any_on[h, :, kt].nonzero().flatten().tolist()
            assert t.bwd_partial[lo:hi].tolist() == (~full[h, :, kt][any_on[h, :, kt]]).int().tolist()


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_token_masks_and_score_biases_fall_back_to_block_gather_with_a_warning():
    """Not in this kernel: said by a warning, run by block_gather's plan (never ignored): equal to dense."""
    cfg = LAYOUT_EXAMPLES["bigbird"](H)
    n = 64
    q, k, v = _inputs(1, n)
    tm = (torch.rand(H, n, n, generator=torch.Generator().manual_seed(2)) > 0.3).to(DEVICE)
    ref, _ = _run("dense", cfg, q, k, v, token_mask=tm)
    with pytest.warns(UserWarning, match="triton_block has no token mask.*block_gather"):
        out, _ = _run("triton_block", cfg, q, k, v, token_mask=tm)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    import model.attention.kernels.triton_block as tb

    monkeypatch.setattr(tb, "interpreting", lambda: False)
    cfg = LAYOUT_EXAMPLES["fixed"](H)
    q, k, v = (t.detach().cpu() for t in _inputs(1, 64))
    with pytest.raises(RuntimeError, match="triton_block runs on CUDA GPUs.*TRITON_INTERPRET=1"):
        A.BlockSparseAttention(cfg, kernel="triton_block", max_seq_length=64)(q, k, v)


COMPILE_CASES = {
    "triton_block sm90": ([], "90", ["bf16", "fp32"], 10),
    "fused_norm sm90": (["--fused-norm"], "90", ["bf16", "fp16", "fp32"], 10),
    "fused_norm sm80": (["--fused-norm"], "80", ["bf16", "fp16", "fp32"], 10),
}
"""tests/triton_compile.py runs: (flags, compute capability, dtypes, programs compiled). The fused norm (issue #56):
forward and backward per dtype, and again under autocast (bf16/fp16 x, fp32 residual stream) for the half types."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "case",
    # triton_block's compile is the default tier's canary; the fused norm's two targets (~20 s each) are extended
    [pytest.param(c, marks=[pytest.mark.extended] * c.startswith("fused_norm")) for c in sorted(COMPILE_CASES)],
)
def test_programs_compile_for_hopper_without_a_gpu(case):
    """The interpreter checks the arithmetic, not Triton's GPU lowering: compile the programs for sm90 (and the fused
    norm's also for sm80) in a process without ``TRITON_INTERPRET`` (tests/triton_compile.py). triton_block's four
    programs in bf16 and fp32, every mask and dropout on, the forward also without key padding or documents: it
    caught fp32 ``input_precision="ieee"`` failing to compile in Triton 3.6. The fused residual + dropout + LayerNorm
    (model/fused_norm_tl.py) with its four-lane dropout draw, in every dtype and under autocast."""
    import subprocess
    import sys
    from pathlib import Path

    flags, cap, dtypes, programs = COMPILE_CASES[case]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-m", "tests.triton_compile", *flags, cap, *dtypes],
        cwd=repo, env=env, capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("bytes of shared memory") == programs, r.stdout


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("tile_n", [16, 64])
def test_key_tiles_of_another_size_than_the_query_tiles(tile_n):
    """`benchmarks.attention --measure tiles` sweeps (query tile, key tile, warps, stages): the plan's tables and both
    backward passes follow a key tile that differs from the query tile."""
    kernel = KERNELS["triton_block"]
    kernel.tile_n, kernel.launch = tile_n, (4, 1)
    try:
        cfg = LAYOUT_EXAMPLES["fixed"](H)
        plan = kernel.make_plan(cfg.make_layout(128), cfg.block, 128, DEVICE)
        assert (plan.tile_m, plan.tile_n, plan.tk, plan.config(D, torch.float32).num_warps) == (
            TILE,
            tile_n,
            128 // tile_n,
            4,
        )
        q, k, v = _inputs(1, 128)
        kpm = torch.ones(1, 128, dtype=torch.bool)
        kpm[0, 100:] = False
        _assert_parity(cfg, q, k, v, key_padding_mask_BN=kpm.to(DEVICE))
    finally:
        kernel.tile_n = kernel.launch = None


def _plan_run(cfg, n: int, q, k, v, **call):
    """The plan called directly (no module padding, so no key padding mask unless given): N = ``n``."""
    from model.attention.kernels.registry import Call

    plan = KERNELS["triton_block"].make_plan(cfg.make_layout(n), cfg.block, n, DEVICE)
    out = plan.run(q, k, v, Call(**call))
    return out, torch.autograd.grad(out, (q, k, v), upstream_grad(out))


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["fixed"])
def test_full_tiles_cut_by_n_without_key_padding(name):
    """Full tiles skip the mask evaluation; a tile the sequence end cuts still masks its keys past N. N = 112 (7
    blocks of 16) with 32-token tiles: the last key tile is layout-full but half outside N, and no key padding mask
    (the plan is called directly) would mask those keys instead."""
    cfg = LAYOUT_EXAMPLES[name](2)
    n = 112
    q, k, v = _inputs(1, n, heads=2)
    t = build_tables(cfg.make_layout(n).bool(), cfg.block, n, TILE, TILE)
    assert (t.fwd_partial == 0).any(), "the layout has no full tile: the mask-free path is not exercised"
    out, g = _plan_run(cfg, n, q, k, v)
    allow = cfg.make_layout(n).bool().repeat_interleave(cfg.block, 1).repeat_interleave(cfg.block, 2)[:, :n, :n]
    s = (q @ k.transpose(-1, -2) / D**0.5).masked_fill(~allow.to(DEVICE), -torch.inf)
    ref = torch.softmax(s, -1) @ v
    ref_g = torch.autograd.grad(ref, (q, k, v), upstream_grad(ref))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for i, (a, b) in enumerate(zip(g, ref_g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, i=i: f"grad {'qkv'[i]}: {m}")


@triton.jit
def _keep_probe(seed_ptr, out_ptr, bh, N, DROPOUT_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores the kernel's own dropout keep mask (``tl_kernels._keep``) of one tile."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n0 = tl.program_id(1) * BLOCK_N
    kept = tl_kernels._keep(seed_ptr, bh, offs_m, n0, N, DROPOUT_P, BLOCK_N)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], kept.to(tl.uint8))


def _keep_masks(n: int, p: float, tile_m: int, tile_n: int, seed: int = 1234, bh: int = 3) -> torch.Tensor:
    """The kernel's dropout keep mask of an ``n`` x ``n`` score matrix, drawn tile by tile (uint8 [n, n])."""
    out = torch.zeros(n, n, dtype=torch.uint8, device=DEVICE)
    seed_t = torch.tensor([seed], dtype=torch.int64, device=DEVICE)
    _keep_probe[(n // tile_m, n // tile_n)](seed_t, out, bh, n, DROPOUT_P=p, BLOCK_M=tile_m, BLOCK_N=tile_n)
    return out


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_dropout_mask_four_philox_lanes_are_tile_free_and_fair():
    """Four uniforms per Philox call (``tl.rand4x``): the mask of an element does not depend on the tile shape (the
    forward's query x key tiles, the dK/dV pass's and any `--measure tiles` launch draw the same mask); each of the
    four lanes (column mod 4) keeps 1 - p of its elements, and two lanes of one call are kept together (1 - p)^2 of
    the time (within 5 sigma: independent outputs, not copies); another (batch, head) draws another mask."""
    n, p = 128, 0.25
    ref = _keep_masks(n, p, 32, 32)
    for tm, tn in ((16, 64), (64, 16)):
        assert torch.equal(_keep_masks(n, p, tm, tn), ref), (tm, tn)
    assert not torch.equal(_keep_masks(n, p, 32, 32, bh=4), ref)
    lanes = ref.view(n, n // 4, 4).cpu().float()
    count = lanes[..., 0].numel()
    sigma = (p * (1 - p) / count) ** 0.5
    for i in range(4):
        assert abs(lanes[..., i].mean() - (1 - p)) < 5 * sigma, (i, lanes[..., i].mean())
    both = (1 - p) ** 2
    sigma2 = (both * (1 - both) / count) ** 0.5
    for i, j in ((0, 1), (1, 2), (2, 3), (0, 3)):
        assert abs((lanes[..., i] * lanes[..., j]).mean() - both) < 5 * sigma2, (i, j)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["dense", "blockbert_n2"])
def test_sliding_window_runs_in_the_kernel(name):
    """ModernBERT's local layers: a fixed sliding-window ``BandMask`` (radius 20 at N = 100, key padding) runs in
    the kernel itself (no fallback warning), equal to dense with the window as a mask; the tables visit only tiles
    the window reaches and mark those it covers partly."""
    import warnings

    from model.attention.band import BandMask

    heads, n, radius = 2, 100, 20
    cfg = None if name == "dense" else A.BlockBERTSparsityConfig(heads, 2, "1:1", block=16)
    band = BandMask(radius, n, heads)
    q, k, v = _inputs(2, n, heads=heads)
    kpm = torch.ones(2, n, dtype=torch.bool)
    kpm[1, 70:] = False

    def run(kernel):
        mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=n, fixed_token_mask=band).to(DEVICE)
        out = mod(q, k, v, key_padding_mask_BN=kpm.to(DEVICE))
        return out, torch.autograd.grad(out, (q, k, v), upstream_grad(out))

    ref, ref_g = run("dense")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the block_gather fallback would warn
        out, g = run("triton_block")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for i, (a, b) in enumerate(zip(g, ref_g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, i=i: f"grad {'qkv'[i]}: {m}")
    t = build_tables(torch.ones(1, 1, 1, dtype=torch.bool), 256, 256, 32, 32, band=(radius, 200))
    i = torch.arange(256)
    allow = ((i[:, None] - i[None, :]).abs() <= radius) & (i[:, None] < 200) & (i[None, :] < 200)
    tiles = allow.view(8, 32, 8, 32)
    any_on, full = tiles.any(3).any(1), tiles.all(3).all(1)
    for qt in range(8):
        lo, hi = t.fwd_offsets_HT[0, qt], t.fwd_offsets_HT[0, qt + 1]
        assert t.fwd_index[lo:hi].tolist() == any_on[qt].nonzero().flatten().tolist()
        assert t.fwd_partial[lo:hi].tolist() == (~full[qt][any_on[qt]]).int().tolist()


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.skipif(
    not ON_CUDA,
    reason="needs a CUDA GPU: the production config (bf16, 64 x 64 tiles, N = 1024) is too slow for Triton's "
    "interpreter, and the interpreter does not check bf16 lowering",
)
def test_gpu_production_config_bf16_64_tiles_with_dropout_documents_and_window():
    """What training runs (issue #56): bf16, the production 64 x 64 tiles, BlockBERT n=2 with 64-token blocks,
    packed documents, key padding and a sliding window in the kernel (no block_gather fallback). Without dropout:
    outputs and gradients against dense in fp32 on the same inputs. With dropout 0.1: the same seed draws the same
    output and gradients bit for bit, another seed another; the output is linear in v under a fixed mask, so
    <out, dO> = <v, dV> holds only if the backward drops what the forward dropped; and the mean of 32 draws is the
    undropped output within a statistical bound (checked on CPU at N = 256, fp32, 8 draws: 0.113 against the
    predicted 0.118)."""
    import warnings

    from model.attention.band import BandMask
    from model.attention.kernels.triton_block import TILE as PRODUCTION_TILE

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 needs compute capability 8.0+")
    kernel = KERNELS["triton_block"]
    old, kernel.tile = kernel.tile, PRODUCTION_TILE
    try:
        B, heads, n, d, radius, p = 2, 12, 1024, 64, 160, 0.1
        cfg = A.BlockBERTSparsityConfig(heads, 2, "1:1", block=64)
        band = BandMask(radius, n, heads)
        doc = torch.zeros(B, n, dtype=torch.long)
        doc[0, 300:301] = 1  # a one-token document
        doc[0, 301:700] = 2
        doc[0, 900:] = -1  # padding
        doc[1, 517:] = 1  # a document boundary inside a tile
        kpm, doc = (doc >= 0).to(DEVICE), doc.to(DEVICE)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, heads, n, d, generator=g).to(DEVICE, torch.bfloat16) for _ in range(3))
        dO = torch.randn(B, heads, n, d, generator=g).to(DEVICE, torch.bfloat16)

        def run(name, dropout_p, dtype=torch.bfloat16, seed=0):
            mod = A.BlockSparseAttention(
                cfg, kernel=name, max_seq_length=n, dropout_p=dropout_p, fixed_token_mask=band
            ).to(DEVICE)
            mod.train(True)
            x = [t.to(dtype).requires_grad_() for t in (q, k, v)]
            torch.manual_seed(seed)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a block_gather fallback would warn
                out = mod(*x, key_padding_mask_BN=kpm, doc_ids_BN=doc)
            return out, torch.autograd.grad(out, x, dO.to(dtype))

        def rel(a, b):
            return ((a.float() - b.float()).norm() / b.float().norm()).item()

        ref, ref_g = run("dense", 0.0, torch.float32)
        out, grads = run("triton_block", 0.0)
        assert out.dtype == torch.bfloat16 and rel(out, ref) < 1e-2, rel(out, ref)
        for i, (a, b) in enumerate(zip(grads, ref_g)):
            assert torch.isfinite(a).all() and rel(a, b) < 2e-2, ("qkv"[i], rel(a, b))

        dropped, dropped_g = run("triton_block", p, seed=5)
        again, again_g = run("triton_block", p, seed=5)
        other, _ = run("triton_block", p, seed=6)
        assert torch.equal(dropped, again) and all(torch.equal(a, b) for a, b in zip(dropped_g, again_g))
        assert not torch.equal(dropped, other)
        lhs = (dropped.double() * dO.double()).sum()
        rhs = (v.double() * dropped_g[2].double()).sum()
        assert abs(lhs - rhs) < 0.02 * abs(lhs), (lhs.item(), rhs.item())
        draws = 32
        mean = torch.stack([run("triton_block", p, seed=s)[0].float() for s in range(draws)]).mean(0)
        err = (mean - out.float()).abs().mean() / out.float().abs().mean()
        # one draw's relative deviation is about sqrt(p / (1 - p)) whatever the softmax weights (noise and output both
        # scale with their l2 norm); the mean of the draws divides it by sqrt(draws): 0.059 here; a bias (a missing
        # 1 / (1 - p)) would add ~p
        assert err < 1.5 * (p / (1 - p) / draws) ** 0.5, err
    finally:
        kernel.tile = old
