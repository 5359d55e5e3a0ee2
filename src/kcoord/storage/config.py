"""Per-log configuration with Kafka's topic-level names and defaults (``LogConfig`` in Kafka).

``TOPIC_CONFIGS`` defines every topic config kcoord knows (Kafka's ``LogConfig.configDef``):
type, default, documentation, the broker config that sets the default, and whether kcoord
implements it. ``parse_topic_config`` validates one as Kafka does; an unimplemented config takes
only Kafka's default, so a topic never claims a behaviour its log does not have.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from enum import IntEnum
from typing import Final

DAY_MS = 24 * 60 * 60 * 1000
LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
# What Java's Double.parseDouble reads, but its hexadecimal form: NaN and Infinity as Java
# spells them, digits with a point and an exponent, and a float or double suffix.
_JAVA_DOUBLE: Final = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)
# compression.type's values (Kafka's BrokerCompressionType names).
COMPRESSION_TYPES: Final = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
# message.timestamp.type's values (Kafka's TimestampType names).
TIMESTAMP_TYPES: Final = ("CreateTime", "LogAppendTime")


class InvalidConfigError(ValueError):
    """A topic config that Kafka would refuse (INVALID_CONFIG)."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * DAY_MS
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_bytes: int = -1
    retention_ms: int = 7 * DAY_MS
    cleanup_policy: frozenset[str] = frozenset({"delete"})
    delete_retention_ms: int = DAY_MS
    min_compaction_lag_ms: int = 0
    # KIP-354: a compacted log whose oldest dirty record is this old is cleaned whatever its
    # dirty ratio, and its active segment rolls by then (``max_segment_ms``).
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    max_message_bytes: int = 1024 * 1024 + 12
    # CreateTime: records keep the producer's timestamps, which must lie within
    # [now - before, now + after] (KIP-937; the 1-hour "after" default is Kafka 4.0's,
    # KIP-1030). LogAppendTime: the leader stamps each batch with its own clock.
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = 60 * 60 * 1000
    # producer: batches are stored as the producer compressed them; a codec name (or
    # uncompressed): the leader recompresses every batch in another codec (Kafka's
    # BrokerCompressionType).
    compression_type: str = "producer"
    # None = never flush on count/time: rely on replication, fsync on roll and on close
    # (Kafka's default: flush.messages and flush.ms are Long.MAX_VALUE).
    flush_messages: int | None = None
    flush_ms: int | None = None

    @property
    def max_segment_ms(self) -> int:
        """Kafka's ``LogConfig.maxSegmentMs``: a compacted log's active segment also rolls at
        ``max.compaction.lag.ms``, so the records in it can be compacted in time."""
        if self.compact:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    def with_topic_configs(self, configs: Mapping[str, str]) -> LogConfig:
        """Override with Kafka topic configs (``segment.bytes`` ...).

        ``InvalidConfigError`` for an unknown name or an invalid value. Topic configs that are
        not log settings (``min.insync.replicas`` ...) are checked and left to their owners.
        """
        changes: dict[str, object] = {}
        for name, raw in configs.items():
            value = parse_topic_config(name, raw)
            attr = TOPIC_CONFIGS[name].log_field
            if attr is None:
                continue
            if attr == "cleanup_policy":
                assert isinstance(value, tuple)
                value = frozenset(value)
            elif attr in ("flush_messages", "flush_ms") and value == LONG_MAX:
                value = None  # never, as the field's None
            changes[attr] = value
        if INTERNAL_SEGMENT_BYTES in configs:
            # In place of segment.bytes whichever comes first (Kafka's LogConfig.segmentSize).
            changes["segment_bytes"] = parse_topic_config(
                INTERNAL_SEGMENT_BYTES, configs[INTERNAL_SEGMENT_BYTES]
            )
        return replace(self, **changes)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Topic configs: Kafka's names, types, defaults and validation (Kafka's ``LogConfig.configDef``
# with ``TopicConfig``'s names; messages as Kafka's ``ConfigException`` and
# ``ControllerConfigurationValidator`` word them). The controller validates with these before
# it commits a topic's configs, so a log never meets a value it cannot take; DescribeConfigs
# lists them with their types and documentation.


class ConfigType(IntEnum):
    """Kafka's ``ConfigDef.Type`` as DescribeConfigs (v3+) codes it."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


@dataclass(frozen=True, slots=True)
class TopicConfigDef:
    """One key of Kafka's ``ConfigDef``: a topic config here, and the KIP-848 group configs
    (``cluster/coordinator/group_config.py``) use it too."""

    name: str
    type: ConfigType
    default: str  # Kafka's default, written as DescribeConfigs shows it
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    valid: tuple[str, ...] = ()  # the allowed values of a STRING, or of each LIST item
    # The broker config that sets this config's default for every topic (Kafka's synonym).
    broker_synonym: str | None = None
    # False: kcoord does not implement the feature, so it takes only Kafka's default (a tool
    # that writes defaults explicitly still works; any other value is refused, not ignored).
    implemented: bool = True
    # Kafka's ConfigDef.defineInternal: taken like any other, listed by DescribeConfigs only
    # where a topic sets it (ConfigHelper lists a resource's own values and the non-internal).
    internal: bool = False

    @property
    def log_field(self) -> str | None:
        """The ``LogConfig`` field this config sets, if it is a log config (not
        internal.segment.bytes: ``with_topic_configs`` puts it in place of segment.bytes)."""
        attr = self.name.replace(".", "_")
        return attr if attr in _LOG_FIELDS else None


# KIP-1030 (Kafka 4.1, KAFKA-19080): segment.bytes takes at least 1 MiB, so that a topic
# cannot be made to roll a segment (an open file, an fsync) every few batches and run a broker
# out of file descriptors. Kafka's tests use its internal.segment.bytes for smaller segments
# (LogConfig); so do kcoord's, and (kcoord's own) the controller writes an
# offsets.topic.segment.bytes below the minimum as that, where Kafka would refuse the topic.
SEGMENT_BYTES_MIN: Final = 1024 * 1024
INTERNAL_SEGMENT_BYTES: Final = "internal.segment.bytes"


_L, _I, _B, _S = ConfigType.LONG, ConfigType.INT, ConfigType.BOOLEAN, ConfigType.STRING
TOPIC_CONFIGS: Final[Mapping[str, TopicConfigDef]] = {
    d.name: d
    for d in sorted(  # by name, as DescribeConfigs lists them
        (
            TopicConfigDef(
                "cleanup.policy",
                ConfigType.LIST,
                "delete",
                "delete: old segments are deleted by retention.ms / retention.bytes; compact: the "
                "log keeps the last record of every key; both may be given.",
                valid=("compact", "delete"),
                broker_synonym="log.cleanup.policy",
            ),
            TopicConfigDef(
                "compression.type",
                _S,
                "producer",
                "producer: batches are stored as the producer compressed them; uncompressed, "
                "gzip, snappy, lz4 or zstd: the leader recompresses a batch in any other codec.",
                valid=COMPRESSION_TYPES,
                broker_synonym="compression.type",
            ),
            TopicConfigDef(
                "delete.retention.ms",
                _L,
                str(DAY_MS),
                "How long a tombstone stays in a compacted log after the cleaner reached it.",
                minimum=0,
                broker_synonym="log.cleaner.delete.retention.ms",
            ),
            TopicConfigDef(
                "file.delete.delay.ms",
                _L,
                "60000",
                "How long a deleted segment's files are kept (kcoord removes them at once).",
                minimum=0,
                broker_synonym="log.segment.delete.delay.ms",
                implemented=False,
            ),
            TopicConfigDef(
                "flush.messages",
                _L,
                str(LONG_MAX),
                "fsync the log after this many messages; the default relies on replication.",
                minimum=1,
                broker_synonym="log.flush.interval.messages",
            ),
            TopicConfigDef(
                "flush.ms",
                _L,
                str(LONG_MAX),
                "fsync the log when this long has passed since the last fsync.",
                minimum=0,
                broker_synonym="log.flush.interval.ms",
            ),
            TopicConfigDef(
                "follower.replication.throttled.replicas",
                ConfigType.LIST,
                "",
                "Replicas whose follower fetches are throttled (kcoord throttles none).",
                implemented=False,
            ),
            TopicConfigDef(
                "index.interval.bytes",
                _I,
                "4096",
                "Bytes of log between two entries of the offset index.",
                minimum=0,
                maximum=INT_MAX,
                broker_synonym="log.index.interval.bytes",
            ),
            TopicConfigDef(
                "leader.replication.throttled.replicas",
                ConfigType.LIST,
                "",
                "Replicas whose leader reads are throttled (kcoord throttles none).",
                implemented=False,
            ),
            TopicConfigDef(
                "max.compaction.lag.ms",
                _L,
                str(LONG_MAX),
                "The longest a record may stay uncompacted: a compacted log whose oldest dirty "
                "record is older is cleaned whatever its dirty ratio, and its active segment rolls "
                "by then.",
                minimum=1,
                broker_synonym="log.cleaner.max.compaction.lag.ms",
            ),
            TopicConfigDef(
                "max.message.bytes",
                _I,
                str(1024 * 1024 + 12),
                "The largest record batch the log accepts; larger ones get MESSAGE_TOO_LARGE.",
                minimum=0,
                maximum=INT_MAX,
                broker_synonym="message.max.bytes",
            ),
            TopicConfigDef(
                "message.timestamp.after.max.ms",
                _L,
                str(60 * 60 * 1000),
                "With CreateTime, how far ahead of the leader's clock a record's timestamp may be; "
                "a later one gets INVALID_TIMESTAMP.",
                minimum=0,
                broker_synonym="log.message.timestamp.after.max.ms",
            ),
            TopicConfigDef(
                "message.timestamp.before.max.ms",
                _L,
                str(LONG_MAX),
                "With CreateTime, how far behind the leader's clock a record's timestamp may be; "
                "an earlier one gets INVALID_TIMESTAMP.",
                minimum=0,
                broker_synonym="log.message.timestamp.before.max.ms",
            ),
            TopicConfigDef(
                "message.timestamp.type",
                _S,
                "CreateTime",
                "CreateTime: records keep the producer's timestamps. LogAppendTime: the leader "
                "stamps every batch with its clock when it appends it.",
                valid=TIMESTAMP_TYPES,
                broker_synonym="log.message.timestamp.type",
            ),
            TopicConfigDef(
                "min.cleanable.dirty.ratio",
                ConfigType.DOUBLE,
                "0.5",
                "The share of a compacted log's cleanable bytes written since its last cleaning "
                "at which the cleaner takes it on.",
                minimum=0,
                maximum=1,
                broker_synonym="log.cleaner.min.cleanable.ratio",
            ),
            TopicConfigDef(
                "min.compaction.lag.ms",
                _L,
                "0",
                "The youngest a record may be and still be compacted away.",
                minimum=0,
                broker_synonym="log.cleaner.min.compaction.lag.ms",
            ),
            TopicConfigDef(
                "min.insync.replicas",
                _I,
                "2",  # DESIGN §5; Kafka's is 1 (the node's min.insync.replicas takes it too)
                "With acks=all, the fewest in-sync replicas a write needs; fewer get "
                "NOT_ENOUGH_REPLICAS.",
                minimum=1,
                maximum=INT_MAX,
                broker_synonym="min.insync.replicas",
            ),
            TopicConfigDef(
                "preallocate",
                _B,
                "false",
                "Preallocate a new segment's file (kcoord does not).",
                broker_synonym="log.preallocate",
                implemented=False,
            ),
            TopicConfigDef(
                "retention.bytes",
                _L,
                "-1",
                "Delete the oldest segments while the log is larger than this; -1: no limit.",
                # No lower bound, as in Kafka's LogConfig: any negative value is no limit.
                broker_synonym="log.retention.bytes",
            ),
            TopicConfigDef(
                "retention.ms",
                _L,
                str(7 * DAY_MS),
                "Delete segments whose newest record is older than this; -1: no limit.",
                minimum=-1,
                broker_synonym="log.retention.ms",
            ),
            TopicConfigDef(
                "segment.bytes",
                _I,
                str(1024 * 1024 * 1024),
                "Roll to a new segment when the active one would grow past this size.",
                minimum=SEGMENT_BYTES_MIN,
                maximum=INT_MAX,
                broker_synonym="log.segment.bytes",
            ),
            TopicConfigDef(
                INTERNAL_SEGMENT_BYTES,
                _I,
                str(1024 * 1024 * 1024),  # Kafka's is null: segment.bytes then applies
                "segment.bytes without its 1 MiB minimum, in place of it; for tests only.",
                minimum=14,  # LegacyRecord.RECORD_OVERHEAD_V0, segment.bytes' bound before 4.1
                maximum=INT_MAX,
                internal=True,
            ),
            TopicConfigDef(
                "segment.index.bytes",
                _I,
                str(10 * 1024 * 1024),
                "The size of a new segment's preallocated offset index.",
                minimum=4,  # LogConfig: atLeast(4); an index keeps one entry at the least
                maximum=INT_MAX,
                broker_synonym="log.index.size.max.bytes",
            ),
            TopicConfigDef(
                "segment.jitter.ms",
                _L,
                "0",
                "Random jitter subtracted from segment.ms (kcoord adds none).",
                minimum=0,
                broker_synonym="log.roll.jitter.ms",
                implemented=False,
            ),
            TopicConfigDef(
                "segment.ms",
                _L,
                str(7 * DAY_MS),
                "Roll to a new segment when the active one's first record is this old.",
                minimum=1,
                broker_synonym="log.roll.ms",
            ),
            TopicConfigDef(
                "unclean.leader.election.enable",
                _B,
                "false",
                "Elect a replica outside the ISR when no in-sync one is left, losing data.",
                broker_synonym="unclean.leader.election.enable",
            ),
            # Kafka 4.0 configs of features kcoord does not have (KIP-390 compression levels,
            # KIP-405 tiered storage, KIP-950): their defaults only.
            TopicConfigDef(
                "compression.gzip.level",
                _I,
                "-1",
                "The gzip level of batches the broker compresses (kcoord: the codec's default).",
                broker_synonym="compression.gzip.level",
                implemented=False,
            ),
            TopicConfigDef(
                "compression.lz4.level",
                _I,
                "9",
                "The lz4 level of batches the broker compresses (kcoord: the codec's default).",
                broker_synonym="compression.lz4.level",
                implemented=False,
            ),
            TopicConfigDef(
                "compression.zstd.level",
                _I,
                "3",
                "The zstd level of batches the broker compresses (kcoord: the codec's default).",
                broker_synonym="compression.zstd.level",
                implemented=False,
            ),
            TopicConfigDef(
                "local.retention.bytes",
                _L,
                "-2",
                "Local retention with tiered storage (kcoord has none: -2, as retention.bytes).",
                broker_synonym="log.local.retention.bytes",
                implemented=False,
            ),
            TopicConfigDef(
                "local.retention.ms",
                _L,
                "-2",
                "Local retention with tiered storage (kcoord has none: -2, as retention.ms).",
                broker_synonym="log.local.retention.ms",
                implemented=False,
            ),
            TopicConfigDef(
                "remote.log.copy.disable",
                _B,
                "false",
                "Stop copying segments to tiered storage (kcoord has none).",
                implemented=False,
            ),
            TopicConfigDef(
                "remote.log.delete.on.disable",
                _B,
                "false",
                "Delete tiered segments when tiered storage is turned off (kcoord has none).",
                implemented=False,
            ),
            TopicConfigDef(
                "remote.storage.enable",
                _B,
                "false",
                "Tiered storage for the topic (kcoord has none).",
                implemented=False,
            ),
        ),
        key=lambda d: d.name,
    )
}
_LOG_FIELDS: Final = frozenset(f.name for f in fields(LogConfig))


def parse_topic_config(name: str, raw: str | None) -> object:
    """The value of topic config ``name``; ``InvalidConfigError`` with Kafka's message if not.

    INT and LONG parse to ``int``, BOOLEAN to ``bool``, DOUBLE to ``float``, LIST to a tuple of
    its items, STRING to itself.
    """
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    if raw is None:
        raise InvalidConfigError(f"Null value not supported for topic configs: {name}")
    value = parse_config_value(definition, raw)
    if not definition.implemented and value != parse_config_value(definition, definition.default):
        raise InvalidConfigError(
            f"Invalid value {raw} for configuration {name}: kcoord does not implement "
            f"{name}; it takes only the default, {definition.default or '(empty)'}"
        )
    return value


# The broker configs an operator may set for the whole cluster at run time (``kafka-configs
# --entity-type brokers --entity-default``): the broker synonym of each topic config, the
# default of every topic without its own (Kafka's ``DynamicLogConfig.ReconfigurableConfigs``,
# ``ServerTopicConfigSynonyms.TOPIC_CONFIG_SYNONYMS``), by the broker name.
TOPIC_CONFIGS_BY_BROKER_NAME: Final[Mapping[str, TopicConfigDef]] = {
    d.broker_synonym: d for d in TOPIC_CONFIGS.values() if d.broker_synonym is not None
}


def segment_bytes_from_before_kip_1030(configs: Mapping[str, str]) -> Mapping[str, str]:
    """``configs`` with a segment.bytes below ``SEGMENT_BYTES_MIN`` as internal.segment.bytes:
    one committed before that bound came (it was 14) keeps the size it was given, where it
    was dropped as invalid and the log rolled at 1 GiB."""
    raw = configs.get("segment.bytes")
    if raw is None or INTERNAL_SEGMENT_BYTES in configs:
        return configs
    try:
        value = parse_topic_config(INTERNAL_SEGMENT_BYTES, raw)
    except InvalidConfigError:
        return configs
    if not isinstance(value, int) or value >= SEGMENT_BYTES_MIN:
        return configs
    moved = {name: v for name, v in configs.items() if name != "segment.bytes"}
    moved[INTERNAL_SEGMENT_BYTES] = raw
    return moved


def cluster_topic_defaults(cluster: Mapping[str, str]) -> dict[str, str]:
    """The cluster-level dynamic broker configs (BROKER resource "") that set topic configs'
    defaults, under the topic configs' names (Kafka's ``KafkaConfig.extractLogConfigMap``)."""
    return {
        TOPIC_CONFIGS_BY_BROKER_NAME[key].name: value
        for key, value in cluster.items()
        if key in TOPIC_CONFIGS_BY_BROKER_NAME
    }


def topic_config_error(configs: Mapping[str, str | None]) -> str | None:
    """The message of the first config Kafka would refuse (INVALID_CONFIG), or None."""
    parsed: dict[str, object] = {}
    for name, raw in configs.items():
        try:
            parsed[name] = parse_topic_config(name, raw)
        except InvalidConfigError as e:
            return str(e)
    # LogConfig.validateValues: the two compaction lags must not contradict each other.
    min_lag = parsed.get("min.compaction.lag.ms", 0)
    max_lag = parsed.get("max.compaction.lag.ms", LONG_MAX)
    assert isinstance(min_lag, int) and isinstance(max_lag, int)
    if min_lag > max_lag:
        return (
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
            f"max.compaction.lag.ms ({max_lag})"
        )
    return None


def parse_config_value(definition: TopicConfigDef, raw: str) -> object:
    """``raw`` parsed and checked as Kafka's ``ConfigDef.parse`` does (type, bounds, valid
    strings); ``InvalidConfigError`` with Kafka's message if it may not be."""
    name, text = definition.name, raw.strip()

    def invalid(reason: str) -> InvalidConfigError:
        return InvalidConfigError(f"Invalid value {raw} for configuration {name}: {reason}")

    match definition.type:
        case ConfigType.BOOLEAN:
            if text.lower() not in ("true", "false"):
                raise invalid("Expected value to be either true or false")
            return text.lower() == "true"
        case ConfigType.STRING:
            if definition.valid and text not in definition.valid:
                raise invalid(f"String must be one of: {', '.join(definition.valid)}")
            return text
        case ConfigType.LIST:
            # ConfigDef's LIST: "" is the empty list; otherwise every comma-separated item
            # counts, an empty one too ("delete," has two), which ValidList refuses. The empty
            # list is valid (ValidList.in allows it): cleanup.policy="" neither deletes nor
            # compacts.
            parts = [p.strip() for p in text.split(",")] if text.strip() else []
            for item in parts:
                if definition.valid and item not in definition.valid:
                    raise invalid(f"String must be one of: {', '.join(definition.valid)}")
            return tuple(p for p in parts if p)
        case ConfigType.DOUBLE:
            # Double.parseDouble's decimal forms (Python's float also takes "0.0_5", "inf").
            if not _JAVA_DOUBLE.fullmatch(text):
                raise invalid("Not a number of type DOUBLE")
            number: float = float(text.rstrip("dDfF"))
        case _:
            limit = LONG_MAX if definition.type is ConfigType.LONG else INT_MAX
            # Past 19 significant digits no long fits; checked before ``int``, which raises a
            # plain ValueError past 4,300 digits (the request failed UNKNOWN_SERVER_ERROR, its
            # valid topics with it). Leading zeros count for nothing, as in Long.parseLong.
            digits = re.fullmatch(r"([+-]?)0*([0-9]+)", text)
            if (
                digits is None
                or len(digits[2]) > 19
                or not -limit - 1 <= (number := int(digits[1] + digits[2])) <= limit
            ):
                raise invalid(f"Not a number of type {definition.type.name}")
    if definition.minimum is not None and number < definition.minimum:
        raise invalid(f"Value must be at least {_bound(definition.minimum)}")
    if definition.maximum is not None and number > definition.maximum:
        raise invalid(f"Value must be no more than {_bound(definition.maximum)}")
    return number


@functools.lru_cache(maxsize=64)  # read by every acks=all append and HW advance
def parse_min_insync_replicas(raw: str) -> int | None:
    """A ``min.insync.replicas`` value as the controller and every leader read it, parsed as
    Kafka's ``ConfigDef`` does (``" 2"`` and ``"+2"`` are 2); None when it does not parse, and
    the default applies. One parser: a controller and a leader that disagree on it break
    KIP-966's ELR (the leader commits with fewer replicas than the controller's ELR holds)."""
    try:
        value = parse_config_value(TOPIC_CONFIGS["min.insync.replicas"], raw)
    except InvalidConfigError:
        return None
    assert isinstance(value, int)
    return value


def canonical_config_value(definition: TopicConfigDef, raw: str) -> str:
    """A stored value as Kafka's DescribeConfigs shows it: parsed, then written back
    (``ConfigDef.convertToString``: ``TRUE`` is ``true``, ``compact, delete`` is
    ``compact,delete``, `` +100`` is ``100``, ``5e-1`` is ``0.5``). One that does not parse
    (a later build's bound) is shown as it is."""
    try:
        value = parse_config_value(definition, raw)
    except InvalidConfigError:
        return raw
    match value:
        case bool():
            return "true" if value else "false"
        case tuple():
            return ",".join(str(item) for item in value)
        case float():
            return java_double(value)
    return str(value)


def java_double(value: float) -> str:
    """Java's ``Double.toString``: plain decimals from 10^-3 up to 10^7, otherwise the
    shortest digits with an exponent (``1.0E-4``, ``1.5E7``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)  # Python writes these plainly too, with at least one decimal
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    power = exponent + len(text) - 1
    text = text.rstrip("0") or "0"
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{power}"


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
