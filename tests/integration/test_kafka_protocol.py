"""Raw bytes at a real node's Kafka listener: bad input closes that connection (or gets
Kafka's error answer), and the node stays up and serves everyone else.

Ends with a seeded fuzz of 10,000 random and mutated frames (the seed is printed; set
``FUZZ_SEED`` to replay one); afterwards the node must answer ApiVersions and Metadata,
still be the same process, and have logged no traceback.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import random
import socket
import struct
import time
import types
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from kcoord.errors import Errors
from kcoord.node import launcher
from kcoord.node.kafka import codec
from kcoord.storage import format as fmt
from tests.integration.cluster import LocalCluster
from tests.unit.node.kafka.wire import WireClient, encode_request, readable

pytestmark = pytest.mark.integration

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
FIND_COORDINATOR, API_VERSIONS, INIT_PRODUCER_ID = 10, 18, 22
DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS, DESCRIBE_TOPIC_PARTITIONS = 60, 61, 75
LIST_TRANSACTIONS = 66
FUZZ_FRAMES = 10_000
SILENCE_S = 0.05  # how long the fuzz waits for an answer before moving to a new connection
SIZE = struct.Struct(">i")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("kafka-protocol")
    with LocalCluster(root, nodes=1, overrides={"auto.create.topics.enable": False}) as c:
        yield c


def address(cluster: LocalCluster) -> tuple[str, int]:
    n = cluster.node(1)
    return n.host, n.kafka_port


def serves(cluster: LocalCluster) -> None:
    """A new client gets its answers: the node is up and not wedged."""
    with WireClient(*address(cluster)) as c:
        assert c.call(API_VERSIONS, 3, software()).error_code == Errors.NONE
        metadata = c.call(METADATA, 12, {"topics": None, "allow_auto_topic_creation": False})
        assert [b.node_id for b in metadata.brokers] == [1]
    assert launcher.is_alive(cluster.node(1).pid)


def software() -> dict[str, Any]:
    return {"client_software_name": "kcoord-tests", "client_software_version": "1.0"}


def closes(cluster: LocalCluster, data: bytes, *, end_write: bool = False) -> bool:
    with WireClient(*address(cluster)) as c:
        c.send_raw(data)
        if end_write:
            c.sock.shutdown(socket.SHUT_WR)
        return c.is_closed_by_server()


def frame(body: bytes) -> bytes:
    return SIZE.pack(len(body)) + body


def header(api_key: int, version: int, correlation_id: int = 1) -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, -1)


def test_truncated_frames_close_the_connection(node: LocalCluster) -> None:
    full = encode_request(METADATA, 1, 1, {"topics": [{"name": "t"}]})
    assert closes(node, full[:-3], end_write=True)
    assert closes(node, SIZE.pack(100) + b"x" * 10, end_write=True)
    assert closes(node, b"\x00\x00", end_write=True)
    serves(node)


def test_oversized_and_negative_sizes_close_the_connection(node: LocalCluster) -> None:
    assert closes(node, SIZE.pack(200 * 1024 * 1024))  # above socket.request.max.bytes
    assert closes(node, SIZE.pack(-5))
    assert closes(node, SIZE.pack(0))
    serves(node)


def test_unknown_api_keys_and_unsupported_versions(node: LocalCluster) -> None:
    assert closes(node, frame(header(999, 0)))
    assert closes(node, frame(header(-1, 0)))
    assert closes(node, frame(header(27, 1)))  # WriteTxnMarkers: known to kio, not served
    assert closes(node, frame(header(METADATA, 99)))
    assert closes(node, frame(header(PRODUCE, 2)))  # below the versions we serve
    with WireClient(*address(node)) as c:
        c.send_raw(frame(header(API_VERSIONS, 99, correlation_id=42) + b"\x00"))
        correlation_id, body = _decode(c, API_VERSIONS, 0)
        assert correlation_id == 42
        assert body.error_code == Errors.UNSUPPORTED_VERSION
        assert [k.api_key for k in body.api_keys] == [API_VERSIONS]  # KIP-511
        # The connection stays usable after that answer.
        assert c.call(API_VERSIONS, 3, software()).error_code == Errors.NONE
    serves(node)


def _decode(c: WireClient, api_key: int, version: int) -> tuple[int, Any]:
    from tests.unit.node.kafka.wire import decode_response

    return decode_response(api_key, version, c.read_frame())


def test_garbage_bodies_and_wrong_field_types(node: LocalCluster) -> None:
    cases = [
        header(METADATA, 1) + struct.pack(">i", 0x7FFFFFFF),  # 2^31 topics in 4 bytes
        header(METADATA, 12) + b"\x00" + b"\xff\xff\xff\xff\x0f",  # compact array overflow
        header(METADATA, 1) + struct.pack(">i", 1) + struct.pack(">h", 500) + b"x",
        header(PRODUCE, 3) + b"\xff" * 3,  # acks cut short
        header(FETCH, 4) + struct.pack(">i", -7),  # negative length where a count goes
        header(LIST_OFFSETS, 1) + struct.pack(">ii", -1, 1) + b"\x00\x05\xc3\x28\x80\x81\x82",
        header(API_VERSIONS, 3) + b"\x00" + b"\x05\xff\xfe\xfd\xfc",  # not UTF-8
    ]
    for body in cases:
        assert closes(node, frame(body)), body
    serves(node)


def test_well_formed_nonsense_gets_kafka_errors_not_a_closed_connection(
    node: LocalCluster,
) -> None:
    with WireClient(*address(node)) as c:
        fetch = c.call(
            FETCH,
            12,
            {
                "max_wait": -5,
                "min_bytes": -1,
                "max_bytes": -1,
                "topics": [
                    {
                        "topic": "no-such-topic",
                        "partitions": [
                            {"partition": -3, "fetch_offset": -9, "partition_max_bytes": -1}
                        ],
                    }
                ],
            },
        )
        part = fetch.responses[0].partitions[0]
        assert part.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        offsets = c.call(
            LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "topics": [
                    {
                        "name": "__consumer_offsets",
                        "partitions": [{"partition_index": 0, "timestamp": -77}],
                    }
                ],
            },
        )
        # A negative timestamp that is none of the special ones (ReplicaManager.
        # isListOffsetsTimestampUnsupported).
        assert offsets.topics[0].partitions[0].error_code == Errors.UNSUPPORTED_VERSION
        produce = c.call(
            PRODUCE,
            9,
            {
                "acks": 7,
                "timeout": -1,
                "topic_data": [{"name": "x", "partition_data": [{"index": 0, "records": b""}]}],
            },
        )
        error = produce.responses[0].partition_responses[0].error_code
        assert error == Errors.INVALID_REQUIRED_ACKS
        coordinator = c.call(FIND_COORDINATOR, 3, {"key": "", "key_type": 5})
        assert coordinator.error_code == Errors.INVALID_REQUEST
    serves(node)


# ------------------------------------------------------------------ fuzz


def seed_frames() -> list[bytes]:
    """Valid requests of the read-mostly APIs, for mutation (no topic admin: the fuzz
    should not spend its time creating topics)."""
    fetch = {
        "max_wait": 10,
        "min_bytes": 1,
        "max_bytes": 65536,
        "topics": [
            {
                "topic": "__consumer_offsets",
                "topic_id": None,
                "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 4096}],
            }
        ],
    }
    return [
        *(encode_request(API_VERSIONS, v, 1, software()) for v in range(5)),
        *(
            encode_request(
                METADATA, v, 2, {"topics": [{"name": "t"}], "allow_auto_topic_creation": False}
            )
            for v in (0, 1, 4, 9, 12, 13)
        ),
        *(encode_request(FETCH, v, 3, fetch) for v in (4, 11, 12, 13, 16, 17, 18)),
        *(
            encode_request(
                LIST_OFFSETS,
                v,
                4,
                {
                    "replica_id": -1,
                    "topics": [
                        {"name": "t", "partitions": [{"partition_index": 0, "timestamp": -1}]}
                    ],
                },
            )
            for v in (1, 5, 7, 10)
        ),
        *(
            encode_request(FIND_COORDINATOR, v, 5, {"key": "g", "coordinator_keys": ["g"]})
            for v in (0, 3, 4, 6)
        ),
        *(encode_request(INIT_PRODUCER_ID, v, 6, {"transactional_id": None}) for v in (0, 4, 6)),
        *(
            encode_request(
                PRODUCE,
                v,
                7,
                {
                    "acks": 1,
                    "timeout": 100,
                    "topic_data": [
                        {"name": "t", "partition_data": [{"index": 0, "records": b"\x00" * 61}]}
                    ],
                },
            )
            for v in (3, 9, 12)
        ),
        *(
            encode_request(
                DESCRIBE_CLUSTER,
                v,
                8,
                {"include_cluster_authorized_operations": True, "include_fenced_brokers": True},
            )
            for v in (0, 1, 2)
        ),
        encode_request(
            DESCRIBE_PRODUCERS, 0, 9, {"topics": [{"name": "t", "partition_indexes": [0, 1]}]}
        ),
        *(
            encode_request(
                LIST_TRANSACTIONS,
                v,
                11,
                {
                    "state_filters": ["Ongoing", "x"],
                    "producer_id_filters": [1],
                    "duration_filter": 5,
                },
            )
            for v in (0, 1, 2)
        ),
        encode_request(
            DESCRIBE_TOPIC_PARTITIONS,
            0,
            10,
            {
                "topics": [{"name": "t"}, {"name": "__consumer_offsets"}],
                "response_partition_limit": 3,
                "cursor": {"topic_name": "t", "partition_index": 1},
            },
        ),
    ]


def mutate(rng: random.Random, data: bytes) -> bytes:
    body = bytearray(data[4:])
    for _ in range(rng.randrange(1, 5)):
        kind = rng.random()
        if kind < 0.45 and body:
            body[rng.randrange(len(body))] = rng.choice(
                [0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)]
            )
        elif kind < 0.6 and len(body) > 4:
            pos = rng.randrange(len(body) - 3)
            body[pos : pos + 4] = rng.choice(
                [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", rng.randbytes(4)]
            )
        elif kind < 0.8:
            del body[rng.randrange(len(body) + 1) :]
        else:
            pos = rng.randrange(len(body) + 1)
            body[pos:pos] = rng.randbytes(rng.randrange(1, 16))
    if rng.random() < 0.1:  # and sometimes the size prefix lies too
        return SIZE.pack(rng.choice([-1, 0, len(body) + rng.randrange(1, 64), 2**31 - 1])) + body
    return SIZE.pack(len(body)) + body


def random_frame(rng: random.Random) -> bytes:
    api_key = rng.choice(
        [
            PRODUCE,
            FETCH,
            LIST_OFFSETS,
            METADATA,
            FIND_COORDINATOR,
            API_VERSIONS,
            INIT_PRODUCER_ID,
            999,
            -1,
        ]
    )
    body = struct.pack(">hhi", api_key, rng.randrange(-2, 20), rng.randrange(2**31))
    return frame(body + rng.randbytes(rng.randrange(0, 128)))


STRUCTURED_APIS = [
    PRODUCE,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    21,  # DeleteRecords
    29,  # DescribeAcls
    30,  # CreateAcls
    31,  # DeleteAcls
    32,  # DescribeConfigs
    33,  # AlterConfigs
    35,  # DescribeLogDirs
    43,  # ElectLeaders
    44,  # IncrementalAlterConfigs
]
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def random_value(rng: random.Random, kind: Any, tp: Any) -> Any:
    """A random value of a kio field type: edge values and small ones, mostly well formed."""
    inner, optional = _strip_optional(tp)
    if optional and rng.random() < 0.1:
        return None
    if typing.get_origin(inner) is tuple:
        item = typing.get_args(inner)[0]
        return tuple(random_value(rng, kind, item) for _ in range(rng.choice([0, 1, 1, 2, 3])))
    if dataclasses.is_dataclass(inner):
        return random_entity(rng, inner)  # type: ignore[arg-type]
    kafka_type = kind.metadata.get("kafka_type")
    if kafka_type in _INT_BITS:
        bits = _INT_BITS[kafka_type]
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return rng.choice([0, 0, 1, -1, 2, 3, lo, hi, rng.randrange(lo, hi)])
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.choice([-1, 0, 5, 20, 2**31 - 1]))
    if kafka_type == "string":
        return rng.choice(["", "t", "g", "__consumer_offsets", "x" * rng.randrange(1, 300), "ü/."])
    if kafka_type in ("bytes", "records"):
        if rng.random() < 0.5:
            return fmt.build_batch(
                [fmt.Record(i, rng.randrange(2**41), b"k", rng.randbytes(8)) for i in range(3)],
                producer_id=rng.choice([-1, 1, 2**50]),
                producer_epoch=rng.choice([-1, 0, 1]),
                base_sequence=rng.choice([-1, 0, 3, 2**31 - 1]),
            )
        return rng.randbytes(rng.randrange(0, 80))
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "uuid":
        return rng.choice([None, uuid.UUID(int=0), uuid.UUID(int=rng.getrandbits(128))])
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type == "float64":
        return rng.random()
    raise AssertionError(f"no generator for {kafka_type}")


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not types.NoneType]
        return args[0], True
    return tp, False


def random_entity(rng: random.Random, cls: type[Any]) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: random_value(rng, f, hints[f.name]) for f in dataclasses.fields(cls)})


def structured_frame(rng: random.Random) -> bytes:
    """A well-formed request full of odd values: it reaches the handlers."""
    api_key = rng.choice(STRUCTURED_APIS)
    versions = codec.kio_versions(api_key)
    version = rng.randrange(max(versions.start, 3 if api_key == PRODUCE else 0), versions.stop)
    if api_key == FETCH:
        version = max(version, 4)
    cls = codec.request_schema(api_key, version)
    assert cls is not None
    body = random_entity(rng, cls)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(
        buf,
        header_cls(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=rng.randrange(2**31),
            client_id=rng.choice([None, "", "fuzz"]),
        ),
    )
    entity_writer(cls)(buf, body)
    return frame(buf.getvalue())


def exchange(sock: socket.socket, data: bytes) -> bool:
    """Send one frame and read the node's reaction; False when the connection is done with:
    the node closed it, or it is silent (a frame still waiting for bytes, an acks=0 produce,
    a long poll), and the next frame should start on a fresh connection."""
    try:
        sock.sendall(data)
        if not readable([sock], SILENCE_S):
            return False
        prefix = _read_exactly(sock, SIZE.size)
        (size,) = SIZE.unpack(prefix)
        _read_exactly(sock, size)
    except (OSError, ConnectionError):
        return False
    return True


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def test_fuzzed_frames_never_take_the_node_down(node: LocalCluster) -> None:
    seed = int(os.environ.get("FUZZ_SEED", random.randrange(2**32)))
    print(f"fuzz seed {seed} (replay with FUZZ_SEED={seed})")
    rng = random.Random(seed)
    seeds = seed_frames()
    with WireClient(*address(node)) as c:
        created = c.call(
            19,
            7,
            {"topics": [{"name": "t", "num_partitions": 2, "replication_factor": 1}]},
        )
        assert created.topics[0].error_code in (Errors.NONE, Errors.TOPIC_ALREADY_EXISTS)
    pid = node.node(1).pid
    log_path: Path = node.node(1).log_path
    log_size_before = log_path.stat().st_size
    sock: socket.socket | None = None
    connections = 0
    started = time.monotonic()
    for _ in range(FUZZ_FRAMES):
        if sock is None:
            sock = socket.create_connection(address(node), timeout=5)
            sock.settimeout(2)
            connections += 1
        roll = rng.random()
        if roll < 0.2:
            data = random_frame(rng)
        elif roll < 0.6:
            data = structured_frame(rng)
        else:
            data = mutate(rng, rng.choice(seeds))
        if not exchange(sock, data):
            sock.close()
            sock = None
    if sock is not None:
        sock.close()
    print(
        f"{FUZZ_FRAMES} frames over {connections} connections in {time.monotonic() - started:.1f} s"
    )
    serves(node)
    assert node.node(1).pid == pid and launcher.is_alive(pid)
    with open(log_path, "rb") as f:
        f.seek(log_size_before)
        logged = f.read().decode(errors="replace")
    assert "Traceback" not in logged, logged[logged.find("Traceback") - 2000 :][:6000]
    assert "closing connection" in logged  # the fuzz did reach the listener's checks
