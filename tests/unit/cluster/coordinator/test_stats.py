"""The shard's counters for the node's metrics (``CoordinatorStats``): rebalances and their
duration, offset commits and their errors by code, expirations."""

from __future__ import annotations

from kcoord.cluster.coordinator.classic import ClassicGroupState
from kcoord.cluster.coordinator.shard import GroupConfig
from kcoord.cluster.coordinator.types import JoinGroupResponse
from kcoord.errors import Errors
from tests.unit.cluster.coordinator.harness import ShardContext
from tests.unit.cluster.coordinator.test_consumer_classic import ConsumerMember, context


def _join_and_sync(ctx: ShardContext, delay_ms: int, think_ms: int) -> str:
    """One member joins an Empty group; the join completes after the initial delay and the
    member (the leader) syncs ``think_ms`` later."""
    _, step = ctx.join()
    first = step.response(step.responses[0][0])
    assert isinstance(first, JoinGroupResponse)
    assert first.error_code is Errors.MEMBER_ID_REQUIRED
    member_id = first.member_id
    token, step = ctx.join(member_id=member_id)
    assert not step.answered(token)  # parked for the initial delay
    ctx.sleep(delay_ms)
    ctx.sleep(think_ms)
    _, step = ctx.sync(member_id=member_id, generation_id=1, assignments=[(member_id, b"a")])
    group = ctx.shard.group("g")
    assert group is not None and group.state is ClassicGroupState.STABLE
    return member_id


def test_a_rebalance_counts_once_with_its_duration() -> None:
    ctx = ShardContext(GroupConfig(initial_rebalance_delay_ms=100))
    stats = ctx.shard.stats
    _join_and_sync(ctx, 100, 50)
    assert (stats.rebalances_started, stats.rebalances_completed) == (1, 1)
    histogram = stats.rebalance_duration_s
    assert histogram.count == 1
    assert abs(histogram.sum - 0.150) < 1e-9
    assert dict(histogram.cumulative())[0.25] == 1
    assert dict(histogram.cumulative())[0.1] == 0


def test_session_timeout_counts_an_expired_member_and_a_rebalance_to_empty() -> None:
    ctx = ShardContext(GroupConfig(initial_rebalance_delay_ms=0))
    stats = ctx.shard.stats
    _join_and_sync(ctx, 0, 0)
    ctx.sleep(10_000)  # the member's session timeout; it never heartbeats
    group = ctx.shard.group("g")
    assert group is not None and group.state is ClassicGroupState.EMPTY
    assert stats.members_expired == 1
    assert (stats.rebalances_started, stats.rebalances_completed) == (2, 2)
    assert stats.rebalance_duration_s.count == 2


def test_offset_commits_and_their_errors_by_code() -> None:
    ctx = ShardContext(GroupConfig(offset_metadata_max_bytes=3))
    stats = ctx.shard.stats
    ctx.commit([("t", 0, 5), ("t", 1, 7)])
    assert stats.offset_commits == 2
    ctx.commit([("t", 0, 6), ("t", 1, 8)], metadata="too long")
    ctx.commit([("t", 0, 6)], group_id="unknown", generation_id=3)
    assert stats.offset_commits == 2
    assert stats.offset_commit_errors == {
        Errors.OFFSET_METADATA_TOO_LARGE: 2,  # per partition
        Errors.ILLEGAL_GENERATION: 1,  # per request
    }


def test_expired_offsets_and_the_group_they_leave_empty() -> None:
    ctx = ShardContext(
        GroupConfig(offsets_retention_minutes=1, offsets_retention_check_interval_ms=1_000)
    )
    stats = ctx.shard.stats
    ctx.commit([("t", 0, 5), ("t", 1, 7)])
    ctx.sleep(59_000)
    assert (stats.offsets_expired, stats.groups_expired) == (0, 0)
    ctx.sleep(2_000)
    assert (stats.offsets_expired, stats.groups_expired) == (2, 1)
    assert ctx.shard.group("g") is None


def test_consumer_group_rebalances_and_expired_members_count() -> None:
    """KIP-848 groups counted nothing: the dashboard's rebalance and expiration panels read 0
    for them. A new target assignment counts a rebalance (Kafka's
    consumer-group-rebalance-count); a session timeout an expired member."""
    ctx = context()
    stats = ctx.shard.stats
    a, b = ConsumerMember(ctx, "a"), ConsumerMember(ctx, "b")
    a.beat()
    b.beat()
    assert stats.consumer_group_rebalances == 2  # each join a new target
    assert stats.members_expired == 0
    ctx.sleep(60_000)  # neither heartbeats again
    assert stats.members_expired == 2
    assert (stats.rebalances_started, stats.rebalances_completed) == (0, 0)
