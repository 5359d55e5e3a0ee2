"""The quorum port under a hostile or failing peer (``kcoord.raft.quorum``'s bounds on
pysyncobj's transport): frames and inflated messages past ``MAX_QUORUM_MESSAGE_BYTES`` close
their connection alone, and a listener that failed listens again.

The voter is a real ``_MetadataSyncObj`` ticked on this thread (``test_quorum_follower``);
peers are real sockets on loopback."""

from __future__ import annotations

import errno
import socket
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pysyncobj.pickle
import pytest
from pysyncobj.poller import POLL_EVENT_TYPE

from kcoord.raft import quorum as quorum_module
from kcoord.raft.quorum import MAX_QUORUM_MESSAGE_BYTES, _MetadataSyncObj
from tests.unit.raft.test_quorum_follower import follower

DEADLINE_S = 10.0


@pytest.fixture
def voter(tmp_path: Path) -> Iterator[_MetadataSyncObj]:
    voter = follower(tmp_path)
    voter._onTick(0.0)  # binds its port
    try:
        yield voter
    finally:
        voter.destroy()


def listening_port(voter: _MetadataSyncObj) -> int:
    server = voter._SyncObj__transport._server
    port: int = server._TcpServer__socket.getsockname()[1]
    return port


def tick_until(voter: _MetadataSyncObj, condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        voter._onTick(0.01)  # polls its sockets for up to 10 ms


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def frame(payload: bytes) -> bytes:
    return struct.pack("i", len(payload)) + payload


def test_a_frame_claiming_too_much_closes_its_connection_alone(
    voter: _MetadataSyncObj, caplog: pytest.LogCaptureFixture
) -> None:
    """pysyncobj read a frame claiming up to 2 GiB into a buffer it copied at every read:
    128 MiB so sent held the Raft thread for minutes. The claim is refused at once."""
    port = listening_port(voter)
    with (
        socket.create_connection(("127.0.0.1", port)) as hostile,
        socket.create_connection(("127.0.0.1", port)) as other,
    ):
        hostile.sendall(struct.pack("i", MAX_QUORUM_MESSAGE_BYTES + 1) + b"x" * 1000)
        other.sendall(struct.pack("i", 100))  # a frame on its way, within the bound
        hostile.setblocking(False)
        other.setblocking(False)
        tick_until(voter, lambda: closed_by_peer(hostile), "the hostile connection closed")
        assert not closed_by_peer(other)
    assert f"claims {MAX_QUORUM_MESSAGE_BYTES + 1} bytes" in caplog.text


def test_a_message_inflating_past_the_bound_closes_its_connection(
    voter: _MetadataSyncObj, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """509 KiB of zlib inflated to 1 GiB in pysyncobj's transport before anything looked at
    it. Inflating stops past the bound (here lowered to 1 MiB, so the test stays small)."""
    monkeypatch.setattr(quorum_module, "MAX_QUORUM_MESSAGE_BYTES", 1 << 20)
    bomb = zlib.compress(pysyncobj.pickle.dumps(["x" * (2 << 20)]), 9)
    assert len(bomb) < 8192
    with socket.create_connection(("127.0.0.1", listening_port(voter))) as hostile:
        hostile.sendall(frame(bomb))
        hostile.setblocking(False)
        tick_until(voter, lambda: closed_by_peer(hostile), "the bomb's connection closed")
    assert "inflates past 1048576 bytes" in caplog.text
    # A message within the bound still reaches the transport (which closes this one for not
    # naming a voter: the message was read and looked at).
    caplog.clear()
    with socket.create_connection(("127.0.0.1", listening_port(voter))) as peer:
        peer.sendall(frame(zlib.compress(pysyncobj.pickle.dumps("not-a-voter:1"), 3)))
        peer.setblocking(False)
        tick_until(voter, lambda: closed_by_peer(peer), "the stranger's connection closed")
    assert "neither a voter" in caplog.text


def test_a_listener_that_failed_to_accept_listens_again(
    voter: _MetadataSyncObj, caplog: pytest.LogCaptureFixture
) -> None:
    """pysyncobj's server closes its socket on an accept() error (out of file descriptors
    for a moment), and its transport never listened again: the voter took no connection
    until it was restarted. It listens again from its next tick, Raft going on meanwhile."""
    transport = voter._SyncObj__transport
    server = transport._server
    real_socket = server._TcpServer__socket

    class Exhausted:
        def accept(self) -> None:
            raise OSError(errno.EMFILE, "Too many open files")

        def __getattr__(self, name: str) -> object:
            return getattr(real_socket, name)

    server._TcpServer__socket = Exhausted()
    server._TcpServer__onNewConnection(server._TcpServer__fileno, POLL_EVENT_TYPE.READ)
    real_socket.close()  # what the unbind did to the socket it had
    assert "the listener on" in caplog.text
    # The transport stays ready: pysyncobj runs no Raft while it is not (a leader so paused
    # for bindRetryTime was voted out). The next tick binds again.
    assert transport._ready
    voter._onTick(0.0)
    assert transport._ready and transport._relisten_at is None
    with socket.create_connection(("127.0.0.1", listening_port(voter)), timeout=DEADLINE_S):
        pass
