"""Smoke test of ``bench/quorum.py``: a tiny run on a real cluster reports every figure.

Behaviour, not timing: the JSON has each figure with one sample per call or round, the rounds
killed the nodes they say, and no node process outlives the benchmark.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration import bench_run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 240.0


def run_bench(tmp_path: Path, args: list[str]) -> str:
    """The bench's output; it succeeded and stopped its nodes."""
    return bench_run.run_bench_in(
        tmp_path, "quorum.py", [*args, "--dir", str(tmp_path)], RUN_TIMEOUT_S
    )


def assert_summary(summary: dict[str, Any], count: int) -> None:
    assert summary["count"] == count
    assert len(summary["samples_ms"]) == count
    assert all(s > 0 for s in summary["samples_ms"])
    assert summary["min_ms"] <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert summary["min_ms"] <= summary["mean_ms"] <= summary["max_ms"]


def test_bench_quorum_reports_every_figure_and_stops_its_nodes(tmp_path: Path) -> None:
    out = tmp_path / "quorum.json"
    run_bench(
        tmp_path,
        [
            "--commits", "20",
            "--concurrent-commits", "20",
            "--concurrency", "4",
            "--failovers", "1",
            "--fencings", "1",
            "--seed", "7",
            "--out", str(out),
        ]
    )  # fmt: skip
    result = json.loads(out.read_text())

    assert result["benchmark"] == "quorum"
    assert result["seed"] == 7
    assert result["python"] == sys.version.split()[0]
    assert result["cpus"] >= 1
    assert result["nodes"] == 3

    commit = result["commit"]
    assert commit["sequential"]["calls"] == 20
    assert_summary(commit["sequential"], 20)
    assert commit["concurrent"]["callers"] == 4
    assert commit["concurrent"]["calls"] == 20
    assert_summary(commit["concurrent"], 20)
    assert commit["sequential"]["calls_s"] > 0
    assert commit["concurrent"]["calls_s"] > 0
    # Every call committed one batch of its own.
    assert commit["batches_committed"] >= 40

    failover = result["controller_failover"]
    (round_,) = failover["rounds"]
    assert round_["new_controller"] != round_["killed"]
    assert 0 < round_["active_ms"] <= round_["commit_ms"]
    assert round_["rejoin_ms"] > 0
    assert_summary(failover["commit"], 1)
    assert failover["median_ms"] == round_["commit_ms"]

    fencing = result["fencing"]
    (round_,) = fencing["rounds"]
    assert round_["killed"] != round_["controller"]
    # On a fresh cluster every node leads some __consumer_offsets partitions.
    assert round_["leaders_moved_exercised"]
    assert round_["offsets_partitions_led_before"] > 0
    assert str(round_["killed"]) not in round_["offsets_leaders_after"]
    assert round_["fenced_ms"] > 0 and round_["leaders_moved_ms"] > 0
    assert_summary(fencing["fenced"], 1)
    assert_summary(fencing["leaders_moved"], 1)

    assert set(result["targets"]) == {
        "failover_median_ms",
        "failover_median_target_ms",
        "fencing_max_ms",
        "fencing_target_ms",
    }
    assert result["targets"]["fencing_target_ms"] == result["session_timeout_ms"] + 1000
    assert set(result["targets_met"]) == {"failover", "fencing"}
    assert all(isinstance(v, bool) for v in result["targets_met"].values())
