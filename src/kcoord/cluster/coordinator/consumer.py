"""KIP-848 consumer groups: the broker-driven rebalance protocol. Pure.

Kafka's ``GroupMetadataManager.consumerGroupHeartbeat`` and ``CurrentAssignmentBuilder`` are the
model; comments name the Kafka method each step follows.

State, all of it replayed from the KIP-848 records (DESIGN section 6), so a standby or a new
leader rebuilds exactly what the handlers saw:

* the **group epoch** (``ConsumerGroupMetadata``), bumped when a member joins, leaves or changes
  its subscription, or when the subscribed topics' metadata changes (new partitions);
* the subscribed topics' metadata (``ConsumerGroupPartitionMetadata``): topic id -> name,
  partition count;
* each member's metadata (``ConsumerGroupMemberMetadata``: client, subscription, rebalance
  timeout, assignor) and its **current assignment** (``ConsumerGroupCurrentMemberAssignment``:
  member epoch, previous epoch, state, assigned partitions, partitions pending revocation);
* the **target assignment** (``ConsumerGroupTargetAssignmentMember`` per member, and its epoch in
  ``ConsumerGroupTargetAssignmentMetadata``), computed by a server-side assignor
  (``assignors.py``) whenever the group epoch is ahead of the assignment epoch.

A heartbeat computes the records of its step with local values, emits them and answers; the
runtime replays the records (``replay``) before the next call, and replay is the only thing that
changes the state (Kafka replays its records at once too).

Reconciliation (``CurrentAssignmentBuilder``): a member keeps ``assigned = current & target``;
``current - target`` is pending revocation, and while the member still reports owning any of
it, it stays at its epoch in ``UNREVOKED_PARTITIONS``; once it reports them gone it moves on.
Partitions of its target still owned (assigned or pending revocation) by another member are
*unreleased*: it moves to the target epoch in ``UNRELEASED_PARTITIONS`` and gets them on a later
heartbeat, once their owner has let them go. A partition is therefore never handed to a member
before its previous owner released it. The assignment follows the subscription (KAFKA-19431):
a topic the member no longer subscribes to, or that no longer exists, has an empty target, and
when the member changes its subscription while it owes a revocation, such topics' partitions
leave its assignment at once for pending revocation (the member must still report them gone).

Timers: a session timeout per member (fenced when it stops heartbeating) and a rebalance timeout
while it owes a revocation (fenced when it does not revoke in time). Keys::

    consumer-session/<group>/<member>
    consumer-rebalance/<group>/<member>

Static members: a member leaving with epoch -2 keeps its place and assignment until its session
times out; a member joining with its instance id takes both over (no rebalance); an instance id
held by a live member is UNRELEASED_INSTANCE_ID.

Subscriptions: by topic names, by a regular expression (KIP-848's ``SubscribedTopicRegex``),
or both. The expression must match a whole topic name (Java's ``Matcher.matches``); internal
topics never match. Kafka resolves expressions with RE2/J, asynchronously, and stores the result
in a regular-expression record of a later version than DESIGN's schemas; kcoord resolves them
in the heartbeat against the topics the caller passes, so the resolved topics reach the log in
the ``ConsumerGroupPartitionMetadata`` record, and a topic created later that matches bumps the
group epoch at the next heartbeat like a new partition does. Python's ``re`` stands in for RE2/J:
the two agree on the usual syntax (classes, alternation, repetition, anchors); the constructs
RE2 refuses (backreferences, lookaround) are refused here too (INVALID_REGULAR_EXPRESSION).

Classic members inside a consumer group (ClassicMemberMetadata in their metadata record) and
the conversions between classic and consumer groups are in ``consumer_classic.py``. An empty
classic group (or one with only committed offsets) just becomes a consumer group when its first
member joins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Final, Protocol

import re2

from kcoord.cluster.coordinator.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNORS,
    MemberSubscription,
)
from kcoord.cluster.coordinator.records import (
    ClassicMemberMetadata,
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
    CoordinatorRecord,
    TopicMetadata,
    TopicPartitions,
    uuid_bytes,
    uuid_str,
)
from kcoord.errors import Errors

CONSUMER_PROTOCOL_TYPE: Final = "consumer"
# Kafka's Topic.INTERNAL_TOPICS: what a regular expression never matches. Any other name,
# "__" or not, is a user's topic (Kafka refuses no such name).
INTERNAL_TOPICS: Final = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state"}
)
LEAVE_GROUP_MEMBER_EPOCH: Final = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH: Final = -2

TopicId = str  # Kafka's Uuid in its string form (22 characters of URL-safe base64)
Partitions = dict[TopicId, frozenset[int]]


class MemberState(IntEnum):
    """Kafka's ``MemberState`` and its record values."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


def _partitions_of(items: tuple[TopicPartitions, ...]) -> Partitions:
    return {uuid_str(tp.topic_id): frozenset(tp.partitions) for tp in items if tp.partitions}


def _topic_partitions(
    partitions: Mapping[TopicId, frozenset[int]],
    epochs: Mapping[TopicId, Mapping[int, int]] | None = None,
) -> tuple[TopicPartitions, ...]:
    """The record's topics; with ``epochs``, each topic's ``AssignmentEpochs`` too, left out
    (None) for a topic with a partition of ``UNKNOWN_ASSIGNMENT_EPOCH``: no int32 says it, and
    a record without them is read as of that epoch again (``_epochs_of``)."""
    out = []
    for t, ps in sorted(partitions.items()):
        if not ps:
            continue
        ordered = tuple(sorted(ps))
        written = None
        if epochs is not None:
            of_topic = epochs.get(t, {})
            at = tuple(of_topic.get(p, UNKNOWN_ASSIGNMENT_EPOCH) for p in ordered)
            written = None if UNKNOWN_ASSIGNMENT_EPOCH in at else at
        out.append(
            TopicPartitions(topic_id=uuid_bytes(t), partitions=ordered, assignment_epochs=written)
        )
    return tuple(out)


def _epochs_of(
    owned: tuple[tuple[TopicPartitions, ...], ...], member_epoch: int
) -> dict[TopicId, dict[int, int]]:
    """A current assignment record's assignment epochs (KIP-1251): those written, else (a
    record of an older writer) the record's member epoch, as Kafka reads a record without
    them; a negative one (a static member's leave, -2) says nothing of when, and gives
    ``UNKNOWN_ASSIGNMENT_EPOCH``. Kafka's reader (apache/kafka at 6541f94) takes the record's
    -2 there, a later one 0: either takes commits from any epoch of the member, a zombie's
    too, once it is back under its id. Epochs not one per partition fall back for the whole
    topic, as the later ``Utils.assignmentFromTopicPartitions`` does (6541f94's, partition by
    partition)."""
    default = member_epoch if member_epoch >= 0 else UNKNOWN_ASSIGNMENT_EPOCH
    out: dict[TopicId, dict[int, int]] = {}
    for items in owned:
        for tp in items:
            of_topic = out.setdefault(uuid_str(tp.topic_id), {})
            epochs = tp.assignment_epochs
            if not epochs or len(epochs) != len(tp.partitions):
                # None written, or (Kafka's Utils.assignmentFromTopicPartitions logs an error
                # and falls back the same way) not one per partition.
                epochs = (default,) * len(tp.partitions)
            for partition, epoch in zip(tp.partitions, epochs, strict=True):
                of_topic.setdefault(partition, epoch)
    return {t: e for t, e in out.items() if e}


# The assignment epoch of a partition a record at a negative member epoch gave the member
# (``_assignment_epochs``, ``_epochs_of``): above every epoch (and every int32: such an epoch
# is never written), so no commit at an older epoch passes for it.
UNKNOWN_ASSIGNMENT_EPOCH: Final = 2**31


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMember:
    """``ConsumerGroupMember``: metadata and current assignment of one member."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    # A member that speaks the classic protocol (JoinGroup/SyncGroup/Heartbeat): its session
    # timeout and JoinGroup protocols (consumer_classic.py). None for a KIP-848 member.
    classic: ClassicMemberMetadata | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Mapping[TopicId, frozenset[int]] = field(default_factory=dict)
    pending_revocation: Mapping[TopicId, frozenset[int]] = field(default_factory=dict)
    # KIP-1251: the member epoch at which each partition it owns (assigned or pending
    # revocation) became its own, so a commit sent at an older epoch of the member is taken
    # if it owned every partition named since then (``validate_commit_partition``). Those of
    # the member's last assignment record: each record writes them (``assignment_value``,
    # worked out from the record before, ``_assignment_epochs``), as Kafka 4.3 does, so a
    # load that skips records (a compacted log, a cold load's stretches, a standby after a
    # cleaner pass) has them as a full replay does. Derived by the replay instead, a record
    # read after a gap carried the epochs of one before it: a partition lost and given back
    # in between kept its first epoch, and a zombie's commit at that epoch was taken.
    assignment_epochs: Mapping[TopicId, Mapping[int, int]] = field(default_factory=dict)

    def validate_commit_partition(
        self, topic_id: TopicId | None, partition: int, epoch: int
    ) -> bool:
        """KIP-1251's ``assignmentEpoch <= clientEpoch <= brokerEpoch`` for one partition of a
        commit at member epoch ``epoch``: the member owns it, and owned it at that epoch."""
        if epoch > self.member_epoch or topic_id is None:
            return False
        assigned_at = self.assignment_epochs.get(topic_id, {}).get(partition)
        return assigned_at is not None and assigned_at <= epoch

    def metadata_value(self) -> ConsumerGroupMemberMetadataValue:
        return ConsumerGroupMemberMetadataValue(
            instance_id=self.instance_id,
            rack_id=self.rack_id,
            client_id=self.client_id,
            client_host=self.client_host,
            subscribed_topic_names=self.subscribed_topic_names,
            subscribed_topic_regex=self.subscribed_topic_regex,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            server_assignor=self.server_assignor,
            classic_member_metadata=self.classic,
        )

    def assignment_value(self) -> ConsumerGroupCurrentMemberAssignmentValue:
        """The record of this assignment, with the partitions' assignment epochs: those of
        the ones it owned (``assignment_epochs``, of its last record), this epoch for the
        others (``CurrentAssignmentBuilder``)."""
        epochs = _assignment_epochs(
            self.assignment_epochs, self.member_epoch, self.assigned, self.pending_revocation
        )
        return ConsumerGroupCurrentMemberAssignmentValue(
            member_epoch=self.member_epoch,
            previous_member_epoch=self.previous_member_epoch,
            state=int(self.state),
            assigned_partitions=_topic_partitions(self.assigned, epochs),
            partitions_pending_revocation=_topic_partitions(self.pending_revocation, epochs),
        )

    def with_epoch(self, epoch: int) -> ConsumerGroupMember:
        """Kafka's ``updateMemberEpoch``: the old epoch becomes the previous one."""
        return replace(self, previous_member_epoch=self.member_epoch, member_epoch=epoch)


@dataclass
class ConsumerGroup:
    """``ConsumerGroup``: what the records say, plus the derived state."""

    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerGroupMember] = field(default_factory=dict)
    targets: dict[str, Partitions] = field(default_factory=dict)
    subscribed_topics: dict[TopicId, tuple[str, int]] = field(default_factory=dict)
    # Bumped by every replayed change of a member's metadata (its subscription) or of who the
    # members are; with the topics' version, the key of ``subscribed_now``, what the members
    # subscribe to among the topics (a heartbeat derived it from every member each time).
    subscriptions_version: int = field(default=0, compare=False)
    subscribed_now: tuple[tuple[int, int | None], dict[TopicId, tuple[str, int]]] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def state(self) -> str:
        """``ConsumerGroup.maybeUpdateGroupState``."""
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        for m in self.members.values():
            if m.state is not MemberState.STABLE or m.member_epoch != self.assignment_epoch:
                return "Reconciling"
        return "Stable"

    def partition_owners(self, excluding: str) -> dict[tuple[TopicId, int], int]:
        """(topic, partition) -> epoch of the member that holds it (assigned or pending
        revocation), for every member but ``excluding`` (``currentPartitionEpoch``)."""
        owners: dict[tuple[TopicId, int], int] = {}
        for m in self.members.values():
            if m.member_id == excluding:
                continue
            for held in (m.assigned, m.pending_revocation):
                for topic_id, partitions in held.items():
                    for p in partitions:
                        owners[(topic_id, p)] = m.member_epoch
        return owners


# ---------------------------------------------------------------------------------------------
# Reconciliation (CurrentAssignmentBuilder).


def reconcile(
    member: ConsumerGroupMember,
    target: Mapping[TopicId, frozenset[int]],
    target_epoch: int,
    owned: Mapping[TopicId, frozenset[int]] | None,
    owner_epoch: Callable[[TopicId, int], int],
    *,
    subscribed: Collection[TopicId],
    subscription_changed: bool,
) -> ConsumerGroupMember:
    """``CurrentAssignmentBuilder.build``: the member's next state, or itself. ``subscribed``:
    the ids of the existing topics the member subscribes to (``subscribedTopicIds``);
    ``subscription_changed``: this request changed its topic names or regular expression."""

    def step(epoch: int, current: Mapping[TopicId, frozenset[int]]) -> ConsumerGroupMember:
        return _next_assignment(
            member,
            member_epoch=epoch,
            current=current,
            target=target,
            target_epoch=target_epoch,
            subscribed=subscribed,
            owned=owned,
            owner_epoch=owner_epoch,
        )

    if member.state is MemberState.STABLE:
        if member.member_epoch != target_epoch:
            return step(member.member_epoch, member.assigned)
        if subscription_changed:
            return _drop_unsubscribed(member, subscribed, owned)
        return member
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            # It still owns something it must revoke: it waits, but a topic it has just
            # unsubscribed from leaves its assignment now (KAFKA-19431).
            if subscription_changed:
                return _drop_unsubscribed(member, subscribed, owned)
            return member
        # Not past the target's epoch: a member that entered this state for a subscription
        # change may be revoking before the target that follows the change exists.
        return step(min(member.member_epoch + 1, target_epoch), member.assigned)
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        return step(member.member_epoch, member.assigned)
    # UNKNOWN (a state a newer coordinator wrote): one that owns nothing starts again from
    # what it was assigned, revoking what it keeps no more (one that owns something was
    # fenced, validate_member_epoch).
    return step(target_epoch, member.assigned)


def _owns_any(
    owned: Mapping[TopicId, frozenset[int]] | None, partitions: Mapping[TopicId, frozenset[int]]
) -> bool:
    """``ownsRevokedPartitions``: unknown (None) counts as owning them."""
    if owned is None:
        return True
    return any(owned.get(topic_id, frozenset()) & ps for topic_id, ps in partitions.items())


def _drop_unsubscribed(
    member: ConsumerGroupMember,
    subscribed: Collection[TopicId],
    owned: Mapping[TopicId, frozenset[int]] | None,
) -> ConsumerGroupMember:
    """``CurrentAssignmentBuilder.updateCurrentAssignment`` (KAFKA-19431): the partitions of
    topics outside ``subscribed`` (unsubscribed, or deleted) move from the assignment to pending
    revocation; the member revokes them as usual if it still reports owning any of them, else
    only its assignment shrinks. Kafka 4.0 left them assigned until the member's pending
    revocation was done, so its answers still carried topics it had unsubscribed from."""
    dropped = {t: ps for t, ps in member.assigned.items() if t not in subscribed}
    if not dropped:
        return member
    assigned = {t: ps for t, ps in member.assigned.items() if t in subscribed}
    pending = dict(member.pending_revocation)
    for topic_id, partitions in dropped.items():
        pending[topic_id] = pending.get(topic_id, frozenset()) | partitions
    # Its epochs stay as they are, as Kafka leaves them here (no updateMemberEpoch).
    if _owns_any(owned, pending):
        return replace(
            member,
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=assigned,
            pending_revocation=pending,
        )
    return replace(member, assigned=assigned)


def _next_assignment(
    member: ConsumerGroupMember,
    *,
    member_epoch: int,
    current: Mapping[TopicId, frozenset[int]],
    target: Mapping[TopicId, frozenset[int]],
    target_epoch: int,
    subscribed: Collection[TopicId],
    owned: Mapping[TopicId, frozenset[int]] | None,
    owner_epoch: Callable[[TopicId, int], int],
) -> ConsumerGroupMember:
    """``CurrentAssignmentBuilder.computeNextAssignment``. A member that reported what it owns
    and owns none of what it loses needs no revocation step (``ownsRevokedPartitions``): an
    eager classic member rejoins owning nothing, for one. A topic outside ``subscribed`` has an
    empty target, whatever the target assignment says (KAFKA-19431). The partitions of
    ``current`` keep their assignment epochs, and only they, as Kafka's starts from the
    assigned partitions with theirs: one that was pending revocation and is assigned again
    takes the new epoch (carried over, a commit the member sent before it revoked it was taken
    after it had it back, its offset moving backwards; found by a review)."""
    carried = {
        t: {p: e for p, e in epochs.items() if p in current.get(t, ())}
        for t, epochs in member.assignment_epochs.items()
    }
    member = replace(member, assignment_epochs={t: e for t, e in carried.items() if e})
    unreleased = False
    new_assigned: dict[TopicId, frozenset[int]] = {}
    revoke: dict[TopicId, frozenset[int]] = {}
    to_assign: dict[TopicId, frozenset[int]] = {}
    for topic_id in sorted(set(target) | set(current)):
        want = target.get(topic_id, frozenset()) if topic_id in subscribed else frozenset()
        have = current.get(topic_id, frozenset())
        kept = have & want
        gone = have - kept
        pending = want - kept
        free = frozenset(p for p in pending if owner_epoch(topic_id, p) == -1)
        unreleased = unreleased or free != pending
        if kept:
            new_assigned[topic_id] = kept
        if gone:
            revoke[topic_id] = gone
        if free:
            to_assign[topic_id] = free
    if revoke and _owns_any(owned, revoke):
        # Revoke first: the member stays at its epoch until it reports them gone.
        return replace(
            member.with_epoch(member_epoch),
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=new_assigned,
            pending_revocation=revoke,
        )
    for topic_id, partitions in to_assign.items():
        new_assigned[topic_id] = new_assigned.get(topic_id, frozenset()) | partitions
    return replace(
        member.with_epoch(target_epoch),
        state=MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE,
        assigned=new_assigned,
        pending_revocation={},
    )


# ---------------------------------------------------------------------------------------------
# Records.


def group_epoch_record(group_id: str, epoch: int) -> CoordinatorRecord:
    return CoordinatorRecord(
        ConsumerGroupMetadataKey(group_id=group_id), ConsumerGroupMetadataValue(epoch=epoch)
    )


def partition_metadata_record(
    group_id: str, topics: Mapping[TopicId, tuple[str, int]]
) -> CoordinatorRecord:
    return CoordinatorRecord(
        ConsumerGroupPartitionMetadataKey(group_id=group_id),
        ConsumerGroupPartitionMetadataValue(
            topics=tuple(
                TopicMetadata(topic_id=uuid_bytes(t), topic_name=name, num_partitions=n)
                for t, (name, n) in sorted(topics.items())
            )
        ),
    )


def member_metadata_record(group_id: str, member: ConsumerGroupMember) -> CoordinatorRecord:
    return CoordinatorRecord(
        ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member.member_id),
        member.metadata_value(),
    )


def current_assignment_record(group_id: str, member: ConsumerGroupMember) -> CoordinatorRecord:
    return CoordinatorRecord(
        ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member.member_id),
        member.assignment_value(),
    )


def target_member_record(
    group_id: str, member_id: str, partitions: Partitions
) -> CoordinatorRecord:
    return CoordinatorRecord(
        ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id),
        ConsumerGroupTargetAssignmentMemberValue(topic_partitions=_topic_partitions(partitions)),
    )


def target_epoch_record(group_id: str, epoch: int) -> CoordinatorRecord:
    return CoordinatorRecord(
        ConsumerGroupTargetAssignmentMetadataKey(group_id=group_id),
        ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=epoch),
    )


def member_removal_records(group_id: str, member_id: str) -> list[CoordinatorRecord]:
    """Tombstones in Kafka's order: current assignment, target assignment, member metadata."""
    return [
        CoordinatorRecord(
            ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id), None
        ),
        CoordinatorRecord(
            ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id), None
        ),
        CoordinatorRecord(
            ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member_id), None
        ),
    ]


def group_tombstones(group: ConsumerGroup) -> list[CoordinatorRecord]:
    """``ConsumerGroup.createGroupTombstoneRecords``, in its order ("the order matters")."""
    gid = group.group_id
    out: list[CoordinatorRecord] = []
    for member_id in group.members:
        out.append(
            CoordinatorRecord(
                ConsumerGroupCurrentMemberAssignmentKey(group_id=gid, member_id=member_id), None
            )
        )
    for member_id in group.targets:
        out.append(
            CoordinatorRecord(
                ConsumerGroupTargetAssignmentMemberKey(group_id=gid, member_id=member_id), None
            )
        )
    out.append(CoordinatorRecord(ConsumerGroupTargetAssignmentMetadataKey(group_id=gid), None))
    for member_id in group.members:
        out.append(
            CoordinatorRecord(
                ConsumerGroupMemberMetadataKey(group_id=gid, member_id=member_id), None
            )
        )
    out.append(CoordinatorRecord(ConsumerGroupPartitionMetadataKey(group_id=gid), None))
    out.append(CoordinatorRecord(ConsumerGroupMetadataKey(group_id=gid), None))
    return out


def replay_record(groups: dict[str, ConsumerGroup], record: CoordinatorRecord) -> bool:
    """Apply one KIP-848 record (``GroupMetadataManager.replay`` for them); False if the record
    is not one. Tolerates records whose group or member is missing (compaction)."""
    key, value = record.key, record.value
    gid = getattr(key, "group_id", "")
    if isinstance(key, ConsumerGroupMetadataKey):
        if value is None:
            groups.pop(gid, None)
        elif isinstance(value, ConsumerGroupMetadataValue):
            groups.setdefault(gid, ConsumerGroup(gid)).group_epoch = value.epoch
        return True
    if not isinstance(
        key,
        ConsumerGroupPartitionMetadataKey
        | ConsumerGroupMemberMetadataKey
        | ConsumerGroupTargetAssignmentMetadataKey
        | ConsumerGroupTargetAssignmentMemberKey
        | ConsumerGroupCurrentMemberAssignmentKey,
    ):
        return False
    group = groups.get(gid)
    if group is None:
        if value is None:
            return True
        group = groups[gid] = ConsumerGroup(gid)
    if isinstance(key, ConsumerGroupPartitionMetadataKey):
        group.subscribed_topics = (
            {}
            if not isinstance(value, ConsumerGroupPartitionMetadataValue)
            else {uuid_str(t.topic_id): (t.topic_name, t.num_partitions) for t in value.topics}
        )
    elif isinstance(key, ConsumerGroupTargetAssignmentMetadataKey):
        group.assignment_epoch = (
            value.assignment_epoch
            if isinstance(value, ConsumerGroupTargetAssignmentMetadataValue)
            else 0
        )
    elif isinstance(key, ConsumerGroupTargetAssignmentMemberKey):
        if isinstance(value, ConsumerGroupTargetAssignmentMemberValue):
            group.targets[key.member_id] = _partitions_of(value.topic_partitions)
        else:
            group.targets.pop(key.member_id, None)
    elif isinstance(key, ConsumerGroupMemberMetadataKey):
        group.subscriptions_version += 1
        if isinstance(value, ConsumerGroupMemberMetadataValue):
            old = group.members.get(key.member_id) or ConsumerGroupMember(member_id=key.member_id)
            group.members[key.member_id] = replace(
                old,
                instance_id=value.instance_id,
                rack_id=value.rack_id,
                client_id=value.client_id,
                client_host=value.client_host,
                subscribed_topic_names=value.subscribed_topic_names,
                subscribed_topic_regex=value.subscribed_topic_regex,
                rebalance_timeout_ms=value.rebalance_timeout_ms,
                server_assignor=value.server_assignor,
                classic=value.classic_member_metadata,
            )
        else:
            group.members.pop(key.member_id, None)
    elif isinstance(key, ConsumerGroupCurrentMemberAssignmentKey):
        known = group.members.get(key.member_id)
        if isinstance(value, ConsumerGroupCurrentMemberAssignmentValue):
            old = known or ConsumerGroupMember(member_id=key.member_id)
            try:
                state = MemberState(value.state)
            except ValueError:
                state = MemberState.UNKNOWN
            assigned = _partitions_of(value.assigned_partitions)
            pending_revocation = _partitions_of(value.partitions_pending_revocation)
            group.members[key.member_id] = replace(
                old,
                member_epoch=value.member_epoch,
                previous_member_epoch=value.previous_member_epoch,
                state=state,
                assigned=assigned,
                pending_revocation=pending_revocation,
                assignment_epochs=_epochs_of(
                    (value.assigned_partitions, value.partitions_pending_revocation),
                    value.member_epoch,
                ),
            )
        elif known is not None:
            group.members[key.member_id] = replace(
                known,
                member_epoch=0,
                previous_member_epoch=-1,
                state=MemberState.STABLE,
                assigned={},
                pending_revocation={},
                assignment_epochs={},
            )
    return True


def _assignment_epochs(
    before: Mapping[TopicId, Mapping[int, int]],
    member_epoch: int,
    assigned: Mapping[TopicId, frozenset[int]],
    pending_revocation: Mapping[TopicId, frozenset[int]],
) -> dict[TopicId, dict[int, int]]:
    """The assignment epochs a new assignment record of the member writes: a partition it
    owned in its last one keeps the epoch it was assigned at, one new to it is assigned at
    this record's epoch (KIP-1251's ``CurrentAssignmentBuilder``). At a negative epoch (a
    static member's leave, -2), which says nothing of when, a new one is
    ``UNKNOWN_ASSIGNMENT_EPOCH`` (not written), which no commit's epoch passes, until a
    record at an epoch of the member's gives it that one."""
    out: dict[TopicId, dict[int, int]] = {}
    new = member_epoch if member_epoch >= 0 else UNKNOWN_ASSIGNMENT_EPOCH
    for owned in (assigned, pending_revocation):
        for topic_id, partitions in owned.items():
            kept = before.get(topic_id, {})
            epochs = out.setdefault(topic_id, {})
            for partition in partitions:
                epoch = kept.get(partition, new)
                if epoch == UNKNOWN_ASSIGNMENT_EPOCH and member_epoch >= 0:
                    epoch = member_epoch
                epochs[partition] = epoch
    return out


# ---------------------------------------------------------------------------------------------
# Target assignment (TargetAssignmentBuilder).


# ---------------------------------------------------------------------------------------------
# Subscriptions.

# Kafka compiles and matches subscriptions with RE2/J, a port of RE2: RE2 itself reads them
# the same way (``\Q...\E`` from Java's Pattern.quote, ``\z``, ``\pL``, POSIX classes, no
# lookaround or backreferences), where Python's ``re`` refused some and misread others. An
# invalid pattern is the client's error, answered; RE2 is told not to log it on stderr.
_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.log_errors = False


class SubscriptionRegex(Protocol):
    def fullmatch(self, text: str) -> object | None: ...


class InvalidRegexError(ValueError):
    """A subscription's regular expression does not compile (INVALID_REGULAR_EXPRESSION)."""


@functools.lru_cache(maxsize=256)
def compile_subscription_regex(pattern: str) -> SubscriptionRegex:
    """``pattern`` compiled by RE2 (``throwIfRegularExpressionIsInvalid``); InvalidRegexError
    with RE2's description when it does not compile."""
    try:
        compiled: SubscriptionRegex = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        reason = e.args[0] if e.args else e
        detail = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise InvalidRegexError(
            f"SubscribedTopicRegex `{pattern}` is not a valid regular expression: {detail}."
        ) from e
    return compiled


# The expressions a TopicsSnapshot keeps the matches of (each a set of topic names).
MATCHED_PATTERNS_KEPT: Final = 256


class TopicsSnapshot(dict[str, tuple[str, int]]):
    """The topics of one metadata image (name -> (topic id, partition count)), with what each
    regular expression matches among them, found once: matching every member's expression
    against every topic at every heartbeat held the event loop for seconds at each with a
    long pattern. Kafka resolves a group's expressions off the coordinator's thread and keeps
    the result until the metadata changes. ``version`` names the image."""

    __slots__ = ("_matches", "version")

    def __init__(self, topics: Mapping[str, tuple[str, int]], version: int) -> None:
        super().__init__(topics)
        self.version = version
        self._matches: dict[str, frozenset[str]] = {}

    def matching(self, pattern: str) -> frozenset[str]:
        matched = self._matches.pop(pattern, None)
        if matched is None:
            if len(self._matches) >= MATCHED_PATTERNS_KEPT:
                # The least recently asked goes: on a cluster whose metadata does not change, a
                # snapshot lives on, and heartbeats with ever new expressions grew it for good.
                del self._matches[next(iter(self._matches))]
            matched = _matching(pattern, self)
        self._matches[pattern] = matched  # the most recently asked, last
        return matched


def _matching(pattern: str, topic_names: Iterable[str]) -> frozenset[str]:
    return frozenset(
        t for t in topic_names if t not in INTERNAL_TOPICS and _fully_matches(pattern, t)
    )


@functools.lru_cache(maxsize=1 << 16)
def _fully_matches(pattern: str, name: str) -> bool:
    """One match, kept: the checks of one topic against every member's expression (offsets
    expiry, OffsetDelete, a member leaving) ask the same pairs again and again."""
    return compile_subscription_regex(pattern).fullmatch(name) is not None


def subscribed_topics(member: ConsumerGroupMember, topic_names: Iterable[str]) -> frozenset[str]:
    """The topics ``member`` subscribes to among ``topic_names``: its names, and the names its
    regular expression matches as a whole (internal topics never)."""
    names = frozenset(member.subscribed_topic_names)
    pattern = member.subscribed_topic_regex
    if not pattern:
        return names
    if isinstance(topic_names, TopicsSnapshot):
        return names | topic_names.matching(pattern)
    return names | _matching(pattern, topic_names)


def compute_targets(
    members: Mapping[str, ConsumerGroupMember],
    current_targets: Mapping[str, Partitions],
    topics: Mapping[TopicId, tuple[str, int]],
    assignors: Sequence[str] = DEFAULT_ASSIGNORS,
) -> dict[str, Partitions]:
    """The new target assignment of every member, by the group's assignor (the most common
    ``server_assignor`` among members of those ``assignors`` offers, else its first), sticky
    on the current targets."""
    ids_by_name = {name: topic_id for topic_id, (name, _) in topics.items()}
    subscriptions = {
        member_id: MemberSubscription(
            subscribed_topic_ids=frozenset(
                ids_by_name[n] for n in subscribed_topics(m, ids_by_name) if n in ids_by_name
            ),
            current=current_targets.get(member_id, {}),
            rack_id=m.rack_id,
            instance_id=m.instance_id,
        )
        for member_id, m in members.items()
    }
    name = _preferred_assignor(members.values(), assignors)
    counts = {topic_id: n for topic_id, (_, n) in topics.items()}
    assigned = ASSIGNORS[name].assign(subscriptions, counts)
    return {
        member_id: {t: ps for t, ps in assigned.get(member_id, {}).items() if ps}
        for member_id in members
    }


def assignor_name(group: ConsumerGroup, assignors: Sequence[str] = DEFAULT_ASSIGNORS) -> str:
    return _preferred_assignor(group.members.values(), assignors)


def _preferred_assignor(members: Iterable[ConsumerGroupMember], assignors: Sequence[str]) -> str:
    """The server assignor most members ask for (ties: by name), else the first of
    ``assignors`` (``ConsumerGroup.computePreferredServerAssignor``, else the default)."""
    chosen = [
        m.server_assignor
        for m in members
        if m.server_assignor is not None and m.server_assignor in assignors
    ]
    return max(sorted(set(chosen)), key=chosen.count) if chosen else assignors[0]


def validate_member_epoch(
    member: ConsumerGroupMember,
    received: int,
    owned: Mapping[TopicId, frozenset[int]] | None,
) -> Errors:
    """``throwIfConsumerGroupMemberEpochIsInvalid``, and ``CurrentAssignmentBuilder.build``'s
    fence of a member in a state this coordinator does not know (written by a newer one)
    unless it says it owns nothing: it rejoins, and is reconciled from scratch."""
    if member.state is MemberState.UNKNOWN and (owned is None or len(owned) > 0):
        return Errors.FENCED_MEMBER_EPOCH
    if received > member.member_epoch:
        return Errors.FENCED_MEMBER_EPOCH
    if received < member.member_epoch:
        # A retried heartbeat whose answer was lost: the previous epoch, if it owns no more
        # than it was assigned (isSubset: a topic it was not assigned fails, even with no
        # partitions listed).
        if received != member.previous_member_epoch or owned is None:
            return Errors.FENCED_MEMBER_EPOCH
        for topic_id, partitions in owned.items():
            assigned = member.assigned.get(topic_id)
            if assigned is None or not partitions <= assigned:
                return Errors.FENCED_MEMBER_EPOCH
    return Errors.NONE
