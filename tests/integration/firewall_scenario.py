"""Run inside a lab network namespace: the lab's cuts drop exactly the links they name.

Started by ``test_lab_firewall.py`` with ``ip netns exec``. Three servers stand in for the
nodes, each bound to its 127.0.0.N and running with its own group id, as the chaos runner starts
nodes; probes connect as node G (a process with G's group) or as a client (the runner's group).
Every probe is a fresh TCP connection with a short timeout: it either gets the server's answer
or it does not. Exits non-zero with the failing probes listed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

from kcoord.chaos.lab import Firewall, LabNode, grudge_of

# The servers' port, the same on every node's address: chosen by main() inside the namespace.
PORT = 0
PROBE_TIMEOUT_S = 1.0
NODES = {n: LabNode(n, f"127.0.0.{n}", 43000 + n) for n in (1, 2, 3)}
CLIENT = 0  # probes from the runner's own group: never cut


def _serve(node: LabNode) -> int:
    """A child process with the node's group (taken before its socket is made, as a node's
    process has it from the start) answering every connection with the node's id."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        os.read(ready_r, 1)  # listening
        os.close(ready_r)
        return pid
    os.setgid(node.gid)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((node.host, PORT))
    listener.listen(16)
    os.write(ready_w, b"!")
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_answer, args=(node, conn), daemon=True).start()


def _answer(node: LabNode, conn: socket.socket) -> None:
    """The node's id; then, on a kept connection, a byte every 50 ms after b"push" and
    b"pong" for every b"ping" (a probe closes the connection after the id)."""
    with contextlib.suppress(OSError), conn:
        conn.sendall(str(node.node_id).encode())
        while data := conn.recv(16):
            if b"push" in data:
                threading.Thread(target=_push, args=(conn,), daemon=True).start()
            if b"ping" in data:
                conn.sendall(b"pong")


def _push(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            conn.sendall(b".")
            time.sleep(0.05)


@contextlib.contextmanager
def servers() -> Iterator[None]:
    pids = [_serve(node) for node in NODES.values()]
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def probe(sender: int, receiver: int) -> bool:
    """Whether a connection opened by ``sender`` (a node id, or CLIENT) to ``receiver`` gets
    the receiver's answer. The probe runs in a child so it can take the sender's group."""
    pid = os.fork()
    if pid == 0:
        ok = False
        with contextlib.suppress(OSError):
            if sender != CLIENT:
                os.setgid(NODES[sender].gid)
            with socket.create_connection((NODES[receiver].host, PORT), PROBE_TIMEOUT_S) as s:
                s.settimeout(PROBE_TIMEOUT_S)
                ok = s.recv(16) == str(receiver).encode()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def check_kept_connection(firewall: Firewall, port: int = 0, via: str = "") -> list[str]:
    """A connection node 3 opened to node 2 (on ``port``: node 2's server, or a fault proxy in
    front of it) before any cut, with traffic, must be cut too, both ways.

    The kernel tracked no connection until the lab's first rule used conntrack; then an old
    connection was picked up from whichever packet came first. Node 2's push came first, the
    entry read it backwards (original destination 127.0.0.1, where node 3's unbound socket
    sends from) and neither side's rule matched: the cut link carried on. And node 2's pushes
    on node 3's connection matched no rule at all (its original destination is node 2's own
    address) until the connection mark of the node that opened it was used too. Through the
    proxy, node 2 pushes on the proxy's own connection to it: that one carries node 3's mark
    only because the proxy passes on the mark of the connection it accepted
    (``Namespace.create``); without it node 2's pushes went on reaching node 3 until the
    proxy's unacknowledged window filled."""
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        answered = pushed = True
        with contextlib.suppress(OSError):
            os.setgid(NODES[3].gid)
            with socket.create_connection((NODES[2].host, port or PORT), PROBE_TIMEOUT_S) as s:
                s.settimeout(PROBE_TIMEOUT_S)
                s.recv(16)  # the id
                s.sendall(b"push")
                s.recv(16)  # pushes flow
                os.write(to_parent_w, b"!")
                os.read(to_child_r, 1)  # cut now
                # What was on its way when the cut took (loopback delivers it at once); then
                # node 2 pushes every 50 ms, and none may arrive for a second. Through the
                # proxy without the mark, the proxy's retransmission, after TCP's minimum
                # 200 ms, brought every push since the cut.
                settled = time.monotonic() + 0.1
                with contextlib.suppress(OSError):
                    while (left := settled - time.monotonic()) > 0:
                        s.settimeout(left)
                        s.recv(4096)
                pushed = False
                deadline = time.monotonic() + 1.0
                with contextlib.suppress(OSError):
                    while not pushed and (left := deadline - time.monotonic()) > 0:
                        s.settimeout(left)
                        pushed = bool(s.recv(16))
                s.sendall(b"ping")
                deadline = time.monotonic() + PROBE_TIMEOUT_S
                answered = False
                with contextlib.suppress(OSError):
                    while not answered and (left := deadline - time.monotonic()) > 0:
                        s.settimeout(left)
                        answered = b"pong" in s.recv(4096)
        os._exit(1 if answered else 2 if pushed else 0)
    os.read(to_parent_r, 1)
    firewall.apply({(2, 3), (3, 2)})
    os.write(to_child_w, b"!")
    _, status = os.waitpid(pid, 0)
    firewall.heal()
    code = os.waitstatus_to_exitcode(status)
    if code == 1:
        return [f"kept connection{via}: node 3 -> node 2, opened before the cut, still answered"]
    if code == 2:
        return [f"kept connection{via}: node 2's pushes on node 3's connection crossed the cut"]
    return []


@contextlib.contextmanager
def fault_proxy() -> Iterator[int]:
    """The chaos runs' fault proxy (``kcoord.chaos.proxy``, as the runner starts it: the
    runner's group) with one proxy on node 2's address in front of its server; yields the
    proxy's port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcoord.chaos.proxy", "--api", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        api = proc.stdout.readline().strip()
        body = {
            "name": "to-2",
            "listen": f"{NODES[2].host}:0",  # the proxy reports the port it bound
            "upstream": f"{NODES[2].host}:{PORT}",
            "enabled": True,
        }
        request = urllib.request.Request(
            f"http://{api}/proxies", json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 201, answer.status
            listen = json.loads(answer.read())["listen"]
        yield int(listen.rpartition(":")[2])
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def check(firewall: Firewall, cut: set[tuple[int, int]], label: str) -> list[str]:
    """Apply ``cut`` and probe every (sender, receiver): only the cut pairs may fail."""
    firewall.apply(cut)
    failures = []
    for sender in (CLIENT, *NODES):
        for receiver in NODES:
            if sender == receiver:
                continue
            expected = (sender, receiver) not in cut
            if probe(sender, receiver) != expected:
                who = "client" if sender == CLIENT else f"node {sender}"
                failures.append(
                    f"{label}: {who} -> node {receiver} "
                    f"{'failed' if expected else 'got through'} (cut {sorted(cut)})"
                )
    return failures


def _free_port() -> int:
    """A port free on every node's address: this namespace is new, so one free on the first
    is free on all."""
    with socket.socket() as s:
        s.bind((NODES[1].host, 0))
        return int(s.getsockname()[1])


def main() -> None:
    global PORT
    PORT = _free_port()
    firewall = Firewall(dict(NODES))
    failures: list[str] = []
    with servers():
        # First, before any rule: an old connection must be cut as a new one is.
        failures += check_kept_connection(firewall)
        with fault_proxy() as port:
            failures += check_kept_connection(firewall, port, " through the fault proxy")
        failures += check(firewall, set(), "no cut")
        # Node 1 alone: the other nodes' answers to everybody else go to 127.0.0.1 too (an
        # unbound socket on loopback sends from it), and must not be mistaken for node 1's.
        failures += check(firewall, grudge_of([[1], [2, 3]]), "node 1 isolated")
        failures += check(firewall, grudge_of([[3], [1, 2]]), "node 3 isolated")
        failures += check(firewall, {(1, 2), (2, 1)}, "one link cut")
        firewall.heal()
        failures += check(firewall, set(), "healed")
    firewall.heal()
    if failures:
        sys.exit("\n".join(failures))
    print("every probe as expected")


if __name__ == "__main__":
    main()
