"""An in-process node for Kafka API tests: the real listener, handlers, replica manager and
controller service, over a metadata log that commits at once (``FakeQuorum``).

Node 1 is this node and the active controller; brokers 2 and 3 are registered (with Kafka
endpoints nobody listens on) so that partitions can be led elsewhere, as in a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from kcoord.cluster.coordinator.group_config import GroupConfigBounds, group_config_error
from kcoord.node.config import config_entries, parse_config
from kcoord.node.controller_service import ControllerService
from kcoord.node.kafka.broker import KafkaBroker
from kcoord.node.kafka.configs import ConfigsApi
from kcoord.node.kafka.context import KafkaSettings
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_manager import ReplicaManager
from kcoord.node.rpc import RpcClientPool
from kcoord.raft import records as rec
from kcoord.raft.controller import OFFSETS_TOPIC_NAME, ControllerConfig
from kcoord.raft.quorum import MetadataQuorum, QuorumStatus
from kcoord.storage.manager import LogManager
from tests.unit.node.kafka.wire import AsyncWireClient

NODE_ID = 1
HOST = "127.0.0.1"
OFFSETS_PARTITIONS = 6


class FakeQuorum:
    """Commits every proposal at the next offset on the next loop iteration."""

    def __init__(self, cache: MetadataCache) -> None:
        self.cache = cache
        self.offset = 0
        self.leader_id: int | None = NODE_ID

    def status(self) -> QuorumStatus:
        return QuorumStatus(
            NODE_ID, self.leader_id == NODE_ID, self.leader_id, 1, self.offset, self.offset, 0
        )

    def commit(self, records: Sequence[rec.MetadataRecord]) -> int:
        self.offset += 1
        self.cache.apply(self.offset, list(records))
        return self.offset

    def propose(
        self,
        records: Sequence[rec.MetadataRecord],
        on_done: Callable[[int | None, str | None], None],
        *,
        epoch: int,
    ) -> None:
        loop = asyncio.get_running_loop()
        if epoch != self.status().epoch:
            loop.call_soon(lambda: on_done(None, f"proposed in epoch {epoch}"))
            return
        loop.call_soon(lambda: on_done(self.commit(records), None))


@dataclass
class Harness:
    cache: MetadataCache
    quorum: FakeQuorum
    replicas: ReplicaManager
    controller: ControllerService
    broker: KafkaBroker
    clock: list[int]

    @property
    def port(self) -> int:
        return self.broker.port

    async def client(self) -> AsyncWireClient:
        return await AsyncWireClient.connect(HOST, self.port)

    def topic_id(self, name: str) -> str:
        topic = self.cache.image.topic_by_name(name)
        assert topic is not None, name
        return topic.topic_id

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int = 1,
        configs: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        reply = await self.controller.handle_create_topics(
            {
                "topics": [
                    {
                        "name": name,
                        "num_partitions": partitions,
                        "replication_factor": replication_factor,
                        "configs": configs or {},
                    }
                ]
            }
        )
        result: dict[str, Any] = reply["topics"][0]
        assert result["error"] == 0, result
        return result

    def move_leader(self, topic: str, partition: int, leader: int) -> None:
        """Commit a leadership change, as a failover would (new leader epoch): the old leader
        leaves the ISR (fenced), so the new one alone moves the HW (no other node fetches
        here)."""
        state = self.cache.image.partition(self.topic_id(topic), partition)
        assert state is not None
        replicas = tuple(dict.fromkeys((*state.replicas, leader)))
        self.change_partition(topic, partition, leader=leader, isr=(leader,), replicas=replicas)

    def change_partition(self, topic: str, partition: int, **changes: Any) -> None:
        """Commit a PartitionChange (leader, isr, ...) on the partition's current epoch."""
        state = self.cache.image.partition(self.topic_id(topic), partition)
        assert state is not None
        self.quorum.commit(
            [
                rec.PartitionChange(
                    topic_id=state.topic_id,
                    partition=partition,
                    expected_partition_epoch=state.partition_epoch,
                    **changes,
                )
            ]
        )

    def advertise_listener(self) -> None:
        """Register this node again with the port its listener took, so that real clients,
        which connect to the endpoints Metadata names, reach it (brokers 2 and 3 stay
        unreachable)."""
        self.quorum.commit(
            [
                rec.RegisterBroker(
                    broker_id=NODE_ID,
                    incarnation_id=f"inc-{next(_incarnations)}",
                    broker_epoch=self.quorum.offset + 1,
                    endpoints={"kafka": f"{HOST}:{self.port}", "rpc": "x:1"},
                    rack=None,
                    fenced=False,
                )
            ]
        )

    def led_partitions(self, topic: str, by: int = NODE_ID) -> list[int]:
        return [
            s.partition
            for s in self.cache.image.partitions_of(self.topic_id(topic))
            if s.leader == by
        ]


_incarnations = itertools.count(1)


@contextlib.asynccontextmanager
async def running(
    data_dir: Path,
    *,
    settings: KafkaSettings | None = None,
    idle_ms: int = 600_000,
    max_request_bytes: int = 100 * 1024 * 1024,
) -> AsyncIterator[Harness]:
    clock = [1_700_000_000_000]
    cache = MetadataCache(NODE_ID, cast(Any, None))
    logs = LogManager(data_dir)
    logs.open()
    replicas = ReplicaManager(NODE_ID, logs, cache, lambda: clock[0])
    cache.listener = replicas
    cache.delta_listeners.append(replicas.on_metadata_delta)  # ISR changes, as server.py
    quorum = FakeQuorum(cache)
    controller = ControllerService(
        NODE_ID,
        cast(MetadataQuorum, quorum),
        cache,
        ControllerConfig(
            offsets_topic_num_partitions=OFFSETS_PARTITIONS,
            group_config_error=partial(group_config_error, bounds=GroupConfigBounds()),
        ),
        lambda: clock[0],
        expected_brokers=3,
    )
    quorum.commit([rec.ClusterId("harness-cluster")])
    for broker_id in (1, 2, 3):
        quorum.commit(
            [
                rec.RegisterBroker(
                    broker_id=broker_id,
                    incarnation_id=f"inc-{next(_incarnations)}",
                    broker_epoch=quorum.offset + 1,
                    endpoints={"kafka": f"127.0.0.{broker_id}:{9000 + broker_id}", "rpc": "x:1"},
                    rack=None,
                    fenced=False,
                )
            ]
        )
    await controller._maybe_activate()
    assert controller.is_active
    offsets = controller.controller
    assert offsets is not None
    created = offsets.create_offsets_topic(cache.image, "OffsetsTopicId-aaaaaaaa")
    quorum.commit(created.records)
    assert cache.image.topic_by_name(OFFSETS_TOPIC_NAME) is not None
    broker = KafkaBroker(
        NODE_ID,
        data_dir,
        cache,
        replicas,
        lambda: quorum.leader_id,
        {
            "CreateTopics": controller.handle_create_topics,
            "CreatePartitions": controller.handle_create_partitions,
            "DeleteTopics": controller.handle_delete_topics,
            "AlterConfigs": controller.handle_alter_configs,
            "ElectLeaders": controller.handle_elect_leaders,
        },
        RpcClientPool(),
        lambda: clock[0],
        settings=settings or KafkaSettings(num_partitions=3),
        idle_ms=idle_ms,
        max_request_bytes=max_request_bytes,
    )
    node_config = parse_config(
        {
            "node.id": NODE_ID,
            "data.dir": str(data_dir),
            "controller.quorum.voters": f"{NODE_ID}@{HOST}:9094",
            "log.retention.ms": 3_600_000,
            "admin.api.token": "secret",
        }
    )
    configs = ConfigsApi(broker.ctx, config_entries(node_config))
    configs.register(broker.register)
    broker.admin.effective_topic_configs = configs.effective_topic_configs
    await broker.start(HOST, 0)
    try:
        yield Harness(cache, quorum, replicas, controller, broker, clock)
    finally:
        await broker.stop()
        logs.shutdown()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds, failing after 5 s."""
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # polling interval
