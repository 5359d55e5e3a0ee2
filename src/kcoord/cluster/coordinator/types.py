"""Requests and responses of the classic group coordinator APIs, as plain frozen dataclasses. Pure.

Field names are Kafka's JSON schema names in snake_case (clients/src/main/resources/common/
message/*Request.json, *Response.json); every field any version has is here, and API versions
are not: the Kafka listener (``node/kafka/``) translates the wire to these types and back. Where a
behaviour depends on the version, the translator sets an explicit flag instead:

    JoinGroupRequest.require_known_member_id      v4+   KIP-394 MEMBER_ID_REQUIRED
    JoinGroupRequest.supports_skip_assignment     v9+   KIP-814 SkipAssignment
    OffsetCommitRequest.report_group_id_not_found v9+   GROUP_ID_NOT_FOUND, else ILLEGAL_GENERATION
    OffsetCommitRequest.member_epoch_version      v9+   a KIP-848 member may commit, else
                                                        UNSUPPORTED_VERSION
    DescribeGroupsRequest.report_group_id_not_found v6+ GROUP_ID_NOT_FOUND for an unknown group

and fills fields an old version lacks (JoinGroup v0's ``rebalance_timeout_ms`` is its session
timeout, as Kafka's ``GroupCoordinatorAdapter`` does; LeaveGroup v0-2's single ``member_id``
may be left in ``member_id``, the shard reads it as a one-member batch as Kafka's
``LeaveGroupRequest.members()`` does). The client id and host of the request context travel in
the JoinGroup request (``client_id``, ``client_host`` = Kafka's ``clientAddress().toString()``).

Response defaults are the schema defaults of Kafka's generated classes (for example a
``JoinGroupResponse`` has ``generation_id=-1`` and ``protocol_name=""`` until set); error codes
are ``Errors``. A ``Token`` is the opaque id the runtime attaches to a request; the shard answers
``(token, response)`` pairs, possibly later (JoinGroup, SyncGroup) and possibly many at once.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, TypeAlias

from kcoord.errors import Errors

Token: TypeAlias = Hashable

UNKNOWN_MEMBER_ID: Final = ""  # JoinGroupRequest.UNKNOWN_MEMBER_ID
UNKNOWN_GENERATION_ID: Final = -1
NO_LEADER_EPOCH: Final = -1
INVALID_OFFSET: Final = -1  # OffsetFetchResponse.INVALID_OFFSET
DEFAULT_RETENTION_TIME: Final = -1  # OffsetCommitRequest.DEFAULT_RETENTION_TIME
DEFAULT_TIMESTAMP: Final = -1  # OffsetCommitRequest.DEFAULT_TIMESTAMP
AUTHORIZED_OPERATIONS_OMITTED: Final = -(1 << 31)  # Integer.MIN_VALUE


# --------------------------------------------------------------------------------------------
# JoinGroup (key 11)


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroupRequestProtocol:
    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroupRequest:
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int  # v1+; the translator copies session_timeout_ms for v0
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None  # v5+, KIP-345
    protocol_type: str
    protocols: tuple[JoinGroupRequestProtocol, ...] = ()  # by preference
    reason: str | None = None  # v8+
    # From the request context and header version (see the module docstring).
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True
    supports_skip_assignment: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroupResponseMember:
    member_id: str
    group_instance_id: str | None = None
    metadata: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroupResponse:
    throttle_time_ms: int = 0
    error_code: Errors = Errors.NONE
    generation_id: int = UNKNOWN_GENERATION_ID
    protocol_type: str | None = None  # v7+
    protocol_name: str | None = ""  # nullable v7+
    leader: str = ""
    skip_assignment: bool = False  # v9+
    member_id: str = ""
    members: tuple[JoinGroupResponseMember, ...] = ()


# --------------------------------------------------------------------------------------------
# SyncGroup (key 14)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroupRequestAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None  # v3+
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+
    assignments: tuple[SyncGroupRequestAssignment, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroupResponse:
    throttle_time_ms: int = 0
    error_code: Errors = Errors.NONE
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+
    assignment: bytes = b""


# --------------------------------------------------------------------------------------------
# Heartbeat (key 12)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None  # v3+


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResponse:
    throttle_time_ms: int = 0
    error_code: Errors = Errors.NONE


# --------------------------------------------------------------------------------------------
# LeaveGroup (key 13)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None  # v5+


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroupRequest:
    group_id: str
    # v0-2: the one member leaving, read as members=(MemberIdentity(member_id),) (even "");
    # None in v3+, where ``members`` names them all, and may name none.
    member_id: str | None = None
    members: tuple[MemberIdentity, ...] = ()  # v3+


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberResponse:
    member_id: str
    group_instance_id: str | None = None
    error_code: Errors = Errors.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroupResponse:
    throttle_time_ms: int = 0
    error_code: Errors = Errors.NONE
    members: tuple[MemberResponse, ...] = ()  # v3+


# --------------------------------------------------------------------------------------------
# OffsetCommit (key 8)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequestPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = NO_LEADER_EPOCH  # v6+
    commit_timestamp: int = DEFAULT_TIMESTAMP  # v1 only
    committed_metadata: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequestTopic:
    name: str
    partitions: tuple[OffsetCommitRequestPartition, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequest:
    group_id: str
    generation_id_or_member_epoch: int = UNKNOWN_GENERATION_ID  # v1+
    member_id: str = UNKNOWN_MEMBER_ID  # v1+
    group_instance_id: str | None = None  # v7+
    retention_time_ms: int = DEFAULT_RETENTION_TIME  # v2-4, KIP-211
    topics: tuple[OffsetCommitRequestTopic, ...] = ()
    report_group_id_not_found: bool = False  # v9+
    member_epoch_version: bool = False  # v9+


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponsePartition:
    partition_index: int
    error_code: Errors = Errors.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponseTopic:
    name: str
    partitions: tuple[OffsetCommitResponsePartition, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponse:
    throttle_time_ms: int = 0
    topics: tuple[OffsetCommitResponseTopic, ...] = ()


# --------------------------------------------------------------------------------------------
# OffsetFetch (key 9), one group per request (v8+ batches groups; the translator splits them)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchRequestTopic:
    name: str
    partition_indexes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchRequest:
    group_id: str
    member_id: str | None = None  # v9+, KIP-848 only
    member_epoch: int = -1  # v9+, KIP-848 only
    topics: tuple[OffsetFetchRequestTopic, ...] | None = None  # None: all committed offsets
    require_stable: bool = False  # v7+


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponsePartition:
    partition_index: int
    committed_offset: int = INVALID_OFFSET
    committed_leader_epoch: int = NO_LEADER_EPOCH  # v5+
    metadata: str | None = ""
    error_code: Errors = Errors.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponseTopic:
    name: str
    partitions: tuple[OffsetFetchResponsePartition, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponse:
    throttle_time_ms: int = 0
    group_id: str
    topics: tuple[OffsetFetchResponseTopic, ...] = ()
    error_code: Errors = Errors.NONE  # v2+


# --------------------------------------------------------------------------------------------
# DescribeGroups (key 15)


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeGroupsRequest:
    groups: tuple[str, ...]
    include_authorized_operations: bool = False  # v3+; authorization is the listener's job
    report_group_id_not_found: bool = False  # v6+


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedGroupMember:
    member_id: str
    group_instance_id: str | None = None  # v4+
    client_id: str
    client_host: str
    member_metadata: bytes = b""  # only in Stable
    member_assignment: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedGroup:
    error_code: Errors = Errors.NONE
    error_message: str | None = None  # v6+
    group_id: str
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""  # the selected protocol name, only in Stable
    members: tuple[DescribedGroupMember, ...] = ()
    authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED  # v3+


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeGroupsResponse:
    throttle_time_ms: int = 0
    groups: tuple[DescribedGroup, ...] = ()


# --------------------------------------------------------------------------------------------
# ListGroups (key 16)


@dataclass(frozen=True, slots=True, kw_only=True)
class ListGroupsRequest:
    states_filter: tuple[str, ...] = ()  # v4+, case-insensitive
    types_filter: tuple[str, ...] = ()  # v5+, case-insensitive


@dataclass(frozen=True, slots=True, kw_only=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str = ""  # v4+
    group_type: str = ""  # v5+


@dataclass(frozen=True, slots=True, kw_only=True)
class ListGroupsResponse:
    throttle_time_ms: int = 0
    error_code: Errors = Errors.NONE
    groups: tuple[ListedGroup, ...] = ()


# --------------------------------------------------------------------------------------------
# DeleteGroups (key 42)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteGroupsRequest:
    groups_names: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletableGroupResult:
    group_id: str
    error_code: Errors = Errors.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteGroupsResponse:
    throttle_time_ms: int = 0
    results: tuple[DeletableGroupResult, ...] = ()


# --------------------------------------------------------------------------------------------
# OffsetDelete (key 47)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteRequestPartition:
    partition_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteRequestTopic:
    name: str
    partitions: tuple[OffsetDeleteRequestPartition, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteRequest:
    group_id: str
    topics: tuple[OffsetDeleteRequestTopic, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteResponsePartition:
    partition_index: int
    error_code: Errors = Errors.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteResponseTopic:
    name: str
    partitions: tuple[OffsetDeleteResponsePartition, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteResponse:
    error_code: Errors = Errors.NONE
    throttle_time_ms: int = 0
    topics: tuple[OffsetDeleteResponseTopic, ...] = ()


# --------------------------------------------------------------------------------------------
# ConsumerGroupHeartbeat (key 68) and ConsumerGroupDescribe (key 69), KIP-848

# (topic id, partitions): Kafka's ConsumerGroupHeartbeat TopicPartitions
TopicIdPartitions: TypeAlias = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupHeartbeatRequest:
    group_id: str
    member_id: str = ""
    member_epoch: int = 0
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None  # None: unchanged
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    topic_partitions: TopicIdPartitions | None = None  # None: unchanged (not reported)
    client_id: str = ""
    client_host: str = ""
    # From v1 the client generates its member id, even on its first heartbeat (KIP-1082).
    api_version: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupHeartbeatResponse:
    throttle_time_ms: int = 0
    error_code: Errors = Errors.NONE
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: TopicIdPartitions | None = None  # None: unchanged


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupDescribeRequest:
    group_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedConsumerGroupMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: TopicIdPartitions
    target_assignment: TopicIdPartitions
    uses_classic_protocol: bool = False  # a classic member of a consumer group (KIP-848)


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedConsumerGroup:
    error_code: Errors = Errors.NONE
    error_message: str | None = None
    group_id: str
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[DescribedConsumerGroupMember, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupDescribeResponse:
    throttle_time_ms: int = 0
    groups: tuple[DescribedConsumerGroup, ...] = ()


Response: TypeAlias = (
    ConsumerGroupHeartbeatResponse
    | ConsumerGroupDescribeResponse
    | JoinGroupResponse
    | SyncGroupResponse
    | HeartbeatResponse
    | LeaveGroupResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
    | DescribeGroupsResponse
    | ListGroupsResponse
    | DeleteGroupsResponse
    | OffsetDeleteResponse
)
