"""SDPA with a boolean allow-mask and an additive bias: the one attention call that dense and every tiled
block_gather path share, so all of them treat fully masked rows, masks and biases identically."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.cpu_shortcuts import cpu_all, takes_cpu_path


def _deterministic_cuda(q: torch.Tensor) -> bool:
    return not takes_cpu_path(q) and torch.are_deterministic_algorithms_enabled()


def _sdpa(q, k, v, mask, dropout_p: float, scale: float | None) -> torch.Tensor:
    """torch's SDPA; on CUDA with deterministic algorithms on (``--deterministic``) its math backend, since the
    flash and memory-efficient backward passes accumulate with atomics and are not deterministic (torch only warns
    under ``warn_only=True``). The math backend is matmuls and a softmax: deterministic with cuBLAS's fixed
    workspace, slower and larger."""
    if _deterministic_cuda(q):
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def sdpa_with_allow(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allow: torch.Tensor | None,
    bias: torch.Tensor | None,
    dropout_p: float,
    scale: float | None,
    fold_tiles: bool = False,
) -> torch.Tensor:
    """SDPA where ``allow`` (bool, broadcastable to the scores; None = all) and ``bias`` (additive) are combined.

    Rows with no allowed key are computed against all keys and then zeroed, so no NaN reaches values or grads.

    ``fold_tiles``: the inputs are ``[B, G, T, D]`` tiles, which the CPU path moves to SDPA's batch axis. Why: torch's
    CPU flash backward runs faster on ``[B*G, 1, T, D]`` than on ``[B, G, T, D]`` (same data, same FLOPs;
    measurement in docs/model.md). For B == 1 the fold is a free view; for B > 1 it is used only when the inputs are
    contiguous (so q/k/v fold as views) and no bias is shared across the batch (which would be copied B times).
    """
    if fold_tiles and _folds(q, k, v, bias):
        B, G = q.shape[:2]
        out = sdpa_with_allow(*(_fold_heads(t, B, G) for t in (q, k, v, allow, bias)), dropout_p, scale)
        return out.transpose(0, 1) if B == 1 else out.reshape(B, G, *out.shape[2:])
    if allow is None:
        mask = None if bias is None else bias.to(q.dtype)
        return _sdpa(q, k, v, mask, dropout_p, scale)
    row_any = allow.any(-1, keepdim=True)
    # on CPU, skip the fix-up (a full-size multiply) when every row has a key; on GPU avoid the host sync
    fix = not cpu_all(row_any)
    if fix:
        allow = allow | ~row_any
    mask = allow if bias is None else bias.to(q.dtype).masked_fill(~allow, float("-inf"))
    out = _sdpa(q, k, v, mask, dropout_p, scale)
    return out * row_any.to(out.dtype) if fix else out


def _folds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether :func:`sdpa_with_allow` folds these tiles (CPU path; B == 1, or contiguous with a per-sample bias)."""
    B = q.shape[0]
    return takes_cpu_path(q) and (
        B == 1 or (all(t.is_contiguous() for t in (q, k, v)) and (bias is None or bias.shape[0] == B))
    )


def _fold_heads(x: torch.Tensor | None, B: int, G: int) -> torch.Tensor | None:
    """``[B|1, G|1, ...]`` -> ``[B*G, 1, ...]`` (a view for inputs; masks/biases broadcast over B are expanded)."""
    if x is None:
        return None
    if B == 1:
        return x.transpose(0, 1)
    return x.expand(B, G, *x.shape[2:]).reshape(B * G, 1, *x.shape[2:])
