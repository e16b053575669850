"""Which rank is slow: a straggler is not a failure (the watchdog is for ranks that stop), but it sets every rank's
pace, so the log names it with its rank and host at the log interval.

Each rank times what it does alone, before the step's first collective can make it wait for others: reading its
micro-batches (host time) and its forward passes (device time: CUDA events on a GPU, read at the log interval, so the
step itself never waits for the device). Under ZeRO-0/1/2 the forward runs no collective; under ZeRO-3 it gathers
parameters, which evens the ranks' forward times out, and mostly a slow data path shows (docs/training.md).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch


class RankTimer:
    """This rank's data and forward time since the last :meth:`take`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._events = device.type == "cuda"
        self.data_s = 0.0
        self.forward_s = 0.0
        self._pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.data_s += time.perf_counter() - start

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        if not self._events:
            start = time.perf_counter()
            try:
                yield
            finally:
                self.forward_s += time.perf_counter() - start
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        try:
            yield
        finally:
            end.record()
            self._pairs.append((begin, end))

    def take(self) -> tuple[float, float]:
        """(data seconds, forward seconds) since the last call; waits for the device (call at a log interval)."""
        if self._pairs:
            self._pairs[-1][1].synchronize()
            self.forward_s += sum(b.elapsed_time(e) for b, e in self._pairs) / 1000.0
            self._pairs.clear()
        out = (self.data_s, self.forward_s)
        self.data_s = self.forward_s = 0.0
        return out


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    what: str
    seconds: float
    median_s: float

    @property
    def ratio(self) -> float:
        return self.seconds / self.median_s if self.median_s > 0 else float("inf")

    def line(self, iteration: int, steps: int) -> str:
        per = 1000.0 / max(steps, 1)
        return (
            f"straggler at iteration {iteration}: rank {self.rank} on {self.host} spent {self.ratio:.1f}x the other "
            f"ranks' median time in {self.what} ({self.seconds * per:.0f} ms vs {self.median_s * per:.0f} ms per step "
            f"over the last {steps} step(s)); the other ranks wait for it"
        )


MIN_COST = 0.1
"""A straggler must also cost this fraction of the window's wall time (its excess over the others' median): a rank
that is 3x slower at a 5 ms forward of a 300 ms step is noise, not what sets the pace."""


def find_straggler(
    times_R2: list[tuple[float, float]], hosts: list[str], ratio: float, window_s: float = 0.0
) -> Straggler | None:
    """The rank whose data or forward time is furthest above the median of the other ranks', if more than ``ratio``
    times it, by at least 1 ms and :data:`MIN_COST` of the window's ``window_s`` seconds."""
    if ratio <= 0 or len(times_R2) < 2:
        return None
    worst: Straggler | None = None
    for col, what in ((0, "data loading"), (1, "the forward pass")):
        values = [t[col] for t in times_R2]
        rank = max(range(len(values)), key=values.__getitem__)
        median = statistics.median(values[:rank] + values[rank + 1 :])  # of the others: with 2 ranks, the other one
        if values[rank] - median < max(1e-3, MIN_COST * window_s) or values[rank] <= ratio * median:
            continue
        cand = Straggler(rank, hosts[rank] if rank < len(hosts) else "?", what, values[rank], median)
        if worst is None or cand.ratio > worst.ratio:
            worst = cand
    return worst
