"""The group coordinator runtime: one shard per led ``__consumer_offsets`` partition.

Theory of operation (Kafka's ``CoordinatorRuntime``, DESIGN section 6)
-------------------------------------------------------------------
Each ``__consumer_offsets`` partition this node leads has a ``ShardContext``: the pure
``GroupCoordinatorShard`` and its state, ``LOADING`` then ``ACTIVE``.

- **Loading** (``become_leader``): the shard is created empty and the partition log is
  replayed into it from the log start offset, in chunks (yielding to the event loop between
  them; one chunk a pass of the loop across every shard and standby, loads first:
  ``_ReplayTurns``): the latest record of each key, in log order, which is what replaying the log as
  compaction leaves it builds (``LatestRecords``). While loading, requests get
  ``COORDINATOR_LOAD_IN_PROGRESS``. A load for an older
  leader epoch than the context's is ignored, as Kafka's ``scheduleLoadOperation``.
- **Writes**: a request runs the shard handler, which returns records and responses addressed
  to request tokens. Each record is replayed into the shard right away at the offset it is to
  get, so the next request sees it, and goes into the shard's open batch (Kafka's
  ``CoordinatorRuntime`` batches, KAFKA-16770). ``group.coordinator.append.linger.ms`` says when
  the batch is appended to the partition as leader: -1 (the default, KAFKA-19826's adaptive
  linger) when the current pass of the event loop ends, so what the requests read in one pass
  wrote goes out as one batch and one replication round; a positive value that many
  milliseconds after the batch opened; 0 at once, a batch per handler call. A batch goes out
  early when the next write would take it past the partition's ``max.message.bytes``. The
  responses wait until the partition's high watermark passes their write (Kafka's
  ``DeferredEventQueue``): a response is never sent for state a failover could lose. A batch
  the log refuses (or appends anywhere but where its records were replayed) leaves the shard
  ahead of its log, so the shard is unloaded and reloaded from the log, failing its pending
  answers; Kafka reverts its timeline state to the last written offset instead, and a shard
  here has no timeline. A short ISR refuses nothing: the append is an acks=1 one
  (``COORDINATOR_ACKS``), and the answers wait for the high watermark as any others.
- **Reads and record-less handlers** (OffsetFetch, Heartbeat, ...): their responses wait until
  the high watermark passes the last record written for their group (``group_written``), so
  nobody reads uncommitted state and nobody waits for another group's writes. ListGroups, which
  reads every group, is answered at once from each group's entry as of the high watermark
  (``committed_listing``, kept for the groups with records above it), as Kafka reads its
  timeline state at the last committed offset. OffsetFetch (unless ``require_stable``) checks
  the group and a KIP-848 member as of the high watermark (``committed_listing``,
  ``committed_members``), as Kafka's read operation does.
- **Timeout**: a response that has waited ``offsets.commit.timeout.ms`` for the high watermark
  fails with COORDINATOR_NOT_AVAILABLE (Kafka's runtime gives every write operation that
  timeout and maps its REQUEST_TIMED_OUT so); the client looks the coordinator up again and
  retries. What was written stays in the log and the shard stays loaded.
- **Timers** the shard schedules run as ``loop.call_later`` callbacks that call
  ``shard.on_timer``, just another handler.
- **Hot standby** (DESIGN section 8, beyond Kafka): on a follower of an offsets partition a
  ``Standby`` shard replays the log as it replicates, up to the high watermark only (what no
  truncation can take back). On promotion the context takes the standby's shard and replays
  just the suffix above it, then serves: failover time no longer grows with the log. A
  truncation below what the standby replayed (``Log.truncations``) or a log start moved past
  it discards the standby, which replays again from the log start; a cold load (full replay)
  remains the fallback and ``group.coordinator.hot.standby.enable=false`` turns standbys off.
  A standby's shard is passive: ``replay`` arms no timers; ``on_loaded`` arms them at promotion.
- **Unloading** (``resign``, or a failed append): the shard's pending joins and syncs are
  answered ``NOT_COORDINATOR`` (``on_unloaded``), every deferred response fails with
  ``NOT_COORDINATOR``, timers are cancelled and the context is dropped; it is never rolled
  back by hand. After a failed append the partition is reloaded from its log if this node still
  leads it. An OffsetCommit is the exception, as are OffsetDelete and DeleteGroups (their
  tombstones cancel the group's timers when replayed): their handlers change the shard only
  through the records they return, so when their append is refused (too large), or the handler
  raises, only that request fails, with Kafka's error, and the shard stays (``replay_only``).
  So do the reads (OffsetFetch, DescribeGroups, ConsumerGroupDescribe, ListGroups), which
  change nothing: Kafka's read operations fail alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import functools
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from aiokafka.record.default_records import DefaultRecordBatch as _CRecordBatch

from kcoord.cluster.coordinator.group_config import GroupConfigLookup, no_group_configs
from kcoord.cluster.coordinator.records import (
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupMemberMetadataKey,
    CoordinatorRecord,
    CoordinatorRecordError,
    OffsetCommitFields,
    RecordDecoder,
    UnknownRecordTypeError,
    encode_record,
    record_size_bound,
)
from kcoord.cluster.coordinator.shard import (
    GROUP_EXPIRATION_KEY,
    CommittedFetch,
    CoordinatorResult,
    CoordinatorStats,
    GroupConfig,
    GroupCoordinatorShard,
    MemberEpoch,
    is_consumer_group,
)
from kcoord.cluster.coordinator.types import ListedGroup, ListGroupsRequest
from kcoord.cluster.routing import partition_for
from kcoord.errors import Errors
from kcoord.node.replica_manager import AppendResult, KafkaError, Partition, ReplicaManager
from kcoord.raft.image import MetadataDelta
from kcoord.stats import DURATION_BUCKETS_S, LATENCY_BUCKETS_S, Histogram
from kcoord.storage import format as fmt
from kcoord.storage.log import Log

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
# Coordinator writes go to the log as an acks=1 produce would (Kafka's
# CoordinatorPartitionWriter.append): never refused for a short ISR. Their answers wait for
# the high watermark, which stays still while the ISR is below min.insync.replicas (strict
# min ISR, KIP-966), and time out after offsets.commit.timeout.ms. Refused up front (acks=-1),
# every write but a commit unloaded and reloaded the shard, for as long as the ISR was short.
COORDINATOR_ACKS = 1
LOAD_CHUNK_BYTES = 5 * 1024 * 1024  # offsets.load.buffer.size
REPLAY_STEP_BYTES = 512 * 1024
# The records of a cold load's latest-per-key view replayed in one turn (``_flush_latest``).
FLUSH_STEP_RECORDS = 16_384
# The records that make, delete, or set the epoch of a consumer group member: what
# ``ShardContext.committed_members`` follows.
_MEMBER_KEYS: Final = (ConsumerGroupMemberMetadataKey, ConsumerGroupCurrentMemberAssignmentKey)

_K = TypeVar("_K")
_T = TypeVar("_T")


def _max_batch_bytes(part: Partition) -> int:
    """``max.message.bytes``, and no more than one segment: the log refuses a larger append
    (``UnifiedLog.append``, RECORD_LIST_TOO_LARGE), which only a tiny
    ``offsets.topic.segment.bytes`` makes possible."""
    config = part.log.config
    return min(config.max_message_bytes, config.segment_bytes)


class CoordinatorError(Exception):
    """The request cannot reach a shard: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ..."""

    def __init__(self, code: Errors, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code


class _ShardFailedError(Exception):
    """A write found the shard's log not where it was: the shard was failed (``fail_shard``),
    every answer waiting on it with it."""


class ShardState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    CLOSED = "closed"


@dataclass(slots=True)
class LoadSummary:
    partition: int
    leader_epoch: int
    start_ms: int
    end_ms: int
    records: int  # read from the log by this load (the suffix above the standby when hot)
    applied: int  # replayed into the shard: all of them when hot, the latest per key when cold
    bytes: int
    hot: bool  # promoted from a standby

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "leader_epoch": self.leader_epoch,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "records": self.records,
            "applied": self.applied,
            "bytes": self.bytes,
            "hot": self.hot,
        }


class UndecodableRecordError(Exception):
    """A record of a known type in the offsets log that this build cannot decode."""


def _replay_chunk(
    shard: GroupCoordinatorShard,
    decoder: RecordDecoder,
    lg: Log,
    offset: int,
    *,
    max_offset: int | None,
    max_bytes: int,
) -> tuple[int, int, int]:
    """Replay the batches of one read from ``offset`` (below ``max_offset``, if given) into
    ``shard``; returns (next offset, records replayed, bytes read). Nothing read leaves the
    offset as it was."""
    data = lg.read(offset, max_bytes, max_offset=max_offset).records
    records = 0
    for pos, header in fmt.iter_headers(data):
        offset = header.next_offset
        if header.is_control:
            continue
        for record_offset, key, value in fmt.decode_key_values(data, pos):
            if key is not None and _replay_record(shard, decoder, record_offset, key, value):
                records += 1
    return offset, records, len(data)


# Past this many bytes of uncommitted suffix after a load, its records are not read again to
# find their groups: every read waits for the whole suffix instead (see _replay_suffix).
SUFFIX_SCAN_MAX_BYTES: Final = 1 << 20
GROUP_WRITTEN_MIN_LIMIT: Final = 1024  # see ShardContext.group_written_limit


def _keep(chain: list[tuple[int, _T]], end: int, entry: _T) -> None:
    """Add ``entry``, as it was before a write ending at ``end``, to its chain (see
    ``ShardContext.committed_listing``)."""
    if chain and chain[-1][1] == entry:
        chain.pop()  # the previous write left the entry as it was: one stands for both
    chain.append((end, entry))


def _forget_passed(
    chains: dict[_K, list[tuple[int, _T]]],
    high_watermark: int,
    written: Callable[[_K], int | None],
) -> list[_K]:
    """Drop each chain's entries before writes the high watermark has passed, as long as a
    later one (or, with none, the state now) is as of it; the keys of the chains left empty.
    ``written``: where the key's last record ends; while it is above the HW the last entry
    stays (the rest of that write is not committed)."""
    done = []
    for key, chain in chains.items():
        while chain and chain[0][0] <= high_watermark:
            if len(chain) == 1 and (written(key) or 0) > high_watermark:
                break  # the rest of its last write is above the HW: keep what is known
            del chain[0]
        if not chain:
            done.append(key)
    return done


def _replay_suffix(
    ctx: ShardContext,
    shard: GroupCoordinatorShard,
    decoder: RecordDecoder,
    lg: Log,
    *,
    start: int,
    end: int,
) -> tuple[int, int, int] | None:
    """During a load, once the log is replayed up to the high watermark: the uncommitted
    records in ``[start, end)``, replayed into ``shard`` a batch at a time as the writes of a
    leader are, with what each batch changes kept as it was before it
    (``ShardContext._keep_committed``: ListGroups and OffsetFetch read as of the HW) and where
    each group's last record ends (``ShardContext._note_written``). A request of one group
    that writes nothing (a read, a heartbeat) then waits for its own uncommitted records only,
    as after writes, not for every group's: those of the groups with nothing above the HW are
    answered at once (Kafka reads at the last committed offset, and its runtime has no
    pending write after a load).

    Returns (next offset, records replayed, bytes read), as ``_replay_chunk``. A suffix over
    ``SUFFIX_SCAN_MAX_BYTES`` is not replayed here (None): every request waits for all of it,
    and the load replays it as the rest of the log."""
    ctx.group_written, ctx.all_written = {}, start
    chunks = []
    offset = start
    read = 0
    while offset < end:
        data = lg.read(offset, SUFFIX_SCAN_MAX_BYTES, max_offset=end).records
        if not data:
            break
        read += len(data)
        if read > SUFFIX_SCAN_MAX_BYTES:
            return None
        for _pos, header in fmt.iter_headers(data):
            offset = header.next_offset
        chunks.append(data)
    replayed = 0
    for data in chunks:
        for pos, header in fmt.iter_headers(data):
            if header.is_control:
                continue
            batch: list[tuple[int, CoordinatorRecord]] = []
            for record_offset, key, value in fmt.decode_key_values(data, pos):
                record = (
                    None if key is None else _decode_for_replay(decoder, record_offset, key, value)
                )
                if not isinstance(record, CoordinatorRecord):  # skipped: of no one group
                    ctx.all_written = record_offset + 1  # every read waits for it
                else:
                    batch.append((record_offset, record))
            ctx._keep_committed(shard, batch)
            for record_offset, record in batch:
                shard.replay(record_offset, record)
            ctx._note_written((record for _, record in batch), header.next_offset)
            replayed += len(batch)
    return offset, replayed, read


def _replay_record(
    shard: GroupCoordinatorShard,
    decoder: RecordDecoder,
    record_offset: int,
    key: bytes,
    value: bytes | None,
) -> bool:
    """Replay one record into ``shard``; False if it was skipped (a record type this build
    does not know, as Kafka's ``CoordinatorLoaderImpl`` skips one). A record of a known type
    that does not decode fails the replay (``UndecodableRecordError``), as it fails Kafka's
    load: skipped, it left a committed offset at an older value, or gone."""
    decoded = _decode_for_replay(decoder, record_offset, key, value, fields_ok=True)
    if decoded is None:
        return False
    if isinstance(decoded, CoordinatorRecord):
        shard.replay(record_offset, decoded)
    else:
        shard.replay_offset_commit(record_offset, decoded)
    return True


def _decode_for_replay(
    decoder: RecordDecoder,
    record_offset: int,
    key: bytes,
    value: bytes | None,
    *,
    fields_ok: bool = False,
) -> CoordinatorRecord | OffsetCommitFields | None:
    """The record to replay, None for one to skip (``_replay_record``). ``fields_ok``: an
    OffsetCommit with a value comes as its fields (the bulk of an offsets log is replayed
    with no record objects)."""
    try:
        fields = decoder.offset_commit(key, value) if fields_ok else None
        return decoder.decode(key, value) if fields is None else fields
    except UnknownRecordTypeError as e:
        log.warning("skipping unknown record type at offset %d: %s", record_offset, e)
        return None
    except CoordinatorRecordError as e:
        raise UndecodableRecordError(
            f"record at offset {record_offset} does not decode: {e}"
        ) from e


class LatestRecords:
    """A cold load's view of the log as compaction leaves it: the latest record per key.

    Every ``__consumer_offsets`` record is keyed so that the latest value per key is the state
    (the topic is compacted; Kafka's loader replays whatever the cleaner left). A cold load
    therefore scans the log for the latest (offset, value) of each key, which costs well under a
    microsecond a record with aiokafka's C record reader, and replays only those, in log order:
    the state a replay of the compacted log builds. A log committed over and over under the same
    keys (the usual offsets log) loads several times faster than by replaying every record.

    ``take_ordered`` hands over what was gathered, to replay (``replay_latest``), and starts
    again: past ``MAX_KEYS`` keys the load replays what it has, which bounds its memory and
    replays a log compacted in stretches (equivalent too).
    """

    MAX_KEYS = 1 << 18

    def __init__(self) -> None:
        self.latest: dict[bytes, tuple[int, bytes | None]] = {}

    def scan(
        self, lg: Log, offset: int, max_bytes: int, max_offset: int | None = None
    ) -> tuple[int, int, int]:
        """Take in the batches of one read from ``offset`` (below ``max_offset``, if given);
        returns (next offset, records scanned, bytes read), as ``_replay_chunk``."""
        data = lg.read(offset, max_bytes, max_offset=max_offset).records
        latest = self.latest
        records = 0
        for pos, header in fmt.iter_headers(data):
            offset = header.next_offset
            if header.is_control:
                continue
            n = 0
            if header.compression is fmt.Compression.NONE:
                try:
                    for r in _CRecordBatch(memoryview(data)[pos : pos + header.size]):
                        key = r.key
                        if key is not None:
                            latest[key] = (r.offset, r.value)
                            n += 1
                    records += n
                    continue
                except Exception:  # the reader's own error: ours below says what is wrong
                    n = 0  # what it took in, our decoder takes in again
            for record_offset, key, value in fmt.decode_key_values(data, pos):
                if key is not None:
                    latest[key] = (record_offset, value)
                    n += 1
            records += n
        return offset, records, len(data)

    def take_ordered(self) -> list[tuple[bytes, tuple[int, bytes | None]]]:
        """The latest record of every key gathered, in log order, to replay
        (``replay_latest``); the scan starts again."""
        ordered = sorted(self.latest.items(), key=lambda item: item[1][0])
        self.latest = {}
        return ordered


def replay_latest(
    shard: GroupCoordinatorShard,
    decoder: RecordDecoder,
    ordered: Iterable[tuple[bytes, tuple[int, bytes | None]]],
) -> int:
    """Replay (key, (offset, value)) records in the order given; returns how many took."""
    replayed = 0
    for key, (record_offset, value) in ordered:
        if _replay_record(shard, decoder, record_offset, key, value):
            replayed += 1
    return replayed


class _ReplayTurns:
    """One replay step at a time across every shard of the node, loads before standbys.

    A replay step holds the event loop (a 512 KiB chunk of commits: about 50 ms), and every
    task ready runs once a pass of the loop: shards replaying together (a node's start, a
    leadership change of many partitions, each follower's standby from the log start) ran a
    step each per pass, seconds between two looks at the sockets, and the node's broker
    heartbeats went unanswered. A step waits for its turn here, one a pass at most; a load's
    turn (clients wait for it: COORDINATOR_LOAD_IN_PROGRESS) comes before a standby's. Kafka
    loads on a loader thread of its own, one partition at a time.
    """

    def __init__(self) -> None:
        self._busy = False
        self._waiting: tuple[
            collections.deque[asyncio.Future[None]], collections.deque[asyncio.Future[None]]
        ] = (collections.deque(), collections.deque())

    @contextlib.asynccontextmanager
    async def turn(self, *, urgent: bool) -> AsyncIterator[None]:
        """Held for one step, which must not await: the step is the turn."""
        if self._busy:
            handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[0 if urgent else 1].append(handed)
            try:
                await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():
                    self._release()  # handed the turn as it was cancelled: the next one's
                raise
        self._busy = True
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        if not self._hand_over():
            # Free from the next pass: a step that comes later in this one waits for it.
            asyncio.get_running_loop().call_soon(self._free)

    def _free(self) -> None:
        if not self._hand_over():
            self._busy = False

    def _hand_over(self) -> bool:
        """The turn to the first step waiting (it runs in the next pass); False if none."""
        for queue in self._waiting:
            while queue:
                handed = queue.popleft()
                if not handed.done():
                    handed.set_result(None)
                    return True
        return False


class _ShardTimer:
    """The ``Timer`` the shard sees: deadlines become ``loop.call_later`` callbacks.

    A standby's shard gets one without a context: it schedules nothing until it is promoted
    (``on_loaded``), and the promotion binds the context.
    """

    def __init__(self, ctx: ShardContext | None) -> None:
        self.ctx = ctx
        self.handles: dict[str, asyncio.TimerHandle] = {}

    def schedule(self, key: str, deadline_ms: int) -> None:
        ctx = self.ctx
        assert ctx is not None, "a standby shard scheduled a timer"
        self.cancel(key)
        delay_s = max(0.0, (deadline_ms - ctx.runtime.now_ms()) / 1000)
        loop = asyncio.get_running_loop()
        self.handles[key] = loop.call_later(delay_s, ctx.fire_timer, key, deadline_ms)

    def cancel(self, key: str) -> None:
        handle = self.handles.pop(key, None)
        if handle is not None:
            handle.cancel()

    def cancel_all(self) -> None:
        for handle in self.handles.values():
            handle.cancel()
        self.handles.clear()


# Records and their encoded keys and values.
_Encoded = tuple[list[CoordinatorRecord], list[tuple[bytes, bytes | None]]]


@dataclass(slots=True)
class _Batch:
    """The records handlers wrote since the last append (Kafka's ``CoordinatorBatch``)."""

    base_offset: int  # where the log is to put the first one
    records: list[fmt.Record] = field(default_factory=list)
    size: int = fmt.HEADER_SIZE  # an upper bound of the encoded batch's size


@dataclass(slots=True)
class _Deferred:
    offset: int  # respond once the high watermark is at or above this
    responses: Sequence[tuple[Hashable, Any]]
    deadline: float  # the event loop's clock; fail with COORDINATOR_NOT_AVAILABLE after it


@dataclass(eq=False)
class ShardContext:
    runtime: CoordinatorRuntime
    partition: Partition
    leader_epoch: int
    state: ShardState = ShardState.LOADING
    shard: GroupCoordinatorShard | None = None
    timer: _ShardTimer | None = None
    futures: dict[Hashable, asyncio.Future[Any]] = field(default_factory=dict)
    deferred: list[_Deferred] = field(default_factory=list)
    last_written_offset: int = 0
    # Where each group's last record ends, and where the last record of no one group (and the
    # load) ends: a read of one group waits for what was written for it only.
    group_written: dict[str, int] = field(default_factory=dict)
    all_written: int = 0
    # group_written's entries the HW has passed count for nothing (as no entry): they are
    # dropped once it holds this many, else every group ever written stayed named there.
    group_written_limit: int = GROUP_WRITTEN_MIN_LIMIT
    # For each group with records above the high watermark, its ListGroups entry (None: no
    # such group) just before each of its writes there, as (end of the writes it stands for,
    # entry) in log order: the first one not yet passed by the HW is the entry as of the HW.
    # Kafka's ListGroups reads its timeline state at the last committed offset; this is what it
    # reads of the groups whose state here is ahead of it. A load keeps them for the log's
    # uncommitted suffix a batch at a time (_replay_suffix); one too large to replay so keeps
    # none, and every read waits for all of it.
    committed_listing: dict[str, list[tuple[int, ListedGroup | None]]] = field(default_factory=dict)
    # The same, per group, of each consumer group member with records above the HW (its
    # metadata, which makes and deletes it, or its current assignment, which sets its epoch):
    # Kafka's OffsetFetch checks a member as of the last committed offset
    # (ConsumerGroup.validateOffsetFetch reads its timeline map there).
    committed_members: dict[str, dict[str, list[tuple[int, MemberEpoch | None]]]] = field(
        default_factory=dict
    )
    # (end, group, member) of each entry of committed_members, in log order: what
    # _forget_members looks at as the HW moves.
    member_writes: collections.deque[tuple[int, str, str]] = field(
        default_factory=collections.deque
    )
    # The entry of the group a running handler names, taken before it ran: a handler may change
    # a classic group in memory before its records are replayed (a JoinGroup makes the group).
    _before_handler: tuple[str, ListedGroup | None] | None = None
    load_summary: LoadSummary | None = None
    batch: _Batch | None = None
    # An append of this shard's is under way: the high watermark it moves (an ISR of the
    # leader alone moves it within the append) is acted on once the append is known to be at
    # the offsets its records were replayed at (``_appended``), never before.
    appending: bool = False
    expiry: asyncio.TimerHandle | None = None  # for the oldest deferred response
    # Partitions of deleted topics whose offsets this shard is yet to delete (see
    # CoordinatorRuntime.on_metadata_delta): before anything else it runs.
    pending_deletion: list[tuple[str, int]] | None = None

    @property
    def index(self) -> int:
        return self.partition.partition

    # -- executing handlers ---------------------------------------------------------------------

    def run(
        self,
        handler: Callable[[GroupCoordinatorShard, int], CoordinatorResult],
        token: int,
        *,
        replay_only: bool = False,
        read_group: str | None = None,
        committed_read: bool = False,
        loading: bool = False,
    ) -> None:
        """Run one handler (or timer) and deal with its records and responses.

        ``replay_only``: the handler changes the shard's state only through the records it
        returns (OffsetCommit, OffsetDelete, DeleteGroups) or not at all (the reads), so when
        their append is refused, or it raises, the shard is as it was and only this call's
        answers fail; any other handler's refused write unloads the shard.
        ``committed_read``: the handler reads every group and writes nothing (ListGroups): it
        is given ``committed_listing`` and answered at once, as Kafka reads at the committed
        offset, unless records of no one group are pending (see ``_replay_suffix``).
        ``read_group``: the handler touches that group alone (every request naming a group):
        when it writes nothing (a read, a heartbeat), its answer waits for that group's written
        records to commit, not for every group's. Kafka's reads see the last committed state at
        once, and a write with no records waits only for that coordinator's pending writes (so
        after a load, none): a heartbeat of one group must not wait for another group's records
        a previous leader left above the high watermark, nor time out with them.
        ``loading``: the shard's ``on_loaded``; if it raises, the partition is not served
        until its next leadership change (``load_failed``): reloaded, it raised again, and
        the node replayed the log for ever.
        """
        assert self.shard is not None and self.state is ShardState.ACTIVE
        if self.pending_deletion is not None:
            self.run_pending_deletion()  # Kafka's shard queue: that event came first
            if self.state is not ShardState.ACTIVE:
                self._fail([(token, None)], Errors.NOT_COORDINATOR)
                return
        # OffsetCommit and the reads (replay_only) change nothing before their records are
        # replayed, nor does any handler a consumer group (its entry walks its members).
        self._before_handler = (
            None
            if read_group is None or replay_only or read_group in self.shard.consumer_groups
            else (read_group, self.shard.listed_group(read_group))
        )
        try:
            result = handler(self.shard, token)
        except Exception:
            # A bug in the shard: its state may be half-changed. Kafka's runtime fails just
            # this event (CoordinatorWriteEvent.run), its handlers having changed nothing but
            # through records they never returned; a handler here may have changed a group in
            # memory before it raised, so the shard reloads from its log, and the caller gets
            # an error, not a hang. A replay_only handler (OffsetCommit, a read) changes nothing
            # but through its records, as Kafka's: only its request fails, and a client retrying
            # one that always raises does not reload every group of the partition each time.
            log.exception("coordinator handler failed on %s-%d", OFFSETS_TOPIC, self.index)
            if replay_only:
                self._fail([(token, None)], Errors.UNKNOWN_SERVER_ERROR)
            else:
                self._fail_and_reload([(token, None)], Errors.UNKNOWN_SERVER_ERROR, loading)
            return
        if result.records:
            try:
                parts = (
                    [(result.records, [encode_record(record) for record in result.records])]
                    if result.atomic
                    else self._batches_of(result.records)
                )
            except Exception:
                # A record that does not encode (a value past its field's range): nothing was
                # replayed or appended yet. A replay_only handler changed nothing else, so only
                # its request fails; a client retrying it reloaded the partition, every group
                # on it, each time (Kafka's runtime fails just that write's events).
                log.exception(
                    "coordinator records of %s-%d do not encode", OFFSETS_TOPIC, self.index
                )
                if replay_only:
                    self._fail(result.responses, Errors.UNKNOWN_SERVER_ERROR)
                else:
                    self._fail_and_reload(result.responses, Errors.UNKNOWN_SERVER_ERROR, loading)
                return
            try:
                for records, encoded in parts:
                    if self.runtime.append_linger_ms == 0:
                        self._append_and_replay(records, encoded)
                    elif not self._write(records, encoded):
                        return  # the open batch failed to go out: the shard is gone, answers too
            except _ShardFailedError:
                return  # as the open batch's failing to go out
            except KafkaError as e:
                # Refused before anything was replayed or appended (too large, no longer
                # leader).
                if replay_only:
                    # Kafka's runtime fails just this write's events (its timeline state
                    # reverts to the last written offset); the shard was never changed.
                    log.debug(
                        "coordinator write to %s-%d refused (%s)",
                        OFFSETS_TOPIC,
                        self.index,
                        e.code.name,
                    )
                    self._fail(result.responses, _write_error(e.code))
                    return
                self._unload_after_failed_write(e.code, result.responses)
                return
            except Exception:
                # Appending or replaying records failed after the handler changed the shard.
                log.exception("coordinator write failed on %s-%d", OFFSETS_TOPIC, self.index)
                self._fail_and_reload(result.responses, Errors.UNKNOWN_SERVER_ERROR, loading)
                return
        self._before_handler = None
        offset = self.last_written_offset
        if committed_read:
            assert not result.records, "a committed read writes nothing"
            offset = self.all_written
        elif read_group is not None and not result.records:
            offset = max(self.group_written.get(read_group, 0), self.all_written)
        self._defer(offset, result.responses)

    def _keep_committed(
        self, shard: GroupCoordinatorShard, written: Iterable[tuple[int, CoordinatorRecord]]
    ) -> None:
        """Before one write's records (each with its offset) are replayed into ``shard``: the
        ListGroups entry of each group they name, and the epoch of each consumer group member
        they name, as they are before this write (see ``committed_listing`` and
        ``committed_members``)."""
        before = self._before_handler
        seen: set[str] = set()
        member_ends: dict[tuple[str, str], int] = {}  # where each member's last record ends
        for offset, record in written:
            key = record.key
            group_id = getattr(key, "group_id", None)
            if not isinstance(group_id, str):
                continue
            if isinstance(key, _MEMBER_KEYS):
                member_ends[group_id, key.member_id] = offset + 1
            if group_id in seen:
                continue
            seen.add(group_id)
            if before is not None and before[0] == group_id:
                entry = before[1]
                self._before_handler = None  # later parts of the result: as replayed so far
            else:
                entry = shard.listed_group(group_id)
            _keep(self.committed_listing.setdefault(group_id, []), offset + 1, entry)
        # A consumer group's handlers change it through their records alone: nothing of these
        # is replayed yet, so each member is read as it was before the write.
        for (group_id, member_id), end in sorted(member_ends.items(), key=lambda item: item[1]):
            chain = self.committed_members.setdefault(group_id, {}).setdefault(member_id, [])
            _keep(chain, end, shard.member_epoch(group_id, member_id))
            self.member_writes.append((end, group_id, member_id))

    def committed_listing_at(self, high_watermark: int) -> dict[str, ListedGroup | None]:
        """The entries as of ``high_watermark`` of the groups with records above it."""
        self.forget_committed(high_watermark)
        return {group_id: chain[0][1] for group_id, chain in self.committed_listing.items()}

    def committed_fetch_at(
        self, group_id: str, member_id: str | None, high_watermark: int
    ) -> CommittedFetch:
        """What OffsetFetch checks of the group and of ``member_id`` as of ``high_watermark``
        (see ``CommittedFetch``): only theirs are looked at, on every fetch."""
        listing = self.committed_listing.get(group_id)
        consumer_group = None
        if listing is not None:
            if _forget_passed({group_id: listing}, high_watermark, self.group_written.get):
                del self.committed_listing[group_id]
            else:
                consumer_group = is_consumer_group(listing[0][1])
        self._forget_members(high_watermark)
        members: dict[str, MemberEpoch | None] = {}
        if member_id is not None and (
            chain := self.committed_members.get(group_id, {}).get(member_id)
        ):
            members[member_id] = chain[0][1]
        return CommittedFetch(consumer_group, members)

    def _note_written(self, records: Iterable[CoordinatorRecord], end: int) -> None:
        """The records of a write ending at ``end``: reads of their groups wait for it."""
        for record in records:
            group_id = getattr(record.key, "group_id", None)
            if isinstance(group_id, str):
                self.group_written[group_id] = end
            else:
                self.all_written = end

    def _batches_of(self, records: list[CoordinatorRecord]) -> list[_Encoded]:
        """A non-atomic result's records in runs that each fit ``max.message.bytes`` (Kafka's
        ``CoordinatorRuntime.append`` splits such results over batches), so a pass expiring
        thousands of offsets is not refused whole, over and over; each with its encoding."""
        max_bytes = _max_batch_bytes(self.partition)
        out: list[_Encoded] = []
        run: list[CoordinatorRecord] = []
        encoded: list[tuple[bytes, bytes | None]] = []
        size = fmt.HEADER_SIZE
        for record in records:
            key, value = encode_record(record)
            grows = record_size_bound(key, value)
            if run and size + grows > max_bytes:
                out.append((run, encoded))
                run, encoded, size = [], [], fmt.HEADER_SIZE
            run.append(record)
            encoded.append((key, value))
            size += grows
        if run:
            out.append((run, encoded))
        return out

    def _unload_after_failed_write(
        self, code: Errors, failing: Sequence[tuple[Hashable, Any]]
    ) -> None:
        log.warning(
            "coordinator write to %s-%d failed (%s): unloading the shard",
            OFFSETS_TOPIC,
            self.index,
            code.name,
        )
        self._fail_and_reload(failing, _write_error(code))

    def _fail_and_reload(
        self, failing: Sequence[tuple[Hashable, Any]], code: Errors, loading: bool = False
    ) -> None:
        """The requests of a failed write (or handler) get ``code``, as Kafka fails just that
        batch's events; the shard, changed in memory by what was not written, reloads from
        the log. Every other request waiting on the partition (records appended before, which
        the log keeps, or no records at all) gets NOT_COORDINATOR, which clients retry: a
        refused write of one group failed the others' commits with its own error, which no
        client retries. ``loading``: the shard's ``on_loaded`` failed, which a reload would
        run again: the partition is not served until its next leadership change."""
        self._fail(failing, code)
        if loading:
            self.runtime.load_failed(self)
        else:
            self.runtime.fail_shard(self, Errors.NOT_COORDINATOR)

    def _append_and_replay(
        self, records: list[CoordinatorRecord], encoded: list[tuple[bytes, bytes | None]]
    ) -> None:
        """Append one handler's records (and their encoding) as their own batch, then replay
        them."""
        assert self.shard is not None
        now = self.runtime.now_ms()
        batch = fmt.build_batch(
            [fmt.Record(i, now, key, value) for i, (key, value) in enumerate(encoded)]
        )
        appended = self._appended(batch, self.last_written_offset)
        if appended is None:
            raise _ShardFailedError  # its answers with every other one of the shard's
        self.runtime.count_batch(len(records))
        self._keep_committed(self.shard, enumerate(records, appended.base_offset))
        for i, record in enumerate(records):
            self.shard.replay(appended.base_offset + i, record)
        self.last_written_offset = appended.last_offset + 1
        self._note_written(records, self.last_written_offset)

    def _write(
        self, records: list[CoordinatorRecord], encoded: list[tuple[bytes, bytes | None]]
    ) -> bool:
        """Replay one handler's records (``encoded``: theirs) and add them to the open batch
        (Kafka's ``CoordinatorRuntime.appendRecords``), opening one if needed.

        Raises ``KafkaError`` before anything changed when the partition would refuse them
        now. Returns False when the open batch had to go out first and failed: the context is
        closed and every pending answer failed.
        """
        assert self.shard is not None
        size = sum(record_size_bound(key, value) for key, value in encoded)
        max_bytes = _max_batch_bytes(self.partition)
        if self.batch is not None and self.batch.size + size > max_bytes and not self.flush():
            return False
        if fmt.HEADER_SIZE + size > max_bytes:
            # May not fit a batch at all: appended alone, where the log takes or refuses it.
            self._append_and_replay(records, encoded)
            return True
        self.runtime.replica_manager.check_leader_and_min_isr(self.partition, COORDINATOR_ACKS)
        batch = self.batch
        if batch is None:
            batch = self.batch = _Batch(self.last_written_offset)
            # The callback finds the batch gone if it went out (or was dropped) before.
            loop = asyncio.get_running_loop()
            linger_ms = self.runtime.append_linger_ms
            if linger_ms < 0:
                loop.call_soon(self._flush_if_open, batch)
            else:
                loop.call_later(linger_ms / 1000, self._flush_if_open, batch)
        now = self.runtime.now_ms()
        self._keep_committed(self.shard, enumerate(records, batch.base_offset + len(batch.records)))
        for record, (key, value) in zip(records, encoded, strict=True):
            delta = len(batch.records)
            batch.records.append(fmt.Record(delta, now, key, value))
            self.shard.replay(batch.base_offset + delta, record)
        batch.size += size
        self.last_written_offset = batch.base_offset + len(batch.records)
        self._note_written(records, self.last_written_offset)
        return True

    def _appended(self, batch: bytes, base_offset: int) -> AppendResult | None:
        """Append ``batch``, whose records were (or are to be) replayed from ``base_offset``;
        None, with the shard failed, if the log put it anywhere else (Kafka's runtime fails
        the same way, "...but the log appended at...": a bug). The high watermark the append
        moves answers nothing until the offsets are known to agree: answers waiting on
        offsets the log had not got (a batch lost before) went out as written."""
        self.appending = True
        try:
            appended = self.runtime.replica_manager.append_local(
                self.partition, batch, required_acks=COORDINATOR_ACKS
            )
        finally:
            self.appending = False
        if appended.base_offset != base_offset:
            log.error(
                "coordinator batch for %s-%d appended at offset %d, expected %d: reloading",
                OFFSETS_TOPIC,
                self.index,
                appended.base_offset,
                base_offset,
            )
            self.runtime.fail_shard(self, Errors.NOT_COORDINATOR)
            return None
        self.complete_up_to(self.partition.high_watermark)
        return appended

    def _flush_if_open(self, batch: _Batch) -> None:
        if self.batch is batch:
            self.flush()

    def flush(self) -> bool:
        """Append the open batch (Kafka's ``flushCurrentBatch``); True if it is in the log.

        Its records were replayed at the offsets they were to get, so a refused or failed
        append, or one at any other offset, unloads the shard, which reloads from the log.
        """
        batch, self.batch = self.batch, None
        if batch is None:
            return True
        if self.state is not ShardState.ACTIVE:
            return False
        # The requests whose records were in this batch (or that wait on them).
        base = batch.base_offset
        try:
            appended = self._appended(fmt.build_batch(batch.records), base)
        except KafkaError as e:
            failing = [r for d in self.deferred if d.offset > base for r in d.responses]
            self._unload_after_failed_write(e.code, failing)
            return False
        except Exception:
            # Kafka's flushCurrentBatch fails the batch on any Throwable. Raised out of a
            # lingering batch's callback, the batch was gone, its records replayed but never
            # appended, the shard served on, and the next batch went to the log at its offsets.
            log.exception("coordinator batch for %s-%d failed", OFFSETS_TOPIC, self.index)
            failing = [r for d in self.deferred if d.offset > base for r in d.responses]
            self._fail_and_reload(failing, Errors.UNKNOWN_SERVER_ERROR)
            return False
        if appended is None:
            return False
        self.runtime.count_batch(len(batch.records))
        return True

    def _defer(self, offset: int, responses: Sequence[tuple[Hashable, Any]]) -> None:
        if not responses:
            return
        if self.partition.high_watermark >= offset or self.runtime.bug_ack_before_hw:
            self._deliver(responses)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.runtime.write_timeout_ms / 1000
        self.deferred.append(_Deferred(offset, responses, deadline))
        if self.expiry is None:
            self.expiry = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """Fail the responses past their deadline; the deadlines grow in list order."""
        self.expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        k = 0
        while k < len(self.deferred) and self.deferred[k].deadline <= now:
            k += 1
        timed_out, self.deferred = self.deferred[:k], self.deferred[k:]
        for d in timed_out:
            self._fail(d.responses, _write_error(Errors.REQUEST_TIMED_OUT))
        expired = sum(len(d.responses) for d in timed_out)
        if expired:
            log.info(
                "%d coordinator answers on %s-%d timed out waiting for the high watermark "
                "(at %d, written to %d)",
                expired,
                OFFSETS_TOPIC,
                self.index,
                self.partition.high_watermark,
                self.last_written_offset,
            )
        if self.deferred:
            self.expiry = loop.call_at(self.deferred[0].deadline, self._expire)

    def _fail(self, responses: Sequence[tuple[Hashable, Any]], code: Errors) -> None:
        for token, _response in responses:
            fut = self.futures.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_exception(CoordinatorError(code))

    def _deliver(self, responses: Sequence[tuple[Hashable, Any]]) -> None:
        for token, response in responses:
            fut = self.futures.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(response)

    def complete_up_to(self, high_watermark: int) -> None:
        if self.appending:
            return  # _appended acts on it once the append is where it was expected
        if len(self.group_written) >= self.group_written_limit:
            self.group_written = {g: e for g, e in self.group_written.items() if e > high_watermark}
            # Twice what is left: the pass costs O(1) per write, spread over them.
            self.group_written_limit = max(GROUP_WRITTEN_MIN_LIMIT, 2 * len(self.group_written))
        if self.committed_listing or self.committed_members:
            self.forget_committed(high_watermark)
        ready = [d for d in self.deferred if d.offset <= high_watermark]
        if not ready:
            return
        self.deferred = [d for d in self.deferred if d.offset > high_watermark]
        for d in ready:
            self._deliver(d.responses)

    def forget_committed(self, high_watermark: int) -> None:
        """Drop the entries (of groups and of members) before writes the high watermark has
        passed, as long as a later one (or, with none, the state now) is as of it."""
        written = self.group_written
        for group_id in _forget_passed(self.committed_listing, high_watermark, written.get):
            del self.committed_listing[group_id]
        self._forget_members(high_watermark)

    def _forget_members(self, high_watermark: int) -> None:
        """``forget_committed`` of the members: those whose writes the HW passed, in the order
        of ``member_writes`` (a large group's rebalance leaves thousands above the HW; each
        notice of the HW looks at those it passed, not at all of them). A member's entry ends
        with its last record of the write: nothing of it is left above the HW after that."""
        writes = self.member_writes
        while writes and writes[0][0] <= high_watermark:
            _, group_id, member_id = writes.popleft()
            members = self.committed_members.get(group_id, {})
            chain = members.get(member_id)
            if chain is None:
                continue  # an entry of the chain the same write merged, already forgotten
            while chain and chain[0][0] <= high_watermark:
                del chain[0]
            if not chain:
                del members[member_id]
                if not members:
                    del self.committed_members[group_id]

    def queue_deletion(self, deleted: list[tuple[str, int]]) -> bool:
        """Add deleted topics' partitions to those to delete; True if none were pending."""
        first = self.pending_deletion is None
        self.pending_deletion = [*(self.pending_deletion or ()), *deleted]
        return first

    def run_pending_deletion(self) -> None:
        deleted, self.pending_deletion = self.pending_deletion, None
        if deleted and self.state is ShardState.ACTIVE:
            self.run(lambda shard, _token: shard.on_partitions_deleted(deleted), 0)

    def fire_timer(self, key: str, deadline_ms: int) -> None:
        if self.state is not ShardState.ACTIVE or self.timer is None:
            return
        self.timer.handles.pop(key, None)
        if key == GROUP_EXPIRATION_KEY:
            # A part of an expiration pass (tens of milliseconds): one shard's a turn of the
            # loop, as the shards loaded together fire theirs together.
            self.runtime.in_turn(functools.partial(self._fire, key, deadline_ms))
            return
        self._fire(key, deadline_ms)

    def _fire(self, key: str, deadline_ms: int) -> None:
        if self.state is not ShardState.ACTIVE:
            return
        # Its delay has passed on the loop's monotonic clock, which is when a timer fires
        # (Kafka's CoordinatorTimerImpl): a wall clock stepped back (NTP, a resumed VM) must
        # not hold it, and every session and rebalance timeout, for the size of the step.
        now = max(self.runtime.now_ms(), deadline_ms)
        self.run(lambda shard, _token: shard.on_timer(key, now), 0)

    def fail_all(self, code: Errors) -> None:
        self.deferred.clear()
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        futures, self.futures = self.futures, {}
        for fut in futures.values():
            if not fut.done():
                fut.set_exception(CoordinatorError(code))


@dataclass(eq=False)
class Standby:
    """A follower's passive shard, replayed up to the partition's high watermark."""

    partition: Partition
    log: Log
    shard: GroupCoordinatorShard
    timer: _ShardTimer
    next_offset: int  # the next log offset to replay
    truncations: int  # the log's truncation count this state is valid for
    tombstone_drops: int  # the log's count of cleaner swaps that dropped a tombstone
    cleaned_below: int  # the log's first dirty offset when the replay began at its start
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    decoder: RecordDecoder = field(default_factory=RecordDecoder)
    records: int = 0
    closed: bool = False

    def still_valid(self) -> bool:
        """Whether what was replayed is still the log's prefix (no truncation below it, no
        log start moved past it; a single truncation at or above ``next_offset`` is fine) and
        what is left to replay still holds every deletion: a cleaner pass that dropped a
        tombstone at or above ``next_offset`` (and one no pass had gone over when the standby
        began: ``Log.tombstone_drops_seen``) took the deletion of a key whose earlier value
        may have been replayed (a cold load reads the latest record of each key, so it never
        meets the value either). Called before each read of the log, between which the
        cleaner's swaps come, so ``next_offset`` is where the standby stood at the swap."""
        lg = self.log
        kept = lg.prefix_kept(self.next_offset, self.truncations, floor=lg.log_start_offset)
        if self.partition.log is not lg or kept is None:
            return False
        if kept != self.truncations:
            # A truncation at or above it, which it goes on past: what comes there is new,
            # gone over by no pass when the standby began (review helper-287).
            self.cleaned_below = min(self.cleaned_below, lg.last_truncated_to)
        drops = lg.tombstone_drops_seen(self.next_offset, self.tombstone_drops, self.cleaned_below)
        if drops is None:
            return False
        self.tombstone_drops = drops
        self.truncations = kept
        return True


def _drop(fut: asyncio.Future[Any]) -> None:
    """A future no one will await: cancelled, or its exception taken, so that asyncio does
    not log it as never retrieved (what completes it checks ``done()`` first)."""
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()


def _bind_now(
    handler: Callable[[GroupCoordinatorShard, int, int], CoordinatorResult], now_ms: int
) -> Callable[[GroupCoordinatorShard, int], CoordinatorResult]:
    def bound(shard: GroupCoordinatorShard, token: int) -> CoordinatorResult:
        return handler(shard, token, now_ms)

    return bound


def _list_groups(
    shard: GroupCoordinatorShard,
    token: int,
    now_ms: int,
    *,
    request: ListGroupsRequest,
    committed: Mapping[str, ListedGroup | None],
) -> CoordinatorResult:
    return shard.handle_list_groups(token, request, now_ms, committed)


def _write_error(code: Errors) -> Errors:
    """Kafka's mapping of storage errors for coordinator writes (KAFKA-FACTS 1.5,
    ``CoordinatorOperationExceptionHelper.handleOperationException``)."""
    if code in (
        Errors.NOT_ENOUGH_REPLICAS,
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        Errors.REQUEST_TIMED_OUT,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
    ):
        return Errors.COORDINATOR_NOT_AVAILABLE
    if code in (Errors.MESSAGE_TOO_LARGE, Errors.RECORD_LIST_TOO_LARGE, Errors.INVALID_FETCH_SIZE):
        return Errors.UNKNOWN_SERVER_ERROR  # retrying would be refused the same way
    return Errors.NOT_COORDINATOR


class CoordinatorRuntime:
    def __init__(
        self,
        replica_manager: ReplicaManager,
        config: GroupConfig,
        now_ms: Callable[[], int],
        *,
        num_partitions: Callable[[], int | None],
        hot_standby: bool = True,
        load_buffer_size: int = LOAD_CHUNK_BYTES,
        bug_ack_before_hw: bool = False,
        measure_latency: bool = True,
        append_linger_ms: int = -1,
        write_timeout_ms: int = 5000,
        group_configs: GroupConfigLookup = no_group_configs,
    ) -> None:
        """``measure_latency``: time OffsetCommit requests for the metrics (``metrics.enable``).
        ``append_linger_ms``: ``group.coordinator.append.linger.ms``; ``write_timeout_ms``:
        ``offsets.commit.timeout.ms`` (see the module doc). ``group_configs(group_id)``: a
        group's dynamic configs, from the metadata image (KIP-848's group configs)."""
        self.replica_manager = replica_manager
        self.group_configs = group_configs
        self.append_linger_ms = append_linger_ms
        self.write_timeout_ms = write_timeout_ms
        self.config = config
        self.now_ms = now_ms
        self.num_partitions = num_partitions
        self.hot_standby = hot_standby
        # test.bug.ack.before.high.watermark: answers before the HW, for the chaos suite's test.
        self.bug_ack_before_hw = bug_ack_before_hw
        if bug_ack_before_hw:
            log.warning("DELIBERATELY BROKEN: coordinator writes are answered before the HW")
        self.load_buffer_size = load_buffer_size
        # Replay yields to the event loop after each read: 5 MiB (Kafka's buffer) is ~0.5 s of
        # replay here, long enough to delay the node's broker heartbeats (a cold 1M-record load
        # once got its node fenced a second early). 512 KiB keeps every step around 50 ms.
        self.replay_chunk_bytes = min(load_buffer_size, REPLAY_STEP_BYTES)
        self.contexts: dict[int, ShardContext] = {}
        self.standbys: dict[int, Standby] = {}
        self._tokens = itertools.count(1)
        self.loads: list[LoadSummary] = []
        # For the node's metrics (node/metrics.py reads them at scrape time): the shards'
        # counters, shared by all of them; shard loads by kind (hot from a standby or cold);
        # records replayed by loads and by standbys; OffsetCommit latency (node/kafka/groups.py
        # observes it: from the request to its answer, the wait for the HW included).
        self.stats = CoordinatorStats()
        self.load_duration_s = {
            True: Histogram(DURATION_BUCKETS_S),
            False: Histogram(DURATION_BUCKETS_S),
        }
        self.load_records_replayed = 0
        self.standby_records_replayed = 0
        self.load_failures = 0
        # Coordinator writes appended: batches and their records (Kafka's batch-flush-rate).
        self.batches_appended = 0
        self.records_appended = 0
        self.offset_commit_latency_s: Histogram | None = (
            Histogram(LATENCY_BUCKETS_S) if measure_latency else None
        )
        # Work that runs one piece a turn of the event loop (see in_turn).
        self._turns: collections.deque[Callable[[], None]] = collections.deque()
        self._replay_turns = _ReplayTurns()
        self._turn_scheduled = False
        replica_manager.add_role_listener(self._on_role)
        replica_manager.add_high_watermark_listener(self._on_high_watermark)

    def in_turn(self, work: Callable[[], None]) -> None:
        """Run ``work`` in a turn of the event loop of its own, after the work queued before
        it: callbacks due together run back to back, with no I/O between them, so shards'
        costly writes (an expiration pass, a deleted topic's tombstones) queued together
        held the loop for all of them. Kafka runs each on a coordinator thread."""
        self._turns.append(work)
        if not self._turn_scheduled:
            asyncio.get_running_loop().call_soon(self._next_turn)
            self._turn_scheduled = True

    def _next_turn(self) -> None:
        work = self._turns.popleft()
        try:
            work()
        except Exception:
            log.exception("coordinator work failed")
        finally:
            if self._turns:
                asyncio.get_running_loop().call_soon(self._next_turn)
            else:
                self._turn_scheduled = False

    def count_batch(self, records: int) -> None:
        self.batches_appended += 1
        self.records_appended += records

    @staticmethod
    def new_member_id(client_id: str) -> str:
        # Kafka: clientId + "-" + UUID (ClassicGroup/GroupMetadataManager).
        return f"{client_id}-{uuid.uuid4()}"

    # -- roles --------------------------------------------------------------------------------

    def _on_role(self, part: Partition, is_leader: bool) -> None:
        if part.topic != OFFSETS_TOPIC:
            return
        if is_leader:
            self.schedule_load(part)
            return
        self.unload(part.partition, part.leader_epoch)
        if self.replica_manager.partitions.get(part.tp) is not part:
            self._drop_standby(part.partition)  # no longer hosted here
        elif self.hot_standby:
            self._ensure_standby(part)

    def _on_high_watermark(self, part: Partition, high_watermark: int) -> None:
        if part.topic != OFFSETS_TOPIC:
            return
        ctx = self.contexts.get(part.partition)
        if ctx is not None:
            ctx.complete_up_to(high_watermark)
        standby = self.standbys.get(part.partition)
        if standby is not None:
            standby.wakeup.set()

    def schedule_load(self, part: Partition) -> None:
        old = self.contexts.get(part.partition)
        if old is not None and old.leader_epoch >= part.leader_epoch:
            return  # stale or duplicate election
        if (
            old is not None
            and old.partition is part
            and old.state in (ShardState.LOADING, ShardState.ACTIVE)
        ):
            # A new leader epoch with this node leading throughout (it never saw itself a
            # follower: it would have unloaded). Kafka's CoordinatorRuntime.
            # scheduleLoadOperation takes the new epoch and keeps a loading or active
            # coordinator as it is: the log it replayed is still the leader's. Reloaded, every
            # pending answer failed NOT_COORDINATOR and every member in a rebalance rejoined.
            log.info(
                "%s-%d: leader epoch %d -> %d, still led here: the shard stays %s",
                OFFSETS_TOPIC,
                part.partition,
                old.leader_epoch,
                part.leader_epoch,
                old.state.name.lower(),
            )
            old.leader_epoch = part.leader_epoch
            return
        if old is not None:
            self._close(old, Errors.NOT_COORDINATOR)
        standby = self._take_standby(part)
        ctx = ShardContext(self, part, part.leader_epoch)
        self.contexts[part.partition] = ctx
        asyncio.get_running_loop().create_task(
            self._load(ctx, standby), name=f"load-{part.partition}"
        )

    async def _load(self, ctx: ShardContext, standby: Standby | None = None) -> None:
        """Load the shard; a load that fails (an I/O error, a batch that does not decode, the
        log start moving past the replay) leaves the partition unserved, as Kafka's
        ``CoordinatorContext`` goes FAILED and unloads: requests get NOT_COORDINATOR and
        ListGroups skips it, rather than COORDINATOR_LOAD_IN_PROGRESS for ever. The next
        leadership change loads it again. An I/O error fails the data directory, which halts
        the node, as Kafka's ``UnifiedLog.read`` hands it to the ``LogDirFailureChannel``:
        left as it was, the node stayed the partition's leader and nothing moved its groups
        to a replica that can serve them."""
        try:
            await self._replay_log(ctx, standby)
        except Exception as e:
            if self.contexts.get(ctx.index) is not ctx:
                return  # unloaded meanwhile: nothing to serve either way
            log.exception("loading %s-%d failed", OFFSETS_TOPIC, ctx.index)
            self.load_failed(ctx)
            if isinstance(e, OSError):
                self.replica_manager.log_dir_failure.fail(f"loading {OFFSETS_TOPIC}-{ctx.index}", e)

    async def _replay_log(self, ctx: ShardContext, standby: Standby | None) -> None:
        """Replay the log into a shard, from the log start or (hot) from the standby's end."""
        start = self.now_ms()
        loop = asyncio.get_running_loop()
        started = loop.time()  # the duration: a step of the wall clock must not skew it
        lg = ctx.partition.log
        if standby is not None:
            timer, shard, offset = standby.timer, standby.shard, standby.next_offset
            decoder = standby.decoder
            timer.ctx = ctx
        else:
            timer = _ShardTimer(ctx)
            shard = self._new_shard(ctx.partition, timer)
            offset = lg.log_start_offset
            decoder = RecordDecoder()
        records = 0
        applied = 0
        size = 0
        drops = lg.tombstone_drops if standby is None else standby.tombstone_drops
        cleaned_below = lg.first_dirty_offset if standby is None else standby.cleaned_below
        # Hot: the suffix record by record. Cold: the latest record per key (LatestRecords).
        latest = LatestRecords() if standby is None else None
        # First up to the high watermark, then the rest (_replay_suffix).
        split = min(ctx.partition.high_watermark, lg.log_end_offset)
        suffix_read = False
        for stop in (split, None):
            while ctx.state is ShardState.LOADING and offset < (
                lg.log_end_offset if stop is None else stop
            ):
                full = False
                async with self._replay_turns.turn(urgent=True):
                    # Before each read (a hot load's first included: the standby was last
                    # checked when the shard was elected), as Standby.still_valid; in the
                    # read's turn, so no cleaner swap comes between them.
                    seen = lg.tombstone_drops_seen(offset, drops, cleaned_below)
                    cleaned_ahead = seen is None and ctx.partition.log is lg
                    if not cleaned_ahead:
                        drops = lg.tombstone_drops if seen is None else seen
                        if stop is None and not suffix_read:
                            # The first read above the HW: the suffix, a write at a time. A
                            # replay already past the HW (a standby ahead of it: none is)
                            # leaves what it read above it unknown, as one too large to
                            # replay here does: every read waits for the whole suffix then,
                            # and it is replayed as the rest is.
                            suffix_read = True
                            end = lg.log_end_offset
                            suffix = (
                                _replay_suffix(ctx, shard, decoder, lg, start=offset, end=end)
                                if offset <= split
                                else None
                            )
                            if suffix is not None:
                                offset, n, nbytes = suffix
                                applied += n
                                records += n
                                size += nbytes
                                continue
                            ctx.group_written, ctx.all_written = {}, end
                        if latest is None:
                            offset, n, nbytes = _replay_chunk(
                                shard,
                                decoder,
                                lg,
                                offset,
                                max_offset=stop,
                                max_bytes=self.replay_chunk_bytes,
                            )
                            applied += n
                        else:
                            offset, n, nbytes = latest.scan(
                                lg, offset, self.replay_chunk_bytes, stop
                            )
                            full = len(latest.latest) >= latest.MAX_KEYS
                if cleaned_ahead:
                    # A cleaner swap dropped a tombstone not read yet, of a key whose value
                    # may have been: from the start.
                    log.info(
                        "%s-%d: a tombstone ahead of the load was cleaned away; loading again",
                        OFFSETS_TOPIC,
                        ctx.index,
                    )
                    await self._replay_log(ctx, None)
                    return
                if full:
                    assert latest is not None
                    applied += await self._flush_latest(ctx, latest, shard, decoder)
                if not nbytes:
                    break
                records += n
                size += nbytes
                await asyncio.sleep(0)  # let other work run between chunks
            if stop is not None and ctx.state is ShardState.LOADING and latest is not None:
                # What is below the HW, before the rest.
                applied += await self._flush_latest(ctx, latest, shard, decoder)
        if latest is not None and ctx.state is ShardState.LOADING:
            applied += await self._flush_latest(ctx, latest, shard, decoder)
        if ctx.state is not ShardState.LOADING or self.contexts.get(ctx.index) is not ctx:
            return  # unloaded meanwhile
        ctx.shard = shard
        ctx.timer = timer
        end = lg.log_end_offset
        ctx.forget_committed(min(ctx.partition.high_watermark, end))
        ctx.last_written_offset = end
        ctx.state = ShardState.ACTIVE
        summary = LoadSummary(
            ctx.index,
            ctx.leader_epoch,
            start,
            self.now_ms(),
            records,
            applied,
            size,
            standby is not None,
        )
        took_s = loop.time() - started
        ctx.run(lambda s, _t: s.on_loaded(self.now_ms()), 0, loading=True)
        if self.contexts.get(ctx.index) is not ctx:
            return  # on_loaded failed: not loaded (load_failed)
        ctx.load_summary = summary
        self.loads.append(summary)
        self.load_duration_s[summary.hot].observe(took_s)
        self.load_records_replayed += records
        del self.loads[:-1000]  # the recent ones are enough
        log.info(
            "loaded %s-%d (epoch %d, %s): %d records (%d replayed), %d bytes in %d ms",
            OFFSETS_TOPIC,
            ctx.index,
            ctx.leader_epoch,
            "hot from the standby" if summary.hot else "cold",
            records,
            applied,
            size,
            took_s * 1000,
        )

    async def _flush_latest(
        self,
        ctx: ShardContext,
        latest: LatestRecords,
        shard: GroupCoordinatorShard,
        decoder: RecordDecoder,
    ) -> int:
        """``latest``'s records replayed in turns of ``FLUSH_STEP_RECORDS`` (262,144 keys took
        0.8 s of the loop in one go), until the load ends: unloaded meanwhile, what is left is
        of no use."""
        async with self._replay_turns.turn(urgent=True):
            ordered = latest.take_ordered()
        replayed = 0
        for start in range(0, len(ordered), FLUSH_STEP_RECORDS):
            await asyncio.sleep(0)  # a turn for the rest between two slices
            if ctx.state is not ShardState.LOADING:
                break
            async with self._replay_turns.turn(urgent=True):
                replayed += replay_latest(
                    shard, decoder, ordered[start : start + FLUSH_STEP_RECORDS]
                )
        return replayed

    # -- hot standby ----------------------------------------------------------------------------

    def _ensure_standby(self, part: Partition) -> None:
        current = self.standbys.get(part.partition)
        if current is not None and current.partition is part and current.still_valid():
            current.wakeup.set()
            return
        self._drop_standby(part.partition)
        standby = self._new_standby(part)
        self.standbys[part.partition] = standby
        task = asyncio.get_running_loop().create_task(
            self._follow(standby), name=f"standby-{part.partition}"
        )
        task.add_done_callback(functools.partial(self._standby_ended, standby))

    def _standby_ended(self, standby: Standby, task: asyncio.Task[None]) -> None:
        """A standby's task that raised outside its replay's own handling (its validity
        check, a new shard): said, and the standby dropped, so a promotion loads cold. It
        stayed registered, never advancing, and a promotion replayed all above it unseen."""
        if task.cancelled() or (error := task.exception()) is None:
            return
        log.error(
            "%s-%d: standby stopped",
            OFFSETS_TOPIC,
            standby.partition.partition,
            exc_info=error,
        )
        if self.standbys.get(standby.partition.partition) is standby:
            self._drop_standby(standby.partition.partition)

    def _new_shard(self, part: Partition, timer: _ShardTimer) -> GroupCoordinatorShard:
        return GroupCoordinatorShard(
            self.config,
            timer,
            self.new_member_id,
            self.stats,
            self.group_configs,
            max_batch_bytes=functools.partial(_max_batch_bytes, part),
        )

    def _new_standby(self, part: Partition) -> Standby:
        timer = _ShardTimer(None)
        lg = part.log
        return Standby(
            part,
            lg,
            self._new_shard(part, timer),
            timer,
            lg.log_start_offset,
            lg.truncations,
            lg.tombstone_drops,
            lg.first_dirty_offset,
        )

    def _start_standby_over(self, standby: Standby, part: Partition) -> None:
        """``standby`` replays again from the log start, into a new shard."""
        fresh = self._new_standby(part)
        standby.shard, standby.timer = fresh.shard, fresh.timer
        standby.log, standby.next_offset = fresh.log, fresh.next_offset
        standby.truncations, standby.records = fresh.truncations, 0
        standby.tombstone_drops = fresh.tombstone_drops
        standby.cleaned_below = fresh.cleaned_below

    async def _follow(self, standby: Standby) -> None:
        """Replay committed records into the standby as the follower's HW moves."""
        part = standby.partition
        while not standby.closed:
            idle = given_up = failed = False
            nbytes = 0
            high_watermark = offset = 0
            async with self._replay_turns.turn(urgent=False):
                # In the step's turn: a promotion may have taken the standby while it waited.
                if standby.closed:
                    return
                if not standby.still_valid():
                    log.info(
                        "%s-%d: the log was truncated below the standby; replaying it again",
                        OFFSETS_TOPIC,
                        part.partition,
                    )
                    self._start_standby_over(standby, part)
                high_watermark = min(part.high_watermark, standby.log.log_end_offset)
                if standby.next_offset >= high_watermark:
                    idle = True
                    standby.wakeup.clear()
                else:
                    try:
                        offset, n, nbytes = _replay_chunk(
                            standby.shard,
                            standby.decoder,
                            standby.log,
                            standby.next_offset,
                            max_offset=high_watermark,
                            max_bytes=self.replay_chunk_bytes,
                        )
                    except UndecodableRecordError as e:
                        # Replaying again would meet it again: no standby; a promotion loads
                        # cold and fails the same way, leaving the shard unserved
                        # (NOT_COORDINATOR).
                        log.error("%s-%d: standby stopped: %s", OFFSETS_TOPIC, part.partition, e)
                        given_up = True
                    except Exception as e:
                        log.exception("%s-%d: standby replay failed", OFFSETS_TOPIC, part.partition)
                        if isinstance(e, OSError):
                            # The disk's error (a chunk is read in one go: no segment is let
                            # go under it) fails the data directory, as a load's does and as
                            # Kafka's log reads do (maybeHandleIOException): retried every
                            # second from the log start, it failed for ever while the node
                            # went on as the partition's follower.
                            self.replica_manager.log_dir_failure.fail(
                                f"replaying {OFFSETS_TOPIC}-{part.partition} into its standby", e
                            )
                            given_up = True  # no standby, as below
                        else:
                            # Its shard took part of a chunk: start again from the log start,
                            # at once (a truncation count of -1 meant that, but read as valid
                            # on a log never truncated, and a promotion took the half-replayed
                            # shard).
                            self._start_standby_over(standby, part)
                            failed = True
                    else:
                        if nbytes:
                            standby.next_offset = offset
                            standby.records += n
                            self.standby_records_replayed += n
                        else:
                            idle = True
                            standby.wakeup.clear()
            if given_up:
                self._drop_standby(part.partition)
                return
            if failed:
                await asyncio.sleep(1.0)  # do not spin on an error
            elif idle:
                await standby.wakeup.wait()
            elif offset < high_watermark:
                await asyncio.sleep(0)  # let other work run between chunks

    def _take_standby(self, part: Partition) -> Standby | None:
        """Promotion: the standby's shard if it is still the log's prefix, else None (cold)."""
        standby = self.standbys.pop(part.partition, None)
        if standby is None:
            return None
        standby.closed = True
        standby.wakeup.set()
        if standby.partition is not part or not standby.still_valid():
            return None
        return standby

    def _drop_standby(self, partition: int) -> None:
        standby = self.standbys.pop(partition, None)
        if standby is not None:
            standby.closed = True
            standby.wakeup.set()

    def load_failed(self, ctx: ShardContext) -> None:
        """The partition is not served until its next leadership change: Kafka's
        ``CoordinatorRuntime`` moves a context whose load (``onLoaded`` included) failed to
        FAILED, and its requests get NOT_COORDINATOR."""
        log.error(
            "%s-%d (epoch %d) did not load: not served until its next leadership change",
            OFFSETS_TOPIC,
            ctx.index,
            ctx.leader_epoch,
        )
        self.load_failures += 1
        self._close(ctx, Errors.NOT_COORDINATOR)

    def unload(self, partition: int, leader_epoch: int) -> None:
        ctx = self.contexts.get(partition)
        if ctx is None:
            return
        self._close(ctx, Errors.NOT_COORDINATOR)

    def fail_shard(self, ctx: ShardContext, code: Errors) -> None:
        self._close(ctx, code)
        if ctx.partition.is_leader:
            # Reload from the log: whatever was appended is the truth.
            new = ShardContext(self, ctx.partition, ctx.leader_epoch)
            self.contexts[ctx.index] = new
            asyncio.get_running_loop().create_task(self._load(new), name=f"load-{ctx.index}")

    def _close(self, ctx: ShardContext, code: Errors) -> None:
        if self.contexts.get(ctx.index) is ctx:
            del self.contexts[ctx.index]
        was_active = ctx.state is ShardState.ACTIVE
        ctx.state = ShardState.CLOSED
        ctx.batch = None  # never appended: its answers fail below
        if ctx.timer is not None:
            ctx.timer.cancel_all()
        if was_active and ctx.shard is not None:
            try:
                result = ctx.shard.on_unloaded(self.now_ms())
                ctx._deliver(result.responses)  # NOT_COORDINATOR answers to pending joins/syncs
            except Exception:
                # Kafka's runtime logs a failed onUnloaded and unloads all the same: what the
                # shard did not answer is failed below, not left waiting.
                log.exception("unloading %s-%d failed", OFFSETS_TOPIC, ctx.index)
        ctx.fail_all(code)

    # -- requests -----------------------------------------------------------------------------

    def context_for(self, group_id: str) -> ShardContext:
        n = self.num_partitions()
        if not n:
            raise CoordinatorError(Errors.COORDINATOR_NOT_AVAILABLE, "no offsets topic yet")
        ctx = self.contexts.get(partition_for(group_id, n))
        if ctx is None:
            raise CoordinatorError(Errors.NOT_COORDINATOR)
        if ctx.state is ShardState.LOADING:
            raise CoordinatorError(Errors.COORDINATOR_LOAD_IN_PROGRESS)
        if ctx.state is not ShardState.ACTIVE:
            raise CoordinatorError(Errors.NOT_COORDINATOR)
        return ctx

    def submit(
        self,
        group_id: str,
        handler: Callable[[GroupCoordinatorShard, int, int], CoordinatorResult],
        *,
        replay_only: bool = False,
    ) -> asyncio.Future[Any]:
        """Run ``handler(shard, token, now_ms)`` on the group's shard now, in request order.

        Raises ``CoordinatorError`` at once when no active shard serves the group; otherwise
        the future completes with the response once what it depends on is committed: its own
        records, or when it writes none, this group's (``read_group`` of ``ShardContext.run``).
        ``replay_only``: see ``ShardContext.run``.
        """
        ctx = self.context_for(group_id)
        return self._submit_to(ctx, handler, replay_only=replay_only, read_group=group_id)

    def _submit_to(
        self,
        ctx: ShardContext,
        handler: Callable[[GroupCoordinatorShard, int, int], CoordinatorResult],
        *,
        replay_only: bool = False,
        read_group: str | None = None,
        committed_read: bool = False,
    ) -> asyncio.Future[Any]:
        token = next(self._tokens)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        ctx.futures[token] = fut
        try:
            ctx.run(
                _bind_now(handler, self.now_ms()),
                token,
                replay_only=replay_only,
                read_group=read_group,
                committed_read=committed_read,
            )
        except BaseException:
            # The caller gets the exception, not the future: left in the shard's map, it
            # was failed at the shard's unload alone, with no one to retrieve it.
            ctx.futures.pop(token, None)
            _drop(fut)
            raise
        return fut

    async def call(
        self,
        group_id: str,
        handler: Callable[[GroupCoordinatorShard, int, int], CoordinatorResult],
        *,
        replay_only: bool = False,
    ) -> Any:
        return await self.submit(group_id, handler, replay_only=replay_only)

    def committed_fetch(self, group_id: str, member_id: str | None) -> CommittedFetch:
        """The group and the member as of the high watermark (``ShardContext.committed_fetch_at``):
        what an OffsetFetch handler running now checks, as Kafka's reads at the last committed
        offset."""
        ctx = self.context_for(group_id)
        return ctx.committed_fetch_at(group_id, member_id, ctx.partition.high_watermark)

    def list_groups(self, request: ListGroupsRequest) -> list[asyncio.Future[Any]]:
        """ListGroups on every active shard, each answering from its committed state (see
        ``ShardContext.committed_listing``) at once; a loading shard raises at once."""
        if any(ctx.state is ShardState.LOADING for ctx in self.contexts.values()):
            raise CoordinatorError(Errors.COORDINATOR_LOAD_IN_PROGRESS)
        futures: list[asyncio.Future[Any]] = []
        try:
            for ctx in list(self.contexts.values()):
                if ctx.state is ShardState.ACTIVE:
                    committed = ctx.committed_listing_at(ctx.partition.high_watermark)
                    futures.append(
                        self._submit_to(
                            ctx,
                            functools.partial(_list_groups, request=request, committed=committed),
                            replay_only=True,  # a read: if it raises, it fails alone
                            committed_read=True,
                        )
                    )
        except BaseException:
            for fut in futures:  # no one is left to await them
                _drop(fut)
            raise
        return futures

    def on_metadata_delta(self, delta: MetadataDelta) -> None:
        """Deleted topics: every active shard writes tombstones for the offsets committed on
        their partitions (Kafka's ``BrokerMetadataPublisher`` calls
        ``GroupCoordinatorService.onPartitionsDeleted``, a write on every shard). A shard still
        loading misses them, as Kafka's does. Each shard's write takes a turn of the event
        loop of its own (``in_turn``), as each is an event of its own in Kafka: a topic with
        offsets in many groups took seconds of the loop in one (3.4 s for 500,000 over 50
        shards). It comes before anything else the shard runs, as on Kafka's shard queue: a
        commit to a topic made again under the same name is not deleted with the old one."""
        deleted = [
            (delta.topic_names[tp.topic_id], tp.partition)
            for tp, change in delta.partitions.items()
            if change.after is None
            and (topic := delta.topics.get(tp.topic_id)) is not None
            and topic.after is None
        ]
        if not deleted:
            return
        for ctx in list(self.contexts.values()):
            if ctx.state is ShardState.ACTIVE and ctx.queue_deletion(deleted):
                self.in_turn(ctx.run_pending_deletion)

    def close(self) -> None:
        for ctx in list(self.contexts.values()):
            self._close(ctx, Errors.NOT_COORDINATOR)
        for partition in list(self.standbys):
            self._drop_standby(partition)
