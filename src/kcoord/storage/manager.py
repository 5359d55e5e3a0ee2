"""The ``LogManager``: every partition log in one data directory (Kafka's ``LogManager``).

Layout of a data directory::

    <data dir>/
        recovery-point-offset-checkpoint   flushed offsets per partition (see ``checkpoint``)
        replication-offset-checkpoint      high watermarks, written for the replication layer
        log-start-offset-checkpoint        log start offsets
        .kcoord_cleanshutdown              present only after a clean shutdown
        <topic>-<partition>/               one ``Log`` per partition
        <topic>-<partition>.<n>-delete/    a deleted log waiting to be removed

Opening loads every partition; without the clean-shutdown marker each log recovers from its
recovery point. A partition that cannot be opened (unreadable files, a directory that is not a
log) is reported in ``offline`` with the reason and skipped: one bad partition never takes the
manager down, and its data is left on disk for an operator. A garbage checkpoint file is logged
and treated as empty, which makes every log recover from its first segment: slower, never wrong.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path

from kcoord.storage import checkpoint
from kcoord.storage.config import LogConfig
from kcoord.storage.log import (
    CleanPlan,
    Log,
    RecoveryReport,
    RolledFlush,
    parse_partition_dir,
    remove_now,
)
from kcoord.storage.meta_properties import IDENTITY_FILES
from kcoord.storage.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kcoord_cleanshutdown"
# Left in a data directory found empty until the controller has registered the broker with
# ``storage_lost``: a node that dies before that must say so again at its next start, though
# its directory is no longer empty (the Raft journal, logs fetched meanwhile).
STORAGE_LOST_FILE = ".kcoord_storage_lost"
DELETE_DIR_SUFFIX = "-delete"
# The metadata quorum's own directory in the data directory (raft/quorum.py); a topic whose
# name merely starts so is a topic like any other.
METADATA_DIR_NAME = "__cluster_metadata"
# The longest file name most file systems take (ext4, xfs): a topic name may be 249 long.
_MAX_FILE_NAME = 255


def _delete_dir_name(tp: TopicPartition, unique: str) -> str:
    """``<topic>-<partition>.<unique>-delete``, the topic cut short to fit a file name (Kafka's
    ``LocalLog.logDirNameWithSuffixCappedLength``): a topic of 249 characters could not be
    deleted, and the node halted on the failed rename, then again at every start. ``unique``
    is a random UUID's hex, as Kafka's ``logDeleteDirName``: a counter started again at 1
    with each run, and deleting a partition whose earlier delete directory was left behind
    renamed onto it, failed (ENOTEMPTY) and halted the node, at every start."""
    suffix = f"-{tp[1]}.{unique}{DELETE_DIR_SUFFIX}"
    return tp[0][: _MAX_FILE_NAME - len(suffix)] + suffix


TopicPartition = tuple[str, int]


# One numbered snapshot of a checkpoint file, taken on the manager's owner's thread, written
# when called, on any thread (``LogManager._write_snapshot``).
CheckpointWrite = Callable[[], None]


class LogManager:
    def __init__(self, data_dir: Path, default_config: LogConfig | None = None) -> None:
        self.data_dir = data_dir
        self.default_config = default_config or LogConfig()
        self.logs: dict[TopicPartition, Log] = {}
        self.offline: dict[TopicPartition, str] = {}
        self.recovery_reports: dict[TopicPartition, RecoveryReport] = {}
        self.had_clean_shutdown = False
        # The data directory was missing or empty when opened: a first start, or a node whose
        # disk was replaced or wiped (its registration then says its replicas hold nothing).
        self.storage_was_empty = False
        # The partitions each offsets checkpoint on disk names (as last read or written): a
        # log created where a deleted one was must not inherit its entries (see ``adopt``).
        self._checkpointed: dict[str, set[TopicPartition]] = {}
        # What the checkpoints said of partitions that are offline: written back with the
        # live logs' values, so a partition repaired and opened again keeps its log start.
        self._offline_offsets: dict[str, dict[TopicPartition, int]] = {}
        # Removes what logs let go: retired segments, deleted partitions' directories. At once
        # by default; a node replaces it to remove them off its event loop.
        self.remove: Callable[[Sequence[Path]], None] = remove_now
        # Runs the fsyncs a log's roll leaves (``Log.flush_rolled``). At once by default; a node
        # replaces it to run them on a worker thread.
        self.flush_rolled: Callable[[Log, RolledFlush], None] | None = None
        # producer.id.expiration.ms: the cleaner keeps the last batch of a producer younger.
        self.producer_id_expiration_ms = DEFAULT_PRODUCER_ID_EXPIRATION_MS
        # The recovery points and cleaner offsets the checkpoint files hold (as read or last
        # written).
        self._recovery_points_on_disk: dict[TopicPartition, int] = {}
        self._cleaner_offsets_on_disk: dict[TopicPartition, int] = {}
        # Checkpoint files may be written off the owner's thread (``CheckpointWrite``): one
        # write of a file at a time, and a snapshot older than the one it holds is not written.
        self._checkpoint_locks: dict[str, threading.Lock] = {}
        self._checkpoint_snapshots = 0
        self._checkpoint_on_disk: dict[str, int] = {}  # file name -> its snapshot's number

    # -----------------------------------------------------------------------------------------
    # Opening.

    def open(self, configs: Mapping[TopicPartition, LogConfig] | None = None) -> None:
        """Load (or recover) every partition directory under the data directory."""
        # The lock and meta.properties (meta_properties.py, written first) are not data.
        was_empty = not self.data_dir.is_dir() or all(
            p.name in IDENTITY_FILES for p in self.data_dir.iterdir()
        )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lost_marker = self.data_dir / STORAGE_LOST_FILE
        if was_empty:
            lost_marker.write_text("")
            checkpoint.fsync_dir(self.data_dir)
        self.storage_was_empty = was_empty or lost_marker.exists()
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        self.had_clean_shutdown = marker.exists()
        recovery_points = self._read_checkpoint(checkpoint.RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_checkpoint(checkpoint.LOG_START_OFFSET_CHECKPOINT)
        cleaner_offsets = self._read_checkpoint(checkpoint.CLEANER_OFFSET_CHECKPOINT)
        self._checkpointed[checkpoint.RECOVERY_POINT_CHECKPOINT] = set(recovery_points)
        self._recovery_points_on_disk = dict(recovery_points)
        self._checkpointed[checkpoint.LOG_START_OFFSET_CHECKPOINT] = set(start_offsets)
        self._checkpointed[checkpoint.CLEANER_OFFSET_CHECKPOINT] = set(cleaner_offsets)
        self._cleaner_offsets_on_disk = dict(cleaner_offsets)
        for path in sorted(self.data_dir.iterdir()):
            if not path.is_dir():
                continue
            if path.name.endswith(DELETE_DIR_SUFFIX):
                remove_now([path])
                continue
            if path.name == METADATA_DIR_NAME:
                continue  # the Raft journal lives here but is not a partition log
            tp = parse_partition_dir(path.name)
            if tp is None:
                log.warning("%s: not a partition directory, ignored", path)
                continue
            config = (configs or {}).get(tp, self.default_config)
            report = RecoveryReport()
            try:
                opened = Log.open(
                    path,
                    config,
                    recovery_point=recovery_points.get(tp, 0),
                    log_start_offset=start_offsets.get(tp, 0),
                    clean_shutdown=self.had_clean_shutdown,
                    report=report,
                )
            except Exception as e:
                # Any failure, a bug included (an assertion on a corrupt file the checks let
                # through), takes this partition offline, never the manager and the node with
                # it: the node starts and serves its other partitions.
                unexpected = not isinstance(e, (OSError, ValueError))
                log.error("%s: partition is offline: %s", path, e, exc_info=unexpected)
                self.offline[tp] = f"{type(e).__name__}: {e}"
                for name, offsets in (
                    (checkpoint.RECOVERY_POINT_CHECKPOINT, recovery_points),
                    (checkpoint.LOG_START_OFFSET_CHECKPOINT, start_offsets),
                    (checkpoint.CLEANER_OFFSET_CHECKPOINT, cleaner_offsets),
                ):
                    if tp in offsets:
                        self._offline_offsets.setdefault(name, {})[tp] = offsets[tp]
                continue
            if tp in cleaner_offsets:
                opened.restore_first_dirty_offset(cleaner_offsets[tp])
            opened.remove_files = self._remove
            opened.flush_rolled = self._flush_rolled
            opened.truncated = functools.partial(self._truncated, tp)
            self.logs[tp] = opened
            if report.segments_recovered or report.segments_deleted:
                self.recovery_reports[tp] = report
        if any(
            tp in self.logs and self.logs[tp].first_dirty_offset != offset
            for tp, offset in cleaner_offsets.items()
        ):
            # An entry past its log's end was taken as the log start: written back, or the log
            # grown past it again would take it at the next start (its records never cleaned).
            self.checkpoint_cleaner_offsets()
        if any(
            tp in self.logs and self.logs[tp].recovery_point < offset
            for tp, offset in recovery_points.items()
        ):
            # A log that came up shorter than its recovery point (a crash inside truncate_to,
            # a tail lost) has it lowered in memory only: written back now, as ``_truncated``
            # does for a live truncation. Otherwise a crash before the periodic checkpoint took
            # the records appended since for flushed, their segments were loaded without
            # recovery, and the epochs of a new leader's records there were never read again
            # (the leader-epoch checkpoint is written lazily, trusting recovery to redo it).
            self.checkpoint_recovery_points()
        # The marker is consumed: a crash from here on must recover again.
        marker.unlink(missing_ok=True)
        checkpoint.fsync_dir(self.data_dir)

    def storage_loss_registered(self) -> None:
        """The controller has registered this broker as having lost its storage: later starts
        are ordinary restarts."""
        (self.data_dir / STORAGE_LOST_FILE).unlink(missing_ok=True)
        checkpoint.fsync_dir(self.data_dir)
        self.storage_was_empty = False

    def _read_checkpoint(self, name: str) -> dict[TopicPartition, int]:
        try:
            return checkpoint.read_offsets(self.data_dir / name)
        except (checkpoint.CheckpointError, OSError) as e:
            log.warning("ignoring unreadable %s (logs recover from their start): %s", name, e)
            return {}

    # -----------------------------------------------------------------------------------------
    # Partitions.

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self.logs.get(tp)

    def get_or_create_log(
        self, tp: TopicPartition, config: LogConfig | None = None, topic_id: str | None = None
    ) -> Log:
        existing = self.logs.get(tp)
        if existing is not None:
            if existing.topic_id is None and topic_id is not None:
                # Its partition.metadata is missing or was unreadable: the caller knows the id.
                checkpoint.write_partition_metadata(
                    existing.directory / checkpoint.PARTITION_METADATA, topic_id
                )
                existing.topic_id = topic_id
            return existing
        if tp in self.offline:
            raise OSError(f"partition {tp[0]}-{tp[1]} is offline: {self.offline[tp]}")
        self.forget_deleted_logs_offsets([tp])
        created = Log.open(
            self._new_log_dir(tp),
            config or self.default_config,
            clean_shutdown=True,
            topic_id=topic_id,
        )
        self.adopt(tp, created)
        return created

    def _new_log_dir(self, tp: TopicPartition) -> Path:
        """Where a new log of ``tp`` goes; ValueError for a name that is not one directory."""
        topic, partition = tp
        if not topic or "/" in topic or topic in (".", "..") or partition < 0:
            raise ValueError(f"invalid topic partition {tp!r}")
        return self.data_dir / f"{topic}-{partition}"

    def create_unregistered(
        self,
        specs: Sequence[tuple[TopicPartition, LogConfig, str]],
        stop: threading.Event | None = None,
    ) -> list[tuple[TopicPartition, Log]]:
        """Create new, empty logs without registering them, for ``adopt`` (safe on a worker
        thread: it touches only directories that do not exist yet, and no state of the manager).
        A partition whose directory exists, or that cannot be created (the reason is logged),
        is left out: ``get_or_create_log`` then deals with it as before. Once ``stop`` is set
        no more are created (the node is stopping: it must not write its directory after it
        let the lock go)."""
        created: list[tuple[TopicPartition, Log]] = []
        for tp, config, topic_id in specs:
            if stop is not None and stop.is_set():
                break
            try:
                directory = self._new_log_dir(tp)
                if directory.exists():
                    continue
                lg = Log.open(directory, config, clean_shutdown=True, topic_id=topic_id)
            except (OSError, ValueError) as e:
                log.warning("%s-%d: not created ahead: %s", tp[0], tp[1], e)
                continue
            created.append((tp, lg))
        return created

    def forget_deleted_logs_offsets(self, tps: Sequence[TopicPartition]) -> None:
        """Before new logs of these partitions are created: rewrite the checkpoints that still
        hold a deleted log's recovery point or log start under one of their names (a topic
        deleted and created again; ``adopt`` leaves them until a log takes the place). A
        crash after a new directory was made, before its log was adopted, paired it with the
        old log's offsets at the next start: a log start above its end starts the log over
        there (Kafka's LogManager.asyncDelete rewrites both when it deletes a log)."""
        for name, write in self._offset_checkpoints():
            held = self._checkpointed.get(name, set())
            if any(tp in held and tp not in self.logs and tp not in self.offline for tp in tps):
                write()

    def adopt(self, tp: TopicPartition, lg: Log) -> None:
        """Register a log from ``create_unregistered`` (on the manager's own thread); one this
        manager has meanwhile is kept, and the adopted one closed."""
        if tp in self.logs or tp in self.offline:
            for seg in lg.segments:
                seg.close()
            return
        lg.remove_files = self._remove
        lg.flush_rolled = self._flush_rolled
        lg.truncated = functools.partial(self._truncated, tp)
        self.logs[tp] = lg
        # A topic deleted and created again: the checkpoints may still hold the old log's
        # recovery point and log start, which the next start-up would apply to this one
        # (hiding its records below them, skipping their recovery). Kafka rewrites both when
        # it deletes a log (LogManager.asyncDelete); here when a log takes the place, so
        # deleting a topic of many partitions writes nothing.
        for name, write in self._offset_checkpoints():
            if tp in self._checkpointed.get(name, ()):
                write()

    def delete_log(self, tp: TopicPartition) -> None:
        """Rename the directory out of the way, then remove it (Kafka's async delete). A
        cleaning pass in flight on it is abandoned (Kafka's ``abortCleaning``): its swap must
        not land in a directory a new log of the same name may hold by then."""
        removed = self.logs.pop(tp, None)
        if removed is None:
            return
        removed.abandon()
        self._delete_dir(tp, removed.directory)

    def _delete_dir(self, tp: TopicPartition, directory: Path) -> None:
        """Rename a partition's directory out of the way, then remove it."""
        target = directory.with_name(_delete_dir_name(tp, uuid.uuid4().hex))
        os.replace(directory, target)
        self.remove([target])

    def offline_topic_id(self, tp: TopicPartition) -> str | None:
        """The topic id an offline partition's ``partition.metadata`` names, if it reads."""
        try:
            return checkpoint.read_partition_metadata(
                self._new_log_dir(tp) / checkpoint.PARTITION_METADATA
            )
        except (checkpoint.CheckpointError, OSError, ValueError):
            return None

    def delete_offline(self, tp: TopicPartition) -> None:
        """Remove an offline partition (its topic was deleted, or it is a stray of an earlier
        topic of the same name): its directory, and what the checkpoints kept of it. It was
        left for ever, and took the place of a topic created again under its name."""
        if self.offline.pop(tp, None) is None:
            return
        for offsets in self._offline_offsets.values():
            offsets.pop(tp, None)
        self._delete_dir(tp, self._new_log_dir(tp))

    def _remove(self, paths: Sequence[Path]) -> None:
        self.remove(paths)  # looked up at each call: a node may replace it after opening

    def _flush_rolled(self, lg: Log, flush: RolledFlush) -> None:
        if self.flush_rolled is not None:  # likewise
            self.flush_rolled(lg, flush)
            return
        flush.run()
        lg.rolled_flush_done(flush)

    def __iter__(self) -> Iterator[tuple[TopicPartition, Log]]:
        return iter(sorted(self.logs.items()))

    # -----------------------------------------------------------------------------------------
    # Checkpoints.

    def _offset_checkpoints(self) -> list[tuple[str, Callable[[], None]]]:
        """The offset checkpoints this manager writes for its logs (the high watermarks'
        are the replication layer's), each with its writer."""
        return [
            (checkpoint.RECOVERY_POINT_CHECKPOINT, self.checkpoint_recovery_points),
            (checkpoint.LOG_START_OFFSET_CHECKPOINT, self.checkpoint_log_start_offsets),
            (checkpoint.CLEANER_OFFSET_CHECKPOINT, self.checkpoint_cleaner_offsets),
        ]

    def checkpoint_recovery_points(self) -> None:
        points = {tp: lg.recovery_point for tp, lg in self.logs.items()}
        self._write_checkpoint(checkpoint.RECOVERY_POINT_CHECKPOINT, points)
        self._recovery_points_on_disk = points

    def recovery_points_snapshot(self) -> CheckpointWrite:
        """The logs' recovery points now, to be written on any thread (the node's periodic
        checkpoint, Kafka's ``kafka-log-flusher`` task, writes it on a worker: its two fsyncs
        held the event loop, for seconds when the disk stalled)."""
        points = {tp: lg.recovery_point for tp, lg in self.logs.items()}
        write = self._checkpoint_snapshot(checkpoint.RECOVERY_POINT_CHECKPOINT, points)
        # What the file holds once written, or a later snapshot: a truncation below it
        # checkpoints again (``_truncated``), and its newer snapshot wins.
        self._recovery_points_on_disk = points
        return write

    def _truncated(self, tp: TopicPartition, recovery_point: int) -> None:
        """A log was truncated below what the checkpoint says of it: checkpoint it now, as
        Kafka's ``LogManager.truncateTo`` does (``checkpointRecoveryOffsetsInDir``). A crash
        before the periodic checkpoint took the records written since the truncation for
        flushed, and their segments were loaded without recovery: the epochs of the new
        leader's records were not read again, and a log cut short by a power loss kept the
        segments after the cut."""
        if self._recovery_points_on_disk.get(tp, -1) > recovery_point:
            self.checkpoint_recovery_points()
        # Kafka's LogCleanerManager.maybeTruncateCheckpoint: records appended again above the
        # truncation are dirty, and a crash must not leave the checkpoint calling them clean.
        lg = self.logs.get(tp)
        if lg is not None and self._cleaner_offsets_on_disk.get(tp, -1) > lg.first_dirty_offset:
            self.checkpoint_cleaner_offsets()

    def checkpoint_log_start_offsets(self) -> None:
        self._write_checkpoint(
            checkpoint.LOG_START_OFFSET_CHECKPOINT,
            {tp: lg.log_start_offset for tp, lg in self.logs.items()},
        )

    def checkpoint_cleaner_offsets(self) -> None:
        """Where each cleaned log's dirty part starts (Kafka's ``cleaner-offset-checkpoint``,
        written after every cleaning pass, ``LogCleanerManager.updateCheckpoints``)."""
        offsets = {
            tp: lg.first_dirty_offset for tp, lg in self.logs.items() if lg.first_dirty_offset > 0
        }
        self._write_checkpoint(checkpoint.CLEANER_OFFSET_CHECKPOINT, offsets)
        self._cleaner_offsets_on_disk = offsets

    def _write_checkpoint(self, name: str, offsets: dict[TopicPartition, int]) -> None:
        self._checkpoint_snapshot(name, offsets)()
        # Written now, and the newest: the file names these alone (a snapshot still queued
        # on a worker is older, and dropped).
        self._checkpointed[name] = set(self._offline_offsets.get(name, {})) | set(offsets)

    def _checkpoint_snapshot(
        self, name: str, offsets: Mapping[TopicPartition, int]
    ) -> CheckpointWrite:
        """Number a snapshot of one checkpoint file's offsets (with what it keeps of offline
        partitions), on the owner's thread. Until it is written the file may name the
        partitions of either, so ``adopt`` and ``forget_deleted_logs_offsets`` take both as
        named: a log adopted while a snapshot without its deleted namesake was queued
        skipped its rewrite, and a crash before the write left the old log's recovery point
        to the new one (review helper-282)."""
        offsets = {**self._offline_offsets.get(name, {}), **offsets}
        self._checkpointed[name] = self._checkpointed.get(name, set()) | set(offsets)
        self._checkpoint_locks.setdefault(name, threading.Lock())
        self._checkpoint_snapshots += 1
        return functools.partial(self._write_snapshot, name, self._checkpoint_snapshots, offsets)

    def _write_snapshot(self, name: str, number: int, offsets: dict[TopicPartition, int]) -> None:
        """Writes of a file are serialised, and one whose snapshot is older than what the
        file holds is dropped: a periodic write on a worker that lost the race to a
        truncation's write on the owner's thread must not put back the recovery point the
        truncation took away."""
        with self._checkpoint_locks[name]:
            if self._checkpoint_on_disk.get(name, 0) > number:
                return  # a later snapshot was written first (a truncation's, on the loop)
            checkpoint.write_offsets(self.data_dir / name, offsets)
            self._checkpoint_on_disk[name] = number

    def write_high_watermarks(self, high_watermarks: Mapping[TopicPartition, int]) -> None:
        self.high_watermarks_snapshot(high_watermarks)()

    def high_watermarks_snapshot(
        self, high_watermarks: Mapping[TopicPartition, int]
    ) -> CheckpointWrite:
        """``replication-offset-checkpoint`` to be written on any thread (Kafka's
        ``highwatermark-checkpoint`` task runs on its scheduler, not its request handlers)."""
        self._checkpoint_locks.setdefault(checkpoint.REPLICATION_CHECKPOINT, threading.Lock())
        self._checkpoint_snapshots += 1
        return functools.partial(
            self._write_snapshot,
            checkpoint.REPLICATION_CHECKPOINT,
            self._checkpoint_snapshots,
            dict(high_watermarks),
        )

    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        return self._read_checkpoint(checkpoint.REPLICATION_CHECKPOINT)

    # -----------------------------------------------------------------------------------------
    # Background duties, driven by the node's scheduler.

    def run_retention(
        self, now_ms: int, high_watermarks: Mapping[TopicPartition, int] | None = None
    ) -> int:
        return sum(self.retention_pass(now_ms, high_watermarks))

    def retention_pass(
        self, now_ms: int, high_watermarks: Mapping[TopicPartition, int] | None = None
    ) -> Iterator[int]:
        """One retention pass, log by log: yields the number of segments each log deleted, so
        that a caller on an event loop lets other work in between (a log that deletes fsyncs
        its leader-epoch checkpoint, and an idle one rolls first). A log closed or replaced
        between two steps is passed over; ``high_watermarks`` is read at each step (a caller
        that lets other work in keeps it current). The log start offsets are checkpointed at
        the end, once."""
        deleted = 0
        for tp, lg in list(self.logs.items()):
            if self.logs.get(tp) is not lg:
                continue
            hw = None if high_watermarks is None else high_watermarks.get(tp, lg.log_start_offset)
            count = lg.delete_old_segments(now_ms, high_watermark=hw)
            deleted += count
            yield count
        if deleted:
            self.checkpoint_log_start_offsets()

    def filthiest(
        self,
        now_ms: int,
        high_watermarks: Mapping[TopicPartition, int],
        skip: Collection[TopicPartition] = (),
    ) -> tuple[TopicPartition, Log, CleanPlan] | None:
        """The compacted log most in need of cleaning, with its plan (Kafka's
        ``LogCleanerManager.grabFilthiestCompactedLog``): among the logs in
        ``high_watermarks`` and not in ``skip``, the one with the largest dirty share at or
        above its ``min.cleanable.dirty.ratio`` (or with a tombstone past its horizon, or
        dirty records older than its ``max.compaction.lag.ms``)."""
        best: tuple[TopicPartition, Log, CleanPlan] | None = None
        for tp, lg in self.logs.items():
            hw = high_watermarks.get(tp)
            if hw is None or tp in skip or not lg.config.compact:
                continue
            plan = lg.plan_cleaning(
                now_ms,
                high_watermark=hw,
                min_dirty_ratio=lg.config.min_cleanable_dirty_ratio,
                producer_id_expiration_ms=self.producer_id_expiration_ms,
            )
            if plan is not None and (best is None or plan.dirty_ratio > best[2].dirty_ratio):
                best = (tp, lg, plan)
        return best

    # -----------------------------------------------------------------------------------------
    # Shutdown.

    def close(self) -> None:
        """Close every file without the clean-shutdown marker: the next open recovers."""
        for lg in self.logs.values():
            for seg in lg.segments:
                seg.close()
        self.logs.clear()

    def shutdown(self) -> None:
        """Flush and close every log, checkpoint, then leave the clean-shutdown marker, unless
        a partition is offline: it was never opened, so never recovered, and the marker would
        vouch for it at the next start, which then loads a torn tail unchecked (Kafka marks a
        log directory clean only when all of it was loaded)."""
        for lg in self.logs.values():
            lg.close()
        for _name, write in self._offset_checkpoints():
            write()
        if self.offline:
            log.warning(
                "not marking a clean shutdown: %d partitions are offline and were never "
                "recovered (%s); the next start recovers every log",
                len(self.offline),
                ", ".join(f"{t}-{p}" for t, p in sorted(self.offline)[:5]),
            )
        else:
            marker = self.data_dir / CLEAN_SHUTDOWN_FILE
            marker.write_text("")
            checkpoint.fsync_dir(self.data_dir)
        self.logs.clear()
