"""Links through the fault proxy: every connection to a node goes through its proxies.

When a ``latency`` or ``reset`` nemesis is selected, the run starts ``kcoord.chaos.proxy`` in
the lab and, for each node N, three proxies on N's address: ``kafka-N``, ``rpc-N`` and
``quorum-N``, each listening on the node's port + ``PROXY_PORT_OFFSET`` and forwarding to the
node's real listener. The nodes advertise the proxy addresses (``advertised.listeners``,
``advertised.rpc.listener``, and the proxies in ``controller.quorum.voters``, while each binds
its own ``quorum.listener``), so clients and the other nodes reach a node only through its
proxies: a toxic on them slows or resets everything that node hears and says.

The proxies are driven with ``toxiproxy-python``, the client that also drives the real
Toxiproxy of the docker-compose cluster; the proxies live on the node's own 127.0.0.N, so the
lab's iptables partitions still cut them.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toxiproxy import Toxiproxy

from kcoord.node import launcher

PROXY_PORT_OFFSET = 5
KINDS = ("kafka", "rpc", "quorum")


@dataclass
class Links:
    """The proxies of every node, and the toxics in force."""

    client: Toxiproxy
    proxies: dict[tuple[int, str], Any] = field(default_factory=dict)
    toxics: list[tuple[Any, str]] = field(default_factory=list)

    def add_toxic(self, node_id: int, kind: str, **toxic: Any) -> None:
        """Add a toxic (Toxiproxy's fields: type, stream, toxicity, attributes) to one link."""
        proxy = self.proxies[(node_id, kind)]
        name = f"{toxic['type']}-{toxic.get('stream', 'downstream')}-{len(self.toxics)}"
        proxy.add_toxic(name=name, **toxic)
        self.toxics.append((proxy, name))

    def heal(self) -> None:
        toxics, self.toxics = self.toxics, []
        for proxy, name in toxics:
            with contextlib.suppress(Exception):
                proxy.destroy_toxic(name)


def proxy_port(node: launcher.NodeProcess, kind: str) -> int:
    real = {"kafka": node.kafka_port, "rpc": node.rpc_port, "quorum": node.quorum_port}[kind]
    return real + PROXY_PORT_OFFSET


def node_overrides(
    state: launcher.ClusterState,
) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(overrides for every node, overrides per node) that route all traffic via the proxies."""
    voters = ",".join(f"{n.node_id}@{n.host}:{proxy_port(n, 'quorum')}" for n in state.nodes)
    per_node = {
        n.node_id: {
            "advertised.listeners": f"{n.host}:{proxy_port(n, 'kafka')}",
            "advertised.rpc.listener": f"{n.host}:{proxy_port(n, 'rpc')}",
            "quorum.listener": f"{n.host}:{n.quorum_port}",
        }
        for n in state.nodes
    }
    return {"controller.quorum.voters": voters}, per_node


def bootstrap(state: launcher.ClusterState) -> str:
    return ",".join(f"{n.host}:{proxy_port(n, 'kafka')}" for n in state.nodes)


@contextlib.contextmanager
def running_proxy(state: launcher.ClusterState, seed: int, log_path: Path) -> Iterator[Links]:
    """Start the proxy process with a proxy per node link; stop it at the end."""
    with open(log_path, "ab") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kcoord.chaos.proxy",
                "--api",
                "127.0.0.1:0",
                "--seed",
                str(seed),
                # Its listeners and the upstreams it cannot reach, for a run that goes wrong.
                "--log-level",
                "INFO",
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        if not address:
            raise RuntimeError(f"the fault proxy did not start; see {log_path}")
        host, _, port = address.rpartition(":")
        client = Toxiproxy()
        client.update_api_consumer(host, int(port))
        links = Links(client)
        for n in state.nodes:
            for kind in KINDS:
                real = proxy_port(n, kind) - PROXY_PORT_OFFSET
                links.proxies[(n.node_id, kind)] = client.create(
                    upstream=f"{n.host}:{real}",
                    name=f"{kind}-{n.node_id}",
                    listen=f"{n.host}:{proxy_port(n, kind)}",
                    enabled=True,
                )
        yield links
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
