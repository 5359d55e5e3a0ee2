"""The leader's view of one partition's replication: follower LEOs, the high watermark, the ISR.

Theory of operation
-------------------
One ``LeaderReplication`` lives on the leader of a partition for one leader epoch (Kafka's
``Partition`` leader-side state with its ``Replica`` objects). Followers long-poll the leader;
every fetch reports the follower's log end offset (its fetch offset) and is recorded with
``update_follower_fetch`` (Kafka's ``Replica.updateFetchState``):

- ``log_end_offset`` is the fetch offset;
- ``last_caught_up_ms`` is the time of the latest fetch at or beyond the leader's LEO *at that
  fetch*, or else the time of the previous fetch if this one reaches the leader's LEO as it
  was at the previous fetch (the follower had caught up to what existed then).

The high watermark (``maybe_advance_high_watermark``, Kafka's ``maybeIncrementLeaderHW``) is the
minimum LEO over the leader and the *maximal ISR* (KIP-497): the committed ISR plus the replicas
an in-flight AlterPartition adds, and for a shrink still the members it removes, so the HW never
relies on an ISR the controller has not committed. It does not move while the committed ISR is
smaller than ``min.insync.replicas`` (KIP-966's strict min ISR). A caught-up replica that is
eligible to join the ISR also holds the HW back, so that it can join (Kafka's
``shouldWaitForReplicaToJoinIsr``). The HW only moves up and never passes the leader's LEO.

ISR changes are proposed by the leader and take effect only when committed in the metadata log
(``update_isr``):

- shrink (``shrink_candidates``, Kafka's ``getOutOfSyncReplicas``): an ISR follower whose LEO
  is not the leader's and that has not been caught up for ``replica.lag.time.max.ms``;
- expand (``expand_candidates``, Kafka's ``isFollowerInSync``): a replica outside the ISR
  whose LEO is at or above the HW and at or above the start offset of the leader's epoch, so
  it has every record this leader wrote in its own epoch (KIP-101). Kafka decides this on a
  follower's fetch (``maybeExpandIsr`` in ``updateFollowerFetchState``), with the broker epoch
  that fetch carried matching the registered one (``isReplicaIsrEligible``, KIP-903); here
  the leader decides it periodically, so a replica that left the ISR is a candidate only once
  it has fetched since, and only with its registered broker epoch. Its last LEO alone, kept
  from before it left, made a silent follower rejoin whenever the HW stood still (a frozen
  HW under min ISR equals it), and a restarted one was proposed with its old epoch, refused
  (INELIGIBLE_REPLICA) for ever.

``begin_isr_change``/``end_isr_change`` bracket the in-flight AlterPartition; only one is in
flight at a time, like Kafka's ``PendingExpandIsr``/``PendingShrinkIsr`` states.

Pure: no I/O, no clock; time comes as ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower (Kafka's ``ReplicaState``)."""

    replica_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    broker_epoch: int = -1
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    # The leader's LEO when the previous fetch arrived (Kafka's lastFetchLeaderLogEndOffset).
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    # It left the committed ISR and has not fetched since: not a candidate to rejoin.
    left_isr_unfetched: bool = False

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int, lag_ms: int) -> bool:
        """Kafka's ``ReplicaState.isCaughtUp``."""
        return (
            self.log_end_offset == leader_log_end_offset
            or now_ms - self.last_caught_up_ms <= lag_ms
        )


class LeaderReplication:
    """Replication state of one partition on its leader, for one leader epoch."""

    def __init__(  # noqa: PLR0917 - a partition's leader state is this wide
        self,
        leader_id: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        partition_epoch: int,
        leader_epoch_start_offset: int,
        high_watermark: int,
        now_ms: int,
        replica_lag_time_max_ms: int,
    ) -> None:
        self.leader_id = leader_id
        self.replicas = tuple(replicas)
        self.isr = tuple(isr)
        self.partition_epoch = partition_epoch
        # The LEO when this leader's epoch began: a joining follower must have reached it.
        self.leader_epoch_start_offset = leader_epoch_start_offset
        self.high_watermark = high_watermark
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        # The ISR of an AlterPartition sent and not yet committed (or refused), if any.
        self.pending_isr: tuple[int, ...] | None = None
        # Kafka's resetReplicaState on becoming leader: LEOs unknown until the first fetch; ISR
        # members count as caught up now, so they get a full lag period to fetch.
        self.followers: dict[int, FollowerState] = {
            r: FollowerState(r, last_caught_up_ms=now_ms if r in self.isr else 0)
            for r in self.replicas
            if r != leader_id
        }
        assert leader_id in self.replicas, (leader_id, self.replicas)

    # ------------------------------------------------------------------------------- fetches

    def update_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        leader_log_end_offset: int,
        now_ms: int,
        broker_epoch: int = -1,
    ) -> bool:
        """Record a follower fetch at ``fetch_offset`` (Kafka's ``Replica.updateFetchState``);
        False, recording nothing, for a fetch of an older incarnation of the follower than one
        already recorded (``updateFetchStateOrThrow``, KIP-903: a delayed fetch of a process
        that has since restarted, its log possibly lost, must not count for the HW)."""
        state = self.followers[replica_id]
        if broker_epoch != -1 and broker_epoch < state.broker_epoch:
            return False
        if fetch_offset >= leader_log_end_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif fetch_offset >= state.last_fetch_leader_log_end_offset >= 0:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.log_end_offset = fetch_offset
        state.broker_epoch = broker_epoch
        state.last_fetch_leader_log_end_offset = leader_log_end_offset
        state.last_fetch_ms = now_ms
        state.left_isr_unfetched = False
        return True

    def note_fetching(self, replica_id: int, fetch_offset: int, broker_epoch: int = -1) -> None:
        """A follower's request waiting at the leader holds this partition at ``fetch_offset``
        (a fetch session's partition, marked while it waits): the follower is fetching it, at
        the position already recorded, as Kafka reads every partition of a session on each
        request. A replica that left the ISR counts as having fetched since; nothing else of
        its state changes (its caught-up time counts from its requests' arrivals)."""
        state = self.followers.get(replica_id)
        if (
            state is not None
            and state.log_end_offset == fetch_offset
            and broker_epoch in (-1, state.broker_epoch)
        ):
            state.left_isr_unfetched = False

    # ------------------------------------------------------------------------ high watermark

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The committed ISR plus the pending one (KIP-497): the HW counts both."""
        if self.pending_isr is None:
            return frozenset(self.isr)
        return frozenset(self.isr) | frozenset(self.pending_isr)

    def maybe_advance_high_watermark(
        self,
        leader_log_end_offset: int,
        now_ms: int,
        eligible: Collection[int] = (),
        min_insync_replicas: int = 1,
    ) -> bool:
        """Move the HW to the min LEO over the maximal ISR (and caught-up eligible replicas);
        True if it moved. ``eligible``: replicas that may join the ISR (unfenced brokers).

        KIP-966's strict min ISR (Kafka's ``maybeIncrementLeaderHW``, KAFKA-15583): the HW
        stays while the committed ISR is smaller than ``min_insync_replicas``. The controller
        counts the replicas that leave an ISR already below it as eligible leaders (ELR):
        they must hold every committed record, so nothing may commit without them."""
        if self.is_under_min_isr(min_insync_replicas):
            return False
        candidate = leader_log_end_offset
        maximal = self.maximal_isr
        for state in self.followers.values():
            if state.log_end_offset >= candidate:
                continue
            waits_to_join = state.replica_id in eligible and state.is_caught_up(
                leader_log_end_offset, now_ms, self.replica_lag_time_max_ms
            )
            if state.replica_id in maximal or waits_to_join:
                candidate = state.log_end_offset
        if candidate <= self.high_watermark:
            return False
        assert candidate <= leader_log_end_offset, (candidate, leader_log_end_offset)
        self.high_watermark = candidate
        return True

    # --------------------------------------------------------------------------------- ISR

    def shrink_candidates(self, leader_log_end_offset: int, now_ms: int) -> set[int]:
        """ISR followers not caught up for ``replica.lag.time.max.ms``."""
        return {
            r
            for r in self.isr
            if r != self.leader_id
            and not self.followers[r].is_caught_up(
                leader_log_end_offset, now_ms, self.replica_lag_time_max_ms
            )
        }

    def expand_candidates(self, eligible: Mapping[int, int]) -> set[int]:
        """Replicas outside the ISR that hold every committed record and every record of this
        leader's epoch (Kafka's ``isFollowerInSync``), as their latest fetch since they left
        the ISR showed. ``eligible``: the unfenced brokers and their registered epochs; a
        replica's fetches must carry that epoch (-1: a fetch that carried none)."""
        return {
            r
            for r, state in self.followers.items()
            if r not in self.isr
            and r in eligible
            and state.broker_epoch in (-1, eligible[r])
            and not state.left_isr_unfetched
            and state.log_end_offset >= self.high_watermark
            and state.log_end_offset >= self.leader_epoch_start_offset
        }

    def begin_isr_change(self, new_isr: Iterable[int]) -> tuple[int, ...]:
        assert self.pending_isr is None, self.pending_isr
        proposed = tuple(new_isr)
        assert self.leader_id in proposed, proposed
        self.pending_isr = proposed
        return proposed

    def end_isr_change(self) -> None:
        """The in-flight change was refused or lost: the committed ISR stands."""
        self.pending_isr = None

    def update_isr(self, isr: Iterable[int], partition_epoch: int) -> None:
        """A committed partition change: its ISR replaces ours, any pending change is over."""
        if partition_epoch < self.partition_epoch:
            return
        for r in set(self.isr).difference(isr):
            if r in self.followers:
                self.followers[r].left_isr_unfetched = True
        self.isr = tuple(isr)
        self.partition_epoch = partition_epoch
        self.pending_isr = None

    def is_under_min_isr(self, min_insync_replicas: int) -> bool:
        """Kafka's check before an acks=all append: the committed ISR is too small."""
        return len(self.isr) < min_insync_replicas

    def follower_log_end_offset(self, replica_id: int) -> int:
        return self.followers[replica_id].log_end_offset
