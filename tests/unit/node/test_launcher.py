"""The launcher's readiness rule (``cluster up`` and every cluster test start from it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcoord.node import cli, launcher


def _state() -> launcher.ClusterState:
    nodes = [
        launcher.NodeProcess(i, "127.0.0.1", 9000 + i, 9100 + i, 9200 + i, 9300 + i, f"/n{i}")
        for i in (1, 2, 3)
    ]
    return launcher.ClusterState("/unused", nodes)


def _view(node_id: int, offsets_topic: bool) -> dict[str, Any]:
    return {
        "controller_id": 3,
        "is_active_controller": node_id == 3,
        "brokers": {str(i): {"fenced": False, "epoch": 10 + i} for i in (1, 2, 3)},
        "broker_epoch": 10 + node_id,
        "serving": True,
        "offsets_topic_created": offsets_topic,
    }


def test_ready_waits_for_the_offsets_topic_in_every_nodes_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The controller's image has the topic; node 1 is still creating its logs for the batch.
    images = {1: False, 2: True, 3: True}
    monkeypatch.setattr(
        launcher, "describe_node", lambda n, *a, **k: _view(n.node_id, images[n.node_id])
    )
    ok, why = launcher.cluster_ready(_state())
    assert not ok
    assert why == "__consumer_offsets not in the image of nodes [1] yet"

    images[1] = True
    assert launcher.cluster_ready(_state()) == (True, "ready")


def test_ready_only_when_the_nodes_started_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another cluster holding the ports answered for the nodes just started (still starting,
    then failing to bind): "cluster ready" was printed and ``cluster up`` exited 0 over nodes
    that died. A node must answer with the pid the launcher started."""
    state = _state()
    for n in state.nodes:
        n.pid = 4000 + n.node_id
    others = {1: 4001, 2: 5002, 3: 4003}
    monkeypatch.setattr(
        launcher,
        "describe_node",
        lambda n, *a, **k: {**_view(n.node_id, True), "pid": others[n.node_id]},
    )
    ok, why = launcher.cluster_ready(state)
    assert not ok
    assert why == (
        "node 2's RPC port 9102 is answered by another process (pid 5002, not 4002): are these "
        "ports in use?"
    )
    others[2] = 4002
    assert launcher.cluster_ready(state) == (True, "ready")


def test_without_a_controller_readiness_says_what_each_voter_sees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def leaderless(node: launcher.NodeProcess, *args: Any, **kwargs: Any) -> dict[str, Any]:
        linked = {1: [2], 2: [1], 3: []}[node.node_id]
        view = _view(node.node_id, True)
        return {**view, "controller_id": None, "controller_epoch": 4, "quorum_connected": linked}

    monkeypatch.setattr(launcher, "describe_node", leaderless)
    ok, why = launcher.cluster_ready(_state())
    assert not ok
    assert why == (
        "no agreed active controller yet (node 1: leader None, epoch 4, connected to voters "
        "[2]; node 2: leader None, epoch 4, connected to voters [1]; node 3: leader None, "
        "epoch 4, connected to voters [])"
    )


def test_a_pid_is_this_nodes_only_if_it_runs_this_nodes_config(tmp_path: Path) -> None:
    """A dead node's pid reused by another cluster's node (the chaos lab, parallel tests) was
    taken for it: ``cluster down`` stopped the other cluster's node."""
    mine, other = tmp_path / "a" / "node.toml", tmp_path / "b" / "node.toml"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # A stand-in that says when it runs (its command line is its own only after the
            # exec) and lives until its stdin closes.
            "import sys; print('up', flush=True); sys.stdin.read()",
            "-m",
            "kcoord.node.cli",
            "node",
            "--config",
            str(other),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        assert launcher.is_alive(proc.pid)
        assert launcher.is_alive(proc.pid, other)
        assert not launcher.is_alive(proc.pid, mine)
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_a_failed_up_leaves_no_pid_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pids were saved before the wait for readiness; when it failed the nodes were
    stopped, but the saved state still named them, for a later process to reuse."""
    started: list[int] = []

    def fake_start(node: launcher.NodeProcess) -> None:
        node.pid = 10_000_000 + node.node_id  # no such process
        started.append(node.node_id)

    def not_ready(state: launcher.ClusterState, *_: object) -> None:
        raise launcher.LauncherError("cluster not ready")

    monkeypatch.setattr(launcher, "start_node", fake_start)
    monkeypatch.setattr(launcher, "wait_ready", not_ready)
    with pytest.raises(launcher.LauncherError):
        launcher.up(tmp_path, 3, 30_000)
    assert started == [1, 2, 3]
    saved = launcher.ClusterState.load(tmp_path)
    assert [n.pid for n in saved.nodes] == [None, None, None]


def test_an_interrupted_up_stops_the_nodes_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cluster up``'s signal handler sets a flag that ``up`` polls while it waits: the
    KeyboardInterrupt the handler raised landed once in a weakref callback, where Python
    prints and drops it, and the launcher went on waiting, its nodes running."""
    stopped: list[int] = []

    def fake_start(node: launcher.NodeProcess) -> None:
        node.pid = 10_000_000 + node.node_id  # no such process

    monkeypatch.setattr(launcher, "start_node", fake_start)
    monkeypatch.setattr(launcher, "stop_node", lambda node, kill: stopped.append(node.node_id))
    with pytest.raises(KeyboardInterrupt):
        launcher.up(tmp_path, 3, 30_000, interrupted=lambda: True)
    assert stopped == [1, 2, 3]


def test_a_second_up_while_one_starts_the_cluster_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ``cluster up`` at once both found no node running and each started a full set; the
    second's state file then named its nodes (which failed on the data directories' locks)
    over the first's live ones, left running unmanaged."""
    monkeypatch.setattr(launcher, "start_node", lambda node: pytest.fail("started a node"))
    refused = pytest.raises(launcher.LauncherError, match="another 'kcoord cluster up'")
    with launcher.starting_lock(tmp_path), refused:
        launcher.up(tmp_path, 3, 30_000)
    assert not (tmp_path / launcher.STATE_FILE).exists()
    # The command says so before it says it starts.
    with launcher.starting_lock(tmp_path):
        assert cli.main(["cluster", "up", "--detach", "--data-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "kcoord: starting" not in out + err and "another 'kcoord cluster up'" in err


def test_cluster_up_refuses_a_running_cluster_before_it_says_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cluster up`` over a running cluster printed "starting 3 nodes" and then refused;
    it refuses first, naming the command that stops it, and starts nothing."""
    nodes = [
        launcher.NodeProcess(i, "127.0.0.1", 9000 + i, 9100 + i, 9200 + i, 9300 + i, f"/n{i}")
        for i in (1, 2, 3)
    ]
    launcher.ClusterState(str(tmp_path), nodes).save()
    monkeypatch.setattr(launcher, "is_alive", lambda pid, config_path=None: True)
    monkeypatch.setattr(launcher, "start_node", lambda node: pytest.fail("started a node"))
    assert cli.main(["cluster", "up", "--detach", "--data-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "starting" not in out + err
    assert "already running" in err and "'kcoord cluster down'" in err


def test_a_pid_another_user_holds_is_not_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a reboot a saved pid may be another user's process: os.kill(pid, 0) raised
    PermissionError out of every cluster command. (review helper-208)"""

    def denied(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", denied)
    assert not launcher.is_alive(10_000_001)


def test_stopping_a_node_that_exits_meanwhile_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = iter([True, False])
    monkeypatch.setattr(launcher, "is_alive", lambda pid, config_path=None: next(checks, False))

    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(os, "kill", gone)
    node = launcher.NodeProcess(1, "127.0.0.1", 1, 2, 3, 4, str(tmp_path), pid=10_000_001)
    launcher.stop_node(node)
    assert node.pid is None


def test_start_node_says_when_the_node_exits_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``start-node`` exited 0 for a node that died at once on a bad config; it says so, with
    the exit code and the log, and saves no pid. Starting a running node is no error, as
    stopping a stopped one is not. (review helper-208)"""
    directory = tmp_path / "node-1"
    directory.mkdir()
    (directory / "node.toml").write_text("this is not toml = = =\n")
    nodes = [launcher.NodeProcess(1, "127.0.0.1", 1, 2, 3, 4, str(directory))]
    launcher.ClusterState(str(tmp_path), nodes).save()
    assert cli.main(["cluster", "start-node", "1", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "node 1 exited with code 2" in err and str(directory / "node.log") in err
    assert launcher.ClusterState.load(tmp_path).nodes[0].pid is None


def test_the_nodes_get_the_cluster_wide_kcoord_variables_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``KCOORD_*`` variable in the launcher's shell went to every node, over its
    node.toml: ``KCOORD_NODE_ID=1`` made node 2 a second node 1, and one naming no setting
    stopped every node with "unknown config key". A setting of the whole cluster still goes
    to every node (the admin token guards each); one of each node alone is refused before
    anything starts; one naming no setting is left out, and ``cluster up`` says so."""
    monkeypatch.setenv("KCOORD_ADMIN_API_TOKEN", "s3cret")
    monkeypatch.setenv("KCOORD_REWRITE", "1")
    given: list[dict[str, str]] = []

    class FakePopen:
        pid = 10_000_001

        def __init__(self, args: list[str], **kwargs: Any) -> None:
            given.append(kwargs["env"])

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    node = launcher.NodeProcess(2, "127.0.0.1", 1, 2, 3, 4, str(tmp_path / "node-2"))
    launcher.start_node(node)
    launcher._CHILDREN.pop(FakePopen.pid, None)
    assert given[0]["KCOORD_ADMIN_API_TOKEN"] == "s3cret"
    assert "KCOORD_REWRITE" not in given[0]
    assert given[0]["PATH"] == os.environ["PATH"]

    def refused(*args: object, **kwargs: object) -> launcher.ClusterState:
        raise launcher.LauncherError("not started here")

    monkeypatch.setattr(launcher, "up", refused)
    data_dir = str(tmp_path / "c")
    assert cli.main(["cluster", "up", "--detach", "--data-dir", data_dir]) == 1
    err = capsys.readouterr().err
    assert "not passed to the nodes (no such setting): KCOORD_REWRITE" in err

    monkeypatch.setenv("KCOORD_NODE_ID", "1")
    assert cli.main(["cluster", "up", "--detach", "--data-dir", data_dir]) == 1
    out, err = capsys.readouterr()
    assert "KCOORD_NODE_ID would set node.id of every node" in err
    assert "starting" not in out + err
    with pytest.raises(launcher.LauncherError, match="KCOORD_NODE_ID"):
        launcher.start_node(node)
    assert len(given) == 1


@pytest.mark.parametrize("content", ["", "{", '{"data_dir": "x"}', '{"data_dir": 1, "nodes": 2}'])
def test_a_damaged_cluster_state_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    """An empty or garbled cluster.json ended every cluster command in a traceback."""
    (tmp_path / launcher.STATE_FILE).write_text(content)
    for command in ("down", "status"):
        assert cli.main(["cluster", command, "--data-dir", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert "does not read" in err and "Traceback" not in err


def test_a_wrong_node_count_is_refused_before_anything_is_said_or_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "cluster"
    assert cli.main(["cluster", "up", "--nodes", "2", "--data-dir", str(data_dir)]) == 1
    out, err = capsys.readouterr()
    assert "starting" not in out + err and "--nodes must be 1, 3 or 5" in err
    assert not data_dir.exists()


def test_a_command_keeps_what_another_saved_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command read the state file once and wrote all of it back at its end: a
    ``start-node 2`` saved while a ``stop-node 1`` ran lost node 2's pid, and that node ran
    on unmanaged (``cluster down`` passed it by). A command now records its own node in the
    file as it is, under a lock (found by a review)."""
    nodes = [
        launcher.NodeProcess(i, "127.0.0.1", 1, 2, 3, 4, str(tmp_path / f"n{i}"), pid=None)
        for i in (1, 2)
    ]
    launcher.ClusterState(str(tmp_path), nodes).save()

    def stop_while_node_2_starts(node: launcher.NodeProcess, *, kill: bool = False) -> None:
        other = launcher.ClusterState.load(tmp_path)
        other.node(2).pid = 4242  # another command's start-node 2
        other.save()
        node.pid = None

    monkeypatch.setattr(launcher, "stop_node", stop_while_node_2_starts)
    assert cli.main(["cluster", "stop-node", "1", "--data-dir", str(tmp_path)]) == 0
    saved = launcher.ClusterState.load(tmp_path)
    assert [n.pid for n in saved.nodes] == [None, 4242]


def test_a_down_keeps_a_node_another_command_started_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cluster down`` saved every node it had read as stopped: a ``start-node 1`` that
    saved its pid while the down stopped node 2 was written over, and node 1 ran on
    unmanaged (review helper-281)."""
    nodes = [
        launcher.NodeProcess(i, "127.0.0.1", 1, 2, 3, 4, str(tmp_path / f"n{i}"), pid=None)
        for i in (1, 2)
    ]
    nodes[1].pid = 4343
    launcher.ClusterState(str(tmp_path), nodes).save()
    alive = {4343}
    monkeypatch.setattr(launcher, "is_alive", lambda pid, config_path=None: pid in alive)

    def stop_while_node_1_starts(node: launcher.NodeProcess, *, kill: bool = False) -> None:
        other = launcher.ClusterState.load(tmp_path)
        other.node(1).pid = 4242  # another command's start-node 1
        other.save()
        alive.add(4242)
        alive.discard(node.pid)
        node.pid = None

    monkeypatch.setattr(launcher, "stop_node", stop_while_node_1_starts)
    cli.main(["cluster", "down", "--data-dir", str(tmp_path)])
    saved = launcher.ClusterState.load(tmp_path)
    assert [n.pid for n in saved.nodes] == [4242, None]


def test_a_node_that_never_leaves_after_sigkill_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process stuck in the kernel outlives SIGKILL: the stop waited for it for ever."""
    monkeypatch.setattr(launcher, "is_alive", lambda pid, config_path=None: True)
    monkeypatch.setattr(os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(launcher, "KILL_TIMEOUT_S", 0.05)
    node = launcher.NodeProcess(1, "127.0.0.1", 1, 2, 3, 4, str(tmp_path), pid=10_000_001)
    with pytest.raises(launcher.LauncherError, match="has not exited"):
        launcher.stop_node(node, timeout_s=0.05)
    assert node.pid == 10_000_001  # still there: recorded


def test_a_live_node_that_does_not_answer_is_unresponsive_not_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launcher, "is_alive", lambda pid, config_path=None: pid == 2)
    monkeypatch.setattr(launcher, "describe_node", lambda node, timeout_s=2.0: None)
    state = _state()
    state.node(2).pid = 2
    roles = [n["role"] for n in launcher.status(state)["nodes"]]
    assert roles == ["down", "unresponsive", "down"]


def test_one_node_that_will_not_go_does_not_leave_the_others_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cluster down`` (and a failed ``up``, and the chaos runner) stopped at the first node
    that raised, and the nodes after it ran on."""
    stopped: list[int] = []

    def stop(node: launcher.NodeProcess, *, kill: bool = False) -> None:
        if node.node_id == 1:
            raise launcher.LauncherError("node 1 (pid 7) has not exited 10 s after SIGKILL")
        stopped.append(node.node_id)
        node.pid = None

    monkeypatch.setattr(launcher, "stop_node", stop)
    nodes = [
        launcher.NodeProcess(i, "127.0.0.1", 1, 2, 3, 4, str(tmp_path / f"n{i}"), pid=i)
        for i in (1, 2, 3)
    ]
    state = launcher.ClusterState(str(tmp_path), nodes)
    state.save()
    with pytest.raises(launcher.LauncherError, match="node 1"):
        launcher.down(state)
    assert stopped == [2, 3]
    assert [n.pid for n in launcher.ClusterState.load(tmp_path).nodes] == [1, None, None]
