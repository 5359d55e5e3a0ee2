"""The classic-protocol group coordinator shard: one per ``__consumer_offsets`` partition. Pure.

Kafka 4's ``GroupCoordinatorShard`` is the model: its ``GroupMetadataManager`` (the classic
part: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups, DeleteGroups) and
its ``OffsetMetadataManager`` (OffsetCommit, OffsetFetch, OffsetDelete, offset expiry, offsets
of deleted topics) in one object. Comments name the Kafka method each step follows.

Theory of operation
-------------------
Every input is a call: ``handle_<api>(token, request, now_ms)``, ``on_timer(key, now_ms)``,
``on_loaded(now_ms)``, ``on_unloaded()``, ``on_partitions_deleted(partitions)`` (a topic was
deleted: its offsets go). Each returns a ``CoordinatorResult``: the records to
append to the partition and the ``(token, response)`` answers. A token is the runtime's opaque id
of one request. JoinGroup and SyncGroup are *parked* in the classic protocol: a call may answer
nothing yet, and a later call (another member's request, a timer) may answer many earlier tokens
at once. Every token is answered exactly once, eventually (at the latest by the timers, or by
``on_unloaded`` with NOT_COORDINATOR).

The runtime (``node/runtime.py``) must, for every result, append the records, call
``replay(offset, record)`` for each of them *before it calls the shard again* (as Kafka's
``CoordinatorRuntime`` replays into its timeline structures when it adds records to the open
batch), and release the answers only once the high watermark passes the records, as it does
for all coordinator writes. If an append fails or leadership is lost, the shard is dropped and a
new one is loaded from the log; nothing is rolled back by hand.

Timers are injected: ``Timer.schedule(key, deadline_ms)`` (re)schedules ``key`` (a later
schedule of the same key replaces the earlier one), ``Timer.cancel(key)`` cancels it (a no-op
for an unknown key), and a due timer arrives as ``on_timer(key, now_ms)``. The keys::

    heartbeat/<group>/<member>   session timeout of a member, KIP-394 pending member expiry,
                                 new-member join timeout (KAFKA-7610)
    join/<group>                 rebalance timeout of the join phase; InitialDelayedJoin
    sync/<group>                 DelayedSync (KAFKA-12890): members that never sync
    expire-group-metadata        offset expiry, every offsets.retention.check.interval.ms

(group and member ids percent-encoded). A firing for a key that was cancelled is ignored, so a
runtime that delivers a stale firing does no harm; a firing before the key's deadline (one moved
later, or a loop timer that runs a millisecond early by this clock, as uvloop's do) schedules the
deadline again instead, so that it is never lost.

Replayed state and soft state
-----------------------------
Replayed state changes only in ``replay`` and is exactly what replaying the log rebuilds:

* committed offsets: group -> topic -> partition -> ``OffsetAndMetadata`` (offset, leader epoch,
  metadata, commit timestamp, KIP-211 expire timestamp, record offset);
* which groups exist: a group comes into being when its first GroupMetadata value or
  OffsetCommit value is replayed (the latter makes Kafka's "simple" group: Empty, no protocol
  type) and goes when its GroupMetadata tombstone is replayed;
* each group's ``committed`` GroupMetadataValue, the last one replayed: generation, protocol
  type and name, leader, current state timestamp, and every member with its group instance id,
  client id and host, rebalance and session timeouts, subscription bytes (its metadata for the
  selected protocol) and assignment bytes.

Soft state is what Kafka's ``ClassicGroup`` keeps in memory and does not write (Kafka writes
classic group records with ``replayRecords=false``): the live group of ``classic.py`` -- the
state machine and its timestamp; the generation, protocol, leader and member table of the round
in progress (members that joined, left, expired or were replaced since the last record, their
supported protocols, timeouts and current assignment); the parked JoinGroup/SyncGroup tokens;
the KIP-394 pending member ids; the members that still owe a SyncGroup; the "new member added"
flag of the initial delay; the subscribed-topics cache -- and the scheduled timers.

Before ``on_loaded`` the shard is loading: replaying a GroupMetadata value *builds* the live group
from it, exactly as Kafka's ``GroupMetadataManager.replay`` does (Stable with its members and
assignments if it has members, else Empty). ``on_loaded`` then arms a session timer for every
loaded member, so a Stable group needs no rebalance after a failover: its members' heartbeats
are accepted and a member that died meanwhile is evicted by its session timeout. Once active,
the handlers keep the live group as Kafka does and replaying their GroupMetadata records only
records ``committed``; the two agree whenever a group is Stable or Empty (the tests check it
after every step). A failover in the middle of a rebalance brings back the last record -- the
previous generation -- and its members rejoin on ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID, as
with Kafka.

When records are written (Kafka's ``GroupMetadataManager``, ``OffsetMetadataManager``)::

    JoinGroup creates the group and writes         GroupMetadata generation 0, no members,
    nothing else (classicGroupJoinToClassicGroup)  protocol type "" (newEmptyGroupMetadataRecord)
    the join phase completes with no member left   GroupMetadata of the Empty group: the new
    (completeClassicGroupJoin)                     generation, no protocol, leader or members
    the leader's SyncGroup in CompletingRebalance  GroupMetadata with every member and its
    (classicGroupSyncToClassicGroup)               assignment ("" for members it left out)
    a known static member rejoins with an unknown  GroupMetadata with the new member id (the
    member id, Stable, protocol unchanged          old one is fenced from then on)
    (updateStaticMemberThenRebalanceOrCompleteJoin)
    OffsetCommit (commitOffset)                    OffsetCommit per accepted partition
    OffsetDelete (deleteOffsets)                   tombstone per committed offset deleted
    DeleteGroups (GroupCoordinatorShard            tombstones of all the group's offsets, then
    .deleteGroups)                                 the GroupMetadata tombstone
    expiry timer (cleanupGroupMetadata)            tombstones of expired offsets; GroupMetadata
                                                   tombstone of an Empty group left without any

Removing a member from a Stable group (LeaveGroup, session timeout) writes nothing by itself:
the rebalance it starts writes the next record (the leader's SyncGroup, or the Empty group).

Deviations from Kafka (each also marked where it happens):

* Kafka completes a leader's SyncGroup (assignments, Stable) in the append callback, after the
  write; here it happens at once, since the runtime holds the answers until the write commits
  and drops the shard if it fails. Requests arriving between the write and its commit therefore
  see the group Stable, where Kafka would still see CompletingRebalance.
* A member that re-sends JoinGroup (or SyncGroup) while an earlier one is parked: Kafka drops
  the earlier future unanswered; here it is answered REBALANCE_IN_PROGRESS so that every token
  gets exactly one answer. A removed member's parked SyncGroup (admin LeaveGroup during
  CompletingRebalance) is answered UNKNOWN_MEMBER_ID for the same reason.
* Iteration orders are insertion orders (Kafka: ``HashMap``): leader re-election and
  protocol-vote ties are deterministic.
* A static member replaced before it sent its SyncGroup passes its pending-sync duty to the new
  member id (Kafka leaves the stale id pending, which forces a rebalance at DelayedSync expiry).
* An OffsetCommit with generation -1 to a group that does not exist creates the simple group
  when its first record is replayed (Kafka creates it in the handler too, so a commit whose
  partitions were all rejected still leaves an empty group behind).
* Heartbeat timers of removed members are cancelled (Kafka lets them fire into a no-op).
* A GroupMetadata record too large for the partition's batches (a leader's assignment, a
  static member's new metadata) is caught before it is written (``_fits_a_batch``), and the
  group takes the path Kafka's append callback takes when the append fails.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, NamedTuple, Protocol
from urllib.parse import quote

from kcoord.cluster.coordinator.assignors import DEFAULT_ASSIGNORS
from kcoord.cluster.coordinator.classic import (
    EMPTY_ASSIGNMENT,
    ClassicGroup,
    ClassicGroupMember,
    ClassicGroupState,
    protocol_names,
)
from kcoord.cluster.coordinator.consumer import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerGroup,
    group_tombstones,
    replay_record,
)
from kcoord.cluster.coordinator.consumer_shard import (
    CommitPartitionCheck,
    ConsumerGroupHandlers,
    TopicsView,
)
from kcoord.cluster.coordinator.group_config import (
    GroupConfigBounds,
    GroupConfigLookup,
    no_group_configs,
)
from kcoord.cluster.coordinator.records import (
    CoordinatorRecord,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitFields,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_record,
    record_size_bound,
)
from kcoord.cluster.coordinator.timeline import RebalanceEvent, RebalanceLog
from kcoord.cluster.coordinator.types import (
    DEFAULT_RETENTION_TIME,
    DEFAULT_TIMESTAMP,
    UNKNOWN_MEMBER_ID,
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    DeletableGroupResult,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribedGroupMember,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    MemberIdentity,
    MemberResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetDeleteResponsePartition,
    OffsetDeleteResponseTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchResponsePartition,
    OffsetFetchResponseTopic,
    Response,
    SyncGroupRequest,
    SyncGroupResponse,
    Token,
)
from kcoord.errors import Errors
from kcoord.stats import DURATION_BUCKETS_S, Histogram
from kcoord.storage import format as fmt

_S = ClassicGroupState

GROUP_EXPIRATION_KEY: Final = "expire-group-metadata"  # GroupCoordinatorShard's key
# Committed offsets one firing of the expiration timer looks at (groups whole): a pass over a
# shard of a million offsets held the event loop for five seconds (Kafka runs the pass on a
# coordinator thread of its own). The rest of the pass is taken up by the timer armed again
# at once, so other work runs in between.
EXPIRATION_OFFSETS_PER_RUN: Final = 4096
CLASSIC_GROUP_TYPE: Final = "classic"  # Group.GroupType.CLASSIC.toString()
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """Kafka's classic group configs, with Kafka's defaults (``GroupCoordinatorConfig``)."""

    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    max_size: int = (1 << 31) - 1  # group.max.size
    offset_metadata_max_bytes: int = 4_096  # offset.metadata.max.bytes
    offsets_retention_minutes: int = 10_080  # offsets.retention.minutes (7 days)
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms
    # CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS (KAFKA-7610), not configurable in Kafka.
    new_member_join_timeout_ms: int = 300_000
    # KIP-848 consumer groups: group.consumer.session.timeout.ms, .heartbeat.interval.ms and
    # their min/max bounds (a group's own values lie within them), .max.size
    consumer_timing: GroupConfigBounds = field(default_factory=GroupConfigBounds)
    consumer_max_size: int = (1 << 31) - 1
    consumer_migration_policy: str = "bidirectional"  # group.consumer.migration.policy
    # group.consumer.assignors, by name: the server assignors a member may ask for, the first
    # the one a group whose members ask for none uses.
    consumer_assignors: tuple[str, ...] = DEFAULT_ASSIGNORS
    # group.coordinator.rebalance.protocols: without "consumer", ConsumerGroupHeartbeat and
    # ConsumerGroupDescribe answer UNSUPPORTED_VERSION (KafkaApis.isConsumerGroupProtocolEnabled).
    rebalance_protocols: tuple[str, ...] = ("classic", "consumer")

    @property
    def consumer_protocol_enabled(self) -> bool:
        return "consumer" in self.rebalance_protocols

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000


class Timer(Protocol):
    """The runtime's timer: one pending deadline per key (see the module docstring)."""

    def schedule(self, key: str, deadline_ms: int) -> None: ...

    def cancel(self, key: str) -> None: ...


@dataclass(frozen=True, slots=True)
class CoordinatorResult:
    """Records to append (then replay), and answers to release once they commit.

    ``atomic``: the records must go out in one batch (a request's). Housekeeping that writes
    one independent tombstone per offset or group (offset expiry, a deleted topic's offsets)
    is not: the runtime may split it over as many batches as ``max.message.bytes`` needs
    (Kafka's ``new CoordinatorResult<>(records, false)``)."""

    records: list[CoordinatorRecord] = field(default_factory=list)
    responses: list[tuple[Token, Response]] = field(default_factory=list)
    atomic: bool = True


class MemberEpoch(NamedTuple):
    """What OffsetFetch checks of a consumer group member (``validateMemberEpoch``): its
    epoch, and whether it speaks the classic protocol (its epoch is then its generation)."""

    epoch: int
    classic: bool


class CommittedFetch(NamedTuple):
    """What OffsetFetch checks of a group as of the high watermark, where records above it
    changed the group (``handle_offset_fetch``)."""

    # Whether it was a consumer group then (None: the group has no records above the HW).
    consumer_group: bool | None
    # Its members with records above the HW, as of it (None: not a member then).
    members: Mapping[str, MemberEpoch | None]


class OffsetAndMetadata(NamedTuple):
    """A committed offset (Kafka's ``OffsetAndMetadata``), as replayed from its record.

    A tuple, not a frozen dataclass: a load builds one per key, and this builds 3x faster."""

    committed_offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int | None
    record_offset: int

    def is_expired(self, base_timestamp_ms: int, now_ms: int, retention_ms: int) -> bool:
        """Kafka's ``OffsetExpirationConditionImpl.isOffsetExpired``."""
        if self.expire_timestamp_ms is not None:
            # KIP-211 per-commit retention (OffsetCommit v2-v4): the old semantics.
            return now_ms >= self.expire_timestamp_ms
        return now_ms - base_timestamp_ms >= retention_ms


@dataclass(slots=True)
class CoordinatorStats:
    """Counters of what the shards did, for the node's metrics (plain integers; the runtime
    shares one instance among all its shards, so they outlive a shard's unloading).

    A rebalance *starts* each time a group enters PreparingRebalance (Kafka's
    ``prepareRebalance`` records its rebalance sensor there too; one that restarts from
    CompletingRebalance counts again) and *completes* when the group reaches Stable (the
    leader's SyncGroup) or Empty (the join phase ends with nobody); its duration runs from the
    first start after the group was last Stable or Empty.
    """

    rebalances_started: int = 0
    rebalances_completed: int = 0
    # KIP-848 consumer groups: a new target assignment computed (Kafka's
    # consumer-group-rebalance-count, recorded in updateTargetAssignment); they have no
    # rebalance that starts and completes.
    consumer_group_rebalances: int = 0
    rebalance_duration_s: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS_S))
    # OffsetCommit: partitions written, and errors by code (a request-level error counts once;
    # the node adds the routing errors: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...).
    offset_commits: int = 0
    offset_commit_errors: dict[Errors, int] = field(default_factory=dict)
    # Expirations: offsets by retention, groups left Empty without offsets, members whose
    # session timed out.
    offsets_expired: int = 0
    groups_expired: int = 0
    members_expired: int = 0
    rebalance_events: RebalanceLog = field(default_factory=RebalanceLog)

    def count_offset_commit_error(self, code: Errors, n: int = 1) -> None:
        self.offset_commit_errors[code] = self.offset_commit_errors.get(code, 0) + n

    def timeline(self, group_id: str) -> list[RebalanceEvent]:
        """The group's rebalance events this node still keeps, oldest first."""
        return [e for e in self.rebalance_events if e.group_id == group_id]


class _TimerKind(Enum):
    HEARTBEAT = "heartbeat"
    JOIN = "join"
    SYNC = "sync"
    GROUP_EXPIRATION = "expire-group-metadata"
    CONSUMER = "consumer"  # KIP-848 session and rebalance timeouts (consumer_shard.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class _TimerTask:
    kind: _TimerKind
    deadline_ms: int
    group_id: str = ""
    member_id: str = ""
    generation_id: int = 0  # SYNC: the generation the DelayedSync was armed for
    # JOIN of an initial rebalance (InitialDelayedJoin): this delay and what is left of the
    # rebalance timeout after it; None for a plain join-phase timeout.
    initial_delay_ms: int | None = None
    initial_remaining_ms: int = 0
    consumer_kind: str = ""  # CONSUMER: the session or the rebalance timeout


def heartbeat_key(group_id: str, member_id: str) -> str:
    return f"heartbeat/{quote(group_id, safe='')}/{quote(member_id, safe='')}"


def join_key(group_id: str) -> str:
    return f"join/{quote(group_id, safe='')}"


def sync_key(group_id: str) -> str:
    return f"sync/{quote(group_id, safe='')}"


def _java_string_length(s: str) -> int:
    """``String.length()``: UTF-16 code units (``offset.metadata.max.bytes`` counts these)."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


class _Output:
    """What one call produces, in order."""

    __slots__ = ("atomic", "records", "responses")

    def __init__(self) -> None:
        self.records: list[CoordinatorRecord] = []
        self.responses: list[tuple[Token, Response]] = []
        self.atomic = True

    def write(self, record: CoordinatorRecord) -> None:
        self.records.append(record)

    def respond(self, token: Token, response: Response) -> None:
        self.responses.append((token, response))

    def result(self) -> CoordinatorResult:
        return CoordinatorResult(self.records, self.responses, self.atomic)


def _protocol_inconsistent(requested: str | None, chosen: str | None) -> bool:
    return requested is not None and chosen is not None and requested != chosen


def _java(value: str | None) -> str:
    """A nullable string as Java's string concatenation writes it."""
    return "null" if value is None else value


def _join_reason(what: str, request: JoinGroupRequest) -> str:
    """A rebalance's reason as Kafka's GroupMetadataManager gives it: what happened, then the
    client's own (JoinGroup v8+, KIP-800)."""
    return f"{what}; client reason: {request.reason or 'not provided'}"


def _leave_reason(
    identities: Iterable[MemberIdentity],
    responses: Iterable[MemberResponse],
) -> str:
    """Kafka's "Removing member X on LeaveGroup; client reason: R", for the members that left."""
    return ", ".join(
        f"Removing member {identity.member_id or identity.group_instance_id} on LeaveGroup; "
        f"client reason: {identity.reason or 'not provided'}"
        for identity, response in zip(identities, responses, strict=True)
        if response.error_code is Errors.NONE
    )


def _group_metadata_record(group_id: str, value: GroupMetadataValue) -> CoordinatorRecord:
    return CoordinatorRecord(GroupMetadataKey(group_id=group_id), value)


def is_consumer_group(entry: ListedGroup | None) -> bool:
    """Whether a ListGroups entry (None: no such group) is a consumer group's (KIP-848)."""
    return entry is not None and entry.group_type == CONSUMER_PROTOCOL_TYPE


def _listed_consumer(group_id: str, state: str) -> ListedGroup:
    return ListedGroup(
        group_id=group_id,
        protocol_type=CONSUMER_PROTOCOL_TYPE,
        group_state=state,
        group_type=CONSUMER_PROTOCOL_TYPE,
    )


def _listed_classic(group: ClassicGroup) -> ListedGroup:
    return ListedGroup(
        group_id=group.group_id,
        protocol_type=group.protocol_type or "",
        group_state=str(group.state),
        group_type=CLASSIC_GROUP_TYPE,
    )


class GroupCoordinatorShard(ConsumerGroupHandlers):
    """The classic group coordinator of one ``__consumer_offsets`` partition."""

    def __init__(
        self,
        config: GroupConfig,
        timer: Timer,
        new_member_id: Callable[[str], str],
        stats: CoordinatorStats | None = None,
        group_configs: GroupConfigLookup = no_group_configs,
        *,
        max_batch_bytes: Callable[[], int] | None = None,
    ) -> None:
        """``new_member_id(prefix)`` returns a fresh member id; Kafka's is ``prefix + "-" +
        UUID``, the prefix being the group instance id of a static member, else the client id.
        ``stats``: the counters to add to (the runtime's, shared by its shards).
        ``group_configs(group_id)``: the group's dynamic configs (``group_config.py``).
        ``max_batch_bytes()``: the largest batch the partition takes now (its
        ``max.message.bytes``); a classic GroupMetadata record that cannot fit one fails as
        Kafka's refused append does (``_fits_a_batch``). None: no bound.
        """
        self._config = config
        self._max_batch_bytes = max_batch_bytes
        self._group_configs = group_configs
        self._timer = timer
        self._new_member_id = new_member_id
        self.stats = stats if stats is not None else CoordinatorStats()
        self._groups: dict[str, ClassicGroup] = {}
        self._consumer_groups: dict[str, ConsumerGroup] = {}
        self._offsets: dict[str, dict[str, dict[int, OffsetAndMetadata]]] = {}
        self._timers: dict[str, _TimerTask] = {}
        self._active = False
        # The groups an expiration pass has yet to look at; None between passes.
        self._expiration_pending: deque[str] | None = None

    # ----------------------------------------------------------------------------------------
    # Introspection (read-only views, for the runtime's metrics and for tests)

    @property
    def config(self) -> GroupConfig:
        return self._config

    @property
    def is_active(self) -> bool:
        return self._active

    @property
    def groups(self) -> Mapping[str, ClassicGroup]:
        return self._groups

    def group(self, group_id: str) -> ClassicGroup | None:
        return self._groups.get(group_id)

    @property
    def offsets(self) -> Mapping[str, Mapping[str, Mapping[int, OffsetAndMetadata]]]:
        return self._offsets

    @property
    def scheduled_timers(self) -> Mapping[str, int]:
        """Timer key -> deadline, of the timers this shard has scheduled and not seen fire."""
        return {key: task.deadline_ms for key, task in self._timers.items()}

    # ----------------------------------------------------------------------------------------
    # Loading, unloading, replay

    def replay(self, offset: int, record: CoordinatorRecord) -> None:
        """Apply one record of the partition log (``GroupCoordinatorShard.replay``).

        Tolerates tombstones of unknown keys and records whose group was compacted away.
        KIP-848 records are skipped: this shard serves classic groups only.
        """
        if replay_record(self._consumer_groups, record):
            # A KIP-848 record (consumer.py). Kafka's getOrMaybeCreatePersistedConsumerGroup:
            # the consumer group overrides a simple classic group of the same id, which an
            # OffsetCommit replayed first made (in a compacted log the group's metadata record
            # can come after its offsets). Not a tombstone: an empty consumer group's
            # tombstones, written by the classic join that replaces it, must leave the classic
            # group that join just made (Kafka removes the consumer group in the handler).
            group_id = getattr(record.key, "group_id", "")
            simple = self._groups.get(group_id)
            if (
                record.value is not None
                and simple is not None
                and group_id in self._consumer_groups
                and simple.protocol_type is None
                and not simple.members
            ):
                del self._groups[group_id]
            return
        key, value = record.key, record.value
        if isinstance(key, OffsetCommitKey) and (
            value is None or isinstance(value, OffsetCommitValue)
        ):
            self._replay_offset_commit(offset, key, value)
        elif isinstance(key, GroupMetadataKey) and (
            value is None or isinstance(value, GroupMetadataValue)
        ):
            self._replay_group_metadata(key, value)

    def _replay_offset_commit(
        self, offset: int, key: OffsetCommitKey, value: OffsetCommitValue | None
    ) -> None:
        if value is not None:
            fields = OffsetCommitFields(
                key.group_id,
                key.topic,
                key.partition,
                value.offset,
                value.leader_epoch,
                value.metadata,
                value.commit_timestamp_ms,
            )
            self.replay_offset_commit(offset, fields, value.expire_timestamp_ms)
            return
        group_id = key.group_id
        topics = self._offsets.get(group_id)
        if topics is None or key.topic not in topics:
            return
        partitions = topics[key.topic]
        partitions.pop(key.partition, None)
        if not partitions:
            del topics[key.topic]
        if not topics:
            del self._offsets[group_id]

    def replay_offset_commit(
        self, offset: int, fields: OffsetCommitFields, expire_timestamp_ms: int | None = None
    ) -> None:
        """``replay`` of an OffsetCommit record with a value, given as its fields: log
        replay's fast path (``RecordDecoder.offset_commit``), the bulk of an offsets log."""
        group_id, topic, partition, committed_offset, leader_epoch, metadata, commit_ms = fields
        if group_id not in self._groups and group_id not in self._consumer_groups:
            # OffsetMetadataManager.replay: a consumer that commits without group
            # membership gets a "simple" group, Empty and without a protocol type.
            self._groups[group_id] = ClassicGroup(
                group_id=group_id,
                state=ClassicGroupState.EMPTY,
                current_state_timestamp_ms=None,
            )
        topics = self._offsets.get(group_id)
        if topics is None:
            topics = self._offsets[group_id] = {}
        partitions = topics.get(topic)
        if partitions is None:
            partitions = topics[topic] = {}
        partitions[partition] = OffsetAndMetadata(  # positional: the fields' order
            committed_offset, leader_epoch, metadata, commit_ms, expire_timestamp_ms, offset
        )

    def _replay_group_metadata(
        self, key: GroupMetadataKey, value: GroupMetadataValue | None
    ) -> None:
        group_id = key.group_id
        if value is None:
            gone = self._groups.pop(group_id, None)
            if gone is not None and self._active:
                # Its timers go with it, once its tombstone is written: a handler that
                # cancelled them itself left a group whose write was refused without them.
                # Kafka's deleteGroups cancels nothing; a timer of the group that fires into
                # a later group of the same id raised out of on_timer here (see
                # consumer_shard's conversion of an empty classic group).
                self._cancel_group_timers(gone)
            return
        group = self._groups.get(group_id)
        if group is None or not self._active:
            # Loading (or a group this shard does not hold): the record *is* the group.
            self._groups[group_id] = ClassicGroup.from_group_metadata_value(group_id, value)
        else:
            # The handler that wrote the record already moved the live group (see the module
            # docstring); what the record makes durable is recorded here.
            group.committed = value

    def on_loaded(self, now_ms: int) -> CoordinatorResult:
        """The whole log is replayed: arm the timers (``GroupMetadataManager.onLoaded``)."""
        assert not self._active, "on_loaded called twice"
        self._active = True
        out = _Output()
        for group in list(self._groups.values()):
            for member in group.members.values():
                self._reschedule_heartbeat(group, member, now_ms)
            if group.num_members > self._config.max_size:
                # In case group.max.size was lowered: rebalance so that members can commit.
                self._prepare_rebalance(
                    out,
                    group,
                    now_ms,
                    f"Freshly-loaded group {group.group_id} (size {group.num_members}) is over "
                    f"capacity {self._config.max_size}. Rebalancing in order to give a chance "
                    "for consumers to commit offsets",
                )
        self._arm_consumer_timers(now_ms)
        self._schedule_group_expiration(now_ms)
        return out.result()

    # ----------------------------------------------------------------------------------------
    # KIP-848 consumer groups (consumer_shard.py has the logic)

    @property
    def consumer_groups(self) -> Mapping[str, ConsumerGroup]:
        return self._consumer_groups

    def handle_consumer_group_heartbeat(
        self,
        token: Token,
        request: ConsumerGroupHeartbeatRequest,
        now_ms: int,
        topics: TopicsView,
    ) -> CoordinatorResult:
        """``GroupMetadataManager.consumerGroupHeartbeat``; ``topics`` is the metadata image's
        name -> (topic id, partition count)."""
        out = _Output()
        self._consumer_group_heartbeat_into(token, request, now_ms, topics, out)
        return out.result()

    def handle_consumer_group_describe(
        self, token: Token, request: ConsumerGroupDescribeRequest, now_ms: int
    ) -> CoordinatorResult:
        out = _Output()
        self._consumer_group_describe_into(token, request, now_ms, out)
        return out.result()

    def _schedule_consumer_timer(
        self, key: str, deadline_ms: int, group_id: str, member_id: str, kind: str
    ) -> None:
        self._schedule(
            key,
            _TimerTask(
                kind=_TimerKind.CONSUMER,
                deadline_ms=deadline_ms,
                group_id=group_id,
                member_id=member_id,
                consumer_kind=kind,
            ),
        )

    def _cancel_timer(self, key: str) -> None:
        self._cancel(key)

    def _has_timer(self, key: str) -> bool:
        return key in self._timers

    def on_unloaded(self, now_ms: int | None = None) -> CoordinatorResult:
        """The partition is no longer ours: every group goes Dead and every parked JoinGroup and
        SyncGroup is answered NOT_COORDINATOR (``GroupMetadataManager.onUnloaded``); all timers
        are cancelled (the runtime's unload cancels them in Kafka); the groups' rebalance
        timelines are dropped.
        """
        out = _Output()
        for group in self._groups.values():
            group.transition_to(ClassicGroupState.DEAD, now_ms)
            for member in group.members.values():
                self._complete_join(
                    out,
                    member,
                    JoinGroupResponse(
                        member_id=member.member_id, error_code=Errors.NOT_COORDINATOR
                    ),
                )
                self._complete_sync(
                    out, member, SyncGroupResponse(error_code=Errors.NOT_COORDINATOR)
                )
        for key in list(self._timers):
            self._cancel(key)
        self._active = False
        # Their timelines go too: the next coordinator records what follows, and this node,
        # leading the partition again later, starts over at that load.
        self.stats.rebalance_events.forget({*self._groups, *self._consumer_groups, *self._offsets})
        return out.result()

    # ----------------------------------------------------------------------------------------
    # Timers

    def on_timer(self, key: str, now_ms: int) -> CoordinatorResult:
        out = _Output()
        task = self._timers.get(key)
        if task is None:
            return out.result()  # cancelled: a stale firing
        if now_ms < task.deadline_ms:
            # Early by our clock: dropping it would lose the timer for good (a join phase that
            # never completes, a dead member never expired), so arm it again.
            self._timer.schedule(key, task.deadline_ms)
            return out.result()
        del self._timers[key]
        match task.kind:
            case _TimerKind.HEARTBEAT:
                self._expire_heartbeat(out, task.group_id, task.member_id, now_ms)
            case _TimerKind.JOIN:
                group = self._groups.get(task.group_id)
                if group is not None:
                    if task.initial_delay_ms is None:
                        self._complete_classic_group_join(out, group, now_ms)
                    else:
                        self._try_complete_initial_rebalance_else_schedule(
                            out, group, task.initial_delay_ms, task.initial_remaining_ms, now_ms
                        )
            case _TimerKind.SYNC:
                self._expire_pending_sync(out, task.group_id, task.generation_id, now_ms)
            case _TimerKind.GROUP_EXPIRATION:
                out.atomic = False  # GroupCoordinatorShard.cleanupGroupMetadata
                self._cleanup_group_metadata(out, now_ms)
            case _TimerKind.CONSUMER:
                self._on_consumer_timer(
                    task.consumer_kind, task.group_id, task.member_id, now_ms, out
                )
        return out.result()

    def _schedule(self, key: str, task: _TimerTask) -> None:
        self._timers[key] = task
        self._timer.schedule(key, task.deadline_ms)

    def _cancel(self, key: str) -> None:
        if self._timers.pop(key, None) is not None:
            self._timer.cancel(key)

    def _fits_a_batch(self, record: CoordinatorRecord) -> bool:
        """Whether ``record`` alone fits a batch the partition takes.

        Kafka finds out from its append callback, and reverts the group there; the runtime
        here, told of a refused write after the handler changed the group, reloads the whole
        partition's shard, every group of it, and a leader whose assignment is too large
        sends it again at every rebalance. So the two GroupMetadata writes that grow with the
        members' metadata ask first, and take Kafka's failure path when it would not fit.
        """
        if self._max_batch_bytes is None:
            return True
        try:
            key, value = encode_record(record)
        except ValueError:  # a member id made from a client id of 32,767 bytes, say
            return False
        return fmt.HEADER_SIZE + record_size_bound(key, value) <= self._max_batch_bytes()

    def _fit_a_batch(self, records: Sequence[CoordinatorRecord]) -> bool:
        """Whether ``records`` together fit the one batch an atomic write is: by their size
        bound, else (the bound is up to a third above) by the batch itself."""
        if self._max_batch_bytes is None or not records:
            return True
        limit = self._max_batch_bytes()
        try:
            encoded = [encode_record(record) for record in records]
        except ValueError:  # a record no batch can carry: too long a string in it
            return False
        if fmt.HEADER_SIZE + sum(record_size_bound(k, v) for k, v in encoded) <= limit:
            return True
        batch = fmt.build_batch([fmt.Record(i, 0, k, v) for i, (k, v) in enumerate(encoded)])
        return len(batch) <= limit

    def _reschedule_heartbeat(
        self,
        group: ClassicGroup,
        member: ClassicGroupMember,
        now_ms: int,
        timeout_ms: int | None = None,
    ) -> None:
        """``rescheduleClassicGroupMemberHeartbeat``: the session timeout unless told."""
        if timeout_ms is None:
            timeout_ms = member.session_timeout_ms
        self._schedule_heartbeat(group.group_id, member.member_id, now_ms + timeout_ms)

    def _schedule_heartbeat(self, group_id: str, member_id: str, deadline_ms: int) -> None:
        self._schedule(
            heartbeat_key(group_id, member_id),
            _TimerTask(
                kind=_TimerKind.HEARTBEAT,
                deadline_ms=deadline_ms,
                group_id=group_id,
                member_id=member_id,
            ),
        )

    def _schedule_join(
        self,
        group: ClassicGroup,
        deadline_ms: int,
        initial_delay_ms: int | None = None,
        initial_remaining_ms: int = 0,
    ) -> None:
        self._schedule(
            join_key(group.group_id),
            _TimerTask(
                kind=_TimerKind.JOIN,
                deadline_ms=deadline_ms,
                group_id=group.group_id,
                initial_delay_ms=initial_delay_ms,
                initial_remaining_ms=initial_remaining_ms,
            ),
        )

    def _schedule_pending_sync(self, group: ClassicGroup, now_ms: int) -> None:
        """``schedulePendingSync``: every member must sync within the rebalance timeout."""
        self._schedule(
            sync_key(group.group_id),
            _TimerTask(
                kind=_TimerKind.SYNC,
                deadline_ms=now_ms + group.rebalance_timeout_ms(),
                group_id=group.group_id,
                generation_id=group.generation_id,
            ),
        )

    def _schedule_group_expiration(self, now_ms: int) -> None:
        self._schedule(
            GROUP_EXPIRATION_KEY,
            _TimerTask(
                kind=_TimerKind.GROUP_EXPIRATION,
                deadline_ms=now_ms + self._config.offsets_retention_check_interval_ms,
            ),
        )

    def _cancel_group_timers(self, group: ClassicGroup) -> None:
        self._cancel(join_key(group.group_id))
        self._cancel(sync_key(group.group_id))
        for member_id in [*group.members, *group.pending_join_members]:
            self._cancel(heartbeat_key(group.group_id, member_id))

    # ----------------------------------------------------------------------------------------
    # Answering parked requests

    def _complete_join(
        self, out: _Output, member: ClassicGroupMember, response: JoinGroupResponse
    ) -> bool:
        """``ClassicGroup.completeJoinFuture``: answer the member's parked JoinGroup, if any."""
        token = member.awaiting_join
        if token is None:
            return False
        member.awaiting_join = None
        out.respond(token, response)
        return True

    def _complete_sync(
        self, out: _Output, member: ClassicGroupMember, response: SyncGroupResponse
    ) -> bool:
        """``ClassicGroup.completeSyncFuture``: answer the member's parked SyncGroup, if any."""
        token = member.awaiting_sync
        if token is None:
            return False
        member.awaiting_sync = None
        out.respond(token, response)
        return True

    def _remove_member(self, out: _Output, group: ClassicGroup, member_id: str) -> None:
        """Remove a member or pending member, answering whatever it has parked.

        A parked JoinGroup gets UNKNOWN_MEMBER_ID with an empty member id so that a live
        client rejoins from scratch (``removeMemberAndUpdateClassicGroup``); a parked SyncGroup
        (only possible for an admin removal) gets UNKNOWN_MEMBER_ID too (not in Kafka).
        """
        member = group.members.get(member_id)
        if member is not None:
            self._complete_join(
                out,
                member,
                JoinGroupResponse(member_id=UNKNOWN_MEMBER_ID, error_code=Errors.UNKNOWN_MEMBER_ID),
            )
            self._complete_sync(out, member, SyncGroupResponse(error_code=Errors.UNKNOWN_MEMBER_ID))
        group.remove(member_id)
        self._cancel(heartbeat_key(group.group_id, member_id))

    def _supersede_join(self, out: _Output, member: ClassicGroupMember) -> None:
        # Not in Kafka, which drops the earlier future unanswered (module docstring).
        self._complete_join(
            out,
            member,
            JoinGroupResponse(member_id=member.member_id, error_code=Errors.REBALANCE_IN_PROGRESS),
        )

    # ----------------------------------------------------------------------------------------
    # JoinGroup

    def handle_join_group(
        self,
        token: Token,
        request: JoinGroupRequest,
        now_ms: int,
        topics: TopicsView | None = None,
    ) -> CoordinatorResult:
        """``classicGroupJoin``. ``topics`` (the image's topics, as for a consumer-group
        heartbeat) is needed when a classic member joins a consumer group."""
        out = _Output()
        if not request.group_id:
            out.respond(
                token,
                JoinGroupResponse(member_id=request.member_id, error_code=Errors.INVALID_GROUP_ID),
            )
        elif not (
            self._config.min_session_timeout_ms
            <= request.session_timeout_ms
            <= self._config.max_session_timeout_ms
        ):
            # GroupCoordinatorService.joinGroup checks this before routing (node/kafka/groups.py
            # does too); a caller of the shard alone gets the same answer.
            out.respond(
                token,
                JoinGroupResponse(
                    member_id=request.member_id, error_code=Errors.INVALID_SESSION_TIMEOUT
                ),
            )
        else:
            consumer_group = self._consumer_groups.get(request.group_id)
            if consumer_group is not None and consumer_group.members:
                self._classic_join_to_consumer_group(
                    out, token, request, consumer_group, now_ms, topics=topics or {}
                )
                return out.result()
            if consumer_group is not None and request.member_id == UNKNOWN_MEMBER_ID:
                # An empty consumer group gives way to the classic group this join creates (its
                # offsets stay); a known member id gets UNKNOWN_MEMBER_ID and changes nothing.
                for record in group_tombstones(consumer_group):
                    out.write(record)
            self._classic_group_join(out, token, request, now_ms)
        return out.result()

    def _classic_group_join(
        self, out: _Output, token: Token, request: JoinGroupRequest, now_ms: int
    ) -> None:
        """``classicGroupJoinToClassicGroup``."""
        group_id = request.group_id
        member_id = request.member_id
        is_unknown_member = member_id == UNKNOWN_MEMBER_ID
        group = self._groups.get(group_id)
        is_new_group = group is None
        if group is None:
            if not is_unknown_member:
                # A member id for a group that does not exist: let the member start over.
                out.respond(
                    token,
                    JoinGroupResponse(member_id=member_id, error_code=Errors.UNKNOWN_MEMBER_ID),
                )
                return
            group = ClassicGroup(
                group_id=group_id,
                state=ClassicGroupState.EMPTY,
                current_state_timestamp_ms=now_ms,
            )
            self._groups[group_id] = group

        records_before = len(out.records)
        if not self._accept_joining_member(group, member_id):
            self._remove_member(out, group, member_id)
            out.respond(
                token,
                JoinGroupResponse(
                    member_id=UNKNOWN_MEMBER_ID, error_code=Errors.GROUP_MAX_SIZE_REACHED
                ),
            )
        elif is_unknown_member:
            self._join_new_member(out, token, request, group, now_ms)
        else:
            self._join_existing_member(out, token, request, group, now_ms)

        if is_new_group and len(out.records) == records_before:
            # Commit the new group to the log, so that it survives a failover as an Empty
            # group (newEmptyGroupMetadataRecord).
            out.write(_group_metadata_record(group_id, group.to_empty_group_metadata_value()))

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        """``acceptJoiningMember``: group.max.size."""
        max_size = self._config.max_size
        match group.state:
            case _S.EMPTY | _S.DEAD:
                return True
            case _S.PREPARING_REBALANCE:
                # Count the members awaiting a join answer, not the group size: the size may
                # be above a lowered max, and this kicks out the last rejoining members.
                return (
                    group.has_member(member_id) and group.member(member_id).is_awaiting_join
                ) or group.num_awaiting_join_response < max_size
            case _S.COMPLETING_REBALANCE | _S.STABLE:
                return group.has_member(member_id) or group.num_members < max_size

    def _join_new_member(
        self,
        out: _Output,
        token: Token,
        request: JoinGroupRequest,
        group: ClassicGroup,
        now_ms: int,
    ) -> None:
        """``classicGroupJoinNewMember``."""
        if group.is_in_state(ClassicGroupState.DEAD):
            out.respond(
                token,
                JoinGroupResponse(
                    member_id=UNKNOWN_MEMBER_ID, error_code=Errors.COORDINATOR_NOT_AVAILABLE
                ),
            )
        elif not group.supports_protocols(request.protocol_type, protocol_names(request.protocols)):
            out.respond(
                token,
                JoinGroupResponse(
                    member_id=UNKNOWN_MEMBER_ID, error_code=Errors.INCONSISTENT_GROUP_PROTOCOL
                ),
            )
        else:
            instance_id = request.group_instance_id
            new_member_id = self._new_member_id(
                instance_id if instance_id is not None else request.client_id
            )
            if instance_id is not None:
                existing_member_id = group.static_member_id(instance_id)
                if existing_member_id is not None:
                    # KIP-345: a known instance with a new process: replace the member id.
                    self._update_static_member_then_rebalance_or_complete_join(
                        out,
                        token=token,
                        request=request,
                        group=group,
                        old_member_id=existing_member_id,
                        new_member_id=new_member_id,
                        now_ms=now_ms,
                    )
                else:
                    self._add_member_then_rebalance_or_complete_join(
                        out,
                        token=token,
                        request=request,
                        group=group,
                        member_id=new_member_id,
                        now_ms=now_ms,
                    )
            elif request.require_known_member_id:
                # KIP-394: hand out the id and wait for the member to join with it; the id
                # expires after the session timeout if it never does.
                group.add_pending_member(new_member_id)
                self._schedule_heartbeat(
                    group.group_id, new_member_id, now_ms + request.session_timeout_ms
                )
                out.respond(
                    token,
                    JoinGroupResponse(
                        member_id=new_member_id, error_code=Errors.MEMBER_ID_REQUIRED
                    ),
                )
            else:
                self._add_member_then_rebalance_or_complete_join(
                    out,
                    token=token,
                    request=request,
                    group=group,
                    member_id=new_member_id,
                    now_ms=now_ms,
                )

    def _join_existing_member(
        self,
        out: _Output,
        token: Token,
        request: JoinGroupRequest,
        group: ClassicGroup,
        now_ms: int,
    ) -> None:
        """``classicGroupJoinExistingMember``."""
        member_id = request.member_id
        if group.is_in_state(ClassicGroupState.DEAD):
            out.respond(
                token,
                JoinGroupResponse(member_id=member_id, error_code=Errors.COORDINATOR_NOT_AVAILABLE),
            )
            return
        if not group.supports_protocols(request.protocol_type, protocol_names(request.protocols)):
            out.respond(
                token,
                JoinGroupResponse(
                    member_id=member_id, error_code=Errors.INCONSISTENT_GROUP_PROTOCOL
                ),
            )
            return
        if group.is_pending_member(member_id):
            if request.group_instance_id is not None:
                # Kafka throws IllegalStateException here (a pending member is never static),
                # which its runtime answers as UNKNOWN_SERVER_ERROR.
                out.respond(
                    token,
                    JoinGroupResponse(member_id=member_id, error_code=Errors.UNKNOWN_SERVER_ERROR),
                )
                return
            self._add_member_then_rebalance_or_complete_join(
                out, token=token, request=request, group=group, member_id=member_id, now_ms=now_ms
            )
            return
        error = group.validate_member(member_id, request.group_instance_id)
        if error is not Errors.NONE:
            out.respond(
                token,
                JoinGroupResponse(
                    member_id=member_id, error_code=error, protocol_type=None, protocol_name=None
                ),
            )
            return

        member = group.member(member_id)

        def update(what: str) -> None:
            self._update_member_then_rebalance_or_complete_join(
                out,
                token=token,
                request=request,
                group=group,
                member=member,
                now_ms=now_ms,
                what=f"{what} during {group.state}",
            )

        match group.state:
            case _S.PREPARING_REBALANCE:
                update(f"Member {member_id} joining group")
            case _S.COMPLETING_REBALANCE:
                if member.matches(request.protocols):
                    # Same metadata (it probably missed the JoinGroup answer): answer the
                    # current generation again.
                    out.respond(
                        token,
                        self._current_join_response(
                            group, member_id, with_members=group.is_leader(member_id)
                        ),
                    )
                else:
                    update(f"Updating metadata for member {member_id}")
            case _S.STABLE:
                if group.is_leader(member_id) or not member.matches(request.protocols):
                    # The leader rejoining forces a rebalance (it may know of topic metadata
                    # changes); so does a follower with new metadata.
                    update(
                        f"Leader {member_id} re-joining group"
                        if group.is_leader(member_id)
                        else f"Updating metadata for member {member_id}"
                    )
                else:
                    out.respond(token, self._current_join_response(group, member_id))
            case _:
                # Empty (a member of an empty group cannot exist; be safe): start over.
                out.respond(
                    token,
                    JoinGroupResponse(member_id=member_id, error_code=Errors.UNKNOWN_MEMBER_ID),
                )

    def _current_join_response(
        self, group: ClassicGroup, member_id: str, *, with_members: bool = False
    ) -> JoinGroupResponse:
        return JoinGroupResponse(
            members=group.current_members_for_join_response() if with_members else (),
            member_id=member_id,
            generation_id=group.generation_id,
            protocol_name=group.protocol_name,
            protocol_type=group.protocol_type,
            leader=group.leader_id or "",
            skip_assignment=False,
        )

    def _update_member_then_rebalance_or_complete_join(
        self,
        out: _Output,
        *,
        token: Token,
        request: JoinGroupRequest,
        group: ClassicGroup,
        member: ClassicGroupMember,
        now_ms: int,
        what: str,
    ) -> None:
        """``updateMemberThenRebalanceOrCompleteJoin``; ``what`` starts the rebalance's reason."""
        self._supersede_join(out, member)
        group.update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            token,
        )
        self._maybe_prepare_rebalance_or_complete_join(
            out,
            group,
            now_ms,
            _join_reason(what, request),
        )

    def _add_member_then_rebalance_or_complete_join(
        self,
        out: _Output,
        *,
        token: Token,
        request: JoinGroupRequest,
        group: ClassicGroup,
        member_id: str,
        now_ms: int,
    ) -> None:
        """``addMemberThenRebalanceOrCompleteJoin``."""
        member = ClassicGroupMember(
            member_id=member_id,
            group_instance_id=request.group_instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            supported_protocols=request.protocols,
            is_new=True,
        )
        if group.is_in_state(_S.PREPARING_REBALANCE) and group.previous_state is _S.EMPTY:
            # Someone joined during the initial delay: extend it (InitialDelayedJoin).
            group.new_member_added = True
        group.add(member, token)
        # A new member cannot heartbeat while its JoinGroup is parked, and a client that gave
        # up and retried would leave a defunct member behind: expire new members that do not
        # complete a join within the new-member join timeout (KAFKA-7610).
        self._reschedule_heartbeat(group, member, now_ms, self._config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(
            out,
            group,
            now_ms,
            _join_reason(
                f"Adding new member {member_id} with group instance id "
                f"{_java(request.group_instance_id)}",
                request,
            ),
        )

    def _update_static_member_then_rebalance_or_complete_join(
        self,
        out: _Output,
        *,
        token: Token,
        request: JoinGroupRequest,
        group: ClassicGroup,
        old_member_id: str,
        new_member_id: str,
        now_ms: int,
    ) -> None:
        """``updateStaticMemberThenRebalanceOrCompleteJoin`` (KIP-345, KIP-814)."""
        instance_id = request.group_instance_id
        assert instance_id is not None
        current_leader = group.leader_id
        old_member = group.member(old_member_id)
        # replaceStaticMember: fence whoever still waits under the old member id.
        self._complete_join(
            out,
            old_member,
            JoinGroupResponse(
                members=(),
                member_id=old_member_id,
                protocol_name=None,
                protocol_type=None,
                leader="",
                skip_assignment=False,
                error_code=Errors.FENCED_INSTANCE_ID,
            ),
        )
        self._complete_sync(
            out,
            old_member,
            SyncGroupResponse(
                assignment=EMPTY_ASSIGNMENT,
                protocol_name=None,
                protocol_type=None,
                error_code=Errors.FENCED_INSTANCE_ID,
            ),
        )
        new_member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        old_protocols = new_member.supported_protocols
        old_rebalance_timeout_ms = new_member.rebalance_timeout_ms
        old_session_timeout_ms = new_member.session_timeout_ms
        self._cancel(heartbeat_key(group.group_id, old_member_id))
        # The old member's session timeout until the update below, as in Kafka.
        self._reschedule_heartbeat(group, new_member, now_ms)
        group.update_member(
            new_member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            token,
        )

        match group.state:
            case _S.STABLE:
                # If the protocol of the next generation would not change, persist the new
                # member id and answer with the current assignment, without a rebalance.
                if (group.protocol_name or "") == group.select_protocol():
                    # The member's topics may have changed: as replay computes them from the
                    # record, else the live group and a reloaded one disagreed (an
                    # OffsetDelete of a newly subscribed topic went through here only).
                    group.subscribed_topics = group.compute_subscribed_topics()
                    assignments = {m.member_id: m.assignment for m in group.members.values()}
                    record = _group_metadata_record(
                        group.group_id, group.to_group_metadata_value(assignments)
                    )
                    if not self._fits_a_batch(record):
                        # The append callback's failure path: the old member id is back,
                        # and the joiner is told so (it was fenced above all the same).
                        group.update_member(
                            new_member,
                            old_protocols,
                            old_rebalance_timeout_ms,
                            old_session_timeout_ms,
                            None,
                        )
                        old_member = group.replace_static_member(
                            instance_id, new_member_id, old_member_id
                        )
                        group.subscribed_topics = group.compute_subscribed_topics()
                        self._cancel(heartbeat_key(group.group_id, new_member_id))
                        self._reschedule_heartbeat(group, old_member, now_ms)
                        out.respond(
                            token,
                            JoinGroupResponse(
                                members=(),
                                member_id="",
                                generation_id=group.generation_id,
                                protocol_name=group.protocol_name,
                                protocol_type=group.protocol_type,
                                leader=current_leader or "",
                                skip_assignment=False,
                                error_code=Errors.UNKNOWN_SERVER_ERROR,
                            ),
                        )
                        return
                    out.write(record)
                    # Kafka answers once the record is written; the runtime holds our answer
                    # until it commits.
                    if request.supports_skip_assignment:
                        # KIP-814: a rejoining static leader learns the members but must not
                        # compute a new assignment.
                        is_leader = group.is_leader(new_member_id)
                        self._complete_join(
                            out,
                            new_member,
                            JoinGroupResponse(
                                members=(
                                    group.current_members_for_join_response() if is_leader else ()
                                ),
                                member_id=new_member_id,
                                generation_id=group.generation_id,
                                protocol_name=group.protocol_name,
                                protocol_type=group.protocol_type,
                                leader=group.leader_id or "",
                                skip_assignment=is_leader,
                            ),
                        )
                    else:
                        # Before v9 a rejoining leader must not see itself as leader: the old
                        # member id is named, so it syncs as a follower.
                        self._complete_join(
                            out,
                            new_member,
                            JoinGroupResponse(
                                member_id=new_member_id,
                                generation_id=group.generation_id,
                                protocol_name=group.protocol_name,
                                protocol_type=group.protocol_type,
                                leader=current_leader or "",
                                skip_assignment=False,
                            ),
                        )
                else:
                    self._maybe_prepare_rebalance_or_complete_join(
                        out,
                        group,
                        now_ms,
                        _join_reason(
                            f"Static member {new_member_id} with group instance id "
                            f"{instance_id} rejoined with a protocol that changes the group's",
                            request,
                        ),
                    )
            case _S.COMPLETING_REBALANCE:
                # The leader may already have computed an assignment naming the old member id,
                # which the new one would not get: rebalance.
                self._prepare_rebalance(
                    out,
                    group,
                    now_ms,
                    _join_reason(
                        f"Updating metadata for static member {new_member_id} with instance id "
                        f"{instance_id} during CompletingRebalance",
                        request,
                    ),
                )
            case _S.PREPARING_REBALANCE:
                self._maybe_complete_join_phase(out, group, now_ms)
            case _:
                raise AssertionError(
                    f"group {group.group_id} in {group.state} when static member "
                    f"{instance_id} rejoined"
                )

    def _maybe_prepare_rebalance_or_complete_join(
        self, out: _Output, group: ClassicGroup, now_ms: int, reason: str | None = None
    ) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(out, group, now_ms, reason)
        else:
            self._maybe_complete_join_phase(out, group, now_ms)

    def _classic_event(self, group: ClassicGroup, now_ms: int, reason: str | None = None) -> None:
        """The group's state as it just became, on the timeline (``RebalanceEvent``)."""
        self.stats.rebalance_events.append(
            RebalanceEvent(
                now_ms,
                group.group_id,
                "classic",
                str(group.state),
                group.generation_id,
                group.num_members,
                reason,
            )
        )

    def _prepare_rebalance(
        self, out: _Output, group: ClassicGroup, now_ms: int, reason: str | None = None
    ) -> None:
        """``prepareRebalance``; ``reason`` goes on the group's timeline, as Kafka logs it."""
        if group.is_in_state(_S.COMPLETING_REBALANCE):
            # Members waiting for the assignment must rejoin instead.
            self._reset_and_propagate_assignment_with_error(
                out, group, Errors.REBALANCE_IN_PROGRESS, now_ms
            )
        self._remove_sync_expiration(group)
        self.stats.rebalances_started += 1
        if group.rebalance_started_ms is None:
            group.rebalance_started_ms = now_ms
        is_initial_rebalance = group.is_in_state(_S.EMPTY)
        if is_initial_rebalance:
            # A new group: give the members group.initial.rebalance.delay.ms to arrive.
            delay_ms = self._config.initial_rebalance_delay_ms
            remaining_ms = max(group.rebalance_timeout_ms() - delay_ms, 0)
            self._schedule_join(group, now_ms + delay_ms, delay_ms, remaining_ms)
        group.transition_to(_S.PREPARING_REBALANCE, now_ms)
        self._classic_event(group, now_ms, reason)
        if not is_initial_rebalance:
            self._maybe_complete_join_else_schedule(out, group, now_ms)

    def _maybe_complete_join_else_schedule(
        self, out: _Output, group: ClassicGroup, now_ms: int
    ) -> None:
        if group.has_all_members_joined():
            self._complete_classic_group_join(out, group, now_ms)
        else:
            self._schedule_join(group, now_ms + group.rebalance_timeout_ms())

    def _try_complete_initial_rebalance_else_schedule(
        self,
        out: _Output,
        group: ClassicGroup,
        delay_ms: int,
        remaining_ms: int,
        now_ms: int,
    ) -> None:
        """``tryCompleteInitialRebalanceElseSchedule``: extend the delay while members keep
        joining, up to the rebalance timeout.
        """
        if group.new_member_added and remaining_ms != 0:
            group.new_member_added = False
            new_delay_ms = min(self._config.initial_rebalance_delay_ms, remaining_ms)
            new_remaining_ms = max(remaining_ms - delay_ms, 0)
            self._schedule_join(group, now_ms + new_delay_ms, new_delay_ms, new_remaining_ms)
        else:
            self._complete_classic_group_join(out, group, now_ms)

    def _maybe_complete_join_phase(self, out: _Output, group: ClassicGroup, now_ms: int) -> None:
        """``maybeCompleteJoinPhase``: never early in an initial rebalance (its timer decides)."""
        if (
            group.is_in_state(_S.PREPARING_REBALANCE)
            and group.previous_state is not _S.EMPTY
            and group.has_all_members_joined()
        ):
            self._complete_classic_group_join(out, group, now_ms)

    def _complete_classic_group_join(self, out: _Output, group: ClassicGroup, now_ms: int) -> None:
        """``completeClassicGroupJoin``: drop the dynamic members that did not rejoin, bump
        the generation and answer every parked JoinGroup; or write the Empty group.
        """
        self._cancel(join_key(group.group_id))
        for member in group.not_yet_rejoined_members():
            if not member.is_static_member:
                # Static members keep their place until their session times out (KIP-345).
                self._remove_member(out, group, member.member_id)

        if group.is_in_state(_S.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined but static members remain: wait another rebalance timeout, until
            # their session timeouts remove them (GroupMetadataManager.completeClassicGroupJoin).
            # Kafka re-arms even a 0 ms timeout, firing again at once until a session expires;
            # at least 1 ms lets the clock move between two firings.
            self._schedule_join(group, now_ms + max(group.rebalance_timeout_ms(), 1))
            return

        group.init_next_generation(now_ms)
        self._classic_event(group, now_ms)
        if group.is_in_state(_S.EMPTY):
            self._count_rebalance_completed(group, now_ms)
            out.write(_group_metadata_record(group.group_id, group.to_group_metadata_value({})))
            return
        for member in group.members.values():
            self._complete_join(
                out,
                member,
                self._current_join_response(
                    group, member.member_id, with_members=group.is_leader(member.member_id)
                ),
            )
            self._reschedule_heartbeat(group, member, now_ms)
            member.is_new = False
            group.add_pending_sync_member(member.member_id)
        self._schedule_pending_sync(group, now_ms)

    def _count_rebalance_completed(self, group: ClassicGroup, now_ms: int) -> None:
        started_ms, group.rebalance_started_ms = group.rebalance_started_ms, None
        if started_ms is None:
            return
        self.stats.rebalances_completed += 1
        self.stats.rebalance_duration_s.observe(max(0, now_ms - started_ms) / 1000)

    def _reset_and_propagate_assignment_with_error(
        self, out: _Output, group: ClassicGroup, error: Errors, now_ms: int
    ) -> None:
        assert group.is_in_state(_S.COMPLETING_REBALANCE)
        for member in group.members.values():
            member.assignment = EMPTY_ASSIGNMENT
        self._propagate_assignment(out, group, error, now_ms)

    def _set_and_propagate_assignment(
        self, out: _Output, group: ClassicGroup, assignments: dict[str, bytes], now_ms: int
    ) -> None:
        assert group.is_in_state(_S.COMPLETING_REBALANCE)
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, EMPTY_ASSIGNMENT)
        self._propagate_assignment(out, group, Errors.NONE, now_ms)

    def _propagate_assignment(
        self, out: _Output, group: ClassicGroup, error: Errors, now_ms: int
    ) -> None:
        """``propagateAssignment``: answer every parked SyncGroup."""
        ok = error is Errors.NONE
        for member in group.members.values():
            answered = self._complete_sync(
                out,
                member,
                SyncGroupResponse(
                    protocol_name=group.protocol_name if ok else None,
                    protocol_type=group.protocol_type if ok else None,
                    assignment=member.assignment,
                    error_code=error,
                ),
            )
            if answered:
                # A session that expired while the member waited was ignored; restart it.
                self._reschedule_heartbeat(group, member, now_ms)

    def _remove_sync_expiration(self, group: ClassicGroup) -> None:
        group.clear_pending_sync_members()
        self._cancel(sync_key(group.group_id))

    # ----------------------------------------------------------------------------------------
    # Timer expirations

    def _expire_heartbeat(self, out: _Output, group_id: str, member_id: str, now_ms: int) -> None:
        """``expireClassicGroupMemberHeartbeat``."""
        group = self._groups.get(group_id)
        if group is None or group.is_in_state(_S.DEAD):
            return
        if group.is_pending_member(member_id):
            # KIP-394: the member never came back with its id.
            group.remove(member_id)
            if group.is_in_state(_S.PREPARING_REBALANCE) and group.has_all_members_joined():
                self._complete_classic_group_join(out, group, now_ms)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        # removeMemberAndUpdateClassicGroup
        self.stats.members_expired += 1
        self._remove_member(out, group, member_id)
        if group.state in (_S.STABLE, _S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(
                out, group, now_ms, f"removing member {member_id} on heartbeat expiration"
            )
        elif group.is_in_state(_S.PREPARING_REBALANCE) and group.has_all_members_joined():
            self._complete_classic_group_join(out, group, now_ms)

    def _expire_pending_sync(
        self, out: _Output, group_id: str, generation_id: int, now_ms: int
    ) -> None:
        """``expirePendingSync`` (KAFKA-12890): drop the members that never synced."""
        group = self._groups.get(group_id)
        if group is None or generation_id != group.generation_id:
            return
        if group.state not in (_S.COMPLETING_REBALANCE, _S.STABLE):
            return
        if group.has_received_sync_from_all_members():
            return
        pending = list(group.pending_sync_members)
        for member_id in pending:
            self._remove_member(out, group, member_id)
        self._prepare_rebalance(
            out,
            group,
            now_ms,
            f"Removing {', '.join(sorted(pending))} on pending sync request expiration",
        )

    # ----------------------------------------------------------------------------------------
    # SyncGroup

    def handle_sync_group(
        self, token: Token, request: SyncGroupRequest, now_ms: int
    ) -> CoordinatorResult:
        """``classicGroupSync`` / ``classicGroupSyncToClassicGroup``."""
        out = _Output()
        group = self._groups.get(request.group_id)
        consumer_group = self._consumer_groups.get(request.group_id)
        if not request.group_id:
            out.respond(token, SyncGroupResponse(error_code=Errors.INVALID_GROUP_ID))
        elif consumer_group is not None and consumer_group.members:
            self._classic_sync_to_consumer_group(out, token, request, consumer_group, now_ms)
        elif group is None or group.is_in_state(_S.EMPTY):
            out.respond(token, SyncGroupResponse(error_code=Errors.UNKNOWN_MEMBER_ID))
        else:
            self._sync_classic_group(out, token, request, group, now_ms)
        return out.result()

    def _sync_classic_group(
        self,
        out: _Output,
        token: Token,
        request: SyncGroupRequest,
        group: ClassicGroup,
        now_ms: int,
    ) -> None:
        member_id = request.member_id
        error = self._validate_sync_group(group, request)
        if error is not Errors.NONE:
            out.respond(token, SyncGroupResponse(error_code=error))
            return
        match group.state:
            case _S.PREPARING_REBALANCE:
                out.respond(token, SyncGroupResponse(error_code=Errors.REBALANCE_IN_PROGRESS))
            case _S.COMPLETING_REBALANCE:
                member = group.member(member_id)
                # Not in Kafka, which drops an earlier parked SyncGroup unanswered.
                self._complete_sync(
                    out, member, SyncGroupResponse(error_code=Errors.REBALANCE_IN_PROGRESS)
                )
                member.awaiting_sync = token
                self._remove_pending_sync_member(group, member_id)
                if group.is_leader(member_id):
                    # The leader's assignment; members it left out get an empty one.
                    assignments: dict[str, bytes] = {}
                    for item in request.assignments:
                        assignments[item.member_id] = item.assignment
                    for other_id in group.members:
                        assignments.setdefault(other_id, EMPTY_ASSIGNMENT)
                    record = _group_metadata_record(
                        group.group_id, group.to_group_metadata_value(assignments)
                    )
                    if not self._fits_a_batch(record):
                        # The append callback's failure path (RECORD_LIST_TOO_LARGE maps to
                        # UNKNOWN_SERVER_ERROR, appendGroupMetadataErrorToResponseError).
                        self._reset_and_propagate_assignment_with_error(
                            out, group, Errors.UNKNOWN_SERVER_ERROR, now_ms
                        )
                        self._maybe_prepare_rebalance_or_complete_join(
                            out, group, now_ms, "the group's assignment did not fit a batch"
                        )
                        return
                    out.write(record)
                    # Kafka does the rest in the append callback (module docstring).
                    self._set_and_propagate_assignment(out, group, assignments, now_ms)
                    group.transition_to(_S.STABLE, now_ms)
                    self._classic_event(group, now_ms)
                    self._count_rebalance_completed(group, now_ms)
            case _S.STABLE:
                self._remove_pending_sync_member(group, member_id)
                out.respond(
                    token,
                    SyncGroupResponse(
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        assignment=group.member(member_id).assignment,
                    ),
                )
            case _:
                raise AssertionError(f"SyncGroup reached group {group.group_id} in {group.state}")

    def _validate_sync_group(self, group: ClassicGroup, request: SyncGroupRequest) -> Errors:
        """``validateSyncGroup``."""
        if group.is_in_state(_S.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        error = group.validate_member(request.member_id, request.group_instance_id)
        if error is not Errors.NONE:
            return error
        if request.generation_id != group.generation_id:
            return Errors.ILLEGAL_GENERATION
        # SyncGroup v5 names the protocol type and name the member believes in; a group with
        # none chosen yet is consistent with any (ClassicGroup.isProtocolInconsistent).
        if _protocol_inconsistent(request.protocol_type, group.protocol_type) or (
            _protocol_inconsistent(request.protocol_name, group.protocol_name)
        ):
            return Errors.INCONSISTENT_GROUP_PROTOCOL
        return Errors.NONE

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        """``removePendingSyncMember``: the DelayedSync stops once everyone synced."""
        group.remove_pending_sync_member(member_id)
        if group.state in (_S.DEAD, _S.EMPTY, _S.PREPARING_REBALANCE) or (
            group.has_received_sync_from_all_members()
        ):
            self._cancel(sync_key(group.group_id))

    # ----------------------------------------------------------------------------------------
    # Heartbeat

    def handle_heartbeat(
        self, token: Token, request: HeartbeatRequest, now_ms: int
    ) -> CoordinatorResult:
        """``classicGroupHeartbeatToClassicGroup``."""
        out = _Output()
        out.respond(token, HeartbeatResponse(error_code=self._heartbeat(request, now_ms)))
        return out.result()

    def _heartbeat(self, request: HeartbeatRequest, now_ms: int) -> Errors:
        if not request.group_id:
            return Errors.INVALID_GROUP_ID
        consumer_group = self._consumer_groups.get(request.group_id)
        if consumer_group is not None:
            return self._classic_heartbeat_to_consumer_group(request, consumer_group, now_ms)
        group = self._groups.get(request.group_id)
        if group is None:
            return Errors.UNKNOWN_MEMBER_ID
        if group.is_in_state(_S.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        error = group.validate_member(request.member_id, request.group_instance_id)
        if error is not Errors.NONE:
            return error
        if request.generation_id != group.generation_id:
            return Errors.ILLEGAL_GENERATION
        match group.state:
            case _S.PREPARING_REBALANCE:
                # Keep the session alive, and tell the member to rejoin.
                self._reschedule_heartbeat(group, group.member(request.member_id), now_ms)
                return Errors.REBALANCE_IN_PROGRESS
            case _S.COMPLETING_REBALANCE | _S.STABLE:
                # Heartbeats are allowed in CompletingRebalance (KAFKA-12890: the DelayedSync
                # bounds that phase instead).
                self._reschedule_heartbeat(group, group.member(request.member_id), now_ms)
                return Errors.NONE
            case _:
                return Errors.UNKNOWN_MEMBER_ID

    # ----------------------------------------------------------------------------------------
    # LeaveGroup

    def handle_leave_group(
        self, token: Token, request: LeaveGroupRequest, now_ms: int
    ) -> CoordinatorResult:
        """``classicGroupLeaveToClassicGroup``."""
        out = _Output()
        group = self._groups.get(request.group_id)
        consumer_group = self._consumer_groups.get(request.group_id)
        # LeaveGroupRequest.members(): v0-2's one member, or v3+'s list (an empty one is
        # answered with no members and no error).
        identities = (
            request.members
            if request.member_id is None
            else (MemberIdentity(member_id=request.member_id),)
        )
        if not request.group_id:
            out.respond(token, LeaveGroupResponse(error_code=Errors.INVALID_GROUP_ID))
        elif consumer_group is not None:
            responses = self._classic_leave_consumer_group(consumer_group, identities, now_ms, out)
            out.respond(token, LeaveGroupResponse(members=responses))
        elif group is None:
            # GroupCoordinatorService.leaveGroup: an unknown group is every member's
            # UNKNOWN_MEMBER_ID, not the request's error (the admin client's
            # removeMembersFromConsumerGroup reads them per member).
            out.respond(
                token,
                LeaveGroupResponse(
                    members=tuple(
                        MemberResponse(
                            member_id=identity.member_id,
                            group_instance_id=identity.group_instance_id,
                            error_code=Errors.UNKNOWN_MEMBER_ID,
                        )
                        for identity in identities
                    )
                ),
            )
        elif group.is_in_state(_S.DEAD):
            out.respond(token, LeaveGroupResponse(error_code=Errors.COORDINATOR_NOT_AVAILABLE))
        else:
            responses = tuple(self._leave_one(out, group, identity) for identity in identities)
            if any(r.error_code is Errors.NONE for r in responses):
                if group.state in (_S.STABLE, _S.COMPLETING_REBALANCE):
                    self._maybe_prepare_rebalance_or_complete_join(
                        out, group, now_ms, _leave_reason(identities, responses)
                    )
                elif group.is_in_state(_S.PREPARING_REBALANCE):
                    self._maybe_complete_join_phase(out, group, now_ms)
            out.respond(token, LeaveGroupResponse(members=responses))
        return out.result()

    def _leave_one(
        self, out: _Output, group: ClassicGroup, identity: MemberIdentity
    ) -> MemberResponse:
        member_id, instance_id = identity.member_id, identity.group_instance_id
        if member_id == UNKNOWN_MEMBER_ID:
            # Admin removal of a static member by its group instance id (KIP-345).
            static_member_id = None if instance_id is None else group.static_member_id(instance_id)
            if static_member_id is None:
                return MemberResponse(
                    member_id=member_id,
                    group_instance_id=instance_id,
                    error_code=Errors.UNKNOWN_MEMBER_ID,
                )
            self._remove_member(out, group, static_member_id)
        elif group.is_pending_member(member_id):
            group.remove(member_id)
            self._cancel(heartbeat_key(group.group_id, member_id))
        else:
            error = group.validate_member(member_id, instance_id)
            if error is not Errors.NONE:
                return MemberResponse(
                    member_id=member_id, group_instance_id=instance_id, error_code=error
                )
            self._remove_member(out, group, member_id)
        return MemberResponse(member_id=member_id, group_instance_id=instance_id)

    # ----------------------------------------------------------------------------------------
    # OffsetCommit, OffsetFetch, OffsetDelete

    def handle_offset_commit(
        self,
        token: Token,
        request: OffsetCommitRequest,
        now_ms: int,
        topics: TopicsView | None = None,
    ) -> CoordinatorResult:
        """``OffsetMetadataManager.commitOffset``. ``topics`` is the metadata image's view
        (name -> (topic id, partition count)), from which a consumer group's commit at an older
        member epoch takes its topics' ids (KIP-1251); without it, the group's subscribed
        topics.

        Changes the replayed state only through the records it returns (and moves a classic
        member's heartbeat deadline): the runtime answers a commit whose append is refused
        without unloading the shard (``replay_only`` in node/runtime.py).
        """
        out = _Output()
        validated = self._validate_offset_commit(request, topics)
        if isinstance(validated, Errors) and validated is not Errors.NONE:
            self.stats.count_offset_commit_error(validated)
            out.respond(token, _offset_commit_response_with_error(request, validated))
            return out.result()
        if not isinstance(validated, Errors):
            # KIP-1251: the first partition refused fails the whole request and nothing is
            # written (OffsetMetadataManager.commitOffset: the validator throws); one whose
            # metadata is too large is answered so and not validated.
            refused = next(
                (
                    error
                    for topic in request.topics
                    for p in topic.partitions
                    if not self._metadata_too_large(p.committed_metadata)
                    and (error := validated(topic.name, p.partition_index))
                ),
                Errors.NONE,
            )
            if refused:
                self.stats.count_offset_commit_error(refused)
                out.respond(token, _offset_commit_response_with_error(request, refused))
                return out.result()

        group = self._groups.get(request.group_id)
        if group is not None and group.state in (_S.STABLE, _S.PREPARING_REBALANCE):
            # A classic member's commits keep its session alive.
            self._reschedule_heartbeat(group, group.member(request.member_id), now_ms)

        # OffsetCommit v2-v4's retention time is the client's int64: Kafka's sum wraps as a
        # Java long (a huge retention expires the offset at once); here it is clamped to the
        # record's int64 field (past it, encoding the record failed), keeping the offset.
        # (review helper-210)
        expire_timestamp_ms = (
            None
            if request.retention_time_ms == DEFAULT_RETENTION_TIME
            else max(INT64_MIN, min(INT64_MAX, now_ms + request.retention_time_ms))
        )
        answered = []
        for topic in request.topics:
            partitions = []
            for partition in topic.partitions:
                metadata = partition.committed_metadata
                if self._metadata_too_large(metadata):
                    partitions.append(
                        OffsetCommitResponsePartition(
                            partition_index=partition.partition_index,
                            error_code=Errors.OFFSET_METADATA_TOO_LARGE,
                        )
                    )
                    self.stats.count_offset_commit_error(Errors.OFFSET_METADATA_TOO_LARGE)
                    continue
                self.stats.offset_commits += 1
                partitions.append(
                    OffsetCommitResponsePartition(partition_index=partition.partition_index)
                )
                out.write(
                    CoordinatorRecord(
                        OffsetCommitKey(
                            group_id=request.group_id,
                            topic=topic.name,
                            partition=partition.partition_index,
                        ),
                        OffsetCommitValue(
                            offset=partition.committed_offset,
                            leader_epoch=partition.committed_leader_epoch,
                            metadata="" if metadata is None else metadata,
                            commit_timestamp_ms=(
                                now_ms
                                if partition.commit_timestamp == DEFAULT_TIMESTAMP
                                else partition.commit_timestamp
                            ),
                            expire_timestamp_ms=expire_timestamp_ms,
                        ),
                    )
                )
            answered.append(
                OffsetCommitResponseTopic(name=topic.name, partitions=tuple(partitions))
            )
        out.respond(token, OffsetCommitResponse(topics=tuple(answered)))
        return out.result()

    def _metadata_too_large(self, metadata: str | None) -> bool:
        """OFFSET_METADATA_TOO_LARGE (``offset.metadata.max.bytes``, in Java chars)."""
        return (
            metadata is not None
            and _java_string_length(metadata) > self._config.offset_metadata_max_bytes
        )

    def _validate_offset_commit(
        self, request: OffsetCommitRequest, topics: TopicsView | None
    ) -> Errors | CommitPartitionCheck:
        """``OffsetMetadataManager.validateOffsetCommit``: the request's error, or the check of
        each of its partitions (a consumer group's, KIP-1251). The empty group id is an
        ordinary group here, as in Kafka ("for backwards compatibility")."""
        consumer_group = self._consumer_groups.get(request.group_id)
        if consumer_group is not None:
            return self._validate_consumer_offset_commit(
                consumer_group,
                request.member_id,
                request.generation_id_or_member_epoch,
                member_epoch_version=request.member_epoch_version,
                topics=topics,
            )
        group = self._groups.get(request.group_id)
        if group is None:
            if request.generation_id_or_member_epoch < 0:
                # Admin client or self-assigning consumer: the commit creates a simple group.
                return Errors.NONE
            # v9 says the group is missing; older versions ILLEGAL_GENERATION, as before.
            return (
                Errors.GROUP_ID_NOT_FOUND
                if request.report_group_id_not_found
                else Errors.ILLEGAL_GENERATION
            )
        return group.validate_offset_commit(
            request.member_id, request.group_instance_id, request.generation_id_or_member_epoch
        )

    def handle_offset_fetch(
        self,
        token: Token,
        request: OffsetFetchRequest,
        now_ms: int,
        committed: CommittedFetch | None = None,
    ) -> CoordinatorResult:
        """``OffsetMetadataManager.fetchOffsets`` / ``fetchAllOffsets``.

        An unknown (or Dead) group answers -1 offsets, not an error, for classic groups.
        ``require_stable`` waits for no pending transactional offsets: there are none. A
        consumer group checks the member id and epoch a KIP-848 consumer sends (v9+) as
        ``ConsumerGroup.validateOffsetFetch``: a fenced member or a stale epoch learns so
        before it reads positions, and rejoins.

        Kafka checks the group and the member as of the last committed offset (a read
        operation), unless ``require_stable`` (a write operation, which reads the latest
        state). Here the shard holds what was written, committed or not, and ``committed``
        what of the group the high watermark has passed: a member whose heartbeat bumped its
        epoch, not yet committed, still fetches at the epoch it was last answered, and a group
        made, upgraded or downgraded by records above the HW is checked as what it was then
        (a classic group, or none, checks no member), as in Kafka.
        """
        out = _Output()
        consumer_group = request.group_id in self._consumer_groups
        if committed is not None and committed.consumer_group is not None:
            consumer_group = committed.consumer_group
        if consumer_group and (request.member_id is not None or request.member_epoch >= 0):
            member_id = request.member_id
            kept = {} if committed is None else committed.members
            if member_id is None:
                member = None
            elif member_id in kept:
                member = kept[member_id]
            else:
                member = self.member_epoch(request.group_id, member_id)
            error = Errors.NONE
            if member is None:
                error = Errors.UNKNOWN_MEMBER_ID
            elif request.member_epoch != member.epoch:
                # validateMemberEpoch: a classic member's epoch is its generation.
                error = Errors.ILLEGAL_GENERATION if member.classic else Errors.STALE_MEMBER_EPOCH
            if error:
                out.respond(token, OffsetFetchResponse(group_id=request.group_id, error_code=error))
                return out.result()
        group = self._groups.get(request.group_id)
        known = (
            group is not None and not group.is_in_state(_S.DEAD)
        ) or request.group_id in self._consumer_groups
        stored = self._offsets.get(request.group_id, {}) if known else {}
        topics: list[OffsetFetchResponseTopic] = []
        if request.topics is None:
            for topic_name, partitions in stored.items():
                topics.append(
                    OffsetFetchResponseTopic(
                        name=topic_name,
                        partitions=tuple(
                            _fetched_partition(index, offset)
                            for index, offset in partitions.items()
                        ),
                    )
                )
        else:
            for topic in request.topics:
                partitions = stored.get(topic.name, {})
                topics.append(
                    OffsetFetchResponseTopic(
                        name=topic.name,
                        partitions=tuple(
                            _fetched_partition(index, partitions.get(index))
                            for index in topic.partition_indexes
                        ),
                    )
                )
        out.respond(token, OffsetFetchResponse(group_id=request.group_id, topics=tuple(topics)))
        return out.result()

    def handle_offset_delete(
        self, token: Token, request: OffsetDeleteRequest, now_ms: int
    ) -> CoordinatorResult:
        """``OffsetMetadataManager.deleteOffsets``. A consumer group's offsets may be deleted
        in any state (``ConsumerGroup.validateOffsetDelete`` accepts), those of the topics its
        members subscribe to excepted, as a classic group's."""
        out = _Output()
        group = self._groups.get(request.group_id)
        consumer_group = self._consumer_groups.get(request.group_id)
        subscribed: Callable[[str], bool] | None = None
        if not request.group_id:
            error = Errors.INVALID_GROUP_ID
        elif consumer_group is not None:
            error = Errors.NONE
            subscribed = functools.partial(self._consumer_subscribed_to_topic, consumer_group)
        elif group is None:
            error = Errors.GROUP_ID_NOT_FOUND
        else:
            error = group.validate_offset_delete()
            subscribed = group.is_subscribed_to_topic
        if subscribed is None or error is not Errors.NONE:
            out.respond(token, OffsetDeleteResponse(error_code=error))
            return out.result()

        stored = self._offsets.get(request.group_id, {})
        topics = []
        for topic in request.topics:
            if subscribed(topic.name):
                partitions = tuple(
                    OffsetDeleteResponsePartition(
                        partition_index=p.partition_index,
                        error_code=Errors.GROUP_SUBSCRIBED_TO_TOPIC,
                    )
                    for p in topic.partitions
                )
            else:
                partitions = tuple(
                    OffsetDeleteResponsePartition(partition_index=p.partition_index)
                    for p in topic.partitions
                )
                for p in topic.partitions:
                    if p.partition_index in stored.get(topic.name, {}):
                        out.write(
                            _offset_tombstone(request.group_id, topic.name, p.partition_index)
                        )
            topics.append(OffsetDeleteResponseTopic(name=topic.name, partitions=partitions))
        out.respond(token, OffsetDeleteResponse(topics=tuple(topics)))
        return out.result()

    def on_partitions_deleted(self, partitions: Iterable[tuple[str, int]]) -> CoordinatorResult:
        """``OffsetMetadataManager.onPartitionsDeleted``: the partitions' topic was deleted, so
        every group's committed offsets on them get tombstones (a topic created again under the
        name starts with none, as in Kafka)."""
        deleted: dict[str, set[int]] = {}
        for topic, partition in partitions:
            deleted.setdefault(topic, set()).add(partition)
        out = _Output()
        out.atomic = False  # GroupCoordinatorShard.onTopicsDeleted
        for group_id, topics in self._offsets.items():
            for topic, stored in topics.items():
                gone = deleted.get(topic)
                if gone:
                    for partition in stored:
                        if partition in gone:
                            out.write(_offset_tombstone(group_id, topic, partition))
        return out.result()

    def _delete_all_offsets(self, out: _Output, group_id: str) -> None:
        """``OffsetMetadataManager.deleteAllOffsets``."""
        for topic, partitions in self._offsets.get(group_id, {}).items():
            for partition in partitions:
                out.write(_offset_tombstone(group_id, topic, partition))

    # ----------------------------------------------------------------------------------------
    # Offset and group expiry

    def _cleanup_group_metadata(self, out: _Output, now_ms: int) -> None:
        """``GroupCoordinatorShard.cleanupGroupMetadata``: expire offsets; delete the groups
        left Empty without any. Classic and consumer groups alike (``groupIds()``), the groups
        of the pass those there when it began, ``EXPIRATION_OFFSETS_PER_RUN`` offsets a run.
        """
        pending = self._expiration_pending
        if pending is None:
            pending = self._expiration_pending = deque([*self._groups, *self._consumer_groups])
        examined = 0
        while pending and examined < EXPIRATION_OFFSETS_PER_RUN:
            group_id = pending.popleft()
            if group_id not in self._groups and group_id not in self._consumer_groups:
                continue  # deleted since the pass began
            stored = self._offsets.get(group_id)
            examined += 1 + (sum(map(len, stored.values())) if stored else 0)
            if self._cleanup_expired_offsets(out, group_id, now_ms):
                self._maybe_delete_group(out, group_id)
        if pending:
            self._schedule(
                GROUP_EXPIRATION_KEY,
                _TimerTask(kind=_TimerKind.GROUP_EXPIRATION, deadline_ms=now_ms),
            )
        else:
            self._expiration_pending = None
            self._schedule_group_expiration(now_ms)

    def _cleanup_expired_offsets(self, out: _Output, group_id: str, now_ms: int) -> bool:
        """``OffsetMetadataManager.cleanupExpiredOffsets``: True if the group has no offsets
        left afterwards. A consumer group's offsets expire by commit time once no member
        subscribes to their topic (``ConsumerGroup.offsetExpirationCondition``).
        """
        stored = self._offsets.get(group_id)
        if not stored:
            return True
        consumer_group = self._consumer_groups.get(group_id)
        base_of: Callable[[int], int] | None
        subscribed: Callable[[str], bool]
        if consumer_group is not None:
            base_of = _commit_time
            subscribed = functools.partial(self._consumer_subscribed_to_topic, consumer_group)
        else:
            group = self._groups[group_id]
            base_of = group.offset_expiration_base()
            subscribed = group.is_subscribed_to_topic
        if base_of is None:
            return False
        all_expired = True
        retention_ms = self._config.offsets_retention_ms
        for topic, partitions in stored.items():
            if subscribed(topic):
                all_expired = False
                continue
            for partition, offset in partitions.items():
                if offset.is_expired(base_of(offset.commit_timestamp_ms), now_ms, retention_ms):
                    self.stats.offsets_expired += 1
                    out.write(_offset_tombstone(group_id, topic, partition))
                else:
                    all_expired = False
        return all_expired

    def _maybe_delete_group(self, out: _Output, group_id: str) -> None:
        """``GroupMetadataManager.maybeDeleteGroup``: only an Empty group goes."""
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None:
            if not consumer_group.members:
                self.stats.groups_expired += 1
                self._delete_consumer_group(consumer_group, out)
            return
        group = self._groups.get(group_id)
        if group is not None and group.is_in_state(_S.EMPTY):
            self.stats.groups_expired += 1
            out.write(CoordinatorRecord(GroupMetadataKey(group_id=group_id), None))

    # ----------------------------------------------------------------------------------------
    # DescribeGroups, ListGroups, DeleteGroups

    def handle_describe_groups(
        self, token: Token, request: DescribeGroupsRequest, now_ms: int
    ) -> CoordinatorResult:
        """``GroupMetadataManager.describeGroups``."""
        out = _Output()
        described = tuple(
            self._describe_group(group_id, request.report_group_id_not_found)
            for group_id in request.groups
        )
        out.respond(token, DescribeGroupsResponse(groups=described))
        return out.result()

    def _describe_group(self, group_id: str, report_group_id_not_found: bool) -> DescribedGroup:
        group = self._groups.get(group_id)
        if group is None:
            # An unknown group reads as Dead, and so does a consumer group, which only
            # ConsumerGroupDescribe describes (describeGroups: classicGroup() throws);
            # DescribeGroups v6+ also says why.
            if report_group_id_not_found:
                reason = (
                    f"Group {group_id} is not a classic group."
                    if group_id in self._consumer_groups
                    else f"Group {group_id} not found."
                )
                return DescribedGroup(
                    group_id=group_id,
                    group_state=str(_S.DEAD),
                    error_code=Errors.GROUP_ID_NOT_FOUND,
                    error_message=reason,
                )
            return DescribedGroup(group_id=group_id, group_state=str(_S.DEAD))
        stable = group.is_in_state(_S.STABLE)
        return DescribedGroup(
            group_id=group_id,
            group_state=str(group.state),
            protocol_type=group.protocol_type or "",
            protocol_data=(group.protocol_name or "") if stable else "",
            members=tuple(
                DescribedGroupMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    # The metadata only means something once the protocol is chosen.
                    member_metadata=m.metadata(group.protocol_name) if stable else b"",
                    member_assignment=m.assignment,
                )
                for m in group.members.values()
            ),
        )

    def member_epoch(self, group_id: str, member_id: str) -> MemberEpoch | None:
        """A consumer group member's epoch now, or None if the group has no such member: what
        the runtime keeps of a member as it was at the high watermark while its records are
        above it (OffsetFetch checks a member against it)."""
        consumer_group = self._consumer_groups.get(group_id)
        member = None if consumer_group is None else consumer_group.members.get(member_id)
        return (
            None if member is None else MemberEpoch(member.member_epoch, member.classic is not None)
        )

    def listed_group(self, group_id: str) -> ListedGroup | None:
        """The group's ListGroups entry now, or None if no such group: what the runtime keeps
        of a group as it was at the high watermark while it has records above it."""
        consumer_group = self._consumer_groups.get(group_id)
        if consumer_group is not None:
            return _listed_consumer(group_id, consumer_group.state)
        group = self._groups.get(group_id)
        return None if group is None else _listed_classic(group)

    def handle_list_groups(
        self,
        token: Token,
        request: ListGroupsRequest,
        now_ms: int,
        committed: Mapping[str, ListedGroup | None] | None = None,
    ) -> CoordinatorResult:
        """``GroupMetadataManager.listGroups``: filters are case-insensitive.

        Kafka lists the groups of the last committed offset (its timeline maps read at that
        offset). Here the shard holds what was written, committed or not, and ``committed``
        holds the entries, as of the high watermark, of the groups with records above it
        (None: the group did not exist then). Such a group is listed as it was then, except
        that a classic group still here shows its state now: Kafka's ``ClassicGroup`` state
        is not kept in the timeline, only whether the group exists."""
        out = _Output()
        states = {s.strip().lower() for s in request.states_filter}
        types = {t.lower() for t in request.types_filter}  # GroupType.parse: no trim
        kept = committed or {}

        def wanted(group_type: str, state: str) -> bool:
            return (not types or group_type in types) and (not states or state.lower() in states)

        listed: list[ListedGroup] = []
        if not types or CLASSIC_GROUP_TYPE in types:
            for group in self._groups.values():
                group_id = group.group_id
                if group_id in kept or group_id in self._consumer_groups:
                    continue  # below: as of the HW; or the consumer group that replaces it
                if wanted(CLASSIC_GROUP_TYPE, str(group.state)):
                    listed.append(_listed_classic(group))
        for consumer_group in self._consumer_groups.values():
            if consumer_group.group_id in kept:
                continue
            state = consumer_group.state  # a walk over its members
            if wanted(CONSUMER_PROTOCOL_TYPE, state):
                listed.append(_listed_consumer(consumer_group.group_id, state))
        for then in kept.values():
            if then is None:
                continue
            entry = then
            if then.group_type == CLASSIC_GROUP_TYPE and then.group_id not in self._consumer_groups:
                now = self._groups.get(then.group_id)
                if now is not None:
                    entry = _listed_classic(now)
            if wanted(entry.group_type, entry.group_state):
                listed.append(entry)
        out.respond(token, ListGroupsResponse(groups=tuple(listed)))
        return out.result()

    def handle_delete_groups(
        self, token: Token, request: DeleteGroupsRequest, now_ms: int
    ) -> CoordinatorResult:
        """``GroupCoordinatorShard.deleteGroups``: offsets' tombstones, then the group's."""
        out = _Output()
        results = []
        for group_id in request.groups_names:
            group = self._groups.get(group_id)
            consumer_group = self._consumer_groups.get(group_id)
            if consumer_group is not None:
                error = self._delete_consumer_group(consumer_group, out)
                if error is Errors.NONE:
                    self._delete_all_offsets(out, group_id)
                results.append(DeletableGroupResult(group_id=group_id, error_code=error))
                continue
            if group is None:
                error = Errors.GROUP_ID_NOT_FOUND
            else:
                error = group.validate_delete_group()
            if group is not None and error is Errors.NONE:
                self._delete_all_offsets(out, group_id)
                out.write(CoordinatorRecord(GroupMetadataKey(group_id=group_id), None))
            results.append(DeletableGroupResult(group_id=group_id, error_code=error))
        out.respond(token, DeleteGroupsResponse(results=tuple(results)))
        return out.result()


def _commit_time(commit_timestamp_ms: int) -> int:
    """An offset's retention counts from its commit."""
    return commit_timestamp_ms


def _offset_tombstone(group_id: str, topic: str, partition: int) -> CoordinatorRecord:
    return CoordinatorRecord(
        OffsetCommitKey(group_id=group_id, topic=topic, partition=partition), None
    )


def _fetched_partition(
    index: int, offset: OffsetAndMetadata | None
) -> OffsetFetchResponsePartition:
    if offset is None:
        return OffsetFetchResponsePartition(partition_index=index)
    return OffsetFetchResponsePartition(
        partition_index=index,
        committed_offset=offset.committed_offset,
        committed_leader_epoch=offset.leader_epoch,
        metadata=offset.metadata,
    )


def _offset_commit_response_with_error(
    request: OffsetCommitRequest, error: Errors
) -> OffsetCommitResponse:
    """Every partition gets the request's error (``OffsetCommitRequest.getErrorResponse``)."""
    return OffsetCommitResponse(
        topics=tuple(
            OffsetCommitResponseTopic(
                name=topic.name,
                partitions=tuple(
                    OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=error
                    )
                    for p in topic.partitions
                ),
            )
            for topic in request.topics
        )
    )
