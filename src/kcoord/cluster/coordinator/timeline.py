"""The per-group rebalance timeline (DESIGN §8, "everything observable"): each step of a
group's rebalance as its coordinator saw it, kept in memory by the node (the admin API's
``/api/v1/groups/{id}`` and ``/api/v1/rebalances`` read them), never written to the log."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final

# How many rebalance events a node keeps (CoordinatorStats.rebalance_events), all groups
# together, and how many characters of group ids and reasons they may hold: a client naming
# groups and members of 32 KiB, with 32 KiB reasons, made 10,000 events hold 940 MiB (review
# probe). A reason is cut at MAX_REASON_CHARS.
RECENT_REBALANCE_EVENTS: Final = 10_000
MAX_EVENT_CHARS: Final = 8 * 1024 * 1024
MAX_REASON_CHARS: Final = 1024


@dataclass(frozen=True, slots=True)
class RebalanceEvent:
    """One step of a group's rebalance, for the per-group timeline (DESIGN §8, "everything
    observable"): a classic group entering PreparingRebalance (with why, as Kafka's
    ``prepareRebalance`` reason), CompletingRebalance or Empty at a new generation, or Stable;
    a KIP-848 group removing members or computing a new target assignment (``state``
    "Reconciling", at its new group epoch; "Assigning" or "Empty" when members leave).
    Recorded when the handler decides it: a write that then fails (the shard reloads) leaves
    its step on the timeline. Kept in memory by the coordinator that saw it, not
    in the log: a new coordinator's timeline starts at its load."""

    at_ms: int
    group_id: str
    protocol: str  # "classic" or "consumer"
    state: str
    generation: int  # the classic generation, or the consumer group's epoch
    members: int
    reason: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "at_ms": self.at_ms,
            "protocol": self.protocol,
            "state": self.state,
            "generation": self.generation,
            "members": self.members,
            "reason": self.reason,
        }


class RebalanceLog:
    """The latest rebalance events, within ``RECENT_REBALANCE_EVENTS`` events and
    ``MAX_EVENT_CHARS`` characters of group ids and reasons, oldest first."""

    def __init__(
        self, max_events: int = RECENT_REBALANCE_EVENTS, max_chars: int = MAX_EVENT_CHARS
    ) -> None:
        self._events: deque[RebalanceEvent] = deque()
        self._max_events = max_events
        self._max_chars = max_chars
        self._chars = 0

    def append(self, event: RebalanceEvent) -> None:
        if event.reason is not None and len(event.reason) > MAX_REASON_CHARS:
            event = replace(event, reason=event.reason[:MAX_REASON_CHARS] + "...")
        self._events.append(event)
        self._chars += _chars(event)
        while len(self._events) > self._max_events or (
            self._chars > self._max_chars and len(self._events) > 1
        ):
            self._chars -= _chars(self._events.popleft())

    def __iter__(self) -> Iterator[RebalanceEvent]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def forget(self, group_ids: set[str]) -> None:
        """Drop these groups' events (their partition was unloaded)."""
        if not group_ids:
            return
        kept = deque(e for e in self._events if e.group_id not in group_ids)
        self._chars = sum(_chars(e) for e in kept)
        self._events = kept

    def latest(self, limit: int) -> list[RebalanceEvent]:
        return list(self._events)[-limit:] if limit > 0 else []


def _chars(event: RebalanceEvent) -> int:
    return len(event.group_id) + len(event.reason or "")
