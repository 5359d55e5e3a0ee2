"""The node's Kafka side: every data-plane API registered on one listener.

``KafkaBroker`` builds the handlers over the node's services and registers one handler per API
key; the group APIs join with one ``register`` call each. The versions registered here are the
ones the handlers implement; kio's schemas bound them further (``ApiRegistry.register``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from kcoord.node.kafka import (
    acls,
    admin,
    delete_records,
    fetch,
    log_dirs,
    metadata,
    produce,
    sasl,
    transactions,
)
from kcoord.node.kafka.apis import ApiRegistry, ApiSpec, Handler
from kcoord.node.kafka.context import BrokerContext, KafkaSettings
from kcoord.node.kafka.controller_channel import ControllerChannel
from kcoord.node.kafka.controller_channel import Handler as ControllerHandler
from kcoord.node.kafka.producer_ids import ProducerIdManager
from kcoord.node.kafka.server import (
    DEFAULT_IDLE_MS,
    DEFAULT_MAX_REQUEST_BYTES,
    KafkaServer,
    RequestStats,
)
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_manager import ReplicaManager
from kcoord.node.rpc import RpcClientPool

log = logging.getLogger(__name__)


class KafkaBroker:
    def __init__(  # noqa: PLR0917 - the node wires its parts in one place
        self,
        node_id: int,
        data_dir: Path,
        cache: MetadataCache,
        replicas: ReplicaManager,
        quorum_leader_id: Callable[[], int | None],
        controller_handlers: Mapping[str, ControllerHandler],
        rpc_pool: RpcClientPool,
        now_ms: Callable[[], int],
        *,
        settings: KafkaSettings | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        idle_ms: int = DEFAULT_IDLE_MS,
        max_connections: int = 2**31 - 1,
        max_connections_per_ip: int = 2**31 - 1,
        max_connections_per_ip_overrides: Mapping[str, int] | None = None,
        request_stats: RequestStats | None = None,
    ) -> None:
        channel = ControllerChannel(node_id, quorum_leader_id, cache, controller_handlers, rpc_pool)
        self.ctx = BrokerContext(
            node_id=node_id,
            cache=cache,
            replicas=replicas,
            controller=channel,
            controller_id=quorum_leader_id,
            now_ms=now_ms,
            settings=settings or KafkaSettings(),
        )
        self.producer_ids = ProducerIdManager(node_id, data_dir, now_ms)
        self.metadata = metadata.MetadataApi(self.ctx)
        self.admin = admin.AdminApi(self.ctx)
        self.registry = ApiRegistry()
        self.server = KafkaServer(
            self.registry,
            max_request_bytes=max_request_bytes,
            idle_ms=idle_ms,
            max_connections=max_connections,
            max_connections_per_ip=max_connections_per_ip,
            max_connections_per_ip_overrides=max_connections_per_ip_overrides,
            stats=request_stats,
        )
        states = produce.ProducerStates(
            replicas,
            producer_id_expiration_ms=self.ctx.settings.producer_id_expiration_ms,
            expiration_check_interval_ms=self.ctx.settings.producer_id_expiration_check_interval_ms,
        )
        self.produce = produce.ProduceApi(self.ctx, self.producer_ids, states, self.server.off_loop)
        self.fetch = fetch.FetchApi(self.ctx, fetch.FetchWaiters(replicas))
        self.delete_records = delete_records.DeleteRecordsApi(self.ctx)
        # Produce v3+ and Fetch v4+ carry v2 record batches, the only format kcoord stores.
        self.register(produce.PRODUCE_KEY, self.produce.handle_produce, min_version=3)
        self.register(fetch.FETCH_KEY, self.fetch.handle_fetch, min_version=4)
        self.register(fetch.LIST_OFFSETS_KEY, self.fetch.handle_list_offsets, min_version=1)
        self.register(fetch.OFFSET_FOR_LEADER_EPOCH_KEY, self.fetch.handle_offset_for_leader_epoch)
        self.register(metadata.METADATA_KEY, self.metadata.handle_metadata)
        self.register(metadata.FIND_COORDINATOR_KEY, self.metadata.handle_find_coordinator)
        self.register(metadata.DESCRIBE_CLUSTER_KEY, self.metadata.handle_describe_cluster)
        self.register(
            metadata.DESCRIBE_TOPIC_PARTITIONS_KEY, self.metadata.handle_describe_topic_partitions
        )
        self.register(admin.CREATE_TOPICS_KEY, self.admin.handle_create_topics)
        self.register(admin.DELETE_TOPICS_KEY, self.admin.handle_delete_topics)
        self.register(produce.INIT_PRODUCER_ID_KEY, self.produce.handle_init_producer_id)
        self.register(produce.DESCRIBE_PRODUCERS_KEY, self.produce.handle_describe_producers)
        self.register(transactions.LIST_TRANSACTIONS_KEY, transactions.handle_list_transactions)
        self.register(admin.CREATE_PARTITIONS_KEY, self.admin.handle_create_partitions)
        self.register(admin.ELECT_LEADERS_KEY, self.admin.handle_elect_leaders)
        self.log_dirs = log_dirs.LogDirsApi(self.ctx)
        # kio has DescribeLogDirs from v1 on.
        self.register(
            log_dirs.DESCRIBE_LOG_DIRS_KEY, self.log_dirs.handle_describe_log_dirs, min_version=1
        )
        self.register(delete_records.DELETE_RECORDS_KEY, self.delete_records.handle_delete_records)
        # No authorizer: refused as Kafka refuses them without one (SECURITY_DISABLED); kio
        # has them from v1 on.
        self.register(acls.DESCRIBE_ACLS_KEY, acls.handle_describe_acls, min_version=1)
        self.register(acls.CREATE_ACLS_KEY, acls.handle_create_acls, min_version=1)
        self.register(acls.DELETE_ACLS_KEY, acls.handle_delete_acls, min_version=1)
        # PLAINTEXT only: refused as Kafka refuses them there (ILLEGAL_SASL_STATE).
        self.register(sasl.SASL_HANDSHAKE_KEY, sasl.handle_sasl_handshake)
        self.register(sasl.SASL_AUTHENTICATE_KEY, sasl.handle_sasl_authenticate)

    def register(
        self,
        api_key: int,
        handler: Handler,
        *,
        min_version: int = 0,
        max_version: int = 2**15 - 1,
    ) -> ApiSpec:
        """Serve one more API (the group APIs register here)."""
        return self.registry.register(
            api_key, handler, min_version=min_version, max_version=max_version
        )

    @property
    def port(self) -> int:
        return self.server.port

    async def bind(self, host: str, port: int) -> None:
        await self.server.bind(host, port)

    async def start(self, host: str, port: int) -> None:
        await self.server.start(host, port)
        advertised = ", ".join(
            f"{key}:{r.start}-{r.stop - 1}" for key, r in self.registry.versions.items()
        )
        log.info("kafka APIs (key:versions): %s", advertised)

    async def stop(self) -> None:
        await self.server.stop()
        self.metadata.close()
        self.produce.states.close()
