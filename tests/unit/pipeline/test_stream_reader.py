"""The streaming reader's planning on the driver, without Spark running: what ``latestOffset``
and ``partitions`` make of the offsets the cluster reports (``_latest`` stands in for it)."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from kcoord.pipeline.options import DataLossError, parse_source_options
from kcoord.pipeline.source import KcoordStreamReader, RangePartition

TP = ("t", 0)


def reader(fail_on_data_loss: bool, log_start: int, log_end: int) -> KcoordStreamReader:
    options = parse_source_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "failOnDataLoss": str(fail_on_data_loss).lower(),
        },
        streaming=True,
    )
    stream = KcoordStreamReader(options)
    stream._latest = lambda: ([TP], {TP: log_start}, {TP: log_end})  # type: ignore[method-assign]
    return stream


@pytest.mark.parametrize("log_end", [0, 40])
def test_a_partition_whose_log_end_fell_below_the_query_is_data_loss(log_end: int) -> None:
    """The topic was deleted and created again while the query was at offset 100. The end
    was clamped to the start: nothing was planned while the new log stayed below 100, and
    once past it the query read on from 100, skipping the new records 0..99 unreported.
    (A new log already past the old position when the query next looks cannot be told.)"""
    start = {"t": {"0": 100}}
    failing = reader(True, 0, log_end)
    end = failing.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": log_end}}
    with pytest.raises(DataLossError, match="past the log end offset"):
        failing.partitions(start, end)
    # failOnDataLoss=false: the new log is read from its start.
    going_on = reader(False, 0, log_end)
    planned = going_on.partitions(start, going_on.latestOffset(start, ReadAllAvailable()))
    assert [
        (p.offset_range.from_offset, p.offset_range.until_offset)
        for p in planned
        if isinstance(p, RangePartition)
    ] == ([(0, log_end)] if log_end else [])


def test_a_log_grown_back_past_the_query_between_planning_and_reading_is_still_data_loss() -> None:
    """``latestOffset`` saw the log end at 40, below the query at 100; by ``partitions`` the
    new log had passed 100 again, and the range was dropped (its end below its start) and
    the next batch started at 40, skipping nothing it should have reported."""
    start = {"t": {"0": 100}}
    stream = reader(True, 0, 40)
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 40}}
    stream._latest = lambda: ([TP], {TP: 0}, {TP: 150})  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match="past the log end offset"):
        stream.partitions(start, end)
