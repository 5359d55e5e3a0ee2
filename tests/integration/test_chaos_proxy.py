"""The chaos proxy (``python -m kcoord.chaos.proxy``) driven by toxiproxy-python.

A real proxy process with its API on a loopback port chosen at run time, and an echo server as
the upstream: a round trip through a proxy crosses the upstream stream (client to echo) and the
downstream stream (echo to client). Timings are asserted as lower bounds only.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from tests.integration.cluster import wait_for
from tests.portpick import free_ports
from tests.unit.node.kafka.wire import readable

pytestmark = pytest.mark.integration

SEED = 20_240_611
DEADLINE_S = 10.0
# Lower bounds for delays: 10% under the configured delay, for timer and clock granularity.
SLACK = 0.9


class EchoServer:
    """Echoes every byte; closes its side at the client's EOF. Records how connections ended."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self.accepted = 0
        self.endings: list[str] = []  # "eof" or "reset", one per finished connection
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True)]
        self._threads[0].start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # stop() shut the listener
            with self._lock:
                self.accepted += 1
                self._conns.append(conn)
                thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
                self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        ending = "eof"
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                    if data:
                        conn.sendall(data)
                except ConnectionResetError:
                    ending = "reset"
                    break
                except OSError:
                    ending = "error"
                    break
                if not data:
                    break
        with self._lock:
            self.endings.append(ending)

    def stop(self) -> None:
        with self._lock:
            socks = [self._sock, *self._conns]
            threads = list(self._threads)
        for s in socks:
            with contextlib.suppress(OSError):  # already closed by its thread
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() or recv()
        self._sock.close()
        for thread in threads:
            thread.join(DEADLINE_S)
            assert not thread.is_alive(), "an echo thread did not stop"


class ProxyProcess:
    """``python -m kcoord.chaos.proxy --api 127.0.0.1:0`` until stop()."""

    def __init__(self, seed: int, api: str = "127.0.0.1:0", log_level: str = "WARNING") -> None:
        # Closed by close(): the file outlives __init__.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "kcoord.chaos.proxy", "--api", api, "--seed", str(seed)),
                *("--log-level", log_level),
            ],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = readable([self.proc.stdout], DEADLINE_S)
        self.address = self.proc.stdout.readline().strip() if ready else ""
        if not self.address:
            self.stop()
            pytest.fail(f"the proxy did not print its API address:\n{self.stderr()}")
        host, port = self.address.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the proxy did not stop on {sig.name}")
        finally:
            assert self.proc.stdout is not None
            self.proc.stdout.close()
        return code

    def close(self) -> tuple[int, str]:
        """Stop with SIGTERM (if still running); the exit code and everything on stderr."""
        code = self.stop()
        log = self.stderr()
        self._stderr.close()
        return code, log

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def client_for(server: ProxyProcess) -> Any:
    """A toxiproxy-python client aimed at ``server`` (its API address is class-level state)."""
    client = Toxiproxy()
    client.update_api_consumer(server.host, server.port)
    return client


@pytest.fixture(scope="module")
def server() -> Iterator[ProxyProcess]:
    print(f"proxy seed {SEED}")
    proxy_process = ProxyProcess(SEED)
    try:
        yield proxy_process
    finally:
        code, log = proxy_process.close()
        assert code == 0, log
        assert "Traceback" not in log, log


@pytest.fixture
def toxiproxy(server: ProxyProcess) -> Iterator[Any]:
    client = client_for(server)
    client.reset()
    client.destroy_all()
    yield client
    client_for(server).destroy_all()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.stop()


def api(
    server: ProxyProcess, method: str, path: str, body: object = None, raw: bytes | None = None
) -> tuple[int, Any]:
    """One raw API call: (status, decoded JSON body or None)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.address}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as e:
        with e:
            status, payload = e.code, e.read()
    return status, json.loads(payload) if payload else None


def connect(listen: str) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=DEADLINE_S)


def recv_exactly(sock: socket.socket, nbytes: int) -> bytes:
    data = b""
    while len(data) < nbytes:
        piece = sock.recv(nbytes - len(data))
        assert piece, f"EOF after {len(data)} of {nbytes} bytes"
        data += piece
    return data


def round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def read_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    """Everything the socket still delivers, and how it ended: "eof" or "reset"."""
    data = b""
    while True:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            return data, "reset"
        if not piece:
            return data, "eof"
        data += piece


def assert_refused(listen: str) -> None:
    with pytest.raises(ConnectionRefusedError):
        connect(listen).close()


# --- proxies -----------------------------------------------------------------------------------


def test_version_and_an_empty_server(toxiproxy: Any) -> None:
    assert toxiproxy.running()
    assert json.loads(toxiproxy.version())["version"]
    assert toxiproxy.proxies() == {}


def test_create_list_and_destroy_a_proxy(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")  # listen 127.0.0.1:0
    host, port = proxy.listen.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert int(port) != 0, "the real port is reported"
    assert proxy.enabled is True

    listed = toxiproxy.proxies()
    assert set(listed) == {"echo"}
    assert (listed["echo"].listen, listed["echo"].upstream) == (proxy.listen, echo.address)

    with connect(proxy.listen) as sock:
        round_trip_s(sock, b"hello through the proxy")
        assert proxy.destroy()
        assert read_until_closed(sock) == (b"", "eof")
    assert_refused(proxy.listen)
    assert toxiproxy.get_proxy("echo") is None


def test_disable_cuts_connections_and_enable_listens_again(
    toxiproxy: Any, echo: EchoServer
) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        round_trip_s(sock)
        with proxy.down():
            assert read_until_closed(sock)[0] == b""
            assert_refused(proxy.listen)
            assert toxiproxy.get_proxy("echo").enabled is False
    assert toxiproxy.get_proxy("echo").enabled is True
    assert toxiproxy.get_proxy("echo").listen == proxy.listen, "the same port again"
    with connect(proxy.listen) as sock:
        round_trip_s(sock)
    # The echo server saw both connections end (the first one cut by the disable).
    wait_for(lambda: len(echo.endings) == 2, "both upstream connections to end", DEADLINE_S)


def test_half_close_passes_through(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    payload = bytes(range(256)) * 400
    with connect(proxy.listen) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)  # the echo server sees EOF only after all the data
        assert read_until_closed(sock) == (payload, "eof")


def test_unreachable_upstream_closes_the_client(toxiproxy: Any) -> None:
    (dead_port,) = free_ports(1)
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{dead_port}", name="dead")
    with connect(proxy.listen) as sock:
        assert read_until_closed(sock)[0] == b""


def test_an_unreachable_upstream_is_logged_once_per_outage() -> None:
    (port,) = free_ports(1)
    server = ProxyProcess(SEED, log_level="INFO")
    try:
        proxy = client_for(server).create(upstream=f"127.0.0.1:{port}", name="outage")
        for _ in range(3):
            with connect(proxy.listen) as sock:
                assert read_until_closed(sock)[0] == b""
        with socket.create_server(("127.0.0.1", port)) as upstream, connect(proxy.listen) as sock:
            upstream.settimeout(DEADLINE_S)
            accepted, _ = upstream.accept()
            with accepted:
                sock.sendall(b"x")  # forwarded: the proxy is past its upstream dial
                assert recv_exactly(accepted, 1) == b"x"
    finally:
        code, log = server.close()
    assert code == 0, log
    assert log.count("cannot reach upstream") == 1, log
    assert "reached again (3 connections dropped meanwhile)" in log, log


def test_update_upstream_and_listen(server: ProxyProcess, toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="p")
    other = EchoServer()
    try:
        with connect(proxy.listen) as sock:
            round_trip_s(sock)
            status, body = api(server, "POST", "/proxies/p", {"upstream": other.address})
            assert status == 200
            assert (body["upstream"], body["listen"], body["enabled"]) == (
                other.address,
                proxy.listen,
                True,
            )
            assert read_until_closed(sock)[0] == b"", "changing upstream cuts connections"
        with connect(proxy.listen) as sock:
            round_trip_s(sock)
        assert other.accepted == 1

        status, body = api(server, "PATCH", "/proxies/p", {"listen": "127.0.0.1:0"})
        assert status == 200
        assert body["listen"] != "127.0.0.1:0"
        with connect(body["listen"]) as sock:
            round_trip_s(sock)
        assert other.accepted == 2
    finally:
        other.stop()


def test_api_status_codes_and_errors(
    server: ProxyProcess, toxiproxy: Any, echo: EchoServer
) -> None:
    created = {"name": "p", "upstream": echo.address, "listen": "127.0.0.1:0"}
    status, body = api(server, "POST", "/proxies", created)
    assert status == 201
    assert body["toxics"] == []
    listen = body["listen"]
    assert api(server, "POST", "/proxies", created) == (
        409,
        {"error": "proxy already exists", "status": 409},
    )
    with pytest.raises(ProxyExists):  # toxiproxy-python checks the list first
        toxiproxy.create(upstream=echo.address, name="p")

    assert api(server, "POST", "/proxies", {"upstream": echo.address})[0] == 400
    assert api(server, "POST", "/proxies", {"name": "q"})[0] == 400
    assert api(server, "POST", "/proxies", raw=b"{not json")[0] == 400
    assert api(server, "POST", "/proxies", {"name": "q", "upstream": "x", "enabled": 1})[0] == 400
    status, body = api(server, "POST", "/proxies", {**created, "name": "q", "listen": listen})
    assert status == 500, "the listen address is taken"
    assert "listen tcp" in body["error"]
    assert "q" not in toxiproxy.proxies()

    not_found = (404, {"error": "proxy not found", "status": 404})
    for method in ("GET", "POST", "DELETE"):
        assert api(server, method, "/proxies/nope", {} if method == "POST" else None) == not_found
    assert api(server, "GET", "/proxies/nope/toxics") == not_found
    assert api(server, "POST", "/proxies/nope/toxics", {"type": "latency"}) == not_found

    toxics = "/proxies/p/toxics"
    assert api(server, "POST", toxics, {"type": "nope"}) == (
        400,
        {"error": "invalid toxic type", "status": 400},
    )
    assert api(server, "POST", toxics, {"type": "latency", "stream": "sideways"})[0] == 400
    assert api(server, "POST", toxics, {"type": "latency", "attributes": {"latncy": 1}})[0] == 400
    assert api(server, "POST", toxics, {"type": "latency", "attributes": {"latency": -1}})[0] == 400
    assert api(server, "POST", toxics, {"type": "latency", "toxicity": 1.5})[0] == 400
    slicer = {"average_size": 10, "size_variation": 10}
    assert api(server, "POST", toxics, {"type": "slicer", "attributes": slicer})[0] == 400

    assert api(server, "POST", toxics, {"type": "latency"}) == (
        200,
        {
            "name": "latency_downstream",
            "type": "latency",
            "stream": "downstream",
            "toxicity": 1.0,
            "attributes": {"latency": 0, "jitter": 0},
        },
    )
    assert api(server, "POST", toxics, {"type": "latency"}) == (
        409,
        {"error": "toxic already exists", "status": 409},
    )
    toxic_not_found = (404, {"error": "toxic not found", "status": 404})
    for method in ("GET", "POST", "DELETE"):
        body = {} if method == "POST" else None
        assert api(server, method, f"{toxics}/nope", body) == toxic_not_found

    proxy = toxiproxy.get_proxy("p")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="nope")
    with pytest.raises(NotFound):
        proxy.destroy_toxic("nope")

    assert api(server, "DELETE", f"{toxics}/latency_downstream") == (204, None)
    assert api(server, "POST", "/reset") == (204, None)
    assert api(server, "DELETE", "/proxies/p") == (204, None)
    assert api(server, "GET", "/proxies") == (200, {})


def test_toxics_are_listed_upstream_first(
    server: ProxyProcess, toxiproxy: Any, echo: EchoServer
) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="p")
    proxy.add_toxic(type="latency", attributes={"latency": 1})
    proxy.add_toxic(
        type="slicer", name="cut", stream="upstream", toxicity=0.5, attributes={"average_size": 9}
    )
    slicer_attributes = {"average_size": 5, "size_variation": 1, "delay": 0}
    assert api(server, "POST", "/proxies/p/toxics/cut", {"attributes": slicer_attributes})[0] == 200

    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "cut"}
    cut = toxics["cut"]
    assert (cut.type, cut.stream, cut.toxicity, cut.attributes) == (
        "slicer",
        "upstream",
        0.5,
        slicer_attributes,
    )
    assert proxy.get_toxic("latency_downstream").attributes == {"latency": 1, "jitter": 0}
    status, body = api(server, "GET", "/proxies/p")
    assert status == 200
    assert [t["name"] for t in body["toxics"]] == ["cut", "latency_downstream"]
    assert api(server, "GET", "/proxies/p/toxics/cut") == (200, body["toxics"][0])


def test_reset_enables_every_proxy_and_removes_every_toxic(
    toxiproxy: Any, echo: EchoServer
) -> None:
    slow = toxiproxy.create(upstream=echo.address, name="slow")
    down = toxiproxy.create(upstream=echo.address, name="down")
    with connect(slow.listen) as sock:
        round_trip_s(sock)
        # Long enough that the round trip below can only finish because reset removed it.
        slow.add_toxic(type="latency", attributes={"latency": 60_000})
        down.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        down.disable()
        sock.sendall(b"held by the latency toxic")
        assert toxiproxy.reset()
        assert recv_exactly(sock, 25) == b"held by the latency toxic"
    proxies = toxiproxy.proxies()
    assert all(p.enabled for p in proxies.values())
    assert slow.toxics() == {} and down.toxics() == {}
    with connect(down.listen) as sock:
        round_trip_s(sock)


# --- toxics ------------------------------------------------------------------------------------


def test_latency_on_new_and_open_connections(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as opened_before:
        round_trip_s(opened_before)
        proxy.add_toxic(type="latency", attributes={"latency": 200})
        assert round_trip_s(opened_before) >= 0.2 * SLACK
        with connect(proxy.listen) as opened_after:
            assert round_trip_s(opened_after) >= 0.2 * SLACK
            proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 150})
            assert round_trip_s(opened_after) >= 0.35 * SLACK, "both directions add up"


def test_updating_a_toxic_changes_open_connections(
    server: ProxyProcess, toxiproxy: Any, echo: EchoServer
) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="latency", name="lag", attributes={"latency": 0})
    with connect(proxy.listen) as sock:
        round_trip_s(sock)
        attributes = {"latency": 300, "jitter": 50}
        status, body = api(server, "POST", "/proxies/echo/toxics/lag", {"attributes": attributes})
        assert status == 200
        assert body["attributes"] == {"latency": 300, "jitter": 50}
        assert round_trip_s(sock) >= 0.25 * SLACK


def test_bandwidth(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        proxy.add_toxic(type="bandwidth", attributes={"rate": 100})  # 100 KB/s
        payload = bytes(range(250)) * 200  # 50 KB: 0.5 s at that rate
        assert round_trip_s(sock, payload) >= 0.5 * SLACK


def test_timeout_zero_holds_data_until_removed(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        round_trip_s(sock)
        proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        sock.sendall(b"one")
        sock.sendall(b"two")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        sock.settimeout(DEADLINE_S)
        proxy.destroy_toxic("timeout_upstream")
        assert recv_exactly(sock, 6) == b"onetwo", "released in order, nothing lost"
        round_trip_s(sock)


def test_timeout_closes_the_connection(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    with connect(proxy.listen) as sock:
        round_trip_s(sock)
        start = time.monotonic()
        proxy.add_toxic(type="timeout", attributes={"timeout": 300})
        sock.sendall(b"never answered")
        assert read_until_closed(sock) == (b"", "eof")
        assert time.monotonic() - start >= 0.3 * SLACK


def test_reset_peer(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 200})
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        sock.sendall(b"x")
        assert read_until_closed(sock) == (b"", "reset")
        assert time.monotonic() - start >= 0.2 * SLACK
    wait_for(lambda: echo.endings == ["reset"], "the upstream side to be reset", DEADLINE_S)

    proxy.destroy_toxic("reset_peer_upstream")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 0})
    with connect(proxy.listen) as sock:
        sock.sendall(b"x")
        assert read_until_closed(sock) == (b"", "reset")


def test_slicer(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    attributes = {"average_size": 100, "size_variation": 20, "delay": 20_000}  # 20 ms apart
    proxy.add_toxic(type="slicer", attributes=attributes)
    payload = bytes(range(250)) * 2
    with connect(proxy.listen) as sock:
        start = time.monotonic()
        sock.sendall(payload)
        received, reads = b"", 0
        while len(received) < len(payload):
            piece = sock.recv(len(payload))
            assert piece
            received, reads = received + piece, reads + 1
        elapsed_s = time.monotonic() - start
    assert received == payload
    assert reads >= 2, "the pieces arrive apart"
    # 500 bytes in pieces of at most 120: at least 5 pieces, and 4 pauses before the last.
    assert elapsed_s >= 4 * 0.02 * SLACK


def test_limit_data(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 10})
    with connect(proxy.listen) as sock:
        sock.sendall(b"0123456789abcdefghij")
        assert read_until_closed(sock) == (b"0123456789", "eof")


def test_slow_close(toxiproxy: Any, echo: EchoServer) -> None:
    proxy = toxiproxy.create(upstream=echo.address, name="echo")
    proxy.add_toxic(type="slow_close", attributes={"delay": 300})
    with connect(proxy.listen) as sock:
        round_trip_s(sock, b"data is not delayed")
        start = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # the echo server closes; its close reaches us late
        assert read_until_closed(sock) == (b"", "eof")
        assert time.monotonic() - start >= 0.3 * SLACK


def toxicity_pattern(
    client: Any, echo: EchoServer, toxicity: float, connections: int
) -> list[bool]:
    """For each of ``connections`` opened in turn: did a limit_data 1 toxic act on it?"""
    proxy = client.create(upstream=echo.address, name="odds")
    proxy.add_toxic(type="limit_data", toxicity=toxicity, attributes={"bytes": 1})
    pattern = []
    for _ in range(connections):
        with connect(proxy.listen) as sock:
            sock.sendall(b"ab")
            assert recv_exactly(sock, 1) == b"a"
            pattern.append(sock.recv(1) == b"")  # EOF: the toxic cut it after one byte
    proxy.destroy()
    return pattern


def test_toxicity_zero_and_one(toxiproxy: Any, echo: EchoServer) -> None:
    assert toxicity_pattern(toxiproxy, echo, 0.0, 5) == [False] * 5
    assert toxicity_pattern(toxiproxy, echo, 1.0, 5) == [True] * 5


def test_toxicity_draws_are_reproducible_from_the_seed(echo: EchoServer) -> None:
    seed = SEED + 1
    print(f"proxy seed {seed}")
    patterns = []
    for _ in range(2):
        with ProxyProcess(seed) as server:
            patterns.append(toxicity_pattern(client_for(server), echo, 0.5, 16))
    assert patterns[0] == patterns[1]
    assert True in patterns[0] and False in patterns[0], patterns[0]


# --- command line ------------------------------------------------------------------------------


def test_sigint_stops_the_server_and_its_proxies(echo: EchoServer) -> None:
    with ProxyProcess(SEED) as server:
        proxy = client_for(server).create(upstream=echo.address, name="echo")
        with connect(proxy.listen) as sock:
            round_trip_s(sock)
            assert server.stop(signal.SIGINT) == 0
            assert read_until_closed(sock)[0] == b""
        assert_refused(proxy.listen)
        assert_refused(server.address)
        assert "Traceback" not in server.stderr()


def test_api_address_in_use_is_an_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run(
            [sys.executable, "-m", "kcoord.chaos.proxy", "--api", address],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=False,
        )
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"listen tcp {address}" in result.stderr
