"""``kcoord.stats.Histogram``: Prometheus' bucket semantics (a value equal to a bound is in it)."""

from __future__ import annotations

import math

import pytest

from kcoord.stats import Histogram


def test_buckets_are_cumulative_and_inclusive() -> None:
    h = Histogram((0.1, 1.0, 10.0))
    for value in (0.05, 0.1, 0.5, 1.0, 20.0):
        h.observe(value)
    assert h.cumulative() == [(0.1, 2), (1.0, 4), (10.0, 4), (math.inf, 5)]
    assert h.count == 5
    assert h.sum == pytest.approx(21.65)


def test_bounds_must_ascend() -> None:
    with pytest.raises(AssertionError):
        Histogram((1.0, 0.5))
    with pytest.raises(AssertionError):
        Histogram(())
