"""A failing data directory halts the node (``node/log_dir_failure.py``), as Kafka's
``LogManager.handleLogDirFailure`` halts a broker whose last log directory failed.

The disk is made to fail for real where a write goes through ``os``: a full disk (ENOSPC) after
a short write, which leaves a torn tail in the segment file. The halt is recorded instead of
leaving the process."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
from pathlib import Path

import pytest

from kcoord.errors import Errors
from kcoord.node.log_dir_failure import EXIT_CODE, LogDirFailureChannel
from kcoord.node.log_maintenance import LogMaintenance, MaintenanceConfig
from kcoord.node.replica_manager import KafkaError
from kcoord.node.server import OPEN_FILES_CAP, raise_open_files_limit
from kcoord.storage import checkpoint
from kcoord.storage.manager import LogManager
from tests.unit.node.test_replication import Node, _start
from tests.unit.storage.helpers import read_all


class Halts:
    def __init__(self) -> None:
        self.codes: list[int] = []

    def channel(self, log_dir: Path) -> LogDirFailureChannel:
        return LogDirFailureChannel(log_dir, halt=self.codes.append)


class FullDisk:
    """Once ``full``, the next segment write stores half its bytes (a short write, as on a disk
    that fills up midway) and every later one fails with ENOSPC."""

    def __init__(self) -> None:
        self.full = False
        self.torn = False

    def write(self, fd: int, data: bytes, offset: int) -> int:
        if not self.full:
            return REAL_PWRITE(fd, data, offset)
        if not self.torn:
            self.torn = True
            return REAL_PWRITE(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


REAL_PWRITE = os.pwrite


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    disk = FullDisk()
    monkeypatch.setattr(os, "pwrite", disk.write)
    monkeypatch.setattr(
        os, "pwritev", lambda fd, buffers, offset: disk.write(fd, b"".join(buffers), offset)
    )
    return disk


def test_the_channel_logs_kafkas_lines_and_halts_with_exit_code_1(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    halts = Halts()
    channel = halts.channel(tmp_path)
    with caplog.at_level(logging.WARNING, logger="kcoord.node.log_dir_failure"):
        channel.fail("appending to t-0", OSError(errno.EIO, "Input/output error"))
    assert halts.codes == [EXIT_CODE] == [1]
    assert f"Stopping serving logs in dir {tmp_path}" in caplog.text
    assert "appending to t-0: [Errno 5] Input/output error" in caplog.text
    assert f"Shutdown node because all log dirs in {tmp_path} have failed" in caplog.text
    assert [r.levelname for r in caplog.records] == ["WARNING", "CRITICAL"]


def test_a_leader_whose_disk_is_full_halts_and_recovery_cuts_the_torn_tail(
    tmp_path: Path, disk: FullDisk, caplog: pytest.LogCaptureFixture
) -> None:
    """The append that fails is answered KAFKA_STORAGE_ERROR (a node that halts answers
    nothing); what it tore off is not in the log, and a reopen without a clean shutdown (the
    restart after the halt) recovers exactly the appends that returned."""
    halts = Halts()
    cluster: dict[int, Node] = {}
    leader = Node(1, tmp_path / "node-1", cluster)
    Node(2, tmp_path / "node-2", cluster)
    _start(cluster)
    leader.replicas.log_dir_failure = halts.channel(tmp_path / "node-1")
    for i in range(3):
        leader.produce(b"kept-%d" % i)
    end = leader.partition.log.log_end_offset

    disk.full = True
    with caplog.at_level(logging.WARNING, logger="kcoord.node.log_dir_failure"):
        for attempt in range(2):  # the short write, then ENOSPC
            with pytest.raises(KafkaError) as raised:
                leader.produce(b"torn-%d" % attempt)
            assert raised.value.code is Errors.KAFKA_STORAGE_ERROR
    assert halts.codes == [1, 1]
    # The short write is retried for the rest, which fails with the reason.
    stopping = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(stopping) == 2
    assert all("No space left on device" in message for message in stopping)
    assert leader.partition.log.log_end_offset == end
    segment = leader.partition.log.segments[-1]
    assert segment.log_path.stat().st_size > segment.size  # the torn tail is on disk

    # After the halt there was no clean shutdown: the next start recovers the segment.
    disk.full = False
    reopened = LogManager(tmp_path / "node-1")
    reopened.open()
    assert not reopened.had_clean_shutdown
    recovered = reopened.get_log(("replicated", 0))
    assert recovered is not None
    assert [r.value for r in read_all(recovered)] == [b"kept-0", b"kept-1", b"kept-2"]
    assert recovered.log_end_offset == end


def test_a_follower_that_cannot_append_fetched_data_halts(tmp_path: Path, disk: FullDisk) -> None:
    halts = Halts()

    async def scenario() -> None:
        cluster: dict[int, Node] = {}
        leader, follower = (Node(n, tmp_path / f"node-{n}", cluster) for n in (1, 2))
        _start(cluster)
        follower.replicas.log_dir_failure = halts.channel(tmp_path / "node-2")
        leader.produce(b"first")
        disk.full = True  # the leader's append below is done; the follower's write fails
        await follower.fetch_once()
        assert halts.codes == [1]
        assert follower.partition.log.log_end_offset == 0

    asyncio.run(scenario())


def test_housekeeping_that_cannot_write_halts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    halts = Halts()
    logs = LogManager(tmp_path)
    logs.open()
    maintenance = LogMaintenance(
        logs, dict, lambda: 0, MaintenanceConfig(), halts.channel(tmp_path)
    )

    def failing(*args: object) -> int:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(logs, "retention_pass", failing)
    assert asyncio.run(maintenance.enforce_retention()) == 0
    monkeypatch.setattr(checkpoint, "write_offsets", failing)  # on the checkpoint thread
    asyncio.run(maintenance.checkpoint_recovery_points())
    assert halts.codes == [1, 1]


def test_a_node_raises_its_open_files_limit_to_the_hard_limit() -> None:
    """Three open files per partition replica: the usual soft limit of 1024 would halt a node
    hosting a few hundred replicas (EMFILE is a log directory failure)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        before, after = raise_open_files_limit()
        expected = OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_CAP)
        assert (before, after) == (256, expected)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)
        assert raise_open_files_limit() == (expected, expected)  # nothing left to raise
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
