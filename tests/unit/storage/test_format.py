"""The v2 record batch codec: round trips, client cross-checks, bad input."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder

from kcoord.storage import format as fmt

nullable_bytes = st.none() | st.binary(max_size=64)
headers = st.lists(st.tuples(st.text(max_size=8), nullable_bytes), max_size=3).map(tuple)


@st.composite
def record_lists(draw: st.DrawFn) -> list[fmt.Record]:
    n = draw(st.integers(1, 20))
    base = draw(st.integers(0, 2**40))
    base_ts = draw(st.integers(0, 2**41))
    offset = base
    out = []
    for _ in range(n):
        out.append(
            fmt.Record(
                offset,
                base_ts + draw(st.integers(-1000, 10**6)),
                draw(nullable_bytes),
                draw(nullable_bytes),
                draw(headers),
            )
        )
        offset += draw(st.integers(1, 3))
    return out


codecs = st.sampled_from(list(fmt.Compression))


@settings(max_examples=200)
@given(record_lists(), codecs, st.integers(-1, 1000))
def test_round_trip(records: list[fmt.Record], codec: fmt.Compression, epoch: int) -> None:
    raw = fmt.build_batch(records, compression=codec, partition_leader_epoch=epoch)
    header = fmt.parse_header(raw)
    assert header.size == len(raw)
    assert header.base_offset == records[0].offset
    assert header.last_offset == records[-1].offset
    assert header.record_count == len(records)
    assert header.compression is codec
    assert header.partition_leader_epoch == epoch
    assert header.max_timestamp == max(r.timestamp for r in records)
    assert fmt.is_crc_valid(raw, 0, header)
    assert fmt.decode_records(raw) == records
    assert fmt.decode_key_values(raw) == [(r.offset, r.key, r.value) for r in records]


@given(st.binary(max_size=300), st.integers(0, 60))
def test_decode_key_values_rejects_what_decode_records_rejects(garbage: bytes, at: int) -> None:
    """A valid batch with its records' bytes replaced: both decoders fail alike or agree."""
    raw = bytearray(fmt.build_batch([fmt.Record(0, 0, b"k", b"v", ())]))
    raw[fmt.HEADER_SIZE + min(at, 6) :] = garbage
    fmt.BATCH_PREFIX.pack_into(raw, 0, 0, len(raw) - 12, 0)
    try:
        expected = [(r.offset, r.key, r.value) for r in fmt.decode_records(raw)]
    except fmt.RecordFormatError:
        with pytest.raises(fmt.RecordFormatError):
            fmt.decode_key_values(raw)
        return
    assert fmt.decode_key_values(raw) == expected


@given(record_lists(), st.integers(0, 2**50), st.integers(0, 2**20))
def test_rewriting_base_offset_and_epoch_keeps_crc(
    records: list[fmt.Record], new_base: int, epoch: int
) -> None:
    buf = bytearray(fmt.build_batch(records))
    fmt.set_base_offset(buf, 0, new_base)
    fmt.set_partition_leader_epoch(buf, 0, epoch)
    header = fmt.parse_header(buf)
    assert fmt.is_crc_valid(buf, 0, header)
    shift = new_base - records[0].offset
    assert [r.offset for r in fmt.decode_records(buf)] == [r.offset + shift for r in records]
    assert header.partition_leader_epoch == epoch


@given(record_lists())
def test_every_single_byte_flip_in_the_crc_range_is_detected(records: list[fmt.Record]) -> None:
    raw = fmt.build_batch(records)
    header = fmt.parse_header(raw)
    for i in range(fmt.ATTRIBUTES_OFFSET, len(raw), max(1, len(raw) // 50)):
        flipped = bytearray(raw)
        flipped[i] ^= 0x01
        h = fmt.parse_header(flipped) if i >= fmt.HEADER_SIZE else header._replace(crc=header.crc)
        assert not fmt.is_crc_valid(flipped, 0, h)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_aiokafka_batches_are_read_by_ours(codec: int) -> None:
    builder = AioBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=42,
        producer_epoch=3,
        base_sequence=7,
        batch_size=1 << 20,
    )
    for i in range(50):
        hdrs = [("h", b"v")] if i % 2 else []
        builder.append(
            i, timestamp=1_700_000_000_000 + i, key=f"k{i}".encode(), value=b"x" * i, headers=hdrs
        )
    raw = bytes(builder.build())
    header = fmt.parse_header(raw)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
    assert fmt.is_crc_valid(raw, 0, header)
    records = fmt.decode_records(raw)
    assert [r.key for r in records] == [f"k{i}".encode() for i in range(50)]
    assert records[3].headers == (("h", b"v"),)
    assert records[49].value == b"x" * 49
    assert records[10].timestamp == 1_700_000_000_010


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_kafka_python_batches_are_read_by_ours(codec: int) -> None:
    builder = KpBuilder(2, codec, 0, -1, -1, -1, 1 << 20)
    for i in range(30):
        builder.append(i, timestamp=1_000 + i, key=None, value=f"v{i}".encode(), headers=[])
    raw = bytes(builder.build())
    records = fmt.decode_records(raw)
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(30)]
    assert all(r.key is None for r in records)


@pytest.mark.parametrize("codec", list(fmt.Compression))
def test_ours_are_read_by_aiokafka_and_kafka_python(codec: fmt.Compression) -> None:
    records = [
        fmt.Record(100 + i, 5_000 + i, f"k{i}".encode(), None if i == 3 else b"val", (("a", b"1"),))
        for i in range(10)
    ]
    raw = fmt.build_batch(
        records, compression=codec, producer_id=9, producer_epoch=1, base_sequence=0
    )
    for batch_type in (AioBatch, KpBatch):
        batch = batch_type(raw)
        assert batch.validate_crc()
        got = list(batch)
        assert [r.offset for r in got] == [r.offset for r in records]
        assert [r.key for r in got] == [r.key for r in records]
        assert [r.value for r in got] == [r.value for r in records]
        assert [r.timestamp for r in got] == [r.timestamp for r in records]
        assert [list(r.headers) for r in got] == [[("a", b"1")]] * 10


def test_timestamps_wrap_at_64_bits_as_javas_longs() -> None:
    """A record's timestamp is its batch's base plus its delta in Java's long arithmetic
    (``DefaultRecord.readFrom``), which wraps, as aiokafka's C reader does; ours kept Python's
    unbounded sum, and a leader rebuilding such a batch failed packing its header (the whole
    Produce request failed, partitions already appended included)."""
    top, bottom = (1 << 63) - 1, -(1 << 63)
    records = [fmt.Record(0, top, b"k", b"v"), fmt.Record(1, bottom, b"j", b"w")]
    raw = fmt.build_batch(records)  # the delta, bottom - top, wraps to 1
    assert [r.timestamp for r in AioBatch(raw)] == [top, bottom]
    assert fmt.decode_records(raw) == records
    # A batch whose first record's base plus delta overflows: read as aiokafka reads it,
    # and built again (as a leader renumbering it does) the same.
    builder = AioBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, timestamp=top, key=b"a", value=b"1", headers=[])
    builder.append(1, timestamp=top, key=b"b", value=b"2", headers=[])
    produced = bytearray(builder.build())
    produced[fmt.HEADER_SIZE + 2] = 2  # the first record's delta (after length, attributes): 1
    produced[fmt.CRC_OFFSET : fmt.CRC_OFFSET + 4] = fmt.compute_crc(
        produced, 0, len(produced)
    ).to_bytes(4, "big")
    read = fmt.decode_records(bytes(produced))
    assert [r.timestamp for r in read] == [r.timestamp for r in AioBatch(bytes(produced))]
    assert [r.timestamp for r in read] == [bottom, top]
    rebuilt = fmt.rebuild_batch(fmt.parse_header(bytes(produced)), read)
    assert [r.timestamp for r in AioBatch(rebuilt)] == [bottom, top]
    assert fmt.decode_records(rebuilt) == read


def test_control_batch() -> None:
    raw = fmt.build_control_batch(
        fmt.ControlType.COMMIT,
        offset=5,
        timestamp=1,
        producer_id=3,
        producer_epoch=0,
        coordinator_epoch=7,
    )
    header = fmt.parse_header(raw)
    assert header.is_control and header.is_transactional
    (record,) = fmt.decode_records(raw)
    assert fmt.parse_control_key(record.key) is fmt.ControlType.COMMIT
    assert AioBatch(raw).is_control_batch


def test_delete_horizon_batch_keeps_record_timestamps() -> None:
    records = [fmt.Record(0, 1_000, b"k", None), fmt.Record(1, 1_005, b"j", b"v")]
    raw = fmt.build_batch(records, delete_horizon_ms=99_999)
    header = fmt.parse_header(raw)
    assert header.attributes & fmt.DELETE_HORIZON_FLAG
    assert header.base_timestamp == 99_999
    assert fmt.decode_records(raw) == records


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:30], "truncated batch header"),
        (lambda b: b[:16] + b"\x01" + b[17:], "unsupported magic"),
        (lambda b: b[:8] + b"\x00\x00\x00\x05" + b[12:], "below minimum"),
    ],
)
def test_malformed_headers_raise_clear_errors(mutate: object, message: str) -> None:
    raw = fmt.build_batch([fmt.Record(0, 0, b"k", b"v")])
    bad = mutate(raw)  # type: ignore[operator]
    with pytest.raises(fmt.RecordFormatError, match=message):
        fmt.parse_header(bad)


@given(st.binary(max_size=300))
def test_garbage_never_escapes_as_another_exception(garbage: bytes) -> None:
    try:
        for pos, _header in fmt.iter_headers(garbage):
            fmt.decode_records(garbage, pos)
    except fmt.RecordFormatError:
        pass


def test_scan_valid_prefix_stops_at_torn_and_corrupt_batches() -> None:
    a = fmt.build_batch([fmt.Record(0, 0, b"a", b"1")])
    b = fmt.build_batch([fmt.Record(1, 0, b"b", b"2")])
    c = fmt.build_batch([fmt.Record(2, 0, b"c", b"3")])
    result = fmt.scan_valid_prefix(a + b + c[:-3])
    assert result.valid_bytes == len(a) + len(b)
    assert result.error is not None and "torn" in result.error
    corrupt = bytearray(a + b + c)
    corrupt[len(a) + fmt.HEADER_SIZE + 2] ^= 0xFF
    result = fmt.scan_valid_prefix(corrupt)
    assert result.valid_bytes == len(a)
    assert result.error is not None and "CRC" in result.error
    result = fmt.scan_valid_prefix(b + a)
    assert result.valid_bytes == len(b)
    assert result.error is not None and "below the expected" in result.error


@given(st.integers(-(2**63), 2**63 - 1))
def test_varint_round_trip(n: int) -> None:
    out = bytearray()
    fmt.write_varint(out, n)
    assert fmt.read_varint(out, 0) == (n, len(out))


def _compressed_by_the_clients(data: bytes) -> dict[str, tuple[fmt.Compression, bytes]]:
    """``data`` compressed as the clients' libraries frame it (kafka-python, aiokafka and
    librdkafka's framings: xerial or raw snappy, lz4 frames of 64 KiB blocks, zstd frames with
    or without a declared size), and as kcoord does."""
    import cramjam
    import lz4.frame
    import snappy
    import zstandard
    from kafka.codec import snappy_encode

    stream = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    return {
        "gzip": (fmt.Compression.GZIP, fmt.compress(fmt.Compression.GZIP, data)),
        "snappy raw": (fmt.Compression.SNAPPY, snappy.compress(data)),
        "snappy xerial": (
            fmt.Compression.SNAPPY,
            snappy_encode(data, xerial_compatible=True, xerial_blocksize=32 * 1024),
        ),
        "lz4 linked, checksums": (
            fmt.Compression.LZ4,
            lz4.frame.compress(data, block_linked=True, block_checksum=True, content_checksum=True),
        ),
        "lz4 sized": (fmt.Compression.LZ4, lz4.frame.compress(data, store_size=True)),
        "lz4 kcoord": (fmt.Compression.LZ4, fmt.compress(fmt.Compression.LZ4, data)),
        "zstd sized": (fmt.Compression.ZSTD, bytes(cramjam.zstd.compress(data))),
        "zstd streamed": (fmt.Compression.ZSTD, stream.compress(data) + stream.flush()),
        "zstd unsized": (
            fmt.Compression.ZSTD,
            zstandard.ZstdCompressor(write_content_size=False).compress(data),
        ),
    }


@pytest.mark.parametrize("size", [0, 1, 1_000, 300_000, 3_000_000])
def test_every_framing_decompresses_within_its_bound(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    for name, (codec, packed) in _compressed_by_the_clients(data).items():
        assert fmt.decompress(codec, packed) == data, name
        if codec is not fmt.Compression.GZIP:
            assert fmt.decompressed_size_bound(codec, packed) >= size, name


def zstd_zeros(size: int) -> bytes:
    """A zstd frame of ``size`` (> 0) zero bytes, declared in its header, in RLE blocks of
    128 KiB (RFC 8878: an 8-byte content size and a 128 KiB window, so a decoder really
    inflates it, as it would the clients' frames; each block a 3-byte header and the byte
    repeated): 4 bytes a block, whatever the size."""
    assert size > 0
    block = 128 * 1024
    # Frame header descriptor 0xC0: 8-byte content size, not single-segment; window 0x38:
    # 2^(10 + 7) bytes.
    frame = bytearray(b"\x28\xb5\x2f\xfd\xc0\x38") + size.to_bytes(8, "little")
    sizes = [block] * (size // block) + ([size % block] if size % block else [])
    for i, n in enumerate(sizes):
        last = int(i == len(sizes) - 1)
        frame += ((n << 3) | (1 << 1) | last).to_bytes(3, "little") + b"\x00"  # type 1: RLE
    return bytes(frame)


def test_a_decompression_bomb_is_refused_before_it_is_inflated() -> None:
    """A few KiB of zstd decompressed to hundreds of MiB, and a leader decompresses every
    compressed batch produced (to count its records): one request could take a node's
    memory. What the framing allows is bounded before anything is inflated (gzip, which
    declares nothing, is inflated as a stream and stopped at the limit)."""
    limit = 1024 * 1024
    zeros = bytes(limit + 1)
    for name, (codec, packed) in _compressed_by_the_clients(zeros).items():
        with pytest.raises(fmt.RecordFormatError, match="decompress to more than"):
            fmt.decompress(codec, packed, max_bytes=limit)
        assert fmt.decompress(codec, packed, max_bytes=limit + 1) == zeros, name
    # The default limit, on a batch: 8 KiB of zstd claiming 256 MiB (made by hand, so the
    # test itself never holds 256 MiB; the same frame, small, decompresses as it says).
    assert fmt.decompress(fmt.Compression.ZSTD, zstd_zeros(300_000), max_bytes=10**6) == bytes(
        300_000
    )
    body = zstd_zeros(256 * 1024 * 1024)
    assert len(body) < 16 * 1024
    header = fmt.build_batch([fmt.Record(0, 0, None, b"v")], compression=fmt.Compression.ZSTD)
    bomb = bytearray(header[: fmt.HEADER_SIZE] + body)
    bomb[8:12] = (len(bomb) - 12).to_bytes(4, "big")  # the batch length
    with pytest.raises(fmt.RecordFormatError, match="decompress to more than"):
        fmt.decode_records(bomb)


def test_broken_framing_is_a_format_error() -> None:
    for codec, packed in [
        (fmt.Compression.ZSTD, b"\x28\xb5\x2f\xfd\x00"),  # a header, no block
        (fmt.Compression.ZSTD, b"\x28\xb5\x2f\xfd\x20\x05\x07\x00\x00"),  # reserved block type
        (fmt.Compression.LZ4, b"\x04\x22\x4d\x18\x00\x40"),  # version 0
        (fmt.Compression.LZ4, b"\x04\x22\x4d\x18\x60\x40\x82\x10\x00\x00\x00"),  # cut block
        (fmt.Compression.SNAPPY, b"\xff\xff\xff\xff\xff\xff"),
        (fmt.Compression.ZSTD, b"nope"),
    ]:
        with pytest.raises(fmt.RecordFormatError):
            fmt.decompress(codec, packed)
