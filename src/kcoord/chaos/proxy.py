"""A TCP fault proxy that speaks (a subset of) Toxiproxy's HTTP API.

The chaos lab's kernel has no ``netem``, so latency, bandwidth limits, slicing, stalls and resets
on the wire come from this proxy instead (DESIGN.md section 9: "Toxiproxy (toxiproxy-python)").
Any Toxiproxy client can drive it; the tests use the PyPI package ``toxiproxy-python``. Run it::

    python -m kcoord.chaos.proxy --api 127.0.0.1:8474 [--seed N]

It prints the bound API address (``host:port``, so ``--api 127.0.0.1:0`` works) on stdout, the
seed on stderr, and runs until SIGTERM or SIGINT.

HTTP API
--------

JSON in and out, errors as ``{"error": message, "status": code}``; the shapes and codes are
Toxiproxy 2.x's (``api.go``)::

    GET    /version                              200 {"version": ...}
    POST   /reset                                204  every proxy enabled, every toxic removed
    GET    /proxies                              200 {name: proxy, ...}
    POST   /proxies                              201 proxy; 409 name taken; 400 bad body
    GET    /proxies/{proxy}                      200 proxy; 404
    POST   /proxies/{proxy}     (or PATCH)       200 proxy; sets enabled/listen/upstream
    DELETE /proxies/{proxy}                      204; 404
    GET    /proxies/{proxy}/toxics               200 [toxic, ...] (upstream ones first)
    POST   /proxies/{proxy}/toxics               200 toxic; 409 name taken; 400 bad type/stream
    GET    /proxies/{proxy}/toxics/{toxic}       200 toxic; 404
    POST   /proxies/{proxy}/toxics/{toxic}  (or PATCH)  200 toxic; merges attributes/toxicity
    DELETE /proxies/{proxy}/toxics/{toxic}       204; 404

    proxy = {"name", "listen", "upstream", "enabled", "toxics": [toxic, ...]}
    toxic = {"name", "type", "stream", "toxicity", "attributes": {...}}

A proxy listens on ``listen`` (``host:port``; port 0 binds an ephemeral port, and ``listen`` then
reports the real one, kept across disable/enable as Toxiproxy does) and connects each accepted
client to ``upstream``. Disabling a proxy closes its listener and every connection through it.
A toxic's ``stream`` is ``upstream`` (client to server) or ``downstream`` (server to client,
the default); its name defaults to ``{type}_{stream}``.

Toxics (attributes are integers, times in the units Toxiproxy uses)
-------------------------------------------------------------------

``latency`` (``latency``, ``jitter`` ms)
    Each chunk leaves ``latency`` +/- ``jitter`` ms after it reached the toxic. Chunks are
    pipelined (a steady stream is delayed once, not once per chunk); latencies of chained
    toxics add up.
``bandwidth`` (``rate`` KB/s, 1 KB = 1000 bytes)
    Data leaves at ``rate``, in pieces of at most 100 ms worth. Rate 0 lets nothing through.
``slow_close`` (``delay`` ms)
    The end of the stream (FIN or close) is passed on ``delay`` ms late; data is untouched.
``timeout`` (``timeout`` ms)
    Nothing passes: the toxic stops reading, so data waits, and back-pressure reaches the
    sender as it would behind a network partition. After ``timeout`` ms the connection is closed;
    with ``timeout`` 0 it stays open and the held data flows on, in order, once the toxic is
    removed (a healed partition).
``reset_peer`` (``timeout`` ms)
    The first data (or end of stream) to reach the toxic is dropped, and ``timeout`` ms later
    both sockets of the connection are closed with ``SO_LINGER`` 0: each peer gets an RST.
``slicer`` (``average_size``, ``size_variation`` bytes, ``delay`` us)
    Each chunk is cut into pieces of ``average_size`` +/- ``size_variation`` bytes, each
    followed by a ``delay`` us pause. Requires ``size_variation < average_size``.
``limit_data`` (``bytes``)
    Passes the first ``bytes`` bytes of the connection's stream, then closes the connection.

``toxicity`` (0..1, default 1) is the probability that the toxic acts on a given connection,
drawn when the connection meets the toxic (opened, or toxic added or updated). Every draw (toxicity,
jitter, slice sizes) comes from the seeded ``random.Random`` the server was given: each new
connection takes a seed from it, each direction a seed from that, so a run whose connections open
in the same order makes the same draws.

Theory of operation
-------------------

One asyncio loop runs the API (aiohttp) and all proxies; API requests run one at a time, so
no change to a proxy interleaves with another (enabling one awaits its listener). A connection
is two *links*, one per direction, each the same pipeline as Toxiproxy's ``ToxicLink``::

    reader task -> [channel] -> stage (toxic 1) -> [channel] -> ... -> [channel] -> writer task

The reader reads the source socket into chunks; each stage is one task running its toxic's
``pipe`` coroutine over its input and output channels; the writer writes the last channel to the
destination socket. Channels hold a few chunks (``CHANNEL_CAPACITY_CHUNKS``), so a stalled stage
stops the reader and the sender's TCP window fills; the one into a latency stage holds many
(``LATENCY_CAPACITY_CHUNKS``), so that the reader goes on reading what the toxic delays. An
end marker closes a link: ``EOF`` (the source half-closed; the writer half-closes the
destination and the connection ends when both directions have), ``CLOSE`` (the source failed,
or a toxic ended the connection: both sockets are closed) or ``RESET`` (both sockets aborted
with an RST).

The chain changes under live connections, without losing or reordering bytes:

- *add*: the new stage reads the channel the writer read, and the writer moves to the new stage's
  output (woken by ``kick`` if it was waiting), so the new toxic sits at the end of the chain.
- *remove*: the stage's task is cancelled; the chunk it held (``pending``, which a stage keeps
  until its output has it) goes to its output, then whatever was queued on its input, and the
  input channel forwards every later put to the output. All of this is synchronous, so nothing
  else runs in between; a cancelled task only ever stops at an ``await``, before or after a
  whole put.
- *update*: the stage is interrupted the same way (its pending chunk flushed, with no further
  delay) and restarted with the new attributes, redrawing its toxicity.

Differences from Toxiproxy (2.x, Go)
------------------------------------

- Only the seven toxics above; no ``slow_open``, ``limit_time``, ``corrupt`` or the HTTP toxics.
  No ``/populate``, no ``/metrics``, no config file, no ``Mozilla/`` user-agent check.
- ``timeout`` holds data rather than dropping it, so removing a ``timeout`` 0 toxic heals the
  connection instead of leaving a stream with a hole (Toxiproxy drops the bytes, then closes the
  connection when the toxic is removed). Its clock starts when the toxic starts on the
  connection, not after the last chunk.
- ``reset_peer`` always resets both sockets, even when the toxic is added to an open connection
  (Toxiproxy sets ``SO_LINGER`` only on connections that opened with the toxic in place). Once
  it has dropped data, removing or updating it resets the connection at once; Toxiproxy's
  removal waits for the timeout, then the reset.
- The end of one direction is passed on as a half-close (``shutdown(SHUT_WR)``) and the other
  direction keeps flowing; Toxiproxy closes the destination socket outright.
- Toxicity is drawn once per connection and toxic (and again on update); Toxiproxy draws again
  every time a stage restarts, e.g. whenever a toxic is added behind it.
- Validation is stricter: unknown attribute names, negative or non-integer values and
  ``toxicity`` outside 0..1 are 400s; a missing ``listen`` means ``127.0.0.1:0``.
- A proxy whose listen address cannot be bound is not created (500), nor is it enabled by
  ``/reset``: the reset stops at the first such proxy with a 500, like Toxiproxy's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import logging
import random
import signal
import socket
import struct
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

log = logging.getLogger(__name__)

VERSION: Final = "0.1.0+kcoord"
# Chunks a channel holds before its producer waits. Small: a stalled toxic should stall the
# sender soon, as Toxiproxy's unbuffered channels do, and not hide megabytes in the proxy.
CHANNEL_CAPACITY_CHUNKS: Final = 4
# What the channel into a latency stage holds instead (Toxiproxy's LatencyToxic.GetBufferSize,
# in chunks too): with a few, the reader stopped while the toxic held them, and data that
# waited in the socket meanwhile was read, and its latency counted, only then: about twice the
# latency, and a few chunks per latency period at most (a hidden bandwidth limit).
LATENCY_CAPACITY_CHUNKS: Final = 1024
READ_CHUNK_BYTES: Final = 32 * 1024
STREAMS: Final = ("upstream", "downstream")

# Toxic type -> its attributes, in Toxiproxy's JSON names (all integers, default 0).
TOXIC_ATTRIBUTES: Final[Mapping[str, tuple[str, ...]]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}


class ApiError(Exception):
    """An API failure with its HTTP status (Toxiproxy's ``ApiError``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _not_found(what: str) -> ApiError:
    return ApiError(f"{what} not found", 404)


def _bad_body(why: str) -> ApiError:
    return ApiError(f"bad request body: {why}", 400)


@dataclass(frozen=True)
class Toxic:
    """A toxic as the API sees it. The per-connection running part is a ``_Stage``."""

    name: str
    toxic_type: str
    stream: str
    toxicity: float
    attributes: Mapping[str, int]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.toxic_type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


# ---------------------------------------------------------------------------------------------
# Data plane: chunks, channels, stages, links, connections


class _EndKind(enum.Enum):
    EOF = "eof"  # the source half-closed: half-close the destination
    CLOSE = "close"  # close both sockets of the connection
    RESET = "reset"  # abort both sockets with an RST


class _Chunk:
    __slots__ = ("arrived_s", "data")

    def __init__(self, data: bytes) -> None:
        assert data, "an empty chunk would read as end of stream downstream"
        self.data = data
        # Loop time at which the chunk entered its current channel (set by _Channel.put); the
        # latency toxic counts from it, so a chunk that queued counts its queueing as latency.
        self.arrived_s = 0.0


@dataclass(frozen=True, slots=True)
class _End:
    kind: _EndKind


_Item = _Chunk | _End


class _Channel:
    """A FIFO from one step of a link to the next, with one consumer.

    Holds up to ``capacity`` chunks before ``put`` waits (an end marker always fits). Once
    ``forward_to`` is called, the channel is empty for good and every put lands in the target.
    """

    def __init__(self, capacity: int = CHANNEL_CAPACITY_CHUNKS) -> None:
        self._items: deque[_Item] = deque()
        self._capacity = capacity
        self._forward: _Channel | None = None
        # The consumer's wait: True = an item arrived, False = kicked (its source changed).
        self._getter: asyncio.Future[bool] | None = None
        self._putters: list[asyncio.Future[None]] = []

    def _target(self) -> _Channel:
        channel = self
        while channel._forward is not None:
            channel = channel._forward
        return channel

    async def put(self, item: _Item) -> None:
        while True:
            channel = self._target()
            if isinstance(item, _End) or len(channel._items) < channel._capacity:
                if isinstance(item, _Chunk):
                    item.arrived_s = asyncio.get_running_loop().time()
                channel._append(item)
                return
            waiter = asyncio.get_running_loop().create_future()
            channel._putters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in channel._putters:
                    channel._putters.remove(waiter)

    def hold_at_least(self, capacity: int) -> None:
        """Hold up to ``capacity`` chunks before a producer waits, if this held fewer."""
        self._capacity = max(self._capacity, capacity)
        self._wake_putters()  # they retry, with the room there is now

    def put_nowait(self, item: _Item) -> None:
        """Append regardless of capacity (flushing a stage that is being taken out)."""
        self._target()._append(item)

    def _append(self, item: _Item) -> None:
        assert self._forward is None
        self._items.append(item)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(True)

    async def get(self) -> _Item | None:
        """The next item, or None if ``kick`` woke the consumer to read elsewhere."""
        while not self._items:
            # One consumer; a stage just interrupted may not have run its cancellation yet,
            # but its wait is already cancelled (done).
            assert self._getter is None or self._getter.done(), "a channel has one consumer"
            waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._getter = waiter
            try:
                arrived = await waiter
            finally:
                if self._getter is waiter:
                    self._getter = None
            if not arrived:
                return None
        item = self._items.popleft()
        self._wake_putters()
        return item

    def kick(self) -> None:
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(False)
        self._getter = None

    def forward_to(self, other: _Channel) -> None:
        """Move what is queued here to ``other``, and send every later put there too."""
        assert self._getter is None or self._getter.done(), "the consumer must be gone"
        self._getter = None
        target = other._target()
        assert target is not self
        while self._items:
            target._append(self._items.popleft())
        self._forward = target
        self._wake_putters()  # they retry on the target

    def _wake_putters(self) -> None:
        for waiter in self._putters:
            if not waiter.done():
                waiter.set_result(None)
        self._putters.clear()


class _Stage:
    """One toxic on one link: a task piping ``input`` to ``output``.

    ``pending`` is the item the toxic took from its input and has not yet wholly handed to its
    output; when the stage is interrupted, it is flushed to the output, so no byte is lost.
    """

    def __init__(self, link: _Link, toxic: Toxic, input_: _Channel, output: _Channel) -> None:
        self.link = link
        self.toxic = toxic
        self.input = input_
        self.output = output
        self.rng: random.Random = link.rng
        self.pending: _Item | None = None
        self.bytes_passed = 0  # limit_data's count; kept across updates, as Toxiproxy's state
        self.task: asyncio.Task[None] | None = None
        self.finished = False  # the pipe returned: it passed on or made the end of the stream
        # reset_peer dropped data and waits to reset: the stream has a hole, so an interrupt
        # (the toxic removed or updated) resets the connection at once (see _reset_peer).
        self.reset_due = False

    def start(self) -> None:
        # After interrupt() the old task is cancelled but may not have run its cancellation.
        assert self.task is None or self.task.done() or self.task.cancelling()
        acts = self.rng.random() < self.toxic.toxicity
        pipe = _PIPES[self.toxic.toxic_type] if acts else _noop
        self.task = asyncio.get_running_loop().create_task(
            self._run(pipe), name=f"toxic {self.toxic.name} {self.link.name}"
        )

    async def _run(self, pipe: _Pipe) -> None:
        try:
            await pipe(self, self.toxic.attributes)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("toxic %s failed on %s", self.toxic.name, self.link.name)
            self.link.conn.close(reset=False)
            return
        self.finished = True

    def interrupt(self) -> None:
        """Stop the task now and flush the item it holds (synchronously: see the docstring)."""
        if self.task is not None:
            self.task.cancel()
        if self.reset_due:
            # Ahead of anything forwarded after this: no byte behind the hole is written.
            self.reset_due = False
            self.end_connection(_EndKind.RESET)
        if self.pending is not None:
            self.output.put_nowait(self.pending)
            self.pending = None

    async def recv(self) -> _Item:
        assert self.pending is None
        while True:
            item = await self.input.get()
            if item is not None:
                self.pending = item
                return item

    async def pass_on(self, nbytes: int | None = None) -> None:
        """Hand the pending item (or only its first ``nbytes``) to the output."""
        item = self.pending
        assert item is not None
        if isinstance(item, _End) or nbytes is None or nbytes >= len(item.data):
            await self.output.put(item)
            self.pending = None
        else:
            assert nbytes > 0
            rest = item.data[nbytes:]
            await self.output.put(_Chunk(item.data[:nbytes]))
            self.pending = _Chunk(rest)
            self.pending.arrived_s = item.arrived_s

    def end_connection(self, kind: _EndKind) -> None:
        """Drop what the toxic holds and end the link (the writer then closes the connection)."""
        self.pending = None
        self.output.put_nowait(_End(kind))


_Pipe = Callable[[_Stage, Mapping[str, int]], Awaitable[None]]


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


async def _noop(stage: _Stage, attributes: Mapping[str, int]) -> None:
    while True:
        item = await stage.recv()
        await stage.pass_on()
        if isinstance(item, _End):
            return


async def _latency(stage: _Stage, attributes: Mapping[str, int]) -> None:
    latency_ms, jitter_ms = attributes["latency"], attributes["jitter"]
    loop = asyncio.get_running_loop()
    while True:
        item = await stage.recv()
        if isinstance(item, _Chunk):
            delay_ms = latency_ms + (stage.rng.randint(-jitter_ms, jitter_ms) if jitter_ms else 0)
            wait_s = item.arrived_s + delay_ms / 1000 - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
        await stage.pass_on()
        if isinstance(item, _End):
            return


async def _bandwidth(stage: _Stage, attributes: Mapping[str, int]) -> None:
    rate_kb_s = attributes["rate"]
    if rate_kb_s == 0:
        await _forever()  # Toxiproxy's rate 0 lets nothing through either
    bytes_per_s = rate_kb_s * 1000
    piece_bytes = max(1, bytes_per_s // 10)  # 100 ms worth, as Toxiproxy slices
    loop = asyncio.get_running_loop()
    # When the link is free again. Scheduling from it, not from "now", keeps timer overshoot
    # from adding up; max() with now gives no burst credit for idle time.
    free_at_s = loop.time()
    while True:
        item = await stage.recv()
        if isinstance(item, _End):
            await stage.pass_on()
            return
        while isinstance(stage.pending, _Chunk):
            nbytes = min(len(stage.pending.data), piece_bytes)
            free_at_s = max(free_at_s, loop.time()) + nbytes / bytes_per_s
            wait_s = free_at_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            await stage.pass_on(nbytes)


async def _slow_close(stage: _Stage, attributes: Mapping[str, int]) -> None:
    while True:
        item = await stage.recv()
        if isinstance(item, _End):
            await asyncio.sleep(attributes["delay"] / 1000)
            await stage.pass_on()
            return
        await stage.pass_on()


async def _timeout(stage: _Stage, attributes: Mapping[str, int]) -> None:
    # Reads nothing: the data waits in the channels and the sender's socket buffers.
    if attributes["timeout"] == 0:
        await _forever()
    await asyncio.sleep(attributes["timeout"] / 1000)
    stage.end_connection(_EndKind.CLOSE)


async def _reset_peer(stage: _Stage, attributes: Mapping[str, int]) -> None:
    await stage.recv()
    stage.pending = None  # dropped, as Toxiproxy drops it
    # Toxiproxy's wait cannot be interrupted: the connection is reset even if the toxic is
    # removed meanwhile. Here the removal resets it at once (``_Stage.interrupt``), not at
    # the timeout; either way nothing after the dropped bytes reaches the peer.
    stage.reset_due = True
    await asyncio.sleep(attributes["timeout"] / 1000)
    stage.reset_due = False
    stage.end_connection(_EndKind.RESET)


async def _slicer(stage: _Stage, attributes: Mapping[str, int]) -> None:
    average, variation = attributes["average_size"], attributes["size_variation"]
    delay_s = attributes["delay"] / 1_000_000
    while True:
        item = await stage.recv()
        if isinstance(item, _End):
            await stage.pass_on()
            return
        while stage.pending is not None:
            size = average + (stage.rng.randint(-variation, variation) if variation else 0)
            assert size >= 1  # validation keeps size_variation < average_size
            await stage.pass_on(size)
            if delay_s:
                await asyncio.sleep(delay_s)


async def _limit_data(stage: _Stage, attributes: Mapping[str, int]) -> None:
    limit_bytes = attributes["bytes"]
    while True:
        item = await stage.recv()
        if isinstance(item, _End):
            await stage.pass_on()
            return
        allowed = min(len(item.data), limit_bytes - stage.bytes_passed)
        if allowed > 0:
            await stage.pass_on(allowed)
            stage.bytes_passed += allowed
        if stage.bytes_passed >= limit_bytes:
            stage.end_connection(_EndKind.CLOSE)
            return


_PIPES: Final[Mapping[str, _Pipe]] = {
    "latency": _latency,
    "bandwidth": _bandwidth,
    "slow_close": _slow_close,
    "timeout": _timeout,
    "reset_peer": _reset_peer,
    "slicer": _slicer,
    "limit_data": _limit_data,
}
assert set(_PIPES) == set(TOXIC_ATTRIBUTES)


class _Link:
    """One direction of a connection: reader, one stage per toxic of the stream, writer."""

    def __init__(
        self,
        conn: _Connection,
        stream: str,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
        rng: random.Random,
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.name = f"{conn.name} {stream}"
        self.source = source
        self.dest = dest
        self.rng: random.Random = rng
        self.head = _Channel()  # the reader puts here
        self.tail = self.head  # the writer gets from here
        self.stages: dict[str, _Stage] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, toxics: list[Toxic]) -> None:
        for toxic in toxics:
            self.add_toxic(toxic)
        loop = asyncio.get_running_loop()
        self.tasks.append(loop.create_task(self._read_loop(), name=f"read {self.name}"))
        self.tasks.append(loop.create_task(self._write_loop(), name=f"write {self.name}"))

    def add_toxic(self, toxic: Toxic) -> None:
        if toxic.toxic_type == "latency":
            self.tail.hold_at_least(LATENCY_CAPACITY_CHUNKS)
        stage = _Stage(self, toxic, self.tail, _Channel())
        old_tail, self.tail = self.tail, stage.output
        old_tail.kick()  # a writer waiting on it moves to the new tail
        self.stages[toxic.name] = stage
        stage.start()

    def update_toxic(self, toxic: Toxic) -> None:
        stage = self.stages[toxic.name]
        stage.interrupt()
        stage.toxic = toxic
        if not stage.finished:
            stage.start()

    def remove_toxic(self, name: str) -> None:
        stage = self.stages.pop(name)
        stage.interrupt()
        stage.input.forward_to(stage.output)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
        for stage in self.stages.values():
            if stage.task is not None:
                stage.task.cancel()

    async def _read_loop(self) -> None:
        end = _EndKind.EOF
        while True:
            try:
                data = await self.source.read(READ_CHUNK_BYTES)
            except OSError as e:
                log.debug("%s: read failed: %s", self.name, e)
                data, end = b"", _EndKind.CLOSE
            if not data:
                await self.head.put(_End(end))
                return
            await self.head.put(_Chunk(data))

    async def _write_loop(self) -> None:
        while True:
            item = await self.tail.get()  # self.tail, again each time: add_toxic moves it
            if item is None:
                continue
            if isinstance(item, _End):
                break
            try:
                self.dest.write(item.data)
                await self.dest.drain()
            except OSError as e:
                log.debug("%s: write failed: %s", self.name, e)
                self.conn.close(reset=False)
                return
        if item.kind is _EndKind.EOF:
            with contextlib.suppress(OSError):
                self.dest.write_eof()
            self.conn.half_closed(self.stream)
        else:
            self.conn.close(reset=item.kind is _EndKind.RESET)


def _child_rng(rng: random.Random) -> random.Random:
    return random.Random(rng.getrandbits(64))


class _Connection:
    """A client connection and its upstream connection, as two links."""

    def __init__(
        self,
        proxy: Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        rng: random.Random,
    ) -> None:
        self.proxy = proxy
        peer = client[1].get_extra_info("peername")
        self.name = f"{proxy.name} {_format_address(peer)}"
        self.writers = (client[1], upstream[1])
        self.links = {
            "upstream": _Link(self, "upstream", client[0], upstream[1], _child_rng(rng)),
            "downstream": _Link(self, "downstream", upstream[0], client[1], _child_rng(rng)),
        }
        self.ended_streams: set[str] = set()
        self.closed = False

    def start(self) -> None:
        for stream, link in self.links.items():
            link.start(self.proxy.toxics_of(stream))

    def half_closed(self, stream: str) -> None:
        self.ended_streams.add(stream)
        if len(self.ended_streams) == len(self.links):
            self.close(reset=False)

    def close(self, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        log.debug("%s: %s", self.name, "reset" if reset else "closed")
        for link in self.links.values():
            link.cancel()
        for writer in self.writers:
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        # l_onoff=1, l_linger=0: close() discards the send queue and sends RST.
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                writer.transport.abort()
            else:
                writer.close()
        self.proxy.connections.discard(self)


# ---------------------------------------------------------------------------------------------
# Control plane: proxies and the server


def _parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) to its parts; ApiError 400 if it is not one."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise _bad_body(f"not a host:port address: {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port_text)


def _format_address(sockname: Any) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _mark_of(writer: asyncio.StreamWriter) -> int:
    """The accepted socket's mark (``SO_MARK``): 0 but in the chaos lab, whose namespace gives
    an accepted socket the mark of the connection that reached it (``Namespace.create``)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_MARK))
    except OSError:
        return 0


async def _connect(
    host: str, port: int, mark: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The upstream connection, carrying ``mark`` when it is not 0: in the chaos lab the mark
    names the node that dialled the proxy, and the lab's partitions then cut the upstream
    side's answers on this connection as on one that node opened itself (``chaos.lab``'s
    ``Firewall``). Toxiproxy has no such thing: it runs where no partition is made by marks."""
    if not mark:
        return await asyncio.open_connection(host, port)
    loop = asyncio.get_running_loop()
    addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, kind, proto, _, address = addresses[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)  # needs CAP_NET_ADMIN
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


def _bind(address: str) -> socket.socket:
    host, port = _parse_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        raise ApiError(f"listen tcp {address}: {e.strerror or e}", 500) from e


class Proxy:
    """One listen address forwarding to one upstream, with its toxics and live connections."""

    def __init__(self, server: ToxiproxyServer, name: str, listen: str, upstream: str) -> None:
        self.server = server
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        # In the order added; each stream's chain is this order restricted to the stream.
        self.toxics: dict[str, Toxic] = {}
        self.connections: set[_Connection] = set()
        self._listener: asyncio.Server | None = None
        self._generation = 0  # bumped by stop(): a connection still dialling upstream then quits
        self._refused = 0  # connections dropped since the upstream last answered

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.as_json() for s in STREAMS for t in self.toxics_of(s)],
        }

    def toxics_of(self, stream: str) -> list[Toxic]:
        return [t for t in self.toxics.values() if t.stream == stream]

    async def start(self) -> None:
        if self.enabled:
            return
        sock = _bind(self.listen)
        try:
            self._listener = await asyncio.start_server(self._accept, sock=sock)
        except BaseException:
            sock.close()
            raise
        self.listen = _format_address(sock.getsockname())
        self.enabled = True
        log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self._generation += 1
        assert self._listener is not None
        self._listener.close()
        self._listener = None
        for conn in list(self.connections):
            conn.close(reset=False)
        assert not self.connections
        log.info("proxy %s stopped", self.name)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.enabled:
            # Accepted by the listener before stop() closed it, handed over after: a disabled
            # proxy passes nothing (its generation is the current one, so the check below
            # would not catch it).
            writer.close()
            return
        generation = self._generation
        # Drawn before the first await, so connections accepted in order draw in order.
        rng = _child_rng(self.server.rng)
        try:
            host, port = _parse_address(self.upstream)
            upstream = await _connect(host, port, _mark_of(writer))
        except (OSError, ApiError) as e:
            # Said once per outage: clients retry a stopped node many times a second.
            if not self._refused:
                log.info("proxy %s: cannot reach upstream %s: %s", self.name, self.upstream, e)
            self._refused += 1
            writer.close()
            return
        if self._refused:
            log.info(
                "proxy %s: upstream %s reached again (%d connections dropped meanwhile)",
                self.name,
                self.upstream,
                self._refused,
            )
            self._refused = 0
        if generation != self._generation:  # stopped meanwhile
            writer.close()
            upstream[1].close()
            return
        conn = _Connection(self, (reader, writer), upstream, rng)
        self.connections.add(conn)
        conn.start()

    def add_toxic(self, toxic: Toxic) -> None:
        assert toxic.name not in self.toxics
        self.toxics[toxic.name] = toxic
        for conn in self.connections:
            conn.links[toxic.stream].add_toxic(toxic)

    def update_toxic(self, toxic: Toxic) -> None:
        assert self.toxics[toxic.name].stream == toxic.stream
        self.toxics[toxic.name] = toxic
        for conn in self.connections:
            conn.links[toxic.stream].update_toxic(toxic)

    def remove_toxic(self, name: str) -> None:
        toxic = self.toxics.pop(name)
        for conn in self.connections:
            conn.links[toxic.stream].remove_toxic(name)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body) if body.strip() else {}
    except ValueError as e:
        raise _bad_body(str(e)) from e
    if not isinstance(value, dict):
        raise _bad_body("expected a JSON object")
    return value


def _str_field(body: Mapping[str, Any], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise _bad_body(f"{key} must be a string")
    return value


def _bool_field(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise _bad_body(f"{key} must be true or false")
    return value


def _toxicity(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise _bad_body("toxicity must be a number from 0 to 1")
    return float(value)


def _attributes(toxic_type: str, given: Any, base: Mapping[str, int]) -> dict[str, int]:
    """``base`` with ``given`` merged in, each a non-negative integer of the type."""
    if not isinstance(given, dict):
        raise _bad_body("attributes must be an object")
    names = TOXIC_ATTRIBUTES[toxic_type]
    merged = dict(base)
    for key, value in given.items():
        if key not in names:
            raise _bad_body(f"{toxic_type} has no attribute {key!r} (it has {', '.join(names)})")
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise _bad_body(f"{key} must be a non-negative integer")
        merged[key] = number
    if toxic_type == "slicer" and not 0 <= merged["size_variation"] < merged["average_size"]:
        raise _bad_body("slicer needs 0 <= size_variation < average_size")
    return merged


class ToxiproxyServer:
    """The proxies and the HTTP API that manages them; all on the running asyncio loop.

    ``rng`` is the only source of randomness (toxicity, jitter, slice sizes).
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng: random.Random = rng
        self.proxies: dict[str, Proxy] = {}
        self._runner: web.AppRunner | None = None

    # The operations, callable directly as well as through the API.

    def get_proxy(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise _not_found("proxy")
        return proxy

    async def create_proxy(self, name: str, listen: str, upstream: str, enabled: bool) -> Proxy:
        if not name:
            raise ApiError("missing required field: name", 400)
        if not upstream:
            raise ApiError("missing required field: upstream", 400)
        if name in self.proxies:
            raise ApiError("proxy already exists", 409)
        _parse_address(listen)
        proxy = Proxy(self, name, listen, upstream)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return proxy

    async def update_proxy(
        self, name: str, listen: str | None, upstream: str | None, enabled: bool | None
    ) -> Proxy:
        proxy = self.get_proxy(name)
        if listen is not None:
            _parse_address(listen)
        want_enabled = proxy.enabled if enabled is None else enabled
        if (listen is not None and listen != proxy.listen) or (
            upstream is not None and upstream != proxy.upstream
        ):
            proxy.stop()
            proxy.listen = proxy.listen if listen is None else listen
            proxy.upstream = proxy.upstream if upstream is None else upstream
        if want_enabled:
            await proxy.start()
        else:
            proxy.stop()
        return proxy

    def delete_proxy(self, name: str) -> None:
        self.get_proxy(name).stop()
        del self.proxies[name]

    async def reset(self) -> None:
        for proxy in self.proxies.values():
            await proxy.start()
            for name in list(proxy.toxics):
                proxy.remove_toxic(name)

    def add_toxic(self, proxy_name: str, body: Mapping[str, Any]) -> Toxic:
        proxy = self.get_proxy(proxy_name)
        stream = _str_field(body, "stream", "downstream")
        if stream not in STREAMS:
            raise ApiError("stream was invalid, can be either upstream or downstream", 400)
        toxic_type = _str_field(body, "type", "")
        name = _str_field(body, "name", "") or f"{toxic_type}_{stream}"
        if toxic_type not in TOXIC_ATTRIBUTES:
            raise ApiError("invalid toxic type", 400)
        if name in proxy.toxics:
            raise ApiError("toxic already exists", 409)
        defaults = dict.fromkeys(TOXIC_ATTRIBUTES[toxic_type], 0)
        toxic = Toxic(
            name=name,
            toxic_type=toxic_type,
            stream=stream,
            toxicity=_toxicity(body.get("toxicity", 1.0)),
            attributes=_attributes(toxic_type, body.get("attributes", {}), defaults),
        )
        proxy.add_toxic(toxic)
        return toxic

    def get_toxic(self, proxy_name: str, toxic_name: str) -> Toxic:
        toxic = self.get_proxy(proxy_name).toxics.get(toxic_name)
        if toxic is None:
            raise _not_found("toxic")
        return toxic

    def update_toxic(self, proxy_name: str, toxic_name: str, body: Mapping[str, Any]) -> Toxic:
        old = self.get_toxic(proxy_name, toxic_name)
        toxic = replace(
            old,
            toxicity=_toxicity(body.get("toxicity", old.toxicity)),
            attributes=_attributes(old.toxic_type, body.get("attributes", {}), old.attributes),
        )
        self.get_proxy(proxy_name).update_toxic(toxic)
        return toxic

    def remove_toxic(self, proxy_name: str, toxic_name: str) -> None:
        self.get_toxic(proxy_name, toxic_name)
        self.get_proxy(proxy_name).remove_toxic(toxic_name)

    # The HTTP API.

    async def start_api(self, address: str) -> str:
        """Serve the API on ``address`` (port 0: any free port); returns the bound address."""
        app = web.Application(middlewares=[_api_middleware(asyncio.Lock())])
        routes = [
            web.get("/version", self._version),
            web.post("/reset", self._reset),
            web.get("/proxies", self._list_proxies),
            web.post("/proxies", self._create_proxy),
            web.get("/proxies/{proxy}", self._show_proxy),
            web.post("/proxies/{proxy}", self._update_proxy),
            web.patch("/proxies/{proxy}", self._update_proxy),
            web.delete("/proxies/{proxy}", self._delete_proxy),
            web.get("/proxies/{proxy}/toxics", self._list_toxics),
            web.post("/proxies/{proxy}/toxics", self._create_toxic),
            web.get("/proxies/{proxy}/toxics/{toxic}", self._show_toxic),
            web.post("/proxies/{proxy}/toxics/{toxic}", self._update_toxic),
            web.patch("/proxies/{proxy}/toxics/{toxic}", self._update_toxic),
            web.delete("/proxies/{proxy}/toxics/{toxic}", self._delete_toxic),
        ]
        app.add_routes(routes)
        sock = _bind(address)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        return _format_address(sock.getsockname())

    async def close(self) -> None:
        """Stop the API and every proxy (closing every connection)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for proxy in self.proxies.values():
            proxy.stop()

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def _reset(self, request: web.Request) -> web.Response:
        await self.reset()
        return web.Response(status=204)

    async def _list_proxies(self, request: web.Request) -> web.Response:
        return web.json_response({n: p.as_json() for n, p in self.proxies.items()})

    async def _create_proxy(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read())
        proxy = await self.create_proxy(
            name=_str_field(body, "name", ""),
            listen=_str_field(body, "listen", "127.0.0.1:0"),
            upstream=_str_field(body, "upstream", ""),
            enabled=_bool_field(body, "enabled", True),
        )
        return web.json_response(proxy.as_json(), status=201)

    async def _show_proxy(self, request: web.Request) -> web.Response:
        return web.json_response(self.get_proxy(request.match_info["proxy"]).as_json())

    async def _update_proxy(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read())
        proxy = self.get_proxy(request.match_info["proxy"])
        proxy = await self.update_proxy(
            proxy.name,
            listen=_str_field(body, "listen", proxy.listen),
            upstream=_str_field(body, "upstream", proxy.upstream),
            enabled=_bool_field(body, "enabled", proxy.enabled),
        )
        return web.json_response(proxy.as_json())

    async def _delete_proxy(self, request: web.Request) -> web.Response:
        self.delete_proxy(request.match_info["proxy"])
        return web.Response(status=204)

    async def _list_toxics(self, request: web.Request) -> web.Response:
        return web.json_response(self.get_proxy(request.match_info["proxy"]).as_json()["toxics"])

    async def _create_toxic(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read())
        return web.json_response(self.add_toxic(request.match_info["proxy"], body).as_json())

    async def _show_toxic(self, request: web.Request) -> web.Response:
        toxic = self.get_toxic(request.match_info["proxy"], request.match_info["toxic"])
        return web.json_response(toxic.as_json())

    async def _update_toxic(self, request: web.Request) -> web.Response:
        body = _json_object(await request.read())
        toxic = self.update_toxic(request.match_info["proxy"], request.match_info["toxic"], body)
        return web.json_response(toxic.as_json())

    async def _delete_toxic(self, request: web.Request) -> web.Response:
        self.remove_toxic(request.match_info["proxy"], request.match_info["toxic"])
        return web.Response(status=204)


def _api_middleware(lock: asyncio.Lock) -> Middleware:
    """One request at a time (a start() awaits mid-change); ApiError as Toxiproxy's JSON."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        async with lock:
            try:
                return await handler(request)
            except ApiError as e:
                body = {"error": e.message, "status": e.status}
                return web.json_response(body, status=e.status)

    return middleware


# ---------------------------------------------------------------------------------------------
# Command line


async def _serve(api: str, seed: int) -> None:
    server = ToxiproxyServer(random.Random(seed))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        bound = await server.start_api(api)
    except ApiError as e:
        print(f"kcoord.chaos.proxy: {e.message}", file=sys.stderr)
        raise SystemExit(1) from e
    print(bound, flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kcoord.chaos.proxy",
        description="A TCP fault proxy with Toxiproxy's HTTP API (a subset).",
    )
    parser.add_argument("--api", default="127.0.0.1:8474", help="API address host:port")
    parser.add_argument("--seed", type=int, default=None, help="seed for every random draw")
    parser.add_argument("--log-level", default="WARNING", help="logging level (on stderr)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    seed: int = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"kcoord.chaos.proxy: seed {seed}", file=sys.stderr, flush=True)
    asyncio.run(_serve(str(args.api), seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
