"""Inter-node RPC: length-prefixed msgpack frames over TCP (DESIGN.md section 1, port 9093).

Replica fetch, broker heartbeat, AlterPartition and metadata fetch travel over this.

Frame format
------------

Every message, either way, is one frame::

    +--------------------------+----------------------------------+
    | length: u32, big-endian  | body: `length` bytes of msgpack  |
    +--------------------------+----------------------------------+

    request body:  [request_id: int, method: str, payload: any]
    response body: [request_id: int, true,  result: any]
                   [request_id: int, false, {"code": int | str, "message": str}]

Payloads and results are plain msgpack values: nil, bool, int, float, str, bin, array, map
(packed with ``use_bin_type=True``, unpacked with ``raw=False, strict_map_key=False``, so str and
bytes stay apart and map keys may be ints). Extension types are refused, except msgpack's own
timestamp (it decodes to a harmless ``msgpack.Timestamp``; do not send one). Nothing is ever
pickled. ``length`` is 1..``max_frame_bytes`` (64 MiB by default), but for the answer of a call
made with a larger ``max_answer_bytes``: a replica fetch's answer carries its first batch whole
however large (Kafka's fetch does), and a batch is bounded only by the produce request that
brought it (``socket.request.max.bytes``, up to 2 GiB). A frame a client did not ask for so
large breaks its connection.

Theory of operation
-------------------

A client pipelines: it may send many requests on one connection without waiting, each with a
request id unique on that client, and the server answers each as soon as its handler finishes,
so answers can come back in any order; the client matches them by id. Errors come in two kinds:

- an *answer* that is an error (``ok`` false): the handler raised ``RpcError(code, message)``,
  the method is unknown (``UNKNOWN_METHOD``) or the handler failed otherwise (``INTERNAL``, and
  the server logs the traceback). The connection is fine and stays up.
- a *broken connection*: a frame that is too long, empty, not msgpack or not shaped as above.
  The receiver logs one line and closes that connection only; the peer's in-flight calls fail
  with ``RpcConnectionError`` and its next call reconnects. A server keeps serving everyone else.

A client connects lazily on its first call and again on the first call after a failure. Between
connection attempts it waits a backoff measured from the start of the previous attempt
(Kafka's ``reconnect.backoff.ms``: 50 ms doubling up to 1 s while attempts fail, reset by a
success), so a call made long after the last attempt never sleeps. The call's ``timeout_s``
covers everything: backoff, connecting, sending and waiting. A call that times out waiting for
its answer leaves the connection up, and its late answer is dropped; one that times out before
its request went out drops the connection (the server reads nothing), failing the calls in
flight on it, as Kafka's NetworkClient disconnects on a request timeout. The server cannot
see a caller's timeout, so a controller call's payload names it (``timeout_ms``,
``with_deadline``): a call still waiting for its turn past it decides nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import msgpack  # type: ignore[import-untyped, unused-ignore]

from kcoord.node.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
MAX_ANSWER_BYTES: Final = 2**32 - 1  # what the u32 length can state: see the module docstring
MAX_IN_FLIGHT: Final = 128  # requests of one connection handled or answered at once
# Connections a server takes at once (the nodes, their pools and the operator tools need a
# few dozen): beyond, a new one is closed at once. Without a cap one peer took every file
# descriptor, and the node's next segment or checkpoint failed its log directory (halted).
MAX_CONNECTIONS: Final = 1024
REFUSED_LOG_EVERY_S: Final = 60.0  # a refused connection is logged at most this often
# A request frame at least this long is decoded off the event loop (see read_frame), as the
# Kafka listener decodes a large request (kafka/server.py OFF_LOOP_REQUEST_BYTES).
OFF_LOOP_FRAME_BYTES: Final = 64 * 1024
IDLE_MS: Final = 600_000  # connections.max.idle.ms
CLOSE_GRACE_S: Final = 1.0  # a closed connection's answers have this long to go out
CLIENT_IDLE_MS: Final = 540_000  # a client's (Kafka's clients: 9 min, under the server's 10)
UNKNOWN_METHOD: Final = "UNKNOWN_METHOD"
INTERNAL: Final = "INTERNAL"

_HEADER: Final = struct.Struct(">I")

Handler = Callable[[Any], Awaitable[Any]]
Sleep = Callable[[float], Awaitable[None]]


_T = TypeVar("_T")
# The key of a controller call's payload naming its caller's wait in ms (``with_deadline``).
DEADLINE_KEY: Final = "timeout_ms"
# Set in a detached handler's context (``awaited_detached``) once its caller has gone.
_caller_gone: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "kcoord_rpc_caller_gone", default=None
)


async def awaited_detached(
    call: Callable[[], Awaitable[_T]],
    timeout_s: float | None = None,
    *,
    gone_after_s: float | None = None,
) -> _T:
    """``call()`` as a task its caller's going does not cancel, awaited up to ``timeout_s``
    (None: no limit). A caller that stops waiting (its timeout, or its own cancellation)
    marks it gone and leaves it running: it asks ``caller_gone()`` before it decides
    anything. A caller waiting from afar, who cannot say when it stops, is taken for gone
    ``gone_after_s`` from now (None: only when it says so). A failure nobody waits for any
    more is logged, not lost."""
    gone = asyncio.Event()
    token = _caller_gone.set(gone)
    try:
        task: asyncio.Future[_T] = asyncio.ensure_future(call())
    finally:
        _caller_gone.reset(token)
    task.add_done_callback(functools.partial(_retrieve, gone))
    if gone_after_s is not None:
        expiry = asyncio.get_running_loop().call_later(gone_after_s, gone.set)
        task.add_done_callback(lambda _: expiry.cancel())
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        gone.set()
        raise


def caller_gone() -> bool:
    """Whether the caller of the detached handler running here has gone (``awaited_detached``):
    Kafka's controller drops an event whose requester's deadline passed before it began."""
    gone = _caller_gone.get()
    return gone is not None and gone.is_set()


def _retrieve(gone: asyncio.Event, task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and gone.is_set() and not isinstance(error, RpcError):
        log.error("a handler whose caller had gone failed", exc_info=error)


def with_deadline(payload: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """``payload`` naming how long its caller waits for the answer, for a controller method
    (``runs_on_when_abandoned``): Kafka's ControllerApis gives a forwarded request the
    deadline of its own timeout. A node that knows no such key ignores it."""
    return {**payload, DEADLINE_KEY: max(1, int(timeout_s * 1000))}


def runs_on_when_abandoned(handler: Handler) -> Handler:
    """``handler``, run to its end even when its caller goes: the server cancels a closed
    connection's handlers (a replica fetch's long poll must end with its follower), but a
    controller decision cancelled while its batch commits set the active controller aside,
    and every broker got NOT_CONTROLLER until it came back (Kafka's QuorumController never
    abandons an event for a dropped connection). One whose caller went before it began
    decides nothing (``caller_gone``): its connection closed, or the wait its payload names
    (``with_deadline``) over, as Kafka's controller times out an event past its deadline.
    The in-process calls run so too."""

    async def run_on(payload: Any) -> Any:
        waits_ms = payload.get(DEADLINE_KEY) if isinstance(payload, dict) else None
        gone_after_s = None
        if isinstance(waits_ms, int) and not isinstance(waits_ms, bool) and waits_ms > 0:
            gone_after_s = waits_ms / 1000
        return await awaited_detached(lambda: handler(payload), gone_after_s=gone_after_s)

    return run_on


class RpcError(Exception):
    """An error answer. A handler raises it to answer ``{"code": code, "message": message}``."""

    def __init__(self, code: int | str, message: str) -> None:
        if not (_is_int(code) or isinstance(code, str)):
            raise TypeError(f"an RPC error code is an int or a str, got {code!r}")
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class RpcClientError(Exception):
    """A call that returned no result: the base of the three exceptions ``call`` raises."""


class RpcTimeout(RpcClientError):  # noqa: N818 (the agreed public name)
    """No answer within the call's ``timeout_s``; the request may or may not have run."""


class RpcConnectionError(RpcClientError):
    """Could not connect, or the connection broke before the answer came."""


class RpcRemoteError(RpcError, RpcClientError):
    """The server answered with an error. Re-raised by a handler, it forwards the same code."""


class FrameError(Exception):
    """A frame that breaks the format; the connection that carried it is closed."""


def encode_frame(body: Any, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Length prefix plus msgpack body.

    Raises ``TypeError`` for a value msgpack cannot carry and ``ValueError`` for a frame longer
    than ``max_frame_bytes``.
    """
    try:
        packed = msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"not a plain msgpack value: {e}") from e
    assert isinstance(packed, bytes)
    if len(packed) > max_frame_bytes:
        raise ValueError(f"frame of {len(packed)} bytes exceeds the limit of {max_frame_bytes}")
    return _HEADER.pack(len(packed)) + packed


def decode_body(data: bytes) -> Any:
    """Unpack one frame body; raises ``FrameError`` if it is not exactly one msgpack value."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_refuse_ext)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise FrameError(f"body is not one msgpack value: {str(e) or type(e).__name__}") from e


async def read_frame(
    reader: asyncio.StreamReader,
    max_frame_bytes: int | Callable[[], int],
    *,
    off_loop_bytes: int | None = None,
) -> Any:
    """Read and decode one frame; one of at least ``off_loop_bytes`` is decoded on a worker
    thread (msgpack holds the loop a second for 16 MiB of small values). ``max_frame_bytes``
    may be asked for once the length is read.

    Raises ``asyncio.IncompleteReadError`` at end of stream (``partial`` empty if it ended
    between frames) and ``FrameError`` for a bad length or body.
    """
    header = await reader.readexactly(_HEADER.size)
    (length,) = _HEADER.unpack(header)
    limit = max_frame_bytes if isinstance(max_frame_bytes, int) else max_frame_bytes()
    if not 0 < length <= limit:
        raise FrameError(f"frame length {length} is outside 1..{limit}")
    data = await reader.readexactly(length)
    if off_loop_bytes is not None and length >= off_loop_bytes:
        return await asyncio.to_thread(decode_body, data)
    return decode_body(data)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_request(body: Any) -> tuple[int, str, Any]:
    if not (isinstance(body, list) and len(body) == 3):
        raise FrameError(f"expected a request [id, method, payload], got {_describe(body)}")
    request_id, method, payload = body
    if not _is_int(request_id) or not isinstance(method, str):
        raise FrameError(f"expected a request [int, str, payload], got {_describe(body)}")
    return request_id, method, payload


def _parse_response(body: Any) -> tuple[int, bool, Any]:
    if not (isinstance(body, list) and len(body) == 3):
        raise FrameError(f"expected a response [id, ok, payload], got {_describe(body)}")
    request_id, ok, payload = body
    if not _is_int(request_id) or not isinstance(ok, bool):
        raise FrameError(f"expected a response [int, bool, payload], got {_describe(body)}")
    if not ok and not (
        isinstance(payload, dict)
        and (_is_int(payload.get("code")) or isinstance(payload.get("code"), str))
        and isinstance(payload.get("message"), str)
    ):
        raise FrameError(f"expected an error {{code, message}}, got {_describe(payload)}")
    return request_id, ok, payload


def _error(code: int | str, message: str) -> dict[str, int | str]:
    return {"code": code, "message": message}


class RpcServer:
    """Serves ``handlers`` (method name -> ``async def handler(payload) -> result``).

    Each request runs in its own task, so a slow handler (a long-polling replica fetch) holds
    up no other request on the same connection. When a connection closes, its unanswered
    requests' tasks are cancelled.

    As the Kafka listener (``kafka/server.py``): at most ``max_in_flight`` requests of a
    connection are being handled or answered at once, beyond which the server stops reading
    it and TCP pushes back (a peer pipelining requests and reading no answer grew the node's
    memory without bound); and a connection with nothing in flight that sends no whole frame
    for ``idle_ms`` is closed (``connections.max.idle.ms``; a client reconnects on its next
    call).
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        max_in_flight: int = MAX_IN_FLIGHT,
        idle_ms: int = IDLE_MS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        assert max_frame_bytes > 0 and max_in_flight > 0 and idle_ms != 0 and max_connections > 0
        assert 0 < max_answer_bytes <= MAX_ANSWER_BYTES, max_answer_bytes
        self._handlers = dict(handlers)
        self._max_frame_bytes = max_frame_bytes
        self._max_answer_bytes = max_answer_bytes
        self._max_in_flight = max_in_flight
        self._max_connections = max_connections
        self._refusal_logged_at = -REFUSED_LOG_EVERY_S
        self.connections_refused = 0
        # None: connections.max.idle.ms is negative, no idle expiry (Kafka's Selector).
        self._idle_s = None if idle_ms < 0 else idle_ms / 1000
        self._server: asyncio.Server | None = None
        self._stopping = False
        # Connection task -> its writer, so stop() can close the socket and wait for the task.
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._parked: set[asyncio.Task[Any]] = set()  # connections waiting for room

    @property
    def port(self) -> int:
        """The bound port (the real one when started with port 0; the first socket's)."""
        assert self._server is not None and self._server.sockets, "server not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def _idle_deadline(self, loop: asyncio.AbstractEventLoop) -> float | None:
        return None if self._idle_s is None else loop.time() + self._idle_s

    async def start(self, host: str, port: int) -> None:
        assert self._server is None, "server already started"
        self._stopping = False
        self._server = await asyncio.start_server(self._serve, host, port)

    async def stop(self) -> None:
        """Stop listening, close every connection and wait until their tasks have ended."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping = True
        server.close()
        # Connections accepted just before close() have tasks that have not run yet; let them
        # start, see _stopping and close themselves.
        await asyncio.sleep(0)
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            # A closed transport reads no more and ends only once its answers are out: a peer
            # that reads none held stop() for ever.
            _, late = await asyncio.wait(list(self._connections), timeout=CLOSE_GRACE_S)
            for task in late:
                if (stuck := self._connections.get(task)) is not None:
                    stuck.transport.abort()
                if task in self._parked:
                    # An abort does not wake a connection parked on its in-flight limit behind
                    # handlers that wait on and on (a controller call waiting for a quorum):
                    # the stop hung until the launcher's SIGKILL, with no clean-shutdown
                    # marker. Only there: one already waiting for its handlers' cleanup must
                    # be let finish it before stop() returns.
                    task.cancel()
            if late:
                await asyncio.wait(late)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Catches what a peer can cause: asyncio's streams (3.11) log any exception this task
        # ends with, and call task.exception() even on a cancelled one.
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        requests: set[asyncio.Task[None]] = set()
        written = _Written()
        room = asyncio.Semaphore(self._max_in_flight)
        loop = asyncio.get_running_loop()
        reading: asyncio.Timeout | None = None  # the idle deadline of the read under way

        def answered(request: asyncio.Task[None]) -> None:
            requests.discard(request)
            room.release()
            if not requests and reading is not None and not reading.expired():
                reading.reschedule(self._idle_deadline(loop))

        if len(self._connections) >= self._max_connections:
            self.connections_refused += 1
            now = loop.time()
            if now - self._refusal_logged_at >= REFUSED_LOG_EVERY_S:
                self._refusal_logged_at = now
                log.warning(
                    "rpc: refusing a connection from %s: %d connections open, the most taken "
                    "(%d refused so far)",
                    peer,
                    len(self._connections),
                    self.connections_refused,
                )
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        if not self._stopping:
            self._connections[task] = writer
        try:
            while not self._stopping:
                self._parked.add(task)
                try:
                    await room.acquire()
                except asyncio.CancelledError:
                    if not self._stopping:
                        raise
                    task.uncancel()  # stop() woke it: it closes as any other
                    break
                finally:
                    self._parked.discard(task)
                try:
                    async with asyncio.timeout(None) as reading:
                        if not requests:
                            reading.reschedule(self._idle_deadline(loop))
                        body = await read_frame(
                            reader, self._max_frame_bytes, off_loop_bytes=OFF_LOOP_FRAME_BYTES
                        )
                except TimeoutError:
                    log.info("rpc: closing idle connection from %s", peer)
                    break
                finally:
                    reading = None
                if writer.is_closing():
                    break  # aborted (see _answer): what is still buffered goes unanswered
                request_id, method, payload = _parse_request(body)
                request = asyncio.create_task(
                    self._answer(writer, written, request_id, method, payload)
                )
                requests.add(request)
                request.add_done_callback(answered)
        except asyncio.IncompleteReadError as e:
            if e.partial and not self._stopping:
                log.warning("rpc: connection from %s closed in the middle of a frame", peer)
        except FrameError as e:
            log.warning("rpc: closing connection from %s: %s", peer, e)
        except OSError as e:
            log.info("rpc: connection from %s lost: %s", peer, e)
        finally:
            try:
                for request in list(requests):
                    request.cancel()
                if requests:
                    await asyncio.wait(list(requests))
                writer.close()
                try:
                    async with asyncio.timeout(CLOSE_GRACE_S):
                        await writer.wait_closed()
                except TimeoutError:  # answers its peer does not read: stop() waited for ever
                    writer.transport.abort()
                except OSError:
                    pass
            finally:
                # Last: stop() waits for the connections listed here, and one gone from the
                # list while its handlers were still being cancelled outlived stop().
                self._connections.pop(task, None)

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        written: _Written,
        request_id: int,
        method: str,
        payload: Any,
    ) -> None:
        handler = self._handlers.get(method)
        response: list[Any]
        if handler is None:
            response = [request_id, False, _error(UNKNOWN_METHOD, f"unknown method {method!r}")]
        else:
            try:
                response = [request_id, True, await handler(payload)]
            except RpcError as e:
                response = [request_id, False, _error(e.code, e.message)]
            except Exception as e:
                log.exception("rpc: handler of %s failed", method)
                response = [request_id, False, _error(INTERNAL, f"{type(e).__name__}: {e}")]
        try:
            frame = encode_frame(response, self._max_answer_bytes)
        except (TypeError, ValueError) as e:
            log.error("rpc: cannot send the answer of %s: %s", method, e)
            error = _error(INTERNAL, f"cannot send the answer: {e}")
            frame = encode_frame([request_id, False, error], self._max_answer_bytes)
        if writer.is_closing():
            return
        writer.write(frame)
        written.bytes += len(frame)
        # A lost connection is _serve's to notice and clean up; nothing to answer any more.
        sent = written.sent(writer)
        while True:
            try:
                async with asyncio.timeout(self._idle_s):
                    await writer.drain()
                return
            except TimeoutError:  # an OSError too: first
                if (now := written.sent(writer)) > sent:
                    sent = now  # read slowly, but read
                    continue
                # A peer that reads no answers: its requests stay in flight, so _serve reads
                # no more and its idle deadline never runs; it held its slot for good. Kafka
                # closes a connection with no completed send or receive for
                # connections.max.idle.ms.
                log.info(
                    "rpc: closing connection from %s: nothing of its answers read for %.0f s",
                    writer.get_extra_info("peername"),
                    self._idle_s,
                )
                writer.transport.abort()
                return
            except OSError:
                return


class _Written:
    """The bytes of answers written to one connection: those handed to the kernel, which
    only grows (the buffer's size alone also grows with other answers), tell whether its
    peer reads. The kernel's own buffer (megabytes) hides some reading: at the default idle
    time a peer reading less than a few KB/s is taken for one that reads nothing."""

    def __init__(self) -> None:
        self.bytes = 0

    def sent(self, writer: asyncio.StreamWriter) -> int:
        return self.bytes - writer.transport.get_write_buffer_size()


class _Connection:
    """One client connection: pending calls by request id and the task reading answers."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        address: str,
        max_frame_bytes: int,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._address = address
        self._max_frame_bytes = max_frame_bytes
        self._pending: dict[int, asyncio.Future[Any]] = {}
        # The pending calls that take answers longer than max_frame_bytes, and how long.
        self._answer_limits: dict[int, int] = {}
        self.closed = False
        self._close_reason = ""
        self._reader_task = asyncio.create_task(self._read_answers())

    async def request(self, request_id: int, frame: bytes, max_answer_bytes: int) -> Any:
        if self.closed or self._writer.is_closing():
            raise RpcConnectionError(f"{self._address}: {self._close_reason or 'closing'}")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if max_answer_bytes > self._max_frame_bytes:
            self._answer_limits[request_id] = max_answer_bytes
        sent = False
        try:
            self._writer.write(frame)
            await self._writer.drain()
            sent = True
            return await future
        except OSError as e:
            raise RpcConnectionError(f"{self._address}: connection lost: {e}") from e
        except asyncio.CancelledError:
            if not sent:
                # Timed out (or abandoned) with its request still buffered: the server reads
                # nothing. Kept, the connection queued every later call's request behind it
                # without bound (a follower resent its whole fetch every few seconds to a
                # stopped leader), and closing it waited for ever to flush them. Kafka's
                # NetworkClient disconnects on a request timeout.
                self._shut("the server read no request in time", abort=True)
            raise
        finally:
            del self._pending[request_id]
            self._answer_limits.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # failed by _shut while drain() raised: seen, not lost

    async def _read_answers(self) -> None:
        reason = "connection closed by the server"
        try:
            while True:
                body = await read_frame(
                    self._reader, self._answer_limit, off_loop_bytes=OFF_LOOP_FRAME_BYTES
                )
                request_id, ok, payload = _parse_response(body)
                future = self._pending.get(request_id)
                if future is None or future.done():
                    continue  # the call timed out or was cancelled; nobody is waiting
                if ok:
                    future.set_result(payload)
                else:
                    future.set_exception(RpcRemoteError(payload["code"], payload["message"]))
        except asyncio.IncompleteReadError:
            pass
        except FrameError as e:
            reason = f"malformed answer: {e}"
            log.warning("rpc: closing connection to %s: %s", self._address, e)
        except OSError as e:
            reason = f"connection lost: {e}"
        except asyncio.CancelledError:
            reason = "client closed"
            raise
        finally:
            self._shut(reason)

    def _answer_limit(self) -> int:
        """The longest frame the calls waiting may be answered with: a longer one (an answer
        nobody asked for so long) breaks the connection before it is read."""
        return max([self._max_frame_bytes, *self._answer_limits.values()])

    @property
    def busy(self) -> bool:
        """Whether calls wait for their answers on it."""
        return bool(self._pending)

    def _shut(self, reason: str, *, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self._close_reason = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RpcConnectionError(f"{self._address}: {reason}"))
        if abort:
            self._writer.transport.abort()  # what is buffered goes unsent
        else:
            self._writer.close()

    async def close(self) -> None:
        self._shut("client closed")
        self._reader_task.cancel()
        await asyncio.wait([self._reader_task])
        try:
            async with asyncio.timeout(CLOSE_GRACE_S):
                await self._writer.wait_closed()
        except TimeoutError:  # requests a server never reads held the node's stop for ever
            self._writer.transport.abort()
        except OSError:
            pass


class RpcClient:
    """Calls one server over one lazily made, pipelined connection."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = 5.0,
        reconnect_backoff_ms: int = 50,
        reconnect_backoff_max_ms: int = 1000,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        idle_ms: int = CLIENT_IDLE_MS,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        assert 0 <= reconnect_backoff_ms <= reconnect_backoff_max_ms
        assert max_frame_bytes > 0, max_frame_bytes
        self.host = host
        self.port = port
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._connect_timeout_s = connect_timeout_s
        self._reconnect_backoff_ms = reconnect_backoff_ms
        self._reconnect_backoff_max_ms = reconnect_backoff_max_ms
        self._max_frame_bytes = max_frame_bytes
        self._clock = clock
        self._sleep = sleep
        self._request_ids = itertools.count(1)
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._last_attempt_ms: int | None = None
        self._failed_attempts = 0
        self._closed = False
        self._idle_ms = idle_ms
        self._last_used_ms: int | None = None
        self.connects = 0
        """Connections made so far (a reconnect counts)."""

    @property
    def is_connected(self) -> bool:
        return self._connection is not None and not self._connection.closed

    async def call(
        self, method: str, payload: Any, timeout_s: float, *, max_answer_bytes: int | None = None
    ) -> Any:
        """Send ``method(payload)`` and return the result, whose frame may be
        ``max_answer_bytes`` long (default: ``max_frame_bytes``).

        Raises ``RpcTimeout``, ``RpcConnectionError`` or ``RpcRemoteError`` (all
        ``RpcClientError``); ``TypeError`` or ``ValueError`` if ``payload`` is not a plain
        msgpack value or its frame is too long.
        """
        if self._closed:
            raise RpcConnectionError(f"{self._address}: client closed")
        answer_limit = self._max_frame_bytes if max_answer_bytes is None else max_answer_bytes
        assert 0 < answer_limit <= MAX_ANSWER_BYTES, answer_limit
        request_id = next(self._request_ids)
        frame = encode_frame([request_id, method, payload], self._max_frame_bytes)
        now = self._clock.monotonic_ms()
        connection = self._connection
        if (
            connection is not None
            and not connection.busy
            and self._last_used_ms is not None
            and now - self._last_used_ms >= self._idle_ms
        ):
            # As Kafka's clients (connections.max.idle.ms 9 min against the server's 10): a
            # call sent just as the server closed its idle connection would fail.
            self._connection = None
            await connection.close()
        self._last_used_ms = now
        try:
            async with asyncio.timeout(timeout_s):
                connection = await self._connected()
                return await connection.request(request_id, frame, answer_limit)
        except TimeoutError:
            raise RpcTimeout(f"{method} to {self._address}: no answer in {timeout_s}s") from None
        finally:
            self._last_used_ms = self._clock.monotonic_ms()

    async def close(self) -> None:
        """Close the connection; calls in flight fail with ``RpcConnectionError``."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.wait([self._connecting])
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def _connected(self) -> _Connection:
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        task = self._connecting
        if task is None:
            # One attempt shared by every concurrent caller; shielded so that a caller timing
            # out does not abort it for the others.
            task = self._connecting = asyncio.create_task(self._connect())
            task.add_done_callback(self._connect_done)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or current.cancelling() == 0):
                raise RpcConnectionError(f"{self._address}: client closed") from None
            raise

    def _connect_done(self, task: asyncio.Task[_Connection]) -> None:
        if self._connecting is task:
            self._connecting = None
        if not task.cancelled():
            task.exception()  # the callers that waited for it may all have timed out

    def reconnect_delay_ms(self) -> int:
        """How long the next connection attempt would wait (0 once the backoff has passed)."""
        if self._last_attempt_ms is None:
            return 0
        doublings = min(max(self._failed_attempts - 1, 0), 30)
        backoff_ms = min(self._reconnect_backoff_max_ms, self._reconnect_backoff_ms << doublings)
        return max(0, self._last_attempt_ms + backoff_ms - self._clock.monotonic_ms())

    async def _connect(self) -> _Connection:
        delay_ms = self.reconnect_delay_ms()
        if delay_ms > 0:
            await self._sleep(delay_ms / 1000)
        self._last_attempt_ms = self._clock.monotonic_ms()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except TimeoutError:
            self._failed_attempts += 1
            raise RpcConnectionError(
                f"{self._address}: connect timed out after {self._connect_timeout_s}s"
            ) from None
        except OSError as e:
            self._failed_attempts += 1
            raise RpcConnectionError(f"{self._address}: cannot connect: {e}") from e
        self._failed_attempts = 0
        self.connects += 1
        connection = _Connection(reader, writer, self._address, self._max_frame_bytes)
        self._connection = connection
        return connection


class RpcClientPool:
    """One ``RpcClient`` per (host, port), made on first use with the pool's options."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        reconnect_backoff_ms: int = 50,
        reconnect_backoff_max_ms: int = 1000,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        idle_ms: int = CLIENT_IDLE_MS,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._new_client = functools.partial(
            RpcClient,
            connect_timeout_s=connect_timeout_s,
            reconnect_backoff_ms=reconnect_backoff_ms,
            reconnect_backoff_max_ms=reconnect_backoff_max_ms,
            max_frame_bytes=max_frame_bytes,
            idle_ms=idle_ms,
            clock=clock,
            sleep=sleep,
        )
        self._clients: dict[tuple[str, int], RpcClient] = {}
        self._closed = False

    def get(self, host: str, port: int) -> RpcClient:
        if self._closed:
            raise RpcConnectionError(f"{host}:{port}: client pool closed")
        client = self._clients.get((host, port))
        if client is None:
            client = self._clients[(host, port)] = self._new_client(host, port)
        return client

    async def call(self, host: str, port: int, method: str, payload: Any, timeout_s: float) -> Any:
        return await self.get(host, port).call(method, payload, timeout_s)

    async def remove(self, host: str, port: int) -> None:
        """Close and forget the client of a node that left; a later ``get`` makes a new one."""
        client = self._clients.pop((host, port), None)
        if client is not None:
            await client.close()

    async def close_all(self) -> None:
        """Close every client; the pool makes no new ones after this."""
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
