"""``kcoord quorum describe``: the metadata quorum as ``kafka-metadata-quorum.sh`` shows it.

Sends Kafka's DescribeQuorum (apiKey 55, v1) to a Kafka bootstrap server, which forwards it
to the active controller: only the leader knows how far each voter has replicated. The servers
of ``--bootstrap-server H:P[,H:P...]`` are tried in turn, as Kafka's admin client does with its
bootstrap list, so a node that is down does not stop the tool.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from kcoord.node.config import Endpoint
from kcoord.node.kafka.client import call_once
from kcoord.node.kafka.quorum import DESCRIBE_QUORUM_KEY, METADATA_TOPIC

TIMEOUT_S = 5.0


def fetch(bootstrap: str) -> dict[str, Any]:
    """The quorum as plain values, from a DescribeQuorum v1 answer."""
    endpoint = Endpoint.parse(bootstrap)
    body = call_once(
        endpoint.host,
        endpoint.port,
        DESCRIBE_QUORUM_KEY,
        1,
        {"topics": [{"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]},
        timeout_s=TIMEOUT_S,
    )
    if int(body.error_code) != 0 or not body.topics:
        raise ConnectionError(f"DescribeQuorum answered error {int(body.error_code)}")
    part = body.topics[0].partitions[0]
    if int(part.error_code) != 0:
        raise ConnectionError(f"DescribeQuorum answered error {int(part.error_code)}")
    return {
        "is_leader": True,
        "leader_id": int(part.leader_id),
        "leader_epoch": int(part.leader_epoch),
        "high_watermark": int(part.high_watermark),
        "voters": [
            {
                "node_id": int(v.replica_id),
                "log_end_offset": int(v.log_end_offset),
                "last_fetch_timestamp": int(v.last_fetch_timestamp),
                "last_caught_up_timestamp": int(v.last_caught_up_timestamp),
            }
            for v in part.current_voters
        ],
    }


def describe(
    servers: Sequence[Endpoint], *, replication: bool, out: TextIO, err: TextIO = sys.stderr
) -> int:
    """Print the quorum as ``kafka-metadata-quorum.sh describe`` does, asking ``servers`` in
    turn; 1 with the reasons on ``err`` when none answers."""
    failures: list[str] = []
    for endpoint in servers:
        server = str(endpoint)
        try:
            q = fetch(server)
            cluster = None if replication else cluster_id(server)
            break
        except Exception as e:
            failures.append(f"{server}: {e}")
    else:
        err.write(f"kcoord: cannot describe the quorum through {'; '.join(failures)}\n")
        return 1
    if not q["is_leader"]:
        err.write("kcoord: no leader could be reached; the quorum may have no leader\n")
        return 1
    hw = q["high_watermark"]
    voters = q["voters"]
    leader = next((v for v in voters if v["node_id"] == q["leader_id"]), None)
    if leader is None:
        err.write(f"kcoord: the leader, node {q['leader_id']}, is not among the voters\n")
        return 1
    # MetadataQuorumCommand: the lag of the voter furthest behind the leader's log end, and
    # how long before the leader's last catch-up it last caught up (-1 if either never did).
    furthest = min(voters, key=lambda v: v["log_end_offset"])
    max_lag = leader["log_end_offset"] - furthest["log_end_offset"]
    if furthest is leader:
        max_lag_ms = 0
    elif leader["last_caught_up_timestamp"] >= 0 and furthest["last_caught_up_timestamp"] >= 0:
        max_lag_ms = leader["last_caught_up_timestamp"] - furthest["last_caught_up_timestamp"]
    else:
        max_lag_ms = -1
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
                    str(leader["log_end_offset"] - v["log_end_offset"]),
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
        ("ClusterId", cluster),
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


def cluster_id(bootstrap: str) -> str:
    """The cluster id from a Metadata v12 answer (DescribeQuorum does not carry it)."""
    endpoint = Endpoint.parse(bootstrap)
    body = call_once(endpoint.host, endpoint.port, 3, 12, {"topics": []}, timeout_s=TIMEOUT_S)
    return str(body.cluster_id)
