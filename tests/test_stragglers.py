"""The straggler verdict (pretrain/stragglers.py) on given per-rank times: the slowest rank past the ratio, named
with its host and what it was slow in; nothing below the ratio, below 1 ms, with one rank, or with the ratio 0."""

from __future__ import annotations

import pytest
import torch

from pretrain.args import ArgsError, LoopConfig
from pretrain.stragglers import RankTimer, find_straggler

HOSTS = ["node001", "node001", "node002", "node002"]


def test_the_slowest_rank_past_the_ratio_is_named_with_its_host():
    times = [(0.010, 0.20), (0.011, 0.21), (0.012, 0.62), (0.010, 0.19)]
    s = find_straggler(times, HOSTS, 1.5, window_s=2.0)  # 420 ms more than the others over 2 s
    assert (s.rank, s.host, s.what) == (2, "node002", "the forward pass")
    assert find_straggler(times, HOSTS, 1.5, window_s=5.0) is None  # 420 ms of 5 s: below MIN_COST
    assert s.ratio == pytest.approx(0.62 / 0.20)  # against the others' median (0.19, 0.20, 0.21)
    line = s.line(iteration=100, steps=10)
    assert line.startswith("straggler at iteration 100: rank 2 on node002 spent 3.1x the other ranks' median time")
    assert "(62 ms vs 20 ms per step over the last 10 step(s))" in line


def test_with_two_ranks_the_other_rank_is_the_reference():
    s = find_straggler([(0.001, 0.2), (0.401, 0.2)], HOSTS, 1.5)
    assert (s.rank, s.what, round(s.ratio)) == (1, "data loading", 401)


def test_data_loading_and_forward_are_judged_apart_and_the_worse_ratio_wins():
    times = [(0.01, 0.20), (0.09, 0.20), (0.01, 0.40), (0.01, 0.20)]  # data 9x the median, forward 2x
    s = find_straggler(times, HOSTS, 1.5)
    assert (s.rank, s.what) == (1, "data loading")


@pytest.mark.parametrize(
    "times, ratio",
    [
        ([(0.01, 0.20), (0.01, 0.29), (0.01, 0.21), (0.01, 0.20)], 1.5),  # 1.4x: within the ratio
        ([(0.0001, 0.2), (0.0009, 0.2)], 1.5),  # 9x, but under 1 ms: timer noise
        ([(0.01, 0.2), (0.01, 0.9)], 0),  # disabled
        ([(0.01, 0.005), (0.01, 0.015)], 1.5),  # 3x, but 10 ms of a 300 ms window (below MIN_COST)
        ([(0.01, 0.2)], 1.5),  # one rank
    ],
)
def test_no_straggler(times, ratio):
    assert find_straggler(times, HOSTS, ratio, window_s=0.3) is None


def test_the_cpu_timer_counts_and_resets():
    t = RankTimer(torch.device("cpu"))
    with t.data():
        sum(range(10000))
    with t.forward():
        torch.ones(100, 100) @ torch.ones(100, 100)
    data_s, fwd_s = t.take()
    assert data_s > 0 and fwd_s > 0
    assert t.take() == (0.0, 0.0)


@pytest.mark.parametrize("bad", [1.0, 0.5, -2])
def test_a_ratio_that_cannot_mean_slow_is_refused(bad):
    with pytest.raises(ArgsError, match=r"--straggler-ratio must be above 1 \(or 0 to disable\)"):
        LoopConfig(train_iters=1, straggler_ratio=bad)
