"""The node's configuration: Kafka-style keys from a TOML file, overridden by the environment.

``kcoord node --config node.toml`` reads one TOML file. Keys are Kafka's dotted names, written
either as quoted flat keys or as nested tables; both mean the same and are flattened::

    "node.id" = 1                               # flat, quoted
    controller.quorum.voters = "1@10.0.0.1:9094,2@10.0.0.2:9094,3@10.0.0.3:9094"
    [log]                                       # nested: log.dirs
    dirs = "/var/lib/kcoord"

Every key is also settable with an environment variable ``KCOORD_<KEY>``: upper-case, dots and
dashes as underscores (``KCOORD_NODE_ID``, ``KCOORD_CONTROLLER_QUORUM_VOTERS``). The environment
overrides the file. Environment values are strings and are parsed; file values must already have
the key's TOML type (``"node.id" = "1"`` is refused, like any type error, naming key and value).

Anything wrong raises ``ConfigError(key, message)`` whose ``str`` is ``"<key>: <message>"``:
unknown keys (in the file, or ``KCOORD_*`` variables that name no key), type errors, values out
of range, bad ``HOST:PORT`` endpoints, and the cross-key rules checked by ``NodeConfig`` itself
(voters, listener clashes, heartbeat below session timeout...). ``NodeConfig`` is frozen and
validates in ``__post_init__``, so ``dataclasses.replace`` cannot build an invalid one either.

Addresses come in pairs (DESIGN.md section 1): the bind form (``listeners``, ``rpc.listener``,
``quorum.listener``, ``admin.listener``) and the advertised form (``advertised.*``, defaulting
to the bind form), so the same node runs on loopback, in a lab namespace or behind a proxy.
The quorum address is the exception: this node's entry in ``controller.quorum.voters`` *is* its
advertised quorum address (the other voters dial it), so both quorum keys default to it.

The key table (``_SPECS``) is the single source of names, types, defaults and ranges;
``render_toml`` writes files this module reads (the cluster launcher uses it).
"""

from __future__ import annotations

import enum
import ipaddress
import re
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kcoord.cluster.coordinator.assignors import (
    ASSIGNOR_CLASS_NAMES,
    ASSIGNORS,
    DEFAULT_ASSIGNORS,
)
from kcoord.cluster.coordinator.consumer_classic import MIGRATION_POLICIES
from kcoord.node.kafka.producer_ids import NODE_BITS
from kcoord.storage.config import COMPRESSION_TYPES, TIMESTAMP_TYPES, TOPIC_CONFIGS

ENV_PREFIX: Final = "KCOORD_"

_INT32_MAX: Final = 2**31 - 1
_PRODUCER_ID_NODES: Final = 1 << NODE_BITS
_INT64_MAX: Final = 2**63 - 1
_INT16_MAX: Final = 2**15 - 1
_WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::"})
_KAFKA_LISTENER_SCHEME: Final = "PLAINTEXT://"


class ConfigError(ValueError):
    """An invalid node configuration; ``str`` is ``"<key>: <message>"`` for the CLI to print."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(key, message)
        self.key = key
        self.message = message

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A ``HOST:PORT`` address; IPv6 hosts are stored bare and printed in brackets."""

    host: str
    port: int

    def __post_init__(self) -> None:
        if not self.host or any(c in self.host for c in " \t\r\n@,/[]"):
            raise ValueError(f"invalid host {self.host!r}")
        if isinstance(self.port, bool) or not 1 <= self.port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {self.port!r}")

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """Parse ``host:port`` or ``[ipv6]:port``; raises ``ValueError`` saying what is wrong."""
        if text.startswith("["):
            host, closed, rest = text[1:].partition("]")
            if not closed or not rest.startswith(":"):
                raise ValueError(f"expected [IPV6]:PORT, got {text!r}")
            port_text = rest[1:]
        else:
            host, colon, port_text = text.rpartition(":")
            if not colon:
                raise ValueError(f"expected HOST:PORT, got {text!r}")
            if ":" in host:
                raise ValueError(f"an IPv6 host goes in brackets ([::1]:9092), got {text!r}")
        if not host:
            raise ValueError(f"missing host in {text!r}")
        if not (port_text.isascii() and port_text.isdigit()):
            raise ValueError(f"port must be a number in 1..65535, got {text!r}")
        try:
            return cls(host, int(port_text))
        except ValueError as e:
            raise ValueError(f"{e} in {text!r}") from None

    @property
    def is_wildcard(self) -> bool:
        """Bound to every interface; such an address can be bound but never dialled."""
        return self.host in _WILDCARD_HOSTS


def registered_endpoint(endpoints: Mapping[str, str] | None, name: str) -> Endpoint | None:
    """The endpoint a broker registered under ``name`` (``"rpc"``, ``"kafka"``, ...), None if
    it registered none or one that does not parse. Every dialler reads it here: split at its
    last colon, ``[::1]:9093`` was dialled as host ``[::1]``, which never resolves."""
    text = endpoints.get(name) if endpoints is not None else None
    if not text:
        return None
    try:
        return Endpoint.parse(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Listener:
    """Where a server binds, and the address it tells others to dial."""

    bind: Endpoint
    advertised: Endpoint


@dataclass(frozen=True, slots=True)
class Voter:
    """One entry of ``controller.quorum.voters``: ``node_id@host:port`` (the quorum port)."""

    node_id: int
    host: str
    port: int

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.host, self.port)

    def __str__(self) -> str:
        return f"{self.node_id}@{self.endpoint}"


def parse_voters(text: str) -> tuple[Voter, ...]:
    """Parse Kafka's ``1@host:port,2@host:port`` syntax; raises ``ValueError``.

    Only the syntax is checked here; count, duplicates and membership are ``NodeConfig``'s.
    """
    voters: list[Voter] = []
    for raw in text.split(","):
        entry = raw.strip()
        node_id_text, at, address = entry.partition("@")
        if not at:
            raise ValueError(f"expected ID@HOST:PORT, got {entry!r}")
        if not (node_id_text.isascii() and node_id_text.isdigit()):
            raise ValueError(f"voter id must be a non-negative integer, got {entry!r}")
        endpoint = Endpoint.parse(address)
        voters.append(Voter(int(node_id_text), endpoint.host, endpoint.port))
    return tuple(voters)


def format_voters(voters: Sequence[Voter]) -> str:
    """The inverse of ``parse_voters``."""
    return ",".join(str(v) for v in voters)


class _Kind(enum.Enum):
    INT = "an integer"
    BOOL = "a boolean"
    STR = "a string"
    # Kafka's ConfigDef.Type.LIST: comma-separated in a string (as in Kafka's properties and
    # the environment), or in the file a TOML array of strings.
    LIST = "a comma-separated string or an array of strings"


@dataclass(frozen=True, slots=True)
class _Spec:
    key: str
    kind: _Kind
    # None: no default (required, optional or derived; see _build).
    default: int | bool | str | None = None
    minimum: int = 0
    maximum: int = _INT64_MAX


# Kafka's names and, unless the comment says otherwise, Kafka's defaults (KafkaConfig,
# GroupCoordinatorConfig, ReplicationConfigs, ServerLogConfigs; see KAFKA-FACTS.md section 1.6).
_SPECS: Final[tuple[_Spec, ...]] = (
    _Spec("node.id", _Kind.INT, None, 0, _INT32_MAX),
    _Spec("cluster.id", _Kind.STR),
    # Endpoints; defaults apply to the bind form, advertised forms default to the bind form.
    _Spec("listeners", _Kind.STR, "127.0.0.1:9092"),
    _Spec("advertised.listeners", _Kind.STR),
    _Spec("rpc.listener", _Kind.STR, "127.0.0.1:9093"),
    _Spec("advertised.rpc.listener", _Kind.STR),
    _Spec("quorum.listener", _Kind.STR),  # default: this node's entry in the voters
    _Spec("advertised.quorum.listener", _Kind.STR),
    _Spec("admin.listener", _Kind.STR, "127.0.0.1:8080"),
    _Spec("advertised.admin.listener", _Kind.STR),
    # Ours: a bearer token the admin HTTP API (/api/v1, /metrics) requires when set; unset,
    # the API is open (it binds to loopback by default).
    _Spec("admin.api.token", _Kind.STR),
    # Ours: the Prometheus metrics; false turns off what costs anything on the request path
    # (per-request counters and latency histograms) and /metrics answers 404.
    _Spec("metrics.enable", _Kind.BOOL, True),
    _Spec("controller.quorum.voters", _Kind.LIST),
    # One data directory, under either name (Kafka's log.dirs takes a list; we take one).
    _Spec("data.dir", _Kind.STR),
    _Spec("log.dirs", _Kind.STR),
    # Fencing: ours are faster than KRaft's 2000 / 9000 on purpose (DESIGN.md section 8).
    _Spec("broker.heartbeat.interval.ms", _Kind.INT, 500, 1),
    _Spec("broker.session.timeout.ms", _Kind.INT, 3000, 1),
    # The __consumer_offsets topic and the group coordinator.
    _Spec("offsets.topic.num.partitions", _Kind.INT, 50, 1, _INT32_MAX),
    _Spec("offsets.topic.replication.factor", _Kind.INT, 3, 1, _INT16_MAX),
    # 14: the least internal.segment.bytes takes; below segment.bytes' 1 MiB the controller
    # writes it as that (storage/config.py), so the topic can be made.
    _Spec("offsets.topic.segment.bytes", _Kind.INT, 100 * 1024 * 1024, 14, _INT32_MAX),
    _Spec("offsets.load.buffer.size", _Kind.INT, 5 * 1024 * 1024, 1, _INT32_MAX),
    _Spec("offsets.commit.timeout.ms", _Kind.INT, 5000, 1, _INT32_MAX),
    _Spec("offsets.retention.minutes", _Kind.INT, 7 * 24 * 60, 1, _INT32_MAX),
    _Spec("offsets.retention.check.interval.ms", _Kind.INT, 600_000, 1),
    _Spec("offset.metadata.max.bytes", _Kind.INT, 4096, 0, _INT32_MAX),
    _Spec("group.initial.rebalance.delay.ms", _Kind.INT, 3000, 0, _INT32_MAX),
    _Spec("group.min.session.timeout.ms", _Kind.INT, 6000, 0, _INT32_MAX),
    _Spec("group.max.session.timeout.ms", _Kind.INT, 1_800_000, 0, _INT32_MAX),
    _Spec("group.max.size", _Kind.INT, _INT32_MAX, 1, _INT32_MAX),
    # -1 (adaptive: the batch goes out when the event loop's current pass ends) is Kafka's
    # default since KAFKA-19826; it was 10 ms (KAFKA-16770), then 5 ms in Kafka 4.0.
    _Spec("group.coordinator.append.linger.ms", _Kind.INT, -1, -1, _INT32_MAX),
    # KIP-848 consumer groups (GroupCoordinatorConfig's group.consumer.*).
    _Spec("group.consumer.session.timeout.ms", _Kind.INT, 45_000, 1, _INT32_MAX),
    _Spec("group.consumer.heartbeat.interval.ms", _Kind.INT, 5_000, 1, _INT32_MAX),
    # The bounds of the two above and of each group's own values (KIP-848 group configs).
    _Spec("group.consumer.min.session.timeout.ms", _Kind.INT, 45_000, 1, _INT32_MAX),
    _Spec("group.consumer.max.session.timeout.ms", _Kind.INT, 60_000, 1, _INT32_MAX),
    _Spec("group.consumer.min.heartbeat.interval.ms", _Kind.INT, 5_000, 1, _INT32_MAX),
    _Spec("group.consumer.max.heartbeat.interval.ms", _Kind.INT, 15_000, 1, _INT32_MAX),
    _Spec("group.consumer.max.size", _Kind.INT, _INT32_MAX, 1, _INT32_MAX),
    _Spec("group.consumer.migration.policy", _Kind.STR, "bidirectional"),
    # Lists, comma-separated. The server assignors, by name or Kafka's class name, the first
    # the default; the rebalance protocols (classic cannot be left out).
    _Spec("group.consumer.assignors", _Kind.LIST, ",".join(DEFAULT_ASSIGNORS)),
    _Spec("group.coordinator.rebalance.protocols", _Kind.LIST, "classic,consumer"),
    # Ours (DESIGN.md section 8): followers of offsets partitions keep standby shards.
    _Spec("group.coordinator.hot.standby.enable", _Kind.BOOL, True),
    # For the chaos suite's own test only: a deliberately broken coordinator that answers
    # writes before the high watermark covers them, so the checkers can be seen to catch it.
    _Spec("test.bug.ack.before.high.watermark", _Kind.BOOL, False),
    # Likewise: a broker that appends every accepted batch twice (one producer session's
    # duplicates), so the chaos suite can be seen to tell the broker's from a client's resends.
    _Spec("test.bug.append.twice", _Kind.BOOL, False),
    # Data topics and replication.
    _Spec("default.replication.factor", _Kind.INT, 1, 1, _INT16_MAX),
    _Spec("num.partitions", _Kind.INT, 1, 1, _INT32_MAX),
    # The topic config's default (storage/config.py): DESIGN §5's 2, not Kafka's 1, so that an
    # RF=3 partition acknowledges acks=all writes only on two replicas; a partition of fewer
    # replicas takes its replication factor (Partition.effectiveMinIsr).
    _Spec(
        "min.insync.replicas",
        _Kind.INT,
        int(TOPIC_CONFIGS["min.insync.replicas"].default),
        1,
        _INT32_MAX,
    ),
    _Spec("auto.create.topics.enable", _Kind.BOOL, True),
    # Idempotent producers (TransactionLogConfig): how long a producer id is remembered after
    # its last write, and how often the forgotten ones are looked for.
    _Spec("producer.id.expiration.ms", _Kind.INT, 24 * 60 * 60 * 1000, 1, _INT32_MAX),
    _Spec("producer.id.expiration.check.interval.ms", _Kind.INT, 600_000, 1, _INT32_MAX),
    # The Kafka listener (SocketServer): the largest request frame, and how long an idle
    # connection stays open.
    _Spec("socket.request.max.bytes", _Kind.INT, 100 * 1024 * 1024, 1, _INT32_MAX),
    # -1: no idle expiry (Kafka's Selector takes any negative value so; here -1 alone).
    _Spec("connections.max.idle.ms", _Kind.INT, 600_000, -1),
    # Client connections at once (Kafka's max.connections); the node also keeps half of its
    # open-files limit for the data directory whatever this says (node/server.py).
    _Spec("max.connections", _Kind.INT, _INT32_MAX, 0, _INT32_MAX),
    # ConnectionQuotas: client connections at once from one address, and per address
    # ("host:count,host:count"; a host name is resolved when the config is read).
    _Spec("max.connections.per.ip", _Kind.INT, _INT32_MAX, 0, _INT32_MAX),
    _Spec("max.connections.per.ip.overrides", _Kind.STR, ""),
    # Kafka's default is 30000; ours is 4000 to match our faster failure detection. It stays
    # above broker.session.timeout.ms (3000), so a dead node is taken out of every ISR by its
    # fencing first (which also moves its leaderships) and the lag rule only catches live but
    # slow followers; and it is 8 replica.fetch.wait.max.ms long-polls, so an idle follower
    # is never counted as lagging.
    _Spec("replica.lag.time.max.ms", _Kind.INT, 4000, 1),
    _Spec("replica.fetch.wait.max.ms", _Kind.INT, 500, 0, _INT32_MAX),
    _Spec("replica.fetch.max.bytes", _Kind.INT, 1024 * 1024, 0, _INT32_MAX),
    _Spec("message.max.bytes", _Kind.INT, 1024 * 1024 + 12, 0, _INT32_MAX),
    # Broker-wide log defaults (topic configs override them; storage/config.py LogConfig).
    # 1 MiB: Kafka's lower bound (KIP-1030, KAFKA-16368), for a topic's own segment.bytes too
    # since 4.1 (storage/config.py; its internal.segment.bytes goes lower, for tests).
    _Spec("log.segment.bytes", _Kind.INT, 1024 * 1024 * 1024, 1024 * 1024, _INT32_MAX),
    _Spec("log.retention.ms", _Kind.INT, 7 * 24 * 60 * 60 * 1000, -1),
    _Spec("log.retention.bytes", _Kind.INT, -1, -_INT64_MAX - 1),  # negative: no limit
    _Spec("compression.type", _Kind.STR, "producer"),
    _Spec("log.message.timestamp.type", _Kind.STR, "CreateTime"),
    _Spec("log.message.timestamp.before.max.ms", _Kind.INT, _INT64_MAX, 0),
    # Kafka 4.0's default (KIP-1030): a record more than an hour ahead is refused.
    _Spec("log.message.timestamp.after.max.ms", _Kind.INT, 60 * 60 * 1000, 0),
    # The background log tasks (node/log_maintenance.py), with Kafka's defaults.
    _Spec("log.retention.check.interval.ms", _Kind.INT, 300_000, 1),
    _Spec("log.cleaner.enable", _Kind.BOOL, True),
    _Spec("log.cleaner.backoff.ms", _Kind.INT, 15_000, 0),
    # The cleaner's key map (storage/log.py offset_map_capacity): keys per pass.
    # KafkaConfig.validateValues: more than 1 MiB per cleaner thread (one here).
    _Spec("log.cleaner.dedupe.buffer.size", _Kind.INT, 128 * 1024 * 1024, 1024 * 1024 + 1),
    _Spec("log.flush.offset.checkpoint.interval.ms", _Kind.INT, 60_000, 1),
    _Spec("log.initial.task.delay.ms", _Kind.INT, 30_000, 0),
    # pysyncobj's knobs (SyncConf: leaderFallbackTimeout, connectionRetryTime,
    # raftMinTimeout, raftMaxTimeout), in milliseconds here.
    _Spec("quorum.leader.fallback.timeout.ms", _Kind.INT, 1500, 1),
    _Spec("quorum.connection.retry.ms", _Kind.INT, 1000, 1),
    _Spec("quorum.raft.min.timeout.ms", _Kind.INT, 400, 1),
    _Spec("quorum.raft.max.timeout.ms", _Kind.INT, 1400, 1),
    # When the metadata log is snapshotted and its older entries dropped (pysyncobj's
    # logCompactionMinTime / logCompactionMinEntries; either one triggers). Kafka's
    # metadata.log.max.snapshot.interval.ms defaults to an hour; pysyncobj's five minutes
    # stay the default here. pysyncobj counts entries where Kafka counts bytes
    # (metadata.log.max.record.bytes.between.snapshots), hence a kcoord name for that one.
    _Spec("metadata.log.max.snapshot.interval.ms", _Kind.INT, 300_000, 1),
    _Spec("metadata.log.max.records.between.snapshots", _Kind.INT, 5000, 1),
    # KIP-835: the active controller appends a NoOp record this often, so every node's
    # metadata image keeps moving and one that stopped following the log shows it in
    # kcoord_metadata_last_applied_age_seconds; 0 writes none (Kafka's default and bound).
    _Spec("metadata.max.idle.interval.ms", _Kind.INT, 500, 0),
)
_SPEC_BY_KEY: Final[Mapping[str, _Spec]] = {s.key: s for s in _SPECS}


def env_var_name(key: str) -> str:
    """``node.id`` -> ``KCOORD_NODE_ID``."""
    return ENV_PREFIX + key.upper().replace(".", "_").replace("-", "_")


_KEY_BY_ENV: Final[Mapping[str, str]] = {env_var_name(s.key): s.key for s in _SPECS}


def config_key_of(env_var: str) -> str | None:
    """``KCOORD_NODE_ID`` -> ``node.id``; None for a variable that names no config key."""
    return _KEY_BY_ENV.get(env_var)


# Keys that map one-to-one onto a NodeConfig field named like the key with dots as underscores.
# The others (node id, cluster id, addresses, voters, data dir) are assembled by _build.
_PLAIN_KEYS: Final = frozenset(
    s.key for s in _SPECS if s.default is not None and s.kind not in (_Kind.STR, _Kind.LIST)
)
_LISTENER_KEYS: Final = (
    ("kafka_listener", "listeners"),
    ("rpc_listener", "rpc.listener"),
    ("quorum_listener", "quorum.listener"),
    ("admin_listener", "admin.listener"),
)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """A validated node configuration. Build it with ``load_config`` or ``parse_config``."""

    node_id: int
    cluster_id: str | None
    kafka_listener: Listener
    rpc_listener: Listener
    quorum_listener: Listener
    admin_listener: Listener
    admin_api_token: str | None
    metrics_enable: bool
    voters: tuple[Voter, ...]
    data_dir: Path
    broker_heartbeat_interval_ms: int
    broker_session_timeout_ms: int
    offsets_topic_num_partitions: int
    offsets_topic_replication_factor: int
    offsets_topic_segment_bytes: int
    offsets_load_buffer_size: int
    offsets_commit_timeout_ms: int
    offsets_retention_minutes: int
    offsets_retention_check_interval_ms: int
    offset_metadata_max_bytes: int
    group_initial_rebalance_delay_ms: int
    group_min_session_timeout_ms: int
    group_max_session_timeout_ms: int
    group_max_size: int
    group_coordinator_append_linger_ms: int
    group_coordinator_hot_standby_enable: bool
    group_consumer_session_timeout_ms: int
    group_consumer_heartbeat_interval_ms: int
    group_consumer_min_session_timeout_ms: int
    group_consumer_max_session_timeout_ms: int
    group_consumer_min_heartbeat_interval_ms: int
    group_consumer_max_heartbeat_interval_ms: int
    group_consumer_max_size: int
    group_consumer_migration_policy: str
    group_consumer_assignors: tuple[str, ...]
    group_coordinator_rebalance_protocols: tuple[str, ...]
    test_bug_ack_before_high_watermark: bool
    test_bug_append_twice: bool
    default_replication_factor: int
    num_partitions: int
    min_insync_replicas: int
    auto_create_topics_enable: bool
    socket_request_max_bytes: int
    connections_max_idle_ms: int
    max_connections: int
    max_connections_per_ip: int
    max_connections_per_ip_overrides: str
    producer_id_expiration_ms: int
    producer_id_expiration_check_interval_ms: int
    replica_lag_time_max_ms: int
    replica_fetch_wait_max_ms: int
    replica_fetch_max_bytes: int
    message_max_bytes: int
    log_segment_bytes: int
    log_retention_ms: int
    log_retention_bytes: int
    compression_type: str
    log_message_timestamp_type: str
    log_message_timestamp_before_max_ms: int
    log_message_timestamp_after_max_ms: int
    log_retention_check_interval_ms: int
    log_cleaner_enable: bool
    log_cleaner_backoff_ms: int
    log_cleaner_dedupe_buffer_size: int
    log_flush_offset_checkpoint_interval_ms: int
    log_initial_task_delay_ms: int
    quorum_leader_fallback_timeout_ms: int
    quorum_connection_retry_ms: int
    quorum_raft_min_timeout_ms: int
    quorum_raft_max_timeout_ms: int
    metadata_log_max_snapshot_interval_ms: int
    metadata_log_max_records_between_snapshots: int
    metadata_max_idle_interval_ms: int

    def __post_init__(self) -> None:
        self._raise_if_out_of_range()
        self._raise_if_bad_voters()
        self._raise_if_bad_listeners()
        if self.broker_heartbeat_interval_ms >= self.broker_session_timeout_ms:
            # Otherwise a single late heartbeat fences the node.
            raise ConfigError(
                "broker.heartbeat.interval.ms",
                f"must be less than broker.session.timeout.ms "
                f"({self.broker_session_timeout_ms}), got {self.broker_heartbeat_interval_ms}",
            )
        if self.replica_fetch_wait_max_ms > self.replica_lag_time_max_ms:
            # KafkaConfig.validateValues: a follower parked longer than the lag time would
            # fall out of the ISR while it waits for data.
            raise ConfigError(
                "replica.fetch.wait.max.ms",
                f"must not exceed replica.lag.time.max.ms ({self.replica_lag_time_max_ms}), "
                f"got {self.replica_fetch_wait_max_ms}",
            )
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ConfigError(
                "group.min.session.timeout.ms",
                f"must not exceed group.max.session.timeout.ms "
                f"({self.group_max_session_timeout_ms}), got {self.group_min_session_timeout_ms}",
            )
        self._raise_if_bad_consumer_group_timing()
        if self.quorum_raft_min_timeout_ms >= self.quorum_raft_max_timeout_ms:
            # pysyncobj draws each election timeout uniformly from [min, max); an empty range
            # gives every voter the same timeout and split votes forever.
            raise ConfigError(
                "quorum.raft.min.timeout.ms",
                f"must be less than quorum.raft.max.timeout.ms "
                f"({self.quorum_raft_max_timeout_ms}), got {self.quorum_raft_min_timeout_ms}",
            )
        if self.log_retention_ms == 0:
            # KafkaConfig.validateValues; a topic's own retention.ms may be 0, not the node's
            # default, which every topic without one of its own takes (all rolled segments go).
            raise ConfigError(
                "log.retention.ms", "must be unlimited (-1) or, greater than or equal to 1; got 0"
            )
        if self.cluster_id is not None and not self.cluster_id.strip():
            raise ConfigError("cluster.id", "must not be empty")
        if self.connections_max_idle_ms == 0:
            raise ConfigError(
                "connections.max.idle.ms",
                "must be positive, or -1 for no idle timeout; got 0",
            )
        overrides = per_ip_overrides(self.max_connections_per_ip_overrides)
        if self.max_connections_per_ip == 0 and not overrides:
            # KafkaConfig.validateValues: nobody could connect.
            raise ConfigError(
                "max.connections.per.ip",
                "may be 0 only with max.connections.per.ip.overrides set",
            )
        if self.admin_api_token is not None and (
            not self.admin_api_token.strip()
            or any(c.isspace() or not c.isprintable() for c in self.admin_api_token)
        ):
            # It travels in an HTTP header: "Authorization: Bearer <token>".
            raise ConfigError("admin.api.token", "must be printable, without spaces")

    def _raise_if_bad_consumer_group_timing(self) -> None:
        """Kafka's ``KafkaConfig.validateNewGroupCoordinatorConfigs``, in its order."""
        heartbeat = "group.consumer.heartbeat.interval.ms"
        session = "group.consumer.session.timeout.ms"
        min_heartbeat = "group.consumer.min.heartbeat.interval.ms"
        max_heartbeat = "group.consumer.max.heartbeat.interval.ms"
        min_session = "group.consumer.min.session.timeout.ms"
        max_session = "group.consumer.max.session.timeout.ms"
        at_least, at_most, below = "greater than or equal to", "less than or equal to", "less than"
        checks = (
            (max_heartbeat, at_least, min_heartbeat),
            (heartbeat, at_least, min_heartbeat),
            (heartbeat, at_most, max_heartbeat),
            (max_session, at_least, min_session),
            (session, at_least, min_session),
            (session, at_most, max_session),
            (heartbeat, below, session),
        )
        for key, relation, other in checks:
            value, bound = (getattr(self, k.replace(".", "_")) for k in (key, other))
            holds = {at_least: value >= bound, at_most: value <= bound, below: value < bound}
            if not holds[relation]:
                raise ConfigError(key, f"must be {relation} {other} ({bound}), got {value}")

    def _raise_if_out_of_range(self) -> None:
        for spec in _SPECS:
            if spec.kind is not _Kind.INT:
                continue
            value = getattr(self, spec.key.replace(".", "_"))
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(spec.key, f"expected an integer, got {value!r}")
            if not spec.minimum <= value <= spec.maximum:
                raise ConfigError(
                    spec.key, f"must be in {spec.minimum}..{spec.maximum}, got {value}"
                )

    def _raise_if_bad_voters(self) -> None:
        key = "controller.quorum.voters"
        text = format_voters(self.voters)
        if len(self.voters) not in (1, 3, 5):
            # An even count tolerates no more failures than one voter fewer, and a majority
            # of 7+ slows every metadata commit; Kafka recommends 3 or 5 controllers too.
            raise ConfigError(key, f"need 1, 3 or 5 voters, got {len(self.voters)}: {text!r}")
        seen_ids: set[int] = set()
        seen_endpoints: set[Endpoint] = set()
        for voter in self.voters:
            if voter.node_id in seen_ids:
                raise ConfigError(key, f"duplicate voter id {voter.node_id} in {text!r}")
            twin = next(
                (
                    i
                    for i in seen_ids
                    if i % _PRODUCER_ID_NODES == voter.node_id % _PRODUCER_ID_NODES
                ),
                None,
            )
            if twin is not None:
                # Each node allocates producer ids under its id modulo 2^15 (producer_ids.py):
                # two such nodes would hand out the same ids, and a second producer's first
                # batch would be taken for the first one's retry and dropped.
                raise ConfigError(
                    key,
                    f"voter ids {twin} and {voter.node_id} are equal modulo {_PRODUCER_ID_NODES}"
                    " (the nodes would hand out the same producer ids)",
                )
            if voter.endpoint in seen_endpoints:
                raise ConfigError(key, f"duplicate voter address {voter.endpoint} in {text!r}")
            if voter.endpoint.is_wildcard:
                raise ConfigError(key, f"voter address {voter.endpoint} cannot be dialled")
            seen_ids.add(voter.node_id)
            seen_endpoints.add(voter.endpoint)
        if self.node_id not in seen_ids:
            raise ConfigError(key, f"this node's id {self.node_id} is not among {text!r}")

    def _raise_if_bad_listeners(self) -> None:
        own = self.self_voter.endpoint
        if self.quorum_listener.advertised != own:
            # pysyncobj identifies a node by the address its peers dial; any other advertised
            # quorum address would make this node a stranger to the quorum.
            raise ConfigError(
                "advertised.quorum.listener",
                f"must equal this node's entry in controller.quorum.voters ({own}), "
                f"got {self.quorum_listener.advertised}",
            )
        bound: list[tuple[str, Endpoint]] = []
        for name, bind_key in _LISTENER_KEYS:
            listener: Listener = getattr(self, name)
            if listener.advertised.is_wildcard:
                # Kafka refuses this too ("advertised.listeners cannot use the nonroutable
                # meta-address 0.0.0.0").
                raise ConfigError(
                    "advertised." + bind_key,
                    f"{listener.advertised} cannot be dialled; set advertised.{bind_key} "
                    f"when {bind_key} binds every interface",
                )
            for other_key, other in bound:
                here = listener.bind
                same_host = other.host == here.host or other.is_wildcard or here.is_wildcard
                if same_host and other.port == here.port:
                    raise ConfigError(bind_key, f"{here} clashes with {other_key} ({other})")
            bound.append((bind_key, listener.bind))

    @property
    def self_voter(self) -> Voter:
        return next(v for v in self.voters if v.node_id == self.node_id)

    @property
    def peer_voters(self) -> tuple[Voter, ...]:
        """The other voters, in the order of ``controller.quorum.voters``."""
        return tuple(v for v in self.voters if v.node_id != self.node_id)


def load_config(path: Path | None, environ: Mapping[str, str]) -> NodeConfig:
    """Read ``path`` (if any), apply ``KCOORD_*`` variables from ``environ``, validate.

    Raises ``ConfigError`` naming the offending key; a file that cannot be read or parsed is
    named by its path.
    """
    values: dict[str, object] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                document = tomllib.load(f)
        except OSError as e:
            raise ConfigError(str(path), f"cannot read: {e.strerror or e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(str(path), f"not valid TOML: {e}") from e
        values = flatten_toml(document)
    from_env = _from_environ(environ)
    values.update(from_env)
    return _build(values, env_keys=frozenset(from_env))


def parse_config(values: Mapping[str, object]) -> NodeConfig:
    """Validate flat Kafka-style keys with TOML-typed values (as a parsed file has them)."""
    return _build(dict(values), env_keys=frozenset())


def flatten_toml(document: Mapping[str, Any], prefix: str = "") -> dict[str, object]:
    """``{"node": {"id": 1}}`` and ``{"node.id": 1}`` both become ``{"node.id": 1}``."""
    flat: dict[str, object] = {}
    for name, value in document.items():
        key = prefix + name
        nested = flatten_toml(value, key + ".") if isinstance(value, dict) else {key: value}
        for k, v in nested.items():
            if k in flat:
                raise ConfigError(k, "set twice in the file (as a flat key and in a table)")
            flat[k] = v
    return flat


def render_toml(values: Mapping[str, object]) -> str:
    """Write flat quoted keys, one per line, that ``load_config`` reads back.

    Values may be ``int``, ``bool``, ``str``, ``Path``, ``Endpoint``, a sequence of
    ``Voter`` or, for a list config, a list of strings (a TOML array). Unknown keys raise
    ``ConfigError`` so a launcher's typo fails where it is made.
    """
    lines: list[str] = []
    for key, value in values.items():
        if key not in _SPEC_BY_KEY:
            raise ConfigError(key, "unknown config key")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, str | Path | Endpoint):
            text = _toml_string(str(value))
        elif isinstance(value, Sequence) and all(isinstance(v, Voter) for v in value):
            text = _toml_string(format_voters(value))
        elif (
            _SPEC_BY_KEY[key].kind is _Kind.LIST
            and isinstance(value, list)
            and all(isinstance(v, str) for v in value)
        ):
            text = "[" + ", ".join(_toml_string(v) for v in value) + "]"
        else:
            raise TypeError(f"{key}: cannot render {type(value).__name__} value {value!r}")
        lines.append(f"{_toml_string(key)} = {text}\n")
    return "".join(lines)


def _toml_string(text: str) -> str:
    """A TOML basic string: escape quote, backslash and the control characters TOML forbids."""
    out = ['"']
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\t" or (c >= " " and c != "\x7f"):
            out.append(c)
        else:
            out.append(f"\\u{ord(c):04x}")
    out.append('"')
    return "".join(out)


def _from_environ(environ: Mapping[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = _KEY_BY_ENV.get(name)
        if key is None:
            raise ConfigError(name, "unknown config key (environment variable)")
        values[key] = value
    return values


def _build(values: dict[str, object], *, env_keys: frozenset[str]) -> NodeConfig:
    for key in values:
        if key not in _SPEC_BY_KEY:
            raise ConfigError(key, "unknown config key")

    def get(key: str) -> Any:
        spec = _SPEC_BY_KEY[key]
        if key not in values:
            return spec.default
        return _convert(spec, values[key], from_env=key in env_keys)

    def endpoint(key: str, text: str) -> Endpoint:
        try:
            return Endpoint.parse(_kafka_listener(key, text))
        except ValueError as e:
            raise ConfigError(key, str(e)) from None

    def listener(key: str) -> Listener:
        bind = endpoint(key, get(key))
        advertised_text = get("advertised." + key)
        if advertised_text is None:
            return Listener(bind, bind)
        return Listener(bind, endpoint("advertised." + key, advertised_text))

    node_id = get("node.id")
    if node_id is None:
        raise ConfigError("node.id", f"required; set it in the file or {env_var_name('node.id')}")
    voters_key = "controller.quorum.voters"
    voters_text = get(voters_key)
    if voters_text is None:
        raise ConfigError(voters_key, f"required; set it in the file or {env_var_name(voters_key)}")
    try:
        voters = parse_voters(voters_text)
    except ValueError as e:
        raise ConfigError(voters_key, str(e)) from None

    # The quorum address others dial is our own voter entry, so it is the default of both
    # quorum keys. (If we are not a voter, NodeConfig refuses the voters before it looks at
    # this placeholder.)
    own = next((v.endpoint for v in voters if v.node_id == node_id), voters[0].endpoint)
    advertised_quorum_text = get("advertised.quorum.listener")
    quorum_advertised = (
        own
        if advertised_quorum_text is None
        else endpoint("advertised.quorum.listener", advertised_quorum_text)
    )
    quorum_text = get("quorum.listener")
    quorum_bind = (
        quorum_advertised if quorum_text is None else endpoint("quorum.listener", quorum_text)
    )

    kwargs: dict[str, Any] = {
        spec.key.replace(".", "_"): get(spec.key) for spec in _SPECS if spec.key in _PLAIN_KEYS
    }
    kwargs.update(
        node_id=node_id,
        cluster_id=get("cluster.id"),
        kafka_listener=listener("listeners"),
        rpc_listener=listener("rpc.listener"),
        quorum_listener=Listener(quorum_bind, quorum_advertised),
        admin_listener=listener("admin.listener"),
        admin_api_token=get("admin.api.token"),
        max_connections_per_ip_overrides=get("max.connections.per.ip.overrides"),
        group_consumer_migration_policy=_migration_policy(get("group.consumer.migration.policy")),
        group_consumer_assignors=_assignors(get("group.consumer.assignors")),
        group_coordinator_rebalance_protocols=_rebalance_protocols(
            get("group.coordinator.rebalance.protocols")
        ),
        compression_type=_one_of("compression.type", COMPRESSION_TYPES, get("compression.type")),
        log_message_timestamp_type=_one_of(
            "log.message.timestamp.type", TIMESTAMP_TYPES, get("log.message.timestamp.type")
        ),
        voters=voters,
        data_dir=_data_dir(get("data.dir"), get("log.dirs")),
    )
    return NodeConfig(**kwargs)


def per_ip_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: "host:count" entries, comma separated (Kafka's
    ``parseCsvMap``), by the address each host resolves to (``ConnectionQuotas``)."""
    key = "max.connections.per.ip.overrides"
    overrides: dict[str, int] = {}
    for item in (entry.strip() for entry in text.split(",")):
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        host = host.strip().strip("[]")
        try:
            limit = int(count) if sep and host else -1
        except ValueError:
            limit = -1
        if not 0 <= limit <= _INT32_MAX:
            raise ConfigError(key, f"expected host:count entries, got {item!r}")
        try:
            address = str(ipaddress.ip_address(host))
        except ValueError:
            try:
                address = socket.gethostbyname(host)
            except OSError as e:
                raise ConfigError(key, f"cannot resolve {host!r}: {e}") from None
        overrides[address] = limit
    return overrides


def _migration_policy(text: str) -> str:
    """Kafka's ``ConsumerGroupMigrationPolicy``, case-insensitive."""
    policy = text.strip().lower()
    if policy not in MIGRATION_POLICIES:
        raise ConfigError(
            "group.consumer.migration.policy",
            f"must be one of {', '.join(MIGRATION_POLICIES)}, got {text!r}",
        )
    return policy


def _list(text: str) -> list[str]:
    """A LIST config as Kafka's ConfigDef reads it: comma-separated, each item trimmed."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _assignors(text: str) -> tuple[str, ...]:
    """``group.consumer.assignors``: built-in assignors by name (uniform, range) or Kafka's
    class name (GroupCoordinatorConfig.consumerGroupAssignors), each once; the first is the
    default. kcoord runs no custom assignor classes."""
    key = "group.consumer.assignors"
    names: list[str] = []
    for item in _list(text):
        name = ASSIGNOR_CLASS_NAMES.get(item, item)
        if name not in ASSIGNORS:
            raise ConfigError(
                key,
                f"{item!r} is not a built-in assignor ({', '.join(DEFAULT_ASSIGNORS)}, or "
                f"their class names); kcoord runs no custom assignors",
            )
        if name in names:
            raise ConfigError(key, f"the assignor {name!r} is listed twice")
        names.append(name)
    if not names:
        raise ConfigError(key, "at least one assignor is required")
    return tuple(names)


def _rebalance_protocols(text: str) -> tuple[str, ...]:
    """``group.coordinator.rebalance.protocols`` (GroupCoordinatorConfig): classic, with or
    without consumer (KIP-848), case-insensitive as Kafka's GroupType. kcoord has no share
    or streams groups."""
    key = "group.coordinator.rebalance.protocols"
    protocols = tuple(dict.fromkeys(item.lower() for item in _list(text)))
    for protocol in protocols:
        if protocol not in ("classic", "consumer"):
            raise ConfigError(
                key, f"{protocol!r} is not a rebalance protocol kcoord has (classic, consumer)"
            )
    if "classic" not in protocols:
        raise ConfigError(key, "Disabling the 'classic' protocol is not supported.")
    return protocols


def _one_of(key: str, choices: Sequence[str], text: str) -> str:
    """A string config with a fixed set of values, taken exactly as Kafka's ConfigDef
    ValidString does."""
    if text not in choices:
        raise ConfigError(key, f"must be one of {', '.join(choices)}, got {text!r}")
    return text


def _kafka_listener(key: str, text: str) -> str:
    """Accept Kafka's ``PLAINTEXT://host:port`` for the client listener; one listener only."""
    if key not in ("listeners", "advertised.listeners"):
        return text
    if "," in text:
        raise ConfigError(key, f"kcoord serves one client listener, got {text!r}")
    if "://" in text:
        if not text.upper().startswith(_KAFKA_LISTENER_SCHEME):
            raise ConfigError(key, f"only PLAINTEXT listeners are supported, got {text!r}")
        return text[len(_KAFKA_LISTENER_SCHEME) :]
    return text


def _data_dir(data_dir: str | None, log_dirs: str | None) -> Path:
    if data_dir is not None and log_dirs is not None:
        raise ConfigError("log.dirs", "set together with data.dir; set only one of them")
    if log_dirs is not None:
        dirs = [d.strip() for d in log_dirs.split(",")]
        if len(dirs) != 1:
            raise ConfigError("log.dirs", f"kcoord uses one data directory, got {log_dirs!r}")
        data_dir = dirs[0]
        key = "log.dirs"
    else:
        key = "data.dir"
    if data_dir is None:
        raise ConfigError(
            "data.dir",
            f"required (or log.dirs); set it in the file or {env_var_name('data.dir')}",
        )
    if not data_dir.strip():
        raise ConfigError(key, "must not be empty")
    return Path(data_dir)


def _convert(spec: _Spec, value: object, *, from_env: bool) -> int | bool | str:
    """Check (file) or parse (environment) ``value`` as the key's kind."""
    where = f" (from {env_var_name(spec.key)})" if from_env else ""
    if from_env:
        assert isinstance(value, str), value
        text = value.strip()
        if spec.kind is _Kind.INT:
            # Integer.parseInt's digits: ASCII only (Python's int also takes "1_000" and "٣").
            if re.fullmatch(r"[+-]?[0-9]+", text):
                return int(text, 10)
        elif spec.kind is _Kind.BOOL:
            # Kafka's ConfigDef accepts exactly true/false, case-insensitively.
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
        else:
            return value
    elif spec.kind is _Kind.INT:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif spec.kind is _Kind.BOOL:
        if isinstance(value, bool):
            return value
    elif isinstance(value, str):
        return value
    elif (
        spec.kind is _Kind.LIST
        and isinstance(value, list)
        and all(isinstance(item, str) for item in value)
    ):
        return ",".join(value)
    raise ConfigError(spec.key, f"expected {spec.kind.value}, got {value!r}{where}")


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One node config as DescribeConfigs shows a broker's: its value (None if unset or
    sensitive), whether that is the default, its type and whether it is secret."""

    key: str
    value: str | None
    is_default: bool
    type_name: str  # Kafka's ConfigDef.Type name: INT, LONG, BOOLEAN, STRING, LIST
    sensitive: bool


_SENSITIVE_KEYS: Final = frozenset({"admin.api.token"})
# The chaos suite's deliberately broken modes: not configs a broker shows (DescribeConfigs, the
# admin API), where they alarmed users of the admin tools.
_UNLISTED_KEYS: Final = frozenset({"test.bug.ack.before.high.watermark", "test.bug.append.twice"})


def config_entries(cfg: NodeConfig) -> list[ConfigEntry]:
    """Every key this node understands, with its effective value (Kafka's broker configs)."""
    assembled: dict[str, str | None] = {
        "node.id": str(cfg.node_id),
        "cluster.id": cfg.cluster_id,
        "controller.quorum.voters": format_voters(cfg.voters),
        "data.dir": str(cfg.data_dir),
        "log.dirs": str(cfg.data_dir),
        "admin.api.token": cfg.admin_api_token,
        "group.consumer.assignors": ",".join(cfg.group_consumer_assignors),
        "group.coordinator.rebalance.protocols": ",".join(
            cfg.group_coordinator_rebalance_protocols
        ),
    }
    for attr, key in _LISTENER_KEYS:
        listener: Listener = getattr(cfg, attr)
        assembled[key] = str(listener.bind)
        assembled["advertised." + key] = str(listener.advertised)
    entries: list[ConfigEntry] = []
    for spec in _SPECS:
        if spec.key in _UNLISTED_KEYS:
            continue
        if spec.key in assembled:
            value = assembled[spec.key]
        else:
            raw = getattr(cfg, spec.key.replace(".", "_"))
            value = str(raw).lower() if isinstance(raw, bool) else str(raw)
        default = spec.default
        default_text = (
            None
            if default is None
            else str(default).lower()
            if isinstance(default, bool)
            else str(default)
        )
        sensitive = spec.key in _SENSITIVE_KEYS
        if spec.kind is _Kind.BOOL:
            type_name = "BOOLEAN"
        elif spec.kind is _Kind.INT:
            type_name = "LONG" if spec.maximum > _INT32_MAX else "INT"
        elif spec.kind is _Kind.LIST:
            type_name = "LIST"
        else:
            type_name = "STRING"
        entries.append(
            ConfigEntry(
                spec.key,
                None if sensitive else value,
                value == default_text or (value is None and default is None),
                type_name,
                sensitive,
            )
        )
    return entries
