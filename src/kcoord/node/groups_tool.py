"""``kcoord groups``: consumer groups as ``kafka-consumer-groups.sh`` shows and changes them.

::

  groups list [--state [STATE,...]]
  groups describe (--group G... | --all-groups) [--offsets | --members | --state] [--verbose]
  groups reset-offsets (--group G... | --all-groups) (--topic T[:P,P]... | --all-topics)
         (--to-earliest | --to-latest | --to-offset N | --to-datetime ISO | --by-duration D
          | --shift-by N | --to-current | --from-file CSV)
         [--dry-run | --execute] [--export]
  groups delete --group G...
  groups delete-offsets --group G --topic T[:P,P]...

Everything goes through the Kafka protocol (``tool_client``), so the commands work against
Apache Kafka too. Columns, widths (``%-15s`` at least, wider for longer values), "-" for a
missing value and the messages are those of Kafka's ``ConsumerGroupCommand`` and
``GroupOffsetsResetter`` (tools/, 3.x and 4.x). Deliberate differences: errors, warnings and
"has no active members" go to stderr, and every failure exits 1 (Kafka prints some errors and
exits 0); rows and groups are sorted (Kafka prints some in hash-map order); trailing spaces are
trimmed.

The views of ``describe``:

- ``--offsets`` (the default): ``describe_group`` gives the members and their assignments
  (ConsumerGroupDescribe for a KIP-848 group where the cluster serves it, else DescribeGroups
  with each member's ConsumerProtocolAssignment bytes, ``decode_assignment``); OffsetFetch the
  committed offsets; ListOffsets (latest) at each partition's leader the log end offset. One row
  per assigned partition, members with the most partitions first, then one per committed
  partition nobody is assigned, with "-" for the member columns. LAG is LOG-END-OFFSET minus
  CURRENT-OFFSET when both are known. ``--verbose`` adds the committed LEADER-EPOCH.
- ``--members``: one row per member; ``--verbose`` adds ASSIGNMENT as ``topic(0,1), other(2)``
  (Kafka 3.x; Kafka 4 prints KIP-848's epochs and target assignment instead).
- ``--state``: the coordinator as ``host:port  (id)``, the assignment strategy (the group's
  protocol), the state and the member count.

``reset-offsets`` computes new offsets like ``GroupOffsetsResetter``: ``--to-offset``,
``--shift-by`` and ``--from-file`` are clamped to [log start, log end]; ``--to-datetime`` and
``--by-duration`` (an ISO 8601 duration back from now, ``PT1H``, ``P1DT12H``) ask ListOffsets
for the first offset at or after the time and fall back to the log end when there is none;
``--to-current`` keeps the committed offset and gives a partition without one the log end.
``--from-file`` reads the CSV that ``--export`` writes: ``topic,partition,offset`` lines for one
``--group``, ``group,topic,partition,offset`` otherwise, and needs no ``--topic``. It only
touches a group whose state is Empty or Dead (an unknown group is Dead): with live members the
commit would race them. ``--execute`` commits with OffsetCommit as a "simple" member
(generation -1, empty member id), which a coordinator accepts only while the group is empty;
without it (``--dry-run``, the default) nothing is written.

``delete-offsets`` removes one group's committed offsets with OffsetDelete (KIP-496, the admin
client's ``deleteConsumerGroupOffsets``), as ``ConsumerGroupCommand.deleteOffsets``: a topic
named without partitions means all of its partitions (a topic that does not exist is a row
with "Not Provided" for the partition); the coordinator refuses a topic a live member is
subscribed to (GROUP_SUBSCRIBED_TO_TOPIC) and any partition of a group whose members do not
use the consumer protocol type (NON_EMPTY_GROUP).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kcoord.cluster.coordinator import consumer_protocol
from kcoord.cluster.coordinator.wire import WireFormatError
from kcoord.errors import Errors
from kcoord.node.tool_client import (
    CONSUMER_GROUP_DESCRIBE,
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NO_OFFSET,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    Broker,
    KafkaError,
    Once,
    ToolClient,
    ToolError,
    TopicPartition,
    add_connection_arguments,
    error_name,
    run_tool,
)

MISSING: Final = "-"  # ConsumerGroupCommand.MISSING_COLUMN_VALUE
CONSUMER_PROTOCOL_TYPE: Final = "consumer"
# Kafka's GroupState names of the classic and the consumer (KIP-848) protocols.
GROUP_STATES: Final = (
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
    "Empty",
    "Assigning",
    "Reconciling",
)
REBALANCING_STATES: Final = frozenset(
    {"PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"}
)
# Reset-offsets may only touch groups no member is committing for.
INACTIVE_STATES: Final = frozenset({"Empty", "Dead"})


# ---------------------------------------------------------------------------------------------
# What the views show.


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class Group:
    group_id: str
    state: str
    protocol_type: str
    protocol: str  # the assignment strategy of a consumer group
    members: tuple[Member, ...]
    coordinator: Broker


@dataclass(frozen=True, slots=True)
class Committed:
    offset: int
    leader_epoch: int  # -1: unknown


@dataclass(frozen=True, slots=True)
class OffsetRow:
    group: str
    topic: str | None
    partition: int | None
    committed: Committed | None
    log_end_offset: int | None
    consumer_id: str | None
    host: str | None
    client_id: str | None

    @property
    def lag(self) -> int | None:
        # ConsumerGroupCommand.getLag: only when both ends are known.
        if self.committed is None or self.committed.offset == NO_OFFSET:
            return None
        if self.log_end_offset is None:
            return None
        return self.log_end_offset - self.committed.offset


def decode_assignment(data: bytes) -> tuple[TopicPartition, ...]:
    """The partitions of a ConsumerProtocolAssignment (``consumer_protocol.decode_assignment``:
    every version, empty bytes for none yet); raises ``WireFormatError`` for bytes that do not
    parse."""
    return tuple(
        TopicPartition(topic, p)
        for topic, partitions in consumer_protocol.decode_assignment(data).partitions
        for p in partitions
    )


def assignment_string(assignment: Iterable[TopicPartition]) -> str:
    """Kafka 3.x's ASSIGNMENT column: ``topic(0,1), other(2)``, topics sorted, "-" if none."""
    by_topic: dict[str, list[int]] = {}
    for tp in assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if not by_topic:
        return MISSING
    return ", ".join(
        sorted(f"{t}({','.join(str(p) for p in sorted(ps))})" for t, ps in by_topic.items())
    )


def offset_rows(
    group: Group,
    committed: Mapping[TopicPartition, Committed],
    log_end_offsets: Mapping[TopicPartition, int],
) -> list[OffsetRow]:
    """The rows of the offsets view (``collectGroupsOffsets``): the members' assigned
    partitions, members with the most partitions first, then the committed partitions nobody
    is assigned."""
    rows: list[OffsetRow] = []
    assigned: set[TopicPartition] = set()
    members = sorted(
        (m for m in group.members if m.assignment), key=lambda m: -len(set(m.assignment))
    )
    for m in members:
        for tp in sorted(set(m.assignment)):
            assigned.add(tp)
            rows.append(
                OffsetRow(
                    group.group_id,
                    tp.topic,
                    tp.partition,
                    committed.get(tp),
                    log_end_offsets.get(tp),
                    m.member_id,
                    m.host,
                    m.client_id,
                )
            )
    for tp in sorted(set(committed) - assigned):
        rows.append(
            OffsetRow(
                group.group_id,
                tp.topic,
                tp.partition,
                committed[tp],
                log_end_offsets.get(tp),
                None,
                None,
                None,
            )
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Formatting: Kafka's printf formats, "%-Ns" per column and the last one as is.


def _text(value: object | None) -> str:
    return MISSING if value is None else str(value)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    assert len(widths) == len(cells) - 1, (cells, widths)
    padded = [f"{c:<{w}}" for c, w in zip(cells, widths, strict=False)] + [cells[-1]]
    return " ".join(padded).rstrip()


def _table(
    header: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int]
) -> list[str]:
    return [_line(header, widths)] + [_line(r, widths) for r in rows]


def _width(values: Iterable[str], minimum: int = 15) -> int:
    return max([minimum, *(len(v) for v in values)])


def format_offsets(rows: Sequence[OffsetRow], *, verbose: bool = False) -> list[str]:
    cells = []
    for r in rows:
        committed = r.committed
        epoch = committed.leader_epoch if committed is not None else -1
        offset = committed.offset if committed is not None else None
        cells.append(
            [
                r.group,
                _text(r.topic),
                _text(r.partition),
                *([_text(epoch if epoch >= 0 else None)] if verbose else []),
                _text(offset),
                _text(r.log_end_offset),
                _text(r.lag),
                _text(r.consumer_id),
                _text(r.host),
                _text(r.client_id),
            ]
        )
    header = [
        "GROUP",
        "TOPIC",
        "PARTITION",
        *(["LEADER-EPOCH"] if verbose else []),
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
    ]
    k = 1 if verbose else 0
    widths = [
        _width(c[0] for c in cells),
        _width(c[1] for c in cells),
        10,
        *([15] if verbose else []),
        15,
        15,
        15,
        _width(c[6 + k] for c in cells),
        _width(c[7 + k] for c in cells),
    ]
    return _table(header, cells, widths)


def format_members(group: Group, *, verbose: bool = False) -> list[str]:
    with_instance_id = any(m.group_instance_id for m in group.members)
    cells = [
        [
            group.group_id,
            m.member_id,
            *([m.group_instance_id or ""] if with_instance_id else []),
            m.host,
            m.client_id,
            str(len(m.assignment)),
            *([assignment_string(m.assignment)] if verbose else []),
        ]
        for m in group.members
    ]
    header = [
        "GROUP",
        "CONSUMER-ID",
        *(["GROUP-INSTANCE-ID"] if with_instance_id else []),
        "HOST",
        "CLIENT-ID",
        "#PARTITIONS",
        *(["ASSIGNMENT"] if verbose else []),
    ]
    k = 1 if with_instance_id else 0
    widths = [
        _width(c[0] for c in cells),
        _width(c[1] for c in cells),
        *([_width((c[2] for c in cells), 17)] if with_instance_id else []),
        _width(c[2 + k] for c in cells),
        _width(c[3 + k] for c in cells),
        *([15] if verbose else []),
    ]
    return _table(header, cells, widths)


def coordinator_string(coordinator: Broker) -> str:
    return f"{coordinator.host}:{coordinator.port}  ({coordinator.node_id})"


def format_state(group: Group) -> list[str]:
    coordinator = coordinator_string(group.coordinator)
    row = [
        group.group_id,
        coordinator,
        group.protocol or MISSING,
        group.state,
        str(len(group.members)),
    ]
    widths = [max(15, len(group.group_id)), max(25, len(coordinator)), 20, 20]
    return _table(
        ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"], [row], widths
    )


def format_list_with_state(groups: Sequence[tuple[str, str]]) -> list[str]:
    """``--list --state``: GROUP and STATE (``printGroupInfo``: the group column is 10 wider
    than the longest id, at least 15 + 10)."""
    width = _width(g for g, _ in groups) + 10
    return _table(["GROUP", "STATE"], [[g, s] for g, s in groups], [width])


def format_reset(plans: Mapping[str, Mapping[TopicPartition, int]]) -> list[str]:
    """``printOffsetsToReset``: GROUP TOPIC PARTITION NEW-OFFSET."""
    rows = [
        [group, tp.topic, str(tp.partition), str(offset)]
        for group in sorted(plans)
        for tp, offset in sorted(plans[group].items())
    ]
    widths = [_width(r[0] for r in rows), _width(r[1] for r in rows), 10]
    return _table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], rows, widths)


def format_offset_deletion(results: Mapping[TopicPartition, int]) -> list[str]:
    """``deleteOffsets``' table: TOPIC PARTITION STATUS (the topic column at least 30 wide)."""
    rows = [
        [
            tp.topic,
            str(tp.partition) if tp.partition >= 0 else "Not Provided",
            "Successful" if code == Errors.NONE else f"Error: {error_name(code)}",
        ]
        for tp, code in sorted(results.items())
    ]
    widths = [_width((r[0] for r in rows), 30), 15]
    return _table(["TOPIC", "PARTITION", "STATUS"], rows, widths)


def offset_deletion_message(group_id: str, topic_args: Sequence[str], code: int) -> str:
    """What ``deleteOffsets`` says of the request as a whole."""
    messages: dict[int, str] = {
        Errors.NONE: f"Request succeed for deleting offsets with topic {', '.join(topic_args)} "
        f"group {group_id}",
        Errors.INVALID_GROUP_ID: f"Error: '{group_id}' is not valid.",
        Errors.GROUP_ID_NOT_FOUND: f"Error: '{group_id}' does not exist.",
        Errors.GROUP_AUTHORIZATION_FAILED: f"Error: Access to '{group_id}' is not authorized.",
        Errors.NON_EMPTY_GROUP: f"Error: Deleting offsets of a consumer group '{group_id}' is "
        "forbidden if the group is not empty.",
    }
    partition_level = (
        Errors.GROUP_SUBSCRIBED_TO_TOPIC,
        Errors.TOPIC_AUTHORIZATION_FAILED,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
    )
    if code in partition_level:
        return "Error: Encounter some partition level error, see the follow-up details:"
    return messages.get(code, f"Error: Encounter some unknown error: {error_name(code)}")


def parse_states(values: Sequence[str]) -> list[str]:
    """``--state`` values (comma-separated, any case) as Kafka's state names."""
    by_lower = {s.lower(): s for s in GROUP_STATES}
    states = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            state = by_lower.get(name.lower())
            if state is None:
                raise ToolError(
                    f"Invalid state list '{value}'. Valid states are: {', '.join(GROUP_STATES)}"
                )
            if state not in states:
                states.append(state)
    return states


def parse_datetime_ms(text: str) -> int:
    """``--to-datetime``: ISO 8601 (``2024-05-01T12:00:00.000``, with ``Z`` or ``+02:00``);
    without a zone UTC, as Kafka's ``Utils.getDateTime`` appends a ``Z``. A date and time
    without the ``T`` between them (``2024-05-01``, ``2024-05-01 12:00``) is refused, as
    there: taken as midnight or as written, the reset went somewhere the operator may not
    have meant."""
    if "T" not in text:
        raise ToolError(
            f"invalid --to-datetime {text!r}: it does not contain a 'T' according to ISO 8601 "
            "format, like 2024-05-01T12:00:00.000"
        )
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ToolError(
            f"invalid --to-datetime {text!r}: expected ISO 8601 like 2024-05-01T12:00:00.000"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (value - epoch) // datetime.timedelta(milliseconds=1)


_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?"
    r"(?:T(?=[-+]?\d)(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration_ms(text: str) -> int:
    """``--by-duration``: an ISO 8601 duration as Java's ``Duration.parse`` reads it
    (``PnDTnHnMn.nS``: days of 24 hours, no years or months), in milliseconds."""
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.group(i) for i in (2, 3, 4, 5)):
        raise ToolError(f"invalid --by-duration {text!r}: expected an ISO 8601 duration like PT1H")
    sign, days, hours, minutes, seconds, fraction = match.groups()
    ms = (
        int(days or 0) * 86_400_000
        + int(hours or 0) * 3_600_000
        + int(minutes or 0) * 60_000
        + int(seconds or 0) * 1000
    )
    if fraction:
        part = int((fraction + "000")[:3])
        ms += -part if (seconds or "").startswith("-") else part
    return -ms if sign == "-" else ms


def parse_reset_plan(text: str, single_group: str | None) -> dict[str, dict[TopicPartition, int]]:
    """``--from-file``: ``topic,partition,offset`` rows when one ``--group`` is named and the
    first row has three fields (the file ``--export`` writes for one group), else
    ``group,topic,partition,offset`` rows (``parseResetPlan``). CSV, so a group id with a
    comma or a quote is a quoted field, as ``--export`` writes it. Blank lines are skipped."""
    rows = [
        [f.strip() for f in row] for row in csv.reader(io.StringIO(text)) if "".join(row).strip()
    ]
    no_group = single_group is not None and bool(rows) and len(rows[0]) == 3
    plan: dict[str, dict[TopicPartition, int]] = {}
    for number, fields in enumerate(rows, 1):
        expected = 3 if no_group else 4
        try:
            if len(fields) != expected:
                raise ValueError
            group = single_group if no_group and single_group is not None else fields[0]
            topic, partition, offset = fields[-3], int(fields[-2]), int(fields[-1])
            if not topic:
                raise ValueError
        except ValueError:
            shape = "topic,partition,offset" if no_group else "group,topic,partition,offset"
            raise ToolError(
                f"invalid reset plan line {number}: {_csv_row(fields)!r}, expected {shape}"
            ) from None
        plan.setdefault(group, {})[TopicPartition(topic, partition)] = offset
    return plan


def format_reset_csv(
    plans: Mapping[str, Mapping[TopicPartition, int]], *, single_group: bool
) -> list[str]:
    """``--export``: the plan as ``exportOffsetsToCsv`` writes it (Jackson's CSV, which quotes
    a field with a comma or a quote: a group id may have either), which ``--from-file`` reads
    back; with the group column unless exactly one ``--group`` was named."""
    return [
        _csv_row(
            [tp.topic, tp.partition, offset]
            if single_group
            else [group, tp.topic, tp.partition, offset]
        )
        for group in sorted(plans)
        for tp, offset in sorted(plans[group].items())
    ]


def _csv_row(fields: Sequence[object]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(fields)
    return out.getvalue()


def clamp_offset(requested: int, log_start: int, log_end: int) -> int:
    """``GroupOffsetsResetter.checkOffsetsRange``: above the log end becomes the log end,
    below the log start the log start."""
    if requested > log_end:
        return log_end
    if requested < log_start:
        return log_start
    return requested


def parse_topic_arg(text: str) -> tuple[str, list[int] | None]:
    """``--topic T`` (every partition) or ``--topic T:0,1``."""
    if ":" not in text:
        return text, None
    parts = text.split(":")
    if len(parts) != 2 or not parts[0]:
        raise ToolError(f"Invalid topic arg '{text}', expected topic name and partitions")
    partitions = []
    for p in parts[1].split(","):
        try:
            partitions.append(int(p))
        except ValueError:
            raise ToolError(f"Invalid partition '{p}' specified in topic arg '{text}'") from None
    return parts[0], partitions


# ---------------------------------------------------------------------------------------------
# Gathering, through the Kafka protocol.


def _described_group(body: Any, group_id: str) -> Any:
    for g in body.groups:
        if str(g.group_id) == group_id:
            return g
    raise ToolError(f"DescribeGroups answered without group '{group_id}'")


def describe_group(client: ToolClient, group_id: str) -> Group:
    """The group as Kafka's ``DescribeConsumerGroupsHandler`` finds it: ConsumerGroupDescribe
    first where the cluster serves it (groups of the KIP-848 consumer protocol), then, for a
    group it does not know (GROUP_ID_NOT_FOUND: a classic group, or none), DescribeGroups."""
    if client.supported_version(*CONSUMER_GROUP_DESCRIBE):
        group = _describe_consumer_group(client, group_id)
        if group is not None:
            return group
    return _describe_classic_group(client, group_id)


def _describe_consumer_group(client: ToolClient, group_id: str) -> Group | None:
    coordinator, body = client.group_request(
        group_id,
        CONSUMER_GROUP_DESCRIBE,
        {"group_ids": [group_id], "include_authorized_operations": False},
        lambda b: int(_described_group(b, group_id).error_code),
    )
    g = _described_group(body, group_id)
    code = int(g.error_code)
    if code == Errors.GROUP_ID_NOT_FOUND:
        return None
    if code != Errors.NONE:
        raise KafkaError(code, f"ConsumerGroupDescribe of group '{group_id}'", g.error_message)
    return Group(
        group_id=group_id,
        state=str(g.group_state),
        protocol_type=CONSUMER_PROTOCOL_TYPE,
        protocol=str(g.assignor_name),
        members=tuple(
            Member(
                member_id=str(m.member_id),
                group_instance_id=m.instance_id,
                client_id=str(m.client_id),
                host=str(m.client_host),
                assignment=tuple(
                    TopicPartition(str(tp.topic_name), int(p))
                    for tp in m.assignment.topic_partitions
                    for p in tp.partitions
                ),
            )
            for m in g.members
        ),
        coordinator=coordinator,
    )


def _describe_classic_group(client: ToolClient, group_id: str) -> Group:
    """DescribeGroups v5 at the coordinator. An unknown group is Dead (v5 reports no
    GROUP_ID_NOT_FOUND; a later version would, and is treated the same)."""
    coordinator, body = client.group_request(
        group_id,
        DESCRIBE_GROUPS,
        {"groups": [group_id], "include_authorized_operations": False},
        lambda b: int(_described_group(b, group_id).error_code),
    )
    g = _described_group(body, group_id)
    code = int(g.error_code)
    if code == Errors.GROUP_ID_NOT_FOUND:
        return Group(group_id, "Dead", "", "", (), coordinator)
    if code != Errors.NONE:
        raise KafkaError(code, f"DescribeGroups of group '{group_id}'")
    protocol_type = str(g.protocol_type)
    if protocol_type not in ("", CONSUMER_PROTOCOL_TYPE):
        # DescribeConsumerGroupsHandler refuses other protocol types (Connect, Streams' old).
        raise ToolError(f"Group '{group_id}' is not a consumer group ({protocol_type})")
    members = []
    for m in g.members:
        member_id = str(m.member_id)
        try:
            assignment = (
                decode_assignment(bytes(m.member_assignment))
                if protocol_type == CONSUMER_PROTOCOL_TYPE
                else ()
            )
        except WireFormatError as e:
            raise ToolError(
                f"cannot decode the assignment of member '{member_id}' of group '{group_id}': {e}"
            ) from None
        members.append(
            Member(
                member_id=member_id,
                group_instance_id=m.group_instance_id,
                client_id=str(m.client_id),
                host=str(m.client_host),
                assignment=assignment,
            )
        )
    return Group(
        group_id=group_id,
        state=str(g.group_state),
        protocol_type=protocol_type,
        protocol=str(g.protocol_data),
        members=tuple(members),
        coordinator=coordinator,
    )


def committed_offsets(client: ToolClient, group_id: str) -> dict[TopicPartition, Committed]:
    """OffsetFetch v7 of every partition the group has an offset for."""
    _, body = client.group_request(
        group_id,
        OFFSET_FETCH,
        {"group_id": group_id, "topics": None, "require_stable": False},
        lambda b: int(b.error_code),
    )
    code = int(body.error_code)
    if code != Errors.NONE:
        raise KafkaError(code, f"OffsetFetch of group '{group_id}'")
    offsets = {}
    for t in body.topics:
        for p in t.partitions:
            # No committed offset is -1 (the admin client maps it to null and skips errors).
            if int(p.error_code) == Errors.NONE and int(p.committed_offset) >= 0:
                offsets[TopicPartition(str(t.name), int(p.partition_index))] = Committed(
                    int(p.committed_offset), int(p.committed_leader_epoch)
                )
    return offsets


def consumer_group_ids(client: ToolClient) -> list[str]:
    """Every consumer group (protocol type "consumer", or "" for one that only commits), as
    ``listConsumerGroups`` filters them."""
    return [g for g, ptype, _ in client.list_groups(()) if ptype in ("", CONSUMER_PROTOCOL_TYPE)]


def _partitions_to_reset(client: ToolClient, topic_args: Sequence[str]) -> list[TopicPartition]:
    parsed = [parse_topic_arg(t) for t in topic_args]
    topics = client.metadata(sorted({t for t, _ in parsed})).topics
    partitions: list[TopicPartition] = []
    for name, wanted in parsed:
        topic = topics.get(name)
        if wanted is None:
            if topic is None or topic.error_code != Errors.NONE:
                raise ToolError(f"Topic '{name}' does not exist")
            partitions.extend(TopicPartition(name, p.partition) for p in topic.partitions)
        else:
            partitions.extend(TopicPartition(name, p) for p in wanted)
    return sorted(set(partitions))


def _raise_if_invalid(client: ToolClient, partitions: Sequence[TopicPartition]) -> None:
    """``checkAllTopicPartitionsValid``: every partition exists and has a leader."""
    topics = client.metadata(sorted({tp.topic for tp in partitions})).topics
    missing, leaderless = [], []
    for tp in partitions:
        topic = topics.get(tp.topic)
        p = topic.partition(tp.partition) if topic is not None else None
        if p is None:
            missing.append(str(tp))
        elif p.leader_id < 0:
            leaderless.append(str(tp))
    if missing:
        raise ToolError(f'The partitions "{",".join(missing)}" do not exist')
    if leaderless:
        raise ToolError(f'The partitions "{",".join(leaderless)}" have no leader')


def _offsets_or_raise(
    client: ToolClient, partitions: Sequence[TopicPartition], timestamp: int, what: str
) -> dict[TopicPartition, int]:
    offsets = client.list_offsets(partitions, timestamp)
    for tp in partitions:
        if tp not in offsets:
            raise ToolError(f"Error getting {what} offset of topic partition: {tp}")
    return offsets


def plan_reset(
    client: ToolClient,
    args: argparse.Namespace,
    partitions: Sequence[TopicPartition],
    committed: Mapping[TopicPartition, Committed],
    from_file: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """The new offset of each partition for the chosen scenario (``prepareOffsetsToReset``);
    ``from_file`` is this group's part of the ``--from-file`` plan."""
    if args.to_earliest:
        return _offsets_or_raise(client, partitions, EARLIEST_TIMESTAMP, "starting")
    if args.to_latest:
        return _offsets_or_raise(client, partitions, LATEST_TIMESTAMP, "ending")
    if args.to_current:
        # resetToCurrent: the committed offset; a partition without one gets the log end.
        without = [tp for tp in partitions if tp not in committed]
        ends = _offsets_or_raise(client, without, LATEST_TIMESTAMP, "ending") if without else {}
        return {tp: committed[tp].offset if tp in committed else ends[tp] for tp in partitions}
    if args.to_datetime is not None or args.by_duration is not None:
        if args.to_datetime is not None:
            timestamp_ms = parse_datetime_ms(args.to_datetime)
        else:
            timestamp_ms = time.time_ns() // 1_000_000 - parse_duration_ms(args.by_duration)
        by_time = _offsets_or_raise(client, partitions, timestamp_ms, "timestamp")
        empty = [tp for tp in partitions if by_time[tp] == NO_OFFSET]
        if empty:
            for tp in empty:
                print(
                    f"Warn: Partition {tp.partition} from topic {tp.topic} is empty. "
                    "Falling back to latest known offset.",
                    file=sys.stderr,
                )
            by_time.update(_offsets_or_raise(client, empty, LATEST_TIMESTAMP, "ending"))
        return {tp: by_time[tp] for tp in partitions}
    if from_file is not None:
        requested = {tp: from_file[tp] for tp in partitions}
    elif args.to_offset is not None:
        requested = {tp: int(args.to_offset) for tp in partitions}
    else:
        assert args.shift_by is not None
        requested = {}
        for tp in partitions:
            current = committed.get(tp)
            if current is None:
                raise ToolError(
                    f"Cannot shift offset for partition {tp} since there is no current "
                    "committed offset"
                )
            requested[tp] = current.offset + int(args.shift_by)
    # A partition whose range is unknown (leaderless while asked) fails the reset, as Kafka's
    # listOffsets does: it let the requested offset through unclamped (10^12, or negative).
    log_start = _offsets_or_raise(client, partitions, EARLIEST_TIMESTAMP, "starting")
    log_end = _offsets_or_raise(client, partitions, LATEST_TIMESTAMP, "ending")
    return {
        tp: clamp_offset(offset, log_start[tp], log_end[tp]) for tp, offset in requested.items()
    }


def _request_topics(partitions: Mapping[TopicPartition, Mapping[str, Any]]) -> list[Any]:
    """A request's topics: each partition's fields, with its index, under its topic."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp, fields in sorted(partitions.items()):
        by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, **fields})
    return [{"name": topic, "partitions": parts} for topic, parts in by_topic.items()]


def commit_offsets(
    client: ToolClient, group_id: str, offsets: Mapping[TopicPartition, int]
) -> None:
    """OffsetCommit v8 as a simple member: generation -1, no member id (the admin client's
    ``alterConsumerGroupOffsets``)."""
    values = {
        "group_id": group_id,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": _request_topics(
            {
                tp: {
                    "committed_offset": offset,
                    "committed_leader_epoch": -1,
                    "committed_metadata": "",
                }
                for tp, offset in offsets.items()
            }
        ),
    }

    def errors(body: Any) -> list[tuple[TopicPartition, int]]:
        return [
            (TopicPartition(str(t.name), int(p.partition_index)), int(p.error_code))
            for t in body.topics
            for p in t.partitions
            if int(p.error_code) != Errors.NONE
        ]

    def coordinator_error(body: Any) -> int:
        # OffsetCommit has no group-level error: a coordinator error comes on every partition.
        codes = {code for _, code in errors(body)}
        return next(iter(codes)) if len(codes) == 1 else Errors.NONE

    _, body = client.group_request(group_id, OFFSET_COMMIT, values, coordinator_error)
    failed = errors(body)
    if failed:
        raise ToolError(
            f"committing offsets of group '{group_id}' failed: "
            + ", ".join(f"{tp}: {error_name(code)}" for tp, code in failed)
        )


def delete_offsets(
    client: ToolClient, group_id: str, partitions: Sequence[TopicPartition]
) -> tuple[int, dict[TopicPartition, int]]:
    """OffsetDelete v0 at the group's coordinator, as the admin client's
    ``deleteConsumerGroupOffsets`` reports it: (the request's error, each partition's). A group
    error is every partition's; otherwise the request's error is the first partition error."""
    values = {"group_id": group_id, "topics": _request_topics({tp: {} for tp in partitions})}
    _, body = client.group_request(group_id, OFFSET_DELETE, values, lambda b: int(b.error_code))
    group_error = int(body.error_code)
    if group_error != Errors.NONE:
        return group_error, dict.fromkeys(partitions, group_error)
    answered = {
        TopicPartition(str(t.name), int(p.partition_index)): int(p.error_code)
        for t in body.topics
        for p in t.partitions
    }
    # The admin client fails a partition the answer left out.
    results = {tp: answered.get(tp, Errors.UNKNOWN_SERVER_ERROR) for tp in partitions}
    first = next((code for _, code in sorted(results.items()) if code != Errors.NONE), 0)
    return first, results


# ---------------------------------------------------------------------------------------------
# Commands.


def _print_lines(lines: Iterable[str]) -> None:
    for line in lines:
        print(line)


def _should_print(group: Group, rows: int) -> bool:
    """``shouldPrintMemberState``: the state's message, and whether there is a table."""
    if group.state == "Dead":
        print(f"Error: Consumer group '{group.group_id}' does not exist.", file=sys.stderr)
        return False
    if group.state == "Empty":
        print(f"Consumer group '{group.group_id}' has no active members.", file=sys.stderr)
    elif group.state in REBALANCING_STATES:
        print(f"Warning: Consumer group '{group.group_id}' is rebalancing.", file=sys.stderr)
    return rows > 0


def _list(client: ToolClient, args: argparse.Namespace) -> int:
    if args.state is None:
        for group_id in consumer_group_ids(client):
            print(group_id)
        return 0
    states = parse_states(args.state)
    listed = [
        (g, state)
        for g, ptype, state in client.list_groups(states)
        if ptype in ("", CONSUMER_PROTOCOL_TYPE)
    ]
    _print_lines(format_list_with_state(listed))
    return 0


def _describe(client: ToolClient, args: argparse.Namespace) -> int:
    group_ids = consumer_group_ids(client) if args.all_groups else sorted(set(args.group))
    status = 0
    for group_id in group_ids:
        group = describe_group(client, group_id)
        if group.state == "Dead":
            status = 1
        if args.members:
            if _should_print(group, len(group.members)):
                _print_lines(["", *format_members(group, verbose=args.verbose)])
        elif args.state:
            if _should_print(group, 1):
                _print_lines(["", *format_state(group)])
        else:
            if group.state == "Dead":
                _should_print(group, 0)
                continue
            committed = committed_offsets(client, group_id)
            partitions = set(committed) | {tp for m in group.members for tp in m.assignment}
            log_end = client.list_offsets(partitions, LATEST_TIMESTAMP) if partitions else {}
            rows = offset_rows(group, committed, log_end)
            if _should_print(group, len(rows)):
                _print_lines(["", *format_offsets(rows, verbose=args.verbose)])
    return status


def _reset_offsets(client: ToolClient, args: argparse.Namespace) -> int:
    if not args.execute and not args.dry_run:
        # ConsumerGroupCommand's warning: without it a forgotten --execute looked like a reset.
        print(
            "WARN: No action will be performed as the --execute option is missing. "
            "Add --dry-run to say so explicitly.",
            file=sys.stderr,
        )
    if not (args.all_topics or args.topic or args.from_file):
        raise ToolError("One of the reset scopes should be defined: --all-topics, --topic.")
    single_group = args.group is not None and len(args.group) == 1
    file_plan = (
        _read_reset_plan(args.from_file, args.group[0] if single_group else None)
        if args.from_file is not None
        else None
    )
    group_ids = consumer_group_ids(client) if args.all_groups else list(dict.fromkeys(args.group))
    plans: dict[str, dict[TopicPartition, int]] = {}
    status = 0
    try:
        for group_id in group_ids:
            group = describe_group(client, group_id)
            if group.state not in INACTIVE_STATES:
                print(
                    f"Error: Assignments can only be reset if the group '{group_id}' is inactive, "
                    f"but the current state is {group.state}.",
                    file=sys.stderr,
                )
                status = 1
                continue
            committed = committed_offsets(client, group_id)
            group_file_plan = None
            if file_plan is not None:
                group_file_plan = file_plan.get(group_id)
                if group_file_plan is None:
                    print(f"Error: No reset plan for group {group_id} found", file=sys.stderr)
                    status = 1
                    continue
                partitions = sorted(group_file_plan)
            elif args.all_topics:
                partitions = sorted(committed)
            else:
                partitions = _partitions_to_reset(client, args.topic)
            if partitions:
                _raise_if_invalid(client, partitions)
            plan = (
                plan_reset(client, args, partitions, committed, group_file_plan)
                if partitions
                else {}
            )
            if args.execute and plan:
                commit_offsets(client, group_id, plan)
            plans[group_id] = plan
    except ToolError:
        # The groups before this one are reset already: say which, then fail (Kafka's tool
        # prints nothing of them).
        done = {g: plan for g, plan in plans.items() if plan}
        if args.execute and done:
            print("The reset stopped part way; these groups were reset:", file=sys.stderr)
            _print_lines(["", *format_reset(done)])
        raise
    if args.export:
        _print_lines(format_reset_csv(plans, single_group=single_group))
    elif plans:
        _print_lines(["", *format_reset(plans)])
    return status


def _read_reset_plan(path: str, single_group: str | None) -> dict[str, dict[TopicPartition, int]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ToolError(f"cannot read the reset plan {path}: {e}") from None
    return parse_reset_plan(text, single_group)


def _delete(client: ToolClient, args: argparse.Namespace) -> int:
    group_ids = consumer_group_ids(client) if args.all_groups else list(dict.fromkeys(args.group))
    results: dict[str, int] = {}
    for group_id in group_ids:

        def error_of(body: Any, group_id: str = group_id) -> int:
            for r in body.results:
                if str(r.group_id) == group_id:
                    return int(r.error_code)
            raise ToolError(f"DeleteGroups answered without group '{group_id}'")

        _, body = client.group_request(
            group_id, DELETE_GROUPS, {"groups_names": [group_id]}, error_of
        )
        results[group_id] = error_of(body)
    deleted = [g for g, code in results.items() if code == Errors.NONE]
    failed = {g: code for g, code in results.items() if code != Errors.NONE}
    quoted = ", ".join(f"'{g}'" for g in deleted)
    if not failed:
        print(f"Deletion of requested consumer groups ({quoted}) was successful.")
        return 0
    # Errors to stderr, as the module docstring says of every command (Kafka prints these
    # to stdout); the groups deleted to stdout.
    print("Error: Deletion of some consumer groups failed:", file=sys.stderr)
    for group_id, code in failed.items():
        print(
            f"* Group '{group_id}' could not be deleted due to: {error_name(code)}",
            file=sys.stderr,
        )
    if deleted:
        print(f"\nThese consumer groups were deleted successfully: {quoted}")
    return 1


def _delete_offsets(client: ToolClient, args: argparse.Namespace) -> int:
    parsed = [parse_topic_arg(t) for t in args.topic]
    partitions = {
        TopicPartition(t, p) for t, wanted in parsed if wanted is not None for p in wanted
    }
    whole = sorted({t for t, wanted in parsed if wanted is None})
    results: dict[TopicPartition, int] = {}
    if whole:
        # describeTopics: a topic that does not exist fails alone, as partition -1.
        described = client.metadata(whole).topics
        for name in whole:
            topic = described.get(name)
            if topic is None or topic.error_code != Errors.NONE:
                code = Errors.UNKNOWN_TOPIC_OR_PARTITION if topic is None else topic.error_code
                results[TopicPartition(name, -1)] = code
            else:
                partitions.update(TopicPartition(name, p.partition) for p in topic.partitions)
    # Asked even with no partition: the group's own error still comes back.
    code, answered = delete_offsets(client, args.group, sorted(partitions))
    results.update(answered)
    message = offset_deletion_message(args.group, args.topic, code)
    print(message, file=sys.stderr if code != Errors.NONE else sys.stdout)
    _print_lines(["", *format_offset_deletion(results)])
    return 0 if all(c == Errors.NONE for c in results.values()) and code == Errors.NONE else 1


# ---------------------------------------------------------------------------------------------
# The parser (wired into ``kcoord.node.cli``).


def _run(args: argparse.Namespace) -> int:
    commands = {
        "list": _list,
        "describe": _describe,
        "reset-offsets": _reset_offsets,
        "delete": _delete,
        "delete-offsets": _delete_offsets,
    }
    return run_tool(commands[args.groups_command], args)


def _group_selection(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--group", action="append", metavar="GROUP", help="repeatable")
    which.add_argument("--all-groups", action="store_true")


def add_parser(sub: Any, default_cluster_dir: Path) -> None:
    """``kcoord groups ...`` under the top-level subparsers ``sub``."""
    groups = sub.add_parser("groups", help="consumer groups, like kafka-consumer-groups.sh")
    gsub = groups.add_subparsers(dest="groups_command", required=True)

    listing = gsub.add_parser("list", help="every consumer group")
    listing.add_argument(
        "--state",
        nargs="*",
        metavar="STATE",
        help="show each group's state; with values (comma-separated), only those states",
    )

    describe = gsub.add_parser("describe", help="offsets and lag, members or state")
    _group_selection(describe)
    view = describe.add_mutually_exclusive_group()
    view.add_argument("--offsets", action="store_true", help="offsets and lag (default)")
    view.add_argument("--members", action="store_true", help="one row per member")
    view.add_argument("--state", action="store_true", help="coordinator, strategy, state")
    describe.add_argument(
        "--verbose", action="store_true", help="leader epochs / member assignments"
    )

    reset = gsub.add_parser("reset-offsets", help="move an inactive group's committed offsets")
    _group_selection(reset)
    # Not required: --from-file names its own partitions (checked in _reset_offsets).
    scope = reset.add_mutually_exclusive_group()
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,P]", help="repeatable")
    scope.add_argument("--all-topics", action="store_true", help="every committed partition")
    scenario = reset.add_mutually_exclusive_group(required=True)
    scenario.add_argument("--to-earliest", action="store_true")
    scenario.add_argument("--to-latest", action="store_true")
    scenario.add_argument("--to-offset", action=Once, type=int, metavar="N")
    scenario.add_argument(
        "--to-datetime", action=Once, metavar="ISO", help="e.g. 2024-05-01T12:00:00.000Z"
    )
    scenario.add_argument(
        "--by-duration",
        action=Once,
        metavar="DURATION",
        help="back from now, ISO 8601: PT1H, P1DT12H",
    )
    scenario.add_argument(
        "--shift-by", action=Once, type=int, metavar="N", help="N may be negative"
    )
    scenario.add_argument(
        "--to-current", action="store_true", help="the committed offset (else the log end)"
    )
    scenario.add_argument(
        "--from-file",
        action=Once,
        metavar="CSV",
        help="the plan --export printed (topic,partition,offset)",
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only print the plan (default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.add_argument(
        "--export", action="store_true", help="print the plan as CSV, for --from-file"
    )

    delete = gsub.add_parser("delete", help="delete empty groups (DeleteGroups)")
    _group_selection(delete)

    delete_offsets = gsub.add_parser(
        "delete-offsets", help="delete one group's committed offsets (OffsetDelete)"
    )
    delete_offsets.add_argument("--group", action=Once, required=True, help="one group")
    delete_offsets.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="TOPIC[:P,P]",
        help="repeatable; without partitions, all of the topic's",
    )

    for p in (listing, describe, reset, delete, delete_offsets):
        add_connection_arguments(p, default_cluster_dir)
    groups.set_defaults(func=_run)
