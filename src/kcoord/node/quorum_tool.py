"""``kcoord quorum describe``: the metadata quorum as ``kafka-metadata-quorum.sh`` shows it.

Asks the given node for ``DescribeQuorum`` and, when that node is not the leader, asks the
leader it names: only the leader knows how far each voter has replicated.
"""

from __future__ import annotations

from typing import Any, TextIO

from kcoord.node.clock import SYSTEM_CLOCK
from kcoord.node.config import Endpoint
from kcoord.node.rpc_sync import call_sync

TIMEOUT_S = 5.0


def fetch(bootstrap: str) -> dict[str, Any]:
    endpoint = Endpoint.parse(bootstrap)
    answer: dict[str, Any] = call_sync(
        endpoint.host, endpoint.port, "DescribeQuorum", {}, TIMEOUT_S
    )
    if not answer["is_leader"] and answer.get("leader_rpc"):
        leader = Endpoint.parse(answer["leader_rpc"])
        answer = call_sync(leader.host, leader.port, "DescribeQuorum", {}, TIMEOUT_S)
    return answer


def describe(bootstrap: str, *, replication: bool, out: TextIO) -> int:
    try:
        q = fetch(bootstrap)
    except Exception as e:
        out.write(f"kcoord: cannot describe the quorum through {bootstrap}: {e}\n")
        return 1
    if not q["is_leader"]:
        out.write("kcoord: no leader could be reached; the quorum may have no leader\n")
        return 1
    hw = q["high_watermark"]
    now_ms = SYSTEM_CLOCK.now_ms()
    voters = q["voters"]
    followers = [v for v in voters if v["node_id"] != q["leader_id"]]
    max_lag = max((hw - v["log_end_offset"] for v in followers), default=0)
    max_lag_ms = max(
        (
            now_ms - v["last_caught_up_timestamp"]
            for v in followers
            if v["last_caught_up_timestamp"] >= 0
        ),
        default=0,
    )
    if replication:
        header = (
            "NodeId",
            "LogEndOffset",
            "Lag",
            "LastFetchTimestamp",
            "LastCaughtUpTimestamp",
            "Status",
        )
        rows = [header]
        for v in voters:
            rows.append(
                (
                    str(v["node_id"]),
                    str(v["log_end_offset"]),
                    str(max(0, hw - v["log_end_offset"])),
                    str(v["last_fetch_timestamp"]),
                    str(v["last_caught_up_timestamp"]),
                    "Leader" if v["node_id"] == q["leader_id"] else "Follower",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for r in rows:
            out.write(
                "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n"
            )
        return 0
    fields = [
        ("ClusterId", q["cluster_id"]),
        ("LeaderId", q["leader_id"]),
        ("LeaderEpoch", q["leader_epoch"]),
        ("HighWatermark", hw),
        ("MaxFollowerLag", max_lag),
        ("MaxFollowerLagTimeMs", max_lag_ms),
        ("CurrentVoters", "[" + ",".join(str(v["node_id"]) for v in voters) + "]"),
        ("CurrentObservers", "[]"),
    ]
    for name, value in fields:
        out.write(f"{name + ':':<24}{value}\n")
    return 0
