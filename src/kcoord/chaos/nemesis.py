"""Nemeses: each one a fault and its heal, aimed at targets found through the protocol.

- ``kill``: SIGKILL a node; the heal restarts it (same data directory).
- ``pause``: SIGSTOP a node, SIGCONT at the heal. Half of the pauses are shorter than the
  broker session timeout (nobody may be fenced for them), half longer (the node is fenced and
  must rejoin).
- ``partition``: iptables cuts inside the lab (``lab.Firewall``), with Jepsen's shapes:
  ``one`` (a random node alone), ``controller`` (the active controller alone), ``coordinator``
  (the node coordinating one of the workload's groups alone), ``halves`` (a random minority
  and majority), ``ring`` (Jepsen's majorities ring: every node sees a majority, no two the same
  one; with three nodes that is one cut link) and ``bridge`` (two halves and a node that sees
  both).
- ``clients``: SIGKILL a workload client process; the workload starts a replacement.
- ``latency``: through the fault proxy (``kcoord.chaos.links``), every link *to* a node (a
  random one, or half of the time a group's coordinator) gets a latency toxic both ways
  (50-500 ms, 10% jitter): whatever clients and peers ask of that node is slow; its Raft
  links, too, whichever side dials them (Raft links are proxied per pair of voters,
  chaos/links.py).
- ``reset``: every link to such a node resets its connections (Toxiproxy's ``reset_peer``) as
  soon as data flows, until healed: clients and peers must reconnect over and over.

Targets such as "the active controller" and "the coordinator of group G" are looked up at
fault time with the Kafka protocol (Metadata's controller id, FindCoordinator), from any node
that answers, never assumed.

The nemeses act through the ``Lab``: its ``processes`` (signals to local node processes, or
docker commands on the compose cluster's containers, ``kcoord.chaos.compose``), its
``firewall`` (iptables in the lab, or disabled Toxiproxy proxies on compose) and its ``links``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kcoord.chaos.lab import grudge_of, symmetric
from kcoord.chaos.links import KINDS, Links
from kcoord.node import launcher
from kcoord.node.kafka.client import call_once

log = logging.getLogger(__name__)

METADATA, FIND_COORDINATOR = 3, 10
LOOKUP_TIMEOUT_S = 2.0
NEMESES = ("kill", "pause", "partition", "clients", "latency", "reset")
PROXIED = frozenset({"latency", "reset"})  # nemeses that need the fault proxy
PARTITION_SHAPES = ("one", "controller", "coordinator", "halves", "ring", "bridge")


class Processes(Protocol):
    """How the nemeses kill, pause and resume nodes."""

    def is_alive(self, node: launcher.NodeProcess) -> bool:
        """Running (a paused node counts: it is alive, only stopped)."""
        ...

    def kill(self, node: launcher.NodeProcess) -> None: ...

    def pause(self, node: launcher.NodeProcess) -> None: ...

    def resume(self, node: launcher.NodeProcess) -> None:
        """Undo ``pause``; does nothing to a node that is not paused or not running."""
        ...


class Partitioner(Protocol):
    """Network partitions: ``apply`` replaces the cuts in force with ``pairs`` (sender,
    receiver); ``heal`` removes them all."""

    def apply(self, pairs: set[tuple[int, int]]) -> None: ...

    def heal(self) -> None: ...


class LocalProcesses:
    """Node processes on this machine (the lab): SIGKILL, SIGSTOP and SIGCONT."""

    def is_alive(self, node: launcher.NodeProcess) -> bool:
        return launcher.is_alive(node.pid, node.config_path)

    def kill(self, node: launcher.NodeProcess) -> None:
        launcher.stop_node(node, kill=True)

    def pause(self, node: launcher.NodeProcess) -> None:
        assert node.pid is not None
        os.kill(node.pid, signal.SIGSTOP)

    def resume(self, node: launcher.NodeProcess) -> None:
        # Only the node's own process: a pid reused since it died is another's (the lab has
        # no pid namespace of its own), as stop_node checks before it signals.
        if node.pid is not None and self.is_alive(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGCONT)


@dataclass
class Fault:
    """A fault in force: what it is, and how to undo it."""

    name: str
    targets: list[Any]
    detail: dict[str, Any] = field(default_factory=dict)
    heal: Callable[[], None] = lambda: None


class Lab(Protocol):
    """What a nemesis needs from the runner."""

    rng: random.Random
    firewall: Partitioner
    processes: Processes
    session_timeout_ms: int

    def nodes(self) -> list[launcher.NodeProcess]: ...

    def restart(self, node: launcher.NodeProcess) -> None: ...

    def groups(self) -> list[str]: ...

    def kill_client(self) -> str | None: ...

    @property
    def links(self) -> Links | None: ...


# ---------------------------------------------------------------------------------------------
# Targets, through the protocol.


def controller_id(nodes: Sequence[launcher.NodeProcess]) -> int | None:
    """The active controller as Metadata says (the first live node that answers)."""
    for n in nodes:
        try:
            md = call_once(
                n.host,
                n.kafka_port,
                METADATA,
                12,
                {"topics": [], "allow_auto_topic_creation": False},
                timeout_s=LOOKUP_TIMEOUT_S,
            )
        except (OSError, ConnectionError):
            continue
        if int(md.controller_id) >= 0:
            return int(md.controller_id)
    return None


def coordinator_id(nodes: Sequence[launcher.NodeProcess], group: str) -> int | None:
    """The group's coordinator as FindCoordinator says."""
    for n in nodes:
        try:
            found = call_once(
                n.host,
                n.kafka_port,
                FIND_COORDINATOR,
                3,
                {"key": group, "key_type": 0},
                timeout_s=LOOKUP_TIMEOUT_S,
            )
        except (OSError, ConnectionError):
            continue
        if int(found.error_code) == 0:
            return int(found.node_id)
    return None


def alive(nodes: Sequence[launcher.NodeProcess]) -> list[launcher.NodeProcess]:
    return [n for n in nodes if launcher.is_alive(n.pid, n.config_path)]


def alive_in(lab: Lab) -> list[launcher.NodeProcess]:
    """The lab's running nodes, as its ``processes`` see them."""
    return [n for n in lab.nodes() if lab.processes.is_alive(n)]


# ---------------------------------------------------------------------------------------------
# Faults.


def kill(lab: Lab) -> Fault | None:
    candidates = alive_in(lab)
    if not candidates:
        return None
    node = lab.rng.choice(candidates)
    lab.processes.kill(node)
    return Fault("kill", [node.node_id], heal=lambda: lab.restart(node))


def pause(lab: Lab) -> Fault | None:
    candidates = alive_in(lab)
    if not candidates:
        return None
    node = lab.rng.choice(candidates)
    longer = lab.rng.random() < 0.5
    lab.processes.pause(node)

    def resume() -> None:
        lab.processes.resume(node)

    # The runner holds the fault for this long; a short pause stays under the session timeout.
    hold_s = lab.session_timeout_ms * (2.0 if longer else 0.5) / 1000
    return Fault(
        "pause",
        [node.node_id],
        {"longer_than_session_timeout": longer, "hold_s": hold_s},
        heal=resume,
    )


def partition_components(lab: Lab, shape: str) -> tuple[list[set[int]], list[int]] | None:
    """(components, targets) for a partition shape; None when its target cannot be found."""
    nodes = lab.nodes()
    ids = sorted(n.node_id for n in nodes)
    rng = lab.rng
    if shape == "one":
        target = rng.choice(ids)
    elif shape == "controller":
        found = controller_id(alive_in(lab))
        if found is None:
            return None
        target = found
    elif shape == "coordinator":
        groups = lab.groups()
        if not groups:
            return None
        found = coordinator_id(alive_in(lab), rng.choice(groups))
        if found is None:
            return None
        target = found
    elif shape == "halves":
        shuffled = ids[:]
        rng.shuffle(shuffled)
        minority = set(shuffled[: len(ids) // 2])
        return [minority, set(ids) - minority], sorted(minority)
    elif shape in ("ring", "bridge"):
        return None  # link cuts, not components: see partition()
    else:
        raise ValueError(f"unknown partition shape {shape!r}")
    return [{target}, set(ids) - {target}], [target]


def _ring_cuts(ids: list[int], rng: random.Random) -> set[tuple[int, int]]:
    """Jepsen's majorities ring: nodes on a shuffled ring, each sees the majority around it."""
    order = ids[:]
    rng.shuffle(order)
    n = len(order)
    reach = n // 2  # neighbours on each side a node keeps; with itself a majority
    keep = {(order[i], order[(i + d) % n]) for i in range(n) for d in range(-reach, reach + 1) if d}
    every = {(a, b) for a in ids for b in ids if a != b}
    cuts = every - symmetric(keep)
    if not cuts and n >= 3:
        a, b = rng.sample(ids, 2)  # three nodes: the ring is complete; cut one link
        cuts = symmetric([(a, b)])
    return cuts


def _bridge_cuts(ids: list[int], rng: random.Random) -> tuple[set[tuple[int, int]], int]:
    """Two halves that cannot talk, and one node (the bridge) that talks to both."""
    order = ids[:]
    rng.shuffle(order)
    bridge, rest = order[0], order[1:]
    half = len(rest) // 2
    return grudge_of([rest[:half], rest[half:]]), bridge


def partition(lab: Lab, shapes: Sequence[str]) -> Fault | None:
    shape = lab.rng.choice(list(shapes))
    ids = sorted(n.node_id for n in lab.nodes())
    if shape == "ring":
        cuts = _ring_cuts(ids, lab.rng)
        targets: list[Any] = sorted({a for a, _ in cuts})
    elif shape == "bridge":
        cuts, bridge = _bridge_cuts(ids, lab.rng)
        targets = [bridge]
    else:
        found = partition_components(lab, shape)
        if found is None:
            return None
        components, targets = found
        cuts = grudge_of(components)
    lab.firewall.apply(cuts)
    return Fault(
        "partition",
        targets,
        {"shape": shape, "cut": sorted([a, b] for a, b in cuts)},
        heal=lab.firewall.heal,
    )


def clients(lab: Lab) -> Fault | None:
    killed = lab.kill_client()
    if killed is None:
        return None
    return Fault("clients", [killed])


def _toxic(
    lab: Lab, name: str, toxics: list[dict[str, Any]], detail: dict[str, Any]
) -> Fault | None:
    links = lab.links
    if links is None:
        return None
    # Toxics act on the links *to* a node: half of the time the node coordinating a group.
    node = lab.rng.choice(sorted(n.node_id for n in lab.nodes()))
    groups = lab.groups()
    if groups and lab.rng.random() < 0.5:
        found = coordinator_id(alive_in(lab), lab.rng.choice(groups))
        if found is not None:  # else the random node, not named the coordinator's
            node = found
            detail = {**detail, "target": "coordinator"}
    for kind in KINDS:
        for toxic in toxics:
            links.add_toxic(node, kind, **toxic)
    return Fault(name, [node], detail, heal=links.heal)


def latency(lab: Lab) -> Fault | None:
    delay = lab.rng.randint(50, 500)
    attributes = {"latency": delay, "jitter": delay // 10}
    toxics = [
        {"type": "latency", "stream": stream, "attributes": attributes}
        for stream in ("downstream", "upstream")
    ]
    return _toxic(lab, "latency", toxics, {"latency_ms": delay})


def reset(lab: Lab) -> Fault | None:
    toxics = [{"type": "reset_peer", "stream": "downstream", "attributes": {"timeout": 0}}]
    return _toxic(lab, "reset", toxics, {})


def start_fault(lab: Lab, nemesis: str, shapes: Sequence[str] = PARTITION_SHAPES) -> Fault | None:
    """Inflict one fault of the kind ``nemesis``; None if no target could be found now."""
    if nemesis == "kill":
        return kill(lab)
    if nemesis == "pause":
        return pause(lab)
    if nemesis == "partition":
        return partition(lab, shapes)
    if nemesis == "clients":
        return clients(lab)
    if nemesis == "latency":
        return latency(lab)
    if nemesis == "reset":
        return reset(lab)
    raise ValueError(f"unknown nemesis {nemesis!r} (known: {', '.join(NEMESES)})")
