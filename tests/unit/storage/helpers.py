"""Shared builders for storage tests."""

from __future__ import annotations

from pathlib import Path

from kcoord.storage import format as fmt
from kcoord.storage.config import LogConfig
from kcoord.storage.log import Log


def batch(
    n: int = 1,
    *,
    timestamp: int = 1_000,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    keys: list[bytes | None] | None = None,
    values: list[bytes | None] | None = None,
) -> bytes:
    """A producer-style batch of ``n`` records at offsets 0..n-1 (the log reassigns them)."""
    records = [
        fmt.Record(
            i,
            timestamp + i,
            keys[i] if keys is not None else key,
            values[i] if values is not None else value,
        )
        for i in range(n)
    ]
    return fmt.build_batch(records)


def read_all(lg: Log, start: int | None = None) -> list[fmt.Record]:
    """Every record from ``start`` (default: log start) to the end, through ``Log.read``."""
    offset = lg.log_start_offset if start is None else start
    out: list[fmt.Record] = []
    while offset < lg.log_end_offset:
        data = lg.read(offset, 64 * 1024)
        if data.empty:
            break
        for pos, _h in fmt.iter_headers(data.records):
            out.extend(r for r in fmt.decode_records(data.records, pos) if r.offset >= offset)
        last = list(fmt.iter_headers(data.records))[-1][1]
        offset = last.next_offset
    return out


def open_log(path: Path, config: LogConfig | None = None, **kwargs: object) -> Log:
    return Log.open(path, config or LogConfig(), **kwargs)  # type: ignore[arg-type]
