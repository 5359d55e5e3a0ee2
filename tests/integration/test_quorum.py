"""The pysyncobj adapter: three in-process voters commit batches; restart replays the journal."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pysyncobj.journal
import pysyncobj.transport
import pytest

from kcoord.raft import quorum as quorum_module
from kcoord.raft import records as rec
from kcoord.raft.quorum import (
    CLUSTER_ID as CLUSTER_ID_MESSAGE,
)
from kcoord.raft.quorum import (
    PRE_VOTE,
    MetadataQuorum,
    QuorumTiming,
    Voter,
    decode_batch,
    encode_batch,
)
from tests.portpick import free_ports, restartable_ports

CLUSTER_ID = "kcoord-test"
DEADLINE_S = 30.0
DEFAULT_TIMING = QuorumTiming()


class Recorder:
    def __init__(self) -> None:
        self.committed: list[tuple[int, list[rec.MetadataRecord]]] = []
        self.snapshots: list[int] = []
        self.lock = threading.Lock()

    def on_committed(self, offset: int, records: list[rec.MetadataRecord]) -> None:
        with self.lock:
            self.committed.append((offset, records))

    def on_snapshot_loaded(
        self, offset: int, records: list[rec.MetadataRecord], image: object
    ) -> None:
        self.snapshots.append(offset)

    def on_state_changed(self) -> None:
        pass


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.02)  # polling interval, not a wait for the condition itself
    raise AssertionError(f"timed out waiting for {what}")


def start(
    voters: list[Voter],
    node_id: int,
    root: Path,
    recorder: Recorder,
    timing: QuorumTiming = DEFAULT_TIMING,
) -> MetadataQuorum:
    q = MetadataQuorum(
        node_id, voters, root / f"n{node_id}", recorder, cluster_id=CLUSTER_ID, timing=timing
    )
    q.start()
    return q


def propose_sync(q: MetadataQuorum, records: list[rec.MetadataRecord]) -> int:
    done = threading.Event()
    result: list[tuple[int | None, str | None]] = []

    def on_done(offset: int | None, error: str | None) -> None:
        result.append((offset, error))
        done.set()

    q.propose(records, on_done, epoch=q.status().epoch)
    assert done.wait(DEADLINE_S), "proposal never completed"
    offset, error = result[0]
    assert error is None and offset is not None, error
    return offset


def connected_leader(quorums: dict[int, MetadataQuorum]) -> MetadataQuorum:
    """The leader, once it is connected to both followers."""
    wait_for(
        lambda: any(
            q.status().is_leader and len(q.status().connected) == 2 for q in quorums.values()
        ),
        "a leader connected to both followers",
    )
    return next(q for q in quorums.values() if q.status().is_leader)


def test_batch_codec_refuses_garbage() -> None:
    batch: list[rec.MetadataRecord] = [rec.ClusterId("abc"), rec.NoOp()]
    assert decode_batch(encode_batch(batch, 7)) == (7, batch)
    version_1 = msgpack.packb([1, [rec.encode(r) for r in batch]], use_bin_type=True)
    assert decode_batch(version_1) == (None, batch)  # journals written before the epoch
    garbage_batches = (b"", b"\xc1", encode_batch(batch, 7)[:-1], b"\x92\x02\x90")
    for garbage in (*garbage_batches, msgpack.packb([2, "7", []]), msgpack.packb([2, 7])):
        with pytest.raises(rec.MetadataRecordError):
            decode_batch(garbage)


@pytest.mark.integration
def test_three_voters_commit_and_a_restarted_voter_replays(tmp_path: Path) -> None:
    # A follower restarts on its port: below the ephemeral range, no connection takes it.
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(restartable_ports(3))]
    recorders = {v.node_id: Recorder() for v in voters}
    quorums: dict[int, MetadataQuorum] = {}
    try:
        for v in voters:  # in the try: voters started before one that fails are stopped
            quorums[v.node_id] = start(voters, v.node_id, tmp_path, recorders[v.node_id])
        wait_for(lambda: any(q.status().is_leader for q in quorums.values()), "a leader")
        leader = next(q for q in quorums.values() if q.status().is_leader)
        offset = propose_sync(leader, [rec.ClusterId("test-cluster")])
        assert offset > 0
        wait_for(
            lambda: all(q.image.cluster_id == "test-cluster" for q in quorums.values()),
            "every voter to apply the batch",
        )
        # A batch the image refuses is skipped identically everywhere; the next one applies.
        bad: list[rec.MetadataRecord] = [rec.FenceBroker(broker_id=99, broker_epoch=1)]
        propose_refused: list[str | None] = []
        done = threading.Event()

        def on_refused(_offset: int | None, error: str | None) -> None:
            propose_refused.append(error)
            done.set()

        leader.propose(bad, on_refused, epoch=leader.status().epoch)
        assert done.wait(DEADLINE_S)
        assert propose_refused[0] is not None
        second = propose_sync(leader, [rec.NoOp()])
        wait_for(
            lambda: all(q.image.last_offset >= second for q in quorums.values()),
            "the next batch everywhere",
        )
        assert all(q.skipped_batches == 1 for q in quorums.values())
        # Restart a follower from its journal: it replays to the same image.
        follower_id = next(i for i, q in quorums.items() if q is not leader)
        quorums[follower_id].stop()
        recorders[follower_id] = Recorder()
        quorums[follower_id] = start(voters, follower_id, tmp_path, recorders[follower_id])
        # The journal replays entry by entry: wait for the whole of it, not its first batch.
        wait_for(
            lambda: quorums[follower_id].image == leader.image,
            "the restarted voter to replay to the leader's image",
        )
        assert quorums[follower_id].image.cluster_id == "test-cluster"
    finally:
        for q in quorums.values():
            q.stop()


@pytest.mark.integration
def test_a_deposed_controllers_batch_handed_to_the_leader_is_skipped_everywhere(
    tmp_path: Path,
) -> None:
    """pysyncobj hands a command proposed on a voter that does not lead to the leader, which
    appends it in its own term. A controller deposed before it noticed so had its fencing
    committed by its successor (chaos seed 31, groups workload, partitions). A batch names the
    epoch it was decided in and applies only if appended in that term."""
    with running_quorum(tmp_path) as quorums:
        leader = connected_leader(quorums)
        propose_sync(leader, [rec.ClusterId("quorum")])
        follower = next(q for q in quorums.values() if not q.status().is_leader)
        wait_for(lambda: follower.status().leader_id is not None, "the follower to know the leader")
        done = threading.Event()
        outcome: list[tuple[int | None, str | None]] = []

        def on_done(offset: int | None, error: str | None) -> None:
            outcome.append((offset, error))
            done.set()

        stale: list[rec.MetadataRecord] = [
            rec.RegisterBroker(broker_id=7, incarnation_id="i7", broker_epoch=1, endpoints={})
        ]
        follower.propose(stale, on_done, epoch=leader.status().epoch - 1)
        assert done.wait(DEADLINE_S), "the handed-on batch never completed"
        assert outcome[0][0] is None and outcome[0][1] is not None
        last = propose_sync(leader, [rec.NoOp()])
        wait_for(
            lambda: all(q.image.last_offset >= last for q in quorums.values()),
            "every voter past the next batch",
        )
        assert all(7 not in q.image.brokers for q in quorums.values())
        assert all(q.skipped_batches == 1 for q in quorums.values())
        # The same record from the leader, in its epoch, applies.
        propose_sync(leader, stale)
        wait_for(lambda: all(7 in q.image.brokers for q in quorums.values()), "broker 7")


@contextlib.contextmanager
def running_quorum(
    root: Path,
    timing: QuorumTiming = DEFAULT_TIMING,
) -> Iterator[dict[int, MetadataQuorum]]:
    """Three voters on free ports, each with its own recorder, stopped at the end."""
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorums: dict[int, MetadataQuorum] = {}
    try:
        for v in voters:  # in the try: voters started before one that fails are stopped
            quorums[v.node_id] = start(voters, v.node_id, root, Recorder(), timing)
        yield quorums
    finally:
        for q in quorums.values():
            q.stop()


@pytest.mark.integration
def test_a_voter_that_cannot_listen_fails_its_start_and_joins_once_its_port_is_free(
    tmp_path: Path,
) -> None:
    """pysyncobj retries a failed bind for ever, and a node ran without ever joining the
    quorum: a voter whose port is taken fails its start, naming the address (as Kafka, and
    this node's Kafka and RPC ports, do), and starts once the port is free."""
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(restartable_ports(3))]
    taken = socket.create_server(("127.0.0.1", voters[0].port))
    quorums: dict[int, MetadataQuorum] = {}
    try:
        with pytest.raises(OSError, match=f"quorum listener 127.0.0.1:{voters[0].port}"):
            start(voters, 1, tmp_path, Recorder())
        for v in voters[1:]:
            quorums[v.node_id] = start(voters, v.node_id, tmp_path, Recorder())
        taken.close()
        quorums[1] = start(voters, 1, tmp_path, Recorder())
        offset = propose_sync(connected_leader(quorums), [rec.ClusterId("bound")])
        wait_for(
            lambda: quorums[1].status().commit_index >= offset,
            "the voter that could not listen to have the batch",
        )
    finally:
        taken.close()
        for q in quorums.values():
            q.stop()


@pytest.mark.integration
def test_a_resigning_leader_hands_the_leadership_to_another_voter(tmp_path: Path) -> None:
    with running_quorum(tmp_path) as quorums:
        leader = connected_leader(quorums)
        offset = propose_sync(leader, [rec.ClusterId("resign")])
        wait_for(
            lambda: all(q.status().commit_index >= offset for q in quorums.values()),
            "every voter to have the batch",
        )
        term = leader.status().epoch
        assert leader.resign(DEADLINE_S)
        assert not leader.status().is_leader
        wait_for(
            lambda: any(q.status().is_leader for q in quorums.values() if q is not leader),
            "another voter to lead",
        )
        successor = next(q for q in quorums.values() if q.status().is_leader)
        assert successor.status().epoch > term
        # The new leader commits: the hand-over lost nothing.
        assert propose_sync(successor, [rec.NoOp()]) > offset
        # A voter that does not lead has nothing to hand over.
        assert next(q for q in quorums.values() if not q.status().is_leader).resign(1.0)


@pytest.mark.integration
def test_a_voter_cut_off_and_back_leaves_the_leader_in_place(tmp_path: Path) -> None:
    """Pre-vote (KIP-996): a follower whose links stay up but carry nothing (a firewall, a
    pause) asks for votes each time its election timer runs out, raises its term never, and
    once back follows the leader it had; pysyncobj's voter raised its term every time, and
    its RequestVote on return deposed the leader. The voters share this process and its
    GIL: election timeouts well above a stall of a loaded machine keep the leader's term
    its own for the length of the test."""
    timing = QuorumTiming(
        raft_min_timeout_s=1.5,
        raft_max_timeout_s=2.5,
        leader_fallback_timeout_s=4.0,
        connection_timeout_s=3.0,  # pysyncobj: no shorter than the longest election timeout
    )
    with running_quorum(tmp_path, timing) as quorums:
        leader = connected_leader(quorums)
        term = leader.status().epoch
        cut = next(q for q in quorums.values() if q is not leader)
        wait_for(lambda: cut.status().leader_id == leader.node_id, "the follower to follow")
        sync = cut._sync
        assert sync is not None
        transport = sync._SyncObj__transport
        deliver = transport._onMessageReceivedCallback
        asked: list[str] = []

        def dropped(_node: Any, message: Any) -> bool:  # nothing leaves ...
            if isinstance(message, dict) and message.get("type") in (PRE_VOTE, "request_vote"):
                asked.append(message["type"])
            return True

        transport.send = dropped
        transport._onMessageReceivedCallback = lambda node, message: None  # ... or arrives
        try:
            # Two voters to ask each time its election timer runs out.
            wait_for(lambda: len(asked) >= 6, "three rounds of asking for votes")
            assert cut.status().epoch == term and set(asked) == {PRE_VOTE}
            assert cut.status().leader_id is None
        finally:
            del transport.send
            transport._onMessageReceivedCallback = deliver
        wait_for(lambda: cut.status().leader_id == leader.node_id, "the follower to follow again")
        offset = propose_sync(leader, [rec.NoOp()])
        wait_for(lambda: cut.status().commit_index >= offset, "the follower to have the batch")
        assert leader.status().is_leader and leader.status().epoch == term
        assert all(q.status().epoch == term for q in quorums.values())


@pytest.mark.integration
def test_nothing_leaves_a_voter_before_its_journal_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vote, an AppendEntries or its reply is sent only once the journal entries it speaks
    of are synced: pysyncobj never synced its journal, so a power loss could take an entry a
    majority had acknowledged, committed, from a voter that counted towards it."""
    sent: list[str] = []
    unsynced: list[str] = []
    send = pysyncobj.transport.TCPTransport.send

    def recording_send(transport: Any, node: Any, message: Any) -> Any:
        if isinstance(message, dict):
            sent.append(str(message.get("type")))
            if transport._syncObj._SyncObj__raftLog._dirty:
                unsynced.append(str(message.get("type")))
        return send(transport, node, message)

    monkeypatch.setattr(pysyncobj.transport.TCPTransport, "send", recording_send)
    with running_quorum(tmp_path) as quorums:
        leader = connected_leader(quorums)
        offsets = [propose_sync(leader, [rec.NoOp()]) for _ in range(5)]
        wait_for(
            lambda: all(q.status().commit_index >= offsets[-1] for q in quorums.values()),
            "every voter to have the batches",
        )
    assert {"request_vote", "append_entries", "next_node_idx"} <= set(sent)
    assert unsynced == []


def recording_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of each file fsynced, and "msync" for each sync of a journal's memory map."""
    synced: list[str] = []
    fsync = os.fsync
    msync = pysyncobj.journal.ResizableFile.flush

    def recording_fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_msync(file: Any) -> None:
        synced.append("msync")
        msync(file)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(pysyncobj.journal.ResizableFile, "flush", recording_msync)
    return synced


def test_the_journal_syncs_its_changes_and_its_snapshot_before_a_trim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = recording_syncs(monkeypatch)
    journal = quorum_module._create_journal(str(tmp_path / "journal"))
    journal.sync()
    assert synced == ["msync"]
    journal.add(b"\x00a", 1, 1)
    journal.add(b"\x00b", 2, 1)
    journal.add(b"\x00c", 3, 2)
    synced.clear()
    journal.sync()
    journal.sync()  # nothing new: no second sync
    assert synced == ["msync"]
    # The term and vote are on disk when setCurrentTerm returns.
    synced.clear()
    journal.setCurrentTerm(3, "127.0.0.1:1")
    assert synced == ["journal.meta.tmp", tmp_path.name]
    # A trim (after a snapshot is renamed into place) syncs the snapshot and its directory,
    # then replaces the journal by a synced copy of what it keeps, in one rename.
    (tmp_path / "snapshot").write_bytes(b"snapshot")
    synced.clear()
    journal.deleteEntriesTo(1)
    assert synced == ["snapshot", tmp_path.name, "journal.tmp", tmp_path.name]
    journal.sync()  # the trim left nothing to sync
    assert synced == ["snapshot", tmp_path.name, "journal.tmp", tmp_path.name]
    journal.add(b"\x00d", 4, 2)
    journal.sync()
    journal._destroy()
    reopened = quorum_module._create_journal(str(tmp_path / "journal"))
    assert [tuple(e) for e in reopened] == [(b"\x00b", 2, 1), (b"\x00c", 3, 2), (b"\x00d", 4, 2)]
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (3, "127.0.0.1:1")
    reopened._destroy()


@pytest.mark.parametrize("tear", ["zeros", "old-pages", "mixed-body", "short-file"])
def test_a_journal_torn_by_a_power_loss_loads_its_good_entries(
    tmp_path: Path, tear: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a power loss leaves of unsynced writes: the header's end offset on disk before the
    records (zeros), or before the file grew (short-file: pysyncobj's load raised and the
    node could not start); a trim's new first page with the old later pages (entries out of
    order); a record rewritten in place whose pages only partly reached the disk (mixed-body:
    its sizes, index and term all fine, only its checksum tells). The entries up to the first
    that does not check out are kept (the rest were never acknowledged), and the file is
    rewritten to them."""
    path = str(tmp_path / "journal")
    journal = quorum_module._create_journal(path)
    for i, term in ((1, 1), (2, 1), (3, 1), (4, 2)):
        journal.add(b"\x00" + bytes([i]) * 100, i, term)
    journal.sync()
    journal._destroy()
    raw = bytearray(Path(path).read_bytes())
    end = struct.unpack_from("<I", raw, 36)[0]
    record = 4 + 16 + 101 + 4 + 4  # size, index and term, command, checksum, size
    assert end == 40 + 4 * record
    if tear == "zeros":
        # A fifth record's space, claimed by the header but never written.
        raw[end : end + record] = bytes(record)
        struct.pack_into("<I", raw, 36, end + record)
    elif tear == "short-file":
        struct.pack_into("<I", raw, 36, end + 5000)  # the end reached the disk, the growth not
    elif tear == "old-pages":
        # Entry 4's place holds a copy of entry 2 (an older page): out of order.
        raw[end - record : end] = raw[40 + record : 40 + 2 * record]
    else:
        raw[end - record + 60] ^= 0xFF  # in entry 4's command
    Path(path).write_bytes(bytes(raw))
    reopened = quorum_module._create_journal(path)
    kept = [(e[1], e[2]) for e in reopened]
    whole = tear in ("zeros", "short-file")
    assert kept == ([(1, 1), (2, 1), (3, 1), (4, 2)] if whole else [(1, 1), (2, 1), (3, 1)])
    assert "dropped the torn tail" in caplog.text
    reopened.add(b"\x00next", kept[-1][0] + 1, 2)
    reopened.sync()
    reopened._destroy()
    again = quorum_module._create_journal(path)
    assert [(e[1], e[2]) for e in again] == [*kept, (kept[-1][0] + 1, 2)]
    again._destroy()


def recording_flushes(journal: Any, path: str) -> list[bytes]:
    """The journal file's bytes after each of the journal's syncs: what a power loss right
    after it would leave."""
    synced: list[bytes] = []
    real = journal.flush

    def flush() -> None:
        real()
        synced.append(Path(path).read_bytes())

    journal.flush = flush
    return synced


def test_a_follower_truncation_leaves_no_dropped_entry_for_a_torn_append_to_bring_back(
    tmp_path: Path,
) -> None:
    """A follower drops its conflicting entries 2 and 3 of term 1 and appends its leader's 2
    and 3 of term 2, of the same sizes. A power loss that took the header and the new entry
    3's page, but not the new entry 2's, leaves on disk what was synced at entry 2's place
    before: pysyncobj's truncation left the old entry 2 there, which loaded as 1, 2 (term 1),
    3 (term 2), a log the leader never had. The dropped entries are zeroes on disk before the
    first different entry is written over them, and the load stops at the hole."""
    path = str(tmp_path / "journal")
    journal = quorum_module._create_journal(path)
    for i in (1, 2, 3):
        journal.add(b"\x00old" + bytes([i]), i, 1)
    journal.sync()
    synced = recording_flushes(journal, path)
    journal.deleteEntriesFrom(1)  # entries 2 and 3 conflict with the leader's
    journal.add(b"\x00new" + bytes([2]), 2, 2)
    journal.add(b"\x00new" + bytes([3]), 3, 2)
    journal.sync()
    journal._destroy()
    before_the_appends = synced[0]
    torn = bytearray(synced[-1])
    record = len(quorum_module._record(b"\x00old" + bytes([1]), 1, 1))
    second = slice(40 + record, 40 + 2 * record)
    torn[second] = before_the_appends[second].ljust(record, b"\x00")  # its page never got there
    Path(path).write_bytes(bytes(torn))
    reopened = quorum_module._create_journal(path)
    assert [(bytes(e[0]), e[1], e[2]) for e in reopened] == [(b"\x00old" + bytes([1]), 1, 1)]
    reopened._destroy()


def test_entries_a_follower_drops_and_appends_again_unchanged_stay_on_disk(tmp_path: Path) -> None:
    """pysyncobj drops a follower's tail at every AppendEntries that overlaps it, conflicting or
    not (a resend after a late reply), then appends the leader's entries: those appended again
    unchanged, already acknowledged, are never dropped on disk (made durable, a power loss in
    between lost them). Those not sent again are dropped, as pysyncobj's log has them, zeroed
    and synced before anything is sent (``sync``). Reading the journal writes nothing: the
    event loop reads it (``status()``) while pysyncobj's thread appends."""
    path = str(tmp_path / "journal")
    journal = quorum_module._create_journal(path)
    for i in (1, 2, 3, 4):
        journal.add(b"\x00cmd" + bytes([i]), i, 1)
    journal.sync()
    acknowledged = Path(path).read_bytes()
    synced = recording_flushes(journal, path)
    journal.deleteEntriesFrom(1)
    journal.add(b"\x00cmd" + bytes([2]), 2, 1)
    journal.add(b"\x00cmd" + bytes([3]), 3, 1)
    journal.add(b"\x00cmd" + bytes([4]), 4, 1)
    assert len(journal) == 4
    journal.sync()
    assert synced == [] and Path(path).read_bytes() == acknowledged  # nothing written
    # Entries 3 and 4 not sent again: dropped, on disk too, before anything is sent.
    journal.deleteEntriesFrom(1)
    journal.add(b"\x00cmd" + bytes([2]), 2, 1)
    assert [e[1] for e in journal] == [1, 2] and len(journal) == 2 and journal[-1][1] == 2
    assert synced == [] and Path(path).read_bytes() == acknowledged  # read, nothing written
    journal.sync()
    assert len(synced) == 1
    journal._destroy()
    reopened = quorum_module._create_journal(path)
    assert [e[1] for e in reopened] == [1, 2]
    reopened._destroy()


def test_a_read_of_the_journal_in_the_middle_of_an_append_again_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop reads the journal's length (``status()``) while pysyncobj's thread
    appends again an entry it dropped: a read that settled the pending drop there zeroed the
    entry just kept, and entries acknowledged after the sync were gone on reopen."""
    path = str(tmp_path / "journal")
    journal = quorum_module._create_journal(path)
    for i in (1, 2, 3, 4, 5):
        journal.add(b"\x00cmd" + bytes([i]), i, 1)
    journal.sync()
    journal.deleteEntriesFrom(2)  # a resend from entry 3
    real_record = quorum_module._record
    reads: list[int] = []

    def record_with_a_read_between(*args: Any) -> bytes:
        reads.append(len(journal))  # the other thread's status(), between two steps of add
        return real_record(*args)

    monkeypatch.setattr(quorum_module, "_record", record_with_a_read_between)
    journal.add(b"\x00cmd" + bytes([3]), 3, 1)
    monkeypatch.setattr(quorum_module, "_record", real_record)
    journal.add(b"\x00cmd" + bytes([4]), 4, 1)
    journal.sync()  # what goes before the AppendEntries reply
    assert reads and [e[1] for e in journal] == [1, 2, 3, 4]
    journal._destroy()
    reopened = quorum_module._create_journal(path)
    assert [e[1] for e in reopened] == [1, 2, 3, 4]
    reopened._destroy()


def test_a_journal_of_pysyncobjs_own_format_is_read_and_rewritten_with_checksums(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "journal")
    legacy = pysyncobj.journal.FileJournal(path)
    for i in (1, 2, 3):
        legacy.add(b"\x00" + bytes([i]), i, 1)
    legacy._destroy()
    journal = quorum_module._create_journal(path)
    assert [(e[1], e[2]) for e in journal] == [(1, 1), (2, 1), (3, 1)]
    journal.add(b"\x00d", 4, 1)
    journal.sync()
    journal._destroy()
    header = Path(path).read_bytes()[:40]
    assert struct.unpack_from("<I", header, 32)[0] == quorum_module.JOURNAL_FORMAT_VERSION
    again = quorum_module._create_journal(path)
    assert [(e[1], e[2]) for e in again] == [(1, 1), (2, 1), (3, 1), (4, 1)]
    again._destroy()


class HaltedError(Exception):
    pass


def raise_halted(message: str, *args: object, exc_info: BaseException | None = None) -> None:
    raise HaltedError(message % args)


@pytest.mark.parametrize("damage", ["flipped-byte", "not-a-dict", "term-a-string"])
def test_a_term_and_vote_file_that_does_not_load_halts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """pysyncobj's reader took a damaged ``journal.meta`` for none: the voter came back at its
    last entry's term with no vote, free to vote again in a term it had voted in. It halts
    now, as Kafka's ``FileQuorumStateStore`` fails the start-up; a new voter (no file) and an
    intact file load."""
    monkeypatch.setattr(quorum_module, "_halt", raise_halted)
    path = str(tmp_path / "journal")
    journal = quorum_module._create_journal(path)
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (0, None)
    journal.add(b"\x00a", 1, 3)
    journal.setCurrentTerm(7, "127.0.0.1:9094")
    journal.sync()
    journal._destroy()
    again = quorum_module._create_journal(path)
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (7, "127.0.0.1:9094")
    again._destroy()
    meta = Path(path + ".meta")
    if damage == "flipped-byte":
        raw = bytearray(meta.read_bytes())
        raw[-1] ^= 0xFF
        meta.write_bytes(bytes(raw))
    elif damage == "not-a-dict":
        meta.write_bytes(pysyncobj.journal.dumps([7]))
    else:
        meta.write_bytes(pysyncobj.journal.dumps({"currentTerm": "7"}))
    with pytest.raises(HaltedError, match="term and vote"):
        quorum_module._create_journal(path)


def test_a_journal_header_of_an_unknown_format_halts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged format version was read as pysyncobj's format without checksums: every
    record's CRC became part of its command (each batch skipped as undecodable, on this voter
    only), and the rewrite gave the damaged records valid CRCs."""
    monkeypatch.setattr(quorum_module, "_halt", raise_halted)
    path = str(tmp_path / "journal")
    journal = quorum_module._create_journal(path)
    journal.add(b"\x00a", 1, 1)
    journal.sync()
    journal._destroy()
    raw = bytearray(Path(path).read_bytes())
    struct.pack_into("<I", raw, 32, 3)
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(HaltedError, match="format version 3"):
        quorum_module._create_journal(path)
    assert Path(path).read_bytes()[: len(raw)] == bytes(raw)  # not rewritten


def test_a_new_journal_whose_header_never_reached_the_disk_starts_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Power lost right after a voter's first start: the file's size on disk, its header
    not (all zeros). It held nothing acknowledged, so it starts empty, where a format
    version of 0 would halt the voter for good."""
    monkeypatch.setattr(quorum_module, "_halt", raise_halted)
    path = str(tmp_path / "journal")
    Path(path).write_bytes(bytes(1024))
    journal = quorum_module._create_journal(path)
    assert len(journal) == 0
    assert "all zeros" in caplog.text
    journal.add(b"\x00a", 1, 1)
    journal.sync()
    journal._destroy()
    again = quorum_module._create_journal(path)
    assert [(e[1], e[2]) for e in again] == [(1, 1)]
    again._destroy()


def test_a_failed_sync_halts_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed fsync the kernel may have dropped the pages and report the error once:
    a retry would "succeed" without the data. The node halts instead."""
    halts: list[str] = []

    class HaltedError(Exception):
        pass

    def halt(what: str, error: OSError) -> None:
        halts.append(what)
        raise HaltedError

    monkeypatch.setattr(quorum_module, "_halt_on_storage_error", halt)
    journal = quorum_module._create_journal(str(tmp_path / "journal"))

    def failing(*args: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    monkeypatch.setattr(pysyncobj.journal.ResizableFile, "flush", failing)
    journal.add(b"\x00a", 2, 1)
    with pytest.raises(HaltedError):
        journal.sync()
    with pytest.raises(HaltedError):
        journal.setCurrentTerm(2, None)
    assert halts == ["syncing the metadata journal", "storing the term and vote"]
    monkeypatch.undo()
    journal._destroy()


class SnapshottingVoters:
    """Three voters that snapshot after 5 entries or 1 s; ``start`` (re)starts one with a
    fresh recorder, on its port (below the ephemeral range, so that no connection takes it)."""

    TIMING = QuorumTiming(log_compaction_min_entries=5, log_compaction_min_time_s=1)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.voters = [
            Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(restartable_ports(3))
        ]
        self.recorders: dict[int, Recorder] = {}
        self.quorums: dict[int, MetadataQuorum] = {}

    def start(self, node_id: int) -> MetadataQuorum:
        self.recorders[node_id] = Recorder()
        q = MetadataQuorum(
            node_id,
            self.voters,
            self.root / f"n{node_id}",
            self.recorders[node_id],
            cluster_id=CLUSTER_ID,
            timing=self.TIMING,
        )
        q.start()
        self.quorums[node_id] = q
        return q

    def leader(self) -> MetadataQuorum:
        wait_for(lambda: any(q.status().is_leader for q in self.quorums.values()), "a leader")
        return next(q for q in self.quorums.values() if q.status().is_leader)

    def register_brokers(self, leader: MetadataQuorum, count: int, padding: int = 0) -> None:
        for i in range(count):
            record = rec.RegisterBroker(
                broker_id=i,
                incarnation_id=f"inc-{i}-" + "x" * padding,
                broker_epoch=i + 1,
                endpoints={"rpc": f"h:{i}"},
            )
            propose_sync(leader, [record])


@contextlib.contextmanager
def snapshotting_voters(root: Path) -> Iterator[SnapshottingVoters]:
    voters = SnapshottingVoters(root)
    try:
        for v in voters.voters:
            voters.start(v.node_id)
        yield voters
    finally:
        for q in voters.quorums.values():
            q.stop()


def a_follower_snapshots(v: SnapshottingVoters, root: Path) -> tuple[MetadataQuorum, int, Path]:
    """Commit enough for a follower to write a snapshot; the leader, the follower and the
    follower's snapshot file."""
    leader = v.leader()
    propose_sync(leader, [rec.ClusterId("snap")])
    v.register_brokers(leader, 20)
    follower_id = next(i for i, q in v.quorums.items() if q is not leader)
    snapshot = root / f"n{follower_id}" / "__cluster_metadata" / "snapshot"
    wait_for(snapshot.exists, "the follower to write a snapshot")
    return leader, follower_id, snapshot


@pytest.mark.integration
def test_snapshot_is_written_and_a_restarted_voter_loads_it(tmp_path: Path) -> None:
    with snapshotting_voters(tmp_path) as v:
        leader, follower_id, _ = a_follower_snapshots(v, tmp_path)
        last = propose_sync(leader, [rec.NoOp()])
        wait_for(lambda: v.quorums[follower_id].image.last_offset >= last, "the follower")
        v.quorums[follower_id].stop()
        follower = v.start(follower_id)
        wait_for(lambda: bool(v.recorders[follower_id].snapshots), "the snapshot to be loaded")
        wait_for(lambda: follower.image == leader.image, "the same image")
        assert len(follower.image.brokers) == 20


@pytest.mark.integration
def test_a_voter_whose_snapshot_does_not_load_halts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged snapshot (or one of a newer build) was logged by pysyncobj and the voter went
    on applying nothing, ever, though it could lead the quorum. It halts now; the snapshot's
    CRC-32C catches a flipped byte, which loaded as another image."""
    halts: list[BaseException] = []
    monkeypatch.setattr(quorum_module, "_halt_on_snapshot_error", halts.append)
    with snapshotting_voters(tmp_path) as v:
        _, follower_id, snapshot = a_follower_snapshots(v, tmp_path)
        v.quorums[follower_id].stop()
        damaged = bytearray(snapshot.read_bytes())
        damaged[len(damaged) // 2] ^= 0x01
        snapshot.write_bytes(bytes(damaged))
        v.start(follower_id)
        wait_for(lambda: bool(halts), "the voter to halt")
        assert "CRC-32C" in str(halts[0])
        assert not v.recorders[follower_id].snapshots


@pytest.mark.parametrize(
    ("field", "value"), [("offset", float("inf")), ("offset", True), ("cluster", [1])]
)
def test_a_snapshot_whose_fields_are_of_the_wrong_kind_is_refused(field: str, value: Any) -> None:
    """``int(inf)`` raised OverflowError and ``TCPNode(1)`` AttributeError, neither of them a
    snapshot error: the voter that should have halted went on applying nothing."""
    body: dict[str, Any] = {
        "version": 1,
        "offset": 7,
        "records": [],
        "entries": [[b"", 9, 2], [b"", 8, 2]],
        "cluster": ["127.0.0.1:1"],
        field: value,
    }
    with pytest.raises(ValueError, match=field if field == "offset" else "voters"):
        quorum_module._parse_snapshot(msgpack.packb(body, use_bin_type=True))


def test_a_version_1_snapshot_without_its_crc_is_still_read() -> None:
    records: list[rec.MetadataRecord] = [rec.ClusterId("c"), rec.NoOp()]
    body: dict[str, Any] = {
        "version": 1,
        "offset": 7,
        "records": [rec.encode(r) for r in records],
        "entries": [[b"", 9, 2], [b"", 8, 2]],
        "cluster": ["127.0.0.1:1"],
    }
    snapshot = quorum_module._parse_snapshot(msgpack.packb(body, use_bin_type=True))
    assert (snapshot.offset, snapshot.records, snapshot.last[1]) == (7, records, 9)
    body["version"] = 3
    with pytest.raises(ValueError, match="version"):
        quorum_module._parse_snapshot(msgpack.packb(body, use_bin_type=True))


@pytest.mark.integration
def test_a_voter_behind_the_leaders_log_start_installs_the_leaders_snapshot(
    tmp_path: Path,
) -> None:
    """A voter that was down while the others snapshotted and dropped the entries it misses
    catches up through the snapshot the leader sends it in parts (the last part is the empty
    string, which the restricted loader must accept), then replays what follows."""
    with snapshotting_voters(tmp_path) as v:
        leader = v.leader()
        propose_sync(leader, [rec.ClusterId("snap")])
        lagging = next(i for i, q in v.quorums.items() if q is not leader)
        behind = v.quorums[lagging].status().last_applied
        v.quorums[lagging].stop()
        v.register_brokers(leader, 40, padding=2000)  # a snapshot of several parts

        def log_start() -> int:
            status = leader.status()
            return status.commit_index - status.log_size

        wait_for(lambda: log_start() > behind + 1, "the leader to drop the entries it missed")
        voter = v.start(lagging)
        wait_for(
            lambda: any(o > behind + 1 for o in v.recorders[lagging].snapshots),
            "the lagging voter to install the leader's snapshot",
        )
        last = propose_sync(leader, [rec.NoOp()])
        wait_for(lambda: voter.image.last_offset >= last, "the voter to follow on")
        assert voter.image == leader.image
        assert len(voter.image.brokers) == 40


class _Mkdir:
    """Unpickled, it would create ``path``: what a hostile frame to the quorum port may carry."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the voter closes ``s`` (within its timeout), whatever it sent first (a voter
    that takes an address names its cluster on the connection before anything else)."""
    while True:
        if not s.recv(4096):
            return True


def quorum_frame(message: Any) -> bytes:
    """A frame as pysyncobj's transport sends one: native int length, zlib'd pickle."""
    data = zlib.compress(pickle.dumps(message, 2), 3)
    return struct.pack("i", len(data)) + data


@pytest.mark.integration
def test_a_frame_naming_anything_but_plain_data_runs_nothing_and_the_quorum_goes_on(
    tmp_path: Path,
) -> None:
    """pysyncobj unpickles every frame that reaches the quorum port. A frame that would call
    os.mkdir, sent first on a connection (where a voter's address belongs) or after the
    address of a client that is no voter, is refused before anything runs and its connection
    is closed; the voters still commit, including a batch over pysyncobj's 64 KiB entry size,
    which travels as a pickled transmission in parts through the same restricted loader.
    (Forged Raft messages of plain data, or a connection claiming a voter's address, are
    another matter: the port is unauthenticated and must stay private.)"""
    marker = tmp_path / "unpickled"
    with running_quorum(tmp_path / "q") as quorums:
        wait_for(lambda: any(q.status().is_leader for q in quorums.values()), "a leader")
        for q in quorums.values():
            me = q.voters[q.node_id]
            for frames in ([_Mkdir(marker)], ["127.0.0.1:1", _Mkdir(marker)]):
                with socket.create_connection((me.host, me.port), timeout=5) as s:
                    s.sendall(b"".join(quorum_frame(m) for m in frames))
                    s.settimeout(5)
                    assert closed_by_peer(s), "the connection is closed"
        assert not marker.exists()
        leader = next(q for q in quorums.values() if q.status().is_leader)
        offset = propose_sync(leader, [rec.ClusterId("c" * 70_000)])
        wait_for(
            lambda: all(q.status().commit_index >= offset for q in quorums.values()),
            "every voter to commit after the hostile frames",
        )
        assert not marker.exists()


@pytest.mark.integration
def test_a_stranger_naming_a_voter_does_not_cut_that_voters_link(tmp_path: Path) -> None:
    """Between two voters only the one with the greater address connects (pysyncobj's
    ``_shouldConnect``), so a connection naming the other one at that voter is never the other
    voter. pysyncobj put it in place of the voter's own outgoing connection and later
    reconnected with it, without the voter's address as its first message: the peer closed
    every such connection and the link stayed down for good (with both of a leader's links cut,
    nothing committed). Each ordered pair is tried: every link comes back and commits go on."""
    with running_quorum(tmp_path / "q") as quorums:
        wait_for(
            lambda: all(len(q.status().connected) == 2 for q in quorums.values()),
            "every voter connected to both others",
        )
        for q in quorums.values():
            me = q.voters[q.node_id]
            for other in q.voters.values():
                if other.node_id == q.node_id:
                    continue
                with socket.create_connection((me.host, me.port), timeout=5) as s:
                    s.sendall(quorum_frame(other.address) + quorum_frame("not a dict"))
                    s.settimeout(5)
                    assert closed_by_peer(s), f"the connection naming {other.address} is closed"
        wait_for(
            lambda: all(len(q.status().connected) == 2 for q in quorums.values()),
            "every voter connected to both others again",
        )
        # The cut connections may have started an election.
        wait_for(lambda: any(q.status().is_leader for q in quorums.values()), "a leader")
        leader = next(q for q in quorums.values() if q.status().is_leader)
        offset = propose_sync(leader, [rec.ClusterId("after-the-strangers")])
        wait_for(
            lambda: all(q.status().commit_index >= offset for q in quorums.values()),
            "every voter to commit after the strangers",
        )


@pytest.mark.integration
def test_a_voter_of_another_cluster_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Voter 3 is given this quorum's voters but another cluster's id (a copied data
    directory, or a wrong controller.quorum.voters): its connections are refused as KRaft
    refuses a request with another cluster id (INCONSISTENT_CLUSTER_ID), so it neither takes
    part in elections nor receives the log; voters 1 and 2 commit without it."""
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorums: dict[int, MetadataQuorum] = {}
    try:
        for v in voters:
            quorums[v.node_id] = MetadataQuorum(
                v.node_id,
                voters,
                tmp_path / f"n{v.node_id}",
                Recorder(),
                cluster_id="another-cluster" if v.node_id == 3 else CLUSTER_ID,
            )
            quorums[v.node_id].start()
        wait_for(lambda: quorums[1].status().is_leader or quorums[2].status().is_leader, "a leader")
        leader = next(q for q in quorums.values() if q.status().is_leader)
        offset = propose_sync(leader, [rec.ClusterId(CLUSTER_ID)])
        wait_for(
            lambda: all(quorums[n].status().commit_index >= offset for n in (1, 2)),
            "voters 1 and 2 to commit",
        )
        wait_for(
            lambda: any("INCONSISTENT_CLUSTER_ID" in r.getMessage() for r in caplog.records),
            "a refused connection",
        )
        # Connections flicker up before the other end refuses them: the log is what tells.
        stranger = quorums[3].status()
        assert stranger.commit_index < offset and not stranger.is_leader, stranger
        assert 3 not in leader.status().follower_match_index or (
            leader.status().follower_match_index[3] < offset
        )
    finally:
        for q in quorums.values():
            q.stop()


@pytest.mark.integration
def test_plain_data_of_the_wrong_shape_closes_its_connection_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Frames of plain data that are no voter's handshake or that a voter would never send:
    pysyncobj raised on them out of its tick ("unhashable type", KeyError) and skipped the rest
    of that tick's Raft work, or took the connection as a non-voting replica. Each now closes
    its own connection, nothing escapes a tick, and the voters go on committing."""
    with running_quorum(tmp_path / "q") as quorums:
        wait_for(lambda: any(q.status().is_leader for q in quorums.values()), "a leader")
        leader = next(q for q in quorums.values() if q.status().is_leader)
        follower = next(q for q in quorums.values() if q is not leader)
        for q in (leader, follower):
            me = q.voters[q.node_id]
            other = next(v.address for v in q.voters.values() if v.node_id != q.node_id)
            sequences: list[list[Any]] = [
                [{"type": "append_entries"}],  # a dict where an address belongs
                [[["status"]]],  # a utility command that is not a string
                [[]],
                ["readonly"],  # a non-voting replica: this cluster runs none
                [["add", "127.0.0.1:9"]],  # membership is fixed by config
                [["set_version", 99]],
                # Leadership moved by anyone who could connect: the voter's own secret only.
                [["transfer", ""]],
                [["transfer", "", "not-the-secret"]],
                [["status", "not-the-secret"]],
                [["status", "\u00e9"]],  # not ASCII: the comparison raised out of the tick
                [other, {"type": CLUSTER_ID_MESSAGE, "cluster_id": "another-cluster"}],
                [other, "not a dict"],
                [other, {"type": "request_vote"}],  # no term
                [other, {"type": "append_entries", "term": "x"}],
            ]
            if q is leader:  # messages only a leader reads, without their fields
                sequences += [
                    [other, {"type": "next_node_idx", "term": 0}],
                    [other, {"type": "apply_command", "term": 0}],
                ]
            for frames in sequences:
                with socket.create_connection((me.host, me.port), timeout=5) as s:
                    s.sendall(b"".join(quorum_frame(m) for m in frames))
                    s.settimeout(5)
                    assert closed_by_peer(s), f"the connection that sent {frames} is closed"
            # A list nested 2,000 deep (pickled by hand: pickle.dumps recurses): its repr in
            # the log line raised RecursionError out of the tick, the connection left open.
            deep = zlib.compress(b"\x80\x02" + b"]" * 2000 + b"N" + b"a" * 2000 + b".", 3)
            with socket.create_connection((me.host, me.port), timeout=5) as s:
                s.sendall(struct.pack("i", len(deep)) + deep)
                s.settimeout(5)
                assert closed_by_peer(s), "the connection that sent a deep list is closed"
        offset = propose_sync(leader, [rec.ClusterId("after-the-garbage")])
        wait_for(
            lambda: all(q.status().commit_index >= offset for q in quorums.values()),
            "every voter to commit after the garbage",
        )
    raised = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert raised == []
    closed = [r.getMessage() for r in caplog.records if "quorum: closing" in r.getMessage()]
    assert len(closed) >= 2 * 15 + 2, closed
