"""Kafka's v2 record batch (magic 2): parse, validate and build. Pure: bytes in, values out.

Theory of operation
-------------------
Every partition log, and every Produce/Fetch payload, is a sequence of record batches. The broker
mostly needs the 61-byte batch header (offsets, length, CRC, producer fields); it stores produced
batches as sent and rewrites only the two fields outside the CRC: ``base_offset`` and
``partition_leader_epoch``. Records are decoded only where the broker must look inside
(coordinator replay, compaction, ``dump-log``, timestamp lookups).

Batch layout (big-endian; ``DefaultRecordBatch`` in Kafka's clients)::

    offset  size  field
         0     8  base_offset             int64   rewritten by the leader on append
         8     4  batch_length            int32   bytes after this field (total size - 12)
        12     4  partition_leader_epoch  int32   rewritten by the leader on append
        16     1  magic                   int8    always 2
        17     4  crc                     uint32  CRC-32C of bytes [21, end)
        21     2  attributes              int16   see below
        23     4  last_offset_delta       int32
        27     8  base_timestamp          int64   a.k.a. first timestamp
        35     8  max_timestamp           int64
        43     8  producer_id             int64   -1 when not idempotent
        51     2  producer_epoch          int16
        53     4  base_sequence           int32
        57     4  record_count            int32
        61     .  records (possibly compressed as one block)

Attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3 timestamp
type (0 CreateTime, 1 LogAppendTime), bit 4 transactional, bit 5 control, bit 6 delete horizon
set (KIP-534).

Record layout (``DefaultRecord``); varints are zig-zag encoded like protobuf's sint32/sint64::

    length varint | attributes int8 | timestamp_delta varlong | offset_delta varint
    | key_length varint (-1 = null) | key | value_length varint (-1 = null) | value
    | header_count varint | (header_key_length varint | key utf-8
                              | header_value_length varint (-1 = null) | value) ...

Control records (transaction markers) have key ``version int16, type int16`` (0 abort,
1 commit) and value ``version int16, coordinator_epoch int32``.

Compression: gzip uses ``zlib`` (standard library); snappy, lz4 and zstd use ``cramjam``
when it is installed (aiokafka depends on it) and raise ``UnsupportedCompressionError``
otherwise.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

import crc32c as _crc32c

MAGIC_V2 = 2
HEADER_SIZE = 61
# Bytes before batch_length's end: the size field covers everything after offset 12.
LOG_OVERHEAD = 12
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
PARTITION_LEADER_EPOCH_OFFSET = 12
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def wrap_int64(value: int) -> int:
    """``value`` as Java's long arithmetic leaves it: a record's timestamp is its batch's base
    plus its varlong delta (``DefaultRecord.readFrom``), which may overflow and wraps there; so
    does a delta written back. Unwrapped, a Python int outside the 64 bits failed the header's
    pack when a leader rebuilt the batch."""
    return ((value - _INT64_MIN) & 0xFFFF_FFFF_FFFF_FFFF) + _INT64_MIN


_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER = _HEADER  # for hot paths that unpack the header fields themselves
_BASE_OFFSET = struct.Struct(">q")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_UINT32 = struct.Struct(">I")
# The first 16 bytes of a batch: base offset, batch length, partition leader epoch.
BATCH_PREFIX = struct.Struct(">qii")
assert _HEADER.size == HEADER_SIZE

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(IntEnum):
    ABORT = 0
    COMMIT = 1


class RecordFormatError(ValueError):
    """Bytes that are not a well-formed v2 record batch."""


class OffsetsNotIncreasingError(RecordFormatError):
    """A batch whose records' offset deltas do not increase (``decode_key_values``)."""


class CorruptRecordError(RecordFormatError):
    """A batch whose CRC does not match its contents (Kafka's CORRUPT_MESSAGE)."""


class UnsupportedCompressionError(RecordFormatError):
    """A compression codec this installation cannot encode or decode."""


class BatchHeader(NamedTuple):
    """The fixed 61-byte header of one batch. Offsets are absolute."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & TIMESTAMP_TYPE_MASK) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        """Kafka's ``RecordBatch.hasProducerId``: above NO_PRODUCER_ID (-1). A negative id
        other than -1 is no producer either: such a batch was held to a producer's sequence
        rules (a sequence of -1 refused as INVALID_RECORD), where Kafka appends it plain."""
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        # Sequences wrap at Integer.MAX_VALUE (DefaultRecordBatch.incrementSequence).
        return (self.base_sequence + self.last_offset_delta) % (2**31)


@dataclass(frozen=True, slots=True)
class Record:
    """One record with absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


# ---------------------------------------------------------------------------------------------
# Header-level operations: what the broker needs on the hot path.


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header of the batch starting at ``pos``; the batch body may be absent."""
    if len(buf) - pos < HEADER_SIZE:
        raise RecordFormatError(
            f"truncated batch header at position {pos}: {len(buf) - pos} of {HEADER_SIZE} bytes"
        )
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    raise_if_invalid_header(header, pos)
    return header


def raise_if_invalid_header(header: BatchHeader, pos: int = 0) -> None:
    if header.magic != MAGIC_V2:
        raise RecordFormatError(f"unsupported magic {header.magic} at position {pos} (need 2)")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise RecordFormatError(f"batch length {header.batch_length} at {pos} is below minimum")
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise RecordFormatError(f"negative offset delta or record count at position {pos}")
    if header.base_offset < 0:
        raise RecordFormatError(f"negative base offset {header.base_offset} at position {pos}")


crc32c = _crc32c.crc32c


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """CRC-32C over attributes..end of the batch of ``size`` bytes at ``pos``."""
    view = memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size]
    return int(_crc32c.crc32c(view))


def is_crc_valid(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    if len(buf) - pos < header.size:
        return False
    return compute_crc(buf, pos, header.size) == header.crc


def iter_headers(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each complete batch; raises on a malformed or incomplete one."""
    pos = 0
    end = len(buf)
    while pos < end:
        header = parse_header(buf, pos)
        if pos + header.size > end:
            raise RecordFormatError(
                f"truncated batch at position {pos}: needs {header.size} bytes, {end - pos} present"
            )
        yield pos, header
        pos += header.size


class ValidPrefix(NamedTuple):
    """How much of a buffer is whole, CRC-valid batches, and why the rest is not."""

    valid_bytes: int
    headers: list[tuple[int, BatchHeader]]
    error: str | None


def scan_valid_prefix(
    buf: bytes | bytearray | memoryview,
    *,
    expect_next_offset: int | None = None,
    max_next_offset: int | None = None,
) -> ValidPrefix:
    """The longest prefix of whole batches with valid headers, CRCs and increasing offsets,
    none ending past ``max_next_offset`` (the segment's range: the base offset is outside the
    CRC, and one flipped bit sent a batch past the next segment or the index's reach).

    Used by recovery (``LogSegment.recover``): the first batch that is torn, corrupt or out of
    order ends the valid prefix, and ``error`` says why.
    """
    pos = 0
    end = len(buf)
    headers: list[tuple[int, BatchHeader]] = []
    next_offset = expect_next_offset
    while pos < end:
        try:
            header = parse_header(buf, pos)
        except RecordFormatError as e:
            return ValidPrefix(pos, headers, str(e))
        if pos + header.size > end:
            return ValidPrefix(pos, headers, f"torn batch at position {pos}")
        if next_offset is not None and header.base_offset < next_offset:
            return ValidPrefix(
                pos,
                headers,
                f"batch at position {pos} has base offset {header.base_offset} "
                f"below the expected {next_offset}",
            )
        if max_next_offset is not None and header.next_offset > max_next_offset:
            return ValidPrefix(
                pos,
                headers,
                f"batch at position {pos} ends at offset {header.last_offset}, past the "
                f"segment's last possible offset {max_next_offset - 1}",
            )
        if not is_crc_valid(buf, pos, header):
            return ValidPrefix(pos, headers, f"CRC mismatch in batch at position {pos}")
        headers.append((pos, header))
        next_offset = header.next_offset
        pos += header.size
    return ValidPrefix(pos, headers, None)


def set_base_offset(buf: bytearray, pos: int, base_offset: int) -> None:
    """Rewrite a batch's base offset in place; outside the CRC, so the CRC stays valid."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray, pos: int, leader_epoch: int) -> None:
    """Rewrite a batch's partition leader epoch in place; outside the CRC as well."""
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)


def set_max_timestamp(buf: bytearray, pos: int, timestamp: int) -> None:
    """Give the batch at ``pos`` ``timestamp`` as its max timestamp and sign it again (it is
    under the CRC): Kafka's ``DefaultRecordBatch.setMaxTimestamp``, which its LogValidator
    calls with the greatest timestamp of the batch's records, whatever the producer wrote."""
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    size = _INT32.unpack_from(buf, pos + 8)[0] + LOG_OVERHEAD
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, size))


def set_log_append_time(buf: bytearray, pos: int, timestamp: int) -> None:
    """Mark the batch at ``pos`` LogAppendTime with ``timestamp`` as its max timestamp, and sign
    it again: both are under the CRC (Kafka's ``DefaultRecordBatch.setMaxTimestamp``). Its
    records then all read as ``timestamp``; their own deltas stay as the producer wrote them."""
    attributes = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)[0]
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    size = _INT32.unpack_from(buf, pos + 8)[0] + LOG_OVERHEAD
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, size))


# ---------------------------------------------------------------------------------------------
# Varints (zig-zag), as in Kafka's ByteUtils.


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def write_varint(out: bytearray, n: int) -> None:
    """Append the zig-zag varint encoding of a signed 64-bit ``n``."""
    v = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint at ``pos``; return (value, next position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise RecordFormatError("varint runs past the end of the record")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise RecordFormatError("varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos


# ---------------------------------------------------------------------------------------------
# Compression.


def _cramjam() -> Any:
    try:
        import cramjam
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise UnsupportedCompressionError("snappy/lz4/zstd need the 'cramjam' package") from e
    return cramjam


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


# The most a batch may decompress to. Kafka reads a compressed batch as a stream and sets no
# such limit; here a batch is decompressed whole, and a few KiB of zstd can claim gigabytes (a
# 1 MiB batch of zeros decompresses to 32 GiB), so what a batch would take is bounded from its
# frames' headers before anything is decompressed (``decompressed_size_bound``). 64 times
# Kafka's default max.message.bytes: ratios that high are what compressing zeros gives, not
# records.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024


def decompress(
    codec: Compression, data: bytes | memoryview, max_bytes: int = MAX_DECOMPRESSED_BYTES
) -> bytes:
    """``data`` decompressed; ``RecordFormatError`` if it does not decompress, or could take
    more than ``max_bytes``."""
    try:
        if codec is Compression.NONE:
            return bytes(data)
        if codec is Compression.GZIP:
            # 32 + 15: accept gzip or zlib headers. A stream, so bounded as it goes.
            inflater = zlib.decompressobj(wbits=47)
            inflated = inflater.decompress(data, max_bytes + 1)
            if len(inflated) > max_bytes:
                raise RecordFormatError(_too_large(codec, max_bytes))
            if not inflater.eof:
                raise RecordFormatError("incomplete or truncated gzip stream")
            return inflated
        bound = decompressed_size_bound(codec, data)
        if bound > max_bytes:
            raise RecordFormatError(_too_large(codec, max_bytes, bound))
        cramjam = _cramjam()
        if codec is Compression.SNAPPY:
            raw = bytes(data)
            if raw.startswith(_XERIAL_MAGIC):
                # The Java client writes snappy in xerial's block framing (SnappyOutputStream):
                # magic, two int32 versions, then (int32 length, raw snappy block) pairs.
                out = bytearray()
                pos = 16
                while pos < len(raw):
                    (n,) = _INT32.unpack_from(raw, pos)
                    pos += 4
                    out += bytes(cramjam.snappy.decompress_raw(raw[pos : pos + n]))
                    pos += n
                return bytes(out)
            return bytes(cramjam.snappy.decompress_raw(raw))
        if codec is Compression.LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec is Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
    except RecordFormatError:
        raise
    except Exception as e:
        raise RecordFormatError(f"cannot decompress {codec.name} records: {e}") from e
    raise UnsupportedCompressionError(f"unknown compression codec {int(codec)}")


def _too_large(codec: Compression, max_bytes: int, bound: int | None = None) -> str:
    found = "" if bound is None else f" (its frames allow {bound})"
    return f"{codec.name} records decompress to more than {max_bytes} bytes{found}"


_ZSTD_MAGIC = 0xFD2FB528
_LZ4_MAGIC = 0x184D2204
_SKIPPABLE_MAGIC_MASK = 0xFFFFFFF0
_SKIPPABLE_MAGIC = 0x184D2A50  # zstd and lz4 frames alike
_ZSTD_MAX_BLOCK = 128 * 1024  # Block_Maximum_Size (RFC 8878)
_LZ4_BLOCK_SIZES = {4: 64 * 1024, 5: 256 * 1024, 6: 1024 * 1024, 7: 4 * 1024 * 1024}
_UINT32_LE = struct.Struct("<I")


def decompressed_size_bound(codec: Compression, data: bytes | memoryview) -> int:
    """At most how many bytes ``data`` decompresses to, from its framing alone (block headers
    and declared sizes; nothing is decompressed). Snappy and lz4 and zstd declare enough for
    that; gzip does not (``decompress`` inflates it as a stream, bounded as it goes).
    Raises ``RecordFormatError`` when the framing itself is broken."""
    view = memoryview(data)
    if codec is Compression.NONE:
        return len(view)
    if codec is Compression.SNAPPY:
        return _snappy_bound(view)
    if codec is Compression.LZ4:
        return _frames_bound(view, _LZ4_MAGIC, _lz4_frame_bound, "lz4")
    if codec is Compression.ZSTD:
        return _frames_bound(view, _ZSTD_MAGIC, _zstd_frame_bound, "zstd")
    raise RecordFormatError(f"no size bound for {codec.name}")


# Deflate's greatest ratio (a 258-byte match in about two bits): what gzip may claim.
DEFLATE_MAX_RATIO = 1032


def batch_records_bound(records: bytes | memoryview) -> int:
    """About how many bytes the records of the batch at the start of ``records`` take once
    decompressed, from its header and framing alone: its size if uncompressed, its frames'
    bound for snappy, lz4 and zstd, deflate's greatest ratio for gzip (which declares
    nothing). 0 for what does not parse: reading it fails at once."""
    if len(records) < HEADER_SIZE:
        return 0
    codec = records[ATTRIBUTES_OFFSET + 1] & COMPRESSION_MASK
    body = memoryview(records)[HEADER_SIZE:]
    if codec == Compression.GZIP:
        return len(body) * DEFLATE_MAX_RATIO
    try:
        return decompressed_size_bound(Compression(codec), body)
    except ValueError:  # a broken frame, an unknown codec
        return 0


def _uvarint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 35:
            raise RecordFormatError("snappy: bad length varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _snappy_bound(data: memoryview) -> int:
    if bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return _uvarint(data, 0)[0]  # a raw snappy block starts with its length
    total, pos = 0, 16
    while pos < len(data):
        if pos + 4 > len(data):
            raise RecordFormatError("snappy: truncated xerial block length")
        (n,) = _INT32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise RecordFormatError("snappy: xerial block runs past the data")
        total += _uvarint(data, pos)[0]
        pos += n
    return total


def _frames_bound(
    data: memoryview,
    magic: int,
    frame_bound: Callable[[memoryview, int], tuple[int, int]],
    name: str,
) -> int:
    """Frames one after another (zstd and lz4 allow concatenation), skippable ones skipped."""
    total = pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise RecordFormatError(f"{name}: truncated frame magic")
        (found,) = _UINT32_LE.unpack_from(data, pos)
        if found & _SKIPPABLE_MAGIC_MASK == _SKIPPABLE_MAGIC:
            if pos + 8 > len(data):
                raise RecordFormatError(f"{name}: truncated skippable frame")
            pos += 8 + _UINT32_LE.unpack_from(data, pos + 4)[0]
            continue
        if found != magic:
            raise RecordFormatError(f"{name}: bad frame magic {found:#x}")
        size, pos = frame_bound(data, pos + 4)
        total += size
    return total


def _need(data: memoryview, pos: int, n: int, name: str) -> None:
    if pos + n > len(data):
        raise RecordFormatError(f"{name}: frame runs past the data")


def _zstd_frame_bound(data: memoryview, pos: int) -> tuple[int, int]:
    """RFC 8878 section 3.1.1: the frame header, then blocks of 3-byte headers. A raw or RLE
    block's size is what it regenerates; a compressed one regenerates at most 128 KiB."""
    _need(data, pos, 1, "zstd")
    descriptor = data[pos]
    pos += 1
    fcs_flag, single_segment = descriptor >> 6, descriptor >> 5 & 1
    has_checksum, dict_flag = descriptor >> 2 & 1, descriptor & 3
    pos += (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    fcs_bytes = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    _need(data, pos, fcs_bytes, "zstd")
    declared = int.from_bytes(data[pos : pos + fcs_bytes], "little") if fcs_bytes else 0
    if fcs_bytes == 2:
        declared += 256
    pos += fcs_bytes
    total = 0
    while True:
        _need(data, pos, 3, "zstd")
        block = int.from_bytes(data[pos : pos + 3], "little")
        pos += 3
        last, kind, size = block & 1, block >> 1 & 3, block >> 3
        if kind == 0:  # raw
            total, pos = total + size, pos + size
        elif kind == 1:  # RLE: one byte, repeated size times
            total, pos = total + size, pos + 1
        elif kind == 2:
            total, pos = total + _ZSTD_MAX_BLOCK, pos + size
        else:
            raise RecordFormatError("zstd: reserved block type")
        _need(data, pos, 0, "zstd")
        if last:
            break
    pos += 4 if has_checksum else 0
    _need(data, pos, 0, "zstd")
    return max(total, declared), pos


def _lz4_frame_bound(data: memoryview, pos: int) -> tuple[int, int]:
    """The LZ4 frame format: FLG and BD bytes, optional content size and dictionary id, a
    header checksum, then blocks of a 4-byte size (the high bit: stored uncompressed) up to
    an end mark; a compressed block regenerates at most the frame's block maximum."""
    _need(data, pos, 2, "lz4")
    flags, block_descriptor = data[pos], data[pos + 1]
    pos += 2
    block_max = _LZ4_BLOCK_SIZES.get(block_descriptor >> 4 & 7)
    if flags >> 6 != 1 or block_max is None:
        raise RecordFormatError("lz4: unsupported frame version or block size")
    block_checksum, has_size = flags >> 4 & 1, flags >> 3 & 1
    content_checksum, has_dict = flags >> 2 & 1, flags & 1
    declared = 0
    if has_size:
        _need(data, pos, 8, "lz4")
        declared = int.from_bytes(data[pos : pos + 8], "little")
        pos += 8
    pos += (4 if has_dict else 0) + 1  # the dictionary id, the header checksum
    total = 0
    while True:
        _need(data, pos, 4, "lz4")
        (word,) = _UINT32_LE.unpack_from(data, pos)
        pos += 4
        if word == 0:  # the end mark
            break
        size = word & 0x7FFFFFFF
        # LZ4 gives at most 255 bytes for one (a match length byte), whatever the block size.
        total += size if word & 0x80000000 else min(block_max, 255 * size)
        pos += size + (4 if block_checksum else 0)
        _need(data, pos, 0, "lz4")
    pos += 4 if content_checksum else 0
    _need(data, pos, 0, "lz4")
    return max(total, declared), pos


def compress(codec: Compression, data: bytes) -> bytes:
    if codec is Compression.NONE:
        return data
    if codec is Compression.GZIP:
        c = zlib.compressobj(wbits=31)  # 16 + 15: gzip framing, as Kafka's GZIPOutputStream
        return c.compress(data) + c.flush()
    cramjam = _cramjam()
    if codec is Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec is Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec is Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise UnsupportedCompressionError(f"unknown compression codec {int(codec)}")


# ---------------------------------------------------------------------------------------------
# Record-level decoding and encoding.


def decode_records(buf: bytes | bytearray | memoryview, pos: int = 0) -> list[Record]:
    """All records of the batch at ``pos``, with absolute offsets and timestamps.

    Raises ``RecordFormatError`` on malformed content; the CRC is not checked here (callers
    that read from disk check it first with ``is_crc_valid``).
    """
    header = parse_header(buf, pos)
    if len(buf) - pos < header.size:
        raise RecordFormatError(f"truncated batch at position {pos}")
    body = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    data: bytes | memoryview = body
    if header.compression is not Compression.NONE:
        data = decompress(header.compression, body)
    records: list[Record] = []
    p = 0
    for _ in range(header.record_count):
        length, p = read_varint(data, p)
        end = p + length
        if length < 0 or end > len(data):
            raise RecordFormatError(f"record length {length} runs past the batch")
        p += 1  # attributes: unused in v2
        ts_delta, p = read_varint(data, p)
        off_delta, p = read_varint(data, p)
        key, p = _read_nullable_bytes(data, p, end)
        value, p = _read_nullable_bytes(data, p, end)
        n_headers, p = read_varint(data, p)
        if n_headers < 0:
            raise RecordFormatError("negative header count")
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(n_headers):
            hkey, p = _read_nullable_bytes(data, p, end)
            if hkey is None:
                raise RecordFormatError("null header key")
            hval, p = _read_nullable_bytes(data, p, end)
            # Kafka reads a header key leniently (``Utils.utf8``): one that is not UTF-8 is
            # kept, its bytes as surrogate escapes, which ``encode_record`` writes back as
            # they were (the cleaner failed on such a record, for good).
            headers.append((hkey.decode(errors="surrogateescape"), hval))
        if p != end:
            raise RecordFormatError(f"record body is {end - p} bytes longer than its fields")
        timestamp = header.base_timestamp + ts_delta
        if not _INT64_MIN <= timestamp <= _INT64_MAX:
            timestamp = wrap_int64(timestamp)
        if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
            timestamp = header.max_timestamp
        records.append(
            Record(header.base_offset + off_delta, timestamp, key, value, tuple(headers))
        )
    if p != len(data):
        raise RecordFormatError(f"{len(data) - p} trailing bytes after the last record")
    return records


def decode_key_values(
    buf: bytes | bytearray | memoryview, pos: int = 0
) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of the batch at ``pos``: ``decode_records`` for
    readers that need nothing else (the coordinator's log replay), with the same checks, and
    offsets that increase record by record (the cleaner cannot rebuild a batch where they do
    not, so a leader of a compacted topic, which checks keys with this, refuses it).

    One-byte varints (every length under 64) are read inline: replay is bound by this loop.
    """
    header = parse_header(buf, pos)
    if len(buf) - pos < header.size:
        raise RecordFormatError(f"truncated batch at position {pos}")
    body = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    data = (
        bytes(body)
        if header.compression is Compression.NONE
        else decompress(header.compression, body)
    )
    base_offset = header.base_offset
    size = len(data)
    out: list[tuple[int, bytes | None, bytes | None]] = []
    append = out.append
    p = 0
    last_delta = -1
    for _ in range(header.record_count):
        length, p = read_varint(data, p)
        end = p + length
        if length < 0 or end > size:
            raise RecordFormatError(f"record length {length} runs past the batch")
        p += 1  # attributes: unused in v2
        b = data[p] if p < end else 0x80
        if b < 0x80:  # the timestamp delta, skipped
            p += 1
        else:
            _, p = read_varint(data, p)
        b = data[p] if p < end else 0x80
        if b < 0x80:
            off_delta = (b >> 1) ^ -(b & 1)
            p += 1
        else:
            off_delta, p = read_varint(data, p)
        if off_delta <= last_delta:
            raise OffsetsNotIncreasingError(f"record offset delta {off_delta} after {last_delta}")
        last_delta = off_delta
        fields: list[bytes | None] = []
        for _field in range(2):
            b = data[p] if p < end else 0x80
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                n, p = read_varint(data, p)
            if n < 0:
                fields.append(None)
                continue
            if p + n > end:
                raise RecordFormatError(f"field of {n} bytes runs past the record")
            fields.append(data[p : p + n])
            p += n
        if p < end and data[p] == 0:
            p += 1  # no headers
        else:
            n_headers, p = read_varint(data, p)
            if n_headers < 0:
                raise RecordFormatError("negative header count")
            for _h in range(n_headers):
                hkey, p = _read_nullable_bytes(data, p, end)
                if hkey is None:
                    raise RecordFormatError("null header key")
                _, p = _read_nullable_bytes(data, p, end)
        if p != end:
            raise RecordFormatError(f"record body is {end - p} bytes longer than its fields")
        append((base_offset + off_delta, fields[0], fields[1]))
    if p != size:
        raise RecordFormatError(f"{size - p} trailing bytes after the last record")
    return out


def _read_nullable_bytes(data: bytes | memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = read_varint(data, pos)
    if n < 0:
        return None, pos
    if pos + n > end:
        raise RecordFormatError(f"field of {n} bytes runs past the record")
    return bytes(data[pos : pos + n]), pos + n


def _write_nullable_bytes(out: bytearray, b: bytes | None) -> None:
    if b is None:
        write_varint(out, -1)
    else:
        write_varint(out, len(b))
        out += b


def encode_record(out: bytearray, offset_delta: int, timestamp_delta: int, record: Record) -> None:
    body = bytearray(b"\x00")
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    _write_nullable_bytes(body, record.key)
    _write_nullable_bytes(body, record.value)
    write_varint(body, len(record.headers))
    for hkey, hval in record.headers:
        _write_nullable_bytes(body, hkey.encode(errors="surrogateescape"))
        _write_nullable_bytes(body, hval)
    write_varint(out, len(body))
    out += body


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    last_offset_delta: int | None = None,
    delete_horizon_ms: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """Encode records (absolute offsets and timestamps) as one batch.

    ``base_offset`` defaults to the first record's offset. ``last_offset_delta`` may exceed the
    last record's delta: compaction keeps a batch's offset range even when it drops its last
    records (Kafka's LogCleaner does the same, so producer state survives cleaning).
    ``delete_horizon_ms`` sets the KIP-534 flag: the base timestamp field then holds the time
    after which the cleaner may drop the batch's tombstones, and record timestamps are deltas
    from it. ``max_timestamp`` defaults to the records' greatest; a larger one may be given
    (the cleaner keeps a producer batch's own, see ``rebuild_batch``).
    """
    if not records and last_offset_delta is None:
        raise ValueError("an empty batch needs an explicit last_offset_delta")
    if base_offset is None:
        base_offset = records[0].offset
    base_timestamp = records[0].timestamp if records else NO_TIMESTAMP
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    records_max = max((r.timestamp for r in records), default=NO_TIMESTAMP)
    if max_timestamp is None or max_timestamp < records_max:
        max_timestamp = records_max
    body = bytearray()
    prev = base_offset - 1
    for r in records:
        if r.offset <= prev:
            raise ValueError(f"record offsets must increase: {r.offset} after {prev}")
        prev = r.offset
        timestamp_delta = r.timestamp - base_timestamp
        if not _INT64_MIN <= timestamp_delta <= _INT64_MAX:
            timestamp_delta = wrap_int64(timestamp_delta)
        encode_record(body, r.offset - base_offset, timestamp_delta, r)
    if last_offset_delta is None:
        last_offset_delta = records[-1].offset - base_offset
    if records and last_offset_delta < records[-1].offset - base_offset:
        raise ValueError("last_offset_delta is below the last record's offset delta")
    payload = compress(compression, bytes(body))
    attributes = (
        int(compression)
        | (int(timestamp_type) << 3)
        | (TRANSACTIONAL_FLAG if is_transactional else 0)
        | (CONTROL_FLAG if is_control else 0)
        | (DELETE_HORIZON_FLAG if delete_horizon_ms is not None else 0)
    )
    out = bytearray(HEADER_SIZE)
    out += payload
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        len(out) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    _UINT32.pack_into(out, CRC_OFFSET, compute_crc(out, 0, len(out)))
    return bytes(out)


def rebuild_batch(
    header: BatchHeader,
    records: Sequence[Record],
    *,
    compression: Compression | None = None,
    delete_horizon_ms: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """The batch of ``header`` built again with ``records`` (some of its own, the cleaner's; or
    all of them, recompressed): its offset range, leader epoch, producer fields, timestamp type
    and transactional flag kept, in its own codec unless ``compression`` names another; its max
    timestamp the records' unless ``max_timestamp`` is larger."""
    return build_batch(
        records,
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        compression=header.compression if compression is None else compression,
        timestamp_type=header.timestamp_type,
        partition_leader_epoch=header.partition_leader_epoch,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        is_transactional=header.is_transactional,
        delete_horizon_ms=delete_horizon_ms,
        max_timestamp=max_timestamp,
    )


def empty_batch(header: BatchHeader) -> bytes:
    """The batch of ``header`` with no records left: its offset range, max timestamp, leader
    epoch and producer fields kept, uncompressed, no base timestamp. The cleaner keeps one in
    place of an active producer's last batch when compaction removes all of its records, so
    the producer's state can still be rebuilt from the log (Kafka's
    ``BatchRetention.RETAIN_EMPTY`` and ``DefaultRecordBatch.writeEmptyHeader``)."""
    attributes = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG | CONTROL_FLAG)
    out = bytearray(HEADER_SIZE)
    _HEADER.pack_into(
        out,
        0,
        header.base_offset,
        HEADER_SIZE - LOG_OVERHEAD,
        header.partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        header.last_offset_delta,
        NO_TIMESTAMP,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        0,
    )
    _UINT32.pack_into(out, CRC_OFFSET, compute_crc(out, 0, len(out)))
    return bytes(out)


_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")


def build_control_batch(
    control_type: ControlType,
    *,
    offset: int,
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker: one control record in a transactional control batch."""
    record = Record(
        offset,
        timestamp,
        _CONTROL_KEY.pack(0, int(control_type)),
        _CONTROL_VALUE.pack(0, coordinator_epoch),
    )
    return build_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=True,
        is_control=True,
    )


def parse_coordinator_epoch(value: bytes | None) -> int:
    """The coordinator epoch of a transaction marker's value (Kafka's
    ``EndTransactionMarker.deserialize``)."""
    if value is None or len(value) < _CONTROL_VALUE.size:
        raise RecordFormatError("transaction marker value must be at least 6 bytes")
    _version, coordinator_epoch = _CONTROL_VALUE.unpack_from(value)
    return int(coordinator_epoch)


def parse_control_key(key: bytes | None) -> ControlType:
    if key is None or len(key) < _CONTROL_KEY.size:
        raise RecordFormatError("control record key must be at least 4 bytes")
    _version, kind = _CONTROL_KEY.unpack_from(key)
    try:
        return ControlType(kind)
    except ValueError as e:
        raise RecordFormatError(f"unknown control record type {kind}") from e
