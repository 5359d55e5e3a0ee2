"""node/admin.py's HTTP layer with a stub service: the bearer token, JSON errors for bad input,
a failing handler that leaves the server up, readiness, the metrics switch; and the consumer
assignment parser."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import ClientSession

from kcoord.node import admin as admin_module
from kcoord.node.admin import AdminServer, AdminService, ApiError, parse_consumer_assignment
from kcoord.node.metrics import NodeMetrics

TOKEN = "s3cret"


class StubService:
    def __init__(self) -> None:
        self.node = SimpleNamespace(
            config=SimpleNamespace(node_id=7, admin_api_token=None, metrics_enable=True)
        )
        self.reasons: list[str] = []
        self.refreshed = 0

    def readiness(self) -> list[str]:
        return self.reasons

    async def cluster(self) -> dict[str, Any]:
        return {"cluster_id": "c"}

    def brokers(self) -> dict[str, Any]:
        return {"node_id": 7, "brokers": []}

    def topics(self) -> list[dict[str, Any]]:
        return [{"name": "t"}]

    async def topic(self, name: str) -> dict[str, Any]:
        raise ApiError(404, f"unknown topic {name!r}")

    async def list_groups(self, state: str | None) -> dict[str, Any]:
        return {"groups": [], "state": state}

    async def group(self, group_id: str) -> dict[str, Any]:
        raise RuntimeError("a bug")

    def rebalances(self, limit: int) -> dict[str, Any]:
        return {"node_id": 7, "limit": limit}

    async def remote_end_offsets(self, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.refreshed += 1
        return {}


class StubMetrics:
    async def scrape(
        self,
        fetch_end_offsets: Callable[[set[tuple[str, int]]], Awaitable[dict[tuple[str, int], int]]],
    ) -> bytes:
        await fetch_end_offsets({("t", 0)})
        return b"kcoord_up 1\n"


def serve(
    scenario: Callable[[ClientSession, str, StubService], Awaitable[None]],
    *,
    token: str | None = None,
    metrics_enabled: bool = True,
    metrics: object | None = None,
) -> None:
    async def run() -> None:
        service = StubService()
        server = AdminServer(
            cast("AdminService", service),
            cast("NodeMetrics", metrics or StubMetrics()),
            token=token,
            metrics_enabled=metrics_enabled,
        )
        await server.start("127.0.0.1", 0)
        try:
            async with ClientSession() as session:
                await scenario(session, f"http://127.0.0.1:{server.port}", service)
        finally:
            await server.stop()

    asyncio.run(run())


async def get(
    session: ClientSession, url: str, token: str | None = None, method: str = "GET"
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with session.request(method, url, headers=headers) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def raw_status(base: str, path: str, authorization: bytes) -> int:
    """The status of a GET whose Authorization header is these bytes (a client's encoder
    would make them UTF-8)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: " + authorization + b"\r\n\r\n"
    )
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return int(status_line.split()[1])


def test_the_token_guards_everything_but_the_probes() -> None:
    """A header byte that is not UTF-8 got a 500 (and a traceback in the node's log)."""

    async def scenario(session: ClientSession, base: str, service: StubService) -> None:
        for path in (
            "/api/v1/cluster",
            "/api/v1/brokers",
            "/api/v1/topics",
            "/api/v1/groups",
            "/metrics",
        ):
            status, body = await get(session, base + path)
            assert status == 401, path
            assert "token" in body["error"]["message"]
            assert (await get(session, base + path, "wrong"))[0] == 401
            assert await raw_status(base, path, b"Bearer " + TOKEN.encode() + b"\xff") == 401
            assert (await get(session, base + path, TOKEN))[0] == 200
        assert (await get(session, base + "/healthz"))[0] == 200
        assert (await get(session, base + "/readyz"))[0] == 200

    serve(scenario, token=TOKEN)


def test_errors_are_json_and_the_server_stays_up() -> None:
    async def scenario(session: ClientSession, base: str, service: StubService) -> None:
        status, body = await get(session, base + "/api/v1/nowhere")
        assert (status, body["error"]["status"]) == (404, 404)
        status, body = await get(session, base + "/api/v1/topics", method="POST")
        assert status == 405 and body["error"]["status"] == 405
        async with session.post(base + "/healthz") as response:  # RFC 9110: 405 says Allow
            assert response.status == 405 and "GET" in response.headers["Allow"]
        status, body = await get(session, base + "/api/v1/topics/missing")
        assert status == 404 and "missing" in body["error"]["message"]
        status, body = await get(session, base + "/api/v1/groups?colour=red")
        assert status == 400 and "colour" in body["error"]["message"]
        status, body = await get(session, base + "/api/v1/groups/g")
        assert status == 500 and body["error"]["status"] == 500
        status, body = await get(session, base + "/api/v1/groups?state=Stable")
        assert (status, body["state"]) == (200, "Stable")
        status, body = await get(session, base + "/api/v1/groups/a/b")  # slashes in group ids
        assert status == 500  # reached the (failing) group handler, not a 404
        status, body = await get(session, base + "/api/v1/groups/a%0Ab")  # and a newline
        assert status == 500

    serve(scenario)


def test_readiness_and_metrics() -> None:
    async def scenario(session: ClientSession, base: str, service: StubService) -> None:
        service.reasons = ["fenced"]
        status, body = await get(session, base + "/readyz")
        assert (status, body["ready"], body["reasons"]) == (503, False, ["fenced"])
        status, text = await get(session, base + "/metrics")
        assert (status, text) == (200, "kcoord_up 1\n")
        assert service.refreshed == 1
        # The text format the exposition writes (names unescaped), not the client library's
        # latest (1.0.0), which Prometheus would read with other rules.
        async with session.get(base + "/metrics") as response:
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"

    serve(scenario)

    async def disabled(session: ClientSession, base: str, service: StubService) -> None:
        status, body = await get(session, base + "/metrics")
        assert status == 404 and "metrics.enable" in body["error"]["message"]

    serve(disabled, metrics_enabled=False)


def _assignment(topics: list[tuple[str, list[int]]], user_data: bytes | None = None) -> bytes:
    out = struct.pack(">hi", 1, len(topics))
    for topic, partitions in topics:
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name
        out += struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
    out += struct.pack(">i", -1) if user_data is None else struct.pack(">i", len(user_data))
    return out + (user_data or b"")


def test_parse_consumer_assignment() -> None:
    data = _assignment([("orders", [0, 2]), ("clicks", [5])], b"ud")
    assert parse_consumer_assignment(data) == [("orders", [0, 2]), ("clicks", [5])]
    assert parse_consumer_assignment(b"") == []
    assert parse_consumer_assignment(data[:9]) is None
    assert parse_consumer_assignment(b"\xff\xff\x00\x00\x00\x00") is None


def test_a_group_lag_counts_the_partitions_whose_lag_is_unknown() -> None:
    """The total sums the known lags; a partition owned but never committed, or whose leader
    did not answer, is counted apart (a partial sum read as whole hid its lag)."""
    service = AdminService.__new__(AdminService)

    async def partition_offsets(rows: dict[tuple[str, int], Any]) -> dict[Any, Any]:
        return {("t", 0): {"high_watermark": 30}, ("t", 1): {"high_watermark": 9}}

    cast(Any, service).partition_offsets = partition_offsets
    committed = [
        {"topic": "t", "partition": p, "committed_offset": o, "leader_epoch": -1, "metadata": ""}
        for p, o in [(0, 10), (2, 4)]  # partition 2's leader does not answer
    ]
    member = {
        "member_id": "m",
        "client_id": "c",
        "client_host": "/h",
        "assignment": [{"topic": "t", "partitions": [0, 1]}],  # 1: owned, never committed
    }
    described = asyncio.run(service._with_lag({"members": [member], "offsets": committed}))
    assert [(r["partition"], r["lag"]) for r in described["offsets"]] == [
        (0, 20),
        (1, None),
        (2, None),
    ]
    assert (described["lag"], described["lag_unknown_partitions"]) == (20, 2)


def test_rebalances_take_a_bounded_limit() -> None:
    async def scenario(session: ClientSession, base: str, service: StubService) -> None:
        assert await get(session, base + "/api/v1/rebalances") == (
            200,
            {"node_id": 7, "limit": 100},
        )
        assert (await get(session, base + "/api/v1/rebalances?limit=10000"))[1]["limit"] == 10000
        for bad in ("0", "10001", "-1", "x", "1.5", "\u0663", "9" * 5000):
            status, body = await get(session, base + f"/api/v1/rebalances?limit={bad}")
            assert status == 400 and "limit must be 1 to 10000" in body["error"]["message"], bad
        status, body = await get(session, base + "/api/v1/rebalances?group=g")
        assert status == 400 and "known: limit" in body["error"]["message"]

    serve(scenario)


async def _closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the server closed the connection instead of serving it: a kept-alive
    /healthz gets its status line on a served one, the end of the stream on a refused one."""
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
    except ConnectionError:
        return True
    try:
        line = await reader.readline()
    except ConnectionError:
        return True
    if not line:
        return True
    assert line.startswith(b"HTTP/1.1 200"), line
    return False


class HugeMetrics:
    async def scrape(self, fetch_end_offsets: Any) -> bytes:
        return b"# " + b"x" * (16 << 20) + b"\n"


def test_a_client_that_does_not_read_its_answer_does_not_hold_the_stop() -> None:
    """aiohttp waits up to 60 s (twice) for the answers being sent: a scrape of a large
    /metrics nobody read held the node's stop past the launcher's SIGKILL, and the node
    stopped without its clean-shutdown marker. (review helper-208)"""

    async def run() -> None:
        server = AdminServer(
            cast("AdminService", StubService()),
            cast("NodeMetrics", HugeMetrics()),
            token=None,
            metrics_enabled=True,
        )
        await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readline()  # the answer has started; the rest is never read
        await asyncio.wait_for(server.stop(), 15)
        writer.close()

    asyncio.run(run())


def test_connections_past_the_admin_cap_are_closed_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The admin listener had no cap: connections that sent nothing were held for aiohttp's
    hour of keep-alive, each a descriptor the data directory needs. (review helper-208)"""
    monkeypatch.setattr(admin_module, "MAX_ADMIN_CONNECTIONS", 2)

    async def scenario(session: ClientSession, base: str, service: StubService) -> None:
        host, port = base.removeprefix("http://").split(":")
        # A burst: opened at once, before the server has counted any (aiohttp lists one a
        # loop pass after it is made, and a check of its list let all of them through).
        burst = await asyncio.gather(*(asyncio.open_connection(host, int(port)) for _ in range(8)))
        closed = [await asyncio.wait_for(_closed(r, w), 5) for r, w in burst]
        assert closed.count(True) == 6  # two served, six closed at once
        held = [c for c, shut in zip(burst, closed, strict=True) if not shut]
        for _reader, shut_writer in (c for c, shut in zip(burst, closed, strict=True) if shut):
            shut_writer.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        _, first = held.pop()
        first.close()
        while True:  # the server lets the closed one go, then serves a new one
            try:
                if await raw_status(base, "/healthz", b"none") == 200:
                    break
            except (IndexError, ConnectionError):
                pass  # refused: still at the cap
            assert loop.time() < deadline, "no connection served after one closed"
            await asyncio.sleep(0.01)  # polling interval
        for _, other in held:
            other.close()

    serve(scenario)


def test_a_request_that_is_not_http_gets_400_and_no_error_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A header line past aiohttp's 8190 bytes: answered 400, as before, but it was logged at
    ERROR with a traceback, before the token check: any client could fill the node's log."""

    async def scenario(session: ClientSession, base: str, service: StubService) -> None:
        assert await raw_status(base, "/healthz", b"Bearer " + b"x" * 9000) == 400
        assert (await get(session, base + "/healthz"))[0] == 200

    serve(scenario, token=TOKEN)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_answers_that_grow_with_the_cluster_give_the_event_loop_turns_while_encoded() -> None:
    """A group's every committed offset, every group, every topic: json.dumps of 100,000
    offsets held the loop, and the node's heartbeats, half a second; on a worker thread too,
    as json's encoder keeps the interpreter lock (found by a review). The lists are encoded
    a slice at a time, the loop free between two, into the same JSON."""

    async def scenario() -> None:
        rows = [{"topic": "t", "partition": p, "committed_offset": p * 7} for p in range(2_100)]
        data = {"group_id": "g", "offsets": rows, "members": [], "state": "Empty"}
        turns = 0
        encoding = True

        async def other_work() -> None:
            nonlocal turns
            while encoding:
                turns += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(other_work())
        await asyncio.sleep(0)
        turns = 0
        response = await admin_module._large_json(data)
        encoding = False
        await ticker
        assert response.content_type == "application/json"
        assert isinstance(response.body, bytes)
        assert json.loads(response.body) == data
        assert turns >= 2_100 // admin_module.JSON_SLICE_ROWS

    asyncio.run(scenario())
