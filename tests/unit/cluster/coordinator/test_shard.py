"""Targeted tests of the shard: replay and loading, edge cases the scenarios do not show, and
the exact records and answers of each."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcoord.cluster.coordinator import shard as shard_module
from kcoord.cluster.coordinator.classic import ClassicGroupState
from kcoord.cluster.coordinator.records import (
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    CoordinatorRecord,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
)
from kcoord.cluster.coordinator.shard import (
    GROUP_EXPIRATION_KEY,
    GroupConfig,
    GroupCoordinatorShard,
    heartbeat_key,
    join_key,
    sync_key,
)
from kcoord.cluster.coordinator.timeline import RebalanceEvent
from kcoord.cluster.coordinator.types import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    MemberResponse,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kcoord.errors import Errors
from tests.unit.cluster.coordinator.harness import MockTimer, ShardContext

S = ClassicGroupState


def stable_group(ctx: ShardContext, *clients: str, **join: object) -> list[str]:
    """Join ``clients`` (old clients: no MEMBER_ID_REQUIRED), sync; returns the member ids."""
    tokens = [ctx.join(client_id=c, require_known_member_id=False, **join)[0] for c in clients]  # type: ignore[arg-type]
    fired = ctx.sleep(ctx.config.initial_rebalance_delay_ms * 2)
    responses = [step.response(t) for _, _, step in fired for t in tokens if step.answered(t)]
    member_ids = [r.member_id for r in responses if isinstance(r, JoinGroupResponse)]
    assert len(member_ids) == len(clients)
    leader = member_ids[0]
    ctx.sync(
        member_id=leader,
        generation_id=1,
        instance_id=join.get("instance_id"),  # type: ignore[arg-type]
        assignments=[(m, m.upper().encode()) for m in member_ids],
    )
    return member_ids


def state_of(ctx: ShardContext, group_id: str = "g") -> ClassicGroupState:
    return ctx.shard.groups[group_id].state


def group_record(group_id: str, generation: int, *member_ids: str) -> CoordinatorRecord:
    return CoordinatorRecord(
        GroupMetadataKey(group_id=group_id),
        GroupMetadataValue(
            protocol_type="consumer",
            generation=generation,
            protocol="range",
            leader=member_ids[0] if member_ids else None,
            current_state_timestamp_ms=100,
            members=tuple(
                MemberMetadata(
                    member_id=m,
                    client_id="c",
                    client_host="/h",
                    rebalance_timeout_ms=20_000,
                    session_timeout_ms=10_000,
                    subscription=b"s",
                    assignment=m.encode(),
                )
                for m in member_ids
            ),
        ),
    )


def offset_record(group_id: str, partition: int, offset: int | None) -> CoordinatorRecord:
    key = OffsetCommitKey(group_id=group_id, topic="t", partition=partition)
    if offset is None:
        return CoordinatorRecord(key, None)
    return CoordinatorRecord(key, OffsetCommitValue(offset=offset, commit_timestamp_ms=5))


# --------------------------------------------------------------------------------------------
# Replay and loading


def test_replay_tolerates_orphans_tombstones_and_other_record_types() -> None:
    log = [
        CoordinatorRecord(GroupMetadataKey(group_id="gone"), None),  # unknown group
        offset_record("gone", 0, None),  # unknown offset
        offset_record("orphan", 0, 7),  # its GroupMetadata compacted away
        CoordinatorRecord(
            ConsumerGroupMetadataKey(group_id="kip848"), ConsumerGroupMetadataValue(epoch=3)
        ),
        group_record("g", 1, "a"),
        group_record("g", 2, "a", "b"),  # the later record replaces the loaded group
        offset_record("g", 0, 1),
        offset_record("g", 0, 2),
        CoordinatorRecord(GroupMetadataKey(group_id="g"), None),  # offsets outlive the group
        offset_record("g", 1, 3),  # and bring back a simple group
    ]
    ctx = ShardContext(log=log)
    assert set(ctx.shard.groups) == {"orphan", "g"}
    orphan, g = ctx.shard.groups["orphan"], ctx.shard.groups["g"]
    assert (orphan.state, orphan.protocol_type, orphan.committed) == (S.EMPTY, None, None)
    assert (g.state, g.generation_id, g.committed) == (S.EMPTY, 0, None)
    assert {t: dict(p) for t, p in ctx.shard.offsets["g"].items()}.keys() == {"t"}
    assert [
        (p, o.committed_offset, o.record_offset) for p, o in ctx.shard.offsets["g"]["t"].items()
    ] == [
        (0, 2, 7),
        (1, 3, 9),
    ]
    assert ctx.shard.offsets["orphan"]["t"][0].committed_offset == 7


def test_loaded_stable_group_keeps_its_members_and_arms_their_sessions() -> None:
    ctx = ShardContext(log=[group_record("g", 5, "a", "b")], now_ms=1_000)
    group = ctx.shard.groups["g"]
    assert group.state is S.STABLE
    assert [(m.member_id, m.assignment) for m in group.members.values()] == [
        ("a", b"a"),
        ("b", b"b"),
    ]
    assert ctx.timer.deadlines.keys() == {
        heartbeat_key("g", "a"),
        heartbeat_key("g", "b"),
        GROUP_EXPIRATION_KEY,
    }
    assert ctx.timer.deadlines[heartbeat_key("g", "a")][0] == 11_000
    _, step = ctx.heartbeat(member_id="a", generation_id=5)
    assert step.responses[0][1] == HeartbeatResponse()


def test_loading_an_oversized_group_rebalances_it() -> None:
    ctx = ShardContext(GroupConfig(max_size=1), log=[group_record("g", 5, "a", "b")])
    group = ctx.shard.groups["g"]
    assert group.state is S.PREPARING_REBALANCE
    assert join_key("g") in ctx.timer.deadlines


@settings(max_examples=200, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["g", "h"]),
            st.sampled_from(["group", "group-tombstone", "offset", "offset-tombstone"]),
            st.integers(0, 3),
        ),
        max_size=20,
    )
)
def test_replay_of_any_valid_record_sequence_never_raises(
    records: list[tuple[str, str, int]],
) -> None:
    log = []
    for group_id, kind, n in records:
        if kind == "group":
            log.append(group_record(group_id, n, *[f"m{i}" for i in range(n)]))
        elif kind == "group-tombstone":
            log.append(CoordinatorRecord(GroupMetadataKey(group_id=group_id), None))
        else:
            log.append(offset_record(group_id, n, None if kind == "offset-tombstone" else n))
    ctx = ShardContext(log=log)
    # Whatever was loaded serves requests.
    for group_id in ctx.shard.groups:
        ctx.describe([group_id])
        ctx.fetch(group_id=group_id)
    ctx.sleep(ctx.config.offsets_retention_check_interval_ms)


# --------------------------------------------------------------------------------------------
# Every token gets exactly one answer


def test_a_superseded_join_is_answered_rebalance_in_progress() -> None:
    ctx = ShardContext()
    a, _ = stable_group(ctx, "a", "b")
    first, step = ctx.join(member_id=a)  # the leader rejoins: rebalance, parked
    assert not step.responses
    second, step = ctx.join(member_id=a)
    assert step.responses == [
        (first, JoinGroupResponse(member_id=a, error_code=Errors.REBALANCE_IN_PROGRESS))
    ]
    assert ctx.outstanding == {second}


def test_a_superseded_sync_is_answered_rebalance_in_progress() -> None:
    ctx = ShardContext()
    for client in ("a", "b"):
        ctx.join(client_id=client, require_known_member_id=False)
    ctx.sleep(6_000)
    first, _ = ctx.sync(member_id="b-2", generation_id=1)
    second, step = ctx.sync(member_id="b-2", generation_id=1)
    assert step.responses == [(first, SyncGroupResponse(error_code=Errors.REBALANCE_IN_PROGRESS))]
    assert ctx.outstanding == {second}


def test_admin_removal_answers_the_removed_members_parked_sync() -> None:
    ctx = ShardContext()
    for client in ("a", "b"):
        ctx.join(client_id=client, instance_id=f"i{client}")
    ctx.sleep(6_000)
    parked, _ = ctx.sync(member_id="ib-2", generation_id=1, instance_id="ib")
    token, step = ctx.leave([("", "ib")])
    assert step.responses == [
        (parked, SyncGroupResponse(error_code=Errors.UNKNOWN_MEMBER_ID)),
        (
            token,
            LeaveGroupResponse(members=(MemberResponse(member_id="", group_instance_id="ib"),)),
        ),
    ]
    assert ctx.shard.groups["g"].state is S.PREPARING_REBALANCE


def test_unload_answers_parked_requests_and_cancels_timers() -> None:
    ctx = ShardContext()
    join_token, _ = ctx.join(client_id="a", require_known_member_id=False)
    step = ctx.unload()
    assert step.responses == [
        (join_token, JoinGroupResponse(member_id="a-1", error_code=Errors.NOT_COORDINATOR))
    ]
    assert ctx.timer.deadlines == {}
    assert not ctx.shard.is_active
    assert ctx.shard.groups["g"].state is S.DEAD


# --------------------------------------------------------------------------------------------
# Timers


def test_stale_and_unknown_timer_firings_are_ignored() -> None:
    timer = MockTimer()
    shard = GroupCoordinatorShard(GroupConfig(), timer, lambda prefix: f"{prefix}-x")
    shard.on_loaded(0)
    assert shard.on_timer("no-such-key", 10**9).responses == []
    deadline, _ = timer.deadlines[GROUP_EXPIRATION_KEY]
    early = shard.on_timer(GROUP_EXPIRATION_KEY, deadline - 1)
    assert (early.records, early.responses) == ([], [])
    assert shard.scheduled_timers == {GROUP_EXPIRATION_KEY: deadline}


def test_timer_keys_are_unambiguous() -> None:
    assert heartbeat_key("a-b", "c") != heartbeat_key("a", "b-c")
    assert heartbeat_key("a/b", "c") != heartbeat_key("a", "b/c")
    assert heartbeat_key("g", "client-1") == "heartbeat/g/client-1"
    assert (join_key("g"), sync_key("g")) == ("join/g", "sync/g")


def test_a_new_member_expires_after_the_new_member_join_timeout() -> None:
    # KAFKA-7610: an old member with a long rebalance timeout holds the join phase; the new
    # member's parked JoinGroup is not kept past five minutes.
    ctx = ShardContext()
    (old,) = stable_group(ctx, "a", rebalance_timeout_ms=900_000)
    ctx.heartbeat(member_id=old, generation_id=1)
    new_token, _ = ctx.join(client_id="b", require_known_member_id=False)
    for _ in range(30):  # the old member keeps its session alive without rejoining
        ctx.sleep(9_999)
        ctx.heartbeat(member_id=old, generation_id=1)
    assert ctx.now_ms == 305_970
    fired = ctx.sleep(1_000)
    assert [key for key, _, _ in fired] == [heartbeat_key("g", "b-2")]
    answers = [r for _, _, step in fired for t, r in step.responses if t == new_token]
    assert answers == [JoinGroupResponse(member_id="", error_code=Errors.UNKNOWN_MEMBER_ID)]
    assert list(ctx.shard.groups["g"].members) == [old]


def test_a_join_naming_its_protocol_twice_completes_the_rebalance() -> None:
    ctx = ShardContext()
    both = (("range", b"a"), ("range", b"b"))
    token, step = ctx.join(protocols=both)
    required = step.response(token)
    assert isinstance(required, JoinGroupResponse)
    token, _ = ctx.join(member_id=required.member_id, protocols=both)
    fired = ctx.sleep(ctx.config.initial_rebalance_delay_ms)
    assert [key for key, _, _ in fired] == [join_key("g")]
    answer = fired[0][2].response(token)
    assert isinstance(answer, JoinGroupResponse)
    assert (answer.error_code, answer.protocol_name, answer.generation_id) == (
        Errors.NONE,
        "range",
        1,
    )
    # The leader sees the metadata of the member's first "range".
    assert [m.metadata for m in answer.members] == [b"a"]
    assert state_of(ctx) is S.COMPLETING_REBALANCE


def test_a_join_phase_nobody_rejoins_rechecks_no_sooner_than_a_millisecond_later() -> None:
    # completeClassicGroupJoin re-arms the join timer after the rebalance timeout while static
    # members that did not rejoin wait for their sessions to expire. A timeout of 0 (or less,
    # which ClassicGroup.rebalanceTimeoutMs counts as 0) fired again at the same instant, for
    # ever on a clock that does not move between two firings.
    ctx = ShardContext()
    for instance_id, rebalance_timeout_ms in (("a", 0), ("b", -5)):
        ctx.join(
            instance_id=instance_id,
            rebalance_timeout_ms=rebalance_timeout_ms,
            session_timeout_ms=10_000,
        )
    ctx.now_ms += ctx.config.initial_rebalance_delay_ms
    assert ctx.timer.pop_due(ctx.now_ms) == (join_key("g"), ctx.now_ms)
    ctx._apply(ctx.shard.on_timer(join_key("g"), ctx.now_ms))
    group = ctx.shard.groups["g"]
    a, b = group.members
    ctx.sync(member_id=a, generation_id=1, instance_id="a", assignments=[(a, b"A"), (b, b"B")])
    ctx.sync(member_id=b, generation_id=1, instance_id="b")
    ctx.leave([(a, "a")])  # b does not rejoin
    assert state_of(ctx) is S.PREPARING_REBALANCE

    fired: list[tuple[str, int]] = []
    while len(fired) < 10 and (due := ctx.timer.pop_due(ctx.now_ms)) is not None:
        ctx._apply(ctx.shard.on_timer(due[0], ctx.now_ms))
        fired.append(due)
    assert fired == [(join_key("g"), ctx.now_ms)]
    assert ctx.timer.deadlines[join_key("g")][0] == ctx.now_ms + 1
    # b's session expiry ends the wait.
    ctx.sleep(10_000)
    assert state_of(ctx) is S.EMPTY
    assert join_key("g") not in ctx.timer.deadlines


# --------------------------------------------------------------------------------------------
# Request edge cases


def test_empty_group_id_is_invalid_for_the_membership_apis() -> None:
    ctx = ShardContext()
    shard = ctx.shard
    results = [
        shard.handle_sync_group(
            1, SyncGroupRequest(group_id="", generation_id=1, member_id="m"), 0
        ),
        shard.handle_heartbeat(2, HeartbeatRequest(group_id="", generation_id=1, member_id="m"), 0),
        shard.handle_leave_group(3, LeaveGroupRequest(group_id="", member_id="m"), 0),
        shard.handle_offset_delete(5, OffsetDeleteRequest(group_id=""), 0),
    ]
    assert [r.responses[0][1] for r in results] == [
        SyncGroupResponse(error_code=Errors.INVALID_GROUP_ID),
        HeartbeatResponse(error_code=Errors.INVALID_GROUP_ID),
        LeaveGroupResponse(error_code=Errors.INVALID_GROUP_ID),
        OffsetDeleteResponse(error_code=Errors.INVALID_GROUP_ID),
    ]
    assert all(r.records == [] for r in results)
    assert shard.groups == {}


def test_empty_group_id_is_an_ordinary_group_for_offsets_describe_and_delete() -> None:
    """Kafka takes "" for OffsetCommit, OffsetFetch, DescribeGroups and DeleteGroups "for
    backwards compatibility" (GroupCoordinatorService): a simple group like any other."""
    ctx = ShardContext()
    _, committed = ctx.commit([("t", 0, 7)], group_id="")
    assert [r for _, r in committed.records] == [
        CoordinatorRecord(
            OffsetCommitKey(group_id="", topic="t", partition=0),
            OffsetCommitValue(offset=7, commit_timestamp_ms=ctx.now_ms),
        )
    ]
    _, fetched = ctx.fetch([("t", 0)], group_id="")
    response = fetched.responses[0][1]
    assert isinstance(response, OffsetFetchResponse)
    assert response.error_code is Errors.NONE
    assert response.topics[0].partitions[0].committed_offset == 7
    _, described = ctx.describe([""])
    described_response = described.responses[0][1]
    assert isinstance(described_response, DescribeGroupsResponse)
    assert described_response.groups[0].error_code is Errors.NONE
    assert described_response.groups[0].group_state == "Empty"
    _, deleted = ctx.delete_groups([""])
    deleted_response = deleted.responses[0][1]
    assert isinstance(deleted_response, DeleteGroupsResponse)
    assert deleted_response.results[0].error_code is Errors.NONE
    assert CoordinatorRecord(OffsetCommitKey(group_id="", topic="t", partition=0), None) in [
        r for _, r in deleted.records
    ]


def test_leave_group_v0_reads_the_single_member_id() -> None:
    ctx = ShardContext()
    a, b = stable_group(ctx, "a", "b")
    result = ctx.shard.handle_leave_group(
        99, LeaveGroupRequest(group_id="g", member_id=b), ctx.now_ms
    )
    assert result.responses == [(99, LeaveGroupResponse(members=(MemberResponse(member_id=b),)))]
    assert list(ctx.shard.groups["g"].members) == [a]


def test_leave_group_v3_naming_no_member_answers_none() -> None:
    """LeaveGroupRequest.members() of a v3+ request is its list, empty or not: kcoord
    answered an empty one with a member "" and UNKNOWN_MEMBER_ID, known group or not."""
    ctx = ShardContext()
    a, b = stable_group(ctx, "a", "b")
    for group_id in ("g", "unknown"):
        result = ctx.shard.handle_leave_group(99, LeaveGroupRequest(group_id=group_id), ctx.now_ms)
        assert result.responses == [(99, LeaveGroupResponse(members=()))]
        assert result.records == []
    assert sorted(ctx.shard.groups["g"].members) == sorted([a, b])


def test_requests_to_an_empty_or_unknown_group() -> None:
    ctx = ShardContext()
    _, step = ctx.heartbeat(member_id="m", generation_id=1)
    assert step.responses[0][1] == HeartbeatResponse(error_code=Errors.UNKNOWN_MEMBER_ID)
    _, step = ctx.leave([("m", None)])
    # GroupCoordinatorService.leaveGroup: each member's error, not the request's.
    assert step.responses[0][1] == LeaveGroupResponse(
        members=(MemberResponse(member_id="m", error_code=Errors.UNKNOWN_MEMBER_ID),)
    )
    _, step = ctx.join(member_id="m")  # a member id for a group that does not exist
    assert step.responses[0][1] == JoinGroupResponse(
        member_id="m", error_code=Errors.UNKNOWN_MEMBER_ID
    )
    assert step.records == []
    ctx.commit([("t", 0, 1)])  # the simple group
    _, step = ctx.sync(member_id="m", generation_id=0)
    assert step.responses[0][1] == SyncGroupResponse(error_code=Errors.UNKNOWN_MEMBER_ID)
    _, step = ctx.leave([("m", None), ("", "i")])
    assert step.responses[0][1] == LeaveGroupResponse(
        members=(
            MemberResponse(member_id="m", error_code=Errors.UNKNOWN_MEMBER_ID),
            MemberResponse(
                member_id="", group_instance_id="i", error_code=Errors.UNKNOWN_MEMBER_ID
            ),
        )
    )


def test_a_pending_member_rejoining_with_an_instance_id_is_an_internal_error() -> None:
    ctx = ShardContext()
    ctx.join(client_id="a")  # a-1 is pending
    _, step = ctx.join(member_id="a-1", instance_id="i")
    assert step.responses[0][1] == JoinGroupResponse(
        member_id="a-1", error_code=Errors.UNKNOWN_SERVER_ERROR
    )


def test_max_size_in_preparing_rebalance_kicks_out_a_member_that_has_not_rejoined() -> None:
    # acceptJoiningMember counts the members awaiting a join answer, not the group size.
    ctx = ShardContext(GroupConfig(max_size=2))
    a, b = stable_group(ctx, "a", "b")
    ctx.join(member_id=a)  # a rejoins: rebalance; 1 awaiting
    token, step = ctx.join(client_id="c", require_known_member_id=False)  # 2 awaiting
    assert step.responses == []
    token, step = ctx.join(client_id="d", require_known_member_id=False)
    assert step.responses == [
        (token, JoinGroupResponse(member_id="", error_code=Errors.GROUP_MAX_SIZE_REACHED))
    ]
    token, step = ctx.join(member_id=b)  # a member, but not yet rejoined: out it goes
    assert step.responses == [
        (token, JoinGroupResponse(member_id="", error_code=Errors.GROUP_MAX_SIZE_REACHED))
    ]
    assert list(ctx.shard.groups["g"].members) == [a, "c-3"]


def test_commit_timestamp_and_metadata_size_follow_kafka() -> None:
    ctx = ShardContext(GroupConfig(offset_metadata_max_bytes=4), now_ms=50)
    request = OffsetCommitRequest(
        group_id="g",
        topics=(
            OffsetCommitRequestTopic(
                name="t",
                partitions=(
                    # OffsetCommit v1's explicit commit timestamp is kept.
                    OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=1, commit_timestamp=7
                    ),
                    # String.length(): an emoji is two UTF-16 code units.
                    OffsetCommitRequestPartition(
                        partition_index=1, committed_offset=2, committed_metadata="\U0001f600ab"
                    ),
                    OffsetCommitRequestPartition(
                        partition_index=2,
                        committed_offset=3,
                        committed_metadata="\U0001f600abc",
                        committed_leader_epoch=4,
                    ),
                ),
            ),
        ),
    )
    result = ctx.shard.handle_offset_commit(1, request, ctx.now_ms)
    assert result.records == [
        CoordinatorRecord(
            OffsetCommitKey(group_id="g", topic="t", partition=0),
            OffsetCommitValue(offset=1, commit_timestamp_ms=7),
        ),
        CoordinatorRecord(
            OffsetCommitKey(group_id="g", topic="t", partition=1),
            OffsetCommitValue(offset=2, metadata="\U0001f600ab", commit_timestamp_ms=50),
        ),
    ]
    response = result.responses[0][1]
    assert isinstance(response, OffsetCommitResponse)
    assert [p.error_code for p in response.topics[0].partitions] == [
        Errors.NONE,
        Errors.NONE,
        Errors.OFFSET_METADATA_TOO_LARGE,
    ]


def test_commit_keeps_a_members_session_alive() -> None:
    ctx = ShardContext()
    (a,) = stable_group(ctx, "a")
    ctx.sleep(9_000)
    ctx.commit([("t", 0, 1)], member_id=a, generation_id=1)
    ctx.sleep(9_000)
    assert state_of(ctx) is S.STABLE
    ctx.sleep(1_001)
    assert state_of(ctx) is S.EMPTY


def test_the_group_created_by_a_join_is_written_even_if_the_join_fails() -> None:
    ctx = ShardContext()
    _, step = ctx.join(protocols=())
    assert [r for _, r in step.records] == [
        CoordinatorRecord(
            GroupMetadataKey(group_id="g"),
            GroupMetadataValue(
                protocol_type="",
                generation=0,
                protocol=None,
                leader=None,
                current_state_timestamp_ms=0,
            ),
        )
    ]
    assert step.responses[0][1] == JoinGroupResponse(
        member_id="", error_code=Errors.INCONSISTENT_GROUP_PROTOCOL
    )


def test_deleted_partitions_get_a_tombstone_for_every_groups_offset_on_them() -> None:
    """``OffsetMetadataManager.onPartitionsDeleted``: only offsets on the named partitions."""
    ctx = ShardContext()
    ctx.commit([("gone", 0, 5), ("gone", 1, 6), ("kept", 0, 7)], group_id="a")
    ctx.commit([("gone", 1, 8)], group_id="b")
    ctx.commit([("kept", 0, 9)], group_id="c")
    step = ctx._apply(ctx.shard.on_partitions_deleted([("gone", 0), ("gone", 1), ("gone", 2)]))
    assert sorted(
        (r.key.group_id, r.key.topic, r.key.partition)
        for _, r in step.records
        if isinstance(r.key, OffsetCommitKey) and r.value is None
    ) == [("a", "gone", 0), ("a", "gone", 1), ("b", "gone", 1)]
    assert len(step.records) == 3 and not step.responses
    left = {
        (group, topic, partition, offset.committed_offset)
        for group, topics in ctx.shard.offsets.items()
        for topic, partitions in topics.items()
        for partition, offset in partitions.items()
    }
    assert left == {("a", "kept", 0, 7), ("c", "kept", 0, 9)}
    assert ctx._apply(ctx.shard.on_partitions_deleted([("other", 0)])).records == []


def test_a_leaders_assignment_too_large_for_a_batch_fails_the_sync_and_rebalances() -> None:
    """GroupMetadataManager's append callback: a GroupMetadata record the partition refuses
    (RECORD_LIST_TOO_LARGE) answers every parked SyncGroup UNKNOWN_SERVER_ERROR and
    rebalances the group alone. Written regardless, the refused append unloaded the shard:
    every group of its partition reloaded, at every rebalance of this one."""
    ctx = ShardContext(max_batch_bytes=1_000)
    for client in ("a", "b"):
        ctx.join(client_id=client, require_known_member_id=False)
    ctx.sleep(6_000)
    follower, _ = ctx.sync(member_id="b-2", generation_id=1)
    leader, step = ctx.sync(
        member_id="a-1", generation_id=1, assignments=[("a-1", b"x" * 600), ("b-2", b"y" * 600)]
    )
    assert step.records == []
    failed = SyncGroupResponse(error_code=Errors.UNKNOWN_SERVER_ERROR)
    assert sorted(step.responses) == [(follower, failed), (leader, failed)]
    assert state_of(ctx) is S.PREPARING_REBALANCE
    # The members rejoin; a leader's assignment that fits completes the rebalance.
    ctx.join(member_id="a-1")
    _, step = ctx.join(member_id="b-2")
    assert [r.generation_id for _, r in step.responses] == [2, 2]  # type: ignore[union-attr]
    _, step = ctx.sync(member_id="a-1", generation_id=2, assignments=[("a-1", b"x")])
    assert [offset for offset, _ in step.records] == [1]
    assert state_of(ctx) is S.STABLE


def test_a_static_rejoin_too_large_for_a_batch_keeps_the_old_member_id() -> None:
    """updateStaticMemberThenRebalanceOrCompleteJoin's append callback: the new member id
    could not be written, so the old one comes back, with its protocols and timeouts, and the
    joiner gets UNKNOWN_SERVER_ERROR; the group stays Stable."""
    ctx = ShardContext(max_batch_bytes=1_000)
    for client in ("a", "b"):
        ctx.join(client_id=client, instance_id=f"i{client}")
    ctx.sleep(6_000)
    ctx.sync(member_id="ia-1", generation_id=1, instance_id="ia", assignments=[("ia-1", b"A")])
    ctx.sync(member_id="ib-2", generation_id=1, instance_id="ib")
    assert state_of(ctx) is S.STABLE
    written = len(ctx.log)
    token, step = ctx.join(
        instance_id="ib", session_timeout_ms=30_000, protocols=(("range", b"s" * 1_000),)
    )
    assert step.responses == [
        (
            token,
            JoinGroupResponse(
                member_id="",
                generation_id=1,
                protocol_name="range",
                protocol_type="consumer",
                leader="ia-1",
                error_code=Errors.UNKNOWN_SERVER_ERROR,
            ),
        )
    ]
    assert len(ctx.log) == written
    group = ctx.shard.groups["g"]
    assert group.state is S.STABLE
    assert group.static_member_id("ib") == "ib-2"
    member = group.member("ib-2")
    assert member.session_timeout_ms == 10_000
    assert member.metadata("range") == b"s"
    _, step = ctx.heartbeat(member_id="ib-2", generation_id=1, instance_id="ib")
    assert step.responses[0][1] == HeartbeatResponse()
    # With the room, the same rejoin goes through without a rebalance.
    ctx.max_batch_bytes = None
    token, step = ctx.join(instance_id="ib", protocols=(("range", b"s" * 1_000),))
    assert step.responses[0][1].error_code is Errors.NONE  # type: ignore[union-attr]
    assert len(ctx.log) == written + 1


def test_an_expiration_pass_looks_at_a_bounded_number_of_offsets_a_firing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass over a shard of a million offsets held the event loop for seconds: each firing
    now looks at about ``EXPIRATION_OFFSETS_PER_RUN`` offsets (groups whole) and arms the
    timer again at once; the pass ends with every group looked at, then waits the interval.
    A group deleted since the pass began is skipped; one made since is left to the next."""
    monkeypatch.setattr(shard_module, "EXPIRATION_OFFSETS_PER_RUN", 10)
    config = GroupConfig(offsets_retention_minutes=1, offsets_retention_check_interval_ms=30_000)
    ctx = ShardContext(config)
    for g in range(8):
        ctx.commit([("t", p, 1) for p in range(4)], group_id=f"g{g}")
    fired = ctx.sleep(30_000)  # a pass with nothing to expire yet
    assert [key for key, _, _ in fired] == [GROUP_EXPIRATION_KEY] * 4
    assert ctx.timer.deadlines[GROUP_EXPIRATION_KEY][0] == 60_000
    fired = ctx.sleep(30_000)
    expiring = [(deadline, step) for key, deadline, step in fired if key == GROUP_EXPIRATION_KEY]
    # Two groups of four offsets a firing (five looked at each, with the group itself).
    assert [deadline for deadline, _ in expiring] == [60_000] * 4
    per_firing = [{r.key.group_id for _, r in step.records} for _, step in expiring]
    assert per_firing == [{"g0", "g1"}, {"g2", "g3"}, {"g4", "g5"}, {"g6", "g7"}]
    assert all(len(step.records) == 10 for _, step in expiring)  # 8 offsets and 2 groups
    assert not ctx.shard.offsets and not ctx.shard.groups
    assert ctx.timer.deadlines[GROUP_EXPIRATION_KEY][0] == 90_000

    # The next pass: a group deleted after the pass began is not looked at again; a group
    # made after it waits for the pass after.
    for g in range(4):
        ctx.commit([("t", p, 1) for p in range(4)], group_id=f"h{g}")
    ctx.sleep(60_000 - 1)  # their offsets expire in the pass at 120 000
    assert ctx.timer.pop_due(120_000) == (GROUP_EXPIRATION_KEY, 120_000)
    ctx.now_ms = 120_000
    first = ctx._apply(ctx.shard.on_timer(GROUP_EXPIRATION_KEY, ctx.now_ms))
    assert {r.key.group_id for _, r in first.records} == {"h0", "h1"}
    ctx.delete_groups(["h2"])
    ctx.commit([("t", 0, 1)], group_id="late")
    assert ctx.timer.pop_due(120_000) == (GROUP_EXPIRATION_KEY, 120_000)
    second = ctx._apply(ctx.shard.on_timer(GROUP_EXPIRATION_KEY, ctx.now_ms))
    assert {r.key.group_id for _, r in second.records} == {"h3"}
    assert ctx.timer.deadlines[GROUP_EXPIRATION_KEY][0] == 150_000
    assert set(ctx.shard.groups) == {"late"}


def test_a_deleted_group_keeps_its_timers_until_its_tombstone_is_replayed() -> None:
    """DeleteGroups changes the shard through its tombstones alone, so a delete whose write
    the log refuses fails alone and leaves the group as it was (the runtime keeps the shard,
    ``replay_only``). Its handler cancelled the group's timers itself: a refused delete left
    an Empty group whose pending member never expired; the timers go when the tombstone is
    replayed."""
    ctx = ShardContext()
    token, step = ctx.join()  # KIP-394: a pending member, the group Empty
    pending = step.response(token)
    assert isinstance(pending, JoinGroupResponse)
    assert pending.error_code is Errors.MEMBER_ID_REQUIRED
    timers = dict(ctx.shard.scheduled_timers)
    assert [key for key in timers if key.startswith("heartbeat/g/")]
    request = DeleteGroupsRequest(groups_names=("g",))
    refused = ctx.shard.handle_delete_groups(ctx.new_token(), request, ctx.now_ms)
    assert refused.records, "the group's tombstone, not replayed: its write was refused"
    assert dict(ctx.shard.scheduled_timers) == timers
    assert "g" in ctx.shard.groups

    token, step = ctx.delete_groups(["g"])
    deleted = step.response(token)
    assert isinstance(deleted, DeleteGroupsResponse)
    assert deleted.results[0].error_code is Errors.NONE
    assert "g" not in ctx.shard.groups
    assert not [key for key in ctx.shard.scheduled_timers if "/g" in key]


def test_the_timeline_has_each_rebalance_step_and_why() -> None:
    """DESIGN §8's per-group rebalance timeline: the state each step entered, at which
    generation, with how many members, and why a rebalance started (Kafka's
    prepareRebalance reasons); other groups' steps are not in it."""
    ctx = ShardContext()
    a, b = stable_group(ctx, "a", "b")
    stable_group(ctx, "c", group_id="other")
    ctx.now_ms += 5
    ctx.leave([(b, None)])
    steps = ctx.shard.stats.timeline("g")
    assert [(e.state, e.generation, e.members) for e in steps] == [
        ("PreparingRebalance", 0, 1),
        ("CompletingRebalance", 1, 2),
        ("Stable", 1, 2),
        ("PreparingRebalance", 1, 1),
    ]
    assert steps[0].reason == (
        f"Adding new member {a} with group instance id null; client reason: not provided"
    )
    assert steps[-1].reason == f"Removing member {b} on LeaveGroup; client reason: not provided"
    assert steps[-1].at_ms == ctx.now_ms and steps[-1].protocol == "classic"
    assert {e.group_id for e in ctx.shard.stats.rebalance_events} == {"g", "other"}
    assert steps[-1].as_dict()["state"] == "PreparingRebalance"


def test_a_leader_rejoining_a_stable_group_is_the_timeline_reason() -> None:
    """GroupMetadataManager.classicGroupJoinExistingMember's reasons: the leader's JoinGroup
    in Stable forces a rebalance, "Leader X re-joining group during Stable"."""
    ctx = ShardContext()
    a, _ = stable_group(ctx, "a", "b")
    ctx.join(member_id=a)
    last = ctx.shard.stats.timeline("g")[-1]
    assert (last.state, last.reason) == (
        "PreparingRebalance",
        f"Leader {a} re-joining group during Stable; client reason: not provided",
    )


def test_an_unloaded_shard_drops_its_groups_timelines() -> None:
    """A node that leads the partition again later starts its timelines over at that load
    (what the coordinator between saw is not here): events of other partitions' groups stay."""
    ctx = ShardContext()
    stable_group(ctx, "a")
    other = RebalanceEvent(0, "elsewhere", "classic", "Stable", 1, 1)
    ctx.shard.stats.rebalance_events.append(other)
    assert ctx.shard.stats.timeline("g")
    ctx.unload()
    assert ctx.shard.stats.timeline("g") == [] and list(ctx.shard.stats.rebalance_events) == [other]
