"""A real local cluster for integration tests: node processes on loopback, always stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcoord.node import launcher
from tests.portpick import free_base_port

# free_base_port is re-exported: the integration tests take it from here with LocalCluster.
__all__ = ["DEADLINE_S", "LocalCluster", "free_base_port", "wait_for"]

DEADLINE_S = 60.0


def wait_for(condition: Callable[[], Any], what: str, deadline_s: float = DEADLINE_S) -> Any:
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = condition()
        except Exception as e:  # a node being restarted does not answer
            last = e
        else:
            if last:
                return last
        time.sleep(0.05)  # polling interval
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}; last: {last!r}")


class LocalCluster:
    def __init__(self, root: Path, nodes: int = 3, overrides: dict[str, Any] | None = None):
        self.root = root
        self.size = nodes
        self.overrides = overrides or {}
        self.state: launcher.ClusterState | None = None

    def __enter__(self) -> LocalCluster:
        self.state = launcher.up(
            self.root, self.size, free_base_port(self.size), overrides=self.overrides
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.state is not None:
            for n in self.state.nodes:
                launcher.stop_node(n, kill=True)
        if exc[0] is not None:
            self.dump_logs()

    def dump_logs(self, lines: int = 40) -> None:
        print(self.log_tails(lines))

    def log_tails(self, lines: int = 40) -> str:
        """The last ``lines`` of every node's log, for a failure message: pytest keeps only the
        last three runs' temporary directories, so a CI failure's logs are soon gone."""
        assert self.state is not None
        parts = []
        for n in self.state.nodes:
            try:
                tail = n.log_path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"----- node {n.node_id} log tail -----")
            parts.extend(tail)
        return "\n".join(parts)

    def node(self, node_id: int) -> launcher.NodeProcess:
        assert self.state is not None
        return self.state.node(node_id)

    def describe(self, node_id: int, topics: bool = False) -> dict[str, Any]:
        n = self.node(node_id)
        from kcoord.node.rpc_sync import call_sync

        result: dict[str, Any] = call_sync(
            n.host, n.rpc_port, "DescribeNode", {"topics": topics}, 2.0
        )
        return result

    def alive_ids(self) -> list[int]:
        assert self.state is not None
        return [n.node_id for n in self.state.nodes if launcher.is_alive(n.pid)]

    def controller_id(self, among: list[int] | None = None) -> int | None:
        """The active controller all live nodes agree on, or None."""
        ids = among or self.alive_ids()
        views = [self.describe(i) for i in ids]
        controllers = {v["controller_id"] for v in views}
        if len(controllers) != 1:
            return None
        active = next(iter(controllers))
        if active is None or active not in ids:
            return None
        return active if self.describe(active)["is_active_controller"] else None

    def kill(self, node_id: int) -> None:
        launcher.stop_node(self.node(node_id), kill=True)

    def start(self, node_id: int) -> None:
        launcher.start_node(self.node(node_id))

    def wait_ready(self) -> None:
        """Wait until the cluster is as ``up`` left it: a controller, and every node registered
        with this run's epoch, unfenced and serving clients."""
        assert self.state is not None
        launcher.wait_ready(self.state, DEADLINE_S)

    def revive(self) -> None:
        """Start every node that is down and wait until the cluster is ready again: a test that
        stopped a node and failed before starting it again left a module's cluster without a
        quorum majority for the next tests, and one that started it again without waiting left
        a node refusing connections to the next test's client (kafka-python's admin client gives
        up on the first refused connection)."""
        assert self.state is not None
        for n in self.state.nodes:
            if not launcher.is_alive(n.pid):
                self.start(n.node_id)
        self.wait_ready()
