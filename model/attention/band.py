"""A banded token mask (ModernBERT's sliding window, ``|i - j| <= radius``) that is never stored as ``[H, n, n]``.

A dense boolean window mask costs n^2 bytes per layer and head (0.8 GB per ModernBERT local layer at n=8192 with 12
heads). :class:`BandMask` keeps the radius and the length and answers what each kernel asks, in its own tiling:
the block layout it touches, the element mask inside gathered tiles, FlexAttention's block summaries and element
predicate, and a dense tensor only for the ``dense`` reference kernel (which is O(n^2) anyway).
:func:`tile_mask` and :func:`dense_mask` accept either form, so plans treat both alike.
"""

from __future__ import annotations

import math

import torch


class BandMask:
    """True where ``|i - j| <= radius`` and both ``i, j < length``, for every head, on a ``size x size`` grid
    (``size >= length``: positions past ``length`` are padding and masked)."""

    is_meta = False

    def __init__(self, radius: int, length: int, num_heads: int, size: int | None = None):
        if radius < 0 or length < 1:
            raise ValueError(f"BandMask needs radius >= 0 and length >= 1 (got {radius}, {length})")
        self.radius, self.length, self.num_heads = int(radius), int(length), int(num_heads)
        self.size = self.length if size is None else int(size)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.num_heads, self.size, self.size))

    def dim(self) -> int:
        return 3

    def key(self) -> tuple:
        """What makes two band masks equal (plan caches hash it instead of n^2 bytes)."""
        return ("band", self.radius, self.length, self.num_heads, self.size)

    def resized(self, size: int) -> "BandMask":
        """The same band on a ``size`` grid (cropped, or padded with masked positions)."""
        return BandMask(self.radius, min(self.length, size), self.num_heads, size)

    def tiles(self, head_G: torch.Tensor, q_index_GQ: torch.Tensor, k_index_GK: torch.Tensor) -> torch.Tensor:
        """bool ``[G, Q, K]`` inside tiles (tile g: query tokens ``q_index_GQ[g]``, key tokens ``k_index_GK[g]``)."""
        q, k = q_index_GQ[:, :, None], k_index_GK[:, None, :]
        return ((q - k).abs() <= self.radius) & (q < self.length) & (k < self.length) & (k >= 0)

    def dense(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """bool ``[H, size, size]`` (an expanded view of one ``[size, size]`` mask): for the dense kernel only."""
        i = torch.arange(self.size, device=device)
        return self.tiles(torch.zeros(1, dtype=torch.long), i[None], i[None])[0].expand(self.num_heads, -1, -1)

    def grouped_any_all(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(any, all) over ``r x r`` token groups, each ``[1, M, M]`` with ``M = ceil(size / r)``; groups reaching
        past ``size`` are never all-on. Closed form per group pair, O(M^2)."""
        M = math.ceil(self.size / r)
        a = torch.arange(M)
        lo = a * r
        hi = torch.minimum(lo + r, torch.tensor(self.length)) - 1  # last valid token of each group (< lo: none)
        valid = hi >= lo
        qlo, qhi, klo, khi = lo[:, None], hi[:, None], lo[None, :], hi[None, :]
        # smallest |i - j| over the two ranges: 0 if they overlap, else the gap
        gap = torch.clamp(torch.maximum(klo - qhi, qlo - khi), min=0)
        largest = torch.maximum((khi - qlo).abs(), (qhi - klo).abs())
        any_ = valid[:, None] & valid[None, :] & (gap <= self.radius)
        full_group = (lo + r <= self.length)[:, None] & (lo + r <= self.length)[None, :]
        all_ = any_ & full_group & (largest <= self.radius)
        return any_.unsqueeze(0), all_.unsqueeze(0)

    def block_layout(self, block: int) -> torch.Tensor:
        """int64 ``[H, M, M]``: a block is on iff one of its elements is allowed."""
        any_, _ = self.grouped_any_all(block)
        return any_.expand(self.num_heads, -1, -1).to(torch.int64).contiguous()

    def sparsity(self, n: int | None = None) -> float:
        """1 - allowed / n^2 over the first ``n`` positions (closed form, no mask made)."""
        n = min(self.length, self.size if n is None else n)
        d = torch.arange(n)
        allowed = int(
            (torch.minimum(d + self.radius, torch.tensor(n - 1)) - torch.clamp(d - self.radius, min=0) + 1).sum()
        )
        return 1.0 - allowed / (n * n)

    def __repr__(self) -> str:
        return f"BandMask(radius={self.radius}, length={self.length}, heads={self.num_heads}, size={self.size})"


def tile_mask(
    mask: torch.Tensor | BandMask, head_G: torch.Tensor, q_index_GQ: torch.Tensor, k_index_GK: torch.Tensor
) -> torch.Tensor:
    """bool ``[G, Q, K]``: a fixed token mask (dense ``[H|1, n, n]`` or a :class:`BandMask`) inside tiles."""
    if isinstance(mask, BandMask):
        return mask.tiles(head_G, q_index_GQ, k_index_GK)
    m = mask
    while m.dim() < 3:
        m = m.unsqueeze(0)
    h = head_G if m.shape[0] > 1 else torch.zeros_like(head_G)
    return m[h[:, None, None], q_index_GQ[:, :, None], k_index_GK[:, None, :]]


def dense_mask(mask: torch.Tensor | BandMask | None, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """A fixed token mask as a bool tensor (a band is materialised: the dense kernel and exports only)."""
    if mask is None or isinstance(mask, torch.Tensor):
        return mask
    return mask.dense(device)
