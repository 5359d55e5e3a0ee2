"""The shard's KIP-848 handlers (``GroupMetadataManager.consumerGroupHeartbeat`` and friends),
a mixin of ``GroupCoordinatorShard`` kept apart from the classic protocol. Pure.

The group logic and the records are in ``consumer.py``; this module is the request handling:
validation, the heartbeat's steps, timers, ConsumerGroupDescribe, and what the classic APIs
(ListGroups, DescribeGroups, DeleteGroups, OffsetCommit) do with a consumer group.

A heartbeat needs the subscribed topics' metadata (ids and partition counts): the caller passes
the current metadata image's view as ``topics`` (name -> (topic id, partition count)), so the
shard stays pure and a replica replays the same records whatever its own image says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from kcoord.cluster.coordinator.assignors import DEFAULT_ASSIGNORS
from kcoord.cluster.coordinator.consumer import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerGroupMember,
    InvalidRegexError,
    MemberState,
    Partitions,
    TopicId,
    assignor_name,
    compile_subscription_regex,
    compute_targets,
    current_assignment_record,
    group_epoch_record,
    group_tombstones,
    member_metadata_record,
    member_removal_records,
    partition_metadata_record,
    reconcile,
    subscribed_topics,
    target_epoch_record,
    target_member_record,
    validate_member_epoch,
)
from kcoord.cluster.coordinator.consumer_classic import (
    REBALANCE_KEY,
    SESSION_KEY,
    ClassicMemberHandlers,
    UnconvertibleGroupError,
    classic_join_key,
    classic_sync_key,
    rebalance_key,
    session_key,
)
from kcoord.cluster.coordinator.group_config import (
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    CONSUMER_SESSION_TIMEOUT_MS,
    GroupConfigLookup,
    group_config_int,
)
from kcoord.cluster.coordinator.records import CoordinatorRecord, GroupMetadataKey
from kcoord.cluster.coordinator.timeline import RebalanceEvent
from kcoord.cluster.coordinator.types import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    DescribedConsumerGroup,
    DescribedConsumerGroupMember,
    Token,
    TopicIdPartitions,
)
from kcoord.errors import Errors

if TYPE_CHECKING:
    from kcoord.cluster.coordinator.shard import CoordinatorStats, GroupConfig, _Output

# The error of one partition (topic name, index) of an OffsetCommit checked partition by
# partition (KIP-1251).
CommitPartitionCheck = Callable[[str, int], Errors]

TopicsView = Mapping[str, tuple[str, int]]  # topic name -> (topic id, partition count)


def _as_wire(partitions: Mapping[str, frozenset[int]]) -> TopicIdPartitions:
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(partitions.items()) if ps)


def _is_full_request(request: ConsumerGroupHeartbeatRequest) -> bool:
    """A heartbeat carrying every field a join carries (consumerGroupHeartbeat's
    ``isFullRequest``): a client sends one after an error or a lost answer."""
    subscribed = (
        request.subscribed_topic_names is not None or request.subscribed_topic_regex is not None
    )
    return (
        request.rebalance_timeout_ms != -1 and subscribed and request.topic_partitions is not None
    )


# GroupCoordinatorService.CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION
CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION: Final = 1
# What Java's String.trim() strips from both ends: every character up to U+0020.
_JAVA_TRIMMED: Final = "".join(map(chr, range(0x21)))
SUBSCRIPTION_TOO_LARGE: Final = (
    "The member's subscription is too large for a record of __consumer_offsets."
)
GROUP_TOO_LARGE_TO_CONVERT: Final = (
    "The classic group's members are too large for one batch of __consumer_offsets as a "
    "consumer group."
)
HEARTBEAT_RECORDS_TOO_LARGE: Final = (
    "The heartbeat's records (the group's new target assignment) are too large for a batch "
    "of __consumer_offsets."
)


def _too_large(
    request: ConsumerGroupHeartbeatRequest, message: str
) -> ConsumerGroupHeartbeatResponse:
    """A heartbeat whose records would not fit: Kafka's answer for a record too large
    (GroupCoordinatorService.handleOperationException)."""
    return ConsumerGroupHeartbeatResponse(
        error_code=Errors.UNKNOWN_SERVER_ERROR,
        error_message=message,
        member_id=request.member_id or None,
    )


def _is_empty_string(value: str | None) -> bool:
    """The condition of Kafka's ``Utils.throwIfEmptyString``: not null, and empty once
    trimmed (a string of spaces is empty)."""
    return value is not None and not value.strip(_JAVA_TRIMMED)


def _owned(raw: TopicIdPartitions | None) -> Partitions | None:
    if raw is None:
        return None
    out: dict[str, frozenset[int]] = {}
    for topic_id, partitions in raw:
        out[topic_id] = out.get(topic_id, frozenset()) | frozenset(partitions)
    return out


class ConsumerGroupHandlers(ClassicMemberHandlers):
    """Mixed into ``GroupCoordinatorShard``; uses its timers, config, groups and offsets."""

    _config: GroupConfig
    stats: CoordinatorStats
    _group_configs: GroupConfigLookup
    _consumer_groups: dict[str, ConsumerGroup]
    _new_member_id: Callable[[str], str]

    # Provided by the shard.
    def _schedule_consumer_timer(
        self, key: str, deadline_ms: int, group_id: str, member_id: str, kind: str
    ) -> None:
        raise NotImplementedError

    def _cancel_timer(self, key: str) -> None:
        raise NotImplementedError

    def _fits_a_batch(self, record: CoordinatorRecord) -> bool:
        raise NotImplementedError

    def _fit_a_batch(self, records: Sequence[CoordinatorRecord]) -> bool:
        raise NotImplementedError

    def _member_record_fits(self, request: ConsumerGroupHeartbeatRequest) -> bool:
        return self._fits_a_batch(member_metadata_record(request.group_id, _as_written(request)))

    # -- ConsumerGroupHeartbeat (68) --------------------------------------------------------------

    def _consumer_group_heartbeat_into(
        self,
        token: Token,
        request: ConsumerGroupHeartbeatRequest,
        now_ms: int,
        topics: TopicsView,
        out: _Output,
    ) -> None:
        records, responses = len(out.records), len(out.responses)  # before any of this one's
        error, message = validate_heartbeat_request(request, self._config.consumer_assignors)
        group: ConsumerGroup | None = None
        if error is Errors.NONE:
            group = self._consumer_groups.get(request.group_id)
            classic = self._groups.get(request.group_id) if group is None else None
            if classic is not None and request.member_epoch != 0:
                # getOrMaybeCreateConsumerGroup: only a joining member creates or converts.
                error = Errors.GROUP_ID_NOT_FOUND
                message = f"Group {request.group_id} is not a consumer group."
            elif group is None and classic is None and request.member_epoch != 0:
                # A heartbeat or leave of a member to a group that does not exist (deleted, or
                # its empty shell expired): getOrMaybeCreateConsumerGroup / consumerGroup.
                error = Errors.GROUP_ID_NOT_FOUND
                message = f"Consumer group {request.group_id} not found."
            elif classic is not None and classic.num_members > self._config.consumer_max_size:
                # validateOnlineUpgrade: a classic group larger than a consumer group may be
                # is not converted (a refused join leaves it as it was).
                error = Errors.GROUP_ID_NOT_FOUND
                message = (
                    f"Cannot upgrade classic group {request.group_id} to consumer group because "
                    f"its size exceeds the maximum ({self._config.consumer_max_size})."
                )
            elif classic is not None and classic.num_members == self._config.consumer_max_size:
                # Kafka converts it, then refuses the joining member (throwIfConsumerGroupIsFull)
                # and the failed write leaves the classic group as it was; a group it would not
                # convert is refused for that first (GROUP_ID_NOT_FOUND).
                try:
                    self._decode_for_upgrade(classic, topics)
                except UnconvertibleGroupError as e:
                    error, message = Errors.GROUP_ID_NOT_FOUND, str(e)
                else:
                    error = Errors.GROUP_MAX_SIZE_REACHED
                    message = f"The group {request.group_id} has reached its maximum size."
            elif classic is not None and not self._member_record_fits(request):
                # Refused before the classic group is converted or dropped: Kafka writes none
                # of a failed heartbeat's records, the conversion's neither.
                error, message = Errors.UNKNOWN_SERVER_ERROR, SUBSCRIPTION_TOO_LARGE
            elif classic is not None and classic.num_members > 0:
                joining = member_metadata_record(request.group_id, _as_written(request))
                try:
                    group = self._convert_to_consumer_group(classic, topics, now_ms, out, joining)
                except UnconvertibleGroupError as e:
                    error, message = Errors.GROUP_ID_NOT_FOUND, str(e)
                else:
                    if group is None:
                        error, message = Errors.UNKNOWN_SERVER_ERROR, GROUP_TOO_LARGE_TO_CONVERT
            elif classic is not None:
                # An empty classic group (or one with only offsets) just goes, and its timers
                # with it when its tombstone is replayed
                # (createGroupTombstoneRecordsAndCancelTimers): one still in its initial
                # rebalance has its delayed join armed, which fired into a later classic group
                # of the same id and raised out of on_timer.
                out.write(classic_tombstone(request.group_id))
        if error is not Errors.NONE:
            out.respond(
                token,
                ConsumerGroupHeartbeatResponse(
                    error_code=error, error_message=message, member_id=request.member_id or None
                ),
            )
            return
        if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            self._consumer_leave(token, request, now_ms, out)
            return
        converted = classic is not None and classic.num_members > 0
        self._consumer_heartbeat(
            token,
            request,
            group or ConsumerGroup(request.group_id),
            now_ms,
            topics=topics,
            out=out,
        )
        if converted and not self._fit_a_batch(out.records[records:]):
            # The conversion's records fit, not with the heartbeat's (the new target
            # assignment): nothing of the conversion has happened but its records and the
            # heartbeat's timers, so the classic group goes on as it was.
            assert group is not None
            # The joining member's id: the one it was given, if it sent none (version 0).
            joined = {
                response.member_id
                for answered, response in out.responses[responses:]
                if answered == token and isinstance(response, ConsumerGroupHeartbeatResponse)
            }
            del out.records[records:], out.responses[responses:]
            for member_id in {*group.members, request.member_id, *joined}:  # consumer timers
                if member_id:
                    self._cancel_member_timers(group.group_id, member_id)
            out.respond(token, _too_large(request, HEARTBEAT_RECORDS_TOO_LARGE))
            return
        if converted:
            assert classic is not None
            self._finish_conversion(classic, out)
            return
        if not self._fit_a_batch(out.records[records:]):
            # A target assignment of thousands of members is more than one batch holds: the
            # log refused the write, and the refused write of a handler that may have changed
            # its group reloaded the whole partition, every group of it, at each retry. This
            # one changed nothing but through its records (an empty classic group's tombstone
            # included) and its timers: the records are dropped, the timers of the members it
            # touched armed again (it may have cancelled a static member's it replaced, or the
            # requesting member's rebalance timeout), and it alone fails, as Kafka's runtime
            # fails the write and reverts (UNKNOWN_SERVER_ERROR for a record too large,
            # GroupCoordinatorService.handleOperationException).
            del out.records[records:], out.responses[responses:]
            if group is not None:
                for member in group.members.values():
                    if member.member_id == request.member_id or (
                        request.instance_id is not None
                        and member.instance_id == request.instance_id
                    ):
                        self._arm_member_timers(group.group_id, member, now_ms)
            out.respond(token, _too_large(request, HEARTBEAT_RECORDS_TOO_LARGE))

    def _consumer_leave(
        self, token: Token, request: ConsumerGroupHeartbeatRequest, now_ms: int, out: _Output
    ) -> None:
        """``consumerGroupLeave``. A static member leaving with epoch -2 (it will be back, e.g.
        a rolling restart) keeps its assignment and its place until its session times out;
        a member with its instance id takes them over without a rebalance (KIP-345 for 848)."""
        group = self._consumer_groups[request.group_id]  # checked by the caller
        member = group.members.get(request.member_id)
        unknown_or_fenced = self._unknown_or_fenced_member(group, request, member)
        if unknown_or_fenced is not None:
            out.respond(token, unknown_or_fenced)
            return
        assert member is not None
        if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and member.instance_id:
            # consumerGroupStaticMemberGroupLeave: what it was revoking is released (it closed,
            # having revoked), so the member waiting for those partitions gets them at once
            # rather than after the session timeout; its previous epoch is kept.
            leaving = replace(
                member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH, pending_revocation={}
            )
            out.write(current_assignment_record(request.group_id, leaving))
            self._cancel_timer(rebalance_key(request.group_id, member.member_id))
        else:
            self._remove_consumer_members(
                group, [member.member_id], now_ms, out, f"member {member.member_id} left"
            )
        out.respond(
            token,
            ConsumerGroupHeartbeatResponse(
                member_id=member.member_id, member_epoch=request.member_epoch
            ),
        )

    @staticmethod
    def _unknown_or_fenced_member(
        group: ConsumerGroup,
        request: ConsumerGroupHeartbeatRequest,
        old: ConsumerGroupMember | None,
    ) -> ConsumerGroupHeartbeatResponse | None:
        """The refusal of a heartbeat (epoch > 0) from a member the group does not know. A
        static member is found by its instance id: one held by another member id means it was
        replaced, FENCED_INSTANCE_ID (``getOrMaybeSubscribeStaticConsumerGroupMember``:
        ``throwIfStaticMemberIsUnknown``, ``throwIfInstanceIdIsFenced``)."""
        if request.instance_id is not None:
            static = next(
                (m for m in group.members.values() if m.instance_id == request.instance_id), None
            )
            if static is None:
                error = Errors.UNKNOWN_MEMBER_ID
                message = f"Instance id {request.instance_id} is unknown."
            elif static.member_id != request.member_id:
                error = Errors.FENCED_INSTANCE_ID
                message = (
                    f"Static member {request.member_id} with instance id {request.instance_id} "
                    f"was fenced by member {static.member_id}."
                )
            else:
                return None
        elif old is None:
            error = Errors.UNKNOWN_MEMBER_ID
            message = f"Member {request.member_id} is not a member of the group."
        else:
            return None
        return ConsumerGroupHeartbeatResponse(
            error_code=error, error_message=message, member_id=request.member_id
        )

    def _replace_static_member(
        self,
        group: ConsumerGroup,
        request: ConsumerGroupHeartbeatRequest,
        out: _Output,
    ) -> ConsumerGroupMember | Errors | None:
        """``maybeReplaceStaticMember``: a joining member whose instance id belongs to a
        member that left temporarily takes over its member epoch and assignment (records under
        the new member id, tombstones for the old one); an instance id in use by a live member
        is UNRELEASED_INSTANCE_ID. None when there is nobody to replace."""
        if request.instance_id is None:
            return None
        existing = next(
            (m for m in group.members.values() if m.instance_id == request.instance_id), None
        )
        if existing is None or existing.member_id == request.member_id:
            # The static member itself, back with its own member id (its join's answer was
            # lost, or it was told FENCED_MEMBER_EPOCH): a rejoin, as a dynamic member's.
            # Released Kafka answers UNRELEASED_INSTANCE_ID, fatal for the Java client; open
            # apache/kafka#23542 makes it a rejoin too.
            return None
        if existing.classic is None and existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            return Errors.UNRELEASED_INSTANCE_ID
        member_id = request.member_id or self._new_member_id(request.instance_id)
        gid = group.group_id
        target = group.targets.get(existing.member_id, {})
        for record in member_removal_records(gid, existing.member_id):
            out.write(record)
        self._cancel_member_timers(gid, existing.member_id)
        # A classic incarnation (never a -2 leave: classic members have no such thing) hands
        # over at epoch 0 and reconciles from what it held (getOrMaybeSubscribeStatic...).
        replacement = replace(
            existing,
            member_id=member_id,
            member_epoch=existing.previous_member_epoch if existing.classic is None else 0,
            previous_member_epoch=-1 if existing.classic is None else 0,
        )
        out.write(member_metadata_record(gid, replacement))
        out.write(target_member_record(gid, member_id, dict(target)))
        out.write(current_assignment_record(gid, replacement))
        return replacement

    def _consumer_event(
        self,
        group: ConsumerGroup,
        state: str,
        epoch: int,
        *,
        members: int,
        now_ms: int,
        reason: str | None,
    ) -> None:
        """A step of a KIP-848 group on the timeline (``RebalanceEvent``)."""
        self.stats.rebalance_events.append(
            RebalanceEvent(now_ms, group.group_id, "consumer", state, epoch, members, reason)
        )

    def _remove_consumer_members(
        self,
        group: ConsumerGroup,
        member_ids: list[str],
        now_ms: int,
        out: _Output,
        reason: str | None = None,
    ) -> None:
        """``consumerGroupFenceMembers``: fence or remove members, their records' tombstones
        and one new group epoch; or, when only classic members would remain, the group
        becomes a classic group again (``convertToClassicGroup``)."""
        if self._can_downgrade(group, member_ids) and self._convert_to_classic_group(
            group, member_ids, now_ms, out
        ):
            return
        for member_id in member_ids:
            for record in member_removal_records(group.group_id, member_id):
                out.write(record)
            self._cancel_member_timers(group.group_id, member_id)
        # The subscription metadata without them, with the one new epoch: a topic only they
        # subscribed to would otherwise bump the epoch again at the next heartbeat.
        remaining = [m for m in group.members.values() if m.member_id not in member_ids]
        metadata = {
            topic_id: (name, partitions)
            for topic_id, (name, partitions) in group.subscribed_topics.items()
            if any(name in subscribed_topics(m, (name,)) for m in remaining)
        }
        if metadata != group.subscribed_topics:
            out.write(partition_metadata_record(group.group_id, metadata))
        out.write(group_epoch_record(group.group_id, group.group_epoch + 1))
        self._consumer_event(
            group,
            "Assigning" if remaining else "Empty",
            group.group_epoch + 1,
            members=len(remaining),
            now_ms=now_ms,
            reason=reason,
        )

    def _cancel_member_timers(self, group_id: str, member_id: str) -> None:
        """``cancelTimers``: session, rebalance, and a classic member's join and sync."""
        self._cancel_timer(session_key(group_id, member_id))
        self._cancel_timer(rebalance_key(group_id, member_id))
        self._cancel_timer(classic_join_key(group_id, member_id))
        self._cancel_timer(classic_sync_key(group_id, member_id))

    def _consumer_session_timeout_ms(self, group_id: str) -> int:
        """The group's own ``consumer.session.timeout.ms``, else the broker's (Kafka's
        ``GroupMetadataManager.consumerGroupSessionTimeoutMs``)."""
        return group_config_int(
            self._group_configs(group_id), CONSUMER_SESSION_TIMEOUT_MS, self._config.consumer_timing
        )

    def _consumer_heartbeat_interval_ms(self, group_id: str) -> int:
        """The group's own ``consumer.heartbeat.interval.ms``, else the broker's."""
        return group_config_int(
            self._group_configs(group_id),
            CONSUMER_HEARTBEAT_INTERVAL_MS,
            self._config.consumer_timing,
        )

    def _schedule_session(self, group_id: str, member: ConsumerGroupMember, now_ms: int) -> None:
        """A full session from now: a classic member's own timeout, else the group's."""
        timeout_ms = (
            member.classic.session_timeout_ms
            if member.classic is not None
            else self._consumer_session_timeout_ms(group_id)
        )
        self._schedule_consumer_timer(
            session_key(group_id, member.member_id),
            now_ms + timeout_ms,
            group_id,
            member.member_id,
            SESSION_KEY,
        )

    def _consumer_heartbeat(
        self,
        token: Token,
        request: ConsumerGroupHeartbeatRequest,
        group: ConsumerGroup,
        now_ms: int,
        *,
        topics: TopicsView,
        out: _Output,
    ) -> None:
        group_id = request.group_id
        owned = _owned(request.topic_partitions)
        if not self._member_record_fits(request):
            # Its member record could not be written (a subscription of 150,000 names): the
            # refused write reloaded the whole partition's shard. Kafka's runtime fails the
            # write alone, and answers UNKNOWN_SERVER_ERROR for a record too large
            # (GroupCoordinatorService.handleOperationException).
            out.respond(token, _too_large(request, SUBSCRIPTION_TOO_LARGE))
            return

        # 1. The member: a new one (epoch 0), or a known one whose epoch must be valid.
        old = group.members.get(request.member_id) if request.member_id else None
        if old is None and len(group.members) >= self._config.consumer_max_size:
            # throwIfConsumerGroupIsFull, before anything else about the member: a static
            # member rejoining under a new member id is refused too.
            out.respond(
                token,
                ConsumerGroupHeartbeatResponse(
                    error_code=Errors.GROUP_MAX_SIZE_REACHED,
                    error_message=f"The group {group_id} has reached its maximum size.",
                ),
            )
            return
        replaced: ConsumerGroupMember | None = None
        if request.member_epoch == 0:
            found = self._replace_static_member(group, request, out)
            if isinstance(found, Errors):
                out.respond(
                    token,
                    ConsumerGroupHeartbeatResponse(
                        error_code=found,
                        error_message=(
                            f"Static member with instance id {request.instance_id} is present "
                            "in the group."
                        ),
                        member_id=request.member_id or None,
                    ),
                )
                return
            replaced = found
        if replaced is not None:
            # It carries on where the member it replaces left: no new epoch, no rebalance.
            # The group as the records just written make it, for the steps below.
            gone = next(
                m.member_id
                for m in group.members.values()
                if m.instance_id == request.instance_id and m.member_id != replaced.member_id
            )
            members = {k: v for k, v in group.members.items() if k != gone}
            targets = {k: v for k, v in group.targets.items() if k != gone}
            members[replaced.member_id] = replaced
            targets[replaced.member_id] = group.targets.get(gone, {})
            group = replace(group, members=members, targets=targets)
            old = member = replaced
        elif request.member_epoch == 0:
            if old is not None:
                # A member the group still knows rejoins (it was fenced, or lost its state):
                # it keeps its place, epoch and assignment, and reconciles from owning
                # nothing; no new group epoch unless its subscription changed (KAFKA-19233:
                # throwIfConsumerGroupMemberEpochIsInvalid accepts epoch 0).
                member = old
            else:
                member_id = request.member_id or self._new_member_id(request.client_id)
                member = ConsumerGroupMember(member_id=member_id)
        else:
            unknown_or_fenced = self._unknown_or_fenced_member(group, request, old)
            if unknown_or_fenced is not None:
                out.respond(token, unknown_or_fenced)
                return
            assert old is not None
            error = validate_member_epoch(old, request.member_epoch, owned)
            if error is not Errors.NONE:
                out.respond(
                    token,
                    ConsumerGroupHeartbeatResponse(
                        error_code=error,
                        error_message=(
                            f"The consumer group member has a smaller or larger member epoch "
                            f"({request.member_epoch}) than the one known by the group "
                            f"coordinator ({old.member_epoch})."
                        ),
                        member_id=request.member_id,
                    ),
                )
                return
            member = old
        updated = replace(
            member,
            instance_id=request.instance_id
            if request.instance_id is not None
            else member.instance_id,
            rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
            client_id=request.client_id or member.client_id,
            client_host=request.client_host or member.client_host,
            subscribed_topic_names=(
                tuple(sorted(set(request.subscribed_topic_names)))
                if request.subscribed_topic_names is not None
                else member.subscribed_topic_names
            ),
            # None: unchanged; "": no regular expression any more.
            subscribed_topic_regex=(
                request.subscribed_topic_regex or None
                if request.subscribed_topic_regex is not None
                else member.subscribed_topic_regex
            ),
            rebalance_timeout_ms=(
                request.rebalance_timeout_ms
                if request.rebalance_timeout_ms >= 0
                else member.rebalance_timeout_ms
            ),
            server_assignor=(
                request.server_assignor
                if request.server_assignor is not None
                else member.server_assignor
            ),
            classic=None,  # it speaks the consumer protocol now
        )

        reconciled = self._update_and_reconcile(
            group,
            old,
            updated,
            owned=owned,
            topics=topics,
            out=out,
            now_ms=now_ms,
        )

        # 5. Timers: the session; the rebalance timeout while a revocation is owed.
        self._schedule_session(group_id, reconciled, now_ms)
        if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
            # Restarted whenever reconciling changed the member (GroupMetadataManager.
            # maybeReconcile): entering the state, and also more partitions to revoke at the
            # same epoch (a subscription changed while it was revoking, KAFKA-19431).
            if reconciled != updated:
                self._schedule_rebalance_timeout(group_id, reconciled, now_ms)
        else:
            self._cancel_timer(rebalance_key(group_id, reconciled.member_id))

        out.respond(
            token,
            ConsumerGroupHeartbeatResponse(
                member_id=reconciled.member_id,
                member_epoch=reconciled.member_epoch,
                heartbeat_interval_ms=self._consumer_heartbeat_interval_ms(group_id),
                # Only to a (re)joining member, a full request (what a client sends after an
                # error, a lost answer included), or when what it is assigned changed:
                # consumerGroupHeartbeat's response. Null means "unchanged".
                assignment=(
                    _as_wire(reconciled.assigned)
                    if request.member_epoch == 0
                    or _is_full_request(request)
                    or old is None
                    or reconciled.assigned != old.assigned
                    else None
                ),
            ),
        )

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
        """The heartbeat's middle steps, shared with a classic member's JoinGroup: the
        member's metadata, the group epoch, the target assignment, and the member's next
        assignment (records written to ``out``); returns the reconciled member."""
        group_id = group.group_id
        # 2. Subscription and topic metadata: a change bumps the group epoch
        # (consumerGroupHeartbeat). A new group moves away from epoch 0; a new member is
        # compared with a member that subscribes to nothing, so one joining with no topics
        # (a pattern subscriber whose pattern matches nothing yet) starts no rebalance.
        group_epoch = group.group_epoch
        bump = group_epoch == 0
        why = "a new group" if bump else None
        before = old if old is not None else ConsumerGroupMember(member_id=updated.member_id)
        subscription_changed = (
            updated.subscribed_topic_names != before.subscribed_topic_names
            or updated.subscribed_topic_regex != before.subscribed_topic_regex
        )
        if old is None or updated.metadata_value() != old.metadata_value():
            out.write(member_metadata_record(group_id, updated))
            # hasMemberSubscriptionChanged: topic names or regex, not the server assignor,
            # which the next assignment reads (computePreferredServerAssignor). A regex is
            # resolved here at once, so a new one bumps as Kafka's already resolved one does
            # (maybeUpdateRegularExpressions).
            if subscription_changed:
                bump = True
                why = (
                    f"member {updated.member_id} joined"
                    if old is None
                    else f"member {updated.member_id} changed its subscription"
                )
        members = dict(group.members)
        members[updated.member_id] = updated
        # What the members subscribe to among the topics: the same as at the group's last
        # heartbeat while no member's subscription and no topic changed (Kafka keeps it per
        # group, ModernGroup.subscribedTopicNames); derived from every member, it cost a
        # steady heartbeat O(members x topics), 44% of a core for a group of 2,000.
        found = getattr(topics, "version", None)  # a TopicsSnapshot's; a plain mapping has none
        version = found if isinstance(found, int) else None
        steady = old is not None and not subscription_changed and version is not None
        key = (group.subscriptions_version, version)
        if steady and group.subscribed_now is not None and group.subscribed_now[0] == key:
            metadata = group.subscribed_now[1]
        else:
            subscribed = {name for m in members.values() for name in subscribed_topics(m, topics)}
            metadata = {
                topic_id: (name, n) for name, (topic_id, n) in topics.items() if name in subscribed
            }
            if steady:
                group.subscribed_now = (key, metadata)  # a cache: no state of the group
        if metadata != group.subscribed_topics:
            out.write(partition_metadata_record(group_id, metadata))
            bump = True
            why = why or "the subscribed topics changed"
        if bump:
            group_epoch += 1
            out.write(group_epoch_record(group_id, group_epoch))

        # 3. The target assignment, when the group epoch is ahead of it.
        targets = group.targets
        assignment_epoch = group.assignment_epoch
        if group_epoch > assignment_epoch:
            new_targets = compute_targets(
                members, targets, metadata, self._config.consumer_assignors
            )
            for member_id, partitions in sorted(new_targets.items()):
                # TargetAssignmentBuilder: a member without a target yet always gets a record,
                # an empty one included.
                if member_id not in targets or partitions != targets[member_id]:
                    out.write(target_member_record(group_id, member_id, partitions))
            out.write(target_epoch_record(group_id, group_epoch))
            targets, assignment_epoch = new_targets, group_epoch
            self.stats.consumer_group_rebalances += 1
            self._consumer_event(
                group, "Reconciling", group_epoch, members=len(members), now_ms=now_ms, reason=why
            )

        # 4. Reconcile this member towards its target (CurrentAssignmentBuilder), keeping its
        # assignment to the existing topics it subscribes to (KAFKA-19431: subscribedTopicIds
        # resolves the names against the metadata image, so a deleted topic is not among them;
        # GroupMetadataManager forces the check when the subscription changed).
        # Who holds what, built only when a partition is to be given (a member already at its
        # target asks nothing): walking every member's partitions on every heartbeat was most
        # of a steady heartbeat's cost in a large group (Kafka keeps currentPartitionEpoch).
        owners: dict[tuple[TopicId, int], int] | None = None

        def owner_epoch(topic_id: TopicId, p: int) -> int:
            nonlocal owners
            if owners is None:
                owners = group.partition_owners(excluding=updated.member_id)
            return owners.get((topic_id, p), -1)

        reconciled = reconcile(
            updated,
            targets.get(updated.member_id, {}),
            assignment_epoch,
            owned,
            owner_epoch,
            subscribed=frozenset(
                topics[name][0] for name in subscribed_topics(updated, topics) if name in topics
            ),
            subscription_changed=old is not None and subscription_changed,
        )
        if old is None or reconciled.assignment_value() != old.assignment_value():
            out.write(current_assignment_record(group_id, reconciled))
        return reconciled

    # -- timers ----------------------------------------------------------------------------------

    def _on_consumer_timer(
        self, kind: str, group_id: str, member_id: str, now_ms: int, out: _Output
    ) -> None:
        """Session timeout, a classic member's join or sync timeout: fence the member.
        Rebalance timeout: fence it if it still owes a revocation
        (``scheduleConsumerGroupRebalanceTimeout``)."""
        group = self._consumer_groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return
        if kind == REBALANCE_KEY and (
            member.state is not MemberState.UNREVOKED_PARTITIONS
            or member.classic is not None
            or member.member_epoch < 0
        ):
            # Revoked in time; classic members have join and sync timeouts instead; a static
            # member that left (epoch -2) released what it was revoking and waits for its
            # session, as on Kafka's live path (its timer, armed at the member's epoch then,
            # no longer fences it). Kafka's onLoaded arms one at -2, which does: the outcome
            # then hung on a failover; this follows the live path.
            return
        if kind == SESSION_KEY:
            self.stats.members_expired += 1
        reason = {
            SESSION_KEY: "its session timed out",
            REBALANCE_KEY: "it did not revoke its partitions within the rebalance timeout",
        }.get(kind, "a classic member's join or sync timed out")
        self._remove_consumer_members(
            group, [member_id], now_ms, out, f"member {member_id}: {reason}"
        )

    def _arm_consumer_timers(self, now_ms: int) -> None:
        """``onLoaded``: every member gets a full session from now."""
        for group in self._consumer_groups.values():
            for member in group.members.values():
                self._arm_member_timers(group.group_id, member, now_ms)

    def _arm_member_timers(self, group_id: str, member: ConsumerGroupMember, now_ms: int) -> None:
        """A full session from now, and a full rebalance timeout if it owes a revocation."""
        self._schedule_session(group_id, member, now_ms)
        if (
            member.state is MemberState.UNREVOKED_PARTITIONS
            and member.classic is None
            and member.member_epoch >= 0  # not a static member that left
        ):
            self._schedule_rebalance_timeout(group_id, member, now_ms)

    def _schedule_rebalance_timeout(
        self, group_id: str, member: ConsumerGroupMember, now_ms: int
    ) -> None:
        """A full rebalance timeout from now to revoke what it owes."""
        self._schedule_consumer_timer(
            rebalance_key(group_id, member.member_id),
            now_ms + max(member.rebalance_timeout_ms, 0),
            group_id,
            member.member_id,
            REBALANCE_KEY,
        )

    # -- ConsumerGroupDescribe (69) ---------------------------------------------------------------

    def _consumer_group_describe_into(
        self, token: Token, request: ConsumerGroupDescribeRequest, now_ms: int, out: _Output
    ) -> None:
        described = []
        for group_id in request.group_ids:
            group = self._consumer_groups.get(group_id)
            if not group_id:
                described.append(
                    DescribedConsumerGroup(group_id=group_id, error_code=Errors.INVALID_GROUP_ID)
                )
            elif group is None:
                described.append(
                    DescribedConsumerGroup(
                        group_id=group_id,
                        error_code=Errors.GROUP_ID_NOT_FOUND,
                        error_message=f"Group {group_id} not found.",
                    )
                )
            else:
                described.append(self._describe_consumer_group(group))
        out.respond(token, ConsumerGroupDescribeResponse(groups=tuple(described)))

    def _describe_consumer_group(self, group: ConsumerGroup) -> DescribedConsumerGroup:
        return DescribedConsumerGroup(
            group_id=group.group_id,
            group_state=group.state,
            group_epoch=group.group_epoch,
            assignment_epoch=group.assignment_epoch,
            assignor_name=assignor_name(group, self._config.consumer_assignors),
            members=tuple(
                DescribedConsumerGroupMember(
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=m.subscribed_topic_names,
                    subscribed_topic_regex=m.subscribed_topic_regex,
                    assignment=_as_wire(m.assigned),
                    target_assignment=_as_wire(group.targets.get(m.member_id, {})),
                    uses_classic_protocol=m.classic is not None,
                )
                for m in group.members.values()
            ),
        )

    # -- what the other APIs do with consumer groups --------------------------------------------

    def _validate_consumer_offset_commit(
        self,
        group: ConsumerGroup,
        member_id: str,
        member_epoch: int,
        *,
        member_epoch_version: bool,
        topics: TopicsView | None = None,
    ) -> Errors | CommitPartitionCheck:
        """``ConsumerGroup.validateOffsetCommit``: a commit with epoch -1 (the admin client, or
        a consumer not using the group's assignment) is taken by an empty group whatever
        member id it names; members commit with their current epoch, and a member of the
        consumer protocol with OffsetCommit v9 or later (UNSUPPORTED_VERSION below).

        KIP-1251 (Kafka 4.3): a consumer-protocol member's commit at an older epoch of its
        own (its epoch moved on before the client heard of it) is checked partition by
        partition: taken if the member has owned every partition since that epoch, else
        refused whole with STALE_MEMBER_EPOCH (``handle_offset_commit``), as before, so a
        zombie commit for a partition since given to another member is still fenced.

        A topic's id is the metadata image's (``topics``), as Kafka 4.3 finds it
        (apache/kafka#21692), the group's subscription metadata only without one: that lists
        the topics some member subscribes to, and a commit of a partition the member still
        owns, pending revocation, of a topic no member subscribes to any more was refused."""
        if member_epoch < 0 and not group.members:
            return Errors.NONE
        member = group.members.get(member_id)
        if member is None:
            return Errors.UNKNOWN_MEMBER_ID
        if member.classic is None and not member_epoch_version:
            return Errors.UNSUPPORTED_VERSION
        if member_epoch == member.member_epoch:
            return Errors.NONE
        if member.classic is not None:
            # A classic member's generation is its member epoch (validateMemberEpoch).
            return Errors.ILLEGAL_GENERATION
        if member_epoch > member.member_epoch or member_epoch < 0:
            return Errors.STALE_MEMBER_EPOCH
        by_name = (
            topics
            if topics is not None
            else {name: (t, count) for t, (name, count) in group.subscribed_topics.items()}
        )

        def check(topic: str, partition: int) -> Errors:
            known = by_name.get(topic)
            topic_id = None if known is None else known[0]
            owned = member.validate_commit_partition(topic_id, partition, member_epoch)
            return Errors.NONE if owned else Errors.STALE_MEMBER_EPOCH

        return check

    def _delete_consumer_group(self, group: ConsumerGroup, out: _Output) -> Errors:
        if group.members:
            return Errors.NON_EMPTY_GROUP
        for record in group_tombstones(group):
            out.write(record)
        return Errors.NONE

    @staticmethod
    def _consumer_subscribed_to_topic(group: ConsumerGroup, topic: str) -> bool:
        """``ConsumerGroup.isSubscribedToTopic``: a member subscribes to ``topic`` by name, or
        by its regular expression once the group resolved the expression to it (an empty group
        to none). Its offsets are then neither deleted by OffsetDelete nor expired. Kafka
        counts the topics a regex resolved to in the metadata image
        (``resolvedRegularExpressions``): a name it matches that is no topic (one deleted, or
        never created) is not subscribed to, so its offsets expire. Here the group's
        subscription metadata, resolved at a heartbeat and kept in its records, is that list."""
        resolved: set[str] | None = None
        for member in group.members.values():
            if topic in member.subscribed_topic_names:
                return True
            if member.subscribed_topic_regex:
                if resolved is None:
                    resolved = {name for name, _ in group.subscribed_topics.values()}
                if topic in resolved and topic in subscribed_topics(member, (topic,)):
                    return True
        return False


def validate_heartbeat_request(
    request: ConsumerGroupHeartbeatRequest, assignors: Sequence[str] = DEFAULT_ASSIGNORS
) -> tuple[Errors, str]:
    """``GroupCoordinatorService.throwIfConsumerGroupHeartbeatRequestIsInvalid``, which runs
    before the request is routed (node/kafka/groups.py: any node answers these; the shard
    checks again). Its id checks in its order (the member id first; only v0 lets a joining
    member leave its id to the coordinator), then the rest: a negative rebalance timeout on a
    join (Kafka refuses -1 only), the regular expression and the assignor."""
    if (
        request.api_version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION
        or request.member_epoch > 0
        or request.member_epoch == LEAVE_GROUP_MEMBER_EPOCH
    ) and _is_empty_string(request.member_id):
        return Errors.INVALID_REQUEST, "MemberId can't be empty."
    for value, name in (
        (request.group_id, "GroupId"),
        (request.instance_id, "InstanceId"),
        (request.rack_id, "RackId"),
    ):
        if _is_empty_string(value):
            return Errors.INVALID_REQUEST, f"{name} can't be empty."
    if request.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        return Errors.INVALID_REQUEST, f"MemberEpoch {request.member_epoch} is invalid."
    if request.member_epoch == 0:
        if request.rebalance_timeout_ms < 0:
            return (
                Errors.INVALID_REQUEST,
                "RebalanceTimeoutMs must be provided in first request.",
            )
        if request.topic_partitions is None or request.topic_partitions:
            return Errors.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining."
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            return Errors.INVALID_REQUEST, (
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and request.instance_id is None:
        return Errors.INVALID_REQUEST, "InstanceId can't be null."
    if request.subscribed_topic_regex:
        # throwIfRegularExpressionIsInvalid
        try:
            compile_subscription_regex(request.subscribed_topic_regex)
        except InvalidRegexError as e:
            return Errors.INVALID_REGULAR_EXPRESSION, str(e)
    if request.server_assignor is not None and request.server_assignor not in assignors:
        return Errors.UNSUPPORTED_ASSIGNOR, (
            f"ServerAssignor {request.server_assignor} is not supported. Supported "
            f"assignors: {', '.join(sorted(assignors))}."
        )
    return Errors.NONE, ""


def _as_written(request: ConsumerGroupHeartbeatRequest) -> ConsumerGroupMember:
    """The member as its record would carry what this heartbeat sends (a new member's id
    has the length of the ids the shard makes), to size the record before anything changes."""
    return ConsumerGroupMember(
        member_id=request.member_id or "M" * 22,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        client_id=request.client_id,
        client_host=request.client_host,
        subscribed_topic_names=tuple(sorted(set(request.subscribed_topic_names or ()))),
        subscribed_topic_regex=request.subscribed_topic_regex or None,
        rebalance_timeout_ms=max(request.rebalance_timeout_ms, 0),
        server_assignor=request.server_assignor,
    )


def classic_tombstone(group_id: str) -> CoordinatorRecord:
    return CoordinatorRecord(GroupMetadataKey(group_id=group_id), None)
