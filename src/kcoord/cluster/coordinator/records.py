"""The records the group coordinator writes to ``__consumer_offsets``, byte for byte as Kafka's.

Theory of operation
-------------------
Each ``__consumer_offsets`` record is a (key, value) pair of Kafka messages, each prefixed with an
int16 (``CoordinatorRecordSerde`` in Kafka's coordinator-common)::

    key   = record_type int16 | key fields       (classic encoding, never flexible)
    value = version int16     | value fields     (classic or flexible, by version)
    value = null                                 a tombstone: deletes the key on compaction

The key's leading int16 is historically the key schema *version*; Kafka's new coordinator
(KIP-848) reads it as the record *type*, and a reader that meets a type it does not know raises
``UnknownRecordTypeError`` so the loader can skip it with a warning, as Kafka's
``CoordinatorLoaderImpl`` does after a downgrade. Anything else that does not parse raises
``CorruptCoordinatorRecordError``: truncation, bad lengths, invalid UTF-8, trailing bytes, a value
version outside the schema's range. Kafka's reader does not reject trailing bytes; we do, because
nothing Kafka writes has them and they mean the bytes are not what we think.

Schemas: Kafka's JSON files in group-coordinator/src/main/resources/common/message/ as of
Kafka 4.0/4.1 (``OffsetCommitKey.json``, ``OffsetCommitValue.json``, ``GroupMetadataKey.json``,
``GroupMetadataValue.json``, ``LegacyOffsetCommitKey.json``, ``ConsumerGroup*.json``). The
encoding of each primitive is in ``wire.py``.

Record types and keys (``s`` string, ``s?`` nullable string, ``b`` bytes, ``[]`` array; keys are
always classic; in flexible value versions strings/bytes/arrays are compact and every struct,
array elements included, ends with a tagged-field section)::

    type  key                                       key fields
    0     LegacyOffsetCommitKey                     group s | topic s | partition i32
    1     OffsetCommitKey                           group s | topic s | partition i32
    2     GroupMetadataKey                          group s
    3     ConsumerGroupMetadataKey                  GroupId s
    4     ConsumerGroupPartitionMetadataKey         GroupId s
    5     ConsumerGroupMemberMetadataKey            GroupId s | MemberId s
    6     ConsumerGroupTargetAssignmentMetadataKey  GroupId s
    7     ConsumerGroupTargetAssignmentMemberKey    GroupId s | MemberId s
    8     ConsumerGroupCurrentMemberAssignmentKey   GroupId s | MemberId s

    type  value                         versions read   version written   flexible from
    0     OffsetCommitValue             0-4             never (type 1)    4
    1     OffsetCommitValue             0-4             1 or 3            4
    2     GroupMetadataValue            0-4             3                 4
    3-8   ConsumerGroup...Value         0               0                 0

Type 0 was written only by Kafka before 0.9; Kafka 4 reads it as ``LegacyOffsetCommitValue``
(= OffsetCommitValue v0), we read every OffsetCommitValue version there.

Types 9 and up (share groups, KIP-932; regular expressions; streams groups, KIP-1071) are not
read yet: they raise ``UnknownRecordTypeError``.

OffsetCommitValue (field, versions)::

    offset i64 (0+) | leaderEpoch i32 (3+, default -1) | metadata s (0+)
    | commitTimestamp i64 (0+) | expireTimestamp i64 (1 only, default -1)

GroupMetadataValue::

    protocolType s | generation i32 | protocol s? | leader s? | currentStateTimestamp i64 (2+,
    default -1) | members [ memberId s | groupInstanceId s? (3+, default null) | clientId s
    | clientHost s | rebalanceTimeout i32 (1+; v0 reads as -1) | sessionTimeout i32
    | subscription b | assignment b ]

KIP-848 values (all version 0, flexible)::

    ConsumerGroupMetadataValue        Epoch i32 | tag 0: MetadataHash i64 (default 0; Kafka 4.1+)
    ConsumerGroupPartitionMetadataValue
                                      Topics [ TopicId uuid | TopicName s | NumPartitions i32
                                      | PartitionMetadata [ Partition i32 | Racks [s] ] ]
                                      (PartitionMetadata is unused since Kafka 4.0)
    ConsumerGroupMemberMetadataValue  InstanceId s? | RackId s? | ClientId s | ClientHost s
                                      | SubscribedTopicNames [s] | SubscribedTopicRegex s?
                                      | RebalanceTimeoutMs i32 | ServerAssignor s?
                                      | tag 0: ClassicMemberMetadata? { SessionTimeoutMs i32
                                      | SupportedProtocols [ Name s | Metadata b ] }
    ConsumerGroupTargetAssignmentMetadataValue   AssignmentEpoch i32
    ConsumerGroupTargetAssignmentMemberValue     TopicPartitions [ TopicId uuid | Partitions [i32] ]
    ConsumerGroupCurrentMemberAssignmentValue    MemberEpoch i32 | PreviousMemberEpoch i32
                                      | State i8 | AssignedPartitions [ TopicId uuid
                                      | Partitions [i32] ] | PartitionsPendingRevocation (same)

A nullable struct in a tagged field (ClassicMemberMetadata) is written as an unsigned varint
marker (1 = present) followed by the struct, the field's size counting the marker; an absent
field means null (Kafka's ``MessageDataGenerator``, KIP-893). Unknown tags are skipped on read,
so records from newer Kafka versions that only add tagged fields still load.

Versions written are the ones Kafka's ``GroupCoordinatorRecordHelpers`` writes (4.0/4.1):
``OffsetCommitValue`` v1 when the commit carries a per-commit expiry (KIP-211's
``retention_time_ms``, OffsetCommit v2-v4), else v3 -- the highest non-flexible version, "until a
tagged field is introduced"; ``GroupMetadataValue`` v3 (``GROUP_METADATA_VALUE_VERSION``); the
KIP-848 values v0; keys with type 1 for offset commits. ``encode_value(..., version=n)`` writes any
readable version; fields a version lacks are dropped silently, as Kafka does for ignorable fields
(every field added after v0 here is ignorable).

Python names carry units (``commit_timestamp_ms``); the JSON of ``format_offsets_record`` uses
Kafka's field names. Topic ids are 16 raw bytes (Kafka's ``Uuid``); ``uuid`` is not imported
because this package does no I/O and draws no randomness.

Decoding notes: an ``expireTimestamp`` of -1 (or a version without it) reads as ``None``; a
version without ``leaderEpoch`` reads as -1 (no epoch); GroupMetadataValue v0 has no
``rebalanceTimeout`` and reads as -1, none: Kafka's schema gives the field no default (its
Java coordinator reads 0 and keeps it), and the old Scala coordinator took the session
timeout for a v0 member at replay, as the shard does for -1 (a v1+ record's 0 stays 0).

``format_offsets_record`` renders one record as ``kafka-dump-log.sh --offsets-decoder`` does
(``DumpLogSegments.OffsetsMessageParser`` in Kafka's tools)::

    key: {"type":"1","data":{"group":"g","topic":"t","partition":0}}
    payload: {"version":"3","data":{"offset":5,"leaderEpoch":0,"metadata":"","commitTimestamp":1}}

on one line; ``payload: <DELETE>`` for a tombstone; for a group whose protocolType is
``consumer`` each member's subscription and assignment bytes are decoded as Kafka's
ConsumerProtocolSubscription/Assignment (versions 0-3), other bytes print as base64.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Final, NamedTuple, TypeAlias

from kcoord.cluster.coordinator.wire import UUID_SIZE, Reader, WireFormatError, Writer

NO_LEADER_EPOCH: Final = -1
NO_TIMESTAMP: Final = -1
ZERO_TOPIC_ID: Final = bytes(UUID_SIZE)


class RecordType(IntEnum):
    """The key's leading int16 (Kafka's ``CoordinatorRecordType``)."""

    LEGACY_OFFSET_COMMIT = 0
    OFFSET_COMMIT = 1
    GROUP_METADATA = 2
    CONSUMER_GROUP_METADATA = 3
    CONSUMER_GROUP_PARTITION_METADATA = 4
    CONSUMER_GROUP_MEMBER_METADATA = 5
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8


class CoordinatorRecordError(ValueError):
    """A ``__consumer_offsets`` record that cannot be decoded."""


class UnknownRecordTypeError(CoordinatorRecordError):
    """The key's record type is one this build does not know (skip it, as Kafka does)."""

    def __init__(self, record_type: int) -> None:
        super().__init__(f"unknown coordinator record type {record_type}")
        self.record_type = record_type


class CorruptCoordinatorRecordError(CoordinatorRecordError):
    """Bytes that do not parse as the record their type announces."""


# --------------------------------------------------------------------------------------------
# Keys


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitKey:
    """Type 1, the committed offset of one partition for one group. Type 0 reads as this too."""

    RECORD_TYPE: ClassVar[RecordType] = RecordType.OFFSET_COMMIT
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataKey:
    """Type 2, a classic group's state after its last rebalance."""

    RECORD_TYPE: ClassVar[RecordType] = RecordType.GROUP_METADATA
    group_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMetadataKey:
    RECORD_TYPE: ClassVar[RecordType] = RecordType.CONSUMER_GROUP_METADATA
    group_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupPartitionMetadataKey:
    RECORD_TYPE: ClassVar[RecordType] = RecordType.CONSUMER_GROUP_PARTITION_METADATA
    group_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMemberMetadataKey:
    RECORD_TYPE: ClassVar[RecordType] = RecordType.CONSUMER_GROUP_MEMBER_METADATA
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMetadataKey:
    RECORD_TYPE: ClassVar[RecordType] = RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA
    group_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMemberKey:
    RECORD_TYPE: ClassVar[RecordType] = RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupCurrentMemberAssignmentKey:
    RECORD_TYPE: ClassVar[RecordType] = RecordType.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT
    group_id: str
    member_id: str


# --------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp_ms: int
    # KIP-211: set only by OffsetCommit v2-v4 with a retention time; forces value version 1.
    expire_timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberMetadata:
    """One member of a classic group (``GroupMetadataValue.MemberMetadata``)."""

    member_id: str
    group_instance_id: str | None = None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # the chosen protocol's metadata from JoinGroup, opaque
    assignment: bytes  # from the leader's SyncGroup, opaque


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMetadataValue:
    protocol_type: str  # "" when the group has none (Kafka writes it that way)
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int = NO_TIMESTAMP
    members: tuple[MemberMetadata, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMetadataValue:
    epoch: int  # the group epoch
    metadata_hash: int = 0  # tag 0, KIP-1101 (Kafka 4.1+); 0 = not computed


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionMetadata:
    partition: int
    racks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicMetadata:
    topic_id: bytes  # 16 bytes
    topic_name: str
    num_partitions: int
    partition_metadata: tuple[PartitionMetadata, ...] = ()  # unused since Kafka 4.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupPartitionMetadataValue:
    topics: tuple[TopicMetadata, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicProtocol:
    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicMemberMetadata:
    """Set for a member of a consumer group that still speaks the classic protocol (KIP-848)."""

    session_timeout_ms: int
    supported_protocols: tuple[ClassicProtocol, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupMemberMetadataValue:
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    classic_member_metadata: ClassicMemberMetadata | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicPartitions:
    topic_id: bytes  # 16 bytes
    partitions: tuple[int, ...] = ()
    # KIP-1251 (Kafka 4.3): in a current member assignment, the epoch at which each partition
    # became the member's, aligned with ``partitions`` (the struct's tagged field 0,
    # ``AssignmentEpochs``); None where not written: a record of an older writer, and always
    # in a target assignment.
    assignment_epochs: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupTargetAssignmentMemberValue:
    topic_partitions: tuple[TopicPartitions, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupCurrentMemberAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int  # int8, Kafka's MemberState value
    assigned_partitions: tuple[TopicPartitions, ...] = ()
    partitions_pending_revocation: tuple[TopicPartitions, ...] = ()


CoordinatorKey: TypeAlias = (
    OffsetCommitKey
    | GroupMetadataKey
    | ConsumerGroupMetadataKey
    | ConsumerGroupPartitionMetadataKey
    | ConsumerGroupMemberMetadataKey
    | ConsumerGroupTargetAssignmentMetadataKey
    | ConsumerGroupTargetAssignmentMemberKey
    | ConsumerGroupCurrentMemberAssignmentKey
)
CoordinatorValue: TypeAlias = (
    OffsetCommitValue
    | GroupMetadataValue
    | ConsumerGroupMetadataValue
    | ConsumerGroupPartitionMetadataValue
    | ConsumerGroupMemberMetadataValue
    | ConsumerGroupTargetAssignmentMetadataValue
    | ConsumerGroupTargetAssignmentMemberValue
    | ConsumerGroupCurrentMemberAssignmentValue
)


@dataclass(frozen=True, slots=True)
class CoordinatorRecord:
    """One ``__consumer_offsets`` record; ``value is None`` is a tombstone (delete the key)."""

    key: CoordinatorKey
    value: CoordinatorValue | None

    def __post_init__(self) -> None:
        expected = _SCHEMAS[self.key.RECORD_TYPE].value_class
        if self.value is not None and type(self.value) is not expected:
            raise TypeError(
                f"{type(self.key).__name__} takes a {expected.__name__}, "
                f"not a {type(self.value).__name__}"
            )

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


# --------------------------------------------------------------------------------------------
# Per-schema readers and writers. Each reads/writes the fields after the version prefix; a
# flexible struct (top level or array element) ends with its tagged-field section.


def _end_struct(w: Writer, tags: dict[int, bytes] | None = None) -> None:
    if w.flexible:
        w.tagged_fields(tags)


def _struct_tags(r: Reader) -> dict[int, bytes]:
    """Read (and return) a struct's tagged fields; unknown tags are simply not looked at."""
    return r.tagged_fields() if r.flexible else {}


def _read_offset_commit_value(r: Reader, version: int) -> OffsetCommitValue:
    offset = r.int64("offset")
    leader_epoch = r.int32("leaderEpoch") if version >= 3 else NO_LEADER_EPOCH
    metadata = r.string("metadata")
    commit_timestamp_ms = r.int64("commitTimestamp")
    expire_timestamp_ms = r.int64("expireTimestamp") if version == 1 else NO_TIMESTAMP
    _struct_tags(r)
    return OffsetCommitValue(
        offset=offset,
        leader_epoch=leader_epoch,
        metadata=metadata,
        commit_timestamp_ms=commit_timestamp_ms,
        expire_timestamp_ms=None if expire_timestamp_ms == NO_TIMESTAMP else expire_timestamp_ms,
    )


def _write_offset_commit_value(w: Writer, value: OffsetCommitValue, version: int) -> None:
    w.int64(value.offset, "offset")
    if version >= 3:
        w.int32(value.leader_epoch, "leaderEpoch")
    w.string(value.metadata, "metadata")
    w.int64(value.commit_timestamp_ms, "commitTimestamp")
    if version == 1:
        expire = value.expire_timestamp_ms
        w.int64(NO_TIMESTAMP if expire is None else expire, "expireTimestamp")
    _end_struct(w)


def _read_group_metadata_value(r: Reader, version: int) -> GroupMetadataValue:
    protocol_type = r.string("protocolType")
    generation = r.int32("generation")
    protocol = r.nullable_string("protocol")
    leader = r.nullable_string("leader")
    current_state_timestamp_ms = r.int64("currentStateTimestamp") if version >= 2 else NO_TIMESTAMP
    members = []
    for _ in range(r.array_length("members")):
        member_id = r.string("memberId")
        group_instance_id = r.nullable_string("groupInstanceId") if version >= 3 else None
        client_id = r.string("clientId")
        client_host = r.string("clientHost")
        rebalance_timeout_ms = r.int32("rebalanceTimeout") if version >= 1 else -1
        session_timeout_ms = r.int32("sessionTimeout")
        subscription = r.bytes_("subscription")
        assignment = r.bytes_("assignment")
        _struct_tags(r)
        members.append(
            MemberMetadata(
                member_id=member_id,
                group_instance_id=group_instance_id,
                client_id=client_id,
                client_host=client_host,
                rebalance_timeout_ms=rebalance_timeout_ms,
                session_timeout_ms=session_timeout_ms,
                subscription=subscription,
                assignment=assignment,
            )
        )
    _struct_tags(r)
    return GroupMetadataValue(
        protocol_type=protocol_type,
        generation=generation,
        protocol=protocol,
        leader=leader,
        current_state_timestamp_ms=current_state_timestamp_ms,
        members=tuple(members),
    )


def _write_group_metadata_value(w: Writer, value: GroupMetadataValue, version: int) -> None:
    w.string(value.protocol_type, "protocolType")
    w.int32(value.generation, "generation")
    w.nullable_string(value.protocol, "protocol")
    w.nullable_string(value.leader, "leader")
    if version >= 2:
        w.int64(value.current_state_timestamp_ms, "currentStateTimestamp")
    w.array_length(len(value.members))
    for member in value.members:
        w.string(member.member_id, "memberId")
        if version >= 3:
            w.nullable_string(member.group_instance_id, "groupInstanceId")
        w.string(member.client_id, "clientId")
        w.string(member.client_host, "clientHost")
        if version >= 1:
            w.int32(member.rebalance_timeout_ms, "rebalanceTimeout")
        w.int32(member.session_timeout_ms, "sessionTimeout")
        w.bytes_(member.subscription)
        w.bytes_(member.assignment)
        _end_struct(w)
    _end_struct(w)


def _read_consumer_group_metadata_value(r: Reader, version: int) -> ConsumerGroupMetadataValue:
    epoch = r.int32("Epoch")
    tags = _struct_tags(r)
    metadata_hash = 0
    if 0 in tags:
        metadata_hash = _parse_tag(tags[0], "MetadataHash", lambda t: t.int64("MetadataHash"))
    return ConsumerGroupMetadataValue(epoch=epoch, metadata_hash=metadata_hash)


def _write_consumer_group_metadata_value(
    w: Writer, value: ConsumerGroupMetadataValue, version: int
) -> None:
    w.int32(value.epoch, "Epoch")
    tags: dict[int, bytes] = {}
    if value.metadata_hash != 0:  # a tagged field at its default is not written
        t = Writer(flexible=True)
        t.int64(value.metadata_hash, "MetadataHash")
        tags[0] = t.getvalue()
    _end_struct(w, tags)


def _read_partition_metadata_value(r: Reader, version: int) -> ConsumerGroupPartitionMetadataValue:
    topics = []
    for _ in range(r.array_length("Topics")):
        topic_id = r.uuid("TopicId")
        topic_name = r.string("TopicName")
        num_partitions = r.int32("NumPartitions")
        partitions = []
        for _ in range(r.array_length("PartitionMetadata")):
            partition = r.int32("Partition")
            racks = tuple(r.string("Racks") for _ in range(r.array_length("Racks")))
            _struct_tags(r)
            partitions.append(PartitionMetadata(partition=partition, racks=racks))
        _struct_tags(r)
        topics.append(
            TopicMetadata(
                topic_id=topic_id,
                topic_name=topic_name,
                num_partitions=num_partitions,
                partition_metadata=tuple(partitions),
            )
        )
    _struct_tags(r)
    return ConsumerGroupPartitionMetadataValue(topics=tuple(topics))


def _write_partition_metadata_value(
    w: Writer, value: ConsumerGroupPartitionMetadataValue, version: int
) -> None:
    w.array_length(len(value.topics))
    for topic in value.topics:
        w.uuid(topic.topic_id, "TopicId")
        w.string(topic.topic_name, "TopicName")
        w.int32(topic.num_partitions, "NumPartitions")
        w.array_length(len(topic.partition_metadata))
        for partition in topic.partition_metadata:
            w.int32(partition.partition, "Partition")
            w.array_length(len(partition.racks))
            for rack in partition.racks:
                w.string(rack, "Racks")
            _end_struct(w)
        _end_struct(w)
    _end_struct(w)


def _read_classic_member_metadata(r: Reader) -> ClassicMemberMetadata | None:
    if r.unsigned_varint("ClassicMemberMetadata") == 0:
        return None
    session_timeout_ms = r.int32("SessionTimeoutMs")
    protocols = []
    for _ in range(r.array_length("SupportedProtocols")):
        name = r.string("Name")
        metadata = r.bytes_("Metadata")
        _struct_tags(r)
        protocols.append(ClassicProtocol(name=name, metadata=metadata))
    _struct_tags(r)
    return ClassicMemberMetadata(
        session_timeout_ms=session_timeout_ms, supported_protocols=tuple(protocols)
    )


def _read_member_metadata_value(r: Reader, version: int) -> ConsumerGroupMemberMetadataValue:
    instance_id = r.nullable_string("InstanceId")
    rack_id = r.nullable_string("RackId")
    client_id = r.string("ClientId")
    client_host = r.string("ClientHost")
    names = tuple(
        r.string("SubscribedTopicNames") for _ in range(r.array_length("SubscribedTopicNames"))
    )
    regex = r.nullable_string("SubscribedTopicRegex")
    rebalance_timeout_ms = r.int32("RebalanceTimeoutMs")
    server_assignor = r.nullable_string("ServerAssignor")
    tags = _struct_tags(r)
    classic = None
    if 0 in tags:
        classic = _parse_tag(tags[0], "ClassicMemberMetadata", _read_classic_member_metadata)
    return ConsumerGroupMemberMetadataValue(
        instance_id=instance_id,
        rack_id=rack_id,
        client_id=client_id,
        client_host=client_host,
        subscribed_topic_names=names,
        subscribed_topic_regex=regex,
        rebalance_timeout_ms=rebalance_timeout_ms,
        server_assignor=server_assignor,
        classic_member_metadata=classic,
    )


def _write_member_metadata_value(
    w: Writer, value: ConsumerGroupMemberMetadataValue, version: int
) -> None:
    w.nullable_string(value.instance_id, "InstanceId")
    w.nullable_string(value.rack_id, "RackId")
    w.string(value.client_id, "ClientId")
    w.string(value.client_host, "ClientHost")
    w.array_length(len(value.subscribed_topic_names))
    for name in value.subscribed_topic_names:
        w.string(name, "SubscribedTopicNames")
    w.nullable_string(value.subscribed_topic_regex, "SubscribedTopicRegex")
    w.int32(value.rebalance_timeout_ms, "RebalanceTimeoutMs")
    w.nullable_string(value.server_assignor, "ServerAssignor")
    tags: dict[int, bytes] = {}
    classic = value.classic_member_metadata
    if classic is not None:
        t = Writer(flexible=True)
        t.unsigned_varint(1)  # present; see the module docstring
        t.int32(classic.session_timeout_ms, "SessionTimeoutMs")
        t.array_length(len(classic.supported_protocols))
        for protocol in classic.supported_protocols:
            t.string(protocol.name, "Name")
            t.bytes_(protocol.metadata)
            _end_struct(t)
        _end_struct(t)
        tags[0] = t.getvalue()
    _end_struct(w, tags)


def _read_target_assignment_metadata_value(
    r: Reader, version: int
) -> ConsumerGroupTargetAssignmentMetadataValue:
    assignment_epoch = r.int32("AssignmentEpoch")
    _struct_tags(r)
    return ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=assignment_epoch)


def _write_target_assignment_metadata_value(
    w: Writer, value: ConsumerGroupTargetAssignmentMetadataValue, version: int
) -> None:
    w.int32(value.assignment_epoch, "AssignmentEpoch")
    _end_struct(w)


def _read_topic_partitions(
    r: Reader, what: str, *, with_epochs: bool = False
) -> tuple[TopicPartitions, ...]:
    """``with_epochs``: the struct has ``AssignmentEpochs`` (tagged field 0), a current
    assignment's; a target assignment's has no such tag, and one there is not looked at."""
    out = []
    for _ in range(r.array_length(what)):
        topic_id = r.uuid("TopicId")
        partitions = tuple(r.int32("Partitions") for _ in range(r.array_length("Partitions")))
        tags = _struct_tags(r)
        epochs = None
        if with_epochs and 0 in tags:
            # As read: not one per partition, the replay falls back as Kafka's does.
            epochs = _parse_tag(tags[0], "AssignmentEpochs", _read_nullable_int32s)
        out.append(
            TopicPartitions(topic_id=topic_id, partitions=partitions, assignment_epochs=epochs)
        )
    return tuple(out)


def _read_nullable_int32s(r: Reader) -> tuple[int, ...] | None:
    n = r.unsigned_varint("AssignmentEpochs") - 1
    if n < 0:
        return None
    if 4 * n > r.remaining:
        raise WireFormatError(f"AssignmentEpochs: {n} epochs but {r.remaining} bytes left")
    return tuple(r.int32("AssignmentEpochs") for _ in range(n))


def _write_topic_partitions(
    w: Writer, items: tuple[TopicPartitions, ...], *, with_epochs: bool = False
) -> None:
    w.array_length(len(items))
    for item in items:
        w.uuid(item.topic_id, "TopicId")
        w.array_length(len(item.partitions))
        for partition in item.partitions:
            w.int32(partition, "Partitions")
        tags: dict[int, bytes] = {}
        if with_epochs and item.assignment_epochs is not None:
            if len(item.assignment_epochs) != len(item.partitions):
                raise ValueError(
                    f"AssignmentEpochs: {len(item.assignment_epochs)} epochs for "
                    f"{len(item.partitions)} partitions"
                )
            t = Writer(flexible=True)
            t.array_length(len(item.assignment_epochs))
            for epoch in item.assignment_epochs:
                t.int32(epoch, "AssignmentEpochs")
            tags[0] = t.getvalue()
        _end_struct(w, tags)


def _read_target_assignment_member_value(
    r: Reader, version: int
) -> ConsumerGroupTargetAssignmentMemberValue:
    topic_partitions = _read_topic_partitions(r, "TopicPartitions")
    _struct_tags(r)
    return ConsumerGroupTargetAssignmentMemberValue(topic_partitions=topic_partitions)


def _write_target_assignment_member_value(
    w: Writer, value: ConsumerGroupTargetAssignmentMemberValue, version: int
) -> None:
    _write_topic_partitions(w, value.topic_partitions)
    _end_struct(w)


def _read_current_assignment_value(
    r: Reader, version: int
) -> ConsumerGroupCurrentMemberAssignmentValue:
    member_epoch = r.int32("MemberEpoch")
    previous_member_epoch = r.int32("PreviousMemberEpoch")
    state = r.int8("State")
    assigned = _read_topic_partitions(r, "AssignedPartitions", with_epochs=True)
    pending = _read_topic_partitions(r, "PartitionsPendingRevocation", with_epochs=True)
    _struct_tags(r)
    return ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=member_epoch,
        previous_member_epoch=previous_member_epoch,
        state=state,
        assigned_partitions=assigned,
        partitions_pending_revocation=pending,
    )


def _write_current_assignment_value(
    w: Writer, value: ConsumerGroupCurrentMemberAssignmentValue, version: int
) -> None:
    w.int32(value.member_epoch, "MemberEpoch")
    w.int32(value.previous_member_epoch, "PreviousMemberEpoch")
    w.int8(value.state, "State")
    _write_topic_partitions(w, value.assigned_partitions, with_epochs=True)
    _write_topic_partitions(w, value.partitions_pending_revocation, with_epochs=True)
    _end_struct(w)


def _parse_tag(data: bytes, what: str, read: Callable[[Reader], Any]) -> Any:
    """Parse one known tagged field's bytes; it must use them all."""
    r = Reader(data, flexible=True)
    result = read(r)
    r.raise_if_not_at_end(f"tagged field {what}")
    return result


# --------------------------------------------------------------------------------------------
# The schema table.

# A key field: (Python attribute, Kafka JSON name, "string" | "int32").
_KeyField: TypeAlias = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class _Schema:
    name: str  # Kafka's value message name
    key_class: type[Any]
    key_fields: tuple[_KeyField, ...]
    value_class: type[Any]
    value_versions: range  # readable
    first_flexible_version: int
    read_value: Callable[[Reader, int], Any]
    write_value: Callable[[Writer, Any, int], None]


_GROUP: Final = ("group_id", "group", "string")
_GROUP_ID: Final = ("group_id", "groupId", "string")
_MEMBER_ID: Final = ("member_id", "memberId", "string")
_OFFSET_COMMIT_KEY_FIELDS: Final = (
    _GROUP,
    ("topic", "topic", "string"),
    ("partition", "partition", "int32"),
)

_OFFSET_COMMIT_SCHEMA: Final = _Schema(
    "OffsetCommitValue",
    OffsetCommitKey,
    _OFFSET_COMMIT_KEY_FIELDS,
    OffsetCommitValue,
    range(5),
    4,
    _read_offset_commit_value,
    _write_offset_commit_value,
)

_SCHEMAS: Final[dict[int, _Schema]] = {
    # Kafka 4 reads type 0 with LegacyOffsetCommitValue (= OffsetCommitValue v0); we accept
    # every OffsetCommitValue version there, a superset.
    RecordType.LEGACY_OFFSET_COMMIT: _OFFSET_COMMIT_SCHEMA,
    RecordType.OFFSET_COMMIT: _OFFSET_COMMIT_SCHEMA,
    RecordType.GROUP_METADATA: _Schema(
        "GroupMetadataValue",
        GroupMetadataKey,
        (_GROUP,),
        GroupMetadataValue,
        range(5),
        4,
        _read_group_metadata_value,
        _write_group_metadata_value,
    ),
    RecordType.CONSUMER_GROUP_METADATA: _Schema(
        "ConsumerGroupMetadataValue",
        ConsumerGroupMetadataKey,
        (_GROUP_ID,),
        ConsumerGroupMetadataValue,
        range(1),
        0,
        _read_consumer_group_metadata_value,
        _write_consumer_group_metadata_value,
    ),
    RecordType.CONSUMER_GROUP_PARTITION_METADATA: _Schema(
        "ConsumerGroupPartitionMetadataValue",
        ConsumerGroupPartitionMetadataKey,
        (_GROUP_ID,),
        ConsumerGroupPartitionMetadataValue,
        range(1),
        0,
        _read_partition_metadata_value,
        _write_partition_metadata_value,
    ),
    RecordType.CONSUMER_GROUP_MEMBER_METADATA: _Schema(
        "ConsumerGroupMemberMetadataValue",
        ConsumerGroupMemberMetadataKey,
        (_GROUP_ID, _MEMBER_ID),
        ConsumerGroupMemberMetadataValue,
        range(1),
        0,
        _read_member_metadata_value,
        _write_member_metadata_value,
    ),
    RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA: _Schema(
        "ConsumerGroupTargetAssignmentMetadataValue",
        ConsumerGroupTargetAssignmentMetadataKey,
        (_GROUP_ID,),
        ConsumerGroupTargetAssignmentMetadataValue,
        range(1),
        0,
        _read_target_assignment_metadata_value,
        _write_target_assignment_metadata_value,
    ),
    RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER: _Schema(
        "ConsumerGroupTargetAssignmentMemberValue",
        ConsumerGroupTargetAssignmentMemberKey,
        (_GROUP_ID, _MEMBER_ID),
        ConsumerGroupTargetAssignmentMemberValue,
        range(1),
        0,
        _read_target_assignment_member_value,
        _write_target_assignment_member_value,
    ),
    RecordType.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT: _Schema(
        "ConsumerGroupCurrentMemberAssignmentValue",
        ConsumerGroupCurrentMemberAssignmentKey,
        (_GROUP_ID, _MEMBER_ID),
        ConsumerGroupCurrentMemberAssignmentValue,
        range(1),
        0,
        _read_current_assignment_value,
        _write_current_assignment_value,
    ),
}

_RECORD_TYPE_OF_VALUE: Final[dict[type[Any], RecordType]] = {
    schema.value_class: RecordType(record_type)
    for record_type, schema in _SCHEMAS.items()
    if record_type != RecordType.LEGACY_OFFSET_COMMIT
}


# --------------------------------------------------------------------------------------------
# Public codec.


def value_version_written(value: CoordinatorValue) -> int:
    """The value version Kafka's ``GroupCoordinatorRecordHelpers`` writes for ``value``."""
    if isinstance(value, OffsetCommitValue):
        # offsetCommitValueVersion(): v1 is the only version that can carry an expiry.
        return 1 if value.expire_timestamp_ms is not None else 3
    if isinstance(value, GroupMetadataValue):
        return 3  # GROUP_METADATA_VALUE_VERSION
    return 0


def encode_key(key: CoordinatorKey) -> bytes:
    """The key bytes: record type int16, then the key's fields (classic encoding)."""
    schema = _SCHEMAS[key.RECORD_TYPE]
    w = Writer()
    w.int16(key.RECORD_TYPE, "record type")
    for attribute, json_name, kind in schema.key_fields:
        if kind == "string":
            w.string(getattr(key, attribute), json_name)
        else:
            w.int32(getattr(key, attribute), json_name)
    return w.getvalue()


def encode_value(value: CoordinatorValue, *, version: int | None = None) -> bytes:
    """The value bytes at ``version`` (default: the one Kafka writes, ``value_version_written``).

    Raises ``ValueError`` for a version the schema does not have and for field values that do
    not fit their wire type (strings over 32767 UTF-8 bytes, ints out of range, bad uuids).
    """
    schema = _SCHEMAS[_RECORD_TYPE_OF_VALUE[type(value)]]
    if version is None:
        version = value_version_written(value)
    if version not in schema.value_versions:
        raise ValueError(
            f"{schema.name} has no version {version} "
            f"(valid: {schema.value_versions.start}-{schema.value_versions.stop - 1})"
        )
    w = Writer()
    w.int16(version, "version")
    w.flexible = version >= schema.first_flexible_version
    schema.write_value(w, value, version)
    return w.getvalue()


def encode_record(record: CoordinatorRecord) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or ``None`` for a tombstone), values at Kafka's versions."""
    value = None if record.value is None else encode_value(record.value)
    return encode_key(record.key), value


# A v2 record's framing at its widest: length, attributes, timestamp and offset deltas, key and
# value lengths (varints) and the header count. A batch's size is counted with it, never under.
_RECORD_OVERHEAD_MAX = 5 + 1 + 10 + 5 + 5 + 5 + 5


def record_size_bound(key: bytes, value: bytes | None) -> int:
    """The most bytes an encoded record takes in a record batch (not counting its header)."""
    return len(key) + (len(value) if value is not None else 0) + _RECORD_OVERHEAD_MAX


def _decode_key(key: bytes | bytearray | memoryview) -> tuple[CoordinatorKey, int]:
    r = Reader(key)
    try:
        record_type = r.int16("record type")
    except WireFormatError as e:
        raise CorruptCoordinatorRecordError(f"could not read the key's record type: {e}") from None
    schema = _SCHEMAS.get(record_type)
    if schema is None:
        raise UnknownRecordTypeError(record_type)
    fields: dict[str, Any] = {}
    try:
        for attribute, json_name, kind in schema.key_fields:
            fields[attribute] = r.string(json_name) if kind == "string" else r.int32(json_name)
        r.raise_if_not_at_end("key")
    except WireFormatError as e:
        raise CorruptCoordinatorRecordError(
            f"could not read key of record type {record_type}: {e}"
        ) from None
    decoded: CoordinatorKey = schema.key_class(**fields)
    return decoded, record_type


def decode_key(key: bytes | bytearray | memoryview) -> CoordinatorKey:
    """Decode key bytes. Raises ``UnknownRecordTypeError`` or ``CorruptCoordinatorRecordError``."""
    return _decode_key(key)[0]


def _decode_value(
    record_type: int, value: bytes | bytearray | memoryview
) -> tuple[CoordinatorValue, int]:
    schema = _SCHEMAS[record_type]
    r = Reader(value)
    try:
        version = r.int16("version")
    except WireFormatError as e:
        raise CorruptCoordinatorRecordError(f"could not read {schema.name} version: {e}") from None
    if version not in schema.value_versions:
        raise CorruptCoordinatorRecordError(
            f"unsupported {schema.name} version {version} "
            f"(readable: {schema.value_versions.start}-{schema.value_versions.stop - 1})"
        )
    r.flexible = version >= schema.first_flexible_version
    try:
        result: CoordinatorValue = schema.read_value(r, version)
        r.raise_if_not_at_end(schema.name)
    except WireFormatError as e:
        raise CorruptCoordinatorRecordError(
            f"could not read {schema.name} version {version}: {e}"
        ) from None
    return result, version


def decode_record(
    key: bytes | bytearray | memoryview, value: bytes | bytearray | memoryview | None
) -> CoordinatorRecord:
    """Decode one record; ``value is None`` is a tombstone.

    Raises ``UnknownRecordTypeError`` for a record type this build does not know (the loader
    skips those) and ``CorruptCoordinatorRecordError`` for bytes that do not parse.
    """
    decoded_key, record_type = _decode_key(key)
    if value is None:
        return CoordinatorRecord(decoded_key, None)
    decoded_value, _ = _decode_value(record_type, value)
    return CoordinatorRecord(decoded_key, decoded_value)


_OFFSET_COMMIT_V3_HEAD: Final = struct.Struct(">hqih")  # version, offset, epoch, metadata len
_INT64: Final = struct.Struct(">q")
_INT32: Final = struct.Struct(">i")
_INT16: Final = struct.Struct(">h")


class OffsetCommitFields(NamedTuple):
    """An OffsetCommit record with a value at version 3 (what Kafka writes), as its fields:
    what log replay needs of the bulk of an offsets log, without building record objects."""

    group_id: str
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


class RecordDecoder:
    """``decode_record`` for log replay, where it is the hot loop: decoded keys are cached
    by their bytes (a group's offsets are committed again and again under the same keys; keys
    are immutable), and OffsetCommit values at version 3, what Kafka writes, are read with one
    ``struct`` call (``offset_commit`` gives their fields alone). Anything else, and anything
    the fast path does not accept, goes through the schema-driven decoder, with its errors.
    """

    MAX_CACHED_KEYS: Final = 1 << 18

    def __init__(self) -> None:
        self._keys: dict[bytes, tuple[CoordinatorKey, int]] = {}
        # OffsetCommit keys without their partition (the last 4 bytes) -> (group, topic): a
        # group's keys share it, so ``offset_commit`` decodes no string twice.
        self._names: dict[bytes, tuple[str, str]] = {}

    def _key(self, key: bytes) -> tuple[CoordinatorKey, int]:
        cached = self._keys.get(key)
        if cached is None:
            cached = _offset_commit_key(key) or _decode_key(key)
            if len(self._keys) >= self.MAX_CACHED_KEYS:
                self._keys.clear()
            self._keys[key] = cached
        return cached

    def decode(self, key: bytes, value: bytes | None) -> CoordinatorRecord:
        decoded_key, record_type = self._key(key)
        if value is None:
            return CoordinatorRecord(decoded_key, None)
        if record_type <= RecordType.OFFSET_COMMIT and value[:2] == b"\x00\x03":
            fields = _offset_commit_v3(value)
            if fields is not None:
                offset, leader_epoch, metadata, commit_timestamp_ms = fields
                fast = OffsetCommitValue(
                    offset=offset,
                    leader_epoch=leader_epoch,
                    metadata=metadata,
                    commit_timestamp_ms=commit_timestamp_ms,
                )
                return CoordinatorRecord(decoded_key, fast)
        decoded_value, _ = _decode_value(record_type, value)
        return CoordinatorRecord(decoded_key, decoded_value)

    def offset_commit(self, key: bytes, value: bytes | None) -> OffsetCommitFields | None:
        """The record's fields if it is an OffsetCommit with a version 3 value the fast path
        reads, else None: ``decode`` it (it raises what is wrong with it, if anything)."""
        if value is None or value[:2] != b"\x00\x03":
            return None
        names = self._names.get(key[:-4])
        if names is None:
            parsed = _offset_commit_key(key)
            if parsed is None:
                self._key(key)  # raises what is wrong with the key, if anything
                return None  # another record type
            names = (parsed[0].group_id, parsed[0].topic)
            if len(self._names) >= self.MAX_CACHED_KEYS:
                self._names.clear()
            self._names[key[:-4]] = names
        fields = _offset_commit_v3(value)
        if fields is None:
            return None
        (partition,) = _INT32.unpack_from(key, len(key) - 4)
        return OffsetCommitFields(names[0], names[1], partition, *fields)


def _offset_commit_key(key: bytes) -> tuple[OffsetCommitKey, int] | None:
    """An OffsetCommit key (type 0 or 1: group, topic, partition) read with ``struct``, or
    None if it does not parse as one (the generic reader then says why)."""
    if len(key) < 10 or key[0] != 0 or key[1] > RecordType.OFFSET_COMMIT:
        return None
    try:
        (group_len,) = _INT16.unpack_from(key, 2)
        group_end = 4 + group_len
        (topic_len,) = _INT16.unpack_from(key, group_end)
        topic_end = group_end + 2 + topic_len
        if group_len < 0 or topic_len < 0 or len(key) != topic_end + 4:
            return None
        group_id = key[4:group_end].decode()
        topic = key[group_end + 2 : topic_end].decode()
    except (struct.error, UnicodeDecodeError):
        return None
    (partition,) = _INT32.unpack_from(key, topic_end)
    return OffsetCommitKey(group_id=group_id, topic=topic, partition=partition), key[1]


def _offset_commit_v3(value: bytes) -> tuple[int, int, str, int] | None:
    """OffsetCommitValue v3 (not flexible: no tagged fields) as (offset, leader epoch,
    metadata, commit timestamp), or None if it does not parse as one (the generic reader then
    says why)."""
    head = _OFFSET_COMMIT_V3_HEAD.size
    if len(value) < head + _INT64.size:
        return None
    _, offset, leader_epoch, n = _OFFSET_COMMIT_V3_HEAD.unpack_from(value)
    if n < 0 or len(value) != head + n + _INT64.size:
        return None
    try:
        metadata = value[head : head + n].decode()
    except UnicodeDecodeError:
        return None
    (commit_timestamp_ms,) = _INT64.unpack_from(value, head + n)
    return offset, leader_epoch, metadata, commit_timestamp_ms


# --------------------------------------------------------------------------------------------
# kafka-dump-log.sh --offsets-decoder


def uuid_str(topic_id: bytes) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(topic_id).decode("ascii").rstrip("=")


def uuid_bytes(topic_id: str) -> bytes:
    """The 16 bytes of a Uuid in its string form (``uuid_str`` undone)."""
    return base64.urlsafe_b64decode(topic_id + "==")


def _bytes_json(data: bytes | None) -> str | None:
    # Jackson writes a BinaryNode as standard base64 with padding.
    return None if data is None else base64.b64encode(data).decode("ascii")


def _topic_partitions_json(items: tuple[TopicPartitions, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in items:
        item: dict[str, Any] = {"topicId": uuid_str(i.topic_id), "partitions": list(i.partitions)}
        if i.assignment_epochs is not None:  # a tagged field: shown where written
            item["assignmentEpochs"] = list(i.assignment_epochs)
        out.append(item)
    return out


def _consumer_partitions_json(r: Reader, what: str) -> list[dict[str, Any]]:
    out = []
    for _ in range(r.array_length(what)):
        topic = r.string("topic")
        partitions = [r.int32("partition") for _ in range(r.array_length("partitions"))]
        out.append({"topic": topic, "partitions": partitions})
    return out


def _consumer_subscription_json(data: bytes) -> dict[str, Any] | None:
    """ConsumerProtocolSubscription v0-3 (clients' ConsumerProtocolSubscription.json)."""
    r = Reader(data)
    version = r.int16()
    if not 0 <= version <= 3:
        return None
    out: dict[str, Any] = {
        "topics": [r.string("topic") for _ in range(r.array_length("topics"))],
        "userData": _bytes_json(r.nullable_bytes("userData")),
    }
    if version >= 1:
        out["ownedPartitions"] = _consumer_partitions_json(r, "ownedPartitions")
    if version >= 2:
        out["generationId"] = r.int32("generationId")
    if version >= 3:
        out["rackId"] = r.nullable_string("rackId")
    return out


def _consumer_assignment_json(data: bytes) -> dict[str, Any] | None:
    """ConsumerProtocolAssignment v0-3 (the same fields in every version)."""
    r = Reader(data)
    version = r.int16()
    if not 0 <= version <= 3:
        return None
    return {
        "assignedPartitions": _consumer_partitions_json(r, "assignedPartitions"),
        "userData": _bytes_json(r.nullable_bytes("userData")),
    }


def _embedded_json(
    data: bytes, decode: Callable[[bytes], dict[str, Any] | None]
) -> dict[str, Any] | str | None:
    # Like DumpLogSegments' replace(): on any failure keep the original bytes. Kafka's
    # reader ignores trailing bytes here, and so does this display-only decoder.
    try:
        decoded = decode(data)
    except WireFormatError:
        decoded = None
    return _bytes_json(data) if decoded is None else decoded


def _value_json(value: CoordinatorValue, version: int) -> dict[str, Any]:
    """Kafka's generated JSON converter output: the fields present in ``version``."""
    match value:
        case OffsetCommitValue():
            out: dict[str, Any] = {"offset": value.offset}
            if version >= 3:
                out["leaderEpoch"] = value.leader_epoch
            out["metadata"] = value.metadata
            out["commitTimestamp"] = value.commit_timestamp_ms
            if version == 1:
                expire = value.expire_timestamp_ms
                out["expireTimestamp"] = NO_TIMESTAMP if expire is None else expire
            return out
        case GroupMetadataValue():
            consumer = value.protocol_type == "consumer"
            members = []
            for m in value.members:
                member: dict[str, Any] = {"memberId": m.member_id}
                if version >= 3:
                    member["groupInstanceId"] = m.group_instance_id
                member["clientId"] = m.client_id
                member["clientHost"] = m.client_host
                if version >= 1:
                    member["rebalanceTimeout"] = m.rebalance_timeout_ms
                member["sessionTimeout"] = m.session_timeout_ms
                if consumer:
                    member["subscription"] = _embedded_json(
                        m.subscription, _consumer_subscription_json
                    )
                    member["assignment"] = _embedded_json(m.assignment, _consumer_assignment_json)
                else:
                    member["subscription"] = _bytes_json(m.subscription)
                    member["assignment"] = _bytes_json(m.assignment)
                members.append(member)
            out = {
                "protocolType": value.protocol_type,
                "generation": value.generation,
                "protocol": value.protocol,
                "leader": value.leader,
            }
            if version >= 2:
                out["currentStateTimestamp"] = value.current_state_timestamp_ms
            out["members"] = members
            return out
        case ConsumerGroupMetadataValue():
            out = {"epoch": value.epoch}
            if value.metadata_hash != 0:
                out["metadataHash"] = value.metadata_hash
            return out
        case ConsumerGroupPartitionMetadataValue():
            return {
                "topics": [
                    {
                        "topicId": uuid_str(t.topic_id),
                        "topicName": t.topic_name,
                        "numPartitions": t.num_partitions,
                        "partitionMetadata": [
                            {"partition": p.partition, "racks": list(p.racks)}
                            for p in t.partition_metadata
                        ],
                    }
                    for t in value.topics
                ]
            }
        case ConsumerGroupMemberMetadataValue():
            out = {
                "instanceId": value.instance_id,
                "rackId": value.rack_id,
                "clientId": value.client_id,
                "clientHost": value.client_host,
                "subscribedTopicNames": list(value.subscribed_topic_names),
                "subscribedTopicRegex": value.subscribed_topic_regex,
                "rebalanceTimeoutMs": value.rebalance_timeout_ms,
                "serverAssignor": value.server_assignor,
            }
            classic = value.classic_member_metadata
            if classic is not None:
                out["classicMemberMetadata"] = {
                    "sessionTimeoutMs": classic.session_timeout_ms,
                    "supportedProtocols": [
                        {"name": p.name, "metadata": _bytes_json(p.metadata)}
                        for p in classic.supported_protocols
                    ],
                }
            return out
        case ConsumerGroupTargetAssignmentMetadataValue():
            return {"assignmentEpoch": value.assignment_epoch}
        case ConsumerGroupTargetAssignmentMemberValue():
            return {"topicPartitions": _topic_partitions_json(value.topic_partitions)}
        case ConsumerGroupCurrentMemberAssignmentValue():
            return {
                "memberEpoch": value.member_epoch,
                "previousMemberEpoch": value.previous_member_epoch,
                "state": value.state,
                "assignedPartitions": _topic_partitions_json(value.assigned_partitions),
                "partitionsPendingRevocation": _topic_partitions_json(
                    value.partitions_pending_revocation
                ),
            }
    raise AssertionError(f"no JSON for {type(value).__name__}")  # pragma: no cover


def _json(obj: Any) -> str:
    # Jackson's ObjectNode.toString(): compact, non-ASCII left as is.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def format_offsets_record(
    key: bytes | None, value: bytes | None, *, offset: int | None = None
) -> str:
    """One record as ``kafka-dump-log.sh --offsets-decoder`` prints it after the record header.

    Never raises for bad bytes: like Kafka's tool it prints an "Unknown record type" or "Error"
    line and moves on. ``offset`` (the record's log offset) only appears in those messages.
    """
    at = "" if offset is None else f" at offset {offset}"
    if key is None:
        return f"Failed to decode message{at} (message had a missing key)"
    try:
        decoded_key, record_type = _decode_key(key)
        key_fields = _SCHEMAS[record_type].key_fields
        key_json = {name: getattr(decoded_key, attribute) for attribute, name, _ in key_fields}
        key_text = _json({"type": str(record_type), "data": key_json})
        if value is None:
            return f"key: {key_text} payload: <DELETE>"
        decoded, version = _decode_value(record_type, value)
        payload = _json({"version": str(version), "data": _value_json(decoded, version)})
    except UnknownRecordTypeError as e:
        return f"key: Unknown record type {e.record_type}{at}, skipping."
    except CorruptCoordinatorRecordError as e:
        return f"key: Error{at}, skipping. {e}"
    return f"key: {key_text} payload: {payload}"
