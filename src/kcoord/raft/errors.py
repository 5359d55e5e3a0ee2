"""Kafka's error codes, as the metadata quorum and its RPCs answer them.

The numbers are Kafka's (``org.apache.kafka.common.protocol.Errors``), so a reply from the
controller means what the same code means in Kafka, and the node can pass a code through to a
Kafka client unchanged. Only the codes the controller and its RPCs use are listed; add more as
they are needed, always with Kafka's number.

Pure: imports nothing but the standard library's ``enum``.
"""

from __future__ import annotations

from enum import IntEnum


class Errors(IntEnum):
    """A subset of Kafka's ``Errors`` enum, with Kafka's codes."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    INVALID_TOPIC_EXCEPTION = 17
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    FENCED_LEADER_EPOCH = 74
    STALE_BROKER_EPOCH = 77
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    INVALID_UPDATE_VERSION = 95
    UNKNOWN_TOPIC_ID = 100
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_CLUSTER_ID = 104
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108
