"""The consumer's embedded protocol: what a classic member's JoinGroup metadata and SyncGroup
assignment bytes carry when the protocol type is ``consumer`` (the clients'
``ConsumerProtocolSubscription.json`` and ``ConsumerProtocolAssignment.json``, versions 0-3;
Kafka's ``ConsumerProtocol``). Pure.

::

    subscription = version int16 | topics [string] | user_data nullable bytes
                   | v1+: owned_partitions [topic string, partitions [int32]]
                   | v2+: generation_id int32 | v3+: rack_id nullable string
    assignment   = version int16 | assigned_partitions [topic string, partitions [int32]]
                   | user_data nullable bytes

Arrays and strings are classic (int32 / int16 lengths), never flexible. As in Kafka, a reader
reads the fields of the version it finds and ignores bytes after them (a newer client may add
fields); a version above 3 is read as 3.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kcoord.cluster.coordinator.wire import Reader, WireFormatError, Writer

HIGHEST_VERSION: Final = 3


@dataclass(frozen=True, slots=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[tuple[str, tuple[int, ...]], ...] = ()
    generation_id: int = -1
    rack_id: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    version: int
    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    user_data: bytes | None = None


def _partitions(r: Reader, what: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    out = []
    for _ in range(r.array_length(what)):
        topic = r.string("topic")
        out.append((topic, tuple(r.int32("partition") for _ in range(r.array_length(what)))))
    return tuple(out)


def _version(r: Reader) -> int:
    version = r.int16("version")
    if version < 0:
        raise WireFormatError(f"negative consumer protocol version {version}")
    return min(version, HIGHEST_VERSION)


def decode_subscription(data: bytes) -> Subscription:
    """WireFormatError when the bytes do not parse (Kafka's SchemaException)."""
    r = Reader(data)
    version = _version(r)
    topics = tuple(r.string("topic") for _ in range(r.array_length("topics")))
    user_data = r.nullable_bytes("user_data")
    owned = _partitions(r, "owned_partitions") if version >= 1 else ()
    generation = r.int32("generation_id") if version >= 2 else -1
    rack = r.nullable_string("rack_id") if version >= 3 else None
    return Subscription(version, topics, user_data, owned, generation, rack)


def decode_assignment(data: bytes) -> Assignment:
    """WireFormatError when the bytes do not parse. Empty bytes: nothing assigned (what a
    classic group stores for a member that joined but never synced)."""
    if not data:
        return Assignment(0, ())
    r = Reader(data)
    version = _version(r)
    partitions = _partitions(r, "assigned_partitions")
    return Assignment(version, partitions, r.nullable_bytes("user_data"))


def encode_assignment(
    version: int, partitions: Mapping[str, frozenset[int]], user_data: bytes | None = None
) -> bytes:
    """A ConsumerProtocolAssignment at ``version`` (0-3: the same fields in each), topics and
    partitions sorted."""
    w = Writer()
    w.int16(min(max(version, 0), HIGHEST_VERSION))
    items = [(t, sorted(ps)) for t, ps in sorted(partitions.items()) if ps]
    w.array_length(len(items))
    for topic, ps in items:
        w.string(topic)
        w.array_length(len(ps))
        for p in ps:
            w.int32(p)
    w.nullable_bytes(user_data)
    return w.getvalue()


def encode_subscription(subscription: Subscription) -> bytes:
    """The inverse of ``decode_subscription`` (tests, and clients' bytes re-encoded)."""
    w = Writer()
    version = min(max(subscription.version, 0), HIGHEST_VERSION)
    w.int16(version)
    w.array_length(len(subscription.topics))
    for topic in subscription.topics:
        w.string(topic)
    w.nullable_bytes(subscription.user_data)
    if version >= 1:
        w.array_length(len(subscription.owned_partitions))
        for topic, ps in subscription.owned_partitions:
            w.string(topic)
            w.array_length(len(ps))
            for p in ps:
                w.int32(p)
    if version >= 2:
        w.int32(subscription.generation_id)
    if version >= 3:
        w.nullable_string(subscription.rack_id)
    return w.getvalue()
