"""Inter-node RPC over real loopback sockets, under asyncio's loop and uvloop.

Every test runs its coroutine to completion in a fresh loop, closes every socket it opens and
waits for conditions by polling with a deadline, never by sleeping a guessed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
import uvloop

from kcoord.node import rpc as rpc_module
from kcoord.node.rpc import (
    INTERNAL,
    UNKNOWN_METHOD,
    FrameError,
    Handler,
    RpcClient,
    RpcClientError,
    RpcClientPool,
    RpcConnectionError,
    RpcError,
    RpcRemoteError,
    RpcServer,
    RpcTimeout,
    awaited_detached,
    caller_gone,
    decode_body,
    encode_frame,
    read_frame,
)

HOST = "127.0.0.1"
TEST_TIMEOUT_S = 10.0

Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    factory: Callable[[], asyncio.AbstractEventLoop] = (
        uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop
    )

    def runner(main: Coroutine[Any, Any, None]) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(TEST_TIMEOUT_S):
                await main

        with asyncio.Runner(loop_factory=factory) as loop_runner:
            loop_runner.run(bounded())

    return runner


async def echo(payload: Any) -> Any:
    return payload


@contextlib.asynccontextmanager
async def serving(
    handlers: Mapping[str, Handler],
    *,
    port: int = 0,
    max_frame_bytes: int = 1 << 20,
    **options: Any,
) -> AsyncIterator[RpcServer]:
    server = RpcServer(handlers, max_frame_bytes=max_frame_bytes, **options)
    await server.start(HOST, port)
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def client_of(port: int, **options: Any) -> AsyncIterator[RpcClient]:
    client = RpcClient(HOST, port, connect_timeout_s=5.0, **options)
    try:
        yield client
    finally:
        await client.close()


async def poll_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


async def closed_by_the_server(port: int, data: bytes = b"") -> None:
    """Connect, send ``data``, and see the server close the connection."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        if data:
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(ConnectionResetError):
            assert await reader.read() == b""  # closed by the server
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def free_port() -> int:
    """A port nothing listens on: bound by a server that is then stopped."""
    async with serving({}) as server:
        return server.port


class Gates:
    """Handlers that wait until the test lets them finish, and tell when they started."""

    def __init__(self) -> None:
        self.entered: dict[Any, asyncio.Event] = {}
        self.release: dict[Any, asyncio.Event] = {}
        self.cancelled: list[Any] = []

    def _events(self, key: Any) -> tuple[asyncio.Event, asyncio.Event]:
        return (
            self.entered.setdefault(key, asyncio.Event()),
            self.release.setdefault(key, asyncio.Event()),
        )

    async def handler(self, payload: Any) -> Any:
        entered, release = self._events(payload)
        entered.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(payload)
            raise
        return payload

    async def wait_entered(self, key: Any) -> None:
        await self._events(key)[0].wait()

    def open(self, key: Any) -> None:
        self._events(key)[1].set()


def test_round_trip(run: Run) -> None:
    payload: dict[Any, Any] = {
        "ints": [0, -1, 2**63 - 1, -(2**63)],
        7: b"\x00\xffbytes",
        "text": "grüße",
        "none": None,
        "flags": [True, False],
        "float": 1.5,
        "nested": {"a": [{"b": []}]},
    }

    async def main() -> None:
        async with serving({"echo": echo}) as server, client_of(server.port) as client:
            assert await client.call("echo", payload, 5.0) == payload
            assert await client.call("echo", ("tuple", "becomes", "list"), 5.0) == [
                "tuple",
                "becomes",
                "list",
            ]
            assert await client.call("echo", None, 5.0) is None
            assert client.connects == 1
            assert server.connection_count == 1

    run(main())


def test_concurrent_calls_are_answered_out_of_order_on_one_connection(run: Run) -> None:
    async def main() -> None:
        gates = Gates()
        async with serving({"wait": gates.handler}) as server, client_of(server.port) as client:
            first = asyncio.create_task(client.call("wait", "first", 5.0))
            second = asyncio.create_task(client.call("wait", "second", 5.0))
            await gates.wait_entered("first")
            await gates.wait_entered("second")
            gates.open("second")
            assert await second == "second"
            assert not first.done()
            gates.open("first")
            assert await first == "first"
            assert client.connects == 1
            assert server.connection_count == 1

    run(main())


def test_timeout_drops_the_late_answer_and_keeps_the_connection(run: Run) -> None:
    async def main() -> None:
        gates = Gates()
        handlers = {"wait": gates.handler, "echo": echo}
        async with serving(handlers) as server, client_of(server.port) as client:
            with pytest.raises(
                RpcTimeout, match=r"^wait to 127\.0\.0\.1:\d+: no answer in 0\.05s$"
            ):
                await client.call("wait", "slow", 0.05)
            await gates.wait_entered("slow")
            gates.open("slow")  # its answer arrives for a call nobody waits for any more
            assert await client.call("echo", "fresh", 5.0) == "fresh"
            assert await client.call("echo", "again", 5.0) == "again"
            assert client.connects == 1

    run(main())


def test_unknown_method(run: Run) -> None:
    async def main() -> None:
        async with serving({"echo": echo}) as server, client_of(server.port) as client:
            with pytest.raises(RpcRemoteError) as info:
                await client.call("nope", {}, 5.0)
            assert info.value.code == UNKNOWN_METHOD
            assert "'nope'" in info.value.message
            assert isinstance(info.value, RpcClientError)
            assert await client.call("echo", 1, 5.0) == 1

    run(main())


def test_handler_rpc_error_is_answered_with_its_code(run: Run) -> None:
    async def not_leader(payload: Any) -> Any:
        raise RpcError("NOT_LEADER_OR_FOLLOWER", f"partition {payload} is led by node 2")

    async def numeric(payload: Any) -> Any:
        raise RpcError(6, "numeric codes pass too")

    async def main() -> None:
        handlers = {"fetch": not_leader, "numeric": numeric}
        async with serving(handlers) as server, client_of(server.port) as client:
            with pytest.raises(RpcRemoteError) as info:
                await client.call("fetch", 3, 5.0)
            assert (info.value.code, info.value.message) == (
                "NOT_LEADER_OR_FOLLOWER",
                "partition 3 is led by node 2",
            )
            assert str(info.value) == "NOT_LEADER_OR_FOLLOWER: partition 3 is led by node 2"
            with pytest.raises(RpcRemoteError) as info:
                await client.call("numeric", None, 5.0)
            assert info.value.code == 6

    run(main())


def test_rpc_error_code_must_be_int_or_str() -> None:
    with pytest.raises(TypeError):
        RpcError(1.5, "x")  # type: ignore[arg-type]


def test_internal_error_is_logged_and_keeps_the_connection(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(payload: Any) -> Any:
        raise ValueError("boom")

    async def unsendable(payload: Any) -> Any:
        return object()

    async def main() -> None:
        handlers = {"boom": boom, "unsendable": unsendable, "echo": echo}
        async with serving(handlers) as server, client_of(server.port) as client:
            with pytest.raises(RpcRemoteError) as info:
                await client.call("boom", None, 5.0)
            assert (info.value.code, info.value.message) == (INTERNAL, "ValueError: boom")
            with pytest.raises(RpcRemoteError) as info:
                await client.call("unsendable", None, 5.0)
            assert info.value.code == INTERNAL
            assert "cannot send the answer" in info.value.message
            assert await client.call("echo", "still up", 5.0) == "still up"
            assert client.connects == 1
            assert server.connection_count == 1

    with caplog.at_level(logging.ERROR, logger="kcoord.node.rpc"):
        run(main())
    failures = [r for r in caplog.records if "handler of boom failed" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None


def test_an_answer_may_be_longer_than_a_request_may(run: Run) -> None:
    """A replica fetch's answer carries a batch whole, up to what a produce request may carry:
    its frame is not held to the limit of what a peer may send unasked."""

    async def big(payload: Any) -> Any:
        return b"x" * 2000

    async def main() -> None:
        async with (
            serving({"big": big}, max_frame_bytes=1024) as server,
            client_of(server.port, max_frame_bytes=1024) as client,
        ):
            assert await client.call("big", None, 5.0, max_answer_bytes=4096) == b"x" * 2000

    run(main())


def test_an_answer_longer_than_any_call_asked_for_breaks_only_that_connection(
    run: Run,
) -> None:
    """A frame over max_frame_bytes is read only while a call that asked for one that long
    waits: a peer could otherwise send 4 GiB the client never asked for."""

    async def big(payload: Any) -> Any:
        return b"x" * 2000

    async def main() -> None:
        async with (
            serving({"big": big, "echo": echo}) as server,
            client_of(server.port, max_frame_bytes=1024) as client,
        ):
            with pytest.raises(RpcConnectionError, match=r"outside 1\.\.1024"):
                await client.call("big", None, 5.0)
            assert await client.call("echo", 1, 5.0) == 1
            with pytest.raises(RpcConnectionError, match=r"outside 1\.\.1500"):
                await client.call("big", None, 5.0, max_answer_bytes=1500)
            assert await client.call("big", None, 5.0, max_answer_bytes=2048) == b"x" * 2000
            assert client.connects == 3

    run(main())


def test_a_long_frame_nobody_waits_for_breaks_the_connection(run: Run) -> None:
    """Once the call that asked for a long answer is gone (it timed out), a long frame is
    refused before its body is read."""

    async def main() -> None:
        served = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await read_frame(reader, 1 << 20)
                await asyncio.sleep(0.3)  # past the call's timeout
                writer.write(struct.pack(">I", 8 << 20))  # claims 8 MiB, sends none of it
                await writer.drain()
                await reader.read()  # until the client closes
            finally:
                writer.close()
                served.set()

        server = await asyncio.start_server(serve, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with client_of(port, max_frame_bytes=1024) as client:
                with pytest.raises(RpcTimeout):
                    await client.call("slow", None, 0.1, max_answer_bytes=16 << 20)
                await poll_until(lambda: not client.is_connected)
            await served.wait()
        finally:
            server.close()
            await server.wait_closed()

    run(main())


def test_too_long_answer_is_an_internal_error(run: Run) -> None:
    async def big(payload: Any) -> Any:
        return b"x" * 2000

    async def main() -> None:
        async with (
            serving({"big": big, "echo": echo}, max_answer_bytes=1024) as server,
            client_of(server.port) as client,
        ):
            with pytest.raises(RpcRemoteError) as info:
                await client.call("big", None, 5.0)
            assert info.value.code == INTERNAL
            assert "exceeds the limit of 1024" in info.value.message
            assert await client.call("echo", 1, 5.0) == 1

    run(main())


def test_call_refuses_payloads_it_cannot_send(run: Run) -> None:
    async def main() -> None:
        async with (
            serving({"echo": echo}) as server,
            client_of(server.port, max_frame_bytes=1024) as client,
        ):
            with pytest.raises(TypeError, match="not a plain msgpack value"):
                await client.call("echo", {"x": object()}, 5.0)
            with pytest.raises(ValueError, match="exceeds the limit of 1024"):
                await client.call("echo", b"x" * 2000, 5.0)
            assert await client.call("echo", "ok", 5.0) == "ok"
            assert client.connects == 1

    run(main())


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


MALFORMED = {
    "garbage body": _frame(b"\xc1\xc1\xc1\xc1"),
    "length over the limit": struct.pack(">I", 2**31),
    "zero length": struct.pack(">I", 0),
    "not a request": _frame(msgpack.packb({"method": "echo"})),
    "method not a string": _frame(msgpack.packb([1, 2, 3])),
    "two values in one body": _frame(msgpack.packb([1, "echo", 1]) + b"\x00"),
    "extension type": _frame(msgpack.packb([1, "echo", msgpack.ExtType(5, b"x")])),
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frame_closes_only_that_connection(
    run: Run, caplog: pytest.LogCaptureFixture, data: bytes
) -> None:
    async def main() -> None:
        async with serving({"echo": echo}) as server, client_of(server.port) as client:
            assert await client.call("echo", "before", 5.0) == "before"
            await closed_by_the_server(server.port, data)
            assert await client.call("echo", "after", 5.0) == "after"
            assert client.connects == 1
            async with client_of(server.port) as newcomer:
                assert await newcomer.call("echo", "new", 5.0) == "new"

    with caplog.at_level(logging.WARNING, logger="kcoord.node.rpc"):
        run(main())
    assert [r.getMessage() for r in caplog.records if "closing connection from" in r.getMessage()]


def test_connections_past_the_cap_are_closed_at_once(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    """One peer opened connections until the node had no file descriptor left, and its next
    segment or checkpoint failed its log directory. Past ``max_connections`` a connection is
    closed at once (logged); those open are served, and one closing makes room."""

    async def main() -> None:
        async with serving({"echo": echo}, max_connections=2) as server:
            async with client_of(server.port) as first, client_of(server.port) as second:
                assert await first.call("echo", 1, 5.0) == 1
                assert await second.call("echo", 2, 5.0) == 2
                await closed_by_the_server(server.port)
                assert server.connections_refused == 1
                assert await first.call("echo", 3, 5.0) == 3
            await poll_until(lambda: server.connection_count == 0)
            async with client_of(server.port) as third:
                assert await third.call("echo", 4, 5.0) == 4

    with caplog.at_level(logging.WARNING, logger="kcoord.node.rpc"):
        run(main())
    assert "refusing a connection" in caplog.text


def test_a_large_request_frame_is_decoded_off_the_loop(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msgpack took 3.8 s of the event loop for 16 MiB of small values, past the broker
    session timeout: the node's own heartbeats stalled. A frame of OFF_LOOP_FRAME_BYTES or
    more is decoded on a worker thread."""
    decoded_on: list[bool] = []
    real = rpc_module.decode_body

    def recording(data: bytes) -> Any:
        decoded_on.append(threading.current_thread() is threading.main_thread())
        return real(data)

    monkeypatch.setattr(rpc_module, "decode_body", recording)

    async def main() -> None:
        async with (
            serving({"echo": echo}, max_frame_bytes=1 << 22) as server,
            client_of(server.port, max_frame_bytes=1 << 22) as client,
        ):
            assert await client.call("echo", "small", 5.0) == "small"
            large = list(range(rpc_module.OFF_LOOP_FRAME_BYTES))
            assert await client.call("echo", large, 5.0) == large

    run(main())
    # The server's reads of the two requests (the client's of the answers stay on the loop).
    assert decoded_on[0] is True and False in decoded_on


def test_a_connection_has_at_most_max_in_flight_requests_handled_at_once(run: Run) -> None:
    """Past the limit the server stops reading the connection: a peer pipelining requests and
    reading no answer grew the node's memory without bound."""
    gates = Gates()

    async def main() -> None:
        async with serving({"gate": gates.handler}, max_in_flight=3) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            for i in range(6):
                writer.write(encode_frame([i, "gate", i]))
            await writer.drain()
            for i in range(3):
                await gates.wait_entered(i)
            for _ in range(20):
                await asyncio.sleep(0)  # what the server would do with the rest
            assert set(gates.entered) == {0, 1, 2}
            gates.open(0)
            await gates.wait_entered(3)
            assert set(gates.entered) == {0, 1, 2, 3}
            for i in range(1, 6):
                gates.open(i)
            answered = {(await read_frame(reader, 1 << 20))[0] for _ in range(6)}
            assert answered == set(range(6))
            writer.close()

    run(main())


def test_a_negative_idle_time_serves_without_idle_expiry(run: Run) -> None:
    """connections.max.idle.ms=-1: the server asserted a positive idle time, and the node's
    client pool took -1 for an idle time of 1 ms."""

    async def main() -> None:
        async with serving({"echo": echo}, idle_ms=-1) as server:
            assert server._idle_s is None
            async with client_of(server.port) as client:
                assert await client.call("echo", "x", 5.0) == "x"

    run(main())


def test_an_idle_connection_is_closed_but_not_while_a_request_is_handled(run: Run) -> None:
    gates = Gates()

    async def main() -> None:
        async with serving({"gate": gates.handler}, idle_ms=200) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(encode_frame([1, "gate", "slow"]))
            await gates.wait_entered("slow")
            loop = asyncio.get_running_loop()
            held = loop.time() + 0.5
            while loop.time() < held:
                await asyncio.sleep(0.05)  # the handler takes longer than the idle time
            gates.open("slow")
            assert (await read_frame(reader, 1 << 20))[0] == 1
            assert await asyncio.wait_for(reader.read(), 5) == b""  # then idle: closed
            writer.close()
            gates.open("again")
            async with client_of(server.port) as client:
                assert await client.call("gate", "again", 5.0) == "again"

    run(main())


def test_a_connection_whose_answers_go_unread_is_closed_after_the_idle_time(run: Run) -> None:
    """A peer that sends requests and never reads their answers: they stayed in flight, so the
    server read no more from it and its idle deadline never ran; the connection held its slot
    (of ``max_connections``) for good."""
    big = "x" * (1 << 20)

    async def large(payload: Any) -> Any:
        return big

    async def main() -> None:
        async with serving(
            {"large": large}, idle_ms=300, max_in_flight=2, max_frame_bytes=4 << 20
        ) as server:
            _, writer = await asyncio.open_connection(HOST, server.port)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            for i in range(64):  # more answers than the socket buffers hold
                writer.write(encode_frame([i, "large", None]))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await poll_until(lambda: not server._connections)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            async with client_of(server.port) as client:
                assert await client.call("large", None, 5.0) == big

    run(main())


def test_a_peer_reading_its_answer_slowly_keeps_its_connection(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    """Closed only when nothing of its answers is read for the idle time: one read slowly
    (a replica fetcher on a loaded machine) is not cut. (Once the answer is in the kernel's
    buffers the connection is idle, as Kafka counts a completed send, and may be closed as
    such while its last megabytes are read.)"""
    caplog.set_level(logging.INFO, logger="kcoord.node.rpc")
    big = "x" * (24 << 20)  # more than the socket buffers hold

    async def large(payload: Any) -> Any:
        return big

    async def main() -> None:
        async with serving({"large": large}, idle_ms=300, max_frame_bytes=32 << 20) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(encode_frame([1, "large", None]))
            await writer.drain()
            await poll_until(  # the answer waits for the reader
                lambda: any(
                    w.transport.get_write_buffer_size() > 0 for w in server._connections.values()
                )
            )
            received = 0
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(8):
                while received < len(big):  # a slow reader: 2 MiB every 100 ms at most
                    wake = loop.time() + 0.1
                    while loop.time() < wake:
                        await asyncio.sleep(0.01)
                    goal = received + (2 << 20)
                    while received < min(goal, len(big)):
                        chunk = await reader.read(goal - received)
                        assert chunk, "the server closed a connection whose answer was read"
                        received += len(chunk)
            assert "nothing of its answers read" not in caplog.text
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    run(main())


def test_stop_does_not_wait_for_a_peer_that_reads_no_answers(run: Run) -> None:
    """stop() closed each connection and waited for its answers to go out: a peer that read
    none kept it waiting for ever (a node that never finished stopping)."""
    big = "x" * (1 << 20)

    async def large(payload: Any) -> Any:
        return big

    async def main() -> None:
        server = RpcServer({"large": large}, max_frame_bytes=4 << 20)
        await server.start(HOST, 0)
        _, writer = await asyncio.open_connection(HOST, server.port)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for i in range(64):
            writer.write(encode_frame([i, "large", None]))
        await writer.drain()
        await poll_until(  # answers pile up unread
            lambda: any(
                w.transport.get_write_buffer_size() > 0 for w in server._connections.values()
            )
        )
        async with asyncio.timeout(5):
            await server.stop()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    run(main())


def test_stop_ends_a_connection_parked_on_its_in_flight_limit(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection whose handlers all wait on and on (controller calls waiting for a quorum)
    stops reading at its in-flight limit; the abort after the grace did not wake it, and stop()
    hung until the launcher's SIGKILL (review helper-281)."""
    entered: list[int] = []

    async def forever(payload: Any) -> Any:
        entered.append(payload)
        await asyncio.Event().wait()

    async def main() -> None:
        server = RpcServer({"forever": forever}, max_in_flight=2)
        await server.start(HOST, 0)
        _, writer = await asyncio.open_connection(HOST, server.port)
        for i in range(3):
            writer.write(encode_frame([i, "forever", i]))
        await writer.drain()
        await poll_until(lambda: len(entered) == 2)  # the third waits for room
        async with asyncio.timeout(10):
            await server.stop()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    with caplog.at_level(logging.WARNING):
        run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("past_the_grace", [False, True])
def test_stop_waits_for_the_handlers_of_a_connection_that_is_closing(
    run: Run, monkeypatch: pytest.MonkeyPatch, past_the_grace: bool
) -> None:
    """A connection's task left the server's list as it began closing, before its handlers'
    cancellation ended: stop() then returned while a handler still ran (found by a review).
    Past the close grace too: stop() cancelled that wait (review helper-282)."""
    monkeypatch.setattr(rpc_module, "CLOSE_GRACE_S", 0.05)
    started, cancelled, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    finished: list[bool] = []

    async def slow(payload: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await release.wait()  # its cleanup takes a while
            finished.append(True)
            raise

    async def main() -> None:
        server = RpcServer({"slow": slow})
        await server.start(HOST, 0)
        _, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(encode_frame([1, "slow", None]))
        await writer.drain()
        await asyncio.wait_for(started.wait(), 5)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 5)
        stopping = asyncio.create_task(server.stop())
        for _ in range(20):
            await asyncio.sleep(0)
        if past_the_grace:
            await asyncio.sleep(0.3)  # the handler's cleanup takes longer than the grace
        assert not stopping.done(), "stop() returned while a handler was still running"
        release.set()
        await asyncio.wait_for(stopping, 5)
        assert finished == [True]

    run(main())


def test_a_call_timing_out_unsent_drops_the_connection_to_a_server_that_reads_nothing(
    run: Run,
) -> None:
    """A server that accepts and never reads (a stopped process): each call timed out with
    its request still buffered, the connection was kept and queued every later request
    behind it without bound, and closing the client waited for ever to flush them (a node's
    stop hung). As Kafka's NetworkClient on a request timeout, the connection is dropped."""

    async def main() -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        listener.bind((HOST, 0))
        listener.listen()
        listener.setblocking(False)
        accepted: list[socket.socket] = []

        async def accept() -> None:
            loop = asyncio.get_running_loop()
            while True:
                peer, _ = await loop.sock_accept(listener)
                accepted.append(peer)  # never read

        acceptor = asyncio.create_task(accept())
        client = RpcClient(HOST, listener.getsockname()[1], reconnect_backoff_ms=0)
        try:
            big = b"x" * (48 << 20)  # more than the socket buffers hold (4 MiB at most here)
            for _ in range(3):
                with pytest.raises(RpcTimeout):
                    await client.call("anything", big, 0.3)
                assert not client.is_connected
            assert client.connects == 3
            async with asyncio.timeout(5):
                await client.close()
        finally:
            acceptor.cancel()
            for peer in accepted:
                peer.close()
            listener.close()

    run(main())


def test_server_restart_client_reconnects_on_next_call(run: Run) -> None:
    async def main() -> None:
        async with serving({"echo": echo}) as server:
            port = server.port
            client = RpcClient(HOST, port, connect_timeout_s=5.0)
            try:
                assert await client.call("echo", 1, 5.0) == 1
                await server.stop()
                await poll_until(lambda: not client.is_connected)
                with pytest.raises(RpcConnectionError, match="cannot connect"):
                    await client.call("echo", 2, 5.0)
                async with serving({"echo": echo}, port=port):
                    assert await client.call("echo", 3, 5.0) == 3
                    assert client.connects == 2
            finally:
                await client.close()

    run(main())


def test_in_flight_calls_fail_when_the_server_dies(run: Run) -> None:
    async def main() -> None:
        gates = Gates()
        async with serving({"wait": gates.handler}) as server, client_of(server.port) as client:
            calls = [asyncio.create_task(client.call("wait", i, 5.0)) for i in range(3)]
            for i in range(3):
                await gates.wait_entered(i)
            await server.stop()
            for call in calls:
                with pytest.raises(RpcConnectionError, match="closed by the server"):
                    await call
            # The server cancelled the handlers of the requests nobody could be answered.
            assert sorted(gates.cancelled) == [0, 1, 2]

    run(main())


def test_in_flight_calls_fail_when_the_client_closes(run: Run) -> None:
    async def main() -> None:
        gates = Gates()
        async with serving({"wait": gates.handler}) as server:
            client = RpcClient(HOST, server.port, connect_timeout_s=5.0)
            call = asyncio.create_task(client.call("wait", "x", 5.0))
            await gates.wait_entered("x")
            await client.close()
            with pytest.raises(RpcConnectionError, match="client closed"):
                await call
            with pytest.raises(RpcConnectionError, match="client closed"):
                await client.call("wait", "y", 5.0)
            # The server notices the client went away and cancels its request.
            await poll_until(lambda: gates.cancelled == ["x"])
            await poll_until(lambda: server.connection_count == 0)

    run(main())


def test_malformed_answer_fails_the_calls_and_the_next_call_reconnects(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        answers = [_frame(b"\xc1"), None]  # first connection: garbage; second: a real answer
        writers: list[asyncio.StreamWriter] = []

        async def fake_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            header = await reader.readexactly(4)
            body = await reader.readexactly(struct.unpack(">I", header)[0])
            request_id = msgpack.unpackb(body)[0]
            answer = answers.pop(0)
            writer.write(answer or encode_frame([request_id, True, "fine"]))
            await writer.drain()

        server = await asyncio.start_server(fake_server, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with client_of(port) as client:
                with pytest.raises(RpcConnectionError, match="malformed answer"):
                    await client.call("x", None, 5.0)
                assert await client.call("x", None, 5.0) == "fine"
                assert client.connects == 2
        finally:
            server.close()
            for writer in writers:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            await server.wait_closed()

    with caplog.at_level(logging.WARNING, logger="kcoord.node.rpc"):
        run(main())
    assert any("closing connection to" in r.getMessage() for r in caplog.records)


class FakeTime:
    """A monotonic clock that only moves when told to, and a sleep that moves it."""

    def __init__(self) -> None:
        self.ms = 1_000_000
        self.sleeps_s: list[float] = []

    def now_ms(self) -> int:
        return self.ms

    def monotonic_ms(self) -> int:
        return self.ms

    async def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        self.ms += round(seconds * 1000)
        await asyncio.sleep(0)


def test_reconnect_backoff_doubles_and_never_sleeps_when_not_needed(run: Run) -> None:
    async def main() -> None:
        port = await free_port()
        time = FakeTime()
        options: dict[str, Any] = {
            "reconnect_backoff_ms": 50,
            "reconnect_backoff_max_ms": 300,
            "clock": time,
            "sleep": time.sleep,
        }

        async def refused() -> None:
            with pytest.raises(RpcConnectionError, match="cannot connect"):
                await client.call("echo", None, 5.0)

        async with client_of(port, **options) as client:
            await refused()
            assert time.sleeps_s == []  # the first attempt never waits
            await refused()
            await refused()
            await refused()
            await refused()
            assert time.sleeps_s == [0.05, 0.1, 0.2, 0.3]  # doubling, capped
            time.ms += 10_000
            assert client.reconnect_delay_ms() == 0
            async with serving({"echo": echo}, port=port) as server:
                assert await client.call("echo", "up", 5.0) == "up"
                assert time.sleeps_s == [0.05, 0.1, 0.2, 0.3]  # long after: no sleep
                await server.stop()
                await poll_until(lambda: not client.is_connected)
            time.ms += 20  # a disconnect soon after connecting waits the base backoff only
            assert client.reconnect_delay_ms() == 30

    run(main())


def test_a_client_reconnects_after_idling_longer_than_its_idle_time(run: Run) -> None:
    """Before the server's idle timer (which is longer) can close the connection under a call
    sent at that moment, as Kafka's clients do."""

    async def main() -> None:
        time = FakeTime()
        async with (
            serving({"echo": echo}) as server,
            client_of(server.port, idle_ms=1000, clock=time) as client,
        ):
            assert await client.call("echo", 1, 5.0) == 1
            time.ms += 999
            assert await client.call("echo", 2, 5.0) == 2
            assert client.connects == 1
            time.ms += 1000
            assert await client.call("echo", 3, 5.0) == 3
            assert client.connects == 2
            await poll_until(lambda: server.connection_count == 1)

    run(main())


def test_concurrent_callers_share_one_connection_attempt(run: Run) -> None:
    async def main() -> None:
        async with serving({"echo": echo}) as server, client_of(server.port) as client:
            results = await asyncio.gather(*(client.call("echo", i, 5.0) for i in range(20)))
            assert results == list(range(20))
            assert client.connects == 1
            assert server.connection_count == 1

    run(main())


def test_client_pool_reuses_clients_by_address(run: Run) -> None:
    async def main() -> None:
        async with serving({"echo": echo}) as one, serving({"echo": echo}) as two:
            pool = RpcClientPool(connect_timeout_s=5.0)
            try:
                assert pool.get(HOST, one.port) is pool.get(HOST, one.port)
                assert pool.get(HOST, one.port) is not pool.get(HOST, two.port)
                assert await pool.call(HOST, one.port, "echo", "a", 5.0) == "a"
                assert await pool.call(HOST, two.port, "echo", "b", 5.0) == "b"
                old = pool.get(HOST, two.port)
                await pool.remove(HOST, two.port)
                with pytest.raises(RpcConnectionError, match="client closed"):
                    await old.call("echo", "c", 5.0)
                assert pool.get(HOST, two.port) is not old
                assert await pool.call(HOST, two.port, "echo", "d", 5.0) == "d"
                survivor = pool.get(HOST, one.port)
            finally:
                await pool.close_all()
            with pytest.raises(RpcConnectionError, match="client closed"):
                await survivor.call("echo", "e", 5.0)
            with pytest.raises(RpcConnectionError, match="pool closed"):
                pool.get(HOST, one.port)

    run(main())


def test_frame_codec() -> None:
    frame = encode_frame([1, "m", {"k": b"v"}])
    assert frame[:4] == struct.pack(">I", len(frame) - 4)
    assert decode_body(frame[4:]) == [1, "m", {"k": b"v"}]
    assert decode_body(msgpack.packb({1: "int keys"})) == {1: "int keys"}
    with pytest.raises(ValueError, match="exceeds the limit of 4"):
        encode_frame("hello", 4)
    with pytest.raises(TypeError):
        encode_frame(object())
    for bad in (b"", b"\xc1", b"\x01\x02", msgpack.packb(msgpack.ExtType(1, b""))):
        with pytest.raises(FrameError):
            decode_body(bad)


def test_stop_is_idempotent_and_the_server_can_start_again(run: Run) -> None:
    async def use(server: RpcServer) -> None:
        async with client_of(server.port) as client:
            assert await client.call("echo", 1, 5.0) == 1

    async def main() -> None:
        server = RpcServer({"echo": echo})
        await server.stop()  # never started: nothing to do
        await server.start(HOST, 0)
        await use(server)
        await server.stop()
        await server.stop()
        await server.start(HOST, 0)
        try:
            await use(server)
        finally:
            await server.stop()

    run(main())


def test_a_detached_call_knows_when_its_caller_has_gone(run: Run) -> None:
    """``awaited_detached`` runs the call on when its caller stops waiting (its timeout, or
    its own cancellation), and the call then reads ``caller_gone()`` true: a controller
    decision not begun by then decides nothing. The in-process controller calls and the RPC
    server's controller methods go through it."""

    async def main() -> None:
        seen: list[bool] = []
        started: list[bool] = []

        async def decision(begin: asyncio.Event) -> str:
            started.append(True)
            await begin.wait()  # queued behind the decision lock
            seen.append(caller_gone())
            return "decided"

        ready = asyncio.Event()
        ready.set()
        assert await awaited_detached(lambda: decision(ready), 5) == "decided"
        late = asyncio.Event()
        with pytest.raises(TimeoutError):
            await awaited_detached(lambda: decision(late), 0.01)
        late.set()
        await poll_until(lambda: len(seen) == 2)
        cancelled = asyncio.Event()
        waiting = asyncio.create_task(awaited_detached(lambda: decision(cancelled)))
        await poll_until(lambda: len(started) == 3)
        waiting.cancel()
        await asyncio.wait([waiting])
        cancelled.set()
        await poll_until(lambda: len(seen) == 3)
        assert seen == [False, True, True]

    run(main())
