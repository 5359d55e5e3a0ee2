"""The fault proxy's accept path, driven directly (tests/integration/test_chaos_proxy.py runs
the proxy process through its HTTP API)."""

from __future__ import annotations

import asyncio
import random

from kcoord.chaos.proxy import ToxiproxyServer


async def _accepted_after_stop() -> tuple[int, bool, int]:
    upstream_hits = 0

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal upstream_hits
        upstream_hits += 1
        writer.close()

    target = await asyncio.start_server(upstream, "127.0.0.1", 0)
    host, port = target.sockets[0].getsockname()[:2]
    server = ToxiproxyServer(random.Random(1))
    proxy = await server.create_proxy("p", "127.0.0.1:0", f"{host}:{port}", True)
    # A client socket stands in for one the listener accepted just before the disable and
    # handed to _accept just after it.
    peers: list[asyncio.StreamWriter] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer)

    stand_in = await asyncio.start_server(keep, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*stand_in.sockets[0].getsockname()[:2])
    proxy.stop()
    await proxy._accept(reader, writer)
    await asyncio.sleep(0)  # let the upstream server see a connection, if one was made
    connections, closing = len(proxy.connections), writer.is_closing()
    writer.close()
    await writer.wait_closed()
    for peer in peers:
        peer.close()
        await peer.wait_closed()
    for s in (target, stand_in):
        s.close()
        await s.wait_closed()
    return connections, closing, upstream_hits


def test_a_connection_handed_over_after_a_disable_is_closed_not_proxied() -> None:
    connections, closing, upstream_hits = asyncio.run(_accepted_after_stop())
    assert connections == 0
    assert closing
    assert upstream_hits == 0


async def _reset_peer_removed_during_its_timeout() -> tuple[bytes, bytes]:
    """A client sends "first" (dropped by reset_peer, which then waits 5 s to reset), the toxic
    is removed, the client sends "second". Returns what the upstream received and what the
    client read before its connection ended."""
    received = bytearray()
    upstream_done = asyncio.Event()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1024):
                received.extend(data)
                writer.write(data)  # an echo
        except ConnectionError:
            pass
        finally:
            writer.close()
            upstream_done.set()

    target = await asyncio.start_server(upstream, "127.0.0.1", 0)
    host, port = target.sockets[0].getsockname()[:2]
    server = ToxiproxyServer(random.Random(1))
    proxy = await server.create_proxy("p", "127.0.0.1:0", f"{host}:{port}", True)
    listen_host, _, listen_port = proxy.listen.rpartition(":")
    reader, writer = await asyncio.open_connection(listen_host, int(listen_port))
    server.add_toxic(
        "p",
        {"name": "r", "type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 5000}},
    )
    writer.write(b"first")
    await writer.drain()
    deadline = asyncio.get_running_loop().time() + 10
    while not any(
        stage.reset_due
        for conn in proxy.connections
        for stage in conn.links["upstream"].stages.values()
    ):
        assert asyncio.get_running_loop().time() < deadline, "reset_peer never took the data"
        await asyncio.sleep(0.01)  # polling interval
    server.remove_toxic("p", "r")
    writer.write(b"second")
    echoed = bytearray()
    try:
        async with asyncio.timeout(10):
            while data := await reader.read(1024):
                echoed.extend(data)
    except ConnectionError:
        pass
    writer.close()
    async with asyncio.timeout(10):
        await upstream_done.wait()
    proxy.stop()
    target.close()
    await target.wait_closed()
    return bytes(received), bytes(echoed)


def test_reset_peer_removed_after_dropping_data_resets_instead_of_leaving_a_hole() -> None:
    received, echoed = asyncio.run(_reset_peer_removed_during_its_timeout())
    assert received == b""  # "first" was dropped, and nothing behind it went through
    assert echoed == b""


async def _chunks_read_under_a_long_latency(messages: int) -> int:
    """Separate messages sent under a 60 s latency toxic, each once the proxy has read the
    one before (or not, by a deadline); how many it read."""
    accepted: list[asyncio.StreamWriter] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    target = await asyncio.start_server(keep, "127.0.0.1", 0)
    host, port = target.sockets[0].getsockname()[:2]
    server = ToxiproxyServer(random.Random(1))
    proxy = await server.create_proxy("p", "127.0.0.1:0", f"{host}:{port}", True)
    server.add_toxic(
        "p", {"type": "latency", "stream": "upstream", "attributes": {"latency": 60_000}}
    )
    listen_host, listen_port = proxy.listen.rsplit(":", 1)
    _, writer = await asyncio.open_connection(listen_host, int(listen_port))
    loop = asyncio.get_running_loop()

    def held() -> int:  # chunks the proxy has read and the latency toxic holds
        (conn,) = proxy.connections
        link = conn.links["upstream"]
        (stage,) = link.stages.values()
        return len(stage.input._items) + (stage.pending is not None)

    read = 0
    for i in range(messages):
        writer.write(b"%03d" % i)
        await writer.drain()
        deadline = loop.time() + 5
        while loop.time() < deadline and (not proxy.connections or held() < i + 1):
            await asyncio.sleep(0.01)  # polling the proxy's state
        if not proxy.connections or held() < i + 1:
            break
        read = i + 1
    writer.close()
    await writer.wait_closed()
    await server.close()
    for peer in accepted:
        peer.close()
        await peer.wait_closed()
    target.close()
    await target.wait_closed()
    return read


def test_the_reader_goes_on_reading_what_a_latency_toxic_holds() -> None:
    """Toxiproxy's latency toxic has a buffer of 1024 chunks. With 4, the reader stopped
    once the toxic held 5, and what waited in the socket meanwhile was read (and its latency
    counted) only when the first passed: about twice the latency, and a hidden limit of a
    few chunks per latency period."""
    assert asyncio.run(_chunks_read_under_a_long_latency(12)) == 12
