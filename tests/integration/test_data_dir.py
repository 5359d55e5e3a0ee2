"""A node's data directory is its own (Kafka's ``.lock`` and ``meta.properties``), checked on
real node processes: a second process on a running node's directory, a restart under another
node id, one configured for another cluster, and one with no cluster id at all, all exit 1
with Kafka's message and leave the directory as it was; the node then restarts on it as
before."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcoord.node import launcher
from kcoord.node.config import render_toml
from kcoord.storage.meta_properties import read_meta_properties
from tests.integration.cluster import DEADLINE_S, LocalCluster, free_base_port

pytestmark = pytest.mark.integration


def _run_node(
    tmp_path: Path, name: str, values: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """``kcoord node`` with this config, run to its exit (these starts fail before serving)."""
    config = tmp_path / f"{name}.toml"
    config.write_text(render_toml(values))
    return subprocess.run(
        [sys.executable, "-m", "kcoord.node.cli", "node", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


def _one_node(base: int, data: Path) -> dict[str, Any]:
    """The config of a one-voter node on the ports from ``base``, its data in ``data``."""
    return {
        "node.id": 1,
        "cluster.id": "kcoord-test",
        "listeners": f"127.0.0.1:{base}",
        "rpc.listener": f"127.0.0.1:{base + 1}",
        "quorum.listener": f"127.0.0.1:{base + 2}",
        "admin.listener": f"127.0.0.1:{base + 3}",
        "controller.quorum.voters": f"1@127.0.0.1:{base + 2}",
        "data.dir": str(data),
    }


def _contents(data: Path) -> list[str]:
    return sorted(p.name for p in data.iterdir() if p.is_dir())


def test_another_process_node_id_or_cluster_is_refused(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=1) as cluster:
        node = cluster.node(1)
        data = Path(node.directory) / "data"
        assert cluster.state is not None and cluster.state.cluster_id
        cluster_id = cluster.state.cluster_id
        meta = read_meta_properties(data)
        assert meta == {"version": "1", "node.id": "1", "cluster.id": cluster_id}
        assert cluster.describe(1)["cluster_id"] == cluster_id
        base = free_base_port(1)
        values = _one_node(base, data)
        # A second process given the running node's directory (a copied config).
        second = _run_node(tmp_path, "second", values)
        assert second.returncode == 1, second.stderr
        assert f"kcoord: Failed to acquire lock on file .lock in {data}." in second.stderr
        assert cluster.describe(1)["node_id"] == 1  # the first one serves on
        before = _contents(data)
        assert "__consumer_offsets-0" in before
        launcher.stop_node(node)

        # Restarted under another node id: every log would have been a stray, deleted.
        renamed = _run_node(
            tmp_path,
            "renamed",
            {**values, "node.id": 2, "controller.quorum.voters": f"2@127.0.0.1:{base + 2}"},
        )
        assert renamed.returncode == 1, renamed.stderr
        assert "Stored node id 1 doesn't match previous node id 2" in renamed.stderr
        # Configured for another cluster: its journal would take over that cluster's quorum.
        other = _run_node(tmp_path, "other", {**values, "cluster.id": "another-cluster"})
        assert other.returncode == 1, other.stderr
        assert f"Expected another-cluster, but read {cluster_id}" in other.stderr
        assert _contents(data) == before
        assert read_meta_properties(data) == meta

        # The node itself starts again on it, as it was.
        cluster.start(1)
        cluster.wait_ready()
        assert cluster.describe(1)["cluster_id"] == cluster_id


def test_a_node_without_a_cluster_id_does_not_start(tmp_path: Path) -> None:
    """No cluster.id configured and none recorded: Kafka's broker does not start on an
    unformatted directory, and the quorum needs the id to refuse another cluster's voters.
    Nothing is written to the directory."""
    values = _one_node(free_base_port(1), tmp_path / "data")
    del values["cluster.id"]
    result = _run_node(tmp_path, "unformatted", values)
    assert result.returncode == 1, result.stderr
    assert "No cluster id for" in result.stderr and "configure cluster.id" in result.stderr
    assert read_meta_properties(tmp_path / "data") is None


def test_a_data_dir_that_cannot_be_made_fails_with_a_message(tmp_path: Path) -> None:
    """An I/O error at start (here the data directory's parent is a file) ends the process with
    exit code 1 and one line naming it, after the log's details (a traceback was all)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = _run_node(tmp_path, "blocked", _one_node(free_base_port(1), blocker / "data"))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kcoord: the node stopped: ") and "Not a directory" in last, last


def test_a_taken_quorum_port_fails_the_start(tmp_path: Path) -> None:
    """pysyncobj retried a bind that failed for ever: the node ran, never joined the quorum and
    never served. As with its Kafka and RPC ports (and as Kafka does), it exits 1 naming it."""
    base = free_base_port(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 2))
        taken.listen(1)
        result = _run_node(tmp_path, "taken", _one_node(base, tmp_path / "data"))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"cannot listen on the quorum listener 127.0.0.1:{base + 2}" in last, last
