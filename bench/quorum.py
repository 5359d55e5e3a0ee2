"""Metadata quorum benchmark: ``make bench-quorum``.

Starts a real 3-node local cluster (``kcoord.node.launcher.up`` on a block of loopback ports
found free at run time) and measures, in one run on this machine:

- metadata commit latency and throughput: ``CreateTopics`` of one small topic (1 partition,
  replication factor 3) per call, sent straight to the active controller's RPC endpoint. The
  controller answers once the topic's records, one batch, are committed by a majority of the
  quorum and applied to its own image, so one call is one metadata commit. Sequentially over
  ``--commits`` calls (p50/p99/mean, calls/s), then from ``--concurrency`` callers (one
  connection each) sharing ``--concurrent-commits`` calls (throughput and per-call latency).
- controller failover, ``--failovers`` rounds: SIGKILL the active controller, poll the
  survivors' ``DescribeNode`` until one says it is the active controller, and send it
  ``CreateTopics`` until a topic is created (error 0). The figure is kill -> that first
  commit (target: median < 2 s); kill -> a survivor reporting itself active is shown too.
- node fencing, ``--fencings`` rounds: SIGKILL a node that is not the controller, then poll the
  controller's ``DescribeNode`` (with topics) until (a) its image shows the node fenced and
  (b) no ``__consumer_offsets`` partition is led by it. Target: both within
  ``broker.session.timeout.ms`` + 1 s (the controller fences a broker whose last heartbeat is
  older than the session timeout; the heartbeat interval and the controller's tick come on
  top). The victim is a node that leads offsets partitions when there is one, else the round
  says that (b) was not exercised.

After each failover or fencing round the killed node is restarted, and the next round starts
once it is registered again, unfenced and has replayed the metadata log up to the round's last
commit (its time is reported as ``rejoin_ms``).

Order: the fencing rounds run first, on a cluster whose only topic is ``__consumer_offsets``,
because their ``DescribeNode`` polls carry every topic and the commit phase creates hundreds.

Polls run every 20 ms until a deadline (``--round-timeout-s``), so a figure is late by at most
one poll interval plus one ``DescribeNode`` round trip. Prints a table and writes
``bench/results/quorum.json``. On a failure the cluster's data directory is kept and named
(``node-<id>/node.log`` is each node's output); every node process is killed either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from kcoord.errors import Errors
from kcoord.node import launcher
from kcoord.node.config import load_config
from kcoord.node.rpc import RpcClient, RpcClientError, RpcClientPool
from kcoord.raft.controller import OFFSETS_TOPIC_NAME

NODES = 3
POLL_INTERVAL_S = 0.02
DESCRIBE_TIMEOUT_S = 2.0
# ControllerService gives up on a proposal after 10 s; wait a little longer for its answer.
CREATE_TIMEOUT_S = 12.0
# ControllerService moves leadership back to preferred replicas every 5 s: how long a fencing
# round waits for a non-controller node to lead an offsets partition before it picks anyway.
LEADERSHIP_WAIT_S = 6.0
FAILOVER_MEDIAN_TARGET_MS = 2000.0
FENCING_MARGIN_MS = 1000.0
# The launcher's block: node i uses base + 10 * (i - 1) and the next three ports.
PORTS_PER_NODE = 4
PORT_STRIDE = 10

T = TypeVar("T")


class BenchError(Exception):
    """The cluster did not do what the benchmark needs; the message says what was seen."""


class NotYet(Exception):  # noqa: N818 (a poll's "not yet", not an error)
    """Raised by a poll's check: the condition does not hold yet (the message says why)."""


# ---------------------------------------------------------------------------------------------
# Ports, polling and figures.


def free_base_port(rng: random.Random, nodes: int = NODES) -> int:
    """A base port whose whole launcher block is free on 127.0.0.1 right now.

    Drawn below Linux's default ephemeral range (32768-60999), so that no outgoing connection
    (the nodes' own included) takes a port of the block between this check and the bind.
    """
    for _ in range(200):
        base = rng.randrange(10_000, 32_768 - PORT_STRIDE * nodes)
        ports = [base + PORT_STRIDE * i + k for i in range(nodes) for k in range(PORTS_PER_NODE)]
        if all(_port_is_free(p) for p in ports):
            return base
    raise BenchError("no free block of loopback ports found")


def _port_is_free(port: int) -> bool:
    # No SO_REUSEADDR: a port still in TIME_WAIT counts as taken, to be safe.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def poll(
    check: Callable[[], Awaitable[T]],
    what: str,
    timeout_s: float,
    interval_s: float = POLL_INTERVAL_S,
) -> T:
    """Call ``check`` every ``interval_s`` until it returns; ``NotYet`` and RPC failures retry."""
    deadline = time.monotonic() + timeout_s
    last = "nothing yet"
    while True:
        try:
            return await check()
        except NotYet as e:
            last = str(e)
        except RpcClientError as e:
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            raise BenchError(f"no {what} within {timeout_s:.0f} s; last seen: {last}")
        await asyncio.sleep(interval_s)  # the polling interval


def _nearest_rank(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)]


def summary_ms(samples_ms: list[float]) -> dict[str, Any]:
    """The raw samples (in the order taken) and p50/p99 (nearest rank), mean, min, max."""
    assert samples_ms, "no samples"
    ordered = sorted(samples_ms)
    return {
        "count": len(samples_ms),
        "samples_ms": samples_ms,
        "p50_ms": _nearest_rank(ordered, 0.50),
        "p99_ms": _nearest_rank(ordered, 0.99),
        "mean_ms": statistics.fmean(samples_ms),
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
    }


def error_name(code: int) -> str:
    try:
        return Errors(code).name
    except ValueError:
        return f"error {code}"


def offsets_leader_counts(view: dict[str, Any]) -> Counter[int]:
    """``__consumer_offsets`` partitions led per node, from a ``DescribeNode`` with topics."""
    topic = view["topics"].get(OFFSETS_TOPIC_NAME)
    if topic is None:
        raise BenchError(f"node {view['node_id']}'s image has no {OFFSETS_TOPIC_NAME}")
    return Counter(int(p["leader"]) for p in topic["partitions"])


# ---------------------------------------------------------------------------------------------
# The cluster, seen through RPC.


class Cluster:
    """RPC to every node of a running local cluster, one persistent connection each."""

    def __init__(self, state: launcher.ClusterState) -> None:
        self.state = state
        # Reconnect quickly to a restarted node (the default backoff grows to 1 s).
        self.pool = RpcClientPool(reconnect_backoff_max_ms=100)

    @property
    def ids(self) -> list[int]:
        return [n.node_id for n in self.state.nodes]

    def client(self, node_id: int) -> RpcClient:
        node = self.state.node(node_id)
        return self.pool.get(node.host, node.rpc_port)

    async def describe(self, node_id: int, *, topics: bool = False) -> dict[str, Any]:
        view: dict[str, Any] = await self.client(node_id).call(
            "DescribeNode", {"topics": topics}, DESCRIBE_TIMEOUT_S
        )
        return view

    async def try_describe(self, node_id: int) -> dict[str, Any] | None:
        try:
            return await self.describe(node_id)
        except RpcClientError:
            return None

    def raise_if_exited(self, node_ids: list[int]) -> None:
        for node_id in node_ids:
            node = self.state.node(node_id)
            if not launcher.is_alive(node.pid):
                raise BenchError(f"node {node_id} exited; see {node.log_path}")

    async def active_controller(self, among: list[int] | None = None) -> int:
        """The active controller every node of ``among`` (default: all) agrees on."""
        ids = among or self.ids
        self.raise_if_exited(ids)
        views = await asyncio.gather(*(self.describe(i) for i in ids))
        controllers = {v["controller_id"] for v in views}
        if len(controllers) != 1:
            raise NotYet(f"nodes {ids} disagree on the controller: {controllers}")
        controller = controllers.pop()
        if controller not in ids:
            raise NotYet(f"controller {controller} is not one of {ids}")
        if not views[ids.index(controller)]["is_active_controller"]:
            raise NotYet(f"node {controller} leads the quorum but is not active yet")
        return int(controller)

    async def wait_controller(self, timeout_s: float) -> int:
        return await poll(self.active_controller, "agreed active controller", timeout_s)

    async def rejoined(self, node_id: int, min_offset: int) -> None:
        """Raise ``NotYet`` until the node is registered, unfenced and caught up."""
        controller = await self.active_controller()
        active = await self.describe(controller)
        view = await self.describe(node_id)
        broker = active["brokers"].get(str(node_id))
        if (
            view["broker_epoch"] is None
            or broker is None
            or broker["epoch"] != view["broker_epoch"]
        ):
            raise NotYet(f"node {node_id} not registered with controller {controller} yet")
        if broker["fenced"] or view["fenced"]:
            raise NotYet(f"node {node_id} still fenced")
        if view["metadata_offset"] < min_offset:
            raise NotYet(f"node {node_id} at metadata offset {view['metadata_offset']}")


async def create_topic(client: RpcClient, name: str) -> dict[str, Any]:
    """``CreateTopics`` of one topic (1 partition, RF 3); returns that topic's result."""
    payload = {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 3}]}
    reply = await client.call("CreateTopics", payload, CREATE_TIMEOUT_S)
    result: dict[str, Any] = reply["topics"][0]
    return result


def raise_if_failed(result: dict[str, Any]) -> None:
    if result["error"] != 0:
        raise BenchError(
            f"CreateTopics {result['name']}: {error_name(result['error'])}: {result['message']}"
        )


# ---------------------------------------------------------------------------------------------
# 1. Metadata commits.


async def measure_commits(
    cluster: Cluster, commits: int, concurrency: int, concurrent_commits: int, timeout_s: float
) -> dict[str, Any]:
    controller = await cluster.wait_controller(timeout_s)
    offset_before = (await cluster.describe(controller))["metadata_offset"]
    client = cluster.client(controller)  # connected by the describes above

    sequential_ms: list[float] = []
    started = time.perf_counter()
    for i in range(commits):
        t0 = time.perf_counter()
        raise_if_failed(await create_topic(client, f"bench-seq-{i}"))
        sequential_ms.append((time.perf_counter() - t0) * 1000)
    sequential_s = time.perf_counter() - started

    node = cluster.state.node(controller)
    callers = [RpcClient(node.host, node.rpc_port) for _ in range(concurrency)]
    concurrent_ms: list[float] = []
    indexes: Iterator[int] = iter(range(concurrent_commits))  # shared: each call takes the next

    async def caller(c: RpcClient) -> None:
        for i in indexes:
            t0 = time.perf_counter()
            raise_if_failed(await create_topic(c, f"bench-concurrent-{i}"))
            concurrent_ms.append((time.perf_counter() - t0) * 1000)

    try:
        # Connect every caller before the clock starts.
        await asyncio.gather(*(c.call("DescribeNode", {}, DESCRIBE_TIMEOUT_S) for c in callers))
        started = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in callers))
        concurrent_s = time.perf_counter() - started
    finally:
        for c in callers:
            await c.close()
    offset_after = (await cluster.describe(controller))["metadata_offset"]
    if await cluster.active_controller() != controller:
        raise BenchError(f"the controller changed from {controller} during the commit phase")
    return {
        "controller": controller,
        # Every call is one committed batch; the controller's own duties may add a few.
        "batches_committed": offset_after - offset_before,
        "sequential": {
            "calls": commits,
            "seconds": sequential_s,
            "calls_s": commits / sequential_s,
            **summary_ms(sequential_ms),
        },
        "concurrent": {
            "callers": concurrency,
            "calls": concurrent_commits,
            "seconds": concurrent_s,
            "calls_s": concurrent_commits / concurrent_s,
            **summary_ms(concurrent_ms),
        },
    }


# ---------------------------------------------------------------------------------------------
# 2. Controller failover.


async def kill(cluster: Cluster, node_id: int) -> float:
    """SIGKILL a node; returns the ``perf_counter`` instant just before the signal."""
    killed_at = time.perf_counter()
    await asyncio.to_thread(launcher.stop_node, cluster.state.node(node_id), kill=True)
    return killed_at


async def restart_and_wait(
    cluster: Cluster, node_id: int, min_offset: int, timeout_s: float
) -> float:
    """Restart a killed node; returns ms until it is registered, unfenced and caught up."""
    started = time.perf_counter()
    launcher.start_node(cluster.state.node(node_id))
    await poll(
        lambda: cluster.rejoined(node_id, min_offset), f"rejoin of node {node_id}", timeout_s
    )
    return (time.perf_counter() - started) * 1000


async def failover_round(cluster: Cluster, round_no: int, timeout_s: float) -> dict[str, Any]:
    controller = await cluster.wait_controller(timeout_s)
    survivors = [i for i in cluster.ids if i != controller]
    killed_at = await kill(cluster, controller)
    active_ms: float | None = None
    attempts = 0

    async def committed() -> int:
        nonlocal active_ms, attempts
        cluster.raise_if_exited(survivors)
        views = await asyncio.gather(*(cluster.try_describe(i) for i in survivors))
        active = [
            i for i, v in zip(survivors, views, strict=True) if v and v["is_active_controller"]
        ]
        if not active:
            seen = {i: v and v["controller_id"] for i, v in zip(survivors, views, strict=True)}
            raise NotYet(f"no survivor active yet (controller ids seen: {seen})")
        if active_ms is None:
            active_ms = (time.perf_counter() - killed_at) * 1000
        attempts += 1
        # A fresh name per attempt: an attempt that timed out here may still have committed.
        result = await create_topic(
            cluster.client(active[0]), f"bench-failover-{round_no}-{attempts}"
        )
        if result["error"] != 0:
            raise NotYet(f"CreateTopics at node {active[0]}: {error_name(result['error'])}")
        return active[0]

    new_controller = await poll(committed, f"commit after killing node {controller}", timeout_s)
    commit_ms = (time.perf_counter() - killed_at) * 1000
    assert active_ms is not None
    offset = (await cluster.describe(new_controller))["metadata_offset"]
    rejoin_ms = await restart_and_wait(cluster, controller, offset, timeout_s)
    return {
        "round": round_no,
        "killed": controller,
        "new_controller": new_controller,
        "active_ms": active_ms,
        "commit_ms": commit_ms,
        "create_attempts": attempts,
        "rejoin_ms": rejoin_ms,
    }


# ---------------------------------------------------------------------------------------------
# 3. Node fencing.


async def fencing_round(
    cluster: Cluster, round_no: int, rng: random.Random, timeout_s: float
) -> dict[str, Any]:
    controller = await cluster.wait_controller(timeout_s)
    candidates = [i for i in cluster.ids if i != controller]
    # Prefer a victim that leads offsets partitions, so that (b) moves something; a restarted
    # node gets leadership back only through preferred leader election.
    deadline = time.monotonic() + LEADERSHIP_WAIT_S
    while True:
        counts = offsets_leader_counts(await cluster.describe(controller, topics=True))
        leading = [i for i in candidates if counts[i] > 0]
        if leading or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_INTERVAL_S)  # the polling interval
    victim = rng.choice(leading or candidates)
    led_before = counts[victim]

    killed_at = await kill(cluster, victim)
    fenced_ms: float | None = None
    moved_ms: float | None = None

    async def fenced_and_moved() -> dict[str, Any]:
        nonlocal fenced_ms, moved_ms
        view = await cluster.describe(controller, topics=True)
        elapsed_ms = (time.perf_counter() - killed_at) * 1000
        if not view["is_active_controller"]:
            raise BenchError(f"node {controller} stopped being the controller mid-round")
        if fenced_ms is None and view["brokers"][str(victim)]["fenced"]:
            fenced_ms = elapsed_ms
        if moved_ms is None and offsets_leader_counts(view)[victim] == 0:
            moved_ms = elapsed_ms
        if fenced_ms is None or moved_ms is None:
            raise NotYet(f"node {victim}: fenced after {fenced_ms} ms, moved after {moved_ms} ms")
        return view

    view = await poll(fenced_and_moved, f"fencing of node {victim}", timeout_s)
    assert fenced_ms is not None and moved_ms is not None
    after = offsets_leader_counts(view)
    rejoin_ms = await restart_and_wait(cluster, victim, view["metadata_offset"], timeout_s)
    return {
        "round": round_no,
        "controller": controller,
        "killed": victim,
        "offsets_partitions_led_before": led_before,
        "leaders_moved_exercised": led_before > 0,
        "offsets_leaders_after": {str(k): v for k, v in sorted(after.items())},
        "fenced_ms": fenced_ms,
        "leaders_moved_ms": moved_ms,
        "rejoin_ms": rejoin_ms,
    }


# ---------------------------------------------------------------------------------------------
# The run.


async def run(
    state: launcher.ClusterState, args: argparse.Namespace, rng: random.Random
) -> dict[str, Any]:
    cluster = Cluster(state)
    try:
        fencing = []
        for i in range(1, args.fencings + 1):
            r = await fencing_round(cluster, i, rng, args.round_timeout_s)
            print(
                f"  fencing {i}: killed node {r['killed']} "
                f"(led {r['offsets_partitions_led_before']}), fenced {r['fenced_ms']:.0f} ms, "
                f"leaders moved {r['leaders_moved_ms']:.0f} ms",
                flush=True,
            )
            fencing.append(r)
        failover = []
        for i in range(1, args.failovers + 1):
            r = await failover_round(cluster, i, args.round_timeout_s)
            print(
                f"  failover {i}: killed controller {r['killed']}, node {r['new_controller']} "
                f"active {r['active_ms']:.0f} ms, committed {r['commit_ms']:.0f} ms",
                flush=True,
            )
            failover.append(r)
        commits = await measure_commits(
            cluster, args.commits, args.concurrency, args.concurrent_commits, args.round_timeout_s
        )
    finally:
        await cluster.pool.close_all()
    return {"commit": commits, "failover_rounds": failover, "fencing_rounds": fencing}


def build_result(
    measured: dict[str, Any], session_timeout_ms: int, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    failover_rounds = measured["failover_rounds"]
    fencing_rounds = measured["fencing_rounds"]
    commit_ms = [r["commit_ms"] for r in failover_rounds]
    failover = {
        "rounds": failover_rounds,
        "commit": summary_ms(commit_ms),
        "active": summary_ms([r["active_ms"] for r in failover_rounds]),
        "median_ms": statistics.median(commit_ms),
    }
    # A round whose victim led no offsets partition moved nothing: no leaders_moved sample.
    moved_ms = [r["leaders_moved_ms"] for r in fencing_rounds if r["leaders_moved_exercised"]]
    fencing = {
        "rounds": fencing_rounds,
        "fenced": summary_ms([r["fenced_ms"] for r in fencing_rounds]),
        "leaders_moved": summary_ms(moved_ms) if moved_ms else None,
        "rounds_moving_leaders": len(moved_ms),
    }
    fencing_target_ms = session_timeout_ms + FENCING_MARGIN_MS
    fencing_max_ms = max([fencing["fenced"]["max_ms"], *moved_ms])
    targets = {
        "failover_median_ms": failover["median_ms"],
        "failover_median_target_ms": FAILOVER_MEDIAN_TARGET_MS,
        "fencing_max_ms": fencing_max_ms,
        "fencing_target_ms": fencing_target_ms,
    }
    met = {
        "failover": failover["median_ms"] < FAILOVER_MEDIAN_TARGET_MS,
        "fencing": fencing_max_ms < fencing_target_ms,
    }
    return {
        "benchmark": "quorum",
        "seed": seed,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "nodes": NODES,
        "session_timeout_ms": session_timeout_ms,
        "poll_interval_ms": POLL_INTERVAL_S * 1000,
        "params": {
            "commits": args.commits,
            "concurrency": args.concurrency,
            "concurrent_commits": args.concurrent_commits,
            "failovers": args.failovers,
            "fencings": args.fencings,
        },
        "commit": measured["commit"],
        "controller_failover": failover,
        "fencing": fencing,
        "targets": targets,
        "targets_met": met,
    }


def print_table(result: dict[str, Any]) -> None:
    commit = result["commit"]
    print(
        f"\nmetadata commits (CreateTopics, 1 partition, RF 3) at controller {commit['controller']}"
    )
    print(f"  {'':24}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'max ms':>9}{'calls/s':>10}")
    for label, case in (
        (f"sequential x {commit['sequential']['calls']}", commit["sequential"]),
        (
            f"{commit['concurrent']['callers']} callers x {commit['concurrent']['calls']}",
            commit["concurrent"],
        ),
    ):
        print(
            f"  {label:24}{case['p50_ms']:9.1f}{case['p99_ms']:9.1f}{case['mean_ms']:9.1f}"
            f"{case['max_ms']:9.1f}{case['calls_s']:10.1f}"
        )
    print(f"  batches committed during the phase: {commit['batches_committed']}")

    failover = result["controller_failover"]
    print("\ncontroller failover (SIGKILL the active controller)")
    print(
        f"  {'round':>5}{'killed':>8}{'new':>5}{'active ms':>11}{'commit ms':>11}{'rejoin ms':>11}"
    )
    for r in failover["rounds"]:
        print(
            f"  {r['round']:5}{r['killed']:8}{r['new_controller']:5}{r['active_ms']:11.0f}"
            f"{r['commit_ms']:11.0f}{r['rejoin_ms']:11.0f}"
        )
    targets = result["targets"]
    print(
        f"  median kill -> commit {failover['median_ms']:.0f} ms "
        f"(target < {targets['failover_median_target_ms']:.0f} ms)"
    )

    fencing = result["fencing"]
    print("\nnode fencing (SIGKILL a node that is not the controller)")
    print(
        f"  {'round':>5}{'killed':>8}{'led':>5}{'fenced ms':>11}{'moved ms':>10}{'rejoin ms':>11}"
    )
    for r in fencing["rounds"]:
        moved = f"{r['leaders_moved_ms']:10.0f}" if r["leaders_moved_exercised"] else f"{'n/a':>10}"
        print(
            f"  {r['round']:5}{r['killed']:8}{r['offsets_partitions_led_before']:5}"
            f"{r['fenced_ms']:11.0f}{moved}{r['rejoin_ms']:11.0f}"
        )
    print(
        f"  max {targets['fencing_max_ms']:.0f} ms (target < {targets['fencing_target_ms']:.0f} "
        f"ms = session timeout {result['session_timeout_ms']} ms + 1 s); rounds that moved "
        f"leaders: {fencing['rounds_moving_leaders']} of {len(fencing['rounds'])}"
    )


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)  # unwinds through main's finally, which stops the nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=300, help="sequential CreateTopics calls")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent callers")
    parser.add_argument(
        "--concurrent-commits", type=int, default=300, help="calls shared by the callers"
    )
    parser.add_argument("--failovers", type=int, default=5, help="controller failover rounds")
    parser.add_argument("--fencings", type=int, default=3, help="node fencing rounds")
    parser.add_argument("--round-timeout-s", type=float, default=60.0, help="deadline per wait")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the cluster directory")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results/quorum.json"))
    parser.add_argument("--seed", type=int, default=None, help="ports and fencing victims")
    args = parser.parse_args(argv)
    for flag in ("commits", "concurrency", "concurrent_commits", "failovers", "fencings"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print(f"seed={seed}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="kcoord-bench-quorum-", dir=args.dir))
    state: launcher.ClusterState | None = None
    succeeded = False
    try:
        base = free_base_port(rng)
        last_port = base + PORT_STRIDE * (NODES - 1) + PORTS_PER_NODE - 1
        print(f"starting {NODES} nodes in {root}, ports {base}..{last_port}")
        started = time.perf_counter()
        state = launcher.up(root, NODES, base)
        session_timeout_ms = load_config(
            state.nodes[0].config_path, os.environ
        ).broker_session_timeout_ms
        print(f"cluster ready in {time.perf_counter() - started:.1f} s", flush=True)
        measured = asyncio.run(run(state, args, rng))
        succeeded = True
    except (BenchError, launcher.LauncherError, RpcClientError) as e:
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if state is not None:
            launcher.down(state, kill=True)
        if succeeded and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"cluster directory kept: {root} (node-<id>/node.log)", file=sys.stderr)
    result = build_result(measured, session_timeout_ms, seed, args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\ntargets met: {result['targets_met']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
