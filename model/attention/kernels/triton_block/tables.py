"""The sparsity of a layout as data for the Triton kernel: per head and query tile the key tiles to visit (CSR), the
transposed lists for the dK/dV pass, and which visited tiles are partial (need the in-tile block lookup).

Built once per plan on the host from the block layout ``[H, M, M]`` (block ``block``) and moved to the device as
int32. A tile of ``tile_m`` x ``tile_n`` tokens is visited when any layout block it overlaps is on; it is *full* when
every block it overlaps (inside the sequence) is on, else *partial*: the kernel then looks each element's block up in
the layout itself (an arithmetic membership check: ``layout[h, i // block, j // block]``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TileTables:
    """CSR lists of visited tiles, rows = query tiles (``fwd_*``) and rows = key tiles (``bwd_*``), per layout head."""

    fwd_offsets_HT: torch.Tensor
    """int32 ``[Hl, TQ + 1]``: query tile t of head h visits ``fwd_index[fwd_offsets[h, t]:fwd_offsets[h, t + 1]]``."""
    fwd_index: torch.Tensor
    """int32: key tile numbers, flat over heads and query tiles."""
    fwd_partial: torch.Tensor
    """int32, same length as ``fwd_index``: 1 where the tile needs the in-tile block lookup."""
    bwd_offsets_HT: torch.Tensor
    """int32 ``[Hl, TK + 1]``: key tile t of head h is visited by the query tiles ``bwd_index[...]``."""
    bwd_index: torch.Tensor
    """int32: query tile numbers, flat over heads and key tiles."""
    bwd_partial: torch.Tensor
    """int32: 1 where the tile needs the in-tile block lookup."""
    max_visits: int
    """The most tiles one query tile visits (for the benchmarks' density figures)."""
    visited: int
    """Tiles visited over all heads (tile density = visited / (Hl * TQ * TK))."""


def _overlap(n: int, tile: int, block: int, m: int) -> torch.Tensor:
    """float ``[T, M]``: how many tokens of block b lie in tile t (inside the first ``n`` tokens)."""
    pos = torch.arange(n)
    t = torch.zeros(-(-n // tile), m)
    t.index_put_((pos // tile, (pos // block).clamp(max=m - 1)), torch.ones(n), accumulate=True)
    return t


def _csr(on_HTS: torch.Tensor, partial_HTS: torch.Tensor):
    counts = on_HTS.sum(-1)  # [Hl, T]
    offsets = torch.zeros(on_HTS.shape[0], on_HTS.shape[1] + 1, dtype=torch.int64)
    offsets[:, 1:] = counts.cumsum(-1)
    base = torch.cat([torch.zeros(1, dtype=torch.int64), counts.sum(-1).cumsum(0)[:-1]])
    offsets = offsets + base[:, None]  # flat over heads
    h, t, s = on_HTS.nonzero(as_tuple=True)  # row-major: heads, then tiles, then key tiles in order
    return offsets.to(torch.int32), s.to(torch.int32), partial_HTS[h, t, s].to(torch.int32), counts


def build_tables(layout_HMM: torch.Tensor, block: int, seq_len: int, tile_m: int, tile_n: int) -> TileTables:
    """The CSR tables of ``layout_HMM`` (bool/int ``[Hl, M, M]``) for a sequence of ``seq_len`` tokens."""
    lay = layout_HMM.detach().cpu().bool().float()
    m = lay.shape[-1]
    if m * block < seq_len:
        raise ValueError(f"layout of {m} blocks of {block} covers {m * block} tokens, fewer than seq_len={seq_len}")
    ov_q = _overlap(seq_len, tile_m, block, m)  # [TQ, M]
    ov_k = _overlap(seq_len, tile_n, block, m)  # [TK, M]
    on_count = torch.einsum("tm,hmn,sn->hts", ov_q, lay, ov_k)  # allowed token pairs per tile pair
    total = ov_q.sum(1)[:, None] * ov_k.sum(1)[None, :]
    on = on_count > 0
    partial = on & (on_count < total[None])
    fo, fi, fp, counts = _csr(on, partial)
    bo, bi, bp, _ = _csr(on.transpose(1, 2), partial.transpose(1, 2))
    return TileTables(fo, fi, fp, bo, bi, bp, int(counts.max()), int(on.sum()))
