"""DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs (44).

DescribeConfigs is answered by the node itself, as Kafka's ``ConfigHelper`` does:

- a TOPIC lists every topic config of ``storage.config.TOPIC_CONFIGS`` (or the keys asked for;
  unknown keys are left out): the topic's own value (source DYNAMIC_TOPIC_CONFIG), else the
  cluster-level dynamic default (DYNAMIC_DEFAULT_BROKER_CONFIG), else this node's broker config
  that sets the default (STATIC_BROKER_CONFIG, e.g. ``log.retention.ms``), else Kafka's
  default (DEFAULT_CONFIG); with synonyms, the whole chain. An unknown topic is
  UNKNOWN_TOPIC_OR_PARTITION.
- a BROKER named by this node's id lists this node's configs, a sensitive one without its
  value; all are read-only but one a cluster-level dynamic default sets; the empty name lists
  the cluster-level dynamic defaults: kcoord has one, ``min.insync.replicas``, which the
  active controller writes into the metadata log from its own config when the log has none
  (KIP-966). Another broker's id is INVALID_REQUEST, as in Kafka (clients send a broker's
  resource to that broker).
- a GROUP (KIP-848 group configs, ``cluster/coordinator/group_config.py``; the group need not
  exist) lists ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms``: the
  group's own value (GROUP_CONFIG), else this node's ``group.consumer.*`` config; the empty
  name is INVALID_REQUEST.
- a BROKER_LOGGER named by this node's id lists its loggers and their levels
  (``node/kafka/loggers.py``), which IncrementalAlterConfigs changes here, on this node only
  (Kafka's ConfigAdminManager does not forward them either).

The two alters are forwarded to the controller (``Controller.alter_configs``), which validates
each resource's resulting configs as a whole and commits one ``Config`` record per changed
key, the records of all the request's resources in one batch; the answer waits until this
node's image has them. kcoord alters topic and group configs and the cluster-level
``min.insync.replicas``; a broker's static configs change with its config file.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from kcoord.cluster.coordinator.group_config import GROUP_CONFIGS
from kcoord.errors import Errors
from kcoord.node.config import ConfigEntry
from kcoord.node.kafka import loggers
from kcoord.node.kafka.admin import forward
from kcoord.node.kafka.apis import Request, Result
from kcoord.node.kafka.context import BrokerContext
from kcoord.raft.controller import CLUSTER_CONFIGS, ConfigOp, topic_name_error
from kcoord.raft.image import ConfigResource
from kcoord.raft.records import ConfigResourceType
from kcoord.storage.config import (
    TOPIC_CONFIGS,
    TOPIC_CONFIGS_BY_BROKER_NAME,
    ConfigType,
    TopicConfigDef,
    canonical_config_value,
)

log = logging.getLogger(__name__)

DESCRIBE_CONFIGS_KEY: Final = 32
ALTER_CONFIGS_KEY: Final = 33
INCREMENTAL_ALTER_CONFIGS_KEY: Final = 44

# Distinct resources DescribeConfigs describes between two turns of the other connections.
DESCRIBES_PER_SLICE: Final = 32

# DescribeConfigsResponse ConfigSource.
DYNAMIC_TOPIC_CONFIG: Final = 1
DYNAMIC_DEFAULT_BROKER_CONFIG: Final = 3
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5
GROUP_CONFIG: Final = 8
_CONFIG_TYPE_CODES: Final = {t.name: int(t) for t in ConfigType}
_TIMEOUT_S: Final = 30.0


class ConfigsApi:
    def __init__(self, ctx: BrokerContext, broker_configs: Sequence[ConfigEntry]) -> None:
        self.ctx = ctx
        # This node's configs, and every cluster-level dynamic one its file does not set (at
        # Kafka's default), so a broker's listing shows the cluster's value of each, as
        # Kafka's lists every KafkaConfig key.
        dynamic = [
            ConfigEntry(key, d.default, True, d.type.name, False)
            for key, d in TOPIC_CONFIGS_BY_BROKER_NAME.items()
        ]
        entries = {e.key: e for e in dynamic} | {e.key: e for e in broker_configs}
        self.broker_configs = dict(sorted(entries.items()))

    def register(self, register: Callable[..., Any]) -> None:
        register(DESCRIBE_CONFIGS_KEY, self.handle_describe_configs)
        register(ALTER_CONFIGS_KEY, self.handle_alter_configs)
        register(INCREMENTAL_ALTER_CONFIGS_KEY, self.handle_incremental_alter_configs)

    # -----------------------------------------------------------------------------------------
    # DescribeConfigs.

    async def handle_describe_configs(self, request: Request) -> Result:
        body = request.body
        synonyms = bool(getattr(body, "include_synonyms", False))
        docs = bool(getattr(body, "include_documentation", False))
        # A resource named more than once is described once (each description is about 100 us
        # and a kilobyte or two of answer, from 8 bytes of request), and the other connections
        # get their turn between slices: 20,000 copies of one topic held the event loop, so
        # every client of the node, for seconds.
        described: dict[tuple[int, str, frozenset[str]], dict[str, Any]] = {}
        results = []
        for r in body.resources:
            # Null or empty keys: every config (ConfigHelperUtils.buildConfigEntries).
            wanted = (int(r.resource_type), r.resource_name, frozenset(r.configuration_keys or ()))
            if wanted not in described:
                if len(described) % DESCRIBES_PER_SLICE == DESCRIBES_PER_SLICE - 1:
                    await asyncio.sleep(0)
                described[wanted] = self._describe(
                    wanted[0], wanted[1], set(wanted[2]) or None, synonyms, docs
                )
            results.append(described[wanted])
        return {"throttle_time": 0, "results": results}

    def _describe(
        self,
        resource_type: int,
        name: str,
        keys: set[str] | None,
        synonyms: bool,
        docs: bool,
    ) -> dict[str, Any]:
        def result(
            error: Errors, message: str | None, configs: list[dict[str, Any]]
        ) -> dict[str, Any]:
            return {
                "error_code": error,
                "error_message": message,
                "resource_type": resource_type,
                "resource_name": name,
                "configs": configs,
            }

        if resource_type == ConfigResourceType.TOPIC:
            name_error = topic_name_error(name)
            if name_error is not None:  # ConfigHelper: Topic.validate first
                return result(Errors.INVALID_TOPIC_EXCEPTION, name_error, [])
            topic = self.ctx.image.topic_by_name(name)
            if topic is None:
                return result(Errors.UNKNOWN_TOPIC_OR_PARTITION, None, [])
            return result(
                Errors.NONE,
                None,
                [
                    self._entry(d, topic.configs.get(d.name), DYNAMIC_TOPIC_CONFIG, synonyms, docs)
                    for d in TOPIC_CONFIGS.values()
                    if (keys is None or d.name in keys)
                    and (not d.internal or d.name in topic.configs)
                ],
            )
        if resource_type == ConfigResourceType.BROKER:
            cluster = self.ctx.image.resource_configs(CLUSTER_CONFIGS)
            if name == "":
                return result(
                    Errors.NONE,
                    None,
                    [
                        _cluster_entry(key, value, synonyms, docs)
                        for key, value in sorted(cluster.items())
                        if keys is None or key in keys
                    ],
                )
            # ConfigHelper.describeConfigs: the name is parsed as Integer.parseInt does
            # ("01" is broker 1); compared as text, "01" was refused.
            broker_id = loggers.as_int(name)
            if broker_id is None:
                return result(
                    Errors.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}", []
                )
            if broker_id != self.ctx.node_id:
                return result(
                    Errors.INVALID_REQUEST,
                    f"Unexpected broker id, expected {self.ctx.node_id} or empty string, but "
                    f"received {name}",
                    [],
                )
            return result(
                Errors.NONE,
                None,
                [
                    _broker_entry(e, synonyms, cluster.get(e.key))
                    for e in self.broker_configs.values()
                    if keys is None or e.key in keys
                ],
            )
        if resource_type == ConfigResourceType.GROUP:
            if not name:
                return result(Errors.INVALID_REQUEST, "Group name must not be empty", [])
            own = self.ctx.image.resource_configs(ConfigResource(ConfigResourceType.GROUP, name))
            return result(
                Errors.NONE,
                None,
                [
                    self._entry(d, own.get(d.name), GROUP_CONFIG, synonyms, docs)
                    for d in GROUP_CONFIGS.values()
                    if keys is None or d.name in keys
                ],
            )
        if resource_type == loggers.BROKER_LOGGER:
            try:
                loggers.check_described_name(name, self.ctx.node_id)
            except loggers.LoggerConfigError as e:
                return result(e.code, str(e), [])
            return result(
                Errors.NONE,
                None,
                [
                    _logger_entry(logger, level)
                    for logger, level in loggers.loggers().items()
                    if keys is None or logger in keys
                ],
            )
        return result(
            Errors.INVALID_REQUEST,
            "kcoord describes topic, broker, broker logger and group configs only, not "
            f"resource type {resource_type}",
            [],
        )

    def effective_topic_configs(self, own: Mapping[str, str | None]) -> list[dict[str, Any]]:
        """Every config of a topic with these overrides and its source, as CreateTopics v5+
        answers them (KIP-525, ``computeEffectiveTopicConfigs``)."""
        fields = ("name", "value", "read_only", "config_source", "is_sensitive")
        return [
            {k: entry[k] for k in fields}
            for entry in (
                self._entry(d, own.get(d.name), DYNAMIC_TOPIC_CONFIG, False, False)
                for d in TOPIC_CONFIGS.values()
                # An internal config only when set (ConfigHelper lists the originals too).
                if not d.internal or d.name in own
            )
        ]

    def _entry(
        self,
        definition: TopicConfigDef,
        own: str | None,
        own_source: int,
        synonyms: bool,
        docs: bool,
    ) -> dict[str, Any]:
        """A topic's or a group's config (ConfigHelper's ``createTopicConfigEntry`` and
        ``createGroupConfigEntry``)."""
        name, broker_key = definition.name, definition.broker_synonym
        # The chain Kafka's DescribeConfigs shows with synonyms: the resource's own value, the
        # broker config that sets the default as this node has it, Kafka's default.
        chain: list[dict[str, Any]] = []
        if own is not None:
            # Its own value written back, as the entry's (createTopicConfigEntry's
            # valueAsString); the broker-level ones as they were set.
            own = canonical_config_value(definition, own)
            chain.append({"name": name, "value": own, "source": own_source})
        cluster = self.ctx.image.resource_configs(CLUSTER_CONFIGS).get(broker_key or "")
        if cluster is not None:
            chain.append(
                {"name": broker_key, "value": cluster, "source": DYNAMIC_DEFAULT_BROKER_CONFIG}
            )
        broker = self.broker_configs.get(broker_key or "")
        if broker is not None and not broker.is_default:
            chain.append(
                {"name": broker.key, "value": broker.value, "source": STATIC_BROKER_CONFIG}
            )
        chain.append(
            {"name": broker_key or name, "value": definition.default, "source": DEFAULT_CONFIG}
        )
        return {
            "name": name,
            # Parsed and written back, as Kafka's ConfigDef.convertToString.
            "value": canonical_config_value(definition, chain[0]["value"]),
            "read_only": False,
            "config_source": chain[0]["source"],
            "is_sensitive": False,
            "synonyms": chain if synonyms else [],
            "config_type": int(definition.type),
            "documentation": definition.doc if docs else None,
        }

    # -----------------------------------------------------------------------------------------
    # AlterConfigs and IncrementalAlterConfigs.

    def _alter_loggers(
        self, resource: dict[str, Any], *, incremental: bool, validate_only: bool
    ) -> tuple[Errors, str | None]:
        """A BROKER_LOGGER resource, checked whole, then applied unless ``validate_only``."""
        if not incremental:  # legacy AlterConfigs knows no broker loggers
            return Errors.INVALID_REQUEST, f"Unknown resource type {loggers.BROKER_LOGGER}"
        ops = [(name, op, value) for name, op, value in resource["ops"]]
        try:
            loggers.check_alter(resource["resource_name"], self.ctx.node_id, ops)
        except loggers.LoggerConfigError as e:
            return e.code, str(e)
        if not validate_only:
            loggers.apply_ops(ops)
        return Errors.NONE, None

    async def handle_alter_configs(self, request: Request) -> Result:
        return await self._alter(request, incremental=False)

    async def handle_incremental_alter_configs(self, request: Request) -> Result:
        return await self._alter(request, incremental=True)

    async def _alter(self, request: Request, *, incremental: bool) -> Result:
        body = request.body
        resources = [
            {
                "resource_type": int(r.resource_type),
                "resource_name": r.resource_name,
                "ops": [
                    [
                        c.name,
                        int(c.config_operation) if incremental else int(ConfigOp.SET),
                        c.value,
                    ]
                    for c in r.configs
                ],
            }
            for r in body.resources
        ]
        # ConfigAdminManager.preprocess: a resource named twice is INVALID_REQUEST, and is
        # left out of what the controller applies.
        seen = Counter((r["resource_type"], r["resource_name"]) for r in resources)
        duplicated = {key for key, count in seen.items() if count > 1}
        # Broker loggers are this node's own (ConfigAdminManager.preprocess): answered here.
        local = {
            id(r): self._alter_loggers(
                r, incremental=incremental, validate_only=bool(body.validate_only)
            )
            for r in resources
            if r["resource_type"] == loggers.BROKER_LOGGER
            and (r["resource_type"], r["resource_name"]) not in duplicated
        }
        applied = [
            r
            for r in resources
            if (r["resource_type"], r["resource_name"]) not in duplicated and id(r) not in local
        ]
        reply: Any = Errors.NONE
        if applied:
            reply = await forward(
                self.ctx,
                "AlterConfigs",
                {
                    "resources": applied,
                    "incremental": incremental,
                    "validate_only": bool(body.validate_only),
                },
                # The request has no timeout field; clients wait 30 s by default.
                _TIMEOUT_S,
            )
        responses = []
        answers = iter(() if isinstance(reply, Errors) else reply["resources"])
        for r in resources:
            message: str | None
            if (r["resource_type"], r["resource_name"]) in duplicated:
                error, message = Errors.INVALID_REQUEST, "Each resource must appear at most once."
            elif id(r) in local:
                error, message = local[id(r)]
            elif isinstance(reply, Errors):
                error, message = reply, None
            else:
                answer = next(answers)
                error = Errors.of(answer["error"])
                message = answer["message"] or None
            responses.append(
                {
                    "error_code": error,
                    "error_message": message,
                    "resource_type": r["resource_type"],
                    "resource_name": r["resource_name"],
                }
            )
        return {"throttle_time": 0, "responses": responses}


def _logger_entry(name: str, level: str) -> dict[str, Any]:
    """A broker logger as ConfigHelper describes one: its level, dynamic, no synonyms."""
    return {
        "name": name,
        "value": level,
        "read_only": False,
        "config_source": loggers.DYNAMIC_BROKER_LOGGER_CONFIG,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": 0,
        "documentation": None,
    }


def _broker_entry(entry: ConfigEntry, synonyms: bool, cluster: str | None) -> dict[str, Any]:
    """One of this node's configs; ``cluster`` is the cluster-level dynamic default of its key,
    which comes first (``DynamicBrokerConfig``'s order)."""
    source = DEFAULT_CONFIG if entry.is_default else STATIC_BROKER_CONFIG
    chain = [{"name": entry.key, "value": entry.value, "source": source}]
    if cluster is not None:
        chain.insert(
            0, {"name": entry.key, "value": cluster, "source": DYNAMIC_DEFAULT_BROKER_CONFIG}
        )
    return {
        "name": entry.key,
        "value": chain[0]["value"],
        "read_only": entry.key not in TOPIC_CONFIGS_BY_BROKER_NAME,  # dynamic at cluster level
        "config_source": chain[0]["source"],
        "is_sensitive": entry.sensitive,
        "synonyms": chain if synonyms else [],
        "config_type": _CONFIG_TYPE_CODES.get(entry.type_name, 0),
        "documentation": None,
    }


def _cluster_entry(key: str, value: str, synonyms: bool, docs: bool) -> dict[str, Any]:
    """A cluster-level dynamic default (DescribeConfigs of the BROKER resource ""), as it was
    set: ConfigHelper describes it from the map of the stored strings, which
    createBrokerConfigEntry shows as they are."""
    definition = TOPIC_CONFIGS_BY_BROKER_NAME.get(key)
    return {
        "name": key,
        "value": value,
        "read_only": False,
        "config_source": DYNAMIC_DEFAULT_BROKER_CONFIG,
        "is_sensitive": False,
        "synonyms": (
            [{"name": key, "value": value, "source": DYNAMIC_DEFAULT_BROKER_CONFIG}]
            if synonyms
            else []
        ),
        "config_type": int(definition.type) if definition is not None else 0,
        "documentation": definition.doc if docs and definition is not None else None,
    }
