"""The classic group model: the state table, protocol selection, subscription parsing,
static member replacement, validation and the record round trip."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcoord.cluster.coordinator.classic import (
    VALID_PREVIOUS_STATES,
    ClassicGroup,
    ClassicGroupMember,
    ClassicGroupState,
    java_hash_map_order,
    parse_subscribed_topics,
)
from kcoord.cluster.coordinator.records import GroupMetadataValue, MemberMetadata
from kcoord.cluster.coordinator.types import JoinGroupRequestProtocol
from kcoord.errors import Errors
from tests.unit.cluster.coordinator.harness import consumer_subscription

S = ClassicGroupState


def protocols(*names: str, metadata: bytes = b"m") -> tuple[JoinGroupRequestProtocol, ...]:
    return tuple(JoinGroupRequestProtocol(name=n, metadata=metadata) for n in names)


def member(
    member_id: str,
    *names: str,
    instance_id: str | None = None,
    protocol_type: str = "consumer",
    metadata: bytes = b"m",
) -> ClassicGroupMember:
    return ClassicGroupMember(
        member_id=member_id,
        group_instance_id=instance_id,
        client_id="client",
        client_host="/h",
        rebalance_timeout_ms=30_000,
        session_timeout_ms=10_000,
        protocol_type=protocol_type,
        supported_protocols=protocols(*(names or ("range",)), metadata=metadata),
    )


def group_in(state: ClassicGroupState, *members: ClassicGroupMember) -> ClassicGroup:
    group = ClassicGroup(group_id="g", state=S.EMPTY, current_state_timestamp_ms=0)
    for m in members:
        group.add(m)
    group.state = state  # set directly: these tests are about what follows
    return group


# --------------------------------------------------------------------------------------------
# The state table


def test_state_names_are_kafkas() -> None:
    assert [str(s) for s in S] == [
        "Empty",
        "PreparingRebalance",
        "CompletingRebalance",
        "Stable",
        "Dead",
    ]


def test_valid_previous_states_are_kafkas_table() -> None:
    expected = {
        S.EMPTY: {S.PREPARING_REBALANCE},
        S.PREPARING_REBALANCE: {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY},
        S.COMPLETING_REBALANCE: {S.PREPARING_REBALANCE},
        S.STABLE: {S.COMPLETING_REBALANCE},
        S.DEAD: set(S),
    }
    assert dict(VALID_PREVIOUS_STATES) == expected


@pytest.mark.parametrize("source", list(S))
@pytest.mark.parametrize("target", list(S))
def test_every_transition_is_allowed_exactly_as_the_table_says(
    source: ClassicGroupState, target: ClassicGroupState
) -> None:
    group = ClassicGroup(group_id="g", state=source, current_state_timestamp_ms=1)
    if source in VALID_PREVIOUS_STATES[target]:
        group.transition_to(target, 42)
        assert (group.state, group.previous_state) == (target, source)
        assert group.current_state_timestamp_ms == 42
    else:
        with pytest.raises(AssertionError, match="should be in one of"):
            group.transition_to(target, 42)
        assert group.state is source
        assert group.current_state_timestamp_ms == 1


def test_transition_without_a_clock_keeps_the_timestamp() -> None:
    group = ClassicGroup(group_id="g", state=S.STABLE, current_state_timestamp_ms=7)
    group.transition_to(S.DEAD, None)
    assert (group.state, group.current_state_timestamp_ms) == (S.DEAD, 7)


def test_can_rebalance_from_empty_stable_and_completing_only() -> None:
    assert {s for s in S if ClassicGroup("g", s, 0).can_rebalance()} == {
        S.EMPTY,
        S.STABLE,
        S.COMPLETING_REBALANCE,
    }


# --------------------------------------------------------------------------------------------
# Protocol selection


def test_select_protocol_takes_the_most_votes_among_common_protocols() -> None:
    group = group_in(
        S.PREPARING_REBALANCE,
        member("a", "range", "roundrobin"),
        member("b", "roundrobin", "range", "sticky"),
        member("c", "range", "roundrobin"),
    )
    assert group.candidate_protocols() == ["range", "roundrobin"]
    assert group.select_protocol() == "range"


def test_select_protocol_never_picks_a_protocol_some_member_lacks() -> None:
    # "sticky" is everyone's favourite but c lacks it.
    group = group_in(
        S.PREPARING_REBALANCE,
        member("a", "sticky", "roundrobin"),
        member("b", "sticky", "roundrobin"),
        member("c", "roundrobin"),
    )
    assert group.select_protocol() == "roundrobin"


@pytest.mark.parametrize(
    ("first", "second", "winner"),
    [
        # String.hashCode puts "range" in bucket 9 of a 16-bucket HashMap, "cooperative-sticky"
        # in 15, "roundrobin" in 10: Kafka's first maximum is the lower bucket.
        ("range", "cooperative-sticky", "range"),
        ("roundrobin", "range", "range"),
        ("cooperative-sticky", "roundrobin", "roundrobin"),
    ],
)
def test_select_protocol_breaks_a_tie_as_kafkas_hash_map_does_whatever_the_member_order(
    first: str, second: str, winner: str
) -> None:
    for a, b in ((first, second), (second, first)):
        group = group_in(S.PREPARING_REBALANCE, member("a", a, b), member("b", b, a))
        assert group.select_protocol() == winner
        group = group_in(S.PREPARING_REBALANCE, member("b", b, a), member("a", a, b))
        assert group.select_protocol() == winner


def test_java_hash_map_order_goes_by_bucket_then_insertion() -> None:
    assert java_hash_map_order(["cooperative-sticky", "roundrobin", "range"]) == [
        "range",
        "roundrobin",
        "cooperative-sticky",
    ]
    # Two keys of one bucket keep their insertion order ("Aa" and "BB": one hashCode).
    assert java_hash_map_order(["BB", "Aa"]) == ["BB", "Aa"]
    assert java_hash_map_order(["Aa", "BB"]) == ["Aa", "BB"]
    # 13 keys outgrow the 16-bucket table (threshold 12): 32 buckets, and "a" (97) moves from
    # bucket 1 to bucket 1 of 32, "q" (113) from 1 to 17.
    keys = ["q", "a", *(f"k{i}" for i in range(11))]
    order = java_hash_map_order(keys)
    assert order.index("a") < order.index("q")
    assert java_hash_map_order(["q", "a"]) == ["q", "a"]  # both in bucket 1 of 16


def test_a_protocol_named_twice_by_a_member_counts_once() -> None:
    # Nothing refuses a JoinGroup naming "range" twice; counted twice it was no candidate at
    # all, and the vote raised at every join completion.
    group = group_in(
        S.PREPARING_REBALANCE,
        member("a", "range", "range"),
        member("b", "roundrobin", "range"),
    )
    assert group.supported_protocol_counts() == {"range": 2, "roundrobin": 1}
    assert group.select_protocol() == "range"
    assert group_in(S.PREPARING_REBALANCE, member("a", "rr", "rr")).select_protocol() == "rr"


def test_the_group_rebalance_timeout_is_the_largest_and_never_negative() -> None:
    # ClassicGroup.rebalanceTimeoutMs starts its max at 0; JoinGroup validates no timeout.
    a, b = member("a"), member("b")
    a.rebalance_timeout_ms, b.rebalance_timeout_ms = -5, -1
    assert group_in(S.STABLE, a, b).rebalance_timeout_ms() == 0
    b.rebalance_timeout_ms = 7
    assert group_in(S.STABLE, a, b).rebalance_timeout_ms() == 7
    assert group_in(S.EMPTY).rebalance_timeout_ms() == 0


def test_select_protocol_of_an_empty_group_asserts() -> None:
    with pytest.raises(AssertionError):
        group_in(S.PREPARING_REBALANCE).select_protocol()


def test_supports_protocols() -> None:
    empty = group_in(S.EMPTY)
    assert empty.supports_protocols("anything", frozenset({"p"}))
    assert not empty.supports_protocols("", frozenset({"p"}))
    assert not empty.supports_protocols("consumer", frozenset())

    group = group_in(S.STABLE, member("a", "range", "rr"), member("b", "rr"))
    assert group.supports_protocols("consumer", frozenset({"rr", "sticky"}))
    assert not group.supports_protocols("consumer", frozenset({"range"}))
    assert not group.supports_protocols("connect", frozenset({"rr"}))


def test_member_vote_follows_its_preference_order() -> None:
    m = member("a", "sticky", "range", "rr")
    assert m.vote(["rr", "range"]) == "range"
    with pytest.raises(ValueError, match="supports none"):
        m.vote(["cooperative"])


def test_matches_compares_names_metadata_and_order() -> None:
    m = member("a", "range", "rr")
    assert m.matches(protocols("range", "rr"))
    assert not m.matches(protocols("rr", "range"))
    assert not m.matches(protocols("range", "rr", metadata=b"other"))


# --------------------------------------------------------------------------------------------
# ConsumerProtocolSubscription parsing


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (consumer_subscription(["t", "u"]), frozenset({"t", "u"})),
        (consumer_subscription([]), frozenset()),
        (consumer_subscription(["t"], user_data=b"xyz"), frozenset({"t"})),
        # Version 1+: owned partitions (and more) follow; only the v0 prefix is read.
        (
            struct.pack(">hi", 1, 1)
            + struct.pack(">h", 1)
            + b"t"
            + struct.pack(">i", -1)
            + struct.pack(">i", 1)
            + struct.pack(">h", 1)
            + b"t"
            + struct.pack(">ii", 1, 0),
            frozenset({"t"}),
        ),
        # Version 3 with trailing fields Kafka's v0 reader ignores.
        (struct.pack(">hi", 3, 0) + struct.pack(">i", -1) + b"\x00" * 9, frozenset()),
        # Java's String decoding replaces invalid UTF-8 instead of failing.
        (
            struct.pack(">hi", 0, 1) + struct.pack(">h", 1) + b"\xff" + struct.pack(">i", -1),
            frozenset({"\ufffd"}),
        ),
        (b"", None),
        (b"\x00", None),
        # A negative version is read as v0 too: ConsumerProtocol.deserializeVersion does not
        # check it (a group of such members was subscribed to every topic).
        (
            struct.pack(">hi", -1, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", -1),
            frozenset({"t"}),
        ),
        (struct.pack(">hi", 0, -1) + struct.pack(">i", -1), None),  # null topics
        (struct.pack(">hi", 0, 2) + struct.pack(">h", 1) + b"t", None),  # truncated
        (struct.pack(">hi", 0, 1) + struct.pack(">h", 5) + b"t", None),  # short string
        (struct.pack(">hi", 0, 0), None),  # no user data field
        (struct.pack(">hi", 0, 0) + struct.pack(">i", 3) + b"x", None),  # short user data
        (b"s", None),
    ],
)
def test_parse_subscribed_topics(data: bytes, expected: frozenset[str] | None) -> None:
    assert parse_subscribed_topics(data) == expected


@settings(max_examples=300, derandomize=True)
@given(st.binary(max_size=64))
def test_parse_subscribed_topics_never_raises(data: bytes) -> None:
    result = parse_subscribed_topics(data)
    assert result is None or isinstance(result, frozenset)


@settings(max_examples=100, derandomize=True)
@given(st.lists(st.text(max_size=10), max_size=5), st.none() | st.binary(max_size=5))
def test_parse_subscribed_topics_round_trips(topics: list[str], user_data: bytes | None) -> None:
    assert parse_subscribed_topics(consumer_subscription(topics, user_data)) == frozenset(topics)


def test_subscribed_topics_of_a_group() -> None:
    a = member("a", metadata=consumer_subscription(["t"]))
    b = member("b", metadata=consumer_subscription(["u", "t"]))
    group = group_in(S.STABLE, a, b)
    group.protocol_name = "range"
    assert group.compute_subscribed_topics() == frozenset({"t", "u"})

    # One unparseable member: unknown, which a consumer group reads as "everything".
    group.add(member("c", metadata=b"garbage"))
    group.subscribed_topics = group.compute_subscribed_topics()
    assert group.subscribed_topics is None
    assert group.is_subscribed_to_topic("anything")

    other = group_in(S.STABLE, member("w", protocol_type="connect"))
    other.protocol_name = "range"
    assert other.compute_subscribed_topics() is None
    assert not other.is_subscribed_to_topic("t")

    empty_consumer = group_in(S.EMPTY)
    empty_consumer.protocol_type = "consumer"
    assert empty_consumer.compute_subscribed_topics() == frozenset()


# --------------------------------------------------------------------------------------------
# Membership


def test_first_member_sets_the_protocol_type_and_leads_and_leadership_passes_on() -> None:
    group = group_in(S.EMPTY, member("a"), member("b"), member("c"))
    assert (group.protocol_type, group.leader_id) == ("consumer", "a")
    group.remove("b")
    assert group.leader_id == "a"
    group.remove("a")
    assert group.leader_id == "c"
    group.remove("c")
    assert group.leader_id is None


def test_add_refuses_a_second_member_for_the_same_instance() -> None:
    group = group_in(S.EMPTY, member("a", instance_id="i"))
    with pytest.raises(AssertionError, match="static member"):
        group.add(member("b", instance_id="i"))


def test_replace_static_member_keeps_everything_but_the_id() -> None:
    old = member("i-1", "range", instance_id="i")
    old.assignment = b"A"
    group = group_in(S.STABLE, old, member("b"))
    group.pending_sync_members["i-1"] = None
    new = group.replace_static_member("i", "i-1", "i-2")
    assert list(group.members) == ["b", "i-2"]
    assert group.static_member_id("i") == "i-2"
    assert group.leader_id == "i-2"
    assert (new.assignment, new.supported_protocols, new.client_id) == (
        b"A",
        old.supported_protocols,
        "client",
    )
    assert list(group.pending_sync_members) == ["i-2"]
    assert group.validate_member("i-1", "i") is Errors.FENCED_INSTANCE_ID
    assert group.validate_member("i-2", "i") is Errors.NONE


def test_validate_member() -> None:
    group = group_in(S.STABLE, member("a"), member("s-1", instance_id="s"))
    assert group.validate_member("a", None) is Errors.NONE
    assert group.validate_member("x", None) is Errors.UNKNOWN_MEMBER_ID
    assert group.validate_member("a", "unknown-instance") is Errors.UNKNOWN_MEMBER_ID
    assert group.validate_member("a", "s") is Errors.FENCED_INSTANCE_ID
    assert group.validate_member("s-1", "s") is Errors.NONE


def test_has_all_members_joined_counts_pending_members() -> None:
    group = group_in(S.PREPARING_REBALANCE)
    group.add(member("a"), awaiting_join=1)
    assert group.has_all_members_joined()
    group.add_pending_member("p")
    assert not group.has_all_members_joined()
    group.remove("p")
    assert group.has_all_members_joined()


def test_maybe_elect_new_joined_leader() -> None:
    group = group_in(S.PREPARING_REBALANCE, member("a"), member("b"), member("c"))
    assert not group.maybe_elect_new_joined_leader()  # nobody rejoined
    group.members["c"].awaiting_join = 7
    assert group.maybe_elect_new_joined_leader()
    assert group.leader_id == "c"
    group.members["a"].awaiting_join = 8
    assert group.maybe_elect_new_joined_leader()
    assert group.leader_id == "c"  # a rejoined leader keeps leading


def test_has_satisfied_heartbeat() -> None:
    m = member("a")
    assert not m.has_satisfied_heartbeat()
    m.awaiting_join = 1
    assert m.has_satisfied_heartbeat()
    m.is_new = True
    assert not m.has_satisfied_heartbeat()  # KAFKA-7610
    m.is_new, m.awaiting_join, m.awaiting_sync = False, None, 2
    assert m.has_satisfied_heartbeat()


# --------------------------------------------------------------------------------------------
# Commit, delete and offset-delete validation


@pytest.mark.parametrize(
    ("state", "member_id", "instance_id", "generation", "expected"),
    [
        (S.EMPTY, "", None, -1, Errors.NONE),  # simple consumer / admin
        (S.EMPTY, "a", None, 1, Errors.UNKNOWN_MEMBER_ID),
        (S.STABLE, "", None, -1, Errors.UNKNOWN_MEMBER_ID),
        (S.STABLE, "a", None, 3, Errors.NONE),
        (S.STABLE, "a", None, 2, Errors.ILLEGAL_GENERATION),
        (S.STABLE, "a", None, -1, Errors.ILLEGAL_GENERATION),
        (S.STABLE, "x", None, 3, Errors.UNKNOWN_MEMBER_ID),
        (S.STABLE, "a", "s", 3, Errors.FENCED_INSTANCE_ID),
        (S.PREPARING_REBALANCE, "a", None, 3, Errors.NONE),
        (S.COMPLETING_REBALANCE, "a", None, 3, Errors.REBALANCE_IN_PROGRESS),
        (S.COMPLETING_REBALANCE, "a", None, 2, Errors.ILLEGAL_GENERATION),
        (S.DEAD, "a", None, 3, Errors.COORDINATOR_NOT_AVAILABLE),
    ],
)
def test_validate_offset_commit(
    state: ClassicGroupState,
    member_id: str,
    instance_id: str | None,
    generation: int,
    expected: Errors,
) -> None:
    members = [] if state is S.EMPTY else [member("a"), member("s-1", instance_id="s")]
    group = group_in(state, *members)
    group.generation_id = 3
    assert group.validate_offset_commit(member_id, instance_id, generation) is expected


@pytest.mark.parametrize(
    ("state", "protocol_type", "delete", "offset_delete"),
    [
        (S.EMPTY, None, Errors.NONE, Errors.NONE),
        (S.STABLE, "consumer", Errors.NON_EMPTY_GROUP, Errors.NONE),
        (S.PREPARING_REBALANCE, "connect", Errors.NON_EMPTY_GROUP, Errors.NON_EMPTY_GROUP),
        (S.COMPLETING_REBALANCE, "consumer", Errors.NON_EMPTY_GROUP, Errors.NONE),
        (S.DEAD, "consumer", Errors.GROUP_ID_NOT_FOUND, Errors.GROUP_ID_NOT_FOUND),
    ],
)
def test_validate_delete_and_offset_delete(
    state: ClassicGroupState, protocol_type: str | None, delete: Errors, offset_delete: Errors
) -> None:
    group = ClassicGroup(group_id="g", state=state, current_state_timestamp_ms=0)
    group.protocol_type = protocol_type
    assert group.validate_delete_group() is delete
    assert group.validate_offset_delete() is offset_delete


def test_offset_expiration_base() -> None:
    simple = ClassicGroup(group_id="s", state=S.EMPTY, current_state_timestamp_ms=None)
    base = simple.offset_expiration_base()
    assert base is not None and base(123) == 123  # by commit time

    empty = ClassicGroup(group_id="e", state=S.EMPTY, current_state_timestamp_ms=500)
    empty.protocol_type = "consumer"
    base = empty.offset_expiration_base()
    assert base is not None and base(123) == 500  # since it became Empty

    empty.current_state_timestamp_ms = None  # a record without a state timestamp
    base = empty.offset_expiration_base()
    assert base is not None and base(123) == 123

    stable = group_in(S.STABLE, member("a", metadata=consumer_subscription(["t"])))
    stable.protocol_name = "range"
    stable.subscribed_topics = stable.compute_subscribed_topics()
    base = stable.offset_expiration_base()
    assert base is not None and base(123) == 123

    stable.subscribed_topics = None  # unknown subscriptions: nothing expires
    assert stable.offset_expiration_base() is None
    # KAFKA-13636: a rebalancing group's subscriptions are in flux, so nothing expires even
    # when they are known (a test without them passed with the Stable check removed).
    for state in (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE):
        rebalancing = group_in(state, member("a", metadata=consumer_subscription(["t"])))
        rebalancing.protocol_name = "range"
        rebalancing.subscribed_topics = rebalancing.compute_subscribed_topics()
        assert rebalancing.subscribed_topics == frozenset({"t"})
        assert rebalancing.offset_expiration_base() is None, state


# --------------------------------------------------------------------------------------------
# Records


def test_group_record_round_trip() -> None:
    a = member("a", "range", "rr", metadata=b"sub-a")
    a.assignment = b"A"
    s = member("s-1", "range", "rr", instance_id="s", metadata=b"sub-s")
    s.assignment = b"S"
    group = group_in(S.STABLE, a, s)
    group.generation_id, group.protocol_name = 4, "range"
    value = group.to_group_metadata_value({"a": b"A", "s-1": b"S"})
    assert value == GroupMetadataValue(
        protocol_type="consumer",
        generation=4,
        protocol="range",
        leader="a",
        current_state_timestamp_ms=0,
        members=(
            MemberMetadata(
                member_id="a",
                client_id="client",
                client_host="/h",
                rebalance_timeout_ms=30_000,
                session_timeout_ms=10_000,
                subscription=b"sub-a",
                assignment=b"A",
            ),
            MemberMetadata(
                member_id="s-1",
                group_instance_id="s",
                client_id="client",
                client_host="/h",
                rebalance_timeout_ms=30_000,
                session_timeout_ms=10_000,
                subscription=b"sub-s",
                assignment=b"S",
            ),
        ),
    )
    loaded = ClassicGroup.from_group_metadata_value("g", value)
    assert loaded.state is S.STABLE
    assert (loaded.generation_id, loaded.protocol_type, loaded.protocol_name, loaded.leader_id) == (
        4,
        "consumer",
        "range",
        "a",
    )
    assert loaded.static_member_id("s") == "s-1"
    assert loaded.committed == value
    assert loaded.to_group_metadata_value({"a": b"A", "s-1": b"S"}) == value


def test_loading_tolerates_odd_records() -> None:
    # v0-style member without a rebalance timeout (-1), no leader, a repeated instance id.
    value = GroupMetadataValue(
        protocol_type="consumer",
        generation=2,
        protocol="range",
        leader=None,
        current_state_timestamp_ms=-1,
        members=tuple(
            MemberMetadata(
                member_id=m,
                group_instance_id="i",
                client_id="c",
                client_host="h",
                rebalance_timeout_ms=-1,
                session_timeout_ms=9_000,
                subscription=b"garbage",
                assignment=b"",
            )
            for m in ("x", "y")
        ),
    )
    group = ClassicGroup.from_group_metadata_value("g", value)
    assert group.leader_id == "x"
    assert group.static_member_id("i") == "y"
    assert group.members["x"].rebalance_timeout_ms == 9_000
    # A v1+ record's 0 is a rebalance timeout of 0, not a missing one
    # (GroupMetadataManager.replay replaces only -1).
    zero = replace(value, members=(replace(value.members[0], rebalance_timeout_ms=0),))
    assert ClassicGroup.from_group_metadata_value("z", zero).members["x"].rebalance_timeout_ms == 0
    assert group.current_state_timestamp_ms is None
    assert group.subscribed_topics is None

    empty = ClassicGroup.from_group_metadata_value(
        "e", GroupMetadataValue(protocol_type="", generation=0, protocol=None, leader=None)
    )
    assert (empty.state, empty.protocol_type, empty.generation_id) == (S.EMPTY, None, 0)
