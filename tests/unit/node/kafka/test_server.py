"""The Kafka listener (node/kafka/server.py) with stand-in handlers: framing, ordering,
pipelining, closing on bad input, idleness, and that one bad connection never hurts another."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kcoord.errors import Errors
from kcoord.node.kafka import codec
from kcoord.node.kafka import server as server_module
from kcoord.node.kafka.apis import (
    CLOSE_CONNECTION,
    NO_RESPONSE,
    ApiRegistry,
    Deferred,
    Request,
    Result,
)
from kcoord.node.kafka.server import (
    LARGE_REQUEST_BYTES,
    OFF_LOOP_REQUEST_BYTES,
    OFF_LOOP_RESPONSE_ENTRIES,
    KafkaServer,
    response_weight,
)
from tests.unit.node.kafka.harness import until
from tests.unit.node.kafka.wire import AsyncWireClient, encode_request

HOST = "127.0.0.1"
METADATA, FIND_COORDINATOR, PRODUCE, API_VERSIONS, LIST_OFFSETS = 3, 10, 0, 18, 2
DESCRIBE_GROUPS = 15
TEST_TIMEOUT_S = 10.0
CANCELLED = -99  # a ListOffsets timestamp: the handler's deferred work is cancelled
UNANSWERABLE = -98  # a ListOffsets timestamp: the deferred answer is not a response's values
MIB = 1024 * 1024
HANDLED: list[tuple[str, str]] = []  # ListOffsets read and answered, by topic name


def registry() -> ApiRegistry:
    """Metadata echoes after a delay given as the first topic name (ms), FindCoordinator
    fails, Produce answers nothing or closes (acks 0 / 1), ListOffsets defers a delay."""
    r = ApiRegistry()

    async def metadata(request: Request) -> Result:
        topics = request.body.topics or []
        if topics and topics[0].name == "cancelled":
            raise asyncio.CancelledError  # the handler's own work was cancelled
        if topics:
            await asyncio.sleep(int(topics[0].name) / 1000)  # the test's own request
        return {"topics": [{"name": t.name, "error_code": 0} for t in topics]}

    async def failing(request: Request) -> Result:
        raise RuntimeError("boom")

    async def produce(request: Request) -> Result:
        return NO_RESPONSE if request.body.acks == 0 else CLOSE_CONNECTION

    async def list_offsets(request: Request) -> Result:
        delay_ms = request.body.topics[0].partitions[0].timestamp
        if delay_ms == CANCELLED:
            cancelled = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            return Deferred(cancelled)
        if delay_ms == UNANSWERABLE:

            async def bug() -> Any:
                return 42  # a handler's bug: no response's values

            return Deferred(bug())

        name = request.body.topics[0].name
        HANDLED.append(("read", name))

        async def later() -> dict[str, Any]:
            await asyncio.sleep(delay_ms / 1000)
            HANDLED.append(("answered", name))
            return {"topics": [{"name": str(delay_ms), "partitions": []}]}

        # The partition index: the most the answer may take, in MiB (a fetch's max_bytes).
        return Deferred(later(), request.body.topics[0].partitions[0].partition_index * MIB)

    async def describe_groups(request: Request) -> Result:
        # Every group named, named twice or not, with 300 KB of member metadata.
        member: dict[str, Any] = {"member_id": "m", "client_id": "c", "client_host": "h"}
        member |= {"member_metadata": b"m" * 300_000, "member_assignment": b""}
        return {
            "groups": [
                {
                    "error_code": 0,
                    "group_id": g,
                    "group_state": "Stable",
                    "protocol_type": "consumer",
                    "protocol_data": "range",
                    "members": [member],
                }
                for g in request.body.groups
            ]
        }

    r.register(METADATA, metadata)
    r.register(DESCRIBE_GROUPS, describe_groups)
    r.register(FIND_COORDINATOR, failing)
    r.register(PRODUCE, produce, min_version=3)
    r.register(LIST_OFFSETS, list_offsets, min_version=1)
    return r


@contextlib.asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[KafkaServer]:
    server = KafkaServer(registry(), **options)
    await server.start(HOST, 0)
    try:
        yield server
    finally:
        await server.stop()


def run(test: Callable[[KafkaServer], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S), serving(**options) as server:
            await test(server)

    asyncio.run(main())


async def connect(server: KafkaServer) -> AsyncWireClient:
    return await AsyncWireClient.connect(HOST, server.port)


def list_offsets(delay_ms: int) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "timestamp": delay_ms}]}],
    }


async def still_serves(server: KafkaServer) -> None:
    client = await connect(server)
    response = await client.call(API_VERSIONS, 0, {})
    assert response.error_code == Errors.NONE
    await client.close()


def test_pipelined_responses_leave_in_request_order() -> None:
    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        delays = [300, 10, 150, 0, 50]
        ids = [await c.send(LIST_OFFSETS, 5, list_offsets(d)) for d in delays]
        ids.append(await c.send(METADATA, 9, {"topics": [{"name": "20"}]}))
        got = []
        for _ in delays:
            correlation_id, body = await c.receive(LIST_OFFSETS, 5)
            got.append((correlation_id, body.topics[0].name))
        correlation_id, _ = await c.receive(METADATA, 9)
        got.append((correlation_id, "metadata"))
        assert got == list(zip(ids, [*map(str, delays), "metadata"], strict=True))
        await c.close()

    run(test)


def test_acks_zero_and_close_connection_results() -> None:
    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        await c.send(PRODUCE, 9, {"acks": 0, "timeout": 0, "topic_data": []})
        sent = await c.send(API_VERSIONS, 0, {})
        correlation_id, _ = await c.receive(API_VERSIONS, 0)
        assert correlation_id == sent
        # CLOSE_CONNECTION: earlier responses are written first, then the connection closes.
        first = await c.send(LIST_OFFSETS, 5, list_offsets(100))
        await c.send(PRODUCE, 9, {"acks": 1, "timeout": 0, "topic_data": []})
        correlation_id, _ = await c.receive(LIST_OFFSETS, 5)
        assert correlation_id == first
        assert await asyncio.wait_for(c.closed_by_server(), 5)
        await c.close()
        await still_serves(server)

    run(test)


async def assert_closed_for(server: KafkaServer, data: bytes, *, end_write: bool = False) -> None:
    c = await connect(server)
    before = server.connections_closed_for_errors
    await c.send_raw(data)
    if end_write:
        c.writer.write_eof()
    assert await asyncio.wait_for(c.closed_by_server(), 5)
    await c.close()
    deadline = time.monotonic() + 5
    while server.connections_closed_for_errors == before and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the server counts after closing
    assert server.connections_closed_for_errors == before + 1
    await still_serves(server)


def test_bad_input_closes_that_connection_only() -> None:
    async def test(server: KafkaServer) -> None:
        good = await connect(server)
        header = struct.pack(">hhih", METADATA, 1, 5, -1)
        cases = [
            struct.pack(">i", 2048) + b"x" * 16,  # larger than max_request_bytes
            struct.pack(">i", -1),  # negative size
            struct.pack(">i", 0),  # empty frame
            struct.pack(">i", 3) + b"abc",  # shorter than a header
            struct.pack(">i", 10) + struct.pack(">hhih", 999, 0, 1, -1),  # unknown api key
            struct.pack(">i", 10) + struct.pack(">hhih", METADATA, 99, 1, -1),  # bad version
            struct.pack(">i", 14) + header + struct.pack(">i", 0x7FFFFFFF),  # huge array
            struct.pack(">i", 13) + header + b"\xff\x00\x00",  # garbage body
        ]
        for data in cases:
            await assert_closed_for(server, data)
        # A frame cut short by the end of the stream.
        await assert_closed_for(server, struct.pack(">i", 100) + b"x" * 10, end_write=True)
        # The connection opened before all this still works.
        assert (await good.call(METADATA, 9, {"topics": []})).topics == ()
        await good.close()

    run(test, max_request_bytes=1024)


def test_a_failing_handler_is_answered_unknown_server_error_in_order() -> None:
    """Kafka's KafkaApis.handle answers the request with its error response; the connection
    was closed, the client reconnected and sent the request again, for ever if the failure is
    deterministic, and the answers to requests pipelined behind it were dropped."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        ids = [
            await c.send(LIST_OFFSETS, 5, list_offsets(50)),
            await c.send(FIND_COORDINATOR, 3, {"key": "g"}),  # its handler raises
            await c.send(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["a", "b"]}),
            await c.send(API_VERSIONS, 0, {}),
        ]
        first, _ = await c.receive(LIST_OFFSETS, 5)
        second, failed = await c.receive(FIND_COORDINATOR, 3)
        third, batched = await c.receive(FIND_COORDINATOR, 4)
        fourth, _ = await c.receive(API_VERSIONS, 0)
        assert [first, second, third, fourth] == ids
        assert failed.error_code == Errors.UNKNOWN_SERVER_ERROR
        assert failed.error_message is None  # Kafka leaves the exception's text out
        assert [(k.key, k.error_code) for k in batched.coordinators] == [
            ("a", Errors.UNKNOWN_SERVER_ERROR),
            ("b", Errors.UNKNOWN_SERVER_ERROR),
        ]
        assert server.connections_closed_for_errors == 0
        await c.close()

    run(test)


def test_api_versions_of_an_unknown_version_is_answered_in_v0() -> None:
    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        await c.send_raw(
            struct.pack(">i", 11) + struct.pack(">hhih", API_VERSIONS, 77, 3, -1) + b"\x00"
        )
        correlation_id, response = await c.receive(API_VERSIONS, 0)
        assert correlation_id == 3
        assert response.error_code == Errors.UNSUPPORTED_VERSION
        assert [k.api_key for k in response.api_keys] == [API_VERSIONS]  # KIP-511
        assert (await c.call(API_VERSIONS, 2, {})).error_code == Errors.NONE
        # The answer counted as sent, or the count of unsent bytes drifted below zero and the
        # memory guard on them went up by as much with every such request.
        (conn,) = server._connections.values()
        await until(lambda: conn.unsent_bytes == 0, "every reservation released")
        await c.close()

    run(test)


def test_a_cancelled_deferred_answer_closes_its_connection() -> None:
    """The writer awaiting it died of the cancellation and left the connection open, answering
    nothing, for ever: the reader went on queueing and the idle timer saw requests in
    flight."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        await c.send(LIST_OFFSETS, 5, list_offsets(CANCELLED))
        assert await asyncio.wait_for(c.closed_by_server(), 5)
        await c.close()
        await still_serves(server)

    run(test)


def test_a_handler_cancelled_from_within_answers_what_came_before_and_closes() -> None:
    """A handler raising CancelledError (not an Exception) ended the reader: no close was
    queued, the connection stayed open answering nothing until the idle timeout, its slot
    counted against max.connections. The answers before it are sent, then it closes."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        first = await c.send(METADATA, 9, {"topics": [{"name": "20"}]})
        await c.send(METADATA, 9, {"topics": [{"name": "cancelled"}]})
        correlation_id, _ = await c.receive(METADATA, 9)
        assert correlation_id == first
        assert await asyncio.wait_for(c.closed_by_server(), 5)
        await c.close()
        await until(lambda: server.connection_count == 0, "the connection to go")
        await still_serves(server)

    run(test)


def test_a_deferred_answer_that_cannot_be_made_is_answered_unknown_server_error() -> None:
    """Making the answer failed after the handler's work was done, outside what was caught:
    the writer died of it, and the reader, waiting for room the writer would have made, kept
    the connection open for ever, its descriptor counted against max.connections. It is
    answered as a failed handler is: every partition asked for with UNKNOWN_SERVER_ERROR."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        await c.send(LIST_OFFSETS, 5, list_offsets(UNANSWERABLE))
        _, answer = await c.receive(LIST_OFFSETS, 5)
        assert [
            (t.name, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in answer.topics
        ] == [("t", [(0, Errors.UNKNOWN_SERVER_ERROR)])]
        await still_serves(server)
        assert (await c.call(API_VERSIONS, 0, {})).error_code == Errors.NONE
        await c.close()
        await until(lambda: server.connection_count == 0, "the connection to go")

    run(test)


def answer_pending(server: KafkaServer) -> bool:
    return any(conn._pending for conn in server._connections.values())


def test_a_peer_that_half_closes_gets_every_answer_then_the_connection_closes() -> None:
    """The end of the stream closed the connection at once: answers ready but not yet written
    (7 of 20 single ApiVersions requests) and those still being made were dropped. Kafka reads
    a channel only while no request of it is in flight, so it sees the end of the stream after
    its last answer is sent."""

    async def test(server: KafkaServer) -> None:
        for _ in range(20):
            c = await connect(server)
            ids = [
                await c.send(API_VERSIONS, 0, {}),
                await c.send(LIST_OFFSETS, 5, list_offsets(50)),
                await c.send(METADATA, 9, {"topics": []}),
            ]
            c.writer.write_eof()
            got = [
                (await c.receive(API_VERSIONS, 0))[0],
                (await c.receive(LIST_OFFSETS, 5))[0],
                (await c.receive(METADATA, 9))[0],
            ]
            assert got == ids
            assert await asyncio.wait_for(c.closed_by_server(), 5)
            await c.close()
        await until(lambda: server.connection_count == 0, "the connections to go")
        assert server.connections_closed_for_errors == 0
        await still_serves(server)

    run(test)


def test_a_peer_that_hangs_up_is_let_go_once_its_answers_are_made() -> None:
    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        await c.send(LIST_OFFSETS, 5, list_offsets(1_000))
        await until(lambda: answer_pending(server), "the request to arrive")
        (conn,) = server._connections.values()
        await c.close()
        reader = conn._tasks[0]
        await until(reader.done, "the server to read the end of the stream")
        # Held for the answer still being made, as Kafka's muted channel is.
        assert server.connection_count == 1 and answer_pending(server)
        assert ("answered", "t") not in HANDLED
        await until(lambda: ("answered", "t") in HANDLED, "the answer to be made")
        await until(lambda: server.connection_count == 0, "the connection to go")
        await still_serves(server)

    HANDLED.clear()
    run(test)


def test_a_cancelled_connection_task_ends_cancelled() -> None:
    """An event loop torn down without the server's stop cancels the connection's task; its
    clean-up asked its reader and writer, cancelled but not yet done, for their exceptions,
    raised InvalidStateError, and skipped waiting for the socket to close."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        await until(lambda: server.connection_count == 1, "the connection to be served")
        (task,) = server._connections
        task.cancel()
        await asyncio.wait([task])
        assert task.cancelled()
        assert await asyncio.wait_for(c.closed_by_server(), 5)
        await c.close()

    run(test)


@pytest.mark.parametrize("what", ["answer", "request"])
def test_what_a_deferred_answer_may_take_or_holds_counts_before_it_is_made(
    what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deferred answer counted nothing until it was made: a peer that never read could
    have five fetch long polls of up to 55 MiB each made at once, or five produces of up to
    100 MiB held while they waited for acks=all. The most the answer may take, and the
    request it holds, count as unsent meanwhile; the next request is read once there is room
    again."""
    if what == "request":
        monkeypatch.setattr(server_module, "MAX_UNSENT_BYTES", 5_000)
    mib, pad = (10, 0) if what == "answer" else (0, 3_000)  # either fills the limit by two

    async def test(server: KafkaServer) -> None:
        HANDLED.clear()
        c = await connect(server)
        for name, delay_ms in (("a", 100), ("b", 500), ("c", 0)):
            request = list_offsets(delay_ms)
            request["topics"][0].update(name=name + "." * pad)
            request["topics"][0]["partitions"][0].update(partition_index=mib)
            await c.send(LIST_OFFSETS, 5, request)
        for _ in range(3):
            await c.receive(LIST_OFFSETS, 5)
        # a and b are past the limit: c is read once a's answer is made, not before.
        order = [(event, name[:1]) for event, name in HANDLED]
        assert order.index(("read", "c")) > order.index(("answered", "a")), order
        (conn,) = server._connections.values()
        await until(lambda: conn.unsent_bytes == 0, "every reservation released")
        await c.close()

    run(test)


def test_idle_connections_are_closed_but_not_while_a_request_waits() -> None:
    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        started = time.monotonic()
        # A deferred response longer than the idle timeout keeps the connection, and so does
        # a handler that takes as long before it answers (it was closed, the handler
        # cancelled).
        await c.call(LIST_OFFSETS, 5, list_offsets(600))
        assert time.monotonic() - started >= 0.55
        response = await c.call(METADATA, 9, {"topics": [{"name": "600"}]})
        assert [t.name for t in response.topics] == ["600"]
        assert time.monotonic() - started >= 1.1
        started = time.monotonic()
        assert await asyncio.wait_for(c.closed_by_server(), 5)
        assert 0.2 <= time.monotonic() - started < 3
        await c.close()
        deadline = time.monotonic() + 5
        while server.connection_count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the server task ends after the socket closes
        assert server.connection_count == 0

    run(test, idle_ms=300)


def test_a_frame_still_arriving_is_not_idleness() -> None:
    """Every read of a frame is activity (Kafka's Selector notes every read): a request
    uploaded slower than the idle time was cut off part way."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        names = ["0"] + [f"topic-{i:05}" for i in range(200)]
        frame = encode_request(METADATA, 9, 3, {"topics": [{"name": n} for n in names]})
        step = len(frame) // 5 + 1
        started = time.monotonic()
        for start in range(0, len(frame), step):
            await c.send_raw(frame[start : start + step])
            await asyncio.sleep(0.4)  # the test's own pacing: a slow upload
        assert time.monotonic() - started > 1.5  # longer than the idle time in all
        correlation_id, response = await c.receive(METADATA, 9)
        assert correlation_id == 3 and len(response.topics) == len(names)
        await c.close()

    run(test, idle_ms=1500)


def test_a_negative_idle_time_never_expires_a_connection() -> None:
    """connections.max.idle.ms=-1 (Kafka's Selector: no IdleExpiryManager): refused as out
    of range before; now no idle timer is ever armed."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        await c.call(LIST_OFFSETS, 5, list_offsets(0))
        (conn,) = server._connections.values()
        assert conn._idle_timer is None
        await c.close()

    run(test, idle_ms=-1)


def test_connections_past_max_connections_are_closed_at_once() -> None:
    """Kafka's max.connections: a client past it is not served, the others are, and once one
    goes a new connection is served again (clients that took every descriptor made the node
    fail a checkpoint write, and halt)."""

    async def test(server: KafkaServer) -> None:
        first, second = await connect(server), await connect(server)
        for c in (first, second):  # both served: counted
            await c.call(LIST_OFFSETS, 5, list_offsets(0))
        third = await connect(server)
        assert await asyncio.wait_for(third.closed_by_server(), 5)
        assert server.connections_refused >= 1
        await first.call(LIST_OFFSETS, 5, list_offsets(0))  # the others are served
        await first.close()
        deadline = time.monotonic() + 5
        while server.connection_count > 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the server task ends after the socket closes
        again = await connect(server)
        await again.call(LIST_OFFSETS, 5, list_offsets(0))
        for c in (second, third, again):
            await c.close()

    run(test, max_connections=2)


def test_connections_past_max_connections_per_ip_are_closed_at_once() -> None:
    """Kafka's max.connections.per.ip (ConnectionQuotas): one address past its limit is not
    served, another address is, and an override raises one address's limit."""

    async def test(server: KafkaServer) -> None:
        first, second = await connect(server), await connect(server)
        for c in (first, second):
            await c.call(LIST_OFFSETS, 5, list_offsets(0))
        third = await connect(server)
        assert await asyncio.wait_for(third.closed_by_server(), 5)
        assert server.connections_refused == 1
        reader, writer = await asyncio.open_connection(
            HOST, server.port, local_addr=("127.0.0.2", 0)
        )
        elsewhere = AsyncWireClient(reader, writer)
        await elsewhere.call(LIST_OFFSETS, 5, list_offsets(0))  # another address: served
        await first.close()
        await until(lambda: server.connection_count == 2, "the first connection to go")
        again = await connect(server)
        await again.call(LIST_OFFSETS, 5, list_offsets(0))
        for c in (second, third, elsewhere, again):
            await c.close()

    run(test, max_connections_per_ip=2)

    async def overridden(server: KafkaServer) -> None:
        clients = [await connect(server) for _ in range(3)]
        for c in clients:
            await c.call(LIST_OFFSETS, 5, list_offsets(0))
        assert server.connections_refused == 0
        for c in clients:
            await c.close()

    run(overridden, max_connections_per_ip=2, max_connections_per_ip_overrides={HOST: 3})


def test_many_pipelined_requests_beyond_the_in_flight_limit() -> None:
    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        ids = [await c.send(LIST_OFFSETS, 5, list_offsets(i % 3 * 10)) for i in range(40)]
        got = [(await c.receive(LIST_OFFSETS, 5))[0] for _ in ids]
        assert got == ids
        await c.close()

    run(test, max_in_flight=3)


def test_stop_closes_connections_with_requests_in_flight() -> None:
    async def main() -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            server = KafkaServer(registry())
            await server.start(HOST, 0)
            c = await connect(server)
            await c.send(LIST_OFFSETS, 5, list_offsets(60_000))
            deadline = time.monotonic() + 5
            while server.connection_count == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await server.stop()
            assert server.connection_count == 0
            assert await asyncio.wait_for(c.closed_by_server(), 5)
            await c.close()

    asyncio.run(main())


# ------------------------------------------------------------------ peers that do not read

FETCH = 1
BIG = 4 * 1024 * 1024


def big_answers(server: KafkaServer) -> list[int]:
    """Make Fetch (v12) answer ``BIG`` bytes of records; returns the count of calls."""
    calls: list[int] = []

    async def fetch(request: Request) -> Result:
        calls.append(request.header.correlation_id)
        partition = {"partition_index": 0, "records": b"x" * BIG}
        return {"responses": [{"topic": "t", "partitions": [partition]}]}

    server.registry.register(FETCH, fetch, min_version=12, max_version=12)
    return calls


async def deaf_peer(server: KafkaServer, requests: int) -> asyncio.StreamWriter:
    """A connection that sends ``requests`` Fetch requests and never reads an answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (HOST, server.port))
    _, writer = await asyncio.open_connection(sock=sock)
    values = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 30,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    for i in range(requests):
        writer.write(encode_request(FETCH, 12, i + 1, values))
    await writer.drain()
    return writer


def draining(server: KafkaServer) -> bool:
    """Whether an answer waits in a connection's socket buffer for its peer to read it."""
    return any(
        conn.writer.transport.get_write_buffer_size() > 0 for conn in server._connections.values()
    )


def test_a_peer_that_reads_nothing_neither_stalls_stop_nor_fills_memory() -> None:
    """Kafka reads a connection's next request only once its answer is sent. Here the reader
    stops once MAX_UNSENT_BYTES wait to be sent; the node's stop aborts the socket after a
    grace (a polite close waited for the peer for ever, and the node never stopped)."""

    async def main() -> None:
        server = KafkaServer(registry(), max_in_flight=100)
        calls = big_answers(server)
        await server.start(HOST, 0)
        writer = await deaf_peer(server, 40)
        try:
            await until(lambda: draining(server) and len(calls) >= 4, "answers the peer leaves")
            await asyncio.sleep(0.2)  # what else the reader would read meanwhile (none)
            assert len(calls) <= 6, len(calls)
            stopping = asyncio.ensure_future(server.stop())
            done, _ = await asyncio.wait([stopping], timeout=3)
            assert stopping in done, "the node's stop waits for a peer that does not read"
        finally:
            writer.transport.abort()
            await server.stop()

    asyncio.run(main())


def test_a_peer_that_stops_reading_is_closed_when_idle() -> None:
    """connections.max.idle.ms counts from the last socket activity: answers the peer has
    not read for that long do not keep the connection (nor its buffers) alive."""

    async def test(server: KafkaServer) -> None:
        big_answers(server)
        writer = await deaf_peer(server, 3)
        try:
            await until(lambda: draining(server), "the writer to wait for the peer")
            await until(lambda: server.connection_count == 0, "the connection to be closed")
        finally:
            writer.transport.abort()

    run(test, idle_ms=300)


def test_large_requests_and_answers_are_decoded_and_encoded_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request of OFF_LOOP_REQUEST_BYTES or more is decoded, and an answer of
    OFF_LOOP_RESPONSE_ENTRIES entries or more built and encoded, on the codec threads, not on
    the event loop's; in request order with the small ones pipelined behind it, and equal to
    what the loop would have made."""
    threads: dict[str, set[str]] = {"decode": set(), "build": set()}
    real_decode, real_build = codec.decode_request, codec.build_response

    def decode(frame: bytes) -> Any:
        threads["decode"].add(threading.current_thread().name)
        return real_decode(frame)

    def build(api_key: int, version: int, values: Any) -> Any:
        threads["build"].add(threading.current_thread().name)
        return real_build(api_key, version, values)

    monkeypatch.setattr(codec, "decode_request", decode)
    monkeypatch.setattr(codec, "build_response", build)
    names = ["0", *(f"topic-{i:05d}" for i in range(1, OFF_LOOP_RESPONSE_ENTRIES + 1000))]

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        big = await c.send(METADATA, 9, {"topics": [{"name": n} for n in names]})
        small = await c.send(METADATA, 9, {"topics": [{"name": "0"}]})
        correlation_id, body = await c.receive(METADATA, 9)
        assert correlation_id == big and [t.name for t in body.topics] == names
        # The small ones on the loop, the big ones on a codec thread: any of them (a decode
        # and a build of one request may run on two of the pool's threads).
        loop_thread = threading.current_thread().name
        for what in ("decode", "build"):
            assert loop_thread in threads[what], what
            off_loop = threads[what] - {loop_thread}
            assert off_loop and all(n.startswith("kafka-codec") for n in off_loop), what
        threads["decode"].clear()
        threads["build"].clear()
        correlation_id, body = await c.receive(METADATA, 9)
        assert correlation_id == small and [t.name for t in body.topics] == ["0"]
        # A small request and its answer stay on the loop.
        assert await c.call(METADATA, 9, {"topics": [{"name": "0"}]})
        assert threads["decode"] == threads["build"] == {threading.current_thread().name}
        # A Produce as any other (200,000 partitions of null records decode in 0.66 s).
        threads["decode"].clear()
        records = b"x" * OFF_LOOP_REQUEST_BYTES
        partition_data = [{"index": 0, "records": records}]
        topic_data = [{"name": "t", "partition_data": partition_data}]
        await c.send(PRODUCE, 9, {"acks": 0, "timeout": 0, "topic_data": topic_data})
        assert (await c.call(API_VERSIONS, 0, {})).error_code == Errors.NONE
        assert any(n.startswith("kafka-codec_") for n in threads["decode"])
        # From LARGE_REQUEST_BYTES on threads of their own: a frame made to cost seconds to
        # decode does not hold the threads other clients' requests are decoded on.
        threads["decode"].clear()
        partition_data[0]["records"] = b"x" * LARGE_REQUEST_BYTES
        await c.send(PRODUCE, 9, {"acks": 0, "timeout": 0, "topic_data": topic_data})
        assert (await c.call(API_VERSIONS, 0, {})).error_code == Errors.NONE
        off_loop = threads["decode"] - {threading.current_thread().name}
        assert off_loop and all(n.startswith("kafka-codec-large_") for n in off_loop)
        await c.close()

    run(test)


def test_a_large_garbage_request_closes_its_connection_only() -> None:
    async def test(server: KafkaServer) -> None:
        header = struct.pack(">hhih", METADATA, 1, 5, -1)
        body = struct.pack(">i", 3) + b"\xff" * OFF_LOOP_REQUEST_BYTES  # names of -1 bytes
        await assert_closed_for(server, struct.pack(">i", len(header + body)) + header + body)

    run(test)


def test_response_weight_counts_lists_at_any_depth_and_bytes_up_to_the_limits() -> None:
    values = {
        "error_code": 0,
        "topics": [{"name": "a", "partitions": [{}, {}, {}]}, {"name": "b", "partitions": []}],
        "brokers": ({"node_id": 1, "host": "h"},),
        "records": b"x" * 100_000,
    }
    assert response_weight(values, 1000) == (2 + 3 + 1, 100_000 + 3)
    assert response_weight({"topics": [{"partitions": [{}] * 50}] * 100}, 120)[0] == 150
    assert response_weight({"throttle_time": 0}, 10) == (0, 0)
    # OffsetFetch v8+: groups, their topics, their partitions. One group of many partitions
    # counted 2, and its answer was built and encoded on the loop.
    fetch = {"groups": [{"group_id": "g", "topics": [{"name": "t", "partitions": [{}] * 9000}]}]}
    assert response_weight(fetch, 4096)[0] >= 4096
    assert response_weight(fetch, 100_000) == (1 + 1 + 9000, 2)
    # Counting stops at the byte limit too: a list of 1,000 large values is not walked to its end.
    assert response_weight({"groups": [{"m": b"x" * 1000}] * 1000}, 10**9, 5000)[1] == 5000


def test_an_answer_over_the_request_size_limit_fails_that_request_alone() -> None:
    """A DescribeGroups of a few bytes naming one group of 300 KB of member metadata many times
    was answered in full: thousands of names made gigabytes, twice in memory while encoded,
    and the node ran out of memory. Over ``socket.request.max.bytes`` it is answered as a
    failed request; the connection goes on."""

    async def test(server: KafkaServer) -> None:
        c = await connect(server)
        small = await c.call(DESCRIBE_GROUPS, 5, {"groups": ["g", "g", "g"]})
        assert [g.error_code for g in small.groups] == [Errors.NONE] * 3
        assert len(small.groups[0].members[0].member_metadata) == 300_000
        for copies in (20, 5):  # 6 MB, encoded off the loop; 1.5 MB, below that threshold
            large = await c.call(DESCRIBE_GROUPS, 5, {"groups": ["g"] * copies})
            assert [g.error_code for g in large.groups] == [Errors.UNKNOWN_SERVER_ERROR] * copies
            assert all(not g.members for g in large.groups)
        response = await c.call(API_VERSIONS, 0, {})
        assert response.error_code == Errors.NONE
        await c.close()

    run(test, max_request_bytes=MIB)


def test_client_addresses_are_named_as_the_per_ip_overrides_name_them() -> None:
    assert server_module._client_address("::ffff:127.0.0.2") == "127.0.0.2"
    assert server_module._client_address("fe80::1%eth0") == "fe80::1"
    assert server_module._client_address("127.0.0.1") == "127.0.0.1"
