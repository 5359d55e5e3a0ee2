"""The chaos suite end to end, short: a real cluster in the lab, real clients, faults, checkers.

Part of the default test run (marked ``integration``, not ``chaos``: the long matrix is
``make chaos``). Each run is the ``kcoord chaos run`` command a user types, with a fixed seed
(printed) and its report in the test's temporary directory.

- both workloads pass under every nemesis together;
- a deliberately broken node (``--inject-bug ack-before-hw``: coordinator writes answered before
  the high watermark) fails the run, and the checkers name the anomaly: lost commits;
- so does one that appends every batch twice (``--inject-bug append-twice``): duplicates, whose
  copies the nodes' logs show under one producer session, so not a client's resends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcoord.chaos import lab

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 420
# librdkafka's eos debug lines that show an epoch bump or a new producer id, and why.
BUMP_FACILITIES = ("IDEMPSTATE", "NEWPID", "ERRSEQ", "FATAL")


def _lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the chaos lab needs root (network namespaces, iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: run `make lab`"
    return None


def chaos_run(report: Path, seed: int, *args: str) -> tuple[int, dict[str, Any], str]:
    cmd = [sys.executable, "-m", "kcoord.cli", "chaos", "run", "--report", str(report)]
    cmd += [*args, "--seed", str(seed)]
    print("running:", " ".join(cmd))
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
        )
    except BaseException:
        # A timeout kills ``chaos run`` alone: its lab namespace, with the nodes and clients in
        # it, would outlive the test. (A run that ends removes it itself; the first test checks.)
        # Its owner is dead now: it is stale, as any other left by a killed run.
        for name in lab.stale_namespaces():
            lab.Namespace(name).delete()
        raise
    output = proc.stdout + proc.stderr
    results = report / "results.json"
    summary = json.loads(results.read_text()) if results.exists() else {}
    return proc.returncode, summary, output


def anomalies(summary: dict[str, Any]) -> set[str]:
    return {
        name
        for result in summary.get("checkers", {}).values()
        for name, found in result.get("anomalies", {}).items()
        if found
    }


def why_it_failed(report: Path, summary: dict[str, Any], output: str) -> str:
    """The run's output, its anomalies' examples and its producers' epoch bumps: CI keeps only
    what a failed test prints, not the report directory."""
    found = {
        name: result.get("anomalies")
        for name, result in summary.get("checkers", {}).items()
        if not result.get("valid", True)
    }
    bumps = [
        f"{path.name}: {line}"
        for path in sorted((report / "work" / "clients").glob("producer-*.stderr"))
        for line in path.read_text(errors="replace").splitlines()
        if any(f"|{facility}|" in line for facility in BUMP_FACILITIES) or "bump" in line.lower()
    ]
    return "\n".join(
        [
            output[-4000:],
            "anomalies: " + json.dumps(found)[:6000],
            "producer epoch bumps:",
            *bumps[-30:],
        ]
    )


@pytest.mark.skipif(_lab_unavailable() is not None, reason=str(_lab_unavailable()))
@pytest.mark.parametrize(("workload", "seed"), [("groups", 11), ("queue", 12)])
def test_a_short_run_under_every_nemesis_passes(tmp_path: Path, workload: str, seed: int) -> None:
    print(f"seed {seed}")
    code, summary, output = chaos_run(
        tmp_path / "report",
        seed,
        "--workload",
        workload,
        "--nemesis",
        "kill,pause,partition,clients,latency,reset",
        "--duration",
        "30",
        "--interval",
        "3",
    )
    assert code == 0, why_it_failed(tmp_path / "report", summary, output)
    assert summary["valid"] and summary["faults"] >= 2, summary
    for name in ("history.jsonl", "results.json", "timeline.html"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    # Its own lab namespace is gone (other tests may have theirs up at the same time).
    listed = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
    namespaces = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    ours = f"{lab.NAMESPACE_PREFIX}{seed}-p"  # lab.namespace_name: the run's pid follows
    assert not [n for n in namespaces if n.startswith(ours)], namespaces


def broken_build_run(tmp_path: Path, bug: str, seed: int, *args: str) -> tuple[dict[str, Any], str]:
    """A run of nodes built with ``bug`` (``--inject-bug``): it must fail, on its checkers'
    verdict, not on an error of its own. Its summary and output."""
    print(f"seed {seed}")
    code, summary, output = chaos_run(tmp_path / "report", seed, *args, "--inject-bug", bug)
    assert code == 1, output[-4000:]
    assert summary["inject_bug"] == bug and not summary["error"], summary
    return summary, output


@pytest.mark.skipif(_lab_unavailable() is not None, reason=str(_lab_unavailable()))
def test_a_broken_build_fails_with_lost_commits(tmp_path: Path) -> None:
    summary, _ = broken_build_run(
        tmp_path,
        "ack-before-hw",
        3,
        "--workload",
        "groups",
        "--nemesis",
        "partition",
        "--partition-shapes",
        "coordinator",
        "--duration",
        "25",
        "--interval",
        "2",
    )
    assert "lost-commit" in anomalies(summary), summary["checkers"]


@pytest.mark.skipif(_lab_unavailable() is not None, reason=str(_lab_unavailable()))
def test_a_broken_build_fails_with_duplicates_not_taken_for_a_clients_resends(
    tmp_path: Path,
) -> None:
    # Nodes that append every batch twice: both copies under one producer session, which the
    # runner reads from the logs; the checker must not count them as librdkafka's resends.
    summary, output = broken_build_run(
        tmp_path,
        "append-twice",
        4,
        "--workload",
        "queue",
        "--nemesis",
        "kill",
        "--duration",
        "10",
        "--interval",
        "2",
    )
    queue = summary["checkers"]["queue"]
    assert queue["stats"]["anomaly_counts"].get("duplicate", 0) > 0, queue
    assert queue["stats"]["client_resends"] == 0, queue
    for example in queue["anomalies"]["duplicate"]:
        first, *others = example["sessions"]
        assert first is not None and all(s == first for s in others), example
    assert f"duplicate ({queue['stats']['anomaly_counts']['duplicate']})" in output
