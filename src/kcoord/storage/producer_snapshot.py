"""Producer state snapshots: ``<offset, 20 digits>.snapshot`` in a partition's directory, in
the layout of Kafka's ``ProducerStateManager`` (``PID_SNAPSHOT_MAP_SCHEMA``, version 1).

A snapshot at offset S holds the producers a partition's state knew from the batches below S.
kcoord still builds a state from the log's batch headers (``node/kafka/produce.py``); what the
snapshot adds are the producers whose batches have all left the log (retention, DeleteRecords):
read from the log alone, a restarted node forgot them, and a retry of such a producer's last
batch was appended a second time. Kafka takes one at every segment roll and at a clean close;
so does kcoord, leader or follower.

Layout (big-endian): version int16 (1), crc uint32 (CRC-32C of what follows), then an int32
count of entries, each: producer_id int64, epoch int16, last_sequence int32, last_offset int64,
offset_delta int32 (last minus first offset of the producer's last batch), timestamp int64,
coordinator_epoch int32 (-1: kcoord has no transactions), current_txn_first_offset int64 (-1).
Kafka keeps the producer's last batch alone, so does this file.

A snapshot must never claim batches the log no longer has: the log deletes those above its end
when it is truncated and when it opens (``delete_above``), as Kafka's ``truncateAndReload``. A
file that does not read (torn, garbage, another version) is logged, deleted and not used, as
Kafka's ``CorruptSnapshotException`` is handled.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from pathlib import Path
from typing import Final, NamedTuple

import crc32c as _crc32c

from kcoord.storage.checkpoint import write_bytes_atomically
from kcoord.storage.producer_state import (
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    ProducerStateEntry,
    ProducerStateManager,
)
from kcoord.storage.segment import is_offset_name, segment_file_name

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX: Final = ".snapshot"
VERSION: Final = 1
_HEAD: Final = struct.Struct(">hI")  # version, crc
_COUNT: Final = struct.Struct(">i")
_ENTRY: Final = struct.Struct(">qhiqiqiq")
_NO_COORDINATOR_EPOCH: Final = -1
_NO_TXN: Final = -1
_INT32_MAX: Final = 2**31 - 1


class CorruptSnapshotError(ValueError):
    """A snapshot file that does not read as one."""


def encode(state: ProducerStateManager) -> bytes:
    """The snapshot of ``state``: each producer with its last batch."""
    body = bytearray(_COUNT.pack(len(state.producers)))
    for pid, entry in sorted(state.producers.items()):
        last = entry.batches[-1] if entry.batches else None
        body += _ENTRY.pack(
            pid,
            entry.producer_epoch,
            -1 if last is None else last.last_seq,
            -1 if last is None else last.last_offset,
            0 if last is None else last.last_offset - last.first_offset,
            entry.last_timestamp_ms,
            _NO_COORDINATOR_EPOCH,
            _NO_TXN,
        )
    return _HEAD.pack(VERSION, _crc32c.crc32c(bytes(body))) + bytes(body)


class SnapshotEntry(NamedTuple):
    """One producer of a snapshot, as the file has it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int


def decrement_sequence(sequence: int, decrement: int) -> int:
    """``DefaultRecordBatch.decrementSequence``: sequences wrap at ``Integer.MAX_VALUE``."""
    if sequence < decrement:
        return _INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def read_entries(data: bytes) -> list[SnapshotEntry]:
    """The producers a snapshot holds; CorruptSnapshotError if it does not read as one."""
    if len(data) < _HEAD.size + _COUNT.size:
        raise CorruptSnapshotError(f"{len(data)} bytes: too short for a snapshot")
    version, crc = _HEAD.unpack_from(data)
    if version != VERSION:
        raise CorruptSnapshotError(f"version {version}, not {VERSION}")
    body = data[_HEAD.size :]
    if _crc32c.crc32c(body) != crc:
        raise CorruptSnapshotError("CRC mismatch")
    (count,) = _COUNT.unpack_from(body)
    if count < 0 or len(body) != _COUNT.size + count * _ENTRY.size:
        raise CorruptSnapshotError(f"{count} entries in {len(body)} bytes")
    return [SnapshotEntry(*fields) for fields in _ENTRY.iter_unpack(body[_COUNT.size :])]


def decode(data: bytes, *, producer_id_expiration_ms: int) -> ProducerStateManager:
    """The state a snapshot holds; CorruptSnapshotError if it does not read as one."""
    state = ProducerStateManager(producer_id_expiration_ms=producer_id_expiration_ms)
    for e in read_entries(data):
        batches: deque[BatchMetadata] = deque(maxlen=NUM_BATCHES_TO_RETAIN)
        if e.last_sequence >= 0:
            batches.append(
                BatchMetadata(
                    decrement_sequence(e.last_sequence, e.offset_delta),
                    e.last_sequence,
                    e.last_offset - e.offset_delta,
                    e.last_offset,
                    e.timestamp,
                )
            )
        state.producers[e.producer_id] = ProducerStateEntry(
            e.producer_id, e.producer_epoch, batches, e.timestamp
        )
    return state


def path_of(directory: Path, offset: int) -> Path:
    return directory / segment_file_name(offset, SNAPSHOT_SUFFIX)


def offsets(directory: Path) -> list[int]:
    """The offsets of the snapshots in ``directory``, ascending."""
    found = []
    for path in directory.iterdir():
        stem = path.name[: -len(SNAPSHOT_SUFFIX)]
        if path.name.endswith(SNAPSHOT_SUFFIX) and is_offset_name(stem):
            found.append(int(stem))
    return sorted(found)


def write(directory: Path, offset: int, state: ProducerStateManager, *, keep_from: int) -> None:
    """Write the snapshot of ``state`` at ``offset`` (atomically: a crash leaves the old files
    or the new one) and delete those below ``min(offset, keep_from)``: a log keeps the ones of
    its segments and the latest (Kafka deletes a segment's snapshot with the segment)."""
    write_bytes_atomically(path_of(directory, offset), encode(state))
    for old in offsets(directory):
        if old < min(offset, keep_from):
            path_of(directory, old).unlink(missing_ok=True)


def read_latest(
    directory: Path, *, at_most: int, producer_id_expiration_ms: int
) -> tuple[int, ProducerStateManager] | None:
    """The latest snapshot at or below ``at_most`` that reads, with its offset; one that does
    not read is logged and deleted (``loadFromSnapshot``). None without a directory (the
    log deleted meanwhile)."""
    try:
        found = offsets(directory)
    except OSError:
        return None
    for offset in reversed(found):
        if offset > at_most:
            continue
        path = path_of(directory, offset)
        try:
            return offset, decode(
                path.read_bytes(), producer_id_expiration_ms=producer_id_expiration_ms
            )
        except (CorruptSnapshotError, OSError) as e:
            log.warning("%s: deleting the producer snapshot %s: %s", directory, path.name, e)
            path.unlink(missing_ok=True)
    return None


def delete_above(directory: Path, offset: int) -> None:
    """Delete the snapshots above ``offset`` (the log's end after a truncation): they hold
    batches the log no longer has."""
    for found in offsets(directory):
        if found > offset:
            path_of(directory, found).unlink(missing_ok=True)
