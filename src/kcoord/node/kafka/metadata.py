"""Metadata (apiKey 3) and FindCoordinator (apiKey 10), answered from the node's image.

Metadata (Kafka's ``KafkaApis.handleTopicMetadataRequest`` over ``KRaftMetadataCache``):

- brokers: the registered, unfenced brokers with their advertised Kafka endpoint; the
  controller id is the metadata quorum's leader; the cluster id is the image's.
- topics: all of them when the request says so (null in v1+, empty in v0), else the requested
  ones by name, or by topic id (v12+; an unknown id answers ``UNKNOWN_TOPIC_ID``).
- a requested topic that does not exist is auto-created when both the broker
  (``auto.create.topics.enable``) and the request (v4+ ``allow_auto_topic_creation``) allow it
  and it is not internal: the node forwards CreateTopics (``num.partitions``,
  ``default.replication.factor``) to the active controller and, unlike Kafka, waits a little
  (``AUTO_CREATE_ANSWER_WAIT_MS``) for its own image to have the topic, so the client
  usually gets the partitions in this answer instead of ``UNKNOWN_TOPIC_OR_PARTITION`` and a
  retry;
  the creation goes on meanwhile (for up to ``auto_create_timeout_ms``), and a controller
  that is away holds the connection (every later request on it) no longer than that wait,
  as Kafka's ``AutoTopicCreationManager`` holds it not at all. An invalid name
  answers ``INVALID_TOPIC_EXCEPTION``; a creation that fails otherwise (a name colliding with
  another topic's) or is not visible in time answers ``UNKNOWN_TOPIC_OR_PARTITION``
  (retriable), as KRaft's ``AutoTopicCreationManager`` answers every topic it sends the
  controller; without auto-creation, ``UNKNOWN_TOPIC_OR_PARTITION`` too.
- partitions: leader (``-1`` with ``LEADER_NOT_AVAILABLE`` when it is not an alive broker),
  leader epoch, replicas, ISR, and offline replicas (those not alive).

- authorized operations (see ``acls``): the topics' (v8+) and the cluster's (v8-v10; KIP-700
  moved it to DescribeCluster) when the request asks for them.

DescribeCluster (apiKey 60, KIP-700; ``KafkaApis.handleDescribeCluster``): the cluster id, the
controller id as Metadata answers it, and the registered brokers with their Kafka endpoint, the
fenced ones too when v2's ``include_fenced_brokers`` asks (``is_fenced``). kcoord's nodes are
brokers: a request for the controller endpoint type answers ``MISMATCHED_ENDPOINT_TYPE``, an
unknown type ``UNSUPPORTED_ENDPOINT_TYPE`` (``INVALID_REQUEST`` in v0, which has no such field
to be wrong), as ``AuthHelper.computeDescribeClusterResponse``. Kafka's brokers answer a random
alive broker as the controller, since a KRaft controller is not reachable on their listener;
every kcoord node is both, so both APIs name the quorum's leader.

DescribeTopicPartitions (apiKey 75, KIP-966; ``DescribeTopicPartitionsRequestHandler`` and
``KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse``): Metadata's partitions plus
each one's eligible leader replicas (ELR) and last known ELR, paged. The requested topics (all
of them when none are named), sorted by name, from the cursor's topic and partition on, at
most ``response_partition_limit`` partitions (and never more than Kafka's
``max.request.partition.size.limit``, 2000); ``next_cursor`` names the first partition left
out. A named topic that does not exist answers ``UNKNOWN_TOPIC_OR_PARTITION``
(``INVALID_TOPIC_EXCEPTION`` for an illegal name); a cursor topic missing from the named
topics makes the request ``INVALID_REQUEST`` for every topic. As in Kafka, a leader is named
while it is registered with a Kafka endpoint, fenced or not, and the topics' authorized
operations are always given.

FindCoordinator (``KafkaApis.handleFindCoordinatorRequest``): a group's coordinator is the
leader of ``__consumer_offsets`` partition ``partition_for(group id, partition count)``;
``COORDINATOR_NOT_AVAILABLE`` while that topic or its leader is missing. Transaction
coordinators do not exist in kcoord: ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, as an
authorizer refusing every transactional id answers (clients give up rather than retry for
ever). Other key types:
``INVALID_REQUEST``. v4+ batches keys with one result each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping
from typing import Any, Final

from kcoord.cluster.routing import partition_for
from kcoord.errors import Errors
from kcoord.node.kafka.acls import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_OPERATIONS,
    TOPIC_OPERATIONS,
    authorized_operations,
)
from kcoord.node.kafka.apis import Request, Result
from kcoord.node.kafka.context import BrokerContext, BrokerEndpoint, is_internal
from kcoord.node.kafka.controller_channel import ControllerUnavailableError
from kcoord.node.rpc import RpcError
from kcoord.raft.controller import OFFSETS_TOPIC_NAME, topic_name_error
from kcoord.raft.image import TopicImage
from kcoord.raft.records import NO_LEADER

log = logging.getLogger(__name__)

METADATA_KEY: Final = 3
FIND_COORDINATOR_KEY: Final = 10
DESCRIBE_CLUSTER_KEY: Final = 60
DESCRIBE_TOPIC_PARTITIONS_KEY: Final = 75
# KafkaConfig max.request.partition.size.limit: the most partitions one answer describes.
MAX_REQUEST_PARTITION_SIZE_LIMIT: Final = 2000
# EndpointType (KIP-919): DescribeCluster asks for the brokers' or the controllers' endpoints.
BROKER_ENDPOINT: Final = 1
CONTROLLER_ENDPOINT: Final = 2
# Metadata versions that carry the cluster's authorized operations (v11 dropped it, KIP-700).
CLUSTER_OPERATIONS_VERSIONS: Final = range(8, 11)
COORDINATOR_KEY_GROUP: Final = 0
COORDINATOR_KEY_TRANSACTION: Final = 1
NO_TRANSACTIONS: Final = (
    "kcoord has no transaction coordinator: transactional producers are refused"
)


# How long a Metadata answer waits for the topics it auto-creates (see the module docstring).
AUTO_CREATE_ANSWER_WAIT_MS: Final = 500


class TopicCreator:
    """Auto-creation of topics (Kafka's ``AutoTopicCreationManager``), one request per name in
    flight however many clients ask for it."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self._in_flight: dict[str, asyncio.Task[None]] = {}

    async def create(self, names: list[str]) -> None:
        """Ask for the topics and wait a little for the creation (it goes on after): the
        answer is the image's, whatever the controller made of the request."""
        new = [n for n in names if n not in self._in_flight]
        if new:
            task = asyncio.create_task(self._create(new), name="kafka-auto-create")
            for name in new:
                self._in_flight[name] = task
            task.add_done_callback(lambda done: self._forget(new, done))
        tasks = {name: self._in_flight[name] for name in names}
        wait_ms = min(self.ctx.settings.auto_create_timeout_ms, AUTO_CREATE_ANSWER_WAIT_MS)
        await asyncio.wait(set(tasks.values()), timeout=wait_ms / 1000)

    def _forget(self, names: list[str], task: asyncio.Task[None]) -> None:
        for name in names:
            if self._in_flight.get(name) is task:
                del self._in_flight[name]

    async def _create(self, names: list[str]) -> None:
        settings = self.ctx.settings
        payload = {
            "topics": [
                {
                    "name": name,
                    "num_partitions": settings.num_partitions,
                    "replication_factor": settings.default_replication_factor,
                    "configs": {},
                }
                for name in names
            ]
        }
        try:
            reply = await self.ctx.controller.call(
                "CreateTopics", payload, settings.auto_create_timeout_ms / 1000
            )
        except (ControllerUnavailableError, RpcError) as e:
            log.warning("auto-creating %d topics (%s) failed: %s", len(names), _some(names), e)
            return
        refused: list[str] = []
        for topic in reply["topics"]:
            error = Errors(topic["error"])
            if error not in (Errors.NONE, Errors.TOPIC_ALREADY_EXISTS):
                refused.append(f"{topic['name']}: {error.name} {topic.get('message', '')}")
        if refused:
            # One line per request: a Metadata request naming 100,000 bad names wrote
            # 16 MB of log, one line each.
            log.warning("auto-creating %d topics refused: %s", len(refused), _some(refused))

    def close(self) -> None:
        for task in set(self._in_flight.values()):
            task.cancel()


def _some(items: list[str], shown: int = 3) -> str:
    """The first few of ``items`` for a log line, and how many more."""
    more = len(items) - shown
    return "; ".join(items[:shown]) + (f"; and {more} more" if more > 0 else "")


class MetadataApi:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.creator = TopicCreator(ctx)

    # -----------------------------------------------------------------------------------------
    # Metadata.

    async def handle_metadata(self, request: Request) -> Result:
        body, version = request.body, request.version
        ctx = self.ctx
        requested = body.topics
        topics: list[dict[str, Any]] = []
        if requested is None or (version == 0 and not requested):
            alive = ctx.alive_brokers()
            image = ctx.image
            names = sorted(t.name for t in image.topics.values())
            topics = [self._describe(image.topic_by_name(n), alive) for n in names]
        else:
            topics = await self._describe_requested(request, requested)
        if getattr(body, "include_topic_authorized_operations", False):
            for topic in topics:
                # KafkaApis.handleTopicMetadataRequest: not on the entries of unknown topic ids.
                if topic["error_code"] is not Errors.UNKNOWN_TOPIC_ID:
                    topic["topic_authorized_operations"] = authorized_operations(
                        TOPIC_OPERATIONS, asked=True
                    )
        asked_cluster = version in CLUSTER_OPERATIONS_VERSIONS and bool(
            getattr(body, "include_cluster_authorized_operations", False)
        )
        alive = ctx.alive_brokers()
        controller_id = _listed_controller_id(ctx, alive)
        return {
            "throttle_time": 0,
            "brokers": [
                {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                for b in alive.values()
            ],
            "cluster_id": ctx.image.cluster_id,
            "controller_id": -1 if controller_id is None else controller_id,
            "topics": topics,
            "cluster_authorized_operations": authorized_operations(
                CLUSTER_OPERATIONS, asked_cluster
            ),
            "error_code": Errors.NONE,
        }

    # -----------------------------------------------------------------------------------------
    # DescribeCluster.

    async def handle_describe_cluster(self, request: Request) -> Result:
        body, version = request.body, request.version
        endpoint_type = int(getattr(body, "endpoint_type", BROKER_ENDPOINT))
        if endpoint_type != BROKER_ENDPOINT:
            if version == 0:
                error = Errors.INVALID_REQUEST
            elif endpoint_type == CONTROLLER_ENDPOINT:
                error = Errors.MISMATCHED_ENDPOINT_TYPE
            else:
                error = Errors.UNSUPPORTED_ENDPOINT_TYPE
            return {
                "throttle_time": 0,
                "error_code": error,
                "error_message": f"this node serves endpoint type {BROKER_ENDPOINT} (broker), "
                f"not {endpoint_type}",
                "cluster_id": "",
                "controller_id": -1,
                "brokers": [],
                "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
            }
        include_fenced = bool(getattr(body, "include_fenced_brokers", False))
        controller_id = _listed_controller_id(self.ctx, self.ctx.alive_brokers())
        return {
            "throttle_time": 0,
            "error_code": Errors.NONE,
            "error_message": None,
            "endpoint_type": BROKER_ENDPOINT,
            "cluster_id": self.ctx.image.cluster_id,
            "controller_id": -1 if controller_id is None else controller_id,
            "brokers": [
                {
                    "broker_id": b.node_id,
                    "host": b.host,
                    "port": b.port,
                    "rack": b.rack,
                    "is_fenced": fenced,
                }
                for b, fenced in self.ctx.registered_brokers()
                if include_fenced or not fenced
            ],
            "cluster_authorized_operations": authorized_operations(
                CLUSTER_OPERATIONS, bool(body.include_cluster_authorized_operations)
            ),
        }

    async def _describe_requested(self, request: Request, requested: Any) -> list[dict[str, Any]]:
        ctx = self.ctx
        version = request.version
        allow_auto = version < 4 or bool(getattr(request.body, "allow_auto_topic_creation", True))
        # (name or None, topic id or None) in request order.
        wanted: list[tuple[str | None, Any]] = []
        for t in requested:
            topic_id = getattr(t, "topic_id", None)
            wanted.append((t.name, None if topic_id is None or topic_id.int == 0 else topic_id))
        if version >= 12 and any(topic_id is not None for _, topic_id in wanted):
            # KafkaApis.handleTopicMetadataRequest: once a topic id is asked for, the request
            # is by ids; names are not looked at (nor topics named without an id).
            wanted = [(None, topic_id) for _, topic_id in wanted if topic_id is not None]
        # handleTopicMetadataRequest answers a set of topics: one answer for a name asked twice.
        wanted = list(dict.fromkeys(wanted))
        missing = [
            name
            for name, topic_id in wanted
            if name is not None and ctx.image.topic_by_name(name) is None
        ]
        # AutoTopicCreationManager.filterCreatableTopics: an illegal name is answered here,
        # not sent to the controller (which may be away: the producer would wait for it).
        creatable = (
            [n for n in dict.fromkeys(missing) if not is_internal(n) and not topic_name_error(n)]
            if allow_auto and ctx.settings.auto_create_topics_enable
            else []
        )
        if creatable:
            await self.creator.create(creatable)
        creating = frozenset(creatable)
        alive = ctx.alive_brokers()
        image = ctx.image
        topics: list[dict[str, Any]] = []
        for name, topic_id in wanted:
            if version < 12 and (name is None or topic_id is not None):
                # Topic ids in requests came with v12 (KIP-516); a null name or a topic id
                # before that is invalid (and these versions' response cannot say null).
                topics.append(_topic_error(Errors.INVALID_REQUEST, name or "", None))
                continue
            if name is None:
                topic = ctx.topic_by_uuid(topic_id)
                if topic is None:
                    topics.append(_topic_error(Errors.UNKNOWN_TOPIC_ID, None, topic_id))
                    continue
            else:
                topic = image.topic_by_name(name)
            if topic is not None:
                topics.append(self._describe(topic, alive))
                continue
            assert name is not None
            if name in creating:
                # Not visible yet, or refused by the controller (a name colliding with another
                # topic's): KRaft's AutoTopicCreationManager answers every topic it asked the
                # controller for so, whatever the controller makes of it.
                error = Errors.UNKNOWN_TOPIC_OR_PARTITION
            elif topic_name_error(name):
                # KafkaApis.getTopicMetadata validates the name whether or not it would create:
                # a producer told the name is illegal fails at once instead of waiting.
                error = Errors.INVALID_TOPIC_EXCEPTION
            else:
                error = Errors.UNKNOWN_TOPIC_OR_PARTITION
            topics.append(_topic_error(error, name, None))
        return topics

    def _describe(
        self, topic: TopicImage | None, alive: dict[int, BrokerEndpoint]
    ) -> dict[str, Any]:
        assert topic is not None
        partitions = []
        for state in self.ctx.image.partitions_of(topic.topic_id):
            leader_alive = state.leader != NO_LEADER and state.leader in alive
            partitions.append(
                {
                    "error_code": Errors.NONE if leader_alive else Errors.LEADER_NOT_AVAILABLE,
                    "partition_index": state.partition,
                    "leader_id": state.leader if leader_alive else -1,
                    "leader_epoch": state.leader_epoch,
                    "replica_nodes": list(state.replicas),
                    "isr_nodes": list(state.isr),
                    "offline_replicas": [r for r in state.replicas if r not in alive],
                }
            )
        return {
            "error_code": Errors.NONE,
            "name": topic.name,
            "topic_id": topic.topic_id,
            "is_internal": is_internal(topic.name),
            "partitions": partitions,
            "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    # -----------------------------------------------------------------------------------------
    # DescribeTopicPartitions.

    async def handle_describe_topic_partitions(self, request: Request) -> Result:
        body = request.body
        image = self.ctx.image
        cursor = body.cursor
        cursor_topic = "" if cursor is None else str(cursor.topic_name)
        named = [str(t.name) for t in body.topics]
        everything = not named
        candidates = sorted(t.name for t in image.topics.values()) if everything else named
        wanted = sorted({n for n in candidates if n >= cursor_topic})
        # The cursor's topic must be one of those named, and its partition not negative
        # (DescribeTopicPartitionsRequestHandler's InvalidRequestException; the check of the
        # partition came after Kafka 4.0, which started a negative one at its first partition).
        if cursor is not None and (
            int(cursor.partition_index) < 0 or (not everything and cursor_topic not in wanted)
        ):
            return {
                "throttle_time": 0,
                "topics": [
                    {
                        **_topic_error(Errors.INVALID_REQUEST, name, None),
                        "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
                    }
                    for name in named
                ],
                "next_cursor": None,
            }
        brokers = self.ctx.registered_brokers()
        registered = {b.node_id for b, _ in brokers}
        alive = {b.node_id for b, fenced in brokers if not fenced}
        # At least one partition an answer, as Kafka after 4.0 has it: with a limit of 0, 4.0
        # answered nothing but a cursor to where it started, and a client paging on would ask
        # again for ever (a negative limit answered nothing and no cursor).
        remaining = max(
            1, min(MAX_REQUEST_PARTITION_SIZE_LIMIT, int(body.response_partition_limit))
        )
        topics: list[dict[str, Any]] = []
        next_cursor: dict[str, Any] | None = None
        for name in wanted:
            if remaining == 0:
                next_cursor = {"topic_name": name, "partition_index": 0}
                break
            topic = image.topic_by_name(name)
            operations = authorized_operations(TOPIC_OPERATIONS, asked=True)
            if topic is None:
                if not everything:
                    error = (
                        Errors.INVALID_TOPIC_EXCEPTION
                        if topic_name_error(name)
                        else Errors.UNKNOWN_TOPIC_OR_PARTITION
                    )
                    topics.append(
                        {
                            **_topic_error(error, name, None),
                            "topic_authorized_operations": operations,
                        }
                    )
                continue
            states = image.partitions_of(topic.topic_id)
            start = cursor.partition_index if cursor is not None and name == cursor_topic else 0
            upper = min(len(states), start + remaining)
            partitions = [
                {
                    "error_code": Errors.NONE,
                    "partition_index": state.partition,
                    "leader_id": state.leader if state.leader in registered else -1,
                    "leader_epoch": state.leader_epoch,
                    "replica_nodes": list(state.replicas),
                    "isr_nodes": list(state.isr),
                    "eligible_leader_replicas": list(state.elr),
                    "last_known_elr": list(state.last_known_elr),
                    "offline_replicas": [r for r in state.replicas if r not in alive],
                }
                for state in states
                if start <= state.partition < upper
            ]
            topics.append(
                {
                    "error_code": Errors.NONE,
                    "name": name,
                    "topic_id": topic.topic_id,
                    "is_internal": is_internal(name),
                    "partitions": partitions,
                    "topic_authorized_operations": operations,
                }
            )
            if upper < len(states):
                next_cursor = {"topic_name": name, "partition_index": upper}
                break
            remaining -= len(partitions)
        return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}

    # -----------------------------------------------------------------------------------------
    # FindCoordinator.

    async def handle_find_coordinator(self, request: Request) -> Result:
        body, version = request.body, request.version
        key_type = int(getattr(body, "key_type", COORDINATOR_KEY_GROUP))
        if version >= 4:
            return {
                "throttle_time": 0,
                "coordinators": [
                    {"key": key, **self._coordinator(key, key_type)}
                    for key in body.coordinator_keys
                ],
            }
        return {"throttle_time": 0, **self._coordinator(body.key, key_type)}

    def _coordinator(self, key: str, key_type: int) -> dict[str, Any]:
        if key_type == COORDINATOR_KEY_TRANSACTION:
            # No transaction coordinator: every transactional id is refused, with the answer of
            # a Kafka whose authorizer denies it (KafkaApis.handleFindCoordinatorRequest). It is
            # the one error all three clients treat as fatal; COORDINATOR_NOT_AVAILABLE made
            # init_transactions() retry until its timeout.
            return _no_coordinator(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NO_TRANSACTIONS)
        if key_type != COORDINATOR_KEY_GROUP:
            return _no_coordinator(Errors.INVALID_REQUEST, f"unknown key type {key_type}")
        image = self.ctx.image
        offsets = image.topic_by_name(OFFSETS_TOPIC_NAME)
        count = 0 if offsets is None else len(image.partitions_of(offsets.topic_id))
        if offsets is None or count == 0:
            return _no_coordinator(
                Errors.COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC_NAME} does not exist yet"
            )
        state = image.partition(offsets.topic_id, partition_for(key, count))
        alive = self.ctx.alive_brokers()
        if state is None or state.leader not in alive:
            return _no_coordinator(
                Errors.COORDINATOR_NOT_AVAILABLE, "the group's partition has no live leader"
            )
        node = alive[state.leader]
        return {
            "error_code": Errors.NONE,
            "error_message": None,
            "node_id": node.node_id,
            "host": node.host,
            "port": node.port,
        }

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.creator.close()


def _topic_error(error: Errors, name: str | None, topic_id: Any) -> dict[str, Any]:
    return {
        "error_code": error,
        "name": name,
        "topic_id": topic_id,
        "is_internal": name is not None and is_internal(name),  # Topic.isInternal, as Kafka's
        "partitions": [],
        "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _no_coordinator(error: Errors, message: str) -> dict[str, Any]:
    return {"error_code": error, "error_message": message, "node_id": -1, "host": "", "port": -1}


def _listed_controller_id(ctx: BrokerContext, alive: Mapping[int, BrokerEndpoint]) -> int | None:
    """The controller id a client is told: the active controller while its broker is alive,
    else a random alive broker (a KRaft broker always answers one, KafkaApis'
    ``getRandomAliveBrokerId``, and forwards admin requests): kafka-python's admin client
    connects to the id it is given, which must be in the brokers list (the active
    controller's broker may still be fenced just after a restart)."""
    controller_id = ctx.controller_id()
    if controller_id in alive:
        return controller_id
    return random.choice(list(alive)) if alive else None
