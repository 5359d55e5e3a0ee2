"""Per-log configuration with Kafka's topic-level names and defaults (``LogConfig`` in Kafka)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

DAY_MS = 24 * 60 * 60 * 1000


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
    max_message_bytes: int = 1024 * 1024 + 12
    # None = never flush on count/time: rely on replication, fsync on roll and on close
    # (Kafka's default: flush.messages and flush.ms are Long.MAX_VALUE).
    flush_messages: int | None = None
    flush_ms: int | None = None

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    def with_topic_configs(self, configs: Mapping[str, str]) -> LogConfig:
        """Override with Kafka topic config names (``segment.bytes`` ...); unknown names fail."""
        changes: dict[str, object] = {}
        known = {f.name for f in fields(self)}
        for name, raw in configs.items():
            attr = name.replace(".", "_")
            if attr not in known:
                raise InvalidConfigError(f"unknown topic config {name!r}")
            if attr == "cleanup_policy":
                policy = frozenset(p.strip() for p in raw.split(",") if p.strip())
                if not policy or not policy <= {"delete", "compact"}:
                    raise InvalidConfigError(
                        f"cleanup.policy must be delete and/or compact: {raw!r}"
                    )
                changes[attr] = policy
                continue
            try:
                value = int(raw)
            except ValueError as e:
                raise InvalidConfigError(f"{name} must be an integer, got {raw!r}") from e
            minimum = -1 if attr in ("retention_bytes", "retention_ms") else 0
            if attr in ("segment_bytes", "segment_index_bytes"):
                minimum = 14  # Kafka's LegacyRecord.RECORD_OVERHEAD_V0 lower bound
            if value < minimum:
                raise InvalidConfigError(f"{name} must be >= {minimum}, got {value}")
            changes[attr] = value
        return replace(self, **changes)  # type: ignore[arg-type]
