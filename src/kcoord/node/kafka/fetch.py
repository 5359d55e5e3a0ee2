"""Fetch (apiKey 1), ListOffsets (apiKey 2) and OffsetForLeaderEpoch (apiKey 23) for consumers.

Fetch (Kafka's ``KafkaApis.handleFetchRequest``, ``ReplicaManager.fetchMessages`` and
``DelayedFetch``):

- Each partition is read from the leader's log from the fetch offset, whole batches, up to the
  high watermark (so ``last_stable_offset`` is the high watermark too: kcoord has no
  transactions), at most ``partition_max_bytes`` per partition and ``max_bytes`` in all, except
  that the first batch of the first partition with data is returned whole even when larger, so
  a consumer always progresses (KIP-74). Errors per partition: ``NOT_LEADER_OR_FOLLOWER`` (with
  the leader hint and its endpoint from v16, KIP-951, as Kafka: the ``current_leader`` field
  exists from v12 but Kafka leaves it unset below v16, and a v12 client that trusts a hint
  naming a broker it has no endpoint for -- kafka-python 3 -- fails its poll with
  UnknownBrokerIdError), ``UNKNOWN_TOPIC_OR_PARTITION`` /
  ``UNKNOWN_TOPIC_ID`` (v13+ names topics by id), ``OFFSET_OUT_OF_RANGE``,
  ``FENCED_LEADER_EPOCH`` / ``UNKNOWN_LEADER_EPOCH`` when the consumer's ``current_leader_epoch``
  is older / newer than the leader's (KIP-320).
- Long poll: when fewer than ``min_bytes`` are available and nothing failed, the response is
  deferred until enough bytes are available, a partition's high watermark or leadership
  changes so that it has something new to say, or ``max_wait_ms`` passes. Waiting fetches are
  woken by the replica manager's high-watermark and role listeners; nothing polls.
- Fetch sessions (KIP-227) are not kept: every request is served as a full fetch and answered
  with session id 0, which tells a client no session was created (the Java client, librdkafka,
  kafka-python and aiokafka all accept it). An incremental request (epoch > 0) names a session
  this node never created: ``FETCH_SESSION_ID_NOT_FOUND``.

ListOffsets (``KafkaApis.handleListOffsetRequest``, ``Partition.fetchOffsetForTimestamp``), on
the leader: ``-2`` (earliest) the log start offset; ``-1`` (latest) the high watermark (the
last stable offset under read_committed: the same here); ``-3`` (max timestamp, KIP-734) the
first record with the largest timestamp in the log, "none" if it is not below the high
watermark (``UnifiedLog.fetchOffsetByTimestamp`` looks over the whole log); ``-4`` (earliest
local, KIP-405) as ``-2`` and ``-5`` (latest tiered) as "none" (no tiered storage); a
timestamp, the first offset whose record timestamp is at or after it, through the time index,
or ``-1`` if none below the high watermark. A consumer's request (``replica_id`` -1) to a
leader whose high watermark is still below the log end offset its epoch began at (a new
leader whose followers have not fetched yet) gets ``OFFSET_NOT_AVAILABLE`` for ``-1`` and for
a lookup that lands at or past the high watermark, ``LEADER_NOT_AVAILABLE`` below v5 (Kafka's
``Partition.fetchOffsetForTimestamp`` and ``ReplicaManager.fetchOffset``): the older high
watermark would let a consumer's "latest" step back. Both are retriable in the three clients.
A request from anything but a client (``replica_id`` a broker's id, or -2 for debugging) sees
up to the log end instead of the HW, and -2 may ask a follower (``KafkaApis``'
``isClientRequest`` and ``fetchOnlyFromLeader``).

OffsetForLeaderEpoch (``KafkaApis.handleOffsetForLeaderEpochRequest``,
``Partition.lastOffsetForLeaderEpoch``), on the leader: the end offset of the requested leader
epoch from the partition's leader-epoch cache (the start of the next higher epoch, or the log
end for the latest one) with the largest epoch not above the requested one; ``-1``/``-1`` for
an epoch the cache cannot place. Consumers ask it after a leader change to check that their
position is still on the leader's log (KIP-320): kafka-python 3, for one, stops fetching a
partition for good when the broker does not offer this API. Errors as Fetch:
``NOT_LEADER_OR_FOLLOWER``, ``UNKNOWN_TOPIC_OR_PARTITION``, ``FENCED_LEADER_EPOCH`` /
``UNKNOWN_LEADER_EPOCH`` for a stale / newer ``current_leader_epoch``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import PARTITIONS_PER_SLICE, Deferred, Request, Result
from kcoord.node.kafka.context import BrokerContext
from kcoord.node.replica_manager import (
    KafkaError,
    Partition,
    ReplicaManager,
    check_current_leader_epoch,
)
from kcoord.storage.segment import LogCorruptError

log = logging.getLogger(__name__)

FETCH_KEY: Final = 1
LIST_OFFSETS_KEY: Final = 2
OFFSET_FOR_LEADER_EPOCH_KEY: Final = 23
# KafkaApis.handleFetchRequest sets current_leader (and node_endpoints) from v16 (KIP-951).
LEADER_HINT_MIN_VERSION: Final = 16
EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1
MAX_TIMESTAMP: Final = -3
EARLIEST_LOCAL_TIMESTAMP: Final = -4
LATEST_TIERED_TIMESTAMP: Final = -5
EARLIEST_PENDING_UPLOAD_TIMESTAMP: Final = -6  # KIP-1023
# ReplicaManager.timestampMinSupportedVersion: the ListOffsets version each special
# timestamp needs; any other negative one is unsupported (isListOffsetsTimestampUnsupported).
_TIMESTAMP_MIN_VERSION: Final = {
    EARLIEST_TIMESTAMP: 1,
    LATEST_TIMESTAMP: 1,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL_TIMESTAMP: 8,
    LATEST_TIERED_TIMESTAMP: 9,
    EARLIEST_PENDING_UPLOAD_TIMESTAMP: 11,
}
# ListOffsetsRequest.CONSUMER_REPLICA_ID; OFFSET_NOT_AVAILABLE is answered from v5, as Kafka does.
CONSUMER_REPLICA_ID: Final = -1
FETCH_MAX_BYTES: Final = 55 * 1024 * 1024  # Kafka's fetch.max.bytes default
# ListOffsetsRequest.DEBUGGING_REPLICA_ID: may be answered by a follower (fetchOnlyFromLeader).
DEBUGGING_REPLICA_ID: Final = -2
OFFSET_NOT_AVAILABLE_MIN_VERSION: Final = 5
# FetchMetadata.INITIAL_EPOCH and FINAL_EPOCH: the epochs of a sessionless (full) fetch.
_FULL_FETCH_EPOCHS: Final = (0, -1)

TopicPartition = tuple[str, int]


class FetchWaiters:
    """Wakes deferred fetches when a partition's high watermark or leadership changes."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Event]] = {}
        replicas.add_high_watermark_listener(self._on_change)
        replicas.add_role_listener(self._on_change)

    def _on_change(self, part: Partition, _: object) -> None:
        for event in self._waiters.get(part.tp, ()):
            event.set()

    def watch(self, tps: Iterable[TopicPartition]) -> asyncio.Event:
        event = asyncio.Event()
        for tp in tps:
            self._waiters.setdefault(tp, set()).add(event)
        return event

    def unwatch(self, tps: Iterable[TopicPartition], event: asyncio.Event) -> None:
        for tp in tps:
            events = self._waiters.get(tp)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[tp]


# Fetch v10 (Kafka 2.1, KIP-110) is the first that may carry zstd batches; Produce v7 likewise.
ZSTD_MIN_FETCH_VERSION: Final = 10


@dataclass(slots=True)
class _FetchPartition:
    topic: str | None  # None: an unknown topic id
    topic_id: Any
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int = -1  # v12+ (KIP-320)
    sent_topic: str | None = None  # the request's topic name (v0-v12)
    resolved_topic_id: str | None = None  # v13+: the topic the id named when it came
    # The error of a partition unknown here when the request came: KafkaApis sets it aside
    # before fetchMessages, answered with that error whatever comes meanwhile (its topic
    # created), never read, watched nor counted. One that becomes unknown while the fetch
    # waits (its topic deleted) ends the wait, as DelayedFetch.tryComplete's forceComplete.
    set_aside: Errors | None = None


class FetchApi:
    def __init__(self, ctx: BrokerContext, waiters: FetchWaiters) -> None:
        self.ctx = ctx
        self.waiters = waiters

    # -----------------------------------------------------------------------------------------
    # Fetch.

    async def handle_fetch(self, request: Request) -> Result:
        body, version = request.body, request.version
        session_epoch = getattr(body, "session_epoch", -1)
        if session_epoch not in _FULL_FETCH_EPOCHS:
            return {
                "throttle_time": 0,
                "error_code": Errors.FETCH_SESSION_ID_NOT_FOUND,
                "session_id": 0,
                "responses": [],
            }
        # FetchRequest.fetchData: a LinkedHashMap by partition, so a partition named twice is
        # read and answered once, with its last entry's fields, where it was first named.
        by_partition: dict[tuple[Any, int], _FetchPartition] = {}
        for topic in body.topics:
            topic_id = getattr(topic, "topic_id", None)
            resolved_id = None
            if version >= 13:
                resolved = self.ctx.topic_by_uuid(topic_id)
                name, sent_name = (None if resolved is None else resolved.name), None
                resolved_id = None if resolved is None else resolved.topic_id
            else:
                name = sent_name = topic.topic
            for p in topic.partitions:
                by_partition[(topic_id if version >= 13 else name, p.partition)] = _FetchPartition(
                    name,
                    topic_id,
                    p.partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    # FetchRequest.optionalEpoch: any negative epoch is none.
                    max(getattr(p, "current_leader_epoch", -1), -1),
                    getattr(p, "last_fetched_epoch", -1),
                    sent_name,
                    resolved_id,
                )
        wanted = list(by_partition.values())
        max_wait_ms = max(0, round(body.max_wait.total_seconds() * 1000))
        # KafkaApis caps the client's max_bytes at the broker's fetch.max.bytes: a client
        # asking for more had a whole backlog read and encoded in memory, on the event loop.
        max_bytes = min(int(body.max_bytes), FETCH_MAX_BYTES)
        min_bytes = min(int(body.min_bytes), max_bytes)
        responses, size, failed = await self._read(wanted, max_bytes, version, arriving=True)
        if (
            size >= min_bytes
            or failed
            or max_wait_ms == 0
            or not wanted
            or await self._ready(wanted, min_bytes)
        ):
            return self._response(wanted, responses)
        return Deferred(
            self._long_poll(request, wanted, min_bytes, max_bytes, max_wait_ms), max_bytes
        )

    async def _long_poll(
        self,
        request: Request,
        wanted: list[_FetchPartition],
        min_bytes: int,
        max_bytes: int,
        max_wait_ms: int,
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = [
            (w.topic, w.partition) for w in wanted if w.topic is not None and w.set_aside is None
        ]
        event = self.waiters.watch(tps)
        try:
            # Records or a HW move may have come between the first read and the watch (a
            # produce pipelined behind this fetch): looked at again now that they would wake
            # us, by their positions, as Kafka's DelayedFetch.tryCompleteElseWatch.
            ready = await self._ready(wanted, min_bytes)
            while not ready:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    break
                event.clear()
                # Read again only once the bytes waiting reach min_bytes, by their positions
                # (DelayedFetch.tryComplete), not at every wake.
                ready = await self._ready(wanted, min_bytes)
        finally:
            self.waiters.unwatch(tps, event)
        # DelayedFetch.onComplete: answered with what the read finds, even if a batch too
        # large for its partition's limit makes it less than estimated.
        responses, _, _ = await self._read(wanted, max_bytes, request.version)
        return self._response(wanted, responses)

    def _leader_partition(self, topic: str, w: _FetchPartition) -> Partition:
        """The partition ``w`` names, led here. By topic id (v13+), the topic the id named
        when the request came: a topic deleted and created again under its name while the
        fetch waited is another (``ReplicaManager.readFromLog``'s ``hasConsistentTopicId``:
        INCONSISTENT_TOPIC_ID), whose records a consumer of the first must not be given."""
        if w.resolved_topic_id is not None:
            # Before the leader epoch and leadership, as Kafka's readFromLocalLog checks it.
            hosted = self.ctx.replicas.get_partition(topic, w.partition)
            if hosted is not None and hosted.topic_id != w.resolved_topic_id:
                raise KafkaError(
                    Errors.INCONSISTENT_TOPIC_ID,
                    f"{topic}-{w.partition} is no longer the partition of the topic id fetched",
                )
        return self.ctx.replicas.leader_partition(topic, w.partition, w.current_leader_epoch)

    async def _ready(self, wanted: list[_FetchPartition], min_bytes: int) -> bool:
        """Whether the fetch is to be answered now (``DelayedFetch.tryComplete``): the
        partitions' bytes below their high watermarks, each at most its max bytes, reach
        ``min_bytes``; or a partition is in error or diverges (answered at once); or a
        partition's read found bytes but stopped at the end of a segment older than its high
        watermark's, which no wait adds to (a consumer with fetch.min.bytes above a small
        segment's size, replaying a backlog, waited fetch.max.wait.ms at every segment); or a
        partition known when the request came is not any more (its topic was deleted). Also
        asked before the first wait, as ``DelayedFetch.tryCompleteElseWatch`` does. Yields to
        the loop between slices of partitions, as ``_read`` does."""
        total = 0
        unknown = 0
        for i, w in enumerate(wanted, 1):
            if i % PARTITIONS_PER_SLICE == 0:
                await asyncio.sleep(0)  # the other connections' turn
            if w.topic is None or w.set_aside is not None:
                unknown += 1
                continue
            try:
                part = self._leader_partition(w.topic, w)
                if part.diverging_epoch(w.fetch_offset, w.last_fetched_epoch) is not None:
                    return True
                available = self.ctx.replicas.fetchable_bytes(w.topic, w.partition, w.fetch_offset)
                # Only a read that finds something: from inside a gap compaction left up to
                # the high watermark's segment, the read finds nothing, and answered at once
                # the consumer fetched again in a hot loop. Kafka's DelayedFetch compares the
                # offset the read ended at (LocalLog.read: the log end's when nothing is
                # left), not the one asked for.
                if available > 0 and part.log.on_older_segment(w.fetch_offset, part.high_watermark):
                    return True
            except KafkaError:
                return True  # an error, or unknown since the request came
            total += min(available, w.max_bytes)
        return total >= min_bytes or unknown == len(wanted)

    async def _read(
        self, wanted: list[_FetchPartition], max_bytes: int, version: int, *, arriving: bool = False
    ) -> tuple[list[dict[str, Any]], int, bool]:
        """(partition responses, bytes of records, whether to answer at once for an error).

        A partition this node has no metadata of (UNKNOWN_TOPIC_OR_PARTITION, an unknown
        topic id) does not cut a long poll short, unless no partition is left to wait for:
        ``KafkaApis.handleFetchRequest`` sets those aside before ``fetchMessages``, and only
        errors found reading the others end a ``DelayedFetch`` early. A consumer still holding
        a deleted topic's partition would otherwise fetch in a hot loop. ``arriving``: the
        request's first read, which marks those partitions ``set_aside``. Yields to the loop
        between slices of partitions, as a Produce's handler does."""
        responses = []
        size = 0
        failed = False
        unknown = 0
        for i, w in enumerate(wanted, 1):
            if i % PARTITIONS_PER_SLICE == 0:
                await asyncio.sleep(0)  # the other connections' turn
            if w.set_aside is not None:
                unknown += 1
                responses.append(self._error(w, w.set_aside, version))
                continue
            try:
                if w.topic is None:
                    raise KafkaError(Errors.UNKNOWN_TOPIC_ID)
                part = self._leader_partition(w.topic, w)
                # KafkaApis.maybeConvertFetchedData: a client this old cannot read zstd. Kafka
                # converts once the fetch completes: the read happens, its bytes count toward
                # min_bytes, and a long poll waits as any other (refused before the read, an
                # idle partition answered at once and its client fetched in a hot loop).
                unreadable = (
                    version < ZSTD_MIN_FETCH_VERSION and part.log.config.compression_type == "zstd"
                )
                # Partition.readRecords: OFFSET_OUT_OF_RANGE for an epoch this log cannot place,
                # or a position below the log start: the consumer resets.
                diverging = part.fetch_divergence(w.fetch_offset, w.last_fetched_epoch)
                if diverging is not None:
                    # Partition.fetchRecords (KIP-320): the consumer's last fetched epoch ends
                    # before its position here (an unclean election truncated what it read):
                    # no records, the epoch and end offset to truncate to, answered at once.
                    failed = True
                    responses.append(
                        {
                            "partition_index": w.partition,
                            "error_code": Errors.NONE,
                            "high_watermark": part.high_watermark,
                            "last_stable_offset": part.high_watermark,
                            "log_start_offset": part.log.log_start_offset,
                            "diverging_epoch": diverging,
                            "aborted_transactions": [],
                            "preferred_read_replica": -1,
                            "records": b"",
                        }
                    )
                    if unreadable:
                        responses[-1] = self._error(w, Errors.UNSUPPORTED_COMPRESSION_TYPE, version)
                    continue
                limit = min(w.max_bytes, max_bytes - size)
                first = size == 0
                if limit <= 0 and not first:
                    records = b""
                    result = self.ctx.replicas.fetch(
                        w.topic, w.partition, w.fetch_offset, 0, min_one=False
                    )
                else:
                    result = self.ctx.replicas.fetch(
                        w.topic, w.partition, w.fetch_offset, max(limit, 0), min_one=first
                    )
                    records = result.records
                size += len(records)
                if unreadable:
                    responses.append(self._error(w, Errors.UNSUPPORTED_COMPRESSION_TYPE, version))
                    continue
                responses.append(
                    {
                        "partition_index": w.partition,
                        "error_code": Errors.NONE,
                        "high_watermark": result.high_watermark,
                        "last_stable_offset": result.last_stable_offset,
                        "log_start_offset": result.log_start_offset,
                        "aborted_transactions": [],
                        "preferred_read_replica": -1,
                        "records": records,
                    }
                )
            except KafkaError as e:
                if e.code in _SET_ASIDE:
                    unknown += 1
                    if arriving:
                        w.set_aside = e.code
                else:
                    failed = True
                responses.append(self._error(w, e.code, version))
        return responses, size, failed or (unknown > 0 and unknown == len(wanted))

    def _error(self, w: _FetchPartition, error: Errors, version: int) -> dict[str, Any]:
        if error is Errors.KAFKA_STORAGE_ERROR and version <= 5:
            # KafkaApis.maybeDownConvertStorageError: older clients take 56 for fatal; as
            # NOT_LEADER_OR_FOLLOWER they refresh their metadata and retry.
            error = Errors.NOT_LEADER_OR_FOLLOWER
        response: dict[str, Any] = {
            "partition_index": w.partition,
            "error_code": error,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            "aborted_transactions": [],
            "preferred_read_replica": -1,
            "records": b"",
        }
        if (
            version >= LEADER_HINT_MIN_VERSION
            and w.topic is not None
            and error in (Errors.NOT_LEADER_OR_FOLLOWER, Errors.FENCED_LEADER_EPOCH)
        ):
            response["current_leader"] = self.ctx.leader_hint(w.topic, w.partition)
        return response

    def _response(
        self, wanted: list[_FetchPartition], partitions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        # The partition responses under their topics, in request order (FetchResponse.of: a
        # topic whose partitions were named apart is listed again where it comes next).
        topics: list[dict[str, Any]] = []
        last: tuple[str | None, Any] | None = None
        for w, partition in zip(wanted, partitions, strict=True):
            if (w.sent_topic, w.topic_id) != last:
                last = (w.sent_topic, w.topic_id)
                shown = {"topic": w.sent_topic or "", "topic_id": w.topic_id, "partitions": []}
                topics.append(shown)
            topics[-1]["partitions"].append(partition)
        leaders = [
            p["current_leader"]["leader_id"]
            for p in partitions
            if p.get("current_leader", {}).get("leader_id", -1) >= 0
        ]
        return {
            "throttle_time": 0,
            "error_code": Errors.NONE,
            "session_id": 0,
            "responses": topics,
            "node_endpoints": self.ctx.node_endpoints(leaders) if leaders else [],
        }

    # -----------------------------------------------------------------------------------------
    # ListOffsets.

    async def handle_list_offsets(self, request: Request) -> Result:
        body = request.body
        # KafkaApis.handleListOffsetRequest: a client's request (replica id -1) sees up to the
        # HW; any other (a broker's id, or -2 for debugging) up to the log end, and -2 may be
        # answered by a follower.
        client = body.replica_id == CONSUMER_REPLICA_ID
        leader_only = body.replica_id != DEBUGGING_REPLICA_ID
        # The error a client's request gets from a leader whose HW lags its epoch's start.
        lagging_error: Errors | None = None
        if client:
            lagging_error = (
                Errors.OFFSET_NOT_AVAILABLE
                if request.version >= OFFSET_NOT_AVAILABLE_MIN_VERSION
                else Errors.LEADER_NOT_AVAILABLE
            )
        # ListOffsetsRequest.duplicatePartitions, then ReplicaManager.fetchOffset: its answers
        # are a map by partition, so a partition named twice is answered once, INVALID_REQUEST.
        named = [(topic.name, p.partition_index) for topic in body.topics for p in topic.partitions]
        duplicates = {tp for tp, count in Counter(named).items() if count > 1}
        answers: dict[str, dict[int, dict[str, Any]]] = {}
        done = 0
        for topic in body.topics:
            for p in topic.partitions:
                done += 1
                if done % PARTITIONS_PER_SLICE == 0:
                    await asyncio.sleep(0)  # the other connections' turn, as in a Fetch
                if (topic.name, p.partition_index) in duplicates:
                    answer = _list_offsets_error(p.partition_index, Errors.INVALID_REQUEST)
                elif _is_timestamp_unsupported(p.timestamp, request.version):
                    answer = _list_offsets_error(p.partition_index, Errors.UNSUPPORTED_VERSION)
                else:
                    answer = self._list_offset(
                        topic.name,
                        p.partition_index,
                        p.timestamp,
                        getattr(p, "current_leader_epoch", -1),
                        lagging_error,
                        client=client,
                        leader_only=leader_only,
                    )
                answers.setdefault(topic.name, {})[p.partition_index] = answer
        topics = [{"name": name, "partitions": list(ps.values())} for name, ps in answers.items()]
        return {"throttle_time": 0, "topics": topics}

    def _list_offset(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        current_leader_epoch: int,
        lagging_error: Errors | None,
        *,
        client: bool = True,
        leader_only: bool = True,
    ) -> dict[str, Any]:
        try:
            replicas = self.ctx.replicas
            part = None if leader_only else replicas.get_partition(topic, partition)
            if part is None:
                part = replicas.leader_partition(topic, partition, current_leader_epoch)
            else:
                check_current_leader_epoch(part, current_leader_epoch)
            found = _offset_for(part, timestamp, lagging_error, client=client)
        except KafkaError as e:
            return _list_offsets_error(partition, e.code)
        except (LogCorruptError, OSError) as e:
            log.error("ListOffsets on %s-%d failed: %s", topic, partition, e)
            if isinstance(e, OSError):
                # As a Fetch's read (``ReplicaManager._reading``; Kafka's
                # fetchOffsetByTimestamp is under maybeHandleIOException): the disk's error
                # fails the log directory, where the node went on leading the partition.
                self.ctx.replicas.log_dir_failure.fail(f"reading {topic}-{partition}", e)
            return _list_offsets_error(partition, Errors.KAFKA_STORAGE_ERROR)
        found_timestamp, offset = found
        epoch = -1
        if timestamp == LATEST_TIMESTAMP and offset >= 0:
            epoch = part.leader_epoch  # Partition.fetchOffsetForTimestamp: the leader's epoch
        elif offset >= 0:
            epoch = _epoch_for_offset(part, offset)
        return {
            "partition_index": partition,
            "error_code": Errors.NONE,
            "timestamp": found_timestamp,
            "offset": offset,
            "leader_epoch": epoch,
        }

    # -----------------------------------------------------------------------------------------
    # OffsetForLeaderEpoch.

    async def handle_offset_for_leader_epoch(self, request: Request) -> Result:
        topics: list[dict[str, Any]] = []
        done = 0
        for topic in request.body.topics:
            partitions: list[dict[str, Any]] = []
            topics.append({"topic": topic.topic, "partitions": partitions})
            for p in topic.partitions:
                current_leader_epoch = getattr(p, "current_leader_epoch", -1)
                partitions.append(
                    self._epoch_end_offset(
                        topic.topic, p.partition, current_leader_epoch, p.leader_epoch
                    )
                )
                done += 1
                if done % PARTITIONS_PER_SLICE == 0:
                    await asyncio.sleep(0)  # the other connections' turn, as in a Fetch
        return {"throttle_time": 0, "topics": topics}

    def _epoch_end_offset(
        self, topic: str, partition: int, current_leader_epoch: int, leader_epoch: int
    ) -> dict[str, Any]:
        try:
            # Consumers and followers alike ask the leader (fetchOnlyFromLeader).
            part = self.ctx.replicas.leader_partition(topic, partition, current_leader_epoch)
        except KafkaError as e:
            return {"error_code": e.code, "partition": partition}
        epoch, end_offset = part.log.epoch_cache.end_offset_for(
            leader_epoch, part.log.log_end_offset
        )
        return {
            "error_code": Errors.NONE,
            "partition": partition,
            "leader_epoch": epoch,
            "end_offset": end_offset,
        }


def _is_timestamp_unsupported(timestamp: int, version: int) -> bool:
    """``ReplicaManager.isListOffsetsTimestampUnsupported``: a negative timestamp must be one
    of the special ones, and one the request's version knows."""
    return timestamp < 0 and (
        timestamp not in _TIMESTAMP_MIN_VERSION or version < _TIMESTAMP_MIN_VERSION[timestamp]
    )


def _list_offsets_error(partition: int, code: Errors) -> dict[str, Any]:
    """ListOffsets' answer for a partition in error (KafkaApis' ``buildErrorResponse``)."""
    return {"partition_index": partition, "error_code": code, "timestamp": -1, "offset": -1}


def _offset_for(
    part: Partition, timestamp: int, lagging_error: Errors | None = None, *, client: bool = True
) -> tuple[int, int]:
    """(timestamp, offset) answered for one ListOffsets partition; (-1, -1) if none.

    A ``client``'s answers stop at the HW, any other's at the log end (Kafka's
    ``Partition.fetchOffsetForTimestamp``: its ``lastFetchableOffset`` with no isolation
    level). ``lagging_error`` is raised, while this leader's HW is below the start of its
    epoch, for "latest" and for a lookup whose answer is at or past the HW: the records
    between may be committed already."""
    log_ = part.log
    last_fetchable = part.high_watermark if client else log_.log_end_offset
    lagging = (
        lagging_error is not None
        and part.replication is not None
        and part.replication.leader_epoch_start_offset > last_fetchable
    )

    def beyond_last_fetchable() -> tuple[int, int]:
        if lagging:
            assert lagging_error is not None
            raise KafkaError(
                lagging_error,
                f"{part.topic}-{part.partition}: the high watermark ({last_fetchable}) is "
                f"below the start of leader epoch {part.leader_epoch}",
            )
        return -1, -1

    if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
        return -1, log_.log_start_offset
    if timestamp == LATEST_TIMESTAMP:
        return beyond_last_fetchable() if lagging else (-1, last_fetchable)
    if timestamp in (LATEST_TIERED_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP):
        return -1, -1  # UnifiedLog.fetchOffsetByTimestamp without remote storage
    if timestamp == MAX_TIMESTAMP:
        # UnifiedLog.fetchOffsetByTimestamp: the first segment holding the largest timestamp,
        # and in it the first record with it (RecordBatch.offsetOfMaxTimestamp, KAFKA-16310),
        # not the last offset of its batch: a consumer seeking there would skip the others.
        # Only records at or after the log start count: once DeleteRecords moved it past the
        # newest record, Kafka answers that record's offset (which a consumer cannot fetch)
        # and kcoord answered none, with records left. By the records' own timestamps: a
        # batch emptied or rebuilt by the cleaner keeps a max timestamp none of its records
        # has (Kafka answers no offset when the newest batch is such a one).
        at = log_.newest_record()
        # No record found answers as one past the HW does (ReplicaManager.fetchOffset's
        # "empty offset response scenario" raises the lagging error too).
        if at is None or at[0] >= last_fetchable:
            return beyond_last_fetchable()
        return at[1], at[0]
    assert timestamp >= 0, f"unsupported special timestamp {timestamp}"  # refused before
    found = log_.offset_for_timestamp(timestamp)
    if found is None:
        return beyond_last_fetchable()
    offset, found_timestamp = found
    if offset >= last_fetchable:
        return beyond_last_fetchable()
    return found_timestamp, offset


# Errors KafkaApis finds before the read (set aside from the fetch, not ending its wait).
_SET_ASIDE: Final = frozenset({Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.UNKNOWN_TOPIC_ID})


def _epoch_for_offset(part: Partition, offset: int) -> int:
    """``LeaderEpochFileCache.epochForOffset``: -1 for an offset below the first entry."""
    epoch = -1
    for entry_epoch, start_offset in part.log.epoch_cache.entries:
        if start_offset <= offset:
            epoch = entry_epoch
    return epoch
