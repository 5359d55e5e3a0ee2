"""The classic group APIs over raw sockets against real nodes: Kafka's error codes, case by case.

Requests are built from plain values and encoded with kio (``tests.unit.node.kafka.wire``), as
``test_kafka_protocol.py`` does, and sent to the group's coordinator, found with FindCoordinator
(a 3-node cluster, ``group.initial.rebalance.delay.ms`` = 0 so that a first join completes at
once). Each case is the one of KAFKA-FACTS 1.5 a client would see: KIP-394's member id round
trip, session timeout bounds, protocol mismatches, stale generations, heartbeats during a
rebalance, per-partition commit errors, KIP-345 static member fencing, DeleteGroups of live and
unknown groups, NOT_COORDINATOR from the wrong node, ListGroups state filters, DescribeGroups,
OffsetFetch and ``group.max.size`` (a 1-node cluster of its own).

Then bad input on the group APIs: garbage bodies, wrong field types and huge arrays close the
connection; a seeded mutation fuzz of group frames (``FUZZ_SEED`` replays one) leaves
the node up, answering, and without a traceback in its log.
"""

from __future__ import annotations

import inspect
import os
import random
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kcoord.cluster.routing import partition_for
from kcoord.errors import Errors
from kcoord.node import launcher
from tests.integration.cluster import LocalCluster, wait_for
from tests.unit.node.kafka.wire import WireClient, decode_response, encode_request, readable

pytestmark = pytest.mark.integration

METADATA, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 3, 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, API_VERSIONS, CREATE_TOPICS, DELETE_GROUPS = 15, 16, 18, 19, 42
OFFSET_DELETE = 47

# The versions the tests speak unless a case is about a version: the last non-flexible
# JoinGroup with group_instance_id, and the matching generation of the others.
JOIN_V, SYNC_V, HEARTBEAT_V, LEAVE_V = 5, 3, 3, 3
COMMIT_V, FETCH_V, DESCRIBE_V, LIST_V, DELETE_V, FIND_V = 8, 7, 5, 4, 2, 3

TOPIC = "orders"
PARTITIONS = 4
SESSION_TIMEOUT_MS = 30_000  # long enough that no member expires during a test
REBALANCE_TIMEOUT_MS = 20_000
# Errors that mean "the coordinator is not ready or not here (yet)": retried while waiting.
COORDINATOR_ERRORS = {
    Errors.COORDINATOR_LOAD_IN_PROGRESS,
    Errors.COORDINATOR_NOT_AVAILABLE,
    Errors.NOT_COORDINATOR,
}
# The client id every request of the wire client carries (member ids start with it).
CLIENT_ID: str = inspect.signature(encode_request).parameters["client_id"].default
SIZE = struct.Struct(">i")
FUZZ_FRAMES = 2_000
SILENCE_S = 0.05


# ---------------------------------------------------------------------------------------------
# Consumer protocol payloads (ConsumerProtocolSubscription / Assignment, version 0).


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def subscription(*topics: str) -> bytes:
    """version int16 | topics [string] | user_data nullable bytes (null)."""
    return struct.pack(">hi", 0, len(topics)) + b"".join(_string(t) for t in topics) + b"\xff" * 4


def assignment(topic: str, partitions: Sequence[int]) -> bytes:
    """version int16 | [topic string, partitions [int32]] | user_data nullable bytes (null)."""
    return (
        struct.pack(">hi", 0, 1)
        + _string(topic)
        + struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
        + b"\xff" * 4
    )


RANGE = (("range", subscription(TOPIC)),)


# ---------------------------------------------------------------------------------------------
# The cluster and its coordinators.


def _preferred_leaders_settled(cluster: LocalCluster) -> bool:
    """Every ``__consumer_offsets`` partition is led by its preferred replica: the controller's
    periodic preferred-leader election will not move a coordinator in the middle of a test."""
    controller = cluster.controller_id()
    if controller is None:
        return False
    topic = cluster.describe(controller, topics=True)["topics"].get("__consumer_offsets")
    return topic is not None and all(p["leader"] == p["replicas"][0] for p in topic["partitions"])


def _create_topic(cluster: LocalCluster, name: str, partitions: int, replicas: int) -> None:
    with client(cluster, 1) as c:
        created = c.call(
            CREATE_TOPICS,
            7,
            {
                "topics": [
                    {"name": name, "num_partitions": partitions, "replication_factor": replicas}
                ],
                "timeout": 30_000,
            },
        )
    assert created.topics[0].error_code in (Errors.NONE, Errors.TOPIC_ALREADY_EXISTS)

    def known_everywhere() -> bool:
        for node_id in cluster.alive_ids():
            with client(cluster, node_id) as c:
                md = c.call(
                    METADATA, 12, {"topics": [{"name": name}], "allow_auto_topic_creation": False}
                )
            if md.topics[0].error_code != Errors.NONE or len(md.topics[0].partitions) != partitions:
                return False
        return True

    wait_for(known_everywhere, f"topic {name} in every node's metadata")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("group-protocol")
    overrides = {"group.initial.rebalance.delay.ms": 0, "auto.create.topics.enable": False}
    with LocalCluster(root, nodes=3, overrides=overrides) as c:
        wait_for(lambda: _preferred_leaders_settled(c), "offsets partitions on preferred leaders")
        _create_topic(c, TOPIC, PARTITIONS, 3)
        yield c


def client(cluster: LocalCluster, node_id: int) -> WireClient:
    n = cluster.node(node_id)
    return WireClient(n.host, n.kafka_port)


def coordinator_id(cluster: LocalCluster, group_id: str) -> int:
    """The node FindCoordinator names for the group, once that node has loaded its shard."""

    def ready() -> int | None:
        with client(cluster, cluster.alive_ids()[0]) as c:
            found = c.call(FIND_COORDINATOR, FIND_V, {"key": group_id, "key_type": 0})
        if found.error_code != Errors.NONE:
            return None
        node_id = int(found.node_id)
        n = cluster.node(node_id)
        assert (found.host, found.port) == (n.host, n.kafka_port)
        with client(cluster, node_id) as c:
            described = c.call(DESCRIBE_GROUPS, DESCRIBE_V, {"groups": [group_id]})
        return None if described.groups[0].error_code in COORDINATOR_ERRORS else node_id

    result: int = wait_for(ready, f"a loaded coordinator for {group_id}")
    return result


def coordinator(cluster: LocalCluster, group_id: str) -> WireClient:
    """A new connection to the group's coordinator."""
    return client(cluster, coordinator_id(cluster, group_id))


# ---------------------------------------------------------------------------------------------
# Requests.


def join_values(
    group_id: str,
    member_id: str = "",
    *,
    protocols: Sequence[tuple[str, bytes]] = RANGE,
    protocol_type: str = "consumer",
    instance_id: str | None = None,
    session_timeout_ms: int = SESSION_TIMEOUT_MS,
) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "session_timeout": session_timeout_ms,
        "rebalance_timeout": REBALANCE_TIMEOUT_MS,
        "member_id": member_id,
        "group_instance_id": instance_id,
        "protocol_type": protocol_type,
        "protocols": [{"name": name, "metadata": metadata} for name, metadata in protocols],
        "reason": None,
    }


def join(c: WireClient, group_id: str, member_id: str = "", **kw: Any) -> Any:
    return c.call(JOIN_GROUP, JOIN_V, join_values(group_id, member_id, **kw))


def join_new(c: WireClient, group_id: str, **kw: Any) -> Any:
    """KIP-394's round trip: the coordinator hands out a member id, the member joins with it."""
    first = join(c, group_id, **kw)
    assert first.error_code == Errors.MEMBER_ID_REQUIRED, first
    return join(c, group_id, first.member_id, **kw)


def sync_values(
    group_id: str,
    generation_id: int,
    member_id: str,
    assignments: dict[str, bytes] | None = None,
    instance_id: str | None = None,
) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "generation_id": generation_id,
        "member_id": member_id,
        "group_instance_id": instance_id,
        "assignments": [{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()],
    }


def sync(c: WireClient, group_id: str, generation_id: int, member_id: str, **kw: Any) -> Any:
    return c.call(SYNC_GROUP, SYNC_V, sync_values(group_id, generation_id, member_id, **kw))


def heartbeat(
    c: WireClient,
    group_id: str,
    generation_id: int,
    member_id: str,
    instance_id: str | None = None,
) -> Errors:
    response = c.call(
        HEARTBEAT,
        HEARTBEAT_V,
        {
            "group_id": group_id,
            "generation_id": generation_id,
            "member_id": member_id,
            "group_instance_id": instance_id,
        },
    )
    return Errors(response.error_code)


def commit(
    c: WireClient,
    group_id: str,
    generation_id: int,
    member_id: str,
    topics: dict[str, dict[int, tuple[int, str | None]]],
) -> dict[tuple[str, int], Errors]:
    """OffsetCommit of ``{topic: {partition: (offset, metadata)}}``; the error per partition."""
    response = c.call(
        OFFSET_COMMIT,
        COMMIT_V,
        {
            "group_id": group_id,
            "generation_id_or_member_epoch": generation_id,
            "member_id": member_id,
            "group_instance_id": None,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": metadata,
                        }
                        for p, (offset, metadata) in partitions.items()
                    ],
                }
                for topic, partitions in topics.items()
            ],
        },
    )
    # One entry per topic, its partitions known to the metadata or not together
    # (OffsetCommitResponse.Builder.merge).
    names = [t.name for t in response.topics]
    assert len(names) == len(set(names)), names
    return {
        (t.name, p.partition_index): Errors(p.error_code)
        for t in response.topics
        for p in t.partitions
    }


def fetch(
    c: WireClient, group_id: str, topics: dict[str, list[int]] | None
) -> tuple[Errors, dict[tuple[str, int], tuple[int, str | None, Errors]]]:
    """OffsetFetch; (group error, {(topic, partition): (offset, metadata, error)})."""
    response = c.call(
        OFFSET_FETCH,
        FETCH_V,
        {
            "group_id": group_id,
            "topics": None
            if topics is None
            else [{"name": t, "partition_indexes": ps} for t, ps in topics.items()],
            "require_stable": False,
        },
    )
    return Errors(response.error_code), {
        (t.name, p.partition_index): (p.committed_offset, p.metadata, Errors(p.error_code))
        for t in response.topics
        for p in t.partitions
    }


def describe(c: WireClient, group_id: str) -> Any:
    return c.call(DESCRIBE_GROUPS, DESCRIBE_V, {"groups": [group_id]}).groups[0]


def delete_groups(c: WireClient, *group_ids: str) -> dict[str, Errors]:
    response = c.call(DELETE_GROUPS, DELETE_V, {"groups_names": list(group_ids)})
    return {r.group_id: Errors(r.error_code) for r in response.results}


def leave(c: WireClient, group_id: str, member_id: str) -> Errors:
    response = c.call(
        LEAVE_GROUP,
        LEAVE_V,
        {"group_id": group_id, "members": [{"member_id": member_id, "group_instance_id": None}]},
    )
    assert response.error_code == Errors.NONE, response
    return Errors(response.members[0].error_code)


def receive(c: WireClient, api_key: int, version: int, sent: int) -> Any:
    """The answer to a request sent earlier with ``c.send`` (a parked JoinGroup or SyncGroup)."""
    correlation_id, body = decode_response(api_key, version, c.read_frame())
    assert correlation_id == sent, (correlation_id, sent)
    return body


def stable_single_member_group(c: WireClient, group_id: str) -> tuple[str, int]:
    """Join alone and sync: (member id, generation) of a Stable group of one."""
    joined = join_new(c, group_id)
    assert joined.error_code == Errors.NONE, joined
    synced = sync(
        c,
        group_id,
        joined.generation_id,
        joined.member_id,
        assignments={joined.member_id: assignment(TOPIC, range(PARTITIONS))},
    )
    assert synced.error_code == Errors.NONE, synced
    return joined.member_id, joined.generation_id


def wait_state(c: WireClient, group_id: str, state: str) -> None:
    """Poll DescribeGroups: requests on two connections race, so a test that needs a state
    (a JoinGroup parked on one connection) waits for it before it goes on."""
    wait_for(lambda: describe(c, group_id).group_state == state, f"{group_id} in {state}")


def add_member_and_rebalance(
    a: WireClient, b: WireClient, group_id: str, a_id: str
) -> tuple[str, dict[str, bytes]]:
    """A Stable group of one (leader ``a_id``, on ``a``) takes a second member on ``b``: both
    join the next generation and sync. Returns b's member id and the assignment plan."""
    b_first = join(b, group_id)
    assert b_first.error_code == Errors.MEMBER_ID_REQUIRED
    b_id = b_first.member_id
    b_join = b.send(JOIN_GROUP, JOIN_V, join_values(group_id, b_id))  # parked
    wait_state(a, group_id, "PreparingRebalance")
    a_joined = join(a, group_id, a_id)
    assert receive(b, JOIN_GROUP, JOIN_V, b_join).error_code == Errors.NONE
    gen = a_joined.generation_id
    b_sync = b.send(SYNC_GROUP, SYNC_V, sync_values(group_id, gen, b_id))
    plan = {a_id: assignment(TOPIC, [0, 1]), b_id: assignment(TOPIC, [2, 3])}
    assert sync(a, group_id, gen, a_id, assignments=plan).error_code == Errors.NONE
    assert receive(b, SYNC_GROUP, SYNC_V, b_sync).assignment == plan[b_id]
    return b_id, plan


# ---------------------------------------------------------------------------------------------
# JoinGroup.


@pytest.mark.parametrize("version", [4, 9])
def test_join_with_an_empty_member_id_gets_one_then_leads_generation_one(
    cluster: LocalCluster, version: int
) -> None:
    group_id = f"join-v{version}"
    with coordinator(cluster, group_id) as c:
        values = join_values(group_id)
        first = c.call(JOIN_GROUP, version, values)
        assert first.error_code == Errors.MEMBER_ID_REQUIRED
        assert first.member_id.startswith(f"{CLIENT_ID}-")  # client id + "-" + a UUID
        assert first.generation_id == -1

        joined = c.call(JOIN_GROUP, version, {**values, "member_id": first.member_id})
        assert joined.error_code == Errors.NONE
        assert joined.member_id == first.member_id
        assert joined.generation_id == 1
        assert joined.leader == first.member_id
        assert joined.protocol_name == "range"
        assert [(m.member_id, m.metadata) for m in joined.members] == [
            (first.member_id, subscription(TOPIC))
        ]


def test_join_before_v4_needs_no_member_id_round_trip(cluster: LocalCluster) -> None:
    group_id = "join-v3"
    with coordinator(cluster, group_id) as c:
        joined = c.call(JOIN_GROUP, 3, join_values(group_id))
        assert joined.error_code == Errors.NONE
        assert joined.member_id.startswith(f"{CLIENT_ID}-")
        assert (joined.generation_id, joined.leader) == (1, joined.member_id)


def test_session_timeout_outside_the_group_bounds_is_invalid(cluster: LocalCluster) -> None:
    group_id = "session-bounds"
    with coordinator(cluster, group_id) as c:
        # group.min.session.timeout.ms = 6000 and group.max.session.timeout.ms = 1800000.
        for timeout_ms in (5_999, 100, 1_800_001):
            rejected = join(c, group_id, session_timeout_ms=timeout_ms)
            assert rejected.error_code == Errors.INVALID_SESSION_TIMEOUT, timeout_ms
        assert describe(c, group_id).group_state == "Dead"  # nothing was created
        assert join(c, group_id, session_timeout_ms=6_000).error_code == Errors.MEMBER_ID_REQUIRED


def test_a_member_with_disjoint_protocols_is_inconsistent(cluster: LocalCluster) -> None:
    group_id = "disjoint"
    with coordinator(cluster, group_id) as a, coordinator(cluster, group_id) as b:
        assert join_new(a, group_id).error_code == Errors.NONE
        other = (("roundrobin", subscription(TOPIC)),)
        refused = join(b, group_id, protocols=other)
        assert refused.error_code == Errors.INCONSISTENT_GROUP_PROTOCOL
        assert refused.member_id == ""
        # The same protocol name under another protocol type is inconsistent too.
        refused = join(b, group_id, protocol_type="connect")
        assert refused.error_code == Errors.INCONSISTENT_GROUP_PROTOCOL
    # And an empty group refuses an empty protocol list.
    with coordinator(cluster, "no-protocols") as c:
        refused = join(c, "no-protocols", protocols=())
        assert refused.error_code == Errors.INCONSISTENT_GROUP_PROTOCOL


def test_an_empty_group_id_is_invalid_at_every_node_for_membership(cluster: LocalCluster) -> None:
    """Kafka's GroupCoordinatorService checks the group id before it routes the request to a
    shard, so every node answers INVALID_GROUP_ID, not only the one "" hashes to."""
    for node_id in cluster.alive_ids():
        with client(cluster, node_id) as c:
            assert join(c, "").error_code == Errors.INVALID_GROUP_ID
            assert heartbeat(c, "", 1, "m") == Errors.INVALID_GROUP_ID
            assert sync(c, "", 1, "m").error_code == Errors.INVALID_GROUP_ID


def test_an_empty_group_id_commits_fetches_describes_and_deletes(cluster: LocalCluster) -> None:
    """OffsetCommit, OffsetFetch, DescribeGroups and DeleteGroups take "" "for backwards
    compatibility" (GroupCoordinatorService): its coordinator treats it as any simple group."""
    with coordinator(cluster, "") as c:
        assert commit(c, "", -1, "", {TOPIC: {0: (5, "m")}}) == {(TOPIC, 0): Errors.NONE}
        assert fetch(c, "", {TOPIC: [0]}) == (Errors.NONE, {(TOPIC, 0): (5, "m", Errors.NONE)})
        described = describe(c, "")
        assert (described.error_code, described.group_state) == (Errors.NONE, "Empty")
        assert delete_groups(c, "") == {"": Errors.NONE}
        assert fetch(c, "", {TOPIC: [0]}) == (Errors.NONE, {(TOPIC, 0): (-1, "", Errors.NONE)})


# ---------------------------------------------------------------------------------------------
# SyncGroup, Heartbeat, rebalances and commits of members.


def test_sync_with_a_wrong_generation_is_illegal(cluster: LocalCluster) -> None:
    group_id = "sync-generation"
    with coordinator(cluster, group_id) as c:
        joined = join_new(c, group_id)
        member_id = joined.member_id
        for wrong in (joined.generation_id + 1, joined.generation_id - 1, -1):
            assert sync(c, group_id, wrong, member_id).error_code == Errors.ILLEGAL_GENERATION
        assert sync(c, group_id, 1, "not-a-member").error_code == Errors.UNKNOWN_MEMBER_ID
        mine = assignment(TOPIC, [0, 1, 2, 3])
        synced = sync(c, group_id, 1, member_id, assignments={member_id: mine})
        assert synced.error_code == Errors.NONE
        assert synced.assignment == mine
        assert describe(c, group_id).group_state == "Stable"


def test_sync_v5_without_its_protocol_type_or_name_is_inconsistent(cluster: LocalCluster) -> None:
    """Both are mandatory from v5 (KafkaApis.handleSyncGroupRequest); v4 has neither."""
    group_id = "sync-v5-protocol"
    with coordinator(cluster, group_id) as c:
        joined = join_new(c, group_id)
        member_id = joined.member_id
        values = sync_values(group_id, joined.generation_id, member_id)
        for missing in ({"protocol_type": None}, {"protocol_name": None}):
            named = {"protocol_type": "consumer", "protocol_name": "range", **missing}
            answer = c.call(SYNC_GROUP, 5, {**values, **named})
            assert answer.error_code == Errors.INCONSISTENT_GROUP_PROTOCOL
        named = {"protocol_type": "consumer", "protocol_name": "range"}
        assert c.call(SYNC_GROUP, 5, {**values, **named}).error_code == Errors.NONE
        assert c.call(SYNC_GROUP, 4, values).error_code == Errors.NONE


def test_heartbeat_from_an_unknown_member(cluster: LocalCluster) -> None:
    group_id = "heartbeat-unknown"
    with coordinator(cluster, group_id) as c:
        member_id, generation = stable_single_member_group(c, group_id)
        assert heartbeat(c, group_id, generation, member_id) == Errors.NONE
        assert heartbeat(c, group_id, generation, "nobody") == Errors.UNKNOWN_MEMBER_ID
        assert heartbeat(c, group_id, generation, "") == Errors.UNKNOWN_MEMBER_ID
        assert heartbeat(c, group_id, generation + 1, member_id) == Errors.ILLEGAL_GENERATION
    with coordinator(cluster, "heartbeat-no-group") as c:
        assert heartbeat(c, "heartbeat-no-group", 1, "nobody") == Errors.UNKNOWN_MEMBER_ID


def test_leave_group_errors_by_version(cluster: LocalCluster) -> None:
    """LeaveGroup v0-2 carry no member list: a member's error is the answer's (it answered
    NONE for an unknown member). v3+ name each member's error, an unknown group's too
    (GroupCoordinatorService.leaveGroup; it was the request's error)."""
    group_id = "leave-errors"
    with coordinator(cluster, group_id) as c:
        stable_single_member_group(c, group_id)
        for version in (0, 1, 2):
            response = c.call(LEAVE_GROUP, version, {"group_id": group_id, "member_id": "bogus"})
            assert response.error_code == Errors.UNKNOWN_MEMBER_ID, (version, response)
    with coordinator(cluster, "leave-no-group") as c:
        assert leave(c, "leave-no-group", "nobody") == Errors.UNKNOWN_MEMBER_ID


def test_rebalance_heartbeats_and_commits_of_old_generations(cluster: LocalCluster) -> None:
    """A second member joins a Stable group: the first one's heartbeat says REBALANCE_IN_PROGRESS,
    its commit of the current generation is still taken; once both rejoin and sync at generation
    2, generation 1 is ILLEGAL_GENERATION for heartbeats and commits."""
    group_id = "rebalance"
    with coordinator(cluster, group_id) as a, coordinator(cluster, group_id) as b:
        a_id, generation = stable_single_member_group(a, group_id)
        assert generation == 1

        b_first = join(b, group_id)
        assert b_first.error_code == Errors.MEMBER_ID_REQUIRED
        b_join = b.send(JOIN_GROUP, JOIN_V, join_values(group_id, b_first.member_id))  # parked
        wait_state(a, group_id, "PreparingRebalance")
        assert heartbeat(a, group_id, 1, a_id) == Errors.REBALANCE_IN_PROGRESS
        assert commit(a, group_id, 1, a_id, {TOPIC: {0: (5, None)}}) == {(TOPIC, 0): Errors.NONE}
        # The old generation cannot sync into a rebalance either.
        assert sync(a, group_id, 1, a_id).error_code == Errors.REBALANCE_IN_PROGRESS

        a_joined = join(a, group_id, a_id)  # the last expected member: the join phase completes
        b_joined = receive(b, JOIN_GROUP, JOIN_V, b_join)
        assert a_joined.error_code == b_joined.error_code == Errors.NONE
        assert a_joined.generation_id == b_joined.generation_id == 2
        assert a_joined.leader == b_joined.leader == a_id
        assert {m.member_id for m in a_joined.members} == {a_id, b_first.member_id}
        assert b_joined.members == ()  # only the leader learns the members
        # CompletingRebalance: the members know generation 2 but have no assignment yet.
        assert commit(a, group_id, 2, a_id, {TOPIC: {0: (6, None)}}) == {
            (TOPIC, 0): Errors.REBALANCE_IN_PROGRESS
        }
        assert heartbeat(a, group_id, 2, a_id) == Errors.NONE  # KAFKA-12890

        b_sync = b.send(SYNC_GROUP, SYNC_V, sync_values(group_id, 2, b_first.member_id))
        plan = {a_id: assignment(TOPIC, [0, 1]), b_first.member_id: assignment(TOPIC, [2, 3])}
        assert sync(a, group_id, 2, a_id, assignments=plan).assignment == plan[a_id]
        assert receive(b, SYNC_GROUP, SYNC_V, b_sync).assignment == plan[b_first.member_id]

        assert heartbeat(a, group_id, 1, a_id) == Errors.ILLEGAL_GENERATION
        assert heartbeat(a, group_id, 2, a_id) == Errors.NONE
        stale = commit(a, group_id, 1, a_id, {TOPIC: {0: (9, None), 1: (9, None)}})
        assert stale == {
            (TOPIC, 0): Errors.ILLEGAL_GENERATION,
            (TOPIC, 1): Errors.ILLEGAL_GENERATION,
        }
        assert commit(b, group_id, 2, b_first.member_id, {TOPIC: {2: (7, "b")}}) == {
            (TOPIC, 2): Errors.NONE
        }
        _, offsets = fetch(a, group_id, {TOPIC: [0, 1, 2]})
        assert offsets == {
            (TOPIC, 0): (5, "", Errors.NONE),  # the stale commit of 9 was refused
            (TOPIC, 1): (-1, "", Errors.NONE),
            (TOPIC, 2): (7, "b", Errors.NONE),
        }


def test_offset_commit_errors_per_partition(cluster: LocalCluster) -> None:
    group_id = "commit-partitions"
    with coordinator(cluster, group_id) as c:
        member_id, generation = stable_single_member_group(c, group_id)
        errors = commit(
            c,
            group_id,
            generation,
            member_id,
            {
                TOPIC: {
                    0: (10, "m" * 4096),  # offset.metadata.max.bytes = 4096: the limit is fine
                    1: (11, "m" * 4097),
                    # Counted in UTF-16 code units, as Java's String.length(): 8192 bytes of
                    # UTF-8 are fine.
                    2: (12, "é" * 4096),
                    PARTITIONS: (13, None),  # no such partition
                },
                "no-such-topic": {0: (1, None)},
            },
        )
        assert errors == {
            (TOPIC, 0): Errors.NONE,
            (TOPIC, 1): Errors.OFFSET_METADATA_TOO_LARGE,
            (TOPIC, 2): Errors.NONE,
            (TOPIC, PARTITIONS): Errors.UNKNOWN_TOPIC_OR_PARTITION,
            ("no-such-topic", 0): Errors.UNKNOWN_TOPIC_OR_PARTITION,
        }
        # Only the unknown topic: answered without reaching the group.
        assert commit(c, group_id, generation, member_id, {"no-such-topic": {3: (1, None)}}) == {
            ("no-such-topic", 3): Errors.UNKNOWN_TOPIC_OR_PARTITION
        }
        _, offsets = fetch(c, group_id, {TOPIC: [0, 1, 2]})
        assert offsets == {
            (TOPIC, 0): (10, "m" * 4096, Errors.NONE),
            (TOPIC, 1): (-1, "", Errors.NONE),
            (TOPIC, 2): (12, "é" * 4096, Errors.NONE),
        }
        # A member-less commit to a group with members, and one from a stranger.
        assert commit(c, group_id, -1, "", {TOPIC: {0: (1, None)}}) == {
            (TOPIC, 0): Errors.UNKNOWN_MEMBER_ID
        }
        assert commit(c, group_id, generation, "stranger", {TOPIC: {0: (1, None)}}) == {
            (TOPIC, 0): Errors.UNKNOWN_MEMBER_ID
        }


def test_offset_fetch_returns_committed_offsets(cluster: LocalCluster) -> None:
    """A consumer that assigns itself partitions commits with generation -1 (a "simple" group);
    OffsetFetch answers what was committed, -1 for the rest, and everything when asked for all
    topics. An unknown group answers -1 offsets, no error."""
    group_id = "simple-offsets"
    with coordinator(cluster, group_id) as c:
        committed = {0: (100, "first"), 3: (300, None)}
        assert set(commit(c, group_id, -1, "", {TOPIC: committed}).values()) == {Errors.NONE}
        error, offsets = fetch(c, group_id, {TOPIC: [0, 1, 3]})
        assert error == Errors.NONE
        assert offsets == {
            (TOPIC, 0): (100, "first", Errors.NONE),
            (TOPIC, 1): (-1, "", Errors.NONE),
            (TOPIC, 3): (300, "", Errors.NONE),
        }
        error, every = fetch(c, group_id, None)
        assert error == Errors.NONE
        assert every == {
            (TOPIC, 0): (100, "first", Errors.NONE),
            (TOPIC, 3): (300, "", Errors.NONE),
        }
        # A later commit replaces the earlier one.
        commit(c, group_id, -1, "", {TOPIC: {0: (150, None)}})
        assert fetch(c, group_id, {TOPIC: [0]})[1] == {(TOPIC, 0): (150, "", Errors.NONE)}
        assert describe(c, group_id).group_state == "Empty"
    with coordinator(cluster, "never-committed") as c:
        error, offsets = fetch(c, "never-committed", {TOPIC: [0]})
        assert (error, offsets) == (Errors.NONE, {(TOPIC, 0): (-1, "", Errors.NONE)})


# ---------------------------------------------------------------------------------------------
# Static membership (KIP-345).


def test_static_member_rejoining_fences_its_old_member_id(cluster: LocalCluster) -> None:
    group_id = "static"
    instance = "instance-1"
    with coordinator(cluster, group_id) as old, coordinator(cluster, group_id) as new:
        # A static member needs no KIP-394 round trip: its instance id identifies it.
        first = join(old, group_id, instance_id=instance)
        assert first.error_code == Errors.NONE
        assert first.member_id.startswith(f"{instance}-")
        mine = assignment(TOPIC, range(PARTITIONS))
        synced = sync(
            old,
            group_id,
            first.generation_id,
            first.member_id,
            assignments={first.member_id: mine},
            instance_id=instance,
        )
        assert synced.error_code == Errors.NONE

        # The same instance restarts: a new member id, the same generation, no rebalance.
        second = join(new, group_id, instance_id=instance)
        assert second.error_code == Errors.NONE
        assert second.member_id != first.member_id
        assert second.member_id.startswith(f"{instance}-")
        assert second.generation_id == first.generation_id
        described = describe(new, group_id)
        assert described.group_state == "Stable"
        assert [m.member_id for m in described.members] == [second.member_id]
        assert [m.group_instance_id for m in described.members] == [instance]

        gen = first.generation_id
        assert heartbeat(old, group_id, gen, first.member_id, instance) == (
            Errors.FENCED_INSTANCE_ID
        )
        assert heartbeat(new, group_id, gen, second.member_id, instance) == Errors.NONE
        fenced = sync(old, group_id, gen, first.member_id, instance_id=instance)
        assert fenced.error_code == Errors.FENCED_INSTANCE_ID
        # The new member id keeps the assignment of the instance.
        kept = sync(new, group_id, gen, second.member_id, instance_id=instance)
        assert (kept.error_code, kept.assignment) == (Errors.NONE, mine)
        # Without its instance id the old member id is simply unknown.
        assert heartbeat(old, group_id, gen, first.member_id) == Errors.UNKNOWN_MEMBER_ID


# ---------------------------------------------------------------------------------------------
# DeleteGroups, ListGroups, DescribeGroups.


def test_delete_groups_of_live_empty_and_unknown_groups(cluster: LocalCluster) -> None:
    live, empty, unknown = "delete-live", "delete-empty", "delete-unknown"
    with coordinator(cluster, live) as c:
        member_id, _ = stable_single_member_group(c, live)
        assert delete_groups(c, live) == {live: Errors.NON_EMPTY_GROUP}
        assert describe(c, live).group_state == "Stable"
        # Once its last member leaves, the group is Empty and can go.
        assert leave(c, live, member_id) == Errors.NONE
        assert describe(c, live).group_state == "Empty"
        assert delete_groups(c, live) == {live: Errors.NONE}
        assert describe(c, live).group_state == "Dead"
    with coordinator(cluster, empty) as c:
        commit(c, empty, -1, "", {TOPIC: {1: (42, None)}})
        assert delete_groups(c, empty) == {empty: Errors.NONE}
        # Its offsets went with it.
        assert fetch(c, empty, {TOPIC: [1]})[1] == {(TOPIC, 1): (-1, "", Errors.NONE)}
    with coordinator(cluster, unknown) as c:
        assert delete_groups(c, unknown) == {unknown: Errors.GROUP_ID_NOT_FOUND}


def offset_delete(
    c: WireClient, group_id: str, topics: dict[str, list[int]]
) -> tuple[Errors, list[tuple[str, list[tuple[int, Errors]]]]]:
    """OffsetDelete v0: (group error, [(topic, [(partition, error)])] in the answer's order)."""
    response = c.call(
        OFFSET_DELETE,
        0,
        {
            "group_id": group_id,
            "topics": [
                {"name": name, "partitions": [{"partition_index": p} for p in partitions]}
                for name, partitions in topics.items()
            ],
        },
    )
    return Errors(response.error_code), [
        (t.name, [(p.partition_index, Errors(p.error_code)) for p in t.partitions])
        for t in response.topics
    ]


# Kafka 4.0's versions of the group APIs (KAFKA-FACTS: OffsetCommit v0-9, OffsetFetch v0-9, the
# versions KIP-896 removed left out); a kio upgrade must not widen them unnoticed.
GROUP_API_VERSIONS = {
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 6),
    LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    68: (0, 1),  # ConsumerGroupHeartbeat
    69: (0, 1),  # ConsumerGroupDescribe
}


def test_group_api_versions_and_a_version_not_served(cluster: LocalCluster) -> None:
    """ApiVersions shows the versions the handlers serve. A request of a version past them (an
    OffsetCommit v10, which names topics by id) closes that connection alone."""
    with client(cluster, 1) as c:
        response = c.call(
            API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        served = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert {key: served.get(key) for key in GROUP_API_VERSIONS} == GROUP_API_VERSIONS
    group_id = "v10-commit"
    with coordinator(cluster, group_id) as c:
        frame = encode_request(
            OFFSET_COMMIT,
            10,
            1,
            {
                "group_id": group_id,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [],
            },
        )
        c.send_raw(frame)
        with pytest.raises(ConnectionError):
            c.read_frame()
    with coordinator(cluster, group_id) as c:
        assert commit(c, group_id, -1, "", {TOPIC: {0: (1, None)}}) == {(TOPIC, 0): Errors.NONE}


def test_offset_delete_answers_partitions_missing_from_the_metadata_itself(
    cluster: LocalCluster,
) -> None:
    """As KafkaApis: partitions the metadata lacks get UNKNOWN_TOPIC_OR_PARTITION without the
    coordinator; its answers for the rest follow under the same topic
    (``OffsetDeleteResponse.Builder.merge``); a group error replaces every answer."""
    group_id, unknown = "offset-delete", "offset-delete-unknown"
    with coordinator(cluster, group_id) as c:
        commit(c, group_id, -1, "", {TOPIC: {0: (5, None), 1: (6, None)}})
        error, answers = offset_delete(c, group_id, {TOPIC: [0, PARTITIONS], "no-such-topic": [0]})
        assert error == Errors.NONE
        assert answers == [
            (TOPIC, [(PARTITIONS, Errors.UNKNOWN_TOPIC_OR_PARTITION), (0, Errors.NONE)]),
            ("no-such-topic", [(0, Errors.UNKNOWN_TOPIC_OR_PARTITION)]),
        ]
        assert fetch(c, group_id, {TOPIC: [0, 1]})[1] == {
            (TOPIC, 0): (-1, "", Errors.NONE),
            (TOPIC, 1): (6, "", Errors.NONE),
        }
        # Only partitions the metadata lacks: the group is still asked, and exists.
        assert offset_delete(c, group_id, {"no-such-topic": [1]}) == (
            Errors.NONE,
            [("no-such-topic", [(1, Errors.UNKNOWN_TOPIC_OR_PARTITION)])],
        )
    with coordinator(cluster, unknown) as c:
        assert offset_delete(c, unknown, {TOPIC: [0], "no-such-topic": [0]}) == (
            Errors.GROUP_ID_NOT_FOUND,
            [],
        )


def list_groups(cluster: LocalCluster, states: list[str]) -> dict[str, str]:
    """ListGroups at every node (each lists the groups it coordinates): group id -> state."""
    out: dict[str, str] = {}
    for node_id in cluster.alive_ids():
        with client(cluster, node_id) as c:
            response = c.call(LIST_GROUPS, LIST_V, {"states_filter": states})
        assert response.error_code == Errors.NONE
        for g in response.groups:
            assert g.group_id not in out, f"{g.group_id} listed by two nodes"
            out[g.group_id] = g.group_state
    return out


def test_list_groups_with_a_state_filter(cluster: LocalCluster) -> None:
    stable, empty = "list-stable", "list-empty"
    with coordinator(cluster, stable) as c:
        stable_single_member_group(c, stable)
    with coordinator(cluster, empty) as c:
        commit(c, empty, -1, "", {TOPIC: {0: (1, None)}})

    only_stable = list_groups(cluster, ["Stable"])
    assert only_stable[stable] == "Stable"
    assert empty not in only_stable
    assert set(only_stable.values()) == {"Stable"}
    only_empty = list_groups(cluster, ["empty"])  # the filter ignores case
    assert only_empty[empty] == "Empty"
    assert stable not in only_empty
    assert set(only_empty.values()) == {"Empty"}
    both = list_groups(cluster, ["Stable", "Empty"])
    assert {stable, empty} <= set(both)
    everything = list_groups(cluster, [])
    assert {stable: "Stable", empty: "Empty"}.items() <= everything.items()
    assert list_groups(cluster, ["Dead"]) == {}


def test_describe_a_stable_group_shows_members_and_protocol(cluster: LocalCluster) -> None:
    group_id = "describe-stable"
    with coordinator(cluster, group_id) as a, coordinator(cluster, group_id) as b:
        a_id, _ = stable_single_member_group(a, group_id)
        b_id, plan = add_member_and_rebalance(a, b, group_id, a_id)

        described = describe(a, group_id)
        assert described.error_code == Errors.NONE
        assert described.group_state == "Stable"
        assert described.protocol_type == "consumer"
        assert described.protocol_data == "range"
        members = {m.member_id: m for m in described.members}
        assert set(members) == {a_id, b_id}
        for member_id, m in members.items():
            assert m.client_id == CLIENT_ID
            assert m.client_host == "/127.0.0.1"
            assert m.member_metadata == subscription(TOPIC)
            assert m.member_assignment == plan[member_id]
            assert m.group_instance_id is None
        # No authorizer: asked for, every group operation (READ, DELETE, DESCRIBE and the
        # configs'); not asked for, Integer.MIN_VALUE.
        assert described.authorized_operations == -(2**31)
        values = {"groups": [group_id], "include_authorized_operations": True}
        asked = a.call(DESCRIBE_GROUPS, DESCRIBE_V, values).groups[0]
        assert asked.authorized_operations == sum(1 << op for op in (3, 6, 8, 10, 11))


# ---------------------------------------------------------------------------------------------
# NOT_COORDINATOR.


def test_group_requests_at_a_node_that_is_not_the_coordinator(cluster: LocalCluster) -> None:
    group_id = "wrong-node"
    right = coordinator_id(cluster, group_id)
    with client(cluster, right) as c:
        member_id, gen = stable_single_member_group(c, group_id)
    for wrong in sorted(set(cluster.alive_ids()) - {right}):
        with client(cluster, wrong) as c:
            assert join(c, group_id).error_code == Errors.NOT_COORDINATOR
            assert join(c, group_id, member_id).error_code == Errors.NOT_COORDINATOR
            assert sync(c, group_id, gen, member_id).error_code == Errors.NOT_COORDINATOR
            assert heartbeat(c, group_id, gen, member_id) == Errors.NOT_COORDINATOR
            assert commit(c, group_id, gen, member_id, {TOPIC: {0: (1, None)}}) == {
                (TOPIC, 0): Errors.NOT_COORDINATOR
            }
            error, offsets = fetch(c, group_id, {TOPIC: [0]})
            assert error == Errors.NOT_COORDINATOR
            assert offsets == {}  # the group's error alone (OffsetFetchResponse.groupError)
            assert describe(c, group_id).error_code == Errors.NOT_COORDINATOR
            assert delete_groups(c, group_id) == {group_id: Errors.NOT_COORDINATOR}
            response = c.call(
                LEAVE_GROUP,
                LEAVE_V,
                {"group_id": group_id, "members": [{"member_id": member_id}]},
            )
            assert response.error_code == Errors.NOT_COORDINATOR
            # The node does not list a group it does not coordinate.
            listed = c.call(LIST_GROUPS, LIST_V, {"states_filter": []})
            assert group_id not in {g.group_id for g in listed.groups}
    # None of that touched the group.
    with client(cluster, right) as c:
        assert heartbeat(c, group_id, gen, member_id) == Errors.NONE
        assert describe(c, group_id).group_state == "Stable"


def test_find_coordinator_spreads_groups_over_every_node(cluster: LocalCluster) -> None:
    """Batched FindCoordinator (v4, KIP-699) for many group ids, asked at every node: each
    answer is the leader of the group's ``__consumer_offsets`` partition, every node
    coordinates some groups, and all nodes give the same answers."""
    groups = [f"spread-{i}" for i in range(300)]
    controller = cluster.controller_id()
    assert controller is not None
    offsets = cluster.describe(controller, topics=True)["topics"]["__consumer_offsets"]
    leaders = {p["partition"]: p["leader"] for p in offsets["partitions"]}
    answers = []
    for node_id in cluster.alive_ids():
        with client(cluster, node_id) as c:
            found = c.call(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": groups})
        by_key = {co.key: co for co in found.coordinators}
        assert set(by_key) == set(groups)
        for g, co in by_key.items():
            assert co.error_code == Errors.NONE, (g, co)
            assert co.node_id == leaders[partition_for(g, len(leaders))], (g, co)
            n = cluster.node(co.node_id)
            assert (co.host, co.port) == (n.host, n.kafka_port)
        answers.append({g: co.node_id for g, co in by_key.items()})
    assert all(a == answers[0] for a in answers)
    assert set(answers[0].values()) == set(cluster.alive_ids())


# ---------------------------------------------------------------------------------------------
# group.max.size (a cluster of its own).


def test_group_max_size_refuses_the_member_too_many(tmp_path: Path) -> None:
    overrides = {"group.initial.rebalance.delay.ms": 0, "group.max.size": 1}
    with LocalCluster(tmp_path, nodes=1, overrides=overrides) as small:
        group_id = "max-size"
        with coordinator(small, group_id) as a, coordinator(small, group_id) as b:
            joined = join_new(a, group_id)
            assert joined.error_code == Errors.NONE
            refused = join(b, group_id)
            assert refused.error_code == Errors.GROUP_MAX_SIZE_REACHED
            assert refused.member_id == ""
            # Static members count too.
            refused = join(b, group_id, instance_id="static-2")
            assert refused.error_code == Errors.GROUP_MAX_SIZE_REACHED
            # The member already in keeps its place and can rejoin.
            rejoined = join(a, group_id, joined.member_id)
            assert rejoined.error_code == Errors.NONE
            assert [m.member_id for m in describe(a, group_id).members] == [joined.member_id]


def test_a_commit_too_large_for_the_offsets_topic_is_refused_at_once(tmp_path: Path) -> None:
    """A commit whose records exceed the offsets topic's max.message.bytes: UNKNOWN_SERVER_ERROR
    for every partition (Kafka's mapping of MESSAGE_TOO_LARGE: a retry would be refused
    alike), and the coordinator goes on serving the group. It used to unload and reload the
    shard and answer NOT_COORDINATOR, which clients retry until their timeout."""
    overrides = {"group.initial.rebalance.delay.ms": 0, "message.max.bytes": 8192}
    with LocalCluster(tmp_path, nodes=1, overrides=overrides) as small:
        _create_topic(small, TOPIC, PARTITIONS, 1)
        group_id = "too-large"
        with coordinator(small, group_id) as c:
            big: dict[int, tuple[int, str | None]] = dict.fromkeys(
                range(PARTITIONS), (5, "m" * 4096)
            )
            assert commit(c, group_id, -1, "", {TOPIC: big}) == {
                (TOPIC, p): Errors.UNKNOWN_SERVER_ERROR for p in range(PARTITIONS)
            }
            assert commit(c, group_id, -1, "", {TOPIC: {0: (7, "small")}}) == {
                (TOPIC, 0): Errors.NONE
            }
            _, offsets = fetch(c, group_id, {TOPIC: [0, 1]})
            assert offsets == {
                (TOPIC, 0): (7, "small", Errors.NONE),
                (TOPIC, 1): (-1, "", Errors.NONE),
            }
        text = small.node(1).log_path.read_text()
        assert "unloading the shard" not in text


# ---------------------------------------------------------------------------------------------
# Bad input on the group APIs.


def frame(body: bytes) -> bytes:
    return SIZE.pack(len(body)) + body


def header(api_key: int, version: int, correlation_id: int = 1) -> bytes:
    """Request header v1 (non-flexible versions), client id null."""
    return struct.pack(">hhih", api_key, version, correlation_id, -1)


def flexible_header(api_key: int, version: int, correlation_id: int = 1) -> bytes:
    """Request header v2: v1 plus an empty tagged-field section."""
    return header(api_key, version, correlation_id) + b"\x00"


def closes(cluster: LocalCluster, node_id: int, data: bytes) -> bool:
    with client(cluster, node_id) as c:
        c.send_raw(data)
        return c.is_closed_by_server()


def serves(cluster: LocalCluster, node_id: int) -> None:
    """A new client gets its answers, including a group's: the node is up and not wedged."""
    assert launcher.is_alive(cluster.node(node_id).pid)
    with client(cluster, node_id) as c:
        versions = c.call(
            API_VERSIONS,
            3,
            {"client_software_name": "kcoord-tests", "client_software_version": "1.0"},
        )
        assert versions.error_code == Errors.NONE
    group_id = f"after-bad-input-{random.randrange(2**32)}"
    print(f"serving group {group_id}")  # its coordinator partition: printed as a seed is
    with coordinator(cluster, group_id) as c:
        assert join_new(c, group_id).error_code == Errors.NONE


def _v5_join_prefix(group_id: bytes = b"g") -> bytes:
    """JoinGroup v5 up to its protocols array: group id, timeouts, member id, instance id,
    protocol type."""
    return (
        struct.pack(">h", len(group_id))
        + group_id
        + struct.pack(">ii", SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS)
        + struct.pack(">h", 0)  # member id ""
        + struct.pack(">h", -1)  # group instance id null
        + _string("consumer")
    )


def test_garbage_group_requests_close_the_connection(cluster: LocalCluster) -> None:
    node_id = coordinator_id(cluster, "g")
    join_v5 = header(JOIN_GROUP, 5)
    join_v7 = flexible_header(JOIN_GROUP, 7)
    cases = {
        "empty JoinGroup body": join_v5,
        "random bytes": join_v5 + bytes(random.Random(1).randrange(256) for _ in range(64)),
        "group id longer than the body": join_v5 + struct.pack(">h", 500) + b"g",
        "session timeout cut short": join_v5 + _string("g") + b"\x00\x00",
        "string where an int32 goes": join_v5 + _string("g") + _string("thirty seconds"),
        "negative protocol count": join_v5 + _v5_join_prefix() + struct.pack(">i", -7),
        "2^31-1 protocols in 4 bytes": join_v5 + _v5_join_prefix() + struct.pack(">i", 2**31 - 1),
        "protocol metadata past the end": join_v5
        + _v5_join_prefix()
        + struct.pack(">i", 1)
        + _string("range")
        + struct.pack(">i", 1_000_000)
        + b"x",
        "null protocol type": join_v5
        + _string("g")
        + struct.pack(">iihh", SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS, 0, -1)
        + struct.pack(">h", -1)
        + struct.pack(">i", 0),
        "compact array of 2^35 protocols": join_v7
        + b"\x02g"  # compact group id "g"
        + struct.pack(">ii", SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS)
        + b"\x01\x00\x09consumer"  # member id "", instance id null, protocol type
        + b"\xff\xff\xff\xff\x7f",
        "varint that never ends": join_v7 + b"\xff" * 16,
        "group id not UTF-8": join_v5 + struct.pack(">h", 4) + b"\xff\xfe\xfd\xfc",
        "SyncGroup of 2^31-1 assignments": header(SYNC_GROUP, 3)
        + _string("g")
        + struct.pack(">i", 1)
        + _string("m")
        + struct.pack(">h", -1)
        + struct.pack(">i", 2**31 - 1),
        "Heartbeat cut after the generation": header(HEARTBEAT, 3) + _string("g") + b"\x00\x00\x00",
        "OffsetCommit of 2^31-1 topics": flexible_header(OFFSET_COMMIT, 8)
        + b"\x02g"
        + struct.pack(">i", -1)
        + b"\x01\x00"
        + b"\xff\xff\xff\xff\x07",
        "OffsetCommit metadata past the end": header(OFFSET_COMMIT, 7)
        + _string("g")
        + struct.pack(">i", -1)
        + _string("")
        + struct.pack(">h", -1)
        + struct.pack(">i", 1)
        + _string(TOPIC)
        + struct.pack(">i", 1)
        + struct.pack(">iqi", 0, 1, -1)
        + struct.pack(">h", 30_000)
        + b"m",
        "OffsetFetch of 2^31-1 partitions": header(OFFSET_FETCH, 5)
        + _string("g")
        + struct.pack(">i", 1)
        + _string(TOPIC)
        + struct.pack(">i", 2**31 - 1),
        "DescribeGroups of -2 groups": header(DESCRIBE_GROUPS, 3) + struct.pack(">i", -2),
        "DeleteGroups of 2^31-1 groups": header(DELETE_GROUPS, 1) + struct.pack(">i", 2**31 - 1),
        "LeaveGroup members cut short": header(LEAVE_GROUP, 3)
        + _string("g")
        + struct.pack(">i", 3)
        + _string("m"),
        "ListGroups states of 2^31-1": flexible_header(LIST_GROUPS, 4) + b"\xff\xff\xff\xff\x07",
    }
    for what, body in cases.items():
        assert closes(cluster, node_id, frame(body)), what
    serves(cluster, node_id)


def test_well_formed_nonsense_gets_kafka_errors(cluster: LocalCluster) -> None:
    """Values a client should never send, in well-formed requests: Kafka's error answers, the
    connection stays usable."""
    group_id = "nonsense"
    with coordinator(cluster, group_id) as c:
        assert join(c, group_id, session_timeout_ms=-1).error_code == Errors.INVALID_SESSION_TIMEOUT
        garbage = (("range", b"\xff" * 3),)  # subscription bytes that do not parse
        joined = join_new(c, group_id, protocols=garbage)
        assert joined.error_code == Errors.NONE
        # An assignment for a member that does not exist is ignored; garbage bytes are passed on.
        synced = sync(
            c,
            group_id,
            joined.generation_id,
            joined.member_id,
            assignments={joined.member_id: b"\x00garbage", "ghost": b"x"},
        )
        assert (synced.error_code, synced.assignment) == (Errors.NONE, b"\x00garbage")
        assert [m.member_id for m in describe(c, group_id).members] == [joined.member_id]
        errors = commit(
            c, group_id, joined.generation_id, joined.member_id, {TOPIC: {-1: (-5, None)}}
        )
        assert errors == {(TOPIC, -1): Errors.UNKNOWN_TOPIC_OR_PARTITION}
        assert heartbeat(c, group_id, 2**31 - 1, joined.member_id) == Errors.ILLEGAL_GENERATION
        assert heartbeat(c, group_id, joined.generation_id, joined.member_id) == Errors.NONE


def _group_seed_frames() -> list[bytes]:
    """Valid requests of every group API, at several versions, for mutation."""
    group = "fuzz"
    join = join_values(group)
    sync = sync_values(group, 1, "m", {"m": assignment(TOPIC, [0])})
    commit_values = {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "retention_time": -1,
        "topics": [
            {
                "name": TOPIC,
                "partitions": [
                    {"partition_index": 0, "committed_offset": 5, "committed_metadata": "x"}
                ],
            }
        ],
    }
    fetch_values = {
        "group_id": group,
        "topics": [{"name": TOPIC, "partition_indexes": [0, 1]}],
        "groups": [{"group_id": group, "topics": None}],
    }
    requests = [
        *((JOIN_GROUP, v, join) for v in (0, 1, 4, 5, 6, 9)),
        *((SYNC_GROUP, v, sync) for v in (0, 3, 4, 5)),
        *(
            (HEARTBEAT, v, {"group_id": group, "generation_id": 1, "member_id": "m"})
            for v in (0, 3, 4)
        ),
        *(
            (
                LEAVE_GROUP,
                v,
                {"group_id": group, "member_id": "m", "members": [{"member_id": "m"}]},
            )
            for v in (0, 3, 5)
        ),
        *((OFFSET_COMMIT, v, commit_values) for v in (2, 7, 8, 9)),
        *((OFFSET_FETCH, v, fetch_values) for v in (1, 5, 7, 8)),
        *((DESCRIBE_GROUPS, v, {"groups": [group, ""]}) for v in (0, 4, 5)),
        *((LIST_GROUPS, v, {"states_filter": ["Stable"]}) for v in (0, 3, 4)),
        *((DELETE_GROUPS, v, {"groups_names": [group, "other"]}) for v in (0, 2)),
    ]
    return [encode_request(key, v, i, values) for i, (key, v, values) in enumerate(requests)]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    body = bytearray(data[4:])
    for _ in range(rng.randrange(1, 4)):
        kind = rng.random()
        if kind < 0.45 and len(body) > 8:
            # Leave the api key and version alone: the mutation should reach the group decoder.
            body[rng.randrange(4, len(body))] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF])
        elif kind < 0.65 and len(body) > 12:
            pos = rng.randrange(8, len(body) - 3)
            body[pos : pos + 4] = rng.choice(
                [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", rng.randbytes(4)]
            )
        elif kind < 0.85:
            del body[rng.randrange(4, len(body) + 1) :]
        else:
            pos = rng.randrange(4, len(body) + 1)
            body[pos:pos] = rng.randbytes(rng.randrange(1, 16))
    return SIZE.pack(len(body)) + body


def _exchange(sock: socket.socket, data: bytes) -> bool:
    """Send one frame and read the node's reaction; False when the connection is done with
    (closed by the node, or silent: a parked JoinGroup, a frame still waiting for bytes)."""
    try:
        sock.sendall(data)
        if not readable([sock], SILENCE_S):
            return False
        prefix = sock.recv(SIZE.size, socket.MSG_WAITALL)
        if len(prefix) < SIZE.size:
            return False
        size: int = SIZE.unpack(prefix)[0]
        return len(sock.recv(size, socket.MSG_WAITALL)) == size
    except OSError:
        return False


def test_fuzzed_group_frames_never_take_the_node_down(cluster: LocalCluster) -> None:
    seed = int(os.environ.get("FUZZ_SEED", random.randrange(2**32)))
    print(f"fuzz seed {seed} (replay with FUZZ_SEED={seed})")
    rng = random.Random(seed)
    node_id = coordinator_id(cluster, "fuzz")
    node = cluster.node(node_id)
    pid = node.pid
    log_size_before = node.log_path.stat().st_size
    seeds = _group_seed_frames()
    sock: socket.socket | None = None
    answered = connections = 0
    for _ in range(FUZZ_FRAMES):
        if sock is None:
            sock = socket.create_connection((node.host, node.kafka_port), timeout=5)
            sock.settimeout(2)
            connections += 1
        if _exchange(sock, _mutate(rng, rng.choice(seeds))):
            answered += 1
        else:
            sock.close()
            sock = None
    if sock is not None:
        sock.close()
    print(f"{FUZZ_FRAMES} frames over {connections} connections, {answered} answered")
    # Both kinds happened: answers (the handlers saw odd values) and closed connections.
    assert 0 < answered < FUZZ_FRAMES
    assert node.pid == pid and launcher.is_alive(pid)
    serves(cluster, node_id)
    with open(node.log_path, "rb") as f:
        f.seek(log_size_before)
        logged = f.read().decode(errors="replace")
    assert "Traceback" not in logged, logged[logged.find("Traceback") - 2000 :][:6000]


# ---------------------------------------------------------------------------------------------
# Random group traffic: many members, stale ids and generations, static and dynamic.

TRAFFIC_SECONDS = 15.0
DRAIN_DEADLINE_S = 30.0
TRAFFIC_REBALANCE_TIMEOUT_MS = 3_000
# The answers each API may give at its coordinator (KAFKA-FACTS 1.5) when nothing fails; no
# coordinator errors, and never UNKNOWN_SERVER_ERROR (a shard handler that raised).
_MEMBER_ERRORS = {
    Errors.NONE,
    Errors.UNKNOWN_MEMBER_ID,
    Errors.ILLEGAL_GENERATION,
    Errors.REBALANCE_IN_PROGRESS,
    Errors.FENCED_INSTANCE_ID,
}
ALLOWED_ERRORS = {
    JOIN_GROUP: {
        Errors.NONE,
        Errors.MEMBER_ID_REQUIRED,
        Errors.UNKNOWN_MEMBER_ID,
        Errors.INCONSISTENT_GROUP_PROTOCOL,
        Errors.FENCED_INSTANCE_ID,
        Errors.REBALANCE_IN_PROGRESS,
    },
    SYNC_GROUP: _MEMBER_ERRORS | {Errors.INCONSISTENT_GROUP_PROTOCOL},
    HEARTBEAT: _MEMBER_ERRORS,
    LEAVE_GROUP: {Errors.NONE, Errors.UNKNOWN_MEMBER_ID, Errors.FENCED_INSTANCE_ID},
    OFFSET_COMMIT: _MEMBER_ERRORS | {Errors.OFFSET_METADATA_TOO_LARGE},
    DELETE_GROUPS: {Errors.NONE, Errors.NON_EMPTY_GROUP, Errors.GROUP_ID_NOT_FOUND},
    DESCRIBE_GROUPS: {Errors.NONE},
}


class Actor:
    """One connection playing one member: what it last learnt, and its request in flight."""

    def __init__(self, c: WireClient, group_id: str, instance_id: str | None) -> None:
        self.c = c
        self.group_id = group_id
        self.instance_id = instance_id
        self.member_id = ""
        self.generation = -1
        self.members: list[str] = []  # the last member list it got as leader
        # api key, version, correlation id and values of the request in flight
        self.in_flight: tuple[int, int, int, dict[str, Any]] | None = None


def _random_request(
    rng: random.Random, actor: Actor, others: list[str]
) -> tuple[int, int, dict[str, Any]]:
    """A request of a random group API with mostly plausible, sometimes stale, values."""
    group_id = actor.group_id
    member_id = rng.choice([actor.member_id] * 6 + [""] + others[:3])
    generation = actor.generation + rng.choice([0] * 6 + [-1, 1])
    instance_id = actor.instance_id if rng.random() < 0.9 else "instance-x"
    roll = rng.random()
    if roll < 0.3:
        protocols = rng.choice([RANGE, RANGE, (("roundrobin", b""),), (("range", b"\x01"),)])
        values = join_values(group_id, member_id, protocols=protocols, instance_id=instance_id)
        values["rebalance_timeout"] = TRAFFIC_REBALANCE_TIMEOUT_MS
        values["session_timeout"] = rng.choice([6_000, 10_000])
        return JOIN_GROUP, rng.choice([4, 5, 7, 9]), values
    if roll < 0.5:
        plan = {m: assignment(TOPIC, [i % PARTITIONS]) for i, m in enumerate(actor.members)}
        values = sync_values(group_id, generation, member_id, plan, instance_id)
        if rng.random() < 0.5:
            values.update(protocol_type="consumer", protocol_name=rng.choice(["range", "other"]))
        return SYNC_GROUP, rng.choice([3, 5]), values
    if roll < 0.75:
        values = {
            "group_id": group_id,
            "generation_id": generation,
            "member_id": member_id,
            "group_instance_id": instance_id,
        }
        return HEARTBEAT, rng.choice([3, 4]), values
    if roll < 0.82:
        return (
            LEAVE_GROUP,
            3,
            {
                "group_id": group_id,
                "members": [{"member_id": member_id, "group_instance_id": instance_id}],
            },
        )
    if roll < 0.95:
        metadata = rng.choice([None, "", "x" * rng.choice([10, 4097])])
        values = {
            "group_id": group_id,
            "generation_id_or_member_epoch": rng.choice([generation, -1]),
            "member_id": rng.choice([member_id, ""]),
            "group_instance_id": rng.choice([None, instance_id]),
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [
                        {
                            "partition_index": rng.randrange(PARTITIONS),
                            "committed_offset": rng.randrange(1000),
                            "committed_metadata": metadata,
                        }
                    ],
                }
            ],
        }
        return OFFSET_COMMIT, rng.choice([7, 8, 9]), values
    if roll < 0.98:
        return DESCRIBE_GROUPS, DESCRIBE_V, {"groups": [group_id]}
    return DELETE_GROUPS, DELETE_V, {"groups_names": [group_id]}


def _commit_to_a_missing_group(
    api_key: int, version: int, values: dict[str, Any], error: Errors
) -> bool:
    """An OffsetCommit v9+ with a generation to a group that does not exist (a DeleteGroups
    removed it while it was Empty): Kafka's ``OffsetMetadataManager.validateOffsetCommit``
    answers GROUP_ID_NOT_FOUND (older versions ILLEGAL_GENERATION, allowed above)."""
    return (
        api_key == OFFSET_COMMIT
        and version >= 9
        and error == Errors.GROUP_ID_NOT_FOUND
        and values["generation_id_or_member_epoch"] >= 0
    )


def _pending_member_claims_instance(api_key: int, values: dict[str, Any], error: Errors) -> bool:
    """A JoinGroup naming a KIP-394 pending member id with a group instance id: Kafka's
    ``classicGroupJoinExistingMember`` throws IllegalStateException (a pending member is never
    static), which its runtime answers UNKNOWN_SERVER_ERROR; kcoord does the same."""
    return (
        api_key == JOIN_GROUP
        and error == Errors.UNKNOWN_SERVER_ERROR
        and bool(values["member_id"])
        and values["group_instance_id"] is not None
    )


def _answer_errors(api_key: int, response: Any) -> list[Errors]:
    if api_key == OFFSET_COMMIT:
        return [Errors(p.error_code) for t in response.topics for p in t.partitions]
    if api_key == LEAVE_GROUP:
        return [Errors(response.error_code)] + [Errors(m.error_code) for m in response.members]
    if api_key == DESCRIBE_GROUPS:
        return [Errors(g.error_code) for g in response.groups]
    if api_key == DELETE_GROUPS:
        return [Errors(r.error_code) for r in response.results]
    return [Errors(response.error_code)]


def _learn(actor: Actor, api_key: int, response: Any) -> None:
    if api_key != JOIN_GROUP:
        return
    if response.error_code in (Errors.NONE, Errors.MEMBER_ID_REQUIRED):
        actor.member_id = response.member_id
    if response.error_code == Errors.NONE:
        actor.generation = response.generation_id
        actor.members = [m.member_id for m in response.members]
    elif response.error_code in (Errors.UNKNOWN_MEMBER_ID, Errors.FENCED_INSTANCE_ID):
        actor.member_id, actor.generation = "", -1


def test_random_group_traffic_gets_kafka_answers_and_every_request_one(
    cluster: LocalCluster,
) -> None:
    """Actors (dynamic and static members of three groups on one coordinator) send random group
    requests with stale ids and generations; every request is answered, once, with an error its
    API may give; afterwards the groups are in valid states and the log has no traceback."""

    seed = int(os.environ.get("FUZZ_SEED", random.randrange(2**32)))
    print(f"traffic seed {seed} (replay with FUZZ_SEED={seed})")
    rng = random.Random(seed)
    node_id = coordinator_id(cluster, "traffic-0")
    groups = [
        g for g in (f"traffic-{i}" for i in range(60)) if coordinator_id(cluster, g) == node_id
    ]
    groups = groups[:3]
    assert groups, "no group id hashes to the node"
    node = cluster.node(node_id)
    log_size_before = node.log_path.stat().st_size
    actors = [
        Actor(
            client(cluster, node_id),
            groups[i % len(groups)],
            f"static-{i % 2}" if i % 3 == 0 else None,
        )
        for i in range(9)
    ]
    answered: dict[int, int] = {}
    unexpected: list[str] = []

    def receive_one(actor: Actor) -> None:
        assert actor.in_flight is not None
        api_key, version, sent, values = actor.in_flight
        actor.in_flight = None
        response = receive(actor.c, api_key, version, sent)
        answered[api_key] = answered.get(api_key, 0) + 1
        for error in _answer_errors(api_key, response):
            if (
                error not in ALLOWED_ERRORS[api_key]
                and not _pending_member_claims_instance(api_key, values, error)
                and not _commit_to_a_missing_group(api_key, version, values, error)
            ):
                unexpected.append(f"api {api_key} v{version}: {error.name} {values} {response}")
        _learn(actor, api_key, response)

    try:
        end = time.monotonic() + TRAFFIC_SECONDS
        while time.monotonic() < end:
            busy = [a for a in actors if a.in_flight is not None]
            ready = readable([a.c.sock for a in busy], 0.005)
            for actor in busy:
                if actor.c.sock in ready:
                    receive_one(actor)
            idle = [a for a in actors if a.in_flight is None]
            if not idle:
                continue
            actor = rng.choice(idle)
            others = [a.member_id for a in actors if a is not actor and a.member_id]
            api_key, version, values = _random_request(rng, actor, others)
            actor.in_flight = (api_key, version, actor.c.send(api_key, version, values), values)
        # Every parked JoinGroup and SyncGroup is answered, at the latest by a timer.
        drain_end = time.monotonic() + DRAIN_DEADLINE_S
        while any(a.in_flight for a in actors) and time.monotonic() < drain_end:
            busy = [a for a in actors if a.in_flight is not None]
            ready = readable([a.c.sock for a in busy], 0.1)
            for actor in busy:
                if actor.c.sock in ready:
                    receive_one(actor)
        hanging = [
            (a.in_flight[:3], a.group_id, a.member_id, a.instance_id)
            for a in actors
            if a.in_flight is not None
        ]
        if hanging:
            with client(cluster, node_id) as c:
                states = {g: describe(c, g) for g in groups}
            pytest.fail(f"requests never answered: {hanging}; the groups: {states}")
    finally:
        for a in actors:
            a.c.close()
    print(f"answers per api key: {dict(sorted(answered.items()))}")
    assert not unexpected, "\n".join(unexpected[:20])
    assert answered.get(JOIN_GROUP, 0) > 10 and answered.get(SYNC_GROUP, 0) > 10
    with client(cluster, node_id) as c:
        for group_id in groups:
            state = describe(c, group_id).group_state
            assert state in {"Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"}
    serves(cluster, node_id)
    with open(node.log_path, "rb") as f:
        f.seek(log_size_before)
        logged = f.read().decode(errors="replace")
    assert "Traceback" not in logged, logged[logged.find("Traceback") - 2000 :][:6000]
