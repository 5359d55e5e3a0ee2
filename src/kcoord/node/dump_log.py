"""``kcoord dump-log``: print segment, index and time-index files like ``kafka-dump-log.sh``.

Reads ``.log`` files batch by batch (never the whole file at once), ``.index`` files as
``offset: N position: P`` and ``.timeindex`` files as ``timestamp: T offset: N``. A corrupt
batch is printed with ``isvalid: false`` and its records are not decoded; bytes after the last
whole batch are reported the way Kafka's tool does. ``--deep-iteration`` prints each record's
metadata, ``--print-data-log`` its key and payload too (Kafka's ``DecoderMessageParser``: a
null key or value is left out), and ``--offsets-decoder`` decodes the records of
``__consumer_offsets`` with Kafka's schemas.

Each index entry is checked against its segment (``DumpLogSegments.dumpIndex`` and
``dumpTimeIndex``): an offset index entry must point at the batch whose last offset it names,
and a time index entry name a batch's last offset and that batch's greatest timestamp, above
the previous entry's. What does not match is listed on stderr after the files, as Kafka's
tool lists it, and makes the exit code 1 (Kafka's tool exits 0 either way). A file of a kind
the tool does not read is said on stderr and skipped.
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from kcoord.cluster.coordinator.records import format_offsets_record
from kcoord.storage import format as fmt
from kcoord.storage import producer_snapshot

_INDEX_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")


def _bool(b: bool) -> str:
    return "true" if b else "false"


def _iter_headers(
    fd: int, size: int
) -> Iterator[tuple[int, fmt.BatchHeader, None] | tuple[int, None, str]]:
    """(position, header, None) for each whole batch, reading only headers; (position, None,
    error) for the first that is not one, and the end."""
    pos = 0
    while pos < size:
        head = os.pread(fd, fmt.HEADER_SIZE, pos)
        try:
            if len(head) < fmt.HEADER_SIZE:  # as parse_header says it, at the file's position
                raise fmt.RecordFormatError(
                    f"truncated batch header at position {pos}: "
                    f"{len(head)} of {fmt.HEADER_SIZE} bytes"
                )
            header = fmt.BatchHeader._make(fmt.HEADER.unpack(head))
            fmt.raise_if_invalid_header(header, pos)
        except fmt.RecordFormatError as e:
            yield pos, None, str(e)
            return
        if pos + header.size > size:
            yield pos, None, f"batch at {pos} needs {header.size} bytes, {size - pos} remain"
            return
        yield pos, header, None
        pos += header.size


def _iter_file_batches(fd: int, size: int) -> Iterator[tuple[int, bytes | None, str | None]]:
    """(position, batch bytes or None, error) for each batch; stops at the first bad one."""
    for pos, header, error in _iter_headers(fd, size):
        if header is None:
            yield pos, None, error
            return
        yield pos, os.pread(fd, header.size, pos), None


def _segment_batches(index_path: Path, report: list[str]) -> dict[int, fmt.BatchHeader] | None:
    """The headers of the whole batches of the segment an index file belongs to, by position
    (an index is checked against them); None, said in ``report``, without the segment."""
    log_path = index_path.with_name(index_path.name.split(".")[0] + ".log")
    try:
        fd = os.open(log_path, os.O_RDONLY)
    except FileNotFoundError:
        report.append(f"Not checked against its segment: {index_path} (no {log_path.name})")
        return None
    try:
        size = os.fstat(fd).st_size
        return {pos: h for pos, h, _ in _iter_headers(fd, size) if h is not None}
    finally:
        os.close(fd)


def dump_log_file(
    path: Path,
    out: TextIO,
    *,
    print_data: bool,
    offsets_decoder: bool,
    deep_iteration: bool = False,
) -> int:
    """Print one ``.log`` file; return how many invalid batches or bytes were found."""
    print_data = print_data or offsets_decoder
    problems = 0
    base = path.name.split(".")[0]
    out.write(f"Log starting offset: {int(base) if base.isdigit() else 0}\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        for pos, raw, error in _iter_file_batches(fd, size):
            if raw is None:
                out.write(f"Found {size - pos} invalid bytes at the end of {path.name}: {error}\n")
                problems += 1
                break
            h = fmt.parse_header(raw)
            valid = fmt.is_crc_valid(raw, 0, h)
            problems += 0 if valid else 1
            horizon = (
                f"OptionalLong[{h.base_timestamp}]"
                if h.attributes & fmt.DELETE_HORIZON_FLAG
                else "OptionalLong.empty"
            )
            ts_name = "LogAppendTime" if h.timestamp_type else "CreateTime"
            out.write(
                f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} "
                f"count: {h.record_count} baseSequence: {h.base_sequence} "
                f"lastSequence: {h.last_sequence} producerId: {h.producer_id} "
                f"producerEpoch: {h.producer_epoch} "
                f"partitionLeaderEpoch: {h.partition_leader_epoch} "
                f"isTransactional: {_bool(h.is_transactional)} "
                f"isControl: {_bool(h.is_control)} deleteHorizonMs: {horizon} "
                f"position: {pos} {ts_name}: {h.max_timestamp} size: {h.size} "
                f"magic: {h.magic} compresscodec: {h.compression.name.lower()} "
                f"crc: {h.crc} isvalid: {_bool(valid)}\n"
            )
            if not (print_data or deep_iteration) or not valid:
                continue
            try:
                records = fmt.decode_records(raw)
            except fmt.RecordFormatError as e:
                out.write(f"| cannot decode records: {e}\n")
                problems += 1
                continue
            for i, r in enumerate(records):
                sequence = h.base_sequence + i if h.base_sequence >= 0 else -1
                header_keys = ",".join(_printable(k) for k, _ in r.headers)
                line = (
                    f"| offset: {r.offset} {ts_name}: {r.timestamp} "
                    f"keySize: {-1 if r.key is None else len(r.key)} "
                    f"valueSize: {-1 if r.value is None else len(r.value)} "
                    f"sequence: {sequence} headerKeys: [{header_keys}]"
                )
                if h.is_control:
                    line += _control_record(r)
                elif offsets_decoder:
                    line += " " + format_offsets_record(r.key, r.value, offset=r.offset)
                elif print_data:
                    if r.key is not None:
                        line += " key: " + _text(r.key)
                    if r.value is not None:
                        line += " payload: " + _text(r.value)
                out.write(line + "\n")
    finally:
        os.close(fd)
    return problems


def _control_record(r: fmt.Record) -> str:
    """``printControlRecord``: a transaction marker's type and coordinator epoch."""
    try:
        kind = fmt.parse_control_key(r.key).name
    except fmt.RecordFormatError as e:
        return f" endTxnMarker: unknown ({e})"
    try:
        epoch = str(fmt.parse_coordinator_epoch(r.value))
    except fmt.RecordFormatError as e:
        epoch = f"unknown ({e})"
    return f" endTxnMarker: {kind} coordinatorEpoch: {epoch}"


def _text(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")


def dump_index_file(path: Path, out: TextIO, report: list[str]) -> int:
    """Print an offset index; each entry that does not point at the batch whose last offset
    it names adds to ``report`` (``dumpIndex``'s mismatches)."""
    base = int(path.name.split(".")[0])
    data = path.read_bytes()
    batches = _segment_batches(path, report)
    usable = len(data) - len(data) % _INDEX_ENTRY.size
    problems = 0
    last = -1
    mismatches: list[tuple[int, int]] = []
    for rel, position in _INDEX_ENTRY.iter_unpack(data[:usable]):
        if rel == 0 and position == 0 and last >= 0:
            break  # the zero-filled preallocated tail of an active index
        out.write(f"offset: {base + rel} position: {position}\n")
        if base + rel <= last:
            out.write(f"Index offset {base + rel} is not above the previous entry {last}\n")
            problems += 1
        at = None if batches is None else batches.get(position)
        if batches is not None and (at is None or at.last_offset != base + rel):
            mismatches.append((base + rel, -1 if at is None else at.last_offset))
        last = base + rel
    if usable != len(data):
        out.write(f"Found {len(data) - usable} trailing bytes in {path.name}\n")
        problems += 1
    if mismatches:
        report.append(f"Mismatches in :{path.absolute()}")
        report.extend(f"  Index offset: {i}, log offset: {o}" for i, o in reversed(mismatches))
    return problems + len(mismatches)


def dump_time_index_file(path: Path, out: TextIO, report: list[str]) -> int:
    """Print a time index; each entry that names no batch's last offset, or not that batch's
    max timestamp (its header's: Kafka's tool takes its records' greatest, which the batch
    the cleaner rebuilt for a producer may exceed), adds to ``report`` (``dumpTimeIndex``'s
    errors)."""
    base = int(path.name.split(".")[0])
    data = path.read_bytes()
    batches = _segment_batches(path, report)
    by_last_offset = {} if batches is None else {h.last_offset: h for h in batches.values()}
    last_offsets = sorted(by_last_offset)
    usable = len(data) - len(data) % _TIME_ENTRY.size
    problems = 0
    last_ts = None
    wrong_timestamps: list[str] = []
    not_found: list[str] = []
    for ts, rel in _TIME_ENTRY.iter_unpack(data[:usable]):
        if ts == 0 and rel == 0 and last_ts is not None:
            break
        out.write(f"timestamp: {ts} offset: {base + rel}\n")
        if last_ts is not None and ts <= last_ts:
            out.write(f"Time index timestamp {ts} is not above the previous entry {last_ts}\n")
            problems += 1
        batch = by_last_offset.get(base + rel)
        if batches is not None and batch is None:
            following = bisect.bisect_right(last_offsets, base + rel)
            found = last_offsets[following] if following < len(last_offsets) else -1
            not_found.append(f"Indexed offset: {base + rel}, found log offset: {found}")
        elif batch is not None and batch.max_timestamp != ts:
            wrong_timestamps.append(
                f"  Index timestamp: {ts}, log timestamp: {batch.max_timestamp}"
            )
        last_ts = ts
    if usable != len(data):
        out.write(f"Found {len(data) - usable} trailing bytes in {path.name}\n")
        problems += 1
    if wrong_timestamps:
        report.append(f"Found timestamp mismatch in :{path.absolute()}")
        report.extend(wrong_timestamps)
    if not_found:
        report.append("The following indexed offsets are not found in the log.")
        report.extend(not_found)
    return problems + len(wrong_timestamps) + len(not_found)


def dump_producer_snapshot_file(path: Path, out: TextIO) -> int:
    """A producer state snapshot, one producer a line, as ``DumpLogSegments``'s
    ``dumpProducerIdSnapshot`` prints it."""
    try:
        entries = producer_snapshot.read_entries(path.read_bytes())
    except producer_snapshot.CorruptSnapshotError as error:
        out.write(f"Corrupt producer snapshot {path.name}: {error}\n")
        return 1
    for e in entries:
        txn = (
            "OptionalLong.empty"
            if e.current_txn_first_offset < 0
            else f"OptionalLong[{e.current_txn_first_offset}]"
        )
        line = (
            f"producerId: {e.producer_id} producerEpoch: {e.producer_epoch} "
            f"coordinatorEpoch: {e.coordinator_epoch} currentTxnFirstOffset: {txn} "
            f"lastTimestamp: {e.timestamp} "
        )
        if e.last_sequence >= 0:
            first = producer_snapshot.decrement_sequence(e.last_sequence, e.offset_delta)
            line += (
                f"firstSequence: {first} "
                f"lastSequence: {e.last_sequence} lastOffset: {e.last_offset} "
                f"offsetDelta: {e.offset_delta} timestamp: {e.timestamp}"
            )
        out.write(line + "\n")
    return 0


def dump_files(
    paths: list[Path],
    out: TextIO,
    *,
    print_data: bool,
    offsets_decoder: bool,
    deep_iteration: bool = False,
    err: TextIO | None = None,
) -> int:
    """Dump each file; the exit code is 0 when all were readable and valid, else 1. What the
    index checks found goes to ``err`` (stderr) after the files, as Kafka's tool prints it."""
    err = sys.stderr if err is None else err
    problems = 0
    report: list[str] = []
    for path in paths:
        out.write(f"Dumping {path}\n")
        try:
            if path.name.endswith(".log"):
                problems += dump_log_file(
                    path,
                    out,
                    print_data=print_data,
                    offsets_decoder=offsets_decoder,
                    deep_iteration=deep_iteration,
                )
            elif path.name.endswith(".timeindex"):
                problems += dump_time_index_file(path, out, report)
            elif path.name.endswith(".index"):
                problems += dump_index_file(path, out, report)
            elif path.name.endswith(producer_snapshot.SNAPSHOT_SUFFIX):
                problems += dump_producer_snapshot_file(path, out)
            else:
                # A partition directory's checkpoints and partition.metadata: not a failure.
                err.write(f"Ignoring unknown file {path}\n")
        except BrokenPipeError:
            raise  # the reader went away (``| head``): not the file's fault
        except (OSError, ValueError) as e:
            out.write(f"Cannot read {path}: {e}\n")
            problems += 1
    out.flush()
    for line in report:
        err.write(line + "\n")
    return 0 if problems == 0 else 1


def _printable(key: str) -> str:
    """A header key as Kafka prints one that is not UTF-8: its bad bytes replaced."""
    return key.encode(errors="surrogateescape").decode(errors="replace")
