"""``triton_block``'s backward allocates no fp32 temporary bigger than one float per query row (issue #48 item 5):
the row sums ``delta = rowsum(dO * O)`` come from a Triton program (``bwd_preprocess``), not from
``(do.float() * o.float()).sum(-1)``, whose three ``[B, H, N, D]`` fp32 temporaries made the kernel 1.16x dense
memory on the H200 run of bf3efde.

Every tensor the backward's torch ops create is recorded by a dispatch mode (Triton launches are not torch ops, and
the interpreter runs on the arguments' own storage): bf16 inputs, so any fp32 tensor is a temporary of ours. The same
check runs compiled on a CUDA machine."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model import attention as A
from model.attention.kernels import KERNELS
from tests.registry_cases import LAYOUT_EXAMPLES, upstream_grad

pytest.importorskip("triton", reason="triton is not installed (requirements.txt installs it for CPU torch)")

ON_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")


class _Allocations(TorchDispatchMode):
    """The largest tensor (in elements) each dtype's ops returned while active."""

    def __init__(self):
        super().__init__()
        self.largest: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest[t.dtype] = max(self.largest.get(t.dtype, 0), t.numel())
        return out


@pytest.fixture(autouse=True)
def _small_tiles():
    from model.attention.kernels.triton_block import interpreting

    if not ON_CUDA and not interpreting():
        pytest.skip("Triton was imported without TRITON_INTERPRET=1 in this process (tests/conftest.py sets it)")
    kernel = KERNELS["triton_block"]
    old, kernel.tile = kernel.tile, 32
    yield
    kernel.tile = old


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_backward_has_no_fp32_temporary_of_size_BHND(dropout_p):
    B, H, N, D = 2, 4, 64, 16
    cfg = LAYOUT_EXAMPLES["blockbert_n2"](H)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(DEVICE, torch.bfloat16).requires_grad_() for _ in range(3))
    mod = A.BlockSparseAttention(cfg, kernel="triton_block", max_seq_length=N, dropout_p=dropout_p).to(DEVICE)
    mod.train(dropout_p > 0)
    out = mod(q, k, v)
    up = upstream_grad(out.float()).to(out.dtype)
    with _Allocations() as seen:
        grads = torch.autograd.grad(out, (q, k, v), up)
    assert all(gr.dtype == torch.bfloat16 and torch.isfinite(gr.float()).all() for gr in grads)
    fp32 = seen.largest.get(torch.float32, 0)
    assert fp32 <= B * H * N, (
        f"triton_block's backward made an fp32 tensor of {fp32} elements (> B*H*N = {B * H * N}): {seen.largest}"
    )
