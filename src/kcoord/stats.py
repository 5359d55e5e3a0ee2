"""Plain counters' one helper: a bucketed histogram that pure code and the shell can fill.

Pure (no I/O, no clock): the caller measures and passes the value. ``node/metrics.py`` reads
these at scrape time and exposes them as Prometheus histograms; nothing here knows Prometheus.
Observing is a bisect and two additions, cheap enough for a request path.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final

# Seconds, for request and commit latencies: 0.5 ms .. 10 s.
LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Seconds, for slow things (rebalances, shard loads): 10 ms .. 10 minutes.
DURATION_BUCKETS_S: Final = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


class Histogram:
    """Counts of observations per bucket (upper bounds, ascending; a value equal to a bound
    falls in that bucket, as Prometheus' ``le``), plus an overflow bucket, and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        assert list(bounds) == sorted(set(bounds)) and bounds, bounds
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (inf, count)."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out
