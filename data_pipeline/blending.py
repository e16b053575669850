"""Deterministic blending of several datasets by weight, computed lazily in O(1) memory.

Stream position ``i`` goes to dataset ``d`` when ``u_i = (i * G) mod 2**64`` (G = 2**64 / golden ratio,
a Weyl sequence) falls in ``[t_d, t_{d+1})``, the thresholds being the cumulative weights scaled to 2**64.
The Weyl sequence is equidistributed with the lowest discrepancy known, so every prefix of the stream
holds each dataset within a few samples of its weight (Megatron's blending greedily keeps the same
property but needs an index of ``num_samples`` entries).

Datasets are consumed in order, so the sample of dataset ``d`` served at position ``i`` is
``j = #{i' < i : d(i') = d}``. That count has a closed form as a difference of two floor sums
``sum_{i<p} floor((a i + b) / m)``, evaluated in O(log m) with integer arithmetic: random access to
any position (exact resume at any ``consumed_samples``) costs microseconds, whatever the run length.
"""

from __future__ import annotations

import numpy as np

_G = 0x9E3779B97F4A7C15
_TWO64 = 1 << 64


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum_{i=0}^{n-1} floor((a*i + b) / m)`` for integers n >= 0, m >= 1, a >= 0, b >= 0 (Euclid-like)."""
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = divmod(y_max, m)
        m, a = a, m


def parse_weights(weights: list[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"blending weights {list(weights)}: need one non-negative number per dataset, not all 0")
    return w / w.sum()


class BlendSchedule:
    """Which dataset, and which of its samples (counting from 0 over all epochs), serves each position."""

    def __init__(self, weights: list[float]) -> None:
        self.weights = parse_weights(weights)
        cum = np.cumsum(self.weights)
        thresholds = [0] + [min(int(round(float(c) * _TWO64)), _TWO64) for c in cum[:-1]] + [_TWO64]
        for k in range(1, len(thresholds)):  # rounding must not make them decrease
            thresholds[k] = max(thresholds[k], thresholds[k - 1])
        self.thresholds = thresholds
        self._inner = np.array(thresholds[1:-1], dtype=np.uint64)

    @property
    def num_datasets(self) -> int:
        return len(self.weights)

    def _count_at_least(self, p: int, x: int) -> int:
        """#{i < p : (i*G mod 2**64) >= x}."""
        if x <= 0:
            return p
        if x >= _TWO64:
            return 0
        return floor_sum(p, _TWO64, _G, _TWO64 - x) - floor_sum(p, _TWO64, _G, 0)

    def counts_before(self, p: int) -> list[int]:
        """How many of positions ``[0, p)`` each dataset serves."""
        ge = [self._count_at_least(p, t) for t in self.thresholds]
        return [ge[d] - ge[d + 1] for d in range(self.num_datasets)]

    def datasets_of(self, positions: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            u = np.asarray(positions, dtype=np.uint64) * np.uint64(_G)
        return np.searchsorted(self._inner, u, side="right").astype(np.int64)

    def assign(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Dataset ``d`` and per-dataset sample number ``j`` of positions ``[start, start + count)``."""
        pos = np.arange(start, start + count, dtype=np.int64)
        d = self.datasets_of(pos)
        if self.num_datasets == 1:
            return d, pos
        base = np.asarray(self.counts_before(start), dtype=np.int64)
        j = np.empty(count, dtype=np.int64)
        for k in range(self.num_datasets):
            sel = d == k
            j[sel] = base[k] + np.arange(int(sel.sum()), dtype=np.int64)
        return d, j

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like ``assign`` for arbitrary positions (grouped into contiguous runs)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        d_out = np.empty(positions.size, dtype=np.int64)
        j_out = np.empty(positions.size, dtype=np.int64)
        order = np.argsort(positions, kind="stable")
        sp = positions[order]
        breaks = np.flatnonzero(np.diff(sp) != 1) + 1
        for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, sp.size]):
            first, n = int(sp[lo]), int(sp[hi - 1] - sp[lo] + 1)
            d, j = self.assign(first, n)
            d_out[order[lo:hi]] = d[sp[lo:hi] - first]
            j_out[order[lo:hi]] = j[sp[lo:hi] - first]
        return d_out, j_out
