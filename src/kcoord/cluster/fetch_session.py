"""Incremental replica fetches: KIP-227's fetch sessions, for the ``ReplicaFetch`` RPC.

Theory of operation
-------------------
A follower fetches every partition it follows on one leader in one long-poll, over and over;
most of those partitions have not moved since its previous fetch. Naming each of them in every
request makes a fetch cost O(partitions) on both sides (built, encoded, decoded, parsed) however
little moved. With a session (Kafka's ``FetchSession`` on the leader, ``FetchSessionHandler`` on
the follower) the leader keeps the follower's latest fetch state of every partition, and the
follower sends only what changed:

- a full request (``session_epoch`` 0, ``FULL_EPOCH``) names every partition; the leader opens a
  session for the follower and answers its ``session_id``. A follower has one fetcher per leader,
  so the leader keeps one session per follower, and a new full request replaces the old one
  (Kafka keeps a cache of sessions by id; one per follower is all a replica fetcher needs);
- each later request carries that ``session_id`` and the next ``session_epoch`` (1, 2, ...),
  names only the partitions whose fetch state is new or changed, and lists in ``forgotten`` the
  partitions no longer fetched. The leader merges them into the session and serves the session's
  partitions exactly as it would serve a full request naming them all, so the follower's
  position still counts on every fetch (``LeaderReplication.update_follower_fetch``);
- a request for a session the leader does not hold (it restarted, or a newer full request
  replaced it) is answered FETCH_SESSION_ID_NOT_FOUND, one whose epoch is not the next
  INVALID_FETCH_SESSION_EPOCH (Kafka's ``FetchSessionCache`` / ``FetchManager.newContext``).
  The follower then drops its session and sends a full request. So does a follower whose
  request failed (a timeout, a lost connection): it cannot know whether the leader applied it.

A request without ``session_epoch`` (or with -1, Kafka's ``FINAL_EPOCH``) is sessionless: it is
full, and the leader keeps nothing of it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any, Final, NamedTuple

from kcoord.errors import Errors

FULL_EPOCH: Final = 0  # Kafka's FetchMetadata.INITIAL_EPOCH: a full request opens a session
SESSIONLESS_EPOCH: Final = -1  # Kafka's FetchMetadata.FINAL_EPOCH: full, and nothing kept
NO_SESSION: Final = 0  # Kafka's INVALID_SESSION_ID


class FetchItem(NamedTuple):
    """One partition of a ``ReplicaFetch``: the follower's fetch state of it."""

    topic: str
    partition: int
    fetch_offset: int
    leader_epoch: int
    last_fetched_epoch: int
    high_watermark: int
    log_start_offset: int | None

    @property
    def tp(self) -> tuple[str, int]:
        return self.topic, self.partition

    @classmethod
    def parse(cls, item: Any) -> FetchItem:
        """From the wire; ``KeyError`` / ``TypeError`` / ``ValueError`` if malformed."""
        log_start = item.get("log_start_offset")
        return cls(
            str(item["topic"]),
            int(item["partition"]),
            int(item["fetch_offset"]),
            int(item["leader_epoch"]),
            int(item.get("last_fetched_epoch", -1)),
            int(item.get("high_watermark", -1)),
            None if log_start is None else int(log_start),
        )

    def to_wire(self) -> dict[str, Any]:
        return self._asdict()


class _Session:
    __slots__ = ("epoch", "items", "session_id")

    def __init__(self, session_id: int, items: dict[tuple[str, int], FetchItem]) -> None:
        self.session_id = session_id
        self.epoch = FULL_EPOCH
        self.items = items


class FetchSessions:
    """The leader's sessions, one per follower (Kafka's ``FetchSessionCache``)."""

    def __init__(self, new_session_id: Callable[[], int] | None = None) -> None:
        """``new_session_id``: a positive id for each new session (the node draws them at
        random, as Kafka's ``FetchSessionCache.newSessionId`` does; a count by default)."""
        self._new_session_id = new_session_id or itertools.count(1).__next__
        self._by_replica: dict[int, _Session] = {}
        # Sessions opened (full requests that opened one): a follower's first fetch, or one
        # after it or this leader lost the session. A steady cluster opens few.
        self.opened = 0

    def __len__(self) -> int:
        return len(self._by_replica)

    def resolve(
        self, replica_id: int, payload: Any, *, may_open: bool = True
    ) -> tuple[Errors, int, list[FetchItem]]:
        """(error, the session id to answer, the partitions to serve) for a request. A full
        request opens a session only if ``may_open`` (the node opens them for the brokers it
        knows, so what it keeps is bounded; otherwise the request is served sessionless).
        ``KeyError`` / ``TypeError`` / ``ValueError`` if the payload is malformed."""
        changed = [FetchItem.parse(item) for item in payload["partitions"]]
        epoch = int(payload.get("session_epoch", SESSIONLESS_EPOCH))
        if epoch == SESSIONLESS_EPOCH or (epoch == FULL_EPOCH and not may_open):
            return Errors.NONE, NO_SESSION, changed
        if epoch == FULL_EPOCH:
            session_id = self._new_session_id()
            assert session_id != NO_SESSION
            self._by_replica[replica_id] = _Session(session_id, {i.tp: i for i in changed})
            self.opened += 1
            return Errors.NONE, session_id, changed
        session = self._by_replica.get(replica_id)
        if session is None or session.session_id != int(payload.get("session_id", NO_SESSION)):
            return Errors.FETCH_SESSION_ID_NOT_FOUND, NO_SESSION, []
        if epoch != session.epoch + 1:
            # The follower lost track of the session: it starts a new one.
            del self._by_replica[replica_id]
            return Errors.INVALID_FETCH_SESSION_EPOCH, NO_SESSION, []
        session.epoch = epoch
        items = session.items
        for topic, partition in payload.get("forgotten", ()):
            items.pop((str(topic), int(partition)), None)
        for item in changed:
            items[item.tp] = item
        return Errors.NONE, session.session_id, list(items.values())

    def remove(self, replica_id: int) -> None:
        self._by_replica.pop(replica_id, None)


class FetchSessionHandler:
    """The follower's side of one session with one leader (Kafka's ``FetchSessionHandler``)."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION
        self.epoch = FULL_EPOCH
        self._sent: dict[tuple[str, int], FetchItem] = {}
        self._next_epoch = FULL_EPOCH

    def request(self, items: Iterable[FetchItem]) -> dict[str, Any]:
        """The session fields and partitions of the next request, to fetch ``items``."""
        current = {item.tp: item for item in items}
        if self.session_id == NO_SESSION:
            self._next_epoch = FULL_EPOCH
            fields: dict[str, Any] = {
                "session_id": NO_SESSION,
                "session_epoch": FULL_EPOCH,
                "partitions": [item.to_wire() for item in current.values()],
                "forgotten": [],
            }
        else:
            sent = self._sent
            self._next_epoch = self.epoch + 1
            fields = {
                "session_id": self.session_id,
                "session_epoch": self._next_epoch,
                "partitions": [
                    item.to_wire() for tp, item in current.items() if sent.get(tp) != item
                ],
                "forgotten": [list(tp) for tp in sent if tp not in current],
            }
        self._sent = current
        return fields

    def handle_response(self, reply: Any) -> Errors:
        """Take the answer's session fields; on a session error the next request is full."""
        error = Errors(int(reply.get("error", Errors.NONE)))
        if error is not Errors.NONE:
            self.reset()
            return error
        if self._next_epoch == FULL_EPOCH:
            # NO_SESSION if the leader keeps none: every request stays full.
            self.session_id = int(reply.get("session_id", NO_SESSION))
        self.epoch = self._next_epoch
        return error

    def reset(self) -> None:
        """Forget the session (a failed request: the leader may or may not have applied it)."""
        self.session_id = NO_SESSION
        self.epoch = FULL_EPOCH
        self._sent = {}
