"""The docker-compose target: ``kcoord chaos run --target compose [--compose-file FILE]``.

The same run as in the lab (``kcoord.chaos.runner``: workload, seeded faults, final reads,
checkers) against the cluster that ``docker compose up`` started from docker-compose.yml, from
the host. ``ComposeLab`` is the second implementation of what the nemeses need
(``nemesis.Lab``):

- **processes** (``ComposeProcesses``): ``kill`` is ``docker kill`` (SIGKILL) of the node's
  container, the heal ``docker start`` (same container, same named volume); ``pause`` is
  ``docker pause`` (the cgroup freezer: the process stops as with SIGSTOP), the heal
  ``docker unpause``. The docker commands go through ``Docker`` and one ``CommandRunner``
  (tests give it a fake one); containers are found with ``docker compose ps`` (the v2 plugin)
  or ``docker-compose ps`` (v1), whichever is installed.
- **links**: the Toxiproxy container's proxies (``kafka-N``, ``rpc-N``, ``quorum-N``, and a
  ``quorum-M-from-D`` per pair of voters, from deploy/toxiproxy/toxiproxy.json; the nodes
  advertise them, and each node's ``controller.quorum.voters`` names the pair proxies it dials,
  as in the lab: chaos/links.py), driven with toxiproxy-python through the API port compose
  publishes: the ``latency`` and ``reset`` nemeses work as in the lab.
- **partitions** (``ProxyFirewall``): disabling a node's ``rpc-N`` and ``quorum-N`` proxies
  and the Raft pair proxies it is in (Toxiproxy closes their connections and stops
  listening). The RPC proxy sits in front of a node, not on a link, so this cuts every RPC
  connection *to* the node, from all peers at once, while those the node opens itself (to the
  other nodes' proxies) still work: its heartbeats still reach the controller and its replica
  fetches its leaders. Its Raft links are all cut, both ways. The lab's iptables rules drop
  each direction of each pair, so an isolated node neither hears nor is heard. Only cuts that
  isolate whole components (shapes ``one``, ``controller``, ``coordinator``, ``halves``) can be
  expressed, by disabling the proxies of every component but the largest; ``ring`` and
  ``bridge`` cut single links and are left out on this target. As in the lab, the Kafka
  proxies stay up: clients still reach an isolated node.

The run checks that every node container is running and that Toxiproxy answers, resets
Toxiproxy (every proxy enabled, no toxic), waits until the cluster is healthy (every broker
registered and unfenced, no offline or under-replicated partition, through the admin API
published on the host), then runs; topics and groups get a per-run prefix, since the volumes
keep what earlier runs wrote. At the end, and also when it fails, every fault is healed:
toxics removed, proxies enabled, containers unpaused and started.
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from toxiproxy import Toxiproxy

from kcoord.chaos import runner
from kcoord.chaos.history import History
from kcoord.chaos.lab import grudge_of
from kcoord.chaos.links import KINDS, Links, undo_each
from kcoord.node import launcher
from kcoord.node.config import ConfigError, Endpoint, NodeConfig, load_config

log = logging.getLogger(__name__)

# Shapes that isolate whole components, which disabled proxies can express (module docstring).
SHAPES = ("one", "controller", "coordinator", "halves")
# The proxies a partition disables: the inter-node ones; clients keep reaching every node.
CUT_KINDS = ("rpc", "quorum")
TOXIPROXY_API_PORT = 8474
COMMAND_TIMEOUT_S = 60.0
ADMIN_TIMEOUT_S = 5.0

# Runs argv and returns its stdout; raises DockerError when the command fails.
CommandRunner = Callable[[Sequence[str]], str]


class ComposeError(Exception):
    """The compose target cannot run: no docker, the cluster is not up, a bad compose file."""


class DockerError(ComposeError):
    """A docker command failed."""


def run_command(argv: Sequence[str]) -> str:
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DockerError(f"{' '.join(argv)}: {e}") from e
    if result.returncode != 0:
        raise DockerError(f"{' '.join(argv)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


# ---------------------------------------------------------------------------------------------
# The compose file.


@dataclass(frozen=True)
class ComposeNode:
    """A node service: its config (from its ``KCOORD_*`` environment) and its host ports."""

    service: str
    config: NodeConfig
    admin: Endpoint  # the admin API as published on the host

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def kafka(self) -> Endpoint:
        """What clients on the host dial: the advertised Kafka listener."""
        return self.config.kafka_listener.advertised


@dataclass(frozen=True)
class Topology:
    nodes: tuple[ComposeNode, ...]
    toxiproxy_service: str
    toxiproxy_api: Endpoint  # as published on the host


def _published(spec: dict[str, Any], target: int) -> Endpoint | None:
    """Where the host reaches the container port ``target`` (short or long ``ports`` syntax)."""
    for entry in spec.get("ports") or []:
        if isinstance(entry, dict):
            host, published, port = (
                entry.get("host_ip") or "127.0.0.1",
                entry.get("published"),
                entry.get("target"),
            )
        else:
            parts = str(entry).split("/")[0].split(":")
            host = parts[0] if len(parts) == 3 else "127.0.0.1"
            published, port = (parts[-2], parts[-1]) if len(parts) >= 2 else (None, parts[0])
        if port is not None and int(port) == target and published is not None:
            return Endpoint("127.0.0.1" if host in ("0.0.0.0", "") else host, int(published))
    return None


def _environment(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("environment") or {}
    if isinstance(env, list):
        return {k: v for k, _, v in (str(item).partition("=") for item in env)}
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def read_topology(compose_file: Path) -> Topology:
    """The nodes (services with ``KCOORD_NODE_ID``) and the Toxiproxy service of a compose
    file; raises ``ComposeError`` saying what is missing."""
    try:
        document = yaml.safe_load(compose_file.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ComposeError(f"cannot read {compose_file}: {e}") from e
    services: dict[str, Any] = (document or {}).get("services") or {}
    nodes: list[ComposeNode] = []
    toxiproxy: tuple[str, Endpoint] | None = None
    for name, spec in services.items():
        env = _environment(spec)
        if "KCOORD_NODE_ID" in env:
            try:
                config = load_config(None, env)
            except ConfigError as e:
                raise ComposeError(f"{compose_file}: service {name}: {e}") from e
            admin = _published(spec, config.admin_listener.bind.port)
            if admin is None:
                raise ComposeError(f"{compose_file}: {name} does not publish its admin port")
            nodes.append(ComposeNode(name, config, admin))
        elif "toxiproxy" in str(spec.get("image", "")):
            api = _published(spec, TOXIPROXY_API_PORT)
            if api is None:
                raise ComposeError(f"{compose_file}: {name} does not publish the Toxiproxy API")
            toxiproxy = (name, api)
    if not nodes:
        raise ComposeError(f"{compose_file}: no kcoord node service (KCOORD_NODE_ID)")
    if toxiproxy is None:
        raise ComposeError(f"{compose_file}: no Toxiproxy service")
    return Topology(tuple(sorted(nodes, key=lambda n: n.node_id)), *toxiproxy)


# ---------------------------------------------------------------------------------------------
# Docker.


@dataclass(frozen=True)
class ContainerState:
    running: bool  # a paused container is running
    paused: bool


class Docker:
    """The docker commands the compose target uses, all through ``run``."""

    def __init__(
        self,
        compose_file: Path,
        run: CommandRunner = run_command,
        compose: Sequence[str] | None = None,
    ) -> None:
        self.compose_file = compose_file
        self.run = run
        self._compose = list(compose) if compose is not None else None

    @property
    def compose(self) -> list[str]:
        """``docker compose`` (the v2 plugin) if it answers, else Compose v1's
        ``docker-compose`` (Debian bookworm's package)."""
        if self._compose is None:
            try:
                self.run(["docker", "compose", "version"])
                self._compose = ["docker", "compose"]
            except DockerError:
                self._compose = ["docker-compose"]
        return self._compose

    def container_id(self, service: str) -> str:
        out = self.run([*self.compose, "-f", str(self.compose_file), "ps", "-a", "-q", service])
        ids = out.split()
        if len(ids) != 1:
            raise ComposeError(
                f"expected one container for {service}, found {len(ids)}: start the cluster "
                f"with `docker compose -f {self.compose_file} up -d`"
            )
        return ids[0]

    def state(self, container: str) -> ContainerState:
        out = self.run(
            ["docker", "inspect", "--format", "{{.State.Running}} {{.State.Paused}}", container]
        )
        running, paused = out.split()
        return ContainerState(running == "true", paused == "true")

    def kill(self, container: str) -> None:
        self.run(["docker", "kill", container])

    def pause(self, container: str) -> None:
        self.run(["docker", "pause", container])

    def unpause(self, container: str) -> None:
        self.run(["docker", "unpause", container])

    def start(self, container: str) -> None:
        self.run(["docker", "start", container])


class ComposeProcesses:
    """``nemesis.Processes`` for node containers."""

    def __init__(self, docker: Docker, containers: dict[int, str]) -> None:
        self.docker = docker
        self.containers = containers

    def is_alive(self, node: launcher.NodeProcess) -> bool:
        return self.docker.state(self.containers[node.node_id]).running

    def kill(self, node: launcher.NodeProcess) -> None:
        self.docker.kill(self.containers[node.node_id])

    def pause(self, node: launcher.NodeProcess) -> None:
        self.docker.pause(self.containers[node.node_id])

    def resume(self, node: launcher.NodeProcess) -> None:
        container = self.containers[node.node_id]
        if self.docker.state(container).paused:
            self.docker.unpause(container)

    def start(self, node: launcher.NodeProcess) -> None:
        """Start a stopped (killed) container; a running one is left alone."""
        container = self.containers[node.node_id]
        if not self.docker.state(container).running:
            self.docker.start(container)


# ---------------------------------------------------------------------------------------------
# Partitions through Toxiproxy.


def _linked(a: int, b: int, pairs: set[tuple[int, int]]) -> bool:
    return (a, b) not in pairs and (b, a) not in pairs


def isolated_nodes(node_ids: Sequence[int], pairs: set[tuple[int, int]]) -> set[int]:
    """The nodes whose proxies to disable for ``pairs`` (sender, receiver): every component
    of the nodes left connected but the largest (ties: the one with the lowest node id stays).

    Raises ``ValueError`` unless ``pairs`` cuts exactly between whole components, the only cuts
    disabled proxies can make (``ring`` and ``bridge`` cut single links).
    """
    components: list[set[int]] = []
    for node in sorted(node_ids):
        joined = [c for c in components if any(_linked(node, o, pairs) for o in c)]
        merged = {node}.union(*joined)
        components = [c for c in components if c not in joined] + [merged]
    if grudge_of(components) != pairs:
        raise ValueError(
            f"cut {sorted(pairs)} does not isolate whole components; disabled proxies cut "
            f"every link to a node (shapes: {', '.join(SHAPES)})"
        )
    keep = max(components, key=lambda c: (len(c), -min(c)))
    return set(node_ids) - keep


class ProxyFirewall:
    """``nemesis.Partitioner`` through Toxiproxy: disables the inter-node proxies of the nodes
    cut off (see the module docstring for how this differs from the lab's iptables)."""

    def __init__(self, links: Links, node_ids: Sequence[int]) -> None:
        self.links = links
        self.node_ids = sorted(node_ids)
        self.disabled: list[Any] = []

    def apply(self, pairs: set[tuple[int, int]]) -> None:
        self.heal()
        for node_id in sorted(isolated_nodes(self.node_ids, pairs)):
            cut = [self.links.proxies[(node_id, kind)] for kind in CUT_KINDS]
            # Its Raft links, whichever side dials them (chaos/links.py's pair proxies).
            cut += [p for pair, p in sorted(self.links.quorum_pairs.items()) if node_id in pair]
            for proxy in cut:
                if proxy not in self.disabled:
                    proxy.disable()
                    self.disabled.append(proxy)

    def heal(self) -> None:
        """Enable every disabled proxy; one that could not be is kept (a later heal tries it
        again) and the heal raises. Cleared first, the proxies after a failed one stayed
        disabled, listed nowhere, and the final heal left the cluster partitioned."""
        self.disabled, errors = undo_each(self.disabled, lambda proxy: proxy.enable())
        if errors:
            raise ComposeError(f"proxies not enabled again: {'; '.join(errors)}")


# ---------------------------------------------------------------------------------------------
# The lab.


class ComposeLab(runner.ChaosLab):
    """The compose cluster as the nemeses and the runner see it."""

    def __init__(
        self,
        options: runner.Options,
        topology: Topology,
        history: History,
        *,
        processes: ComposeProcesses,
        links: Links,
        work_dir: Path,
    ) -> None:
        # Only kafka_port is dialled from the host (the Kafka proxies, as advertised); the RPC
        # and quorum ports are the proxies' inside the compose network, for the record.
        state = launcher.ClusterState(
            str(work_dir),
            [
                launcher.NodeProcess(
                    node_id=n.node_id,
                    host=n.kafka.host,
                    kafka_port=n.kafka.port,
                    rpc_port=n.config.rpc_listener.advertised.port,
                    quorum_port=n.config.self_voter.port,
                    admin_port=n.admin.port,
                    directory=str(work_dir / n.service),
                )
                for n in topology.nodes
            ],
        )
        super().__init__(
            options,
            state,
            history,
            links,
            ProxyFirewall(links, [n.node_id for n in topology.nodes]),
        )
        self.topology = topology
        # The nemeses see the Processes protocol; restart and recovered need the containers.
        self.compose_processes = processes
        self.processes = processes

    @property
    def bootstrap(self) -> str:
        return self.state.bootstrap_servers  # the advertised addresses are the proxies already

    def restart(self, node: launcher.NodeProcess) -> None:
        self.compose_processes.resume(node)
        self.compose_processes.start(node)

    def heal_all(self) -> None:
        """Every fault undone: toxics, disabled proxies, paused and killed containers; each
        step tried even when one before it failed (the containers stayed paused after a
        failed proxy heal), and the failures raised after them all."""
        assert self.links is not None
        steps: list[Callable[[], None]] = [self.links.heal, self.firewall.heal]
        steps += [functools.partial(self.restart, node) for node in self.nodes()]
        _, errors = undo_each(steps, lambda step: step())
        if errors:
            raise ComposeError(f"the heal failed: {'; '.join(errors)}")

    def fenced_brokers(self, excluding: int, timeout_s: float) -> set[int] | None:
        """As the lab's, through the admin API (the containers' RPC ports are not published):
        ``/api/v1/brokers``, the node's own image, which answers while the paused node is the
        active controller (``/api/v1/cluster`` asks the controller and waited 2 s for it)."""
        for node in self.topology.nodes:
            if node.node_id == excluding:
                continue
            try:
                view = admin_get(node, "/api/v1/brokers", timeout_s)
            except Exception:  # down, paused or slow: ask the next one
                continue
            if not view.get("serving", True):
                continue  # still catching up after its start (the lab's, runner.py)
            return {int(b["node_id"]) for b in view["brokers"] if b["fenced"]}
        return None

    def recovered(self) -> bool:
        """Every container running, one active controller every node agrees on, every broker
        registered and unfenced, no offline or under-replicated partition (admin API)."""
        for node in self.nodes():
            state = self.compose_processes.docker.state(
                self.compose_processes.containers[node.node_id]
            )
            if not state.running or state.paused:
                return False
        views = [admin_get(n, "/api/v1/cluster") for n in self.topology.nodes]
        controllers = {v["controller"]["node_id"] for v in views}
        if len(controllers) != 1 or None in controllers:
            return False
        controller_id = next(iter(controllers))
        [view] = [v for v in views if v["node_id"] == controller_id]
        brokers = view["brokers"]
        if len(brokers) < len(self.topology.nodes) or any(b["fenced"] for b in brokers):
            return False
        [controller] = [n for n in self.topology.nodes if n.node_id == controller_id]
        topics = admin_get(controller, "/api/v1/topics")["topics"]
        return all(
            t["offline_partitions"] == 0 and t["under_replicated_partitions"] == 0 for t in topics
        )


def admin_get(node: ComposeNode, path: str, timeout_s: float = ADMIN_TIMEOUT_S) -> Any:
    token = node.config.admin_api_token
    request = urllib.request.Request(
        f"http://{node.admin}{path}",
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def connect_links(topology: Topology) -> Links:
    """toxiproxy-python on the published API, reset, with every node's proxies."""
    client = Toxiproxy()
    client.update_api_consumer(topology.toxiproxy_api.host, topology.toxiproxy_api.port)
    if not client.running():
        raise ComposeError(
            f"Toxiproxy does not answer on {topology.toxiproxy_api} "
            f"(service {topology.toxiproxy_service})"
        )
    client.reset()  # every proxy enabled, every toxic removed: a run starts healthy
    proxies = client.proxies()
    links = Links(client)
    for node in topology.nodes:
        for kind in KINDS:
            name = f"{kind}-{node.node_id}"
            if name not in proxies:
                raise ComposeError(f"Toxiproxy has no proxy {name} (see toxiproxy.json)")
            links.proxies[(node.node_id, kind)] = proxies[name]
    ids = [n.node_id for n in topology.nodes]
    for dialler in ids:
        for dialled in ids:
            pair = proxies.get(f"quorum-{dialled}-from-{dialler}")
            if pair is not None:
                links.quorum_pairs[(dialler, dialled)] = pair
    return links


def run(options: runner.Options, compose_file: Path, docker: Docker | None = None) -> int:
    """One chaos run against the running compose cluster; the exit code as ``runner``'s."""
    if options.inject_bug:
        raise ComposeError("--inject-bug needs the lab target: compose nodes run as configured")
    if "partition" in options.nemeses:
        skipped = [s for s in options.shapes if s not in SHAPES]
        options.shapes = [s for s in options.shapes if s in SHAPES]
        if skipped:
            runner.progress(f"compose target: partition shapes {', '.join(skipped)} left out")
        if not options.shapes:
            raise ComposeError(f"no partition shape this target can make ({', '.join(SHAPES)})")
    topology = read_topology(compose_file)
    docker = docker or Docker(compose_file)
    containers = {n.node_id: docker.container_id(n.service) for n in topology.nodes}
    for node in topology.nodes:
        if not docker.state(containers[node.node_id]).running:
            raise ComposeError(f"{node.service} is not running: `docker compose up -d` first")
    links = connect_links(topology)
    work, history, started = runner.prepare_run(options)
    processes = ComposeProcesses(docker, containers)
    chaos = ComposeLab(options, topology, history, processes=processes, links=links, work_dir=work)
    error: str | None = None
    try:
        chaos.heal_all()
        runner.progress("waiting for the compose cluster to be healthy")
        runner.poll_until("a healthy cluster", chaos.recovered, runner.RECOVERY_TIMEOUT_S)
        # The named volumes keep earlier runs' topics and groups: this run's are its own.
        prefix = f"chaos-{options.seed}-{time.strftime('%Y%m%d%H%M%S')}"
        error = runner.drive(chaos, work / "clients", prefix=prefix)
    except runner.RunInterruptedError as e:
        error = f"interrupted ({e})"
    except TimeoutError as e:
        error = str(e)
    finally:
        try:
            chaos.heal_all()
        except runner.RunInterruptedError as e:
            # A signal here still lets the report be written, and says the heal was cut.
            error = error or f"interrupted while healing ({e})"
        except Exception as e:
            # The persistent cluster may be left paused or partitioned: the run fails.
            log.exception("healing the compose cluster failed")
            error = error or f"healing the compose cluster failed: {e!r}"
    return runner.conclude(options, history, started, error)
