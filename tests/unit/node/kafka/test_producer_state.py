"""Idempotent-producer state (storage/producer_state.py): what a retrying producer sees.

A model producer sends batches as a real one does (in sequence, retries of recent batches,
epoch bumps) and also misbehaves (gaps, stale epochs, ancient retries); every verdict is
checked against the rule a user relies on, and a state rebuilt from the appended headers
(a new leader) must give the same verdicts as the live one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kcoord.errors import Errors
from kcoord.storage import format as fmt
from kcoord.storage.producer_state import (
    ACCEPTED,
    NUM_BATCHES_TO_RETAIN,
    Duplicate,
    ProducerStateManager,
    Rejected,
    Validation,
    in_sequence,
)

INT32_MAX = 2**31 - 1


def header(
    pid: int, epoch: int, first_seq: int, count: int, *, base_offset: int = 0, ts: int = 1000
) -> fmt.BatchHeader:
    return fmt.BatchHeader(
        base_offset=base_offset,
        batch_length=fmt.HEADER_SIZE - fmt.LOG_OVERHEAD,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=0,
        last_offset_delta=count - 1,
        base_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=first_seq,
        record_count=count,
    )


@dataclass
class Partition:
    """A log of headers and its producer state, appended to as a leader would."""

    state: ProducerStateManager = field(default_factory=ProducerStateManager)
    log: list[fmt.BatchHeader] = field(default_factory=list)
    log_end_offset: int = 0

    def produce(self, *batches: fmt.BatchHeader) -> Validation:
        verdict = self.state.validate(batches)
        rebuilt = ProducerStateManager()
        rebuilt.update(self.log)
        assert rebuilt.validate(batches) == verdict, "a rebuilt state must agree"
        if verdict is ACCEPTED:
            stamped = []
            for b in batches:
                stamped.append(b._replace(base_offset=self.log_end_offset))
                self.log_end_offset += b.last_offset_delta + 1
            self.state.update(stamped)
            self.log.extend(stamped)
        return verdict


def test_in_sequence_wraps_at_int32_max() -> None:
    assert in_sequence(-1, 0) and in_sequence(4, 5) and in_sequence(INT32_MAX, 0)
    assert not in_sequence(4, 4) and not in_sequence(4, 6) and not in_sequence(INT32_MAX, 1)


def test_a_retry_of_a_recent_batch_gets_the_original_offsets() -> None:
    p = Partition()
    assert p.produce(header(7, 0, 0, 3)) is ACCEPTED
    assert p.produce(header(7, 0, 3, 2)) is ACCEPTED
    assert p.produce(header(7, 0, 0, 3)) == Duplicate(0, 2, 1000)
    assert p.produce(header(7, 0, 3, 2)) == Duplicate(3, 4, 1000)
    assert p.log_end_offset == 5


def test_gaps_stale_epochs_and_new_epochs() -> None:
    p = Partition()
    assert p.produce(header(7, 2, 0, 1)) is ACCEPTED
    gap = p.produce(header(7, 2, 2, 1))
    assert isinstance(gap, Rejected) and gap.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    stale = p.produce(header(7, 1, 1, 1))
    assert isinstance(stale, Rejected) and stale.error is Errors.INVALID_PRODUCER_EPOCH
    not_zero = p.produce(header(7, 3, 5, 1))
    assert isinstance(not_zero, Rejected)
    assert not_zero.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert p.produce(header(7, 3, 0, 1)) is ACCEPTED
    # The old epoch's batches are no longer duplicates: the epoch is stale.
    old = p.produce(header(7, 2, 0, 1))
    assert isinstance(old, Rejected) and old.error is Errors.INVALID_PRODUCER_EPOCH


def test_an_unknown_producer_may_start_anywhere() -> None:
    # KIP-360: its state may have expired (retention, producer.id.expiration.ms).
    p = Partition()
    assert p.produce(header(9, 4, 1234, 2)) is ACCEPTED
    assert p.produce(header(9, 4, 1236, 1)) is ACCEPTED


def test_a_producer_without_an_epoch_takes_any_sequence() -> None:
    """A producer id sent with epoch -1 (NO_PRODUCER_EPOCH): ``checkSequence`` accepts any
    sequence while the producer's kept epoch is none; it was OUT_OF_ORDER_SEQUENCE_NUMBER
    unless the first sequence was 0 and each followed the last."""
    p = Partition()
    assert p.produce(header(5, -1, 3, 1)) is ACCEPTED
    assert p.produce(header(5, -1, 7, 1)) is ACCEPTED
    assert p.produce(header(5, 0, 0, 1)) is ACCEPTED  # an epoch, then sequences count
    gap = p.produce(header(5, 0, 5, 1))
    assert isinstance(gap, Rejected) and gap.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_batches_of_one_request_are_checked_in_order() -> None:
    p = Partition()
    assert p.produce(header(1, 0, 0, 2), header(1, 0, 2, 2), header(2, 0, 0, 1)) is ACCEPTED
    bad = p.produce(header(1, 0, 4, 1), header(1, 0, 6, 1))
    assert isinstance(bad, Rejected) and bad.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert p.log_end_offset == 5


def test_batches_without_producer_id_and_control_batches_are_ignored() -> None:
    p = Partition()
    plain = header(fmt.NO_PRODUCER_ID, -1, -1, 3)
    assert p.produce(plain) is ACCEPTED
    assert p.produce(plain) is ACCEPTED
    control = header(5, 0, -1, 1)._replace(attributes=fmt.CONTROL_FLAG)
    assert p.produce(control) is ACCEPTED
    assert p.state.producers == {}


def test_expired_producers_are_forgotten() -> None:
    state = ProducerStateManager(producer_id_expiration_ms=1000)
    state.update([header(1, 0, 0, 1, ts=5000), header(2, 0, 0, 1, ts=9000)])
    assert state.remove_expired_producers(now_ms=5999) == []
    # isProducerExpired: idle for the expiration or longer.
    assert state.remove_expired_producers(now_ms=6000) == [1]
    assert set(state.producers) == {2}


# ------------------------------------------------------------------ the model producer

Op = tuple[str, int, int]  # (kind, producer index, argument)

ops = st.lists(
    st.tuples(
        st.sampled_from(["next", "next", "next", "retry", "gap", "bump", "bump_bad", "stale"]),
        st.integers(0, 1),
        st.integers(1, 7),
    ),
    min_size=1,
    max_size=60,
)


@dataclass
class Producer:
    pid: int
    epoch: int
    next_seq: int
    # (epoch, first seq, count, first offset, last offset) of every accepted batch.
    sent: list[tuple[int, int, int, int, int]] = field(default_factory=list)


@settings(max_examples=300, deadline=None)
@given(ops=ops, start_seq=st.sampled_from([0, INT32_MAX - 10]))
def test_model_producers(ops: list[Op], start_seq: int) -> None:
    p = Partition()
    producers = [Producer(100, 0, start_seq), Producer(200, 5, 0)]
    for kind, index, arg in ops:
        prod = producers[index]

        def send(epoch: int, first_seq: int, count: int, pid: int = prod.pid) -> Validation:
            return p.produce(header(pid, epoch, first_seq, count))

        if kind == "next":
            before = p.log_end_offset
            assert send(prod.epoch, prod.next_seq, arg) is ACCEPTED
            prod.sent.append((prod.epoch, prod.next_seq, arg, before, before + arg - 1))
            prod.next_seq = (prod.next_seq + arg) % (INT32_MAX + 1)
        elif kind == "retry" and prod.sent:
            epoch, first_seq, count, first, last = prod.sent[-min(arg, len(prod.sent))]
            current = [s for s in prod.sent if s[0] == prod.epoch]
            verdict = send(epoch, first_seq, count)
            recent = current[-NUM_BATCHES_TO_RETAIN:]
            if epoch < prod.epoch:
                assert isinstance(verdict, Rejected)
                assert verdict.error is Errors.INVALID_PRODUCER_EPOCH
            elif (epoch, first_seq, count, first, last) in recent:
                assert verdict == Duplicate(first, last, 1000)
            else:
                assert isinstance(verdict, Rejected)
                assert verdict.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        elif kind == "gap" and prod.sent:
            verdict = send(prod.epoch, (prod.next_seq + arg) % (INT32_MAX + 1), 1)
            assert isinstance(verdict, Rejected)
            assert verdict.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        elif kind == "bump":
            prod.epoch += 1
            before = p.log_end_offset
            assert send(prod.epoch, 0, 1) is ACCEPTED
            prod.sent.append((prod.epoch, 0, 1, before, before))
            prod.next_seq = 1
        elif kind == "bump_bad" and prod.sent:
            verdict = send(prod.epoch + 1, arg, 1)
            assert isinstance(verdict, Rejected)
            assert verdict.error is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        elif kind == "stale" and prod.sent:
            verdict = send(prod.epoch - 1, prod.next_seq, 1)
            assert isinstance(verdict, Rejected)
            assert verdict.error is Errors.INVALID_PRODUCER_EPOCH
    # Every record of the log was appended exactly once, per producer in sequence order.
    for prod in producers:
        firsts = [s[3] for s in prod.sent]
        assert firsts == sorted(firsts)
    assert p.log_end_offset == sum(s[2] for prod in producers for s in prod.sent)
