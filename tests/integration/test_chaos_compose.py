"""The chaos suite's compose target against real nodes and a real Toxiproxy API, without Docker.

A local 3-node cluster is set up the way docker-compose.yml sets up its nodes: every Kafka,
RPC and Raft port behind a proxy named ``kafka-N`` / ``rpc-N`` / ``quorum-N`` (the project's
Toxiproxy-compatible proxy, driven with toxiproxy-python like the real one), and the nodes
advertising the proxies. A compose file describing that cluster (each node's config as
``KCOORD_*`` variables, the admin ports and the Toxiproxy API published) is what the target
reads. Only the docker commands are fake: every container is "running" (the process nemeses
are unit-tested with a fake runner in tests/unit/chaos/test_compose.py).

- the target reads the file, connects to the proxies and resets them, and sees the cluster
  healthy through the admin API; a paused container makes it unhealthy;
- a partition disables the isolated node's RPC and Raft proxies (they refuse connections, its
  Kafka proxy does not), and the heal enables them again;
- a short ``compose.run`` with the network nemeses (partition, latency, reset) and the groups
  workload passes every checker (marked ``chaos``: ``make test-all`` runs it).
"""

from __future__ import annotations

import contextlib
import socket
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from toxiproxy.api import APIConsumer

from kcoord.chaos import compose, links, runner
from kcoord.chaos.history import History
from kcoord.chaos.lab import grudge_of
from kcoord.node import launcher
from kcoord.node.config import Endpoint, env_var_name, flatten_toml
from tests.integration.cluster import free_base_port, wait_for

pytestmark = pytest.mark.integration

NODES = 3


class AllRunning:
    """A docker CommandRunner for containers that are all running (unless told otherwise)."""

    def __init__(self) -> None:
        self.paused: set[str] = set()

    def __call__(self, command: Sequence[str]) -> str:
        argv = list(command)
        if argv[:3] == ["docker", "compose", "version"]:
            return "Docker Compose version v2\n"
        if "ps" in argv:
            return f"c-{argv[-1]}\n"
        if argv[1] == "inspect":
            return "true true\n" if argv[-1] in self.paused else "true false\n"
        return f"{argv[-1]}\n"  # unpause, start: nothing to do on running containers


def free_block_base() -> int:
    """A base port whose node ports and proxy ports (10 per node) are all free now."""
    return free_base_port(NODES, ports_per_node=10)


def compose_file_for(state: launcher.ClusterState, api: str, path: Path) -> Path:
    """A compose file with this cluster's nodes as services (their configs as KCOORD_*)."""
    services: dict[str, Any] = {}
    for node in state.nodes:
        values = flatten_toml(tomllib.loads(node.config_path.read_text()))
        env = {
            env_var_name(k): (str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in values.items()
        }
        services[f"kcoord-{node.node_id}"] = {
            "image": "kcoord:local",
            "environment": env,
            "ports": [f"127.0.0.1:{node.admin_port}:{node.admin_port}"],
        }
    host, _, port = api.rpartition(":")
    services["toxiproxy"] = {
        "image": "ghcr.io/shopify/toxiproxy:2.12.0",
        "ports": [f"{host}:{port}:{compose.TOXIPROXY_API_PORT}"],
    }
    path.write_text(yaml.safe_dump({"services": services}))
    return path


@pytest.fixture(scope="module")
def proxied_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[launcher.ClusterState, Path]]:
    root = tmp_path_factory.mktemp("compose-target")
    base = free_block_base()
    planned = launcher.plan(root / "cluster", NODES, base)
    (root / "cluster").mkdir()
    with links.running_proxy(planned, 7, root / "proxy.log") as proxies:
        api = f"{APIConsumer.host}:{APIConsumer.port}"
        # On one host, as docker-compose.yml's nodes on theirs: Raft pair proxies in the
        # dialled node's port block, named in each dialler's own voters.
        assert sorted(proxies.quorum_pairs) == [(2, 1), (3, 1), (3, 2)]
        common, per_node = links.node_overrides(planned, proxies)
        state = launcher.up(
            root / "cluster",
            NODES,
            base,
            overrides={**common, "group.initial.rebalance.delay.ms": 0},
            node_overrides=per_node,
        )
        try:
            yield state, compose_file_for(state, api, root / "docker-compose.yml")
        finally:
            for node in state.nodes:
                launcher.stop_node(node, kill=True)


def make_lab(
    compose_file: Path, tmp_path: Path, fake: AllRunning
) -> tuple[compose.ComposeLab, compose.Topology]:
    topology = compose.read_topology(compose_file)
    docker = compose.Docker(compose_file, run=fake)
    containers = {n.node_id: docker.container_id(n.service) for n in topology.nodes}
    lab = compose.ComposeLab(
        runner.Options(nemeses=["partition"], seed=5),
        topology,
        History(clock=lambda: 0.0),
        processes=compose.ComposeProcesses(docker, containers),
        links=compose.connect_links(topology),
        work_dir=tmp_path,
    )
    return lab, topology


def accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 2):
        return True
    return False


def test_health_and_partitions_through_the_proxies(
    proxied_cluster: tuple[launcher.ClusterState, Path], tmp_path: Path
) -> None:
    state, compose_file = proxied_cluster
    fake = AllRunning()
    lab, topology = make_lab(compose_file, tmp_path, fake)
    # The nodes' advertised Kafka addresses are the proxies: the target's bootstrap.
    assert lab.bootstrap == links.bootstrap(state)
    wait_for(lab.recovered, "a healthy cluster through the admin API", 60)

    node3 = state.node(3)
    rpc3, quorum3, kafka3 = (links.proxy_port(node3, k) for k in ("rpc", "quorum", "kafka"))
    assert accepts(rpc3) and accepts(quorum3) and accepts(kafka3)
    pairs = {
        pair: Endpoint.parse(proxy.listen).port
        for pair, proxy in links_of(lab).quorum_pairs.items()
    }
    assert sorted(pairs) == [(2, 1), (3, 1), (3, 2)]  # read back from Toxiproxy by name
    assert all(accepts(port) for port in pairs.values())
    lab.firewall.apply(grudge_of([{3}, {1, 2}]))
    assert not accepts(rpc3) and not accepts(quorum3), "node 3's peers cannot reach it"
    assert not accepts(pairs[(3, 1)]) and not accepts(pairs[(3, 2)]), "nor it them, by Raft"
    assert accepts(kafka3), "its clients still can"
    assert accepts(pairs[(2, 1)])
    for node in (state.node(1), state.node(2)):
        assert all(accepts(links.proxy_port(node, k)) for k in links.KINDS)
    lab.firewall.heal()
    assert accepts(rpc3) and accepts(quorum3) and all(accepts(p) for p in pairs.values())
    wait_for(lab.recovered, "a healthy cluster after the heal", 60)

    fake.paused.add("c-kcoord-2")
    assert not lab.recovered(), "a paused container is not healthy"
    assert [n.node_id for n in topology.nodes] == [1, 2, 3]


@pytest.mark.chaos
def test_a_short_compose_run_with_the_network_nemeses(
    proxied_cluster: tuple[launcher.ClusterState, Path], tmp_path: Path
) -> None:
    _, compose_file = proxied_cluster
    seed = 21
    print(f"seed {seed}")
    options = runner.Options(
        nemeses=["partition"],
        workload="groups",
        duration_s=20,
        seed=seed,
        report_dir=str(tmp_path / "report"),
        interval_s=3,
    )
    docker = compose.Docker(compose_file, run=AllRunning())
    code = compose.run(options, compose_file, docker)
    summary = yaml.safe_load((tmp_path / "report" / "results.json").read_text())
    assert code == 0, summary
    assert summary["valid"] and summary["faults"] >= 1, summary


def links_of(lab: compose.ComposeLab) -> links.Links:
    found = lab.links
    assert found is not None
    return found
