"""chaos/lab.py without namespaces: run names carry their owner, and ``clean`` removes only
the namespaces whose owner is gone (a second run of a seed deleted the first's, and
``clean`` the live runs')."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from kcoord.chaos import lab


def test_a_namespace_name_carries_its_owner() -> None:
    name = lab.namespace_name("7")
    assert name == f"kcoord-lab-7-p{os.getpid()}"
    assert lab.owner_of(name) == os.getpid()
    assert lab.owner_of("kcoord-lab-7") is None
    assert lab.owner_of("kcoord-lab-fw-9-pX") is None


def test_only_namespaces_of_dead_owners_are_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    listed = "\n".join(
        [
            f"kcoord-lab-1-p{os.getpid()} (id: 3)",  # a live run's
            f"kcoord-lab-1-p{dead.pid}",  # a killed run's
            "kcoord-lab-2",  # an older naming: no owner to ask
            "someone-else",
        ]
    )

    def run(*argv: str, check: bool = True) -> Any:
        assert argv == ("ip", "netns", "list")
        return subprocess.CompletedProcess(argv, 0, listed, "")

    monkeypatch.setattr(lab, "_run", run)
    assert lab.stale_namespaces() == [f"kcoord-lab-1-p{dead.pid}", "kcoord-lab-2"]


def test_the_firewall_refuses_to_run_outside_a_lab_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its heal flushes OUTPUT: run on the host, it would flush the host's chain."""

    def run(*argv: str, check: bool = True) -> Any:
        assert argv[:3] == ("ip", "netns", "identify"), argv
        return subprocess.CompletedProcess(argv, 0, "\n", "")

    monkeypatch.setattr(lab, "_run", run)
    with pytest.raises(lab.LabError, match="inside a lab namespace only"):
        lab.Firewall({1: lab.LabNode(1, "127.0.0.1", 43001)})
