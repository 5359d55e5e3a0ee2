"""The KIP-848 consumer group protocol with confluent-kafka (``group.protocol=consumer``) on a
real 3-node cluster: members in their own processes (``kcoord.chaos.member``), the broker
computing assignments. A valid assignment is ``test_groups.settled``: every member reports the
same epoch (the group's assignment epoch), disjoint partitions covering the topic.

- members join one by one and leave one by one, valid at every stable point;
- a SIGKILLed member is fenced after the session timeout, not before, and its partitions move;
- a group's own session timeout (KIP-848 group configs, set with the admin client) applies
  instead of the cluster's;
- static members: one bounced (closed, restarted with its instance id) gets its partitions
  back at the same epoch and nobody else moves; a second process with a live member's
  instance id is refused (UNRELEASED_INSTANCE_ID);
- the coordinator's node is SIGKILLed while members reconcile: the group converges on the new
  coordinator, no partition owned twice at any reported epoch, every message consumed once;
- a subscription by regular expression gets every matching topic, and one created later;
- a classic member (kafka-python) and a consumer-protocol member share one group: the classic
  group is upgraded when the consumer member joins and downgraded when it leaves.

The cluster uses a 6 s consumer session timeout and 500 ms heartbeats (Kafka: 45 s, 5 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kcoord.raft.controller import OFFSETS_TOPIC_NAME
from tests.integration.cluster import LocalCluster, wait_for
from tests.integration.test_groups import (
    DEADLINE_S,
    GROUP_OPERATIONS,
    PARTITIONS,
    Member,
    Spawner,
    broker_epoch,
    check_exactly_once,
    consumed,
    create_topic,
    offsets_leader,
    produce,
    rebalance_events,
    settled,
    wait_consumed,
    wait_restarted,
    wait_settled,
    wait_until,
)
from tests.integration.test_kafka_clients import run_client

pytestmark = pytest.mark.integration

CLIENT = "confluent-kafka"
SESSION_TIMEOUT_MS = 6_000
GROUP_SESSION_TIMEOUT_MS = 15_000  # one group's own (KIP-848 group configs)
STATIC_SESSION_TIMEOUT_MS = 30_000  # the static members' groups' own


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = {
        "group.consumer.session.timeout.ms": SESSION_TIMEOUT_MS,
        "group.consumer.min.session.timeout.ms": SESSION_TIMEOUT_MS,
        "group.consumer.heartbeat.interval.ms": 500,
        "group.consumer.min.heartbeat.interval.ms": 500,
    }
    with LocalCluster(tmp_path_factory.mktemp("kip848"), overrides=overrides) as c:
        yield c


@pytest.fixture
def spawn(cluster: LocalCluster, tmp_path: Path) -> Iterator[Spawner]:
    assert cluster.state is not None
    spawner = Spawner(cluster.state.bootstrap_servers, tmp_path, [])
    try:
        yield spawner
    finally:
        spawner.close()


def member(spawn: Spawner, group: str, topic: str, name: str) -> Member:
    return spawn(CLIENT, group, topic, name, group_protocol="consumer")


def split_owners(members: list[Member]) -> list[tuple[int, int, list[str]]]:
    """(epoch, partition, members) for partitions two members reported at the same epoch."""
    owners: dict[tuple[int, int], set[str]] = {}
    for m in members:
        for event in m.events("assignment"):
            for p in event["partitions"]:
                owners.setdefault((event["generation"], p), set()).add(m.name)
    return [(e, p, sorted(names)) for (e, p), names in owners.items() if len(names) > 1]


def test_members_join_and_leave_one_by_one(cluster: LocalCluster, spawn: Spawner) -> None:
    topic = group = "kip848-join-leave"
    create_topic(CLIENT, spawn.bootstrap, topic)
    members: list[Member] = []
    epochs = []
    for i in range(3):
        members.append(member(spawn, group, topic, f"m{i}"))
        now = wait_settled(spawn, members, after=None)
        epochs.append(now.generation)
    assert epochs == sorted(epochs) and len(set(epochs)) == 3, epochs
    # ConsumerGroupDescribe (librdkafka asks it for a consumer-protocol group), with the
    # group's authorized operations: all of them, there is no authorizer.
    described = run_client(
        CLIENT,
        {"op": "describe_group", "bootstrap": spawn.bootstrap, "group": group, "topic": topic},
    )
    assert (described["type"], described["state"].lower()) == ("CONSUMER", "stable"), described
    assert sorted(m["member_id"] for m in described["members"]) == sorted(now.member_ids.values())
    assert described["operations"] == GROUP_OPERATIONS
    acked = produce(CLIENT, spawn.bootstrap, topic, 120, "v")
    wait_consumed(spawn, members, acked)
    while len(members) > 1:
        leaving = members.pop(0)
        leaving.stop()
        wait_settled(spawn, members)
    more = produce(CLIENT, spawn.bootstrap, topic, 60, "w")
    wait_consumed(spawn, members, more)
    check_exactly_once(acked + more, consumed([*members]) + leaving_records(spawn))
    assert not split_owners(spawn.started), split_owners(spawn.started)


def leaving_records(spawn: Spawner) -> list[tuple[int, int, str]]:
    return [r for m in spawn.started if not m.alive for r in m.records()]


def test_a_killed_member_is_fenced_after_the_session_timeout(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    topic = group = "kip848-kill"
    create_topic(CLIENT, spawn.bootstrap, topic)
    members = [member(spawn, group, topic, f"m{i}") for i in range(3)]
    before = wait_settled(spawn, members)
    victim = members.pop()
    victim.kill()
    killed_at = time.monotonic()
    after = wait_settled(spawn, members, after=before)
    elapsed = time.monotonic() - killed_at
    assert elapsed >= SESSION_TIMEOUT_MS / 1000 - 1.0, f"fenced after {elapsed:.1f} s"
    assert set().union(*after.owned.values()) == set(range(PARTITIONS))
    assert not split_owners(spawn.started), split_owners(spawn.started)


def test_a_groups_own_session_timeout_fences_its_killed_member(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    """KIP-848 group configs through confluent-kafka's admin client (IncrementalAlterConfigs
    and DescribeConfigs on a GROUP resource), set before the group exists at whichever node
    the client picks: the group's coordinator fences a SIGKILLed member after the group's own
    session timeout, not the cluster's."""
    topic = group = "kip848-group-config"
    create_topic(CLIENT, spawn.bootstrap, topic)
    session = ["consumer.session.timeout.ms", "SET", str(GROUP_SESSION_TIMEOUT_MS)]
    heartbeat = ["consumer.heartbeat.interval.ms", "SET", "1000"]
    alter = {"op": "alter_configs", "bootstrap": spawn.bootstrap, "group": group}
    assert run_client(CLIENT, {**alter, "ops": [session, heartbeat]}) == {"error": 0}
    described = run_client(
        CLIENT,
        {
            "op": "describe_configs",
            "bootstrap": spawn.bootstrap,
            "resource": "group",
            "name": group,
        },
    )
    assert described == {
        "consumer.session.timeout.ms": [str(GROUP_SESSION_TIMEOUT_MS), "GROUP_CONFIG"],
        "consumer.heartbeat.interval.ms": ["1000", "GROUP_CONFIG"],
    }
    refused = run_client(CLIENT, {**alter, "ops": [["consumer.session.timeout.ms", "SET", "10"]]})
    assert refused == {
        "error": 40,  # INVALID_CONFIG
        "message": "consumer.session.timeout.ms must be in the range 6000 to 60000 inclusive.",
    }

    members = [member(spawn, group, topic, f"m{i}") for i in range(2)]
    before = wait_settled(spawn, members)
    victim = members.pop()
    killed_at = time.monotonic()  # before kill(), which waits for the exit and the reader
    victim.kill()
    after = wait_settled(
        spawn, members, after=before, deadline_s=DEADLINE_S + GROUP_SESSION_TIMEOUT_MS / 1000
    )
    elapsed = time.monotonic() - killed_at
    # Fenced at its last heartbeat plus the session: about one interval (1 s) before the kill,
    # a second more on a loaded machine.
    assert elapsed >= GROUP_SESSION_TIMEOUT_MS / 1000 - 2.0, f"fenced after {elapsed:.1f} s"
    assert after.owned["m0"] == frozenset(range(PARTITIONS))


def static_group(spawn: Spawner, name: str) -> tuple[str, Callable[[str, str], Member]]:
    """A topic and group for static members, whose session is the group's own 30 s (a group
    config): room for a bounced member's process to start again on a loaded machine."""
    topic = group = name
    create_topic(CLIENT, spawn.bootstrap, topic)
    session = ["consumer.session.timeout.ms", "SET", str(STATIC_SESSION_TIMEOUT_MS)]
    alter = {"op": "alter_configs", "bootstrap": spawn.bootstrap, "group": group}
    assert run_client(CLIENT, {**alter, "ops": [session]}) == {"error": 0}

    def static(name: str, instance: str) -> Member:
        return spawn(CLIENT, group, topic, name, instance_id=instance, group_protocol="consumer")

    return topic, static


def test_a_bounced_static_member_gets_its_assignment_back_at_the_same_epoch(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    """KIP-848 static membership: a static member's close leaves the group with epoch -2,
    keeping its place; a new process with its instance id takes the place over with the same
    member epoch and partitions; the group epoch does not move and the others see nothing."""
    topic, static = static_group(spawn, "kip848-static-bounce")
    a, b, c = (static(i, i) for i in "abc")
    s = wait_settled(spawn, [a, b, c])
    marks = {m.name: m.mark() for m in (b, c)}
    a.stop()
    a2 = static("a2", "a")
    bounced = wait_settled(spawn, [a2, b, c])
    assert bounced.generation == s.generation
    assert bounced.owned["a2"] == s.owned["a"]
    assert bounced.member_ids["a2"] != s.member_ids["a"]
    acked = produce(CLIENT, spawn.bootstrap, topic, 60, "bounced")
    wait_consumed(spawn, [a2, b, c], acked)
    for m in (b, c):
        assert not rebalance_events(m, marks[m.name]), (m.name, rebalance_events(m, 0))
        report = m.assignment()
        assert report is not None and report["generation"] == s.generation


def test_a_second_process_with_a_live_members_instance_id_is_refused(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    """KIP-848, unlike the classic protocol's KIP-345: an instance id held by a live member is
    UNRELEASED_INSTANCE_ID for the newcomer (librdkafka: a fatal error), and the live member
    keeps its place without a rebalance."""
    topic, static = static_group(spawn, "kip848-static-duplicate")
    a, b = static("a", "a"), static("b", "b")
    s = wait_settled(spawn, [a, b])
    marks = {m.name: m.mark() for m in (a, b)}
    dup = static("a-dup", "a")
    wait_until(spawn, lambda: not dup.alive, "the duplicate to stop", [a, b])
    errors = [e["error"] for e in dup.events("error")]
    assert any(
        "UNRELEASED_INSTANCE_ID" in e or "still used by another member" in e for e in errors
    ), str(dup)
    assert not dup.events("assigned")
    acked = produce(CLIENT, spawn.bootstrap, topic, 60, "kept")
    wait_consumed(spawn, [a, b], acked)
    assert settled([a, b], PARTITIONS) == s
    for m in (a, b):
        assert not rebalance_events(m, marks[m.name]), (m.name, rebalance_events(m, 0))


def test_the_group_converges_after_its_coordinator_is_killed(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    topic = group = "kip848-failover"
    create_topic(CLIENT, spawn.bootstrap, topic)
    members = [member(spawn, group, topic, f"m{i}") for i in range(2)]
    wait_settled(spawn, members)
    acked = produce(CLIENT, spawn.bootstrap, topic, 100, "before")
    wait_consumed(spawn, members, acked)
    alive = cluster.alive_ids()
    coordinator = offsets_leader(cluster, group, alive)
    assert coordinator is not None
    epoch = broker_epoch(cluster, coordinator)
    # A third member joins (the group starts reconciling) and the coordinator dies meanwhile.
    members.append(member(spawn, group, topic, "m2"))
    cluster.kill(coordinator)
    try:
        survivors = [n for n in alive if n != coordinator]
        wait_for(
            lambda: offsets_leader(cluster, group, survivors) in survivors,
            "a new coordinator",
            DEADLINE_S,
        )
        final = wait_settled(spawn, members, deadline_s=DEADLINE_S * 2)
        assert len(final.owned) == 3
        during = produce(CLIENT, spawn.bootstrap, topic, 100, "during")
        wait_consumed(spawn, members, during)
    finally:
        cluster.start(coordinator)
    wait_restarted(cluster, coordinator, epoch, [topic, OFFSETS_TOPIC_NAME])
    after = produce(CLIENT, spawn.bootstrap, topic, 50, "after")
    wait_consumed(spawn, members, after)
    assert settled(members, PARTITIONS) is not None or wait_until(
        spawn, lambda: settled(members, PARTITIONS), "a valid assignment", members
    )
    assert not split_owners(spawn.started), split_owners(spawn.started)
    values = {v for _, _, v in consumed(members)}
    assert {v for _, _, v in acked + during + after} <= values


def test_a_regex_subscription_gets_every_matching_topic_and_new_ones(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    """librdkafka sends the pattern (``SubscribedTopicRegex``); the coordinator resolves it,
    and a matching topic created later is assigned without the member resubscribing."""
    from confluent_kafka import Consumer

    for topic in ("kip848-re-a", "kip848-re-b", "kip848-other"):
        create_topic(CLIENT, spawn.bootstrap, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": spawn.bootstrap,
            "group.id": "kip848-regex",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe(["^kip848-re-.*"])

        def assigned() -> set[str]:
            consumer.poll(0.2)
            return {tp.topic for tp in consumer.assignment()}

        wait_for(lambda: assigned() == {"kip848-re-a", "kip848-re-b"}, "both matching topics")
        create_topic(CLIENT, spawn.bootstrap, "kip848-re-c")
        wait_for(
            lambda: assigned() == {"kip848-re-a", "kip848-re-b", "kip848-re-c"},
            "the new matching topic",
        )
        assert len(consumer.assignment()) == 3 * PARTITIONS
    finally:
        consumer.close()


def group_type(spawn: Spawner, group: str) -> str:
    """The group's type as the admin client reads it: librdkafka asks ConsumerGroupDescribe,
    which answers GROUP_ID_NOT_FOUND for a classic group, and then DescribeGroups."""
    described = run_client(
        CLIENT, {"op": "describe_group", "bootstrap": spawn.bootstrap, "group": group, "topic": ""}
    )
    kind: str = described["type"]
    return kind


def test_classic_and_consumer_protocol_members_share_a_group(
    cluster: LocalCluster, spawn: Spawner
) -> None:
    """A kafka-python member (classic protocol, eager range assignor) forms a classic group; a
    confluent-kafka member with ``group.protocol=consumer`` joins it (the group becomes a
    consumer group, the classic member carries on inside it); when that member leaves, the
    group is a classic group again and the classic member takes every partition."""
    topic = group = "kip848-mixed"
    create_topic(CLIENT, spawn.bootstrap, topic)
    classic = spawn("kafka-python", group, topic, "classic")
    alone = wait_settled(spawn, [classic])
    acked = produce(CLIENT, spawn.bootstrap, topic, 60, "v")
    wait_consumed(spawn, [classic], acked)

    assert group_type(spawn, group) == "CLASSIC"
    modern = member(spawn, group, topic, "modern")
    both = wait_settled(spawn, [classic, modern], after=alone)
    assert all(both.owned.values()), both
    assert group_type(spawn, group) == "CONSUMER"  # converted (KIP-848 online upgrade)
    more = produce(CLIENT, spawn.bootstrap, topic, 60, "w")
    wait_consumed(spawn, [classic, modern], more)

    modern.stop()
    again = wait_settled(spawn, [classic], after=both)
    assert again.owned["classic"] == frozenset(range(PARTITIONS))
    assert group_type(spawn, group) == "CLASSIC"  # converted back with its last member
    last = produce(CLIENT, spawn.bootstrap, topic, 60, "x")
    wait_consumed(spawn, [classic], last)
    check_exactly_once(acked + more + last, consumed([classic, modern]))
    assert not split_owners(spawn.started), split_owners(spawn.started)
