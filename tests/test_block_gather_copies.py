"""block_gather's BlockBERT plan on the encoder's q/k/v (slices of one ``[B, N, 3, H, D]`` projection) copies only
what must move (issue #48 item 3): chunks folded into SDPA's batch axis as views, no copy at all without shifted
heads, one copy of q/k/v with them (q so that the projection's storage is freed), and an output that already is the
``[B, N, H, D]`` memory the output projection reads (CUDA's SDPA output layouts, emulated). Parity with dense on the
same slices, on CPU and on CUDA's branches."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model.attention import BlockBERTSparsityConfig, BlockSparseAttention
from tests import cuda_contracts as C

COPY_OPS = {"aten.clone", "aten.copy_", "aten.index_select", "aten.cat", "aten.index", "aten._to_copy"}
"""Ops that write a copy of their input (counted by output bytes)."""


class _Copies(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func.overloadpacket) in COPY_OPS and isinstance(out, torch.Tensor):
            self.bytes += out.numel() * out.element_size()
        return out


def _slices(B: int, N: int, H: int, D: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, N, 3, H, D, generator=torch.Generator().manual_seed(seed)).requires_grad_()


@pytest.mark.parametrize("split,n", [("4", 2), ("3:1", 2), ("2:1:1", 3)])
def test_encoder_slices_copy_only_what_moves(split: str, n: int) -> None:
    """Forward copies under CUDA's branches: none without shifted heads; q, k, v once each with them (the old plan:
    q, k and v reshaped into copies, k and v permuted into second copies, 5x); the output a view the output
    projection reads as it is."""
    B, N, H, D = 2, 96, 4, 16
    cfg = BlockBERTSparsityConfig(H, num_blocks=n, head_assignment=split, block=16)
    mod = BlockSparseAttention(cfg, "block_gather", N)
    qkv = _slices(B, N, H, D)
    one = B * N * H * D * 4  # bytes of q (or k, or v)
    with C.emulate_cuda():
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        mod(q, k, v)  # plan built
        with _Copies() as copies:
            out = mod(q, k, v)
    expected = 0 if split == "4" else 3 * one
    assert copies.bytes == expected, f"{copies.bytes / one:.2f}x q's bytes copied, expected {expected / one:.0f}x"
    ctx = out.transpose(1, 2).reshape(B, N, H * D)  # what BertSelfAttention hands its output projection
    assert ctx.data_ptr() == out.data_ptr() and ctx._base is not None, "the output projection's input is a copy"


@pytest.mark.parametrize("emulate", [False, True], ids=["cpu", "cuda_paths"])
@pytest.mark.parametrize("split,n", [("3:1", 2), ("2:1:1", 3)])
@pytest.mark.parametrize("extra", ["plain", "padding", "documents"])
def test_batch_folded_tiles_match_dense(emulate: bool, split: str, n: int, extra: str) -> None:
    """Output and the projection's gradient equal dense's, with key padding or packed documents."""
    B, N, H, D = 2, 96, 4, 16
    cfg = BlockBERTSparsityConfig(H, num_blocks=n, head_assignment=split, block=16)
    qkv = _slices(B, N, H, D, seed=3)
    kw: dict = {}
    if extra == "padding":
        kw["key_padding_mask_BN"] = torch.ones(B, N, dtype=torch.bool)
        kw["key_padding_mask_BN"][1, 70:] = False
    if extra == "documents":
        kw["doc_ids_BN"] = (torch.arange(N) * 3 // N).expand(B, N).contiguous()
    go = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(4))
    results = []
    for kernel in ("dense", "block_gather"):
        mod = BlockSparseAttention(cfg, kernel, N)
        with C.emulate_cuda() if emulate else contextlib.nullcontext():
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            out = mod(q, k, v, **kw)
            (g,) = torch.autograd.grad(out, qkv, go)
        results.append((out.detach(), g))
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)
