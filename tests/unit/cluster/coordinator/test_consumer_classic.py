"""Classic members inside KIP-848 consumer groups, and the online conversions between the two
protocols, on the pure shard (``consumer_classic.py``): a classic member joins a consumer group
and reconciles through JoinGroup, SyncGroup and Heartbeat; a consumer-protocol member upgrades
a non-empty classic group; the last one leaving downgrades it back; Kafka's errors; and replay
(failover) of every step. No partition is ever owned by two members at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kcoord.cluster.coordinator.classic import ClassicGroupState
from kcoord.cluster.coordinator.consumer import MemberState
from kcoord.cluster.coordinator.consumer_protocol import (
    Subscription,
    decode_assignment,
    encode_assignment,
    encode_subscription,
)
from kcoord.cluster.coordinator.consumer_shard import (
    GROUP_TOO_LARGE_TO_CONVERT,
    HEARTBEAT_RECORDS_TOO_LARGE,
)
from kcoord.cluster.coordinator.records import uuid_str
from kcoord.cluster.coordinator.shard import GroupConfig
from kcoord.cluster.coordinator.types import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchRequest,
    SyncGroupResponse,
)
from kcoord.errors import Errors
from tests.unit.cluster.coordinator.harness import ShardContext, Step, short_consumer_timing

T = uuid_str(bytes([7]) * 16)
TOPICS = {"orders": (T, 6)}
SESSION_MS = 10_000
CLASSIC_SESSION_MS = 8_000


def context() -> ShardContext:
    return ShardContext(
        GroupConfig(
            consumer_timing=short_consumer_timing(SESSION_MS),
            initial_rebalance_delay_ms=0,
        )
    )


def subscription(owned: frozenset[int] = frozenset(), version: int = 1) -> bytes:
    owned_partitions = (("orders", tuple(sorted(owned))),) if owned else ()
    return encode_subscription(Subscription(version, ("orders",), None, owned_partitions))


class ConsumerMember:
    """A KIP-848 member: heartbeats with what it owns; revokes before it reports."""

    def __init__(self, ctx: ShardContext, name: str, instance_id: str | None = None) -> None:
        self.ctx, self.name, self.instance_id = ctx, name, instance_id
        self.epoch = 0
        self.owned: set[int] = set()

    def beat(self, epoch: int | None = None) -> ConsumerGroupHeartbeatResponse:
        epoch = self.epoch if epoch is None else epoch
        request = ConsumerGroupHeartbeatRequest(
            group_id="g",
            member_id=self.name,
            member_epoch=epoch,
            instance_id=self.instance_id,
            rebalance_timeout_ms=5_000 if epoch == 0 else -1,
            subscribed_topic_names=("orders",) if epoch == 0 else None,
            topic_partitions=() if epoch == 0 else ((T, tuple(sorted(self.owned))),),
            client_id=self.name,
        )
        token = self.ctx.new_token()
        step = self.ctx._apply(
            self.ctx.shard.handle_consumer_group_heartbeat(token, request, self.ctx.now_ms, TOPICS)
        )
        response = step.response(token)
        assert isinstance(response, ConsumerGroupHeartbeatResponse)
        if response.error_code is Errors.NONE and epoch >= 0:
            self.epoch = response.member_epoch
            if response.assignment is not None:  # None: unchanged
                self.owned = {p for t, ps in response.assignment if t == T for p in ps}
        return response


class ClassicMember:
    """An eager classic consumer (kafka-python's range assignor): it revokes everything when
    it rejoins, and owns what SyncGroup gives it."""

    def __init__(self, ctx: ShardContext, name: str) -> None:
        self.ctx, self.name = ctx, name
        self.member_id = ""
        self.generation = -1
        self.owned: set[int] = set()

    def join(self, protocol_type: str = "consumer") -> JoinGroupResponse:
        self.owned = set()  # eager: revoke everything before rejoining
        for _ in range(2):  # the first try of a new member gets MEMBER_ID_REQUIRED
            token, step = self.ctx.join(
                member_id=self.member_id,
                client_id=self.name,
                session_timeout_ms=CLASSIC_SESSION_MS,
                rebalance_timeout_ms=6_000,
                protocol_type=protocol_type,
                protocols=(("range", subscription()),),
                topics=TOPICS,
            )
            response = step.response(token)
            assert isinstance(response, JoinGroupResponse)
            if response.error_code is not Errors.MEMBER_ID_REQUIRED:
                break
            self.member_id = response.member_id
        assert isinstance(response, JoinGroupResponse)
        if response.error_code is Errors.NONE:
            self.member_id, self.generation = response.member_id, response.generation_id
        return response

    def sync(self) -> SyncGroupResponse:
        token, step = self.ctx.sync(member_id=self.member_id, generation_id=self.generation)
        response = step.response(token)
        assert isinstance(response, SyncGroupResponse)
        if response.error_code is Errors.NONE:
            assignment = decode_assignment(response.assignment)
            self.owned = {p for t, ps in assignment.partitions if t == "orders" for p in ps}
        return response

    def heartbeat(self) -> Errors:
        token, step = self.ctx.heartbeat(member_id=self.member_id, generation_id=self.generation)
        response = step.response(token)
        assert isinstance(response, HeartbeatResponse)
        return response.error_code

    def poll(self) -> None:
        """What a classic client does each poll: heartbeat, and rejoin if told to, or if its
        generation is past (the Java client's resetGenerationOnResponseError keeps the
        member id)."""
        if self.heartbeat() in (Errors.REBALANCE_IN_PROGRESS, Errors.ILLEGAL_GENERATION):
            assert self.join().error_code is Errors.NONE
            assert self.sync().error_code is Errors.NONE


def check_single_owner(members: list[ConsumerMember | ClassicMember]) -> None:
    seen: dict[int, str] = {}
    for m in members:
        for p in m.owned:
            assert p not in seen, f"partition {p} owned by {seen[p]} and {m.name}"
            seen[p] = m.name


def converge(ctx: ShardContext, members: list[ConsumerMember | ClassicMember]) -> None:
    for _ in range(8):
        for m in members:
            if isinstance(m, ConsumerMember):
                assert m.beat().error_code is Errors.NONE
            else:
                m.poll()
            check_single_owner(members)


def owned_by(members: list[ConsumerMember | ClassicMember]) -> Mapping[str, set[int]]:
    return {m.name: m.owned for m in members}


def test_a_classic_member_joins_a_consumer_group_and_takes_its_share() -> None:
    ctx = context()
    a = ConsumerMember(ctx, "a")
    a.beat()
    assert a.owned == set(range(6))
    b = ClassicMember(ctx, "b")
    joined = b.join()
    assert joined.error_code is Errors.NONE
    assert (joined.protocol_type, joined.protocol_name, joined.leader) == ("consumer", "range", "")
    assert joined.generation_id == 2 and joined.members == ()  # no client-side assignment
    member = ctx.shard.consumer_groups["g"].members[b.member_id]
    assert member.classic is not None and member.classic.session_timeout_ms == CLASSIC_SESSION_MS
    # Its partitions are still a's: SyncGroup gives nothing until a lets them go.
    assert member.state is MemberState.UNRELEASED_PARTITIONS
    assert b.sync().error_code is Errors.NONE and b.owned == set()
    assert b.heartbeat() is Errors.NONE  # waiting, nothing to do yet
    members: list[ConsumerMember | ClassicMember] = [a, b]
    converge(ctx, members)
    assert len(a.owned) == len(b.owned) == 3 and a.owned | b.owned == set(range(6))
    assert ctx.shard.consumer_groups["g"].state == "Stable"
    # ConsumerGroupDescribe tells the classic member apart (MemberType, KIP-848 upgrades).
    token = ctx.new_token()
    request = ConsumerGroupDescribeRequest(group_ids=("g",))
    described: Any = ctx._apply(ctx.shard.handle_consumer_group_describe(token, request, 0))
    types = {
        m.member_id: m.uses_classic_protocol for m in described.response(token).groups[0].members
    }
    assert types == {a.name: False, b.member_id: True}

    # Replay rebuilds the member with its classic metadata, and it carries on.
    ctx = ctx.failover()
    a.ctx = b.ctx = ctx
    member = ctx.shard.consumer_groups["g"].members[b.member_id]
    assert member.classic is not None and member.classic.supported_protocols[0].name == "range"
    converge(ctx, members)
    assert len(b.owned) == 3

    # Offsets: the classic member commits with its generation; a stale one is refused.
    token, step = ctx.commit([("orders", 0, 5)], member_id=b.member_id, generation_id=b.generation)
    response = step.response(token)
    assert isinstance(response, OffsetCommitResponse)
    assert response.topics[0].partitions[0].error_code is Errors.NONE
    token, step = ctx.commit(
        [("orders", 0, 6)], member_id=b.member_id, generation_id=b.generation - 1
    )
    response = step.response(token)
    assert isinstance(response, OffsetCommitResponse)
    assert response.topics[0].partitions[0].error_code is Errors.ILLEGAL_GENERATION
    # An OffsetFetch naming it with a stale generation: ILLEGAL_GENERATION as well
    # (validateMemberEpoch for a member of the classic protocol), not STALE_MEMBER_EPOCH.
    for generation, error in (
        (b.generation, Errors.NONE),
        (b.generation - 1, Errors.ILLEGAL_GENERATION),
    ):
        fetch = OffsetFetchRequest(group_id="g", member_id=b.member_id, member_epoch=generation)
        token = ctx.new_token()
        fetched: Any = ctx._apply(ctx.shard.handle_offset_fetch(token, fetch, ctx.now_ms)).response(
            token
        )
        assert fetched.error_code is error


def test_a_classic_member_that_goes_silent_is_fenced_after_its_own_session_timeout() -> None:
    ctx = context()
    a = ConsumerMember(ctx, "a")
    a.beat()
    b = ClassicMember(ctx, "b")
    b.join()
    b.sync()
    epoch = ctx.shard.consumer_groups["g"].group_epoch
    ctx.sleep(CLASSIC_SESSION_MS - 1)
    a.beat()  # a stays
    assert b.member_id in ctx.shard.consumer_groups["g"].members
    ctx.sleep(2)
    assert b.member_id not in ctx.shard.consumer_groups["g"].members
    assert ctx.shard.consumer_groups["g"].group_epoch == epoch + 1


def classic_group_of_two(
    ctx: ShardContext, protocols: tuple[tuple[str, bytes], ...] | None = None
) -> list[ClassicMember]:
    """A classic group the old way: both join, the leader assigns with the range assignor
    (``protocols``: what each offers, the range assignor first)."""
    b, c = ClassicMember(ctx, "b"), ClassicMember(ctx, "c")
    for m in (b, c):
        for _ in range(2):  # MEMBER_ID_REQUIRED, then the join that parks until both are in
            token, step = ctx.join(
                member_id=m.member_id,
                client_id=m.name,
                session_timeout_ms=CLASSIC_SESSION_MS,
                protocols=protocols or (("range", subscription()),),
            )
            if step.answered(token):
                response = step.response(token)
                assert isinstance(response, JoinGroupResponse)
                m.member_id = response.member_id
    ctx.sleep(0)
    group = ctx.shard.groups["g"]
    assert group.state is ClassicGroupState.COMPLETING_REBALANCE, group.state
    for m in (b, c):
        m.generation = group.generation_id
    half = {b.member_id: {0, 1, 2}, c.member_id: {3, 4, 5}}
    leader = b if group.leader_id == b.member_id else c
    follower = c if leader is b else b
    ctx.sync(member_id=follower.member_id, generation_id=follower.generation)
    ctx.sync(
        member_id=leader.member_id,
        generation_id=leader.generation,
        assignments=[
            (mid, encode_assignment(0, {"orders": frozenset(ps)})) for mid, ps in half.items()
        ],
    )
    for m in (b, c):
        m.owned = half[m.member_id]
    assert ctx.shard.groups["g"].state is ClassicGroupState.STABLE
    return [b, c]


def test_a_consumer_member_upgrades_a_classic_group_and_the_last_one_out_downgrades_it() -> None:
    ctx = context()
    b, c = classic_group_of_two(ctx)
    generation = b.generation

    # Upgrade: the classic members keep what they own, at member epoch = generation.
    a = ConsumerMember(ctx, "a")
    joined = a.beat()
    assert joined.error_code is Errors.NONE, joined
    assert "g" not in ctx.shard.groups
    group = ctx.shard.consumer_groups["g"]
    assert group.members[b.member_id].member_epoch == generation
    assert group.members[b.member_id].assigned == {T: frozenset(b.owned)}
    # KIP-1251: what they own is theirs since the conversion, at that epoch.
    assert group.members[b.member_id].assignment_epochs == {T: dict.fromkeys(b.owned, generation)}
    assert group.group_epoch == generation + 1  # the new member bumped it
    assert a.owned == set()  # everything is still held by b and c
    members: list[ConsumerMember | ClassicMember] = [a, b, c]
    assert b.heartbeat() is Errors.REBALANCE_IN_PROGRESS
    converge(ctx, members)
    assert sorted(len(m.owned) for m in members) == [2, 2, 2]
    assert ctx.shard.consumer_groups["g"].state == "Stable"
    ctx = ctx.failover()
    for m in members:
        m.ctx = ctx
    converge(ctx, members)

    # Downgrade: the consumer member leaves, only classic members remain.
    epoch = ctx.shard.consumer_groups["g"].group_epoch
    left = a.beat(epoch=-1)
    assert left.error_code is Errors.NONE
    a.owned = set()
    assert "g" not in ctx.shard.consumer_groups
    classic = ctx.shard.groups["g"]
    assert classic.generation_id == epoch
    assert classic.state is ClassicGroupState.PREPARING_REBALANCE
    assert classic.protocol_name == "range"
    # The members learn through their heartbeats and rejoin the classic way.
    for m in (b, c):
        assert m.heartbeat() is Errors.REBALANCE_IN_PROGRESS
    for m in (b, c):
        m.owned = set()
        ctx.join(
            member_id=m.member_id,
            client_id=m.name,
            session_timeout_ms=CLASSIC_SESSION_MS,
            protocols=(("range", subscription()),),
        )
    assert ctx.shard.groups["g"].state is ClassicGroupState.COMPLETING_REBALANCE
    assert ctx.shard.groups["g"].generation_id == epoch + 1
    # The downgraded group is durable: a failover brings it back as a classic group.
    replayed = ctx.failover()
    assert "g" in replayed.shard.groups and "g" not in replayed.shard.consumer_groups


@pytest.mark.parametrize("failover", [False, True])
def test_a_group_upgraded_again_before_its_classic_members_rejoin_gives_out_none_they_hold(
    failover: bool,
) -> None:
    """A consumer member joins a classic group and leaves before the classic members rejoin:
    the downgrade wrote each one's target (2 of its 3 partitions) as its classic assignment,
    and a second consumer member, upgrading the group again, was given at once the two
    partitions the classic members still consumed (review helper-284). Likewise after a
    failover, which loads the classic group from that record."""
    ctx = context()
    b, c = classic_group_of_two(ctx)
    a = ConsumerMember(ctx, "a")
    assert a.beat().error_code is Errors.NONE
    assert a.beat(-1).error_code is Errors.NONE  # a downgrade before b and c rejoined
    a.owned = set()
    if failover:
        ctx = ctx.failover()
        b.ctx = c.ctx = ctx
    d = ConsumerMember(ctx, "d")
    assert d.beat().error_code is Errors.NONE
    check_single_owner([b, c, d])
    members: list[ConsumerMember | ClassicMember] = [b, c, d]
    converge(ctx, members)
    check_single_owner(members)
    assert sorted(len(m.owned) for m in members) == [2, 2, 2]


def test_a_join_too_large_for_its_record_leaves_the_classic_group_as_it_was() -> None:
    """The classic group was converted (its records written, its parked requests answered)
    before the joining member's record was found too large, and the join then refused:
    Kafka writes none of a failed heartbeat's records."""
    ctx = context()
    b, _ = classic_group_of_two(ctx)
    classic = ctx.shard.groups["g"]
    ctx.max_batch_bytes = 4096
    token = ctx.new_token()
    request = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="a",
        member_epoch=0,
        rebalance_timeout_ms=5_000,
        subscribed_topic_names=tuple(f"topic-{i:05d}" for i in range(1000)),  # 11 KB
        topic_partitions=(),
    )
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, request, ctx.now_ms, TOPICS))
    refused = step.response(token)
    assert isinstance(refused, ConsumerGroupHeartbeatResponse)
    assert refused.error_code is Errors.UNKNOWN_SERVER_ERROR
    assert step.records == [] and step.responses == [(token, refused)]
    assert ctx.shard.groups["g"] is classic and "g" not in ctx.shard.consumer_groups
    assert b.heartbeat() is Errors.NONE  # its members go on as before


def padded_subscription(padding: int) -> bytes:
    """A subscription to orders with ``padding`` bytes of user data."""
    return encode_subscription(Subscription(1, ("orders",), b"u" * padding, ()))


def fits(ctx: ShardContext, step: Step) -> bool:
    """Whether a step's records are one batch the partition takes (the log's check)."""
    return ctx.shard._fit_a_batch([record for _, record in step.records])


def test_an_upgrade_whose_heartbeat_is_too_large_for_one_batch_fails_at_every_limit() -> None:
    """Converted, each classic member's record carries every protocol it offered, where the
    classic group's one record carried the chosen one; and the conversion's records fitting,
    the heartbeat's with them (the new target assignment) might not. Such writes were
    refused by the log, which reloaded the whole partition at each retry. At every limit the
    heartbeat now either succeeds with one batch the log takes, or fails alone with the
    classic group and its timers as they were (Kafka fails it and reverts)."""
    both = (("range", padded_subscription(2000)), ("roundrobin", padded_subscription(2000)))
    refusals: set[str | None] = set()
    for limit in range(6000, 11000, 50):
        ctx = context()
        b, _ = classic_group_of_two(ctx, both)
        classic = ctx.shard.groups["g"]
        timers = dict(ctx.timer.deadlines)
        ctx.max_batch_bytes = limit
        token = ctx.new_token()
        request = ConsumerGroupHeartbeatRequest(
            group_id="g",
            member_id="a",
            member_epoch=0,
            rebalance_timeout_ms=5_000,
            subscribed_topic_names=("orders",),
            topic_partitions=(),
        )
        step = ctx._apply(
            ctx.shard.handle_consumer_group_heartbeat(token, request, ctx.now_ms, TOPICS)
        )
        answer = step.response(token)
        assert isinstance(answer, ConsumerGroupHeartbeatResponse)
        if answer.error_code is Errors.NONE:
            assert fits(ctx, step), limit
            assert "g" in ctx.shard.consumer_groups and "g" not in ctx.shard.groups
            continue
        assert answer.error_code is Errors.UNKNOWN_SERVER_ERROR, (limit, answer)
        refusals.add(answer.error_message)
        assert step.records == [] and step.responses == [(token, answer)], limit
        assert ctx.shard.groups["g"] is classic and "g" not in ctx.shard.consumer_groups
        assert ctx.timer.deadlines == timers, limit  # the classic group's, as they were
        assert b.heartbeat() is Errors.NONE  # its members go on as before
    # Both checks were reached: the conversion's own, and the whole heartbeat's.
    assert refusals == {GROUP_TOO_LARGE_TO_CONVERT, HEARTBEAT_RECORDS_TOO_LARGE}


def classic_members_in_a_consumer_group(ctx: ShardContext, padding: int) -> ConsumerMember:
    """A consumer group of member a, and classic members b and c offering ``padding`` bytes
    of user data each (joined with their first JoinGroup, as before KIP-394); returns a."""
    a = ConsumerMember(ctx, "a")
    assert a.beat().error_code is Errors.NONE
    for name in ("b", "c"):
        response, step = classic_join(ctx, name, padding)
        assert response.error_code is Errors.NONE, response
        assert fits(ctx, step)
    return a


def classic_join(ctx: ShardContext, client_id: str, padding: int) -> tuple[JoinGroupResponse, Step]:
    """A classic member's first JoinGroup (no KIP-394 round trip) into the consumer group,
    offering ``padding`` bytes of user data."""
    token, step = ctx.join(
        client_id=client_id,
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=(("range", padded_subscription(padding)),),
        require_known_member_id=False,
        topics=TOPICS,
    )
    response = step.response(token)
    assert isinstance(response, JoinGroupResponse)
    return response, step


def test_a_downgrade_too_large_for_one_batch_removes_the_member_instead() -> None:
    """The last consumer-protocol member leaving made one classic GroupMetadata record of
    every classic member's metadata, each member's fitting, together not: the refused write
    reloaded the whole partition, and the departed member's session timer, armed again by
    the reload, wrote it again for ever. It is removed as from any consumer group now."""
    ctx = context()
    classic_members_in_a_consumer_group(ctx, 3000)
    ctx.max_batch_bytes = 5000  # each classic member's record fits, not both in one
    token = ctx.new_token()
    request = ConsumerGroupHeartbeatRequest(group_id="g", member_id="a", member_epoch=-1)
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, request, ctx.now_ms, TOPICS))
    left = step.response(token)
    assert isinstance(left, ConsumerGroupHeartbeatResponse) and left.error_code is Errors.NONE
    assert fits(ctx, step)
    assert "g" not in ctx.shard.groups
    assert set(ctx.shard.consumer_groups["g"].members) == {"b-1", "c-2"}


def test_a_classic_join_too_large_for_its_record_fails_alone_in_a_consumer_group() -> None:
    """A classic member's record is looked at before the consumer group changes: one too
    large (a megabyte of metadata), or whose member id made from a client id of 32,767 bytes
    no record can carry, was written after it had, and the refused write reloaded the whole
    partition."""
    ctx = context()
    ConsumerMember(ctx, "a").beat()
    ctx.max_batch_bytes = 4096
    group = ctx.shard.consumer_groups["g"]
    for client_id, padding in (("big", 5000), ("c" * 32767, 0)):
        refused, step = classic_join(ctx, client_id, padding)
        assert refused.error_code is Errors.UNKNOWN_SERVER_ERROR, refused
        assert step.records == []
        assert ctx.shard.consumer_groups["g"] is group and set(group.members) == {"a"}


def test_conversions_and_classic_requests_get_kafkas_errors() -> None:
    ctx = context()
    # A classic group of another protocol type is not upgraded.
    ctx.join(client_id="x", protocol_type="connect", require_known_member_id=False)
    ctx.sleep(0)
    a = ConsumerMember(ctx, "a")
    refused = a.beat()
    assert refused.error_code is Errors.GROUP_ID_NOT_FOUND
    assert refused.error_message and "not using the consumer protocol" in refused.error_message
    assert "g" in ctx.shard.groups and "g" not in ctx.shard.consumer_groups

    # With the policy off, a consumer-protocol group is not upgraded either.
    ctx = ShardContext(
        GroupConfig(initial_rebalance_delay_ms=0, consumer_migration_policy="disabled")
    )
    classic_group_of_two(ctx)
    refused = ConsumerMember(ctx, "a").beat()
    assert refused.error_code is Errors.GROUP_ID_NOT_FOUND

    # Classic requests to a consumer group.
    ctx = context()
    a = ConsumerMember(ctx, "a")
    a.beat()
    other = ClassicMember(ctx, "o")
    assert other.join(protocol_type="connect").error_code is Errors.INCONSISTENT_GROUP_PROTOCOL
    b = ClassicMember(ctx, "b")
    b.join()
    b.generation -= 1
    assert b.sync().error_code is Errors.ILLEGAL_GENERATION
    assert b.heartbeat() is Errors.ILLEGAL_GENERATION
    # A consumer-protocol member is not a classic one.
    token, step = ctx.heartbeat(member_id="a", generation_id=a.epoch)
    response = step.response(token)
    assert isinstance(response, HeartbeatResponse)
    assert response.error_code is Errors.UNKNOWN_MEMBER_ID
    # LeaveGroup removes the classic member (and bumps the group epoch).
    epoch = ctx.shard.consumer_groups["g"].group_epoch
    token, step = ctx.leave([(b.member_id, None), ("nobody", None)])
    response = step.response(token)
    assert isinstance(response, LeaveGroupResponse)
    assert [m.error_code for m in response.members] == [Errors.NONE, Errors.UNKNOWN_MEMBER_ID]
    assert b.member_id not in ctx.shard.consumer_groups["g"].members
    assert ctx.shard.consumer_groups["g"].group_epoch == epoch + 1


def static_classic_join(ctx: ShardContext, instance_id: str, client_id: str) -> JoinGroupResponse:
    """A classic static member's JoinGroup (no MEMBER_ID_REQUIRED round for static members)."""
    token, step = ctx.join(
        instance_id=instance_id,
        client_id=client_id,
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=(("range", subscription()),),
        topics=TOPICS,
    )
    response = step.response(token)
    assert isinstance(response, JoinGroupResponse)
    return response


def test_a_static_classic_member_restarted_with_the_consumer_protocol_takes_its_place() -> None:
    ctx = context()
    a = ConsumerMember(ctx, "a")
    a.beat()
    old = static_classic_join(ctx, "i-1", "old")
    assert old.error_code is Errors.NONE
    response = ConsumerMember(ctx, "new", instance_id="i-1").beat()
    assert response.error_code is Errors.NONE, response  # not UNRELEASED_INSTANCE_ID
    members = ctx.shard.consumer_groups["g"].members
    assert old.member_id not in members and members["new"].classic is None
    assert not [k for k in ctx.shard.scheduled_timers if old.member_id in k]


def static_consumer_and_classic_member() -> tuple[ShardContext, ConsumerMember, ClassicMember]:
    """A group of static consumer-protocol member a (instance i-a) and classic member b,
    converged."""
    ctx = context()
    a = ConsumerMember(ctx, "a", instance_id="i-a")
    assert a.beat().error_code is Errors.NONE
    b = ClassicMember(ctx, "b")
    assert b.join().error_code is Errors.NONE
    assert b.sync().error_code is Errors.NONE
    converge(ctx, [a, b])
    return ctx, a, b


def test_the_last_consumer_static_member_restarted_as_classic_downgrades_without_a_rebalance() -> (
    None
):
    """Kafka's validateOnlineDowngradeWithReplacedMember: a static member of the consumer
    protocol comes back as a classic client with the same instance id; it was the group's last
    consumer-protocol member, so the group becomes a classic group at once, Stable, the new
    incarnation holding what the old one was given, and the other members see no rebalance."""
    ctx, a, b = static_consumer_and_classic_member()
    members: list[ConsumerMember | ClassicMember] = [a, b]
    assert sorted(len(m.owned) for m in members) == [3, 3]
    a_target = set(a.owned)
    epoch = ctx.shard.consumer_groups["g"].group_epoch

    # a's process restarts as a classic client (static: no MEMBER_ID_REQUIRED round).
    joined = static_classic_join(ctx, "i-a", "a2")
    assert joined.error_code is Errors.NONE, joined
    assert "g" not in ctx.shard.consumer_groups
    classic = ctx.shard.groups["g"]
    assert classic.state is ClassicGroupState.STABLE
    assert classic.generation_id == epoch == joined.generation_id
    assert set(classic.members) == {joined.member_id, b.member_id}
    a2 = ClassicMember(ctx, "a2")
    a2.member_id, a2.generation = joined.member_id, joined.generation_id
    assert a2.sync().error_code is Errors.NONE
    assert a2.owned == a_target
    b.generation = classic.generation_id  # b's member epoch was the group epoch
    assert b.heartbeat() is Errors.NONE  # no rebalance for b
    check_single_owner([a2, b])
    # Durable: a failover brings back the same classic group.
    replayed = ctx.failover()
    assert "g" not in replayed.shard.consumer_groups
    assert set(replayed.shard.groups["g"].members) == {joined.member_id, b.member_id}


def test_a_static_replacement_downgrading_a_group_not_yet_reconciled_rebalances_it() -> None:
    """Static consumer member a owns every partition and leaves for a restart (epoch -2,
    keeping its assignment); classic member b joins and is given half, still held by a, so it
    owns nothing yet. a comes back as a classic client: the group became a classic group
    Stable at b's generation, with b's target as its assignment, which b's SyncGroup had
    already answered empty; its heartbeats went on NONE and its partitions were consumed by
    nobody until some other rebalance. A group not reconciled is rebalanced at the downgrade
    (Kafka's convertToClassicGroup rebalances only on a new subscription, and has this hole)."""
    ctx = context()
    a = ConsumerMember(ctx, "a", instance_id="i-a")
    a.beat()
    a.beat()
    assert a.owned == set(range(6))
    assert a.beat(epoch=-2).error_code is Errors.NONE
    b = ClassicMember(ctx, "b")
    assert b.join().error_code is Errors.NONE
    assert b.sync().error_code is Errors.NONE
    assert b.owned == set()
    member = ctx.shard.consumer_groups["g"].members[b.member_id]
    assert member.state is MemberState.UNRELEASED_PARTITIONS
    joined = static_classic_join(ctx, "i-a", "a2")
    assert joined.error_code is Errors.NONE, joined
    assert "g" not in ctx.shard.consumer_groups
    assert ctx.shard.groups["g"].state is ClassicGroupState.PREPARING_REBALANCE
    a2 = ClassicMember(ctx, "a2")
    a2.member_id = joined.member_id
    members: list[ConsumerMember | ClassicMember] = [a2, b]
    # b learns of the rebalance and rejoins; a2 rejoins too, and the join phase completes.
    assert b.heartbeat() is Errors.REBALANCE_IN_PROGRESS
    token_b, step_b = ctx.join(
        member_id=b.member_id,
        client_id="b",
        session_timeout_ms=CLASSIC_SESSION_MS,
        rebalance_timeout_ms=6_000,
        protocols=(("range", subscription()),),
        topics=TOPICS,
    )
    token_a, step_a = ctx.join(
        member_id=a2.member_id,
        instance_id="i-a",
        client_id="a2",
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=(("range", subscription()),),
        topics=TOPICS,
    )
    steps = [step_b, step_a, *(step for _, _, step in ctx.sleep(1))]
    joins = {t: st.response(t) for t in (token_a, token_b) for st in steps if st.answered(t)}
    assert len(joins) == 2, joins
    answered = [r for r in joins.values() if isinstance(r, JoinGroupResponse)]
    leader = next(r for r in answered if r.leader == r.member_id)
    halves = {b.member_id: frozenset({0, 1, 2}), a2.member_id: frozenset({3, 4, 5})}
    assignments = tuple((m, encode_assignment(1, {"orders": ps})) for m, ps in halves.items())
    token, step = ctx.sync(
        member_id=leader.member_id, generation_id=leader.generation_id, assignments=assignments
    )
    synced = step.response(token)
    assert isinstance(synced, SyncGroupResponse) and synced.error_code is Errors.NONE
    for m in (a2, b):
        m.generation = leader.generation_id
        assert m.sync().error_code is Errors.NONE
    assert set().union(*(m.owned for m in members)) == set(range(6))
    check_single_owner(members)


def test_refused_requests_leave_the_groups_as_they_were() -> None:
    # A join refused for the group's size does not convert the classic group: full at the
    # maximum; larger than a consumer group may be, not converted (validateOnlineUpgrade).
    for max_size, error in ((2, Errors.GROUP_MAX_SIZE_REACHED), (1, Errors.GROUP_ID_NOT_FOUND)):
        ctx = ShardContext(GroupConfig(initial_rebalance_delay_ms=0, consumer_max_size=max_size))
        classic_group_of_two(ctx)
        assert ConsumerMember(ctx, "a").beat().error_code is error
        assert ctx.shard.groups["g"].state is ClassicGroupState.STABLE
        assert "g" not in ctx.shard.consumer_groups

    # A consumer-protocol leave or heartbeat to a group that only has offsets deletes nothing.
    ctx = context()
    ctx.commit([("orders", 0, 5)])
    for epoch in (-1, 3):
        response = ConsumerMember(ctx, "a").beat(epoch=epoch)
        assert response.error_code is Errors.GROUP_ID_NOT_FOUND, (epoch, response)
    assert "g" in ctx.shard.groups and ctx.shard.offsets["g"]

    # A classic JoinGroup with a member id for an empty consumer group changes nothing.
    ctx = context()
    a = ConsumerMember(ctx, "a")
    a.beat()
    a.beat(epoch=-1)
    assert not ctx.shard.consumer_groups["g"].members
    stale = ClassicMember(ctx, "b")
    stale.member_id = "gone"
    assert stale.join().error_code is Errors.UNKNOWN_MEMBER_ID
    assert "g" in ctx.shard.consumer_groups and "g" not in ctx.shard.groups


def test_an_eager_member_that_owns_nothing_skips_the_revocation_step() -> None:
    # ownsRevokedPartitions: b rejoins owning nothing, so it need not revoke before moving on.
    ctx = context()
    b, _ = classic_group_of_two(ctx)
    a = ConsumerMember(ctx, "a")
    a.beat()  # the upgrade: b and c keep 3 partitions each, a's share must come from them
    assert b.heartbeat() is Errors.REBALANCE_IN_PROGRESS
    assert b.join().error_code is Errors.NONE
    member = ctx.shard.consumer_groups["g"].members[b.member_id]
    assert member.state is MemberState.STABLE, member.state
    assert member.member_epoch == ctx.shard.consumer_groups["g"].group_epoch
    assert len(member.assigned[T]) == 2


def test_an_upgrade_mid_rebalance_leaves_a_cooperative_members_partitions_to_it() -> None:
    """A cooperative classic member owns 0-5 and rejoins still owning them; the other joiner
    leaves, the group goes back to PreparingRebalance and the stored assignments are cleared.
    A consumer-protocol member converting the group then: the classic member was taken to own
    nothing, and the newcomer was given 3-5 while it still consumed them. What its last join
    said it owns now counts as held."""
    ctx = context()

    def join(member_id: str, owned: frozenset[int]) -> tuple[Any, Any]:
        return ctx.join(
            member_id=member_id,
            client_id="c",
            session_timeout_ms=CLASSIC_SESSION_MS,
            rebalance_timeout_ms=6_000,
            protocols=(("cooperative-sticky", subscription(owned)),),
            topics=TOPICS,
        )

    token, step = join("", frozenset())
    c1 = step.response(token).member_id
    join(c1, frozenset())
    ctx.sleep(1)  # the join completes: generation 1
    everything = frozenset(range(6))
    assignment = encode_assignment(1, {"orders": everything})
    token, step = ctx.sync(member_id=c1, generation_id=1, assignments=((c1, assignment),))
    synced = step.response(token)
    assert isinstance(synced, SyncGroupResponse) and synced.error_code is Errors.NONE
    token, step = join("", frozenset())
    c2 = step.response(token).member_id
    join(c2, frozenset())
    join(c1, everything)  # cooperative: it keeps consuming 0-5 meanwhile
    ctx.leave(((c2, None),))
    k = ConsumerMember(ctx, "k")
    k.beat()
    for _ in range(3):
        k.beat()
        assert not k.owned & everything, k.owned


def test_a_classic_join_replacing_an_empty_consumer_group_keeps_its_pending_member() -> None:
    """The consumer group is empty, so the first classic JoinGroup (KIP-394: MEMBER_ID_REQUIRED)
    replaces it: replaying the consumer group's tombstones must not take the classic group
    the join made with it, or the join with the given member id is UNKNOWN_MEMBER_ID."""
    ctx = context()
    c = ConsumerMember(ctx, "c")
    c.beat()
    c.beat()
    leave = ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="c", member_epoch=-1, topic_partitions=()
    )
    ctx._apply(
        ctx.shard.handle_consumer_group_heartbeat(ctx.new_token(), leave, ctx.now_ms, TOPICS)
    )
    assert not ctx.shard.consumer_groups["g"].members
    protocols = (("range", subscription()),)
    token, step = ctx.join(member_id="", client_id="k", protocols=protocols, topics=TOPICS)
    first = step.response(token)
    assert isinstance(first, JoinGroupResponse)
    assert first.error_code is Errors.MEMBER_ID_REQUIRED
    assert "g" not in ctx.shard.consumer_groups
    token, step = ctx.join(
        member_id=first.member_id, client_id="k", protocols=protocols, topics=TOPICS
    )
    assert not step.answered(token)  # parked for the join phase, as in a fresh group
    answers = [s.response(token) for _, _, s in ctx.sleep(1) if s.answered(token)]
    assert len(answers) == 1, answers
    joined = answers[0]
    assert isinstance(joined, JoinGroupResponse)
    assert (joined.error_code, joined.member_id) == (Errors.NONE, first.member_id)


def test_a_static_member_restarted_as_classic_with_other_topics_downgrades_with_a_rebalance() -> (
    None
):
    """convertToClassicGroup(hasSubscriptionChanged): the classic incarnation subscribes to
    more than the member it replaces, so the downgraded group rebalances for the others to
    learn it; a stable classic group at the old generation left the new subscription unused
    until the member happened to rejoin."""
    ctx, _a, b = static_consumer_and_classic_member()
    payments = uuid_str(bytes([8]) * 16)
    topics = {**TOPICS, "payments": (payments, 4)}
    more = encode_subscription(Subscription(1, ("orders", "payments"), None, ()))
    token, step = ctx.join(
        instance_id="i-a",
        client_id="a2",
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=(("range", more),),
        topics=topics,
    )
    joined = step.response(token)
    assert isinstance(joined, JoinGroupResponse) and joined.error_code is Errors.NONE
    assert "g" not in ctx.shard.consumer_groups
    classic = ctx.shard.groups["g"]
    assert classic.state is ClassicGroupState.PREPARING_REBALANCE
    assert b.heartbeat() is Errors.REBALANCE_IN_PROGRESS
    # The answer names the classic group's generation, not the epoch the join's records
    # bumped before the conversion dropped them: a SyncGroup at it was ILLEGAL_GENERATION.
    assert joined.generation_id == classic.generation_id
    token, step = ctx.sync(
        member_id=joined.member_id, generation_id=joined.generation_id, instance_id="i-a"
    )
    synced = step.response(token)
    assert isinstance(synced, SyncGroupResponse)
    assert synced.error_code is Errors.REBALANCE_IN_PROGRESS


def test_a_classic_group_replaced_while_empty_takes_its_join_timer_with_it() -> None:
    """A classic group whose only member left during its initial rebalance is empty but
    still PreparingRebalance, its delayed join armed. A consumer member replaced it without
    cancelling that timer, which later fired into a new classic group of the same id and
    raised out of on_timer (the runtime then reloads the whole shard)."""
    ctx = ShardContext(
        GroupConfig(
            consumer_timing=short_consumer_timing(SESSION_MS), initial_rebalance_delay_ms=3_000
        )
    )
    token, step = ctx.join(
        member_id="",
        client_id="a",
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=(("range", subscription()),),
        require_known_member_id=False,
        topics=TOPICS,
    )
    (a,) = ctx.shard.groups["g"].members
    ctx.leave([(a, None)])
    assert ctx.shard.groups["g"].state is ClassicGroupState.PREPARING_REBALANCE
    c = ConsumerMember(ctx, "c")
    assert c.beat().error_code is Errors.NONE
    assert "g" not in ctx.shard.groups
    assert not [k for k in ctx.shard.scheduled_timers if k.startswith("join/")]
    assert c.beat(-1).error_code is Errors.NONE
    token, step = ctx.join(
        member_id="", client_id="k", protocols=(("range", subscription()),), topics=TOPICS
    )
    response = step.response(token)
    assert isinstance(response, JoinGroupResponse)
    assert response.error_code is Errors.MEMBER_ID_REQUIRED
    ctx.sleep(3_000)  # the old join timer's time: nothing of it is left to fire
    replaced = ctx.shard.groups["g"]  # a new group, Empty with its pending member
    assert replaced.state is ClassicGroupState.EMPTY


def _cooperative_join(ctx: ShardContext, member_id: str, name: str, owned: set[int]) -> Any:
    protocols = (("cooperative-sticky", subscription(frozenset(owned))),)
    for _ in range(2):
        token, step = ctx.join(
            member_id=member_id,
            client_id=name,
            session_timeout_ms=CLASSIC_SESSION_MS,
            rebalance_timeout_ms=6_000,
            protocols=protocols,
            topics=TOPICS,
        )
        response = step.response(token)
        assert isinstance(response, JoinGroupResponse)
        if response.error_code is not Errors.MEMBER_ID_REQUIRED:
            return response
        member_id = response.member_id
    raise AssertionError("no member id")


def _sync(ctx: ShardContext, member_id: str, generation: int) -> set[int]:
    token, step = ctx.sync(member_id=member_id, generation_id=generation)
    response = step.response(token)
    assert isinstance(response, SyncGroupResponse) and response.error_code is Errors.NONE
    return {p for _, ps in decode_assignment(response.assignment).partitions for p in ps}


def test_an_upgrade_right_after_a_downgrade_gives_each_partition_one_owner() -> None:
    """X (cooperative classic) rejoins owing Y a partition; before its SyncGroup the last
    consumer member leaves (a downgrade: Y's classic assignment is its target, with that
    partition) and another joins (an upgrade). X's join still claimed the partition, and
    the upgrade added the claims to the SyncGroup assignments: X and Y both held it."""
    ctx = context()
    a = ConsumerMember(ctx, "a")
    a.beat()
    x = _cooperative_join(ctx, "", "x", set())
    x_id, x_generation = x.member_id, x.generation_id
    x_owned = _sync(ctx, x_id, x_generation)
    for _ in range(4):  # converge: three partitions each
        a.beat()
        token, step = ctx.heartbeat(member_id=x_id, generation_id=x_generation)
        heartbeat = step.response(token)
        assert isinstance(heartbeat, HeartbeatResponse)
        if heartbeat.error_code is Errors.REBALANCE_IN_PROGRESS:
            x_generation = _cooperative_join(ctx, x_id, "x", x_owned).generation_id
            x_owned = _sync(ctx, x_id, x_generation)
    assert len(x_owned) == 3
    y = _cooperative_join(ctx, "", "y", set())
    _sync(ctx, y.member_id, y.generation_id)
    _cooperative_join(ctx, x_id, "x", x_owned)  # still owns its three; no SyncGroup yet
    a.beat(-1)  # the last consumer member leaves: downgraded
    assert "g" in ctx.shard.groups
    ConsumerMember(ctx, "d").beat()  # upgraded again
    group = ctx.shard.consumer_groups["g"]
    holders: dict[int, list[str]] = {}
    for member in group.members.values():
        for held in (member.assigned, member.pending_revocation):
            for p in held.get(T, ()):
                holders.setdefault(p, []).append(member.member_id)
    assert all(len(owners) == 1 for owners in holders.values()), holders


@pytest.mark.parametrize(
    ("policy", "error"),
    [("disabled", Errors.GROUP_ID_NOT_FOUND), ("bidirectional", Errors.GROUP_MAX_SIZE_REACHED)],
)
def test_a_full_classic_group_is_refused_for_why_it_is_not_converted_first(
    policy: str, error: Errors
) -> None:
    """validateOnlineUpgrade comes before throwIfConsumerGroupIsFull: a group of exactly the
    consumer maximum that would not be converted anyway got GROUP_MAX_SIZE_REACHED."""
    ctx = ShardContext(
        GroupConfig(
            consumer_timing=short_consumer_timing(SESSION_MS),
            initial_rebalance_delay_ms=0,
            consumer_max_size=2,
            consumer_migration_policy=policy,
        )
    )
    classic_group_of_two(ctx)
    assert ConsumerMember(ctx, "a").beat().error_code is error
    assert ctx.shard.groups["g"].state is ClassicGroupState.STABLE  # left as it was


def test_a_classic_join_without_an_instance_id_keeps_the_members_own() -> None:
    """maybeUpdateInstanceId: a static classic member's JoinGroup without group.instance.id
    made it dynamic, and its next restart added a second member instead of replacing it."""
    ctx = context()
    ConsumerMember(ctx, "a").beat()
    protocols = (("range", subscription()),)
    token, step = ctx.join(
        instance_id="i-s",
        client_id="s",
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=protocols,
        topics=TOPICS,
    )
    joined = step.response(token)
    assert isinstance(joined, JoinGroupResponse)
    token, step = ctx.join(
        member_id=joined.member_id,
        client_id="s",
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=protocols,
        topics=TOPICS,
    )
    again = step.response(token)
    assert isinstance(again, JoinGroupResponse) and again.error_code is Errors.NONE
    assert ctx.shard.consumer_groups["g"].members[joined.member_id].instance_id == "i-s"


def test_changing_only_the_server_assignor_does_not_rebalance_the_group() -> None:
    """hasMemberSubscriptionChanged bumps the group epoch for topic names and regex only."""
    ctx = context()
    a = ConsumerMember(ctx, "a")
    a.beat()
    epoch = ctx.shard.consumer_groups["g"].group_epoch
    request = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="a",
        member_epoch=a.epoch,
        server_assignor="range",
        topic_partitions=None,
    )
    step = ctx._apply(
        ctx.shard.handle_consumer_group_heartbeat(ctx.new_token(), request, ctx.now_ms, TOPICS)
    )
    assert step is not None
    group = ctx.shard.consumer_groups["g"]
    assert group.group_epoch == epoch
    assert group.members["a"].server_assignor == "range"


def test_a_static_member_replaced_while_upgrading_keeps_its_partitions_assignment_epochs() -> None:
    """The heartbeat that converts a classic group can replace a static member of it (the same
    instance id, restarted with the consumer protocol) and move it to a new epoch (its
    subscription grew) in one step, before the conversion's records are replayed: what the
    member owned stays its own since the conversion's epoch (KIP-1251), where the converted
    member held no epochs in memory and every partition took the new one."""
    ctx = context()
    token, step = ctx.join(
        instance_id="i-b",
        client_id="b",
        session_timeout_ms=CLASSIC_SESSION_MS,
        protocols=(("range", subscription()),),
    )
    ctx.sleep(0)
    joined = ctx.shard.groups["g"]
    member_id, generation = joined.leader_id, joined.generation_id
    assert member_id is not None
    ctx.sync(
        member_id=member_id,
        generation_id=generation,
        instance_id="i-b",
        assignments=[(member_id, encode_assignment(0, {"orders": frozenset(range(6))}))],
    )
    assert ctx.shard.groups["g"].state is ClassicGroupState.STABLE
    other = "BBBBBBBBBBBBBBBBBBBBBA"
    request = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="new",
        member_epoch=0,
        instance_id="i-b",
        rebalance_timeout_ms=5_000,
        subscribed_topic_names=("orders", "other"),
        topic_partitions=(),
        client_id="b",
    )
    token = ctx.new_token()
    topics = {**TOPICS, "other": (other, 2)}
    step = ctx._apply(ctx.shard.handle_consumer_group_heartbeat(token, request, ctx.now_ms, topics))
    response = step.response(token)
    assert isinstance(response, ConsumerGroupHeartbeatResponse)
    assert response.error_code is Errors.NONE, response
    assert response.member_epoch > generation
    member = ctx.shard.consumer_groups["g"].members["new"]
    assert member.assignment_epochs == {
        T: dict.fromkeys(range(6), generation),
        other: dict.fromkeys(range(2), response.member_epoch),
    }
