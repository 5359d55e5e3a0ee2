"""Parts of node/server.py: the QuorumMonitor, whose failed sample (pysyncobj's getStatus
iterating dicts its thread grows at its first election) is logged and sampling goes on; and
the client connection limit, which keeps half of the open-files limit for the data directory."""

from __future__ import annotations

import asyncio
import resource
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kcoord.node import server
from kcoord.node.clock import SYSTEM_CLOCK
from kcoord.node.config import load_config
from kcoord.node.server import QuorumMonitor, client_connection_limit
from kcoord.storage.meta_properties import DataDirLock


class _Quorum:
    def __init__(self) -> None:
        self.calls = 0

    def status(self) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("dictionary changed size during iteration")
        # Leader 2 from the start (no change), then elected again in two new epochs.
        epoch = 1 if self.calls < 4 else 2 if self.calls < 6 else 3
        return SimpleNamespace(leader_id=2, is_leader=False, epoch=epoch)


def test_a_failed_sample_does_not_end_the_sampling(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        quorum = _Quorum()
        monitor = QuorumMonitor(cast(Any, quorum), SYSTEM_CLOCK)
        task = asyncio.create_task(monitor.run(interval_s=0.001))
        deadline = asyncio.get_running_loop().time() + 10
        while quorum.calls < 7 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)  # polling the sampler's progress
        assert not task.done(), task
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert quorum.calls >= 7 and monitor.leader_changes == 2

    asyncio.run(scenario())
    assert "sampling the quorum's status failed" in caplog.text


def test_clients_get_at_most_half_of_the_open_files_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (20_000, 20_000))
    assert client_connection_limit(2**31 - 1) == 10_000  # Kafka's default: unlimited
    assert client_connection_limit(500) == 500
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY,) * 2)
    assert client_connection_limit(2**31 - 1) == 2**31 - 1


def test_an_ignored_sighup_or_sigint_stays_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGHUP stops a node cleanly, as SIGTERM does, unless it is ignored: a node started under
    nohup would otherwise stop when its terminal closes (the JVM leaves an ignored signal
    ignored). SIGINT likewise (a node in the background of a script); SIGTERM always."""
    ignored: set[int] = set()
    monkeypatch.setattr(
        signal,
        "getsignal",
        lambda sig: signal.SIG_IGN if sig in ignored else signal.SIG_DFL,
    )
    assert server.stop_signals() == [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    ignored.add(signal.SIGHUP)
    assert server.stop_signals() == [signal.SIGTERM, signal.SIGINT]
    ignored.update({signal.SIGINT, signal.SIGTERM})
    assert server.stop_signals() == [signal.SIGTERM]


def test_a_stop_signal_during_a_start_that_then_fails_still_hands_over_and_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start, cancelled by a stop signal, ended with another error (an OSError from the
    thread it was waiting on): it escaped ``serve``'s clean-up, and neither the hand-over
    nor the stop ran (no controlled shutdown, no flushed logs or clean-shutdown marker)."""
    calls: list[str] = []

    class FailingStart:
        def __init__(self, config: Any) -> None:
            pass

        async def start(self) -> None:
            signal.raise_signal(signal.SIGUSR1)  # serve's handler is set by now
            try:
                await asyncio.Event().wait()  # waiting for the initial catch-up
            except asyncio.CancelledError:
                raise OSError(28, "No space left on device") from None

        async def hand_over(self) -> None:
            calls.append("hand_over")

        async def stop(self) -> None:
            calls.append("stop")

    monkeypatch.setattr(server, "Node", FailingStart)
    monkeypatch.setattr(server, "stop_signals", lambda: [signal.SIGUSR1])

    async def scenario() -> None:
        await asyncio.wait_for(server.serve(cast(Any, SimpleNamespace(node_id=1))), 10)

    with pytest.raises(OSError, match="No space left"):  # raised once stopped: exit code 1
        asyncio.run(scenario())
    assert calls == ["hand_over", "stop"]


def test_a_step_of_the_stop_that_raises_does_not_skip_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each step runs even when one before it raised, as Kafka's ``BrokerServer.shutdown``
    swallows each step's error: a raising step skipped flushing the logs, the clean-shutdown
    marker and the lock's release, so the next start recovered every log."""
    environ = {"KCOORD_NODE_ID": "1", "KCOORD_LOG_DIRS": str(tmp_path)}
    config = load_config(None, {**environ, "KCOORD_CONTROLLER_QUORUM_VOTERS": "1@127.0.0.1:1"})
    node = server.Node(config)
    node._data_lock = DataDirLock.acquire(tmp_path)
    node._logs_open = True
    shut: list[str] = []

    def failing_close() -> None:
        raise OSError(5, "Input/output error")

    async def fetch_pool_closed() -> None:
        shut.append("fetch connections")

    monkeypatch.setattr(node.rpc_pool, "close_all", failing_close)
    monkeypatch.setattr(node.fetch_pool, "close_all", fetch_pool_closed)
    monkeypatch.setattr(node.logs, "shutdown", lambda: shut.append("logs"))
    asyncio.run(node.stop())
    # The replica fetchers' own connections (apart from the controller calls') close too.
    assert shut == ["fetch connections", "logs"] and node._data_lock is None
    assert "stopping: the RPC connections failed" in caplog.text
    DataDirLock.acquire(tmp_path).release()  # released: another process may take it


def test_a_controlled_shutdown_that_raises_still_hands_the_raft_leadership_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only ControllerUnavailableError was caught in the controlled shutdown: anything else (a
    malformed controller reply) escaped ``hand_over`` and the Raft leadership was not handed
    on, so the other voters elected only after the election timeout (review helper-277)."""
    environ = {"KCOORD_NODE_ID": "1", "KCOORD_LOG_DIRS": str(tmp_path)}
    config = load_config(None, {**environ, "KCOORD_CONTROLLER_QUORUM_VOTERS": "1@127.0.0.1:1"})
    node = server.Node(config)
    resigned: list[float] = []

    async def failing_shutdown(timeout_s: float) -> bool:
        raise KeyError("should_shut_down")

    node.lifecycle = cast(Any, SimpleNamespace(controlled_shutdown=failing_shutdown))

    def resign(timeout_s: float) -> bool:
        resigned.append(timeout_s)
        return True

    node.quorum = cast(
        Any, SimpleNamespace(status=lambda: SimpleNamespace(is_leader=True), resign=resign)
    )
    with caplog.at_level("ERROR"):
        asyncio.run(node.hand_over())
    assert resigned == [server.RESIGN_TIMEOUT_S]
    assert "controlled shutdown failed" in caplog.text
