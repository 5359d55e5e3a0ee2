"""Dynamic group configs (KIP-848): per-group overrides of the consumer group session timeout
and heartbeat interval, Kafka's ``GroupConfig``. Pure.

An operator sets them with IncrementalAlterConfigs (or AlterConfigs) on a GROUP resource
(``kafka-configs.sh --entity-type groups``); the group need not exist. The controller checks the
group's resulting set with ``group_config_error`` and commits ``Config`` records; the
coordinator reads the group's current set from the node's metadata image at every heartbeat,
so a change reaches the members with their next heartbeat's answer (the interval) and the
session timer that answer restarts (the timeout), as Kafka's ``GroupConfigManager`` does.

Kafka also has share-group configs (``share.*``) and, from 4.1, streams-group ones
(``streams.*``). kcoord has neither kind of group, so those names are unknown here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

CONSUMER_SESSION_TIMEOUT_MS: Final = "consumer.session.timeout.ms"
CONSUMER_HEARTBEAT_INTERVAL_MS: Final = "consumer.heartbeat.interval.ms"

# The broker config that sets each one's default (GroupCoordinatorConfig.GROUP_PREFIX + name).
BROKER_SYNONYMS: Final[Mapping[str, str]] = {
    CONSUMER_SESSION_TIMEOUT_MS: "group.consumer.session.timeout.ms",
    CONSUMER_HEARTBEAT_INTERVAL_MS: "group.consumer.heartbeat.interval.ms",
}
# GroupConfig's ConfigDef defaults (GroupCoordinatorConfig's): the validation of a group's set
# fills in these, not the broker's values, as Kafka's ``GroupConfig.validate`` does.
DEFAULTS: Final[Mapping[str, int]] = {
    CONSUMER_SESSION_TIMEOUT_MS: 45_000,
    CONSUMER_HEARTBEAT_INTERVAL_MS: 5_000,
}
DOCS: Final[Mapping[str, str]] = {
    CONSUMER_SESSION_TIMEOUT_MS: "The timeout to detect client failures when using the "
    "consumer group protocol.",
    CONSUMER_HEARTBEAT_INTERVAL_MS: "The heartbeat interval given to the members.",
}

# A group's configs as the metadata image holds them: name -> value.
GroupConfigLookup = Callable[[str], Mapping[str, str]]


def no_group_configs(group_id: str) -> Mapping[str, str]:
    return {}


@dataclass(frozen=True, slots=True)
class GroupConfigBounds:
    """The broker configs a group's values must lie within (GroupCoordinatorConfig)."""

    min_session_timeout_ms: int = 45_000  # group.consumer.min.session.timeout.ms
    max_session_timeout_ms: int = 60_000  # group.consumer.max.session.timeout.ms
    min_heartbeat_interval_ms: int = 5_000  # group.consumer.min.heartbeat.interval.ms
    max_heartbeat_interval_ms: int = 15_000  # group.consumer.max.heartbeat.interval.ms


def group_config_error(configs: Mapping[str, str | None], bounds: GroupConfigBounds) -> str | None:
    """Why Kafka would refuse this set of a group's configs (INVALID_CONFIG), or None.

    The checks and messages of ``GroupConfig.validate``: the names, then each value's type and
    lower bound (``ConfigDef.parse``), then the broker's bounds, then the session timeout
    against the heartbeat interval. A name set to null is refused, as the controller's
    ``ControllerConfigurationValidator`` does."""
    nulls = sorted(name for name, value in configs.items() if value is None)
    if nulls:
        return f"Null value not supported for group configs: {','.join(nulls)}"
    for name in configs:
        if name not in DEFAULTS:
            return f"Unknown group config name: {name}"
    values = dict(DEFAULTS)
    for name, raw in configs.items():
        assert raw is not None
        try:
            value = int(raw.strip())
        except ValueError:
            return f"Invalid value {raw} for configuration {name}: Not a number of type INT"
        if not -(1 << 31) <= value < 1 << 31:
            return f"Invalid value {raw} for configuration {name}: Not a number of type INT"
        if value < 1:
            return f"Invalid value {value} for configuration {name}: Value must be at least 1"
        values[name] = value
    heartbeat = values[CONSUMER_HEARTBEAT_INTERVAL_MS]
    session = values[CONSUMER_SESSION_TIMEOUT_MS]
    checks = (
        (
            heartbeat < bounds.min_heartbeat_interval_ms,
            f"{CONSUMER_HEARTBEAT_INTERVAL_MS} must be greater than or equal to "
            "group.consumer.min.heartbeat.interval.ms",
        ),
        (
            heartbeat > bounds.max_heartbeat_interval_ms,
            f"{CONSUMER_HEARTBEAT_INTERVAL_MS} must be less than or equal to "
            "group.consumer.max.heartbeat.interval.ms",
        ),
        (
            session < bounds.min_session_timeout_ms,
            f"{CONSUMER_SESSION_TIMEOUT_MS} must be greater than or equal to "
            "group.consumer.min.session.timeout.ms",
        ),
        (
            session > bounds.max_session_timeout_ms,
            f"{CONSUMER_SESSION_TIMEOUT_MS} must be less than or equal to "
            "group.consumer.max.session.timeout.ms",
        ),
        (
            session <= heartbeat,
            f"{CONSUMER_SESSION_TIMEOUT_MS} must be greater than {CONSUMER_HEARTBEAT_INTERVAL_MS}",
        ),
    )
    return next((message for failed, message in checks if failed), None)


def group_config_int(configs: Mapping[str, str], name: str, default: int) -> int:
    """A group's value of ``name``, else ``default`` (the broker's). The controller validated
    the value; one that does not parse anyway (a record written by another version) falls back
    to the default rather than failing the heartbeat."""
    raw = configs.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        return default
    return value if value >= 1 else default
