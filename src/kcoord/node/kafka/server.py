"""The Kafka listener: an asyncio TCP server speaking Kafka's framing (Kafka's ``SocketServer``).

Theory of operation
-------------------
Each connection has two tasks.

- The *reader* reads one frame at a time (4-byte size, then the request), decodes it and runs
  its handler, in request order: a handler's synchronous part (validating and appending a
  produce, for instance) never interleaves with the next request's, which is the ordering
  Kafka gives a connection by muting it while a request is processed. A handler that must wait
  for something (the high watermark, a long-polling fetch) returns ``Deferred`` and the reader
  goes on with the next request: this is the pipelining.
- The *writer* takes the response slots in request order and writes each response once it is
  ready, so responses leave in request order even when later ones are ready first. A slot may
  hold no response (acks=0 produce), or tell the writer to close the connection.

At most ``max_in_flight`` requests per connection wait for their responses; beyond that the
reader stops reading, and TCP pushes back on the client.

One event loop serves every connection, so a large request would hold all of them while it is
decoded and its answer built and encoded (a DescribeTopicPartitions naming 100,000 topics took
2.2 s, 60% of it building and encoding the answer). Those steps are pure, so a request of at
least ``OFF_LOOP_REQUEST_BYTES`` is decoded, and an answer with at least
``OFF_LOOP_RESPONSE_ENTRIES`` list entries (topics plus their partitions) or
``OFF_LOOP_RESPONSE_BYTES`` of strings and bytes (``response_weight``) is built and encoded,
on the listener's codec threads (two: Kafka's ``num.network.threads`` is 3). Python's GIL still
runs one of them at a time, but hands it back to the loop every switch interval (5 ms), so the
other connections go on at a share of the CPU instead of waiting for the whole request. A
Produce too: its bulk stays bytes, but 1.2 MB naming 200,000 partitions took 0.66 s to decode
(the thread costs some 40 us). The handler itself stays on the loop, where the node's state
lives; one walking that many partitions yields to the loop as it goes. A frame of
``LARGE_REQUEST_BYTES`` or more is decoded on threads of its own: frames made to cost (two
Produce requests of 2M empty topic entries in 6 MB each, 14 s to decode side by side) held
both codec threads, and an ordinary 100 KB produce of another client was answered after
12.9 s; on threads apart, after 0.2 s, decoded at a share of the CPU at once (Kafka decodes
on the connection's own network thread, so only that thread's connections wait).

What closes a connection, and only that connection (each is logged once): a size outside
``1..socket.request.max.bytes`` (100 MiB by default), a truncated frame (end of stream inside
it), a request that does not decode, an unknown API key, an unsupported version of an API
other than ApiVersions (which is answered with its v0 error response, as Kafka does), and
``connections.max.idle.ms`` (10 minutes by default) without a request or response while
nothing is in flight (a request being handled, and every read of a frame still arriving,
count as activity, as Kafka's ``Selector`` notes every read). A handler that
fails unexpectedly gets its request answered with UNKNOWN_SERVER_ERROR, as Kafka's
``KafkaApis.handle`` does (``error_response``), the connection closed only where the API has
no such answer (an acks=0 produce). So does a request whose answer would be over
``socket.request.max.bytes`` (a Fetch excepted: its max_bytes bounds it), which a few KB can
ask for (``_encode_large``).

At the end of the peer's stream no further request is read, and the connection closes once
every request read before it is answered: Kafka's ``Selector`` reads a channel only while it
is not muted, that is while no request of it is in flight, so it sees the end of the stream
only after the last answer is sent (a client that half-closes after its requests,
``printf ... | nc -N``, gets every answer). A reset seen while reading closes the connection
at once, dropping the answers still being made; after the end of the stream a reset is seen
only when an answer is written, so a pending long poll or JoinGroup holds the connection (and
its max.connections slot) until it is answered, as in Kafka.

Metrics: with a ``RequestStats``, each request adds to its API key's count and latency (from
the frame read to the response encoded) and, if the response has a top-level error code, to
that error's count; frames count as bytes received and responses as bytes sent. That is a few
integer additions per request; without one (``metrics.enable=false``) nothing is counted.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, ParamSpec, TypeVar

from kcoord.node.kafka import codec
from kcoord.node.kafka.apis import (
    CLOSE_CONNECTION,
    NO_RESPONSE,
    ApiRegistry,
    Deferred,
    Request,
)
from kcoord.node.kafka.codec import (
    API_VERSIONS_KEY,
    FETCH_KEY,
    FRAME_SIZE,
    PRODUCE_KEY,
    DecodeError,
)
from kcoord.node.kafka.error_response import error_response
from kcoord.stats import LATENCY_BUCKETS_S, Histogram

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_MAX_REQUEST_BYTES: Final = 100 * 1024 * 1024  # socket.request.max.bytes
DEFAULT_IDLE_MS: Final = 600_000  # connections.max.idle.ms
# Requests of one connection handled at once. Kafka handles one (it mutes a connection until
# its response is sent); clients pipeline up to max.in.flight.requests.per.connection, 5 by
# default (and at most 5 for an idempotent producer).
DEFAULT_MAX_IN_FLIGHT: Final = 5
# No further request is read while this many response bytes wait to be sent (a client not
# reading its answers), or may yet (the max_bytes of a deferred answer still being made: a
# fetch long poll), counting the requests such answers still hold: the reader stops as
# Kafka's muted channel does.
MAX_UNSENT_BYTES: Final = 16 * 1024 * 1024
# How long a closed connection may take to hand its last responses to a peer that does not
# read them before the socket is aborted (Kafka closes a channel at once).
CLOSE_GRACE_S: Final = 1.0
# What is decoded, built and encoded off the event loop (see the docstring): about 8 ms of
# decoding, and 10 ms of building and encoding, on this machine.
OFF_LOOP_REQUEST_BYTES: Final = 64 * 1024
OFF_LOOP_RESPONSE_ENTRIES: Final = 4096
OFF_LOOP_RESPONSE_BYTES: Final = 4 * 1024 * 1024
CODEC_THREADS: Final = 2
LARGE_REQUEST_BYTES: Final = 1024 * 1024
# A frame is read in pieces of at most this, as they arrive, each keeping the connection
# from idleness.
READ_CHUNK_BYTES: Final = 64 * 1024


def response_weight(
    values: Mapping[str, Any], entry_limit: int, byte_limit: int = sys.maxsize
) -> tuple[int, int]:
    """(entries, bytes) of a response: the entries of its lists at any depth (topics, their
    partitions; OffsetFetch v8+'s groups, their topics, their partitions), what building and
    encoding it costs per entry, and the bytes of its strings and byte fields (records,
    member metadata), what it costs per byte; counted until either limit is reached. Counted
    two levels down, one group of a million partitions was 2 entries, and its answer was built
    and encoded on the loop, every connection waiting seconds; with entries alone, a
    DescribeGroups naming one group of 1 MB of member metadata 300 times was 600 entries, and
    its 300 MB answer was encoded on the loop."""
    entries = size = 0
    pending: list[Any] = [values]
    while pending and entries < entry_limit and size < byte_limit:
        value = pending.pop()
        items = value.values() if isinstance(value, Mapping) else value
        if not isinstance(value, Mapping):
            entries += len(value)
        for item in items:
            if isinstance(item, list | tuple | Mapping):
                # An entry whose own lists cost more: it is counted, and its lists too.
                pending.append(item)
            elif isinstance(item, bytes | str | bytearray | memoryview):
                size += len(item)
    return entries, size


def encoded_off_loop(values: Mapping[str, Any], max_bytes: int) -> int | None:
    """None for a response built and encoded on the loop; for one built and encoded on the
    codec threads (see the docstring), the bytes counted in it (up to the threshold). One of
    more than ``max_bytes`` (``socket.request.max.bytes``) always is, where it is refused."""
    byte_limit = min(OFF_LOOP_RESPONSE_BYTES, max_bytes + 1)
    entries, size = response_weight(values, OFF_LOOP_RESPONSE_ENTRIES, byte_limit)
    if entries >= OFF_LOOP_RESPONSE_ENTRIES or size >= byte_limit:
        return size
    return None


class RequestStats:
    """The listener's counters, read by node/metrics.py at scrape time (see the docstring)."""

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}
        self.latency_s: dict[int, Histogram] = {}
        self.errors: dict[tuple[int, int], int] = {}  # (api key, error code) -> count
        self.bytes_received = 0
        self.bytes_sent = 0
        self.connections_accepted = 0

    def record(self, api_key: int, elapsed_s: float, values: Mapping[str, Any] | None) -> None:
        self.requests[api_key] = self.requests.get(api_key, 0) + 1
        histogram = self.latency_s.get(api_key)
        if histogram is None:
            histogram = self.latency_s[api_key] = Histogram(LATENCY_BUCKETS_S)
        histogram.observe(elapsed_s)
        error = values.get("error_code") if values is not None else None
        if error:
            key = (api_key, int(error))
            self.errors[key] = self.errors.get(key, 0) + 1


async def _ready(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return values


# A Kafka string is at most 32,767 bytes (its int16 length); a longer error message is cut to
# this many characters (at most four bytes each in UTF-8).
MESSAGE_CHARS_KEPT: Final = 4_096


def _with_short_messages(values: Any) -> Any:
    """``values`` with every ``*message`` string too long for a Kafka string cut short; None
    when there was none."""
    found = False

    def walk(value: Any, key: str = "") -> Any:
        nonlocal found
        if isinstance(value, str) and key.endswith("message") and len(value) > MESSAGE_CHARS_KEPT:
            found = True
            return value[:MESSAGE_CHARS_KEPT] + "..."
        if isinstance(value, Mapping):
            return {k: walk(v, str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    shortened = walk(values)
    return shortened if found else None


class _Close:
    """A slot that closes the connection when the writer reaches it."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


# What the writer finds in a slot: bytes to write, None (nothing), a close, or a future of one.
Slot = bytes | None | _Close | asyncio.Future[bytes | _Close]


class KafkaServer:
    def __init__(
        self,
        registry: ApiRegistry,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        idle_ms: int = DEFAULT_IDLE_MS,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_connections: int = 2**31 - 1,
        max_connections_per_ip: int = 2**31 - 1,
        max_connections_per_ip_overrides: Mapping[str, int] | None = None,
        stats: RequestStats | None = None,
    ) -> None:
        assert max_request_bytes > 0 and idle_ms != 0 and max_in_flight > 0
        self.registry = registry
        self.stats = stats
        # Kafka's max.connections: past it a new connection is closed at once (Kafka's
        # acceptor waits instead; a client sees the same, its connection not served).
        self.max_connections = max_connections
        # Kafka's max.connections.per.ip and its overrides (ConnectionQuotas): past its
        # address's limit a new connection is closed at once (TooManyConnectionsException),
        # so one client leaking connections cannot take every slot of max.connections.
        self.max_connections_per_ip = max_connections_per_ip
        self.max_connections_per_ip_overrides = dict(max_connections_per_ip_overrides or {})
        self._connections_per_ip: dict[str, int] = {}
        self.connections_refused = 0
        self._refusal_logged_at = -1.0
        self.max_request_bytes = max_request_bytes
        self.idle_ms = idle_ms  # negative: no idle expiry (Kafka's Selector)
        self.max_in_flight = max_in_flight
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], _Connection] = {}
        self._stopping = False
        self.connections_closed_for_errors = 0
        self._codec_threads: ThreadPoolExecutor | None = None
        self._large_codec_threads: ThreadPoolExecutor | None = None

    async def off_loop(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn`` run on the listener's codec threads (see the docstring)."""
        if self._codec_threads is None:
            self._codec_threads = ThreadPoolExecutor(CODEC_THREADS, "kafka-codec")
        return await asyncio.get_running_loop().run_in_executor(
            self._codec_threads, functools.partial(fn, *args, **kwargs)
        )

    async def decode_off_loop(self, frame: bytes) -> tuple[codec.RequestHeader, Any]:
        """A request frame decoded on the codec threads, or, from ``LARGE_REQUEST_BYTES``, on
        threads of their own (see the docstring)."""
        if len(frame) < LARGE_REQUEST_BYTES:
            return await self.off_loop(codec.decode_request, frame)
        if self._large_codec_threads is None:
            self._large_codec_threads = ThreadPoolExecutor(CODEC_THREADS, "kafka-codec-large")
        return await asyncio.get_running_loop().run_in_executor(
            self._large_codec_threads, codec.decode_request, frame
        )

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets, "server not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def bind(self, host: str, port: int) -> None:
        """Bind (every address of) ``host:port`` without serving yet, so that a port another
        process listens on fails the start here; connections are refused until ``start``
        listens (Kafka binds its acceptors before it enables request processing)."""
        assert self._server is None, "already bound"
        self._stopping = False
        self._server = await asyncio.start_server(self._serve, host, port, start_serving=False)

    async def start(self, host: str, port: int) -> None:
        """Serve on ``host:port`` (bound now, unless ``bind`` was called)."""
        loaded = self.registry.warm_up()
        log.info("kafka: %d request/response schemas loaded", loaded)
        if self._server is None:
            await self.bind(host, port)
        assert self._server is not None
        await self._server.start_serving()
        log.info("kafka listener on %s:%d", host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping = True
        server.close()
        await asyncio.sleep(0)  # let just-accepted connections see _stopping
        for conn in list(self._connections.values()):
            conn.close()
        if self._connections:
            await asyncio.wait(list(self._connections))
        await server.wait_closed()
        for threads in (self._codec_threads, self._large_codec_threads):
            if threads is not None:
                threads.shutdown(wait=False, cancel_futures=True)
        self._codec_threads = self._large_codec_threads = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Everything a peer can cause is handled inside: asyncio's streams (3.11) log any
        # exception this task ends with.
        task = asyncio.current_task()
        assert task is not None
        if self._stopping:
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        address = _client_address(str(peer[0])) if peer else ""
        from_address = self._connections_per_ip.get(address, 0)
        address_limit = self.max_connections_per_ip_overrides.get(
            address, self.max_connections_per_ip
        )
        if from_address >= address_limit:
            self._refuse(
                writer,
                f"{from_address} connections open from {address} "
                f"(max.connections.per.ip {address_limit})",
            )
            return
        if len(self._connections) >= self.max_connections:
            self._refuse(writer, f"{len(self._connections)} connections open (max.connections)")
            return
        conn = _Connection(self, reader, writer)
        self._connections[task] = conn
        self._connections_per_ip[address] = from_address + 1
        if self.stats is not None:
            self.stats.connections_accepted += 1
        try:
            await conn.run()
        finally:
            self._connections.pop(task, None)
            left = self._connections_per_ip.pop(address, 1) - 1
            if left:
                self._connections_per_ip[address] = left

    def _refuse(self, writer: asyncio.StreamWriter, why: str) -> None:
        """Close a new connection at once, past a limit; said at most every 10 s."""
        writer.close()
        self.connections_refused += 1
        now = asyncio.get_running_loop().time()
        if now - self._refusal_logged_at >= 10 or self._refusal_logged_at < 0:
            self._refusal_logged_at = now
            log.warning("kafka: %s: refusing new ones (%d so far)", why, self.connections_refused)


def _client_address(host: str) -> str:
    """A peer's address as ``max.connections.per.ip.overrides`` names it: an IPv4 client of a
    dual-stack listener (``::ffff:a.b.c.d``) as its IPv4 address, as Java maps it, and no
    ``%scope``."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class _Connection:
    def __init__(
        self, server: KafkaServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.registry = server.registry
        self.stats = server.stats
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.client_host = "/" + str(self.peer[0]) if self.peer else ""
        self.slots: asyncio.Queue[Slot] = asyncio.Queue()
        self.in_flight = 0  # requests read whose slot the writer has not finished
        self._dispatching = False  # a request read is being decoded or handled
        # Responses encoded and not yet drained to the socket, and for deferred ones still
        # being made, the most they may take and the requests they hold.
        self.unsent_bytes = 0
        self._draining = False  # the writer waits for the peer to read
        self.closing = False
        self._room = asyncio.Event()  # set whenever in_flight may have dropped
        self._loop = asyncio.get_running_loop()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []

    # -----------------------------------------------------------------------------------------
    # Lifecycle.

    async def run(self) -> None:
        self._touch()
        self._tasks = [
            asyncio.create_task(self._read_loop(), name=f"kafka-read-{self.peer}"),
            asyncio.create_task(self._write_loop(), name=f"kafka-write-{self.peer}"),
        ]
        try:
            # The reader ends by queueing a close slot (or is cancelled by close()); the
            # writer ends when it reaches that slot, having written every earlier response.
            await asyncio.wait(self._tasks)
        finally:
            self.close()
            if self._pending:
                await asyncio.wait(list(self._pending))
            for task in self._tasks:
                # Not done: this task was cancelled (an event loop torn down without stop()).
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.error("kafka: connection task failed", exc_info=task.exception())
            try:
                await asyncio.wait_for(self.writer.wait_closed(), CLOSE_GRACE_S)
            except TimeoutError:
                # A peer that does not read what is left: closing would wait for it for ever
                # (and with it the node's stop).
                log.info(
                    "kafka: aborting the connection from %s: its peer does not read", self.peer
                )
                self.writer.transport.abort()
            except OSError:
                pass

    def close(self) -> None:
        """Stop reading and writing now (idle timeout, server stop, a close slot, a lost peer)."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.closing = True
        self._room.set()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        for fut in self._pending:
            fut.cancel()
        self.writer.close()

    def _close_for(self, reason: str) -> None:
        if not self.closing:
            log.warning("kafka: closing connection from %s: %s", self.peer, reason)
            self.server.connections_closed_for_errors += 1
        self.close()

    def _touch(self) -> None:
        if self.closing or self.server.idle_ms < 0:
            return
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self._loop.call_later(self.server.idle_ms / 1000, self._on_idle)

    def _on_idle(self) -> None:
        self._idle_timer = None
        if (self.in_flight or self._dispatching) and not self._draining:
            self._touch()  # a request being handled (a long poll, say) is not idleness
            return
        # Nothing asked, or answers the peer has not read for the whole idle time (Kafka
        # expires a channel by its last socket activity).
        log.info("kafka: closing idle connection from %s", self.peer)
        self.close()

    # -----------------------------------------------------------------------------------------
    # Reading and dispatching, in request order.

    async def _read_loop(self) -> None:
        try:
            close = await self._read_requests()
        except Exception:
            log.exception("kafka: reading from %s failed", self.peer)
            close = _Close("internal error")
        if close is None:
            # The peer is gone (reset): nobody reads the answers still being made.
            self.close()
            return
        # Behind the answers to every request read (the end of the stream included, see the
        # docstring): the writer sends them first.
        self.slots.put_nowait(close)

    async def _read_requests(self) -> _Close | None:
        """Reads and dispatches until a close, queued behind the answers; None when the
        connection is lost."""
        max_bytes = self.server.max_request_bytes
        while True:
            while (
                self.in_flight >= self.server.max_in_flight or self.unsent_bytes >= MAX_UNSENT_BYTES
            ):
                self._room.clear()
                await self._room.wait()
            try:
                prefix = await self.reader.readexactly(FRAME_SIZE.size)
                (size,) = FRAME_SIZE.unpack(prefix)
                if not 0 < size <= max_bytes:
                    # Kafka's InvalidReceiveException: the size alone closes the connection.
                    return _Close(f"request size {size} outside 1..{max_bytes}")
                frame = await self._read_frame(size)
            except asyncio.IncompleteReadError as e:
                return _Close("connection ended inside a frame" if e.partial else "")
            except OSError as e:
                log.info("kafka: connection from %s lost: %s", self.peer, e)
                return None
            self._touch()
            if self.stats is not None:
                self.stats.bytes_received += FRAME_SIZE.size + size
            self._dispatching = True
            try:
                slot = await self._dispatch(frame)
            finally:
                self._dispatching = False
            if isinstance(slot, _Close):
                return slot
            self.in_flight += 1
            self.slots.put_nowait(slot)

    async def _read_frame(self, size: int) -> bytes:
        """A frame's ``size`` bytes, as they arrive, each read activity (``_touch``); the
        caller notes the whole frame's."""
        chunks: list[bytes] = []
        left = size
        while True:
            chunk = await self.reader.read(min(left, READ_CHUNK_BYTES))
            if not chunk:
                raise asyncio.IncompleteReadError(b"".join(chunks), size)
            chunks.append(chunk)
            left -= len(chunk)
            if not left:
                return chunk if len(chunks) == 1 else b"".join(chunks)
            self._touch()

    async def _dispatch(self, frame: bytes) -> Slot:
        try:
            api_key, api_version, correlation_id = codec.peek_header(frame)
        except DecodeError as e:
            return _Close(str(e))
        spec = self.registry.get(api_key)
        if spec is None:
            return _Close(f"unknown api key {api_key}")
        if api_version not in spec.versions:
            if api_key == API_VERSIONS_KEY:
                return self._counted(self.registry.unsupported_api_versions(correlation_id))
            return _Close(
                f"unsupported version {api_version} of api key {api_key} "
                f"(supported {spec.versions.start}..{spec.versions.stop - 1})"
            )
        try:
            if len(frame) >= OFF_LOOP_REQUEST_BYTES:
                header, body = await self.server.decode_off_loop(frame)
            else:
                header, body = codec.decode_request(frame)
        except DecodeError as e:
            return _Close(f"malformed request (api key {api_key} v{api_version}): {e}")
        request = Request(header, body, self.client_host)
        start = self._loop.time() if self.stats is not None else 0.0
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "kafka: %s %r api key %d v%d correlation id %d",
                self.peer,
                header.client_id,
                api_key,
                api_version,
                correlation_id,
            )
        try:
            result = await spec.handler(request)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.closing or (current is not None and current.cancelling()):
                raise  # close() (or the server's stop) cancels the reader
            # The handler's own work was cancelled (as a deferred answer's can be): the
            # reader task ended with it, no close was queued, and the connection was left
            # open with its requests unanswered until the idle timeout.
            log.error("kafka: handler of api key %d v%d cancelled", api_key, api_version)
            return _Close("handler cancelled")
        except Exception:
            log.exception("kafka: handler of api key %d v%d failed", api_key, api_version)
            return self._counted(self._failed(request))
        if isinstance(result, Deferred):
            # Until the answer is made: the most it may take (see apis), and the request it
            # still holds (a produce of up to socket.request.max.bytes waiting for acks=all).
            reserved = result.max_bytes + len(frame)
            self.unsent_bytes += reserved
            fut: asyncio.Future[bytes | _Close] = asyncio.ensure_future(
                self._complete(request, result.awaitable, start, reserved)
            )
            self._pending.add(fut)
            fut.add_done_callback(self._pending.discard)
            return fut
        if result is NO_RESPONSE:
            if self.stats is not None:
                self.stats.record(api_key, self._loop.time() - start, None)
            return None
        if result is CLOSE_CONNECTION:
            # Written in order: the earlier responses go out first.
            return _Close("closing as asked by the handler (acks=0 produce failed)")
        assert isinstance(result, Mapping), result
        off_loop = encoded_off_loop(result, self.server.max_request_bytes)
        if off_loop is not None:
            # Counted as unsent while it is encoded, as what is encoded on the loop is.
            self.unsent_bytes += off_loop
            fut = asyncio.ensure_future(self._complete(request, _ready(result), start, off_loop))
            self._pending.add(fut)
            fut.add_done_callback(self._pending.discard)
            return fut
        if self.stats is not None:
            self.stats.record(api_key, self._loop.time() - start, result)
        return self._counted(self._encode(request, result))

    async def _complete(
        self,
        request: Request,
        awaitable: Awaitable[Mapping[str, Any]],
        start: float,
        reserved: int = 0,
    ) -> bytes | _Close:
        try:
            return await self._answer(request, awaitable, start)
        finally:
            if reserved:
                self.unsent_bytes -= reserved
                self._room.set()

    async def _answer(
        self, request: Request, awaitable: Awaitable[Mapping[str, Any]], start: float
    ) -> bytes | _Close:
        # The writer awaits this answer: whatever fails here closes the connection, or the
        # writer would die of it and leave the connection open, answering nothing.
        try:
            values = await awaitable
            if not isinstance(values, Mapping):  # a handler's bug: answered as a failure
                raise TypeError(f"a deferred answer of {type(values).__name__}, not values")
            if encoded_off_loop(values, self.server.max_request_bytes) is not None:
                encoded = await self.server.off_loop(
                    self._encode_large, request, values, self.server.max_request_bytes
                )
            else:
                encoded = self._encode(request, values)
            if self.stats is not None:
                self.stats.record(request.header.api_key, self._loop.time() - start, values)
        except asyncio.CancelledError:
            if self.closing:
                raise  # close() cancels the pending answers
            # Something else cancelled the handler's work.
            log.error("kafka: deferred response of api key %d cancelled", request.header.api_key)
            return _Close("handler cancelled")
        except Exception:
            log.exception("kafka: deferred response of api key %d failed", request.header.api_key)
            return self._counted(self._failed(request))
        return self._counted(encoded)

    @staticmethod
    def _failed(request: Request) -> bytes | _Close:
        """The answer to a request whose handler failed: its API's error response with
        UNKNOWN_SERVER_ERROR (node/kafka/error_response.py), or a close where there is none
        (an acks=0 produce, as Kafka's; an API with no way to say it)."""
        header = request.header
        if header.api_key == PRODUCE_KEY and getattr(request.body, "acks", None) == 0:
            return _Close("handler failed (acks=0 produce: no answer to carry the error)")
        values = error_response(header.api_key, header.api_version, request.body)
        if values is None:
            return _Close("handler failed")
        try:
            body = codec.build_response(header.api_key, header.api_version, values)
            return codec.encode_response(header.correlation_id, body)
        except Exception:
            log.exception("kafka: cannot encode the error response of api key %d", header.api_key)
            return _Close("handler failed")

    def _counted(self, encoded: bytes | _Close) -> bytes | _Close:
        if isinstance(encoded, bytes):
            self.unsent_bytes += len(encoded)
        return encoded

    @staticmethod
    def _encode_large(
        request: Request, values: Mapping[str, Any], max_bytes: int
    ) -> bytes | _Close:
        """``_encode`` for a large answer (on a codec thread): one of more than ``max_bytes``
        (``socket.request.max.bytes``) is answered as a failed request instead, but a Fetch,
        whose size the client bounds (its max_bytes). A request of a few KB naming one group
        of 1 MB of member metadata thousands of times (DescribeGroups; DescribeConfigs and
        OffsetFetch have such answers too) was answered gigabytes, twice in memory while
        encoded, up to five at a time on a connection: the node's memory ran out. Kafka
        builds them too, in a heap whose exhaustion fails that request; librdkafka refuses
        an answer over its receive.message.max.bytes (100 MB) anyway."""
        if request.header.api_key != FETCH_KEY:
            _, size = response_weight(values, sys.maxsize, max_bytes + 1)
            if size > max_bytes:
                log.warning(
                    "kafka: the answer to api key %d v%d would be over %d bytes: answered "
                    "as a failed request",
                    request.header.api_key,
                    request.header.api_version,
                    max_bytes,
                )
                return _Connection._failed(request)
        return _Connection._encode(request, values)

    @staticmethod
    def _encode(request: Request, values: Mapping[str, Any]) -> bytes | _Close:
        """The response frame (pure: it may run on a codec thread)."""
        header = request.header
        try:
            body = codec.build_response(header.api_key, header.api_version, values)
            return codec.encode_response(header.correlation_id, body)
        except Exception:
            shortened = _with_short_messages(values)
            if shortened is not None:
                # An error message echoing a long name the request carried (a config name of
                # 32,767 characters) is past a Kafka string's 32,767 bytes: the answer goes out
                # with its messages cut short, not as a closed connection.
                return _Connection._encode(request, shortened)
            log.exception(
                "kafka: cannot encode the response of api key %d v%d",
                header.api_key,
                header.api_version,
            )
            return _Close("response encoding failed")

    # -----------------------------------------------------------------------------------------
    # Writing, in request order.

    async def _write_loop(self) -> None:
        try:
            await self._write_responses()
        except Exception:
            # A bug, not the peer: the reader, waiting for room the writer would have made,
            # would keep the connection open for ever.
            log.exception("kafka: writing to %s failed", self.peer)
            self._close_for("internal error")

    async def _write_responses(self) -> None:
        while True:
            slot = await self.slots.get()
            if isinstance(slot, asyncio.Future):
                slot = await slot
            if isinstance(slot, _Close):
                if slot.reason:
                    self._close_for(slot.reason)
                else:
                    self.close()
                return
            self.in_flight -= 1
            if slot is None:
                self._room.set()
                continue
            if self.writer.is_closing():
                # The peer reset the connection while this answer was being made (uvloop
                # refuses writes to a closed transport); nobody is left to answer.
                self.close()
                return
            if self.stats is not None:
                self.stats.bytes_sent += len(slot)
            try:
                self.writer.write(slot)
                self._draining = True
                await self.writer.drain()
            except OSError as e:
                log.info("kafka: cannot write to %s: %s", self.peer, e)
                self.close()
                return
            finally:
                self._draining = False
            self.unsent_bytes -= len(slot)
            self._room.set()
            self._touch()
