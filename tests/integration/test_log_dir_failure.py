"""A node whose disk fills up halts, the others take over, and nothing acknowledged is lost.

Node 2's data directory is a small tmpfs (its ``node.log`` stays on the test's disk). An
idempotent acks=all aiokafka producer writes to an RF-3 topic until that file system is full.
Node 2 must then halt with exit code 1 and Kafka's "Shutdown ... because all log dirs in ...
have failed" (``LogManager.handleLogDirFailure``) instead of going on with partitions it can
neither lead nor follow; the survivors take its leaderships and the producer's writes go on.
Once the file system has room again node 2 starts, recovers (a torn batch at a log's end is
cut off), catches up and rejoins every ISR, and every acknowledged message is read exactly
once, at its offset.

Mounting needs root (the project's machines have it); elsewhere the test is skipped.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from kcoord.node import launcher
from tests.integration.cluster import LocalCluster, wait_for
from tests.integration.test_replication import (
    PARTITIONS,
    Acked,
    bootstrap,
    check_exactly_once_in_order,
    consume,
    create_topic,
    partition_view,
)

pytestmark = pytest.mark.integration

TOPIC = "filling"
FULL_NODE = 2
TMPFS_MIB = 12
VALUE = "x" * 1000


def mount_tmpfs(where: Path, size_mib: int) -> None:
    where.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """Node 2's data directory, on a tmpfs of ``TMPFS_MIB``; unmounted at the end."""
    data = tmp_path / f"node-{FULL_NODE}" / "data"
    mount_tmpfs(data, TMPFS_MIB)
    try:
        yield data
    finally:
        subprocess.run(["umount", "--lazy", str(data)], check=False)


def produce_chunk(c: LocalCluster, first: int, count: int) -> tuple[list[Acked], int]:
    """Send ``count`` values at once (the client batches and retries them); return what was
    acknowledged and how many sends failed."""

    async def go() -> tuple[list[Acked], int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap(c),
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=20_000,
        )
        await producer.start()
        try:
            values = [f"{i}-{VALUE}" for i in range(first, first + count)]
            sent = [await producer.send(TOPIC, v.encode()) for v in values]
            results = await asyncio.gather(*sent, return_exceptions=True)
        finally:
            await asyncio.wait_for(producer.stop(), 30)
        acked = [
            (md.partition, md.offset, v)
            for v, md in zip(values, results, strict=True)
            if not isinstance(md, BaseException)
        ]
        failed = [md for md in results if isinstance(md, BaseException)]
        assert all(isinstance(e, KafkaError) for e in failed), failed
        return acked, len(failed)

    return asyncio.run(go())


def test_a_node_whose_disk_fills_up_halts_and_nothing_acknowledged_is_lost(
    tmp_path: Path, small_disk: Path
) -> None:
    with LocalCluster(tmp_path, 3, {"offsets.topic.num.partitions": 3}) as c:
        wait_for(lambda: c.controller_id() is not None, "an active controller")
        create_topic(c, TOPIC)
        node = c.node(FULL_NODE)
        acked: list[Acked] = []
        sent = 0
        # Each chunk is ~1 MiB on every replica: node 2 fills up within about TMPFS_MIB chunks.
        while launcher.is_alive(node.pid):
            assert sent < 4 * TMPFS_MIB * 1000, f"node {FULL_NODE} is still up with a full disk"
            chunk, _ = produce_chunk(c, sent, 1000)
            acked += chunk
            sent += 1000
        assert node.pid is not None
        assert launcher.exit_code(node.pid) == 1
        text = node.log_path.read_text(errors="replace")
        assert "No space left on device" in text
        assert f"Shutdown node because all log dirs in {small_disk} have failed" in text

        # The survivors lead every partition, and writes go on.
        survivors = c.alive_ids()
        wait_for(
            lambda: all(
                partition_view(c, TOPIC, p, survivors[0])["leader"] in survivors
                for p in range(PARTITIONS)
            ),
            "leaders among the survivors",
        )
        more, failed = produce_chunk(c, sent, 300)
        assert not failed and len(more) == 300
        acked += more
        check_exactly_once_in_order(acked, consume(c, list(range(PARTITIONS)), TOPIC))

        # Room again: node 2 recovers, catches up and rejoins every ISR.
        subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
        c.start(FULL_NODE)
        wait_for(
            lambda: all(
                FULL_NODE in partition_view(c, TOPIC, p, survivors[0])["isr"]
                for p in range(PARTITIONS)
            ),
            f"node {FULL_NODE} back in every ISR",
            deadline_s=120,
        )
        check_exactly_once_in_order(acked, consume(c, list(range(PARTITIONS)), TOPIC))
