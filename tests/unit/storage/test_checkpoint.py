"""Checkpoint files: round trips in Kafka's formats, garbage refused with the file named."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcoord.storage import checkpoint
from kcoord.storage.epoch import UNDEFINED_EPOCH, LeaderEpochCache

topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.-0123456789", min_size=1, max_size=20)


# No deadline: every example fsyncs a file and its directory, slow on a busy disk.
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.tuples(topics, st.integers(0, 10_000)), st.integers(0, 2**62)))
def test_offsets_round_trip(tmp_path: Path, offsets: dict[tuple[str, int], int]) -> None:
    path = tmp_path / checkpoint.RECOVERY_POINT_CHECKPOINT
    checkpoint.write_offsets(path, offsets)
    assert checkpoint.read_offsets(path) == offsets
    assert not path.with_name(path.name + ".tmp").exists()


def test_offsets_file_is_kafkas_format(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    checkpoint.write_offsets(path, {("orders", 1): 7, ("__consumer_offsets", 0): 0})
    assert path.read_text() == "0\n2\n__consumer_offsets 0 0\norders 1 7\n"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0\n",
        "1\n0\n",
        "0\n2\nt 0 1\n",
        "0\nx\n",
        "0\n1\nt zero 1\n",
        "0\n1\nt 0 -5\n",
        "0\n1\nt 0\n",
        "\xff\xfe",
    ],
)
def test_garbage_offsets_raise_checkpoint_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(checkpoint.CheckpointError, match="recovery-point-offset-checkpoint"):
        checkpoint.read_offsets(path)


def test_absent_file_is_empty(tmp_path: Path) -> None:
    assert checkpoint.read_offsets(tmp_path / "nope") == {}
    assert checkpoint.read_leader_epochs(tmp_path / "nope") == []
    assert checkpoint.read_partition_metadata(tmp_path / "nope") is None


def test_leader_epochs_round_trip_and_order_is_checked(tmp_path: Path) -> None:
    path = tmp_path / checkpoint.LEADER_EPOCH_CHECKPOINT
    checkpoint.write_leader_epochs(path, [(0, 0), (3, 100), (4, 100)])
    assert path.read_text() == "0\n3\n0 0\n3 100\n4 100\n"
    assert checkpoint.read_leader_epochs(path) == [(0, 0), (3, 100), (4, 100)]
    path.write_text("0\n2\n5 10\n4 20\n")
    with pytest.raises(checkpoint.CheckpointError, match="increase"):
        checkpoint.read_leader_epochs(path)


def test_partition_metadata(tmp_path: Path) -> None:
    path = tmp_path / checkpoint.PARTITION_METADATA
    checkpoint.write_partition_metadata(path, "7bNn1dpNQ6qvg3NfRYMSzA")
    assert path.read_text() == "version: 0\ntopic_id: 7bNn1dpNQ6qvg3NfRYMSzA\n"
    assert checkpoint.read_partition_metadata(path) == "7bNn1dpNQ6qvg3NfRYMSzA"
    path.write_text("garbage")
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.read_partition_metadata(path)


def test_leader_epoch_cache_semantics(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.end_offset_for(0, 10) == (UNDEFINED_EPOCH, -1)
    cache.assign(1, 0)
    cache.assign(1, 5)  # same epoch: no-op
    cache.assign(3, 10)
    cache.assign(2, 12)  # older epoch: no-op
    cache.assign(5, 20)
    assert cache.entries == [(1, 0), (3, 10), (5, 20)]
    assert cache.end_offset_for(5, 30) == (5, 30)
    assert cache.end_offset_for(3, 30) == (3, 20)
    assert cache.end_offset_for(4, 30) == (3, 20)  # largest epoch not above the requested
    # Below the first known epoch: itself, ending where the first one starts (Kafka's
    # endOffsetFor, whose earlier epochs may have gone with the log start).
    assert cache.end_offset_for(0, 30) == (0, 0)
    assert cache.end_offset_for(9, 30) == (UNDEFINED_EPOCH, -1)
    cache.truncate_from_end(15)
    assert cache.entries == [(1, 0), (3, 10)]
    cache.truncate_from_start(12)
    assert cache.entries == [(3, 12)]
    assert cache.end_offset_for(1, 30) == (1, 12)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 30) == (UNDEFINED_EPOCH, -1)
    cache.flush()
    assert LeaderEpochCache.load(cache.path).entries == [(3, 12)]


def test_a_leader_epoch_cache_writes_its_file_only_once_it_has_something_to_say(
    tmp_path: Path,
) -> None:
    """A new log's cache has no epochs and no file: flushing writes nothing (a missing file
    reads as no epochs). Its first epoch is written; a garbage file is rewritten even when the
    cache rebuilt from the log is empty, so the garbage is not read again."""
    path = tmp_path / checkpoint.LEADER_EPOCH_CHECKPOINT
    cache = LeaderEpochCache(path)
    cache.flush()
    assert not path.exists()
    assert LeaderEpochCache.load(path).entries == []
    cache.assign(2, 7)
    cache.flush()
    assert checkpoint.read_leader_epochs(path) == [(2, 7)]

    path.write_text("garbage")
    rebuilt = LeaderEpochCache(path)  # as Log.open does after a CheckpointError
    rebuilt.flush()
    assert checkpoint.read_leader_epochs(path) == []
