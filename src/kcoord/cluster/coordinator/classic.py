"""The classic group and member model (Kafka's ``ClassicGroup``, ``ClassicGroupMember``,
``ClassicGroupState`` in group-coordinator/.../group/classic/). Pure.

Theory of operation
-------------------
A ``ClassicGroup`` is Kafka's in-memory classic group: the state machine below, the members with
the protocols they support, the generation, protocol and leader of the current round, and the
bookkeeping of a rebalance (who is awaiting a JoinGroup or SyncGroup answer, pending KIP-394
member ids, members that still owe a SyncGroup). The shard (``shard.py``) drives it and owns the
answers: a member's ``awaiting_join`` / ``awaiting_sync`` is the runtime's token of the parked
request, which the shard answers and clears. What of this survives a failover is only what the
shard writes in a ``GroupMetadataValue`` record; ``committed`` holds the last such record
replayed for the group (see ``shard.py`` for the exact split).

The model never reads a clock: transitions take ``now_ms``. Iteration orders are insertion
orders (Kafka uses ``HashMap``s, whose order is arbitrary), which makes leader re-election
("the first remaining member") and protocol-vote ties deterministic.

States (Kafka's ``ClassicGroupState`` javadoc, as action/transition lists)::

    Empty                 no members; may hold offsets (simple consumers commit here)
      action:     join from a new member: normal; sync, heartbeat, leave, member commit:
                  UNKNOWN_MEMBER_ID; offset fetch allowed
      transition: join from a new member => PreparingRebalance
                  all offsets expired (group deleted) => Dead
    PreparingRebalance    waiting for the members to (re)join
      action:     heartbeat and sync: REBALANCE_IN_PROGRESS; leave removes the member;
                  joins are parked until every expected member joined (or the rebalance
                  timeout); commits of the current generation allowed; fetch allowed
      transition: some members joined by the timeout => CompletingRebalance
                  all members left => Empty
    CompletingRebalance   waiting for the leader's SyncGroup assignment
      action:     heartbeats allowed (KAFKA-12890, with the DelayedSync timer); member
                  commits: REBALANCE_IN_PROGRESS; followers' syncs parked until the leader's
      transition: leader sync => Stable
                  join from a new member or with new metadata, leave, member failure
                  => PreparingRebalance
    Stable                the generation's assignment is known
      action:     heartbeats normal; sync answers the current assignment; join from a
                  follower with unchanged metadata answers the current generation; commits
                  of the current generation allowed
      transition: member failure, leave, leader join, follower join with new metadata
                  => PreparingRebalance
    Dead                  the partition was unloaded (or the group removed)
      action:     join/sync/heartbeat/commit: COORDINATOR_NOT_AVAILABLE or UNKNOWN_MEMBER_ID
      transition: none (terminal)

``VALID_PREVIOUS_STATES`` is Kafka's table of legal previous states; ``_transition_to`` asserts
against it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from kcoord.cluster.coordinator.records import GroupMetadataValue, MemberMetadata
from kcoord.cluster.coordinator.types import (
    JoinGroupRequestProtocol,
    JoinGroupResponseMember,
    Token,
)
from kcoord.cluster.routing import java_string_hash
from kcoord.errors import Errors

CONSUMER_PROTOCOL_TYPE: Final = "consumer"  # ConsumerProtocol.PROTOCOL_TYPE
EMPTY_ASSIGNMENT: Final = b""
NO_TIMESTAMP: Final = -1


class ClassicGroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


_S = ClassicGroupState

# ClassicGroupState's static initializer: the states a group must be in to enter each state.
VALID_PREVIOUS_STATES: Final[dict[ClassicGroupState, frozenset[ClassicGroupState]]] = {
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE}),
    _S.PREPARING_REBALANCE: frozenset({_S.STABLE, _S.COMPLETING_REBALANCE, _S.EMPTY}),
    _S.COMPLETING_REBALANCE: frozenset({_S.PREPARING_REBALANCE}),
    _S.STABLE: frozenset({_S.COMPLETING_REBALANCE}),
    _S.DEAD: frozenset(
        {_S.STABLE, _S.PREPARING_REBALANCE, _S.COMPLETING_REBALANCE, _S.EMPTY, _S.DEAD}
    ),
}


def parse_subscribed_topics(subscription: bytes) -> frozenset[str] | None:
    """The topics of a ConsumerProtocolSubscription, or ``None`` if the bytes do not parse.

    Read as version 0, the prefix of every version, whatever the version says, a negative one
    too (``ClassicGroup.computeSubscribedTopics``)::

        version int16 | topics [string] (int32 count, int16 length + UTF-8 each)
        | user_data nullable bytes (int32 length, -1 = null) | v1+: owned partitions ...

    Bytes after user_data (later versions' fields) are not read, as in Kafka. Invalid UTF-8 is
    replaced, not rejected, as Java's ``new String(bytes, UTF_8)`` does.
    """
    try:
        struct.unpack_from(">h", subscription, 0)  # the version: present, not checked
        (count,) = struct.unpack_from(">i", subscription, 2)
        if count < 0 or count > len(subscription):
            return None
        position = 6
        topics = []
        for _ in range(count):
            (length,) = struct.unpack_from(">h", subscription, position)
            position += 2
            if length < 0 or position + length > len(subscription):
                return None
            topics.append(subscription[position : position + length].decode("utf-8", "replace"))
            position += length
        (user_data_length,) = struct.unpack_from(">i", subscription, position)
        position += 4
        if user_data_length < -1 or position + max(user_data_length, 0) > len(subscription):
            return None
    except struct.error:
        return None
    return frozenset(topics)


@dataclass(slots=True, kw_only=True)
class ClassicGroupMember:
    """One member (Kafka's ``ClassicGroupMember``).

    ``supported_protocols`` is the member's protocols in preference order, with their metadata;
    a member rebuilt from a record supports exactly the group's protocol, with its
    subscription bytes. ``is_new`` marks a member added by a JoinGroup that has not yet seen
    its join complete: it expires after the new-member join timeout even while it waits
    (KAFKA-7610).
    """

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    supported_protocols: tuple[JoinGroupRequestProtocol, ...]
    assignment: bytes = EMPTY_ASSIGNMENT
    awaiting_join: Token | None = None
    awaiting_sync: Token | None = None
    is_new: bool = False

    @property
    def is_static_member(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync is not None

    def metadata(self, protocol_name: str | None) -> bytes:
        """The member's metadata for ``protocol_name``; raises if it does not support it."""
        for protocol in self.supported_protocols:
            if protocol.name == protocol_name:
                return protocol.metadata
        raise ValueError(f"member {self.member_id} does not support protocol {protocol_name}")

    def has_satisfied_heartbeat(self) -> bool:
        """Kafka's ``hasSatisfiedHeartbeat``: a rebalancing member needs no heartbeat."""
        if self.is_new:
            # New members can expire even while awaiting join (KAFKA-7610).
            return False
        return self.is_awaiting_join or self.is_awaiting_sync

    def matches(self, protocols: tuple[JoinGroupRequestProtocol, ...]) -> bool:
        """Same protocols, names and metadata, in the same order."""
        return protocols == self.supported_protocols

    def vote(self, candidates: Iterable[str]) -> str:
        """The member's most preferred protocol among ``candidates``."""
        candidate_set = set(candidates)
        for protocol in self.supported_protocols:
            if protocol.name in candidate_set:
                return protocol.name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidate_set)}")


def protocol_names(protocols: Iterable[JoinGroupRequestProtocol]) -> frozenset[str]:
    """Kafka's ``ClassicGroupMember.plainProtocolSet``."""
    return frozenset(protocol.name for protocol in protocols)


@dataclass(slots=True)
class ClassicGroup:
    """One classic group (Kafka's ``ClassicGroup``); see the module docstring."""

    group_id: str
    state: ClassicGroupState
    current_state_timestamp_ms: int | None
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    previous_state: ClassicGroupState = ClassicGroupState.DEAD
    members: dict[str, ClassicGroupMember] = field(default_factory=dict)
    # group instance id -> member id (KIP-345).
    static_members: dict[str, str] = field(default_factory=dict)
    # KIP-394 member ids handed out with MEMBER_ID_REQUIRED that have not joined yet.
    pending_join_members: dict[str, None] = field(default_factory=dict)
    # Members that have not sent their SyncGroup since the join phase completed.
    pending_sync_members: dict[str, None] = field(default_factory=dict)
    # Topics the members subscribe to; None when unknown (not "consumer", or unparseable).
    subscribed_topics: frozenset[str] | None = None
    # A member joined during the initial rebalance: extend the InitialDelayedJoin.
    new_member_added: bool = False
    # The last GroupMetadataValue replayed for this group (None: none replayed yet).
    committed: GroupMetadataValue | None = None
    # When the rebalance in progress started (for the shard's rebalance duration); None when
    # the group is Stable or Empty.
    rebalance_started_ms: int | None = None

    # ----------------------------------------------------------------------------------------
    # State

    def is_in_state(self, state: ClassicGroupState) -> bool:
        return self.state is state

    def transition_to(self, target: ClassicGroupState, now_ms: int | None) -> None:
        """Enter ``target`` (Kafka's ``transitionTo``); asserts the transition is legal.

        ``now_ms`` becomes the current state timestamp; ``None`` (unloading, which has no
        clock) keeps the previous one.
        """
        self._transition_to(target, now_ms)

    def _transition_to(self, target: ClassicGroupState, now_ms: int | None) -> None:
        assert self.state in VALID_PREVIOUS_STATES[target], (
            f"group {self.group_id} should be in one of "
            f"{sorted(str(s) for s in VALID_PREVIOUS_STATES[target])} before moving to "
            f"{target}, instead it is in {self.state}"
        )
        self.previous_state = self.state
        self.state = target
        if now_ms is not None:
            self.current_state_timestamp_ms = now_ms

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[ClassicGroupState.PREPARING_REBALANCE]

    # ----------------------------------------------------------------------------------------
    # Members

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def member(self, member_id: str) -> ClassicGroupMember:
        return self.members[member_id]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    @property
    def num_members(self) -> int:
        return len(self.members)

    @property
    def num_awaiting_join_response(self) -> int:
        return sum(1 for m in self.members.values() if m.is_awaiting_join)

    def supported_protocol_counts(self) -> dict[str, int]:
        """Protocol name -> how many members support it (Kafka's ``supportedProtocols``).

        A member counts once per name. Kafka's ``ClassicGroup.incrementSupportedProtocols``
        counts every entry, so a JoinGroup naming a protocol twice (nothing refuses it) leaves
        no candidate and ``ClassicGroupMember.vote`` throws at every join completion: the
        group is stuck. Counting names, as the map's javadoc ("the number of members that
        support them") means, lets such a member vote for its first choice instead.
        """
        counts: dict[str, int] = {}
        for member in self.members.values():
            for name in dict.fromkeys(protocol.name for protocol in member.supported_protocols):
                counts[name] = counts.get(name, 0) + 1
        return counts

    def add(self, member: ClassicGroupMember, awaiting_join: Token | None = None) -> None:
        """Add a member (Kafka's ``ClassicGroup.add``); the first member sets the type and leads."""
        if member.group_instance_id is not None:
            assert member.group_instance_id not in self.static_members, (
                f"static member {member.group_instance_id} is already in group {self.group_id}"
            )
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        assert self.protocol_type == member.protocol_type, "group and member protocol types differ"
        assert self.supports_protocols(
            member.protocol_type, protocol_names(member.supported_protocols)
        ), "none of the member's protocols is supported"
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        member.awaiting_join = awaiting_join
        self.pending_join_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> ClassicGroupMember | None:
        """Remove a member or pending member; a removed leader passes to the first member left.

        The caller answers the removed member's parked requests first.
        """
        removed = self.members.pop(member_id, None)
        if removed is not None and removed.group_instance_id is not None:
            self.static_members.pop(removed.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_join_members.pop(member_id, None)
        self.pending_sync_members.pop(member_id, None)
        return removed

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else elect the first member that did.

        False when there is no leader or no member rejoined (Kafka's
        ``maybeElectNewJoinedLeader``).
        """
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].is_awaiting_join:
            return True
        for member in self.members.values():
            if member.is_awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    def replace_static_member(
        self, group_instance_id: str, old_member_id: str, new_member_id: str
    ) -> ClassicGroupMember:
        """KIP-345: give a static member a new member id, keeping everything else.

        The caller has already answered the old member's parked requests with
        FENCED_INSTANCE_ID. The new member goes to the end of the member order, as a remove
        and put in Kafka's map would.
        """
        old = self.members.pop(old_member_id)
        assert old.awaiting_join is None and old.awaiting_sync is None
        new = ClassicGroupMember(
            member_id=new_member_id,
            group_instance_id=old.group_instance_id,
            client_id=old.client_id,
            client_host=old.client_host,
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            session_timeout_ms=old.session_timeout_ms,
            protocol_type=old.protocol_type,
            supported_protocols=old.supported_protocols,
            assignment=old.assignment,
        )
        self.members[new_member_id] = new
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        if old_member_id in self.pending_sync_members:
            # Not in Kafka (which leaves the stale id in the set, to be dropped by the next
            # clear); the new id owes the SyncGroup now.
            del self.pending_sync_members[old_member_id]
            self.pending_sync_members[new_member_id] = None
        return new

    def update_member(
        self,
        member: ClassicGroupMember,
        protocols: tuple[JoinGroupRequestProtocol, ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        awaiting_join: Token | None,
    ) -> None:
        """Kafka's ``updateMember``; the caller answers a superseded ``awaiting_join`` first."""
        member.supported_protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.awaiting_join = awaiting_join

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_join_members

    def add_pending_member(self, member_id: str) -> None:
        assert member_id not in self.members, f"{member_id} is already a member"
        self.pending_join_members[member_id] = None

    def add_pending_sync_member(self, member_id: str) -> None:
        assert member_id in self.members, f"{member_id} is not a member"
        self.pending_sync_members[member_id] = None

    def remove_pending_sync_member(self, member_id: str) -> None:
        assert member_id in self.members, f"{member_id} is not a member"
        self.pending_sync_members.pop(member_id, None)

    def has_received_sync_from_all_members(self) -> bool:
        return not self.pending_sync_members

    def clear_pending_sync_members(self) -> None:
        self.pending_sync_members.clear()

    def static_member_id(self, group_instance_id: str) -> str | None:
        return self.static_members.get(group_instance_id)

    def not_yet_rejoined_members(self) -> list[ClassicGroupMember]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def has_all_members_joined(self) -> bool:
        return self.num_awaiting_join_response == len(self.members) and not (
            self.pending_join_members
        )

    def rebalance_timeout_ms(self) -> int:
        """The largest rebalance timeout of the members, at least 0 (Kafka's
        ``ClassicGroup.rebalanceTimeoutMs`` starts its max at 0; JoinGroup takes any value)."""
        return max([0, *(m.rebalance_timeout_ms for m in self.members.values())])

    # ----------------------------------------------------------------------------------------
    # Validation (each returns the error Kafka's method throws, or NONE)

    def validate_member(self, member_id: str, group_instance_id: str | None) -> Errors:
        """Kafka's ``validateMember``: the instance id maps to the member id, which exists."""
        if group_instance_id is not None:
            existing = self.static_member_id(group_instance_id)
            if existing is None:
                return Errors.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return Errors.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return Errors.UNKNOWN_MEMBER_ID
        return Errors.NONE

    def validate_offset_commit(
        self, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> Errors:
        """Kafka's ``ClassicGroup.validateOffsetCommit`` for a non-transactional commit."""
        if self.is_in_state(ClassicGroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.is_in_state(ClassicGroupState.EMPTY):
            # The admin client, or a consumer that assigns partitions itself.
            return Errors.NONE
        if generation_id >= 0 or member_id or group_instance_id is not None:
            error = self.validate_member(member_id, group_instance_id)
            if error is not Errors.NONE:
                return error
            if generation_id != self.generation_id:
                return Errors.ILLEGAL_GENERATION
        elif not self.is_in_state(ClassicGroupState.EMPTY):
            # No member id and no generation: only an empty group takes the commit.
            return Errors.UNKNOWN_MEMBER_ID
        if self.is_in_state(ClassicGroupState.COMPLETING_REBALANCE):
            # The member knows the new generation from its JoinGroup answer but has no
            # assignment yet: let it finish the rebalance first.
            return Errors.REBALANCE_IN_PROGRESS
        return Errors.NONE

    def validate_offset_delete(self) -> Errors:
        if self.is_in_state(ClassicGroupState.DEAD):
            return Errors.GROUP_ID_NOT_FOUND
        if not self.is_in_state(ClassicGroupState.EMPTY) and not self.uses_consumer_protocol():
            return Errors.NON_EMPTY_GROUP
        return Errors.NONE

    def validate_delete_group(self) -> Errors:
        if self.is_in_state(ClassicGroupState.DEAD):
            return Errors.GROUP_ID_NOT_FOUND
        if not self.is_in_state(ClassicGroupState.EMPTY):
            return Errors.NON_EMPTY_GROUP
        return Errors.NONE

    # ----------------------------------------------------------------------------------------
    # Protocols and subscriptions

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def supports_protocols(
        self, member_protocol_type: str, member_protocols: frozenset[str]
    ) -> bool:
        """Can a member with these protocols join? (Kafka's ``supportsProtocols``.)

        An empty group takes any non-empty type and protocol list; otherwise the type must be
        the group's and one protocol must be supported by every current member.
        """
        if self.is_in_state(ClassicGroupState.EMPTY):
            return bool(member_protocol_type) and bool(member_protocols)
        if self.protocol_type != member_protocol_type:
            return False
        counts = self.supported_protocol_counts()
        return any(counts.get(name, 0) == len(self.members) for name in member_protocols)

    def candidate_protocols(self) -> list[str]:
        """The protocols every member supports, in first-seen order."""
        counts = self.supported_protocol_counts()
        return [name for name, count in counts.items() if count == len(self.members)]

    def select_protocol(self) -> str:
        """Each member votes for its preferred candidate; the most votes wins.

        Kafka's ``selectProtocol`` takes the first maximum in the iteration order of a
        ``java.util.HashMap`` of the votes, so a tie goes by the protocol names' hashes, never
        by member order: a static member's restart (which moves it to the end of the members)
        must not change the protocol, and rebalance the group, when the votes are even.
        """
        assert self.members, f"cannot select a protocol for empty group {self.group_id}"
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        best = max(votes.values())
        return next(name for name in java_hash_map_order(votes) if votes[name] == best)

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """Kafka's ``computeSubscribedTopics``: known only for "consumer" groups that parse."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = parse_subscribed_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return frozenset(topics)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        """Unknown subscriptions count as "subscribed to everything" for consumer groups."""
        if self.subscribed_topics is not None:
            return topic in self.subscribed_topics
        return self.uses_consumer_protocol()

    def init_next_generation(self, now_ms: int) -> None:
        """Bump the generation and pick the protocol (Kafka's ``initNextGeneration``)."""
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(ClassicGroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(ClassicGroupState.EMPTY, now_ms)
        self.clear_pending_sync_members()

    def current_members_for_join_response(self) -> tuple[JoinGroupResponseMember, ...]:
        """The member list the leader gets in its JoinGroup answer."""
        assert self.state not in (ClassicGroupState.DEAD, ClassicGroupState.PREPARING_REBALANCE)
        return tuple(
            JoinGroupResponseMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                metadata=m.metadata(self.protocol_name),
            )
            for m in self.members.values()
        )

    def offset_expiration_base(self) -> Callable[[int], int] | None:
        """Kafka's ``offsetExpirationCondition``: commit timestamp -> the time retention counts
        from, or ``None`` when no offset of this group may expire now.
        """
        if self.protocol_type is not None:
            if self.is_in_state(ClassicGroupState.EMPTY):
                # Retention counts from when the group became Empty (or, for records without
                # a state timestamp, from the commit).
                empty_since_ms = self.current_state_timestamp_ms
                if empty_since_ms is None:
                    return lambda commit_timestamp_ms: commit_timestamp_ms
                return lambda _commit_timestamp_ms: empty_since_ms
            if (
                self.uses_consumer_protocol()
                and self.subscribed_topics is not None
                and self.is_in_state(ClassicGroupState.STABLE)
            ):
                # Offsets of topics the members no longer subscribe to expire by commit time.
                return lambda commit_timestamp_ms: commit_timestamp_ms
            return None
        # No protocol type: a simple consumer group, expired by commit time.
        return lambda commit_timestamp_ms: commit_timestamp_ms

    # ----------------------------------------------------------------------------------------
    # Records

    def to_group_metadata_value(self, assignments: dict[str, bytes]) -> GroupMetadataValue:
        """The record Kafka's ``GroupCoordinatorRecordHelpers.newGroupMetadataRecord`` writes."""
        members = []
        for member in self.members.values():
            assert self.protocol_name is not None, "non-empty group metadata without a protocol"
            members.append(
                MemberMetadata(
                    member_id=member.member_id,
                    group_instance_id=member.group_instance_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    rebalance_timeout_ms=member.rebalance_timeout_ms,
                    session_timeout_ms=member.session_timeout_ms,
                    subscription=member.metadata(self.protocol_name),
                    assignment=assignments[member.member_id],
                )
            )
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation_id,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp_ms=self._timestamp_or_default(),
            members=tuple(members),
        )

    def to_empty_group_metadata_value(self) -> GroupMetadataValue:
        """Kafka's ``newEmptyGroupMetadataRecord``: commits a newly created group."""
        return GroupMetadataValue(
            protocol_type="",
            generation=0,
            protocol=None,
            leader=None,
            current_state_timestamp_ms=self._timestamp_or_default(),
            members=(),
        )

    def _timestamp_or_default(self) -> int:
        ts = self.current_state_timestamp_ms
        return NO_TIMESTAMP if ts is None else ts

    @classmethod
    def from_group_metadata_value(cls, group_id: str, value: GroupMetadataValue) -> ClassicGroup:
        """Rebuild a group from its record (Kafka's ``GroupMetadataManager.replay``).

        With members it comes back Stable, without Empty; each member supports exactly the
        group's protocol with its subscription bytes and keeps its assignment.
        """
        protocol_name = value.protocol
        group = cls(
            group_id=group_id,
            state=ClassicGroupState.STABLE if value.members else ClassicGroupState.EMPTY,
            current_state_timestamp_ms=(
                None
                if value.current_state_timestamp_ms == NO_TIMESTAMP
                else value.current_state_timestamp_ms
            ),
            generation_id=value.generation,
            protocol_type=value.protocol_type or None,
            protocol_name=protocol_name,
            leader_id=value.leader,
            committed=value,
        )
        # Members go in directly, not through add(): a record is what it is, and replay must
        # not fail on one that add() would refuse (for example a repeated instance id; the
        # later member wins the instance id, as successive puts into Kafka's map would).
        for m in value.members:
            group.members[m.member_id] = ClassicGroupMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                # Records older than GroupMetadataValue v1 carry no rebalance timeout (the
                # codec reads -1): the session timeout stands in, as in Kafka's Scala
                # coordinator (its Java GroupMetadataManager.replay swaps only a -1 too); a
                # v1+ record's 0 stays 0.
                rebalance_timeout_ms=(
                    m.session_timeout_ms if m.rebalance_timeout_ms == -1 else m.rebalance_timeout_ms
                ),
                session_timeout_ms=m.session_timeout_ms,
                protocol_type=value.protocol_type,
                supported_protocols=(
                    JoinGroupRequestProtocol(name=protocol_name or "", metadata=m.subscription),
                ),
                assignment=m.assignment,
            )
            if m.group_instance_id is not None:
                group.static_members[m.group_instance_id] = m.member_id
        if group.members:
            # Kafka's add() sets the type from the first member and makes it leader when the
            # record names none.
            group.protocol_type = value.protocol_type
            if group.leader_id is None:
                group.leader_id = next(iter(group.members))
        group.subscribed_topics = group.compute_subscribed_topics()
        return group


def java_hash_map_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a ``java.util.HashMap`` of string keys put in this order (default
    capacity 16, load factor 0.75; few keys, so no tree bins): by bucket, the key's
    ``hashCode`` spread (``h ^ (h >>> 16)``) masked by the table size, then by insertion (a
    resize keeps each bucket's order)."""
    ordered = list(keys)
    capacity = 16
    while len(ordered) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(ordered, key=bucket)  # stable: insertion order within a bucket
