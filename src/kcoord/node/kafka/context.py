"""What the Kafka API handlers share: the node's services and lookups on its metadata image."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kcoord.cluster.coordinator.consumer import INTERNAL_TOPICS
from kcoord.node.config import Endpoint
from kcoord.node.kafka.codec import uuid_to_topic_id
from kcoord.node.kafka.controller_channel import ControllerChannel
from kcoord.node.metadata import MetadataCache
from kcoord.node.replica_manager import ReplicaManager
from kcoord.raft.image import MetadataImage, TopicImage
from kcoord.raft.records import NO_LEADER
from kcoord.storage.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Broker configs the handlers follow (Kafka's names, underscores for dots)."""

    auto_create_topics_enable: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1
    # How long a Metadata request waits for a topic it auto-creates.
    auto_create_timeout_ms: int = 10_000
    # test.bug.append.twice: every accepted batch appended a second time (chaos suite's test).
    bug_append_twice: bool = False
    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    producer_id_expiration_check_interval_ms: int = 600_000


class BrokerEndpoint(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None


@functools.lru_cache(maxsize=1024)
def _parse_endpoint(text: str) -> Endpoint | None:
    try:
        return Endpoint.parse(text)
    except ValueError:
        return None


@dataclass(slots=True)
class BrokerContext:
    node_id: int
    cache: MetadataCache
    replicas: ReplicaManager
    controller: ControllerChannel
    controller_id: Callable[[], int | None]
    now_ms: Callable[[], int]
    settings: KafkaSettings

    @property
    def image(self) -> MetadataImage:
        return self.cache.image

    def alive_brokers(self) -> dict[int, BrokerEndpoint]:
        """Unfenced brokers with a Kafka endpoint: the ones clients may be sent to."""
        return {b.node_id: b for b, fenced in self.registered_brokers() if not fenced}

    def registered_brokers(self) -> list[tuple[BrokerEndpoint, bool]]:
        """Every registered broker with a Kafka endpoint, by id, and whether it is fenced."""
        found = []
        for broker in sorted(self.image.brokers.values(), key=lambda b: b.broker_id):
            endpoint = _parse_endpoint(broker.endpoints.get("kafka", ""))
            if endpoint is not None:
                found.append(
                    (
                        BrokerEndpoint(broker.broker_id, endpoint.host, endpoint.port, broker.rack),
                        broker.fenced,
                    )
                )
        return found

    def leader_hint(self, topic: str, partition: int) -> dict[str, int]:
        """Kafka's ``LeaderIdAndEpoch`` for a client sent to the wrong node (KIP-951)."""
        topic_image = self.image.topic_by_name(topic)
        state = (
            None if topic_image is None else self.image.partition(topic_image.topic_id, partition)
        )
        if state is None or state.leader == NO_LEADER:
            return {"leader_id": -1, "leader_epoch": -1}
        return {"leader_id": state.leader, "leader_epoch": state.leader_epoch}

    def node_endpoints(self, node_ids: Iterable[int]) -> list[dict[str, Any]]:
        """The endpoints of the nodes named in leader hints (``NodeEndpoints``, KIP-951)."""
        alive = self.alive_brokers()
        return [
            {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in (alive[i] for i in sorted(set(node_ids)) if i in alive)
        ]

    def topic_by_uuid(self, value: uuid.UUID | None) -> TopicImage | None:
        if value is None or value.int == 0:
            return None
        # One lookup, as KafkaApis' ``metadataCache.topicIdsToNames``: every id is ours, so
        # it is the base64 of its UUID. Trying each topic's id for a miss cost 38 ms per
        # unknown id with 5,000 topics, on the loop: one Fetch of unknown ids stalled the node.
        return self.image.topic(uuid_to_topic_id(value))


def is_internal(topic: str) -> bool:
    """Kafka's ``Topic.isInternal``: never auto-created by a Metadata request, written only by
    their coordinators (kcoord has the group coordinator's only)."""
    return topic in INTERNAL_TOPICS
