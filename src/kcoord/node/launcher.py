"""``kcoord cluster ...``: a local cluster of node processes on one machine.

``cluster up`` writes one config per node under ``<data dir>/node-<id>/node.toml`` (data in
``node-<id>/data``, output in ``node-<id>/node.log``), starts the processes, waits until a
controller is active and every node is registered and unfenced, and prints the bootstrap
servers. In the foreground it then waits for Ctrl-C (SIGINT) or SIGTERM and stops every node;
with ``--detach`` it returns and leaves ``<data dir>/cluster.json`` for ``status``,
``stop-node``, ``start-node`` and ``down``.

Ports: node ``i`` (from 1) uses ``base + 10 * (i - 1)`` for Kafka and the next three for RPC,
quorum and admin HTTP: with the default base 9092, node 1 is 9092/9093/9094/9095, node 2
9102/..., node 3 9112/....
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from kcoord.node.config import ENV_PREFIX, config_key_of, render_toml
from kcoord.node.controller_service import new_topic_id
from kcoord.node.rpc_sync import call_sync
from kcoord.storage.meta_properties import DataDirError, read_meta_properties

STATE_FILE = "cluster.json"
# Held while a command reads and rewrites the state file (``state_lock``).
STATE_LOCK_FILE = "cluster.json.lock"
# Held by the ``cluster up`` starting a cluster from a data directory (``starting_lock``).
UP_LOCK_FILE = "cluster-up.lock"
# How long a node SIGKILLed may take to leave the process table (one stuck in the kernel
# may never).
KILL_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class LauncherError(Exception):
    pass


@dataclass(slots=True)
class NodeProcess:
    node_id: int
    host: str
    kafka_port: int
    rpc_port: int
    quorum_port: int
    admin_port: int
    directory: str
    pid: int | None = None
    # The lab (DESIGN section 9) runs each node with its own group id, so iptables' owner
    # match can drop exactly one node's packets inside the lab's network namespace.
    group: int | None = None

    @property
    def config_path(self) -> Path:
        return Path(self.directory) / "node.toml"

    @property
    def log_path(self) -> Path:
        return Path(self.directory) / "node.log"

    def addresses(self) -> dict[str, str]:
        return {
            "kafka": f"{self.host}:{self.kafka_port}",
            "rpc": f"{self.host}:{self.rpc_port}",
            "quorum": f"{self.host}:{self.quorum_port}",
            "admin": f"{self.host}:{self.admin_port}",
        }


@dataclass(slots=True)
class ClusterState:
    data_dir: str
    nodes: list[NodeProcess]
    # Every node's cluster.id (Kafka's `kafka-storage.sh format --cluster-id`): chosen when
    # the cluster is created; None for a cluster an older kcoord created without one.
    cluster_id: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{n.host}:{n.kafka_port}" for n in self.nodes)

    def node(self, node_id: int) -> NodeProcess:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise LauncherError(f"no node {node_id} in this cluster")

    def save_nodes(self, nodes: Iterable[NodeProcess]) -> None:
        """Record ``nodes``' pids in the state file as it is now: another command of this
        cluster (a ``start-node`` of another node) may have saved since this one read it,
        and writing back the whole state as read lost that node's pid, leaving it running
        unmanaged (``cluster down`` passed it by; the next ``up`` started a second copy).
        Nor is a live node the file names under another pid written over: another command
        started it since this one read the file (a ``start-node 1`` while a ``down`` was
        stopping node 2, or the winner of two ``start-node 1`` at once; review helper-281)."""
        data_dir = Path(self.data_dir)
        with state_lock(data_dir):
            try:
                current = ClusterState.load(data_dir)
            except LauncherError:
                current = self  # none, or not readable: this command's, whole
            by_id = {n.node_id: n for n in current.nodes}
            for n in nodes:
                held = by_id.get(n.node_id)
                if held is None:
                    continue  # one the file no longer names
                if held.pid not in (None, n.pid) and is_alive(held.pid, held.config_path):
                    continue
                held.pid = n.pid
            current._write()

    def save(self) -> None:
        """Write the whole state (a cluster just planned and started)."""
        with state_lock(Path(self.data_dir)):
            self._write()

    def _write(self) -> None:
        path = Path(self.data_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "data_dir": self.data_dir,
                    "cluster_id": self.cluster_id,
                    "nodes": [asdict(n) for n in self.nodes],
                },
                indent=2,
            )
        )
        os.replace(tmp, path)

    @classmethod
    def load(cls, data_dir: Path) -> ClusterState:
        path = data_dir / STATE_FILE
        if not path.exists():
            raise LauncherError(f"no cluster state in {data_dir} (start one with 'cluster up')")
        try:
            raw = json.loads(path.read_text())
            return cls(
                raw["data_dir"], [NodeProcess(**n) for n in raw["nodes"]], raw.get("cluster_id")
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LauncherError(
                f"the cluster state {path} does not read ({e!r}): stop any node still running "
                "from it (its node.toml is in the command line of 'kcoord.node.cli node'), "
                "then remove the file"
            ) from e


@contextmanager
def state_lock(data_dir: Path) -> Iterator[None]:
    """An exclusive lock on the cluster's state file, for one read-and-rewrite of it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / STATE_LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released as the file closes
        yield


@contextmanager
def starting_lock(data_dir: Path) -> Iterator[None]:
    """The one ``cluster up`` starting a cluster from ``data_dir``; another at the same time is
    refused. Both found no node running and started a full set: the second's nodes failed on
    the data directories' locks, and its state file named them over the first's live nodes,
    which then ran unmanaged (review helper-281)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / UP_LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released as the file closes
        except BlockingIOError:
            raise LauncherError(
                f"another 'kcoord cluster up' is starting a cluster from {data_dir}"
            ) from None
        yield


def refuse_if_starting(data_dir: Path) -> None:
    """Raise ``LauncherError`` if another ``cluster up`` is starting a cluster from
    ``data_dir`` now (``starting_lock``): a command says so before it says it starts. Makes
    nothing: none can be without the lock file."""
    if (data_dir / UP_LOCK_FILE).exists():
        with starting_lock(data_dir):
            pass


def plan(
    data_dir: Path,
    nodes: int,
    base_port: int,
    *,
    hosts: list[str] | None = None,
    groups: list[int] | None = None,
) -> ClusterState:
    """Node ``i`` binds to ``hosts[i - 1]`` (default 127.0.0.1) and runs as ``groups[i - 1]``."""
    _check_node_count(nodes)
    return ClusterState(
        str(data_dir.resolve()),
        [
            NodeProcess(
                node_id=i,
                host=hosts[i - 1] if hosts else "127.0.0.1",
                group=groups[i - 1] if groups else None,
                kafka_port=base_port + 10 * (i - 1),
                rpc_port=base_port + 10 * (i - 1) + 1,
                quorum_port=base_port + 10 * (i - 1) + 2,
                admin_port=base_port + 10 * (i - 1) + 3,
                directory=str((data_dir / f"node-{i}").resolve()),
            )
            for i in range(1, nodes + 1)
        ],
    )


def render_config(
    state: ClusterState,
    node: NodeProcess,
    overrides: dict[str, Any],
    node_overrides: dict[str, Any] | None = None,
) -> str:
    voters = ",".join(f"{n.node_id}@{n.host}:{n.quorum_port}" for n in state.nodes)
    values: dict[str, Any] = {
        "node.id": node.node_id,
        "listeners": f"{node.host}:{node.kafka_port}",
        "rpc.listener": f"{node.host}:{node.rpc_port}",
        "quorum.listener": f"{node.host}:{node.quorum_port}",
        "admin.listener": f"{node.host}:{node.admin_port}",
        "controller.quorum.voters": voters,
        "data.dir": str(Path(node.directory) / "data"),
        **({"cluster.id": state.cluster_id} if state.cluster_id is not None else {}),
        **overrides,
        **(node_overrides or {}),
    }
    return "# Written by 'kcoord cluster up'.\n" + render_toml(values)


# Processes started by this launcher process, kept so they are reaped (not left as zombies or
# garbage-collected while running); a later CLI invocation finds nodes by pid instead.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_EXIT_CODES: dict[int, int] = {}  # of children seen gone


def _check_node_count(nodes: int) -> None:
    if nodes not in (1, 3, 5):
        raise LauncherError("--nodes must be 1, 3 or 5 (a Raft quorum of voters)")


# What each node's node.toml sets for that node alone (render_config), with the advertised
# forms and the other names of the data directory: one value from the environment would be
# every node's.
PER_NODE_KEYS: Final = frozenset(
    {
        "node.id",
        "listeners",
        "advertised.listeners",
        "rpc.listener",
        "advertised.rpc.listener",
        "quorum.listener",
        "advertised.quorum.listener",
        "admin.listener",
        "controller.quorum.voters",
        "data.dir",
        "log.dirs",
        "cluster.id",
    }
)


def node_environment() -> tuple[dict[str, str], list[str]]:
    """The environment the nodes are started with, and the ``KCOORD_*`` variables left out
    of it. A variable naming a setting of the whole cluster goes to every node, as it always
    did (``KCOORD_ADMIN_API_TOKEN`` guards every node's admin API). One naming a setting of
    each node alone raises ``LauncherError``: ``KCOORD_NODE_ID=1`` made node 2 a second node
    1. One naming no setting is left out: every node exited on it ("unknown config key")."""
    env: dict[str, str] = {}
    left_out: list[str] = []
    for name, value in os.environ.items():
        if not name.startswith(ENV_PREFIX):
            env[name] = value
            continue
        key = config_key_of(name)
        if key is None:
            left_out.append(name)
        elif key in PER_NODE_KEYS:
            raise LauncherError(
                f"{name} would set {key} of every node to one value; unset it (each node's "
                "node.toml sets its own)"
            )
        else:
            env[name] = value
    return env, sorted(left_out)


def start_node(node: NodeProcess) -> None:
    Path(node.directory).mkdir(parents=True, exist_ok=True)
    env, _ = node_environment()
    with open(node.log_path, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kcoord.node.cli",
                "node",
                "--config",
                str(node.config_path),
                # Rolled by the node; what it prints before it has set up logging lands here
                # through the redirect below.
                "--log-file",
                str(node.log_path),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal reaches the launcher, not the nodes
            group=node.group,
            env=env,
        )
    node.pid = proc.pid
    _CHILDREN[proc.pid] = proc


def wait_started(node: NodeProcess, timeout_s: float = READY_TIMEOUT_S) -> bool:
    """Poll until a node just started answers DescribeNode on its RPC port as itself (its pid;
    it serves once the data directory is open, before the node catches up); raise
    ``LauncherError`` if the process exits first (a bad config, a locked data directory).
    False if it is still starting at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(node.pid, node.config_path):
            code = exit_code(node.pid) if node.pid is not None else None
            node.pid = None
            raise LauncherError(
                f"node {node.node_id} exited"
                + (f" with code {code}" if code is not None else "")
                + f"; see {node.log_path}"
            )
        view = describe_node(node, timeout_s=0.5)
        # Its own answer: another process holding the port answered for a node that was
        # still starting and then failed to bind (review helper-212).
        if view is not None and view.get("pid") == node.pid:
            return True
        time.sleep(0.1)  # polling the node
    return False


def is_alive(pid: int | None, config_path: Path | None = None) -> bool:
    """Whether ``pid`` is a running kcoord node (the one of ``config_path``, if given: a pid
    reused by another cluster's node is not it)."""
    if pid is None:
        return False
    child = _CHILDREN.get(pid)
    if child is not None:
        code = child.poll()
        if code is None:
            return True
        _EXIT_CODES[pid] = code
        del _CHILDREN[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process now has the pid (after a reboot): not our node
    # A zombie or a reused pid is not our node.
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ")[-1].startswith("Z"):
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    if b"kcoord.node.cli" not in cmdline:
        return False
    return config_path is None or os.fsencode(str(config_path)) in cmdline.split(b"\0")


def exit_code(pid: int) -> int | None:
    """The exit code of a node this process started, once ``is_alive`` saw it gone."""
    return _EXIT_CODES.get(pid)


def stop_node(node: NodeProcess, *, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
    if not is_alive(node.pid, node.config_path):
        node.pid = None
        return
    assert node.pid is not None
    # The node may exit between the check and the signal: gone is what was asked.
    with contextlib.suppress(ProcessLookupError):
        os.kill(node.pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_alive(node.pid, node.config_path) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the process table
    if is_alive(node.pid, node.config_path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while is_alive(node.pid, node.config_path):
            if time.monotonic() > deadline:
                # Stuck in the kernel (an I/O that never ends): its pid stays recorded.
                raise LauncherError(
                    f"node {node.node_id} (pid {node.pid}) has not exited "
                    f"{KILL_TIMEOUT_S:.0f} s after SIGKILL"
                )
            time.sleep(0.02)  # polling the process table
    node.pid = None


def stop_all(nodes: Iterable[NodeProcess], *, kill: bool = False) -> None:
    """``stop_node`` of every node, one that will not go included; then ``LauncherError``
    naming those (stopping at the first left the others running)."""
    stuck = []
    for n in nodes:
        try:
            stop_node(n, kill=kill)
        except LauncherError as e:
            stuck.append(str(e))
    if stuck:
        raise LauncherError("; ".join(stuck))


def describe_node(node: NodeProcess, timeout_s: float = 2.0) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = call_sync(node.host, node.rpc_port, "DescribeNode", {}, timeout_s)
    except Exception:
        return None
    return result


def cluster_ready(state: ClusterState) -> tuple[bool, str]:
    """Ready: a controller is active, every node is registered and unfenced, and every node's
    image holds ``__consumer_offsets``."""
    views = {n.node_id: describe_node(n) for n in state.nodes}
    missing = [i for i, v in views.items() if v is None]
    if missing:
        return False, f"nodes {missing} not answering yet"
    for n in state.nodes:
        view = views[n.node_id]
        assert view is not None
        if n.pid is not None and view.get("pid") != n.pid:
            # Another cluster holds the ports: it answered for ours, which were still starting
            # and then failed to bind, and "cluster ready" was printed over nodes that died.
            return False, (
                f"node {n.node_id}'s RPC port {n.rpc_port} is answered by another process "
                f"(pid {view.get('pid')}, not {n.pid}): are these ports in use?"
            )
    controllers = {v["controller_id"] for v in views.values() if v is not None}
    if None in controllers or len(controllers) != 1:
        seen = "; ".join(
            f"node {i}: leader {v['controller_id']}, epoch {v['controller_epoch']}, "
            f"connected to voters {v.get('quorum_connected')}"
            for i, v in views.items()
            if v is not None
        )
        return False, f"no agreed active controller yet ({seen})"
    active = next(iter(controllers))
    view = views[active]
    assert view is not None
    if not view["is_active_controller"]:
        return False, f"node {active} is leader but not yet active"
    brokers = view["brokers"]
    for n in state.nodes:
        b = brokers.get(str(n.node_id))
        own = views[n.node_id]
        assert own is not None
        # The registration must be this run's (after a restart the metadata log still holds
        # the previous one, unfenced), and the node must serve clients.
        if b is None or b["fenced"] or b["epoch"] != own["broker_epoch"]:
            return False, f"node {n.node_id} not registered and unfenced yet"
        if not own["serving"]:
            return False, f"node {n.node_id} not serving clients yet"
    # Every node's own image, not just the controller's: a node applies a batch that gives it
    # new partitions only once their logs exist, so it can lag the controller by a moment.
    behind = [i for i, v in views.items() if v is not None and not v.get("offsets_topic_created")]
    if behind:
        return False, f"__consumer_offsets not in the image of nodes {behind} yet"
    return True, "ready"


def wait_ready(
    state: ClusterState,
    timeout_s: float = READY_TIMEOUT_S,
    interrupted: Callable[[], bool] | None = None,
) -> None:
    """Poll until the cluster is ready; KeyboardInterrupt as soon as ``interrupted()`` says so
    (a signal handler sets a flag: one that raised could land in a weakref callback, where
    Python prints the exception and drops it, and the launcher went on waiting)."""
    deadline = time.monotonic() + timeout_s
    why = ""
    while time.monotonic() < deadline:
        if interrupted is not None and interrupted():
            raise KeyboardInterrupt
        for n in state.nodes:
            if not is_alive(n.pid, n.config_path):
                raise LauncherError(f"node {n.node_id} exited; see {n.log_path}")
        ok, why = cluster_ready(state)
        if ok:
            return
        time.sleep(0.1)  # polling the nodes
    raise LauncherError(f"cluster not ready after {timeout_s:.0f} s: {why}")


@contextmanager
def _stop_on_failure(state: ClusterState) -> Iterator[None]:
    try:
        yield
    except BaseException:
        try:
            stop_all(state.nodes, kill=True)
        except LauncherError as e:
            print(f"kcoord: {e}", file=sys.stderr)  # the failure that got here goes on
        state.save()  # no pid of a stopped node left behind for another process to take
        raise


def up(
    data_dir: Path,
    nodes: int,
    base_port: int,
    *,
    overrides: dict[str, Any] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    hosts: list[str] | None = None,
    groups: list[int] | None = None,
    node_overrides: dict[int, dict[str, Any]] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> ClusterState:
    """Write configs, start every node, wait until ready; the caller decides what comes next.

    ``node_overrides`` adds keys for single nodes (the chaos lab's advertised proxy addresses).
    Once ``interrupted()`` says so, the nodes started are stopped and KeyboardInterrupt raised.
    """
    with starting_lock(data_dir):
        old = check_startable(data_dir, nodes)
        state = plan(data_dir, nodes, base_port, hosts=hosts, groups=groups)
        state.cluster_id = old.cluster_id if old is not None else _cluster_id_of(state)
        for n in state.nodes:
            Path(n.directory).mkdir(parents=True, exist_ok=True)
            n.config_path.write_text(
                render_config(state, n, overrides or {}, (node_overrides or {}).get(n.node_id))
            )
        with _stop_on_failure(state):
            for n in state.nodes:
                start_node(n)
            state.save()
            wait_ready(state, ready_timeout_s, interrupted)
    return state


def check_startable(data_dir: Path, nodes: int) -> ClusterState | None:
    """Raise ``LauncherError`` if ``nodes`` nodes may not start from ``data_dir``: a cluster
    is running from it, or it holds one of another size. Returns the cluster kept there."""
    _check_node_count(nodes)
    if not (data_dir / STATE_FILE).exists():
        return None
    old = ClusterState.load(data_dir)
    if any(is_alive(n.pid, n.config_path) for n in old.nodes):
        raise LauncherError(
            f"a cluster is already running from {data_dir}; stop it first with "
            "'kcoord cluster down'"
        )
    if len(old.nodes) != nodes:
        # Every node is a voter, and the voters are fixed by config (Kafka's static
        # controller.quorum.voters): starting these nodes with another voter set would
        # let a majority of the new set commit without a majority of the old one.
        raise LauncherError(
            f"{data_dir} holds a {len(old.nodes)}-node cluster; start it with "
            f"--nodes {len(old.nodes)}, or remove the directory for a new cluster"
        )
    return old


def _cluster_id_of(state: ClusterState) -> str | None:
    """A cluster without a state file: the id its nodes recorded, none if their directories
    hold data but no id (an older kcoord's: the image's own id stays; a node that has not
    recorded it refuses to start, naming cluster.id), else a new one."""
    data_dirs = [Path(n.directory) / "data" for n in state.nodes]
    for data in data_dirs:
        try:
            props = read_meta_properties(data) if data.is_dir() else None
        except DataDirError as e:
            raise LauncherError(str(e)) from e
        if props is not None and "cluster.id" in props:
            return props["cluster.id"]
    if any(data.is_dir() and any(data.iterdir()) for data in data_dirs):
        return None
    return new_topic_id()


def down(state: ClusterState, *, kill: bool = False) -> None:
    try:
        stop_all(state.nodes, kill=kill)
    finally:
        state.save_nodes(state.nodes)


def status(state: ClusterState) -> dict[str, Any]:
    rows = []
    for n in state.nodes:
        alive = is_alive(n.pid, n.config_path)
        view = describe_node(n) if alive else None
        # Alive but not answering (stopped with SIGSTOP, or too busy): not "down".
        role = "unresponsive" if alive else "down"
        if view is not None:
            role = "controller" if view["is_active_controller"] else "broker"
            if view.get("fenced", True):
                role += " (fenced)"
        rows.append(
            {
                "node_id": n.node_id,
                "pid": n.pid if alive else None,
                "alive": alive,
                "role": role,
                **n.addresses(),
            }
        )
    return {"data_dir": state.data_dir, "bootstrap_servers": state.bootstrap_servers, "nodes": rows}
