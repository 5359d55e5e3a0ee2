"""When the active controller creates ``__consumer_offsets`` (``ControllerService.tick``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import pytest

from kcoord.cluster.coordinator.records import uuid_str
from kcoord.errors import Errors
from kcoord.node import controller_service, server
from kcoord.node.controller_service import OFFSETS_TOPIC_GRACE_MS, ControllerService
from kcoord.node.metadata import MetadataCache
from kcoord.node.rpc import (
    RpcClient,
    RpcError,
    RpcServer,
    encode_frame,
    read_frame,
    with_deadline,
)
from kcoord.raft import records as rec
from kcoord.raft.controller import (
    CLUSTER_CONFIGS,
    MIN_INSYNC_REPLICAS_CONFIG,
    OFFSETS_TOPIC_NAME,
    Controller,
    ControllerConfig,
)
from kcoord.raft.quorum import MetadataQuorum
from tests.unit.node.kafka.harness import NODE_ID, FakeQuorum, until

UNCLEAN = "unclean.leader.election.enable"


def register(quorum: FakeQuorum, *broker_ids: int) -> None:
    """Registered unfenced; broker ``b``'s epoch is the offset of its registration."""
    for b in broker_ids:
        quorum.commit(
            [
                rec.RegisterBroker(
                    broker_id=b,
                    incarnation_id=f"inc-{b}",
                    broker_epoch=quorum.offset + 1,
                    endpoints={"kafka": f"127.0.0.{b}:9092", "rpc": f"127.0.0.{b}:9093"},
                    rack=None,
                    fenced=False,
                )
            ]
        )


def five_node_controller() -> tuple[ControllerService, FakeQuorum, MetadataCache, list[int]]:
    clock = [1_000_000]
    cache = MetadataCache(NODE_ID, cast(Any, None))
    quorum = FakeQuorum(cache)
    service = ControllerService(
        NODE_ID,
        cast(MetadataQuorum, quorum),
        cache,
        ControllerConfig(offsets_topic_num_partitions=50),
        lambda: clock[0],
        cluster_id="c",
        expected_brokers=5,
    )
    quorum.commit([rec.ClusterId("c")])
    return service, quorum, cache, clock


async def heartbeats(service: ControllerService, cache: MetadataCache) -> None:
    for b in cache.image.brokers.values():
        reply = await service.handle_broker_heartbeat(
            {"broker_id": b.broker_id, "broker_epoch": b.broker_epoch, "current_metadata_offset": 0}
        )
        assert reply["error"] == 0, reply


def leaders(cache: MetadataCache) -> Counter[int]:
    topic = cache.image.topic_by_name(OFFSETS_TOPIC_NAME)
    assert topic is not None
    return Counter(p.leader for p in cache.image.partitions_of(topic.topic_id))


def test_the_offsets_topic_waits_for_every_expected_broker() -> None:
    """Created as soon as three of five brokers were up, it left the two that started a
    moment later without a single offsets partition: they coordinated no group, ever."""

    async def scenario() -> None:
        service, quorum, cache, clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        assert service.is_active
        await service.tick()
        assert cache.image.topic_by_name(OFFSETS_TOPIC_NAME) is None
        clock[0] += 1_000
        register(quorum, 4, 5)
        await service.tick()
        assert leaders(cache) == dict.fromkeys((1, 2, 3, 4, 5), 10)

    asyncio.run(scenario())


def test_the_active_controller_pins_the_cluster_level_min_isr_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Written by the first tick of the first controller, before ``__consumer_offsets``, so a
    node whose image has that topic has it too; a later controller with another value in its
    own config keeps it and says so."""

    async def scenario() -> None:
        service, quorum, cache, _ = five_node_controller()
        register(quorum, 1, 2, 3, 4, 5)
        await service._maybe_activate()
        await service.tick()
        assert cache.image.resource_configs(CLUSTER_CONFIGS) == {MIN_INSYNC_REPLICAS_CONFIG: "1"}
        assert cache.image.topic_by_name(OFFSETS_TOPIC_NAME) is not None
        offset = quorum.offset
        other = ControllerService(
            2,
            cast(MetadataQuorum, quorum),
            cache,
            ControllerConfig(min_insync_replicas=2),
            lambda: 1_000_000,
            cluster_id="c",
        )
        await other._maybe_activate()
        await other.tick()
        assert cache.image.resource_configs(CLUSTER_CONFIGS) == {MIN_INSYNC_REPLICAS_CONFIG: "1"}
        assert quorum.offset == offset + 1  # its activation's NoOp only
        assert "2 in this node's config but 1 at the cluster level" in caplog.text

    asyncio.run(scenario())


def test_a_refused_offsets_topic_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A user topic whose name collides with ``__consumer_offsets`` (``__consumer.offsets``,
    created before it) refuses its creation at every tick: no group can be coordinated, and
    nothing said why (found by a review). It is logged once, not at every tick."""

    async def scenario() -> None:
        service, quorum, cache, clock = five_node_controller()
        register(quorum, 1, 2, 3, 4, 5)
        await service._maybe_activate()
        controller = service.controller
        assert controller is not None
        taken = controller.create_topic(
            cache.image,
            "__consumer.offsets",
            "T1-aaaaaaaaaaaaaaaaaaa",
            num_partitions=1,
            replication_factor=1,
        )
        quorum.commit(list(taken.records))
        for _ in range(3):
            await service.tick()
            clock[0] += 1_000
        assert cache.image.topic_by_name(OFFSETS_TOPIC_NAME) is None
        refused = [r for r in caplog.records if "cannot create __consumer_offsets" in r.message]
        assert len(refused) == 1 and "INVALID_TOPIC_EXCEPTION" in refused[0].message

    asyncio.run(scenario())


class _ParkedQuorum(FakeQuorum):
    """Commits a proposal only when the test says so."""

    def __init__(self, cache: MetadataCache) -> None:
        super().__init__(cache)
        self.parked: list[Callable[[], None]] = []

    def propose(
        self,
        records: Sequence[rec.MetadataRecord],
        on_done: Callable[[int | None, str | None], None],
        *,
        epoch: int,
    ) -> None:
        self.parked.append(lambda: FakeQuorum.propose(self, records, on_done, epoch=epoch))


def test_a_controller_call_whose_connection_drops_runs_on_and_keeps_the_controller() -> None:
    """A peer forwards a CreateTopics and its connection drops while the batch commits (a
    broker SIGKILLed). The server cancelled the handler, which set the active controller
    aside: every broker's heartbeat got NOT_CONTROLLER until it came back, though the topic
    was created (found by a review). Kafka's QuorumController never abandons an event for a
    dropped connection; the handler now runs on."""

    async def scenario() -> None:
        cache = MetadataCache(NODE_ID, cast(Any, None))
        quorum = _ParkedQuorum(cache)
        service = ControllerService(
            NODE_ID, cast(MetadataQuorum, quorum), cache, ControllerConfig(), lambda: 10**6,
            cluster_id="c",
        )  # fmt: skip
        quorum.commit([rec.ClusterId("c")])
        register(quorum, 2)
        activating = asyncio.create_task(service._maybe_activate())
        await until(lambda: bool(quorum.parked), "the activation's NoOp")
        quorum.parked.pop()()
        await activating
        assert service.is_active
        rpc = RpcServer(server.controller_rpc_handlers(service))
        await rpc.start("127.0.0.1", 0)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", rpc.port)
            topic = {"name": "t", "num_partitions": 1, "replication_factor": 1}
            writer.write(encode_frame([1, "CreateTopics", {"topics": [topic]}]))
            await writer.drain()
            await until(lambda: bool(quorum.parked), "the CreateTopics' batch")
            writer.close()
            await until(lambda: rpc.connection_count == 0, "the connection's end")
            quorum.parked.pop()()
            await until(lambda: cache.image.topic_by_name("t") is not None, "the topic")
            assert service.is_active
            client = RpcClient("127.0.0.1", rpc.port)
            try:
                broker = cache.image.broker(2)
                assert broker is not None
                beat = {"broker_id": 2, "broker_epoch": broker.broker_epoch,
                        "current_metadata_offset": quorum.offset}  # fmt: skip
                answer = await client.call("BrokerHeartbeat", beat, 5.0)
                assert answer["error"] == 0, answer
            finally:
                await client.close()
        finally:
            await rpc.stop()

    asyncio.run(scenario())


def test_a_controller_call_whose_caller_went_before_it_began_decides_nothing() -> None:
    """Run to its end when its caller goes, a heartbeat queued behind a long decision was
    decided whenever the lock freed, for a broker that may be dead by then: it renewed its
    session, or unfenced it (found by a review). Kafka's controller drops an event whose
    requester's deadline passed before it began; so is one whose caller has gone here."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        quorum.commit(
            [rec.RegisterBroker(9, "i9", quorum.offset + 1, {}, None, True)]  # fenced
        )
        await service._maybe_activate()
        rpc = RpcServer(server.controller_rpc_handlers(service))
        await rpc.start("127.0.0.1", 0)
        try:
            await service._lock.acquire()  # a long decision under way
            _, writer = await asyncio.open_connection("127.0.0.1", rpc.port)
            broker = cache.image.broker(9)
            assert broker is not None and broker.fenced
            beat = {"broker_id": 9, "broker_epoch": broker.broker_epoch,
                    "current_metadata_offset": quorum.offset}  # fmt: skip
            writer.write(encode_frame([1, "BrokerHeartbeat", beat]))
            await writer.drain()
            await until(lambda: bool(service._lock._waiters), "the heartbeat at the lock")
            writer.close()
            await until(lambda: rpc.connection_count == 0, "the connection's end")
            service._lock.release()
            async with service._lock:  # after the heartbeat's turn (the lock is FIFO)
                pass
            broker = cache.image.broker(9)
            assert broker is not None and broker.fenced
        finally:
            await rpc.stop()

    asyncio.run(scenario())


def test_a_remote_controller_call_past_its_callers_wait_decides_nothing() -> None:
    """A broker's registration reaches the controller by RPC and waits behind a long
    decision; its caller gives up (its RPC timed out) but its connection stays up, so the
    server never knew: decided later, it registered a broker that had stopped waiting. The
    payload now names the caller's wait (``with_deadline``), as Kafka gives a forwarded
    request its timeout as a deadline, and past it the call decides nothing."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        rpc = RpcServer(server.controller_rpc_handlers(service))
        await rpc.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        try:
            await service._lock.acquire()  # a long decision under way
            reader, writer = await asyncio.open_connection("127.0.0.1", rpc.port)
            registration = {"broker_id": 9, "incarnation_id": "i9",
                            "endpoints": {"rpc": "127.0.0.9:9093"}}  # fmt: skip
            writer.write(encode_frame([1, "BrokerRegistration", with_deadline(registration, 0.02)]))
            await writer.drain()
            await until(lambda: bool(service._lock._waiters), "the registration at the lock")
            waiting_since = loop.time()
            await until(lambda: loop.time() > waiting_since + 0.05, "the caller's wait over")
            service._lock.release()
            _, ok, error = await read_frame(reader, 1 << 20)
            assert not ok and error["code"] == Errors.REQUEST_TIMED_OUT, error
            assert cache.image.broker(9) is None
            writer.close()
        finally:
            await rpc.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("waited_ms", [250, 251])
def test_a_heartbeat_that_waited_past_its_deadline_decides_nothing(waited_ms: int) -> None:
    """A fenced broker's heartbeat asking to be unfenced waits behind a long decision while
    its broker is paused or cut off, its connection up (its caller has not gone): decided
    when the lock freed, it unfenced a broker nobody reached, and elections made it a leader
    until its session expired. Kafka's ControllerApis gives a heartbeat a deadline of half
    the heartbeat interval from its arrival; past it, REQUEST_TIMED_OUT and nothing done."""

    async def scenario() -> None:
        service, quorum, cache, clock = five_node_controller()
        register(quorum, 1, 2, 3)
        quorum.commit(
            [rec.RegisterBroker(9, "i9", quorum.offset + 1, {}, None, True)]  # fenced
        )
        await service._maybe_activate()
        await service._lock.acquire()  # a long decision under way
        broker = cache.image.broker(9)
        assert broker is not None and broker.fenced
        beat = service.handle_broker_heartbeat(
            {
                "broker_id": 9,
                "broker_epoch": broker.broker_epoch,
                "current_metadata_offset": quorum.offset,
            }
        )
        heartbeat = asyncio.ensure_future(beat)
        await until(lambda: bool(service._lock._waiters), "the heartbeat at the lock")
        clock[0] += waited_ms
        service._lock.release()
        if waited_ms > 250:  # half the default heartbeat interval
            with pytest.raises(RpcError) as refused:
                await heartbeat
            assert refused.value.code == Errors.REQUEST_TIMED_OUT
        else:
            assert not (await heartbeat)["is_fenced"]
        broker = cache.image.broker(9)
        assert broker is not None and broker.fenced is (waited_ms > 250)

    asyncio.run(scenario())


def test_the_offsets_topic_is_created_on_fewer_brokers_after_the_grace() -> None:
    async def scenario() -> None:
        service, quorum, cache, clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        clock[0] += OFFSETS_TOPIC_GRACE_MS - 1
        await heartbeats(service, cache)
        await service.tick()
        assert cache.image.topic_by_name(OFFSETS_TOPIC_NAME) is None
        clock[0] += 1
        await service.tick()
        assert set(leaders(cache)) == {1, 2, 3}

    asyncio.run(scenario())


def test_steady_heartbeats_are_answered_while_a_decision_holds_the_controller() -> None:
    """A CreateTopics of 2000 partitions held the controller until this node had created
    their logs, 12 s on a loaded machine; the brokers' heartbeats waited behind it, no broker
    sent another, and the controller then fenced every one of them. A heartbeat that writes
    nothing is answered at once; one that may write (here a shutdown) still waits its turn."""

    async def scenario() -> None:
        service, quorum, cache, clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        controller = service.controller
        assert controller is not None
        session_ms = controller.config.broker_session_timeout_ms
        await heartbeats(service, cache)
        async with service._lock:  # a decision waiting for its batch to be applied
            for _ in range(4):
                clock[0] += session_ms // 2
                await asyncio.wait_for(heartbeats(service, cache), 10)
            shutdown = asyncio.ensure_future(
                service.handle_broker_heartbeat(
                    {
                        "broker_id": 3,
                        "broker_epoch": cache.image.brokers[3].broker_epoch,
                        "current_metadata_offset": cache.image.last_offset,
                        "want_shut_down": True,
                    }
                )
            )
            for _ in range(10):
                await asyncio.sleep(0)
            assert not shutdown.done()
        assert (await asyncio.wait_for(shutdown, 10))["is_fenced"]
        await service.tick()
        assert [b for b in (1, 2) if cache.image.brokers[b].fenced] == []

    asyncio.run(scenario())


def test_a_timed_out_proposal_stops_decisions_until_the_log_catches_up() -> None:
    """A batch whose commit timed out may still commit. The controller decided the next
    request on an image without it (a broker re-registered with a new incarnation, then an
    ISR change made for its old one put that in the ISR). Now it decides nothing until a batch
    of its own proposed after the lost one has committed and been applied."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        assert service.is_active
        service.propose_timeout_s = 0.01
        held: list[tuple[list[rec.MetadataRecord], Any]] = []
        real_propose = quorum.propose

        def hold(records: Any, on_done: Any, *, epoch: int) -> None:
            held.append((list(records), on_done))  # committed late, after the timeout

        quorum.propose = hold  # type: ignore[method-assign]
        with pytest.raises(RpcError):  # NOT_CONTROLLER: the broker retries
            await service.handle_broker_heartbeat(
                {
                    "broker_id": 2,
                    "broker_epoch": cache.image.brokers[2].broker_epoch,
                    "current_metadata_offset": 0,
                    "want_shut_down": True,
                }
            )
        assert held
        assert not service.is_active
        quorum.propose = real_propose
        for records, on_done in held:  # the lost batch commits after all
            on_done(quorum.commit(records), None)
        await service._maybe_activate()
        assert service.is_active and service.activations == 2
        assert cache.image.last_offset == quorum.offset

    asyncio.run(scenario())


def test_an_abandoned_proposal_stops_decisions_until_the_log_catches_up() -> None:
    """The review's race: broker 3's controlled-shutdown heartbeat proposed its fence, then its
    connection closed and the handler was cancelled, freeing the decision lock while the batch
    was in flight. An AlterPartition adding 3 to an ISR was decided on the image without the
    fence and both committed. A cancelled proposal now stops decisions as a timed-out one."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        assert service.is_active
        held: list[tuple[list[rec.MetadataRecord], Any]] = []
        real_propose = quorum.propose

        def hold(records: Any, on_done: Any, *, epoch: int) -> None:
            held.append((list(records), on_done))

        quorum.propose = hold  # type: ignore[method-assign]
        heartbeat = asyncio.ensure_future(
            service.handle_broker_heartbeat(
                {
                    "broker_id": 3,
                    "broker_epoch": cache.image.brokers[3].broker_epoch,
                    "current_metadata_offset": 0,
                    "want_shut_down": True,
                }
            )
        )
        while not held:
            await asyncio.sleep(0)
        heartbeat.cancel()  # the broker's connection closed
        with pytest.raises(asyncio.CancelledError):
            await heartbeat
        assert not service.is_active, "decisions went on without the batch in flight"
        quorum.propose = real_propose
        for records, on_done in held:  # the abandoned batch commits after all
            on_done(quorum.commit(records), None)
        await service._maybe_activate()
        assert service.is_active and service.activations == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "change",
    [
        {"broker_id": 1 << 40},
        {"endpoints": {"rpc": "nowhere"}},
        {"endpoints": {"kafka": "[::1]"}},
        {"rack": 7},
    ],
    ids=["id-beyond-int32", "endpoint-without-port", "ipv6-without-port", "rack-not-text"],
)
def test_a_registration_the_cluster_could_not_use_is_refused(change: dict[str, Any]) -> None:
    """A broker id beyond int32, an endpoint that is no host and port, or a rack that is not
    text: registered (the RPC port takes anything a peer sends), it stayed in the metadata
    log, and every Metadata answer listing the broker failed to encode (found by a review)."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        offset = quorum.offset
        payload = {"broker_id": 9, "incarnation_id": "i9", "endpoints": {}, **change}
        reply = await service.handle_broker_registration(payload)
        assert reply["error"] == Errors.INVALID_REQUEST
        assert quorum.offset == offset and cache.image.broker(9) is None
        good = {"broker_id": 9, "incarnation_id": "i9", "endpoints": {"rpc": "[::1]:9093"}}
        assert (await service.handle_broker_registration(good))["error"] == 0

    asyncio.run(scenario())


def test_a_registration_from_an_empty_data_directory_takes_the_broker_out_of_the_elr() -> None:
    """The broker's registration carries ``storage_lost`` (its data directory was empty when
    it started): the controller removes it from every ELR it was in."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        quorum.commit(
            [
                rec.Topic("t", "TTTTTTTTTTTTTTTTTTTTTT", {"min.insync.replicas": "3"}),
                rec.Partition("TTTTTTTTTTTTTTTTTTTTTT", 0, (1, 2, 3), (1, 2), 1, 0, 0, elr=(3,)),
            ]
        )
        reply = await service.handle_broker_registration(
            {
                "broker_id": 3,
                "incarnation_id": "after-a-new-disk",
                "endpoints": {},
                "storage_lost": True,
            }
        )
        assert reply["error"] == 0
        state = cache.image.partition("TTTTTTTTTTTTTTTTTTTTTT", 0)
        assert state is not None and state.elr == ()

    asyncio.run(scenario())


def test_the_active_controller_elects_unclean_leaders_at_its_interval() -> None:
    """A partition left leaderless while unclean election was off gets a leader at the next
    periodic unclean election after the config is turned on (``maybeElectUncleanLeaders``)."""
    topic_id = "UUUUUUUUUUUUUUUUUUUUUU"

    async def scenario() -> None:
        service, quorum, cache, clock = five_node_controller()
        service.unclean_election_interval_ms = 60_000
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        quorum.commit(
            [
                rec.Topic("t", topic_id),
                rec.Partition(topic_id, 0, (4, 2, 3), (4,), -1, 3, 5),
            ]
        )
        await service.tick()
        state = cache.image.partition(topic_id, 0)
        assert state is not None and state.leader == -1
        quorum.commit([rec.Config(rec.ConfigResourceType.TOPIC, "t", UNCLEAN, "true")])
        clock[0] += 59_999
        await heartbeats(service, cache)
        await service.tick()
        state = cache.image.partition(topic_id, 0)
        assert state is not None and state.leader == -1
        clock[0] += 1
        await service.tick()
        state = cache.image.partition(topic_id, 0)
        assert state is not None and state.leader in (2, 3) and state.isr == (state.leader,)

    asyncio.run(scenario())


def test_a_create_topics_request_is_one_batch_committed_whole_or_not_at_all() -> None:
    """``ControllerResult.atomicOf``: the topics of one CreateTopics (and of DeleteTopics)
    are one proposal. Proposed topic by topic, a leadership lost after the first left it
    created, and the client's retry was told TOPIC_ALREADY_EXISTS for its own topic."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        real_propose = quorum.propose
        proposals: list[list[rec.MetadataRecord]] = []

        def lost(records: Any, on_done: Any, *, epoch: int) -> None:
            proposals.append(list(records))
            asyncio.get_running_loop().call_soon(on_done, None, "leadership lost")

        quorum.propose = lost  # type: ignore[method-assign]
        topics = [{"name": n, "num_partitions": 2, "replication_factor": 3} for n in "abc"]
        with pytest.raises(RpcError):  # NOT_CONTROLLER: the broker retries the request
            await service.handle_create_topics({"topics": topics})
        assert len(proposals) == 1
        assert [r.name for r in proposals[0] if isinstance(r, rec.Topic)] == ["a", "b", "c"]
        assert all(cache.image.topic_by_name(n) is None for n in "abc")
        quorum.propose = real_propose  # type: ignore[method-assign]
        await service._maybe_activate()
        # The retry; a name colliding with one earlier in the request is refused, as it
        # would be after the earlier one was created.
        reply = await service.handle_create_topics(
            {"topics": [*topics, {"name": "a.b", "num_partitions": 1}, {"name": "a_b"}]}
        )
        assert [(t["name"], t["error"]) for t in reply["topics"]] == [
            ("a", 0),
            ("b", 0),
            ("c", 0),
            ("a.b", 0),
            ("a_b", int(Errors.INVALID_TOPIC_EXCEPTION)),
        ]
        assert all(cache.image.topic_by_name(n) is not None for n in ("a", "b", "c", "a.b"))
        reply = await service.handle_delete_topics({"names": ["a", "missing", "b"]})
        assert [(t["name"], t["error"]) for t in reply["topics"]] == [
            ("a", 0),
            ("missing", int(Errors.UNKNOWN_TOPIC_OR_PARTITION)),
            ("b", 0),
        ]
        assert cache.image.topic_by_name("a") is None and cache.image.topic_by_name("b") is None

    asyncio.run(scenario())


def test_an_alter_configs_request_is_one_batch_committed_whole_or_not_at_all() -> None:
    """``ConfigurationControlManager.incrementalAlterConfigs`` returns ``atomicOf``: the
    resources of one request are one proposal. Proposed resource by resource, a leadership
    lost after the first left it altered; a resource refused alone writes nothing."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        topics = [{"name": n, "num_partitions": 1, "replication_factor": 3} for n in "ab"]
        await service.handle_create_topics({"topics": topics})
        real_propose = quorum.propose
        proposals: list[list[rec.MetadataRecord]] = []

        def lost(records: Any, on_done: Any, *, epoch: int) -> None:
            proposals.append(list(records))
            asyncio.get_running_loop().call_soon(on_done, None, "leadership lost")

        def alter(retention: str) -> dict[str, Any]:
            return {
                "incremental": True,
                "resources": [
                    {"resource_type": 2, "resource_name": n, "ops": [["retention.ms", 0, v]]}
                    for n, v in (("a", "1000"), ("b", retention))
                ],
            }

        def retention_of(name: str) -> str | None:
            topic = cache.image.topic_by_name(name)
            assert topic is not None
            return topic.configs.get("retention.ms")

        quorum.propose = lost  # type: ignore[method-assign]
        with pytest.raises(RpcError):  # NOT_CONTROLLER: the broker retries the request
            await service.handle_alter_configs(alter("2000"))
        assert [
            [(r.resource_name, r.value) for r in p if isinstance(r, rec.Config)] for p in proposals
        ] == [[("a", "1000"), ("b", "2000")]]
        assert retention_of("a") is None and retention_of("b") is None
        quorum.propose = real_propose  # type: ignore[method-assign]
        await service._maybe_activate()
        reply = await service.handle_alter_configs(alter("soon"))
        assert [r["error"] for r in reply["resources"]] == [0, int(Errors.INVALID_CONFIG)]
        assert retention_of("a") == "1000" and retention_of("b") is None

    asyncio.run(scenario())


def test_a_create_topics_request_of_too_many_partitions_is_refused_whole() -> None:
    """``validateTotalNumberOfPartitions``: the request's partitions together (-1 counting the
    default) above 10,000 refuse every topic with POLICY_VIOLATION."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        reply = await service.handle_create_topics(
            {
                "topics": [
                    {"name": "big", "num_partitions": 6_000, "replication_factor": 1},
                    {"name": "also", "num_partitions": 4_000, "replication_factor": 1},
                    {"name": "small", "num_partitions": -1, "replication_factor": 1},
                ]
            }
        )
        assert {(t["error"], t["message"]) for t in reply["topics"]} == {
            (int(Errors.POLICY_VIOLATION), "Excessively large number of partitions per request.")
        }
        assert cache.image.topic_by_name("small") is None

    asyncio.run(scenario())


def test_a_create_partitions_request_adding_too_many_partitions_is_refused_whole() -> None:
    """Kafka bounds one request's records at 10,000 (a ``BoundedList``; its overflow is a
    POLICY_VIOLATION for every topic): two topics growing by 6,000 and 4,001 are refused
    together, though each alone is within the bound; 6,000 and 4,000 pass."""

    async def scenario() -> None:
        service, quorum, cache, _clock = five_node_controller()
        register(quorum, 1, 2, 3)
        await service._maybe_activate()
        topics = [{"name": n, "num_partitions": 1, "replication_factor": 1} for n in "ab"]
        await service.handle_create_topics({"topics": topics})

        def counts() -> list[int]:
            return [
                len(cache.image.partitions_of(cache.image.topic_by_name(n).topic_id))  # type: ignore[union-attr]
                for n in "ab"
            ]

        reply = await service.handle_create_partitions(
            {"topics": [{"name": "a", "count": 6_001}, {"name": "b", "count": 4_002}]}
        )
        assert {(t["error"], t["message"]) for t in reply["topics"]} == {
            (int(Errors.POLICY_VIOLATION), "Unable to perform excessively large batch operation.")
        }
        assert counts() == [1, 1]
        reply = await service.handle_create_partitions(
            {"topics": [{"name": "a", "count": 6_001}, {"name": "b", "count": 4_001}]}
        )
        assert [t["error"] for t in reply["topics"]] == [0, 0]
        assert counts() == [6_001, 4_001]

    asyncio.run(scenario())


class ThreeBrokers:
    """An active controller over three registered brokers, on a settable clock."""

    def __init__(self, propose_timeout_s: float = 10.0, max_idle_interval_ms: int = 500) -> None:
        self.clock = [1_000_000]
        self.cache = MetadataCache(NODE_ID, cast(Any, None))
        self.quorum = FakeQuorum(self.cache)
        self.service = ControllerService(
            NODE_ID,
            cast(MetadataQuorum, self.quorum),
            self.cache,
            ControllerConfig(),
            lambda: self.clock[0],
            cluster_id="c",
            expected_brokers=3,
            propose_timeout_s=propose_timeout_s,
            max_idle_interval_ms=max_idle_interval_ms,
        )
        self.quorum.commit([rec.ClusterId("c")])
        register(self.quorum, 1, 2, 3)

    async def only_1_and_2_beat(self, t0: int, steps: int, *, until_3_fenced: bool) -> None:
        """Brokers 1 and 2 beat every 500 ms from ``t0`` on, the controller ticking; broker 3
        is dead."""
        for step in range(1, steps + 1):
            self.clock[0] = t0 + 500 * step
            await self.beat(1)
            await self.beat(2)
            await self.service.tick()
            if until_3_fenced and self.cache.image.brokers[3].fenced:
                return

    async def beat(self, b: int, **extra: Any) -> Any:
        return await self.service.handle_broker_heartbeat(
            {
                "broker_id": b,
                "broker_epoch": self.cache.image.brokers[b].broker_epoch,
                "current_metadata_offset": self.cache.image.last_offset,
                **extra,
            }
        )


def test_deciding_again_in_the_same_term_keeps_the_brokers_sessions() -> None:
    """A heartbeat's proposal abandoned by its caller (its connection closed) made the
    controller activate again with new broker sessions, all counted from then: a broker dead
    since t0 was fenced at t0+6000 ms, not t0+3500 (a new BrokerHeartbeatManager only comes
    with a new active controller in Kafka)."""

    async def scenario() -> None:
        c = ThreeBrokers()
        clock, cache, quorum, service, beat = c.clock, c.cache, c.quorum, c.service, c.beat
        await service._maybe_activate()

        t0 = clock[0]
        for b in (1, 2, 3):
            await beat(b)
        await c.only_1_and_2_beat(t0, 5, until_3_fenced=False)
        clock[0] = t0 + 2_900
        held: list[tuple[Any, Any]] = []
        proposed = asyncio.Event()

        def hold(records: Any, on_done: Any, *, epoch: int) -> None:
            held.append((records, on_done))
            proposed.set()

        real = quorum.propose
        quorum.propose = hold  # type: ignore[method-assign]
        task = asyncio.ensure_future(beat(2, want_fence=True))
        await asyncio.wait_for(proposed.wait(), 10)
        task.cancel()  # the caller's connection closed
        with pytest.raises(asyncio.CancelledError):
            await task
        quorum.propose = real  # type: ignore[method-assign]
        for records, on_done in held:
            on_done(quorum.commit(records), None)
        await service._maybe_activate()
        assert service.is_active and service.activations == 2
        clock[0] = t0 + 3_500
        await beat(1)
        await service.tick()
        assert cache.image.brokers[3].fenced

    asyncio.run(scenario())


@pytest.mark.parametrize("stall_ms", [2_900, 4_000])
def test_heartbeats_refused_while_set_aside_keep_the_brokers_alive(stall_ms: int) -> None:
    """Its proposals held (a commit stall in the same term), the controller is set aside and
    answers NOT_CONTROLLER; the brokers heartbeat on. Reused afterwards with the sessions as
    they were before the stall, it fenced every live broker on its first tick (review probe).
    The refused heartbeats renew the sessions, and after a stall longer than a session the
    controller starts afresh."""

    async def scenario() -> None:
        c = ThreeBrokers(propose_timeout_s=0.01)
        clock, cache, quorum, service, beat = c.clock, c.cache, c.quorum, c.service, c.beat
        await service._maybe_activate()

        for b in (1, 2, 3):
            await beat(b)
        await service.tick()
        held: list[tuple[Any, Any]] = []
        real = quorum.propose
        quorum.propose = lambda records, on_done, *, epoch: held.append((records, on_done))  # type: ignore[method-assign]
        with pytest.raises(RpcError):
            await beat(3, want_fence=True)  # its proposal times out: set aside
        assert not service.is_active
        for _ in range(stall_ms // 100):
            clock[0] += 100
            for b in (1, 2, 3):
                with pytest.raises(RpcError):  # NOT_CONTROLLER
                    await beat(b)
        quorum.propose = real  # type: ignore[method-assign]
        for records, on_done in held:
            on_done(quorum.commit(records), None)
        await service._maybe_activate()
        assert service.is_active
        clock[0] += 200  # a tick before the brokers' next heartbeat
        await service.tick()
        assert [b for b in (1, 2) if cache.image.brokers[b].fenced] == []

    asyncio.run(scenario())


def test_a_heartbeat_naming_offline_replicas_moves_their_leadership() -> None:
    """The BrokerHeartbeat RPC carries the partitions whose logs failed to load on the node;
    the active controller elects other leaders for those it led."""

    async def scenario() -> None:
        service, quorum, cache, _ = five_node_controller()
        register(quorum, 1, 2, 3, 4, 5)
        await service._maybe_activate()
        await service.tick()
        topic = cache.image.topic_by_name(OFFSETS_TOPIC_NAME)
        assert topic is not None
        led = [p.partition for p in cache.image.partitions_of(topic.topic_id) if p.leader == 1]
        assert led
        epoch = cache.image.brokers[1].broker_epoch
        reply = await service.handle_broker_heartbeat(
            {
                "broker_id": 1,
                "broker_epoch": epoch,
                "current_metadata_offset": quorum.offset,
                "offline_replica_ids": [[topic.topic_id, led[0]]],
            }
        )
        assert reply["error"] == 0 and not reply["is_fenced"], reply
        state = cache.image.partition(topic.topic_id, led[0])
        assert state is not None and state.leader not in (1, -1) and 1 not in state.isr
        still = [p.partition for p in cache.image.partitions_of(topic.topic_id) if p.leader == 1]
        assert still == led[1:]

    asyncio.run(scenario())


def commit_topic_on_2_and_3(quorum: FakeQuorum, partitions: int) -> str:
    """Topic t of ``partitions`` partitions on brokers 2 and 3 (not on this node, which has no
    role listener here), led by either; its id."""
    topic_id = uuid_str((1).to_bytes(16, "big"))
    quorum.commit(
        [
            rec.Topic(name="t", topic_id=topic_id),
            *(
                rec.Partition(
                    topic_id=topic_id,
                    partition=p,
                    replicas=(2, 3) if p % 2 else (3, 2),
                    isr=(2, 3),
                    leader=2 if p % 2 else 3,
                    leader_epoch=0,
                    partition_epoch=0,
                )
                for p in range(partitions)
            ),
        ]
    )
    return topic_id


def test_elect_leaders_of_every_partition_is_proposed_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ElectLeaders with no partitions named elects every partition that needs it: one batch
    of 6,000 changes held each node's loop half a second as it applied (found by a review).
    Kafka's electLeaders result is not atomic; the changes go in batches of at most
    MAX_RECORDS_PER_BATCH."""
    monkeypatch.setattr(controller_service, "MAX_RECORDS_PER_BATCH", 10)

    async def scenario() -> None:
        c = ThreeBrokers()
        topic_id = uuid_str((1).to_bytes(16, "big"))
        c.quorum.commit(
            [
                rec.Topic(name="t", topic_id=topic_id),
                *(rec.Partition(topic_id, p, (2, 3), (2, 3), 3, 0, 0) for p in range(25)),
            ]
        )
        await c.service._maybe_activate()
        for b in (1, 2, 3):
            await c.beat(b)
        batches: list[list[rec.MetadataRecord]] = []
        real = c.quorum.propose

        def recording(records: Any, on_done: Any, *, epoch: int) -> None:
            batches.append(list(records))
            real(records, on_done, epoch=epoch)

        c.quorum.propose = recording  # type: ignore[method-assign]
        reply = await c.service.handle_elect_leaders({"election": "preferred", "partitions": None})
        elected = [r for r in reply["results"] if r[0] == "t"]
        assert len(elected) == 25 and {r[2] for r in elected} == {0}
        changes = [b for b in batches if any(isinstance(r, rec.PartitionChange) for r in b)]
        assert len(changes) >= 3 and all(len(b) <= 10 for b in changes)
        assert {p.leader for p in c.cache.image.partitions_of(topic_id)} == {2}

    asyncio.run(scenario())


def test_fencing_a_broker_in_many_isrs_is_proposed_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker in the ISRs of 50,000 partitions was fenced in one batch, which every node
    applied in one turn of its event loop (a second), and decided in one turn of the
    controller's (a second more). The records go in batches of at most MAX_RECORDS_PER_BATCH,
    in order: FenceBroker, last, in the last one; each decision changes at most as many
    partitions."""
    monkeypatch.setattr(controller_service, "MAX_RECORDS_PER_BATCH", 10)

    async def scenario() -> None:
        c = ThreeBrokers()
        clock, cache, quorum, service, beat = c.clock, c.cache, c.quorum, c.service, c.beat
        topic_id = commit_topic_on_2_and_3(quorum, 25)
        await service._maybe_activate()
        decided: list[int] = []
        real_fence = Controller.fence_stale_brokers

        def counting(self: Controller, *args: Any, **options: Any) -> Iterator[Any]:
            for result in real_fence(self, *args, **options):
                decided.append(sum(isinstance(r, rec.PartitionChange) for r in result.records))
                yield result

        monkeypatch.setattr(Controller, "fence_stale_brokers", counting)
        batches: list[list[rec.MetadataRecord]] = []
        real = quorum.propose

        def recording(records: Any, on_done: Any, *, epoch: int) -> None:
            batches.append(list(records))
            real(records, on_done, epoch=epoch)

        quorum.propose = recording  # type: ignore[method-assign]
        for b in (1, 2, 3):
            await beat(b)
        await c.only_1_and_2_beat(clock[0], 29, until_3_fenced=True)
        fencing = [
            batch for batch in batches if any(isinstance(r, rec.PartitionChange) for r in batch)
        ]
        records = [r for batch in fencing for r in batch]
        # t's partitions and those of the offsets topic the tick made: 3 was in every ISR.
        in_isr = cache.image.partition_count()
        # One batch a part: 9 changes, or the last ones and FenceBroker.
        assert len(records) == in_isr + 1 and len(fencing) == math.ceil(in_isr / 9)
        assert all(len(batch) <= 10 for batch in fencing)
        assert [type(r) for r in records].index(rec.FenceBroker) == len(records) - 1
        assert sum(decided) == in_isr and max(decided) == 9  # and a FenceBroker: 10
        state = cache.image.partitions_of(topic_id)
        assert all(3 not in p.isr and p.leader != 3 for p in state)

    asyncio.run(scenario())


async def active_over_t(c: ThreeBrokers) -> int:
    """The controller active over topic t (25 partitions on brokers 2 and 3), every broker
    heard from; the offset its next batch gets."""
    commit_topic_on_2_and_3(c.quorum, 25)
    await c.service._maybe_activate()
    for b in (1, 2, 3):
        await c.beat(b)
    return c.cache.image.last_offset + 1


def test_a_controlled_shutdown_written_in_batches_waits_for_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker may go once the others have replayed the records moving its leadership
    away: written in batches, past the last one, not the first (Kafka's
    maybeUpdateControlledShutdownOffset takes the write's last offset)."""
    monkeypatch.setattr(controller_service, "MAX_RECORDS_PER_BATCH", 10)

    async def scenario() -> None:
        c = ThreeBrokers()
        cache, beat = c.cache, c.beat
        first = await active_over_t(c)
        reply = await beat(3, want_shut_down=True)
        last = cache.image.last_offset
        assert last > first and not reply["should_shut_down"]
        for b in (1, 2):
            await beat(b, current_metadata_offset=first)
        assert not (await beat(3, want_shut_down=True))["should_shut_down"]
        for b in (1, 2):
            await beat(b, current_metadata_offset=last)
        assert (await beat(3, want_shut_down=True))["should_shut_down"]

    asyncio.run(scenario())


def test_a_controlled_shutdown_whose_last_batch_was_abandoned_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last batch of a controlled shutdown timed out, then committed: the controller
    deciding again (the same one, in the same term) let the broker go once the others had
    replayed the first batch only."""
    monkeypatch.setattr(controller_service, "MAX_RECORDS_PER_BATCH", 10)

    async def scenario() -> None:
        c = ThreeBrokers(propose_timeout_s=0.05)
        cache, quorum, service, beat = c.cache, c.quorum, c.service, c.beat
        first = await active_over_t(c)
        real = quorum.propose
        held: list[tuple[Any, Any]] = []

        def hold_the_third(records: Any, on_done: Any, *, epoch: int) -> None:
            if len(held) or quorum.offset >= first + 1:
                held.append((records, on_done))
            else:
                real(records, on_done, epoch=epoch)

        quorum.propose = hold_the_third  # type: ignore[method-assign]
        with pytest.raises(RpcError):
            await beat(3, want_shut_down=True)
        assert not service.is_active and len(held) == 1
        quorum.propose = real  # type: ignore[method-assign]
        records, on_done = held[0]
        on_done(quorum.commit(records), None)  # the abandoned batch commits after all
        assert cache.image.brokers[3].fenced
        await service._maybe_activate()
        assert service.is_active and service.activations == 2
        for b in (1, 2):
            await beat(b, current_metadata_offset=first)
        assert not (await beat(3, want_shut_down=True))["should_shut_down"]
        for b in (1, 2):
            await beat(b)  # past the activation's NoOp
        assert (await beat(3, want_shut_down=True))["should_shut_down"]

    asyncio.run(scenario())


def committed_batches(quorum: FakeQuorum) -> list[list[rec.MetadataRecord]]:
    """From now on, each batch ``quorum`` commits, in order."""
    batches: list[list[rec.MetadataRecord]] = []
    commit = quorum.commit

    def recording(records: Any) -> int:
        batches.append(list(records))
        return commit(records)

    quorum.commit = recording  # type: ignore[method-assign]
    return batches


async def settled(service: ControllerService, no_op_writes: int) -> None:
    """Until ``service`` counts ``no_op_writes`` NoOps committed."""
    async with asyncio.timeout(5):
        while service.no_op_writes < no_op_writes:
            await asyncio.sleep(0)


def test_the_active_controller_appends_a_no_op_every_idle_interval() -> None:
    """KIP-835: a NoOp once metadata.max.idle.interval.ms passed since the last one (the
    activation's counts), whatever else was written; the run loop writes them."""

    async def scenario() -> None:
        c = ThreeBrokers(max_idle_interval_ms=500)
        batches = committed_batches(c.quorum)
        await c.service._maybe_activate()
        assert batches == [[rec.NoOp()]]
        c.clock[0] += 499
        c.service._maybe_write_no_op()
        c.clock[0] += 1
        c.service._maybe_write_no_op()
        await settled(c.service, 1)
        assert batches == [[rec.NoOp()], [rec.NoOp()]]
        c.clock[0] += 499
        c.service._maybe_write_no_op()
        task = asyncio.create_task(c.service.run())
        try:
            c.clock[0] += 1
            await settled(c.service, 2)
            assert batches[-1] == [rec.NoOp()]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert c.service.no_op_writes == 2, batches

    asyncio.run(scenario())


def test_a_no_op_never_committed_holds_up_nothing() -> None:
    """Proposed and not waited for: one the quorum never settles (a controller cut off, a
    snapshot installed over it) left the run loop, so activation and the fencing ticks, stuck
    for the whole proposal timeout; one refused is counted as a failed proposal."""

    async def scenario() -> None:
        c = ThreeBrokers(max_idle_interval_ms=500)
        await c.service._maybe_activate()
        real = c.quorum.propose
        held: list[Any] = []
        c.quorum.propose = lambda records, on_done, *, epoch: held.append(on_done)  # type: ignore[method-assign]
        c.clock[0] += 500
        c.service._maybe_write_no_op()
        assert len(held) == 1 and c.service.is_active
        c.quorum.propose = real  # type: ignore[method-assign]
        await c.beat(1)
        await c.service.tick()  # decisions go on meanwhile
        failures = c.service.proposal_failures
        held[0](None, "no leader")
        async with asyncio.timeout(5):
            while c.service.proposal_failures == failures:
                await asyncio.sleep(0)
        assert c.service.is_active and c.service.no_op_writes == 0

    asyncio.run(scenario())


def test_no_no_op_is_written_when_disabled_or_not_active() -> None:
    """metadata.max.idle.interval.ms 0 writes none (Kafka's), nor does a controller that is
    not active (a voter that is not the Raft leader)."""

    async def scenario() -> None:
        disabled = ThreeBrokers(max_idle_interval_ms=0)
        await disabled.service._maybe_activate()
        offset = disabled.quorum.offset
        disabled.clock[0] += 60_000
        disabled.service._maybe_write_no_op()
        await asyncio.sleep(0)
        assert disabled.quorum.offset == offset
        follower = ThreeBrokers(max_idle_interval_ms=500)
        follower.quorum.leader_id = 2
        await follower.service._maybe_activate()
        offset = follower.quorum.offset
        follower.clock[0] += 60_000
        follower.service._maybe_write_no_op()
        await asyncio.sleep(0)
        assert not follower.service.is_active and follower.quorum.offset == offset

    asyncio.run(scenario())
