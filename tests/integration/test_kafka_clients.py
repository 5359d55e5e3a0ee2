"""Unmodified Kafka clients against a real 3-node kcoord cluster.

For each of kafka-python, aiokafka and confluent-kafka (librdkafka), each in its own process
(``clients/*.py``): create a 6-partition topic with the admin client and let the producer
auto-create another (``num.partitions`` = 3), produce with acks=all and idempotence, consume
everything back with manual assignment from the beginning, and check that every acknowledged
message is there exactly once, at the offset it was acknowledged with, in order per partition;
ListOffsets earliest, latest and by timestamp; and that the partitions' leaders are spread over
all three nodes. Then SIGKILL the node leading the most partitions of an RF-1 topic, restart
it, and check no acknowledged message of any client is lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kcoord.node.kafka.metadata import NO_TRANSACTIONS
from kcoord.storage import format as fmt
from tests.integration.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

CLIENTS_DIR = Path(__file__).parent / "clients"
CLIENTS = {
    "kafka-python": "kafka_python_client.py",
    "aiokafka": "aiokafka_client.py",
    "confluent-kafka": "confluent_client.py",
}
MESSAGES = 300
CLIENT_TIMEOUT_S = 120.0
OVERRIDES = {"num.partitions": 3}

Message = tuple[int, int, int, str]  # partition, offset, timestamp ms, value


def led_partitions(client: str, bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    """``client``'s view of the leader of each of ``topic``'s ``count`` partitions, once it has
    one for each. Each node learns of a new topic from the metadata log on its own (Kafka's
    brokers too), and the node a client asks right after CreateTopics may not have it yet."""

    def found() -> dict[str, Any] | None:
        leaders = run_client(client, {"op": "leaders", "bootstrap": bootstrap, "topic": topic})
        partitions = sorted(int(p) for p in leaders)
        led = all(leader is not None and int(leader) >= 0 for leader in leaders.values())
        return leaders if partitions == list(range(count)) and led else None

    leaders: dict[str, Any] = wait_for(found, f"{client} to see a leader of each of {topic}")
    return leaders


def run_client(client: str, cmd: dict[str, Any]) -> Any:
    proc = subprocess.run(
        [sys.executable, str(CLIENTS_DIR / CLIENTS[client]), json.dumps(cmd)],
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"{client} {cmd['op']} failed:\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def messages(raw: list[list[Any]]) -> list[Message]:
    return [(int(p), int(o), int(t), str(v)) for p, o, t, v in raw]


def check_exactly_once_in_order(acked: list[Message], consumed: list[Message]) -> None:
    """Every acknowledged message is read once, at its offset; per partition, offsets are
    0, 1, 2, ... and the producer's order is kept."""
    assert len(acked) == len({v for *_, v in acked}), "the producer acknowledged a duplicate"
    by_value = {v: (p, o) for p, o, _, v in acked}
    assert Counter(v for *_, v in consumed) == Counter(list(by_value)), "lost or duplicated"
    per_partition: dict[int, list[Message]] = defaultdict(list)
    for m in consumed:
        assert by_value[m[3]] == (m[0], m[1]), f"{m[3]} read at a different offset"
        per_partition[m[0]].append(m)
    for partition, items in per_partition.items():
        offsets = [o for _, o, _, _ in items]
        assert offsets == list(range(len(items))), f"partition {partition}: {offsets[:10]}"
        sequence = [int(v.rsplit("-", 1)[1]) for *_, v in items]
        assert sequence == sorted(sequence), f"partition {partition} out of producer order"


def check_offsets(client: str, bootstrap: str, topic: str, consumed: list[Message]) -> None:
    per_partition: dict[int, list[Message]] = defaultdict(list)
    for m in consumed:
        per_partition[m[0]].append(m)
    partitions = sorted(per_partition)
    # A timestamp from the middle of each partition: the answer is the first offset at or
    # after it.
    timestamps = {p: items[len(items) // 2][2] for p, items in per_partition.items()}
    result = run_client(
        client,
        {
            "op": "offsets",
            "bootstrap": bootstrap,
            "topic": topic,
            "partitions": partitions,
            "timestamps": {str(p): ts for p, ts in timestamps.items()},
        },
    )
    for p in partitions:
        items = per_partition[p]
        assert result["earliest"][str(p)] == 0
        assert result["latest"][str(p)] == len(items)
        expected = min(o for _, o, ts, _ in items if ts >= timestamps[p])
        assert result["by_time"][str(p)] == expected, (p, timestamps[p])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-clients"), overrides=OVERRIDES) as c:
        yield c


@pytest.fixture(autouse=True)
def _cluster_ready_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A node a test restarted (or left down) is serving again before the next test."""
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").revive()


@pytest.mark.parametrize("client", list(CLIENTS))
def test_client_round_trip(cluster: LocalCluster, client: str) -> None:
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    created, auto = f"created-{client}", f"auto-{client}"
    run_client(
        client,
        {
            "op": "create_topic",
            "bootstrap": bootstrap,
            "topic": created,
            "partitions": 6,
            "replication_factor": 3,
        },
    )
    leaders = led_partitions(client, bootstrap, created, 6)
    assert set(leaders.values()) == {1, 2, 3}, leaders
    for topic, partitions in ((created, 6), (auto, 3)):
        acked = messages(
            run_client(
                client,
                {
                    "op": "produce",
                    "bootstrap": bootstrap,
                    "topic": topic,
                    "count": MESSAGES,
                    "prefix": client,
                },
            )
        )
        assert len(acked) == MESSAGES
        assert {p for p, *_ in acked} == set(range(partitions)), "keys spread over partitions"
        consumed = messages(
            run_client(
                client,
                {
                    "op": "consume",
                    "bootstrap": bootstrap,
                    "topic": topic,
                    "partitions": list(range(partitions)),
                    "expect": MESSAGES,
                },
            )
        )
        check_exactly_once_in_order(acked, consumed)
        check_offsets(client, bootstrap, topic, consumed)


def test_topic_configs_through_every_client(cluster: LocalCluster) -> None:
    """CreateTopics refuses an invalid config with INVALID_CONFIG; DescribeConfigs shows a
    topic's own values and the defaults alike to every client; IncrementalAlterConfigs
    (confluent-kafka) and AlterConfigs (kafka-python, aiokafka) change them, and every leader
    applies a changed ``max.message.bytes`` to its log."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    topic = "configured"

    def create(configs: dict[str, str], **extra: Any) -> Any:
        return run_client(
            "confluent-kafka",
            {
                "op": "create_topic",
                "bootstrap": bootstrap,
                "topic": topic,
                "partitions": 3,
                "replication_factor": 3,
                "configs": configs,
                **extra,
            },
        )

    refused = create({"retention.ms": "soon"}, expect_error=True)
    assert refused == {
        "error": 40,  # INVALID_CONFIG
        "message": "Invalid value soon for configuration retention.ms: Not a number of type LONG",
    }
    unknown = create({"retention.mss": "1"}, expect_error=True)
    assert unknown == {"error": 40, "message": "Unknown topic config name: retention.mss"}
    assert create({"cleanup.policy": "compact", "retention.ms": "3600000"}) == "created"

    def described(client: str, kind: str = "topic", name: str = topic) -> dict[str, list[Any]]:
        answer: dict[str, list[Any]] = run_client(
            client,
            {"op": "describe_configs", "bootstrap": bootstrap, "resource": kind, "name": name},
        )
        return answer

    def own(client: str) -> dict[str, str]:
        return {
            k: v for k, (v, source) in described(client).items() if source == "DYNAMIC_TOPIC_CONFIG"
        }

    for client in CLIENTS:
        assert own(client) == {"cleanup.policy": "compact", "retention.ms": "3600000"}, client
    every = described("confluent-kafka")
    assert every["segment.bytes"] == [str(1024**3), "DEFAULT_CONFIG"]
    # The cluster-level value the first active controller wrote (KIP-966).
    assert every["min.insync.replicas"] == ["2", "DYNAMIC_DEFAULT_BROKER_CONFIG"]
    # On a broker too (none of the three clients describes the cluster resource "").
    broker_min_isr = described("confluent-kafka", "broker", "1")["min.insync.replicas"]
    assert broker_min_isr == ["2", "DYNAMIC_DEFAULT_BROKER_CONFIG"]

    altered = run_client(
        "confluent-kafka",
        {
            "op": "alter_configs",
            "bootstrap": bootstrap,
            "topic": topic,
            "ops": [
                ["max.message.bytes", "SET", "2000"],
                ["cleanup.policy", "APPEND", "delete"],
                ["retention.ms", "DELETE", None],
            ],
        },
    )
    assert altered == {"error": 0}
    wanted = {"cleanup.policy": "compact,delete", "max.message.bytes": "2000"}
    for client in CLIENTS:
        assert own(client) == wanted, client
    # Every partition's leader (one per node) now refuses a record over 2000 bytes.
    leaders = run_client("kafka-python", {"op": "leaders", "bootstrap": bootstrap, "topic": topic})
    assert set(leaders.values()) == {1, 2, 3}, leaders
    for partition in range(3):
        for size, error in ((1500, 0), (5000, 10)):  # 10: MESSAGE_TOO_LARGE
            cmd = {"bootstrap": bootstrap, "topic": topic, "partition": partition, "size": size}
            assert run_client("confluent-kafka", {"op": "produce_one", **cmd}) == error

    bad = run_client(
        "confluent-kafka",
        {
            "op": "alter_configs",
            "bootstrap": bootstrap,
            "topic": topic,
            "ops": [["retention.ms", "APPEND", "5"]],
        },
    )
    assert bad == {
        "error": 40,
        "message": "Can't APPEND to key retention.ms because its type is not LIST.",
    }
    # The legacy AlterConfigs replaces the whole set; kafka-python sends the topic's other own
    # configs along (it read them first), aiokafka sends what it is given.
    for client, retention, kept in (
        ("kafka-python", "7200000", wanted),
        ("aiokafka", "10800000", {}),
    ):
        cmd = {"bootstrap": bootstrap, "topic": topic, "configs": {"retention.ms": retention}}
        assert run_client(client, {"op": "alter_configs", **cmd})["error"] == 0
        assert own("confluent-kafka") == {**kept, "retention.ms": retention}, client

    broker = described("aiokafka", "broker", "2")
    assert broker["node.id"] == ["2", "STATIC_BROKER_CONFIG"]
    assert broker["log.retention.ms"] == [str(7 * 24 * 3600 * 1000), "DEFAULT_CONFIG"]


def test_delete_records_through_every_client(cluster: LocalCluster) -> None:
    """DeleteRecords moves each partition's log start offset: every client gets the low
    watermark it asked for, ListOffsets earliest and a consumer from the beginning start there,
    and after a SIGKILL of a partition's leader the new leader starts there too (the answer
    waited for every live replica's log start)."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    topic = "trimmed"
    create = {"bootstrap": bootstrap, "topic": topic, "partitions": 3, "replication_factor": 3}
    run_client("confluent-kafka", {"op": "create_topic", **create})
    acked = messages(
        run_client(
            "confluent-kafka",
            {"op": "produce", "bootstrap": bootstrap, "topic": topic, "count": 90, "prefix": "d"},
        )
    )
    ends = Counter(p for p, *_ in acked)
    assert set(ends) == {0, 1, 2}
    starts = {p: ends[p] // 2 for p in ends}
    for partition, client in enumerate(CLIENTS):
        cmd = {
            "bootstrap": bootstrap,
            "topic": topic,
            "offsets": {str(partition): starts[partition]},
        }
        answer = run_client(client, {"op": "delete_records", **cmd})
        assert {int(p): w for p, w in answer.items()} == {partition: starts[partition]}, client

    def earliest() -> dict[int, int]:
        result = run_client(
            "kafka-python",
            {
                "op": "offsets",
                "bootstrap": bootstrap,
                "topic": topic,
                "partitions": [0, 1, 2],
                "timestamps": {},
            },
        )
        return {int(p): o for p, o in result["earliest"].items()}

    assert earliest() == starts
    kept = [m for m in acked if m[1] >= starts[m[0]]]
    consumed = messages(
        run_client(
            "aiokafka",
            {
                "op": "consume",
                "bootstrap": bootstrap,
                "topic": topic,
                "partitions": [0, 1, 2],
                "expect": len(kept),
            },
        )
    )
    assert sorted(consumed) == sorted(kept)

    def leader() -> int | None:
        cmd = {"op": "leaders", "bootstrap": bootstrap, "topic": topic}
        found = run_client("kafka-python", cmd).get("0")
        return None if found is None or int(found) < 0 else int(found)

    victim = leader()
    assert victim is not None
    cluster.kill(victim)
    try:
        wait_for(lambda: leader() not in (victim, None), "a new leader of partition 0")
        assert earliest() == starts
    finally:
        cluster.start(victim)


def test_elect_leaders_and_describe_log_dirs(cluster: LocalCluster) -> None:
    """ElectLeaders answers ELECTION_NOT_NEEDED where the preferred replica leads (and
    nothing for "every partition"); DescribeLogDirs shows every replica of a partition with
    the same size once the producer's records are acknowledged by all of them."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    topic = "placed"
    create = {"bootstrap": bootstrap, "topic": topic, "partitions": 3, "replication_factor": 3}
    run_client("confluent-kafka", {"op": "create_topic", **create})
    not_needed = dict.fromkeys(range(3), 84)  # ELECTION_NOT_NEEDED
    # For "every partition" kafka-python names them all itself; librdkafka sends null, which
    # the broker answers only where an election was needed.
    for client, for_all in (("kafka-python", not_needed), ("confluent-kafka", {})):
        cmd = {"bootstrap": bootstrap, "topic": topic}
        for partitions, expected in (([0, 1, 2], not_needed), (None, for_all)):
            answer = run_client(client, {"op": "elect_leaders", **cmd, "partitions": partitions})
            assert {int(p): e for p, e in answer.items()} == expected, (client, partitions)
    run_client(
        "confluent-kafka",
        {"op": "produce", "bootstrap": bootstrap, "topic": topic, "count": 60, "prefix": "s"},
    )

    def sizes() -> dict[int, dict[int, int]]:
        answer = run_client("kafka-python", {"op": "describe_log_dirs", "bootstrap": bootstrap,
                                             "topic": topic})  # fmt: skip
        return {int(b): {int(p): s for p, s in parts.items()} for b, parts in answer.items()}

    def replicas_agree() -> bool:
        per_broker = sizes()
        return set(per_broker) == {1, 2, 3} and all(per_broker[b] == per_broker[1] for b in (2, 3))

    # The acks=all answer came once the followers had the records: their sizes are equal.
    wait_for(replicas_agree, "every replica with the same bytes")
    assert all(size > 0 for size in sizes()[1].values())


def test_acl_calls_are_refused_as_by_a_broker_without_an_authorizer(
    cluster: LocalCluster,
) -> None:
    """kcoord has no authorizer: DescribeAcls, CreateAcls and DeleteAcls answer
    SECURITY_DISABLED with Kafka's message, which the clients raise as such."""
    assert cluster.state is not None
    cmd = {"op": "acls", "bootstrap": cluster.state.bootstrap_servers, "topic": "guarded"}
    assert run_client("kafka-python", cmd) == {
        "describe": [
            "SecurityDisabledError",
            "[Error 54] SecurityDisabledError: No Authorizer is configured.",
        ],
        "create": ["SecurityDisabledError"],
        "delete": ["SecurityDisabledError"],
    }
    # librdkafka reads DescribeAcls' error code and drops it (rd_kafka_DescribeAclsResponse_
    # parse): against Kafka without an authorizer too, the listing comes back empty.
    refused = ["SECURITY_DISABLED", "No Authorizer is configured."]
    assert run_client("confluent-kafka", cmd) == {
        "describe": "NONE",
        "create": refused,
        "delete": refused,
    }


def test_log_append_time_and_timestamp_bounds(cluster: LocalCluster) -> None:
    """``message.timestamp.type=LogAppendTime``: the leader stamps each batch with its clock,
    whatever the producer wrote, and every client reads the stamp as LogAppendTime, in its
    acknowledgement too. CreateTime: a record more than ``message.timestamp.after.max.ms``
    ahead of the leader's clock (Kafka 4.0's default: an hour) or more than
    ``message.timestamp.before.max.ms`` behind it is refused with INVALID_TIMESTAMP, which no
    client retries; the records around it are written."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    hour = 3_600_000
    refused = {
        "kafka-python": "InvalidTimestampError",
        "aiokafka": "InvalidTimestampError",
        "confluent-kafka": "INVALID_TIMESTAMP",
    }

    def create(topic: str, configs: dict[str, str]) -> None:
        cmd = {
            "op": "create_topic",
            "bootstrap": bootstrap,
            "topic": topic,
            "partitions": 1,
            "replication_factor": 3,
            "configs": configs,
        }
        assert run_client("confluent-kafka", cmd) == "created"

    for client in CLIENTS:
        appended, bounded = f"appended-{client}", f"bounded-{client}"
        create(appended, {"message.timestamp.type": "LogAppendTime"})
        create(bounded, {"message.timestamp.before.max.ms": str(hour)})

        sent_after = time.time_ns() // 1_000_000
        cmd = {"op": "timestamps", "bootstrap": bootstrap, "topic": appended}
        result = run_client(client, {**cmd, "timestamps": [sent_after - 24 * hour, sent_after]})
        acked_before = time.time_ns() // 1_000_000
        assert [error for error, _ in result["produced"]] == [None, None], client
        stamps = [ts for _, ts in result["produced"]]
        assert sent_after <= stamps[0] <= stamps[1] <= acked_before, (client, stamps)
        assert result["consumed"] == [
            [0, "LogAppendTime", stamps[0]],
            [1, "LogAppendTime", stamps[1]],
        ], client

        now = time.time_ns() // 1_000_000
        cmd = {"op": "timestamps", "bootstrap": bootstrap, "topic": bounded}
        result = run_client(client, {**cmd, "timestamps": [now - 2 * hour, now, now + 2 * hour]})
        assert result["produced"] == [
            [refused[client], None],
            [None, now],
            [refused[client], None],
        ], client
        assert result["consumed"] == [[0, "CreateTime", now]], client


def test_topic_compression_type_is_applied_by_the_leader(cluster: LocalCluster) -> None:
    """``compression.type=zstd`` on a topic: every client's batches (none of them compresses by
    default) are stored zstd on all three replicas, and every client reads them back."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    topic = "squeezed"
    create = {
        "op": "create_topic",
        "bootstrap": bootstrap,
        "topic": topic,
        "partitions": 1,
        "replication_factor": 3,
        "configs": {"compression.type": "zstd"},
    }
    assert run_client("confluent-kafka", create) == "created"
    acked: list[Message] = []
    for client in CLIENTS:
        produce = {"op": "produce", "bootstrap": bootstrap, "topic": topic, "count": 20}
        acked += messages(run_client(client, {**produce, "prefix": client}))
    for client in CLIENTS:
        consume = {"op": "consume", "bootstrap": bootstrap, "topic": topic, "partitions": [0]}
        consumed = messages(run_client(client, {**consume, "expect": len(acked)}))
        # Partition, offset and value: aiokafka acknowledges a record with a timestamp that
        # can be 1 ms off the one it wrote, on any topic.
        assert sorted((p, o, v) for p, o, _, v in consumed) == sorted(
            (p, o, v) for p, o, _, v in acked
        ), client

    def stored_codecs() -> set[fmt.Compression]:
        codecs = set()
        for node in cluster.state.nodes if cluster.state else []:
            directory = Path(node.directory) / "data" / f"{topic}-0"
            data = b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))
            headers = [h for _, h in fmt.iter_headers(data)]
            if sum(h.record_count for h in headers) < len(acked):
                return set()  # a follower still fetching
            codecs |= {h.compression for h in headers}
        return codecs

    assert wait_for(stored_codecs, "every replica holds every record") == {fmt.Compression.ZSTD}


def test_transactional_producers_are_refused_at_once(cluster: LocalCluster) -> None:
    """kcoord has no transaction coordinator. A transactional producer's first step (finding
    its coordinator) is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the one error every
    client treats as fatal, so it fails with kcoord's message instead of retrying
    COORDINATOR_NOT_AVAILABLE until its own timeout (a 30 s one here: none is reached)."""
    assert cluster.state is not None
    cmd = {
        "op": "transactions",
        "bootstrap": cluster.state.bootstrap_servers,
        "transactional_id": "payments-tx",
        "timeout_s": 30,
    }
    name, message, fatal = run_client("confluent-kafka", cmd)
    assert (name, fatal) == ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", True)
    assert message.endswith(f"Transactional Id authorization failed: {NO_TRANSACTIONS}")
    assert run_client("kafka-python", cmd)[0] == "TransactionalIdAuthorizationFailedError"
    assert run_client("aiokafka", cmd)[0] == "TransactionalIdAuthorizationFailed"


def test_acknowledged_messages_survive_a_sigkill_of_their_leader(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, overrides=OVERRIDES) as cluster:
        assert cluster.state is not None
        bootstrap = cluster.state.bootstrap_servers
        topic = "durable"
        run_client(
            "confluent-kafka",
            {
                "op": "create_topic",
                "bootstrap": bootstrap,
                "topic": topic,
                "partitions": 6,
                "replication_factor": 1,
            },
        )
        acked: list[Message] = []
        for client in CLIENTS:
            acked += messages(
                run_client(
                    client,
                    {
                        "op": "produce",
                        "bootstrap": bootstrap,
                        "topic": topic,
                        "count": MESSAGES,
                        "prefix": client,
                    },
                )
            )
        leaders = {
            int(p): n
            for p, n in run_client(
                "kafka-python", {"op": "leaders", "bootstrap": bootstrap, "topic": topic}
            ).items()
        }
        victim = Counter(leaders.values()).most_common(1)[0][0]
        lost_while_down = sorted(p for p, n in leaders.items() if n == victim)
        assert any(p in lost_while_down for p, *_ in acked)

        cluster.kill(victim)
        survivors = [n for n in (1, 2, 3) if n != victim]

        def fenced_and_leaderless() -> bool:
            controller = cluster.controller_id(survivors)
            if controller is None:
                return False
            view = cluster.describe(controller, topics=True)
            parts = view["topics"][topic]["partitions"]
            return view["brokers"][str(victim)]["fenced"] and all(
                p["leader"] == -1 for p in parts if p["partition"] in lost_while_down
            )

        # RF 1: the victim's partitions have no other replica to fail over to.
        wait_for(fenced_and_leaderless, f"node {victim} fenced and its partitions offline")
        cluster.start(victim)

        def all_led() -> bool:
            controller = cluster.controller_id()
            if controller is None:
                return False
            view = cluster.describe(controller, topics=True)
            parts = view["topics"][topic]["partitions"]
            return not view["brokers"][str(victim)]["fenced"] and all(
                p["leader"] >= 0 for p in parts
            )

        wait_for(all_led, f"node {victim} back and leading its partitions again")
        for client in CLIENTS:
            consumed = messages(
                run_client(
                    client,
                    {
                        "op": "consume",
                        "bootstrap": bootstrap,
                        "topic": topic,
                        "partitions": list(range(6)),
                        "expect": len(acked),
                    },
                )
            )
            # Three producers wrote the topic: order is per producer, offsets are shared.
            assert Counter(v for *_, v in consumed) == Counter(v for *_, v in acked), client
            assert {(p, o) for p, o, _, _ in consumed} == {(p, o) for p, o, _, _ in acked}


def test_describe_cluster_through_every_client(cluster: LocalCluster) -> None:
    """DescribeCluster (KIP-700; confluent-kafka and kafka-python) or Metadata (aiokafka): the
    same cluster id, every node with its Kafka endpoint, a node as controller; asked for, the
    cluster's authorized operations are all of them (no authorizer)."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    nodes = sorted([n.node_id, n.host, n.kafka_port] for n in cluster.state.nodes)
    answers = {
        client: run_client(client, {"op": "describe_cluster", "bootstrap": bootstrap})
        for client in CLIENTS
    }
    for client, answer in answers.items():
        assert answer["brokers"] == nodes, client
        assert answer["controller"] in {n[0] for n in nodes}, client
    every = ["ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]
    every.append("IDEMPOTENT_WRITE")
    assert answers["confluent-kafka"]["operations"] == every
    assert answers["kafka-python"]["operations"] == every
    cluster_ids = {answer["cluster_id"] for answer in answers.values()}
    assert len(cluster_ids) == 1 and all(cluster_ids), cluster_ids


def test_describe_features_through_kafka_python(cluster: LocalCluster) -> None:
    """KIP-584 through kafka-python's admin client (ApiVersions v3+): group.version and
    eligible.leader.replicas.version finalized at 1 (KIP-848, KIP-966), nothing else; their
    supported ranges (0 to 1) only if it asked v4 (Kafka leaves zero minimums out below)."""
    assert cluster.state is not None
    answer = run_client(
        "kafka-python", {"op": "describe_features", "bootstrap": cluster.state.bootstrap_servers}
    )
    assert set(answer) == {"group.version", "eligible.leader.replicas.version"}
    for name, feature in answer.items():
        assert (feature["finalized"], feature["finalized_epoch"]) == ([1, 1], 0), name
        assert feature.get("supported", [0, 1]) == [0, 1], name


def test_describe_topic_partitions_pages_through_a_topic(cluster: LocalCluster) -> None:
    """KIP-966's DescribeTopicPartitions through kafka-python's admin client: a 5-partition
    topic read two partitions a page, following the cursor, agrees with Metadata's leaders."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    topic = "paged"
    create = {"bootstrap": bootstrap, "topic": topic, "partitions": 5, "replication_factor": 3}
    run_client("kafka-python", {"op": "create_topic", **create})
    leaders = led_partitions("kafka-python", bootstrap, topic, 5)
    cmd = {"op": "describe_topic_partitions", "bootstrap": bootstrap, "topic": topic, "limit": 2}
    answer = run_client("kafka-python", cmd)
    assert answer["pages"] == 3
    assert [p[0] for p in answer["partitions"]] == [0, 1, 2, 3, 4]
    assert {str(p[0]): p[1] for p in answer["partitions"]} == leaders
    for _, _, isr, elr in answer["partitions"]:
        assert isr == [1, 2, 3] and elr is None  # kafka-python turns an empty ELR into None


def test_describe_producers_shows_the_idempotent_producer(cluster: LocalCluster) -> None:
    """KIP-664's DescribeProducers through kafka-python's admin client, after an idempotent
    confluent-kafka producer wrote to every partition: one producer on each, the same id,
    its last sequence the count of its records there less one."""
    assert cluster.state is not None
    bootstrap = cluster.state.bootstrap_servers
    topic = "producers"
    create = {"bootstrap": bootstrap, "topic": topic, "partitions": 3, "replication_factor": 3}
    run_client("confluent-kafka", {"op": "create_topic", **create})
    cmd = {"op": "produce", "bootstrap": bootstrap, "topic": topic, "count": 60, "prefix": "p"}
    acked = messages(run_client("confluent-kafka", cmd))
    per_partition = {p: sum(1 for m in acked if m[0] == p) for p in range(3)}
    assert all(per_partition.values()), per_partition
    cmd = {"op": "describe_producers", "bootstrap": bootstrap, "topic": topic}
    described = run_client("kafka-python", {**cmd, "partitions": [0, 1, 2]})
    producer_ids = set()
    for p, count in per_partition.items():
        ((producer_id, epoch, last_sequence),) = described[str(p)]
        assert (epoch, last_sequence) == (0, count - 1), (p, described)
        producer_ids.add(producer_id)
    assert len(producer_ids) == 1 and producer_ids.pop() >= 0


def test_no_node_lists_a_transaction(cluster: LocalCluster) -> None:
    """kcoord has no transaction coordinator: ListTransactions at every node lists none, and
    kafka-python's hanging-transaction search (ListTransactions, then DescribeProducers where
    a transaction would be open) finds none."""
    assert cluster.state is not None
    cmd = {"op": "list_transactions", "bootstrap": cluster.state.bootstrap_servers}
    nodes: dict[str, list[str]] = {str(n.node_id): [] for n in cluster.state.nodes}
    assert run_client("kafka-python", cmd) == {"listed": nodes, "hanging": []}
