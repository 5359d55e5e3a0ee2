"""The per-group rebalance timeline (DESIGN §8, "everything observable"): each step of a
group's rebalance as its coordinator saw it, kept in memory by the node (the admin API's
``/api/v1/groups/{id}`` and ``/api/v1/rebalances`` read them), never written to the log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# How many rebalance events a node keeps (CoordinatorStats.rebalance_events), all groups
# together: the admin API's per-group timeline (DESIGN §8) reads the latest of them.
RECENT_REBALANCE_EVENTS: Final = 10_000


@dataclass(frozen=True, slots=True)
class RebalanceEvent:
    """One step of a group's rebalance, for the per-group timeline (DESIGN §8, "everything
    observable"): a classic group entering PreparingRebalance (with why, as Kafka's
    ``prepareRebalance`` reason), CompletingRebalance or Empty at a new generation, or Stable;
    a KIP-848 group removing members or computing a new target assignment (``state``
    "Assigning", at its new group epoch). Kept in memory by the coordinator that saw it, not
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
