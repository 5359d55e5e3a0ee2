"""The coordinator runtime: loading, HW-gated answers, unloading, reloading by replay."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import itertools
import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcoord.cluster.coordinator import types as t
from kcoord.cluster.coordinator.records import (
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    CoordinatorRecord,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordDecoder,
    decode_record,
    encode_record,
)
from kcoord.cluster.coordinator.shard import (
    GROUP_EXPIRATION_KEY,
    CoordinatorResult,
    GroupConfig,
    GroupCoordinatorShard,
    MemberEpoch,
)
from kcoord.errors import Errors
from kcoord.node import runtime as rt
from kcoord.node.kafka import apis as rt_api
from kcoord.node.kafka import codec
from kcoord.node.kafka.context import BrokerContext
from kcoord.node.kafka.groups import GroupApi
from kcoord.node.log_dir_failure import LogDirFailureChannel
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_manager import Partition, ReplicaManager
from kcoord.node.runtime import (
    CoordinatorError,
    CoordinatorRuntime,
    LatestRecords,
    LoadSummary,
    ShardContext,
    ShardState,
    Standby,
    UndecodableRecordError,
    _replay_chunk,
    _ReplayTurns,
    replay_latest,
)
from kcoord.raft import records as rec
from kcoord.raft.image import MetadataImage, diff
from kcoord.storage import format as fmt
from kcoord.storage import log as log_module
from kcoord.storage.config import LogConfig
from kcoord.storage.log import Log
from kcoord.storage.manager import LogManager
from tests.unit.cluster.coordinator.harness import MockTimer
from tests.unit.storage.helpers import batch, open_log

OFFSETS_ID = "AAAAAAAAAAAAAAAAAAAAAA"
ORDERS_ID = "BBBBBBBBBBBBBBBBBBBBBB"


class HeldReplicaManager(ReplicaManager):
    """A leader whose high watermark moves only when the test says (a follower that lags)."""

    hold = True

    def maybe_advance_high_watermark(self, part: Partition) -> None:
        if not self.hold:
            super().maybe_advance_high_watermark(part)

    def release(self, part: Partition) -> None:
        self.hold = False
        super().maybe_advance_high_watermark(part)
        self.hold = True


class Node:
    def __init__(
        self,
        data_dir: Path,
        *,
        append_linger_ms: int = -1,
        write_timeout_ms: int = 5000,
        config: GroupConfig | None = None,
        hold: bool = False,
    ) -> None:
        self.now = 1_000_000
        self.logs = LogManager(data_dir)
        self.logs.open()
        self.cache = MetadataCache(1, listener=_NoRoles(), hold=hold)
        self.replicas = HeldReplicaManager(1, self.logs, self.cache, lambda: self.now)
        self.cache.listener = self.replicas
        self.runtime = CoordinatorRuntime(
            self.replicas,
            config or GroupConfig(),
            lambda: self.now,
            num_partitions=lambda: 1,
            append_linger_ms=append_linger_ms,
            write_timeout_ms=write_timeout_ms,
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
            # Replicated to node 2, which never fetches: the ISR is this node alone, so
            # ``min.insync.replicas=2`` refuses writes (it is capped at the replication factor).
            rec.Partition(OFFSETS_ID, 0, (1, 2), (1,), 1, leader_epoch, 0),
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


def heartbeat(group: str) -> Any:
    """A classic Heartbeat of an unknown member: answered UNKNOWN_MEMBER_ID, nothing written."""
    req = t.HeartbeatRequest(group_id=group, generation_id=1, member_id="m")
    return lambda s, tok, now: s.handle_heartbeat(tok, req, now)


def delete_groups(*groups: str) -> Any:
    req = t.DeleteGroupsRequest(groups_names=groups)
    return lambda s, tok, now: s.handle_delete_groups(tok, req, now)


async def listed_ids(runtime: CoordinatorRuntime) -> list[str]:
    """ListGroups on every shard, answered within 5 s: the group ids."""
    answers = await asyncio.wait_for(asyncio.gather(*runtime.list_groups(t.ListGroupsRequest())), 5)
    return sorted(g.group_id for answer in answers for g in answer.groups)


async def held_after_commits(tmp_path: Path, *groups: str) -> Node:
    """A node leading its loaded shard, each of ``groups`` with offset 10 committed, and its
    high watermark held from then on (a follower lags); writes wait up to 60 s."""
    node = Node(tmp_path, write_timeout_ms=60_000)
    node.elect()
    await loaded(node)
    node.replicas.hold = False
    for group in groups:
        await asyncio.wait_for(node.runtime.call(group, commit(group, 10)), 5)
    node.replicas.hold = True
    return node


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
        written = node.runtime.contexts[0].last_written_offset
        assert written > part.high_watermark  # written, not committed
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


@pytest.mark.parametrize("append_linger_ms", [0, -1])
def test_unload_fails_pending_answers_and_reload_replays_the_log(
    tmp_path: Path, append_linger_ms: int
) -> None:
    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=append_linger_ms)
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
        # A repeated election for the same epoch is stale and changes nothing; a newer epoch
        # of the partition still led here only moves the context's epoch (Kafka's
        # scheduleLoadOperation).
        first = node.runtime.contexts[0]
        node.runtime.schedule_load(part)
        assert node.runtime.contexts[0] is first
        part.leader_epoch += 1
        node.runtime.schedule_load(part)
        assert node.runtime.contexts[0] is first and first.state is ShardState.ACTIVE
        assert first.leader_epoch == part.leader_epoch
        shard: GroupCoordinatorShard | None = node.runtime.contexts[0].shard
        assert shard is not None
        node.replicas.release(part)
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        # What is in the log is the truth, committed or not yet. Without linger the second
        # write was appended before the unload, so a replay sees 8; with it, the write was
        # still in the open batch, which the unload dropped unwritten, so a replay sees 7.
        expected = 8 if append_linger_ms == 0 else 7
        assert offsets.topics[0].partitions[0].committed_offset == expected
        node.runtime.close()

    asyncio.run(scenario())


def test_an_unload_whose_shard_fails_to_unload_still_fails_the_pending_answers(
    tmp_path: Path,
) -> None:
    """``on_unloaded`` raising (a bug in the shard) skipped failing the pending answers, which
    then waited for ever, and the error went up into the role change that unloaded it."""

    async def scenario() -> None:
        node = Node(tmp_path)
        part, ctx, _ = await committed_seven(node)
        node.replicas.hold = True
        pending = node.runtime.submit("g", commit("g", 8))

        def broken(now_ms: int) -> Any:
            raise RuntimeError("on_unloaded failed")

        assert ctx.shard is not None
        ctx.shard.on_unloaded = broken  # type: ignore[method-assign,assignment]
        node.runtime.unload(0, part.leader_epoch)
        with pytest.raises(CoordinatorError) as e:
            await asyncio.wait_for(pending, 5)
        assert e.value.code is Errors.NOT_COORDINATOR
        node.runtime.close()

    asyncio.run(scenario())


def offset_delete(group: str) -> Any:
    req = t.OffsetDeleteRequest(
        group_id=group,
        topics=(
            t.OffsetDeleteRequestTopic(
                name="orders", partitions=(t.OffsetDeleteRequestPartition(partition_index=0),)
            ),
        ),
    )
    return lambda s, tok, now: s.handle_offset_delete(tok, req, now)


async def committed_seven(node: Node) -> tuple[Partition, ShardContext, int]:
    """Elect the node, load its shard and commit offset 7 for group g (the HW follows
    appends from here on). Returns the partition, the shard's context and the log's end."""
    node.elect()
    await loaded(node)
    part = node.offsets_partition
    node.replicas.hold = False
    await asyncio.wait_for(node.runtime.call("g", commit("g", 7)), 5)
    return part, node.runtime.contexts[0], part.log.log_end_offset


@pytest.mark.parametrize("append_linger_ms", [0, -1])
def test_below_min_insync_replicas_writes_wait_for_the_high_watermark_and_the_shard_stays(
    tmp_path: Path, append_linger_ms: int
) -> None:
    """Below min.insync.replicas a coordinator write was refused up front: a commit failed
    alone, but any other write (a join, a sync, an OffsetDelete, a timer's) unloaded the shard
    and reloaded it from the log, and every group of the partition answered
    COORDINATOR_LOAD_IN_PROGRESS, again at each retry, for as long as the ISR was short. As
    Kafka's CoordinatorPartitionWriter (acks=1), a write now goes to the log; its answer waits
    for the high watermark, which strict min ISR holds, and times out
    (COORDINATOR_NOT_AVAILABLE). The shard stays loaded, other groups' reads go on, and once
    the ISR is back the writes commit."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=append_linger_ms, write_timeout_ms=200)
        part, ctx, end = await committed_seven(node)
        node.replicas.min_insync_replicas = 2  # the ISR is this node alone
        waiting = node.runtime.submit("g", commit("g", 8), replay_only=True)
        deleting = node.runtime.submit("g", offset_delete("g"))
        # A group with nothing pending, whose request writes nothing, is answered at once.
        unknown = await asyncio.wait_for(node.runtime.submit("h", offset_delete("h")), 30)
        assert unknown.error_code is Errors.GROUP_ID_NOT_FOUND
        for answer in (waiting, deleting):
            with pytest.raises(CoordinatorError) as e:
                await asyncio.wait_for(answer, 30)
            assert e.value.code is Errors.COORDINATOR_NOT_AVAILABLE
        assert node.runtime.contexts[0] is ctx and ctx.state is ShardState.ACTIVE
        assert part.log.log_end_offset > end and part.high_watermark == end
        other = await asyncio.wait_for(node.runtime.call("x", fetch("x")), 30)
        assert other.topics == ()

        node.replicas.min_insync_replicas = 1
        await asyncio.wait_for(node.runtime.call("g", commit("g", 9), replay_only=True), 30)
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 30)
        assert offsets.topics[0].partitions[0].committed_offset == 9
        assert node.runtime.contexts[0] is ctx

        # Too large a commit is refused as in Kafka (UNKNOWN_SERVER_ERROR: a retry could
        # only be refused again); the shard stays.
        part.log.config = LogConfig(max_message_bytes=200)  # as an altered topic config does
        with pytest.raises(CoordinatorError) as e:
            await asyncio.wait_for(
                node.runtime.call("g", commit("g" * 300, 1), replay_only=True), 30
            )
        assert e.value.code is Errors.UNKNOWN_SERVER_ERROR
        assert node.runtime.contexts[0] is ctx
        node.runtime.close()

    asyncio.run(scenario())


def delete_group(group: str) -> Any:
    req = t.DeleteGroupsRequest(groups_names=(group,))
    return lambda s, tok, now: s.handle_delete_groups(tok, req, now)


@pytest.mark.parametrize("append_linger_ms", [0, -1])
def test_a_delete_the_log_refuses_fails_alone_and_the_group_stays(
    tmp_path: Path, append_linger_ms: int
) -> None:
    """OffsetDelete and DeleteGroups write tombstones alone (the API layer submits them
    ``replay_only``): when the log refuses their batch (a group with more offsets than a batch
    holds), only that request fails and the shard stays loaded. Each reloaded the partition,
    every group of it answering COORDINATOR_LOAD_IN_PROGRESS, at every retry."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=append_linger_ms)
        part, ctx, _ = await committed_seven(node)
        config = part.log.config
        part.log.config = LogConfig(max_message_bytes=60)  # as an altered topic config does
        for call in (offset_delete("g"), delete_group("g")):
            with pytest.raises(CoordinatorError) as e:
                await asyncio.wait_for(node.runtime.call("g", call, replay_only=True), 5)
            assert e.value.code is Errors.UNKNOWN_SERVER_ERROR
            assert node.runtime.contexts[0] is ctx and ctx.state is ShardState.ACTIVE
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        assert offsets.topics[0].partitions[0].committed_offset == 7

        part.log.config = config
        deleted = await asyncio.wait_for(
            node.runtime.call("g", delete_group("g"), replay_only=True), 5
        )
        assert deleted.results[0].error_code is Errors.NONE
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        assert offsets.topics == ()
        assert node.runtime.contexts[0] is ctx
        node.runtime.close()

    asyncio.run(scenario())


async def join_g(node: Node, timeout_ms: int) -> Any:
    """A member joins group g (no member id required) with these session and rebalance
    timeouts; returns the JoinGroup answer."""
    join = t.JoinGroupRequest(
        group_id="g",
        session_timeout_ms=timeout_ms,
        rebalance_timeout_ms=timeout_ms,
        protocol_type="consumer",
        protocols=(t.JoinGroupRequestProtocol(name="range", metadata=b""),),
        require_known_member_id=False,
    )
    return await asyncio.wait_for(
        node.runtime.call("g", lambda s, tok, now: s.handle_join_group(tok, join, now)), 5
    )


async def refused(answer: asyncio.Future[Any]) -> Errors:
    """The error an answer fails with (within 5 s)."""
    with pytest.raises(CoordinatorError) as e:
        await asyncio.wait_for(answer, 5)
    return e.value.code


@pytest.mark.parametrize("append_linger_ms", [0, -1])
def test_a_refused_write_fails_its_own_requests_and_others_may_retry(
    tmp_path: Path, append_linger_ms: int
) -> None:
    """A write too large for the log unloads the shard. Another group's commit, appended
    before and waiting for the HW, was failed with the refused write's own error
    (UNKNOWN_SERVER_ERROR), which no client retries, though the log kept it. It gets
    NOT_COORDINATOR now, and its commit is there after the reload."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=append_linger_ms)
        part, ctx, _ = await committed_seven(node)
        node.replicas.hold = True  # a lagging follower: the HW stays where it is
        bystander = node.runtime.submit("other", commit("other", 5), replay_only=True)
        if append_linger_ms < 0:
            await _until(lambda: ctx.batch is None, "the bystander's batch to go out")
        part.log.config = LogConfig(max_message_bytes=200)  # as an altered topic config does
        too_large = node.runtime.submit("g" * 300, commit("g" * 300, 1))  # may change the shard
        assert await refused(too_large) is Errors.UNKNOWN_SERVER_ERROR
        assert await refused(bystander) is Errors.NOT_COORDINATOR
        assert node.runtime.contexts[0] is not ctx
        node.replicas.release(part)
        node.replicas.hold = False
        await loaded(node)
        offsets = await asyncio.wait_for(node.runtime.call("other", fetch("other")), 5)
        assert offsets.topics[0].partitions[0].committed_offset == 5
        node.runtime.close()

    asyncio.run(scenario())


def test_a_leaders_assignment_too_large_for_the_log_fails_its_group_alone(tmp_path: Path) -> None:
    """The shard learns the partition's max.message.bytes: a leader's SyncGroup whose record
    the log would refuse fails with UNKNOWN_SERVER_ERROR (Kafka's append callback) and the
    shard stays, where the refused append unloaded it, failing every group of the partition."""

    async def scenario() -> None:
        node = Node(tmp_path, config=GroupConfig(initial_rebalance_delay_ms=0))
        part, ctx, _ = await committed_seven(node)
        part.log.config = LogConfig(max_message_bytes=400)  # as an altered topic config does
        joined = await join_g(node, 10_000)
        sync = t.SyncGroupRequest(
            group_id="g",
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            assignments=(
                t.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"x" * 400),
            ),
        )
        synced = await asyncio.wait_for(
            node.runtime.call("g", lambda s, tok, now: s.handle_sync_group(tok, sync, now)), 5
        )
        assert synced.error_code is Errors.UNKNOWN_SERVER_ERROR
        assert node.runtime.contexts[0] is ctx and ctx.state is ShardState.ACTIVE
        await asyncio.wait_for(node.runtime.call("other", commit("other", 5)), 5)
        node.runtime.close()

    asyncio.run(scenario())


def test_a_handler_that_raises_fails_its_request_and_others_may_retry(tmp_path: Path) -> None:
    """A bug in one shard call: its request gets UNKNOWN_SERVER_ERROR, the others waiting on
    the partition NOT_COORDINATOR (they were all given UNKNOWN_SERVER_ERROR); a commit's
    handler raising reloaded the shard too, at every retry of its client."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=0)
        part, ctx, _ = await committed_seven(node)
        node.replicas.hold = True
        waiting = node.runtime.submit("other", commit("other", 5), replay_only=True)

        def broken(shard: Any, token: int, now_ms: int) -> Any:
            raise RuntimeError("a bug")

        # A replay_only one (a commit) changed nothing: it fails alone and the shard stays.
        failing = node.runtime.submit("g", broken, replay_only=True)
        assert await refused(failing) is Errors.UNKNOWN_SERVER_ERROR
        assert node.runtime.contexts[0] is ctx and not waiting.done()
        # Any other may have changed a group before it raised: the shard reloads.
        failing = node.runtime.submit("g", broken)
        assert await refused(failing) is Errors.UNKNOWN_SERVER_ERROR
        assert await refused(waiting) is Errors.NOT_COORDINATOR
        assert node.runtime.contexts[0] is not ctx
        node.replicas.release(part)
        node.runtime.close()

    asyncio.run(scenario())


def _batches(lg: Log, start: int) -> list[int]:
    """The record count of each batch in the log from ``start``."""
    if start == lg.log_end_offset:
        return []
    return [h.record_count for _, h in fmt.iter_headers(lg.read(start, 1 << 30).records)]


async def _until(condition: Any, what: str, deadline_s: float = 5.0) -> None:
    """Poll ``condition`` every pass of the event loop until a deadline in time: a count of
    passes ran out before a 20 ms linger did on a fast machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0)


@pytest.mark.parametrize(("append_linger_ms", "batches"), [(0, [1, 1, 1]), (-1, [3]), (20, [3])])
def test_writes_wait_for_the_append_linger_and_go_out_as_one_batch(
    tmp_path: Path, append_linger_ms: int, batches: list[int]
) -> None:
    """``group.coordinator.append.linger.ms`` (Kafka's ``CoordinatorRuntime`` batches,
    KAFKA-16770; -1 is KAFKA-19826's adaptive linger): 0 appends each handler's records at
    once; -1 appends what handlers wrote in one pass of the event loop as one batch when the
    pass ends; a positive value keeps the batch open that long. Each write is replayed at
    once, so the next handler sees it, and answered only once its batch is committed."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=append_linger_ms)
        node.elect()
        await loaded(node)
        part = node.offsets_partition
        start = part.log.log_end_offset
        appended = node.runtime.batches_appended
        answers = [node.runtime.submit(f"g{i}", commit(f"g{i}", i)) for i in range(3)]
        assert node.runtime.contexts[0].last_written_offset == start + 3
        if append_linger_ms:
            assert part.log.log_end_offset == start  # the batch is still open
            await asyncio.sleep(0)
            if append_linger_ms > 0:
                assert part.log.log_end_offset == start  # open for the linger, not one pass
        await _until(lambda: part.log.log_end_offset == start + 3, "the batch appended")
        assert _batches(part.log, start) == batches
        assert node.runtime.batches_appended == appended + len(batches)
        assert not any(a.done() for a in answers)  # not committed yet
        node.replicas.release(part)
        for i, answer in enumerate(answers):
            response = await asyncio.wait_for(answer, 5)
            assert response.topics[0].partitions[0].error_code is Errors.NONE, i
        node.runtime.close()

    asyncio.run(scenario())


def test_a_batch_is_flushed_before_it_would_exceed_max_message_bytes(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=10_000)
        node.elect()
        await loaded(node)
        part = node.offsets_partition
        part.log.config = LogConfig(max_message_bytes=400)  # about two commits' records
        start = part.log.log_end_offset
        answers = [node.runtime.submit(f"g{i}", commit(f"g{i}", i)) for i in range(5)]
        # The full batches went out as the next write would not fit; the last one waits.
        assert part.log.log_end_offset > start
        node.runtime.contexts[0].flush()
        counts = _batches(part.log, start)
        assert sum(counts) == 5 and 1 < max(counts) < 5, counts
        node.replicas.release(part)
        for answer in answers:
            await asyncio.wait_for(answer, 5)
        node.runtime.close()

    asyncio.run(scenario())


def test_a_batch_the_log_refuses_reloads_the_shard_from_the_log(tmp_path: Path) -> None:
    """The batch's writes were replayed when written, so a refused append leaves the shard
    ahead of its log: its answers fail and the shard is reloaded (Kafka reverts its timeline
    to the last written offset instead; a shard here has no timeline)."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=-1)
        part, ctx, end = await committed_seven(node)
        pending = node.runtime.submit("g", commit("g", 8), replay_only=True)
        # The partition's max.message.bytes shrinks before the batch goes out.
        part.log.config = LogConfig(max_message_bytes=fmt.HEADER_SIZE)
        with pytest.raises(CoordinatorError) as e:
            await asyncio.wait_for(pending, 5)
        assert e.value.code is Errors.UNKNOWN_SERVER_ERROR
        assert part.log.log_end_offset == end
        assert node.runtime.contexts[0] is not ctx and ctx.state is ShardState.CLOSED
        part.log.config = LogConfig()
        await loaded(node)
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        assert offsets.topics[0].partitions[0].committed_offset == 7
        node.runtime.close()

    asyncio.run(scenario())


def test_a_batch_whose_append_raises_unexpectedly_fails_its_answers_and_reloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append that raised anything but a KafkaError escaped the lingering batch's
    callback: the batch was gone, its records replayed but never appended, the shard served
    on, and the next batch went to the log at the lost one's offsets. With an ISR of the
    leader alone the high watermark moved within that append, and the lost commit was
    answered as written (found by a review). Kafka's flushCurrentBatch fails the batch on
    any Throwable; and no answer goes out before an append is known to be where its records
    were replayed."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=-1)
        part, ctx, end = await committed_seven(node)
        real_append = node.replicas.append_local
        failures = [RuntimeError("a bug inside the append")]

        def append_local(*args: Any, **kwargs: Any) -> Any:
            if failures:
                raise failures.pop()
            return real_append(*args, **kwargs)

        monkeypatch.setattr(node.replicas, "append_local", append_local)
        lost = node.runtime.submit("g1", commit("g1", 42))
        await _until(lambda: not failures, "the failed append")
        try:  # the next write (refused at once while the shard reloads)
            later = node.runtime.submit("g2", commit("g2", 5))
        except CoordinatorError as refused:
            assert refused.code is Errors.COORDINATOR_LOAD_IN_PROGRESS
        else:
            with contextlib.suppress(CoordinatorError):  # NOT_COORDINATOR: it was reloaded
                await asyncio.wait_for(later, 5)
        with pytest.raises(CoordinatorError) as e:
            await asyncio.wait_for(lost, 5)
        assert e.value.code is Errors.UNKNOWN_SERVER_ERROR
        assert ctx.state is ShardState.CLOSED
        await loaded(node)
        offsets = await asyncio.wait_for(node.runtime.call("g1", fetch("g1")), 5)
        assert [p.committed_offset for t in offsets.topics for p in t.partitions] == []
        assert part.log.log_end_offset >= end
        node.runtime.close()

    asyncio.run(scenario())


def test_a_batch_appended_at_other_offsets_answers_nothing_as_written(tmp_path: Path) -> None:
    """A batch's records went from the log without the shard knowing (as a batch whose
    append raised was lost), and the next batch was appended at their offsets: the shard is
    failed, as Kafka's runtime fails. With an ISR of the leader alone the high watermark
    moved within that append, past the lost batch's answers, which went out as written
    before the offsets were compared; now none goes out until they agree."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=-1)
        part, ctx, end = await committed_seven(node)
        node.replicas.hold = True
        lost = node.runtime.submit("g1", commit("g1", 42))
        await _until(lambda: part.log.log_end_offset == end + 1, "g1's batch appended")
        part.log.truncate_to(end)  # its records gone, the shard none the wiser
        node.replicas.hold = False
        later = node.runtime.submit("g2", commit("g2", 5))
        for answer in (lost, later):
            with pytest.raises(CoordinatorError) as e:
                await asyncio.wait_for(answer, 5)
            assert e.value.code is Errors.NOT_COORDINATOR
        assert ctx.state is ShardState.CLOSED
        node.runtime.close()

    asyncio.run(scenario())


def test_a_replay_step_cancelled_as_its_turn_came_passes_the_turn_on() -> None:
    """A load unloaded (its task cancelled) just as the turn was handed to it kept the turn:
    every replay of the node waited for ever."""

    async def scenario() -> None:
        turns = _ReplayTurns()
        entered: list[str] = []

        async def step(name: str) -> None:
            async with turns.turn(urgent=False):
                entered.append(name)

        async with turns.turn(urgent=True):
            doomed = asyncio.create_task(step("doomed"))
            other = asyncio.create_task(step("other"))
            await _until(lambda: len(turns._waiting[1]) == 2, "both steps waiting")
        doomed.cancel()  # handed the turn as the block ended, cancelled before it ran
        await asyncio.wait_for(other, 5)
        assert entered == ["other"] and doomed.cancelled()

    asyncio.run(scenario())


async def groups_committed(node: Node, count: int) -> Partition:
    """Elect the node and load its shard; groups g0, g1, ... commit offsets 0, 1, ... (the
    HW follows appends from here on). Returns the offsets partition."""
    node.elect()
    await loaded(node)
    node.replicas.hold = False
    for i in range(count):
        await asyncio.wait_for(node.runtime.call(f"g{i}", commit(f"g{i}", i)), 5)
    return node.offsets_partition


@pytest.mark.parametrize("append_linger_ms", [0, -1])
def test_a_deleted_topics_tombstones_go_out_in_batches_that_fit(
    tmp_path: Path, append_linger_ms: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic deletion writes a tombstone for every group's offsets on it: more than one
    batch may hold. They are split over batches that fit ``max.message.bytes`` (Kafka's
    non-atomic ``CoordinatorResult``), not refused whole, which unloaded the shard, failed an
    unrelated commit already in the log, and never deleted the offsets. Each is encoded once
    (the split encoded them all, and the write again)."""

    async def scenario() -> None:
        node = Node(tmp_path, append_linger_ms=append_linger_ms)
        part = await groups_committed(node, 40)
        node.replicas.hold = True
        part.log.config = LogConfig(max_message_bytes=600)  # some 15 tombstones a batch
        ctx = node.runtime.contexts[0]
        pending = node.runtime.submit("other", commit("other", 1), replay_only=True)
        start = part.log.log_end_offset if append_linger_ms == 0 else ctx.last_written_offset
        encoded: list[object] = []

        def counted(record: Any) -> tuple[bytes, bytes | None]:
            encoded.append(record)
            return encode_record(record)

        monkeypatch.setattr(rt, "encode_record", counted)
        ctx.run(lambda shard, _token: shard.on_partitions_deleted([("orders", 0)]), 0)
        assert len(encoded) == 41  # "other" has an offset there too
        ctx.flush()
        assert node.runtime.contexts[0] is ctx and ctx.state is ShardState.ACTIVE
        batches = _batches(part.log, start)
        assert sum(batches) == 41 and len(batches) > 1, batches  # "other" committed too
        node.replicas.release(part)
        await asyncio.wait_for(pending, 5)  # answered: its commit is in the log
        for group in ("g3", "other"):
            got = await asyncio.wait_for(node.runtime.call(group, fetch(group)), 5)
            assert got.topics == (), (group, got)
        node.runtime.close()

    asyncio.run(scenario())


def test_a_deleted_topics_offsets_are_deleted_by_a_callback_of_each_shard(
    tmp_path: Path,
) -> None:
    """Kafka's onPartitionsDeleted is an event on every shard; here every shard's tombstones
    were written in the one callback of the metadata delta (3.4 s of the event loop for
    500,000 offsets over 50 shards). Each shard's write is now a callback of its own."""

    async def scenario() -> None:
        node = Node(tmp_path)
        await groups_committed(node, 3)
        ctx = node.runtime.contexts[0]
        orders = "AAAAAAAAAAAAAAAAAAAAAQ"
        before = MetadataImage.from_records(
            1,
            [
                rec.Topic(name="orders", topic_id=orders),
                rec.Partition(
                    topic_id=orders,
                    partition=0,
                    replicas=(1,),
                    isr=(1,),
                    leader=1,
                    leader_epoch=0,
                    partition_epoch=0,
                ),
            ],
        )
        written = ctx.last_written_offset
        for _ in range(5):  # other shards' work queued first: this shard's turn comes later
            node.runtime.in_turn(lambda: None)
        node.runtime.on_metadata_delta(diff(before, MetadataImage.from_records(2, [])))
        assert ctx.last_written_offset == written  # not in the delta's callback
        # A commit to "orders" made again, before the shard's turn: the deletion runs first.
        await asyncio.wait_for(node.runtime.call("g0", commit("g0", 42)), 5)
        await _until(lambda: ctx.last_written_offset == written + 4, "the tombstones")
        got = await asyncio.wait_for(node.runtime.call("g0", fetch("g0")), 5)
        assert [p.committed_offset for t in got.topics for p in t.partitions] == [42]
        for group in ("g1", "g2"):
            got = await asyncio.wait_for(node.runtime.call(group, fetch(group)), 5)
            assert got.topics == (), (group, got)
        node.runtime.close()

    asyncio.run(scenario())


def test_costly_shard_work_takes_a_turn_of_the_loop_each(tmp_path: Path) -> None:
    """Callbacks due together run back to back with no I/O between them: the shards loaded
    together fire their expiration passes together, and a deleted topic's tombstones were
    written by every shard in one go. Such work runs one piece a turn (``in_turn``), in
    order, a failing piece alone failing."""

    async def scenario() -> None:
        node = Node(tmp_path)
        await groups_committed(node, 1)
        runtime, ctx = node.runtime, node.runtime.contexts[0]
        ran: list[str] = []

        def failing() -> None:
            ran.append("b")
            raise RuntimeError("a bug")

        runtime.in_turn(lambda: ran.append("a"))
        runtime.in_turn(failing)
        runtime.in_turn(lambda: ran.append("c"))
        asyncio.get_running_loop().call_soon(ran.append, "other")
        await _until(lambda: len(ran) == 4, "the queued work")
        assert ran == ["a", "other", "b", "c"]
        # An expiration firing takes its turn; other timers run at once.
        queued: list[Any] = []
        real = runtime.in_turn
        runtime.in_turn = queued.append  # type: ignore[method-assign, assignment]
        ctx.fire_timer(GROUP_EXPIRATION_KEY, node.now)
        ctx.fire_timer("no-such-timer", node.now)
        assert len(queued) == 1
        runtime.in_turn = real  # type: ignore[method-assign]
        node.runtime.close()

    asyncio.run(scenario())


def test_replay_steps_of_many_shards_take_a_pass_of_the_loop_each() -> None:
    """Every task ready runs once a pass of the loop, so shards replaying together (a node's
    start, each follower partition's standby from the log start) ran a step each per pass,
    seconds of replay between two looks at the sockets, and heartbeats went unanswered
    (found by a review). A step now waits for its turn, one a pass, a load's before a
    standby's; a step cancelled as its turn came passes the turn on."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        turns = _ReplayTurns()
        events: list[str] = []
        running = True

        def a_pass() -> None:
            events.append("pass")
            if running:
                loop.call_soon(a_pass)

        async def replay(name: str, *, urgent: bool, steps: int) -> None:
            for _ in range(steps):
                async with turns.turn(urgent=urgent):
                    events.append(name)
                await asyncio.sleep(0)

        loop.call_soon(a_pass)
        standbys = [
            asyncio.create_task(replay(f"standby-{i}", urgent=False, steps=3)) for i in range(6)
        ]
        await asyncio.sleep(0)  # the standbys are replaying, all but one waiting for a turn
        doomed = asyncio.create_task(replay("doomed", urgent=True, steps=1))
        load = asyncio.create_task(replay("load", urgent=True, steps=3))
        await asyncio.sleep(0)
        doomed.cancel()
        await asyncio.wait_for(asyncio.gather(load, *standbys, return_exceptions=True), 5)
        running = False
        steps = [e for e in events if e != "pass"]
        assert sorted(steps) == sorted(["load"] * 3 + [f"standby-{i}" for i in range(6)] * 3)
        for before, after in itertools.pairwise(events):
            assert before == "pass" or after == "pass", events  # one step a pass
        first = steps.index("load")
        assert first <= 2, steps  # before the standbys queued ahead of it
        loads = [i for i, step in enumerate(steps) if step == "load"]
        # The standby handed the turn as the load stepped, and the one after it: it was
        # handed on as the load was back from its own pass, before it waited again.
        assert all(b - a <= 3 for a, b in itertools.pairwise(loads)), steps
        assert loads[-1] < len(steps) - 6, steps  # well before the standbys' last steps
        assert not turns._busy

    asyncio.run(scenario())


def test_a_load_that_fails_leaves_the_partition_unserved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error in the middle of a load: the context goes (Kafka's FAILED state), so
    requests get NOT_COORDINATOR and ListGroups the other shards, not
    COORDINATOR_LOAD_IN_PROGRESS for ever; the next leadership loads it again."""

    async def scenario() -> None:
        node = Node(tmp_path)
        part = await groups_committed(node, 30)
        node.runtime.unload(0, part.leader_epoch)
        node.runtime.replay_chunk_bytes = 100  # a few batches a step
        real_read = part.log.read
        reads = 0

        def failing_read(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            if reads == 2:
                raise OSError("EIO")
            return real_read(*args, **kwargs)

        monkeypatch.setattr(part.log, "read", failing_read)
        failed: list[str] = []
        monkeypatch.setattr(
            node.replicas.log_dir_failure, "fail", lambda what, error: failed.append(what)
        )
        node.runtime.schedule_load(part)
        await _until(lambda: 0 not in node.runtime.contexts, "the failed load's context went")
        assert node.runtime.load_failures == 1
        # An I/O error fails the data directory (a node halts), so the groups fail over.
        assert failed == ["loading __consumer_offsets-0"]
        with pytest.raises(CoordinatorError) as e:
            node.runtime.submit("g1", fetch("g1"))
        assert e.value.code is Errors.NOT_COORDINATOR
        assert node.runtime.list_groups(t.ListGroupsRequest()) == []
        monkeypatch.setattr(part.log, "read", real_read)
        node.runtime.schedule_load(part)
        await loaded(node)
        got = await asyncio.wait_for(node.runtime.call("g1", fetch("g1")), 5)
        assert got.topics[0].partitions[0].committed_offset == 1
        node.runtime.close()

    asyncio.run(scenario())


def test_a_shard_whose_on_loaded_raises_is_not_loaded_again_and_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_loaded`` raising failed the write and reloaded the partition, whose new load
    raised again: the node replayed the log for ever (a helper's probe: 957 loads in 0.5 s),
    with no load failure counted. The partition is not served now until its next
    leadership change, as Kafka's context goes FAILED when ``onLoaded`` throws."""

    async def scenario() -> None:
        node = Node(tmp_path)
        part = await groups_committed(node, 3)
        node.runtime.unload(0, part.leader_epoch)
        loads = len(node.runtime.loads)
        calls = 0

        def broken(self: GroupCoordinatorShard, now_ms: int) -> Any:
            nonlocal calls
            calls += 1
            raise RuntimeError("a bug in on_loaded")

        monkeypatch.setattr(GroupCoordinatorShard, "on_loaded", broken)
        node.runtime.schedule_load(part)
        await _until(lambda: node.runtime.load_failures == 1, "the load to fail")
        for _ in range(20):
            await asyncio.sleep(0)
        assert calls == 1 and len(node.runtime.loads) == loads  # not recorded as a load
        assert 0 not in node.runtime.contexts
        with pytest.raises(CoordinatorError) as e:
            node.runtime.submit("g1", fetch("g1"))
        assert e.value.code is Errors.NOT_COORDINATOR
        monkeypatch.undo()
        node.runtime.schedule_load(part)
        await loaded(node)
        got = await asyncio.wait_for(node.runtime.call("g1", fetch("g1")), 5)
        assert got.topics[0].partitions[0].committed_offset == 1
        node.runtime.close()

    asyncio.run(scenario())


def test_answers_waiting_longer_than_the_commit_timeout_fail_and_the_shard_stays(
    tmp_path: Path,
) -> None:
    """``offsets.commit.timeout.ms``: Kafka's runtime fails a write whose records the HW has not
    passed in that time with REQUEST_TIMED_OUT, answered COORDINATOR_NOT_AVAILABLE (the client
    looks the coordinator up again and retries). The records stay in the log and the shard
    stays loaded; reads waiting behind them time out alike."""

    async def scenario() -> None:
        node = Node(tmp_path, write_timeout_ms=50)
        node.elect()
        await loaded(node)
        part = node.offsets_partition
        ctx = node.runtime.contexts[0]
        started = asyncio.get_running_loop().time()
        write = node.runtime.submit("g", commit("g", 5))
        read = node.runtime.submit("g", fetch("g"))
        for answer in (write, read):
            with pytest.raises(CoordinatorError) as e:
                await asyncio.wait_for(answer, 5)
            assert e.value.code is Errors.COORDINATOR_NOT_AVAILABLE
        assert asyncio.get_running_loop().time() - started >= 0.05
        assert not ctx.deferred and node.runtime.contexts[0] is ctx
        assert ctx.state is ShardState.ACTIVE
        node.replicas.release(part)  # the follower catches up
        assert part.high_watermark == part.log.log_end_offset
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        assert offsets.topics[0].partitions[0].committed_offset == 5  # written all the same
        node.runtime.close()

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------
# Hot standby: a follower replays committed records as it replicates; promotion replays only
# the suffix above them.


class Replica:
    """A node hosting __consumer_offsets-0 with replicas (1, 2); ``elect`` picks the leader."""

    def __init__(self, data_dir: Path, node_id: int, *, hot_standby: bool = True) -> None:
        self.now = 1_000_000
        self.logs = LogManager(data_dir)
        self.logs.open()
        self.cache = MetadataCache(node_id, listener=_NoRoles())
        self.replicas = HeldReplicaManager(node_id, self.logs, self.cache, lambda: self.now)
        self.cache.listener = self.replicas
        self.runtime = CoordinatorRuntime(
            self.replicas,
            GroupConfig(),
            lambda: self.now,
            num_partitions=lambda: 1,
            hot_standby=hot_standby,
        )
        self.metadata_offset = 0

    def elect(self, leader: int, leader_epoch: int) -> None:
        self.metadata_offset += 1
        records: list[rec.MetadataRecord] = []
        if self.metadata_offset == 1:
            records += [
                rec.RegisterBroker(
                    broker_id=b,
                    incarnation_id=f"i{b}",
                    broker_epoch=1,
                    endpoints={"kafka": f"h:{b}"},
                    fenced=False,
                )
                for b in (1, 2)
            ]
            records.append(rec.Topic("__consumer_offsets", OFFSETS_ID, {}))
            records.append(rec.Topic("orders", ORDERS_ID, {}))
            records.append(rec.Partition(ORDERS_ID, 0, (1, 2), (1, 2), 1, 0, 0))
        # The leader alone in the ISR: its HW moves when the test releases it.
        state = self.cache.image.partition(OFFSETS_ID, 0)
        if state is None:
            records.append(rec.Partition(OFFSETS_ID, 0, (1, 2), (leader,), leader, 0, 0))
        else:
            records.append(
                rec.PartitionChange(
                    OFFSETS_ID, 0, state.partition_epoch, leader=leader, isr=(leader,)
                )
            )
        self.cache.apply(self.metadata_offset, records)
        state = self.cache.image.partition(OFFSETS_ID, 0)
        assert state is not None and state.leader_epoch == leader_epoch, state

    @property
    def part(self) -> Partition:
        part = self.replicas.get_partition("__consumer_offsets", 0)
        assert part is not None
        return part

    def replicate_from(self, leader: Replica, *, advance_high_watermark: bool = True) -> None:
        """Fetch what the leader has beyond our log end, as a follower does."""
        lg, src = self.part.log, leader.part.log
        if lg.log_end_offset < src.log_end_offset:
            lg.append_as_follower(src.read(lg.log_end_offset, 1 << 30).records, self.now)
        if advance_high_watermark:
            self.replicas.follow_leader_high_watermark(self.part, leader.part.high_watermark)


async def commit_on(node: Replica, group: str, offset: int) -> None:
    node.replicas.hold = False
    try:
        await asyncio.wait_for(node.runtime.call(group, commit(group, offset)), 5)
    finally:
        node.replicas.hold = True


async def active(runtime: CoordinatorRuntime) -> None:
    for _ in range(10_000):
        ctx = runtime.contexts.get(0)
        if ctx is not None and ctx.state is ShardState.ACTIVE:
            return
        await asyncio.sleep(0)  # the load task yields between chunks
    raise AssertionError("the shard never became active")


async def standby_at(runtime: CoordinatorRuntime, offset: int) -> None:
    for _ in range(10_000):
        standby = runtime.standbys.get(0)
        if standby is not None and standby.next_offset == offset:
            return
        await asyncio.sleep(0)
    standby = runtime.standbys.get(0)
    raise AssertionError(f"standby at {standby and standby.next_offset}, expected {offset}")


async def leader_and_follower(tmp_path: Path) -> tuple[Replica, Replica]:
    """Node 1 leading the offsets partition with its shard active, node 2 following it."""
    leader, follower = Replica(tmp_path / "a", 1), Replica(tmp_path / "b", 2)
    for node in (leader, follower):
        node.elect(leader=1, leader_epoch=0)
    await active(leader.runtime)
    return leader, follower


def test_a_promoted_standby_replays_only_the_suffix_above_its_high_watermark(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        leader, follower = await leader_and_follower(tmp_path)
        for i in range(20):
            await commit_on(leader, f"g{i % 3}", i)
        assert 0 not in follower.runtime.contexts
        follower.replicate_from(leader)
        hw = follower.part.high_watermark
        assert hw == leader.part.log.log_end_offset
        await standby_at(follower.runtime, hw)
        # Two more commits reach the follower's log but not its HW: the standby stays at the HW.
        await commit_on(leader, "g0", 100)
        await commit_on(leader, "g1", 101)
        follower.replicate_from(leader, advance_high_watermark=False)
        assert follower.part.log.log_end_offset == hw + 2
        for _ in range(100):
            await asyncio.sleep(0)
        assert follower.runtime.standbys[0].next_offset == hw
        # The leader dies; the follower is elected and promotes its standby.
        follower.elect(leader=2, leader_epoch=1)
        await active(follower.runtime)
        summary = follower.runtime.contexts[0].load_summary
        assert summary is not None and summary.hot and summary.records == 2
        assert 0 not in follower.runtime.standbys
        follower.replicas.release(follower.part)  # the new leader alone in the ISR commits
        for group, expected in (("g0", 100), ("g1", 101), ("g2", 17)):
            offsets = await asyncio.wait_for(follower.runtime.call(group, fetch(group)), 5)
            assert offsets.topics[0].partitions[0].committed_offset == expected, group
        # Back to follower (a newer leader): the shard unloads and a standby starts over.
        follower.elect(leader=1, leader_epoch=2)
        assert 0 not in follower.runtime.contexts
        await standby_at(follower.runtime, follower.part.high_watermark)
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


def test_a_truncation_below_the_standby_makes_it_replay_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader, follower = await leader_and_follower(tmp_path)
        for i in range(6):
            await commit_on(leader, "g", i)  # one record per batch
        follower.replicate_from(leader, advance_high_watermark=False)
        part = follower.part
        follower.replicas.follow_leader_high_watermark(part, 4)
        await standby_at(follower.runtime, 4)
        standby = follower.runtime.standbys[0]
        # A truncation at or above what the standby replayed keeps it; one below does not.
        part.log.truncate_to(5)
        assert standby.still_valid() and standby.truncations == part.log.truncations
        part.log.truncate_to(2)
        part.reset_high_watermark_to_log_end()
        assert not standby.still_valid()
        follower.replicate_from(leader)  # the same records again, and the HW to the end
        for _ in range(10_000):
            if standby.next_offset == 6 and standby.records == 6:
                break
            await asyncio.sleep(0)
        assert (standby.next_offset, standby.records) == (6, 6)  # replayed from the log start
        follower.elect(leader=2, leader_epoch=1)
        await active(follower.runtime)
        summary = follower.runtime.contexts[0].load_summary
        assert summary is not None and summary.hot and summary.records == 0
        follower.replicas.release(part)
        offsets = await asyncio.wait_for(follower.runtime.call("g", fetch("g")), 5)
        assert offsets.topics[0].partitions[0].committed_offset == 5
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


async def standby_behind_a_tombstone(tmp_path: Path) -> tuple[Replica, Replica, Standby, int]:
    """Leader and follower of a compacted offsets partition (delete.retention.ms 0) holding
    g's offset 42 (offset 0), h's commits, g's OffsetDelete tombstone and h's offset 9, the
    follower's standby at offset 1 (g's offset replayed, its tombstone not), and one cleaner
    pass made (it set the tombstone's horizon, dropping g's offset from the log). Returns
    them with the log end."""
    leader, follower = await leader_and_follower(tmp_path)
    await commit_on(leader, "g", 42)  # offset 0
    for i in range(3):
        await commit_on(leader, "h", i)
    leader.replicas.hold = False
    deleted = await asyncio.wait_for(leader.runtime.call("g", offset_delete("g")), 5)
    leader.replicas.hold = True
    assert deleted.error_code == Errors.NONE
    await commit_on(leader, "h", 9)
    follower.replicate_from(leader, advance_high_watermark=False)
    part = follower.part
    follower.replicas.follow_leader_high_watermark(part, 1)
    await standby_at(follower.runtime, 1)
    lg = part.log
    lg.config = replace(lg.config, cleanup_policy=frozenset({"compact"}), delete_retention_ms=0)
    lg.roll()
    end = lg.log_end_offset
    assert lg.compact(follower.now, high_watermark=end).tombstones_dropped == 0
    return leader, follower, follower.runtime.standbys[0], end


async def promoted_without_g(follower: Replica) -> LoadSummary | None:
    """``follower`` elected leader and its shard loaded, with g's offset gone (deleted, as a
    cold load has it); returns the load's summary."""
    follower.elect(leader=2, leader_epoch=1)
    await active(follower.runtime)
    summary = follower.runtime.contexts[0].load_summary
    follower.replicas.release(follower.part)
    offsets = await asyncio.wait_for(follower.runtime.call("g", fetch("g")), 5)
    assert not offsets.topics
    return summary


def test_a_tombstone_the_cleaner_drops_ahead_of_the_standby_makes_it_replay_again(
    tmp_path: Path,
) -> None:
    """A standby that replayed a key's value, and not yet its tombstone, when a cleaner pass
    dropped that tombstone (two passes: one sets its delete horizon, one past it drops it;
    delete.retention.ms may be 0) never learnt the key went: promoted, it answered an offset
    deleted by OffsetDelete, where a cold load (the latest record of each key) has none. A
    standby lags the HW while it replays a log from its start; here the HW is held."""

    async def scenario() -> None:
        leader, follower, standby, end = await standby_behind_a_tombstone(tmp_path)
        part = follower.part
        lg = part.log
        assert standby.still_valid()  # the tombstone is still there to replay
        assert lg.compact(follower.now + 1, high_watermark=end).tombstones_dropped == 1
        assert not standby.still_valid()
        follower.replicas.follow_leader_high_watermark(part, end)
        await _until(lambda: standby.next_offset == end, "the standby at the log end")
        # Later swaps, as swap_cleaned records them: one dropping tombstones it has read
        # keeps it (a running maximum restarted it for every later drop), more than the log
        # keeps an account of do not.
        lg.tombstone_drops += 1
        lg.tombstones_dropped_up_to.append(end - 1)
        assert standby.still_valid()
        lg.tombstone_drops += log_module.TOMBSTONE_DROPS_KEPT + 1
        assert not standby.still_valid()
        lg.tombstone_drops -= log_module.TOMBSTONE_DROPS_KEPT + 1
        await promoted_without_g(follower)
        kept = await asyncio.wait_for(follower.runtime.call("h", fetch("h")), 5)
        assert kept.topics[0].partitions[0].committed_offset == 9
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


def test_a_standby_begun_after_a_tombstone_got_its_horizon_goes_on_past_its_drop(
    tmp_path: Path,
) -> None:
    """The pass that gives a tombstone its horizon drops its key's older values: a standby
    that began replaying the log after it never read one, and the tombstone's drop ahead of
    it is no reason to replay again (it was, at every pass that dropped any tombstone)."""

    async def scenario() -> None:
        leader, follower, standby, end = await standby_behind_a_tombstone(tmp_path)
        part = follower.part
        lg = part.log
        follower.runtime._start_standby_over(standby, part)
        assert standby.next_offset == lg.log_start_offset
        assert lg.compact(follower.now + 1, high_watermark=end).tombstones_dropped == 1
        assert standby.still_valid()
        follower.replicas.follow_leader_high_watermark(part, end)
        await _until(lambda: standby.next_offset == end, "the standby at the log end")
        summary = await promoted_without_g(follower)
        assert summary is not None and summary.hot
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


def test_a_standby_past_a_truncation_counts_the_records_after_it_as_never_cleaned(
    tmp_path: Path,
) -> None:
    """A standby goes on past a truncation at or above where it stands (an unclean election
    on a follower). The records the new leader writes there were gone over by no pass when
    the standby began: a value it reads there, whose tombstone a pass drops before it gets
    there, was kept for good, the drop being below the log's first dirty offset of then."""
    config = LogConfig(
        cleanup_policy=frozenset({"compact"}), segment_bytes=600, delete_retention_ms=0
    )
    lg = open_log(tmp_path / "o-0", config)
    for i in range(20):
        lg.append_as_leader(batch(1, key=f"f{i}".encode(), value=b"v"), 0, now_ms=0)
    lg.roll()
    lg.compact(0)
    assert lg.first_dirty_offset == 20
    standby = Standby(
        cast(Partition, SimpleNamespace(log=lg)),
        lg,
        cast(GroupCoordinatorShard, None),
        cast(rt._ShardTimer, None),
        3,  # it read 0..2
        lg.truncations,
        lg.tombstone_drops,
        lg.first_dirty_offset,
    )
    assert lg.truncate_to(5) == 5
    assert standby.still_valid()  # at or above it: it goes on
    lg.append_as_leader(batch(1, key=b"x", value=b"V"), 0, now_ms=0)  # offset 5
    lg.append_as_leader(batch(1, key=b"x", value=None), 0, now_ms=0)  # its tombstone, 6
    for i in range(10):
        lg.append_as_leader(batch(1, key=f"g{i}".encode(), value=b"v"), 0, now_ms=0)
    lg.roll()
    standby.next_offset = 6  # x's value read
    assert standby.still_valid()
    lg.compact(0)  # x's value goes, its tombstone is given a horizon
    assert lg.compact(1).tombstones_dropped == 1
    assert not standby.still_valid()


def test_a_promotion_whose_standby_loses_a_tombstone_before_the_load_reads_loads_cold(
    tmp_path: Path,
) -> None:
    """The standby is checked when the shard is elected, and its load reads later: a cleaner
    swap in between that dropped a tombstone ahead of the standby went unseen (the load
    checked only after each read), and the promoted shard kept the deleted offset."""

    async def scenario() -> None:
        leader, follower, _, end = await standby_behind_a_tombstone(tmp_path)
        part = follower.part
        lg = part.log
        follower.elect(leader=2, leader_epoch=1)  # the standby taken, its load to come
        assert lg.compact(follower.now + 1, high_watermark=end).tombstones_dropped == 1
        await active(follower.runtime)
        summary = follower.runtime.contexts[0].load_summary
        assert summary is not None and not summary.hot  # loaded again, cold
        follower.replicas.release(part)
        offsets = await asyncio.wait_for(follower.runtime.call("g", fetch("g")), 5)
        assert not offsets.topics
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("stamped_before", [False, True])
def test_a_load_during_which_the_cleaner_drops_a_tombstone_ahead_loads_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stamped_before: bool,
) -> None:
    """A load reads the log a chunk at a time, the loop serving others in between; a cleaner
    swap there that dropped a tombstone the load had not reached (its key's value already
    read) left the deleted offset in the loaded shard, as for a standby. It loads again;
    not when the pass that gave the tombstone its horizon (and dropped the key's value) came
    before the load began: it restarted at every pass dropping any tombstone ahead, for
    ever under steady expiry (review helper-285)."""

    async def scenario() -> None:
        node = Node(tmp_path)
        node.elect()
        await loaded(node)
        part = node.offsets_partition
        node.replicas.hold = False
        await asyncio.wait_for(node.runtime.call("g", commit("g", 42)), 5)  # offset 0
        # A record every pass keeps, the first chunk read either way.
        await asyncio.wait_for(node.runtime.call("k", commit("k", 7)), 5)
        for i in range(3):
            await asyncio.wait_for(node.runtime.call("h", commit("h", i)), 5)
        await asyncio.wait_for(node.runtime.call("g", offset_delete("g")), 5)
        await asyncio.wait_for(node.runtime.call("h", commit("h", 9)), 5)
        lg = part.log
        lg.config = replace(lg.config, delete_retention_ms=0)
        lg.roll()
        end = lg.log_end_offset
        node.runtime.unload(0, part.leader_epoch)
        node.runtime.replay_chunk_bytes = 1  # a batch a chunk
        real_scan = LatestRecords.scan
        cleaned: list[int] = []

        # Two passes: the first drops g's offset and sets the tombstone's horizon (0 ms on),
        # the second drops the tombstone.
        passes = [node.now, node.now + 1]
        if stamped_before:
            cleaned.append(lg.compact(passes.pop(0), high_watermark=end).tombstones_dropped)

        def scan_then_clean(latest: LatestRecords, *args: Any) -> Any:
            scanned = real_scan(latest, *args)
            if passes:  # after the first chunk, before the loop goes on
                for now in passes:
                    cleaned.append(lg.compact(now, high_watermark=end).tombstones_dropped)
                passes.clear()
            return scanned

        monkeypatch.setattr(LatestRecords, "scan", scan_then_clean)
        with caplog.at_level(logging.INFO, logger="kcoord.node.runtime"):
            node.runtime.schedule_load(part)
            await loaded(node)
        assert cleaned == [0, 1]
        again = [r for r in caplog.records if "loading again" in r.getMessage()]
        assert len(again) == (0 if stamped_before else 1)
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        assert not offsets.topics
        kept = await asyncio.wait_for(node.runtime.call("h", fetch("h")), 5)
        assert kept.topics[0].partitions[0].committed_offset == 9
        node.runtime.close()

    asyncio.run(scenario())


def test_a_load_of_a_log_whose_tail_the_cleaner_emptied_completes(tmp_path: Path) -> None:
    """KAFKA-9065: the cleaner can empty a log's tail, so the last batch kept ends below the log
    end offset; Kafka's loader looped for ever reading nothing there. A read that returns
    nothing ends the load, whose shard holds what the log kept."""

    async def scenario() -> None:
        node = Node(tmp_path)
        node.elect()
        await loaded(node)
        part = node.offsets_partition
        node.replicas.hold = False
        await asyncio.wait_for(node.runtime.call("h", commit("h", 7)), 5)  # offset 0
        await asyncio.wait_for(node.runtime.call("g", commit("g", 42)), 5)
        await asyncio.wait_for(node.runtime.call("g", offset_delete("g")), 5)
        lg = part.log
        lg.config = replace(lg.config, delete_retention_ms=0)
        lg.roll()
        end = lg.log_end_offset
        # Two passes: g's offset, then its tombstone (its horizon set by the first).
        dropped = [
            lg.compact(now, high_watermark=end).tombstones_dropped
            for now in (node.now, node.now + 1)
        ]
        assert dropped == [0, 1]
        kept = lg.read(lg.log_start_offset, 1 << 20).records
        assert [h.next_offset for _, h in fmt.iter_headers(kept)] == [1] and end == 3
        node.runtime.unload(0, part.leader_epoch)
        node.runtime.replay_chunk_bytes = 1  # a batch a chunk
        node.runtime.schedule_load(part)
        await asyncio.wait_for(loaded(node), 10)
        offsets = await asyncio.wait_for(node.runtime.call("g", fetch("g")), 5)
        assert not offsets.topics
        left = await asyncio.wait_for(node.runtime.call("h", fetch("h")), 5)
        assert left.topics[0].partitions[0].committed_offset == 7
        node.runtime.close()

    asyncio.run(scenario())


def test_a_standby_whose_replay_failed_starts_again_at_once(tmp_path: Path) -> None:
    """A replay that failed part way through a chunk marked the standby invalid with a
    truncation count of -1, which a log never truncated read as valid: the half-replayed
    shard was kept (replayed into again from where it was, and promoted as it was). It is
    replaced by a new one from the log start at once."""

    async def scenario() -> None:
        leader, follower = await leader_and_follower(tmp_path)
        for i in range(6):
            await commit_on(leader, "g", i)  # one record per batch
        standby = follower.runtime.standbys[0]
        broken = standby.shard
        real = type(broken).replay_offset_commit

        def replay(offset: int, fields: Any) -> Any:
            if offset == 3:
                raise RuntimeError("replaying offset 3 failed")
            return real(broken, offset, fields)

        broken.replay_offset_commit = replay  # type: ignore[method-assign,assignment]
        follower.replicate_from(leader)  # six records and the HW in one fetch
        await _until(lambda: standby.shard is not broken, "a new standby shard")
        assert standby.next_offset == 0 and standby.records == 0
        # After its back-off (1 s) it replays the log into the new shard.
        deadline = asyncio.get_running_loop().time() + 30
        while standby.next_offset < 6:
            assert asyncio.get_running_loop().time() < deadline, standby.next_offset
            await asyncio.sleep(0.01)  # polling the standby, with a deadline
        assert standby.records == 6
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


def test_a_standby_whose_log_read_fails_on_disk_fails_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error reading the follower's log into its standby halts the node, as a load's
    does and as Kafka's reads do (maybeHandleIOException): it was retried every second from
    the log start, failing for ever while the node went on following the partition."""

    async def scenario() -> None:
        leader, follower = await leader_and_follower(tmp_path)
        halts: list[int] = []
        follower.replicas.log_dir_failure = LogDirFailureChannel(tmp_path / "b", halt=halts.append)
        await commit_on(leader, "g", 0)
        standby = follower.runtime.standbys[0]

        def failing(*args: object, **kwargs: object) -> Any:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(follower.part.log, "read", failing)
        follower.replicate_from(leader)
        await _until(lambda: bool(halts), "the data directory failed")
        assert halts == [1]
        await _until(lambda: 0 not in follower.runtime.standbys, "the standby dropped")
        assert standby.closed
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


def test_a_standby_whose_task_fails_outside_its_replay_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception outside the replay's own handling (the standby's validity check) ended
    its task unseen, and the standby stayed registered, never advancing (review helper-280):
    it is said and dropped, and a promotion loads cold."""

    async def scenario() -> None:
        leader, follower = await leader_and_follower(tmp_path)
        standby = follower.runtime.standbys[0]

        def broken() -> bool:
            raise RuntimeError("validity check failed")

        monkeypatch.setattr(standby, "still_valid", broken)
        await commit_on(leader, "g", 0)
        follower.replicate_from(leader)
        await _until(lambda: 0 not in follower.runtime.standbys, "the standby dropped")
        assert standby.closed
        for node in (leader, follower):
            node.runtime.close()

    with caplog.at_level("ERROR", logger=rt.__name__):
        asyncio.run(scenario())
    assert any("standby stopped" in r.getMessage() for r in caplog.records)


def test_without_hot_standby_a_promotion_replays_the_whole_log(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader = Replica(tmp_path / "a", 1)
        follower = Replica(tmp_path / "b", 2, hot_standby=False)
        for node in (leader, follower):
            node.elect(leader=1, leader_epoch=0)
        await active(leader.runtime)
        for i in range(5):
            await commit_on(leader, "g", i)
        follower.replicate_from(leader)
        assert not follower.runtime.standbys
        follower.elect(leader=2, leader_epoch=1)
        await active(follower.runtime)
        summary = follower.runtime.contexts[0].load_summary
        assert summary is not None and not summary.hot and summary.records == 5
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


def _offsets_key(group: str, partition: int) -> OffsetCommitKey:
    return OffsetCommitKey(group_id=group, topic="orders", partition=partition)


def _new_shard() -> GroupCoordinatorShard:
    return GroupCoordinatorShard(GroupConfig(), MockTimer(), lambda prefix: f"{prefix}-x")


def test_a_cold_replay_builds_the_state_record_by_record_replay_builds(tmp_path: Path) -> None:
    """Log replay reads OffsetCommit records at version 3 from their fields alone; the shard it
    builds equals one fed every record through ``GroupCoordinatorShard.replay``."""

    records = [
        CoordinatorRecord(_offsets_key("a", 0), OffsetCommitValue(offset=5, commit_timestamp_ms=1)),
        CoordinatorRecord(_offsets_key("a", 1), OffsetCommitValue(offset=7, commit_timestamp_ms=2)),
        CoordinatorRecord(  # version 1: a commit with a retention time (KIP-211)
            _offsets_key("b", 0),
            OffsetCommitValue(offset=3, commit_timestamp_ms=3, expire_timestamp_ms=99),
        ),
        CoordinatorRecord(_offsets_key("a", 1), None),  # a tombstone deletes the offset
        CoordinatorRecord(
            GroupMetadataKey(group_id="c"),
            GroupMetadataValue(
                protocol_type="consumer",
                generation=0,
                protocol=None,
                leader=None,
                current_state_timestamp_ms=4,
                members=(),
            ),
        ),
        CoordinatorRecord(
            _offsets_key("c", 0), OffsetCommitValue(offset=9, metadata="m", commit_timestamp_ms=5)
        ),
        CoordinatorRecord(
            _offsets_key("a", 0), OffsetCommitValue(offset=6, leader_epoch=2, commit_timestamp_ms=6)
        ),
    ]
    lg = Log.open(tmp_path / "log", LogConfig(cleanup_policy=frozenset({"compact"})))
    encoded = [encode_record(r) for r in records]
    for i in range(0, len(encoded), 3):
        batch = [fmt.Record(j, 0, k, v) for j, (k, v) in enumerate(encoded[i : i + 3])]
        lg.append_as_leader(fmt.build_batch(batch), leader_epoch=0, now_ms=0)

    replayed = _new_shard()
    offset, count, _ = _replay_chunk(
        replayed, RecordDecoder(), lg, 0, max_offset=None, max_bytes=1 << 20
    )
    expected = _new_shard()
    for record_offset, (k, v) in enumerate(encoded):
        expected.replay(record_offset, decode_record(k, v))
    assert (offset, count) == (len(records), len(records))
    assert replayed.offsets == expected.offsets
    assert set(replayed.groups) == set(expected.groups) == {"a", "b", "c"}
    assert replayed.offsets["a"]["orders"][0].leader_epoch == 2
    assert replayed.offsets["b"]["orders"][0].expire_timestamp_ms == 99
    assert 1 not in replayed.offsets["a"]["orders"]
    lg.close()


# Records over a few keys, so that keys repeat: commits and offset tombstones of classic,
# simple and consumer groups, classic group metadata, consumer group epochs, and deletions as
# Kafka writes them (DeleteGroups, expiry): the offsets' tombstones, then the group's.
def _delete(group: str, group_key: Any) -> list[CoordinatorRecord]:
    return [CoordinatorRecord(_offsets_key(group, p), None) for p in range(3)] + [
        CoordinatorRecord(group_key, None)
    ]


_RECORDS = st.one_of(
    st.builds(
        lambda group, partition, offset: [
            CoordinatorRecord(
                _offsets_key(group, partition),
                None if offset < 0 else OffsetCommitValue(offset=offset, commit_timestamp_ms=1),
            )
        ],
        st.sampled_from(["a", "s", "cg"]),
        st.integers(0, 2),
        st.integers(-1, 50),
    ),
    st.builds(
        lambda generation: [
            CoordinatorRecord(
                GroupMetadataKey(group_id="a"),
                GroupMetadataValue(
                    protocol_type="consumer",
                    generation=generation,
                    protocol=None,
                    leader=None,
                    current_state_timestamp_ms=generation,
                    members=(),
                ),
            )
        ],
        st.integers(0, 5),
    ),
    st.builds(
        lambda epoch: [
            CoordinatorRecord(
                ConsumerGroupMetadataKey(group_id="cg"), ConsumerGroupMetadataValue(epoch=epoch)
            )
        ],
        st.integers(0, 5),
    ),
    st.just(_delete("a", GroupMetadataKey(group_id="a"))),
    st.just(_delete("s", GroupMetadataKey(group_id="s"))),
    st.just(_delete("cg", ConsumerGroupMetadataKey(group_id="cg"))),
)


def _write(lg: Log, records: list[CoordinatorRecord], per_batch: int, compress_odd: bool) -> None:
    encoded = [encode_record(r) for r in records]
    for n, i in enumerate(range(0, len(encoded), per_batch)):
        batch = [fmt.Record(j, 0, k, v) for j, (k, v) in enumerate(encoded[i : i + per_batch])]
        codec = fmt.Compression.GZIP if compress_odd and n % 2 else fmt.Compression.NONE
        lg.append_as_leader(fmt.build_batch(batch, compression=codec), leader_epoch=0, now_ms=0)


def _state(shard: GroupCoordinatorShard) -> tuple[Any, ...]:
    """What a load must rebuild. An empty simple group whose offsets were all deleted is left
    out: replaying every record leaves one behind, the compacted log does not (as in Kafka; the
    group expiry removes it)."""
    groups = {
        gid: group
        for gid, group in shard.groups.items()
        if group.protocol_type is not None or group.members or gid in shard.offsets
    }
    return dict(shard.offsets), groups, dict(shard.consumer_groups)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_RECORDS, min_size=1, max_size=40),
    per_batch=st.integers(1, 7),
    compress_odd=st.booleans(),
    max_keys=st.integers(1, 20),
)
def test_a_cold_load_of_the_latest_record_per_key_builds_what_replaying_every_record_builds(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[list[CoordinatorRecord]],
    per_batch: int,
    compress_odd: bool,
    max_keys: int,
) -> None:
    """``LatestRecords`` (the cold load) against ``_replay_chunk`` over every record: the same
    offsets, classic groups and consumer groups, also when the scan flushes in stretches
    (``MAX_KEYS``) and with compressed batches (read by our decoder, not aiokafka's)."""
    records = [record for step in steps for record in step]
    lg = Log.open(tmp_path_factory.mktemp("log"), LogConfig(cleanup_policy=frozenset({"compact"})))
    _write(lg, records, per_batch, compress_odd)
    every = _new_shard()
    offset, count, _ = _replay_chunk(
        every, RecordDecoder(), lg, 0, max_offset=None, max_bytes=1 << 20
    )
    assert (offset, count) == (len(records), len(records))

    latest_shard, decoder, latest = _new_shard(), RecordDecoder(), LatestRecords()
    latest.MAX_KEYS = max_keys
    offset, scanned = 0, 0
    while offset < lg.log_end_offset:
        offset, n, _ = latest.scan(lg, offset, 64)  # small reads: one batch at a time
        scanned += n
        if len(latest.latest) >= latest.MAX_KEYS:
            replay_latest(latest_shard, decoder, latest.take_ordered())
    replay_latest(latest_shard, decoder, latest.take_ordered())
    assert scanned == len(records)
    assert _state(latest_shard) == _state(every)
    lg.close()


def test_a_cold_load_replays_one_record_per_key_and_a_consumer_group_replaces_its_simple_group(
    tmp_path: Path,
) -> None:
    """A consumer group whose epoch record comes after its offsets in the compacted log: the
    commit replayed first makes a simple group, the group's record overrides it (Kafka's
    ``getOrMaybeCreatePersistedConsumerGroup``), so ListGroups shows one group, not two."""
    records = [
        CoordinatorRecord(
            ConsumerGroupMetadataKey(group_id="cg"), ConsumerGroupMetadataValue(epoch=1)
        ),
        *(
            CoordinatorRecord(
                _offsets_key("cg", 0), OffsetCommitValue(offset=i, commit_timestamp_ms=i)
            )
            for i in range(100)
        ),
        CoordinatorRecord(
            ConsumerGroupMetadataKey(group_id="cg"), ConsumerGroupMetadataValue(epoch=2)
        ),
    ]
    lg = Log.open(tmp_path / "log", LogConfig(cleanup_policy=frozenset({"compact"})))
    _write(lg, records, 10, compress_odd=False)
    shard, latest = _new_shard(), LatestRecords()
    assert latest.scan(lg, 0, 1 << 20)[:2] == (102, 102)
    assert replay_latest(shard, RecordDecoder(), latest.take_ordered()) == 2
    assert shard.offsets["cg"]["orders"][0].committed_offset == 99
    assert shard.offsets["cg"]["orders"][0].record_offset == 100
    assert shard.consumer_groups["cg"].group_epoch == 2
    assert "cg" not in shard.groups
    lg.close()


def test_a_follower_no_longer_hosting_the_partition_drops_its_standby(tmp_path: Path) -> None:
    """StopReplica of a follower (its topic deleted, or moved off this node): the hot standby
    that followed it is closed and forgotten, not left waiting with the whole shard."""

    async def scenario() -> None:
        leader, follower = await leader_and_follower(tmp_path)
        await commit_on(leader, "g", 1)
        follower.replicate_from(leader)
        await standby_at(follower.runtime, follower.part.high_watermark)
        standby = follower.runtime.standbys[0]
        follower.metadata_offset += 1
        follower.cache.apply(follower.metadata_offset, [rec.RemoveTopic(OFFSETS_ID)])
        assert follower.replicas.get_partition("__consumer_offsets", 0) is None
        assert 0 not in follower.runtime.standbys and standby.closed
        for node in (leader, follower):
            node.runtime.close()

    asyncio.run(scenario())


def test_a_partition_offline_at_start_up_is_not_hosted_and_fails_no_log_directory(
    tmp_path: Path,
) -> None:
    """A partition whose log could not be opened is offline (LogManager.open) and the others
    are served. Its role change then tried to create its log, which failed the log directory:
    a node halted on every start, once it had registered."""
    broken = tmp_path / "orders-0"
    broken.mkdir(parents=True)
    (broken / "00000000000000000000.log").mkdir()  # a directory where a segment should be
    node = Node(tmp_path)
    assert ("orders", 0) in node.logs.offline
    failures: list[str] = []
    node.replicas.log_dir_failure.fail = lambda what, error: failures.append(what)  # type: ignore[method-assign]
    node.elect()
    assert failures == []
    assert ("orders", 0) not in node.replicas.partitions
    assert node.replicas.get_partition("__consumer_offsets", 0) is not None


def test_a_record_that_does_not_decode_fails_the_load(tmp_path: Path) -> None:
    """CoordinatorLoaderImpl: only an unknown record type is skipped; a known one that does
    not decode (a value version from a newer build) fails the load, which leaves the shard
    unserved, rather than serving the offset before it or none."""

    async def scenario() -> None:
        node = Node(tmp_path)
        part = await groups_committed(node, 1)
        key = OffsetCommitKey(group_id="g0", topic="orders", partition=0)
        k, v = encode_record(
            CoordinatorRecord(key, OffsetCommitValue(offset=9, commit_timestamp_ms=1))
        )
        assert v is not None
        future = b"\x00\x07" + v[2:]  # a value version this build does not read
        node.replicas.append_local(part, fmt.build_batch([fmt.Record(0, node.now, k, future)]))
        with pytest.raises(UndecodableRecordError, match="does not decode"):
            _replay_chunk(
                _new_shard(), RecordDecoder(), part.log, 0, max_offset=None, max_bytes=1 << 20
            )
        node.runtime.unload(0, part.leader_epoch)
        node.runtime.schedule_load(part)
        await _until(lambda: 0 not in node.runtime.contexts, "the failed load's context went")
        assert node.runtime.load_failures == 1
        with pytest.raises(CoordinatorError) as e:
            node.runtime.submit("g0", fetch("g0"))
        assert e.value.code is Errors.NOT_COORDINATOR
        node.runtime.close()

    asyncio.run(scenario())


def test_timers_fire_after_their_delay_whatever_the_wall_clock_says(tmp_path: Path) -> None:
    """CoordinatorTimerImpl: a timer fires when its delay has passed on a monotonic clock. The
    node's clock here stands still, as a wall clock stepped back does for the size of the
    step: the dead member must still go at its session timeout, not the step later."""

    async def scenario() -> None:
        config = GroupConfig(min_session_timeout_ms=1000, initial_rebalance_delay_ms=0)
        node = Node(tmp_path, config=config)
        node.elect()
        await loaded(node)
        node.replicas.hold = False
        # A second's session: the member is still there when looked at below, on a loaded
        # machine too (with 50 ms it could have gone already).
        joined = await join_g(node, 1000)
        shard = node.runtime.contexts[0].shard
        assert shard is not None
        group = shard.group("g")
        assert group is not None and joined.member_id in group.members
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10  # the timer is due a second after the join
        while group.members and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert not group.members, "the session timer never fired"
        node.runtime.close()

    asyncio.run(scenario())


def test_a_read_of_one_group_waits_for_that_groups_writes_only(tmp_path: Path) -> None:
    """Kafka's read operations answer from the last committed state at once: a group's
    OffsetFetch or DescribeGroups behind another group's commit stuck on a lagging follower
    waited for it, and failed with it after the commit timeout. It waits for its own group's
    pending writes only (ListGroups: see the committed-listing tests)."""

    async def scenario() -> None:
        node = await held_after_commits(tmp_path, "B")
        part = node.offsets_partition
        stuck = node.runtime.submit("A", commit("A", 1))
        describe = t.DescribeGroupsRequest(groups=("B",))
        other = node.runtime.submit("B", fetch("B"))
        described = node.runtime.submit(
            "B", lambda s, tok, now: s.handle_describe_groups(tok, describe, now)
        )
        own = node.runtime.submit("A", fetch("A"))
        offsets = await asyncio.wait_for(other, 5)
        assert offsets.topics[0].partitions[0].committed_offset == 10
        assert (await asyncio.wait_for(described, 5)).groups[0].group_id == "B"
        for _ in range(10):
            await asyncio.sleep(0)
        assert not own.done() and not stuck.done()
        node.replicas.release(part)
        await asyncio.wait_for(stuck, 5)
        fetched = await asyncio.wait_for(own, 5)
        assert fetched.topics[0].partitions[0].committed_offset == 1
        node.runtime.close()

    asyncio.run(scenario())


def test_a_starting_node_loads_no_shard_until_it_has_caught_up(tmp_path: Path) -> None:
    """Leaderships a restarting node replays from its own metadata log may be over (another
    leader elected while it was down): loaded at once, a stale shard wrote at an old epoch.
    The node's metadata cache holds the replay until the node has caught up; its release
    loads the shards the image has it lead then, and none it led only on the way."""

    async def scenario() -> None:
        node = Node(tmp_path, hold=True)
        node.elect()
        assert node.runtime.contexts == {}
        node.cache.release()
        await loaded(node)
        assert node.runtime.contexts[0].state is ShardState.ACTIVE
        node.runtime.close()

        moved = Node(tmp_path / "moved", hold=True)
        moved.elect()
        # The caught-up log says another node leads it.
        moved.cache.apply(2, [rec.PartitionChange(OFFSETS_ID, 0, 0, leader=2, isr=(1, 2))])
        moved.cache.release()
        assert moved.runtime.contexts == {}
        moved.runtime.close()

    asyncio.run(scenario())


async def deposed_with_an_uncommitted_suffix(tmp_path: Path, *, hot_standby: bool) -> Replica:
    """Node 1 led __consumer_offsets-0 and committed x (offset 11) and z (7); then, with its
    HW held, wrote a commit of y and the deletion of z, which never committed (300 ms write
    timeout); then node 2 took the lead (epoch 1)."""
    a = Replica(tmp_path / "a", 1, hot_standby=hot_standby)
    a.runtime.write_timeout_ms = 300
    a.elect(leader=1, leader_epoch=0)
    await active(a.runtime)
    a.replicas.hold = False
    await a.runtime.call("x", commit("x", 11))
    await a.runtime.call("z", commit("z", 7))
    a.replicas.hold = True  # the HW stops here
    with pytest.raises(CoordinatorError):
        await a.runtime.call("y", commit("y", 5))
    with pytest.raises(CoordinatorError):
        await a.runtime.call("z", delete_groups("z"))
    assert a.part.high_watermark < a.part.log.log_end_offset
    a.elect(leader=2, leader_epoch=1)
    return a


@pytest.mark.parametrize("hot_standby", [True, False], ids=["hot", "cold"])
def test_after_a_load_a_read_waits_only_for_its_own_groups_uncommitted_records(
    tmp_path: Path, hot_standby: bool
) -> None:
    """A load leaves the log's uncommitted suffix replayed (here: a commit of y and the
    deletion of z, which the high watermark has not passed). Reads of x, which has nothing
    there, are answered at once (Kafka reads at the last committed offset); they waited for
    the whole suffix, and timed out COORDINATOR_NOT_AVAILABLE while the HW was held (an ISR
    below min ISR). Reads of y still wait for y's record to commit; ListGroups does not."""

    async def scenario() -> None:
        a = await deposed_with_an_uncommitted_suffix(tmp_path, hot_standby=hot_standby)
        a.elect(leader=1, leader_epoch=2)  # back: the shard is loaded again
        await active(a.runtime)
        read = await a.runtime.call("x", fetch("x"))
        assert read.topics[0].partitions[0].committed_offset == 11
        # A write with nothing to write (a heartbeat) is answered as a read is: Kafka's
        # runtime waits only for its own pending writes, and after a load it has none.
        beat = await a.runtime.call("x", heartbeat("x"))
        assert beat.error_code is Errors.UNKNOWN_MEMBER_ID
        with pytest.raises(CoordinatorError) as waited:
            await a.runtime.call("y", fetch("y"))
        assert waited.value.code is Errors.COORDINATOR_NOT_AVAILABLE
        with pytest.raises(CoordinatorError) as waited:
            await a.runtime.call("y", heartbeat("y"))
        assert waited.value.code is Errors.COORDINATOR_NOT_AVAILABLE
        # ListGroups reads the committed state at once: y, made by its uncommitted commit
        # alone, is not there yet, and z, deleted by uncommitted tombstones, still is (the
        # load keeps its entry as of the HW). It waited for their records, and timed out.
        assert await listed_ids(a.runtime) == ["x", "z"]
        a.replicas.release(a.part)
        assert await listed_ids(a.runtime) == ["x", "y"]
        a.runtime.close()

    asyncio.run(scenario())


def test_list_groups_answers_at_once_from_the_committed_state(tmp_path: Path) -> None:
    """Kafka's ListGroups reads its timeline maps at the last committed offset, at once. It
    waited for every group's pending records, and timed out with the high watermark held. A
    group made by records above the HW is not listed yet; a group deleted by records above it
    still is; both show as written once the HW passes them."""

    async def scenario() -> None:
        node = await held_after_commits(tmp_path, "B")
        part = node.offsets_partition
        stuck = node.runtime.submit("A", commit("A", 1))
        deleted = node.runtime.submit("B", delete_groups("B"))
        assert node.runtime.contexts[0].shard is not None
        assert node.runtime.contexts[0].shard.group("B") is None  # gone in memory
        assert await listed_ids(node.runtime) == ["B"]
        assert not stuck.done() and not deleted.done()
        node.replicas.release(part)
        await asyncio.wait_for(asyncio.gather(stuck, deleted), 5)
        assert await listed_ids(node.runtime) == ["A"]
        assert node.runtime.contexts[0].committed_listing == {}
        node.runtime.close()

    asyncio.run(scenario())


def test_list_groups_shows_a_classic_groups_state_now_and_committed_existence(
    tmp_path: Path,
) -> None:
    """The shard's merge: Kafka keeps a classic group's existence in its timeline, not its
    state, so a classic group with records above the HW is listed with its state now; a
    consumer group with its state as of the HW; a group that did not exist then not at all."""

    async def scenario() -> None:
        node = await held_after_commits(tmp_path, "B", "D")
        shard = node.runtime.contexts[0].shard
        assert shard is not None
        now = shard.listed_group("B")
        assert now is not None and now.group_state == "Empty"
        committed: dict[str, t.ListedGroup | None] = {
            "B": t.ListedGroup(
                group_id="B", protocol_type="consumer", group_state="Stable", group_type="classic"
            ),
            "C": t.ListedGroup(
                group_id="C", protocol_type="consumer", group_state="Stable", group_type="consumer"
            ),
            "D": None,
        }
        answer = shard.handle_list_groups(0, t.ListGroupsRequest(), node.now, committed)
        ((_, listed),) = answer.responses
        assert isinstance(listed, t.ListGroupsResponse)
        assert {(g.group_id, g.group_state) for g in listed.groups} == {
            ("B", "Empty"),
            ("C", "Stable"),
        }
        for request, expected in [
            (t.ListGroupsRequest(states_filter=("STABLE",)), {"C"}),
            (t.ListGroupsRequest(types_filter=("classic",)), {"B"}),
            (t.ListGroupsRequest(types_filter=("consumer",), states_filter=("empty",)), set()),
            # Kafka trims the state filters, not the type filters (GroupType.parse).
            (t.ListGroupsRequest(states_filter=(" stable ",)), {"C"}),
            (t.ListGroupsRequest(types_filter=(" classic",)), set()),
        ]:
            answer = shard.handle_list_groups(0, request, node.now, committed)
            ((_, listed),) = answer.responses
            assert isinstance(listed, t.ListGroupsResponse)
            assert {g.group_id for g in listed.groups} == expected, request
        node.runtime.close()

    asyncio.run(scenario())


def test_list_groups_leaves_out_a_group_a_join_made_until_its_records_commit(
    tmp_path: Path,
) -> None:
    """A JoinGroup makes its classic group in memory before its records are replayed: the
    entry kept for ListGroups is the one from before the handler ran (no group). It was taken
    after, and the group was listed before anything of it had committed."""

    async def scenario() -> None:
        node = await held_after_commits(tmp_path)
        join = t.JoinGroupRequest(
            group_id="J",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000,
            protocol_type="consumer",
            protocols=(t.JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
        node.runtime.submit("J", lambda s, tok, now: s.handle_join_group(tok, join, now))
        part = node.offsets_partition
        await _until(lambda: part.log.log_end_offset > part.high_watermark, "the join's write")
        assert await listed_ids(node.runtime) == []
        node.replicas.release(part)
        assert await listed_ids(node.runtime) == ["J"]
        node.runtime.close()

    asyncio.run(scenario())


def test_list_groups_shows_what_the_high_watermark_passed_of_a_group_still_writing(
    tmp_path: Path,
) -> None:
    """A group with writes both below and above the HW is listed as of the HW: the commit
    that made group A committed, a later one of A not yet. Only one entry per group was kept,
    the one from before its first pending write, so A stayed hidden for as long as it kept
    writing faster than the HW moved."""

    async def scenario() -> None:
        node = await held_after_commits(tmp_path)
        part = node.offsets_partition
        ctx = node.runtime.contexts[0]
        first = node.runtime.submit("A", commit("A", 1))
        ctx.flush()
        second = node.runtime.submit("A", commit("A", 2))  # in the open batch
        third = node.runtime.submit("A", commit("A", 3))
        # One entry before A's first write (no group), one for the two after it (group A):
        # writes that leave the entry as it was share one.
        assert [entry for _, entry in ctx.committed_listing["A"]] == [
            None,
            t.ListedGroup(
                group_id="A", protocol_type="", group_state="Empty", group_type="classic"
            ),
        ]
        node.replicas.release(part)  # the HW passes A's first commit only
        await asyncio.wait_for(first, 5)
        assert not second.done() and not third.done()
        assert await listed_ids(node.runtime) == ["A"]
        node.replicas.release(part)
        await asyncio.wait_for(asyncio.gather(second, third), 5)
        assert ctx.committed_listing == {}
        node.runtime.close()

    asyncio.run(scenario())


def test_a_high_watermark_moving_during_a_load_keeps_the_committed_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A HW notice during the second part of a load (followers fetching from the new leader)
    dropped every kept entry, the groups' written offsets not being set yet: ListGroups then
    showed y, made by an uncommitted commit, and hid z, whose deletion is uncommitted."""

    async def scenario() -> None:
        a = await deposed_with_an_uncommitted_suffix(tmp_path, hot_standby=False)
        real = rt._replay_suffix

        def then_a_high_watermark_notice(*args: Any, **kwargs: Any) -> Any:
            asyncio.get_running_loop().call_soon(
                a.runtime._on_high_watermark, a.part, a.part.high_watermark
            )
            return real(*args, **kwargs)

        monkeypatch.setattr(rt, "_replay_suffix", then_a_high_watermark_notice)
        a.runtime.replay_chunk_bytes = 1  # the rest of the load yields at least once
        a.elect(leader=1, leader_epoch=2)
        await active(a.runtime)
        assert await listed_ids(a.runtime) == ["x", "z"]
        a.runtime.close()

    asyncio.run(scenario())


def test_a_new_leader_epoch_of_a_shard_still_led_here_keeps_it(tmp_path: Path) -> None:
    """Kafka's CoordinatorRuntime.scheduleLoadOperation takes a newer epoch of a coordinator
    it has loaded and keeps it (a node that missed its own leaderless stretch sees the same
    leader at a later epoch). The shard was closed and loaded cold again: its pending answers
    failed NOT_COORDINATOR and requests got COORDINATOR_LOAD_IN_PROGRESS meanwhile."""

    async def scenario() -> None:
        a = Replica(tmp_path / "a", 1)
        a.elect(leader=1, leader_epoch=0)
        await active(a.runtime)
        ctx = a.runtime.contexts[0]
        a.replicas.hold = False
        await a.runtime.call("x", commit("x", 11))
        a.replicas.hold = True
        pending = a.runtime.submit("x", commit("x", 12))
        end = a.part.log.log_end_offset
        await _until(lambda: a.part.log.log_end_offset > end, "the commit appended")
        a.elect(leader=1, leader_epoch=1)
        assert a.runtime.contexts[0] is ctx
        assert (ctx.state, ctx.leader_epoch) == (ShardState.ACTIVE, 1)
        assert not pending.done()
        a.replicas.release(a.part)
        answer = await asyncio.wait_for(pending, 5)
        assert answer.topics[0].partitions[0].error_code is Errors.NONE
        read = await asyncio.wait_for(a.runtime.call("x", fetch("x")), 5)
        assert read.topics[0].partitions[0].committed_offset == 12
        # Led by another node, then here again: unloaded, then loaded anew.
        a.elect(leader=2, leader_epoch=2)
        assert 0 not in a.runtime.contexts
        a.elect(leader=1, leader_epoch=3)
        assert a.runtime.contexts[0] is not ctx
        await active(a.runtime)
        a.runtime.close()

    asyncio.run(scenario())


def test_a_list_groups_that_raises_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListGroups changes nothing (a Kafka read operation): if the shard's call raises, it
    fails alone and the shard stays loaded. It reloaded every group of the partition."""

    async def scenario() -> None:
        node = await held_after_commits(tmp_path, "B")
        ctx = node.runtime.contexts[0]
        waiting = node.runtime.submit("A", commit("A", 1), replay_only=True)

        def broken(*args: Any) -> Any:
            raise RuntimeError("a bug")

        assert ctx.shard is not None
        monkeypatch.setattr(ctx.shard, "handle_list_groups", broken)
        (listed,) = node.runtime.list_groups(t.ListGroupsRequest())
        assert await refused(listed) is Errors.UNKNOWN_SERVER_ERROR
        assert node.runtime.contexts[0] is ctx and not waiting.done()
        monkeypatch.undo()
        assert await listed_ids(node.runtime) == ["B"]
        node.replicas.release(node.offsets_partition)
        await asyncio.wait_for(waiting, 5)
        node.runtime.close()

    asyncio.run(scenario())


def test_a_call_whose_run_raises_leaves_no_future_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard's ``run`` raising outside the handler's own guard reaches the caller; the
    future made for its answer stayed in the shard's map until the unload failed it, an
    exception no one retrieved. Nor is one retrieved if ``run`` failed it before raising."""
    unretrieved: list[str] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: unretrieved.append(context["message"])
        )
        node = await held_after_commits(tmp_path, "B")
        ctx = node.runtime.contexts[0]
        before = dict(ctx.futures)

        def broken(_handler: Any, token: int, **kwargs: Any) -> None:
            raise RuntimeError("a bug")

        def failed_then_broken(_handler: Any, token: int, **kwargs: Any) -> None:
            ctx._fail([(token, None)], Errors.UNKNOWN_SERVER_ERROR)
            raise RuntimeError("a bug")

        for run in (broken, failed_then_broken):
            monkeypatch.setattr(ctx, "run", run)
            with pytest.raises(RuntimeError):
                node.runtime.submit("A", commit("A", 1), replay_only=True)
            assert ctx.futures == before
        monkeypatch.undo()
        node.replicas.release(node.offsets_partition)
        node.runtime.close()

    asyncio.run(scenario())
    gc.collect()
    assert [m for m in unretrieved if "never retrieved" in m] == []


def test_a_list_groups_stopped_by_a_shard_that_raises_leaves_no_failure_unretrieved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListGroups calls every active shard; when one call raises, the caller gets that, and
    the answers already asked of the others, one a failure, were left for no one to take."""
    unretrieved: list[str] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: unretrieved.append(context["message"])
        )
        node = await held_after_commits(tmp_path, "B")
        ctx = node.runtime.contexts[0]

        def failing_run(_handler: Any, token: int, **kwargs: Any) -> None:
            first.futures.pop(token).set_exception(CoordinatorError(Errors.UNKNOWN_SERVER_ERROR))

        def raising_run(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("a bug")

        first, later = (
            SimpleNamespace(
                state=ShardState.ACTIVE,
                partition=ctx.partition,
                committed_listing_at=ctx.committed_listing_at,
                futures={},
                run=run,
            )
            for run in (failing_run, raising_run)
        )
        monkeypatch.setattr(node.runtime, "contexts", {0: first, 1: later})
        with pytest.raises(RuntimeError, match="a bug"):
            node.runtime.list_groups(t.ListGroupsRequest())
        monkeypatch.undo()
        node.replicas.release(node.offsets_partition)
        node.runtime.close()

    asyncio.run(scenario())
    gc.collect()
    assert [m for m in unretrieved if "never retrieved" in m] == []


def test_groups_written_below_the_high_watermark_are_forgotten() -> None:
    """Where each group's last record ends is kept so a read of one group waits for its own
    writes; once the HW passed it, the entry counts for nothing, yet every group ever written
    (and deleted since) stayed named there until the shard was loaded again. Such entries go
    when the map reaches its limit, which then doubles what is left."""
    ctx = ShardContext(cast(CoordinatorRuntime, None), cast(Partition, None), 0)
    limit = rt.GROUP_WRITTEN_MIN_LIMIT
    ctx.group_written = {f"g{i}": i + 1 for i in range(limit)}
    ctx.group_written["pending"] = limit + 10
    ctx.complete_up_to(limit)
    assert ctx.group_written == {"pending": limit + 10}
    assert ctx.group_written_limit == limit
    ctx.group_written["g0"] = 1
    ctx.complete_up_to(limit)  # under the limit: left as it is
    assert len(ctx.group_written) == 2


def consumer_beat(
    member: str,
    epoch: int,
    subscribe: tuple[str, ...] | None = None,
    owned: tuple[int, ...] | None = None,
    group: str = "g",
) -> Any:
    """A KIP-848 heartbeat of ``member`` in ``group``, which owns ``owned`` of orders (named
    by a topic id that survives the records' round trip: ORDERS_ID is not canonical)."""
    orders = "BBBBBBBBBBBBBBBBBBBBBA"
    req = t.ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        rebalance_timeout_ms=10_000 if epoch == 0 else -1,
        subscribed_topic_names=subscribe,
        topic_partitions=None if owned is None else ((orders, owned),) if owned else (),
    )
    topics = {"orders": (orders, 1)}
    return lambda s, tok, now: s.handle_consumer_group_heartbeat(tok, req, now, topics)


async def member_fetch(
    api: Any, member: str, epoch: int, *, require_stable: bool, group: str = "g"
) -> Errors:
    """An OffsetFetch v9 of ``group`` by ``member`` at ``epoch``: the group's error."""
    values = {
        "groups": [{"group_id": group, "member_id": member, "member_epoch": epoch, "topics": None}],
        "require_stable": require_stable,
    }
    request = rt_api.Request(codec.RequestHeader(9, 9, 1, "c"), codec.build_request(9, 9, values))
    result = await api.handle_offset_fetch(request)
    answer = await asyncio.wait_for(result.awaitable, 5)
    return cast(Errors, answer["groups"][0]["error_code"])


async def a_member_at_epoch_one(tmp_path: Path) -> tuple[Node, GroupApi]:
    """A node whose group "g" has member "m" at epoch 1, owning orders-0, committed; its high
    watermark held from then on. With the group APIs on its runtime."""
    node = Node(tmp_path, write_timeout_ms=60_000)
    node.elect()
    await loaded(node)
    api = GroupApi(cast(BrokerContext, SimpleNamespace(image=node.cache.image)), node.runtime)
    node.replicas.hold = False
    joined = await node.runtime.call("g", consumer_beat("m", 0, ("orders",), ()))
    assert (joined.error_code, joined.member_epoch) == (Errors.NONE, 1)
    await node.runtime.call("g", consumer_beat("m", 1, owned=(0,)))
    node.replicas.hold = True
    return node, api


@pytest.mark.parametrize("reload", [False, True], ids=["written", "loaded"])
def test_offset_fetch_checks_a_member_as_of_the_high_watermark(
    tmp_path: Path, reload: bool
) -> None:
    """Kafka's OffsetFetch reads at the last committed offset (ConsumerGroup.validateOffsetFetch
    takes the member from its timeline there); with require_stable it is a write, which reads
    the latest state. A heartbeat that moved a member to epoch 2, not yet committed, made a
    fetch at epoch 1, the one the member was last answered, fail STALE_MEMBER_EPOCH; a member
    whose leave is not yet committed was UNKNOWN_MEMBER_ID. After a load the same holds of the
    log's uncommitted suffix."""

    async def scenario() -> None:
        node, api = await a_member_at_epoch_one(tmp_path)
        part = node.offsets_partition
        # A new subscription: the group's epoch moves, and the member with it (it keeps its
        # partition). The answer waits for the records, which the HW has not passed.
        bumped = node.runtime.submit("g", consumer_beat("m", 1, ("orders", "later"), (0,)))
        await _until(lambda: part.log.log_end_offset > part.high_watermark, "the epoch bump")
        if reload:
            ctx = node.runtime.contexts[0]
            node.runtime.fail_shard(ctx, Errors.NOT_COORDINATOR)
            await active(node.runtime)
            with pytest.raises(CoordinatorError):
                await bumped  # its answer is lost with the shard; the record is in the log
        assert node.runtime.committed_fetch("g", "m").members == {
            "m": MemberEpoch(1, classic=False)
        }
        waiting = node.runtime.contexts[0].futures
        before = len(waiting)
        at_one = asyncio.ensure_future(member_fetch(api, "m", 1, require_stable=False))
        at_two = asyncio.ensure_future(member_fetch(api, "m", 2, require_stable=False))
        stable_at_two = asyncio.ensure_future(member_fetch(api, "m", 2, require_stable=True))
        await _until(lambda: len(waiting) == before + 3, "the fetches waiting for the HW")
        node.replicas.release(part)
        assert await at_one is Errors.NONE
        assert await at_two is Errors.STALE_MEMBER_EPOCH
        assert await stable_at_two is Errors.NONE
        assert node.runtime.committed_fetch("g", "m").members == {}
        assert await member_fetch(api, "m", 2, require_stable=False) is Errors.NONE
        assert await member_fetch(api, "m", 1, require_stable=False) is Errors.STALE_MEMBER_EPOCH
        # The member leaves: until that commits it is a member at epoch 2.
        left = node.runtime.submit("g", consumer_beat("m", -1))
        await _until(lambda: part.log.log_end_offset > part.high_watermark, "the leave")
        assert node.runtime.committed_fetch("g", "m").members == {
            "m": MemberEpoch(2, classic=False)
        }
        before = len(waiting)
        still = asyncio.ensure_future(member_fetch(api, "m", 2, require_stable=False))
        gone = asyncio.ensure_future(member_fetch(api, "m", 2, require_stable=True))
        await _until(lambda: len(waiting) == before + 2, "the fetches waiting for the HW")
        node.replicas.release(part)
        await asyncio.wait_for(left, 5)
        assert await still is Errors.NONE
        assert await gone is Errors.UNKNOWN_MEMBER_ID
        assert await member_fetch(api, "m", 2, require_stable=False) is Errors.UNKNOWN_MEMBER_ID
        node.runtime.close()

    asyncio.run(scenario())


def test_a_load_keeps_each_uncommitted_write_of_a_member_as_of_before_it(
    tmp_path: Path,
) -> None:
    """A load replays the log's uncommitted suffix a write at a time, keeping each member's
    epoch as of before each write, as the leader that wrote them kept it. Only the epoch
    before the member's first write there was kept: once the high watermark passed its first
    bump (epoch 2), a fetch at 2 was STALE_MEMBER_EPOCH until it passed the second as well."""

    async def scenario() -> None:
        node, api = await a_member_at_epoch_one(tmp_path)
        part = node.offsets_partition
        # Two bumps, each its own write above the HW: epoch 2, then 3.
        writes, ends = [], []
        for epoch, topics in ((1, ("orders", "a")), (2, ("orders", "b"))):
            before = part.log.log_end_offset
            writes.append(node.runtime.submit("g", consumer_beat("m", epoch, topics, (0,))))
            await _until(lambda b=before: part.log.log_end_offset > b, f"the bump from {epoch}")
            ends.append(part.log.log_end_offset)
        node.runtime.fail_shard(node.runtime.contexts[0], Errors.NOT_COORDINATOR)
        await active(node.runtime)
        for write in writes:
            with pytest.raises(CoordinatorError):
                await write  # lost with the shard; the records are in the log
        assert node.runtime.committed_fetch("g", "m").members == {
            "m": MemberEpoch(1, classic=False)
        }
        assert part.set_high_watermark(ends[0])  # the HW passes the first bump only
        node.replicas._notify_high_watermark(part)
        assert node.runtime.committed_fetch("g", "m").members == {
            "m": MemberEpoch(2, classic=False)
        }
        waiting = node.runtime.contexts[0].futures
        at_two = asyncio.ensure_future(member_fetch(api, "m", 2, require_stable=False))
        await _until(lambda: len(waiting) == 1, "the fetch waiting for the second bump")
        node.replicas.release(part)
        assert await at_two is Errors.NONE
        assert node.runtime.committed_fetch("g", "m").members == {}
        node.runtime.close()

    asyncio.run(scenario())


def test_offset_fetch_checks_no_member_of_a_group_that_was_not_a_consumer_group_at_the_hw(
    tmp_path: Path,
) -> None:
    """Kafka's OffsetFetch looks the group up as of the last committed offset too: a consumer
    group made by records above the high watermark, or an empty classic group those records
    upgrade, is no consumer group there, and a member it names is not checked (a classic
    group's validateOffsetFetch checks none). Both were checked as they are now."""

    async def scenario() -> None:
        node, api = await a_member_at_epoch_one(tmp_path)
        part = node.offsets_partition
        node.replicas.hold = False
        await node.runtime.call("simple", commit("simple", 5))  # an empty classic group
        node.replicas.hold = True
        pending = [
            node.runtime.submit(group, consumer_beat("m", 0, ("orders",), (), group=group))
            for group in ("new", "simple")
        ]
        await _until(lambda: part.log.log_end_offset > part.high_watermark, "the joins")
        shard = node.runtime.contexts[0].shard
        assert shard is not None and {"new", "simple"} <= set(shard.consumer_groups)
        waiting = node.runtime.contexts[0].futures
        before = len(waiting)
        fetches = [
            asyncio.ensure_future(member_fetch(api, "x", 3, require_stable=stable, group=group))
            for group in ("new", "simple")
            for stable in (False, True)
        ]
        await _until(lambda: len(waiting) == before + 4, "the fetches waiting for the HW")
        node.replicas.release(part)
        await asyncio.wait_for(asyncio.gather(*pending), 5)
        assert [await f for f in fetches] == [
            Errors.NONE,
            Errors.UNKNOWN_MEMBER_ID,  # require_stable: the latest state
            Errors.NONE,
            Errors.UNKNOWN_MEMBER_ID,
        ]
        node.runtime.close()

    asyncio.run(scenario())


def test_a_commit_whose_records_do_not_encode_fails_alone(tmp_path: Path) -> None:
    """OffsetCommit v2-v4's retention time is the client's int64: now + 2^63-1 did not fit
    the record's expire timestamp, encoding raised, and the runtime reloaded the partition
    (every group on it, a bystander's pending commit failed NOT_COORDINATOR) at each retry.
    The sum is clamped to int64 (Kafka's wraps negative, and such an offset expires at once
    there; kcoord keeps it), and a record that does not encode fails its own request alone.
    (review helper-210)"""

    async def main() -> None:
        node = Node(tmp_path, append_linger_ms=-1)
        _, ctx, _ = await committed_seven(node)
        bystander = node.runtime.submit("other", commit("other", 5), replay_only=True)
        for retention in (2**63 - 1, -(2**62)):
            req = t.OffsetCommitRequest(
                group_id="far",
                retention_time_ms=retention,
                topics=(
                    t.OffsetCommitRequestTopic(
                        name="orders",
                        partitions=(
                            t.OffsetCommitRequestPartition(partition_index=0, committed_offset=1),
                        ),
                    ),
                ),
            )

            def far(
                shard: GroupCoordinatorShard,
                token: int,
                now: int,
                req: t.OffsetCommitRequest = req,
            ) -> CoordinatorResult:
                return shard.handle_offset_commit(token, req, now)

            answer = await asyncio.wait_for(node.runtime.submit("far", far, replay_only=True), 5)
            assert answer.topics[0].partitions[0].error_code == Errors.NONE
        unencodable = OffsetCommitValue(offset=2**64, commit_timestamp_ms=0)

        def bad(shard: GroupCoordinatorShard, token: int, now: int) -> CoordinatorResult:
            key = OffsetCommitKey(group_id="bad", topic="orders", partition=0)
            return CoordinatorResult([CoordinatorRecord(key, unencodable)], [(token, None)])  # type: ignore[list-item]

        with pytest.raises(rt.CoordinatorError) as failed:
            await asyncio.wait_for(node.runtime.submit("bad", bad, replay_only=True), 5)
        assert failed.value.code == Errors.UNKNOWN_SERVER_ERROR
        assert (await asyncio.wait_for(bystander, 5)).topics[0].partitions[0].error_code == 0
        assert node.runtime.contexts[0] is ctx  # not reloaded
        node.runtime.close()

    asyncio.run(main())
