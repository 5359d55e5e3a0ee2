"""``kcoord cluster up`` in the foreground (what ``make up`` runs): ready, then Ctrl-C stops all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kcoord.node import launcher
from tests.integration.cluster import free_base_port

pytestmark = pytest.mark.integration


def _kcoord_out(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "kcoord.node.cli", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout


def test_foreground_cluster_up_and_ctrl_c(tmp_path: Path) -> None:
    base = free_base_port(3)
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kcoord.node.cli",
            "cluster",
            "up",
            "--nodes",
            "3",
            "--base-port",
            str(base),
            "--data-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if "running in the foreground" in line:
                    break
            else:
                pytest.fail("cluster up ended before it was ready:\n" + "".join(lines))
            output = "".join(lines)
            assert f"bootstrap servers: 127.0.0.1:{base},127.0.0.1:{base + 10}" in output
            state = json.loads((tmp_path / launcher.STATE_FILE).read_text())
            pids = [n["pid"] for n in state["nodes"]]
            assert all(launcher.is_alive(p) for p in pids)
            status = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kcoord.node.cli",
                    "cluster",
                    "status",
                    "--json",
                    "--data-dir",
                    str(tmp_path),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            report = json.loads(status.stdout)
            roles = sorted(n["role"] for n in report["nodes"])
            assert roles == ["broker", "broker", "controller"], report
            controller = next(n["node_id"] for n in report["nodes"] if n["role"] == "controller")
            # kafka-metadata-quorum.sh's views, through a follower's Kafka listener.
            follower = next(n for n in report["nodes"] if n["role"] == "broker")
            summary = _kcoord_out("quorum", "describe", "--bootstrap-server", follower["kafka"])
            fields = dict(line.split(":", 1) for line in summary.splitlines())
            assert int(fields["LeaderId"]) == controller
            assert fields["CurrentVoters"].strip() == "[1,2,3]"
            assert int(fields["HighWatermark"]) > 0
            rows = _kcoord_out(
                "quorum", "describe", "--bootstrap-server", follower["kafka"], "--replication"
            ).splitlines()
            assert rows[0].split() == [
                "NodeId",
                "LogEndOffset",
                "Lag",
                "LastFetchTimestamp",
                "LastCaughtUpTimestamp",
                "Status",
            ]
            statuses = {int(r.split()[0]): r.split()[-1] for r in rows[1:]}
            assert statuses == {n: "Leader" if n == controller else "Follower" for n in (1, 2, 3)}
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, rest
        assert "stopped" in rest
        for pid in pids:
            assert not launcher.is_alive(pid), f"node process {pid} still running"
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
