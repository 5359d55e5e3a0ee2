"""Two replica managers in one process, their fetchers wired to each other's handlers.

The returning-leader scenario of tests/integration/test_replication.py without processes: a
follower whose ReplicaFetch long-poll is parked at the leader when it "stops" still receives the
first acks=1 write (the leader answers the parked request, Kafka's DelayedFetch); after a
failover the old leader truncates to the new leader's log (KIP-101/279), which keeps that record
and drops the rest of the old leader's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import pytest

from kcoord.cluster.fetch_session import FULL_PASS_INTERVAL_MS
from kcoord.errors import Errors
from kcoord.node.controller_service import alter_partition_reply, alter_partition_request
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_fetcher import ReplicaFetcherManager
from kcoord.node.replica_manager import (
    HIGH_WATERMARK_LINGER_MS,
    ISR_CHANGE_METADATA_WAIT_MS,
    ISR_CHANGE_RETRY_BACKOFF_MS,
    AlterPartitionCall,
    KafkaError,
    Partition,
    ReplicaManager,
)
from kcoord.node.rpc import MAX_ANSWER_BYTES, RpcClient, RpcClientPool
from kcoord.node.server import Node as ServerNode
from kcoord.raft import records as rec
from kcoord.raft.controller import Controller, ControllerConfig
from kcoord.raft.image import BecomeFollower, TopicIdPartition
from kcoord.raft.records import ConfigResourceType
from kcoord.storage import checkpoint
from kcoord.storage.epoch import UNDEFINED_EPOCH_OFFSET
from kcoord.storage.log import Log
from kcoord.storage.manager import LogManager
from tests.unit.storage.helpers import batch, read_all

TOPIC = "replicated"
TOPIC_ID = "CCCCCCCCCCCCCCCCCCCCCC"
NODES = (1, 2)


class _Handlers:
    """An ``RpcClient`` stand-in that calls the leader's handlers directly (and notes the
    requests in ``sent``)."""

    def __init__(self, leader: ReplicaManager, sent: list[tuple[str, Any]]) -> None:
        self.leader = leader
        self.sent = sent

    async def call(
        self, method: str, payload: Any, timeout: float, *, max_answer_bytes: int | None = None
    ) -> Any:
        self.sent.append((method, payload))
        if method == "ReplicaFetch":
            assert max_answer_bytes == MAX_ANSWER_BYTES  # its first batch whole, however large
            return await self.leader.handle_replica_fetch(payload)
        assert method == "EpochEndOffset", method
        return await self.leader.handle_epoch_end_offset(payload)


class _Fetchers(ReplicaFetcherManager):
    def __init__(self, node: Node, cluster: dict[int, Node]) -> None:
        super().__init__(
            node.node_id, node.replicas, node.cache, RpcClientPool(), lambda: 1, max_wait_ms=5000
        )
        self.cluster = cluster
        self.sent: list[tuple[str, Any]] = []

    def _client(self, leader_id: int) -> RpcClient | None:
        return cast(RpcClient, _Handlers(self.cluster[leader_id].replicas, self.sent))


class Node:
    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        cluster: dict[int, Node],
        *,
        high_watermark_linger_ms: int = HIGH_WATERMARK_LINGER_MS,
        clock: Callable[[], int] = lambda: 1_000_000,
        monotonic: Callable[[], int] | None = None,
        alter_partition: AlterPartitionCall | None = None,
    ) -> None:
        self.node_id = node_id
        self.logs = LogManager(data_dir)
        self.logs.open()
        self.cache = MetadataCache(node_id, listener=_NoRoles())
        self.replicas = ReplicaManager(
            node_id,
            self.logs,
            self.cache,
            clock,
            high_watermark_linger_ms=high_watermark_linger_ms,
            broker_epoch=lambda: 1,
            alter_partition=alter_partition,
            monotonic_ms=monotonic,
        )
        self.cache.listener = self.replicas
        self.cache.delta_listeners.append(self.replicas.on_metadata_delta)  # as the server does
        self.fetchers = _Fetchers(self, cluster)
        cluster[node_id] = self

    @property
    def partition(self) -> Partition:
        part = self.replicas.get_partition(TOPIC, 0)
        assert part is not None
        return part

    def values(self) -> list[bytes | None]:
        return [r.value for r in read_all(self.partition.log)]

    async def fetch_once(self) -> None:
        """One round of this node's fetcher (truncation if pending, then one ReplicaFetch)."""
        part = self.partition
        await self.fetchers._step(part.leader_id, [part])

    def produce(self, value: bytes) -> None:
        """An acks=1 write: the leader answers once its own log has it."""
        self.replicas.append_local(self.partition, batch(value=value), required_acks=1)


class _NoRoles:
    def on_role_changes(self, changes: Any) -> None:
        pass


def _start(cluster: dict[int, Node], isr: tuple[int, ...] = NODES) -> None:
    records: list[rec.MetadataRecord] = [
        rec.RegisterBroker(
            broker_id=n, incarnation_id=f"i{n}", broker_epoch=1, endpoints={}, fenced=False
        )
        for n in NODES
    ]
    records += [
        rec.Topic(TOPIC, TOPIC_ID, {}),
        rec.Partition(TOPIC_ID, 0, NODES, isr, leader=1, leader_epoch=0, partition_epoch=0),
    ]
    for node in cluster.values():
        node.cache.apply(1, records)


def _two_partitions(tmp_path: Path, count: int = 2) -> tuple[Node, Node, list[Partition]]:
    """Leader 1 and follower 2 started, with more partitions led by 1 (``count`` in all); the
    follower's partitions."""
    cluster: dict[int, Node] = {}
    leader, follower = (Node(n, tmp_path / f"node{n}", cluster) for n in NODES)
    _start(cluster)
    more = [
        rec.Partition(TOPIC_ID, p, NODES, NODES, leader=1, leader_epoch=0, partition_epoch=0)
        for p in range(1, count)
    ]
    for node in cluster.values():
        node.cache.apply(2, list(more))
    found = [follower.replicas.get_partition(TOPIC, p) for p in range(count)]
    parts = [p for p in found if p is not None]
    assert len(parts) == count
    return leader, follower, parts


def test_a_partition_backing_off_is_not_asked_to_truncate_until_its_backoff_is_over(
    tmp_path: Path,
) -> None:
    """AbstractFetcherThread truncates only partitions not delayed: one whose EpochEndOffset
    was answered with an error (its leader not at its epoch yet) was asked again every
    round, and each fetch of the others waited behind it."""

    async def scenario() -> None:
        leader, follower, parts = _two_partitions(tmp_path)
        fetchers = follower.fetchers
        fetchers.backoff_ms = 60_000  # longer than the test: the back-off holds throughout
        first, second = (leader.replicas.get_partition(TOPIC, p) for p in (0, 1))
        assert first is not None and second is not None

        async def step() -> None:  # with a record waiting: the fetch does not long-poll
            leader.replicas.append_local(first, batch(value=b"v"), required_acks=1)
            await fetchers._step(1, fetchers._followed_from(1))

        leader.replicas.append_local(second, batch(value=b"x"), required_acks=1)
        await step()
        assert parts[1].log.epoch_cache.latest_epoch == 0  # an epoch to ask the leader about
        fetchers.sent.clear()
        parts[1].leader_epoch, parts[1].truncation_pending = 7, True  # the leader is at 0
        for _ in range(4):
            await step()
        assert [m for m, _ in fetchers.sent] == ["EpochEndOffset"] + ["ReplicaFetch"] * 4
        assert parts[0].log.log_end_offset == 5  # the other partition is fetched meanwhile
        fetchers._backoff_until[parts[1].tp] = 0.0  # over: asked again
        fetchers.sent.clear()
        await step()
        assert [m for m, _ in fetchers.sent] == ["EpochEndOffset", "ReplicaFetch"]
        # A new role (another leader, or this one's next epoch) starts with no back-off
        # (addPartitions: a fresh PartitionFetchState).
        assert parts[1].tp in fetchers._backoff_until
        change = BecomeFollower(TopicIdPartition(TOPIC_ID, 1), TOPIC, 1, 8, 1)
        with mock.patch.object(fetchers, "maybe_start_fetchers"):
            fetchers.on_role_changes([change])
        assert parts[1].tp not in fetchers._backoff_until

    asyncio.run(scenario())


def test_a_fetcher_with_nothing_left_to_follow_keeps_nothing_of_its_leader(
    tmp_path: Path,
) -> None:
    """Its fetch state held the partitions and logs it last fetched, deleted ones too."""

    async def scenario() -> None:
        leader, follower, _ = _two_partitions(tmp_path)
        fetchers = follower.fetchers
        led = leader.replicas.get_partition(TOPIC, 0)
        assert led is not None
        leader.replicas.append_local(led, batch(value=b"v"), required_acks=1)  # no long poll
        await fetchers._step(1, fetchers._followed_from(1))
        assert 1 in fetchers._fetch_states and 1 in fetchers._sessions
        for node in (leader, follower):
            node.cache.apply(3, [rec.RemoveTopic(TOPIC_ID)])
        fetchers._roles_version += 1  # as on_role_changes, without starting fetchers
        await asyncio.wait_for(fetchers._run(1), 5)  # nothing to follow: it ends at once
        kept = (fetchers._fetch_states, fetchers._sessions, fetchers._followed_by_leader)
        assert not any(1 in k for k in kept)

    asyncio.run(scenario())


def _fail_over_to(cluster: dict[int, Node], leader: int) -> None:
    """The controller fences the old leader: ``leader`` leads alone in a new leader epoch."""
    change = rec.PartitionChange(
        TOPIC_ID, 0, expected_partition_epoch=0, leader=leader, isr=(leader,)
    )
    for node in cluster.values():
        node.cache.apply(2, [change])


async def _two_nodes_with_committed(
    tmp_path: Path, template: bytes, count: int
) -> tuple[dict[int, Node], Node, Node]:
    """The cluster, its leader and its follower, after ``count`` records (``template % i``)
    were produced and both replicas' HWs passed them."""
    cluster: dict[int, Node] = {}
    leader, follower = (Node(n, tmp_path / f"node-{n}", cluster) for n in NODES)
    _start(cluster)
    assert leader.partition.is_leader and not follower.partition.is_leader
    for i in range(count):
        leader.produce(template % i)
    while leader.partition.high_watermark < count or follower.partition.high_watermark < count:
        await follower.fetch_once()
    return cluster, leader, follower


async def _within_iterations(check: Callable[[], bool], what: str) -> None:
    """Wait (bounded, no wall clock) a few event loop iterations for ``check``."""
    for _ in range(100):
        if check():
            return
        await asyncio.sleep(0)  # one loop iteration
    raise AssertionError(what)


async def _parked(leader: ReplicaManager) -> None:
    """Wait until a replica fetch waits at the leader for news."""
    await _within_iterations(lambda: bool(leader._fetch_wakeups), "no fetch parked at the leader")


def fetch_item(part: Partition, **overrides: Any) -> dict[str, Any]:
    """A ReplicaFetch partition entry of a replica at ``part``'s position (its log end, HW,
    log start and epochs), with ``overrides``."""
    return {
        "topic": TOPIC,
        "partition": 0,
        "fetch_offset": part.log.log_end_offset,
        "leader_epoch": part.leader_epoch,
        "last_fetched_epoch": part.log.epoch_cache.latest_epoch,
        "high_watermark": part.high_watermark,
        "log_start_offset": part.log.log_start_offset,
        **overrides,
    }


def test_a_returning_leader_keeps_what_the_new_leader_has_and_drops_the_rest(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        cluster, old, new = await _two_nodes_with_committed(tmp_path, b"committed-%d", 3)

        # The follower's next fetch parks at the leader; then the follower "stops" (it fetches
        # no more). The parked fetch is still answered with the first acks=1 write.
        parked = asyncio.create_task(new.fetch_once())
        await _parked(old.replicas)
        old.produce(b"uncommitted-0")
        await asyncio.wait_for(parked, 5)
        old.produce(b"uncommitted-1")
        old.produce(b"uncommitted-2")
        assert old.partition.high_watermark == 3  # the tail is not committed
        assert new.values()[3:] == [b"uncommitted-0"]

        _fail_over_to(cluster, leader=new.node_id)
        assert new.partition.is_leader and new.partition.leader_epoch == 1
        assert old.partition.truncation_pending
        new.produce(b"new-leader-0")

        # The old leader returns as a follower: it truncates to where epoch 0 ends on the new
        # leader (offset 4, not its HW 3 and not its own end 6), then fetches the new epoch.
        await old.fetch_once()
        assert not old.partition.truncation_pending
        assert [m for m, _ in old.fetchers.sent] == ["EpochEndOffset", "ReplicaFetch"]
        fetch = old.fetchers.sent[-1][1]["partitions"][0]
        assert (fetch["fetch_offset"], fetch["last_fetched_epoch"]) == (4, 0)
        expected = [b"committed-0", b"committed-1", b"committed-2", b"uncommitted-0"]
        expected.append(b"new-leader-0")
        assert new.values() == expected
        assert old.values() == expected
        assert old.partition.log.epoch_cache.entries == [(0, 0), (1, 4)]

    asyncio.run(scenario())


def test_an_acks_all_wait_is_registered_at_the_append_and_failed_by_a_role_change(
    tmp_path: Path,
) -> None:
    """The chaos suite's duplicate: a Produce for two partitions awaited the first one's HW
    while the second lost its leadership (and its uncommitted tail); the second wait began
    only afterwards, on a follower, and hung until the request timed out. The waits are now
    futures made at the append, so the role change fails them, and a follower never waits."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        old, new = (Node(n, tmp_path / f"node-{n}", cluster) for n in NODES)
        _start(cluster)
        old.produce(b"uncommitted")
        committed = old.partition.high_watermark_reached(1)  # nobody awaits it yet
        assert not committed.done()

        _fail_over_to(cluster, leader=new.node_id)  # the old leader will truncate its tail
        assert committed.done()
        error = committed.exception()
        assert isinstance(error, KafkaError) and error.code is Errors.NOT_LEADER_OR_FOLLOWER
        assert len(old.partition.hw_waiters) == 0

        # A follower's HW may pass the offset with the new leader's records: no waiting there.
        late = old.partition.high_watermark_reached(1)
        assert late.done() and isinstance(late.exception(), KafkaError)

        # A wait given up (a timeout) leaves nothing behind.
        pending = new.partition.high_watermark_reached(1)  # nothing at offset 0 yet
        assert len(new.partition.hw_waiters) > 0
        pending.cancel()
        await asyncio.sleep(0)  # the done callback runs on the next iteration
        assert len(new.partition.hw_waiters) == 0

    asyncio.run(scenario())


def test_a_replica_fetch_answer_names_only_the_partitions_with_something_to_apply(
    tmp_path: Path,
) -> None:
    """The follower sends its HW and log start; a partition it has caught up on, whose HW and
    log start it has, is left out of the answer (a full answer without its log start)."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"node{n}", cluster) for n in NODES)
        _start(cluster)
        for value in (b"a", b"b"):
            leader.produce(value)
        for _ in range(2):  # the records, then the HW that fetch moved
            await follower.fetch_once()
        part = follower.partition
        assert (part.log.log_end_offset, part.high_watermark) == (2, 2)
        assert leader.partition.high_watermark == 2

        async def answer(**overrides: Any) -> list[dict[str, Any]]:
            reply = await leader.replicas.handle_replica_fetch(
                {"replica_id": 2, "max_wait_ms": 0, "partitions": [fetch_item(part, **overrides)]}
            )
            return cast(list[dict[str, Any]], reply["partitions"])

        assert await answer() == []  # caught up: nothing to apply
        (full,) = await answer(log_start_offset=None)
        assert (full["high_watermark"], full["records"]) == (2, b"")
        (behind,) = await answer(high_watermark=1)  # the leader's HW is news
        assert (behind["high_watermark"], behind["records"]) == (2, b"")
        (reading,) = await answer(fetch_offset=1, high_watermark=1)  # records are news
        assert reading["records"]
        (fenced,) = await answer(leader_epoch=part.leader_epoch - 1)  # errors always count
        assert fenced["error"] == Errors.FENCED_LEADER_EPOCH

        leader.produce(b"c")  # a new record: fetched and applied from the trimmed answers
        await follower.fetch_once()
        assert follower.values() == [b"a", b"b", b"c"]

    asyncio.run(scenario())


def test_a_replica_fetch_with_an_epoch_the_leader_cannot_place_is_out_of_range(
    tmp_path: Path,
) -> None:
    """Partition.readRecords, for a follower as for a consumer: a last fetched epoch the
    leader cannot place has no end offset to truncate to, so the answer is OFFSET_OUT_OF_RANGE
    (it was a diverging epoch of -1, which a fetcher reads as "no divergence"). The follower,
    whose position the leader holds, keeps its log, as Kafka's fetchOffsetAndTruncate does; it
    threw the log away and started again at the leader's log start."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"node{n}", cluster) for n in NODES)
        _start(cluster)
        for value in (b"a", b"b", b"c"):
            leader.produce(value)
        for _ in range(2):
            await follower.fetch_once()
        part = follower.partition
        assert follower.values() == [b"a", b"b", b"c"]

        reply = await leader.replicas.handle_replica_fetch(
            {
                "replica_id": 2,
                "max_wait_ms": 0,
                "partitions": [fetch_item(part, last_fetched_epoch=5)],
            }
        )
        (unplaced,) = reply["partitions"]
        assert (unplaced["error"], unplaced["diverging_epoch"]) == (
            Errors.OFFSET_OUT_OF_RANGE,
            None,
        )
        assert (unplaced["log_start_offset"], unplaced["log_end_offset"]) == (0, 3)

        part.log.epoch_cache.assign(5, 3)  # the follower's log claims an epoch the leader lacks
        await follower.fetch_once()
        assert follower.values() == [b"a", b"b", b"c"]
        assert (part.log.log_start_offset, part.log.log_end_offset) == (0, 3)

    asyncio.run(scenario())


def test_a_followers_high_watermark_above_the_leaders_comes_down_to_it(tmp_path: Path) -> None:
    """A review's scenario. Node 2, restarted, replays the metadata log a batch at a time: for
    an instant it leads an old epoch alone and takes its log end for its HW, which holds a
    record of a later epoch the leader has not committed (x, acks=1, on node 1 and 2 only).
    As a follower it kept that HW (it only went up, and the leader's answers left the
    partition out, their HW being no news); its HW listeners saw x as committed. It follows
    the leader's HW down, as Kafka's follower does on every fetch."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        n1, n2, n3 = (Node(i, tmp_path / f"n{i}", cluster) for i in (1, 2, 3))
        for node in (n1, n2, n3):
            node.fetchers.max_wait_ms = 0  # a fetch with nothing new answers at once
        batches: list[list[rec.MetadataRecord]] = [
            [
                *(
                    rec.RegisterBroker(
                        broker_id=i,
                        incarnation_id=f"i{i}",
                        broker_epoch=1,
                        endpoints={},
                        fenced=False,
                    )
                    for i in (1, 2, 3)
                ),
                rec.Topic(TOPIC, TOPIC_ID, {}),
                rec.Partition(
                    TOPIC_ID, 0, (1, 2, 3), (1, 2, 3), leader=1, leader_epoch=0, partition_epoch=0
                ),
            ]
        ]

        def publish(records: list[rec.MetadataRecord]) -> None:
            batches.append(records)
            for node in cluster.values():
                node.cache.apply(len(batches), records)

        for node in cluster.values():
            node.cache.apply(1, batches[0])
        publish([rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=0, leader=2, isr=(2,))])
        n2.produce(b"a")
        for node in (n1, n3):
            await node.fetch_once()
            await node.fetch_once()
        publish([rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=1, isr=(1, 2, 3))])
        publish([rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=2, leader=1)])
        for node in (n2, n3):
            await node.fetch_once()
            await node.fetch_once()
        n1.produce(b"x")  # acks=1: node 3 has not fetched it
        await n2.fetch_once()
        assert (n1.partition.high_watermark, n2.partition.log.log_end_offset) == (1, 2)

        n2.replicas.close()
        del cluster[2]
        again = Node(2, tmp_path / "n2", cluster)
        again.fetchers.max_wait_ms = 0
        for i, records in enumerate(batches):
            again.cache.apply(i + 1, records)
            if i == 1:
                assert again.partition.is_leader and again.partition.high_watermark == 2
        assert not again.partition.is_leader
        told: list[int] = []
        again.replicas.add_high_watermark_listener(lambda part, hw: told.append(hw))
        await again.fetch_once()
        assert again.partition.high_watermark == 1 == n1.partition.high_watermark
        assert told == [1]

    asyncio.run(scenario())


def test_a_high_watermark_alone_waits_its_linger_for_records_to_go_with_it(
    tmp_path: Path,
) -> None:
    """The follower's fetch after it appended makes the leader's HW pass the record; the
    answer, which would carry only that HW, waits for the next record and brings both. With
    no linger the HW goes out alone at once (KIP-1166)."""

    async def scenario(linger_ms: int) -> tuple[Node, Node, asyncio.Task[None]]:
        cluster: dict[int, Node] = {}
        leader, follower = (
            Node(
                n, tmp_path / f"linger{linger_ms}-{n}", cluster, high_watermark_linger_ms=linger_ms
            )
            for n in NODES
        )
        _start(cluster)
        leader.produce(b"a")
        await follower.fetch_once()  # the record; the follower's HW is still 0
        assert (follower.partition.log.log_end_offset, follower.partition.high_watermark) == (1, 0)
        # The next fetch moves the leader's HW to 1.
        return leader, follower, asyncio.create_task(follower.fetch_once())

    async def lingering() -> None:
        leader, follower, parked = await scenario(linger_ms=60_000)
        await _parked(leader.replicas)
        assert leader.partition.high_watermark == 1
        for _ in range(10):
            await asyncio.sleep(0)
        assert not parked.done() and follower.partition.high_watermark == 0
        leader.produce(b"b")
        await asyncio.wait_for(parked, 5)
        assert follower.values() == [b"a", b"b"] and follower.partition.high_watermark == 1

    async def at_once() -> None:
        _, follower, parked = await scenario(linger_ms=0)
        await asyncio.wait_for(parked, 4)  # the fetcher waits up to 5 s for records
        assert follower.values() == [b"a"] and follower.partition.high_watermark == 1

    asyncio.run(lingering())
    asyncio.run(at_once())


def test_a_parked_replica_fetch_is_answered_when_its_leader_steps_down(tmp_path: Path) -> None:
    """A follower's fetch waits at the leader for news (up to the fetcher's 5 s); the leader's
    role change answers it at once (Kafka's makeFollowers completes delayed fetches), so the
    follower turns to the new leader without waiting the long poll out."""

    async def scenario() -> None:
        cluster, leader, follower = await _two_nodes_with_committed(tmp_path, b"v%d", 1)
        parked = asyncio.create_task(follower.fetch_once())
        await _parked(leader.replicas)
        _fail_over_to(cluster, leader=follower.node_id)
        await _within_iterations(parked.done, "the parked fetch still waits")
        await parked
        assert not leader.replicas._fetch_wakeups

    asyncio.run(scenario())


def test_a_followers_high_watermark_wakes_no_parked_replica_fetch(tmp_path: Path) -> None:
    """A replica fetch to a node is about partitions it leads: the HW of a partition it
    follows (which moves on every replicated append) leaves the parked fetch waiting; an
    append to the partition it leads answers it."""

    async def scenario() -> None:
        cluster, leader, follower = await _two_nodes_with_committed(tmp_path, b"v%d", 1)
        followed = rec.Partition(
            TOPIC_ID, 1, NODES, NODES, leader=follower.node_id, leader_epoch=0, partition_epoch=0
        )
        for node in cluster.values():
            node.cache.apply(2, [followed])
        part = leader.replicas.get_partition(TOPIC, 1)
        assert part is not None and not part.is_leader
        parked = asyncio.create_task(follower.fetch_once())  # partition 0, led by node 1
        await _parked(leader.replicas)
        (wakeup,) = leader.replicas._fetch_wakeups

        part.log.append_as_follower(batch(value=b"followed"), leader.replicas.now_ms())
        leader.replicas.follow_leader_high_watermark(part, 1)
        assert part.high_watermark == 1
        assert not wakeup.is_set() and not parked.done()

        leader.produce(b"led")
        await _within_iterations(parked.done, "the append left the fetch parked")
        await parked
        assert follower.values() == [b"v0", b"led"]

    asyncio.run(scenario())


def test_delete_records_reaches_the_follower_and_its_checkpoint(tmp_path: Path) -> None:
    """The leader's new log start wakes the follower's parked fetch; the follower takes it,
    writes its log start checkpoint at once (a crash must not bring the records back), and its
    next fetch reports it, which completes the leader's wait for the low watermark."""

    async def scenario() -> None:
        _, leader, follower = await _two_nodes_with_committed(tmp_path, b"r-%d", 3)
        parked = asyncio.create_task(follower.fetch_once())
        await _parked(leader.replicas)

        part, target = leader.replicas.delete_records(TOPIC, 0, 2)
        reached = part.low_watermark_waiters.wait(target, leader.replicas.low_watermark(part))
        assert not reached.done()
        await asyncio.wait_for(parked, 5)  # answered at once: the log start is news
        assert follower.partition.log.log_start_offset == 2
        path = follower.logs.data_dir / checkpoint.LOG_START_OFFSET_CHECKPOINT
        assert checkpoint.read_offsets(path)[(TOPIC, 0)] == 2
        assert not reached.done()
        reporting = asyncio.create_task(follower.fetch_once())  # reports log start 2, parks
        await asyncio.wait_for(reached, 5)
        assert leader.replicas.low_watermark(part) == 2
        reporting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting

    asyncio.run(scenario())


def logs_of_an_earlier_topic(data_dir: Path) -> Path:
    """A data directory left with a record in TOPIC-0 and gone-0, both of an earlier topic id
    (the node was down while they were deleted, and TOPIC created again)."""
    left = LogManager(data_dir)
    left.open()
    for tp in ((TOPIC, 0), ("gone", 0)):
        left.get_or_create_log(tp, topic_id="OOOOOOOOOOOOOOOOOOOOOO").append_as_follower(
            batch(), now_ms=0
        )
    left.shutdown()
    return data_dir


@pytest.mark.parametrize("without_topic_id", [False, True])
def test_logs_of_deleted_topics_are_deleted_as_strays(
    tmp_path: Path, without_topic_id: bool
) -> None:
    """A node that was down while its topics were deleted (and one created again under the
    same name) finds their logs at start-up: the one whose topic id is not the image's is
    replaced by an empty log, and ``delete_stray_logs`` removes those no partition claims
    (Kafka's ``isStrayKraftReplica``)."""
    data_dir = logs_of_an_earlier_topic(tmp_path / "node-2")
    if without_topic_id:
        # A log whose partition.metadata is gone was taken for the new topic's, its records
        # served as the new topic's (isStrayKraftReplica: a stray too).
        (data_dir / f"{TOPIC}-0" / checkpoint.PARTITION_METADATA).unlink()

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        Node(1, tmp_path / "node-1", cluster)
        node = Node(2, data_dir, cluster)
        _start(cluster)  # TOPIC again, with another id
        assert node.partition.log.topic_id == TOPIC_ID
        assert node.partition.log.log_end_offset == 0
        assert node.replicas.delete_stray_logs() == [("gone", 0)]
        assert not (data_dir / "gone-0").exists()
        assert [tp for tp, _ in node.logs] == [(TOPIC, 0)]

    asyncio.run(scenario())


def _a_live_topics_log(data_dir: Path) -> Path:
    """A data directory left with a record in TOPIC-0 of TOPIC_ID, the topic ``_start``
    creates: a live log when the node starts again."""
    left = LogManager(data_dir)
    left.open()
    left.get_or_create_log((TOPIC, 0), topic_id=TOPIC_ID).append_as_follower(batch(), now_ms=0)
    left.shutdown()
    return data_dir / f"{TOPIC}-0"


@pytest.mark.parametrize("damage", ["garbage", "empty", "unreadable"])
def test_a_live_log_whose_partition_metadata_does_not_read_is_offline_not_a_stray(
    tmp_path: Path, damage: str
) -> None:
    """An unreadable partition.metadata was taken for a missing one (a log of no topic): at
    the release the node deleted the live log as a stray and hosted an empty one in its
    place. It is offline now (Kafka's PartitionMetadataFile.read fails the log directory),
    kept, and reported in the heartbeat, so that the controller moves its leadership."""
    directory = _a_live_topics_log(tmp_path / "node-2")
    meta = directory / checkpoint.PARTITION_METADATA
    if damage == "unreadable":
        meta.unlink()
        meta.mkdir()  # reading it raises IsADirectoryError, as an I/O error would
    else:
        meta.write_bytes(b"\x00\xffnot: it" if damage == "garbage" else b"")

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        Node(1, tmp_path / "node-1", cluster)
        node = Node(2, tmp_path / "node-2", cluster)
        assert set(node.logs.offline) == {(TOPIC, 0)}
        _start(cluster)
        assert node.replicas.get_partition(TOPIC, 0) is None
        assert node.replicas.delete_stray_logs() == []
        assert (directory / "00000000000000000000.log").stat().st_size > 0
        reporter = SimpleNamespace(cache=node.cache, logs=node.logs)
        reported = ServerNode._offline_replicas(reporter)  # type: ignore[arg-type]
        assert reported == [(TOPIC_ID, 0)]  # by the id the image gives its name

    asyncio.run(scenario())


def test_a_live_log_a_failed_role_change_left_unhosted_is_not_a_stray(tmp_path: Path) -> None:
    """Strays were the logs this node hosts no partition of: one whose role change failed
    (a bug, caught and logged by the metadata cache) was deleted with its records. They are
    judged by the image, as Kafka's isStrayKraftReplica."""
    directory = _a_live_topics_log(tmp_path / "node-2")

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        Node(1, tmp_path / "node-1", cluster)
        node = Node(2, tmp_path / "node-2", cluster)
        with mock.patch.object(ReplicaManager, "_log_for", side_effect=RuntimeError("a bug")):
            _start(cluster)
        assert node.replicas.get_partition(TOPIC, 0) is None
        assert node.replicas.delete_stray_logs() == []
        assert node.logs.get_log((TOPIC, 0)) is not None
        assert (directory / "00000000000000000000.log").stat().st_size > 0

    asyncio.run(scenario())


def test_logs_being_created_ahead_stop_with_the_node(tmp_path: Path) -> None:
    """A node stopped (its start cancelled) while it created the logs of its metadata image
    on a worker thread let the thread go on: it wrote partition directories for seconds
    after the node had marked a clean shutdown and let its directory's lock go. The thread
    now stops after the log it is making, and the start's cancellation waits for it; what it
    made is registered, for the shutdown to close."""
    node = Node(2, tmp_path / "node-2", {})
    records: list[rec.MetadataRecord] = [rec.Topic("many", "MMMMMMMMMMMMMMMMMMMMMM", {})]
    records += [
        rec.Partition(
            "MMMMMMMMMMMMMMMMMMMMMM", p, NODES, NODES, leader=1, leader_epoch=0, partition_epoch=0
        )
        for p in range(10)
    ]
    opened: list[Path] = []
    second_entered, proceed = threading.Event(), threading.Event()
    real_open = Log.open

    def slow_open(directory: Path, *args: Any, **kwargs: Any) -> Log:
        opened.append(directory)
        if len(opened) == 2:
            second_entered.set()
            assert proceed.wait(10)
        return real_open(directory, *args, **kwargs)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))  # one worker: its end is observable
        with mock.patch.object(Log, "open", slow_open):
            creating = asyncio.create_task(node.replicas.create_logs_ahead(records))
            while not second_entered.is_set():  # bounded by proceed's wait in the thread
                await asyncio.sleep(0.001)
            creating.cancel()
            proceed.set()
            with pytest.raises(asyncio.CancelledError):
                await creating
            await loop.run_in_executor(None, lambda: None)  # the creating thread is done
        assert [d.name for d in opened] == ["many-0", "many-1"]
        assert {tp for tp, _ in node.logs} == {("many", 0), ("many", 1)}
        node.logs.shutdown()

    asyncio.run(scenario())


def test_offline_logs_of_deleted_topics_are_deleted_as_strays(tmp_path: Path) -> None:
    """Logs that failed to open at start-up were never judged: a deleted topic's stayed on
    disk for ever, and one of an earlier topic of a name created again kept the new topic's
    partition unhosted here for good."""
    data_dir = logs_of_an_earlier_topic(tmp_path / "node-2")
    for name in (f"{TOPIC}-0", "gone-0"):  # a directory where a segment should be
        segment = data_dir / name / "00000000000000000000.log"
        segment.unlink()
        segment.mkdir()

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        Node(1, tmp_path / "node-1", cluster)
        node = Node(2, data_dir, cluster)
        assert set(node.logs.offline) == {(TOPIC, 0), ("gone", 0)}
        _start(cluster)  # TOPIC again, with another id
        assert node.partition.log.topic_id == TOPIC_ID
        assert node.replicas.delete_stray_logs() == [("gone", 0)]
        assert not (data_dir / "gone-0").exists() and not node.logs.offline
        assert [tp for tp, _ in node.logs] == [(TOPIC, 0)]

    asyncio.run(scenario())


def test_an_offline_log_of_a_topic_deleted_while_the_node_runs_is_deleted(
    tmp_path: Path,
) -> None:
    """A partition offline since start-up is not hosted, so its topic's deletion stopped
    nothing and left its directory until the node's next start (delete_stray_logs)."""
    directory = _a_live_topics_log(tmp_path / "node-2")
    segment = directory / "00000000000000000000.log"
    segment.unlink()
    segment.mkdir()  # a directory where a segment should be: offline at start-up

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        Node(1, tmp_path / "node-1", cluster)
        node = Node(2, tmp_path / "node-2", cluster)
        _start(cluster)
        assert set(node.logs.offline) == {(TOPIC, 0)}
        assert node.replicas.get_partition(TOPIC, 0) is None
        for n in cluster.values():
            n.cache.apply(2, [rec.RemoveTopic(TOPIC_ID)])
        assert not node.logs.offline
        assert not directory.exists()

    asyncio.run(scenario())


def test_high_watermarks_of_logs_not_hosted_yet_stay_checkpointed(tmp_path: Path) -> None:
    """The periodic checkpoint before the metadata catch-up wrote an empty file: a crash then
    started every partition's HW from its log start."""
    left = LogManager(tmp_path)
    left.open()
    left.get_or_create_log((TOPIC, 0), topic_id=TOPIC_ID).append_as_follower(batch(), 0)
    left.write_high_watermarks({(TOPIC, 0): 1, ("gone", 0): 7})
    left.shutdown()
    node = Node(2, tmp_path, {})
    node.replicas.checkpoint_high_watermarks()  # nothing hosted yet
    assert node.logs.read_high_watermarks() == {(TOPIC, 0): 1}  # no log of "gone" is left


NEW_TOPIC_ID = "DDDDDDDDDDDDDDDDDDDDDD"


def _recreated() -> list[rec.MetadataRecord]:
    """The topic deleted and created again under its name (id NEW_TOPIC_ID), led by node 1."""
    return [
        rec.RemoveTopic(TOPIC_ID),
        rec.Topic(TOPIC, NEW_TOPIC_ID, {}),
        rec.Partition(NEW_TOPIC_ID, 0, NODES, NODES, leader=1, leader_epoch=0, partition_epoch=0),
    ]


def test_a_restart_replaying_a_topic_deleted_and_created_again_keeps_the_new_topics_log(
    tmp_path: Path,
) -> None:
    """The metadata log holds topic t created (id A), deleted, and created again (id B). A
    node restarted on B's log replayed A's creation first, took B's log for a stray of A and
    deleted it: a restart of every replica lost the topic. Its cache holds the replay now and
    publishes the image at its catch-up, as Kafka's MetadataLoader (MetadataCache.release)."""

    async def scenario() -> None:
        cluster, leader, _follower = await _two_nodes_with_committed(tmp_path, b"old-%d", 2)
        recreated = _recreated()
        for node in cluster.values():
            node.cache.apply(2, list(recreated))
        for value in (b"a", b"b", b"c"):
            leader.produce(value)
        leader.logs.shutdown()

        restarted = Node(1, tmp_path / "node-1", {})
        restarted.cache.holding = True  # as the node starts it
        _start({1: restarted})  # the replay: topic A first
        restarted.cache.apply(2, list(recreated))
        restarted.cache.release()
        assert restarted.partition.topic_id == NEW_TOPIC_ID
        assert restarted.values() == [b"a", b"b", b"c"]

    asyncio.run(scenario())


def test_a_restarted_leader_serves_no_follower_before_it_has_caught_up(tmp_path: Path) -> None:
    """Node 1 restarts on an empty disk (lost) before the controller has fenced it: replaying
    the metadata log made it the leader of epoch 0 again, on an empty log, and its RPC server
    answers before its Kafka listener opens. A follower fetching then was told its epoch ends
    at 0 and truncated every committed record. Its metadata cache now holds the replay until
    the node has caught up (the controller acknowledged its new registration, having moved its
    leaderships away first): it hosts nothing, followers get NOT_LEADER_OR_FOLLOWER, as Kafka's
    broker serves nothing before its initial catch-up, and no HW the replay gave is
    checkpointed."""

    async def scenario() -> None:
        cluster, _, follower = await _two_nodes_with_committed(tmp_path, b"r%d", 3)
        restarted = Node(1, tmp_path / "node-1-lost", cluster)
        restarted.cache.holding = True  # as the node starts it
        _start({1: restarted})  # its replay: it led epoch 0
        assert restarted.replicas.get_partition(TOPIC, 0) is None
        for _ in range(3):  # the old session is gone: the second fetch is a full one
            await follower.fetch_once()
        assert follower.values() == [b"r0", b"r1", b"r2"]
        answer = await restarted.replicas.handle_epoch_end_offset(
            {
                "replica_id": 2,
                "partitions": [{"topic": TOPIC, "partition": 0, "leader_epoch": 0, "epoch": 0}],
            }
        )
        assert answer["partitions"][0]["error"] == Errors.NOT_LEADER_OR_FOLLOWER
        restarted.replicas.checkpoint_high_watermarks()
        assert restarted.logs.read_high_watermarks() == {}
        restarted.cache.release()  # caught up (here with the image it replayed)
        assert restarted.partition.is_leader and restarted.partition.log.log_end_offset == 0
        restarted.replicas.checkpoint_high_watermarks()
        assert restarted.logs.read_high_watermarks() == {(TOPIC, 0): 0}

    asyncio.run(scenario())


def test_a_log_opened_at_start_up_takes_its_topics_configs(tmp_path: Path) -> None:
    """The node opens the logs on its disk with its defaults before it reads the metadata
    image; hosting the partition gives the log the topic's configs (they were lost on every
    restart: a compacted topic went uncompacted and under time retention)."""
    data_dir = tmp_path / "node-1"
    left = LogManager(data_dir)
    left.open()
    left.get_or_create_log((TOPIC, 0), topic_id=TOPIC_ID).append_as_follower(batch(), now_ms=0)
    left.shutdown()

    node = Node(1, data_dir, {})
    assert node.logs.get_log((TOPIC, 0)) is not None  # opened from disk, with the defaults
    configs = {"cleanup.policy": "compact", "max.message.bytes": "2000"}
    node.cache.apply(
        1,
        [
            rec.RegisterBroker(
                broker_id=1, incarnation_id="i1", broker_epoch=1, endpoints={}, fenced=False
            ),
            rec.Topic(TOPIC, TOPIC_ID, configs),
            rec.Partition(TOPIC_ID, 0, (1,), (1,), leader=1, leader_epoch=0, partition_epoch=0),
        ],
    )
    config = node.partition.log.config
    assert (config.compact, config.delete, config.max_message_bytes) == (True, False, 2000)
    assert node.partition.log.log_end_offset == 1


def test_a_fetch_session_names_only_the_partitions_that_moved(tmp_path: Path) -> None:
    """KIP-227 between the fetcher and the leader: after the full first request, a request
    names only the partitions whose fetch state changed, and the leader still serves both.
    A leader that lost the session (a restart) refuses the next request; the follower starts
    a new session with a full request and replication goes on."""

    async def scenario() -> None:
        leader, follower, parts = _two_partitions(tmp_path)

        async def fetch() -> dict[str, Any]:
            await follower.fetchers._step(1, parts)
            method, payload = follower.fetchers.sent[-1]
            assert method == "ReplicaFetch"
            return cast(dict[str, Any], payload)

        def named(payload: dict[str, Any]) -> list[int]:
            return [int(p["partition"]) for p in payload["partitions"]]

        leader.produce(b"a")  # partition 0 only
        full = await fetch()
        assert (full["session_epoch"], named(full)) == (0, [0, 1])
        assert follower.values() == [b"a"]
        moved = await fetch()  # partition 0's fetch offset moved (and with it the HW)
        assert (moved["session_epoch"], named(moved)) == (1, [0])
        assert leader.partition.high_watermark == 1

        leader.replicas.fetch_sessions = type(leader.replicas.fetch_sessions)()  # restarted
        leader.produce(b"b")
        refused = await fetch()
        assert refused["session_epoch"] == 2 and follower.values() == [b"a"]
        again = await fetch()
        assert (again["session_epoch"], named(again)) == (0, [0, 1])
        assert (len(leader.replicas.fetch_sessions), leader.replicas.fetch_sessions.opened) == (
            1,
            1,
        )
        assert follower.values() == [b"a", b"b"]

    asyncio.run(scenario())


def test_a_skipped_fetch_counts_for_the_isr_when_the_partition_next_moves(tmp_path: Path) -> None:
    """The leader skips a session's partitions that neither moved nor changed; a follower at
    the log end is then recorded as at its latest fetch when the partition next gets records,
    so falling behind after a long idle spell is not mistaken for lagging all along (Kafka
    records every partition on every fetch; fails without ``_record_skipped_fetches``)."""

    async def scenario() -> None:
        now = [1_000_000]
        cluster: dict[int, Node] = {}
        leader, follower = (
            Node(n, tmp_path / f"node{n}", cluster, clock=lambda: now[0]) for n in NODES
        )
        leader.replicas.fetch_sessions.full_pass_interval_ms = 10**9  # no full pass here
        follower.fetchers.max_wait_ms = 0  # answered at once: nothing parks
        _start(cluster)
        parts = [follower.partition]
        leader.produce(b"a")
        for _ in range(3):  # the record, the HW that fetch moved, the follower's new HW
            await follower.fetchers._step(1, parts)
        replication = leader.partition.replication
        assert replication is not None
        state = replication.followers[2]
        assert (state.log_end_offset, state.last_fetch_ms) == (1, 1_000_000)

        lag_ms = leader.replicas.replica_lag_time_max_ms
        now[0] += 2 * lag_ms
        await follower.fetchers._step(1, parts)
        assert follower.fetchers.sent[-1][1]["partitions"] == []  # it names nothing
        assert state.last_fetch_ms == 1_000_000  # and the leader looked at nothing

        leader.produce(b"b")
        assert (state.last_fetch_ms, state.last_caught_up_ms) == (now[0], now[0])
        assert replication.shrink_candidates(2, now[0]) == set()
        assert replication.shrink_candidates(2, now[0] + lag_ms + 1) == {2}  # it fetches no more

    asyncio.run(scenario())


def test_a_log_start_nothing_marked_reaches_the_follower_at_the_next_full_pass(
    tmp_path: Path,
) -> None:
    """A leader's log start moved by retention marks no session; the next request that comes
    ``FULL_PASS_INTERVAL_MS`` after the session's previous full pass looks at every partition
    and tells the follower. Likewise a follower's own retention: its fetcher rebuilds every
    partition's fetch state every ``FULL_REBUILD_INTERVAL_S`` and the leader learns it."""

    async def scenario() -> None:
        now = [1_000_000]
        cluster: dict[int, Node] = {}
        leader, follower = (
            Node(n, tmp_path / f"node{n}", cluster, clock=lambda: now[0]) for n in NODES
        )
        follower.fetchers.max_wait_ms = 0
        _start(cluster)
        parts = [follower.partition]
        for value in (b"a", b"b", b"c"):
            leader.produce(value)
        for _ in range(3):  # the records, the HW that fetch moved, the follower's new HW
            await follower.fetchers._step(1, parts)
        assert follower.partition.high_watermark == 3

        assert leader.partition.log.maybe_increment_log_start_offset(1)  # retention, say
        await follower.fetchers._step(1, parts)
        assert follower.partition.log.log_start_offset == 0  # not looked at yet
        now[0] += FULL_PASS_INTERVAL_MS
        await follower.fetchers._step(1, parts)
        assert follower.partition.log.log_start_offset == 1
        await follower.fetchers._step(1, parts)  # which the follower reports
        assert leader.partition.follower_log_starts[2] == 1

        assert follower.partition.log.maybe_increment_log_start_offset(2)  # its own retention
        await follower.fetchers._step(1, parts)
        assert follower.fetchers.sent[-1][1]["partitions"] == []
        follower.fetchers._fetch_states[1].rebuild_all_at = 0.0  # FULL_REBUILD_INTERVAL_S on
        await follower.fetchers._step(1, parts)
        named = follower.fetchers.sent[-1][1]["partitions"]
        assert [p["log_start_offset"] for p in named] == [2]
        assert leader.partition.follower_log_starts[2] == 2

    asyncio.run(scenario())


def test_records_that_did_not_fit_an_answer_come_with_the_next_one(tmp_path: Path) -> None:
    """A partition the leader read nothing of because the answer was full stays pending: the
    follower's next request names only the partition it applied, nothing is appended in
    between, and still the other partition's records come (fails if the leader does not keep
    such a partition dirty)."""

    async def scenario() -> None:
        leader, follower, parts = _two_partitions(tmp_path)
        follower.fetchers.max_bytes = 1  # one batch an answer (the first one, whole)
        for p in (0, 1):
            leader.replicas.append_local(
                leader.replicas.partitions[(TOPIC, p)], batch(value=b"v%d" % p), required_acks=1
            )
        ends: list[tuple[int, int]] = []
        for _ in range(2):
            await follower.fetchers._step(1, parts)
            ends.append((parts[0].log.log_end_offset, parts[1].log.log_end_offset))
        assert ends == [(1, 0), (1, 1)]
        assert [int(p["partition"]) for p in follower.fetchers.sent[-1][1]["partitions"]] == [0]

    asyncio.run(scenario())


def test_only_the_first_partition_read_may_go_past_the_answers_byte_limit(
    tmp_path: Path,
) -> None:
    """KIP-74: the first batch read may be bigger than what the answer has room for, so that a
    follower always gets on; the partitions after it get only what fits. Each partition read
    while any room was left took a whole batch beyond it (Kafka's readFromLocalLog clears
    minOneMessage once a partition returned records)."""

    async def scenario() -> None:
        leader, follower, parts = _two_partitions(tmp_path)
        for p in (0, 1):
            leader.replicas.append_local(
                leader.replicas.partitions[(TOPIC, p)],
                batch(value=b"v" * 1000),
                required_acks=1,
            )
        size = leader.replicas.partitions[(TOPIC, 0)].log.size_bytes
        follower.fetchers.max_bytes = size + 100  # room for one batch, and part of another
        await follower.fetchers._step(1, parts)
        assert (parts[0].log.log_end_offset, parts[1].log.log_end_offset) == (1, 0)
        await follower.fetchers._step(1, parts)
        assert (parts[0].log.log_end_offset, parts[1].log.log_end_offset) == (1, 1)

    asyncio.run(scenario())


def test_under_sustained_load_every_partition_gets_its_turn_at_a_full_answer(
    tmp_path: Path,
) -> None:
    """Each round both partitions get a batch and an answer holds one: the partition first in
    the session's (fixed) order took every answer and the other none, until it fell out of
    the ISR. A partition left out for want of room goes first next time (Kafka moves a
    partition that returned records to the end of the session)."""

    async def scenario() -> None:
        leader, follower, parts = _two_partitions(tmp_path, count=4)
        follower.fetchers.max_bytes = 1  # one batch an answer (the first one, whole)
        lead = [leader.replicas.partitions[(TOPIC, p)] for p in range(4)]
        for _ in range(40):
            for part in lead:
                leader.replicas.append_local(part, batch(value=b"v"), required_acks=1)
            await follower.fetchers._step(1, parts)
        ends = [p.log.log_end_offset for p in parts]
        assert min(ends) >= 8, ends  # 40 answers of one batch, shared out

    asyncio.run(scenario())


def _elect(
    cluster: dict[int, Node], offset: int, expected_partition_epoch: int, leader: int
) -> None:
    """A clean election: ``leader`` (in the ISR of both nodes) leads the next leader epoch."""
    change = rec.PartitionChange(
        TOPIC_ID, 0, expected_partition_epoch=expected_partition_epoch, leader=leader, isr=NODES
    )
    for node in cluster.values():
        node.cache.apply(offset, [change])


async def _three_records_fetched(tmp_path: Path) -> tuple[dict[int, Node], Node, Node]:
    """Nodes 1 (leading) and 2 started; three records produced and fetched once by 2."""
    cluster: dict[int, Node] = {}
    n1, n2 = (Node(n, tmp_path / f"node-{n}", cluster) for n in NODES)
    _start(cluster)
    for i in range(3):
        n1.produce(b"r%d" % i)
    await n2.fetch_once()
    return cluster, n1, n2


def test_a_new_leader_knows_its_epoch_before_its_first_append(tmp_path: Path) -> None:
    """Fast successive elections: node 2 led epoch 1 and wrote a record node 1 never saw; node
    1 leads epoch 2 and has appended nothing yet. Asked where epoch 1 ends, it answers with
    epoch 0 ending at its log end (Kafka's makeLeader assigns the epoch's start offset at
    once), so node 2 cuts only its epoch-1 record, not back to its HW (0 here), which would
    throw away records both nodes hold."""

    async def scenario() -> None:
        cluster, n1, n2 = await _three_records_fetched(tmp_path)
        assert n2.partition.log.log_end_offset == 3 and n2.partition.high_watermark == 0
        _elect(cluster, 2, 0, leader=2)
        n2.produce(b"x")  # offset 3, epoch 1
        _elect(cluster, 3, 1, leader=1)
        assert n1.partition.leader_epoch == 2
        assert n1.partition.log.epoch_cache.entries == [(0, 0), (2, 3)]

        await n2.fetch_once()
        assert [m for m, _ in n2.fetchers.sent[-2:]] == ["EpochEndOffset", "ReplicaFetch"]
        fetch = n2.fetchers.sent[-1][1]["partitions"][0]
        assert (fetch["fetch_offset"], fetch["last_fetched_epoch"]) == (3, 0)
        assert n2.values() == [b"r0", b"r1", b"r2"]
        n1.produce(b"y")
        await n2.fetch_once()
        assert n2.values() == [b"r0", b"r1", b"r2", b"y"]
        assert n2.partition.log.epoch_cache.entries == [(0, 0), (2, 3)]

    asyncio.run(scenario())


def test_a_leader_that_appended_nothing_drops_its_epoch_when_it_follows(tmp_path: Path) -> None:
    """Node 2 led epoch 1 and appended nothing: its epoch cache says epoch 1 starts at its log
    end. Following node 1 in epoch 2, it truncates nothing but that entry (Kafka's
    ``UnifiedLog.truncateTo`` at the log end), then fetches from epoch 0's end; kept, the entry
    would make every fetch diverge."""

    async def scenario() -> None:
        cluster, n1, n2 = await _two_nodes_with_committed(tmp_path, b"r%d", 3)
        _elect(cluster, 2, 0, leader=2)
        assert n2.partition.log.epoch_cache.entries == [(0, 0), (1, 3)]
        _elect(cluster, 3, 1, leader=1)
        n1.produce(b"y")

        await n2.fetch_once()
        assert not n2.partition.truncation_pending
        fetch = n2.fetchers.sent[-1][1]["partitions"][0]
        assert (fetch["fetch_offset"], fetch["last_fetched_epoch"]) == (3, 0)
        assert n2.values() == [b"r0", b"r1", b"r2", b"y"]
        assert n2.partition.log.epoch_cache.entries == [(0, 0), (2, 3)]

    asyncio.run(scenario())


def test_min_insync_replicas_above_the_replication_factor_is_capped(tmp_path: Path) -> None:
    """``min.insync.replicas=2`` on a one-replica partition (say ``__consumer_offsets`` made
    while one broker was up): Kafka's ``Partition.effectiveMinIsr`` caps it at the
    replication factor, so the HW moves and acks=all is taken, not refused forever."""

    async def scenario() -> None:
        logs = LogManager(tmp_path / "node-1")
        logs.open()
        cache = MetadataCache(1, listener=_NoRoles())
        replicas = ReplicaManager(1, logs, cache, lambda: 1_000_000, min_insync_replicas=2)
        cache.listener = replicas
        cache.apply(
            1,
            [
                rec.RegisterBroker(
                    broker_id=1, incarnation_id="i1", broker_epoch=1, endpoints={}, fenced=False
                ),
                rec.Topic(TOPIC, TOPIC_ID, {}),
                rec.Partition(TOPIC_ID, 0, (1,), (1,), leader=1, leader_epoch=0, partition_epoch=0),
            ],
        )
        part = replicas.get_partition(TOPIC, 0)
        assert part is not None
        assert replicas.min_insync_replicas_for(part) == 1
        replicas.append_local(part, batch(value=b"v"), required_acks=1)
        assert part.high_watermark == part.log.log_end_offset == 1
        replicas.append_local(part, batch(value=b"w"), required_acks=-1)
        assert part.high_watermark == 2

    asyncio.run(scenario())


def test_a_segment_bytes_stored_before_kip_1030_keeps_its_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment.bytes below 1 MiB committed before that bound came (it was 14) was dropped as
    one this node refuses, and the log rolled at 1 GiB: its segments, and what retention of
    whole segments frees, silently grew. It is read as internal.segment.bytes."""
    logs = LogManager(tmp_path / "node-1")
    logs.open()
    cache = MetadataCache(1, listener=_NoRoles())
    replicas = ReplicaManager(1, logs, cache, lambda: 1_000_000)
    assert replicas.log_config_for({"segment.bytes": "65536"}).segment_bytes == 65536
    assert "ignoring topic config" not in caplog.text
    both = {"segment.bytes": "65536", "internal.segment.bytes": "4096"}
    assert replicas.log_config_for(both).segment_bytes == 4096
    assert replicas.log_config_for({"segment.bytes": "2097152"}).segment_bytes == 2097152
    logs.close()


def test_a_stored_topic_config_this_node_refuses_leaves_the_others_applied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A topic config in the metadata log this node's version refuses (one a newer
    controller implements, an unknown name, a value out of this version's bounds) dropped
    every config of the topic: a compacted topic kept forever became one deleted after seven
    days, on this replica alone. The others are applied, at creation and on a change."""
    logs = LogManager(tmp_path / "node-1")
    logs.open()
    cache = MetadataCache(1, listener=_NoRoles())
    replicas = ReplicaManager(1, logs, cache, lambda: 1_000_000)
    cache.listener = replicas
    cache.delta_listeners.append(replicas.on_metadata_delta)  # as the node wires them
    stored = {"cleanup.policy": "compact", "retention.ms": "-1"}
    for refused in ({"preallocate": "true"}, {"remote.copy.lag.ms": "0"}, {"segment.bytes": "1"}):
        config = replicas.log_config_for({**stored, **refused})
        assert (config.cleanup_policy, config.retention_ms) == (frozenset({"compact"}), -1)
        assert f"ignoring topic config {next(iter(refused))}" in caplog.text
    cache.apply(
        1,
        [
            rec.RegisterBroker(
                broker_id=1, incarnation_id="i1", broker_epoch=1, endpoints={}, fenced=False
            ),
            rec.Topic(TOPIC, TOPIC_ID, {**stored, "preallocate": "true"}),
            rec.Partition(TOPIC_ID, 0, (1,), (1,), leader=1, leader_epoch=0, partition_epoch=0),
        ],
    )
    part = replicas.get_partition(TOPIC, 0)
    assert part is not None and part.log.config.compact and part.log.config.retention_ms == -1
    cache.apply(
        2,
        [
            rec.Config(rec.ConfigResourceType.TOPIC, TOPIC, "retention.ms", "5"),
            rec.Config(rec.ConfigResourceType.TOPIC, TOPIC, "x.y", "1"),
        ],
    )
    assert part.log.config.compact and part.log.config.retention_ms == 5


def test_a_high_watermark_checkpointed_below_the_log_start_is_raised_to_it(
    tmp_path: Path,
) -> None:
    """The log start reaches its checkpoint at once (DeleteRecords), the HW every few
    seconds: after a crash between the two, the HW loaded is below the log start. Kafka's
    updateHighWatermark bounds it by the log start (else answers show a HW below the log
    start, and a follower truncating to it threw its whole log away)."""

    async def scenario() -> None:
        logs = LogManager(tmp_path / "node-1")
        logs.open()
        lg = logs.get_or_create_log((TOPIC, 0), topic_id=TOPIC_ID)
        for _ in range(10):
            lg.append_as_leader(batch(value=b"v"), leader_epoch=0, now_ms=0)
        assert lg.maybe_increment_log_start_offset(8)
        logs.checkpoint_log_start_offsets()
        logs.write_high_watermarks({(TOPIC, 0): 3})
        logs.checkpoint_recovery_points()  # and the process dies
        again = LogManager(tmp_path / "node-1")
        again.open()
        cache = MetadataCache(1, listener=_NoRoles())
        replicas = ReplicaManager(1, again, cache, lambda: 1_000_000)
        cache.listener = replicas
        cache.apply(
            1,
            [
                rec.RegisterBroker(
                    broker_id=1, incarnation_id="i1", broker_epoch=1, endpoints={}, fenced=False
                ),
                rec.Topic(TOPIC, TOPIC_ID, {}),
                rec.Partition(
                    TOPIC_ID, 0, (1, 2), (1, 2), leader=1, leader_epoch=1, partition_epoch=0
                ),
            ],
        )
        part = replicas.get_partition(TOPIC, 0)
        assert part is not None and part.log.log_start_offset == 8
        assert part.high_watermark == 8

    asyncio.run(scenario())


def test_a_lower_cluster_wide_min_insync_replicas_lets_a_held_hw_move(tmp_path: Path) -> None:
    """The cluster's dynamic ``min.insync.replicas`` (``kafka-configs --entity-default``):
    while the ISR (node 1 alone) is below it the HW stays; lowered, the HW moves at once, not
    at the partition's next append."""
    now = [1_000_000]

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        n1, _ = (Node(n, tmp_path / f"node-{n}", cluster, clock=lambda: now[0]) for n in NODES)
        _start(cluster)
        part = n1.partition
        assert part.replication is not None

        def cluster_min_isr(offset: int, value: str) -> None:
            config = rec.Config(int(ConfigResourceType.BROKER), "", "min.insync.replicas", value)
            for node in cluster.values():
                node.cache.apply(offset, [config])

        cluster_min_isr(2, "2")
        now[0] += part.replication.replica_lag_time_max_ms + 1  # node 2 never fetched
        shrink = rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=0, isr=(1,))
        for node in cluster.values():
            node.cache.apply(3, [shrink])
        assert part.isr == (1,) and part.leader_epoch == 0
        n1.produce(b"a")
        assert part.high_watermark == 0
        cluster_min_isr(4, "1")
        assert part.high_watermark == 1

    asyncio.run(scenario())


def test_an_isr_change_whose_outcome_is_unknown_stays_in_flight_until_the_metadata_says(
    tmp_path: Path,
) -> None:
    """Node 1 proposes adding node 2 to the ISR and gets no answer: the controller may have
    committed it, and node 2 may then be elected. The change stays in flight (its maximal ISR
    holds the HW to node 2's log, KIP-497) and is sent again as it was, as Kafka's
    AlterPartitionManager does; the answer to the resend (the partition epoch moved: it was
    applied) and then the metadata update end it. Dropped, as before, the HW would have moved
    on node 1's log alone while the controller counted node 2 in the ISR."""

    async def scenario() -> None:
        now = [1_000_000]
        sent: list[dict[str, Any]] = []
        outcomes: list[dict[str, Any] | Exception] = []

        async def alter_partition(payload: dict[str, Any]) -> dict[str, Any]:
            sent.append(payload)
            outcome = outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        async def propose() -> None:
            n1.replicas.maybe_propose_isr_changes()
            await asyncio.gather(*n1.replicas._isr_tasks)

        cluster: dict[int, Node] = {}
        n1 = Node(
            1, tmp_path / "n1", cluster, clock=lambda: now[0], alter_partition=alter_partition
        )
        n2 = Node(2, tmp_path / "n2", cluster, clock=lambda: now[0])
        _start(cluster, isr=(1,))
        n1.produce(b"a")
        await n2.fetch_once()
        await n2.fetch_once()  # node 2 has caught up
        repl = n1.partition.replication
        assert repl is not None and repl.isr == (1,)

        outcomes.append(ConnectionError("the controller's connection was reset"))
        await propose()
        assert [p["new_isr"] for p in sent[0]["partitions"]] == [[[1, 1], [2, 1]]]
        assert repl.pending_isr == (1, 2)
        assert repl.maximal_isr == frozenset(NODES)

        now[0] += ISR_CHANGE_RETRY_BACKOFF_MS
        stale = {"topic_id": TOPIC_ID, "partition": 0, "error": int(Errors.INVALID_UPDATE_VERSION)}
        outcomes.append({"error": 0, "partitions": [stale]})
        await propose()
        assert len(sent) == 2 and sent[1]["partitions"] == sent[0]["partitions"]
        assert repl.pending_isr == (1, 2)

        change = rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=0, isr=NODES)
        for node in cluster.values():
            node.cache.apply(2, [change])
        assert repl.pending_isr is None and repl.isr == NODES
        now[0] += 2 * ISR_CHANGE_METADATA_WAIT_MS
        await propose()
        assert len(sent) == 2

    asyncio.run(scenario())


def test_an_isr_change_is_sent_again_after_its_backoff_whatever_the_wall_clock_does(
    tmp_path: Path,
) -> None:
    """The retry delay of an ISR change whose outcome is unknown was a wall-clock deadline: a
    clock stepped back an hour held the change in flight, and with it the HW (its maximal
    ISR counts), for an hour. It is timed on the monotonic clock now, as Kafka's
    AlterPartitionManager retries on its scheduler."""

    async def scenario() -> None:
        wall, monotonic = [1_000_000_000], [5_000]
        sent: list[dict[str, Any]] = []

        async def alter_partition(payload: dict[str, Any]) -> dict[str, Any]:
            sent.append(payload)
            raise ConnectionError("the controller's connection was reset")

        async def propose() -> None:
            n1.replicas.maybe_propose_isr_changes()
            await asyncio.gather(*n1.replicas._isr_tasks)

        cluster: dict[int, Node] = {}
        n1 = Node(
            1,
            tmp_path / "n1",
            cluster,
            clock=lambda: wall[0],
            monotonic=lambda: monotonic[0],
            alter_partition=alter_partition,
        )
        n2 = Node(2, tmp_path / "n2", cluster, clock=lambda: wall[0])
        _start(cluster, isr=(1,))
        n1.produce(b"a")
        await n2.fetch_once()
        await n2.fetch_once()  # node 2 has caught up: node 1 proposes it for the ISR
        await propose()
        assert len(sent) == 1
        wall[0] -= 3_600_000  # an NTP step back
        monotonic[0] += ISR_CHANGE_RETRY_BACKOFF_MS
        await propose()
        assert len(sent) == 2 and sent[1]["partitions"] == sent[0]["partitions"]

    asyncio.run(scenario())


def test_a_follower_restarted_inside_a_batch_takes_the_batch_whole(tmp_path: Path) -> None:
    """DeleteRecords put the leader's log start at 1, inside its batch 0-2. A follower that
    must restart its log there fetches that batch whole, from 0: refused as below its log
    end, it fetched it again every 200 ms for ever. The log now starts at the batch, and the
    leader's log start applies after the append (Kafka's appendRecordsToFollowerOrFutureReplica)."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"n{n}", cluster) for n in NODES)
        _start(cluster, isr=(1,))  # the follower is out of the ISR: the HW is the leader's LEO
        leader.replicas.append_local(leader.partition, batch(3), required_acks=1)
        leader.replicas.delete_records(TOPIC, 0, 1)
        assert leader.partition.log.log_start_offset == 1
        for _ in range(3):
            await follower.fetch_once()
            follower.fetchers._backoff_until.clear()
        log = follower.partition.log
        assert (log.log_start_offset, log.log_end_offset) == (1, 3)

    asyncio.run(scenario())


def test_a_follower_holding_records_below_the_leaders_log_start_takes_the_batch_too(
    tmp_path: Path,
) -> None:
    """As above, but the follower's log is not empty: it holds a record the new leader never
    had, below the leader's log start, and its log end is that start. Truncation left it
    (the leader's first epoch starts there), the batch from below was refused, and the
    follower asked again for ever (a read-only review's randomized simulator found it in 1-2%
    of its runs with DeleteRecords). Nothing the follower holds is on the leader any more:
    its log restarts at the batch."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        old_leader, new_leader = (Node(n, tmp_path / f"n{n}", cluster) for n in NODES)
        _start(cluster)
        old_leader.produce(b"never replicated")  # acks=1 on node 1, epoch 0
        _fail_over_to(cluster, leader=2)
        new_leader.replicas.append_local(new_leader.partition, batch(3), required_acks=1)
        new_leader.replicas.delete_records(TOPIC, 0, 1)  # inside its batch 0-2
        for _ in range(3):
            await old_leader.fetch_once()
            old_leader.fetchers._backoff_until.clear()
        log = old_leader.partition.log
        assert (log.log_start_offset, log.log_end_offset) == (1, 3)
        assert [r.value for r in read_all(log)] == [b"v", b"v"]

    asyncio.run(scenario())


def test_a_follower_takes_a_batch_larger_than_its_own_limit(tmp_path: Path) -> None:
    """The leader took a 5 KB batch; then the topic's max.message.bytes went down to 1000. The
    follower refused the batch on every fetch, and every partition after it in the same answer
    waited with it; a follower takes what its leader accepted (UnifiedLog.appendAsFollower's
    ignoreRecordSize)."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"n{n}", cluster) for n in NODES)
        _start(cluster)
        leader.produce(b"x" * 5000)
        lowered = rec.Config(ConfigResourceType.TOPIC, TOPIC, "max.message.bytes", "1000")
        for node in cluster.values():
            node.cache.apply(2, [lowered])
        assert follower.partition.log.config.max_message_bytes == 1000
        await follower.fetch_once()
        assert follower.partition.log.log_end_offset == 1

    asyncio.run(scenario())


def test_a_deleted_partition_is_forgotten_by_the_fetch_turns(tmp_path: Path) -> None:
    """The leader notes, per follower, when each partition last had records in an answer (whose
    turn comes first when answers run out of room); a partition no longer hosted stayed named
    there for good, one entry per partition of every topic ever deleted."""

    async def scenario() -> None:
        _cluster, leader, _follower = await _two_nodes_with_committed(tmp_path, b"r%d", 2)
        assert (TOPIC, 0) in leader.replicas._served_by_replica[2]
        leader.cache.apply(2, [rec.RemoveTopic(TOPIC_ID)])
        assert leader.replicas._served_by_replica[2] == {}

    asyncio.run(scenario())


def test_a_follower_of_a_deleted_topic_does_not_count_for_its_successor(tmp_path: Path) -> None:
    """The leader has seen the topic deleted and created again under its name (leader epoch
    0, like the old one); the follower has not, and fetches for its old log at offset 2. Its
    position counted for the new topic: two acks=all writes were answered that only the
    leader held, and the follower's new log was empty once it caught up (KIP-516's topic id
    check, INCONSISTENT_TOPIC_ID, as Kafka's readFromLocalLog)."""

    async def scenario() -> None:
        _cluster, leader, follower = await _two_nodes_with_committed(tmp_path, b"old-%d", 2)
        recreated = _recreated()
        leader.cache.apply(2, recreated)
        part = leader.partition
        acked = []
        for value in (b"new-0", b"new-1", b"new-2"):
            appended = leader.replicas.append_local(part, batch(value=value), required_acks=-1)
            acked.append(part.high_watermark_reached(appended.last_offset + 1))
        await follower.fetch_once()
        assert part.high_watermark == 0 and not any(f.done() for f in acked)
        assert follower.values() == [b"old-0", b"old-1"]  # nothing of the new topic's went in
        follower.cache.apply(2, recreated)
        follower.fetchers._backoff_until.clear()
        await follower.fetch_once()
        assert follower.values() == [b"new-0", b"new-1", b"new-2"]

    asyncio.run(scenario())


def _three_nodes(tmp_path: Path) -> tuple[dict[int, Node], list[rec.MetadataRecord]]:
    cluster: dict[int, Node] = {}
    for n in (1, 2, 3):
        Node(n, tmp_path / f"n{n}", cluster)
    records: list[rec.MetadataRecord] = [
        rec.RegisterBroker(
            broker_id=n, incarnation_id=f"i{n}", broker_epoch=1, endpoints={}, fenced=False
        )
        for n in (1, 2, 3)
    ]
    records += [
        rec.Topic(TOPIC, TOPIC_ID, {}),
        rec.Partition(
            TOPIC_ID, 0, (1, 2, 3), (1, 2, 3), leader=1, leader_epoch=0, partition_epoch=0
        ),
    ]
    for node in cluster.values():
        node.cache.apply(1, records)
    return cluster, records


def test_a_follower_killed_before_its_epoch_checkpoint_still_truncates_a_divergent_record(
    tmp_path: Path,
) -> None:
    """A follower appended a batch of epoch 1 and was killed before its leader-epoch
    checkpoint named epoch 1. Restarted, its log recovery gives the batch's epoch back to the
    cache (Kafka's LogSegment.recover): without it, the follower asked where epoch 0 ends,
    kept its epoch-1 record where the leader had committed another, and counted as in sync."""

    async def scenario() -> None:
        cluster, records = _three_nodes(tmp_path)
        n1, n2, n3 = cluster[1], cluster[2], cluster[3]
        n1.produce(b"r0")
        n1.produce(b"r1")
        await n2.fetch_once()
        await n3.fetch_once()
        n1.produce(b"a0")  # offset 2, epoch 0: node 3 takes it, node 2 does not
        await n3.fetch_once()
        to_2 = rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=0, leader=2)
        for node in cluster.values():
            node.cache.apply(2, [to_2])
        n2.produce(b"m0")  # offset 2, epoch 1, never committed
        await n3.fetch_once()  # node 3 truncates a0 and takes m0
        assert n3.values() == [b"r0", b"r1", b"m0"]
        assert n3.partition.log.epoch_cache.entries == [(0, 0), (1, 2)]
        # Node 3 is killed after the segment write, before the checkpoint write.
        checkpoint.write_leader_epochs(n3.partition.log.epoch_cache.path, [(0, 0)])
        del cluster[3]
        del cluster[2]  # node 2 dies too: node 1 leads epoch 2 alone, and commits a0
        to_1 = rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=1, leader=1, isr=(1,))
        n1.cache.apply(3, [to_1])
        n1.replicas.append_local(n1.partition, batch(value=b"n0"), required_acks=-1)
        assert n1.values() == [b"r0", b"r1", b"a0", b"n0"]
        assert n1.partition.high_watermark == 4

        restarted = Node(3, tmp_path / "n3", cluster)  # no clean shutdown: recovery runs
        restarted.cache.apply(1, records)
        restarted.cache.apply(2, [to_2])
        restarted.cache.apply(3, [to_1])
        assert restarted.partition.log.epoch_cache.entries == [(0, 0), (1, 2)]
        await restarted.fetch_once()  # truncation, then a fetch from offset 2
        assert restarted.values() == [b"r0", b"r1", b"a0", b"n0"]

    asyncio.run(scenario())


def test_a_follower_whose_log_has_no_epoch_truncates_to_its_high_watermark(
    tmp_path: Path,
) -> None:
    """Records above the HW with no leader epoch to ask the leader about may not be the
    leader's: they go, and the follower fetches from its HW (Kafka's
    ReplicaManager.initialFetchOffset)."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"n{n}", cluster) for n in NODES)
        _start(cluster)
        leader.produce(b"leader-0")
        # Records from nowhere on the follower: batches without a partition leader epoch.
        follower.partition.log.append_as_follower(batch(2, value=b"stray"), 0)
        assert follower.partition.log.epoch_cache.latest_epoch == -1
        assert follower.partition.high_watermark == 0
        await follower.fetch_once()
        assert follower.values() == [b"leader-0"]

    asyncio.run(scenario())


def test_a_fetch_of_a_followers_old_incarnation_does_not_count_on_a_new_leader_state(
    tmp_path: Path,
) -> None:
    """KIP-903 (Replica.updateFetchStateOrThrow): the leader checks a fetch's broker epoch
    against the one registered. Checked only against the last one it recorded, a delayed
    fetch of the process broker 2 was before it restarted counted on a leader state made
    since (which had recorded none), and moved the HW over records only the old log held."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, _ = (Node(n, tmp_path / f"node{n}", cluster) for n in NODES)
        _start(cluster)
        leader.produce(b"a")
        restarted = rec.RegisterBroker(
            broker_id=2, incarnation_id="i2-again", broker_epoch=5, endpoints={}, fenced=False
        )
        leader.cache.apply(2, [restarted])
        part = leader.partition

        async def fetch(replica_epoch: int) -> None:
            # At the leader's log end, so at 1: broker 2 has the record.
            await leader.replicas.handle_replica_fetch(
                {
                    "replica_id": 2,
                    "replica_epoch": replica_epoch,
                    "max_wait_ms": 0,
                    "partitions": [fetch_item(part)],
                }
            )

        await fetch(1)  # the old process, epoch 1
        assert part.high_watermark == 0
        await fetch(5)  # the registered one
        assert part.high_watermark == 1

    asyncio.run(scenario())


def test_a_leader_that_cannot_place_a_followers_epoch_leaves_a_log_with_epochs_whole(
    tmp_path: Path,
) -> None:
    """Kafka's getOffsetTruncationState truncates to the initial fetch offset when the leader
    answers an unknown end offset: the log end for a log with epochs. Cut to its HW, the
    follower dropped records the leader had committed above it (its HW lags the leader's)."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"n{n}", cluster) for n in NODES)
        _start(cluster)
        for value in (b"a", b"b"):
            leader.produce(value)
        await follower.fetch_once()  # the records; the follower's HW is still 0
        part = follower.partition
        assert (part.log.log_end_offset, part.high_watermark) == (2, 0)
        epoch = part.log.epoch_cache.latest_epoch
        assert follower.fetchers._truncate_step(part, epoch, -1, UNDEFINED_EPOCH_OFFSET)
        assert follower.values() == [b"a", b"b"]

    asyncio.run(scenario())


def test_an_io_error_moving_a_log_start_fails_the_log_directory(tmp_path: Path) -> None:
    """DeleteRecords' leader-epoch checkpoint (or a segment let go) failing with ENOSPC
    escaped as a bare OSError: the connection closed, the node kept leading with a log start
    it never saved. It is a log directory failure (the node halts), and the request gets
    KAFKA_STORAGE_ERROR."""

    async def scenario() -> None:
        _, leader, _ = await _two_nodes_with_committed(tmp_path, b"r-%d", 3)
        failures: list[str] = []
        leader.replicas.log_dir_failure.fail = lambda what, error: failures.append(what)  # type: ignore[method-assign]

        def full(*_: object) -> bool:
            raise OSError(errno.ENOSPC, "No space left on device")

        lg = leader.partition.log
        with (
            mock.patch.object(lg, "maybe_increment_log_start_offset", full),
            pytest.raises(KafkaError) as refused,
        ):
            leader.replicas.delete_records(TOPIC, 0, 2)
        assert refused.value.code is Errors.KAFKA_STORAGE_ERROR
        assert failures == [f"moving the log start of {TOPIC}-0"]

    asyncio.run(scenario())


def test_an_io_error_deleting_a_stray_log_fails_the_log_directory(tmp_path: Path) -> None:
    data_dir = logs_of_an_earlier_topic(tmp_path / "node-2")

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        Node(1, tmp_path / "node-1", cluster)
        node = Node(2, data_dir, cluster)
        _start(cluster)
        failures: list[str] = []
        node.replicas.log_dir_failure.fail = lambda what, error: failures.append(what)  # type: ignore[method-assign]

        def read_only(*_: object) -> None:
            raise OSError(errno.EROFS, "Read-only file system")

        with mock.patch.object(node.logs, "delete_log", read_only):
            node.replicas.delete_stray_logs()
        assert failures == ["deleting the stray log gone-0"]

    asyncio.run(scenario())


@pytest.mark.parametrize("restarted", [True, False])
def test_a_silent_replica_is_not_proposed_back_into_the_isr(
    tmp_path: Path, *, restarted: bool
) -> None:
    """Three replicas, a real controller deciding AlterPartition. Replica 3 leaves the ISR and
    comes back unfenced without fetching again (restarted: under a new broker epoch); then
    replica 2 stops fetching, alive, while records are written. Kafka adds a follower back only
    on its own fetch, with its registered epoch (maybeExpandIsr, KIP-903), and shrinks alone.
    The leader proposed 3 back from its last LEO, which a HW standing still equals:
    - restarted, with its old epoch, each time refused (INELIGIBLE_REPLICA), and the shrink
      of 2 proposed with it refused too: the ISR stayed (1, 2), the HW stuck, for ever;
    - under min.insync.replicas=2, accepted, the ISR flapping (1) -> (1, 2, 3) -> (1) ...
      every round, a metadata record a second for as long as they stayed silent."""

    async def scenario() -> None:
        now = [1_000_000]
        cluster: dict[int, Node] = {}
        controller = Controller(ControllerConfig(), 0)
        offset = [10]
        proposed: list[list[list[int]]] = []

        def apply(records: list[rec.MetadataRecord]) -> None:
            offset[0] += 1
            for node in cluster.values():
                node.cache.apply(offset[0], records)

        async def alter(payload: dict[str, Any]) -> dict[str, Any]:
            proposed.extend(p["new_isr"] for p in payload["partitions"])
            request = alter_partition_request(payload)
            result = controller.alter_partition(cluster[1].cache.image, request)
            if result.records:
                apply(list(result.records))
            return alter_partition_reply(result.response)

        nodes = [
            Node(n, tmp_path / f"n{n}", cluster, clock=lambda: now[0], alter_partition=alter)
            for n in (1, 2, 3)
        ]
        leader, follower, silent = nodes
        registered: list[rec.MetadataRecord] = [
            rec.RegisterBroker(
                broker_id=n, incarnation_id=f"i{n}", broker_epoch=1, endpoints={}, fenced=False
            )
            for n in (1, 2, 3)
        ]
        configs = {} if restarted else {"min.insync.replicas": "2"}
        apply(
            [
                *registered,
                rec.Topic(TOPIC, TOPIC_ID, configs),
                rec.Partition(TOPIC_ID, 0, (1, 2, 3), (1, 2, 3), 1, 0, 0),
            ]
        )
        for value in (b"a", b"b", b"c"):
            leader.produce(value)
        for _ in range(2):  # the records, then the HW that fetch moved
            await asyncio.gather(follower.fetch_once(), silent.fetch_once())
        assert leader.partition.high_watermark == 3
        gone = (
            rec.RegisterBroker(
                broker_id=3, incarnation_id="i3b", broker_epoch=20, endpoints={}, fenced=True
            )
            if restarted
            else rec.FenceBroker(3, 1)
        )
        apply([gone, rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=0, isr=(1, 2))])
        apply([rec.UnfenceBroker(3, 20 if restarted else 1)])
        for value in (b"d", b"e", b"f"):  # node 2 has stopped fetching
            leader.produce(value)
        part = leader.partition
        for _ in range(8):
            now[0] += 6_000
            leader.replicas.maybe_propose_isr_changes()
            await asyncio.gather(*leader.replicas._isr_tasks)
        assert part.isr == (1,)
        assert proposed == [[[1, 1]]], "only the shrink, once"
        if restarted:
            assert part.high_watermark == part.log.log_end_offset == 6
        for node in nodes:
            node.replicas.close()

    asyncio.run(scenario())


def test_a_replica_shrunk_out_while_its_fetch_waits_counts_as_fetching(tmp_path: Path) -> None:
    """The follower's request waits at the leader in a fetch session when the ISR change
    that removed it commits; the change marks the partition, and the waiting request takes
    the mark when an append elsewhere wakes it. Kafka reads every partition of a session on
    each request, so the follower counts as fetching it at its position: it is proposed back
    at the next ISR round. Before, nothing recorded that fetch until the session's next full
    pass (every second): the follower's position did not move, and it never named the
    partition again."""

    async def scenario() -> None:
        leader, follower, parts = _two_partitions(tmp_path)
        sent: list[dict[str, Any]] = []

        async def alter_partition(payload: dict[str, Any]) -> dict[str, Any]:
            sent.append(payload)
            return {"error": int(Errors.REQUEST_TIMED_OUT), "partitions": []}

        leader.replicas.alter_partition = alter_partition
        leader.produce(b"a")
        for _ in range(2):  # the record, then the HW that fetch moved
            await follower.fetchers._step(1, parts)
        assert leader.partition.high_watermark == 1
        waiting = asyncio.create_task(follower.fetchers._step(1, parts))
        await _parked(leader.replicas)
        shrink = rec.PartitionChange(TOPIC_ID, 0, expected_partition_epoch=0, isr=(1,))
        for node in (leader, follower):
            node.cache.apply(3, [shrink])
        other = leader.replicas.get_partition(TOPIC, 1)
        assert other is not None
        leader.replicas.append_local(other, batch(value=b"b"), required_acks=1)
        await asyncio.wait_for(waiting, 5)
        leader.replicas.maybe_propose_isr_changes()
        await asyncio.gather(*leader.replicas._isr_tasks)
        proposed = [(p["partition"], p["new_isr"]) for r in sent for p in r["partitions"]]
        assert proposed == [(0, [[1, 1], [2, 1]])]

    asyncio.run(scenario())


def test_a_partition_stopped_while_its_truncation_asks_the_leader_is_asked_for_no_more(
    tmp_path: Path,
) -> None:
    """The replica was stopped while its EpochEndOffset call was out: the answer is not for
    it, and the truncation went on asking for it, round after round (100), and could truncate
    the stopped partition's closed log in a round that needs no call."""

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"n{n}", cluster) for n in NODES)
        _start(cluster)
        leader.produce(b"a")
        await follower.fetch_once()
        part = follower.partition
        part.truncation_pending = True  # as a new leader epoch leaves it
        asked: list[str] = []

        class StoppingClient:
            async def call(self, method: str, payload: Any, timeout: float) -> Any:
                asked.append(method)
                follower.replicas._stop_replica(part.tp)
                return await leader.replicas.handle_epoch_end_offset(payload)

        await follower.fetchers._truncate(cast(RpcClient, StoppingClient()), [part])
        assert asked == ["EpochEndOffset"]

    asyncio.run(scenario())


def test_a_partition_that_moved_to_another_leader_between_truncation_rounds_is_not_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 1 was done in the first round while partition 0 needed another; meanwhile
    it moved to leader 2, which set its truncation pending again, and the third round asked
    the old leader for it: its error backed the partition off for the new leader's fetcher.
    Each partition is truncated at the epoch it was given at (AbstractFetcherThread)."""
    nodes = (1, 2, 3)

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        n1, _, n3 = (Node(n, tmp_path / f"n{n}", cluster) for n in nodes)
        offset = [2]

        def publish(records: list[rec.MetadataRecord]) -> None:
            for node in cluster.values():
                node.cache.apply(offset[0], records)
            offset[0] += 1

        def change(partition: int, epoch: int, leader: int) -> rec.PartitionChange:
            return rec.PartitionChange(
                TOPIC_ID, partition, expected_partition_epoch=epoch, leader=leader, isr=nodes
            )

        first: list[rec.MetadataRecord] = [
            rec.RegisterBroker(broker_id=n, incarnation_id=f"i{n}", broker_epoch=1, endpoints={})
            for n in nodes
        ]
        first += [rec.UnfenceBroker(n, 1) for n in nodes]
        first += [rec.Topic(TOPIC, TOPIC_ID, {})]
        first += [
            rec.Partition(TOPIC_ID, p, nodes, nodes, leader=1, leader_epoch=0, partition_epoch=0)
            for p in (0, 1)
        ]
        for node in cluster.values():
            node.cache.apply(1, first)
        n1.produce(b"a")
        p1_on_1 = n1.replicas.get_partition(TOPIC, 1)
        assert p1_on_1 is not None
        n1.replicas.append_local(p1_on_1, batch(value=b"x"), required_acks=1)
        p0, p1 = (n3.replicas.get_partition(TOPIC, p) for p in (0, 1))
        assert p0 is not None and p1 is not None
        for _ in range(2):
            await n3.fetchers._step(1, [p0, p1])
        # Partition 0 diverges over two epochs (two rounds); partition 1 only changes epoch.
        publish([change(0, 0, 1)])
        n1.produce(b"b1")
        publish([change(0, 1, 3)])
        n3.produce(b"c2")
        publish([change(0, 2, 1), change(1, 0, 1)])
        asked: list[list[int]] = []
        real = _Handlers.call

        async def call(self: _Handlers, method: str, payload: Any, timeout: float) -> Any:
            if method == "EpochEndOffset":
                asked.append([p["partition"] for p in payload["partitions"]])
                if len(asked) == 2:
                    publish([change(1, 1, 2)])  # partition 1 moves to leader 2
            return await real(self, method, payload, timeout)

        monkeypatch.setattr(_Handlers, "call", call)
        client = n3.fetchers._client(1)
        assert client is not None
        await n3.fetchers._truncate(client, [p0, p1])
        assert asked == [[0, 1], [0]]
        assert p1.leader_id == 2 and p1.truncation_pending
        assert p1.tp not in n3.fetchers._backoff_until

    asyncio.run(scenario())
