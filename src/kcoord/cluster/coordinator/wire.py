"""Kafka's message-protocol primitive types, the small subset coordinator records need. Pure.

Everything is big-endian, as in Kafka's ``ByteBufferAccessor`` / ``Readable`` / ``Writable``
(clients/src/main/java/org/apache/kafka/common/protocol/) and the protocol guide's "Protocol
Primitive Types". A message version is either *classic* or *flexible* (KIP-482); the two differ
only in how lengths are written and in the trailing tagged-field section::

    type              classic (non-flexible)            flexible
    int8/16/32/64     1/2/4/8 bytes, two's complement   same
    uuid              16 bytes (most significant long first)
    string            int16 length, UTF-8               unsigned varint (length + 1), UTF-8
    nullable string   int16 length, -1 = null           unsigned varint, 0 = null
    bytes             int32 length                      unsigned varint (length + 1)
    nullable bytes    int32 length, -1 = null           unsigned varint, 0 = null
    array             int32 count, -1 = null            unsigned varint (count + 1), 0 = null
    tagged fields     (absent)                          unsigned varint count, then per field:
                                                        unsigned varint tag, unsigned varint
                                                        size, size bytes; tags ascending

An unsigned varint is 7 bits per byte, least significant group first, high bit set on every byte
but the last (at most 5 bytes for the 32-bit values used here). It is *not* the zig-zag varint of
the record format (``storage/format.py``).

Strings are at most ``0x7fff`` bytes in both forms: Kafka's generated writers refuse longer ones
and its readers reject them ("string field ... had invalid length").

``Reader`` raises ``WireFormatError`` for every malformed input (truncation, a negative or
oversized length, invalid UTF-8, trailing garbage), never ``IndexError`` or ``struct.error``.
``Writer`` raises ``ValueError`` for values that do not fit their type, where Kafka would throw.
"""

from __future__ import annotations

import struct

MAX_STRING_BYTES = 0x7FFF
UUID_SIZE = 16
_MAX_UVARINT32 = 0xFFFFFFFF

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

_RANGES: dict[str, tuple[struct.Struct, int, int]] = {
    "int8": (_INT8, -(1 << 7), (1 << 7) - 1),
    "int16": (_INT16, -(1 << 15), (1 << 15) - 1),
    "int32": (_INT32, -(1 << 31), (1 << 31) - 1),
    "int64": (_INT64, -(1 << 63), (1 << 63) - 1),
}


class WireFormatError(ValueError):
    """Bytes that do not parse as the expected Kafka message."""


class Reader:
    """A cursor over one message. ``flexible`` selects compact lengths (see the module table)."""

    __slots__ = ("_buf", "_pos", "flexible")

    def __init__(self, buf: bytes | bytearray | memoryview, *, flexible: bool = False) -> None:
        self._buf = memoryview(buf).cast("B")
        self._pos = 0
        self.flexible = flexible

    @property
    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def _take(self, size: int, what: str) -> memoryview:
        if size > self.remaining:
            raise WireFormatError(
                f"truncated: {what} needs {size} bytes at position {self._pos}, "
                f"{self.remaining} left"
            )
        view = self._buf[self._pos : self._pos + size]
        self._pos += size
        return view

    def _fixed(self, fmt: struct.Struct, what: str) -> int:
        value: int = fmt.unpack(self._take(fmt.size, what))[0]
        return value

    def int8(self, what: str = "int8") -> int:
        return self._fixed(_INT8, what)

    def int16(self, what: str = "int16") -> int:
        return self._fixed(_INT16, what)

    def int32(self, what: str = "int32") -> int:
        return self._fixed(_INT32, what)

    def int64(self, what: str = "int64") -> int:
        return self._fixed(_INT64, what)

    def uuid(self, what: str = "uuid") -> bytes:
        return bytes(self._take(UUID_SIZE, what))

    def unsigned_varint(self, what: str = "varint") -> int:
        value = 0
        for shift in range(0, 35, 7):
            byte = self._take(1, what)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if value > _MAX_UVARINT32:
                    break
                return value
        raise WireFormatError(f"{what}: unsigned varint longer than 32 bits")

    def nullable_string(self, what: str = "string") -> str | None:
        n = self.unsigned_varint(what) - 1 if self.flexible else self._fixed(_INT16, what)
        if n == -1:
            return None
        if n < 0 or n > MAX_STRING_BYTES:
            raise WireFormatError(f"{what}: invalid string length {n}")
        raw = self._take(n, what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise WireFormatError(f"{what}: invalid UTF-8 ({e.reason})") from None

    def string(self, what: str = "string") -> str:
        s = self.nullable_string(what)
        if s is None:
            raise WireFormatError(f"{what}: non-nullable string was null")
        return s

    def nullable_bytes(self, what: str = "bytes") -> bytes | None:
        n = self.unsigned_varint(what) - 1 if self.flexible else self._fixed(_INT32, what)
        if n == -1:
            return None
        if n < 0:
            raise WireFormatError(f"{what}: invalid bytes length {n}")
        return bytes(self._take(n, what))

    def bytes_(self, what: str = "bytes") -> bytes:
        b = self.nullable_bytes(what)
        if b is None:
            raise WireFormatError(f"{what}: non-nullable bytes were null")
        return b

    def array_length(self, what: str = "array") -> int:
        """The element count of a non-nullable array, bounded by the bytes left."""
        n = self.unsigned_varint(what) - 1 if self.flexible else self._fixed(_INT32, what)
        if n < 0:
            raise WireFormatError(f"{what}: non-nullable array has length {n}")
        # Every element takes at least one byte; refuse counts that cannot fit, as Kafka does
        # ("Tried to allocate a collection of size ..."), before allocating anything.
        if n > self.remaining:
            raise WireFormatError(f"{what}: array of {n} elements but {self.remaining} bytes left")
        return n

    def tagged_fields(self, what: str = "tagged fields") -> dict[int, bytes]:
        """Read a flexible tagged-field section; returns tag -> raw field bytes."""
        fields: dict[int, bytes] = {}
        count = self.unsigned_varint(what)
        previous_tag = -1
        for _ in range(count):
            tag = self.unsigned_varint(what)
            if tag <= previous_tag:
                raise WireFormatError(f"{what}: tag {tag} after tag {previous_tag}")
            previous_tag = tag
            size = self.unsigned_varint(what)
            fields[tag] = bytes(self._take(size, f"{what} (tag {tag})"))
        return fields

    def raise_if_not_at_end(self, what: str) -> None:
        if self.remaining:
            raise WireFormatError(f"{what}: {self.remaining} unexpected trailing bytes")


def _unsigned_varint(value: int) -> bytes:
    if not 0 <= value <= _MAX_UVARINT32:
        raise ValueError(f"unsigned varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class Writer:
    """Builds one message. ``flexible`` selects compact lengths (see the module table)."""

    __slots__ = ("_out", "flexible")

    def __init__(self, *, flexible: bool = False) -> None:
        self._out = bytearray()
        self.flexible = flexible

    def getvalue(self) -> bytes:
        return bytes(self._out)

    def _fixed(self, kind: str, value: int, what: str) -> None:
        fmt, low, high = _RANGES[kind]
        if not low <= value <= high:
            raise ValueError(f"{what}: {value} does not fit in {kind}")
        self._out += fmt.pack(value)

    def int8(self, value: int, what: str = "int8") -> None:
        self._fixed("int8", value, what)

    def int16(self, value: int, what: str = "int16") -> None:
        self._fixed("int16", value, what)

    def int32(self, value: int, what: str = "int32") -> None:
        self._fixed("int32", value, what)

    def int64(self, value: int, what: str = "int64") -> None:
        self._fixed("int64", value, what)

    def uuid(self, value: bytes, what: str = "uuid") -> None:
        if len(value) != UUID_SIZE:
            raise ValueError(f"{what}: a uuid is {UUID_SIZE} bytes, got {len(value)}")
        self._out += value

    def unsigned_varint(self, value: int) -> None:
        self._out += _unsigned_varint(value)

    def raw(self, data: bytes) -> None:
        self._out += data

    def _length(self, n: int, classic: str) -> None:
        """Write a length (-1 = null) in the current encoding; ``classic`` is int16 or int32."""
        if self.flexible:
            self.unsigned_varint(n + 1)
        else:
            self._fixed(classic, n, "length")

    def nullable_string(self, value: str | None, what: str = "string") -> None:
        if value is None:
            self._length(-1, "int16")
            return
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{what}: not encodable as UTF-8 ({e.reason})") from None
        if len(encoded) > MAX_STRING_BYTES:
            raise ValueError(f"{what}: {len(encoded)} bytes is too long to be serialized")
        self._length(len(encoded), "int16")
        self._out += encoded

    def string(self, value: str, what: str = "string") -> None:
        self.nullable_string(value, what)

    def nullable_bytes(self, value: bytes | None) -> None:
        if value is None:
            self._length(-1, "int32")
            return
        self._length(len(value), "int32")
        self._out += value

    def bytes_(self, value: bytes) -> None:
        self.nullable_bytes(value)

    def array_length(self, n: int) -> None:
        self._length(n, "int32")

    def tagged_fields(self, fields: dict[int, bytes] | None = None) -> None:
        """Write a tagged-field section (flexible versions only); tags are sorted ascending."""
        items = sorted((fields or {}).items())
        self.unsigned_varint(len(items))
        for tag, data in items:
            self.unsigned_varint(tag)
            self.unsigned_varint(len(data))
            self._out += data
