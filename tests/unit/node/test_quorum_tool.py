"""``kcoord quorum describe``'s figures, as kafka-metadata-quorum.sh computes them."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest

from kcoord.node import cli, quorum_tool
from kcoord.node.config import Endpoint
from kcoord.node.tool_client import parse_bootstrap


def servers(text: str) -> list[Endpoint]:
    return parse_bootstrap(text)


def described(monkeypatch: pytest.MonkeyPatch, *voters: tuple[int, int, int]) -> dict[str, str]:
    """The summary for voters ``(node id, log end offset, last caught-up ms)``; 1 leads."""
    view: dict[str, Any] = {
        "is_leader": True,
        "leader_id": 1,
        "leader_epoch": 4,
        "high_watermark": 95,
        "voters": [
            {
                "node_id": node_id,
                "log_end_offset": end,
                "last_fetch_timestamp": caught_up,
                "last_caught_up_timestamp": caught_up,
            }
            for node_id, end, caught_up in voters
        ],
    }
    monkeypatch.setattr(quorum_tool, "fetch", lambda bootstrap: view)
    monkeypatch.setattr(quorum_tool, "cluster_id", lambda bootstrap: "c")
    out = io.StringIO()
    assert quorum_tool.describe(servers("b:1"), replication=False, out=out) == 0
    return {k: v.strip() for k, v in (line.split(":", 1) for line in out.getvalue().splitlines())}


def test_the_lag_is_the_furthest_voters_behind_the_leaders_log_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MetadataQuorumCommand: leader LEO minus the lowest LEO, and the leader's last catch-up
    minus that voter's (not the tool's own clock against the HW)."""
    summary = described(monkeypatch, (1, 100, 5000), (2, 90, 4000), (3, 100, 4900))
    assert (summary["MaxFollowerLag"], summary["MaxFollowerLagTimeMs"]) == ("10", "1000")
    # A voter that never caught up (down since the election) is -1, not a healthy 0.
    summary = described(monkeypatch, (1, 100, 5000), (2, 90, -1), (3, 100, 4900))
    assert (summary["MaxFollowerLag"], summary["MaxFollowerLagTimeMs"]) == ("10", "-1")
    summary = described(monkeypatch, (1, 100, 5000), (2, 100, 5000), (3, 100, 5000))
    assert (summary["MaxFollowerLag"], summary["MaxFollowerLagTimeMs"]) == ("0", "0")


def test_errors_go_to_stderr_with_exit_code_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(bootstrap: str) -> Any:
        raise OSError("connection refused")

    monkeypatch.setattr(quorum_tool, "fetch", unreachable)
    out, err = io.StringIO(), io.StringIO()
    assert quorum_tool.describe(servers("b:1"), replication=False, out=out, err=err) == 1
    assert out.getvalue() == "" and "connection refused" in err.getvalue()
    # A leader the voters do not name (a node answering from another quorum's view): an
    # error, not a StopIteration traceback.
    view = {"is_leader": True, "leader_id": 9, "high_watermark": 0, "voters": []}
    monkeypatch.setattr(quorum_tool, "fetch", lambda bootstrap: view)
    monkeypatch.setattr(quorum_tool, "cluster_id", lambda bootstrap: "c")
    err = io.StringIO()
    assert quorum_tool.describe(servers("b:1"), replication=False, out=out, err=err) == 1
    assert "node 9, is not among the voters" in err.getvalue()


def test_the_bootstrap_servers_are_tried_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--bootstrap-server H:P,H:P`` as the other tools and kafka-metadata-quorum.sh take it
    (the list ``cluster up`` prints): it was parsed as one address and refused; a server
    that does not answer gives way to the next."""
    voter = {"node_id": 1, "log_end_offset": 5, "last_fetch_timestamp": 1}
    voter["last_caught_up_timestamp"] = 1
    view: dict[str, Any] = {"is_leader": True, "leader_id": 1, "leader_epoch": 1}
    view.update(high_watermark=5, voters=[voter])
    asked: list[str] = []

    def fetch(bootstrap: str) -> Any:
        asked.append(bootstrap)
        if bootstrap == "a:1":
            raise ConnectionRefusedError("connection refused")
        return view

    monkeypatch.setattr(quorum_tool, "fetch", fetch)
    monkeypatch.setattr(quorum_tool, "cluster_id", lambda bootstrap: "c")
    out, err = io.StringIO(), io.StringIO()
    assert quorum_tool.describe(servers("a:1,b:2,c:3"), replication=False, out=out, err=err) == 0
    assert asked == ["a:1", "b:2"] and "LeaderId:" in out.getvalue()
    monkeypatch.setattr(quorum_tool, "fetch", lambda bootstrap: fetch("a:1"))
    err = io.StringIO()
    assert quorum_tool.describe(servers("a:1,b:2"), replication=False, out=out, err=err) == 1
    assert err.getvalue().count("connection refused") == 2
    bad = io.StringIO()
    with contextlib.redirect_stderr(bad):
        assert cli.main(["quorum", "describe", "--bootstrap-server", "a:x"]) == 1
    assert bad.getvalue().startswith("kcoord: invalid --bootstrap-server 'a:x'")
