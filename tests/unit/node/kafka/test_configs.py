"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs on the wire, against the harness
node (its broker config sets ``log.retention.ms`` to one hour and a secret admin token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kcoord.errors import Errors
from kcoord.storage.config import TOPIC_CONFIGS
from tests.unit.node.kafka.harness import NODE_ID, Harness
from tests.unit.node.kafka.test_handlers import run
from tests.unit.node.kafka.wire import AsyncWireClient

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
TOPIC, BROKER, GROUP = 2, 4, 32
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
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


def incremental_values(topic: str, *ops: tuple[str, int, str | None], dry: bool = False) -> Any:
    return {
        "resources": [
            {
                "resource_type": TOPIC,
                "resource_name": topic,
                "configs": [{"name": k, "config_operation": op, "value": v} for k, op, v in ops],
            }
        ],
        "validate_only": dry,
    }


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
        assert list(configs) == list(TOPIC_CONFIGS)
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

    run(tmp_path, test)


def test_describe_brokers_and_other_resources(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        response = await c.call(
            DESCRIBE_CONFIGS,
            4,
            describe_values(
                (BROKER, str(NODE_ID), None), (BROKER, "2", None), (BROKER, "", None),
                (GROUP, "g", None),
            ),
        )  # fmt: skip
        mine, other, cluster_wide, group = response.results
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
        assert all(e.read_only for e in configs.values())
        assert other.error_code == Errors.INVALID_REQUEST
        assert other.error_message == (
            "Unexpected broker id, expected 1 or empty string, but received 2"
        )
        assert (cluster_wide.error_code, cluster_wide.configs) == (Errors.NONE, ())
        assert group.error_code == Errors.INVALID_REQUEST

    run(tmp_path, test)


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
