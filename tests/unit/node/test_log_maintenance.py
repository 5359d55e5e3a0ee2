"""The node's log housekeeping (``node/log_maintenance.py``) over a real ``LogManager``:
retention below each hosted replica's high watermark, the cleaner on a worker thread picking
the dirtiest compacted log, a corrupt log set aside, and recovery-point checkpoints."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kcoord.node import log_maintenance
from kcoord.node.log_dir_failure import EXIT_CODE, LogDirFailureChannel
from kcoord.node.log_maintenance import LogMaintenance, MaintenanceConfig
from kcoord.storage import checkpoint
from kcoord.storage import log as storage_log
from kcoord.storage.config import LogConfig
from kcoord.storage.manager import LogManager, TopicPartition
from tests.unit.storage.helpers import batch, read_all

COMPACTED = LogConfig(segment_bytes=600, cleanup_policy=frozenset({"compact"}))
EXPIRING = LogConfig(segment_bytes=1_000, retention_ms=10_000)
OFFSETS: TopicPartition = ("__consumer_offsets", 3)
EVENTS: TopicPartition = ("events", 0)


class Node:
    """A LogManager with two hosted partitions, their HWs and a settable clock."""

    def __init__(self, root: Path) -> None:
        self.logs = LogManager(root, LogConfig())
        self.logs.open()
        self.offsets = self.logs.get_or_create_log(OFFSETS, COMPACTED)
        self.events = self.logs.get_or_create_log(EVENTS, EXPIRING)
        self.hws: dict[TopicPartition, int] = {}
        self.now = 0
        self.maintenance = LogMaintenance(
            self.logs, lambda: self.hws, lambda: self.now, MaintenanceConfig()
        )

    def commit_offsets(self, count: int, groups: int) -> None:
        for i in range(count):
            key = f"group-{i % groups}".encode()
            self.offsets.append_as_leader(batch(1, key=key, value=f"{i}".encode()), 0, 0)
        self.hws[OFFSETS] = self.offsets.log_end_offset


def test_a_retention_pass_lets_the_loop_serve_between_logs(tmp_path: Path) -> None:
    """Each log that deletes fsyncs its epoch checkpoint (an idle one rolls first): a pass
    over hundreds of such logs held the event loop for every fsync in one go, every request
    waiting. The loop now runs other work after each log that deleted segments."""
    logs = LogManager(tmp_path, EXPIRING)
    logs.open()
    hws: dict[TopicPartition, int] = {}
    for p in range(5):
        lg = logs.get_or_create_log(("idle", p), EXPIRING)
        for i in range(8):
            lg.append_as_leader(batch(1, timestamp=i * 1_000, value=b"x" * 300), 0, 0)
        hws[("idle", p)] = lg.log_end_offset
    # A copy at each call, as ReplicaManager.high_watermarks makes.
    maintenance = LogMaintenance(logs, lambda: dict(hws), lambda: 60_000, MaintenanceConfig())
    served: list[int] = []

    async def go() -> int:
        async def other_work() -> None:
            while True:
                served.append(maintenance.stats.segments_deleted)
                if len(served) == 2:  # a follower truncated meanwhile: its HW went down
                    hws[("idle", 4)] = 0
                await asyncio.sleep(0)

        worker = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        served.clear()
        try:
            return await maintenance.enforce_retention()
        finally:
            worker.cancel()

    deleted = asyncio.run(go())
    assert deleted >= 4 * 2
    assert len(served) >= 4  # between the logs, not only after the pass
    assert all(len(logs.logs[("idle", p)].segments) == 1 for p in range(4))
    # The HW read again after a turn of the loop, not the one the pass started with.
    assert logs.logs[("idle", 4)].log_start_offset == 0
    assert checkpoint.read_offsets(tmp_path / checkpoint.LOG_START_OFFSET_CHECKPOINT) == {
        ("idle", p): logs.logs[("idle", p)].log_start_offset for p in range(5)
    }


def test_a_retention_pass_that_fails_is_tried_again_at_the_next_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's scheduler logs a failed task and runs it at its next period; an exception other
    than OSError ended the task, and retention stopped until the node restarted."""
    node = Node(tmp_path)
    node.maintenance.config = MaintenanceConfig(
        initial_task_delay_ms=0, retention_check_interval_ms=1
    )
    calls: list[int] = []
    real = node.logs.retention_pass

    def flaky(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return real(*args)

    monkeypatch.setattr(node.logs, "retention_pass", flaky)

    async def go() -> None:
        task = asyncio.create_task(node.maintenance.run_retention())
        try:
            async with asyncio.timeout(10):
                while len(calls) < 3:
                    await asyncio.sleep(0.001)
            assert not task.done()
        finally:
            task.cancel()

    asyncio.run(go())


def test_retention_deletes_expired_segments_below_the_high_watermark(tmp_path: Path) -> None:
    node = Node(tmp_path)
    for i in range(20):
        node.events.append_as_leader(batch(1, timestamp=i * 1_000, value=b"x" * 200), 0, 0)
    node.now = 30_000  # every closed segment is past retention.ms
    node.hws[EVENTS] = 0
    assert asyncio.run(node.maintenance.enforce_retention()) == 0  # nothing below the HW yet
    node.hws[EVENTS] = node.events.log_end_offset
    assert asyncio.run(node.maintenance.enforce_retention()) > 0
    assert len(node.events.segments) == 1
    start = node.events.log_start_offset
    assert start > 0
    saved = checkpoint.read_offsets(tmp_path / checkpoint.LOG_START_OFFSET_CHECKPOINT)
    assert saved[EVENTS] == start
    assert node.maintenance.stats.segments_deleted > 0


def test_the_cleaner_compacts_on_a_worker_thread_and_then_rests(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.commit_offsets(100, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset

    async def passes() -> tuple[TopicPartition | None, TopicPartition | None]:
        return await node.maintenance.clean_filthiest(), await node.maintenance.clean_filthiest()

    first, second = asyncio.run(passes())
    assert first == OFFSETS
    assert second is None  # nothing dirty is left
    latest = {r.key: r.value for r in read_all(node.offsets)}
    assert latest == {f"group-{i % 3}".encode(): f"{i}".encode() for i in range(97, 100)}
    assert len(read_all(node.offsets)) == 3
    assert node.maintenance.stats.cleaned.records_kept == 3


def test_the_cleaner_maps_at_most_its_capacity_of_keys_a_pass(tmp_path: Path) -> None:
    """``log.cleaner.dedupe.buffer.size`` bounds the keys a pass maps: with room for two of
    three groups, each pass cleans below where the third turned up, and passes in a row get
    the log to one record per group."""
    node = Node(tmp_path)
    node.maintenance = LogMaintenance(
        node.logs, lambda: node.hws, lambda: node.now, MaintenanceConfig(cleaner_map_capacity=2)
    )
    # Every pass that has anything dirty left, whatever its share.
    node.offsets.config = replace(COMPACTED, min_cleanable_dirty_ratio=0.0)
    node.commit_offsets(30, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset

    async def passes() -> list[int]:
        dirty_from = []
        while await node.maintenance.clean_filthiest() == OFFSETS:
            dirty_from.append(node.offsets.first_dirty_offset)
        return dirty_from

    dirty_from = asyncio.run(passes())
    assert dirty_from[0] == 2  # group-0 and group-1 mapped; group-2's commit is the third key
    assert dirty_from == sorted(dirty_from) and dirty_from[-1] == 30
    assert [(r.key, r.value) for r in read_all(node.offsets)] == [
        (f"group-{i % 3}".encode(), f"{i}".encode()) for i in range(27, 30)
    ]


def test_a_corrupt_compacted_log_is_set_aside_not_retried(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.commit_offsets(100, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset
    first = node.offsets.segments[0]
    with open(first.log_path, "r+b") as f:
        f.seek(first.size // 2)
        byte = f.read(1)
        f.seek(first.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert asyncio.run(node.maintenance.clean_filthiest()) is None
    assert node.maintenance.uncleanable == {OFFSETS}
    assert node.logs.filthiest(0, node.hws, node.maintenance.uncleanable) is None
    assert not list((tmp_path / "__consumer_offsets-3").glob("*.cleaned"))
    # Its log gone and a new one in its place (moved away and back, its topic created again):
    # cleanable again (LogCleanerManager.maintainUncleanablePartitions); it stayed set aside.
    node.logs.delete_log(OFFSETS)
    fresh = node.logs.get_or_create_log(OFFSETS, node.offsets.config)
    for i in range(30):
        fresh.append_as_leader(batch(1, key=b"k", value=f"{i}".encode()), 0, 0)
    fresh.roll()
    node.hws[OFFSETS] = fresh.log_end_offset
    assert asyncio.run(node.maintenance.clean_filthiest()) == OFFSETS
    assert node.maintenance.uncleanable == set()


def test_recovery_points_are_checkpointed(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.commit_offsets(50, groups=2)
    node.offsets.roll()  # a roll flushes: the recovery point moves
    asyncio.run(node.maintenance.checkpoint_recovery_points())
    saved = checkpoint.read_offsets(tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT)
    assert saved[OFFSETS] == node.offsets.recovery_point > 0


def hold_fsyncs_off_the_main_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, set[str]]:
    """A disk that stalls for the worker threads: their fsyncs wait for the event returned,
    and the set returned gathers those threads' names; the main thread's go through."""
    release = threading.Event()
    threads: set[str] = set()
    real_fsync = os.fsync

    def held(fd: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            threads.add(threading.current_thread().name)
            assert release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", held)
    return release, threads


def test_the_periodic_checkpoints_are_written_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recovery points' and the high watermarks' checkpoints (Kafka's scheduler tasks)
    are written on the checkpoint thread: their fsyncs held up by a stalled disk hold up
    neither the event loop nor the appends."""
    node = Node(tmp_path)
    node.commit_offsets(50, groups=2)  # rolls: the recovery point moves
    release, writers = hold_fsyncs_off_the_main_thread(monkeypatch)

    async def go() -> None:
        points = asyncio.create_task(node.maintenance.checkpoint_recovery_points())
        hws = asyncio.create_task(
            node.maintenance.write_checkpoint(node.logs.high_watermarks_snapshot(node.hws))
        )
        async with asyncio.timeout(10):
            while not writers:
                await asyncio.sleep(0.01)  # polling for the checkpoint thread
        node.commit_offsets(5, groups=2)  # the loop goes on, and appends
        assert not points.done() and not hws.done()
        release.set()
        await asyncio.gather(points, hws)
        await node.maintenance.close()

    asyncio.run(go())
    assert writers and all(n.startswith("checkpoint") for n in writers)
    saved = checkpoint.read_offsets(tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT)
    assert saved[OFFSETS] == node.offsets.recovery_point > 0
    assert node.logs.read_high_watermarks() == {OFFSETS: 50}


def test_a_roll_fsyncs_off_the_event_loop_and_then_moves_the_recovery_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's roll schedules its fsyncs ("flush-log"): here an fsync held up on the worker
    thread holds up neither the append that rolled nor the ones after it."""
    node = Node(tmp_path)
    node.logs.flush_rolled = node.maintenance.flush_later
    release, flusher_threads = hold_fsyncs_off_the_main_thread(monkeypatch)

    async def go() -> None:
        node.commit_offsets(50, groups=2)  # several rolls of 600-byte segments
        rolled_at = node.offsets.segments[-1].base_offset
        assert rolled_at > 0
        node.commit_offsets(5, groups=2)  # the loop is not held up
        assert node.offsets.recovery_point == 0
        release.set()
        async with asyncio.timeout(10):
            while node.offsets.recovery_point < rolled_at:
                await asyncio.sleep(0.01)  # polling for the worker thread
        assert node.offsets.recovery_point == rolled_at
        await node.maintenance.close()

    asyncio.run(go())
    assert flusher_threads and all(n.startswith("log-flush") for n in flusher_threads)


def test_past_its_queue_a_roll_fsyncs_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each queued roll holds its files' descriptors, and a retention pass may roll every idle
    partition at once: past ``MAX_PENDING_ROLL_FLUSHES`` a roll fsyncs on the loop, and the
    recovery point still waits for the rolls queued before it."""
    monkeypatch.setattr(log_maintenance, "MAX_PENDING_ROLL_FLUSHES", 1)
    node = Node(tmp_path)
    node.logs.flush_rolled = node.maintenance.flush_later
    release = threading.Event()
    real_fsync = os.fsync
    on_the_loop: list[int] = []

    def held_on_the_worker(fd: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            assert release.wait(10)
        else:
            on_the_loop.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", held_on_the_worker)

    async def go() -> None:
        offsets = node.offsets
        while len(offsets.segments) < 3:  # the first roll queued, the second on the loop
            offsets.append_as_leader(batch(1, key=b"k", value=b"v" * 100), 0, 0)
        assert on_the_loop  # the second's fsyncs are done, on the loop
        assert offsets.recovery_point == 0  # the first's are not
        release.set()
        last_rolled = offsets.segments[-1].base_offset
        async with asyncio.timeout(10):
            while offsets.recovery_point < last_rolled:
                await asyncio.sleep(0.01)  # polling for the worker thread
        await node.maintenance.close()

    asyncio.run(go())


def test_a_rolled_flush_that_fails_on_disk_halts_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path)
    node.logs.flush_rolled = node.maintenance.flush_later
    halted: list[int] = []
    node.maintenance.log_dir_failure = LogDirFailureChannel(tmp_path, halt=halted.append)

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    async def go() -> None:
        monkeypatch.setattr(os, "fsync", failing)
        node.commit_offsets(50, groups=2)
        async with asyncio.timeout(10):
            while not halted:
                await asyncio.sleep(0.01)  # polling for the worker thread
        monkeypatch.undo()
        await node.maintenance.close()

    asyncio.run(go())
    assert halted[0] == EXIT_CODE
    assert node.offsets.recovery_point == 0


def test_files_let_go_are_removed_off_the_event_loop(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.logs.remove = node.maintenance.remove_later
    for i in range(20):
        node.events.append_as_leader(batch(1, timestamp=i * 1_000, value=b"x" * 200), 0, 0)
    node.hws[EVENTS] = node.events.log_end_offset
    node.now = 30_000

    async def go() -> None:
        remover = asyncio.create_task(node.maintenance.run_file_removal())
        try:
            assert await node.maintenance.enforce_retention() > 0
            node.logs.delete_log(OFFSETS)
            queued = list(node.maintenance._to_remove)
            assert queued and all(p.exists() for p in queued)  # renamed, not yet removed
            async with asyncio.timeout(10):
                while any(p.exists() for p in queued):
                    await asyncio.sleep(0.01)  # polling for the worker thread
        finally:
            remover.cancel()

    asyncio.run(go())
    assert not list(tmp_path.glob("events-0/*.deleted"))
    assert not list(tmp_path.glob("*-delete"))
    assert node.events.log_start_offset > 0


def test_a_swap_that_fails_on_disk_halts_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename or directory sync failing half-way through the swap left the log pointing at
    closed segments, and the node went on until the next pass read them; Kafka's cleaner hands
    the swap's IOException to the LogDirFailureChannel too."""
    node = Node(tmp_path)
    node.commit_offsets(100, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset
    halted: list[int] = []
    node.maintenance.log_dir_failure = LogDirFailureChannel(tmp_path, halt=halted.append)

    def failing(path: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoint, "fsync_dir", failing)
    assert asyncio.run(node.maintenance.clean_filthiest()) is None
    assert halted == [EXIT_CODE]


def test_closing_waits_for_a_cleaning_pass_in_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling the cleaner task does not stop its thread: the stop then closed segments the
    pass was still reading. ``close`` waits for the pass (Kafka joins its cleaner threads)."""
    node = Node(tmp_path)
    node.commit_offsets(100, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset
    entered, release = threading.Event(), threading.Event()
    clean = type(node.offsets).clean

    def slow_clean(lg: Any, plan: Any, pause: Any = None, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return clean(lg, plan, **kwargs)

    monkeypatch.setattr(type(node.offsets), "clean", slow_clean)

    async def scenario() -> None:
        cleaning = asyncio.create_task(node.maintenance.clean_filthiest())
        await asyncio.to_thread(entered.wait, 30)
        cleaning.cancel()
        closing = asyncio.create_task(node.maintenance.close())
        await asyncio.sleep(0.05)  # give close a chance to return early (it must not)
        assert not closing.done()
        release.set()
        await asyncio.wait_for(closing, 30)

    asyncio.run(scenario())
    node.logs.shutdown()


def test_a_pass_under_way_gives_up_when_the_node_stops(tmp_path: Path) -> None:
    """A long pass held a stop past the launcher's grace (then SIGKILL): once ``close`` is
    called the pass ends at its next batch and drops its copies (Kafka's checkDone)."""
    node = Node(tmp_path)
    node.commit_offsets(100, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset

    async def scenario() -> TopicPartition | None:
        node.maintenance._closing = True  # as close() sets it while a pass runs
        return await node.maintenance.clean_filthiest()

    assert asyncio.run(scenario()) is None
    assert node.maintenance.stats.cleaner_aborted == 1
    assert not list(tmp_path.glob("*/*.cleaned"))
    assert len(read_all(node.offsets)) == 100  # untouched
    asyncio.run(node.maintenance.close())
    node.logs.shutdown()


def test_a_log_the_cleaner_fails_on_is_set_aside_and_the_others_are_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaning error other than corruption (a record the cleaner cannot rebuild) was taken
    for "the log changed meanwhile": never set aside, the log stayed the dirtiest, was picked
    on every pass, and no other compacted log, ``__consumer_offsets`` included, was cleaned
    again (LogCleaner's markPartitionUncleanable sets aside that log alone)."""
    node = Node(tmp_path)
    poisoned: TopicPartition = ("compacted-data", 0)
    data = node.logs.get_or_create_log(poisoned, COMPACTED)
    for i in range(200):
        data.append_as_leader(batch(1, key=f"k{i % 2}".encode(), value=b"x" * 40), 0, 0)
    data.roll()
    node.hws[poisoned] = data.log_end_offset
    node.commit_offsets(100, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset
    clean = type(data).clean

    def failing_clean(lg: Any, *args: Any, **kwargs: Any) -> Any:
        if lg is data:
            raise ValueError("record offsets must increase: 0 after 0")
        return clean(lg, *args, **kwargs)

    monkeypatch.setattr(type(data), "clean", failing_clean)

    async def passes() -> list[TopicPartition | None]:
        return [await node.maintenance.clean_filthiest() for _ in range(3)]

    assert sorted(map(str, asyncio.run(passes()))) == sorted(map(str, [None, None, OFFSETS]))
    assert node.maintenance.uncleanable == {poisoned}
    assert node.maintenance.stats.cleaner_failed == 1
    node.commit_offsets(100, groups=3)  # dirty again: cleaned on the next pass
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset
    assert asyncio.run(node.maintenance.clean_filthiest()) == OFFSETS


def test_a_cleaning_pass_ending_after_its_task_was_cancelled_leaves_no_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop cancels the cleaner's task; a pass past its last pause ends all the same, its
    result in a cancelled future: its cleaned copies, swapped in by nobody, stayed on disk
    and open until the next start (a second copy of __consumer_offsets; found by a review).
    close() deletes them."""
    node = Node(tmp_path)
    node.commit_offsets(100, groups=3)
    node.offsets.roll()
    node.hws[OFFSETS] = node.offsets.log_end_offset
    past_last_pause, release = threading.Event(), threading.Event()
    groups = storage_log._groups_for_cleaning

    def held(*args: Any) -> Any:
        yield from groups(*args)
        past_last_pause.set()  # every group written: no pause() left
        release.wait(10)

    monkeypatch.setattr(storage_log, "_groups_for_cleaning", held)

    async def stop() -> None:
        cleaner = asyncio.create_task(node.maintenance.run_cleaner())
        await asyncio.to_thread(past_last_pause.wait, 10)
        cleaner.cancel()  # Node._stop_tasks
        await asyncio.wait([cleaner])
        closing = asyncio.create_task(node.maintenance.close())
        release.set()
        await closing

    asyncio.run(stop())
    assert node.maintenance.stats.cleaner_cleaned == 0
    assert sorted(p.name for p in tmp_path.glob("*/*.cleaned*")) == []
    node.logs.shutdown()


def test_close_waits_for_a_removal_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleted files were removed on asyncio's default executor: cancelling the removal task
    at the stop left the thread unlinking after the node had closed its logs and released
    its data directory (found by a review). The remover has its own thread, which close()
    waits for."""
    node = Node(tmp_path)
    started, release = threading.Event(), threading.Event()
    removed: list[Path] = []

    def slow_remove(paths: list[Path]) -> None:
        started.set()
        release.wait(10)
        removed.extend(paths)

    monkeypatch.setattr(log_maintenance, "remove_now", slow_remove)

    async def stop() -> None:
        removal = asyncio.create_task(node.maintenance.run_file_removal())
        node.maintenance.remove_later([tmp_path / "gone.deleted"])
        await asyncio.to_thread(started.wait, 10)
        removal.cancel()  # Node._stop_tasks
        await asyncio.wait([removal])
        remover = node.maintenance._remover
        waiting = threading.Event()
        shutdown = remover.shutdown

        def watched(wait: bool = True, **kwargs: Any) -> None:
            waiting.set()  # close() waits for the remover's thread
            shutdown(wait, **kwargs)

        monkeypatch.setattr(remover, "shutdown", watched)
        closing = asyncio.create_task(node.maintenance.close())
        await asyncio.to_thread(waiting.wait, 10)
        assert not closing.done() and removed == []
        release.set()
        await closing
        assert removed == [tmp_path / "gone.deleted"]

    asyncio.run(stop())
    node.logs.shutdown()
