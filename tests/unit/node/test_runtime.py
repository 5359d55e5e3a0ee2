"""The coordinator runtime: loading, HW-gated answers, unloading, reloading by replay."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kcoord.cluster.coordinator import types as t
from kcoord.cluster.coordinator.shard import GroupConfig, GroupCoordinatorShard
from kcoord.errors import Errors
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_manager import Partition, ReplicaManager
from kcoord.node.runtime import CoordinatorError, CoordinatorRuntime, ShardState
from kcoord.raft import records as rec
from kcoord.storage.manager import LogManager

OFFSETS_ID = "AAAAAAAAAAAAAAAAAAAAAA"
ORDERS_ID = "BBBBBBBBBBBBBBBBBBBBBB"


class HeldReplicaManager(ReplicaManager):
    """A leader whose high watermark moves only when the test says (a follower that lags)."""

    hold = True

    def _maybe_advance_high_watermark(self, part: Partition) -> None:
        if not self.hold:
            super()._maybe_advance_high_watermark(part)

    def release(self, part: Partition) -> None:
        self.hold = False
        super()._maybe_advance_high_watermark(part)
        self.hold = True


class Node:
    def __init__(self, data_dir: Path) -> None:
        self.now = 1_000_000
        self.logs = LogManager(data_dir)
        self.logs.open()
        self.cache = MetadataCache(1, listener=_NoRoles())
        self.replicas = HeldReplicaManager(1, self.logs, self.cache, lambda: self.now)
        self.cache.listener = self.replicas
        self.runtime = CoordinatorRuntime(
            self.replicas, GroupConfig(), lambda: self.now, num_partitions=lambda: 1
        )

    def elect(self, leader_epoch: int = 0) -> None:
        records: list[rec.MetadataRecord] = [
            rec.RegisterBroker(
                broker_id=1,
                incarnation_id="i",
                broker_epoch=1,
                endpoints={"kafka": "h:1"},
                fenced=False,
            ),
            rec.Topic("__consumer_offsets", OFFSETS_ID, {"cleanup.policy": "compact"}),
            rec.Partition(OFFSETS_ID, 0, (1,), (1,), 1, leader_epoch, 0),
            rec.Topic("orders", ORDERS_ID, {}),
            rec.Partition(ORDERS_ID, 0, (1,), (1,), 1, 0, 0),
        ]
        self.cache.apply(1, records)

    @property
    def offsets_partition(self) -> Partition:
        part = self.replicas.get_partition("__consumer_offsets", 0)
        assert part is not None
        return part


class _NoRoles:
    def on_role_changes(self, changes: Any) -> None:
        pass


def commit(group: str, offset: int) -> Any:
    req = t.OffsetCommitRequest(
        group_id=group,
        topics=(
            t.OffsetCommitRequestTopic(
                name="orders",
                partitions=(
                    t.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset),
                ),
            ),
        ),
    )
    return lambda s, tok, now: s.handle_offset_commit(tok, req, now)


def fetch(group: str) -> Any:
    req = t.OffsetFetchRequest(group_id=group, topics=None)
    return lambda s, tok, now: s.handle_offset_fetch(tok, req, now)


async def loaded(node: Node) -> None:
    ctx = node.runtime.contexts[0]
    while ctx.state is ShardState.LOADING:
        await asyncio.sleep(0)  # let the load task run; it yields between chunks


def test_load_in_progress_then_answers_wait_for_the_high_watermark(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(tmp_path)
        node.elect()
        with pytest.raises(CoordinatorError) as e:
            node.runtime.submit("g", fetch("g"))
        assert e.value.code is Errors.COORDINATOR_LOAD_IN_PROGRESS
        await loaded(node)
        part = node.offsets_partition
        answer = node.runtime.submit("g", commit("g", 42))
        assert part.log.log_end_offset > part.high_watermark  # written, not committed
        read = node.runtime.submit("g", fetch("g"))  # a read after a pending write waits too
        for _ in range(10):
            await asyncio.sleep(0)
        assert not answer.done() and not read.done()
        node.replicas.release(part)
        committed = await asyncio.wait_for(answer, 5)
        assert committed.topics[0].partitions[0].error_code is Errors.NONE
        offsets = await asyncio.wait_for(read, 5)
        assert offsets.topics[0].partitions[0].committed_offset == 42
        node.runtime.close()

    asyncio.run(scenario())


def test_unload_fails_pending_answers_and_reload_replays_the_log(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(tmp_path)
        node.elect()
        await loaded(node)
        part = node.offsets_partition
        node.replicas.release(part)  # commit one offset for real
        node.replicas.hold = False
        await asyncio.wait_for(node.runtime.call("g", commit("g", 7)), 5)
        node.replicas.hold = True
        pending = node.runtime.submit("g", commit("g", 8))
        node.runtime.unload(0, part.leader_epoch)
        with pytest.raises(CoordinatorError) as e:
            await asyncio.wait_for(pending, 5)
        assert e.value.code is Errors.NOT_COORDINATOR
        with pytest.raises(CoordinatorError) as e2:
            node.runtime.submit("g", fetch("g"))
        assert e2.value.code is Errors.NOT_COORDINATOR
        # Leading again: the shard is rebuilt by replaying the log.
        node.runtime.schedule_load(part)
        await loaded(node)
        # A repeated election for the same epoch is stale and changes nothing; a newer
        # epoch replaces the context (Kafka's scheduleLoadOperation).
        first = node.runtime.contexts[0]
        node.runtime.schedule_load(part)
        assert node.runtime.contexts[0] is first
        part.leader_epoch += 1
        node.runtime.schedule_load(part)
        assert node.runtime.contexts[0] is not first and first.state is ShardState.CLOSED
        await loaded(node)
        shard: GroupCoordinatorShard | None = node.runtime.contexts[0].shard
        assert shard is not None
        node.replicas.release(part)
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        # Both writes reached the log (the second was appended before the unload), so a
        # replay sees 8: what is in the log is the truth, committed or not yet.
        assert offsets.topics[0].partitions[0].committed_offset == 8
        node.runtime.close()

    asyncio.run(scenario())
