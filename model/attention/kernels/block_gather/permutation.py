"""block_gather's permutation plan (fast path) for layouts where every query tile attends exactly one aligned key tile.

BlockBERT is the case that matters: with n chunks per head, query chunk i attends key chunk (i + k) mod n. Then no
token gather is needed: q is a *view* ``[B, H*n, N/n, D]`` (tile g = head h, chunk i), and so are k/v when every
head's map is the identity; otherwise k/v take their tiles with one ``index_select`` of whole tiles. One fused SDPA
call for all heads, whose output already is ``[B, H, N, D]``. Compared to the general gather path this saves the
per-token gather and its index_add backward when the map is the identity, and the query/output permutations.

Key padding, per-call token masks, the plan's fixed token mask, score biases and dropout go through the same
``sdpa_with_allow`` as the general path (masks and biases are gathered for the tiles), so results match ``dense``
in every case the general path handles. Those per-call masks and biases are tile-sized (``[B, G, T, T]``, as large as
the scores with a float bias): with any of them the call runs under :func:`~.gather.recomputed`, so they are made
again in the backward instead of being kept (DIET-REL with padding kept 3.1x the scores, packed documents 1.1x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.attention.band import tile_mask
from model.attention.kernels.block_gather.gather import recomputed
from model.attention.kernels.block_gather.tiles import host_mask, tile_allow, tiles_to_heads
from model.attention.kernels.registry import Call
from model.attention.kernels.sdpa import sdpa_tiles


@dataclass
class PermutationPlan:
    """Tile g = h * n + i (head h, query chunk i) attends key tile ``tile_map[g]`` = h * n + map_h(i)."""

    tile: int  # T = N / n tokens per chunk
    chunks: int  # n
    tile_map: torch.Tensor | None  # [H * n] key tile of each query tile; None = identity (keys are a view)
    tile_unmap: torch.Tensor | None  # inverse of tile_map when it is a permutation (BlockBERT), else None
    head_G: torch.Tensor  # [H * n] head of each tile (for score biases / token masks)
    q_index_GQ: torch.Tensor  # [H * n, T] query token ids
    k_index_GK: torch.Tensor  # [H * n, T] key token ids
    token_mask_GQK: torch.Tensor | None  # the plan's fixed element mask inside the tiles
    density: float

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, _, _ = call
        tile_sized = token_mask is not None or score_bias is not None or call.doc_ids_BN is not None
        if tile_sized or (self.token_mask_GQK is not None and key_padding_mask_BN is not None):
            return recomputed(lambda q, k, v: self._run(q, k, v, call), q_BHND, k_BHND, v_BHND)
        return self._run(q_BHND, k_BHND, v_BHND, call)

    def _run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        n, T = self.chunks, self.tile
        G = H * n
        q = q_BHND.reshape(B, G, T, D)  # a view: query tiles are in place
        k = k_BHND.reshape(B, G, T, D)
        v = v_BHND.reshape(B, G, T, Dv)
        if self.tile_unmap is not None:  # a permutation of whole tiles: backward is the inverse permutation
            k = _PermuteTiles.apply(k, self.tile_map, self.tile_unmap)
            v = _PermuteTiles.apply(v, self.tile_map, self.tile_unmap)
        elif self.tile_map is not None:  # some key tile serves several query tiles: index_select (index_add backward)
            k = k.index_select(1, self.tile_map)
            v = v.index_select(1, self.tile_map)
        allow = None
        if key_padding_mask_BN is not None:
            kp = key_padding_mask_BN.view(B, 1, n, T).expand(B, H, n, T).reshape(B, G, 1, T)
            allow = kp if self.tile_map is None else kp.index_select(1, self.tile_map)
        allow = tile_allow(
            allow, token_mask, self.token_mask_GQK, self.head_G, self.q_index_GQ, self.k_index_GK, H, N, call.doc_ids_BN
        )
        bias = None if score_bias is None else score_bias.gather(self.head_G, self.q_index_GQ, self.k_index_GK)
        return tiles_to_heads(sdpa_tiles(q, k, v, allow, bias, dropout_p, scale), H, N)  # no .view: see there


class _PermuteTiles(torch.autograd.Function):
    """``x.index_select(1, perm)`` whose backward is ``grad.index_select(1, inverse)``: one read and one write,
    instead of index_select's zero-filled buffer plus index_add."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return x.index_select(1, perm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(1, inverse), None, None


def permutation_chunk_maps(lay_HMM: torch.Tensor, r: int) -> torch.Tensor | None:
    """``[H, M/r]`` key chunk of each query chunk if every query chunk (r blocks, identical rows) attends exactly
    one aligned chunk of r key blocks; else None."""
    H, M, _ = lay_HMM.shape
    Mq = M // r
    if Mq < 2:  # a single chunk is full attention: the general path handles it
        return None
    coarse = lay_HMM[:, ::r].reshape(H, Mq, Mq, r)  # [H, query chunk, key chunk, block in chunk]
    full = coarse.all(-1)
    if not bool((coarse.any(-1) == full).all()) or not bool((full.sum(-1) == 1).all()):
        return None
    return full.to(torch.int64).argmax(-1)


def make_permutation_plan(
    lay_HMM: torch.Tensor, r: int, block: int, seq_len: int, device, token_mask: torch.Tensor | None
) -> PermutationPlan | None:
    maps = permutation_chunk_maps(lay_HMM, r)
    if maps is None:
        return None
    H, n = maps.shape
    T = r * block
    ar = torch.arange(T)
    head = torch.arange(H).repeat_interleave(n)
    tile_map = (torch.arange(H)[:, None] * n + maps).reshape(-1)
    q_index = (torch.arange(n)[:, None] * T + ar).repeat(H, 1)
    k_index = maps.reshape(-1)[:, None] * T + ar
    tm = None if token_mask is None else tile_mask(host_mask(token_mask), head, q_index, k_index).to(device)
    identity = torch.equal(tile_map, torch.arange(H * n))
    bijective = torch.equal(tile_map.sort().values, torch.arange(H * n))
    return PermutationPlan(
        tile=T,
        chunks=n,
        tile_map=None if identity else tile_map.to(device),
        tile_unmap=torch.argsort(tile_map).to(device) if bijective and not identity else None,
        head_G=head.to(device),
        q_index_GQ=q_index.to(device),
        k_index_GK=k_index.to(device),
        token_mask_GQK=tm,
        density=float(lay_HMM.float().mean()),
    )
