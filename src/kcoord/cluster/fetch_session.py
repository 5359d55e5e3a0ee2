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
  partitions as it would serve a full request naming them all, and the follower's position
  still counts as of every fetch (``LeaderReplication.update_follower_fetch``; how without
  looking at every partition: "What the leader looks at" below);
- a request for a session the leader does not hold (it restarted, or a newer full request
  replaced it) is answered FETCH_SESSION_ID_NOT_FOUND, one whose epoch is not the next
  INVALID_FETCH_SESSION_EPOCH (Kafka's ``FetchSessionCache`` / ``FetchManager.newContext``).
  The follower then drops its session and sends a full request. So does a follower whose
  request failed (a timeout, a lost connection): it cannot know whether the leader applied it.

A request without ``session_epoch`` (or with -1, Kafka's ``FINAL_EPOCH``) is sessionless: it is
full, and the leader keeps nothing of it.

What the leader looks at
------------------------
Kafka's leader still goes through every partition of the session on every fetch (it records the
follower's position of each and reads each). In Python that per-partition work was a quarter of
a commit's cost with ``__consumer_offsets``' 50 partitions, while a commit moves one of them. So
the leader looks only at the partitions that may have something for the follower
(``Resolved.serve``): those the request names, and those the session holds *dirty*. The leader
marks a partition dirty in every session that holds it when something a follower would be
answered changes (``mark``: an append, a HW or log start that moved, a role change of it);
it keeps an answered partition dirty until a later look finds nothing to answer (the
follower's next request names it anyway, once it applied the answer).
Whatever no mark covers (a log start moved by retention, a broker fenced) is picked up by a look
at every partition once every ``FULL_PASS_INTERVAL_MS``. What the leader skips is a follower's
position that did not move on a partition that did not change; the time it was seen there is
kept as the session's ``last_request_ms`` and recorded when the partition next changes
(``fetched_at``), so the ISR sees the same times as when Kafka records every partition on every
fetch.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

from kcoord.errors import Errors

FULL_EPOCH: Final = 0  # Kafka's FetchMetadata.INITIAL_EPOCH: a full request opens a session
SESSIONLESS_EPOCH: Final = -1  # Kafka's FetchMetadata.FINAL_EPOCH: full, and nothing kept
NO_SESSION: Final = 0  # Kafka's INVALID_SESSION_ID
# How often a session's request is served by a look at all of its partitions (see above).
FULL_PASS_INTERVAL_MS: Final = 1000
# A session unused this long goes (Kafka's min.incremental.fetch.session.eviction.ms): a
# follower fetches all the time, so only a broker gone for good (or following elsewhere)
# leaves one behind.
SESSION_EVICTION_MS: Final = 120_000

TopicPartition = tuple[str, int]


class FetchItem(NamedTuple):
    """One partition of a ``ReplicaFetch``: the follower's fetch state of it."""

    topic: str
    partition: int
    fetch_offset: int
    leader_epoch: int
    last_fetched_epoch: int
    high_watermark: int
    log_start_offset: int | None
    # The follower's topic id (KIP-516): a leader whose partition is another topic's by now
    # (deleted and created again under the name) answers INCONSISTENT_TOPIC_ID.
    topic_id: str | None = None

    @property
    def tp(self) -> TopicPartition:
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
            None if item.get("topic_id") is None else str(item["topic_id"]),
        )

    def to_wire(self) -> dict[str, Any]:
        return self._asdict()


class _Session:
    __slots__ = ("dirty", "epoch", "items", "last_request_ms", "next_full_pass_ms", "session_id")

    def __init__(self, session_id: int, items: dict[TopicPartition, FetchItem]) -> None:
        self.session_id = session_id
        self.epoch = FULL_EPOCH
        self.items = items
        # Partitions that may have something for the follower (see the module docstring).
        self.dirty: set[TopicPartition] = set()
        self.last_request_ms = -1
        self.next_full_pass_ms = 0

    def take_dirty(self) -> dict[TopicPartition, FetchItem]:
        """The dirty partitions still in the session, which are then clean."""
        items = self.items
        taken = {tp: items[tp] for tp in self.dirty if tp in items}
        self.dirty.clear()
        return taken

    def keep_dirty(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions answered: looked at again on the next request."""
        self.dirty.update(tps)


class Resolved(NamedTuple):
    """What a request comes to: ``serve`` is what the leader must look at now (every partition
    of a full or sessionless request; for a session's later request, those it names, its dirty
    ones, or all of them at a full pass); ``session`` is None for a sessionless request."""

    error: Errors
    session_id: int
    serve: list[FetchItem]
    session: _Session | None = None


class FetchSessions:
    """The leader's sessions, one per follower (Kafka's ``FetchSessionCache``)."""

    def __init__(
        self,
        new_session_id: Callable[[], int] | None = None,
        full_pass_interval_ms: int = FULL_PASS_INTERVAL_MS,
    ) -> None:
        """``new_session_id``: a positive id for each new session (the node draws them at
        random, as Kafka's ``FetchSessionCache.newSessionId`` does; a count by default)."""
        self._new_session_id = new_session_id or itertools.count(1).__next__
        self.full_pass_interval_ms = full_pass_interval_ms
        self._by_replica: dict[int, _Session] = {}
        # Sessions opened (full requests that opened one): a follower's first fetch, or one
        # after it or this leader lost the session. A steady cluster opens few.
        self.opened = 0
        self.eviction_ms = SESSION_EVICTION_MS
        self._next_eviction_ms = 0

    def __len__(self) -> int:
        return len(self._by_replica)

    def resolve(
        self, replica_id: int, payload: Any, *, may_open: bool = True, now_ms: int = 0
    ) -> Resolved:
        """What a request comes to (``Resolved``). A full request opens a session only if
        ``may_open`` (the node opens them for the brokers it knows, so what it keeps is
        bounded; otherwise the request is served sessionless). ``now_ms`` becomes the session's
        ``last_request_ms`` and decides whether this request gets a full pass.
        ``KeyError`` / ``TypeError`` / ``ValueError`` if the payload is malformed."""
        changed = [FetchItem.parse(item) for item in payload["partitions"]]
        epoch = int(payload.get("session_epoch", SESSIONLESS_EPOCH))
        if now_ms >= self._next_eviction_ms:
            self._evict_idle(now_ms)
        if epoch == SESSIONLESS_EPOCH or (epoch == FULL_EPOCH and not may_open):
            return Resolved(Errors.NONE, NO_SESSION, changed)
        if epoch == FULL_EPOCH:
            session_id = self._new_session_id()
            assert session_id != NO_SESSION
            session = _Session(session_id, {i.tp: i for i in changed})
            session.last_request_ms = now_ms
            session.next_full_pass_ms = now_ms + self.full_pass_interval_ms
            self._by_replica[replica_id] = session
            self.opened += 1
            return Resolved(Errors.NONE, session_id, changed, session)
        found = self._by_replica.get(replica_id)
        if found is None or found.session_id != int(payload.get("session_id", NO_SESSION)):
            return Resolved(Errors.FETCH_SESSION_ID_NOT_FOUND, NO_SESSION, [])
        if epoch != found.epoch + 1:
            # The follower lost track of the session: it starts a new one.
            del self._by_replica[replica_id]
            return Resolved(Errors.INVALID_FETCH_SESSION_EPOCH, NO_SESSION, [])
        session = found
        session.epoch = epoch
        items = session.items
        for topic, partition in payload.get("forgotten", ()):
            items.pop((str(topic), int(partition)), None)
        serve = session.take_dirty()
        for item in changed:
            items[item.tp] = serve[item.tp] = item
        session.last_request_ms = now_ms
        if now_ms >= session.next_full_pass_ms:
            session.next_full_pass_ms = now_ms + self.full_pass_interval_ms
            return Resolved(Errors.NONE, session.session_id, list(items.values()), session)
        return Resolved(Errors.NONE, session.session_id, list(serve.values()), session)

    def _evict_idle(self, now_ms: int) -> None:
        """Drop the sessions unused for ``eviction_ms`` (``FetchSessionCache``'s eviction of
        stale sessions); looked for every half of it."""
        self._next_eviction_ms = now_ms + self.eviction_ms // 2
        horizon = now_ms - self.eviction_ms
        for replica_id, session in list(self._by_replica.items()):
            if session.last_request_ms < horizon:
                del self._by_replica[replica_id]

    def mark(self, tp: TopicPartition) -> None:
        """Something a follower of ``tp`` would be answered changed (see the docstring)."""
        for session in self._by_replica.values():
            if tp in session.items:
                session.dirty.add(tp)

    def fetched_at(
        self, replica_id: int, tp: TopicPartition, fetch_offset: int, leader_epoch: int
    ) -> int:
        """When ``replica_id`` last fetched ``tp`` at ``fetch_offset`` in ``leader_epoch`` (its
        session's latest request, if the session holds the partition at that position), else
        -1."""
        session = self._by_replica.get(replica_id)
        if session is None:
            return -1
        item = session.items.get(tp)
        if item is None or item.fetch_offset != fetch_offset or item.leader_epoch != leader_epoch:
            return -1
        return session.last_request_ms


class FetchSessionHandler:
    """The follower's side of one session with one leader (Kafka's ``FetchSessionHandler``)."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION
        self.epoch = FULL_EPOCH
        self._sent: dict[TopicPartition, FetchItem] = {}
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

    def request_changes(
        self, current: Mapping[TopicPartition, FetchItem], changed: Iterable[TopicPartition]
    ) -> dict[str, Any]:
        """Like ``request(current.values())``, for a caller that knows which partitions may
        differ from the previous request (``changed``: new, moved or no longer fetched); the
        others are not looked at. Without a session, the request is full."""
        if self.session_id == NO_SESSION:
            return self.request(current.values())
        sent = self._sent
        partitions: list[dict[str, Any]] = []
        forgotten: list[list[Any]] = []
        for tp in changed:
            item = current.get(tp)
            if item is None:
                if sent.pop(tp, None) is not None:
                    forgotten.append(list(tp))
            elif sent.get(tp) != item:
                sent[tp] = item
                partitions.append(item.to_wire())
        self._next_epoch = self.epoch + 1
        return {
            "session_id": self.session_id,
            "session_epoch": self._next_epoch,
            "partitions": partitions,
            "forgotten": forgotten,
        }

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
