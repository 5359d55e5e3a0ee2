"""Soak: a 3-node cluster with the default settings, under load, for longer than the periodic
tasks' intervals (``make soak``; ``SOAK_SECONDS``, default 480, at least 400).

The default suite's clusters live for seconds, so what a node does every few minutes never runs
there: the metadata snapshot (every 5 minutes), retention (5 minutes after a 30 s delay), the
recovery-point checkpoint. Two bugs hid there (a voter behind a snapshot could never catch up;
retention and the cleaner never ran). This run keeps an acks=all producer and a two-member
aiokafka group going; node 2 is SIGKILLed at 250 s, a topic is created and deleted while it is
away, and it comes back at 330 s, after the others' first snapshot, so it must install one.

It checks: every acknowledged message is consumed by the group; node 2 caught up by a snapshot
and holds no log of the topic deleted while it was away; retention deleted segments on nodes 1
and 3; no node logged an ERROR or a traceback; no node's memory more than doubled after the
first minute. It prints what it measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from tests.integration.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SOAK_S = float(os.environ.get("SOAK_SECONDS", "480"))
KILL_AT_S, AWAY_TOPIC_AT_S, BACK_AT_S = 250.0, 265.0, 330.0
VICTIM = 2


def rss_mib(pid: int | None) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", status)
    assert found is not None
    return int(found.group(1)) // 1024


class Soak:
    def __init__(self, cluster: LocalCluster) -> None:
        self.c = cluster
        assert cluster.state is not None
        self.bootstrap = cluster.state.bootstrap_servers
        self.acked: set[bytes] = set()
        self.seen: set[bytes] = set()
        self.failed_sends = 0
        self.stop = asyncio.Event()
        self.t0 = time.monotonic()
        self.rss_at_60s: dict[int, int] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    async def until(self, at_s: float) -> None:
        while self.elapsed() < at_s:
            await asyncio.sleep(min(1.0, at_s - self.elapsed()))  # the schedule's clock

    async def admin(self, create: Sequence[NewTopic] = (), delete: Sequence[str] = ()) -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=30_000)
        await client.start()
        try:
            if create:
                await client.create_topics(list(create), timeout_ms=30_000)
            if delete:
                await client.delete_topics(list(delete), timeout_ms=30_000)
        finally:
            await client.close()

    async def produce(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True
        )
        await producer.start()
        i = 0
        try:
            while not self.stop.is_set():
                value = f"m{i}".encode()
                i += 1
                try:
                    await asyncio.wait_for(producer.send_and_wait("soak", value, key=value), 60)
                except (KafkaError, TimeoutError):
                    self.failed_sends += 1
                else:
                    self.acked.add(value)
                await asyncio.sleep(0.005)  # a steady rate, about 100 messages a second
        finally:
            await producer.stop()

    async def consume(self) -> None:
        consumer = AIOKafkaConsumer(
            "soak",
            bootstrap_servers=self.bootstrap,
            group_id="soak-group",
            auto_offset_reset="earliest",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
        )
        await consumer.start()
        try:
            while not self.stop.is_set() or not self.acked <= self.seen:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    self.seen.update(r.value for r in records if r.value is not None)
                if self.stop.is_set() and self.elapsed() > SOAK_S + 120:
                    break  # the assertion below reports what is missing
        finally:
            await consumer.stop()

    async def operate(self) -> None:
        await self.until(60)
        self.rss_at_60s = {n: rss_mib(self.c.node(n).pid) for n in (1, 2, 3)}
        await self.until(KILL_AT_S)
        self.c.kill(VICTIM)
        await self.until(AWAY_TOPIC_AT_S)
        await self.admin(create=[NewTopic("while-away", 3, 3)])
        await self.admin(delete=["while-away"])
        await self.until(BACK_AT_S)
        self.c.start(VICTIM)

    async def run(self) -> None:
        await self.admin(
            create=[
                NewTopic(
                    "soak",
                    6,
                    3,
                    topic_configs={"retention.ms": "120000", "internal.segment.bytes": "65536"},
                )
            ]
        )
        workers = [asyncio.create_task(w) for w in (self.consume(), self.consume())]
        producer = asyncio.create_task(self.produce())
        operator = asyncio.create_task(self.operate())
        try:
            await self.until(SOAK_S)
            await operator
        finally:
            self.stop.set()
            await producer
            await asyncio.gather(*workers)
            operator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await operator


@pytest.mark.timeout(SOAK_S + 600)
def test_a_cluster_under_load_for_minutes_with_default_settings(tmp_path: Path) -> None:
    assert SOAK_S >= 400, "SOAK_SECONDS must cover a node away across the first snapshot"
    with LocalCluster(tmp_path, 3) as c:
        wait_for(lambda: c.controller_id() is not None, "an active controller")
        soak = Soak(c)
        asyncio.run(soak.run())
        logs = {n: c.node(n).log_path.read_text(errors="replace") for n in (1, 2, 3)}
        rss = {n: rss_mib(c.node(n).pid) for n in (1, 2, 3)}
        deleted = {
            n: len(re.findall(r"retention deleted \d+ segments", logs[n])) for n in (1, 2, 3)
        }
        print(
            f"soak {SOAK_S:.0f} s: {len(soak.acked)} acknowledged, {len(soak.seen)} consumed, "
            f"{soak.failed_sends} sends failed (not acknowledged); RSS MiB at 60 s "
            f"{soak.rss_at_60s}, at the end {rss}; retention passes that deleted: {deleted}"
        )
        missing = soak.acked - soak.seen
        assert not missing, f"{len(missing)} acknowledged messages never consumed"
        assert "replaced by the snapshot" in logs[VICTIM], "node 2 did not install a snapshot"
        data = Path(c.node(VICTIM).directory) / "data"
        assert not list(data.glob("while-away-*")), "node 2 kept a deleted topic's log"
        assert deleted[1] and deleted[3], "retention deleted nothing"
        for n, text in logs.items():
            errors = [line for line in text.splitlines() if " ERROR " in line]
            assert not errors and "Traceback" not in text, (n, errors[:5])
            assert rss[n] <= 2 * soak.rss_at_60s[n], (n, soak.rss_at_60s[n], rss[n])
