"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37) and ElectLeaders (43):
forwarded to the controller.

As Kafka's ``ControllerApis`` and its broker-side forwarding: the node checks what it can
locally (duplicate names in one request, requests kcoord does not support), forwards the rest
to the active controller over the inter-node RPC (``ControllerChannel``; in-process when this
node is the controller), and answers per topic with the controller's error code and message.
``validate_only`` runs the controller's checks without committing anything. The answer is
written only once this node's metadata image holds the result, so the client's next Metadata
request, to this node, already sees the change. A controller that cannot be reached before the
request's timeout answers ``REQUEST_TIMED_OUT`` for every topic it had to decide.

A created topic's answer (v5+) carries every effective config with its source (KIP-525).
Deviation from Kafka: ``__consumer_offsets`` cannot be deleted (``INVALID_REQUEST``: it holds
every group's state and coordinator routing).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import PARTITIONS_PER_SLICE, Request, Result
from kcoord.node.kafka.codec import topic_id_to_uuid, uuid_to_topic_id
from kcoord.node.kafka.context import BrokerContext
from kcoord.node.kafka.controller_channel import ControllerUnavailableError
from kcoord.node.rpc import RpcError

log = logging.getLogger(__name__)

CREATE_TOPICS_KEY: Final = 19
DELETE_TOPICS_KEY: Final = 20
CREATE_PARTITIONS_KEY: Final = 37
ELECT_LEADERS_KEY: Final = 43
_ELECTIONS: Final = {0: "preferred", 1: "unclean"}  # ElectionType
CLUSTER_METADATA_TOPIC: Final = "__cluster_metadata"
DYNAMIC_TOPIC_CONFIG: Final = 1  # DescribeConfigsResponse.ConfigSource
_MIN_TIMEOUT_MS: Final = 1000
_MAX_TIMEOUT_MS: Final = 120_000


def _timeout_s(request_timeout: datetime.timedelta) -> float:
    ms = round(request_timeout.total_seconds() * 1000)
    return min(max(ms, _MIN_TIMEOUT_MS), _MAX_TIMEOUT_MS) / 1000


async def forward(
    ctx: BrokerContext, method: str, payload: dict[str, Any], timeout_s: float
) -> Any:
    """The controller's reply, or the one error to answer for every entry of the request."""
    try:
        return await ctx.controller.call(method, payload, timeout_s)
    except ControllerUnavailableError as e:
        log.warning("%s not answered: %s", method, e)
        return Errors.REQUEST_TIMED_OUT
    except RpcError as e:
        if e.code == Errors.RECORD_LIST_TOO_LARGE:
            log.warning("%s refused by the controller: %s", method, e)
            return Errors.RECORD_LIST_TOO_LARGE
        log.error("%s failed at the controller: %s", method, e)
        return Errors.UNKNOWN_SERVER_ERROR


class AdminApi:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        # A created topic's every config with its source (KIP-525), from the node's
        # DescribeConfigs (``ConfigsApi.effective_topic_configs``); without it, the configs
        # the request named.
        self.effective_topic_configs: (
            Callable[[Mapping[str, str | None]], list[dict[str, Any]]] | None
        ) = None

    async def _forward(self, method: str, payload: dict[str, Any], timeout_s: float) -> Any:
        return await forward(self.ctx, method, payload, timeout_s)

    # -----------------------------------------------------------------------------------------
    # CreateTopics.

    async def handle_create_topics(self, request: Request) -> Result:
        body = request.body
        counts = Counter(t.name for t in body.topics)
        results: dict[str, dict[str, Any]] = {}
        forward: list[dict[str, Any]] = []
        configs_of: dict[str, list[dict[str, Any]]] = {}
        for t in body.topics:
            name = t.name
            if counts[name] > 1:
                results[name] = _create_error(name, Errors.INVALID_REQUEST, "Duplicate topic name.")
            elif name == CLUSTER_METADATA_TOPIC:
                results[name] = _create_error(
                    name,
                    Errors.INVALID_REQUEST,
                    f"Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited.",
                )
            else:
                # A None value is the controller's to refuse (INVALID_CONFIG), as Kafka does.
                configs = {c.name: c.value for c in t.configs}
                configs_of[name] = [
                    {
                        "name": k,
                        "value": v,
                        "read_only": False,
                        "config_source": DYNAMIC_TOPIC_CONFIG,
                        "is_sensitive": False,
                    }
                    for k, v in configs.items()
                ]
                forward.append(
                    {
                        "name": name,
                        "num_partitions": t.num_partitions,
                        "replication_factor": t.replication_factor,
                        "configs": configs,
                        "assignments": [
                            [a.partition_index, list(a.broker_ids)] for a in t.assignments or ()
                        ],
                    }
                )
        if forward:
            validate_only = bool(body.validate_only)
            reply = await self._forward(
                "CreateTopics",
                {"topics": forward, "validate_only": validate_only},
                _timeout_s(body.timeout),
            )
            # Each topic's answer looked up by name, and the effective configs built once for
            # each distinct set of overrides: a scan of the reply for every topic, and every
            # topic's configs built again, held the loop for seconds at 10,000 topics.
            # (review helper-221)
            replied = {} if isinstance(reply, Errors) else {r["name"]: r for r in reply["topics"]}
            effective: dict[frozenset[tuple[str, str | None]], list[dict[str, Any]]] = {}
            for i, t in enumerate(forward, 1):
                if i % PARTITIONS_PER_SLICE == 0:
                    await asyncio.sleep(0)  # the other connections' turn
                name = t["name"]
                if isinstance(reply, Errors):
                    results[name] = _create_error(name, reply, None)
                    continue
                r = replied[name]
                error = Errors.of(r["error"])
                if error is not Errors.NONE:
                    results[name] = _create_error(name, error, r.get("message") or None)
                    continue
                results[name] = {
                    "name": name,
                    "error_code": Errors.NONE,
                    "error_message": None,
                    # A validate_only request is answered the id the topic would have had
                    # (ReplicationControlManager.createTopic makes one either way).
                    "topic_id": r["topic_id"],
                    "num_partitions": r["num_partitions"],
                    "replication_factor": r["replication_factor"],
                    "configs": configs_of[name]
                    if self.effective_topic_configs is None
                    else self._effective(effective, t["configs"]),
                }
        return {"throttle_time": 0, "topics": [results[name] for name in counts]}

    def _effective(
        self,
        built: dict[frozenset[tuple[str, str | None]], list[dict[str, Any]]],
        configs: Mapping[str, str | None],
    ) -> list[dict[str, Any]]:
        """``effective_topic_configs`` of ``configs``, built once per request for each
        distinct set of overrides (most topics of a large request share one)."""
        assert self.effective_topic_configs is not None
        key = frozenset(configs.items())
        found = built.get(key)
        if found is None:
            found = built[key] = self.effective_topic_configs(configs)
        return found

    # -----------------------------------------------------------------------------------------
    # CreatePartitions.

    async def handle_create_partitions(self, request: Request) -> Result:
        body = request.body
        counts = Counter(t.name for t in body.topics)
        results: dict[str, dict[str, Any]] = {}
        forward: list[dict[str, Any]] = []
        for t in body.topics:
            if counts[t.name] > 1:
                results[t.name] = _result(t.name, Errors.INVALID_REQUEST, "Duplicate topic name.")
                continue
            assignments = (
                None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
            )
            forward.append({"name": t.name, "count": t.count, "assignments": assignments})
        if forward:
            reply = await self._forward(
                "CreatePartitions",
                {"topics": forward, "validate_only": bool(body.validate_only)},
                _timeout_s(body.timeout),
            )
            replied = {} if isinstance(reply, Errors) else {r["name"]: r for r in reply["topics"]}
            for t in forward:
                name = t["name"]
                if isinstance(reply, Errors):
                    results[name] = _result(name, reply, None)
                    continue
                r = replied[name]
                results[name] = _result(name, Errors.of(r["error"]), r.get("message") or None)
        return {"throttle_time": 0, "results": [results[name] for name in counts]}

    # -----------------------------------------------------------------------------------------
    # DeleteTopics.

    async def handle_delete_topics(self, request: Request) -> Result:
        body, version = request.body, request.version
        responses: list[dict[str, Any]] = []
        if version >= 6:
            entries = [(t.name, t.topic_id) for t in body.topics]
        else:
            entries = [(name, None) for name in body.topic_names]
        # ControllerApis.deleteTopics: a name or an id given twice is refused (and not
        # deleted), and so is a topic given by its name and by its id: the name is answered
        # INVALID_REQUEST, the id not at all, and the topic stays.
        provided_names: dict[str, None] = {}
        duplicate_names: dict[str, None] = {}
        provided_ids: dict[uuid.UUID, None] = {}
        duplicate_ids: dict[uuid.UUID, None] = {}

        def provide(key: Any, provided: dict[Any, None], duplicates: dict[Any, None]) -> None:
            if key in duplicates or key in provided:
                duplicates[key] = None
                provided.pop(key, None)
            else:
                provided[key] = None

        for name, topic_id in entries:
            has_id = topic_id is not None and topic_id.int != 0
            if name is not None and has_id:
                responses.append(
                    _deleted(
                        name,
                        topic_id,
                        Errors.INVALID_REQUEST,
                        "You may not specify both topic name and topic id.",
                    )
                )
            elif name is None and not has_id:
                responses.append(
                    _deleted(
                        None,
                        None,
                        Errors.INVALID_REQUEST,
                        "Neither topic name nor id were specified.",
                    )
                )
            elif name is None:
                provide(topic_id, provided_ids, duplicate_ids)
            else:
                provide(name, provided_names, duplicate_names)
        for name in duplicate_names:
            responses.append(_deleted(name, None, Errors.INVALID_REQUEST, "Duplicate topic name."))
        for topic_id in duplicate_ids:
            responses.append(
                _deleted(None, topic_id, Errors.INVALID_REQUEST, "Duplicate topic id.")
            )
        # Every name and id is looked up on the controller, not here: this node may be behind
        # the log, and an id it turned into a name could delete a topic re-created under that
        # name since (ControllerApis.deleteTopics: findTopicNames, findTopicIds).
        names = list(provided_names)
        ids = [uuid_to_topic_id(topic_id) for topic_id in provided_ids]
        if names or ids:
            payload = {
                "names": names,
                "ids": ids,
                "duplicate_names": list(duplicate_names),
                "duplicate_ids": [uuid_to_topic_id(topic_id) for topic_id in duplicate_ids],
            }
            reply = await self._forward("DeleteTopics", payload, _timeout_s(body.timeout))
            if isinstance(reply, Errors):
                responses += [_deleted(name, None, reply, None) for name in names]
                responses += [_deleted(None, topic_id, reply, None) for topic_id in provided_ids]
            else:
                for r in reply["topics"]:
                    topic_id = r.get("topic_id")
                    responses.append(
                        _deleted(
                            r["name"],
                            None if topic_id is None else topic_id_to_uuid(topic_id),
                            Errors.of(r["error"]),
                            r.get("message") or None,
                        )
                    )
        return {"throttle_time": 0, "responses": responses}

    # -----------------------------------------------------------------------------------------
    # ElectLeaders (KIP-460; v0 has no election type: preferred).

    async def handle_elect_leaders(self, request: Request) -> Result:
        body = request.body
        election = _ELECTIONS.get(int(getattr(body, "election_type", 0)))
        if election is None:
            return {"throttle_time": 0, "error_code": Errors.INVALID_REQUEST,
                    "replica_election_results": []}  # fmt: skip
        partitions = (
            None
            if body.topic_partitions is None
            else [
                [t.topic, int(p)]
                for t in body.topic_partitions
                for p in dict.fromkeys(t.partitions)
            ]
        )
        reply = await self._forward(
            "ElectLeaders",
            {"election": election, "partitions": partitions},
            _timeout_s(body.timeout),
        )
        if isinstance(reply, Errors):
            results = [(t, p, int(reply)) for t, p in partitions or []]
        else:
            results = [(str(t), int(p), int(e)) for t, p, e in reply["results"]]
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for topic, partition, error in results:
            by_topic.setdefault(topic, []).append(
                {"partition_id": partition, "error_code": Errors(error), "error_message": None}
            )
        return {
            "throttle_time": 0,
            "error_code": reply
            if isinstance(reply, Errors) and partitions is None
            else Errors.NONE,
            "replica_election_results": [
                {"topic": topic, "partition_result": parts} for topic, parts in by_topic.items()
            ],
        }


def _create_error(name: str, error: Errors, message: str | None) -> dict[str, Any]:
    return {
        "name": name,
        "error_code": error,
        "error_message": message,
        "topic_id": None,
        "num_partitions": -1,
        "replication_factor": -1,
        "configs": None,
    }


def _result(name: str, error: Errors, message: str | None) -> dict[str, Any]:
    return {"name": name, "error_code": error, "error_message": message}


def _deleted(name: str | None, topic_id: Any, error: Errors, message: str | None) -> dict[str, Any]:
    return {"name": name, "topic_id": topic_id, "error_code": error, "error_message": message}
