"""Dynamic group configs (KIP-848): per-group overrides of the consumer group session timeout
and heartbeat interval, Kafka's ``GroupConfig``. Pure.

An operator sets them with IncrementalAlterConfigs (or AlterConfigs) on a GROUP resource
(``kafka-configs.sh --entity-type groups``); the group need not exist. The controller checks the
group's resulting set with ``group_config_error`` and commits ``Config`` records; the
coordinator reads the group's current set from the node's metadata image at every heartbeat
(``group_config_int``: capped to the node's current range), so a change reaches the members
with their next heartbeat's answer (the interval) and the session timer that answer restarts
(the timeout), as Kafka's ``GroupConfigManager`` does.

Kafka also has share-group configs (``share.*``, KIP-932) and streams-group ones
(``streams.*``, KIP-1071). kcoord has neither kind of group, so those names are unknown here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from kcoord.storage.config import (
    ConfigType,
    InvalidConfigError,
    TopicConfigDef,
    parse_config_value,
)

CONSUMER_SESSION_TIMEOUT_MS: Final = "consumer.session.timeout.ms"
CONSUMER_HEARTBEAT_INTERVAL_MS: Final = "consumer.heartbeat.interval.ms"

# GroupConfig's ConfigDef: Kafka's defaults (what DescribeConfigs shows as the default) and the
# broker configs that set the defaults in effect (GroupCoordinatorConfig.GROUP_PREFIX + name).
GROUP_CONFIGS: Final[Mapping[str, TopicConfigDef]] = {
    d.name: d
    for d in (
        TopicConfigDef(
            CONSUMER_SESSION_TIMEOUT_MS,
            ConfigType.INT,
            "45000",
            "The timeout to detect client failures when using the consumer group protocol.",
            minimum=1,
            broker_synonym="group.consumer.session.timeout.ms",
        ),
        TopicConfigDef(
            CONSUMER_HEARTBEAT_INTERVAL_MS,
            ConfigType.INT,
            "5000",
            "The heartbeat interval given to the members.",
            minimum=1,
            broker_synonym="group.consumer.heartbeat.interval.ms",
        ),
    )
}

# A group's configs as the metadata image holds them: name -> value.
GroupConfigLookup = Callable[[str], Mapping[str, str]]


def no_group_configs(group_id: str) -> Mapping[str, str]:
    return {}


@dataclass(frozen=True, slots=True)
class GroupConfigBounds:
    """The node's consumer group timing (GroupCoordinatorConfig): its defaults, and the range a
    group's own values must lie in."""

    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    min_session_timeout_ms: int = 45_000  # group.consumer.min.session.timeout.ms
    max_session_timeout_ms: int = 60_000  # group.consumer.max.session.timeout.ms
    min_heartbeat_interval_ms: int = 5_000  # group.consumer.min.heartbeat.interval.ms
    max_heartbeat_interval_ms: int = 15_000  # group.consumer.max.heartbeat.interval.ms

    def range_of(self, name: str) -> tuple[int, int]:
        if name == CONSUMER_SESSION_TIMEOUT_MS:
            return self.min_session_timeout_ms, self.max_session_timeout_ms
        return self.min_heartbeat_interval_ms, self.max_heartbeat_interval_ms

    def default_of(self, name: str) -> int:
        if name == CONSUMER_SESSION_TIMEOUT_MS:
            return self.session_timeout_ms
        return self.heartbeat_interval_ms


def group_config_error(configs: Mapping[str, str | None], bounds: GroupConfigBounds) -> str | None:
    """Why Kafka would refuse this set of a group's configs (INVALID_CONFIG), or None.

    The checks and messages of Kafka's ``GroupConfig.validate`` as of its trunk (the version
    with ``GroupConfig.evaluate``): a null value (``ControllerConfigurationValidator``), the
    names, each value's type and lower bound (``ConfigDef.parse``), each value set against the
    node's range, then the session timeout against the heartbeat interval, the node's value
    standing in for the one the group does not set. Kafka 4.0 filled in Kafka's defaults there
    instead, which let a group set a heartbeat interval longer than the node's own session
    timeout."""
    nulls = sorted(name for name, value in configs.items() if value is None)
    if nulls:
        return f"Null value not supported for group configs: {','.join(nulls)}"
    for name in configs:
        if name not in GROUP_CONFIGS:
            return f"Unknown group config name: {name}"
    values: dict[str, int] = {}
    for name, raw in configs.items():
        assert raw is not None
        try:
            value = parse_config_value(GROUP_CONFIGS[name], raw)
        except InvalidConfigError as e:
            return str(e)
        assert isinstance(value, int)
        values[name] = value
    for name in (CONSUMER_HEARTBEAT_INTERVAL_MS, CONSUMER_SESSION_TIMEOUT_MS):
        low, high = bounds.range_of(name)
        if name in values and not low <= values[name] <= high:
            return f"{name} must be in the range {low} to {high} inclusive."
    if values:
        session = values.get(CONSUMER_SESSION_TIMEOUT_MS, bounds.session_timeout_ms)
        heartbeat = values.get(CONSUMER_HEARTBEAT_INTERVAL_MS, bounds.heartbeat_interval_ms)
        if session <= heartbeat:
            return (
                f"{CONSUMER_SESSION_TIMEOUT_MS} must be greater than "
                f"{CONSUMER_HEARTBEAT_INTERVAL_MS}"
            )
    return None


def group_config_int(configs: Mapping[str, str], name: str, bounds: GroupConfigBounds) -> int:
    """A group's effective value of ``name``: its own, capped to the node's range (the range
    may have narrowed since the value was set; Kafka's ``GroupConfig.evaluate`` caps it the
    same way), else the node's. A value that does not parse (the controller refuses those)
    falls back to the node's rather than failing the heartbeat."""
    default = bounds.default_of(name)
    raw = configs.get(name)
    if raw is None:
        return default
    try:
        value = parse_config_value(GROUP_CONFIGS[name], raw)
    except InvalidConfigError:
        return default
    assert isinstance(value, int)
    low, high = bounds.range_of(name)
    return min(max(value, low), high)
