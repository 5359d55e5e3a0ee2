"""``kcoord cluster up`` in the foreground (what ``make up`` runs): ready, then Ctrl-C stops all;
and a kept cluster restarted with ``cluster up``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcoord.node import launcher
from tests.integration.cluster import free_base_port

pytestmark = pytest.mark.integration


def _kcoord_out(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "kcoord.node.cli", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout


def _kcoord(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kcoord.node.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _cluster_up(base: int, data_dir: Path, nodes: int = 3) -> subprocess.Popen[str]:
    """``kcoord cluster up`` of ``nodes`` nodes in the foreground, its output piped."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kcoord.node.cli",
            "cluster",
            "up",
            "--nodes",
            str(nodes),
            "--base-port",
            str(base),
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _until_running(proc: subprocess.Popen[str]) -> str:
    """The output of a foreground ``cluster up`` until it says it runs."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "running in the foreground" in line:
            return "".join(lines)
    pytest.fail("cluster up ended before it was ready:\n" + "".join(lines))


@contextlib.contextmanager
def _leaving_nothing_running(proc: subprocess.Popen[str], data_dir: Path) -> Iterator[list[int]]:
    """Yields a list for the node pids the test saw; on the way out, after the test's own
    checks, the launcher if still running, the nodes its state file names and those pids are
    killed: the nodes run in sessions of their own and outlive the launcher, so a launcher
    that exits without stopping them (the failure these tests look for) left them running."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        if proc.poll() is None:
            proc.kill()
        _kcoord("cluster", "down", "--kill", "--data-dir", str(data_dir))
        for pid in pids:
            if launcher.is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_foreground_cluster_up_and_ctrl_c(tmp_path: Path) -> None:
    base = free_base_port(3)
    with _cluster_up(base, tmp_path) as proc, _leaving_nothing_running(proc, tmp_path) as pids:
        output = _until_running(proc)
        assert f"bootstrap servers: 127.0.0.1:{base},127.0.0.1:{base + 10}" in output
        state = json.loads((tmp_path / launcher.STATE_FILE).read_text())
        pids.extend(n["pid"] for n in state["nodes"])
        assert all(launcher.is_alive(p) for p in pids)
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "kcoord.node.cli",
                "cluster",
                "status",
                "--json",
                "--data-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(status.stdout)
        roles = sorted(n["role"] for n in report["nodes"])
        assert roles == ["broker", "broker", "controller"], report
        controller = next(n["node_id"] for n in report["nodes"] if n["role"] == "controller")
        # kafka-metadata-quorum.sh's views, through a follower's Kafka listener.
        follower = next(n for n in report["nodes"] if n["role"] == "broker")
        summary = _kcoord_out("quorum", "describe", "--bootstrap-server", follower["kafka"])
        fields = dict(line.split(":", 1) for line in summary.splitlines())
        assert int(fields["LeaderId"]) == controller
        assert fields["CurrentVoters"].strip() == "[1,2,3]"
        assert int(fields["HighWatermark"]) > 0
        rows = _kcoord_out(
            "quorum", "describe", "--bootstrap-server", follower["kafka"], "--replication"
        ).splitlines()
        assert rows[0].split() == [
            "NodeId",
            "LogEndOffset",
            "Lag",
            "LastFetchTimestamp",
            "LastCaughtUpTimestamp",
            "Status",
        ]
        statuses = {int(r.split()[0]): r.split()[-1] for r in rows[1:]}
        assert statuses == {n: "Leader" if n == controller else "Follower" for n in (1, 2, 3)}
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "stopped" in rest
        for pid in pids:
            assert not launcher.is_alive(pid), f"node process {pid} still running"
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_ctrl_c_stops_a_node_restarted_from_another_shell(tmp_path: Path) -> None:
    """``stop-node 2`` and ``start-node 2`` while ``make up`` runs: Ctrl-C stopped the nodes by
    the pids it started them with, and the restarted node 2 ran on, holding its ports and its
    data directory's lock (the next ``cluster up`` failed on it)."""
    base = free_base_port(3)
    with _cluster_up(base, tmp_path) as proc, _leaving_nothing_running(proc, tmp_path) as pids:
        _until_running(proc)
        state = json.loads((tmp_path / launcher.STATE_FILE).read_text())
        pids.extend(n["pid"] for n in state["nodes"])
        _kcoord_out("cluster", "stop-node", "2", "--data-dir", str(tmp_path))
        _kcoord_out("cluster", "start-node", "2", "--data-dir", str(tmp_path))
        state = json.loads((tmp_path / launcher.STATE_FILE).read_text())
        restarted = next(n["pid"] for n in state["nodes"] if n["node_id"] == 2)
        pids.append(restarted)
        assert restarted not in pids[:-1] and launcher.is_alive(restarted)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert not [p for p in pids if launcher.is_alive(p)], rest


def test_a_foreground_cluster_up_ends_when_cluster_down_stops_it_from_elsewhere(
    tmp_path: Path,
) -> None:
    """``make up`` in one shell, ``make down`` in another: the first one returns."""
    base = free_base_port(1)
    with (
        _cluster_up(base, tmp_path, nodes=1) as proc,
        _leaving_nothing_running(proc, tmp_path),
    ):
        _until_running(proc)
        _kcoord_out("cluster", "down", "--data-dir", str(tmp_path))
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "every node has stopped" in rest


def test_a_hangup_stops_a_foreground_cluster_as_ctrl_c_does(tmp_path: Path) -> None:
    """A closed terminal or a dropped ssh session sends SIGHUP: the launcher died of it and its
    nodes, in sessions of their own, ran on unmanaged (the next ``cluster up`` refused to
    start over them)."""
    base = free_base_port(1)
    with (
        _cluster_up(base, tmp_path, nodes=1) as proc,
        _leaving_nothing_running(proc, tmp_path) as pids,
    ):
        _until_running(proc)
        state = json.loads((tmp_path / launcher.STATE_FILE).read_text())
        pids.extend(n["pid"] for n in state["nodes"])
        proc.send_signal(signal.SIGHUP)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert not [p for p in pids if launcher.is_alive(p)], rest


def test_a_kept_cluster_restarts_as_it_was_and_keeps_its_voters(tmp_path: Path) -> None:
    """``cluster up`` on a kept data dir takes its node count and ports; another node count is
    refused (every node is a voter and the voters are fixed) instead of rewriting the voter
    set of nodes whose metadata log another set wrote."""
    base = free_base_port(1)
    data = str(tmp_path / "c")
    try:
        first = _kcoord(
            "cluster",
            "up",
            "--detach",
            "--nodes",
            "1",
            "--base-port",
            str(base),
            "--data-dir",
            data,
        )
        assert first.returncode == 0, first.stderr
        assert _kcoord("cluster", "down", "--data-dir", data).returncode == 0
        refused = _kcoord("cluster", "up", "--detach", "--nodes", "3", "--data-dir", data)
        assert refused.returncode == 1
        assert "holds a 1-node cluster; start it with --nodes 1" in refused.stderr
        again = _kcoord("cluster", "up", "--detach", "--data-dir", data)
        assert again.returncode == 0, again.stderr
        assert f"bootstrap servers: 127.0.0.1:{base}\n" in again.stdout
    finally:
        _kcoord("cluster", "down", "--data-dir", data)


def test_a_sigterm_while_cluster_up_waits_for_readiness_stops_the_nodes(tmp_path: Path) -> None:
    """The signal handlers were installed only once the cluster was ready: a SIGTERM in the
    wait killed the launcher alone, and its nodes, in sessions of their own, ran on."""
    base = free_base_port(3)
    state_file = tmp_path / launcher.STATE_FILE
    with _cluster_up(base, tmp_path) as proc, _leaving_nothing_running(proc, tmp_path) as pids:
        deadline = time.monotonic() + 60
        while not pids and time.monotonic() < deadline:
            if state_file.exists():
                with contextlib.suppress(ValueError):  # caught mid-write
                    pids.extend(n["pid"] for n in json.loads(state_file.read_text())["nodes"])
            time.sleep(0.01)  # polling for the launcher to have started its nodes
        assert pids, "the launcher never saved its nodes"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        # Interrupted in the wait (130), or just ready and stopped as after Ctrl-C (0):
        # either way no node is left running.
        left = [p for p in pids if launcher.is_alive(p)]
        assert proc.returncode in (0, 130), output
        print(f"cluster up exited {proc.returncode}: {output[-300:]}")
        assert not left, output
