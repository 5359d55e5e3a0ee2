"""The chaos history and checkers on small hand-made histories, valid and broken.

Each anomaly has a history that exhibits it (the checker must name it) next to the closest
valid history (the checker must pass), so a checker that flags nothing, or everything, fails.
Times are explicit seconds; no clock is read.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from kcoord.chaos.checkers import (
    DELIVERY_SLACK_S,
    MALFORMED,
    MAX_EXAMPLES,
    MEMBER_MODULE,
    CheckResult,
    all_valid,
    check_all,
    check_consumed,
    check_fencing,
    check_groups,
    check_liveness,
    check_offsets,
    check_progress,
    check_queue,
    results_as_dict,
)
from kcoord.chaos.history import (
    FAIL,
    FENCING_WATCH_F,
    INFO,
    INVOKE,
    LOG_COPIES_F,
    OK,
    PROCESS_EXIT_F,
    PROCESS_KILL_F,
    UNRECORDED_REPORT_F,
    Event,
    History,
)

# ---------------------------------------------------------------------------------------------
# Builders: one line per operation, so a history reads like the run it stands for.


def commit(
    h: History,
    t: float,
    member: str,
    offsets: dict[int, int],
    *,
    outcome: str = OK,
    group: str = "g",
    topic: str = "t",
    generation: int = 1,
    done_t: float | None = None,
    protocol: str | None = None,
) -> None:
    value: dict[str, Any] = {
        "group": group,
        "topic": topic,
        "member": member,
        "member_id": f"{member}-id",
        "generation": generation,
        "offsets": offsets,
    }
    if protocol is not None:
        value["group_protocol"] = protocol
    h.add(member, INVOKE, "commit", value, time=t)
    h.add(member, outcome, "commit", value, time=t + 0.1 if done_t is None else done_t)


def consume(
    h: History,
    t: float,
    member: str,
    partition: int,
    offsets: range | list[int],
    *,
    group: str = "g",
    topic: str = "t",
) -> None:
    h.add(
        member,
        OK,
        "consume",
        {
            "group": group,
            "topic": topic,
            "member": member,
            "member_id": f"{member}-id",
            "generation": 1,
            "records": [[partition, o, f"v{o}"] for o in offsets],
        },
        time=t,
    )


def committed(h: History, t: float, offsets: dict[int, int], *, group: str = "g") -> None:
    h.add("checker", OK, "committed", {"group": group, "topic": "t", "offsets": offsets}, time=t)


def assignment(
    h: History,
    t: float,
    member: str,
    partitions: list[int],
    generation: int,
    *,
    member_id: str | None = None,
) -> None:
    h.add(
        member,
        INFO,
        "assignment",
        {
            "group": "g",
            "topic": "t",
            "member": member,
            "member_id": member_id or f"{member}-id",
            "generation": generation,
            "partitions": partitions,
        },
        time=t,
    )


def describe(
    h: History, t: float, members: list[str], *, state: str = "Stable", generation: int = 1
) -> None:
    h.add(
        "checker",
        OK,
        "describe",
        {"group": "g", "state": state, "generation": generation, "members": members},
        time=t,
    )


def heal(h: History, t: float) -> None:
    h.add("nemesis", INFO, "heal", {}, time=t)


def send(
    h: History,
    t: float,
    process: str,
    value: str,
    where: tuple[int, int | None],
    *,
    outcome: str = OK,
    topic: str = "q",
) -> None:
    """A send of ``value``; ``where`` is the (partition, offset) an ``ok`` acknowledges (offset
    None: acknowledged without one)."""
    partition, offset = where
    invoke = {"topic": topic, "key": partition, "value": value}
    h.add(process, INVOKE, "send", invoke, time=t)
    done = {**invoke, "partition": partition, "offset": offset} if outcome == OK else invoke
    h.add(process, outcome, "send", done, time=t + 0.1)


def poll(
    h: History,
    t: float,
    process: str,
    records: list[tuple[int, int, str]],
    *,
    f: str = "poll",
    generation: int | None = None,
    topic: str = "q",
) -> None:
    value: dict[str, Any] = {
        "member": process,
        "topic": topic,
        "records": [list(r) for r in records],
        "mode": "subscribe",
    }
    if generation is not None:
        value["generation"] = generation
    h.add(process, OK, f, value, time=t)


def final_poll(h: History, t: float, records: list[tuple[int, int, str]]) -> None:
    poll(h, t, "checker", records, f="final-poll")


def named(result: CheckResult) -> set[str]:
    return set(result.anomalies)


# ---------------------------------------------------------------------------------------------
# History


def test_add_stamps_the_injected_clock_and_numbers_events() -> None:
    now = [1.5]
    h = History(clock=lambda: now[0])
    first = h.add("member-1", INVOKE, "commit", {"offsets": {0: 3}})
    now[0] = 2.0
    second = h.add("member-1", OK, "commit", {"offsets": {0: 3}})
    explicit = h.add("nemesis", INFO, "heal", {}, time=9.0)

    assert [(e.index, e.time) for e in (first, second, explicit)] == [(0, 1.5), (1, 2.0), (2, 9.0)]
    assert first.value == {"offsets": {"0": 3}}  # stored in JSON form
    assert h.events() == (first, second, explicit)
    assert h[1] == second
    assert len(h) == 3


def test_add_refuses_what_a_history_cannot_hold() -> None:
    with pytest.raises(ValueError, match="event type"):
        History(clock=lambda: 0.0).add("p", "done", "send", {})
    with pytest.raises(ValueError, match="no clock"):
        History().add("p", OK, "send", {})
    with pytest.raises(TypeError):
        History(clock=lambda: 0.0).add("p", OK, "send", {"value": object()})


def test_add_is_thread_safe() -> None:
    h = History(clock=lambda: 0.0)

    def add_many(name: str) -> None:
        for i in range(500):
            h.add(name, OK, "poll", {"i": i})

    threads = [threading.Thread(target=add_many, args=(f"p{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [e.index for e in h] == list(range(2000))
    for n in range(4):
        assert [e.value["i"] for e in h if e.process == f"p{n}"] == list(range(500))


def test_an_invoke_pairs_with_its_process_next_completion_of_the_same_f() -> None:
    h = History()
    a_commit = h.add("a", INVOKE, "commit", {}, time=0)
    b_commit = h.add("b", INVOKE, "commit", {}, time=1)
    a_send = h.add("a", INVOKE, "send", {}, time=2)
    b_done = h.add("b", FAIL, "commit", {}, time=3)
    callback = h.add("a", INFO, "revoked", {}, time=4)
    a_send_done = h.add("a", OK, "send", {}, time=5)
    a_done = h.add("a", INFO, "commit", {}, time=6)
    pending = h.add("a", INVOKE, "commit", {}, time=7)

    assert h.completion(a_commit) == a_done
    assert h.completion(b_commit) == b_done
    assert h.completion(a_send) == a_send_done
    assert h.completion(pending) is None
    assert h.invocation(a_done) == a_commit
    assert h.invocation(callback) is None
    assert h.pairs("commit") == [(a_commit, a_done), (b_commit, b_done), (pending, None)]
    assert h.ops("commit", INVOKE) == [a_commit, b_commit, pending]
    # Pairing follows appends made after it was first computed.
    late = h.add("a", OK, "commit", {}, time=8)
    assert h.completion(pending) == late


def test_round_trip_through_jsonl(tmp_path: Path) -> None:
    h = History()
    commit(h, 1.0, "member-1", {0: 5, 3: 7})
    poll(h, 2.0, "consumer-1", [(0, 1, "a"), (1, 0, "b")])
    h.add("nemesis", INFO, "start", {"fault": "kill", "targets": ["n1"], "detail": {}}, time=3.25)
    path = tmp_path / "history.jsonl"

    h.to_jsonl(path)
    back = History.from_jsonl(path)
    back.to_jsonl(tmp_path / "again.jsonl")

    assert back.events() == h.events()
    assert (tmp_path / "again.jsonl").read_bytes() == path.read_bytes()
    assert back[1].value["offsets"] == {"0": 5, "3": 7}
    assert back.completion(back[0]) == back[1]
    line = json.loads(path.read_text().splitlines()[0])
    assert set(line) == {"index", "time", "process", "type", "f", "value"}


def test_from_jsonl_rejects_a_bad_line_or_a_gap(tmp_path: Path) -> None:
    event = Event(0, 0.0, "p", OK, "poll", {})
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(event.to_dict()) + "\n" + '{"index": 1}\n')
    with pytest.raises(ValueError, match="line 2"):
        History.from_jsonl(path)
    path.write_text(json.dumps({**event.to_dict(), "index": 1}) + "\n")
    with pytest.raises(ValueError, match="index 1 at position 0"):
        History.from_jsonl(path)
    path.write_text(json.dumps({**event.to_dict(), "type": "maybe"}) + "\n")
    with pytest.raises(ValueError, match="event type"):
        History.from_jsonl(path)


# ---------------------------------------------------------------------------------------------
# Offsets


def healthy_groups_history() -> History:
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    commit(h, 2.0, "m1", {0: 5})
    consume(h, 3.0, "m1", 0, range(5, 8))
    commit(h, 4.0, "m1", {0: 8})
    committed(h, 10.0, {0: 8})
    return h


def test_offsets_valid_history() -> None:
    result = check_offsets(healthy_groups_history())
    assert result.valid, result.anomalies
    assert result.stats["commits"][OK] == 2


def test_phantom_commit_when_the_final_offset_is_one_nobody_committed() -> None:
    h = healthy_groups_history()
    committed(h, 11.0, {0: 50})  # the last read wins; the highest commit attempted was 8

    result = check_offsets(h)

    assert named(result) == {"phantom-commit"}
    example = result.anomalies["phantom-commit"][0]
    assert (example["final_committed"], example["attempted"]) == (50, 8)


def test_no_member_commit_after_heal_when_only_earlier_commits_were_acknowledged() -> None:
    """The probe commits of the runner say nothing of the members: a group whose members stop
    committing after a fault (a stale epoch, say) while the coordinator answers the probe."""
    h = healthy_groups_history()
    heal(h, 5.0)
    commit(h, 6.0, "m1", {0: 8}, outcome=INFO)  # attempted, never acknowledged

    assert named(check_offsets(h)) == {"no-member-commit-after-heal"}
    commit(h, 7.0, "m1", {0: 8})
    assert check_offsets(h).valid


def test_lost_commit_when_the_final_read_is_below_an_acknowledged_commit() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    commit(h, 2.0, "m1", {0: 5})
    consume(h, 1.0, "m1", 1, range(3))
    commit(h, 2.5, "m1", {1: 3})
    committed(h, 10.0, {0: 4})  # and partition 1 is missing altogether

    result = check_offsets(h)

    assert named(result) == {"lost-commit"}
    lost = result.anomalies["lost-commit"]
    assert [(x["partition"], x["final_committed"]) for x in lost] == [(0, 4), (1, None)]
    assert lost[0]["acknowledged"]["offset"] == 5


def final_read(h: History, t: float, offsets: dict[int, int]) -> None:
    """The runner's final read, after the last heal, with its invoke."""
    value = {"group": "g", "topic": "t"}
    h.add("checker", INVOKE, "committed", value, time=t)
    h.add("checker", OK, "committed", {**value, "offsets": offsets}, time=t + 0.1)


def read_committed(h: History, t: float, done_t: float, offsets: dict[int, int]) -> None:
    value = {"group": "g", "topic": "t"}
    h.add("reader", INVOKE, "committed", value, time=t)
    h.add("reader", OK, "committed", {**value, "offsets": offsets}, time=done_t)


def test_a_read_during_faults_must_see_every_commit_acknowledged_before_it() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(8))
    commit(h, 2.0, "m1", {0: 5})  # acknowledged at 2.1
    read_committed(h, 2.05, 2.3, {0: 3})  # sent before the ack: may miss it
    read_committed(h, 3.0, 3.1, {0: 3})  # sent after: must see it (an isolated coordinator's ack)
    commit(h, 4.0, "m1", {0: 8})
    committed(h, 10.0, {0: 8})  # the final read is fine: later commits hide the loss

    result = check_offsets(h)

    assert named(result) == {"lost-commit"}
    (lost,) = result.anomalies["lost-commit"]
    assert (lost["read"], lost["acknowledged"]["offset"], lost["read_event"]) == (3, 5, 6)


def test_an_unacknowledged_commit_may_be_lost_or_kept() -> None:
    h = healthy_groups_history()
    consume(h, 5.0, "m1", 0, range(8, 12))
    commit(h, 6.0, "m1", {0: 12}, outcome=INFO)  # a timeout: lost is fine
    commit(h, 7.0, "m1", {0: 10}, outcome=FAIL)  # a definite failure
    assert check_offsets(h).valid

    h2 = healthy_groups_history()
    consume(h2, 5.0, "m1", 0, range(8, 12))
    commit(h2, 6.0, "m1", {0: 12}, outcome=INFO)
    committed(h2, 11.0, {0: 12})  # the timed-out commit took effect after all
    assert check_offsets(h2).valid


def test_no_final_committed_read_is_not_taken_as_durable() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    commit(h, 2.0, "m1", {0: 5})
    h.add("checker", FAIL, "committed", {"group": "g", "topic": "t"}, time=9.0)

    assert named(check_offsets(h)) == {"no-final-committed"}


def test_regressed_commit_when_a_later_commit_goes_back() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    commit(h, 2.0, "m1", {0: 5})  # ok at 2.1
    consume(h, 3.0, "m2", 0, range(3))
    commit(h, 4.0, "m2", {0: 3})  # invoked after the ok of 5
    committed(h, 10.0, {0: 5})

    result = check_offsets(h)

    assert named(result) == {"regressed-commit"}
    example = result.anomalies["regressed-commit"][0]
    assert (example["earlier"]["offset"], example["later"]["offset"]) == (5, 3)


def member_read(
    h: History, t: float, member: str, offsets: dict[int, int], generation: int
) -> None:
    """A member's read of its partitions' committed offsets (``read_committed``)."""
    value = {"group": "g", "topic": "t", "member": member, "generation": generation}
    h.add(member, INVOKE, "committed", {**value, "partitions": sorted(offsets)}, time=t)
    h.add(member, OK, "committed", {**value, "partitions": sorted(offsets), "offsets": offsets},
          time=t + 0.1)  # fmt: skip


def stale_member_commit(member_saw: int, final: int, *, runner_saw: int | None = None) -> History:
    """m1 commits 5; m2, at a stale position of 3, reads its committed offset (``member_saw``)
    and commits 3; the runner reads ``runner_saw`` meanwhile, if given, and ``final`` last."""
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    commit(h, 2.0, "m1", {0: 5})
    consume(h, 3.0, "m2", 0, range(3))
    member_read(h, 3.5, "m2", {0: member_saw}, generation=2)
    commit(h, 4.0, "m2", {0: 3}, generation=2)
    if runner_saw is not None:
        read_committed(h, 4.5, 4.6, {0: runner_saw})
    committed(h, 10.0, {0: final})
    return h


@pytest.mark.parametrize(
    ("read", "stale"),
    [
        (5, True),  # the coordinator had kept 5: m2 went back from its own position
        (3, False),  # it served less than was acknowledged: still an anomaly
    ],
)
def test_a_member_going_back_from_its_own_position_is_not_a_regressed_commit(
    read: int, stale: bool
) -> None:
    """kafka-python keeps a partition's position through an eager rebalance and commits
    below what another member committed meanwhile (chaos seed 3406); a read of the committed
    offset it made first, in that generation, shows whether the coordinator had kept it."""
    result = check_offsets(stale_member_commit(read, 5))

    assert named(result) == (set() if stale else {"regressed-commit"})
    assert result.stats["stale_position_commits"] == (1 if stale else 0)
    # A read in another generation, or after the commit, proves nothing.
    h2 = History()
    consume(h2, 1.0, "m1", 0, range(5))
    commit(h2, 2.0, "m1", {0: 5})
    consume(h2, 3.0, "m2", 0, range(3))
    member_read(h2, 3.5, "m2", {0: 5}, generation=1)
    commit(h2, 4.0, "m2", {0: 3}, generation=2)
    member_read(h2, 5.0, "m2", {0: 5}, generation=2)
    committed(h2, 10.0, {0: 5})
    assert named(check_offsets(h2)) == {"regressed-commit"}


def classic_member_read(
    h: History, t: float, member: str, offsets: dict[int, int], generation: int
) -> None:
    """A kafka-python member's read as the workload records it (with its protocol)."""
    value = {"group": "g", "topic": "t", "member": member, "generation": generation,
             "group_protocol": "classic", "partitions": sorted(offsets)}  # fmt: skip
    h.add(member, INVOKE, "committed", value, time=t)
    h.add(member, OK, "committed", {**value, "offsets": offsets}, time=t + 0.1)


@pytest.mark.parametrize("later_generation_commit", [False, True])
def test_a_members_read_as_its_generation_begins_must_see_acknowledged_commits(
    later_generation_commit: bool,
) -> None:
    """m1's commit of 150 is acknowledged, then lost on a failover; m2, the partition's next
    owner, reads 100, consumes past 150 in one batch and commits 300, which the final read
    shows. Nothing saw the loss (found by a review): the members' reads went unchecked. A
    read by a member whose group had moved to a later generation before the answer (a
    coordinator cut off from the others may serve it) proves nothing."""
    h = History()
    consume(h, 1.0, "m1", 0, range(150))
    commit(h, 1.1, "m1", {0: 100}, protocol="classic")
    commit(h, 2.0, "m1", {0: 150}, protocol="classic")
    if later_generation_commit:
        commit(h, 5.4, "m3", {0: 100}, generation=3, protocol="classic", outcome=INFO)
    classic_member_read(h, 5.5, "m2", {0: 100}, generation=2)
    consume(h, 5.7, "m2", 0, range(100, 300))
    commit(h, 5.8, "m2", {0: 300}, generation=2, protocol="classic")
    final_read(h, 40.0, {0: 300})

    result = check_offsets(h)

    if later_generation_commit:
        assert result.valid, result.anomalies
        return
    assert named(result) == {"lost-commit"}
    (lost,) = result.anomalies["lost-commit"]
    assert (lost["read"], lost["acknowledged"]["offset"]) == (100, 150)
    assert "member's read" in lost["reason"]


def test_a_lower_commit_acknowledged_later_is_what_a_read_may_see() -> None:
    """Kafka's last writer wins: a member with a stale position commits 3 after another's 5
    was acknowledged (excused as stale by its own read), and the coordinator holds 3. A read
    (during faults, or the final one) seeing 3 lost nothing; it was flagged as lost-commit
    for not seeing the highest acknowledged offset. An older value than both still is."""

    fine = check_offsets(stale_member_commit(5, 3, runner_saw=3))
    assert fine.valid and fine.stats["stale_position_commits"] == 1
    lost = check_offsets(stale_member_commit(5, 2, runner_saw=2))
    assert named(lost) == {"lost-commit"}
    assert {x["acknowledged"]["offset"] for x in lost.anomalies["lost-commit"]} == {3}


def test_a_committed_offset_read_does_not_go_back_without_a_commit_of_it() -> None:
    """A commit of 60 times out (``info``), yet a read sees it: it took effect. A later read
    seeing 40 again, with no commit of 40 that could land after the first read, means the
    state that read saw was undone (an uncommitted write served, a log truncated under it);
    no acknowledged commit was lost, so nothing else caught it."""
    h = History()
    consume(h, 1.0, "m1", 0, range(60))
    commit(h, 1.1, "m1", {0: 40})
    commit(h, 2.0, "m1", {0: 60}, outcome=INFO, done_t=7.0)
    read_committed(h, 5.0, 5.1, {0: 60})
    # While faults are on, a read may reach a coordinator cut off from the others that does
    # not know it was replaced yet; its older value proves nothing.
    read_committed(h, 9.0, 9.1, {0: 40})
    assert named(check_offsets(h)) == {"no-final-committed"}  # a mid-run read is not final
    final_read(h, 60.0, {0: 40})  # after the last heal: the partition's current leader
    result = check_offsets(h)
    assert named(result) == {"regressed-read"}
    example = result.anomalies["regressed-read"][0]
    assert (example["earlier_offset"], example["offset"]) == (60, 40)

    # A commit of 40 sent after the first read was sent (a stale member's, say): fine.
    commit(h, 8.0, "m2", {0: 40})
    assert check_offsets(h).valid


def test_a_lost_commit_in_the_final_read_is_reported_once() -> None:
    """The final read has an invoke, as the runner's reads during faults do: it is judged by
    the final rule alone, not counted twice."""
    h = History()
    consume(h, 1.0, "m1", 0, range(50))
    commit(h, 1.1, "m1", {0: 50})
    final_read(h, 60.0, {0: 10})
    result = check_offsets(h)
    assert result.stats["anomaly_counts"] == {"lost-commit": 1}


def test_a_commit_the_client_gave_up_on_may_still_land_later() -> None:
    """``info``: the client stopped waiting (a timeout, a dropped connection), not the
    coordinator, which may apply the commit after another member's acknowledged one. A read
    seeing it then lost nothing; it was flagged as lost-commit, where the same commit left
    unanswered was not."""
    h = History()
    consume(h, 0.5, "m1", 0, range(10))
    consume(h, 0.6, "m2", 0, range(50))
    commit(h, 1.0, "m1", {0: 10}, outcome=INFO, done_t=6.0)
    commit(h, 2.0, "m2", {0: 50})  # ok at 2.1
    read_committed(h, 7.0, 7.1, {0: 10})
    committed(h, 60.0, {0: 10})
    assert check_offsets(h).valid


def test_concurrent_commits_may_land_in_either_order() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    consume(h, 1.0, "m2", 0, range(3))
    commit(h, 2.0, "m1", {0: 5}, done_t=3.0)
    commit(h, 2.5, "m2", {0: 3}, done_t=3.5)  # invoked before 5 was acknowledged
    committed(h, 10.0, {0: 5})

    assert check_offsets(h).valid


def test_commit_beyond_consumed() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(3))
    commit(h, 2.0, "m1", {0: 5})  # consumed 0..2, commits "next is 5"
    committed(h, 10.0, {0: 5})

    result = check_offsets(h)

    assert named(result) == {"commit-beyond-consumed"}
    example = result.anomalies["commit-beyond-consumed"][0]
    assert example["commit"]["offset"] == 5
    assert example["highest_consumed_before"] == 2


def test_consuming_after_the_commit_does_not_excuse_it() -> None:
    h = History()
    commit(h, 1.0, "m1", {0: 3})
    consume(h, 2.0, "m1", 0, range(3))
    committed(h, 10.0, {0: 3})

    assert named(check_offsets(h)) == {"commit-beyond-consumed"}


def test_starting_at_an_offset_after_committing_it_does_not_excuse_it() -> None:
    h = History()
    commit(h, 1.0, "m1", {0: 5})  # nothing consumed, nothing committed before: a bogus 5
    consume(h, 2.0, "m1", 0, range(5, 7))  # then m1 resumes from that committed 5
    commit(h, 3.0, "m1", {0: 7})
    committed(h, 10.0, {0: 7})

    result = check_offsets(h)

    assert result.stats["anomaly_counts"] == {"commit-beyond-consumed": 1}
    assert result.anomalies["commit-beyond-consumed"][0]["commit"]["offset"] == 5


def test_another_members_consumption_does_not_count() -> None:
    h = History()
    consume(h, 1.0, "m2", 0, range(3))
    commit(h, 2.0, "m1", {0: 3})
    committed(h, 10.0, {0: 3})

    assert named(check_offsets(h)) == {"commit-beyond-consumed"}


def test_recommitting_a_position_or_the_start_is_allowed() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    commit(h, 2.0, "m1", {0: 5})
    # m2 takes partition 0 over at the committed 5 and commits its position before consuming.
    commit(h, 3.0, "m2", {0: 5})
    # m3 starts on partition 1 at offset 7 (auto.offset.reset=latest) and commits that start.
    consume(h, 4.0, "m3", 1, range(7, 9))
    commit(h, 5.0, "m3", {1: 7})
    commit(h, 5.5, "m3", {1: 9})
    # The log start needs nothing consumed.
    commit(h, 6.0, "m4", {2: 0})
    committed(h, 10.0, {0: 5, 1: 9, 2: 0})

    result = check_offsets(h)
    assert result.valid, result.anomalies


def test_recommitting_needs_an_earlier_attempt_of_that_offset() -> None:
    h = History()
    commit(h, 1.0, "m2", {0: 5})  # nobody ever stored 5
    commit(h, 1.0, "m3", {0: 6}, outcome=FAIL)  # a definite failure stored nothing
    commit(h, 2.0, "m1", {0: 6})
    committed(h, 10.0, {0: 6})

    result = check_offsets(h)
    assert result.stats["anomaly_counts"] == {"commit-beyond-consumed": 2}


def test_a_malformed_commit_fails_the_check() -> None:
    h = History()
    h.add("m1", OK, "commit", {"group": "g", "offsets": {"zero": 1}}, time=1.0)

    result = check_offsets(h)

    assert not result.valid
    assert result.anomalies[MALFORMED][0]["event"] == 0


def test_examples_are_capped_but_every_anomaly_is_counted() -> None:
    h = History()
    for partition in range(MAX_EXAMPLES + 5):
        commit(h, 1.0, "m1", {partition: 3})
    committed(h, 10.0, dict.fromkeys(range(MAX_EXAMPLES + 5), 3))

    result = check_offsets(h)

    assert len(result.anomalies["commit-beyond-consumed"]) == MAX_EXAMPLES
    assert result.stats["anomaly_counts"]["commit-beyond-consumed"] == MAX_EXAMPLES + 5


# ---------------------------------------------------------------------------------------------
# Groups


def healthy_group_history() -> History:
    h = History()
    h.add("runner", INFO, "topic", {"topic": "t", "partitions": 3}, time=0.0)
    assignment(h, 1.0, "a", [0, 1, 2], 1)
    assignment(h, 2.0, "a", [0, 1], 2)
    assignment(h, 2.0, "b", [2], 2)
    h.add("nemesis", INFO, "start", {"fault": "kill", "targets": ["n2"], "detail": {}}, time=3)
    assignment(h, 5.0, "a", [0, 1, 2], 3)  # b's session expired during the fault
    heal(h, 8.0)
    assignment(h, 12.0, "a", [0, 1], 4)
    assignment(h, 12.0, "b", [2], 4, member_id="b-id2")  # b rejoined with a new id
    describe(h, 13.0, ["a-id", "b-id2"], generation=4)
    return h


def test_groups_valid_history() -> None:
    result = check_groups(healthy_group_history())
    assert result.valid, result.anomalies
    assert result.stats["partitions_source"] == "topic-events"
    assert result.stats["max_generation"] == {"g": 4}
    assert result.stats["stable_after_heal_s"] == {"g": 5.0}


def test_split_ownership_in_one_generation() -> None:
    h = healthy_group_history()
    assignment(h, 14.0, "c", [1], 4)

    result = check_groups(h, partitions_by_topic={"t": 3})

    assert "split-ownership" in named(result)
    example = result.anomalies["split-ownership"][0]
    assert (example["generation"], example["partition"]) == (4, 1)
    assert {o["member"] for o in example["owners"]} == {"a", "c"}


def test_a_partition_may_move_between_generations_or_to_a_replaced_static_member() -> None:
    h = History()
    assignment(h, 1.0, "a", [0], 1)
    assignment(h, 2.0, "b", [0], 2)  # moved in a later generation
    # "b" restarted as a static member: same member, new member_id, no rebalance (KIP-345).
    assignment(h, 3.0, "b", [0], 2, member_id="b-id2")
    describe(h, 4.0, ["b-id2"], generation=2)

    result = check_groups(h, partitions_by_topic={"t": 1})
    assert result.valid, result.anomalies


def test_unowned_partition_after_heal() -> None:
    h = healthy_group_history()
    assignment(h, 12.5, "a", [0], 4)  # partition 1 now owned by nobody

    result = check_groups(h)

    assert named(result) == {"unowned-after-heal"}
    example = result.anomalies["unowned-after-heal"][0]
    assert (example["reason"], example["partitions"]) == ("unowned partitions", [1])


def test_members_disagreeing_on_the_generation_after_heal() -> None:
    h = healthy_group_history()
    assignment(h, 12.5, "b", [2], 5, member_id="b-id2")

    result = check_groups(h)

    assert named(result) == {"unowned-after-heal"}
    example = result.anomalies["unowned-after-heal"][0]
    assert example["reason"] == "generation disagreement"
    assert example["generations"] == {"a-id": 4, "b-id2": 5, "describe": 4}


def test_rebalances_after_the_final_describe_do_not_count() -> None:
    """The runner stops the members after describing the group: each clean leave makes the
    rest rebalance, so their last assignments then disagree; the described state is final."""
    h = healthy_group_history()
    assignment(h, 14.0, "b", [0, 1, 2], 5, member_id="b-id2")  # a left

    result = check_groups(h)
    assert result.valid, result.anomalies


def test_a_live_member_without_assignment_after_heal() -> None:
    h = healthy_group_history()
    describe(h, 14.0, ["a-id", "b-id2", "c-id"], generation=4)

    result = check_groups(h)

    assert named(result) == {"unowned-after-heal"}
    assert result.anomalies["unowned-after-heal"][0]["member_id"] == "c-id"


def test_without_describe_live_members_are_those_assigned_after_heal() -> None:
    h = History()
    assignment(h, 1.0, "a", [0], 1)
    assignment(h, 1.0, "b", [1], 1)
    heal(h, 5.0)
    assignment(h, 6.0, "a", [0, 1], 2)

    result = check_groups(h, partitions_by_topic={"t": 2})
    assert named(result) == {"not-stable-after-heal"}  # ownership itself is complete

    h2 = History()
    assignment(h2, 1.0, "a", [0], 1)
    assignment(h2, 1.0, "b", [1], 1)
    heal(h2, 5.0)
    assignment(h2, 6.0, "a", [0], 2)
    result2 = check_groups(h2, partitions_by_topic={"t": 2})
    assert named(result2) == {"not-stable-after-heal", "unowned-after-heal"}


def test_partition_count_is_inferred_without_topic_event() -> None:
    h = History()
    send(h, 0.0, "producer", "x", (2, 0), topic="t")
    assignment(h, 1.0, "a", [0, 1], 1)
    describe(h, 2.0, ["a-id"])

    result = check_groups(h)

    assert result.stats["partitions_source"] == "inferred"
    assert result.anomalies["unowned-after-heal"][0]["partitions"] == [2]


@pytest.mark.parametrize(
    ("state", "describe_t", "reason"),
    [("PreparingRebalance", 13.0, "state"), ("Stable", 80.0, "late")],
)
def test_not_stable_after_heal(state: str, describe_t: float, reason: str) -> None:
    h = healthy_group_history()
    describe(h, describe_t, ["a-id", "b-id2"], state=state, generation=4)

    result = check_groups(h)

    assert named(result) == {"not-stable-after-heal"}
    assert result.anomalies["not-stable-after-heal"][0]["reason"] == reason


def test_an_assignment_without_member_id_fails_the_check() -> None:
    h = healthy_group_history()
    h.add(
        "c",
        INFO,
        "assignment",
        {"group": "g", "topic": "t", "member_id": None, "generation": 4, "partitions": [1]},
        time=14.0,
    )

    result = check_groups(h)

    assert named(result) == {MALFORMED}
    assert "member_id" in result.anomalies[MALFORMED][0]["error"]


def test_no_final_describe_is_not_stable() -> None:
    h = History()
    assignment(h, 1.0, "a", [0], 1)

    result = check_groups(h, partitions_by_topic={"t": 1})

    assert result.anomalies == {
        "not-stable-after-heal": [{"group": "g", "reason": "no final describe"}]
    }


# ---------------------------------------------------------------------------------------------
# Queue


def healthy_queue_history() -> History:
    h = History()
    h.add("c1", INFO, "subscribe", {"member": "c1", "topic": "q"}, time=0.0)
    send(h, 1.0, "p1", "a", (0, 0))
    send(h, 2.0, "p1", "b", (0, 1))
    send(h, 3.0, "p1", "c", (0, 2))
    send(h, 3.5, "p2", "z", (1, 0))
    send(h, 4.0, "p2", "maybe", (1, 1), outcome=INFO)  # may or may not appear
    send(h, 4.5, "p2", "never", (1, 1), outcome=FAIL)
    poll(h, 5.0, "c1", [(0, 0, "a"), (0, 1, "b")])
    poll(h, 6.0, "c1", [(0, 2, "c"), (1, 0, "z")])
    final_poll(h, 10.0, [(0, 0, "a"), (0, 1, "b"), (0, 2, "c")])
    final_poll(h, 10.5, [(1, 0, "z")])
    return h


def test_queue_valid_history() -> None:
    result = check_queue(healthy_queue_history())
    assert result.valid, result.anomalies
    assert result.stats["final_polls"] == 2
    assert result.stats["sends"] == {OK: 4, FAIL: 1, INFO: 1, INVOKE: 0}


def test_an_info_send_may_appear() -> None:
    h = healthy_queue_history()
    poll(h, 7.0, "c1", [(1, 1, "maybe")])
    final_poll(h, 11.0, [(1, 1, "maybe")])
    result = check_queue(h)
    assert result.valid, result.anomalies


def test_lost_read_when_a_record_a_consumer_read_is_gone_at_the_end() -> None:
    """A send whose outcome is unknown counts as written once a poll read it (Jepsen): the
    consumer saw it below the high watermark, so it must survive."""
    h = healthy_queue_history()
    poll(h, 7.0, "c1", [(1, 1, "maybe")])

    result = check_queue(h)

    assert named(result) == {"lost-read"}
    assert result.anomalies["lost-read"] == [
        {"topic": "q", "partition": 1, "offset": 1, "value": "maybe", "read": 17}
    ]
    final_poll(h, 11.0, [(1, 1, "maybe")])
    assert check_queue(h).valid


def test_lost_write_when_a_later_offset_was_read() -> None:
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))
    send(h, 2.0, "p1", "b", (0, 1))
    send(h, 3.0, "p1", "c", (0, 2))
    poll(h, 5.0, "c1", [(0, 0, "a")])
    poll(h, 6.0, "c2", [(0, 2, "c")])  # c2's first read: not a skip by itself
    final_poll(h, 10.0, [(0, 0, "a"), (0, 2, "c")])

    result = check_queue(h)

    assert named(result) == {"lost-write", "unseen"}
    assert result.anomalies["lost-write"] == [
        {"topic": "q", "partition": 0, "offset": 1, "value": "b", "send": 3, "max_read_offset": 2}
    ]


def test_unseen_when_the_final_polls_miss_an_acknowledged_send() -> None:
    h = healthy_queue_history()
    send(h, 7.0, "p1", "d", (0, 3))  # beyond everything read: unseen, not lost

    result = check_queue(h)

    assert named(result) == {"unseen"}
    assert result.anomalies["unseen"][0]["value"] == "d"


def test_without_final_polls_unseen_is_checked_only_when_required() -> None:
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))
    poll(h, 2.0, "c1", [(0, 0, "a")])

    assert named(check_queue(h)) == {"unseen"}
    relaxed = check_queue(h, require_final_poll=False)
    assert relaxed.valid
    assert relaxed.stats["unseen_checked"] is False


def test_a_send_acknowledged_without_an_offset_must_be_read_once() -> None:
    # librdkafka's implicit ack: offset unknown, but the value must be in the log.
    h = healthy_queue_history()
    send(h, 7.0, "p1", "d", (0, None))
    assert named(check_queue(h)) == {"unseen"}
    final_poll(h, 11.0, [(0, 3, "d")])
    result = check_queue(h)
    assert result.valid, result.anomalies
    final_poll(h, 12.0, [(0, 4, "d")])  # written twice after all
    assert named(check_queue(h)) == {"duplicate"}


def test_duplicate_value_at_two_offsets() -> None:
    h = healthy_queue_history()
    final_poll(h, 11.0, [(0, 3, "a")])  # "a" again, at offset 3

    result = check_queue(h)

    assert "duplicate" in named(result)
    assert result.anomalies["duplicate"][0]["offsets"] == [0, 3]


def log_copies(h: History, value: str, sessions: dict[int, tuple[int, int]]) -> None:
    """What the runner reads from the nodes' logs: who wrote each copy of ``value``."""
    copies = [
        {"offset": o, "producer_id": pid, "producer_epoch": epoch, "sequence": 0}
        for o, (pid, epoch) in sorted(sessions.items())
    ]
    h.add(
        "checker",
        INFO,
        LOG_COPIES_F,
        {"topic": "q", "partition": 0, "value": value, "copies": copies},
        time=20.0,
    )


def test_a_value_resent_under_a_newer_producer_epoch_is_the_clients_not_a_duplicate() -> None:
    # librdkafka #4953: the second copy was written under epoch 1 of the same producer id.
    h = healthy_queue_history()
    final_poll(h, 11.0, [(0, 3, "a")])
    log_copies(h, "a", {0: (7, 0), 3: (7, 1)})

    result = check_queue(h)

    assert result.valid, result.anomalies
    assert result.stats["client_resends"] == 1
    assert result.stats["client_resend_examples"][0]["sessions"] == [(7, 0), (7, 1)]


@pytest.mark.parametrize(
    "sessions",
    [
        {0: (7, 1), 3: (7, 1)},  # one session wrote it twice: the broker's duplicate
        {0: (7, 1), 3: (7, 0)},  # the older epoch's copy after the newer one's: not fenced
        {0: (-1, -1), 3: (-1, -1)},  # no idempotent producer
        {0: (7, 0)},  # the log does not hold the copy at offset 3
    ],
)
def test_a_duplicate_stays_one_unless_each_copy_is_a_newer_session(
    sessions: dict[int, tuple[int, int]],
) -> None:
    h = healthy_queue_history()
    final_poll(h, 11.0, [(0, 3, "a")])
    log_copies(h, "a", sessions)

    result = check_queue(h)

    assert named(result) == {"duplicate"}
    assert result.stats["client_resends"] == 0


def test_a_malformed_log_copies_event_fails_the_check() -> None:
    h = healthy_queue_history()
    h.add("checker", INFO, LOG_COPIES_F, {"topic": "q", "value": "a"}, time=20.0)
    assert named(check_queue(h)) == {MALFORMED}


def test_inconsistent_offsets_two_values_at_one_offset() -> None:
    h = healthy_queue_history()
    poll(h, 7.0, "c2", [(0, 1, "x")])

    result = check_queue(h)

    assert "inconsistent-offsets" in named(result)
    example = result.anomalies["inconsistent-offsets"][0]
    assert (example["offset"], sorted(example["values"])) == (1, ["b", "x"])


def test_a_write_overwritten_at_the_highest_offset_read_is_lost() -> None:
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))
    send(h, 2.0, "p1", "b", (0, 1))
    poll(h, 3.0, "c1", [(0, 0, "a"), (0, 1, "x")])  # "x" where "b" was acknowledged
    final_poll(h, 10.0, [(0, 0, "a"), (0, 1, "x")])

    result = check_queue(h)

    assert named(result) == {"lost-write", "unseen", "inconsistent-offsets", "unexpected"}
    assert result.anomalies["lost-write"][0]["value"] == "b"
    assert result.anomalies["unexpected"][0]["value"] == "x"


def test_poll_skip_within_one_consumer() -> None:
    h = healthy_queue_history()
    send(h, 7.0, "p1", "d", (0, 3))
    send(h, 7.5, "p1", "e", (0, 4))
    poll(h, 8.0, "c1", [(0, 4, "e")])  # c1 was at 2, skips 3
    final_poll(h, 12.0, [(0, 3, "d"), (0, 4, "e")])

    result = check_queue(h)

    assert named(result) == {"poll-skip"}
    example = result.anomalies["poll-skip"][0]
    assert (example["offsets"], example["skipped"]) == ([2, 4], [3])


def test_an_offset_nobody_wrote_or_read_is_not_a_skip() -> None:
    h = healthy_queue_history()
    send(h, 7.5, "p1", "e", (0, 4))  # offset 3 is a gap (say a transaction marker)
    poll(h, 8.0, "c1", [(0, 4, "e")])
    final_poll(h, 12.0, [(0, 4, "e")])

    result = check_queue(h)
    assert result.valid, result.anomalies


def test_nonmonotonic_poll_within_one_consumer() -> None:
    h = healthy_queue_history()
    poll(h, 7.0, "c1", [(0, 1, "b")])  # back from 2 to 1, no rebalance

    result = check_queue(h)

    assert named(result) == {"nonmonotonic-poll"}
    assert result.anomalies["nonmonotonic-poll"][0]["offsets"] == [2, 1]


def test_nonmonotonic_poll_inside_one_poll() -> None:
    h = healthy_queue_history()
    poll(h, 7.0, "c2", [(0, 0, "a"), (0, 2, "c"), (0, 1, "b")])

    assert named(check_queue(h)) == {"poll-skip", "nonmonotonic-poll"}


@pytest.mark.parametrize(
    "rebalance",
    [
        ("c1", "revoked", {"member": "c1", "partitions": [0, 1]}),
        ("c1", "lost", {"member": "c1"}),
        ("c1", "assign", {"member": "c1", "topic": "q", "partitions": [0]}),
        ("c1", "subscribe", {"member": "c1", "topic": "q"}),
        ("nemesis", "start", {"fault": "clients", "targets": ["c1"], "detail": {}}),
        ("c1", "process-start", {"module": "kcoord.chaos.queue_consumer", "cfg": {}}),
    ],
)
def test_a_rebalance_between_polls_resets_monotonicity(
    rebalance: tuple[str, str, dict[str, Any]],
) -> None:
    h = healthy_queue_history()
    process, f, value = rebalance
    h.add(process, INFO, f, value, time=6.5)
    poll(h, 7.0, "c1", [(0, 0, "a")])  # re-reads from an earlier committed offset

    result = check_queue(h)
    assert result.valid, result.anomalies


def test_a_new_generation_between_polls_resets_monotonicity() -> None:
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))
    send(h, 2.0, "p1", "b", (0, 1))
    poll(h, 3.0, "c1", [(0, 0, "a"), (0, 1, "b")], generation=1)
    poll(h, 4.0, "c1", [(0, 0, "a")], generation=2)
    poll(h, 5.0, "c1", [(0, 0, "a")], generation=2)  # same generation: back again
    final_poll(h, 10.0, [(0, 0, "a"), (0, 1, "b")])

    result = check_queue(h)

    assert result.stats["anomaly_counts"] == {"nonmonotonic-poll": 1}
    assert result.anomalies["nonmonotonic-poll"][0]["events"] == [5, 6]


def test_a_cooperative_revoke_resets_only_the_partitions_it_lists() -> None:
    h = healthy_queue_history()
    h.add("c1", INFO, "revoked", {"member": "c1", "partitions": [1]}, time=6.5)
    poll(h, 7.0, "c1", [(1, 0, "z"), (0, 0, "a")])  # partition 0 was kept: going back is wrong

    result = check_queue(h)

    assert named(result) == {"nonmonotonic-poll"}
    assert result.anomalies["nonmonotonic-poll"][0]["partition"] == 0


def test_final_polls_restart_from_zero_without_breaking_monotonicity() -> None:
    h = healthy_queue_history()
    poll(h, 11.0, "checker", [(0, 0, "a")], f="final-poll")
    assert check_queue(h).valid


def test_nonmonotonic_send() -> None:
    h = History()
    send(h, 1.0, "p1", "a", (0, 5))
    send(h, 2.0, "p1", "b", (0, 3))  # later send, lower offset
    send(h, 3.0, "p2", "c", (0, 4))  # another process: unrelated
    final_poll(h, 10.0, [(0, 3, "b"), (0, 4, "c"), (0, 5, "a")])

    result = check_queue(h)

    assert named(result) == {"nonmonotonic-send"}
    assert result.anomalies["nonmonotonic-send"][0]["offsets"] == [5, 3]


def test_two_sends_acknowledged_at_one_offset_are_nonmonotonic() -> None:
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))
    send(h, 2.0, "p1", "b", (0, 0))
    final_poll(h, 10.0, [(0, 0, "b")])

    result = check_queue(h)

    assert {"nonmonotonic-send", "inconsistent-offsets"} <= named(result)
    assert result.anomalies["nonmonotonic-send"][0]["offsets"] == [0, 0]


def test_aborted_read_of_a_failed_send() -> None:
    h = healthy_queue_history()
    poll(h, 7.0, "c2", [(1, 1, "never")])
    final_poll(h, 11.0, [(1, 1, "never")])

    result = check_queue(h)

    assert named(result) == {"aborted-read"}
    assert result.anomalies["aborted-read"][0]["value"] == "never"


# ---------------------------------------------------------------------------------------------
# Liveness


def probe(h: History, t: float, outcome: str) -> None:
    h.add("nemesis", INVOKE, "probe-commit", {"group": "probe", "offsets": {0: 1}}, time=t)
    h.add("nemesis", outcome, "probe-commit", {"group": "probe", "offsets": {0: 1}}, time=t + 1)


def test_liveness_valid_when_a_commit_follows_each_heal() -> None:
    h = History()
    probe(h, 1.0, OK)
    heal(h, 10.0)
    probe(h, 11.0, FAIL)
    probe(h, 14.0, OK)
    heal(h, 40.0)
    commit(h, 45.0, "m1", {0: 0})
    h.add("checker", OK, "committed", {"group": "g", "topic": "t", "offsets": {}}, time=200.0)

    result = check_liveness(h)

    assert result.valid, result.anomalies
    assert result.stats["recovery_s"] == [5.0, 5.1]


def test_no_commit_after_heal_within_the_bound() -> None:
    h = History()
    probe(h, 1.0, OK)  # before the heal: does not count
    heal(h, 10.0)
    probe(h, 11.0, FAIL)
    probe(h, 50.0, OK)

    result = check_liveness(h, commit_within_s=30.0)

    assert named(result) == {"no-commit-after-heal"}
    assert result.anomalies["no-commit-after-heal"][0]["first_ack_after_s"] == 41.0


def test_a_history_ending_before_the_bound_fails_only_without_any_ack() -> None:
    h = History()
    heal(h, 10.0)
    probe(h, 12.0, OK)
    assert check_liveness(h).valid

    h2 = History()
    heal(h2, 10.0)
    probe(h2, 12.0, INFO)
    result = check_liveness(h2)
    assert named(result) == {"no-commit-after-heal"}
    assert result.anomalies["no-commit-after-heal"][0]["history_ends_after_s"] == 3.0


def test_no_send_after_heal_when_the_run_has_producers() -> None:
    """The runner's probe commits kept a run whose producers died before the faults passing."""
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))  # before the heal: does not count
    heal(h, 10.0)
    probe(h, 11.0, OK)
    result = check_liveness(h, commit_within_s=30.0)
    assert named(result) == {"no-send-after-heal"}
    send(h, 12.0, "p1", "b", (0, 1))
    result = check_liveness(h, commit_within_s=30.0)
    assert result.valid, result.anomalies
    assert result.stats["max_send_recovery_s"] == 2.1
    without_producers = History()
    heal(without_producers, 10.0)
    probe(without_producers, 11.0, OK)
    assert check_liveness(without_producers).valid


# ---------------------------------------------------------------------------------------------
# Everything


def test_check_all_groups_is_json_serialisable() -> None:
    h = healthy_group_history()
    for event in healthy_groups_history():
        h.add(event.process, event.type, event.f, event.value, time=event.time + 1.0)
    probe(h, 9.0, OK)
    for offset in range(1, 8):  # what the members read, sent before
        send(h, 0.5, "producer-1", f"v{offset}", (0, offset), topic="t")
    send(h, 9.2, "producer-0", "v0", (0, 0), topic="t")  # after the heal
    commit(h, 9.5, "m1", {0: 8})  # the members commit again after the heal

    results = check_all(h, "groups")

    assert set(results) == {
        "offsets",
        "groups",
        "records",
        "consumed",
        "liveness",
        "progress",
        "fencing",
    }
    assert all_valid(results), {n: r.anomalies for n, r in results.items()}
    document = json.loads(json.dumps(results_as_dict(results)))
    assert document["valid"] is True
    assert document["checkers"]["groups"]["name"] == "groups"


def test_check_all_queue_names_the_failing_checker() -> None:
    h = healthy_queue_history()
    poll(h, 7.0, "c1", [(0, 1, "b")])
    heal(h, 8.0)

    results = check_all(h, "queue")

    assert set(results) == {"queue", "liveness", "progress", "fencing"}
    assert not all_valid(results)
    document = json.loads(json.dumps(results_as_dict(results)))
    assert document["checkers"]["queue"]["stats"]["anomaly_counts"] == {"nonmonotonic-poll": 1}
    assert set(document["checkers"]["liveness"]["anomalies"]) == {
        "no-commit-after-heal",
        "no-send-after-heal",
    }


def test_check_all_rejects_an_unknown_workload() -> None:
    with pytest.raises(ValueError, match="workload"):
        check_all(History(), "bank")


def test_a_run_that_did_nothing_does_not_pass() -> None:
    """A groups run whose producer died at once and whose members never committed passed:
    every checker had nothing to object to. So did a run whose client reports could not be
    recorded (the acknowledgements in them became unknown outcomes)."""
    h = History()
    heal(h, 1.0)
    probe(h, 2.0, OK)
    result = check_progress(h, "groups")
    assert named(result) == {"no-acknowledged-send", "no-member-commit"}
    assert named(check_progress(h, "queue")) == {"no-acknowledged-send"}
    send(h, 3.0, "p1", "a", (0, 0))
    commit(h, 3.5, "m1", {0: 1})
    assert check_progress(h, "groups").valid
    h.add("m1", INFO, UNRECORDED_REPORT_F, {"error": "ValueError()"}, time=4.0)
    assert named(check_progress(h, "groups")) == {"unrecorded-report"}


def test_every_group_with_members_must_have_a_commit_acknowledged() -> None:
    """One group committing kept a run passing whose other group had every commit refused
    (lost-commit then had nothing to look at)."""
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))
    for member, group in (("m1", "g"), ("m2", "other")):
        cfg = {"group": group, "topic": "t"}
        h.add(member, INFO, "process-start", {"module": MEMBER_MODULE, "cfg": cfg}, time=0.5)
    commit(h, 3.0, "m1", {0: 1})
    commit(h, 3.0, "m2", {0: 1}, group="other", outcome=INFO)
    result = check_progress(h, "groups")
    assert result.anomalies == {"no-member-commit": [{"group": "other"}]}
    commit(h, 4.0, "m2", {0: 1}, group="other")
    assert check_progress(h, "groups").valid


def test_a_client_that_exited_by_itself_fails_the_run() -> None:
    h = History()
    send(h, 1.0, "p1", "a", (0, 0))
    h.add("m1", INFO, PROCESS_EXIT_F, {"returncode": 1}, time=2.0)
    result = check_progress(h, "queue")
    assert named(result) == {"client-exited"}
    assert result.anomalies["client-exited"][0]["returncode"] == 1


def test_a_value_nobody_sent_is_an_unexpected_read() -> None:
    h = healthy_queue_history()
    poll(h, 7.0, "c2", [(1, 99, "garbage")])  # an offset past the others, read once
    final_poll(h, 20.0, [(1, 99, "garbage")])

    result = check_queue(h)

    assert "unexpected" in named(result)
    assert result.anomalies["unexpected"][0]["value"] == "garbage"


def test_the_groups_workload_checks_the_records_its_members_read() -> None:
    """An acknowledged record at offset 0 and a member that read something else there (and
    past it): the groups workload's verdict did not look at sends at all."""
    h = History()
    send(h, 1.0, "producer-0", "p0-0", (0, 0))
    poll(h, 2.0, "m1", [(0, 0, "OTHER"), (0, 1, "p0-1")])
    results = check_all(h, "groups")
    assert {"lost-write", "inconsistent-offsets"} <= named(results["records"])


def test_sends_are_matched_to_their_invokes_by_value() -> None:
    """A producer invokes a then b; the broker puts a at 10 and b at 5, and b's report comes
    first. Matched by order, b's completion took a's invoke time and the reordering was not
    seen."""
    h = History()
    for t, value in ((1.0, "a"), (1.1, "b")):
        h.add("p1", INVOKE, "send", {"topic": "q", "key": 0, "value": value}, time=t)
    for t, value, offset in ((2.0, "b", 5), (2.1, "a", 10)):
        done = {"topic": "q", "key": 0, "value": value, "partition": 0, "offset": offset}
        h.add("p1", OK, "send", done, time=t)
    assert "nonmonotonic-send" in named(check_queue(h, require_final_poll=False))


def test_a_killed_process_leaves_its_invoke_unanswered() -> None:
    """A static member killed during a commit restarts under the same name: its new
    process's first commit answered the dead one's invoke, and every later pair of that
    member was shifted by one."""
    h = History()
    h.add("static-0", INVOKE, "commit", {"group": "g", "offsets": {"0": 5}}, time=1.0)
    h.add("static-0", INFO, PROCESS_KILL_F, {}, time=2.0)
    again = h.add("static-0", INVOKE, "commit", {"group": "g", "offsets": {"0": 7}}, time=3.0)
    done = h.add("static-0", OK, "commit", {"group": "g", "offsets": {"0": 7}}, time=3.5)
    assert h.completion(again) == done
    assert [d for _, d in h.pairs("commit")] == [None, done]


def test_unconsumed_when_a_group_never_read_an_acknowledged_record() -> None:
    """Every group reads the whole topic: a record acknowledged to the producer that one group
    never consumed (lost, or skipped over by a member that started past it) fails the run,
    though another group read it."""
    h = History()
    for offset in range(3):
        send(h, 1.0 + offset, "producer-0", f"v{offset}", (0, offset), topic="t")
    send(h, 1.5, "producer-0", "implicit", (0, None), topic="t")  # acknowledged, no offset
    consume(h, 5.0, "m1", 0, [0, 2], group="g")  # v1 skipped
    consume(h, 5.0, "n1", 0, [0, 1, 2], group="other")
    h.add(
        "n1",
        OK,
        "consume",
        {"group": "other", "topic": "t", "records": [[0, 3, "implicit"]]},
        time=6.0,
    )
    h.add(
        "checker", OK, "describe", {"group": "quiet", "state": "Stable", "members": ["q"]}, time=9.0
    )
    # A group described without members (no client of its kind ran) is not one that reads.
    h.add("checker", FAIL, "describe", {"group": "absent", "error": "not Stable"}, time=9.0)
    h.add("checker", OK, "describe", {"group": "empty", "state": "Empty", "members": []}, time=9.0)

    result = check_consumed(h)

    assert {(x["group"], x["value"]) for x in result.anomalies["unconsumed"]} == {
        ("g", "v1"),
        ("g", "implicit"),
        *(("quiet", v) for v in ("v0", "v1", "v2", "implicit")),
    }
    assert result.stats["groups"] == 3


def callback(
    h: History, t: float, member: str, f: str, partitions: list[int], *, at: float
) -> None:
    """A rebalance callback of ``member``, recorded at ``t``, made at ``at`` by its clock."""
    value = {"group": "g", "topic": "t", "member": member, "partitions": partitions, "at": at}
    h.add(member, INFO, f, value, time=t)


def kip848_members(*members: str, protocol: str | None = "consumer") -> History:
    h = History()
    for member in members:
        cfg = {"group": "g", "topic": "t", "group_protocol": protocol}
        h.add(member, INFO, "process-start", {"module": MEMBER_MODULE, "cfg": cfg}, time=0.0)
    return h


def test_a_partition_handed_over_before_its_owner_revoked_it_is_an_early_handover() -> None:
    """KIP-848: the coordinator may give a partition to another member only once its owner
    acknowledged the revocation, after its callback. Each member's epoch is its own, so
    split-ownership never compared the two. The members' clocks order the callbacks: here
    the runner read a's revocation first, though b's assignment came before it."""
    h = kip848_members("a", "b")
    callback(h, 1.0, "a", "assigned", [0, 1], at=100.0)
    callback(h, 2.0, "a", "revoked", [1], at=102.0)
    callback(h, 3.0, "b", "assigned", [1], at=101.5)

    result = check_groups(h, partitions_by_topic={"t": 2})

    assert "early-handover" in named(result)
    example = result.anomalies["early-handover"][0]
    assert (example["partition"], example["holder"], example["taker"]) == (1, "a", "b")
    assert example["taken_before_revoked_s"] == 0.5


def test_a_handover_after_the_revocation_or_from_a_fenced_or_killed_owner_is_not() -> None:
    h = kip848_members("a", "b", "c")
    callback(h, 1.0, "a", "assigned", [0, 1, 2], at=100.0)
    callback(h, 2.0, "a", "revoked", [0], at=101.0)
    callback(h, 2.5, "b", "assigned", [0], at=101.2)  # after a's revocation
    callback(h, 3.0, "c", "assigned", [1], at=102.0)
    callback(h, 4.0, "a", "lost", [1], at=103.0)  # a was fenced: c took it legitimately
    callback(h, 4.5, "c", "assigned", [2], at=104.0)
    h.add("a", INFO, PROCESS_KILL_F, {}, time=5.0)  # a held 2 until it was killed
    callback(h, 6.0, "b", "revoked", [], at=106.0)  # every partition b holds
    callback(h, 7.0, "a.1", "assigned", [0], at=107.0)
    assert "early-handover" not in named(check_groups(h, partitions_by_topic={"t": 3}))


def test_classic_members_are_not_checked_for_early_handover() -> None:
    """An eager or kafka-python member whose session timed out still reports its partitions
    as revoked (no lost callback), after another member took them: not a finding."""
    h = kip848_members("a", "b", protocol=None)
    callback(h, 1.0, "a", "assigned", [0], at=100.0)
    callback(h, 2.0, "b", "assigned", [0], at=101.0)
    callback(h, 3.0, "a", "revoked", [0], at=102.0)
    assert "early-handover" not in named(check_groups(h, partitions_by_topic={"t": 1}))


# ---------------------------------------------------------------------------------------------
# Fencing


def _watch(h: History, at: float, **value: Any) -> None:
    base = {
        "node": 2,
        "hold_s": 1.5,
        "session_timeout_ms": 3000,
        "polls": 20,
        "answers": 20,
        "fenced_at_start": False,
        "fenced_seen_after_s": None,
    }
    h.add("nemesis", INFO, FENCING_WATCH_F, {**base, **value}, time=at)


def test_a_node_fenced_for_a_pause_shorter_than_the_session_timeout_is_false_fencing() -> None:
    """DESIGN §8: a short pause fences nobody. A node fenced already when the pause began (an
    earlier fault's), or a watch no node answered, is not judged."""
    h = History(clock=lambda: 0.0)
    _watch(h, 1.0)
    _watch(h, 2.0, fenced_at_start=True, fenced_seen_after_s=0.3)
    _watch(h, 3.0, answers=0, fenced_at_start=None)
    result = check_fencing(h)
    assert result.valid, result.anomalies
    assert result.stats["short_pauses_watched"] == 3 and result.stats["unanswered"] == 1
    _watch(h, 4.0, node=3, fenced_seen_after_s=2.9)
    h.add("nemesis", INFO, FENCING_WATCH_F, {"node": 1}, time=5.0)
    result = check_fencing(h)
    assert not result.valid
    assert [e["node"] for e in result.anomalies["false-fencing"]] == [3]
    assert result.stats["anomaly_counts"] == {"false-fencing": 1, "malformed-event": 1}


def test_a_classic_commit_that_timed_out_cannot_land_once_its_group_moved_on() -> None:
    """An ``info`` commit (a timeout, a refusal) was taken to land at any later time: its low
    offset became an acceptable value of every later read, the final one included, and a
    lost commit passed. Once a commit of a later classic generation of its group is
    acknowledged, the coordinator refuses it (ILLEGAL_GENERATION). Not so a KIP-848 member's
    older epoch: kcoord accepts it from a member that kept the partition (KIP-1251); nor a
    history that does not say the protocol. (review helper-211, helper-212)"""

    def history(protocol: str | None, timed_out: int, acked: tuple[str, int]) -> History:
        h = History()
        consume(h, 1.0, "m1", 0, range(100))
        consume(h, 1.5, "m2", 0, range(100))
        commit(h, 2.0, "m1", {0: 50}, outcome=INFO, generation=timed_out, protocol=protocol)
        commit(h, 3.0, acked[0], {0: 100}, generation=acked[1], protocol=protocol)
        committed(h, 10.0, {0: 50})
        return h

    # Another member's later classic generation fences it too: the generation is the group's.
    for acked in (("m1", 2), ("m2", 2)):
        assert named(check_offsets(history("classic", 1, acked))) == {"lost-commit"}
    assert check_offsets(history("classic", 2, ("m1", 2))).valid  # the same generation
    assert check_offsets(history("consumer", 5, ("m1", 7))).valid  # KIP-848 epochs
    assert check_offsets(history(None, 1, ("m1", 2))).valid  # protocol unknown


def test_a_commit_of_unknown_outcome_cannot_land_after_one_sent_once_it_was_surely_read() -> None:
    """Fenced only by a later classic generation, a KIP-848 member's timed-out commit of a low
    offset was taken to land at any later time: the final read of its partition passed at
    that offset while far more had been acknowledged since, a lost commit unseen. The
    coordinator has read it, if ever, ``DELIVERY_SLACK_S`` after the client gave up; within a
    fault's window it may wait until the heal, and TCP resends it within as long again as it
    had waited. A commit acknowledged that was sent after that overwrote it. (review
    helper-241)"""

    def history(
        acked_at: float,
        fault: tuple[float, float] | None = None,
        skipped: bool = False,
        kind: str = "pause",
    ) -> History:
        h = History()
        consume(h, 1.0, "m1", 0, range(100))
        if skipped:  # a fault that found no target: no window, and no heal follows
            h.add("nemesis", INVOKE, "start", {"fault": "pause"}, time=1.2)
            h.add("nemesis", INFO, "start", {"fault": "pause", "skipped": "no target"}, time=1.3)
        commit(h, 2.0, "m1", {0: 50}, outcome=INFO, generation=5, protocol="consumer")
        if fault is not None:
            h.add("nemesis", INVOKE, "start", {"fault": kind}, time=fault[0])
            h.add("nemesis", INFO, "heal", {"fault": kind}, time=fault[1])
        commit(h, acked_at, "m1", {0: 100}, generation=7, protocol="consumer")
        committed(h, acked_at + 5.0, {0: 50})
        return h

    gave_up = 2.1
    assert named(check_offsets(history(gave_up + DELIVERY_SLACK_S + 1))) == {"lost-commit"}
    assert check_offsets(history(gave_up + DELIVERY_SLACK_S - 1)).valid  # it may land after
    # Paused from 1.5 to 8.0: read by 8.0 + (8.0 - 2.0) + the slack at the latest.
    assert check_offsets(history(gave_up + DELIVERY_SLACK_S + 1, fault=(1.5, 8.0))).valid
    latest = 8.0 + 6.0 + DELIVERY_SLACK_S
    assert named(check_offsets(history(latest + 0.5, fault=(1.5, 8.0)))) == {"lost-commit"}
    assert check_offsets(history(latest - 0.5, fault=(1.5, 8.0))).valid
    late = gave_up + DELIVERY_SLACK_S + 1
    assert named(check_offsets(history(late, skipped=True))) == {"lost-commit"}
    # A client killed (its replacement started at once) holds no request anywhere: its
    # window excused the stale read for as long as a pause would have (review helper-278).
    assert named(check_offsets(history(late, fault=(1.5, 8.0), kind="clients"))) == {"lost-commit"}


def test_a_mid_run_read_does_not_stand_in_for_the_final_one() -> None:
    h = History()
    consume(h, 1.0, "m1", 0, range(5))
    commit(h, 2.0, "m1", {0: 5})
    h.add("reader", OK, "committed", {"group": "g", "topic": "t", "offsets": {0: 5}}, time=5.0)
    h.add("checker", FAIL, "committed", {"group": "g", "topic": "t"}, time=9.0)
    assert named(check_offsets(h)) == {"no-final-committed"}
