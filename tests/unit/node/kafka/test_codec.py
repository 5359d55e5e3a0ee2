"""The Kafka codec (node/kafka/codec.py): request decoding, the response helper, framing.

Requests: for every API version we advertise, any request kio can write decodes to exactly what
kio's own reader makes of it; malformed input only ever raises ``DecodeError`` (a seeded fuzz
prints its seed). Responses: ``build_response`` + ``encode_response`` produce frames that kio
reads back to the same values, for every advertised version, with fields a version lacks
dropped and missing ones defaulted.
"""

from __future__ import annotations

import datetime
import io
import random
import socket
import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records

from kcoord.errors import Errors
from kcoord.node.kafka import client, codec
from kcoord.node.kafka.codec import DecodeError
from tests.unit.node.kafka.wire import decode_response, encode_request

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

# What the broker advertises (test_handlers checks the live registry against this table).
ADVERTISED = {
    0: range(3, 14),  # Produce
    1: range(4, 19),  # Fetch
    2: range(1, 12),  # ListOffsets
    3: range(14),  # Metadata
    10: range(7),  # FindCoordinator
    17: range(2),  # SaslHandshake
    18: range(5),  # ApiVersions
    19: range(2, 8),  # CreateTopics
    20: range(1, 7),  # DeleteTopics
    21: range(3),  # DeleteRecords
    22: range(7),  # InitProducerId
    23: range(2, 5),  # OffsetForLeaderEpoch
    29: range(1, 4),  # DescribeAcls
    30: range(1, 4),  # CreateAcls
    31: range(1, 4),  # DeleteAcls
    32: range(1, 5),  # DescribeConfigs
    33: range(3),  # AlterConfigs
    35: range(1, 6),  # DescribeLogDirs
    36: range(3),  # SaslAuthenticate
    37: range(4),  # CreatePartitions
    43: range(3),  # ElectLeaders
    44: range(2),  # IncrementalAlterConfigs
    60: range(3),  # DescribeCluster
    61: range(1),  # DescribeProducers
    66: range(3),  # ListTransactions
    75: range(1),  # DescribeTopicPartitions
}
ALL_VERSIONS = [(key, v) for key, r in ADVERTISED.items() for v in r]
# The group coordinator's APIs (node/kafka/groups.py registers them; test_group_apis checks
# the live registry against this table).
GROUP_ADVERTISED = {
    8: range(2, 10),  # OffsetCommit (v10 names topics by id only: not served)
    9: range(1, 10),  # OffsetFetch (likewise)
    11: range(10),  # JoinGroup
    12: range(5),  # Heartbeat
    13: range(6),  # LeaveGroup
    14: range(6),  # SyncGroup
    15: range(7),  # DescribeGroups
    16: range(6),  # ListGroups
    42: range(3),  # DeleteGroups
    47: range(1),  # OffsetDelete
    68: range(2),  # ConsumerGroupHeartbeat
    69: range(2),  # ConsumerGroupDescribe
}
GROUP_VERSIONS = [(key, v) for key, r in GROUP_ADVERTISED.items() for v in r]


def test_advertised_versions_are_within_kio() -> None:
    for key, versions in ADVERTISED.items():
        kio = codec.kio_versions(key)
        assert kio.start <= versions.start and versions.stop <= kio.stop, key


# ------------------------------------------------------------------ requests


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS)
def test_requests_decode_as_kio_reads_them(api_key: int, version: int) -> None:
    cls = codec.request_schema(api_key, version)
    assert cls is not None
    write, read = entity_writer(cls), entity_reader(cls)

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(st.from_type(cls))
    def check(entity: Any) -> None:
        buf = io.BytesIO()
        write(buf, entity)
        data = buf.getvalue()
        ours, size = codec._decoder(cls)(memoryview(data), 0)
        theirs, their_size = read(data, 0)
        assert size == their_size == len(data)
        assert ours == theirs

    check()


@pytest.mark.parametrize(("api_key", "version"), [(3, 1), (3, 9), (3, 12), (0, 9), (1, 12)])
def test_whole_requests_with_headers(api_key: int, version: int) -> None:
    values: dict[str, Any] = {"topics": [{"name": "orders", "topic_id": None}]}
    if api_key == 0:
        values = {
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [{"name": "t", "partition_data": []}],
        }
    if api_key == 1:
        values = {"max_wait": 500, "min_bytes": 1, "topics": [], "forgotten_topics_data": []}
    for client_id in ("client-1", "", None):
        frame = encode_request(api_key, version, 77, values, client_id=client_id)
        assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
        header, body = codec.decode_request(frame[4:])
        assert header == codec.RequestHeader(api_key, version, 77, client_id)
        assert body == codec.build_request(api_key, version, values)


def test_unknown_tagged_fields_are_skipped_and_known_ones_read() -> None:
    # Fetch v12: cluster_id is tagged field 0 of the request. Add it and an unknown tag 9.
    base = encode_request(1, 12, 5, {"max_wait": 1, "min_bytes": 1, "topics": []})[4:]
    assert base.endswith(b"\x00")  # no tagged fields in the body
    cluster = b"\x04abc"  # compact string "abc": length + 1, then the bytes
    tags = b"\x02" + b"\x00" + bytes([len(cluster)]) + cluster + b"\x09\x02zz"
    header, body = codec.decode_request(base[:-1] + tags)
    assert header.correlation_id == 5
    assert body.cluster_id == "abc"


def test_a_huge_array_length_is_refused_not_allocated() -> None:
    """kio's own struct-array reader allocates the announced length first: a 2^31 count
    aborts the process with a Rust out-of-memory error. Ours refuses it."""
    prefix = struct.pack(">hhih", 3, 1, 1, -1)  # Metadata v1, correlation 1, null client id
    for count in (0x7FFFFFFF, 5000, 2):
        with pytest.raises(DecodeError):
            codec.decode_request(prefix + struct.pack(">i", count) + b"\x00\x01x")
    flexible = struct.pack(">hhih", 3, 12, 1, -1) + b"\x00"
    with pytest.raises(DecodeError):
        codec.decode_request(flexible + b"\xff\xff\xff\xff\x07")


def test_a_request_of_more_than_max_request_items_elements_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Elements of every array at every depth count: a 3 MB Produce of a million 3-byte topic
    entries took 2.5 s of CPU and 56 MB to decode, and 100 MiB frames of them over a minute
    each."""
    commit = {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": ""}

    def offset_commit(topics: int, partitions: int) -> bytes:
        values = {
            **commit,
            "topics": [
                {
                    "name": f"t{t}",
                    "partitions": [
                        {"partition_index": p, "committed_offset": 0} for p in range(partitions)
                    ],
                }
                for t in range(topics)
            ],
        }
        return encode_request(8, 8, 1, values)[4:]

    monkeypatch.setattr(codec, "MAX_REQUEST_ITEMS", 10)
    _, body = codec.decode_request(offset_commit(2, 4))  # 2 topics + 8 partitions
    assert len(body.topics) == 2
    with pytest.raises(DecodeError, match="more than 10 array elements"):
        codec.decode_request(offset_commit(3, 3))  # 3 + 9
    _, body = codec.decode_request(offset_commit(2, 4))  # each request counts from the start
    assert len(body.topics) == 2
    monkeypatch.undo()
    # The frame of a million and one topic entries: refused by its count, nothing read.
    count = codec.MAX_REQUEST_ITEMS + 1
    produce = struct.pack(">hhih", 0, 9, 1, -1) + b"\x00" + b"\x00" + struct.pack(">hi", -1, 0)
    produce += b"\xc2\x84\x3d" + b"\x01\x01\x00" * count + b"\x00"  # varint 1,000,002
    with pytest.raises(DecodeError, match="more than 1000000 array elements"):
        codec.decode_request(produce)


def test_strings_that_are_not_utf8_are_read_with_replacement_characters() -> None:
    """Java's ``new String(bytes, UTF_8)``, in Kafka's readers, replaces bytes that are not
    UTF-8: a client whose client.id is Latin-1 was cut off at its first ApiVersions."""
    header_v1 = struct.pack(">hhi", 18, 0, 7) + struct.pack(">h", 4) + b"caf\xe9"
    header, _ = codec.decode_request(header_v1)
    assert header.client_id == "caf\ufffd"
    # ApiVersions v3 (flexible): compact strings in the body.
    header_v2 = struct.pack(">hhi", 18, 3, 7) + struct.pack(">h", 1) + b"c" + b"\x00"
    body = b"\x05lib\xff" + b"\x041.0" + b"\x00"  # lengths + 1
    _, request = codec.decode_request(header_v2 + body)
    assert request.client_software_name == "lib\ufffd"
    assert request.client_software_version == "1.0"
    # Metadata v1: a legacy (int16-length) string in an array.
    metadata = struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">ih", 1, 3) + b"\xc3(x"
    _, request = codec.decode_request(metadata)
    assert request.topics[0].name == "\ufffd(x"
    # A string running past the end is still refused, not read short.
    with pytest.raises(DecodeError):
        codec.decode_request(header_v1[:-1])
    # So is one too long once its bad bytes are replaced (3 bytes each): no record could
    # carry it. A JoinGroup v5's group id, at its largest that still fits.
    for bad, refused in ((10_922, False), (10_923, True)):  # 3 * 10,922 = 32,766 bytes
        join = struct.pack(">hhih", 11, 5, 1, -1) + struct.pack(">h", bad) + b"\xff" * bad
        join += struct.pack(">ii", 6000, 6000) + struct.pack(">hh", 0, -1)  # no member, instance
        join += struct.pack(">h", 8) + b"consumer" + struct.pack(">i", 0)  # no protocols
        if refused:
            with pytest.raises(DecodeError, match="32769 bytes once its bad bytes are U"):
                codec.decode_request(join)
        else:
            assert len(codec.decode_request(join)[1].group_id) == bad


def test_a_string_over_32767_bytes_is_refused_even_where_its_length_is_a_varint() -> None:
    """Kafka's generated readers: "string field groupId had invalid length 40000". A compact
    string's varint can say more than Short.MAX_VALUE; the coordinator's records cannot
    carry it, and refusing that write reloaded every group of the partition."""
    commit = {"generation_id_or_member_epoch": -1, "member_id": "", "topics": []}
    longest = "é" * (0x7FFF // 2) + "g"  # 32767 bytes: counted in bytes, not characters
    for field in ("group_id", "group_instance_id"):  # non-nullable, nullable
        values = {"group_id": "g", "group_instance_id": None, **commit, field: longest}
        _, body = codec.decode_request(encode_request(8, 8, 1, values)[4:])  # OffsetCommit v8
        assert getattr(body, field) == longest
        values[field] = longest + "g"
        with pytest.raises(DecodeError, match="string of 32768 bytes"):
            codec.decode_request(encode_request(8, 8, 1, values)[4:])
    # A tagged one too: Fetch v12's cluster_id (tag 0).
    base = encode_request(1, 12, 5, {"max_wait": 1, "min_bytes": 1, "topics": []})[4:]
    cluster = b"\x81\x80\x02" + b"c" * 0x8000  # varint 32769: 32768 bytes
    tags = b"\x01\x00" + b"\x83\x80\x02" + cluster
    with pytest.raises(DecodeError, match="string of 32768 bytes"):
        codec.decode_request(base[:-1] + tags)


def test_a_retention_time_past_a_timedelta_saturates_instead_of_failing_the_request() -> None:
    """OffsetCommit v2-v4's retention_time_ms is any long to Kafka; above about 9.2e15 ms
    ``timedelta`` overflowed and the connection was closed."""

    def offset_commit_v2(retention_ms: int) -> bytes:
        group = struct.pack(">h", 1) + b"g"
        return (
            struct.pack(">hhih", 8, 2, 1, -1)
            + group
            + struct.pack(">ih", -1, 0)  # generation, member id ""
            + struct.pack(">q", retention_ms)
            + struct.pack(">i", 0)  # no topics
        )

    day = datetime.timedelta(days=1)
    for sent, read in [
        (2**63 - 1, datetime.timedelta.max),
        (-(2**63), datetime.timedelta.min),
        (-1, datetime.timedelta(milliseconds=-1)),
        (7 * 86_400_000, 7 * day),
    ]:
        _, body = codec.decode_request(offset_commit_v2(sent))
        assert body.retention_time // datetime.timedelta(milliseconds=1) == (
            read // datetime.timedelta(milliseconds=1)
        )


def test_null_is_refused_where_the_schema_says_not_nullable() -> None:
    # FindCoordinator v4: coordinator_keys is a non-nullable array; compact length 0 is null.
    find = struct.pack(">hhih", 10, 4, 1, -1) + b"\x00" + b"\x00"  # key type 0
    with pytest.raises(DecodeError, match="null array"):
        codec.decode_request(find + b"\x00" + b"\x00")
    _, body = codec.decode_request(find + b"\x01" + b"\x00")
    assert body.coordinator_keys == ()
    # Metadata v12: topics is nullable (null means every topic).
    _, body = codec.decode_request(struct.pack(">hhih", 3, 12, 1, -1) + b"\x00\x00\x01\x00\x00")
    assert body.topics is None


def test_fuzzed_requests_only_raise_decode_error() -> None:
    seed = random.randrange(2**32)
    print(f"fuzz seed {seed}")
    rng = random.Random(seed)
    seeds = [
        encode_request(k, v, 1, {})[4:]
        for k, v in ALL_VERSIONS
        if codec.request_schema(k, v) is not None
    ]
    decoded = failed = 0
    for _ in range(20_000):
        data = bytearray()
        if rng.random() < 0.3:
            key, version = rng.choice(ALL_VERSIONS)
            data += struct.pack(">hhi", key, version, 1) + rng.randbytes(rng.randrange(0, 64))
        else:
            data += rng.choice(seeds)
            for _ in range(rng.randrange(1, 6)):
                what = rng.random()
                if what < 0.5 and data:
                    data[rng.randrange(len(data))] = rng.choice(
                        [0, 0x7F, 0x80, 0xFF, rng.randrange(256)]
                    )
                elif what < 0.7:
                    del data[rng.randrange(len(data) + 1) :]
                else:
                    pos = rng.randrange(len(data) + 1)
                    data[pos:pos] = rng.randbytes(rng.randrange(1, 8))
        try:
            codec.decode_request(bytes(data))
            decoded += 1
        except DecodeError:
            failed += 1
    assert decoded and failed


# ------------------------------------------------------------------ responses

TOPIC_ID = "kEsXs9ycS3OoK-8zTtGNGQ"
BATCH = bytes(range(40))

# One set of values per API, holding the fields of every version; build_response keeps the
# ones a version has.
VALUES: dict[int, dict[str, Any]] = {
    0: {
        "throttle_time": 5,
        "responses": [
            {
                "name": "t",
                "topic_id": TOPIC_ID,
                "partition_responses": [
                    {
                        "index": 3,
                        "error_code": Errors.NOT_LEADER_OR_FOLLOWER,
                        "base_offset": 42,
                        "log_append_time": -1,
                        "log_start_offset": 7,
                        "record_errors": [{"batch_index": 1, "batch_index_error_message": "x"}],
                        "error_message": "moved",
                        "current_leader": {"leader_id": 2, "leader_epoch": 9},
                    }
                ],
            }
        ],
        "node_endpoints": [{"node_id": 2, "host": "h2", "port": 9102, "rack": None}],
    },
    1: {
        "throttle_time": 0,
        "error_code": Errors.NONE,
        "session_id": 0,
        "responses": [
            {
                "topic": "t",
                "topic_id": TOPIC_ID,
                "partitions": [
                    {
                        "partition_index": 0,
                        "error_code": Errors.NONE,
                        "high_watermark": 100,
                        "last_stable_offset": 100,
                        "log_start_offset": 3,
                        "aborted_transactions": [],
                        "preferred_read_replica": -1,
                        "records": BATCH,
                        "current_leader": {"leader_id": 1, "leader_epoch": 4},
                    }
                ],
            }
        ],
        "node_endpoints": [],
    },
    2: {
        "throttle_time": 0,
        "topics": [
            {
                "name": "t",
                "partitions": [
                    {
                        "partition_index": 1,
                        "error_code": Errors.NONE,
                        "timestamp": 1_700_000_000_123,
                        "offset": 55,
                        "leader_epoch": 3,
                    }
                ],
            }
        ],
    },
    3: {
        "throttle_time": 0,
        "brokers": [{"node_id": 1, "host": "h1", "port": 9092, "rack": "r1"}],
        "cluster_id": "c-1",
        "controller_id": 1,
        "topics": [
            {
                "error_code": Errors.NONE,
                "name": "t",
                "topic_id": TOPIC_ID,
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": Errors.NONE,
                        "partition_index": 0,
                        "leader_id": 1,
                        "leader_epoch": 2,
                        "replica_nodes": [1, 2],
                        "isr_nodes": [1],
                        "offline_replicas": [2],
                    }
                ],
                "topic_authorized_operations": -(2**31),
            }
        ],
        "cluster_authorized_operations": -(2**31),
        "error_code": Errors.NONE,
    },
    10: {
        "throttle_time": 0,
        "error_code": Errors.NONE,
        "error_message": None,
        "node_id": 2,
        "host": "h2",
        "port": 9102,
        "coordinators": [
            {"key": "g", "node_id": 2, "host": "h2", "port": 9102, "error_code": 0},
            {
                "key": "tx",
                "node_id": -1,
                "host": "",
                "port": -1,
                "error_code": Errors.COORDINATOR_NOT_AVAILABLE,
                "error_message": "none",
            },
        ],
    },
    18: {
        "error_code": Errors.NONE,
        "api_keys": [{"api_key": 0, "min_version": 3, "max_version": 13}],
        "throttle_time": 0,
    },
    19: {
        "throttle_time": 0,
        "topics": [
            {
                "name": "t",
                "topic_id": TOPIC_ID,
                "error_code": Errors.NONE,
                "error_message": None,
                "num_partitions": 3,
                "replication_factor": 2,
                "configs": [
                    {
                        "name": "retention.ms",
                        "value": "1",
                        "read_only": False,
                        "config_source": 1,
                        "is_sensitive": False,
                    }
                ],
            }
        ],
    },
    20: {
        "throttle_time": 0,
        "responses": [{"name": "t", "topic_id": TOPIC_ID, "error_code": 0, "error_message": None}],
    },
    22: {"throttle_time": 0, "error_code": 0, "producer_id": 1 << 48 | 5, "producer_epoch": 0},
    23: {
        "throttle_time": 0,
        "topics": [
            {
                "topic": "t",
                "partitions": [
                    {"error_code": 0, "partition": 0, "leader_epoch": 3, "end_offset": 42},
                    {"error_code": Errors.FENCED_LEADER_EPOCH, "partition": 1},
                ],
            }
        ],
    },
    37: {
        "throttle_time": 0,
        "results": [{"name": "t", "error_code": Errors.INVALID_PARTITIONS, "error_message": "no"}],
    },
    32: {
        "throttle_time": 0,
        "results": [
            {
                "error_code": Errors.NONE,
                "error_message": None,
                "resource_type": 2,
                "resource_name": "t",
                "configs": [
                    {
                        "name": "retention.ms",
                        "value": "1000",
                        "read_only": False,
                        "config_source": 1,
                        "is_sensitive": False,
                        "synonyms": [{"name": "retention.ms", "value": "1000", "source": 1}],
                        "config_type": 5,
                        "documentation": "how long",
                    }
                ],
            }
        ],
    },
    33: {
        "throttle_time": 0,
        "responses": [
            {
                "error_code": Errors.INVALID_CONFIG,
                "error_message": "no",
                "resource_type": 2,
                "resource_name": "t",
            }
        ],
    },
}
VALUES[44] = VALUES[33]
VALUES[35] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "results": [
        {
            "error_code": Errors.NONE,
            "log_dir": "/data",
            "topics": [
                {
                    "name": "t",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "partition_size": 1234,
                            "offset_lag": 0,
                            "is_future_key": False,
                        }
                    ],
                }
            ],
            "total_bytes": 10**12,
            "usable_bytes": 10**11,
        }
    ],
}
VALUES[43] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "replica_election_results": [
        {
            "topic": "t",
            "partition_result": [
                {"partition_id": 0, "error_code": Errors.ELECTION_NOT_NEEDED, "error_message": None}
            ],
        }
    ],
}
VALUES[21] = {
    "throttle_time": 0,
    "topics": [
        {
            "name": "t",
            "partitions": [
                {"partition_index": 0, "low_watermark": 7, "error_code": Errors.NONE},
                {"partition_index": 1, "low_watermark": -1, "error_code": Errors.POLICY_VIOLATION},
            ],
        }
    ],
}

_NO_AUTHORIZER = {"error_code": Errors.SECURITY_DISABLED, "error_message": "No Authorizer"}
VALUES[29] = {"throttle_time": 0, **_NO_AUTHORIZER, "resources": []}
VALUES[30] = {"throttle_time": 0, "results": [_NO_AUTHORIZER]}
VALUES[31] = {"throttle_time": 0, "filter_results": [{**_NO_AUTHORIZER, "matching_acls": []}]}
VALUES[17] = {"error_code": Errors.ILLEGAL_SASL_STATE, "mechanisms": ["PLAIN"]}
VALUES[36] = {
    "error_code": Errors.ILLEGAL_SASL_STATE,
    "error_message": "no",
    "auth_bytes": b"\x01",
    "session_lifetime_ms": 5,
}
VALUES[61] = {
    "throttle_time": 0,
    "topics": [
        {
            "name": "t",
            "partitions": [
                {
                    "partition_index": 0,
                    "error_code": Errors.NONE,
                    "error_message": None,
                    "active_producers": [
                        {
                            "producer_id": 1 << 40,
                            "producer_epoch": 3,
                            "last_sequence": 9,
                            "last_timestamp": 1_700_000_000_000,
                            "coordinator_epoch": -1,
                            "current_txn_start_offset": -1,
                        }
                    ],
                },
                {
                    "partition_index": 1,
                    "error_code": Errors.NOT_LEADER_OR_FOLLOWER,
                    "error_message": None,
                    "active_producers": [],
                },
            ],
        }
    ],
}
VALUES[66] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "unknown_state_filters": ["Bogus"],
    "transaction_states": [],
}
VALUES[75] = {
    "throttle_time": 0,
    "topics": [
        {
            "error_code": Errors.NONE,
            "name": "t",
            "topic_id": TOPIC_ID,
            "is_internal": False,
            "partitions": [
                {
                    "error_code": Errors.NONE,
                    "partition_index": 0,
                    "leader_id": 1,
                    "leader_epoch": 4,
                    "replica_nodes": [1, 2, 3],
                    "isr_nodes": [1],
                    "eligible_leader_replicas": [2],
                    "last_known_elr": [],
                    "offline_replicas": [3],
                }
            ],
            "topic_authorized_operations": 3576,
        }
    ],
    "next_cursor": {"topic_name": "t", "partition_index": 1},
}
VALUES[60] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "error_message": None,
    "endpoint_type": 1,
    "cluster_id": "c",
    "controller_id": 2,
    "brokers": [
        {"broker_id": 2, "host": "h", "port": 9092, "rack": None, "is_fenced": False},
        {"broker_id": 3, "host": "h", "port": 9093, "rack": "r", "is_fenced": True},
    ],
    "cluster_authorized_operations": -(2**31),
}


_GROUP_TOPIC = {"name": "orders", "topic_id": None}
_ASSIGNMENT = {"topic_partitions": [{"topic_id": TOPIC_ID, "partitions": [0, 2]}]}
_DESCRIBED_ASSIGNMENT = {
    "topic_partitions": [{"topic_id": TOPIC_ID, "topic_name": "orders", "partitions": [1]}]
}
VALUES[8] = {
    "throttle_time": 0,
    "topics": [{**_GROUP_TOPIC, "partitions": [{"partition_index": 1, "error_code": 0}]}],
}
_FETCHED = [
    {
        **_GROUP_TOPIC,
        "partitions": [
            {
                "partition_index": 1,
                "committed_offset": 42,
                "committed_leader_epoch": 3,
                "metadata": "m",
                "error_code": Errors.NONE,
            }
        ],
    }
]
VALUES[9] = {  # v1-v7 answer one group at the top level, v8+ in "groups"
    "throttle_time": 0,
    "topics": _FETCHED,
    "error_code": Errors.NONE,
    "groups": [{"group_id": "g", "topics": _FETCHED, "error_code": Errors.NONE}],
}
VALUES[11] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "generation_id": 3,
    "protocol_type": "consumer",
    "protocol_name": "range",
    "leader": "a",
    "skip_assignment": True,
    "member_id": "a",
    "members": [{"member_id": "a", "group_instance_id": "i-a", "metadata": b"sub"}],
}
VALUES[12] = {"throttle_time": 0, "error_code": Errors.REBALANCE_IN_PROGRESS}
VALUES[13] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "members": [{"member_id": "a", "group_instance_id": "i-a", "error_code": Errors.NONE}],
}
VALUES[14] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "protocol_type": "consumer",
    "protocol_name": "range",
    "assignment": b"assigned",
}
VALUES[15] = {
    "throttle_time": 0,
    "groups": [
        {
            "error_code": Errors.NONE,
            "error_message": None,
            "group_id": "g",
            "group_state": "Stable",
            "protocol_type": "consumer",
            "protocol_data": "range",
            "members": [
                {
                    "member_id": "a",
                    "group_instance_id": "i-a",
                    "client_id": "c",
                    "client_host": "/127.0.0.1",
                    "member_metadata": b"sub",
                    "member_assignment": b"assigned",
                }
            ],
            "authorized_operations": -(2**31),
        }
    ],
}
VALUES[16] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "groups": [
        {
            "group_id": "g",
            "protocol_type": "consumer",
            "group_state": "Stable",
            "group_type": "classic",
        }
    ],
}
VALUES[42] = {
    "throttle_time": 0,
    "results": [{"group_id": "g", "error_code": Errors.NON_EMPTY_GROUP}],
}
VALUES[47] = {
    "error_code": Errors.NONE,
    "throttle_time": 0,
    "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "error_code": 0}]}],
}
VALUES[68] = {
    "throttle_time": 0,
    "error_code": Errors.NONE,
    "error_message": None,
    "member_id": "m",
    "member_epoch": 7,
    "heartbeat_interval": 5000,
    "assignment": _ASSIGNMENT,
}
VALUES[69] = {
    "throttle_time": 0,
    "groups": [
        {
            "error_code": Errors.NONE,
            "error_message": None,
            "group_id": "g",
            "group_state": "Stable",
            "group_epoch": 7,
            "assignment_epoch": 7,
            "assignor_name": "uniform",
            "members": [
                {
                    "member_id": "m",
                    "instance_id": None,
                    "rack_id": "r",
                    "member_epoch": 7,
                    "client_id": "c",
                    "client_host": "/127.0.0.1",
                    "subscribed_topic_names": ["orders"],
                    "subscribed_topic_regex": None,
                    "assignment": _DESCRIBED_ASSIGNMENT,
                    "target_assignment": _DESCRIBED_ASSIGNMENT,
                    "member_type": 1,
                }
            ],
            "authorized_operations": -(2**31),
        }
    ],
}


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS + GROUP_VERSIONS)
def test_the_response_helper_round_trips_every_advertised_version(
    api_key: int, version: int
) -> None:
    body = codec.build_response(api_key, version, VALUES[api_key])
    frame = codec.encode_response(1234, body)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    correlation_id, decoded = decode_response(api_key, version, frame[4:])
    assert correlation_id == 1234
    assert decoded == body
    # Values survive the conversions, where the version has the field.
    flat = repr(decoded)
    if api_key in (0, 1, 3, 19, 20) and "topic_id=" in flat:
        assert str(codec.topic_id_to_uuid(TOPIC_ID)) in flat
    if api_key == 1:
        assert decoded.responses[0].partitions[0].records == BATCH
    if api_key == 22:
        assert decoded.producer_id == 1 << 48 | 5
    instance_id_since = {11: 5, 13: 3, 15: 4}  # KAFKA-14422: a version without it drops it
    if api_key in instance_id_since:
        assert ("group_instance_id='i-a'" in flat) == (version >= instance_id_since[api_key])
    if api_key in (68, 69):
        assert str(codec.topic_id_to_uuid(TOPIC_ID)) in flat
    empty = codec.build_response(api_key, version, {})
    assert decode_response(api_key, version, codec.encode_response(1, empty)[4:])[1] == empty


def test_response_headers() -> None:
    # ApiVersions answers with header v0 even in flexible versions (KIP-511); Metadata v9 is
    # flexible and gets header v1 (correlation id, then an empty tagged-field section).
    api_versions = codec.encode_response(9, codec.build_response(18, 3, VALUES[18]))
    assert api_versions[4:8] == struct.pack(">i", 9) and api_versions[8] == 0  # error code hi
    metadata = codec.encode_response(9, codec.build_response(3, 9, {}))
    assert metadata[4:9] == struct.pack(">i", 9) + b"\x00"
    legacy = codec.encode_response(9, codec.build_response(3, 8, {}))
    assert legacy[4:8] == struct.pack(">i", 9)


@given(st.uuids())
def test_topic_ids_are_kafka_uuid_strings(value: uuid.UUID) -> None:
    text = codec.uuid_to_topic_id(value)
    assert len(text) == 22 and "=" not in text
    assert codec.topic_id_to_uuid(text) == value


def test_a_topic_id_that_is_not_base64_gets_a_stable_uuid() -> None:
    assert codec.topic_id_to_uuid("T1-aaaa") == codec.topic_id_to_uuid("T1-aaaa")
    assert codec.topic_id_to_uuid("T1-aaaa") != codec.topic_id_to_uuid("T2-aaaa")


def test_call_once_tells_a_request_left_unanswered_from_a_refused_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with pytest.raises(client.NoAnswerError, match=f"no answer from 127.0.0.1:{port} within"):
            client.call_once("127.0.0.1", port, 18, 3, {}, timeout_s=0.2)  # accepted, unread
    with socket.socket() as bound:  # bound, not listening: the port stays ours, and refuses
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(ConnectionRefusedError):
            client.call_once("127.0.0.1", bound.getsockname()[1], 18, 3, {}, timeout_s=0.2)
