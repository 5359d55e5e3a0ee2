"""One log segment: ``<base offset>.log`` with its ``.index`` and ``.timeindex``.

File names are the segment's base offset as 20 zero-padded digits (``LogFileUtils`` in
Kafka), e.g. ``00000000000000001234.log``. The ``.log`` file is a plain sequence of v2 record
batches (see ``format``); the indexes are described in ``index``.

Appends go straight to the file with ``pwrite`` (no user-space buffer), so a batch whose append
returned survives the death of the process; it survives the death of the machine once flushed
(``flush``: fsync). The segment tracks the largest timestamp and the offset holding it, and adds
an index entry after every ``index.interval.bytes`` of appended data, as Kafka's ``LogSegment``.

Suffixes: ``.cleaned`` (compaction output being written), ``.swap`` (complete compaction output
waiting to replace the original) and ``.deleted`` (scheduled for removal). Recovery in ``log``
finishes or discards these.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kcoord.storage import format as fmt
from kcoord.storage.index import IndexCorruptError, OffsetIndex, TimeIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"

# Reads scan batch headers in chunks this large; an index entry is at most
# index.interval.bytes (4096) before the target, so one chunk usually suffices.
_SCAN_CHUNK = 16 * 1024
_RECOVER_CHUNK = 8 * 1024 * 1024
# The largest offset a segment holds is its base plus this (Kafka's
# LogSegment.ensureOffsetInRange, an int): its indexes store offsets relative to the base.
MAX_RELATIVE_OFFSET = 2**31 - 1


def _claimed_batch_end(data: bytes) -> int | None:
    """Where the batch at the start of ``data`` says it ends (its length field), if known."""
    if len(data) < fmt.LOG_OVERHEAD:
        return None
    return int.from_bytes(data[8 : fmt.LOG_OVERHEAD], "big", signed=True) + fmt.LOG_OVERHEAD


# How many of the latest appended batches a segment remembers the offsets and positions of:
# reads at the tail (followers, hot standbys, consumers that keep up) then need no header scan.
_TAIL_BATCHES = 1024


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def is_offset_name(stem: str) -> bool:
    """The offset part of a segment's (or producer snapshot's) file name: 20 ASCII digits.
    ``str.isdigit`` alone takes other scripts' digits too (``int`` reads Arabic-Indic zeros as
    0): a stray file so named was a second segment 0, which cut the real one to nothing on
    load."""
    return len(stem) == 20 and stem.isascii() and stem.isdigit()


class LogCorruptError(fmt.CorruptRecordError):
    """A batch on disk that fails its CRC or does not parse; it is never served."""


@dataclass(frozen=True, slots=True)
class BatchPosition:
    position: int
    header: fmt.BatchHeader


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    valid_bytes: int
    truncated_bytes: int
    next_offset: int
    error: str | None
    # (leader epoch, base offset) of each kept batch whose epoch differs from the one before:
    # the log gives them back to the leader epoch cache (Kafka's LogSegment.recover).
    epochs: tuple[tuple[int, int], ...] = ()


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        index_max_bytes: int,
        suffix: str = "",
        create: bool = False,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        log_path = directory / (segment_file_name(base_offset, LOG_SUFFIX) + suffix)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.log_path = log_path
        self._fd = os.open(log_path, flags, 0o644)
        self.size = os.fstat(self._fd).st_size
        self.offset_index = OffsetIndex(
            directory / (segment_file_name(base_offset, INDEX_SUFFIX) + suffix),
            base_offset,
            index_max_bytes,
        )
        self.time_index = TimeIndex(
            directory / (segment_file_name(base_offset, TIME_INDEX_SUFFIX) + suffix),
            base_offset,
            index_max_bytes,
        )
        self._bytes_since_index_entry = 0
        # Offset after the last batch; the base offset while empty.
        self.next_offset = base_offset
        self.max_timestamp = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self.first_batch_timestamp: int | None = None
        # When the log first appended to it in this process (segment.ms for segments whose
        # first batch has no timestamp: Kafka's ``created``, the time the segment was opened).
        self.created_ms: int | None = None
        # The batches appended since the segment was opened (or last truncated or recovered),
        # oldest first, contiguous up to the end of the file: base offsets, last offsets,
        # positions. Kafka reads its index and scans the file each time; in Python the scan
        # is what costs.
        self._tail_base: list[int] = []
        self._tail_last: list[int] = []
        self._tail_position: list[int] = []

    # -----------------------------------------------------------------------------------------
    # Opening.

    def offset_limit(self, next_base: int | None) -> int:
        """The most this segment's next offset can be: the next segment's base, and what its
        indexes can hold."""
        limit = self.base_offset + MAX_RELATIVE_OFFSET + 1
        return limit if next_base is None else min(limit, next_base)

    def load(self, max_next_offset: int | None = None) -> None:
        """Open a segment that was closed cleanly: load its indexes, derive its end.

        Indexes that do not match the log, a log whose tail is not whole batches, or one that
        ends past ``max_next_offset`` (``offset_limit``) raise ``LogCorruptError``: the caller
        recovers the segment (which rebuilds its indexes) and reports what that cut.
        """
        try:
            self.offset_index.load(self.size)
            self.time_index.load(2**62)
        except IndexCorruptError as e:
            # Recovered by the caller, which reports what the rebuild's scan cuts (Kafka's
            # LogLoader recovers a segment on CorruptIndexException): recovered here, a corrupt
            # batch found by that scan was cut with no word of the records lost.
            raise LogCorruptError(f"{self.log_path}: its indexes must be rebuilt: {e}") from e
        indexed, position = self.offset_index.lookup(2**62)
        last: BatchPosition | None = None
        for bp in self.scan_headers(self._largest_timestamp_scan_start(position)):
            # Offsets go up and the indexed batch ends where its entry says (the base offset is
            # outside the CRC): a flipped bit that sent one back made the segment end there,
            # and readers looped.
            floor = self.base_offset if last is None else last.header.next_offset
            if bp.header.base_offset < floor or (
                bp.position == position and position and bp.header.last_offset != indexed
            ):
                raise LogCorruptError(
                    f"{self.log_path}: batch at position {bp.position} has base offset "
                    f"{bp.header.base_offset}: below the previous batch's end, or not the "
                    "batch its index entry names"
                )
            last = bp
            self._note_batch(bp.header)
        if last is not None:
            end = last.position + last.header.size
            if end != self.size:
                raise LogCorruptError(f"{self.log_path}: {self.size - end} bytes after last batch")
            if max_next_offset is not None and last.header.next_offset > max_next_offset:
                raise LogCorruptError(
                    f"{self.log_path}: its last batch ends at offset {last.header.last_offset}, "
                    f"past the segment's last possible offset {max_next_offset - 1}"
                )
            self.next_offset = last.header.next_offset
        elif self.size:
            raise LogCorruptError(f"{self.log_path}: no batch at indexed position {position}")
        first = self.first_batch()
        if first is not None:
            self.first_batch_timestamp = first.header.max_timestamp
        # The largest timestamp: from the time index, then the batches after its last entry.
        entry = self.time_index.last_entry
        if entry is not None and entry[0] > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = entry
        self._bytes_since_index_entry = self.size - position

    def recover(self, max_next_offset: int | None = None) -> RecoveryResult:
        """Rebuild the indexes by scanning every batch; truncate at the first invalid one.

        Kafka's ``LogSegment.recover``: CRC-check each batch, rebuild the offset and time
        indexes, and cut a torn or corrupt tail. A batch ending past ``max_next_offset``
        (``offset_limit``) is corrupt too: its base offset, outside the CRC, is wrong (Kafka's
        ``ensureOffsetInRange``). Returns what was kept and why the rest was not, and where
        each leader epoch of the kept batches starts.
        """
        if max_next_offset is None:
            max_next_offset = self.offset_limit(None)
        self.offset_index.reset()
        self.time_index.reset()
        self._forget_tail()  # a recovered segment reads through its rebuilt index
        self._bytes_since_index_entry = 0
        self.next_offset = self.base_offset
        self.max_timestamp = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp = None
        position = 0
        error: str | None = None
        carry = b""
        expect = self.base_offset
        want = _RECOVER_CHUNK
        epochs: list[tuple[int, int]] = []
        while position + len(carry) < self.size:
            chunk = carry + os.pread(self._fd, want, position + len(carry))
            want = _RECOVER_CHUNK
            result = fmt.scan_valid_prefix(
                chunk, expect_next_offset=expect, max_next_offset=max_next_offset
            )
            for pos, header in result.headers:
                self._index_batch(position + pos, header)
                epoch = header.partition_leader_epoch
                if epoch >= 0 and (not epochs or epochs[-1][0] != epoch):
                    epochs.append((epoch, header.base_offset))
            if result.headers:
                expect = result.headers[-1][1].next_offset
            position += result.valid_bytes
            carry = chunk[result.valid_bytes :]
            at_end = position + len(carry) >= self.size
            if result.error is None:
                continue
            torn = result.error.startswith(("torn", "truncated batch header"))
            if torn and not at_end:
                # The batch spans the chunk boundary: read the rest of it at once, unless its
                # length runs past the end of the file (a torn tail, or a corrupt length,
                # which would otherwise be read on chunk by chunk to the end).
                end = _claimed_batch_end(carry)
                if end is None or position + end <= self.size:
                    want = max(_RECOVER_CHUNK, (end or 0) - len(carry))
                    continue
                result = result._replace(error=f"batch at {position} runs past the segment end")
            error = result.error
            break
        truncated = self.size - position
        if truncated:
            os.ftruncate(self._fd, position)
            self.size = position
        return RecoveryResult(position, truncated, self.next_offset, error, tuple(epochs))

    # -----------------------------------------------------------------------------------------
    # Appending.

    def append(
        self, data: bytes | bytearray, headers: Sequence[tuple[int, fmt.BatchHeader]]
    ) -> None:
        """Append whole batches; ``headers`` are their (position in ``data``, header)."""
        assert headers, "nothing to append"
        first = headers[0][1]
        assert first.base_offset >= self.next_offset, (first.base_offset, self.next_offset)
        position = self.size
        self._write_fully(memoryview(data), position)
        self.size += len(data)
        for pos, header in headers:
            self._remember(header.base_offset, header.last_offset, position + pos)
            self._index_batch(position + pos, header)

    def _write_fully(self, data: memoryview, position: int) -> None:
        """Write all of ``data`` at ``position``: after a short write (a disk filling up)
        the next write of the rest fails with the reason (ENOSPC, EIO, ...), raised as
        ``OSError``. A failed append leaves ``size`` alone; the torn bytes past it are
        overwritten by the next append, or cut off by recovery."""
        done = 0
        while done < len(data):
            written = os.pwrite(self._fd, data[done:], position + done)
            if written == 0:
                raise OSError(f"no progress writing {self.log_path} at byte {position + done}")
            done += written

    def append_one(
        self,
        prefix: bytes | bytearray,
        rest: memoryview,
        *,
        base_offset: int,
        last_offset: int,
        max_timestamp: int,
    ) -> None:
        """Append one batch given as its rewritten 16-byte prefix (``base_offset`` is the one
        written there) and the rest, unchanged.

        The produce fast path: one ``pwritev``, no copy of the batch, the same index updates
        as ``append`` (Kafka's ``LogSegment.append`` of a single batch).
        """
        position = self.size
        size = len(prefix) + len(rest)
        written = os.pwritev(self._fd, [prefix, rest], position)
        if written != size:  # the rest, from where the short write stopped
            whole = memoryview(bytes(prefix) + bytes(rest))
            self._write_fully(whole[written:], position + written)
        self.size = position + size
        self._remember(base_offset, last_offset, position)
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = max_timestamp
        self.next_offset = last_offset + 1
        if self._bytes_since_index_entry > self.index_interval_bytes:
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size

    def _index_batch(self, position: int, header: fmt.BatchHeader) -> None:
        self._note_batch(header)
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = header.max_timestamp
        self.next_offset = header.next_offset
        # As Kafka's LogSegment.append: index this batch when the bytes appended since the last
        # entry exceed the interval, counting only the batches before it.
        if self._bytes_since_index_entry > self.index_interval_bytes:
            # A rebuild (recovery) of a segment written under a larger segment.index.bytes
            # may find the index full: the index stays sparser there (a lookup scans on from
            # its last entry), rather than the segment failing to load.
            if not self.offset_index.is_full:
                self.offset_index.append(header.last_offset, position)
            if not self.time_index.is_full:
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size

    def _remember(self, base_offset: int, last_offset: int, position: int) -> None:
        self._tail_base.append(base_offset)
        self._tail_last.append(last_offset)
        self._tail_position.append(position)
        if len(self._tail_base) > 2 * _TAIL_BATCHES:
            del self._tail_base[:_TAIL_BATCHES]
            del self._tail_last[:_TAIL_BATCHES]
            del self._tail_position[:_TAIL_BATCHES]

    def _forget_tail(self) -> None:
        self._tail_base.clear()
        self._tail_last.clear()
        self._tail_position.clear()

    def _tail_index(self, offset: int) -> int | None:
        """Where in the remembered tail the first batch ending at or after ``offset`` is;
        None when that batch is older than the tail (or there is none)."""
        if not self._tail_base or offset < self._tail_base[0]:
            return None
        i = bisect.bisect_left(self._tail_last, offset)
        return i if i < len(self._tail_last) else None

    def _largest_timestamp_scan_start(self, position: int) -> int:
        """Where to scan from for the largest timestamp the time index does not hold.

        Both indexes take their entries together, the time index the largest timestamp so
        far, so it holds the largest one up to the offset index's last entry (``position``),
        and the scan starts there. Not when it stopped taking entries: a time index that filled
        first (a rebuild under a smaller ``segment.index.bytes``: its entries are larger), or
        one with none; then the scan starts at its last entry, as Kafka's
        ``readLargestTimestamp`` always does, so that a larger timestamp is not hidden from
        lookups, ListOffsets and retention."""
        entry = self.time_index.last_entry
        if entry is None:
            return 0
        if not self.time_index.is_full:
            return position
        return min(position, self.offset_index.lookup(entry[1])[1])

    def _note_batch(self, header: fmt.BatchHeader) -> None:
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset

    # -----------------------------------------------------------------------------------------
    # Reading.

    def read_at(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def scan_headers(self, position: int = 0, end: int | None = None) -> Iterator[BatchPosition]:
        """Batch headers from ``position`` (a batch boundary) up to ``end``, CRC unchecked."""
        end = self.size if end is None else end
        buf = b""
        buf_start = position
        while position < end:
            rel = position - buf_start
            if len(buf) - rel < fmt.HEADER_SIZE:
                buf = os.pread(self._fd, max(_SCAN_CHUNK, fmt.HEADER_SIZE), position)
                buf_start = position
                rel = 0
            try:
                header = fmt.parse_header(buf, rel)
            except fmt.RecordFormatError as e:
                raise LogCorruptError(f"{self.log_path}: {e}") from e
            if position + header.size > end:
                raise LogCorruptError(f"{self.log_path}: batch at {position} runs past the end")
            yield BatchPosition(position, header)
            position += header.size

    def first_batch(self) -> BatchPosition | None:
        return next(self.scan_headers(0), None)

    def translate_offset(self, offset: int) -> BatchPosition | None:
        """The first batch whose last offset is at or above ``offset``, or None."""
        i = self._tail_index(offset)
        if i is not None:
            return next(self.scan_headers(self._tail_position[i]), None)
        _, position = self.offset_index.lookup(offset)
        for bp in self.scan_headers(position):
            if bp.header.last_offset >= offset:
                return bp
        return None

    def read(
        self, start_offset: int, max_bytes: int, *, max_offset: int | None, min_one: bool
    ) -> tuple[bytes, int] | None:
        """Whole batches from the one holding ``start_offset``: (bytes, base offset).

        Reads at most ``max_bytes`` (but one whole batch when ``min_one``), only batches ending
        before ``max_offset`` (the high watermark, exclusive). Each batch's CRC is checked: a
        corrupt batch raises ``LogCorruptError`` and is never returned. None when the segment
        has no batch at or after ``start_offset``; empty bytes when one exists but the limits
        exclude it.
        """
        i = self._tail_index(start_offset)
        batches: Iterable[tuple[int, int]]  # (next offset, size) from the first batch on
        if i is not None:
            start_position, base_offset = self._tail_position[i], self._tail_base[i]
            batches = self._tail_batches(i)
        else:
            start = self.translate_offset(start_offset)
            if start is None:
                return None
            start_position, base_offset = start.position, start.header.base_offset
            batches = (
                (bp.header.next_offset, bp.header.size) for bp in self.scan_headers(start_position)
            )
        end = start_position
        for next_offset, size in batches:
            if max_offset is not None and next_offset > max_offset:
                break
            if end + size - start_position > max_bytes and not (min_one and end == start_position):
                break
            end += size
        if end == start_position:
            return b"", base_offset
        data = self.read_at(start_position, end - start_position)
        for pos, header in fmt.iter_headers(data):
            if not fmt.is_crc_valid(data, pos, header):
                raise LogCorruptError(
                    f"{self.log_path}: CRC mismatch in batch at offset {header.base_offset} "
                    f"(position {start_position + pos})"
                )
        return data, base_offset

    def _tail_batches(self, first: int) -> Iterator[tuple[int, int]]:
        """(next offset, size) of the remembered batches from ``first`` on, without reading."""
        positions, lasts = self._tail_position, self._tail_last
        for j in range(first, len(positions)):
            end = positions[j + 1] if j + 1 < len(positions) else self.size
            yield lasts[j] + 1, end - positions[j]

    def max_timestamp_from(self, start_offset: int) -> int:
        """The largest timestamp of the records at or after ``start_offset`` (-1: none); the
        segment's own maximum when they are all of them."""
        if start_offset <= self.base_offset:
            return self.max_timestamp
        start = self.translate_offset(start_offset)
        if start is None:
            return -1
        newest = -1
        for bp in self.scan_headers(start.position):
            header = bp.header
            if header.base_offset >= start_offset:
                newest = max(newest, header.max_timestamp)
                continue
            data = self.read_at(bp.position, header.size)  # the batch holding start_offset
            if not fmt.is_crc_valid(data, 0, header):
                raise LogCorruptError(f"{self.log_path}: CRC mismatch at {bp.position}")
            for record in fmt.decode_records(data):
                if record.offset >= start_offset:
                    newest = max(newest, record.timestamp)
        return newest

    def newest_record(self, start_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``start_offset`` with the
        largest timestamp of them; None without records there. The batches' max timestamps
        find it at once, unless none of the records has the largest of them (a batch's max
        may exceed its records': an emptied batch, or one the cleaner rebuilt, keeps the time
        its producer wrote it); then every record is read."""
        bound = self.max_timestamp_from(start_offset)
        if bound < 0:
            return None
        at = self.find_offset_by_timestamp(bound, start_offset)
        if at is not None:
            return at
        start = self.translate_offset(start_offset)
        if start is None:
            return None
        newest: tuple[int, int] | None = None
        for bp in self.scan_headers(start.position):
            if bp.header.record_count == 0:
                continue
            data = self.read_at(bp.position, bp.header.size)
            if not fmt.is_crc_valid(data, 0, bp.header):
                raise LogCorruptError(f"{self.log_path}: CRC mismatch at {bp.position}")
            for record in fmt.decode_records(data):
                if record.offset >= start_offset and (
                    newest is None or record.timestamp > newest[1]
                ):
                    newest = (record.offset, record.timestamp)
        return newest

    def find_offset_by_timestamp(self, timestamp: int, start_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``timestamp`` and ``start_offset``.

        Kafka's ``LogSegment.findOffsetByTimestamp``: time index, then the offset index, then a
        scan of batches and, inside the first batch whose max timestamp is high enough, records.
        """
        _, indexed_offset = self.time_index.lookup(timestamp)
        start = self.translate_offset(max(indexed_offset, start_offset))
        if start is None:
            return None
        for bp in self.scan_headers(start.position):
            if bp.header.max_timestamp < timestamp:
                continue
            data = self.read_at(bp.position, bp.header.size)
            if not fmt.is_crc_valid(data, 0, bp.header):
                raise LogCorruptError(f"{self.log_path}: CRC mismatch at {bp.position}")
            for record in fmt.decode_records(data):
                if record.timestamp >= timestamp and record.offset >= start_offset:
                    return record.offset, record.timestamp
        return None

    # -----------------------------------------------------------------------------------------
    # Truncation, flushing and file management.

    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset is at or above ``offset``; return bytes dropped.

        A batch holding ``offset`` goes entirely (as in Kafka: the log ends at a batch boundary)
        and the segment ends at that batch's start; otherwise it ends at ``offset``, as Kafka's
        ``LocalLog.truncateTo`` sets the log end, even where compaction left a gap below the
        first batch dropped (it ended at the last batch kept, or at the segment's base, and the
        leader-epoch entries from there went with it).
        """
        bp = self.translate_offset(offset)
        if bp is None:
            # Nothing at or above ``offset``: compaction left a gap there (in this segment or
            # in the ones after it, gone), and the log ends at ``offset`` (updateLogEndOffset).
            self.next_offset = offset
            return 0
        self._forget_tail()
        position = bp.position
        dropped = self.size - position
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to_offset(bp.header.base_offset)
        os.ftruncate(self._fd, position)
        self.size = position
        # Re-derive the tail state from the remaining batches after the last index entry.
        _, index_position = self.offset_index.lookup(2**62)
        self.next_offset = self.base_offset
        self.max_timestamp = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        entry = self.time_index.last_entry
        if entry is not None:
            self.max_timestamp, self.offset_of_max_timestamp = entry
        for scanned in self.scan_headers(self._largest_timestamp_scan_start(index_position)):
            self._note_batch(scanned.header)
            self.next_offset = scanned.header.next_offset
        self.next_offset = max(self.next_offset, min(offset, bp.header.base_offset))
        if self.size == 0:
            self.first_batch_timestamp = None
        self._bytes_since_index_entry = self.size - index_position
        return dropped

    def flush(self) -> None:
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()

    def on_roll(self) -> None:
        """Trim the preallocated indexes and fsync: the segment is now read-only."""
        self.seal()
        self.flush()

    def seal(self) -> None:
        """Trim the preallocated indexes: the segment is now read-only (not yet fsynced)."""
        self.offset_index.trim()
        self.time_index.trim()

    def open_for_sync(self) -> list[int]:
        """Descriptors of the segment's three files, for ``os.fsync`` on another thread (the
        caller closes them): the segment may be closed or retired meanwhile."""
        fds = [os.dup(self._fd)]
        try:
            fds.extend(
                os.open(index.path, os.O_RDONLY) for index in (self.offset_index, self.time_index)
            )
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def close(self) -> None:
        if self._fd >= 0:
            self.offset_index.close()
            self.time_index.close()
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.offset_index.delete()
        self.time_index.delete()
        self.log_path.unlink(missing_ok=True)

    def largest_timestamp_ms(self) -> int:
        """Kafka's ``LogSegment.largestTimestamp``: the largest record timestamp, or for a
        segment without any (emptied by compaction, or all timestamps -1) the file's last
        modification time, so time retention still passes it."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return os.fstat(self._fd).st_mtime_ns // 1_000_000

    def retire(self) -> list[Path]:
        """Close the files and rename them ``.deleted``; returns the new paths for the caller
        to remove, later and off the event loop if it likes (Kafka's ``asyncDeleteSegment``:
        unlinking a 1 GiB segment takes ~170 ms on ext4). Recovery deletes any it finds."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.offset_index.release()
        self.time_index.release()
        retired: list[Path] = []
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            target = path.with_name(path.name + DELETED_SUFFIX)
            try:
                os.replace(path, target)
            except FileNotFoundError:
                continue
            retired.append(target)
        return retired

    def rename_suffix(self, old: str, new: str) -> None:
        """Rename all three files from suffix ``old`` to ``new`` (e.g. .swap -> '')."""
        for f in (self.offset_index, self.time_index):
            name = f.path.name
            assert name.endswith(old), (name, old)
            f.rename(f.path.with_name(name[: len(name) - len(old)] + new))
        name = self.log_path.name
        assert name.endswith(old), (name, old)
        target = self.log_path.with_name(name[: len(name) - len(old)] + new)
        os.replace(self.log_path, target)
        self.log_path = target

    @property
    def bytes_since_index_entry(self) -> int:
        """Bytes appended since the last index entry: the next batch gets one when this is
        above ``index_interval_bytes`` (see ``append``)."""
        return self._bytes_since_index_entry

    @property
    def index_room(self) -> int:
        """Entries both indexes still take (the time index adds at most one per offset one)."""
        return min(self.offset_index.room, self.time_index.room)

    @property
    def index_full(self) -> bool:
        """Either index has no room left: the segment must roll (Kafka's ``shouldRoll``)."""
        return self.offset_index.is_full or self.time_index.is_full
