"""The leader's replication state (cluster/replication.py), with a fake clock."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kcoord.cluster.replication import UNKNOWN_OFFSET, LeaderReplication

LAG_MS = 4000
T0 = 1_000_000
# Every broker unfenced, registered with epoch 7; fetches that carry no epoch (-1) match any.
ANY_EPOCH = {1: 7, 2: 7, 3: 7}


def leader(
    isr: tuple[int, ...] = (1, 2, 3), *, hw: int = 0, epoch_start: int = 0
) -> LeaderReplication:
    return LeaderReplication(1, (1, 2, 3), isr, 5, epoch_start, hw, T0, LAG_MS)


def test_hw_is_min_leo_over_isr_and_waits_for_unknown_followers() -> None:
    r = leader()
    assert r.follower_log_end_offset(2) == UNKNOWN_OFFSET
    assert not r.maybe_advance_high_watermark(10, T0)  # followers not heard from yet
    r.update_follower_fetch(2, 10, 10, T0)
    assert not r.maybe_advance_high_watermark(10, T0)  # 3 still unknown
    r.update_follower_fetch(3, 7, 10, T0)
    assert r.maybe_advance_high_watermark(10, T0)
    assert r.high_watermark == 7
    r.update_follower_fetch(3, 10, 10, T0 + 1)
    assert r.maybe_advance_high_watermark(10, T0 + 1)
    assert r.high_watermark == 10


def test_a_follower_outside_the_isr_does_not_hold_the_hw_back_unless_caught_up() -> None:
    r = leader(isr=(1, 2))
    r.update_follower_fetch(2, 10, 10, T0)
    r.update_follower_fetch(3, 4, 10, T0)  # far behind, never caught up
    assert r.maybe_advance_high_watermark(10, T0, eligible={1, 2, 3})
    assert r.high_watermark == 10


def test_a_caught_up_eligible_replica_holds_the_hw_so_it_can_join() -> None:
    # Kafka's shouldWaitForReplicaToJoinIsr.
    r = leader(isr=(1, 2))
    r.update_follower_fetch(2, 10, 10, T0)
    r.update_follower_fetch(3, 10, 10, T0)  # caught up now
    r.maybe_advance_high_watermark(10, T0, eligible={1, 2, 3})
    assert r.high_watermark == 10
    r.update_follower_fetch(2, 12, 12, T0 + 10)
    r.maybe_advance_high_watermark(12, T0 + 10, eligible={1, 2, 3})
    assert r.high_watermark == 10  # 3 was caught up 10 ms ago: wait for it
    r.maybe_advance_high_watermark(12, T0 + 10, eligible={1, 2})
    assert r.high_watermark == 12  # fenced: no longer waited for


def test_maximal_isr_counts_a_pending_expansion_and_a_pending_shrink() -> None:
    # KIP-497: while an AlterPartition is in flight the HW uses the union of both ISRs.
    r = leader(isr=(1, 2))
    r.update_follower_fetch(2, 10, 10, T0)
    r.update_follower_fetch(3, 6, 10, T0)
    r.begin_isr_change((1, 2, 3))
    assert r.maximal_isr == {1, 2, 3}
    r.maybe_advance_high_watermark(10, T0 + LAG_MS * 2)
    assert r.high_watermark == 6
    r.update_isr((1, 2, 3), 6)
    assert r.pending_isr is None and r.partition_epoch == 6

    s = leader()
    s.update_follower_fetch(2, 10, 10, T0)
    s.update_follower_fetch(3, 3, 10, T0)
    s.begin_isr_change((1, 2))  # shrink in flight: 3 still counts
    s.maybe_advance_high_watermark(10, T0)
    assert s.high_watermark == 3
    s.update_isr((1, 2), 6)
    s.maybe_advance_high_watermark(10, T0)
    assert s.high_watermark == 10


def test_stale_isr_update_is_ignored_and_refused_change_ends() -> None:
    r = leader()
    r.update_isr((1, 2), 4)  # older partition epoch
    assert r.isr == (1, 2, 3)
    r.begin_isr_change((1, 2))
    r.end_isr_change()
    assert r.pending_isr is None and r.maximal_isr == {1, 2, 3}


def test_last_caught_up_time_follows_kafka_update_fetch_state() -> None:
    r = leader()
    r.update_follower_fetch(2, 5, 10, T0 + 100)  # behind the leader's LEO 10
    assert r.followers[2].last_caught_up_ms == T0  # the reset value on becoming leader
    # Reaches 10, the leader's LEO at the previous fetch, while the leader is at 12 now:
    # caught up as of the previous fetch.
    r.update_follower_fetch(2, 10, 12, T0 + 200)
    assert r.followers[2].last_caught_up_ms == T0 + 100
    r.update_follower_fetch(2, 12, 12, T0 + 300)
    assert r.followers[2].last_caught_up_ms == T0 + 300


def test_shrink_candidates_after_the_lag_time() -> None:
    r = leader()
    r.update_follower_fetch(2, 10, 10, T0)
    r.update_follower_fetch(3, 2, 10, T0)
    assert r.shrink_candidates(10, T0 + LAG_MS) == set()  # ISR members get a full lag period
    assert r.shrink_candidates(10, T0 + LAG_MS + 1) == {3}
    # A follower at the leader's LEO is never lagging, however long ago it fetched.
    assert 2 not in r.shrink_candidates(10, T0 + 10 * LAG_MS)
    assert 2 in r.shrink_candidates(11, T0 + 10 * LAG_MS)


def test_expand_needs_hw_and_the_leader_epoch_start_offset() -> None:
    r = leader(isr=(1, 2), hw=5, epoch_start=8)
    r.update_follower_fetch(3, 6, 10, T0)
    assert r.expand_candidates(ANY_EPOCH) == set()  # above the HW, below the epoch start
    r.update_follower_fetch(3, 8, 10, T0)
    assert r.expand_candidates(ANY_EPOCH) == {3}
    assert r.expand_candidates({1: 1, 2: 1}) == set()  # fenced or unregistered: not eligible


def test_a_replica_that_left_the_isr_rejoins_only_after_a_fetch_with_its_epoch() -> None:
    """Kafka expands the ISR on a follower's fetch (maybeExpandIsr), with the broker epoch that
    fetch carried matching the registered one (KIP-903). A silent follower whose last LEO, from
    before it left, still equals a HW that stands still was proposed back every round, and a
    restarted one with its old epoch, refused for ever (a shrink sent with it too)."""
    r = leader(hw=10)
    r.update_follower_fetch(2, 10, 10, T0, broker_epoch=7)
    r.update_follower_fetch(3, 10, 10, T0, broker_epoch=7)
    r.update_isr((1, 2), 6)  # 3 is shrunk out; its last LEO is still the HW
    assert r.expand_candidates(ANY_EPOCH) == set()
    r.update_follower_fetch(3, 10, 10, T0 + 1, broker_epoch=7)
    assert r.expand_candidates(ANY_EPOCH) == {3}
    # Shrunk out while its request waited at the leader (a session's partition marked then):
    # that request fetching it at the same position counts too; another position does not.
    r.update_isr((1, 2), 7)
    r.update_isr((1, 2, 3), 8)
    r.update_isr((1, 2), 9)
    assert r.expand_candidates(ANY_EPOCH) == set()
    r.note_fetching(3, 9, broker_epoch=7)
    assert r.expand_candidates(ANY_EPOCH) == set()
    r.note_fetching(3, 10, broker_epoch=7)
    assert r.expand_candidates(ANY_EPOCH) == {3}
    # Restarted under a new epoch, it is a candidate once a fetch of the new process came.
    restarted = {**ANY_EPOCH, 3: 8}
    assert r.expand_candidates(restarted) == set()
    r.update_follower_fetch(3, 10, 10, T0 + 2, broker_epoch=8)
    assert r.expand_candidates(restarted) == {3}


def test_min_isr_is_checked_on_the_committed_isr() -> None:
    r = leader(isr=(1,))
    assert r.is_under_min_isr(2)
    r.begin_isr_change((1, 2))
    assert r.is_under_min_isr(2)  # pending does not count
    r.update_isr((1, 2), 6)
    assert not r.is_under_min_isr(2)


def test_the_hw_stays_while_the_committed_isr_is_below_min_isr() -> None:
    """KIP-966's strict min ISR: with the ISR at [1] and min.insync.replicas 2, the leader
    alone commits nothing (the replicas that left hold every committed record and may be
    elected from the ELR). Chaos seed 31 lost offset commits a lone leader had answered."""
    r = leader(isr=(1, 2))
    r.update_follower_fetch(2, 10, 10, T0)
    assert r.maybe_advance_high_watermark(10, T0, min_insync_replicas=2)
    r.update_isr((1,), 6)  # 2 shrank out, below min ISR
    assert not r.maybe_advance_high_watermark(12, T0, min_insync_replicas=2)
    assert r.high_watermark == 10
    assert r.maybe_advance_high_watermark(12, T0, min_insync_replicas=1)  # a lower min ISR
    assert r.high_watermark == 12
    r.begin_isr_change((1, 2))  # pending expansion: the committed ISR still counts
    r.update_follower_fetch(2, 14, 14, T0)
    assert not r.maybe_advance_high_watermark(14, T0, min_insync_replicas=2)
    r.update_isr((1, 2), 7)
    assert r.maybe_advance_high_watermark(14, T0, min_insync_replicas=2)
    assert r.high_watermark == 14


_step = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 5)),
    st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 100)),
    st.tuples(st.just("tick"), st.integers(0, 3000)),
    st.tuples(st.just("shrink")),
    st.tuples(st.just("expand")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=60))
def test_hw_never_passes_an_isr_leo_never_drops_never_passes_the_leader(
    steps: list[tuple[Any, ...]],
) -> None:
    r = leader()
    leo = 0
    fleo = {2: 0, 3: 0}
    now = T0
    epoch = 5
    eligible = ANY_EPOCH
    for step in steps:
        hw_before = r.high_watermark
        if step[0] == "append":
            leo += step[1]
        elif step[0] == "fetch":
            replica = step[1]
            # A follower fetches at or above its previous LEO and never beyond the leader's.
            fleo[replica] = min(leo, fleo[replica] + step[2])
            r.update_follower_fetch(replica, fleo[replica], leo, now)
        elif step[0] == "tick":
            now += step[1]
        elif step[0] == "shrink" and r.pending_isr is None:
            out = r.shrink_candidates(leo, now)
            if out:
                r.begin_isr_change([m for m in r.isr if m not in out])
                epoch += 1
                r.update_isr(r.pending_isr or (), epoch)
        elif step[0] == "expand" and r.pending_isr is None:
            into = r.expand_candidates(eligible)
            if into:
                r.begin_isr_change(sorted({*r.isr, *into}))
        r.maybe_advance_high_watermark(leo, now, eligible)
        assert r.high_watermark >= hw_before
        assert r.high_watermark <= leo
        for member in r.isr:
            if member != 1 and r.follower_log_end_offset(member) != UNKNOWN_OFFSET:
                assert r.high_watermark <= fleo[member], (member, fleo, r.isr)
        if step[0] == "expand" and r.pending_isr is not None:
            epoch += 1
            r.update_isr(r.pending_isr, epoch)


def test_a_fetch_of_an_older_incarnation_of_a_follower_is_not_recorded() -> None:
    """KIP-903 (Replica.updateFetchStateOrThrow): a delayed fetch of the process a follower
    was before it restarted (lower broker epoch) must not move its LEO, nor the HW; an
    unknown broker epoch (-1) is taken."""
    r = leader()
    assert r.update_follower_fetch(2, 10, 10, T0, broker_epoch=7)
    assert r.update_follower_fetch(3, 10, 10, T0, broker_epoch=9)
    assert r.maybe_advance_high_watermark(10, T0)
    assert not r.update_follower_fetch(3, 12, 12, T0 + 1, broker_epoch=8)
    assert r.follower_log_end_offset(3) == 10
    assert r.update_follower_fetch(2, 12, 12, T0 + 1, broker_epoch=7)
    assert not r.maybe_advance_high_watermark(12, T0 + 1)
    assert r.update_follower_fetch(3, 12, 12, T0 + 2, broker_epoch=-1)
    assert r.maybe_advance_high_watermark(12, T0 + 2) and r.high_watermark == 12
