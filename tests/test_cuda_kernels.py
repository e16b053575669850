"""The kernels on a CUDA GPU at BERT-base shapes (12 heads x 64, N up to 4096): fp16/bf16 outputs and q/k/v
gradients of every non-reference kernel (tests/registry_cases.CUDA_KERNELS) against an fp32 `dense` reference (not
dense in the same low precision), with DIET score biases, SparseBERT token masks, ragged and fully padded rows,
BlockBERT n=2/n=3, the no-grad evaluation path, and the number of graphs compiled FlexAttention builds. Run by
run_scripts/gpu_check.sh; skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from model import attention as A
from tests.registry_cases import CUDA_KERNELS, upstream_grad


@pytest.fixture(autouse=True)
def _fail_on_recompile_limit(fail_on_recompile_limit):
    """Every test of this module runs with ``fail_on_recompile_limit`` (tests/conftest.py)."""


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

H, D, B = 12, 64, 2
LAYOUTS = {
    "blockbert_n2": lambda: A.BlockBERTSparsityConfig(H, num_blocks=2, head_assignment="10:2", block=64),
    "blockbert_n3": lambda: A.BlockBERTSparsityConfig(H, num_blocks=3, head_assignment="8:2:2", block=64),
    "bigbird": lambda: A.BigBirdSparsityConfig(H, block=64, seed=1),
    "fixed": lambda: A.FixedSparsityConfig(H, block=64),
}


@pytest.fixture(autouse=True)
def _flex_needs_sm80(request):
    """Explicit flex is refused below sm80 (tests/test_cuda_contracts.py checks the refusal)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("kernel") == "flex" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("explicit flex is refused below compute capability 8.0")


def tu_bf16_skip() -> str | None:
    from tests.train_utils import bf16_gpu_skip_reason

    return bf16_gpu_skip_reason()


TOL = {torch.float16: dict(atol=2e-2, rtol=2e-2), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}


def _case(n: int, padding: str, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, device="cuda", generator=g) for _ in range(3))
    kpm = torch.ones(B, n, dtype=torch.bool, device="cuda")
    if padding == "ragged":
        kpm[0, n - 77 :] = False
    elif padding == "all":
        kpm[1] = False
    return q, k, v, kpm


def _fwd_bwd(kernel, cfg, q, k, v, kpm, dtype, grad=True, **extra):
    mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=q.shape[2]).cuda()
    qs, ks, vs = (t.detach().to(dtype).requires_grad_(grad) for t in (q, k, v))
    if not grad:
        with torch.no_grad():
            return mod(qs, ks, vs, key_padding_mask_BN=kpm, **extra), None
    out = mod(qs, ks, vs, key_padding_mask_BN=kpm, **extra)
    go = upstream_grad(out)
    return out, torch.autograd.grad(out, (qs, ks, vs), go)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", CUDA_KERNELS)
@pytest.mark.parametrize("n", [512, 1024, 4096])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_low_precision_against_fp32_dense(name, kernel, n, dtype):
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 needs compute capability 8.0+")
    cfg = LAYOUTS[name]()
    q, k, v, kpm = _case(n, "ragged")
    ref, ref_g = _fwd_bwd("dense", cfg, q, k, v, kpm, torch.float32)
    out, g = _fwd_bwd(kernel, cfg, q, k, v, kpm, dtype)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a.float(), b, **TOL[dtype])


@pytest.mark.parametrize("kernel", CUDA_KERNELS)
def test_fully_padded_rows_token_masks_and_diet_bias_gradients(kernel):
    cfg = LAYOUTS["bigbird"]()
    n = 1024
    q, k, v, kpm = _case(n, "all")
    g = torch.Generator(device="cuda").manual_seed(3)
    tm = torch.rand(H, n, n, device="cuda", generator=g) > 0.3
    tm[0, 5] = False
    rel = torch.randn(1, H, 1, 2 * n - 1, device="cuda", generator=g) * 2
    idx = torch.arange(n, device="cuda")
    bias = rel[..., (idx[None, :] - idx[:, None]) + n - 1].squeeze(2)  # a DIET-REL-like [1, H, N, N] bias
    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    extra32 = {"token_mask": tm, "score_bias": A.DenseScoreBias(bias)}
    ref, ref_g = _fwd_bwd("dense", cfg, q, k, v, kpm, torch.float32, **extra32)
    out, gr = _fwd_bwd(kernel, cfg, q, k, v, kpm, dtype, token_mask=tm, score_bias=A.DenseScoreBias(bias.to(dtype)))
    assert out[1].abs().max() == 0 and out[:, 0, 5].abs().max() == 0  # exact zeros, not NaN
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    for a, b in zip(gr, ref_g):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b, **TOL[dtype])


@pytest.mark.parametrize("kernel", CUDA_KERNELS)
def test_evaluation_path_without_grad(kernel):
    cfg = LAYOUTS["blockbert_n2"]()
    q, k, v, kpm = _case(1024, "ragged")
    ref, _ = _fwd_bwd("dense", cfg, q, k, v, kpm, torch.float32, grad=False)
    out, _ = _fwd_bwd(kernel, cfg, q, k, v, kpm, torch.float16, grad=False)
    torch.testing.assert_close(out.float(), ref, **TOL[torch.float16])


@pytest.mark.skipif(tu_bf16_skip() is not None, reason=str(tu_bf16_skip()))
def test_compiled_flex_builds_few_graphs_over_a_training_like_sequence():
    """Padded and unpadded batches, training and evaluation, a DIET bias and the last short batch of an epoch:
    the compiled FlexAttention stays well below Dynamo's recompile limit (8), so it never falls back to eager."""
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    from model.attention.kernels import flex

    flex._compiled_flex.clear()
    cfg = LAYOUTS["bigbird"]()
    mod = A.BlockSparseAttention(cfg, kernel="flex", max_seq_length=1024).cuda()
    n = 1024
    bias = A.DenseScoreBias(torch.randn(1, H, n, n, device="cuda", dtype=torch.bfloat16))
    for step in range(6):
        for padding in ("none", "ragged"):
            q, k, v, kpm = _case(n, "ragged" if padding == "ragged" else "none", seed=step)
            q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in (q, k, v))
            mask = kpm if padding == "ragged" else None
            mod(q, k, v, key_padding_mask_BN=mask).sum().backward()
            mod(q, k, v, key_padding_mask_BN=mask, score_bias=bias).sum().backward()
            with torch.no_grad():
                mod(q, k, v, key_padding_mask_BN=mask)
    from model.attention.kernels import flex

    graphs = counters["stats"]["unique_graphs"]
    buckets = len(flex._compiled_flex)  # one compiled callable per input signature (flex._flex_fn)
    # fail_on_recompile_limit_hit (autouse fixture) already fails on any fallback to eager; each bucket compiles once
    assert 0 < graphs <= 2 * buckets <= 2 * 8, f"compiled FlexAttention built {graphs} graphs for {buckets} buckets"
