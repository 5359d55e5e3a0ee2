"""The log of one partition: a directory of segments, Kafka's ``UnifiedLog``/``LocalLog``.

Directory ``<topic>-<partition>/`` holds segments (see ``segment``), ``leader-epoch-checkpoint``
and ``partition.metadata`` (see ``checkpoint``). The last segment is the active one; only it is
appended to. Offsets:

- ``log_start_offset``: the first offset a reader may ask for; moves up with retention.
- ``log_end_offset`` (LEO): the offset the next appended record gets.
- the high watermark is kept by the caller (replication), and passed to ``read`` as
  ``max_offset`` and to retention/compaction, which never act at or above it.
- ``recovery_point``: every batch below it has been fsynced; recovery after a crash starts at
  the segment holding it.

Appends are whole batches. As leader (``append_as_leader``) the log assigns offsets from the
LEO and stamps the leader epoch, leaving what is under the CRC as the producer sent it but the
max timestamp, which it gives the batch from its records, as Kafka's LogValidator does (and the
LogAppendTime stamp); as follower (``append_as_follower``) it keeps the leader's bytes. A
segment rolls at ``segment.bytes``, after ``segment.ms``, when an index is full, or when an
offset would not fit in the index's 32-bit relative offsets.

Opening (``Log.open``) finishes or discards interrupted compaction swaps, then either loads the
segments (after a clean shutdown) or recovers every segment from the recovery point on: CRCs are
checked, indexes rebuilt, a torn or corrupt tail truncated and every later segment deleted, and
what was dropped is logged. A segment found corrupt below the recovery point (or after a clean
shutdown), which was flushed, is cut at its first bad batch alone: the segments after it stay,
and the records lost leave a gap in the offsets, as Kafka's ``LogLoader`` does. A base offset,
outside the CRC, that goes back or past the segment's range marks a batch corrupt. A flipped
byte in a closed segment that no load looks at is found on read (every served batch is
CRC-checked) and is never served.

The leader-epoch checkpoint is written when the recovery point moves (a roll, a flush, a
close) and by truncations, not at each append that starts an epoch as Kafka's
``LeaderEpochFileCache.assign`` does: recovery assigns the epoch of every batch above the
recovery point again, so only the epochs of records below it must be on disk, and a failover
that made a node leader of many partitions would otherwise fsync one file per partition on the
event loop as their first appends came in.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import re
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, NamedTuple

from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch as _CRecordBatch

from kcoord.storage import checkpoint, producer_snapshot
from kcoord.storage import format as fmt
from kcoord.storage.config import LONG_MAX, LogConfig
from kcoord.storage.epoch import LeaderEpochCache
from kcoord.storage.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, ProducerStateManager
from kcoord.storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogCorruptError,
    LogSegment,
    RecoveryResult,
    is_offset_name,
)

log = logging.getLogger(__name__)

# compression.type's codecs (Kafka's BrokerCompressionType); "producer" keeps the batch's own.
_CODECS: Final = {
    "uncompressed": fmt.Compression.NONE,
    "gzip": fmt.Compression.GZIP,
    "snappy": fmt.Compression.SNAPPY,
    "lz4": fmt.Compression.LZ4,
    "zstd": fmt.Compression.ZSTD,
}


class OffsetOutOfRangeError(Exception):
    """A read below the log start or above the log end (OFFSET_OUT_OF_RANGE)."""


class RecordTooLargeError(Exception):
    """A batch above ``max.message.bytes`` (MESSAGE_TOO_LARGE)."""


class RecordListTooLargeError(Exception):
    """Produced batches larger than a whole segment (RECORD_LIST_TOO_LARGE)."""


class InvalidRecordError(fmt.RecordFormatError):
    """A batch the log refuses: keyless record in a compacted topic, no records (INVALID_RECORD).
    ``record_errors``: (index of the record in its batch, message) per refused record, when
    the refusal is of records rather than of the batch."""

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.record_errors = list(record_errors)


class InvalidTimestampError(Exception):
    """Records whose timestamps the topic refuses (INVALID_TIMESTAMP; Kafka's
    ``RecordValidationException`` around an ``InvalidTimestampException``).
    ``record_errors`` holds (index of the record in its batch, message) per refused record,
    as the produce response's ``record_errors`` carries them."""

    def __init__(self, record_errors: list[tuple[int, str]]) -> None:
        super().__init__("One or more records have been rejected due to invalid timestamp")
        self.record_errors = record_errors


def _log_append_time_from_producer(record_count: int) -> InvalidTimestampError:
    message = (
        "Invalid timestamp type in message. Producer should not set timestamp type to "
        "LogAppendTime."
    )
    return InvalidTimestampError([(i, message) for i in range(record_count)])


class _InnerOffsetsNotConsecutiveError(ValueError):
    """A compressed batch from a producer whose records' offsets are not 0, 1, 2, ...: the
    append rebuilds it (``_renumbered``)."""


class UnexpectedAppendOffsetError(Exception):
    """A follower append that does not continue the log."""


class AppendInfo(NamedTuple):
    """Where an append went (a tuple: one is built per produce request)."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    batch_count: int
    size_bytes: int
    # The leader's stamp on a LogAppendTime topic; -1 (NO_TIMESTAMP) with CreateTime.
    log_append_time_ms: int = fmt.NO_TIMESTAMP


@dataclass(frozen=True, slots=True)
class LeaderScan:
    """What reading a produced batch's records found, before its append
    (``Log.scan_for_leader``): its records' max timestamp, whether every record has a key
    (checked if the topic was compacted when it was read) or the error reading them raised,
    which ``append_as_leader`` raises where it would have read them. The node reads a batch
    whose records are costly to read this way off its event loop (Kafka validates produced
    batches on its request handler threads), then appends it on the loop with this. On a
    topic whose ``compression.type`` is not the producer's, ``records`` are the batch
    rebuilt in that codec (``compression``), which the append takes in place of ``sent``."""

    records: bytes
    max_timestamp: int
    keys_checked: bool
    error: Exception | None = None  # reading the records
    key_error: Exception | None = None  # checking their keys (a compacted topic)
    sent: bytes | None = None  # the producer's batch, when ``records`` are it recompressed
    compression: str = "producer"  # the topic's compression.type they were made for


@dataclass(frozen=True, slots=True)
class FetchData:
    records: bytes
    first_batch_offset: int | None

    @property
    def empty(self) -> bool:
        return not self.records


@dataclass(slots=True)
class CleanerStats:
    segments_cleaned: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0


def _no_pause() -> None:
    pass


# The cleaner's header-only scan pauses (hands the GIL over, or aborts) every this many batch
# headers: once per header would double its cost, never would hold a stop for seconds.
_HEADERS_PER_PAUSE = 64


# The cleaner's key map is bounded as Kafka's is (LogCleaner's SkimpyOffsetMap): the memory of
# log.cleaner.dedupe.buffer.size (for its one cleaner thread, at most 2^31 - 1 bytes) counted in
# slots of 24 bytes (a key's MD5 and an offset), filled to log.cleaner.io.buffer.load.factor.
# kcoord's map is a dict of keys (their MD5 when longer, ``_map_key``) to offsets: an entry
# takes about 130-150 bytes instead of 24 (so about 700 MB at the default), but a pass maps as
# many keys as a Kafka broker configured alike.
DEFAULT_DEDUPE_BUFFER_BYTES: Final = 128 * 1024 * 1024
OFFSET_MAP_SLOT_BYTES: Final = 24
OFFSET_MAP_LOAD_FACTOR: Final = 0.9
_INT32_MAX: Final = 2**31 - 1


def offset_map_capacity(dedupe_buffer_bytes: int) -> int:
    """How many keys the cleaner maps in one pass with this ``log.cleaner.dedupe.buffer.size``
    (Kafka's ``maxDesiredMapSize``; at least one)."""
    slots = min(dedupe_buffer_bytes, _INT32_MAX) // OFFSET_MAP_SLOT_BYTES
    return max(1, int(slots * OFFSET_MAP_LOAD_FACTOR))


DEFAULT_OFFSET_MAP_CAPACITY: Final = offset_map_capacity(DEFAULT_DEDUPE_BUFFER_BYTES)


def remove_now(paths: Sequence[Path]) -> None:
    """Remove files and directories at once (the default remover; see ``Log.remove_files``).
    What cannot be removed is logged and left (a delete directory is removed again at the
    next start); it was left without a word, and delete directories could pile up."""
    for path in paths:
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove %s: %s", path, e)


@dataclass(slots=True)
class CleanPlan:
    """A cleaning pass as planned on the log's owner thread (``Log.plan_cleaning``)."""

    segments: list[LogSegment]  # closed, below the high watermark and the compaction lag
    generation: int
    now_ms: int
    dirty_ratio: float
    first_dirty_offset: int  # the log's when planned: the keys mapped start there
    # producer.id.expiration.ms: a producer whose last batch is older is no longer kept.
    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS


@dataclass(slots=True)
class RolledFlush:
    """The fsyncs a roll leaves for a worker thread: Kafka's ``UnifiedLog.roll`` schedules
    them ("flush-log") rather than keep the appending thread waiting; a segment full of dirty
    pages took ~50 ms a 100 MiB to fsync here, and the event loop of every partition of a node
    would wait with it. ``run`` on any thread, then ``Log.rolled_flush_done`` on the log's."""

    offset: int  # the rolled segment's end: the recovery point once done
    truncations: int  # the log's at the roll; after a truncation its end counts no more
    fds: list[int]  # the rolled segment's files (and the directory): run closes them
    done: bool = False

    def run(self) -> None:
        try:
            for fd in self.fds:
                os.fsync(fd)
            self.done = True
        finally:
            self.discard()

    def discard(self) -> None:
        """Close the descriptors (``run`` does, whatever happens)."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []


@dataclass(slots=True)
class CleanResult:
    """What ``Log.clean`` wrote: the planned segments it cleaned, in groups of consecutive
    ones (``_groups_for_cleaning``), each with the copy that replaces the whole group, None
    if the group is one segment and nothing in it changed."""

    plan: CleanPlan
    cleaned: list[tuple[list[LogSegment], LogSegment | None]]
    stats: CleanerStats
    # Where the pass ended: below it every key's earlier records went; the log's first dirty
    # offset once swapped in. The planned segments' end, or less when the key map filled up.
    end_offset: int = 0
    delete_horizon_ms: int | None = None  # the earliest horizon of a tombstone kept
    last_tombstone_dropped: int = -1  # the offset of the last tombstone it dropped

    def note_horizon(self, horizon_ms: int) -> None:
        if self.delete_horizon_ms is None or horizon_ms < self.delete_horizon_ms:
            self.delete_horizon_ms = horizon_ms


@dataclass(slots=True)
class RecoveryReport:
    segments_recovered: int = 0
    bytes_truncated: int = 0
    segments_deleted: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# Kafka's legal topic names (``Topic.validate``); storage may not import the controller's.
_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """``orders-3`` -> ("orders", 3); None for names that are not partition directories: a
    topic no Kafka cluster can name (a name that is not UTF-8 reached the checkpoints, whose
    writes then failed for every partition) or a partition number not as it is written
    (``orders-03`` was a second directory of partition 3, and one of the two was never
    served; Kafka's ``LogManager`` refuses such a pair, and kcoord never writes it)."""
    topic, sep, partition = name.rpartition("-")
    if not sep or not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        return None
    if not (partition.isascii() and partition.isdigit()) or str(int(partition)) != partition:
        return None
    return topic, int(partition)


class Log:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        epoch_cache: LeaderEpochCache,
        topic_id: str | None,
    ) -> None:
        assert segments, "a log always has an active segment"
        self.directory = directory
        self.config = config
        self.segments = segments
        self._bases = [s.base_offset for s in segments]
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.epoch_cache = epoch_cache
        self.topic_id = topic_id
        self._unflushed_messages = 0
        self._last_flush_ms: int | None = None
        # Bumped on every truncation, with the offset below which the records stayed: readers
        # that keep state derived from the log (the coordinator's hot standby) see whether it
        # still holds.
        self.truncations = 0
        self.last_truncated_to = 0
        # The cleaner's view. Below first_dirty_offset the log was cleaned (the LogManager
        # keeps it in cleaner-offset-checkpoint, see restore_first_dirty_offset);
        # delete_horizon_ms is the earliest time a tombstone the last pass kept may go (None:
        # it kept none; in memory only, as Kafka's latestDeleteHorizon). Every change to the
        # closed segments other than an append bumps _generation, so a cleaning planned before
        # it is abandoned.
        self.first_dirty_offset = 0
        self.delete_horizon_ms: int | None = None
        self._generation = 0
        # Swaps that dropped a tombstone, and the highest offset each of the last ones dropped:
        # a reader replaying the log record by record (a coordinator's hot standby) that read
        # a key's value and not yet its tombstone would never learn the key went.
        self.tombstone_drops = 0
        self.tombstones_dropped_up_to: deque[int] = deque(maxlen=TOMBSTONE_DROPS_KEPT)
        # Removes files of segments this log let go (retired as .deleted); the LogManager
        # hands them to its own remover, which a node runs off the event loop.
        self.remove_files: Callable[[Sequence[Path]], None] = remove_now
        # Told the base offset of each new segment once it is the active one (the batches
        # below it are all in the closed ones): the node's producer state takes a snapshot
        # there, as Kafka's UnifiedLog.roll does. Must not raise: a roll is part of an append.
        self.roll_listener: Callable[[int], None] | None = None
        # Takes the fsyncs of each roll to run off the appending thread (a node's event loop);
        # None: the roll makes them itself.
        self.flush_rolled: Callable[[Log, RolledFlush], None] | None = None
        # Told the recovery point a truncation lowered it to (the LogManager checkpoints it).
        self.truncated: Callable[[int], None] | None = None
        # The rolls handed to it, in roll order (see ``rolled_flush_done``).
        self._pending_rolls: deque[RolledFlush] = deque()
        self._closed = False

    # -----------------------------------------------------------------------------------------
    # Opening and recovery.

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        clean_shutdown: bool = False,
        topic_id: str | None = None,
        report: RecoveryReport | None = None,
    ) -> Log:
        """Open (and recover) the log in ``directory``. If that fails, the segments it opened
        are closed again: a partition that goes offline holds no file descriptors."""
        opened: list[LogSegment] = []
        try:
            return cls._open(
                directory,
                config,
                opened,
                recovery_point=recovery_point,
                log_start_offset=log_start_offset,
                clean_shutdown=clean_shutdown,
                topic_id=topic_id,
                report=report if report is not None else RecoveryReport(),
            )
        except BaseException:
            for seg in opened:
                seg.close()
            raise

    @classmethod
    def _open(
        cls,
        directory: Path,
        config: LogConfig,
        opened: list[LogSegment],
        *,
        recovery_point: int,
        log_start_offset: int,
        clean_shutdown: bool,
        topic_id: str | None,
        report: RecoveryReport,
    ) -> Log:
        directory.mkdir(parents=True, exist_ok=True)
        _finish_interrupted_swaps(directory)
        bases = _segment_bases(directory)
        segments: list[LogSegment] = []
        corrupt_at: int | None = None
        # Where the recovered segments' leader epochs start: their batches may have been
        # written without the epoch checkpoint that names them (a crash between the two).
        recovered_epochs: list[tuple[int, int]] = []
        for i, base in enumerate(bases):
            if corrupt_at is not None:
                _delete_segment_files(directory, base)
                report.segments_deleted.append(base)
                continue
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            # Both indexes, or recovery rebuilds them (Kafka recovers a segment whose index
            # files are missing, too).
            had_index = all(
                (directory / f"{base:020d}{suffix}").exists()
                for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
            )
            seg = LogSegment(
                directory,
                base,
                index_interval_bytes=config.index_interval_bytes,
                index_max_bytes=config.segment_index_bytes,
            )
            opened.append(seg)
            below_recovery_point = next_base is not None and next_base <= recovery_point
            seg_epochs: tuple[tuple[int, int], ...] = ()
            limit = seg.offset_limit(next_base)
            if (clean_shutdown or below_recovery_point) and (had_index or seg.size == 0):
                try:
                    seg.load(limit)
                except LogCorruptError as e:
                    # Flushed before the crash (or at a clean shutdown), so corrupted since: that
                    # segment alone is cut at its first bad batch, and the segments after it,
                    # flushed and acknowledged too, stay (Kafka's LogLoader.loadSegmentFiles
                    # recovers such a segment alone; only recoverLog, above the recovery point,
                    # deletes what follows a truncation). Its lost offsets are a gap, as
                    # compaction leaves.
                    log.warning("%s: recovering segment %d: %s", directory, base, e)
                    seg_epochs = _recover_segment(seg, limit, report).epochs
            else:
                result = _recover_segment(seg, limit, report)
                seg_epochs = result.epochs
                if result.truncated_bytes and not (clean_shutdown or below_recovery_point):
                    corrupt_at = base  # unflushed: what follows was written after it
            if segments and segments[-1].next_offset > seg.base_offset:
                # Overlapping segments: keep the earlier, drop this and the rest (as corrupt).
                log.warning("%s: segment %d overlaps its predecessor; dropping it", directory, base)
                seg.delete()
                report.segments_deleted.append(base)
                corrupt_at = base
                continue
            segments.append(seg)
            recovered_epochs += seg_epochs
        if report.segments_deleted:
            log.warning(
                "%s: deleted segments after corruption: %s", directory, report.segments_deleted
            )
        # An empty segment between two others holds nothing but a gap, as the cleaner's swap
        # leaves when it deletes one a pass emptied: one left by a crash between the two
        # would stay for good (the cleaner passes over segments without batches).
        emptied = [seg for seg in segments[1:-1] if seg.size == 0]
        for seg in emptied:
            log.info("%s: deleting the empty segment %d", directory, seg.base_offset)
            seg.delete()
            segments.remove(seg)
        if not segments:
            segments.append(_new_segment(directory, config, log_start_offset))
            opened.append(segments[-1])
        for seg in segments[:-1]:
            seg.offset_index.trim()  # recovery preallocated them; closed segments are trimmed
            seg.time_index.trim()
        if report.segments_recovered:
            # What recovery kept is now fsynced: recovery can start at the end next time.
            for seg in segments:
                seg.flush()
            recovery_point = segments[-1].next_offset
        log_start_offset = max(log_start_offset, segments[0].base_offset)
        log_end_offset = segments[-1].next_offset
        wiped = log_start_offset > log_end_offset
        if wiped:
            # Segment files lost (a power loss took the tail after DeleteRecords or retention
            # moved the start past it): the log starts over, empty, at its start, so no offset
            # below it is handed out again (Kafka's LogLoader, the segments deleted when the
            # log end is below the log start checkpoint). Clamping the start down reused them.
            log.warning(
                "%s: deleting every segment: the log end %d is below the log start %d (segment "
                "files were lost); the log starts over, empty, at %d",
                directory,
                log_end_offset,
                log_start_offset,
                log_start_offset,
            )
            for seg in segments:
                seg.delete()
                report.segments_deleted.append(seg.base_offset)
            segments[:] = [_new_segment(directory, config, log_start_offset)]
            opened.append(segments[-1])
            log_end_offset = recovery_point = log_start_offset
        epoch_path = directory / checkpoint.LEADER_EPOCH_CHECKPOINT
        try:
            epoch_cache = LeaderEpochCache.load(epoch_path)
        except (checkpoint.CheckpointError, OSError) as e:
            log.warning("%s: rebuilding leader epochs from the log: %s", directory, e)
            epoch_cache = LeaderEpochCache(epoch_path)
            for seg in segments:
                for bp in seg.scan_headers():
                    epoch_cache.assign(bp.header.partition_leader_epoch, bp.header.base_offset)
        # Kafka's LogSegment.recover assigns each recovered batch's epoch above the latest one
        # (``assign`` ignores the others); only segments kept give theirs.
        for epoch, start_offset in recovered_epochs:
            epoch_cache.assign(epoch, start_offset)
        if wiped:
            epoch_cache.clear()  # LeaderEpochFileCache.clearAndFlush
        epoch_cache.truncate_from_end(log_end_offset)
        epoch_cache.truncate_from_start(log_start_offset)
        epoch_cache.flush()
        # Recovery may have cut the tail a snapshot was taken at (a crash before its flush).
        producer_snapshot.delete_above(directory, log_end_offset)
        meta_path = directory / checkpoint.PARTITION_METADATA
        # Absent, the log is a stray of no topic (isStrayKraftReplica: written before any
        # append). Unreadable, it raises (the partition is offline: Kafka's
        # PartitionMetadataFile.read fails the log directory): taken for absent, the node
        # deleted the log of a live topic as a stray at its next start.
        stored_id = checkpoint.read_partition_metadata(meta_path)
        if topic_id is not None and stored_id != topic_id:
            checkpoint.write_partition_metadata(meta_path, topic_id)
        elif topic_id is None:
            topic_id = stored_id
        return cls(
            directory,
            config,
            segments,
            log_start_offset=log_start_offset,
            recovery_point=min(recovery_point, log_end_offset),
            epoch_cache=epoch_cache,
            topic_id=topic_id,
        )

    # -----------------------------------------------------------------------------------------
    # Offsets.

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -----------------------------------------------------------------------------------------
    # Appending.

    def append_as_leader(
        self, records: bytes, leader_epoch: int, now_ms: int, scan: LeaderScan | None = None
    ) -> AppendInfo:
        """Validate produced batches, assign offsets from the LEO, stamp ``leader_epoch``.
        With the ``scan`` of these very ``records`` (``scan_for_leader``), their records are
        not read again."""
        try:
            info = self._append_as_leader(records, leader_epoch, now_ms, scan, dry_run=False)
        except _InnerOffsetsNotConsecutiveError:
            renumbered = self._renumbered(records)
            info = self._append_as_leader(renumbered, leader_epoch, now_ms, None, dry_run=False)
        assert info is not None
        return info

    def check_for_leader(self, records: bytes, now_ms: int, scan: LeaderScan | None = None) -> None:
        """Raise what ``append_as_leader`` would for ``records``, and append nothing. Kafka's
        ``UnifiedLog.append`` validates a produced batch (``analyzeAndValidateRecords``,
        ``LogValidator``) before it looks at its producer's state
        (``analyzeAndValidateProducerState``): a batch that does not hold up is refused for
        that, not answered as a duplicate or out of order."""
        try:
            self._append_as_leader(records, -1, now_ms, scan, dry_run=True)
        except _InnerOffsetsNotConsecutiveError:
            self._append_as_leader(self._renumbered(records), -1, now_ms, None, dry_run=True)

    def _renumbered(self, records: bytes) -> bytes:
        """``records`` with each compressed batch rebuilt with its records at offsets 0, 1,
        2, ...: Kafka's ``LogValidator`` rebuilds such a batch rather than refuse it ("some
        older clients do not implement the internal offsets correctly"), and a consumer reads
        each record's offset from within the batch."""
        out: list[bytes] = []
        for pos, header in fmt.iter_headers(records):
            if header.compression is fmt.Compression.NONE or header.is_control:
                out.append(records[pos : pos + header.size])
                continue
            decoded = fmt.decode_records(records, pos)
            out.append(fmt.rebuild_batch(header, _consecutive(header.base_offset, decoded)))
        return b"".join(out)

    def _append_as_leader(
        self,
        records: bytes,
        leader_epoch: int,
        now_ms: int,
        scan: LeaderScan | None,
        *,
        dry_run: bool,
    ) -> AppendInfo | None:
        """The append, or with ``dry_run`` its checks alone (None, nothing written)."""
        _raise_if_not_a_batch(records)
        compression = self.config.compression_type
        if compression != "producer":
            if scan is not None and scan.sent is records and scan.compression == compression:
                if scan.records is not records:
                    # As _recompressed checks the batch as sent (the limit lowered since).
                    self._raise_if_too_large(len(records))
                records = scan.records  # rebuilt off the loop
            else:
                records = self._recompressed(records, _CODECS[compression])
        (
            sent_base_offset,
            batch_length,
            _,
            magic,
            crc,
            attributes,
            last_offset_delta,
            _,
            max_timestamp,
            _,
            _,
            _,
            record_count,
        ) = fmt.HEADER.unpack_from(records)
        size = batch_length + fmt.LOG_OVERHEAD
        if size == len(records) and magic == fmt.MAGIC_V2 and last_offset_delta >= 0:
            # One batch, the usual produce request: the checks of _validate_batch inline (this
            # is the hot path), then the batch goes out as sent behind a rewritten 16-byte
            # prefix: base offset and leader epoch, both outside the CRC (on a LogAppendTime
            # topic the leader's stamp is also written, and a max timestamp that is not its
            # records' is corrected, both from a copy: see below).
            self._raise_if_too_large(size)
            if sent_base_offset:
                raise _base_offset_not_zero(self.directory.name, sent_base_offset)
            view = memoryview(records)
            if fmt.crc32c(view[fmt.ATTRIBUTES_OFFSET :]) != crc:
                raise fmt.CorruptRecordError("CRC mismatch in batch at position 0")
            is_control = attributes & fmt.CONTROL_FLAG
            if record_count <= 0 and not is_control:
                raise InvalidRecordError("batch at position 0 has no records")
            if record_count != last_offset_delta + 1:
                _raise_if_count_disagrees(record_count, last_offset_delta, 0)
            if record_count * _MIN_RECORD_BYTES > size - fmt.HEADER_SIZE:
                _raise_if_body_too_small(fmt.parse_header(records, 0), 0)
            log_append_time = fmt.NO_TIMESTAMP
            if not is_control:  # as _validate_batch and _validate_timestamps
                if scan is not None and scan.records is records:
                    if self.config.compact:
                        if not scan.keys_checked:
                            self._raise_if_null_key(records)  # compacted since it was read
                        elif scan.key_error is not None:
                            raise scan.key_error
                    if scan.error is not None:
                        raise scan.error
                    records_max = scan.max_timestamp
                else:
                    if self.config.compact:
                        self._raise_if_null_key(records)
                    records_max = _records_max_timestamp(records, 0, size, attributes, record_count)
                if attributes & fmt.TIMESTAMP_TYPE_MASK:
                    raise _log_append_time_from_producer(record_count)
                if self.config.log_append_time:
                    # Stamped under the CRC: this batch is written from a copy.
                    stamped = bytearray(records)
                    fmt.set_log_append_time(stamped, 0, now_ms)
                    view = memoryview(stamped)
                    max_timestamp = log_append_time = now_ms
                else:
                    if records_max > now_ms + self.config.message_timestamp_after_max_ms or (
                        self.config.message_timestamp_before_max_ms != LONG_MAX
                    ):
                        self._raise_if_timestamps_out_of_range(records, 0, now_ms)
                    if records_max != max_timestamp:
                        # A header that is not its records' max: a copy is given theirs.
                        stamped = bytearray(records)
                        fmt.set_max_timestamp(stamped, 0, records_max)
                        view = memoryview(stamped)
                        max_timestamp = records_max
            self._raise_if_past_segment(size)
            if dry_run:
                return None
            seg = self.segments[-1]
            base_offset = seg.next_offset
            last_offset = base_offset + last_offset_delta
            prefix = fmt.BATCH_PREFIX.pack(base_offset, batch_length, leader_epoch)
            if leader_epoch > self.epoch_cache.latest_epoch:
                self.epoch_cache.assign(leader_epoch, base_offset)
            if seg.created_ms is None:
                seg.created_ms = now_ms
            # The relative-offset reach even of an empty segment, as ``_should_roll``
            # (KAFKA-6264): truncated into a first segment the cleaner emptied, the active
            # segment's next offset may be 2^31 past its base, and opening the log again cut
            # off what went in there.
            if last_offset - seg.base_offset > MAX_RELATIVE_OFFSET or (
                seg.size
                and (
                    seg.size + size > self.config.segment_bytes
                    or seg.index_full
                    or self._time_to_roll(seg, max_timestamp, now_ms)
                )
            ):
                seg = self._roll(base_offset, now_ms)
            seg.append_one(
                prefix,
                view[16:],
                base_offset=base_offset,
                last_offset=last_offset,
                max_timestamp=max_timestamp,
            )
            self._unflushed_messages += record_count
            if self.config.flush_messages is not None or self.config.flush_ms is not None:
                self._maybe_flush(now_ms)
            return AppendInfo(base_offset, last_offset, max_timestamp, 1, size, log_append_time)
        headers = self._validate(records, leader=True)
        for pos, header, records_max in headers:
            self._validate_timestamps(records, pos, header, records_max, now_ms)
        self._raise_if_past_segment(len(records))
        if dry_run:
            return None
        buf = bytearray(records)
        next_offset = self.log_end_offset
        final: list[tuple[int, fmt.BatchHeader]] = []
        for pos, sent, records_max in headers:
            fmt.set_base_offset(buf, pos, next_offset)
            fmt.set_partition_leader_epoch(buf, pos, leader_epoch)
            header = sent._replace(base_offset=next_offset, partition_leader_epoch=leader_epoch)
            if self.config.log_append_time and not header.is_control:
                fmt.set_log_append_time(buf, pos, now_ms)
                header = fmt.parse_header(buf, pos)
            elif records_max != header.max_timestamp:
                fmt.set_max_timestamp(buf, pos, records_max)
                header = fmt.parse_header(buf, pos)
            final.append((pos, header))
            next_offset += header.last_offset_delta + 1
        self.epoch_cache.assign(leader_epoch, self.log_end_offset)
        info = self._append(buf, final, now_ms)
        if self.config.log_append_time:
            return info._replace(log_append_time_ms=now_ms)
        return info

    def scan_for_leader(self, records: bytes) -> LeaderScan | None:
        """Read the records of a produced batch as ``append_as_leader`` would, without
        touching the log, so that it may run on another thread: ``None`` for what is not one
        whole batch of magic 2 with records and a sound CRC, which the append refuses before
        it reads any record. Recompresses the batch first if the topic's compression.type
        asks it (``None`` if that fails: the append does it again and raises). Reads the log's
        config and name, nothing else of it."""
        if len(records) < fmt.HEADER_SIZE:
            return None
        compression = self.config.compression_type
        sent: bytes | None = None
        if compression != "producer":
            try:
                rebuilt = self._recompressed(records, _CODECS[compression])
            except Exception:  # whatever it is, the append raises it again
                return None
            sent, records = records, rebuilt
            if len(records) < fmt.HEADER_SIZE:
                return None
        header = fmt.HEADER.unpack_from(records)
        batch_length, magic, crc, attributes = header[1], header[3], header[4], header[5]
        record_count = header[12]
        size = batch_length + fmt.LOG_OVERHEAD
        if (
            size != len(records)
            or magic != fmt.MAGIC_V2
            or attributes & fmt.CONTROL_FLAG
            or record_count <= 0
            or fmt.crc32c(memoryview(records)[fmt.ATTRIBUTES_OFFSET :]) != crc
        ):
            return None
        # Errors are kept for the append to raise where it reads (RecordFormatError and kin),
        # the keys' apart: one is raised only if the topic is still compacted then.
        compact = self.config.compact
        key_error: Exception | None = None
        if compact:
            try:
                self._raise_if_null_key(records)
            except ValueError as e:
                key_error = e
        try:
            records_max = _records_max_timestamp(records, 0, size, attributes, record_count)
        except ValueError as e:
            return LeaderScan(records, fmt.NO_TIMESTAMP, compact, e, key_error, sent, compression)
        return LeaderScan(records, records_max, compact, None, key_error, sent, compression)

    def append_as_follower(self, records: bytes, now_ms: int) -> AppendInfo:
        """Append batches replicated from the leader, keeping their offsets and epochs."""
        headers = [(pos, header) for pos, header, _ in self._validate(records, leader=False)]
        expected = self.log_end_offset
        for _, header in headers:
            if header.base_offset < expected:
                raise UnexpectedAppendOffsetError(
                    f"{self.directory.name}: batch at offset {header.base_offset} below the "
                    f"expected {expected}"
                )
            expected = header.next_offset
        for _, header in headers:
            self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
        return self._append(bytearray(records), headers, now_ms)

    def _validate(self, records: bytes, *, leader: bool) -> list[tuple[int, fmt.BatchHeader, int]]:
        """Kafka's ``LogValidator`` subset: whole batches, magic 2, CRC, size, and for a
        ``leader`` append a record count that matches the batch's offset range, a key on
        every record of a compacted topic, and the max timestamp its records give it.
        Followers skip those: what the leader accepted is replicated as it is, compacted
        batches included (Kafka's ``appendAsFollower`` runs no LogValidator). Each batch's
        position, header and max timestamp (the header's, on a follower)."""
        headers = list(fmt.iter_headers(records))
        if not headers:
            raise InvalidRecordError("no record batch in the request")
        return [
            (pos, header, self._validate_batch(records, pos, header, leader=leader))
            for pos, header in headers
        ]

    def _validate_batch(
        self, records: bytes, pos: int, header: fmt.BatchHeader, *, leader: bool
    ) -> int:
        """The checks of ``_validate`` for one batch; its max timestamp (see there)."""
        size = header.batch_length + fmt.LOG_OVERHEAD
        if leader:
            # Not on a follower: the leader took it, maybe under another limit
            # (UnifiedLog.appendAsFollower's ignoreRecordSize); refused, it stopped the
            # follower's fetching of every partition of that leader for good.
            self._raise_if_too_large(size)
        if pos + size > len(records):
            raise fmt.RecordFormatError(f"truncated batch at position {pos}")
        if fmt.compute_crc(records, pos, size) != header.crc:
            raise fmt.CorruptRecordError(f"CRC mismatch in batch at position {pos}")
        if leader:
            if header.base_offset:
                raise _base_offset_not_zero(self.directory.name, header.base_offset)
            if header.record_count == 0 and not header.is_control:
                raise InvalidRecordError(f"batch at position {pos} has no records")
            _raise_if_count_disagrees(header.record_count, header.last_offset_delta, pos)
            _raise_if_body_too_small(header, pos)
            if not header.is_control:
                if self.config.compact:
                    self._raise_if_null_key(records, pos)
                return _records_max_timestamp(
                    records, pos, size, header.attributes, header.record_count
                )
        return header.max_timestamp

    def _raise_if_past_segment(self, size: int) -> None:
        """UnifiedLog.append: what cannot fit in one segment is refused, whatever
        max.message.bytes says (else it became a segment larger than segment.bytes). Kafka
        checks it after every batch is validated (analyzeAndValidateRecords, LogValidator), so
        a batch also past max.message.bytes, or corrupt, is refused for that."""
        if size > self.config.segment_bytes:
            raise RecordListTooLargeError(
                f"Message batch size is {size} bytes in append to partition "
                f"{self.directory.name} which exceeds the maximum configured segment size of "
                f"{self.config.segment_bytes}."
            )

    def _raise_if_too_large(self, batch_size: int) -> None:
        if batch_size > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch of {batch_size} bytes exceeds max.message.bytes "
                f"{self.config.max_message_bytes}"
            )

    def _recompressed(self, records: bytes, codec: fmt.Compression) -> bytes:
        """The batches with every one in another codec rebuilt in ``codec`` (Kafka's
        LogValidator when the topic's compression.type is not the producer's). A batch is
        checked whole before it is decompressed, its size as sent included
        (``UnifiedLog.analyzeAndValidateRecords`` runs before LogValidator: a batch past
        ``max.message.bytes`` is refused, however small its codec would make it); the rebuilt
        ones are checked again with the rest, so one that grew past it is refused too."""
        out: list[bytes] = []
        changed = False
        for pos, header in fmt.iter_headers(records):
            if header.compression is codec or header.is_control or header.record_count <= 0:
                out.append(records[pos : pos + header.size])
                continue
            self._raise_if_too_large(header.size)
            self._validate_batch(records, pos, header, leader=False)
            # Kafka's buildRecordsAndAssignOffsets gives the records consecutive offsets.
            decoded = _consecutive(header.base_offset, fmt.decode_records(records, pos))
            out.append(fmt.rebuild_batch(header, decoded, compression=codec))
            changed = True
        return b"".join(out) if changed else records

    def _validate_timestamps(
        self, records: bytes, pos: int, header: fmt.BatchHeader, records_max: int, now_ms: int
    ) -> None:
        """Kafka's ``LogValidator.validateTimestamp`` for the batch at ``pos`` of a leader
        append: a producer may not mark a batch LogAppendTime, and with CreateTime every record's
        timestamp (but -1, none) lies within [now - before, now + after]. ``records_max`` is
        the greatest of them (``_validate``)."""
        if header.is_control:
            return
        if header.timestamp_type is fmt.TimestampType.LOG_APPEND_TIME:
            raise _log_append_time_from_producer(header.record_count)
        if not self.config.log_append_time and (
            records_max > now_ms + self.config.message_timestamp_after_max_ms
            or self.config.message_timestamp_before_max_ms != LONG_MAX
        ):
            self._raise_if_timestamps_out_of_range(records, pos, now_ms)

    def _raise_if_timestamps_out_of_range(self, records: bytes, pos: int, now_ms: int) -> None:
        # The records' max timestamp settles the upper bound without listing them (the
        # default configs check only that); the lower bound, once set, needs every record.
        lower = now_ms - self.config.message_timestamp_before_max_ms
        upper = now_ms + self.config.message_timestamp_after_max_ms
        errors = [
            (
                index,
                f"Timestamp {r.timestamp} of message with offset {r.offset} is out of range. "
                f"The timestamp should be within [{lower}, {upper}]",
            )
            for index, r in enumerate(fmt.decode_records(records, pos))
            if r.timestamp != fmt.NO_TIMESTAMP and not lower <= r.timestamp <= upper
        ]
        if errors:
            raise InvalidTimestampError(errors)

    def _raise_if_null_key(self, records: bytes, pos: int = 0) -> None:
        """LogValidator.validateKey: every keyless record is a record error of its own, and
        the message is processRecordErrors' (at most three shown)."""
        # decode_key_values: the replay's lean decoder, with decode_records' checks and
        # increasing offsets (what the cleaner needs to rebuild a batch).
        try:
            decoded = fmt.decode_key_values(records, pos)
        except fmt.OffsetsNotIncreasingError:
            if records[pos + fmt.ATTRIBUTES_OFFSET + 1] & fmt.COMPRESSION_MASK:
                raise _InnerOffsetsNotConsecutiveError from None  # rebuilt, as LogValidator
            raise
        errors = [
            (
                index,
                "Compacted topic cannot accept message without key in topic partition "
                f"{self.directory.name}.",
            )
            for index, (_offset, key, _value) in enumerate(decoded)
            if key is None
        ]
        if errors:
            shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
            raise InvalidRecordError(
                f"One or more records have been rejected due to {len(errors)} record errors in "
                f"total, and only showing the first three errors at most: [{shown}]",
                errors,
            )

    def _append(
        self, buf: bytearray, headers: Sequence[tuple[int, fmt.BatchHeader]], now_ms: int
    ) -> AppendInfo:
        if len(headers) == 1:
            # One batch, the usual produce request: no run splitting.
            header = headers[0][1]
            seg = self.active_segment
            if self._should_roll(seg, header, len(buf), now_ms):
                seg = self._roll(header.base_offset, now_ms)
            seg.append(buf, headers)
            self._unflushed_messages += header.record_count
            if self.config.flush_messages is not None or self.config.flush_ms is not None:
                self._maybe_flush(now_ms)
            return AppendInfo(
                header.base_offset, header.last_offset, header.max_timestamp, 1, len(buf)
            )
        # Split into runs that fit the active segment, rolling between them.
        start = 0
        while start < len(headers):
            end = start
            run_bytes = 0
            seg = self.active_segment
            first_base = headers[start][1].base_offset
            if self._should_roll(seg, headers[start][1], headers[start][1].size, now_ms):
                seg = self._roll(first_base, now_ms)
            # The segment indexes the run's batches as it appends them: the run stops where
            # the next one would take an entry neither index has room for (a follower's
            # fetch of many small batches may fill a small segment.index.bytes mid-run).
            index_room = seg.index_room
            since_entry = seg.bytes_since_index_entry
            while end < len(headers):
                h = headers[end][1]
                takes_entry = since_entry > seg.index_interval_bytes
                if end > start and (
                    seg.size + run_bytes + h.size > self.config.segment_bytes
                    or h.last_offset - seg.base_offset > MAX_RELATIVE_OFFSET
                    or (takes_entry and index_room <= 0)
                ):
                    break
                if takes_entry:
                    index_room -= 1
                    since_entry = 0
                since_entry += h.size
                run_bytes += h.size
                end += 1
            p0 = headers[start][0]
            run = [(pos - p0, h) for pos, h in headers[start:end]]
            seg.append(buf[p0 : p0 + run_bytes], run)
            start = end
        last = headers[-1][1]
        self._unflushed_messages += sum(h.record_count for _, h in headers)
        self._maybe_flush(now_ms)
        return AppendInfo(
            first_offset=headers[0][1].base_offset,
            last_offset=last.last_offset,
            max_timestamp=max(h.max_timestamp for _, h in headers),
            batch_count=len(headers),
            size_bytes=len(buf),
        )

    def _should_roll(self, seg: LogSegment, first: fmt.BatchHeader, size: int, now_ms: int) -> bool:
        if seg.created_ms is None:
            seg.created_ms = now_ms
        if first.last_offset - seg.base_offset > MAX_RELATIVE_OFFSET:
            # Even an empty segment (Kafka's LogSegment.shouldRoll, canConvertToRelativeOffset,
            # KAFKA-6264): a follower's batch 2^31 offsets past its empty active segment (a
            # leader compacted below it) went in, and opening the log again cut it off.
            return True
        if seg.size == 0:
            return False
        return (
            seg.size + size > self.config.segment_bytes
            or self._time_to_roll(seg, first.max_timestamp, now_ms)
            or seg.index_full
        )

    def _time_to_roll(self, seg: LogSegment, max_timestamp: int, now_ms: int) -> bool:
        """segment.ms, as Kafka's ``LogSegment.timeWaitedForRoll``: the incoming batch's
        timestamp against the segment's first batch's; when that one has none (-1), the clock
        against the segment's creation (here: the first append this process made to it)."""
        assert seg.created_ms is not None
        first = seg.first_batch_timestamp
        if first is not None and first >= 0:
            return max_timestamp - first > self.config.max_segment_ms
        return now_ms - seg.created_ms > self.config.max_segment_ms

    def _roll(self, base_offset: int, now_ms: int | None = None) -> LogSegment:
        """Close the active segment for appends and start a new one at ``base_offset``,
        created at ``now_ms`` if an append rolls it (else at the next append)."""
        old = self.active_segment
        assert base_offset >= old.next_offset, (base_offset, old.next_offset)
        old.seal()
        # Created since the last flush: its directory entry is made durable too.
        new_file = old.base_offset >= self.recovery_point
        if self.flush_rolled is None:
            old.flush()
            if new_file:
                checkpoint.fsync_dir(self.directory)
            self._flushed_to(old.next_offset)
        else:
            fds = old.open_for_sync()
            if new_file:
                try:
                    fds.append(os.open(self.directory, os.O_RDONLY))
                except OSError:
                    for fd in fds:
                        os.close(fd)
                    raise
            flush = RolledFlush(old.next_offset, self.truncations, fds)
            self._pending_rolls.append(flush)
            self.flush_rolled(self, flush)
        seg = _new_segment(self.directory, self.config, base_offset)
        seg.created_ms = now_ms
        self.segments.append(seg)
        self._bases.append(base_offset)
        if self.roll_listener is not None:
            self.roll_listener(base_offset)
        return seg

    def _flushed_to(self, offset: int) -> None:
        self.epoch_cache.flush()  # before the recovery point passes the epochs' records
        self.recovery_point = max(self.recovery_point, offset)

    def rolled_flush_done(self, flush: RolledFlush) -> None:
        """``flush`` ran. The recovery point passes a rolled segment once its fsyncs and those
        of every roll before it are done (they may end in any order), and never for a roll
        made before a truncation (its segment may be gone) or once the log is closed (a flush
        of its own covered it). A failed one holds the rest back: the node halts."""
        pending = self._pending_rolls
        while pending and pending[0].done:
            # One made before a truncation is waited for all the same: its segment may have
            # stayed below the truncation, and a later roll must not pass it unflushed.
            first = pending.popleft()
            if first.truncations == self.truncations and not self._closed:
                self._flushed_to(first.offset)

    def roll(self) -> None:
        """Force a roll (tests, and Kafka's admin-driven roll) if the active segment has data."""
        if self.active_segment.size:
            self._roll(self.log_end_offset)

    # -----------------------------------------------------------------------------------------
    # Flushing.

    def _maybe_flush(self, now_ms: int) -> None:
        if self._last_flush_ms is None:
            self._last_flush_ms = now_ms
        by_count = (
            self.config.flush_messages is not None
            and self._unflushed_messages >= self.config.flush_messages
        )
        by_time = (
            self.config.flush_ms is not None
            and now_ms - self._last_flush_ms >= self.config.flush_ms
        )
        if by_count or by_time:
            self.flush(now_ms)

    def flush(self, now_ms: int | None = None) -> None:
        """fsync every segment at or above the recovery point; advance it to the LEO."""
        end = self.log_end_offset
        created = False
        for seg in self.segments:
            if seg.next_offset > self.recovery_point or seg is self.active_segment:
                seg.flush()
                created = created or seg.base_offset >= self.recovery_point
        if created:
            # Kafka's LocalLog.flush: a segment created since the last flush needs its
            # directory entry fsynced as well, or a power loss can lose the whole file.
            checkpoint.fsync_dir(self.directory)
        self.epoch_cache.flush()  # before the recovery point passes the epochs' records
        self.recovery_point = end
        self._unflushed_messages = 0
        if now_ms is not None:
            self._last_flush_ms = now_ms

    # -----------------------------------------------------------------------------------------
    # Reading.

    def _segment_index_for(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._bases, offset) - 1)

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one: bool = True,
    ) -> FetchData:
        """Whole batches from the one holding ``start_offset``, at most ``max_bytes``.

        ``max_offset`` (exclusive) bounds what is visible: the high watermark for consumers.
        With ``min_one`` a first batch larger than ``max_bytes`` is still returned whole, as
        Kafka does so a consumer can always make progress.
        """
        end = self.log_end_offset
        if start_offset < self.log_start_offset or start_offset > end:
            raise OffsetOutOfRangeError(
                f"offset {start_offset} outside [{self.log_start_offset}, {end}] of "
                f"{self.directory.name}"
            )
        if start_offset == end or (max_offset is not None and start_offset >= max_offset):
            return FetchData(b"", None)
        for seg in self.segments[self._segment_index_for(start_offset) :]:
            result = seg.read(start_offset, max_bytes, max_offset=max_offset, min_one=min_one)
            if result is None:
                continue  # compaction left no batch here at or after start_offset
            data, base_offset = result
            return FetchData(data, base_offset if data else None)
        return FetchData(b"", None)

    def prefix_kept(self, offset: int, truncations: int, *, floor: int) -> int | None:
        """For a reader that read this log below ``offset`` when its truncation count was
        ``truncations``, and reads on from there: the count to remember now if no truncation
        went below ``offset`` since (one at or above it keeps what was read) and ``offset`` is
        still in ``[floor, log end]`` (what it has not read is still there), else None."""
        if not floor <= offset <= self.log_end_offset:
            return None
        if self.truncations == truncations:
            return truncations
        if self.truncations == truncations + 1 and self.last_truncated_to >= offset:
            return self.truncations
        return None

    def tombstone_drops_seen(self, offset: int, seen: int, cleaned_below: int) -> int | None:
        """For a reader replaying this log record by record from its start, now at
        ``offset``, that had seen ``seen`` of its cleaner swaps that dropped tombstones and
        began when ``first_dirty_offset`` was ``cleaned_below``: the count to remember now if
        none it missed dropped one at or above both (what it has read stays true), else None:
        a key whose value it read may have lost the tombstone it has yet to read, and it must
        read again from the log start.

        A tombstone below ``cleaned_below`` is no matter: a pass had gone over it before the
        reader began, and dropped every older value of its key (the pass's map held it), so
        the reader never read one. Restarting for every drop ahead restarted a long load at
        each cleaner pass that dropped any tombstone, for ever under steady offset expiry
        (review helper-285); Kafka's loader relies on reading a tombstone within
        delete.retention.ms of the pass that kept it."""
        missed = self.tombstone_drops - seen
        if not missed:
            return seen
        recent = self.tombstones_dropped_up_to  # per swap, newest last
        if missed > len(recent) or max(list(recent)[-missed:]) >= max(offset, cleaned_below):
            return None
        return self.tombstone_drops

    def batch_headers_from(self, offset: int) -> Iterator[fmt.BatchHeader]:
        """The headers of the batches from the one holding ``offset`` on, oldest first, CRC
        unchecked (what a producer state reads to catch up with the log). Consume it before
        the log changes: it reads the segments as they are."""
        for i, seg in enumerate(self.segments[self._segment_index_for(offset) :]):
            position = 0
            if i == 0:
                found = seg.translate_offset(offset)
                if found is None:
                    continue  # nothing at or after ``offset`` here (compaction left a gap)
                position = found.position
            for found in seg.scan_headers(position):
                yield found.header

    def on_older_segment(self, offset: int, other: int) -> bool:
        """Whether ``offset`` lies in a segment before the one holding ``other`` (Kafka's
        ``LogOffsetMetadata.onOlderSegment``): a read from ``offset`` stops at its segment's
        end, short of ``other``."""
        return offset < other and self._segment_index_for(offset) < self._segment_index_for(other)

    def bytes_between(self, start_offset: int, end_offset: int) -> int:
        """The bytes of the batches from the one holding ``start_offset`` up to ``end_offset``
        (a batch boundary: a log end offset or a high watermark), from positions alone:
        Kafka's ``LogOffsetMetadata.positionDiff``, which ``DelayedFetch`` sums to decide
        whether a waiting fetch has its ``min_bytes`` without reading any record."""
        end_offset = min(end_offset, self.log_end_offset)
        if start_offset >= end_offset:
            return 0
        first = self._segment_index_for(start_offset)
        last = self._segment_index_for(end_offset)
        total = 0
        for i in range(first, last + 1):
            seg = self.segments[i]
            start_position = 0
            if i == first:
                start = seg.translate_offset(start_offset)
                if start is None:
                    continue  # compaction left no batch here at or after start_offset
                start_position = start.position
            end = seg.translate_offset(end_offset) if i == last else None
            total += (seg.size if end is None else end.position) - start_position
        return total

    def newest_record(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start with the largest
        timestamp (ListOffsets MAX_TIMESTAMP). Segments are tried by their max timestamp,
        largest first: one whose records fall short of it (``LogSegment.newest_record``) may
        hold less than the next one."""
        start = self.log_start_offset
        bounds = sorted(
            (
                (-seg.max_timestamp_from(start), i)
                for i, seg in enumerate(self.segments)
                if seg.next_offset > start
            )
        )
        newest: tuple[int, int] | None = None
        for negative_bound, i in bounds:
            if -negative_bound < 0 or (newest is not None and -negative_bound < newest[1]):
                break
            found = self.segments[i].newest_record(start)
            if found is not None and (
                newest is None
                or found[1] > newest[1]
                or (found[1] == newest[1] and found[0] < newest[0])
            ):
                newest = found
        return newest

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with a timestamp at or after ``timestamp``."""
        for seg in self.segments:
            if seg.max_timestamp < timestamp:
                continue
            found = seg.find_offset_by_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                return found
        return None

    # -----------------------------------------------------------------------------------------
    # Truncation.

    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or above ``offset``; return the new log end offset.

        Used when a follower reconciles with a new leader (KIP-101/279). A batch straddling
        ``offset`` is removed whole, so the log ends at a batch boundary at or below it. At or
        above the log end nothing is removed but the leader-epoch entries starting there: a
        node that led an epoch and appended nothing in it keeps that epoch's entry at its log
        end, which the new leader does not know (Kafka's ``UnifiedLog.truncateTo`` does the same).
        """
        if offset >= self.log_end_offset:
            self.epoch_cache.truncate_from_end(self.log_end_offset)
            self.epoch_cache.flush()
            return self.log_end_offset
        if offset < self.segments[0].base_offset:
            # Strictly below, as UnifiedLog.truncateTo: at the first segment's base, that
            # segment stays, emptied, and so do the producer snapshots up to it, which a
            # retry's duplicate check needs (and any leader epoch starting below it).
            self.truncate_fully_and_start_at(offset if offset >= 0 else 0)
            return self.log_end_offset
        # Kafka's LocalLog.truncateTo: segments starting above ``offset`` go; one starting at
        # it stays, emptied. Popped too, the log ended where the segment before it ends on
        # disk, which compaction may have left below ``offset`` (and below the HW).
        while len(self.segments) > 1 and self.segments[-1].base_offset > offset:
            seg = self.segments.pop()
            self._bases.pop()
            self.remove_files(seg.retire())
        # The segment ends at ``offset``, or at the start of a batch straddling it.
        dropped = self.active_segment.truncate_to(offset)
        log.info("%s: truncated to %d (%d bytes)", self.directory.name, offset, dropped)
        end = self.log_end_offset
        self.truncations += 1
        self._generation += 1
        self.first_dirty_offset = min(self.first_dirty_offset, end)
        self.last_truncated_to = end
        producer_snapshot.delete_above(self.directory, end)
        self.recovery_point = min(self.recovery_point, end)
        self.log_start_offset = min(self.log_start_offset, end)
        self.epoch_cache.truncate_from_end(end)
        self.epoch_cache.flush()
        if self.truncated is not None:
            self.truncated(self.recovery_point)
        return end

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete all data; the log restarts empty at ``offset`` (a follower far behind)."""
        for seg in self.segments:
            self.remove_files(seg.retire())
        self.segments = [_new_segment(self.directory, self.config, offset)]
        self._bases = [offset]
        self.log_start_offset = offset
        self.recovery_point = offset
        self.truncations += 1
        self._generation += 1
        self.first_dirty_offset = offset
        self.delete_horizon_ms = None
        self.last_truncated_to = 0  # nothing below is kept
        producer_snapshot.delete_above(self.directory, -1)
        self.epoch_cache.clear()
        self.epoch_cache.flush()
        if self.truncated is not None:
            self.truncated(self.recovery_point)

    # -----------------------------------------------------------------------------------------
    # Producer state snapshots (storage/producer_snapshot.py).

    def write_producer_snapshot(self, offset: int, state: ProducerStateManager) -> None:
        """Keep ``state``, the producers of the batches below ``offset``, in a snapshot."""
        producer_snapshot.write(
            self.directory, offset, state, keep_from=self.segments[0].base_offset
        )

    def latest_producer_snapshot(
        self, producer_id_expiration_ms: int
    ) -> tuple[int, ProducerStateManager] | None:
        """The latest producer snapshot at or below the log end, with its offset."""
        return producer_snapshot.read_latest(
            self.directory,
            at_most=self.log_end_offset,
            producer_id_expiration_ms=producer_id_expiration_ms,
        )

    # -----------------------------------------------------------------------------------------
    # Retention.

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start up (DeleteRecords, or a leader's log start seen by a follower);
        True if it moved."""
        moved_to = min(offset, self.log_end_offset)
        if moved_to <= self.log_start_offset:
            return False
        self.log_start_offset = moved_to
        # Written with the next flush, not now (Kafka's truncateFromStartAsyncFlush): two
        # fsyncs per move held the loop for each partition of a DeleteRecords, and opening
        # the log trims the epochs below its log start anyway.
        self.epoch_cache.truncate_from_start(self.log_start_offset)
        return True

    def delete_old_segments(self, now_ms: int, *, high_watermark: int | None = None) -> int:
        """Delete whole segments past retention; return how many (Kafka's deleteOldSegments).

        A segment goes when it lies wholly below the log start offset, and, with
        ``cleanup.policy=delete``, when its newest record is older than ``retention.ms`` or
        the log is bigger than ``retention.bytes`` without it. Only whole segments strictly
        below the high watermark go. The active segment goes too once it qualifies and the
        high watermark is at the log end, after a roll (``UnifiedLog.deletableSegments`` and
        ``deleteSegments``): an idle partition's last records expire like the others, and
        the log starts again, empty, at its log end offset.
        """
        hw = self.log_end_offset if high_watermark is None else high_watermark
        size = self.size_bytes
        deleted = 0
        for i, seg in enumerate(self.segments):
            last = i == len(self.segments) - 1
            if last and seg.size == 0:
                break
            upper = self.log_end_offset if last else self.segments[i + 1].base_offset
            if upper > hw:
                break
            below_start = upper <= self.log_start_offset
            expired = (
                self.config.delete
                and self.config.retention_ms >= 0
                and now_ms - seg.largest_timestamp_ms() > self.config.retention_ms
            )
            too_big = (
                self.config.delete
                and self.config.retention_bytes >= 0
                and size - seg.size >= self.config.retention_bytes
            )
            if not (below_start or expired or too_big):
                break
            size -= seg.size
            deleted += 1
        if deleted == len(self.segments):
            # The log keeps an (empty) active segment, rolled before anything goes, as
            # Kafka's deleteSegments: the roll's producer-state snapshot is taken while the
            # segments it reads from are still there (rolled after, the state's read point
            # was already below the log, no snapshot was taken, and the producers whose
            # batches all went were forgotten: a retry of their last batch went in again).
            self._roll(self.log_end_offset)
        for _ in range(deleted):
            seg = self.segments.pop(0)
            self._bases.pop(0)
            self.remove_files(seg.retire())
            self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        if deleted:
            self._generation += 1
            self.epoch_cache.truncate_from_start(self.log_start_offset)
            self.epoch_cache.flush()
            log.info(
                "%s: retention deleted %d segments; log start now %d",
                self.directory.name,
                deleted,
                self.log_start_offset,
            )
        return deleted

    # -----------------------------------------------------------------------------------------
    # Compaction.

    def compact(
        self,
        now_ms: int,
        *,
        high_watermark: int | None = None,
        map_capacity: int = DEFAULT_OFFSET_MAP_CAPACITY,
    ) -> CleanerStats:
        """Keep the last record per key in the closed segments (Kafka's ``LogCleaner``), in one
        call: ``plan_cleaning``, ``clean`` and ``swap_cleaned`` on the caller's thread.

        The cleanable range ends at the active segment, at the high watermark, and at the first
        segment with records newer than ``min.compaction.lag.ms``. A key's last record within
        that range survives; earlier ones go, as do keyless records. A tombstone (null value)
        that survives is kept for ``delete.retention.ms`` after the cleaner first keeps it: the
        batch is stamped with a delete horizon (KIP-534) and a later run past it drops the
        tombstone. Batches keep their base and last offsets; empty ones go. Each cleaned
        segment is written as ``.cleaned``, renamed ``.swap``, then swapped in, so a crash
        leaves the old or the new segment, never half of one. A pass whose key map fills up
        (``map_capacity`` keys) cleans only up to where it stopped; the next goes on from there.
        """
        plan = self.plan_cleaning(now_ms, high_watermark=high_watermark)
        if plan is None:
            return CleanerStats()
        stats = self.swap_cleaned(self.clean(plan, map_capacity=map_capacity))
        assert stats is not None, "nothing changed the log between planning and swapping"
        return stats

    def restore_first_dirty_offset(self, offset: int) -> None:
        """Where the dirty part starts, as ``cleaner-offset-checkpoint`` says at start-up
        (Kafka's ``LogCleanerManager.cleanableOffsets``): outside the log (below its start, or
        above its end after a crash cut the log short) the dirty part starts at the log
        start. Without it every compacted log counted as wholly dirty after a restart, and the
        cleaner read each again, ``__consumer_offsets`` included, while the coordinators
        loaded."""
        if self.log_start_offset <= offset <= self.log_end_offset:
            self.first_dirty_offset = offset
        else:
            if offset > self.log_end_offset:
                log.warning(
                    "%s: the cleaner checkpoint %d is above the log end %d: the whole log is dirty",
                    self.directory.name,
                    offset,
                    self.log_end_offset,
                )
            self.first_dirty_offset = self.log_start_offset

    def plan_cleaning(
        self,
        now_ms: int,
        *,
        high_watermark: int | None = None,
        min_dirty_ratio: float | None = None,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> CleanPlan | None:
        """What a cleaning pass would clean now, or None. On the log's owner thread.

        With ``min_dirty_ratio`` (the background cleaner), only when the dirty share of the
        cleanable bytes (those at or above ``first_dirty_offset``) exceeds it (never for a
        NaN ratio, which Kafka's config accepts), or when a
        tombstone the last pass kept may now go; Kafka's ``LogCleanerManager`` picks logs the
        same way (``min.cleanable.dirty.ratio``, KIP-534's delete horizon).
        """
        if not self.config.compact:
            return None
        hw = self.log_end_offset if high_watermark is None else high_watermark
        cleanable: list[LogSegment] = []
        for seg in self.segments[:-1]:
            if seg.next_offset > hw:
                break
            # LogCleanerManager.cleanableOffsets: the first dirty segment within
            # min.compaction.lag.ms of now ends the range (the clean ones were rewritten by a
            # pass, their files are new); one without timestamps counts its file's time.
            lag_ms = self.config.min_compaction_lag_ms
            if (
                lag_ms > 0
                and seg.next_offset > self.first_dirty_offset
                and now_ms - seg.largest_timestamp_ms() < lag_ms
            ):
                break
            cleanable.append(seg)
        if not cleanable:
            return None
        total = sum(seg.size for seg in cleanable)
        dirty_segments = [seg for seg in cleanable if seg.next_offset > self.first_dirty_offset]
        dirty = sum(seg.size for seg in dirty_segments)
        ratio = dirty / total if total else 0.0
        if min_dirty_ratio is not None:
            horizon_passed = self.delete_horizon_ms is not None and now_ms >= self.delete_horizon_ms
            if dirty == 0 and not horizon_passed:
                return None
            # KIP-354 (LogCleanerManager.maxCompactionDelay): dirty records older than
            # max.compaction.lag.ms are cleaned now, whatever the ratio.
            overdue = any(
                seg.first_batch_timestamp is not None
                and seg.first_batch_timestamp > 0
                and seg.first_batch_timestamp < now_ms - self.config.max_compaction_lag_ms
                for seg in dirty_segments
            )
            if not ratio > min_dirty_ratio and not horizon_passed and not overdue:
                return None
        return CleanPlan(
            cleanable,
            self._generation,
            now_ms,
            ratio,
            self.first_dirty_offset,
            producer_id_expiration_ms,
        )

    def clean(
        self,
        plan: CleanPlan,
        pause: Callable[[], object] = _no_pause,
        *,
        map_capacity: int = DEFAULT_OFFSET_MAP_CAPACITY,
    ) -> CleanResult:
        """Write the cleaned copy of each planned segment that changes (``.cleaned`` files).

        Safe on a worker thread while the owner thread appends and reads: it only reads the
        planned segments, which are closed, and writes new files. Anything that could change
        them (truncation, retention, closing) bumps the generation, and ``swap_cleaned`` then
        throws the copies away. Raises (having deleted its copies) if a segment cannot be read.
        ``pause`` is called after every batch: on a worker thread, ``time.sleep(0)`` hands the
        GIL to a waiting event loop at once instead of after the interpreter's switch interval.

        The keys come from the dirty part only, at most ``map_capacity`` of them: when the map
        fills up, the pass cleans the segments below where it stopped (``_build_offset_map``).
        """
        result = CleanResult(plan, [], CleanerStats(), end_offset=plan.segments[-1].next_offset)
        try:
            last_offset_of = self._build_offset_map(plan, map_capacity, result, pause)
            producers_last = self._last_batches_of_producers(plan, result, pause)
            kept_producers: set[int] = set()
            below_end = [seg for seg in plan.segments if seg.base_offset < result.end_offset]
            for group in _groups_for_cleaning(
                below_end, self.config.segment_bytes, self.config.segment_index_bytes
            ):
                cleaned = self._clean_group(
                    group,
                    last_offset_of,
                    producers_last=producers_last,
                    kept_producers=kept_producers,
                    result=result,
                    pause=pause,
                )
                result.cleaned.append((group, cleaned))
        except BaseException:
            self._delete_cleaned(result)
            raise
        return result

    def _build_offset_map(
        self,
        plan: CleanPlan,
        capacity: int,
        result: CleanResult,
        pause: Callable[[], object],
    ) -> dict[bytes, int]:
        """Each key's last offset in the planned segments from the first dirty offset on
        (Kafka's ``Cleaner.buildOffsetMap``): below it a pass already left one record per key,
        which stays unless the dirty part has a later one.

        Once the map holds ``capacity`` keys it stops before the next batch with a key it
        lacks, and the pass ends there (``result.end_offset``); the next pass goes on from it.
        Kafka stops at the next record once full, within a batch, and ends after the last
        batch it mapped whole; here a later record of a key already mapped still counts, and
        stopping between batches lets the map exceed its capacity by at most one batch's keys.
        """
        last_offset_of: dict[bytes, int] = {}
        start = plan.first_dirty_offset
        for seg in plan.segments:
            if seg.next_offset <= start:
                continue
            for data, pos, header in _batches_in_runs(seg):
                pause()  # the batches already clean too: up to a segment of them
                if header.last_offset < start:
                    continue
                _raise_if_crc_invalid(seg, data, pos, header)
                if header.is_control:
                    continue
                keyed = [
                    (_map_key(r.key), r.offset)
                    for r in fmt.decode_records(data, pos)
                    if r.key is not None
                ]
                if len(last_offset_of) >= capacity and any(
                    key not in last_offset_of for key, _ in keyed
                ):
                    result.end_offset = header.base_offset
                    log.info(
                        "%s: the cleaner's key map is full (%d keys): this pass cleans below %d",
                        self.directory.name,
                        len(last_offset_of),
                        header.base_offset,
                    )
                    return last_offset_of
                last_offset_of.update(keyed)
        return last_offset_of

    def _last_batches_of_producers(
        self, plan: CleanPlan, result: CleanResult, pause: Callable[[], object] = _no_pause
    ) -> dict[int, bool]:
        """The last offset of each producer's last batch in the segments cleaned, and whether
        the producer is still active. Above where a full key map stopped, the delete horizons
        already stamped are noted too: the log's earliest one is what tells the background
        cleaner that tombstones may go (after a restart, a pass that stopped below them made
        it forget them).

        Kafka's Cleaner keeps an active producer's last batch, emptied if need be
        (BatchRetention.RETAIN_EMPTY), so a leader rebuilding producer state from this log
        still knows the producer's last sequence: without it, the producer's next batch is
        OUT_OF_ORDER_SEQUENCE_NUMBER, or a retry of its last one is appended again. Kafka asks
        its producer state which producers are active and where their last batch is; here a
        producer counts as active until its last batch in these segments is older than
        producer.id.expiration.ms, the rule of the producer state itself (its last batch's
        timestamp, as Kafka's ProducerStateEntry), and a later batch in a segment not cleaned
        only makes keeping it unnecessary, never wrong.
        """
        last_batch_of: dict[int, fmt.BatchHeader] = {}
        end_offset = result.end_offset
        for seg in plan.segments:
            for i, bp in enumerate(seg.scan_headers()):
                if i % _HEADERS_PER_PAUSE == 0:
                    pause()  # a stop must not wait for a scan of every header planned
                header = bp.header
                if header.base_offset >= end_offset:
                    if header.attributes & fmt.DELETE_HORIZON_FLAG:
                        result.note_horizon(header.base_timestamp)
                elif not header.is_control and header.has_producer_id:
                    last_batch_of[header.producer_id] = header
        return {
            header.last_offset: plan.now_ms - header.max_timestamp < plan.producer_id_expiration_ms
            for header in last_batch_of.values()
        }

    def is_current(self, plan: CleanPlan) -> bool:
        """Whether nothing but appends changed the log since ``plan`` was made."""
        return plan.generation == self._generation

    def swap_cleaned(self, result: CleanResult) -> CleanerStats | None:
        """Swap the cleaned copies in (on the owner thread). None, with the copies deleted, if
        the log changed since the pass was planned, or is no longer compacted (Kafka's
        ``LogManager.updateTopicConfig`` aborts the cleaning of a log whose cleanup.policy
        drops compact)."""
        plan = result.plan
        if not self.is_current(plan) or not self.config.compact:
            self._delete_cleaned(result)
            return None
        self._generation += 1
        for group, cleaned in result.cleaned:
            if cleaned is None:
                continue
            # Kafka's LocalLog.replaceSegments: the copy becomes a .swap (complete: a crash
            # from here on swaps it in at the next start, _finish_interrupted_swaps), the
            # group's segments go, then the copy takes the first one's name.
            cleaned.rename_suffix(CLEANED_SUFFIX, SWAP_SUFFIX)
            i = self.segments.index(group[0])
            assert self.segments[i : i + len(group)] == group, "cleaned segments moved"
            for seg in group:
                self.remove_files(seg.retire())
            cleaned.rename_suffix(SWAP_SUFFIX, "")
            del self.segments[i : i + len(group)]
            del self._bases[i : i + len(group)]
            if cleaned.size == 0 and i > 0:
                cleaned.delete()
            else:
                # An emptied first segment stays so the log keeps its start offset on reopening.
                cleaned.next_offset = max(cleaned.next_offset, group[-1].next_offset)
                self.segments.insert(i, cleaned)
                self._bases.insert(i, cleaned.base_offset)
        # The renames reach the disk before the cleaned segments are relied on (Kafka's
        # LocalLog.replaceSegments flushes the directory after them).
        checkpoint.fsync_dir(self.directory)
        self.first_dirty_offset = max(self.first_dirty_offset, result.end_offset)
        self.delete_horizon_ms = result.delete_horizon_ms
        if result.last_tombstone_dropped >= 0:
            self.tombstone_drops += 1
            self.tombstones_dropped_up_to.append(result.last_tombstone_dropped)
        return result.stats

    def _delete_cleaned(self, result: CleanResult) -> None:
        for _group, cleaned in result.cleaned:
            if cleaned is not None:
                cleaned.delete()
        result.cleaned.clear()

    def _clean_group(
        self,
        group: list[LogSegment],
        last_offset_of: dict[bytes, int],
        *,
        producers_last: dict[int, bool],
        kept_producers: set[int],
        result: CleanResult,
        pause: Callable[[], object],
    ) -> LogSegment | None:
        """The cleaned copy of a group of consecutive segments (a ``.cleaned`` file based at the
        first one's offset, Kafka's ``Cleaner.cleanSegments``); None if the group is one
        segment and nothing in it goes.

        Read and written in runs of batches of about ``_CLEAN_IO_BYTES`` (Kafka's cleaner
        I/O buffers): the segment was read whole, and its copy built whole, about three times
        a segment's size in memory at once."""
        stats = result.stats
        out = bytearray()
        out_headers: list[tuple[int, fmt.BatchHeader]] = []
        changed = len(group) > 1  # merged: the copy replaces them, whatever it drops
        cleaned: LogSegment | None = None

        def flush() -> LogSegment:
            # The copy exists once its first run is written, whether or not anything changed
            # yet: it is deleted at the end if nothing did.
            nonlocal cleaned
            if cleaned is None:
                # Opened without truncation, a copy left over (an unlink that failed) would
                # be written after: Kafka's createNewCleanedSegment deletes it first.
                _delete_segment_files(self.directory, group[0].base_offset, CLEANED_SUFFIX)
                cleaned = LogSegment(
                    self.directory,
                    group[0].base_offset,
                    index_interval_bytes=self.config.index_interval_bytes,
                    index_max_bytes=self.config.segment_index_bytes,
                    suffix=CLEANED_SUFFIX,
                    create=True,
                )
            if out_headers:
                cleaned.append(out, out_headers)
            out.clear()
            out_headers.clear()
            return cleaned

        try:
            for seg, data, pos, header in _group_batches_in_runs(group):
                pause()
                # The clean part is read first here (the dirty part, mapped, is checked again).
                _raise_if_crc_invalid(seg, data, pos, header)
                stats.bytes_read += header.size
                raw = data[pos : pos + header.size]
                if header.is_control or header.base_offset >= result.end_offset:
                    # Above where a full key map stopped nothing is cleaned yet: a tombstone
                    # there may still have older values below it that this pass kept (Kafka's
                    # Cleaner.shouldRetainRecord keeps a record past the map's latest offset).
                    kept_raw: bytes | None = raw
                else:
                    kept_raw = self._clean_batch(raw, header, last_offset_of, result)
                    # An expired producer's last batch goes, unless an earlier batch of it
                    # stays: a state rebuilt from this log would take that one for the last
                    # and the producer for active, at an old sequence (beyond Kafka, whose
                    # producer snapshots keep a rebuild from starting below them).
                    if kept_raw is None and (
                        producers_last.get(header.last_offset)
                        or (
                            header.last_offset in producers_last
                            and header.producer_id in kept_producers
                        )
                    ):
                        kept_raw = raw if header.record_count == 0 else fmt.empty_batch(header)
                    if kept_raw is not None and header.has_producer_id:
                        kept_producers.add(header.producer_id)
                if kept_raw is not raw:
                    changed = True
                if kept_raw is None:
                    continue
                out_headers.append((len(out), fmt.parse_header(kept_raw)))
                out += kept_raw
                if len(out) >= _CLEAN_IO_BYTES:
                    flush()
            stats.segments_cleaned += len(group)
            if not changed:
                if cleaned is not None:
                    cleaned.delete()
                return None
            cleaned = flush()
            cleaned.on_roll()
            # The last original's modification time (Cleaner.cleanSegments): a segment left
            # without timestamps ages by it, and a fresh one held back time retention of every
            # expired segment behind an emptied first one for another retention.ms.
            original = os.stat(group[-1].log_path)
            os.utime(cleaned.log_path, ns=(original.st_atime_ns, original.st_mtime_ns))
        except BaseException:
            if cleaned is not None:
                cleaned.delete()
            raise
        stats.bytes_written += cleaned.size
        return cleaned

    def _clean_batch(
        self,
        raw: bytes,
        header: fmt.BatchHeader,
        last_offset_of: dict[bytes, int],
        result: CleanResult,
    ) -> bytes | None:
        now_ms, stats = result.plan.now_ms, result.stats
        records = fmt.decode_records(raw)
        stats.records_read += len(records)
        has_horizon = bool(header.attributes & fmt.DELETE_HORIZON_FLAG)
        horizon_passed = has_horizon and now_ms >= header.base_timestamp
        kept: list[fmt.Record] = []
        for r in records:
            # A key the map lacks (its records all lie below the dirty part, or above where
            # a full map stopped) keeps its record (Kafka's Cleaner.shouldRetainRecord).
            if r.key is None or last_offset_of.get(_map_key(r.key), -1) > r.offset:
                continue
            if r.value is None and horizon_passed:
                stats.tombstones_dropped += 1
                result.last_tombstone_dropped = r.offset
                continue
            kept.append(r)
        stats.records_kept += len(kept)
        if not kept:
            return None
        keeps_tombstone = any(r.value is None for r in kept)
        needs_horizon = not has_horizon and keeps_tombstone
        delete_horizon_ms: int | None = None
        if needs_horizon:
            delete_horizon_ms = now_ms + self.config.delete_retention_ms
        elif has_horizon:
            delete_horizon_ms = header.base_timestamp
        if keeps_tombstone and delete_horizon_ms is not None:
            result.note_horizon(delete_horizon_ms)
        if len(kept) == len(records) and not needs_horizon:
            return raw
        # A producer's batch keeps its max timestamp: it is when the producer last wrote, by
        # which the cleaner (_last_batches_of_producers) and a producer state rebuilt from the
        # log judge whether the producer is still active. Recomputed from the records kept
        # (Kafka's filterTo does, its cleaner asking the live producer state instead), a
        # batch whose recent records were compacted away aged the producer to its oldest
        # record kept: a later pass dropped its last batch, and a rebuilt state expired it, so
        # a retry of that batch was appended again. Lookups by timestamp go on past a batch
        # whose records are all older than its max timestamp (LogSegment.find_offset_by_timestamp).
        max_timestamp = header.max_timestamp if header.has_producer_id else None
        return fmt.rebuild_batch(
            header, kept, delete_horizon_ms=delete_horizon_ms, max_timestamp=max_timestamp
        )

    # -----------------------------------------------------------------------------------------
    # Lifecycle.

    def close(self) -> None:
        """fsync and close every segment; the log is then cleanly shut down."""
        self._generation += 1
        self._closed = True
        self.flush()
        self.epoch_cache.flush()
        for seg in self.segments:
            seg.close()

    def abandon(self) -> None:
        """Close every segment without flushing (the log is being deleted); a cleaning pass
        planned before is thrown away at its swap."""
        self._generation += 1
        self._closed = True
        for seg in self.segments:
            seg.close()

    def delete(self) -> None:
        self.abandon()
        shutil.rmtree(self.directory, ignore_errors=True)


_MD5_BYTES = 16


def _map_key(key: bytes) -> bytes:
    """A key as the cleaner's map holds it: itself up to 16 bytes, else its MD5 behind a zero
    byte (17 bytes, so never a key held as itself). Kafka's SkimpyOffsetMap holds the MD5 of
    every key: a map entry costs the same whatever the key's length."""
    if len(key) <= _MD5_BYTES:
        return key
    return b"\x00" + hashlib.md5(key, usedforsecurity=False).digest()


def _raise_if_crc_invalid(seg: LogSegment, data: bytes, pos: int, header: fmt.BatchHeader) -> None:
    if not fmt.is_crc_valid(data, pos, header):
        where = f"batch at offset {header.base_offset}"
        raise LogCorruptError(f"{seg.log_path}: CRC mismatch in {where}")


def _raise_if_not_a_batch(records: bytes) -> None:
    """Produced records shorter than a batch header: refused with the precise error."""
    if len(records) < fmt.HEADER_SIZE:
        if not records:
            raise InvalidRecordError("no record batch in the request")
        fmt.parse_header(records)  # raises


def _raise_if_count_disagrees(record_count: int, last_offset_delta: int, pos: int) -> None:
    """Kafka's ``LogValidator.validateBatch``: a producer's batch holds one record per offset
    of its range; else offsets would be served twice, or skipped. (An empty control batch,
    which no producer sends, is let through as before.)"""
    if record_count != last_offset_delta + 1 and record_count != 0:
        raise InvalidRecordError(
            f"batch at position {pos}: inconsistent offset range [0, {last_offset_delta}] and "
            f"count of records {record_count}"
        )


# How much the cleaner reads, and builds of a cleaned copy, at a time (Kafka's
# log.cleaner.io.buffer.size is 512 KiB, grown for a larger batch).
_CLEAN_IO_BYTES = 1024 * 1024


def _groups_for_cleaning(
    segments: list[LogSegment], max_bytes: int, max_index_bytes: int
) -> Iterator[list[LogSegment]]:
    """Consecutive segments cleaned into one copy (Kafka's ``Cleaner.groupSegmentsBySize``):
    while their files together fit ``segment.bytes`` and their indexes
    ``segment.index.bytes``, and every offset stays within an index entry's 32-bit reach of
    the first segment's base. Cleaned one for one, the segments of a compacted log whose keys
    seldom change stayed one small file per roll for ever."""
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size = segments[i].size
        index_bytes = segments[i].offset_index.size_in_bytes
        time_index_bytes = segments[i].time_index.size_in_bytes
        i += 1
        while i < len(segments):
            seg = segments[i]
            if (
                size + seg.size > max_bytes
                or index_bytes + seg.offset_index.size_in_bytes > max_index_bytes
                or time_index_bytes + seg.time_index.size_in_bytes > max_index_bytes
                or (seg.size > 0 and seg.next_offset - 1 - group[0].base_offset > _INT32_MAX)
            ):
                break
            group.append(seg)
            size += seg.size
            index_bytes += seg.offset_index.size_in_bytes
            time_index_bytes += seg.time_index.size_in_bytes
            i += 1
        yield group


def _group_batches_in_runs(
    group: list[LogSegment],
) -> Iterator[tuple[LogSegment, bytes, int, fmt.BatchHeader]]:
    for seg in group:
        for data, pos, header in _batches_in_runs(seg):
            yield seg, data, pos, header


def _batches_in_runs(seg: LogSegment) -> Iterator[tuple[bytes, int, fmt.BatchHeader]]:
    """Every batch of ``seg`` as (run, position in the run, header), read a run of whole
    batches of about ``_CLEAN_IO_BYTES`` at a time (a larger batch alone), not the segment
    whole."""
    run_bytes = _CLEAN_IO_BYTES
    run: list[tuple[int, fmt.BatchHeader]] = []
    start = end = 0

    def read() -> Iterator[tuple[bytes, int, fmt.BatchHeader]]:
        data = seg.read_at(start, end - start)
        for position, header in run:
            yield data, position - start, header

    for bp in seg.scan_headers():
        if run and bp.position + bp.header.size - start > run_bytes:
            yield from read()
            run = []
        if not run:
            start = bp.position
        run.append((bp.position, bp.header))
        end = bp.position + bp.header.size
    if run:
        yield from read()


# The swaps that dropped a tombstone whose highest such offset a log keeps (newest last): a
# reader that missed more of them since it last looked starts over.
TOMBSTONE_DROPS_KEPT: Final = 64


# The smallest record: its length, attributes, timestamp delta, offset delta, key length, value
# length and header count, a byte each.
_MIN_RECORD_BYTES = 7


def _base_offset_not_zero(partition: str, base_offset: int) -> InvalidRecordError:
    """``UnifiedLog.analyzeAndValidateRecords``: a producer's batch starts at offset 0, the
    leader assigning the real ones."""
    return InvalidRecordError(
        f"The baseOffset of the record batch in the append to {partition} should be 0, "
        f"but it is {base_offset}"
    )


def _raise_if_body_too_small(header: fmt.BatchHeader, pos: int) -> None:
    """An uncompressed batch claiming more records than its body can hold (a 70-byte batch
    claimed a million offsets): refused with Kafka's message before its records are read
    (``_records_max_timestamp``)."""
    body = header.size - fmt.HEADER_SIZE
    if (
        header.compression is fmt.Compression.NONE
        and header.record_count * _MIN_RECORD_BYTES > body
    ):
        raise InvalidRecordError(
            f"batch at position {pos}: Incorrect declared batch size, premature EOF reached: "
            f"{header.record_count} records in {body} bytes"
        )


def _records_max_timestamp(
    records: bytes, pos: int, size: int, attributes: int, record_count: int
) -> int:
    """The greatest timestamp of the batch's records (-1 if none has one): Kafka's
    ``LogValidator`` gives a batch that as its max timestamp (``setMaxTimestamp``) whatever
    the producer's header said, and the time index, retention and ListOffsets read it. A batch
    whose records are not exactly the ``record_count`` it declares, each whole, is refused: no
    reader could decode it, and stored it would stop every consumer of the partition at its
    offset. Kafka's ``LogValidator`` reads every record of a batch a producer sends
    (``DefaultRecordBatch``: "Incorrect declared batch size") and decompresses a compressed
    one first; so does this, through aiokafka's C record reader (a compressed body within
    ``fmt.MAX_DECOMPRESSED_BYTES``): five times as fast as kcoord's own decoder. It costs
    about 12 us for 100 records of 100 B, 4 of them reading the timestamps
    (``make bench-storage``)."""
    plain: bytearray | memoryview
    codec = attributes & fmt.COMPRESSION_MASK
    if not codec:
        plain = memoryview(records)[pos : pos + size]
    else:
        body = fmt.decompress(
            fmt.Compression(codec), memoryview(records)[pos + fmt.HEADER_SIZE : pos + size]
        )
        plain = bytearray(records[pos : pos + fmt.HEADER_SIZE])
        plain[8:12] = (len(plain) + len(body) - fmt.LOG_OVERHEAD).to_bytes(4, "big")
        plain[fmt.ATTRIBUTES_OFFSET + 1] &= ~fmt.COMPRESSION_MASK & 0xFF
        plain += body
    greatest = fmt.NO_TIMESTAMP
    try:
        try:
            if not codec:
                for record in _CRecordBatch(plain):  # exactly the records declared, or it raises
                    timestamp = record.timestamp
                    if timestamp > greatest:  # noqa: PLR1730 (a call of max() a record costs more)
                        greatest = timestamp
            else:
                # LogValidator: a compressed batch's records at offsets 0, 1, 2, ... or it is
                # rebuilt so (an uncompressed one is taken as it is, as Kafka's).
                expected = _base_offset(records, pos)
                for record in _CRecordBatch(plain):
                    timestamp = record.timestamp
                    if timestamp > greatest:  # noqa: PLR1730
                        greatest = timestamp
                    if record.offset != expected:
                        raise _InnerOffsetsNotConsecutiveError
                    expected += 1
        except UnicodeDecodeError:
            # aiokafka's reader decodes header keys strictly; Kafka reads them leniently
            # (``Utils.utf8``), so a batch with a key that is not UTF-8 is read again with
            # kcoord's own decoder, which checks the same and keeps such a key.
            decoded = fmt.decode_records(records, pos)
            if codec and decoded != _consecutive(_base_offset(records, pos), decoded):
                raise _InnerOffsetsNotConsecutiveError from None
            greatest = max([greatest, *(r.timestamp for r in decoded)])
    except (CorruptRecordException, fmt.RecordFormatError) as e:
        raise InvalidRecordError(
            f"batch at position {pos}: Incorrect declared batch size, {record_count} records "
            f"declared: {e}"
        ) from e
    return greatest


def _base_offset(records: bytes, pos: int) -> int:
    return int.from_bytes(records[pos : pos + 8], "big", signed=True)


def _consecutive(base_offset: int, records: Sequence[fmt.Record]) -> list[fmt.Record]:
    """``records`` at ``base_offset``, ``base_offset`` + 1, ..."""
    return [
        r if r.offset == base_offset + i else replace(r, offset=base_offset + i)
        for i, r in enumerate(records)
    ]


def _new_segment(directory: Path, config: LogConfig, base_offset: int) -> LogSegment:
    return LogSegment(
        directory,
        base_offset,
        index_interval_bytes=config.index_interval_bytes,
        index_max_bytes=config.segment_index_bytes,
        create=True,
    )


def _recover_segment(seg: LogSegment, limit: int, report: RecoveryReport) -> RecoveryResult:
    """Recover ``seg`` (``LogSegment.recover``), logging and reporting what it cut."""
    result = seg.recover(limit)
    report.segments_recovered += 1
    if result.truncated_bytes:
        log.warning(
            "%s: truncated %d bytes of segment %d at offset %d: %s",
            seg.log_path.parent,
            result.truncated_bytes,
            seg.base_offset,
            result.next_offset,
            result.error,
        )
        report.bytes_truncated += result.truncated_bytes
        report.errors.append(f"segment {seg.base_offset}: {result.error}")
    return result


def _segment_bases(directory: Path) -> list[int]:
    bases: list[int] = []
    for path in directory.iterdir():
        name = path.name
        if name.endswith(LOG_SUFFIX):
            stem = name[: -len(LOG_SUFFIX)]
            if is_offset_name(stem):
                bases.append(int(stem))
            else:
                log.warning("%s: ignoring file with a non-offset name %s", directory, name)
    bases.sort()
    # Index files without a log are leftovers: remove them (they are rebuilt anyway).
    for path in directory.iterdir():
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            stem = path.name[: -len(suffix)]
            if path.name.endswith(suffix) and is_offset_name(stem) and int(stem) not in bases:
                path.unlink(missing_ok=True)
    return bases


def _finish_interrupted_swaps(directory: Path) -> None:
    """Complete or discard compaction swaps interrupted by a crash (Kafka's ``LogLoader``).

    ``.cleaned`` files were not complete: delete them. A ``.swap`` log was complete and fsynced
    before the rename: it replaces the segments of its offset range, the one of the same base
    offset and any later one of the group it merged that was not yet deleted
    (``LogLoader.completeSwapOperations``). A segment of the group past the copy's last batch
    (all of it cleaned away) stays as it was, as in Kafka: it holds only records later ones
    supersede, so the log reads as partly cleaned. ``.deleted`` and ``.tmp`` files are
    leftovers to remove.
    """
    for path in list(directory.iterdir()):
        name = path.name
        if name.endswith((CLEANED_SUFFIX, DELETED_SUFFIX, ".tmp")):
            path.unlink(missing_ok=True)
    swapped_logs = [p for p in directory.iterdir() if p.name.endswith(LOG_SUFFIX + SWAP_SUFFIX)]
    for path in swapped_logs:
        target = path.with_name(path.name[: -len(SWAP_SUFFIX)])
        swap_base = int(target.name[: -len(LOG_SUFFIX)])
        swap_end = _swap_end_offset(path, swap_base)
        for other in list(directory.iterdir()):
            stem = other.name[: -len(LOG_SUFFIX)]
            if (
                other.name.endswith(LOG_SUFFIX)
                and is_offset_name(stem)
                and swap_base < int(stem) < swap_end
            ):
                log.warning(
                    "%s: deleting %s, merged into the interrupted compaction swap of %s",
                    directory,
                    other.name,
                    target.name,
                )
                _delete_segment_files(directory, int(stem))
        # The indexes may belong to either version: dropped, recovery rebuilds them. Before
        # the rename: a crash between the two left the old segment's indexes beside the copy.
        base = target.name[: -len(LOG_SUFFIX)]
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (directory / (base + suffix)).unlink(missing_ok=True)
        path.replace(target)
        log.warning("%s: completed interrupted compaction swap of %s", directory, target.name)
    for path in list(directory.iterdir()):
        if path.name.endswith(SWAP_SUFFIX):
            path.unlink(missing_ok=True)


def _swap_end_offset(path: Path, base_offset: int) -> int:
    """One past the last offset of a complete ``.swap`` segment (its base if it holds no
    batch), reading only its batch headers."""
    end = base_offset
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position + fmt.HEADER_SIZE <= size:
            header = fmt.BatchHeader._make(
                fmt.HEADER.unpack(os.pread(fd, fmt.HEADER_SIZE, position))
            )
            if header.size <= fmt.LOG_OVERHEAD:
                break  # not a batch: the rest is for recovery to judge
            end = max(end, header.last_offset + 1)
            position += header.size
    finally:
        os.close(fd)
    return end


def _delete_segment_files(directory: Path, base_offset: int, extra_suffix: str = "") -> None:
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        (directory / f"{base_offset:020d}{suffix}{extra_suffix}").unlink(missing_ok=True)
