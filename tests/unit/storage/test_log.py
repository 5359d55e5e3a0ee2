"""The partition log: append, read, indexes, roll, retention, compaction, truncation, recovery."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcoord.storage import checkpoint
from kcoord.storage import format as fmt
from kcoord.storage import log as log_module
from kcoord.storage import segment as segment_module
from kcoord.storage.config import LONG_MAX, LogConfig
from kcoord.storage.index import OffsetIndex
from kcoord.storage.log import (
    CleanerStats,
    CleanResult,
    InvalidRecordError,
    InvalidTimestampError,
    LeaderScan,
    Log,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    RecoveryReport,
    RolledFlush,
    UnexpectedAppendOffsetError,
    parse_partition_dir,
)
from kcoord.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    Duplicate,
    ProducerStateManager,
)
from kcoord.storage.segment import LogCorruptError
from tests.unit.storage.helpers import batch, open_log, read_all

SMALL = LogConfig(segment_bytes=2_000, index_interval_bytes=200)


def test_append_assigns_offsets_and_reads_back(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    first = lg.append_as_leader(batch(3), leader_epoch=5, now_ms=0)
    second = lg.append_as_leader(batch(2), leader_epoch=5, now_ms=0)
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset) == (3, 4)
    assert lg.log_end_offset == 5
    records = read_all(lg)
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    data = lg.read(0, 10_000)
    assert all(h.partition_leader_epoch == 5 for _, h in fmt.iter_headers(data.records))
    assert lg.epoch_cache.entries == [(5, 0)]


def test_read_respects_max_bytes_high_watermark_and_min_one(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    for _ in range(5):
        lg.append_as_leader(batch(2, value=b"x" * 100), leader_epoch=0, now_ms=0)
    size = fmt.parse_header(lg.read(0, 10_000).records).size
    assert len(lg.read(0, size * 2).records) == size * 2
    assert len(lg.read(0, 1).records) == size  # min one batch
    assert lg.read(0, 1, min_one=False).empty
    assert len(lg.read(0, 10_000, max_offset=4).records) == size * 2  # HW 4: batches 0-1, 2-3
    assert lg.read(4, 10_000, max_offset=4).empty
    # A read from the middle of a batch returns that whole batch.
    assert lg.read(3, 10_000).first_batch_offset == 2
    assert lg.read(10, 100).empty
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(11, 100)


def test_roll_by_size_and_time(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1_000, segment_ms=60_000))
    for _ in range(10):
        lg.append_as_leader(batch(1, value=b"x" * 200), leader_epoch=0, now_ms=0)
    assert len(lg.segments) > 2
    assert all(s.size <= 1_000 for s in lg.segments)
    names = sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))
    assert names == [f"{s.base_offset:020d}.log" for s in lg.segments]
    # Time-based roll (Kafka's timeWaitedForRoll): a batch whose timestamp is more than
    # segment.ms after the segment's first batch rolls; the wall clock does not matter.
    count = len(lg.segments)
    first_ts = lg.active_segment.first_batch_timestamp
    assert first_ts is not None
    lg.append_as_leader(batch(1, timestamp=first_ts), leader_epoch=0, now_ms=10**12)
    assert len(lg.segments) == count
    lg.append_as_leader(batch(1, timestamp=first_ts + 60_001), leader_epoch=0, now_ms=0)
    assert len(lg.segments) == count + 1
    assert [r.offset for r in read_all(lg)] == list(range(12))


def test_closed_segments_have_trimmed_indexes(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    for _ in range(30):
        lg.append_as_leader(batch(2, value=b"y" * 60), leader_epoch=0, now_ms=0)
    closed = lg.segments[0]
    assert os.path.getsize(closed.offset_index.path) == len(closed.offset_index) * 8 > 0
    assert os.path.getsize(closed.time_index.path) == len(closed.time_index) * 12
    # The active index is preallocated.
    assert os.path.getsize(lg.active_segment.offset_index.path) == SMALL.segment_index_bytes
    lg.close()
    assert os.path.getsize(lg.active_segment.offset_index.path) % 8 == 0
    assert os.path.getsize(lg.active_segment.offset_index.path) < SMALL.segment_index_bytes


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=60),
    value_len=st.integers(0, 300),
    probes=st.lists(st.integers(0, 400), min_size=1, max_size=20),
)
def test_offset_and_time_lookups_match_a_linear_scan(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], value_len: int, probes: list[int]
) -> None:
    lg = open_log(tmp_path_factory.mktemp("p") / "t-0", SMALL)
    ts = 10_000
    for n in sizes:
        # Timestamps go up and down within a batch and across batches.
        records = [
            fmt.Record(i, ts + ((i * 37) % 11) - 5, b"k", b"v" * value_len) for i in range(n)
        ]
        lg.append_as_leader(fmt.build_batch(records), leader_epoch=0, now_ms=0)
        ts += 3
    everything: list[fmt.Record] = []
    for seg in lg.segments:
        raw = seg.read_at(0, seg.size)
        for pos, _ in fmt.iter_headers(raw):
            everything.extend(fmt.decode_records(raw, pos))
    assert [r.offset for r in everything] == list(range(lg.log_end_offset))
    for probe in probes:
        offset = probe % lg.log_end_offset
        data = lg.read(offset, 1)
        header = fmt.parse_header(data.records)
        assert header.base_offset <= offset <= header.last_offset
        target_ts = 10_000 + probe % (ts - 10_000 + 10) - 5
        expected = next(
            ((r.offset, r.timestamp) for r in everything if r.timestamp >= target_ts), None
        )
        assert lg.offset_for_timestamp(target_ts) == expected


def test_bytes_between_batch_boundaries_is_the_size_of_the_batches(tmp_path: Path) -> None:
    """What a waiting fetch adds up (DelayedFetch): positions only, across segments."""
    lg = open_log(tmp_path / "t-0", SMALL)
    for n in range(1, 40):
        lg.append_as_leader(batch(n % 4 + 1, value=b"y" * 40), leader_epoch=0, now_ms=0)
    assert len(lg.segments) > 3
    headers = [bp.header for seg in lg.segments for bp in seg.scan_headers()]
    for first in headers[::3]:
        for end in headers[::5]:
            expected = sum(
                h.size
                for h in headers
                if h.base_offset >= first.base_offset and h.next_offset <= end.next_offset
            )
            for start in (first.base_offset, first.last_offset):
                assert lg.bytes_between(start, end.next_offset) == expected, (start, end)
    assert lg.bytes_between(0, lg.log_end_offset) == sum(seg.size for seg in lg.segments)
    assert lg.bytes_between(5, 5) == 0


def test_bytes_between_skips_a_gap_compaction_left_at_a_segments_end(tmp_path: Path) -> None:
    lg = _compacted(tmp_path)
    for i in range(40):
        # Runs of unique keys, then of one key written again and again: the runs of the
        # latter are compacted away, some at a segment's end.
        lg.append_as_leader(batch(1, key=b"u%d" % i if i % 8 < 4 else b"r"), 0, now_ms=0)
    lg.roll()
    lg.compact(now_ms=0)
    # An offset in a segment's range past its last batch.
    ends = [
        (i, max(bp.header.next_offset for bp in seg.scan_headers()))
        for i, seg in enumerate(lg.segments[:-1])
        if seg.size
    ]
    i, gap = next((i, end) for i, end in ends if end < lg.segments[i + 1].base_offset)
    later = [bp.header for seg in lg.segments[i + 1 :] for bp in seg.scan_headers()]
    assert lg.bytes_between(gap, lg.log_end_offset) == sum(h.size for h in later)


def test_truncate_to_removes_suffix_and_epochs(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    for epoch in range(4):
        for _ in range(10):
            lg.append_as_leader(batch(2, value=b"z" * 50), leader_epoch=epoch, now_ms=0)
    assert lg.epoch_cache.entries == [(0, 0), (1, 20), (2, 40), (3, 60)]
    assert lg.truncate_to(45) == 44  # the batch 44-45 goes whole
    assert lg.log_end_offset == 44
    assert lg.epoch_cache.entries == [(0, 0), (1, 20), (2, 40)]
    assert [r.offset for r in read_all(lg)] == list(range(44))
    assert lg.epoch_cache.end_offset_for(1, lg.log_end_offset) == (1, 40)
    assert lg.epoch_cache.end_offset_for(2, lg.log_end_offset) == (2, 44)
    # Appending after truncation continues from the new end, and the log reopens intact.
    lg.append_as_leader(batch(1), leader_epoch=7, now_ms=0)
    lg.close()
    again = open_log(tmp_path / "t-0", SMALL)
    assert [r.offset for r in read_all(again)] == list(range(45))
    assert again.epoch_cache.entries == [(0, 0), (1, 20), (2, 40), (7, 44)]


def test_recovery_gives_back_the_epochs_of_batches_written_before_their_checkpoint(
    tmp_path: Path,
) -> None:
    """A crash between a batch's write and the leader-epoch checkpoint naming its epoch: the
    recovered batches' epochs go back into the cache (Kafka's LogSegment.recover assigns
    every epoch above the latest), so truncation by epoch still sees them."""
    lg = open_log(tmp_path / "t-0", SMALL)
    for epoch in (0, 0, 2, 2, 3):
        lg.append_as_leader(batch(2, value=b"z" * 50), leader_epoch=epoch, now_ms=0)
    assert lg.epoch_cache.entries == [(0, 0), (2, 4), (3, 8)]
    path = lg.epoch_cache.path
    lg.close()
    checkpoint.write_leader_epochs(path, [(0, 0)])  # as the crash left it
    clean = open_log(tmp_path / "t-0", SMALL, clean_shutdown=True, recovery_point=10)
    assert clean.epoch_cache.entries == [(0, 0)]  # no recovery: the checkpoint is believed
    clean.close()
    checkpoint.write_leader_epochs(path, [(0, 0)])
    recovered = open_log(tmp_path / "t-0", SMALL, clean_shutdown=False, recovery_point=0)
    assert recovered.epoch_cache.entries == [(0, 0), (2, 4), (3, 8)]
    assert checkpoint.read_leader_epochs(path) == [(0, 0), (2, 4), (3, 8)]


def test_the_leader_epoch_checkpoint_is_written_before_the_recovery_point_passes_its_epochs(
    tmp_path: Path,
) -> None:
    """The first append of an epoch writes no checkpoint (a failover's first appends would
    fsync one file per partition on the event loop); the roll that moves the recovery point
    past the epoch's records does, since recovery reads no epochs below that point."""
    lg = open_log(tmp_path / "t-0", SMALL)
    path = lg.epoch_cache.path
    lg.append_as_leader(batch(2, value=b"z" * 50), leader_epoch=0, now_ms=0)
    lg.append_as_leader(batch(2, value=b"z" * 50), leader_epoch=3, now_ms=0)
    assert not path.exists()
    while len(lg.segments) < 3:  # the epochs' records end up below the recovery point
        lg.append_as_leader(batch(2, value=b"z" * 50), leader_epoch=3, now_ms=0)
    assert lg.recovery_point > 2
    assert checkpoint.read_leader_epochs(path) == [(0, 0), (3, 2)]
    # A crash: no close. Recovery starts at the recovery point and believes the checkpoint
    # below it.
    recovered = open_log(
        tmp_path / "t-0", SMALL, clean_shutdown=False, recovery_point=lg.recovery_point
    )
    assert recovered.epoch_cache.entries == [(0, 0), (3, 2)]
    recovered.append_as_leader(batch(1), leader_epoch=5, now_ms=0)
    recovered.flush()  # a flush moves the recovery point too
    assert checkpoint.read_leader_epochs(path)[-1] == (5, recovered.log_end_offset - 1)
    recovered.close()
    lg.abandon()


def _rolled_flushes(lg: Log) -> list[RolledFlush]:
    """The fsyncs ``lg``'s rolls leave, kept to run by hand (a node's worker thread)."""
    taken: list[RolledFlush] = []
    lg.flush_rolled = lambda _lg, flush: taken.append(flush)
    return taken


def _roll_once(lg: Log) -> int:
    """Append until the log rolls; return the rolled segment's end."""
    rolls = len(lg.segments)
    while len(lg.segments) == rolls:
        lg.append_as_leader(batch(2, value=b"z" * 50), leader_epoch=3, now_ms=0)
    return lg.segments[-1].base_offset


def test_a_roll_leaves_its_fsyncs_to_flush_rolled_and_the_recovery_point_waits_for_them(
    tmp_path: Path,
) -> None:
    """As Kafka's ``UnifiedLog.roll`` schedules its "flush-log" task: the append that rolls
    does not fsync; the recovery point (and the epoch checkpoint below it) moves once the
    fsyncs ran."""
    lg = open_log(tmp_path / "t-0", SMALL)
    taken = _rolled_flushes(lg)
    rolled_at = _roll_once(lg)
    assert lg.recovery_point == 0
    assert not lg.epoch_cache.path.exists()
    [flush] = taken
    assert flush.offset == rolled_at
    assert len(flush.fds) == 4  # the segment, its two indexes, the directory (a new file)
    flush.run()
    assert flush.fds == []
    lg.rolled_flush_done(flush)
    assert lg.recovery_point == rolled_at
    assert checkpoint.read_leader_epochs(lg.epoch_cache.path) == [(3, 0)]
    lg.close()


def test_a_rolled_flush_done_after_a_truncation_or_a_close_moves_no_recovery_point(
    tmp_path: Path,
) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    taken = _rolled_flushes(lg)
    _roll_once(lg)
    lg.truncate_to(2)
    taken[0].run()
    lg.rolled_flush_done(taken[0])
    assert lg.recovery_point == 0
    _roll_once(lg)
    lg.abandon()
    taken[1].run()
    lg.rolled_flush_done(taken[1])
    assert lg.recovery_point == 0


@pytest.mark.parametrize("truncated_between", [False, True])
def test_the_recovery_point_passes_a_rolled_segment_once_every_roll_before_it_is_flushed(
    tmp_path: Path, truncated_between: bool
) -> None:
    """Two rolls whose fsyncs end in the other order (the second flushed on the loop, the
    first's queue full): the recovery point waits for the first. So it does when a truncation
    inside the active segment came between them: it kept the first roll's segment, which a
    flush of the second alone passed unflushed (review); the first, made before the
    truncation, moves it no further itself."""
    lg = open_log(tmp_path / "t-0", SMALL)
    taken = _rolled_flushes(lg)
    first_end = _roll_once(lg)
    if truncated_between:
        lg.append_as_leader(batch(2, value=b"z" * 50), leader_epoch=3, now_ms=0)
        lg.truncate_to(first_end + 1)  # the first roll's segment stays
    second_end = _roll_once(lg)
    first, second = taken
    second.run()
    lg.rolled_flush_done(second)
    assert lg.recovery_point == 0
    first.run()
    lg.rolled_flush_done(first)
    assert lg.recovery_point == second_end > first_end
    lg.close()


def test_a_rolled_flush_that_failed_moves_no_recovery_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    taken = _rolled_flushes(lg)
    _roll_once(lg)

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError):
        taken[0].run()
    monkeypatch.undo()
    assert taken[0].fds == []  # closed all the same
    lg.rolled_flush_done(taken[0])
    assert lg.recovery_point == 0
    lg.close()


def _gzip_batch_at(deltas: list[int], *, keyed: bool = False) -> bytes:
    """A gzip batch of ``len(deltas)`` records (values a, b, ...) at those offset deltas,
    covering offsets 0 to len - 1, its CRC sound (no client library writes such deltas)."""
    records = []
    for i, delta in enumerate(deltas):
        value = bytes([ord("a") + i])
        record = bytearray()
        fmt.encode_record(
            record, delta, 0, fmt.Record(delta, 1_000, value if keyed else None, value)
        )
        records.append(bytes(record))
    return _raw_batch(records, len(deltas) - 1, fmt.Compression.GZIP)


@pytest.mark.parametrize(
    ("compression", "cleanup", "deltas"),
    [
        ("producer", "delete", [0, 5]),
        ("zstd", "delete", [0, 5]),
        ("producer", "compact", [0, 5]),
        # Not increasing: the compacted topic's key check refused it (CORRUPT_MESSAGE).
        ("producer", "compact", [0, 0]),
        ("zstd", "compact", [1, 0]),
    ],
)
def test_a_compressed_batch_whose_records_skip_offsets_is_rebuilt_at_consecutive_ones(
    tmp_path: Path, compression: str, cleanup: str, deltas: list[int]
) -> None:
    """Kafka's LogValidator rebuilds it (in place assignment off), read off the loop or not,
    recompressed for the topic or not, on a compacted topic too."""
    config = LogConfig(compression_type=compression, cleanup_policy=frozenset({cleanup}))
    lg = open_log(tmp_path / "t-0", config)
    sent = _gzip_batch_at(deltas, keyed=cleanup == "compact")
    lg.check_for_leader(sent, now_ms=1_000)  # nothing to refuse, nothing written
    lg.check_for_leader(sent, now_ms=1_000, scan=lg.scan_for_leader(sent))
    assert lg.log_end_offset == 0
    lg.append_as_leader(sent, leader_epoch=0, now_ms=1_000)
    lg.append_as_leader(sent, leader_epoch=0, now_ms=1_000, scan=lg.scan_for_leader(sent))
    assert [(r.offset, r.value) for r in read_all(lg)] == [
        (0, b"a"),
        (1, b"b"),
        (2, b"a"),
        (3, b"b"),
    ]
    lg.close()


def test_truncate_to_the_log_end_drops_only_epochs_starting_there(tmp_path: Path) -> None:
    """A leader that appended nothing in its epoch has the epoch's entry at its log end; as a
    follower it truncates to its log end: no record goes, the entry does, on disk too."""
    lg = open_log(tmp_path / "t-0", SMALL)
    lg.append_as_leader(batch(2), leader_epoch=0, now_ms=0)
    lg.epoch_cache.assign(1, lg.log_end_offset)
    assert lg.truncate_to(5) == 2
    assert lg.epoch_cache.entries == [(0, 0)]
    assert [r.offset for r in read_all(lg)] == [0, 1]
    lg.close()
    assert open_log(tmp_path / "t-0", SMALL).epoch_cache.entries == [(0, 0)]


def test_truncate_fully(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    for _ in range(20):
        lg.append_as_leader(batch(3), leader_epoch=1, now_ms=0)
    lg.truncate_fully_and_start_at(500)
    assert (lg.log_start_offset, lg.log_end_offset) == (500, 500)
    assert lg.append_as_leader(batch(1), leader_epoch=2, now_ms=0).first_offset == 500


def test_follower_append_keeps_offsets_and_refuses_gaps_backwards(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "l-0")
    for epoch in (1, 1, 3):
        leader.append_as_leader(batch(2), leader_epoch=epoch, now_ms=0)
    follower = open_log(tmp_path / "f-0")
    data = leader.read(0, 100_000).records
    info = follower.append_as_follower(data, now_ms=0)
    assert (info.first_offset, info.last_offset) == (0, 5)
    assert follower.epoch_cache.entries == [(1, 0), (3, 4)]
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(data, now_ms=0)


def test_bad_produce_input_is_refused_and_log_untouched(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(max_message_bytes=500))
    lg.append_as_leader(batch(1), leader_epoch=0, now_ms=0)
    good = batch(2)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    with pytest.raises(fmt.CorruptRecordError):
        lg.append_as_leader(bytes(corrupt), leader_epoch=0, now_ms=0)
    with pytest.raises(fmt.RecordFormatError):
        lg.append_as_leader(good[:-4], leader_epoch=0, now_ms=0)
    with pytest.raises(fmt.RecordFormatError):
        lg.append_as_leader(b"\x00" * 70, leader_epoch=0, now_ms=0)
    with pytest.raises(InvalidRecordError):
        lg.append_as_leader(b"", leader_epoch=0, now_ms=0)
    with pytest.raises(RecordTooLargeError):
        lg.append_as_leader(batch(1, value=b"x" * 1000), leader_epoch=0, now_ms=0)
    assert lg.log_end_offset == 1
    assert [r.offset for r in read_all(lg)] == [0]


HOUR_MS = 3_600_000
LOG_APPEND_TIME = LogConfig(message_timestamp_type="LogAppendTime", index_interval_bytes=1)


@pytest.mark.parametrize("batches", [1, 2], ids=["one-batch", "two-batches"])
def test_log_append_time_stamps_every_batch_with_the_leaders_clock(
    tmp_path: Path, batches: int
) -> None:
    """message.timestamp.type=LogAppendTime (Kafka's LogValidator with LOG_APPEND_TIME): each
    batch's max timestamp becomes the append's now and its timestamp type LogAppendTime, under
    a valid CRC; its records all read as that time, the time index and ListOffsets by time use
    it, and it stays so after a reopen. One batch takes the produce fast path, two the other."""
    lg = open_log(tmp_path / "t-0", LOG_APPEND_TIME)
    sent = b"".join(batch(2, timestamp=5 + i) for i in range(batches))  # old CreateTimes
    info = lg.append_as_leader(sent, leader_epoch=0, now_ms=7 * HOUR_MS)
    later = lg.append_as_leader(batch(1, timestamp=10**13), leader_epoch=0, now_ms=8 * HOUR_MS)
    assert (info.log_append_time_ms, info.max_timestamp) == (7 * HOUR_MS, 7 * HOUR_MS)
    assert (later.log_append_time_ms, later.first_offset) == (8 * HOUR_MS, 2 * batches)

    def check(log_: Log) -> None:
        data = log_.read(0, 10_000).records
        headers = [h for _, h in fmt.iter_headers(data)]
        assert [h.timestamp_type for h in headers] == [fmt.TimestampType.LOG_APPEND_TIME] * (
            batches + 1
        )
        assert all(fmt.is_crc_valid(data, pos, h) for pos, h in fmt.iter_headers(data))
        stamps = [r.timestamp for r in read_all(log_)]
        assert stamps == [7 * HOUR_MS] * (2 * batches) + [8 * HOUR_MS]
        assert log_.offset_for_timestamp(7 * HOUR_MS + 1) == (2 * batches, 8 * HOUR_MS)
        assert log_.offset_for_timestamp(0) == (0, 7 * HOUR_MS)

    check(lg)
    lg.close()
    check(open_log(tmp_path / "t-0", LOG_APPEND_TIME))


def test_create_time_bounds_refuse_records_too_far_from_the_leaders_clock(
    tmp_path: Path,
) -> None:
    """CreateTime: a record later than now + message.timestamp.after.max.ms (an hour by
    default, as Kafka 4.0) or earlier than now - message.timestamp.before.max.ms is refused
    with one error per such record, naming its index in the batch; both bounds are inclusive,
    a record without a timestamp (-1) is never refused, and nothing is appended."""
    now = 10 * HOUR_MS
    lg = open_log(tmp_path / "t-0", LogConfig(message_timestamp_before_max_ms=HOUR_MS))
    at_the_bounds = fmt.build_batch(
        [fmt.Record(0, now - HOUR_MS, b"k", b"v"), fmt.Record(1, now + HOUR_MS, b"k", b"v")]
    )
    assert lg.append_as_leader(at_the_bounds, leader_epoch=0, now_ms=now).last_offset == 1
    untimed = fmt.build_batch([fmt.Record(0, fmt.NO_TIMESTAMP, b"k", b"v")])
    assert lg.append_as_leader(untimed, leader_epoch=0, now_ms=now).last_offset == 2
    out_of_range = [
        [fmt.Record(0, now, b"k", b"v"), fmt.Record(1, now + HOUR_MS + 1, b"k", b"v")],
        [fmt.Record(0, now - HOUR_MS - 1, b"k", b"v"), fmt.Record(1, now, b"k", b"v")],
    ]
    for records in out_of_range:
        bad = next(i for i, r in enumerate(records) if r.timestamp != now)
        for codec in (fmt.Compression.NONE, fmt.Compression.GZIP):
            for sent in (
                fmt.build_batch(records, compression=codec),
                batch(1, timestamp=now) + fmt.build_batch(records, compression=codec),
            ):
                with pytest.raises(InvalidTimestampError) as refused:
                    lg.append_as_leader(sent, leader_epoch=0, now_ms=now)
                assert str(refused.value) == (
                    "One or more records have been rejected due to invalid timestamp"
                )
                assert refused.value.record_errors == [
                    (
                        bad,
                        f"Timestamp {records[bad].timestamp} of message with offset {bad} is "
                        f"out of range. The timestamp should be within "
                        f"[{now - HOUR_MS}, {now + HOUR_MS}]",
                    )
                ]
    # The default has no lower bound: a day-old record is taken.
    lg2 = open_log(tmp_path / "t-1")
    assert lg2.append_as_leader(batch(1, timestamp=now - 24 * HOUR_MS), 0, now).last_offset == 0
    assert lg.log_end_offset == 3
    assert [r.timestamp for r in read_all(lg)] == [now - HOUR_MS, now + HOUR_MS, -1]


def test_a_batch_the_producer_marked_log_append_time_is_refused(tmp_path: Path) -> None:
    """Only the leader stamps LogAppendTime (Kafka's LogValidator.validateTimestamp)."""
    lg = open_log(tmp_path / "t-0")
    stamped = fmt.build_batch(
        [fmt.Record(0, 1_000, b"k", b"v")], timestamp_type=fmt.TimestampType.LOG_APPEND_TIME
    )
    for config in (LogConfig(), LOG_APPEND_TIME):
        lg.config = config
        for sent in (stamped, batch(1) + stamped):
            with pytest.raises(InvalidTimestampError) as refused:
                lg.append_as_leader(sent, leader_epoch=0, now_ms=2_000)
            assert refused.value.record_errors == [
                (
                    0,
                    "Invalid timestamp type in message. Producer should not set timestamp "
                    "type to LogAppendTime.",
                )
            ]
    assert lg.log_end_offset == 0


def _with_header_max(sent: bytes, max_timestamp: int) -> bytes:
    """``sent`` (one batch) with another max timestamp in its header, signed again."""
    lying = bytearray(sent)
    struct.pack_into(">q", lying, fmt.MAX_TIMESTAMP_OFFSET, max_timestamp)
    struct.pack_into(">I", lying, fmt.CRC_OFFSET, fmt.compute_crc(lying, 0, len(lying)))
    return bytes(lying)


@pytest.mark.parametrize("codec", [fmt.Compression.NONE, fmt.Compression.GZIP])
def test_a_batch_takes_its_records_max_timestamp_whatever_its_header_says(
    tmp_path: Path, codec: fmt.Compression
) -> None:
    """Kafka's LogValidator gives a batch the greatest timestamp of its records
    (setMaxTimestamp); kcoord kept the producer's. A header too low or -1 hid the batch from a
    search by time (ListOffsets answered -1) and from max-timestamp (-3); one too high named a
    time no record has. Each is stored with its records' max, through the one-batch path and
    the general one, and searches find the record."""
    now = 10 * HOUR_MS
    records = [fmt.Record(0, now - 5_000, b"k", b"a"), fmt.Record(1, now - 1_000, b"k", b"b")]
    for header_max in (now - 5_000, -1, now - 100):
        for before in (b"", batch(1, timestamp=now - 9_000)):
            lg = open_log(tmp_path / f"t-{codec.name}-{header_max}-{len(before)}")
            sent = _with_header_max(fmt.build_batch(records, compression=codec), header_max)
            lg.append_as_leader(before + sent, leader_epoch=0, now_ms=now)
            data = bytes(lg.read(0, 1 << 20).records)
            headers = [h for _, h in fmt.iter_headers(data)]
            assert headers[-1].max_timestamp == now - 1_000
            assert all(fmt.compute_crc(data, p, h.size) == h.crc for p, h in fmt.iter_headers(data))
            first = len(headers) - 1  # the offset of the batch's first record
            assert lg.offset_for_timestamp(now - 1_000) == (first + 1, now - 1_000)
            assert lg.offset_for_timestamp(now - 4_000) == (first + 1, now - 1_000)
            assert lg.offset_for_timestamp(now - 1_000 + 1) is None


def _outcome(lg: Log, records: bytes, scan: LeaderScan | None = None) -> object:
    """What appending ``records`` as leader gives: the stored bytes past the base offset, or
    the error's type and message."""
    try:
        lg.append_as_leader(records, leader_epoch=0, now_ms=10 * HOUR_MS, scan=scan)
    except Exception as e:
        return type(e), str(e)
    return bytes(lg.read(0, 1 << 20).records)[8:]


def test_a_batch_read_before_its_append_is_appended_as_if_read_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node reads a produced batch's records off its event loop when they are costly to
    read (``scan_for_leader``) and appends it with what that found: the outcome is the
    append's own, stored batch or error alike (a header's max timestamp corrected, a count
    its records do not make, a body that does not inflate, a keyless record on a compacted
    topic, a timestamp out of bounds), and the records are not read again. What is not one
    sound batch is left to the append."""
    now = 10 * HOUR_MS
    good = [fmt.Record(0, now - 5_000, b"k", b"a"), fmt.Record(1, now - 1_000, b"k", b"b")]
    keyless = [fmt.Record(0, now, None, b"a"), fmt.Record(1, now, b"k", b"b")]
    short = bytearray(fmt.build_batch(good, compression=fmt.Compression.GZIP))
    short[fmt.HEADER_SIZE - 4 : fmt.HEADER_SIZE] = (3).to_bytes(4, "big")
    short[23:27] = (2).to_bytes(4, "big")  # the last offset delta agrees with the count
    garbage = bytearray(short)
    garbage[fmt.HEADER_SIZE :] = bytes(len(garbage) - fmt.HEADER_SIZE)
    for bad in (short, garbage):
        bad[17:21] = fmt.compute_crc(bad, 0, len(bad)).to_bytes(4, "big")
    cases = {
        "header max too low": (_with_header_max(fmt.build_batch(good), -1), False),
        "gzip": (fmt.build_batch(good, compression=fmt.Compression.GZIP), False),
        "count not made": (bytes(short), False),
        "does not inflate": (bytes(garbage), False),
        "keyless, compacted": (fmt.build_batch(keyless), True),
        "keyed, compacted": (fmt.build_batch(good, compression=fmt.Compression.ZSTD), True),
        "ahead": (fmt.build_batch([fmt.Record(0, now + 10 * HOUR_MS, b"k", b"a")]), False),
    }
    reads = 0
    real_read = log_module._records_max_timestamp

    def counted(*args: object) -> int:
        nonlocal reads
        reads += 1
        return real_read(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(log_module, "_records_max_timestamp", counted)
    for n, (name, (records, compact)) in enumerate(cases.items()):
        config = LogConfig(cleanup_policy=frozenset({"compact" if compact else "delete"}))
        expected = _outcome(open_log(tmp_path / "direct" / f"t{n}-0", config), records)
        lg = open_log(tmp_path / "scanned" / f"t{n}-0", config)
        scan = lg.scan_for_leader(records)
        assert scan is not None, name
        before = reads
        assert _outcome(lg, records, scan) == expected, name
        assert reads == before, name
    # Compacted after the read: the keys are checked at the append.
    lg = open_log(tmp_path / "compacted-since")
    records = fmt.build_batch(keyless)
    scan = lg.scan_for_leader(records)
    lg.config = LogConfig(cleanup_policy=frozenset({"compact"}))
    outcome = _outcome(lg, records, scan)
    assert isinstance(outcome, tuple) and outcome[0] is InvalidRecordError
    # No longer compacted after the read: the keys' error it found is not raised.
    lg = open_log(tmp_path / "uncompacted-since", LogConfig(cleanup_policy=frozenset({"compact"})))
    scan = lg.scan_for_leader(records)
    assert scan is not None and scan.key_error is not None
    lg.config = LogConfig()
    assert isinstance(_outcome(lg, records, scan), bytes)
    # Not one sound batch with records: nothing to read ahead.
    one = fmt.build_batch(good)
    flipped = bytearray(one)
    flipped[-1] ^= 1
    for unread in (b"", one[:30], one + one, bytes(flipped), one[:-1]):
        assert lg.scan_for_leader(unread) is None
    # Another batch than the one read is read at the append.
    other = fmt.build_batch(good)
    assert _outcome(open_log(tmp_path / "other"), other, lg.scan_for_leader(one)) == _outcome(
        open_log(tmp_path / "other-direct"), other
    )


def test_a_batch_read_before_its_append_is_recompressed_there_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic whose compression.type is not the producer's rebuilds produced batches in its
    codec: done on the loop at the append, it is done with the read off the loop, and the
    append takes the rebuilt batch as the direct append would have made it. One that does
    not rebuild, or a codec changed since, is left to the append."""
    now = 10 * HOUR_MS
    good = [fmt.Record(0, now - 5_000, b"k", b"a"), fmt.Record(1, now - 1_000, b"k", b"b")]
    records = fmt.build_batch(good, compression=fmt.Compression.GZIP)
    zstd = LogConfig(compression_type="zstd")
    expected = _outcome(open_log(tmp_path / "direct", zstd), records)
    assert isinstance(expected, bytes)
    lg = open_log(tmp_path / "scanned", zstd)
    scan = lg.scan_for_leader(records)
    assert scan is not None and scan.sent is records and scan.records != records
    rebuilt = 0
    real = Log._recompressed

    def counted(self: Log, *args: Any) -> bytes:
        nonlocal rebuilt
        rebuilt += 1
        return real(self, *args)

    monkeypatch.setattr(Log, "_recompressed", counted)
    assert _outcome(lg, records, scan) == expected
    assert rebuilt == 0
    # The topic's codec changed since the read: rebuilt again, in the new one.
    lg = open_log(tmp_path / "changed", zstd)
    scan = lg.scan_for_leader(records)
    lg.config = LogConfig(compression_type="lz4")
    assert _outcome(lg, records, scan) == _outcome(
        open_log(tmp_path / "lz4", LogConfig(compression_type="lz4")), records
    )
    assert rebuilt == 3  # the scan's, the append's and the direct one's
    # max.message.bytes lowered under the batch as sent since the read: refused, as there.
    lg = open_log(tmp_path / "lowered", zstd)
    scan = lg.scan_for_leader(records)
    lg.config = LogConfig(compression_type="zstd", max_message_bytes=len(records) - 1)
    direct = open_log(tmp_path / "lowered-direct", lg.config)
    assert _outcome(lg, records, scan) == _outcome(direct, records)
    assert rebuilt == 5  # this read's and the direct append's
    # A body that does not inflate: nothing read ahead, the append's own error.
    garbage = bytearray(records)
    garbage[fmt.HEADER_SIZE :] = bytes(len(garbage) - fmt.HEADER_SIZE)
    garbage[17:21] = fmt.compute_crc(garbage, 0, len(garbage)).to_bytes(4, "big")
    lg = open_log(tmp_path / "garbage", zstd)
    assert lg.scan_for_leader(bytes(garbage)) is None
    assert _outcome(lg, bytes(garbage)) == _outcome(open_log(tmp_path / "g2", zstd), bytes(garbage))


def test_a_record_past_the_bound_is_refused_though_its_header_hides_it(tmp_path: Path) -> None:
    """message.timestamp.after.max.ms bounds every record: a batch whose header says "now"
    while a record is ten hours ahead was taken, its header only being checked."""
    now = 10 * HOUR_MS
    records = [fmt.Record(0, now, b"k", b"a"), fmt.Record(1, now + 10 * HOUR_MS, b"k", b"b")]
    sent = _with_header_max(fmt.build_batch(records), now)
    lg = open_log(tmp_path / "t-0")
    for request in (sent, batch(1, timestamp=now) + sent):
        with pytest.raises(InvalidTimestampError) as refused:
            lg.append_as_leader(request, leader_epoch=0, now_ms=now)
        assert [i for i, _ in refused.value.record_errors] == [1]
    assert lg.log_end_offset == 0


def test_compression_type_recompresses_batches_in_another_codec(tmp_path: Path) -> None:
    """compression.type=zstd (Kafka's LogValidator with a target codec): a batch sent
    uncompressed or gzipped is stored zstd with the same records (offsets, timestamps, keys,
    values, headers) and producer fields; a zstd batch is stored as sent; uncompressed undoes a
    producer's codec. A corrupt batch is refused before it is decompressed, and one that grows
    past max.message.bytes is refused after."""
    records = [
        fmt.Record(i, 1_000 + i, b"k%d" % i, b"v" * 50, (("h", b"x"), ("n", None)))
        for i in range(5)
    ]
    sent = {
        codec: fmt.build_batch(
            records, compression=codec, producer_id=7, producer_epoch=2, base_sequence=40
        )
        for codec in (fmt.Compression.NONE, fmt.Compression.GZIP, fmt.Compression.ZSTD)
    }
    for target, codec in (("zstd", fmt.Compression.ZSTD), ("uncompressed", fmt.Compression.NONE)):
        lg = open_log(tmp_path / target, LogConfig(compression_type=target))
        for batch_ in sent.values():
            lg.append_as_leader(batch_, leader_epoch=3, now_ms=2_000)
        data = lg.read(0, 1 << 20).records
        for n, (pos, header) in enumerate(fmt.iter_headers(data)):
            assert header.compression is codec
            assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 40)
            assert header.partition_leader_epoch == 3
            assert fmt.is_crc_valid(data, pos, header)
            decoded = fmt.decode_records(data, pos)
            assert [replace(r, offset=r.offset - 5 * n) for r in decoded] == records
    lg = open_log(tmp_path / "as-sent", LogConfig(compression_type="zstd"))
    lg.append_as_leader(sent[fmt.Compression.ZSTD], leader_epoch=0, now_ms=2_000)
    assert lg.read(0, 1 << 20).records[16:] == sent[fmt.Compression.ZSTD][16:]

    corrupt = bytearray(sent[fmt.Compression.GZIP])
    corrupt[-3] ^= 0xFF
    with pytest.raises(fmt.CorruptRecordError):
        lg.append_as_leader(bytes(corrupt), leader_epoch=0, now_ms=2_000)
    compressible = fmt.build_batch(
        [fmt.Record(0, 1_000, b"k", b"a" * 4_000)], compression=fmt.Compression.GZIP
    )
    lg = open_log(
        tmp_path / "grows", LogConfig(compression_type="uncompressed", max_message_bytes=1_000)
    )
    with pytest.raises(RecordTooLargeError):
        lg.append_as_leader(compressible, leader_epoch=0, now_ms=2_000)
    assert lg.log_end_offset == 0
    # A batch past max.message.bytes as sent is refused before it is recompressed, however
    # small the topic's codec would make it (UnifiedLog.analyzeAndValidateRecords).
    lg = open_log(tmp_path / "shrinks", LogConfig(compression_type="gzip", max_message_bytes=1_000))
    plain = fmt.build_batch([fmt.Record(0, 1_000, b"k", b"a" * 4_000)])
    with pytest.raises(RecordTooLargeError):
        lg.append_as_leader(plain, leader_epoch=0, now_ms=2_000)
    assert lg.log_end_offset == 0


def test_a_batch_past_a_segment_is_refused_after_it_is_validated(tmp_path: Path) -> None:
    """UnifiedLog.append checks the segment size last: a batch past both max.message.bytes
    and segment.bytes is MESSAGE_TOO_LARGE, a corrupt one CORRUPT_MESSAGE, a sound one
    RECORD_LIST_TOO_LARGE; one batch or several (the other path)."""
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=500, max_message_bytes=800))
    big = batch(1, value=b"v" * 1_000)
    with pytest.raises(RecordTooLargeError):
        lg.append_as_leader(big, leader_epoch=0, now_ms=0)
    with pytest.raises(RecordTooLargeError):
        lg.append_as_leader(batch(1) + big, leader_epoch=0, now_ms=0)
    fits = batch(1, value=b"v" * 600)  # within max.message.bytes, past segment.bytes
    corrupt = bytearray(fits)
    corrupt[-1] ^= 0xFF
    with pytest.raises(fmt.CorruptRecordError):
        lg.append_as_leader(bytes(corrupt), leader_epoch=0, now_ms=0)
    with pytest.raises(RecordListTooLargeError):
        lg.append_as_leader(fits, leader_epoch=0, now_ms=0)
    with pytest.raises(RecordListTooLargeError):
        half = batch(1, value=b"v" * 300)  # two fit max.message.bytes each, not one segment
        lg.append_as_leader(half + half, leader_epoch=0, now_ms=0)
    assert lg.log_end_offset == 0


def test_compacted_log_refuses_null_keys(tmp_path: Path) -> None:
    compact = LogConfig(cleanup_policy=frozenset({"compact"}))
    lg = open_log(tmp_path / "t-0", compact)
    with pytest.raises(InvalidRecordError, match="without key"):
        lg.append_as_leader(batch(1, key=None), leader_epoch=0, now_ms=0)
    with pytest.raises(InvalidRecordError, match="without key"):  # several batches: the other path
        lg.append_as_leader(batch(1) + batch(2, keys=[b"k", None]), leader_epoch=0, now_ms=0)
    assert lg.log_end_offset == 0
    # A follower replicates what its leader holds as it is (Kafka's appendAsFollower runs no
    # LogValidator): keys are the leader's check.
    follower = open_log(tmp_path / "f-0", compact)
    follower.append_as_follower(batch(2, keys=[b"k", None]), now_ms=0)
    assert [r.key for r in read_all(follower)] == [b"k", None]


def test_retention_by_time_and_size_deletes_whole_old_segments(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1_000, retention_ms=10_000, retention_bytes=-1)
    lg = open_log(tmp_path / "t-0", config)
    for i in range(20):
        lg.append_as_leader(batch(1, timestamp=i * 1_000, value=b"x" * 200), 0, now_ms=0)
    segments = len(lg.segments)
    assert lg.delete_old_segments(now_ms=15_000) > 0
    assert lg.log_start_offset == lg.segments[0].base_offset > 0
    assert all(15_000 - s.max_timestamp <= 10_000 for s in lg.segments[:-1])
    assert len(lg.segments) < segments
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(0, 100)
    # Retention never acts at or above the high watermark.
    by_size = open_log(tmp_path / "s-0", LogConfig(segment_bytes=1_000, retention_bytes=1_500))
    for _ in range(20):
        by_size.append_as_leader(batch(1, value=b"x" * 200), 0, now_ms=0)
    assert by_size.delete_old_segments(now_ms=0, high_watermark=0) == 0
    assert by_size.delete_old_segments(now_ms=0) > 0
    assert by_size.size_bytes - by_size.segments[0].size < 1_500
    assert [r.offset for r in read_all(by_size)][-1] == 19


def _compacted(tmp_path: Path) -> Log:
    return open_log(
        tmp_path / "c-0",
        LogConfig(
            cleanup_policy=frozenset({"compact"}), segment_bytes=600, delete_retention_ms=1_000
        ),
    )


def test_compaction_keeps_last_value_per_key_and_expires_tombstones(tmp_path: Path) -> None:
    lg = _compacted(tmp_path)
    expected: dict[bytes, bytes | None] = {}
    for i in range(60):
        key = f"k{i % 7}".encode()
        value = None if i in (57, 58) else f"v{i}".encode()  # the last k1, k2: tombstones
        lg.append_as_leader(batch(1, key=key, value=value), 0, now_ms=0)
        expected[key] = value
    lg.roll()
    before = lg.log_end_offset
    stats = lg.compact(now_ms=0)
    assert stats.records_kept < stats.records_read
    records = read_all(lg)
    latest = {r.key: r.value for r in records}
    assert latest == expected
    assert len(records) == len(expected)  # one record per key, tombstones still there
    assert sum(1 for r in records if r.value is None) == 2
    assert lg.log_end_offset == before  # offsets are kept; the log end never moves
    # Before delete.retention.ms passes tombstones stay; after, they go.
    lg.compact(now_ms=500)
    assert sum(1 for r in read_all(lg) if r.value is None) == 2
    stats = lg.compact(now_ms=2_000)
    assert stats.tombstones_dropped == 2
    assert {r.key: r.value for r in read_all(lg)} == {
        k: v for k, v in expected.items() if v is not None
    }
    # The compacted log reopens with the same content, offsets intact.
    kept = [(r.offset, r.key, r.value) for r in read_all(lg)]
    lg.close()
    again = _compacted(tmp_path)
    assert [(r.offset, r.key, r.value) for r in read_all(again)] == kept
    assert again.log_end_offset == before


def _produced(lg: Log, producer_id: int, seq: int, key: bytes, ts: int) -> None:
    records = [fmt.Record(0, ts, key, b"v%d" % seq)]
    lg.append_as_leader(
        fmt.build_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=seq),
        0,
        now_ms=ts,
    )


def _producer_state(lg: Log) -> ProducerStateManager:
    """The state a new leader rebuilds from the log's batch headers, as the node's does."""
    state = ProducerStateManager()
    state.update(
        bp.header
        for seg in lg.segments
        for bp in seg.scan_headers()
        if bp.header.producer_id != fmt.NO_PRODUCER_ID
    )
    return state


def test_compaction_keeps_an_active_producers_last_batch_emptied(tmp_path: Path) -> None:
    """Kafka's BatchRetention.RETAIN_EMPTY: when every record of a producer's last batch is
    compacted away, the batch stays with no records, so a leader rebuilding producer state
    from the log still takes the producer's next sequence and answers a retry of its last
    batch as a duplicate."""
    lg = _compacted(tmp_path)
    now = 1_000_000
    _produced(lg, 7, 0, b"a", now)  # P's first batch: a later one of P follows, so it may go
    _produced(lg, 7, 1, b"b", now)  # P's last batch
    _produced(lg, 8, 0, b"c", now)  # R's only batch
    for key in (b"b", b"c"):  # another writer overwrites both keys
        lg.append_as_leader(batch(1, key=key, value=b"new"), 0, now_ms=now)
    lg.roll()
    before = _producer_state(lg)
    lg.compact(now_ms=now)
    headers = [bp.header for seg in lg.segments for bp in seg.scan_headers()]
    empty = [h for h in headers if h.record_count == 0]
    assert [(h.producer_id, h.base_sequence, h.base_offset, h.last_offset) for h in empty] == [
        (7, 1, 1, 1),
        (8, 0, 2, 2),
    ]
    assert all(h.max_timestamp == now for h in empty)
    assert {r.key: r.value for r in read_all(lg)} == {b"a": b"v0", b"b": b"new", b"c": b"new"}
    after = _producer_state(lg)
    assert {pid: e.last_seq for pid, e in after.producers.items()} == {7: 1, 8: 0}
    assert {pid: e.last_seq for pid, e in before.producers.items()} == {7: 1, 8: 0}
    retry = fmt.parse_header(
        fmt.build_batch(
            [fmt.Record(0, now, b"c", b"v0")], producer_id=8, producer_epoch=0, base_sequence=0
        )
    )
    assert after.validate([retry]) == Duplicate(2, 2, now)
    # Cleaned again, the empty batches stay as they are.
    lg.compact(now_ms=now)
    assert [bp.header for seg in lg.segments for bp in seg.scan_headers()] == headers
    # A follower replicating the cleaned log takes the empty batches.
    follower = open_log(tmp_path / "follower-0", lg.config)
    follower.append_as_follower(lg.read(0, 1 << 20).records, now_ms=now)
    assert follower.log_end_offset == lg.log_end_offset
    # Once a producer's last batch is older than producer.id.expiration.ms, a rebuild would
    # forget the producer anyway: R's empty batch goes. P's stays while P's first batch does
    # (a rebuild would take that one for P's last, and P for active).
    lg.compact(now_ms=now + DEFAULT_PRODUCER_ID_EXPIRATION_MS + 1)
    assert [
        (h.producer_id, h.base_sequence)
        for seg in lg.segments
        for bp in seg.scan_headers()
        if (h := bp.header).record_count == 0
    ] == [(7, 1)]


def test_the_cleaner_keeps_a_producers_last_batch_for_the_expiration_it_is_given(
    tmp_path: Path,
) -> None:
    """producer.id.expiration.ms is the node's (``LogManager.producer_id_expiration_ms``, into
    each plan): with a minute, a producer idle for two is no longer kept."""
    now = 1_700_000_000_000
    for expiration_ms, kept in ((DEFAULT_PRODUCER_ID_EXPIRATION_MS, [7]), (60_000, [])):
        lg = open_log(
            tmp_path / f"c-{expiration_ms}", LogConfig(cleanup_policy=frozenset({"compact"}))
        )
        _produced(lg, 7, 0, b"a", now)
        lg.append_as_leader(batch(1, key=b"a", value=b"new"), 0, now_ms=now)
        lg.roll()
        later = now + 120_000
        plan = lg.plan_cleaning(
            later, high_watermark=lg.log_end_offset, producer_id_expiration_ms=expiration_ms
        )
        assert plan is not None
        lg.swap_cleaned(lg.clean(plan))
        producers = [bp.header.producer_id for seg in lg.segments for bp in seg.scan_headers()]
        assert [p for p in producers if p != fmt.NO_PRODUCER_ID] == kept, expiration_ms
        lg.close()


NOW = 1_700_000_000_000


def _event_time_producer(tmp_path: Path, now: int) -> Log:
    """A compacted log where producer 7 wrote key a at ``now``, then its last batch, key b,
    stamped two days back (event time)."""
    lg = open_log(
        tmp_path / "c-0",
        LogConfig(cleanup_policy=frozenset({"compact"}), message_timestamp_after_max_ms=LONG_MAX),
    )
    _produced(lg, 7, 0, b"a", now)
    _produced(lg, 7, 1, b"b", now - 2 * 24 * 3_600_000)
    return lg


def test_the_cleaner_and_the_producer_state_agree_on_which_producers_are_active(
    tmp_path: Path,
) -> None:
    """A producer wrote a recent batch, then its last batch stamped two days back (event
    time). The state took the largest timestamp and kept the producer; the cleaner judged it
    by its last batch, found it expired and dropped that batch. A leader rebuilding from the
    cleaned log refused the producer's next sequence, which the live leader took. Both now
    judge by the last batch, as Kafka's ProducerStateEntry does."""
    now = NOW
    lg = _event_time_producer(tmp_path, now)
    _produced(lg, 8, 0, b"b", now)  # overwrites b
    lg.roll()
    live = _producer_state(lg)
    lg.compact(now_ms=now)
    rebuilt = _producer_state(lg)
    for state in (live, rebuilt):
        state.remove_expired_producers(now)
    nxt = fmt.parse_header(
        fmt.build_batch(
            [fmt.Record(0, now, b"c", b"v")], producer_id=7, producer_epoch=0, base_sequence=2
        )
    )
    assert live.validate([nxt]) == rebuilt.validate([nxt])
    assert {pid: e.last_seq for pid, e in live.producers.items()} == {
        pid: e.last_seq for pid, e in rebuilt.producers.items()
    }


def test_a_producer_whose_last_batch_is_old_has_expired_live_as_after_cleaning(
    tmp_path: Path,
) -> None:
    """With the largest timestamp, the live state kept a producer whose last batch was stamped
    in the past for as long as an earlier, recent batch of it had been appended; once the
    cleaner had dropped that earlier batch and then the last one, a rebuilt state had no such
    producer: a retry of its last batch, answered as a duplicate live, was appended again
    after a failover. The last batch's timestamp decides, on both sides."""
    now = NOW
    lg = _event_time_producer(tmp_path, now)
    live = _producer_state(lg)
    lg.append_as_leader(batch(1, key=b"a", value=b"new"), 0, now_ms=now)
    lg.roll()
    lg.compact(now_ms=now)  # the first batch goes
    lg.append_as_leader(batch(1, key=b"b", value=b"new"), 0, now_ms=now)
    lg.roll()
    lg.compact(now_ms=now)  # the last one too: nothing of producer 7 is left
    rebuilt = _producer_state(lg)
    for state in (live, rebuilt):
        state.remove_expired_producers(now)
    assert set(live.producers) == set(rebuilt.producers) == set()


def test_a_cleaned_producer_batch_keeps_the_time_its_producer_wrote_it(tmp_path: Path) -> None:
    """Producer 7's last batch held a record stamped two days back (event time) and a recent
    one. Once the recent one was overwritten, the rebuilt batch took the old record's time as
    its max timestamp: a state rebuilt from the log expired the producer at once, and the
    next pass, judging it expired, dropped its last batch when the old record went too; a
    retry of that batch was then appended again. (review helper-204)"""
    now = NOW
    lg = open_log(
        tmp_path / "c-0",
        LogConfig(cleanup_policy=frozenset({"compact"}), message_timestamp_after_max_ms=LONG_MAX),
    )
    two_days = 2 * 24 * 3_600_000
    lg.append_as_leader(
        fmt.build_batch(
            [fmt.Record(0, now - two_days, b"c", b"old"), fmt.Record(1, now, b"b", b"1")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
        ),
        0,
        now_ms=now,
    )
    lg.append_as_leader(batch(1, key=b"b", value=b"2", timestamp=now), 0, now_ms=now)
    lg.roll()
    lg.compact(now_ms=now)
    first = next(bp.header for seg in lg.segments for bp in seg.scan_headers())
    assert (first.producer_id, first.record_count, first.max_timestamp) == (7, 1, now)
    assert lg.offset_for_timestamp(now - two_days) == (0, now - two_days)
    assert lg.offset_for_timestamp(now) == (2, now)  # past the batch: its record is older
    rebuilt = _producer_state(lg)
    rebuilt.remove_expired_producers(now + 1_000)
    assert {pid: e.last_seq for pid, e in rebuilt.producers.items()} == {7: 1}
    lg.append_as_leader(batch(1, key=b"c", value=b"new", timestamp=now), 0, now_ms=now)
    lg.roll()
    lg.compact(now_ms=now + 1_000)
    rebuilt = _producer_state(lg)
    rebuilt.remove_expired_producers(now + 1_000)
    assert {pid: e.last_seq for pid, e in rebuilt.producers.items()} == {7: 1}
    retry = fmt.parse_header(
        fmt.build_batch(
            [fmt.Record(0, now - two_days, b"c", b"old"), fmt.Record(1, now, b"b", b"1")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
        )
    )
    assert isinstance(rebuilt.validate([retry]), Duplicate)


def test_the_newest_record_is_found_past_a_batch_whose_records_fall_short(
    tmp_path: Path,
) -> None:
    """A producer batch the cleaner rebuilt keeps its max timestamp, which none of its records
    kept has: ListOffsets MAX_TIMESTAMP looked for a record with it, found none, and answered
    no offset with records in the log. (review helper-206)"""
    now = NOW
    lg = _compacted(tmp_path)
    lg.append_as_leader(
        fmt.build_batch(
            [fmt.Record(0, now, b"a", b"1"), fmt.Record(1, now + 5, b"b", b"1")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
        ),
        0,
        now_ms=now,
    )
    lg.append_as_leader(batch(1, key=b"b", value=b"2", timestamp=now + 3), 0, now_ms=now)
    lg.roll()
    assert lg.newest_record() == (1, now + 5)
    lg.compact(now_ms=now)
    assert [r.offset for r in read_all(lg)] == [0, 2]
    assert lg.segments[0].max_timestamp == now + 5  # the producer's batch keeps it
    assert lg.newest_record() == (2, now + 3)
    # A later segment with a newer record wins; an equal timestamp goes to the first record.
    lg.append_as_leader(batch(1, key=b"c", value=b"3", timestamp=now + 3), 0, now_ms=now)
    assert lg.newest_record() == (2, now + 3)
    lg.append_as_leader(batch(1, key=b"d", value=b"4", timestamp=now + 4), 0, now_ms=now)
    assert lg.newest_record() == (4, now + 4)


def test_compaction_never_touches_the_active_segment(tmp_path: Path) -> None:
    lg = _compacted(tmp_path)
    for i in range(5):
        lg.append_as_leader(batch(1, key=b"same", value=f"{i}".encode()), 0, now_ms=0)
    assert len(lg.segments) == 1
    lg.compact(now_ms=0)
    assert len(read_all(lg)) == 5


def test_flipped_byte_in_a_closed_segment_is_never_served(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    for _ in range(40):
        lg.append_as_leader(batch(2, value=b"q" * 50), leader_epoch=0, now_ms=0)
    victim = lg.segments[1]
    position = victim.size // 2
    with open(victim.log_path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x10]))
    offsets_before_victim = list(range(lg.segments[1].base_offset))
    with pytest.raises(LogCorruptError):
        read_all(lg, victim.base_offset)
    lg.close()
    # Recovery from the start (no recovery point) detects it too and cuts the log there.
    recovered = open_log(tmp_path / "t-0", SMALL, recovery_point=0, clean_shutdown=False)
    offsets = [r.offset for r in read_all(recovered)]
    assert offsets[: len(offsets_before_victim)] == offsets_before_victim
    assert victim.base_offset <= recovered.log_end_offset < victim.next_offset
    for pos, header in fmt.iter_headers(recovered.read(0, 10**7).records):
        assert header.base_offset >= 0 and pos >= 0


def _last_batch_position(lg: Log, index: int) -> int:
    seg = lg.segments[index]
    return [bp.position for bp in seg.scan_headers()][-1]


@pytest.mark.parametrize("index_interval", [200, 10_000])  # the batch indexed, or not
@pytest.mark.parametrize("opening", ["clean shutdown", "below the recovery point", "no index"])
@pytest.mark.parametrize(
    ("field", "flip"),
    [
        (8, 1 << 12),  # the batch length: the segment no longer ends on a batch
        (0, 1 << 4),  # the base offset (outside the CRC), 20 -> 4: it goes back
        (0, 1 << 5),  # 20 -> 52: it ends past the next segment's base
        (0, 1 << 32),  # past what the segment's indexes can hold
    ],
)
def test_a_corrupt_flushed_segment_loses_only_its_own_bad_batches(
    tmp_path: Path, field: int, flip: int, opening: str, index_interval: int
) -> None:
    """One flipped bit in the last batch of a flushed, closed segment: recovery cut that
    segment there and deleted every segment after it, flushed and acknowledged (50 records in
    the review's probe), or, for a base offset, kept the batch at its wrong offsets; a jump
    past 2**32 crashed the log's opening on an index assertion. Now only that batch goes
    (Kafka's LogLoader recovers a segment below the recovery point alone), whether the
    segment is loaded (a clean shutdown, or below the recovery point) or, its index files
    gone, recovered."""
    config = replace(SMALL, index_interval_bytes=index_interval)
    lg = open_log(tmp_path / "t-0", config)
    for _ in range(40):
        lg.append_as_leader(batch(2, value=b"q" * 50), leader_epoch=0, now_ms=0)
    assert len(lg.segments) >= 4
    ends = [(seg.base_offset, seg.next_offset) for seg in lg.segments]
    assert ends[0] == (0, 22)  # the last batch of segment 0 is at offset 20
    position = _last_batch_position(lg, 0)
    first_segment = lg.segments[0]
    path = first_segment.log_path
    indexes = (first_segment.offset_index.path, first_segment.time_index.path)
    lg.close()
    data = bytearray(path.read_bytes())
    size = ">q" if field == 0 else ">i"
    (value,) = struct.unpack_from(size, data, position + field)
    struct.pack_into(size, data, position + field, value ^ flip)
    path.write_bytes(data)
    if opening == "no index":
        for index in indexes:
            index.unlink()
    report = RecoveryReport()
    again = open_log(
        tmp_path / "t-0",
        config,
        clean_shutdown=opening == "clean shutdown",
        recovery_point=ends[-1][1],
        report=report,
    )
    first, *rest = [(seg.base_offset, seg.next_offset) for seg in again.segments]
    assert rest == ends[1:], report
    assert first == (0, 20) and report.segments_deleted == [] and report.bytes_truncated
    served = [r.offset for r in read_all(again)]
    assert served == list(range(20)) + list(range(ends[1][0], ends[-1][1]))


def test_reopen_after_clean_close_needs_no_recovery(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    for _ in range(50):
        lg.append_as_leader(batch(3), leader_epoch=2, now_ms=0)
    lg.close()
    from kcoord.storage.log import RecoveryReport

    report = RecoveryReport()
    again = open_log(
        tmp_path / "t-0", SMALL, clean_shutdown=True, recovery_point=150, report=report
    )
    assert report.segments_recovered == 0
    assert again.log_end_offset == 150
    assert [r.offset for r in read_all(again)] == list(range(150))


def test_missing_or_garbage_index_is_rebuilt(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", SMALL)
    for _ in range(50):
        lg.append_as_leader(batch(2, value=b"w" * 40), leader_epoch=0, now_ms=0)
    lg.close()
    first = lg.segments[0]
    os.unlink(first.offset_index.path)
    with open(lg.segments[1].offset_index.path, "r+b") as f:
        f.write(b"\xff" * 16)
    again = open_log(tmp_path / "t-0", SMALL, clean_shutdown=True, recovery_point=100)
    assert [r.offset for r in read_all(again)] == list(range(100))
    assert len(again.segments[0].offset_index) > 0


def test_a_corrupt_batch_found_while_rebuilding_an_index_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A closed segment whose index is garbage and whose log has a flipped byte: the index
    rebuild's scan cuts the segment at the bad batch. The cut went unreported (no warning, an
    empty recovery report); it is reported as any other recovery's (LogSegment.recover's
    "Found invalid messages")."""
    lg = open_log(tmp_path / "t-0", SMALL)
    for _ in range(50):
        lg.append_as_leader(batch(2, value=b"w" * 40), leader_epoch=0, now_ms=0)
    lg.close()
    first = lg.segments[0]
    end = first.next_offset
    with open(first.offset_index.path, "ab") as f:
        f.write(b"\x01\x02\x03")  # not whole entries
    data = bytearray(first.log_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.log_path.write_bytes(bytes(data))
    report = RecoveryReport()
    again = open_log(
        tmp_path / "t-0", SMALL, clean_shutdown=True, recovery_point=100, report=report
    )
    assert again.segments[0].next_offset < end
    assert report.segments_recovered == 1 and report.bytes_truncated > 0
    assert report.errors and report.errors[0].startswith("segment 0: ")
    assert any("truncated" in r.getMessage() for r in caplog.records)
    assert again.log_end_offset == 100  # the segments after it stay


def test_a_file_named_with_other_scripts_digits_is_not_a_segment(tmp_path: Path) -> None:
    """``str.isdigit`` takes Arabic-Indic digits, and ``int`` reads them: a stray file named
    with twenty of those zeros was a second segment 0, which cut the real one to nothing."""
    lg = open_log(tmp_path / "t-0", SMALL)
    for _ in range(50):
        lg.append_as_leader(batch(2, value=b"w" * 40), leader_epoch=0, now_ms=0)
    lg.close()
    size = lg.segments[0].log_path.stat().st_size
    (tmp_path / "t-0" / ("\u0660" * 20 + ".log")).write_bytes(b"")
    (tmp_path / "t-0" / ("\u00b2" * 20 + ".log")).write_bytes(b"")  # isdigit, int() refuses
    again = open_log(tmp_path / "t-0", SMALL, clean_shutdown=True, recovery_point=100)
    assert [r.offset for r in read_all(again)] == list(range(100))
    assert again.segments[0].log_path.stat().st_size == size
    assert parse_partition_dir("t-\u0663") is None


def test_a_directory_no_kafka_topic_could_have_is_not_a_partition() -> None:
    """``orders-03`` was a second directory of partition 3 (one of the two never served); a
    name that is not UTF-8 (``\udcff`` as Python reads it) reached the checkpoints, whose
    writes then raised for every partition of the node."""
    assert parse_partition_dir("orders-3") == ("orders", 3)
    assert parse_partition_dir("__consumer_offsets-0") == ("__consumer_offsets", 0)
    assert parse_partition_dir("a-b.c_d-10") == ("a-b.c_d", 10)
    for name in ("orders-03", "orders-00", "orders\udcff-0", "ord ers-0", "..-0", "x" * 250 + "-0"):
        assert parse_partition_dir(name) is None, name


def test_torn_tail_is_truncated_at_the_last_whole_batch(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    for _ in range(10):
        lg.append_as_leader(batch(2), leader_epoch=0, now_ms=0)
    path = lg.active_segment.log_path
    lg.close()
    data = path.read_bytes()
    path.write_bytes(data + batch(3)[:-7])  # a half-written batch
    again = open_log(tmp_path / "t-0", recovery_point=0)
    assert again.log_end_offset == 20
    assert path.stat().st_size == len(data)
    again.append_as_leader(batch(1), leader_epoch=0, now_ms=0)
    assert [r.offset for r in read_all(again)] == list(range(21))


def test_interrupted_compaction_swap_is_completed(tmp_path: Path) -> None:
    lg = _compacted(tmp_path)
    for i in range(30):
        lg.append_as_leader(batch(1, key=f"k{i % 3}".encode(), value=b"v" * 30), 0, now_ms=0)
    lg.roll()
    lg.close()
    seg_dir = tmp_path / "c-0"
    base = sorted(seg_dir.glob("*.log"))[0]
    # Simulate a crash after the cleaned segment was renamed .swap, before the old one went:
    # here the swap holds the same batches minus its last one.
    raw = base.read_bytes()
    headers = list(fmt.iter_headers(raw))
    last_pos = headers[-1][0]
    (seg_dir / (base.name + ".swap")).write_bytes(raw[:last_pos])
    (seg_dir / (base.name.replace(".log", ".index") + ".cleaned")).write_bytes(b"junk")
    again = _compacted(tmp_path)
    assert not list(seg_dir.glob("*.swap")) and not list(seg_dir.glob("*.cleaned"))
    assert base.stat().st_size == last_pos
    assert again.log_end_offset == 30


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("one"), st.integers(1, 4), st.integers(0, 120)),
            st.tuples(st.just("two"), st.integers(1, 3), st.integers(0, 120)),
            st.tuples(st.just("truncate"), st.integers(0, 100), st.just(0)),
        ),
        min_size=1,
        max_size=40,
    ),
    limits=st.lists(
        st.tuples(st.integers(1, 3_000), st.integers(0, 8), st.booleans()), min_size=1, max_size=5
    ),
)
def test_reads_at_the_tail_match_reads_from_the_index(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, int, int]],
    limits: list[tuple[int, int, bool]],
) -> None:
    """A segment remembers the positions of the batches it appended, so reads near the end skip
    the header scan; whatever was appended, rolled or truncated, every read answers exactly
    what the same read answers from a reopened log (index and scan only)."""
    path = tmp_path_factory.mktemp("tail") / "t-0"
    lg = open_log(path, SMALL)
    for op, n, size in ops:
        if op == "one":
            lg.append_as_leader(batch(n, value=b"v" * size), leader_epoch=0, now_ms=0)
        elif op == "two":  # two batches in one append: the general path
            lg.append_as_leader(batch(n, value=b"w" * size) + batch(1), leader_epoch=0, now_ms=0)
        elif lg.log_end_offset:
            lg.truncate_to(n % (lg.log_end_offset + 1))

    def reads(log_: Log) -> list[tuple[bytes, int | None]]:
        out = []
        for offset in range(log_.log_start_offset, log_.log_end_offset + 1):
            for max_bytes, hw_back, min_one in limits:
                max_offset = max(log_.log_end_offset - hw_back, 0)
                data = log_.read(offset, max_bytes, max_offset=max_offset, min_one=min_one)
                out.append((bytes(data.records), data.first_batch_offset))
        return out

    with_tail = reads(lg)
    lg.close()
    reopened = open_log(path, SMALL)
    try:
        assert reads(reopened) == with_tail
    finally:
        reopened.close()


def _fill(lg: Log, count: int, keys: int, *, start: int = 0) -> None:
    for i in range(start, start + count):
        lg.append_as_leader(batch(1, key=f"k{i % keys}".encode(), value=f"v{i}".encode()), 0, 0)


def test_the_background_cleaner_waits_for_enough_dirty_bytes(tmp_path: Path) -> None:
    lg = _compacted(tmp_path)
    _fill(lg, 60, 7)
    lg.roll()
    plan = lg.plan_cleaning(0, min_dirty_ratio=0.5)
    assert plan is not None and plan.dirty_ratio == 1.0  # never cleaned: all dirty
    assert lg.swap_cleaned(lg.clean(plan)) is not None
    assert lg.first_dirty_offset == 60
    # Cleaned and nothing new: no pass, whatever the ratio asked.
    assert lg.plan_cleaning(0, min_dirty_ratio=0.0) is None
    _fill(lg, 2, 7, start=60)
    lg.roll()
    # A little new data: under the ratio, no pass; the synchronous compact still cleans.
    small = lg.plan_cleaning(0, min_dirty_ratio=0.5)
    assert small is None
    ratio_plan = lg.plan_cleaning(0, min_dirty_ratio=0.01)
    assert ratio_plan is not None and 0 < ratio_plan.dirty_ratio < 0.5
    # A ratio that does not exceed the minimum is no pass (LogCleanerManager's
    # cleanableRatio > minCleanableRatio): neither at the minimum nor for a NaN one, which
    # Kafka's config accepts (it was cleaned at every pass).
    assert lg.plan_cleaning(0, min_dirty_ratio=ratio_plan.dirty_ratio) is None
    assert lg.plan_cleaning(0, min_dirty_ratio=float("nan")) is None


def test_min_compaction_lag_holds_back_young_dirty_segments(tmp_path: Path) -> None:
    """min.compaction.lag.ms: the first dirty segment whose largest timestamp is within the
    lag ends the cleanable range (LogCleanerManager.cleanableOffsets). A segment of records
    without timestamps counts its file's modification time (LogSegment.largestTimestamp; it
    was cleaned at once), and a segment already cleaned, rewritten just now, holds nothing
    back (Kafka looks at the dirty segments only)."""
    lag = 60_000
    config = LogConfig(cleanup_policy=frozenset({"compact"}), min_compaction_lag_ms=lag)
    lg = open_log(tmp_path / "c-0", config)
    now = time.time_ns() // 1_000_000
    old = now - 2 * lag
    for timestamp in (old, fmt.NO_TIMESTAMP, old):
        lg.append_as_leader(batch(1, key=b"a", timestamp=timestamp), 0, now)
        lg.roll()
    plan = lg.plan_cleaning(now)
    assert plan is not None and [s.base_offset for s in plan.segments] == [0]
    later = now + 2 * lag
    plan = lg.plan_cleaning(later)
    assert plan is not None and [s.base_offset for s in plan.segments] == [0, 1, 2]
    assert lg.swap_cleaned(lg.clean(plan)) is not None
    assert lg.first_dirty_offset == 3
    lg.append_as_leader(batch(1, key=b"a", timestamp=old), 0, now)
    lg.roll()
    plan = lg.plan_cleaning(now)
    assert plan is not None and plan.segments[-1].base_offset == 3
    lg.close()


def test_max_compaction_lag_cleans_overdue_records_and_rolls_in_time(tmp_path: Path) -> None:
    """max.compaction.lag.ms (KIP-354): dirty records older than the lag are cleaned whatever
    the dirty ratio (LogCleanerManager.maxCompactionDelay), and a compacted log's active
    segment rolls by then (LogConfig.maxSegmentMs), so its records can be cleaned in time."""
    lag = 60_000
    config = LogConfig(
        cleanup_policy=frozenset({"compact"}), segment_bytes=600, max_compaction_lag_ms=lag
    )
    lg = open_log(tmp_path / "c-0", config)
    _fill(lg, 60, 7)
    lg.roll()
    first = lg.plan_cleaning(0, min_dirty_ratio=0.5)
    assert first is not None and lg.swap_cleaned(lg.clean(first)) is not None
    _fill(lg, 2, 7, start=60)  # batches stamped 1000
    lg.roll()
    assert lg.plan_cleaning(1_000 + lag, min_dirty_ratio=0.5) is None  # not older yet
    overdue = lg.plan_cleaning(1_001 + lag, min_dirty_ratio=0.5)
    assert overdue is not None and overdue.dirty_ratio < 0.5

    for policy, rolls in (("compact", True), ("delete", False)):
        other = open_log(
            tmp_path / f"{policy}-0",
            LogConfig(cleanup_policy=frozenset({policy}), max_compaction_lag_ms=lag),
        )
        other.append_as_leader(batch(1, timestamp=5_000), 0, now_ms=5_000)
        other.append_as_leader(batch(1, timestamp=5_000 + lag), 0, now_ms=5_000 + lag)
        assert len(other.segments) == 1
        other.append_as_leader(batch(1, timestamp=5_001 + lag), 0, now_ms=5_001 + lag)
        assert len(other.segments) == (2 if rolls else 1), policy


def test_a_kept_tombstone_makes_the_log_cleanable_once_its_horizon_passes(
    tmp_path: Path,
) -> None:
    lg = _compacted(tmp_path)  # delete.retention.ms = 1000
    _fill(lg, 20, 4)
    lg.append_as_leader(batch(1, key=b"k0", value=None), 0, 0)
    lg.roll()
    plan = lg.plan_cleaning(100, min_dirty_ratio=0.5)
    assert plan is not None
    assert lg.swap_cleaned(lg.clean(plan)) is not None
    assert lg.delete_horizon_ms == 1_100
    assert lg.plan_cleaning(1_099, min_dirty_ratio=0.5) is None
    late = lg.plan_cleaning(1_100, min_dirty_ratio=0.5)
    assert late is not None
    stats = lg.swap_cleaned(lg.clean(late))
    assert stats is not None and stats.tombstones_dropped == 1
    assert lg.delete_horizon_ms is None
    assert b"k0" not in {r.key for r in read_all(lg)}


@pytest.mark.parametrize("change", ["truncate", "retention", "close", "no longer compacted"])
def test_a_cleaning_planned_before_the_log_changed_is_thrown_away(
    tmp_path: Path, change: str
) -> None:
    lg = _compacted(tmp_path)
    _fill(lg, 60, 7)
    lg.roll()
    _fill(lg, 3, 7, start=60)
    plan = lg.plan_cleaning(0)
    assert plan is not None
    result = lg.clean(plan)
    assert list(tmp_path.glob("c-0/*.cleaned"))
    before = [(r.offset, r.value) for r in read_all(lg)]
    if change == "truncate":
        lg.truncate_to(50)
        before = [(o, v) for o, v in before if o < 50]
    elif change == "retention":
        lg.maybe_increment_log_start_offset(lg.segments[1].base_offset)
        assert lg.delete_old_segments(0) == 1
        before = [(o, v) for o, v in before if o >= lg.log_start_offset]
    elif change == "no longer compacted":
        # cleanup.policy compact -> delete while the pass ran: Kafka's
        # LogManager.updateTopicConfig aborts the cleaning; the records stay.
        lg.config = replace(lg.config, cleanup_policy=frozenset({"delete"}))
    else:
        lg.close()
    assert lg.swap_cleaned(result) is None
    assert not list(tmp_path.glob("c-0/*.cleaned")) and not list(tmp_path.glob("c-0/*.swap"))
    if change == "close":
        lg = _compacted(tmp_path)
    assert [(r.offset, r.value) for r in read_all(lg)] == before


def test_cleaning_on_a_thread_while_the_log_takes_appends(tmp_path: Path) -> None:
    """The copies are written off the owner thread while it appends and reads; the swap keeps
    every appended record and drops only the superseded ones."""
    lg = _compacted(tmp_path)
    _fill(lg, 200, 5)
    lg.roll()
    plan = lg.plan_cleaning(0)
    assert plan is not None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(lg.clean, plan)
        i = 200
        while not future.done() or i < 260:
            _fill(lg, 1, 5, start=i)
            assert read_all(lg)[-1].value == f"v{i}".encode()
            i += 1
        result = future.result()
    assert lg.swap_cleaned(result) is not None
    records = read_all(lg)
    cleaned = [r for r in records if r.offset < 200]
    assert sorted(r.key for r in cleaned if r.key is not None) == [
        f"k{j}".encode() for j in range(5)
    ]
    assert [r.offset for r in records if r.offset >= 200] == list(range(200, i))
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets)


def test_segments_let_go_are_renamed_deleted_and_left_to_the_remover(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1_000, retention_ms=10_000)
    lg = open_log(tmp_path / "t-0", config)
    for i in range(20):
        lg.append_as_leader(batch(1, timestamp=i * 1_000, value=b"x" * 200), 0, now_ms=0)
    handed: list[Path] = []
    lg.remove_files = handed.extend
    assert lg.delete_old_segments(now_ms=15_000) > 0
    assert handed and all(p.name.endswith(".deleted") and p.exists() for p in handed)
    assert {p.name.split(".")[1] for p in handed} == {"log", "index", "timeindex"}
    assert read_all(lg)[0].offset == lg.log_start_offset  # reads unaffected
    start = lg.log_start_offset
    lg.close()
    # A crash before the remover ran: the next open removes what it left.
    again = open_log(tmp_path / "t-0", config)
    assert not list((tmp_path / "t-0").glob("*.deleted"))
    assert read_all(again)[0].offset == start


def test_index_entries_across_prefilled_chunks_survive_truncation_and_reopening(
    tmp_path: Path,
) -> None:
    """The mapped index is written with zeros a chunk ahead of its entries (no store faults
    on a hole of the sparse file); the entries themselves are never touched by it."""
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0, max_bytes=1024 * 1024)
    entries = 20_000  # 160 KB: many chunks
    for i in range(entries):
        index.append(i * 2, i * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        # Every entry is on data, the zeros reach at most a chunk (a page) past the last one,
        # and the rest of the preallocated file is a hole.
        data_end = os.lseek(fd, 0, os.SEEK_HOLE)
        assert entries * 8 <= data_end <= entries * 8 + 2 * 4096
        assert os.fstat(fd).st_blocks * 512 <= data_end + 4096
    finally:
        os.close(fd)
    index.truncate_to_position(15_000 * 100)  # keeps 15,000 entries
    for i in range(15_000, 16_000):
        index.append(i * 2 + 1, i * 100 + 50)
    index.close()
    again = OffsetIndex(path, 0, max_bytes=1024 * 1024)
    again.load(log_size=10**9)
    assert again.lookup(2 * 14_999) == (2 * 14_999, 14_999 * 100)
    assert again.lookup(2 * 15_500 + 1) == (2 * 15_500 + 1, 15_500 * 100 + 50)
    assert again.last_offset == 2 * 15_999 + 1
    assert os.path.getsize(path) == 16_000 * 8
    again.close()


def test_a_batch_whose_count_disagrees_with_its_offset_range_is_refused(tmp_path: Path) -> None:
    """Kafka's ``LogValidator.validateBatch``: three records under a header whose last offset
    delta says one would have the next batch serve offsets 1 and 2 again."""
    records = [fmt.Record(i, 1000, b"k%d" % i, b"v") for i in range(3)]
    bad = bytearray(fmt.build_batch(records))
    struct.pack_into(">i", bad, 23, 0)  # lastOffsetDelta, under the CRC
    struct.pack_into(">I", bad, 17, fmt.compute_crc(bad, 0, len(bad)))
    lg = open_log(tmp_path / "t-0", SMALL)
    with pytest.raises(InvalidRecordError, match="inconsistent offset range"):
        lg.append_as_leader(bytes(bad), 0, now_ms=1000)
    with pytest.raises(InvalidRecordError, match="inconsistent offset range"):
        lg.append_as_leader(batch(1) + bytes(bad), 0, now_ms=1000)  # the many-batch path
    assert lg.log_end_offset == 0
    lg.append_as_leader(batch(3), 0, now_ms=1000)
    assert [r.offset for r in read_all(lg)] == [0, 1, 2]


def test_time_retention_passes_a_segment_compaction_emptied(tmp_path: Path) -> None:
    """A compact,delete log whose first segment compaction emptied: with no timestamp left it
    expires by its file's age (Kafka's ``LogSegment.largestTimestamp``), not never, which
    stopped time retention of every later segment."""
    hour = 3_600_000
    config = LogConfig(
        cleanup_policy=frozenset({"compact", "delete"}), segment_bytes=200, retention_ms=hour
    )
    lg = open_log(tmp_path / "t-0", config)
    t0 = 10 * hour
    for i in range(8):  # one key over and over: two batches a segment
        record = fmt.Record(0, t0 + i, b"K", b"v%d" % i)
        lg.append_as_leader(fmt.build_batch([record]), 0, now_ms=t0 + i)
    lg.compact(t0 + 100)
    assert lg.segments[0].max_timestamp < 0  # emptied
    closed = len(lg.segments) - 1
    assert closed > 1
    later = lg.segments[0].largest_timestamp_ms() + 100 * hour  # the file's age
    assert lg.delete_old_segments(later) == closed + 1  # the active one expired too
    assert len(lg.segments) == 1 and lg.segments[0].size == 0
    assert lg.log_start_offset == lg.log_end_offset == 8


def test_retention_expires_an_idle_partitions_active_segment(tmp_path: Path) -> None:
    """UnifiedLog.deletableSegments: the active segment qualifies like the others once the
    high watermark reaches the log end, and goes after a roll; a partition that stopped
    receiving records kept them past retention.ms and retention.bytes for ever."""
    lg = open_log(tmp_path / "t-0", LogConfig(retention_ms=60_000))
    for i in range(5):
        lg.append_as_leader(batch(1, timestamp=1_000 + i), 0, now_ms=1_000 + i)
    assert lg.delete_old_segments(30_000) == 0  # not yet
    assert lg.delete_old_segments(10 * 3_600_000, high_watermark=4) == 0  # not replicated
    assert lg.delete_old_segments(10 * 3_600_000, high_watermark=5) == 1
    assert (lg.log_start_offset, lg.log_end_offset, lg.size_bytes) == (5, 5, 0)
    assert lg.read(5, 1 << 20).records == b""
    assert lg.delete_old_segments(20 * 3_600_000) == 0  # an empty active segment stays
    lg.append_as_leader(batch(1, timestamp=20 * 3_600_000), 0, now_ms=20 * 3_600_000)
    assert [r.offset for r in read_all(lg)] == [5]
    lg.close()
    again = open_log(tmp_path / "t-0", LogConfig(retention_ms=60_000))
    assert (again.log_start_offset, again.log_end_offset) == (5, 6)
    by_size = open_log(tmp_path / "s-0", LogConfig(retention_bytes=0))
    by_size.append_as_leader(batch(3), 0, now_ms=0)
    assert by_size.delete_old_segments(0) == 1 and by_size.log_start_offset == 3


@pytest.mark.parametrize("interval", [0, 100])
def test_a_follower_append_of_many_batches_rolls_before_an_index_fills(
    tmp_path: Path, interval: int
) -> None:
    """One follower append of many small batches under a small ``segment.index.bytes`` (room
    for three offset and two time entries): the run stops and the log rolls where the next
    batch would take an entry no index has room for, instead of failing half-written (its
    retry then overlapped offsets, which recovery cut off with every later segment)."""
    config = LogConfig(segment_index_bytes=24, index_interval_bytes=interval)
    lg = open_log(tmp_path / "t-0", config)
    for start in (0, 40):
        data = b"".join(
            fmt.build_batch([fmt.Record(i, 1000 + i, b"k", b"v" * 30)], base_offset=i)
            for i in range(start, start + 40)
        )
        lg.append_as_follower(data, now_ms=0)
    assert lg.log_end_offset == 80 and len(lg.segments) > 1
    assert all(s.index_room >= 0 for s in lg.segments)
    lg.close()
    again = open_log(tmp_path / "t-0", config)
    assert again.log_end_offset == 80
    assert [r.offset for r in read_all(again)] == list(range(80))


def test_a_segment_whose_index_no_longer_fits_the_config_recovers(tmp_path: Path) -> None:
    """``segment.index.bytes`` lowered under an existing log, then a crash: recovery rebuilds
    the indexes under the new size, leaving them sparser where they fill, and every record
    is still found (the lookup scans on from the last entry)."""
    lg = open_log(tmp_path / "t-0", LogConfig(index_interval_bytes=0))
    for _ in range(40):
        lg.append_as_leader(batch(1, value=b"v" * 30), 0, now_ms=0)
    for suffix in (".index", ".timeindex"):
        (tmp_path / "t-0" / f"00000000000000000000{suffix}").unlink()  # rebuilt on open
    small = LogConfig(segment_index_bytes=24, index_interval_bytes=0)
    again = open_log(tmp_path / "t-0", small)
    assert again.log_end_offset == 40
    assert [r.offset for r in read_all(again, 37)] == [37, 38, 39]


def test_recovery_stops_at_a_batch_whose_length_runs_past_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corrupt length field in the first batch: recovery truncates there after one read,
    instead of reading (and copying) the rest of the segment chunk by chunk; a batch larger
    than a chunk is still read whole."""
    lg = open_log(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(batch(1, value=b"b" * 200_000), 0, now_ms=0)  # larger than a chunk
    for _ in range(100):
        lg.append_as_leader(batch(1, value=b"v" * 400), 0, now_ms=0)
    for seg in lg.segments:
        seg.close()
    monkeypatch.setattr(segment_module, "_RECOVER_CHUNK", 64 * 1024)
    report = RecoveryReport()
    again = Log.open(tmp_path / "t-0", LogConfig(), report=report)  # no clean shutdown
    assert again.log_end_offset == 101 and report.bytes_truncated == 0
    for seg in again.segments:
        seg.close()

    path = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, 8, 2**31 - 1)  # the first batch's length
    path.write_bytes(data)
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        reads.append(size)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    report = RecoveryReport()
    broken = Log.open(tmp_path / "t-0", LogConfig(), report=report)
    monkeypatch.undo()
    assert broken.log_end_offset == 0 and report.bytes_truncated == len(data)
    assert len(reads) <= 2, reads


def test_new_segments_and_swapped_ones_reach_the_directory_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment file's data is fsynced on roll, and its directory entry with it (Kafka's
    ``LocalLog.flush`` flushes the parent directory when a segment created since the last
    flush is flushed; ``replaceSegments`` after the compaction renames): without it a power
    loss could lose whole segments whose records were below the recovery point."""
    synced: list[Path] = []
    real = checkpoint.fsync_dir

    def recording(path: Path) -> None:
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(checkpoint, "fsync_dir", recording)
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1_000))
    synced.clear()
    for _ in range(3):  # the first segment fills: the roll fsyncs it and the directory
        lg.append_as_leader(batch(1, value=b"x" * 400), leader_epoch=0, now_ms=0)
    # ... and writes the leader-epoch checkpoint, whose rename fsyncs the directory again.
    assert len(lg.segments) == 2 and synced == [tmp_path / "t-0"] * 2
    synced.clear()
    lg.flush()  # the segment the roll created is flushed for the first time
    assert synced == [tmp_path / "t-0"]
    synced.clear()
    lg.append_as_leader(batch(1, value=b"x" * 10), leader_epoch=0, now_ms=0)
    lg.flush()  # nothing new in the directory
    assert synced == []
    lg.close()

    compacted = _compacted(tmp_path / "c")
    for i in range(20):
        compacted.append_as_leader(batch(1, key=b"k", value=f"{i}".encode()), 0, now_ms=0)
    compacted.roll()
    synced.clear()
    compacted.compact(now_ms=0)
    assert synced == [tmp_path / "c" / "c-0"]
    compacted.close()


def test_truncation_to_a_segment_boundary_keeps_the_log_end_there(tmp_path: Path) -> None:
    """Segment 10-19 held only tombstones, which compaction removed with their segment; 20-24
    were not committed yet. Truncated to 20, the log ended at 10, below its committed offsets
    (and at 0 after a restart): the segment starting at the boundary went too. Kafka's
    LocalLog.truncateTo keeps it, emptied, and sets the log end."""
    config = LogConfig(cleanup_policy=frozenset({"compact"}), delete_retention_ms=1_000)
    lg = open_log(tmp_path / "c-0", config)

    def append(key: bytes, value: bytes | None) -> None:
        lg.append_as_leader(batch(1, key=key, value=value, timestamp=1_000), 0, now_ms=1_000)

    for i in range(10):
        append(b"keep%d" % i, b"v")
    lg.roll()
    for i in range(10):
        append(b"gone%d" % i, None)
    lg.roll()
    for i in range(5):
        append(b"new%d" % i, b"v")
    lg.compact(now_ms=2_000, high_watermark=20)
    lg.compact(now_ms=4_000, high_watermark=20)
    assert lg.truncate_to(20) == 20 and lg.log_end_offset == 20
    lg.close()
    again = open_log(tmp_path / "c-0", config)
    assert again.log_end_offset == 20
    # Below the boundary, in the gap compaction left: the log end is the offset asked for.
    assert again.truncate_to(15) == 15 and again.log_end_offset == 15


def _timestamped(ts: int) -> bytes:
    return fmt.build_batch([fmt.Record(0, ts, b"k", b"v" * 60)])


# Timestamps far in the past and future are accepted as they are.
_ANY_TIMESTAMP = LogConfig(index_interval_bytes=150, message_timestamp_after_max_ms=2**62)


def test_a_segment_reopened_with_a_time_index_sparser_than_its_offset_index_keeps_its_max(
    tmp_path: Path,
) -> None:
    """A recovery under a smaller segment.index.bytes fills the time index (12-byte entries)
    before the offset index (8): the largest timestamp sits after the time index's last entry
    and before the offset index's. The reopened segment must still know it (Kafka's
    readLargestTimestamp scans from the time index's last entry): it hid the segment from
    lookups by timestamp, ListOffsets -3 and retention."""
    big = replace(_ANY_TIMESTAMP, segment_index_bytes=4096)
    small = replace(big, segment_index_bytes=24)  # 3 offset entries, 2 time entries
    lg = open_log(tmp_path / "t-0", big)
    for ts in (100, 200, 300, 400, 500, 5000, 600, 700, 800, 900, 1000, 1100):
        lg.append_as_leader(_timestamped(ts), leader_epoch=0, now_ms=0)
    lg.roll()
    lg.append_as_leader(_timestamped(50), leader_epoch=0, now_ms=0)
    lg.flush()
    lg.abandon()
    lg = open_log(tmp_path / "t-0", small, recovery_point=0, clean_shutdown=False)
    segment = lg.segments[0]
    assert segment.time_index.entries()[-1][1] < segment.offset_index.entries()[-1][0]
    recovery_point = lg.recovery_point
    lg.close()
    lg = open_log(tmp_path / "t-0", small, recovery_point=recovery_point, clean_shutdown=True)
    assert lg.segments[0].max_timestamp == 5000
    assert lg.offset_for_timestamp(4000) == (5, 5000)


def test_a_segment_without_its_time_index_is_rebuilt(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", _ANY_TIMESTAMP)
    for ts in (100, 5000, 200, 300, 400, 500, 600):
        lg.append_as_leader(_timestamped(ts), leader_epoch=0, now_ms=0)
    lg.roll()
    lg.append_as_leader(_timestamped(50), leader_epoch=0, now_ms=0)
    recovery_point = lg.recovery_point
    lg.close()
    (tmp_path / "t-0" / "00000000000000000000.timeindex").unlink()
    lg = open_log(
        tmp_path / "t-0", _ANY_TIMESTAMP, recovery_point=recovery_point, clean_shutdown=True
    )
    assert lg.segments[0].max_timestamp == 5000
    assert lg.segments[0].time_index.entries()
    assert lg.offset_for_timestamp(1000) == (1, 5000)


def test_segment_ms_rolls_by_the_clock_when_the_first_batch_has_no_timestamp(
    tmp_path: Path,
) -> None:
    """Kafka's timeWaitedForRoll: the first batch's timestamp when it has one, else the time
    since the segment was created. Batches without timestamps (-1) never rolled; the first
    timestamped batch after them always did."""
    lg = open_log(tmp_path / "t-0", LogConfig(segment_ms=60_000))
    now = 1_700_000_000_000
    lg.append_as_leader(_timestamped(-1), leader_epoch=0, now_ms=now)
    lg.append_as_leader(_timestamped(-1), leader_epoch=0, now_ms=now + 60_000)
    assert [s.base_offset for s in lg.segments] == [0]
    lg.append_as_leader(_timestamped(-1), leader_epoch=0, now_ms=now + 60_001)
    assert [s.base_offset for s in lg.segments] == [0, 2]
    lg.append_as_leader(_timestamped(now), leader_epoch=0, now_ms=now + 60_002)
    assert [s.base_offset for s in lg.segments] == [0, 2]  # 1 ms after the segment began
    follower = open_log(tmp_path / "f-0", LogConfig(segment_ms=60_000))
    for i, at in enumerate((now, now + 60_001)):
        record = fmt.Record(i, -1, b"k", b"v")
        follower.append_as_follower(fmt.build_batch([record], partition_leader_epoch=0), at)
    assert [s.base_offset for s in follower.segments] == [0, 1]


def test_batch_headers_from_an_offset_match_a_scan_of_every_segment(tmp_path: Path) -> None:
    """What a producer state reads to catch up: every batch from the one holding the offset
    on, across segments, as a scan of the whole log finds them."""
    lg = open_log(tmp_path / "t-0", SMALL)
    for i in range(60):
        lg.append_as_leader(batch(1 + i % 3), leader_epoch=0, now_ms=0)
    assert len(lg.segments) >= 3
    every = [bp.header for seg in lg.segments for bp in seg.scan_headers()]
    for offset in range(lg.log_end_offset + 1):
        expected = [h for h in every if h.last_offset >= offset]
        assert list(lg.batch_headers_from(offset)) == expected, offset


def _raw_record(offset_delta: int, key: bytes, headers: bytes = b"\x00") -> bytes:
    """One v2 record by hand: attributes, timestamp delta 0, the offset delta, key, value
    "v", then ``headers`` (their count and fields, already encoded)."""
    body = bytearray(b"\x00")
    fmt.write_varint(body, 0)
    fmt.write_varint(body, offset_delta)
    for field in (key, b"v"):
        fmt.write_varint(body, len(field))
        body += field
    body += headers
    out = bytearray()
    fmt.write_varint(out, len(body))
    return bytes(out + body)


def _raw_batch(
    records: list[bytes],
    last_offset_delta: int,
    compression: fmt.Compression = fmt.Compression.NONE,
) -> bytes:
    out = bytearray(fmt.HEADER_SIZE) + fmt.compress(compression, b"".join(records))
    fmt.HEADER.pack_into(
        out, 0, 0, len(out) - fmt.LOG_OVERHEAD, -1, 2, 0, int(compression), last_offset_delta,
        1000, 1000, -1, -1, -1, len(records),
    )  # fmt: skip
    struct.pack_into(">I", out, 17, fmt.compute_crc(out, 0, len(out)))
    return bytes(out)


def test_a_compacted_log_takes_only_batches_its_cleaner_can_rebuild(tmp_path: Path) -> None:
    """The leader took, on a compacted topic, batches its cleaner then failed on at every
    pass: two records at one offset, and a header key that is not UTF-8. The first is refused
    now; the second is kept byte for byte, as Kafka reads header keys leniently."""
    lg = open_log(tmp_path / "t-0", replace(SMALL, cleanup_policy=frozenset({"compact"})))
    same_offset = _raw_batch([_raw_record(0, b"a"), _raw_record(0, b"b")], 1)
    with pytest.raises(fmt.RecordFormatError, match="offset delta 0 after 0"):
        lg.append_as_leader(same_offset, 0, now_ms=1000)
    null_header_key = _raw_batch([_raw_record(0, b"a", b"\x02\x01\x00")], 0)
    with pytest.raises(fmt.RecordFormatError, match="null header key"):
        lg.append_as_leader(null_header_key, 0, now_ms=1000)
    latin = _raw_batch([_raw_record(0, b"a", b"\x02\x04\xff\xfe\x02x")], 0)
    lg.append_as_leader(latin, 0, now_ms=1000)
    lg.append_as_leader(batch(1, key=b"a"), 0, now_ms=1000)  # supersedes it
    lg.append_as_leader(batch(1, key=b"b"), 0, now_ms=1000)
    lg.roll()
    assert lg.compact(lg.log_end_offset) is not None
    assert [(r.offset, r.key) for r in read_all(lg)] == [(1, b"a"), (2, b"b")]
    (record,) = fmt.decode_records(latin)
    rebuilt = fmt.decode_records(fmt.build_batch([record]))
    assert rebuilt[0].headers == record.headers
    assert record.headers[0][0].encode(errors="surrogateescape") == b"\xff\xfe"


def test_a_batch_claiming_more_records_than_it_holds_is_refused(tmp_path: Path) -> None:
    """A 70-byte batch claiming a million records (offset range and count agreeing, CRC
    valid) moved the log end by a million and no reader could decode it."""
    lg = open_log(tmp_path / "t-0", SMALL)
    inflated = _raw_batch([_raw_record(0, b"a")], 999_999)
    data = bytearray(inflated)
    struct.pack_into(">i", data, fmt.HEADER_SIZE - 4, 1_000_000)  # the record count
    struct.pack_into(">I", data, 17, fmt.compute_crc(data, 0, len(data)))
    # Alone (the produce fast path), and followed by another batch (checked batch by batch).
    for records in (bytes(data), bytes(data) + batch(1)):
        with pytest.raises(InvalidRecordError, match="Incorrect declared batch size"):
            lg.append_as_leader(records, 0, now_ms=1000)
    assert lg.log_end_offset == 0
    # Many records compress into fewer bytes than that bound: a compressed batch is let be.
    many = [fmt.Record(i, 1000, b"k", b"v" * 1_000) for i in range(200)]
    packed = fmt.build_batch(many, compression=fmt.Compression.GZIP)
    assert len(packed) < 200 * 7
    lg.append_as_leader(packed, 0, now_ms=1000)
    assert lg.log_end_offset == 200


def _recount(batch_bytes: bytes, count: int) -> bytes:
    """The batch claiming ``count`` records (offset range agreeing), its CRC made valid."""
    data = bytearray(batch_bytes)
    struct.pack_into(">i", data, 23, count - 1)  # last offset delta
    struct.pack_into(">i", data, fmt.HEADER_SIZE - 4, count)
    struct.pack_into(">I", data, 17, fmt.compute_crc(data, 0, len(data)))
    return bytes(data)


@pytest.mark.parametrize("codec", [fmt.Compression.GZIP, fmt.Compression.LZ4])
def test_a_compressed_batch_must_hold_the_records_it_claims(
    tmp_path: Path, codec: fmt.Compression
) -> None:
    """A compressed batch claiming more (or fewer) records than it holds took that offset
    range: its body says nothing until decompressed, and the leader did not decompress it
    (Kafka's LogValidator does, and refuses it). A body that does not decompress is refused
    too (CORRUPT_MESSAGE)."""
    lg = open_log(tmp_path / "t-0", SMALL)
    packed = fmt.build_batch(
        [fmt.Record(i, 1000, b"k", b"v" * 100) for i in range(20)], compression=codec
    )
    for claimed in (1_000_000, 21, 19):
        for records in (_recount(packed, claimed), _recount(packed, claimed) + batch(1)):
            with pytest.raises(InvalidRecordError, match="Incorrect declared batch size"):
                lg.append_as_leader(records, 0, now_ms=1000)
    garbage = bytearray(packed)
    garbage[fmt.HEADER_SIZE :] = b"\x00" * (len(packed) - fmt.HEADER_SIZE)
    struct.pack_into(">I", garbage, 17, fmt.compute_crc(garbage, 0, len(garbage)))
    with pytest.raises(fmt.RecordFormatError) as refused:
        lg.append_as_leader(bytes(garbage), 0, now_ms=1000)
    assert not isinstance(refused.value, InvalidRecordError)  # the node answers CORRUPT_MESSAGE
    assert lg.log_end_offset == 0
    assert lg.append_as_leader(packed, 0, now_ms=1000).last_offset == 19


def test_an_uncompressed_batch_must_hold_exactly_the_records_it_claims(tmp_path: Path) -> None:
    """A batch declaring one record more or less than it holds, or with a record cut short
    inside it (count, offset range and CRC agreeing) was stored as sent, and then no reader
    could decode it: every consumer of the partition stopped at its offset. Kafka's
    LogValidator reads every record and refuses it, alone or followed by another batch."""
    lg = open_log(tmp_path / "t-0", SMALL)
    sent = fmt.build_batch([fmt.Record(i, 1000, b"k", b"v" * 10) for i in range(3)])
    cut = bytearray(sent)
    cut[fmt.HEADER_SIZE] = 2  # the first record's length varint: 1, shorter than it is
    struct.pack_into(">I", cut, 17, fmt.compute_crc(cut, 0, len(cut)))
    for bad in (_recount(sent, 4), _recount(sent, 2), bytes(cut)):
        for records in (bad, bad + batch(1)):
            with pytest.raises(InvalidRecordError, match="Incorrect declared batch size"):
                lg.append_as_leader(records, 0, now_ms=1000)
    assert lg.log_end_offset == 0
    assert lg.append_as_leader(sent, 0, now_ms=1000).last_offset == 2
    assert [r.value for r in read_all(lg)] == [b"v" * 10] * 3
    # A header key that is not UTF-8 is no reason to refuse a batch (Kafka reads header keys
    # leniently), compressed or not; the count is still checked.
    latin = fmt.Record(0, 1000, b"k", b"v", (("\udcff\udcfe", b"x"),))
    for codec in (fmt.Compression.NONE, fmt.Compression.GZIP):
        lenient = fmt.build_batch([latin, replace(latin, offset=1)], compression=codec)
        assert lg.append_as_leader(lenient, 0, now_ms=1000).last_offset == lg.log_end_offset - 1
        with pytest.raises(InvalidRecordError, match="Incorrect declared batch size"):
            lg.append_as_leader(_recount(lenient, 3), 0, now_ms=1000)
    assert [r.headers for r in read_all(lg)][-1] == latin.headers


def test_a_producers_batch_must_start_at_offset_zero(tmp_path: Path) -> None:
    """UnifiedLog.analyzeAndValidateRecords: the leader assigns the offsets, so a batch a
    producer sends starts at 0, alone or among others."""
    lg = open_log(tmp_path / "t-0", SMALL)
    later = bytearray(batch(2))
    fmt.set_base_offset(later, 0, 7)
    for records in (bytes(later), batch(1) + bytes(later)):
        with pytest.raises(InvalidRecordError, match="should be 0, but it is 7"):
            lg.append_as_leader(records, 0, now_ms=1000)
    assert lg.log_end_offset == 0
    assert lg.append_as_leader(batch(2), 0, now_ms=1000).last_offset == 1


def test_a_cleaned_segment_keeps_the_original_modification_time(tmp_path: Path) -> None:
    """A segment compaction empties has no timestamps left, so it ages by its file's
    modification time: a fresh one on the cleaned copy kept it (and every expired segment
    behind it) from time retention for another retention.ms (Cleaner.cleanSegments)."""
    config = LogConfig(
        segment_bytes=400, cleanup_policy=frozenset({"compact", "delete"}), retention_ms=3_600_000
    )
    lg = open_log(tmp_path / "t-0", config)
    now = 10 * 3_600_000
    old = now - 2 * 3_600_000
    for _ in range(6):  # key A, superseded by each next one
        lg.append_as_leader(batch(1, key=b"A", value=b"x" * 100, timestamp=old), 0, now_ms=old)
    lg.roll()
    lg.append_as_leader(batch(1, key=b"B", value=b"y", timestamp=now), 0, now_ms=now)
    for seg in lg.segments[:-1]:
        os.utime(seg.log_path, ns=(old * 1_000_000, old * 1_000_000))
    assert lg.compact(now) is not None
    emptied = lg.segments[0]
    assert emptied.max_timestamp == fmt.NO_TIMESTAMP
    assert emptied.largest_timestamp_ms() == old
    assert lg.delete_old_segments(now) >= 1


@given(
    seed=st.integers(0, 2**32 - 1),
    io_bytes=st.sampled_from([1, 150, 700, 4_000]),
)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_cleaner_reads_and_writes_in_runs_with_the_same_result(
    tmp_path_factory: pytest.TempPathFactory, seed: int, io_bytes: int
) -> None:
    """The cleaner read each segment whole and built its copy whole (about three times a
    segment in memory); in runs of batches of any size it cleans to the same log."""
    import random

    rng = random.Random(seed)
    print("seed", seed)
    config = LogConfig(
        segment_bytes=1_500, index_interval_bytes=100, cleanup_policy=frozenset({"compact"})
    )
    appends = [
        [(rng.choice([b"a", b"b", b"c", b"d"]), rng.choice([b"v" * rng.randint(0, 80), None]))
         for _ in range(rng.randint(1, 4))]
        for _ in range(60)
    ]  # fmt: skip
    results = []
    for run_bytes in (io_bytes, 10**9):
        root = tmp_path_factory.mktemp("runs")
        lg = open_log(root / "t-0", config)
        for records in appends:
            keys: list[bytes | None] = [k for k, _ in records]
            values = [v for _, v in records]
            lg.append_as_leader(batch(len(records), keys=keys, values=values), 0, now_ms=1_000)
        lg.roll()
        original = log_module._CLEAN_IO_BYTES
        log_module._CLEAN_IO_BYTES = run_bytes
        try:
            lg.compact(1_000)
        finally:
            log_module._CLEAN_IO_BYTES = original
        results.append(
            (
                [(r.offset, r.key, r.value) for r in read_all(lg)],
                [(seg.base_offset, seg.next_offset, seg.size) for seg in lg.segments],
            )
        )
        lg.close()
    assert results[0] == results[1]


def test_the_offset_map_holds_as_many_keys_as_kafkas_dedupe_buffer() -> None:
    """Kafka's SkimpyOffsetMap: 24-byte slots of log.cleaner.dedupe.buffer.size, filled to
    0.9 (its default 128 MiB maps 5,033,164 keys a pass)."""
    assert log_module.DEFAULT_OFFSET_MAP_CAPACITY == 5_033_164
    assert log_module.offset_map_capacity(2**40) == int((2**31 - 1) // 24 * 0.9)
    assert log_module.offset_map_capacity(1) == 1


def _keyed(lg: Log, pairs: list[tuple[bytes, bytes | None]], now_ms: int = 0) -> None:
    for key, value in pairs:
        lg.append_as_leader(batch(1, key=key, value=value), 0, now_ms=now_ms)


def test_a_full_key_map_cleans_up_to_where_it_stopped(tmp_path: Path) -> None:
    """The key map was unbounded: a log with more keys than memory could not be cleaned. A
    pass now maps at most ``map_capacity`` keys and cleans below where it stopped; the next
    goes on from there."""
    lg = _compacted(tmp_path)
    _keyed(lg, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1"), (b"b", b"2")])
    lg.roll()
    plan = lg.plan_cleaning(0)
    assert plan is not None
    result = lg.clean(plan, map_capacity=2)
    # a and b at offsets 0 and 1, then a again (already mapped); c would be a third key.
    assert result.end_offset == 3
    assert lg.swap_cleaned(result) is not None
    assert lg.first_dirty_offset == 3
    assert [(r.offset, r.key, r.value) for r in read_all(lg)] == [
        (1, b"b", b"1"),  # b's later record lies above where the map stopped
        (2, b"a", b"2"),
        (3, b"c", b"1"),
        (4, b"b", b"2"),
    ]
    lg.compact(now_ms=0, map_capacity=2)
    assert lg.first_dirty_offset == 5
    assert [(r.offset, r.key, r.value) for r in read_all(lg)] == [
        (2, b"a", b"2"),
        (3, b"c", b"1"),
        (4, b"b", b"2"),
    ]


def test_a_tombstone_above_a_full_map_waits_for_its_older_values(tmp_path: Path) -> None:
    """A tombstone above where a full map stopped was stamped and, a pass later, dropped as
    if it were its key's last record while an older value, mapped in that pass, stayed: the
    deleted key came back (found by a compaction fuzzer with a small map)."""
    lg = open_log(
        tmp_path / "c-0",
        LogConfig(cleanup_policy=frozenset({"compact"}), delete_retention_ms=0),
    )
    _keyed(lg, [(b"a", b"1"), (b"b", b"1"), (b"d", b"old"), (b"c", b"1"), (b"d", None)])
    lg.roll()
    seen_d: list[list[tuple[int, bytes | None]]] = []
    for now in range(10):
        lg.compact(now_ms=now, map_capacity=1)
        records = read_all(lg)
        d = [(r.offset, r.value) for r in records if r.key == b"d"]
        seen_d.append(d)
        # The old value never outlives the tombstone.
        assert d in ([(2, b"old"), (4, None)], [(4, None)], []), (now, d)
    assert seen_d[-1] == []
    assert [(r.key, r.value) for r in read_all(lg)] == [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")]


def test_a_pass_that_stops_below_stamped_tombstones_still_notes_their_horizon(
    tmp_path: Path,
) -> None:
    """After a restart (first dirty offset 0, no horizon known) a pass whose map filled up
    below a tombstone stamped before the restart set the log's earliest horizon from what it
    read alone: the background cleaner no longer knew the tombstone could go, and kept it
    until enough new records came (found by a reviewer's probe)."""
    config = LogConfig(
        cleanup_policy=frozenset({"compact"}), delete_retention_ms=100, segment_bytes=2_000
    )
    lg = open_log(tmp_path / "c-0", config)
    _keyed(lg, [(b"k%02d" % i, b"v") for i in range(60)] + [(b"x", b"old"), (b"x", None)])
    lg.roll()
    lg.compact(now_ms=0)  # x's tombstone stamped: it may go at 100
    end = lg.log_end_offset
    lg.close()
    lg = Log.open(tmp_path / "c-0", config, recovery_point=end, clean_shutdown=True)
    lg.compact(now_ms=10, map_capacity=60)  # stops below the tombstone
    assert lg.first_dirty_offset == 61  # the tombstone's offset
    assert lg.delete_horizon_ms == 100
    assert lg.plan_cleaning(1_000, min_dirty_ratio=0.5) is not None
    lg.compact(now_ms=1_000)
    assert [r for r in read_all(lg) if r.key == b"x"] == []


@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.integers(1, 6),
)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_passes_with_a_small_key_map_end_where_one_unbounded_pass_does(
    tmp_path_factory: pytest.TempPathFactory, seed: int, capacity: int
) -> None:
    """Whatever the map's size, passes repeated until nothing is dirty leave each key's last
    record (tombstones past their horizon gone), and no deleted key's older value ever shows
    in between."""
    import random

    rng = random.Random(seed)
    print("seed", seed, "capacity", capacity)
    config = LogConfig(
        segment_bytes=400, cleanup_policy=frozenset({"compact"}), delete_retention_ms=5
    )
    # Keys longer than 16 bytes are mapped by their MD5.
    key_pool = [b"a", b"b", b"c", b"d", b"e", b"a long key, mapped by its MD5", b"b" * 17]
    appends = [
        [(rng.choice(key_pool), rng.choice([b"v%d" % i, None])) for _ in range(rng.randint(1, 3))]
        for i in range(50)
    ]  # fmt: skip
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    results = []
    for map_capacity in (capacity, log_module.DEFAULT_OFFSET_MAP_CAPACITY):
        lg = open_log(tmp_path_factory.mktemp("map") / "t-0", config)
        for records in appends:
            keys: list[bytes | None] = [k for k, _ in records]
            values = [v for _, v in records]
            info = lg.append_as_leader(batch(len(records), keys=keys, values=values), 0, 0)
            for i, (k, v) in enumerate(records):
                latest[k] = (info.first_offset + i, v)
        lg.roll()
        # Until every key was mapped once, then twice more past every tombstone's horizon.
        times = [*range(0, 10 * len(appends) * 3, 10), 10_000, 10_010]
        passes = 0
        for now in times:
            if now < 10_000 and lg.first_dirty_offset == lg.log_end_offset:
                continue
            passes += 1
            lg.compact(now_ms=now, map_capacity=map_capacity)
            last_seen = {r.key: (r.offset, r.value) for r in read_all(lg)}
            for key, (offset, value) in latest.items():
                # A key's last record in the log is its latest (or, deleted, it is gone).
                assert last_seen.get(key) in ((offset, value), *([None] if value is None else []))
        assert lg.first_dirty_offset == lg.log_end_offset, passes
        results.append([(r.offset, r.key, r.value) for r in read_all(lg)])
        lg.close()
    assert results[0] == results[1]
    assert results[0] == sorted((o, k, v) for k, (o, v) in latest.items() if v is not None)


def test_a_corrupt_batch_below_the_first_dirty_offset_fails_the_pass(tmp_path: Path) -> None:
    """The key map is built from the dirty part only, so the batches below it are read first
    when copied: a flipped byte there must fail the pass, not be copied into the cleaned
    segment (the map pass had checked every batch's CRC)."""
    lg = _compacted(tmp_path)
    _fill(lg, 30, 7)
    lg.roll()
    lg.compact(now_ms=0)
    clean_part = next(seg for seg in lg.segments if seg.size)
    assert lg.first_dirty_offset >= clean_part.next_offset
    _fill(lg, 30, 7, start=30)
    lg.roll()
    with open(clean_part.log_path, "r+b") as f:
        f.seek(fmt.HEADER_SIZE + 2)  # inside the first batch's records, under its CRC
        byte = f.read(1)
        f.seek(fmt.HEADER_SIZE + 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(LogCorruptError):
        lg.compact(now_ms=0)
    assert not list((tmp_path / "c-0").glob("*.cleaned"))


def test_a_cleaning_pass_pauses_through_every_scan_so_a_stop_ends_it(tmp_path: Path) -> None:
    """The cleaner thread learns of a stop only when it calls ``pause``: the scan of every
    planned batch header for the producers' last batches, and the batches a pass skips as
    already clean, called it never, and a stop waited for them (seconds on a large
    ``__consumer_offsets``, past the launcher's grace)."""
    lg = _compacted(tmp_path)
    _fill(lg, 300, 7)
    lg.roll()
    plan = lg.plan_cleaning(0, min_dirty_ratio=0.0)
    assert plan is not None
    calls: list[str] = []

    def pause() -> None:
        calls.append("pause")

    result = CleanResult(plan, [], CleanerStats(), end_offset=plan.segments[-1].next_offset)
    lg._last_batches_of_producers(plan, result, pause)
    batches = sum(1 for seg in plan.segments for _ in seg.scan_headers())
    assert len(calls) >= batches // 64

    class StopError(Exception):
        pass

    def stop() -> None:
        raise StopError

    with pytest.raises(StopError):
        lg._last_batches_of_producers(plan, result, stop)
    lg.close()


def _open_files(under: Path) -> int:
    """This process's open descriptors of files under ``under`` (others, a thread's socket or
    a log of another test, may come and go meanwhile)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if os.readlink(f"/proc/self/fd/{fd}").startswith(f"{under}/"):
                count += 1
    return count


def test_a_segment_keeps_one_file_open_its_indexes_none(tmp_path: Path) -> None:
    """Kafka closes an index's file once it is mapped: one open file per segment. Three per
    segment ran a node of a few thousand partitions out of open files (EMFILE is a log
    directory failure: the node halted, and could not start again)."""
    before = _open_files(tmp_path)
    assert before == 0
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=4096, index_interval_bytes=100))
    for i in range(200):
        lg.append_as_leader(batch(1, value=b"v" * 64 + str(i).encode()), 0, 0)
    segments = len(lg.segments)
    assert segments > 3
    # The closed segments: their log file each. The active one: its log file, and its two
    # indexes' mappings (Python's mmap holds a duplicate of the descriptor it maps).
    assert _open_files(tmp_path) - before <= segments + 2
    lg.close()
    assert _open_files(tmp_path) == before
    reopened = open_log(tmp_path / "t-0", LogConfig(segment_bytes=4096, index_interval_bytes=100))
    assert len(read_all(reopened)) == 200
    assert _open_files(tmp_path) - before <= segments + 2
    reopened.close()


def test_a_small_partitions_indexes_take_a_page_of_disk_each(tmp_path: Path) -> None:
    """The active segment's indexes are preallocated sparse (10 MiB each by default) and only
    the chunk written ahead of their entries is real disk: a page each, not 64 KiB each (1,000
    small partitions took 146 MB)."""
    lg = open_log(tmp_path / "t-0")
    for i in range(20):  # 100 KB: an entry in each index every 4 KiB of log
        lg.append_as_leader(batch(10, value=b"x" * 500, timestamp=1_000 + i), 0, 0)
    indexes = sorted((tmp_path / "t-0").glob("*index"))
    assert [p.suffix for p in indexes] == [".index", ".timeindex"]
    for index in indexes:
        assert index.stat().st_size > 10 * 1024 * 1024 - 12  # preallocated: segment.index.bytes
        assert 0 < index.stat().st_blocks * 512 <= 2 * 4096
    lg.close()


def test_a_log_whose_end_was_lost_below_its_start_starts_over_at_its_start(
    tmp_path: Path,
) -> None:
    """DeleteRecords moved the log start to 8, then a power loss cut the unflushed tail to 5
    records: the log start checkpoint (8) is above the log end found (5). The log starts over,
    empty, at 8 (Kafka's LogLoader deletes the segments), so its next append is offset 8;
    clamping the start down to 5 handed out offsets 5-7 a second time."""
    lg = open_log(tmp_path / "t-0", LogConfig())
    for _ in range(8):
        lg.append_as_leader(batch(1), 0, now_ms=0)
    assert lg.maybe_increment_log_start_offset(8)
    for seg in lg.segments:
        seg.close()
    path = tmp_path / "t-0" / "00000000000000000000.log"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 5 // 8])  # five batches of the same size
    report = RecoveryReport()
    again = Log.open(tmp_path / "t-0", LogConfig(), log_start_offset=8, report=report)
    assert (again.log_start_offset, again.log_end_offset) == (8, 8)
    assert report.segments_deleted == [0]
    assert [s.base_offset for s in again.segments] == [8]
    assert again.append_as_leader(batch(1), 1, now_ms=0).first_offset == 8
    for seg in again.segments:
        seg.close()


def test_an_emptied_segment_a_crash_left_between_two_others_is_deleted_on_opening(
    tmp_path: Path,
) -> None:
    """The cleaner's swap deletes a segment a pass emptied, after renaming it into place; a
    crash between the two left an empty segment between two others, which the cleaner passes
    over for good. Opening deletes it; the offsets around it read as before. (Segments of
    100 bytes: the pass cleans each alone, none merged with the next.)"""
    compact = LogConfig(cleanup_policy=frozenset({"compact"}), segment_bytes=100)
    path = tmp_path / "c-0"
    lg = open_log(path, compact)
    for key, value in ((b"x", b"1"), (b"a", b"1"), (b"a", b"2"), (b"d", b"1")):
        lg.append_as_leader(batch(1, key=key, value=value), 0, now_ms=0)
        if key != b"d":
            lg.roll()
    result = lg.clean(lg.plan_cleaning(0, min_dirty_ratio=0.0))  # type: ignore[arg-type]
    assert [[seg.base_offset for seg in group] for group, _ in result.cleaned] == [[0], [1], [2]]
    emptied = result.cleaned[1][1]
    assert emptied is not None and emptied.size == 0  # a=1, superseded by a=2
    # The swap of segment 1 alone, up to the crash before the emptied copy is deleted.
    emptied.rename_suffix(segment_module.CLEANED_SUFFIX, segment_module.SWAP_SUFFIX)
    lg.remove_files(result.plan.segments[1].retire())
    emptied.rename_suffix(segment_module.SWAP_SUFFIX, "")
    for _group, cleaned in (result.cleaned[0], result.cleaned[2]):
        if cleaned is not None:
            cleaned.delete()
    lg.close()
    emptied.close()
    reopened = open_log(path, compact)
    try:
        assert [s.base_offset for s in reopened.segments] == [0, 2, 3]
        assert [(r.offset, r.key) for r in read_all(reopened)] == [(0, b"x"), (2, b"a"), (3, b"d")]
    finally:
        reopened.close()


def _small_segments(path: Path, config: LogConfig, count: int) -> Log:
    """A compacted log of ``count`` closed segments, one keyed record each (keys k0, k1, ...,
    k0 again every fourth: the first of each pair is superseded), and an active one."""
    lg = open_log(path, config)
    for i in range(count):
        key = f"k{i % 4}".encode() if i % 4 == 0 else f"k{i}".encode()
        lg.append_as_leader(batch(1, key=key, value=f"v{i}".encode(), timestamp=1_000 + i), 0, 0)
        lg.roll()
    lg.append_as_leader(batch(1, key=b"tail", value=b"t", timestamp=2_000), 0, now_ms=0)
    return lg


def test_a_pass_merges_small_cleaned_segments_up_to_segment_bytes(tmp_path: Path) -> None:
    """Kafka's Cleaner.groupSegmentsBySize: consecutive segments are cleaned into one copy
    while they fit segment.bytes together. Cleaned one for one, a compacted log whose keys
    seldom change kept one small file per roll for ever. (review helper-204)"""
    config = LogConfig(cleanup_policy=frozenset({"compact"}))
    lg = _small_segments(tmp_path / "c-0", config, 12)
    before = [(r.offset, r.key, r.value, r.timestamp) for r in read_all(lg)]
    assert len(lg.segments) == 13
    stats = lg.compact(now_ms=0)
    assert stats is not None and stats.segments_cleaned == 12
    assert [s.base_offset for s in lg.segments] == [0, 12]  # one copy, then the active one
    kept = [(r.offset, r.key, r.value, r.timestamp) for r in read_all(lg)]
    # k0 is written at 0, 4 and 8: only its last value stays; nothing else moves.
    assert kept == [r for r in before if r[1] != b"k0" or r[0] == 8]
    for offset, _key, _value, timestamp in kept:
        assert lg.offset_for_timestamp(timestamp) == (offset, timestamp)
        assert fmt.decode_records(lg.read(offset, 1 << 20).records)[0].offset == offset
    lg.close()
    reopened = open_log(tmp_path / "c-0", config)
    assert [s.base_offset for s in reopened.segments] == [0, 12]
    assert [(r.offset, r.key, r.value, r.timestamp) for r in read_all(reopened)] == kept
    reopened.close()


def test_merged_segments_stay_within_segment_bytes(tmp_path: Path) -> None:
    one = len(batch(1, key=b"k1", value=b"v1"))
    config = LogConfig(cleanup_policy=frozenset({"compact"}), segment_bytes=3 * one + 10)
    lg = _small_segments(tmp_path / "c-0", config, 7)
    lg.compact(now_ms=0)
    assert [s.base_offset for s in lg.segments] == [0, 3, 6, 7]
    assert all(s.size <= config.segment_bytes for s in lg.segments)


def test_a_merging_swap_interrupted_by_a_crash_is_completed_on_opening(tmp_path: Path) -> None:
    """A crash after the merged copy became a .swap and its group's first segment was gone,
    the others still there: opening swaps the copy in and deletes the rest of its range
    (LogLoader.completeSwapOperations), or their records were there twice."""
    config = LogConfig(cleanup_policy=frozenset({"compact"}))
    path = tmp_path / "c-0"
    lg = _small_segments(path, config, 6)
    result = lg.clean(lg.plan_cleaning(0, min_dirty_ratio=0.0))  # type: ignore[arg-type]
    ((group, merged),) = result.cleaned
    assert merged is not None and len(group) == 6
    expected = [(1, b"k1"), (2, b"k2"), (3, b"k3"), (4, b"k0"), (5, b"k5")]  # k0 at 0 went
    merged.rename_suffix(segment_module.CLEANED_SUFFIX, segment_module.SWAP_SUFFIX)
    lg.remove_files(group[0].retire())  # the crash: the five others are still in place
    lg.close()
    merged.close()
    reopened = open_log(path, config)
    try:
        assert [s.base_offset for s in reopened.segments] == [0, 6]
        assert [(r.offset, r.key) for r in read_all(reopened)] == [*expected, (6, b"tail")]
    finally:
        reopened.close()


def test_a_leaders_batch_past_an_empty_segments_offset_reach_rolls_it(tmp_path: Path) -> None:
    """The leader's append checked the relative-offset reach only of a segment holding
    something. Truncated into a first segment the cleaner had emptied, the active segment's
    next offset was 2^31 - 110 past its base: 200 records went in at relative offsets the
    index cannot hold, and opening the log again cut them off (KAFKA-6264, as the follower's
    check above). (review helper-216)"""
    config = LogConfig(cleanup_policy=frozenset({"compact"}))
    path = tmp_path / "c-0"
    lg = open_log(path, config)
    reach = 2**31

    def follow(base: int, key: bytes) -> None:
        lg.append_as_follower(fmt.build_batch([fmt.Record(base, 1_000, key, b"v")]), 1_000)

    follow(0, b"a")
    follow(reach - 100, b"a")
    lg.roll()
    follow(reach - 99, b"a")
    follow(reach + 10, b"a")
    lg.roll()
    follow(reach + 11, b"a")
    lg.compact(10**12)
    assert lg.segments[0].size == 0
    lg.truncate_to(reach - 110)
    appended = lg.append_as_leader(batch(200, key=b"b"), leader_epoch=1, now_ms=0)
    assert appended.last_offset == reach - 110 + 199
    expected = [(r.offset, r.key) for r in read_all(lg)]
    lg.close()
    reopened = open_log(path, config)
    try:
        assert [(r.offset, r.key) for r in read_all(reopened)] == expected
        assert reopened.log_end_offset == reach - 110 + 200
    finally:
        reopened.close()


def test_a_batch_past_an_empty_segments_offset_reach_rolls_it(tmp_path: Path) -> None:
    """A follower's empty active segment took a batch 2^31 offsets past its base (its leader
    compacted everything below): the roll check returned before the relative-offset one, the
    batch went in at an offset the index cannot hold, and opening the log again cut it off
    (Kafka's KAFKA-6264: LogSegment.shouldRoll checks canConvertToRelativeOffset even when
    the segment is empty). (review helper-209)"""
    far = 2**31 + 10
    for rolled_first in (False, True):
        path = tmp_path / f"t-{int(rolled_first)}"
        lg = open_log(path, LogConfig())
        if rolled_first:
            lg.append_as_follower(fmt.build_batch([fmt.Record(0, 1_000, b"a", b"0")]), 1_000)
            lg.roll()
        lg.append_as_follower(fmt.build_batch([fmt.Record(far, 1_000, b"k", b"v")]), 1_000)
        lg.append_as_follower(fmt.build_batch([fmt.Record(far + 1, 1_000, b"k2", b"v2")]), 1_000)
        expected = [(r.offset, r.key) for r in read_all(lg)]
        assert expected[-2:] == [(far, b"k"), (far + 1, b"k2")]
        assert lg.active_segment.base_offset == far
        lg.close()
        reopened = open_log(path, LogConfig())
        assert [(r.offset, r.key) for r in read_all(reopened)] == expected
        assert reopened.log_end_offset == far + 2
        reopened.close()


def test_moving_the_log_start_writes_no_epoch_checkpoint_and_a_reopen_trims_the_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each move of the log start rewrote the leader-epoch checkpoint (two fsyncs): a
    DeleteRecords naming thousands of partitions held the loop seconds (found by a review).
    Kafka's truncateFromStartAsyncFlush leaves it to a later flush: opening the log trims the
    epochs below its log start, so one written before the move is still right."""
    lg = open_log(tmp_path / "t-0", LogConfig())
    for epoch in (0, 1, 2):
        for _ in range(4):
            lg.append_as_leader(batch(1), epoch, now_ms=0)
    lg.flush()
    written: list[Path] = []
    write = checkpoint.write_leader_epochs

    def counted(path: Path, entries: Any) -> None:
        written.append(path)
        write(path, entries)

    monkeypatch.setattr("kcoord.storage.epoch.write_leader_epochs", counted)
    assert lg.maybe_increment_log_start_offset(6)
    assert lg.epoch_cache.entries == [(1, 6), (2, 8)]
    assert written == []
    for seg in lg.segments:  # a crash: nothing more written
        seg.close()
    again = Log.open(tmp_path / "t-0", LogConfig(), log_start_offset=6)
    assert again.epoch_cache.entries == [(1, 6), (2, 8)]
    again.close()


def test_truncation_into_a_gap_compaction_left_inside_a_segment_ends_at_the_offset(
    tmp_path: Path,
) -> None:
    """Compaction removed offsets 0 and 1 (their keys written again later) from the segment
    that then begins with the batch at 2. Truncated to 1 (a follower after an unclean
    election), the log ended at the segment's base, 0, and the leader-epoch entry of the
    records kept below 1 went with it. Kafka's LocalLog.truncateTo sets the log end to the
    offset asked for."""
    config = LogConfig(cleanup_policy=frozenset({"compact"}))
    lg = open_log(tmp_path / "c-0", config)
    for key in (b"a", b"b", b"c", b"d"):
        lg.append_as_leader(batch(1, key=key, value=b"v"), leader_epoch=3, now_ms=0)
    lg.roll()
    for key in (b"a", b"b"):
        lg.append_as_leader(batch(1, key=key, value=b"w"), leader_epoch=3, now_ms=0)
    lg.roll()
    lg.append_as_leader(batch(1, key=b"e", value=b"v"), leader_epoch=3, now_ms=0)
    lg.compact(now_ms=0, high_watermark=lg.log_end_offset)
    assert [b.header.base_offset for b in lg.segments[0].scan_headers()] == [2, 3, 4, 5]
    assert lg.truncate_to(1) == 1 and lg.log_end_offset == 1
    assert lg.epoch_cache.entries == [(3, 0)]
    assert lg.append_as_leader(batch(1), leader_epoch=4, now_ms=0).first_offset == 1


def test_a_leftover_cleaned_copy_is_not_written_after(tmp_path: Path) -> None:
    """A ``.cleaned`` file left in the partition's directory (an unlink that failed) was
    opened without truncation and the new copy written after its bytes; once swapped in, the
    next load cut the segment at the stale bytes and the records after them were lost.
    Kafka's createNewCleanedSegment deletes a leftover first."""
    config = LogConfig(cleanup_policy=frozenset({"compact"}))
    lg = open_log(tmp_path / "c-0", config)
    for i in range(6):
        lg.append_as_leader(batch(1, key=b"k%d" % (i % 3), value=b"v"), leader_epoch=0, now_ms=0)
    lg.roll()
    lg.append_as_leader(batch(1, key=b"z", value=b"v"), leader_epoch=0, now_ms=0)
    stale = lg.segments[0].log_path.with_name(lg.segments[0].log_path.name + ".cleaned")
    stale.write_bytes(lg.segments[0].log_path.read_bytes())
    lg.compact(now_ms=0, high_watermark=lg.log_end_offset)
    lg.close()
    again = open_log(tmp_path / "c-0", config)
    kept = [b.header.base_offset for seg in again.segments for b in seg.scan_headers()]
    assert kept == [3, 4, 5, 6]
