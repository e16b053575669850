"""block_gather's fast path for layouts where every query tile attends exactly one aligned key tile.

BlockBERT is the case that matters: with n chunks per head, query chunk i attends key chunk (i + k) mod n. Then no
token gather is needed at all. Heads are taken in runs of consecutive heads with the same chunk map; for each run,
q is a *view* ``[B, Hr*n, N/n, D]`` and so are k/v when the map is the identity (k = 0, the common case: 10 of 12
heads in "10:2"); a shifted run takes its key chunks with one ``index_select`` over the chunk axis (a copy of that
run's K/V only). One fused SDPA call per run; the runs' outputs are concatenated along heads. Compared to the
general gather path this saves the gather of all K/V, its index_add backward, and the query/output permutations.

Key padding, per-call token masks, the plan's fixed token mask, score biases and dropout go through the same
``_sdpa_with_allow`` as the general path (masks/biases are gathered for each run's tiles), so results match
``dense`` in every case the general path handles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.attention.bias import ScoreBias


@dataclass
class PermutationRun:
    """Consecutive heads ``[head0, head0 + heads)`` whose query chunk i attends key chunk ``chunk_map[i]``."""

    head0: int
    heads: int
    chunk_map: torch.Tensor | None  # [n] key chunk per query chunk; None = identity (keys are a view)
    head_G: torch.Tensor  # [heads * n] head of each tile (for score biases / token masks)
    q_index_GQ: torch.Tensor  # [heads * n, T] query token ids
    k_index_GK: torch.Tensor  # [heads * n, T] key token ids
    token_mask_GQK: torch.Tensor | None = None  # the plan's fixed element mask inside these tiles


@dataclass
class PermutationPlan:
    tile: int  # T = N / n tokens per chunk
    chunks: int  # n
    runs: list[PermutationRun]
    density: float


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


def make_permutation_plan(lay_HMM: torch.Tensor, r: int, block: int, seq_len: int, device,
                          token_mask: torch.Tensor | None) -> PermutationPlan | None:
    maps = permutation_chunk_maps(lay_HMM, r)
    if maps is None:
        return None
    H, Mq = maps.shape
    T = r * block
    ar = torch.arange(T)
    identity = torch.arange(Mq)
    runs = []
    h = 0
    while h < H:
        e = h + 1
        while e < H and torch.equal(maps[e], maps[h]):
            e += 1
        cmap = maps[h]
        head = torch.arange(h, e).repeat_interleave(Mq)
        q_index = (identity[:, None] * T + ar).repeat(e - h, 1)
        k_index = (cmap[:, None] * T + ar).repeat(e - h, 1)
        tm = None
        if token_mask is not None:
            tm = token_mask.cpu().bool().expand(H, seq_len, seq_len)[head[:, None, None], q_index[:, :, None],
                                                                      k_index[:, None, :]].to(device)
        runs.append(PermutationRun(h, e - h, None if torch.equal(cmap, identity) else cmap.to(device),
                                   head.to(device), q_index.to(device), k_index.to(device), tm))
        h = e
    return PermutationPlan(tile=T, chunks=Mq, runs=runs, density=float(lay_HMM.float().mean()))


def permutation_attention(q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, plan: PermutationPlan,
                          key_padding_mask_BN: torch.Tensor | None, token_mask: torch.Tensor | None,
                          score_bias: ScoreBias | None, dropout_p: float, scale: float | None,
                          sdpa_with_allow) -> torch.Tensor:
    B, H, N, D = q_BHND.shape
    Dv = v_BHND.shape[-1]
    n, T = plan.chunks, plan.tile
    sizes = [run.heads for run in plan.runs]
    # split (not narrow): its backward is one cat instead of a zero-filled full-size tensor per run
    qs, ks, vs = (t.split(sizes, 1) if len(sizes) > 1 else (t,) for t in (q_BHND, k_BHND, v_BHND))
    kpm_tiles = None if key_padding_mask_BN is None else key_padding_mask_BN.view(B, 1, n, 1, T)
    outs = []
    for run, q, k, v in zip(plan.runs, qs, ks, vs):
        G = run.heads * n
        q = q.reshape(B, G, T, D)
        if run.chunk_map is None:
            k = k.reshape(B, G, T, D)
            v = v.reshape(B, G, T, Dv)
        else:
            k = k.reshape(B, run.heads, n, T, D).index_select(2, run.chunk_map).view(B, G, T, D)
            v = v.reshape(B, run.heads, n, T, Dv).index_select(2, run.chunk_map).view(B, G, T, Dv)
        allow = None
        if kpm_tiles is not None:
            kp = kpm_tiles if run.chunk_map is None else kpm_tiles.index_select(2, run.chunk_map)
            allow = kp.expand(B, run.heads, n, 1, T).reshape(B, G, 1, T)
        if token_mask is not None:
            tm = token_mask.expand(H, N, N)[run.head_G[:, None, None], run.q_index_GQ[:, :, None],
                                            run.k_index_GK[:, None, :]].unsqueeze(0)
            allow = tm if allow is None else allow & tm
        if run.token_mask_GQK is not None:
            tm = run.token_mask_GQK.unsqueeze(0)
            allow = tm if allow is None else allow & tm
        bias = None if score_bias is None else score_bias.gather(run.head_G, run.q_index_GQ, run.k_index_GK)
        out = sdpa_with_allow(q, k, v, allow, bias, dropout_p, scale)
        outs.append(out.view(B, run.heads, N, Dv))
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)
