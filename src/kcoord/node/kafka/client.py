"""A minimal blocking Kafka wire client: requests from plain values, responses parsed by kio.

For kcoord's own command-line tools (``kcoord quorum describe``) and tests. One request per
call over one connection; the frame format is in ``codec``.
"""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Mapping
from typing import Any

from kio.serial import entity_reader, entity_writer

from kcoord.node.kafka import codec

SIZE = struct.Struct(">i")


class NoAnswerError(TimeoutError):
    """The request was sent and its answer did not come in time: the server may have carried
    it out (a retry of a CreateTopics could then find the topic it made)."""


class BadAnswerError(Exception):
    """The answer did not decode as the request's API: whatever answered may have carried the
    request out, so it is not sent again elsewhere (not an ``OSError``, which the tools take
    for a server they could not reach)."""


class RequestValueError(ValueError):
    """A request could not be encoded: a value is outside its field's range. Nothing was sent."""


def encode_request(
    api_key: int,
    version: int,
    correlation_id: int,
    values: Mapping[str, Any],
    client_id: str | None = "kcoord",
) -> bytes:
    """A whole frame: size, request header (v1 or v2 as the version calls for), body."""
    body = codec.build_request(api_key, version, values)
    header_cls = type(body).__header_schema__
    header = header_cls(
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(type(body))(buf, body)
    data = buf.getvalue()
    return SIZE.pack(len(data)) + data


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, kio response) of a response frame without its size prefix."""
    cls = codec.response_schema(api_key, version)
    header, size = entity_reader(cls.__header_schema__)(frame, 0)
    body, _ = entity_reader(cls)(frame, size)
    return header.correlation_id, body


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def call_once(
    host: str, port: int, api_key: int, version: int, values: Mapping[str, Any], *, timeout_s: float
) -> Any:
    """Send one request and return the kio response body; ``NoAnswerError`` if it was sent and
    no answer came within ``timeout_s``."""
    try:
        request = encode_request(api_key, version, 1, values)
    except (struct.error, OverflowError) as e:
        # A value past its field's range (an int32 partition count, an int16 string length):
        # no server saw it. Kafka's tools refuse such options before sending.
        raise RequestValueError(f"a value does not fit the request's fields: {e}") from e
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        try:
            sock.sendall(request)
            (size,) = SIZE.unpack(_read_exactly(sock, SIZE.size))
            frame = _read_exactly(sock, size)
        except TimeoutError as e:
            raise NoAnswerError(f"no answer from {host}:{port} within {timeout_s:g} s") from e
        try:
            correlation_id, body = decode_response(api_key, version, frame)
        except Exception as e:
            # kio's reader raises whatever the bytes lead it to (BufferUnderflow, ValueError):
            # an answer that is not this API's, from something that is not a Kafka broker.
            raise BadAnswerError(
                f"the answer from {host}:{port} does not decode as {codec.api_name(api_key)} "
                f"v{version}: {e!r}"
            ) from e
    if correlation_id != 1:
        raise ConnectionError(f"response to correlation id {correlation_id}, expected 1")
    return body
