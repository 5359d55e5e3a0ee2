"""Classic members inside consumer groups, and converting groups between the two protocols
(KIP-848's online migration). A mixin of ``GroupCoordinatorShard``. Pure.

Kafka's ``GroupMetadataManager`` is the model; each method names the Kafka method it follows.

**A classic member of a consumer group** keeps speaking JoinGroup, SyncGroup, Heartbeat and
LeaveGroup with protocol type ``consumer``; the coordinator treats it as a member of the
consumer group with ``ClassicMemberMetadata`` (its session timeout and JoinGroup protocols):

- JoinGroup (``classicGroupJoinToConsumerGroup``) is the member's heartbeat with epoch 0 or
  its current epoch: its subscription and owned partitions come from the first protocol's
  ``ConsumerProtocolSubscription``, the server-side assignor computes the target, and the
  member reconciles exactly as a consumer-protocol member does (``CurrentAssignmentBuilder``):
  an eager client rejoins owning nothing, so it has revoked everything; a cooperative one
  reports what it still owns. The answer comes at once: generation = member epoch, the
  member's own first protocol, no leader (the client never runs its assignor).
- SyncGroup (``classicGroupSyncToConsumerGroup``) returns the member's *assigned* partitions
  (never those pending revocation, nor those another member has not released yet) as a
  ``ConsumerProtocolAssignment`` of the member's subscription version.
- Heartbeat (``classicGroupHeartbeatToConsumerGroup``) answers REBALANCE_IN_PROGRESS while
  the member is behind the group epoch, owes a revocation, or waits for partitions that are
  now free: the client rejoins and reconciles.
- LeaveGroup and a lapsed session, join or sync timeout fence the member like a consumer
  member; OffsetCommit with the wrong generation is ILLEGAL_GENERATION (not
  STALE_MEMBER_EPOCH).

Timers (keys under ``consumer-join/`` and ``consumer-sync/``, besides the session's): a
JoinGroup must follow a REBALANCE_IN_PROGRESS within the member's rebalance timeout, and a
SyncGroup must follow a JoinGroup within it; the session timeout is the member's own.

**Upgrade** (``convertToConsumerGroup``): a consumer-protocol member joining (epoch 0) a
non-empty classic group of protocol type ``consumer`` turns it into a consumer group. Every
classic member keeps its assignment (decoded from its SyncGroup bytes) as current and target
assignment, at member epoch = group epoch = assignment epoch = the classic generation. The
records: the classic group's tombstone, then member metadata, group epoch, target assignment
and its epoch, current assignments (``ConsumerGroup.createConsumerGroupRecords``). Parked
JoinGroup/SyncGroup requests are answered REBALANCE_IN_PROGRESS. Refused (GROUP_ID_NOT_FOUND,
as Kafka): another protocol type, more members than ``group.consumer.max.size``, an embedded
protocol that does not parse, or assignments carrying user data (a custom assignor).

**Downgrade** (``convertToClassicGroup``): when the last consumer-protocol member leaves (or
is fenced) and only classic members remain, at most ``group.max.size``, the group becomes a
classic group again: the consumer group's tombstones, then one GroupMetadata record with
generation = group epoch, the protocol the members vote for, and each member's *target*
assignment; the group then rebalances (PreparingRebalance) so the members rejoin.

Both conversions follow ``group.consumer.migration.policy`` (Kafka's default, bidirectional).
Kafka names a classic member of a consumer group with a random UUID; kcoord uses its member
id generator (``<client id>-<uuid>``), as for classic groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Final
from urllib.parse import quote

from kcoord.cluster.coordinator.classic import (
    EMPTY_ASSIGNMENT,
    ClassicGroup,
    ClassicGroupMember,
    ClassicGroupState,
)
from kcoord.cluster.coordinator.consumer import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerGroup,
    ConsumerGroupMember,
    MemberState,
    Partitions,
    current_assignment_record,
    group_epoch_record,
    group_tombstones,
    member_metadata_record,
    member_removal_records,
    target_epoch_record,
    target_member_record,
)
from kcoord.cluster.coordinator.consumer_protocol import (
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
)
from kcoord.cluster.coordinator.records import (
    ClassicMemberMetadata,
    ClassicProtocol,
    CoordinatorRecord,
    GroupMetadataKey,
)
from kcoord.cluster.coordinator.types import (
    UNKNOWN_MEMBER_ID,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    JoinGroupResponse,
    MemberIdentity,
    MemberResponse,
    SyncGroupRequest,
    SyncGroupResponse,
    Token,
)
from kcoord.cluster.coordinator.wire import WireFormatError
from kcoord.errors import Errors

if TYPE_CHECKING:
    from kcoord.cluster.coordinator.consumer_shard import TopicsView
    from kcoord.cluster.coordinator.shard import GroupConfig, _Output

# Timer keys of consumer-group members: <kind>/<group>/<member>, quoted.
SESSION_KEY: Final = "consumer-session"
REBALANCE_KEY: Final = "consumer-rebalance"
CLASSIC_JOIN_KEY: Final = "consumer-join"
CLASSIC_SYNC_KEY: Final = "consumer-sync"

# group.consumer.migration.policy (Kafka's ConsumerGroupMigrationPolicy).
MIGRATION_POLICIES: Final = ("bidirectional", "upgrade", "downgrade", "disabled")


def _timer_key(kind: str, group_id: str, member_id: str) -> str:
    return f"{kind}/{quote(group_id, safe='')}/{quote(member_id, safe='')}"


def session_key(group_id: str, member_id: str) -> str:
    return _timer_key(SESSION_KEY, group_id, member_id)


def rebalance_key(group_id: str, member_id: str) -> str:
    return _timer_key(REBALANCE_KEY, group_id, member_id)


def classic_join_key(group_id: str, member_id: str) -> str:
    return _timer_key(CLASSIC_JOIN_KEY, group_id, member_id)


def classic_sync_key(group_id: str, member_id: str) -> str:
    return _timer_key(CLASSIC_SYNC_KEY, group_id, member_id)


class UnconvertibleGroupError(ValueError):
    """The classic group cannot become a consumer group (GROUP_ID_NOT_FOUND)."""


def _names_to_ids(
    partitions: Iterable[tuple[str, Iterable[int]]], topics: TopicsView
) -> Partitions:
    """Topic names to ids (``Utils.toTopicPartitionMap``); unknown topics are dropped."""
    out: dict[str, frozenset[int]] = {}
    for name, ps in partitions:
        known = topics.get(name)
        if known is not None:
            out[known[0]] = out.get(known[0], frozenset()) | frozenset(ps)
    return {t: ps for t, ps in out.items() if ps}


def _ids_to_names(
    partitions: Mapping[str, frozenset[int]], names: Mapping[str, str]
) -> dict[str, frozenset[int]]:
    return {names[t]: ps for t, ps in partitions.items() if t in names and ps}


def _first_protocol(member: ConsumerGroupMember) -> ClassicProtocol:
    assert member.classic is not None and member.classic.supported_protocols, member.member_id
    return member.classic.supported_protocols[0]


def _subscription_version(member: ConsumerGroupMember, protocol_name: str | None = None) -> int:
    """The ConsumerProtocol version the member subscribed with (its assignment's version)."""
    assert member.classic is not None
    for protocol in member.classic.supported_protocols:
        if protocol_name is None or protocol.name == protocol_name:
            try:
                return decode_subscription(protocol.metadata).version
            except WireFormatError:
                return 0
    return 0


class ClassicMemberHandlers:
    """Mixed into ``GroupCoordinatorShard``; uses its timers, config and groups."""

    _config: GroupConfig
    _groups: dict[str, ClassicGroup]
    _consumer_groups: dict[str, ConsumerGroup]
    _new_member_id: Callable[[str], str]

    # Provided by the shard (and the KIP-848 mixin).
    def _schedule_consumer_timer(
        self, key: str, deadline_ms: int, group_id: str, member_id: str, kind: str
    ) -> None:
        raise NotImplementedError

    def _cancel_timer(self, key: str) -> None:
        raise NotImplementedError

    def _cancel_group_timers(self, group: ClassicGroup) -> None:
        raise NotImplementedError

    def _complete_join(
        self, out: _Output, member: ClassicGroupMember, response: JoinGroupResponse
    ) -> bool:
        raise NotImplementedError

    def _complete_sync(
        self, out: _Output, member: ClassicGroupMember, response: SyncGroupResponse
    ) -> bool:
        raise NotImplementedError

    def _reschedule_heartbeat(
        self,
        group: ClassicGroup,
        member: ClassicGroupMember,
        now_ms: int,
        timeout_ms: int | None = None,
    ) -> None:
        raise NotImplementedError

    def _prepare_rebalance(
        self, out: _Output, group: ClassicGroup, now_ms: int, reason: str | None = None
    ) -> None:
        raise NotImplementedError

    def _schedule_session(self, group_id: str, member: ConsumerGroupMember, now_ms: int) -> None:
        raise NotImplementedError

    def _update_and_reconcile(
        self,
        group: ConsumerGroup,
        old: ConsumerGroupMember | None,
        updated: ConsumerGroupMember,
        *,
        owned: Partitions | None,
        topics: TopicsView,
        out: _Output,
        now_ms: int,
    ) -> ConsumerGroupMember:
        raise NotImplementedError

    def _remove_consumer_members(
        self,
        group: ConsumerGroup,
        member_ids: list[str],
        now_ms: int,
        out: _Output,
        reason: str | None = None,
    ) -> None:
        raise NotImplementedError

    def _fits_a_batch(self, record: CoordinatorRecord) -> bool:
        raise NotImplementedError

    def _fit_a_batch(self, records: Sequence[CoordinatorRecord]) -> bool:
        raise NotImplementedError

    # -- JoinGroup ---------------------------------------------------------------------------

    def _classic_join_to_consumer_group(
        self,
        out: _Output,
        token: Token,
        request: JoinGroupRequest,
        group: ConsumerGroup,
        now_ms: int,
        *,
        topics: TopicsView,
    ) -> None:
        """``classicGroupJoinToConsumerGroup``."""

        def answer(error: Errors, member_id: str = request.member_id) -> None:
            out.respond(token, JoinGroupResponse(member_id=member_id, error_code=error))

        gid = group.group_id
        member_id = request.member_id or self._new_member_id(request.client_id)
        if (
            request.member_id not in group.members
            and len(group.members) >= self._config.consumer_max_size
        ):
            answer(Errors.GROUP_MAX_SIZE_REACHED)
            return
        if not self._supports_classic_protocols(group, request):
            answer(Errors.INCONSISTENT_GROUP_PROTOCOL)
            return
        if (
            request.group_instance_id is None
            and request.member_id == UNKNOWN_MEMBER_ID
            and request.require_known_member_id
        ):
            # KIP-394: the client retries with this id; nothing is stored until it does.
            answer(Errors.MEMBER_ID_REQUIRED, member_id)
            return
        try:
            subscription = decode_subscription(request.protocols[0].metadata)
        except WireFormatError:
            answer(Errors.INCONSISTENT_GROUP_PROTOCOL)
            return

        def as_joined(base: ConsumerGroupMember) -> ConsumerGroupMember:
            """``base`` with what this join says of the member."""
            return replace(
                base,
                # maybeUpdateInstanceId: a join without one leaves a static member's as it was.
                instance_id=(
                    base.instance_id
                    if request.group_instance_id is None
                    else request.group_instance_id
                ),
                rack_id=subscription.rack_id or base.rack_id,
                client_id=request.client_id or base.client_id,
                client_host=request.client_host or base.client_host,
                subscribed_topic_names=tuple(sorted(set(subscription.topics))),
                subscribed_topic_regex=None,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
                classic=ClassicMemberMetadata(
                    session_timeout_ms=request.session_timeout_ms,
                    supported_protocols=tuple(
                        ClassicProtocol(name=p.name, metadata=p.metadata) for p in request.protocols
                    ),
                ),
            )

        holder = None
        if request.group_instance_id is not None:
            holder = next(
                (m for m in group.members.values() if m.instance_id == request.group_instance_id),
                None,
            )
        # The member's record, before anything changes: one a batch cannot carry (protocol
        # metadata of a megabyte, a member id made from a client id of 32,767 bytes) was
        # written after the group had changed, and its refused write reloaded the whole
        # partition. Kafka fails that write alone (UNKNOWN_SERVER_ERROR) and reverts.
        known = group.members.get(member_id) or holder or ConsumerGroupMember(member_id=member_id)
        probe = as_joined(replace(known, member_id=member_id))
        if not self._fits_a_batch(member_metadata_record(gid, probe)):
            answer(Errors.UNKNOWN_SERVER_ERROR)
            return

        old: ConsumerGroupMember | None
        replaced_consumer_member = False
        if request.group_instance_id is not None:
            if request.member_id != UNKNOWN_MEMBER_ID:
                if holder is None:
                    answer(Errors.UNKNOWN_MEMBER_ID)
                    return
                if holder.member_id != request.member_id:
                    answer(Errors.FENCED_INSTANCE_ID)
                    return
                old = holder
            elif holder is not None:
                # getOrMaybeSubscribeStaticConsumerGroupMember: the new incarnation replaces
                # the old one at once, with its epoch and target assignment.
                group = self._replace_member(group, holder, member_id, out)
                old = group.members[member_id]
                replaced_consumer_member = holder.classic is None
            else:
                old = None
        else:
            old = group.members.get(member_id)

        updated = as_joined(old or ConsumerGroupMember(member_id=member_id))
        owned = _names_to_ids(subscription.owned_partitions, topics)
        reconciled = self._update_and_reconcile(
            group,
            old,
            updated,
            owned=owned,
            topics=topics,
            out=out,
            now_ms=now_ms,
        )
        joined = JoinGroupResponse(
            generation_id=reconciled.member_epoch,
            protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=request.protocols[0].name,
            leader="",  # nobody: the coordinator assigns
            member_id=member_id,
        )
        if replaced_consumer_member:
            # validateOnlineDowngradeWithReplacedMember: the static member this classic
            # incarnation replaced was the group's last consumer-protocol member, so the group
            # becomes a classic group now, Stable, the new incarnation holding what the old
            # one was given; a rebalance if it subscribes to other topics than the old one
            # did (convertToClassicGroup's hasSubscriptionChanged), or if a member is not
            # at its target yet: the classic group's assignments are what each member holds,
            # and Stable with one short of its target, its heartbeats were answered NONE and
            # those partitions were consumed by nobody until another rebalance (Kafka writes
            # the targets, which such a member's SyncGroup had not handed out).
            assert holder is not None
            rejoined = replace(group, members={**group.members, member_id: reconciled})
            changed = (
                updated.subscribed_topic_names != holder.subscribed_topic_names
                or holder.subscribed_topic_regex is not None
                or not all(
                    m.state is MemberState.STABLE and m.member_epoch == group.group_epoch
                    for m in rejoined.members.values()
                )
            )
            if self._can_downgrade(rejoined, ()) and self._convert_to_classic_group(
                rejoined, (), now_ms, out, rebalance=changed
            ):
                # The classic group's generation, not the epoch this join's records bumped (the
                # conversion drops them): else its SyncGroup was ILLEGAL_GENERATION, and that
                # generation handed out again later.
                out.respond(token, replace(joined, generation_id=rejoined.group_epoch))
                return
        self._cancel_timer(classic_join_key(gid, member_id))
        self._schedule_session(gid, reconciled, now_ms)
        self._schedule_consumer_timer(
            classic_sync_key(gid, member_id),
            now_ms + max(request.rebalance_timeout_ms, 0),
            gid,
            member_id,
            CLASSIC_SYNC_KEY,
        )
        out.respond(token, joined)

    def _supports_classic_protocols(self, group: ConsumerGroup, request: JoinGroupRequest) -> bool:
        """``throwIfClassicProtocolIsNotSupported``: protocol type ``consumer``, and a
        protocol every classic member of the group supports."""
        if request.protocol_type != CONSUMER_PROTOCOL_TYPE or not request.protocols:
            return False
        others = [
            m
            for m in group.members.values()
            if m.classic is not None and m.member_id != request.member_id
        ]
        names = {p.name for p in request.protocols}
        for member in others:
            assert member.classic is not None
            names &= {p.name for p in member.classic.supported_protocols}
        return bool(names)

    def _replace_member(
        self,
        group: ConsumerGroup,
        holder: ConsumerGroupMember,
        member_id: str,
        out: _Output,
    ) -> ConsumerGroup:
        """A static member's new incarnation takes the old one's place, epoch and target:
        tombstones for the old id, records for the new (``replaceMember``)."""
        gid = group.group_id
        for record in member_removal_records(gid, holder.member_id):
            out.write(record)
        self._cancel_member_timers(gid, holder.member_id)
        replacement = replace(
            holder,
            member_id=member_id,
            member_epoch=0 if holder.classic is not None else holder.previous_member_epoch,
            previous_member_epoch=0,
        )
        target = group.targets.get(holder.member_id, {})
        out.write(member_metadata_record(gid, replacement))
        out.write(target_member_record(gid, member_id, dict(target)))
        out.write(current_assignment_record(gid, replacement))
        members = {k: v for k, v in group.members.items() if k != holder.member_id}
        targets = {k: v for k, v in group.targets.items() if k != holder.member_id}
        members[member_id], targets[member_id] = replacement, dict(target)
        return replace(group, members=members, targets=targets)

    # -- SyncGroup ---------------------------------------------------------------------------

    def _classic_sync_to_consumer_group(
        self,
        out: _Output,
        token: Token,
        request: SyncGroupRequest,
        group: ConsumerGroup,
        now_ms: int,
    ) -> None:
        """``classicGroupSyncToConsumerGroup``."""
        member, error = self._classic_member(group, request.member_id, request.group_instance_id)
        if member is None or member.classic is None:
            out.respond(token, SyncGroupResponse(error_code=error or Errors.UNKNOWN_MEMBER_ID))
            return
        if request.generation_id != member.member_epoch:
            out.respond(token, SyncGroupResponse(error_code=Errors.ILLEGAL_GENERATION))
            return
        protocol = _first_protocol(member)
        if (
            request.protocol_type is not None and request.protocol_type != CONSUMER_PROTOCOL_TYPE
        ) or (request.protocol_name is not None and request.protocol_name != protocol.name):
            out.respond(token, SyncGroupResponse(error_code=Errors.INCONSISTENT_GROUP_PROTOCOL))
            return
        gid = group.group_id
        if (
            group.group_epoch > member.member_epoch
            and member.state is not MemberState.UNREVOKED_PARTITIONS
        ):
            self._schedule_classic_join_timeout(gid, member, now_ms)
            out.respond(token, SyncGroupResponse(error_code=Errors.REBALANCE_IN_PROGRESS))
            return
        self._cancel_timer(classic_sync_key(gid, member.member_id))
        self._schedule_session(gid, member, now_ms)
        names = {topic_id: name for topic_id, (name, _) in group.subscribed_topics.items()}
        out.respond(
            token,
            SyncGroupResponse(
                protocol_type=request.protocol_type,
                protocol_name=request.protocol_name,
                assignment=encode_assignment(
                    _subscription_version(member, protocol.name),
                    _ids_to_names(member.assigned, names),
                ),
            ),
        )

    def _classic_member(
        self, group: ConsumerGroup, member_id: str, instance_id: str | None
    ) -> tuple[ConsumerGroupMember | None, Errors | None]:
        """``validateConsumerGroupMember`` plus ``throwIfMemberDoesNotUseClassicProtocol``."""
        if instance_id is None:
            member = group.members.get(member_id)
            return (member, None) if member is not None and member.classic else (None, None)
        holder = next((m for m in group.members.values() if m.instance_id == instance_id), None)
        if holder is None:
            return None, Errors.UNKNOWN_MEMBER_ID
        if holder.member_id != member_id:
            return None, Errors.FENCED_INSTANCE_ID
        return (holder, None) if holder.classic else (None, None)

    # -- Heartbeat ---------------------------------------------------------------------------

    def _classic_heartbeat_to_consumer_group(
        self, request: HeartbeatRequest, group: ConsumerGroup, now_ms: int
    ) -> Errors:
        """``classicGroupHeartbeatToConsumerGroup``."""
        member, error = self._classic_member(group, request.member_id, request.group_instance_id)
        if member is None:
            return error or Errors.UNKNOWN_MEMBER_ID
        if request.generation_id != member.member_epoch:
            return Errors.ILLEGAL_GENERATION
        gid = group.group_id
        self._schedule_session(gid, member, now_ms)
        if (
            member.member_epoch < group.group_epoch
            or member.state is MemberState.UNREVOKED_PARTITIONS
            or (
                member.state is MemberState.UNRELEASED_PARTITIONS
                and not _waits_on_unreleased(group, member)
            )
        ):
            self._schedule_classic_join_timeout(gid, member, now_ms)
            return Errors.REBALANCE_IN_PROGRESS
        return Errors.NONE

    def _schedule_classic_join_timeout(
        self, group_id: str, member: ConsumerGroupMember, now_ms: int
    ) -> None:
        """``scheduleConsumerGroupJoinTimeoutIfAbsent``: rejoin within the rebalance timeout."""
        key = classic_join_key(group_id, member.member_id)
        if self._has_timer(key):
            return
        self._schedule_consumer_timer(
            key,
            now_ms + max(member.rebalance_timeout_ms, 0),
            group_id,
            member.member_id,
            CLASSIC_JOIN_KEY,
        )

    def _has_timer(self, key: str) -> bool:
        raise NotImplementedError

    # -- LeaveGroup --------------------------------------------------------------------------

    def _classic_leave_consumer_group(
        self,
        group: ConsumerGroup,
        identities: tuple[MemberIdentity, ...],
        now_ms: int,
        out: _Output,
    ) -> tuple[MemberResponse, ...]:
        """``classicGroupLeaveToConsumerGroup``: every valid member is fenced at once (an
        admin may remove consumer-protocol members this way too)."""
        responses: list[MemberResponse] = []
        leaving: list[str] = []
        for identity in identities:
            member_id, instance_id = identity.member_id, identity.group_instance_id
            error = Errors.NONE
            if instance_id is None:
                if member_id not in group.members:
                    error = Errors.UNKNOWN_MEMBER_ID
            else:
                holder = next(
                    (m for m in group.members.values() if m.instance_id == instance_id), None
                )
                if holder is None:
                    error = Errors.UNKNOWN_MEMBER_ID
                elif member_id not in (UNKNOWN_MEMBER_ID, holder.member_id):
                    error = Errors.FENCED_INSTANCE_ID
                else:
                    member_id = holder.member_id
            if error is Errors.NONE and member_id not in leaving:
                leaving.append(member_id)
            responses.append(
                MemberResponse(
                    member_id=identity.member_id, group_instance_id=instance_id, error_code=error
                )
            )
        if leaving:
            self._remove_consumer_members(
                group, leaving, now_ms, out, f"Removing {', '.join(leaving)} on LeaveGroup"
            )
        return tuple(responses)

    # -- timers ------------------------------------------------------------------------------

    def _cancel_member_timers(self, group_id: str, member_id: str) -> None:
        raise NotImplementedError

    # -- Upgrade: classic -> consumer ---------------------------------------------------------

    def _decode_for_upgrade(
        self, classic: ClassicGroup, topics: TopicsView
    ) -> list[tuple[ClassicGroupMember, Subscription, Partitions]]:
        """``validateOnlineUpgrade`` and the decoding of ``convertToConsumerGroup``, with no
        side effect: each member, its subscription and its SyncGroup assignment. Raises
        UnconvertibleGroupError."""
        if self._config.consumer_migration_policy not in ("bidirectional", "upgrade"):
            raise UnconvertibleGroupError(
                f"Cannot upgrade classic group {classic.group_id} to consumer group because "
                "the online upgrade is disabled."
            )
        if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
            raise UnconvertibleGroupError(
                f"Cannot upgrade classic group {classic.group_id} to consumer group because "
                "it is not using the consumer protocol."
            )
        if classic.num_members > self._config.consumer_max_size:
            raise UnconvertibleGroupError(
                f"Cannot upgrade classic group {classic.group_id} to consumer group because "
                "its size exceeds the consumer group maximum size."
            )
        decoded = []
        for cm in classic.members.values():
            try:
                subscription = decode_subscription(cm.metadata(classic.protocol_name))
                assignment = decode_assignment(
                    b"" if cm.assignment == EMPTY_ASSIGNMENT else cm.assignment
                )
            except (WireFormatError, ValueError) as e:
                raise UnconvertibleGroupError(
                    f"Cannot upgrade classic group {classic.group_id} to consumer group because "
                    f"the embedded consumer protocol is malformed: {e}"
                ) from e
            if assignment.user_data:
                raise UnconvertibleGroupError(
                    f"Cannot upgrade classic group {classic.group_id} to consumer group because "
                    "an unsupported custom assignor is in use. Please refer to the documentation "
                    "or switch to a default assignor before re-attempting the upgrade."
                )
            decoded.append((cm, subscription, _names_to_ids(assignment.partitions, topics)))
        return decoded

    def _convert_to_consumer_group(
        self,
        classic: ClassicGroup,
        topics: TopicsView,
        now_ms: int,
        out: _Output,
        joining: CoordinatorRecord,
    ) -> ConsumerGroup | None:
        """``convertToConsumerGroup``: the records of the new group, and the group as they
        will make it (the caller carries on with it before they are replayed). Raises
        UnconvertibleGroupError. Only the converted members' session timers start; the rest
        (``_finish_conversion``) waits until the caller's whole write is known to fit one
        batch.

        None, with nothing done, when those records and the ``joining`` member's would not
        fit one batch: each classic member's record carries every protocol it offered, where
        the classic group's one record carried the chosen one, so a group whose record fit
        may not fit converted; the refused write reloaded the whole partition, at each of
        the client's retries. Kafka fails that heartbeat alone and reverts."""
        decoded = self._decode_for_upgrade(classic, topics)
        group = ConsumerGroup(
            classic.group_id,
            group_epoch=classic.generation_id,
            assignment_epoch=classic.generation_id,
        )
        # What a member may still hold: its last SyncGroup assignment, and what its last join
        # said it owns (a cooperative member keeps its partitions through a rebalance; leaving
        # CompletingRebalance cleared its stored assignment, and a consumer member converted in
        # then was given them while it still consumed them). A claimed partition that another
        # member's assignment holds, or an earlier member claimed, is not added: two members
        # holding one partition broke the group's one-owner rule (Kafka's addPartitionEpochs
        # refuses it) when the stored assignments were targets (a group Kafka downgraded: its
        # fromConsumerGroup writes them).
        taken = {(t, p) for _, _, assigned in decoded for t, ps in assigned.items() for p in ps}
        for cm, subscription, assigned in decoded:
            owned = _names_to_ids(subscription.owned_partitions, topics)
            extra = {(t, p) for t, ps in owned.items() for p in ps} - taken
            taken |= extra
            for t, p in extra:
                assigned[t] = assigned.get(t, frozenset()) | {p}
            member = ConsumerGroupMember(
                member_id=cm.member_id,
                instance_id=cm.group_instance_id,
                rack_id=subscription.rack_id,
                client_id=cm.client_id,
                client_host=cm.client_host,
                subscribed_topic_names=tuple(sorted(set(subscription.topics))),
                rebalance_timeout_ms=cm.rebalance_timeout_ms,
                classic=ClassicMemberMetadata(
                    session_timeout_ms=cm.session_timeout_ms,
                    supported_protocols=tuple(
                        ClassicProtocol(name=p.name, metadata=p.metadata)
                        for p in cm.supported_protocols
                    ),
                ),
                member_epoch=classic.generation_id,
                previous_member_epoch=classic.generation_id,
                state=MemberState.STABLE,
                assigned=assigned,
                # As its record says (written at this epoch), for steps before it is replayed.
                assignment_epochs={
                    t: dict.fromkeys(ps, classic.generation_id) for t, ps in assigned.items()
                },
            )
            group.members[member.member_id] = member
            group.subscriptions_version += 1
            group.targets[member.member_id] = dict(assigned)

        gid = group.group_id
        records = [CoordinatorRecord(GroupMetadataKey(group_id=gid), None)]
        records += [member_metadata_record(gid, member) for member in group.members.values()]
        records.append(group_epoch_record(gid, group.group_epoch))
        records += [target_member_record(gid, m, target) for m, target in group.targets.items()]
        records.append(target_epoch_record(gid, group.assignment_epoch))
        records += [current_assignment_record(gid, member) for member in group.members.values()]
        if not self._fit_a_batch([*out.records, *records, joining]):
            return None
        for record in records:
            out.write(record)
        for member in group.members.values():
            self._schedule_session(gid, member, now_ms)  # cancelled again if it fails
        return group

    def _finish_conversion(self, classic: ClassicGroup, out: _Output) -> None:
        """The rest of ``convertToConsumerGroup``: parked requests and the classic timers go
        with the classic group."""
        for cm in classic.members.values():
            self._complete_join(
                out,
                cm,
                JoinGroupResponse(member_id=cm.member_id, error_code=Errors.REBALANCE_IN_PROGRESS),
            )
            self._complete_sync(out, cm, SyncGroupResponse(error_code=Errors.REBALANCE_IN_PROGRESS))
        self._cancel_group_timers(classic)

    # -- Downgrade: consumer -> classic -------------------------------------------------------

    def _can_downgrade(self, group: ConsumerGroup, leaving: Iterable[str]) -> bool:
        """``validateOnlineDowngradeWithFencedMembers``."""
        gone = set(leaving)
        remaining = [m for m in group.members.values() if m.member_id not in gone]
        return (
            self._config.consumer_migration_policy in ("bidirectional", "downgrade")
            and bool(remaining)
            and all(m.classic is not None for m in remaining)
            and len(remaining) <= self._config.max_size
        )

    def _convert_to_classic_group(
        self,
        group: ConsumerGroup,
        leaving: Iterable[str],
        now_ms: int,
        out: _Output,
        *,
        rebalance: bool = True,
    ) -> bool:
        """``convertToClassicGroup`` and ``ClassicGroup.fromConsumerGroup``: the consumer
        group's tombstones, one GroupMetadata record, and a rebalance of the classic group
        (made here, as Kafka does; replaying the record then only notes it committed). No
        rebalance when a static member's classic incarnation replaced the last consumer one
        (Kafka's conversion with a joining member).

        False, with nothing done, when those records and the call's own would not fit the
        one batch they are written in (the classic members' metadata, each member's record
        fitting, can be too large together): the refused write reloaded the whole partition,
        and a departed member's session timer, armed again by the reload, wrote it again for
        ever. The caller removes the members from the consumer group instead. Kafka converts,
        fails that write alone and reverts (its timeline)."""
        gone = set(leaving)
        classic = ClassicGroup(
            group_id=group.group_id,
            state=ClassicGroupState.STABLE,
            current_state_timestamp_ms=now_ms,
            generation_id=group.group_epoch,
            protocol_type=CONSUMER_PROTOCOL_TYPE,
        )
        for member in group.members.values():
            if member.member_id in gone:
                continue
            assert member.classic is not None
            classic.add(
                ClassicGroupMember(
                    member_id=member.member_id,
                    group_instance_id=member.instance_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    rebalance_timeout_ms=member.rebalance_timeout_ms,
                    session_timeout_ms=member.classic.session_timeout_ms,
                    protocol_type=CONSUMER_PROTOCOL_TYPE,
                    supported_protocols=tuple(
                        JoinGroupRequestProtocol(name=p.name, metadata=p.metadata)
                        for p in member.classic.supported_protocols
                    ),
                )
            )
        classic.protocol_name = classic.select_protocol()
        names = {topic_id: name for topic_id, (name, _) in group.subscribed_topics.items()}
        assignments = {}
        for member_id, cm in classic.members.items():
            member = group.members[member_id]
            # What the member holds, not its target (Kafka's fromConsumerGroup writes the
            # target): an upgrade before the members rejoin reads these back as what each
            # holds, and gave a new consumer member, at once, a partition a classic member
            # had not given up (review helper-284). Without a rebalance every member is at
            # its target, which is then the same.
            held = {
                t: member.assigned.get(t, frozenset())
                | member.pending_revocation.get(t, frozenset())
                for t in member.assigned.keys() | member.pending_revocation.keys()
            }
            assignments[member_id] = encode_assignment(
                _subscription_version(member, classic.protocol_name),
                _ids_to_names(held, names),
            )
            cm.assignment = assignments[member_id]
        classic.subscribed_topics = classic.compute_subscribed_topics()
        records = [
            *group_tombstones(group),
            CoordinatorRecord(
                GroupMetadataKey(group_id=group.group_id),
                classic.to_group_metadata_value(assignments),
            ),
        ]
        if not self._fit_a_batch([*out.records, *records]):
            return False
        for member_id in group.members:
            self._cancel_member_timers(group.group_id, member_id)
        for record in records:
            out.write(record)
        self._groups[group.group_id] = classic
        for cm in classic.members.values():
            self._reschedule_heartbeat(classic, cm, now_ms)
        if rebalance:
            self._prepare_rebalance(
                out,
                classic,
                now_ms,
                f"Downgrade group {classic.group_id} from consumer to classic.",
            )
        return True


def _waits_on_unreleased(group: ConsumerGroup, member: ConsumerGroupMember) -> bool:
    """``ConsumerGroup.waitingOnUnreleasedPartition``: a partition of its target is still
    held by another member."""
    owners = group.partition_owners(excluding=member.member_id)
    for topic_id, partitions in group.targets.get(member.member_id, {}).items():
        held = member.assigned.get(topic_id, frozenset())
        for p in partitions - held:
            if (topic_id, p) in owners:
                return True
    return False
