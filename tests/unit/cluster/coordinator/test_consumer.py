"""KIP-848 consumer groups on the pure shard: join, leave, revoke before assign, unreleased
partitions, fencing by epoch, session and rebalance timeouts, failover by replay, commits with
member epochs, ConsumerGroupDescribe, ListGroups and DeleteGroups, subscriptions by regular
expression, an assignment kept to the subscribed topics (KAFKA-19431).

The harness (``harness.ShardContext``) plays the runtime: records are appended and replayed at
once, timers fire as the mock clock moves, ``failover()`` rebuilds a shard from the log.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, cast

import pytest

from kcoord.cluster.coordinator import consumer, consumer_shard
from kcoord.cluster.coordinator.consumer import (
    MATCHED_PATTERNS_KEPT,
    ConsumerGroupMember,
    MemberState,
    TopicsSnapshot,
    reconcile,
)
from kcoord.cluster.coordinator.records import (
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    CoordinatorRecord,
    encode_record,
    record_size_bound,
    uuid_str,
)
from kcoord.cluster.coordinator.shard import GroupConfig
from kcoord.cluster.coordinator.timeline import MAX_REASON_CHARS, RebalanceEvent, RebalanceLog
from kcoord.cluster.coordinator.types import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    TopicIdPartitions,
)
from kcoord.errors import Errors
from kcoord.storage import format as fmt
from tests.unit.cluster.coordinator.harness import ShardContext, short_consumer_timing

T = "AAAAAAAAAAAAAAAAAAAAAA"  # topic "orders", 6 partitions
TOPICS = {"orders": (T, 6)}
SESSION_MS = 10_000
REBALANCE_MS = 5_000


def context() -> ShardContext:
    return ShardContext(GroupConfig(consumer_timing=short_consumer_timing(SESSION_MS)))


def send_heartbeat(
    ctx: ShardContext,
    request: ConsumerGroupHeartbeatRequest,
    topics: Mapping[str, tuple[str, int]],
) -> ConsumerGroupHeartbeatResponse:
    token = ctx.new_token()
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, request, ctx.now_ms, topics))
    response = step.response(token)
    assert isinstance(response, ConsumerGroupHeartbeatResponse)
    return response


def hb(
    ctx: ShardContext,
    member: str,
    epoch: int,
    owned: set[int] | None = None,
    *,
    topics: Mapping[str, tuple[str, int]] = TOPICS,
    subscribe: tuple[str, ...] | None = ("orders",),
    group: str = "g",
) -> ConsumerGroupHeartbeatResponse:
    request = ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        rebalance_timeout_ms=REBALANCE_MS if epoch == 0 else -1,
        subscribed_topic_names=subscribe if epoch == 0 else None,
        topic_partitions=(
            (() if epoch == 0 else None) if owned is None else ((T, tuple(sorted(owned))),)
        ),
        client_id=member,
    )
    return send_heartbeat(ctx, request, topics)


def parts(response: ConsumerGroupHeartbeatResponse, owned: set[int] | None = None) -> set[int]:
    """The partitions a response assigns; no assignment in it means "unchanged"."""
    if response.assignment is None:
        assert owned is not None, "no assignment in an answer that must carry one"
        return owned
    assignment: TopicIdPartitions = response.assignment
    return {p for topic_id, ps in assignment if topic_id == T for p in ps}


class Member:
    """A well-behaved client: it heartbeats with what it owns, revokes what it is no longer
    assigned before it reports, and takes what it is assigned."""

    def __init__(self, ctx: ShardContext, name: str) -> None:
        self.ctx, self.name = ctx, name
        self.epoch = 0
        self.owned: set[int] = set()

    def beat(self) -> ConsumerGroupHeartbeatResponse:
        response = hb(self.ctx, self.name, self.epoch, None if self.epoch == 0 else self.owned)
        assert response.error_code is Errors.NONE, response
        self.epoch = response.member_epoch
        self.owned = parts(response, self.owned)  # revoke what is gone, take what is new
        return response

    def leave(self) -> ConsumerGroupHeartbeatResponse:
        return hb(self.ctx, self.name, -1, self.owned)


def converge(ctx: ShardContext, members: list[Member], rounds: int = 8) -> None:
    """Heartbeat round-robin; after every call no partition is owned twice."""
    for _ in range(rounds):
        for m in members:
            m.beat()
            check_single_owner(members)


def check_single_owner(members: list[Member]) -> None:
    seen: dict[int, str] = {}
    for m in members:
        for p in m.owned:
            assert p not in seen, f"partition {p} owned by {seen[p]} and {m.name}"
            seen[p] = m.name


def group_state(ctx: ShardContext, group: str = "g") -> str:
    return ctx.shard.consumer_groups[group].state


def test_the_first_member_gets_every_partition_at_epoch_one() -> None:
    ctx = context()
    response = hb(ctx, "a", 0)
    assert response.error_code is Errors.NONE
    assert (response.member_id, response.member_epoch) == ("a", 1)
    assert parts(response) == set(range(6))
    assert response.heartbeat_interval_ms == 500
    assert group_state(ctx) == "Stable"


def test_members_join_one_by_one_and_leave_one_by_one_with_valid_assignments() -> None:
    ctx = context()
    members = [Member(ctx, name) for name in "abc"]
    for i in range(3):
        converge(ctx, members[: i + 1])
        owned = [m.owned for m in members[: i + 1]]
        assert set().union(*owned) == set(range(6)), owned
        assert all(len(o) == 6 // (i + 1) for o in owned), owned
        assert group_state(ctx) == "Stable"
    for i in range(2):
        members[i].leave()
        converge(ctx, members[i + 1 :])
        owned = [m.owned for m in members[i + 1 :]]
        assert set().union(*owned) == set(range(6)), owned


def test_a_partition_is_never_handed_over_before_its_owner_revokes_it() -> None:
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    assert a.owned == set(range(6))
    b.beat()  # joins: the new target gives it half, still owned by a
    assert b.owned == set()
    assert ctx.shard.consumer_groups["g"].members["b"].state is MemberState.UNRELEASED_PARTITIONS
    # a has not heartbeated: it owns everything, so nothing can go to b yet.
    b.beat()
    assert b.owned == set()
    # a learns what to revoke; it is kept at its epoch until it reports them gone.
    response = hb(ctx, "a", a.epoch, a.owned)
    kept = parts(response)
    assert len(kept) == 3 and response.member_epoch == a.epoch
    assert ctx.shard.consumer_groups["g"].members["a"].state is MemberState.UNREVOKED_PARTITIONS
    b.beat()
    assert b.owned == set(), "b got partitions a still owns"
    # a revokes and says so: it moves to the target epoch; then b gets the released ones.
    a.owned = kept
    a.beat()
    assert a.epoch == 2
    b.beat()
    assert b.owned == set(range(6)) - kept
    assert group_state(ctx) == "Stable"


def test_a_join_whose_new_target_assignment_is_too_large_fails_alone() -> None:
    """A join recomputes the target assignment, a record per member whose target changes:
    for thousands of members more than one batch of ``__consumer_offsets`` holds. The log
    refused the write, and a refused write of a handler that is not replay-only reloaded the
    whole partition, every group on it, at each retry (found by a review). The heartbeat
    changes its group only through its records, so they are dropped and it alone fails with
    UNKNOWN_SERVER_ERROR, as Kafka's runtime fails and reverts the write."""
    ctx = context()
    topics = {"orders": (T, 64)}
    members = [f"m{i:02d}" for i in range(12)]
    for name in members:
        assert hb(ctx, name, 0, topics=topics).error_code is Errors.NONE
    group = ctx.shard.consumer_groups["g"]
    epoch, targets = group.group_epoch, dict(group.targets)
    ctx.max_batch_bytes = 400  # the joiner's member record fits, the new targets do not
    refused = hb(ctx, "late", 0, topics=topics)
    assert refused.error_code is Errors.UNKNOWN_SERVER_ERROR
    assert refused.error_message == consumer_shard.HEARTBEAT_RECORDS_TOO_LARGE
    group = ctx.shard.consumer_groups["g"]
    assert (group.group_epoch, group.targets) == (epoch, targets)
    assert "late" not in group.members
    ctx.max_batch_bytes = None
    assert hb(ctx, "late", 0, topics=topics).error_code is Errors.NONE


def test_records_fit_a_batch_by_its_real_size_not_only_by_their_bound() -> None:
    """The size bound allows each record its worst framing, a third above the batch for
    target records: heartbeats the log would take were refused at every retry, and the
    group never finished its rebalance (found by a review)."""
    ctx = context()
    records = [
        consumer.target_member_record("g", f"member-{i:036d}", {T: frozenset({i % 6})})
        for i in range(200)
    ]
    encoded = [encode_record(r) for r in records]
    exact = len(fmt.build_batch([fmt.Record(i, 0, k, v) for i, (k, v) in enumerate(encoded)]))
    assert fmt.HEADER_SIZE + sum(record_size_bound(k, v) for k, v in encoded) > exact
    ctx.max_batch_bytes = exact
    assert ctx.shard._fit_a_batch(records)
    ctx.max_batch_bytes = exact - 1
    assert not ctx.shard._fit_a_batch(records)


def test_epoch_validation_fences_bad_epochs_and_accepts_a_retried_heartbeat() -> None:
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    b.beat()
    a.beat()  # told to revoke: stays at epoch 1
    a.beat()  # revoked: epoch 2, previous 1
    assert a.epoch == 2
    # A retry of the last request with the previous epoch, owning a subset, is accepted.
    assert hb(ctx, "a", 1, a.owned).error_code is Errors.NONE
    # Not when it lists a topic it was never assigned, even with no partitions (isSubset).
    other = ((T, tuple(sorted(a.owned))), ("BBBBBBBBBBBBBBBBBBBBBB", ()))
    retried = ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="a", member_epoch=1, topic_partitions=other
    )
    assert send_heartbeat(ctx, retried, TOPICS).error_code is Errors.FENCED_MEMBER_EPOCH
    assert hb(ctx, "a", 5, a.owned).error_code is Errors.FENCED_MEMBER_EPOCH
    assert hb(ctx, "a", 0 + 1, set(range(6))).error_code is Errors.FENCED_MEMBER_EPOCH
    assert hb(ctx, "nobody", 3, set()).error_code is Errors.UNKNOWN_MEMBER_ID
    # A group that does not exist: only a join (epoch 0) creates one.
    assert hb(ctx, "a", 2, a.owned, group="gone").error_code is Errors.GROUP_ID_NOT_FOUND
    assert hb(ctx, "a", -1, group="gone").error_code is Errors.GROUP_ID_NOT_FOUND
    assert "gone" not in ctx.shard.consumer_groups


def test_invalid_requests_get_kafkas_errors() -> None:
    ctx = context()
    bad = ConsumerGroupHeartbeatRequest(group_id="g", member_id="a", member_epoch=0)
    token = ctx.new_token()
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, bad, 0, TOPICS))
    response = step.response(token)
    assert isinstance(response, ConsumerGroupHeartbeatResponse)
    assert response.error_code is Errors.INVALID_REQUEST  # no rebalance timeout on join
    unknown_assignor = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="a",
        member_epoch=0,
        rebalance_timeout_ms=1000,
        subscribed_topic_names=("orders",),
        topic_partitions=(),
        server_assignor="nope",
    )
    token = ctx.new_token()
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, unknown_assignor, 0, TOPICS))
    response = step.response(token)
    assert isinstance(response, ConsumerGroupHeartbeatResponse)
    assert response.error_code is Errors.UNSUPPORTED_ASSIGNOR
    assert "g" not in ctx.shard.consumer_groups
    # Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid: a join states it owns nothing
    # (null is refused), and a static leave (epoch -2) names its instance.
    for fields in (
        {"member_epoch": 0, "rebalance_timeout_ms": 1000, "subscribed_topic_names": ("orders",)},
        {"member_epoch": -2},
    ):
        request = ConsumerGroupHeartbeatRequest(group_id="g", member_id="a", **fields)
        token = ctx.new_token()
        step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, request, 0, TOPICS))
        response = step.response(token)
        assert isinstance(response, ConsumerGroupHeartbeatResponse)
        assert response.error_code is Errors.INVALID_REQUEST, fields


def test_empty_or_blank_ids_and_a_v1_join_without_member_id_are_invalid() -> None:
    # GroupCoordinatorService.throwIfConsumerGroupHeartbeatRequestIsInvalid: Utils.
    # throwIfEmptyString trims (Java's String.trim: characters up to U+0020), and from v1
    # (KIP-1082) the member id is the client's, even on its first heartbeat.
    ctx = context()
    join = {
        "group_id": "g",
        "member_id": "a",
        "member_epoch": 0,
        "rebalance_timeout_ms": 1000,
        "subscribed_topic_names": ("orders",),
        "topic_partitions": (),
    }
    for fields, message in (
        ({"instance_id": ""}, "InstanceId can't be empty."),
        ({"rack_id": ""}, "RackId can't be empty."),
        ({"rack_id": " \t"}, "RackId can't be empty."),
        ({"group_id": "  "}, "GroupId can't be empty."),
        ({"member_id": ""}, "MemberId can't be empty."),
        ({"member_id": "", "group_id": ""}, "MemberId can't be empty."),  # checked first
        ({"member_id": " ", "member_epoch": 3, "topic_partitions": ()}, "MemberId can't be empty."),
        ({"member_id": "\n", "member_epoch": -1}, "MemberId can't be empty."),
    ):
        request = ConsumerGroupHeartbeatRequest(**{**join, **fields})  # type: ignore[arg-type]
        response = send_heartbeat(ctx, request, TOPICS)
        assert (response.error_code, response.error_message) == (
            Errors.INVALID_REQUEST,
            message,
        ), fields
    assert not ctx.shard.consumer_groups
    # v0: the coordinator names a member that joins without an id.
    v0 = ConsumerGroupHeartbeatRequest(**{**join, "member_id": "", "api_version": 0})  # type: ignore[arg-type]
    response = send_heartbeat(ctx, v0, TOPICS)
    assert response.error_code is Errors.NONE and response.member_id
    # Java's trim leaves a no-break space: an id of its own.
    nbsp = ConsumerGroupHeartbeatRequest(**{**join, "member_id": "\u00a0"})  # type: ignore[arg-type]
    assert send_heartbeat(ctx, nbsp, TOPICS).member_id == "\u00a0"


def test_a_silent_member_is_fenced_after_its_session_timeout() -> None:
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    converge(ctx, [a, b])
    ctx.sleep(SESSION_MS - 1000)
    a.beat()  # a keeps its session; b says nothing
    ctx.sleep(1500)
    assert "b" not in ctx.shard.consumer_groups["g"].members
    converge(ctx, [a])
    assert a.owned == set(range(6))


def test_a_groups_own_configs_set_its_heartbeat_interval_and_session_timeout() -> None:
    """KIP-848 group configs: the group's values where it has them, the broker's elsewhere;
    a change reaches a member at its next heartbeat (GroupMetadataManager reads the group's
    config at every heartbeat)."""
    ctx = context()
    ctx.group_configs["g"] = {"consumer.heartbeat.interval.ms": "700"}
    a = Member(ctx, "a")
    assert a.beat().heartbeat_interval_ms == 700
    assert hb(ctx, "x", 0, group="other").heartbeat_interval_ms == 500
    # The session: the broker's 10 s until the group's 30 s applies from the next heartbeat.
    ctx.group_configs["g"] = {"consumer.session.timeout.ms": "30000"}
    assert ctx.shard.scheduled_timers["consumer-session/g/a"] == ctx.now_ms + SESSION_MS
    assert a.beat().heartbeat_interval_ms == 500
    ctx.sleep(SESSION_MS + 1000)
    assert "a" in ctx.shard.consumer_groups["g"].members
    ctx.sleep(30_000 - SESSION_MS)
    assert "a" not in ctx.shard.consumer_groups["g"].members
    # A value that does not parse (the controller refuses those) falls back to the broker's;
    # one outside the node's range (which may have narrowed since) is capped to it.
    ctx.group_configs["g"] = {"consumer.heartbeat.interval.ms": "soon"}
    assert Member(ctx, "b").beat().heartbeat_interval_ms == 500
    ctx.group_configs["g"] = {"consumer.heartbeat.interval.ms": "20000"}
    assert Member(ctx, "c").beat().heartbeat_interval_ms == 15_000


def test_a_member_that_never_revokes_is_fenced_at_its_rebalance_timeout() -> None:
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    b.beat()
    hb(ctx, "a", a.epoch, a.owned)  # a must revoke 3 partitions...
    for _ in range(4):
        ctx.sleep(1000)
        hb(ctx, "a", a.epoch, a.owned)  # ...and keeps reporting all six
        b.beat()
    ctx.sleep(REBALANCE_MS)
    assert "a" not in ctx.shard.consumer_groups["g"].members
    b.beat()
    b.beat()
    assert b.owned == set(range(6))


def test_failover_rebuilds_the_group_and_members_carry_on() -> None:
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    converge(ctx, [a, b])
    before = ctx.shard.consumer_groups["g"]
    new = ctx.failover()
    after = new.shard.consumer_groups["g"]
    assert (after.group_epoch, after.assignment_epoch) == (
        before.group_epoch,
        before.assignment_epoch,
    )
    assert after.members == before.members and after.targets == before.targets
    a.ctx = b.ctx = new
    converge(new, [a, b])  # same epochs accepted: no rebalance
    assert new.shard.consumer_groups["g"].group_epoch == before.group_epoch


def test_a_member_in_a_state_a_newer_coordinator_wrote_is_fenced_unless_it_owns_nothing() -> None:
    """CurrentAssignmentBuilder.build, UNKNOWN: fenced if it owns (or may own) anything, else
    reconciled from what it was assigned. kcoord reconciled it from nothing, whatever it
    owned: its partitions went free while it still consumed them."""
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    converge(ctx, [a, b])
    last = next(
        r
        for r in reversed(ctx.log)
        if isinstance(r.key, ConsumerGroupCurrentMemberAssignmentKey) and r.key.member_id == "a"
    )
    assert isinstance(last.value, ConsumerGroupCurrentMemberAssignmentValue)
    newer = CoordinatorRecord(last.key, replace(last.value, state=9))
    new = ctx.failover()
    new = ShardContext(new.config, now_ms=new.now_ms, log=[*ctx.log, newer])
    assert new.shard.consumer_groups["g"].members["a"].state is MemberState.UNKNOWN
    a.ctx = b.ctx = new
    for owned in (a.owned, None):
        assert hb(new, "a", a.epoch, owned).error_code is Errors.FENCED_MEMBER_EPOCH
    nothing = ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="a", member_epoch=a.epoch, topic_partitions=()
    )
    assert send_heartbeat(new, nothing, TOPICS).error_code is Errors.NONE
    member = new.shard.consumer_groups["g"].members["a"]
    assert member.state is MemberState.STABLE
    assert member.assigned == new.shard.consumer_groups["g"].targets["a"]
    # The fenced client rejoins, as a client does, owning nothing.
    a.epoch, a.owned = 0, set()
    converge(new, [a, b])
    assert a.owned | b.owned == set(range(6)) and a.owned and b.owned


def commit(
    ctx: ShardContext, member: str, epoch: int, topic: str = "orders", *, version: int = 9
) -> Errors:
    request = OffsetCommitRequest(
        group_id="g",
        generation_id_or_member_epoch=epoch,
        member_id=member,
        report_group_id_not_found=version >= 9,
        member_epoch_version=version >= 9,
        topics=(
            OffsetCommitRequestTopic(
                name=topic,
                partitions=(OffsetCommitRequestPartition(partition_index=0, committed_offset=5),),
            ),
        ),
    )
    token = ctx.new_token()
    step = ctx._apply(ctx.shard.handle_offset_commit(token, request, ctx.now_ms))
    response: Any = step.response(token)
    code: Errors = response.topics[0].partitions[0].error_code
    return code


def test_commits_need_the_current_member_epoch() -> None:
    ctx = context()
    a = Member(ctx, "a")
    a.beat()
    assert commit(ctx, "a", a.epoch) is Errors.NONE
    assert commit(ctx, "a", a.epoch - 1) is Errors.STALE_MEMBER_EPOCH
    assert commit(ctx, "b", 1) is Errors.UNKNOWN_MEMBER_ID
    # A member of the consumer protocol commits with v9 or later (validateOffsetCommit).
    assert commit(ctx, "a", a.epoch, version=8) is Errors.UNSUPPORTED_VERSION
    assert commit(ctx, "", -1) is Errors.UNKNOWN_MEMBER_ID  # admin commit: group not empty
    a.leave()
    assert commit(ctx, "", -1) is Errors.NONE
    # Epoch -1 to an empty group is taken whatever member id it names (a consumer that
    # assigns itself, or a stale id): ConsumerGroup.validateOffsetCommit.
    assert commit(ctx, "stale-id", -1) is Errors.NONE


def commit_each(
    ctx: ShardContext,
    member: str,
    epoch: int,
    partitions: Iterable[int] = range(6),
    topics: Mapping[str, tuple[str, int]] | None = None,
) -> dict[int, Errors]:
    """An OffsetCommit v9 of ``partitions`` of "orders" by ``member`` at ``epoch``, with the
    metadata image's ``topics``: each partition's error."""
    request = OffsetCommitRequest(
        group_id="g",
        generation_id_or_member_epoch=epoch,
        member_id=member,
        report_group_id_not_found=True,
        member_epoch_version=True,
        topics=(
            OffsetCommitRequestTopic(
                name="orders",
                partitions=tuple(
                    OffsetCommitRequestPartition(partition_index=p, committed_offset=7)
                    for p in sorted(partitions)
                ),
            ),
        ),
    )
    token = ctx.new_token()
    step = ctx._apply(ctx.shard.handle_offset_commit(token, request, ctx.now_ms, topics))
    response: Any = step.response(token)
    return {p.partition_index: p.error_code for p in response.topics[0].partitions}


def errors_of(answer: dict[int, Errors]) -> set[Errors]:
    return set(answer.values())


def test_a_commit_at_an_older_member_epoch_is_taken_if_it_owned_every_partition_since() -> None:
    """KIP-1251: ``assignmentEpoch <= clientEpoch <= brokerEpoch`` for every partition. A
    member whose epoch moved on before its client heard of it was refused (false fencing);
    a commit of partitions it has owned since that epoch is taken, one naming a partition
    given to another member meanwhile (a zombie commit) is refused whole and writes nothing,
    as is an epoch ahead of the member's."""
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    first = a.epoch
    assert a.owned == set(range(6))
    converge(ctx, [a, b])
    assert a.epoch > first and a.owned and b.owned
    assert errors_of(commit_each(ctx, "a", first)) == {Errors.STALE_MEMBER_EPOCH}
    assert "g" not in ctx.shard.offsets  # nothing written, a's partitions neither
    assert errors_of(commit_each(ctx, "a", first, a.owned)) == {Errors.NONE}
    assert set(committed(ctx)["orders"]) == a.owned
    assert errors_of(commit_each(ctx, "a", a.epoch, a.owned)) == {Errors.NONE}
    assert errors_of(commit_each(ctx, "a", a.epoch + 1, a.owned)) == {Errors.STALE_MEMBER_EPOCH}
    # b's commit at an epoch before its partitions became its own is fenced.
    member_b = ctx.shard.consumer_groups["g"].members["b"]
    got = min(member_b.assignment_epochs[T].values())
    assert got > first
    assert errors_of(commit_each(ctx, "b", got - 1, b.owned)) == {Errors.STALE_MEMBER_EPOCH}


def test_assignment_epochs_are_written_and_a_load_that_skips_records_has_them() -> None:
    """Each current assignment record writes its partitions' assignment epochs (Kafka 4.3's
    ``AssignmentEpochs``): a new leader that replays the whole log, the compacted log, or the
    log with records of the member left out (a cold load flushing in stretches, a standby after
    a cleaner pass) takes and refuses the same commits. Derived by the replay from the record
    before (48bfa02), one read after a gap kept the epoch a partition had before it was given
    to another member and back: the zombie commit at that epoch was taken (found by a review);
    and a compacted log refused every commit at an older epoch."""
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    first = a.epoch
    converge(ctx, [a, b])
    theirs = set(b.owned)
    assert theirs and a.owned
    b.leave()
    converge(ctx, [a])
    assert a.owned == set(range(6))
    kept = a.owned - theirs
    before = ctx.shard.consumer_groups["g"].members["a"].assignment_epochs

    def check(new: ShardContext) -> None:
        assert new.shard.consumer_groups["g"].members["a"].assignment_epochs == before
        refused = commit_each(new, "a", first, theirs)  # given to b and back meanwhile
        assert errors_of(refused) == {Errors.STALE_MEMBER_EPOCH}, refused
        assert errors_of(commit_each(new, "a", first, kept)) == {Errors.NONE}
        assert errors_of(commit_each(new, "a", a.epoch, a.owned)) == {Errors.NONE}

    assignments = [
        offset
        for offset, record in enumerate(ctx.log)
        if record.key == ConsumerGroupCurrentMemberAssignmentKey(group_id="g", member_id="a")
    ]
    assert len(assignments) >= 3
    check(ctx.failover())
    check(ctx.failover(compacted=True))
    # Records without them (an older kcoord's) count every partition from the record's epoch.
    older = ctx.failover(older_writer=True)
    assert errors_of(commit_each(older, "a", first, kept)) == {Errors.STALE_MEMBER_EPOCH}
    assert errors_of(commit_each(older, "a", a.epoch, a.owned)) == {Errors.NONE}
    for gap in range(1, len(assignments) - 1):  # the first and last kept, some between not
        check(ctx.failover(skip=assignments[gap:-1]))
        check(ctx.failover(skip=assignments[1 : gap + 1]))
    check(ctx)


def test_assignment_epochs_not_one_per_partition_read_as_the_records_epoch() -> None:
    """As Kafka's ``Utils.assignmentFromTopicPartitions``: such a record's partitions count from
    its member epoch, not a load that fails (and leaves every group of the partition unserved)."""
    groups: dict[str, Any] = {}
    member = ConsumerGroupMember(member_id="a", member_epoch=5, assigned={T: frozenset({0, 1})})
    record = consumer.current_assignment_record("g", member)
    value = record.value
    assert isinstance(value, ConsumerGroupCurrentMemberAssignmentValue)
    (topic,) = value.assigned_partitions
    assert topic.assignment_epochs == (5, 5)
    for epochs in ((3,), (), (3, 3, 3)):
        odd = replace(topic, assignment_epochs=epochs)
        consumer.replay_record(
            groups, CoordinatorRecord(record.key, replace(value, assigned_partitions=(odd,)))
        )
        assert groups["g"].members["a"].assignment_epochs == {T: {0: 5, 1: 5}}


def test_a_partition_revoked_and_given_back_takes_the_new_epoch() -> None:
    """Kafka's ``computeNextAssignment`` starts from the assigned partitions and their epochs
    alone: one the member was revoking, and is given back once it has, is assigned at the new
    epoch. It kept the epoch it had before the revocation: a commit the member sent before it
    revoked the partition was taken after it had it back, its offset moving backwards (found
    by a review)."""
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    first = a.epoch
    b.beat()
    revoking = hb(ctx, "a", a.epoch, a.owned)  # b's share is to be revoked first
    kept = parts(revoking)
    gone = a.owned - kept
    assert kept and gone
    b.leave()
    back = hb(ctx, "a", revoking.member_epoch, kept)  # revoked; the target gives them back
    assert parts(back, kept) == set(range(6)) and back.member_epoch > first
    for new in (ctx, ctx.failover(compacted=True)):
        refused = commit_each(new, "a", first, gone)
        assert errors_of(refused) == {Errors.STALE_MEMBER_EPOCH}, refused
        assert errors_of(commit_each(new, "a", first, kept)) == {Errors.NONE}
        assert errors_of(commit_each(new, "a", back.member_epoch, gone)) == {Errors.NONE}


U = "BBBBBBBBBBBBBBBBBBBBBA"  # topic "other", 2 partitions
TWO_TOPICS = {"orders": (T, 6), "other": (U, 2)}


def owning_orders_since_an_older_epoch(ctx: ShardContext) -> tuple[int, int]:
    """Member "a" owns every partition of "orders" since its first epoch, and its epoch has
    moved on (member "c", of "other", joined) without its assignment changing: the two
    epochs."""
    first = hb(ctx, "a", 0, topics=TWO_TOPICS)
    assert parts(first) == set(range(6))
    joined = hb(ctx, "c", 0, topics=TWO_TOPICS, subscribe=("other",))
    assert joined.error_code is Errors.NONE
    moved = hb(ctx, "a", first.member_epoch, set(range(6)), topics=TWO_TOPICS)
    assert moved.member_epoch > first.member_epoch and parts(moved, set(range(6))) == set(range(6))
    return first.member_epoch, moved.member_epoch


def test_a_partition_pending_revocation_keeps_its_assignment_epoch() -> None:
    """KIP-1251: a partition the member is revoking is still its own, since the epoch it was
    assigned at: a commit at an epoch between that and the member's is taken, by the leader
    and by one that replayed the whole or the compacted log. Written without its epochs, or
    counted from the revoking record's epoch, it was refused (two changes no test caught,
    found by a review)."""
    ctx = context()
    first, now = owning_orders_since_an_older_epoch(ctx)
    hb(ctx, "b", 0, topics=TWO_TOPICS)
    revoking = hb(ctx, "a", now, set(range(6)), topics=TWO_TOPICS)
    kept = parts(revoking)
    assert revoking.member_epoch == now and kept < set(range(6))
    pending = set(range(6)) - kept
    member = ctx.shard.consumer_groups["g"].members["a"]
    assert member.pending_revocation == {T: frozenset(pending)}
    for new in (ctx, ctx.failover(), ctx.failover(compacted=True)):
        taken = commit_each(new, "a", first, pending, TWO_TOPICS)
        assert errors_of(taken) == {Errors.NONE}, taken
        assert errors_of(commit_each(new, "a", first - 1, pending, TWO_TOPICS)) == {
            Errors.STALE_MEMBER_EPOCH
        }


def test_a_commit_of_a_topic_no_member_subscribes_to_any_more_is_checked_by_its_id() -> None:
    """A member that drops "orders" from its subscription owns its partitions, pending
    revocation, until it has revoked them, and may commit them at an older epoch of its own
    (KIP-1251). The topic's id came from the group's subscription metadata, which lists the
    topics some member subscribes to: the commit was refused whole (STALE_MEMBER_EPOCH, found
    by a review). Kafka 4.3 takes the id from the metadata image (apache/kafka#21692)."""
    ctx = context()
    first, now = owning_orders_since_an_older_epoch(ctx)
    request = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="a",
        member_epoch=now,
        subscribed_topic_names=("other",),
        topic_partitions=((T, tuple(range(6))),),
    )
    dropped = send_heartbeat(ctx, request, TWO_TOPICS)
    assert dropped.error_code is Errors.NONE and dropped.member_epoch == now
    group = ctx.shard.consumer_groups["g"]
    assert T not in group.subscribed_topics
    assert group.members["a"].pending_revocation == {T: frozenset(range(6))}
    taken = commit_each(ctx, "a", first, range(6), TWO_TOPICS)
    assert errors_of(taken) == {Errors.NONE}, taken
    assert set(committed(ctx)["orders"]) == set(range(6))
    # A topic the image does not know (deleted) is not the member's.
    gone = commit_each(ctx, "a", first, range(6), {"other": TWO_TOPICS["other"]})
    assert errors_of(gone) == {Errors.STALE_MEMBER_EPOCH}


def test_a_static_members_leave_record_gives_no_assignment_epoch() -> None:
    """A static member's leave (epoch -2) keeps its assignment in a record that says nothing
    of when the partitions became its own. The log compacted while it was away keeps that
    record first, and replayed it gave them epoch -2: back under its id, the member's commit
    at an epoch when another member owned them was taken (found by a review)."""
    ctx = context()
    b = Member(ctx, "b")
    response = static_hb(ctx, "a", 0, "i-a")
    epoch, owned = response.member_epoch, parts(response, set())
    b.beat()
    for _ in range(8):
        response = static_hb(ctx, "a", epoch, "i-a", owned)
        epoch, owned = response.member_epoch, parts(response, owned)
        b.beat()
    early, theirs = epoch, set(b.owned)
    assert theirs and owned
    b.leave()
    for _ in range(4):
        response = static_hb(ctx, "a", epoch, "i-a", owned)
        epoch, owned = response.member_epoch, parts(response, owned)
    assert owned == set(range(6))
    assert errors_of(commit_each(ctx, "a", early, theirs)) == {Errors.STALE_MEMBER_EPOCH}
    static_hb(ctx, "a", -2, "i-a", owned)  # a static leave: the assignment is kept for its return
    reloads = [ctx.failover(), ctx.failover(compacted=True)]
    # Records without the epochs (an older kcoord's): the leave record's partitions take no
    # epoch, where Kafka takes the record's -2 and passes every commit at or above it.
    reloads.append(ctx.failover(compacted=True, older_writer=True))
    for reload in reloads:
        back = static_hb(reload, "a", 0, "i-a")
        assert back.error_code is Errors.NONE
        refused = commit_each(reload, "a", early, theirs)
        assert errors_of(refused) == {Errors.STALE_MEMBER_EPOCH}, refused
        assert errors_of(commit_each(reload, "a", back.member_epoch, owned)) == {Errors.NONE}


def fetch(ctx: ShardContext, member: str | None, epoch: int) -> tuple[Errors, list[int]]:
    """OffsetFetch v9 of ``g``'s "orders"-0 as ``member`` at ``epoch``: the group's error and
    the offsets answered."""
    request = OffsetFetchRequest(
        group_id="g",
        member_id=member,
        member_epoch=epoch,
        topics=(OffsetFetchRequestTopic(name="orders", partition_indexes=(0,)),),
    )
    token = ctx.new_token()
    response: Any = ctx._apply(ctx.shard.handle_offset_fetch(token, request, ctx.now_ms)).response(
        token
    )
    return response.error_code, [p.committed_offset for t in response.topics for p in t.partitions]


def test_offset_fetches_of_a_member_need_its_current_epoch() -> None:
    """``ConsumerGroup.validateOffsetFetch``: a fetch naming a member id or an epoch is checked
    like a commit, so a fenced consumer rejoins before it reads positions; one naming neither
    (the admin client, a consumer outside the group) is answered."""
    ctx = context()
    a = Member(ctx, "a")
    a.beat()
    assert commit(ctx, "a", a.epoch) is Errors.NONE
    assert fetch(ctx, "a", a.epoch) == (Errors.NONE, [5])
    assert fetch(ctx, None, -1) == (Errors.NONE, [5])
    assert fetch(ctx, "a", a.epoch + 5) == (Errors.STALE_MEMBER_EPOCH, [])
    assert fetch(ctx, "nobody", a.epoch) == (Errors.UNKNOWN_MEMBER_ID, [])
    assert fetch(ctx, None, a.epoch) == (Errors.UNKNOWN_MEMBER_ID, [])


def committed(ctx: ShardContext) -> dict[str, list[int]]:
    return {topic: sorted(ps) for topic, ps in ctx.shard.offsets.get("g", {}).items()}


def test_offset_delete_on_a_consumer_group_spares_the_subscribed_topics_only() -> None:
    """OffsetDelete to a consumer group with members (``ConsumerGroup.validateOffsetDelete``
    accepts in any state): offsets of a topic no member subscribes to go; those of a
    subscribed topic get GROUP_SUBSCRIBED_TO_TOPIC."""
    ctx = context()
    a = Member(ctx, "a")
    a.beat()
    assert commit(ctx, "a", a.epoch, "orders") is Errors.NONE
    assert commit(ctx, "a", a.epoch, "other") is Errors.NONE
    token, step = ctx.delete_offsets([("other", 0), ("orders", 0)])
    response: Any = step.response(token)
    assert response.error_code is Errors.NONE
    errors = {t.name: [p.error_code for p in t.partitions] for t in response.topics}
    assert errors == {"other": [Errors.NONE], "orders": [Errors.GROUP_SUBSCRIBED_TO_TOPIC]}
    assert committed(ctx) == {"orders": [0]}
    assert committed(ctx.failover()) == {"orders": [0]}


def test_a_consumer_groups_unsubscribed_offsets_expire_by_commit_time() -> None:
    """Offsets retention (``ConsumerGroup.offsetExpirationCondition``: from the commit): a
    topic no member subscribes to loses its offsets while the group is live; the subscribed
    topic's offsets stay."""
    ctx = ShardContext(
        GroupConfig(
            consumer_timing=short_consumer_timing(SESSION_MS),
            offsets_retention_minutes=1,
            offsets_retention_check_interval_ms=10_000,
        )
    )
    a = Member(ctx, "a")
    a.beat()
    assert commit(ctx, "a", a.epoch, "orders") is Errors.NONE
    assert commit(ctx, "a", a.epoch, "other") is Errors.NONE
    for _ in range(30):  # 150 s of heartbeats: past the minute's retention and a check
        ctx.sleep(5_000)
        a.beat()
    assert committed(ctx) == {"orders": [0]}
    assert group_state(ctx) == "Stable"


def test_an_empty_consumer_group_loses_its_offsets_and_then_itself() -> None:
    """Kafka's cleanupGroupMetadata covers consumer groups: once the last member is gone and
    the retention has passed, the offsets get tombstones and the empty group its own, so
    neither is served again, nor rebuilt by a new coordinator."""
    ctx = context()
    a = Member(ctx, "a")
    a.beat()
    assert commit(ctx, "a", a.epoch, "orders") is Errors.NONE
    a.leave()
    ctx.sleep(GroupConfig().offsets_retention_ms - 1)
    assert committed(ctx) == {"orders": [0]}
    ctx.sleep(GroupConfig().offsets_retention_check_interval_ms + 1)
    assert committed(ctx) == {}
    assert "g" not in ctx.shard.consumer_groups
    again = ctx.failover()
    assert committed(again) == {} and "g" not in again.shard.consumer_groups


def test_describe_list_and_delete() -> None:
    ctx = context()
    a = Member(ctx, "a")
    a.beat()
    token = ctx.new_token()
    step = ctx._apply(
        ctx.shard.handle_consumer_group_describe(
            token, ConsumerGroupDescribeRequest(group_ids=("g", "missing")), 0
        )
    )
    described = step.response(token)
    assert isinstance(described, ConsumerGroupDescribeResponse)
    g, missing = described.groups
    assert (g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name) == (
        "Stable",
        1,
        1,
        "uniform",
    )
    assert [m.member_id for m in g.members] == ["a"]
    assert g.members[0].assignment == ((T, (0, 1, 2, 3, 4, 5)),)
    assert missing.error_code is Errors.GROUP_ID_NOT_FOUND
    # DescribeGroups is for classic groups: a consumer group reads as Dead (describeGroups).
    for v6 in (True, False):
        token = ctx.new_token()
        request = DescribeGroupsRequest(groups=("g",), report_group_id_not_found=v6)
        old_api: Any = ctx._apply(ctx.shard.handle_describe_groups(token, request, 0)).response(
            token
        )
        (dead,) = old_api.groups
        assert (dead.group_state, dead.members) == ("Dead", ())
        assert dead.error_code is (Errors.GROUP_ID_NOT_FOUND if v6 else Errors.NONE)
    token = ctx.new_token()
    listed: Any = ctx._apply(
        ctx.shard.handle_list_groups(token, ListGroupsRequest(types_filter=("consumer",)), 0)
    ).response(token)
    assert [(x.group_id, x.group_state, x.protocol_type) for x in listed.groups] == [
        ("g", "Stable", "consumer")
    ]
    token = ctx.new_token()
    deleted: Any = ctx._apply(
        ctx.shard.handle_delete_groups(token, DeleteGroupsRequest(groups_names=("g",)), 0)
    ).response(token)
    assert deleted.results[0].error_code is Errors.NON_EMPTY_GROUP
    a.leave()
    token = ctx.new_token()
    deleted = ctx._apply(
        ctx.shard.handle_delete_groups(token, DeleteGroupsRequest(groups_names=("g",)), 0)
    ).response(token)
    assert deleted.results[0].error_code is Errors.NONE
    assert "g" not in ctx.shard.consumer_groups
    assert "g" not in ctx.failover().shard.consumer_groups


def test_new_partitions_bump_the_group_epoch_and_are_assigned() -> None:
    ctx = context()
    a = Member(ctx, "a")
    a.beat()
    grown = {"orders": (T, 8)}
    response = hb(ctx, "a", a.epoch, a.owned, topics=grown)
    assert response.member_epoch == 2
    assert parts(response) == set(range(8))


def static_hb(
    ctx: ShardContext, member: str, epoch: int, instance: str, owned: set[int] | None = None
) -> ConsumerGroupHeartbeatResponse:
    request = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id=member,
        member_epoch=epoch,
        instance_id=instance,
        rebalance_timeout_ms=REBALANCE_MS if epoch == 0 else -1,
        subscribed_topic_names=("orders",) if epoch == 0 else None,
        topic_partitions=(
            (() if epoch == 0 else None) if owned is None else ((T, tuple(sorted(owned))),)
        ),
    )
    token = ctx.new_token()
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, request, ctx.now_ms, TOPICS))
    response = step.response(token)
    assert isinstance(response, ConsumerGroupHeartbeatResponse)
    return response


def test_a_refused_replacement_of_a_static_member_keeps_its_session_timer() -> None:
    """A static member that left with -2 keeps its place until its session ends. A new
    process taking over its instance id cancels its timers before its records are written;
    refused (too large for a batch), the records are dropped and the old member stays: its
    session timer must be armed again, or it stayed in the group for good (found by a
    review)."""
    ctx = context()
    a = Member(ctx, "a")
    a.beat()
    first = static_hb(ctx, "s1", 0, "instance-1")
    owned = parts(first)
    assert static_hb(ctx, "s1", -2, "instance-1", owned).member_epoch == -2
    ctx.max_batch_bytes = 240  # the new process's member record fits; the hand-over does not
    refused = static_hb(ctx, "s2", 0, "instance-1")
    assert refused.error_code is Errors.UNKNOWN_SERVER_ERROR, refused
    assert refused.error_message == consumer_shard.HEARTBEAT_RECORDS_TOO_LARGE
    assert set(ctx.shard.consumer_groups["g"].members) == {"a", "s1"}
    ctx.max_batch_bytes = None
    for _ in range(3):
        ctx.sleep(SESSION_MS // 3)
        a.beat()
    ctx.sleep(10)
    assert set(ctx.shard.consumer_groups["g"].members) == {"a"}


def test_a_static_member_bounced_with_epoch_minus_two_comes_back_without_a_rebalance() -> None:
    ctx = context()
    a = Member(ctx, "a")
    state = {"epoch": 0, "owned": set[int]()}

    def beat_static() -> None:
        epoch = state["epoch"]
        assert isinstance(epoch, int)
        owned = state["owned"]
        assert isinstance(owned, set)
        r = static_hb(ctx, "s1", epoch, "instance-1", None if epoch == 0 else owned)
        assert r.error_code is Errors.NONE, r
        state["epoch"], state["owned"] = r.member_epoch, parts(r, None if epoch == 0 else owned)

    for _ in range(4):
        beat_static()
        a.beat()
    assert group_state(ctx) == "Stable"
    s_epoch, owned = state["epoch"], state["owned"]
    assert isinstance(s_epoch, int) and isinstance(owned, set) and len(owned) == 3
    group_epoch = ctx.shard.consumer_groups["g"].group_epoch
    # A live member's instance id cannot be taken.
    taken = static_hb(ctx, "s2", 0, "instance-1")
    assert taken.error_code is Errors.UNRELEASED_INSTANCE_ID
    # It leaves temporarily (-2): it keeps its place; a new process with its instance id
    # takes over its epoch and partitions at once.
    assert static_hb(ctx, "s1", -2, "instance-1", owned).member_epoch == -2
    assert "s1" in ctx.shard.consumer_groups["g"].members
    back = static_hb(ctx, "s2", 0, "instance-1")
    assert back.error_code is Errors.NONE
    assert (back.member_epoch, parts(back)) == (s_epoch, owned)
    group = ctx.shard.consumer_groups["g"]
    assert group.group_epoch == group_epoch and set(group.members) == {"a", "s2"}
    assert group_state(ctx) == "Stable"
    # The replaced process is fenced by its instance id (throwIfInstanceIdIsFenced), whether
    # it heartbeats or leaves; an instance id nobody holds is unknown.
    assert static_hb(ctx, "s1", s_epoch, "instance-1", owned).error_code is (
        Errors.FENCED_INSTANCE_ID
    )
    assert static_hb(ctx, "s1", -1, "instance-1").error_code is Errors.FENCED_INSTANCE_ID
    assert static_hb(ctx, "s3", 1, "instance-3", set()).error_code is Errors.UNKNOWN_MEMBER_ID
    assert set(ctx.shard.consumer_groups["g"].members) == {"a", "s2"}
    assert ctx.failover().shard.consumer_groups["g"].members.keys() == {"a", "s2"}


def test_a_static_member_that_does_not_come_back_is_removed_at_its_session_timeout() -> None:
    ctx = context()
    first = static_hb(ctx, "s1", 0, "instance-1")
    static_hb(ctx, "s1", -2, "instance-1", parts(first))
    ctx.sleep(SESSION_MS + 1)
    assert "s1" not in ctx.shard.consumer_groups["g"].members


def regex_hb(
    ctx: ShardContext,
    member: str,
    epoch: int,
    owned: Mapping[str, set[int]] | None,
    topics: Mapping[str, tuple[str, int]],
    *,
    regex: str | None = None,
    names: tuple[str, ...] | None = None,
) -> ConsumerGroupHeartbeatResponse:
    request = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id=member,
        member_epoch=epoch,
        rebalance_timeout_ms=REBALANCE_MS if epoch == 0 else -1,
        subscribed_topic_names=names,
        subscribed_topic_regex=regex,
        topic_partitions=(
            (() if epoch == 0 else None)
            if owned is None
            else tuple((t, tuple(sorted(ps))) for t, ps in sorted(owned.items()) if ps)
        ),
        client_id=member,
    )
    return send_heartbeat(ctx, request, topics)


def by_topic(response: ConsumerGroupHeartbeatResponse) -> dict[str, set[int]]:
    return {topic_id: set(ps) for topic_id, ps in response.assignment or ()}


# Topic ids as the records store them (16 bytes, in Kafka's string form).
PAY_A, PAY_B, OTHER, INTERNAL, UNDERSCORED = (uuid_str(bytes([i]) * 16) for i in (1, 2, 3, 4, 5))


def test_a_regex_subscription_takes_every_matching_topic_and_later_ones_too() -> None:
    ctx = context()
    topics = {
        "pay-a": (PAY_A, 2),
        "other": (OTHER, 2),
        "__consumer_offsets": (INTERNAL, 2),  # internal topics never match (Topic.isInternal)
        "__pay-mine": (UNDERSCORED, 1),  # a user's topic, "__" or not
    }
    joined = regex_hb(ctx, "a", 0, None, topics, regex="(__)?pay-.*|__consumer_offsets")
    assert joined.error_code is Errors.NONE, joined
    assert by_topic(joined) == {PAY_A: {0, 1}, UNDERSCORED: {0}}
    # The whole name must match (Java's Matcher.matches): "pay" alone matches nothing.
    assert regex_hb(ctx, "b", 0, None, topics, regex="pay").error_code is Errors.NONE
    assert ctx.shard.consumer_groups["g"].members["b"].subscribed_topic_regex == "pay"
    ctx.failover()  # the regex is in the member's metadata record
    member = ctx.shard.consumer_groups["g"].members["a"]
    assert member.subscribed_topic_regex == "(__)?pay-.*|__consumer_offsets"

    # A topic created later that matches bumps the group epoch at the next heartbeat.
    grown = {**topics, "pay-b": (PAY_B, 1)}
    epoch = ctx.shard.consumer_groups["g"].group_epoch
    owned = {PAY_A: {0, 1}, UNDERSCORED: {0}}
    response = regex_hb(ctx, "a", joined.member_epoch, owned, grown)
    assert response.error_code is Errors.NONE, response
    assert ctx.shard.consumer_groups["g"].group_epoch == epoch + 1
    assert by_topic(response) == {PAY_A: {0, 1}, PAY_B: {0}, UNDERSCORED: {0}}
    assert set(ctx.shard.consumer_groups["g"].subscribed_topics) == {PAY_A, PAY_B, UNDERSCORED}
    # By name, an internal topic is assigned too, as in Kafka.
    named = regex_hb(ctx, "c", 0, None, topics, names=("__consumer_offsets",))
    assert named.error_code is Errors.NONE, named


def test_a_regex_is_matched_once_per_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every heartbeat matched every member's regex against every topic: a long pattern
    held the event loop for seconds at each. A pattern is matched against a topic name
    once; a new topic is matched when it appears."""
    matched: list[str] = []
    compile_regex = consumer.compile_subscription_regex

    class Counting:
        def __init__(self, pattern: str) -> None:
            self.regex = compile_regex(pattern)

        def fullmatch(self, name: str) -> object:
            matched.append(name)
            return self.regex.fullmatch(name)

    monkeypatch.setattr(consumer, "compile_subscription_regex", Counting)
    consumer._fully_matches.cache_clear()
    try:
        _matched_once_per_topic(matched)
    finally:
        consumer._fully_matches.cache_clear()  # its entries hold the counting regexes


def _matched_once_per_topic(matched: list[str]) -> None:
    ctx = context()
    topics = TopicsSnapshot({"pay-a": (PAY_A, 2), "other": (OTHER, 2)}, version=7)
    joined = regex_hb(ctx, "a", 0, None, topics, regex="pay-.*")
    response = joined
    for _ in range(3):
        response = regex_hb(ctx, "a", response.member_epoch, by_topic(response), topics)
        assert response.error_code is Errors.NONE, response
    other = regex_hb(ctx, "b", 0, None, topics, regex="pay-.*")
    assert by_topic(joined) == {PAY_A: {0, 1}} and other.error_code is Errors.NONE
    assert sorted(matched) == ["other", "pay-a"]
    grown = TopicsSnapshot({**topics, "pay-b": (PAY_B, 1)}, version=8)
    regex_hb(ctx, "a", response.member_epoch, by_topic(response), grown)
    assert sorted(matched) == ["other", "pay-a", "pay-b"]
    assert set(ctx.shard.consumer_groups["g"].subscribed_topics) == {PAY_A, PAY_B}


def test_a_subscription_too_large_for_its_record_fails_that_heartbeat_alone() -> None:
    """A member whose record would not fit a batch of its partition was written anyway: the
    refused append reloaded the partition's shard, every group of it (a client could do it
    to every partition). It is answered UNKNOWN_SERVER_ERROR, as Kafka answers a record too
    large, and nothing changes."""
    ctx = context()
    topics = {"pay-a": (PAY_A, 2), "other": (OTHER, 2)}
    joined = regex_hb(ctx, "a", 0, None, topics, names=("pay-a",))
    group = ctx.shard.consumer_groups["g"]
    ctx.max_batch_bytes = 4096
    huge = tuple(f"topic-{i:05d}" for i in range(1000))  # 11 KB of names
    token = ctx.new_token()
    request = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="a",
        member_epoch=joined.member_epoch,
        subscribed_topic_names=huge,
        topic_partitions=tuple((t, tuple(sorted(ps))) for t, ps in by_topic(joined).items()),
    )
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, request, ctx.now_ms, topics))
    refused = step.response(token)
    assert isinstance(refused, ConsumerGroupHeartbeatResponse)
    assert refused.error_code is Errors.UNKNOWN_SERVER_ERROR and step.records == []
    assert ctx.shard.consumer_groups["g"] is group  # as it was
    ok = regex_hb(ctx, "a", joined.member_epoch, by_topic(joined), topics)
    assert ok.error_code is Errors.NONE, ok


def test_names_and_a_regex_together_and_dropping_the_regex() -> None:
    ctx = context()
    topics = {"pay-a": (PAY_A, 2), "other": (OTHER, 2)}
    joined = regex_hb(ctx, "a", 0, None, topics, regex="pay-.*", names=("other",))
    assert by_topic(joined) == {PAY_A: {0, 1}, OTHER: {0, 1}}
    # "" clears the regex (null would leave it as it is): the group epoch moves on and the
    # member must revoke pay-a before it is stable again.
    epoch = joined.member_epoch
    response = regex_hb(ctx, "a", epoch, by_topic(joined), topics, regex="")
    assert ctx.shard.consumer_groups["g"].members["a"].subscribed_topic_regex is None
    assert by_topic(response) == {OTHER: {0, 1}}
    response = regex_hb(ctx, "a", response.member_epoch, by_topic(response), topics)
    assert response.error_code is Errors.NONE
    assert response.member_epoch == epoch + 1
    assert group_state(ctx) == "Stable"


def test_an_invalid_regex_is_refused_with_invalid_regular_expression() -> None:
    ctx = context()
    topics = {"pay-a": (PAY_A, 2)}
    for bad in ("pay-(", "(?=pay)p.*", r"(pay)\1", "(?>pay)"):  # RE2 refuses the last three
        response = regex_hb(ctx, "a", 0, None, topics, regex=bad)
        assert response.error_code is Errors.INVALID_REGULAR_EXPRESSION, bad
        assert response.error_message and bad in response.error_message
    assert "g" not in ctx.shard.consumer_groups
    # An escaped backslash followed by a digit is no backreference.
    assert regex_hb(ctx, "a", 0, None, topics, regex=r"pay\\1|pay-a").error_code is Errors.NONE


def test_regexes_are_read_as_re2_reads_them() -> None:
    """RE2/J's syntax, which Python's re refused or misread: Java's Pattern.quote (\\Q...\\E),
    \\z, Unicode classes, POSIX classes, ungreedy mode."""
    topics = {"pay.v1-a": (PAY_A, 2), "42-events": (T, 6), "orders": (PAY_B, 1)}
    for regex, matched in [
        (r"\Qpay.v1\E-.*", {"pay.v1-a"}),
        (r"[[:digit:]]+-events", {"42-events"}),
        (r"\pL+\z", {"orders"}),
        (r"(?U)o.*s", {"orders"}),
    ]:
        ctx = context()
        response = regex_hb(ctx, "a", 0, None, topics, regex=regex)
        assert response.error_code is Errors.NONE, (regex, response.error_message)
        subscribed = ctx.shard.consumer_groups["g"].subscribed_topics
        assert {name for name, _ in subscribed.values()} == matched, regex


def test_a_static_member_leaving_mid_revocation_releases_what_it_was_revoking() -> None:
    """s1 was revoking 3-5 for b when it left with epoch -2 (a rolling restart, having
    revoked everything). Those partitions stayed pending until its session timed out, so b
    waited 45 s by default; Kafka's consumerGroupStaticMemberGroupLeave clears them."""
    ctx = context()
    joined = static_hb(ctx, "s1", 0, "i1")
    b = Member(ctx, "b")
    b.beat()
    static_hb(ctx, "s1", joined.member_epoch, "i1", parts(joined))  # told to revoke 3-5
    s1 = ctx.shard.consumer_groups["g"].members["s1"]
    assert s1.pending_revocation
    static_hb(ctx, "s1", -2, "i1", set())
    left = ctx.shard.consumer_groups["g"].members["s1"]
    assert (left.member_epoch, left.pending_revocation) == (-2, {})
    assert left.previous_member_epoch == s1.previous_member_epoch
    ctx.sleep(1000)
    b.beat()
    b.beat()
    assert b.owned == {3, 4, 5}


@pytest.mark.parametrize("failover", [False, True], ids=["live", "after-a-failover"])
def test_a_static_member_that_left_mid_revocation_waits_for_its_session(failover: bool) -> None:
    """A static member leaving (-2) mid-revocation keeps its place until its session ends,
    whatever its rebalance timeout: live, the leave cancels that timer. A new coordinator
    armed it again from the record (still revoking, at -2) and fenced the member at the
    rebalance timeout, which bumped the group epoch (found by a review): a rolling restart
    rebalanced the group or not depending on a failover."""
    ctx = context()
    joined = static_hb(ctx, "s1", 0, "i1")
    b = Member(ctx, "b")
    b.beat()
    static_hb(ctx, "s1", joined.member_epoch, "i1", parts(joined))  # told to revoke 3-5
    assert ctx.shard.consumer_groups["g"].members["s1"].pending_revocation
    static_hb(ctx, "s1", -2, "i1", set())
    if failover:
        ctx = ctx.failover()
    group_epoch = ctx.shard.consumer_groups["g"].group_epoch
    ctx.sleep(REBALANCE_MS + 1_000)
    group = ctx.shard.consumer_groups["g"]
    assert group.members["s1"].member_epoch == -2
    assert group.group_epoch == group_epoch
    ctx.sleep(SESSION_MS)
    assert "s1" not in ctx.shard.consumer_groups["g"].members


def test_a_known_member_rejoining_with_epoch_zero_keeps_its_place_without_a_rebalance() -> None:
    """KAFKA-19233: epoch 0 from a member the group knows (a fenced client rejoins with its
    member id) is a rejoin, not a new member: its epoch and assignment stay, the group epoch
    does not move, and the others keep what they own."""
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    converge(ctx, [a, b])
    group_epoch = ctx.shard.consumer_groups["g"].group_epoch
    b_before = (b.epoch, b.owned)
    response = hb(ctx, "a", 0)
    assert response.error_code is Errors.NONE
    assert (response.member_epoch, parts(response)) == (a.epoch, a.owned)
    assert ctx.shard.consumer_groups["g"].group_epoch == group_epoch
    converge(ctx, [a, b])
    assert (b.epoch, b.owned) == b_before
    assert group_state(ctx) == "Stable"


def test_a_member_joining_with_no_topics_starts_no_rebalance() -> None:
    """consumerGroupHeartbeat compares a new member with one that subscribes to nothing: a
    member joining with no topics (a pattern subscriber whose pattern matches nothing yet)
    leaves the group epoch as it is and gets the group's epoch with nothing assigned; the
    others carry on at theirs. Subscribing to a topic later is a change, and bumps it. A new
    group still moves away from epoch 0, whatever its first member subscribes to."""
    ctx = context()
    a = Member(ctx, "a")
    converge(ctx, [a])
    group_epoch = ctx.shard.consumer_groups["g"].group_epoch
    joined = hb(ctx, "e", 0, subscribe=())
    assert joined.error_code is Errors.NONE
    assert (joined.member_epoch, parts(joined)) == (group_epoch, set())
    assert ctx.shard.consumer_groups["g"].group_epoch == group_epoch
    assert a.beat().member_epoch == group_epoch and a.owned == set(range(6))

    request = ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="e", member_epoch=group_epoch, subscribed_topic_names=("orders",)
    )
    assert send_heartbeat(ctx, request, TOPICS).error_code is Errors.NONE
    assert ctx.shard.consumer_groups["g"].group_epoch == group_epoch + 1

    first = hb(ctx, "z", 0, subscribe=(), group="other")
    assert (first.error_code, first.member_epoch) == (Errors.NONE, 1)


def test_a_member_given_no_partitions_still_gets_its_target_assignment_record() -> None:
    """TargetAssignmentBuilder writes a record for every member that had no target yet, an
    empty one too: b subscribes to a topic that does not exist and is assigned nothing."""
    ctx = context()
    converge(ctx, [Member(ctx, "a")])
    written = len(ctx.log)
    assert hb(ctx, "b", 0, subscribe=("missing",)).error_code is Errors.NONE
    targets = [
        r.value
        for r in ctx.log[written:]
        if isinstance(r.key, ConsumerGroupTargetAssignmentMemberKey) and r.key.member_id == "b"
    ]
    assert targets == [ConsumerGroupTargetAssignmentMemberValue(topic_partitions=())]


def test_a_member_rejoining_mid_revocation_owning_nothing_moves_on() -> None:
    """A rejoin at epoch 0 reports owning nothing, so a member that owed a revocation has
    revoked: it moves to the target epoch and the partitions it gave up go to the other."""
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    b.beat()
    kept = parts(hb(ctx, "a", a.epoch, a.owned))  # told to revoke half
    assert ctx.shard.consumer_groups["g"].members["a"].state is MemberState.UNREVOKED_PARTITIONS
    response = hb(ctx, "a", 0)
    assert (response.member_epoch, parts(response)) == (2, kept)
    b.beat()
    assert b.owned == set(range(6)) - kept
    assert group_state(ctx) == "Stable"


def test_the_assignment_is_sent_only_when_it_changed_or_the_request_was_full() -> None:
    """consumerGroupHeartbeat: an assignment goes to a joining member, in answer to a full
    request (what a client sends after an error), and when it changed; otherwise it is left
    out, which the client reads as "unchanged"."""
    ctx = context()
    a = Member(ctx, "a")
    assert a.beat().assignment is not None  # joining
    assert a.beat().assignment is None  # nothing changed
    full = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="a",
        member_epoch=a.epoch,
        rebalance_timeout_ms=REBALANCE_MS,
        subscribed_topic_names=("orders",),
        topic_partitions=((T, tuple(sorted(a.owned))),),
    )
    assert parts(send_heartbeat(ctx, full, TOPICS)) == set(range(6))
    b = Member(ctx, "b")
    b.beat()
    shrunk = a.beat()  # half of it goes to b
    assert shrunk.assignment is not None and len(parts(shrunk)) == 3


def test_the_last_subscriber_of_a_topic_leaving_bumps_the_group_epoch_once() -> None:
    """consumerGroupFenceMembers writes the subscription metadata without the leaving member
    with its one new epoch; else the next heartbeat found the metadata stale and bumped again."""
    payments = uuid_str(b"\x09" * 16)
    topics = {"orders": (T, 6), "payments": (payments, 4)}
    ctx = context()
    a = hb(ctx, "a", 0, topics=topics)
    owned = parts(a)
    hb(ctx, "b", 0, topics=topics, subscribe=("payments",))
    a = hb(ctx, "a", a.member_epoch, owned, topics=topics)
    owned = parts(a, owned)
    group = ctx.shard.consumer_groups["g"]
    assert {name for name, _ in group.subscribed_topics.values()} == {"orders", "payments"}
    before = group.group_epoch
    hb(ctx, "b", -1, set(), topics=topics)
    group = ctx.shard.consumer_groups["g"]
    assert group.group_epoch == before + 1
    assert {name for name, _ in group.subscribed_topics.values()} == {"orders"}
    hb(ctx, "a", a.member_epoch, owned, topics=topics)
    assert ctx.shard.consumer_groups["g"].group_epoch == before + 1
    assert ctx.failover().shard.consumer_groups["g"].subscribed_topics == group.subscribed_topics


def unrevoked_member_a(
    ctx: ShardContext, topics: Mapping[str, tuple[str, int]]
) -> tuple[ConsumerGroupHeartbeatResponse, dict[str, set[int]]]:
    """a joins subscribed to every topic in ``topics`` and gets everything; b joins subscribed
    to "orders", so a is told to revoke half of it and, not having done so yet, is in
    UNREVOKED_PARTITIONS with its other topics still assigned. Returns a's last answer and
    everything a owns."""
    joined = regex_hb(ctx, "a", 0, None, topics, names=tuple(topics))
    owned = by_topic(joined)
    regex_hb(ctx, "b", 0, None, topics, names=("orders",))
    response = regex_hb(ctx, "a", joined.member_epoch, owned, topics)
    a = ctx.shard.consumer_groups["g"].members["a"]
    assert (a.state, response.member_epoch) == (MemberState.UNREVOKED_PARTITIONS, 1)
    assert {t: set(ps) for t, ps in a.assigned.items() if t != T} == {
        t: ps for t, ps in owned.items() if t != T
    }
    return response, owned


def test_an_unsubscribed_topic_leaves_the_assignment_of_a_member_owing_a_revocation() -> None:
    """KAFKA-19431 (CurrentAssignmentBuilder.updateCurrentAssignment): a member that changes its
    subscription while it still owns partitions it must revoke has the unsubscribed topic's
    partitions moved to pending revocation at once; Kafka 4.0 kept them in its assignment (and
    its answers) until it had revoked the others."""
    topics = {"orders": (T, 6), "payments": (PAY_A, 4)}
    ctx = context()
    response, owned = unrevoked_member_a(ctx, topics)
    orders_kept = by_topic(response)[T]
    # Still owning everything, a drops "payments" from its subscription.
    shrunk = regex_hb(ctx, "a", 1, owned, topics, names=("orders",))
    assert shrunk.error_code is Errors.NONE, shrunk
    assert shrunk.assignment is not None, "the assignment changed: it must be sent"
    assert by_topic(shrunk) == {T: orders_kept}
    a = ctx.shard.consumer_groups["g"].members["a"]
    assert (a.state, a.member_epoch) == (MemberState.UNREVOKED_PARTITIONS, 1)
    assert a.pending_revocation[PAY_A] == frozenset(owned[PAY_A])
    # It revokes as usual: once it reports only what it keeps, it moves on. The group settles
    # with "orders" split and "payments" owned by nobody, never owned twice on the way.
    b_epoch = ctx.shard.consumer_groups["g"].members["b"].member_epoch
    state: dict[str, tuple[int, dict[str, set[int]]]] = {
        "a": (1, {T: orders_kept}),
        "b": (b_epoch, {}),
    }
    for _ in range(3):
        for name in ("a", "b"):
            epoch, owned_now = state[name]
            answer = regex_hb(ctx, name, epoch, owned_now, topics)
            assert answer.error_code is Errors.NONE, answer
            state[name] = (
                answer.member_epoch,
                owned_now if answer.assignment is None else by_topic(answer),
            )
            a_orders, b_orders = (state[m][1].get(T, set()) for m in ("a", "b"))
            assert not a_orders & b_orders, (a_orders, b_orders)
    assert group_state(ctx) == "Stable"
    assert {t for _, held in state.values() for t in held} == {T}
    assert state["a"][1][T] | state["b"][1][T] == set(range(6))


def test_a_deleted_topic_is_not_subscribed_when_the_subscription_changes() -> None:
    """KAFKA-19431: subscribedTopicIds resolves the member's topic names against the metadata
    image, so a topic deleted since, though still named, leaves the assignment together with the
    topic it just unsubscribed from."""
    topics = {"orders": (T, 6), "payments": (PAY_A, 4), "audit": (OTHER, 2)}
    ctx = context()
    response, owned = unrevoked_member_a(ctx, topics)
    orders_kept = {T: by_topic(response)[T]} if T in by_topic(response) else {}
    del topics["payments"]
    shrunk = regex_hb(ctx, "a", 1, owned, topics, names=("orders", "payments"))
    assert shrunk.error_code is Errors.NONE, shrunk
    assert shrunk.assignment is not None and by_topic(shrunk) == orders_kept
    a = ctx.shard.consumer_groups["g"].members["a"]
    assert a.state is MemberState.UNREVOKED_PARTITIONS
    assert {t: set(ps) for t, ps in a.pending_revocation.items() if t != T} == {
        PAY_A: owned[PAY_A],
        OTHER: owned[OTHER],
    }


def test_a_deleted_topic_is_revoked_like_any_other_partition() -> None:
    """Kafka never drops a deleted topic's partitions without the member's word, before or
    after KAFKA-19431: they leave its assignment for pending revocation, and it stays at its
    epoch until it reports them gone (ownsRevokedPartitions)."""
    topics = {"orders": (T, 6), "payments": (PAY_A, 4)}
    ctx = context()
    joined = regex_hb(ctx, "a", 0, None, topics, names=tuple(topics))
    owned = by_topic(joined)
    del topics["payments"]
    response = regex_hb(ctx, "a", joined.member_epoch, owned, topics)
    assert (response.member_epoch, by_topic(response)) == (joined.member_epoch, {T: owned[T]})
    a = ctx.shard.consumer_groups["g"].members["a"]
    assert (a.state, dict(a.pending_revocation)) == (
        MemberState.UNREVOKED_PARTITIONS,
        {PAY_A: frozenset(range(4))},
    )
    response = regex_hb(ctx, "a", joined.member_epoch, {T: owned[T]}, topics)
    assert response.member_epoch == joined.member_epoch + 1
    assert group_state(ctx) == "Stable"


def test_reconcile_keeps_the_assignment_to_the_subscribed_topics() -> None:
    """KAFKA-19431 in CurrentAssignmentBuilder, on the pure function: a STABLE member at the
    target epoch whose subscription changed, and a target that still names an unsubscribed
    topic. Kafka meets both while a new target assignment is not computed yet; the shard always
    computes it in the heartbeat that changed the subscription or saw the topic go."""
    member = ConsumerGroupMember(
        member_id="a",
        member_epoch=3,
        previous_member_epoch=2,
        assigned={T: frozenset({0, 1}), PAY_A: frozenset({0})},
    )
    target = {T: frozenset({0, 1}), PAY_A: frozenset({0})}
    owned = {T: frozenset({0, 1}), PAY_A: frozenset({0})}

    def free(topic_id: str, partition: int) -> int:
        return -1

    after = reconcile(member, target, 3, owned, free, subscribed={T}, subscription_changed=True)
    assert (after.state, after.member_epoch, after.previous_member_epoch) == (
        MemberState.UNREVOKED_PARTITIONS,
        3,
        2,
    )
    assert (dict(after.assigned), dict(after.pending_revocation)) == (
        {T: frozenset({0, 1})},
        {PAY_A: frozenset({0})},
    )
    # Having revoked them, it reconciles towards the target, but not past the target's epoch
    # while the target that follows its new subscription does not exist yet (Kafka's
    # Math.min(memberEpoch + 1, targetAssignmentEpoch)): here the old target still takes
    # partition 1 from it, a revocation at its own epoch 3, not 4.
    revoking = reconcile(
        after,
        {T: frozenset({0})},
        3,
        {T: frozenset({0, 1})},
        free,
        subscribed={T},
        subscription_changed=False,
    )
    assert (revoking.state, revoking.member_epoch) == (MemberState.UNREVOKED_PARTITIONS, 3)
    assert dict(revoking.pending_revocation) == {T: frozenset({1})}
    # Already revoked by the member: only the assignment shrinks.
    revoked = reconcile(
        member, target, 3, {T: frozenset({0, 1})}, free, subscribed={T}, subscription_changed=True
    )
    assert (revoked.state, dict(revoked.assigned)) == (MemberState.STABLE, {T: frozenset({0, 1})})
    # computeNextAssignment: a target that still names the topic (computed before the member
    # unsubscribed, or before the topic was deleted) does not bring it back.
    moved_on = reconcile(member, target, 4, owned, free, subscribed={T}, subscription_changed=False)
    assert (moved_on.member_epoch, moved_on.state) == (3, MemberState.UNREVOKED_PARTITIONS)
    assert dict(moved_on.pending_revocation) == {PAY_A: frozenset({0})}
    # An unchanged subscription leaves a stable member alone.
    assert (
        reconcile(member, target, 3, owned, free, subscribed={T}, subscription_changed=False)
        is member
    )


def test_more_to_revoke_after_a_subscription_change_restarts_the_rebalance_timeout() -> None:
    """GroupMetadataManager.maybeReconcile restarts the rebalance timeout whenever reconciling
    changes a member still revoking: a member that drops a topic late in its revocation has a
    whole timeout for the partitions it must now give up too, not what was left of the first."""
    topics = {"orders": (T, 6), "payments": (PAY_A, 4)}
    ctx = context()
    _, owned = unrevoked_member_a(ctx, topics)
    step = REBALANCE_MS // 4
    for _ in range(3):  # a keeps everything; b is in good standing
        ctx.sleep(step)
        regex_hb(ctx, "a", 1, owned, topics)
        b = ctx.shard.consumer_groups["g"].members["b"]
        regex_hb(ctx, "b", b.member_epoch, {}, topics)
    regex_hb(ctx, "a", 1, owned, topics, names=("orders",))  # payments to revoke as well
    ctx.sleep(step + 1)  # past the first revocation's deadline
    assert "a" in ctx.shard.consumer_groups["g"].members
    ctx.sleep(REBALANCE_MS)  # past the new one: fenced, as ever
    assert "a" not in ctx.shard.consumer_groups["g"].members


def test_a_regex_subscribes_to_the_topics_it_resolved_to_not_to_every_name_it_matches() -> None:
    """``ConsumerGroup.isSubscribedToTopic`` counts the topics a regex resolved to in the
    image: offsets of a name the regex matches that is no topic (deleted while the shard was
    loading, so no tombstones came; or never created) expire and may be deleted, while those
    of a resolved topic stay."""
    ctx = ShardContext(
        GroupConfig(
            consumer_timing=short_consumer_timing(SESSION_MS),
            offsets_retention_minutes=1,
            offsets_retention_check_interval_ms=10_000,
        )
    )
    topics = {"pay-a": (PAY_A, 1)}
    joined = regex_hb(ctx, "a", 0, None, topics, regex="pay-.*")
    assert joined.error_code is Errors.NONE, joined
    epoch, owned = joined.member_epoch, {PAY_A: {0}}
    for topic in ("pay-a", "pay-gone"):
        assert commit(ctx, "a", epoch, topic) is Errors.NONE
    token, step = ctx.delete_offsets([("pay-gone", 0), ("pay-a", 0)])
    response: Any = step.response(token)
    errors = {t.name: [p.error_code for p in t.partitions] for t in response.topics}
    assert errors == {"pay-gone": [Errors.NONE], "pay-a": [Errors.GROUP_SUBSCRIBED_TO_TOPIC]}
    assert commit(ctx, "a", epoch, "pay-gone") is Errors.NONE
    for _ in range(30):  # 150 s of heartbeats: past the minute's retention and a check
        ctx.sleep(5_000)
        beat = regex_hb(ctx, "a", epoch, owned, topics)
        assert beat.error_code is Errors.NONE, beat
    assert committed(ctx) == {"pay-a": [0]}


def test_a_full_group_refuses_any_member_it_does_not_hold_a_static_one_rejoining_too() -> None:
    """``throwIfConsumerGroupIsFull`` comes before anything else about the member: at
    ``group.consumer.max.size`` a new member id is refused GROUP_MAX_SIZE_REACHED, also when
    it is a static member coming back under a new id (the old one, left with epoch -2, still
    counts), while the members the group holds carry on."""
    ctx = ShardContext(
        GroupConfig(consumer_timing=short_consumer_timing(SESSION_MS), consumer_max_size=1)
    )
    joined = static_hb(ctx, "m1", 0, "i1")
    assert joined.error_code is Errors.NONE
    assert static_hb(ctx, "m1", -2, "i1").error_code is Errors.NONE  # a static leave
    assert static_hb(ctx, "m2", 0, "i1").error_code is Errors.GROUP_MAX_SIZE_REACHED
    assert static_hb(ctx, "other", 0, "i2").error_code is Errors.GROUP_MAX_SIZE_REACHED
    assert list(ctx.shard.consumer_groups["g"].members) == ["m1"]


def test_a_topics_snapshot_keeps_the_matches_of_so_many_expressions() -> None:
    """A snapshot lives as long as the metadata does not change: heartbeats naming ever new
    expressions grew its matches without end (about 70 KB each against 2,000 topics). The least
    recently asked goes once it keeps MATCHED_PATTERNS_KEPT; asked again, it is matched again."""
    snapshot = TopicsSnapshot({"orders": ("T" * 22, 1), "payments": ("U" * 22, 1)}, 0)
    for i in range(MATCHED_PATTERNS_KEPT):
        assert snapshot.matching(f"ord.*|x{i}") == frozenset({"orders"})
    snapshot.matching("ord.*|x0")  # asked again: the least recently asked is now x1
    assert snapshot.matching("pay.*") == frozenset({"payments"})
    assert len(snapshot._matches) == MATCHED_PATTERNS_KEPT
    assert "ord.*|x1" not in snapshot._matches and "ord.*|x0" in snapshot._matches
    assert snapshot.matching("ord.*|x1") == frozenset({"orders"})


def test_heartbeats_answer_the_same_with_the_groups_subscriptions_kept_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A steady heartbeat derived what the group subscribes to from every member (O(members
    x topics): 44% of a core for a group of 2,000). It is kept per group while no member's
    subscription and no topic changes (the topics' snapshot version). Seeded random members
    joining, beating, changing subscriptions (by name and by regex) and leaving while
    topics grow answer and write the same with it as without (a plain mapping has no
    version, so nothing is kept), and a steady heartbeat reads one member's subscription."""
    seed = 4545
    print(f"seed {seed}")
    rng = random.Random(seed)
    images = [
        {"pay-a": (PAY_A, 2), "other": (OTHER, 2)},
        {"pay-a": (PAY_A, 4), "other": (OTHER, 2)},
        {"pay-a": (PAY_A, 4), "other": (OTHER, 2), "pay-b": (PAY_B, 3)},
    ]
    subscriptions: list[dict[str, Any]] = [
        {"names": ("pay-a",)},
        {"names": ("pay-a", "other")},
        {"regex": "pay-.*"},
        {"names": ("other", "pay-b")},
    ]
    plain, kept = context(), context()
    clients: dict[str, tuple[int, dict[str, set[int]]]] = {}
    image = 0
    for _ in range(600):
        if rng.random() < 0.03:
            image = min(image + 1, len(images) - 1)
        name = rng.choice("abcdefgh")
        epoch, owned = clients.get(name, (0, {}))
        fields: dict[str, Any] = {}
        if epoch == 0 or rng.random() < 0.05:
            fields = rng.choice(subscriptions)
        if epoch > 0 and rng.random() < 0.04:
            epoch = -1  # leaves
        sent_owned = None if epoch == 0 else owned
        answers = [
            regex_hb(ctx, name, epoch, sent_owned, topics, **fields)
            for ctx, topics in (
                (plain, images[image]),
                (kept, TopicsSnapshot(images[image], version=image)),
            )
        ]
        assert answers[0] == answers[1]
        assert plain.log == kept.log
        answer = answers[0]
        assert answer.error_code is Errors.NONE, answer
        if epoch == -1:
            clients.pop(name, None)
        else:
            assigned = owned if answer.assignment is None else by_topic(answer)
            clients[name] = (answer.member_epoch, assigned)
    assert len(plain.log) > 100
    # A steady heartbeat of a member of the group reads its own subscription, not everyone's.
    read: list[str] = []
    real = consumer.subscribed_topics  # what consumer_shard imported

    def counted(member: Any, topics: Any) -> frozenset[str]:
        read.append(member.member_id)
        return real(member, topics)

    monkeypatch.setattr(consumer_shard, "subscribed_topics", counted)
    name, (epoch, owned) = next(iter(clients.items()))
    topics = TopicsSnapshot(images[image], version=image)
    regex_hb(kept, name, epoch, owned, topics)
    regex_hb(kept, name, epoch, owned, topics)
    assert set(read) <= {name}, read


def test_tombstones_come_in_kafkas_order() -> None:
    """ConsumerGroup.createGroupTombstoneRecords: current assignments, target assignments, the
    target assignment's epoch, member metadata, partition metadata, the group's epoch ("the
    order matters": a log cut between two of them replays to a group Kafka could hold); a
    member's removal: its current assignment, its target, its metadata."""
    members = {m: cast(ConsumerGroupMember, None) for m in ("m1", "m2")}
    group = consumer.ConsumerGroup("g", members=members, targets={"m1": {}, "m3": {}})
    keys = [
        (type(record.key).__name__, getattr(record.key, "member_id", None))
        for record in consumer.group_tombstones(group)
    ]
    assert keys == [
        ("ConsumerGroupCurrentMemberAssignmentKey", "m1"),
        ("ConsumerGroupCurrentMemberAssignmentKey", "m2"),
        ("ConsumerGroupTargetAssignmentMemberKey", "m1"),
        ("ConsumerGroupTargetAssignmentMemberKey", "m3"),
        ("ConsumerGroupTargetAssignmentMetadataKey", None),
        ("ConsumerGroupMemberMetadataKey", "m1"),
        ("ConsumerGroupMemberMetadataKey", "m2"),
        ("ConsumerGroupPartitionMetadataKey", None),
        ("ConsumerGroupMetadataKey", None),
    ]
    removal = consumer.member_removal_records("g", "m1")
    assert [type(r.key).__name__ for r in removal] == [
        "ConsumerGroupCurrentMemberAssignmentKey",
        "ConsumerGroupTargetAssignmentMemberKey",
        "ConsumerGroupMemberMetadataKey",
    ]
    assert all(r.value is None and r.key.group_id == "g" for r in removal)


def test_the_configured_assignors_choose_the_default_and_refuse_the_rest() -> None:
    """group.consumer.assignors: its first is what a group whose members name none uses
    (ConsumerGroupDescribe's assignor name says which), and an assignor it leaves out is
    UNSUPPORTED_ASSIGNOR, as one that does not exist."""
    ctx = ShardContext(
        GroupConfig(
            consumer_timing=short_consumer_timing(SESSION_MS), consumer_assignors=("range",)
        )
    )
    Member(ctx, "a").beat()
    token = ctx.new_token()
    request = ConsumerGroupDescribeRequest(group_ids=("g",))
    step = ctx._apply(ctx.shard.handle_consumer_group_describe(token, request, 0))
    described = step.response(token)
    assert isinstance(described, ConsumerGroupDescribeResponse)
    assert described.groups[0].assignor_name == "range"
    asks_uniform = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="b",
        member_epoch=0,
        rebalance_timeout_ms=1000,
        subscribed_topic_names=("orders",),
        topic_partitions=(),
        server_assignor="uniform",
    )
    response = send_heartbeat(ctx, asks_uniform, TOPICS)
    assert response.error_code is Errors.UNSUPPORTED_ASSIGNOR
    assert response.error_message == (
        "ServerAssignor uniform is not supported. Supported assignors: range."
    )


def test_the_timeline_has_each_new_target_assignment_and_removal() -> None:
    """DESIGN §8's per-group rebalance timeline for a KIP-848 group: each new target
    assignment (the group's epoch, its members, why the epoch moved) and each removal."""
    ctx = context()
    a, b = Member(ctx, "a"), Member(ctx, "b")
    a.beat()
    b.beat()
    b.leave()
    a.beat()
    a.leave()
    steps = ctx.shard.stats.timeline("g")
    assert [(e.protocol, e.state, e.generation, e.members, e.reason) for e in steps] == [
        ("consumer", "Reconciling", 1, 1, "member a joined"),
        ("consumer", "Reconciling", 2, 2, "member b joined"),
        ("consumer", "Assigning", 3, 1, "member b left"),
        ("consumer", "Reconciling", 3, 1, None),
        ("consumer", "Empty", 4, 0, "member a left"),
    ]


def test_the_rebalance_log_keeps_the_latest_within_its_bounds() -> None:
    """A client naming 32 KiB groups with 32 KiB reasons made 10,000 events hold 940 MiB: the
    log is bounded in characters too, and a reason is cut."""
    log = RebalanceLog(max_events=3, max_chars=100)
    for i in range(5):
        log.append(RebalanceEvent(i, f"g{i}", "classic", "Stable", 1, 1))
    assert [e.at_ms for e in log] == [2, 3, 4] and log.latest(2)[0].at_ms == 3
    log.append(RebalanceEvent(5, "x" * 60, "classic", "Stable", 1, 1, "r" * 30))
    assert [e.at_ms for e in log] == [3, 4, 5]  # 2 + 2 + 90 characters: within 100
    log.append(RebalanceEvent(6, "y" * 10, "classic", "Stable", 1, 1))
    assert [e.at_ms for e in log] == [5, 6]  # 3 events, but 104 characters
    log.append(RebalanceEvent(6, "big", "classic", "Stable", 1, 1, "r" * 5000))
    [last] = list(log)  # alone over the budget, the newest stays
    assert last.reason is not None and len(last.reason) == MAX_REASON_CHARS + 3
    assert log.latest(0) == []


def test_the_first_configured_assignor_computes_the_targets() -> None:
    """Two members on two one-partition topics: uniform gives each one, range gives the first
    both; group.consumer.assignors' first decides when no member names one."""
    members = {
        m: ConsumerGroupMember(member_id=m, subscribed_topic_names=("t1", "t2")) for m in "ab"
    }
    topics = {"T1": ("t1", 1), "T2": ("t2", 1)}
    assert consumer.compute_targets(members, {}, topics) == {
        "a": {"T1": frozenset({0})},
        "b": {"T2": frozenset({0})},
    }
    assert consumer.compute_targets(members, {}, topics, ("range", "uniform")) == {
        "a": {"T1": frozenset({0}), "T2": frozenset({0})},
        "b": {},
    }
