"""Smoke test of ``bench/coordinator.py``: a tiny run against kcoord and tansu reports every figure.

Behaviour, not timing: the JSON has each figure for both brokers with one sample per round, the
ratio and a target for each, the SIGKILLed member owned partitions that the survivors then own,
and no process the benchmark started (kcoord nodes, tansu, member processes) outlives it. The
kcoord-only figures: commits with metrics on (``/metrics`` scraped) and off; a member joining a
group of 4 under the consumer protocol, classic eager and classic cooperative, where the group
ends with a valid assignment, eager revokes every member and the other two revoke no member that
keeps its partitions; commits with ``group.coordinator.append.linger.ms`` 0 and -1, groups spread
and on one ``__consumer_offsets`` partition, where every commit is one record appended, each
append alone with 0; commits on one node with replication factor 1.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration import bench_run
from tests.integration.bench_run import kill_matching

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 300.0
SEED = 11
JOIN_SIZE = 4
JOIN_PROTOCOLS = ("consumer", "eager", "cooperative")
BATCHING_CLIENTS = 4
BATCHING_LAYOUTS = ("spread", "one_partition")
SCRAPE_COST_ROUNDS = 30  # bench/coordinator.py's


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
    output = ""
    try:
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
                "--metrics-rounds", "1",
                "--join-sizes", str(JOIN_SIZE),
                "--join-rounds", "1",
                "--batching-clients", str(BATCHING_CLIENTS),
                "--batching-rounds", "1",
                "--seed", str(SEED),
                "--out", str(out),
                "--dir", str(tmp_path),
            ]
        )  # fmt: skip
        assert code == 0, output
    finally:
        # tansu is found by its port, which only the output says: after a timeout (output
        # unknown here) only the bench's own SIGTERM handling stopped it.
        port = re.search(r"starting tansu \(.*\) on 127\.0\.0\.1:(\d+)", output)
        leftovers = [
            *kill_matching("kcoord.node.cli", str(tmp_path.resolve())),
            *kill_matching("coordinator.py", "member", f"failover-{SEED:x}-"),
            *(kill_matching("tansu", f"tcp://127.0.0.1:{port.group(1)}") if port else []),
        ]
    assert port is not None, output
    assert leftovers == [], "processes outlived the bench"

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
    kcoord_only = {
        "metrics_cost",
        *(f"join_{JOIN_SIZE}_{p}" for p in JOIN_PROTOCOLS),
        *(f"batching_{layout}" for layout in BATCHING_LAYOUTS),
        "single_node_commit_1",
        "single_node_commit_2",
    }
    kcoord_targets = {
        "metrics_cost",
        f"join_{JOIN_SIZE}_consumer_unchanged_not_revoked",
        f"join_{JOIN_SIZE}_consumer_owned_heartbeats",
    }
    figures = result["figures"]
    assert set(figures) == expected | kcoord_only
    assert set(result["targets"]) == expected | kcoord_targets
    assert set(result["targets_met"]) == expected | kcoord_targets
    assert all(isinstance(met, bool) for met in result["targets_met"].values())
    for key in expected:
        figure = figures[key]
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
            # The clients' own CPU: one event loop, so at most about one core.
            assert 0 < case["client_cpu_cores"] < 1.5
            assert case["client_cpu_us_per_commit"] == pytest.approx(
                case["client_cpu_cores"] * case["seconds"] / case["commits"] * 1e6
            )
            # The broker's processes (kcoord's three nodes, or tansu) over the same window:
            # busy, and within the machine's cores (give or take a clock tick a process).
            assert 0 < case["node_cpu_cores"] < (os.cpu_count() or 1) + 0.1
            assert case["node_cpu_us_per_commit"] == pytest.approx(
                case["node_cpu_cores"] * case["seconds"] / case["commits"] * 1e6
            )
    ceiling = result["client_ceiling"]
    tansu_2 = raw["commit_2"]["tansu"]
    assert ceiling["client_cpu_us_per_commit"] == tansu_2["client_cpu_us_per_commit"]
    assert ceiling["commits_s"] == pytest.approx(1e6 / tansu_2["client_cpu_us_per_commit"])
    assert ceiling["ratio_to_tansu"] == pytest.approx(ceiling["commits_s"] / tansu_2["commits_s"])
    assert ceiling["required_ratio"] == 1.5
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
    assert_metrics_cost(result)
    assert_join(result)
    assert_batching(result)
    assert_single_node(result)


def assert_single_node(result: dict[str, Any]) -> None:
    """(g): case (a) on one node (replication factor 1), beside (a)'s figures."""
    raw, figures = result["raw"], result["figures"]
    for clients in (1, 2):
        case = raw[f"single_node_commit_{clients}"]["kcoord"]
        assert case["clients"] == clients
        assert all(n > 0 for n in case["per_client_commits"])
        figure = figures[f"single_node_commit_{clients}"]
        assert figure["one_node"] == case["commits_s"]
        assert figure["three_nodes"] == raw[f"commit_{clients}"]["kcoord"]["commits_s"]
        assert figure["tansu"] == raw[f"commit_{clients}"]["tansu"]["commits_s"]
        assert figure["ratio_to_tansu"] == pytest.approx(figure["one_node"] / figure["tansu"])


def assert_metrics_cost(result: dict[str, Any]) -> None:
    raw = result["raw"]["metrics_cost"]
    for label, status in (("on", 200), ("off", None)):
        (case,) = raw[label]["rounds"]
        assert case["metrics_enable"] == (label == "on")
        assert case["clients"] == 2 and all(n > 0 for n in case["per_client_commits"])
        assert raw[label]["median_commits_s"] == case["commits_s"]
        assert raw[label]["median_node_cpu_us_per_commit"] == case["node_cpu_us_per_commit"]
        scrapes = case["scrapes"]
        if status is None:
            assert scrapes["count"] == 0  # nothing to scrape: /metrics answers 404
        else:
            # Three nodes, once a second, over a run of more than one second.
            assert scrapes["count"] >= 6 and scrapes["statuses"] == [status]
            assert scrapes["median_bytes"] > 0
    cost = result["figures"]["metrics_cost"]
    assert cost["overhead"] == pytest.approx(cost["off"] / cost["on"] - 1)
    cpu = cost["node_cpu_us_per_commit"]
    assert cpu == {label: raw[label]["median_node_cpu_us_per_commit"] for label in ("on", "off")}
    assert cost["node_cpu_overhead"] == pytest.approx(cpu["on"] / cpu["off"] - 1)
    scrape = raw["scrape"]
    assert scrape["rounds"] == SCRAPE_COST_ROUNDS and scrape["nodes"] == 3
    assert scrape["cpu_s_per_round"] > 0  # three renders of a few hundred series each
    assert cost["scrape_cpu_ms_per_round"] == pytest.approx(scrape["cpu_s_per_round"] * 1000)
    assert cost["scrape_cpu_share"] == pytest.approx(
        scrape["cpu_s_per_round"] / raw["on"]["median_node_cpu_cores"]
    )
    target = result["targets"]["metrics_cost"]
    assert target["rule"] == "off/on - 1 < 0.05"
    assert result["targets_met"]["metrics_cost"] == (cost["overhead"] < 0.05)


def assert_join(result: dict[str, Any]) -> None:
    partitions = 2 * JOIN_SIZE
    assert result["join_client"]["library"] == "confluent-kafka"
    for protocol in JOIN_PROTOCOLS:
        case = result["raw"][f"join_{JOIN_SIZE}"][protocol]
        assert (case["members"], case["partitions"]) == (JOIN_SIZE, partitions)
        (round_,) = case["rounds"]
        members = round_["members"]
        assert len(members) == JOIN_SIZE + 1, protocol
        # The group ends with a valid assignment, the joiner's non-empty.
        after = [set(m["after"]) for m in members]
        assert all(after) and sum(map(len, after)) == partitions, (protocol, members)
        assert set().union(*after) == set(range(partitions)), (protocol, members)
        assert round_["joiner_partitions"], protocol
        assert 0 < round_["owned_ms"] <= round_["owned_all_ms"] <= round_["stable_ms"], protocol
        # Partitions gained are partitions lost: every move counts twice.
        gained = sum(len(m["gained"]) for m in members)
        assert gained == sum(len(m["lost"]) for m in members) > 0, protocol
        assert round_["partitions_moved"] == 2 * gained, protocol
        old = [m for m in members if m["name"] != round_["joiner"]]
        if protocol == "eager":
            # Every member gives up everything it owns, changed or not.
            assert all(sum(len(p) for _, p in m["revocations_ms"]) for m in old), members
            assert round_["partitions_revoked"] == partitions
        else:
            # Only the partitions that move are revoked; a member keeping its own is untouched.
            assert round_["unchanged_members"] > 0, members
            assert round_["unchanged_revoked"] == [], members
            assert round_["partitions_revoked"] == gained, members
    figure = result["figures"][f"join_{JOIN_SIZE}_consumer"]
    assert figure["heartbeat_interval_ms"] == result["params"]["join_heartbeat_interval_ms"]
    owned = result["targets"][f"join_{JOIN_SIZE}_consumer_owned_heartbeats"]
    assert owned["value"] == pytest.approx(figure["owned_ms"] / figure["heartbeat_interval_ms"])
    unchanged = result["targets"][f"join_{JOIN_SIZE}_consumer_unchanged_not_revoked"]
    assert unchanged["value"] == 0
    assert result["targets_met"][f"join_{JOIN_SIZE}_consumer_unchanged_not_revoked"] is True


def assert_batching(result: dict[str, Any]) -> None:
    assert result["kcoord"]["batching_lingers_ms"] == {"linger_0": 0, "adaptive": -1}
    for layout in BATCHING_LAYOUTS:
        raw = result["raw"][f"batching_{layout}"]
        for linger in ("linger_0", "adaptive"):
            (case,) = raw[linger]["rounds"]
            assert case["layout"] == layout
            assert case["clients"] == BATCHING_CLIENTS
            assert all(n > 0 for n in case["per_client_commits"]), case
            assert raw[linger]["median_commits_s"] == case["commits_s"]
            # Every commit, the untimed warm-up one of each client too, is one record, and
            # nothing else was written meanwhile.
            assert case["warmup_commits"] >= BATCHING_CLIENTS, case
            assert case["records_appended"] == case["commits"] + case["warmup_commits"], case
            if linger == "linger_0":
                assert case["batches_appended"] == case["records_appended"], case
            else:
                assert 0 < case["batches_appended"] <= case["records_appended"], case
            assert case["records_per_batch"] == pytest.approx(
                case["records_appended"] / case["batches_appended"]
            )
            if layout == "one_partition":
                assert case["offsets_partitions_used"] == 1
        figure = result["figures"][f"batching_{layout}"]
        assert figure["ratio"] == pytest.approx(figure["adaptive"] / figure["linger_0"])
        assert figure["records_per_batch"]["linger_0"] == 1.0
    assert result["params"]["batching_clients"] == BATCHING_CLIENTS
