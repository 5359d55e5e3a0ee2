"""Smoke test of ``bench/coordinator.py``: a tiny run against kcoord and tansu reports every figure.

Behaviour, not timing: the JSON has each figure for both brokers with one sample per round, the
ratio and a target for each, the SIGKILLed member owned partitions that the survivors then own,
and no process the benchmark started (kcoord nodes, tansu, member processes) outlives it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration import bench_run
from tests.integration.bench_run import processes_matching

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 300.0
SEED = 11


def run_bench(args: list[str]) -> tuple[int, str]:
    return bench_run.run_bench("coordinator.py", args, RUN_TIMEOUT_S)


def assert_summary(summary: dict[str, Any], count: int, *, with_samples: bool = True) -> None:
    assert summary["count"] == count
    if with_samples:
        assert len(summary["samples_ms"]) == count
        assert all(s > 0 for s in summary["samples_ms"])
    assert summary["min_ms"] <= summary["median_ms"] <= summary["p90_ms"] <= summary["p99_ms"]
    assert summary["p99_ms"] <= summary["p999_ms"] <= summary["max_ms"]
    assert summary["min_ms"] <= summary["mean_ms"] <= summary["max_ms"]


def test_bench_coordinator_reports_every_figure_and_stops_its_processes(tmp_path: Path) -> None:
    out = tmp_path / "coordinator.json"
    code, output = run_bench(
        [
            "--commit-clients", "2",
            "--commit-seconds", "1",
            "--partitions", "4",
            "--stable-sizes", "1,2",
            "--stable-rounds", "1",
            "--initial-delays", "0,3000",
            "--failover-members", "2",
            "--failover-rounds", "1",
            "--seed", str(SEED),
            "--out", str(out),
            "--dir", str(tmp_path),
        ]
    )  # fmt: skip
    assert code == 0, output

    port = re.search(r"starting tansu \(.*\) on 127\.0\.0\.1:(\d+)", output)
    assert port is not None, output
    assert processes_matching("kcoord.node.cli", str(tmp_path.resolve())) == []
    assert processes_matching("tansu", f"tcp://127.0.0.1:{port.group(1)}") == []
    assert processes_matching("coordinator.py", "member", f"failover-{SEED:x}-") == []

    result = json.loads(out.read_text())
    assert result["benchmark"] == "coordinator"
    assert result["seed"] == SEED
    assert result["python"] == sys.version.split()[0]
    assert result["client"]["library"] == "aiokafka"
    assert result["kcoord"]["nodes"] == 3
    assert result["tansu"]["version"].startswith("tansu")

    expected = {
        "commit_1",
        "commit_2",
        "stable_1_delay_0",
        "stable_2_delay_0",
        "stable_1_delay_3000",
        "stable_2_delay_3000",
        "failover",
    }
    figures = result["figures"]
    assert set(figures) == expected
    assert set(result["targets"]) == expected
    assert set(result["targets_met"]) == expected
    assert all(isinstance(met, bool) for met in result["targets_met"].values())
    for key, figure in figures.items():
        assert figure["kcoord"] > 0 and figure["tansu"] > 0, key
        assert figure["ratio"] == pytest.approx(figure["kcoord"] / figure["tansu"]), key
        assert figure["higher_is_better"] == key.startswith("commit_"), key
    assert result["targets"]["commit_2"]["rule"] == "kcoord/tansu >= 1.5"
    assert result["targets"]["commit_1"]["rule"] == "kcoord/tansu >= 1.0"
    assert result["targets"]["failover"]["rule"] == "kcoord/tansu <= 1.0"

    raw = result["raw"]
    for clients in (1, 2):
        for broker in ("kcoord", "tansu"):
            case = raw[f"commit_{clients}"][broker]
            assert case["clients"] == clients
            assert len(case["per_client_commits"]) == clients
            assert all(n > 0 for n in case["per_client_commits"])
            assert case["commits"] == sum(case["per_client_commits"])
            # Throughput over time: commits per half second of the 1 s window.
            assert case["interval_s"] == 0.5
            assert len(case["commits_per_interval"]) == 2
            assert sum(case["commits_per_interval"]) == case["commits"]
            assert_summary(case["latency"], case["commits"], with_samples=False)
            assert figures[f"commit_{clients}"][broker] == case["commits_s"]
    for members in (1, 2):
        for broker in ("kcoord", "tansu"):
            assert_summary(raw[f"stable_{members}_delay_0"][broker], 1)
        # tansu has no initial rebalance delay: measured once, compared with every kcoord row.
        assert set(raw[f"stable_{members}_delay_3000"]) == {"kcoord"}
        assert_summary(raw[f"stable_{members}_delay_3000"]["kcoord"], 1)
        # group.initial.rebalance.delay.ms is honoured: the first rebalance waits for it.
        assert raw[f"stable_{members}_delay_3000"]["kcoord"]["median_ms"] >= 3000
    for broker in ("kcoord", "tansu"):
        failover = raw["failover"][broker]
        assert_summary(failover, 1)
        (round_,) = failover["rounds"]
        assert round_["members"] == 2
        assert round_["victim_owned"], "the killed member owned no partition"
    # kcoord notices a SIGKILLed member by its session timeout only, which ran from the
    # member's last heartbeat, at most one heartbeat interval before the kill.
    client = result["client"]
    (round_,) = raw["failover"]["kcoord"]["rounds"]
    assert round_["recovered_ms"] >= client["session_timeout_ms"] - client["heartbeat_interval_ms"]
