"""Free loopback ports chosen at run time."""

from __future__ import annotations

import random
import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ephemeral_port_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections (32768 by default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_base_port(nodes: int, rng: random.Random | None = None, *, ports_per_node: int = 4) -> int:
    """A base port whose launcher block (``ports_per_node`` ports per node, nodes 10 apart) is
    free right now.

    Below the ephemeral range: a node restarted by a test must find its ports free again, and
    a client's outgoing connection may take any ephemeral port while the node is down (one
    did: EADDRINUSE on a restart in CI).
    """
    rng = rng or random.Random()
    top = min(ephemeral_port_floor(), 60000) - 10 * nodes
    for _ in range(200):
        base = rng.randrange(10000, top)
        ports = [base + 10 * i + k for i in range(nodes) for k in range(ports_per_node)]
        socks = []
        try:
            for p in ports:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port block found")


def restartable_ports(count: int) -> list[int]:
    """``count`` free ports, 10 apart, below the ephemeral range (see ``free_base_port``): for
    servers a test restarts on the same port, which an ephemeral one may have taken meanwhile."""
    base = free_base_port(count, ports_per_node=1)
    return [base + 10 * i for i in range(count)]
