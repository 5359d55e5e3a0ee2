"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs on the wire, against the harness
node (its broker config sets ``log.retention.ms`` to one hour and a secret admin token)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from unittest import mock

from kcoord.cluster.coordinator.group_config import GroupConfigBounds, group_config_error
from kcoord.errors import Errors
from kcoord.node.kafka.configs import ConfigsApi
from kcoord.raft.image import ConfigResource
from kcoord.raft.records import ConfigResourceType
from kcoord.storage.config import TOPIC_CONFIGS, TOPIC_CONFIGS_BY_BROKER_NAME
from kcoord.storage.log import Log
from tests.unit.node.kafka.harness import NODE_ID, Harness
from tests.unit.node.kafka.test_handlers import run
from tests.unit.node.kafka.wire import AsyncWireClient

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
CREATE_TOPICS = 19
TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG, GROUP_CONFIG = 1, 4, 5, 8
SET, DELETE, APPEND = 0, 1, 2
HOUR_MS = "3600000"


def describe_values(*resources: tuple[int, str, list[str] | None], **flags: bool) -> Any:
    return {
        "resources": [
            {"resource_type": t, "resource_name": n, "configuration_keys": keys}
            for t, n, keys in resources
        ],
        "include_synonyms": flags.get("synonyms", False),
        "include_documentation": flags.get("docs", False),
    }


def incremental_values(
    name: str, *ops: tuple[str, int, str | None], dry: bool = False, resource_type: int = TOPIC
) -> Any:
    return {
        "resources": [
            {
                "resource_type": resource_type,
                "resource_name": name,
                "configs": [{"name": k, "config_operation": op, "value": v} for k, op, v in ops],
            }
        ],
        "validate_only": dry,
    }


# Every topic config but Kafka's internal ones (internal.segment.bytes), as DescribeConfigs
# lists them.
LISTED = [name for name, d in TOPIC_CONFIGS.items() if not d.internal]


def test_describe_a_topic_lists_every_config_with_its_source(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 2)
        response = await c.call(
            INCREMENTAL_ALTER_CONFIGS, 1, incremental_values("t", ("segment.ms", SET, "60000"))
        )
        assert [(r.error_code, r.resource_name) for r in response.responses] == [(Errors.NONE, "t")]
        response = await c.call(
            DESCRIBE_CONFIGS, 4, describe_values((TOPIC, "t", None), synonyms=True, docs=True)
        )
        (result,) = response.results
        assert result.error_code == Errors.NONE
        configs = {e.name: e for e in result.configs}
        assert list(configs) == LISTED
        own = configs["segment.ms"]
        assert (own.value, own.config_source, own.read_only) == (
            "60000",
            DYNAMIC_TOPIC_CONFIG,
            False,
        )
        assert [(s.name, s.value, s.source) for s in own.synonyms] == [
            ("segment.ms", "60000", DYNAMIC_TOPIC_CONFIG),
            ("log.roll.ms", str(7 * 24 * 3600 * 1000), DEFAULT_CONFIG),
        ]
        # The broker's log.retention.ms sets the default of retention.ms.
        retention = configs["retention.ms"]
        assert (retention.value, retention.config_source) == (HOUR_MS, STATIC_BROKER_CONFIG)
        assert [(s.name, s.source) for s in retention.synonyms] == [
            ("log.retention.ms", STATIC_BROKER_CONFIG),
            ("log.retention.ms", DEFAULT_CONFIG),
        ]
        assert (retention.config_type, configs["cleanup.policy"].config_type) == (5, 7)
        assert all(e.documentation for e in configs.values())
        # Asked keys only (an unknown one is left out); no synonyms or docs unless asked.
        response = await c.call(
            DESCRIBE_CONFIGS, 1, describe_values((TOPIC, "t", ["retention.bytes", "nope"]))
        )
        (entry,) = response.results[0].configs
        assert (entry.name, entry.value, entry.config_source) == ("retention.bytes", "-1", 5)
        assert entry.synonyms == ()
        missing = await c.call(DESCRIBE_CONFIGS, 4, describe_values((TOPIC, "nope", None)))
        assert missing.results[0].error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        # An empty key list is every config, as null is (kafka-python sends []).
        every = await c.call(DESCRIBE_CONFIGS, 1, describe_values((TOPIC, "t", [])))
        assert [e.name for e in every.results[0].configs] == LISTED
        # An illegal name is checked first (ConfigHelper: Topic.validate).
        illegal = await c.call(DESCRIBE_CONFIGS, 4, describe_values((TOPIC, "bad name!", None)))
        assert illegal.results[0].error_code == Errors.INVALID_TOPIC_EXCEPTION
        # A resource named many times is answered as many times, described once (an 8-byte
        # copy cost a description each, on the event loop: 20,000 held every client).
        copies = [(TOPIC, "t", None)] * 2_000 + [(TOPIC, "t", ["retention.bytes"])]
        with mock.patch.object(ConfigsApi, "_describe", autospec=True) as describe:
            describe.side_effect = lambda self, kind, name, keys, *flags: {
                "error_code": 0,
                "resource_type": kind,
                "resource_name": name,
                "configs": [],
            }
            many = await c.call(DESCRIBE_CONFIGS, 1, describe_values(*copies))
        assert len(many.results) == len(copies)
        assert [call.args[3] for call in describe.call_args_list] == [None, {"retention.bytes"}]

    run(tmp_path, test)


def test_an_error_message_too_long_for_a_kafka_string_is_cut_short(tmp_path: Path) -> None:
    """A config name of 32,767 characters fits the request's string, but the answer's "Unknown
    topic config name: ..." does not fit a Kafka string (32,767 bytes): the encoding failed
    and the connection was closed, an ERROR with its traceback logged each time. The answer
    now goes out, INVALID_CONFIG, its message cut short."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1)
        name = "a" * 32_767
        response = await c.call(
            INCREMENTAL_ALTER_CONFIGS, 0, incremental_values("t", (name, SET, "1"))
        )
        (result,) = response.responses
        assert result.error_code == Errors.INVALID_CONFIG
        assert result.error_message.startswith("Unknown topic config name: aaa")
        assert result.error_message.endswith("...") and len(result.error_message) < 32_767

    run(tmp_path, test)


def test_a_resource_named_twice_in_one_alter_is_refused_alone(tmp_path: Path) -> None:
    """ConfigAdminManager.preprocess: INVALID_REQUEST for a duplicated resource, which is not
    applied (the second entry silently won); the other resources are."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1)
        await h.create_topic("u", 1)
        values = incremental_values("t", ("retention.ms", SET, "1000"))
        values["resources"] += [
            dict(
                values["resources"][0],
                configs=[dict(values["resources"][0]["configs"][0], value="2000")],
            ),
            incremental_values("u", ("retention.ms", SET, "3000"))["resources"][0],
        ]
        response = await c.call(INCREMENTAL_ALTER_CONFIGS, 1, values)
        assert [(r.resource_name, r.error_code) for r in response.responses] == [
            ("t", Errors.INVALID_REQUEST),
            ("t", Errors.INVALID_REQUEST),
            ("u", Errors.NONE),
        ]
        # Kafka's message, which the Java admin client shows as the exception's.
        assert response.responses[0].error_message == "Each resource must appear at most once."
        topics = {t.name: t.configs for t in h.cache.image.topics.values()}
        assert "retention.ms" not in topics["t"] and topics["u"]["retention.ms"] == "3000"

    run(tmp_path, test)


def test_describe_brokers_and_other_resources(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        response = await c.call(
            DESCRIBE_CONFIGS,
            4,
            describe_values(
                (BROKER, str(NODE_ID), None), (BROKER, "2", None), (BROKER, "", None),
                (CLIENT_METRICS, "m", None),
            ),
        )  # fmt: skip
        mine, other, cluster_wide, unknown = response.results
        assert mine.error_code == Errors.NONE
        configs = {e.name: e for e in mine.configs}
        assert (configs["node.id"].value, configs["node.id"].config_source) == ("1", 4)
        assert (configs["log.retention.ms"].value, configs["log.retention.ms"].config_source) == (
            HOUR_MS,
            STATIC_BROKER_CONFIG,
        )
        assert configs["num.partitions"].config_source == DEFAULT_CONFIG
        token = configs["admin.api.token"]
        assert (token.value, token.is_sensitive) == (None, True)
        # Read-only but the broker synonyms of topic configs (cluster-level dynamic ones).
        assert [e.name for e in configs.values() if not e.read_only] == [
            name for name in configs if name in TOPIC_CONFIGS_BY_BROKER_NAME
        ]
        assert not configs["log.retention.ms"].read_only
        # The chaos suite's broken modes are no broker config to show.
        assert not [name for name in configs if name.startswith("test.bug.")]
        assert other.error_code == Errors.INVALID_REQUEST
        assert other.error_message == (
            "Unexpected broker id, expected 1 or empty string, but received 2"
        )
        assert (cluster_wide.error_code, cluster_wide.configs) == (Errors.NONE, ())
        assert unknown.error_code == Errors.INVALID_REQUEST
        # The id is parsed as Kafka's ConfigHelper parses it (Integer.parseInt): "01" and "+1"
        # are this broker (refused, compared as text); a name not a number says so.
        response = await c.call(
            DESCRIBE_CONFIGS,
            4,
            describe_values((BROKER, f"0{NODE_ID}", None), (BROKER, f"+{NODE_ID}", None),
                            (BROKER, "x", None), (BROKER, "1" * 5000, None)),
        )  # fmt: skip
        padded, signed, named, huge = response.results
        # Past the digits ``int`` reads: it raised, and every resource of the request got
        # UNKNOWN_SERVER_ERROR. (review helper-221)
        assert (huge.error_code, huge.error_message) == (
            Errors.INVALID_REQUEST,
            f"Broker id must be an integer, but it is: {'1' * 5000}",
        )
        assert padded.error_code == signed.error_code == Errors.NONE
        assert {e.name for e in padded.configs} == set(configs)
        assert (named.error_code, named.error_message) == (
            Errors.INVALID_REQUEST,
            "Broker id must be an integer, but it is: x",
        )

    run(tmp_path, test)


def test_broker_loggers_are_described_and_altered_on_this_node(tmp_path: Path) -> None:
    """kafka-configs.sh --entity-type broker-loggers: every logger with its effective level in
    Kafka's names, set or removed at run time on this node alone (ConfigAdminManager's
    checks and messages); validate_only changes nothing, a refused resource nothing of it."""
    name = "kcoord.node.replica_fetcher"
    logger = logging.getLogger(name)
    saved = logger.level

    async def test(h: Harness, c: AsyncWireClient) -> None:
        async def describe(resource: str = str(NODE_ID), keys: list[str] | None = None) -> Any:
            response = await c.call(
                DESCRIBE_CONFIGS, 4, describe_values((BROKER_LOGGER, resource, keys))
            )
            return response.results[0]

        async def alter(
            *ops: tuple[str, int, str | None], resource: str = str(NODE_ID), dry: bool = False
        ) -> tuple[int, str | None]:
            response = await c.call(
                INCREMENTAL_ALTER_CONFIGS,
                1,
                incremental_values(resource, *ops, dry=dry, resource_type=BROKER_LOGGER),
            )
            return response.responses[0].error_code, response.responses[0].error_message

        described = await describe()
        levels = {e.name: e for e in described.configs}
        assert described.error_code == Errors.NONE and "root" in levels and name in levels
        entry = levels[name]
        assert (entry.read_only, entry.config_source, entry.is_sensitive) == (False, 6, False)
        effective = logging.getLevelName(logger.getEffectiveLevel()).replace("WARNING", "WARN")
        assert entry.value == effective
        assert await alter((name, SET, "TRACE"), dry=True) == (Errors.NONE, None)
        assert logger.level == saved
        assert await alter((name, SET, "DEBUG")) == (Errors.NONE, None)
        assert logger.level == logging.DEBUG
        assert [e.value for e in (await describe(keys=[name])).configs] == ["DEBUG"]
        refused = [
            ((name, SET, "VERBOSE"), Errors.INVALID_CONFIG,
             f"Cannot set the log level of {name} to VERBOSE as it is not a supported log "
             "level. Valid log levels are FATAL, ERROR, WARN, INFO, DEBUG, TRACE"),
            (("no.such.logger", SET, "INFO"), Errors.INVALID_CONFIG,
             "Logger no.such.logger does not exist!"),
            (("root", DELETE, None), Errors.INVALID_REQUEST,
             "Removing the log level of the root logger is not allowed"),
            ((name, APPEND, "INFO"), Errors.INVALID_REQUEST,
             "APPEND operation is not allowed for the BROKER_LOGGER resource"),
            ((name, SET, None), Errors.INVALID_REQUEST, f"Null value not supported for : {name}"),
        ]  # fmt: skip
        bystander = logging.getLogger("kcoord.node.kafka.configs")
        level_before = bystander.level
        for op, code, message in refused:
            # With a valid op before it: the resource is refused whole.
            assert await alter((bystander.name, SET, "FATAL"), op) == (code, message), op
            assert logger.level == logging.DEBUG and bystander.level == level_before
        assert await alter((name, SET, "INFO"), (name, SET, "WARN")) == (
            Errors.INVALID_REQUEST,
            "Error due to duplicate config keys",
        )
        assert await alter((name, SET, "INFO"), resource="2") == (
            Errors.INVALID_REQUEST,
            f"Unexpected broker id, expected {NODE_ID}, but received 2",
        )
        assert await alter((name, SET, "INFO"), resource="x") == (
            Errors.INVALID_REQUEST,
            "Node id must be an integer, but it is: x",
        )
        assert await alter((name, DELETE, None)) == (Errors.NONE, None)
        assert logger.level == logging.NOTSET
        other = await describe("2")
        assert (other.error_code, other.error_message) == (
            Errors.INVALID_REQUEST,
            f"Unexpected broker id, expected {NODE_ID} but received 2",
        )
        empty = await describe("")
        assert (empty.error_code, empty.error_message) == (
            Errors.INVALID_REQUEST,
            "Broker id must not be empty",
        )
        legacy = await c.call(
            ALTER_CONFIGS,
            2,
            {
                "resources": [
                    {
                        "resource_type": BROKER_LOGGER,
                        "resource_name": str(NODE_ID),
                        "configs": [{"name": name, "value": "DEBUG"}],
                    }
                ],
                "validate_only": False,
            },
        )
        assert (legacy.responses[0].error_code, legacy.responses[0].error_message) == (
            Errors.INVALID_REQUEST,
            "Unknown resource type 8",
        )
        assert logger.level == logging.NOTSET

    try:
        run(tmp_path, test)
    finally:
        logger.setLevel(saved)


def test_alters_reach_the_image_and_the_hosted_logs(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 2, replication_factor=3)  # both hosted here
        logs = [p.log for (topic, _), p in h.replicas.partitions.items() if topic == "t"]
        assert len(logs) == 2

        def own() -> dict[str, str]:
            topic = h.cache.image.topic_by_name("t")
            assert topic is not None
            return dict(topic.configs)

        dry = incremental_values("t", ("max.message.bytes", SET, "2000"), dry=True)
        response = await c.call(INCREMENTAL_ALTER_CONFIGS, 0, dry)
        assert response.responses[0].error_code == Errors.NONE
        assert own() == {}
        response = await c.call(
            INCREMENTAL_ALTER_CONFIGS,
            1,
            incremental_values(
                "t", ("max.message.bytes", SET, "2000"), ("cleanup.policy", APPEND, "compact")
            ),
        )
        assert response.responses[0].error_code == Errors.NONE
        assert own() == {"max.message.bytes": "2000", "cleanup.policy": "delete,compact"}
        for log in logs:
            assert log.config.max_message_bytes == 2000
            assert log.config.cleanup_policy == frozenset({"delete", "compact"})
        refused = await c.call(
            INCREMENTAL_ALTER_CONFIGS, 1, incremental_values("t", ("retention.ms", SET, "x"))
        )
        (r,) = refused.responses
        assert (r.error_code, r.error_message) == (
            Errors.INVALID_CONFIG,
            "Invalid value x for configuration retention.ms: Not a number of type LONG",
        )
        # The legacy AlterConfigs (v0) replaces the whole set.
        response = await c.call(
            ALTER_CONFIGS,
            0,
            {
                "resources": [
                    {
                        "resource_type": TOPIC,
                        "resource_name": "t",
                        "configs": [{"name": "retention.ms", "value": "5000"}],
                    }
                ],
                "validate_only": False,
            },
        )
        assert response.responses[0].error_code == Errors.NONE
        assert own() == {"retention.ms": "5000"}
        for log in logs:
            assert log.config.max_message_bytes == h.replicas.default_log_config.max_message_bytes
            assert log.config.retention_ms == 5000
        deleted = await c.call(
            INCREMENTAL_ALTER_CONFIGS, 1, incremental_values("t", ("retention.ms", DELETE, None))
        )
        assert deleted.responses[0].error_code == Errors.NONE
        assert own() == {}

    run(tmp_path, test)


def test_group_configs_are_altered_validated_and_described(tmp_path: Path) -> None:
    """KIP-848 group configs: any group name (the group need not exist), the broker's value
    until the group has its own, Kafka's checks and messages (GroupConfig.validate)."""

    def group_ops(*ops: tuple[str, int, str | None], group: str = "g") -> Any:
        return incremental_values(group, *ops, resource_type=GROUP)

    async def describe(c: AsyncWireClient, group: str = "g") -> dict[str, Any]:
        response = await c.call(
            DESCRIBE_CONFIGS, 4, describe_values((GROUP, group, None), synonyms=True, docs=True)
        )
        (result,) = response.results
        assert result.error_code == Errors.NONE, result
        return {e.name: e for e in result.configs}

    async def test(h: Harness, c: AsyncWireClient) -> None:
        session, heartbeat = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"
        configs = await describe(c)
        assert list(configs) == [session, heartbeat]
        assert [(e.value, e.config_source, e.read_only) for e in configs.values()] == [
            ("45000", DEFAULT_CONFIG, False),
            ("5000", DEFAULT_CONFIG, False),
        ]
        assert [(s.name, s.source) for s in configs[session].synonyms] == [
            ("group.consumer.session.timeout.ms", DEFAULT_CONFIG)
        ]
        assert all(e.config_type == 3 and e.documentation for e in configs.values())  # INT

        response = await c.call(INCREMENTAL_ALTER_CONFIGS, 1, group_ops((session, SET, "50000")))
        assert response.responses[0].error_code == Errors.NONE
        resource = ConfigResource(int(ConfigResourceType.GROUP), "g")
        assert dict(h.cache.image.resource_configs(resource)) == {session: "50000"}
        own = (await describe(c))[session]
        assert (own.value, own.config_source) == ("50000", GROUP_CONFIG)
        assert [(s.name, s.value, s.source) for s in own.synonyms] == [
            (session, "50000", GROUP_CONFIG),
            ("group.consumer.session.timeout.ms", "45000", DEFAULT_CONFIG),
        ]
        # Asked keys only; another group is untouched.
        response = await c.call(DESCRIBE_CONFIGS, 4, describe_values((GROUP, "g", [heartbeat])))
        assert [e.name for e in response.results[0].configs] == [heartbeat]
        assert (await describe(c, "other"))[session].value == "45000"

        refused = {
            ((session, SET, "x"),): "Invalid value x for configuration "
            "consumer.session.timeout.ms: Not a number of type INT",
            ((session, SET, "0"),): "Invalid value 0 for configuration "
            "consumer.session.timeout.ms: Value must be at least 1",
            # Java's Integer.parseInt refuses what Python's int() would take.
            ((session, SET, "50_000"),): "Invalid value 50_000 for configuration "
            "consumer.session.timeout.ms: Not a number of type INT",
            ((session, SET, "44999"),): "consumer.session.timeout.ms must be in the range "
            "45000 to 60000 inclusive.",
            ((session, SET, "60001"),): "consumer.session.timeout.ms must be in the range "
            "45000 to 60000 inclusive.",
            ((heartbeat, SET, "4999"),): "consumer.heartbeat.interval.ms must be in the range "
            "5000 to 15000 inclusive.",
            ((heartbeat, SET, "15001"),): "consumer.heartbeat.interval.ms must be in the range "
            "5000 to 15000 inclusive.",
            (("share.session.timeout.ms", SET, "45000"),): "Unknown group config name: "
            "share.session.timeout.ms",
            ((heartbeat, APPEND, "6000"),): "Can't APPEND to key "
            "consumer.heartbeat.interval.ms because its type is not LIST.",
        }
        for ops, message in refused.items():
            response = await c.call(INCREMENTAL_ALTER_CONFIGS, 1, group_ops(*ops))
            (r,) = response.responses
            assert (r.error_code, r.error_message) == (Errors.INVALID_CONFIG, message), ops
        # The session timeout must stay above the heartbeat interval, the node's own value
        # standing in for the one the group does not set.
        bounds = GroupConfigBounds(min_heartbeat_interval_ms=1, max_heartbeat_interval_ms=60_000)
        assert group_config_error({heartbeat: "40000"}, bounds) is None
        too_long = "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms"
        assert group_config_error({heartbeat: "45000"}, bounds) == too_long
        assert group_config_error({heartbeat: "50000", session: "50000"}, bounds) == too_long
        assert group_config_error({heartbeat: "50000", session: "55000"}, bounds) is None
        short = GroupConfigBounds(session_timeout_ms=6000, min_session_timeout_ms=6000)
        assert group_config_error({heartbeat: "10000"}, short) == too_long
        assert group_config_error({heartbeat: "10000", session: "20000"}, short) is None
        empty = await c.call(
            INCREMENTAL_ALTER_CONFIGS, 1, group_ops((session, SET, "50000"), group="")
        )
        assert empty.responses[0].error_code == Errors.INVALID_REQUEST
        described = await c.call(DESCRIBE_CONFIGS, 4, describe_values((GROUP, "", None)))
        assert described.results[0].error_code == Errors.INVALID_REQUEST
        assert dict(h.cache.image.resource_configs(resource)) == {session: "50000"}

        deleted = await c.call(INCREMENTAL_ALTER_CONFIGS, 1, group_ops((session, DELETE, None)))
        assert deleted.responses[0].error_code == Errors.NONE
        assert dict(h.cache.image.resource_configs(resource)) == {}
        assert (await describe(c))[session].config_source == DEFAULT_CONFIG

    run(tmp_path, test)


def test_a_create_topics_of_many_topics_answers_each_its_own_configs(tmp_path: Path) -> None:
    """The answers of a large CreateTopics are built once per distinct set of overrides (a
    scan of the controller's reply and every topic's configs built again held the loop for
    seconds at 10,000 topics; review helper-221): each topic still gets its own."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        retention = ["1000", "2000", "1000", None]
        values: dict[str, Any] = {
            "topics": [
                {
                    "name": f"many-{i}",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [] if ms is None else [{"name": "retention.ms", "value": ms}],
                }
                for i, ms in enumerate(retention)
            ],
            "timeout": 5000,
            "validate_only": True,
        }
        topics = (await c.call(CREATE_TOPICS, 5, values)).topics
        assert [t.name for t in topics] == [f"many-{i}" for i in range(4)]
        answered = [{e.name: e.value for e in t.configs}["retention.ms"] for t in topics]
        assert answered == ["1000", "2000", "1000", HOUR_MS]

    run(tmp_path, test)


def test_create_topics_answers_every_config_of_the_new_topic_with_its_source(
    tmp_path: Path,
) -> None:
    """KIP-525 (CreateTopics v5+): the answer carries every config of the topic as created,
    with its source, as DescribeConfigs would show it, not only the ones the request named."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        values: dict[str, Any] = {
            "topics": [
                {
                    "name": "made",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": "segment.ms", "value": "60000"}],
                }
            ],
            "timeout": 5000,
            "validate_only": False,
        }
        (created,) = (await c.call(CREATE_TOPICS, 5, values)).topics
        assert created.error_code == Errors.NONE
        configs = {e.name: (e.value, e.config_source) for e in created.configs}
        assert list(configs) == LISTED
        assert configs["segment.ms"] == ("60000", DYNAMIC_TOPIC_CONFIG)
        assert configs["retention.ms"] == (HOUR_MS, STATIC_BROKER_CONFIG)
        assert configs["cleanup.policy"] == ("delete", DEFAULT_CONFIG)
        # KIP-1030: segment.bytes takes at least 1 MiB; internal.segment.bytes (Kafka's, for
        # tests) goes lower and sets the log's segments.
        topic = values["topics"][0]
        topic.update(name="tiny", configs=[{"name": "segment.bytes", "value": "1000"}])
        (tiny,) = (await c.call(CREATE_TOPICS, 5, values)).topics
        assert (tiny.error_code, tiny.error_message) == (
            Errors.INVALID_CONFIG,
            "Invalid value 1000 for configuration segment.bytes: Value must be at least 1048576",
        )
        topic.update(name="small", configs=[{"name": "internal.segment.bytes", "value": "1000"}])
        (small,) = (await c.call(CREATE_TOPICS, 5, values)).topics
        assert small.error_code == Errors.NONE
        topic = h.cache.image.topic_by_name("small")
        assert topic is not None and dict(topic.configs) == {"internal.segment.bytes": "1000"}
        # Listed where set, as Kafka's ConfigHelper lists a resource's own values: hidden, it
        # could not be deleted by kafka-configs (which deletes only keys described) and a
        # segment.bytes altered beside it did nothing visible.
        for listed in (
            small.configs,
            (await c.call(DESCRIBE_CONFIGS, 4, describe_values((TOPIC, "small", None))))
            .results[0]
            .configs,
        ):
            entries = {e.name: (e.value, e.config_source) for e in listed}
            assert set(entries) == {*LISTED, "internal.segment.bytes"}
            assert entries["internal.segment.bytes"] == ("1000", DYNAMIC_TOPIC_CONFIG)
        unset = await c.call(DESCRIBE_CONFIGS, 4, describe_values((TOPIC, "made", None)))
        assert "internal.segment.bytes" not in {e.name for e in unset.results[0].configs}

    run(tmp_path, test)


def test_values_are_described_as_kafka_writes_them_back(tmp_path: Path) -> None:
    """A topic's value is shown parsed and written back (Kafka's ConfigDef.convertToString of
    the LogConfig's value), its own synonym too (createTopicConfigEntry); a broker-level
    synonym as it was set, and so is a cluster-level default described (ConfigHelper reads
    the stored strings). Its own synonym was shown as set, and the default written back."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        own = {
            "cleanup.policy": "compact, delete",
            "unclean.leader.election.enable": "TRUE",
            "retention.ms": " +100 ",
        }
        await h.create_topic("t", 1, configs=own)
        response = await c.call(
            INCREMENTAL_ALTER_CONFIGS,
            1,
            incremental_values(
                "", ("log.cleaner.min.cleanable.ratio", SET, "5e-1"), resource_type=BROKER
            ),
        )
        assert response.responses[0].error_code == Errors.NONE
        response = await c.call(
            DESCRIBE_CONFIGS,
            4,
            describe_values(
                (TOPIC, "t", [*own, "min.cleanable.dirty.ratio"]),
                (BROKER, "", ["log.cleaner.min.cleanable.ratio"]),
                synonyms=True,
            ),
        )
        topic, cluster_wide = response.results
        shown = {e.name: (e.value, e.synonyms[0].value) for e in topic.configs}
        assert shown == {
            "cleanup.policy": ("compact,delete", "compact,delete"),
            "unclean.leader.election.enable": ("true", "true"),
            "retention.ms": ("100", "100"),
            "min.cleanable.dirty.ratio": ("0.5", "5e-1"),
        }
        assert [(e.name, e.value) for e in cluster_wide.configs] == [
            ("log.cleaner.min.cleanable.ratio", "5e-1")
        ]

    run(tmp_path, test)


def test_cluster_level_defaults_reach_every_log_without_its_own(tmp_path: Path) -> None:
    """``kafka-configs --entity-type brokers --entity-default --alter --add-config
    log.retention.ms=...``: every hosted log whose topic has no retention.ms of its own takes
    it at once, ahead of the node's config file, and a topic created later too; removing it
    gives the file's value back (Kafka's DynamicLogConfig). DescribeConfigs shows it under
    the broker name, and on topics as DYNAMIC_DEFAULT_BROKER_CONFIG."""
    dynamic_default = 3

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("plain", 2, replication_factor=3)
        await h.create_topic("own", 1, replication_factor=3, configs={"retention.ms": "5000"})

        def logs() -> list[tuple[str, Log]]:
            partitions = h.replicas.partitions.items()
            return [(topic, p.log) for (topic, _), p in partitions if topic != "__consumer_offsets"]

        def retention() -> dict[str, set[int]]:
            found: dict[str, set[int]] = {}
            for topic, log in logs():
                found.setdefault(topic, set()).add(log.config.retention_ms)
            return found

        static = h.replicas.default_log_config.retention_ms
        assert retention() == {"plain": {static}, "own": {5000}}

        async def cluster_alter(*ops: tuple[str, int, str | None]) -> None:
            response = await c.call(
                INCREMENTAL_ALTER_CONFIGS, 1, incremental_values("", *ops, resource_type=BROKER)
            )
            assert response.responses[0].error_code == Errors.NONE, response

        await cluster_alter(
            ("log.retention.ms", SET, "7000"), ("log.cleanup.policy", APPEND, "compact")
        )
        assert retention() == {"plain": {7000}, "own": {5000}}
        assert {log.config.cleanup_policy for _, log in logs()} == {
            frozenset({"delete", "compact"})
        }
        await h.create_topic("later", 1, replication_factor=3)
        assert retention()["later"] == {7000}
        response = await c.call(
            DESCRIBE_CONFIGS,
            4,
            describe_values(
                (BROKER, "", None),
                (TOPIC, "plain", ["retention.ms"]),
                (BROKER, str(NODE_ID), ["log.cleanup.policy"]),
                synonyms=True,
            ),
        )
        cluster_wide, topic, mine = response.results
        # A broker's listing has every cluster-level key, its file setting it or not.
        ((policy,),) = [mine.configs]
        assert (policy.value, policy.config_source, policy.read_only) == (
            "delete,compact",
            dynamic_default,
            False,
        )
        assert {e.name: (e.value, e.config_source) for e in cluster_wide.configs} == {
            "log.retention.ms": ("7000", dynamic_default),
            "log.cleanup.policy": ("delete,compact", dynamic_default),
        }
        (e,) = topic.configs
        assert (e.value, e.config_source) == ("7000", dynamic_default)
        assert [(s.name, s.source) for s in e.synonyms][:2] == [
            ("log.retention.ms", dynamic_default),
            ("log.retention.ms", STATIC_BROKER_CONFIG),
        ]
        await cluster_alter(
            ("log.retention.ms", DELETE, None), ("log.cleanup.policy", DELETE, None)
        )
        assert retention() == {"plain": {static}, "own": {5000}, "later": {static}}
        assert {log.config.cleanup_policy for _, log in logs()} == {frozenset({"delete"})}

    run(tmp_path, test)


def test_the_cluster_level_min_isr_is_altered_and_described(tmp_path: Path) -> None:
    """``kafka-configs --entity-default --alter --add-config min.insync.replicas=2`` (the
    active controller writes its own value when the log has none, KIP-966). Topics and this
    node's config show it as DYNAMIC_DEFAULT_BROKER_CONFIG, ahead of the static and default
    values; it may not be removed while ELR is on, and a key that is not dynamic is refused."""
    dynamic_default = 3
    min_isr = "min.insync.replicas"

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1)
        cluster_ops = incremental_values("", (min_isr, SET, "2"), resource_type=BROKER)
        response = await c.call(INCREMENTAL_ALTER_CONFIGS, 1, cluster_ops)
        assert response.responses[0].error_code == Errors.NONE
        response = await c.call(
            DESCRIBE_CONFIGS,
            4,
            describe_values(
                (BROKER, "", None), (BROKER, str(NODE_ID), [min_isr]), (TOPIC, "t", [min_isr]),
                synonyms=True,
            ),
        )  # fmt: skip
        cluster_wide, mine, topic = response.results
        ((entry,),) = [cluster_wide.configs]
        assert (entry.name, entry.value, entry.config_source, entry.read_only) == (
            min_isr,
            "2",
            dynamic_default,
            False,
        )
        for described in (mine, topic):
            (e,) = described.configs
            assert (e.value, e.config_source) == ("2", dynamic_default), described
            assert [(s.value, s.source) for s in e.synonyms][:1] == [("2", dynamic_default)]
            assert e.synonyms[-1].source == DEFAULT_CONFIG
        for op, expected in (
            ((min_isr, DELETE, None), Errors.INVALID_CONFIG),
            (("log.dirs", SET, "/elsewhere"), Errors.INVALID_REQUEST),
        ):
            refused = await c.call(
                INCREMENTAL_ALTER_CONFIGS, 1, incremental_values("", op, resource_type=BROKER)
            )
            (r,) = refused.responses
            assert r.error_code == expected, r
        assert h.cache.image.resource_configs(ConfigResource(ConfigResourceType.BROKER, "")) == {
            min_isr: "2"
        }

    run(tmp_path, test)
