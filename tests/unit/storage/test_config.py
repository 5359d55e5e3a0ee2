"""Topic configs: Kafka's validation and messages, and how they reach a ``LogConfig``."""

from __future__ import annotations

import pytest

from kcoord.storage.config import (
    LONG_MAX,
    TOPIC_CONFIGS,
    InvalidConfigError,
    LogConfig,
    canonical_config_value,
    java_double,
    parse_topic_config,
    topic_config_error,
)


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("retention.ms", "-1", -1),
        ("retention.ms", " 3600000 ", 3_600_000),
        ("retention.bytes", "-2", -2),  # LogConfig has no lower bound: no limit
        ("segment.bytes", "1048576", 1_048_576),
        ("internal.segment.bytes", "14", 14),
        ("segment.index.bytes", "4", 4),  # LogConfig's atLeast(4): 14 was refused
        ("cleanup.policy", "compact, delete", ("compact", "delete")),
        ("cleanup.policy", " ", ()),  # the empty list: ValidList.in allows it
        ("unclean.leader.election.enable", "TRUE", True),
        ("min.insync.replicas", "2", 2),
        ("flush.messages", str(LONG_MAX), LONG_MAX),
        ("retention.ms", "0" * 5000 + "7", 7),  # Long.parseLong takes any leading zeros
        ("compression.type", "zstd", "zstd"),
        ("message.timestamp.type", "LogAppendTime", "LogAppendTime"),
        ("max.compaction.lag.ms", "60000", 60_000),
        ("min.cleanable.dirty.ratio", "0.50", 0.5),
        ("min.cleanable.dirty.ratio", ".5e0d", 0.5),  # Double.parseDouble's forms
        # Unimplemented configs take Kafka's default, however it is written.
        ("preallocate", "false", False),
        ("leader.replication.throttled.replicas", "", ()),
    ],
)
def test_valid_values_parse_to_their_type(name: str, raw: str, value: object) -> None:
    assert parse_topic_config(name, raw) == value
    assert topic_config_error({name: raw}) is None


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("retention.mss", "1", "Unknown topic config name: retention.mss"),
        ("retention.ms", None, "Null value not supported for topic configs: retention.ms"),
        (
            "retention.ms",
            "soon",
            "Invalid value soon for configuration retention.ms: Not a number of type LONG",
        ),
        (
            "retention.ms",
            str(LONG_MAX + 1),
            f"Invalid value {LONG_MAX + 1} for configuration retention.ms: "
            "Not a number of type LONG",
        ),
        (  # past the 4,300 digits ``int`` reads: it raised ValueError, failing the request
            "retention.ms",
            "9" * 5000,
            f"Invalid value {'9' * 5000} for configuration retention.ms: Not a number of type LONG",
        ),
        (
            "segment.bytes",
            str(2**31),
            f"Invalid value {2**31} for configuration segment.bytes: Not a number of type INT",
        ),
        (
            "segment.bytes",
            "1048575",
            "Invalid value 1048575 for configuration segment.bytes: Value must be at least 1048576",
        ),
        (
            "internal.segment.bytes",
            "13",
            "Invalid value 13 for configuration internal.segment.bytes: Value must be at least 14",
        ),
        (
            "segment.index.bytes",
            "3",
            "Invalid value 3 for configuration segment.index.bytes: Value must be at least 4",
        ),
        (
            "min.insync.replicas",
            "0",
            "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1",
        ),
        (
            "cleanup.policy",
            "compact,bogus",
            "Invalid value compact,bogus for configuration cleanup.policy: "
            "String must be one of: compact, delete",
        ),
        (  # ConfigDef splits with its empty items, which are not valid policies
            "cleanup.policy",
            "delete,",
            "Invalid value delete, for configuration cleanup.policy: "
            "String must be one of: compact, delete",
        ),
        (
            "unclean.leader.election.enable",
            "yes",
            "Invalid value yes for configuration unclean.leader.election.enable: "
            "Expected value to be either true or false",
        ),
        (
            "preallocate",
            "true",
            "Invalid value true for configuration preallocate: kcoord does not implement "
            "preallocate; it takes only the default, false",
        ),
        (
            "compression.type",
            "brotli",
            "Invalid value brotli for configuration compression.type: String must be one of: "
            "uncompressed, zstd, lz4, snappy, gzip, producer",
        ),
        (
            "message.timestamp.type",
            "logappendtime",
            "Invalid value logappendtime for configuration message.timestamp.type: String must "
            "be one of: CreateTime, LogAppendTime",
        ),
        (
            "min.cleanable.dirty.ratio",
            "0.0_5",
            "Invalid value 0.0_5 for configuration min.cleanable.dirty.ratio: "
            "Not a number of type DOUBLE",
        ),
        (
            "min.cleanable.dirty.ratio",
            "nan",
            "Invalid value nan for configuration min.cleanable.dirty.ratio: "
            "Not a number of type DOUBLE",
        ),
        (
            "min.cleanable.dirty.ratio",
            "1.5",
            "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: "
            "Value must be no more than 1",
        ),
    ],
)
def test_invalid_values_are_refused_with_kafkas_message(
    name: str, raw: str | None, message: str
) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        parse_topic_config(name, raw)
    assert str(caught.value) == message
    assert topic_config_error({"retention.ms": "1", name: raw}) == message


def test_every_default_is_valid() -> None:
    for name, definition in TOPIC_CONFIGS.items():
        parse_topic_config(name, definition.default)


def test_log_config_takes_the_log_settings_and_leaves_the_others() -> None:
    config = LogConfig().with_topic_configs(
        {
            "cleanup.policy": "compact",
            "retention.ms": "1000",
            "flush.messages": str(LONG_MAX),
            "flush.ms": "500",
            "min.insync.replicas": "2",  # the controller's and the replica manager's
            "compression.type": "producer",
        }
    )
    assert config.cleanup_policy == frozenset({"compact"})
    assert (config.retention_ms, config.flush_messages, config.flush_ms) == (1000, None, 500)
    assert config.segment_bytes == LogConfig().segment_bytes
    with pytest.raises(InvalidConfigError, match="Unknown topic config name: nope"):
        LogConfig().with_topic_configs({"nope": "1"})
    neither = LogConfig().with_topic_configs({"cleanup.policy": ""})
    assert (neither.cleanup_policy, neither.delete, neither.compact) == (frozenset(), False, False)


def test_internal_segment_bytes_takes_the_place_of_segment_bytes() -> None:
    """KIP-1030: segment.bytes takes at least 1 MiB; Kafka's internal.segment.bytes (its
    tests') goes lower and wins over segment.bytes whichever comes first."""
    for configs in (
        {"segment.bytes": "2097152", "internal.segment.bytes": "1024"},
        {"internal.segment.bytes": "1024", "segment.bytes": "2097152"},
    ):
        assert LogConfig().with_topic_configs(configs).segment_bytes == 1024
    assert LogConfig().with_topic_configs({"segment.bytes": "2097152"}).segment_bytes == 2097152
    assert TOPIC_CONFIGS["internal.segment.bytes"].internal


def test_the_compaction_lags_must_not_contradict_each_other() -> None:
    # LogConfig.validateValues, over the topic's configs as they would be after the change.
    assert topic_config_error({"min.compaction.lag.ms": "60000"}) is None
    assert topic_config_error(
        {"min.compaction.lag.ms": "60000", "max.compaction.lag.ms": "1000"}
    ) == (
        "conflict topic config setting min.compaction.lag.ms (60000) > max.compaction.lag.ms (1000)"
    )
    assert LogConfig().with_topic_configs({"max.compaction.lag.ms": "1000"}).max_segment_ms == (
        7 * 24 * 3_600_000
    )
    compacted = LogConfig().with_topic_configs(
        {"cleanup.policy": "compact", "max.compaction.lag.ms": "1000"}
    )
    assert compacted.max_segment_ms == 1000


@pytest.mark.parametrize(
    ("name", "raw", "shown"),
    [
        ("cleanup.policy", "compact, delete", "compact,delete"),
        ("cleanup.policy", "", ""),
        ("unclean.leader.election.enable", "TRUE", "true"),
        ("retention.ms", " +100 ", "100"),
        ("min.cleanable.dirty.ratio", "5e-1", "0.5"),
        ("min.cleanable.dirty.ratio", "0.0001", "1.0E-4"),
        ("compression.type", " lz4 ", "lz4"),
        ("retention.ms", "soon", "soon"),  # does not parse here: as it is
    ],
)
def test_values_are_shown_as_kafka_writes_them_back(name: str, raw: str, shown: str) -> None:
    """DescribeConfigs shows a value parsed and written back (ConfigDef.convertToString)."""
    assert canonical_config_value(TOPIC_CONFIGS[name], raw) == shown


@pytest.mark.parametrize(
    ("value", "java"),
    [
        (0.5, "0.5"),
        (1.0, "1.0"),
        (0.001, "0.001"),
        (0.0009, "9.0E-4"),
        (1.5e-05, "1.5E-5"),
        (9999999.0, "9999999.0"),
        (1e7, "1.0E7"),
        (-1.25e8, "-1.25E8"),
        (0.0, "0.0"),
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
    ],
)
def test_doubles_are_written_as_java_writes_them(value: float, java: str) -> None:
    assert java_double(value) == java
