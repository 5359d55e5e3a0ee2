"""The broker side of registration (node/broker_lifecycle.py), against a scripted controller."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

import pytest

from kcoord.errors import Errors
from kcoord.node.broker_lifecycle import BrokerLifecycle
from kcoord.node.config import Endpoint
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_fetcher import ReplicaFetcherManager
from kcoord.node.rpc import RpcClientPool, RpcServer
from kcoord.raft import records as rec


class _Scripted(BrokerLifecycle):
    """Answers the controller calls from a script and notes what was sent."""

    def __init__(self, answers: list[dict[str, Any]], **kw: Any) -> None:
        cache = type("Cache", (), {"image": type("Image", (), {"cluster_id": "c"})(), "offset": 0})
        super().__init__(
            1, "inc", {}, cast(Any, None), cast(Any, cache()), cast(Any, None), cast(Any, None),
            lambda: 0, **kw,
        )  # fmt: skip
        self.answers = answers
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def call_controller(self, method: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.sent.append((method, payload))
        return self.answers.pop(0)


def test_storage_lost_is_said_until_a_registration_is_accepted_then_never_again() -> None:
    registered: list[bool] = []
    heartbeat = {"error": 0, "is_fenced": False, "is_caught_up": True}
    lifecycle = _Scripted(
        [
            {"error": int(Errors.DUPLICATE_BROKER_REGISTRATION)},  # the old session lives on
            {"error": 0, "broker_epoch": 7},
            {"error": int(Errors.STALE_BROKER_EPOCH)},  # a heartbeat: register again
            {"error": 0, "broker_epoch": 9},
            heartbeat,
        ],
        storage_lost=True,
        on_storage_loss_registered=lambda: registered.append(True),
    )

    async def steps() -> None:
        for _ in range(3):  # refused; accepted, heartbeat refused; accepted, heartbeat
            await lifecycle._step()

    asyncio.run(steps())
    registrations = [p["storage_lost"] for m, p in lifecycle.sent if m == "BrokerRegistration"]
    assert registrations == [True, True, False]
    assert registered == [True]
    assert lifecycle.broker_epoch == 9


def test_heartbeats_ask_to_stay_fenced_until_the_node_is_ready_and_then_go_at_once() -> None:
    """Kafka's wantFence = !readyToUnfence: the heartbeat that says the broker has caught up
    also unfenced it, and it could be elected a leader before it had published the metadata
    image (hosted nothing). Once ready, the next heartbeat goes without waiting its period."""
    caught_up = {"error": 0, "is_fenced": True, "is_caught_up": True}
    lifecycle = _Scripted(
        [{"error": 0, "broker_epoch": 7}, caught_up, {**caught_up, "is_fenced": False}],
        ready_to_unfence=False,
        heartbeat_interval_ms=3_600_000,
    )

    async def scenario() -> None:
        task = asyncio.create_task(lifecycle.run())
        await asyncio.wait_for(lifecycle.initial_catch_up.wait(), 5)
        lifecycle.set_ready_to_unfence()
        while len(lifecycle.sent) < 3:
            await asyncio.sleep(0)  # one loop iteration: the heartbeat period is an hour
        task.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 5))
    beats = [p["want_fence"] for m, p in lifecycle.sent if m == "BrokerHeartbeat"]
    assert beats == [True, False]
    assert not lifecycle.is_fenced


def test_no_heartbeat_goes_after_a_controlled_shutdown_is_granted() -> None:
    """Kafka's ``beginShutdown``: heartbeats stop at the grant. Heartbeating on through the
    resignation and the stop, the node had its restart refused as a duplicate registration
    for a session timeout after it exited (the controller counts from the last heartbeat)."""
    granted = {"error": 0, "is_fenced": True, "is_caught_up": True, "should_shut_down": True}
    lifecycle = _Scripted([{"error": 0, "broker_epoch": 7}, granted], heartbeat_interval_ms=0)

    async def scenario() -> None:
        await asyncio.wait_for(lifecycle.run(), 5)  # returns: nothing more to send

    asyncio.run(scenario())
    assert lifecycle.shut_down_granted.is_set()
    assert [m for m, _ in lifecycle.sent] == ["BrokerRegistration", "BrokerHeartbeat"]


def test_a_controller_and_a_leader_advertised_on_ipv6_are_dialled() -> None:
    """A broker's RPC endpoint registered as ``[::1]:port`` (an IPv6 listener): split at its
    last colon, the registration's and the replica fetcher's dialler looked up the host
    ``[::1]``, which never resolves, so no node but the controller could register and no
    follower could fetch (found by a review)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this host has no IPv6 loopback")

    async def scenario() -> None:
        async def ping(payload: Any) -> dict[str, Any]:
            return {"pong": payload}

        server = RpcServer({"AlterPartition": ping, "Ping": ping})
        await server.start("::1", 0)
        pool = RpcClientPool()
        try:
            cache = MetadataCache(2, listener=cast(Any, None))
            endpoints = {"rpc": str(Endpoint("::1", server.port))}
            cache.apply(1, [rec.RegisterBroker(1, "i1", 1, endpoints, None, False)])
            quorum = type("Quorum", (), {"status": lambda self: type("S", (), {"leader_id": 1})})
            lifecycle = BrokerLifecycle(
                2, "inc", {}, cast(Any, quorum()), cache, cast(Any, None), pool, lambda: 0,
            )  # fmt: skip
            pong = await lifecycle.alter_partition({"n": 1})
            assert pong == {"pong": {"n": 1, "timeout_ms": 2000}}  # the caller's wait named
            fetchers = ReplicaFetcherManager(2, cast(Any, None), cache, pool, lambda: 0)
            client = fetchers._client(1)
            assert client is not None
            assert await client.call("Ping", {"n": 2}, 5.0) == {"pong": {"n": 2}}
        finally:
            await pool.close_all()
            await server.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))
