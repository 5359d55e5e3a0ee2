"""A minimal Kafka wire client for tests: requests built from plain values, responses parsed
with kio. Blocking (``WireClient``, for integration tests against node processes) and asyncio
(``AsyncWireClient``, for in-process tests) flavours share the encoding."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, TypeVar

from kcoord.node.kafka.client import decode_response, encode_request

SIZE = struct.Struct(">i")
_Readable = TypeVar("_Readable", socket.socket, IO[str])
__all__ = ["AsyncWireClient", "WireClient", "decode_response", "encode_request", "readable"]


def readable(sources: Sequence[_Readable], timeout_s: float) -> list[_Readable]:
    """Which of ``sources`` have bytes to read (or were closed), waiting up to ``timeout_s``.
    Through epoll, not ``select.select``: a test worker may hold descriptors past select's
    limit of 1024 (FD_SETSIZE), and select then refuses every descriptor above it."""
    if not sources:
        return []
    with selectors.DefaultSelector() as selector:
        for source in sources:
            selector.register(source, selectors.EVENT_READ)
        ready = {key.fd for key, _ in selector.select(timeout_s)}
    return [source for source in sources if source.fileno() in ready]


class WireClient:
    """One blocking connection; ``call`` sends a request and reads its response."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, api_key: int, version: int, values: Mapping[str, Any]) -> int:
        self.correlation_id += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation_id, values))
        return self.correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes:
        (size,) = SIZE.unpack(self._read_exactly(SIZE.size))
        return self._read_exactly(size)

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("connection closed by the server")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def call(self, api_key: int, version: int, values: Mapping[str, Any]) -> Any:
        sent = self.send(api_key, version, values)
        correlation_id, body = decode_response(api_key, version, self.read_frame())
        assert correlation_id == sent, (correlation_id, sent)
        return body

    def is_closed_by_server(self, deadline_s: float = 10.0) -> bool:
        """True once the server has closed the connection (EOF or reset) before the deadline."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            self.sock.settimeout(max(end - time.monotonic(), 0.01))
            try:
                if not self.sock.recv(65536):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
            except TimeoutError:
                return False
        return False


class AsyncWireClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.correlation_id = 0

    @classmethod
    async def connect(cls, host: str, port: int) -> AsyncWireClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()

    async def send(self, api_key: int, version: int, values: Mapping[str, Any]) -> int:
        self.correlation_id += 1
        self.writer.write(encode_request(api_key, version, self.correlation_id, values))
        await self.writer.drain()
        return self.correlation_id

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_frame(self) -> bytes:
        (size,) = SIZE.unpack(await self.reader.readexactly(SIZE.size))
        return await self.reader.readexactly(size)

    async def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        return decode_response(api_key, version, await self.read_frame())

    async def call(self, api_key: int, version: int, values: Mapping[str, Any]) -> Any:
        sent = await self.send(api_key, version, values)
        correlation_id, body = await self.receive(api_key, version)
        assert correlation_id == sent, (correlation_id, sent)
        return body

    async def closed_by_server(self) -> bool:
        """Reads until the server closes; True on EOF (the caller bounds the wait)."""
        try:
            while await self.reader.read(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        return True
