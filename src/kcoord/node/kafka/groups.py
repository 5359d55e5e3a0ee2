"""The group APIs: the wire (kio, the versions ``register`` serves) to the pure shard's types
and back.

Each handler reads the request fields its version has (older versions lack some: ``getattr``
with Kafka's defaults), builds the version-free request of ``cluster.coordinator.types``, sets
the flags that depend on the version (KIP-394 member id required from JoinGroup v4, KIP-814
SkipAssignment from v9, GROUP_ID_NOT_FOUND reporting from OffsetCommit v9 / DescribeGroups v6),
runs it on the group's shard through the ``CoordinatorRuntime``, and turns the response back
into field values for ``codec.build_response``. A group this node does not coordinate gets
``NOT_COORDINATOR`` (or ``COORDINATOR_LOAD_IN_PROGRESS`` while its shard loads), as Kafka's
``GroupCoordinatorService`` answers. As in ``KafkaApis``, OffsetCommit and OffsetDelete answer
the partitions missing from the metadata themselves (UNKNOWN_TOPIC_OR_PARTITION) and pass only
the others to the shard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import inspect
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple

from kcoord.cluster.coordinator import types as t
from kcoord.cluster.coordinator.consumer import TopicsSnapshot
from kcoord.cluster.coordinator.consumer_shard import validate_heartbeat_request
from kcoord.cluster.coordinator.records import uuid_bytes, uuid_str
from kcoord.cluster.coordinator.shard import CoordinatorResult, GroupCoordinatorShard
from kcoord.errors import Errors
from kcoord.node.kafka.acls import (
    AUTHORIZED_OPERATIONS_OMITTED,
    GROUP_OPERATIONS,
    authorized_operations,
)
from kcoord.node.kafka.apis import PARTITIONS_PER_SLICE, Deferred, Request, Result
from kcoord.node.kafka.context import BrokerContext
from kcoord.node.runtime import CoordinatorError, CoordinatorRuntime

OFFSET_COMMIT_KEY: Final = 8
OFFSET_FETCH_KEY: Final = 9
JOIN_GROUP_KEY: Final = 11
HEARTBEAT_KEY: Final = 12
LEAVE_GROUP_KEY: Final = 13
SYNC_GROUP_KEY: Final = 14
DESCRIBE_GROUPS_KEY: Final = 15
LIST_GROUPS_KEY: Final = 16
DELETE_GROUPS_KEY: Final = 42
OFFSET_DELETE_KEY: Final = 47
CONSUMER_GROUP_HEARTBEAT_KEY: Final = 68
CONSUMER_GROUP_DESCRIBE_KEY: Final = 69
MEMBER_TYPE_CLASSIC: Final = 0  # ConsumerGroupDescribe v1 MemberType
MEMBER_TYPE_CONSUMER: Final = 1

ShardCall = Callable[[GroupCoordinatorShard, int, int], CoordinatorResult]


def _ms(value: Any, default: int = -1) -> int:
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)


def _merged_topics(topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per topic name, its partitions together, where the name came first
    (``OffsetCommitResponse.Builder.merge``): a topic with partitions both known and unknown
    to the metadata was listed twice."""
    by_name: dict[str, dict[str, Any]] = {}
    for topic in topics:
        entry = by_name.get(topic["name"])
        if entry is None:
            by_name[topic["name"]] = {**topic, "partitions": list(topic["partitions"])}
        else:
            entry["partitions"].extend(topic["partitions"])
    return list(by_name.values())


def values(response: Any) -> dict[str, Any]:
    """A pure response as field values for ``codec.build_response``."""
    out: dict[str, Any] = _plain(response)
    if "throttle_time_ms" in out:
        out["throttle_time"] = out.pop("throttle_time_ms")
    return out


# Per type: its dataclass field names, or None for every other type.
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` without its deep copies of leaf values (it showed in profiles of
    the commit path): dataclasses become dicts, lists, tuples and dicts are rebuilt, the rest
    is shared (the pure responses hold ints, strings and bytes)."""
    cls = type(value)
    if cls is list or cls is tuple:
        return cls(_plain(v) for v in value)
    if cls is dict:
        return {k: _plain(v) for k, v in value.items()}
    try:
        names = _FIELD_NAMES[cls]
    except KeyError:
        names = _FIELD_NAMES[cls] = (
            tuple(f.name for f in dataclasses.fields(value))
            if dataclasses.is_dataclass(value)
            else None
        )
    if names is None:
        return value
    return {name: _plain(getattr(value, name)) for name in names}


def _leave_of_one_member(response: t.LeaveGroupResponse) -> dict[str, Any]:
    """LeaveGroup v0-2 have no member list: the one member's error is the answer's
    (``LeaveGroupResponse(data, version)`` below v3)."""
    if response.error_code is Errors.NONE and len(response.members) == 1:
        response = dataclasses.replace(response, error_code=response.members[0].error_code)
    return values(response)


class GroupApi:
    """The group APIs. Each handler runs its shard call at once, in request order, and
    returns a ``Deferred`` for the answer: a JoinGroup may wait for a whole rebalance."""

    def __init__(self, ctx: BrokerContext, runtime: CoordinatorRuntime) -> None:
        self.ctx = ctx
        self.runtime = runtime
        self._topics: TopicsSnapshot | None = None

    def _submit(
        self,
        group_id: str,
        call: ShardCall,
        on_error: Callable[[Errors], dict[str, Any]],
        convert: Callable[[Any], dict[str, Any]] = values,
        *,
        replay_only: bool = False,
        empty_id_ok: bool = False,
    ) -> Result:
        """Run ``call`` on the group's shard. ``replay_only``: the call changes the shard only
        through the records it returns (OffsetCommit, OffsetDelete, DeleteGroups) or not at
        all (the reads: OffsetFetch, DescribeGroups, ConsumerGroupDescribe, Kafka's read
        operations), so if it raises, or its write is refused, only its own request fails and
        the shard stays loaded (``ShardContext.run``)."""
        if not group_id and not empty_id_ok:
            # GroupCoordinatorService checks the group id before it routes the request to a
            # shard: every node answers INVALID_GROUP_ID, not only the one "" hashes to.
            # OffsetCommit, OffsetFetch, DescribeGroups and DeleteGroups take "" "for backwards
            # compatibility": it is an ordinary group there, led by the shard "" hashes to.
            return on_error(Errors.INVALID_GROUP_ID)
        try:
            fut = self.runtime.submit(group_id, call, replay_only=replay_only)
        except CoordinatorError as e:
            return on_error(e.code)

        async def finish() -> dict[str, Any]:
            try:
                return convert(await fut)
            except CoordinatorError as e:
                return on_error(e.code)

        return Deferred(finish())

    # -- JoinGroup (11) ------------------------------------------------------------------------

    async def handle_join_group(self, request: Request) -> Result:
        body, version = request.body, request.version
        session_timeout_ms = _ms(body.session_timeout)
        req = t.JoinGroupRequest(
            group_id=body.group_id,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=_ms(getattr(body, "rebalance_timeout", None), session_timeout_ms)
            if version >= 1
            else session_timeout_ms,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
            protocol_type=body.protocol_type,
            protocols=tuple(
                t.JoinGroupRequestProtocol(name=p.name, metadata=p.metadata) for p in body.protocols
            ),
            reason=getattr(body, "reason", None),
            client_id=request.header.client_id or "",
            client_host=request.client_host,
            require_known_member_id=version >= 4,
            supports_skip_assignment=version >= 9,
        )

        def convert(resp: Any) -> dict[str, Any]:
            # JoinGroupResponse(data, version): the name is not nullable before v7, and from
            # v7 an empty one goes out as null (every answer with no protocol chosen).
            out = values(resp)
            if version < 7 and out.get("protocol_name") is None:
                out["protocol_name"] = ""
            elif version >= 7 and out.get("protocol_name") == "":
                out["protocol_name"] = None
            return out

        config = self.runtime.config
        if req.group_id and not (
            config.min_session_timeout_ms <= session_timeout_ms <= config.max_session_timeout_ms
        ):
            # GroupCoordinatorService.joinGroup checks it before routing: any node answers it,
            # not only the coordinator, and not COORDINATOR_LOAD_IN_PROGRESS first.
            return convert(
                t.JoinGroupResponse(
                    error_code=Errors.INVALID_SESSION_TIMEOUT, member_id=req.member_id
                )
            )
        # A classic member joining a consumer group needs the topics (consumer_classic.py).
        topics = self._topics_view()
        return self._submit(
            req.group_id,
            lambda s, tok, now: s.handle_join_group(tok, req, now, topics),
            # GroupCoordinatorService.joinGroup answers a failed operation with its error
            # alone: no member id (only its checks before routing, the group id's among
            # them, echo the request's).
            lambda code: convert(
                t.JoinGroupResponse(
                    error_code=code,
                    member_id=req.member_id if code is Errors.INVALID_GROUP_ID else "",
                )
            ),
            convert,
        )

    # -- SyncGroup (14) ------------------------------------------------------------------------

    async def handle_sync_group(self, request: Request) -> Result:
        body = request.body
        req = t.SyncGroupRequest(
            group_id=body.group_id,
            generation_id=body.generation_id,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
            protocol_type=getattr(body, "protocol_type", None),
            protocol_name=getattr(body, "protocol_name", None),
            assignments=tuple(
                t.SyncGroupRequestAssignment(member_id=a.member_id, assignment=a.assignment)
                for a in body.assignments
            ),
        )
        if request.version >= 5 and (req.protocol_type is None or req.protocol_name is None):
            # KafkaApis.handleSyncGroupRequest: both are mandatory from v5
            # (SyncGroupRequest.areMandatoryProtocolTypeAndNamePresent).
            return values(t.SyncGroupResponse(error_code=Errors.INCONSISTENT_GROUP_PROTOCOL))
        return self._submit(
            req.group_id,
            lambda s, tok, now: s.handle_sync_group(tok, req, now),
            lambda code: values(t.SyncGroupResponse(error_code=code)),
        )

    # -- Heartbeat (12) ------------------------------------------------------------------------

    async def handle_heartbeat(self, request: Request) -> Result:
        body = request.body
        req = t.HeartbeatRequest(
            group_id=body.group_id,
            generation_id=body.generation_id,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
        )
        return self._submit(
            req.group_id,
            lambda s, tok, now: s.handle_heartbeat(tok, req, now),
            # GroupCoordinatorService.heartbeat: "the group is still loading, so blindly
            # respond" (the Java client has no branch for COORDINATOR_LOAD_IN_PROGRESS here).
            lambda code: values(
                t.HeartbeatResponse(
                    error_code=Errors.NONE if code is Errors.COORDINATOR_LOAD_IN_PROGRESS else code
                )
            ),
        )

    # -- LeaveGroup (13) -----------------------------------------------------------------------

    async def handle_leave_group(self, request: Request) -> Result:
        body = request.body
        members = tuple(
            t.MemberIdentity(
                member_id=m.member_id,
                group_instance_id=getattr(m, "group_instance_id", None),
                reason=getattr(m, "reason", None),
            )
            for m in getattr(body, "members", ())
        )
        req = t.LeaveGroupRequest(
            group_id=body.group_id,
            member_id=str(body.member_id) if request.version < 3 else None,
            members=members,
        )
        return self._submit(
            req.group_id,
            lambda s, tok, now: s.handle_leave_group(tok, req, now),
            lambda code: values(t.LeaveGroupResponse(error_code=code)),
            values if request.version >= 3 else _leave_of_one_member,
        )

    # -- OffsetCommit (8) ----------------------------------------------------------------------

    def _in_metadata(self, topics: Any) -> tuple[list[tuple[str, list[Any]]], list[dict[str, Any]]]:
        """KafkaApis answers the partitions missing from its metadata cache itself, with
        UNKNOWN_TOPIC_OR_PARTITION, before the coordinator sees the request (OffsetCommit,
        OffsetDelete): (topic name, the request's partitions that exist) of each topic with
        some, and the answers of the others as response topics."""
        image = self.ctx.image
        known: list[tuple[str, list[Any]]] = []
        unknown: list[dict[str, Any]] = []
        for topic in topics:
            topic_image = image.topic_by_name(topic.name)
            ok: list[Any] = []
            bad: list[dict[str, Any]] = []
            for p in topic.partitions:
                if topic_image is not None and (
                    image.partition(topic_image.topic_id, p.partition_index) is not None
                ):
                    ok.append(p)
                else:
                    bad.append(
                        {
                            "partition_index": p.partition_index,
                            "error_code": Errors.UNKNOWN_TOPIC_OR_PARTITION,
                        }
                    )
            if ok:
                known.append((topic.name, ok))
            if bad:
                unknown.append({"name": topic.name, "partitions": bad})
        return known, unknown

    async def handle_offset_commit(self, request: Request) -> Result:
        body, version = request.body, request.version
        existing, unknown = self._in_metadata(body.topics)
        known = [
            t.OffsetCommitRequestTopic(
                name=name,
                partitions=tuple(
                    t.OffsetCommitRequestPartition(
                        partition_index=p.partition_index,
                        committed_offset=p.committed_offset,
                        committed_leader_epoch=getattr(p, "committed_leader_epoch", -1),
                        commit_timestamp=_ms(getattr(p, "commit_timestamp", None)),
                        committed_metadata=p.committed_metadata,
                    )
                    for p in partitions
                ),
            )
            for name, partitions in existing
        ]
        req = t.OffsetCommitRequest(
            group_id=body.group_id,
            generation_id_or_member_epoch=getattr(body, "generation_id_or_member_epoch", -1),
            member_id=getattr(body, "member_id", ""),
            group_instance_id=getattr(body, "group_instance_id", None),
            retention_time_ms=_ms(getattr(body, "retention_time", None)),
            topics=tuple(known),
            report_group_id_not_found=version >= 9,
            member_epoch_version=version >= 9,
        )
        # Metrics: errors by code (the shard counts its own) and the latency to the answer.
        stats = self.runtime.stats
        if unknown:
            stats.count_offset_commit_error(
                Errors.UNKNOWN_TOPIC_OR_PARTITION, sum(len(u["partitions"]) for u in unknown)
            )
        if not known:
            return {"throttle_time": 0, "topics": unknown}
        latency = self.runtime.offset_commit_latency_s
        loop = asyncio.get_running_loop()
        start = loop.time() if latency is not None else 0.0

        def on_error(code: Errors) -> dict[str, Any]:
            stats.count_offset_commit_error(code)
            if latency is not None:
                latency.observe(loop.time() - start)
            failed = [
                {
                    "name": tp.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": code}
                        for p in tp.partitions
                    ],
                }
                for tp in known
            ]
            return {"throttle_time": 0, "topics": _merged_topics(failed + unknown)}

        def convert(resp: Any) -> dict[str, Any]:
            if latency is not None:
                latency.observe(loop.time() - start)
            out = values(resp)
            out["topics"] = _merged_topics(list(out["topics"]) + unknown)
            return out

        topics = self._topics_view()
        return self._submit(
            req.group_id,
            lambda s, tok, now: s.handle_offset_commit(tok, req, now, topics),
            on_error,
            convert,
            replay_only=True,  # a refused commit leaves the shard as it was
            empty_id_ok=True,
        )

    # -- OffsetFetch (9) -----------------------------------------------------------------------

    def _fetch_group(
        self,
        group_id: str,
        topics: Any,
        require_stable: bool,
        member_id: str | None = None,
        member_epoch: int = -1,
    ) -> Result:
        req = t.OffsetFetchRequest(
            group_id=group_id,
            member_id=member_id,
            member_epoch=member_epoch,
            topics=None
            if topics is None
            else tuple(
                t.OffsetFetchRequestTopic(
                    name=tp.name, partition_indexes=tuple(tp.partition_indexes)
                )
                for tp in topics
            ),
            require_stable=require_stable,
        )

        def on_error(code: Errors) -> dict[str, Any]:
            # Pre-3.9 clients do not retry COORDINATOR_NOT_AVAILABLE on OffsetFetch, so Kafka
            # answers NOT_COORDINATOR (GroupCoordinatorService.handleOffsetFetchException).
            if code is Errors.COORDINATOR_NOT_AVAILABLE:
                code = Errors.NOT_COORDINATOR
            # The group's error alone, no partitions (OffsetFetchRequest.getErrorResponse);
            # before v2, which has no group error, ``handle_offset_fetch`` puts it on each.
            return {"group_id": group_id, "error_code": code, "topics": []}

        def fetch(s: GroupCoordinatorShard, tok: int, now: int) -> CoordinatorResult:
            # Kafka's fetchOffsets is a read at the last committed offset, unless
            # require_stable makes it a write, which reads the latest state.
            committed = (
                None if require_stable else self.runtime.committed_fetch(group_id, member_id)
            )
            return s.handle_offset_fetch(tok, req, now, committed)

        return self._submit(
            group_id,
            fetch,
            on_error,
            replay_only=True,  # a read: see _submit
            empty_id_ok=True,
        )

    async def handle_offset_fetch(self, request: Request) -> Result:
        """Each group's partitions are read in pieces of at most ``PARTITIONS_PER_SLICE``, the
        loop's other work between them (``_in_slices``): in one go, one group naming a million
        partitions held the loop for seconds. A piece reads the committed state of its time;
        each partition's answer is one its group had committed, as a read of the whole."""
        body, version = request.body, request.version
        require_stable = getattr(body, "require_stable", False)
        if version >= 8:
            owners: list[int] = []  # the group of each piece

            def pieces() -> Iterator[tuple[Any, Any]]:
                for i, g in enumerate(body.groups):
                    for topics in _fetch_pieces(g.topics):
                        owners.append(i)
                        yield g, topics

            def fetch_one(piece: tuple[Any, Any]) -> Result:
                g, topics = piece
                return self._fetch_group(
                    g.group_id,
                    topics,
                    require_stable,
                    getattr(g, "member_id", None),
                    getattr(g, "member_epoch", -1),
                )

            answers = await _in_slices(pieces(), fetch_one, lambda piece: _weight(piece[1]))

            async def gather() -> dict[str, Any]:
                settled = await _settle_all(answers)
                return {
                    "throttle_time": 0,
                    "groups": _joined_pieces(owners, settled),
                }

            return Deferred(gather())
        own = _fetch_pieces(body.topics)
        parts = await _in_slices(
            own, lambda topics: self._fetch_group(body.group_id, topics, require_stable), _weight
        )

        async def single() -> dict[str, Any]:
            (out,) = _joined_pieces([0] * len(parts), await _settle_all(parts))
            error = out["error_code"]
            if version < 2 and error != Errors.NONE:
                # No top-level error before v2: each partition asked for carries it, with an
                # invalid offset and no metadata (OffsetFetchRequest.getErrorResponse).
                out["topics"] = [
                    {
                        "name": tp.name,
                        "partitions": [
                            {
                                "partition_index": i,
                                "committed_offset": -1,
                                "metadata": "",
                                "error_code": error,
                            }
                            for i in tp.partition_indexes
                        ],
                    }
                    for tp in (body.topics or ())
                ]
            return {"throttle_time": 0, "topics": out["topics"], "error_code": error}

        return Deferred(single())

    # -- DescribeGroups (15) -------------------------------------------------------------------

    async def handle_describe_groups(self, request: Request) -> Result:
        body, version = request.body, request.version
        include_ops = getattr(body, "include_authorized_operations", False)
        answers = await _in_slices(
            body.groups, lambda g: self._describe_one(g, include_ops, version)
        )

        async def gather() -> dict[str, Any]:
            groups = [group for answer in await _settle_all(answers) for group in answer["groups"]]
            _set_authorized_operations(groups, include_ops)
            return {"throttle_time": 0, "groups": groups}

        return Deferred(gather())

    def _describe_one(self, group_id: str, include_ops: bool, version: int) -> Result:
        req = t.DescribeGroupsRequest(
            groups=(group_id,),
            include_authorized_operations=include_ops,
            report_group_id_not_found=version >= 6,
        )

        def on_error(code: Errors) -> dict[str, Any]:
            failed = t.DescribedGroup(error_code=code, group_id=group_id)
            return {"groups": [dataclasses.asdict(failed)]}

        return self._submit(
            group_id,
            lambda s, tok, now: s.handle_describe_groups(tok, req, now),
            on_error,
            replay_only=True,  # a read: see _submit
            empty_id_ok=True,
        )

    # -- ListGroups (16) -----------------------------------------------------------------------

    async def handle_list_groups(self, request: Request) -> Result:
        body = request.body
        req = t.ListGroupsRequest(
            states_filter=tuple(getattr(body, "states_filter", ())),
            types_filter=tuple(getattr(body, "types_filter", ())),
        )
        try:
            futures = self.runtime.list_groups(req)
        except CoordinatorError as e:
            return {"throttle_time": 0, "error_code": e.code, "groups": []}

        async def gather() -> dict[str, Any]:
            groups: list[Any] = []
            error = Errors.NONE
            # Every shard's answer is awaited, as Kafka's allOf: one failure left the others'
            # failures never retrieved (an asyncio error logged for each).
            for resp in await asyncio.gather(*futures, return_exceptions=True):
                if isinstance(resp, CoordinatorError):
                    if resp.code is Errors.NOT_COORDINATOR:
                        continue  # unloaded meanwhile: Kafka skips NOT_COORDINATOR partitions
                    # GroupCoordinatorService.listGroups: any other failure is the answer's
                    # (COORDINATOR_NOT_AVAILABLE for a timeout, which clients retry), not a
                    # silently shorter list.
                    return {"throttle_time": 0, "error_code": resp.code, "groups": []}
                if isinstance(resp, BaseException):
                    raise resp
                groups.extend(values(resp)["groups"])
                if resp.error_code is not Errors.NONE:
                    error = resp.error_code
            return {"throttle_time": 0, "error_code": error, "groups": groups}

        return Deferred(gather())

    # -- DeleteGroups (42) ---------------------------------------------------------------------

    async def handle_delete_groups(self, request: Request) -> Result:
        # Each group once (KafkaApis.handleDeleteGroupsRequest: groupsNames.distinct): a
        # second delete of one answered GROUP_ID_NOT_FOUND after the first. In slices, as
        # DescribeGroups: 50,000 group ids at once held the loop for a second.
        names = list(dict.fromkeys(request.body.groups_names))
        answers = await _in_slices(names, self._delete_one)

        async def gather() -> dict[str, Any]:
            results = [r for answer in await _settle_all(answers) for r in answer["results"]]
            return {"throttle_time": 0, "results": results}

        return Deferred(gather())

    def _delete_one(self, group_id: str) -> Result:
        req = t.DeleteGroupsRequest(groups_names=(group_id,))

        def on_error(code: Errors) -> dict[str, Any]:
            return {"results": [{"group_id": group_id, "error_code": code}]}

        return self._submit(
            group_id,
            lambda s, tok, now: s.handle_delete_groups(tok, req, now),
            on_error,
            replay_only=True,  # tombstones alone: a refused delete leaves the shard as it was
            empty_id_ok=True,
        )

    # -- OffsetDelete (47) ---------------------------------------------------------------------

    async def handle_offset_delete(self, request: Request) -> Result:
        """The coordinator gets the partitions in the metadata (it is asked even when there
        are none: a group error still comes back). Its answer is merged into KafkaApis' as
        ``OffsetDeleteResponse.Builder.merge`` does: a group error replaces every partition's
        answer; otherwise its partitions follow KafkaApis' own, under the same topic."""
        existing, unknown = self._in_metadata(request.body.topics)
        req = t.OffsetDeleteRequest(
            group_id=request.body.group_id,
            topics=tuple(
                t.OffsetDeleteRequestTopic(
                    name=name,
                    partitions=tuple(
                        t.OffsetDeleteRequestPartition(partition_index=p.partition_index)
                        for p in partitions
                    ),
                )
                for name, partitions in existing
            ),
        )

        def convert(resp: Any) -> dict[str, Any]:
            out = values(resp)
            if out["error_code"] != Errors.NONE:
                return out
            if unknown:
                # Builder.merge: each of the coordinator's partitions under the first entry of
                # its topic (a topic may be listed twice); with nothing of KafkaApis' own, the
                # coordinator's answer is taken as it is.
                out["topics"] = _merged_topics([*unknown, *out["topics"]])
            return out

        return self._submit(
            req.group_id,
            lambda s, tok, now: s.handle_offset_delete(tok, req, now),
            lambda code: {"error_code": code, "throttle_time": 0, "topics": []},
            convert,
            replay_only=True,  # tombstones alone, as a commit's records
        )

    # -- ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69), KIP-848 -------------------

    def _topics_view(self) -> TopicsSnapshot:
        """The image's topics as the shard's assignor sees them: name -> (id, partitions).
        Every topic: one subscribed to by name is assigned, internal or not, as in Kafka
        (a regular expression never matches an internal one). Built once per image, not at
        every heartbeat (it walked every partition of the cluster)."""
        image = self.ctx.image
        view = self._topics
        if view is None or view.version != image.last_offset:
            view = self._topics = TopicsSnapshot(
                {
                    topic.name: (topic.topic_id, len(image.partitions_of(topic.topic_id)))
                    for topic in image.topics.values()
                },
                image.last_offset,
            )
        return view

    async def handle_consumer_group_heartbeat(self, request: Request) -> Result:
        body = request.body
        owned = getattr(body, "topic_partitions", None)
        req = t.ConsumerGroupHeartbeatRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            member_epoch=body.member_epoch,
            instance_id=body.instance_id,
            rack_id=body.rack_id,
            rebalance_timeout_ms=_ms(body.rebalance_timeout),
            subscribed_topic_names=(
                None if body.subscribed_topic_names is None else tuple(body.subscribed_topic_names)
            ),
            # null: unchanged; "": none (what librdkafka sends when it subscribes by names).
            subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
            server_assignor=body.server_assignor,
            topic_partitions=(
                None
                if owned is None
                else tuple(
                    (uuid_str(tp.topic_id.bytes), tuple(tp.partitions))
                    for tp in owned
                    if tp.topic_id is not None
                )
            ),
            client_id=request.header.client_id or "",
            client_host=request.client_host,
            api_version=request.version,
        )

        def convert(resp: Any) -> dict[str, Any]:
            assignment = resp.assignment
            return {
                "throttle_time": 0,
                "error_code": resp.error_code,
                "error_message": resp.error_message,
                "member_id": resp.member_id,
                "member_epoch": resp.member_epoch,
                "heartbeat_interval": resp.heartbeat_interval_ms,
                "assignment": None
                if assignment is None
                else {
                    "topic_partitions": [
                        {"topic_id": uuid.UUID(bytes=uuid_bytes(tid)), "partitions": list(ps)}
                        for tid, ps in assignment
                    ]
                },
            }

        def on_error(code: Errors) -> dict[str, Any]:
            return convert(t.ConsumerGroupHeartbeatResponse(error_code=code))

        if not self.runtime.config.consumer_protocol_enabled:
            # group.coordinator.rebalance.protocols without consumer: KafkaApis'
            # isConsumerGroupProtocolEnabled, checked first (the Java consumer then fails with
            # UnsupportedVersionException, KAFKA-17536).
            return convert(t.ConsumerGroupHeartbeatResponse(error_code=Errors.UNSUPPORTED_VERSION))
        error, message = validate_heartbeat_request(req, self.runtime.config.consumer_assignors)
        if error is not Errors.NONE:
            # GroupCoordinatorService checks the request before routing it: any node answers.
            return convert(
                # Error code and message only (GroupCoordinatorService): no member id.
                t.ConsumerGroupHeartbeatResponse(error_code=error, error_message=message)
            )
        topics = self._topics_view()
        return self._submit(
            req.group_id,
            lambda s, tok, now: s.handle_consumer_group_heartbeat(tok, req, now, topics),
            on_error,
            convert,
        )

    async def handle_consumer_group_describe(self, request: Request) -> Result:
        group_ids = tuple(request.body.group_ids)
        names = {topic_id: name for name, (topic_id, _) in self._topics_view().items()}

        def assignment(parts: t.TopicIdPartitions) -> dict[str, Any]:
            return {
                "topic_partitions": [
                    {
                        "topic_id": uuid.UUID(bytes=uuid_bytes(tid)),
                        "topic_name": names.get(tid, ""),
                        "partitions": list(ps),
                    }
                    for tid, ps in parts
                    # ConsumerGroupMember.topicPartitionsFromMap leaves out a topic no longer
                    # in the metadata (deleted before the member's next heartbeat).
                    if tid in names
                ]
            }

        def group_values(g: t.DescribedConsumerGroup) -> dict[str, Any]:
            return {
                "error_code": g.error_code,
                "error_message": g.error_message,
                "group_id": g.group_id,
                "group_state": g.group_state,
                "group_epoch": g.group_epoch,
                "assignment_epoch": g.assignment_epoch,
                "assignor_name": g.assignor_name,
                "members": [
                    {
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": list(m.subscribed_topic_names),
                        "subscribed_topic_regex": m.subscribed_topic_regex,
                        "assignment": assignment(m.assignment),
                        "target_assignment": assignment(m.target_assignment),
                        "member_type": MEMBER_TYPE_CLASSIC
                        if m.uses_classic_protocol
                        else MEMBER_TYPE_CONSUMER,
                    }
                    for m in g.members
                ],
                "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
            }

        def one(group_id: str) -> Result:
            req = t.ConsumerGroupDescribeRequest(group_ids=(group_id,))

            def on_error(code: Errors) -> dict[str, Any]:
                return group_values(t.DescribedConsumerGroup(group_id=group_id, error_code=code))

            def convert(resp: Any) -> dict[str, Any]:
                return group_values(resp.groups[0])

            if not self.runtime.config.consumer_protocol_enabled:
                return on_error(Errors.UNSUPPORTED_VERSION)  # KafkaApis, as the heartbeat
            if not group_id:
                return on_error(Errors.INVALID_GROUP_ID)
            return self._submit(
                group_id,
                lambda s, tok, now: s.handle_consumer_group_describe(tok, req, now),
                on_error,
                convert,
                replay_only=True,  # a read: see _submit
            )

        # In slices: ids answered at once (empty ones) never let the loop go otherwise.
        answers = await _in_slices(group_ids, one)

        async def gather() -> dict[str, Any]:
            groups = await _settle_all(answers)
            _set_authorized_operations(groups, request.body.include_authorized_operations)
            return {"throttle_time": 0, "groups": groups}

        return Deferred(gather())

    def register(self, register: Callable[..., Any]) -> None:
        register(CONSUMER_GROUP_HEARTBEAT_KEY, self.handle_consumer_group_heartbeat)
        register(CONSUMER_GROUP_DESCRIBE_KEY, self.handle_consumer_group_describe)
        # Kafka 4.0's versions. v10 of both (Kafka 4.1+, KAFKA-14690 and KAFKA-14691) names
        # topics by id only, and a committed offset then keeps its topic id (KAFKA-19154);
        # kcoord keeps offsets by name, so it serves v9 at most and clients ask for v9.
        register(OFFSET_COMMIT_KEY, self.handle_offset_commit, min_version=2, max_version=9)
        register(OFFSET_FETCH_KEY, self.handle_offset_fetch, min_version=1, max_version=9)
        register(JOIN_GROUP_KEY, self.handle_join_group)
        register(HEARTBEAT_KEY, self.handle_heartbeat)
        register(LEAVE_GROUP_KEY, self.handle_leave_group)
        register(SYNC_GROUP_KEY, self.handle_sync_group)
        register(DESCRIBE_GROUPS_KEY, self.handle_describe_groups)
        register(LIST_GROUPS_KEY, self.handle_list_groups)
        register(DELETE_GROUPS_KEY, self.handle_delete_groups)
        register(OFFSET_DELETE_KEY, self.handle_offset_delete)


async def _in_slices(
    items: Iterable[Any],
    one: Callable[[Any], Result],
    weight: Callable[[Any], int] | None = None,
) -> list[Result]:
    """``one`` of every item, in request order, ``PARTITIONS_PER_SLICE`` at a time (items of
    ``weight`` 1 unless given: an OffsetFetch piece weighs its partitions) with the loop's
    other work between slices: all at once, a DescribeGroups of 300,000 group ids held
    the loop for 21 s (the node missed its heartbeats). Every item's call is made before the
    handler returns, and the reader awaits a handler before it runs the next request's, so a
    later request on the connection (an OffsetCommit pipelined behind a DeleteGroups of 600
    groups) reaches the shards after all of them, as a muted Kafka connection would have it.
    So every answer is pending at once (some 660 bytes each, as Kafka holds a future per
    group). ``_settle_all`` awaits the answers."""
    out: list[Result] = []
    done = 0
    try:
        for item in items:
            if done >= PARTITIONS_PER_SLICE:
                await asyncio.sleep(0)  # the other connections' turn
                done = 0
            out.append(one(item))
            done += 1 if weight is None else weight(item)
    except BaseException:  # the connection closed (cancelled), or a call failed
        _close(out)
        raise
    return out


class _FetchTopic(NamedTuple):
    """A topic of an OffsetFetch piece, as ``_fetch_group`` reads a request's."""

    name: str
    partition_indexes: tuple[int, ...]


def _fetch_pieces(topics: Any) -> Iterator[Any]:
    """An OffsetFetch group's topics in pieces of at most ``PARTITIONS_PER_SLICE`` partitions
    (a topic of more is split), made as they are taken, between the slices; ``None`` (every
    committed partition) is one piece."""
    if topics is None:
        yield None
        return
    piece: list[_FetchTopic] = []
    size = 0
    pieces = 0
    for tp in topics:
        indexes = tuple(tp.partition_indexes)
        if not indexes:  # a topic of none is kept
            piece.append(_FetchTopic(tp.name, ()))
            size += 1
        at = 0
        while at < len(indexes) or size >= PARTITIONS_PER_SLICE:
            if size >= PARTITIONS_PER_SLICE:
                yield piece
                piece, size, pieces = [], 0, pieces + 1
                continue
            taken = indexes[at : at + PARTITIONS_PER_SLICE - size]
            piece.append(_FetchTopic(tp.name, taken))
            size += len(taken)
            at += len(taken)
    if piece or not pieces:  # a group asking for no topics is answered too
        yield piece


def _weight(topics: Any) -> int:
    return 1 if topics is None else max(1, sum(len(tp.partition_indexes) for tp in topics))


def _joined_pieces(groups: Sequence[int], answers: Sequence[dict[str, Any]]) -> list[Any]:
    """The answers of each group's pieces (``groups`` names the group of each, in order) as
    one answer per group: its first error if a piece had one, else every piece's topics."""
    joined: dict[int, list[dict[str, Any]]] = {}
    for group, answer in zip(groups, answers, strict=True):
        joined.setdefault(group, []).append(answer)
    out = []
    for parts in joined.values():
        failed = [a for a in parts if a["error_code"] != Errors.NONE]
        if failed:
            out.append(failed[0])
        elif len(parts) == 1:
            out.append(parts[0])
        else:
            topics = _merged_topics([t for a in parts for t in a["topics"]])
            out.append({**parts[0], "topics": topics})
    return out


async def _settle_all(results: list[Result]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        for r in results:
            out.append(await _settle(r))
    except BaseException:
        _close(results[len(out) :])
        raise
    return out


def _close(results: Sequence[Result]) -> None:
    """Close the answers no one will await: a request naming 300,000 groups whose connection
    closed left as many coroutines never awaited (each a RuntimeWarning, an error in tests).
    The calls themselves were made; only their answers go."""
    for r in results:
        if isinstance(r, Deferred) and inspect.iscoroutine(r.awaitable):
            r.awaitable.close()


async def _settle(result: Result) -> dict[str, Any]:
    """The values of an immediate or deferred result."""
    if isinstance(result, Deferred):
        return dict(await result.awaitable)
    assert isinstance(result, dict)
    return result


def _set_authorized_operations(groups: list[dict[str, Any]], asked: bool) -> None:
    """KafkaApis' describe handlers: the operations on each group described without error, when
    asked for (see ``acls``)."""
    if asked:
        for group in groups:
            if group["error_code"] == Errors.NONE:
                group["authorized_operations"] = authorized_operations(GROUP_OPERATIONS, asked)
