"""What every block_gather plan shares: the query tile height a layout allows, and the masks of attention computed
on tiles (the per-call token mask and a plan's fixed element mask, gathered for the tiles' query and key positions,
ANDed into the tiles' ``allow`` mask), so the general gather, permutation and split paths apply masks identically."""

from __future__ import annotations

import torch

from model.attention.band import BandMask
from model.attention.kernels.registry import same_document


def host_mask(mask: torch.Tensor | BandMask) -> torch.Tensor | BandMask:
    """A plan's fixed token mask on the host for plan building (a band needs no copy)."""
    return mask if isinstance(mask, BandMask) else mask.cpu().bool()


def tile_allow(
    allow: torch.Tensor | None,
    token_mask: torch.Tensor | None,
    fixed_GQK: torch.Tensor | None,
    head_G: torch.Tensor,
    q_index_GQ: torch.Tensor,
    k_index_GK: torch.Tensor,
    H: int,
    N: int,
    doc_ids_BN: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``allow`` (bool ``[B|1, G, Q|1, K]`` or None) AND the tiles' part of ``token_mask`` (bool, broadcastable to
    ``[H, N, N]``) AND ``fixed_GQK`` (the plan's mask inside the tiles) AND, for packed sequences, same document
    (``doc_ids_BN`` gathered at the tiles' query and key positions: ``[B, G, Q, K]``, no N x N mask). None means
    everything is allowed."""
    if token_mask is not None:
        tm = token_mask
        while tm.dim() < 3:
            tm = tm.unsqueeze(0)
        tm = tm.expand(H, N, N)[head_G[:, None, None], q_index_GQ[:, :, None], k_index_GK[:, None, :]].unsqueeze(0)
        allow = tm if allow is None else allow & tm
    if fixed_GQK is not None:
        tm = fixed_GQK.unsqueeze(0)
        allow = tm if allow is None else allow & tm
    if doc_ids_BN is not None:
        same = same_document(doc_ids_BN[:, q_index_GQ], doc_ids_BN[:, k_index_GK])
        allow = same if allow is None else allow & same
    return allow


def query_tile_factor(layout_HMM: torch.Tensor) -> int:
    """Largest r dividing M such that the r query blocks of every tile have identical layout rows on every head.

    Merging them into one query tile loses nothing (same key set) and gives the fused attention kernel taller
    tiles: BlockBERT at block 64, N=4096, n=2 becomes 2 query tiles of 2048 rows per head; Fixed with 4-block
    local windows gets tiles of 4 blocks.
    """
    H, M, _ = layout_HMM.shape
    for r in sorted((d for d in range(2, M + 1) if M % d == 0), reverse=True):
        t = layout_HMM.view(H, M // r, r, M)
        if bool((t == t[:, :, :1]).all()):
            return r
    return 1


def tiles_to_heads(out_BGTD: torch.Tensor, H: int, N: int) -> torch.Tensor:
    """Tiles ``[B, H*n, T, D]`` (tile g = head g // n, rows (g % n)*T ...) as ``[B, H, N, D]``.

    A view when the tiles are contiguous (CPU, flash, cuDNN and math outputs of contiguous queries, gathered
    outputs). CUDA's memory-efficient backend returns ``[B, T, G, D]`` memory seen as ``[B, G, T, D]``
    (tests/cuda_contracts.py), which no view can merge: then one copy, straight into ``[B, N, H, D]`` memory, the
    layout the output projection reads (its ``transpose(1, 2).reshape`` is then free), instead of a copy here and
    another one there."""
    B, G, T, D = out_BGTD.shape
    if out_BGTD.is_contiguous():
        return out_BGTD.view(B, H, N, D)
    n = G // H
    return out_BGTD.unflatten(1, (H, n)).permute(0, 2, 3, 1, 4).reshape(B, N, H, D).transpose(1, 2)
