"""Producer state snapshots (storage/producer_snapshot.py): Kafka's file layout, what they
keep, bad files, and the log deleting those that claim batches it no longer has."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcoord.storage import format as fmt
from kcoord.storage import producer_snapshot
from kcoord.storage.producer_snapshot import CorruptSnapshotError, decode, encode
from kcoord.storage.producer_state import ACCEPTED, Duplicate, ProducerStateManager
from tests.unit.node.kafka.test_producer_state import header
from tests.unit.storage.helpers import batch, open_log

EXPIRATION_MS = 86_400_000


def state_of(*headers: fmt.BatchHeader) -> ProducerStateManager:
    state = ProducerStateManager(producer_id_expiration_ms=EXPIRATION_MS)
    state.update(headers)
    return state


def test_the_layout_is_kafkas_version_1() -> None:
    """``ProducerStateManager.PID_SNAPSHOT_MAP_SCHEMA``: version, CRC-32C of the rest, then
    each producer's id, epoch, last sequence, last offset, offset delta (last minus first
    sequence of its last batch), timestamp, coordinator epoch, current transaction's first
    offset."""
    state = state_of(
        header(7, 2, 0, 3, base_offset=10, ts=1_000), header(7, 2, 3, 4, base_offset=13, ts=2_000)
    )
    data = encode(state)
    body = struct.pack(">i", 1) + struct.pack(">qhiqiqiq", 7, 2, 6, 16, 3, 2_000, -1, -1)
    assert data == struct.pack(">hI", 1, crc32c.crc32c(body)) + body


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**15 - 1),
            st.integers(0, 2**31 - 100),
            st.integers(1, 50),
            st.integers(0, 2**40),
            st.integers(-1, 2**45),
        ),
        max_size=20,
    )
)
def test_a_snapshot_keeps_each_producers_last_batch(
    producers: list[tuple[int, int, int, int, int, int]],
) -> None:
    state = state_of(
        *(header(pid, e, s, c, base_offset=o, ts=t) for pid, e, s, c, o, t in producers)
    )
    back = decode(encode(state), producer_id_expiration_ms=EXPIRATION_MS)
    assert set(back.producers) == set(state.producers)
    for pid, entry in state.producers.items():
        got = back.producers[pid]
        assert (got.producer_epoch, got.last_timestamp_ms) == (
            entry.producer_epoch,
            entry.last_timestamp_ms,
        )
        assert list(got.batches) == [entry.batches[-1]]


def test_a_retry_of_the_last_batch_is_a_duplicate_after_a_reload() -> None:
    last = header(5, 0, 4, 2, base_offset=40, ts=1_000)
    back = decode(
        encode(state_of(header(5, 0, 0, 4, base_offset=30, ts=900), last)),
        producer_id_expiration_ms=1,
    )
    assert back.validate([last._replace(base_offset=-1)]) == Duplicate(40, 41, 1_000)
    following = header(5, 0, 6, 1, base_offset=-1, ts=1_100)
    assert back.validate([following]) is ACCEPTED


def test_a_batch_whose_sequences_wrap_keeps_its_first_sequence() -> None:
    """The file keeps the last batch's offset delta, as Kafka's, and the first sequence is
    the last one less it, wrapping at ``Integer.MAX_VALUE`` (``decrementSequence``): a
    sequence delta there was negative and put the batch's first offset 2^31 away."""
    wrapping = header(5, 0, 2**31 - 2, 4, base_offset=100, ts=1_000)
    assert wrapping.last_sequence == 1
    data = encode(state_of(wrapping))
    assert struct.unpack_from(">i", data, 10 + 8 + 2 + 4 + 8) == (3,)
    (batch_back,) = decode(data, producer_id_expiration_ms=1).producers[5].batches
    assert (batch_back.first_seq, batch_back.last_seq) == (2**31 - 2, 1)
    assert (batch_back.first_offset, batch_back.last_offset) == (100, 103)


@pytest.mark.parametrize(
    "damage",
    ["truncated", "flipped", "version", "count", "empty"],
)
def test_a_damaged_snapshot_is_refused(damage: str) -> None:
    data = bytearray(
        encode(
            state_of(
                header(5, 0, 0, 1, base_offset=0, ts=1_000),
                header(6, 0, 0, 1, base_offset=1, ts=1_000),
            )
        )
    )
    if damage == "truncated":
        data = data[:-3]
    elif damage == "flipped":
        data[20] ^= 0x10
    elif damage == "version":
        data[1] = 2
    elif damage == "count":
        body = struct.pack(">i", 3) + bytes(data[10:])  # a count the entries do not fill
        data = bytearray(struct.pack(">hI", 1, crc32c.crc32c(body)) + body)
    else:
        data = bytearray()
    with pytest.raises(CorruptSnapshotError):
        decode(bytes(data), producer_id_expiration_ms=EXPIRATION_MS)


def test_the_latest_snapshot_that_reads_is_taken_and_a_bad_one_deleted(tmp_path: Path) -> None:
    older = state_of(header(5, 0, 0, 1, base_offset=0, ts=1_000))
    producer_snapshot.write(tmp_path, 1, older, keep_from=0)
    producer_snapshot.write(
        tmp_path, 3, state_of(header(6, 0, 0, 1, base_offset=2, ts=1_000)), keep_from=0
    )
    assert producer_snapshot.offsets(tmp_path) == [1, 3]
    found = producer_snapshot.read_latest(tmp_path, at_most=2, producer_id_expiration_ms=1)
    assert found is not None and found[0] == 1 and set(found[1].producers) == {5}
    producer_snapshot.path_of(tmp_path, 3).write_bytes(b"garbage")
    found = producer_snapshot.read_latest(tmp_path, at_most=10, producer_id_expiration_ms=1)
    assert found is not None and found[0] == 1
    assert producer_snapshot.offsets(tmp_path) == [1], "the bad one is deleted"
    (tmp_path / "not-an-offset.snapshot").write_bytes(b"")
    assert producer_snapshot.offsets(tmp_path) == [1]
    assert (
        producer_snapshot.read_latest(tmp_path / "gone", at_most=9, producer_id_expiration_ms=1)
        is None
    )


def test_writing_keeps_the_snapshots_of_the_segments_and_the_latest(tmp_path: Path) -> None:
    state = state_of(header(5, 0, 0, 1, base_offset=0, ts=1_000))
    for offset in (2, 4, 6):
        producer_snapshot.write(tmp_path, offset, state, keep_from=0)
    producer_snapshot.write(tmp_path, 8, state, keep_from=5)  # segments from 5 on
    assert producer_snapshot.offsets(tmp_path) == [6, 8]
    producer_snapshot.write(tmp_path, 9, state, keep_from=20)  # none of a segment: the latest
    assert producer_snapshot.offsets(tmp_path) == [9]


def test_the_log_deletes_snapshots_above_its_end_on_truncation_and_open(tmp_path: Path) -> None:
    """Snapshots hold the state of the batches below them: one above the log end claims
    batches the log no longer has (cut by a truncation, or by recovery after a crash)."""
    lg = open_log(tmp_path / "t-0")
    for _ in range(6):
        lg.append_as_leader(batch(), 0, now_ms=1_000)
    state = state_of(header(5, 0, 0, 1, base_offset=0, ts=1_000))
    for offset in (2, 4, 6):
        lg.write_producer_snapshot(offset, state)
    lg.truncate_to(5)
    assert producer_snapshot.offsets(lg.directory) == [2, 4]
    found = lg.latest_producer_snapshot(EXPIRATION_MS)
    assert found is not None and found[0] == 4
    producer_snapshot.write(lg.directory, 9, state, keep_from=0)  # say a crash cut the log
    lg.close()
    lg = open_log(tmp_path / "t-0", clean_shutdown=True)
    assert producer_snapshot.offsets(lg.directory) == [2, 4]
    lg.truncate_fully_and_start_at(7)
    assert producer_snapshot.offsets(lg.directory) == []
    lg.close()
