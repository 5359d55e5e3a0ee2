"""An isolated active controller never fences or elects anything (DESIGN section 9's lab)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kcoord.chaos.lab import namespace_name

pytestmark = pytest.mark.integration

# Node log lines written once per partition (left out of a failure's log tails).
_PER_PARTITION = ("loaded __consumer_offsets", "ISR is now", "created a log", "deleted the log")


def _lab_available() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: run scripts/setup-lab.sh"
    return None


def test_isolated_controller_never_fences_or_elects() -> None:
    missing = _lab_available()
    if missing is not None:
        pytest.fail(missing)  # make test installs the lab tools; missing ones are a failure
    seed = random.randrange(2**31)
    namespace = namespace_name(f"iso-{seed}")  # its owner is this process: not stale
    print(f"seed={seed} namespace={namespace}")
    root = Path(tempfile.mkdtemp(prefix="kcoord-lab-"))
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        subprocess.run(
            ["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"], check=True
        )
        result = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                namespace,
                sys.executable,
                "-m",
                "tests.integration.isolation_scenario",
                str(root),
            ],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        print(result.stdout)
        print(result.stderr[-5000:])
        if result.returncode != 0:
            for log in sorted(root.glob("node-*/node.log")):
                print(f"----- {log} -----")
                # Not the per-partition lines (150 of them at start-up and at the fencing):
                # the elections, terms and controller changes are what tell a failure.
                lines = log.read_text(errors="replace").splitlines()
                kept = [ln for ln in lines if not any(n in ln for n in _PER_PARTITION)]
                print("\n".join(kept[-60:]))
        assert result.returncode == 0, "the isolation scenario failed (output above)"
    finally:
        pids = subprocess.run(
            ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-9", pid], check=False)
        subprocess.run(["ip", "netns", "delete", namespace], check=False)
        shutil.rmtree(root, ignore_errors=True)
