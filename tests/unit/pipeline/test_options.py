"""The ``kcoord`` source's options and offset planning (pure): Spark's Kafka source's rules,
JSON offsets, data loss, maxOffsetsPerTrigger shares and one range per partition."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcoord.pipeline.options import (
    EARLIEST,
    LATEST,
    DataLossError,
    OffsetRange,
    OptionError,
    Subscription,
    check_data_loss,
    from_json_offsets,
    parse_source_options,
    plan_ranges,
    raise_if_unknown_partitions,
    rate_limit,
    resolve,
    to_json_offsets,
)

BOOTSTRAP = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def opts(**kv: str) -> dict[str, str]:
    return {**BOOTSTRAP, **kv}


def test_defaults_follow_spark() -> None:
    batch = parse_source_options(opts(subscribe="a, b"), streaming=False)
    assert batch.subscription == Subscription("subscribe", topics=("a", "b"))
    assert (batch.starting.kind, batch.ending.kind) == ("earliest", "latest")
    assert batch.fail_on_data_loss is True
    assert batch.group_id is None
    stream = parse_source_options(opts(subscribe="a", groupId="g"), streaming=True)
    assert stream.starting.kind == "latest"
    assert stream.group_id == "g"
    # Spark's includeHeaders: no headers column unless asked for (it was always there, and a
    # job ported from Spark got an eighth column, which broke a union or an insert by
    # position).
    assert batch.include_headers is False
    assert parse_source_options(opts(subscribe="a", includeHeaders="TRUE"), streaming=True
                                ).include_headers is True  # fmt: skip


def test_option_names_are_case_insensitive_and_kafka_options_pass_through() -> None:
    parsed = parse_source_options(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "h:1",
            "Subscribe": "t",
            "startingoffsets": "earliest",
            "kafka.fetch.max.bytes": "1000",
        },
        streaming=True,
    )
    assert parsed.bootstrap_servers == "h:1"
    assert parsed.starting.kind == "earliest"
    assert parsed.client_config == (("fetch.max.bytes", "1000"),)


@pytest.mark.parametrize(
    ("options", "streaming", "names"),
    [
        ({"subscribe": "t"}, True, "kafka.bootstrap.servers"),
        (opts(), True, "exactly one of"),
        (opts(subscribe="t", assign='{"t": [0]}'), True, "exactly one of"),
        (opts(subscribe=" , "), True, "names no topic"),
        (opts(subscribePattern="("), True, "subscribePattern"),
        (opts(assign="[0]"), True, "assign"),
        (opts(assign='{"t": [-1]}'), True, "assign"),
        (opts(subscribe="t", startingOffsets="newest"), True, "startingOffsets"),
        (opts(subscribe="t", startingOffsets='{"t": {"x": 1}}'), True, "startingOffsets"),
        (opts(subscribe="t", startingOffsets='{"t": {"0": -3}}'), True, "startingOffsets"),
        (opts(subscribe="t", endingOffsets="latest"), True, "batch queries only"),
        (opts(subscribe="t", startingOffsets="latest"), False, "cannot be 'latest'"),
        (opts(subscribe="t", startingOffsets='{"t": {"0": -1}}'), False, "-1"),
        (opts(subscribe="t", endingOffsets="earliest"), False, "cannot be 'earliest'"),
        (opts(subscribe="t", endingOffsets='{"t": {"0": -2}}'), False, "-2"),
        (opts(subscribe="t", maxOffsetsPerTrigger="10"), False, "streaming queries only"),
        (opts(subscribe="t", maxOffsetsPerTrigger="0"), True, "positive"),
        (opts(subscribe="t", failOnDataLoss="yes"), True, "failOnDataLoss"),
        (opts(subscribe="t", includeHeaders="1"), False, "includeHeaders"),
        (opts(subscribe="t", **{"kafka.group.id": "g"}), True, "kafka.group.id"),
        (opts(subscribe="t", **{"kafka.auto.offset.reset": "x"}), True, "auto.offset.reset"),
    ],
)
def test_refusals_name_the_option(options: dict[str, str], streaming: bool, names: str) -> None:
    with pytest.raises(OptionError, match=names.replace(".", r"\.").replace("(", r"\(")):
        parse_source_options(options, streaming=streaming)


def test_subscriptions_select_partitions() -> None:
    counts = {"orders": 2, "orders-dlq": 1, "payments": 3}
    assert Subscription("subscribe", topics=("orders", "gone")).select(counts) == [
        ("orders", 0),
        ("orders", 1),
    ]
    pattern = parse_source_options(opts(subscribePattern="orders.*"), streaming=True).subscription
    assert pattern.select(counts) == [("orders", 0), ("orders", 1), ("orders-dlq", 0)]
    assign = parse_source_options(opts(assign='{"payments": [2, 0]}'), streaming=True)
    assert assign.subscription.select(counts) == [("payments", 0), ("payments", 2)]
    assert assign.subscription.explicit_topics() == ("payments",)


def test_resolve_sentinels_and_missing_partitions() -> None:
    parts = [("t", 0), ("t", 1), ("t", 2)]
    earliest = {("t", 0): 5, ("t", 1): 0, ("t", 2): 3}
    latest = {("t", 0): 50, ("t", 1): 40, ("t", 2): 30}
    spec = parse_source_options(
        opts(subscribe="t", startingOffsets='{"t": {"0": -1, "1": 17}}'), streaming=True
    ).starting
    # Partition 2 is not named: it starts at its earliest offset, as in Spark.
    assert resolve(spec, parts, earliest, latest) == {("t", 0): 50, ("t", 1): 17, ("t", 2): 3}
    assert resolve(spec, parts, earliest, latest, unnamed=LATEST)[("t", 2)] == 30
    latest_spec = parse_source_options(opts(subscribe="t"), streaming=True).starting
    assert resolve(latest_spec, parts, earliest, latest) == latest
    with pytest.raises(OptionError, match="u-0"):
        raise_if_unknown_partitions(
            "startingOffsets",
            parse_source_options(
                opts(subscribe="t", startingOffsets='{"u": {"0": 1}}'), streaming=True
            ).starting,
            parts,
        )


def test_data_loss_fails_or_moves_past_the_loss() -> None:
    """Records gone below the log start: on from the log start. A log end below the start:
    on from the log end, as Spark goes on (not from the log start, which read a truncated
    log's records again)."""
    earliest = {("t", 0): 10, ("t", 1): 0}
    latest = {("t", 0): 20, ("t", 1): 5}
    start = {("t", 0): 4, ("t", 1): 9, ("t", 2): 1}
    with pytest.raises(DataLossError, match=r"t-0: offsets 4\.\.9 are gone"):
        check_data_loss(start, list(earliest), earliest, latest, fail_on_data_loss=True)
    adjusted, lost = check_data_loss(
        start, list(earliest), earliest, latest, fail_on_data_loss=False
    )
    assert adjusted == {("t", 0): 10, ("t", 1): 5}
    assert len(lost) == 3
    assert "t-2 is gone" in lost[2]
    fine = {("t", 0): 10, ("t", 1): 5}
    assert check_data_loss(fine, list(earliest), earliest, latest, fail_on_data_loss=True) == (
        fine,
        [],
    )


def test_rate_limit_shares_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 7}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 7, ("t", 3): 4}
    end = rate_limit(start, latest, 40)
    # Backlogs 300 and 100: 30 and 10; a partition the start does not know yet stays put
    # until it is in the start (its range begins there).
    assert end == {("t", 0): 30, ("t", 1): 110, ("t", 2): 7, ("t", 3): 4}
    assert rate_limit(start, latest, 10_000) == {**latest}


@given(
    st.dictionaries(
        st.integers(0, 5), st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1
    ),
    st.integers(1, 3000),
)
def test_rate_limit_moves_exactly_the_limit(
    spec: dict[int, tuple[int, int]], max_offsets: int
) -> None:
    start = {("t", p): a for p, (a, _) in spec.items()}
    latest = {("t", p): a + lag for p, (a, lag) in spec.items()}
    end = rate_limit(start, latest, max_offsets)
    moved = sum(end[tp] - start[tp] for tp in start)
    assert moved == min(max_offsets, sum(latest[tp] - start[tp] for tp in start))
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)


def test_plan_ranges_one_per_partition_with_records() -> None:
    start = {("a", 0): 5, ("a", 1): 9, ("b", 0): 0}
    end = {("a", 0): 8, ("a", 1): 9, ("b", 0): 2, ("b", 1): 3}
    assert plan_ranges(start, end) == [
        OffsetRange("a", 0, 5, 8),
        OffsetRange("b", 0, 0, 2),
        OffsetRange("b", 1, 0, 3),
    ]


def test_json_offsets_round_trip_in_sparks_form() -> None:
    offsets = {("t", 0): 3, ("t", 10): 4, ("u", 1): EARLIEST + 2}
    as_json = to_json_offsets(offsets)
    assert json.dumps(as_json, sort_keys=True) == '{"t": {"0": 3, "10": 4}, "u": {"1": 0}}'
    assert from_json_offsets(as_json) == offsets
    assert LATEST == -1


def test_json_offsets_must_name_every_partition_read() -> None:
    """Spark's fetchSpecificOffsets: "you must specify all TopicPartitions" (-2 earliest,
    -1 latest); a partition left out was read from its earliest offset here."""
    parts = [("t", 0), ("t", 1)]
    partial = parse_source_options(
        opts(subscribe="t", startingOffsets='{"t": {"0": 5}}'), streaming=True
    ).starting
    with pytest.raises(OptionError, match=r"must name every partition.*t-1"):
        raise_if_unknown_partitions("startingOffsets", partial, parts)
    whole = parse_source_options(
        opts(subscribe="t", startingOffsets='{"t": {"0": 5, "1": -2}}'), streaming=True
    ).starting
    raise_if_unknown_partitions("startingOffsets", whole, parts)
    latest = parse_source_options(opts(subscribe="t"), streaming=True).starting
    raise_if_unknown_partitions("startingOffsets", latest, parts)


@pytest.mark.parametrize(
    "name",
    ["startingOffsetsByTimestamp", "startingTimestamp", "endingTimestamp", "STARTINGTIMESTAMP"],
)
def test_timestamp_options_are_refused_not_ignored(name: str) -> None:
    """Ignored, a job asking to start at a time started at latest, skipping the backlog."""
    with pytest.raises(OptionError, match="not supported"):
        parse_source_options(opts(subscribe="t", **{name: "1700000000000"}), streaming=True)
    parse_source_options(opts(subscribe="t", minPartitions="8"), streaming=True)  # a hint


def test_a_pattern_leaves_kafkas_internal_topics_out() -> None:
    """Spark lists a pattern's topics with the admin client, which leaves internal topics
    out: ``.*`` read ``__consumer_offsets`` too. Named outright, it is read."""
    counts = {"t": 1, "__consumer_offsets": 2, "__transaction_state": 1, "__mine": 1}
    pattern = parse_source_options(
        {"kafka.bootstrap.servers": "h:1", "subscribePattern": ".*"}, streaming=False
    )
    assert pattern.subscription.select(counts) == [("__mine", 0), ("t", 0)]
    named = parse_source_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "__consumer_offsets"}, streaming=False
    )
    assert named.subscription.select(counts) == [
        ("__consumer_offsets", 0),
        ("__consumer_offsets", 1),
    ]
