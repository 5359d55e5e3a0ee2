"""Produce (apiKey 0) and InitProducerId (apiKey 22): appends, acks and idempotence.

Produce (Kafka's ``KafkaApis.handleProduceRequest`` and ``ReplicaManager.appendRecords``):

1. In request order, for each partition: the node must lead it (``NOT_LEADER_OR_FOLLOWER``
   with the leader's id and epoch as a hint, KIP-951; ``UNKNOWN_TOPIC_OR_PARTITION`` for a
   topic or partition that does not exist); clients may not write to ``__consumer_offsets``
   (``INVALID_TOPIC_EXCEPTION``), nor control batches (``INVALID_RECORD``); a partition's
   records are exactly one batch of magic 2 (``INVALID_RECORD``, Kafka's ``validateRecords``),
   zstd-compressed only from Produce v7 (``UNSUPPORTED_COMPRESSION_TYPE``). A request with a
   transactional batch fails whole with ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, as Kafka
   fails it for a transactional id its authorizer refuses: kcoord has no transaction
   coordinator and refuses every transactional id. With
   acks=-1 and the ISR below ``min.insync.replicas`` the batch is refused with
   ``NOT_ENOUGH_REPLICAS`` before its sequence is looked at, as Kafka's
   ``Partition.appendRecordsToLeader`` does (so a retry is refused alike, and the client retries
   it later with the same sequence). The batch is then checked against the partition's
   idempotent-producer state
   (``storage.producer_state``): a retried batch is answered with the offsets it got the first
   time and not appended; an out-of-order sequence or a stale producer epoch is refused.
   Otherwise the records are appended as leader (the log checks CRC, size and format:
   ``CORRUPT_MESSAGE``, ``MESSAGE_TOO_LARGE``, ``INVALID_RECORD``) and the producer state
   records the new batch at once, all with no await in between, so a pipelined next batch of
   the same producer sees it.
2. acks=1 answers right away; acks=-1 answers once the high watermark passes each appended
   batch (``REQUEST_TIMED_OUT`` after the request's timeout); acks=0 answers nothing at all,
   and if a partition failed the connection is closed so the producer refreshes its metadata
   (as Kafka does). Other acks values: ``INVALID_REQUIRED_ACKS``.

Producer state lives per hosted data partition, leader or follower (``ProducerStates``): built
from the batch headers of the log when the node starts to host it, a slice at a time between
which the loop serves other clients, then kept up with the log across leaderships. A produce
waits for it to reach the log end before step 1's synchronous part, so the no-await rule above
still holds. So does the read of a batch whose records are costly to read (64 KiB or more
decompressed): it runs on the listener's codec threads before that part (``_scanned``), with
its rebuild in the topic's own ``compression.type`` if it has one, and the append uses what it
found; the connection's next request waits for this one's handler.

DescribeProducers (apiKey 61, KIP-664; ``ReplicaManager.activeProducerState``): the producers
a hosted partition's state holds, leader or follower, each with its epoch, last sequence and
last timestamp (no coordinator epoch and no open transaction: -1), after the state has read
to the log end as for a produce: a follower answers with every batch it has replicated, as a
Kafka follower does (``kafka-transactions.sh find-hanging --broker-id`` asks one). Errors:
``UNKNOWN_TOPIC_OR_PARTITION``, and ``NOT_LEADER_OR_FOLLOWER`` for a partition with no replica
here (``getPartitionOrError``). ``__consumer_offsets`` has no idempotent producers: it
answers none.

InitProducerId: an idempotent producer (no transactional id) gets a fresh producer id with
epoch 0, always, as Kafka does (``TransactionCoordinator.handleInitProducerId``); ids come from
``ProducerIdManager``. A transactional id answers ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, as
FindCoordinator does for it: kcoord has no transaction coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import (
    CLOSE_CONNECTION,
    NO_RESPONSE,
    PARTITIONS_PER_SLICE,
    Deferred,
    OffLoop,
    Request,
    Result,
    wait_or_cancel,
)
from kcoord.node.kafka.context import BrokerContext, is_internal
from kcoord.node.kafka.producer_ids import ProducerIdManager, ProducerIdsExhaustedError
from kcoord.node.replica_manager import KafkaError, Partition, ReplicaManager
from kcoord.storage import format as fmt
from kcoord.storage.log import LeaderScan, Log
from kcoord.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    Duplicate,
    ProducerStateManager,
    Rejected,
)
from kcoord.storage.segment import LogCorruptError

log = logging.getLogger(__name__)

PRODUCE_KEY: Final = 0
INIT_PRODUCER_ID_KEY: Final = 22
DESCRIBE_PRODUCERS_KEY: Final = 61
NO_LEADER_HINT: Final = {"leader_id": -1, "leader_epoch": -1}
_MAGIC_OFFSET: Final = 16  # of a record batch (storage/format.py)


# Batch headers parsed between two yields to the event loop while a producer state reads its
# log: 3 ms of work alone on this machine, about 10 ms with three nodes and their clients on its
# two cores, so other clients of the node wait no longer than that.
LOAD_SLICE_HEADERS: Final = 1000
# A read starts over when a segment it was reading was let go meanwhile (retention, cleaner).
_LOAD_ATTEMPTS: Final = 3
# What reading a segment that was closed or deleted meanwhile raises; any other OSError is
# the disk's.
_SEGMENT_LET_GO_ERRNOS: Final = frozenset({errno.EBADF, errno.ENOENT})
# producer.id.expiration.check.interval.ms (its default): how often idle producers are forgotten.
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS: Final = 10 * 60 * 1000
# How often a follower's state reads what it replicated since (at most): on promotion only
# that much is left to read before the first produce.
FOLLOWER_CATCH_UP_INTERVAL_MS: Final = 1000
# The most batch headers a roll reads for its snapshot (``_on_roll``), in the append that
# rolls: a follower's state is up to FOLLOWER_CATCH_UP_INTERVAL_MS behind its log (~35 ms at
# most to read, from 1.05 s for 300,000); one further behind (still loading) takes none.
ROLL_READ_HEADERS: Final = 10 * LOAD_SLICE_HEADERS
BACKGROUND_READS: Final = 2


# Produce v7 (Kafka 2.1, KIP-110) is the first that may carry zstd batches.
ZSTD_MIN_PRODUCE_VERSION: Final = 7
# A batch whose records may take this much once decompressed is read on the listener's codec
# threads before its append (``_scanned``): reading 64 KiB of 100-byte records takes about
# 80 us, the thread some 40. A zstd batch of a few KiB may hold 64 MiB of records
# (fmt.MAX_DECOMPRESSED_BYTES), a second or more of reading that held every other client.
OFF_LOOP_RECORDS_BYTES: Final = 64 * 1024


def _is_transactional(records: bytes | None) -> bool:
    """Whether the first batch is a transactional one of magic 2 (Kafka's
    ``RequestUtils.hasTransactionalRecords`` looks at the first batch of each partition too;
    a batch of another magic is ``_append``'s to refuse, with INVALID_RECORD)."""
    if records is None or len(records) < fmt.ATTRIBUTES_OFFSET + 2:
        return False
    return records[_MAGIC_OFFSET] == fmt.MAGIC_V2 and bool(
        records[fmt.ATTRIBUTES_OFFSET + 1] & fmt.TRANSACTIONAL_FLAG
    )


@dataclass(eq=False)
class _Tracked:
    """One partition's producer state and how far into its log it has read."""

    part: Partition
    log: Log
    state: ProducerStateManager
    end_offset: int  # the batches below it are in ``state``
    truncations: int  # the log's truncation count ``end_offset`` is valid for
    next_expiry_ms: int
    next_catch_up_ms: int = 0
    # A restart's state, to take the producers of the latest snapshot at its first read.
    snapshot_pending: bool = False

    def still_valid(self) -> bool:
        """Whether what was read is still the log's prefix and nothing unread is gone: no
        truncation below ``end_offset``, no segment deleted past it (the runtime's
        ``Standby.still_valid``)."""
        lg = self.log
        # The segments' start, not the log start: DeleteRecords moves the log start over
        # batches that stay readable, and a state may read them (Kafka keeps producers
        # across log start moves, onLogStartOffsetIncremented).
        kept = lg.prefix_kept(self.end_offset, self.truncations, floor=lg.segments[0].base_offset)
        if self.part.log is not lg or kept is None:
            return False
        self.truncations = kept
        return True

    @property
    def caught_up(self) -> bool:
        # A snapshot still to merge may move the read back to its offset (``_merge_snapshot``):
        # not caught up, so that the read is made in slices (``ready``), not in one go.
        return self.end_offset == self.log.log_end_offset and not self.snapshot_pending


class ProducerStates:
    """The ``ProducerStateManager`` of every data partition this node hosts, leader or
    follower, each kept up with its log.

    A state is built from the log's batch headers when the node starts to host the partition
    (in the background) and then reads on from where it stopped: a leader's produces record
    their batches at once; a follower reads what it replicated at most every
    ``FOLLOWER_CATCH_UP_INTERVAL_MS``, so a promotion has little left to read before the first
    produce, as Kafka's followers keep their producer state up to date as they replicate. A
    state stays across leaderships and log start moves (Kafka's ``onLogStartOffsetIncremented``
    keeps producers; a state reads from the first segment, log start or not); a truncation
    below what it read, or unread batches gone with their segment, make it start over. A long
    log has millions of headers: read in one go that stalled every client of the node
    (300,000 one-record batches took 1.05 s), so reads yield to the loop every
    ``LOAD_SLICE_HEADERS`` headers, ``BACKGROUND_READS`` at a time; a produce to a partition
    whose state is behind reads it itself (``ready``). Kafka also avoids the first read with
    producer snapshot files; kcoord reads the last ``producer.id.expiration.ms`` of log after
    a restart, and takes from the latest snapshot the producers whose batches are not read
    (storage/producer_snapshot.py, ``_merge_snapshot``). Every state takes one at each roll of
    its log, leader or follower (``_on_roll``: a follower's reads up to the roll first), and at
    a clean stop (``close``).
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        expiration_check_interval_ms: int = PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS,
    ) -> None:
        self.replicas = replicas
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.expiration_check_interval_ms = expiration_check_interval_ms
        self._tracked: dict[tuple[str, int], _Tracked] = {}
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        # Background reads at once (start-up starts one per hosted partition).
        self._background_reads = asyncio.Semaphore(BACKGROUND_READS)
        replicas.add_role_listener(self.on_role_change)
        replicas.add_high_watermark_listener(self.on_high_watermark)

    # -- keeping up ---------------------------------------------------------------------------

    def on_role_change(self, part: Partition, is_leader: bool) -> None:
        if is_internal(part.topic):
            return
        if self.replicas.get_partition(part.topic, part.partition) is not part:
            self._forget(part.tp)  # no longer hosted here
            return
        self._catch_up_later(self._track(part, self.replicas.now_ms()))

    def on_high_watermark(self, part: Partition, _high_watermark: int) -> None:
        """A follower's replicated batches, read at most every catch-up interval."""
        if part.is_leader or is_internal(part.topic):
            return
        t = self._tracked.get(part.tp)
        if t is None or t.part is not part:
            return
        now_ms = self.replicas.now_ms()
        if now_ms >= t.next_catch_up_ms:
            t.next_catch_up_ms = now_ms + FOLLOWER_CATCH_UP_INTERVAL_MS
            self._catch_up_later(t)

    def on_appended(self, part: Partition, headers: list[fmt.BatchHeader]) -> None:
        """A leader's produce appended the batches of ``headers`` (final offsets)."""
        t = self._tracked.get(part.tp)
        if t is not None and t.part is part and t.end_offset == headers[0].base_offset:
            t.state.update(headers)
            t.end_offset = headers[-1].last_offset + 1
        # Otherwise the state reads them from the log when it catches up.

    def _on_roll(self, tp: tuple[str, int], lg: Log, base_offset: int) -> None:
        """``lg`` rolled at ``base_offset``, as a leader or a follower: the state, read up to
        there, is kept in a snapshot at that offset (Kafka's ``UnifiedLog.roll`` takes one). A
        state with more than ``ROLL_READ_HEADERS`` left to read (still loading) takes none: the
        roll is part of an append, which must not wait for it."""
        t = self._tracked.get(tp)
        if t is None or t.log is not lg or t.part.log is not lg:
            return
        try:
            if t.still_valid() and self._read(t, ROLL_READ_HEADERS) and t.end_offset == base_offset:
                self._snapshot(t, base_offset)
        except OSError as e:
            log.warning(
                "%s: producer snapshot at %d not taken: %s", lg.directory.name, base_offset, e
            )

    def close(self) -> None:
        """A clean stop: every state read to its log end and kept in a snapshot there (Kafka's
        ``UnifiedLog.close`` takes one), so the producers whose batches have all left the log
        are known after the restart. One with more than a slice left to read (still loading)
        is not kept: the stop does not wait for it, and the restart reads the log again."""
        for t in list(self._tracked.values()):
            try:
                if t.part.log is t.log and t.still_valid() and self._read(t, LOAD_SLICE_HEADERS):
                    self._snapshot(t, t.end_offset)
            except OSError as e:
                log.warning("producer state of %s-%d not kept: %s", *t.part.tp, e)
        self._tracked.clear()

    @staticmethod
    def _snapshot(t: _Tracked, offset: int) -> None:
        """Keep ``t``'s state, which has read every batch below ``offset``, in a snapshot
        there. One not written leaves the latest older: a restart reads from it (or, once
        segments after it are gone, does without it)."""
        try:
            t.log.write_producer_snapshot(offset, t.state)
        except OSError as e:
            log.warning(
                "%s: producer snapshot at %d not written: %s", t.log.directory.name, offset, e
            )

    # -- what produces use --------------------------------------------------------------------

    def loaded(self, part: Partition) -> bool:
        t = self._tracked.get(part.tp)
        return t is not None and t.part is part and t.still_valid() and t.caught_up

    async def ready(self, part: Partition, now_ms: int) -> None:
        """Bring ``part``'s state up to the log end, yielding to the loop between slices.
        The waiting produce reads itself, beside the background read if one runs (they share
        the state and take turns by slice), so it does not queue behind every other
        partition's background read at start-up."""
        if self.loaded(part):
            return
        await self._read_to_end(self._track(part, now_ms))

    def get(self, part: Partition, now_ms: int) -> ProducerStateManager:
        """``part``'s state, read to the log end now (what ``ready`` left is a few batches)."""
        t = self._track(part, now_ms)
        for _ in range(_LOAD_ATTEMPTS):
            try:
                if not t.still_valid():
                    self._restart(t, now_ms)
                self._read(t, None)
                break
            except OSError as e:
                self._fail_on_disk_error(part, e)
                self._restart(t, now_ms)  # a segment was let go while we read it
        else:
            # Never validate against a state read part way: the produce is refused (a
            # retriable error) rather than a retry appended again.
            raise KafkaError(
                Errors.KAFKA_STORAGE_ERROR,
                f"the producer state of {part.topic}-{part.partition} could not be read",
            )
        self._maybe_expire(t, now_ms)
        return t.state

    # -- internals ----------------------------------------------------------------------------

    def _track(self, part: Partition, now_ms: int) -> _Tracked:
        t = self._tracked.get(part.tp)
        if t is None or t.part is not part:
            self._forget(part.tp)
            t = _Tracked(
                part,
                part.log,
                ProducerStateManager(producer_id_expiration_ms=self.producer_id_expiration_ms),
                end_offset=0,
                truncations=0,
                next_expiry_ms=0,
            )
            self._restart(t, now_ms)
            self._tracked[part.tp] = t
        return t

    def _forget(self, tp: tuple[str, int]) -> None:
        # Its read, and a produce reading with it, stop at their next slice. Not cancelled:
        # a cancellation reached the produce waiting on it and ended its connection.
        self._tracked.pop(tp, None)
        self._tasks.pop(tp, None)

    def _restart(self, t: _Tracked, now_ms: int) -> None:
        """Start ``t`` over from the first segment whose batches may still hold a live
        producer: a leading run of segments older than ``producer.id.expiration.ms`` is
        skipped, not one in the middle (a producer may write batches with old timestamps,
        event time, after recent ones, and its state must come from its last ones). It starts
        empty but for what it knew from segments since deleted (see below)."""
        lg = t.part.log
        horizon_ms = now_ms - self.producer_id_expiration_ms
        start = lg.log_end_offset
        for seg in lg.segments:
            if not 0 <= seg.max_timestamp < horizon_ms:
                start = seg.base_offset
                break
        state = ProducerStateManager(producer_id_expiration_ms=self.producer_id_expiration_ms)
        base = lg.segments[0].base_offset
        # last_truncated_to tells of the last truncation only.
        one_truncation = lg.truncations == t.truncations + 1
        if (
            t.log is lg
            and one_truncation
            and start == base <= min(t.end_offset, lg.last_truncated_to)
        ):
            # One truncation, not below the first segment, of a log this state had read past
            # that segment's start, read again from it: the producers it knew only from
            # segments since deleted are as they were (Kafka reloads them from a producer
            # snapshot). Not after a full restart of the log (last_truncated_to 0), which
            # Kafka's follower clears, nor when expired segments are skipped (a producer's
            # batches there would be missing after the ones kept).
            state.keep_batches_below(t.state, base)
        lg.roll_listener = functools.partial(self._on_roll, t.part.tp, lg)
        t.snapshot_pending = True  # read by the first read (``_merge_snapshot``), off this step
        t.log = lg
        t.state = state
        t.end_offset = start
        t.truncations = lg.truncations
        t.next_expiry_ms = 0  # the first check once read: producers idle too long go at once

    def _read(self, t: _Tracked, limit: int | None) -> bool:
        """Read up to ``limit`` batch headers past ``t.end_offset`` (all without one); True
        once ``t`` has read to the log end."""
        if t.snapshot_pending:
            t.snapshot_pending = False
            self._merge_snapshot(t)
        lg = t.log
        end = lg.log_end_offset
        offset = t.end_offset
        if offset >= end:
            return True
        headers: list[fmt.BatchHeader] = []
        count = 0
        done = True
        while True:
            try:
                for header in lg.batch_headers_from(offset):
                    if header.base_offset >= end:
                        break
                    if header.last_offset < offset:
                        continue
                    if header.has_producer_id:
                        headers.append(header)
                    offset = header.last_offset + 1
                    count += 1
                    if limit is not None and count >= limit:
                        done = False
                        break
            except LogCorruptError as e:
                # The rest of that segment is lost to the state, not the later segments: a
                # producer's last batches there must still be found (they were all skipped,
                # and its next sequence refused). Kafka's load fails on such a read instead.
                later = [s.base_offset for s in lg.segments if offset < s.base_offset < end]
                log.error(
                    "%s: producer state read skipped a corrupt batch at or after %d%s: %s",
                    lg.directory.name,
                    offset,
                    f", going on at {later[0]}" if later else "",
                    e,
                )
                if later:
                    offset = later[0]
                    continue
            break
        if done:
            offset = max(offset, end)  # nothing more, or a gap compaction left at the end
        t.state.update(headers)
        t.end_offset = offset
        return done

    def _merge_snapshot(self, t: _Tracked) -> None:
        """The producers of the latest snapshot, at S, that the read from ``t.end_offset`` (a
        restart's start) does not give: those whose batches have all left the log (retention,
        DeleteRecords) since. From S on every batch is in the log, so the state is the
        snapshot's below S and the log's from S: below the start, the read starts at S
        instead. A snapshot below the first segment is not used: a producer's batches after it
        may be gone, and with them what it says of the producer (its sequence refused a
        producer's next batch). Kafka deletes those (``truncateAndReload``). Read at the first
        read, not at the restart: on a node's start every hosted partition restarts in one
        step of the loop, and decoding a snapshot of many producers takes a while."""
        lg = t.log
        found = lg.latest_producer_snapshot(self.producer_id_expiration_ms)
        if found is None:
            return
        offset, snapshot = found
        if offset < lg.segments[0].base_offset:
            return
        t.state.keep_batches_below(snapshot, min(offset, t.end_offset))
        t.end_offset = min(offset, t.end_offset)

    def _catch_up_later(self, t: _Tracked) -> asyncio.Task[None] | None:
        """The read of ``t`` to the log end, in the background; the running one if any."""
        task = self._tasks.get(t.part.tp)
        if task is not None and not task.done():
            return task
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None  # no loop (a test building a node): ``get`` reads when asked
        task = loop.create_task(self._catch_up(t), name=f"producer-state-{t.part.tp}")
        self._tasks[t.part.tp] = task
        task.add_done_callback(functools.partial(self._done, t.part.tp))
        return task

    def _done(self, tp: tuple[str, int], task: asyncio.Task[None]) -> None:
        if self._tasks.get(tp) is task:
            del self._tasks[tp]
        if not task.cancelled() and task.exception() is not None:
            log.error("producer state of %s-%d: %r", tp[0], tp[1], task.exception())

    async def _catch_up(self, t: _Tracked) -> None:
        async with self._background_reads:
            await self._read_to_end(t)

    async def _read_to_end(self, t: _Tracked) -> None:
        for _ in range(_LOAD_ATTEMPTS):
            try:
                while True:
                    if self._tracked.get(t.part.tp) is not t:
                        return  # forgotten meanwhile: the produce is refused as not led
                    if not t.still_valid():
                        self._restart(t, self.replicas.now_ms())
                    if self._read(t, LOAD_SLICE_HEADERS):
                        break
                    await asyncio.sleep(0)  # let the node's other clients in
            except OSError as e:
                self._fail_on_disk_error(t.part, e)
                self._restart(t, self.replicas.now_ms())  # a segment went while we read it
                continue
            self._maybe_expire(t, self.replicas.now_ms())
            return
        # The log kept changing under the reads: ``get`` reads it in one go when asked.

    def _fail_on_disk_error(self, part: Partition, error: OSError) -> None:
        """An error of the disk, not a segment let go while it was read (its file closed or
        deleted: EBADF, ENOENT), fails the log directory, as Kafka's reads do through
        ``maybeHandleIOException``; retried as a race, it refused every idempotent produce
        of the partition while the node stayed its leader (the node halts instead, and the
        leadership moves)."""
        if error.errno not in _SEGMENT_LET_GO_ERRNOS:
            self.replicas.log_dir_failure.fail(
                f"reading the producer state of {part.topic}-{part.partition}", error
            )
            raise KafkaError(
                Errors.KAFKA_STORAGE_ERROR,
                f"the producer state of {part.topic}-{part.partition} could not be read",
            ) from error

    def _maybe_expire(self, t: _Tracked, now_ms: int) -> None:
        """Kafka's removeExpiredProducers, every producer.id.expiration.check.interval.ms."""
        if now_ms >= t.next_expiry_ms:
            t.state.remove_expired_producers(now_ms)
            t.next_expiry_ms = now_ms + self.expiration_check_interval_ms


# ReplicaManager.appendToLocalLog answers these without the partition's log start.
_ERRORS_WITHOUT_LOG_START: Final = frozenset(
    {
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.MESSAGE_TOO_LARGE,
        Errors.RECORD_LIST_TOO_LARGE,
        Errors.CORRUPT_MESSAGE,
        Errors.KAFKA_STORAGE_ERROR,
        Errors.UNKNOWN_TOPIC_ID,
    }
)


# What Kafka's ByteBufferLogInputStream needs of a batch to know its size and magic
# (Records.HEADER_SIZE_UP_TO_MAGIC), and the least size it takes (LegacyRecord.RECORD_OVERHEAD_V0).
_HEADER_UP_TO_MAGIC: Final = 17
_MIN_RECORD_OVERHEAD: Final = 14


def _batch_spans(data: bytes) -> list[tuple[int, int]]:
    """(size, magic) of each batch of a produced partition's records, read as Kafka's
    ``ByteBufferLogInputStream.nextBatch`` reads them: the reading stops, without an error, at
    a batch cut short or at fewer bytes than its size and magic take; a size below any
    record's or an unknown magic is CORRUPT_MESSAGE (``nextBatchSize``)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while len(data) - pos >= _HEADER_UP_TO_MAGIC:
        size = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        if size < _MIN_RECORD_OVERHEAD:
            raise KafkaError(
                Errors.CORRUPT_MESSAGE,
                f"Record size {size} is less than the minimum record overhead "
                f"({_MIN_RECORD_OVERHEAD})",
            )
        magic = data[pos + _MAGIC_OFFSET]
        if magic > fmt.MAGIC_V2:  # a negative byte too
            raise KafkaError(Errors.CORRUPT_MESSAGE, f"Invalid magic found in record: {magic}")
        if len(data) - pos < size + fmt.LOG_OVERHEAD:
            break
        spans.append((size + fmt.LOG_OVERHEAD, magic))
        pos += size + fmt.LOG_OVERHEAD
    return spans


def _unreadable_batch(partition: str, data: bytes, error: fmt.RecordFormatError) -> KafkaError:
    """The answer to a batch whose header does not read, in Kafka's order: a base offset other
    than 0 first (``UnifiedLog.analyzeAndValidateRecords``: INVALID_RECORD), then a batch
    shorter than a batch's header or whose CRC does not hold (CORRUPT_MESSAGE, retriable; one
    cut short is no batch at all, ``_batch_spans``); a whole, sound batch whose
    offset range or record count is negative fails ``LogValidator.validateBatch``
    (INVALID_RECORD, which a producer does not retry)."""
    if len(data) >= fmt.HEADER_SIZE:
        header = fmt.HEADER.unpack_from(data)
        base_offset, batch_length, magic, crc = header[0], header[1], header[3], header[4]
        last_offset_delta, record_count = header[6], header[12]
        if base_offset != 0:
            return KafkaError(
                Errors.INVALID_RECORD,
                f"The baseOffset of the record batch in the append to {partition} should be 0, "
                f"but it is {base_offset}",
            )
        if (
            magic == fmt.MAGIC_V2
            and batch_length + fmt.LOG_OVERHEAD == len(data)
            and fmt.crc32c(memoryview(data)[fmt.ATTRIBUTES_OFFSET :]) == crc
        ):
            if last_offset_delta < 0:
                return KafkaError(
                    Errors.INVALID_RECORD,
                    f"Batch has an invalid offset range: [0, {last_offset_delta}] in topic "
                    f"partition {partition}",
                )
            if record_count < 0:
                return KafkaError(
                    Errors.INVALID_RECORD,
                    f"Invalid reported count for record batch: {record_count} in topic "
                    f"partition {partition}",
                )
    return KafkaError(Errors.CORRUPT_MESSAGE, str(error))


@dataclass(slots=True)
class _PartitionResult:
    index: int
    error: Errors = Errors.NONE
    message: str | None = None
    base_offset: int = -1
    log_start_offset: int = -1
    log_append_time: int = -1
    record_errors: tuple[tuple[int, str], ...] = ()
    partition: Partition | None = None
    # acks=-1: done once the HW passes the batch (registered at the append, see _append).
    committed: asyncio.Future[int] | None = None
    # NOT_ENOUGH_REPLICAS_AFTER_APPEND, decided when ``committed`` completed.
    after_append: KafkaError | None = None
    leader_hint: dict[str, int] = field(default_factory=dict)


class ProduceApi:
    def __init__(
        self,
        ctx: BrokerContext,
        producer_ids: ProducerIdManager,
        states: ProducerStates,
        off_loop: OffLoop,
    ) -> None:
        self.ctx = ctx
        self.producer_ids = producer_ids
        self.states = states
        self.off_loop = off_loop

    # -----------------------------------------------------------------------------------------
    # Produce.

    async def handle_produce(self, request: Request) -> Result:
        body = request.body
        acks = int(body.acks)
        timeout_ms = max(0, round(body.timeout.total_seconds() * 1000))
        # KafkaApis.handleProduceRequest collects the partitions into a map: a partition named
        # twice (in one topic entry or two) is appended once, with its last entry's records,
        # and answered once.
        entries: dict[tuple[Any, str | None], dict[int, Any]] = {}
        # v13+ (KIP-516): the topic the id named when the request came, by its id; the
        # appends come after awaits, and a topic deleted and created again under its name
        # meanwhile is another.
        named_by_id: dict[str, str] = {}
        for topic_data in body.topic_data:
            name = getattr(topic_data, "name", None)
            topic_id = getattr(topic_data, "topic_id", None)
            if request.version >= 13:
                resolved = self.ctx.topic_by_uuid(topic_id)
                name = None if resolved is None else resolved.name
                if resolved is not None:
                    named_by_id[resolved.name] = resolved.topic_id
            partitions = entries.setdefault((topic_id, name), {})
            for data in topic_data.partition_data:
                partitions[data.index] = data
        # KafkaApis.handleProduceRequest: transactional records with a transactional id the
        # authorizer refuses fail the whole request; kcoord refuses every transactional id
        # (InitProducerId, FindCoordinator), as an authorizer would.
        transactional = any(
            _is_transactional(data.records)
            for partitions in entries.values()
            for data in partitions.values()
        )
        topics: list[tuple[Any, str | None, list[_PartitionResult]]] = []
        walked = 0
        for (topic_id, name), partitions in entries.items():
            results = []
            for data in partitions.values():
                walked += 1
                if walked % PARTITIONS_PER_SLICE == 0:
                    await asyncio.sleep(0)  # the other connections' turn
                scan = None
                if name is not None and acks in (-1, 0, 1):
                    if not transactional:
                        scan = await self._scanned(name, data.index, data.records, acks)
                    await self._producer_state_ready(name, data.index)
                if acks not in (-1, 0, 1):
                    result = _PartitionResult(data.index, Errors.INVALID_REQUIRED_ACKS)
                elif name is None:
                    result = _PartitionResult(data.index, Errors.UNKNOWN_TOPIC_ID)
                elif transactional:
                    result = _PartitionResult(
                        data.index, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                    )
                else:
                    result = self._append(
                        name,
                        data.index,
                        data.records,
                        acks,
                        request.version,
                        scan,
                        topic_id=named_by_id.get(name),
                    )
                results.append(result)
            topics.append((topic_id, name, results))
        failed = any(r.error is not Errors.NONE for _, _, rs in topics for r in rs)
        if acks == 0:
            return CLOSE_CONNECTION if failed else NO_RESPONSE
        waits = [r for _, _, rs in topics for r in rs if r.committed is not None]
        if not waits:
            return self._response(request, topics)
        return Deferred(self._complete(request, topics, waits, timeout_ms))

    async def _producer_state_ready(self, topic: str, index: int) -> None:
        """Awaited before a partition's append, never inside it (see ``ProducerStates``); a
        partition this node does not lead is left to ``_append`` to refuse."""
        if is_internal(topic):
            return
        try:
            part = self.ctx.replicas.leader_partition(topic, index)
        except KafkaError:
            return
        if not self.states.loaded(part):
            with contextlib.suppress(KafkaError):  # the append's ``get`` says it, for this one
                await self.states.ready(part, self.ctx.now_ms())

    async def _scanned(
        self, topic: str, index: int, records: bytes | None, acks: int
    ) -> LeaderScan | None:
        """The records of a batch costly to read (``OFF_LOOP_RECORDS_BYTES``) read on the
        listener's codec threads, as Kafka's request handler threads validate a produce; the
        loop serves the other clients meanwhile (it gets the GIL back every 5 ms). Awaited
        before a partition's append, never inside it; ``None`` for the rest, which the append
        reads itself, and for a batch it refuses before reading (not the leader, the ISR
        below min.insync.replicas: a producer retrying it is not read each time)."""
        if (
            not records
            or is_internal(topic)
            or fmt.batch_records_bound(records) < OFF_LOOP_RECORDS_BYTES
        ):
            return None
        try:
            part = self.ctx.replicas.leader_partition(topic, index)
            self.ctx.replicas.check_leader_and_min_isr(part, acks)
        except KafkaError:
            return None  # refused by _append
        return await self.off_loop(part.log.scan_for_leader, records)

    def _append(  # noqa: PLR0917 - one partition's part of the request
        self,
        topic: str,
        index: int,
        records: bytes | None,
        acks: int,
        version: int,
        scan: LeaderScan | None = None,
        *,
        topic_id: str | None = None,
    ) -> _PartitionResult:
        """One partition's append; ``topic_id``, for a request by id, the topic it named
        (``ReplicaManager.getPartitionOrException``: UNKNOWN_TOPIC_ID if the partition hosted
        under its name is another topic's now)."""
        result = _PartitionResult(index)
        # Where a refusal's log start comes from, once past the request's own checks.
        appending: Partition | None = None
        try:
            if is_internal(topic):
                raise KafkaError(
                    Errors.INVALID_TOPIC_EXCEPTION, f"clients may not write to {topic}"
                )
            if topic_id is not None:
                hosted = self.ctx.replicas.get_partition(topic, index)
                if hosted is not None and hosted.topic_id != topic_id:
                    raise KafkaError(
                        Errors.UNKNOWN_TOPIC_ID,
                        f"{topic}-{index} is no longer the partition of the topic id produced to",
                    )
            part = self.ctx.replicas.leader_partition(topic, index)
            # ProduceRequest.validateRecords, over the batches Kafka's reader finds.
            spans = _batch_spans(records or b"")
            if not spans:
                raise KafkaError(
                    Errors.INVALID_RECORD,
                    f"Produce requests with version {version} must have at least one record batch",
                )
            if spans[0][1] != fmt.MAGIC_V2:
                raise KafkaError(
                    Errors.INVALID_RECORD,
                    f"Produce requests with version {version} are only allowed to contain record "
                    "batches with magic version 2",
                )
            if len(spans) > 1:
                raise KafkaError(
                    Errors.INVALID_RECORD,
                    f"Produce requests with version {version} are only allowed to contain "
                    "exactly one record batch per partition",
                )
            # Bytes after the batch too few to be another are left out, as
            # UnifiedLog.trimInvalidBytes does.
            data = (records or b"")[: spans[0][0]]
            try:
                headers = [h for _, h in fmt.iter_headers(data)]
            except fmt.RecordFormatError as e:
                appending = part  # appendToLocalLog's, as below
                raise _unreadable_batch(f"{topic}-{index}", data, e) from e
            for h in headers:
                if version < ZSTD_MIN_PRODUCE_VERSION and (
                    h.attributes & fmt.COMPRESSION_MASK == fmt.Compression.ZSTD
                ):
                    # ProduceRequest.validateRecords: zstd needs Produce v7 (KIP-110).
                    raise KafkaError(
                        Errors.UNSUPPORTED_COMPRESSION_TYPE,
                        f"Produce requests with version {version} are not allowed to use "
                        "ZStandard compression",
                    )
            # What ReplicaManager.appendToLocalLog refuses from here is answered with the
            # partition's log start, but for a few errors (processFailedRecord).
            appending = part
            for h in headers:
                if h.is_control:
                    raise KafkaError(Errors.INVALID_RECORD, "clients may not write control records")
                if h.has_producer_id and h.base_sequence < 0:
                    # LogValidator.validateBatch: an idempotent batch needs a sequence.
                    raise KafkaError(
                        Errors.INVALID_RECORD,
                        f"Invalid sequence number {h.base_sequence} in record batch with "
                        f"producerId {h.producer_id}",
                    )
            # Leadership and min.insync.replicas first, as Kafka: were a batch queued behind a
            # refused one answered OUT_OF_ORDER_SEQUENCE_NUMBER instead, librdkafka would bump
            # its epoch and resend, under new sequences, batches of other partitions that
            # failed after they were appended (duplicates; librdkafka issue #4953).
            self.ctx.replicas.check_leader_and_min_isr(part, acks)
            state = self.states.get(part, self.ctx.now_ms())
            verdict = state.validate(headers)
            if isinstance(verdict, (Rejected, Duplicate)):
                # UnifiedLog.append validates the batch before its producer's state: the
                # sequence fields are under the CRC, and a retry that does not hold up is
                # refused for what is wrong with it (an accepted one is, by the append).
                self.ctx.replicas.check_local(part, data, scan)
            if isinstance(verdict, Rejected):
                raise KafkaError(verdict.error, verdict.message)
            if isinstance(verdict, Duplicate):
                result.base_offset = verdict.first_offset
                result.log_append_time = verdict.timestamp_ms
                last_offset = verdict.last_offset
                # Kafka's appendRecordsToLeader looks at the HW after a duplicate as well: it
                # may have been held back (KIP-966) when the original was appended.
                self.ctx.replicas.maybe_advance_high_watermark(part)
            else:
                appended = self.ctx.replicas.append_local(part, data, required_acks=acks, scan=scan)
                result.base_offset = appended.base_offset
                result.log_append_time = appended.log_append_time_ms
                last_offset = appended.last_offset
                self.states.on_appended(
                    part,
                    _stamped(
                        headers, appended.base_offset, part.leader_epoch, appended.max_timestamp
                    ),
                )
                if self.ctx.settings.bug_append_twice:
                    self.ctx.replicas.append_local(part, data, required_acks=acks)
            result.log_start_offset = part.log.log_start_offset
            if acks == -1:
                # Now, before any await: a wait registered later could miss a role change
                # that truncates the batch, and wait on a follower for somebody else's records.
                result.partition = part
                result.committed = part.high_watermark_reached(last_offset + 1)
                # The min-ISR check is made when the HW passes the batch, as Kafka's
                # DelayedProduce settles a partition once (acksPending): made when the whole
                # request was done, an ISR shrink meanwhile failed a batch committed at min ISR.
                if result.committed.done():
                    self._check_after_append(result, result.committed)
                else:
                    result.committed.add_done_callback(
                        functools.partial(self._check_after_append, result)
                    )
        except KafkaError as e:
            result.error, result.message = e.code, e.message or None
            result.record_errors = e.record_errors
            if e.code is Errors.NOT_LEADER_OR_FOLLOWER:
                result.leader_hint = self.ctx.leader_hint(topic, index)
            if appending is not None and e.code not in _ERRORS_WITHOUT_LOG_START:
                result.log_start_offset = appending.log.log_start_offset
        except Exception as e:
            # ReplicaManager.handleAppendError's last case: a failure nothing above names is
            # this partition's UNKNOWN_SERVER_ERROR, logged, not the whole request's (whose
            # other partitions may be appended already, and would be answered failed).
            log.exception("%s-%d: appending failed", topic, index)
            result.error, result.message = Errors.UNKNOWN_SERVER_ERROR, str(e) or None
            if appending is not None:
                result.log_start_offset = appending.log.log_start_offset
        return result

    async def _complete(
        self,
        request: Request,
        topics: list[tuple[Any, str | None, list[_PartitionResult]]],
        waits: list[_PartitionResult],
        timeout_ms: int,
    ) -> dict[str, Any]:
        await wait_or_cancel(
            [r.committed for r in waits if r.committed is not None], timeout_ms / 1000
        )
        for result in waits:
            assert result.committed is not None and result.partition is not None
            if result.committed.cancelled():
                result.error = Errors.REQUEST_TIMED_OUT
                result.message = "the high watermark did not reach the batch in time"
                continue
            part = result.partition
            error = result.committed.exception() or result.after_append
            if isinstance(error, KafkaError):
                result.error, result.message = error.code, error.message or None
                if error.code is not Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
                    result.leader_hint = self.ctx.leader_hint(part.topic, part.partition)
            elif error is not None:
                raise error
        return self._response(request, topics)

    def _check_after_append(self, result: _PartitionResult, committed: asyncio.Future[int]) -> None:
        if committed.cancelled() or committed.exception() is not None:
            return
        assert result.partition is not None
        try:
            self.ctx.replicas.check_enough_replicas_after_append(result.partition)
        except KafkaError as e:
            result.after_append = e

    def _response(
        self, request: Request, topics: list[tuple[Any, str | None, list[_PartitionResult]]]
    ) -> dict[str, Any]:
        leaders = [
            r.leader_hint["leader_id"]
            for _, _, rs in topics
            for r in rs
            if r.leader_hint.get("leader_id", -1) >= 0
        ]
        return {
            "throttle_time": 0,
            "responses": [
                {
                    "name": name or "",
                    "topic_id": topic_id,
                    "partition_responses": [
                        {
                            "index": r.index,
                            "error_code": r.error,
                            "error_message": r.message if r.error is not Errors.NONE else None,
                            "base_offset": r.base_offset,
                            "log_append_time": r.log_append_time,
                            "log_start_offset": r.log_start_offset,
                            "record_errors": [
                                {"batch_index": i, "batch_index_error_message": m}
                                for i, m in r.record_errors
                            ],
                            "current_leader": r.leader_hint or NO_LEADER_HINT,
                        }
                        for r in results
                    ],
                }
                for topic_id, name, results in topics
            ],
            "node_endpoints": self.ctx.node_endpoints(leaders) if request.version >= 10 else [],
        }

    # -----------------------------------------------------------------------------------------
    # DescribeProducers.

    async def handle_describe_producers(self, request: Request) -> Result:
        topics = []
        done = 0
        for topic in request.body.topics:
            name = str(topic.name)
            partitions = []
            for index in topic.partition_indexes:
                done += 1
                if done % PARTITIONS_PER_SLICE == 0:
                    await asyncio.sleep(0)  # the other connections' turn, as in a Produce
                partitions.append(await self._active_producers(name, int(index)))
            topics.append({"name": name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    async def _active_producers(self, topic: str, index: int) -> dict[str, Any]:
        try:
            producers = await self._producers_of(self.ctx.replicas.hosted_partition(topic, index))
        except KafkaError as e:
            return {
                "partition_index": index,
                "error_code": e.code,
                "error_message": e.message or None,
                "active_producers": [],
            }
        return {
            "partition_index": index,
            "error_code": Errors.NONE,
            "error_message": None,
            "active_producers": producers,
        }

    async def _producers_of(self, part: Partition) -> list[dict[str, Any]]:
        if is_internal(part.topic):
            return []
        await self.states.ready(part, self.ctx.now_ms())
        # Let go while the state loaded: the error for the partition now (its topic deleted
        # meanwhile is UNKNOWN_TOPIC_OR_PARTITION), or for a replica made since.
        if self.ctx.replicas.hosted_partition(part.topic, part.partition) is not part:
            raise KafkaError(Errors.NOT_LEADER_OR_FOLLOWER, f"{part.topic}-{part.partition}")
        state = self.states.get(part, self.ctx.now_ms())
        return [
            {
                "producer_id": entry.producer_id,
                "producer_epoch": entry.producer_epoch,
                "last_sequence": entry.last_seq,
                "last_timestamp": entry.last_timestamp_ms,
                "coordinator_epoch": -1,
                "current_txn_start_offset": -1,
            }
            for _, entry in sorted(state.producers.items())
        ]

    # -----------------------------------------------------------------------------------------
    # InitProducerId.

    async def handle_init_producer_id(self, request: Request) -> Result:
        body = request.body
        if (getattr(body, "producer_id", -1) == -1) != (getattr(body, "producer_epoch", -1) == -1):
            # KIP-360 (KafkaApis.handleInitProducerIdRequest): an id without its epoch, or an
            # epoch without its id, names no producer.
            return {"error_code": Errors.INVALID_REQUEST, "producer_id": -1, "producer_epoch": -1}
        if body.transactional_id == "":
            # TransactionCoordinator.handleInitProducerId.
            return {"error_code": Errors.INVALID_REQUEST, "producer_id": -1, "producer_epoch": -1}
        if body.transactional_id is not None:
            # As FindCoordinator for a transactional id (kafka/metadata.py): refused, as by
            # Kafka's authorizer (KafkaApis.handleInitProducerIdRequest).
            return {
                "error_code": Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1,
                "producer_epoch": -1,
            }
        try:
            producer_id = self.producer_ids.next_id()
        except (OSError, ProducerIdsExhaustedError) as e:
            log.error("cannot allocate a producer id: %s", e)
            # A block of ids that cannot be written down may be next time: retriable, as
            # Kafka's ProducerIdManager while it has no block (the Java producer gives up on
            # UNKNOWN_SERVER_ERROR). An exhausted counter is for good.
            return {
                "error_code": Errors.UNKNOWN_SERVER_ERROR
                if isinstance(e, ProducerIdsExhaustedError)
                else Errors.COORDINATOR_LOAD_IN_PROGRESS,
                "producer_id": -1,
                "producer_epoch": -1,
            }
        return {
            "throttle_time": 0,
            "error_code": Errors.NONE,
            "producer_id": producer_id,
            "producer_epoch": 0,
        }


def _stamped(
    headers: list[fmt.BatchHeader], base_offset: int, leader_epoch: int, max_timestamp: int
) -> list[fmt.BatchHeader]:
    """The header of the request's one batch (``ProduceRequest.validateRecords``) as the log
    stored it: its offsets from ``base_offset``, the leader's epoch, and the max timestamp the
    log gave it (its records', as Kafka's LogValidator sets it whatever the producer's header
    said, or on a LogAppendTime topic the leader's stamp). The producer's state keeps that
    one, as a state read from the log does: kept from the header as sent, -1 made the producer
    idle since 1970, expired at the next check, and its retry appended again."""
    (sent,) = headers
    return [
        sent._replace(
            base_offset=base_offset,
            partition_leader_epoch=leader_epoch,
            max_timestamp=max_timestamp,
        )
    ]
