"""Kafka wire codec on kio's schemas: request headers and bodies in, responses out.

Frame format (Kafka's ``NetworkReceive``/``NetworkSend``)
-------------------------------------------------------
Every request and response is a 4-byte big-endian size followed by that many bytes::

    request:  size | api_key int16 | api_version int16 | correlation_id int32 | client_id
                   | [tagged fields, header v2] | body
    response: size | correlation_id int32 | [tagged fields, header v1] | body

A request uses header v2 (with tagged fields) exactly when its API version is flexible, else
v1; its ``client_id`` is a legacy nullable string either way. A response uses header v1 when
its version is flexible, except ApiVersions, which always answers with header v0 so that a
client can read the answer to a version it guessed (KIP-511). kio's schema classes carry both
rules (``__header_schema__``).

Decoding
--------
``decode_request`` walks kio's schema dataclasses itself, reading each primitive with kio's
readers. It does not call kio's native ``entity_reader``: for an array of structs that reader
allocates the announced length before reading (an ``int32`` length of 2^31 aborts the whole
process with a Rust out-of-memory error), and a request is untrusted input. Here every array
length is checked against the bytes left before anything is read, every element must consume
at least one byte, and any malformation raises ``DecodeError``, which the server answers by
closing that one connection. A request may hold at most ``MAX_REQUEST_ITEMS`` array elements
in all (a deliberate limit Kafka does not have): decoding here costs about 2.5 us and 56 bytes
of heap per element, so a 100 MiB frame of 3-byte elements took over a minute of CPU and 2 GB
where Java's parser takes about a second; a million elements is far beyond any real client's
request (a Fetch of every partition of a 200,000-partition cluster is 200,000). Strings that are
not valid UTF-8 are read with U+FFFD for the bad bytes, as Java's ``new String(bytes, UTF_8)``
in Kafka's readers does: a client whose ``client.id`` is Latin-1 is answered, not cut off.

Encoding
--------
``build_response(api_key, version, values)`` is the one version-agnostic way to make a
response: it takes plain values (dicts, lists, ints, strs, ms timestamps and durations, topic
ids as our 22-character strings), keeps the fields this version has, drops the others, fills
missing ones with the schema default (or Kafka's zero value: 0, "", empty array, null for a
nullable field) and converts kafka types (error codes, durations, UUIDs) on the way.
``encode_response`` writes header and body with kio's ``entity_writer``. Record batches stay
``bytes`` throughout.

``warm_up`` loads and compiles every schema the listener may need at start-up, so the first
request of each kind is not the one that pays for importing it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import io
import struct
import threading
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Final, NamedTuple

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_writer
from kio.serial import readers as kr
from kio.serial.errors import InvalidUnicode, SerialError

PRODUCE_KEY: Final = 0
FETCH_KEY: Final = 1
API_VERSIONS_KEY: Final = 18
FRAME_SIZE: Final = struct.Struct(">i")
_REQUEST_PREFIX: Final = struct.Struct(">hhi")
_UTC: Final = datetime.UTC
ZERO_UUID: Final = uuid.UUID(int=0)
# Kafka's limit on a string field's encoded length (Short.MAX_VALUE), in every version.
MAX_STRING_BYTES: Final = 0x7FFF
# Array elements one request may hold, at every depth (see the docstring).
MAX_REQUEST_ITEMS: Final = 1_000_000

# kio's reader convention: (buffer, offset) -> (value, bytes read).
Reader = Callable[[Any, int], tuple[Any, int]]


class DecodeError(Exception):
    """A request that is not a well-formed message of its API version."""


# ---------------------------------------------------------------------------------------------
# Schemas.


def kio_versions(api_key: int) -> range:
    """The versions kio has schemas for (contiguous), or an empty range."""
    name = api_key_map.get(api_key)
    if name is None:
        return range(0)
    versions = sorted(schema_name_map[name])
    assert versions == list(range(versions[0], versions[-1] + 1)), (api_key, versions)
    return range(versions[0], versions[-1] + 1)


@cache
def api_name(api_key: int) -> str:
    """Kafka's name of an API key (``OffsetCommit``), or ``ApiKey<n>`` for one kio lacks."""
    name = api_key_map.get(api_key)
    if name is None:
        return f"ApiKey{api_key}"
    return "".join(word.capitalize() for word in name.split("_"))


@cache
def request_schema(api_key: int, version: int) -> type[Any] | None:
    try:
        return load_request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None


@cache
def response_schema(api_key: int, version: int) -> type[Any]:
    return load_response_schema(api_key, version)


@cache
def response_field_names(api_key: int, version: int) -> frozenset[str]:
    """The top-level fields of a response."""
    return frozenset(kind.name for kind in _field_kinds(response_schema(api_key, version)))


def warm_up(versions: Mapping[int, range]) -> int:
    """Load and compile the request and response schemas of ``versions``; return how many."""
    count = 0
    for api_key, api_versions in versions.items():
        for version in api_versions:
            request = request_schema(api_key, version)
            assert request is not None, (api_key, version)
            _decoder(request)
            _decoder(request.__header_schema__)
            response = response_schema(api_key, version)
            _plan(response)
            entity_writer(response)
            entity_writer(response.__header_schema__)
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# Field classification (what kio's own serializer does, from the dataclass annotations).


class _FieldKind(NamedTuple):
    name: str
    kafka_type: str | None  # None for structs
    entity: type[Any] | None  # the struct type, for struct fields and arrays of structs
    is_array: bool
    optional: bool  # the field (or the array itself) may be null
    tag: int | None
    default: Any  # dataclasses.MISSING when the field has none


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not types.NoneType]
        assert len(args) == 1, tp
        return args[0], True
    return tp, False


_FIELD_KINDS: dict[type[Any], tuple[_FieldKind, ...]] = {}


def _field_kinds(cls: type[Any]) -> tuple[_FieldKind, ...]:
    kinds = _FIELD_KINDS.get(cls)
    if kinds is None:
        kinds = _FIELD_KINDS[cls] = _classify_fields(cls)
    return kinds


def _classify_fields(cls: type[Any]) -> tuple[_FieldKind, ...]:
    hints = typing.get_type_hints(cls)
    kinds = []
    for f in dataclasses.fields(cls):
        inner, optional = _strip_optional(hints[f.name])
        is_array = typing.get_origin(inner) is tuple
        if is_array:
            inner = typing.get_args(inner)[0]
        entity = inner if dataclasses.is_dataclass(inner) else None
        kafka_type = None if entity is not None else f.metadata["kafka_type"]
        tag = f.metadata.get("tag")
        kinds.append(
            _FieldKind(
                f.name,
                kafka_type,
                entity if isinstance(entity, type) else None,
                is_array,
                optional,
                None if tag is None else int(tag),
                f.default,
            )
        )
    return tuple(kinds)


# ---------------------------------------------------------------------------------------------
# Decoding.


def _primitive_reader(kafka_type: str, flexible: bool, optional: bool) -> Reader:
    match kafka_type:
        case "int8":
            return kr.read_int8
        case "int16":
            return kr.read_int16
        case "int32":
            return kr.read_int32
        case "int64":
            return kr.read_int64
        case "uint8":
            return kr.read_uint8
        case "uint16":
            return kr.read_uint16
        case "uint32":
            return kr.read_uint32
        case "uint64":
            return kr.read_uint64
        case "float64":
            return kr.read_float64
        case "bool":
            return kr.read_boolean
        case "uuid":
            return kr.read_uuid
        case "error_code":
            return kr.read_error_code
        case "timedelta_i32":
            return kr.read_timedelta_i32
        case "timedelta_i64":
            return _read_timedelta_i64
        case "datetime_i64":
            return kr.read_nullable_datetime_i64 if optional else kr.read_datetime_i64
        case "string":
            if flexible:
                return _bounded_compact_string(
                    _lenient(
                        kr.read_compact_string_nullable if optional else kr.read_compact_string,
                        _compact_length,
                    )
                )
            # An int16 length cannot exceed MAX_STRING_BYTES.
            return _lenient(
                kr.read_nullable_legacy_string if optional else kr.read_legacy_string,
                kr.read_int16,
            )
        case "bytes" | "records":
            if flexible:
                return (
                    kr.read_compact_string_as_bytes_nullable
                    if optional
                    else kr.read_compact_string_as_bytes
                )
            return kr.read_nullable_legacy_bytes if optional else kr.read_legacy_bytes
    raise AssertionError(f"no reader for kafka type {kafka_type!r}")


_TIMEDELTA_MIN_MS: Final = datetime.timedelta.min // datetime.timedelta(milliseconds=1)
_TIMEDELTA_MAX_MS: Final = datetime.timedelta.max // datetime.timedelta(milliseconds=1)


def _read_timedelta_i64(buf: memoryview, pos: int) -> tuple[datetime.timedelta, int]:
    """An int64 of milliseconds as a ``timedelta``, saturated at its range (about 2.7 million
    years either way): Kafka takes any long (OffsetCommit v2-v4 ``retention_time_ms``), and a
    larger one failed the decoding, closing the connection."""
    ms, size = kr.read_int64(buf, pos)
    return datetime.timedelta(milliseconds=max(_TIMEDELTA_MIN_MS, min(ms, _TIMEDELTA_MAX_MS))), size


def _lenient(read: Reader, read_length: Reader) -> Reader:
    """``read`` (a string), with U+FFFD for bytes that are not UTF-8; ``read_length`` reads
    its length prefix: (length, bytes read)."""

    def read_lenient(buf: memoryview, pos: int) -> tuple[Any, int]:
        try:
            return read(buf, pos)
        except InvalidUnicode:
            length, size = read_length(buf, pos)
            return _replacing(buf, pos + size, length), size + length

    return read_lenient


def _compact_length(buf: memoryview, pos: int) -> tuple[int, int]:
    length_plus_one, size = kr.read_unsigned_varint(buf, pos)
    return length_plus_one - 1, size


def _replacing(buf: memoryview, start: int, length: int) -> str:
    # Only reached once kio's reader found the bytes there and not UTF-8.
    if not 0 <= length <= len(buf) - start:
        raise DecodeError(f"string of {length} bytes in {len(buf) - start}")
    value = str(buf[start : start + length], "utf-8", "replace")
    # Each U+FFFD is 3 bytes written back: a string of bad bytes could come out too long for
    # any record (a group id of 20,000 such bytes is 60,000), and refusing that write
    # reloaded every group of its __consumer_offsets partition.
    written = len(value.encode())
    if written > MAX_STRING_BYTES:
        raise DecodeError(f"string of {written} bytes once its bad bytes are U+FFFD")
    return value


def _bounded_compact_string(read: Reader) -> Reader:
    """``read``, refusing a compact string over ``MAX_STRING_BYTES`` as Kafka's generated
    readers do ("string field X had invalid length"): a coordinator record or any legacy-string
    field could not carry it, so only this request fails, not a write. The length is read
    again only for a string that took more bytes than that: every request decodes strings."""

    def read_bounded(buf: memoryview, pos: int) -> tuple[Any, int]:
        value, size = read(buf, pos)
        if size > MAX_STRING_BYTES:  # only then can it be too long: its length read again
            length_plus_one, _ = kr.read_unsigned_varint(buf, pos)
            if length_plus_one - 1 > MAX_STRING_BYTES:
                raise DecodeError(
                    f"string of {length_plus_one - 1} bytes (at most {MAX_STRING_BYTES})"
                )
        return value, size

    return read_bounded


def _read_array_length(buf: memoryview, pos: int, flexible: bool) -> tuple[int | None, int]:
    """(length or None for null, bytes read)."""
    if flexible:
        raw, size = kr.read_unsigned_varint(buf, pos)
        return (None if raw == 0 else int(raw) - 1), size
    length, size = kr.read_int32(buf, pos)
    if length < -1:
        raise DecodeError(f"negative array length {length}")
    return (None if length == -1 else int(length)), size


class _ItemsLeft(threading.local):
    """Array elements the request being decoded on this thread may still hold."""

    left = MAX_REQUEST_ITEMS


_items = _ItemsLeft()


def _array_reader(item: Reader, flexible: bool, optional: bool) -> Reader:
    def read(buf: memoryview, start: int) -> tuple[Any, int]:
        length, size = _read_array_length(buf, start, flexible)
        pos = start + size
        if length is None:
            if not optional:
                raise DecodeError("null array in a non-nullable field")
            return None, size
        if length > len(buf) - pos:
            raise DecodeError(f"array of {length} items in {len(buf) - pos} bytes")
        _items.left -= length
        if _items.left < 0:
            raise DecodeError(f"more than {MAX_REQUEST_ITEMS} array elements in one request")
        items = []
        for _ in range(length):
            value, size = item(buf, pos)
            if size <= 0:
                raise DecodeError("array item of zero bytes")
            pos += size
            items.append(value)
        return tuple(items), pos - start

    return read


def _nullable_struct_reader(read_struct: Reader) -> Reader:
    # KIP-893: a nullable struct is prefixed by an int8, -1 for null and 1 for present.
    def read(buf: memoryview, start: int) -> tuple[Any, int]:
        marker, _ = kr.read_int8(buf, start)
        if marker == -1:
            return None, 1
        if marker != 1:
            raise DecodeError(f"invalid nullable struct marker {marker}")
        value, size = read_struct(buf, start + 1)
        return value, size + 1

    return read


def _field_reader(kind: _FieldKind, flexible: bool, is_header: bool) -> Reader:
    if kind.entity is not None:
        single = _decoder(kind.entity)
        if kind.is_array:
            return _array_reader(single, flexible, kind.optional)
        return _nullable_struct_reader(single) if kind.optional else single
    assert kind.kafka_type is not None
    if is_header and kind.name == "client_id":
        # RequestHeader.client_id is a legacy string in every header version.
        return _lenient(kr.read_nullable_legacy_string, kr.read_int16)
    if kind.is_array:
        item = _primitive_reader(kind.kafka_type, flexible, False)
        return _array_reader(item, flexible, kind.optional)
    return _primitive_reader(kind.kafka_type, flexible, kind.optional)


def _tagged_default(kind: _FieldKind) -> Any:
    if kind.default is not dataclasses.MISSING:
        return kind.default
    return _zero_value(kind)


class _Decoder:
    """Reads one schema dataclass; see the module docstring."""

    __slots__ = ("cls", "fields", "flexible", "tag_defaults", "tagged")

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.flexible: bool = cls.__flexible__
        is_header = cls.__name__ == "RequestHeader"
        self.fields: list[tuple[str, Reader]] = []
        self.tagged: dict[int, tuple[str, Reader]] = {}
        self.tag_defaults: dict[str, Any] = {}
        for kind in _field_kinds(cls):
            if kind.tag is None:
                self.fields.append((kind.name, _field_reader(kind, self.flexible, is_header)))
            else:
                # A tagged field is present only when set; null travels as absent.
                nullable = kind._replace(optional=True) if kind.kafka_type else kind
                self.tagged[kind.tag] = (
                    kind.name,
                    _field_reader(nullable, self.flexible, is_header),
                )
                self.tag_defaults[kind.name] = _tagged_default(kind)

    def __call__(self, buf: memoryview, start: int) -> tuple[Any, int]:
        """(entity, bytes read), as kio's readers answer."""
        pos = start
        values: dict[str, Any] = {}
        for name, read in self.fields:
            values[name], size = read(buf, pos)
            pos += size
        if self.flexible:
            values.update(self.tag_defaults)
            count, size = kr.read_unsigned_varint(buf, pos)
            pos += size
            if count > len(buf) - pos:
                raise DecodeError(f"{count} tagged fields in {len(buf) - pos} bytes")
            for _ in range(count):
                tag, size = kr.read_unsigned_varint(buf, pos)
                pos += size
                length, size = kr.read_unsigned_varint(buf, pos)
                pos += size
                end = pos + length
                if end > len(buf):
                    raise DecodeError(f"tagged field {tag} of {length} bytes runs past the end")
                known = self.tagged.get(tag)
                if known is not None:
                    name, read = known
                    values[name], _ = read(buf[:end], pos)
                pos = end  # unknown tags are skipped, as Kafka does
        return self.cls(**values), pos - start


_DECODERS: dict[type[Any], _Decoder] = {}


def _decoder(cls: type[Any]) -> _Decoder:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = _Decoder(cls)
    return decoder


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame, before anything else."""
    if len(frame) < _REQUEST_PREFIX.size:
        raise DecodeError(f"request of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id = _REQUEST_PREFIX.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def decode_request(frame: bytes) -> tuple[RequestHeader, Any]:
    """Decode header and body; the API version must be one kio has (``request_schema``).

    Bytes after the body are ignored, as Kafka's ``RequestContext.parseRequest`` does.
    """
    api_key, api_version, _ = peek_header(frame)
    cls = request_schema(api_key, api_version)
    if cls is None:
        raise DecodeError(f"no schema for api key {api_key} version {api_version}")
    buf = memoryview(frame)
    _items.left = MAX_REQUEST_ITEMS
    try:
        header, size = _decoder(cls.__header_schema__)(buf, 0)
        body, _ = _decoder(cls)(buf, size)
    except DecodeError:
        raise
    except (SerialError, ValueError, TypeError, OverflowError, UnicodeError) as e:
        # kio's readers raise BufferUnderflow/InvalidUnicode (SerialError), ValueError for bad
        # varints and unknown error codes, OverflowError for out-of-range offsets.
        raise DecodeError(f"{type(e).__name__}: {e}") from e
    return (
        RequestHeader(api_key, api_version, header.correlation_id, header.client_id),
        body,
    )


# ---------------------------------------------------------------------------------------------
# Topic ids.


def topic_id_to_uuid(topic_id: str) -> uuid.UUID:
    """Our topic ids are Kafka's ``Uuid.toString()``: URL-safe base64 of 16 bytes, unpadded."""
    try:
        raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == 16:
        return uuid.UUID(bytes=raw)
    # Not one of ours (a hand-written id in a test image): a stable stand-in.
    return uuid.uuid5(uuid.NAMESPACE_OID, topic_id)


def uuid_to_topic_id(value: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


# ---------------------------------------------------------------------------------------------
# Building responses.


def _zero_value(kind: _FieldKind) -> Any:
    """Kafka's default for a field without an explicit one (the generated classes' zeros)."""
    if kind.is_array:
        return ()
    if kind.optional:
        return None
    if kind.entity is not None:
        return _build(kind.entity, {})
    match kind.kafka_type:
        case "string":
            return ""
        case "bytes" | "records":
            return b""
        case "bool":
            return False
        case "uuid":
            return ZERO_UUID
        case "error_code":
            return ErrorCode.none
        case "timedelta_i32" | "timedelta_i64":
            return datetime.timedelta(0)
        case "datetime_i64":
            return datetime.datetime.fromtimestamp(0, _UTC)
        case "float64":
            return 0.0
    return 0


def _primitive_converter(kafka_type: str, optional: bool) -> Callable[[Any], Any]:
    match kafka_type:
        case "error_code":
            return lambda v: v if isinstance(v, ErrorCode) else ErrorCode(int(v))
        case "timedelta_i32" | "timedelta_i64":
            return lambda v: (
                v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=v)
            )
        case "datetime_i64":

            def to_datetime(v: Any) -> Any:
                if isinstance(v, datetime.datetime):
                    return v
                if v is None or (optional and v < 0):
                    return None
                return datetime.datetime.fromtimestamp(v / 1000, _UTC)

            return to_datetime
        case "uuid":

            def to_uuid(v: Any) -> Any:
                if v is None or isinstance(v, uuid.UUID):
                    return v
                return topic_id_to_uuid(v) if v else ZERO_UUID

            return to_uuid
    return lambda v: v


def _converter(kind: _FieldKind) -> Callable[[Any], Any]:
    if kind.entity is not None:
        entity = kind.entity

        def to_entity(v: Any) -> Any:
            if v is None or isinstance(v, entity):
                return v
            return _build(entity, v)

        if kind.is_array:
            return lambda v: None if v is None else tuple(to_entity(x) for x in v)
        return to_entity
    assert kind.kafka_type is not None
    item = _primitive_converter(kind.kafka_type, kind.optional and not kind.is_array)
    if kind.is_array:
        return lambda v: None if v is None else tuple(item(x) for x in v)
    return item


class _PlanItem(NamedTuple):
    name: str
    convert: Callable[[Any], Any]
    kind: _FieldKind


_PLANS: dict[type[Any], tuple[_PlanItem, ...]] = {}


def _plan(cls: type[Any]) -> tuple[_PlanItem, ...]:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple(_PlanItem(k.name, _converter(k), k) for k in _field_kinds(cls))
    return plan


def _build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for name, convert, kind in _plan(cls):
        if name in values:
            kwargs[name] = convert(values[name])
        elif kind.default is not dataclasses.MISSING:
            kwargs[name] = kind.default
        else:
            kwargs[name] = _zero_value(kind)
    return cls(**kwargs)


def build_response(api_key: int, version: int, values: Mapping[str, Any]) -> Any:
    """The kio response of ``api_key``/``version`` holding ``values`` (see the docstring)."""
    return _build(response_schema(api_key, version), values)


def build_request(api_key: int, version: int, values: Mapping[str, Any]) -> Any:
    """The same for a request (tests and tools that speak to a listener)."""
    cls = request_schema(api_key, version)
    if cls is None:
        raise ValueError(f"no schema for api key {api_key} version {version}")
    return _build(cls, values)


def encode_response(correlation_id: int, body: Any) -> bytes:
    """Size prefix, the response header the body's schema calls for, then the body."""
    cls = type(body)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    entity_writer(header_cls)(buf, header_cls(correlation_id=correlation_id))
    entity_writer(cls)(buf, body)
    out = buf.getbuffer()
    FRAME_SIZE.pack_into(out, 0, len(out) - FRAME_SIZE.size)
    return bytes(out)
