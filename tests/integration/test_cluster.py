"""A real 3-node cluster: controller election and failover, fencing, restarts, balance."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kcoord.node import launcher
from kcoord.raft.controller import OFFSETS_TOPIC_NAME
from kcoord.storage.manager import CLEAN_SHUTDOWN_FILE
from tests.integration.cluster import LocalCluster, free_base_port, wait_for
from tests.unit.node.kafka.wire import WireClient

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 3000
METADATA = 3


def partitions(view: dict[str, Any], topic: str = OFFSETS_TOPIC_NAME) -> dict[int, dict[str, Any]]:
    return {p["partition"]: p for p in view["topics"][topic]["partitions"]}


def test_leaders_balanced_and_controller_failover_and_restart(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        controller = wait_for(cluster.controller_id, "an active controller")
        view = cluster.describe(controller, topics=True)
        offsets = partitions(view)
        assert len(offsets) == 50
        assert all(
            len(p["replicas"]) == 3 and sorted(p["isr"]) == [1, 2, 3] for p in offsets.values()
        )
        counts = [sum(1 for p in offsets.values() if p["leader"] == n) for n in (1, 2, 3)]
        assert max(counts) - min(counts) <= 1, counts

        # SIGKILL the active controller: another node becomes active and commits records.
        before = view["metadata_offset"]
        cluster.kill(controller)
        survivors = [n for n in (1, 2, 3) if n != controller]
        new_controller = wait_for(lambda: cluster.controller_id(survivors), "a new controller")
        assert new_controller != controller
        wait_for(
            lambda: all(cluster.describe(n)["metadata_offset"] > before for n in survivors),
            "new records committed by the new controller",
        )
        # The dead controller is fenced by the new one, and its partitions move.
        wait_for(
            lambda: cluster.describe(new_controller)["brokers"][str(controller)]["fenced"],
            "the old controller to be fenced",
        )
        moved = partitions(cluster.describe(new_controller, topics=True))
        assert all(p["leader"] != controller for p in moved.values())

        # Restart it: it replays its journal, catches up and is unfenced again.
        cluster.start(controller)

        def caught_up() -> bool:
            active = cluster.describe(new_controller)
            restarted = cluster.describe(controller)
            return (
                restarted["metadata_offset"] >= before
                and not active["brokers"][str(controller)]["fenced"]
                and restarted["cluster_id"] == active["cluster_id"]
            )

        wait_for(caught_up, "the restarted node to catch up and be unfenced")


def test_node_failure_is_fenced_and_full_restart_keeps_metadata(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        controller = wait_for(cluster.controller_id, "an active controller")
        victim = next(n for n in (1, 2, 3) if n != controller)
        before = partitions(cluster.describe(controller, topics=True))
        led = {i: p for i, p in before.items() if p["leader"] == victim}
        assert led, "every node leads some offsets partitions after bootstrap"

        killed_at = time.monotonic()
        cluster.kill(victim)
        wait_for(
            lambda: cluster.describe(controller)["brokers"][str(victim)]["fenced"],
            "the killed node to be fenced",
        )
        fenced_after_s = time.monotonic() - killed_at
        # Fenced no sooner than the session timeout (its last heartbeat was at most one
        # interval before the kill).
        assert fenced_after_s >= (SESSION_TIMEOUT_MS - 600) / 1000, fenced_after_s

        after = partitions(cluster.describe(controller, topics=True))
        for i, old in led.items():
            new = after[i]
            assert new["leader"] != victim
            assert new["leader"] in old["isr"], (i, old, new)
            assert new["leader_epoch"] > old["leader_epoch"], (i, old, new)
            assert victim not in new["isr"]

        # Full-cluster SIGKILL and restart: every topic, partition and epoch is kept.
        cluster.start(victim)
        wait_for(
            lambda: not cluster.describe(controller)["brokers"][str(victim)]["fenced"],
            "the restarted node to be unfenced",
        )
        snapshot = cluster.describe(controller, topics=True)["topics"]
        for n in (1, 2, 3):
            cluster.kill(n)
        for n in (1, 2, 3):
            cluster.start(n)
        new_controller = wait_for(cluster.controller_id, "a controller after the full restart")
        restored = cluster.describe(new_controller, topics=True)["topics"]
        assert set(restored) == set(snapshot)
        for name, topic in snapshot.items():
            assert restored[name]["topic_id"] == topic["topic_id"]
            old_parts = {p["partition"]: p for p in topic["partitions"]}
            new_parts = {p["partition"]: p for p in restored[name]["partitions"]}
            assert set(new_parts) == set(old_parts)
            for i, old in old_parts.items():
                assert new_parts[i]["replicas"] == old["replicas"]
                assert new_parts[i]["leader_epoch"] >= old["leader_epoch"]
                assert new_parts[i]["partition_epoch"] >= old["partition_epoch"]


def test_a_clean_stop_hands_over_its_leaderships_and_the_controller_before_exiting(
    tmp_path: Path,
) -> None:
    """SIGTERM: a controlled shutdown fences the node and moves every leadership it held to the
    other ISR members, and the active controller hands its Raft leadership on, before the
    process exits. The broker session timeout is two minutes here, so nothing but the node
    itself could have fenced it within the deadline."""
    with LocalCluster(tmp_path, overrides={"broker.session.timeout.ms": 120_000}) as cluster:
        controller = wait_for(cluster.controller_id, "an active controller")
        wait_for(
            lambda: not any(b["fenced"] for b in cluster.describe(controller)["brokers"].values()),
            "every broker unfenced",
        )
        before = partitions(cluster.describe(controller, topics=True))
        led = {i for i, p in before.items() if p["leader"] == controller}
        assert led

        launcher.stop_node(cluster.node(controller))  # SIGTERM, waits for the exit
        survivors = [n for n in (1, 2, 3) if n != controller]
        successor = wait_for(lambda: cluster.controller_id(survivors), "a new controller", 30)
        wait_for(
            lambda: cluster.describe(successor)["brokers"][str(controller)]["fenced"],
            "the stopped node fenced by its own controlled shutdown",
            30,
        )
        after = partitions(cluster.describe(successor, topics=True))
        for i in led:
            assert after[i]["leader"] in survivors, (i, before[i], after[i])
            assert after[i]["leader_epoch"] > before[i]["leader_epoch"]
        stopped_log = cluster.node(controller).log_path.read_text()
        assert "controlled shutdown done" in stopped_log
        assert "controller leadership handed on" in stopped_log


def first_metadata(node: launcher.NodeProcess, deadline_s: float) -> dict[int, int]:
    """The first Metadata answer of the node's Kafka listener: broker id -> Kafka port."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with WireClient(node.host, node.kafka_port, timeout_s=5.0) as c:
                answer = c.call(METADATA, 12, {"topics": None, "allow_auto_topic_creation": False})
            return {int(b.node_id): int(b.port) for b in answer.brokers}
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.005)  # the listener is not open yet: try again at once


def test_a_node_restarted_on_new_ports_serves_clients_only_once_it_knows_its_new_address(
    tmp_path: Path,
) -> None:
    """After a restart on new ports the metadata log still holds every broker's previous
    registration, unfenced. A node opens its Kafka listener only once the controller says it
    has replayed its new registration (Kafka's ``initialCatchUpFuture``), so its very first
    Metadata answer names it at its new port, or not at all while its image still has it
    fenced (the controller unfences it after that answer, and Metadata lists unfenced brokers
    only, as Kafka's ``getAliveBrokerNodes``), never at the previous run's port; and once the
    launcher calls the cluster ready, every node names every broker at its new port. Before,
    the listener opened at once and a client bootstrapped there was told only of the previous
    run's ports."""
    old = launcher.up(tmp_path, 3, free_base_port(3))
    launcher.down(old, kill=True)
    base = free_base_port(3)
    while base == old.nodes[0].kafka_port:
        base = free_base_port(3)
    new = launcher.plan(tmp_path, 3, base)
    ports = {n.node_id: n.kafka_port for n in new.nodes}
    assert ports != {n.node_id: n.kafka_port for n in old.nodes}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        starting = pool.submit(launcher.up, tmp_path, 3, base)
        try:
            first = {n.node_id: first_metadata(n, 60.0) for n in new.nodes}
            assert [n.kafka_port for n in starting.result().nodes] == list(ports.values())
            wait_for(
                lambda: all(first_metadata(n, 5.0) == ports for n in new.nodes),
                "every node to name every broker at its new port",
            )
        finally:
            with contextlib.suppress(Exception):
                launcher.down(starting.result(), kill=True)
    for n in new.nodes:
        assert first[n.node_id].get(n.node_id, n.kafka_port) == n.kafka_port, (n.node_id, first)


def readyz(node: launcher.NodeProcess) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{node.host}:{node.admin_port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_node_that_cannot_catch_up_serves_no_client_says_why_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """One node of three restarted alone has no quorum, so no controller to register with: its
    Kafka port refuses connections while /readyz names what it waits for, and a SIGTERM in
    that wait still stops it cleanly."""
    with LocalCluster(tmp_path) as cluster:
        for n in (1, 2, 3):
            cluster.kill(n)
        cluster.start(1)
        node = cluster.node(1)
        status, body = wait_for(lambda: readyz(node), "node 1's admin listener")
        assert status == 503, body
        assert "not registered with the controller" in body["reasons"], body
        # The port is bound but not listening: refused.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((node.host, node.kafka_port), timeout=5).close()
        pid = node.pid
        assert pid is not None
        started = time.monotonic()
        launcher.stop_node(node)  # SIGTERM; SIGKILL only after the launcher's grace
        assert time.monotonic() - started < launcher.STOP_TIMEOUT_S, "SIGTERM did not stop it"
        # The first run was SIGKILLed: this line is the waiting node's clean stop.
        log = node.log_path.read_text()
        assert "node 1 stopped" in log, log[-2000:]


def test_a_sighup_stops_a_node_cleanly(tmp_path: Path) -> None:
    """A node run in a terminal that closes gets SIGHUP: it stops as on SIGTERM (Kafka's
    LoggingSignalHandler takes TERM, INT and HUP), its data directory marked clean, where
    Python's default action ended it on the spot. (The node inherits this process's SIGHUP
    disposition: under nohup, ignored, which the node keeps; so it is the default here.)"""
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with LocalCluster(tmp_path, nodes=1) as cluster:
            signal.signal(signal.SIGHUP, inherited)  # the node has started with the default
            node = cluster.node(1)
            wait_for(lambda: readyz(node)[0] == 200, "node 1 ready")
            marker = Path(node.directory) / "data" / CLEAN_SHUTDOWN_FILE
            assert not marker.exists()
            assert node.pid is not None
            os.kill(node.pid, signal.SIGHUP)
            wait_for(lambda: not launcher.is_alive(node.pid), "node 1 to stop on SIGHUP")
            log = node.log_path.read_text()
            assert "node 1 stopped" in log, log[-2000:]
            assert marker.exists()
    finally:
        signal.signal(signal.SIGHUP, inherited)


def test_a_node_whose_kafka_port_is_taken_fails_before_it_registers_and_stops(
    tmp_path: Path,
) -> None:
    """The Kafka port was bound last, after the broker had registered and been unfenced (and
    made a leader): a taken port then ended the process like a crash, skipping the hand-over
    and the stop. It is bound before the broker registers now, and a failed start stops."""
    with LocalCluster(tmp_path) as cluster:
        wait_for(lambda: cluster.controller_id() is not None, "an active controller")
        cluster.kill(3)
        node = cluster.node(3)

        def fenced_epoch() -> int | None:
            controller = cluster.controller_id([1, 2])
            if controller is None:
                return None
            broker = cluster.describe(controller)["brokers"].get("3")
            return None if broker is None or not broker["fenced"] else int(broker["epoch"])

        epoch = wait_for(fenced_epoch, "node 3 fenced")
        with socket.create_server((node.host, node.kafka_port)):
            cluster.start(3)
            wait_for(lambda: not launcher.is_alive(node.pid), "node 3 to give up")
        log = node.log_path.read_text()
        assert "failed to start" in log and "node 3 stopped" in log, log[-3000:]
        # It never registered again: the controller still has its old, fenced incarnation.
        assert fenced_epoch() == epoch
        cluster.start(3)  # the port free again, it starts
        wait_for(
            lambda: (
                cluster.describe(cluster.controller_id() or 1)["brokers"]["3"]["fenced"] is False
            ),
            "node 3 back and unfenced",
        )
