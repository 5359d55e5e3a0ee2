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

    def create(self, dialer_gids: Iterable[int] = ()) -> None:
        """Create it, with loopback up and connection tracking on; every connection a process
        of one of ``dialer_gids`` opens is marked with that group (``Firewall``'s cuts drop
        the other side's packets on it by that mark)."""
        _run("ip", "netns", "add", self.name)
        _run("ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        for gid in dialer_gids:
            self._mangle(
                "OUTPUT", "-m", "owner", "--gid-owner", str(gid), "-m", "conntrack",
                "--ctstate", "NEW", "-j", "CONNMARK", "--set-mark", str(gid),
            )  # fmt: skip
        # The fault proxy's connections upstream: it dials for the node that dialled it, so
        # a connection it opens must carry that node's mark too, or a cut node's answers
        # on it would reach the proxy and the proxy would pass them on (until its unanswered
        # retransmission). An accepted socket takes the mark of the packet that opened it
        # (tcp_fwmark_accept, restored from the connection's mark), the proxy gives its
        # upstream socket that mark (``chaos.proxy``), and the connection keeps it.
        _run(*self.exec_argv(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/tcp_fwmark_accept"]))
        self._mangle("PREROUTING", "-j", "CONNMARK", "--restore-mark")
        self._mangle(
            "OUTPUT", "-m", "conntrack", "--ctstate", "NEW", "-m", "mark", "!", "--mark", "0",
            "-j", "CONNMARK", "--save-mark",
        )  # fmt: skip
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

    def _mangle(self, chain: str, *rule: str) -> None:
        _run(*self.exec_argv(["iptables", "-t", "mangle", "-A", chain, *rule]))

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


def namespace_name(tag: str) -> str:
    """A lab namespace's name: the prefix, ``tag`` (a run's seed) and the pid of the process
    that owns it, so two runs of one seed never take each other's namespace, and ``clean``
    tells a live run's from a killed one's."""
    return f"{NAMESPACE_PREFIX}{tag}-p{os.getpid()}"


def owner_of(name: str) -> int | None:
    """The pid a ``namespace_name`` carries (None for another name)."""
    _, sep, pid = name.rpartition("-p")
    return int(pid) if sep and pid.isdigit() else None


@contextlib.contextmanager
def namespace(name: str, dialer_gids: Iterable[int] = ()) -> Iterator[Namespace]:
    """A fresh namespace for the block, removed afterwards whatever happens (see
    ``Namespace.create`` for ``dialer_gids``)."""
    check_lab()
    ns = Namespace(name)
    try:
        ns.create(dialer_gids)
        yield ns
    finally:
        ns.delete()


def stale_namespaces() -> list[str]:
    """Lab namespaces left behind by killed runs (``kcoord chaos clean`` removes them): those
    whose owner (``namespace_name``) is gone, and those of an older naming."""
    out = _run("ip", "netns", "list", check=False).stdout
    stale = []
    for line in out.splitlines():
        name = line.split()[0]
        if not name.startswith(NAMESPACE_PREFIX):
            continue
        owner = owner_of(name)
        if owner is not None and _is_alive(owner):
            continue
        stale.append(name)
    return stale


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    """iptables in the current namespace: the runner calls it from inside the lab (it
    refuses to run anywhere else: a flush of the host's OUTPUT chain must never happen).

    A cut pair (sender, receiver) drops every packet the sender's process sends to the
    receiver: on the connections the sender opened (their original destination is the
    receiver's address) and on those the receiver opened (marked with the receiver's group
    when it opened them, ``Namespace.create``). Without the second rule the accepting side
    went on sending on a connection the other had opened, until its unacknowledged window
    filled: a Raft leader's appends reached a follower cut from it for several heartbeats."""

    nodes: dict[int, LabNode]
    cut: set[tuple[int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        here = _run("ip", "netns", "identify", str(os.getpid()), check=False).stdout.strip()
        if not here.startswith(NAMESPACE_PREFIX):
            raise LabError(f"the lab's firewall runs inside a lab namespace only (here: {here!r})")

    def apply(self, pairs: set[tuple[int, int]]) -> None:
        """Replace the current cuts with ``pairs`` (sender, receiver)."""
        self.heal()
        self.cut = set(pairs)  # before the rules: one that fails leaves the others to heal
        for sender, receiver in sorted(pairs):
            for rule in self._rules(sender, receiver):
                _run("iptables", "-A", *rule)

    def heal(self) -> None:
        _run("iptables", "-F", "OUTPUT")
        self.cut = set()

    def _rules(self, sender: int, receiver: int) -> list[list[str]]:
        owner = ["OUTPUT", "-m", "owner", "--gid-owner", str(self.nodes[sender].gid)]
        return [
            [*owner, "-m", "conntrack", "--ctorigdst", self.nodes[receiver].host, "-j", "DROP"],
            [*owner, "-m", "connmark", "--mark", str(self.nodes[receiver].gid), "-j", "DROP"],
        ]
