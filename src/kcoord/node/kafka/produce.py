"""Produce (apiKey 0) and InitProducerId (apiKey 22): appends, acks and idempotence.

Produce (Kafka's ``KafkaApis.handleProduceRequest`` and ``ReplicaManager.appendRecords``):

1. In request order, for each partition: the node must lead it (``NOT_LEADER_OR_FOLLOWER``
   with the leader's id and epoch as a hint, KIP-951; ``UNKNOWN_TOPIC_OR_PARTITION`` for a
   topic or partition that does not exist); clients may not write to ``__consumer_offsets``
   (``INVALID_TOPIC_EXCEPTION``), nor control batches (``INVALID_RECORD``) or transactional
   ones (``INVALID_TXN_STATE``: kcoord has no transaction coordinator); a partition's records
   are exactly one batch of magic 2 (``INVALID_RECORD``, Kafka's ``validateRecords``). With
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

Producer state lives per led partition and is rebuilt from the batch headers of the log the
first time a produce reaches the partition after this node became its leader, a slice at a
time between which the loop serves other clients (``ProducerStates``); the produce waits for it
before step 1's synchronous part, so the no-await rule above still holds.

DescribeProducers (apiKey 61, KIP-664; ``ReplicaManager.activeProducerState``): the producers
a led partition's state holds, each with its epoch, last sequence and last timestamp (no
coordinator epoch and no open transaction: -1), after the state has loaded as for a produce.
Errors: ``UNKNOWN_TOPIC_OR_PARTITION``, and ``NOT_LEADER_OR_FOLLOWER`` from a follower (a Kafka
follower answers with the state it keeps as it replicates; kcoord keeps it on the leader only,
and the admin clients ask the leader). ``__consumer_offsets`` has no idempotent producers: it
answers none.

InitProducerId: an idempotent producer (no transactional id) gets a fresh producer id with
epoch 0, always, as Kafka does (``TransactionCoordinator.handleInitProducerId``); ids come from
``ProducerIdManager``. A transactional id answers ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, as
FindCoordinator does for it: kcoord has no transaction coordinator.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from kcoord.errors import Errors
from kcoord.node.kafka.apis import (
    CLOSE_CONNECTION,
    NO_RESPONSE,
    Deferred,
    Request,
    Result,
    wait_or_cancel,
)
from kcoord.node.kafka.context import BrokerContext, is_internal
from kcoord.node.kafka.producer_ids import ProducerIdManager, ProducerIdsExhaustedError
from kcoord.node.replica_manager import KafkaError, Partition, ReplicaManager
from kcoord.storage import format as fmt
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


# Batch headers parsed between two yields to the event loop while a producer state loads:
# 3 ms of work alone on this machine, about 10 ms with three nodes and their clients on its two
# cores, so other clients of the node wait no longer than that.
LOAD_SLICE_HEADERS: Final = 1000
# A load restarts when a segment it was reading was let go meanwhile (retention, cleaner).
_LOAD_ATTEMPTS: Final = 3
# producer.id.expiration.check.interval.ms: how often a leader forgets idle producers.
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS: Final = 10 * 60 * 1000


class ProducerStates:
    """The ``ProducerStateManager`` of every partition this node leads.

    A state is rebuilt from the log's batch headers the first time a produce reaches the
    partition in a leadership (``ready``). A long log has millions of them: parsed in one go
    that stalled every client of the node (300,000 one-record batches took 1.05 s, during which
    an ApiVersions waited as long), so the scan yields to the loop every
    ``LOAD_SLICE_HEADERS`` headers. Produces to that partition wait for it; Kafka avoids most of
    the scan with producer snapshots and state kept on followers.
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._states: dict[tuple[str, int], tuple[Partition, ProducerStateManager]] = {}
        # When each partition's idle producers are next forgotten (Kafka's UnifiedLog runs
        # removeExpiredProducers on a timer; here the first produce after the interval does).
        self._next_expiry_ms: dict[tuple[str, int], int] = {}
        self._loading: dict[tuple[str, int], tuple[Partition, int, asyncio.Task[None]]] = {}
        replicas.add_role_listener(self.on_role_change)

    def on_role_change(self, part: Partition, is_leader: bool) -> None:
        # Rebuilt for each leadership: another leader may have appended meanwhile.
        self._states.pop(part.tp, None)
        self._next_expiry_ms.pop(part.tp, None)

    def loaded(self, part: Partition) -> bool:
        entry = self._states.get(part.tp)
        return entry is not None and entry[0] is part

    async def ready(self, part: Partition, now_ms: int) -> None:
        """Load ``part``'s state for this leadership unless it is loaded, without blocking the
        loop for long; every produce that reaches it meanwhile waits for the same load."""
        if self.loaded(part):
            return
        loading = self._loading.get(part.tp)
        # A partition keeps its object across leaderships: a load begun in an earlier one (the
        # node was follower in between, and its log changed) is not this leadership's.
        if loading is None or loading[0] is not part or loading[1] != part.leader_epoch:
            task = asyncio.ensure_future(self._load(part, part.leader_epoch, now_ms))
            loading = (part, part.leader_epoch, task)
            self._loading[part.tp] = loading
            task.add_done_callback(functools.partial(self._loaded, part.tp, loading))
        await asyncio.shield(loading[2])

    def _loaded(
        self,
        tp: tuple[str, int],
        loading: tuple[Partition, int, asyncio.Task[None]],
        _task: asyncio.Task[None],
    ) -> None:
        if self._loading.get(tp) is loading:
            del self._loading[tp]

    async def _load(self, part: Partition, leader_epoch: int, now_ms: int) -> None:
        for _ in range(_LOAD_ATTEMPTS):
            state = ProducerStateManager(producer_id_expiration_ms=self.producer_id_expiration_ms)
            slice_: list[fmt.BatchHeader] = []
            try:
                for header in self._producer_batches(part, now_ms):
                    slice_.append(header)
                    if len(slice_) >= LOAD_SLICE_HEADERS:
                        state.update(slice_)
                        slice_ = []
                        await asyncio.sleep(0)  # let the node's other clients in
            except OSError:
                continue  # a segment was let go while we read it: its batches are gone
            state.update(slice_)
            if part.is_leader and part.leader_epoch == leader_epoch:
                self._store(part, state, now_ms)
            return
        if part.is_leader and part.leader_epoch == leader_epoch:
            self.get(part, now_ms)  # the log kept changing: one pass without yielding

    def get(self, part: Partition, now_ms: int) -> ProducerStateManager:
        entry = self._states.get(part.tp)
        if entry is not None and entry[0] is part:
            if now_ms >= self._next_expiry_ms.get(part.tp, 0):
                entry[1].remove_expired_producers(now_ms)
                self._next_expiry_ms[part.tp] = now_ms + PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS
            return entry[1]
        state = ProducerStateManager(producer_id_expiration_ms=self.producer_id_expiration_ms)
        state.load(self._producer_batches(part, now_ms))
        return self._store(part, state, now_ms)

    def _store(
        self, part: Partition, state: ProducerStateManager, now_ms: int
    ) -> ProducerStateManager:
        state.remove_expired_producers(now_ms)
        self._states[part.tp] = (part, state)
        self._next_expiry_ms[part.tp] = now_ms + PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS
        log.info(
            "%s-%d: producer state of %d producers loaded",
            part.topic,
            part.partition,
            len(state.producers),
        )
        return state

    def _producer_batches(self, part: Partition, now_ms: int) -> Iterator[fmt.BatchHeader]:
        horizon_ms = now_ms - self.producer_id_expiration_ms
        leading = True
        for seg in list(part.log.segments):
            if leading and 0 <= seg.max_timestamp < horizon_ms:
                # Every producer whose last batch is here has expired. Only a leading run is
                # skipped: a producer may have written later batches with old timestamps
                # (event time) after recent ones, and its state must come from its last ones.
                continue
            leading = False
            try:
                for bp in seg.scan_headers():
                    if bp.header.producer_id != fmt.NO_PRODUCER_ID:
                        yield bp.header
            except LogCorruptError as e:
                log.error("%s-%d: producer state scan stopped: %s", part.topic, part.partition, e)
                return


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
    committed: asyncio.Future[None] | None = None
    # NOT_ENOUGH_REPLICAS_AFTER_APPEND, decided when ``committed`` completed.
    after_append: KafkaError | None = None
    leader_hint: dict[str, int] = field(default_factory=dict)


class ProduceApi:
    def __init__(
        self, ctx: BrokerContext, producer_ids: ProducerIdManager, states: ProducerStates
    ) -> None:
        self.ctx = ctx
        self.producer_ids = producer_ids
        self.states = states

    # -----------------------------------------------------------------------------------------
    # Produce.

    async def handle_produce(self, request: Request) -> Result:
        body = request.body
        acks = int(body.acks)
        timeout_ms = max(0, round(body.timeout.total_seconds() * 1000))
        topics: list[tuple[Any, str | None, list[_PartitionResult]]] = []
        for topic_data in body.topic_data:
            name = getattr(topic_data, "name", None)
            topic_id = getattr(topic_data, "topic_id", None)
            if request.version >= 13:
                resolved = self.ctx.topic_by_uuid(topic_id)
                name = None if resolved is None else resolved.name
            results = []
            for data in topic_data.partition_data:
                if name is not None and acks in (-1, 0, 1):
                    await self._producer_state_ready(name, data.index)
                if acks not in (-1, 0, 1):
                    result = _PartitionResult(data.index, Errors.INVALID_REQUIRED_ACKS)
                elif name is None:
                    result = _PartitionResult(data.index, Errors.UNKNOWN_TOPIC_ID)
                else:
                    result = self._append(name, data.index, data.records, acks)
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
            await self.states.ready(part, self.ctx.now_ms())

    def _append(self, topic: str, index: int, records: bytes | None, acks: int) -> _PartitionResult:
        result = _PartitionResult(index)
        try:
            if is_internal(topic):
                raise KafkaError(
                    Errors.INVALID_TOPIC_EXCEPTION, f"clients may not write to {topic}"
                )
            part = self.ctx.replicas.leader_partition(topic, index)
            data = records or b""
            if len(data) > _MAGIC_OFFSET and data[_MAGIC_OFFSET] != fmt.MAGIC_V2:
                raise KafkaError(
                    Errors.INVALID_RECORD, "Produce v3+ only carries record batches of magic 2"
                )
            try:
                headers = [h for _, h in fmt.iter_headers(data)]
            except fmt.RecordFormatError as e:
                raise KafkaError(Errors.CORRUPT_MESSAGE, str(e)) from e
            if len(headers) != 1:
                # ProduceRequest.validateRecords: exactly one batch per partition.
                raise KafkaError(
                    Errors.INVALID_RECORD,
                    "Produce requests are only allowed to contain exactly one record batch per "
                    f"partition, not {len(headers)}",
                )
            for h in headers:
                if h.is_control:
                    raise KafkaError(Errors.INVALID_RECORD, "clients may not write control records")
                if h.producer_id != fmt.NO_PRODUCER_ID and h.base_sequence < 0:
                    # LogValidator.validateBatch: an idempotent batch needs a sequence.
                    raise KafkaError(
                        Errors.INVALID_RECORD,
                        f"Invalid sequence number {h.base_sequence} in record batch with "
                        f"producerId {h.producer_id}",
                    )
                if h.is_transactional:
                    raise KafkaError(
                        Errors.INVALID_TXN_STATE, "kcoord does not support transactions"
                    )
            # Leadership and min.insync.replicas first, as Kafka: were a batch queued behind a
            # refused one answered OUT_OF_ORDER_SEQUENCE_NUMBER instead, librdkafka would bump
            # its epoch and resend, under new sequences, batches of other partitions that
            # failed after they were appended (duplicates; librdkafka issue #4953).
            self.ctx.replicas.check_leader_and_min_isr(part, acks)
            state = self.states.get(part, self.ctx.now_ms())
            verdict = state.validate(headers)
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
                appended = self.ctx.replicas.append_local(part, data, required_acks=acks)
                result.base_offset = appended.base_offset
                result.log_append_time = appended.log_append_time_ms
                last_offset = appended.last_offset
                state.update(
                    _stamped(
                        headers,
                        appended.base_offset,
                        part.leader_epoch,
                        appended.log_append_time_ms,
                    )
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

    def _check_after_append(
        self, result: _PartitionResult, committed: asyncio.Future[None]
    ) -> None:
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
        for topic in request.body.topics:
            name = str(topic.name)
            partitions = [
                await self._active_producers(name, int(index)) for index in topic.partition_indexes
            ]
            topics.append({"name": name, "partitions": partitions})
        return {"throttle_time": 0, "topics": topics}

    async def _active_producers(self, topic: str, index: int) -> dict[str, Any]:
        try:
            part = self.ctx.replicas.leader_partition(topic, index)
        except KafkaError as e:
            return {
                "partition_index": index,
                "error_code": e.code,
                "error_message": e.message or None,
                "active_producers": [],
            }
        producers: list[dict[str, Any]] = []
        if not is_internal(topic):
            await self.states.ready(part, self.ctx.now_ms())
            if part.is_leader:  # not deposed while the state loaded
                state = self.states.get(part, self.ctx.now_ms())
                producers = [
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
        if not part.is_leader:
            return {
                "partition_index": index,
                "error_code": Errors.NOT_LEADER_OR_FOLLOWER,
                "error_message": None,
                "active_producers": [],
            }
        return {
            "partition_index": index,
            "error_code": Errors.NONE,
            "error_message": None,
            "active_producers": producers,
        }

    # -----------------------------------------------------------------------------------------
    # InitProducerId.

    async def handle_init_producer_id(self, request: Request) -> Result:
        if request.body.transactional_id is not None:
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
    headers: list[fmt.BatchHeader], base_offset: int, leader_epoch: int, log_append_time: int
) -> list[fmt.BatchHeader]:
    """The headers as the log stored them: offsets from ``base_offset``, the leader's epoch,
    and on a LogAppendTime topic (``log_append_time`` not -1) the leader's stamp."""
    stamped = []
    next_offset = base_offset
    for sent in headers:
        h = sent._replace(base_offset=next_offset, partition_leader_epoch=leader_epoch)
        if log_append_time != fmt.NO_TIMESTAMP:
            h = h._replace(max_timestamp=log_append_time)
        stamped.append(h)
        next_offset += h.last_offset_delta + 1
    return stamped
