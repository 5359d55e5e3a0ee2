"""The chaos lab's partitions cut the links they name and nothing else (chaos/lab.py)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from kcoord.chaos.lab import LabError, check_lab, namespace, namespace_name
from tests.integration.firewall_scenario import NODES

pytestmark = pytest.mark.integration


def test_a_cut_drops_only_the_named_links_and_clients_still_reach_every_node() -> None:
    try:
        check_lab()
    except LabError as e:
        pytest.fail(str(e))  # make test installs the lab tools; missing ones are a failure
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    with namespace(namespace_name(f"fw-{seed}"), [n.gid for n in NODES.values()]) as ns:
        result = subprocess.run(
            ns.exec_argv([sys.executable, "-m", "tests.integration.firewall_scenario"]),
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    print(result.stdout)
    assert result.returncode == 0, result.stderr[-5000:]
