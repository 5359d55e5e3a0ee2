"""The chaos lab: a network namespace of the run's own, and network faults inside it only.

A run creates ``kcoord-lab-<seed>`` (``ip netns add``), brings its loopback up and runs
everything in it: the nodes, bound to 127.0.0.1 .. 127.0.0.N, the client processes and the
runner itself. The host's network is never touched; deleting the namespace removes every rule.

Network partitions are iptables rules in the namespace's ``OUTPUT`` chain. Each node runs with
a group id of its own (``launcher.up(groups=...)``), and ``-m owner --gid-owner G -m conntrack
--ctorigdst 127.0.0.M -j DROP`` drops what node G's process sends on the connections it opened
to node M. Address rules alone would not work: on loopback an unbound socket sends from
127.0.0.1 whatever its destination, so every client and node connection comes *from*
127.0.0.1, and a rule on the destination address (``-d 127.0.0.1``) also dropped node G's
answers to everybody, turning "cut G from node 1" into "cut G from everything". The
connection's original destination names the node it was opened to, whoever answers on it.
Every shape cuts a pair both ways, which breaks the connections each side opens to the other:
a TCP connection cannot live on when one side's segments never arrive. Connection tracking is
on from the namespace's creation, so that a connection opened before a cut has its original
direction on record (``Namespace.create``). Client processes run
with the runner's group and are never cut off: an isolated node still hears clients and answers
them, which is what shows that it cannot acknowledge anything on its own.

This kernel has no ``netem``: latency and connection resets come from the Toxiproxy-compatible
proxy (``kcoord.chaos.proxy``), not from here.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

NAMESPACE_PREFIX = "kcoord-lab-"


class LabError(Exception):
    """The lab cannot be set up here (not root, no ``ip`` or ``iptables``)."""


def missing_tools() -> list[str]:
    return [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]


def check_lab() -> None:
    if os.geteuid() != 0:
        raise LabError("the chaos lab needs root (network namespaces, iptables)")
    missing = missing_tools()
    if missing:
        raise LabError(
            f"missing {', '.join(missing)}: run `make lab` (scripts/setup-lab.sh) to install them"
        )


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


@dataclass
class Namespace:
    """One network namespace made by this run; ``delete`` kills what runs in it and removes it."""

    name: str

    def create(self) -> None:
        _run("ip", "netns", "add", self.name)
        _run("ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        # Connection tracking from the start (any rule using conntrack turns it on in the
        # namespace; this one changes nothing, and ``heal`` flushes only OUTPUT). Started by
        # the first cut instead, it picked up the connections already open from whichever
        # packet came first, and one read backwards matched no rule: the cut link carried on.
        _run(
            "ip",
            "netns",
            "exec",
            self.name,
            "iptables",
            "-A",
            "INPUT",
            "-m",
            "conntrack",
            "--ctstate",
            "INVALID",
            "-j",
            "ACCEPT",
        )

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def pids(self) -> list[int]:
        out = _run("ip", "netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]

    def delete(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a paused process cannot die
                os.kill(pid, signal.SIGKILL)
        _run("ip", "netns", "delete", self.name, check=False)


@contextlib.contextmanager
def namespace(name: str) -> Iterator[Namespace]:
    """A fresh namespace for the block, removed afterwards whatever happens (a leftover one
    of the same name, from a run that was killed, is removed first)."""
    check_lab()
    ns = Namespace(name)
    if name in _run("ip", "netns", "list", check=False).stdout.split():
        ns.delete()
    ns.create()
    try:
        yield ns
    finally:
        ns.delete()


def stale_namespaces() -> list[str]:
    """Lab namespaces left behind by killed runs (``kcoord chaos clean`` removes them)."""
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NAMESPACE_PREFIX)]


# ---------------------------------------------------------------------------------------------
# Partitions.


@dataclass(frozen=True)
class LabNode:
    node_id: int
    host: str  # 127.0.0.N
    gid: int  # the group its process runs with


def grudge_of(components: Iterable[Iterable[int]]) -> set[tuple[int, int]]:
    """The directed pairs (sender, receiver) cut when nodes talk only within their component
    (Jepsen's ``complete-grudge``)."""
    comps = [set(c) for c in components]
    pairs: set[tuple[int, int]] = set()
    for a, b in itertools.permutations(range(len(comps)), 2):
        pairs.update((x, y) for x in comps[a] for y in comps[b])
    return pairs


def symmetric(links: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    return {p for a, b in links for p in ((a, b), (b, a))}


@dataclass
class Firewall:
    """iptables in the current namespace: the runner calls it from inside the lab."""

    nodes: dict[int, LabNode]
    cut: set[tuple[int, int]] = field(default_factory=set)

    def apply(self, pairs: set[tuple[int, int]]) -> None:
        """Replace the current cuts with ``pairs`` (sender, receiver)."""
        self.heal()
        for sender, receiver in sorted(pairs):
            rule = self._rule(sender, receiver)
            _run("iptables", "-A", *rule)
        self.cut = set(pairs)

    def heal(self) -> None:
        if self.cut:
            _run("iptables", "-F", "OUTPUT")
            self.cut = set()

    def _rule(self, sender: int, receiver: int) -> list[str]:
        return [
            "OUTPUT",
            "-m",
            "owner",
            "--gid-owner",
            str(self.nodes[sender].gid),
            "-m",
            "conntrack",
            "--ctorigdst",
            self.nodes[receiver].host,
            "-j",
            "DROP",
        ]
