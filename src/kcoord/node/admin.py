"""The admin HTTP server (``admin.listener``, default 127.0.0.1:8080): metrics, health, JSON API.

Endpoints
---------
::

    GET /healthz                 200 while the process serves HTTP (liveness)
    GET /readyz                  200 once registered, unfenced and caught up with the metadata
                                 log and the Kafka listener is up; else 503 and the reasons
    GET /metrics                 Prometheus text format (node/metrics.py); 404 when
                                 metrics.enable=false
    GET /api/v1/cluster          cluster id, this node, brokers, the active controller and the
                                 metadata quorum as the Raft leader reports it (it asks the
                                 active controller, up to 2 s)
    GET /api/v1/brokers          the registered brokers (epoch, fenced, rack, endpoints) and
                                 the metadata offset, from this node's image alone: it answers
                                 at once while the active controller does not (the chaos
                                 runner's fencing watch reads it during pauses)
    GET /api/v1/topics           every topic: id, partition count, replication factor, configs
    GET /api/v1/topics/{name}    its partitions: leader, leader epoch, replicas, ISR, ELR and
                                 high watermark, log end and log start offsets
    GET /api/v1/groups           every group of the cluster (ListGroups on every node);
                                 ``?state=Stable`` filters (case-insensitive)
    GET /api/v1/groups/{id}      state, protocol type and name, generation, leader, members
                                 (client id, host, assignment) and, per partition, committed
                                 offset, log end offset, lag and the member that owns it;
                                 ``lag`` sums the partitions' known lags and
                                 ``lag_unknown_partitions`` counts the others (no commit yet,
                                 or no leader to ask), so a partial sum is not read as whole;
                                 ``timeline``: the group's latest rebalance steps as its
                                 coordinator saw them (DESIGN §8; ``RebalanceEvent``: time,
                                 state entered, generation or epoch, members, and why)
    GET /api/v1/rebalances       this node's latest rebalance steps of every group it
                                 coordinates, oldest first; ``?limit=N`` (default 100)

Answers are JSON; errors are ``{"error": {"status": ..., "message": ...}}`` with a 4xx for bad
input (400 a malformed name or filter, 404 an unknown topic, group or path, 405 a method other
than GET, 401 a missing or wrong token) and 503 when the cluster cannot answer yet (no
coordinator for the group, shard loading, no partition leader). A handler that fails answers
500 and the node keeps serving.

Any node answers for the whole cluster, as a Kafka bootstrap server does; it asks the others
over the inter-node RPC (the handlers are here too, ``rpc_handlers``):

- ``PartitionOffsets``: the high watermark, log end and log start offsets of the partitions the
  called node leads. A topic's offsets and a group's log end offsets come from each partition's
  leader (the only node whose HW is current), one call per leader node.
- ``AdminListGroups`` / ``AdminDescribeGroup``: a group lives in its coordinator's shard, so
  ``/groups/{id}`` is proxied to the coordinator (the leader of the group's
  ``__consumer_offsets`` partition) rather than answered with a redirect: users (and the
  tools that call this) get the answer from whichever node they asked, as
  kafka-consumer-groups.sh does through any bootstrap server. The coordinator reads the group
  through its runtime (DescribeGroups and OffsetFetch handlers), so it sees committed state
  only, as Kafka clients do. ``/groups`` asks every unfenced node and merges; a node that does
  not answer is listed under ``unavailable`` (the answer is then partial, still 200).

Lag is the partition's high watermark (what ``ListOffsets(latest)`` and kafka-consumer-groups'
LOG-END-OFFSET show) minus the committed offset; it is null when the leader did not answer.

Authentication: with ``admin.api.token`` set, every request but ``/healthz`` and ``/readyz``
(probes that reveal nothing) needs ``Authorization: Bearer <token>``; otherwise 401. The
listener binds to loopback unless ``admin.listener`` says otherwise.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from kcoord.cluster.coordinator import consumer_protocol
from kcoord.cluster.coordinator.consumer import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerGroup,
    assignor_name,
)
from kcoord.cluster.coordinator.timeline import RECENT_REBALANCE_EVENTS
from kcoord.cluster.coordinator.types import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kcoord.cluster.coordinator.wire import WireFormatError
from kcoord.cluster.routing import partition_for
from kcoord.errors import Errors
from kcoord.node.config import registered_endpoint
from kcoord.node.metrics import CONTENT_TYPE, NodeMetrics
from kcoord.node.rpc import RpcClientError, RpcError
from kcoord.node.runtime import OFFSETS_TOPIC, CoordinatorError
from kcoord.raft.image import PartitionState

if TYPE_CHECKING:
    from kcoord.node.server import Node

log = logging.getLogger(__name__)

RPC_TIMEOUT_S: Final = 2.0
# A scrape waits at most this long for the leaders' high watermarks (lag of remote partitions).
METRICS_OFFSETS_TIMEOUT_S: Final = 1.0
MAX_GROUP_ID_CHARS: Final = 32767  # a Kafka string (int16 length)
# /api/v1/rebalances without ?limit: the latest this many steps; a limit is ASCII digits.
DEFAULT_REBALANCES_LIMIT: Final = 100
_LIMIT: Final = re.compile(r"[0-9]{1,5}")
_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's legal topic names
# Group states a ``?state=`` filter may name: the classic ones and KIP-848's.
_GROUP_STATES: Final = frozenset(
    s.lower()
    for s in (
        "Empty",
        "PreparingRebalance",
        "CompletingRebalance",
        "Stable",
        "Dead",
        "Assigning",
        "Reconciling",
        "NotReady",
    )
)
_OPEN_PATHS: Final = frozenset({"/healthz", "/readyz"})
# The admin listener's bounds: how long a stop waits for answers being sent, how long an idle
# kept-alive connection stays, and how many connections are served at once (a connection past
# it is closed at once: the descriptors are the data directory's, see server.py).
ADMIN_SHUTDOWN_TIMEOUT_S: Final = 1.0
ADMIN_KEEPALIVE_S: Final = 15.0
MAX_ADMIN_CONNECTIONS: Final = 256

PartitionKey = tuple[str, int]
Handler = Callable[[Any], Awaitable[Any]]


class ApiError(Exception):
    """An answer with an HTTP error status and a message for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_consumer_assignment(data: bytes) -> list[tuple[str, list[int]]] | None:
    """The topic partitions of a ConsumerProtocolAssignment, or None if the bytes do not parse
    (``consumer_protocol.decode_assignment``)."""
    try:
        assignment = consumer_protocol.decode_assignment(data)
    except WireFormatError:
        return None
    return [(topic, list(partitions)) for topic, partitions in assignment.partitions]


def _rpc_address(endpoints: dict[str, str] | Any) -> tuple[str, int] | None:
    endpoint = registered_endpoint(endpoints, "rpc")
    return None if endpoint is None else (endpoint.host, endpoint.port)


class AdminService:
    """What the admin API answers, gathered locally or from other nodes (see the docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def rpc_handlers(self) -> dict[str, Handler]:
        return {
            "PartitionOffsets": self.handle_partition_offsets,
            "AdminListGroups": self.handle_list_groups,
            "AdminDescribeGroup": self.handle_describe_group,
        }

    # -----------------------------------------------------------------------------------------
    # Health.

    def readiness(self) -> list[str]:
        """Why this node is not ready; empty when it is."""
        node = self.node
        lifecycle = node.lifecycle
        reasons = []
        if lifecycle is None:
            return ["starting"]
        if lifecycle.broker_epoch is None:
            reasons.append("not registered with the controller")
        elif lifecycle.is_fenced:
            reasons.append("fenced")
        if not lifecycle.is_caught_up:
            reasons.append("not caught up with the metadata log")
        if node.kafka is None:
            reasons.append("kafka listener not started")
        return reasons

    # -----------------------------------------------------------------------------------------
    # Partition offsets, from the partitions' leaders.

    def local_partition_offsets(self, items: Iterable[Any]) -> list[dict[str, Any]]:
        replicas = self.node.replicas
        out = []
        for item in items:
            topic, partition = str(item[0]), int(item[1])
            part = replicas.partitions.get((topic, partition)) if replicas is not None else None
            if part is None or not part.is_leader:
                out.append(
                    {
                        "topic": topic,
                        "partition": partition,
                        "error": int(Errors.NOT_LEADER_OR_FOLLOWER),
                    }
                )
                continue
            out.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "error": int(Errors.NONE),
                    "high_watermark": part.high_watermark,
                    "log_end_offset": part.log.log_end_offset,
                    "log_start_offset": part.log.log_start_offset,
                }
            )
        return out

    async def handle_partition_offsets(self, payload: Any) -> dict[str, Any]:
        """RPC ``PartitionOffsets``: ``{partitions: [[topic, partition], ...]}`` ->
        ``{partitions: [{topic, partition, error, high_watermark, log_end_offset,
        log_start_offset}]}`` for the partitions this node leads (others: an error)."""
        return {"partitions": self.local_partition_offsets(payload["partitions"])}

    async def partition_offsets(
        self, partitions: Iterable[PartitionKey], timeout_s: float = RPC_TIMEOUT_S
    ) -> dict[PartitionKey, dict[str, int]]:
        """The offsets of each partition from its leader; missing where it did not answer."""
        image = self.node.cache.image
        by_leader: dict[int, list[list[Any]]] = {}
        for topic, partition in set(partitions):
            topic_image = image.topic_by_name(topic)
            state = (
                None if topic_image is None else image.partition(topic_image.topic_id, partition)
            )
            if state is None or state.leader < 0:
                continue
            by_leader.setdefault(state.leader, []).append([topic, partition])
        results: dict[PartitionKey, dict[str, int]] = {}

        async def ask(leader: int, items: list[list[Any]]) -> list[dict[str, Any]]:
            if leader == self.node.config.node_id:
                return self.local_partition_offsets(items)
            broker = image.broker(leader)
            address = _rpc_address(broker.endpoints if broker is not None else None)
            if address is None:
                return []
            reply = await self.node.rpc_pool.call(
                address[0], address[1], "PartitionOffsets", {"partitions": items}, timeout_s
            )
            answers: list[dict[str, Any]] = reply["partitions"]
            return answers

        replies = await asyncio.gather(
            *(ask(leader, items) for leader, items in by_leader.items()), return_exceptions=True
        )
        for (leader, _), reply in zip(by_leader.items(), replies, strict=True):
            if isinstance(reply, BaseException):
                log.info("admin: no partition offsets from node %d: %s", leader, reply)
                continue
            for r in reply:
                if r.get("error") == int(Errors.NONE):
                    results[(str(r["topic"]), int(r["partition"]))] = {
                        "high_watermark": int(r["high_watermark"]),
                        "log_end_offset": int(r["log_end_offset"]),
                        "log_start_offset": int(r["log_start_offset"]),
                    }
        return results

    # -----------------------------------------------------------------------------------------
    # Cluster and topics (from this node's metadata image).

    async def cluster(self) -> dict[str, Any]:
        node = self.node
        image = node.cache.image
        status = node.quorum.status() if node.quorum is not None else None
        quorum: dict[str, Any] | None = None
        quorum_error: str | None = None
        if node.kafka is not None:
            try:
                quorum = await node.kafka.ctx.controller.call("DescribeQuorum", {}, RPC_TIMEOUT_S)
            except Exception as e:  # no active controller in time
                quorum_error = str(e) or type(e).__name__
        if quorum is None and node.quorum is not None:
            quorum = await node.describe_quorum({})  # this voter's own view
        return {
            "cluster_id": image.cluster_id,
            "node_id": node.config.node_id,
            "metadata_offset": image.last_offset,
            "controller": {
                "node_id": None if status is None else status.leader_id,
                "epoch": None if status is None else status.epoch,
            },
            "brokers": self.brokers()["brokers"],
            "quorum": quorum,
            "quorum_error": quorum_error,
        }

    def brokers(self) -> dict[str, Any]:
        """The registered brokers as this node's image holds them: no call to another node."""
        image = self.node.cache.image
        return {
            "node_id": self.node.config.node_id,
            "metadata_offset": image.last_offset,
            # False while the node catches up after its start: its image is its own old log's.
            "serving": self.node.kafka is not None,
            "brokers": [
                {
                    "node_id": b.broker_id,
                    "epoch": b.broker_epoch,
                    "fenced": b.fenced,
                    "rack": b.rack,
                    "endpoints": dict(b.endpoints),
                }
                for b in sorted(image.brokers.values(), key=lambda b: b.broker_id)
            ],
        }

    def topics(self) -> list[dict[str, Any]]:
        image = self.node.cache.image
        out = []
        for topic in sorted(image.topics.values(), key=lambda t: t.name):
            partitions = image.partitions_of(topic.topic_id)
            out.append(
                {
                    "name": topic.name,
                    "topic_id": topic.topic_id,
                    "internal": topic.name == OFFSETS_TOPIC,
                    "partitions": len(partitions),
                    "replication_factor": max((len(p.replicas) for p in partitions), default=0),
                    "offline_partitions": sum(p.leader < 0 for p in partitions),
                    "under_replicated_partitions": sum(
                        len(p.isr) < len(p.replicas) for p in partitions
                    ),
                    "configs": dict(topic.configs),
                }
            )
        return out

    async def topic(self, name: str) -> dict[str, Any]:
        if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            raise ApiError(400, f"invalid topic name {name!r}")
        image = self.node.cache.image
        topic = image.topic_by_name(name)
        if topic is None:
            raise ApiError(404, f"unknown topic {name!r}")
        states = image.partitions_of(topic.topic_id)
        offsets = await self.partition_offsets((name, p.partition) for p in states)
        return {
            "name": topic.name,
            "topic_id": topic.topic_id,
            "internal": topic.name == OFFSETS_TOPIC,
            "configs": dict(topic.configs),
            "partitions": [_partition_json(p, offsets.get((name, p.partition))) for p in states],
        }

    # -----------------------------------------------------------------------------------------
    # Groups.

    async def handle_list_groups(self, payload: Any) -> dict[str, Any]:
        """RPC ``AdminListGroups``: the groups this node coordinates (ListGroups on its
        shards); ``{groups: [{group_id, state, protocol_type, type}], error}``."""
        runtime = self.node.coordinator
        if runtime is None:
            return {"groups": [], "error": int(Errors.COORDINATOR_NOT_AVAILABLE)}
        try:
            futures = runtime.list_groups(ListGroupsRequest())
        except CoordinatorError as e:
            return {"groups": [], "error": int(e.code)}
        groups: list[dict[str, Any]] = []
        error = Errors.NONE
        for reply in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(reply, CoordinatorError):
                error = reply.code  # a shard unloaded meanwhile: partial
                continue
            if isinstance(reply, BaseException):
                raise reply
            assert isinstance(reply, ListGroupsResponse)
            groups.extend(
                {
                    "group_id": g.group_id,
                    "state": g.group_state,
                    "protocol_type": g.protocol_type,
                    "type": g.group_type,
                }
                for g in reply.groups
            )
        return {"groups": groups, "error": int(error)}

    async def list_groups(self, state: str | None) -> dict[str, Any]:
        if state is not None and state.strip().lower() not in _GROUP_STATES:
            raise ApiError(400, f"unknown group state {state!r}")
        node = self.node
        image = node.cache.image
        alive = sorted(image.unfenced_broker_ids())

        async def ask(node_id: int) -> dict[str, Any]:
            if node_id == node.config.node_id:
                return await self.handle_list_groups({})
            broker = image.broker(node_id)
            address = _rpc_address(broker.endpoints if broker is not None else None)
            if address is None:
                raise ApiError(503, f"node {node_id} has no RPC endpoint")
            reply: dict[str, Any] = await node.rpc_pool.call(
                address[0], address[1], "AdminListGroups", {}, RPC_TIMEOUT_S
            )
            return reply

        replies = await asyncio.gather(*(ask(i) for i in alive), return_exceptions=True)
        groups: list[dict[str, Any]] = []
        unavailable = []
        for node_id, reply in zip(alive, replies, strict=True):
            if isinstance(reply, BaseException):
                unavailable.append(
                    {"node_id": node_id, "error": str(reply) or type(reply).__name__}
                )
                continue
            if reply.get("error"):
                unavailable.append({"node_id": node_id, "error": _error_name(reply["error"])})
            for g in reply["groups"]:
                if state is None or g["state"].lower() == state.strip().lower():
                    groups.append({**g, "coordinator": node_id})
        groups.sort(key=lambda g: g["group_id"])
        return {"groups": groups, "unavailable": unavailable}

    async def handle_describe_group(self, payload: Any) -> dict[str, Any]:
        """RPC ``AdminDescribeGroup``: ``{group_id}`` -> the group as this node, its
        coordinator, has it (``describe_group_local``); errors are RpcErrors with Kafka's code
        (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, GROUP_ID_NOT_FOUND)."""
        return await self.describe_group_local(str(payload["group_id"]))

    async def describe_group_local(self, group_id: str) -> dict[str, Any]:
        runtime = self.node.coordinator
        if runtime is None:
            raise RpcError(int(Errors.COORDINATOR_NOT_AVAILABLE), "no coordinator runtime")
        try:
            described = await runtime.call(
                group_id,
                lambda s, tok, now: s.handle_describe_groups(
                    tok,
                    DescribeGroupsRequest(groups=(group_id,), report_group_id_not_found=True),
                    now,
                ),
                replay_only=True,  # a read: if it raises, it fails alone
            )
            fetched = await runtime.call(
                group_id,
                lambda s, tok, now: s.handle_offset_fetch(
                    tok, OffsetFetchRequest(group_id=group_id), now
                ),
                replay_only=True,
            )
            ctx = runtime.context_for(group_id)
        except CoordinatorError as e:
            raise RpcError(int(e.code), str(e)) from e
        assert isinstance(described, DescribeGroupsResponse)
        assert isinstance(fetched, OffsetFetchResponse)
        group = described.groups[0]
        live = ctx.shard.group(group_id) if ctx.shard is not None else None
        consumer_group = ctx.shard.consumer_groups.get(group_id) if ctx.shard is not None else None
        if consumer_group is not None:
            # DescribeGroups reads a KIP-848 group as Dead (Kafka's describeGroups): its state
            # and type come from the group itself, as ConsumerGroupDescribe gives them.
            group = replace(
                group,
                error_code=Errors.NONE,
                group_state=consumer_group.state,
                protocol_type=CONSUMER_PROTOCOL_TYPE,
            )
        if group.error_code is not Errors.NONE:
            raise RpcError(int(group.error_code), group.error_message or group.error_code.name)
        members = [] if consumer_group is None else self._consumer_group_members(consumer_group)
        for m in group.members:
            assignment = (
                parse_consumer_assignment(m.member_assignment)
                if group.protocol_type == "consumer"
                else None
            )
            members.append(
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "assignment": None
                    if assignment is None
                    else [{"topic": t, "partitions": sorted(ps)} for t, ps in assignment],
                }
            )
        offsets = [
            {
                "topic": topic.name,
                "partition": p.partition_index,
                "committed_offset": p.committed_offset,
                "leader_epoch": p.committed_leader_epoch,
                "metadata": p.metadata,
            }
            for topic in fetched.topics
            for p in topic.partitions
            if p.error_code is Errors.NONE and p.committed_offset >= 0
        ]
        return {
            "group_id": group_id,
            "coordinator": {"node_id": self.node.config.node_id, "partition": ctx.index},
            "state": group.group_state,
            "protocol_type": group.protocol_type,
            # A KIP-848 group's is its server assignor (ConsumerGroupDescribe's AssignorName).
            "protocol": assignor_name(consumer_group, runtime.config.consumer_assignors)
            if consumer_group is not None
            else (live.protocol_name if live is not None else None) or group.protocol_data or None,
            "generation_id": live.generation_id
            if live is not None
            else consumer_group.group_epoch
            if consumer_group is not None
            else None,
            "leader": live.leader_id if live is not None else None,
            "members": members,
            "offsets": offsets,
            "timeline": [e.as_dict() for e in runtime.stats.timeline(group_id)],
        }

    def _consumer_group_members(self, group: ConsumerGroup) -> list[dict[str, Any]]:
        """A KIP-848 group's members (DescribeGroups does not list them, as in Kafka): their
        assigned partitions by topic name."""
        image = self.node.cache.image
        members = []
        for m in group.members.values():
            assignment = []
            for topic_id, partitions in sorted(m.assigned.items()):
                topic = image.topic(topic_id)
                name = topic.name if topic is not None else topic_id
                assignment.append({"topic": name, "partitions": sorted(partitions)})
            members.append(
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_epoch": m.member_epoch,
                    "assignment": assignment,
                }
            )
        return members

    def coordinator_of(self, group_id: str) -> tuple[int, int]:
        """(offsets partition, its leader) for a group; ApiError 503 when there is none."""
        node = self.node
        image = node.cache.image
        topic = image.topic_by_name(OFFSETS_TOPIC)
        states = [] if topic is None else image.partitions_of(topic.topic_id)
        if not states:
            raise ApiError(503, f"{OFFSETS_TOPIC} does not exist yet")
        partition = partition_for(group_id, len(states))
        state = image.partition(states[0].topic_id, partition)
        if state is None or state.leader < 0:
            raise ApiError(503, f"{OFFSETS_TOPIC}-{partition} has no leader (no coordinator)")
        return partition, state.leader

    def rebalances(self, limit: int) -> dict[str, Any]:
        """The latest ``limit`` rebalance steps this node's coordinator saw, oldest first."""
        runtime = self.node.coordinator
        events = runtime.stats.rebalance_events.latest(limit) if runtime is not None else []
        return {
            "node_id": self.node.config.node_id,
            "events": [{"group_id": e.group_id, **e.as_dict()} for e in events],
        }

    async def group(self, group_id: str) -> dict[str, Any]:
        if not group_id or len(group_id) > MAX_GROUP_ID_CHARS:
            raise ApiError(400, "a group id has 1 to 32767 characters")
        node = self.node
        partition, coordinator = self.coordinator_of(group_id)
        try:
            if coordinator == node.config.node_id:
                described = await self.describe_group_local(group_id)
            else:
                broker = node.cache.image.broker(coordinator)
                address = _rpc_address(broker.endpoints if broker is not None else None)
                if address is None:
                    raise ApiError(503, f"coordinator {coordinator} has no RPC endpoint")
                described = await node.rpc_pool.call(
                    address[0],
                    address[1],
                    "AdminDescribeGroup",
                    {"group_id": group_id},
                    RPC_TIMEOUT_S,
                )
        except RpcError as e:  # local, or the coordinator's answer (RpcRemoteError)
            code = e.code
            if code == int(Errors.GROUP_ID_NOT_FOUND):
                raise ApiError(404, f"unknown group {group_id!r}") from e
            raise ApiError(
                503,
                f"coordinator {coordinator} ({OFFSETS_TOPIC}-{partition}) cannot answer: "
                f"{_error_name(code)}",
            ) from e
        except RpcClientError as e:  # a timeout or a lost connection
            raise ApiError(503, f"coordinator {coordinator} did not answer: {e}") from e
        return await self._with_lag(described)

    async def _with_lag(self, described: dict[str, Any]) -> dict[str, Any]:
        """Add log end offsets, lags and owners to a group's partitions (see the docstring)."""
        owners: dict[PartitionKey, dict[str, Any]] = {}
        for m in described["members"]:
            for item in m["assignment"] or []:
                for p in item["partitions"]:
                    owners[(item["topic"], int(p))] = m
        rows: dict[PartitionKey, dict[str, Any]] = {}
        for o in described["offsets"]:
            rows[(o["topic"], int(o["partition"]))] = dict(o)
        for key in owners:
            rows.setdefault(
                key,
                {
                    "topic": key[0],
                    "partition": key[1],
                    "committed_offset": None,
                    "leader_epoch": None,
                    "metadata": None,
                },
            )
        ends = await self.partition_offsets(rows)
        total_lag = unknown = 0
        for key, row in rows.items():
            end = ends.get(key)
            row["log_end_offset"] = None if end is None else end["high_watermark"]
            committed = row["committed_offset"]
            row["lag"] = (
                None if end is None or committed is None else end["high_watermark"] - committed
            )
            if row["lag"] is None:
                unknown += 1
            else:
                total_lag += row["lag"]
            owner = owners.get(key)
            row["member_id"] = owner["member_id"] if owner else None
            row["client_id"] = owner["client_id"] if owner else None
            row["client_host"] = owner["client_host"] if owner else None
        return {
            **described,
            "offsets": [rows[k] for k in sorted(rows)],
            "lag": total_lag,
            "lag_unknown_partitions": unknown,
        }

    # -----------------------------------------------------------------------------------------
    # Metrics.

    async def remote_end_offsets(self, wanted: set[PartitionKey]) -> dict[PartitionKey, int]:
        """For a scrape: the HWs of partitions this node's groups committed to that other
        nodes lead (node/metrics.py's consumer lag)."""
        offsets = await self.partition_offsets(wanted, METRICS_OFFSETS_TIMEOUT_S)
        return {k: v["high_watermark"] for k, v in offsets.items()}


def _error_name(code: Any) -> str:
    try:
        return Errors(int(code)).name
    except (ValueError, TypeError):
        return str(code)


def _partition_json(state: PartitionState, offsets: dict[str, int] | None) -> dict[str, Any]:
    return {
        "partition": state.partition,
        "leader": state.leader if state.leader >= 0 else None,
        "leader_epoch": state.leader_epoch,
        "replicas": list(state.replicas),
        "isr": list(state.isr),
        "elr": list(state.elr),
        "offline": state.leader < 0,
        "under_replicated": len(state.isr) < len(state.replicas),
        "high_watermark": None if offsets is None else offsets["high_watermark"],
        "log_end_offset": None if offsets is None else offsets["log_end_offset"],
        "log_start_offset": None if offsets is None else offsets["log_start_offset"],
    }


# The rows of one answer's list encoded in one go (``_large_json``).
JSON_SLICE_ROWS: Final = 500


async def _large_json(data: dict[str, Any]) -> web.Response:
    """``web.json_response`` of an answer that grows with the cluster (every committed offset
    of a group, every group, every topic): its lists are encoded ``JSON_SLICE_ROWS`` rows at a
    time, the event loop free between two slices. In one go, 100,000 offsets held the loop,
    and the node's heartbeats, half a second (json's encoder keeps the interpreter lock, so a
    worker thread did not help)."""
    parts = ["{"]
    for i, (key, value) in enumerate(data.items()):
        parts.append(("," if i else "") + json.dumps(key) + ":")
        if not isinstance(value, list) or len(value) <= JSON_SLICE_ROWS:
            parts.append(json.dumps(value))
            continue
        parts.append("[")
        for start in range(0, len(value), JSON_SLICE_ROWS):
            await asyncio.sleep(0)  # the loop's turn between two slices
            parts.append(
                ("," if start else "") + json.dumps(value[start : start + JSON_SLICE_ROWS])[1:-1]
            )
        parts.append("]")
    parts.append("}")
    return web.Response(body="".join(parts).encode(), content_type="application/json")


def _json_error(status: int, message: str) -> web.Response:
    response = web.json_response({"error": {"status": status, "message": message}}, status=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="kcoord"'
    return response


class _Refused(asyncio.Protocol):
    """A connection past the admin listener's cap: closed as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted in ``counted[0]`` until it is lost."""

    def __init__(self, inner: asyncio.BaseProtocol, counted: list[int]) -> None:
        self.inner = inner
        self.counted = counted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.counted[0] -= 1
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[attr-defined,no-any-return]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log, with a request that does not parse as HTTP (a header line past
    8190 bytes, a malformed start line) logged at debug: the client's error, answered 400, as
    aiohttp itself logs a bad method on a new connection. At ERROR with a traceback, any
    client reaching the port could fill the node's log (and fail ``make soak``)."""

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        if isinstance(kwargs.get("exc_info"), HttpProcessingError):
            self.debug(msg, *args, **kwargs)
            return
        super().exception(msg, *args, **kwargs)


class _CappedSite(web.TCPSite):
    """aiohttp's TCP site, serving at most ``max_connections`` connections at once."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        max_connections: int,
        reuse_address: bool,
    ) -> None:
        super().__init__(runner, host, port, reuse_address=reuse_address)
        self.max_connections = max_connections

    async def start(self) -> None:
        server = self._runner.server
        assert server is not None
        # Counted here, as each connection is made and lost: aiohttp lists a connection only
        # once its connection_made runs, a loop pass later, so a burst all passed a check of
        # its list (20 at once against a cap of 2). (review helper-212)
        counted = [0]

        def protocol() -> asyncio.BaseProtocol:
            if counted[0] >= self.max_connections:
                return _Refused()
            counted[0] += 1
            return _Counted(server(), counted)

        # TCPSite.start with the capped factory (BaseSite.start registers the site).
        await web.BaseSite.start(self)
        self._server = await asyncio.get_running_loop().create_server(
            protocol, self._host, self._port, reuse_address=self._reuse_address
        )


class AdminServer:
    """The aiohttp application on ``admin.listener`` (see the module docstring)."""

    def __init__(
        self,
        service: AdminService,
        metrics: NodeMetrics,
        *,
        token: str | None = None,
        metrics_enabled: bool | None = None,
    ) -> None:
        config = service.node.config
        self.service = service
        self.metrics = metrics
        self.token = config.admin_api_token if token is None else token
        self.metrics_enabled = config.metrics_enable if metrics_enabled is None else metrics_enabled
        self.app = web.Application(middlewares=[self._errors, self._auth])
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/api/v1/cluster", self._cluster)
        self.app.router.add_get("/api/v1/brokers", self._brokers)
        self.app.router.add_get("/api/v1/topics", self._topics)
        self.app.router.add_get("/api/v1/topics/{name}", self._topic)
        self.app.router.add_get("/api/v1/groups", self._groups)
        self.app.router.add_get("/api/v1/rebalances", self._rebalances)
        # Any character, a newline included (a group id may hold one).
        self.app.router.add_get("/api/v1/groups/{group_id:[\\s\\S]+}", self._group)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    @property
    def port(self) -> int:
        assert self._runner is not None and self._runner.addresses, "not started"
        port: int = self._runner.addresses[0][1]
        return port

    async def start(self, host: str, port: int) -> None:
        assert self._runner is None, "already started"
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            # A client that does not read its answer held the node's stop for aiohttp's
            # default 60 s (twice), past the launcher's SIGKILL: no clean-shutdown marker.
            shutdown_timeout=ADMIN_SHUTDOWN_TIMEOUT_S,
            # An idle kept-alive connection is let go (aiohttp's default is an hour).
            keepalive_timeout=ADMIN_KEEPALIVE_S,
            logger=_ServerLog(logging.getLogger("aiohttp.server"), {}),
        )
        await self._runner.setup()
        self._site = _CappedSite(
            self._runner, host, port, max_connections=MAX_ADMIN_CONNECTIONS, reuse_address=True
        )
        await self._site.start()
        log.info(
            "admin HTTP on %s:%d%s", host, self.port, " (token required)" if self.token else ""
        )

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -----------------------------------------------------------------------------------------
    # Middlewares.

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return _json_error(e.status, e.message)
        except web.HTTPException as e:  # unknown path (404), wrong method (405), ...
            if e.status < 400:
                raise
            answer = _json_error(e.status, e.reason)
            if "Allow" in e.headers:  # RFC 9110: a 405 names the methods the path takes
                answer.headers["Allow"] = e.headers["Allow"]
            return answer
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("admin: %s %s failed", request.method, request.path)
            return _json_error(500, "internal error (see the node's log)")

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.token is not None and request.path not in _OPEN_PATHS:
            scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
            # Header bytes that are not UTF-8 arrive as surrogates, which encode() refuses:
            # a 500 and a traceback in the node's log for any client.
            offered = credentials.strip().encode(errors="surrogateescape")
            if scheme.lower() != "bearer" or not hmac.compare_digest(offered, self.token.encode()):
                raise ApiError(401, "missing or wrong bearer token (admin.api.token)")
        return await handler(request)

    # -----------------------------------------------------------------------------------------
    # Handlers.

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "node_id": self.service.node.config.node_id})

    async def _readyz(self, request: web.Request) -> web.Response:
        reasons = self.service.readiness()
        return web.json_response(
            {"ready": not reasons, "reasons": reasons, "node_id": self.service.node.config.node_id},
            status=503 if reasons else 200,
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics_enabled:
            raise ApiError(404, "metrics are disabled (metrics.enable=false)")
        body = await self.metrics.scrape(self.service.remote_end_offsets)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _cluster(self, request: web.Request) -> web.Response:
        return web.json_response(await self.service.cluster())

    async def _brokers(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.brokers())

    async def _topics(self, request: web.Request) -> web.Response:
        return await _large_json({"topics": self.service.topics()})

    async def _topic(self, request: web.Request) -> web.Response:
        return web.json_response(await self.service.topic(request.match_info["name"]))

    async def _groups(self, request: web.Request) -> web.Response:
        unknown = set(request.query) - {"state"}
        if unknown:
            raise ApiError(400, f"unknown query parameters {sorted(unknown)}; known: state")
        return await _large_json(await self.service.list_groups(request.query.get("state")))

    async def _rebalances(self, request: web.Request) -> web.Response:
        unknown = set(request.query) - {"limit"}
        if unknown:
            raise ApiError(400, f"unknown query parameters {sorted(unknown)}; known: limit")
        text = request.query.get("limit", str(DEFAULT_REBALANCES_LIMIT))
        if not _LIMIT.fullmatch(text) or not 1 <= int(text) <= RECENT_REBALANCE_EVENTS:
            raise ApiError(400, f"limit must be 1 to {RECENT_REBALANCE_EVENTS}, not {text!r}")
        return web.json_response(self.service.rebalances(int(text)))

    async def _group(self, request: web.Request) -> web.Response:
        return await _large_json(await self.service.group(request.match_info["group_id"]))
