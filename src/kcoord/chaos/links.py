"""Links through the fault proxy: every connection to a node goes through its proxies.

When a ``latency`` or ``reset`` nemesis is selected, the run starts ``kcoord.chaos.proxy`` in
the lab and, for each node N, three proxies on N's address: ``kafka-N``, ``rpc-N`` and
``quorum-N``, each listening on the node's port + ``PROXY_PORT_OFFSET`` and forwarding to the
node's real listener. The nodes advertise the proxy addresses (``advertised.listeners``,
``advertised.rpc.listener``, and the proxies in ``controller.quorum.voters``, while each binds
its own ``quorum.listener``), so clients and the other nodes reach a node only through its
proxies: a toxic on them slows or resets everything that node hears and says.

Raft links are proxied per pair of voters. pysyncobj keeps one connection per pair, dialled by
the voter with the greater address (``_shouldConnect``): through ``quorum-N`` alone, a toxic
on the node with the greatest address touched none of its Raft traffic (it dials every other
voter), and one on the middle node only its link to that node. When the nodes have distinct
hosts (the lab's 127.0.0.N), the dialler D of each pair reaches M through a proxy of its own,
``quorum-M-from-D`` (an ephemeral port on M's host), named in D's own view of
``controller.quorum.voters``; every voter still knows every other by its ``quorum-N`` address,
the name a voter gives of itself when it dials. A toxic on a node's Raft links then goes on the
pair proxies of every pair it is in. On one host (the compose target's stand-in, as
docker-compose.yml on its ``toxiproxy`` host) the ports decide the dial direction, so a pair
proxy takes a free port of M's block (``PAIR_PORT_OFFSETS``), below every port of D's: D, the
greater, still dials.

The proxies are driven with ``toxiproxy-python``, the client that also drives the real
Toxiproxy of the docker-compose cluster; the proxies live on the node's own 127.0.0.N, so the
lab's iptables partitions still cut them.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from toxiproxy import Toxiproxy

from kcoord.node import launcher

PROXY_PORT_OFFSET = 5
KINDS = ("kafka", "rpc", "quorum")
# On one host, the ports of node M's block (base + 10 (M - 1) + offset) a Raft pair proxy to M
# may take: the launcher uses 0-3, the proxies 5-7. So a node may be dialled by three peers.
PAIR_PORT_OFFSETS = (4, 8, 9)


T = TypeVar("T")


@dataclass
class Links:
    """The proxies of every node, and the toxics in force."""

    client: Toxiproxy
    proxies: dict[tuple[int, str], Any] = field(default_factory=dict)
    toxics: list[tuple[Any, str]] = field(default_factory=list)
    # (dialler, dialled) -> the proxy of that Raft link (module docstring); empty when the
    # pairs could not be given ports (more diallers than PAIR_PORT_OFFSETS on one host).
    quorum_pairs: dict[tuple[int, int], Any] = field(default_factory=dict)

    def add_toxic(self, node_id: int, kind: str, **toxic: Any) -> None:
        """Add a toxic (Toxiproxy's fields: type, stream, toxicity, attributes) to the links
        to a node: its ``kind`` proxy, or for Raft the proxies of every pair it is in."""
        if kind == "quorum" and self.quorum_pairs:
            targets = [p for pair, p in sorted(self.quorum_pairs.items()) if node_id in pair]
        else:
            targets = [self.proxies[(node_id, kind)]]
        for proxy in targets:
            name = f"{toxic['type']}-{toxic.get('stream', 'downstream')}-{len(self.toxics)}"
            proxy.add_toxic(name=name, **toxic)
            self.toxics.append((proxy, name))

    def voters_seen_by(self, state: launcher.ClusterState, node_id: int) -> str:
        """``controller.quorum.voters`` as ``node_id`` dials them (module docstring)."""
        entries = []
        for n in state.nodes:
            pair = self.quorum_pairs.get((node_id, n.node_id))
            if pair is not None:
                entries.append(f"{n.node_id}@{pair.listen}")
            else:
                entries.append(f"{n.node_id}@{n.host}:{proxy_port(n, 'quorum')}")
        return ",".join(entries)

    def heal(self) -> None:
        """Remove every toxic; one that could not be removed is kept (a later heal tries it
        again) and the heal raises: forgotten, it stayed in force while the history said the
        links were healed, and the checker's fault windows ended at that heal."""
        self.toxics, errors = undo_each(self.toxics, lambda t: t[0].destroy_toxic(t[1]))
        if errors:
            raise RuntimeError(f"toxics not removed: {'; '.join(errors)}")


def undo_each(items: list[T], undo: Callable[[T], object]) -> tuple[list[T], list[str]]:
    """``undo`` each of ``items``, each tried whatever the others did: (the items it failed
    for, its errors), so that a heal keeps what it could not undo for the next to try."""
    failed: list[T] = []
    errors: list[str] = []
    for item in items:
        try:
            undo(item)
        except Exception as e:
            failed.append(item)
            errors.append(repr(e))
    return failed, errors


def proxy_port(node: launcher.NodeProcess, kind: str) -> int:
    real = {"kafka": node.kafka_port, "rpc": node.rpc_port, "quorum": node.quorum_port}[kind]
    return real + PROXY_PORT_OFFSET


def node_overrides(
    state: launcher.ClusterState, links: Links | None = None
) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(overrides for every node, overrides per node) that route all traffic via the proxies
    (``links``' Raft pair proxies too, when it has them)."""
    voters = ",".join(f"{n.node_id}@{n.host}:{proxy_port(n, 'quorum')}" for n in state.nodes)
    per_node: dict[int, dict[str, Any]] = {
        n.node_id: {
            "advertised.listeners": f"{n.host}:{proxy_port(n, 'kafka')}",
            "advertised.rpc.listener": f"{n.host}:{proxy_port(n, 'rpc')}",
            "quorum.listener": f"{n.host}:{n.quorum_port}",
        }
        for n in state.nodes
    }
    if links is None or not links.quorum_pairs:
        return {"controller.quorum.voters": voters}, per_node
    for n in state.nodes:
        per_node[n.node_id]["controller.quorum.voters"] = links.voters_seen_by(state, n.node_id)
    return {}, per_node


def dials(dialler: launcher.NodeProcess, dialled: launcher.NodeProcess) -> bool:
    """Whether pysyncobj's ``dialler`` opens the connection to ``dialled`` (``_shouldConnect``:
    the greater ``host:port`` string dials). With distinct hosts the hosts decide, whatever the
    ports: the strings differ at the latest at the host's end, where one has ``:``. On one
    host, the Raft proxies' ports do (``quorum-N``, each voter's identity)."""
    if dialler.host != dialled.host:
        return f"{dialler.host}:" > f"{dialled.host}:"
    return f"{proxy_port(dialler, 'quorum')}" > f"{proxy_port(dialled, 'quorum')}"


def _pair_listen(
    state: launcher.ClusterState, dialler: launcher.NodeProcess, dialled: launcher.NodeProcess
) -> str | None:
    """Where ``quorum-M-from-D`` listens: an ephemeral port on distinct hosts; on one host a
    free port of M's block whose ``host:port`` string is below D's identity (so D, and not M,
    still dials), or None when there is none (then the pair goes through ``quorum-M``)."""
    if len({n.host for n in state.nodes}) == len(state.nodes):
        return f"{dialled.host}:0"
    diallers = [n for n in state.nodes if n is not dialled and dials(n, dialled)]
    slot = diallers.index(dialler)
    if slot >= len(PAIR_PORT_OFFSETS):
        return None
    port = dialled.kafka_port + PAIR_PORT_OFFSETS[slot]  # the block's base is its Kafka port
    own = f"{dialler.host}:{proxy_port(dialler, 'quorum')}"
    return f"{dialled.host}:{port}" if f"{dialled.host}:{port}" < own else None


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
        pairs = [
            (dialler, dialled, _pair_listen(state, dialler, dialled))
            for dialler in state.nodes
            for dialled in state.nodes
            if dialled is not dialler and dials(dialler, dialled)
        ]
        if all(listen is not None for _, _, listen in pairs):
            for dialler, dialled, listen in pairs:
                links.quorum_pairs[(dialler.node_id, dialled.node_id)] = client.create(
                    upstream=f"{dialled.host}:{dialled.quorum_port}",
                    name=f"quorum-{dialled.node_id}-from-{dialler.node_id}",
                    listen=listen,  # port 0: the proxy reports the port it bound
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
