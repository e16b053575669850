"""FlexAttention ``BlockMask`` built from block-level data (the layout), never from an element-wise N x N pass.

``create_block_mask`` evaluates the ``mask_mod`` on every ``[B, H, N, N]`` element to find which blocks are empty,
partial or full. Our layouts already are that information at block granularity, so the kernel builds the
BlockMask directly (``BlockMask.from_kv_blocks``): per call with key padding this costs ``B x H x (N/128)^2``
booleans instead of ``B x H x N^2`` (at B=32, N=4096 that is 50 k instead of 6.4 G), and the layout-only mask of a
plan costs nothing per call.

Sparse blocks are ``max(128, layout block)`` tokens (FlexAttention's Triton tiles divide 128; a 16-token sparse
block would force 16-row tiles); a layout block that does not divide 128 (e.g. 48) gets 128-token sparse blocks
summarised from the layout token by token along one axis at a time (``[H, N, N/block]``, not the ``B x H x N^2``
pass of ``create_block_mask`` it replaced). A coarse block is *full* (``mask_mod`` skipped) when every fine layout
block in it is on, every key in it is a real (unpadded) key and the token mask, if any, is all-true there; *partial*
(the ``mask_mod`` decides element by element) when some fine block is on and some key may be attended; else skipped.
The result equals ``create_block_mask`` with the same ``mask_mod`` (tested), except that it may mark fewer blocks
full when a token mask is present (a partial block gives the same output, only slower).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from model.attention.band import BandMask

SPARSE_BLOCK = 128


def sparse_block_size(block: int) -> int | None:
    """The BlockMask granularity for a layout of ``block``-token blocks, or None when none is aligned with both
    (then :func:`layout_block_mask` uses 128-token blocks, each covering parts of several layout blocks)."""
    size = max(SPARSE_BLOCK, block)
    return size if size % block == 0 else None


def _coarse_any_all(layout_HMM: torch.Tensor, block: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, all) of a block layout over ``size``-token sparse blocks that do not align with its blocks: each
    token is mapped to its layout block, one axis at a time (``[H, N, M]`` booleans at most, never N x N)."""
    H, M, _ = layout_HMM.shape
    Mc = -(-M * block // size)
    tok = torch.arange(Mc * size, device=layout_HMM.device)
    fine, valid = (tok // block).clamp(max=M - 1), tok < M * block  # tokens past the end count as off
    rows = (layout_HMM[:, fine] & valid[:, None]).view(H, Mc, size, M)
    r_any, r_all = rows.any(2), rows.all(2)  # [H, Mc, M]
    c_any = (r_any[:, :, fine] & valid).view(H, Mc, Mc, size).any(-1)
    c_all = (r_all[:, :, fine] & valid).view(H, Mc, Mc, size).all(-1)
    return c_any, c_all


def _grouped_any_all(x: torch.Tensor, r: int | tuple[int, ...], dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, all) of bool ``x`` over groups of r along each of its last ``dims`` axes (each -> ceil(len / r)); ``r``
    may give one group size per axis.

    Positions past the end (a length not a multiple of r) count as off: a group reaching past the sequence is never
    all-on, so a sparse block cut by N is never full (as in ``create_block_mask``, whose mask_mod sees those
    positions as masked).
    """
    rs = (r,) * dims if isinstance(r, int) else tuple(r)
    lead, tail = x.shape[:-dims], x.shape[-dims:]
    pads, grouped = [], []
    for n, ri in reversed(list(zip(tail, rs))):
        pads += [0, -(-n // ri) * ri - n]
    for n, ri in zip(tail, rs):
        grouped += [-(-n // ri), ri]
    g = F.pad(x, pads, value=False).view(*lead, *grouped)
    reduce = tuple(range(len(lead) + 1, len(lead) + 2 * dims, 2))
    return g.any(dim=reduce), g.all(dim=reduce)


def _grouped_min_max(x_BN: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of int ``x_BN`` over groups of r positions (the last group may be shorter: positions past the
    end are left out)."""
    B, N = x_BN.shape
    pad = -(-N // r) * r - N
    big = torch.iinfo(x_BN.dtype).max
    lo = F.pad(x_BN, (0, pad), value=big).view(B, -1, r).amin(-1)
    hi = F.pad(x_BN, (0, pad), value=-big).view(B, -1, r).amax(-1)
    return lo, hi


def _to_kv_blocks(on_BHQK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean block matrix -> (kv_num_blocks ``[B, H, Q]`` int32, kv_indices ``[B, H, Q, K]`` int32), the on
    blocks first in increasing key order (what FlexAttention iterates)."""
    num = on_BHQK.sum(-1, dtype=torch.int32)
    idx = torch.argsort((~on_BHQK).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx


def layout_block_mask(
    layout_HMM: torch.Tensor,
    block: int,
    seq_len: int,
    mask_mod: Callable,
    key_valid_BN: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
    doc_ids_BN: torch.Tensor | None = None,
    kv_tile: int | None = None,
    kv_len: int | None = None,
) -> Any:
    """The ``BlockMask`` of ``layout_HMM`` (bool, on the target device) AND key padding AND token mask AND same
    document.

    ``mask_mod`` must compute the same predicate element-wise (it runs inside partial blocks). ``token_mask`` is
    bool broadcastable to ``[H, N, N]`` (or ``[B, H, N, N]``); it only decides which blocks may be full.
    ``doc_ids_BN`` (int ``[B, N]``) enters at block level through each sparse block's smallest and largest id: a
    block pair may hold a same-document pair only if their id ranges overlap (exact for packed rows, where ids
    only grow along the sequence; never wrong for any ids), and is full only when both blocks are one and the same
    document. ``kv_tile``: key tiles narrower than the 128-token query tiles (64: a layout whose 64-token column
    blocks would half fill 128-token key tiles; ``block`` must divide it, no band token mask). ``kv_len``: keys
    from there on are masked (the sequence was padded to the tile past what the layout masks itself).
    """
    from torch.nn.attention.flex_attention import BlockMask

    size = sparse_block_size(block)
    if size is None:  # e.g. block 48: 128-token sparse blocks from the layout, token by token along one axis
        size = SPARSE_BLOCK
        lay_any, lay_all = _coarse_any_all(layout_HMM, block, size)
        size_kv = size
    else:
        size_kv = size if kv_tile is None else kv_tile
        lay_any, lay_all = _grouped_any_all(layout_HMM, (size // block, size_kv // block), 2)  # [H, Mq, Mk]
    Mq, Mk = -(-seq_len // size), -(-seq_len // size_kv)  # (a layout grown past N has blocks beyond)
    partial = lay_any[..., :Mq, :Mk].unsqueeze(0)  # [1, H, Mq, Mk]
    full = lay_all[..., :Mq, :Mk].unsqueeze(0)
    if kv_len is not None:
        bound = torch.arange(Mk * size_kv, device=layout_HMM.device)[None] < kv_len
        key_valid_BN = bound if key_valid_BN is None else key_valid_BN & bound[:, : key_valid_BN.shape[-1]]
    if key_valid_BN is not None:
        k_any, k_all = _grouped_any_all(key_valid_BN, size_kv, 1)  # [B, Mk]
        partial = partial & k_any[:, None, None, :Mk]
        full = full & k_all[:, None, None, :Mk]
    if isinstance(token_mask, BandMask):  # block summaries from the radius (no n x n pass)
        if size_kv != size:
            raise ValueError("a band token mask needs square sparse blocks (kv_tile None)")
        tm_any, tm_all = (
            x.unsqueeze(0).to(layout_HMM.device) for x in token_mask.resized(seq_len).grouped_any_all(size)
        )
        partial = partial & tm_any
        full = full & tm_all
    elif token_mask is not None:
        tm = token_mask if token_mask.dim() == 4 else token_mask.unsqueeze(0)  # [B|1, H|1, N, N]
        tm_any, tm_all = _grouped_any_all(tm, (size, size_kv), 2)
        partial = partial & tm_any
        full = full & tm_all
    if doc_ids_BN is not None:
        lo_q, hi_q = _grouped_min_max(doc_ids_BN, size)  # [B, Mq]
        lo_k, hi_k = _grouped_min_max(doc_ids_BN, size_kv)  # [B, Mk]
        overlap = (lo_q[:, :, None] <= hi_k[:, None, :]) & (lo_k[:, None, :] <= hi_q[:, :, None])
        one = (lo_q == hi_q)[:, :, None] & (lo_k == hi_k)[:, None, :] & (lo_q[:, :, None] == lo_k[:, None, :])
        partial = partial & overlap[:, None]
        full = full & one[:, None]
    dev = layout_HMM.device
    inside_q = (torch.arange(1, Mq + 1, device=dev) * size) <= seq_len  # sparse blocks not cut by N
    inside_k = (torch.arange(1, Mk + 1, device=dev) * size_kv) <= seq_len
    full = full & inside_q[:, None] & inside_k[None, :]  # (all-on implies some-on: full blocks are within partial)
    partial_only = partial & ~full
    B, H = (max(a, b) for a, b in zip(partial_only.shape[:2], full.shape[:2]))  # layout/padding/mask broadcast
    full = full.expand(B, H, -1, -1)
    num, idx = _to_kv_blocks(partial_only.expand(B, H, -1, -1))
    full_num, full_idx = _to_kv_blocks(full)
    return BlockMask.from_kv_blocks(
        num,
        idx,
        full_num,
        full_idx,
        BLOCK_SIZE=(size, size_kv),
        mask_mod=mask_mod,
        seq_lengths=(seq_len, seq_len),
    )


def partial_tiles(bm: Any) -> tuple[int, int]:
    """(partial, full) tiles a BlockMask visits, summed over batch and heads (``kv_num_blocks`` counts the partial
    ones, where the ``mask_mod`` runs element by element; ``full_kv_num_blocks`` the full ones)."""
    full = 0 if bm.full_kv_num_blocks is None else int(bm.full_kv_num_blocks.sum())
    return int(bm.kv_num_blocks.sum()), full
