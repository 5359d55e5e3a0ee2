"""The node process: ``kcoord node --config node.toml``.

Wires the parts together on one asyncio loop (uvloop when installed):

- the data directory's ``LogManager`` (storage), opened before anything serves;
- the metadata quorum (pysyncobj, its own thread) and the ``MetadataCache`` it feeds, which
  publishes nothing (no role change, no delta) until the node's initial catch-up, then the
  image as one delta (see ``node/metadata.py``);
- the ``ControllerService`` (active on the Raft leader only) and the ``BrokerLifecycle``
  (registration and heartbeats with the active controller);
- the inter-node RPC server: ``BrokerRegistration``, ``BrokerHeartbeat``, ``AlterPartition``
  (the controller's), ``DescribeQuorum`` and ``DescribeNode`` (any node's);
- the ``ReplicaManager`` (hosted partitions, fed the metadata log's role changes along with
  ``ReplicaRoles``, and its deltas for ISR changes; it answers ``ReplicaFetch`` and
  ``EpochEndOffset``, proposes ISR changes through the ``BrokerLifecycle``'s controller
  channel, checkpoints HWs) and the ``ReplicaFetcherManager`` (one fetcher per leader node
  this node follows partitions of), the group coordinator runtime (one shard per led
  ``__consumer_offsets`` partition, loaded and unloaded on the ReplicaManager's role changes)
  and the Kafka listener (``kafka.KafkaBroker`` with the group APIs of ``kafka.groups``)
  serving clients from them. The Kafka listener opens last, once the controller says this
  node has replayed the metadata log up to its own registration, as Kafka's broker enables
  request processing only after its initial catch-up; the admin listener (/readyz says what
  the node still waits for) opens before that wait.

SIGTERM, SIGINT or SIGHUP stops the node cleanly (Kafka's ``LoggingSignalHandler`` takes all
three, and the JVM's shutdown hook then stops the broker): first a controlled shutdown hands
its partition leaderships (and so its groups) to the other replicas and, if it is the active
controller, the Raft leadership to another voter (``Node.hand_over``); then the RPC server
closes, the quorum stops, logs are flushed and the data directory is marked cleanly shut down.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import resource
import signal
import uuid
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from kcoord.cluster.coordinator.group_config import GroupConfigBounds, group_config_error
from kcoord.cluster.coordinator.shard import GroupConfig
from kcoord.node.admin import AdminServer, AdminService
from kcoord.node.broker_lifecycle import BrokerLifecycle
from kcoord.node.clock import SYSTEM_CLOCK, Clock
from kcoord.node.config import NodeConfig, config_entries, per_ip_overrides
from kcoord.node.controller_service import ControllerService
from kcoord.node.kafka.broker import KafkaBroker
from kcoord.node.kafka.configs import ConfigsApi
from kcoord.node.kafka.context import KafkaSettings
from kcoord.node.kafka.groups import GroupApi
from kcoord.node.kafka.quorum import DESCRIBE_QUORUM_KEY, QuorumApi
from kcoord.node.kafka.server import RequestStats
from kcoord.node.log_dir_failure import LogDirFailureChannel
from kcoord.node.log_maintenance import LogMaintenance, MaintenanceConfig
from kcoord.node.metadata import MetadataCache, QuorumBridge, ReplicaRoles, RoleListener
from kcoord.node.metrics import NodeMetrics
from kcoord.node.replica_fetcher import ReplicaFetcherManager
from kcoord.node.replica_manager import ReplicaManager
from kcoord.node.rpc import MAX_CONNECTIONS as MAX_RPC_CONNECTIONS
from kcoord.node.rpc import Handler, RpcClientPool, RpcServer, runs_on_when_abandoned
from kcoord.node.runtime import CoordinatorRuntime
from kcoord.raft.controller import OFFSETS_TOPIC_NAME, ControllerConfig
from kcoord.raft.image import ConfigResource, MetadataDelta, RoleChange
from kcoord.raft.quorum import MetadataQuorum, QuorumTiming, Voter
from kcoord.raft.records import ConfigResourceType
from kcoord.storage import meta_properties
from kcoord.storage.config import LogConfig
from kcoord.storage.log import offset_map_capacity
from kcoord.storage.manager import LogManager
from kcoord.storage.meta_properties import DataDirLock

log = logging.getLogger(__name__)

# A clean stop's hand-over steps are bounded so that a node facing a lost quorum still stops well
# within the launcher's SIGTERM grace (15 s). Kafka's KRaft broker waits for its controlled
# shutdown up to 5 minutes; ours has no reason to wait longer than a few heartbeats.
CONTROLLED_SHUTDOWN_TIMEOUT_S = 5.0
RESIGN_TIMEOUT_S = 2.0
# How often a node still waiting to catch up with the metadata log at start says so.
CATCH_UP_LOG_S = 5.0


class QuorumMonitor:
    """Samples the quorum to know, on the leader, when each voter last fetched and caught up.

    pysyncobj does not report fetch times; a voter that is connected and whose match index
    moved (or equals the commit index) has fetched. Kafka's ``DescribeQuorum`` reports the
    same two timestamps per voter.
    """

    def __init__(self, quorum: MetadataQuorum, clock: Clock) -> None:
        self.quorum = quorum
        self.clock = clock
        self.last_fetch_ms: dict[int, int] = {}
        self.last_caught_up_ms: dict[int, int] = {}
        self._last_match: dict[int, int] = {}
        # Changes of the known leader or its epoch (a metric: elections as this node saw
        # them; the leader it finds at start is no change, or every restart would count one).
        self.leader_changes = 0
        self._last_leader: tuple[int, int] | None = None

    async def run(self, interval_s: float = 0.1) -> None:
        while True:
            try:
                self.sample()
            except Exception:
                # pysyncobj's getStatus iterates dicts its thread may grow (at its first
                # election): one failed sample, not the end of sampling.
                log.exception("sampling the quorum's status failed")
            await asyncio.sleep(interval_s)  # the sampling period

    def sample(self) -> None:
        status = self.quorum.status()
        now = self.clock.now_ms()
        if status.leader_id is not None:
            leader = (status.leader_id, status.epoch)
            if self._last_leader is not None and leader != self._last_leader:
                self.leader_changes += 1
            self._last_leader = leader
        if not status.is_leader:
            self._last_match.clear()
            return
        self.last_fetch_ms[status.node_id] = now
        self.last_caught_up_ms[status.node_id] = now
        for node_id, match in status.follower_match_index.items():
            if node_id in status.connected and (
                match != self._last_match.get(node_id) or match >= status.commit_index
            ):
                self.last_fetch_ms[node_id] = now
            if match >= status.commit_index:
                self.last_caught_up_ms[node_id] = now
            self._last_match[node_id] = match


class RoleFanOut:
    """Hands each batch of role changes to several listeners, in order; one that fails is
    logged and does not keep the changes from the others."""

    def __init__(self, *listeners: RoleListener) -> None:
        self.listeners = listeners

    def on_role_changes(self, changes: list[RoleChange]) -> None:
        for listener in self.listeners:
            try:
                listener.on_role_changes(changes)
            except Exception:
                log.exception("role listener %s failed", type(listener).__name__)


def controller_rpc_handlers(controller: ControllerService) -> dict[str, Handler]:
    """The controller's RPC methods, each run to its end when its caller goes
    (``runs_on_when_abandoned``)."""
    handlers: dict[str, Handler] = {
        "BrokerRegistration": controller.handle_broker_registration,
        "BrokerHeartbeat": controller.handle_broker_heartbeat,
        "AlterPartition": controller.handle_alter_partition,
        "CreateTopics": controller.handle_create_topics,
        "CreatePartitions": controller.handle_create_partitions,
        "DeleteTopics": controller.handle_delete_topics,
        "AlterConfigs": controller.handle_alter_configs,
        "ElectLeaders": controller.handle_elect_leaders,
    }
    return {name: runs_on_when_abandoned(handler) for name, handler in handlers.items()}


class Node:
    def __init__(self, config: NodeConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.incarnation_id = str(uuid.uuid4())
        self.logs = LogManager(config.data_dir)
        self.logs.producer_id_expiration_ms = config.producer_id_expiration_ms
        self.roles = ReplicaRoles(config.node_id)
        # Held until the initial catch-up (_wait_for_initial_catch_up; see MetadataCache).
        self.cache = MetadataCache(
            config.node_id, self.roles, hold=True, monotonic_ms=clock.monotonic_ms
        )
        # Its connections close when idle for 9/10 of the peers' idle time (same config),
        # before their servers close them under a call; never when the servers do not.
        idle_ms = config.connections_max_idle_ms
        self.rpc_pool = RpcClientPool(idle_ms=max(1, idle_ms * 9 // 10) if idle_ms > 0 else 2**62)
        # The replica fetchers' own connections, as Kafka's fetcher threads have their own
        # NetworkClient: on the controller calls' ones, a fetch answer of many MiB held up a
        # heartbeat's behind it, and a fetch timing out unsent dropped the connection with the
        # heartbeat and AlterPartition in flight on it.
        self.fetch_pool = RpcClientPool(idle_ms=max(1, idle_ms * 9 // 10) if idle_ms > 0 else 2**62)
        self.quorum: MetadataQuorum | None = None
        self.controller: ControllerService | None = None
        self.lifecycle: BrokerLifecycle | None = None
        self.monitor: QuorumMonitor | None = None
        self.rpc_server: RpcServer | None = None
        self.replicas: ReplicaManager | None = None
        self.log_maintenance: LogMaintenance | None = None
        self.fetchers: ReplicaFetcherManager | None = None
        self.coordinator: CoordinatorRuntime | None = None
        self.kafka: KafkaBroker | None = None
        # The admin HTTP API and /metrics (node/admin.py, node/metrics.py).
        self.metrics = NodeMetrics(self)
        self.admin = AdminService(self)
        self.admin_server: AdminServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._logs_open = False
        self._data_lock: DataDirLock | None = None
        self._bridge: QuorumBridge | None = None
        # The Kafka listener once bound, until it serves (then it is ``kafka``).
        self._kafka_bound: KafkaBroker | None = None

    async def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        # The directory is this process's (.lock) and this node's of this cluster
        # (meta.properties) before anything in it is read or written.
        self._data_lock = DataDirLock.acquire(cfg.data_dir)
        cluster_id = meta_properties.claim(cfg.data_dir, cfg.node_id, cfg.cluster_id)
        self.logs.open()
        self._logs_open = True
        failure = LogDirFailureChannel(cfg.data_dir)
        self.cache.delta_listeners.append(partial(self._on_cluster_id, failure))
        # Hosted partitions follow the metadata image once it is published (at the catch-up).
        self.replicas = ReplicaManager(
            cfg.node_id,
            self.logs,
            self.cache,
            self.clock.now_ms,
            default_log_config=LogConfig(
                segment_bytes=cfg.log_segment_bytes,
                retention_ms=cfg.log_retention_ms,
                retention_bytes=cfg.log_retention_bytes,
                max_message_bytes=cfg.message_max_bytes,
                compression_type=cfg.compression_type,
                message_timestamp_type=cfg.log_message_timestamp_type,
                message_timestamp_before_max_ms=cfg.log_message_timestamp_before_max_ms,
                message_timestamp_after_max_ms=cfg.log_message_timestamp_after_max_ms,
            ),
            replica_lag_time_max_ms=cfg.replica_lag_time_max_ms,
            min_insync_replicas=cfg.min_insync_replicas,
            broker_epoch=self._broker_epoch,
            alter_partition=self._alter_partition,
            monotonic_ms=self.clock.monotonic_ms,
            log_dir_failure=failure,
        )
        self.log_maintenance = LogMaintenance(
            self.logs,
            self.replicas.high_watermarks,
            self.clock.now_ms,
            MaintenanceConfig(
                retention_check_interval_ms=cfg.log_retention_check_interval_ms,
                cleaner_enable=cfg.log_cleaner_enable,
                cleaner_backoff_ms=cfg.log_cleaner_backoff_ms,
                cleaner_map_capacity=offset_map_capacity(cfg.log_cleaner_dedupe_buffer_size),
                recovery_point_checkpoint_interval_ms=cfg.log_flush_offset_checkpoint_interval_ms,
                initial_task_delay_ms=cfg.log_initial_task_delay_ms,
            ),
            failure,
        )
        self.logs.remove = self.log_maintenance.remove_later
        self.logs.flush_rolled = self.log_maintenance.flush_later
        self.fetchers = ReplicaFetcherManager(
            cfg.node_id,
            self.replicas,
            self.cache,
            self.fetch_pool,
            self._broker_epoch,
            max_wait_ms=cfg.replica_fetch_wait_max_ms,
            max_bytes=cfg.replica_fetch_max_bytes,
        )
        # The fetchers last: they start on the partitions the ReplicaManager now follows.
        self.cache.listener = RoleFanOut(self.roles, self.replicas, self.fetchers)
        self.cache.delta_listeners.append(self.replicas.on_metadata_delta)
        # KIP-848 timing: the coordinator's defaults and bounds, the controller's group checks.
        consumer_timing = GroupConfigBounds(
            session_timeout_ms=cfg.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=cfg.group_consumer_heartbeat_interval_ms,
            min_session_timeout_ms=cfg.group_consumer_min_session_timeout_ms,
            max_session_timeout_ms=cfg.group_consumer_max_session_timeout_ms,
            min_heartbeat_interval_ms=cfg.group_consumer_min_heartbeat_interval_ms,
            max_heartbeat_interval_ms=cfg.group_consumer_max_heartbeat_interval_ms,
        )
        # Registered on the ReplicaManager before the quorum replays anything, so every
        # __consumer_offsets leadership reaches it.
        self.coordinator = CoordinatorRuntime(
            self.replicas,
            GroupConfig(
                initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms,
                min_session_timeout_ms=cfg.group_min_session_timeout_ms,
                max_session_timeout_ms=cfg.group_max_session_timeout_ms,
                max_size=cfg.group_max_size,
                offset_metadata_max_bytes=cfg.offset_metadata_max_bytes,
                offsets_retention_minutes=cfg.offsets_retention_minutes,
                offsets_retention_check_interval_ms=cfg.offsets_retention_check_interval_ms,
                consumer_timing=consumer_timing,
                consumer_max_size=cfg.group_consumer_max_size,
                consumer_migration_policy=cfg.group_consumer_migration_policy,
                consumer_assignors=cfg.group_consumer_assignors,
                rebalance_protocols=cfg.group_coordinator_rebalance_protocols,
            ),
            self.clock.now_ms,
            num_partitions=self._offsets_partition_count,
            hot_standby=cfg.group_coordinator_hot_standby_enable,
            load_buffer_size=cfg.offsets_load_buffer_size,
            bug_ack_before_hw=cfg.test_bug_ack_before_high_watermark,
            measure_latency=cfg.metrics_enable,
            append_linger_ms=cfg.group_coordinator_append_linger_ms,
            write_timeout_ms=cfg.offsets_commit_timeout_ms,
            group_configs=self._group_configs,
        )
        self.cache.delta_listeners.append(self.coordinator.on_metadata_delta)
        voters = [Voter(v.node_id, v.host, v.port) for v in cfg.voters]
        timing = QuorumTiming(
            raft_min_timeout_s=cfg.quorum_raft_min_timeout_ms / 1000,
            raft_max_timeout_s=cfg.quorum_raft_max_timeout_ms / 1000,
            leader_fallback_timeout_s=cfg.quorum_leader_fallback_timeout_ms / 1000,
            connection_retry_s=cfg.quorum_connection_retry_ms / 1000,
            log_compaction_min_entries=cfg.metadata_log_max_records_between_snapshots,
            log_compaction_min_time_s=cfg.metadata_log_max_snapshot_interval_ms / 1000,
        )
        controller_config = ControllerConfig(
            broker_session_timeout_ms=cfg.broker_session_timeout_ms,
            num_partitions=cfg.num_partitions,
            default_replication_factor=cfg.default_replication_factor,
            min_insync_replicas=cfg.min_insync_replicas,
            offsets_topic_num_partitions=cfg.offsets_topic_num_partitions,
            offsets_topic_replication_factor=cfg.offsets_topic_replication_factor,
            offsets_topic_segment_bytes=cfg.offsets_topic_segment_bytes,
            group_config_error=partial(group_config_error, bounds=consumer_timing),
        )
        self._bridge = QuorumBridge(loop, self.cache, self._on_quorum_state_changed, self.replicas)
        quorum = MetadataQuorum(
            cfg.node_id,
            voters,
            cfg.data_dir,
            self._bridge,
            cluster_id=cluster_id,
            bind_host=cfg.quorum_listener.bind.host,
            bind_port=cfg.quorum_listener.bind.port,
            timing=timing,
        )
        self.quorum = quorum
        self.controller = ControllerService(
            cfg.node_id,
            quorum,
            self.cache,
            controller_config,
            self.clock.monotonic_ms,
            cluster_id=cluster_id,
            expected_brokers=len(voters),
            max_idle_interval_ms=cfg.metadata_max_idle_interval_ms,
            broker_heartbeat_interval_ms=cfg.broker_heartbeat_interval_ms,
        )
        self.lifecycle = BrokerLifecycle(
            cfg.node_id,
            self.incarnation_id,
            {
                "kafka": str(cfg.kafka_listener.advertised),
                "rpc": str(cfg.rpc_listener.advertised),
                "quorum": str(cfg.quorum_listener.advertised),
                "admin": str(cfg.admin_listener.advertised),
            },
            quorum,
            self.cache,
            self.controller,
            self.rpc_pool,
            self.clock.monotonic_ms,
            heartbeat_interval_ms=cfg.broker_heartbeat_interval_ms,
            storage_lost=self.logs.storage_was_empty,
            on_storage_loss_registered=self.logs.storage_loss_registered,
            offline_replicas=self._offline_replicas,
            ready_to_unfence=False,  # until the image is published (_wait_for_initial_catch_up)
        )
        self.monitor = QuorumMonitor(quorum, self.clock)
        self.rpc_server = RpcServer(
            {
                **controller_rpc_handlers(self.controller),
                "DescribeQuorum": self.describe_quorum,
                "DescribeNode": self.describe_node,
                "ReplicaFetch": self.replicas.handle_replica_fetch,
                "EpochEndOffset": self.replicas.handle_epoch_end_offset,
                **self.admin.rpc_handlers(),
            },
            idle_ms=cfg.connections_max_idle_ms,
            max_connections=peer_connection_limit(),
        )
        # The Kafka port is bound before this broker registers (Kafka's BrokerServer binds its
        # acceptors first and enables request processing last): a port taken fails the start
        # here, not after the controller has unfenced the broker and made it a leader.
        self._kafka_bound = self._kafka_broker(quorum)
        await self._kafka_bound.bind(cfg.kafka_listener.bind.host, cfg.kafka_listener.bind.port)
        await self.rpc_server.start(cfg.rpc_listener.bind.host, cfg.rpc_listener.bind.port)
        quorum.start()
        for name, coro in (
            ("controller", self.controller.run()),
            ("lifecycle", self.lifecycle.run()),
            ("monitor", self.monitor.run()),
            # Kafka checks the ISR every replica.lag.time.max.ms / 2; expansion here too.
            (
                "isr",
                self.replicas.run_isr_maintenance(min(500, cfg.replica_lag_time_max_ms // 2 or 1)),
            ),
            (
                "hw-checkpoint",
                self.replicas.run_high_watermark_checkpoints(self.log_maintenance.write_checkpoint),
            ),
            ("log-retention", self.log_maintenance.run_retention()),
            ("log-cleaner", self.log_maintenance.run_cleaner()),
            ("recovery-points", self.log_maintenance.run_recovery_point_checkpoints()),
            ("file-removal", self.log_maintenance.run_file_removal()),
        ):
            self._tasks.append(asyncio.create_task(coro, name=name))
        # The admin listener first: /healthz, /readyz (which says what the node waits for) and
        # /metrics answer while the node catches up.
        self.admin_server = AdminServer(self.admin, self.metrics)
        await self.admin_server.start(cfg.admin_listener.bind.host, cfg.admin_listener.bind.port)
        kafka = self._kafka_bound
        # Loading the Kafka schemas (most of a second of imports) overlaps the wait.
        await asyncio.gather(
            asyncio.to_thread(kafka.registry.warm_up), self._wait_for_initial_catch_up()
        )
        await kafka.start(cfg.kafka_listener.bind.host, cfg.kafka_listener.bind.port)
        self.kafka, self._kafka_bound = kafka, None
        log.info("node %d started (incarnation %s)", cfg.node_id, self.incarnation_id)

    async def _wait_for_initial_catch_up(self) -> None:
        """Clients are served only once the controller says this node has replayed the metadata
        log up to its own registration (Kafka's ``BrokerServer.startup`` waits for the
        lifecycle manager's ``initialCatchUpFuture`` before ``enableRequestProcessing``).

        Before that, a Metadata answer would come from a cache that may not hold this very
        registration yet: after a restart with new addresses it named every broker, this one
        included, at the addresses of the previous run, and a client bootstrapped from it found
        no broker to talk to."""
        assert self.lifecycle is not None
        waited_s = 0.0
        while True:
            try:
                await asyncio.wait_for(self.lifecycle.initial_catch_up.wait(), CATCH_UP_LOG_S)
            except TimeoutError:
                waited_s += CATCH_UP_LOG_S
                # What the quorum looks like from here says why (no leader: the voters do not
                # reach each other; a leader: the controller does not answer).
                assert self.quorum is not None  # started before the lifecycle
                status = self.quorum.status()
                log.info(
                    "waiting for the controller to acknowledge that we are caught up (%.0f s; "
                    "quorum: leader %s, epoch %d, connected to voters %s, commit index %d)",
                    waited_s,
                    status.leader_id,
                    status.epoch,
                    sorted(status.connected),
                    status.commit_index,
                )
            else:
                log.info("caught up with the metadata log at offset %d", self.cache.offset)
                assert self.replicas is not None and self.coordinator is not None
                # The image is published now, as one delta (MetadataCache), the logs it has
                # this node host made first off the loop (a topic of 2000 partitions created
                # on it stalled it for seconds); the role changes make any still missing.
                try:
                    await self.replicas.create_logs_ahead(self.cache.image.to_records())
                except Exception:
                    log.exception("creating the logs of the metadata image ahead failed")
                self.cache.release()
                self.lifecycle.set_ready_to_unfence()
                self.replicas.delete_stray_logs()
                return

    def _kafka_broker(self, quorum: MetadataQuorum) -> KafkaBroker:
        """The Kafka listener (node/kafka), last: it serves what everything above provides."""
        cfg = self.config
        assert self.replicas is not None and self.controller is not None
        kafka = KafkaBroker(
            cfg.node_id,
            cfg.data_dir,
            self.cache,
            self.replicas,
            lambda: quorum.status().leader_id,
            {
                "CreateTopics": self.controller.handle_create_topics,
                "CreatePartitions": self.controller.handle_create_partitions,
                "DeleteTopics": self.controller.handle_delete_topics,
                "AlterConfigs": self.controller.handle_alter_configs,
                "ElectLeaders": self.controller.handle_elect_leaders,
                "DescribeQuorum": self.describe_quorum,
            },
            self.rpc_pool,
            self.clock.now_ms,
            settings=KafkaSettings(
                auto_create_topics_enable=cfg.auto_create_topics_enable,
                num_partitions=cfg.num_partitions,
                default_replication_factor=cfg.default_replication_factor,
                bug_append_twice=cfg.test_bug_append_twice,
                producer_id_expiration_ms=cfg.producer_id_expiration_ms,
                producer_id_expiration_check_interval_ms=(
                    cfg.producer_id_expiration_check_interval_ms
                ),
            ),
            request_stats=RequestStats() if cfg.metrics_enable else None,
            max_request_bytes=cfg.socket_request_max_bytes,
            idle_ms=cfg.connections_max_idle_ms,
            max_connections=client_connection_limit(cfg.max_connections),
            max_connections_per_ip=cfg.max_connections_per_ip,
            max_connections_per_ip_overrides=per_ip_overrides(cfg.max_connections_per_ip_overrides),
        )
        assert self.coordinator is not None
        GroupApi(kafka.ctx, self.coordinator).register(kafka.register)
        configs = ConfigsApi(kafka.ctx, config_entries(cfg))
        configs.register(kafka.register)
        kafka.admin.effective_topic_configs = configs.effective_topic_configs
        kafka.register(DESCRIBE_QUORUM_KEY, QuorumApi(kafka.ctx).handle_describe_quorum)
        return kafka

    def _broker_epoch(self) -> int | None:
        return None if self.lifecycle is None else self.lifecycle.broker_epoch

    async def _alter_partition(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.lifecycle is not None
        return await self.lifecycle.alter_partition(payload)

    def _offsets_partition_count(self) -> int | None:
        topic = self.cache.image.topic_by_name(OFFSETS_TOPIC_NAME)
        return None if topic is None else len(self.cache.image.partitions_of(topic.topic_id))

    def _group_configs(self, group_id: str) -> Mapping[str, str]:
        """A group's dynamic configs (KIP-848), as committed to the metadata log."""
        return self.cache.image.resource_configs(ConfigResource(ConfigResourceType.GROUP, group_id))

    def _on_quorum_state_changed(self) -> None:
        if self.controller is not None:
            self.controller.on_quorum_state_changed()

    async def hand_over(self) -> None:
        """What a clean stop does before stopping (Kafka's ``BrokerServer.shutdown`` and
        ``KafkaRaftClient`` graceful shutdown): a controlled shutdown moves this broker's
        partition leaderships, and so its groups, to the other ISR members while it still
        answers, so clients find the new leaders and coordinators at once instead of after the
        broker session timeout; then, if this node is the active controller, it hands the Raft
        leadership on. Each step is bounded; a node that cannot hand over still stops."""
        if self.lifecycle is not None:
            try:
                handed = await self.lifecycle.controlled_shutdown(CONTROLLED_SHUTDOWN_TIMEOUT_S)
            except Exception:
                # Each step on its own, as Kafka swallows each shutdown step's error: one that
                # escaped skipped the Raft leadership's hand-over (a malformed controller reply).
                log.exception("controlled shutdown failed")
                handed = False
            log.info("controlled shutdown %s", "done" if handed else "skipped or timed out")
        if self.quorum is not None and self.quorum.status().is_leader:
            resigned = await asyncio.to_thread(self.quorum.resign, RESIGN_TIMEOUT_S)
            log.info("controller leadership %s", "handed on" if resigned else "kept")

    async def stop(self) -> None:
        """Stop every part, each step run even when one before it raised, as Kafka's
        ``BrokerServer.shutdown`` swallows each step's error (``Utils.swallow``): a step that
        raised skipped flushing the logs, the clean-shutdown marker and the lock's release."""
        for name, step in self._stop_steps():
            try:
                result = step()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("stopping: %s failed; the stop goes on", name)
        log.info("node %d stopped", self.config.node_id)

    def _stop_steps(self) -> list[tuple[str, Callable[[], object]]]:
        steps: list[tuple[str, Callable[[], object]]] = []
        if self._bridge is not None:
            steps.append(("the metadata bridge", self._bridge.close))  # it feeds the parts below
        if self.admin_server is not None:
            steps.append(("the admin listener", self.admin_server.stop))
        if self.kafka is not None:
            steps.append(("the Kafka listener", self.kafka.stop))
        if self._kafka_bound is not None:  # bound, never served: the start did not get there
            steps.append(("the bound Kafka port", self._stop_kafka_bound))
        if self.coordinator is not None:
            steps.append(("the group coordinator", self.coordinator.close))
        if self.fetchers is not None:
            steps.append(("the replica fetchers", self.fetchers.close))
        if self.replicas is not None:
            steps.append(("the replicas", self.replicas.close))
        if self._bridge is not None:
            steps.append(("the metadata bridge's last batch", self._bridge.wait_closed))
        steps.append(("the background tasks", self._stop_tasks))
        if self.log_maintenance is not None:
            steps.append(("the log maintenance", self.log_maintenance.close))
        if self.rpc_server is not None:
            steps.append(("the RPC listener", self.rpc_server.stop))
        steps.append(("the RPC connections", self.rpc_pool.close_all))
        steps.append(("the replica fetch connections", self.fetch_pool.close_all))
        if self.quorum is not None:
            steps.append(("the metadata quorum", partial(asyncio.to_thread, self.quorum.stop)))
        if self.replicas is not None:
            steps.append(
                ("the high watermarks' checkpoint", self.replicas.checkpoint_high_watermarks)
            )
        if self._logs_open:  # a stop before start() opened them must not mark them clean
            steps.append(("the logs", self.logs.shutdown))
        steps.append(("the data directory's lock", self._release_data_lock))
        return steps

    async def _stop_kafka_bound(self) -> None:
        if self._kafka_bound is not None:
            await self._kafka_bound.stop()
            self._kafka_bound = None

    async def _stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                # A background task that had died: said now, and the stop goes on.
                log.exception("background task %s had failed", task.get_name())

    def _release_data_lock(self) -> None:
        if self._data_lock is not None:
            self._data_lock.release()
            self._data_lock = None

    def _offline_replicas(self) -> list[tuple[str, int]]:
        """(topic id, partition) of the logs here that failed to load, for the heartbeat: the
        id of the topic each was created for (its partition.metadata), which the controller
        looks up on its own image, so an offline log of an earlier topic of the same name (a
        stray, deleted once the metadata has caught up) never moves the new topic's
        leadership, however far behind this node's image is. One whose topic id does not read
        (its directory failed, or its partition.metadata) is reported under the id the image
        gives its name: left out, the controller kept this node its leader, and the partition
        was unavailable."""
        image = self.cache.image
        out = []
        for tp in sorted(self.logs.offline):
            topic_id = self.logs.offline_topic_id(tp)
            if topic_id is None:
                topic = image.topic_by_name(tp[0])
                if topic is None:
                    continue
                topic_id = topic.topic_id
            out.append((topic_id, tp[1]))
        return out

    def _on_cluster_id(self, failure: LogDirFailureChannel, delta: MetadataDelta) -> None:
        """The cluster id the metadata image names, once known: recorded in meta.properties,
        or the node halts if it is not the configured one or the one recorded (a voter of
        another cluster, or a data directory from another cluster whose journal got here
        before meta.properties could tell: one written by an older kcoord)."""
        change = delta.cluster_id
        if change is None or change.after is None:
            return
        try:
            meta_properties.check_learned_cluster_id(
                self.config.data_dir, change.after, self.config.cluster_id
            )
        except meta_properties.DataDirError as e:
            log.critical("%s", e)
            failure.fail("checking the cluster id", OSError(str(e)))
        except OSError as e:
            failure.fail(f"writing {meta_properties.META_PROPERTIES_FILE}", e)

    # -----------------------------------------------------------------------------------------
    # Describe RPCs.

    async def describe_quorum(self, payload: Any) -> dict[str, Any]:
        """Kafka's ``DescribeQuorum`` (apiKey 55) as this node sees it."""
        assert self.quorum is not None and self.monitor is not None
        status = self.quorum.status()
        voters = []
        for voter_id in sorted(self.quorum.voters):
            if status.is_leader:
                end = (
                    status.commit_index
                    if voter_id == status.node_id
                    else status.follower_match_index.get(voter_id, -1)
                )
            else:
                end = status.last_applied if voter_id == status.node_id else -1
            voters.append(
                {
                    "node_id": voter_id,
                    "log_end_offset": end,
                    "last_fetch_timestamp": self.monitor.last_fetch_ms.get(voter_id, -1),
                    "last_caught_up_timestamp": self.monitor.last_caught_up_ms.get(voter_id, -1),
                }
            )
        leader_rpc = None
        if status.leader_id is not None:
            broker = self.cache.image.broker(status.leader_id)
            leader_rpc = broker.endpoints.get("rpc") if broker is not None else None
        return {
            "node_id": status.node_id,
            "cluster_id": self.cache.image.cluster_id,
            "is_leader": status.is_leader,
            "leader_id": status.leader_id,
            "leader_rpc": leader_rpc,
            "leader_epoch": status.epoch,
            "high_watermark": status.commit_index,
            "voters": voters,
            "observers": [],
        }

    async def describe_node(self, payload: Any) -> dict[str, Any]:
        assert self.quorum is not None and self.controller is not None
        assert self.lifecycle is not None
        status = self.quorum.status()
        image = self.cache.image
        topics = {}
        for topic in image.topics.values():
            topics[topic.name] = {
                "topic_id": topic.topic_id,
                "partitions": [
                    {
                        "partition": p.partition,
                        "leader": p.leader,
                        "leader_epoch": p.leader_epoch,
                        "partition_epoch": p.partition_epoch,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                        "elr": list(p.elr),
                    }
                    for p in image.partitions_of(topic.topic_id)
                ],
            }
        if not (payload or {}).get("topics"):
            topics = {}  # only when asked: the launcher polls this often
        return {
            "node_id": self.config.node_id,
            "pid": os.getpid(),  # the launcher checks that its own process answers
            "incarnation_id": self.incarnation_id,
            "cluster_id": image.cluster_id,
            "controller_id": status.leader_id,
            "is_active_controller": self.controller.is_active,
            "controller_epoch": status.epoch,
            "metadata_offset": image.last_offset,
            "quorum_commit_index": status.commit_index,
            "quorum_connected": sorted(status.connected),
            "broker_epoch": self.lifecycle.broker_epoch,
            "fenced": self.lifecycle.is_fenced,
            # The Kafka listener opens once the node has caught up with its registration.
            "serving": self.kafka is not None,
            "brokers": {
                str(b.broker_id): {
                    "epoch": b.broker_epoch,
                    "fenced": b.fenced,
                    "endpoints": dict(b.endpoints),
                }
                for b in image.brokers.values()
            },
            "offsets_topic_created": image.topic_by_name(OFFSETS_TOPIC_NAME) is not None,
            "leader_counts": {str(k): v for k, v in image.leader_counts().items()},
            "led_partitions": len(self.roles.led()),
            "role_changes": len(self.roles.history),
            "fenced_by_me": list(self.controller.fenced_by_me),
            "topics": topics,
            "coordinator": self._describe_coordinator()
            if (payload or {}).get("coordinator")
            else {},
        }

    def _describe_coordinator(self) -> dict[str, Any]:
        """Shards and standbys of this node's group coordinator, and its recent loads."""
        runtime = self.coordinator
        if runtime is None:
            return {}
        return {
            "shards": {str(i): ctx.state.value for i, ctx in runtime.contexts.items()},
            "standbys": {
                str(i): {
                    "next_offset": sb.next_offset,
                    "high_watermark": sb.partition.high_watermark,
                    "records": sb.records,
                }
                for i, sb in runtime.standbys.items()
            },
            "loads": [summary.as_dict() for summary in runtime.loads[-200:]],
        }


def stop_signals() -> list[signal.Signals]:
    """The signals that stop the node cleanly: SIGTERM, and SIGINT and SIGHUP unless they are
    ignored. SIGHUP too: a node run in a terminal that closes (or an ssh session that drops)
    was ended by Python's default action, without the hand-over or the clean-shutdown marker.
    Unless ignored: a node started under ``nohup`` (or in the background of a script, for
    SIGINT) keeps running when its terminal goes, as the JVM leaves such a signal ignored."""
    signals = [signal.SIGTERM]
    for sig in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signals.append(sig)
    return signals


async def serve(config: NodeConfig) -> None:
    node = Node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in stop_signals():
        loop.add_signal_handler(sig, stop.set)
    # start() may wait long (no controller to catch up with): a signal stops the node then too.
    starting = asyncio.create_task(node.start(), name="start")
    signalled = asyncio.create_task(stop.wait(), name="stop-signal")
    await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if starting.done() and starting.exception() is not None:
        # A failed start still hands over what it took on and stops what it started (Kafka's
        # BrokerServer.startup calls shutdown on an error); then it raises, as it always did.
        signalled.cancel()
        log.error("node %d failed to start: %r", config.node_id, starting.exception())
        try:
            await node.hand_over()
        finally:
            await node.stop()
        starting.result()
    start_error: Exception | None = None
    try:
        await signalled
    finally:
        log.info("node %d stopping", config.node_id)
        if not starting.done():
            starting.cancel()
            try:
                await starting
            except asyncio.CancelledError:
                pass
            except Exception as e:
                # The start, cancelled, ended with another error: the hand-over and the stop
                # below run first (it escaped this block, and neither did), then it is raised.
                start_error = e
        try:
            await node.hand_over()
        finally:
            await node.stop()
    if start_error is not None:
        raise start_error


OPEN_FILES_CAP = 1 << 20


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit (at most ``OPEN_FILES_CAP``), as
    the JVM does for a Kafka broker (HotSpot's ``MaxFDLimit``, on by default on Linux). Every
    partition replica keeps three files open (``.log``, ``.index``, ``.timeindex``), so the
    common soft limit of 1024 is ~300 replicas, and a failed open is a log directory failure
    that halts the node. Returns the soft limit before and after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_CAP)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return soft, target
    return soft, soft


def client_connection_limit(max_connections: int) -> int:
    """``max.connections``, but at most half of the open-files limit: the other half stays for
    the data directory (a segment's file each) and the inter-node connections. Clients that
    took every descriptor failed a checkpoint write with EMFILE, a log directory failure that
    halts the node (Kafka leaves this to max.connections and the operator's limits)."""
    return _open_files_share(max_connections, 2)


def peer_connection_limit() -> int:
    """Connections the RPC port takes at once: ``rpc.MAX_CONNECTIONS``, at most an eighth of
    the open-files limit (the clients' half and the data directory keep the rest)."""
    return _open_files_share(MAX_RPC_CONNECTIONS, 8)


def _open_files_share(cap: int, divisor: int) -> int:
    """``cap``, but at most 1/``divisor`` of the soft open-files limit (at least 1)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return cap
    return max(1, min(cap, soft // divisor))


def run(config: NodeConfig) -> None:
    before, after = raise_open_files_limit()
    if after != before:
        log.info("open files limit raised from %d to %d", before, after)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(config))
        return
    uvloop.run(serve(config))
