"""block_gather's permutation plan (fast path) for layouts where every query tile attends exactly one aligned key tile.

BlockBERT is the case that matters: with n chunks per head, query chunk i attends key chunk (i + k) mod n. Then no
token gather is needed: q is a *view* ``[B, H*n, N/n, D]`` (tile g = head h, chunk i), and so are k/v when every
head's map is the identity; otherwise k/v take their tiles with one ``index_select`` of whole tiles. One fused SDPA
call for all heads, whose output already is ``[B, H, N, D]``. Compared to the general gather path this saves the
per-token gather and its index_add backward when the map is the identity, and the query/output permutations.

Memory (issue #41): nothing the plan makes is kept for the backward but the attention op's own output. Whenever the
tiles are not plain views (shifted heads' key tiles, copies of q/k/v that cannot be folded, tile-sized masks and
biases) the call runs under :func:`~.gather.kept_attention` (selective checkpointing): the fused SDPA op's output and
logsumexp are kept, the gathers are made again in the backward, the attention forward is not rerun. The encoder's
q/k/v (slices of one ``[B, N, 3, H, D]`` projection) put the tiles on SDPA's batch axis, ``[B*n, H, T, D]``: views,
and an output already in the ``[B, N, H, D]`` memory the output projection reads, so the training step keeps what
dense keeps (tests/test_saved_activations.py; before: one more copy of the output per layer, 1.05x dense's bytes
for the one-layer test model).

Key padding, per-call token masks, the plan's fixed token mask, score biases and dropout go through the same
``sdpa_with_allow`` as the general path (masks and biases are gathered for the tiles), so results match ``dense``
in every case the general path handles. Those per-call masks and biases are tile-sized (``[B, G, T, T]``, as large as
the scores with a float bias): they are made again in the backward too (DIET-REL with padding kept 3.1x the scores,
packed documents 1.1x, before they were).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.attention.band import tile_mask
from model.attention.kernels.block_gather.gather import kept_attention
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
        copies = self.tile_map is not None or not _tiles_are_views(q_BHND, self.chunks)
        if tile_sized or copies or (self.token_mask_GQK is not None and key_padding_mask_BN is not None):
            return kept_attention(lambda q, k, v: self._run(q, k, v, call), q_BHND, k_BHND, v_BHND)
        return self._run(q_BHND, k_BHND, v_BHND, call)

    def _run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        n, T = self.chunks, self.tile
        plain = token_mask is None and score_bias is None and call.doc_ids_BN is None and self.token_mask_GQK is None
        if plain and _tiles_on_batch(q_BHND, n):
            return self._run_on_batch(q_BHND, k_BHND, v_BHND, call)
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

    def _run_on_batch(self, q_BHND, k_BHND, v_BHND, call: Call) -> torch.Tensor:
        """Tiles on SDPA's batch axis, ``[B*n, H, T, D]`` (tile b*n + i holds chunk i of every head of row b): a
        view of the encoder's q/k/v (slices of one ``[B, N, 3, H, D]`` projection), and SDPA's output, in the
        query's layout (flash, cuDNN) or ``[B, T, H, D]`` memory (memory-efficient), is ``[B, N, H, D]`` memory:
        the output projection reads it without a copy. Shifted heads take their key chunks with one gather."""
        key_padding_mask_BN, _, _, dropout_p, scale = call
        B, H, N, D = q_BHND.shape
        n, T = self.chunks, self.tile

        def fold(x: torch.Tensor) -> torch.Tensor:  # [B, H, N, E] -> [B*n, H, T, E]
            return x.unflatten(2, (n, T)).transpose(1, 2).reshape(B * n, H, T, x.shape[-1])

        q = fold(q_BHND)
        src = None
        if self.tile_map is None:
            k, v = fold(k_BHND), fold(v_BHND)
        else:  # src[i, h]: key chunk of query chunk i on head h
            src = (self.tile_map.view(H, n) - torch.arange(H, device=self.tile_map.device)[:, None] * n).t()
            heads = torch.arange(H, device=src.device).expand(n, H)
            k, v = (
                x.unflatten(2, (n, T)).transpose(1, 2)[:, src, heads].reshape(B * n, H, T, x.shape[-1])
                for x in (k_BHND, v_BHND)
            )
        allow = None
        if key_padding_mask_BN is not None:
            kp = key_padding_mask_BN.view(B, n, T)
            allow = kp.view(B * n, 1, 1, T) if src is None else kp[:, src].reshape(B * n, H, 1, T)
        out = sdpa_tiles(q, k, v, allow, None, dropout_p, scale)  # [B*n, H, T, Dv]
        return out.unflatten(0, (B, n)).permute(0, 2, 1, 3, 4).reshape(B, H, N, out.shape[-1])


def _tiles_are_views(x_BHND: torch.Tensor, n: int) -> bool:
    """Whether ``x`` cut into n chunks per head is a view either way (heads-major ``[B, H*n, T, D]`` or on the
    batch axis): else the tiles are copies, which the caller keeps out of the saved tensors."""
    B, H, N, _ = x_BHND.shape
    return x_BHND.stride(1) == N * x_BHND.stride(2) or _tiles_on_batch(x_BHND, n)


def _tiles_on_batch(x_BHND: torch.Tensor, n: int) -> bool:
    """Whether the tiles should go on SDPA's batch axis: the heads-major fold would copy, the batch one is a view
    (the encoder's q/k/v are slices of ``[B, N, 3, H, D]``)."""
    B, H, N, _ = x_BHND.shape
    heads_major = H == 1 or x_BHND.stride(1) == N * x_BHND.stride(2)
    return not heads_major and (B == 1 or x_BHND.stride(0) == N * x_BHND.stride(2))


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
