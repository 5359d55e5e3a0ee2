"""Debian's real ``prometheus`` binary for the tests that check metrics through it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.portpick import free_ports

STOP_TIMEOUT_S = 20


def prometheus_binary(without: str) -> str:
    """The ``prometheus`` binary. Missing, the test fails where ``make test`` installs it (as
    root, with apt-get: scripts/setup-prometheus.sh), so that a broken install is not a quiet
    skip; elsewhere it skips, saying ``without``."""
    binary = shutil.which("prometheus")
    if binary is not None:
        return binary
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        pytest.fail("Debian's prometheus is missing, though make test installs it here as root")
    pytest.skip(f"Debian's prometheus is not installed: run make prometheus as root; {without}")


@contextlib.contextmanager
def running_prometheus(binary: str, config: Path, work: Path) -> Iterator[int]:
    """Prometheus with ``config``, its data and log under ``work``; yields its HTTP port and
    stops it afterwards."""
    [port] = free_ports(1)
    with open(work / "prometheus.log", "wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
