"""Partition replication (Kafka's ISR model) on a real 3-node cluster, with aiokafka in-process.

- Every message acknowledged with acks=all to an RF-3 topic survives a SIGKILL of its leader:
  it is read from the new leader once, at its offset, in order. The killed node restarts,
  rejoins the ISR and gets its leadership back (preferred leader election).
- A leader that wrote an uncommitted tail (acks=1 while its followers were stopped) and died
  comes back as a follower, truncates to the new leader's log (KIP-101/279), catches up, rejoins
  the ISR, and once it leads again serves exactly the new leader's log. That log may hold the
  first acks=1 records: a follower's ReplicaFetch long-poll parked at the leader before the
  SIGSTOP is answered with them, and the follower appends them on SIGCONT. As in Kafka, what the
  new leader has stays (acks=1 promises neither loss nor survival); what only the old leader
  had is gone.
- min.insync.replicas: below it, acks=all writes are refused (NOT_ENOUGH_REPLICAS) or time out
  at the client, and nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from kafka import KafkaProducer
from kafka.errors import KafkaError as KafkaPythonError
from kafka.errors import NotEnoughReplicasError

from kcoord.raft import quorum as quorum_module
from tests.integration.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

TOPIC = "replicated"
PARTITIONS = 3
Acked = tuple[int, int, str]  # partition, offset, value


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path, 3) as c:
        wait_for(lambda: c.controller_id() is not None, "an active controller")
        yield c


def bootstrap(c: LocalCluster, among: list[int] | None = None) -> str:
    ids = among or c.alive_ids()
    return ",".join(f"{c.node(i).host}:{c.node(i).kafka_port}" for i in ids)


def partition_view(c: LocalCluster, topic: str, partition: int, via: int) -> dict[str, Any]:
    parts = c.describe(via, topics=True)["topics"][topic]["partitions"]
    view: dict[str, Any] = next(p for p in parts if p["partition"] == partition)
    return view


def create_topic(
    c: LocalCluster, name: str, configs: dict[str, str] | None = None, *, isr: int = 3
) -> None:
    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap(c), request_timeout_ms=30_000)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(name, PARTITIONS, 3, topic_configs=configs or {})], timeout_ms=30_000
            )
        finally:
            await admin.close()

    asyncio.run(go())
    via = c.alive_ids()[0]
    wait_for(
        lambda: all(len(partition_view(c, name, p, via)["isr"]) == isr for p in range(PARTITIONS)),
        f"{name} with {isr} in-sync replicas",
    )


def produce(
    c: LocalCluster,
    values: list[str],
    *,
    partition: int | None = None,
    acks: Any = "all",
    topic: str = TOPIC,
    timeout_ms: int = 30_000,
) -> tuple[list[Acked], list[str]]:
    """Send each value; return (acknowledged, failed) without retrying failures."""

    async def go() -> tuple[list[Acked], list[str]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap(c),
            acks=acks,
            enable_idempotence=acks == "all",
            request_timeout_ms=timeout_ms,
        )
        await producer.start()
        acked: list[Acked] = []
        failed: list[str] = []
        try:
            for value in values:
                try:
                    md = await asyncio.wait_for(
                        producer.send_and_wait(
                            topic, value.encode(), key=value.encode(), partition=partition
                        ),
                        timeout_ms / 1000 + 5,  # the client retries retriable errors
                    )
                except (KafkaError, TimeoutError):
                    failed.append(value)
                else:
                    acked.append((md.partition, md.offset, value))
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(producer.stop(), 10)
        return acked, failed

    return asyncio.run(go())


def consume(
    c: LocalCluster, partitions: list[int], topic: str = TOPIC, covering: Sequence[Acked] = ()
) -> list[Acked]:
    """Everything readable (below the HW) from the start of each partition, once the end
    offsets cover the ``covering`` records: a leader elected while the ISR was below
    min.insync.replicas keeps an older HW until the ISR is whole again and its followers have
    fetched (KIP-966), and the end offsets are its HW. A lost record never gets covered, and
    the read times out."""

    async def go() -> list[Acked]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap(c), enable_auto_commit=False, group_id=None
        )
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            wanted = {p: o + 1 for p, o, _ in sorted(covering)}
            ends = await consumer.end_offsets(tps)
            while any(ends[tp] < wanted.get(tp.partition, 0) for tp in tps):
                assert loop.time() < deadline, f"end offsets {ends} never covered {wanted}"
                await asyncio.sleep(0.1)  # polling the leaders' high watermarks
                ends = await consumer.end_offsets(tps)
            out: list[Acked] = []
            while True:
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                    break
                assert loop.time() < deadline, "consume timed out"
                batches = await consumer.getmany(timeout_ms=1000)
                for tp, records in batches.items():
                    out.extend((tp.partition, r.offset, (r.value or b"").decode()) for r in records)
            return out
        finally:
            await consumer.stop()

    return asyncio.run(go())


def check_exactly_once_in_order(acked: list[Acked], consumed: list[Acked]) -> None:
    values = [v for _, _, v in consumed]
    assert len(values) == len(set(values)), "a message was read twice"
    where = {v: (p, o) for p, o, v in consumed}
    for p, o, v in acked:
        assert where.get(v) == (p, o), f"acknowledged {v} at {p}/{o}, read at {where.get(v)}"
    for p in {p for p, _, _ in consumed}:
        offsets = [o for q, o, _ in consumed if q == p]
        assert offsets == sorted(offsets)


def test_acked_messages_survive_a_leader_kill_and_the_node_rejoins(
    cluster: LocalCluster,
) -> None:
    c = cluster
    create_topic(c, TOPIC)
    acked, failed = produce(c, [f"before-{i}" for i in range(60)])
    assert not failed
    victim = partition_view(c, TOPIC, 0, c.alive_ids()[0])["leader"]
    c.kill(victim)
    survivors = c.alive_ids()
    wait_for(
        lambda: partition_view(c, TOPIC, 0, survivors[0])["leader"] in survivors,
        "a new leader for partition 0",
    )
    more, _ = produce(c, [f"after-{i}" for i in range(60)])
    assert more, "nothing could be written after the failover"
    acked += more
    check_exactly_once_in_order(acked, consume(c, list(range(PARTITIONS)), covering=acked))

    c.start(victim)
    wait_for(
        lambda: all(
            victim in partition_view(c, TOPIC, p, survivors[0])["isr"] for p in range(PARTITIONS)
        ),
        f"node {victim} back in every ISR",
    )
    wait_for(
        lambda: partition_view(c, TOPIC, 0, survivors[0])["leader"] == victim,
        f"node {victim} leading partition 0 again (preferred leader)",
    )
    check_exactly_once_in_order(acked, consume(c, list(range(PARTITIONS)), covering=acked))


def test_a_returning_leader_truncates_its_uncommitted_tail(cluster: LocalCluster) -> None:
    c = cluster
    create_topic(c, TOPIC)
    committed, failed = produce(c, [f"committed-{i}" for i in range(20)], partition=0)
    assert not failed
    view = partition_view(c, TOPIC, 0, c.alive_ids()[0])
    old_leader = view["leader"]
    followers = [r for r in view["replicas"] if r != old_leader]
    # Followers stop fetching; the leader takes acks=1 writes, then dies. A follower's
    # ReplicaFetch parked at the leader (replica.fetch.wait.max.ms) before its SIGSTOP is still
    # answered with the first of them: the answer waits in the stopped follower's socket and is
    # appended on SIGCONT. The rest of the tail only the old leader has.
    stopped: list[int] = []
    for f in followers:
        pid = c.node(f).pid
        assert pid is not None, f"follower {f} is not running"  # kill(0) stops pytest's group
        stopped.append(pid)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        tail, _ = produce(
            c, [f"uncommitted-{i}" for i in range(10)], partition=0, acks=1, timeout_ms=5000
        )
    finally:
        c.kill(old_leader)
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert tail, "the stopped followers' leader took no acks=1 write"
    wait_for(
        lambda: partition_view(c, TOPIC, 0, followers[0])["leader"] in followers,
        "a new leader for partition 0 among the followers",
    )
    after, _ = produce(c, [f"new-leader-{i}" for i in range(20)], partition=0)
    assert len(after) == 20
    c.start(old_leader)
    wait_for(
        lambda: old_leader in partition_view(c, TOPIC, 0, followers[0])["isr"],
        f"node {old_leader} back in the ISR",
    )
    wait_for(
        lambda: partition_view(c, TOPIC, 0, followers[0])["leader"] == old_leader,
        f"node {old_leader} leading partition 0 again",
    )
    read = consume(c, [0])
    # The new leader's log at its election ends where its first write went: the committed
    # records, then the part of the tail that reached it (at the offsets the old leader gave
    # them). Every replica converges on that log (KIP-101/279); the rest of the tail is gone.
    new_leader_start = after[0][1]
    kept = [t for t in tail if t[1] < new_leader_start]
    truncated = [v for _, o, v in tail if o >= new_leader_start]
    assert truncated, f"the new leader had the whole acks=1 tail {tail}: nothing to truncate"
    assert not [v for _, _, v in read if v in truncated], "a truncated suffix is served"
    expected = committed + kept + after
    check_exactly_once_in_order(expected, read)
    assert [v for _, _, v in read] == [v for _, _, v in expected], "not the new leader's log"


def produce_once(c: LocalCluster, topic: str, partition: int, value: str) -> Exception | None:
    """One acks=all send without client retries (kafka-python): the broker's answer."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap(c), acks="all", retries=0, request_timeout_ms=5000
    )
    try:
        producer.send(topic, value.encode(), partition=partition).get(timeout=15)
    except (KafkaPythonError, TimeoutError) as e:
        return e
    finally:
        producer.close(timeout=5)
    return None


def test_below_min_insync_replicas_nothing_acknowledged_is_lost(cluster: LocalCluster) -> None:
    c = cluster
    create_topic(c, TOPIC, {"min.insync.replicas": "2"})
    create_topic(c, "strict", {"min.insync.replicas": "3"})
    acked, failed = produce(c, [f"ok-{i}" for i in range(20)])
    strict_acked, strict_failed = produce(c, [f"strict-{i}" for i in range(10)], topic="strict")
    assert not failed and not strict_failed
    view = partition_view(c, TOPIC, 0, c.alive_ids()[0])
    # Kill the two followers of partition 0, one after the other: its leader is left alone.
    first, second = [r for r in view["replicas"] if r != view["leader"]]
    c.kill(first)
    alive = c.alive_ids()
    wait_for(
        lambda: all(
            first not in partition_view(c, t, p, alive[0])["isr"]
            for t in (TOPIC, "strict")
            for p in range(PARTITIONS)
        ),
        f"node {first} out of every ISR",
    )
    # ISR of 2 < min.insync.replicas 3: refused before anything is written.
    error = produce_once(c, "strict", 0, "refused-strict")
    assert isinstance(error, NotEnoughReplicasError), repr(error)
    c.kill(second)
    # No quorum is left to shrink the ISR to the leader: the HW cannot move, the write times out.
    error = produce_once(c, TOPIC, 0, "refused")
    assert error is not None, "acknowledged with one live replica out of three"
    c.start(first)
    c.start(second)
    wait_for(lambda: c.controller_id() is not None, "an active controller again")
    wait_for(
        lambda: all(
            len(partition_view(c, t, p, c.alive_ids()[0])["isr"]) == 3
            for t in (TOPIC, "strict")
            for p in range(PARTITIONS)
        ),
        "every replica back in the ISR",
    )
    check_exactly_once_in_order(acked, consume(c, list(range(PARTITIONS)), covering=acked))
    strict_read = consume(c, list(range(PARTITIONS)), topic="strict", covering=strict_acked)
    check_exactly_once_in_order(strict_acked, strict_read)
    assert "refused-strict" not in [v for _, _, v in strict_read]


def delete_topics(c: LocalCluster, names: list[str]) -> None:
    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap(c), request_timeout_ms=30_000)
        await admin.start()
        try:
            await admin.delete_topics(names, timeout_ms=30_000)
        finally:
            await admin.close()

    asyncio.run(go())


def snapshot_offset(c: LocalCluster, node_id: int) -> int:
    """The metadata offset of the node's latest snapshot (quorum.py's format), -1 if none."""
    path = Path(c.node(node_id).directory) / "data" / "__cluster_metadata" / "snapshot"
    try:
        return quorum_module._parse_snapshot(path.read_bytes()).offset
    except FileNotFoundError:
        return -1


def segment_bytes(c: LocalCluster, node_id: int, topic: str, partition: int) -> bytes:
    directory = Path(c.node(node_id).directory) / "data" / f"{topic}-{partition}"
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def test_a_node_brought_back_by_a_metadata_snapshot_drops_deleted_topics_logs(
    tmp_path: Path,
) -> None:
    """Node 3 is down while one topic is deleted and created again under the same name and
    another is deleted for good; the quorum then snapshots its metadata log and drops the
    entries node 3 missed, so node 3 catches up by installing the leader's snapshot rather than
    by replaying those entries. It must not take the old topic's log for the new one's (its
    records would be served as the new topic's), and must not keep the deleted topic's log."""
    with LocalCluster(tmp_path, 3, {"metadata.log.max.snapshot.interval.ms": 500}) as c:
        wait_for(lambda: c.controller_id() is not None, "an active controller")
        create_topic(c, "reborn")
        create_topic(c, "gone")
        _, failed = produce(c, [f"old-{i}" for i in range(30)], topic="reborn")
        _, failed_gone = produce(c, [f"gone-{i}" for i in range(10)], topic="gone")
        assert not failed and not failed_gone
        old_id = c.describe(1, topics=True)["topics"]["reborn"]["topic_id"]
        victim = 3
        c.kill(victim)
        wait_for(
            lambda: all(
                victim not in partition_view(c, "reborn", p, 1)["isr"] for p in range(PARTITIONS)
            ),
            f"node {victim} fenced and out of every ISR",
        )
        delete_topics(c, ["reborn", "gone"])
        wait_for(
            lambda: not {"reborn", "gone"} & set(c.describe(1, topics=True)["topics"]),
            "both topics deleted",
        )
        # Replicas go to fenced brokers too (as followers, out of the ISR): node 3 is one.
        create_topic(c, "reborn", isr=2)
        new_id = c.describe(1, topics=True)["topics"]["reborn"]["topic_id"]
        assert new_id != old_id
        for p in range(PARTITIONS):
            assert victim in partition_view(c, "reborn", p, 1)["replicas"]
        acked, failed = produce(c, [f"new-{i}" for i in range(30)], topic="reborn")
        assert not failed
        recreated_offset = c.describe(1)["metadata_offset"]
        wait_for(
            lambda: all(snapshot_offset(c, n) >= recreated_offset for n in (1, 2)),
            "nodes 1 and 2 to snapshot their metadata logs after the topic came back",
        )

        c.start(victim)
        wait_for(
            lambda: all(
                victim in partition_view(c, "reborn", p, 1)["isr"] for p in range(PARTITIONS)
            ),
            f"node {victim} back in every ISR of the new topic",
        )
        log_text = c.node(victim).log_path.read_text(errors="replace")
        loaded = [int(o) for o in re.findall(r"replaced by the snapshot at offset (\d+)", log_text)]
        assert max(loaded) >= recreated_offset, "node 3 did not catch up by a leader's snapshot"
        data = Path(c.node(victim).directory) / "data"
        assert not list(data.glob("gone-*")), "the deleted topic's logs are still on node 3"
        for p in range(PARTITIONS):
            metadata = (data / f"reborn-{p}" / "partition.metadata").read_text()
            assert new_id in metadata and old_id not in metadata
            on_disk = segment_bytes(c, victim, "reborn", p)
            assert b"old-" not in on_disk, f"node {victim} kept the old topic's records in {p}"
        assert sum(segment_bytes(c, victim, "reborn", p).count(b"new-") for p in range(3)) >= 30
        check_exactly_once_in_order(
            acked, consume(c, list(range(PARTITIONS)), topic="reborn", covering=acked)
        )


def test_a_topic_of_thousands_of_partitions_disturbs_no_other_partition(tmp_path: Path) -> None:
    """Creating 2000 partitions with replication factor 3 has every node create 2000 logs (a
    directory, an fsynced partition.metadata and segment files each). Done on the event loop,
    that froze each node for seconds, its broker heartbeats with it, and the controller fenced
    every broker: every partition's leadership moved, and the CreateTopics that had succeeded
    was answered with an error (the client's retry then got TOPIC_ALREADY_EXISTS). The logs
    are now created off the loop, and a heartbeat counts from its arrival: the topic is created
    at the first attempt, and no leader epoch of ``__consumer_offsets`` changes."""
    offsets_partitions, wide = 6, 2000
    with LocalCluster(tmp_path, 3, {"offsets.topic.num.partitions": offsets_partitions}) as c:

        def offsets_epochs() -> dict[int, int]:
            parts = c.describe(1, topics=True)["topics"]["__consumer_offsets"]["partitions"]
            return {p["partition"]: p["leader_epoch"] for p in parts if len(p["isr"]) == 3}

        wait_for(lambda: len(offsets_epochs()) == offsets_partitions, "__consumer_offsets")
        before = offsets_epochs()

        async def create() -> Any:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap(c), request_timeout_ms=120_000)
            await admin.start()
            try:
                return await admin.create_topics([NewTopic("wide", wide, 3)], timeout_ms=120_000)
            finally:
                await admin.close()

        response = asyncio.run(create())
        assert [(t[0], t[1]) for t in response.topic_errors] == [("wide", 0)]

        def hosted_everywhere() -> bool:
            return all(
                f"created {wide} of {wide} new logs ahead" in c.node(n).log_path.read_text()
                and len(c.describe(n, topics=True)["topics"]["wide"]["partitions"]) == wide
                for n in (1, 2, 3)
            )

        wait_for(hosted_everywhere, f"every node hosting all {wide} partitions", deadline_s=120)
        assert offsets_epochs() == before
        for node_id in (1, 2, 3):
            text = c.node(node_id).log_path.read_text()
            assert "fencing brokers" not in text, f"node {node_id} fenced brokers"


def test_a_batch_larger_than_the_inter_node_request_limit_is_replicated(
    cluster: LocalCluster,
) -> None:
    """A topic whose max.message.bytes is raised past the inter-node RPC's 64 MiB request
    limit: an acks=all batch of 70 MiB (under socket.request.max.bytes) is acknowledged only
    once both followers have it, as Kafka's replica fetch takes any one batch whole."""
    c = cluster
    big = 70 * 1024 * 1024
    create_topic(c, "big", {"max.message.bytes": str(80 * 1024 * 1024), "min.insync.replicas": "3"})
    view = partition_view(c, "big", 0, c.alive_ids()[0])
    value = os.urandom(big)

    async def go() -> int:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap(c),
            acks="all",
            max_request_size=90 * 1024 * 1024,
            request_timeout_ms=60_000,
        )
        await producer.start()
        try:
            md = await producer.send_and_wait("big", value, partition=0)
            return int(md.offset)
        finally:
            await producer.stop()

    assert asyncio.run(go()) == 0
    for node_id in view["replicas"]:

        def holds_it(n: int = node_id) -> bool:
            return len(segment_bytes(c, n, "big", 0)) > big

        wait_for(holds_it, f"the batch in node {node_id}'s log")
    assert len(partition_view(c, "big", 0, c.alive_ids()[0])["isr"]) == 3
