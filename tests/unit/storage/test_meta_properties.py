"""storage/meta_properties.py: the data directory's lock and identity (Kafka's ``.lock`` and
``meta.properties``), checked before a node reads or writes anything in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcoord.storage import meta_properties as mp
from kcoord.storage.manager import LogManager


def test_a_locked_directory_is_refused_until_its_lock_is_released(tmp_path: Path) -> None:
    data = tmp_path / "data"
    held = mp.DataDirLock.acquire(data)  # creates the directory
    # flock locks belong to an open file: a second open, even in this process, conflicts.
    with pytest.raises(mp.DataDirError, match=r"Failed to acquire lock on file \.lock in "):
        mp.DataDirLock.acquire(data)
    held.release()
    held.release()  # idempotent
    mp.DataDirLock.acquire(data).release()


def test_the_first_claim_records_the_node_and_later_ones_check_it(tmp_path: Path) -> None:
    # No cluster id, configured or recorded: refused, and nothing written (an unformatted
    # directory, to Kafka).
    with pytest.raises(mp.DataDirError, match=r"No cluster id for .*configure cluster\.id"):
        mp.claim(tmp_path, 1, None)
    assert mp.read_meta_properties(tmp_path) is None
    assert mp.claim(tmp_path, 1, "A") == "A"
    assert mp.read_meta_properties(tmp_path) == {"version": "1", "node.id": "1", "cluster.id": "A"}
    with pytest.raises(mp.DataDirError, match="Stored node id 1 doesn't match previous node id 2"):
        mp.claim(tmp_path, 2, None)
    # The recorded id serves a start without one configured; another configured one is refused.
    assert mp.claim(tmp_path, 1, None) == "A"
    assert mp.claim(tmp_path, 1, "A") == "A"
    with pytest.raises(mp.DataDirError, match=r"Invalid cluster\.id in: .*Expected B, but read A"):
        mp.claim(tmp_path, 1, "B")
    assert mp.read_meta_properties(tmp_path) == {"version": "1", "node.id": "1", "cluster.id": "A"}


def test_a_file_without_a_cluster_id_takes_the_configured_one(tmp_path: Path) -> None:
    """An older kcoord recorded the node id first and the cluster id once it learned it."""
    mp.write_meta_properties(tmp_path, {"version": "1", "node.id": "1"})
    with pytest.raises(mp.DataDirError, match="No cluster id"):
        mp.claim(tmp_path, 1, None)
    assert mp.claim(tmp_path, 1, "A") == "A"
    assert mp.read_meta_properties(tmp_path) == {"version": "1", "node.id": "1", "cluster.id": "A"}


def test_the_cluster_id_learned_from_the_image_is_recorded_and_checked(tmp_path: Path) -> None:
    mp.write_meta_properties(tmp_path, {"version": "1", "node.id": "1"})  # an older kcoord's
    mp.check_learned_cluster_id(tmp_path, "A", None)
    assert (mp.read_meta_properties(tmp_path) or {})["cluster.id"] == "A"
    mp.check_learned_cluster_id(tmp_path, "A", "A")
    with pytest.raises(mp.DataDirError, match=r"Expected B \(the metadata quorum.s\), but read A"):
        mp.check_learned_cluster_id(tmp_path, "B", None)
    # A voter of another cluster: the quorum's id is not the configured one.
    with pytest.raises(mp.DataDirError, match=r"configured with cluster\.id A"):
        mp.check_learned_cluster_id(tmp_path, "B", "A")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("node.id=1\n", "unsupported version None"),
        ("version=9\nnode.id=1\n", "unsupported version '9'"),
        ("version=1\nnode.id\n", "not a properties file"),
        (b"\xff\xfe", "cannot read"),
    ],
)
def test_an_unreadable_meta_properties_refuses_the_start(
    tmp_path: Path, text: str | bytes, error: str
) -> None:
    path = tmp_path / mp.META_PROPERTIES_FILE
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(mp.DataDirError, match=error):
        mp.claim(tmp_path, 1, None)


def test_kafkas_own_file_reads(tmp_path: Path) -> None:
    (tmp_path / mp.META_PROPERTIES_FILE).write_text(
        "#\n#Sun Nov 29 23:00:00 UTC 2026\nnode.id=3\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\n"
        "version=1\ncluster.id=MkU3OEVBNTcwNTJENDM2Qk\n"
    )
    assert mp.claim(tmp_path, 3, "MkU3OEVBNTcwNTJENDM2Qk") == "MkU3OEVBNTcwNTJENDM2Qk"


def test_a_directory_with_only_its_identity_files_holds_no_data(tmp_path: Path) -> None:
    """The lock and meta.properties come before the logs are opened: a first start must
    still find the storage empty (a node whose disk was lost registers that loss)."""
    lock = mp.DataDirLock.acquire(tmp_path)
    mp.claim(tmp_path, 1, "A")
    logs = LogManager(tmp_path)
    logs.open()
    assert logs.storage_was_empty
    logs.shutdown()
    lock.release()
