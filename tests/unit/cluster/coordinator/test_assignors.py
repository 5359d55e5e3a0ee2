"""The KIP-848 server-side assignors (``kcoord.cluster.coordinator.assignors``).

Property tests (Hypothesis, derandomized so that the suite is deterministic; a failure prints the
smallest group that shows it), then examples that pin the exact shapes, then determinism across
hash seeds (replicas are separate processes) and a performance sanity check.

Checked for both assignors: every partition of a subscribed topic is assigned exactly once, and
only to a member subscribed to it; every member is in the result; nothing else is. For uniform:
balance within one partition in the homogeneous case and Kafka's heterogeneous balance (no
subscriber of a topic that owns a partition of it has two more than another subscriber of it);
in the homogeneous case it keeps as many current partitions as any balanced assignment can, so
one member joining moves only the partitions it receives and one member leaving moves only its
own; its own output fed back as the current assignment comes back unchanged. For range:
contiguous ranges in member-id order, floor/ceil sizes per topic, co-partitioning.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kcoord.cluster.coordinator.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    Assignment,
    MemberSubscription,
    PartitionAssignor,
    RangeAssignor,
    UniformAssignor,
)

UNIFORM = UniformAssignor()
RANGE = RangeAssignor()

Members = dict[str, MemberSubscription]
Topics = dict[str, int]
Group = tuple[Members, Topics]
Owners = dict[tuple[str, int], str]

# Mixed case and punctuation so that "sorted" differs from any insertion order a test builds.
TOPIC_POOL = ("Zq3", "a-1", "b_2", "q", "ZZ", "m0")
MISSING_TOPIC = "not-in-metadata"
MEMBER_IDS = st.text(alphabet="abcxyzAB019-", min_size=1, max_size=6)

PROPERTY_SETTINGS = settings(max_examples=200, derandomize=True, deadline=None)


def sub(
    topic_ids: set[str] | frozenset[str], current: Mapping[str, set[int]] | None = None
) -> MemberSubscription:
    return MemberSubscription(
        frozenset(topic_ids), {t: frozenset(ps) for t, ps in (current or {}).items()}
    )


@st.composite
def groups(
    draw: st.DrawFn, *, homogeneous: bool | None = None, valid_current: bool = False
) -> Group:
    """A group and its topics.

    homogeneous: True gives every member the same subscription, False draws one per member,
    None picks either. valid_current: True makes the current assignment disjoint and in range
    (as a real target assignment is; its owner need not subscribe any more), False lets it hold
    anything (overlaps, unknown topics, partitions out of range).
    """
    topics = draw(st.dictionaries(st.sampled_from(TOPIC_POOL), st.integers(0, 12), max_size=5))
    member_ids = draw(st.lists(MEMBER_IDS, max_size=8, unique=True))
    subscribable = [*sorted(topics), MISSING_TOPIC]
    if homogeneous is None:
        homogeneous = draw(st.booleans())
    shared = draw(st.frozensets(st.sampled_from(subscribable)))
    subscriptions = {
        m: shared if homogeneous else draw(st.frozensets(st.sampled_from(subscribable)))
        for m in member_ids
    }

    current: dict[str, dict[str, set[int]]] = {m: {} for m in member_ids}
    if valid_current and member_ids:
        for topic_id in sorted(topics):
            owner_indices = draw(
                st.lists(
                    st.integers(-1, len(member_ids) - 1),
                    min_size=topics[topic_id],
                    max_size=topics[topic_id],
                )
            )
            for partition, index in enumerate(owner_indices):
                if index >= 0:
                    current[member_ids[index]].setdefault(topic_id, set()).add(partition)
    elif member_ids:
        for m in member_ids:
            current[m] = draw(
                st.dictionaries(
                    st.sampled_from([*subscribable, "gone"]),
                    st.sets(st.integers(-2, 14), max_size=6),
                    max_size=4,
                )
            )
    return {m: sub(subscriptions[m], current[m]) for m in member_ids}, topics


def effective(subscription: MemberSubscription, topics: Topics) -> set[str]:
    return {t for t in subscription.subscribed_topic_ids if topics.get(t, 0) > 0}


def owners_of(assignment: Assignment) -> Owners:
    owners: Owners = {}
    for member_id, by_topic in assignment.items():
        for topic_id, partitions in by_topic.items():
            for partition in partitions:
                assert (topic_id, partition) not in owners, "assigned twice"
                owners[topic_id, partition] = member_id
    return owners


def loads_of(assignment: Assignment) -> dict[str, int]:
    return {m: sum(len(ps) for ps in by_topic.values()) for m, by_topic in assignment.items()}


def current_of(assignment: Assignment, members: Members) -> Members:
    """The group with ``assignment`` as every member's current target assignment."""
    return {
        m: MemberSubscription(members[m].subscribed_topic_ids, assignment.get(m, {}))
        for m in members
    }


def check_valid(members: Members, topics: Topics, assignment: Assignment) -> Owners:
    assert set(assignment) == set(members)
    for member_id, by_topic in assignment.items():
        for topic_id, partitions in by_topic.items():
            assert partitions, "empty partition sets are left out"
            assert topic_id in effective(members[member_id], topics), "unsubscribed topic"
            assert all(0 <= p < topics[topic_id] for p in partitions)
    owners = owners_of(assignment)
    subscribed = set().union(*(effective(s, topics) for s in members.values()))
    expected = {(t, p) for t in subscribed for p in range(topics[t])}
    assert set(owners) == expected, "every subscribed partition is assigned"
    return owners


def check_heterogeneous_balance(members: Members, topics: Topics, assignment: Assignment) -> None:
    """Kafka's balance for heterogeneous subscriptions: no single move to an eligible member
    makes the assignment more even."""
    loads = loads_of(assignment)
    for topic_id in {t for s in members.values() for t in effective(s, topics)}:
        subscribers = [m for m in members if topic_id in effective(members[m], topics)]
        least = min(loads[m] for m in subscribers)
        for m in subscribers:
            if topic_id in assignment[m]:
                assert loads[m] - least <= 1, (topic_id, m, loads)


def check_best_balance_the_subscriptions_allow(
    members: Members, topics: Topics, assignment: Assignment
) -> None:
    """No "cost-reducing path" (Harvey et al., semi-matchings): no member reaches one with two
    partitions fewer through "owns a partition of a topic the next member subscribes to". That
    makes the loads optimal (the largest as small as it can be, and so on)."""
    loads = loads_of(assignment)
    subscribers = {t: [m for m in members if t in effective(members[m], topics)] for t in topics}
    for source in members:
        reached = {source}
        frontier = [source]
        while frontier:
            member = frontier.pop()
            for topic_id in assignment[member]:
                for other in subscribers[topic_id]:
                    if other not in reached:
                        reached.add(other)
                        frontier.append(other)
        assert all(loads[source] - loads[m] <= 1 for m in reached), (source, loads)


def optimal_kept(members: Members, topics: Topics) -> int:
    """The most current partitions any balanced homogeneous assignment can keep."""
    counts = [
        sum(len([p for p in s.current.get(t, ()) if p < topics[t]]) for t in effective(s, topics))
        for s in members.values()
    ]
    total = sum(topics[t] for t in effective(next(iter(members.values())), topics))
    quota, extra = divmod(total, len(members))
    return sum(min(c, quota) for c in counts) + min(extra, sum(1 for c in counts if c > quota))


def kept(members: Members, assignment: Assignment) -> int:
    return sum(
        len(partitions & members[m].current.get(t, frozenset()))
        for m, by_topic in assignment.items()
        for t, partitions in by_topic.items()
    )


def moved(before: Assignment, after: Assignment) -> int:
    """Partitions whose owner is still in the group but no longer owns them."""
    after_owners = owners_of(after)
    return sum(
        1
        for tp, owner in owners_of(before).items()
        if owner in after and after_owners.get(tp) != owner
    )


# --------------------------------------------------------------------------------------------
# Both assignors


def test_registry() -> None:
    assert list(ASSIGNORS) == ["uniform", "range"]
    assert DEFAULT_ASSIGNOR == "uniform"
    assert all(name == assignor.name for name, assignor in ASSIGNORS.items())
    assignor: PartitionAssignor = UNIFORM  # both satisfy the protocol (checked by mypy)
    assignor = RANGE
    assert assignor.name == "range"


@pytest.mark.parametrize("assignor", [UNIFORM, RANGE], ids=lambda a: a.name)
@PROPERTY_SETTINGS
@given(group=groups())
def test_every_subscribed_partition_is_assigned_once_to_a_subscriber(
    assignor: PartitionAssignor, group: Group
) -> None:
    members, topics = group
    check_valid(members, topics, assignor.assign(members, topics))


@pytest.mark.parametrize("assignor", [UNIFORM, RANGE], ids=lambda a: a.name)
@PROPERTY_SETTINGS
@given(group=groups(), data=st.data())
def test_same_answer_whatever_the_insertion_orders(
    assignor: PartitionAssignor, group: Group, data: st.DataObject
) -> None:
    members, topics = group
    expected = assignor.assign(members, topics)
    assert assignor.assign(members, topics) == expected

    member_order = data.draw(st.permutations(sorted(members)))
    topic_order = data.draw(st.permutations(sorted(topics)))
    shuffled_members = {
        m: MemberSubscription(
            frozenset(sorted(members[m].subscribed_topic_ids, reverse=True)),
            {
                t: frozenset(sorted(ps, reverse=True))
                for t, ps in sorted(members[m].current.items(), reverse=True)
            },
        )
        for m in member_order
    }
    shuffled_topics = {t: topics[t] for t in topic_order}
    actual = assignor.assign(shuffled_members, shuffled_topics)
    assert actual == expected
    # Built in member-id and topic-id order, so callers that iterate get one order too.
    assert list(actual) == sorted(actual)
    assert all(list(by_topic) == sorted(by_topic) for by_topic in actual.values())


@pytest.mark.parametrize("assignor", [UNIFORM, RANGE], ids=lambda a: a.name)
def test_empty_inputs(assignor: PartitionAssignor) -> None:
    assert assignor.assign({}, {}) == {}
    assert assignor.assign({}, {"t": 3}) == {}
    # No topics at all, or only topics that are missing or have no partitions.
    assert assignor.assign({"a": sub(set()), "b": sub({"t"})}, {}) == {"a": {}, "b": {}}
    members = {"a": sub({"empty", MISSING_TOPIC}), "b": sub({"empty"}, {"empty": {0}})}
    assert assignor.assign(members, {"empty": 0}) == {"a": {}, "b": {}}


@pytest.mark.parametrize("assignor", [UNIFORM, RANGE], ids=lambda a: a.name)
def test_members_without_subscriptions_get_nothing(assignor: PartitionAssignor) -> None:
    members = {"a": sub({"t"}), "b": sub(set(), {"t": {0, 1}}), "c": sub({"t", MISSING_TOPIC})}
    assignment = assignor.assign(members, {"t": 4, "u": 2})
    assert assignment["b"] == {}
    assert loads_of(assignment) == {"a": 2, "b": 0, "c": 2}
    assert "u" not in {t for by_topic in assignment.values() for t in by_topic}


# --------------------------------------------------------------------------------------------
# uniform


@PROPERTY_SETTINGS
@given(group=groups(homogeneous=True, valid_current=True))
def test_uniform_homogeneous_is_balanced_and_keeps_what_balance_allows(group: Group) -> None:
    members, topics = group
    assignment = UNIFORM.assign(members, topics)
    check_valid(members, topics, assignment)
    if members:
        loads = loads_of(assignment).values()
        assert max(loads) - min(loads) <= 1
        assert kept(members, assignment) == optimal_kept(members, topics)


@PROPERTY_SETTINGS
@given(group=groups(homogeneous=False))
def test_uniform_heterogeneous_is_balanced_as_kafka_defines(group: Group) -> None:
    members, topics = group
    assignment = UNIFORM.assign(members, topics)
    check_valid(members, topics, assignment)
    check_heterogeneous_balance(members, topics, assignment)
    check_best_balance_the_subscriptions_allow(members, topics, assignment)


@PROPERTY_SETTINGS
@given(group=groups(valid_current=True))
def test_uniform_keeps_its_own_assignment(group: Group) -> None:
    # A target that is already valid and balanced is a fixed point: nothing moves when the
    # group epoch is bumped for a reason that changes neither members nor topics.
    members, topics = group
    first = UNIFORM.assign(members, topics)
    assert UNIFORM.assign(current_of(first, members), topics) == first


@PROPERTY_SETTINGS
@given(group=groups(homogeneous=True, valid_current=True), joiner=MEMBER_IDS)
def test_uniform_join_moves_only_the_partitions_the_new_member_gets(
    group: Group, joiner: str
) -> None:
    members, topics = group
    assume(joiner not in members)
    before = UNIFORM.assign(members, topics)  # a balanced target, from any current one
    shared = next(iter(members.values())).subscribed_topic_ids if members else frozenset()
    after_members = current_of(before, members) | {joiner: sub(shared)}
    after = UNIFORM.assign(after_members, topics)
    check_valid(after_members, topics, after)

    total = sum(topics[t] for t in effective(after_members[joiner], topics))
    quota = total // len(after_members)
    assert loads_of(after)[joiner] in (quota, quota + 1)
    assert moved(before, after) == loads_of(after)[joiner]
    for m in members:  # old members only give up partitions
        assert owners_of({m: after[m]}).keys() <= owners_of({m: before[m]}).keys()


@PROPERTY_SETTINGS
@given(group=groups(homogeneous=True, valid_current=True), data=st.data())
def test_uniform_leave_moves_only_the_partitions_of_the_leaver(
    group: Group, data: st.DataObject
) -> None:
    members, topics = group
    assume(members)
    leaver = data.draw(st.sampled_from(sorted(members)))
    before = UNIFORM.assign(members, topics)
    after_members = {m: s for m, s in current_of(before, members).items() if m != leaver}
    after = UNIFORM.assign(after_members, topics)
    check_valid(after_members, topics, after)
    assert moved(before, after) == 0
    for m in after_members:  # the others only take over the leaver's partitions
        assert owners_of({m: before[m]}).keys() <= owners_of({m: after[m]}).keys()


def test_uniform_homogeneous_example_join_then_leave() -> None:
    topics = {"t": 7}
    members = {m: sub({"t"}) for m in ("c", "a", "b")}
    first = UNIFORM.assign(members, topics)
    # q, r = divmod(7, 3) = 2, 1: nobody owns anything yet, so "a" (first by id) gets the extra.
    assert first == {"a": {"t": frozenset({0, 1, 2})}, "b": {"t": {3, 4}}, "c": {"t": {5, 6}}}

    # "0" sorts first, yet the extra slots go to the members that already hold 2 partitions.
    joined = current_of(first, members) | {"0": sub({"t"})}
    second = UNIFORM.assign(joined, topics)
    assert second == {
        "0": {"t": frozenset({2})},
        "a": {"t": frozenset({0, 1})},
        "b": {"t": frozenset({3, 4})},
        "c": {"t": frozenset({5, 6})},
    }

    left = {m: s for m, s in current_of(second, joined).items() if m != "b"}
    third = UNIFORM.assign(left, topics)
    # q, r = 2, 1 again and nobody holds more than 2, so "0" (first by id) takes the extra.
    assert third == {
        "0": {"t": frozenset({2, 3, 4})},
        "a": {"t": frozenset({0, 1})},
        "c": {"t": frozenset({5, 6})},
    }


def test_uniform_homogeneous_drops_what_is_no_longer_valid() -> None:
    members = {
        "a": sub({"t", "u"}, {"t": {0, 1, 9}, "gone": {0}, "v": {0}}),  # 9: out of range
        "b": sub({"t", "u"}, {"t": {1, 2}}),  # t-1 is claimed by "a" as well: "a" keeps it
    }
    assignment = UNIFORM.assign(members, {"t": 3, "u": 1, "v": 1})
    assert assignment == {
        "a": {"t": frozenset({0, 1})},
        "b": {"t": frozenset({2}), "u": frozenset({0})},
    }


def test_uniform_heterogeneous_example() -> None:
    # The subscription shape of Kafka's UniformHeterogeneousAssignmentBuilder javadoc.
    topics = {"T1": 10, "T2": 10}
    members = {"m1": sub({"T1"}), "m2": sub({"T1", "T2"}), "m3": sub({"T2"})}
    first = UNIFORM.assign(members, topics)
    check_heterogeneous_balance(members, topics, first)
    assert loads_of(first) == {"m1": 6, "m2": 7, "m3": 7}

    # m4 joins on T2. Kafka's balancing (step 3) stops at 6/5/5/4: on each topic, the owners
    # are within one of the least loaded subscriber. Step 4 finds m1 -T1-> m2 -T2-> m4.
    joined = current_of(first, members) | {"m4": sub({"T2"})}
    second = UNIFORM.assign(joined, topics)
    check_valid(joined, topics, second)
    check_best_balance_the_subscriptions_allow(joined, topics, second)
    assert loads_of(second) == {"m1": 5, "m2": 5, "m3": 5, "m4": 5}
    # 5/5/5/5 needs m4 to get 5 partitions of T2 and m1 to give m2 one of T1: m3 can give 2,
    # so m2 gives 3 of T2 and takes 1 of T1, 6 moves at least.
    assert moved(first, second) == 6
    assert second["m1"]["T1"] < first["m1"]["T1"]


def test_uniform_heterogeneous_gives_away_partitions_it_did_not_own_first() -> None:
    # Topic order is w (6 per subscriber), t (2), u (1.5). Steps 1 and 2 leave "a" with t-3
    # (its own), t-1 (new) and all of u, because "x" is busy with w: a=5, s=2, x=6. Balancing
    # t moves one partition from "a" to "s": t-1, although t-3 is a's highest.
    topics = {"t": 4, "u": 3, "w": 6}
    members = {
        "a": sub({"t", "u"}, {"t": {3}}),
        "s": sub({"t"}),
        "x": sub({"u", "w"}, {"w": set(range(6))}),
    }
    assignment = UNIFORM.assign(members, topics)
    check_best_balance_the_subscriptions_allow(members, topics, assignment)
    assert assignment == {
        "a": {"t": frozenset({3}), "u": frozenset({0, 1, 2})},
        "s": {"t": frozenset({0, 1, 2})},
        "x": {"w": frozenset(range(6))},
    }


# --------------------------------------------------------------------------------------------
# range


@PROPERTY_SETTINGS
@given(group=groups())
def test_range_gives_contiguous_ranges_in_member_id_order(group: Group) -> None:
    members, topics = group
    assignment = RANGE.assign(members, topics)
    check_valid(members, topics, assignment)
    for topic_id in sorted(topics):
        subscribers = sorted(m for m in members if topic_id in effective(members[m], topics))
        if not subscribers:
            continue
        quota, extra = divmod(topics[topic_id], len(subscribers))
        start = 0
        for index, m in enumerate(subscribers):
            size = quota + (1 if index < extra else 0)
            assert assignment[m].get(topic_id, frozenset()) == frozenset(range(start, start + size))
            start += size


@PROPERTY_SETTINGS
@given(
    member_ids=st.lists(MEMBER_IDS, min_size=1, max_size=8, unique=True),
    partition_count=st.integers(1, 12),
    topic_ids=st.sets(st.sampled_from(TOPIC_POOL), min_size=2, max_size=4),
)
def test_range_co_partitions_topics_of_equal_size(
    member_ids: list[str], partition_count: int, topic_ids: set[str]
) -> None:
    topics = dict.fromkeys(topic_ids, partition_count)
    assignment = RANGE.assign({m: sub(topic_ids) for m in member_ids}, topics)
    for by_topic in assignment.values():
        assert len(set(by_topic.values())) <= 1, "same partition numbers of every topic"
        assert set(by_topic) in (set(), topic_ids)


def test_range_example_and_it_does_not_read_the_current_assignment() -> None:
    topics = {"T1": 3, "T2": 3, "T3": 2}
    members = {"m1": sub({"T1", "T2"}), "m0": sub({"T1", "T2", "T3"})}
    expected = {
        "m0": {"T1": frozenset({0, 1}), "T2": frozenset({0, 1}), "T3": frozenset({0, 1})},
        "m1": {"T1": frozenset({2}), "T2": frozenset({2})},
    }
    assert RANGE.assign(members, topics) == expected
    # KAFKA-16944: the KIP-848 range assignor is not sticky.
    swapped = {"m1": sub({"T1", "T2"}, {"T1": {0, 1}}), "m0": sub({"T1", "T2", "T3"}, {"T1": {2}})}
    assert RANGE.assign(swapped, topics) == expected


def test_range_puts_static_members_first_by_instance_id() -> None:
    """A static member restarted under a new member id keeps its ranges, and nobody else's
    move (Kafka orders static members by instance id); by member id, all 9 moved."""
    topics = {"T": 9}

    def static(instance_id: str) -> MemberSubscription:
        return MemberSubscription(frozenset({"T"}), {}, instance_id=instance_id)

    before = {"m-a": static("i0"), "m-b": static("i1"), "m-c": static("i2")}
    after = {"m-a": static("i0"), "m-z": static("i1"), "m-c": static("i2")}
    first, second = RANGE.assign(before, topics), RANGE.assign(after, topics)
    assert first["m-a"] == second["m-a"] == {"T": frozenset({0, 1, 2})}
    assert first["m-b"] == second["m-z"] == {"T": frozenset({3, 4, 5})}
    assert first["m-c"] == second["m-c"] == {"T": frozenset({6, 7, 8})}
    # Dynamic members after the static ones, by member id.
    mixed = {"a": sub({"T"}), "z": static("i9")}
    assert RANGE.assign(mixed, topics) == {
        "z": {"T": frozenset(range(5))},
        "a": {"T": frozenset(range(5, 9))},
    }


# --------------------------------------------------------------------------------------------
# Replicas and size

HASH_SEED_SCRIPT = """
from kcoord.cluster.coordinator.assignors import ASSIGNORS, MemberSubscription as S
topics = {f"topic-{i}": 3 + i % 4 for i in range(6)}
members = {
    f"member-{i}": S(
        frozenset(t for j, t in enumerate(sorted(topics)) if (i + j) % 3),
        {"topic-1": frozenset({i % 3})} if i % 2 else {},
    )
    for i in range(7)
}
for name in sorted(ASSIGNORS):
    a = ASSIGNORS[name].assign(members, topics)
    print(name, [(m, [(t, sorted(ps)) for t, ps in by_topic.items()]) for m, by_topic in a.items()])
"""


def test_replicas_with_different_hash_seeds_compute_the_same_assignment() -> None:
    # Each node is a process with its own PYTHONHASHSEED, so set and dict orders of strings
    # differ between replicas; the assignment must not.
    outputs = {
        subprocess.run(
            [sys.executable, "-c", HASH_SEED_SCRIPT],
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        for seed in (0, 1, 2, 3)
    }
    assert len(outputs) == 1
    assert "uniform" in next(iter(outputs))


@pytest.mark.parametrize("assignor", [UNIFORM, RANGE], ids=lambda a: a.name)
@pytest.mark.parametrize("homogeneous", [True, False], ids=["homogeneous", "heterogeneous"])
def test_64_members_and_1000_partitions_take_well_under_a_second(
    assignor: PartitionAssignor, homogeneous: bool
) -> None:
    topics = {f"topic-{i:02}": 100 for i in range(10)}
    members = {
        f"member-{i:02}": sub(
            set(topics) if homogeneous else {t for j, t in enumerate(sorted(topics)) if (i + j) % 3}
        )
        for i in range(64)
    }
    started = time.perf_counter()
    full = assignor.assign(members, topics)  # from nothing
    joined = current_of(full, members) | {"member-new": sub(set(topics))}
    incremental = assignor.assign(joined, topics)  # one member joins a settled group
    elapsed_s = time.perf_counter() - started
    print(f"{assignor.name}, homogeneous={homogeneous}: {elapsed_s * 1000:.1f} ms for both")
    check_valid(joined, topics, incremental)
    assert elapsed_s < 1.0
