"""Parts of node/server.py: the QuorumMonitor, whose failed sample (pysyncobj's getStatus
iterating dicts its thread grows at its first election) is logged and sampling goes on; and
the client connection limit, which keeps half of the open-files limit for the data directory."""

from __future__ import annotations

import asyncio
import resource
import signal
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kcoord.node import server
from kcoord.node.clock import SYSTEM_CLOCK
from kcoord.node.server import QuorumMonitor, client_connection_limit


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
