"""Pre-vote (KIP-996): a voter asks whether it would be elected before it raises its term.

The voter is a real ``_MetadataSyncObj`` (see ``test_quorum_follower``), not ticking on its
own: its ticks and the messages of the other two voters are handed to it on this thread, and
what it sends is recorded instead of going out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import syncobj
from pysyncobj.node import TCPNode

from kcoord.raft import quorum
from kcoord.raft.quorum import (
    MAX_TERM,
    NEWER_TERM,
    PRE_VOTE,
    PRE_VOTE_RESPONSE,
    _MetadataSyncObj,
)
from tests.unit.raft.test_quorum_follower import append, entry, follower

Sent = list[tuple[TCPNode, dict[str, Any]]]


def recording(voter: _MetadataSyncObj, monkeypatch: pytest.MonkeyPatch) -> Sent:
    """What the voter sends from now on; it counts itself connected (its ticks try to
    connect to the others, which are not there)."""
    sent: Sent = []

    def send(node: TCPNode, message: dict[str, Any]) -> bool:
        sent.append((node, message))
        return True

    monkeypatch.setattr(voter._SyncObj__transport, "send", send)
    monkeypatch.setattr(voter, "_SyncObj__connectedToAnyone", lambda: True)
    voter._onTick(0.0)  # its first tick, which loads its snapshot (it has none)
    return sent


Recorded = tuple[_MetadataSyncObj, Sent]


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorded]:
    """A voter, and what it sends (see ``recording``)."""
    voter = follower(tmp_path)
    try:
        yield voter, recording(voter, monkeypatch)
    finally:
        voter.destroy()


def timer_runs_out(voter: _MetadataSyncObj) -> None:
    """Its election timer runs out: a round starts, and no other before the test says."""
    voter._SyncObj__raftElectionDeadline = 0
    voter._onTick(0.0)
    voter._SyncObj__raftElectionDeadline = math.inf


def others(voter: _MetadataSyncObj) -> tuple[TCPNode, TCPNode]:
    first, second = sorted(voter.otherNodes, key=lambda n: n.address)
    return first, second  # the first is the leader test_quorum_follower.append speaks for


def ask(
    voter: _MetadataSyncObj, sent: Sent, candidate: TCPNode, term: int, last: tuple[int, int]
) -> dict[str, Any]:
    """The voter's answer to a pre-vote at ``term`` from a log ending at (index, term)."""
    message = {
        "type": PRE_VOTE,
        "round": 7,
        "term": term,
        "last_log_index": last[0],
        "last_log_term": last[1],
    }
    voter._SyncObj__onMessageReceived(candidate, message)
    node, answer = sent[-1]
    assert node == candidate and answer["type"] == PRE_VOTE_RESPONSE and answer["round"] == 7
    return answer


def test_a_pre_vote_is_granted_only_without_a_live_leader_to_an_up_to_date_log(
    recorded: Recorded,
) -> None:
    voter, sent = recorded
    leader, candidate = others(voter)
    # Never heard from a leader: granted, and the voter's term and vote stay as they were.
    assert ask(voter, sent, candidate, 1, (1, 0))["granted"] is True
    assert (voter.raftCurrentTerm, voter._SyncObj__votedForNodeId) == (0, None)
    append(voter, 1, (1, 0), [entry(2, 1)], commit=2)
    # The leader was just heard from: refused, whatever the candidate's log.
    assert ask(voter, sent, candidate, 2, (2, 1))["granted"] is False
    voter._leader_heard_at -= voter.conf.raftMinTimeout  # as long ago as an election timeout
    assert ask(voter, sent, candidate, 2, (2, 1))["granted"] is True
    # A log behind this one's, or a term that is not above it: refused, with our term.
    assert ask(voter, sent, candidate, 2, (1, 0))["granted"] is False
    assert ask(voter, sent, candidate, 2, (3, 0))["granted"] is False  # older last term
    assert ask(voter, sent, candidate, 1, (2, 1)) == {
        "type": PRE_VOTE_RESPONSE,
        "round": 7,
        "proposed": 1,
        "term": 1,
        "granted": False,
    }
    # Answering changed nothing: no term, no vote, the same leader.
    assert (voter.raftCurrentTerm, voter._SyncObj__votedForNodeId) == (1, None)
    assert voter._getLeader() == leader
    voter._SyncObj__raftState = 2  # pysyncobj's LEADER: a leader refuses
    assert ask(voter, sent, candidate, 2, (2, 1))["granted"] is False


def answer(
    voter: _MetadataSyncObj, node: TCPNode, round_: int, term: int, granted: bool, *, at: int = 0
) -> None:
    voter._SyncObj__onMessageReceived(
        node,
        {
            "type": PRE_VOTE_RESPONSE,
            "round": round_,
            "proposed": term,
            "term": at,
            "granted": granted,
        },
    )


def test_a_voter_stands_only_once_a_majority_granted_its_pre_vote(
    recorded: Recorded,
) -> None:
    voter, sent = recorded
    first, second = others(voter)
    timer_runs_out(voter)
    # pysyncobj stood at once: term 1, a RequestVote to each. Now it only asks.
    assert {m["type"] for _, m in sent} == {PRE_VOTE}
    assert {n for n, _ in sent} == {first, second} and sent[0][1]["term"] == 1
    assert (voter.raftCurrentTerm, voter._isLeader()) == (0, False)
    round_ = sent[0][1]["round"]
    answer(voter, first, round_, 1, False)
    answer(voter, second, round_ - 1, 1, True)  # an earlier round's grant counts for none
    voter._onTick(0.0)
    assert voter.raftCurrentTerm == 0 and len(sent) == 2
    answer(voter, second, round_, 1, True)  # with its own, two of three
    voter._onTick(0.0)
    assert voter.raftCurrentTerm == 1
    assert [m["type"] for _, m in sent[2:]] == ["request_vote", "request_vote"]


def test_a_round_open_when_the_leader_is_heard_again_stands_on_no_late_grant(
    recorded: Recorded,
) -> None:
    """The leader paused past the election timeout, the voter asked, the leader came back;
    a grant arriving then still counted, and the voter stood against a live leader."""
    voter, sent = recorded
    leader, other = others(voter)
    append(voter, 1, (1, 0), [entry(2, 1)], commit=2)
    timer_runs_out(voter)
    round_ = sent[-1][1]["round"]
    append(voter, 1, (2, 1), [], commit=2)  # the leader again
    answer(voter, other, round_, 2, True, at=1)
    voter._onTick(0.0)
    assert voter.raftCurrentTerm == 1 and voter._getLeader() == leader
    assert all(m["type"] != "request_vote" for _, m in sent)


def test_a_refusal_from_a_newer_term_is_taken(
    recorded: Recorded,
) -> None:
    """A voter left at a higher term (an election it lost) refuses every pre-vote at or
    below it: the asking voter takes its term and asks above it next time."""
    voter, sent = recorded
    first, _ = others(voter)
    timer_runs_out(voter)
    answer(voter, first, sent[-1][1]["round"], 1, False, at=5)
    assert (voter.raftCurrentTerm, voter._SyncObj__votedForNodeId) == (5, None)
    timer_runs_out(voter)
    assert sent[-1][1]["type"] == PRE_VOTE and sent[-1][1]["term"] == 6


def closing(voter: _MetadataSyncObj, node: TCPNode, patch: pytest.MonkeyPatch) -> list[TCPNode]:
    """The voter's connection to ``node`` is a stand-in: the list returned notes each time
    the voter closes it."""
    closed: list[TCPNode] = []

    class Connection:
        def disconnect(self) -> None:
            closed.append(node)

    patch.setattr(voter._SyncObj__transport, "_connections", {node: Connection()})
    return closed


@pytest.mark.parametrize(
    "field, value",
    [
        ("term", "1"),
        ("round", None),
        ("last_log_index", True),
        ("granted", None),
        ("term", MAX_TERM + 1),
        ("term", -1),
        ("last_log_index", 2**64),
    ],
)
def test_a_malformed_pre_vote_closes_its_connection_alone(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch, field: str, value: Any
) -> None:
    voter, sent = recorded
    _, candidate = others(voter)
    closed = closing(voter, candidate, monkeypatch)
    kind = PRE_VOTE_RESPONSE if field == "granted" else PRE_VOTE
    message = {
        "type": kind,
        "round": 1,
        "term": 1,
        "proposed": 1,
        "last_log_index": 1,
        "last_log_term": 0,
        "granted": True,
    }
    voter._SyncObj__onMessageReceived(candidate, {**message, field: value})
    assert closed == [candidate] and sent == []
    assert voter.raftCurrentTerm == 0


def test_a_leader_of_an_older_term_is_told_ours_and_steps_down(
    recorded: Recorded,
) -> None:
    """A voter whose term is above the leader's ignores its AppendEntries; without a
    RequestVote to force its term on the others (pre-vote stops it) it stayed out for good.
    It answers with its term, and a leader told of a newer one steps down to it."""
    voter, sent = recorded
    leader, _ = others(voter)
    voter._SyncObj__setCurrentTerm(5, None)
    append(voter, 3, (1, 0), [entry(2, 3)], commit=2)
    assert sent == [(leader, {"type": NEWER_TERM, "term": 5})]
    assert [e[1] for e in voter._SyncObj__getEntries(1)] == [1]  # nothing taken
    assert voter._getLeader() is None
    # Told of a newer term, a voter takes it (a leader so steps down); an older, nothing.
    voter._SyncObj__raftState = 2  # pysyncobj's LEADER
    voter._SyncObj__onMessageReceived(leader, {"type": NEWER_TERM, "term": 8})
    assert (voter.raftCurrentTerm, voter._SyncObj__votedForNodeId) == (8, None)
    assert not voter._isLeader()
    voter._SyncObj__onMessageReceived(leader, {"type": NEWER_TERM, "term": 6})
    assert voter.raftCurrentTerm == 8
    # A term out of the epoch's range is not taken (a term of 2**64, written to the journal's
    # meta, left a leader unable to write any entry, for good).
    voter._SyncObj__onMessageReceived(leader, {"type": NEWER_TERM, "term": 2**64})
    assert voter.raftCurrentTerm == 8


def test_a_deadline_running_out_between_the_pre_votes_look_and_pysyncobjs_starts_no_election(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj reads its clock again, later in the tick, for its own look at the deadline:
    one that fell between the two readings let it stand with no pre-vote. In CI an isolated
    controller so raised its term and on its return deposed the working leader. A won round
    still stands on the next tick."""
    voter, sent = recorded
    deadline = 1_000.0
    voter._SyncObj__raftElectionDeadline = deadline
    monkeypatch.setattr(quorum, "raft_clock", lambda: deadline - 0.001)  # the pre-vote's look
    monkeypatch.setattr(syncobj, "monotonicTime", lambda: deadline + 0.001)  # pysyncobj's
    voter._onTick(0.0)
    assert voter.raftCurrentTerm == 0 and sent == []
    assert voter._SyncObj__raftElectionDeadline == deadline  # put back for the next tick
    monkeypatch.setattr(quorum, "raft_clock", lambda: deadline + 0.001)
    voter._onTick(0.0)  # now the pre-vote's turn: it asks, and only asks
    assert voter.raftCurrentTerm == 0 and {m["type"] for _, m in sent} == {PRE_VOTE}
    first, _ = others(voter)
    answer(voter, first, sent[-1][1]["round"], 1, True)
    voter._onTick(0.0)
    assert voter.raftCurrentTerm == 1
    assert [m["type"] for _, m in sent[2:]] == ["request_vote", "request_vote"]


def test_a_message_typed_by_a_huge_int_closes_its_connection_alone(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The term log kept the type of each message as text before looking at it: str() of an
    int of 5,000 digits raises, out of the Raft tick, and the connection stayed open."""
    voter, sent = recorded
    _, stranger = others(voter)
    with monkeypatch.context() as patched:
        closed = closing(voter, stranger, patched)
        voter._SyncObj__onMessageReceived(stranger, {"type": 10**5000, "term": 1})
    assert closed == [stranger] and sent == [] and voter.raftCurrentTerm == 0
    # A term moved by a message names it and its sender; an election, why it stands.
    with caplog.at_level(logging.INFO, logger="kcoord.raft.quorum"):
        append(voter, 3, (0, 0), [], commit=0)
        timer_runs_out(voter)
        answer(voter, stranger, sent[-1][1]["round"], 4, True, at=3)
        voter._onTick(0.0)
    moves = [r.getMessage() for r in caplog.records if "quorum: term" in r.getMessage()]
    assert moves[0].startswith("quorum: term 0 -> 3 ('append_entries' from ")
    assert moves[1] == (
        "quorum: term 3 -> 4 (this voter stands for election: a majority granted its pre-vote)"
    )
