"""Fetch sessions (KIP-227) between a follower's ``FetchSessionHandler`` and the leader's
``FetchSessions``, without a network: the handler's requests go to ``resolve`` as they are."""

from __future__ import annotations

import itertools
from typing import Any

from kcoord.cluster.fetch_session import (
    FULL_EPOCH,
    NO_SESSION,
    FetchItem,
    FetchSessionHandler,
    FetchSessions,
)
from kcoord.errors import Errors

REPLICA = 2


def item(partition: int, fetch_offset: int = 0, topic: str = "t") -> FetchItem:
    return FetchItem(topic, partition, fetch_offset, 0, 0, fetch_offset, 0)


def exchange(
    handler: FetchSessionHandler, sessions: FetchSessions, items: list[FetchItem]
) -> tuple[dict[str, Any], Errors, list[FetchItem]]:
    """One request: what the follower sent, the session error, what the leader serves."""
    request = handler.request(items)
    error, session_id, served = sessions.resolve(REPLICA, {"replica_id": REPLICA, **request})
    handler.handle_response({"error": int(error), "session_id": session_id, "partitions": []})
    return request, error, served


def test_a_session_sends_what_changed_and_the_leader_serves_every_partition() -> None:
    handler, sessions = FetchSessionHandler(), FetchSessions(itertools.count(1).__next__)
    a, b, c = item(0), item(1), item(2)

    full, error, served = exchange(handler, sessions, [a, b, c])
    assert (full["session_id"], full["session_epoch"]) == (NO_SESSION, FULL_EPOCH)
    assert [p["partition"] for p in full["partitions"]] == [0, 1, 2]
    assert error is Errors.NONE and served == [a, b, c]
    assert handler.session_id != NO_SESSION and handler.epoch == FULL_EPOCH

    # Nothing moved: the request names nothing, the leader still serves all three.
    idle, error, served = exchange(handler, sessions, [a, b, c])
    assert (idle["session_id"], idle["session_epoch"]) == (handler.session_id, 1)
    assert idle["partitions"] == [] and idle["forgotten"] == []
    assert served == [a, b, c]

    # b moved, c is no longer fetched, d is new.
    b2, d = item(1, fetch_offset=5), item(3)
    moved, error, served = exchange(handler, sessions, [a, b2, d])
    assert [p["partition"] for p in moved["partitions"]] == [1, 3]
    assert moved["partitions"][0]["fetch_offset"] == 5
    assert moved["forgotten"] == [["t", 2]]
    assert moved["session_epoch"] == 2
    assert sorted(served) == sorted([a, b2, d])


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
    error, _, served = sessions.resolve(REPLICA, {"replica_id": REPLICA, **request})
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
    assert sessions.resolve(REPLICA, payload) == (Errors.NONE, NO_SESSION, [item(0)])
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
    assert sessions.resolve(99, payload, may_open=False) == (Errors.NONE, NO_SESSION, [item(0)])
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
