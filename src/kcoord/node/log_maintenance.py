"""The node's log housekeeping: Kafka's ``LogManager`` scheduled tasks and its ``LogCleaner``.

Three tasks run over every log the node hosts, leader or follower (each replica keeps its own
log tidy, as in Kafka):

- **Retention** ``log.initial.task.delay.ms`` after start, then every
  ``log.retention.check.interval.ms`` (Kafka's ``cleanupLogs``): whole
  segments past ``retention.ms`` / ``retention.bytes`` (``cleanup.policy`` with ``delete``), or
  wholly below the log start offset (DeleteRecords), are deleted. Only segments below the
  replica's high watermark go (``UnifiedLog.deleteOldSegments``). A moved log start is
  checkpointed at once (``log-start-offset-checkpoint``). The pass goes log by log, the event
  loop serving other work after each log that deleted (Kafka's runs on its scheduler thread);
  a failed pass is logged and the next period runs again, as Kafka's scheduler does.
- **The cleaner** every ``log.cleaner.backoff.ms`` while ``log.cleaner.enable``: picks the
  compacted log (``cleanup.policy`` with ``compact``, ``__consumer_offsets`` among them) with
  the largest dirty share at or above its ``min.cleanable.dirty.ratio`` (Kafka's
  ``LogCleanerManager.grabFilthiestCompactedLog``) and compacts it. Reading the segments and
  writing the cleaned copies run in a worker thread, as on Kafka's cleaner thread (handing
  the GIL to the event loop after every batch, ``hand_over_the_gil``), with a key map of at
  most the keys ``log.cleaner.dedupe.buffer.size`` holds in Kafka (``Log.clean``); the swap is
  on the event loop, and is abandoned (the copies deleted) if the log was truncated, trimmed
  or closed meanwhile (``Log.swap_cleaned``). One log per pass, like Kafka's one cleaner
  thread (``log.cleaner.threads`` = 1).
- **Recovery points** every ``log.flush.offset.checkpoint.interval.ms`` (Kafka's
  ``checkpointLogRecoveryOffsets``): after a crash each log recovers from its last checkpointed
  recovery point instead of from the last clean shutdown's. The file is written, with its two
  fsyncs, on a worker thread (``write_checkpoint``, which the replication layer's periodic
  high-watermark checkpoint uses too), as on Kafka's scheduler thread: on the event loop, a
  disk that stalled held every request of the node for as long as each fsync took.
- **Flushes of rolled segments** off the event loop (Kafka's ``UnifiedLog.roll`` schedules
  its "flush-log" task): a roll seals the segment and hands its fsyncs to a worker thread
  (``flush_later``); the log's recovery point passes the segment once they are done.
- **File removal** off the event loop (Kafka's ``asyncDeleteSegment`` and its log-dir
  deletion task): segments a log lets go (retention, truncation, cleaning) are renamed
  ``.deleted`` at once and a deleted partition's directory ``-delete``; ``remove_later`` queues
  them and a worker thread unlinks them (a 1 GiB segment takes ~170 ms on ext4, a stall the
  loop would otherwise take). What a crash leaves behind, the next start removes.

``__consumer_offsets`` is why the cleaner matters here: a new coordinator replays its partition
from the log start (DESIGN section 6), so without compaction failover takes longer the longer a
group has been committing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kcoord.node.log_dir_failure import LogDirFailureChannel
from kcoord.storage.log import (
    DEFAULT_OFFSET_MAP_CAPACITY,
    CleanerStats,
    CleanResult,
    Log,
    RolledFlush,
    remove_now,
)
from kcoord.storage.manager import CheckpointWrite, LogManager, TopicPartition
from kcoord.storage.segment import LogCorruptError

log = logging.getLogger(__name__)


# Rolls whose fsyncs wait for the worker, at most: each holds its files' descriptors (3-4), and
# a retention pass may roll every idle partition of the node at once. Past it a roll fsyncs on
# the loop, as it did before (the segments of idle partitions have no dirty pages left).
MAX_PENDING_ROLL_FLUSHES: Final = 64


def hand_over_the_gil() -> None:
    """Called by the cleaner thread after every batch. Without it the event loop, woken by a
    request, waits for the GIL until the interpreter's switch interval (5 ms) forces the
    cleaner to drop it (``make bench-storage`` measures both: "cleaning on a thread")."""
    time.sleep(0)


class _CleaningAbortedError(Exception):
    """Raised in the cleaner thread when the node stops: the pass drops its copies."""


@dataclass(frozen=True, slots=True)
class MaintenanceConfig:
    retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    cleaner_enable: bool = True  # log.cleaner.enable
    cleaner_backoff_ms: int = 15_000  # log.cleaner.backoff.ms
    # Keys the cleaner maps in one pass, from log.cleaner.dedupe.buffer.size.
    cleaner_map_capacity: int = DEFAULT_OFFSET_MAP_CAPACITY
    recovery_point_checkpoint_interval_ms: int = 60_000  # log.flush.offset.checkpoint.interval.ms
    # log.initial.task.delay.ms: retention and the checkpoints first run this long after start,
    # then every interval (Kafka's LogManager.startup schedules them so).
    initial_task_delay_ms: int = 30_000


@dataclass(slots=True)
class MaintenanceStats:
    """Totals since start, for the metrics."""

    segments_deleted: int = 0
    cleaner_runs: int = 0
    cleaner_cleaned: int = 0  # swapped in
    cleaner_aborted: int = 0  # the log changed meanwhile
    cleaner_failed: int = 0
    cleaned: CleanerStats = field(default_factory=CleanerStats)


class LogMaintenance:
    def __init__(
        self,
        logs: LogManager,
        high_watermarks: Callable[[], Mapping[TopicPartition, int]],
        now_ms: Callable[[], int],
        config: MaintenanceConfig,
        log_dir_failure: LogDirFailureChannel | None = None,
    ) -> None:
        """``high_watermarks()`` maps each partition this node hosts to its HW; the cleaner
        leaves any other log (a stray about to be deleted) alone, and retention deletes only
        what lies below such a log's start. A write to the data directory that fails halts the
        node through ``log_dir_failure`` (Kafka's cleaner and scheduled tasks report to its
        ``LogDirFailureChannel`` too)."""
        self.logs = logs
        self.log_dir_failure = log_dir_failure or LogDirFailureChannel(logs.data_dir, halt=None)
        self.high_watermarks = high_watermarks
        self.now_ms = now_ms
        self.config = config
        self.stats = MaintenanceStats()
        self.uncleanable: set[TopicPartition] = set()
        self._uncleanable_logs: dict[TopicPartition, Log] = {}  # the log each was set aside in
        self._to_remove: list[Path] = []
        self._removals_queued = asyncio.Event()
        # The cleaner's own thread (Kafka's CleanerThread): a stop waits for its pass to end
        # before the logs it reads are closed.
        self._cleaner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cleaner")
        # The pass under way and its log, until its task takes the result (see close).
        self._cleaning: tuple[Log, concurrent.futures.Future[CleanResult]] | None = None
        # The fsyncs of rolled segments, one at a time (Kafka's scheduler thread).
        self._flusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="log-flush")
        # Deleted files' removal: its own thread, which a stop waits for (on asyncio's default
        # executor it went on unlinking after the node had released its data directory).
        self._remover = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="log-remove")
        # The periodic checkpoint files, one at a time; a stop waits for the one under way.
        self._checkpointer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="checkpoint"
        )
        self._pending_flushes = 0
        self._closing = False

    # -----------------------------------------------------------------------------------------
    # Retention.

    async def enforce_retention(self) -> int:
        """One retention pass; returns the number of segments deleted. The loop serves other
        work after each log that deleted some (Kafka runs ``cleanupLogs`` on its scheduler
        thread, not a request thread): in one go, a pass over hundreds of idle partitions
        whose last segments expired made over a thousand fsyncs (a roll, the epoch
        checkpoint) with every request waiting, and the rolls past the flush queue's bound,
        whose worker's completions could not run, were fsynced on the loop too."""
        deleted = 0
        # Read again after each turn of the loop: a follower may have truncated meanwhile,
        # its high watermark with it, and a log is never trimmed past its HW.
        high_watermarks = dict(self.high_watermarks())
        try:
            for count in self.logs.retention_pass(self.now_ms(), high_watermarks):
                if count:
                    deleted += count
                    await asyncio.sleep(0)
                    high_watermarks.clear()
                    high_watermarks.update(self.high_watermarks())
        except OSError as e:
            self.log_dir_failure.fail("deleting segments past retention", e)
        self.stats.segments_deleted += deleted
        return deleted

    async def run_retention(self) -> None:
        await asyncio.sleep(self.config.initial_task_delay_ms / 1000)  # Kafka's initial delay
        while True:
            try:
                await self.enforce_retention()
            except Exception:
                # Kafka's scheduler logs a task's failure and runs it again at its next
                # period; ending the task stopped retention until the node restarted.
                log.exception("retention pass failed; trying again at the next check")
            await asyncio.sleep(self.config.retention_check_interval_ms / 1000)  # the period

    async def close(self) -> None:
        """End a cleaning pass in its thread and wait for it (LogManager.shutdown joins the
        cleaner threads before it closes a log, and its ``checkDone`` aborts the pass first):
        cancelling the task that awaits it does not stop it, and it went on reading segments
        the stop then closed, or held the stop past the launcher's grace."""
        self._closing = True
        await asyncio.to_thread(self._cleaner.shutdown, True)
        cleaning, self._cleaning = self._cleaning, None
        if cleaning is not None:
            # A pass past its last pause when its task was cancelled ended all the same:
            # its cleaned copies, swapped in by nobody, stayed on disk and open until the
            # next start (for __consumer_offsets, a second copy of the log).
            lg, done = cleaning
            if not done.cancelled() and done.exception() is None:
                lg._delete_cleaned(done.result())
        await asyncio.to_thread(self._flusher.shutdown, True)
        await asyncio.to_thread(self._remover.shutdown, True)
        await asyncio.to_thread(self._checkpointer.shutdown, True)

    def _pause_or_abort(self) -> None:
        """The cleaner thread's call after every batch: hand the GIL over, or give up."""
        if self._closing:
            raise _CleaningAbortedError
        hand_over_the_gil()

    # -----------------------------------------------------------------------------------------
    # The cleaner.

    def _set_aside(self, tp: TopicPartition, lg: Log) -> None:
        self.uncleanable.add(tp)
        self._uncleanable_logs[tp] = lg

    async def _cleaned_in_thread(self, lg: Log, clean: Callable[[], CleanResult]) -> CleanResult:
        """``clean()`` on the cleaner's thread; cancelled, the pass it started is settled by
        ``close``."""
        cleaning = self._cleaner.submit(clean)
        self._cleaning = (lg, cleaning)
        try:
            result = await asyncio.wrap_future(cleaning)
        except asyncio.CancelledError:
            raise  # the pass may still end, with copies nobody takes: close() deletes them
        except BaseException:
            self._cleaning = None
            raise
        self._cleaning = None
        return result

    async def clean_filthiest(self) -> TopicPartition | None:
        """Compact the dirtiest cleanable log, if any; returns it if it was cleaned (None:
        nothing to clean, or the pass was abandoned)."""
        # LogCleanerManager.maintainUncleanablePartitions: a partition set aside for its log
        # is cleanable again once that log is gone (deleted, moved away and back, its topic
        # created again); it stayed set aside until the node restarted.
        for tp in [
            tp for tp, lg in self._uncleanable_logs.items() if self.logs.get_log(tp) is not lg
        ]:
            del self._uncleanable_logs[tp]
            self.uncleanable.discard(tp)
        best = self.logs.filthiest(self.now_ms(), self.high_watermarks(), self.uncleanable)
        if best is None:
            return None
        tp, lg, plan = best
        self.stats.cleaner_runs += 1
        try:
            result = await self._cleaned_in_thread(
                lg,
                functools.partial(
                    lg.clean,
                    plan,
                    self._pause_or_abort,
                    map_capacity=self.config.cleaner_map_capacity,
                ),
            )
        except _CleaningAbortedError:
            self.stats.cleaner_aborted += 1
            log.info("%s-%d: cleaning abandoned: the node is stopping", tp[0], tp[1])
            return None
        except LogCorruptError as e:
            if not lg.is_current(plan):  # it read a segment closed meanwhile, not corruption
                self.stats.cleaner_aborted += 1
                log.warning("%s-%d: cleaning abandoned: the log changed meanwhile", tp[0], tp[1])
                return None
            self.stats.cleaner_failed += 1
            # Left for recovery and the read path to report; Kafka marks such a partition
            # uncleanable (LogCleanerManager.markPartitionUncleanable) until it is reloaded.
            self._set_aside(tp, lg)
            log.error("%s-%d: not cleanable until the node restarts: %s", tp[0], tp[1], e)
            return None
        except Exception as e:
            if not lg.is_current(plan):
                # A segment deleted or closed under the thread (retention, truncation, a deleted
                # topic) reads as an error; the copies were thrown away.
                self.stats.cleaner_aborted += 1
                log.warning("%s-%d: cleaning abandoned: %s", tp[0], tp[1], e)
                return None
            self.stats.cleaner_failed += 1
            if isinstance(e, OSError):
                # Nothing closed the segments: reading or writing the directory failed.
                self.log_dir_failure.fail(f"cleaning {tp[0]}-{tp[1]}", e)
                return None
            # The log did not change: the cleaner cannot deal with what it holds. That log
            # alone is left uncleanable (Kafka's CleanerThread wraps any such error in a
            # LogCleaningException and calls markPartitionUncleanable); picked again on every
            # pass, it kept every other compacted log, __consumer_offsets included, from ever
            # being cleaned again.
            self._set_aside(tp, lg)
            log.exception("%s-%d: not cleanable until the node restarts", tp[0], tp[1])
            return None
        try:
            stats = lg.swap_cleaned(result)
        except OSError as e:
            # Renaming or syncing the directory failed half-way: the log may point at closed
            # segments. Kafka's CleanerThread hands any IOException, the swap's included, to
            # the LogDirFailureChannel; the .swap files are completed on the next start.
            self.stats.cleaner_failed += 1
            self.log_dir_failure.fail(f"swapping cleaned segments of {tp[0]}-{tp[1]}", e)
            return None
        if stats is None:
            self.stats.cleaner_aborted += 1
            log.info("%s-%d: cleaning abandoned: the log changed meanwhile", tp[0], tp[1])
            return None
        self.stats.cleaner_cleaned += 1
        try:
            self.logs.checkpoint_cleaner_offsets()
        except OSError as e:
            self.log_dir_failure.fail("checkpointing cleaner offsets", e)
        total = self.stats.cleaned
        for name in CleanerStats.__slots__:
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        log.info(
            "%s-%d: cleaned %d segments (%d bytes), %d of %d records kept, %d tombstones dropped",
            tp[0],
            tp[1],
            stats.segments_cleaned,
            stats.bytes_read,
            stats.records_kept,
            stats.records_read,
            stats.tombstones_dropped,
        )
        return tp

    async def run_cleaner(self) -> None:
        if not self.config.cleaner_enable:
            return
        while True:
            try:
                cleaned = await self.clean_filthiest()
            except Exception:  # the cleaner must not die with one bad log (Kafka's too)
                log.exception("log cleaner pass failed")
                cleaned = None
            if cleaned is None:  # nothing (more) to clean: back off, as Kafka's cleaner does
                await asyncio.sleep(self.config.cleaner_backoff_ms / 1000)

    # -----------------------------------------------------------------------------------------
    # Flushes of rolled segments.

    def flush_later(self, lg: Log, flush: RolledFlush) -> None:
        """The LogManager's flusher of rolled segments (on the event loop)."""
        if self._closing or self._pending_flushes >= MAX_PENDING_ROLL_FLUSHES:
            # Stopping (the logs are about to be flushed and closed), or too many in the queue.
            self._flushed(lg, flush, None)
            return
        self._pending_flushes += 1
        running = asyncio.get_running_loop().run_in_executor(self._flusher, flush.run)
        running.add_done_callback(functools.partial(self._flushed, lg, flush))

    def _flushed(self, lg: Log, flush: RolledFlush, running: asyncio.Future[None] | None) -> None:
        if running is not None:
            self._pending_flushes -= 1
        try:
            if running is None:
                flush.run()
            elif running.cancelled():
                flush.discard()
                return
            elif (error := running.exception()) is not None:
                raise error
            lg.rolled_flush_done(flush)
        except OSError as e:
            self.log_dir_failure.fail(f"flushing {lg.directory.name} up to {flush.offset}", e)

    # -----------------------------------------------------------------------------------------
    # File removal.

    def remove_later(self, paths: Sequence[Path]) -> None:
        """The LogManager's remover (on the event loop): queue them for the worker thread."""
        self._to_remove.extend(paths)
        self._removals_queued.set()

    async def run_file_removal(self) -> None:
        while True:
            await self._removals_queued.wait()
            self._removals_queued.clear()
            batch, self._to_remove = self._to_remove, []
            try:
                await asyncio.get_running_loop().run_in_executor(self._remover, remove_now, batch)
            except OSError as e:
                self.log_dir_failure.fail(f"removing {len(batch)} deleted log files", e)

    # -----------------------------------------------------------------------------------------
    # Recovery points.

    async def write_checkpoint(self, write: CheckpointWrite) -> None:
        """Write a checkpoint file's snapshot on the checkpoint thread."""
        await asyncio.get_running_loop().run_in_executor(self._checkpointer, write)

    async def checkpoint_recovery_points(self) -> None:
        try:
            await self.write_checkpoint(self.logs.recovery_points_snapshot())
        except OSError as e:
            self.log_dir_failure.fail("checkpointing recovery points", e)

    async def run_recovery_point_checkpoints(self) -> None:
        await asyncio.sleep(self.config.initial_task_delay_ms / 1000)  # Kafka's initial delay
        while True:
            try:
                await self.checkpoint_recovery_points()
            except Exception:  # as retention's: logged, and tried again at the next period
                log.exception("recovery point checkpoint failed; trying again")
            await asyncio.sleep(self.config.recovery_point_checkpoint_interval_ms / 1000)
