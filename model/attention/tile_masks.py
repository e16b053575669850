"""Masks for attention computed on tiles: the per-call token mask and a plan's fixed element mask, gathered for
the tiles' query and key positions, ANDed into the tiles' ``allow`` mask. Shared by every tiled path (general
gather, permutation fast path, split path) so that all apply masks identically."""

from __future__ import annotations

import torch


def tile_allow(allow: torch.Tensor | None, token_mask: torch.Tensor | None, fixed_GQK: torch.Tensor | None,
               head_G: torch.Tensor, q_index_GQ: torch.Tensor, k_index_GK: torch.Tensor, H: int,
               N: int) -> torch.Tensor | None:
    """``allow`` (bool ``[B|1, G, Q|1, K]`` or None) AND the tiles' part of ``token_mask`` (bool, broadcastable to
    ``[H, N, N]``) AND ``fixed_GQK`` (the plan's mask inside the tiles). None means everything is allowed."""
    if token_mask is not None:
        tm = token_mask
        while tm.dim() < 3:
            tm = tm.unsqueeze(0)
        tm = tm.expand(H, N, N)[head_G[:, None, None], q_index_GQ[:, :, None], k_index_GK[:, None, :]].unsqueeze(0)
        allow = tm if allow is None else allow & tm
    if fixed_GQK is not None:
        tm = fixed_GQK.unsqueeze(0)
        allow = tm if allow is None else allow & tm
    return allow
