"""Sparse offset and time indexes of one segment (Kafka's ``OffsetIndex`` and ``TimeIndex``).

``<base offset>.index``: 8-byte entries ``relative_offset u32 | position u32`` (big-endian).
An entry maps the *last* offset of a batch to the file position where that batch starts. The
segment adds one after at least ``index.interval.bytes`` of log since the previous entry, so
a lookup bisects to the nearest entry at or below the target and scans at most that many bytes.

``<base offset>.timeindex``: 12-byte entries ``timestamp i64 | relative_offset u32``. An entry
says "every record with a timestamp at or above T is at or after this offset"; timestamps in the
index strictly increase (``TimeIndex.maybeAppend``), the offset is that of the batch holding the
largest timestamp seen so far.

Both files are preallocated to ``segment.index.bytes`` while the segment is active (sparse, so
cheap) and trimmed to their entries when the segment rolls or closes, so the size of a closed
index says how many entries it has. An index that does not trim to a whole number of entries or
whose entries do not increase is rebuilt from the log by the caller (``IndexCorruptError``).
Entries are kept in memory as well; the file is the durable copy.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from array import array
from pathlib import Path

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
# The mapped tail is written with zeros (pwrite) a chunk ahead of the entries. A store into a
# hole of the sparse file faults, and the fault allocates the block on the spot: about 1.6 ms
# per fresh file on ext4 here, where a pwrite costs tens of microseconds and leaves pages that
# stores then reach at memory speed. Without it a new cluster's first commits stalled its
# event loops for a second: each node indexes the first batches of ~65 fresh logs at once.
# One page a time: the chunk is real disk, two per active segment (64 KiB chunks took 128 KiB
# for every partition, 146 MB for 1,000 small ones); a 4 KiB pwrite every 341 or 512 entries
# costs what a 64 KiB one did (measured: ~140-170 us for a fresh file's first entry with either).
_PREFILL = bytes(4096)


class IndexCorruptError(ValueError):
    """An index file that does not describe its segment; rebuild it from the log."""


class _IndexFile:
    """Entries written into a preallocated, memory-mapped file, as Kafka's ``AbstractIndex``.

    While the segment is active the file is ``max_bytes`` long and mapped: an append is a
    memory store, no system call. ``trim`` unmaps it and cuts the file to its entries.

    No file descriptor is kept: the file is opened for each system call that needs one (the
    mapping holds its own while the segment is active; Python's ``mmap`` duplicates it). As
    Kafka closes an index's file once mapped, a node's open files are one per segment, not
    three: a topic of thousands of partitions ran a node out of them (EMFILE is a log
    directory failure, which halts it), and kept it from starting again.
    """

    def __init__(self, path: Path, entry_size: int, max_bytes: int) -> None:
        self.path = path
        self.entry_size = entry_size
        self.max_entries = max(1, max_bytes // entry_size)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
        self._map: mmap.mmap | None = None
        self._count = 0
        self._filled = 0  # bytes of the file known to be written, not holes (see _PREFILL)
        self._closed = False

    def read_all(self) -> bytes:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size % self.entry_size:
                raise IndexCorruptError(f"{self.path}: size {size} is not a multiple of entries")
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)

    def set_count(self, count: int) -> None:
        self._count = count

    @property
    def is_full(self) -> bool:
        return self._count >= self.max_entries

    @property
    def room(self) -> int:
        return self.max_entries - self._count

    def append(self, entry: struct.Struct, *values: int) -> None:
        """Pack ``values`` with ``entry`` straight into the mapped file."""
        m = self._map
        size = self.max_entries * self.entry_size
        position = self._count * self.entry_size
        if m is None or position + self.entry_size > self._filled:
            fd = os.open(self.path, os.O_RDWR)
            try:
                if m is None:
                    os.ftruncate(fd, size)
                    m = self._map = mmap.mmap(fd, size)
                if position + self.entry_size > self._filled:
                    end = min(position + len(_PREFILL), size)
                    os.pwrite(fd, memoryview(_PREFILL)[: end - position], position)
                    self._filled = end
            finally:
                os.close(fd)
        entry.pack_into(m, position, *values)
        self._count += 1

    def truncate_entries(self, count: int) -> None:
        self._count = count
        if self._map is None:
            os.truncate(self.path, count * self.entry_size)
            self._filled = min(self._filled, count * self.entry_size)

    def flush(self) -> None:
        if self._map is not None:
            self._map.flush()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def trim(self) -> None:
        """Unmap and cut the preallocated tail so the file size is the entries' size."""
        if self._map is not None:
            self._map.close()
            self._map = None
        os.truncate(self.path, self._count * self.entry_size)
        self._filled = min(self._filled, self._count * self.entry_size)

    def reset(self) -> None:
        self._count = 0
        if self._map is not None:
            self._map.close()
            self._map = None
        os.truncate(self.path, 0)
        self._filled = 0

    def close(self) -> None:
        if not self._closed:
            self.trim()
            self._closed = True

    def release(self) -> None:
        """Close the map, the file as it is (no trim): the file is about to go."""
        if self._map is not None:
            self._map.close()
            self._map = None
        self._closed = True

    def delete(self) -> None:
        self.release()
        self.path.unlink(missing_ok=True)

    def rename(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path


class _Index:
    """What both indexes share: two parallel arrays of entries and their file."""

    _file: _IndexFile
    _a: array[int]  # offsets (OffsetIndex) or timestamps (TimeIndex)
    _b: array[int]  # positions (OffsetIndex) or offsets (TimeIndex)

    def __init__(self, path: Path, base_offset: int, entry_size: int, max_bytes: int) -> None:
        self.base_offset = base_offset
        self._file = _IndexFile(path, entry_size, max_bytes)
        self._a = array("q")
        self._b = array("q")

    @property
    def path(self) -> Path:
        return self._file.path

    def __len__(self) -> int:
        return len(self._a)

    @property
    def size_in_bytes(self) -> int:
        """What its entries take in the file (Kafka's ``AbstractIndex.sizeInBytes``)."""
        return len(self._a) * self._file.entry_size

    @property
    def is_full(self) -> bool:
        return self._file.is_full

    @property
    def room(self) -> int:
        """How many more entries the index takes."""
        return self._file.room

    def _set_entries(self, a: array[int], b: array[int]) -> None:
        self._a, self._b = a, b
        self._file.set_count(len(a))

    def _truncate_at(self, i: int) -> None:
        del self._a[i:]
        del self._b[i:]
        self._file.truncate_entries(i)

    def reset(self) -> None:
        self._a, self._b = array("q"), array("q")
        self._file.reset()

    def flush(self) -> None:
        self._file.flush()

    def trim(self) -> None:
        self._file.trim()

    def close(self) -> None:
        self._file.close()

    def release(self) -> None:
        self._file.release()

    def delete(self) -> None:
        self._file.delete()

    def rename(self, path: Path) -> None:
        self._file.rename(path)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._a, self._b, strict=True))


class OffsetIndex(_Index):
    """Maps absolute offsets to file positions; lookups bisect, then the segment scans."""

    def __init__(self, path: Path, base_offset: int, max_bytes: int) -> None:
        super().__init__(path, base_offset, _OFFSET_ENTRY.size, max_bytes)

    def load(self, log_size: int) -> None:
        """Read entries from the file and check them against the log's size."""
        raw = self._file.read_all()
        offsets: array[int] = array("q")
        positions: array[int] = array("q")
        for rel, pos in _OFFSET_ENTRY.iter_unpack(raw):
            offset = self.base_offset + rel
            if offsets and (offset <= offsets[-1] or pos <= positions[-1]):
                raise IndexCorruptError(f"{self.path}: entries do not increase at {offset}")
            if pos >= log_size:
                raise IndexCorruptError(f"{self.path}: position {pos} beyond log size {log_size}")
            offsets.append(offset)
            positions.append(pos)
        self._set_entries(offsets, positions)

    @property
    def last_offset(self) -> int:
        return self._a[-1] if self._a else self.base_offset

    def append(self, offset: int, position: int) -> None:
        if self._a:
            assert offset > self._a[-1] and position > self._b[-1], (offset, position)
        rel = offset - self.base_offset
        assert 0 <= rel <= 0xFFFFFFFF, rel
        self._file.append(_OFFSET_ENTRY, rel, position)
        self._a.append(offset)
        self._b.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry at or below ``offset``, else (base, 0)."""
        i = bisect.bisect_right(self._a, offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self._a[i], self._b[i]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries for batches at or after ``position``."""
        self._truncate_at(bisect.bisect_left(self._b, position))


class TimeIndex(_Index):
    """Maps timestamps to the first offset that may hold a record at or after them."""

    def __init__(self, path: Path, base_offset: int, max_bytes: int) -> None:
        super().__init__(path, base_offset, _TIME_ENTRY.size, max_bytes)

    def load(self, log_end_offset: int) -> None:
        raw = self._file.read_all()
        timestamps: array[int] = array("q")
        offsets: array[int] = array("q")
        for ts, rel in _TIME_ENTRY.iter_unpack(raw):
            offset = self.base_offset + rel
            if timestamps and (ts <= timestamps[-1] or offset < offsets[-1]):
                raise IndexCorruptError(f"{self.path}: entries do not increase at {ts}")
            if offset >= log_end_offset:
                raise IndexCorruptError(f"{self.path}: offset {offset} beyond the segment")
            timestamps.append(ts)
            offsets.append(offset)
        self._set_entries(timestamps, offsets)

    @property
    def last_entry(self) -> tuple[int, int] | None:
        if not self._a:
            return None
        return self._a[-1], self._b[-1]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if the timestamp is above the last entry's."""
        if self._a and timestamp <= self._a[-1]:
            return
        rel = offset - self.base_offset
        assert 0 <= rel <= 0xFFFFFFFF, rel
        self._file.append(_TIME_ENTRY, timestamp, rel)
        self._a.append(timestamp)
        self._b.append(offset)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry whose timestamp is at or below ``timestamp``.

        Where no entry is that low, (-1, base offset): scan from the segment's start.
        """
        i = bisect.bisect_right(self._a, timestamp) - 1
        if i < 0:
            return -1, self.base_offset
        return self._a[i], self._b[i]

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries pointing at ``offset`` or later."""
        self._truncate_at(bisect.bisect_left(self._b, offset))
