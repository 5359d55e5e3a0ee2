"""A voter keeps the log entries it holds when a leader resends from an older index.

pysyncobj's follower deleted every entry after the AppendEntries' ``prevLogIdx`` before it
appended the leader's, equal ones included: the chaos runs logged "truncating already-applied
log entries" after connection resets. ``_MetadataSyncObj`` rewrites such a message so that only
entries that conflict with the leader's (or are neither the leader's nor committed) go, as
Raft's receiver rule says. The voter here is a real ``_MetadataSyncObj`` with its journal on
disk, not ticking: each message is handed to it as its transport would, on this thread.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pysyncobj.config
import pysyncobj.pickle
import pytest
from pysyncobj import SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import SyncObj, SyncObjException

from kcoord.raft import quorum as quorum_module
from kcoord.raft import records as rec
from kcoord.raft.image import MetadataImage
from kcoord.raft.quorum import MAX_TERM, MetadataQuorum, Voter, _MetadataSyncObj, encode_batch
from tests.portpick import free_ports

CLUSTER_ID = "kcoord-test"


class _Quiet:
    def on_committed(self, offset: int, records: list[rec.MetadataRecord]) -> None:
        pass

    def on_snapshot_loaded(
        self, offset: int, records: list[rec.MetadataRecord], image: object
    ) -> None:
        pass

    def on_state_changed(self) -> None:
        pass


def follower(tmp_path: Path, *, snapshots: bool = False) -> _MetadataSyncObj:
    """Voter 1 of three (it binds its own port; the others are never reached); with
    ``snapshots``, it keeps its snapshot in a file as ``MetadataQuorum.start`` has it."""
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)
    files: dict[str, Any] = {}
    if snapshots:
        files = {
            "fullDumpFile": str(tmp_path / "snapshot"),
            "serializer": quorum._write_snapshot,
            "deserializer": quorum._read_snapshot,
        }
    conf = SyncObjConf(
        autoTick=False,
        # Its port is never reached: the OS picks one, so the constructor's bind cannot wait
        # on a port another test process took since free_ports released it.
        bindAddress="127.0.0.1:0",
        journalFile=str(tmp_path / "journal"),
        dynamicMembershipChange=False,
        appendEntriesUseBatch=False,
        **files,
    )
    partners = [v.address for v in voters[1:]]
    return _MetadataSyncObj(quorum, voters[0].address, partners, conf)


def leader_of(voter: _MetadataSyncObj) -> TCPNode:
    """One of the partners: the leader every message here comes from."""
    return next(iter(sorted(voter.otherNodes, key=lambda n: n.address)))


def entry(index: int, term: int) -> tuple[bytes, int, int]:
    return (b"\x01" + f"{index}@{term}".encode(), index, term)  # pysyncobj's NO_OP type


def append(
    voter: _MetadataSyncObj,
    term: int,
    prev: tuple[int, int],
    entries: list[tuple[bytes, int, int]],
    commit: int,
) -> None:
    message: dict[str, Any] = {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "prevLogIdx": prev[0],
        "prevLogTerm": prev[1],
        "entries": entries,
    }
    voter._SyncObj__onMessageReceived(leader_of(voter), message)


def log_of(voter: _MetadataSyncObj) -> list[tuple[int, int]]:
    return [(e[1], e[2]) for e in voter._SyncObj__getEntries(1)]


def test_a_resend_of_held_entries_deletes_nothing_committed(tmp_path: Path) -> None:
    voter = follower(tmp_path)
    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 6)], commit=5)
        assert log_of(voter) == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
        assert voter.raftCommitIndex == 5
        # The leader resends from index 3, and this message carries only that entry (as a
        # size-limited batch does): pysyncobj alone cut the log to 3, dropping two committed
        # entries this voter had acknowledged.
        append(voter, 1, (2, 1), [entry(3, 1)], commit=5)
        assert log_of(voter) == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
        assert voter.raftCommitIndex == 5
        # New entries after held ones are appended.
        append(voter, 1, (3, 1), [entry(i, 1) for i in range(4, 8)], commit=5)
        assert log_of(voter)[-3:] == [(5, 1), (6, 1), (7, 1)]
    finally:
        voter.destroy()


def test_a_short_resend_keeps_the_leaders_later_entries(tmp_path: Path) -> None:
    """The voter acknowledged 2-7 with the commit index at 3; a stale reply moved the leader
    back to 4 and its resend carried entry 4 alone (messages are capped in size). Entries 5-7
    were deleted though the leader counted them on this voter: were the rest of the resend
    lost and the leader gone, a voter without them could be elected. They are the leader's
    own (its term), and stay."""
    voter = follower(tmp_path)
    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 8)], commit=3)
        append(voter, 1, (3, 1), [entry(4, 1)], commit=3)
        assert log_of(voter) == [(1, 0)] + [(i, 1) for i in range(2, 8)]
        assert voter.raftCommitIndex == 3
    finally:
        voter.destroy()


@pytest.mark.parametrize("how", ["one message", "older term first"])
def test_a_short_resend_keeps_what_the_voter_acknowledged_to_that_leader(
    tmp_path: Path, how: str
) -> None:
    """A term-2 leader's log holds entries of term 1 (2-4) before its own (5-6); the voter
    acknowledged all of them with the commit index at 1. A size-capped resend of entry 2
    alone kept only the leader's own-term entries that directly follow: the first term-1
    entry stopped it, and 3-6 were deleted, though the leader, which never lowers a voter's
    match index, still counted them on this voter (it could commit 6 on a minority)."""
    voter = follower(tmp_path)
    try:
        if how == "one message":
            tail = [entry(2, 1), entry(3, 1), entry(4, 1), entry(5, 2), entry(6, 2)]
            append(voter, 2, (1, 0), tail, commit=1)
        else:
            append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 5)], commit=1)
            append(voter, 2, (4, 1), [entry(5, 2), entry(6, 2)], commit=1)
        held = [(1, 0), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2)]
        assert log_of(voter) == held
        append(voter, 2, (1, 0), [entry(2, 1)], commit=1)
        assert log_of(voter) == held
        # What it acknowledged to the term-2 leader counts for nothing to a later one.
        append(voter, 3, (1, 0), [entry(2, 1)], commit=1)
        assert log_of(voter) == [(1, 0), (2, 1)]
    finally:
        voter.destroy()


def test_conflicting_and_unverified_entries_still_go(tmp_path: Path) -> None:
    voter = follower(tmp_path)
    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 8)], commit=4)
        # A new leader (term 2) whose log differs from index 6 on: 6 and 7 were never
        # committed, and go.
        append(voter, 2, (5, 1), [entry(6, 2)], commit=4)
        assert log_of(voter)[-3:] == [(4, 1), (5, 1), (6, 2)]
        # It holds 5 and 6 already; nothing above 6 is the leader's or committed.
        append(voter, 2, (4, 1), [entry(5, 1), entry(6, 2)], commit=6)
        assert log_of(voter)[-2:] == [(5, 1), (6, 2)]
        assert voter.raftCommitIndex == 6
        # A message whose previous entry does not match is refused, as before.
        append(voter, 2, (6, 1), [entry(7, 2)], commit=6)
        assert log_of(voter)[-1] == (6, 2)
        # A deposed leader's message (term 1) changes nothing.
        append(voter, 1, (1, 0), [entry(2, 1)], commit=1)
        assert log_of(voter)[-2:] == [(5, 1), (6, 2)]
    finally:
        voter.destroy()


def parts_as_pysyncobj_sends_them(
    big: tuple[bytes, int, int], batch_size: int
) -> list[tuple[str, bytes]]:
    """pysyncobj 0.3.17's leader (``__sendAppendEntries``): the pickled entry cut every
    ``batch_size`` bytes, each part labelled by comparing with the *command's* length."""
    pickled = pysyncobj.pickle.dumps(big)
    parts = []
    for pos in range(0, len(pickled), batch_size):
        if pos == 0:
            kind = "start"
        elif pos + batch_size >= len(big[0]):
            kind = "finish"
        else:
            kind = "process"
        parts.append((kind, pickled[pos : pos + batch_size]))
    return parts


def entry_part(kind: str, data: Any, *, commit: int, prev: int) -> dict[str, Any]:
    """A part of an entry sent in parts by the leader of term 1, after entry ``prev``."""
    return {
        "type": "append_entries",
        "transmission": kind,
        "data": data,
        "term": 1,
        "commit_index": commit,
        "prevLogIdx": prev,
        "prevLogTerm": 1,
    }


def test_an_entry_sent_in_parts_is_appended_once_its_last_part_arrives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last cut falls in the pickle's own bytes: pysyncobj's leader labels the part
    before the last "finish" too, and pysyncobj's follower raised "pickle data was truncated"
    on it. Now the entry is appended from the real last part, with nothing raised."""
    voter = follower(tmp_path)
    try:
        append(voter, 1, (1, 0), [entry(2, 1)], commit=2)
        batch_size = 1000
        big = (b"\x01" + b"x" * (3 * batch_size - 10), 3, 1)
        parts = parts_as_pysyncobj_sends_them(big, batch_size)
        assert [kind for kind, _ in parts] == ["start", "process", "finish", "finish"]
        hostile: list[tuple[str, Any]] = [("process", 10**12)]  # no bytes(10**12) is made
        for kind, data in hostile + parts:
            message = entry_part(kind, data, commit=2, prev=2)
            voter._SyncObj__onMessageReceived(leader_of(voter), message)
        assert log_of(voter) == [(1, 0), (2, 1), (3, 1)]
        assert voter._SyncObj__getEntries(3, 1)[0][0] == big[0]
        # A later entry sent in parts, labelled right, is appended as well.
        bigger = (b"\x01" + b"y" * (2 * batch_size), 4, 1)
        for kind, data in parts_as_pysyncobj_sends_them(bigger, batch_size):
            message = entry_part(kind, data, commit=3, prev=3)
            voter._SyncObj__onMessageReceived(leader_of(voter), message)
        assert log_of(voter)[-1] == (4, 1)
        assert voter.raftCommitIndex == 3
        assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    finally:
        voter.destroy()


@pytest.mark.parametrize("bad", [(2, 2**64), (2, MAX_TERM + 1), (-5, 1), ("2", 1)])
def test_an_entry_with_numbers_out_of_range_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: tuple[Any, Any]
) -> None:
    """An entry whose term is past the epoch's int32 (or whose index is not an offset)
    closes its sender's connection, plain or sent in parts: a term of 2**64 reached the
    journal, which raised out of the tick with the entry in memory and not on disk."""
    voter = follower(tmp_path)
    closed: list[Any] = []
    monkeypatch.setattr(voter, "_disconnect", closed.append)
    try:
        append(voter, 1, (1, 0), [entry(2, 1)], commit=1)
        index, term = bad
        append(voter, 1, (2, 1), [(b"\x01x", index, term)], commit=1)
        assert closed == [leader_of(voter)] and log_of(voter) == [(1, 0), (2, 1)]
        big = (b"\x01" + b"w" * 3000, index, term)
        for kind, data in parts_as_pysyncobj_sends_them(big, 1000):
            message = entry_part(kind, data, commit=1, prev=2)
            voter._SyncObj__onMessageReceived(leader_of(voter), message)
        assert closed == [leader_of(voter)] * 2 and log_of(voter) == [(1, 0), (2, 1)]
    finally:
        voter.destroy()


def test_an_entry_in_too_many_parts_closes_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty parts counted nothing against the byte bound, and summing the parts at each one
    took 14 s of the Raft thread for 30,000 of them."""
    monkeypatch.setattr(quorum_module, "MAX_ENTRY_PARTS", 10)
    voter = follower(tmp_path)
    closed: list[Any] = []
    monkeypatch.setattr(voter, "_disconnect", closed.append)
    try:
        append(voter, 1, (1, 0), [entry(2, 1)], commit=1)
        for kind in ["start"] + ["process"] * 10:
            voter._SyncObj__onMessageReceived(
                leader_of(voter), entry_part(kind, b"", commit=1, prev=2)
            )
        assert closed == [leader_of(voter)]
    finally:
        voter.destroy()


def test_a_part_from_another_sender_is_not_joined_to_an_entry_sent_in_parts(
    tmp_path: Path,
) -> None:
    """A part another voter sent (a deposed leader's, still draining) between the leader's
    parts of one entry was joined to them, and the entry never loaded."""
    voter = follower(tmp_path)
    try:
        append(voter, 1, (1, 0), [entry(2, 1)], commit=2)
        batch_size = 1000
        big = (b"\x01" + b"z" * (2 * batch_size), 3, 1)
        other = sorted(voter.otherNodes, key=lambda n: n.address)[1]
        parts = parts_as_pysyncobj_sends_them(big, batch_size)
        for i, (kind, data) in enumerate(parts):
            message = entry_part(kind, data, commit=2, prev=2)
            voter._SyncObj__onMessageReceived(leader_of(voter), message)
            if i == 0:
                stray = {**message, "transmission": "process", "data": b"stray"}
                voter._SyncObj__onMessageReceived(other, stray)
        assert log_of(voter)[-1] == (3, 1)
        assert voter._SyncObj__getEntries(3, 1)[0][0] == big[0]
    finally:
        voter.destroy()


def snapshot_part(voter: _MetadataSyncObj, term: int, part: Any, commit: int) -> None:
    """What pysyncobj's leader sends a voter behind its log start: ``serialized`` is a part of
    its snapshot file ``(data, is_first, is_last)``, or None while it has none to send."""
    message = {"type": "append_entries", "term": term, "commit_index": commit, "serialized": part}
    voter._SyncObj__onMessageReceived(leader_of(voter), message)


def test_a_snapshot_in_transfer_commits_none_of_the_entries_a_deposed_leader_left(
    tmp_path: Path,
) -> None:
    """Entries 3-5 came from a leader of term 1 that was deposed before they were committed.
    The new leader (term 2), whose log starts past this voter's, sends its snapshot: its
    parts carry the leader's commit index, 9, and pysyncobj took min(9, our log end) = 5 as
    committed, applying 3-5 (chaos seed 30). They stay uncommitted now."""
    voter = follower(tmp_path)
    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 6)], commit=2)
        assert voter.raftCommitIndex == 2
        snapshot_part(voter, 2, None, commit=9)  # no snapshot ready yet
        snapshot_part(voter, 2, (b"part of the snapshot", True, False), commit=9)
        assert voter.raftCommitIndex == 2
        assert log_of(voter) == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
        # A regular AppendEntries that verifies the log commits as before.
        append(voter, 2, (2, 1), [entry(3, 2)], commit=3)
        assert log_of(voter)[-1] == (3, 2) and voter.raftCommitIndex == 3
    finally:
        voter.destroy()


def snapshot_bytes(tmp_path: Path, index: int, term: int) -> bytes:
    """A leader's snapshot covering the entries up to ``index`` (of ``term``)."""
    leader = MetadataQuorum(
        2,
        [Voter(1, "127.0.0.1", 1), Voter(2, "127.0.0.1", 2)],
        tmp_path,
        _Quiet(),
        cluster_id=CLUSTER_ID,
    )
    leader.image = MetadataImage.from_records(index, [rec.ClusterId("kcoord-test")])
    path = tmp_path / f"leader-snapshot-{index}"
    leader._write_snapshot(str(path), (entry(index, term), entry(index - 1, term), set()))
    return path.read_bytes()


def send_snapshot(voter: _MetadataSyncObj, snapshot: bytes, term: int, commit: int) -> None:
    cut = len(snapshot) // 2
    snapshot_part(voter, term, (snapshot[:cut], True, False), commit=commit)
    snapshot_part(voter, term, (snapshot[cut:], False, True), commit=commit)


def test_a_snapshot_this_voter_is_past_is_ignored_and_a_newer_one_installed(
    tmp_path: Path,
) -> None:
    """A stale reply made the leader send its snapshot at entry 4 to a voter that had
    committed up to 6: pysyncobj installed it, dropped the journal and stepped back to 4
    ("raftCommitIndex (6) exceeds journal end (4)"). The voter keeps its log now; a snapshot
    past its commit index is installed as before."""
    (tmp_path / "voter").mkdir()
    voter = follower(tmp_path / "voter", snapshots=True)
    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 7)], commit=6)
        assert voter.raftCommitIndex == 6
        send_snapshot(voter, snapshot_bytes(tmp_path, 4, 1), term=1, commit=6)
        assert log_of(voter) == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]
        assert voter.raftCommitIndex == 6
        assert not list((tmp_path / "voter").glob("*.tmp"))
        # The leader goes on after the snapshot; the voter holds those entries already.
        append(voter, 1, (4, 1), [entry(5, 1), entry(6, 1), entry(7, 1)], commit=7)
        assert log_of(voter)[-1] == (7, 1) and voter.raftCommitIndex == 7
        send_snapshot(voter, snapshot_bytes(tmp_path, 12, 1), term=1, commit=12)
        assert [(e[1], e[2]) for e in voter._SyncObj__getEntries(11)] == [(11, 1), (12, 1)]
        assert voter.raftLastApplied == 12
    finally:
        voter.destroy()


def test_a_snapshot_from_the_leader_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's snapshot was parsed in full as it arrived (to refuse one that does not
    load, or one this voter is past) and again when pysyncobj loaded it: 2.5 s each for
    50,000 partitions, on the Raft thread (found by a review). Loaded, it is the one parsed
    on arrival."""
    (tmp_path / "voter").mkdir()
    voter = follower(tmp_path / "voter", snapshots=True)
    parsed: list[int] = []
    parse = quorum_module._parse_snapshot

    def counted(data: bytes) -> Any:
        parsed.append(len(data))
        return parse(data)

    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 4)], commit=3)
        snapshot = snapshot_bytes(tmp_path, 12, 1)
        monkeypatch.setattr(quorum_module, "_parse_snapshot", counted)
        send_snapshot(voter, snapshot, term=1, commit=12)
        assert voter.raftLastApplied == 12
        assert parsed == [len(snapshot)]
    finally:
        voter.destroy()


def test_a_failed_bind_leaves_no_socket_open(tmp_path: Path) -> None:
    """pysyncobj's server kept the socket of each failed bind and made a new one on the next
    try; a voter whose port stayed taken left one per ``bindRetryTime`` for the garbage
    collector (a CI run failed on 191 "unclosed socket" warnings)."""
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        voters = [Voter(1, "127.0.0.1", port), Voter(2, "127.0.0.1", 1), Voter(3, "127.0.0.1", 2)]
        quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)
        conf = SyncObjConf(
            autoTick=False,
            bindAddress=f"127.0.0.1:{port}",
            bindRetryTime=0.001,
            maxBindRetries=5,
            dynamicMembershipChange=False,
        )
        partners = [v.address for v in voters[1:]]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                _MetadataSyncObj(quorum, voters[0].address, partners, conf)
            except SyncObjException:
                pass
            else:
                pytest.fail("the voter bound a port another socket listens on")
            gc.collect()
        left = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert not left
    finally:
        taken.close()


def test_a_voter_killed_between_snapshot_and_journal_trim_keeps_its_later_entries(
    tmp_path: Path,
) -> None:
    """pysyncobj renames a new snapshot into place in one tick and trims the journal in the
    next. Restarted in between, the voter found a journal not starting at the snapshot and
    cleared it: entries 6 and 7, acknowledged, were gone. The trim is done at start-up now."""
    voter = follower(tmp_path, snapshots=True)
    append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 8)], commit=5)
    voter.doTick(0)  # applies up to 5
    voter.forceLogCompaction()
    voter.doTick(0)  # the snapshot (entries 4-5) is written; the trim would come next tick
    assert (tmp_path / "snapshot").exists() and len(log_of(voter)) == 7
    # Killed here: a new process on the same files (the journal's pages survive a SIGKILL).
    again = follower(tmp_path, snapshots=True)
    try:
        again.doTick(0)
        assert [(e[1], e[2]) for e in again._SyncObj__raftLog] == [(i, 1) for i in range(4, 8)]
        assert again.raftLastApplied == 5
    finally:
        again.destroy()
        voter.destroy()


def test_a_voter_whose_journal_was_trimmed_to_a_missing_snapshot_halts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj loads a snapshot only if its file is there, and then applies from entry 2,
    which a trimmed journal no longer holds: the voter applied nothing, ever, and logged
    nothing. It halts at start-up now."""
    voter = follower(tmp_path, snapshots=True)
    append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 8)], commit=5)
    voter.doTick(0)
    voter.forceLogCompaction()
    voter.doTick(0)
    voter.doTick(0)  # the trim
    assert voter._SyncObj__raftLog[0][1] > 1
    voter.destroy()
    (tmp_path / "snapshot").unlink()

    class HaltedError(Exception):
        pass

    def halt(message: str, *args: object) -> NoReturn:
        raise HaltedError(message % args)

    monkeypatch.setattr(quorum_module, "_halt", halt)
    with pytest.raises(HaltedError, match=r"snapshot .* is missing"):
        follower(tmp_path, snapshots=True)


def test_a_snapshot_older_than_one_installed_is_ignored(tmp_path: Path) -> None:
    """A snapshot at 6 was installed while the commit index stayed at 3 (its parts commit
    nothing: see the test above); a second one at 5 passed the check against the commit
    index, and the applied state stepped back from 6 to 5, the node's image with it."""
    (tmp_path / "voter").mkdir()
    voter = follower(tmp_path / "voter", snapshots=True)
    try:
        # Entries 4-9 of a deposed leader of term 1; the snapshots are of term 2's leader.
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 10)], commit=3)
        send_snapshot(voter, snapshot_bytes(tmp_path, 6, 2), term=2, commit=9)
        assert voter.raftLastApplied == 6
        send_snapshot(voter, snapshot_bytes(tmp_path, 5, 2), term=2, commit=9)
        assert voter.raftLastApplied == 6
    finally:
        voter.destroy()


def test_a_snapshot_ending_at_an_entry_this_log_holds_keeps_the_entries_after_it(
    tmp_path: Path,
) -> None:
    """Raft's InstallSnapshot: "if an existing log entry has the same index and term as the
    snapshot's last included entry, retain log entries following it". The voter acknowledged
    entries 2-9 but has heard of commits up to 3 only when the leader, moved back by a stale
    reply, sends its snapshot at 6; pysyncobj dropped 7-9, which the leader may have counted
    towards a commit. They stay, and the leader's next AppendEntries commits them."""
    (tmp_path / "voter").mkdir()
    voter = follower(tmp_path / "voter", snapshots=True)
    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 10)], commit=3)
        send_snapshot(voter, snapshot_bytes(tmp_path, 6, 1), term=1, commit=9)
        assert log_of(voter) == [(1, 0)] + [(i, 1) for i in range(2, 10)]
        assert voter.raftCommitIndex == 3
        append(voter, 1, (6, 1), [], commit=9)
        assert voter.raftCommitIndex == 9 and log_of(voter)[-1] == (9, 1)
    finally:
        voter.destroy()


def test_snapshot_parts_from_another_sender_or_an_old_term_are_not_put_together(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The parts of one snapshot come from one leader in one term. A part of a deposed
    leader's snapshot, arriving between the new leader's, is not joined to them: the
    snapshot judged (here: ending at an entry this log holds, so ignored) is the leader's."""
    (tmp_path / "voter").mkdir()
    voter = follower(tmp_path / "voter", snapshots=True)
    try:
        append(voter, 2, (1, 0), [entry(i, 2) for i in range(2, 10)], commit=3)
        snapshot = snapshot_bytes(tmp_path, 6, 2)
        cut = len(snapshot) // 2
        snapshot_part(voter, 2, (snapshot[:cut], True, False), commit=9)
        stale = {
            "type": "append_entries",
            "term": 1,
            "commit_index": 9,
            "serialized": (b"garbage of term 1", False, False),
        }
        voter._SyncObj__onMessageReceived(leader_of(voter), stale)
        other = sorted(voter.otherNodes, key=lambda n: n.address)[1]
        from_other = {**stale, "term": 2, "serialized": (b"garbage", False, False)}
        voter._SyncObj__onMessageReceived(other, from_other)
        with caplog.at_level(logging.INFO, logger="kcoord.raft.quorum"):
            snapshot_part(voter, 2, (snapshot[cut:], False, True), commit=9)
        assert "ignored the leader's snapshot ending at entry 6" in caplog.text
        assert log_of(voter) == [(1, 0)] + [(i, 2) for i in range(2, 10)]
        assert voter.raftCommitIndex == 3
    finally:
        voter.destroy()


def test_a_snapshot_that_does_not_load_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """pysyncobj renamed a snapshot it could not load over the voter's, logged the failure,
    and answered success with the voter's own log end, which the leader took for a match."""
    (tmp_path / "voter").mkdir()
    voter = follower(tmp_path / "voter", snapshots=True)
    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 6)], commit=2)
        good = msgpack.unpackb(snapshot_bytes(tmp_path, 9, 2), raw=False)
        bad = msgpack.packb({**good, "version": 99}, use_bin_type=True)
        send_snapshot(voter, bad, term=2, commit=9)
        assert "refused the leader's snapshot" in caplog.text
        assert not (tmp_path / "voter" / "snapshot").exists()
        assert log_of(voter) == [(1, 0)] + [(i, 1) for i in range(2, 6)]
        assert voter.raftCommitIndex == 2
    finally:
        voter.destroy()


def test_a_snapshot_from_the_leader_is_synced_before_it_replaces_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader re-elected in a later term goes on with the same transfer; the last part's
    file is synced before pysyncobj renames it into place, and the snapshot again before
    the journal is trimmed to it."""
    (tmp_path / "voter").mkdir()
    voter = follower(tmp_path / "voter", snapshots=True)
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    try:
        append(voter, 1, (1, 0), [entry(i, 1) for i in range(2, 4)], commit=2)
        snapshot = snapshot_bytes(tmp_path, 12, 1)
        cut = len(snapshot) // 2
        monkeypatch.setattr(os, "fsync", recording_fsync)
        snapshot_part(voter, 1, (snapshot[:cut], True, False), commit=12)
        snapshot_part(voter, 2, (snapshot[cut:], False, True), commit=12)
        assert voter.raftLastApplied == 12
        # The new term and vote first, then the snapshot, then the trimmed journal.
        assert synced == [
            *("journal.meta.tmp", "voter"),
            *("snapshot.1.tmp", "snapshot", "voter"),
            *("journal.tmp", "voter"),
        ]
    finally:
        monkeypatch.undo()
        voter.destroy()


def test_an_unexpected_error_applying_a_batch_halts_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the refusals every node makes alike are skipped; anything else raised out of
    pysyncobj's tick, which retried the entry every tick and skipped the rest of it: every
    voter wedged, processes up. It halts, as Kafka's raft IO thread does on a fatal fault."""
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)

    def broken(image: MetadataImage, offset: int, records: Any) -> None:
        raise KeyError("a replay bug")

    class HaltedError(Exception):
        pass

    def halt(offset: int, error: BaseException) -> NoReturn:
        raise HaltedError(offset, error)

    monkeypatch.setattr(MetadataImage, "apply_batch", broken)
    monkeypatch.setattr(quorum_module, "_halt_on_apply_error", halt)
    with pytest.raises(HaltedError) as halted:
        quorum._apply_command_bytes(7, encode_batch([rec.FenceBroker(1, 1)], 1), 1)
    assert halted.value.args[0] == 7 and isinstance(halted.value.args[1], KeyError)


def test_nothing_is_applied_before_the_snapshot_is_loaded(tmp_path: Path) -> None:
    """pysyncobj applies the journal on every tick while its port is not bound, and loads the
    snapshot at its first tick with the port bound: a voter restarted with its journal not
    yet trimmed to the snapshot applied entries, then the older snapshot, then the entries
    after it again (a review's probe: committed 3-6, snapshot 4, committed 5-6)."""
    voter = follower(tmp_path)
    try:
        append(voter, 1, (1, 0), [entry(2, 1), entry(3, 1)], commit=3)
        assert voter._SyncObj__needLoadDumpFile  # no tick with the port bound yet
        applied = voter.raftLastApplied
        voter._SyncObj__applyLogEntries()
        assert voter.raftLastApplied == applied
        voter._SyncObj__needLoadDumpFile = False  # as the first ready tick leaves it
        voter._SyncObj__applyLogEntries()
        assert voter.raftLastApplied == 3
    finally:
        voter.destroy()


def test_applying_passes_on_whether_append_entries_should_go_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj's tick sends AppendEntries at once when applying says so (the new commit
    index, to the followers); the override dropped that answer, and followers learned of
    each commit only at the next heartbeat."""
    voter = follower(tmp_path)
    try:
        monkeypatch.setattr(SyncObj, "_SyncObj__applyLogEntries", lambda self: True)
        voter._SyncObj__needLoadDumpFile = False
        assert voter._SyncObj__applyLogEntries() is True
        voter._SyncObj__needLoadDumpFile = True
        assert voter._SyncObj__applyLogEntries() is False
    finally:
        voter.destroy()


def test_the_pre_vote_reads_the_election_deadline_on_pysyncobjs_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj keeps its election deadline on CLOCK_MONOTONIC_RAW; the pre-vote read it
    against time.monotonic, which NTP slews, so the two drift apart by every correction. Ahead
    by more than an election timeout, a follower that had just heard its leader took the
    deadline for passed and dropped its leader on every tick."""
    voter = follower(tmp_path)
    append(voter, 1, (0, 0), [entry(1, 1)], 0)  # the leader of term 1 is heard
    leader = leader_of(voter)
    assert voter._SyncObj__raftLeader == leader
    monkeypatch.setattr(voter, "_SyncObj__connectedToAnyone", lambda: True)
    monkeypatch.setattr(voter._SyncObj__transport, "_ready", True)
    monkeypatch.setattr(voter, "_SyncObj__needLoadDumpFile", False)  # no snapshot to load
    steady = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: steady() + 5.0)  # slewed 5 s ahead
    voter._pre_vote_or_elect()
    assert voter._SyncObj__raftLeader == leader
    voter.destroy()


class _MovingTerm:
    """pysyncobj's state as its thread changes it under a reader: each read of the term is
    the next of ``terms``; the node leads while the term is the first."""

    def __init__(self, terms: list[int]) -> None:
        self.terms = terms
        self.raftCommitIndex = 0
        self.raftLastApplied = 0

    def _getTerm(self) -> int:  # noqa: N802 (pysyncobj's name)
        return self.terms.pop(0) if len(self.terms) > 1 else self.terms[0]

    def _getLeader(self) -> None:  # noqa: N802
        return None

    def _isLeader(self) -> bool:  # noqa: N802
        return len(self.terms) > 2

    def getStatus(self) -> dict[str, Any]:  # noqa: N802
        return {}


def test_status_reads_the_leadership_and_the_term_of_one_moment(tmp_path: Path) -> None:
    """is_leader and the term were read apart: a leader of term 5 deposed between the reads
    reported itself the leader of term 6. (review helper-207)"""
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)
    quorum._sync = _MovingTerm([5, 6, 6, 6, 6])  # type: ignore[assignment]
    status = quorum.status()
    assert (status.is_leader, status.epoch) == (False, 6)
    quorum._sync = _MovingTerm([5, 5, 5, 5])  # type: ignore[assignment]
    status = quorum.status()
    assert (status.is_leader, status.epoch) == (True, 5)


class _GrowingIndexes(_MovingTerm):
    """pysyncobj's status read while its thread adds a voter's indexes (its first election)."""

    def __init__(self, fails: int) -> None:
        super().__init__([5, 5, 5])
        self.fails = fails

    def getStatus(self) -> dict[str, Any]:  # noqa: N802
        if self.fails:
            self.fails -= 1
            raise RuntimeError("dictionary changed size during iteration")
        return {"log_len": 7}


def test_status_reads_again_when_pysyncobjs_indexes_change_under_it(tmp_path: Path) -> None:
    """pysyncobj's getStatus iterates the leader's indexes, which its thread fills when this
    voter first leads: "dictionary changed size during iteration" escaped status() and failed
    the node's start, a hand-over or a Metadata answer (found by a review)."""
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)
    quorum._sync = _GrowingIndexes(fails=2)  # type: ignore[assignment]
    assert quorum.status().log_size == 7


def test_a_batch_no_voter_would_take_is_refused_by_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reported as not committed, a batch too large read as a lost leadership: the controller
    decided it again, and again, until the client's timeout. It raises, once, and nothing is
    reported through ``on_done``."""
    monkeypatch.setattr(quorum_module, "MAX_QUORUM_MESSAGE_BYTES", 1 << 16)
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)
    told: list[Any] = []
    big = rec.Topic("t", "T" * 22, {"retention.ms": "1" + "0" * 40_000})
    with pytest.raises(quorum_module.BatchTooLargeError):
        quorum.propose([big], lambda offset, error: told.append((offset, error)), epoch=1)
    assert told == []
    quorum.propose([rec.NoOp()], lambda offset, error: told.append((offset, error)), epoch=1)
    assert told == [(None, "quorum is stopped")]


def test_a_snapshot_is_written_off_the_raft_thread_from_a_copy_of_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj calls the serializer on the Raft thread, which sent no AppendEntries while a
    snapshot of 50,000 partitions was encoded and synced (1.3 s: the followers elected
    another leader every few minutes; found by a review). The Raft thread only copies the
    image; a writer thread writes it, renames it into place, and only then says SUCCESS (so
    that pysyncobj trims the journal to it). Changes applied meanwhile are not in it, and an
    interrupted write's temporary file is never put in place."""
    states = pysyncobj.config.SERIALIZER_STATE
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)
    quorum.image = MetadataImage.from_records(7, [rec.ClusterId(CLUSTER_ID)])
    final = tmp_path / "snapshot"
    (tmp_path / "snapshot.tmp").write_bytes(b"an interrupted write's")
    release = threading.Event()
    write = quorum._write_snapshot

    def held(filename: str, raft_data: Any, image: Any = None) -> None:
        assert threading.current_thread() is not threading.main_thread()
        release.wait(10)
        write(filename, raft_data, image)

    monkeypatch.setattr(quorum, "_write_snapshot", held)
    quorum._serialize_in_background(str(final) + ".tmp", (entry(7, 1), entry(6, 1), set()))
    assert not (tmp_path / "snapshot.tmp").exists()
    assert quorum._snapshot_state() == states.SERIALIZING
    quorum.image.apply_batch(8, [rec.NoOp()])  # applied after the copy
    release.set()
    writer = quorum._snapshot_writer
    assert writer is not None
    writer.join(10)
    assert quorum._snapshot_state() == states.SUCCESS
    assert quorum._snapshot_state() == states.NOT_SERIALIZING  # said once
    snapshot = quorum_module._parse_snapshot(final.read_bytes())
    assert snapshot.offset == 7 and snapshot.image.cluster_id == CLUSTER_ID


def test_a_leaders_snapshot_installed_during_a_write_is_not_replaced_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread renamed its file into place whenever it was done: a snapshot of the
    leader's, installed meanwhile on the Raft thread, was replaced by this voter's older one,
    and at its next start the voter lost entries it had acknowledged (found by a review). The
    Raft thread renames it, and not once a newer snapshot was installed."""
    states = pysyncobj.config.SERIALIZER_STATE
    voters = [Voter(i + 1, "127.0.0.1", port) for i, port in enumerate(free_ports(3))]
    quorum = MetadataQuorum(1, voters, tmp_path, _Quiet(), cluster_id=CLUSTER_ID)
    quorum.image = MetadataImage.from_records(7, [rec.ClusterId(CLUSTER_ID)])
    final = tmp_path / "snapshot"
    leaders = MetadataQuorum(2, voters, tmp_path / "leader", _Quiet(), cluster_id=CLUSTER_ID)
    leaders.image = MetadataImage.from_records(20, [rec.ClusterId(CLUSTER_ID)])
    release = threading.Event()
    write = quorum._write_snapshot

    def held(filename: str, raft_data: Any, image: Any = None) -> None:
        release.wait(10)
        write(filename, raft_data, image)

    monkeypatch.setattr(quorum, "_write_snapshot", held)
    quorum._serialize_in_background(str(final) + ".tmp", (entry(7, 1), entry(6, 1), set()))
    leaders._write_snapshot(str(final), (entry(20, 2), entry(19, 2), set()))  # installed
    quorum._read_snapshot(str(final))
    release.set()
    writer = quorum._snapshot_writer
    assert writer is not None
    writer.join(10)
    assert quorum._snapshot_state() == states.FAILED
    assert quorum_module._parse_snapshot(final.read_bytes()).offset == 20
    assert not (tmp_path / "snapshot.writing").exists()
