"""CUDA's scaled-dot-product-attention contracts, emulated on CPU.

No GPU runs our CI, and CPU SDPA hides what CUDA does differently: it returns contiguous outputs, accepts any dtype,
and our kernels take CPU-only branches on CPU tensors (the tile fold of ``sdpa_with_allow(fold_tiles=True)``, the
split plan, host reads of masks). :func:`emulate_cuda` sends CPU tensors down the branches a CUDA device takes (it
replaces ``model.cpu_shortcuts.takes_cpu_path``, the one question those branches ask) and replaces
``torch.nn.functional.scaled_dot_product_attention`` with a dispatcher that picks a backend by torch's CUDA rules
and returns what that backend returns on CUDA: its output strides, its refusals, its mask preprocessing.

Here, below the benchmarks, so that both the contract tests (tests/test_cuda_contracts.py, through
tests/cuda_contracts.py) and ``benchmarks.attention --measure memory --emulate-cuda`` (what a GPU keeps for the
backward) run the same emulation. Backend selection is model/attention/sdpa_backend.py's (torch's
``select_sdp_backend`` rules, with the backends enabled by ``torch.nn.attention.sdpa_kernel``, so tests force a
backend the same way on the emulation and on a real GPU); the trainer's start-up line asks the same module.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from model.attention.sdpa_backend import H100, minimum_gemm_alignment, select_backend
from model.attention.sdpa_backend import GPUProfile as EmulatedGPU
from model.attention.sdpa_backend import SDPAParams as _Params


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """transformers/attention.cpp ``convert_boolean_attn_mask``: a bool mask becomes 0 / -inf in the query's dtype."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    return mask


def efficient_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, gpu: EmulatedGPU) -> torch.Tensor:
    """The mask memory-efficient attention receives. transformers/attention.cpp ``preprocess_mask``: unless every
    stride but the last is a multiple of 8 and the last is 1 (``aligned_tensor<8>``), the mask is copied into a
    buffer whose last dim is padded to a multiple of 8 (``pad_bias``), then expanded to ``[B, H, Q, K]``. The kernel
    then checks (cuda/mem_eff_attention/kernel_forward.h ``check_supported``) that the bias's batch, head and row
    strides are multiples of its alignment (128 bits on tensor-core GPUs) and its dtype is the query's."""
    m = _additive_mask(mask, q.dtype)
    while m.dim() < 4:
        m = m.unsqueeze(0)
    aligned = m.stride(-1) == 1 and all(s % 8 == 0 for s in m.stride()[:-1])
    if not aligned:
        K = m.shape[-1]
        padded = F.pad(m, (0, 8 - K % 8))
        m = padded[..., :K]
    m = m.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    kernel_align = minimum_gemm_alignment(q, gpu)
    bad = [s for s in m.stride()[:3] if s % kernel_align]
    assert not bad, f"attn_bias is not correctly aligned (strides {m.stride()}, alignment {kernel_align})"
    assert m.dtype == q.dtype, "invalid dtype for bias - should match query's dtype"
    return m


def _math(q, k, v, mask, dropout_p: float, scale: float | None) -> torch.Tensor:
    """transformers/attention.cpp ``_scaled_dot_product_attention_math``: softmax(q k^T * scale + mask), dropout,
    times v; fp16/bf16 computed in fp32 here (the CUDA kernels accumulate in fp32), returned contiguous."""
    s = scale if scale is not None else q.shape[-1] ** -0.5
    scores = (q.float() @ k.float().transpose(-1, -2)) * s
    if mask is not None:
        scores = scores + _additive_mask(mask, torch.float32).float()
    probs = torch.softmax(scores, -1)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    return (probs @ v.float()).to(q.dtype)


@torch.library.custom_op("sparsebert_emulation::fused_sdpa", mutates_args=())
def fused_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    scale: float | None,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_math` as one fused CUDA backend op (flash, memory-efficient, cuDNN): ``(out, logsumexp, rng state)``.
    One op, as on CUDA, so selective checkpointing (model/attention/kernels/block_gather/gather.py) can keep its
    output; its autograd keeps q, k, v, the mask, the output and a ``[B, H, Q]`` fp32 logsumexp, no score matrix,
    so ``saved_tensors_hooks`` and allocator counts under the emulation see CUDA's bytes. The scores are computed
    for :data:`EMULATED_ROWS` query rows at a time (CUDA's kernels tile them too)."""
    rng = torch.get_rng_state()
    with torch.no_grad():
        out = torch.cat([_math(q[..., r, :], k, v, _rows(mask, r), dropout_p, scale) for r in _row_chunks(q)], -2)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)  # the logsumexp's bytes (values unused here)
    return backend_layout(out, q, backend), lse, rng


def _fused_setup(ctx, inputs, output):
    q, k, v, mask, dropout_p, scale, _ = inputs
    out, lse, rng = output
    ctx.dropout_p, ctx.scale = dropout_p, scale
    ctx.save_for_backward(q, k, v, mask, out, lse, rng)


def _fused_backward(ctx, dout, _dlse, _drng):
    """The fused backward: the scores again, one chunk of query rows at a time, with the forward's RNG stream (the
    same chunks draw the same dropout)."""
    q, k, v, mask, _, _, rng = ctx.saved_tensors
    wants = [t is not None and w for t, w in zip((q, k, v, mask), ctx.needs_input_grad[:4])]
    grads = [torch.zeros_like(t) if w else None for w, t in zip(wants, (q, k, v, mask))]
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(rng)
        for r in _row_chunks(q):
            qr = q[..., r, :].detach().requires_grad_(wants[0])
            kd, vd = k.detach().requires_grad_(wants[1]), v.detach().requires_grad_(wants[2])
            m = None if mask is None else mask.detach().requires_grad_(wants[3])
            with torch.enable_grad():
                out = _math(qr, kd, vd, _rows(m, r), ctx.dropout_p, ctx.scale)
            idx = [i for i, w in enumerate(wants) if w]
            if not idx:
                continue
            got = torch.autograd.grad(out, [(qr, kd, vd, m)[i] for i in idx], dout[..., r, :], allow_unused=True)
            for i, dg in zip(idx, got):
                if dg is None:
                    continue
                if i == 0:
                    grads[0][..., r, :] += dg
                else:
                    grads[i] += dg
    return (*grads, None, None, None)


fused_sdpa.register_autograd(_fused_backward, setup_context=_fused_setup)


EMULATED_ROWS = 128
"""Query rows whose scores the emulated fused backends hold at once, so the emulation's transient
memory stays O(N) like CUDA's tiled kernels instead of holding [B, H, N, N] scores."""


def _row_chunks(q: torch.Tensor) -> list[slice]:
    """Query row chunks (the backward replays the forward's RNG stream over the same chunks, so dropout matches;
    like CUDA's Philox stream, it is not the one an unchunked CPU call draws)."""
    L = q.shape[-2]
    return [slice(i, min(L, i + EMULATED_ROWS)) for i in range(0, max(L, 1), EMULATED_ROWS)]


def _rows(mask: torch.Tensor | None, r: slice) -> torch.Tensor | None:
    """``mask``'s part for query rows ``r`` (a mask broadcast over rows is returned whole)."""
    if mask is None or mask.dim() < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., r, :]


def with_stride_order_of(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x``'s values laid out in memory with ``like``'s dim order (what ``empty_like(like)`` allocates for a dense
    ``like``), through differentiable ops."""
    order = sorted(range(like.dim()), key=lambda d: (-like.stride(d), d))
    inverse = [order.index(d) for d in range(like.dim())]
    return x.permute(order).contiguous().permute(inverse)


@dataclass
class Emulation:
    """What one :func:`emulate_cuda` block saw: the backend of every SDPA call."""

    gpu: EmulatedGPU
    backends: Counter = field(default_factory=Counter)

    def sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """``F.scaled_dot_product_attention`` as CUDA runs it (see the module docstring)."""
        if is_causal or enable_gqa:
            raise NotImplementedError("the emulation covers what the kernels call: no is_causal, no enable_gqa")
        if attn_mask is not None and attn_mask.dtype not in (torch.bool, query.dtype):
            raise RuntimeError(f"Expected attn_mask dtype to be bool or to match query dtype, got {attn_mask.dtype}")
        p = _Params(query, key, value, attn_mask, dropout_p)
        backend = select_backend(p, self.gpu)
        self.backends[backend] += 1
        mask = attn_mask
        if backend == "efficient" and mask is not None:
            mask = efficient_mask(mask, query, key, self.gpu)
        if backend == "math":
            out = _math(query, key, value, mask, dropout_p, scale)
        else:  # a fused kernel keeps q, k, v, its mask, the output and a logsumexp: no scores
            out = fused_sdpa(query, key, value, mask, dropout_p, scale, backend)[0]
        return out  # math: matmul output, contiguous; fused: in the backend's layout (backend_layout)


def backend_layout(out: torch.Tensor, query: torch.Tensor, backend: str) -> torch.Tensor:
    """``out`` in the memory layout the fused ``backend`` returns on CUDA."""
    if backend == "efficient":
        # cuda/attention.cu _scaled_dot_product_efficient_attention_cuda: the kernel writes [B, T, H, D]
        # (_efficient_attention_forward allocates res as {B, M, num_heads, Kv}) and SDPA returns its
        # transpose(1, 2): a [B, H, T, D] view whose T and H strides are swapped
        return out.transpose(1, 2).contiguous().transpose(1, 2)
    # cuda/attention.cu _scaled_dot_product_flash_attention_cuda hands flash q.transpose(1, 2), whose output
    # is empty_like(q) (flash_api.cpp mha_fwd), transposed back: the output has the query's layout.
    # cudnn/MHA.cpp allocates its output with alloc_with_matching_layout(q, ...): the same rule
    return with_stride_order_of(out, query)


@contextlib.contextmanager
def emulate_cuda(gpu: EmulatedGPU = H100):
    """Within the block, CPU tensors take CUDA's branches and SDPA keeps ``gpu``'s contracts (module docstring)."""
    import model.cpu_shortcuts

    real = model.cpu_shortcuts.takes_cpu_path
    # every module that imported it by name (the HF export needs `from model.cpu_shortcuts import ...`), and
    # model.cpu_shortcuts itself, whose cpu_all reads it from there
    holders = [
        m for name, m in list(sys.modules.items()) if name.startswith("model") and vars(m).get("takes_cpu_path") is real
    ]
    from model.attention.kernels.block_gather import gather

    emulation = Emulation(gpu)
    saved_sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = emulation.sdpa
    fused = torch.ops.sparsebert_emulation.fused_sdpa.default
    kept = getattr(gather, "KEPT_OPS", set())  # selective checkpointing keeps the fused op's output, as CUDA's
    added = fused not in kept
    kept.add(fused)
    for m in holders:
        m.takes_cpu_path = lambda where: False
    try:
        yield emulation
    finally:
        F.scaled_dot_product_attention = saved_sdpa
        if added:
            kept.discard(fused)
        for m in holders:
            m.takes_cpu_path = real
