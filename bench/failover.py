"""Group coordinator failover benchmark: ``make bench-failover``.

Starts real local clusters (``kcoord.node.launcher.up`` on loopback ports found free at run time)
and measures, in one run on this machine:

1. **Failover time**: the time from the SIGKILL of a group's coordinator node to that group's
   next successful OffsetCommit, ``--trials`` times per case. The cases: the group's
   ``__consumer_offsets`` partition holds about ``--small-records`` (1 thousand) or about
   ``--large-records`` (1 million) records, with ``group.coordinator.hot.standby.enable`` on and
   off (a 3-node cluster per setting, every other key at its default: RF 3, session timeout
   ``broker.session.timeout.ms``).

   The committer is a task of this process that commits one offset after the other (at most
   one per ``COMMIT_INTERVAL_S``) for a simple group (OffsetCommit v8, generation -1, empty
   member id) over one persistent connection to the coordinator. On an error code or a dead
   connection it waits ``RETRY_BACKOFF_S`` (a client's ``retry.backoff.ms``), runs
   FindCoordinator again (asking the nodes in turn, each over a new connection) and retries,
   as a Kafka client does. The
   coordinator is killed once it has answered ``WARMUP_COMMITS`` commits over at least
   ``WARMUP_S``. The figure is the answer time of the first successful commit *sent* after the
   kill, less the kill time (taken just before the signal). The client is this script's own:
   the request and response codec of ``kcoord.node.kafka.client`` (kio-based,
   ``encode_request`` and ``decode_response``) over asyncio streams, with pipelining for the
   fill below.

   Filling a partition: OffsetCommit requests of ``--fill-partitions`` partitions each (one
   record per partition) from ``--fill-groups`` groups that hash to the partition
   (``partition_for``), ``FILL_IN_FLIGHT`` requests pipelined on one connection. The committed
   topic (``FILL_TOPIC``, replication factor 1) exists: kcoord answers commits for partitions
   missing from its metadata with UNKNOWN_TOPIC_OR_PARTITION and writes no record for them. A
   key is committed ``records / (groups * partitions)`` times over, as in a real, uncompacted
   offsets log. The small case is measured before the large partition is filled.

   Victims: the group's partition is one whose preferred leader is not the active controller
   when the cases start (the small and the large case on different nodes), so that a trial
   measures coordinator failover, not controller failover (``bench-quorum`` measures that).
   The quorum may elect another controller later (under CPU load, for one), so each trial
   records whether its victim was the controller. Before each trial: every node is
   registered and unfenced, every ``__consumer_offsets`` partition is back on its preferred
   leader with every replica in its ISR, the group's shard is active there and, with hot
   standby on, every follower's standby has replayed up to its high watermark
   (``DescribeNode`` polled with a deadline); the time this took is the trial's ``ready_ms``.
   After each trial the killed node is restarted (``rejoin_ms``: until registered, unfenced
   and caught up with the metadata log). Each trial records the load that made the new
   coordinator serve the group (from its ``DescribeNode`` ``loads``): hot or cold, records
   replayed, load ms, when it started after the kill (fencing and election) and the time
   from its end to the commit's answer (the high watermark waiting for the other follower);
   and the committer's failures after the kill, in order.

2. **Cold replay rate** (records/s): records / (end_ms - start_ms) of the cold loads of the
   large partition (the failover loads of the hot-standby-off, large case). A cold load reads
   every record of the log and replays the latest of each key (``node.runtime.LatestRecords``:
   with the default fill every key is committed ten times over, so a tenth of them);
   ``applied`` in a trial's load says how many it replayed.

3. **OffsetCommit throughput** of the 3-node cluster (hot standby on, replication factor 3:
   every commit waits for the ISR, acks=all) as a ratio to a 1-node cluster
   (``offsets.topic.replication.factor`` 1): ``--throughput-clients`` aiokafka consumers, each
   of its own group, commit in a loop for ``--throughput-seconds`` (``commit_case`` of
   ``bench/coordinator.py``; a warm-up commit per client is not timed).

Targets (reported, never asserted): failover p50 < session timeout + 1 s and p99 < twice that,
in every case; with hot standby, the large case's p50 within 20% of the small case's; cold
replay >= 200,000 records/s (median of the cold loads). With ``--trials`` 10 the p99 is the
largest sample (nearest rank).

Prints a table and writes ``bench/results/failover.json`` (raw samples and every trial's
record, targets, targets_met). Every node process is killed at the end, on failure and
SIGTERM too; on a failure the working directory (``<cluster>/node-<id>/node.log``) is kept
and named.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import aiokafka

from kcoord.cluster.routing import partition_for
from kcoord.errors import Errors
from kcoord.node import launcher
from kcoord.node.config import load_config
from kcoord.node.kafka.client import SIZE, decode_response, encode_request
from kcoord.node.rpc import RpcClientError
from kcoord.raft.controller import OFFSETS_TOPIC_NAME

if TYPE_CHECKING:
    from bench import coordinator, quorum
else:  # run as a script: bench/ is on sys.path
    import coordinator
    import quorum

OFFSET_COMMIT_KEY = 8
OFFSET_COMMIT_VERSION = 8  # a classic client's latest (v9 is for KIP-848 member epochs)
FIND_COORDINATOR_KEY = 10
FIND_COORDINATOR_VERSION = 4
COORDINATOR_KEY_GROUP = 0
CLIENT_ID = "bench-failover"
FILL_TOPIC = "bench-fill"
FILL_IN_FLIGHT = 8  # pipelined fill requests on the one connection
# A Kafka client's retry.backoff.ms is 100; a little shorter, so that the client's own backoff
# adds less to the figure than the fencing it waits for.
RETRY_BACKOFF_S = 0.05
# Successful commits at most this often (a consumer commits a few times a second, not in a
# tight loop): the warm-ups add some 50 records per trial to the small partition, not hundreds.
COMMIT_INTERVAL_S = 0.02
WARMUP_COMMITS = 20  # successful commits to the coordinator before it is killed
# ... over at least this long: two broker heartbeat intervals (500 ms). A cold load blocks the
# loading node's event loop in chunks, its heartbeats with it; killed right after its load, a
# node is fenced up to a second early, which would flatter the figure.
WARMUP_S = 1.0
READY_POLL_S = 0.1  # DescribeNode with topics lists every partition: poll it gently
FAILOVER_MARGIN_MS = 1000.0
HOT_GROWTH_TARGET = 1.2  # hot standby: large p50 <= 1.2 * small p50
COLD_REPLAY_TARGET_RECORDS_S = 200_000.0
SETTINGS = {"standby_on": True, "standby_off": False}
SIZES = ("small", "large")


class BenchError(Exception):
    """The cluster or the client did not do what the benchmark needs."""


# The helpers borrowed from the other benchmarks raise their own BenchError.
BENCH_ERRORS = (BenchError, coordinator.BenchError, quorum.BenchError)


# ---------------------------------------------------------------------------------------------
# The Kafka client.


class KafkaConnection:
    """One connection to a Kafka listener: requests pipelined, answers matched by correlation
    id (the listener answers a connection's requests in order, but nothing here relies on it)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, asyncio.Future[Any]]] = {}
        self._lost: ConnectionError | None = None
        self._read_task = asyncio.create_task(self._read_loop())

    @classmethod
    async def open(cls, host: str, port: int, timeout_s: float) -> KafkaConnection:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        return cls(reader, writer)

    async def call(
        self, api_key: int, version: int, values: Mapping[str, Any], timeout_s: float
    ) -> Any:
        """Send one request and wait for its answer; ``ConnectionError`` or ``TimeoutError``."""
        if self._lost is not None:
            raise self._lost
        correlation_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = (api_key, version, future)
        self._writer.write(encode_request(api_key, version, correlation_id, values, CLIENT_ID))
        await self._writer.drain()
        return await asyncio.wait_for(future, timeout_s)

    async def _read_loop(self) -> None:
        try:
            while True:
                (size,) = SIZE.unpack(await self._reader.readexactly(SIZE.size))
                frame = await self._reader.readexactly(size)
                (correlation_id,) = struct.unpack_from(">i", frame)
                api_key, version, future = self._pending.pop(correlation_id)
                _, body = decode_response(api_key, version, frame)
                if not future.done():
                    future.set_result(body)
        except (OSError, asyncio.IncompleteReadError) as e:
            self._lost = ConnectionError(f"connection lost: {type(e).__name__}")
        except asyncio.CancelledError:
            self._lost = ConnectionError("connection closed")
        pending, self._pending = self._pending, {}
        for _, _, future in pending.values():
            if not future.done():
                future.set_exception(self._lost)

    async def close(self) -> None:
        self._writer.close()
        self._read_task.cancel()
        # asyncio.wait, not a suppressed await: a cancellation of the caller must get through.
        await asyncio.wait([self._read_task])
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class CoordinatorNotFound(Exception):  # noqa: N818 (a retriable answer, like Kafka's)
    """FindCoordinator answered with an error code (the message names it)."""


async def find_coordinator(
    addresses: list[tuple[str, int]], group_id: str, first: int, timeout_s: float
) -> tuple[int, str, int]:
    """(node id, host, port) of the group's coordinator, asking the nodes in turn from index
    ``first``: a dead node refuses the connection at once on loopback, the next is asked."""
    lost: Exception | None = None
    for i in range(len(addresses)):
        host, port = addresses[(first + i) % len(addresses)]
        try:
            conn = await KafkaConnection.open(host, port, timeout_s)
        except (OSError, TimeoutError) as e:
            lost = e
            continue
        try:
            response = await conn.call(
                FIND_COORDINATOR_KEY,
                FIND_COORDINATOR_VERSION,
                {"key_type": COORDINATOR_KEY_GROUP, "coordinator_keys": [group_id]},
                timeout_s,
            )
        except (ConnectionError, TimeoutError) as e:
            lost = e
            continue
        finally:
            await conn.close()
        (answer,) = response.coordinators
        if answer.error_code != Errors.NONE:
            raise CoordinatorNotFound(quorum.error_name(answer.error_code))
        return int(answer.node_id), str(answer.host), int(answer.port)
    raise ConnectionError(f"no node answered FindCoordinator (last: {lost!r})")


def offset_commit(group_id: str, topic: str, offsets: Mapping[int, int]) -> dict[str, Any]:
    """A simple group's OffsetCommit request (generation -1, no member id)."""
    return {
        "group_id": group_id,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {
                        "partition_index": partition,
                        "committed_offset": offset,
                        "committed_leader_epoch": -1,
                        "committed_metadata": "",
                    }
                    for partition, offset in offsets.items()
                ],
            }
        ],
    }


def commit_errors(response: Any) -> Counter[str]:
    return Counter(
        quorum.error_name(p.error_code)
        for t in response.topics
        for p in t.partitions
        if p.error_code != Errors.NONE
    )


@dataclass(frozen=True, slots=True)
class Commit:
    sent_at: float  # perf_counter
    answered_at: float
    node_id: int  # the coordinator that answered


@dataclass
class Committer:
    """Commits the next offset of one partition for a simple group, one at a time, from
    ``start`` to ``stop``; retries every failure after ``RETRY_BACKOFF_S`` with a new
    FindCoordinator."""

    addresses: list[tuple[str, int]]
    group_id: str
    request_timeout_s: float
    successes: list[Commit] = field(default_factory=list)
    failures: list[tuple[float, str]] = field(default_factory=list)  # (perf_counter, what)
    stopping: bool = False
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"committer-{self.group_id}")

    @property
    def stopped(self) -> bool:
        """The task ended (on its own only if it failed)."""
        return self.task is not None and self.task.done()

    async def stop(self) -> None:
        """Stop the task; raise what made it fail, if anything did."""
        assert self.task is not None
        # The flag as well as the cancellation: Python 3.11's asyncio.wait_for returns an
        # answer that arrives together with a cancellation and drops the cancellation.
        self.stopping = True
        self.task.cancel()
        await asyncio.wait([self.task])
        if not self.task.cancelled() and (error := self.task.exception()) is not None:
            raise error

    def first_success_after(self, instant: float) -> Commit | None:
        return next((c for c in self.successes if c.sent_at >= instant), None)

    def failures_after(self, instant: float) -> list[dict[str, Any]]:
        """The failures from ``instant`` on, consecutive ones of a kind as one entry: what,
        how many, and the first and last (ms after ``instant``)."""
        runs: list[dict[str, Any]] = []
        for at, what in self.failures:
            if at < instant:
                continue
            ms = round((at - instant) * 1000, 1)
            if runs and runs[-1]["what"] == what:
                runs[-1].update(count=runs[-1]["count"] + 1, last_ms=ms)
            else:
                runs.append({"what": what, "count": 1, "first_ms": ms, "last_ms": ms})
        return runs

    async def run(self) -> None:
        conn: KafkaConnection | None = None
        node_id = -1
        asked = 0  # which node FindCoordinator asks first: the next one after each failure
        offset = 0
        try:
            while not self.stopping:
                try:
                    if conn is None:
                        node_id, host, port = await find_coordinator(
                            self.addresses, self.group_id, asked, self.request_timeout_s
                        )
                        conn = await KafkaConnection.open(host, port, self.request_timeout_s)
                    sent_at = time.perf_counter()
                    response = await conn.call(
                        OFFSET_COMMIT_KEY,
                        OFFSET_COMMIT_VERSION,
                        offset_commit(self.group_id, FILL_TOPIC, {0: offset + 1}),
                        self.request_timeout_s,
                    )
                    errors = commit_errors(response)
                    if not errors:
                        answered_at = time.perf_counter()
                        self.successes.append(Commit(sent_at, answered_at, node_id))
                        offset += 1
                        # The commit pacing.
                        await asyncio.sleep(max(0.0, sent_at + COMMIT_INTERVAL_S - answered_at))
                        continue
                    what = ",".join(sorted(errors))
                except (OSError, TimeoutError, CoordinatorNotFound) as e:
                    what = str(e) if isinstance(e, CoordinatorNotFound) else type(e).__name__
                self.failures.append((time.perf_counter(), what))
                asked += 1
                if conn is not None:
                    await conn.close()
                    conn = None
                await asyncio.sleep(RETRY_BACKOFF_S)  # the client's retry backoff
        finally:
            if conn is not None:
                await conn.close()


# ---------------------------------------------------------------------------------------------
# Filling an offsets partition.


def groups_for(partition: int, num_partitions: int, prefix: str, count: int) -> list[str]:
    """The first ``count`` names ``<prefix>-<i>`` whose coordinator partition is ``partition``."""
    names = (f"{prefix}-{i}" for i in itertools.count())
    return list(
        itertools.islice((g for g in names if partition_for(g, num_partitions) == partition), count)
    )


async def fill(
    addresses: list[tuple[str, int]],
    groups: list[str],
    records: int,
    partitions: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Write ``records`` OffsetCommit records into the groups' partition: requests of
    ``partitions`` partitions each, round robin over the groups, ``FILL_IN_FLIGHT`` in flight."""
    sizes = [partitions] * (records // partitions)
    if records % partitions:
        sizes.append(records % partitions)
    _, host, port = await find_coordinator(addresses, groups[0], 0, timeout_s)
    conn = await KafkaConnection.open(host, port, timeout_s)
    requests: Iterator[tuple[int, int]] = iter(enumerate(sizes))  # shared by the workers
    written = 0
    report_every = max(records // 5, 1)
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal written
        for i, size in requests:
            group = groups[i % len(groups)]
            offset = i // len(groups) + 1
            request = offset_commit(group, FILL_TOPIC, dict.fromkeys(range(size), offset))
            response = await conn.call(OFFSET_COMMIT_KEY, OFFSET_COMMIT_VERSION, request, timeout_s)
            errors = commit_errors(response)
            if errors:
                raise BenchError(f"fill commit for {group} failed: {dict(errors)}")
            before, written = written, written + size
            if before // report_every != written // report_every:
                elapsed_s = time.perf_counter() - started
                print(
                    f"    filled {written:,}/{records:,} records "
                    f"({written / elapsed_s:,.0f} records/s)",
                    flush=True,
                )

    try:
        async with asyncio.TaskGroup() as workers:  # one failing cancels the others
            for _ in range(FILL_IN_FLIGHT):
                workers.create_task(worker())
    except* (ConnectionError, TimeoutError) as group:
        raise BenchError(f"fill: {group.exceptions[0]!r}") from None
    except* BenchError as group:
        raise group.exceptions[0] from None
    finally:
        await conn.close()
    seconds = time.perf_counter() - started
    return {
        "records": records,
        "requests": len(sizes),
        "groups": len(groups),
        "seconds": seconds,
        "records_s": records / seconds,
    }


# ---------------------------------------------------------------------------------------------
# The cluster's state, through DescribeNode.


async def describe_coordinator(
    cluster: quorum.Cluster, node_id: int, *, topics: bool = False
) -> dict[str, Any]:
    view: dict[str, Any] = await cluster.client(node_id).call(
        "DescribeNode", {"coordinator": True, "topics": topics}, quorum.DESCRIBE_TIMEOUT_S
    )
    return view


def offsets_partitions(view: dict[str, Any]) -> dict[int, dict[str, Any]]:
    topic = view["topics"].get(OFFSETS_TOPIC_NAME)
    if topic is None:
        raise quorum.NotYet(f"node {view['node_id']}'s image has no {OFFSETS_TOPIC_NAME}")
    return {int(p["partition"]): p for p in topic["partitions"]}


async def settled(cluster: quorum.Cluster) -> tuple[int, dict[int, dict[str, Any]]]:
    """Raise ``NotYet`` until every node is registered and unfenced and every offsets partition
    is on its preferred leader with every replica in its ISR; returns the active controller
    and the offsets partitions as it sees them."""
    controller = await cluster.active_controller()
    view = await cluster.describe(controller, topics=True)
    for node_id in cluster.ids:
        broker = view["brokers"].get(str(node_id))
        if broker is None or broker["fenced"]:
            raise quorum.NotYet(f"node {node_id} not registered and unfenced")
    parts = offsets_partitions(view)
    for p in parts.values():
        if p["leader"] != p["replicas"][0] or set(p["isr"]) != set(p["replicas"]):
            raise quorum.NotYet(
                f"{OFFSETS_TOPIC_NAME}-{p['partition']}: leader {p['leader']}, "
                f"replicas {p['replicas']}, ISR {p['isr']}"
            )
    return controller, parts


async def wait_settled(
    cluster: quorum.Cluster, timeout_s: float
) -> tuple[int, dict[int, dict[str, Any]]]:
    return await quorum.poll(
        lambda: settled(cluster), f"{OFFSETS_TOPIC_NAME} settled", timeout_s, READY_POLL_S
    )


async def trial_ready(cluster: quorum.Cluster, partition: int, hot: bool) -> dict[str, Any]:
    """Raise ``NotYet`` until a trial may start (see the module docstring); returns the
    partition's leader, leader epoch, the active controller and the followers' standbys."""
    controller, parts = await settled(cluster)
    state = parts[partition]
    leader = int(state["leader"])
    leader_view = await describe_coordinator(cluster, leader)
    shard = leader_view["coordinator"].get("shards", {}).get(str(partition))
    if shard != "active":
        raise quorum.NotYet(f"node {leader}'s shard {partition} is {shard}")
    standbys: dict[str, Any] = {}
    if hot:
        for node_id in state["replicas"]:
            if node_id == leader:
                continue
            sb = (await describe_coordinator(cluster, node_id))["coordinator"]["standbys"].get(
                str(partition)
            )
            if sb is None or sb["next_offset"] < sb["high_watermark"]:
                raise quorum.NotYet(f"node {node_id}'s standby of {partition}: {sb}")
            standbys[str(node_id)] = sb
    return {
        "controller": controller,
        "leader": leader,
        "leader_epoch": int(state["leader_epoch"]),
        "standbys": standbys,
    }


async def wait_trial_ready(
    cluster: quorum.Cluster, partition: int, hot: bool, timeout_s: float
) -> dict[str, Any]:
    return await quorum.poll(
        lambda: trial_ready(cluster, partition, hot),
        f"{OFFSETS_TOPIC_NAME}-{partition} ready for a trial",
        timeout_s,
        READY_POLL_S,
    )


async def failover_load(
    cluster: quorum.Cluster, node_id: int, partition: int, after_epoch: int
) -> dict[str, Any] | None:
    """The load of ``partition`` for its current leader epoch on ``node_id`` (None if that
    node's image has moved on, or its load is not listed)."""
    view = await describe_coordinator(cluster, node_id, topics=True)
    epoch = offsets_partitions(view)[partition]["leader_epoch"]
    if epoch <= after_epoch:
        return None
    for load in reversed(view["coordinator"].get("loads", [])):
        if load["partition"] == partition and load["leader_epoch"] == epoch:
            result: dict[str, Any] = load
            return result
    return None


# ---------------------------------------------------------------------------------------------
# Trials.


@dataclass(frozen=True)
class Case:
    setting: str  # a key of SETTINGS
    size: str  # one of SIZES
    partition: int
    group_id: str
    records: int  # what the fill wrote

    @property
    def key(self) -> str:
        return f"{self.setting}_{self.size}"

    @property
    def hot(self) -> bool:
        return SETTINGS[self.setting]


async def trial(
    cluster: quorum.Cluster, case: Case, number: int, args: argparse.Namespace
) -> dict[str, Any]:
    timeout_s = args.round_timeout_s
    started = time.perf_counter()
    ready = await wait_trial_ready(cluster, case.partition, case.hot, timeout_s)
    ready_ms = (time.perf_counter() - started) * 1000
    victim = ready["leader"]
    addresses = [(n.host, n.kafka_port) for n in cluster.state.nodes]
    committer = Committer(addresses, case.group_id, args.request_timeout_ms / 1000)
    committer.start()
    warmup_until = time.perf_counter() + WARMUP_S
    try:
        await coordinator.wait_until(
            lambda: (
                committer.stopped
                or (
                    sum(c.node_id == victim for c in committer.successes) >= WARMUP_COMMITS
                    and time.perf_counter() >= warmup_until
                )
            ),
            f"{WARMUP_COMMITS} commits at node {victim} over {WARMUP_S} s",
            timeout_s,
        )
        warmup_failures = len(committer.failures)
        killed_wall_ms = time.time() * 1000
        killed_at = await kill(cluster, victim)
        await coordinator.wait_until(
            lambda: committer.stopped or committer.first_success_after(killed_at) is not None,
            f"a commit for {case.group_id} after killing node {victim}",
            timeout_s,
        )
    finally:
        await committer.stop()  # raises what made the committer stop early, if anything
    first = committer.first_success_after(killed_at)
    assert first is not None
    if first.node_id == victim:
        raise BenchError(f"node {victim} answered a commit sent after its SIGKILL")
    failover_ms = (first.answered_at - killed_at) * 1000
    load = await quorum.poll(
        lambda: _load_or_not_yet(cluster, first.node_id, case.partition, ready["leader_epoch"]),
        f"the load of {case.partition} on node {first.node_id}",
        timeout_s,
        READY_POLL_S,
    )
    view = await cluster.describe(first.node_id)
    rejoin_ms = await quorum.restart_and_wait(cluster, victim, view["metadata_offset"], timeout_s)
    load_ms = load["end_ms"] - load["start_ms"]
    load_start_ms = load["start_ms"] - killed_wall_ms
    records_before = max((sb["high_watermark"] for sb in ready["standbys"].values()), default=None)
    return {
        "trial": number,
        "killed": victim,
        "killed_was_controller": victim == ready["controller"],
        "new_coordinator": first.node_id,
        "failover_ms": failover_ms,
        "warmup_failures": warmup_failures,
        "failures_after_kill": committer.failures_after(killed_at),
        "log_end_offset_before": records_before,
        "load": {
            "hot": load["hot"],
            "records": load["records"],
            "applied": load.get("applied"),
            "bytes": load["bytes"],
            "load_ms": load_ms,
            "start_after_kill_ms": load_start_ms,
        },
        # From the end of the load to the commit's answer: the commit waits for the high
        # watermark, i.e. for the remaining follower to fetch from the new leader.
        "commit_after_load_ms": failover_ms - load_start_ms - load_ms,
        "standbys_before": ready["standbys"],
        "ready_ms": ready_ms,
        "rejoin_ms": rejoin_ms,
    }


async def kill(cluster: quorum.Cluster, node_id: int) -> float:
    """SIGKILL a node; returns the ``perf_counter`` instant just before the signal.

    The signal is sent from the event loop's thread, not from a worker thread as
    ``quorum.kill`` does, so that no commit is sent between the instant and the signal."""
    node = cluster.state.node(node_id)
    assert node.pid is not None and launcher.is_alive(node.pid), f"node {node_id} is not running"
    killed_at = time.perf_counter()
    os.kill(node.pid, signal.SIGKILL)
    await asyncio.to_thread(launcher.stop_node, node, kill=True)  # waits for it and reaps it
    return killed_at


async def _load_or_not_yet(
    cluster: quorum.Cluster, node_id: int, partition: int, after_epoch: int
) -> dict[str, Any]:
    load = await failover_load(cluster, node_id, partition, after_epoch)
    if load is None:
        raise quorum.NotYet(f"no load of {partition} above epoch {after_epoch} on {node_id}")
    return load


async def run_case(cluster: quorum.Cluster, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    trials = []
    for number in range(1, args.trials + 1):
        t = await trial(cluster, case, number, args)
        trials.append(t)
        load = t["load"]
        print(
            f"    {case.key} trial {number}/{args.trials}: killed node {t['killed']}"
            f"{' (the active controller)' if t['killed_was_controller'] else ''}, node "
            f"{t['new_coordinator']} committed after {t['failover_ms']:.0f} ms "
            f"({'hot' if load['hot'] else 'cold'} load of {load['records']:,} records "
            f"({load['applied']:,} replayed) in "
            f"{load['load_ms']} ms, started {load['start_after_kill_ms']:.0f} ms after the "
            f"kill; ready {t['ready_ms'] / 1000:.1f} s, rejoin {t['rejoin_ms'] / 1000:.1f} s)",
            flush=True,
        )
    return {
        "setting": case.setting,
        "hot_standby": case.hot,
        "size": case.size,
        "partition": case.partition,
        "group_id": case.group_id,
        "fill_records": case.records,
        "trials": trials,
        **quorum.summary_ms([t["failover_ms"] for t in trials]),
    }


# ---------------------------------------------------------------------------------------------
# Clusters.


def start_cluster(
    run: coordinator.Run, name: str, nodes: int, overrides: dict[str, Any]
) -> launcher.ClusterState:
    root = run.work_dir / name
    base = quorum.free_base_port(run.rng, nodes)
    print(f"starting {nodes} node(s) ({name}: {overrides}) in {root}", flush=True)
    state = launcher.up(root, nodes, base, overrides=overrides)
    CLUSTERS.append(state)
    return state


# Every cluster started, with the pids of its nodes as restarted: stopped at the end.
CLUSTERS: list[launcher.ClusterState] = []


def stop_clusters() -> None:
    """SIGKILL every node of every cluster started (a cluster whose start fails is stopped by
    ``launcher.up`` itself)."""
    while CLUSTERS:
        launcher.down(CLUSTERS.pop(), kill=True)


async def throughput(run: coordinator.Run, state: launcher.ClusterState) -> dict[str, Any]:
    broker = coordinator.kcoord_broker(state)
    await coordinator.create_topic(
        broker, coordinator.COMMIT_TOPIC, run.args.commit_clients, run.args.round_timeout_s
    )
    return await coordinator.commit_case(broker, run, run.args.commit_clients)


async def measure_three_nodes(
    run: coordinator.Run, state: launcher.ClusterState, setting: str
) -> dict[str, Any]:
    """The failover cases of one hot standby setting, and (standby on) the 3-node throughput."""
    args = run.args
    cluster = quorum.Cluster(state)
    out: dict[str, Any] = {}
    try:
        await wait_settled(cluster, args.round_timeout_s)
        broker = coordinator.kcoord_broker(state)
        await coordinator.create_topic(
            broker, FILL_TOPIC, args.fill_partitions, args.round_timeout_s
        )
        if SETTINGS[setting]:
            print(f"  commit throughput, {args.commit_clients} clients, 3 nodes", flush=True)
            out["throughput"] = await throughput(run, state)
            print(f"    {out['throughput']['commits_s']:,.0f} commits/s", flush=True)
        controller, parts = await wait_settled(cluster, args.round_timeout_s)
        others = sorted(i for i in cluster.ids if i != controller)
        victims = {"small": others[0], "large": others[-1]}
        records_by_size = {"small": args.small_records, "large": args.large_records}
        addresses = [(n.host, n.kafka_port) for n in state.nodes]
        for size in SIZES:
            victim, records = victims[size], records_by_size[size]
            partition = min(p for p, s in parts.items() if s["replicas"][0] == victim)
            prefix = f"{run.run_id}-{setting}-{size}"
            group_id = groups_for(partition, len(parts), f"failover-{prefix}", 1)[0]
            fill_groups = groups_for(partition, len(parts), f"fill-{prefix}", args.fill_groups)
            # The fill goes to a partition with its every replica in the ISR.
            await wait_trial_ready(cluster, partition, SETTINGS[setting], args.round_timeout_s)
            print(
                f"  {setting}, {size}: filling {OFFSETS_TOPIC_NAME}-{partition} (led by node "
                f"{victim}) with {records:,} records",
                flush=True,
            )
            filled = await fill(
                addresses, fill_groups, records, args.fill_partitions, args.round_timeout_s
            )
            case = Case(setting, size, partition, group_id, records)
            out[size] = {"fill": filled, **await run_case(cluster, case, args)}
    finally:
        await cluster.pool.close_all()
    return out


async def measure_one_node(run: coordinator.Run, state: launcher.ClusterState) -> dict[str, Any]:
    cluster = quorum.Cluster(state)
    try:
        await wait_settled(cluster, run.args.round_timeout_s)
    finally:
        await cluster.pool.close_all()
    print(f"  commit throughput, {run.args.commit_clients} clients, 1 node", flush=True)
    result = await throughput(run, state)
    print(f"    {result['commits_s']:,.0f} commits/s", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Figures, targets and the table.


def build_result(run: coordinator.Run, session_timeout_ms: int, seed: int) -> dict[str, Any]:
    args, raw = run.args, run.raw
    failover = {s: {size: raw[s][size] for size in SIZES} for s in SETTINGS}
    cold_loads = [
        t["load"] for t in failover["standby_off"]["large"]["trials"] if not t["load"]["hot"]
    ]
    rates = [
        load["records"] / (load["load_ms"] / 1000) for load in cold_loads if load["load_ms"] > 0
    ]
    median_rate = statistics.median(rates) if rates else None
    cold_replay = {
        "loads": len(cold_loads),
        "samples_records_s": rates,
        "median_records_s": median_rate,
        "min_records_s": min(rates, default=None),
        "max_records_s": max(rates, default=None),
    }
    three = raw["standby_on"]["throughput"]["commits_s"]
    one = raw["one_node"]["throughput"]["commits_s"]
    p50_target_ms = session_timeout_ms + FAILOVER_MARGIN_MS
    targets: dict[str, dict[str, Any]] = {}
    for setting, sizes in failover.items():
        for size, case in sizes.items():
            targets[f"failover_{setting}_{size}_p50"] = {
                "value_ms": case["p50_ms"],
                "rule": f"< {p50_target_ms:.0f} ms (session timeout + 1 s)",
                "met": case["p50_ms"] < p50_target_ms,
            }
            targets[f"failover_{setting}_{size}_p99"] = {
                "value_ms": case["p99_ms"],
                "rule": f"< {2 * p50_target_ms:.0f} ms (2 x (session timeout + 1 s))",
                "met": case["p99_ms"] < 2 * p50_target_ms,
            }
    hot = failover["standby_on"]
    growth = hot["large"]["p50_ms"] / hot["small"]["p50_ms"]
    targets["hot_standby_large_vs_small_p50"] = {
        "value": growth,
        "rule": f"large p50 / small p50 <= {HOT_GROWTH_TARGET}",
        "met": growth <= HOT_GROWTH_TARGET,
    }
    targets["cold_replay_records_s"] = {
        "value": median_rate,
        "rule": f"median >= {COLD_REPLAY_TARGET_RECORDS_S:.0f} records/s",
        "met": median_rate is not None and median_rate >= COLD_REPLAY_TARGET_RECORDS_S,
    }
    return {
        "benchmark": "failover",
        "seed": seed,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "client": {
            "failover": "bench/failover.py's own: kcoord.node.kafka.client's codec (kio) over "
            "asyncio streams; OffsetCommit v8, FindCoordinator v4",
            "retry_backoff_ms": RETRY_BACKOFF_S * 1000,
            "throughput": f"aiokafka {aiokafka.__version__} (bench/coordinator.py commit_case)",
        },
        "session_timeout_ms": session_timeout_ms,
        "params": {
            "trials": args.trials,
            "small_records": args.small_records,
            "large_records": args.large_records,
            "fill_partitions": args.fill_partitions,
            "fill_groups": args.fill_groups,
            "throughput_clients": args.commit_clients,
            "throughput_seconds": args.commit_seconds,
            "request_timeout_ms": args.request_timeout_ms,
        },
        "failover": failover,
        "cold_replay": cold_replay,
        "throughput": {
            "clients": args.commit_clients,
            "three_nodes_commits_s": three,
            "one_node_commits_s": one,
            "ratio": three / one,
            "three_nodes": raw["standby_on"]["throughput"],
            "one_node": raw["one_node"]["throughput"],
        },
        "targets": targets,
        "targets_met": {key: t["met"] for key, t in targets.items()},
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def print_table(result: dict[str, Any]) -> None:
    print(
        "\nfailover: SIGKILL of the group's coordinator -> the group's next successful "
        f"OffsetCommit ({result['params']['trials']} trials per case)"
    )
    print(
        f"  {'hot standby':12}{'size':>6}{'log end':>11}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'loads':>11}{'replayed':>11}{'kill->load':>12}{'load ms':>9}{'load->ok':>10}"
    )
    for sizes in result["failover"].values():
        for size, case in sizes.items():
            trials = case["trials"]
            loads = [t["load"] for t in trials]
            hot = sum(load["hot"] for load in loads)
            ends = [t["log_end_offset_before"] for t in trials if t["log_end_offset_before"]]
            log_end = max(ends, default=max(load["records"] for load in loads))
            print(
                f"  {'on' if case['hot_standby'] else 'off':12}{size:>6}{log_end:>11,}"
                f"{case['p50_ms']:9.0f}{case['p99_ms']:9.0f}{case['max_ms']:9.0f}"
                f"{f'{hot} hot' if hot == len(loads) else f'{len(loads) - hot} cold':>11}"
                f"{_median([load['records'] for load in loads]):11,.0f}"
                f"{_median([load['start_after_kill_ms'] for load in loads]):12.0f}"
                f"{_median([load['load_ms'] for load in loads]):9.0f}"
                f"{_median([t['commit_after_load_ms'] for t in trials]):10.0f}"
            )
    print(
        "  log end: the partition's log end offset before a trial (the largest, from the\n"
        "  standbys; with standby off, the records of the full cold load). Medians: replayed\n"
        "  (records, by the new coordinator's load), kill->load (the load's start after the\n"
        "  kill: fencing and election), load ms, load->ok (the load's end to the commit's answer)."
    )
    controller_kills = [
        f"{case['setting']}_{case['size']} trial {t['trial']}"
        for sizes in result["failover"].values()
        for case in sizes.values()
        for t in case["trials"]
        if t["killed_was_controller"]
    ]
    if controller_kills:
        print(f"  the killed node was the active controller in: {', '.join(controller_kills)}")
    cold = result["cold_replay"]
    if cold["median_records_s"] is not None:
        print(
            f"\ncold replay of the large partition: median {cold['median_records_s']:,.0f} "
            f"records/s (min {cold['min_records_s']:,.0f}, max {cold['max_records_s']:,.0f}; "
            f"{cold['loads']} loads)"
        )
    tp = result["throughput"]
    print(
        f"\nOffsetCommit throughput, {tp['clients']} clients x "
        f"{result['params']['throughput_seconds']:.0f} s: 3 nodes "
        f"{tp['three_nodes_commits_s']:,.0f}/s, 1 node {tp['one_node_commits_s']:,.0f}/s, "
        f"ratio {tp['ratio']:.2f}"
    )
    print(f"\n  {'target':40}{'value':>12}  {'rule':44}{'met':>5}")
    for key, t in result["targets"].items():
        value = t.get("value_ms", t.get("value"))
        shown = "n/a" if value is None else f"{value:,.2f}" if value < 10 else f"{value:,.0f}"
        print(f"  {key:40}{shown:>12}  {t['rule']:44}{'yes' if t['met'] else 'NO':>5}")


# ---------------------------------------------------------------------------------------------
# Main.


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # The nodes first: with them gone, every task of the event loop being unwound ends at once.
    stop_clusters()
    sys.exit(128 + signum)  # unwinds through main's finally


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="SIGKILLs per case")
    parser.add_argument(
        "--small-records", type=int, default=1000, help="records in the small case's partition"
    )
    parser.add_argument(
        "--large-records", type=int, default=1_000_000, help="records in the large case's"
    )
    parser.add_argument(
        "--fill-partitions", type=int, default=1000, help="partitions per fill request"
    )
    parser.add_argument("--fill-groups", type=int, default=100, help="groups the fill commits for")
    parser.add_argument(
        "--throughput-clients", dest="commit_clients", type=int, default=16, help="committers"
    )
    parser.add_argument(
        "--throughput-seconds", dest="commit_seconds", type=float, default=10.0, help="per cluster"
    )
    parser.add_argument(
        "--request-timeout-ms", type=int, default=10_000, help="the committer's per request"
    )
    parser.add_argument("--round-timeout-s", type=float, default=300.0, help="deadline per wait")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the work directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results/failover.json"))
    parser.add_argument("--seed", type=int, default=None, help="ports and group names")
    args = parser.parse_args(argv)
    for flag in (
        "trials",
        "small_records",
        "large_records",
        "fill_partitions",
        "fill_groups",
        "commit_clients",
        "request_timeout_ms",
    ):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed={seed}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="kcoord-bench-failover-", dir=args.dir))
    # The throughput figure's aiokafka consumers only commit (no group membership).
    settings = coordinator.ClientSettings(session_timeout_ms=10_000, heartbeat_interval_ms=3000)
    run = coordinator.Run(args, random.Random(seed), work_dir, settings, run_id=f"{seed:x}")
    succeeded = False
    session_timeout_ms = 0
    started = time.perf_counter()
    try:
        for setting, hot in SETTINGS.items():
            state = start_cluster(run, setting, 3, {"group.coordinator.hot.standby.enable": hot})
            session_timeout_ms = load_config(
                state.nodes[0].config_path, os.environ
            ).broker_session_timeout_ms
            run.raw[setting] = asyncio.run(measure_three_nodes(run, state, setting))
            stop_clusters()
        state = start_cluster(run, "one_node", 1, {"offsets.topic.replication.factor": 1})
        run.raw["one_node"] = {"throughput": asyncio.run(measure_one_node(run, state))}
        stop_clusters()
        succeeded = True
    except (*BENCH_ERRORS, launcher.LauncherError, RpcClientError) as e:
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        stop_clusters()
        if succeeded and not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            print(
                f"work directory kept: {work_dir} (<cluster>/node-<id>/node.log)",
                file=sys.stderr,
            )
    print(f"measured in {time.perf_counter() - started:.0f} s")
    result = build_result(run, session_timeout_ms, seed)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ntargets met: {result['targets_met']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
