"""Producer ids (node/kafka/producer_ids.py): unique per node, across restarts and data loss."""

from __future__ import annotations

from pathlib import Path

from kcoord.node.kafka.producer_ids import COUNTER_BITS, FILE_NAME, IDS_PER_MS, ProducerIdManager

NOW_MS = 1_700_000_000_000


def test_ids_carry_the_node_and_never_repeat_across_restarts(tmp_path: Path) -> None:
    seen: set[int] = set()
    for _restart in range(3):
        manager = ProducerIdManager(7, tmp_path, lambda: 0, block_size=10)
        ids = [manager.next_id() for _ in range(25)]
        assert all(i >> COUNTER_BITS == 7 for i in ids)
        assert not seen & set(ids)
        seen |= set(ids)
    # Each incarnation reserved whole blocks: at most one block is skipped per restart.
    assert max(seen) & ((1 << COUNTER_BITS) - 1) < 3 * 30
    other = ProducerIdManager(8, tmp_path / "other", lambda: 0)
    assert other.next_id() >> COUNTER_BITS == 8


def test_the_block_is_reserved_before_use(tmp_path: Path) -> None:
    manager = ProducerIdManager(1, tmp_path, lambda: 0, block_size=100)
    assert not (tmp_path / FILE_NAME).exists()
    first = manager.next_id()
    assert (tmp_path / FILE_NAME).read_text().split() == ["0", "100"]
    assert first & ((1 << COUNTER_BITS) - 1) == 0


def test_the_clock_keeps_ids_unique_when_the_data_is_lost(tmp_path: Path) -> None:
    before = ProducerIdManager(1, tmp_path / "a", lambda: NOW_MS).next_id()
    after = ProducerIdManager(1, tmp_path / "b", lambda: NOW_MS + 1).next_id()
    assert after > before
    assert before & ((1 << COUNTER_BITS) - 1) == NOW_MS * IDS_PER_MS


def test_a_malformed_file_falls_back_to_the_clock(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("garbage")
    manager = ProducerIdManager(1, tmp_path, lambda: NOW_MS)
    assert manager.next_id() & ((1 << COUNTER_BITS) - 1) == NOW_MS * IDS_PER_MS
