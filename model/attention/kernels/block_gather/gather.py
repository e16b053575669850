"""block_gather's general plan (any layout): each query tile gathers only the key/value blocks its layout row
names; tiles with the same number of key blocks go through one fused SDPA call (no filler blocks, no mask unless
padding asks for one). One gather for K, one for V, one permutation of Q and of the output, whatever the number of
groups (each large temporary costs page faults on CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.attention.kernels.block_gather.tiles import query_tile_factor, tile_allow, tiles_to_heads
from model.attention.kernels.registry import Call
from model.attention.kernels.sdpa import sdpa_tiles


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
        key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        T = self.tile
        q_tiles = q_BHND.reshape(B, self.num_tiles, T, D)
        if self.perm is not None:
            q_tiles = q_tiles.index_select(1, self.perm)
        k_all = k_BHND.reshape(B, H * N, D).index_select(1, self.flat_index)
        v_all = v_BHND.reshape(B, H * N, Dv).index_select(1, self.flat_index)
        # split (not narrow): its backward is one cat, not a zero-filled full-size tensor per group
        q_parts = q_tiles.split([g.k_index_GK.shape[0] for g in self.groups], 1)
        k_parts = k_all.split([g.k_index_GK.numel() for g in self.groups], 1)
        v_parts = v_all.split([g.k_index_GK.numel() for g in self.groups], 1)
        outs = []
        for g, q, k, v in zip(self.groups, q_parts, k_parts, v_parts):
            G, K = g.k_index_GK.shape
            if K == 0:  # tiles with no key block at all: zeros
                outs.append(q_BHND.new_zeros(B, G, T, Dv))
                continue
            k = k.view(B, G, K, D)
            v = v.view(B, G, K, Dv)
            allow = None
            if key_padding_mask_BN is not None:
                allow = key_padding_mask_BN[:, g.k_index_GK].view(B, G, 1, K)
            allow = tile_allow(
                allow, token_mask, g.token_mask_GQK, g.head_G, g.q_index_GQ, g.k_index_GK, H, N, call.doc_ids_BN
            )
            bias = None if score_bias is None else score_bias.gather(g.head_G, g.q_index_GQ, g.k_index_GK)
            outs.append(sdpa_tiles(q, k, v, allow, bias, dropout_p, scale))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
        if self.inverse is not None:
            out = out.index_select(1, self.inverse)
        return tiles_to_heads(out, H, N)  # no .view: SDPA's output strides differ on CUDA (see there)


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
        tm = None
        if token_mask is not None:
            tm = (
                token_mask.cpu()
                .bool()
                .expand(H, seq_len, seq_len)[head[:, None, None], q_index[:, :, None], k_index[:, None, :]]
                .to(device)
            )
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
