"""A test context for the group coordinator shard (like Kafka's GroupMetadataManagerTestContext).

``ShardContext`` owns a shard, a mock clock and timer, and a log. It plays the runtime: every
result's records are appended to the log and replayed into the shard at once, and every answer
is checked against the tokens still waiting (a token answered twice, or one never sent, fails
the test). After every step it checks the invariants that must hold between steps:

* a group's generation never goes down;
* a Stable group is exactly its last GroupMetadata record (generation, protocol, leader,
  members and their assignments), and an Empty group is too (timestamp included);

``sleep(ms)`` moves the clock, firing the due timers in deadline order. ``failover()`` builds a
new context whose shard is loaded from this log only, as a new partition leader's would be.

The ``format_*`` functions print records, responses and groups deterministically for the
scenario files.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kcoord.cluster.coordinator.classic import (
    ClassicGroup,
    ClassicGroupState,
    parse_subscribed_topics,
)
from kcoord.cluster.coordinator.group_config import GroupConfigBounds
from kcoord.cluster.coordinator.records import (
    ConsumerGroupCurrentMemberAssignmentValue,
    CoordinatorRecord,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
)
from kcoord.cluster.coordinator.shard import CoordinatorResult, GroupConfig, GroupCoordinatorShard
from kcoord.cluster.coordinator.types import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    ListGroupsRequest,
    MemberIdentity,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    Response,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
    Token,
)


class MockTimer:
    """The runtime's timer: one deadline per key; due keys come out in deadline order."""

    def __init__(self) -> None:
        self.deadlines: dict[str, tuple[int, int]] = {}  # key -> (deadline, schedule sequence)
        self._sequence = 0

    def schedule(self, key: str, deadline_ms: int) -> None:
        self._sequence += 1
        self.deadlines[key] = (deadline_ms, self._sequence)

    def cancel(self, key: str) -> None:
        self.deadlines.pop(key, None)

    def pop_due(self, now_ms: int) -> tuple[str, int] | None:
        """The earliest (key, deadline) due at ``now_ms``, removed; ties in schedule order."""
        due = [(d, seq, key) for key, (d, seq) in self.deadlines.items() if d <= now_ms]
        if not due:
            return None
        deadline, _, key = min(due)
        del self.deadlines[key]
        return key, deadline


def consumer_subscription(topics: Iterable[str], user_data: bytes | None = None) -> bytes:
    """A ConsumerProtocolSubscription v0: version | topics | user data."""
    topic_list = list(topics)
    out = struct.pack(">hi", 0, len(topic_list))
    for topic in topic_list:
        raw = topic.encode()
        out += struct.pack(">h", len(raw)) + raw
    if user_data is None:
        return out + struct.pack(">i", -1)
    return out + struct.pack(">i", len(user_data)) + user_data


@dataclass(frozen=True, slots=True)
class PersistedGroup:
    """What a GroupMetadata record says about a group (its durable part)."""

    generation: int
    protocol_type: str
    protocol: str | None
    leader: str | None
    members: tuple[MemberMetadata, ...]
    current_state_timestamp_ms: int | None = None


def persisted_view_of_record(
    value: GroupMetadataValue | None, *, with_timestamp: bool
) -> PersistedGroup:
    if value is None:  # a simple group, created by an offset commit
        return PersistedGroup(0, "", None, None, (), -1 if with_timestamp else None)
    return PersistedGroup(
        generation=value.generation,
        protocol_type=value.protocol_type,
        protocol=value.protocol,
        leader=value.leader,
        members=value.members,
        current_state_timestamp_ms=value.current_state_timestamp_ms if with_timestamp else None,
    )


def persisted_view_of_group(group: ClassicGroup, *, with_timestamp: bool) -> PersistedGroup:
    """The record the live group would write now (assignments as they are)."""
    value = group.to_group_metadata_value(
        {m.member_id: m.assignment for m in group.members.values()}
    )
    return persisted_view_of_record(value, with_timestamp=with_timestamp)


def check_settled_group(group: ClassicGroup) -> None:
    """A Stable or Empty group is exactly its last record (see the module docstring)."""
    if group.state is ClassicGroupState.STABLE:
        assert group.committed is not None, f"Stable group {group.group_id} without a record"
        live = persisted_view_of_group(group, with_timestamp=False)
        assert live == persisted_view_of_record(group.committed, with_timestamp=False), (
            f"Stable group {group.group_id}: live {live} != committed {group.committed}"
        )
    elif group.state is ClassicGroupState.EMPTY:
        live = persisted_view_of_group(group, with_timestamp=True)
        assert live == persisted_view_of_record(group.committed, with_timestamp=True), (
            f"Empty group {group.group_id}: live {live} != committed {group.committed}"
        )


@dataclass
class Step:
    """One call's outcome: the records it wrote (with their log offsets) and its answers."""

    records: list[tuple[int, CoordinatorRecord]] = field(default_factory=list)
    responses: list[tuple[Token, Response]] = field(default_factory=list)

    def response(self, token: Token) -> Response:
        matches = [r for t, r in self.responses if t == token]
        assert len(matches) == 1, f"expected one answer for {token!r}, got {matches}"
        return matches[0]

    def answered(self, token: Token) -> bool:
        return any(t == token for t, _ in self.responses)


def short_consumer_timing(
    session_timeout_ms: int, heartbeat_interval_ms: int = 500
) -> GroupConfigBounds:
    """A node's KIP-848 timing shorter than Kafka's: these values, the min bounds down to them."""
    return GroupConfigBounds(
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        min_session_timeout_ms=session_timeout_ms,
        min_heartbeat_interval_ms=heartbeat_interval_ms,
    )


class ShardContext:
    """A shard with a mock clock, a timer and a log (see the module docstring)."""

    def __init__(
        self,
        config: GroupConfig | None = None,
        *,
        now_ms: int = 0,
        log: Iterable[CoordinatorRecord] = (),
        next_member_number: int = 1,
        next_token: int = 1,
        group_configs: Mapping[str, Mapping[str, str]] | None = None,
        max_batch_bytes: int | None = None,
    ) -> None:
        """``group_configs``: group id -> its dynamic configs, as the metadata image has them
        (the test may change them as it goes). ``max_batch_bytes``: the partition's
        ``max.message.bytes`` (None: no bound; the test may change it as it goes)."""
        self.max_batch_bytes = max_batch_bytes
        self.config = config if config is not None else GroupConfig()
        self.group_configs = dict(group_configs or {})
        self.now_ms = now_ms
        self.timer = MockTimer()
        self.log: list[CoordinatorRecord] = []
        self.outstanding: set[Token] = set()
        self._next_member_number = next_member_number
        self._next_token = next_token
        self.shard = GroupCoordinatorShard(
            self.config,
            self.timer,
            self._new_member_id,
            group_configs=lambda group_id: self.group_configs.get(group_id, {}),
            max_batch_bytes=self._max_batch_bytes,
        )
        for record in log:
            self.shard.replay(len(self.log), record)
            self.log.append(record)
        self._generations: dict[str, int] = {}
        self.loaded = self._apply(self.shard.on_loaded(self.now_ms))

    # ----------------------------------------------------------------------------------------
    # Runtime

    def _max_batch_bytes(self) -> int:
        return self.max_batch_bytes if self.max_batch_bytes is not None else 1 << 31

    def _new_member_id(self, prefix: str) -> str:
        member_id = f"{prefix}-{self._next_member_number}"
        self._next_member_number += 1
        return member_id

    def new_token(self) -> int:
        token = self._next_token
        self._next_token += 1
        self.outstanding.add(token)
        return token

    def _apply(self, result: CoordinatorResult) -> Step:
        step = Step()
        for record in result.records:
            offset = len(self.log)
            self.log.append(record)
            self.shard.replay(offset, record)
            step.records.append((offset, record))
        for token, response in result.responses:
            assert token in self.outstanding, f"token {token!r} answered twice or never sent"
            self.outstanding.discard(token)
            step.responses.append((token, response))
        self.check_invariants()
        return step

    def check_invariants(self) -> None:
        for group_id, group in self.shard.groups.items():
            previous = self._generations.get(group_id)
            if previous is not None and group.state is not ClassicGroupState.DEAD:
                assert group.generation_id >= previous, (
                    f"group {group_id}: generation went from {previous} to {group.generation_id}"
                )
            self._generations[group_id] = group.generation_id
            check_settled_group(group)
        for group_id in list(self._generations):
            if group_id not in self.shard.groups:
                # Deleted: a new group of the same id starts again from generation 0.
                del self._generations[group_id]

    def sleep(self, ms: int) -> list[tuple[str, int, Step]]:
        """Advance the clock by ``ms``, firing due timers; returns (key, deadline, step)."""
        target = self.now_ms + ms
        fired = []
        while (due := self.timer.pop_due(target)) is not None:
            key, deadline = due
            self.now_ms = max(self.now_ms, deadline)
            fired.append((key, deadline, self._apply(self.shard.on_timer(key, self.now_ms))))
        self.now_ms = target
        return fired

    def unload(self) -> Step:
        return self._apply(self.shard.on_unloaded(self.now_ms))

    def failover(
        self, *, compacted: bool = False, skip: Collection[int] = (), older_writer: bool = False
    ) -> ShardContext:
        """A new context loaded from this log alone (this shard's parked requests are lost);
        ``compacted``: from the last record of each key only, in log order, as the cleaner
        leaves a compacted log (tombstones kept); ``skip``: the offsets of records the load
        does not see, as a cold load flushing in stretches or a standby after a cleaner pass
        replays a record of a key and then a later one, without those between;
        ``older_writer``: the assignment records as kcoord wrote them before KIP-1251's
        assignment epochs."""
        log = [
            _without_assignment_epochs(record) if older_writer else record
            for offset, record in enumerate(self.log)
            if offset not in skip
        ]
        if compacted:
            last = {record.key: offset for offset, record in enumerate(log)}
            log = [record for offset, record in enumerate(log) if last[record.key] == offset]
        return ShardContext(
            self.config,
            now_ms=self.now_ms,
            log=log,
            next_member_number=self._next_member_number,
            next_token=self._next_token,
            group_configs=self.group_configs,
        )

    # ----------------------------------------------------------------------------------------
    # Requests (each returns its token and the step)

    def join(
        self,
        *,
        group_id: str = "g",
        member_id: str = "",
        instance_id: str | None = None,
        client_id: str = "c",
        client_host: str = "/127.0.0.1",
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 20_000,
        protocol_type: str = "consumer",
        protocols: Iterable[tuple[str, bytes]] = (("range", b"s"),),
        require_known_member_id: bool = True,
        supports_skip_assignment: bool = True,
        topics: Mapping[str, tuple[str, int]] | None = None,
    ) -> tuple[int, Step]:
        """``topics``: the image's topics, for a classic member joining a consumer group."""
        token = self.new_token()
        request = JoinGroupRequest(
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            member_id=member_id,
            group_instance_id=instance_id,
            protocol_type=protocol_type,
            protocols=tuple(JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols),
            client_id=client_id,
            client_host=client_host,
            require_known_member_id=require_known_member_id,
            supports_skip_assignment=supports_skip_assignment,
        )
        return token, self._apply(self.shard.handle_join_group(token, request, self.now_ms, topics))

    def sync(
        self,
        *,
        member_id: str,
        generation_id: int,
        group_id: str = "g",
        instance_id: str | None = None,
        assignments: Iterable[tuple[str, bytes]] = (),
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> tuple[int, Step]:
        token = self.new_token()
        request = SyncGroupRequest(
            group_id=group_id,
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=instance_id,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignments=tuple(
                SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in assignments
            ),
        )
        return token, self._apply(self.shard.handle_sync_group(token, request, self.now_ms))

    def heartbeat(
        self,
        *,
        member_id: str,
        generation_id: int,
        group_id: str = "g",
        instance_id: str | None = None,
    ) -> tuple[int, Step]:
        token = self.new_token()
        request = HeartbeatRequest(
            group_id=group_id,
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=instance_id,
        )
        return token, self._apply(self.shard.handle_heartbeat(token, request, self.now_ms))

    def leave(
        self, members: Iterable[tuple[str, str | None]], *, group_id: str = "g"
    ) -> tuple[int, Step]:
        token = self.new_token()
        request = LeaveGroupRequest(
            group_id=group_id,
            members=tuple(MemberIdentity(member_id=m, group_instance_id=i) for m, i in members),
        )
        return token, self._apply(self.shard.handle_leave_group(token, request, self.now_ms))

    def commit(
        self,
        offsets: Iterable[tuple[str, int, int]],
        *,
        group_id: str = "g",
        member_id: str = "",
        generation_id: int = -1,
        instance_id: str | None = None,
        metadata: str | None = None,
        retention_time_ms: int = -1,
        report_group_id_not_found: bool = False,
    ) -> tuple[int, Step]:
        token = self.new_token()
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for topic, partition, offset in offsets:
            by_topic.setdefault(topic, []).append(
                OffsetCommitRequestPartition(
                    partition_index=partition, committed_offset=offset, committed_metadata=metadata
                )
            )
        request = OffsetCommitRequest(
            group_id=group_id,
            generation_id_or_member_epoch=generation_id,
            member_id=member_id,
            group_instance_id=instance_id,
            retention_time_ms=retention_time_ms,
            topics=tuple(
                OffsetCommitRequestTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
            ),
            report_group_id_not_found=report_group_id_not_found,
        )
        return token, self._apply(self.shard.handle_offset_commit(token, request, self.now_ms))

    def fetch(
        self, partitions: Iterable[tuple[str, int]] | None = None, *, group_id: str = "g"
    ) -> tuple[int, Step]:
        token = self.new_token()
        topics = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            topics = tuple(
                OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps))
                for t, ps in by_topic.items()
            )
        request = OffsetFetchRequest(group_id=group_id, topics=topics)
        return token, self._apply(self.shard.handle_offset_fetch(token, request, self.now_ms))

    def describe(
        self, group_ids: Iterable[str] = ("g",), *, report_group_id_not_found: bool = False
    ) -> tuple[int, Step]:
        token = self.new_token()
        request = DescribeGroupsRequest(
            groups=tuple(group_ids), report_group_id_not_found=report_group_id_not_found
        )
        return token, self._apply(self.shard.handle_describe_groups(token, request, self.now_ms))

    def list_groups(
        self, states: Iterable[str] = (), types: Iterable[str] = ()
    ) -> tuple[int, Step]:
        token = self.new_token()
        request = ListGroupsRequest(states_filter=tuple(states), types_filter=tuple(types))
        return token, self._apply(self.shard.handle_list_groups(token, request, self.now_ms))

    def delete_groups(self, group_ids: Iterable[str] = ("g",)) -> tuple[int, Step]:
        token = self.new_token()
        request = DeleteGroupsRequest(groups_names=tuple(group_ids))
        return token, self._apply(self.shard.handle_delete_groups(token, request, self.now_ms))

    def delete_offsets(
        self, partitions: Iterable[tuple[str, int]], *, group_id: str = "g"
    ) -> tuple[int, Step]:
        token = self.new_token()
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = OffsetDeleteRequest(
            group_id=group_id,
            topics=tuple(
                OffsetDeleteRequestTopic(
                    name=t,
                    partitions=tuple(OffsetDeleteRequestPartition(partition_index=p) for p in ps),
                )
                for t, ps in by_topic.items()
            ),
        )
        return token, self._apply(self.shard.handle_offset_delete(token, request, self.now_ms))


# --------------------------------------------------------------------------------------------
# Deterministic printing


def format_bytes(data: bytes) -> str:
    """Consumer subscriptions as sub(topics), printable ASCII quoted, anything else as hex."""
    topics = parse_subscribed_topics(data)
    if topics is not None and consumer_subscription(sorted(topics)) == data:
        return "sub(" + ",".join(sorted(topics)) + ")"
    if all(0x21 <= b < 0x7F for b in data):
        return "'" + data.decode("ascii") + "'"
    return "0x" + data.hex()


def format_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bytes):
        return format_bytes(value)
    if isinstance(value, str):
        return value if value and " " not in value else repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "{" + format_fields(value) + "}"
    return str(value)


def format_fields(obj: Any, *, always: Iterable[str] = ("error_code",)) -> str:
    """``name=value`` for every field that is not at its default (and for ``always``)."""
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        if f.name in always or default is dataclasses.MISSING or value != default:
            parts.append(f"{f.name}={format_value(value)}")
    return " ".join(parts)


def format_response(token: Token, response: Response) -> str:
    return f"#{token} {type(response).__name__} {format_fields(response)}"


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"<{len(text)} characters>"


def format_record(offset: int, record: CoordinatorRecord) -> list[str]:
    key, value = record.key, record.value
    if isinstance(key, OffsetCommitKey):
        where = f"{key.group_id}/{key.topic}/{key.partition}"
        if value is None:
            return [f"@{offset} tombstone OffsetCommit {where}"]
        assert isinstance(value, OffsetCommitValue)
        expire = value.expire_timestamp_ms
        return [
            f"@{offset} OffsetCommit {where} offset={value.offset} "
            f"leader_epoch={value.leader_epoch} metadata={_short(value.metadata)} "
            f"commit_timestamp={value.commit_timestamp_ms}"
            + ("" if expire is None else f" expire_timestamp={expire}")
        ]
    assert isinstance(key, GroupMetadataKey)
    if value is None:
        return [f"@{offset} tombstone GroupMetadata {key.group_id}"]
    assert isinstance(value, GroupMetadataValue)
    lines = [
        f"@{offset} GroupMetadata {key.group_id} generation={value.generation} "
        f"protocol_type={format_value(value.protocol_type)} "
        f"protocol={format_value(value.protocol)} leader={format_value(value.leader)} "
        f"current_state_timestamp={value.current_state_timestamp_ms}"
    ]
    lines.extend(format_member_metadata(m) for m in value.members)
    return lines


def format_member_metadata(m: MemberMetadata) -> str:
    return (
        f"  member {m.member_id} instance={format_value(m.group_instance_id)} "
        f"client={m.client_id} host={m.client_host} session={m.session_timeout_ms} "
        f"rebalance={m.rebalance_timeout_ms} subscription={format_bytes(m.subscription)} "
        f"assignment={format_bytes(m.assignment)}"
    )


def format_step(step: Step) -> list[str]:
    lines = []
    for offset, record in step.records:
        lines.extend(format_record(offset, record))
    lines.extend(format_response(token, response) for token, response in step.responses)
    return lines


def format_group(shard: GroupCoordinatorShard, group_id: str) -> list[str]:
    """The live group, its soft state included, and its timers."""
    group = shard.group(group_id)
    if group is None:
        return [f"group {group_id}: none"]
    lines = [
        f"group {group_id}: state={group.state} generation={group.generation_id} "
        f"protocol_type={format_value(group.protocol_type)} "
        f"protocol={format_value(group.protocol_name)} leader={format_value(group.leader_id)} "
        f"state_timestamp={format_value(group.current_state_timestamp_ms)}"
    ]
    for m in group.members.values():
        protocols = ",".join(f"{p.name}:{format_bytes(p.metadata)}" for p in m.supported_protocols)
        flags = [
            *([f"awaiting_join=#{m.awaiting_join}"] if m.awaiting_join is not None else []),
            *([f"awaiting_sync=#{m.awaiting_sync}"] if m.awaiting_sync is not None else []),
            *(["new"] if m.is_new else []),
            *(["pending_sync"] if m.member_id in group.pending_sync_members else []),
        ]
        lines.append(
            f"  member {m.member_id} instance={format_value(m.group_instance_id)} "
            f"protocols={protocols} assignment={format_bytes(m.assignment)}"
            + "".join(" " + f for f in flags)
        )
    if group.pending_join_members:
        lines.append("  pending " + " ".join(group.pending_join_members))
    if group.subscribed_topics is not None:
        lines.append("  subscribed_topics=" + ",".join(sorted(group.subscribed_topics)))
    committed = group.committed
    lines.append(
        "  committed: none"
        if committed is None
        else f"  committed: generation={committed.generation} members={len(committed.members)}"
    )
    return lines


def format_timers(context: ShardContext) -> list[str]:
    entries = sorted(context.timer.deadlines.items(), key=lambda kv: (kv[1], kv[0]))
    return [f"timer {key} at {deadline}" for key, (deadline, _) in entries] or ["no timers"]


def format_offsets(shard: GroupCoordinatorShard, group_id: str) -> list[str]:
    lines = []
    for topic, partitions in shard.offsets.get(group_id, {}).items():
        for partition, o in partitions.items():
            lines.append(
                f"offset {group_id}/{topic}/{partition} = {o.committed_offset} "
                f"commit_timestamp={o.commit_timestamp_ms} "
                f"expire_timestamp={format_value(o.expire_timestamp_ms)} "
                f"record_offset={o.record_offset}"
            )
    return lines or [f"no offsets for {group_id}"]


def _without_assignment_epochs(record: CoordinatorRecord) -> CoordinatorRecord:
    value = record.value
    if not isinstance(value, ConsumerGroupCurrentMemberAssignmentValue):
        return record
    return CoordinatorRecord(
        record.key,
        dataclasses.replace(
            value,
            assigned_partitions=tuple(
                dataclasses.replace(tp, assignment_epochs=None) for tp in value.assigned_partitions
            ),
            partitions_pending_revocation=tuple(
                dataclasses.replace(tp, assignment_epochs=None)
                for tp in value.partitions_pending_revocation
            ),
        ),
    )
