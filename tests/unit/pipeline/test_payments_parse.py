"""The payments job's parsing step (``mapInArrow`` body) on Arrow batches, without Spark."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from kcoord.pipeline.events import MAX_AHEAD_OF_RECORD_MS, Payment, encode_payment
from kcoord.pipeline.payments import parse_batches
from kcoord.pipeline.source import ARROW_SCHEMA


def _source_batch(values: list[bytes], record_ms: list[int | None]) -> pa.RecordBatch:
    n = len(values)
    columns = {
        "key": [b"k"] * n,
        "value": values,
        "topic": ["payments"] * n,
        "partition": [0] * n,
        "offset": list(range(n)),
        "timestamp": [None if ms is None else ms * 1000 for ms in record_ms],
        "timestampType": [0] * n,
        "headers": [[] for _ in range(n)],
    }
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[f.name], f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA
    )


def test_event_times_are_checked_against_their_records_timestamps() -> None:
    record_ms = 1_767_225_600_000

    def event(ms: int) -> bytes:
        return encode_payment(Payment("p", "acct-1", Decimal("2.50"), "EUR", ms))

    far = record_ms + MAX_AHEAD_OF_RECORD_MS + 1
    batch = _source_batch(
        [event(record_ms - 5), event(far), event(far)], [record_ms, record_ms, None]
    )
    (parsed,) = list(parse_batches(iter([batch])))
    rows = parsed.to_pylist()
    assert [r["reason"] is None for r in rows] == [True, False, True]
    assert "after the record's own" in rows[1]["reason"]
    assert rows[0]["event_time"] is not None
