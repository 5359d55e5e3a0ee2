"""The LogManager: many partitions, checkpoints, clean and unclean restarts, bad partitions."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from kcoord.storage import checkpoint
from kcoord.storage import format as fmt
from kcoord.storage.config import LogConfig
from kcoord.storage.log import Log
from kcoord.storage.manager import CLEAN_SHUTDOWN_FILE, LogManager
from tests.unit.storage.helpers import batch, read_all

CONFIG = LogConfig(segment_bytes=1_000, index_interval_bytes=100)


def _filled(data_dir: Path) -> LogManager:
    mgr = LogManager(data_dir, CONFIG)
    mgr.open()
    for p in range(3):
        lg = mgr.get_or_create_log(("orders", p), topic_id="AAAAAAAAAAAAAAAAAAAAAA")
        for _ in range(10 * (p + 1)):
            lg.append_as_leader(batch(2, value=b"x" * 50), leader_epoch=1, now_ms=0)
    mgr.get_or_create_log(("my-topic-with-dashes", 12))
    return mgr


def test_clean_shutdown_and_reopen(tmp_path: Path) -> None:
    mgr = _filled(tmp_path)
    mgr.write_high_watermarks({("orders", 0): 20})
    mgr.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    points = checkpoint.read_offsets(tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT)
    assert points == {
        ("orders", 0): 20,
        ("orders", 1): 40,
        ("orders", 2): 60,
        ("my-topic-with-dashes", 12): 0,
    }
    again = LogManager(tmp_path, CONFIG)
    again.open()
    assert again.had_clean_shutdown and not again.recovery_reports
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert {tp: lg.log_end_offset for tp, lg in again} == {
        ("my-topic-with-dashes", 12): 0,
        ("orders", 0): 20,
        ("orders", 1): 40,
        ("orders", 2): 60,
    }
    assert again.read_high_watermarks() == {("orders", 0): 20}
    lg = again.get_log(("orders", 0))
    assert lg is not None and lg.topic_id == "AAAAAAAAAAAAAAAAAAAAAA"


def test_a_manager_says_when_its_data_directory_was_empty(tmp_path: Path) -> None:
    """What a broker's registration reports as lost storage: a missing or empty directory (a
    new or wiped disk), and still after restarts until a registration said so (a process
    that wrote into it and died first), never after that."""
    data_dir = tmp_path / "data"
    first = _filled(data_dir)
    assert first.storage_was_empty
    first.shutdown()
    unregistered = LogManager(data_dir, CONFIG)
    unregistered.open()
    assert unregistered.storage_was_empty  # not empty now, but never registered as lost
    unregistered.storage_loss_registered()
    assert not unregistered.storage_was_empty
    unregistered.shutdown()
    again = LogManager(data_dir, CONFIG)
    again.open()
    assert not again.storage_was_empty
    again.shutdown()
    for path in sorted(data_dir.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    wiped = LogManager(data_dir, CONFIG)
    wiped.open()
    assert wiped.storage_was_empty
    wiped.shutdown()


def test_unclean_restart_recovers_from_recovery_points(tmp_path: Path) -> None:
    mgr = _filled(tmp_path)
    mgr.checkpoint_recovery_points()
    # No shutdown: the process "died". Everything written through the OS is there.
    again = LogManager(tmp_path, CONFIG)
    again.open()
    assert not again.had_clean_shutdown
    assert again.recovery_reports  # the active segments were recovered
    assert [r.offset for r in read_all(again.logs[("orders", 2)])] == list(range(60))


def test_bad_partition_is_offline_and_others_serve(tmp_path: Path) -> None:
    mgr = _filled(tmp_path)
    mgr.shutdown()
    broken = tmp_path / "orders-1"
    (broken / "00000000000000000000.log").chmod(0o000)
    os.rename(broken / "00000000000000000000.log", broken / "00000000000000000000.log.bak")
    (broken / "00000000000000000000.log").mkdir()  # a directory where a segment should be
    (tmp_path / "not-a-partition").mkdir()
    (tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT).write_bytes(b"\x00garbage\xff")
    again = LogManager(tmp_path, CONFIG)
    again.open()
    assert ("orders", 1) in again.offline
    assert [r.offset for r in read_all(again.logs[("orders", 0)])] == list(range(20))
    assert [r.offset for r in read_all(again.logs[("orders", 2)])] == list(range(60))


def test_a_partition_whose_opening_fails_on_a_bug_is_offline_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only OSError and ValueError took a partition offline: an assertion a corrupt file set
    off (a base offset past the index's reach) escaped and the node could not start."""
    mgr = _filled(tmp_path)
    mgr.shutdown()
    real_open = Log.open

    def failing_open(path: Path, *args: Any, **kwargs: Any) -> Log:
        if path.name == "orders-1":
            raise AssertionError(4294967312)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(Log, "open", failing_open)
    again = LogManager(tmp_path, CONFIG)
    again.open()
    assert again.offline == {("orders", 1): "AssertionError: 4294967312"}
    assert [r.offset for r in read_all(again.logs[("orders", 2)])] == list(range(60))


def test_delete_log_removes_directory(tmp_path: Path) -> None:
    mgr = _filled(tmp_path)
    mgr.delete_log(("orders", 0))
    assert not (tmp_path / "orders-0").exists()
    assert mgr.get_log(("orders", 0)) is None
    mgr.shutdown()
    again = LogManager(tmp_path, CONFIG)
    again.open()
    assert ("orders", 0) not in again.logs


def test_a_topic_of_the_longest_name_is_deleted(tmp_path: Path) -> None:
    """A topic name may be 249 characters; ``<topic>-<p>.<n>-delete`` was longer than a file
    name may be, the rename failed, and the node halted (its log directory failed), then
    again at every start. The topic part is cut short, as Kafka's
    LocalLog.logDirNameWithSuffixCappedLength does."""
    name = "t" * 249
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    mgr.get_or_create_log((name, 12345)).append_as_leader(batch(1), 0, 0)
    renamed: list[Path] = []
    mgr.remove = renamed.extend
    mgr.delete_log((name, 12345))
    assert len(renamed) == 1 and re.fullmatch(r"t+-12345\.[0-9a-f]{32}-delete", renamed[0].name)
    assert len(renamed[0].name) <= 255 and renamed[0].exists()
    mgr.shutdown()
    again = LogManager(tmp_path, CONFIG)
    again.open()  # what a crash left to remove is removed at the next start
    assert list(tmp_path.glob("*-delete")) == [] and (name, 12345) not in again.logs


def test_a_partition_deleted_again_after_a_restart_beside_its_leftover_delete_directory(
    tmp_path: Path,
) -> None:
    """Delete directories were numbered from 1 in each run: deleting a partition whose
    earlier delete directory a failed removal had left renamed onto it (ENOTEMPTY), and the
    node halted, at every start. They take a random UUID, as Kafka's."""
    for run in range(2):
        mgr = LogManager(tmp_path, CONFIG)
        with pytest.MonkeyPatch.context() as patch:
            # The start's removal of what the last run left fails too.
            patch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)
            mgr.open()
        mgr.get_or_create_log(("orders", 0)).append_as_leader(batch(1), 0, 0)
        kept: list[Path] = []
        mgr.remove = kept.extend  # a removal that failed: the directory stays
        mgr.delete_log(("orders", 0))
        assert len(kept) == 1 and kept[0].exists(), run
        mgr.close()
    assert len(list(tmp_path.glob("orders-0.*-delete"))) == 2


def test_no_clean_shutdown_is_marked_over_an_offline_partition(tmp_path: Path) -> None:
    """It was never opened, so never recovered: the marker let the next start load its torn
    tail unchecked (the log end past a corrupt batch, reads failing for good)."""
    mgr = _filled(tmp_path)
    mgr.close()  # a crash
    broken = LogManager(tmp_path, CONFIG)
    real_open = Log.open

    def failing_open(path: Path, *args: Any, **kwargs: Any) -> Log:
        if path.name == "orders-1":
            raise OSError(5, "Input/output error")
        return real_open(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Log, "open", failing_open)
        broken.open()
    assert ("orders", 1) in broken.offline
    broken.shutdown()
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    healthy = LogManager(tmp_path, CONFIG)
    healthy.open()
    assert not healthy.had_clean_shutdown and not healthy.offline
    healthy.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def test_only_the_quorums_own_directory_is_skipped_at_start_up(tmp_path: Path) -> None:
    """Every directory whose name started with ``__cluster_metadata`` was skipped as the
    metadata quorum's: a topic so named (``__cluster_metadata_audit``) was not loaded at
    start-up, not recovered, and never found stray."""
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    mgr.get_or_create_log(("__cluster_metadata_audit", 0)).append_as_leader(batch(1), 0, 0)
    mgr.shutdown()
    (tmp_path / "__cluster_metadata").mkdir()  # the quorum's journal directory
    again = LogManager(tmp_path, CONFIG)
    again.open()
    assert list(again.logs) == [("__cluster_metadata_audit", 0)]
    assert again.logs[("__cluster_metadata_audit", 0)].log_end_offset == 1


def test_retention_and_compaction_across_logs(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    compacted = mgr.get_or_create_log(
        ("__consumer_offsets", 0),
        LogConfig(segment_bytes=500, cleanup_policy=frozenset({"compact"})),
    )
    for i in range(40):
        compacted.append_as_leader(batch(1, key=f"g{i % 2}".encode()), 0, now_ms=0)
    deleting = mgr.get_or_create_log(("t", 0), LogConfig(segment_bytes=500, retention_bytes=600))
    for _ in range(40):
        deleting.append_as_leader(batch(1, value=b"x" * 40), 0, now_ms=0)
    deleting.roll()
    hws = {("__consumer_offsets", 0): compacted.log_end_offset, ("t", 0): 40}
    mgr.producer_id_expiration_ms = 60_000  # the node's producer.id.expiration.ms
    # The cleaner's choice: the compacted log (the other is no compacted log), not past its HW.
    chosen = mgr.filthiest(0, hws)
    assert chosen is not None and chosen[0] == ("__consumer_offsets", 0)
    assert chosen[2].producer_id_expiration_ms == 60_000
    assert all(s.next_offset <= hws[chosen[0]] for s in chosen[2].segments)
    assert mgr.filthiest(0, hws, skip={("__consumer_offsets", 0)}) is None
    assert mgr.filthiest(0, {}) is None  # no hosted partition: left alone
    stats = compacted.swap_cleaned(compacted.clean(chosen[2]))
    assert stats is not None and stats.records_kept < stats.records_read
    assert mgr.filthiest(0, hws) is None  # clean now
    assert mgr.run_retention(now_ms=0) > 0
    assert deleting.log_start_offset > 0
    assert checkpoint.read_offsets(tmp_path / checkpoint.LOG_START_OFFSET_CHECKPOINT)[("t", 0)] > 0


def test_a_log_without_partition_metadata_takes_the_callers_topic_id(tmp_path: Path) -> None:
    mgr = _filled(tmp_path)
    mgr.shutdown()
    (tmp_path / "orders-0" / checkpoint.PARTITION_METADATA).unlink()
    again = LogManager(tmp_path, CONFIG)
    again.open()
    lg = again.get_or_create_log(("orders", 0), topic_id="BBBBBBBBBBBBBBBBBBBBBB")
    assert lg.topic_id == "BBBBBBBBBBBBBBBBBBBBBB"
    assert checkpoint.read_partition_metadata(
        tmp_path / "orders-0" / checkpoint.PARTITION_METADATA
    ) == ("BBBBBBBBBBBBBBBBBBBBBB")
    # A log that has its id keeps it: a different one is the caller's to judge (a stray).
    other = again.get_or_create_log(("orders", 1), topic_id="BBBBBBBBBBBBBBBBBBBBBB")
    assert other.topic_id == "AAAAAAAAAAAAAAAAAAAAAA"
    again.shutdown()


def test_a_topic_created_again_does_not_inherit_the_deleted_ones_checkpoints(
    tmp_path: Path,
) -> None:
    """The deleted log's log start (40) and recovery point stay in the checkpoints until they
    are next written; a log created in its place rewrites them, so a crash after it takes
    records does not hide them below the old log start (Kafka rewrites them on deletion)."""
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    old = mgr.get_or_create_log(("t", 0))
    for _ in range(50):
        old.append_as_leader(batch(1), 0, now_ms=0)
    assert old.maybe_increment_log_start_offset(40)
    mgr.checkpoint_log_start_offsets()
    mgr.checkpoint_recovery_points()
    mgr.delete_log(("t", 0))
    new = mgr.get_or_create_log(("t", 0))
    for _ in range(30):
        new.append_as_leader(batch(1), 0, now_ms=0)
    # No shutdown: the process "died".
    again = LogManager(tmp_path, CONFIG)
    again.open()
    reopened = again.logs[("t", 0)]
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 30)
    assert [r.offset for r in read_all(reopened)] == list(range(30))


def test_deleting_a_log_abandons_a_cleaning_pass_in_flight(tmp_path: Path) -> None:
    """The cleaner thread's pass on a log deleted meanwhile is not swapped in: the directory
    may hold a new log of the same name by then (Kafka's ``abortCleaning`` on delete)."""
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    compacted = mgr.get_or_create_log(
        ("c", 0), LogConfig(segment_bytes=300, cleanup_policy=frozenset({"compact"}))
    )
    for i in range(30):
        compacted.append_as_leader(batch(1, key=f"k{i % 2}".encode()), 0, now_ms=0)
    chosen = mgr.filthiest(0, {("c", 0): compacted.log_end_offset})
    assert chosen is not None
    result = compacted.clean(chosen[2])
    mgr.delete_log(("c", 0))
    assert compacted.swap_cleaned(result) is None


def test_a_partition_that_fails_to_open_holds_no_file_descriptors(tmp_path: Path) -> None:
    """A flushed segment with a corrupt batch and an unreadable epoch checkpoint: rebuilding
    the epochs meets the corruption and the partition goes offline; the segments opened by
    then are closed again."""
    mgr = LogManager(tmp_path, LogConfig(segment_bytes=4000, index_interval_bytes=100))
    mgr.open()
    lg = mgr.get_or_create_log(("t", 0))
    for _ in range(100):
        lg.append_as_leader(batch(1, value=b"v" * 20), 0, now_ms=1000)
    mgr.shutdown()
    first = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    position = [pos for pos, _ in fmt.iter_headers(bytes(data))][5]
    data[position + 16] = 7  # the sixth batch's magic byte
    first.write_bytes(data)
    (tmp_path / "t-0" / checkpoint.LEADER_EPOCH_CHECKPOINT).write_text("garbage\n")
    before = len(os.listdir("/proc/self/fd"))
    again = LogManager(tmp_path, LogConfig(segment_bytes=4000, index_interval_bytes=100))
    again.open()
    assert ("t", 0) in again.offline
    assert len(os.listdir("/proc/self/fd")) == before


def test_an_offline_partition_keeps_its_checkpointed_offsets(tmp_path: Path) -> None:
    """Checkpoints written while a partition is offline keep what they said of it: repaired
    and opened again, it still starts at its log start, not at records deleted before."""
    mgr = _filled(tmp_path)
    assert mgr.logs[("orders", 1)].maybe_increment_log_start_offset(5)
    mgr.checkpoint_log_start_offsets()
    mgr.shutdown()
    broken = tmp_path / "orders-1" / "00000000000000000000.log"
    os.rename(broken, broken.with_name(broken.name + ".bak"))
    broken.mkdir()  # a directory where a segment should be
    again = LogManager(tmp_path, CONFIG)
    again.open()
    assert ("orders", 1) in again.offline
    again.checkpoint_log_start_offsets()
    again.checkpoint_recovery_points()
    broken.rmdir()
    os.rename(broken.with_name(broken.name + ".bak"), broken)
    repaired = LogManager(tmp_path, CONFIG)
    repaired.open()
    assert repaired.logs[("orders", 1)].log_start_offset == 5


def test_a_crash_before_a_recreated_log_is_adopted_leaves_it_no_old_offsets(
    tmp_path: Path,
) -> None:
    """A topic deleted and created again: the checkpoints still held the deleted log's log
    start (and recovery point) until a new log took the place. Killed after the new directory
    was made (ahead of its metadata, on a worker thread), before it was adopted, the node
    paired it with the old log's start at the next start-up: a log start above the new log's
    end, and the new log started over there. The checkpoints drop the old offsets before a
    new directory of the name is made."""
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    tp = ("reborn", 0)
    old = mgr.get_or_create_log(tp, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    for _ in range(8):
        old.append_as_leader(batch(1), leader_epoch=1, now_ms=0)
    assert old.maybe_increment_log_start_offset(5)
    mgr.checkpoint_log_start_offsets()
    mgr.checkpoint_recovery_points()
    mgr.delete_log(tp)
    mgr.forget_deleted_logs_offsets([tp])
    ((_, new),) = mgr.create_unregistered([(tp, CONFIG, "BBBBBBBBBBBBBBBBBBBBBB")])
    for seg in new.segments:  # killed before adopting it: no shutdown, no checkpoint
        seg.close()
    for lg in mgr.logs.values():
        for seg in lg.segments:
            seg.close()
    again = LogManager(tmp_path, CONFIG)
    again.open()
    reopened = again.get_log(tp)
    assert reopened is not None and reopened.topic_id == "BBBBBBBBBBBBBBBBBBBBBB"
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 0)
    again.shutdown()


def test_a_truncation_below_the_checkpointed_recovery_point_checkpoints_it(tmp_path: Path) -> None:
    """LogManager.truncateTo checkpoints the recovery points at once: the periodic checkpoint
    still said more after a truncation, and a crash before it loaded the records written since
    as flushed, without recovery (their epochs not read again). Only a truncation below what
    the file says writes it."""
    mgr = LogManager(tmp_path)
    mgr.open()
    tp = ("t", 0)
    lg = mgr.get_or_create_log(tp, LogConfig(segment_bytes=500))
    while len(lg.segments) < 3:
        lg.append_as_leader(batch(1, value=b"x" * 40), 0, now_ms=0)
    mgr.checkpoint_recovery_points()
    path = tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT
    on_disk = checkpoint.read_offsets(path)[tp]
    assert on_disk == lg.recovery_point > 2
    lg.truncate_to(on_disk + 1 if on_disk < lg.log_end_offset else on_disk)  # not below it
    assert checkpoint.read_offsets(path)[tp] == on_disk
    lg.truncate_to(2)
    assert checkpoint.read_offsets(path)[tp] == lg.recovery_point <= 2
    lg.truncate_fully_and_start_at(0)
    assert checkpoint.read_offsets(path)[tp] == 0


def test_a_log_opened_shorter_than_its_recovery_point_checkpoints_it(tmp_path: Path) -> None:
    """A crash inside truncate_to (its segments cut, the checkpoint not yet written) left the
    file's recovery point above the log's end; opening lowered it in memory only. A follower
    then appended a new leader's epoch from the cut, rolled (the fsync pending) and crashed
    again: the rolled segment was loaded as flushed, without recovery, and the leader-epoch
    cache placed the new epoch at the roll, not at the cut: a leader answered
    OffsetsForLeaderEpoch with the wrong end, and a diverging follower kept records it should
    have truncated. (review helper-216)"""
    config = LogConfig(segment_bytes=2_000, index_interval_bytes=200)
    tp = ("t", 0)
    first = LogManager(tmp_path / "a", config)
    first.open()
    lg = first.get_or_create_log(tp, config)
    while lg.log_end_offset < 100:
        lg.append_as_leader(batch(2, value=b"z" * 50), 0, now_ms=0)
    lg.flush()
    first.checkpoint_recovery_points()
    crashed = tmp_path / "b"

    def crash(recovery_point: int) -> None:  # SIGKILL before the checkpoint is written
        shutil.copytree(tmp_path / "a", crashed)

    lg.truncated = crash
    lg.truncate_to(60)

    second = LogManager(crashed, config)
    second.open({tp: config})
    path = crashed / checkpoint.RECOVERY_POINT_CHECKPOINT
    assert checkpoint.read_offsets(path)[tp] <= 60
    follower = second.get_log(tp)
    assert follower is not None and follower.log_end_offset == 60
    second.flush_rolled = lambda _lg, _flush: None  # the node's fsync of a rolled segment
    follower.flush_rolled = second.flush_rolled
    segments, offset = len(follower.segments), 60
    while len(follower.segments) == segments or offset < follower.active_segment.base_offset + 6:
        raw = bytearray(batch(2, value=b"y" * 50))
        fmt.set_base_offset(raw, 0, offset)
        fmt.set_partition_leader_epoch(raw, 0, 5)
        follower.append_as_follower(bytes(raw), now_ms=0)
        offset += 2
    again = tmp_path / "c"
    shutil.copytree(crashed, again)  # SIGKILL
    third = LogManager(again, config)
    third.open({tp: config})
    reopened = third.get_log(tp)
    assert reopened is not None and reopened.log_end_offset == offset
    assert reopened.epoch_cache.end_offset_for(0, reopened.log_end_offset) == (0, 60)
    third.close()
    second.close()
    first.close()


COMPACT = LogConfig(segment_bytes=500, cleanup_policy=frozenset({"compact"}))


def _cleaned(data_dir: Path) -> tuple[LogManager, Log]:
    """A manager with a compacted log cleaned once: keys k0..k4 written four times."""
    mgr = LogManager(data_dir, COMPACT)
    mgr.open()
    lg = mgr.get_or_create_log(("compacted", 0), COMPACT)
    for i in range(20):
        lg.append_as_leader(batch(1, key=f"k{i % 5}".encode(), value=b"x" * 40), 0, now_ms=0)
    lg.roll()
    lg.compact(now_ms=0)
    assert lg.first_dirty_offset == 20
    return mgr, lg


def test_the_cleaners_progress_survives_a_restart(tmp_path: Path) -> None:
    """cleaner-offset-checkpoint (LogCleanerManager): the dirty part started at 0 after every
    restart, so each compacted log, __consumer_offsets included, was read and cleaned again
    whatever min.cleanable.dirty.ratio said. (review helper-204)"""
    mgr, _ = _cleaned(tmp_path)
    mgr.shutdown()
    assert checkpoint.read_offsets(tmp_path / checkpoint.CLEANER_OFFSET_CHECKPOINT) == {
        ("compacted", 0): 20
    }
    again = LogManager(tmp_path, COMPACT)
    again.open({("compacted", 0): COMPACT})
    lg = again.get_log(("compacted", 0))
    assert lg is not None and lg.first_dirty_offset == 20
    assert lg.plan_cleaning(0, min_dirty_ratio=0.5) is None
    # A checkpoint past the log end (the log cut short by a crash) makes the whole log dirty.
    again.close()
    checkpoint.write_offsets(
        tmp_path / checkpoint.CLEANER_OFFSET_CHECKPOINT, {("compacted", 0): 1_000}
    )
    third = LogManager(tmp_path, COMPACT)
    third.open({("compacted", 0): COMPACT})
    lg = third.get_log(("compacted", 0))
    assert lg is not None and lg.first_dirty_offset == lg.log_start_offset
    # ... and says so at once: grown past 1,000 again, the log would have taken it.
    assert checkpoint.read_offsets(tmp_path / checkpoint.CLEANER_OFFSET_CHECKPOINT) == {}
    third.close()


def test_a_truncation_below_the_cleaner_checkpoint_rewrites_it(tmp_path: Path) -> None:
    """Kafka's maybeTruncateCheckpoint: records appended again above a truncation are dirty;
    a crash must not leave the checkpoint calling them clean."""
    mgr, lg = _cleaned(tmp_path)
    mgr.checkpoint_cleaner_offsets()
    lg.truncate_to(10)
    assert checkpoint.read_offsets(tmp_path / checkpoint.CLEANER_OFFSET_CHECKPOINT) == {
        ("compacted", 0): lg.log_end_offset
    }
    assert lg.log_end_offset <= 10
    mgr.close()


def test_a_compacted_topic_created_again_starts_dirty(tmp_path: Path) -> None:
    mgr, _ = _cleaned(tmp_path)
    mgr.checkpoint_cleaner_offsets()
    mgr.delete_log(("compacted", 0))
    new = mgr.get_or_create_log(("compacted", 0), COMPACT)
    assert ("compacted", 0) not in checkpoint.read_offsets(
        tmp_path / checkpoint.CLEANER_OFFSET_CHECKPOINT
    )
    new.append_as_leader(batch(1, key=b"k", value=b"v"), 0, now_ms=0)
    mgr.shutdown()
    again = LogManager(tmp_path, COMPACT)
    again.open({("compacted", 0): COMPACT})
    reopened = again.get_log(("compacted", 0))
    assert reopened is not None and reopened.first_dirty_offset == 0
    again.close()


def test_a_checkpoint_snapshot_older_than_the_file_is_not_written(tmp_path: Path) -> None:
    """The node's periodic checkpoints are snapshots taken on the event loop and written on a
    worker thread; a truncation in between checkpoints at once, on the loop. The worker's
    snapshot, written last, must not put back the recovery point (or the high watermark) the
    truncation took away: a crash would then load the records above it unrecovered."""
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    tp = ("t", 0)
    lg = mgr.get_or_create_log(tp)
    for _ in range(20):
        lg.append_as_leader(batch(1), 0, now_ms=0)
    lg.flush()
    assert lg.recovery_point == 20
    periodic = mgr.recovery_points_snapshot()
    periodic_hws = mgr.high_watermarks_snapshot({tp: 20})
    lg.truncate_to(5)  # checkpoints the recovery point at once (LogManager.truncateTo)
    mgr.write_high_watermarks({tp: 5})
    periodic()  # the worker's writes, late
    periodic_hws()
    assert checkpoint.read_offsets(tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT) == {tp: 5}
    assert mgr.read_high_watermarks() == {tp: 5}
    mgr.recovery_points_snapshot()()  # a later snapshot is written
    lg.append_as_leader(batch(1), 0, now_ms=0)
    lg.flush()
    mgr.recovery_points_snapshot()()
    assert checkpoint.read_offsets(tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT) == {tp: 6}


def test_a_log_adopted_while_a_snapshot_is_queued_rewrites_the_checkpoint(tmp_path: Path) -> None:
    """A periodic snapshot taken after a log's deletion, queued on the worker, no longer
    names it; a new log of that name adopted before the write landed skipped the rewrite,
    and a crash left the old log's recovery point to it (review helper-282)."""
    tp = ("t", 0)
    mgr = LogManager(tmp_path, CONFIG)
    mgr.open()
    old = mgr.get_or_create_log(tp, CONFIG, topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    for _ in range(30):
        old.append_as_leader(batch(1), 0, now_ms=0)
    old.flush()
    mgr.checkpoint_recovery_points()
    mgr.delete_log(tp)
    mgr.recovery_points_snapshot()  # queued on the worker; the process dies before it runs
    mgr.forget_deleted_logs_offsets([tp])
    ((_, new),) = mgr.create_unregistered([(tp, CONFIG, "BBBBBBBBBBBBBBBBBBBBBB")])
    mgr.adopt(tp, new)
    assert checkpoint.read_offsets(tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT).get(tp, 0) == 0
