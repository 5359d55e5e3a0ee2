"""Fetch sessions (KIP-227) between a follower's ``FetchSessionHandler`` and the leader's
``FetchSessions``, without a network: the handler's requests go to ``resolve`` as they are."""

from __future__ import annotations

import itertools
from typing import Any

from kcoord.cluster.fetch_session import (
    FULL_EPOCH,
    FULL_PASS_INTERVAL_MS,
    NO_SESSION,
    SESSION_EVICTION_MS,
    FetchItem,
    FetchSessionHandler,
    FetchSessions,
)
from kcoord.errors import Errors

REPLICA = 2


def item(partition: int, fetch_offset: int = 0, topic: str = "t") -> FetchItem:
    return FetchItem(topic, partition, fetch_offset, 0, 0, fetch_offset, 0)


def exchange(
    handler: FetchSessionHandler,
    sessions: FetchSessions,
    items: list[FetchItem],
    now_ms: int = 0,
) -> tuple[dict[str, Any], Errors, list[FetchItem]]:
    """One request: what the follower sent, the session error, what the leader looks at."""
    request = handler.request(items)
    error, session_id, served, _ = sessions.resolve(
        REPLICA, {"replica_id": REPLICA, **request}, now_ms=now_ms
    )
    handler.handle_response({"error": int(error), "session_id": session_id, "partitions": []})
    return request, error, served


def test_a_session_sends_what_changed_and_the_leader_looks_at_what_may_have_moved() -> None:
    handler, sessions = FetchSessionHandler(), FetchSessions(itertools.count(1).__next__)
    a, b, c = item(0), item(1), item(2)

    full, error, served = exchange(handler, sessions, [a, b, c])
    assert (full["session_id"], full["session_epoch"]) == (NO_SESSION, FULL_EPOCH)
    assert [p["partition"] for p in full["partitions"]] == [0, 1, 2]
    assert error is Errors.NONE and served == [a, b, c]
    assert handler.session_id != NO_SESSION and handler.epoch == FULL_EPOCH

    # Nothing moved on either side: the request names nothing, the leader looks at nothing.
    idle, error, served = exchange(handler, sessions, [a, b, c])
    assert (idle["session_id"], idle["session_epoch"]) == (handler.session_id, 1)
    assert idle["partitions"] == [] and idle["forgotten"] == []
    assert error is Errors.NONE and served == []

    # The leader appended to c (marked dirty): looked at though the follower names nothing.
    sessions.mark(("t", 2))
    sessions.mark(("t", 9))  # not in the session: nothing to look at
    _, _, served = exchange(handler, sessions, [a, b, c])
    assert served == [c]
    _, _, served = exchange(handler, sessions, [a, b, c])
    assert served == []  # looked at once; the leader keeps it dirty only if it answered it

    # b moved, c is no longer fetched, d is new.
    b2, d = item(1, fetch_offset=5), item(3)
    moved, error, served = exchange(handler, sessions, [a, b2, d])
    assert [p["partition"] for p in moved["partitions"]] == [1, 3]
    assert moved["partitions"][0]["fetch_offset"] == 5
    assert moved["forgotten"] == [["t", 2]]
    assert moved["session_epoch"] == 4
    assert sorted(served) == sorted([b2, d])

    # Every FULL_PASS_INTERVAL_MS, every partition.
    _, _, served = exchange(handler, sessions, [a, b2, d], now_ms=FULL_PASS_INTERVAL_MS - 1)
    assert served == []
    _, _, served = exchange(handler, sessions, [a, b2, d], now_ms=FULL_PASS_INTERVAL_MS)
    assert sorted(served) == sorted([a, b2, d])
    _, _, served = exchange(handler, sessions, [a, b2, d], now_ms=2 * FULL_PASS_INTERVAL_MS - 1)
    assert served == []


def test_an_answered_partition_stays_dirty_until_a_look_finds_nothing() -> None:
    handler, sessions = FetchSessionHandler(), FetchSessions(itertools.count(1).__next__)
    a, b = item(0), item(1)
    request = handler.request([a, b])
    _, _, _, session = sessions.resolve(REPLICA, {"replica_id": REPLICA, **request})
    assert session is not None
    handler.handle_response({"error": 0, "session_id": session.session_id, "partitions": []})
    session.keep_dirty([a.tp])  # the leader answered a
    _, _, served = exchange(handler, sessions, [a, b])
    assert served == [a]
    _, _, served = exchange(handler, sessions, [a, b])
    assert served == []


def test_when_a_follower_last_fetched_a_position() -> None:
    """``fetched_at``: the session's latest request, if it holds the partition at that
    position in that leader epoch; the leader records it when the partition next changes."""
    handler, sessions = FetchSessionHandler(), FetchSessions(itertools.count(1).__next__)
    a = item(0, fetch_offset=7)
    exchange(handler, sessions, [a], now_ms=100)
    exchange(handler, sessions, [a], now_ms=250)  # names nothing
    assert sessions.fetched_at(REPLICA, a.tp, 7, 0) == 250
    assert sessions.fetched_at(REPLICA, a.tp, 6, 0) == -1  # another position
    assert sessions.fetched_at(REPLICA, a.tp, 7, 1) == -1  # another leader epoch
    assert sessions.fetched_at(REPLICA, ("t", 1), 7, 0) == -1  # not in the session
    assert sessions.fetched_at(REPLICA + 1, a.tp, 7, 0) == -1  # no session


def test_a_leader_without_the_session_makes_the_follower_start_a_full_one() -> None:
    handler = FetchSessionHandler()
    exchange(handler, FetchSessions(itertools.count(1).__next__), [item(0), item(1)])
    restarted = FetchSessions(itertools.count(100).__next__)  # the leader restarted: no sessions

    request, error, served = exchange(handler, restarted, [item(0), item(1)])
    assert request["partitions"] == []
    assert error is Errors.FETCH_SESSION_ID_NOT_FOUND and served == []
    assert handler.session_id == NO_SESSION

    request, error, served = exchange(handler, restarted, [item(0), item(1)])
    assert request["session_epoch"] == FULL_EPOCH and len(request["partitions"]) == 2
    assert error is Errors.NONE and served == [item(0), item(1)]


def test_an_epoch_out_of_step_ends_the_session() -> None:
    handler, sessions = FetchSessionHandler(), FetchSessions(itertools.count(1).__next__)
    exchange(handler, sessions, [item(0)])
    request = handler.request([item(0)])
    assert request["session_epoch"] == 1
    # The answer was lost; the follower, not knowing, would repeat epoch 1 for a request the
    # leader has taken: the leader refuses it and drops the session.
    sessions.resolve(REPLICA, {"replica_id": REPLICA, **request})
    error, _, served, _ = sessions.resolve(REPLICA, {"replica_id": REPLICA, **request})
    assert error is Errors.INVALID_FETCH_SESSION_EPOCH and served == []
    assert len(sessions) == 0


def test_a_failed_request_resets_the_follower_and_a_new_full_request_replaces_the_session() -> None:
    handler, sessions = FetchSessionHandler(), FetchSessions(itertools.count(1).__next__)
    exchange(handler, sessions, [item(0), item(1)])
    old_id = handler.session_id
    handler.request([item(0, fetch_offset=1), item(1)])  # sent; the call then failed
    handler.reset()

    request, error, served = exchange(handler, sessions, [item(0, fetch_offset=1), item(1)])
    assert request["session_epoch"] == FULL_EPOCH and len(request["partitions"]) == 2
    assert error is Errors.NONE and served == [item(0, fetch_offset=1), item(1)]
    assert handler.session_id not in (NO_SESSION, old_id)
    assert len(sessions) == 1  # one session per follower
    assert sessions.opened == 2


def test_sessionless_requests_keep_nothing_and_a_leader_without_sessions_gets_full_ones() -> None:
    sessions = FetchSessions()
    payload = {"replica_id": REPLICA, "partitions": [item(0).to_wire()]}
    assert sessions.resolve(REPLICA, payload) == (Errors.NONE, NO_SESSION, [item(0)], None)
    assert len(sessions) == 0

    handler = FetchSessionHandler()
    for _ in range(2):  # an older leader answers no session id
        request = handler.request([item(0)])
        assert request["session_epoch"] == FULL_EPOCH and len(request["partitions"]) == 1
        handler.handle_response({"partitions": []})


def test_a_full_request_that_may_not_open_a_session_is_served_sessionless() -> None:
    """The node opens sessions only for brokers it knows: what it keeps stays bounded."""
    handler, sessions = FetchSessionHandler(), FetchSessions()
    request = handler.request([item(0)])
    payload = {"replica_id": 99, **request}
    resolved = sessions.resolve(99, payload, may_open=False)
    assert resolved == (Errors.NONE, NO_SESSION, [item(0)], None)
    assert len(sessions) == 0 and sessions.opened == 0
    handler.handle_response({"error": 0, "session_id": NO_SESSION, "partitions": []})
    assert handler.request([item(0)])["session_epoch"] == FULL_EPOCH


def test_a_malformed_item_is_refused() -> None:
    sessions = FetchSessions()
    for bad in ({"topic": "t"}, {"topic": "t", "partition": "x", "fetch_offset": 0}):
        payload = {"replica_id": REPLICA, "session_epoch": FULL_EPOCH, "partitions": [bad]}
        try:
            sessions.resolve(REPLICA, payload)
        except (KeyError, ValueError):
            continue
        raise AssertionError(f"{bad} was taken")
    assert len(sessions) == 0


def test_a_follower_that_knows_what_changed_names_only_that() -> None:
    """``request_changes``: the partitions looked at are the changed ones; of those, what
    differs from the previous request is named, and what is no longer fetched is forgotten.
    Without a session the request is full."""
    handler, sessions = FetchSessionHandler(), FetchSessions(itertools.count(1).__next__)
    a, b, c = item(0), item(1), item(2)
    current = {i.tp: i for i in (a, b, c)}
    full = handler.request_changes(current, [])
    assert full["session_epoch"] == FULL_EPOCH and len(full["partitions"]) == 3
    sessions.resolve(REPLICA, {"replica_id": REPLICA, **full})
    handler.handle_response({"error": 0, "session_id": 1, "partitions": []})

    b2 = item(1, fetch_offset=4)
    current = {a.tp: a, b2.tp: b2}
    # a is looked at but did not change; b moved; c is no longer fetched. Unlooked-at
    # partitions are not compared.
    request = handler.request_changes(current, [a.tp, b2.tp, c.tp])
    assert request["session_epoch"] == 1
    assert request["partitions"] == [b2.to_wire()]
    assert request["forgotten"] == [["t", 2]]
    error, _, served, _ = sessions.resolve(REPLICA, {"replica_id": REPLICA, **request})
    assert error is Errors.NONE and served == [b2]
    handler.handle_response({"error": 0, "session_id": 1, "partitions": []})
    assert handler.request(current.values())["partitions"] == []  # the two agree


def test_a_session_unused_for_the_eviction_time_goes() -> None:
    """A broker gone for good (decommissioned, or now following elsewhere) left its session,
    and every append kept marking it (Kafka's FetchSessionCache evicts stale sessions)."""
    sessions = FetchSessions(itertools.count(1).__next__)
    gone, staying = FetchSessionHandler(), FetchSessionHandler()
    exchange(gone, sessions, [item(0)], now_ms=0)
    request = staying.request([item(1)])
    sessions.resolve(7, {"replica_id": 7, **request}, now_ms=0)
    assert len(sessions) == 2
    # The other follower keeps fetching; the first never comes back.
    for now_ms in range(0, 2 * SESSION_EVICTION_MS, SESSION_EVICTION_MS // 4):
        request = staying.request([item(1)])
        error, session_id, _, _ = sessions.resolve(7, {"replica_id": 7, **request}, now_ms=now_ms)
        staying.handle_response({"error": int(error), "session_id": session_id})
        assert error is Errors.NONE
    assert len(sessions) == 1
    # Coming back after all, it is told to start over, as after a leader restart.
    _, error, _ = exchange(gone, sessions, [item(0)], now_ms=2 * SESSION_EVICTION_MS)
    assert error is Errors.FETCH_SESSION_ID_NOT_FOUND
