"""Idempotent-producer state of one partition (Kafka's ``ProducerStateManager``). Pure.

Theory of operation
-------------------
An idempotent producer (KIP-98) stamps every batch with its producer id, producer epoch and the
sequence number of its first record; sequences count records per (producer, partition) from 0
and wrap at ``Integer.MAX_VALUE``. The partition leader keeps, per producer id, the epoch and the
metadata of the last ``NUM_BATCHES_TO_RETAIN`` (5) batches it appended, which is what a producer
with up to 5 requests in flight may retry. Before an append, ``validate`` classifies the batches
of one produce request against that state, exactly as ``UnifiedLog.analyzeAndValidateProducer
State`` and ``ProducerAppendInfo`` do:

- ``Duplicate``: a batch with the same epoch and the same first and last sequence as a retained
  one is a retry of a batch already in the log; the request is answered with the original
  offsets and nothing is appended (``ProducerStateEntry.findDuplicateBatch``).
- ``Rejected(INVALID_PRODUCER_EPOCH)``: the epoch is below the last one seen
  (``checkProducerEpoch``; since Kafka 2.7 this is not ``PRODUCER_FENCED`` for produce).
- ``Rejected(OUT_OF_ORDER_SEQUENCE_NUMBER)``: in the current epoch the first sequence does not
  follow the last one; in a new epoch it is not 0 (``checkSequence``). A producer id without
  state (new, or expired) may start at any sequence (KIP-360).
- ``ACCEPTED`` otherwise. Batches of one request are validated in order, each against the state
  as the earlier ones would leave it; duplicates are looked up in the stored state only.

After the append, ``update`` records the batches with their final offsets; it also takes in
batch headers read from a log (oldest first), which is how a node builds the state of a
partition it starts to host and keeps a follower's up to date (node/kafka/produce.py): Kafka
rebuilds from its ``.snapshot`` files plus the log tail, kcoord from the log (batch headers are
61 bytes each, so this is a cheap scan) and, for the producers whose batches have all left the
log, the latest snapshot (storage/producer_snapshot.py). Batches without a producer id and control
batches carry no sequence state and are skipped. ``remove_expired_producers`` forgets producers
whose last batch is older than ``producer.id.expiration.ms`` (Kafka's default: 1 day).

Pure: headers in, decisions out; no I/O, no clock (``now_ms`` is an argument).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from kcoord.errors import Errors
from kcoord.storage.format import NO_PRODUCER_EPOCH, BatchHeader

NUM_BATCHES_TO_RETAIN: Final = 5  # ProducerStateEntry.NUM_BATCHES_TO_RETAIN
DEFAULT_PRODUCER_ID_EXPIRATION_MS: Final = 24 * 60 * 60 * 1000  # producer.id.expiration.ms
_INT32_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One appended batch of a producer: its sequence range and where it landed."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass(slots=True)
class ProducerStateEntry:
    """What the partition remembers of one producer id. Invariant: ``batches`` all belong to
    ``producer_epoch``, oldest first, and hold at most ``NUM_BATCHES_TO_RETAIN`` entries."""

    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )
    last_timestamp_ms: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == header.base_sequence and batch.last_seq == header.last_sequence:
                return batch
        return None


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The request retries a batch already appended at these offsets."""

    first_offset: int
    last_offset: int
    # The appended batch's max timestamp, answered as the retry's log append time (Kafka's
    # UnifiedLog does so for every duplicate).
    timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class Rejected:
    error: Errors
    message: str


class _Accepted:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ACCEPTED"


ACCEPTED: Final = _Accepted()
Validation = _Accepted | Duplicate | Rejected


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """``ProducerAppendInfo.inSequence``: ``next_seq`` follows ``last_seq``, wrapping at 2^31-1."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == _INT32_MAX)


def _carries_state(header: BatchHeader) -> bool:
    return header.has_producer_id and not header.is_control


class ProducerStateManager:
    """The producer state of one partition; see the module docstring."""

    __slots__ = ("producer_id_expiration_ms", "producers")

    def __init__(
        self, *, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    ) -> None:
        assert producer_id_expiration_ms > 0, producer_id_expiration_ms
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producers: dict[int, ProducerStateEntry] = {}

    def validate(self, headers: Sequence[BatchHeader]) -> Validation:
        """Classify the batches of one append (offsets not assigned yet); changes nothing."""
        # producer id -> (epoch, last sequence) as the earlier batches of this request leave it.
        pending: dict[int, tuple[int, int]] = {}
        for header in headers:
            if not _carries_state(header):
                continue
            pid = header.producer_id
            entry = self.producers.get(pid)
            if entry is not None:
                duplicate = entry.find_duplicate(header)
                if duplicate is not None:
                    return Duplicate(
                        duplicate.first_offset, duplicate.last_offset, duplicate.timestamp_ms
                    )
            if pid in pending:
                current_epoch, last_seq = pending[pid]
            elif entry is not None:
                current_epoch, last_seq = entry.producer_epoch, entry.last_seq
            else:
                current_epoch, last_seq = NO_PRODUCER_EPOCH, -1
            epoch, first_seq = header.producer_epoch, header.base_sequence
            if epoch < current_epoch:
                return Rejected(
                    Errors.INVALID_PRODUCER_EPOCH,
                    f"epoch {epoch} of producer {pid} is below the last seen epoch {current_epoch}",
                )
            if epoch != current_epoch:
                # A new epoch starts its sequences at 0, unless nothing is known of it.
                if first_seq != 0 and current_epoch != NO_PRODUCER_EPOCH:
                    return Rejected(
                        Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                        f"new epoch {epoch} of producer {pid} starts at sequence {first_seq}, "
                        "not 0",
                    )
            elif current_epoch != NO_PRODUCER_EPOCH and not in_sequence(last_seq, first_seq):
                # ProducerAppendInfo.checkSequence takes any sequence of a producer with no
                # epoch (nothing of it kept, or a producer id sent without one).
                return Rejected(
                    Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {pid} epoch {epoch}: sequence {first_seq} does not follow "
                    f"{last_seq}",
                )
            pending[pid] = (epoch, header.last_sequence)
        return ACCEPTED

    def update(self, headers: Iterable[BatchHeader]) -> None:
        """Record appended batches; ``headers`` carry their final offsets, oldest first."""
        for header in headers:
            if not _carries_state(header):
                continue
            entry = self.producers.get(header.producer_id)
            if entry is None or header.producer_epoch > entry.producer_epoch:
                entry = ProducerStateEntry(header.producer_id, header.producer_epoch)
                self.producers[header.producer_id] = entry
            elif header.producer_epoch < entry.producer_epoch:
                continue  # a fenced producer's batch; validate() never lets one through
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.last_offset,
                    header.max_timestamp,
                )
            )
            # The last batch's, not the largest seen (Kafka's ProducerStateEntry.addBatch): the
            # cleaner judges a producer active by its last batch alone, so with the largest a
            # producer whose last batch is stamped in the past (event time) was kept here and
            # its last batch dropped there, and a state rebuilt from the cleaned log then
            # refused its next sequence.
            entry.last_timestamp_ms = header.max_timestamp
            assert len(entry.batches) <= NUM_BATCHES_TO_RETAIN

    def keep_batches_below(self, other: ProducerStateManager, offset: int) -> None:
        """Take ``other``'s batches that end below ``offset``, for producers this state does
        not know yet: a state read again from a log whose segments below ``offset`` are gone
        (retention, DeleteRecords) would forget them, and a retry of such a producer's last
        batch was appended twice. Kafka's ``truncateAndReload`` starts from a producer
        snapshot taken at a roll, which still has them."""
        for producer_id, entry in other.producers.items():
            kept = [b for b in entry.batches if b.last_offset < offset]
            if not kept or producer_id in self.producers:
                continue
            self.producers[producer_id] = ProducerStateEntry(
                producer_id,
                entry.producer_epoch,
                deque(kept, maxlen=NUM_BATCHES_TO_RETAIN),
                kept[-1].timestamp_ms,
            )

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Forget producers idle for the expiration or longer (``isProducerExpired``); return
        their ids."""
        expired = [
            pid
            for pid, entry in self.producers.items()
            if now_ms - entry.last_timestamp_ms >= self.producer_id_expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]
        return expired
