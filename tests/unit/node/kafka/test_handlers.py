"""The Kafka APIs of one in-process node (harness.py), spoken to over loopback as a client would.

Every test builds requests from plain values for a given version, sends them through the real
listener and checks the decoded response: the behaviour a Kafka client relies on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from kcoord.cluster.routing import partition_for
from kcoord.errors import Errors
from kcoord.node.kafka import codec, produce
from kcoord.node.kafka import fetch as fetch_module
from kcoord.node.kafka.apis import PARTITIONS_PER_SLICE, Deferred, Request
from kcoord.node.kafka.context import KafkaSettings
from kcoord.node.kafka.metadata import NO_TRANSACTIONS, TopicCreator
from kcoord.node.kafka.produce import (
    LOAD_SLICE_HEADERS,
    PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS,
)
from kcoord.node.replica_manager import KafkaError, Partition
from kcoord.raft import records as rec
from kcoord.raft.controller import OFFSETS_TOPIC_NAME
from kcoord.raft.quorum import BatchTooLargeError
from kcoord.storage import checkpoint, producer_snapshot
from kcoord.storage import format as fmt
from kcoord.storage.log import LeaderScan, Log
from kcoord.storage.segment import LogSegment
from tests.unit.node.kafka.harness import NODE_ID, OFFSETS_PARTITIONS, Harness, running, until
from tests.unit.node.kafka.test_codec import ADVERTISED
from tests.unit.node.kafka.wire import AsyncWireClient

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
FIND_COORDINATOR, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 10, 18, 19, 20
INIT_PRODUCER_ID, OFFSET_FOR_LEADER_EPOCH, CREATE_PARTITIONS = 22, 23, 37
DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS, DESCRIBE_TOPIC_PARTITIONS = 60, 61, 75
LIST_TRANSACTIONS = 66
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
TEST_TIMEOUT_S = 20.0


def run(
    tmp_path: Path,
    test: Callable[[Harness, AsyncWireClient], Awaitable[None]],
    **options: Any,
) -> None:
    async def main() -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S), running(tmp_path, **options) as h:
            client = await h.client()
            try:
                await test(h, client)
            finally:
                await client.close()

    asyncio.run(main())


def batch(
    values: list[bytes],
    *,
    timestamp: int = 1_700_000_000_000,  # near the harness clock: no segment.ms rolls
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    return fmt.build_batch(
        [fmt.Record(i, timestamp + i, None, v) for i, v in enumerate(values)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def zstd_bomb() -> bytes:
    """A batch of one record whose 8 KiB zstd body decompresses to 256 MiB, its CRC valid."""
    from tests.unit.storage.test_format import zstd_zeros

    data = bytearray(
        fmt.build_batch(
            [fmt.Record(0, 1_700_000_000_000, None, b"v")], compression=fmt.Compression.ZSTD
        )[: fmt.HEADER_SIZE]
    )
    data += zstd_zeros(256 * 1024 * 1024)
    data[8:12] = (len(data) - 12).to_bytes(4, "big")  # the batch length
    data[17:21] = fmt.compute_crc(data, 0, len(data)).to_bytes(4, "big")
    return bytes(data)


def compressed_claiming(count: int, *, garbage: bool = False) -> bytes:
    """A gzip batch of three records claiming ``count`` (offset range agreeing), or with a body
    that does not decompress; its CRC valid."""
    data = bytearray(
        fmt.build_batch(
            [fmt.Record(i, 1_700_000_000_000, None, b"v") for i in range(3)],
            compression=fmt.Compression.GZIP,
        )
    )
    data[23:27] = (count - 1).to_bytes(4, "big", signed=True)  # last offset delta
    data[fmt.HEADER_SIZE - 4 : fmt.HEADER_SIZE] = count.to_bytes(4, "big", signed=True)
    if garbage:
        data[fmt.HEADER_SIZE :] = bytes(len(data) - fmt.HEADER_SIZE)
    data[17:21] = fmt.compute_crc(data, 0, len(data)).to_bytes(4, "big")
    return bytes(data)


def produce_values(topic: str, partition: int, records: bytes, acks: int = -1) -> dict[str, Any]:
    return {
        "acks": acks,
        "timeout": 5000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": records}]}
        ],
    }


def fetch_values(
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
    partition_max_bytes: int = 1 << 20,
    current_leader_epoch: int = -1,
    topic_id: str | None = None,
    session_epoch: int = -1,
) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": session_epoch,
        "topics": [
            {
                "topic": topic,
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": partition,
                        "fetch_offset": offset,
                        "partition_max_bytes": partition_max_bytes,
                        "current_leader_epoch": current_leader_epoch,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
    }


def records_of(data: bytes | None) -> list[bytes | None]:
    out: list[bytes | None] = []
    for pos, _ in fmt.iter_headers(data or b""):
        out.extend(r.value for r in fmt.decode_records(data or b"", pos))
    return out


def metadata_values(*names: str, auto_create: bool = True) -> dict[str, Any]:
    return {
        "topics": [{"name": n, "topic_id": None} for n in names],
        "allow_auto_topic_creation": auto_create,
        "include_topic_authorized_operations": False,
        "include_cluster_authorized_operations": False,
    }


def only_partition(response: Any) -> Any:
    (topic,) = response.responses
    (part,) = topic.partitions if hasattr(topic, "partitions") else topic.partition_responses
    return part


# ------------------------------------------------------------------ ApiVersions


def test_api_versions_advertise_what_is_served(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        for version in (0, 3, 4):
            response = await c.call(
                API_VERSIONS,
                version,
                {"client_software_name": "kcoord-tests", "client_software_version": "1.0"},
            )
            assert response.error_code == Errors.NONE
            served = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            assert served == {
                key: (r.start, r.stop - 1) for key, r in h.broker.registry.versions.items()
            }
            for key, (lo, hi) in served.items():
                kio = codec.kio_versions(key)
                assert kio.start <= lo <= hi < kio.stop
        assert h.broker.registry.versions == ADVERTISED

    run(tmp_path, test)


def test_sasl_requests_are_refused_as_on_a_kafka_plaintext_listener(tmp_path: Path) -> None:
    """An unknown API key closed the connection, and a client configured for SASL reconnected
    for ever; Kafka answers ILLEGAL_SASL_STATE, which fails the client at once."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        for version in (0, 1):
            response = await c.call(SASL_HANDSHAKE, version, {"mechanism": "PLAIN"})
            assert response.error_code == Errors.ILLEGAL_SASL_STATE
            assert response.mechanisms == ()
        for version in (0, 1, 2):
            response = await c.call(SASL_AUTHENTICATE, version, {"auth_bytes": b"\x00u\x00p"})
            assert response.error_code == Errors.ILLEGAL_SASL_STATE
            assert response.error_message == (
                "SaslAuthenticate request received after successful authentication"
            )
        assert (await c.call(API_VERSIONS, 0, {})).error_code == Errors.NONE  # still open

    run(tmp_path, test)


def test_api_versions_features(tmp_path: Path) -> None:
    """KIP-584: the finalized group.version and eligible.leader.replicas.version (1: KIP-848,
    KIP-966) from v3; a supported range starting at 0 only from v4, as Kafka leaves it out
    below (KAFKA-17492: older clients refuse a zero minimum)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        names = {"group.version", "eligible.leader.replicas.version"}
        for version in (3, 4):
            response = await c.call(
                API_VERSIONS,
                version,
                {"client_software_name": "kcoord-tests", "client_software_version": "1.0"},
            )
            finalized = {
                f.name: (f.min_version_level, f.max_version_level)
                for f in response.finalized_features
            }
            assert finalized == dict.fromkeys(names, (1, 1))
            assert response.finalized_features_epoch == 0
            supported = {
                f.name: (f.min_version, f.max_version) for f in response.supported_features
            }
            assert supported == ({} if version == 3 else dict.fromkeys(names, (0, 1)))

    run(tmp_path, test)


def test_api_versions_unknown_version_and_bad_software_name(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        # A version from the future: v0 answer with UNSUPPORTED_VERSION and ApiVersions' own
        # versions (KIP-511).
        frame = bytearray(codec.FRAME_SIZE.size) + bytearray(
            codec._REQUEST_PREFIX.pack(API_VERSIONS, 99, 7)
        )
        frame += b"\x00\x00\x00"  # null client id (int16 -1 is two bytes), tagged fields
        frame[:4] = codec.FRAME_SIZE.pack(len(frame) - 4)
        await c.send_raw(bytes(frame))
        correlation_id, response = await c.receive(API_VERSIONS, 0)
        assert correlation_id == 7
        assert response.error_code == Errors.UNSUPPORTED_VERSION
        assert [k.api_key for k in response.api_keys] == [API_VERSIONS]
        bad = await c.call(
            API_VERSIONS, 3, {"client_software_name": "-bad", "client_software_version": "1"}
        )
        assert bad.error_code == Errors.INVALID_REQUEST

    run(tmp_path, test)


# ------------------------------------------------------------------ Metadata


@pytest.mark.parametrize("version", [0, 1, 4, 7, 9, 10, 12, 13])
def test_metadata_lists_brokers_topics_and_partitions(tmp_path: Path, version: int) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("orders", 3, 1)
        response = await c.call(METADATA, version, {"topics": [] if version == 0 else None})
        assert sorted((b.node_id, b.host, b.port) for b in response.brokers) == [
            (1, "127.0.0.1", 9001),
            (2, "127.0.0.2", 9002),
            (3, "127.0.0.3", 9003),
        ]
        if version >= 2:
            assert response.cluster_id == "harness-cluster"
        if version >= 1:
            assert response.controller_id == NODE_ID
        topics = {t.name: t for t in response.topics}
        assert set(topics) == {"orders", OFFSETS_TOPIC_NAME}
        orders = topics["orders"]
        assert orders.error_code == Errors.NONE
        state = h.cache.image.partitions_of(h.topic_id("orders"))
        assert [
            (p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes)
            for p in orders.partitions
        ] == [(s.partition, s.leader, s.replicas, s.isr) for s in state]
        if version >= 1:
            assert topics[OFFSETS_TOPIC_NAME].is_internal and not orders.is_internal
        if version >= 10:
            assert orders.topic_id == codec.topic_id_to_uuid(h.topic_id("orders"))

    run(tmp_path, test)


def test_metadata_unknown_topics_and_auto_creation(tmp_path: Path) -> None:
    asked: list[str] = []
    create = TopicCreator.create

    async def recorded(self: TopicCreator, names: list[str]) -> None:
        asked.extend(names)
        await create(self, names)

    async def test(h: Harness, c: AsyncWireClient) -> None:
        response = await c.call(
            METADATA, 12, metadata_values("nope", "bad/name", auto_create=False)
        )
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("nope", Errors.UNKNOWN_TOPIC_OR_PARTITION),
            ("bad/name", Errors.INVALID_TOPIC_EXCEPTION),  # with or without creation
        ]
        assert h.cache.image.topic_by_name("nope") is None
        # Allowed: created with num.partitions, and this very answer describes it.
        response = await c.call(METADATA, 12, metadata_values("fresh", "bad/name"))
        fresh, bad = response.topics
        assert (fresh.name, fresh.error_code, len(fresh.partitions)) == ("fresh", 0, 3)
        assert all(p.leader_id in (1, 2, 3) for p in fresh.partitions)
        assert (bad.name, bad.error_code) == ("bad/name", Errors.INVALID_TOPIC_EXCEPTION)
        # AutoTopicCreationManager.filterCreatableTopics: the illegal name is answered
        # without the controller (which may be away, and the producer would wait for it).
        assert asked == ["fresh"]
        # v3 always allows; by topic id (v12) an unknown id is UNKNOWN_TOPIC_ID.
        response = await c.call(METADATA, 3, {"topics": [{"name": "old"}]})
        assert response.topics[0].error_code == Errors.NONE
        unknown = uuid.uuid4()
        response = await c.call(
            METADATA,
            12,
            {
                "topics": [{"name": None, "topic_id": unknown}],
                "include_topic_authorized_operations": False,
            },
        )
        assert [(t.name, t.topic_id, t.error_code) for t in response.topics] == [
            (None, unknown, Errors.UNKNOWN_TOPIC_ID)
        ]
        known = codec.topic_id_to_uuid(h.topic_id("fresh"))
        response = await c.call(
            METADATA,
            12,
            {
                "topics": [{"name": None, "topic_id": known}],
                "include_topic_authorized_operations": False,
            },
        )
        assert response.topics[0].name == "fresh"
        # KafkaApis.handleTopicMetadataRequest: with an id asked for, the request is by ids
        # (a name beside an unknown id is not looked at; a topic named alone is left out);
        # before v12 an id is an invalid request.
        mixed = [
            {"name": "fresh", "topic_id": unknown},
            {"name": "old", "topic_id": None},
            {"name": None, "topic_id": known},
        ]
        response = await c.call(
            METADATA, 12, {"topics": mixed, "include_topic_authorized_operations": False}
        )
        assert [(t.name, t.error_code) for t in response.topics] == [
            (None, Errors.UNKNOWN_TOPIC_ID),
            ("fresh", Errors.NONE),
        ]
        response = await c.call(
            METADATA,
            10,
            {
                "topics": [{"name": "fresh", "topic_id": known}],
                "allow_auto_topic_creation": False,
                "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False,
            },
        )
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("fresh", Errors.INVALID_REQUEST)
        ]

    with mock.patch.object(TopicCreator, "create", recorded):
        run(tmp_path, test)


def test_metadata_without_auto_create_config(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        response = await c.call(METADATA, 9, metadata_values("absent"))
        assert response.topics[0].error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert h.cache.image.topic_by_name("absent") is None

    run(tmp_path, test, settings=KafkaSettings(auto_create_topics_enable=False))


def test_metadata_of_a_partition_whose_leader_is_fenced(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 3)
        registration = h.cache.image.broker(2)
        assert registration is not None
        from kcoord.raft.records import FenceBroker

        led_by_2 = h.led_partitions("t", by=2)
        h.quorum.commit([FenceBroker(2, registration.broker_epoch)])
        response = await c.call(METADATA, 9, metadata_values("t"))
        assert 2 not in {b.node_id for b in response.brokers}
        for p in response.topics[0].partitions:
            assert p.offline_replicas == (2,)
            if p.partition_index in led_by_2:
                assert (p.error_code, p.leader_id) == (Errors.LEADER_NOT_AVAILABLE, -1)

    run(tmp_path, test)


# Every operation of AclEntry.supportedOperations, as bits: no authorizer allows them all.
CLUSTER_OPERATION_BITS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
TOPIC_OPERATION_BITS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
GROUP_OPERATION_BITS = sum(1 << op for op in (3, 6, 8, 10, 11))
OMITTED = -(2**31)


@pytest.mark.parametrize("version", [8, 10, 11, 12])
def test_metadata_authorized_operations_when_asked(tmp_path: Path, version: int) -> None:
    """KafkaApis.handleTopicMetadataRequest: the topics' operations (v8+) and the cluster's
    (v8-v10) when asked for, Integer.MIN_VALUE when not."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        for asked in (False, True):
            values = {
                **metadata_values("t", "nope", auto_create=False),
                "include_cluster_authorized_operations": asked,
                "include_topic_authorized_operations": asked,
            }
            response = await c.call(METADATA, version, values)
            operations = {t.name: t.topic_authorized_operations for t in response.topics}
            bits = TOPIC_OPERATION_BITS if asked else OMITTED
            assert operations == {"t": bits, "nope": bits}
            if version >= 12:
                # An unknown topic id's entry is made apart and left without them.
                by_id = {**values, "topics": [{"name": None, "topic_id": "AAAAAAAAAAAAAAAAAAAAAQ"}]}
                unknown = (await c.call(METADATA, version, by_id)).topics[0]
                assert (unknown.error_code, unknown.topic_authorized_operations) == (
                    Errors.UNKNOWN_TOPIC_ID,
                    OMITTED,
                )
            if version <= 10:
                cluster_bits = CLUSTER_OPERATION_BITS if asked else OMITTED
                assert response.cluster_authorized_operations == cluster_bits

    run(tmp_path, test)


# ------------------------------------------------------------------ DescribeCluster


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_cluster(tmp_path: Path, version: int) -> None:
    """KIP-700's DescribeCluster: the brokers (v2: the fenced ones too when asked), the cluster
    id, the controller and, when asked, the cluster's authorized operations; a node is a
    broker endpoint only (KIP-919)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        registration = h.cache.image.broker(2)
        assert registration is not None
        h.quorum.commit([rec.FenceBroker(2, registration.broker_epoch)])

        async def describe(**values: Any) -> Any:
            body = {"include_cluster_authorized_operations": False, **values}
            return await c.call(DESCRIBE_CLUSTER, version, body)

        response = await describe()
        assert (response.error_code, response.cluster_id) == (Errors.NONE, "harness-cluster")
        assert response.controller_id == NODE_ID
        assert response.cluster_authorized_operations == OMITTED
        assert [(b.broker_id, b.host, b.port) for b in response.brokers] == [
            (1, "127.0.0.1", 9001),
            (3, "127.0.0.3", 9003),
        ]
        asked = await describe(include_cluster_authorized_operations=True)
        assert asked.cluster_authorized_operations == CLUSTER_OPERATION_BITS
        if version >= 2:
            fenced = await describe(include_fenced_brokers=True)
            assert [(b.broker_id, b.is_fenced) for b in fenced.brokers] == [
                (1, False),
                (2, True),
                (3, False),
            ]
        if version >= 1:
            assert response.endpoint_type == 1
            controller = await describe(endpoint_type=2)
            assert controller.error_code == Errors.MISMATCHED_ENDPOINT_TYPE
            assert controller.brokers == ()
            unknown = await describe(endpoint_type=7)
            assert unknown.error_code == Errors.UNSUPPORTED_ENDPOINT_TYPE
        # The active controller's broker fenced (just after a restart): clients are given an
        # alive broker, one they can connect to (KafkaApis' getRandomAliveBrokerId).
        own = h.cache.image.broker(NODE_ID)
        assert own is not None
        h.quorum.commit([rec.FenceBroker(NODE_ID, own.broker_epoch)])
        assert (await describe()).controller_id == 3
        assert (await c.call(METADATA, 12, metadata_values())).controller_id == 3

    run(tmp_path, test)


# ------------------------------------------------------------------ DescribeTopicPartitions


def describe_partitions_values(
    *names: str, limit: int = 2000, cursor: tuple[str, int] | None = None
) -> dict[str, Any]:
    return {
        "topics": [{"name": n} for n in names],
        "response_partition_limit": limit,
        "cursor": None
        if cursor is None
        else {"topic_name": cursor[0], "partition_index": cursor[1]},
    }


def test_describe_topic_partitions_pages_with_a_cursor(tmp_path: Path) -> None:
    """KIP-966's DescribeTopicPartitions: topics by name from the cursor on, at most the limit
    of partitions an answer, and the cursor of the first partition left out."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("b", 2, 1)
        await h.create_topic("a", 3, 1)

        async def page(*names: str, **values: Any) -> tuple[list[tuple[str, int]], Any]:
            body = describe_partitions_values(*names, **values)
            response = await c.call(DESCRIBE_TOPIC_PARTITIONS, 0, body)
            seen = [(t.name, p.partition_index) for t in response.topics for p in t.partitions]
            cursor = response.next_cursor
            return seen, None if cursor is None else (cursor.topic_name, cursor.partition_index)

        everything = [("a", 0), ("a", 1), ("a", 2)]
        assert await page("b", "a", limit=3) == (everything, ("b", 0))
        assert await page("b", "a", limit=4) == ([*everything, ("b", 0)], ("b", 1))
        assert await page("b", "a", limit=4, cursor=("b", 1)) == ([("b", 1)], None)
        assert await page("a", limit=2, cursor=("a", 1)) == ([("a", 1), ("a", 2)], None)
        # No topics named: every topic, the internal one too ("_" sorts before "a").
        offsets = [(OFFSETS_TOPIC_NAME, i) for i in range(OFFSETS_PARTITIONS)]
        last = OFFSETS_PARTITIONS - 1
        assert await page(limit=last) == (offsets[:last], (OFFSETS_TOPIC_NAME, last))
        rest = [offsets[last], *everything, ("b", 0), ("b", 1)]
        assert await page(cursor=(OFFSETS_TOPIC_NAME, last)) == (rest, None)
        # At least one partition an answer, so that paging always gets on.
        assert await page("a", "b", limit=0) == ([("a", 0)], ("a", 1))
        assert await page("a", "b", limit=-1, cursor=("a", 2)) == ([("a", 2)], ("b", 0))

    run(tmp_path, test)


def test_describe_topic_partitions_answers_elr_and_kafka_errors(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 3)
        h.change_partition("t", 0, isr=(NODE_ID,), elr=(2,), last_known_elr=(3,))
        response = await c.call(
            DESCRIBE_TOPIC_PARTITIONS, 0, describe_partitions_values("t", "nope", "bad/name")
        )
        topics = {t.name: t for t in response.topics}
        assert [t.name for t in response.topics] == ["bad/name", "nope", "t"]  # sorted
        assert topics["nope"].error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert topics["bad/name"].error_code == Errors.INVALID_TOPIC_EXCEPTION
        t = topics["t"]
        assert (t.error_code, t.topic_id) == (Errors.NONE, codec.topic_id_to_uuid(h.topic_id("t")))
        assert t.topic_authorized_operations == TOPIC_OPERATION_BITS
        (p,) = t.partitions
        assert (p.isr_nodes, p.eligible_leader_replicas, p.last_known_elr) == ((1,), (2,), (3,))
        assert p.replica_nodes == (1, 2, 3) and p.offline_replicas == ()
        # The cursor's topic must be one of the named ones.
        refused = await c.call(
            DESCRIBE_TOPIC_PARTITIONS, 0, describe_partitions_values("t", cursor=("other", 0))
        )
        assert [(t.name, t.error_code) for t in refused.topics] == [("t", Errors.INVALID_REQUEST)]
        # And the cursor's partition must not be negative.
        refused = await c.call(
            DESCRIBE_TOPIC_PARTITIONS, 0, describe_partitions_values("t", cursor=("t", -1))
        )
        assert [(t.name, t.error_code) for t in refused.topics] == [("t", Errors.INVALID_REQUEST)]

    run(tmp_path, test)


# ------------------------------------------------------------------ topic admin


def create_values(*topics: tuple[str, int, int], validate_only: bool = False) -> dict[str, Any]:
    return {
        "topics": [
            {
                "name": name,
                "num_partitions": partitions,
                "replication_factor": rf,
                "assignments": [],
                "configs": [{"name": "retention.ms", "value": "1000"}],
            }
            for name, partitions, rf in topics
        ],
        "timeout": 5000,
        "validate_only": validate_only,
    }


def test_create_topics_is_visible_at_once_with_kafka_errors(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        response = await c.call(
            CREATE_TOPICS,
            7,
            create_values(("a", 2, 1), ("b", 1, 4), ("c", 0, 1), ("a", 1, 1)),
        )
        results = {t.name: t for t in response.topics}
        assert results["a"].error_code == Errors.INVALID_REQUEST  # named twice
        assert results["b"].error_code == Errors.INVALID_REPLICATION_FACTOR
        assert results["c"].error_code == Errors.INVALID_PARTITIONS
        assert all(r.error_message for r in results.values())
        # Over 10,000 partitions in one request: every topic is refused.
        response = await c.call(CREATE_TOPICS, 7, create_values(("d", 20_000, 1), ("g", 1, 1)))
        assert {(t.name, t.error_code) for t in response.topics} == {
            ("d", Errors.POLICY_VIOLATION),
            ("g", Errors.POLICY_VIOLATION),
        }
        response = await c.call(CREATE_TOPICS, 7, create_values(("e", 2, 2)))
        (e,) = response.topics
        assert (e.error_code, e.num_partitions, e.replication_factor) == (0, 2, 2)
        assert e.topic_id == codec.topic_id_to_uuid(h.topic_id("e"))
        # Every config of the new topic (KIP-525), its own retention.ms among them.
        assert ("retention.ms", "1000") in [(cfg.name, cfg.value) for cfg in e.configs or ()]
        metadata = await c.call(METADATA, 12, metadata_values("e", auto_create=False))
        assert len(metadata.topics[0].partitions) == 2
        again = await c.call(CREATE_TOPICS, 2, create_values(("e", 2, 2)))
        assert again.topics[0].error_code == Errors.TOPIC_ALREADY_EXISTS
        dry = await c.call(CREATE_TOPICS, 7, create_values(("f", 2, 1), validate_only=True))
        assert dry.topics[0].error_code == Errors.NONE
        # The id it would have had, as Kafka answers one: it was all zeros.
        assert dry.topics[0].topic_id not in (None, uuid.UUID(int=0))
        assert h.cache.image.topic_by_name("f") is None
        # A manual assignment (kafka-topics --replica-assignment): the replicas as given.
        manual = create_values(("m", -1, -1))
        manual["topics"][0]["assignments"] = [
            {"partition_index": 1, "broker_ids": [NODE_ID]},
            {"partition_index": 0, "broker_ids": [NODE_ID]},
        ]
        (m,) = (await c.call(CREATE_TOPICS, 7, manual)).topics
        assert (m.error_code, m.num_partitions, m.replication_factor) == (0, 2, 1)
        placed = h.cache.image.partitions_of(h.topic_id("m"))
        assert [(p.replicas, p.leader) for p in placed] == [((NODE_ID,), NODE_ID)] * 2
        (again_m,) = (await c.call(CREATE_TOPICS, 7, manual)).topics
        assert again_m.error_code == Errors.TOPIC_ALREADY_EXISTS

    run(tmp_path, test)


def test_a_metadata_batch_too_large_for_the_quorum_is_refused_at_once(tmp_path: Path) -> None:
    """A CreateTopics whose batch no voter would take (topics with long config values): the
    quorum's refusal read as a lost leadership, and the controller decided and encoded it
    again every few hundred ms until the client's timeout, answered REQUEST_TIMED_OUT (found
    by a review). It is RECORD_LIST_TOO_LARGE at once, as Kafka's
    RecordBatchTooLargeException, and the controller stays active."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        proposed: list[int] = []
        propose = h.quorum.propose

        def refusing(records: Any, on_done: Any, *, epoch: int) -> None:
            if any(isinstance(r, rec.Topic) and r.name == "huge" for r in records):
                proposed.append(len(records))
                raise BatchTooLargeError("a metadata batch of 40000000 bytes is too large")
            propose(records, on_done, epoch=epoch)

        h.quorum.propose = refusing  # type: ignore[method-assign]
        values = create_values(("huge", 1, 1))
        values["timeout"] = 30_000
        async with asyncio.timeout(10):
            response = await c.call(CREATE_TOPICS, 7, values)
        assert response.topics[0].error_code == Errors.RECORD_LIST_TOO_LARGE
        assert len(proposed) == 1
        assert h.controller.is_active
        fine = await c.call(CREATE_TOPICS, 7, create_values(("fine", 1, 1)))
        assert fine.topics[0].error_code == Errors.NONE

    run(tmp_path, test)


def test_create_partitions_and_delete_topics(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("grow", 2, 1)
        response = await c.call(
            CREATE_PARTITIONS,
            3,
            {
                "topics": [
                    {"name": "grow", "count": 5, "assignments": None},
                    {"name": "missing", "count": 5, "assignments": None},
                    {"name": OFFSETS_TOPIC_NAME, "count": 60, "assignments": None},
                ],
                "timeout": 5000,
                "validate_only": False,
            },
        )
        assert [(r.name, r.error_code) for r in response.results] == [
            ("grow", Errors.NONE),
            ("missing", Errors.UNKNOWN_TOPIC_OR_PARTITION),
            (OFFSETS_TOPIC_NAME, Errors.INVALID_PARTITIONS),
        ]
        assert len(h.cache.image.partitions_of(h.topic_id("grow"))) == 5
        shrink = await c.call(
            CREATE_PARTITIONS,
            0,
            {
                "topics": [{"name": "grow", "count": 3, "assignments": None}],
                "timeout": 5000,
                "validate_only": False,
            },
        )
        assert shrink.results[0].error_code == Errors.INVALID_PARTITIONS
        assert "would not be an increase" in shrink.results[0].error_message
        # Delete by name (v4) and by id (v6).
        await h.create_topic("gone", 1, 1)
        gone_id = codec.topic_id_to_uuid(h.topic_id("gone"))
        response = await c.call(
            DELETE_TOPICS,
            4,
            {"topic_names": ["grow", "missing", OFFSETS_TOPIC_NAME], "timeout": 5000},
        )
        assert sorted((r.name, r.error_code) for r in response.responses) == [
            (OFFSETS_TOPIC_NAME, Errors.INVALID_REQUEST),
            ("grow", Errors.NONE),
            ("missing", Errors.UNKNOWN_TOPIC_OR_PARTITION),
        ]
        response = await c.call(
            DELETE_TOPICS,
            6,
            {
                "topics": [
                    {"name": None, "topic_id": gone_id},
                    {"name": None, "topic_id": uuid.uuid4()},
                ],
                "timeout": 5000,
            },
        )
        assert sorted((r.name or "", r.error_code) for r in response.responses) == [
            ("", Errors.UNKNOWN_TOPIC_ID),
            ("gone", Errors.NONE),
        ]
        assert h.cache.image.topic_by_name("grow") is None
        assert h.cache.image.topic_by_name("gone") is None
        # Entries named twice (ControllerApis.deleteTopics): the same id twice is refused
        # once and not deleted; a topic named by id and by name is not deleted, its name
        # refused and its id not answered; the same name twice is refused and not deleted.
        await h.create_topic("twice", 1, 1)
        await h.create_topic("both", 1, 1)
        twice_id = codec.topic_id_to_uuid(h.topic_id("twice"))
        both_id = codec.topic_id_to_uuid(h.topic_id("both"))
        response = await c.call(
            DELETE_TOPICS,
            6,
            {
                "topics": [
                    {"name": None, "topic_id": twice_id},
                    {"name": None, "topic_id": twice_id},
                    {"name": None, "topic_id": both_id},
                    {"name": "both", "topic_id": uuid.UUID(int=0)},
                    {"name": "missing", "topic_id": uuid.UUID(int=0)},
                    {"name": "missing", "topic_id": uuid.UUID(int=0)},
                ],
                "timeout": 5000,
            },
        )
        assert sorted(
            (r.name or "", r.topic_id == twice_id, r.error_code, r.error_message or "")
            for r in response.responses
        ) == [
            ("", True, Errors.INVALID_REQUEST, "Duplicate topic id."),
            (
                "both",
                False,
                Errors.INVALID_REQUEST,
                "The provided topic name maps to an ID that was already supplied.",
            ),
            ("missing", False, Errors.INVALID_REQUEST, "Duplicate topic name."),
        ]
        assert h.cache.image.topic_by_name("twice") is not None
        assert h.cache.image.topic_by_name("both") is not None

    run(tmp_path, test)


def test_a_topic_deleted_by_an_old_id_is_looked_up_on_the_controller(tmp_path: Path) -> None:
    """DeleteTopics by id: the node that takes it may be behind the log. When the topic was
    deleted and re-created under its name meanwhile, the old id is UNKNOWN_TOPIC_ID and the
    new topic stays (ControllerApis.deleteTopics looks ids up on the controller); turning the
    id into a name on the node deleted the new topic."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("reborn", 1, 1)
        old_id = codec.topic_id_to_uuid(h.topic_id("reborn"))
        channel = h.broker.ctx.controller
        call = channel.call

        async def recreated_on_the_way(method: str, payload: Any, timeout_s: float) -> Any:
            if method == "DeleteTopics":
                await h.controller.handle_delete_topics({"names": ["reborn"]})
                await h.create_topic("reborn", 1, 1)
            return await call(method, payload, timeout_s)

        channel.call = recreated_on_the_way  # type: ignore[method-assign]
        response = await c.call(
            DELETE_TOPICS, 6, {"topics": [{"name": None, "topic_id": old_id}], "timeout": 5000}
        )
        (r,) = response.responses
        assert (r.name, r.topic_id, r.error_code) == (None, old_id, Errors.UNKNOWN_TOPIC_ID)
        new_id = codec.topic_id_to_uuid(h.topic_id("reborn"))
        assert new_id != old_id
        # By name, the controller's id is answered.
        channel.call = call  # type: ignore[method-assign]
        response = await c.call(
            DELETE_TOPICS,
            6,
            {"topics": [{"name": "reborn", "topic_id": uuid.UUID(int=0)}], "timeout": 5000},
        )
        (r,) = response.responses
        assert (r.name, r.topic_id, r.error_code) == ("reborn", new_id, Errors.NONE)
        assert h.cache.image.topic_by_name("reborn") is None

    run(tmp_path, test)


# ------------------------------------------------------------------ Produce and Fetch


def test_a_produce_by_topic_id_never_lands_in_a_topic_recreated_meanwhile(
    tmp_path: Path,
) -> None:
    """Produce v13 names the topic by id; its append comes after awaits (producer state,
    off-loop reads). A topic deleted and created again under the name meanwhile is another:
    UNKNOWN_TOPIC_ID, nothing appended (ReplicaManager.getPartitionOrException)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("reborn", 3, 3)
        (p, *_) = h.led_partitions("reborn")
        old_id = codec.topic_id_to_uuid(h.topic_id("reborn"))
        produce = h.broker.produce
        ready = produce._producer_state_ready

        async def recreated_on_the_way(topic: str, index: int) -> None:
            produce._producer_state_ready = ready  # type: ignore[method-assign]
            await h.controller.handle_delete_topics({"names": ["reborn"]})
            await h.create_topic("reborn", 3, 3)
            assert p in h.led_partitions("reborn")
            await ready(topic, index)

        produce._producer_state_ready = recreated_on_the_way  # type: ignore[method-assign]
        values = produce_values("reborn", p, batch([b"old"]))
        values["topic_data"][0] = {
            "topic_id": old_id,
            "partition_data": values["topic_data"][0]["partition_data"],
        }
        response = await c.call(PRODUCE, 13, values)
        assert only_partition(response).error_code == Errors.UNKNOWN_TOPIC_ID
        hosted = h.replicas.get_partition("reborn", p)
        assert hosted is not None and hosted.log.log_end_offset == 0

    run(tmp_path, test)


def test_an_unknown_topic_id_is_one_lookup_not_a_walk_of_every_topic(tmp_path: Path) -> None:
    """A topic id is the base64 of its UUID, so an id is found, or not, by one lookup (Kafka's
    ``topicIdsToNames``): trying every topic's id for each unknown one held the loop 38 ms per
    id with 5,000 topics, and one Fetch naming thousands of unknown ids stalled the node."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        known = codec.topic_id_to_uuid(h.topic_id("t"))
        image = h.cache.image
        walked: list[str] = []
        topics = type(image).topics

        def watched(self: Any) -> Any:
            walked.append("topics")
            return topics.__get__(self)

        with mock.patch.object(type(image), "topics", property(watched)):
            assert h.broker.ctx.topic_by_uuid(uuid.uuid4()) is None
            found = h.broker.ctx.topic_by_uuid(known)
        assert found is not None and found.name == "t"
        assert walked == []

    run(tmp_path, test)


def test_an_unexpected_append_failure_fails_its_partition_alone(tmp_path: Path) -> None:
    """A failure no handler names is that partition's UNKNOWN_SERVER_ERROR, logged (Kafka's
    ``ReplicaManager.handleAppendError``): it failed the whole request, whose partitions
    appended before it were then answered failed too, and resent (duplicates)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 6, 1)
        first, second = h.led_partitions("t")[:2]
        append = h.replicas.append_local

        def failing(part: Partition, *args: Any, **kwargs: Any) -> Any:
            if part.partition == second:
                raise RuntimeError("boom")
            return append(part, *args, **kwargs)

        h.replicas.append_local = failing  # type: ignore[method-assign]
        values = produce_values("t", first, batch([b"a"]), acks=1)
        values["topic_data"][0]["partition_data"].append(
            {"index": second, "records": batch([b"b"])}
        )
        response = await c.call(PRODUCE, 9, values)
        answers = {p.index: p for p in response.responses[0].partition_responses}
        assert (answers[first].error_code, answers[first].base_offset) == (Errors.NONE, 0)
        assert answers[second].error_code == Errors.UNKNOWN_SERVER_ERROR
        assert answers[second].log_start_offset == 0
        h.replicas.append_local = append  # type: ignore[method-assign]
        again = await c.call(PRODUCE, 9, produce_values("t", second, batch([b"b"]), acks=1))
        assert only_partition(again).error_code == Errors.NONE

    run(tmp_path, test)


def test_produce_then_fetch_and_errors(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 1)
        mine = h.led_partitions("t")[0]
        other = h.led_partitions("t", by=2)[0]
        for version in (3, 7, 9, 10, 12):
            response = await c.call(
                PRODUCE, version, produce_values("t", mine, batch([b"a", b"b"]))
            )
            part = only_partition(response)
            assert part.error_code == Errors.NONE
        assert part.base_offset == 8
        fetched = await c.call(FETCH, 12, fetch_values("t", mine, 0))
        part = only_partition(fetched)
        assert (part.error_code, part.high_watermark, part.log_start_offset) == (0, 10, 0)
        assert records_of(part.records) == [b"a", b"b"] * 5
        # Not the leader: the hint names the leader and its endpoint (KIP-951).
        response = await c.call(PRODUCE, 10, produce_values("t", other, batch([b"x"])))
        part = only_partition(response)
        assert part.error_code == Errors.NOT_LEADER_OR_FOLLOWER
        assert part.current_leader.leader_id == 2
        assert [(n.node_id, n.host, n.port) for n in response.node_endpoints] == [
            (2, "127.0.0.2", 9002)
        ]
        fetched = await c.call(FETCH, 16, fetch_values("t", other, 0, topic_id=h.topic_id("t")))
        part = only_partition(fetched)
        assert (part.error_code, part.current_leader.leader_id) == (
            Errors.NOT_LEADER_OR_FOLLOWER,
            2,
        )
        assert [n.node_id for n in fetched.node_endpoints] == [2]
        # Below v16 Kafka leaves the hint unset: the field exists from v12, the endpoints only
        # from v16, and a client told of a leader it has no address for cannot use it.
        fetched = await c.call(FETCH, 12, fetch_values("t", other, 0))
        part = only_partition(fetched)
        assert part.error_code == Errors.NOT_LEADER_OR_FOLLOWER
        assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (-1, -1)
        # Other refusals.
        for topic, partition, records, acks, error in [
            ("nope", 0, batch([b"x"]), -1, Errors.UNKNOWN_TOPIC_OR_PARTITION),
            ("t", 99, batch([b"x"]), -1, Errors.UNKNOWN_TOPIC_OR_PARTITION),
            (OFFSETS_TOPIC_NAME, 0, batch([b"x"]), -1, Errors.INVALID_TOPIC_EXCEPTION),
            ("t", mine, batch([b"x"])[:-1] + b"?", -1, Errors.CORRUPT_MESSAGE),
            ("t", mine, batch([b"x"])[:30], 1, Errors.INVALID_RECORD),  # no whole batch
            ("t", mine, b"", 1, Errors.INVALID_RECORD),
            ("t", mine, batch([b"x"]) + batch([b"y"]), 1, Errors.INVALID_RECORD),
            (
                "t",
                mine,
                batch([b"x"])[:16] + b"\x01" + batch([b"x"])[17:],
                1,
                Errors.INVALID_RECORD,
            ),
            ("t", mine, batch([b"x"]), 2, Errors.INVALID_REQUIRED_ACKS),
            ("t", mine, compressed_claiming(1_000), 1, Errors.INVALID_RECORD),
            ("t", mine, compressed_claiming(3, garbage=True), 1, Errors.CORRUPT_MESSAGE),
            ("t", mine, zstd_bomb(), 1, Errors.CORRUPT_MESSAGE),
        ]:
            response = await c.call(PRODUCE, 9, produce_values(topic, partition, records, acks))
            assert only_partition(response).error_code == error, (topic, partition, acks)
        fetched = await c.call(FETCH, 11, fetch_values("t", mine, 11))
        assert only_partition(fetched).error_code == Errors.OFFSET_OUT_OF_RANGE
        fetched = await c.call(FETCH, 11, fetch_values("t", mine, 0, current_leader_epoch=5))
        assert only_partition(fetched).error_code == Errors.UNKNOWN_LEADER_EPOCH
        fetched = await c.call(FETCH, 11, fetch_values("t", mine, 0, session_epoch=3))
        assert fetched.error_code == Errors.FETCH_SESSION_ID_NOT_FOUND
        unknown = await c.call(FETCH, 13, fetch_values("", 0, 0, topic_id="AAAAAAAAAAAAAAAAAAAAAQ"))
        assert only_partition(unknown).error_code == Errors.UNKNOWN_TOPIC_ID

    run(tmp_path, test)


def test_a_produced_partitions_batches_are_found_as_kafkas_reader_finds_them(
    tmp_path: Path,
) -> None:
    """ByteBufferLogInputStream stops at a batch cut short, so that no batch is found
    (INVALID_RECORD, which a producer does not retry: kcoord answered CORRUPT_MESSAGE, which
    it retries until its delivery timeout), and leaves out bytes after the batch too few to be
    another, which UnifiedLog.trimInvalidBytes drops (kcoord refused the batch); a size below
    any record's or an unknown magic is CORRUPT_MESSAGE (nextBatchSize)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        sound = batch([b"x"])
        tiny_size = bytearray(sound)
        tiny_size[8:12] = (13).to_bytes(4, "big")
        for records, error in [
            (sound[:-3], Errors.INVALID_RECORD),
            (sound[:16], Errors.INVALID_RECORD),  # not even a size and a magic
            (bytes(tiny_size), Errors.CORRUPT_MESSAGE),
            (sound[:16] + b"\x03" + sound[17:], Errors.CORRUPT_MESSAGE),
            (sound[:16] + b"\xff" + sound[17:], Errors.CORRUPT_MESSAGE),  # a negative byte
        ]:
            part = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, records)))
            assert (part.error_code, part.log_start_offset) == (error, -1), records[:20]
        for tail in (b"\0" * 5, b"\0" * 16, sound[:40]):
            part = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, sound + tail)))
            assert part.error_code == Errors.NONE, tail
        fetched = await c.call(FETCH, 11, fetch_values("t", 0, 0))
        records = only_partition(fetched).records
        held = list(fmt.iter_headers(records))
        assert [h.base_offset for _, h in held] == [0, 1, 2]
        # Each the batch sent, from its magic on (the leader stamps its epoch before it).
        assert all(records[p + 16 : p + h.size] == sound[16:] for p, h in held)

    run(tmp_path, test)


def _with_crc(sent: bytearray) -> bytes:
    data = bytearray(sent)
    data[fmt.CRC_OFFSET : fmt.CRC_OFFSET + 4] = fmt.compute_crc(data, 0, len(data)).to_bytes(
        4, "big"
    )
    return bytes(data)


def test_a_produced_batch_is_checked_before_its_producer_state(tmp_path: Path) -> None:
    """UnifiedLog.append validates a batch (analyzeAndValidateRecords, LogValidator) before its
    producer's state: a retry of an appended batch with a broken CRC was answered as a
    duplicate, and a batch both out of order and out of time OUT_OF_ORDER_SEQUENCE_NUMBER
    (the Java producer bumps its epoch for that). Failures past the request's own checks
    carry the partition's log start, but for a few (ReplicaManager.processFailedRecord)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        init = await c.call(
            INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60_000}
        )
        pid = init.producer_id

        def idem(seq: int, *values: bytes, timestamp: int = 1_700_000_000_000) -> bytes:
            return batch(
                list(values),
                producer_id=pid,
                producer_epoch=0,
                base_sequence=seq,
                timestamp=timestamp,
            )

        async def produce(records: bytes) -> Any:
            return only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, records)))

        assert (await produce(idem(0, b"a"))).error_code == Errors.NONE
        assert h.replicas.leader_partition("t", 0).log.maybe_increment_log_start_offset(1)
        broken = await produce(idem(0, b"a")[:-1] + b"?")
        assert (broken.error_code, broken.log_start_offset) == (Errors.CORRUPT_MESSAGE, -1)
        ahead = h.clock[0] + 10 * 3600 * 1000
        late = await produce(idem(5, b"b", timestamp=ahead))
        assert (late.error_code, late.log_start_offset) == (Errors.INVALID_TIMESTAMP, 1)
        gap = await produce(idem(5, b"b"))
        assert (gap.error_code, gap.log_start_offset) == (Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, 1)
        retry = await produce(idem(0, b"a"))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        # The request's own refusals (ProduceRequest.validateRecords) carry none, by topic id
        # (v13) too.
        values = produce_values("t", 0, batch([b"x"]) + batch([b"y"]))
        values["topic_data"][0] = {
            "topic_id": h.topic_id("t"),
            "partition_data": values["topic_data"][0]["partition_data"],
        }
        two = only_partition(await c.call(PRODUCE, 13, values))
        assert (two.error_code, two.log_start_offset) == (Errors.INVALID_RECORD, -1)

    run(tmp_path, test)


def test_a_sound_batch_with_a_negative_offset_range_count_or_base_is_an_invalid_record(
    tmp_path: Path,
) -> None:
    """LogValidator.validateBatch and analyzeAndValidateRecords refuse these with
    INVALID_RECORD, which a producer does not retry; kcoord answered CORRUPT_MESSAGE
    (retriable) for a batch whose CRC holds. One whose CRC does not hold stays CORRUPT."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        sound = bytearray(batch([b"x"]))
        negative_delta = bytearray(sound)
        negative_delta[23:27] = (-1).to_bytes(4, "big", signed=True)
        negative_count = bytearray(sound)
        negative_count[fmt.HEADER_SIZE - 4 : fmt.HEADER_SIZE] = (-2).to_bytes(4, "big", signed=True)
        negative_base = bytearray(sound)
        negative_base[0:8] = (-5).to_bytes(8, "big", signed=True)
        for records, error in [
            (_with_crc(negative_delta), Errors.INVALID_RECORD),
            (_with_crc(negative_count), Errors.INVALID_RECORD),
            (bytes(negative_base), Errors.INVALID_RECORD),  # the base offset is outside the CRC
            (bytes(negative_delta), Errors.CORRUPT_MESSAGE),  # the CRC does not hold
        ]:
            part = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, records)))
            # LogValidator's refusals carry the log start (processFailedRecord).
            start = 0 if error is Errors.INVALID_RECORD else -1
            assert (part.error_code, part.log_start_offset) == (error, start), records[:30]

    run(tmp_path, test)


def test_a_compressed_batch_whose_records_skip_offsets_is_rebuilt(tmp_path: Path) -> None:
    """Kafka's LogValidator rebuilds a compressed batch whose records' offsets are not 0, 1,
    2, ... (older clients wrote them so): kcoord stored it as sent, and a consumer read offsets
    0 and 5 from a batch covering 0-1, then skipped 2-5 of the next batches."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        ts = 1_700_000_000_000
        gappy = bytearray(
            fmt.build_batch(
                [fmt.Record(0, ts, None, b"a"), fmt.Record(5, ts, None, b"b")],
                compression=fmt.Compression.GZIP,
            )
        )
        gappy[23:27] = (1).to_bytes(4, "big")  # last offset delta: two records
        for version in (9, 3):
            response = await c.call(PRODUCE, version, produce_values("t", 0, _with_crc(gappy)))
            assert only_partition(response).error_code == Errors.NONE
        response = await c.call(PRODUCE, 9, produce_values("t", 0, batch([b"c"])))
        assert only_partition(response).base_offset == 4
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("t", 0, 0)))
        records = [
            (r.offset, r.value)
            for pos, _ in fmt.iter_headers(fetched.records)
            for r in fmt.decode_records(fetched.records, pos)
        ]
        assert records == [(0, b"a"), (1, b"b"), (2, b"a"), (3, b"b"), (4, b"c")]

    run(tmp_path, test)


def test_a_partition_named_twice_in_a_produce_is_appended_once_with_its_last_batch(
    tmp_path: Path,
) -> None:
    """KafkaApis.handleProduceRequest keys the partitions by topic partition (a map): the
    last entry's records are the ones appended, and the partition is answered once."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        values = produce_values("t", 0, batch([b"a"]))
        values["topic_data"] = [
            {"name": "t", "partition_data": [{"index": 0, "records": batch([b"a"])}]},
            {
                "name": "t",
                "partition_data": [
                    {"index": 0, "records": batch([b"b"])},
                    {"index": 0, "records": batch([b"c", b"d"])},
                ],
            },
        ]
        part = only_partition(await c.call(PRODUCE, 9, values))
        assert (part.error_code, part.base_offset) == (Errors.NONE, 0)
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("t", 0, 0)))
        assert (fetched.high_watermark, records_of(fetched.records)) == (2, [b"c", b"d"])

    run(tmp_path, test)


def test_produce_and_fetch_by_topic_id(tmp_path: Path) -> None:
    """Produce v13 and Fetch v13+ name topics by id only (KIP-516)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        topic_id = codec.topic_id_to_uuid(h.topic_id("t"))
        response = await c.call(
            PRODUCE,
            13,
            {
                "acks": 1,
                "timeout": 1000,
                "topic_data": [
                    {
                        "topic_id": topic_id,
                        "partition_data": [{"index": 0, "records": batch([b"by-id"])}],
                    }
                ],
            },
        )
        assert response.responses[0].topic_id == topic_id
        assert only_partition(response).error_code == Errors.NONE
        unknown = await c.call(
            PRODUCE,
            13,
            {
                "acks": 1,
                "timeout": 1000,
                "topic_data": [
                    {
                        "topic_id": uuid.uuid4(),
                        "partition_data": [{"index": 0, "records": batch([b"x"])}],
                    }
                ],
            },
        )
        assert only_partition(unknown).error_code == Errors.UNKNOWN_TOPIC_ID
        for version in (13, 16, 18):
            fetched = await c.call(FETCH, version, fetch_values("", 0, 0, topic_id=h.topic_id("t")))
            assert fetched.responses[0].topic_id == topic_id
            assert records_of(only_partition(fetched).records) == [b"by-id"]

    run(tmp_path, test)


def test_metadata_names_once_no_internal_creation_and_a_bounded_wait(tmp_path: Path) -> None:
    """handleTopicMetadataRequest answers a set of topics (a name asked twice, once);
    Topic.isInternal names are not auto-created (kcoord has no transaction coordinator to make
    __transaction_state); a controller that does not answer holds the connection for the
    answer's short wait only (Kafka's AutoTopicCreationManager does not hold it at all), not
    for the creation's whole timeout."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        twice = await c.call(METADATA, 12, metadata_values("t", "t"))
        assert [t.name for t in twice.topics] == ["t"]
        internal = await c.call(METADATA, 12, metadata_values("__transaction_state"))
        assert internal.topics[0].error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert internal.topics[0].is_internal  # Topic.isInternal, on an error entry too
        assert h.cache.image.topic_by_name("__transaction_state") is None

        async def away(*_args: Any, **_kwargs: Any) -> Any:
            await asyncio.Event().wait()  # the controller never answers

        h.broker.ctx.controller.call = away  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        start = loop.time()
        slow = await asyncio.wait_for(c.call(METADATA, 12, metadata_values("later")), 12)
        # AutoTopicCreationManager's answer to a topic it asked for (it was LEADER_NOT_AVAILABLE).
        assert slow.topics[0].error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        # The answer waits 0.5 s, the creation 10 s: room for a loaded machine between them.
        assert loop.time() - start < 8, "the answer waited for the whole creation timeout"

    run(tmp_path, test)


def test_concurrent_metadata_requests_create_a_topic_once(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        clients = [await h.client() for _ in range(5)]
        responses = await asyncio.gather(
            *(other.call(METADATA, 12, metadata_values("shared")) for other in clients)
        )
        for other in clients:
            await other.close()
        ids = {r.topics[0].topic_id for r in responses}
        assert all(r.topics[0].error_code == Errors.NONE for r in responses)
        assert len(ids) == 1 and len(responses[0].topics[0].partitions) == 3

    run(tmp_path, test)


def test_fetch_respects_max_bytes_but_returns_a_whole_first_batch(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        for i in range(3):
            await c.call(PRODUCE, 9, produce_values("t", 0, batch([bytes([i]) * 1000])))
        one = await c.call(FETCH, 12, fetch_values("t", 0, 0, max_bytes=10))
        assert records_of(only_partition(one).records) == [b"\x00" * 1000]
        two = await c.call(FETCH, 12, fetch_values("t", 0, 0, partition_max_bytes=2200))
        assert len(records_of(only_partition(two).records)) == 2

    run(tmp_path, test)


def test_a_partition_named_twice_in_a_fetch_is_answered_once(tmp_path: Path) -> None:
    """FetchRequest.fetchData is a map by partition: the last entry's offset, at the first
    entry's place; a topic named apart again is listed again (FetchResponse.of). Read twice,
    the same records came back twice in one response."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 1)
        await h.create_topic("u", 3, 1)
        mine_t, mine_u = h.led_partitions("t")[0], h.led_partitions("u")[0]
        for value in (b"a", b"b"):
            await c.call(PRODUCE, 9, produce_values("t", mine_t, batch([value])))
        await c.call(PRODUCE, 9, produce_values("u", mine_u, batch([b"c"])))
        values = fetch_values("t", mine_t, 0)
        (t,) = values["topics"]
        u = fetch_values("u", mine_u, 0)["topics"][0]
        later = {**t, "partitions": [{**t["partitions"][0], "fetch_offset": 1}]}
        values["topics"] = [t, u, later, u]
        fetched = await c.call(FETCH, 12, values)
        shown = [
            (topic.topic, [(p.partition_index, records_of(p.records)) for p in topic.partitions])
            for topic in fetched.responses
        ]
        assert shown == [("t", [(mine_t, [b"b"])]), ("u", [(mine_u, [b"c"])])]

    run(tmp_path, test)


def test_fetch_long_poll_wakes_on_produce_and_times_out(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        started = time.monotonic()
        empty = await c.call(FETCH, 12, fetch_values("t", 0, 0, max_wait_ms=300))
        assert time.monotonic() - started >= 0.25
        assert only_partition(empty).records in (None, b"")
        # A waiting fetch, then Metadata pipelined behind it on the same connection.
        started = time.monotonic()
        fetch_id = await c.send(FETCH, 12, fetch_values("t", 0, 0, max_wait_ms=10_000))
        metadata_id = await c.send(METADATA, 9, metadata_values("t"))
        producer = await h.client()
        await producer.call(PRODUCE, 9, produce_values("t", 0, batch([b"wake"])))
        await producer.close()
        correlation_id, fetched = await c.receive(FETCH, 12)
        assert correlation_id == fetch_id
        assert time.monotonic() - started < 5
        assert records_of(only_partition(fetched).records) == [b"wake"]
        correlation_id, _ = await c.receive(METADATA, 9)
        assert correlation_id == metadata_id

    run(tmp_path, test)


def test_a_long_poll_reads_the_log_when_it_comes_and_when_it_is_answered(
    tmp_path: Path,
) -> None:
    """Records waiting below ``min_bytes``: the fetch reads them when it comes and once more
    when it is answered. Between, it looks at their positions only (Kafka's
    tryCompleteElseWatch); it read and CRC-checked them a third time as it began to wait."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        one = batch([b"x" * 1000])
        await c.call(PRODUCE, 9, produce_values("t", 0, one))
        values = fetch_values("t", 0, 0, max_wait_ms=100, min_bytes=10 * len(one))
        reads = mock.patch.object(h.broker.ctx.replicas, "fetch", wraps=h.broker.ctx.replicas.fetch)
        with reads as counted:
            fetched = await c.call(FETCH, 12, values)
        assert len(records_of(only_partition(fetched).records)) == 1
        assert counted.call_count == 2

    run(tmp_path, test)


def test_a_long_poll_reads_the_log_only_once_min_bytes_are_waiting(tmp_path: Path) -> None:
    """DelayedFetch.tryComplete: a fetch waiting for ``min_bytes`` adds up the bytes below
    the high watermark from their positions at each wake, and reads them once they are
    enough. It read (and CRC-checked) everything waiting at every produce."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        one = batch([b"x" * 1000])
        fetch_id = await c.send(
            FETCH, 12, fetch_values("t", 0, 0, max_wait_ms=10_000, min_bytes=20 * len(one))
        )
        producer = await h.client()
        reads = mock.patch.object(h.broker.ctx.replicas, "fetch", wraps=h.broker.ctx.replicas.fetch)
        with reads as counted:
            for _ in range(25):
                await producer.call(PRODUCE, 9, produce_values("t", 0, one))
            correlation_id, fetched = await c.receive(FETCH, 12)
        await producer.close()
        assert correlation_id == fetch_id
        assert len(records_of(only_partition(fetched).records)) >= 20
        assert counted.call_count <= 2, counted.call_count

    run(tmp_path, test)


def test_a_fetch_asks_for_at_most_the_brokers_fetch_max_bytes(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        one = batch([b"x" * 1000])
        for _ in range(10):
            await c.call(PRODUCE, 9, produce_values("t", 0, one))
        values = fetch_values("t", 0, 0, max_bytes=2**31 - 1, partition_max_bytes=2**31 - 1)
        with mock.patch.object(fetch_module, "FETCH_MAX_BYTES", 3 * len(one)):
            fetched = await c.call(FETCH, 12, values)
            assert len(records_of(only_partition(fetched).records)) == 3
            # min_bytes is capped with it (KafkaApis): answered at once, not after max_wait.
            values = fetch_values("t", 0, 0, max_wait_ms=10_000, min_bytes=5 * len(one))
            fetched = await asyncio.wait_for(c.call(FETCH, 12, values), 5)
            assert len(records_of(only_partition(fetched).records)) == 3

    run(tmp_path, test)


def test_a_consumer_whose_last_fetched_epoch_diverges_is_told_where_it_ends(
    tmp_path: Path,
) -> None:
    """KIP-320, Partition.fetchRecords: a consumer (Fetch v12+) sends the epoch of its last
    fetched records; when that epoch ends here before its position (an unclean election
    truncated what it read), it gets no records but the epoch and end offset to truncate to,
    at once, even from a long poll."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        for _ in range(3):
            await c.call(PRODUCE, 9, produce_values("t", 0, batch([b"old"])))
        h.move_leader("t", 0, 2)
        h.move_leader("t", 0, NODE_ID)
        epoch = h.cache.image.partitions_of(h.topic_id("t"))[0].leader_epoch
        for _ in range(2):
            await c.call(PRODUCE, 9, produce_values("t", 0, batch([b"new"])))

        def at(offset: int, last_fetched_epoch: int) -> dict[str, Any]:
            values = fetch_values("t", 0, offset, max_wait_ms=10_000, min_bytes=1 << 20)
            values["topics"][0]["partitions"][0]["last_fetched_epoch"] = last_fetched_epoch
            return values

        diverged = only_partition(await c.call(FETCH, 12, at(5, 0)))
        assert (diverged.diverging_epoch.epoch, diverged.diverging_epoch.end_offset) == (0, 3)
        assert diverged.records in (None, b"") and diverged.error_code == Errors.NONE
        # Its position within the epoch, or a current epoch: records as usual.
        fine = only_partition(await c.call(FETCH, 12, at(3, 0) | {"max_wait": 0}))
        assert records_of(fine.records) == [b"new", b"new"]
        assert fine.diverging_epoch.epoch == -1
        current = only_partition(await c.call(FETCH, 12, at(4, epoch) | {"max_wait": 0}))
        assert records_of(current.records) == [b"new"]
        # An epoch this log cannot place (above its latest): no end offset to truncate to, so
        # OFFSET_OUT_OF_RANGE and the consumer resets (Partition.readRecords), at once.
        unknown = only_partition(await asyncio.wait_for(c.call(FETCH, 12, at(4, epoch + 5)), 5))
        assert unknown.error_code == Errors.OFFSET_OUT_OF_RANGE
        # A diverging position below the log start: OFFSET_OUT_OF_RANGE, whatever the epochs
        # say (Partition.readRecords): the consumer resets, as it could not read from there.
        assert h.replicas.leader_partition("t", 0).log.maybe_increment_log_start_offset(2)
        below = only_partition(await asyncio.wait_for(c.call(FETCH, 12, at(1, epoch - 1)), 5))
        assert below.error_code == Errors.OFFSET_OUT_OF_RANGE

    run(tmp_path, test)


def test_a_fetch_by_topic_id_is_not_given_a_recreated_topics_records(tmp_path: Path) -> None:
    """A Fetch v13+ names topics by id. One waiting on a topic that is deleted and created
    again under the same name meanwhile read the new topic's records as the old one's, with
    no error: the id was resolved to a name once, when the request came. Kafka's readFromLog
    answers INCONSISTENT_TOPIC_ID (hasConsistentTopicId)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        await h.create_topic("u", 1, 1)
        for name in ("t", "u"):
            h.move_leader(name, 0, NODE_ID)
        old_id = h.topic_id("t")
        values = fetch_values("t", 0, 0, max_wait_ms=15_000, min_bytes=1 << 20, topic_id=old_id)
        values["topics"].append({**values["topics"][0], "topic": "u", "topic_id": h.topic_id("u")})
        await c.send(FETCH, 13, values)
        waiters = h.broker.fetch.waiters._waiters
        while ("t", 0) not in waiters:  # parked (the test's timeout bounds this)
            await asyncio.sleep(0.001)
        new_id = "AAAAAAAAAAAAAAAAAAAABw"
        h.quorum.commit(
            [
                rec.RemoveTopic(old_id),
                rec.Topic("t", new_id, {}),
                rec.Partition(
                    new_id,
                    0,
                    (NODE_ID,),
                    (NODE_ID,),
                    leader=NODE_ID,
                    leader_epoch=0,
                    partition_epoch=0,
                ),
            ]
        )
        producer = await h.client()
        produced = await producer.call(PRODUCE, 9, produce_values("t", 0, batch([b"new"])))
        assert only_partition(produced).error_code == Errors.NONE
        _, answer = await c.receive(FETCH, 13)
        by_id = {str(t.topic_id): t.partitions[0] for t in answer.responses}
        old = by_id[str(codec.topic_id_to_uuid(old_id))]
        assert (old.error_code, records_of(old.records)) == (Errors.INCONSISTENT_TOPIC_ID, [])
        await producer.close()

    run(tmp_path, test)


def test_a_partition_unknown_here_does_not_cut_a_long_poll_short(tmp_path: Path) -> None:
    """A consumer still assigned a deleted topic's partition: the fetch came back at once for
    it, and the consumer fetched in a hot loop. It waits for the partitions there are, as
    KafkaApis sets unknown partitions aside; alone, the unknown one is answered at once, and
    so is a fetch one of whose partitions is deleted while it waits."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        values = fetch_values("t", 0, 0, max_wait_ms=10_000)
        gone = fetch_values("gone", 0, 0)["topics"][0]
        values["topics"].append(gone)
        fetch_id = await c.send(FETCH, 12, values)
        watched = h.broker.fetch.waiters._waiters
        await until(lambda: ("t", 0) in watched, "the fetch waiting")
        assert ("gone", 0) not in watched  # set aside: nothing to wake it
        producer = await h.client()
        await producer.call(PRODUCE, 9, produce_values("t", 0, batch([b"wake"])))
        await producer.close()
        correlation_id, fetched = await c.receive(FETCH, 12)
        assert correlation_id == fetch_id
        known, unknown = (t.partitions[0] for t in fetched.responses)
        assert records_of(known.records) == [b"wake"]
        assert unknown.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        alone = fetch_values("gone", 0, 0, max_wait_ms=10_000)
        answered = only_partition(await asyncio.wait_for(c.call(FETCH, 12, alone), 5))
        assert answered.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        # A topic deleted while a fetch waits on it alone (DelayedFetch's case B).
        await h.create_topic("doomed", 1, 1)
        h.move_leader("doomed", 0, NODE_ID)  # RF 1 may have placed it on another node
        await until(lambda: ("doomed", 0) in h.replicas.partitions, "doomed-0 led here")
        waiting = await c.send(FETCH, 12, fetch_values("doomed", 0, 0, max_wait_ms=10_000))
        await until(lambda: ("doomed", 0) in watched, "the fetch waiting")
        h.quorum.commit([rec.RemoveTopic(h.topic_id("doomed"))])
        correlation_id, fetched = await asyncio.wait_for(c.receive(FETCH, 12), 5)
        assert correlation_id == waiting
        assert only_partition(fetched).error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        # And with another partition still there: known when the fetch came, it ends the wait
        # (DelayedFetch.tryComplete's forceComplete); it had waited for max_wait.
        await h.create_topic("doomed", 1, 1)
        h.move_leader("doomed", 0, NODE_ID)  # RF 1 may have placed it on another node
        await until(lambda: ("doomed", 0) in h.replicas.partitions, "doomed-0 led here")
        values = fetch_values("t", 0, 1, max_wait_ms=10_000)
        values["topics"].append(fetch_values("doomed", 0, 0)["topics"][0])
        waiting = await c.send(FETCH, 12, values)
        await until(lambda: ("doomed", 0) in watched, "the fetch waiting")
        h.quorum.commit([rec.RemoveTopic(h.topic_id("doomed"))])
        correlation_id, fetched = await asyncio.wait_for(c.receive(FETCH, 12), 5)
        assert correlation_id == waiting
        known, deleted = (t.partitions[0] for t in fetched.responses)
        assert (known.error_code, records_of(known.records)) == (Errors.NONE, [])
        assert deleted.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        # One set aside stays so, its topic created meanwhile: answered with the error it was
        # set aside with, never read (it was: OFFSET_OUT_OF_RANGE, from an offset the new
        # topic has not reached).
        values = fetch_values("t", 0, 1, max_wait_ms=10_000)
        values["topics"].append(fetch_values("later", 0, 5)["topics"][0])
        waiting = await c.send(FETCH, 12, values)
        await until(lambda: ("t", 0) in watched, "the fetch waiting")
        await h.create_topic("later", 1, 1)
        h.move_leader("later", 0, NODE_ID)
        await until(lambda: ("later", 0) in h.replicas.partitions, "later-0 led here")
        producer = await h.client()
        await producer.call(PRODUCE, 9, produce_values("t", 0, batch([b"again"])))
        await producer.close()
        correlation_id, fetched = await asyncio.wait_for(c.receive(FETCH, 12), 5)
        assert correlation_id == waiting
        known, later = (t.partitions[0] for t in fetched.responses)
        assert records_of(known.records) == [b"again"]
        assert later.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION

    run(tmp_path, test)


def test_a_read_error_fails_its_partition_alone_and_the_log_directory(tmp_path: Path) -> None:
    """An I/O error reading one partition escaped the Fetch: the connection closed and the
    healthy partition asked with it was never answered, again at every retry. It is
    KAFKA_STORAGE_ERROR for that partition, and the log directory is reported failed
    (LocalLog.read's maybeHandleIOException; a node halts then)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 6, 1)
        healthy, broken = h.led_partitions("t")[:2]
        for p in (healthy, broken):
            await c.call(PRODUCE, 9, produce_values("t", p, batch([b"x"])))
        segments = {id(s) for s in h.replicas.partitions[("t", broken)].log.segments}
        read_at = LogSegment.read_at

        def failing_read_at(segment: LogSegment, position: int, size: int) -> Any:
            if id(segment) in segments:
                raise OSError(errno.EIO, "Input/output error")
            return read_at(segment, position, size)

        failures: list[str] = []
        h.replicas.log_dir_failure.fail = lambda what, error: failures.append(what)  # type: ignore[method-assign]
        with mock.patch.object(LogSegment, "read_at", failing_read_at):
            values = fetch_values("t", healthy, 0)
            values["topics"][0]["partitions"].append(
                dict(values["topics"][0]["partitions"][0], partition=broken)
            )
            fetched = await c.call(FETCH, 12, values)
        answers = {p.partition_index: p for p in fetched.responses[0].partitions}
        assert records_of(answers[healthy].records) == [b"x"]
        assert answers[broken].error_code == Errors.KAFKA_STORAGE_ERROR
        assert failures == [f"reading t-{broken}"]

    run(tmp_path, test)


def test_a_new_epochs_first_append_writes_no_checkpoint_and_a_failed_one_fails_the_directory(
    tmp_path: Path,
) -> None:
    """After a failover a leader's first append in its epoch wrote the leader-epoch checkpoint
    on the event loop, an fsync per partition (storage/log says when it is written now). A
    write that fails at a flush fails the partition and the log directory; it had escaped the
    produce as a bare OSError, which closed the connection and left the node leading."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        await h.create_topic("flushed", 1, 1, {"flush.messages": "1"})
        h.move_leader("t", 0, NODE_ID)
        h.move_leader("flushed", 0, NODE_ID)
        writes: list[Path] = []
        failures: list[str] = []
        h.replicas.log_dir_failure.fail = lambda what, error: failures.append(what)  # type: ignore[method-assign]

        def failing_write(path: Path, entries: Any) -> None:
            writes.append(path)
            raise OSError(errno.EIO, "Input/output error")

        with mock.patch("kcoord.storage.epoch.write_leader_epochs", failing_write):
            response = await c.call(PRODUCE, 9, produce_values("t", 0, batch([b"x"]), acks=1))
            assert only_partition(response).error_code == Errors.NONE
            assert writes == []
            response = await c.call(PRODUCE, 9, produce_values("flushed", 0, batch([b"x"]), acks=1))
        assert only_partition(response).error_code == Errors.KAFKA_STORAGE_ERROR
        assert [p.parent.name for p in writes] == ["flushed-0"]
        assert failures == ["appending to flushed-0"]

    run(tmp_path, test)


def test_a_partition_committed_at_min_isr_is_settled_then_not_when_the_request_ends(
    tmp_path: Path,
) -> None:
    """acks=-1 for A and B, min.insync.replicas 2: A's HW passes its batch on two replicas,
    then A's ISR shrinks while the request still waits for B. A was answered
    NOT_ENOUGH_REPLICAS_AFTER_APPEND (checked when the whole request ended), and a producer
    without idempotence wrote it twice; Kafka's DelayedProduce settles A when its HW passes."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 6, 3)
        a, b = h.led_partitions("t")[:2]
        pa = h.replicas.get_partition("t", a)
        assert pa is not None and pa.replication is not None
        h.replicas.min_insync_replicas = 2
        follower = next(r for r in pa.replicas if r != NODE_ID)
        h.change_partition("t", a, isr=(NODE_ID, follower))
        h.clock[0] += pa.replication.replica_lag_time_max_ms + 1  # the third one is not joining
        values = {
            "acks": -1,
            "timeout": 400,
            "topic_data": [
                {
                    "name": "t",
                    "partition_data": [
                        {"index": a, "records": batch([b"a"])},
                        {"index": b, "records": batch([b"b"])},
                    ],
                }
            ],
        }
        await c.send(PRODUCE, 9, values)
        for _ in range(10_000):
            if pa.log.log_end_offset >= 1:
                break
            await asyncio.sleep(0)  # the request's append runs on the loop
        fetch = {
            "topic": "t",
            "partition": a,
            "fetch_offset": 1,
            "leader_epoch": pa.leader_epoch,
            "last_fetched_epoch": pa.leader_epoch,
            "high_watermark": 0,
            "log_start_offset": 0,
            "topic_id": pa.topic_id,
        }
        await h.replicas.handle_replica_fetch(
            {"replica_id": follower, "max_wait_ms": 0, "partitions": [fetch]}
        )
        assert pa.high_watermark == 1
        await asyncio.sleep(0)  # A's completion is handled
        h.change_partition("t", a, isr=(NODE_ID,))
        _, response = await c.receive(PRODUCE, 9)
        codes = {p.index: p.error_code for t in response.responses for p in t.partition_responses}
        assert (codes[a], codes[b]) == (Errors.NONE, Errors.REQUEST_TIMED_OUT)

    run(tmp_path, test)


def test_acks_zero_answers_nothing_and_closes_on_failure(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        await c.send(PRODUCE, 9, produce_values("t", 0, batch([b"quiet"]), acks=0))
        metadata_id = await c.send(METADATA, 9, metadata_values("t"))
        correlation_id, _ = await c.receive(METADATA, 9)
        assert correlation_id == metadata_id  # the produce got no response at all
        fetched = await c.call(FETCH, 12, fetch_values("t", 0, 0))
        assert records_of(only_partition(fetched).records) == [b"quiet"]
        await c.send(PRODUCE, 9, produce_values("nope", 0, batch([b"x"]), acks=0))
        assert await asyncio.wait_for(c.closed_by_server(), 5)
        # The node goes on serving others.
        other = await h.client()
        assert (await other.call(API_VERSIONS, 0, {})).error_code == 0
        await other.close()

    run(tmp_path, test)


# ------------------------------------------------------------------ idempotence


@pytest.mark.parametrize("api", [PRODUCE, FETCH, OFFSET_FOR_LEADER_EPOCH])
def test_a_request_naming_many_partitions_lets_the_loop_run_as_it_goes(
    tmp_path: Path, api: int
) -> None:
    """Produce's, Fetch's and OffsetForLeaderEpoch's handlers yield to the loop between slices
    of partitions (and a large request is decoded on a codec thread): one naming 200,000
    partitions held every other connection for 3 s (2 s for OffsetForLeaderEpoch)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        ticks = 0
        seen: list[int] = []  # the ticks at each partition's lookup

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        lookup = h.replicas.leader_partition

        def counted(*args: Any) -> Any:
            seen.append(ticks)
            return lookup(*args)

        h.replicas.leader_partition = counted  # type: ignore[method-assign,assignment]
        task = asyncio.create_task(ticker())
        count = 5_000
        values: dict[str, Any]
        if api == PRODUCE:
            partitions = [{"index": i, "records": None} for i in range(count)]
            topic_data = [{"name": "t", "partition_data": partitions}]
            values = {"acks": 1, "timeout": 5000, "topic_data": topic_data}
            answer = await c.call(PRODUCE, 9, values)
            assert len(answer.responses[0].partition_responses) == count
        elif api == OFFSET_FOR_LEADER_EPOCH:
            asked = [
                {"partition": i, "current_leader_epoch": -1, "leader_epoch": 0}
                for i in range(count)
            ]
            values = {"replica_id": -1, "topics": [{"topic": "t", "partitions": asked}]}
            answer = await c.call(OFFSET_FOR_LEADER_EPOCH, 4, values)
            assert len(answer.topics[0].partitions) == count
        else:
            # A long poll that waits (one partition is known, so the unknown ones do not end
            # it at once): its readiness rule walks the partitions too.
            await h.create_topic("t", 1, 1)
            values = fetch_values("t", 0, 0, max_wait_ms=100, min_bytes=1 << 20)
            one = values["topics"][0]["partitions"][0]
            values["topics"][0]["partitions"] = [{**one, "partition": i} for i in range(count)]
            answer = await c.call(FETCH, 12, values)
            assert len(answer.responses[0].partitions) == count
        task.cancel()
        assert seen[-1] - seen[0] >= count // PARTITIONS_PER_SLICE
        if api == FETCH:
            # No walk holds the loop for more than a slice: the read's last one and the
            # readiness rule's first may meet in one turn, never more.
            assert max(Counter(seen).values()) <= 2 * PARTITIONS_PER_SLICE

    run(tmp_path, test)


def test_idempotent_producer_retries_are_deduplicated(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        init = await c.call(
            INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60_000}
        )
        pid, epoch = init.producer_id, init.producer_epoch
        assert init.error_code == Errors.NONE and pid >= 0 and epoch == 0
        second = await c.call(
            INIT_PRODUCER_ID, 0, {"transactional_id": None, "transaction_timeout": 1}
        )
        assert second.producer_id != pid
        txn = await c.call(
            INIT_PRODUCER_ID, 4, {"transactional_id": "tx", "transaction_timeout": 1}
        )
        assert txn.error_code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        # An empty transactional id, an id without its epoch or an epoch without its id
        # (KIP-360's fields, v3+): INVALID_REQUEST, as KafkaApis and TransactionCoordinator.
        inconsistent: list[dict[str, Any]] = [
            {"transactional_id": ""},
            {"transactional_id": None, "producer_id": pid, "producer_epoch": -1},
            {"transactional_id": None, "producer_id": -1, "producer_epoch": 0},
        ]
        for fields in inconsistent:
            bad = await c.call(INIT_PRODUCER_ID, 4, {"transaction_timeout": 1, **fields})
            assert (bad.error_code, bad.producer_id) == (Errors.INVALID_REQUEST, -1), fields
        # The next block of ids cannot be written down: a retriable error, as Kafka's
        # ProducerIdManager answers while no block is at hand (UNKNOWN_SERVER_ERROR is fatal
        # to the Java producer).
        ids = h.broker.producer_ids
        ids._block_end = ids._next
        full = OSError(errno.ENOSPC, "No space left on device")
        with mock.patch.object(checkpoint, "write_atomically", side_effect=full):
            refused = await c.call(
                INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 1}
            )
        assert refused.error_code == Errors.COORDINATOR_LOAD_IN_PROGRESS
        again = await c.call(
            INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 1}
        )
        assert again.error_code == Errors.NONE and again.producer_id not in (pid, -1)

        def idem(seq: int, *values: bytes, e: int = epoch) -> bytes:
            return batch(list(values), producer_id=pid, producer_epoch=e, base_sequence=seq)

        async def produce(records: bytes) -> Any:
            return only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, records)))

        assert (await produce(idem(0, b"a", b"b"))).base_offset == 0
        assert (await produce(idem(2, b"c"))).base_offset == 2
        retry = await produce(idem(0, b"a", b"b"))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        gap = await produce(idem(9, b"z"))
        assert gap.error_code == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        # Leadership moves away and back: the state is rebuilt from the log.
        h.move_leader("t", 0, 2)
        assert (await produce(idem(3, b"d"))).error_code == Errors.NOT_LEADER_OR_FOLLOWER
        h.move_leader("t", 0, NODE_ID)
        retry = await produce(idem(2, b"c"))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 2)
        assert (await produce(idem(3, b"d"))).base_offset == 3
        stale = await produce(idem(4, b"e", e=epoch - 1))
        assert stale.error_code == Errors.INVALID_PRODUCER_EPOCH
        # A producer id without a sequence (LogValidator.validateBatch): refused, never taken
        # for a duplicate of another such batch and answered with its offsets.
        for values in ([b"x"], [b"y"]):
            unsequenced = await produce(idem(-1, *values))
            assert unsequenced.error_code == Errors.INVALID_RECORD
        # Any id below 0 is no producer (RecordBatch.hasProducerId): appended plain, twice.
        for _ in range(2):
            plain = batch([b"p"], producer_id=-5, producer_epoch=-1, base_sequence=-1)
            assert (await produce(plain)).error_code == Errors.NONE
        fetched = await c.call(FETCH, 12, fetch_values("t", 0, 0))
        assert records_of(only_partition(fetched).records) == [b"a", b"b", b"c", b"d", b"p", b"p"]

    run(tmp_path, test)


def test_describe_producers_lists_a_partitions_idempotent_producers(tmp_path: Path) -> None:
    """KIP-664's DescribeProducers: each producer's epoch, last sequence and last timestamp,
    from the state a produce would use, on the leader and on a follower, as Kafka's
    ``ReplicaManager.activeProducerState`` answers from any replica (``kafka-transactions.sh
    find-hanging --broker-id`` asks one); a partition with no replica here is
    NOT_LEADER_OR_FOLLOWER."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        t0 = h.clock[0]  # recent: no producer has expired
        await h.create_topic("t", 3, 1)
        mine = h.led_partitions("t")[0]
        other = h.led_partitions("t", by=2)[0]
        for pid, epoch, seq, values, ts in (
            (7, 1, 0, [b"a", b"b"], t0),
            (5, 0, 0, [b"c"], t0 + 1000),
        ):
            records = batch(
                values, timestamp=ts, producer_id=pid, producer_epoch=epoch, base_sequence=seq
            )
            produced = await c.call(PRODUCE, 9, produce_values("t", mine, records))
            assert only_partition(produced).error_code == Errors.NONE
        plain = await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"d"])))
        assert only_partition(plain).error_code == Errors.NONE  # no producer id: not listed

        async def describe(topic: str, *partitions: int) -> list[Any]:
            body = {"topics": [{"name": topic, "partition_indexes": list(partitions)}]}
            response = await c.call(DESCRIBE_PRODUCERS, 0, body)
            return list(response.topics[0].partitions)

        # By producer id, with the timestamp of the producer's last record.
        expected = [(5, 0, 0, t0 + 1000), (7, 1, 1, t0 + 1)]

        def listed(answer: Any) -> list[tuple[int, int, int, int]]:
            return [
                (p.producer_id, p.producer_epoch, p.last_sequence, p.last_timestamp)
                for p in answer.active_producers
            ]

        (answer,) = await describe("t", mine)
        assert (answer.partition_index, answer.error_code) == (mine, Errors.NONE)
        assert listed(answer) == expected
        assert {
            (p.coordinator_epoch, p.current_txn_start_offset) for p in answer.active_producers
        } == {(-1, -1)}
        h.move_leader("t", mine, 2)
        (following,) = await describe("t", mine)
        assert (following.error_code, listed(following)) == (Errors.NONE, expected)
        h.move_leader("t", mine, NODE_ID)
        (rebuilt,) = await describe("t", mine)
        assert listed(rebuilt) == expected
        (elsewhere,) = await describe("t", other)
        assert elsewhere.error_code == Errors.NOT_LEADER_OR_FOLLOWER
        (missing,) = await describe("nope", 0)
        assert missing.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        offsets = h.led_partitions(OFFSETS_TOPIC_NAME)[0]
        (internal,) = await describe(OFFSETS_TOPIC_NAME, offsets)
        assert (internal.error_code, internal.active_producers) == (Errors.NONE, ())

    run(tmp_path, test)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_list_transactions_lists_none(tmp_path: Path, version: int) -> None:
    """No transaction coordinator, so no transactions; filters naming no transaction state
    come back as unknown, as Kafka's TransactionStateManager answers them."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        values = {
            "state_filters": ["Ongoing", "Bogus"],
            "producer_id_filters": [5],
            "duration_filter": 1000,
            "transactional_id_pattern": "tx-.*",
        }
        response = await c.call(LIST_TRANSACTIONS, version, values)
        assert response.error_code == Errors.NONE
        assert (response.unknown_state_filters, response.transaction_states) == (("Bogus",), ())

    run(tmp_path, test)


async def _batches_then_a_new_leadership(
    h: Harness, c: AsyncWireClient, count: int
) -> tuple[int, Partition]:
    """Topic t: one idempotent producer's ``count`` one-record batches, then the leadership
    moves to node 2 and back, so this node loads the producer state again. Returns the
    producer id and the partition."""
    await h.create_topic("t", 1, 1)
    init = await c.call(
        INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60_000}
    )
    part = h.replicas.leader_partition("t", 0)
    for seq in range(count):
        one = batch([b"v"], producer_id=init.producer_id, producer_epoch=0, base_sequence=seq)
        h.replicas.append_local(part, one, required_acks=1)
    h.move_leader("t", 0, 2)
    h.move_leader("t", 0, NODE_ID)
    return int(init.producer_id), part


def test_a_long_producer_state_loads_between_other_work_and_still_finds_retries(
    tmp_path: Path,
) -> None:
    """The state of a new leadership comes from every batch header of the log. Parsed in one
    go it stalled the node's every client (1.05 s for 300,000 batches); it now yields to the
    loop between slices, and the produce that needed it finds a retry as before."""
    slices = 5

    async def test(h: Harness, c: AsyncWireClient) -> None:
        count = slices * LOAD_SLICE_HEADERS + 7
        pid, _part = await _batches_then_a_new_leadership(h, c, count)
        states = h.broker.produce.states
        seen_loading = 0

        async def other_client() -> None:
            nonlocal seen_loading
            while True:
                if states._tasks:
                    seen_loading += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(other_client())
        try:
            last = batch([b"v"], producer_id=pid, producer_epoch=0, base_sequence=count - 1)
            retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, last)))
        finally:
            ticker.cancel()
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, count - 1)
        # The produce and the background read take a slice each per turn of the loop.
        assert seen_loading >= slices // 2, f"the loop ran other work {seen_loading} times"
        assert not states._tasks
        following = batch([b"w"], producer_id=pid, producer_epoch=0, base_sequence=count)
        answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, following)))
        assert (answer.error_code, answer.base_offset) == (Errors.NONE, count)

    run(tmp_path, test)


def test_a_producer_state_read_across_leaderships_takes_in_what_another_leader_wrote(
    tmp_path: Path,
) -> None:
    """A read still running when the node became a follower and then leader again goes on to
    the log's new end: the batch the other leader appended meanwhile (replicated here) is in
    the state, so the producer's retry of it here is a duplicate, not appended twice."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        count = 5 * LOAD_SLICE_HEADERS
        pid, part = await _batches_then_a_new_leadership(h, c, count)
        states = h.broker.produce.states
        following = batch([b"w"], producer_id=pid, producer_epoch=0, base_sequence=count)
        sent = asyncio.create_task(c.call(PRODUCE, 9, produce_values("t", 0, following)))
        while not states._tasks:
            await asyncio.sleep(0)
        for _ in range(2):  # the load is under way: it has read the log's end
            await asyncio.sleep(0)
        assert states._tasks, "the load ended before the leadership moved"
        # Node 2 leads for a moment and appends the same batch (the producer's retry went
        # there); it replicates here. Then this node leads again.
        h.move_leader("t", 0, 2)
        part.log.append_as_leader(following, part.leader_epoch, h.clock[0])
        h.move_leader("t", 0, NODE_ID)
        answer = only_partition(await sent)
        assert (answer.error_code, answer.base_offset) == (Errors.NONE, count)
        assert part.log.log_end_offset == count + 1, "the retried batch was appended twice"

    run(tmp_path, test)


async def _producer_7_appended(h: Harness, c: AsyncWireClient) -> tuple[Partition, bytes]:
    """Topic t led here, with producer 7's first batch at offset 0 (its answer taken as
    lost); the partition and that batch, to retry."""
    await h.create_topic("t", 1, 1)
    h.move_leader("t", 0, NODE_ID)
    first = batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=0)
    appended = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
    assert (appended.error_code, appended.base_offset) == (Errors.NONE, 0)
    return h.replicas.leader_partition("t", 0), first


async def _producer_8_after_a_roll(h: Harness, c: AsyncWireClient) -> tuple[Partition, bytes]:
    """``_producer_7_appended``, a roll, then producer 8's batch at offset 1."""
    part, first = await _producer_7_appended(h, c)
    part.log.roll()
    other = batch([b"b"], producer_id=8, producer_epoch=0, base_sequence=0)
    assert not only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, other))).error_code
    return part, first


def test_a_producers_state_survives_a_failover_after_its_batch_left_the_log(
    tmp_path: Path,
) -> None:
    """The review's scenario: a batch appended (its answer lost), then DeleteRecords and
    retention take its segment, then a leadership change. The state rebuilt from the log had
    no trace of the producer and appended its retry again; kept across leaderships (as
    Kafka's producer state survives log start moves), it answers the retry as a duplicate."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, first = await _producer_7_appended(h, c)
        states = h.broker.produce.states
        part.log.roll()
        other = batch([b"b"], producer_id=8, producer_epoch=0, base_sequence=0)
        assert (
            only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, other))).error_code == 0
        )
        h.replicas.delete_records("t", 0, 1)
        part.log.delete_old_segments(h.clock[0], high_watermark=part.high_watermark)
        assert part.log.segments[0].base_offset == 1, "the first batch's segment is gone"
        state = states.get(part, h.clock[0])
        h.move_leader("t", 0, 2)
        h.move_leader("t", 0, NODE_ID)
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        assert part.log.log_end_offset == 2, "the retry was appended again"
        assert states.get(part, h.clock[0]) is state, "the state was rebuilt, not kept"

    run(tmp_path, test)


def test_a_truncation_to_the_first_segments_base_keeps_the_producers_below(
    tmp_path: Path,
) -> None:
    """Producer 7's batch (its answer lost) left the log with DeleteRecords and retention;
    producer 8's, at the first segment's base, was not committed, and a new leader's log
    ends there. Truncated to that base, the log was dropped whole, its producer snapshots
    with it, and producer 7's retry was appended twice (found by a review). Kafka's
    ``UnifiedLog.truncateTo`` starts over only strictly below the first segment."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, first = await _producer_7_appended(h, c)
        part.log.roll()
        drop_segments_below(h, part, 1)
        other = batch([b"b"], producer_id=8, producer_epoch=0, base_sequence=0)
        assert not only_partition(
            await c.call(PRODUCE, 9, produce_values("t", 0, other))
        ).error_code
        h.move_leader("t", 0, 2)
        assert part.log.truncate_to(1) == 1  # the new leader's log ends below producer 8's
        h.move_leader("t", 0, NODE_ID)
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        assert part.log.log_end_offset == 1, "the retry was appended again"

    run(tmp_path, test)


def restart_producer_states(h: Harness, *, clean: bool) -> None:
    """The producer states as a restarted node has them: built again from the log and its
    producer snapshots, after a clean stop (which takes one at each log end) or a crash."""
    if clean:
        h.broker.produce.states.close()
    h.broker.produce.states = produce.ProducerStates(h.replicas)


def drop_segments_below(h: Harness, part: Partition, offset: int) -> None:
    """The log start moved to ``offset`` (DeleteRecords) and retention took the segments
    below it."""
    part.log.maybe_increment_log_start_offset(offset)
    part.log.delete_old_segments(h.clock[0], high_watermark=offset)
    assert part.log.segments[0].base_offset == offset, "the segments below are gone"


@pytest.mark.parametrize("clean", [True, False], ids=["clean-stop", "crash"])
def test_a_producers_state_survives_a_restart_after_its_batch_left_the_log(
    tmp_path: Path, clean: bool
) -> None:
    """A batch appended (its answer lost), then DeleteRecords and retention take its
    segment, then the node restarts. Read from the log alone, the state had no trace of the
    producer and appended its retry again (found by a review); a producer snapshot, taken at
    a roll of the log before the crash, or at the stop, still has it (Kafka's
    ``takeSnapshot`` at ``UnifiedLog.roll`` and ``close``)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, first = await _producer_7_appended(h, c)
        other = batch([b"b"], producer_id=8, producer_epoch=0, base_sequence=0)
        assert not only_partition(
            await c.call(PRODUCE, 9, produce_values("t", 0, other))
        ).error_code
        part.log.roll()
        end = part.log.log_end_offset
        assert producer_snapshot.offsets(part.log.directory) == [end], "taken at the roll"
        drop_segments_below(h, part, end)
        if clean:
            producer_snapshot.path_of(part.log.directory, end).unlink()  # the stop's alone
            h.broker.produce.states.close()
            assert producer_snapshot.offsets(part.log.directory) == [end]
        restart_producer_states(h, clean=False)
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        assert part.log.log_end_offset == end, "the retry was appended again"

    run(tmp_path, test)


def test_retention_that_takes_every_segment_rolls_first_and_keeps_the_producers(
    tmp_path: Path,
) -> None:
    """Retention taking every segment (DeleteRecords to the log end) rolled the active one
    last, when the segments below were already gone: on a restarted node, whose producer
    states were not read yet, that roll took no snapshot, the older snapshot was below the
    first segment, and producer 7, whose batch had left the log, was forgotten: its retry was
    appended again. Kafka's deleteSegments rolls before it deletes. (review helper-219)"""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, first = await _producer_8_after_a_roll(h, c)
        restart_producer_states(h, clean=False)
        # The restarted node hosts the partition again; its state is read in the background,
        # not yet.
        h.broker.produce.states.on_role_change(part, True)
        drop_segments_below(h, part, 2)
        assert producer_snapshot.offsets(part.log.directory)[-1] == 2, "taken at the roll"
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        assert part.log.log_end_offset == 2, "the retry was appended again"

    run(tmp_path, test)


def test_a_snapshot_older_than_the_first_segment_is_not_used(tmp_path: Path) -> None:
    """A producer's batches after the latest snapshot left the log (a snapshot not taken at
    a roll since: the state was still loading, or a write failed): what the snapshot says of
    it is stale. Used, its sequence refused the producer's next batch (found by a review);
    Kafka deletes a snapshot at or below the log start. The producer is unknown instead, and
    its next batch taken (KIP-360), as without snapshots."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, _ = await _producer_7_appended(h, c)  # sequence 0 at offset 0
        part.log.roll()
        assert producer_snapshot.offsets(part.log.directory) == [1]
        second = batch([b"b"], producer_id=7, producer_epoch=0, base_sequence=1)
        assert (
            only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, second))).base_offset
            == 1
        )
        part.log.roll()
        producer_snapshot.path_of(part.log.directory, 2).unlink()  # not taken
        drop_segments_below(h, part, 2)
        restart_producer_states(h, clean=False)
        following = batch([b"c"], producer_id=7, producer_epoch=0, base_sequence=2)
        taken = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, following)))
        assert (taken.error_code, taken.base_offset) == (Errors.NONE, 2)

    run(tmp_path, test)


def test_a_producer_snapshot_of_batches_truncated_since_is_deleted(tmp_path: Path) -> None:
    """A snapshot above the offset a log is truncated to holds batches the log no longer
    has: it is deleted (Kafka's ``truncateAndReload``), else, once the log grew past its
    offset again, it would be taken for the state below it. The batch cut is appended again
    after a restart, not answered as a duplicate of one that is gone."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, _ = await _producer_7_appended(h, c)
        part.log.roll()
        cut = batch([b"b"], producer_id=8, producer_epoch=0, base_sequence=0)
        assert (
            only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, cut))).base_offset == 1
        )
        part.log.roll()
        follow = batch([b"c"], producer_id=9, producer_epoch=0, base_sequence=0)
        assert (
            only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, follow))).base_offset
            == 2
        )
        assert producer_snapshot.offsets(part.log.directory) == [1, 2]
        part.log.truncate_to(1)
        assert producer_snapshot.offsets(part.log.directory) == [1]
        restart_producer_states(h, clean=False)
        again = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, cut)))
        assert (again.error_code, again.base_offset) == (Errors.NONE, 1)

    run(tmp_path, test)


def test_a_producers_state_survives_a_truncation_after_its_batch_left_the_log(
    tmp_path: Path,
) -> None:
    """The same, with a truncation: an unreplicated batch of another producer is cut when the
    leadership moves and comes back (the usual case when it moves). The state, read again
    from the log, had no trace of producer 7 and appended its retry again; Kafka reloads the
    state from a producer snapshot that still has it. A full restart of the log (a follower
    far behind) keeps nothing, as Kafka's follower clears its state then."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, first = await _producer_8_after_a_roll(h, c)
        part.log.roll()
        h.replicas.delete_records("t", 0, 1)
        part.log.delete_old_segments(h.clock[0], high_watermark=part.high_watermark)
        assert part.log.segments[0].base_offset == 1, "the first batch's segment is gone"
        third = batch([b"c"], producer_id=9, producer_epoch=0, base_sequence=0)
        cut = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, third, acks=1)))
        assert cut.base_offset == 2
        h.move_leader("t", 0, 2)
        part.log.truncate_to(2)  # as the follower's reconciliation does
        h.move_leader("t", 0, NODE_ID)
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        assert part.log.log_end_offset == 2, "the retry was appended again"

        part.log.truncate_fully_and_start_at(2)
        again = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (again.error_code, again.base_offset) == (Errors.NONE, 2)

    run(tmp_path, test)


def test_a_producer_state_keeps_nothing_of_a_log_restarted_and_truncated_since_it_read(
    tmp_path: Path,
) -> None:
    """The carry-over above judged by the last truncation alone: a log restarted empty at 4
    (a follower far behind), then truncated to 5, before the state read it again, passed as
    one truncation at 5, and producer 7's batch at 0, of the wiped log, was kept: its retry
    was answered as a duplicate at an offset the log no longer holds."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        part, first = await _producer_7_appended(h, c)
        for i in range(5):
            more = batch([b"m"], producer_id=20 + i, producer_epoch=0, base_sequence=0)
            await c.call(PRODUCE, 9, produce_values("t", 0, more))
        part.log.truncate_fully_and_start_at(4)
        for _ in range(2):
            part.log.append_as_leader(batch([b"x"]), leader_epoch=0, now_ms=h.clock[0])
        part.log.truncate_to(5)
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 5)

    run(tmp_path, test)


def test_a_produce_reading_a_producer_state_is_answered_when_the_topic_goes(
    tmp_path: Path,
) -> None:
    """The review's scenario: a produce waiting for a long producer-state read while its topic
    is deleted. Cancelling the read reached the produce and ended the connection unanswered;
    the read stops at its next slice and the produce is refused as for any partition gone."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        count = 20 * LOAD_SLICE_HEADERS
        pid, part = await _batches_then_a_new_leadership(h, c, count)
        states = h.broker.produce.states
        waiting = asyncio.Event()
        real_ready = states.ready

        async def ready(part: Partition, now_ms: int) -> None:
            waiting.set()
            await real_ready(part, now_ms)

        states.ready = ready  # type: ignore[method-assign]
        following = batch([b"w"], producer_id=pid, producer_epoch=0, base_sequence=count)
        sent = asyncio.create_task(c.call(PRODUCE, 9, produce_values("t", 0, following)))
        await asyncio.wait_for(waiting.wait(), 5)
        await asyncio.sleep(0)  # the produce is reading
        assert not states.loaded(part)
        h.quorum.commit([rec.RemoveTopic(h.topic_id("t"))])
        answer = only_partition(await asyncio.wait_for(sent, 5))
        assert answer.error_code in (
            Errors.UNKNOWN_TOPIC_OR_PARTITION,
            Errors.NOT_LEADER_OR_FOLLOWER,
        )
        metadata = await asyncio.wait_for(c.call(METADATA, 12, {"topics": None}), 5)
        assert metadata is not None  # the connection still serves

    run(tmp_path, test)


def test_a_lagging_follower_state_survives_the_log_start_moving_past_it(tmp_path: Path) -> None:
    """A follower's state lags its log by what it replicated since its last read; DeleteRecords
    moved the log start past it. The batches are still in the segment: the state reads on
    from there instead of starting over at the log start without the producer, whose retry
    after the failover is then a duplicate, not a second copy."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        part = h.replicas.leader_partition("t", 0)
        first = batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=0)
        assert (
            only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first))).error_code == 0
        )
        h.move_leader("t", 0, 2)
        replicated = bytearray(batch([b"b"], producer_id=8, producer_epoch=0, base_sequence=0))
        fmt.set_base_offset(replicated, 0, 1)
        part.log.append_as_follower(bytes(replicated), h.clock[0])
        assert part.log.maybe_increment_log_start_offset(2)
        h.move_leader("t", 0, NODE_ID)
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        assert part.log.log_end_offset == 2, "the retry was appended again"

    run(tmp_path, test)


def test_a_restart_reads_from_a_snapshot_below_the_segments_it_skips(tmp_path: Path) -> None:
    """After the latest snapshot, at S, the producer wrote a batch stamped two days back
    (event time), in a segment a restart skips (older than producer.id.expiration.ms). The
    snapshot says the producer is at sequence 0 and recent; the log from S says it is at 1,
    idle for two days, so expired. Read from S, not from the first segment kept, the state
    knows the later batch: the producer's next batch (sequence 2) is taken, not refused
    OUT_OF_ORDER_SEQUENCE_NUMBER for a stale sequence. The state merging the snapshot is
    not loaded until it has read it: that read is made in slices, not by the produce in one go
    (found by a review)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1, {"retention.ms": "-1"})
        h.move_leader("t", 0, NODE_ID)
        part = h.replicas.leader_partition("t", 0)
        now, day = h.clock[0], 24 * 3_600_000

        async def produce(seq: int, timestamp: int) -> Any:
            records = batch(
                [b"v"], timestamp=timestamp, producer_id=7, producer_epoch=0, base_sequence=seq
            )
            return only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, records)))

        assert (await produce(0, now)).base_offset == 0
        part.log.roll()
        assert (await produce(1, now - 2 * day)).base_offset == 1
        part.log.roll()
        producer_snapshot.path_of(part.log.directory, 2).unlink()  # not taken
        assert producer_snapshot.offsets(part.log.directory) == [1]
        h.replicas.delete_records("t", 0, 1)
        part.log.delete_old_segments(now, high_watermark=part.high_watermark)
        assert [s.base_offset for s in part.log.segments] == [1, 2]
        restart_producer_states(h, clean=False)
        states = h.broker.produce.states
        states.on_role_change(part, True)  # as the node's start: the state restarts at the end
        assert not states.loaded(part), "the snapshot is still to be merged"
        following = await produce(2, now)
        assert (following.error_code, following.base_offset) == (Errors.NONE, 2)

    run(tmp_path, test)


def test_a_follower_takes_a_producer_snapshot_at_its_rolls(tmp_path: Path) -> None:
    """A follower's state reads behind its log; at a roll it reads up to the new segment
    and keeps a snapshot there, as Kafka's followers do (``UnifiedLog.roll``): after a crash
    the producers whose batches have all left the log since are known."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, 2)
        part = h.replicas.get_partition("t", 0)
        assert part is not None and not part.is_leader
        replicated = bytearray(batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=0))
        part.log.append_as_follower(bytes(replicated), h.clock[0])
        part.log.roll()
        assert producer_snapshot.offsets(part.log.directory) == [1]
        found = part.log.latest_producer_snapshot(24 * 3_600_000)
        assert found is not None and set(found[1].producers) == {7}
        h.move_leader("t", 0, NODE_ID)
        drop_segments_below(h, part, 1)
        restart_producer_states(h, clean=False)
        retry = batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=0)
        answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, retry)))
        assert (answer.error_code, answer.base_offset) == (Errors.NONE, 0)

    run(tmp_path, test)


def test_a_producer_state_starts_over_after_a_truncation_below_what_it_read(
    tmp_path: Path,
) -> None:
    """As a follower the log lost batches 1-2 of a producer to a truncation and took the new
    leader's batch 1 instead: the state, which had read the lost ones, starts over, so the
    producer's sequence 2 here again is appended, not answered as a duplicate of a batch the
    log no longer has."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        part = h.replicas.leader_partition("t", 0)
        pid = 9

        def seq(n: int, value: bytes) -> bytes:
            return batch([value], producer_id=pid, producer_epoch=0, base_sequence=n)

        for n in range(3):
            answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, seq(n, b"x"))))
            assert (answer.error_code, answer.base_offset) == (Errors.NONE, n)
        h.move_leader("t", 0, 2)
        part.log.truncate_to(1)
        replicated = bytearray(seq(1, b"y"))
        fmt.set_base_offset(replicated, 0, 1)
        part.log.append_as_follower(bytes(replicated), h.clock[0])
        h.move_leader("t", 0, NODE_ID)
        again = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, seq(2, b"z"))))
        assert (again.error_code, again.base_offset) == (Errors.NONE, 2)
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("t", 0, 0)))
        assert records_of(fetched.records) == [b"x", b"y", b"z"]

    run(tmp_path, test)


def test_a_corrupt_batch_costs_the_producer_state_only_its_own_segment(tmp_path: Path) -> None:
    """A batch header that no longer parses in a middle segment (below the recovery point, so
    no restart scans it) ended the state's read there, and the state counted itself read to
    the log end: a producer whose last batch lay in a later segment had its next sequence
    refused, and a retry of that batch appended again."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        part = h.replicas.leader_partition("t", 0)
        for pid, n in [(7, 0), (8, 0), (7, 1)]:
            idem = batch([b"x"], producer_id=pid, producer_epoch=0, base_sequence=n)
            h.replicas.append_local(part, idem, required_acks=1)
            part.log.roll()
        with open(part.log.segments[1].log_path, "r+b") as f:
            f.seek(16)  # the magic byte of producer 8's batch
            f.write(b"\x07")
        h.move_leader("t", 0, 2)
        h.move_leader("t", 0, NODE_ID)  # the state is read from the log again
        retry = batch([b"x"], producer_id=7, producer_epoch=0, base_sequence=1)
        answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, retry)))
        assert (answer.error_code, answer.base_offset) == (Errors.NONE, 2)  # a duplicate
        following = batch([b"y"], producer_id=7, producer_epoch=0, base_sequence=2)
        answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, following)))
        assert (answer.error_code, answer.base_offset) == (Errors.NONE, 3)

    run(tmp_path, test)


def test_a_producer_state_that_cannot_be_read_refuses_the_batch(tmp_path: Path) -> None:
    """A state whose every read attempt failed (its segments let go under it each time) was
    used as read: an empty state takes any sequence, a retry included. The batch is refused
    now, with an error the producer retries."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        first = batch([b"x"], producer_id=7, producer_epoch=0, base_sequence=0)
        answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert answer.error_code == Errors.NONE
        h.move_leader("t", 0, 2)
        h.move_leader("t", 0, NODE_ID)

        def unreadable(*_: Any) -> bool:
            raise FileNotFoundError("a segment went")

        with mock.patch.object(type(h.broker.produce.states), "_read", unreadable):
            answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, first)))
        assert answer.error_code == Errors.KAFKA_STORAGE_ERROR

    run(tmp_path, test)


def test_a_producers_state_comes_from_its_last_batches_whatever_their_timestamps(
    tmp_path: Path,
) -> None:
    """A producer wrote a recent batch, then a segment of batches stamped two days back (event
    time). Rebuilt after a leader change, its state came from the recent batch alone (a whole
    segment older than producer.id.expiration.ms was skipped mid-log), so its next batch got
    OUT_OF_ORDER_SEQUENCE_NUMBER. Only a leading run of such segments is skipped now: the
    producer's last batch is old, so it has expired, as Kafka's per-producer rule has it."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        part = h.replicas.leader_partition("t", 0)
        now, day = h.clock[0], 24 * 3_600_000
        pid = 11
        recent = batch([b"a"], timestamp=now, producer_id=pid, producer_epoch=0, base_sequence=0)
        h.replicas.append_local(part, recent, required_acks=1)
        part.log.roll()
        old = batch(
            [b"b"], timestamp=now - 2 * day, producer_id=pid, producer_epoch=0, base_sequence=1
        )
        h.replicas.append_local(part, old, required_acks=1)
        part.log.roll()
        h.move_leader("t", 0, 2)
        h.move_leader("t", 0, NODE_ID)
        following = batch([b"c"], timestamp=now, producer_id=pid, producer_epoch=0, base_sequence=2)
        answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, following)))
        assert (answer.error_code, answer.base_offset) == (Errors.NONE, 2)

    run(tmp_path, test)


async def _first_batch_of(h: Harness, c: AsyncWireClient, pid: int) -> None:
    """Producer ``pid``'s first batch to t-0, stamped with the harness's clock."""
    records = batch(
        [b"v"], timestamp=h.clock[0], producer_id=pid, producer_epoch=0, base_sequence=0
    )
    answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, records)))
    assert answer.error_code == Errors.NONE


def test_producer_id_expiration_is_the_nodes_setting(tmp_path: Path) -> None:
    """producer.id.expiration.ms and its check interval were fixed at Kafka's defaults: a
    node set to forget producers after a minute, checking every second, does so."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        states = h.broker.produce.states

        async def produce(pid: int) -> None:
            await _first_batch_of(h, c, pid)

        await produce(1)
        part = h.replicas.leader_partition("t", 0)
        h.clock[0] += 30_000
        await produce(2)
        assert set(states.get(part, h.clock[0]).producers) == {1, 2}
        h.clock[0] += 31_000  # producer 1 idle past a minute; 2 not yet
        await produce(3)
        assert set(states.get(part, h.clock[0]).producers) == {2, 3}

    run(
        tmp_path,
        test,
        settings=KafkaSettings(
            num_partitions=3,
            producer_id_expiration_ms=60_000,
            producer_id_expiration_check_interval_ms=1_000,
        ),
    )


def test_a_stable_leader_forgets_idle_producers(tmp_path: Path) -> None:
    """Kafka's removeExpiredProducers runs every producer.id.expiration.check.interval.ms on
    a leader; here a state was only ever trimmed when a leadership loaded it, so a long-lived
    leader kept every producer that ever wrote (about 1 KiB each)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        states = h.broker.produce.states
        day = 24 * 3_600_000

        async def produce(pid: int) -> None:
            await _first_batch_of(h, c, pid)

        await produce(1)
        part = h.replicas.leader_partition("t", 0)
        assert set(states.get(part, h.clock[0]).producers) == {1}
        h.clock[0] += day + PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS + 1
        await produce(2)
        assert set(states.get(part, h.clock[0]).producers) == {2}

    run(tmp_path, test)


def test_a_producers_state_keeps_the_max_timestamp_the_log_stored(tmp_path: Path) -> None:
    """A batch whose header's max timestamp is not its records' (-1 here) is stored with
    theirs, as Kafka's LogValidator does; the leader's producer state kept the header's, so
    the producer counted as idle since 1970, was expired at the next check, and a retry of
    its batch was appended again (found by a review)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        sent = bytearray(
            batch([b"a"], timestamp=h.clock[0], producer_id=5, producer_epoch=0, base_sequence=0)
        )
        fmt.set_max_timestamp(sent, 0, fmt.NO_TIMESTAMP)
        first = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, bytes(sent))))
        assert (first.error_code, first.base_offset) == (Errors.NONE, 0)
        part = h.replicas.leader_partition("t", 0)
        states = h.broker.produce.states
        assert states.get(part, h.clock[0]).producers[5].last_timestamp_ms == h.clock[0]
        h.clock[0] += PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS + 1
        retry = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, bytes(sent))))
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 0)
        assert part.log.log_end_offset == 1

    run(tmp_path, test)


def test_produce_answers_log_append_time_and_invalid_timestamps(tmp_path: Path) -> None:
    """A LogAppendTime topic's produce response carries the leader's stamp, and a retry the
    first append's (Kafka's UnifiedLog answers a duplicate with its batch's timestamp); a
    CreateTime record more than an hour ahead gets INVALID_TIMESTAMP with Kafka's message and
    one record error naming its index in the batch."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("lat", 1, 1, {"message.timestamp.type": "LogAppendTime"})
        await h.create_topic("ct", 1, 1)
        for topic in ("lat", "ct"):
            h.move_leader(topic, 0, NODE_ID)  # the harness spreads leaders over 3 brokers
        init = await c.call(
            INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60_000}
        )
        pid = init.producer_id
        first = batch([b"a", b"b"], timestamp=5, producer_id=pid, producer_epoch=0, base_sequence=0)

        async def produce(topic: str, records: bytes) -> Any:
            return only_partition(await c.call(PRODUCE, 9, produce_values(topic, 0, records)))

        stamped_at = h.clock[0]
        as_sent = dt.datetime.fromtimestamp(stamped_at / 1000, dt.UTC)  # kio's decoding
        appended = await produce("lat", first)
        assert (appended.error_code, appended.log_append_time) == (Errors.NONE, as_sent)
        h.clock[0] += 1_000
        retry = await produce("lat", first)
        assert (retry.base_offset, retry.log_append_time) == (0, as_sent)
        created = await produce("ct", batch([b"c"], timestamp=h.clock[0]))
        assert (created.error_code, created.log_append_time) == (Errors.NONE, None)

        now, hour = h.clock[0], 3_600_000
        late = await produce("ct", batch([b"d", b"e"], timestamp=now + hour))
        assert late.error_code == Errors.INVALID_TIMESTAMP
        assert late.error_message == (
            "One or more records have been rejected due to invalid timestamp"
        )
        assert [(e.batch_index, e.batch_index_error_message) for e in late.record_errors] == [
            (
                1,
                f"Timestamp {now + hour + 1} of message with offset 1 is out of range. The "
                f"timestamp should be within [{now - (2**63 - 1)}, {now + hour}]",
            )
        ]
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("lat", 0, 0)))
        data = fetched.records or b""
        assert [r.timestamp for r in fmt.decode_records(data)] == [stamped_at, stamped_at]
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("ct", 0, 0)))
        assert records_of(fetched.records) == [b"c"]

    run(tmp_path, test)


def test_below_min_insync_replicas_every_batch_is_refused_before_its_sequence(
    tmp_path: Path,
) -> None:
    """Kafka's order: NOT_ENOUGH_REPLICAS for the batches queued behind a refused one and for
    retries, not OUT_OF_ORDER_SEQUENCE_NUMBER (which makes librdkafka bump its epoch and
    resend other partitions' possibly written batches under new sequences)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 3)
        index = h.led_partitions("t")[0]
        part = h.replicas.get_partition("t", index)
        assert part is not None and part.replication is not None
        # Brokers 2 and 3 never fetch here: they fall behind and leave the ISR.
        h.clock[0] += part.replication.replica_lag_time_max_ms + 1
        h.change_partition("t", index, isr=(NODE_ID,))
        init = await c.call(
            INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60_000}
        )
        pid, epoch = init.producer_id, init.producer_epoch

        async def produce(seq: int, value: bytes, acks: int = -1) -> Any:
            records = batch([value], producer_id=pid, producer_epoch=epoch, base_sequence=seq)
            return only_partition(
                await c.call(PRODUCE, 9, produce_values("t", index, records, acks))
            )

        assert (await produce(0, b"a")).base_offset == 0
        h.replicas.min_insync_replicas = 2  # the ISR is this node alone
        assert (await produce(1, b"b")).error_code == Errors.NOT_ENOUGH_REPLICAS
        assert (await produce(2, b"c")).error_code == Errors.NOT_ENOUGH_REPLICAS  # not a gap
        assert (await produce(0, b"a")).error_code == Errors.NOT_ENOUGH_REPLICAS  # a retry
        one = await produce(1, b"b", acks=1)  # acks=1 does not need the ISR: sequences count
        assert (one.error_code, one.base_offset) == (Errors.NONE, 1)
        h.replicas.min_insync_replicas = 1
        retry = await produce(1, b"b")
        assert (retry.error_code, retry.base_offset) == (Errors.NONE, 1)
        gap = await produce(3, b"d")
        assert gap.error_code == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert (await produce(2, b"c")).base_offset == 2
        fetched = await c.call(FETCH, 12, fetch_values("t", index, 0))
        assert records_of(only_partition(fetched).records) == [b"a", b"b", b"c"]

    run(tmp_path, test)


def test_an_isr_that_shrinks_below_min_insync_replicas_holds_the_hw(tmp_path: Path) -> None:
    """KIP-966's strict min ISR (Kafka 4's ``maybeIncrementLeaderHW``): an acks=all batch
    appended while the ISR was big enough, whose ISR then shrank below min.insync.replicas,
    is not committed by the leader alone: the HW stays, consumers do not see it, and the
    produce times out (REQUEST_TIMED_OUT; before, the HW moved and it was answered
    NOT_ENOUGH_REPLICAS_AFTER_APPEND). The next batch is refused before the append. With the
    ISR big enough again (here: min.insync.replicas lowered), both are committed."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 3)
        index = h.led_partitions("t")[0]
        part = h.replicas.get_partition("t", index)
        assert part is not None and part.replication is not None
        assert len(part.replication.isr) == 3  # brokers 2 and 3 never fetch here
        h.replicas.min_insync_replicas = 2
        values = {**produce_values("t", index, batch([b"a"])), "timeout": 300}
        correlation_id = await c.send(PRODUCE, 9, values)
        deadline = time.monotonic() + 5
        while part.log.log_end_offset < 1:
            assert time.monotonic() < deadline, "the produce was not appended"
            await asyncio.sleep(0.01)
        assert part.high_watermark == 0  # waiting for brokers 2 and 3
        # They fall behind for longer than replica.lag.time.max.ms, and leave the ISR.
        h.clock[0] += part.replication.replica_lag_time_max_ms + 1
        h.change_partition("t", index, isr=(NODE_ID,))
        received_id, response = await c.receive(PRODUCE, 9)
        assert received_id == correlation_id
        assert only_partition(response).error_code == Errors.REQUEST_TIMED_OUT
        assert part.high_watermark == 0
        fetched = await c.call(FETCH, 12, fetch_values("t", index, 0))
        assert records_of(only_partition(fetched).records) == []  # not committed
        refused = only_partition(
            await c.call(PRODUCE, 9, produce_values("t", index, batch([b"b"])))
        )
        assert refused.error_code == Errors.NOT_ENOUGH_REPLICAS
        h.replicas.min_insync_replicas = 1
        ok = only_partition(await c.call(PRODUCE, 9, produce_values("t", index, batch([b"c"]))))
        assert (ok.error_code, ok.base_offset) == (Errors.NONE, 1)
        fetched = await c.call(FETCH, 12, fetch_values("t", index, 0))
        assert records_of(only_partition(fetched).records) == [b"a", b"c"]

    run(tmp_path, test)


# ------------------------------------------------------------------ ListOffsets


def test_list_offsets(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 1)
        mine = h.led_partitions("t")[0]
        other = h.led_partitions("t", by=2)[0]
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"a", b"b"], timestamp=100)))
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"c"], timestamp=500)))
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"d"], timestamp=300)))

        async def list_offset(timestamp: int, partition: int = mine, version: int = 7) -> Any:
            response = await c.call(
                LIST_OFFSETS,
                version,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "timeout": 1000,
                    "topics": [
                        {
                            "name": "t",
                            "partitions": [
                                {
                                    "partition_index": partition,
                                    "timestamp": timestamp,
                                    "current_leader_epoch": -1,
                                }
                            ],
                        }
                    ],
                },
            )
            return response.topics[0].partitions[0]

        assert (await list_offset(-2)).offset == 0
        assert (await list_offset(-1)).offset == 4
        assert ((await list_offset(101)).offset, (await list_offset(101)).timestamp) == (1, 101)
        assert ((await list_offset(400)).offset, (await list_offset(400)).timestamp) == (2, 500)
        assert (await list_offset(501)).offset == -1
        assert ((await list_offset(-3)).offset, (await list_offset(-3)).timestamp) == (2, 500)
        assert (await list_offset(-1, version=1)).offset == 4
        assert (await list_offset(-1, other)).error_code == Errors.NOT_LEADER_OR_FOLLOWER
        # Three records of one batch share the largest timestamp: the first of them, not the
        # batch's last offset (RecordBatch.offsetOfMaxTimestamp, KAFKA-16310).
        same_ms = fmt.build_batch([fmt.Record(i, 900, None, b"e%d" % i) for i in range(3)])
        await c.call(PRODUCE, 9, produce_values("t", mine, same_ms))
        assert ((await list_offset(-3)).offset, (await list_offset(-3)).timestamp) == (4, 900)

    run(tmp_path, test)


def test_a_fetch_sees_records_appended_before_its_long_poll_began(tmp_path: Path) -> None:
    """A fetch found nothing and went to wait; a produce (pipelined behind it, or another
    client's) was appended before the wait was registered. The wait then slept its whole
    max_wait (500 ms by the clients' default) though the records were there; it reads again
    once registered now, as Kafka's DelayedFetch does (tryCompleteElseWatch)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        part = h.replicas.leader_partition("t", 0)
        body = codec.build_request(FETCH, 12, fetch_values("t", 0, 0) | {"max_wait": 60_000})
        request = Request(codec.RequestHeader(FETCH, 12, 1, "c"), body)
        waiting = await h.broker.fetch.handle_fetch(request)
        assert isinstance(waiting, Deferred)
        answer = asyncio.ensure_future(waiting.awaitable)
        h.replicas.append_local(part, batch([b"a"]), required_acks=1)
        response = await asyncio.wait_for(answer, 30)
        fetched = response["responses"][0]["partitions"][0]
        assert records_of(fetched["records"]) == [b"a"]

    run(tmp_path, test)


def test_a_produce_whose_batch_does_not_parse_fails_that_partition_alone(
    tmp_path: Path,
) -> None:
    """A CRC-valid batch naming codec 6 on a topic the broker recompresses: the error escaped
    the partition, no answer went out and the connection closed, after another partition of
    the same request had been appended (a retry would write it twice)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("v", 2, 1, {"compression.type": "gzip"})
        for p in (0, 1):
            h.move_leader("v", p, NODE_ID)
        good = batch([b"a"])
        bad = bytearray(good)
        attributes = int.from_bytes(bad[fmt.ATTRIBUTES_OFFSET : fmt.ATTRIBUTES_OFFSET + 2])
        bad[fmt.ATTRIBUTES_OFFSET : fmt.ATTRIBUTES_OFFSET + 2] = (attributes | 6).to_bytes(2)
        bad[fmt.CRC_OFFSET : fmt.CRC_OFFSET + 4] = fmt.compute_crc(bad, 0, len(bad)).to_bytes(4)
        values = {
            "acks": 1,
            "timeout": 5000,
            "topic_data": [
                {
                    "name": "v",
                    "partition_data": [
                        {"index": 0, "records": good},
                        {"index": 1, "records": bytes(bad)},
                    ],
                }
            ],
        }
        response = await c.call(PRODUCE, 9, values)
        errors = [p.error_code for p in response.responses[0].partition_responses]
        assert errors == [Errors.NONE, Errors.CORRUPT_MESSAGE]
        # The connection still serves.
        again = only_partition(await c.call(PRODUCE, 9, produce_values("v", 1, good, acks=1)))
        assert again.error_code == Errors.NONE

    run(tmp_path, test)


def list_offsets_values(
    topic: str, partition: int, timestamp: int, replica_id: int = -1, current_leader_epoch: int = -1
) -> dict[str, Any]:
    return {
        "replica_id": replica_id,
        "isolation_level": 0,
        "timeout": 1000,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {
                        "partition_index": partition,
                        "timestamp": timestamp,
                        "current_leader_epoch": current_leader_epoch,
                    }
                ],
            }
        ],
    }


async def lead_with_a_lagging_hw(h: Harness, c: AsyncWireClient, topic: str) -> Partition:
    """A partition of ``topic`` (3 replicas) whose leader, this node, holds records a and b
    (timestamps 100 and 101) above its HW 0 from an earlier epoch: the followers never fetched,
    and leadership went to broker 2 and came back with the ISR whole. Its epoch begins at 2."""
    await h.create_topic(topic, 3, 3)
    mine = h.led_partitions(topic)[0]
    part = h.replicas.get_partition(topic, mine)
    assert part is not None
    produced = await c.call(
        PRODUCE, 9, produce_values(topic, mine, batch([b"a", b"b"], timestamp=100), acks=1)
    )
    assert only_partition(produced).error_code == Errors.NONE
    for leader in (2, NODE_ID):
        h.change_partition(topic, mine, leader=leader)
    assert part.is_leader and part.replication is not None
    assert part.replication.leader_epoch_start_offset == 2
    assert (part.log.log_end_offset, part.high_watermark) == (2, 0)
    return part


def catch_up_alone(h: Harness, part: Partition) -> None:
    """The followers fall behind for longer than replica.lag.time.max.ms and leave the ISR:
    the leader alone moves the HW to its log end, past the start of its epoch."""
    assert part.replication is not None
    h.replicas.min_insync_replicas = 1
    h.clock[0] += part.replication.replica_lag_time_max_ms + 1
    h.change_partition(part.topic, part.partition, isr=(NODE_ID,))
    assert part.high_watermark == 2


def test_list_offsets_of_a_new_leader_whose_hw_lags_its_epoch(tmp_path: Path) -> None:
    """Kafka's ``Partition.fetchOffsetForTimestamp``: a leader whose HW is still below the log
    end its epoch began at (its followers have not fetched since) answers a consumer's
    "latest", and a lookup landing at or past the HW, with OFFSET_NOT_AVAILABLE (v5+) or
    LEADER_NOT_AVAILABLE (older versions), not with the older HW, which could step a
    consumer's position back. A HW behind the log end within one epoch is answered."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("same", 3, 3)
        same = h.led_partitions("same")[0]
        await c.call(PRODUCE, 9, produce_values("same", same, batch([b"x"]), acks=1))
        response = await c.call(LIST_OFFSETS, 7, list_offsets_values("same", same, -1))
        answer = response.topics[0].partitions[0]
        # This epoch began at 0: HW 0 is this leader's own, below its log end 1.
        assert (answer.error_code, answer.offset) == (Errors.NONE, 0)

        part = await lead_with_a_lagging_hw(h, c, "t")

        async def ask(timestamp: int, version: int = 7, replica_id: int = -1) -> tuple[int, int]:
            values = list_offsets_values("t", part.partition, timestamp, replica_id)
            answer = (await c.call(LIST_OFFSETS, version, values)).topics[0].partitions[0]
            return answer.error_code, answer.offset

        unavailable = Errors.OFFSET_NOT_AVAILABLE
        assert await ask(-1) == (unavailable, -1)
        assert await ask(-1, version=4) == (Errors.LEADER_NOT_AVAILABLE, -1)
        assert await ask(100) == (unavailable, -1)  # offset 0, not below the HW
        assert await ask(-3) == (unavailable, -1)
        # No record that late: the lagging error too (ReplicaManager.fetchOffset's "empty
        # offset response scenario").
        assert await ask(10**12) == (unavailable, -1)
        assert await ask(-2) == (Errors.NONE, 0)
        # Not a client's request: up to the log end (Kafka's lastFetchableOffset with no
        # isolation level), and no lagging error.
        assert await ask(-1, replica_id=2) == (Errors.NONE, 2)
        assert await ask(100, replica_id=2) == (Errors.NONE, 0)
        assert await ask(-3, replica_id=-2) == (Errors.NONE, 1)
        catch_up_alone(h, part)
        assert await ask(-1) == (Errors.NONE, 2)
        assert await ask(100) == (Errors.NONE, 0)
        assert await ask(-3) == (Errors.NONE, 1)  # records a and b: timestamps 100 and 101
        assert await ask(10**12) == (Errors.NONE, -1)

    run(tmp_path, test)


def test_list_offsets_for_debugging_may_ask_a_follower(tmp_path: Path) -> None:
    """``KafkaApis``' fetchOnlyFromLeader: replica id -2 (debugging) is answered by a follower
    from its own log, up to its log end; a client's or a broker's request gets
    NOT_LEADER_OR_FOLLOWER there."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 3)
        followed = h.led_partitions("t", by=2)[0]
        part = h.replicas.get_partition("t", followed)
        assert part is not None and not part.is_leader

        async def ask(replica_id: int, timestamp: int = -1) -> tuple[int, int]:
            values = list_offsets_values("t", followed, timestamp, replica_id)
            answer = (await c.call(LIST_OFFSETS, 7, values)).topics[0].partitions[0]
            return answer.error_code, answer.offset

        assert await ask(-2) == (Errors.NONE, 0)
        assert await ask(-2, timestamp=-2) == (Errors.NONE, 0)
        assert await ask(-1) == (Errors.NOT_LEADER_OR_FOLLOWER, -1)
        assert await ask(3) == (Errors.NOT_LEADER_OR_FOLLOWER, -1)
        unknown = list_offsets_values("t", 99, -1, -2)
        answer = (await c.call(LIST_OFFSETS, 7, unknown)).topics[0].partitions[0]
        assert answer.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION

    run(tmp_path, test)


def test_list_offsets_latest_answers_the_leaders_epoch(tmp_path: Path) -> None:
    """Partition.fetchOffsetForTimestamp: LATEST carries the leader's epoch, whatever the epoch
    cache holds (an earliest or by-time answer takes the epoch of its offset, -1 below the
    cache)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        part = h.replicas.get_partition("t", 0)
        assert part is not None and part.leader_epoch == 1
        part.log.epoch_cache._entries.clear()  # a log whose cache knows no epoch

        async def ask(timestamp: int) -> tuple[int, int]:
            answer = await c.call(LIST_OFFSETS, 7, list_offsets_values("t", 0, timestamp))
            p = answer.topics[0].partitions[0]
            return p.offset, p.leader_epoch

        assert await ask(-1) == (0, 1)
        assert await ask(-2) == (0, -1)

    run(tmp_path, test)


def test_a_follower_checks_a_clients_leader_epoch_before_it_says_it_does_not_lead(
    tmp_path: Path,
) -> None:
    """``Partition.getLocalLog``: the epoch check comes first, on any replica. A client with a
    stale epoch learns it is fenced (FENCED_LEADER_EPOCH), one ahead of this replica that it
    must wait (UNKNOWN_LEADER_EPOCH); with the replica's epoch, or none, it is not the leader."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 3)
        followed = h.led_partitions("t", by=2)[0]
        h.move_leader("t", followed, 3)  # epoch 1: a stale epoch 0 is then something to say
        part = h.replicas.get_partition("t", followed)
        assert part is not None and not part.is_leader
        epoch = leader_epoch(h, "t", followed)
        assert part.leader_epoch == epoch == 1
        refusals = {
            epoch - 1: Errors.FENCED_LEADER_EPOCH,
            epoch + 1: Errors.UNKNOWN_LEADER_EPOCH,
            epoch: Errors.NOT_LEADER_OR_FOLLOWER,
            -1: Errors.NOT_LEADER_OR_FOLLOWER,
        }
        for current, error in refusals.items():
            fetched = await c.call(
                FETCH, 12, fetch_values("t", followed, 0, current_leader_epoch=current)
            )
            assert only_partition(fetched).error_code == error, current
            values = list_offsets_values("t", followed, -1, current_leader_epoch=current)
            answer = (await c.call(LIST_OFFSETS, 7, values)).topics[0].partitions[0]
            assert answer.error_code == error, current
        # Another negative epoch: none to Fetch (FetchRequest.optionalEpoch), an old one to
        # ListOffsets (only ListOffsetsResponse.UNKNOWN_EPOCH, -1, is none).
        fetched = await c.call(FETCH, 12, fetch_values("t", followed, 0, current_leader_epoch=-5))
        assert only_partition(fetched).error_code == Errors.NOT_LEADER_OR_FOLLOWER
        values = list_offsets_values("t", followed, -1, current_leader_epoch=-5)
        answer = (await c.call(LIST_OFFSETS, 7, values)).topics[0].partitions[0]
        assert answer.error_code == Errors.FENCED_LEADER_EPOCH

    run(tmp_path, test)


def test_list_offsets_answers_a_duplicate_and_a_timestamp_its_version_lacks_with_errors(
    tmp_path: Path,
) -> None:
    """ReplicaManager.fetchOffset: a partition named twice (ListOffsetsRequest.
    duplicatePartitions) is answered once, INVALID_REQUEST; a negative timestamp that is not
    one the request's version knows is UNSUPPORTED_VERSION (isListOffsetsTimestampUnsupported),
    and -6 (EARLIEST_PENDING_UPLOAD, v11) finds nothing without remote storage."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 1)
        mine = h.led_partitions("t")[0]
        other = h.led_partitions("t", by=2)[0]
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"a"], timestamp=100)))
        values = list_offsets_values("t", mine, -1)
        first = values["topics"][0]["partitions"][0]
        values["topics"] = [
            {"name": "t", "partitions": [first, first | {"partition_index": other}]},
            {"name": "t", "partitions": [first | {"timestamp": -2}]},
        ]
        (topic,) = (await c.call(LIST_OFFSETS, 7, values)).topics
        answers = {p.partition_index: p.error_code for p in topic.partitions}
        assert len(topic.partitions) == 2
        assert answers == {mine: Errors.INVALID_REQUEST, other: Errors.NOT_LEADER_OR_FOLLOWER}

        for timestamp, version, expected in [
            (-3, 6, (Errors.UNSUPPORTED_VERSION, -1)),
            (-3, 7, (Errors.NONE, 0)),
            (-5, 8, (Errors.UNSUPPORTED_VERSION, -1)),
            (-5, 9, (Errors.NONE, -1)),
            (-6, 10, (Errors.UNSUPPORTED_VERSION, -1)),
            (-6, 11, (Errors.NONE, -1)),
            (-7, 11, (Errors.UNSUPPORTED_VERSION, -1)),
        ]:
            values = list_offsets_values("t", mine, timestamp)
            answer = (await c.call(LIST_OFFSETS, version, values)).topics[0].partitions[0]
            assert (answer.error_code, answer.offset) == expected, (timestamp, version)

    run(tmp_path, test)


# ------------------------------------------------------------------ OffsetForLeaderEpoch


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_answers_the_end_of_each_epoch(
    tmp_path: Path, version: int
) -> None:
    """What a consumer asks after a leader change (KIP-320): where the epoch of its position
    ends on the leader's log."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 3, 1)
        mine = h.led_partitions("t")[0]
        other = h.led_partitions("t", by=2)[0]
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"a", b"b"])))
        first = leader_epoch(h, "t", mine)
        # Leadership goes away and comes back: two new epochs, the first with no records.
        h.move_leader("t", mine, 2)
        h.move_leader("t", mine, NODE_ID)
        latest = leader_epoch(h, "t", mine)
        assert latest == first + 2
        await c.call(PRODUCE, 9, produce_values("t", mine, batch([b"c"])))

        async def ask(
            epoch: int, *, current: int = -1, partition: int = mine, topic: str = "t"
        ) -> tuple[int, int, int]:
            values: dict[str, Any] = {
                "replica_id": -1,
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [
                            {
                                "partition": partition,
                                "current_leader_epoch": current,
                                "leader_epoch": epoch,
                            }
                        ],
                    }
                ],
            }
            response = await c.call(OFFSET_FOR_LEADER_EPOCH, version, values)
            (answer,) = response.topics[0].partitions
            assert answer.partition == partition
            return answer.error_code, answer.leader_epoch, answer.end_offset

        none = Errors.NONE
        assert await ask(first) == (none, first, 2)  # ends where the next epoch starts
        assert await ask(first + 1) == (none, first, 2)  # no records: the epoch below answers
        assert await ask(latest) == (none, latest, 3)  # the latest ends at the log end
        assert await ask(latest + 1) == (none, -1, -1)
        assert await ask(first, current=latest) == (none, first, 2)
        assert (await ask(first, current=latest - 1))[0] == Errors.FENCED_LEADER_EPOCH
        assert (await ask(first, current=latest + 1))[0] == Errors.UNKNOWN_LEADER_EPOCH
        # Only -1 (NO_PARTITION_LEADER_EPOCH) is no epoch: -2 is an old one.
        assert (await ask(first, current=-2))[0] == Errors.FENCED_LEADER_EPOCH
        assert (await ask(0, partition=other))[0] == Errors.NOT_LEADER_OR_FOLLOWER
        assert (await ask(0, topic="nope"))[0] == Errors.UNKNOWN_TOPIC_OR_PARTITION

    run(tmp_path, test)


def leader_epoch(h: Harness, topic: str, partition: int) -> int:
    state = h.cache.image.partition(h.topic_id(topic), partition)
    assert state is not None
    return state.leader_epoch


# ------------------------------------------------------------------ FindCoordinator


def test_find_coordinator(tmp_path: Path) -> None:
    async def test(h: Harness, c: AsyncWireClient) -> None:
        offsets = h.topic_id(OFFSETS_TOPIC_NAME)

        def expected(group: str) -> tuple[int, int]:
            state = h.cache.image.partition(offsets, partition_for(group, OFFSETS_PARTITIONS))
            assert state is not None
            return state.leader, 9000 + state.leader

        for version in (0, 1, 3):
            response = await c.call(FIND_COORDINATOR, version, {"key": "group-a", "key_type": 0})
            assert response.error_code == Errors.NONE
            assert (response.node_id, response.port) == expected("group-a")
        response = await c.call(
            FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["g1", "g2", "g3"]}
        )
        assert [(x.key, x.error_code, (x.node_id, x.port)) for x in response.coordinators] == [
            (g, 0, expected(g)) for g in ("g1", "g2", "g3")
        ]
        txn = await c.call(FIND_COORDINATOR, 6, {"key_type": 1, "coordinator_keys": ["tx"]})
        # No transaction coordinator: refused, fatally for every client (not retried).
        assert txn.coordinators[0].error_code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert txn.coordinators[0].error_message == NO_TRANSACTIONS
        odd = await c.call(FIND_COORDINATOR, 2, {"key": "g", "key_type": 7})
        assert odd.error_code == Errors.INVALID_REQUEST

    run(tmp_path, test)


def test_handlers_never_return_before_a_slower_earlier_request(tmp_path: Path) -> None:
    """Responses leave in request order even when a later one is ready first."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        ids = []
        for _ in range(3):
            ids.append(await c.send(FETCH, 12, fetch_values("t", 0, 0, max_wait_ms=200)))
            ids.append(await c.send(API_VERSIONS, 0, {}))
        got = []
        for i in range(6):
            correlation_id, _ = await c.receive(
                FETCH if i % 2 == 0 else API_VERSIONS, 12 if i % 2 == 0 else 0
            )
            got.append(correlation_id)
        assert got == ids

    run(tmp_path, test)


def test_keyless_records_of_a_compacted_topic_and_a_batch_larger_than_a_segment(
    tmp_path: Path,
) -> None:
    """LogValidator.validateKey: each keyless record of a compacted topic is a record error of
    its own (the Java producer fails those records with it); UnifiedLog.append: produced data
    larger than segment.bytes is RECORD_LIST_TOO_LARGE, whatever max.message.bytes allows."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("compacted", 1, 1, {"cleanup.policy": "compact"})
        small = {"internal.segment.bytes": "2048", "max.message.bytes": "100000"}
        await h.create_topic("small", 1, 1, small)
        for topic in ("compacted", "small"):
            h.move_leader(topic, 0, NODE_ID)
        records = [
            fmt.Record(0, 1_700_000_000_000, b"k", b"v"),
            fmt.Record(1, 1_700_000_000_000, None, b"no key"),
            fmt.Record(2, 1_700_000_000_000, None, b"nor here"),
        ]
        response = await c.call(
            PRODUCE, 9, produce_values("compacted", 0, fmt.build_batch(records))
        )
        refused = only_partition(response)
        assert refused.error_code == Errors.INVALID_RECORD
        message = (
            "Compacted topic cannot accept message without key in topic partition compacted-0."
        )
        assert [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors] == [
            (1, message),
            (2, message),
        ]
        assert refused.error_message.startswith(
            "One or more records have been rejected due to 2 record errors in total"
        )
        big = batch([b"x" * 3000])
        too_big = only_partition(await c.call(PRODUCE, 9, produce_values("small", 0, big)))
        assert too_big.error_code == Errors.RECORD_LIST_TOO_LARGE
        fine = only_partition(await c.call(PRODUCE, 9, produce_values("small", 0, batch([b"y"]))))
        assert (fine.error_code, fine.base_offset) == (Errors.NONE, 0)

    run(tmp_path, test)


def test_a_fetch_reading_an_older_segment_than_the_high_watermark_is_answered_at_once(
    tmp_path: Path,
) -> None:
    """A read stops at its segment's end: with fetch.min.bytes above what a small segment
    holds, a consumer replaying a backlog waited fetch.max.wait.ms at every segment. Kafka's
    DelayedFetch.tryComplete answers such a fetch at once ("fetching older segments")."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        one = fmt.build_batch([fmt.Record(0, 1_700_000_000_000, None, b"x" * 500)])
        await h.create_topic("t", 1, 1, {"internal.segment.bytes": str(len(one) + 10)})
        h.move_leader("t", 0, NODE_ID)
        for _ in range(3):
            await c.call(PRODUCE, 9, produce_values("t", 0, one))
        part = h.replicas.leader_partition("t", 0)
        assert len(part.log.segments) >= 3 and part.high_watermark == 3
        # fetch.min.bytes above the whole backlog: only its segments' ends answer early.
        for offset in (0, 1):  # each in a segment before the high watermark's
            values = fetch_values("t", 0, offset, min_bytes=10 * len(one), max_wait_ms=60_000)
            # Answered, not held for max_wait (60 s).
            answer = only_partition(await asyncio.wait_for(c.call(FETCH, 12, values), 30))
            assert [h.base_offset for _, h in fmt.iter_headers(answer.records)] == [offset]

    run(tmp_path, test)


def test_a_fetch_from_a_gap_compaction_left_before_the_high_watermark_waits(
    tmp_path: Path,
) -> None:
    """The cleaner dropped the tombstones at offsets 10-14, the end of a closed segment, and
    the next segment starts at the high watermark: a fetch from 12 reads nothing. Answered at
    once as a read "on an older segment", its consumer fetched again in a hot loop; Kafka's
    DelayedFetch looks at where the read ended (the log end), so it waits, and the record
    produced meanwhile answers it."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        now = h.clock[0]
        await h.create_topic("t", 1, 1, {"cleanup.policy": "compact", "delete.retention.ms": "1"})
        h.move_leader("t", 0, NODE_ID)
        values: list[tuple[bytes, bytes | None]] = [(f"k{i}".encode(), b"v") for i in range(10)]
        values += [(f"k{i}".encode(), None) for i in range(5, 10)]  # tombstones
        for key, value in values:
            one = fmt.build_batch([fmt.Record(0, now, key, value)])
            answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, one)))
            assert answer.error_code == Errors.NONE
        part = h.replicas.leader_partition("t", 0)
        part.log.roll()
        part.log.compact(now, high_watermark=15)
        part.log.compact(now + 60_000, high_watermark=15)
        assert [s.base_offset for s in part.log.segments] == [0, 15]
        assert part.high_watermark == 15 and part.log.bytes_between(12, 15) == 0
        # The fetch, then a produce behind it on the same connection: its handler runs after
        # the fetch's, so an early empty answer comes before the record exists.
        await c.send(FETCH, 12, fetch_values("t", 0, 12, max_wait_ms=60_000))
        later = fmt.build_batch([fmt.Record(0, now, b"k0", b"w")])
        await c.send(PRODUCE, 9, produce_values("t", 0, later))
        _, fetched = await asyncio.wait_for(c.receive(FETCH, 12), 30)
        records = only_partition(fetched).records
        assert [header.base_offset for _, header in fmt.iter_headers(records)] == [15]
        _, produced = await asyncio.wait_for(c.receive(PRODUCE, 9), 30)
        assert only_partition(produced).error_code == Errors.NONE

    run(tmp_path, test)


def test_max_timestamp_counts_only_records_at_or_after_the_log_start(tmp_path: Path) -> None:
    """ListOffsets -3 looked for the largest timestamp of the whole segment: once DeleteRecords
    moved the log start past that record, it answered none with records left (Kafka answers
    the deleted record's offset, which no consumer can fetch)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        for ts in (5_000, 1_000, 3_000, 2_000):
            one = fmt.build_batch([fmt.Record(0, ts, None, b"v")])
            await c.call(PRODUCE, 9, produce_values("t", 0, one))

        async def newest() -> tuple[int, int]:
            answer = await c.call(LIST_OFFSETS, 7, list_offsets_values("t", 0, -3))
            p = answer.topics[0].partitions[0]
            return p.offset, p.timestamp

        assert await newest() == (0, 5_000)
        h.replicas.delete_records("t", 0, 1)
        assert await newest() == (2, 3_000)

    run(tmp_path, test)


def test_zstd_needs_produce_v7_and_fetch_v10(tmp_path: Path) -> None:
    """KIP-110: ProduceRequest.validateRecords refuses a zstd batch below v7, and
    KafkaApis.maybeConvertFetchedData a zstd topic's partitions below Fetch v10, with
    UNSUPPORTED_COMPRESSION_TYPE (an older client cannot read them)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        zstd = fmt.build_batch(
            [fmt.Record(0, 1_700_000_000_000, None, b"z")], compression=fmt.Compression.ZSTD
        )
        for version in (3, 6):
            old = only_partition(await c.call(PRODUCE, version, produce_values("t", 0, zstd)))
            assert old.error_code == Errors.UNSUPPORTED_COMPRESSION_TYPE, version
        answer = only_partition(await c.call(PRODUCE, 7, produce_values("t", 0, zstd)))
        assert (answer.error_code, answer.base_offset) == (Errors.NONE, 0)
        await h.create_topic("z", 1, 1, configs={"compression.type": "zstd"})
        h.move_leader("z", 0, NODE_ID)
        await c.call(PRODUCE, 9, produce_values("z", 0, batch([b"a"])))
        old_fetch = only_partition(await c.call(FETCH, 9, fetch_values("z", 0, 0)))
        assert old_fetch.error_code == Errors.UNSUPPORTED_COMPRESSION_TYPE
        assert not old_fetch.records
        fetched = only_partition(await c.call(FETCH, 10, fetch_values("z", 0, 0)))
        assert fetched.error_code == Errors.NONE and records_of(fetched.records) == [b"a"]
        # Kafka converts once the fetch completes: an old client's long poll on an idle
        # zstd partition waits as any other, and wakes when records come (it was answered at
        # once, and its client fetched in a hot loop; found by a review).
        started = time.monotonic()
        idle = only_partition(await c.call(FETCH, 9, fetch_values("z", 0, 1, max_wait_ms=300)))
        assert idle.error_code == Errors.UNSUPPORTED_COMPRESSION_TYPE
        assert time.monotonic() - started >= 0.25
        waiting = await c.send(FETCH, 9, fetch_values("z", 0, 1, max_wait_ms=10_000))
        producer = await h.client()
        await producer.call(PRODUCE, 9, produce_values("z", 0, batch([b"b"])))
        await producer.close()
        correlation_id, woken = await c.receive(FETCH, 9)
        assert correlation_id == waiting
        assert only_partition(woken).error_code == Errors.UNSUPPORTED_COMPRESSION_TYPE
        assert time.monotonic() - started < 5

    run(tmp_path, test)


def test_a_batch_costly_to_read_is_read_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A produced batch whose records may take 64 KiB or more decompressed is read on the
    listener's codec threads before its append, as Kafka's request handler threads validate
    a produce: a zstd batch of a few KiB may hold 64 MiB of records, a second or more of
    reading that held every other client of the node. Here the read waits until another
    client has been answered, which it could not be were the read on the loop; small batches
    are read at their append, on the loop."""
    gate = threading.Event()
    threads: list[str] = []
    real = Log.scan_for_leader

    def scan(log: Log, records: bytes) -> LeaderScan | None:
        threads.append(threading.current_thread().name)
        if not gate.wait(TEST_TIMEOUT_S / 2):
            raise AssertionError("no other client was answered while the batch was read")
        return real(log, records)

    monkeypatch.setattr(Log, "scan_for_leader", scan)

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)
        other = await h.client()
        sent = [b"%03d" % i + b"v" * 97 for i in range(700)]
        for n, records in enumerate(
            [
                batch(sent),  # 74 KiB
                fmt.build_batch(
                    [fmt.Record(i, 1_700_000_000_000, None, v) for i, v in enumerate(sent)],
                    compression=fmt.Compression.LZ4,
                ),
                fmt.build_batch(
                    [fmt.Record(i, 1_700_000_000_000, None, b"g%d" % i) for i in range(20)],
                    compression=fmt.Compression.GZIP,  # declares no size: 1032 times its body
                ),
            ]
        ):
            gate.clear()
            produced = asyncio.ensure_future(c.call(PRODUCE, 9, produce_values("t", 0, records)))
            await other.call(METADATA, 9, metadata_values("t", auto_create=False))
            gate.set()
            answer = only_partition(await produced)
            assert answer.error_code == Errors.NONE, n
            assert len(threads) == n + 1 and threads[-1].startswith("kafka-codec"), threads
        answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, batch([b"s"]))))
        assert answer.error_code == Errors.NONE and len(threads) == 3
        fetched = only_partition(await c.call(FETCH, 12, fetch_values("t", 0, 0)))
        assert records_of(fetched.records) == [*sent, *sent, *(b"g%d" % i for i in range(20)), b"s"]
        await other.close()

    run(tmp_path, test)


def test_a_storage_error_reads_as_not_leader_to_fetch_v5_and_older(tmp_path: Path) -> None:
    """KafkaApis.maybeDownConvertStorageError: Fetch v5 and older clients take
    KAFKA_STORAGE_ERROR for fatal; NOT_LEADER_OR_FOLLOWER makes them refresh and retry."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        h.move_leader("t", 0, NODE_ID)

        def broken(*_: Any, **__: Any) -> Any:
            raise KafkaError(Errors.KAFKA_STORAGE_ERROR, "the segment is unreadable")

        with mock.patch.object(h.replicas, "fetch", broken):
            for version, code in [
                (4, Errors.NOT_LEADER_OR_FOLLOWER),
                (5, Errors.NOT_LEADER_OR_FOLLOWER),
                (6, Errors.KAFKA_STORAGE_ERROR),
                (12, Errors.KAFKA_STORAGE_ERROR),
            ]:
                answer = only_partition(await c.call(FETCH, version, fetch_values("t", 0, 0)))
                assert answer.error_code == code, version

    run(tmp_path, test)


def test_a_transactional_batch_fails_the_whole_produce(tmp_path: Path) -> None:
    """KafkaApis.handleProduceRequest: transactional records whose transactional id the
    authorizer refuses fail every partition of the request with
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED (kcoord refuses every transactional id), and
    nothing is appended, the other partitions' batches included."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 2, 1)
        for p in (0, 1):
            h.move_leader("t", p, NODE_ID)
        txn = fmt.build_batch(
            [fmt.Record(0, 1_700_000_000_000, None, b"t")],
            producer_id=9,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
        values = produce_values("t", 0, txn)
        values["topic_data"][0]["partition_data"].append({"index": 1, "records": batch([b"x"])})
        response = await c.call(PRODUCE, 9, values)
        codes = [p.error_code for t in response.responses for p in t.partition_responses]
        assert codes == [Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED] * 2
        for p in (0, 1):
            fetched = only_partition(await c.call(FETCH, 12, fetch_values("t", p, 0)))
            assert fetched.high_watermark == 0
        # Not a batch of magic 2: refused as such, whatever its attribute bits say.
        other_magic = bytearray(txn)
        other_magic[16] = 1
        answer = only_partition(
            await c.call(PRODUCE, 9, produce_values("t", 0, bytes(other_magic)))
        )
        assert answer.error_code == Errors.INVALID_RECORD

    run(tmp_path, test)


def test_auto_creations_the_controller_refuses_are_logged_once_per_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line per refused topic: a Metadata request naming 100,000 wrote 16 MB of log."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await c.call(METADATA, 12, metadata_values(*(f"c.{i}" for i in range(5))))
        caplog.clear()
        # Each collides with one that exists (Topic.hasCollision): refused by the controller,
        # answered as KRaft's AutoTopicCreationManager answers every topic it sent (it was
        # INVALID_TOPIC_EXCEPTION).
        response = await c.call(METADATA, 12, metadata_values(*(f"c_{i}" for i in range(5))))
        assert {t.error_code for t in response.topics} == {Errors.UNKNOWN_TOPIC_OR_PARTITION}
        lines = [r.getMessage() for r in caplog.records if "auto-creating" in r.getMessage()]
        assert len(lines) == 1, lines
        assert lines[0].startswith("auto-creating 5 topics refused: c_0: INVALID_TOPIC")
        assert lines[0].endswith("; and 2 more")

    run(tmp_path, test)


def test_a_disk_error_reading_the_producer_state_fails_the_log_directory(
    tmp_path: Path,
) -> None:
    """An I/O error reading the batch headers a new leadership's producer state comes from was
    taken for a segment let go under the read and retried: every idempotent produce of the
    partition was refused while the node stayed its leader. It fails the log directory (the
    node halts and the leadership moves), as Kafka's reads do (review helper-277)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        pid, part = await _batches_then_a_new_leadership(h, c, 3)
        segments = {id(s) for s in part.log.segments}
        scan_headers = LogSegment.scan_headers

        def failing_scan(segment: LogSegment, *args: Any, **kwargs: Any) -> Any:
            if id(segment) in segments:
                raise OSError(errno.EIO, "Input/output error")
            return scan_headers(segment, *args, **kwargs)

        failures: list[str] = []
        h.replicas.log_dir_failure.fail = lambda what, error: failures.append(what)  # type: ignore[method-assign]
        following = batch([b"w"], producer_id=pid, producer_epoch=0, base_sequence=3)
        with mock.patch.object(LogSegment, "scan_headers", failing_scan):
            answer = only_partition(await c.call(PRODUCE, 9, produce_values("t", 0, following)))
        assert answer.error_code == Errors.KAFKA_STORAGE_ERROR
        assert failures and set(failures) == {"reading the producer state of t-0"}

    run(tmp_path, test)


def test_a_disk_error_in_list_offsets_fails_the_log_directory(tmp_path: Path) -> None:
    """ListOffsets by timestamp that met an I/O error answered KAFKA_STORAGE_ERROR and the node
    went on leading the partition; a Fetch's read fails the log directory (review helper-277)."""

    async def test(h: Harness, c: AsyncWireClient) -> None:
        await h.create_topic("t", 1, 1)
        await c.call(PRODUCE, 9, produce_values("t", 0, batch([b"x"])))
        failures: list[str] = []
        h.replicas.log_dir_failure.fail = lambda what, error: failures.append(what)  # type: ignore[method-assign]

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise OSError(errno.EIO, "Input/output error")

        with mock.patch.object(Log, "offset_for_timestamp", failing):
            response = await c.call(LIST_OFFSETS, 7, list_offsets_values("t", 0, 0))
        assert response.topics[0].partitions[0].error_code == Errors.KAFKA_STORAGE_ERROR
        assert failures == ["reading t-0"]

    run(tmp_path, test)
