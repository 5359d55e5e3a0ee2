"""Log housekeeping on a real 3-node cluster (``node/log_maintenance.py``), with aiokafka:

- the log cleaner compacts a group's ``__consumer_offsets`` partition on every replica, and
  after its coordinator is SIGKILLed the new one, replaying the compacted log, answers the
  latest committed offset and metadata; the restarted node goes on compacting it;
- retention deletes a topic's segments past ``retention.ms`` on every replica, the active
  one too once the partition is idle: the earliest offset moves up to the log end.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from prometheus_client.parser import text_string_to_metric_families

from kcoord.cluster.routing import partition_for
from tests.integration.cluster import LocalCluster, wait_for
from tests.integration.test_replication import bootstrap, create_topic, partition_view, produce

pytestmark = pytest.mark.integration

OFFSETS_PARTITIONS = 5
SEGMENT_BYTES = 4096


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    overrides = {
        "offsets.topic.num.partitions": OFFSETS_PARTITIONS,
        "offsets.topic.segment.bytes": SEGMENT_BYTES,
        "log.cleaner.backoff.ms": 200,
        "log.retention.check.interval.ms": 200,
        "log.initial.task.delay.ms": 0,
    }
    with LocalCluster(tmp_path, 3, overrides) as c:
        wait_for(lambda: c.controller_id() is not None, "an active controller")
        yield c


def log_bytes(c: LocalCluster, node_id: int, topic: str, partition: int) -> int:
    directory = Path(c.node(node_id).directory) / "data" / f"{topic}-{partition}"
    while True:
        try:
            return sum(p.stat().st_size for p in directory.glob("*.log"))
        except FileNotFoundError:
            continue  # the cleaner swapped a segment out between glob and stat: look again


def first_base_offset(c: LocalCluster, node_id: int, topic: str, partition: int) -> int:
    directory = Path(c.node(node_id).directory) / "data" / f"{topic}-{partition}"
    return min(int(p.name.split(".")[0]) for p in directory.glob("*.log"))


def segment_count(c: LocalCluster, node_id: int, topic: str, partition: int) -> int:
    directory = Path(c.node(node_id).directory) / "data" / f"{topic}-{partition}"
    return len(list(directory.glob("*.log")))  # a deleted segment is renamed .log.deleted


def metric(c: LocalCluster, node_id: int, name: str, **labels: str) -> float:
    n = c.node(node_id)
    with urllib.request.urlopen(f"http://{n.host}:{n.admin_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


EVENTS_0 = TopicPartition("events", 0)


@contextlib.asynccontextmanager
async def assigned_consumer(c: LocalCluster, group: str) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer of ``group`` assigned events-0 by hand (its commits carry no generation)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap(c), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([EVENTS_0])
        yield consumer
    finally:
        await consumer.stop()


def commit_many(c: LocalCluster, group: str, commits: int) -> None:
    """Offsets 1..commits for events-0, one OffsetCommit each."""

    async def go() -> None:
        async with assigned_consumer(c, group) as consumer:
            for offset in range(1, commits + 1):
                metadata = f"m{offset}" + "x" * 100
                await consumer.commit({EVENTS_0: OffsetAndMetadata(offset, metadata)})

    asyncio.run(go())


def committed(c: LocalCluster, group: str) -> OffsetAndMetadata | None:
    async def go() -> OffsetAndMetadata | None:
        async with assigned_consumer(c, group) as consumer:
            offsets = await consumer._coordinator.fetch_committed_offsets([EVENTS_0])
            return offsets.get(EVENTS_0)

    return asyncio.run(go())


def test_the_cleaner_compacts_consumer_offsets_and_a_new_coordinator_loads_it(
    cluster: LocalCluster,
) -> None:
    c = cluster
    create_topic(c, "events")
    group = "compacted-group"
    p = partition_for(group, OFFSETS_PARTITIONS)
    commits = 1500  # about 250 KB of commit records: some sixty 4 KiB segments
    commit_many(c, group, commits)
    written = max(log_bytes(c, n, "__consumer_offsets", p) for n in (1, 2, 3))
    wait_for(
        lambda: all(
            log_bytes(c, n, "__consumer_offsets", p) < 3 * SEGMENT_BYTES for n in (1, 2, 3)
        ),
        f"every replica of __consumer_offsets-{p} compacted (had up to {written} bytes)",
    )
    for n in (1, 2, 3):
        assert metric(c, n, "kcoord_log_cleaner_passes_total", result="cleaned") > 0
        assert metric(c, n, "kcoord_log_cleaner_dropped_records_total", kind="superseded") > 0
    coordinator = partition_view(c, "__consumer_offsets", p, 1)["leader"]
    c.kill(coordinator)
    survivors = c.alive_ids()
    wait_for(
        lambda: partition_view(c, "__consumer_offsets", p, survivors[0])["leader"] in survivors,
        f"a new leader for __consumer_offsets-{p}",
    )
    expected = (commits, f"m{commits}" + "x" * 100)
    latest = committed(c, group)  # a hot standby took over (it followed the log as it came)
    assert latest is not None and (latest.offset, latest.metadata) == expected
    # The killed node comes back, takes its leadership back (preferred leader) and loads the
    # group cold, by replaying its own compacted log from the start.
    c.start(coordinator)
    wait_for(
        lambda: partition_view(c, "__consumer_offsets", p, survivors[0])["leader"] == coordinator,
        f"node {coordinator} leading __consumer_offsets-{p} again",
    )
    latest = committed(c, group)
    assert latest is not None and (latest.offset, latest.metadata) == expected
    # The restarted node opened its log from disk before it read the metadata: it must still
    # treat it as the compacted topic it is (it fell back to the defaults and stopped
    # compacting it).
    commit_many(c, group, 600)
    wait_for(
        lambda: log_bytes(c, coordinator, "__consumer_offsets", p) < 3 * SEGMENT_BYTES,
        f"node {coordinator}'s __consumer_offsets-{p} compacted again after its restart",
    )


def test_retention_deletes_old_segments_on_every_replica(cluster: LocalCluster) -> None:
    c = cluster
    create_topic(c, "expiring", {"retention.ms": "1000", "internal.segment.bytes": "1024"})
    acked, failed = produce(c, [f"r{i:03d}-" + "y" * 60 for i in range(90)], topic="expiring")
    assert not failed
    ends = {p: 1 + max(o for q, o, _ in acked if q == p) for p in range(3)}
    # Every segment expires a second after its newest record, the active one too once the
    # partition is idle (UnifiedLog.deletableSegments, after a roll): every replica keeps one
    # empty segment starting at the log end.
    wait_for(
        lambda: all(
            segment_count(c, n, "expiring", p) == 1
            and first_base_offset(c, n, "expiring", p) == ends[p]
            for n in (1, 2, 3)
            for p in range(3)
        ),
        "every replica of every partition to drop every record",
    )

    for n in (1, 2, 3):
        assert metric(c, n, "kcoord_log_retention_deleted_segments_total") >= 4

    async def earliest_and_latest() -> tuple[dict[int, int], dict[int, int]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap(c))
        await consumer.start()
        try:
            tps = [TopicPartition("expiring", p) for p in range(3)]
            starts = await consumer.beginning_offsets(tps)
            latest = await consumer.end_offsets(tps)
            return (
                {tp.partition: o for tp, o in starts.items()},
                {tp.partition: o for tp, o in latest.items()},
            )
        finally:
            await consumer.stop()

    # What a consumer with auto.offset.reset=earliest starts from: the log end, nothing expired
    # is served.
    assert asyncio.run(earliest_and_latest()) == (ends, ends)
