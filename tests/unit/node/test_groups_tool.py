"""``kcoord groups``: assignment decoding, the rows and columns of each view, reset-offsets'
arithmetic and the argument parsing, without a cluster (the live checks are in
tests/integration/test_operator_cli.py)."""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

from kcoord.cluster.coordinator.wire import WireFormatError
from kcoord.errors import Errors
from kcoord.node.cli import build_parser
from kcoord.node.config import Endpoint
from kcoord.node.groups_tool import (
    Committed,
    Group,
    Member,
    OffsetRow,
    assignment_string,
    clamp_offset,
    decode_assignment,
    describe_group,
    format_list_with_state,
    format_members,
    format_offset_deletion,
    format_offsets,
    format_reset,
    format_reset_csv,
    format_state,
    offset_deletion_message,
    offset_rows,
    parse_datetime_ms,
    parse_duration_ms,
    parse_reset_plan,
    parse_states,
    parse_topic_arg,
    plan_reset,
)
from kcoord.node.tool_client import (
    API_VERSIONS,
    CONSUMER_GROUP_DESCRIBE,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    Broker,
    ToolError,
    TopicPartition,
)
from tests.unit.node.test_tool_client import Answer, ScriptedClient, coordinator

TP = TopicPartition
COORDINATOR = Broker(2, "127.0.0.1", 9102)


def member(member_id: str, *assignment: TopicPartition, instance: str | None = None) -> Member:
    return Member(member_id, instance, f"client-{member_id}", "/127.0.0.1", tuple(assignment))


def group(*members: Member, state: str = "Stable", group_id: str = "orders-app") -> Group:
    return Group(group_id, state, "consumer", "range", members, COORDINATOR)


# -- ConsumerProtocolAssignment ----------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_decodes_the_assignment_bytes_kafka_python_sends(version: int) -> None:
    data = ConsumerProtocolAssignment(
        version, [("orders", [0, 2]), ("audit", [1])], b"user data"
    ).encode(version=version)
    assert decode_assignment(data) == (TP("orders", 0), TP("orders", 2), TP("audit", 1))


def test_a_newer_assignment_version_is_read_as_the_newest_known() -> None:
    v0 = ConsumerProtocolAssignment(0, [("orders", [1])], None).encode(version=0)
    newer = struct.pack(">h", 7) + v0[2:] + b"fields of a future version"
    assert decode_assignment(newer) == (TP("orders", 1),)


def test_no_assignment_bytes_is_no_assignment() -> None:
    assert decode_assignment(b"") == ()


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff",  # version -1
        b"\x00\x00\x00\x00\x00\x01\x00\x06ord",  # truncated topic name
        b"\x00\x00\x7f\xff\xff\xff",  # 2^31 - 1 topics in 6 bytes
        b"\x00\x00\x00\x00\x00\x00",  # no user data field
    ],
)
def test_malformed_assignment_bytes_raise(data: bytes) -> None:
    with pytest.raises(WireFormatError):
        decode_assignment(data)


def test_assignment_column_groups_partitions_by_topic() -> None:
    assert assignment_string([TP("b", 2), TP("a", 1), TP("b", 0)]) == "a(1), b(0,2)"
    assert assignment_string([]) == "-"


# -- the offsets view --------------------------------------------------------------------------


def test_offset_rows_members_with_most_partitions_first_then_unassigned_commits() -> None:
    g = group(
        member("m-small", TP("orders", 2)),
        member("m-big", TP("orders", 1), TP("orders", 0)),
        member("m-idle"),
    )
    committed = {
        TP("orders", 0): Committed(3, 5),
        TP("orders", 2): Committed(4, -1),
        TP("old", 0): Committed(7, -1),
    }
    log_end = {TP("orders", 0): 10, TP("orders", 1): 20, TP("old", 0): 7}
    rows = offset_rows(g, committed, log_end)
    assert [(r.topic, r.partition, r.consumer_id) for r in rows] == [
        ("orders", 0, "m-big"),
        ("orders", 1, "m-big"),
        ("orders", 2, "m-small"),
        ("old", 0, None),
    ]
    # LAG needs both ends: no commit (orders-1) or no log end (orders-2, no leader) gives "-".
    assert [r.lag for r in rows] == [7, None, None, 0]


def test_offsets_table_has_kafkas_columns_and_widths() -> None:
    rows = [
        OffsetRow("g", "orders", 0, Committed(3, 5), 10, "c-1", "/10.0.0.1", "app"),
        OffsetRow("g", "orders", 1, None, None, None, None, None),
    ]
    assert format_offsets(rows) == [
        "GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG"
        "             CONSUMER-ID     HOST            CLIENT-ID",
        "g               orders          0          3               10              7"
        "               c-1             /10.0.0.1       app",
        "g               orders          1          -               -               -"
        "               -               -               -",
    ]
    assert format_offsets(rows, verbose=True)[:2] == [
        "GROUP           TOPIC           PARTITION  LEADER-EPOCH    CURRENT-OFFSET  LOG-END-OFFSET"
        "  LAG             CONSUMER-ID     HOST            CLIENT-ID",
        "g               orders          0          5               3               10"
        "              7               c-1             /10.0.0.1       app",
    ]


def test_long_values_widen_their_column() -> None:
    long_id = "consumer-orders-app-1-5f6c8d0e-3b7a-4d8e-9f10-2a3b4c5d6e7f"
    rows = [OffsetRow("a-rather-long-group-name", "t", 0, None, 0, long_id, "/h", "c")]
    header, row = format_offsets(rows)
    assert header.index("TOPIC") == len("a-rather-long-group-name") + 1
    assert header.index("HOST") == row.index("/h") == row.index(long_id) + len(long_id) + 1


# -- members, state, list, reset ---------------------------------------------------------------


def test_members_table_and_verbose_assignment() -> None:
    g = group(member("m-1", TP("orders", 1), TP("orders", 0)), member("m-2"))
    assert format_members(g) == [
        "GROUP           CONSUMER-ID     HOST            CLIENT-ID       #PARTITIONS",
        "orders-app      m-1             /127.0.0.1      client-m-1      2",
        "orders-app      m-2             /127.0.0.1      client-m-2      0",
    ]
    head = "GROUP           CONSUMER-ID     HOST            CLIENT-ID       "
    row = "orders-app      m-{}             /127.0.0.1      client-m-{}      "
    assert format_members(g, verbose=True) == [
        head + f"{'#PARTITIONS':<15} ASSIGNMENT",
        row.format(1, 1) + f"{'2':<15} orders(0,1)",
        row.format(2, 2) + f"{'0':<15} -",
    ]


def test_members_table_shows_group_instance_ids_when_any_member_has_one() -> None:
    g = group(member("m-1", instance="node-a"), member("m-2"))
    header, first, second = format_members(g)
    assert header.split() == [
        "GROUP",
        "CONSUMER-ID",
        "GROUP-INSTANCE-ID",
        "HOST",
        "CLIENT-ID",
        "#PARTITIONS",
    ]
    assert first.split()[2] == "node-a"
    assert second.index("/127.0.0.1") == header.index("HOST")


def test_state_table() -> None:
    assert format_state(group(member("m-1"))) == [
        "GROUP           COORDINATOR (ID)          ASSIGNMENT-STRATEGY  STATE"
        "                #MEMBERS",
        "orders-app      127.0.0.1:9102  (2)       range                Stable               1",
    ]
    empty = Group("g", "Empty", "consumer", "", (), COORDINATOR)
    assert format_state(empty)[1].split() == ["g", "127.0.0.1:9102", "(2)", "-", "Empty", "0"]


def test_list_with_state_and_reset_tables() -> None:
    assert format_list_with_state([("a", "Stable"), ("bb", "Empty")]) == [
        "GROUP                     STATE",
        "a                         Stable",
        "bb                        Empty",
    ]
    plans = {"g2": {TP("t", 1): 5, TP("t", 0): 3}, "g1": {TP("t", 0): 0}}
    assert format_reset(plans) == [
        "GROUP           TOPIC           PARTITION  NEW-OFFSET",
        "g1              t               0          0",
        "g2              t               0          3",
        "g2              t               1          5",
    ]


def test_offset_deletion_table_and_messages() -> None:
    results = {
        TP("orders", 1): Errors.NONE,
        TP("missing", -1): Errors.UNKNOWN_TOPIC_OR_PARTITION,
        TP("orders", 0): Errors.GROUP_SUBSCRIBED_TO_TOPIC,
    }
    assert format_offset_deletion(results) == [
        "TOPIC                          PARTITION       STATUS",
        "missing                        Not Provided    Error: UNKNOWN_TOPIC_OR_PARTITION",
        "orders                         0               Error: GROUP_SUBSCRIBED_TO_TOPIC",
        "orders                         1               Successful",
    ]
    long_name = "t" * 40
    assert format_offset_deletion({TP(long_name, 0): Errors.NONE})[1] == (
        f"{long_name} 0               Successful"
    )
    assert offset_deletion_message("g", ["a", "b:1"], Errors.NONE) == (
        "Request succeed for deleting offsets with topic a, b:1 group g"
    )
    assert offset_deletion_message("g", ["a"], Errors.NON_EMPTY_GROUP) == (
        "Error: Deleting offsets of a consumer group 'g' is forbidden if the group is not empty."
    )
    assert offset_deletion_message("g", ["a"], Errors.GROUP_SUBSCRIBED_TO_TOPIC) == (
        "Error: Encounter some partition level error, see the follow-up details:"
    )
    assert offset_deletion_message("g", ["a"], Errors.COORDINATOR_NOT_AVAILABLE) == (
        "Error: Encounter some unknown error: COORDINATOR_NOT_AVAILABLE"
    )


# -- reset-offsets arithmetic and arguments ----------------------------------------------------


def test_clamp_to_the_log_start_and_end() -> None:
    assert clamp_offset(15, 0, 10) == 10
    assert clamp_offset(-3, 2, 10) == 2
    assert clamp_offset(4, 2, 10) == 4


@pytest.mark.parametrize("scenario", [["--to-offset", "1000000000000"], ["--shift-by", "-9"]])
def test_a_reset_to_a_partition_whose_range_is_unknown_fails(scenario: list[str]) -> None:
    """A partition leaderless while its log start and end were asked for had no range, and the
    requested offset went through unclamped (10^12, or negative); Kafka's listOffsets fails."""
    args = build_parser().parse_args(
        ["groups", "reset-offsets", "--group", "g", "--topic", "t", *scenario, "--execute"]
    )
    tp = TopicPartition("t", 0)
    leaderless = SimpleNamespace(list_offsets=lambda partitions, timestamp: {})
    committed = {tp: Committed(5, -1)}
    with pytest.raises(ToolError, match="offset of topic partition"):
        plan_reset(leaderless, args, [tp], committed)  # type: ignore[arg-type]


def test_datetimes_with_a_zone_and_without_one_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_datetime_ms("2023-11-14T22:13:25Z") == 1_700_000_005_000
    assert parse_datetime_ms("2023-11-14T23:13:25.250+01:00") == 1_700_000_005_250
    # Utils.getDateTime appends "Z" to a time without a zone, whatever the host's zone.
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert parse_datetime_ms("2023-11-14T22:13:25") == 1_700_000_005_000
    finally:
        monkeypatch.undo()
        time.tzset()
    with pytest.raises(ToolError, match="ISO 8601"):
        parse_datetime_ms("yesterday")
    # Without the T, as Utils.getDateTime refuses it: read as midnight, or as written.
    for no_t in ("2023-11-14", "2023-11-14 22:13:25"):
        with pytest.raises(ToolError, match="does not contain a 'T'"):
            parse_datetime_ms(no_t)


def test_durations_as_javas_duration_parse_reads_them() -> None:
    assert parse_duration_ms("PT1H") == 3_600_000
    assert parse_duration_ms("P1DT12H30M") == 86_400_000 + 12 * 3_600_000 + 30 * 60_000
    assert parse_duration_ms("pt0.25s") == 250
    assert parse_duration_ms("PT-1.5S") == -1500
    assert parse_duration_ms("-PT2M") == -120_000
    for bad in ("P", "PT", "1H", "P1H", "PT1D", "P1Y", "yesterday", ""):
        with pytest.raises(ToolError, match="ISO 8601 duration"):
            parse_duration_ms(bad)


def test_reset_plans_from_a_file_with_and_without_the_group_column() -> None:
    one = "orders,0,5\norders,1,7\n\n"
    assert parse_reset_plan(one, "g") == {"g": {TP("orders", 0): 5, TP("orders", 1): 7}}
    many = "g,orders,0,5\nh,orders,2,1\n"
    assert parse_reset_plan(many, None) == {"g": {TP("orders", 0): 5}, "h": {TP("orders", 2): 1}}
    # One group named, but the file has the group column: it is read with it.
    assert parse_reset_plan(many, "g") == parse_reset_plan(many, None)
    for bad, single in (("orders,x,5", "g"), ("orders,0,5", None), ("g,,0,5", None)):
        with pytest.raises(ToolError, match="invalid reset plan line 1"):
            parse_reset_plan(bad, single)
    # What --export writes, --from-file reads.
    plans = {"g": {TP("orders", 1): 7, TP("orders", 0): 5}}
    assert format_reset_csv(plans, single_group=True) == ["orders,0,5", "orders,1,7"]
    exported = "\n".join(format_reset_csv(plans, single_group=False))
    assert exported == "g,orders,0,5\ng,orders,1,7"
    assert parse_reset_plan(exported, None) == plans
    # A group id may hold a comma or a quote (Kafka puts no limit on its characters): the
    # exported row quotes it, as Jackson's CSV does, and reads back; unquoted, the row had
    # five fields and --from-file refused it.
    odd = {'a,b "c"': {TP("orders", 0): 5}}
    exported = "\n".join(format_reset_csv(odd, single_group=False))
    assert exported == '"a,b ""c""",orders,0,5'
    assert parse_reset_plan(exported, None) == odd


def test_to_current_keeps_committed_offsets_and_gives_the_others_the_log_end() -> None:
    args = build_parser().parse_args(
        ["groups", "reset-offsets", "--group", "g", "--topic", "t", "--to-current"]
    )
    asked: list[tuple[list[TopicPartition], int]] = []

    def list_offsets(partitions: list[TopicPartition], timestamp: int) -> dict[Any, int]:
        asked.append((list(partitions), timestamp))
        return dict.fromkeys(partitions, 42)

    client = SimpleNamespace(list_offsets=list_offsets)
    a, b = TP("t", 0), TP("t", 1)
    plan = plan_reset(client, args, [a, b], {a: Committed(5, -1)})  # type: ignore[arg-type]
    assert plan == {a: 5, b: 42}
    assert asked == [([b], -1)]


def test_topic_arguments() -> None:
    assert parse_topic_arg("orders") == ("orders", None)
    assert parse_topic_arg("orders:0,2") == ("orders", [0, 2])
    with pytest.raises(ToolError, match="Invalid partition 'x'"):
        parse_topic_arg("orders:0,x")
    with pytest.raises(ToolError, match="expected topic name and partitions"):
        parse_topic_arg("a:1:2")


def test_state_filter_takes_kafkas_names_in_any_case() -> None:
    assert parse_states(["stable,EMPTY", "Stable"]) == ["Stable", "Empty"]
    assert parse_states([]) == []
    with pytest.raises(ToolError, match="Valid states are: PreparingRebalance"):
        parse_states(["Sleeping"])


def test_parser_requires_one_scope_and_one_scenario() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["groups", "reset-offsets", "--group", "g", "--all-topics", "--shift-by", "-2"]
    )
    assert args.shift_by == -2 and not args.execute
    # --from-file names its own partitions: no scope needed (checked when it runs).
    from_file = parser.parse_args(
        ["groups", "reset-offsets", "--group", "g", "--from-file", "plan.csv", "--export"]
    )
    assert (from_file.from_file, from_file.export, from_file.topic) == ("plan.csv", True, None)
    for bad in (
        ["groups", "reset-offsets", "--group", "g", "--all-topics"],
        ["groups", "reset-offsets", "--group", "g", "--all-topics", "--to-current", "--to-latest"],
        ["groups", "reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--to-earliest"],
        ["groups", "reset-offsets", "--all-topics", "--to-latest"],
        ["groups", "describe", "--group", "g", "--members", "--state"],
        ["groups", "delete-offsets", "--group", "g"],
        ["groups", "delete-offsets", "--topic", "t"],
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    deleting = parser.parse_args(
        ["groups", "delete-offsets", "--group", "g", "--topic", "a", "--topic", "b:1"]
    )
    assert (deleting.group, deleting.topic) == ("g", ["a", "b:1"])
    listing = parser.parse_args(["groups", "list", "--state"])
    assert listing.state == []
    assert parser.parse_args(["groups", "list"]).state is None


# -- which describe API ------------------------------------------------------------------------


def api_versions(*keys: int) -> Answer:
    body = SimpleNamespace(
        error_code=0,
        api_keys=[SimpleNamespace(api_key=k, min_version=0, max_version=5) for k in keys],
    )
    return lambda _e, _v: body


def classic_group(_endpoint: Endpoint, _values: Mapping[str, Any]) -> Any:
    assignment = ConsumerProtocolAssignment(0, [("orders", [1])], None).encode(version=0)
    member = SimpleNamespace(
        member_id="m-1",
        group_instance_id=None,
        client_id="app",
        client_host="/10.0.0.1",
        member_assignment=assignment,
    )
    described = SimpleNamespace(
        group_id="g",
        error_code=0,
        group_state="Stable",
        protocol_type="consumer",
        protocol_data="range",
        members=[member],
    )
    return SimpleNamespace(groups=[described])


def consumer_group(error: Errors) -> Answer:
    partitions = SimpleNamespace(topic_id=None, topic_name="orders", partitions=[0, 2])
    member = SimpleNamespace(
        member_id="m-2",
        instance_id="i-2",
        client_id="app",
        client_host="/10.0.0.2",
        assignment=SimpleNamespace(topic_partitions=[partitions]),
    )
    described = SimpleNamespace(
        group_id="g",
        error_code=error,
        error_message=None,
        group_state="Reconciling",
        assignor_name="uniform",
        members=[member],
    )
    return lambda _e, _v: SimpleNamespace(groups=[described])


def test_a_kip_848_group_is_described_with_consumer_group_describe() -> None:
    client = ScriptedClient(
        {
            API_VERSIONS: [api_versions(15, 69)],
            FIND_COORDINATOR: [coordinator(3)],
            CONSUMER_GROUP_DESCRIBE: [consumer_group(Errors.NONE)],
        }
    )
    g = describe_group(client, "g")
    assert (g.state, g.protocol, g.coordinator.node_id) == ("Reconciling", "uniform", 3)
    assert g.members == (
        Member("m-2", "i-2", "app", "/10.0.0.2", (TP("orders", 0), TP("orders", 2))),
    )


def test_classic_groups_fall_back_to_describe_groups() -> None:
    script: dict[tuple[int, int], list[Answer]] = {
        API_VERSIONS: [api_versions(15, 69)],
        FIND_COORDINATOR: [coordinator(1)],
        CONSUMER_GROUP_DESCRIBE: [consumer_group(Errors.GROUP_ID_NOT_FOUND)],
        DESCRIBE_GROUPS: [classic_group],
    }
    g = describe_group(ScriptedClient(script), "g")
    assert (g.state, g.protocol) == ("Stable", "range")
    assert g.members == (Member("m-1", None, "app", "/10.0.0.1", (TP("orders", 1),)),)
    # A cluster without ConsumerGroupDescribe is asked with DescribeGroups only.
    old = ScriptedClient({**script, API_VERSIONS: [api_versions(15)]})
    assert describe_group(old, "g").state == "Stable"
    assert CONSUMER_GROUP_DESCRIBE not in {api for api, _ in old.sent}


def test_a_reset_that_fails_part_way_names_the_groups_it_reset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--execute over several groups commits each in turn: when a later group fails, the ones
    already reset are printed before the error, not lost with it."""
    from kcoord.node import groups_tool

    tp = TopicPartition("t", 0)
    committed_to: list[str] = []
    monkeypatch.setattr(groups_tool, "describe_group", lambda _c, g: SimpleNamespace(state="Empty"))
    monkeypatch.setattr(groups_tool, "committed_offsets", lambda _c, g: {tp: Committed(5, -1)})
    monkeypatch.setattr(groups_tool, "_partitions_to_reset", lambda _c, topics: [tp])

    def invalid(_c: Any, partitions: Any) -> None:
        if committed_to:  # the second group's topic is gone
            raise ToolError("topic t does not exist")

    monkeypatch.setattr(groups_tool, "_raise_if_invalid", invalid)
    monkeypatch.setattr(groups_tool, "plan_reset", lambda *_a: {tp: 0})
    monkeypatch.setattr(groups_tool, "commit_offsets", lambda _c, g, plan: committed_to.append(g))
    argv = ["groups", "reset-offsets", "--group", "a", "--group", "b", "--topic", "t"]
    args = build_parser().parse_args([*argv, "--to-earliest", "--execute"])
    with pytest.raises(ToolError, match="does not exist"):
        groups_tool._reset_offsets(cast(Any, None), args)
    assert committed_to == ["a"]
    out, err = capsys.readouterr()
    assert "stopped part way" in err
    assert [line.split() for line in out.splitlines() if line.strip()][1] == ["a", "t", "0", "0"]
