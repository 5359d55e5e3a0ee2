"""Debian's real ``prometheus`` binary for the tests that check metrics through it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.portpick import free_ports

STOP_TIMEOUT_S = 20


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
