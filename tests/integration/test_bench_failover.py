"""Smoke test of ``bench/failover.py``: a tiny run on real clusters reports every figure.

Behaviour, not timing: one trial per case; in each, another node took over the killed
coordinator's group, and not before the dead node could have been fenced; with hot standby on
the new coordinator was promoted from its standby and replayed only a suffix, with it off it
read the whole partition and replayed the latest record of each key; the JSON has every
figure and target; and no node process outlives the benchmark.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration import bench_run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 400.0
SEED = 13
SMALL_RECORDS = 1000
LARGE_RECORDS = 5000
CLIENTS = 2
# The node's default broker.heartbeat.interval.ms. The controller fences a node once its last
# heartbeat, normally at most one interval before the kill, is a session timeout old; two
# intervals leave room for a heartbeat that was late.
HEARTBEAT_INTERVAL_MS = 500


def run_bench(tmp_path: Path, args: list[str]) -> str:
    """The bench's output; it succeeded and stopped its nodes."""
    return bench_run.run_bench_in(
        tmp_path, "failover.py", [*args, "--dir", str(tmp_path)], RUN_TIMEOUT_S
    )


def assert_summary(summary: dict[str, Any], count: int) -> None:
    assert summary["count"] == count
    assert len(summary["samples_ms"]) == count
    assert all(s > 0 for s in summary["samples_ms"])
    assert summary["min_ms"] <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]


def test_bench_failover_reports_every_figure_and_stops_its_nodes(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    run_bench(
        tmp_path,
        [
            "--trials", "1",
            "--small-records", str(SMALL_RECORDS),
            "--large-records", str(LARGE_RECORDS),
            "--fill-partitions", "500",
            "--fill-groups", "5",
            "--throughput-clients", str(CLIENTS),
            "--throughput-seconds", "2",
            "--seed", str(SEED),
            "--out", str(out),
        ]
    )  # fmt: skip

    result = json.loads(out.read_text())
    assert result["benchmark"] == "failover"
    assert result["seed"] == SEED
    assert result["python"] == sys.version.split()[0]
    session_timeout_ms = result["session_timeout_ms"]
    assert session_timeout_ms == 3000  # the node's default

    records = {"small": SMALL_RECORDS, "large": LARGE_RECORDS}
    failover = result["failover"]
    assert set(failover) == {"standby_on", "standby_off"}
    for setting, sizes in failover.items():
        assert set(sizes) == {"small", "large"}
        for size, case in sizes.items():
            where = f"{setting}/{size}"
            assert case["hot_standby"] == (setting == "standby_on"), where
            assert case["fill"]["records"] == records[size], where
            assert_summary(case, 1)
            (trial,) = case["trials"]
            assert trial["new_coordinator"] != trial["killed"], where
            assert case["p50_ms"] == trial["failover_ms"], where
            # No new coordinator before the controller could fence the dead one.
            assert trial["failover_ms"] >= session_timeout_ms - 2 * HEARTBEAT_INTERVAL_MS, where
            # The commit in flight at the kill, at least, failed.
            assert trial["failures_after_kill"], where
            load = trial["load"]
            if setting == "standby_on":
                # Promoted from a standby that had replayed the partition: a short suffix only.
                assert load["hot"], where
                assert load["records"] < SMALL_RECORDS, where
                assert load["applied"] == load["records"], where
                assert trial["log_end_offset_before"] >= records[size], where
            else:
                # A cold load reads the whole partition (the fill and the committer's records)
                # and replays the latest record of each key: the committer's group commits one
                # key over and over, so fewer than it read.
                assert not load["hot"], where
                assert load["records"] > records[size], where
                assert 0 < load["applied"] < load["records"], where
            assert load["start_after_kill_ms"] > 0, where
            assert trial["rejoin_ms"] > 0, where
    # The small and the large partition are led by different nodes.
    for sizes in failover.values():
        assert sizes["small"]["trials"][0]["killed"] != sizes["large"]["trials"][0]["killed"]

    cold = result["cold_replay"]
    assert cold["loads"] == 1
    (rate,) = cold["samples_records_s"]
    assert rate > 0 and cold["median_records_s"] == rate

    throughput = result["throughput"]
    assert throughput["clients"] == CLIENTS
    for cluster in ("three_nodes", "one_node"):
        case = throughput[cluster]
        assert case["clients"] == CLIENTS
        assert all(n > 0 for n in case["per_client_commits"])
        assert throughput[f"{cluster}_commits_s"] == case["commits_s"] > 0
    assert throughput["ratio"] == pytest.approx(
        throughput["three_nodes_commits_s"] / throughput["one_node_commits_s"]
    )

    expected = {
        f"failover_{setting}_{size}_{q}"
        for setting in ("standby_on", "standby_off")
        for size in ("small", "large")
        for q in ("p50", "p99")
    } | {"hot_standby_large_vs_small_p50", "cold_replay_records_s"}
    assert set(result["targets"]) == expected
    assert set(result["targets_met"]) == expected
    assert all(isinstance(met, bool) for met in result["targets_met"].values())
    assert "4000 ms" in result["targets"]["failover_standby_on_small_p50"]["rule"]
