"""A layer with a fixed token mask that triton_block's kernel does not take (a SparseBERT-style ``[H, n, n]`` mask; here
a window given as a tensor) under ``--attention-kernel triton_block`` (issue #48): the layer's plan is routed once,
when it is made, to the kernel auto's rule picks (flex on CUDA without attention dropout, else block_gather), never
by a per-call fallback; equal to dense. (A ``BandMask`` window, ModernBERT's local layers, runs in the kernel itself:
tests/test_triton_block.py::test_sliding_window_runs_in_the_kernel.)"""

from __future__ import annotations

import warnings

import torch

from model.attention import BlockSparseAttention
from model.attention.band import BandMask
from model.attention.kernels.triton_block import RoutedPlan


def test_window_layers_are_routed_once_without_per_call_fallbacks() -> None:
    H, N, D = 4, 96, 16
    band = BandMask(16, N, H).dense().clone()  # a tensor: not a BandMask, which the kernel takes itself
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, H, N, D, generator=g, requires_grad=True) for _ in range(3))
    mod = BlockSparseAttention(None, "triton_block", N, fixed_token_mask=band)
    line = mod.build_plan(N, torch.device("cpu"))
    plan = mod._plans[next(iter(mod._plans))]
    assert isinstance(plan, RoutedPlan) and plan.chosen == {torch.float32: "block_gather"}
    assert line.startswith("attention kernel triton_block -> block_gather"), line
    ref = BlockSparseAttention(None, "dense", N, fixed_token_mask=band)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = mod(q, k, v)
            grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert not caught, [str(w.message) for w in caught]
    assert len(mod._plans) == 1 and plan.chosen == {torch.float32: "block_gather"}
    want = ref(q, k, v)
    torch.testing.assert_close(out, want)
    for a, b in zip(grads, torch.autograd.grad(want.square().sum(), (q, k, v))):
        torch.testing.assert_close(a, b)
