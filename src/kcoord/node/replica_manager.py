"""Partitions hosted by this node: logs, roles and high watermarks (Kafka's ``ReplicaManager``).

Theory of operation
-------------------
The metadata log says which partitions this node hosts and in which role (``on_role_changes``:
``become_leader`` / ``become_follower`` / ``stop_replica``, once per leader epoch). A hosted
partition is a ``Partition``: its ``Log`` (storage), its role and leader epoch, and its high
watermark (HW), the offset below which records are committed and visible to consumers and to the
group coordinator.

Writes go through the leader only (``append``); ``acks=all`` (-1) waits until the HW passes the
appended batch, ``acks=1`` answers once the leader's log has it, ``acks=0`` is answered by
nobody. Reads (``fetch``) see records below the HW (consumers) or below the log end (replicas).
HW listeners (the coordinator runtime) are told every time the HW of a partition moves.

Replication (DESIGN.md section 5, Kafka's ISR model). Followers run a ``ReplicaFetcher`` per
leader node (node/replica_fetcher.py) that long-polls this node's ``handle_replica_fetch``; each
fetch tells the leader the follower's log end offset, recorded in the partition's pure
``LeaderReplication`` (cluster/replication.py), and the HW becomes the min LEO over the
(maximal, KIP-497) ISR. Before fetching from a new leader epoch a follower truncates its log to
where it agrees with the leader (``handle_epoch_end_offset``, KIP-101/279). A fetch also tells
the leader the follower's HW, so the leader answers when it has a newer one (KIP-1166), after
``HIGH_WATERMARK_LINGER_MS`` unless records come first. In a fetch session (KIP-227) the
leader looks only at the partitions the request names and those marked since (appends, HW and
log start moves, role changes; cluster/fetch_session.py), and records a skipped follower
position when the partition next gets records (``_record_skipped_fetches``).

The ISR is the metadata log's: the leader proposes shrinks (followers not caught up for
``replica.lag.time.max.ms``) and expansions (followers caught up to the HW and to the start of
this leader's epoch) to the active controller with AlterPartition (``maybe_propose_isr_changes``,
run periodically), and the new ISR takes effect when the committed PartitionChange reaches this
node's image (``on_metadata_delta``). A change stays in flight until then, or until the
controller says it did not apply it; one whose outcome is unknown is sent again as it was.
An acks=all append is refused with NOT_ENOUGH_REPLICAS while the committed ISR is smaller
than the topic's ``min.insync.replicas``, and the HW does not move then (KIP-966's strict min
ISR): a write appended before the ISR shrank below it waits, and times out, instead of being
committed by fewer replicas than the controller's ELR election counts on. A Produce whose
batch the HW passed while the maximal ISR was too small is answered
NOT_ENOUGH_REPLICAS_AFTER_APPEND (``check_enough_replicas_after_append``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kcoord.cluster.fetch_session import FetchItem, FetchSessions
from kcoord.cluster.replication import UNKNOWN_OFFSET, LeaderReplication
from kcoord.errors import Errors
from kcoord.node.log_dir_failure import LogDirFailureChannel
from kcoord.node.metadata import MetadataCache
from kcoord.raft import records as rec
from kcoord.raft.image import (
    BecomeFollower,
    BecomeLeader,
    ConfigResource,
    MetadataDelta,
    MetadataImage,
    RoleChange,
    StopReplica,
)
from kcoord.raft.records import ConfigResourceType
from kcoord.storage import format as fmt
from kcoord.storage.config import (
    InvalidConfigError,
    LogConfig,
    cluster_topic_defaults,
    parse_min_insync_replicas,
    segment_bytes_from_before_kip_1030,
)
from kcoord.storage.log import (
    FetchData,
    InvalidRecordError,
    InvalidTimestampError,
    LeaderScan,
    Log,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from kcoord.storage.manager import CheckpointWrite, LogManager
from kcoord.storage.segment import LogCorruptError

log = logging.getLogger(__name__)

DELETE_TO_HIGH_WATERMARK: Final = -1  # DeleteRecordsRequest.HIGH_WATERMARK

TopicPartition = tuple[str, int]
HighWatermarkListener = Callable[["Partition", int], None]
# (partition, is_leader now): on becoming leader, on every follower role change (a new leader
# or epoch) and on removal (then the partition is no longer in ``partitions``).
RoleListener = Callable[["Partition", bool], None]
# Sends an AlterPartition payload to the active controller, returns its answer (or raises).
AlterPartitionCall = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

MIN_INSYNC_REPLICAS_CONFIG = "min.insync.replicas"
# Backoff before an ISR change is sent again when no answer came, or proposed afresh after the
# controller refused it (Kafka retries AlterPartition with a backoff too).
ISR_CHANGE_RETRY_BACKOFF_MS = 500
# How long an answered change (applied, or refused for stale epochs) waits for the metadata
# update that should follow before it is sent again.
ISR_CHANGE_METADATA_WAIT_MS = 5000
# A follower's fetch whose answer would carry only a HW it lacks waits this long for records to
# go with it. KIP-1166 answers such a fetch at once; with commits in a row that doubled the
# replica fetches (every commit's HW went out alone, then its records), and one client's
# commit rate was ~0.88x of what it is with the HW waiting for the next records (alternated
# runs, README). Quiet followers still learn the HW this soon (standby shards replay up to it).
HIGH_WATERMARK_LINGER_MS = 10


class KafkaError(Exception):
    """An error with Kafka's code, answered to the client as is."""

    def __init__(
        self, code: Errors, message: str = "", record_errors: Sequence[tuple[int, str]] = ()
    ) -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message
        # Produce only: (index of the record in its batch, message) per refused record.
        self.record_errors = tuple(record_errors)


def _fetch_result(
    item: FetchItem,
    part: Partition | None = None,
    *,
    error: Errors = Errors.NONE,
    records: bytes = b"",
    diverging_epoch: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One partition of a ``ReplicaFetch`` answer; the leader's offsets when ``part`` is given."""
    lg = part.log if part is not None else None
    return {
        "topic": item.topic,
        "partition": item.partition,
        "error": int(error),
        "high_watermark": part.high_watermark if part is not None else -1,
        "log_start_offset": lg.log_start_offset if lg is not None else -1,
        "log_end_offset": lg.log_end_offset if lg is not None else -1,
        "records": records,
        "diverging_epoch": diverging_epoch,
    }


@dataclass(slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_start_offset: int
    log_append_time_ms: int = -1
    # As the log stored it: the records' max (whatever the producer's header said), or the
    # leader's stamp on a LogAppendTime topic.
    max_timestamp: int = -1


@dataclass(slots=True)
class FetchResult:
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int


class OffsetWaiters:
    """Futures waiting for a watermark to reach an offset (the high watermark for acks=all
    appends, the low watermark for DeleteRecords), each resolved with the watermark that
    reached it (a DeleteRecords answer names the low watermark of the moment its partition was
    done, as Kafka's DelayedDeleteRecords keeps it). Cancel a future to give up: it leaves the
    list."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: list[tuple[int, asyncio.Future[int]]] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def wait(self, offset: int, watermark: int) -> asyncio.Future[int]:
        """A future done once ``release`` is given a watermark at or above ``offset`` (at
        once if ``watermark`` already is)."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if watermark >= offset:
            fut.set_result(watermark)
        else:
            waiter = (offset, fut)
            self._waiting.append(waiter)
            fut.add_done_callback(lambda f: self._forget(waiter) if f.cancelled() else None)
        return fut

    def release(self, watermark: int) -> None:
        ready = [f for o, f in self._waiting if o <= watermark]
        self._waiting = [(o, f) for o, f in self._waiting if o > watermark]
        for fut in ready:
            if not fut.done():
                fut.set_result(watermark)

    def fail(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, []
        for _, fut in waiting:
            if not fut.done():
                fut.set_exception(error)

    def _forget(self, waiter: tuple[int, asyncio.Future[int]]) -> None:
        """A cancelled wait leaves the list (one that completed was taken off already)."""
        with contextlib.suppress(ValueError):
            self._waiting.remove(waiter)


@dataclass(slots=True)
class Partition:
    topic: str
    partition: int
    topic_id: str
    log: Log
    is_leader: bool = False
    leader_id: int = -1
    leader_epoch: int = -1
    high_watermark: int = 0
    # From the metadata image: the replica set, the committed ISR and the partition epoch.
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    partition_epoch: int = -1
    # Leader only: the followers' state, the HW and the in-flight ISR change.
    replication: LeaderReplication | None = None
    # No ISR change is proposed, or the in-flight one sent again, before this time (on the
    # ReplicaManager's ``monotonic_ms``).
    isr_change_retry_ms: int = 0
    # Leader only: the AlterPartition item of the in-flight ISR change (``pending_isr``).
    isr_proposal: dict[str, Any] | None = None
    # Follower only: must reconcile with the leader (KIP-101/279) before fetching.
    truncation_pending: bool = False
    # Leader only: the log start offset each follower last reported (for DeleteRecords).
    follower_log_starts: dict[int, int] = field(default_factory=dict)
    hw_waiters: OffsetWaiters = field(default_factory=OffsetWaiters)
    # Leader only: DeleteRecords answers waiting for the low watermark.
    low_watermark_waiters: OffsetWaiters = field(default_factory=OffsetWaiters)

    @property
    def tp(self) -> TopicPartition:
        return self.topic, self.partition

    def reset_high_watermark_to_log_end(self) -> None:
        """After a truncation below the HW: the HW may not stay above the log end (Kafka's
        ``UnifiedLog.truncateTo``)."""
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    def diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int) -> dict[str, int] | None:
        """Kafka's ``Partition.fetchRecords`` divergence check (KIP-320), for followers and
        consumers alike: the fetcher's last fetched epoch ends before its fetch offset here,
        or is unknown here. None when it does not diverge (or sent no epoch)."""
        if last_fetched_epoch < 0:
            return None
        epoch, end_offset = self.log.epoch_cache.end_offset_for(
            last_fetched_epoch, self.log.log_end_offset
        )
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return {"epoch": epoch, "end_offset": end_offset}
        return None

    def fetch_divergence(self, fetch_offset: int, last_fetched_epoch: int) -> dict[str, int] | None:
        """Kafka's ``Partition.readRecords`` for a fetch that sent its last fetched epoch, from a
        follower or a consumer alike: OFFSET_OUT_OF_RANGE when this log cannot place the epoch
        (no end offset to truncate to; -1 on the wire reads as "no divergence", and the fetcher
        asked again for ever) or when the fetch offset is below the log start, diverging or not
        (the fetcher resets, or restarts its log at the log start); else the diverging epoch, or
        None."""
        diverging = self.diverging_epoch(fetch_offset, last_fetched_epoch)
        if diverging is None:
            return None
        lg = self.log
        if diverging["epoch"] < 0:
            raise KafkaError(
                Errors.OFFSET_OUT_OF_RANGE,
                "Could not determine the end offset of the last fetched epoch "
                f"{last_fetched_epoch} from the request",
            )
        if fetch_offset < lg.log_start_offset:
            raise KafkaError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"Received request for offset {fetch_offset} for partition {self.topic}-"
                f"{self.partition}, but we only have log segments in the range "
                f"{lg.log_start_offset} to {lg.log_end_offset}.",
            )
        return diverging

    def follow_high_watermark(self, leader_high_watermark: int) -> bool:
        """Follower: the leader's HW, within [log start, log end], down as well as up (Kafka's
        ``UnifiedLog.updateHighWatermark``, through ``maybeUpdateHighWatermark`` on every
        fetch); True if it changed. Only up, a HW above what the leader committed stayed: a
        node replaying the metadata log after a restart briefly led an old epoch alone, took
        its log end (with records of a later epoch not committed) for its HW, and kept it as
        a follower."""
        lg = self.log
        target = max(min(leader_high_watermark, lg.log_end_offset), lg.log_start_offset)
        if target == self.high_watermark:
            return False
        raised = target > self.high_watermark
        self.high_watermark = target
        if raised:
            self.hw_waiters.release(target)
        return True

    def set_high_watermark(self, high_watermark: int) -> bool:
        """Move the HW up (never down, never past the log end); True if it moved."""
        high_watermark = min(high_watermark, self.log.log_end_offset)
        if high_watermark <= self.high_watermark:
            return False
        self.high_watermark = high_watermark
        self.hw_waiters.release(high_watermark)
        return True

    def high_watermark_reached(self, offset: int) -> asyncio.Future[int]:
        """A future done once the HW is at or above ``offset``, failed with
        NOT_LEADER_OR_FOLLOWER if this replica stops leading first (Kafka's ``DelayedProduce``
        asks ``checkEnoughReplicasReachOffset``, which answers the same for a follower).

        Call it right after the append, with no await in between: it is registered at once,
        so a role change that truncates the batch cannot slip between the append and the
        wait. A follower's HW can pass the offset with *another* leader's records, so a
        non-leader never waits. Cancel the future to give up (a timeout); it leaves the list.
        """
        if not self.is_leader and self.high_watermark < offset:
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            fut.set_exception(
                KafkaError(
                    Errors.NOT_LEADER_OR_FOLLOWER, f"{self.topic}-{self.partition}: not the leader"
                )
            )
            return fut
        return self.hw_waiters.wait(offset, self.high_watermark)

    def fail_waiters(self, code: Errors, delete_records_code: Errors | None = None) -> None:
        """Fail every wait (this replica stops leading): the HW waits with ``code``, the low
        watermark waits with ``delete_records_code`` (``code`` if None), as Kafka's
        ``DelayedDeleteRecords`` answers a replica that no longer leads."""
        name = f"{self.topic}-{self.partition}"
        self.hw_waiters.fail(KafkaError(code, name))
        self.low_watermark_waiters.fail(KafkaError(delete_records_code or code, name))


def check_current_leader_epoch(part: Partition, current_leader_epoch: int) -> None:
    """``Partition.checkCurrentLeaderEpoch`` (KIP-320). Only -1 skips the check, as
    ``ReplicaManager.lastOffsetForLeaderEpoch`` (RecordBatch.NO_PARTITION_LEADER_EPOCH) and
    ``fetchOffset`` (ListOffsetsResponse.UNKNOWN_EPOCH) read it; any other negative epoch is
    an old one (FENCED_LEADER_EPOCH). Fetch maps every negative epoch to -1 first
    (``FetchRequest.optionalEpoch``)."""
    if current_leader_epoch in (fmt.NO_PARTITION_LEADER_EPOCH, part.leader_epoch):
        return
    if current_leader_epoch < part.leader_epoch:
        raise KafkaError(Errors.FENCED_LEADER_EPOCH, f"{part.topic}-{part.partition}")
    raise KafkaError(Errors.UNKNOWN_LEADER_EPOCH, f"{part.topic}-{part.partition}")


def _isr_change_of(part: Partition) -> tuple[int, int, tuple[int, ...]] | None:
    """Which ISR change ``part`` has in flight: its leader and partition epochs and the ISR
    (an answer about another one, sent before a metadata update, says nothing of it)."""
    item = part.isr_proposal
    if item is None:
        return None
    return (item["leader_epoch"], item["partition_epoch"], tuple(r for r, _ in item["new_isr"]))


class ReplicaManager:
    def __init__(
        self,
        node_id: int,
        logs: LogManager,
        cache: MetadataCache,
        now_ms: Callable[[], int],
        *,
        default_log_config: LogConfig | None = None,
        replica_lag_time_max_ms: int = 10_000,
        min_insync_replicas: int = 1,
        broker_epoch: Callable[[], int | None] = lambda: -1,
        alter_partition: AlterPartitionCall | None = None,
        log_dir_failure: LogDirFailureChannel | None = None,
        high_watermark_linger_ms: int = HIGH_WATERMARK_LINGER_MS,
        monotonic_ms: Callable[[], int] | None = None,
    ) -> None:
        self.node_id = node_id
        self.logs = logs
        # A write to the data directory that fails halts the node (node/log_dir_failure.py).
        self.log_dir_failure = log_dir_failure or LogDirFailureChannel(logs.data_dir, halt=None)
        # Per follower: when each partition last had records in an answer (a count of reads),
        # and the followers whose last answer left a partition out for want of room.
        self._served_by_replica: dict[int, dict[TopicPartition, int]] = {}
        self._starved_replicas: set[int] = set()
        self._fetch_rounds = 0
        self.cache = cache
        self.now_ms = now_ms
        # For the ISR changes' retry delays (``isr_change_retry_ms``): a wall clock stepped
        # back held an in-flight change, and with it the HW, for as long as the step (Kafka's
        # AlterPartitionManager retries on its scheduler, a relative delay). The wall clock
        # (``now_ms``) stays for the replicas' lag, as Kafka's getOutOfSyncReplicas reads it.
        self.monotonic_ms = monotonic_ms or now_ms
        self.default_log_config = default_log_config or LogConfig()
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.min_insync_replicas = min_insync_replicas  # the node default (Kafka's)
        self.broker_epoch = broker_epoch
        self.alter_partition = alter_partition
        self.high_watermark_linger_ms = high_watermark_linger_ms
        self.partitions: dict[TopicPartition, Partition] = {}
        self._hw_listeners: list[HighWatermarkListener] = []
        self._role_listeners: list[RoleListener] = []
        self._checkpointed_hw = logs.read_high_watermarks()
        # Long-polling replica fetches wait on these; set on every append and HW move.
        self._fetch_wakeups: set[asyncio.Event] = set()
        # The followers' fetch sessions (KIP-227): a fetch names only what changed.
        self.fetch_sessions = FetchSessions(lambda: random.randrange(1, 2**31))
        self._unfenced: frozenset[int] = frozenset()
        self._unfenced_key: tuple[int, int] | None = None
        # Inside ``one_log_start_checkpoint``: how deep, and whether a log start moved.
        self._log_start_batches = 0
        self._log_start_moved = False
        self._isr_tasks: set[asyncio.Task[None]] = set()
        # For the node's metrics: ISR changes of the partitions this node leads, as committed
        # (Kafka's IsrShrinksPerSec / IsrExpandsPerSec), and bytes appended to hosted logs as
        # leader and as follower (the fetchers add theirs).
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.leader_bytes_appended = 0
        self.follower_bytes_appended = 0

    # -----------------------------------------------------------------------------------------
    # Listeners.

    def add_high_watermark_listener(self, listener: HighWatermarkListener) -> None:
        self._hw_listeners.append(listener)

    def add_role_listener(self, listener: RoleListener) -> None:
        self._role_listeners.append(listener)

    # -----------------------------------------------------------------------------------------
    # Roles, from the metadata log.

    def log_config_for(self, topic_configs: Mapping[str, str]) -> LogConfig:
        """The log settings of a topic's configs, over the cluster-level dynamic defaults
        (``kafka-configs --entity-default``: ``log.retention.ms`` ...), over this node's
        config file (Kafka's ``LogConfig`` with ``extractLogConfigMap`` as its defaults).
        The controller validates every topic config
        it commits, but a metadata log written before it did, or by a controller of a newer
        version (a config this one does not implement, a bound it no longer has), may hold
        one this node refuses: that one is left out and the others taken. Dropping them all
        turned a compacted topic whose retention.ms is -1 into one deleted after seven days,
        on this replica alone (Kafka's ``LogConfig`` ignores names it does not know)."""
        cluster = self.cache.image.resource_configs(ConfigResource(ConfigResourceType.BROKER, ""))
        topic_configs = {**cluster_topic_defaults(cluster), **topic_configs}
        topic_configs = segment_bytes_from_before_kip_1030(topic_configs)
        try:
            return self.default_log_config.with_topic_configs(topic_configs)
        except InvalidConfigError:
            pass
        usable: dict[str, str] = {}
        for name, raw in topic_configs.items():
            try:
                self.default_log_config.with_topic_configs({name: raw})
            except InvalidConfigError as e:
                log.error(
                    "ignoring topic config %s=%r, which this node cannot take: %s", name, raw, e
                )
            else:
                usable[name] = raw
        return self.default_log_config.with_topic_configs(usable)

    def on_role_changes(self, changes: Iterable[RoleChange]) -> None:
        changes = list(changes)
        self._apply_role_changes(changes)
        if changes:
            # Replica fetches waiting here answer at once for a partition this node no longer
            # leads (Kafka's makeFollowers and stopReplicas complete its delayed fetches).
            # Those partitions only: marking all of them had every parked fetch read every
            # partition it follows at each leader election.
            for change in changes:
                self.fetch_sessions.mark((change.topic_name, change.tp.partition))
            self._wake_replica_fetches()

    def _apply_role_changes(self, changes: Iterable[RoleChange]) -> None:
        for change in changes:
            tp = (change.topic_name, change.tp.partition)
            if isinstance(change, StopReplica):
                self._stop_replica(tp)
                continue
            part = self.partitions.get(tp)
            if part is not None and part.topic_id != change.tp.topic_id:
                # Another topic of the same name (deleted and made again) whose removal this
                # node never applied (a divergence bug): its log is not the new topic's
                # (Kafka's getOrCreatePartition refuses a topic id that differs).
                log.error(
                    "%s-%d is hosted for topic id %s, not %s: dropping that log",
                    tp[0],
                    tp[1],
                    part.topic_id,
                    change.tp.topic_id,
                )
                self._stop_replica(tp)
                part = None
            if (
                part is None
                and tp in self.logs.offline
                and not self._drop_offline_stray(tp, change.tp.topic_id)
            ):
                # Its log could not be opened at start-up (LogManager.open): it stays offline
                # here and every other partition is served. Creating its log failed the log
                # directory, halting the node, on every start once it had registered.
                log.error("not hosting %s-%d: %s", tp[0], tp[1], self.logs.offline[tp])
                continue
            if part is None:
                topic = self.cache.image.topic(change.tp.topic_id)
                config = self.log_config_for(topic.configs if topic else {})
                try:
                    lg = self._log_for(tp, config, change.tp.topic_id)
                except OSError as e:
                    self.log_dir_failure.fail(f"creating the log of {tp[0]}-{tp[1]}", e)
                    continue
                except ValueError as e:
                    log.error("cannot host %s-%d: %s", tp[0], tp[1], e)
                    continue
                part = Partition(tp[0], tp[1], change.tp.topic_id, lg)
                # Bounded by the log start too (UnifiedLog.updateHighWatermark): a log start
                # checkpointed after the last HW checkpoint (DeleteRecords) is above it.
                part.high_watermark = max(
                    lg.log_start_offset, min(self._checkpointed_hw.get(tp, 0), lg.log_end_offset)
                )
                self.partitions[tp] = part
            was_leader = part.is_leader
            state = self.cache.image.partition(change.tp.topic_id, change.tp.partition)
            if state is not None:
                part.replicas, part.isr = state.replicas, state.isr
                part.partition_epoch = state.partition_epoch
            if isinstance(change, BecomeLeader):
                part.is_leader = True
                part.leader_id = self.node_id
                part.leader_epoch = change.leader_epoch
                part.truncation_pending = False
                part.isr_change_retry_ms = 0
                part.isr_proposal = None
                if not was_leader:
                    # Replica.resetReplicaState: a new leader knows no follower's log start
                    # (each counts as -1 until it fetches); one elected again keeps them.
                    part.follower_log_starts = {}
                # Kafka's makeLeader (maybeAssignEpochStartOffset): the new epoch starts at our
                # log end now, not at our first append, so a follower whose log holds a later
                # epoch than any of ours (fast successive elections) is told where its epochs
                # end here rather than "unknown", which would cut it back to its HW. Not
                # flushed: the checkpoint is written as the recovery point moves (storage/log).
                part.log.epoch_cache.assign(change.leader_epoch, part.log.log_end_offset)
                # Kafka's makeLeader: follower states reset, the HW starts at ours, and a
                # joining follower must reach the LEO this epoch starts at.
                part.replication = LeaderReplication(
                    self.node_id,
                    part.replicas or (self.node_id,),
                    part.isr or (self.node_id,),
                    part.partition_epoch,
                    part.log.log_end_offset,
                    part.high_watermark,
                    self.now_ms(),
                    self.replica_lag_time_max_ms,
                )
                self.maybe_advance_high_watermark(part)
            elif isinstance(change, BecomeFollower):
                part.is_leader = False
                part.leader_id = change.leader
                part.leader_epoch = change.leader_epoch
                part.replication = None
                part.truncation_pending = True
                part.fail_waiters(Errors.NOT_LEADER_OR_FOLLOWER)
            if part.is_leader or was_leader or isinstance(change, BecomeFollower):
                for listener in self._role_listeners:
                    try:
                        listener(part, part.is_leader)
                    except Exception:
                        log.exception("role listener failed for %s-%d", tp[0], tp[1])

    def logs_to_create(
        self, records: Sequence[rec.MetadataRecord]
    ) -> list[tuple[TopicPartition, LogConfig, str]]:
        """The new logs a committed batch will have this node host: partitions created with
        this node among their replicas that it has no log for. Read on the loop, before the
        batch is applied (the image is at the batch before)."""
        topics = {r.topic_id: r for r in records if isinstance(r, rec.Topic)}
        wanted: list[tuple[TopicPartition, LogConfig, str]] = []
        for r in records:
            if not isinstance(r, rec.Partition) or self.node_id not in r.replicas:
                continue
            topic = topics.get(r.topic_id) or self.cache.image.topic(r.topic_id)
            if topic is None:
                continue
            tp = (topic.name, r.partition)
            if self.logs.get_log(tp) is None and tp not in self.logs.offline:
                wanted.append((tp, self.log_config_for(topic.configs), r.topic_id))
        return wanted

    async def create_logs_ahead(self, records: Sequence[rec.MetadataRecord]) -> None:
        """Create the logs ``records`` will have this node host on a worker thread, before the
        batch is applied: each new log is a directory, an fsynced partition.metadata and segment
        files, and a topic of 2000 partitions created on the loop stalled it for over 6 s
        (every client and heartbeat of the node with it). The role changes then find them."""
        wanted = self.logs_to_create(records)
        if not wanted:
            return
        self.logs.forget_deleted_logs_offsets([tp for tp, _, _ in wanted])
        loop = asyncio.get_running_loop()
        started = loop.time()
        stop = threading.Event()
        creating = loop.run_in_executor(
            None, functools.partial(self.logs.create_unregistered, wanted, stop)
        )
        try:
            created = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # The node is stopping: the thread stops after the log it is making, and what it
            # made is adopted, so that the shutdown closes and checkpoints it before the
            # directory's lock goes (it went on writing there after, for seconds).
            stop.set()
            for tp, lg in await creating:
                self.logs.adopt(tp, lg)
            raise
        for tp, lg in created:
            self.logs.adopt(tp, lg)
        log.info(
            "created %d of %d new logs ahead of their metadata in %.0f ms",
            len(created),
            len(wanted),
            (loop.time() - started) * 1000,
        )

    def _drop_offline_stray(self, tp: TopicPartition, topic_id: str) -> bool:
        """Delete an offline log of an earlier topic of this name (isStrayKraftReplica), so
        that the new topic's log takes its place; True if it is gone."""
        offline_id = self.logs.offline_topic_id(tp)
        if offline_id is None or offline_id == topic_id:
            return False
        log.warning(
            "%s-%d: deleting an offline stray log of topic id %s; the topic is now %s",
            tp[0],
            tp[1],
            offline_id,
            topic_id,
        )
        try:
            self.logs.delete_offline(tp)
        except OSError as e:
            self.log_dir_failure.fail(f"deleting the log of {tp[0]}-{tp[1]}", e)
            return False
        return True

    def _log_for(self, tp: TopicPartition, config: LogConfig, topic_id: str) -> Log:
        """The partition's log, with its topic's configs; a log left by an earlier topic of the
        same name (deleted while this node was down, then created again) is a stray, deleted
        first (Kafka's ``isStrayKraftReplica``: its topic id is not the image's).

        A log this node opened from disk at start-up has the node's defaults until now: the
        topic configs are in the metadata image, not on disk (Kafka's ``LogManager.startup``
        reads them from the image). They were never applied after a restart, so a compacted
        topic (``__consumer_offsets`` too) was neither compacted nor kept from time retention,
        and every other topic config fell back to its default."""
        existing = self.logs.get_log(tp)
        if existing is not None and existing.topic_id != topic_id:
            # A log without a topic id is one too (isStrayKraftReplica): partition.metadata is
            # written, fsynced, when a log is created, before any append, so a log without it
            # holds nothing of this topic; taken for it, an old topic's records were served
            # as the new one's.
            log.warning(
                "%s-%d: deleting a stray log of topic id %s; the topic is now %s",
                tp[0],
                tp[1],
                existing.topic_id,
                topic_id,
            )
            self.logs.delete_log(tp)
        lg = self.logs.get_or_create_log(tp, config, topic_id=topic_id)
        lg.config = config
        return lg

    def delete_stray_logs(self) -> list[TopicPartition]:
        """Once the metadata image is caught up at start-up: delete every log of a partition
        this node is no replica of in the image, or of another topic id (its topic was
        deleted while the node was down; Kafka's ``isStrayKraftReplica``). Returns them.
        Judged by the image, not by what this node hosts: a role change that failed left a
        live partition unhosted, and its log was deleted."""
        image = self.cache.image
        strays = [
            tp
            for tp, lg in self.logs
            if tp not in self.partitions and not self._is_replica_in(image, tp, lg.topic_id)
        ]
        # Offline ones too (never hosted, so judged by the image): their directories were
        # left for ever.
        offline = [tp for tp in self.logs.offline if not self._is_replica_in(image, tp)]
        for tp in strays + offline:
            log.warning(
                "%s-%d: deleting a stray%s log: this node is no replica of it in the metadata",
                tp[0],
                tp[1],
                " offline" if tp in self.logs.offline else "",
            )
            try:
                if tp in self.logs.offline:
                    self.logs.delete_offline(tp)
                else:
                    self.logs.delete_log(tp)
            except OSError as e:  # the rename, or a checkpoint written with it
                self.log_dir_failure.fail(f"deleting the stray log {tp[0]}-{tp[1]}", e)
        return strays + offline

    def _is_replica_in(
        self, image: MetadataImage, tp: TopicPartition, topic_id: str | None = None
    ) -> bool:
        """Whether this node is a replica of ``tp`` in ``image`` (of topic ``topic_id``, if
        given: a log of another id is a stray of an earlier topic of the name)."""
        topic = image.topic_by_name(tp[0])
        if topic is None or (topic_id is not None and topic.topic_id != topic_id):
            return False
        state = image.partition(topic.topic_id, tp[1])
        return state is not None and self.node_id in state.replicas

    def on_metadata_delta(self, delta: MetadataDelta) -> None:
        """Pick up ISR changes (partition-epoch-only changes, no role change) and changed topic
        configs (Kafka's ``LogManager.updateTopicConfig``) from the image."""
        hosted_by_topic: dict[str, list[Partition]] | None = None
        for topic_change in delta.topics.values():
            old, new = topic_change.before, topic_change.after
            if old is None or new is None or old.configs == new.configs:
                continue
            if hosted_by_topic is None:
                # Once per delta (LogManager.updateTopicConfig looks up the topic's own logs):
                # a walk of every hosted partition per topic took 462 ms for an AlterConfigs
                # of 3,000 topics, growing with their square, on every node.
                hosted_by_topic = {}
                for (topic, _), hosted in self.partitions.items():
                    hosted_by_topic.setdefault(topic, []).append(hosted)
            config = self.log_config_for(new.configs)
            for hosted in hosted_by_topic.get(new.name, ()):
                hosted.log.config = config
                self.maybe_advance_high_watermark(hosted)  # min.insync.replicas may be lower
            log.info("topic %s: configs are now %s", new.name, dict(new.configs))
        cluster_wide = delta.configs.get(ConfigResource(ConfigResourceType.BROKER, ""))
        if cluster_wide is not None and cluster_topic_defaults(
            cluster_wide.before or {}
        ) != cluster_topic_defaults(cluster_wide.after or {}):
            # The cluster's dynamic defaults of topic configs: every log takes them where its
            # topic has no config of its own (Kafka's DynamicLogConfig.reconfigure), and a
            # lower min.insync.replicas may let a held HW move.
            configs: dict[str, LogConfig] = {}
            for (name, _), hosted in self.partitions.items():
                if name not in configs:
                    image_topic = self.cache.image.topic_by_name(name)
                    own = image_topic.configs if image_topic else {}
                    configs[name] = self.log_config_for(own)
                hosted.log.config = configs[name]
                self.maybe_advance_high_watermark(hosted)
            log.info(
                "the cluster's dynamic defaults of topic configs are now %s",
                cluster_topic_defaults(cluster_wide.after or {}),
            )
        for tp_id, change in delta.partitions.items():
            after = change.after
            if after is None:
                continue
            part = self.partitions.get((delta.topic_names[tp_id.topic_id], tp_id.partition))
            if part is None or part.leader_epoch != after.leader_epoch:
                continue  # a role change handles it (or already did)
            isr_changed = part.isr != after.isr
            if isr_changed and part.is_leader:
                before_isr, after_isr = set(part.isr), set(after.isr)
                self.isr_shrinks += bool(before_isr - after_isr)
                self.isr_expands += bool(after_isr - before_isr)
            part.replicas, part.isr = after.replicas, after.isr
            part.partition_epoch = after.partition_epoch
            self.fetch_sessions.mark(part.tp)  # a follower may have left the replica set
            if part.low_watermark_waiters:  # a replica may have left the replica set
                part.low_watermark_waiters.release(self.low_watermark(part))
            if part.is_leader and part.replication is not None:
                if part.replication.pending_isr is not None:
                    part.isr_change_retry_ms = 0
                part.replication.update_isr(after.isr, after.partition_epoch)
                if part.replication.pending_isr is None:
                    part.isr_proposal = None
                self.maybe_advance_high_watermark(part)
                if not isr_changed:
                    continue
                log.info(
                    "%s-%d: ISR is now %s (partition epoch %d)",
                    part.topic,
                    part.partition,
                    list(after.isr),
                    after.partition_epoch,
                )

    def _stop_replica(self, tp: TopicPartition) -> None:
        part = self.partitions.pop(tp, None)
        if part is None:
            if tp in self.logs.offline and not self._is_replica_in(self.cache.image, tp):
                # Offline since start-up, so never hosted: its directory was left until the
                # node's next start (delete_stray_logs), which judges it the same way.
                try:
                    self.logs.delete_offline(tp)
                except OSError as e:
                    self.log_dir_failure.fail(f"deleting the log of {tp[0]}-{tp[1]}", e)
            return
        for served in self._served_by_replica.values():
            served.pop(tp, None)  # else every partition ever served stayed named there
        # No longer hosted here: Kafka's DelayedProduce answers NOT_LEADER_OR_FOLLOWER while
        # the metadata still has the partition (moved away), UNKNOWN_TOPIC_OR_PARTITION once
        # it does not (deleted); DelayedDeleteRecords answers UNKNOWN_TOPIC_OR_PARTITION.
        exists = self.cache.image.partition(part.topic_id, part.partition) is not None
        part.fail_waiters(
            Errors.NOT_LEADER_OR_FOLLOWER if exists else Errors.UNKNOWN_TOPIC_OR_PARTITION,
            Errors.UNKNOWN_TOPIC_OR_PARTITION,
        )
        part.is_leader = False
        # Followers too, as a BecomeFollower does: the coordinator runtime drops a follower's
        # hot standby once the partition is no longer hosted here.
        for listener in self._role_listeners:
            try:
                listener(part, False)
            except Exception:
                log.exception("role listener failed for %s-%d", tp[0], tp[1])
        try:
            self.logs.delete_log(tp)
        except OSError as e:
            self.log_dir_failure.fail(f"deleting the log of {tp[0]}-{tp[1]}", e)

    # -----------------------------------------------------------------------------------------
    # Lookups.

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        return self.partitions.get((topic, partition))

    def leader_partition(
        self, topic: str, partition: int, current_leader_epoch: int = -1
    ) -> Partition:
        """The partition if this node leads it, else Kafka's error for the client. A replica
        checks the client's ``current_leader_epoch`` before whether it leads, as
        ``Partition.getLocalLog`` does: a follower tells a client with a stale epoch
        FENCED_LEADER_EPOCH, one ahead of it UNKNOWN_LEADER_EPOCH."""
        part = self.partitions.get((topic, partition))
        if part is not None:
            check_current_leader_epoch(part, current_leader_epoch)
            if part.is_leader:
                return part
        raise self._not_here(topic, partition)

    def hosted_partition(self, topic: str, partition: int) -> Partition:
        """The partition if this node hosts a replica of it, leader or follower, else Kafka's
        error for the client (``ReplicaManager.getPartitionOrError``)."""
        part = self.partitions.get((topic, partition))
        if part is not None:
            return part
        raise self._not_here(topic, partition)

    def _not_here(self, topic: str, partition: int) -> KafkaError:
        """NOT_LEADER_OR_FOLLOWER for a partition the metadata has, else
        UNKNOWN_TOPIC_OR_PARTITION."""
        topic_image = self.cache.image.topic_by_name(topic)
        if (
            topic_image is None
            or self.cache.image.partition(topic_image.topic_id, partition) is None
        ):
            return KafkaError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition}")
        return KafkaError(Errors.NOT_LEADER_OR_FOLLOWER, f"{topic}-{partition}")

    # -----------------------------------------------------------------------------------------
    # Writes and reads.

    def min_insync_replicas_for(self, part: Partition, configured: int | None = None) -> int:
        """The effective ``min.insync.replicas``: the topic's, else the cluster's dynamic
        default, else this node's (Kafka's LogConfig resolution), never above the replication
        factor (Kafka's ``Partition.effectiveMinIsr``, KAFKA-15583): a one-replica partition
        under ``min.insync.replicas=2`` takes writes and moves its HW, as the controller's
        ``_min_isr`` already assumes, instead of refusing acks=all and freezing the HW.
        ``configured``: the topic's ``configured_min_insync_replicas``, if already read."""
        if configured is None:
            configured = self.configured_min_insync_replicas(part.topic_id)
        return min(configured, len(part.replicas or (self.node_id,)))  # as LeaderReplication's

    def configured_min_insync_replicas(self, topic_id: str) -> int:
        """The topic's ``min.insync.replicas``, else the cluster's dynamic default, else this
        node's, not capped by any replication factor."""
        image = self.cache.image
        topic = image.topic(topic_id)
        raw = topic.configs.get(MIN_INSYNC_REPLICAS_CONFIG) if topic is not None else None
        if raw is None:
            cluster = image.resource_configs(ConfigResource(ConfigResourceType.BROKER, ""))
            raw = cluster.get(MIN_INSYNC_REPLICAS_CONFIG)
        parsed = None if raw is None else parse_min_insync_replicas(raw)
        return self.min_insync_replicas if parsed is None else parsed

    def check_leader_and_min_isr(self, part: Partition, required_acks: int) -> None:
        """Refuse an append before anything looks at the records: NOT_LEADER_OR_FOLLOWER, or for
        acks=-1 NOT_ENOUGH_REPLICAS while the committed ISR is below ``min.insync.replicas``
        (Kafka's ``Partition.appendRecordsToLeader`` checks this before the log validates the
        producer's sequence, so a batch behind a refused one is refused alike, not answered
        OUT_OF_ORDER_SEQUENCE_NUMBER)."""
        if not part.is_leader:
            raise KafkaError(Errors.NOT_LEADER_OR_FOLLOWER, f"{part.topic}-{part.partition}")
        if required_acks == -1 and part.replication is not None:
            min_isr = self.min_insync_replicas_for(part)
            if part.replication.is_under_min_isr(min_isr):
                raise KafkaError(
                    Errors.NOT_ENOUGH_REPLICAS,
                    f"{part.topic}-{part.partition}: ISR {list(part.replication.isr)} is "
                    f"smaller than min.insync.replicas {min_isr}",
                )

    def check_enough_replicas_after_append(self, part: Partition) -> None:
        """An acks=all append the HW has passed: NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR
        shrank below ``min.insync.replicas`` while it waited (Kafka's
        ``Partition.checkEnoughReplicasReachOffset``, over the maximal ISR). The records stay in
        the log and are committed; the producer may retry (an idempotent one is answered the
        first append's offsets). Coordinator writes do not ask: Kafka's ``CoordinatorRuntime``
        completes them when the HW passes."""
        if not part.is_leader or part.replication is None:
            return  # committed before the leadership moved (or hosted alone): nothing to add
        min_isr = self.min_insync_replicas_for(part)
        maximal = part.replication.maximal_isr
        if len(maximal) < min_isr:
            raise KafkaError(
                Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                f"{part.topic}-{part.partition}: appended, but the ISR {sorted(maximal)} is now "
                f"smaller than min.insync.replicas {min_isr}",
            )

    def append_local(
        self,
        part: Partition,
        records: bytes,
        *,
        required_acks: int = -1,
        scan: LeaderScan | None = None,
    ) -> AppendResult:
        """Append as leader; raises KafkaError with the code Kafka answers for bad input.

        ``required_acks`` -1 (a producer's acks=all) first checks the committed ISR against
        ``min.insync.replicas`` (Kafka's ``Partition.appendRecordsToLeader``); coordinator
        writes append with 1 (node/runtime.py ``COORDINATOR_ACKS``). ``scan``: what reading
        ``records`` found already (``Log.scan_for_leader``).
        """
        self.check_leader_and_min_isr(part, required_acks)
        self._record_skipped_fetches(part)
        with self._append_errors(part):
            info = part.log.append_as_leader(records, part.leader_epoch, self.now_ms(), scan)
        self.leader_bytes_appended += len(records)
        self.maybe_advance_high_watermark(part)
        self.fetch_sessions.mark(part.tp)
        self._wake_replica_fetches()
        return AppendResult(
            info.first_offset,
            info.last_offset,
            part.log.log_start_offset,
            info.log_append_time_ms,
            info.max_timestamp,
        )

    def check_local(self, part: Partition, records: bytes, scan: LeaderScan | None = None) -> None:
        """Raise the KafkaError ``append_local`` would for ``records``' own faults, appending
        nothing (``Log.check_for_leader``; ``scan``: what reading them found already)."""
        with self._append_errors(part):
            part.log.check_for_leader(records, self.now_ms(), scan)

    @contextlib.contextmanager
    def _append_errors(self, part: Partition) -> Iterator[None]:
        """A leader append's failures as the KafkaError Kafka answers for them."""
        try:
            yield
        except RecordTooLargeError as e:
            raise KafkaError(Errors.MESSAGE_TOO_LARGE, str(e)) from e
        except InvalidTimestampError as e:
            raise KafkaError(Errors.INVALID_TIMESTAMP, str(e), e.record_errors) from e
        except fmt.CorruptRecordError as e:
            raise KafkaError(Errors.CORRUPT_MESSAGE, str(e)) from e
        except InvalidRecordError as e:
            raise KafkaError(Errors.INVALID_RECORD, str(e), e.record_errors) from e
        except RecordListTooLargeError as e:
            raise KafkaError(Errors.RECORD_LIST_TOO_LARGE, str(e)) from e
        except (fmt.RecordFormatError, ValueError) as e:
            # A batch whose CRC holds but whose contents do not parse (an unknown codec,
            # offsets that go back): this partition's error, as Kafka's appendToLocalLog
            # answers any failure of one partition, not the whole request's.
            raise KafkaError(Errors.CORRUPT_MESSAGE, str(e)) from e
        except OSError as e:
            self.log_dir_failure.fail(f"appending to {part.topic}-{part.partition}", e)
            raise KafkaError(Errors.KAFKA_STORAGE_ERROR, str(e)) from e

    def maybe_advance_high_watermark(self, part: Partition) -> None:
        """Leader: HW = min LEO over the maximal ISR (KIP-497), via ``LeaderReplication``; it
        stays while the committed ISR is below ``min.insync.replicas`` (KIP-966)."""
        if not part.is_leader:
            return
        leader_log_end_offset = part.log.log_end_offset
        if part.replication is None:
            target = leader_log_end_offset  # not in the metadata image: hosted alone
        else:
            part.replication.maybe_advance_high_watermark(
                leader_log_end_offset,
                self.now_ms(),
                self._unfenced_brokers(),
                self.min_insync_replicas_for(part),
            )
            target = part.replication.high_watermark
        if part.set_high_watermark(target):
            self._notify_high_watermark(part)

    def delete_records(self, topic: str, partition: int, offset: int) -> tuple[Partition, int]:
        """The leader's part of DeleteRecords (Kafka's ``Partition.deleteRecordsOnLeader``):
        move the log start up to ``offset`` (-1: the high watermark), never past the HW.
        Returns the partition and the offset the low watermark must reach; followers learn
        the new log start from their next fetch answer, which this wakes."""
        part = self.leader_partition(topic, partition)
        name = f"{topic}-{partition}"
        if not part.log.config.delete:
            raise KafkaError(
                Errors.POLICY_VIOLATION,
                f"Records of partition {name} can not be deleted due to the configured policy",
            )
        target = part.high_watermark if offset == DELETE_TO_HIGH_WATERMARK else offset
        if target < 0:
            raise KafkaError(
                Errors.OFFSET_OUT_OF_RANGE, f"The offset {target} for partition {name} is not valid"
            )
        if target > part.high_watermark:
            raise KafkaError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"Cannot increment the log start offset to {target} of partition {name} since "
                f"it is larger than the high watermark {part.high_watermark}",
            )
        try:
            moved = part.log.maybe_increment_log_start_offset(target)
        except OSError as e:  # the leader-epoch checkpoint, segments let go
            self.log_dir_failure.fail(f"moving the log start of {name}", e)
            raise KafkaError(Errors.KAFKA_STORAGE_ERROR, str(e)) from e
        if moved:
            log.info("%s: log start offset moved to %d (DeleteRecords)", name, target)
            self.checkpoint_log_start_offsets()
            self.fetch_sessions.mark(part.tp)
            self._wake_replica_fetches()
        return part, target

    def checkpoint_log_start_offsets(self) -> None:
        """Write ``log-start-offset-checkpoint`` now (Kafka does it on a timer, so a crash can
        bring deleted records back; kcoord writes it whenever DeleteRecords moves a log start,
        here and on the followers), or at the end of the ``one_log_start_checkpoint`` block
        this runs in."""
        if self._log_start_batches:
            self._log_start_moved = True
            return
        try:
            self.logs.checkpoint_log_start_offsets()
        except OSError as e:
            self.log_dir_failure.fail("checkpointing log start offsets", e)

    @contextlib.contextmanager
    def one_log_start_checkpoint(self) -> Iterator[None]:
        """Log starts moved within the block (a DeleteRecords of many partitions, a fetch
        answer carrying many) are checkpointed once, when it ends: the file holds every
        partition, and writing it (with two fsyncs) per partition stalled the event loop for
        as many rewrites. Ends before anything reports the new starts (the answer's wait, the
        next fetch)."""
        self._log_start_batches += 1
        try:
            yield
        finally:
            self._log_start_batches -= 1
            if not self._log_start_batches and self._log_start_moved:
                self._log_start_moved = False
                self.checkpoint_log_start_offsets()

    def low_watermark(self, part: Partition) -> int:
        """The least log start offset of the leader and of every follower on an unfenced broker
        (Kafka's ``Partition.lowWatermarkIfLeader``). A follower that has not reported one to
        this leader yet counts as -1 (Kafka's makeLeader resets every remote replica's log
        start to UnknownOffset), so DeleteRecords waits for its first fetch rather than being
        answered while its copy still starts below the offset."""
        alive = self._unfenced_brokers()
        starts = [
            part.follower_log_starts.get(replica, UNKNOWN_OFFSET)
            for replica in part.replicas
            if replica != self.node_id and replica in alive
        ]
        return min([part.log.log_start_offset, *starts])

    def _unfenced_brokers(self) -> frozenset[int]:
        """The image's unfenced brokers, recomputed only when the image has moved on (this
        runs on every follower fetch)."""
        image = self.cache.image
        key = (id(image), image.last_offset)
        if self._unfenced_key != key:
            self._unfenced = frozenset(image.unfenced_broker_ids())
            self._unfenced_key = key
        return self._unfenced

    def _notify_high_watermark(self, part: Partition) -> None:
        assert part.high_watermark <= part.log.log_end_offset, (part.tp, part.high_watermark)
        for listener in self._hw_listeners:
            try:
                listener(part, part.high_watermark)
            except Exception:
                log.exception("high watermark listener failed")
        if part.is_leader:
            # Replica fetches to this node are for partitions it leads: a follower's HW (which
            # moves on every replicated append) completes none of them. Kafka's DelayedFetch
            # is likewise watched by partition.
            self.fetch_sessions.mark(part.tp)
            self._wake_replica_fetches()

    def _wake_replica_fetches(self) -> None:
        for event in self._fetch_wakeups:
            event.set()

    def follow_leader_high_watermark(self, part: Partition, leader_hw: int) -> None:
        """Follower: the leader's HW, within its own log (``Partition.follow_high_watermark``)."""
        if part.follow_high_watermark(leader_hw):
            self._notify_high_watermark(part)

    def fetch(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        max_bytes: int,
        *,
        committed_only: bool = True,
        min_one: bool = True,
    ) -> FetchResult:
        part = self.leader_partition(topic, partition)
        bound = part.high_watermark if committed_only else None
        try:
            with self._reading(topic, partition):
                data: FetchData = part.log.read(
                    fetch_offset, max_bytes, max_offset=bound, min_one=min_one
                )
        except OffsetOutOfRangeError as e:
            raise KafkaError(Errors.OFFSET_OUT_OF_RANGE, str(e)) from e
        return FetchResult(
            data.records,
            part.high_watermark,
            part.log.log_start_offset,
            part.log.log_end_offset,
            part.high_watermark,
        )

    def fetchable_bytes(self, topic: str, partition: int, fetch_offset: int) -> int:
        """How many bytes a consumer's fetch from ``fetch_offset`` would read, below the high
        watermark, from batch positions alone (``DelayedFetch.tryComplete``). Raises the
        ``KafkaError`` ``fetch`` would."""
        part = self.leader_partition(topic, partition)
        lg = part.log
        if not lg.log_start_offset <= fetch_offset <= lg.log_end_offset:
            raise KafkaError(Errors.OFFSET_OUT_OF_RANGE)  # truncated, or retention moved on
        with self._reading(topic, partition):
            return lg.bytes_between(fetch_offset, part.high_watermark)

    @contextlib.contextmanager
    def _reading(self, topic: str, partition: int) -> Iterator[None]:
        """A read of a partition's log: corrupt data is KAFKA_STORAGE_ERROR for it alone; an
        I/O error also fails the log directory (LocalLog.read's maybeHandleIOException)."""
        try:
            yield
        except LogCorruptError as e:
            log.error("corrupt data in %s-%d: %s", topic, partition, e)
            raise KafkaError(Errors.KAFKA_STORAGE_ERROR, str(e)) from e
        except OSError as e:
            self.log_dir_failure.fail(f"reading {topic}-{partition}", e)
            raise KafkaError(Errors.KAFKA_STORAGE_ERROR, str(e)) from e

    # -----------------------------------------------------------------------------------------
    # Checkpoints.

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """The HW of every partition this node hosts, leader or follower."""
        return {tp: p.high_watermark for tp, p in self.partitions.items()}

    def checkpoint_high_watermarks(self) -> None:
        """The hosted partitions' HWs, and what the file said of partitions whose log is on
        disk but not hosted (yet, or offline): the file was written with those left out, and
        a crash then started them from their log start (Kafka writes nothing for a log
        directory without online partitions)."""
        self.high_watermarks_snapshot()()

    def high_watermarks_snapshot(self) -> CheckpointWrite:
        high_watermarks = self.high_watermarks()
        for tp, hw in self._checkpointed_hw.items():
            if tp not in high_watermarks and (
                self.logs.get_log(tp) is not None or tp in self.logs.offline
            ):
                high_watermarks[tp] = hw
        return self.logs.high_watermarks_snapshot(high_watermarks)

    async def run_high_watermark_checkpoints(
        self,
        write: Callable[[CheckpointWrite], Awaitable[None]],
        interval_ms: int = 5000,
    ) -> None:
        """Kafka's ``replica.high.watermark.checkpoint.interval.ms`` task. The snapshot is
        taken here and written by ``write`` (the node's checkpoint thread): the file's two
        fsyncs on the event loop held every request of the node while a disk stalled."""
        while True:
            await asyncio.sleep(interval_ms / 1000)  # the checkpoint period
            try:
                await write(self.high_watermarks_snapshot())
            except OSError as e:
                self.log_dir_failure.fail("checkpointing high watermarks", e)

    # -----------------------------------------------------------------------------------------
    # Leader side of replication: the RPCs followers call.

    async def handle_replica_fetch(self, payload: Any) -> dict[str, Any]:
        """``ReplicaFetch``: a follower's long-poll (Kafka's Fetch from a replica).

        Payload: ``{replica_id, replica_epoch, max_wait_ms, max_bytes, session_id,
        session_epoch, forgotten: [[topic, partition]], partitions: [{topic, partition,
        fetch_offset, leader_epoch, last_fetched_epoch, high_watermark, log_start_offset}]}``;
        the session fields (KIP-227, cluster/fetch_session.py) are optional, and with them
        ``partitions`` names only what changed since the session's previous request. The
        follower's ``high_watermark`` (KIP-1166's field of the Fetch request) lets the leader
        answer when its HW is above the follower's, so followers learn the HW without waiting
        for new data. A HW alone waits ``high_watermark_linger_ms`` for records to go with it
        (see ``HIGH_WATERMARK_LINGER_MS``). Answer: ``{error, session_id, partitions: [{topic,
        partition, error, high_watermark, log_start_offset, log_end_offset, records,
        diverging_epoch}]}`` where ``error`` is a session's error, ``diverging_epoch`` is None
        or ``{epoch, end_offset}`` (KIP-320/KIP-595); with the follower's optional
        ``log_start_offset``, only the partitions with something for it to apply.
        """
        replica_id = int(payload["replica_id"])
        replica_epoch = int(payload.get("replica_epoch", -1))
        max_wait_ms = int(payload.get("max_wait_ms", 0))
        max_bytes = int(payload.get("max_bytes", 1024 * 1024))
        error, session_id, serve, session = self.fetch_sessions.resolve(
            replica_id,
            payload,
            may_open=self.cache.image.broker(replica_id) is not None,
            now_ms=self.now_ms(),
        )
        if error is not Errors.NONE:
            return {"error": int(error), "session_id": session_id, "partitions": []}
        deadline = asyncio.get_running_loop().time() + max_wait_ms / 1000
        # The follower's position counts once, when the request arrives (its LEO then). A
        # session's partitions left out of ``serve`` did not move (cluster/fetch_session.py).
        for item in serve:
            self._record_follower_fetch(replica_id, replica_epoch, item)
        working = {item.tp: item for item in serve}
        event = asyncio.Event()
        self._fetch_wakeups.add(event)
        loop = asyncio.get_running_loop()
        answer_by, lingering = deadline, False
        try:
            while True:
                event.clear()
                if session is not None:
                    taken = session.take_dirty()
                    self._note_fetching(replica_id, replica_epoch, taken.values())
                    working.update(taken)
                results, ready, high_watermark_news, pending = self._read_for_follower(
                    replica_id, working.values(), max_bytes
                )
                now = loop.time()
                if high_watermark_news and not lingering:
                    answer_by = min(deadline, now + self.high_watermark_linger_ms / 1000)
                    lingering = True
                if ready or now >= answer_by:
                    if session is not None:
                        session.keep_dirty(pending)
                    return {
                        "error": int(Errors.NONE),
                        "session_id": session_id,
                        "partitions": results,
                    }
                if session is not None:
                    working = {tp: working[tp] for tp in pending}
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(answer_by - now):
                        await event.wait()
        finally:
            self._fetch_wakeups.discard(event)

    def _follower_partition(
        self,
        replica_id: int,
        tp: TopicPartition,
        leader_epoch: int,
        topic_id: str | None = None,
    ) -> Partition:
        part = self.partitions.get(tp)
        if part is None or not part.is_leader or part.replication is None:
            raise KafkaError(Errors.NOT_LEADER_OR_FOLLOWER)
        if topic_id is not None and topic_id != part.topic_id:
            # ReplicaManager.readFromLocalLog's hasConsistentTopicId (KIP-516): a follower that
            # has not seen the topic deleted and created again fetches for the old log, and
            # its position there must not count for the new one (a new topic starts at leader
            # epoch 0 too, which the old one may still be at).
            raise KafkaError(Errors.INCONSISTENT_TOPIC_ID)
        if leader_epoch < part.leader_epoch:
            raise KafkaError(Errors.FENCED_LEADER_EPOCH)
        if leader_epoch > part.leader_epoch:
            raise KafkaError(Errors.UNKNOWN_LEADER_EPOCH)
        if replica_id not in part.replication.followers:
            raise KafkaError(Errors.NOT_LEADER_OR_FOLLOWER, f"{replica_id} is no replica")
        return part

    def _note_fetching(
        self, replica_id: int, replica_epoch: int, items: Iterable[FetchItem]
    ) -> None:
        """A parked request's session partitions marked while it waits: the follower is
        fetching them (``LeaderReplication.note_fetching``). Without this, a replica shrunk out
        of the ISR while its request waited, its position unchanged since, was never named
        again, and never rejoined."""
        for item in items:
            try:
                part = self._follower_partition(
                    replica_id, item.tp, item.leader_epoch, item.topic_id
                )
            except KafkaError:
                continue
            assert part.replication is not None
            part.replication.note_fetching(replica_id, item.fetch_offset, replica_epoch)

    def _record_follower_fetch(self, replica_id: int, replica_epoch: int, item: FetchItem) -> None:
        try:
            part = self._follower_partition(replica_id, item.tp, item.leader_epoch, item.topic_id)
        except KafkaError:
            return
        assert part.replication is not None
        if item.log_start_offset is not None:
            part.follower_log_starts[replica_id] = item.log_start_offset
        if part.low_watermark_waiters:
            # Recomputed on every follower fetch, as Kafka's Partition.updateFollowerFetchState
            # does: a replica fenced since the last one no longer holds the low watermark back.
            part.low_watermark_waiters.release(self.low_watermark(part))
        fetch_offset = item.fetch_offset
        lg = part.log
        if not lg.log_start_offset <= fetch_offset <= lg.log_end_offset:
            return  # out of range: the follower truncates or restarts first
        if part.diverging_epoch(item.fetch_offset, item.last_fetched_epoch) is not None:
            return
        # A fetch of an incarnation older than the registered one (Replica.
        # updateFetchStateOrThrow against the metadata's broker epoch, KIP-903), or than one
        # this leader recorded: a delayed fetch of a process since restarted must not count,
        # on a leader state made after the restart too.
        registered = self.cache.image.broker(replica_id)
        if (
            replica_epoch != -1
            and registered is not None
            and registered.broker_epoch > replica_epoch
        ) or not part.replication.update_follower_fetch(
            replica_id, fetch_offset, lg.log_end_offset, self.now_ms(), replica_epoch
        ):
            log.info(
                "%s-%d: ignored a fetch of broker %d's old incarnation (broker epoch %d)",
                part.topic,
                part.partition,
                replica_id,
                replica_epoch,
            )
            return
        if part.high_watermark < lg.log_end_offset:  # at the log end it cannot move
            self.maybe_advance_high_watermark(part)

    def _record_skipped_fetches(self, part: Partition) -> None:
        """Before the leader's LEO moves: a follower at the log end whose latest fetches of the
        partition were skipped (its position did not move, the partition did not change:
        cluster/fetch_session.py) is recorded as at its latest fetch, as Kafka would have
        recorded it then. So ``last_caught_up_ms`` is what Kafka's would be when the follower
        falls behind; at the log end the ISR does not look at it."""
        replication = part.replication
        if replication is None:
            return
        log_end_offset = part.log.log_end_offset
        for replica_id, state in replication.followers.items():
            if state.log_end_offset != log_end_offset:
                continue
            fetched_ms = self.fetch_sessions.fetched_at(
                replica_id, part.tp, log_end_offset, part.leader_epoch
            )
            if fetched_ms > state.last_fetch_ms:
                replication.update_follower_fetch(
                    replica_id, log_end_offset, log_end_offset, fetched_ms, state.broker_epoch
                )

    def _read_for_follower(
        self, replica_id: int, items: Iterable[FetchItem], max_bytes: int
    ) -> tuple[list[dict[str, Any]], bool, bool, list[TopicPartition]]:
        """The answer's partitions; whether it is worth sending now (something for the
        follower to apply: records, an error, a divergence, a log start it lacks); whether
        it has a HW the follower lacks (worth sending, but not alone at once); and the
        partitions still pending: answered, or behind the log end (records that did not fit).
        A partition with nothing to apply (no records, error or divergence; a HW and log start
        the follower has) is left out when the follower sent its ``log_start_offset``: it then
        knows what it has (KIP-227's incremental fetch responses leave such partitions out the
        same way)."""
        results: list[dict[str, Any]] = []
        pending: list[TopicPartition] = []
        ready = high_watermark_news = False
        budget = max_bytes
        # Once an answer ran out of room, partitions are served least recently served first:
        # the order of a session's partitions never changes, and those late in it got nothing
        # while the first ones had more, until they fell out of the ISR (Kafka moves a
        # partition that returned records to the end of the session: IncrementalFetchContext).
        served = self._served_by_replica.setdefault(replica_id, {})
        if replica_id in self._starved_replicas:
            items = sorted(items, key=lambda i: served.get(i.tp, -1))
        self._fetch_rounds += 1
        starved = False
        # KIP-74: only the first partition that returns records may go past the budget with
        # its first batch (ReplicaManager.readFromLocalLog clears minOneMessage then); each
        # partition read with what was left took one whole batch beyond it.
        read_any = False
        for item in items:
            try:
                part = self._follower_partition(
                    replica_id, item.tp, item.leader_epoch, item.topic_id
                )
            except KafkaError as e:
                results.append(_fetch_result(item, error=e.code))
                pending.append(item.tp)
                ready = True
                continue
            lg = part.log
            log_end_offset, log_start_offset = lg.log_end_offset, lg.log_start_offset
            high_watermark = part.high_watermark
            try:
                diverging = part.fetch_divergence(item.fetch_offset, item.last_fetched_epoch)
            except KafkaError as e:
                results.append(_fetch_result(item, part, error=e.code))
                pending.append(item.tp)
                ready = True
                continue
            if diverging is not None:
                results.append(_fetch_result(item, part, diverging_epoch=diverging))
                pending.append(item.tp)
                ready = True
                continue
            fetch_offset, follower_hw = item.fetch_offset, item.high_watermark
            follower_log_start = item.log_start_offset
            # A follower whose HW is above this one's (it took its log end for its HW while it
            # led an old epoch alone) lowers it to this one (Partition.follow_high_watermark).
            lowered = max(min(high_watermark, fetch_offset), follower_log_start or 0) < follower_hw
            high_watermark_news = high_watermark_news or high_watermark > follower_hw or lowered
            news = follower_log_start is not None and log_start_offset > follower_log_start
            records = b""
            if fetch_offset != log_end_offset:  # at the log end there is nothing to read
                try:
                    with self._reading(part.topic, part.partition):
                        data = lg.read(fetch_offset, budget, min_one=not read_any)
                except (OffsetOutOfRangeError, KafkaError) as e:
                    error = e.code if isinstance(e, KafkaError) else Errors.OFFSET_OUT_OF_RANGE
                    results.append(_fetch_result(item, part, error=error))
                    pending.append(item.tp)
                    ready = True
                    continue
                if data.records:
                    records = bytes(data.records)
                    budget = max(0, budget - len(records))
                    read_any = news = True
                    served[item.tp] = self._fetch_rounds
                else:  # it did not fit what was left
                    starved = True
            ready = ready or news
            if (
                follower_log_start is None
                or records
                or news
                or min(high_watermark, fetch_offset) > follower_hw
                or lowered
            ):
                results.append(_fetch_result(item, part, records=records))
                pending.append(item.tp)
            elif fetch_offset != log_end_offset:
                pending.append(item.tp)
        if starved:
            self._starved_replicas.add(replica_id)
        else:
            self._starved_replicas.discard(replica_id)
        return results, ready, high_watermark_news, pending

    async def handle_epoch_end_offset(self, payload: Any) -> dict[str, Any]:
        """``EpochEndOffset``: Kafka's OffsetsForLeaderEpoch (apiKey 23) from a follower.

        Payload: ``{replica_id, partitions: [{topic, partition, leader_epoch, epoch}]}``;
        answer: ``{partitions: [{topic, partition, error, epoch, end_offset}]}`` from the
        leader's epoch cache (``LeaderEpochCache.end_offset_for``).
        """
        replica_id = int(payload["replica_id"])
        results = []
        for item in payload["partitions"]:
            result: dict[str, Any] = {
                "topic": item["topic"],
                "partition": item["partition"],
                "error": int(Errors.NONE),
                "epoch": -1,
                "end_offset": -1,
            }
            try:
                part = self._follower_partition(
                    replica_id,
                    (str(item["topic"]), int(item["partition"])),
                    int(item["leader_epoch"]),
                    None if item.get("topic_id") is None else str(item["topic_id"]),
                )
            except KafkaError as e:
                result["error"] = int(e.code)
            else:
                epoch, end_offset = part.log.epoch_cache.end_offset_for(
                    int(item["epoch"]), part.log.log_end_offset
                )
                result["epoch"], result["end_offset"] = epoch, end_offset
            results.append(result)
        return {"partitions": results}

    # -----------------------------------------------------------------------------------------
    # ISR changes: the leader proposes, the metadata log decides.

    async def run_isr_maintenance(self, interval_ms: int) -> None:
        """Kafka's ``isr-expiration`` task (and, here, expansion too): every ``interval_ms``."""
        while True:
            await asyncio.sleep(interval_ms / 1000)  # the ISR check period
            try:
                self.maybe_propose_isr_changes()
            except Exception:
                log.exception("ISR maintenance failed")

    def maybe_propose_isr_changes(self) -> None:
        """Send one AlterPartition for every led partition whose ISR should shrink or grow."""
        broker_epoch = self.broker_epoch()
        if self.alter_partition is None or broker_epoch is None:
            return
        now_ms, retry_now_ms = self.now_ms(), self.monotonic_ms()
        eligible = {b: r.broker_epoch for b, r in self.cache.image.brokers.items() if not r.fenced}
        items: list[dict[str, Any]] = []
        proposed: list[Partition] = []
        for part in self.partitions.values():
            repl = part.replication
            if not part.is_leader or repl is None:
                continue
            if repl.pending_isr is not None:
                if retry_now_ms >= part.isr_change_retry_ms and part.isr_proposal is not None:
                    items.append(self._resend_isr_change(part, broker_epoch, retry_now_ms))
                    proposed.append(part)
                continue
            if retry_now_ms < part.isr_change_retry_ms:
                continue
            # A shrink goes alone, as Kafka's PendingShrinkIsr: were it sent with an expansion
            # the controller refuses (INELIGIBLE_REPLICA), it would be refused with it.
            out = repl.shrink_candidates(part.log.log_end_offset, now_ms)
            into = set() if out else repl.expand_candidates(eligible)
            if not out and not into:
                continue
            new_isr = [r for r in part.replicas if (r in repl.isr and r not in out) or r in into]
            if self.node_id not in new_isr:
                new_isr.insert(0, self.node_id)
            log.info(
                "%s-%d: proposing ISR %s (was %s; lagging %s, caught up %s)",
                part.topic,
                part.partition,
                new_isr,
                list(repl.isr),
                sorted(out),
                sorted(into),
            )
            repl.begin_isr_change(new_isr)
            part.isr_change_retry_ms = retry_now_ms + ISR_CHANGE_METADATA_WAIT_MS
            part.isr_proposal = {
                "topic_id": part.topic_id,
                "partition": part.partition,
                "leader_epoch": part.leader_epoch,
                "partition_epoch": repl.partition_epoch,
                "new_isr": [
                    [r, broker_epoch if r == self.node_id else repl.followers[r].broker_epoch]
                    for r in new_isr
                ],
            }
            items.append(part.isr_proposal)
            proposed.append(part)
        if not items:
            return
        request = {"broker_id": self.node_id, "broker_epoch": broker_epoch, "partitions": items}
        task = asyncio.create_task(self._send_alter_partition(request, proposed))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    def _resend_isr_change(
        self, part: Partition, broker_epoch: int, retry_now_ms: int
    ) -> dict[str, Any]:
        """The in-flight change again, as it was (this broker's epoch refreshed).

        Its outcome is unknown (no answer, or no metadata update after one): the controller
        may have committed it, so it stays in flight, its maximal ISR counting for the HW
        (KIP-497), as Kafka's ``AlterPartitionManager`` resends it. Only the metadata update,
        or the controller's word that it was not applied, ends it: a resend of a change that
        was applied gets INVALID_UPDATE_VERSION, the epochs being checked first.
        """
        assert part.isr_proposal is not None
        item = dict(part.isr_proposal)
        item["new_isr"] = [
            [r, broker_epoch if r == self.node_id else e] for r, e in item["new_isr"]
        ]
        part.isr_proposal = item
        part.isr_change_retry_ms = retry_now_ms + ISR_CHANGE_METADATA_WAIT_MS
        return item

    async def _send_alter_partition(
        self, request: dict[str, Any], proposed: list[Partition]
    ) -> None:
        assert self.alter_partition is not None
        changes = {id(p): _isr_change_of(p) for p in proposed}
        try:
            reply = await self.alter_partition(request)
        except Exception as e:  # the controller is unreachable or answered an RPC error
            log.info("AlterPartition's outcome is unknown, sending it again later: %s", e)
            reply = {"error": int(Errors.REQUEST_TIMED_OUT), "partitions": []}
        retry_now_ms = self.monotonic_ms()
        errors: dict[tuple[str, int], Errors] = {
            (str(r["topic_id"]), int(r["partition"])): Errors.of(r["error"])
            for r in reply.get("partitions", [])
        }
        top = Errors.of(reply["error"])
        for part in proposed:
            repl = part.replication
            if (
                repl is None
                or repl.pending_isr is None
                or _isr_change_of(part) != changes[id(part)]
            ):
                continue  # leadership changed, or the metadata update came (maybe a new change)
            error = (
                top
                if top is not Errors.NONE
                else errors.get((part.topic_id, part.partition), Errors.UNKNOWN_SERVER_ERROR)
            )
            if error is Errors.NONE:
                # Takes effect when the PartitionChange reaches our image (on_metadata_delta);
                # an empty change (same ISR) never comes, so we also end on the answer's epoch.
                result = next(
                    r
                    for r in reply["partitions"]
                    if (r["topic_id"], r["partition"]) == (part.topic_id, part.partition)
                )
                if int(result["partition_epoch"]) <= repl.partition_epoch:
                    repl.end_isr_change()
                    part.isr_proposal = None
                    part.isr_change_retry_ms = 0
            elif error in (Errors.INELIGIBLE_REPLICA, Errors.INVALID_REQUEST):
                # The controller checked our epochs, found them current, and did not apply
                # the change (Partition.handleAlterPartitionError): the committed ISR stands.
                log.info(
                    "%s-%d: AlterPartition %s, proposing afresh",
                    part.topic,
                    part.partition,
                    error.name,
                )
                repl.end_isr_change()
                part.isr_proposal = None
                part.isr_change_retry_ms = retry_now_ms + ISR_CHANGE_RETRY_BACKOFF_MS
            elif error in (
                Errors.INVALID_UPDATE_VERSION,
                Errors.FENCED_LEADER_EPOCH,
                Errors.NEW_LEADER_ELECTED,
                Errors.NOT_LEADER_OR_FOLLOWER,
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                Errors.UNKNOWN_TOPIC_ID,
            ):
                # Our image is behind (or an earlier send of this change was applied): the
                # metadata update that follows decides, as in Kafka; until it comes the change
                # stays in flight and goes again after isr_change_retry_ms.
                log.info("%s-%d: AlterPartition %s", part.topic, part.partition, error.name)
            else:
                # No answer, or the controller could not take it (NOT_CONTROLLER, a stale
                # broker epoch, ...): sent again after the backoff, still in flight.
                log.info(
                    "%s-%d: AlterPartition %s, sending it again",
                    part.topic,
                    part.partition,
                    error.name,
                )
                part.isr_change_retry_ms = retry_now_ms + ISR_CHANGE_RETRY_BACKOFF_MS
            self.maybe_advance_high_watermark(part)

    def close(self) -> None:
        for task in self._isr_tasks:
            task.cancel()
