"""Blending: exact floor sums, lazy counts equal brute-force counting, proportions hold in every prefix."""

from __future__ import annotations

import numpy as np
import pytest

from data_pipeline.blending import BlendSchedule, floor_sum, parse_weights


def test_floor_sum_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n, m = int(rng.integers(0, 60)), int(rng.integers(1, 50))
        a, b = int(rng.integers(0, 200)), int(rng.integers(0, 200))
        assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))
    # the 64-bit case used by the schedule
    G, M = 0x9E3779B97F4A7C15, 1 << 64
    for n in (0, 1, 2, 17, 1000):
        assert floor_sum(n, M, G, 12345) == sum((G * i + 12345) // M for i in range(n))


@pytest.mark.parametrize("weights", [[1.0], [0.25, 0.75], [0.5, 0.3, 0.2], [1, 0, 3], [0.001, 0.999]])
def test_lazy_counts_equal_brute_force(weights):
    s = BlendSchedule(weights)
    P = 5000
    d = s.datasets_of(np.arange(P))
    # j = number of earlier positions that went to the same dataset
    expect_j = np.zeros(P, dtype=np.int64)
    seen = np.zeros(len(weights), dtype=np.int64)
    for i, k in enumerate(d):
        expect_j[i] = seen[k]
        seen[k] += 1
    for start in (0, 1, 777, 4000):
        dd, jj = s.assign(start, P - start)
        np.testing.assert_array_equal(dd, d[start:])
        np.testing.assert_array_equal(jj, expect_j[start:])
        assert s.counts_before(start) == [int((d[:start] == k).sum()) for k in range(len(weights))]
    pos = np.array([4999, 3, 4, 5, 100, 3, 2500])
    dl, jl = s.locate(pos)
    np.testing.assert_array_equal(dl, d[pos])
    np.testing.assert_array_equal(jl, expect_j[pos])


def test_every_prefix_close_to_weights_and_far_positions_are_cheap():
    w = parse_weights([0.25, 0.75])
    s = BlendSchedule([1, 3])
    d = s.datasets_of(np.arange(100_000))
    counts = np.cumsum(np.eye(2, dtype=np.int64)[d], axis=0)
    ideal = np.arange(1, 100_001)[:, None] * w[None, :]
    assert np.abs(counts - ideal).max() < 5  # low-discrepancy (O(log n)): a few samples off at most, in every prefix
    far = 10**12  # resuming a trillion samples in costs the same as at the start
    c = s.counts_before(far)
    assert sum(c) == far and abs(c[0] - far * 0.25) < 100


def test_bad_weights():
    with pytest.raises(ValueError, match="weights"):
        BlendSchedule([0, 0])
    with pytest.raises(ValueError, match="weights"):
        BlendSchedule([-1, 2])
