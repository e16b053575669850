"""The sparsity of a layout as data for the Triton kernel: per head and query tile the key tiles to visit (CSR), the
transposed lists for the dK/dV pass, and which visited tiles are partial (need the in-tile block lookup).

Built once per plan on the host from the block layout ``[H, M, M]`` (block ``block``) and moved to the device as
int32. A tile of ``tile_m`` x ``tile_n`` tokens is visited when any layout block it overlaps is on; it is *full* when
every block it overlaps (inside the sequence) is on, else *partial*: the kernel then looks each element's block up in
the layout itself (an arithmetic membership check: ``layout[h, i // block, j // block]``). A sliding window
(``band``: ModernBERT's ``|i - j| <= radius`` over the first ``length`` tokens) narrows both: a tile is visited only
when some pair of it is inside the window, and is partial unless all its pairs are (the kernel then checks the
distance too)."""

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


def band_tiles(radius: int, length: int, seq_len: int, tile_m: int, tile_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, all) bool ``[TQ, TK]``: whether some / every token pair of a tile pair (inside ``seq_len``) is inside the
    window ``|i - j| <= radius``, ``i, j < length``. Closed form per tile pair."""

    def ranges(tile: int):
        lo = torch.arange(0, seq_len, tile)
        hi = torch.clamp(lo + tile, max=seq_len) - 1  # last token of the tile inside the sequence
        hi_in = torch.clamp(hi, max=length - 1)  # last token inside the window's length (< lo: none)
        return lo, hi, hi_in

    qlo, qhi, qin = (x[:, None] for x in ranges(tile_m))
    klo, khi, kin = (x[None, :] for x in ranges(tile_n))
    gap = torch.clamp(torch.maximum(klo - qin, qlo - kin), min=0)  # smallest |i - j| over the two ranges
    any_ = (qin >= qlo) & (kin >= klo) & (gap <= radius)
    widest = torch.maximum((khi - qlo).abs(), (qhi - klo).abs())
    all_ = any_ & (qhi < length) & (khi < length) & (widest <= radius)
    return any_, all_


def build_tables(
    layout_HMM: torch.Tensor, block: int, seq_len: int, tile_m: int, tile_n: int, band: tuple[int, int] | None = None
) -> TileTables:
    """The CSR tables of ``layout_HMM`` (bool/int ``[Hl, M, M]``) for a sequence of ``seq_len`` tokens; ``band``:
    ``(radius, length)`` of a sliding window ANDed with the layout."""
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
    if band is not None:
        any_, all_ = band_tiles(*band, seq_len, tile_m, tile_n)
        on = on & any_[None]
        partial = on & (partial | ~all_[None])
    fo, fi, fp, counts = _csr(on, partial)
    bo, bi, bp, _ = _csr(on.transpose(1, 2), partial.transpose(1, 2))
    return TileTables(fo, fi, fp, bo, bi, bp, int(counts.max()), int(on.sum()))
