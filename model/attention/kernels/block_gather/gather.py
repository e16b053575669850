"""block_gather's general plan (any layout): each query tile gathers only the key/value blocks its layout row
names; tiles with the same number of key blocks go through fused SDPA calls (no filler blocks, no mask unless
padding asks for one).

Memory: a query tile's gathered keys are a copy, and tiles of one head gather overlapping keys (Fixed, block 16,
N=4096: the copies are 16.8x K and V, 2x the tile scores at head size 64). So they are never kept for the backward:
each chunk of tiles (its copies within half the tile scores) is computed under :func:`recomputed`, which keeps only q, k
and v (what any attention backward needs) and gathers again in the backward. The masks and biases made for the
tiles (padding, packed documents, DIET) are recomputed the same way. The price is one more forward of the chunk in
the backward; measured in docs/model.md (attention memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from model.attention.band import tile_mask
from model.attention.kernels.block_gather.tiles import host_mask, query_tile_factor, tile_allow, tiles_to_heads
from model.attention.kernels.registry import Call
from model.attention.kernels.sdpa import sdpa_with_allow

PEAK_FRACTION = 0.5
"""A chunk's K/V copies stay within this fraction of the plan's tile scores (the layout's bound): the copies of all
tiles are (D + Dv) / T times the scores (Fixed block 16, 64-row tiles, head size 64: 2x), so a plan runs in about
2 (D + Dv) / (T * PEAK_FRACTION) chunks whatever N. Fewer, larger chunks run faster on CPU: each chunk's backward
fills a zero gradient the size of q/k/v (2-core box, Fixed block 16, N=2048, B=2, 4 heads, fwd+bwd: one chunk
1.11 s, 3-4 chunks 1.5-2.0 s under load, the old plan that kept the copies 1.04 s)."""


def recomputed(fn, *inputs: torch.Tensor) -> torch.Tensor:
    """``fn(*inputs)`` whose intermediates autograd does not keep: recomputed in the backward (non-reentrant
    ``torch.utils.checkpoint``, RNG preserved so dropout matches). Without grad, a plain call."""
    if not torch.is_grad_enabled():
        return fn(*inputs)
    return torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False)


def take_rows(x_BHND: torch.Tensor, head_G: torch.Tensor, index_GX: torch.Tensor) -> torch.Tensor:
    """``[B, G, X, D]``: rows ``index_GX[g]`` of head ``head_G[g]`` (a copy; a non-contiguous input is not copied
    whole first)."""
    B, H, N, D = x_BHND.shape
    G, X = index_GX.shape
    if x_BHND.is_contiguous():
        flat = (head_G[:, None] * N + index_GX).reshape(-1)
        return x_BHND.view(B, H * N, D).index_select(1, flat).view(B, G, X, D)
    return x_BHND[:, head_G[:, None], index_GX]


@dataclass
class GatherGroup:
    """Query tiles whose rows attend to the same number of key tokens K: one fused SDPA call."""

    start: int  # first position of this group's tiles in the permuted tile order
    head_G: torch.Tensor  # [G] head of each tile
    q_index_GQ: torch.Tensor  # [G, Q] query token ids
    k_index_GK: torch.Tensor  # [G, K] key token ids gathered for each tile (K may be 0)
    k_offset: int  # where this group's G*K gathered keys start in the one gathered K/V tensor
    token_mask_GQK: torch.Tensor | None = None  # the plan's fixed element mask inside these tiles (None = all on)


@dataclass
class GatherPlan:
    """How block_gather computes one layout at one padded length with gathered key tiles grouped by key count."""

    tile: int  # query rows per tile
    num_tiles: int  # H * Mq
    groups: list[GatherGroup]
    perm: torch.Tensor | None  # tile order grouped by key count; None if already in order
    inverse: torch.Tensor | None  # undoes perm
    flat_index: torch.Tensor  # all groups' key rows into k.reshape(B, H*N, D), concatenated
    density: float

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        # key rows per chunk: copies (D + Dv) per row within PEAK_FRACTION of the scores (T per row)
        budget = PEAK_FRACTION * self.tile * self.flat_index.numel() / (D + Dv)
        outs = []
        for g in self.groups:
            G, K = g.k_index_GK.shape
            if K == 0:  # tiles with no key block at all: zeros
                outs.append(q_BHND.new_zeros(B, G, self.tile, Dv))
                continue
            per = max(1, int(budget // K))
            for s in range(0, G, per):
                chunk = slice(s, min(G, s + per))
                outs.append(
                    recomputed(lambda q, k, v, g=g, c=chunk: _tiles(g, c, q, k, v, call), q_BHND, k_BHND, v_BHND)
                )
        out = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
        if self.inverse is not None:
            out = out.index_select(1, self.inverse)
        return tiles_to_heads(out, H, N)  # no .view: SDPA's output strides differ on CUDA (see there)


def _tiles(g: GatherGroup, c: slice, q_BHND, k_BHND, v_BHND, call: Call) -> torch.Tensor:
    """Attention of the tiles ``c`` of group ``g``: ``[B, tiles, T, Dv]``."""
    key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
    B, H, N, _ = q_BHND.shape
    head, qi, ki = g.head_G[c], g.q_index_GQ[c], g.k_index_GK[c]
    G, K = ki.shape
    q, k, v = take_rows(q_BHND, head, qi), take_rows(k_BHND, head, ki), take_rows(v_BHND, head, ki)
    allow = None
    if key_padding_mask_BN is not None:
        allow = key_padding_mask_BN[:, ki].view(B, G, 1, K)
    fixed = None if g.token_mask_GQK is None else g.token_mask_GQK[c]
    allow = tile_allow(allow, token_mask, fixed, head, qi, ki, H, N, call.doc_ids_BN)
    bias = None if score_bias is None else score_bias.gather(head, qi, ki)
    return sdpa_with_allow(q, k, v, allow, bias, dropout_p, scale, fold_tiles=True)


def make_gather_plan(
    layout_HMM: torch.Tensor,
    block: int,
    seq_len: int,
    device: torch.device | str,
    token_mask: torch.Tensor | None = None,
) -> GatherPlan:
    """The general plan (any layout): gathered key tiles grouped by key count."""
    lay = layout_HMM.cpu().bool()
    H, M, _ = lay.shape
    r = query_tile_factor(lay)
    tile = r * block
    lay_q = lay[:, ::r].reshape(-1, M)  # [H*Mq, M]
    Mq = M // r
    counts = lay_q.sum(-1)
    ar = torch.arange(block)
    groups, order, flats = [], [], []
    start = offset = 0
    for c in sorted(set(counts.tolist())):
        rows = (counts == c).nonzero().squeeze(1)
        head = rows // Mq
        kblocks = lay_q[rows].nonzero()[:, 1].view(len(rows), c)  # increasing key order
        k_index = (kblocks[..., None] * block + ar).reshape(len(rows), c * block)
        q_index = (rows % Mq)[:, None] * tile + torch.arange(tile)
        tm = None if token_mask is None else tile_mask(host_mask(token_mask), head, q_index, k_index).to(device)
        groups.append(GatherGroup(start, head.to(device), q_index.to(device), k_index.to(device), offset, tm))
        flats.append((head[:, None] * seq_len + k_index).reshape(-1))
        order.append(rows)
        start += len(rows)
        offset += k_index.numel()
    perm = torch.cat(order)
    in_order = torch.equal(perm, torch.arange(H * Mq))
    return GatherPlan(
        tile=tile,
        num_tiles=H * Mq,
        groups=groups,
        perm=None if in_order else perm.to(device),
        inverse=None if in_order else torch.argsort(perm).to(device),
        flat_index=torch.cat(flats).to(device),
        density=float(lay.float().mean()),
    )
