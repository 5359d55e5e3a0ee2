"""``QuorumBridge``: committed batches reach the node's image in offset order, and one that
gives this node new partitions first has their logs created off the loop.

Creating thousands of logs on the loop (a directory, an fsynced partition.metadata and segment
files each) froze a node for seconds: every client, and its broker heartbeats, so that the
controller fenced every broker when a 2000-partition topic was created.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from kcoord.node.metadata import MetadataCache, QuorumBridge
from kcoord.node.replica_manager import ReplicaManager
from kcoord.raft import records as rec
from kcoord.raft.image import BecomeLeader, MetadataImage, RoleChange, TopicIdPartition
from kcoord.storage import format as fmt
from kcoord.storage.manager import LogManager
from tests.unit.node.kafka.harness import until

NODE_ID = 1


class _NoRoles:
    def on_role_changes(self, changes: object) -> None:
        pass


def _broker(offset: int) -> list[rec.MetadataRecord]:
    return [
        rec.RegisterBroker(
            broker_id=NODE_ID, incarnation_id="i", broker_epoch=offset, endpoints={}, fenced=False
        )
    ]


def _topic(name: str, topic_id: str, partitions: int) -> list[rec.MetadataRecord]:
    return [
        rec.Topic(name, topic_id, {"cleanup.policy": "compact"}),
        *(
            rec.Partition(topic_id, p, (NODE_ID,), (NODE_ID,), NODE_ID, 0, 0)
            for p in range(partitions)
        ),
    ]


class _SlowPreparer:
    """The ReplicaManager's preparer, with its thread's work held until ``release``."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas
        self.release = asyncio.Event()
        self.seen: list[int] = []

    def logs_to_create(self, records: Sequence[rec.MetadataRecord]) -> Sequence[object]:
        return self.replicas.logs_to_create(records)

    async def create_logs_ahead(self, records: Sequence[rec.MetadataRecord]) -> None:
        self.seen.append(len(self.replicas.logs_to_create(records)))
        await self.release.wait()
        await self.replicas.create_logs_ahead(records)


def _bridge(
    data_dir: Path,
) -> tuple[LogManager, MetadataCache, ReplicaManager, _SlowPreparer, QuorumBridge]:
    """A node's image, replica manager and bridge on the running loop, logs created ahead
    by a preparer held until released."""
    logs = LogManager(data_dir)
    logs.open()
    cache = MetadataCache(NODE_ID, _NoRoles())
    replicas = ReplicaManager(NODE_ID, logs, cache, lambda: 1_000)
    cache.listener = replicas
    preparer = _SlowPreparer(replicas)
    bridge = QuorumBridge(asyncio.get_running_loop(), cache, lambda: None, preparer)
    return logs, cache, replicas, preparer, bridge


def test_batches_wait_in_order_behind_one_whose_logs_are_created_ahead(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs, cache, replicas, preparer, bridge = _bridge(tmp_path)

        bridge._submit(cache.apply, 1, _broker(1))  # nothing to create: applied at once
        assert cache.offset == 1
        bridge._submit(cache.apply, 2, _topic("big", "B" * 22, 3))
        bridge._submit(cache.apply, 3, _broker(3))  # behind it, though it creates nothing
        await asyncio.sleep(0)
        assert preparer.seen == [3] and cache.offset == 1  # the loop runs on meanwhile
        preparer.release.set()
        await asyncio.wait_for(cache.wait_for_offset(3), 10)
        # The role changes found the logs created ahead, and gave them the topic's configs.
        for p in range(3):
            part = replicas.get_partition("big", p)
            assert part is not None and part.is_leader and part.log.config.compact
            assert logs.get_log(("big", p)) is part.log
        assert preparer.seen == [3, 0]  # batch 3 wanted none
        assert bridge._draining is None and not bridge._pending
        assert (tmp_path / "big-2" / "partition.metadata").exists()

    asyncio.run(scenario())


def test_a_log_that_exists_is_not_created_ahead(tmp_path: Path) -> None:
    logs = LogManager(tmp_path)
    logs.open()
    cache = MetadataCache(NODE_ID, _NoRoles())
    replicas = ReplicaManager(NODE_ID, logs, cache, lambda: 1_000)
    logs.get_or_create_log(("big", 0), topic_id="B" * 22)
    wanted = replicas.logs_to_create(_topic("big", "B" * 22, 2))
    assert [tp for tp, _, _ in wanted] == [("big", 1)]
    (tmp_path / "big-1").mkdir()  # a directory not in the manager: left to the role change
    assert logs.create_unregistered(wanted) == []
    others = replicas.logs_to_create(
        [rec.Partition("C" * 22, 0, (2, 3), (2, 3), 2, 0, 0)]  # not a replica here
    )
    assert others == []


def test_a_closed_bridge_applies_nothing_more(tmp_path: Path) -> None:
    """A stopping node closes its bridge before the parts a batch reaches: the Raft thread
    still handed over batches (a controlled shutdown's leaderships moving away), and they
    started shard loads and standby replays on a coordinator being closed."""

    async def scenario() -> None:
        logs, cache, replicas, preparer, bridge = _bridge(tmp_path)
        bridge._submit(cache.apply, 1, _broker(1))
        bridge._submit(cache.apply, 2, _topic("big", "B" * 22, 1))  # waits for its logs
        await asyncio.sleep(0)
        draining = bridge._draining
        assert draining is not None
        bridge.close()  # cancels the creation of logs ahead (which stops its thread)
        preparer.release.set()
        await bridge.wait_closed()  # ends without applying what it held
        assert draining.done()
        bridge.on_committed(3, _broker(3))  # from the Raft thread, after the close
        await asyncio.sleep(0)  # the callback's turn
        assert cache.offset == 1 and replicas.get_partition("big", 0) is None
        logs.shutdown()

    asyncio.run(scenario())


class _Recorder:
    def __init__(self) -> None:
        self.changes: list[RoleChange] = []

    def on_role_changes(self, changes: list[RoleChange]) -> None:
        self.changes.extend(changes)


def test_a_held_cache_follows_the_log_and_publishes_the_image_once_released(
    tmp_path: Path,
) -> None:
    """Until its release a node's cache applies every batch (waiters on an offset are woken: the
    controller answers from it) but publishes nothing, nor creates logs ahead; the release
    publishes the image as one delta: only the roles it gives now, none of the past ones (the
    leader epochs 0 and 1 of "t", and the topic "gone")."""

    async def scenario() -> None:
        logs, cache, _replicas, preparer, bridge = _bridge(tmp_path)
        roles = _Recorder()
        cache.listener = roles
        deltas: list[int] = []
        cache.delta_listeners.append(lambda d: deltas.append(d.offset))
        cache.holding = True
        reached = asyncio.ensure_future(cache.wait_for_offset(4))
        bridge.on_committed(1, _broker(1))
        bridge.on_committed(2, _topic("t", "A" * 22, 1) + _topic("gone", "G" * 22, 1))
        bridge.on_committed(3, [rec.PartitionChange("A" * 22, 0, 0, leader=NODE_ID)])
        bridge.on_committed(4, [rec.RemoveTopic("G" * 22)])
        await asyncio.wait_for(reached, 5)
        assert cache.image.last_offset == 4
        assert roles.changes == [] and deltas == [] and preparer.seen == []
        cache.release()
        assert len(roles.changes) == 1
        assert [
            (c.topic_name, c.leader_epoch) for c in roles.changes if isinstance(c, BecomeLeader)
        ] == [("t", 1)]
        assert deltas == [4]
        bridge.on_committed(5, _broker(5))
        await asyncio.sleep(0)  # the bridge's call_soon
        assert deltas == [4, 5]
        logs.shutdown()

    asyncio.run(scenario())


def test_a_snapshot_comes_with_its_parsed_image_and_an_older_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Raft thread parses a snapshot to install it; the node rebuilt the image from its
    records again on the event loop, 0.65 s of 1.1 s at 50,000 partitions (found by a
    review). The parsed image comes along now (a copy). A snapshot older than the image
    (the quorum ignores those) would publish leadership lost since, at an older epoch."""

    async def scenario() -> None:
        logs, cache, _replicas, preparer, bridge = _bridge(tmp_path)
        preparer.release.set()  # its logs are made ahead at once
        roles = _Recorder()
        cache.listener = roles
        records = [*_broker(1), *_topic("t", "A" * 22, 2)]
        image = MetadataImage.from_records(7, records)

        def replayed(*_: object) -> MetadataImage:
            raise AssertionError("the snapshot's records replayed again")

        monkeypatch.setattr(MetadataImage, "from_records", replayed)
        bridge.on_snapshot_loaded(7, records, image)
        await until(lambda: cache.image.last_offset == 7, "the snapshot loaded")
        assert cache.image == image
        assert sorted(c.tp.partition for c in roles.changes if isinstance(c, BecomeLeader)) == [
            0,
            1,
        ]
        older = MetadataImage()
        cache.load_snapshot(5, [], older)
        assert cache.image.last_offset == 7 and len(roles.changes) == 2
        logs.shutdown()

    asyncio.run(scenario())


def test_a_role_change_marks_its_own_partitions_in_the_fetch_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every role change marked every partition of every follower's fetch session, so each
    parked fetch read all the partitions it follows at each election (found by a review);
    only the partitions whose role changed can answer differently."""
    logs = LogManager(tmp_path)
    logs.open()
    cache = MetadataCache(NODE_ID, _NoRoles())
    replicas = ReplicaManager(NODE_ID, logs, cache, lambda: 1_000)
    cache.listener = replicas
    marked: list[object] = []
    monkeypatch.setattr(replicas.fetch_sessions, "mark", marked.append)
    cache.apply(1, [*_broker(1), *_topic("t", "A" * 22, 3)])
    assert sorted(map(str, marked)) == ["('t', 0)", "('t', 1)", "('t', 2)"]
    marked.clear()
    cache.apply(2, [rec.PartitionChange("A" * 22, 1, 0, leader=NODE_ID)])
    assert marked == [("t", 1)]
    logs.shutdown()


def test_a_partition_hosted_for_another_topic_id_is_not_served_from_that_log(
    tmp_path: Path,
) -> None:
    """A topic deleted and made again under its name whose removal this node never applied
    (a batch skipped: a divergence bug) was led from the old topic's log. As Kafka's
    getOrCreatePartition refuses a topic id that differs, the old log goes first."""
    logs = LogManager(tmp_path)
    logs.open()
    cache = MetadataCache(NODE_ID, _NoRoles())
    replicas = ReplicaManager(NODE_ID, logs, cache, lambda: 1_000)
    cache.listener = replicas
    cache.apply(1, [*_broker(1), *_topic("t", "A" * 22, 1)])
    old = replicas.get_partition("t", 0)
    assert old is not None
    old.log.append_as_leader(fmt.build_batch([fmt.Record(0, 0, b"k", b"v")]), 0, now_ms=0)
    cache.apply(2, [*_topic("t", "B" * 22, 1)])  # as if RemoveTopic("A...") were skipped
    replicas.on_role_changes([BecomeLeader(TopicIdPartition("B" * 22, 0), "t", 0, 0)])
    new = replicas.get_partition("t", 0)
    assert new is not None and new is not old
    assert new.topic_id == "B" * 22 and new.log.log_end_offset == 0
    logs.shutdown()
